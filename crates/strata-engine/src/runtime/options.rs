//! What a run is asked to do beyond the pipeline text, and what it reports.

use crate::ops::cdc::FlowReport;
use crate::ops::ingest::IngestReport;
use crate::ops::mview::MvReport;
use crate::ops::pit::PitReport;
use std::collections::BTreeMap;
use strata_sql::TableName;

/// The table property naming the columns `strata optimize` Z-orders a table by when no
/// `--zorder-by` is given (Databricks' name).
pub const ZORDER_PROPERTY: &str = "pipelines.autoOptimize.zOrderCols";

/// The table property that, set to `false`, leaves a table out of an optimize of the whole
/// warehouse and its event store out of the compaction after a run (Databricks' name);
/// naming the table still optimizes it.
pub const MANAGED_PROPERTY: &str = "pipelines.autoOptimize.managed";

/// The table property that makes a run optimize a table it wrote once the table has at
/// least this many files.
pub const MIN_FILES_PROPERTY: &str = "pipelines.autoOptimize.minFiles";

/// What a run did, node by node, in execution order.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    /// The id of the run's records in the event log.
    pub run_id: String,
    pub ingests: Vec<IngestReport>,
    pub flows: Vec<FlowReport>,
    pub views: Vec<MvReport>,
    pub pits: Vec<PitReport>,
    /// PostgreSQL sinks delivered after the flows into them (`ops/sink.rs`).
    pub sinks: Vec<crate::ops::sink::SinkReport>,
    /// Datasets that did not run because their schema cannot be known yet (no input files
    /// and no `schema =>`, or a joined table with no columns yet), with the reason.
    pub waiting: Vec<String>,
    /// Tables a full refresh set aside, and where their old content now is.
    #[serde(serialize_with = "named_paths")]
    pub set_aside: Vec<(TableName, crate::storage::location::Location)>,
    /// The run was asked to stop ([`RunOptions::stop`]) before all its nodes ran.
    pub stopped: bool,
    /// Tables the run wrote that passed their `pipelines.autoOptimize.minFiles` and were
    /// optimized after it, and event stores whose small files it compacted.
    pub optimized: Vec<Optimized>,
}

impl RunReport {
    /// The report as JSON: one object with a list per kind of dataset, field names as here.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// `(table, location)` pairs as `[["schema.table", "location"], ...]`.
fn named_paths<S: serde::Serializer>(
    pairs: &[(TableName, crate::storage::location::Location)],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(pairs.len()))?;
    for (t, at) in pairs {
        seq.serialize_element(&(t.to_string(), at.to_string()))?;
    }
    seq.end()
}

/// How to run a pipeline beyond its text.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Values substituted for `${name}` in the pipeline text before it is parsed.
    pub configuration: BTreeMap<String, String>,
    /// `--select NAME[+]`: run only what writes this dataset (or this flow), and with
    /// `downstream` everything that reads it, directly or not.
    pub select: Option<Selection>,
    /// `--full-refresh [TABLE ...]`: `Some(empty)` rebuilds every table, `Some(names)`
    /// those tables and everything that reads them.
    pub full_refresh: Option<Vec<String>>,
    /// Called as each node starts and ends (progress display).
    pub progress: Option<ProgressFn>,
    /// `--lock`: one run of this pipeline at a time on the warehouse (`runtime/lock.rs`);
    /// `None`: runs may overlap (they stay correct through Delta's conditional commits).
    pub lock: Option<crate::runtime::lock::LockMode>,
    /// When set (by a signal handler), the run stops before its next node: the node in
    /// flight finishes its commit, nothing after it starts. [`RunReport::stopped`] says so.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// `--cluster URL`: first loads of AUTO CDC flows of at least its `min_events` events
    /// run on this cluster (`ops/cdc/cluster`); `None`: everything runs here.
    pub cluster: Option<crate::ops::cdc::cluster::ClusterRun>,
}

/// A callback for [`Progress`] events.
#[derive(Clone)]
pub struct ProgressFn(pub std::sync::Arc<dyn Fn(Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn")
    }
}

/// A node starting or ending, for progress displays.
#[derive(Debug, Clone)]
pub enum Progress {
    Started {
        node: String,
    },
    /// How far a running node has got (`3 of 10 file(s), 120000 row(s)`).
    Update {
        node: String,
        detail: String,
    },
    Finished {
        node: String,
        summary: String,
        elapsed: std::time::Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub name: String,
    pub downstream: bool,
}

impl std::str::FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (name, downstream) = match s.strip_suffix('+') {
            Some(n) => (n, true),
            None => (s, false),
        };
        if name.is_empty() {
            return Err("expected a dataset or flow name, optionally followed by +".into());
        }
        Ok(Selection {
            name: name.to_string(),
            downstream,
        })
    }
}

/// One table's optimize.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Optimized {
    pub table: String,
    pub files_before: usize,
    pub files_after: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Files the commit removed and added (0 and 0: nothing to compact, no commit).
    pub files_removed: u64,
    pub files_added: u64,
    /// The Z-order columns, empty for bin-packing.
    pub zorder_by: Vec<String>,
    /// The table's version after the optimize.
    pub version: i64,
    pub millis: u128,
    /// Why the table was left alone.
    pub skipped: Option<String>,
    /// An event store's events before and after its compaction.
    pub events: Option<(usize, usize)>,
    /// Expired deletes an event store's compaction forgot, with the events they hid.
    pub tombstones_forgotten: usize,
    /// What the reader should know (why an event store kept its tombstones).
    pub note: Option<String>,
}
