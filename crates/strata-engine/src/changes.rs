//! The change data feed of a strata table, as `STREAM(t)` and `table_changes('t', ...)` read
//! it.
//!
//! strata rewrites a changed key of an AUTO CDC target by deleting its old rows and
//! inserting its new ones in one commit, so Delta's raw feed shows an update as a `delete`
//! and an `insert` of the same key in the same commit. The feed read here restores what
//! happened, per key and commit: rows deleted and inserted together are an update
//! (`update_preimage`, `update_postimage`), rows only deleted a `delete`, rows only inserted
//! an `insert`. Keys come from the table's `strata.keys` property; a table without keys (an
//! append-only table) has inserts only.

use crate::error::{Context, EngineError, Result};
use crate::sqlutil;
use crate::warehouse;
use deltalake::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use deltalake::arrow::compute::{concat_batches, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::datafusion::physical_plan::collect;
use deltalake::datafusion::sql::sqlparser;
use deltalake::DeltaTable;
use sqlparser::ast::{
    Expr, Ident, ObjectName, TableAlias, TableFactor, Value, VisitMut, VisitorMut,
};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use strata_sql::TableName;

pub(crate) const CHANGE_TYPE: &str = "_change_type";
pub(crate) const COMMIT_VERSION: &str = "_commit_version";
pub(crate) const COMMIT_TIMESTAMP: &str = "_commit_timestamp";

/// The feed's schema: the table's columns, then `_change_type`, `_commit_version`,
/// `_commit_timestamp`.
pub(crate) fn feed_schema(table: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE, DataType::Utf8, true));
    fields.push(Field::new(COMMIT_VERSION, DataType::Int64, true));
    fields.push(Field::new(
        COMMIT_TIMESTAMP,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        true,
    ));
    Arc::new(Schema::new(fields))
}

/// The changes of `table` in the commits after `after` (all commits when `None`) up to
/// `until` included (the latest when `None`), in commit order. Pre-images are left out
/// unless `preimages`.
pub(crate) async fn read_feed(
    table: &DeltaTable,
    after: Option<i64>,
    until: Option<i64>,
    preimages: bool,
) -> Result<RecordBatch> {
    let schema = feed_schema(sqlutil::table_schema(table)?.as_ref());
    let latest = table.version().map_or(-1, |v| v as i64);
    let start = after.map_or(0, |a| a + 1);
    let end = until.unwrap_or(latest).min(latest);
    if start > end {
        return Ok(RecordBatch::new_empty(schema));
    }
    let ctx = warehouse::new_session();
    let plan = table
        .clone()
        .scan_cdf()
        .with_starting_version(start as u64)
        .with_ending_version(end as u64)
        .build(&ctx.state(), None)
        .await
        .context(|| format!("reading the change data feed of {}", table.table_url()))?;
    let batches = collect(plan, ctx.task_ctx())
        .await
        .context(|| format!("reading the change data feed of {}", table.table_url()))?;
    let cast = batches
        .iter()
        .map(|b| by_name(b, &schema))
        .collect::<Result<Vec<_>>>()?;
    let raw = concat_batches(&schema, &cast).context(|| "change feed".into())?;
    let keys: Vec<String> = warehouse::table_properties(table)?
        .get("strata.keys")
        .map(|k| k.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let feed = restore_updates(&raw, &keys)?;
    let feed = if preimages {
        feed
    } else {
        let types = change_types(&feed)?;
        let keep: deltalake::arrow::array::BooleanArray = (0..feed.num_rows())
            .map(|i| Some(types.value(i) != "update_preimage"))
            .collect();
        filter_record_batch(&feed, &keep).context(|| "change feed".into())?
    };
    sort_by_version(&feed)
}

/// `batch`'s columns in `schema`'s order, found by name and cast.
fn by_name(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                EngineError::Internal(format!("change feed has no column {}", f.name()))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    sqlutil::cast_columns(columns, schema)
}

fn change_types(batch: &RecordBatch) -> Result<&StringArray> {
    batch
        .column_by_name(CHANGE_TYPE)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| EngineError::Internal("change feed without _change_type".into()))
}

fn versions(batch: &RecordBatch) -> Result<&Int64Array> {
    batch
        .column_by_name(COMMIT_VERSION)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| EngineError::Internal("change feed without _commit_version".into()))
}

/// Relabels a key's delete + insert in one commit as an update (see the module docs).
fn restore_updates(raw: &RecordBatch, keys: &[String]) -> Result<RecordBatch> {
    if keys.is_empty() || raw.num_rows() == 0 {
        return Ok(raw.clone());
    }
    let mut key_cols = Vec::with_capacity(keys.len() + 1);
    for k in keys {
        let c = raw
            .column_by_name(k)
            .ok_or_else(|| EngineError::Internal(format!("change feed has no key column {k}")))?;
        key_cols.push(c.clone());
    }
    key_cols.push(Arc::new(versions(raw)?.clone()));
    let rows = sqlutil::rows(&key_cols)?;
    let types = change_types(raw)?;
    // Per (key, commit): (deleted, inserted).
    let mut seen: HashMap<&[u8], (bool, bool)> = HashMap::new();
    for i in 0..raw.num_rows() {
        let e = seen.entry(rows.row(i).data()).or_default();
        match types.value(i) {
            "delete" | "update_preimage" => e.0 = true,
            _ => e.1 = true,
        }
    }
    let relabelled: StringArray = (0..raw.num_rows())
        .map(|i| {
            let t = types.value(i);
            let both = seen
                .get(rows.row(i).data())
                .is_some_and(|(d, ins)| *d && *ins);
            Some(match (t, both) {
                ("delete", true) => "update_preimage",
                ("insert", true) => "update_postimage",
                (other, _) => other,
            })
        })
        .collect();
    let mut columns = raw.columns().to_vec();
    let at = raw
        .schema()
        .index_of(CHANGE_TYPE)
        .context(|| "change feed".into())?;
    columns[at] = Arc::new(relabelled);
    RecordBatch::try_new(raw.schema(), columns).context(|| "change feed".into())
}

/// Rows in commit order, otherwise in the order they were read (a stable sort).
fn sort_by_version(batch: &RecordBatch) -> Result<RecordBatch> {
    let v = versions(batch)?;
    let mut idx: Vec<u32> = (0..batch.num_rows() as u32).collect();
    idx.sort_by_key(|&i| v.value(i as usize));
    deltalake::arrow::compute::take_record_batch(
        batch,
        &deltalake::arrow::array::UInt32Array::from(idx),
    )
    .context(|| "change feed".into())
}

const FUNCTION: &str = "table_changes";

/// One `table_changes('t', from [, to])` call: the table and the version range (both ends
/// included, as in Databricks).
struct Call {
    table: String,
    from: i64,
    to: Option<i64>,
}

fn int_arg(e: &Expr) -> Option<i64> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

fn call_of(factor: &TableFactor) -> Option<Result<Call>> {
    let args = sqlutil::table_function_args(factor, FUNCTION)?;
    let usage = || {
        EngineError::Plan(format!(
            "{FUNCTION} takes a table name and a first version, and optionally a last one: \
             {FUNCTION}('users', 2) or {FUNCTION}('users', 2, 5)"
        ))
    };
    let Some(exprs) = args else {
        return Some(Err(usage()));
    };
    if !(2..=3).contains(&exprs.len()) {
        return Some(Err(usage()));
    }
    let table = match exprs[0] {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            _ => return Some(Err(usage())),
        },
        _ => return Some(Err(usage())),
    };
    let Some(from) = int_arg(exprs[1]) else {
        return Some(Err(usage()));
    };
    let to = match exprs.get(2) {
        Some(e) => match int_arg(e) {
            Some(v) => Some(v),
            None => return Some(Err(usage())),
        },
        None => None,
    };
    Some(Ok(Call { table, from, to }))
}

/// The statements of `sql` with every `table_changes(...)` replaced by the name
/// `__strata_changes_<i>`, and the calls in that order; `None` when there is none.
fn replace_calls(sql: &str) -> Result<Option<(Vec<sqlparser::ast::Statement>, Vec<Call>)>> {
    let Some(mut statements) = crate::sqlutil::statements_calling(sql, FUNCTION)? else {
        return Ok(None);
    };
    struct Replace {
        calls: Vec<Call>,
        error: Option<EngineError>,
    }
    impl VisitorMut for Replace {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            match call_of(factor) {
                Some(Ok(call)) => {
                    if let TableFactor::Table {
                        name, args, alias, ..
                    } = factor
                    {
                        if alias.is_none() {
                            *alias = Some(TableAlias {
                                explicit: true,
                                name: Ident::new(FUNCTION),
                                columns: Vec::new(),
                                at: None,
                            });
                        }
                        *name = ObjectName::from(vec![Ident::new(format!(
                            "__strata_changes_{}",
                            self.calls.len()
                        ))]);
                        *args = None;
                    }
                    self.calls.push(call);
                    ControlFlow::Continue(())
                }
                Some(Err(e)) => {
                    self.error = Some(e);
                    ControlFlow::Break(())
                }
                None => ControlFlow::Continue(()),
            }
        }
    }
    let mut replace = Replace {
        calls: Vec::new(),
        error: None,
    };
    for s in statements.iter_mut() {
        let _ = s.visit(&mut replace);
    }
    if let Some(e) = replace.error {
        return Err(e);
    }
    if replace.calls.is_empty() {
        return Ok(None);
    }
    Ok(Some((statements, replace.calls)))
}

/// `call`'s table, unqualified names in `schema`.
fn call_table(call: &Call, schema: &str) -> TableName {
    match call.table.split_once('.') {
        Some((s, n)) => TableName::new(Some(s), n),
        None => TableName::new(Some(schema), &call.table),
    }
}

/// Replaces every `table_changes(...)` by a name registered in `ctx` holding that feed
/// (pre-images included). Returns the rewritten SQL, or `None` when there is no call.
pub(crate) async fn rewrite_table_changes(
    wh: &crate::warehouse::Warehouse,
    ctx: &deltalake::datafusion::prelude::SessionContext,
    sql: &str,
    schema: &str,
) -> Result<Option<String>> {
    let Some((statements, calls)) = replace_calls(sql)? else {
        return Ok(None);
    };
    for (i, call) in calls.iter().enumerate() {
        let tn = call_table(call, schema);
        let table = wh.open_table(&tn).await?.ok_or_else(|| {
            EngineError::NotFound(format!("{FUNCTION}('{}', ...): no table {tn}", call.table))
        })?;
        let latest = table.version().map_or(-1, |v| v as i64);
        if call.from > latest {
            return Err(EngineError::Plan(format!(
                "{FUNCTION}('{}', {}): the table's latest version is {latest}",
                call.table, call.from
            )));
        }
        let feed = read_feed(&table, Some(call.from - 1), call.to, true).await?;
        let _ = ctx.deregister_table(format!("__strata_changes_{i}").as_str());
        ctx.register_batch(format!("__strata_changes_{i}").as_str(), feed)
            .context(|| "registering the change feed".into())?;
    }
    Ok(Some(crate::sqlutil::statements_sql(&statements)))
}

/// [`rewrite_table_changes`] for planning only: each call becomes an empty table with the
/// columns of its table's feed, the table's columns taken from `shapes`.
pub(crate) fn shape_table_changes(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    sql: &str,
    schema: &str,
    shapes: &crate::query::Shapes,
) -> Result<Option<String>> {
    let Some((statements, calls)) = replace_calls(sql)? else {
        return Ok(None);
    };
    for (i, call) in calls.iter().enumerate() {
        let tn = call_table(call, schema);
        let columns = shapes.get(&tn).ok_or_else(|| {
            EngineError::NotFound(format!("{FUNCTION}('{}', ...): no table {tn}", call.table))
        })?;
        let name = format!("__strata_changes_{i}");
        let _ = ctx.deregister_table(name.as_str());
        ctx.register_batch(name.as_str(), RecordBatch::new_empty(feed_schema(columns)))
            .context(|| "registering the change feed".into())?;
    }
    Ok(Some(crate::sqlutil::statements_sql(&statements)))
}
