//! A flow's bulk load in bounded memory: the first run into an empty target of more events
//! than fit in the run's memory limit, or the rebuild of an empty target from its event
//! store after a bulk load was killed between its two commits.
//!
//! ```text
//!  source rows ─▶ events (the flow's SELECT, ─▶ split into parts by a hash of the key
//!  (the store's    one stream per core)           (util/spill.rs: Arrow IPC files in TMPDIR,
//!   events, when                                   each part small enough for memory)
//!   rebuilding)                                              │ a part at a time
//!                                                            ▼
//!       event store files ◀── the part's events in key order, checked (R4), once ◀──┤
//!       target files      ◀── its folded rows, checked ◀── fold (strata-core) ◀─────┘
//!  then: one event-store commit (with the source position), one target commit (with it)
//! ```
//!
//! Every key's events are in one part, so a part folds on its own, exactly as a load that
//! fits in memory folds all of them (the same code: `with_run`, `fold_checked`). Memory holds
//! one part, the split's buffers and the writers' row groups, whatever the number of events;
//! the events are read once, written once to local disk and once to the event store. Files
//! written before a failure are in no commit (a vacuum removes them); a run killed after the
//! store commit leaves an empty target, which the next run rebuilds from the store the same
//! way.

use crate::error::{Context, EngineError, Result};
use crate::eventstore::tombstones;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::compare::count_first_rows;
use crate::semantics::events::{validate_events, with_run, without_run};
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::RUN_COL;
use crate::storage::commit::{AppId, PendingCommit};
use crate::storage::location::Location;
use crate::storage::write::FileStream;
use crate::util::memory::show_size;
use crate::util::spill::{SpillDir, Spilled, Spiller};
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::DeltaTable;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes an event takes in the in-memory path, all copies counted (the hand-off, the
/// concatenated events, the fold's indices and its output): the 10M-event benchmark peaks
/// at about 1.5-1.8 GiB. A load whose events would take more than the limit streams, and
/// a part of a bulk load holds as many events as fit at this size.
pub(super) const EVENT_BYTES_IN_MEMORY: u64 = 200;

/// The share of the memory limit the split's buffers may hold in all (each part's buffer
/// is written out as a file when it holds its share of it).
const SPLIT_BUFFER_SHARE: u64 = 4;

/// Rows handed to a file writer at a time: the writers encode side by side.
const WRITE_ROWS: usize = 1 << 18;

/// Where the bulk load's events come from.
pub(super) enum Input<'a> {
    /// The source's rows added since the flow's position (its first run): sorted, stored
    /// and folded.
    Source {
        source: &'a DeltaTable,
        changes: &'a crate::storage::changes::Changes,
        from: Option<i64>,
        store: Option<DeltaTable>,
        /// The run number the events are stored under.
        run: i64,
    },
    /// Every event of the store (a run was killed between its store and target commits):
    /// folded only.
    Store { store: &'a DeltaTable },
}

/// What the bulk load commits against.
pub(super) struct Bulk<'a> {
    pub(super) from: Input<'a>,
    pub(super) store_path: &'a Location,
    /// The source version read up to (recorded as the flow's position).
    pub(super) source_version: i64,
    /// The event store's version the target will reflect when rebuilding from the store.
    pub(super) store_version: i64,
    /// The target when it exists (without data files).
    pub(super) target: Option<DeltaTable>,
    /// The events the input holds, by the Delta log's statistics (for progress).
    pub(super) expected: u64,
}

impl Bulk<'_> {
    /// The flow's position in its source before this load (`None` when rebuilding from the
    /// store, or on the first run).
    pub(super) fn position_before(&self) -> Option<i64> {
        match &self.from {
            Input::Source { from, .. } => *from,
            Input::Store { .. } => None,
        }
    }
}

/// The events of the files `live` of `source` (by the Delta log's statistics) when a load of
/// them streams: at least the run's cluster's `min_events` (it goes to the cluster), or
/// more than the run's memory limit holds in memory (`STRATA_STREAM_MIN_ROWS`
/// sets the row count instead; the golden scenarios' parallel mode sets it to 1, so every
/// first load takes this path there); `None` when they are folded in memory.
pub(super) fn streamed_events(
    scope: &Scope<'_>,
    source: &DeltaTable,
    live: &[String],
) -> Option<u64> {
    let rows = estimated_rows(source, live)?;
    if scope.cluster.is_some_and(|c| rows >= c.min_events) {
        return Some(rows);
    }
    let streams = match min_rows_override() {
        Some(min) => rows >= min,
        None => rows.saturating_mul(EVENT_BYTES_IN_MEMORY) > scope.memory,
    };
    streams.then_some(rows)
}

fn min_rows_override() -> Option<u64> {
    static MIN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("STRATA_STREAM_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// The rows of the source files `live` by the Delta log's statistics; `None` when a file
/// has none.
pub(super) fn estimated_rows(source: &DeltaTable, live: &[String]) -> Option<u64> {
    let live: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
    let snapshot = source.snapshot().ok()?;
    let mut rows = 0u64;
    for f in snapshot.log_data().iter() {
        let path = f.path();
        if live.contains(path.as_ref()) {
            rows += f.num_records()? as u64;
        }
    }
    Some(rows)
}

/// Runs the bulk load `bulk` of `setup` (see the module docs).
pub(super) async fn run_bulk(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    bulk: Bulk<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let flow = &setup.flow;
    // Events an ingestion of this run kept for the flow are let go: the split reads the files.
    drop(
        scope
            .handoff
            .take(&flow.source, &flow.name, None, bulk.source_version),
    );
    let split = split_input(scope, setup, &bulk, bulk.expected).await?;
    let store = match &bulk.from {
        Input::Source { store: Some(s), .. } => Some(s.clone()),
        Input::Source { store: None, .. } => Some(
            crate::eventstore::pages::create_store(
                bulk.store_path,
                &setup.event_schema,
                &setup.key_names,
            )
            .await?,
        ),
        Input::Store { .. } => None,
    };
    let target = match &bulk.target {
        Some(t) => t.clone(),
        None => super::target::create_target(scope, setup, target_properties).await?,
    };
    let mut store_files = store.as_ref().map(FileStream::start).transpose()?;
    let mut target_files = FileStream::start(&target)?;
    let mut folded_events = 0usize;
    let decided_at = chrono::Utc::now().timestamp_millis();
    let started = std::time::Instant::now();
    for part in 0..split.parts {
        let Some(events) = split.part(setup, part).await? else {
            continue;
        };
        let outcome = write_part(setup, events, store_files.as_mut(), &mut target_files).await?;
        folded_events += outcome.events;
        outcome.add_to(report);
        (scope.update)(progress(folded_events, bulk.expected, started.elapsed()));
    }
    report.notes.push(format!(
        "bulk load: {folded_events} event(s) folded in {} part(s) of whole keys, {} \
         on local disk between the read and the fold",
        split.parts,
        show_size(split.spilled.bytes)
    ));
    drop(split);
    let store_adds = match store_files {
        Some(files) => Some(files.finish().await?),
        None => None,
    };
    let written = Written {
        store: store.as_ref().zip(store_adds),
        target: &target,
        target_adds: target_files.finish().await?,
        events: folded_events,
        decided_at,
    };
    commit_bulk(scope, setup, &bulk, written, report).await
}

/// A load's (or a large batch's) events split into parts of whole keys on local disk.
pub(super) struct SplitInput {
    /// Removed (with the parts' files) when the split is dropped.
    _dir: SpillDir,
    spilled: Spilled,
    pub(super) parts: usize,
    /// The run number new events are stored under (`None` when rebuilding from the store).
    run: Option<i64>,
    /// The input as errors name it.
    place: String,
}

impl SplitInput {
    /// Part `part`'s events in key order with their run, checked (R4); `None` when empty.
    pub(super) async fn part(&self, setup: &FlowSetup, part: usize) -> Result<Option<RecordBatch>> {
        read_part(setup, &self.spilled, part, self.run, &self.place).await
    }

    /// The bytes the parts take on local disk.
    pub(super) fn bytes(&self) -> u64 {
        self.spilled.bytes
    }
}

/// Reads the input of `bulk` (the flow's events, `bulk.expected` of them by the log's
/// statistics) and splits it into as many parts of whole keys as the memory limit needs for
/// `in_memory` events (the input's, and any a part holds beside them).
pub(super) async fn split_input(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    bulk: &Bulk<'_>,
    in_memory: u64,
) -> Result<SplitInput> {
    let flow = &setup.flow;
    let parts = part_count(in_memory, scope.memory)
        .map_err(|e| e.within(|| format!("flow {}", flow.name)))?;
    let ctx = crate::storage::session::file_session();
    let (sql, run) = register_input(&ctx, setup, &bulk.from).await?;
    let place = match &bulk.from {
        Input::Source { from, .. } => format!(
            "the rows of {} added after version {}",
            flow.source,
            from.map_or("(start)".to_string(), |v| v.to_string())
        ),
        Input::Store { .. } => format!("the event store of {}", flow.target),
    };
    let split_schema = match &bulk.from {
        Input::Source { .. } => without_run(setup),
        Input::Store { .. } => setup.event_schema.clone(),
    };
    let dir = SpillDir::new()?;
    let flush_bytes = (scope.memory / SPLIT_BUFFER_SHARE) as usize
        / (parts * crate::util::threads::parallelism()).max(1);
    let spilled = split_events(
        scope,
        setup,
        &ctx,
        &sql,
        &dir,
        SplitShape {
            parts,
            schema: split_schema,
            flush_bytes,
            expected: bulk.expected,
        },
    )
    .await?;
    Ok(SplitInput {
        _dir: dir,
        spilled,
        parts,
        run,
        place,
    })
}

/// What a bulk load wrote, to commit: the event store's files (none when rebuilding from
/// it) and the target's.
pub(super) struct Written<'a> {
    pub(super) store: Option<(&'a DeltaTable, Vec<deltalake::kernel::Add>)>,
    pub(super) target: &'a DeltaTable,
    pub(super) target_adds: Vec<deltalake::kernel::Add>,
    /// The events folded.
    pub(super) events: usize,
    /// When the load started (ms since the epoch): recorded with the store's commit for
    /// the tombstones' clock.
    pub(super) decided_at: i64,
}

/// The bulk load's two commits: the event store's (with the source position), then the
/// target's (with the store version and the source position).
pub(super) async fn commit_bulk(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    bulk: &Bulk<'_>,
    written: Written<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let flow = &setup.flow;
    report.keys_changed = report.keys_touched;
    let store_version = match written.store {
        Some((store, adds)) => {
            report.events = written.events;
            let commit = PendingCommit::of_run(scope.run_id)
                .at(AppId::Flow(&flow.name), bulk.source_version)
                .with_info(
                    tombstones::DECIDED_AT,
                    serde_json::json!(written.decided_at),
                );
            crate::storage::write::append(store, Vec::new(), adds, &commit)
                .await
                .map_err(|e| e.within(|| format!("flow {}: committing events", flow.name)))?
        }
        None => {
            report.recovered = true;
            bulk.store_version
        }
    };
    let commit = PendingCommit::of_run(scope.run_id)
        .at(AppId::Events, store_version)
        .at(AppId::Flow(&flow.name), bulk.source_version);
    crate::storage::write::append(written.target, Vec::new(), written.target_adds, &commit)
        .await
        .map_err(|e| e.within(|| format!("flow {}: writing {}", flow.name, flow.target)))?;
    Ok(())
}

/// What folding one part of a bulk load gave.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct PartOutcome {
    pub(crate) events: usize,
    pub(crate) rows: usize,
    pub(crate) keys: usize,
    pub(crate) counts: crate::semantics::compare::Counts,
    /// A batch into a target with rows: the keys whose rows changed, and the old rows that
    /// go (a first load has none).
    #[serde(default)]
    pub(crate) keys_changed: usize,
    #[serde(default)]
    pub(crate) rows_deleted: usize,
    /// A batch into an SCD type 1 target: the expired tombstones forgotten.
    #[serde(default)]
    pub(crate) tombstones_forgotten: usize,
}

impl PartOutcome {
    pub(crate) fn add_to(&self, report: &mut FlowReport) {
        report.count(&self.counts);
        report.rows_inserted += self.rows;
        report.keys_touched += self.keys;
        report.keys_changed += self.keys_changed;
        report.rows_deleted += self.rows_deleted;
    }
}

/// One part's events (whole keys, in key order, checked) written to the event store's
/// files (unless rebuilding from it), folded, and the folded rows written to the target's.
pub(crate) async fn write_part(
    setup: &FlowSetup,
    events: RecordBatch,
    store_files: Option<&mut FileStream>,
    target_files: &mut FileStream,
) -> Result<PartOutcome> {
    let n_events = events.num_rows();
    if let Some(files) = store_files {
        write_sliced(files, &events).await?;
    }
    let (rows, keys) = fold_part(setup, events).await?;
    let outcome = PartOutcome {
        events: n_events,
        rows: rows.num_rows(),
        keys,
        counts: count_first_rows(setup, rows.num_rows()),
        ..Default::default()
    };
    write_sliced(target_files, &rows).await?;
    Ok(outcome)
}

/// The parts a load of `expected` events is split into within `memory`: at least 3 when
/// `STRATA_STREAM_MIN_ROWS` sends small loads here (so that tests split them too).
fn part_count(expected: u64, memory: u64) -> Result<usize> {
    let parts = crate::util::spill::parts_for(expected, EVENT_BYTES_IN_MEMORY, memory)?;
    Ok(match min_rows_override() {
        Some(_) => parts.max(3),
        None => parts,
    })
}

/// How the events are split.
struct SplitShape {
    parts: usize,
    schema: SchemaRef,
    /// A part's buffer is written out once it holds this many bytes.
    flush_bytes: usize,
    /// The events the input holds (for progress).
    expected: u64,
}

/// Runs the query `sql` of `ctx` (the flow's events) and splits its rows into parts on local
/// disk in `dir`, one splitter per output stream of the query (on the blocking pool).
async fn split_events(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    ctx: &deltalake::datafusion::prelude::SessionContext,
    sql: &str,
    dir: &SpillDir,
    shape: SplitShape,
) -> Result<Spilled> {
    let what = || {
        format!(
            "flow {}: reading the events of the bulk load",
            setup.flow.name
        )
    };
    let plan = ctx
        .sql(sql)
        .await
        .context(what)?
        .create_physical_plan()
        .await
        .context(what)?;
    let streams =
        deltalake::datafusion::physical_plan::execute_stream_partitioned(plan, ctx.task_ctx())
            .context(what)?;
    let read = Arc::new(AtomicUsize::new(0));
    let handle = tokio::runtime::Handle::current();
    let mut splitters = Vec::new();
    for (input, mut stream) in streams.into_iter().enumerate() {
        let mut spiller = Spiller::new(
            dir,
            input,
            shape.parts,
            setup.spec.keys.clone(),
            shape.schema.clone(),
            shape.flush_bytes,
        );
        let (schema, read, handle, flow) = (
            shape.schema.clone(),
            read.clone(),
            handle.clone(),
            setup.flow.name.clone(),
        );
        splitters.push(tokio::task::spawn_blocking(move || {
            while let Some(batch) = handle.block_on(stream.next()) {
                let batch = batch.map_err(|e| {
                    EngineError::of_query(
                        format!("flow {flow}: reading the events of the bulk load"),
                        e,
                    )
                })?;
                spiller.push(&crate::util::arrow::cast_batch(&batch, &schema)?)?;
                read.fetch_add(batch.num_rows(), Ordering::Relaxed);
            }
            spiller.finish()
        }));
    }
    let mut all = futures::future::try_join_all(splitters);
    let done = loop {
        tokio::select! {
            done = &mut all => break done,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
                (scope.update)(split_progress(read.load(Ordering::Relaxed), shape.expected));
            }
        }
    };
    let mut spilled = Spilled::default();
    for s in done.map_err(|e| EngineError::internal(format!("{}: {e}", what())))? {
        spilled = spilled.merge(s?);
    }
    Ok(spilled)
}

/// Part `part` of `split` as one batch of events in key order with their run (`run`, when
/// new), checked (R4); `None` when the part is empty.
async fn read_part(
    setup: &FlowSetup,
    split: &Spilled,
    part: usize,
    run: Option<i64>,
    place: &str,
) -> Result<Option<RecordBatch>> {
    if split.rows.get(part).is_none_or(|&r| r == 0) {
        return Ok(None);
    }
    let files = split.files[part].clone();
    let (setup, place) = (setup.clone(), place.to_string());
    off_scheduler("reading a part of the bulk load", move || {
        let batches = crate::util::spill::read_part(&files)?;
        order_part(&setup, batches, run, &place).map(Some)
    })
    .await
}

/// A part's events `batches` (whole keys) checked (R4) and in key order, with their run
/// (`run`, when new). CPU work: callers run it off the scheduler.
pub(crate) fn order_part(
    setup: &FlowSetup,
    batches: Vec<RecordBatch>,
    run: Option<i64>,
    place: &str,
) -> Result<RecordBatch> {
    validate_events(setup, &batches, place)?;
    match run {
        // New events: with one integer-like key, `with_run` puts them in key order itself.
        Some(run) => match single_integer_like_key(setup) {
            true => with_run(setup, batches, run),
            false => with_run(setup, vec![in_key_order(setup, batches, false)?], run),
        },
        None => in_key_order(setup, batches, true),
    }
}

/// Whether the flow has one key column, of a type `with_run` orders by itself (checked
/// events hold no NULL key).
fn single_integer_like_key(setup: &FlowSetup) -> bool {
    match setup.spec.keys.as_slice() {
        [key] => crate::util::arrow::integer_like(setup.event_schema.field(*key).data_type()),
        _ => false,
    }
}

/// `batches` as one batch sorted by key, then sequence (where it sorts), then run (`by_run`:
/// stored events).
fn in_key_order(setup: &FlowSetup, batches: Vec<RecordBatch>, by_run: bool) -> Result<RecordBatch> {
    use deltalake::arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn};
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .unwrap_or_else(|| without_run(setup));
    let all = deltalake::arrow::compute::concat_batches(&schema, &batches)
        .context(|| "gathering a part's events".into())?;
    drop(batches);
    let mut columns: Vec<usize> = setup.spec.keys.clone();
    let seq = setup.spec.n_out;
    if !matches!(all.column(seq).data_type(), DataType::Struct(_)) {
        columns.push(seq);
    }
    if by_run {
        columns.push(
            all.schema()
                .index_of(RUN_COL)
                .context(|| "the run column".into())?,
        );
    }
    let sort: Vec<SortColumn> = columns
        .iter()
        .map(|&c| SortColumn {
            values: all.column(c).clone(),
            options: None,
        })
        .collect();
    let order = lexsort_to_indices(&sort, None).context(|| "sorting a part's events".into())?;
    take_record_batch(&all, &order).context(|| "sorting a part's events".into())
}

/// `batch` handed to `files` in slices of [`WRITE_ROWS`], so that every writer encodes.
pub(crate) async fn write_sliced(files: &mut FileStream, batch: &RecordBatch) -> Result<()> {
    let mut offset = 0;
    while offset < batch.num_rows() {
        let len = WRITE_ROWS.min(batch.num_rows() - offset);
        files.write(batch.slice(offset, len)).await?;
        offset += len;
    }
    Ok(())
}

/// Registers the bulk load's input in `ctx` and returns the query of its events and the run
/// number new events are stored under (`None` when rebuilding from the store).
async fn register_input(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    setup: &FlowSetup,
    from: &Input<'_>,
) -> Result<(String, Option<i64>)> {
    match from {
        Input::Source {
            source,
            changes,
            from,
            run,
            ..
        } => {
            crate::storage::changes::register_new_rows(
                ctx,
                strata_sql::SOURCE_PLACEHOLDER,
                source,
                *from,
                crate::storage::table::version_of(source),
                changes,
            )
            .await?;
            Ok((setup.select_sql.clone(), Some(*run)))
        }
        Input::Store { store } => {
            crate::storage::session::register_table(ctx, "__strata_events", store, None).await?;
            Ok(("SELECT * FROM __strata_events".to_string(), None))
        }
    }
}

/// One part's events folded into its target rows and checked (`target::fold_checked`), on
/// a blocking thread; with the number of keys.
async fn fold_part(setup: &FlowSetup, events: RecordBatch) -> Result<(RecordBatch, usize)> {
    let setup = setup.clone();
    off_scheduler("the fold", move || {
        super::target::fold_checked(&setup, events)
    })
    .await
}

/// The progress line while the events are split: `done` of `total` read.
fn split_progress(done: usize, total: u64) -> String {
    match total {
        0 => format!("bulk load: split {done} event(s) into parts"),
        t => format!(
            "bulk load: split {done} of {t} event(s) into parts ({}%)",
            (done as u64 * 100 / t).min(100)
        ),
    }
}

/// The progress line of a bulk load: `done` of `total` events folded in `elapsed`, with an
/// estimate of the time left at the rate so far (once there is a rate to go by).
pub(super) fn progress(done: usize, total: u64, elapsed: std::time::Duration) -> String {
    if total == 0 {
        return format!("bulk load: folded {done} event(s)");
    }
    let done = (done as u64).min(total);
    let share = format!(
        "bulk load: folded {done} of {total} event(s) ({}%)",
        done * 100 / total
    );
    let secs = elapsed.as_secs_f64();
    if done == 0 || done == total || secs < 1.0 {
        return share;
    }
    let left = secs * (total - done) as f64 / done as f64;
    format!("{share}, about {} left", show_secs(left))
}

/// `secs` rounded for a person: `40 s`, `3 min`, `1 h 20 min`.
fn show_secs(secs: f64) -> String {
    let secs = secs.round() as u64;
    match secs {
        0..=89 => format!("{} s", secs.max(1)),
        90..=5399 => format!("{} min", (secs + 30) / 60),
        _ => format!("{} h {} min", secs / 3600, (secs % 3600 + 30) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_says_how_far_and_what_is_left() {
        let f = "bulk load: folded";
        for (done, total, secs, line) in [
            (250, 1000, 0, format!("{f} 250 of 1000 event(s) (25%)")),
            // A quarter in 20 s: three quarters left at that rate.
            (
                250,
                1000,
                20,
                format!("{f} 250 of 1000 event(s) (25%), about 60 s left"),
            ),
            (
                100,
                1000,
                600,
                format!("{f} 100 of 1000 event(s) (10%), about 1 h 30 min left"),
            ),
            (1000, 1000, 20, format!("{f} 1000 of 1000 event(s) (100%)")),
            // More events than the log's statistics said: never past 100%.
            (1200, 1000, 20, format!("{f} 1000 of 1000 event(s) (100%)")),
            (5, 0, 3, format!("{f} 5 event(s)")),
        ] {
            let elapsed = std::time::Duration::from_secs(secs);
            assert_eq!(progress(done, total, elapsed), line);
        }
        assert_eq!(show_secs(95.0), "2 min");
        assert_eq!(
            split_progress(5, 10),
            "bulk load: split 5 of 10 event(s) into parts (50%)"
        );
    }
}
