//! A batch into a target that has rows, too large to fold in memory (or sent to a cluster):
//! the new events split into parts of whole keys, and each part folded with the stored
//! events of its keys, as a run folds a small batch (`run.rs`), one part at a time.
//!
//! ```text
//!  new source rows ─▶ events ─▶ split by a hash of the key (bulk.rs: split_input)
//!                                         │ a part at a time (here), or a task per part
//!                                         ▼ (cluster/batch.rs)
//!   refold_part: the part's keys' stored events (the event store as the run found it),
//!     an SCD type 1 flow's expired tombstones forgotten; folded without (the rows the
//!     target holds now) and with the new events; compared ─▶ event-store files (the new
//!     events), target files (the changed keys' rows), a change file
//!  commit_batch: the event store (with the source position), then the target: the
//!     changed keys' rows marked deleted or their files rewritten (storage/replace.rs),
//!     with the parts' files
//! ```
//!
//! The target is not read to find the touched keys' rows: a batch takes this path only
//! when the target reflects every stored event, so those rows are the fold of the keys'
//! stored events. Memory holds one part, its keys' stored events, and the changed keys
//! (their key columns) until the commit; the parts are as many as the memory limit needs
//! for the new events and as many stored ones (`in_memory`).

use super::bulk::{write_sliced, Bulk, Input, PartOutcome};
use crate::error::{Context, EngineError, Result};
use crate::eventstore::read::{read_slice, read_touched_by_pages};
use crate::eventstore::tombstones;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::compare::compare;
use crate::semantics::events::{touched_keys, Touched};
use crate::semantics::flow::FlowSetup;
use crate::storage::commit::{AppId, PendingCommit};
use crate::storage::data_file::Root;
use crate::storage::location::Location;
use crate::storage::write::FileStream;
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::{RecordBatch, UInt32Array};
use deltalake::arrow::compute::{concat_batches, take_record_batch};
use deltalake::kernel::{Add, AddCDCFile};
use deltalake::DeltaTable;

/// Where a part is refolded and written.
pub(crate) struct Refold<'a> {
    pub(crate) setup: &'a FlowSetup,
    /// The event store as the run found it, and its place (a URL or a local path).
    pub(crate) store: &'a DeltaTable,
    pub(crate) store_place: &'a str,
    pub(crate) target: &'a DeltaTable,
    /// The instant the run decides which tombstones have expired.
    pub(crate) decided_at: i64,
}

/// What refolding a part gave, besides the files written to the streams.
pub(crate) struct Refolded {
    pub(crate) outcome: PartOutcome,
    pub(crate) cdc: Vec<AddCDCFile>,
    /// The key columns of the changed keys that have rows in the target (one row each).
    pub(crate) changed_keys: RecordBatch,
}

/// Folds the part `new` (new events of whole keys, in key order with their run, checked)
/// with the stored events of its keys, and writes the new events to `store_files`, the
/// changed keys' rows to `target_files` and a change file (see the module docs).
pub(crate) async fn refold_part(
    at: &Refold<'_>,
    new: RecordBatch,
    store_files: &mut FileStream,
    target_files: &mut FileStream,
) -> Result<Refolded> {
    let setup = at.setup;
    let touched = touched_keys(setup, &new)?;
    let stored = stored_events(at, &touched).await?;
    let (stored, forgotten) = forget_expired(at, stored).await?;
    let n_events = new.num_rows();
    // Folded (and checked) before anything is written: a part rejected writes nothing.
    let change = {
        let (setup, new) = (setup.clone(), new.clone());
        off_scheduler("folding a part of the batch", move || {
            fold_and_compare(&setup, stored, new)
        })
        .await?
    };
    write_sliced(store_files, &new).await?;
    let mut cdc = Vec::new();
    if change.outcome.keys_changed > 0 {
        write_sliced(target_files, &change.inserts).await?;
        let schema = crate::storage::table::table_schema(at.target)?;
        cdc.push(
            crate::storage::replace::write_change_file(
                at.target,
                &Root::of(at.target),
                &schema,
                &change.feed.deleted,
                &change.feed.inserted,
            )
            .await?,
        );
    }
    Ok(Refolded {
        outcome: PartOutcome {
            events: n_events,
            tombstones_forgotten: forgotten,
            ..change.outcome
        },
        cdc,
        changed_keys: change.changed_keys,
    })
}

/// What folding a part gave: the changed keys' new rows, their change feed rows and keys,
/// and the counts.
struct Change {
    inserts: RecordBatch,
    feed: crate::storage::replace::Feed,
    changed_keys: RecordBatch,
    outcome: PartOutcome,
}

/// The touched keys' rows before (the fold of `stored`) and after (of `stored` and `new`)
/// the batch, compared. CPU work: callers run it off the scheduler.
fn fold_and_compare(setup: &FlowSetup, stored: RecordBatch, new: RecordBatch) -> Result<Change> {
    let (old, _) = setup.fold_to_target(&stored)?;
    let new = crate::util::arrow::cast_batch(&new, &setup.event_schema)?;
    let events =
        concat_batches(&setup.event_schema, &[stored, new]).context(|| "a part's events".into())?;
    let (rows, keys) = super::target::fold_checked(setup, events)?;
    let change = compare(setup, &old, &rows)?;
    let take = |rows: &RecordBatch, idx: Vec<u32>| {
        take_record_batch(rows, &UInt32Array::from(idx)).context(|| "selecting rows".into())
    };
    let inserts = take(&rows, change.insert_rows)?;
    let feed = crate::storage::replace::Feed {
        deleted: take(&old, change.feed_deleted)?,
        inserted: take(&rows, change.feed_inserted)?,
    };
    let deleted = take(&old, change.delete_rows)?;
    let key_at = setup
        .key_names
        .iter()
        .map(|k| {
            deleted
                .schema()
                .index_of(k)
                .map_err(|_| EngineError::internal(format!("the target has no key column {k}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let changed_keys = deleted
        .project(&key_at)
        .context(|| "the changed keys".into())?;
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
        feed,
        changed_keys,
    })
}

/// The stored events of the keys `touched`: through the store's page index for one integer
/// key in a local store (as a local run reads them), else by a query.
async fn stored_events(at: &Refold<'_>, touched: &Touched) -> Result<RecordBatch> {
    let setup = at.setup;
    let place = Location::parse(at.store_place, "the event store")?;
    if let Some(read) = read_touched_by_pages(at.store, &place, setup, touched).await? {
        return Ok(read);
    }
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "__strata_events", at.store, None).await?;
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

/// `stored` without the tombstones that expired by the run's decision instant, and the
/// events they hid (an SCD type 1 flow; `eventstore/tombstones.rs`), as a small batch
/// forgets them; with how many tombstones.
async fn forget_expired(at: &Refold<'_>, stored: RecordBatch) -> Result<(RecordBatch, usize)> {
    let setup = at.setup;
    let Some(secs) = setup.tombstone_secs else {
        return Ok((stored, 0));
    };
    let place = Location::parse(at.store_place, "the event store")?;
    let (keys, n_out) = (&setup.spec.keys, setup.spec.n_out);
    tombstones::forget_expired_in(&place, &stored, keys, n_out, secs, at.decided_at).await
}

/// Runs the large batch `bulk` here: split into parts on local disk, each refolded in turn
/// (see the module docs).
pub(super) async fn run_large_batch(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    bulk: Bulk<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let flow = &setup.flow;
    let (store, target) = store_and_target(&bulk)?;
    drop(scope.handoff.take(
        &flow.source,
        &flow.name,
        bulk.position_before(),
        bulk.source_version,
    ));
    let decided_at = chrono::Utc::now().timestamp_millis();
    let split = super::bulk::split_input(scope, setup, &bulk, in_memory(store, &bulk)).await?;
    let store_place = bulk.store_path.to_string();
    let at = Refold {
        setup,
        store,
        store_place: &store_place,
        target,
        decided_at,
    };
    let mut store_files = FileStream::start(store)?;
    let mut target_files = FileStream::start(target)?;
    let mut written = BatchWritten {
        decided_at,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let refolded = async {
        for part in 0..split.parts {
            let Some(events) = split.part(setup, part).await? else {
                continue;
            };
            let done = refold_part(&at, events, &mut store_files, &mut target_files).await?;
            written.add(done.outcome, done.cdc, Some(done.changed_keys), report);
            (scope.update)(super::bulk::progress(
                written.events,
                bulk.expected,
                started.elapsed(),
            ));
        }
        Ok::<(), EngineError>(())
    }
    .await;
    let (store_adds, target_adds) = (store_files.finish().await, target_files.finish().await);
    let (store_adds, target_adds) = match (refolded, store_adds, target_adds) {
        (Ok(()), Ok(s), Ok(t)) => (s, t),
        (refolded, s, t) => {
            // A part failed (input rejected, a write failed): what the earlier parts wrote
            // goes, so that a failed run leaves the tables' folders as they were.
            let written_files = WrittenFiles {
                store: s.unwrap_or_default(),
                target: t.unwrap_or_default(),
                cdc: std::mem::take(&mut written.cdc_adds),
            };
            written_files
                .remove(bulk.store_path, &scope.wh.table_location(&flow.target))
                .await;
            return Err(refolded.err().unwrap_or_else(|| {
                EngineError::internal("a large batch's files could not be finished")
            }));
        }
    };
    report.notes.push(format!(
        "large batch: {} new event(s) folded with the stored events of {} key(s) in {} \
         part(s) of whole keys, {} on local disk between the read and the fold",
        written.events,
        report.keys_touched,
        split.parts,
        crate::util::memory::show_size(split.bytes())
    ));
    drop(split);
    written.store_adds = store_adds;
    written.target_adds = target_adds;
    commit_batch(scope, setup, &bulk, written, report).await
}

/// Files a failed large batch wrote (in no commit).
struct WrittenFiles {
    store: Vec<Add>,
    target: Vec<Add>,
    cdc: Vec<AddCDCFile>,
}

impl WrittenFiles {
    /// Removes the files from the event store at `store` and the target at `target`; a file
    /// that cannot be removed is logged (it is in no commit: a vacuum removes it).
    async fn remove(self, store: &Location, target: &Location) {
        let paths = self
            .store
            .into_iter()
            .map(|a| (store, a.path))
            .chain(self.target.into_iter().map(|a| (target, a.path)))
            .chain(self.cdc.into_iter().map(|c| (target, c.path)));
        for (place, path) in paths {
            if let Err(e) = place.remove_file(&path).await {
                tracing::warn!("{e}: left for a vacuum");
            }
        }
    }
}

/// The events a part of the batch `bulk` holds in all, summed over the parts: the new
/// events, and the stored events of their keys, taken as many as the new ones (a batch
/// touching few keys of a long history holds more; one touching many keys of a short
/// history fewer) but never more than the store holds.
fn in_memory(store: &DeltaTable, bulk: &Bulk<'_>) -> u64 {
    let files: Vec<String> = crate::storage::table::table_files(store)
        .map(|f| f.into_iter().collect())
        .unwrap_or_default();
    let stored = super::bulk::estimated_rows(store, &files).unwrap_or(bulk.expected);
    bulk.expected + stored.min(bulk.expected)
}

/// The event store and the target a large batch writes (both exist: it is not a first load).
fn store_and_target<'b>(bulk: &'b Bulk<'_>) -> Result<(&'b DeltaTable, &'b DeltaTable)> {
    match (&bulk.from, &bulk.target) {
        (
            Input::Source {
                store: Some(store), ..
            },
            Some(target),
        ) => Ok((store, target)),
        _ => Err(EngineError::internal(
            "a large batch has an event store and a target",
        )),
    }
}

/// What a large batch's parts wrote, gathered for its commits.
#[derive(Default)]
pub(super) struct BatchWritten {
    pub(super) events: usize,
    /// Expired tombstones the parts forgot.
    pub(super) forgotten: usize,
    pub(super) decided_at: i64,
    pub(super) store_adds: Vec<Add>,
    pub(super) target_adds: Vec<Add>,
    pub(super) cdc_adds: Vec<AddCDCFile>,
    /// The changed keys' key columns, part by part.
    pub(super) changed_keys: Vec<RecordBatch>,
}

impl BatchWritten {
    /// A part's outcome, change files and changed keys, counted into `report`.
    pub(super) fn add(
        &mut self,
        outcome: PartOutcome,
        cdc: Vec<AddCDCFile>,
        changed_keys: Option<RecordBatch>,
        report: &mut FlowReport,
    ) {
        outcome.add_to(report);
        self.events += outcome.events;
        self.forgotten += outcome.tombstones_forgotten;
        self.cdc_adds.extend(cdc);
        self.changed_keys.extend(changed_keys);
    }
}

/// Commits a large batch: the event store's new files with the source position (from here
/// on the events are never lost), then the target's (the changed keys' old rows marked
/// deleted or their files rewritten, with the parts' files and change files).
pub(super) async fn commit_batch(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    bulk: &Bulk<'_>,
    written: BatchWritten,
    report: &mut FlowReport,
) -> Result<()> {
    let flow = &setup.flow;
    let (store, target) = store_and_target(bulk)?;
    report.events = written.events;
    if written.forgotten > 0 {
        report.notes.push(format!(
            "{} tombstone(s) older than {} s forgotten ({}): a late event older than one of \
             those deletes brings its key back",
            written.forgotten,
            setup.tombstone_secs.unwrap_or_default(),
            tombstones::PROPERTY
        ));
    }
    let commit = PendingCommit::of_run(scope.run_id)
        .at(AppId::Flow(&flow.name), bulk.source_version)
        .with_info(
            tombstones::DECIDED_AT,
            serde_json::json!(written.decided_at),
        );
    let store_version =
        crate::storage::write::append(store, Vec::new(), written.store_adds, &commit)
            .await
            .map_err(|e| e.within(|| format!("flow {}: committing events", flow.name)))?;
    if report.keys_changed == 0 {
        return Ok(());
    }
    let key_schema = match written.changed_keys.first() {
        Some(k) => k.schema(),
        None => {
            return Err(EngineError::internal(
                "changed keys without their key columns",
            ))
        }
    };
    let changed =
        concat_batches(&key_schema, &written.changed_keys).context(|| "the changed keys".into())?;
    let commit = PendingCommit::of_run(scope.run_id)
        .at(AppId::Events, store_version)
        .at(AppId::Flow(&flow.name), bulk.source_version);
    let replaced = crate::storage::replace::replace_keys_with_files(
        target,
        &setup.key_names,
        &changed,
        written.target_adds,
        written.cdc_adds,
        &commit,
    )
    .await
    .map_err(|e| e.within(|| format!("flow {}: writing {}", flow.name, flow.target)))?;
    match replaced {
        Some(_) => Ok(()),
        None => Err(EngineError::internal(format!(
            "flow {}: {} changed its layout during the run",
            flow.name, flow.target
        ))),
    }
}
