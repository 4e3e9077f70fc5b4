//! One run of one AUTO CDC flow.

use super::snapshot;
use super::target::EVENTS_APP_ID;
use crate::error::{Context, EngineError, Result};
use crate::eventstore::evaluate::evaluate_events;
use crate::eventstore::read::collect_sql;
use crate::eventstore::read::read_slice;
use crate::ops::cdc::evolve::evolve_tables;
use crate::ops::cdc::evolve::follow_deletion_vectors;
use crate::ops::cdc::setup::deletion_vectors_by_default;
use crate::ops::cdc::setup::target_configuration;
use crate::ops::cdc::target::merge_source;
use crate::ops::cdc::target::target_commit;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::compare::compare;
use crate::semantics::compare::count_first_rows;
use crate::semantics::events::merge_touched;
use crate::semantics::events::touched_keys;
use crate::semantics::events::validate_events;
use crate::semantics::events::with_run;
use crate::semantics::events::Touched;
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::OP_COL;
use crate::semantics::fold::RUN_COL;
use crate::semantics::fold::SEQ_COL;
use crate::semantics::integrity::check_rows;
use crate::storage::session::register_table;
use crate::storage::table::new_files;
use crate::storage::table::table_files;
use crate::storage::table::txn_version;
use crate::storage::table::version_of;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::array::UInt32Array;
use deltalake::arrow::compute;
use deltalake::arrow::compute::concat_batches;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::col;
use deltalake::datafusion::prelude::lit;
use deltalake::datafusion::prelude::Expr;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use strata_sql::ScdType;

/// Runs `setup` once over all source rows it has not seen, after bringing an existing
/// target in line with the flow: its deletion-vector setting, and the columns the flow
/// newly produces (added to the event store and the target).
pub(crate) async fn run_flow(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
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
    let added = evolve_tables(wh, setup, target).await?;
    let mut report = run_flow_once(scope, setup, target_properties).await?;
    let gc_set = crate::storage::table::sets_property(
        target_properties,
        crate::eventstore::tombstones::PROPERTY,
    );
    if gc_set && setup.tombstone_secs.is_none() {
        report.notes.push(format!(
            "{} is not acted on for {}: its deletes end versions of its history and are \
             kept, so a late event older than a delete never brings its key back",
            crate::eventstore::tombstones::PROPERTY,
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

async fn run_flow_once(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<FlowReport> {
    let (wh, update) = (scope.wh, scope.update);
    if setup.flow.stored_as == ScdType::Snapshots {
        return super::snapshots_mode::run_snapshots_mode(wh, setup, target_properties).await;
    }
    let flow = &setup.flow;
    let mut report = FlowReport {
        flow: flow.name.clone(),
        ..Default::default()
    };
    let Some(source) = wh.open_table(&flow.source).await? else {
        report.skipped = Some(format!("source {} has no data yet", flow.source));
        return Ok(report);
    };
    let store_path = wh.event_store_path(&flow.target);
    let store = crate::storage::table::open_delta(&store_path).await?;
    let app_id = format!("strata-flow:{}", flow.name);
    let from = match &store {
        Some(s) => txn_version(s, &app_id).await?,
        None => None,
    };
    let source_version = version_of(&source);

    let target = wh.open_table(&flow.target).await?;
    let applied = match &target {
        Some(t) => txn_version(t, EVENTS_APP_ID).await?.unwrap_or(-1),
        None => -1,
    };
    let store_version = store.as_ref().map_or(-1, version_of);

    let ctx = crate::storage::session::new_session();
    let steps = crate::util::steps::Steps::new(&flow.name, "");
    let phase = |what: &str| crate::util::steps::step!(info, steps, what);
    // Keys of event-store commits the target does not reflect yet (an interrupted run).
    let mut touched: Option<Touched> = None;
    if let Some(store) = &store {
        register_table(&ctx, "__strata_events", store, None).await?;
        if store_version > applied {
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
            let pending = collect_sql(&ctx, &sql, &setup.event_schema).await?;
            if pending.num_rows() > 0 {
                touched = Some(touched_keys(setup, &pending)?);
                report.recovered = true;
            }
        }
    }

    let has_new_input = from.is_none_or(|f| f < source_version);
    let run = store_version + 1;
    // The instant this run decides which tombstones have expired, recorded in its
    // event-store commit as the time its events were processed (`eventstore/tombstones.rs`).
    let decided_at = chrono::Utc::now().timestamp_millis();
    // What the event store gets in this run (for a snapshot flow, the events plus markers).
    let mut to_commit: Option<Vec<RecordBatch>> = None;
    let mut superseded: Option<RecordBatch> = None;
    let mut new_markers: Option<RecordBatch> = None;
    // A snapshot flow's digest of the state after this run, and where it goes (`eventstore/digest.rs`).
    let mut state_digest: Option<crate::eventstore::digest::Digest> = None;
    let digest_dir = crate::eventstore::digest::dir_for(&store_path);
    let new_events = if has_new_input {
        let handed = (!setup.table_mode() && !setup.source_feed)
            .then(|| {
                scope
                    .handoff
                    .take(&flow.source, &flow.name, from, source_version)
            })
            .flatten();
        let pieces = if let Some(checked) = handed {
            // Exactly the rows this process just appended to the source, evaluated and
            // checked for this flow before that commit: no need to read back the files it
            // wrote.
            checked
        } else {
            if setup.source_feed && !setup.table_mode() {
                let feed =
                    crate::storage::feed::read_feed(&source, from, Some(source_version), false)
                        .await?;
                ctx.register_batch(strata_sql::SOURCE_PLACEHOLDER, feed)
                    .context(|| "registering the change feed".into())?;
            } else {
                let files = if setup.table_mode() {
                    None
                } else {
                    Some(new_files(&source, from).await?)
                };
                register_table(&ctx, strata_sql::SOURCE_PLACEHOLDER, &source, files).await?;
            }
            let pieces = evaluate_events(&ctx, setup).await?;
            let _ = ctx.deregister_table(strata_sql::SOURCE_PLACEHOLDER);
            let place = format!(
                "the rows of {} added after version {}",
                flow.source,
                from.map_or("(start)".to_string(), |v| v.to_string())
            );
            validate_events(setup, &pieces, &place)?;
            pieces
        };
        report.source_versions = Some((from, source_version));
        report.events = pieces.iter().map(RecordBatch::num_rows).sum();
        if setup.is_snapshot() {
            // A snapshot's rows go to `to_events` in the pieces they came in: a large
            // snapshot diffed by digest is never copied into one batch.
            phase("evaluated and checked the new events");
            // The target reflects the latest stored version when no earlier run is pending.
            let in_step = store.is_some() && store_version == applied;
            let current = target.as_ref().filter(|_| in_step);
            let s = snapshot::to_events(
                &ctx,
                setup,
                store.is_some(),
                current,
                (&digest_dir, store_version),
                &pieces,
                run,
            )
            .await?;
            report.notes = s.notes;
            state_digest = s.state_digest;
            if store.is_some() {
                snapshot::register_effective(
                    &ctx,
                    setup,
                    "__strata_effective",
                    "__strata_events",
                    Some(&s.markers),
                )
                .await?;
            }
            new_markers = Some(s.markers.clone());
            to_commit = Some(vec![s.events.clone(), s.markers]);
            superseded = s.superseded;
            Some(s.events)
        } else {
            let events = with_run(setup, pieces, run)?;
            phase("evaluated and checked the new events");
            to_commit = Some(vec![events.clone()]);
            Some(events)
        }
    } else {
        None
    };
    if new_events.is_none() && touched.is_none() {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    if let Some(ev) = &new_events {
        // Without an event store there is nothing stored to look up: the first run derives
        // every key it sees, and the target has nothing yet.
        let t = if store.is_some() {
            touched_keys(setup, ev)?
        } else {
            Touched::All
        };
        touched = Some(match touched {
            Some(p) => merge_touched(p, t)?,
            None => t,
        });
    }
    if let Some(old) = &superseded {
        let t = touched_keys(setup, old)?;
        touched = Some(match touched {
            Some(p) => merge_touched(p, t)?,
            None => t,
        });
    }
    let Some(touched) = touched else {
        return Err(EngineError::Internal("no keys to derive".into()));
    };
    crate::util::steps::step!(debug, steps, "collected the touched keys");
    report.keys_touched = match &touched {
        Touched::All => 0,
        Touched::Keys(k) => k.num_rows(),
    };

    // Every stored event of the touched keys, plus the new ones: the fold's input.
    let mut parts = Vec::new();
    if store.is_some() {
        if setup.is_snapshot() && new_events.is_none() {
            snapshot::register_effective(
                &ctx,
                setup,
                "__strata_effective",
                "__strata_events",
                None,
            )
            .await?;
        }
        // One integer key and no truncates: the touched keys' pages of the store, found
        // through its page index (`eventstore/pages.rs`); else a DataFusion join.
        let mut by_pages = match (&touched, &store, setup.key_names.as_slice()) {
            (Touched::Keys(keys), Some(store), [key]) if setup.flow.truncate_when.is_none() => {
                match crate::eventstore::pages::int_keys(keys) {
                    Some(keys) => {
                        crate::eventstore::pages::read_keys(
                            store,
                            &store_path,
                            key,
                            keys,
                            &setup.event_schema,
                        )
                        .await?
                    }
                    None => None,
                }
            }
            _ => None,
        };
        if by_pages.is_some() {
            crate::util::steps::step!(debug, steps, "read the touched keys' stored events by page");
        }
        if let (Some(raw), true) = (&by_pages, setup.is_snapshot()) {
            // A snapshot flow's stored events count unless a later delivery of their
            // version superseded them.
            let _ = ctx.deregister_table("__strata_touched_raw");
            ctx.register_batch("__strata_touched_raw", raw.clone())
                .context(|| "registering stored events".into())?;
            snapshot::register_effective(
                &ctx,
                setup,
                "__strata_touched",
                "__strata_touched_raw",
                new_markers.as_ref(),
            )
            .await?;
            by_pages = Some(
                collect_sql(&ctx, "SELECT * FROM __strata_touched", &setup.event_schema).await?,
            );
            crate::util::steps::step!(
                debug,
                steps,
                "kept the stored events no later delivery superseded"
            );
        }
        let slice = match by_pages {
            Some(slice) => slice,
            None => {
                read_slice(
                    &ctx,
                    setup,
                    if setup.is_snapshot() {
                        "__strata_effective"
                    } else {
                        "__strata_events"
                    },
                    &touched,
                    &setup.event_schema,
                    true,
                )
                .await?
            }
        };
        let slice = match setup.tombstone_secs {
            Some(secs) => {
                let (kept, forgotten) = crate::eventstore::tombstones::forget_expired(
                    &slice,
                    &setup.spec.keys,
                    setup.spec.n_out,
                    secs,
                    decided_at,
                    &mut crate::eventstore::tombstones::CommitTimes::new(store_path.clone()),
                )?;
                if forgotten > 0 {
                    report.notes.push(format!(
                        "{forgotten} tombstone(s) older than {secs} s forgotten \
                         ({}): a late event older than one of those deletes brings its key back",
                        crate::eventstore::tombstones::PROPERTY
                    ));
                }
                kept
            }
            None => slice,
        };
        parts.push(slice);
    }
    // The target reflects every stored event (no interrupted run to complete): the rows the
    // touched keys have now are the fold of their stored events, so the target need not be
    // read to find out what changes.
    // (For a snapshot flow, the run's deliveries must supersede nothing stored: new
    // versions only.)
    let stored_only = (store_version == applied
        && !report.recovered
        && (!setup.is_snapshot() || superseded.is_none())
        && matches!(touched, Touched::Keys(_)))
    .then(|| parts.first().cloned())
    .flatten();
    if let Some(ev) = &new_events {
        parts.push(ev.clone());
    }
    let all_events = match parts.len() {
        1 => parts.swap_remove(0),
        _ => {
            concat_batches(&setup.event_schema, &parts).context(|| "concatenating events".into())?
        }
    };
    phase("read new events and the stored events of the touched keys");
    update(format!(
        "{} new event(s), folding {} event(s)",
        report.events,
        all_events.num_rows()
    ));
    let (derived, keys_derived) = setup.fold_to_target(&all_events)?;
    phase("folded");
    drop(all_events);
    if matches!(touched, Touched::All) {
        report.keys_touched = keys_derived;
    }
    if setup.flow.stored_as == ScdType::Type2 {
        // The built-in integrity check: a broken timeline is never committed.
        let violations = check_rows(&derived, &setup.key_names, &setup.timeline)?;
        if let Some(v) = violations.first() {
            return Err(EngineError::Internal(format!(
                "flow {}: the SCD2 integrity check failed before anything was written: key ({}) \
                 {} ({} violation(s) in all)",
                flow.name,
                v.key,
                v.problem,
                violations.len()
            )));
        }
    }

    phase("checked the SCD2 integrity");
    // Commit the events (and the source position) first: from here on they are never lost.
    drop(new_events);
    let new_store_version = match to_commit {
        Some(ev) => {
            let handle = match store {
                Some(s) => s,
                None => {
                    crate::storage::table::create_delta(
                        &store_path,
                        "events",
                        &setup.event_schema,
                        vec![
                            (
                                crate::storage::write::COMPRESSION_PROPERTY.to_string(),
                                Some("lz4_raw".to_string()),
                            ),
                            (
                                crate::storage::write::PAGE_ROWS_PROPERTY.to_string(),
                                Some(crate::eventstore::pages::STORE_PAGE_ROWS.to_string()),
                            ),
                        ],
                        None,
                        Vec::new(),
                    )
                    .await?
                }
            };
            let version = crate::storage::write::append(
                &handle,
                ev,
                Vec::new(),
                CommitProperties::default()
                    .with_application_transaction(Transaction::new(&app_id, source_version))
                    .with_metadata([(
                        crate::eventstore::tombstones::DECIDED_AT.to_string(),
                        serde_json::json!(decided_at),
                    )]),
            )
            .await
            .map_err(|e| match e {
                e @ EngineError::Conflict { .. } => e,
                e => EngineError::Plan(format!("flow {}: committing events: {e}", flow.name)),
            })?;
            if version < 0 {
                run
            } else {
                version
            }
        }
        None => store_version,
    };
    phase("committed the events");
    // Written on a thread of its own while the target is written; joined when the run ends.
    let _digest_writer = state_digest
        .and_then(|d| snapshot::write_digest(setup, digest_dir.clone(), new_store_version, d));

    // The target: only keys whose rows change are rewritten.
    let target = match target {
        Some(t) if !table_files(&t)?.is_empty() => t,
        existing => {
            // No rows yet: everything folded is new, written with a plain append (which also
            // creates the table with its properties on the first run).
            report.keys_changed = report.keys_touched;
            report.rows_inserted = derived.num_rows();
            report.count(&count_first_rows(setup, &derived));
            let handle = match existing {
                Some(t) => t,
                None => {
                    crate::storage::table::create_delta(
                        &wh.table_path(&flow.target),
                        &flow.target.name,
                        &setup.target_schema,
                        target_configuration(setup, target_properties),
                        None,
                        setup.timeline.partition_columns(),
                    )
                    .await?
                }
            };
            crate::storage::write::append(
                &handle,
                vec![derived],
                Vec::new(),
                target_commit(new_store_version, &app_id, source_version),
            )
            .await?;
            phase("wrote the first rows of the target");
            return Ok(report);
        }
    };
    let current = match stored_only {
        Some(stored) => setup.fold_to_target(&stored)?.0,
        None => {
            register_table(&ctx, "__strata_target", &target, None).await?;
            read_slice(
                &ctx,
                setup,
                "__strata_target",
                &touched,
                &setup.target_schema,
                false,
            )
            .await?
        }
    };
    phase("found the target rows of the touched keys");
    update(format!(
        "writing the rows of {} key(s)",
        report.keys_touched
    ));
    let change = compare(setup, &current, &derived)?;
    report.count(&change.counts);
    crate::util::steps::step!(debug, steps, "compared them with the new rows");
    report.keys_changed = change.keys;
    report.rows_deleted = change.rows_deleted;
    report.rows_inserted = change.insert_rows.len();
    if change.keys == 0 {
        return Ok(report);
    }
    let inserts = compute::take_record_batch(&derived, &UInt32Array::from(change.insert_rows))
        .context(|| "selecting rows".into())?;
    let old_rows = compute::take_record_batch(&current, &UInt32Array::from(change.old_rows))
        .context(|| "selecting rows".into())?;
    drop(derived);
    if let Some(done) = crate::storage::replace::replace_keys(
        &target,
        &setup.key_names,
        &old_rows,
        inserts.clone(),
        target_commit(new_store_version, &app_id, source_version),
    )
    .await
    .map_err(|e| match e {
        e @ EngineError::Conflict { .. } => e,
        e => EngineError::Plan(format!("flow {}: writing {}: {e}", flow.name, flow.target)),
    })? {
        phase(&format!(
            "replaced the changed keys' rows in the target ({done})"
        ));
        return Ok(report);
    }
    // A target the rewrite does not handle (partitioned by its start, or written by another
    // engine with column mapping or file-stored deletion vectors): a delta-rs MERGE.
    drop(old_rows);
    let props = target_commit(new_store_version, &app_id, source_version);
    let deletes = compute::take_record_batch(&current, &UInt32Array::from(change.delete_rows))
        .context(|| "selecting rows".into())?;
    let source_df = merge_source(&ctx, &inserts, &deletes)?;
    let mut predicate: Expr = col(Column::new(Some("source"), "__strata_action")).eq(lit("del"));
    for k in &setup.key_names {
        predicate = predicate.and(
            col(Column::new(Some("target"), k.as_str()))
                .eq(col(Column::new(Some("source"), k.as_str()))),
        );
    }
    let names: Vec<String> = setup
        .target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    target
        .merge(source_df, predicate)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_commit_properties(props)
        .when_matched_delete(|d| d)
        .context(|| "merge".into())?
        .when_not_matched_insert(|mut ins| {
            ins = ins.predicate(col(Column::new(Some("source"), "__strata_action")).eq(lit("ins")));
            for n in &names {
                ins = ins.set(n.as_str(), col(Column::new(Some("source"), n.as_str())));
            }
            ins
        })
        .context(|| "merge".into())?
        .await
        .context(|| format!("flow {}: merging into {}", flow.name, flow.target))?;
    phase("merged the changed keys into the target");
    Ok(report)
}
