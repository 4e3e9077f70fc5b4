//! # strata-engine: runs pipelines
//!
//! ```text
//!   pipeline.sql / spec.yaml ──load──▶ PipelinePlan ──runtime::prepare──▶ every node checked
//!                                      (strata-sql)                      against the schemas
//!                                                                        it will meet
//!   runtime::scheduler: the nodes in dependency order, independent ones side by side, each
//!        │             run by its ops folder, retried when another writer committed first,
//!        │             one event-log record each
//!        ▼
//!   ops::ingest   read_files / read_database / STREAM(t) / append flows ─▶ streaming table
//!                 (one commit: rows + the files, watermark or source version taken, or
//!                 the record that a once flow ran)
//!   ops::cdc      streaming table ─▶ event store ─fold─▶ target (AUTO CDC, from change
//!                 events or from snapshots)
//!   ops::mview    materialized views          ops::pit   point-in-time tables
//! ```
//!
//! ## Layers
//!
//! The engine is built in layers, each a folder; a module uses only its own layer and the
//! layers below it, and no `ops` folder uses another (`tests/layers.rs` checks this):
//!
//! ```text
//!   runtime     the scheduler, node preparation, retries, the event log (written, and read
//!               back for `strata events` and the web page), full refresh, a run's attempts
//!               after a transient failure and its notifications, upkeep (optimize, vacuum)
//!   ops         one folder per dataset kind: ingest, cdc, mview, pit
//!   sql         sessions over a warehouse, as_of, table_changes, views, expectations, query
//!   eventstore  an AUTO CDC target's events: evaluation, page reads, digest, tombstones
//!   sources     database connections, watermark reads' options, positions and overlap
//!   storage     the warehouse and where things live (a local folder or an object store
//!               prefix: `location.rs`), Delta tables, writes and commits, the change feed,
//!               key replacement and deletion vectors, the ledger of files taken
//!   load        pipeline texts and YAML specs into plans
//!   semantics   pure functions: the fold, flows, events, timelines, comparisons,
//!               snapshot diffs, the SCD2 integrity check
//!   util        Arrow and SQL-text helpers, threads, sorting, phase logs
//!   error       the crate's one error type
//! ```
//!
//! Every write is one atomic Delta commit that also records how far its input was read, so
//! a crash at any point and a re-run converge to the same tables.

mod error;
mod eventstore;
mod load;
mod ops;
mod runtime;
mod semantics;
mod sources;
mod sql;
mod storage;
mod util;

pub use error::{chain, EngineError, Result};
pub use load::file::plan_file;
pub use load::graph::{DatasetGraph, GraphEdge, GraphNode};
pub use load::settings::parse_duration;
pub use load::sources::{plan_sources, PipelineSource, PlanStep, PlannedPipeline, SourceKind};
pub use load::spec::{is_spec, load_pipeline, load_pipeline_with_python, LoadedPipeline};
pub use ops::cdc::FlowReport;
/// Bulk loads on a cluster: the plan nodes a cluster's processes plan, encode and run, and
/// the connector `strata run --cluster` opens sessions with (`strata-cluster`).
pub mod cluster {
    pub use crate::ops::cdc::cluster::session_state;
    pub use crate::ops::cdc::cluster::{
        ClusterConnector, ClusterRun, FoldWriteExec, FoldWriteNode, StageDone, StrataQueryPlanner,
    };
    pub use crate::storage::location::object_store_for;
}
pub use ops::ingest::IngestReport;
pub use ops::mview::{MvReport, Refresh};
pub use ops::pit::PitReport;
pub use runtime::event_log::{EventRecord, Status, EVENT_LOG_TABLE};
pub use runtime::lock::LockMode;
pub use runtime::logged::{
    event_log_version, logged_events, read_events, LoggedEvent, LoggedExpectation,
};
pub use runtime::upkeep::{
    optimize, vacuum, OptimizeOptions, VacuumOptions, VacuumReport, Vacuumed, DEFAULT_RETAIN_HOURS,
};
pub use runtime::{
    run_pipeline, run_pipeline_file, run_pipeline_file_with, run_pipeline_with_python, run_planned,
    Optimized, Progress, ProgressFn, RunOptions, RunReport, Selection,
};
pub use semantics::integrity::Violation;
pub use sql::expect::ExpectationCount;
pub use sql::query::{
    prepare_query, query, validate, validate_report, validate_with, PreparedQuery, SqlQuery,
    ValidateOptions, ValidationReport,
};
pub use storage::location::Location;
pub use storage::session::new_session;
pub use storage::staged::replace_table_rows;
pub use storage::warehouse::Warehouse;
pub use util::memory;
