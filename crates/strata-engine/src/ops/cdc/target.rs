//! Writing a flow's target: the last phase of a run (`run.rs`). Only keys whose rows change
//! are written: an empty target gets the folded rows in a plain append; otherwise the
//! touched keys' current rows are compared with the folded ones and the changed keys' rows
//! replaced in place (`storage/replace.rs`), or through a delta-rs MERGE for a target the
//! replacement does not handle.

use super::setup::target_configuration;
use crate::error::{Context, EngineError, Result};
use crate::eventstore::read::read_slice;
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::compare::{compare, count_first_rows, ChangeSet};
use crate::semantics::events::Touched;
use crate::semantics::flow::FlowSetup;
use crate::semantics::integrity::check_rows;
use crate::storage::commit::PendingCommit;
use crate::storage::session::register_table;
use crate::storage::table::table_files;
use crate::util::steps::{step, Steps};
use crate::util::threads::off_scheduler;
use deltalake::arrow::array::{new_null_array, RecordBatch, StringArray, UInt32Array};
use deltalake::arrow::compute::{self, concat_batches};
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{col, lit, DataFrame, Expr, SessionContext};
use deltalake::DeltaTable;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a run writes to its target.
pub(crate) struct TargetWrite<'a> {
    /// The touched keys' rows after the run, in the target layout, in pieces.
    pub(crate) rows: Vec<RecordBatch>,
    /// The touched keys' rows before the run, folded from their stored events when the
    /// target reflects them all; `None`: read from the target.
    pub(crate) current: Option<RecordBatch>,
    pub(crate) touched: &'a Touched,
    /// The positions the target commit records (the event-store version and the flow's
    /// source position).
    pub(crate) commit: PendingCommit,
}

/// Writes the changed keys' rows to the target (created on the first run with the
/// properties of its declaration), filling the change counts of `report`.
pub(crate) async fn write_target(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    target: Option<DeltaTable>,
    ctx: &SessionContext,
    write: TargetWrite<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let target = match target {
        Some(t) if !table_files(&t)?.is_empty() => t,
        existing => {
            return write_first_rows(scope, setup, target_properties, existing, write, report).await
        }
    };
    let steps = Steps::new(&setup.flow.name, "");
    let rows = match write.rows.as_slice() {
        [one] => one.clone(),
        pieces => concat_batches(&setup.target_schema, pieces)
            .context(|| "the touched keys' rows".into())?,
    };
    let current = match &write.current {
        Some(current) => current.clone(),
        None => {
            register_table(ctx, "__strata_target", &target, None).await?;
            let (schema, touched) = (&setup.target_schema, write.touched);
            read_slice(ctx, setup, "__strata_target", touched, schema, false).await?
        }
    };
    step!(info, steps, "found the target rows of the touched keys");
    (scope.update)(format!(
        "writing the rows of {} key(s)",
        report.keys_touched
    ));
    let change = {
        let (s, now, new) = (setup.clone(), current.clone(), rows.clone());
        off_scheduler("compare", move || compare(&s, &now, &new)).await?
    };
    step!(debug, steps, "compared them with the new rows");
    report.count(&change.counts);
    report.keys_changed = change.keys;
    report.rows_deleted = change.rows_deleted;
    report.rows_inserted = change.insert_rows.len();
    if change.keys == 0 {
        return Ok(());
    }
    replace_changed(setup, &target, ctx, &current, rows, write, change).await
}

/// No rows yet: everything folded is new, written with a plain append (which also creates
/// the table with its properties on the first run).
async fn write_first_rows(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    existing: Option<DeltaTable>,
    write: TargetWrite<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    report.keys_changed = report.keys_touched;
    report.rows_inserted = write.rows.iter().map(RecordBatch::num_rows).sum();
    report.count(&count_first_rows(setup, report.rows_inserted));
    let flow = &setup.flow;
    let target = match existing {
        Some(t) => t,
        None => create_target(scope, setup, target_properties).await?,
    };
    crate::storage::write::append(&target, write.rows, Vec::new(), &write.commit).await?;
    let steps = Steps::new(&flow.name, "");
    step!(info, steps, "wrote the first rows of the target");
    Ok(())
}

/// `events` folded into their target rows and checked before anything is written: the
/// declared `NOT NULL` columns, and an SCD type 2 result's integrity (a broken timeline is
/// never committed); with the number of keys. CPU work: callers run it off the scheduler.
pub(super) fn fold_checked(setup: &FlowSetup, events: RecordBatch) -> Result<(RecordBatch, usize)> {
    let (rows, keys) = setup.fold_to_target(&events)?;
    drop(events);
    check_not_null(setup, &rows)?;
    if setup.flow.stored_as == strata_sql::ScdType::Type2 {
        check_integrity(setup, &rows)?;
    }
    Ok((rows, keys))
}

/// The target rows of `events` that each upsert a key no other event has, with nothing
/// stored before them (a first snapshot), checked like [`fold_checked`]'s: each event is its
/// key's row (`FlowSetup::first_rows`), in the events' pieces. An SCD type 2 result is one
/// open version per key, so there is no timeline to check.
pub(super) fn first_rows(setup: &FlowSetup, events: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    // One NULL column for the open ends of every piece (SCD type 2 only: type 1 rows have
    // no open end).
    let longest = match setup.spec.scd2 {
        true => events.iter().map(RecordBatch::num_rows).max().unwrap_or(0),
        false => 0,
    };
    let seq_type = setup.event_schema.field(setup.spec.n_out).data_type();
    let open = new_null_array(seq_type, longest);
    let rows = events
        .iter()
        .map(|e| setup.first_rows(e, &open))
        .collect::<Result<Vec<_>>>()?;
    for r in &rows {
        check_not_null(setup, r)?;
    }
    Ok(rows)
}

/// The target's declared `NOT NULL` columns hold a value in every row about to be written:
/// checked before the events are committed, so a NULL never reaches the event store.
fn check_not_null(setup: &FlowSetup, rows: &RecordBatch) -> Result<()> {
    for field in setup
        .target_schema
        .fields()
        .iter()
        .filter(|f| !f.is_nullable())
    {
        let Ok(i) = rows.schema().index_of(field.name()) else {
            continue;
        };
        let column = rows.column(i);
        if column.null_count() == 0 {
            continue;
        }
        let row = (0..rows.num_rows())
            .find(|&r| column.is_null(r))
            .unwrap_or(0);
        let keys: Vec<usize> = setup
            .key_names
            .iter()
            .filter_map(|k| rows.schema().index_of(k).ok())
            .collect();
        return Err(EngineError::BadInput(format!(
            "flow {}: column `{}` of {} is declared NOT NULL, but key ({}) would get NULL \
             ({} row(s) in all); nothing was written",
            setup.flow.name,
            field.name(),
            setup.flow.target,
            crate::semantics::fold::describe_key(rows, &keys, row),
            column.null_count()
        )));
    }
    Ok(())
}

/// The built-in SCD2 integrity check on rows about to be written.
fn check_integrity(setup: &FlowSetup, rows: &RecordBatch) -> Result<()> {
    let violations = check_rows(rows, &setup.key_names, &setup.timeline)?;
    match violations.first() {
        None => Ok(()),
        Some(v) => Err(EngineError::internal(format!(
            "flow {}: the SCD2 integrity check failed before anything was written: key ({}) \
             {} ({} violation(s) in all)",
            setup.flow.name,
            v.key,
            v.problem,
            violations.len()
        ))),
    }
}

/// Creates the flow's target with the properties of its declaration (every AUTO CDC
/// target's, its partition columns, its comment).
pub(super) async fn create_target(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
) -> Result<DeltaTable> {
    let flow = &setup.flow;
    crate::storage::table::create_delta(
        &scope.wh.table_location(&flow.target),
        &flow.target.name,
        &setup.target_schema,
        target_configuration(setup, target_properties),
        setup.target_comment.as_deref(),
        super::setup::target_partition_columns(setup)?,
    )
    .await
}

/// Replaces the rows of the changed keys of `change` in the target: in place where
/// `storage/replace.rs` can, else through a MERGE.
async fn replace_changed(
    setup: &FlowSetup,
    target: &DeltaTable,
    ctx: &SessionContext,
    current: &RecordBatch,
    rows: RecordBatch,
    write: TargetWrite<'_>,
    change: ChangeSet,
) -> Result<()> {
    let flow = &setup.flow;
    let steps = Steps::new(&flow.name, "");
    let take = |rows: &RecordBatch, idx: Vec<u32>| {
        compute::take_record_batch(rows, &UInt32Array::from(idx))
            .context(|| "selecting rows".into())
    };
    let inserts = take(&rows, change.insert_rows)?;
    let old_rows = take(current, change.old_rows)?;
    let feed = crate::storage::replace::Feed {
        deleted: take(current, change.feed_deleted)?,
        inserted: take(&rows, change.feed_inserted)?,
    };
    drop(rows);
    let replaced = crate::storage::replace::replace_keys(
        target,
        &setup.key_names,
        &old_rows,
        inserts.clone(),
        &feed,
        &write.commit,
    )
    .await
    .map_err(|e| e.within(|| format!("flow {}: writing {}", flow.name, flow.target)))?;
    if let Some(done) = replaced {
        step!(
            info,
            steps,
            format!("replaced the changed keys' rows in the target ({done})")
        );
        return Ok(());
    }
    // A target the replacement does not handle (partitioned by its start, or written by
    // another engine with column mapping or deletion vectors at absolute paths): a delta-rs MERGE.
    drop(old_rows);
    let deletes = take(current, change.delete_rows)?;
    merge_changed(setup, target, ctx, &inserts, &deletes, &write.commit).await?;
    step!(info, steps, "merged the changed keys into the target");
    Ok(())
}

/// The changed keys' new rows `inserts` merged into `target`, after deleting every row of
/// the keys of `deletes` (one row per changed key).
async fn merge_changed(
    setup: &FlowSetup,
    target: &DeltaTable,
    ctx: &SessionContext,
    inserts: &RecordBatch,
    deletes: &RecordBatch,
    commit: &PendingCommit,
) -> Result<()> {
    let flow = &setup.flow;
    let source_df = merge_source(ctx, inserts, deletes)?;
    let action = || col(Column::new(Some("source"), "__strata_action"));
    let mut predicate: Expr = action().eq(lit("del"));
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
        .clone()
        .merge(source_df, predicate)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_commit_properties(commit.properties())
        .when_matched_delete(|d| d)
        .context(|| "merge".into())?
        .when_not_matched_insert(|mut ins| {
            ins = ins.predicate(action().eq(lit("ins")));
            for n in &names {
                ins = ins.set(n.as_str(), col(Column::new(Some("source"), n.as_str())));
            }
            ins
        })
        .context(|| "merge".into())?
        .await
        .context(|| format!("flow {}: merging into {}", flow.name, flow.target))?;
    Ok(())
}

/// The MERGE source: new rows tagged `ins`, one row per changed key tagged `del`.
fn merge_source(
    ctx: &SessionContext,
    inserts: &RecordBatch,
    deletes: &RecordBatch,
) -> Result<DataFrame> {
    let tag = |b: &RecordBatch, t: &str| -> Result<RecordBatch> {
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("__strata_action", DataType::Utf8, false));
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(StringArray::from(vec![t; b.num_rows()])));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).context(|| "merge source".into())
    };
    let (i, d) = (tag(inserts, "ins")?, tag(deletes, "del")?);
    let both = concat_batches(&i.schema(), &[i.clone(), d]).context(|| "merge source".into())?;
    ctx.read_batch(both).context(|| "merge source".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int64Array, Int8Array};
    use proptest::prelude::*;

    /// The setup of a snapshot flow over (key, name, amount, v) stored as `stored` with
    /// target properties `props`.
    fn setup(stored: &str, props: &[(&str, &str)]) -> FlowSetup {
        let sql = format!(
            "CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM STREAM(s) KEYS (key) \
             SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS {stored};"
        );
        let flow = strata_sql::parse_pipeline(&sql)
            .expect("parses")
            .statements
            .into_iter()
            .find_map(|s| match s {
                strata_sql::Statement::Flow(f) => Some(f),
                _ => None,
            })
            .expect("a flow");
        let source = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let props: BTreeMap<String, String> = props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(super::super::setup::prepare_flow(
            &flow, &source, &props, None,
        ))
        .expect("setup")
    }

    /// Rows sorted by their first (key) column.
    fn by_key(rows: &RecordBatch) -> RecordBatch {
        let order = compute::sort_to_indices(rows.column(0), None, None).expect("sort");
        compute::take_record_batch(rows, &order).expect("take")
    }

    /// The keys compared in several lanes side by side give what one lane gives: the same
    /// changed keys, rows and counts (SCD types 1 and 2).
    #[test]
    fn comparing_in_lanes_is_comparing_at_once() {
        use crate::semantics::compare::compare_in_lanes;
        for stored in ["SCD TYPE 1", "SCD TYPE 2"] {
            let setup = setup(stored, &[]);
            // Version 1 holds keys 0..300; version 2 two thirds of them, a change of amount
            // for the even ones (100 keys).
            let events = |version: i64, keys: Vec<i64>| {
                let n = keys.len();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(keys.clone())),
                    Arc::new(StringArray::from_iter_values(
                        keys.iter().map(|k| format!("n{k}")),
                    )),
                    Arc::new(Int64Array::from_iter_values(
                        keys.iter()
                            .map(|k| k + i64::from(version == 2 && k % 2 == 0)),
                    )),
                    Arc::new(Int64Array::from(vec![version; n])),
                    Arc::new(Int8Array::from(vec![0i8; n])),
                    Arc::new(Int64Array::from(vec![version; n])),
                ];
                RecordBatch::try_new(setup.event_schema.clone(), columns).expect("events")
            };
            let v1 = events(1, (0..300).collect());
            let v2 = events(2, (0..300).filter(|k| k % 3 != 0).collect());
            let both = concat_batches(&setup.event_schema, &[v1.clone(), v2]).expect("concat");
            let (old, _) = fold_checked(&setup, v1).expect("fold");
            let (new, _) = fold_checked(&setup, both).expect("fold");
            let one = compare_in_lanes(&setup, &old, &new, 1).expect("compare");
            assert_eq!(one.keys, 100, "{stored}");
            for lanes in [2, 3, 7] {
                let many = compare_in_lanes(&setup, &old, &new, lanes).expect("compare");
                assert_eq!(many, one, "{stored}, {lanes} lanes");
            }
        }
    }

    proptest! {
        /// A first snapshot's rows, made piece by piece without the fold, are the fold's
        /// rows: SCD type 1, and SCD type 2 in each timeline convention.
        #[test]
        fn first_rows_are_the_folds_rows(
            rows in prop::collection::btree_map(
                -1000i64..1000,
                (prop::option::of("[a-c]{0,3}"), prop::option::of(-5i64..5)),
                0..60,
            ),
            cut in 0usize..60,
            version in 1i64..100,
        ) {
            // Keys in an order of their own (the map's reversed), cut into two pieces.
            let rows: Vec<_> = rows.into_iter().rev().collect();
            for (stored, props) in [
                ("SCD TYPE 1", vec![]),
                ("SCD TYPE 2", vec![]),
                ("SCD TYPE 2", vec![("strata.scd.convention", "dbt")]),
                (
                    "SCD TYPE 2",
                    vec![("strata.scd.convention", "kimball"), ("strata.scd.openEnd", "999999")],
                ),
            ] {
                let setup = setup(stored, &props);
                let n = rows.len();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                    Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1 .0.clone()))),
                    Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1 .1))),
                    Arc::new(Int64Array::from(vec![version; n])),
                    Arc::new(Int8Array::from(vec![0i8; n])),
                    Arc::new(Int64Array::from(vec![0i64; n])),
                ];
                let events = RecordBatch::try_new(setup.event_schema.clone(), columns)
                    .expect("events");
                let (folded, keys) = fold_checked(&setup, events.clone()).expect("fold");
                let cut = cut.min(n);
                let pieces = [events.slice(0, cut), events.slice(cut, n - cut)];
                let first = first_rows(&setup, &pieces).expect("first rows");
                let first = concat_batches(&folded.schema(), &first).expect("concat");
                prop_assert_eq!(keys, n);
                prop_assert_eq!(by_key(&first), by_key(&folded), "{} {:?}", stored, props);
            }
        }
    }
}
