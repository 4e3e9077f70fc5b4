//! A flow's bulk load in bounded memory: the first run into an empty target of more events
//! than fit in the run's memory limit, or the rebuild of an empty target from its event
//! store after a bulk load was killed between its two commits.
//!
//! ```text
//!  source rows ─▶ events (the flow's SELECT) ─▶ ORDER BY key, sequence ─▶ chunks cut between
//!  (the store's     (each chunk checked: R4)     (DataFusion, spilling     keys (util/chunks.rs)
//!   events, when                                  to disk past the limit)        │
//!   rebuilding)                                                                  ▼
//!       event store files ◀── each chunk's events, once, in key order ◀── fold (strata-core)
//!       target files      ◀── each chunk's folded rows, checked ◀─────────────────┘
//!  then: one event-store commit (with the source position), one target commit (with it)
//! ```
//!
//! Every event is sorted once and written once to the store; the target gets the folded
//! versions of the same pass. Memory holds the sort's budget, one chunk and the writers'
//! row groups, whatever the number of events. Files written before a failure are in no
//! commit (a vacuum removes them); a run killed after the store commit leaves an empty
//! target, which the next run rebuilds from the store the same way.

use crate::error::{Context, EngineError, Result};
use crate::eventstore::tombstones;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::compare::count_first_rows;
use crate::semantics::events::{validate_events, with_run, without_run};
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::{RUN_COL, SEQ_COL};
use crate::storage::commit::{AppId, PendingCommit};
use crate::storage::location::Location;
use crate::storage::write::FileStream;
use crate::util::chunks::KeyChunks;
use crate::util::memory::show_size;
use crate::util::sql::quote_ident;
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::DataType;
use deltalake::DeltaTable;
use futures::StreamExt;
use std::collections::BTreeMap;

/// Events per chunk folded at once: enough for the fold's threads, small next to the
/// memory limit.
const CHUNK_EVENTS: usize = 1 << 20;

/// Bytes an event takes in the in-memory path, all copies counted (the hand-off, the
/// concatenated events, the fold's indices and its output): the 10M-event benchmark peaks
/// at about 1.5-1.8 GiB. A load whose events would take more than the limit streams.
const EVENT_BYTES_IN_MEMORY: u64 = 200;

/// The share of the memory limit the sort may hold before it spills; the rest is for the
/// chunk being folded, the writers' row groups and the reads.
const SORT_SHARE: u64 = 2;

/// The sort memory below which one sorter sorts every event.
const PARALLEL_SORT_MIN_MEMORY: usize = 256 << 20;

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

/// The events of the files `live` of `source` (by the Delta log's statistics) when a load of
/// them streams: more than the run's memory limit holds in memory (`STRATA_STREAM_MIN_ROWS`
/// sets the row count instead; the golden scenarios' parallel mode sets it to 1, so every
/// first load takes this path there); `None` when they are folded in memory.
pub(super) fn streamed_events(
    scope: &Scope<'_>,
    source: &DeltaTable,
    live: &[String],
) -> Option<u64> {
    let rows = estimated_rows(source, live)?;
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
fn estimated_rows(source: &DeltaTable, live: &[String]) -> Option<u64> {
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
    // Events an ingestion of this run kept for the flow are let go: the sort reads the files.
    drop(
        scope
            .handoff
            .take(&flow.source, &flow.name, None, bulk.source_version),
    );
    let sort_memory = (scope.memory / SORT_SHARE) as usize;
    // A sorter per core, merged at the end; in a small budget one sorter keeps it all (the
    // merge of several takes memory the sorters cannot give back).
    let sorters = match sort_memory < PARALLEL_SORT_MIN_MEMORY {
        true => 1,
        false => crate::util::threads::parallelism(),
    };
    let ctx = crate::storage::session::spilling_session(sort_memory, sorters)?;
    let (sql, run) = register_input(&ctx, setup, &bulk.from).await?;
    let place = match &bulk.from {
        Input::Source { from, .. } => format!(
            "the rows of {} added after version {}",
            flow.source,
            from.map_or("(start)".to_string(), |v| v.to_string())
        ),
        Input::Store { .. } => format!("the event store of {}", flow.target),
    };
    let store = match &bulk.from {
        Input::Source { store: Some(s), .. } => Some(s.clone()),
        Input::Source { store: None, .. } => Some(
            crate::eventstore::pages::create_store(bulk.store_path, &setup.event_schema).await?,
        ),
        Input::Store { .. } => None,
    };
    let target = match bulk.target {
        Some(t) => t,
        None => super::target::create_target(scope, setup, target_properties).await?,
    };
    let plan = ctx
        .sql(&sql)
        .await
        .context(|| format!("flow {}: planning the bulk sort", flow.name))?
        .create_physical_plan()
        .await
        .context(|| format!("flow {}: planning the bulk sort", flow.name))?;
    let mut stream =
        deltalake::datafusion::physical_plan::execute_stream(plan.clone(), ctx.task_ctx())
            .map_err(|e| sort_error(setup, scope.memory, e))?;
    let mut store_files = store.as_ref().map(FileStream::start).transpose()?;
    let mut target_files = FileStream::start(&target)?;
    let sorted_schema = match &bulk.from {
        Input::Source { .. } => without_run(setup),
        Input::Store { .. } => setup.event_schema.clone(),
    };
    let mut chunks = KeyChunks::new(sorted_schema.clone(), setup.spec.keys.clone(), CHUNK_EVENTS);
    let mut folded_events = 0usize;
    let decided_at = chrono::Utc::now().timestamp_millis();
    loop {
        let next = stream.next().await;
        let ready = match &next {
            Some(batch) => {
                let batch = batch
                    .as_ref()
                    .map_err(|e| sort_error(setup, scope.memory, e.to_string()))?;
                chunks.push(crate::util::arrow::cast_batch(batch, &sorted_schema)?)?
            }
            None => chunks.finish()?,
        };
        for chunk in ready {
            validate_events(setup, std::slice::from_ref(&chunk), &place)?;
            let events = match run {
                Some(run) => with_run(setup, vec![chunk], run)?,
                None => chunk,
            };
            folded_events += events.num_rows();
            if let Some(files) = &mut store_files {
                files.write(events.clone()).await?;
            }
            let rows = fold_chunk(setup, events).await?;
            report.count(&count_first_rows(setup, &rows.0));
            report.rows_inserted += rows.0.num_rows();
            report.keys_touched += rows.1;
            target_files.write(rows.0).await?;
            (scope.update)(progress(folded_events, bulk.expected));
        }
        if next.is_none() {
            break;
        }
    }
    report.keys_changed = report.keys_touched;
    let (spills, spilled) = spilled(&plan);
    report.notes.push(format!(
        "bulk load: {folded_events} event(s) sorted within {} of memory{}",
        show_size(sort_memory as u64),
        match spills {
            0 => String::new(),
            n => format!(
                ", {n} sorted run(s) ({}) spilled to disk",
                show_size(spilled as u64)
            ),
        }
    ));
    let store_version = match (&store, store_files) {
        (Some(store), Some(files)) => {
            report.events = folded_events;
            let adds = files.finish().await?;
            let commit = PendingCommit::of_run(scope.run_id)
                .at(AppId::Flow(&flow.name), bulk.source_version)
                .with_info(tombstones::DECIDED_AT, serde_json::json!(decided_at));
            crate::storage::write::append(store, Vec::new(), adds, &commit)
                .await
                .map_err(|e| e.within(|| format!("flow {}: committing events", flow.name)))?
        }
        _ => {
            report.recovered = true;
            bulk.store_version
        }
    };
    let adds = target_files.finish().await?;
    let commit = PendingCommit::of_run(scope.run_id)
        .at(AppId::Events, store_version)
        .at(AppId::Flow(&flow.name), bulk.source_version);
    crate::storage::write::append(&target, Vec::new(), adds, &commit)
        .await
        .map_err(|e| e.within(|| format!("flow {}: writing {}", flow.name, flow.target)))?;
    Ok(())
}

/// Registers the bulk load's input in `ctx` and returns the sorting query and the run number
/// new events are stored under (`None` when rebuilding from the store).
async fn register_input(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    setup: &FlowSetup,
    from: &Input<'_>,
) -> Result<(String, Option<i64>)> {
    let mut order: Vec<String> = setup.key_names.iter().map(|k| quote_ident(k)).collect();
    let seq_sortable = !matches!(
        setup.event_schema.field(setup.spec.n_out).data_type(),
        DataType::Struct(_)
    );
    if seq_sortable {
        order.push(quote_ident(SEQ_COL));
    }
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
            let sql = format!(
                "SELECT * FROM ({}) AS __strata_new ORDER BY {}",
                setup.select_sql,
                order.join(", ")
            );
            Ok((sql, Some(*run)))
        }
        Input::Store { store } => {
            crate::storage::session::register_table(ctx, "__strata_events", store, None).await?;
            order.push(quote_ident(RUN_COL));
            let sql = format!(
                "SELECT * FROM __strata_events ORDER BY {}",
                order.join(", ")
            );
            Ok((sql, None))
        }
    }
}

/// One chunk's events folded into its target rows and checked (`target::fold_checked`), on
/// a blocking thread; with the number of keys.
async fn fold_chunk(setup: &FlowSetup, events: RecordBatch) -> Result<(RecordBatch, usize)> {
    let setup = setup.clone();
    off_scheduler("the fold", move || {
        super::target::fold_checked(&setup, events)
    })
    .await
}

/// How many sorted runs the sort of `plan` spilled to disk, and their bytes.
fn spilled(
    plan: &std::sync::Arc<dyn deltalake::datafusion::physical_plan::ExecutionPlan>,
) -> (usize, usize) {
    let own = plan.metrics().map_or((0, 0), |m| {
        (m.spill_count().unwrap_or(0), m.spilled_bytes().unwrap_or(0))
    });
    plan.children().into_iter().fold(own, |(n, b), child| {
        let (cn, cb) = spilled(child);
        (n + cn, b + cb)
    })
}

/// The progress line of a bulk load: `done` of `total` events folded.
fn progress(done: usize, total: u64) -> String {
    match total {
        0 => format!("bulk load: folded {done} event(s)"),
        t => format!(
            "bulk load: folded {done} of {t} event(s) ({}%)",
            (done as u64 * 100 / t).min(100)
        ),
    }
}

/// A failure of the sort: one that ran out of its memory says which limit to raise.
fn sort_error(setup: &FlowSetup, memory: u64, e: impl std::fmt::Display) -> EngineError {
    sort_error_of(&setup.flow.name, memory, &e.to_string())
}

#[cfg(test)]
fn sort_error_text(flow: &str, memory: u64, text: &str) -> String {
    sort_error_of(flow, memory, text).to_string()
}

fn sort_error_of(flow: &str, memory: u64, text: &str) -> EngineError {
    if let Some(exhausted) = text
        .lines()
        .find(|l| l.contains("Resources exhausted"))
        .map(str::trim)
    {
        // DataFusion's own advice names its settings, not strata's.
        let text = exhausted;
        return EngineError::BadInput(format!(
            "flow {flow}: the memory limit ({}) is too small to sort its events ({text}); raise \
             it with --memory-limit or {}; nothing was committed",
            show_size(memory),
            crate::util::memory::CONFIG_KEY
        ));
    }
    EngineError::Internal(format!(
        "flow {flow}: sorting the events of the bulk load: {text}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_says_how_far_and_what_is_left() {
        assert_eq!(
            progress(250, 1000),
            "bulk load: folded 250 of 1000 event(s) (25%)"
        );
        assert_eq!(progress(5, 0), "bulk load: folded 5 event(s)");
    }

    /// DataFusion's "not enough memory" (whose advice names its own settings) becomes
    /// strata's error naming the limit and how to raise it.
    #[test]
    fn a_sort_out_of_memory_names_the_limit_to_raise() {
        let df = "Not enough memory to continue external sort. Consider increasing the memory \
                  limit config: 'datafusion.runtime.memory_limit'.\ncaused by\nResources \
                  exhausted: Failed to allocate additional 1024.0 KB for ExternalSorterMerge[0]";
        let e = sort_error_text("f", 16 << 20, df);
        assert!(
            e.starts_with("flow f: the memory limit (16 MiB) is too small"),
            "{e}"
        );
        assert!(e.contains("Resources exhausted: Failed to allocate"), "{e}");
        assert!(
            e.contains("--memory-limit") && !e.contains("datafusion.runtime"),
            "{e}"
        );
        let other = sort_error_text("f", 16 << 20, "No such file");
        assert!(other.contains("sorting the events of the bulk load: No such file"));
    }
}
