//! Reading history: the `as_of('table', value)` table function of `strata query` and of
//! the pipeline's queries.
//!
//! `as_of` is rewritten, before DataFusion plans the query, into a subquery over the table
//! that keeps the rows valid at `value`, using the table's own timeline columns (see
//! [`crate::semantics::timeline`]):
//!
//! - SCD type 2: `valid_from <= value AND (valid_to IS NULL OR value < valid_to)`; a high
//!   open-end marker such as `9999-12-31` needs no special case;
//! - `SNAPSHOTS`: the rows of the latest version at or before `value`.

use crate::error::{EngineError, Result};
use crate::semantics::timeline::Timeline;
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::datafusion::sql::sqlparser;
use sqlparser::ast::{
    Expr, Ident, ObjectName, TableAlias, TableFactor, Value, VisitMut, VisitorMut,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use std::collections::HashMap;
use std::ops::ControlFlow;
use strata_sql::TableName;

const FUNCTION: &str = "as_of";

/// How one historised table answers `as_of`.
struct Historised {
    reference: String,
    snapshots: bool,
    timeline: Timeline,
}

/// `sql` with every `as_of(...)` replaced by its subquery; `None` when there is none.
pub(crate) async fn rewrite_as_of(
    wh: &Warehouse,
    sql: &str,
    schema: &str,
) -> Result<Option<String>> {
    let Some(mut statements) = crate::util::sql::statements_calling(sql, FUNCTION)? else {
        return Ok(None);
    };
    // First pass: which tables are asked for.
    let mut calls = Calls::default();
    for s in statements.iter_mut() {
        if let ControlFlow::Break(e) = s.visit(&mut calls) {
            return Err(e);
        }
    }
    if calls.tables.is_empty() {
        return Ok(None);
    }
    let mut tables: HashMap<String, Historised> = HashMap::new();
    for name in &calls.tables {
        let tn = match name.split_once('.') {
            Some((s, n)) => TableName::new(Some(s), n),
            None => TableName::new(Some(schema), name),
        };
        let table = wh.open_table(&tn).await?.ok_or_else(|| {
            EngineError::NotFound(format!("{FUNCTION}('{name}', ...): no table {tn}"))
        })?;
        let config = crate::storage::table::table_properties(&table)?;
        let snapshots = match config.get("strata.scdType").map(String::as_str) {
            Some("2") => false,
            Some("snapshots") => true,
            _ => {
                return Err(EngineError::plan(format!(
                    "{FUNCTION}('{name}', ...): {tn} keeps no history; as_of reads SCD type 2 \
                     and SNAPSHOTS tables"
                )))
            }
        };
        tables.insert(
            name.clone(),
            Historised {
                reference: format!("{}.{}", quote_ident(&tn.schema), quote_ident(&tn.name)),
                snapshots,
                timeline: Timeline::from_properties(&config)?,
            },
        );
    }
    let mut rewrite = Rewrite {
        tables: &tables,
        error: None,
    };
    for s in statements.iter_mut() {
        let _ = s.visit(&mut rewrite);
    }
    if let Some(e) = rewrite.error {
        return Err(e);
    }
    Ok(Some(crate::util::sql::statements_sql(&statements)))
}

/// [`rewrite_as_of`] for planning only: each `as_of('t', value)` becomes the table `t`
/// itself (same columns), so a query can be planned before `t` exists or has rows.
pub(crate) fn shape_as_of(sql: &str) -> Result<Option<String>> {
    let Some(mut statements) = crate::util::sql::statements_calling(sql, FUNCTION)? else {
        return Ok(None);
    };
    struct Plain {
        error: Option<EngineError>,
    }
    impl VisitorMut for Plain {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            let (table, _) = match as_of_call(factor) {
                None => return ControlFlow::Continue(()),
                Some(Ok(call)) => call,
                Some(Err(e)) => {
                    self.error = Some(e);
                    return ControlFlow::Break(());
                }
            };
            if let TableFactor::Table {
                name, args, alias, ..
            } = factor
            {
                let parts: Vec<Ident> = table
                    .split('.')
                    .map(|p| Ident::with_quote('"', p))
                    .collect();
                if alias.is_none() {
                    *alias = Some(default_alias(&table));
                }
                *name = ObjectName::from(parts);
                *args = None;
            }
            ControlFlow::Continue(())
        }
    }
    let mut plain = Plain { error: None };
    for s in statements.iter_mut() {
        let _ = s.visit(&mut plain);
    }
    match plain.error {
        Some(e) => Err(e),
        None => Ok(Some(crate::util::sql::statements_sql(&statements))),
    }
}

/// The name an `as_of('t', ...)` without an alias is known by in the query: `t`.
fn default_alias(table: &str) -> TableAlias {
    TableAlias {
        explicit: true,
        name: Ident::new(table.rsplit('.').next().unwrap_or(table)),
        columns: Vec::new(),
        at: None,
    }
}

/// The table name and value expression of an `as_of(...)` factor, or `None` for any other.
fn as_of_call(factor: &TableFactor) -> Option<Result<(String, Expr)>> {
    let args = crate::util::sql::table_function_args(factor, FUNCTION)?;
    let usage = || {
        EngineError::plan(format!(
            "{FUNCTION} takes a table name and a value: {FUNCTION}('customers', DATE '2024-01-31')"
        ))
    };
    let Some(exprs) = args else {
        return Some(Err(usage()));
    };
    if exprs.len() != 2 {
        return Some(Err(usage()));
    }
    let table = match exprs[0] {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            _ => return Some(Err(usage())),
        },
        Expr::Identifier(id) => id.value.clone(),
        Expr::CompoundIdentifier(parts) => parts
            .iter()
            .map(|p| p.value.clone())
            .collect::<Vec<_>>()
            .join("."),
        _ => return Some(Err(usage())),
    };
    Some(Ok((table, exprs[1].clone())))
}

#[derive(Default)]
struct Calls {
    tables: Vec<String>,
}

impl VisitorMut for Calls {
    type Break = EngineError;
    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<EngineError> {
        match as_of_call(factor) {
            Some(Ok((t, _))) => {
                if !self.tables.contains(&t) {
                    self.tables.push(t);
                }
                ControlFlow::Continue(())
            }
            Some(Err(e)) => ControlFlow::Break(e),
            None => ControlFlow::Continue(()),
        }
    }
}

struct Rewrite<'a> {
    tables: &'a HashMap<String, Historised>,
    error: Option<EngineError>,
}

impl VisitorMut for Rewrite<'_> {
    type Break = ();
    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let Some(Ok((name, value))) = as_of_call(factor) else {
            return ControlFlow::Continue(());
        };
        let Some(h) = self.tables.get(&name) else {
            return ControlFlow::Continue(());
        };
        let alias = match factor {
            TableFactor::Table { alias: Some(a), .. } => a.clone(),
            _ => default_alias(&name),
        };
        let (t, from, to) = (
            &h.reference,
            quote_ident(&h.timeline.valid_from),
            quote_ident(&h.timeline.valid_to),
        );
        let sql = if h.snapshots {
            format!(
                "SELECT * FROM {t} WHERE {from} = \
                 (SELECT max({from}) FROM {t} WHERE {from} <= ({value}))"
            )
        } else {
            format!(
                "SELECT * FROM {t} WHERE {from} <= ({value}) AND ({to} IS NULL OR ({value}) < {to})"
            )
        };
        match Parser::new(&GenericDialect {})
            .try_with_sql(&sql)
            .and_then(|mut p| p.parse_query())
        {
            Ok(q) => {
                *factor = TableFactor::Derived {
                    lateral: false,
                    subquery: q,
                    alias: Some(alias),
                    sample: None,
                };
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(EngineError::plan(format!("{FUNCTION}: {e}")));
                ControlFlow::Break(())
            }
        }
    }
}
