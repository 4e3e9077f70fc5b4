//! A cluster job's work and results: the [`FoldJob`] every partition of a bulk load or
//! batch carries, a first load's part ([`FoldJob::load_part`]; a batch's is `batch.rs`),
//! and the result row each partition sends back ([`PartResult`]), which the coordinator
//! reads with [`read_results`].

use crate::error::{EngineError, Result};
use crate::ops::cdc::bulk::{order_part, write_part, PartOutcome};
use crate::semantics::flow::FlowSetup;
use crate::storage::location::Location;
use crate::storage::write::FileStream;
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::{RecordBatch, StringArray};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use std::sync::Arc;

/// What every partition of a cluster bulk load does, sent with the plan.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct FoldJob {
    pub(crate) setup: FlowSetup,
    /// The event store's place (a URL or a local path every executor sees).
    pub(crate) store: String,
    /// The target's place.
    pub(crate) target: String,
    /// The run number the events are stored under.
    pub(crate) run: i64,
    /// The input as errors name it (`the rows of default.raw added after version 3`).
    pub(crate) place: String,
    /// For a batch into a target with rows (`batch.rs`): the event store's version whose
    /// events the new ones are folded with; `None` for a first load.
    #[serde(default)]
    pub(crate) stored_at: Option<i64>,
    /// The instant the run decides which tombstones have expired (milliseconds since the
    /// epoch), recorded in its event-store commit (`eventstore/tombstones.rs`).
    #[serde(default)]
    pub(crate) decided_at: i64,
}

/// The columns of a partition's result row.
const OUTCOME: &str = "outcome";
const STORE_ADDS: &str = "store_adds";
const TARGET_ADDS: &str = "target_adds";
const CDC_ADDS: &str = "cdc_adds";
const CHANGED_KEYS: &str = "changed_keys";

/// The schema of a partition's result: its [`PartOutcome`] and the add actions of the files
/// it wrote, as JSON, and a batch's changed keys (Arrow IPC, base64; empty for a first
/// load).
pub(crate) fn result_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(OUTCOME, DataType::Utf8, false),
        Field::new(STORE_ADDS, DataType::Utf8, false),
        Field::new(TARGET_ADDS, DataType::Utf8, false),
        Field::new(CDC_ADDS, DataType::Utf8, false),
        Field::new(CHANGED_KEYS, DataType::Utf8, false),
    ]))
}

/// One partition's result, read back by the coordinator.
pub(crate) struct PartResult {
    pub(crate) outcome: PartOutcome,
    pub(crate) store_adds: Vec<deltalake::kernel::Add>,
    pub(crate) target_adds: Vec<deltalake::kernel::Add>,
    /// A batch's change files (old rows `delete`, new rows `insert`).
    pub(crate) cdc_adds: Vec<deltalake::kernel::AddCDCFile>,
    /// A batch's changed keys that have rows in the target (their key columns).
    pub(crate) changed_keys: Option<RecordBatch>,
}

impl PartResult {
    /// The result of a partition without events.
    pub(crate) fn empty() -> Self {
        PartResult {
            outcome: PartOutcome::default(),
            store_adds: Vec::new(),
            target_adds: Vec::new(),
            cdc_adds: Vec::new(),
            changed_keys: None,
        }
    }

    /// The result row the coordinator reads back ([`read_results`]).
    pub(crate) fn to_row(&self) -> Result<RecordBatch> {
        let text = |v: String| Arc::new(StringArray::from(vec![v])) as _;
        let changed_keys = match &self.changed_keys {
            Some(rows) => crate::util::arrow::batch_to_text(rows)?,
            None => String::new(),
        };
        RecordBatch::try_new(
            result_schema(),
            vec![
                text(json(&self.outcome)?),
                text(json(&self.store_adds)?),
                text(json(&self.target_adds)?),
                text(json(&self.cdc_adds)?),
                text(changed_keys),
            ],
        )
        .map_err(|e| EngineError::internal(format!("a cluster partition's result: {e}")))
    }
}

/// The rows of a cluster's result batches.
pub(crate) fn read_results(batches: &[RecordBatch]) -> Result<Vec<PartResult>> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        EngineError::internal(format!("a cluster partition's result: {what}: {e}"))
    };
    let mut out = Vec::new();
    for batch in batches {
        let column = |name: &str| -> Result<&StringArray> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| bad(name, &"missing"))
        };
        let (outcome, store, target) =
            (column(OUTCOME)?, column(STORE_ADDS)?, column(TARGET_ADDS)?);
        let (cdc, old) = (column(CDC_ADDS)?, column(CHANGED_KEYS)?);
        for row in 0..batch.num_rows() {
            out.push(PartResult {
                outcome: serde_json::from_str(outcome.value(row)).map_err(|e| bad(OUTCOME, &e))?,
                store_adds: serde_json::from_str(store.value(row))
                    .map_err(|e| bad(STORE_ADDS, &e))?,
                target_adds: serde_json::from_str(target.value(row))
                    .map_err(|e| bad(TARGET_ADDS, &e))?,
                cdc_adds: serde_json::from_str(cdc.value(row)).map_err(|e| bad(CDC_ADDS, &e))?,
                changed_keys: match old.value(row) {
                    "" => None,
                    text => Some(crate::util::arrow::batch_from_text(text)?),
                },
            });
        }
    }
    Ok(out)
}

impl FoldJob {
    /// One partition of a first load (`batches`, none empty): its events ordered and
    /// checked, stored, folded and written.
    pub(crate) async fn load_part(self, batches: Vec<RecordBatch>) -> Result<PartResult> {
        let mut result = PartResult::empty();
        let (setup, run, place) = (self.setup.clone(), self.run, self.place.clone());
        let events = off_scheduler("ordering a part of the bulk load", move || {
            order_part(&setup, batches, Some(run), &place)
        })
        .await?;
        let store = open(&self.store, "the event store").await?;
        let target = open(&self.target, "the target").await?;
        let mut store_files = FileStream::start(&store)?;
        let mut target_files = FileStream::start(&target)?;
        result.outcome = write_part(
            &self.setup,
            events,
            Some(&mut store_files),
            &mut target_files,
        )
        .await?;
        result.store_adds = store_files.finish().await?;
        result.target_adds = target_files.finish().await?;
        Ok(result)
    }
}

/// A result value as JSON.
fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| EngineError::internal(format!("encoding a cluster partition's result: {e}")))
}

/// The table at `place`, which the coordinator created before it sent the job.
pub(crate) async fn open(place: &str, what: &str) -> Result<deltalake::DeltaTable> {
    let location = Location::parse(place, what)?;
    crate::storage::table::open_delta(&location)
        .await?
        .ok_or_else(|| EngineError::internal(format!("{what} at {place} has no Delta log")))
}
