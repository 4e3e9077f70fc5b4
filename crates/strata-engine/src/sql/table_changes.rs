//! `table_changes('t', from[, to])` in queries: replaced by the change data feed of `t`
//! (read by `storage/feed.rs`) registered in the session.

use crate::error::{Context, EngineError, Result};
use crate::storage::feed::feed_schema;
use crate::storage::feed::read_feed;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::sql::sqlparser;
use sqlparser::ast::{
    Expr, Ident, ObjectName, TableAlias, TableFactor, Value, VisitMut, VisitorMut,
};
use std::ops::ControlFlow;
use strata_sql::TableName;

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
    let args = crate::util::sql::table_function_args(factor, FUNCTION)?;
    let usage = || {
        EngineError::plan(format!(
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
    let Some(mut statements) = crate::util::sql::statements_calling(sql, FUNCTION)? else {
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
    wh: &crate::storage::warehouse::Warehouse,
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
            return Err(EngineError::plan(format!(
                "{FUNCTION}('{}', {}): the table's latest version is {latest}",
                call.table, call.from
            )));
        }
        let feed = read_feed(&table, Some(call.from - 1), call.to, true).await?;
        let _ = ctx.deregister_table(format!("__strata_changes_{i}").as_str());
        ctx.register_batch(format!("__strata_changes_{i}").as_str(), feed)
            .context(|| "registering the change feed".into())?;
    }
    Ok(Some(crate::util::sql::statements_sql(&statements)))
}

/// [`rewrite_table_changes`] for planning only: each call becomes an empty table with the
/// columns of its table's feed, the table's columns taken from `shapes`.
pub(crate) fn shape_table_changes(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    sql: &str,
    schema: &str,
    shapes: &crate::sql::shapes::Shapes,
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
    Ok(Some(crate::util::sql::statements_sql(&statements)))
}
