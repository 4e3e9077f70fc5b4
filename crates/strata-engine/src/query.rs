//! Reading a warehouse: SQL over all its tables, and the SCD2 integrity check.

use crate::error::{Context, EngineError, Result};
use crate::flow::register_table;
use crate::sqlutil::quote_ident;
use crate::sqlutil::{self, Bounds, Ordered};
use crate::timeline::Timeline;
use crate::warehouse::{new_session, Warehouse};
use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::catalog::MemorySchemaProvider;
use deltalake::datafusion::prelude::SessionContext;
use std::cmp::Ordering;
use std::sync::Arc;
use strata_sql::TableName;

/// A session where every table of `wh` is registered as `schema.name` (and `name` for the
/// default schema).
pub(crate) async fn warehouse_session(wh: &Warehouse) -> Result<SessionContext> {
    warehouse_session_in(wh, TableName::DEFAULT_SCHEMA).await
}

/// [`warehouse_session`] whose unqualified table names are in `schema`.
pub(crate) async fn warehouse_session_in(wh: &Warehouse, schema: &str) -> Result<SessionContext> {
    let ctx = crate::warehouse::new_session_in(schema);
    let tables = wh.list_tables()?;
    let log = TableName::new(None, crate::event_log::EVENT_LOG_TABLE);
    if !tables.contains(&log) {
        if let Some(t) = crate::warehouse::open_delta(&crate::event_log::path(wh)).await? {
            register_table(&ctx, crate::event_log::EVENT_LOG_TABLE, &t, None).await?;
        }
    }
    for name in tables {
        let reference = reference_in(&ctx, &name)?;
        if let Some(table) = wh.open_table(&name).await? {
            register_table(&ctx, &reference, &table, None).await?;
        }
    }
    Ok(ctx)
}

/// How `name` is addressed in `ctx` (`"schema"."name"`), its schema added to the session's
/// catalog first when the session does not have it yet.
pub(crate) fn reference_in(ctx: &SessionContext, name: &TableName) -> Result<String> {
    let catalog = ctx
        .catalog("strata")
        .ok_or_else(|| EngineError::Internal("catalog strata missing".into()))?;
    if catalog.schema(&name.schema).is_none() {
        catalog
            .register_schema(&name.schema, Arc::new(MemorySchemaProvider::new()))
            .context(|| format!("registering schema {}", name.schema))?;
    }
    Ok(format!(
        "{}.{}",
        quote_ident(&name.schema),
        quote_ident(&name.name)
    ))
}

/// `sql` with strata's table functions (`as_of`, `table_changes`) replaced by what they
/// read, registered in `ctx` where needed.
pub(crate) async fn rewrite(
    wh: &Warehouse,
    ctx: &SessionContext,
    sql: &str,
    schema: &str,
) -> Result<String> {
    let sql = crate::history::rewrite_as_of(wh, sql, schema)
        .await?
        .unwrap_or_else(|| sql.to_string());
    Ok(crate::changes::rewrite_table_changes(wh, ctx, &sql, schema)
        .await?
        .unwrap_or(sql))
}

/// The columns of the tables a query reads, by table: enough to plan the query before the
/// tables have rows (or exist), as a pipeline is checked before it runs.
pub(crate) type Shapes = std::collections::BTreeMap<TableName, SchemaRef>;

/// [`rewrite`] for planning only: `as_of` reads its table's columns, `table_changes` an
/// empty feed of its table's columns (from `shapes`).
pub(crate) fn rewrite_shape(
    ctx: &SessionContext,
    sql: &str,
    schema: &str,
    shapes: &Shapes,
) -> Result<String> {
    let sql = crate::history::shape_as_of(sql)?.unwrap_or_else(|| sql.to_string());
    Ok(crate::changes::shape_table_changes(ctx, &sql, schema, shapes)?.unwrap_or(sql))
}

/// A session for planning a query over `shapes`: each table is registered empty, with its
/// columns, as `schema.name` (and `name` for the tables of `default_schema`).
pub(crate) fn shape_session(default_schema: &str, shapes: &Shapes) -> Result<SessionContext> {
    let ctx = crate::warehouse::new_session_in(default_schema);
    for (name, columns) in shapes {
        let reference = reference_in(&ctx, name)?;
        ctx.register_batch(&reference, RecordBatch::new_empty(columns.clone()))
            .context(|| format!("registering {name}"))?;
    }
    Ok(ctx)
}

/// Runs `sql` over every table of `wh`.
pub async fn query(wh: &Warehouse, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let ctx = warehouse_session(wh).await?;
    let sql = rewrite(wh, &ctx, sql, TableName::DEFAULT_SCHEMA).await?;
    let df = ctx
        .sql(&sql)
        .await
        .map_err(|e| EngineError::Plan(format!("query: {e}")))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::Plan(format!("query: {e}")))?;
    Ok((schema, batches))
}

/// One broken invariant of an SCD2 table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `userId=123`
    pub key: String,
    pub problem: String,
}

/// Checks an SCD2 table: at most one open version per key, no overlapping intervals,
/// `__START_AT < __END_AT`.
pub async fn validate(wh: &Warehouse, name: &str) -> Result<Vec<Violation>> {
    let table_name = match name.split_once('.') {
        Some((s, n)) => TableName::new(Some(s), n),
        None => TableName::new(None, name),
    };
    let table = wh.open_table(&table_name).await?.ok_or_else(|| {
        EngineError::NotFound(format!("no table {table_name} in {}", wh.root().display()))
    })?;
    let config = crate::warehouse::table_properties(&table)?;
    let keys: Vec<String> = config
        .get("strata.keys")
        .map(|k| k.split(',').map(str::to_string).collect())
        .ok_or_else(|| {
            EngineError::Plan(format!(
                "{table_name} is not an AUTO CDC target of strata (no strata.keys property)"
            ))
        })?;
    let mode = config.get("strata.scdType").cloned().unwrap_or_default();
    if mode != "2" && mode != "snapshots" {
        return Err(EngineError::Plan(format!(
            "{table_name} is not an SCD type 2 or SNAPSHOTS table; validate checks timelines"
        )));
    }
    let timeline = Timeline::from_properties(&config)?;
    let ctx = new_session();
    register_table(&ctx, "t", &table, None).await?;
    let k = keys
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {k}, {}, {} FROM t",
        quote_ident(&timeline.valid_from),
        quote_ident(&timeline.valid_to)
    );
    let batches = ctx
        .sql(&sql)
        .await
        .context(|| "validate".into())?
        .collect()
        .await
        .context(|| "validate".into())?;
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let batch = concat_batches(&first.schema(), &batches).context(|| "validate".into())?;
    if mode == "snapshots" {
        return check_snapshots(&batch, &keys);
    }
    // The convention's open-end marker means "open", like NULL.
    let mut cols = batch.columns().to_vec();
    let n = keys.len();
    cols[n + 1] = timeline.open_as_null(&cols[n + 1])?;
    let batch = RecordBatch::try_new(batch.schema(), cols).context(|| "validate".into())?;
    check_timelines(&batch, &keys)
}

/// The SCD2 integrity check on rows about to be written (keys in `keys`, the convention's
/// timeline columns by name): the violations, if any.
pub(crate) fn check_rows(
    rows: &RecordBatch,
    keys: &[String],
    timeline: &Timeline,
) -> Result<Vec<Violation>> {
    let column = |name: &str| {
        rows.column_by_name(name)
            .cloned()
            .ok_or_else(|| EngineError::Internal(format!("rows have no column {name}")))
    };
    let mut cols = keys.iter().map(|k| column(k)).collect::<Result<Vec<_>>>()?;
    cols.push(column(&timeline.valid_from)?);
    cols.push(timeline.open_as_null(&column(&timeline.valid_to)?)?);
    let fields: Vec<deltalake::arrow::datatypes::Field> = keys
        .iter()
        .chain([&timeline.valid_from, &timeline.valid_to])
        .zip(&cols)
        .map(|(n, c)| deltalake::arrow::datatypes::Field::new(n, c.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::new(deltalake::arrow::datatypes::Schema::new(fields)),
        cols,
    )
    .context(|| "integrity check".into())?;
    check_timelines(&batch, keys)
}

/// A `SNAPSHOTS` table: at most one row per key in each version.
fn check_snapshots(batch: &RecordBatch, keys: &[String]) -> Result<Vec<Violation>> {
    let n = keys.len();
    let rows = sqlutil::rows(&batch.columns()[..n + 1])?;
    let mut order: Vec<usize> = (0..batch.num_rows()).collect();
    order.sort_by(|&a, &b| rows.row(a).cmp(&rows.row(b)));
    let options = FormatOptions::default().with_null("NULL");
    let fmts = (0..=n)
        .map(|c| ArrayFormatter::try_new(batch.column(c).as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "validate".into())?;
    let mut out = Vec::new();
    for w in order.windows(2) {
        if rows.row(w[0]) == rows.row(w[1]) {
            out.push(Violation {
                key: keys
                    .iter()
                    .enumerate()
                    .map(|(c, name)| format!("{name}={}", fmts[c].value(w[0])))
                    .collect::<Vec<_>>()
                    .join(", "),
                problem: format!("appears twice in version {}", fmts[n].value(w[0])),
            });
        }
    }
    Ok(out)
}

/// The checks of [`validate`] over `keys..., __START_AT, __END_AT` rows, done here rather than
/// in SQL so that every sequence type (structs included) compares as `ORDER BY` would.
fn check_timelines(batch: &RecordBatch, keys: &[String]) -> Result<Vec<Violation>> {
    let n = keys.len();
    let (start, end) = (batch.column(n), batch.column(n + 1));
    // Integers where the types allow (8 bytes a value), else Arrow's row format.
    let key_of = Ordered::of_columns(&batch.columns()[..n], None)?;
    let bounds = Bounds::new(start, end)?;
    let options = FormatOptions::default().with_null("NULL");
    let fmt = |c: usize| ArrayFormatter::try_new(batch.column(c).as_ref(), &options);
    let key_fmt = (0..n)
        .map(fmt)
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "validate".into())?;
    let (start_fmt, end_fmt) = (
        fmt(n).context(|| "validate".into())?,
        fmt(n + 1).context(|| "validate".into())?,
    );
    let describe = |i: u32| {
        keys.iter()
            .enumerate()
            .map(|(c, name)| format!("{name}={}", key_fmt[c].value(i as usize)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rows = batch.num_rows() as u32;
    // Rows that come grouped by key, each key's versions in start order (as a fold writes
    // them), are checked as they are; anything else is sorted first.
    let grouped = {
        let runs_ordered = (1..rows)
            .all(|i| !key_of.eq(i - 1, i) || bounds.start_cmp(i - 1, i) != Ordering::Greater);
        // Each key's run must be its only one: the first rows of the runs hold distinct keys.
        let mut firsts = (0..rows).filter(|&i| i == 0 || !key_of.eq(i - 1, i));
        runs_ordered
            && match &key_of {
                Ordered::Int(v) => {
                    let mut seen = ahash::AHashSet::with_capacity(v.len() / 4);
                    firsts.all(|i| seen.insert(v[i as usize]))
                }
                Ordered::Rows(r) => {
                    let mut seen = ahash::AHashSet::with_capacity(r.num_rows() / 4);
                    firsts.all(|i| seen.insert(r.row(i as usize).data()))
                }
            }
    };
    let mut order: Vec<u32> = (0..rows).collect();
    if !grouped {
        order.sort_unstable_by(|&a, &b| {
            key_of
                .cmp(a, b)
                .then_with(|| bounds.start_cmp(a, b))
                .then(a.cmp(&b))
        });
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j < order.len() && key_of.eq(order[i], order[j]) {
            j += 1;
        }
        let group = &order[i..j];
        let open = group.iter().filter(|&&r| end.is_null(r as usize)).count();
        if open > 1 {
            out.push(Violation {
                key: describe(group[0]),
                problem: format!("has {open} open versions"),
            });
        }
        for (pos, &r) in group.iter().enumerate() {
            let open = end.is_null(r as usize);
            if !open && bounds.start_vs_end(r, r) != Ordering::Less {
                out.push(Violation {
                    key: describe(r),
                    problem: format!(
                        "version starting at {} does not end after it starts (ends at {})",
                        start_fmt.value(r as usize),
                        end_fmt.value(r as usize)
                    ),
                });
            }
            if let Some(&next) = group.get(pos + 1) {
                if open || bounds.start_vs_end(next, r) == Ordering::Less {
                    out.push(Violation {
                        key: describe(r),
                        problem: format!(
                            "version starting at {} overlaps the next one, starting at {}",
                            start_fmt.value(r as usize),
                            start_fmt.value(next as usize)
                        ),
                    });
                }
            }
        }
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};

    /// The check run before a flow commits finds two open versions and an overlap.
    #[test]
    fn check_rows_finds_broken_timelines() {
        let timeline = Timeline::from_properties(&std::collections::HashMap::new()).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new(&timeline.valid_from, DataType::Int64, true),
            Field::new(&timeline.valid_to, DataType::Int64, true),
        ]));
        let batch = |ids: Vec<i64>, starts: Vec<i64>, ends: Vec<Option<i64>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(starts)),
                    Arc::new(Int64Array::from(ends)),
                ],
            )
            .unwrap()
        };
        let keys = vec!["id".to_string()];
        let good = batch(vec![1, 1, 2], vec![1, 5, 1], vec![Some(5), None, None]);
        assert!(check_rows(&good, &keys, &timeline).unwrap().is_empty());
        let two_open = batch(vec![1, 1], vec![1, 5], vec![None, None]);
        let v = check_rows(&two_open, &keys, &timeline).unwrap();
        assert!(
            v.iter().any(|v| v.problem == "has 2 open versions"),
            "{v:?}"
        );
        let overlap = batch(vec![1, 1], vec![1, 5], vec![Some(7), None]);
        let v = check_rows(&overlap, &keys, &timeline).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].problem.contains("overlaps the next one"), "{v:?}");
        // Rows not grouped by key (as files return them) are sorted before the check: the
        // same overlap with key 2 between, and the later version first.
        let scattered = batch(vec![1, 2, 1], vec![5, 1, 1], vec![None, None, Some(7)]);
        let v = check_rows(&scattered, &keys, &timeline).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].problem.contains("overlaps the next one"), "{v:?}");
        let scattered_good = batch(vec![1, 2, 1], vec![5, 1, 1], vec![None, None, Some(5)]);
        assert!(check_rows(&scattered_good, &keys, &timeline)
            .unwrap()
            .is_empty());
    }
}
