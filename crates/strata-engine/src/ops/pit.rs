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
//!
//! A range source's rows come from expanding each of its versions over the as-of values it
//! covers (two binary searches per version, [`Expansion`]) rather than from a range join
//! comparing every version with every as-of value; a new table of one such source is written
//! to files while its rows are made, so memory holds batches, not the table. `validate`
//! recomputes the rows with the range join (`sql/pit_check.rs`), independently.

use crate::error::{Context, EngineError, Result};
use crate::ops::Scope;
pub(crate) use crate::semantics::pit::AS_OF_COL;
use crate::semantics::pit::{
    covered, expanded_table, pit_sql, plan_refresh, Changed, PitSource, Ranges, RefreshPlan,
};
use crate::semantics::timeline::Timeline;
use crate::sql::session::warehouse_session_in;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::table::version_of;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{append, write_rows, FileStream, RowChange};
use crate::util::sql::quote_ident;
use deltalake::arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use deltalake::arrow::compute::{cast, concat_batches, sort_to_indices, take};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::arrow::row::{RowConverter, Rows, SortField};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::logical_expr::type_coercion::binary::comparison_coercion;
use deltalake::datafusion::physical_plan::{collect, SendableRecordBatchStream};
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;
use futures::StreamExt;
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
/// [`spine_values`] → [`plan`] (what to compute) → [`create_streamed`] for a new table of
/// one range source, else [`compute_rows`] → [`commit_rows`].
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
    let mut commit = PendingCommit::of_run(scope.run_id);
    for s in &sources {
        let id = AppId::Pit {
            pit: &pit.name,
            source: &s.name,
        };
        commit = commit.at(id, version_of(&s.table));
    }
    let as_of = as_of_column(&spine, &refresh.compute)?;
    if let (None, [only]) = (&target, sources.as_slice()) {
        if !only.pit.snapshots {
            // A new table of one range source: its rows go to files as they are made.
            report.rows = create_streamed(scope, &ctx, pit, &only.pit, &as_of, &commit).await?;
            return Ok(report);
        }
    }
    let (out_schema, batches) = compute_rows(&ctx, pit, &sources, &as_of).await?;
    report.rows = batches.iter().map(RecordBatch::num_rows).sum();
    // As-of values at which no key has a version leave no rows; computing them again finds
    // none again, and there is nothing to commit.
    if report.rows == 0 && report.recomputed == 0 && refresh.removed.is_empty() && target.is_some()
    {
        report.skipped = Some("up to date".to_string());
        return Ok(report);
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

/// The as-of values a refresh computes, as one column of the spine's type.
fn as_of_column(spine: &[RecordBatch], compute: &[ScalarValue]) -> Result<ArrayRef> {
    let spine_type = spine.first().map_or(DataType::Date32, |b| {
        b.schema().field(0).data_type().clone()
    });
    match compute.is_empty() {
        true => Ok(deltalake::arrow::array::new_empty_array(&spine_type)),
        false => ScalarValue::iter_to_array(compute.to_vec()).context(|| "as-of values".into()),
    }
}

/// The PIT rows of the as-of values `as_of`, in Delta's types: each range source expanded
/// ([`Expansion`]) into a table of the session, then [`pit_sql`] over them (which also
/// finds the snapshot sources' rows and joins several sources).
async fn compute_rows(
    ctx: &SessionContext,
    pit: &PitTable,
    sources: &[Source],
    as_of: &ArrayRef,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let spine_batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            AS_OF_COL,
            as_of.data_type().clone(),
            true,
        )])),
        vec![as_of.clone()],
    )
    .context(|| "as-of values".into())?;
    ctx.register_batch("__strata_spine", spine_batch)
        .context(|| "as-of values".into())?;
    for (i, s) in sources.iter().enumerate() {
        if s.pit.snapshots {
            continue;
        }
        let mut rows = Expansion::open(ctx, &s.pit, &pit.keys, as_of, "c").await?;
        let mut batches = Vec::new();
        while let Some(b) = rows.next().await? {
            batches.push(b);
        }
        let table = MemTable::try_new(rows.schema.clone(), vec![batches])
            .context(|| format!("point-in-time rows of {}", s.name))?;
        ctx.register_table(expanded_table(i), Arc::new(table))
            .context(|| format!("point-in-time rows of {}", s.name))?;
    }
    let pit_sources: Vec<PitSource> = sources.iter().map(|s| s.pit.clone()).collect();
    let sql = pit_sql(&pit.keys, &pit_sources, Ranges::Expanded);
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

/// Creates `pit` with the rows of its one range source `source` at the as-of values
/// `as_of`, written to files while they are expanded (memory holds a batch per file
/// writer, not the table), in one commit; returns the rows.
async fn create_streamed(
    scope: &Scope<'_>,
    ctx: &SessionContext,
    pit: &PitTable,
    source: &PitSource,
    as_of: &ArrayRef,
    commit: &PendingCommit,
) -> Result<usize> {
    let mut rows = Expansion::open(ctx, source, &pit.keys, as_of, &source.out_name).await?;
    let table = crate::storage::table::create_delta(
        &scope.wh.table_location(&pit.name),
        &pit.name.name,
        &rows.schema,
        pit_configuration(pit),
        None,
        Vec::new(),
    )
    .await?;
    let mut files = FileStream::start(&table)?;
    while let Some(b) = rows.next().await? {
        files.write(b).await?;
    }
    let rows = files.rows();
    let adds = files.finish().await?;
    append(&table, Vec::new(), adds, commit)
        .await
        .map_err(|e| e.within(|| format!("writing point-in-time table {}", pit.name)))?;
    Ok(rows)
}

/// `column` cast to `common` in `converter`'s row format.
fn in_row_format(
    converter: &RowConverter,
    common: &DataType,
    column: &ArrayRef,
    what: &str,
) -> Result<Rows> {
    let c = cast(column, common).context(|| what.to_string())?;
    converter.convert_columns(&[c]).context(|| what.to_string())
}

/// Rows per batch an [`Expansion`] gives.
const EXPANDED_BATCH_ROWS: usize = 131_072;

/// Every version of a range source expanded over the as-of values it [`covered`]
/// (`start <= as_of < end`), in batches of (as_of, keys..., c) made while the source is
/// read. Where a range join compares every version with every as-of value, this finds each
/// version's as-of values by two binary searches: the work is the output.
struct Expansion {
    what: String,
    /// The source's (keys..., start, end, recorded column).
    versions: SendableRecordBatchStream,
    keys: usize,
    /// The as-of values, ascending, and the same in the row format of `common`.
    as_of: ArrayRef,
    as_of_rows: Rows,
    /// The type starts, ends and as-of values are compared in, as the range join would.
    common: DataType,
    converter: RowConverter,
    /// (as_of, keys..., recorded column), in Delta's types.
    schema: SchemaRef,
    /// Made and not yet given.
    ready: std::collections::VecDeque<RecordBatch>,
}

impl Expansion {
    /// Starts reading range source `s` (its keys, start, end and recorded column) for the
    /// as-of values `as_of`; the rows' last column is named `recorded_as`.
    async fn open(
        ctx: &SessionContext,
        s: &PitSource,
        keys: &[String],
        as_of: &ArrayRef,
        recorded_as: &str,
    ) -> Result<Self> {
        let what = format!("point-in-time rows of {}", s.reference);
        let sql = format!(
            "SELECT {}, {} AS __strata_from, {} AS __strata_to, {} AS c FROM {}",
            keys.iter()
                .map(|k| quote_ident(k))
                .collect::<Vec<_>>()
                .join(", "),
            quote_ident(&s.valid_from),
            quote_ident(&s.valid_to),
            quote_ident(&s.column),
            s.reference
        );
        let df = ctx
            .sql(&sql)
            .await
            .map_err(|e| EngineError::of_query(what.clone(), e))?;
        let read = df.schema().as_arrow();
        let from_type = read.field(keys.len()).data_type().clone();
        let common = comparison_coercion(as_of.data_type(), &from_type).ok_or_else(|| {
            EngineError::plan(format!(
                "{what}: its {} ({from_type}) cannot be compared with the as-of values ({})",
                s.valid_from,
                as_of.data_type()
            ))
        })?;
        // (as_of, keys..., recorded column) in Delta's types.
        let stored = |name: &str, f: &Field| {
            Field::new(name, crate::util::arrow::storage_type(f.data_type()), true)
        };
        let mut fields = vec![Field::new(AS_OF_COL, as_of.data_type().clone(), true)];
        for f in read.fields().iter().take(keys.len()) {
            fields.push(stored(f.name(), f));
        }
        fields.push(stored(recorded_as, read.field(keys.len() + 2)));
        let schema = Arc::new(Schema::new(fields));
        let order = sort_to_indices(as_of, None, None).context(|| what.clone())?;
        let as_of = take(as_of, &order, None).context(|| what.clone())?;
        let converter =
            RowConverter::new(vec![SortField::new(common.clone())]).context(|| what.clone())?;
        let versions = df
            .execute_stream()
            .await
            .map_err(|e| EngineError::of_query(what.clone(), e))?;
        let as_of_rows = in_row_format(&converter, &common, &as_of, &what)?;
        Ok(Expansion {
            what,
            versions,
            keys: keys.len(),
            as_of,
            as_of_rows,
            common,
            converter,
            schema,
            ready: Default::default(),
        })
    }

    /// `column` in the row format of the compared type.
    fn in_common(&self, column: &ArrayRef) -> Result<Rows> {
        in_row_format(&self.converter, &self.common, column, &self.what)
    }

    /// The next batch of rows, `None` at the end of the source.
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        while self.ready.is_empty() {
            let Some(batch) = self.versions.next().await else {
                return Ok(None);
            };
            let batch = batch.map_err(|e| EngineError::of_query(self.what.clone(), e))?;
            self.expand(&batch)?;
        }
        Ok(self.ready.pop_front())
    }

    /// The rows of the versions in `batch`, cut into batches of [`EXPANDED_BATCH_ROWS`].
    fn expand(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = self.keys;
        let (from_col, to_col) = (batch.column(n), batch.column(n + 1));
        let (from, to) = (self.in_common(from_col)?, self.in_common(to_col)?);
        let spine: Vec<_> = self.as_of_rows.iter().collect();
        let (mut versions, mut at) = (Vec::<u32>::new(), Vec::<u32>::new());
        for i in 0..batch.num_rows() {
            if from_col.is_null(i) {
                continue;
            }
            let end = (!to_col.is_null(i)).then(|| to.row(i));
            let range = covered(&spine, &from.row(i), end.as_ref());
            versions.extend(std::iter::repeat_n(i as u32, range.len()));
            at.extend(range.map(|j| j as u32));
        }
        let (versions, at) = (UInt32Array::from(versions), UInt32Array::from(at));
        for start in (0..versions.len()).step_by(EXPANDED_BATCH_ROWS) {
            let len = EXPANDED_BATCH_ROWS.min(versions.len() - start);
            let (rows, at) = (versions.slice(start, len), at.slice(start, len));
            let what = || self.what.clone();
            let mut columns = vec![take(&self.as_of, &at, None).context(what)?];
            for c in (0..n).chain([n + 2]) {
                columns.push(take(batch.column(c), &rows, None).context(what)?);
            }
            self.ready
                .push_back(crate::util::arrow::cast_columns(columns, &self.schema)?);
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Date32Array, Int32Array, TimestampMicrosecondArray};
    use proptest::prelude::*;

    /// The rows the expansion gives for versions (key, start, end) of a table whose start
    /// and end are `Timestamp(us)` (midnight of day `d`), at DATE as-of values `spine`: the
    /// range join's type coercion, as `validate` would compute it.
    fn expanded(
        versions: &[(i32, Option<i32>, Option<i32>)],
        spine: &[i32],
    ) -> Vec<(i32, i32, i64)> {
        let day = 86_400_000_000i64;
        let micros = |v: &Option<i32>| v.map(|d| d as i64 * day);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("s", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("e", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from_iter_values(versions.iter().map(|v| v.0))),
                Arc::new(TimestampMicrosecondArray::from(
                    versions.iter().map(|v| micros(&v.1)).collect::<Vec<_>>(),
                )),
                Arc::new(TimestampMicrosecondArray::from(
                    versions.iter().map(|v| micros(&v.2)).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("batch");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let ctx = SessionContext::new();
            ctx.register_batch("dim", batch).expect("register");
            let source = PitSource {
                reference: "dim".into(),
                valid_from: "s".into(),
                valid_to: "e".into(),
                snapshots: false,
                column: "s".into(),
                out_name: "dim_start".into(),
            };
            let keys = vec!["id".to_string()];
            let as_of: ArrayRef = Arc::new(Date32Array::from(spine.to_vec()));
            let mut rows = Expansion::open(&ctx, &source, &keys, &as_of, "c")
                .await
                .expect("open");
            let mut out = Vec::new();
            while let Some(b) = rows.next().await.expect("next") {
                let d = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<Date32Array>()
                    .expect("date");
                let k = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .expect("id");
                let c = b
                    .column(2)
                    .as_any()
                    .downcast_ref::<TimestampMicrosecondArray>()
                    .expect("start");
                for i in 0..b.num_rows() {
                    out.push((d.value(i), k.value(i), c.value(i) / day));
                }
            }
            out.sort_unstable();
            out
        })
    }

    proptest! {
        /// Each version expanded over the as-of values it covers gives exactly the rows of
        /// the range join `start <= as_of AND (end IS NULL OR as_of < end)`, in any spine
        /// order, with NULL starts covering nothing.
        #[test]
        fn the_expansion_gives_the_range_joins_rows(
            versions in prop::collection::vec(
                (0i32..20, prop::option::weighted(0.95, 0i32..40), prop::option::of(0i32..40)),
                0..40,
            ),
            spine in prop::collection::btree_set(-2i32..45, 0..12),
        ) {
            let mut spine: Vec<i32> = spine.into_iter().collect();
            spine.reverse();
            let mut expected = Vec::new();
            for &(id, s, e) in &versions {
                for &d in &spine {
                    if let Some(s) = s {
                        if s <= d && e.is_none_or(|e| d < e) {
                            expected.push((d, id, s as i64));
                        }
                    }
                }
            }
            expected.sort_unstable();
            prop_assert_eq!(expanded(&versions, &spine), expected);
        }
    }
}
