//! AUTO CDC flows: change events (and snapshots) into SCD type 1 and 2 targets.
//!
//! ```text
//!  source (append-only Delta)     event store (Delta, per target)        target (Delta)
//!  files added since the   ──▶  1. stored events of the touched keys ─┐
//!  flow's txn version           2. + new events  ──fold (strata-core)─┴─▶ rows of touched keys
//!                               3. commit new events + source txn      4. replace changed keys'
//!                                                                         rows (storage/replace.rs)
//!                                                                         + txn "strata-events"
//! ```
//!
//! The event store keeps every event ever applied (after ties are settled at fold time), so
//! that late events can be placed exactly where their sequence says (semantics page, §1).
//! The target is derived from it: `strata-events` in the target's log says which event-store
//! version it reflects. A crash between steps 3 and 4 is repaired by the next run, which
//! re-derives the keys of the event-store commits the target has not seen. The source
//! position is the application transaction `strata-flow:<name>` of the event store, written in
//! the same commit as the events, so no event is lost or applied twice.
//!
//! The run's phases are in `run.rs`; preparing a flow before anything runs in `setup.rs`;
//! columns added and settings followed before a run in `evolve.rs`; writing the target in
//! `target.rs`; a first load larger than the run's memory limit, streamed through a
//! spilling sort, in `bulk.rs` (or on a cluster, in `cluster/`); `AUTO CDC FROM SNAPSHOT` (diffing deliveries into events) in `snapshot.rs`
//! and `STORED AS SNAPSHOTS` in `snapshots_mode.rs`.

mod bulk;
pub(crate) mod cluster;
mod evolve;
mod large_batch;
mod run;
mod setup;
pub(crate) mod snapshot;
mod snapshots_mode;
mod target;

pub(crate) use run::run_flow;
pub(crate) use setup::{check_existing, prepare_flow};

/// What one run of a flow did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlowReport {
    pub flow: String,
    /// Source Delta version range read, `(from, to]`.
    pub source_versions: Option<(Option<i64>, i64)>,
    pub events: usize,
    pub keys_touched: usize,
    pub keys_changed: usize,
    pub rows_inserted: usize,
    pub rows_deleted: usize,
    /// SCD type 1: keys whose current row was inserted or changed / removed.
    pub keys_upserted: usize,
    pub keys_deleted: usize,
    /// Target rows written whose values were not there before (inserted or updated rows;
    /// rows of a rewritten key that come back unchanged do not count).
    pub rows_written: usize,
    /// SCD type 2: versions (key, start) that did not exist before / that were open before
    /// and are closed now.
    pub versions_opened: usize,
    pub versions_closed: usize,
    /// Things worth telling the user (late snapshot versions, redeliveries).
    pub notes: Vec<String>,
    /// Event-store commits repaired from an earlier interrupted run.
    pub recovered: bool,
    /// Why nothing ran, if nothing did.
    pub skipped: Option<String>,
}

impl FlowReport {
    /// An empty report of flow `flow`.
    pub(crate) fn of(flow: &str) -> Self {
        FlowReport {
            flow: flow.to_string(),
            ..Default::default()
        }
    }

    /// Adds the change counts of a comparison to the report.
    pub(crate) fn count(&mut self, c: &crate::semantics::compare::Counts) {
        self.rows_written += c.rows_written;
        self.versions_opened += c.versions_opened;
        self.versions_closed += c.versions_closed;
        self.keys_upserted += c.keys_upserted;
        self.keys_deleted += c.keys_deleted;
    }
}
