//! Point-in-time tables: for each as-of value of a spine and each business key, which version
//! of every historised table was valid then.
//!
//! ```text
//!  as_of | key... | <table1>_sk (or _start) | <table2>_sk (or _start) | ...
//! ```
//!
//! A snapshot at any as-of value is then an equi-join of the PIT table with the historised
//! tables (on key and surrogate key or start), with no range join (docs/history.md).
//!
//! A refresh computes only the as-of values that are new in the spine, plus the ones the
//! historised tables' changes since the last refresh can affect: the change data feed of each
//! table since the version recorded in the PIT table's log gives the smallest start value
//! that changed, and every as-of value from there on is recomputed. The rows of those as-of
//! values are replaced in one commit, together with the source versions they reflect.

use crate::error::{Context, EngineError, Result};
use crate::semantics::timeline::Timeline;
use crate::sql::session::warehouse_session_in;
use crate::storage::table::version_of;
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::physical_plan::collect;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{PitTable, Spine, TableName};

/// The as-of column of every point-in-time table.
pub(crate) const AS_OF_COL: &str = "as_of";

/// What one refresh of a point-in-time table did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PitReport {
    pub table: String,
    /// As-of values computed (new ones and ones invalidated by changed history).
    pub computed: usize,
    /// Of those, as-of values already present whose rows were recomputed.
    pub recomputed: usize,
    /// As-of values dropped because they left the spine.
    pub removed: usize,
    pub rows: usize,
    pub skipped: Option<String>,
}

struct Source {
    name: TableName,
    table: DeltaTable,
    timeline: Timeline,
    snapshots: bool,
    /// The column the PIT table records: the surrogate key, else the start.
    column: String,
    out_name: String,
}

fn app_id(pit: &PitTable, source: &TableName) -> String {
    format!("strata-pit:{}:{source}", pit.name)
}

async fn sql_batches(ctx: &SessionContext, sql: &str, what: &str) -> Result<Vec<RecordBatch>> {
    ctx.sql(sql)
        .await
        .map_err(|e| EngineError::Plan(format!("{what}: {e}")))?
        .collect()
        .await
        .map_err(|e| EngineError::Plan(format!("{what}: {e}")))
}

/// The spine's distinct values, as one column named `as_of`.
async fn spine_values(
    wh: &Warehouse,
    ctx: &SessionContext,
    pit: &PitTable,
    schema: &str,
) -> Result<Vec<RecordBatch>> {
    let inner = match &pit.spine {
        Spine::List(values) => format!(
            "SELECT column1 AS {AS_OF_COL} FROM (VALUES {})",
            values
                .iter()
                .map(|v| format!("({v})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Spine::Range { start, stop, step } => {
            // generate_series steps dates as timestamps; the values keep the start's type.
            let start_type = ctx
                .sql(&format!("SELECT {start}"))
                .await
                .map_err(|e| EngineError::Plan(format!("{}: AS OF RANGE: {e}", pit.name)))?
                .schema()
                .field(0)
                .data_type()
                .clone();
            let value = if start_type == DataType::Date32 {
                "CAST(value AS DATE)"
            } else {
                "value"
            };
            format!("SELECT {value} AS {AS_OF_COL} FROM generate_series({start}, {stop}, {step})")
        }
        Spine::Query(q) => {
            let q = &crate::sql::as_of::rewrite_as_of(wh, q, schema)
                .await?
                .unwrap_or_else(|| q.clone());
            let df = ctx
                .sql(q)
                .await
                .map_err(|e| EngineError::Plan(format!("{}: AS OF query: {e}", pit.name)))?;
            let first = df
                .schema()
                .fields()
                .first()
                .map(|f| f.name().clone())
                .ok_or_else(|| {
                    EngineError::Plan(format!("{}: the AS OF query has no column", pit.name))
                })?;
            format!("SELECT {} AS {AS_OF_COL} FROM ({q})", quote_ident(&first))
        }
    };
    let sql = format!(
        "SELECT DISTINCT {AS_OF_COL} FROM ({inner}) WHERE {AS_OF_COL} IS NOT NULL ORDER BY 1"
    );
    sql_batches(ctx, &sql, &format!("{}: AS OF", pit.name)).await
}

/// The spine as Delta stores it (timestamps in microseconds, strings as plain UTF-8), so its
/// values compare equal to the as-of values read back from the table.
fn delta_typed(batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    batches
        .into_iter()
        .map(|b| {
            let t = match crate::util::arrow::storage_type(b.schema().field(0).data_type()) {
                DataType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Microsecond, tz),
                other => other,
            };
            let schema = Arc::new(Schema::new(vec![Field::new(AS_OF_COL, t, true)]));
            crate::util::arrow::cast_batch(&b, &schema)
        })
        .collect()
}

/// The smallest start among the rows of `source` that changed after `from` (its change data
/// feed), or `None` if nothing changed. An unreadable feed means "everything may have changed".
async fn changed_since(
    ctx: &SessionContext,
    source: &Source,
    keys: &[String],
    from: i64,
) -> Result<Option<Option<ScalarValue>>> {
    let now = version_of(&source.table);
    if now <= from {
        return Ok(None);
    }
    let plan = source
        .table
        .clone()
        .scan_cdf()
        .with_starting_version((from + 1) as u64)
        .build(&ctx.state(), None)
        .await;
    let batches = match plan {
        Ok(plan) => collect(plan, ctx.task_ctx()).await.ok(),
        Err(_) => None,
    };
    let Some(batches) = batches else {
        return Ok(Some(None));
    };
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let schema = first.schema();
    let all = concat_batches(&schema, &batches).context(|| "change feed".into())?;
    let tmp = SessionContext::new();
    tmp.register_batch("cdf", all)
        .context(|| "change feed".into())?;
    // Rows that left and rows that arrived, as (key, start, end): a key's rows are rewritten
    // whole, so rows present on both sides did not change. Where a row kept its start but
    // not its end, history changed from the earlier end on (NULL, open, is the latest);
    // otherwise from the row's start.
    let k = keys.iter().map(|c| quote_ident(c)).collect::<Vec<_>>();
    let cols = format!(
        "{}, {} AS s, {} AS e",
        k.join(", "),
        quote_ident(&source.timeline.valid_from),
        quote_ident(&source.timeline.valid_to)
    );
    let on = k
        .iter()
        .map(|c| format!("o.{c} = n.{c}"))
        .chain(std::iter::once("o.s = n.s".to_string()))
        .collect::<Vec<_>>()
        .join(" AND ");
    let sql = format!(
        "WITH o0 AS (SELECT {cols} FROM cdf WHERE _change_type IN ('delete', 'update_preimage')), \
              n0 AS (SELECT {cols} FROM cdf WHERE _change_type IN ('insert', 'update_postimage')), \
              o AS (SELECT *, true AS m FROM (SELECT * FROM o0 EXCEPT SELECT * FROM n0)), \
              n AS (SELECT *, true AS m FROM (SELECT * FROM n0 EXCEPT SELECT * FROM o0)) \
         SELECT min(CASE WHEN n.m IS NULL THEN o.s WHEN o.m IS NULL THEN n.s \
                         ELSE least(o.e, n.e) END) \
         FROM o FULL OUTER JOIN n ON {on}"
    );
    let min = sql_batches(&tmp, &sql, "change feed").await?;
    let v = crate::util::arrow::scalars(&min)?;
    Ok(Some(v.into_iter().next()))
}

/// Refreshes `pit` from the historised tables of `wh`.
pub(crate) async fn refresh(wh: &Warehouse, pit: &PitTable, schema: &str) -> Result<PitReport> {
    let mut report = PitReport {
        table: pit.name.to_string(),
        ..Default::default()
    };
    let mut sources = Vec::new();
    for name in &pit.sources {
        let Some(table) = wh.open_table(name).await? else {
            report.skipped = Some(format!("waiting for {name}, which has no rows yet"));
            return Ok(report);
        };
        let config = crate::storage::table::table_properties(&table)?;
        let timeline = Timeline::from_properties(&config)?;
        let snapshots = config.get("strata.scdType").map(String::as_str) == Some("snapshots");
        let schema = crate::storage::table::table_schema(&table)?;
        for k in &pit.keys {
            if schema.field_with_name(k).is_err() {
                return Err(EngineError::Plan(format!(
                    "point-in-time table {}: {name} has no key column `{k}`",
                    pit.name
                )));
            }
        }
        let (column, suffix) = match &timeline.surrogate_key {
            Some(sk) => (sk.clone(), "sk"),
            None => (timeline.valid_from.clone(), "start"),
        };
        sources.push(Source {
            out_name: format!("{}_{suffix}", name.name),
            name: name.clone(),
            table,
            timeline,
            snapshots,
            column,
        });
    }

    let ctx = warehouse_session_in(wh, schema).await?;
    let spine = delta_typed(spine_values(wh, &ctx, pit, schema).await?)?;
    let wanted = crate::util::arrow::scalars(&spine)?;
    let target = wh.open_table(&pit.name).await?;
    let mut existing: Vec<ScalarValue> = Vec::new();
    let mut bound: Option<Option<ScalarValue>> = None; // Some(None): everything
    if let Some(t) = &target {
        crate::storage::session::register_table(&ctx, "__strata_pit", t, None).await?;
        existing = crate::util::arrow::scalars(
            &sql_batches(
                &ctx,
                &format!("SELECT DISTINCT {AS_OF_COL} FROM __strata_pit"),
                "reading as-of values",
            )
            .await?,
        )?;
        let expected: Vec<String> = sources.iter().map(|s| s.out_name.clone()).collect();
        let schema = crate::storage::table::table_schema(t)?;
        let have: Vec<String> = schema
            .fields()
            .iter()
            .skip(1 + pit.keys.len())
            .map(|f| f.name().clone())
            .collect();
        if have != expected {
            return Err(EngineError::Plan(format!(
                "point-in-time table {} has columns for ({}) but the pipeline asks for ({}); \
                 remove the table folder to rebuild it",
                pit.name,
                have.join(", "),
                expected.join(", ")
            )));
        }
        for s in &sources {
            let from = crate::storage::table::txn_version(t, &app_id(pit, &s.name))
                .await?
                .unwrap_or(-1);
            if let Some(b) = changed_since(&ctx, s, &pit.keys, from).await? {
                bound = Some(match (bound, b) {
                    (Some(None), _) | (_, None) => None,
                    (None, Some(v)) => Some(v),
                    (Some(Some(a)), Some(v)) => Some(if v < a { v } else { a }),
                });
            }
        }
    }
    // The bound in the spine's type (an INT start against a BIGINT spine, a DATE start
    // against a TIMESTAMP spine); if it does not convert, everything is recomputed.
    let spine_type = spine
        .first()
        .map(|b| b.schema().field(0).data_type().clone());
    let bound = match (bound, &spine_type) {
        (Some(Some(b)), Some(t)) => Some(b.cast_to(t).ok()),
        (b, _) => b,
    };
    let affected = |v: &ScalarValue| match &bound {
        None => false,
        Some(None) => true,
        Some(Some(b)) => match v.partial_cmp(b) {
            Some(o) => o != std::cmp::Ordering::Less,
            None => true,
        },
    };
    let compute: Vec<ScalarValue> = wanted
        .iter()
        .filter(|v| !existing.contains(v) || affected(v))
        .cloned()
        .collect();
    let removed: Vec<ScalarValue> = existing
        .iter()
        .filter(|v| !wanted.contains(v))
        .cloned()
        .collect();
    report.recomputed = compute.iter().filter(|v| existing.contains(v)).count();
    report.computed = compute.len();
    report.removed = removed.len();
    if compute.is_empty() && removed.is_empty() && target.is_some() {
        report.skipped = Some("up to date".to_string());
        return Ok(report);
    }

    // The rows of the as-of values to compute.
    let spine_schema = spine.first().map(|b| b.schema()).unwrap_or_else(|| {
        Arc::new(Schema::new(vec![Field::new(
            AS_OF_COL,
            deltalake::arrow::datatypes::DataType::Date32,
            true,
        )]))
    });
    let values: Vec<ScalarValue> = compute.clone();
    let column = if values.is_empty() {
        deltalake::arrow::array::new_empty_array(spine_schema.field(0).data_type())
    } else {
        ScalarValue::iter_to_array(values).context(|| "as-of values".into())?
    };
    let spine_batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            AS_OF_COL,
            column.data_type().clone(),
            true,
        )])),
        vec![column],
    )
    .context(|| "as-of values".into())?;
    ctx.register_batch("__strata_spine", spine_batch)
        .context(|| "as-of values".into())?;
    let keys_t = |alias: &str| {
        pit.keys
            .iter()
            .map(|k| format!("{alias}.{}", quote_ident(k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut ctes = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let src = format!(
            "{}.{}",
            quote_ident(&s.name.schema),
            quote_ident(&s.name.name)
        );
        let (from, to, col) = (
            quote_ident(&s.timeline.valid_from),
            quote_ident(&s.timeline.valid_to),
            quote_ident(&s.column),
        );
        let body = if s.snapshots {
            format!(
                "SELECT v.{AS_OF_COL}, {}, t.{col} AS c FROM \
                   (SELECT sp.{AS_OF_COL}, max(d.st) AS st FROM __strata_spine sp \
                    JOIN (SELECT DISTINCT {from} AS st FROM {src}) d ON d.st <= sp.{AS_OF_COL} \
                    GROUP BY sp.{AS_OF_COL}) v \
                 JOIN {src} t ON t.{from} = v.st",
                keys_t("t")
            )
        } else {
            format!(
                "SELECT sp.{AS_OF_COL}, {}, t.{col} AS c FROM __strata_spine sp JOIN {src} t \
                 ON t.{from} <= sp.{AS_OF_COL} AND (t.{to} IS NULL OR sp.{AS_OF_COL} < t.{to})",
                keys_t("t")
            )
        };
        ctes.push(format!("s{i} AS ({body})"));
    }
    // One source: its rows are the answer. More: full outer joins on (as_of, keys), the
    // as-of value and keys taken from whichever side has them.
    let coalesced = |col: &str, upto: usize| {
        if upto == 0 {
            format!("s0.{col}")
        } else {
            format!(
                "coalesce({})",
                (0..=upto)
                    .map(|i| format!("s{i}.{col}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    let last = sources.len() - 1;
    let mut select = format!("SELECT {} AS {AS_OF_COL}", coalesced(AS_OF_COL, last));
    for k in &pit.keys {
        let q = quote_ident(k);
        select.push_str(&format!(", {} AS {q}", coalesced(&q, last)));
    }
    for (i, s) in sources.iter().enumerate() {
        select.push_str(&format!(", s{i}.c AS {}", quote_ident(&s.out_name)));
    }
    let mut from = "s0".to_string();
    for i in 1..sources.len() {
        let on = std::iter::once(format!(
            "s{i}.{AS_OF_COL} = {}",
            coalesced(AS_OF_COL, i - 1)
        ))
        .chain(pit.keys.iter().map(|k| {
            let q = quote_ident(k);
            format!("s{i}.{q} = {}", coalesced(&q, i - 1))
        }))
        .collect::<Vec<_>>()
        .join(" AND ");
        from.push_str(&format!(" FULL OUTER JOIN s{i} ON {on}"));
    }
    let sql = format!("WITH {} {select} FROM {from}", ctes.join(", "));
    let df = ctx
        .sql(&sql)
        .await
        .map_err(|e| EngineError::Plan(format!("point-in-time table {}: {e}", pit.name)))?;
    let out_schema: SchemaRef = Arc::new(Schema::new(
        df.schema()
            .as_arrow()
            .fields()
            .iter()
            .map(|f| {
                Field::new(
                    f.name(),
                    crate::util::arrow::storage_type(f.data_type()),
                    true,
                )
            })
            .collect::<Vec<_>>(),
    ));
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::Plan(format!("point-in-time table {}: {e}", pit.name)))?;
    let batches = batches
        .iter()
        .map(|b| crate::util::arrow::cast_batch(b, &out_schema))
        .collect::<Result<Vec<_>>>()?;
    report.rows = batches.iter().map(RecordBatch::num_rows).sum();
    // As-of values at which no key has a version leave no rows; computing them again finds
    // none again, and there is nothing to commit.
    if report.rows == 0 && report.recomputed == 0 && removed.is_empty() && target.is_some() {
        report.skipped = Some("up to date".to_string());
        return Ok(report);
    }

    let mut props = CommitProperties::default();
    for s in &sources {
        props = props.with_application_transaction(Transaction::new(
            app_id(pit, &s.name),
            version_of(&s.table),
        ));
    }
    let (handle, fresh) = match target {
        Some(t) => (t, false),
        None => (
            crate::storage::table::create_delta(
                &wh.table_path(&pit.name),
                &pit.name.name,
                &out_schema,
                crate::storage::table::table_configuration(&pit.properties),
                None,
                Vec::new(),
            )
            .await?,
            true,
        ),
    };
    let codec = crate::storage::write::writer_properties(&handle);
    let write = handle
        .write(batches)
        .with_writer_properties(codec)
        .with_commit_properties(props);
    let write = if fresh {
        write.with_save_mode(SaveMode::Append)
    } else {
        let replace: Vec<Expr> = compute.into_iter().chain(removed).map(lit).collect();
        write
            .with_save_mode(SaveMode::Overwrite)
            .with_replace_where(
                Expr::Column(Column::new_unqualified(AS_OF_COL)).in_list(replace, false),
            )
    };
    write
        .await
        .context(|| format!("writing point-in-time table {}", pit.name))?;
    Ok(report)
}
