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
//! Anything else is recomputed whole: joins, unions, windows, `DISTINCT`, `ORDER BY`,
//! `LIMIT`, `HAVING`, subqueries, a global aggregate whose table lost rows, and every
//! expression that is not immutable: `current_timestamp()`, `rand()` and the like must be
//! computed again for every row, as a full refresh does.

use deltalake::datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use deltalake::datafusion::logical_expr::{Expr, LogicalPlan, TableScan, TableSource, Volatility};
use std::sync::Arc;

/// How a view's query can take what changed in its table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Rows of the table, each from one row: new rows' results are appended.
    Rows,
    /// Groups of the table's rows.
    Groups(Grouped),
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

/// The shape of `plan` (a view's query, unoptimised), or `None` when it must be recomputed.
pub(crate) fn shape_of(plan: &LogicalPlan) -> Option<Shape> {
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
    let matches = |side: &str| {
        keys.iter()
            .map(|&k| {
                let n = quote(&names[k]);
                format!("t.{n} IS NOT DISTINCT FROM {side}.{n}")
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    let columns = |side: &str| {
        names
            .iter()
            .map(|n| format!("{side}.{}", quote(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
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

/// The one table whose version changed between the inputs of the last refresh and now,
/// when nothing else changed (the same query, no file reads, the same tables, one of them
/// newer): its name as the inputs spell it, the version the last refresh read and the one
/// read now.
pub(crate) fn only_one_table_grew(
    last: &serde_json::Value,
    now: &serde_json::Value,
) -> Option<(String, i64, i64)> {
    if last.get("query") != now.get("query") || last.get("files").is_some() {
        return None;
    }
    if now.get("files").is_some() {
        return None;
    }
    let (last, now) = (
        last.get("versions")?.as_object()?,
        now.get("versions")?.as_object()?,
    );
    if last.len() != 1 || now.len() != 1 {
        return None;
    }
    let (table, was) = last.iter().next()?;
    let is = now.get(table)?.as_i64()?;
    let was = was.as_i64()?;
    (was >= 0 && was < is).then(|| (table.clone(), was, is))
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
        let t = MemTable::try_new(schema, vec![vec![]]).unwrap();
        ctx.register_table("rides", Arc::new(t)).unwrap();
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

    async fn shape(sql: &str) -> Option<Shape> {
        shape_of(&plan(sql).await)
    }

    #[tokio::test]
    async fn projections_and_filters_of_one_table_append() {
        for sql in [
            "SELECT * FROM rides",
            "SELECT id, upper(city) AS c FROM rides WHERE km > 0",
            "SELECT r.id FROM (SELECT * FROM rides WHERE km > 0) r WHERE r.id < 10",
        ] {
            assert_eq!(shape(sql).await, Some(Shape::Rows), "{sql}");
        }
    }

    #[tokio::test]
    async fn keyed_counts_sums_minimums_and_maximums_combine() {
        assert_eq!(
            shape("SELECT city, count(*) AS n, sum(km) AS km, min(km) AS lo, max(km) AS hi FROM rides WHERE km > 0 GROUP BY city").await,
            Some(groups(&[0], Some(vec![Combine::Key, Combine::Sum, Combine::Sum, Combine::Min, Combine::Max])))
        );
        // Outputs reordered, a key computed, a global aggregate.
        assert_eq!(
            shape("SELECT sum(km) AS km, lower(city) AS c FROM rides GROUP BY lower(city)").await,
            Some(groups(&[1], Some(vec![Combine::Sum, Combine::Key])))
        );
        assert_eq!(
            shape("SELECT count(*) AS n FROM rides").await,
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
            assert_eq!(shape(sql).await, Some(groups(&keys, None)), "{sql}");
        }
    }

    #[tokio::test]
    async fn everything_else_is_recomputed() {
        for sql in [
            "SELECT * FROM rides r JOIN other o ON r.id = o.id",
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
            assert_eq!(shape(sql).await, None, "{sql}");
        }
    }

    #[test]
    fn regrouping_replaces_touched_groups_only() {
        let names = ["city", "n"].map(String::from);
        assert_eq!(
            regroup_sql("held", "new", "touched", &names, &[0]),
            "SELECT r.\"city\", r.\"n\" FROM \"new\" r WHERE EXISTS (SELECT 1 FROM \"touched\" t \
             WHERE t.\"city\" IS NOT DISTINCT FROM r.\"city\") UNION ALL SELECT h.\"city\", h.\"n\" \
             FROM \"held\" h WHERE NOT EXISTS (SELECT 1 FROM \"touched\" t WHERE t.\"city\" IS NOT \
             DISTINCT FROM h.\"city\")"
        );
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
    fn only_a_grown_single_table_with_the_same_query_qualifies() {
        let v = |q: &str, versions: serde_json::Value| serde_json::json!({ "query": q, "versions": versions });
        let last = v("SELECT 1", serde_json::json!({ "default.t": 3 }));
        assert_eq!(
            only_one_table_grew(&last, &v("SELECT 1", serde_json::json!({ "default.t": 5 }))),
            Some(("default.t".into(), 3, 5))
        );
        for now in [
            v("SELECT 2", serde_json::json!({ "default.t": 5 })),
            v("SELECT 1", serde_json::json!({ "default.t": 2 })),
            v("SELECT 1", serde_json::json!({ "default.u": 5 })),
            v(
                "SELECT 1",
                serde_json::json!({ "default.t": 5, "default.u": 1 }),
            ),
            serde_json::json!({ "query": "SELECT 1", "versions": { "default.t": 5 }, "files": [] }),
        ] {
            assert_eq!(only_one_table_grew(&last, &now), None, "{now}");
        }
    }
}
