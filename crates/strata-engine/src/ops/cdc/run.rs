//! One run of one AUTO CDC flow, as named phases with a type between each:
//!
//! ```text
//!  open_positions ─▶ take_input ─▶ read_stored ─▶ fold ─▶ commit_events ─▶ write_target
//!  (where source,     (new events,   (the touched   (strata-  (events + the      (the changed
//!   event store and    an interrupted  keys' stored   core, on  source position,  keys' rows,
//!   target stand)      run's keys)     events)        a worker) first)            target.rs)
//! ```
//!
//! The events are committed before the target: from then on they are never lost, and a run
//! that dies before the target commit is completed by the next one (`take_input` finds the
//! event store ahead of the target and derives the keys of its commits again).
//!
//! Two kinds of run leave these phases at the start: a first load too large for memory (or
//! sent to a cluster) is a bulk load (`bulk.rs`, `cluster/`), and so is, into a target with
//! rows, a batch too large for memory (`large_batch.rs`, `cluster/batch.rs`).

use super::snapshot::{self, SnapshotEvents};
use super::target::{self, TargetWrite};
use crate::error::{Context, Result};
use crate::eventstore::digest::{self, Digest};
use crate::eventstore::evaluate::evaluate_events;
use crate::eventstore::read::{collect_sql, read_slice, read_touched_by_pages};
use crate::eventstore::tombstones;
use crate::ops::cdc::evolve::{evolve_tables, follow_deletion_vectors};
use crate::ops::cdc::setup::deletion_vectors_by_default;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::events::{merge_touched, touched_keys, validate_events, with_run, Touched};
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::{OP_COL, RUN_COL, SEQ_COL};
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::location::Location;
use crate::storage::session::register_table;
use crate::storage::table::version_of;
use crate::util::sql::quote_ident;
use crate::util::steps::{step, Steps};
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::collections::BTreeMap;
use strata_sql::ScdType;

/// Runs `setup` once over all source rows it has not seen, after bringing an existing
/// target in line with the flow: its deletion-vector setting, and the columns the flow
/// newly produces (added to the event store and the target).
pub(crate) async fn run_flow(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
) -> Result<FlowReport> {
    let wh = scope.wh;
    let (target, switched) = match wh.open_table(&setup.flow.target).await? {
        Some(t) => {
            let (t, switched) = follow_deletion_vectors(t, setup, target_properties).await?;
            (Some(t), switched)
        }
        None => (None, None),
    };
    let created = target.is_none();
    let evolved = evolve_tables(wh, setup, target).await?;
    let added = evolved.added;
    let opened = (evolved.store, evolved.target);
    let mut report = run_flow_once(scope, setup, target_properties, opened).await?;
    let gc_set = crate::storage::table::sets_property(target_properties, tombstones::PROPERTY);
    if gc_set && setup.tombstone_secs.is_none() {
        report.notes.push(format!(
            "{} is not acted on for {}: its deletes end versions of its history and are \
             kept, so a late event older than a delete never brings its key back",
            tombstones::PROPERTY,
            setup.flow.target
        ));
    }
    if created
        && deletion_vectors_by_default(setup, target_properties)
        && wh.open_table(&setup.flow.target).await?.is_some()
    {
        report.notes.push(format!(
            "created {} with deletion vectors (for deltalake for Python's \
             to_pyarrow_table(), set '{}' = 'false')",
            setup.flow.target,
            crate::storage::dv::PROPERTY
        ));
    }
    if let Some(on) = switched {
        report.notes.push(format!(
            "deletion vectors {} on {} (delta.enableDeletionVectors = {on})",
            if on { "enabled" } else { "disabled" },
            setup.flow.target
        ));
    }
    if !added.is_empty() {
        report.notes.push(format!(
            "added column(s) {} to {}; rows written before read NULL in them",
            added.join(", "),
            setup.flow.target
        ));
    }
    Ok(report)
}

/// The phases of one run (see the module docs), from the event store and target as
/// `opened` (by `run_flow`, which brought them in line with the flow).
async fn run_flow_once(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    opened: (Option<DeltaTable>, Option<DeltaTable>),
) -> Result<FlowReport> {
    if setup.flow.stored_as == ScdType::Snapshots {
        return super::snapshots_mode::run_snapshots_mode(scope, setup, target_properties).await;
    }
    let mut report = FlowReport::of(&setup.flow.name);
    let Some(pos) = open_positions(scope, setup, opened).await? else {
        report.skipped = Some(format!("source {} has no data yet", setup.flow.source));
        return Ok(report);
    };
    if let Some(bulk) = bulk_load(scope, setup, &pos).await? {
        report.source_versions = Some((pos.from, pos.source_version));
        match super::cluster::placement(scope, &bulk) {
            Ok(cluster) => {
                super::cluster::run_on_cluster(
                    scope,
                    cluster,
                    setup,
                    target_properties,
                    bulk,
                    &mut report,
                )
                .await?
            }
            Err(local) => {
                report.notes.extend(local);
                super::bulk::run_bulk(scope, setup, target_properties, bulk, &mut report).await?
            }
        }
        return Ok(report);
    }
    if let Some(batch) = large_batch(scope, setup, &pos, &mut report)? {
        report.source_versions = Some((pos.from, pos.source_version));
        match super::cluster::placement(scope, &batch) {
            Ok(cluster) => {
                super::cluster::run_batch_on_cluster(scope, cluster, setup, batch, &mut report)
                    .await?
            }
            Err(local) => {
                report.notes.extend(local);
                super::large_batch::run_large_batch(scope, setup, batch, &mut report).await?
            }
        }
        return Ok(report);
    }
    let steps = Steps::new(&setup.flow.name, "");
    let ctx = crate::storage::session::new_session();
    let Some(input) = take_input(scope, setup, &pos, &ctx, &mut report).await? else {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    };
    step!(debug, steps, "collected the touched keys");
    let stored = read_stored(&ctx, setup, &pos, &input, &mut report).await?;
    step!(
        info,
        steps,
        "read new events and the stored events of the touched keys"
    );
    (scope.update)(format!(
        "{} new event(s), folding {} event(s)",
        report.events,
        stored.as_ref().map_or(0, RecordBatch::num_rows)
            + input
                .events
                .iter()
                .flatten()
                .map(RecordBatch::num_rows)
                .sum::<usize>()
    ));
    // The target rows before the run, when the target reflects every stored event (no
    // interrupted run to complete): the fold of the touched keys' stored events, so the
    // target need not be read to find out what changes. (For a snapshot flow, the run's
    // deliveries must supersede nothing stored: new versions only.)
    let stored_only = (pos.target_in_step()
        && !report.recovered
        && (!setup.is_snapshot() || input.superseded.is_none())
        && matches!(input.touched, Touched::Keys(_)))
    .then(|| stored.clone())
    .flatten();
    // Three independent pieces of work side by side: the fold, the rows before the run,
    // and the new events' files (written, not committed: a fold that fails commits
    // nothing).
    let first = stored.is_none() && input.one_per_key;
    let (folded, current, staged) = tokio::join!(
        fold_or_first_rows(setup, stored, &input),
        rows_before(setup, stored_only),
        stage_events(setup, &pos, &input),
    );
    let staged = staged?;
    let (folded, current) = match (folded, current) {
        (Ok(folded), Ok(current)) => (folded, current),
        (Err(e), _) | (_, Err(e)) => {
            remove_staged(&pos.store_path, staged).await;
            return Err(e);
        }
    };
    let what = match first {
        true => "made the first rows and wrote the events",
        false => "folded and checked the SCD2 integrity, wrote the events",
    };
    step!(info, steps, what);
    if matches!(input.touched, Touched::All) {
        report.keys_touched = folded.keys;
    }
    let store_version = commit_events(scope, setup, &pos, &input, staged).await?;
    step!(info, steps, "committed the events");
    // Written on a thread of its own while the target is written; joined when the run ends.
    let _digest_writer = input.state_digest.and_then(|d| {
        let dir = digest::dir_for(&pos.store_path)?;
        snapshot::write_digest(setup, dir, store_version, d)
    });
    let write = TargetWrite {
        rows: folded.rows,
        current,
        touched: &input.touched,
        commit: PendingCommit::of_run(scope.run_id)
            .at(AppId::Events, store_version)
            .at(AppId::Flow(&setup.flow.name), pos.source_version),
    };
    target::write_target(
        scope,
        setup,
        target_properties,
        pos.target,
        &ctx,
        write,
        &mut report,
    )
    .await?;
    Ok(report)
}

/// The bulk load this run is (`bulk.rs`), if it is one: a change-event flow without a
/// truncate rule, reading an append-only source, into a target without rows, either on
/// its first run with more events than the memory limit holds, or after a bulk load was
/// killed between its commits (every event stored, none in the target, nothing new).
async fn bulk_load<'a>(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &'a Positions,
) -> Result<Option<super::bulk::Bulk<'a>>> {
    use super::bulk::{Bulk, Input};
    if setup.is_snapshot() || setup.source_feed || setup.flow.truncate_when.is_some() {
        return Ok(None);
    }
    let target_empty = match &pos.target {
        Some(t) => crate::storage::table::table_files(t)?.is_empty(),
        None => true,
    };
    if !target_empty {
        return Ok(None);
    }
    let store_files = match &pos.store {
        Some(s) => crate::storage::table::table_files(s)?,
        None => Default::default(),
    };
    let (input, expected) = match (&pos.changes, &pos.store, store_files.is_empty()) {
        (Some(changes), _, true) if pos.from.is_none() && pos.has_new_input() => {
            let Some(events) = changes
                .rewritten
                .is_empty()
                .then(|| super::bulk::streamed_events(scope, &pos.source, &changes.live))
                .flatten()
            else {
                return Ok(None);
            };
            let input = Input::Source {
                source: &pos.source,
                changes,
                from: pos.from,
                store: pos.store.clone(),
                run: pos.run(),
            };
            (input, events)
        }
        (_, Some(store), false)
            if !pos.has_new_input()
                && pos.applied < pos.store_version
                && setup.tombstone_secs.is_none() =>
        {
            let live: Vec<String> = store_files.into_iter().collect();
            let Some(events) = super::bulk::streamed_events(scope, store, &live) else {
                return Ok(None);
            };
            (Input::Store { store }, events)
        }
        _ => return Ok(None),
    };
    Ok(Some(Bulk {
        from: input,
        expected,
        store_path: &pos.store_path,
        source_version: pos.source_version,
        store_version: pos.store_version,
        target: pos.target.clone(),
    }))
}

/// The large batch this run is (`large_batch.rs`), if it is one: a change-event flow
/// without a truncate rule, reading only rows appended to its source, into a target that
/// reflects every stored event (no interrupted run to complete) and whose rows can be
/// replaced by files written part by part, with more new events than the memory limit holds
/// or at least the run's cluster's `--cluster-min-events`. `None` when the batch folds in
/// memory (the run's notes say why when it would otherwise have streamed).
fn large_batch<'a>(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &'a Positions,
    report: &mut FlowReport,
) -> Result<Option<super::bulk::Bulk<'a>>> {
    use super::bulk::{Bulk, Input};
    if setup.is_snapshot()
        || setup.source_feed
        || setup.table_mode()
        || setup.flow.truncate_when.is_some()
        || !pos.target_in_step()
        || !pos.has_new_input()
    {
        return Ok(None);
    }
    let (Some(changes), Some(_), Some(target)) = (&pos.changes, &pos.store, &pos.target) else {
        return Ok(None);
    };
    if !changes.only_appends || !changes.rewritten.is_empty() {
        return Ok(None);
    }
    let Some(expected) = super::bulk::streamed_events(scope, &pos.source, &changes.live) else {
        return Ok(None);
    };
    if !crate::storage::replace::replaces_in_place(target)? {
        report.notes.push(format!(
            "{expected} new event(s) folded in memory: {} is partitioned, uses column mapping \
             or has deletion vectors at absolute paths, so its rows are replaced through \
             delta-rs",
            setup.flow.target
        ));
        return Ok(None);
    }
    Ok(Some(Bulk {
        from: Input::Source {
            source: &pos.source,
            changes,
            from: pos.from,
            store: pos.store.clone(),
            run: pos.run(),
        },
        expected,
        store_path: &pos.store_path,
        source_version: pos.source_version,
        store_version: pos.store_version,
        target: Some(target.clone()),
    }))
}

/// Where a flow stands before its run.
struct Positions {
    source: DeltaTable,
    /// The source's version now: this run reads up to it.
    source_version: i64,
    /// The flow's position in its source (recorded in the event store), `None` before its
    /// first run.
    from: Option<i64>,
    store: Option<DeltaTable>,
    store_path: Location,
    /// The event store's version, -1 when there is none.
    store_version: i64,
    target: Option<DeltaTable>,
    /// The event-store version the target reflects, -1 for none.
    applied: i64,
    /// What the source's commits after `from` changed; `None` when it has none.
    changes: Option<crate::storage::changes::Changes>,
    /// The run number this run's events are stored under.
    run: i64,
}

impl Positions {
    /// Source rows were added since the flow last read (upkeep commits add none).
    fn has_new_input(&self) -> bool {
        self.from.is_none_or(|f| f < self.source_version)
            && self.changes.as_ref().is_some_and(|c| !c.only_upkeep)
    }

    /// The target reflects the latest stored version (no earlier run is pending).
    fn target_in_step(&self) -> bool {
        self.store.is_some() && self.store_version == self.applied
    }

    /// The run number this run's events are stored under.
    fn run(&self) -> i64 {
        self.run
    }

    /// How the place of new rows is named in errors.
    fn place(&self, setup: &FlowSetup) -> String {
        format!(
            "the rows of {} added after version {}",
            setup.flow.source,
            self.from.map_or("(start)".to_string(), |v| v.to_string())
        )
    }
}

/// The run number a run's events are stored under: the event store's next version, or 0
/// when the store holds no version with events yet (it is missing, or an earlier run was
/// killed just after creating it), so that a rerun after such a kill stores the events
/// exactly as an uninterrupted first run.
fn run_number(store: Option<&DeltaTable>, store_version: i64) -> Result<i64> {
    Ok(match store {
        Some(s) if store_version == 0 && crate::storage::table::table_files(s)?.is_empty() => 0,
        _ => store_version + 1,
    })
}

/// Opens the flow's source and reads the positions of it, the event store and the target
/// (`opened`); `None` when the source does not exist yet.
async fn open_positions(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    (store, target): (Option<DeltaTable>, Option<DeltaTable>),
) -> Result<Option<Positions>> {
    let wh = scope.wh;
    let flow = &setup.flow;
    let Some(source) = wh.open_table(&flow.source).await? else {
        return Ok(None);
    };
    let store_path = wh.event_store_location(&flow.target);
    let from = match &store {
        Some(s) => position(s, AppId::Flow(&flow.name)).await?,
        None => None,
    };
    let store_version = store.as_ref().map_or(-1, version_of);
    let applied = match &target {
        Some(t) => position(t, AppId::Events).await?.unwrap_or(-1),
        None => -1,
    };
    let applied = match (&store, applied < store_version) {
        (Some(s), true) => in_step_through_upkeep(s, applied).await?,
        _ => applied,
    };
    let source_version = version_of(&source);
    let changes = match from.is_none_or(|f| f < source_version) {
        true => Some(crate::storage::changes::changes_since(&source, from).await?),
        false => None,
    };
    Ok(Some(Positions {
        run: run_number(store.as_ref(), store_version)?,
        changes,
        source_version,
        source,
        from,
        store_version,
        store,
        store_path,
        target,
        applied,
    }))
}

/// The event-store version a target that reflects `applied` reflects: the store's latest
/// when every commit after `applied` is upkeep (a compaction or a vacuum of the store,
/// which change no event), else `applied`.
async fn in_step_through_upkeep(store: &DeltaTable, applied: i64) -> Result<i64> {
    match crate::storage::changes::data_version(store).await? <= applied {
        true => Ok(version_of(store)),
        false => Ok(applied),
    }
}

/// What a run adds to the event store, and the keys whose rows it derives again.
struct Input {
    /// New events to fold (for a snapshot flow: its upserts, deletes and pins), in pieces;
    /// `None` when the run only completes an interrupted one.
    events: Option<Vec<RecordBatch>>,
    /// Every new event upserts a key no other has, and nothing is stored (a first snapshot).
    one_per_key: bool,
    /// What the event store gets: the events, and a snapshot flow's markers.
    to_commit: Option<Vec<RecordBatch>>,
    /// A snapshot flow's markers of the versions this run applies.
    markers: Option<RecordBatch>,
    /// Stored events this run's redeliveries supersede.
    superseded: Option<RecordBatch>,
    /// A snapshot flow's digest of the state after this run (`eventstore/digest.rs`).
    state_digest: Option<Digest>,
    touched: Touched,
    /// The instant this run decides which tombstones have expired, recorded in its
    /// event-store commit as the time its events were processed
    /// (`eventstore/tombstones.rs`).
    decided_at: i64,
}

/// The run's new events and the keys to derive again (those of an interrupted run's
/// event-store commits too), or `None` when there is nothing to do. Registers the event
/// store in `ctx` as `__strata_events`.
async fn take_input(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &Positions,
    ctx: &SessionContext,
    report: &mut FlowReport,
) -> Result<Option<Input>> {
    if let Some(store) = &pos.store {
        register_table(ctx, "__strata_events", store, None).await?;
    }
    let pending = pending_keys(ctx, setup, pos).await?;
    report.recovered = pending.is_some();
    let decided_at = chrono::Utc::now().timestamp_millis();
    let new = match pos.has_new_input() {
        true => Some(new_events(scope, setup, pos, ctx, report).await?),
        false => None,
    };
    let mut touched = pending;
    for keys in new_keys(setup, pos, new.as_ref())? {
        touched = Some(match touched {
            Some(t) => merge_touched(t, keys)?,
            None => keys,
        });
    }
    let Some(touched) = touched else {
        return Ok(None);
    };
    report.keys_touched = count_keys(&touched);
    let Some(new) = new else {
        return Ok(Some(Input {
            events: None,
            one_per_key: false,
            to_commit: None,
            markers: None,
            superseded: None,
            state_digest: None,
            touched,
            decided_at,
        }));
    };
    report.notes.extend(new.notes);
    let (to_commit, markers) = match setup.is_snapshot() {
        true => {
            let mut all = new.events.clone();
            all.push(new.markers.clone());
            (all, Some(new.markers))
        }
        false => (new.events.clone(), None),
    };
    Ok(Some(Input {
        events: Some(new.events),
        one_per_key: new.one_per_key,
        to_commit: Some(to_commit),
        markers,
        superseded: new.superseded,
        state_digest: new.state_digest,
        touched,
        decided_at,
    }))
}

/// The keys the run's new events touch, and those of the stored events its redeliveries
/// supersede. Without an event store there is nothing stored to look up: the first run
/// derives every key it sees, and the target has nothing yet.
fn new_keys(
    setup: &FlowSetup,
    pos: &Positions,
    new: Option<&SnapshotEvents>,
) -> Result<Vec<Touched>> {
    let Some(new) = new else {
        return Ok(Vec::new());
    };
    let mut out = vec![match pos.store.is_some() {
        true => touched_keys(
            setup,
            &concat_batches(&setup.event_schema, &new.events)
                .context(|| "the run's events".into())?,
        )?,
        false => Touched::All,
    }];
    if let Some(old) = &new.superseded {
        out.push(touched_keys(setup, old)?);
    }
    Ok(out)
}

fn count_keys(touched: &Touched) -> usize {
    match touched {
        Touched::All => 0,
        Touched::Keys(k) => k.num_rows(),
    }
}

/// The keys of the event-store commits the target does not reflect yet (a run interrupted
/// between its two commits), `None` when there are none.
async fn pending_keys(
    ctx: &SessionContext,
    setup: &FlowSetup,
    pos: &Positions,
) -> Result<Option<Touched>> {
    if pos.store.is_none() || pos.store_version <= pos.applied {
        return Ok(None);
    }
    let applied = pos.applied;
    let (seq, op, run) = (
        quote_ident(SEQ_COL),
        quote_ident(OP_COL),
        quote_ident(RUN_COL),
    );
    let sql = if setup.is_snapshot() {
        // Also the events that the unapplied runs' deliveries superseded.
        format!(
            "SELECT * FROM __strata_events WHERE {op} < {m} AND ({run} > {applied} OR \
             {seq} IN (SELECT {seq} FROM __strata_events WHERE {op} = {m} AND {run} > {applied}))",
            m = crate::semantics::snapshot::OP_MARKER
        )
    } else {
        format!("SELECT * FROM __strata_events WHERE {run} > {applied}")
    };
    let pending = collect_sql(ctx, &sql, &setup.event_schema).await?;
    if pending.num_rows() == 0 {
        return Ok(None);
    }
    Ok(Some(touched_keys(setup, &pending)?))
}

/// The source rows added since the flow's position, as events of this run (a snapshot
/// flow's deliveries turned into events against the store, `snapshot.rs`).
async fn new_events(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &Positions,
    ctx: &SessionContext,
    report: &mut FlowReport,
) -> Result<SnapshotEvents> {
    let pieces = source_events(scope, setup, pos, ctx).await?;
    report.source_versions = Some((pos.from, pos.source_version));
    report.events = pieces.iter().map(RecordBatch::num_rows).sum();
    let steps = Steps::new(&setup.flow.name, "");
    step!(info, steps, "evaluated and checked the new events");
    if !setup.is_snapshot() {
        return Ok(SnapshotEvents::just(with_run(setup, pieces, pos.run())?));
    }
    // A snapshot's rows go to `to_events` in the pieces they came in: a large snapshot
    // diffed by digest is never copied into one batch.
    let current = pos.target.as_ref().filter(|_| pos.target_in_step());
    let s = snapshot::to_events(
        ctx,
        setup,
        pos.store.is_some(),
        current,
        (
            digest::dir_for(&pos.store_path).as_deref(),
            pos.store_version,
        ),
        pieces,
        pos.run(),
    )
    .await?;
    if pos.store.is_some() {
        snapshot::register_effective(
            ctx,
            setup,
            "__strata_effective",
            "__strata_events",
            Some(&s.markers),
        )
        .await?;
    }
    Ok(s)
}

/// The events of the source rows added since the flow's position, checked (R4): handed
/// over by the ingestion that just appended exactly those rows in this run, else evaluated
/// from the source's new files (or its change feed, or its whole content in table mode).
async fn source_events(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &Positions,
    ctx: &SessionContext,
) -> Result<Vec<RecordBatch>> {
    let flow = &setup.flow;
    let handed = (!setup.table_mode() && !setup.source_feed)
        .then(|| {
            scope
                .handoff
                .take(&flow.source, &flow.name, pos.from, pos.source_version)
        })
        .flatten();
    if let Some(checked) = handed {
        return Ok(checked);
    }
    if setup.source_feed && !setup.table_mode() {
        let feed =
            crate::storage::feed::read_feed(&pos.source, pos.from, Some(pos.source_version), false)
                .await?;
        ctx.register_batch(strata_sql::SOURCE_PLACEHOLDER, feed)
            .context(|| "registering the change feed".into())?;
    } else {
        match (setup.table_mode(), &pos.changes) {
            (false, Some(changes)) => {
                crate::storage::changes::register_new_rows(
                    ctx,
                    strata_sql::SOURCE_PLACEHOLDER,
                    &pos.source,
                    pos.from,
                    pos.source_version,
                    changes,
                )
                .await?
            }
            _ => register_table(ctx, strata_sql::SOURCE_PLACEHOLDER, &pos.source, None).await?,
        }
    }
    let pieces = evaluate_events(ctx, setup).await?;
    let _ = ctx.deregister_table(strata_sql::SOURCE_PLACEHOLDER);
    validate_events(setup, &pieces, &pos.place(setup))?;
    Ok(pieces)
}

/// Every stored event of the touched keys (a snapshot flow's: those no later delivery
/// superseded), expired tombstones forgotten; `None` without an event store.
async fn read_stored(
    ctx: &SessionContext,
    setup: &FlowSetup,
    pos: &Positions,
    input: &Input,
    report: &mut FlowReport,
) -> Result<Option<RecordBatch>> {
    let Some(store) = &pos.store else {
        return Ok(None);
    };
    let steps = Steps::new(&setup.flow.name, "");
    if setup.is_snapshot() && input.events.is_none() {
        snapshot::register_effective(ctx, setup, "__strata_effective", "__strata_events", None)
            .await?;
    }
    let slice = match read_by_pages(ctx, setup, pos, store, input).await? {
        Some(slice) => {
            step!(debug, steps, "read the touched keys' stored events by page");
            slice
        }
        None => {
            let table = match setup.is_snapshot() {
                true => "__strata_effective",
                false => "__strata_events",
            };
            read_slice(ctx, setup, table, &input.touched, &setup.event_schema, true).await?
        }
    };
    let Some(secs) = setup.tombstone_secs else {
        return Ok(Some(slice));
    };
    let (kept, forgotten) = tombstones::forget_expired_in(
        &pos.store_path,
        &slice,
        &setup.spec.keys,
        setup.spec.n_out,
        secs,
        input.decided_at,
    )
    .await?;
    if forgotten > 0 {
        report.notes.push(format!(
            "{forgotten} tombstone(s) older than {secs} s forgotten ({}): a late event older \
             than one of those deletes brings its key back",
            tombstones::PROPERTY
        ));
    }
    Ok(Some(kept))
}

/// The touched keys' stored events read through the store's page index (`pages.rs`), for a
/// flow with one integer key and no truncate rule; `None` when that read does not apply.
async fn read_by_pages(
    ctx: &SessionContext,
    setup: &FlowSetup,
    pos: &Positions,
    store: &DeltaTable,
    input: &Input,
) -> Result<Option<RecordBatch>> {
    if setup.flow.truncate_when.is_some() {
        return Ok(None);
    }
    let raw = read_touched_by_pages(store, &pos.store_path, setup, &input.touched).await?;
    let Some(raw) = raw else {
        return Ok(None);
    };
    if !setup.is_snapshot() {
        return Ok(Some(raw));
    }
    // A snapshot flow's stored events count unless a later delivery of their version
    // superseded them.
    let _ = ctx.deregister_table("__strata_touched_raw");
    ctx.register_batch("__strata_touched_raw", raw)
        .context(|| "registering stored events".into())?;
    snapshot::register_effective(
        ctx,
        setup,
        "__strata_touched",
        "__strata_touched_raw",
        input.markers.as_ref(),
    )
    .await?;
    Ok(Some(
        collect_sql(ctx, "SELECT * FROM __strata_touched", &setup.event_schema).await?,
    ))
}

/// The fold's output: the touched keys' rows in the target layout (in pieces), and how
/// many keys.
struct Folded {
    rows: Vec<RecordBatch>,
    keys: usize,
}

/// Folds the touched keys' stored events with the new ones into their target rows, and
/// checks an SCD type 2 result's integrity (a broken timeline is never committed). CPU work
/// on a blocking thread, so that datasets the scheduler runs side by side do not wait for it.
async fn fold(
    setup: &FlowSetup,
    stored: Option<RecordBatch>,
    new: Vec<RecordBatch>,
) -> Result<Folded> {
    let setup = setup.clone();
    off_scheduler("the fold", move || {
        let parts: Vec<RecordBatch> = stored.into_iter().chain(new).collect();
        let events = match parts.len() {
            1 => parts
                .into_iter()
                .next()
                .unwrap_or_else(|| RecordBatch::new_empty(setup.event_schema.clone())),
            _ => concat_batches(&setup.event_schema, &parts)
                .context(|| "concatenating events".into())?,
        };
        let (rows, keys) = target::fold_checked(&setup, events)?;
        Ok(Folded {
            rows: vec![rows],
            keys,
        })
    })
    .await
}

/// The touched keys' rows after the run: each event its key's row for a first snapshot
/// (nothing stored, one event per key), else the fold of their stored and new events.
async fn fold_or_first_rows(
    setup: &FlowSetup,
    stored: Option<RecordBatch>,
    input: &Input,
) -> Result<Folded> {
    let new = input.events.clone().unwrap_or_default();
    match (&stored, input.one_per_key) {
        (None, true) => first_rows(setup, new).await,
        _ => fold(setup, stored, new).await,
    }
}

/// The touched keys' rows before the run, folded from their stored events (`stored`), when
/// those are all the target reflects.
async fn rows_before(
    setup: &FlowSetup,
    stored: Option<RecordBatch>,
) -> Result<Option<RecordBatch>> {
    let Some(stored) = stored else {
        return Ok(None);
    };
    let setup = setup.clone();
    off_scheduler("the rows before the run", move || {
        Ok(Some(setup.fold_to_target(&stored)?.0))
    })
    .await
}

/// The target rows of a first snapshot's events, which each upsert a key no other has
/// with nothing stored: each event is its key's row (`target::first_rows`), without the
/// fold's sort and gather, in the events' pieces.
async fn first_rows(setup: &FlowSetup, events: Vec<RecordBatch>) -> Result<Folded> {
    let setup = setup.clone();
    off_scheduler("the first rows", move || {
        let keys = events.iter().map(RecordBatch::num_rows).sum();
        let rows = target::first_rows(&setup, &events)?;
        Ok(Folded { rows, keys })
    })
    .await
}

/// The event store and the data files of the run's new events in it, written but not
/// committed; `None` when the run adds no events or there is no event store yet (the first
/// run creates it when it commits).
async fn stage_events(
    setup: &FlowSetup,
    pos: &Positions,
    input: &Input,
) -> Result<Option<(DeltaTable, Vec<deltalake::kernel::Add>)>> {
    let (Some(events), Some(store)) = (&input.to_commit, &pos.store) else {
        return Ok(None);
    };
    let files = crate::storage::write::stage_append(store, events.clone())
        .await
        .map_err(|e| e.within(|| format!("flow {}: writing events", setup.flow.name)))?;
    Ok(Some((store.clone(), files)))
}

/// Removes the event files [`stage_events`] wrote for a run that failed before it
/// committed them; a file that cannot be removed is logged (it is in no commit: a vacuum
/// removes it).
async fn remove_staged(
    store: &Location,
    staged: Option<(DeltaTable, Vec<deltalake::kernel::Add>)>,
) {
    for add in staged.map(|(_, files)| files).unwrap_or_default() {
        if let Err(e) = store.remove_file(&add.path).await {
            tracing::warn!("{e}: left for a vacuum");
        }
    }
}

/// Commits the run's events (their files written by [`stage_events`]; on the first run,
/// written now into the event store it creates) together with the flow's new source
/// position: from here on they are never lost. Returns the event store's version after
/// the run.
async fn commit_events(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    pos: &Positions,
    input: &Input,
    staged: Option<(DeltaTable, Vec<deltalake::kernel::Add>)>,
) -> Result<i64> {
    let commit = PendingCommit::of_run(scope.run_id)
        .at(AppId::Flow(&setup.flow.name), pos.source_version)
        .with_info(tombstones::DECIDED_AT, serde_json::json!(input.decided_at));
    let within = |e: crate::error::EngineError| {
        e.within(|| format!("flow {}: committing events", setup.flow.name))
    };
    match (staged, &input.to_commit) {
        (Some((store, files)), _) => crate::storage::write::commit_append(&store, files, &commit)
            .await
            .map_err(within),
        (None, Some(events)) => {
            let store = crate::eventstore::pages::create_store(
                &pos.store_path,
                &setup.event_schema,
                &setup.key_names,
            )
            .await?;
            let version =
                crate::storage::write::append(&store, events.clone(), Vec::new(), &commit)
                    .await
                    .map_err(within)?;
            Ok(if version < 0 { pos.run() } else { version })
        }
        (None, None) => Ok(pos.store_version),
    }
}
