//! One part of a batch into a target that has rows, on a cluster's executor: the same
//! phases as a local run (`ops/cdc/run.rs`), for the keys of one hash partition.
//!
//! ```text
//!  the part's new events ─▶ order and check ─▶ the touched keys' stored events (the event
//!  (whole keys)              (with the run)     store as the coordinator saw it)
//!        ─▶ fold stored (the rows the target holds now) and stored + new (the rows after)
//!        ─▶ compare ─▶ write: new events to store files, changed keys' rows to target
//!                      files, a change file (old rows `delete`, new rows `insert`)
//! ```
//!
//! An SCD type 1 flow's expired tombstones are forgotten as a local run forgets them, at
//! the instant the coordinator decided (sent with the job, recorded in its commit).
//!
//! The target is not read: a batch goes to the cluster only when the target reflects every
//! stored event, so the touched keys' current rows are the fold of their stored events. The
//! task commits nothing; it returns its files and the old rows of the changed keys, whose
//! rows in the target's files the coordinator marks deleted (`storage/replace.rs`).

use super::job::{open, FoldJob, PartResult};
use crate::error::{Context, EngineError, Result};
use crate::eventstore::read::read_slice;
use crate::eventstore::tombstones;
use crate::ops::cdc::bulk::{order_part, write_sliced, PartOutcome};
use crate::semantics::compare::compare;
use crate::semantics::events::{touched_keys, Touched};
use crate::storage::data_file::Root;
use crate::storage::location::Location;
use crate::storage::write::FileStream;
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::{RecordBatch, UInt32Array};
use deltalake::arrow::compute::{concat_batches, take_record_batch};
use deltalake::DeltaTable;

/// The part `batches` of a batch folded with the stored events of its keys as of the event
/// store's version `stored_at`, and written (see the module docs).
pub(super) async fn run_part(
    job: &FoldJob,
    stored_at: i64,
    batches: Vec<RecordBatch>,
) -> Result<PartResult> {
    let setup = &job.setup;
    let new = {
        let (setup, run, place) = (setup.clone(), job.run, job.place.clone());
        off_scheduler("ordering a part of the batch", move || {
            order_part(&setup, batches, Some(run), &place)
        })
        .await?
    };
    let touched = touched_keys(setup, &new)?;
    let store = open_store(&job.store, stored_at).await?;
    let stored = stored_events(job, &store, &touched).await?;
    let (stored, forgotten) = forget_expired(job, stored).await?;
    let change = {
        let (setup, new) = (setup.clone(), new.clone());
        off_scheduler("folding a part of the batch", move || {
            fold_and_compare(&setup, stored, new)
        })
        .await?
    };
    let target = open(&job.target, "the target").await?;
    let mut store_files = FileStream::start(&store)?;
    write_sliced(&mut store_files, &new).await?;
    let store_adds = store_files.finish().await?;
    let (mut target_adds, mut cdc_adds) = (Vec::new(), Vec::new());
    if change.outcome.keys_changed > 0 {
        let mut target_files = FileStream::start(&target)?;
        write_sliced(&mut target_files, &change.inserts).await?;
        target_adds = target_files.finish().await?;
        let schema = crate::storage::table::table_schema(&target)?;
        cdc_adds.push(
            crate::storage::replace::write_change_file(
                &target,
                &Root::of(&target),
                &schema,
                &change.old_rows,
                &change.inserts,
            )
            .await?,
        );
    }
    Ok(PartResult {
        outcome: PartOutcome {
            events: new.num_rows(),
            tombstones_forgotten: forgotten,
            ..change.outcome
        },
        store_adds,
        target_adds,
        cdc_adds,
        old_rows: Some(change.old_rows),
    })
}

/// What folding a part gave: the changed keys' new rows and old rows, and the counts.
struct Change {
    inserts: RecordBatch,
    old_rows: RecordBatch,
    outcome: PartOutcome,
}

/// The touched keys' rows before (the fold of `stored`) and after (of `stored` and `new`)
/// the batch, compared. CPU work: callers run it off the scheduler.
fn fold_and_compare(
    setup: &crate::semantics::flow::FlowSetup,
    stored: RecordBatch,
    new: RecordBatch,
) -> Result<Change> {
    let (old, _) = setup.fold_to_target(&stored)?;
    let new = crate::util::arrow::cast_batch(&new, &setup.event_schema)?;
    let events =
        concat_batches(&setup.event_schema, &[stored, new]).context(|| "a part's events".into())?;
    let (rows, keys) = crate::ops::cdc::target::fold_checked(setup, events)?;
    let change = compare(setup, &old, &rows)?;
    let take = |rows: &RecordBatch, idx: Vec<u32>| {
        take_record_batch(rows, &UInt32Array::from(idx)).context(|| "selecting rows".into())
    };
    let inserts = take(&rows, change.insert_rows)?;
    let old_rows = take(&old, change.old_rows)?;
    Ok(Change {
        outcome: PartOutcome {
            events: 0,
            rows: inserts.num_rows(),
            keys,
            counts: change.counts,
            keys_changed: change.keys,
            rows_deleted: change.rows_deleted,
            tombstones_forgotten: 0,
        },
        inserts,
        old_rows,
    })
}

/// The stored events of the keys `touched`: through the store's page index for one integer
/// key in a local store (as a local run reads them), else by a query.
async fn stored_events(
    job: &FoldJob,
    store: &DeltaTable,
    touched: &Touched,
) -> Result<RecordBatch> {
    let setup = &job.setup;
    if let (Touched::Keys(keys), [key]) = (touched, setup.key_names.as_slice()) {
        if let Some(ints) = crate::eventstore::pages::int_keys(keys) {
            let place = Location::parse(&job.store, "the event store")?;
            let read =
                crate::eventstore::pages::read_keys(store, &place, key, ints, &setup.event_schema)
                    .await?;
            if let Some(read) = read {
                return Ok(read);
            }
        }
    }
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "__strata_events", store, None).await?;
    read_slice(
        &ctx,
        setup,
        "__strata_events",
        touched,
        &setup.event_schema,
        true,
    )
    .await
}

/// `stored` without the tombstones that expired by the job's decision instant, and the
/// events they hid (an SCD type 1 flow; `eventstore/tombstones.rs`), as a local run forgets
/// them; with how many tombstones.
async fn forget_expired(job: &FoldJob, stored: RecordBatch) -> Result<(RecordBatch, usize)> {
    let setup = &job.setup;
    let Some(secs) = setup.tombstone_secs else {
        return Ok((stored, 0));
    };
    let place = Location::parse(&job.store, "the event store")?;
    let n_out = setup.spec.n_out;
    let mut times = tombstones::CommitTimes::of_runs(&place, &stored, n_out).await?;
    tombstones::forget_expired(
        &stored,
        &setup.spec.keys,
        n_out,
        secs,
        job.decided_at,
        &mut times,
    )
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
