//! One part of a batch into a target that has rows, on a cluster's executor: its events
//! ordered and checked, then refolded with the stored events of its keys and written as a
//! part of a large batch is here (`ops/cdc/large_batch.rs`: `refold_part`), against the
//! event store as the coordinator found it. The task commits nothing; it returns its files
//! and the changed keys, whose rows in the target's files the coordinator marks deleted.

use super::job::{open, FoldJob, PartResult};
use crate::error::{Context, EngineError, Result};
use crate::ops::cdc::bulk::order_part;
use crate::ops::cdc::large_batch::{refold_part, Refold};
use crate::storage::write::FileStream;
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::RecordBatch;
use deltalake::DeltaTable;

/// The part `batches` of a batch folded with the stored events of its keys as of the event
/// store's version `stored_at`, and written (see the module docs).
pub(super) async fn run_part(
    job: &FoldJob,
    stored_at: i64,
    batches: Vec<RecordBatch>,
) -> Result<PartResult> {
    let new = {
        let (setup, run, place) = (job.setup.clone(), job.run, job.place.clone());
        off_scheduler("ordering a part of the batch", move || {
            order_part(&setup, batches, Some(run), &place)
        })
        .await?
    };
    let store = open_store(&job.store, stored_at).await?;
    let target = open(&job.target, "the target").await?;
    let at = Refold {
        setup: &job.setup,
        store: &store,
        store_place: &job.store,
        target: &target,
        decided_at: job.decided_at,
    };
    let mut store_files = FileStream::start(&store)?;
    let mut target_files = FileStream::start(&target)?;
    let done = refold_part(&at, new, &mut store_files, &mut target_files).await?;
    Ok(PartResult {
        outcome: done.outcome,
        store_adds: store_files.finish().await?,
        target_adds: target_files.finish().await?,
        cdc_adds: done.cdc,
        changed_keys: Some(done.changed_keys),
    })
}

/// The event store at `place` as of its version `version` (the one the coordinator planned
/// the batch against).
async fn open_store(place: &str, version: i64) -> Result<DeltaTable> {
    let mut store = open(place, "the event store").await?;
    if crate::storage::table::version_of(&store) != version {
        let at = u64::try_from(version)
            .map_err(|_| EngineError::internal(format!("event store version {version}")))?;
        store
            .load_version(at)
            .await
            .context(|| format!("reading version {version} of the event store at {place}"))?;
    }
    Ok(store)
}
