//! Incremental refresh of a materialized view: when the one table its query reads changed
//! since the last refresh, the view takes the query's result over what changed instead of
//! being recomputed whole, where that gives the same table.
//!
//! The query's shape is read from its logical plan before optimisation:
//!
//! - [`Shape::Rows`]: projections and filters of one table (`SELECT a, f(b) FROM t WHERE
//!   ...`). When the table only gained rows, the result over the new rows is appended.
//! - [`Shape::Groups`]: one `GROUP BY` of such rows with every key among its outputs as a
//!   plain column. When the table only gained rows and the outputs are keys and `count`,
//!   `sum`, `min` and `max` (without `DISTINCT` or `FILTER`), the result over the new rows is
//!   combined per key with the view's rows ([`Grouped::combine`]: counts and sums added, the
//!   least minimum, the greatest maximum). Otherwise (any other aggregate, such as `avg` or
//!   `count(DISTINCT ...)`, or rows deleted and updated in the table) the groups the changed
//!   rows touch are recomputed from the table and replace theirs in the view; the others
//!   stay.
//!
//! - [`Shape::Joined`]: projections and filters of one inner or left equi-join of two such
//!   row sets, with the join's key among the outputs as plain columns (for a left join, the
//!   left side's). A view row comes from input rows of one key value only, so when either
//!   table changed, the key values its changed rows hold (found from its change feed,
//!   before and after each change) are the rows to recompute: the query over both tables
//!   restricted to those keys replaces the view's rows with those keys; the others stay.
//!
//! Anything else is recomputed whole: other joins, unions, windows, `DISTINCT`, `ORDER BY`,
//! `LIMIT`, `HAVING`, subqueries, a global aggregate whose table lost rows, and every
//! expression that is not immutable: `current_timestamp()`, `rand()` and the like must be
//! computed again for every row, as a full refresh does. [`shape_of`] says why.

use deltalake::datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use deltalake::datafusion::common::{JoinType, NullEquality, TableReference};
use deltalake::datafusion::logical_expr::utils::split_conjunction;
use deltalake::datafusion::logical_expr::{
    BinaryExpr, Expr, Join, LogicalPlan, Operator, TableScan, TableSource, Volatility,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a view's query can take what changed in its table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Rows of the table, each from one row: new rows' results are appended.
    Rows,
    /// Groups of the table's rows.
    Groups(Grouped),
    /// Rows of an equi-join of two tables.
    Joined(Joined),
}

/// A join view's key: where it is among the outputs and where it comes from in each table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Joined {
    /// The positions among the outputs of the join's key columns, one per equality of the
    /// join condition, in its order.
    pub(crate) keys: Vec<usize>,
    /// The left and the right side of the join.
    pub(crate) sides: [JoinSide; 2],
}

/// One side of a join view's join: the table it scans and that table's key columns (in
/// the order of [`Joined::keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JoinSide {
    pub(crate) table: TableReference,
    pub(crate) columns: Vec<String>,
}

/// A grouped view's outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grouped {
    /// The positions of the grouping keys among the outputs (every key is one).
    pub(crate) keys: Vec<usize>,
    /// How each output combines with the same group's output over more rows, when every
    /// one does (keys, counts, sums, minimums and maximums).
    pub(crate) combine: Option<Vec<Combine>>,
}

/// What one output column of a grouped view is, and how two partial values of it combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// A grouping key: rows combine when all keys are equal (NULLs equal, as in GROUP BY).
    Key,
    /// A `count` or a `sum`: added.
    Sum,
    Min,
    Max,
}

/// The shape of `plan` (a view's query, unoptimised), or why it must be recomputed.
pub(crate) fn shape_of(plan: &LogicalPlan) -> Result<Shape, &'static str> {
    if let Some(join) = rows_of_one_join(plan) {
        return joined(plan, join).map(Shape::Joined);
    }
    grouped_or_rows(plan).ok_or_else(|| match computes_volatile(plan) {
        true => "it computes an expression that is not immutable (such as current_timestamp())",
        false => {
            "its query is not a projection, filter or GROUP BY of one table or an inner or \
             left equi-join of two"
        }
    })
}

/// Whether `plan` calls a function that is not immutable (`rand()`, `current_timestamp()`).
fn computes_volatile(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        let _ = node.apply_expressions(|e| {
            let _ = e.apply(|e| {
                found |= matches!(e, Expr::ScalarFunction(f)
                    if f.func.signature().volatility != Volatility::Immutable);
                Ok(TreeNodeRecursion::Continue)
            });
            Ok(TreeNodeRecursion::Continue)
        });
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The shape of `plan` when it reads one table.
fn grouped_or_rows(plan: &LogicalPlan) -> Option<Shape> {
    if rows_of_one_scan(plan).is_some() {
        return Some(Shape::Rows);
    }
    let (outputs, aggregate) = match plan {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => (Some(&p.expr), a),
            _ => return None,
        },
        LogicalPlan::Aggregate(a) => (None, a),
        _ => return None,
    };
    rows_of_one_scan(&aggregate.input)?;
    let keys = aggregate.group_expr.len();
    if aggregate
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)) || !immutable(e))
        || !aggregate.aggr_expr.iter().all(immutable_aggregate)
    {
        return None;
    }
    // How each of the aggregate's own outputs combines, if it does.
    let own: Vec<Option<Combine>> = (0..keys)
        .map(|_| Some(Combine::Key))
        .chain(aggregate.aggr_expr.iter().map(aggregate_combine))
        .collect();
    let Some(outputs) = outputs else {
        return Some(Shape::Groups(Grouped {
            keys: (0..keys).collect(),
            combine: own.into_iter().collect(),
        }));
    };
    // A projection over the aggregate: every key as a plain (maybe renamed) column, so that
    // the view's rows can be told apart by key; other outputs any immutable expression of
    // the aggregate's outputs (combinable only when plain columns too).
    let mut key_at = Vec::with_capacity(keys);
    let mut keys_seen = std::collections::BTreeSet::new();
    let mut combine = Vec::with_capacity(outputs.len());
    for (j, e) in outputs.iter().enumerate() {
        match unaliased(e) {
            Expr::Column(column) => {
                let i = aggregate.schema.index_of_column(column).ok()?;
                if i < keys && keys_seen.insert(i) {
                    key_at.push(j);
                }
                combine.push(own[i]);
            }
            e if immutable(e) => combine.push(None),
            _ => return None,
        }
    }
    (keys_seen.len() == keys).then(|| {
        Shape::Groups(Grouped {
            keys: key_at,
            combine: combine.into_iter().collect(),
        })
    })
}

/// The join under `plan` when `plan` is only projections, filters and aliases of that one
/// join, with immutable expressions.
fn rows_of_one_join(plan: &LogicalPlan) -> Option<&Join> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(immutable) => rows_of_one_join(&p.input),
        LogicalPlan::Filter(f) if immutable(&f.predicate) => rows_of_one_join(&f.input),
        LogicalPlan::SubqueryAlias(a) => rows_of_one_join(&a.input),
        LogicalPlan::Join(join) => Some(join),
        _ => None,
    }
}

/// Where the join view's key is, when `join` (the one join under `plan`) is an inner or
/// left join of two tables' rows on equal columns, and `plan` outputs those columns.
fn joined(plan: &LogicalPlan, join: &Join) -> Result<Joined, &'static str> {
    let left_join = match join.join_type {
        JoinType::Inner => false,
        JoinType::Left => true,
        _ => return Err("its join is neither an inner nor a left join"),
    };
    if join.null_equality != NullEquality::NullEqualsNothing
        || join.null_aware
        || !join.filter.as_ref().is_none_or(immutable)
    {
        return Err("its join condition is not immutable or matches NULL keys");
    }
    let (Some(left), Some(right)) = (rows_of_one_scan(&join.left), rows_of_one_scan(&join.right))
    else {
        return Err("a side of its join is not a projection or filter of one table");
    };
    let pairs = equal_columns(join);
    if pairs.is_empty() {
        return Err("its join condition has no equality of a column of each side");
    }
    let left_width = join.left.schema().fields().len();
    // Each output that is a plain column of the join, as the join's output position.
    let outputs: Vec<Option<usize>> = (0..plan.schema().fields().len())
        .map(|i| join_output(plan, i))
        .collect();
    let mut keys = Vec::with_capacity(pairs.len());
    let mut columns = [Vec::new(), Vec::new()];
    for (l, r) in pairs {
        let at = outputs
            .iter()
            .position(|o| *o == Some(l) || (!left_join && *o == Some(left_width + r)));
        let Some(at) = at else {
            return Err(match left_join {
                true => "the left side's join key is not among its outputs as a plain column",
                false => "the join key is not among its outputs as a plain column",
            });
        };
        if join.left.schema().field(l).data_type() != join.right.schema().field(r).data_type() {
            return Err("its join compares columns of different types");
        }
        if plan.schema().field(at).data_type().is_floating() {
            // -0.0 and 0.0 join as equal but are told apart.
            return Err("its join key is a floating-point column");
        }
        let (Some(lc), Some(rc)) = (scan_column(&join.left, l), scan_column(&join.right, r)) else {
            return Err("its join key is not a column of each table");
        };
        keys.push(at);
        columns[0].push(lc);
        columns[1].push(rc);
    }
    let [lc, rc] = columns;
    Ok(Joined {
        keys,
        sides: [
            JoinSide {
                table: left.table_name.clone(),
                columns: lc,
            },
            JoinSide {
                table: right.table_name.clone(),
                columns: rc,
            },
        ],
    })
}

/// The pairs of a column of the left side and one of the right that `join` requires equal
/// (in `USING` or `ON`, `=` between the conjuncts), as positions in each side's outputs.
fn equal_columns(join: &Join) -> Vec<(usize, usize)> {
    let (left, right) = (join.left.schema(), join.right.schema());
    let pair = |a: &Expr, b: &Expr| match (a, b) {
        (Expr::Column(a), Expr::Column(b)) => {
            match (left.index_of_column(a), right.index_of_column(b)) {
                (Ok(l), Ok(r)) => Some((l, r)),
                _ => match (left.index_of_column(b), right.index_of_column(a)) {
                    (Ok(l), Ok(r)) => Some((l, r)),
                    _ => None,
                },
            }
        }
        _ => None,
    };
    let mut out: Vec<(usize, usize)> = join.on.iter().filter_map(|(a, b)| pair(a, b)).collect();
    if let Some(filter) = &join.filter {
        for e in split_conjunction(filter) {
            if let Expr::BinaryExpr(BinaryExpr {
                left: a,
                op: Operator::Eq,
                right: b,
            }) = e
            {
                out.extend(pair(a, b));
            }
        }
    }
    out.dedup();
    out
}

/// The position in the one join's output under `plan` that `plan`'s output `i` is, when
/// it is that column passed on unchanged (maybe renamed).
fn join_output(plan: &LogicalPlan, i: usize) -> Option<usize> {
    match plan {
        LogicalPlan::Projection(p) => match unaliased(p.expr.get(i)?) {
            Expr::Column(c) => join_output(&p.input, p.input.schema().index_of_column(c).ok()?),
            _ => None,
        },
        LogicalPlan::Filter(f) => join_output(&f.input, i),
        LogicalPlan::SubqueryAlias(a) => join_output(&a.input, i),
        LogicalPlan::Join(_) => Some(i),
        _ => None,
    }
}

/// The name of the table column that `plan`'s output `i` is, passed on unchanged through
/// projections, filters and aliases of one scan.
fn scan_column(plan: &LogicalPlan, i: usize) -> Option<String> {
    match plan {
        LogicalPlan::Projection(p) => match unaliased(p.expr.get(i)?) {
            Expr::Column(c) => scan_column(&p.input, p.input.schema().index_of_column(c).ok()?),
            _ => None,
        },
        LogicalPlan::Filter(f) => scan_column(&f.input, i),
        LogicalPlan::SubqueryAlias(a) => scan_column(&a.input, i),
        LogicalPlan::TableScan(s) => Some(s.projected_schema.field(i).name().clone()),
        _ => None,
    }
}

/// The table scan under `plan` when `plan` is only projections, filters and aliases of that
/// one scan, with immutable expressions.
pub(crate) fn rows_of_one_scan(plan: &LogicalPlan) -> Option<&TableScan> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(immutable) => rows_of_one_scan(&p.input),
        LogicalPlan::Filter(f) if immutable(&f.predicate) => rows_of_one_scan(&f.input),
        LogicalPlan::SubqueryAlias(a) => rows_of_one_scan(&a.input),
        LogicalPlan::TableScan(scan) if scan.fetch.is_none() && scan.filters.is_empty() => {
            Some(scan)
        }
        _ => None,
    }
}

/// `e` without the names given to it (`count(*) AS n` is planned as two aliases).
fn unaliased(mut e: &Expr) -> &Expr {
    while let Expr::Alias(a) = e {
        e = a.expr.as_ref();
    }
    e
}

/// How an aggregate's partial results combine, if they do.
fn aggregate_combine(e: &Expr) -> Option<Combine> {
    let Expr::AggregateFunction(f) = unaliased(e) else {
        return None;
    };
    let p = &f.params;
    if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
        return None;
    }
    match f.func.name() {
        "count" | "sum" => Some(Combine::Sum),
        "min" => Some(Combine::Min),
        "max" => Some(Combine::Max),
        _ => None,
    }
}

/// Whether `e` is an aggregate whose arguments, filter and order are immutable.
fn immutable_aggregate(e: &Expr) -> bool {
    let Expr::AggregateFunction(f) = unaliased(e) else {
        return false;
    };
    let p = &f.params;
    p.args.iter().all(immutable)
        && p.filter.as_deref().is_none_or(immutable)
        && p.order_by.iter().all(|s| immutable(&s.expr))
}

/// Whether `e` gives the same value for the same row every time: no volatile or stable
/// function (`rand()`, `current_timestamp()`), no subquery, no window.
fn immutable(e: &Expr) -> bool {
    let mut ok = true;
    let _ = e.apply(|e| {
        ok &= match e {
            Expr::ScalarFunction(f) => f.func.signature().volatility == Volatility::Immutable,
            Expr::ScalarSubquery(_)
            | Expr::Exists(_)
            | Expr::InSubquery(_)
            | Expr::WindowFunction(_)
            | Expr::AggregateFunction(_)
            | Expr::Placeholder(_)
            | Expr::OuterReferenceColumn(..) => false,
            _ => true,
        };
        Ok(match ok {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    });
    ok
}

/// `plan` with its one table scan reading `source` (the same table's new rows) instead.
pub(crate) fn with_scan_of(
    plan: LogicalPlan,
    source: Arc<dyn TableSource>,
) -> deltalake::datafusion::error::Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::TableScan(scan) => Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
            source: source.clone(),
            ..scan
        }))),
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// The query that combines a grouped view's rows with the new rows' result, both in the
/// table `input` with the view's columns `names` (in order, as `combine` describes them).
pub(crate) fn combine_sql(input: &str, names: &[String], combine: &[Combine]) -> String {
    let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let select: Vec<String> = names
        .iter()
        .zip(combine)
        .map(|(n, c)| match c {
            Combine::Key => quote(n),
            Combine::Sum => format!("sum({q}) AS {q}", q = quote(n)),
            Combine::Min => format!("min({q}) AS {q}", q = quote(n)),
            Combine::Max => format!("max({q}) AS {q}", q = quote(n)),
        })
        .collect();
    let keys: Vec<String> = names
        .iter()
        .zip(combine)
        .filter(|(_, c)| **c == Combine::Key)
        .map(|(n, _)| quote(n))
        .collect();
    let mut sql = format!("SELECT {} FROM {}", select.join(", "), quote(input));
    if !keys.is_empty() {
        sql.push_str(" GROUP BY ");
        sql.push_str(&keys.join(", "));
    }
    sql
}

/// The rows of `table` (the view's `held` or the `recomputed` ones) whose keys are among
/// `touched`'s, keys compared as GROUP BY compares them (NULLs equal).
pub(crate) fn touched_rows_sql(
    table: &str,
    touched: &str,
    names: &[String],
    keys: &[usize],
) -> String {
    let (columns, matches) = key_match(names, keys, "v");
    let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    format!(
        "SELECT {columns} FROM {table} v WHERE EXISTS (SELECT 1 FROM {touched} t WHERE {matches})",
        table = quote(table),
        touched = quote(touched),
    )
}

/// The column list of `side` and its keys' match with `t` (the touched keys).
fn key_match(names: &[String], keys: &[usize], side: &str) -> (String, String) {
    let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let matches = keys
        .iter()
        .map(|&k| {
            let n = quote(&names[k]);
            // In parentheses: the SQL parser binds `AND` tighter than `IS NOT DISTINCT
            // FROM`, which would compare a key with the conjunction of the next.
            format!("(t.{n} IS NOT DISTINCT FROM {side}.{n})")
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    let columns = names
        .iter()
        .map(|n| format!("{side}.{}", quote(n)))
        .collect::<Vec<_>>()
        .join(", ");
    (columns, matches)
}

/// The query that puts the groups the changed rows touched (`touched`: their keys) in place
/// of the view's (`held`): the recomputed groups (`recomputed`) that were touched, and the
/// held groups that were not. Keys compare as GROUP BY compares them (NULLs equal).
pub(crate) fn regroup_sql(
    held: &str,
    recomputed: &str,
    touched: &str,
    names: &[String],
    keys: &[usize],
) -> String {
    let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let matches = |side: &str| key_match(names, keys, side).1;
    let columns = |side: &str| key_match(names, keys, side).0;
    format!(
        "SELECT {r} FROM {recomputed} r WHERE EXISTS (SELECT 1 FROM {touched} t WHERE {rm}) \
         UNION ALL \
         SELECT {h} FROM {held} h WHERE NOT EXISTS (SELECT 1 FROM {touched} t WHERE {hm})",
        r = columns("r"),
        h = columns("h"),
        recomputed = quote(recomputed),
        held = quote(held),
        touched = quote(touched),
        rm = matches("r"),
        hm = matches("h"),
    )
}

/// A table read by the view whose version changed since the last refresh: its name as the
/// inputs spell it, the version the last refresh read and the one read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Growth {
    pub(crate) table: String,
    pub(crate) from: i64,
    pub(crate) until: i64,
}

/// The tables that grew between the inputs of the last refresh and now, when nothing else
/// changed (the same query, no file reads, the same tables, none older, one newer at
/// least); or why the view must be recomputed.
pub(crate) fn tables_grown(
    last: &serde_json::Value,
    now: &serde_json::Value,
) -> Result<Vec<Growth>, &'static str> {
    if last.get("query") != now.get("query") {
        return Err("its query changed");
    }
    if last.get("files").is_some() || now.get("files").is_some() {
        return Err("it reads files");
    }
    let versions = |v: &serde_json::Value| -> Option<BTreeMap<String, i64>> {
        v.get("versions")?
            .as_object()?
            .iter()
            .map(|(t, v)| Some((t.clone(), v.as_i64()?)))
            .collect()
    };
    let (Some(last), Some(now)) = (versions(last), versions(now)) else {
        return Err("its last refresh recorded no versions");
    };
    if !last.keys().eq(now.keys()) {
        return Err("it reads other tables than at its last refresh");
    }
    let mut grown = Vec::new();
    for ((table, &from), &until) in last.iter().zip(now.values()) {
        if from < 0 || until < from {
            return Err("a table it reads was created again since its last refresh");
        }
        if from < until {
            grown.push(Growth {
                table: table.clone(),
                from,
                until,
            });
        }
    }
    match grown.is_empty() {
        true => Err("nothing it reads grew"),
        false => Ok(grown),
    }
}

/// The one table of `grown` when the view reads only that one (`reads` tables in all).
pub(crate) fn only_table(grown: Vec<Growth>, reads: usize) -> Result<Growth, &'static str> {
    match (reads, <[Growth; 1]>::try_from(grown)) {
        (1, Ok([one])) => Ok(one),
        _ => Err("its query reads more than one table and is not a join of two"),
    }
}

/// The version of `table` (as the inputs spell it) that the inputs `now` record.
pub(crate) fn version_in(now: &serde_json::Value, table: &str) -> Option<i64> {
    now.get("versions")?.get(table)?.as_i64()
}

/// The query that keeps the distinct key values of `input` (columns `names`).
pub(crate) fn distinct_sql(input: &str, names: &[String]) -> String {
    let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let columns: Vec<String> = names.iter().map(|n| quote(n)).collect();
    format!(
        "SELECT DISTINCT {} FROM {}",
        columns.join(", "),
        quote(input)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::datafusion::datasource::MemTable;
    use deltalake::datafusion::prelude::SessionContext;

    async fn plan(sql: &str) -> LogicalPlan {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("city", DataType::Utf8, true),
            Field::new("km", DataType::Int64, true),
        ]));
        let t = MemTable::try_new(schema.clone(), vec![vec![]]).unwrap();
        ctx.register_table("rides", Arc::new(t)).unwrap();
        ctx.register_table(
            "rides2",
            Arc::new(MemTable::try_new(schema.clone(), vec![vec![]]).unwrap()),
        )
        .unwrap();
        ctx.register_table(
            "other",
            Arc::new(
                MemTable::try_new(
                    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
                    vec![vec![]],
                )
                .unwrap(),
            ),
        )
        .unwrap();
        ctx.sql(sql).await.unwrap().into_unoptimized_plan()
    }

    fn groups(keys: &[usize], combine: Option<Vec<Combine>>) -> Shape {
        Shape::Groups(Grouped {
            keys: keys.to_vec(),
            combine,
        })
    }

    async fn shape(sql: &str) -> Result<Shape, &'static str> {
        shape_of(&plan(sql).await)
    }

    #[tokio::test]
    async fn projections_and_filters_of_one_table_append() {
        for sql in [
            "SELECT * FROM rides",
            "SELECT id, upper(city) AS c FROM rides WHERE km > 0",
            "SELECT r.id FROM (SELECT * FROM rides WHERE km > 0) r WHERE r.id < 10",
        ] {
            assert_eq!(shape(sql).await.ok(), Some(Shape::Rows), "{sql}");
        }
    }

    #[tokio::test]
    async fn keyed_counts_sums_minimums_and_maximums_combine() {
        assert_eq!(
            shape("SELECT city, count(*) AS n, sum(km) AS km, min(km) AS lo, max(km) AS hi FROM rides WHERE km > 0 GROUP BY city").await.ok(),
            Some(groups(&[0], Some(vec![Combine::Key, Combine::Sum, Combine::Sum, Combine::Min, Combine::Max])))
        );
        // Outputs reordered, a key computed, a global aggregate.
        assert_eq!(
            shape("SELECT sum(km) AS km, lower(city) AS c FROM rides GROUP BY lower(city)")
                .await
                .ok(),
            Some(groups(&[1], Some(vec![Combine::Sum, Combine::Key])))
        );
        assert_eq!(
            shape("SELECT count(*) AS n FROM rides").await.ok(),
            Some(groups(&[], Some(vec![Combine::Sum])))
        );
    }

    #[tokio::test]
    async fn other_aggregates_of_keyed_groups_are_regrouped() {
        for (sql, keys) in [
            ("SELECT city, avg(km) AS a FROM rides GROUP BY city", [0]),
            (
                "SELECT count(DISTINCT id) AS n, city FROM rides GROUP BY city",
                [1],
            ),
            (
                "SELECT city, count(*) + 1 AS n FROM rides GROUP BY city",
                [0],
            ),
        ] {
            assert_eq!(shape(sql).await.ok(), Some(groups(&keys, None)), "{sql}");
        }
    }

    #[tokio::test]
    async fn everything_else_is_recomputed() {
        for sql in [
            "SELECT DISTINCT city FROM rides",
            "SELECT * FROM rides ORDER BY id",
            "SELECT * FROM rides LIMIT 3",
            "SELECT id, current_timestamp() AS at FROM rides",
            "SELECT id, random() AS r FROM rides",
            "SELECT city, count(*) AS n FROM rides GROUP BY city HAVING count(*) > 1",
            "SELECT count(*) AS n FROM rides GROUP BY city",
            "SELECT id, row_number() OVER (ORDER BY km) AS r FROM rides",
            "SELECT * FROM rides UNION ALL SELECT * FROM rides",
            "SELECT * FROM rides WHERE id IN (SELECT id FROM other)",
            "SELECT city, sum(km) AS s FROM rides GROUP BY ROLLUP(city)",
        ] {
            assert_eq!(shape(sql).await.ok(), None, "{sql}");
        }
    }

    #[tokio::test]
    async fn recomputation_says_why() {
        for (sql, why) in [
            ("SELECT id, current_timestamp() AS at FROM rides", "it computes an expression that is not immutable (such as current_timestamp())"),
            ("SELECT DISTINCT city FROM rides", "its query is not a projection, filter or GROUP BY of one table or an inner or left equi-join of two"),
        ] {
            assert_eq!(shape(sql).await, Err(why), "{sql}");
        }
    }

    #[test]
    fn regrouping_replaces_touched_groups_only() {
        let names = ["city", "n"].map(String::from);
        assert_eq!(
            regroup_sql("held", "new", "touched", &names, &[0]),
            "SELECT r.\"city\", r.\"n\" FROM \"new\" r WHERE EXISTS (SELECT 1 FROM \"touched\" t \
             WHERE (t.\"city\" IS NOT DISTINCT FROM r.\"city\")) UNION ALL SELECT h.\"city\", h.\"n\" \
             FROM \"held\" h WHERE NOT EXISTS (SELECT 1 FROM \"touched\" t WHERE (t.\"city\" IS NOT \
             DISTINCT FROM h.\"city\"))"
        );
        // Keys of several columns: each comparison in parentheses.
        let names = ["a", "b", "n"].map(String::from);
        assert!(regroup_sql("held", "new", "touched", &names, &[0, 1]).contains(
            "WHERE (t.\"a\" IS NOT DISTINCT FROM h.\"a\") AND (t.\"b\" IS NOT DISTINCT FROM h.\"b\"))"
        ));
    }

    #[test]
    fn combining_sums_keys_and_extremes() {
        let names = ["city", "n", "lo", "hi"].map(String::from);
        let combine = [Combine::Key, Combine::Sum, Combine::Min, Combine::Max];
        assert_eq!(
            combine_sql("both", &names, &combine),
            "SELECT \"city\", sum(\"n\") AS \"n\", min(\"lo\") AS \"lo\", max(\"hi\") AS \"hi\" \
             FROM \"both\" GROUP BY \"city\""
        );
        assert_eq!(
            combine_sql("both", &["n".to_string()], &[Combine::Sum]),
            "SELECT sum(\"n\") AS \"n\" FROM \"both\""
        );
    }

    #[test]
    fn only_tables_that_grew_with_the_same_query_qualify() {
        let v = |q: &str, versions: serde_json::Value| serde_json::json!({ "query": q, "versions": versions });
        let grown = |table: &str, from, until| Growth {
            table: table.into(),
            from,
            until,
        };
        let last = v(
            "SELECT 1",
            serde_json::json!({ "default.t": 3, "default.u": 1 }),
        );
        assert_eq!(
            tables_grown(
                &last,
                &v(
                    "SELECT 1",
                    serde_json::json!({ "default.t": 5, "default.u": 1 })
                )
            ),
            Ok(vec![grown("default.t", 3, 5)])
        );
        assert_eq!(
            tables_grown(
                &last,
                &v(
                    "SELECT 1",
                    serde_json::json!({ "default.t": 4, "default.u": 2 })
                )
            ),
            Ok(vec![grown("default.t", 3, 4), grown("default.u", 1, 2)])
        );
        for (now, why) in [
            (
                v(
                    "SELECT 2",
                    serde_json::json!({ "default.t": 5, "default.u": 1 }),
                ),
                "its query changed",
            ),
            (
                v(
                    "SELECT 1",
                    serde_json::json!({ "default.t": 2, "default.u": 1 }),
                ),
                "a table it reads was created again since its last refresh",
            ),
            (
                v("SELECT 1", serde_json::json!({ "default.t": 5 })),
                "it reads other tables than at its last refresh",
            ),
            (
                v(
                    "SELECT 1",
                    serde_json::json!({ "default.t": 5, "default.v": 1 }),
                ),
                "it reads other tables than at its last refresh",
            ),
            (
                v(
                    "SELECT 1",
                    serde_json::json!({ "default.t": 3, "default.u": 1 }),
                ),
                "nothing it reads grew",
            ),
            (
                serde_json::json!({ "query": "SELECT 1", "versions": { "default.t": 5, "default.u": 1 }, "files": [] }),
                "it reads files",
            ),
        ] {
            assert_eq!(tables_grown(&last, &now), Err(why), "{now}");
        }
        assert_eq!(
            only_table(vec![grown("default.t", 3, 5)], 1),
            Ok(grown("default.t", 3, 5))
        );
        assert!(only_table(vec![grown("default.t", 3, 5)], 2).is_err());
        assert!(only_table(vec![grown("default.t", 3, 5), grown("default.u", 1, 2)], 2).is_err());
    }

    fn side(table: &str, columns: &[&str]) -> JoinSide {
        JoinSide {
            table: TableReference::bare(table),
            columns: columns.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn joined(keys: &[usize], left: JoinSide, right: JoinSide) -> Result<Shape, &'static str> {
        Ok(Shape::Joined(Joined {
            keys: keys.to_vec(),
            sides: [left, right],
        }))
    }

    #[tokio::test]
    async fn equi_joins_with_their_key_among_the_outputs_are_rejoined() {
        let plain = |sql: &'static str, keys: &'static [usize]| {
            (sql, keys, side("rides", &["id"]), side("other", &["id"]))
        };
        for (sql, keys, left, right) in [
            plain("SELECT r.id, r.city, o.id AS oid FROM rides r JOIN other o ON r.id = o.id", &[0]),
            // The right side's key of an inner join, equal to the left's; reversed equality.
            plain("SELECT o.id AS k, r.km FROM rides r JOIN other o ON o.id = r.id WHERE r.km > 1", &[0]),
            plain("SELECT r.km, r.id FROM rides r LEFT JOIN other o ON r.id = o.id AND r.km > 2", &[1]),
            // DataFusion's `*` of a join USING a key gives the right side's key column.
            plain("SELECT * FROM rides JOIN other USING (id)", &[2]),
            plain("SELECT x.id FROM (SELECT id, km FROM rides WHERE km > 0) x JOIN other o ON x.id = o.id", &[0]),
            (
                "SELECT r.city, r.id, p.km FROM rides r JOIN rides2 p ON r.id = p.id AND r.city = p.city",
                &[1, 0],
                side("rides", &["id", "city"]),
                side("rides2", &["id", "city"]),
            ),
        ] {
            assert_eq!(shape(sql).await, joined(keys, left, right), "{sql}");
        }
    }

    #[tokio::test]
    async fn other_joins_say_why_they_are_recomputed() {
        for (sql, why) in [
            ("SELECT r.city FROM rides r JOIN other o ON r.id = o.id", "the join key is not among its outputs as a plain column"),
            ("SELECT o.id FROM rides r LEFT JOIN other o ON r.id = o.id", "the left side's join key is not among its outputs as a plain column"),
            ("SELECT * FROM rides LEFT JOIN other USING (id)", "the left side's join key is not among its outputs as a plain column"),
            ("SELECT r.id + 1 AS k FROM rides r JOIN other o ON r.id = o.id", "the join key is not among its outputs as a plain column"),
            ("SELECT r.id FROM rides r RIGHT JOIN other o ON r.id = o.id", "its join is neither an inner nor a left join"),
            ("SELECT r.id FROM rides r FULL JOIN other o ON r.id = o.id", "its join is neither an inner nor a left join"),
            ("SELECT r.id FROM rides r JOIN other o ON r.id < o.id", "its join condition has no equality of a column of each side"),
            ("SELECT r.id FROM rides r JOIN other o ON r.id + 1 = o.id", "its join condition has no equality of a column of each side"),
            ("SELECT r.id FROM rides r JOIN other o ON r.id = o.id AND random() > 0.5", "its join condition is not immutable or matches NULL keys"),
            ("SELECT r.id FROM rides r JOIN (SELECT id, count(*) AS n FROM other GROUP BY id) o ON r.id = o.id", "a side of its join is not a projection or filter of one table"),
            ("SELECT r.id FROM rides r JOIN other o ON r.id = o.id JOIN rides2 p ON p.id = r.id", "a side of its join is not a projection or filter of one table"),
        ] {
            assert_eq!(shape(sql).await, Err(why), "{sql}");
        }
    }

    #[test]
    fn distinct_keys() {
        assert_eq!(
            distinct_sql("touched", &["id".to_string(), "a\"b".to_string()]),
            "SELECT DISTINCT \"id\", \"a\"\"b\" FROM \"touched\""
        );
    }
}
