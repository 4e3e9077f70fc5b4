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
use crate::ops::Scope;
pub(crate) use crate::semantics::pit::AS_OF_COL;
use crate::semantics::pit::{pit_sql, plan_refresh, Changed, PitSource, RefreshPlan};
use crate::semantics::timeline::Timeline;
use crate::sql::session::warehouse_session_in;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::table::version_of;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{write_rows, RowChange};
use crate::util::sql::quote_ident;
use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::physical_plan::collect;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{PitTable, Spine, TableName};

/// What one refresh of a point-in-time table did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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

/// A historised table the point-in-time table reads, opened.
struct Source {
    name: TableName,
    table: DeltaTable,
    timeline: Timeline,
    /// What the PIT query needs of it.
    pit: PitSource,
}

async fn sql_batches(ctx: &SessionContext, sql: &str, what: &str) -> Result<Vec<RecordBatch>> {
    ctx.sql(sql)
        .await
        .map_err(|e| EngineError::of_query(what, e))?
        .collect()
        .await
        .map_err(|e| EngineError::of_query(what, e))
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
                .map_err(|e| EngineError::of_query(format!("{}: AS OF RANGE", pit.name), e))?
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
                .map_err(|e| EngineError::of_query(format!("{}: AS OF query", pit.name), e))?;
            let first = df
                .schema()
                .fields()
                .first()
                .map(|f| f.name().clone())
                .ok_or_else(|| {
                    EngineError::plan(format!("{}: the AS OF query has no column", pit.name))
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

/// Refreshes `pit` from the historised tables of the warehouse: [`open_sources`] →
/// [`spine_values`] → [`plan`] (what to compute) → [`compute_rows`] → [`commit_rows`].
pub(crate) async fn refresh(scope: &Scope<'_>, pit: &PitTable, schema: &str) -> Result<PitReport> {
    let wh = scope.wh;
    let mut report = PitReport {
        table: pit.name.to_string(),
        ..Default::default()
    };
    let sources = match open_sources(wh, pit).await? {
        Ok(sources) => sources,
        Err(waiting) => {
            report.skipped = Some(format!("waiting for {waiting}, which has no rows yet"));
            return Ok(report);
        }
    };
    let ctx = warehouse_session_in(wh, schema).await?;
    let spine = delta_typed(spine_values(wh, &ctx, pit, schema).await?)?;
    let target = wh.open_table(&pit.name).await?;
    let refresh = plan(&ctx, pit, &sources, &spine, target.as_ref()).await?;
    report.recomputed = refresh.recomputed;
    report.computed = refresh.compute.len();
    report.removed = refresh.removed.len();
    if refresh.compute.is_empty() && refresh.removed.is_empty() && target.is_some() {
        report.skipped = Some("up to date".to_string());
        return Ok(report);
    }
    let (out_schema, batches) = compute_rows(&ctx, pit, &sources, &spine, &refresh).await?;
    report.rows = batches.iter().map(RecordBatch::num_rows).sum();
    // As-of values at which no key has a version leave no rows; computing them again finds
    // none again, and there is nothing to commit.
    if report.rows == 0 && report.recomputed == 0 && refresh.removed.is_empty() && target.is_some()
    {
        report.skipped = Some("up to date".to_string());
        return Ok(report);
    }
    let mut commit = PendingCommit::of_run(scope.run_id);
    for s in &sources {
        let id = AppId::Pit {
            pit: &pit.name,
            source: &s.name,
        };
        commit = commit.at(id, version_of(&s.table));
    }
    commit_rows(scope, pit, target, &out_schema, batches, refresh, &commit).await?;
    Ok(report)
}

/// Opens every historised table `pit` reads and checks it has the keys; `Err(name)` when
/// one has no rows yet (the table waits for it).
async fn open_sources(
    wh: &crate::storage::warehouse::Warehouse,
    pit: &PitTable,
) -> Result<std::result::Result<Vec<Source>, TableName>> {
    let mut sources = Vec::new();
    for name in &pit.sources {
        let Some(table) = wh.open_table(name).await? else {
            return Ok(Err(name.clone()));
        };
        let config = crate::storage::table::table_properties(&table)?;
        let timeline = Timeline::from_properties(&config)?;
        let schema = crate::storage::table::table_schema(&table)?;
        if let Some(k) = pit.keys.iter().find(|k| schema.field_with_name(k).is_err()) {
            return Err(EngineError::plan(format!(
                "point-in-time table {}: {name} has no key column `{k}`",
                pit.name
            )));
        }
        let pit_source = crate::semantics::pit::pit_source(
            format!("{}.{}", quote_ident(&name.schema), quote_ident(&name.name)),
            &name.name,
            &timeline,
            config.get("strata.scdType").map(String::as_str) == Some("snapshots"),
        );
        sources.push(Source {
            name: name.clone(),
            table,
            timeline,
            pit: pit_source,
        });
    }
    Ok(Ok(sources))
}

/// A new PIT table's properties: the user's, then its keys and sources for `validate`.
fn pit_configuration(pit: &PitTable) -> Vec<(String, Option<String>)> {
    let mut conf = crate::storage::table::table_configuration(&pit.properties);
    conf.push((
        crate::semantics::pit::KEYS_PROPERTY.to_string(),
        Some(pit.keys.join(",")),
    ));
    conf.push((
        crate::semantics::pit::SOURCES_PROPERTY.to_string(),
        Some(
            pit.sources
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
    ));
    conf
}

/// Which as-of values the refresh computes: the spine's new ones, and every one the
/// historised tables' changes since the last refresh can affect.
async fn plan(
    ctx: &SessionContext,
    pit: &PitTable,
    sources: &[Source],
    spine: &[RecordBatch],
    target: Option<&DeltaTable>,
) -> Result<RefreshPlan> {
    let wanted = crate::util::arrow::scalars(spine)?;
    let Some(t) = target else {
        return Ok(plan_refresh(&wanted, &[], &Changed::Nothing));
    };
    crate::storage::session::register_table(ctx, "__strata_pit", t, None).await?;
    let existing = crate::util::arrow::scalars(
        &sql_batches(
            ctx,
            &format!("SELECT DISTINCT {AS_OF_COL} FROM __strata_pit"),
            "reading as-of values",
        )
        .await?,
    )?;
    check_columns(pit, sources, t)?;
    let mut changed = Changed::Nothing;
    for s in sources {
        let id = AppId::Pit {
            pit: &pit.name,
            source: &s.name,
        };
        let from = position(t, id).await?.unwrap_or(-1);
        changed = changed.and(match changed_since(ctx, s, &pit.keys, from).await? {
            None => Changed::Nothing,
            Some(None) => Changed::Everything,
            Some(Some(v)) => Changed::From(v),
        });
    }
    // The bound in the spine's type (an INT start against a BIGINT spine, a DATE start
    // against a TIMESTAMP spine); if it does not convert, everything is recomputed.
    let spine_type = spine
        .first()
        .map(|b| b.schema().field(0).data_type().clone());
    if let (Changed::From(b), Some(t)) = (&changed, &spine_type) {
        changed = b.cast_to(t).map_or(Changed::Everything, Changed::From);
    }
    Ok(plan_refresh(&wanted, &existing, &changed))
}

/// An existing PIT table must have the columns the pipeline now asks for.
fn check_columns(pit: &PitTable, sources: &[Source], table: &DeltaTable) -> Result<()> {
    let expected: Vec<String> = sources.iter().map(|s| s.pit.out_name.clone()).collect();
    let have: Vec<String> = crate::storage::table::table_schema(table)?
        .fields()
        .iter()
        .skip(1 + pit.keys.len())
        .map(|f| f.name().clone())
        .collect();
    if have == expected {
        return Ok(());
    }
    Err(EngineError::plan(format!(
        "point-in-time table {} has columns for ({}) but the pipeline asks for ({}); \
         remove the table folder to rebuild it",
        pit.name,
        have.join(", "),
        expected.join(", ")
    )))
}

/// The PIT rows of the as-of values the refresh computes, in Delta's types.
async fn compute_rows(
    ctx: &SessionContext,
    pit: &PitTable,
    sources: &[Source],
    spine: &[RecordBatch],
    refresh: &RefreshPlan,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let spine_type = spine.first().map_or(DataType::Date32, |b| {
        b.schema().field(0).data_type().clone()
    });
    let column = match refresh.compute.is_empty() {
        true => deltalake::arrow::array::new_empty_array(&spine_type),
        false => {
            ScalarValue::iter_to_array(refresh.compute.clone()).context(|| "as-of values".into())?
        }
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
    let pit_sources: Vec<PitSource> = sources.iter().map(|s| s.pit.clone()).collect();
    let sql = pit_sql(&pit.keys, &pit_sources);
    let err = |e| EngineError::of_query(format!("point-in-time table {}", pit.name), e);
    let df = ctx.sql(&sql).await.map_err(err)?;
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
        .map_err(err)?
        .iter()
        .map(|b| crate::util::arrow::cast_batch(b, &out_schema))
        .collect::<Result<Vec<_>>>()?;
    Ok((out_schema, batches))
}

/// Replaces the rows of the computed and removed as-of values in one commit (or creates
/// the table with them).
async fn commit_rows(
    scope: &Scope<'_>,
    pit: &PitTable,
    target: Option<DeltaTable>,
    out_schema: &SchemaRef,
    batches: Vec<RecordBatch>,
    refresh: RefreshPlan,
    commit: &PendingCommit,
) -> Result<()> {
    let (table, fresh) = match target {
        Some(t) => (t, false),
        None => (
            crate::storage::table::create_delta(
                &scope.wh.table_location(&pit.name),
                &pit.name.name,
                out_schema,
                pit_configuration(pit),
                None,
                Vec::new(),
            )
            .await?,
            true,
        ),
    };
    let change = match fresh {
        true => RowChange::Append,
        false => {
            let replace: Vec<Expr> = refresh
                .compute
                .into_iter()
                .chain(refresh.removed)
                .map(lit)
                .collect();
            RowChange::ReplaceWhere(
                Expr::Column(Column::new_unqualified(AS_OF_COL)).in_list(replace, false),
            )
        }
    };
    write_rows(table, batches, change, commit)
        .await
        .context(|| format!("writing point-in-time table {}", pit.name))?;
    Ok(())
}
