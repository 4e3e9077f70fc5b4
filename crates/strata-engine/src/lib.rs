//! # strata-engine: runs pipelines
//!
//! ```text
//!   pipeline.sql / spec.yaml ─strata-sql─▶ PipelinePlan ─prepare─▶ every node checked against
//!        │                                                         the schemas it will meet
//!        ▼                                                         (nothing written yet)
//!   pipeline.rs: runs the nodes in dependency order, independent ones side by side, one
//!                event-log record each (event_log.rs); --select, --full-refresh, stop
//!   ingest.rs:   read_files / STREAM(t) / append flows → streaming table (one commit: rows
//!                + the files or source version taken; taken.rs reads the files back
//!                through a cache); autoload.rs infers, evolves and
//!                rescues; adopt.rs takes pass-through Parquet files as they are;
//!                expect.rs checks expectations; changes.rs reads a target's feed
//!   flow.rs:     streaming table → event store → fold (strata-core, via fold.rs) → target;
//!                store.rs reads the touched keys' stored events through the page index;
//!                snapshot.rs for AUTO CDC FROM SNAPSHOT (digest.rs: the state digest it
//!                diffs against), timeline.rs for conventions; sort.rs sorts integer
//!                keys with their rows on every core;
//!                rewrite.rs replaces the changed keys' rows, rewriting only files holding them
//!                (or marking them in deletion vectors, dv.rs)
//!   mview.rs:    materialized views and views; pit.rs: point-in-time tables
//!   query.rs:    SQL over every table of a warehouse (as_of in history.rs, table_changes in
//!                changes.rs); SCD2 integrity checks
//!   spec.rs:     YAML pipeline specs: libraries + SQL generated per table entry, planned as
//!                one pipeline of several texts by sources.rs (errors name each text)
//! ```
//!
//! Every write is one atomic Delta commit that also records how far its input was read, so
//! a crash at any point and a re-run converge to the same tables.

mod adopt;
mod autoload;
mod changes;
mod digest;
mod dv;
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
mod rewrite;
mod snapshot;
mod sort;
mod sources;
mod spec;
mod sqlutil;
mod store;
mod taken;
mod timeline;
mod tombstones;
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
