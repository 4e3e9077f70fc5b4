//! # strata-engine: runs pipelines
//!
//! ```text
//!   pipeline.sql ─strata-sql─▶ PipelinePlan ─prepare─▶ schemas checked, flows set up
//!        │                                                   │ (nothing written yet)
//!        ▼                                                   ▼
//!   ingest.rs: read_files → streaming table (one commit: rows + the file names taken)
//!   flow.rs:   streaming table → event store → fold (strata-core, via fold.rs) → target
//!   query.rs:  SQL over every table of a warehouse; SCD2 integrity checks
//!   spec.rs:   YAML pipeline specs: libraries + SQL generated per table entry, planned as
//!              one pipeline of several texts by sources.rs (errors name each text)
//! ```
//!
//! Every write is one atomic Delta commit that also records how far its input was read, so
//! a crash at any point and a re-run converge to the same tables.

mod autoload;
mod changes;
mod error;
mod event_log;
mod expect;
mod flow;
mod fold;
mod history;
mod ingest;
mod mview;
mod pipeline;
mod pit;
mod query;
mod snapshot;
mod sources;
mod spec;
mod sqlutil;
mod timeline;
mod warehouse;

pub use error::{chain, EngineError, Result};
pub use event_log::{EventRecord, Status, EVENT_LOG_TABLE};
pub use expect::ExpectationCount;
pub use flow::FlowReport;
pub use ingest::IngestReport;
pub use mview::MvReport;
pub use pipeline::{
    plan_file, run_pipeline, run_pipeline_file, run_pipeline_file_with, Progress, ProgressFn,
    RunOptions, RunReport, Selection,
};
pub use pit::PitReport;
pub use query::{query, validate, Violation};
pub use sources::{
    plan_sources, run_planned, PipelineSource, PlanStep, PlannedPipeline, SourceKind,
};
pub use spec::{is_spec, load_pipeline, LoadedPipeline};
pub use warehouse::{new_session, Warehouse};
