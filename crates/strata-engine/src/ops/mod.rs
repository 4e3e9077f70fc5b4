//! One folder per kind of dataset, each running one node of a pipeline: ingestion into
//! streaming tables and append flows ([`ingest`]), AUTO CDC flows from change events and
//! from snapshots ([`cdc`]), materialized views ([`mview`]) and point-in-time tables
//! ([`pit`]). No kind uses another; what they share lives in the layers below.

pub(crate) mod cdc;
pub(crate) mod ingest;
pub(crate) mod mview;
pub(crate) mod pit;
pub(crate) mod sink;

use crate::eventstore::handoff::Handoff;
use crate::storage::warehouse::Warehouse;

/// What each node's run gets from the pipeline run it is part of.
pub(crate) struct Scope<'a> {
    pub(crate) wh: &'a Warehouse,
    /// The run's id, as the event log and every commit of the run record it.
    pub(crate) run_id: &'a str,
    /// The pipeline file as the user named it (for the commands errors suggest).
    pub(crate) pipeline: &'a str,
    /// Checked events handed from ingestions to the flows that read their tables.
    pub(crate) handoff: &'a Handoff,
    /// The memory limit of large work, in bytes (`util/memory.rs`): a bulk load past it
    /// sorts on disk, and an ingestion keeps no more events than a share of it.
    pub(crate) memory: u64,
    /// `strata run --cluster`: where bulk loads go (`ops/cdc/cluster`).
    pub(crate) cluster: Option<&'a crate::ops::cdc::cluster::ClusterRun>,
    /// The pipeline's folder (`read_files` paths are relative to it).
    pub(crate) dir: &'a std::path::Path,
    /// Tells how far the node has got (`3 of 10 file(s), 120000 row(s)`), for progress
    /// displays.
    pub(crate) update: &'a (dyn Fn(String) + Send + Sync),
}
