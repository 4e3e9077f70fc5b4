//! A flow checked against its source's schema: which columns it keeps, its keys, the fold
//! it does and the schemas of its event store and target. Built by `ops/cdc/setup.rs`; pure
//! data everything downstream reads.

use crate::error::{Context, Result};
use crate::semantics::fold;
use crate::semantics::fold::FoldSpec;
use crate::semantics::timeline::Timeline;
use crate::util::arrow;
use deltalake::arrow::array::{ArrayRef, RecordBatch};
use deltalake::arrow::datatypes::SchemaRef;
use strata_sql::CdcFlow;
use strata_sql::FlowKind;

/// A flow checked against its source's schema: everything needed to run it.
/// Serializable (JSON, schemas as Arrow IPC) for the executors of a cluster run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct FlowSetup {
    pub flow: CdcFlow,
    /// `SELECT <output cols>, <seq> AS __strata_seq, <op> AS __strata_op FROM __strata_source`
    pub select_sql: String,
    pub out_cols: Vec<String>,
    pub key_names: Vec<String>,
    /// Event-store schema: output columns, `__strata_seq`, `__strata_op`, `__strata_run`.
    #[serde(with = "arrow::schema_serde")]
    pub event_schema: SchemaRef,
    /// Rows as the fold produces them: output columns, then `__START_AT`, `__END_AT` for
    /// SCD type 2 and `SNAPSHOTS` targets.
    #[serde(with = "arrow::schema_serde")]
    pub fold_schema: SchemaRef,
    /// The target's columns: output columns, then the timeline columns of its convention.
    #[serde(with = "arrow::schema_serde")]
    pub target_schema: SchemaRef,
    pub timeline: Timeline,
    pub spec: FoldSpec,
    /// The source is an AUTO CDC target, read through its change data feed (set by the
    /// pipeline; table-mode snapshot flows read the table itself).
    pub source_feed: bool,
    /// How long a delete's tombstone is kept, in seconds (`eventstore/tombstones.rs`): change-event
    /// flows into SCD type 1 targets; `None` for the others, which keep them all.
    pub tombstone_secs: Option<u64>,
    /// The target's `COMMENT`, written into its Delta metadata when it is created.
    pub target_comment: Option<String>,
    /// The target's declared `PARTITIONED BY` columns.
    pub target_partitions: Vec<String>,
    /// Said after a NULL-key rejection when the source is a database change log and the
    /// flow has no truncate rule (a TRUNCATE's row has no key).
    pub null_key_hint: Option<String>,
}

impl FlowSetup {
    /// An `AUTO CDC FROM SNAPSHOT` flow.
    pub(crate) fn is_snapshot(&self) -> bool {
        matches!(self.flow.kind, FlowKind::Snapshot { .. })
    }

    /// The key columns of `batch` (in the event or target layout) in Arrow's row format.
    pub(crate) fn key_rows(&self, batch: &RecordBatch) -> Result<deltalake::arrow::row::Rows> {
        arrow::rows(
            &self
                .spec
                .keys
                .iter()
                .map(|&k| batch.column(k).clone())
                .collect::<Vec<_>>(),
        )
    }

    /// The target rows (timeline convention applied) of every key of `events`, and how
    /// many keys they hold.
    pub(crate) fn fold_to_target(&self, events: &RecordBatch) -> Result<(RecordBatch, usize)> {
        let (rows, keys) = fold::fold_batch(events, &self.spec, &self.fold_schema)?;
        if !self.spec.scd2 {
            return Ok((rows, keys));
        }
        let rows =
            self.timeline
                .apply(&rows, self.spec.n_out, &self.spec.keys, &self.target_schema)?;
        Ok((rows, keys))
    }

    /// What [`fold_to_target`](Self::fold_to_target) gives `events` when each upserts a key
    /// no other event has and nothing came before: each event is its key's row (SCD type 2:
    /// one open version from its sequence), in the events' order, sharing their columns.
    /// The caller vouches for the keys being distinct and the events being upserts.
    /// For SCD type 2, `open`, a NULL column of the sequence's type at least as long as
    /// `events`, is sliced for the open ends (callers with many batches share one).
    pub(crate) fn first_rows(&self, events: &RecordBatch, open: &ArrayRef) -> Result<RecordBatch> {
        let n_out = self.spec.n_out;
        let mut cols = events.columns()[..n_out].to_vec();
        if self.spec.scd2 {
            let seq = events.column(n_out);
            cols.push(seq.clone());
            cols.push(open.slice(0, seq.len()));
        }
        let rows = RecordBatch::try_new(self.fold_schema.clone(), cols)
            .context(|| format!("flow {}: the first rows", self.flow.name))?;
        if !self.spec.scd2 {
            return Ok(rows);
        }
        self.timeline
            .apply(&rows, n_out, &self.spec.keys, &self.target_schema)
    }

    /// A snapshot flow without `SNAPSHOT VERSION BY`: each run snapshots the whole source.
    pub(crate) fn table_mode(&self) -> bool {
        matches!(self.flow.kind, FlowKind::Snapshot { version_by: None })
    }
}
