//! Refreshing a materialized view over an equi-join of two tables from what changed in
//! them: the join key values their changed rows hold (from each table's change feed, before
//! and after each change) are the keys whose view rows may differ; the query over both
//! tables, each restricted to those keys, replaces the view's rows with those keys in one
//! commit, and the rows of other keys stay. Which joins allow it is
//! [`super::incremental`]'s to say; this module reads and writes.

use super::incremental::{self, Growth, Joined};
use super::replace::{open_at, read_by, replace_touched, replaced, Grown, Incremental};
use super::{collect_as, MvReport, Refresh};
use crate::error::{Context, Result};
use crate::storage::commit::PendingCommit;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{write_rows, RowChange};
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::common::tree_node::{Transformed, TreeNode};
use deltalake::datafusion::common::{Column, JoinType, NullEquality, TableReference};
use deltalake::datafusion::dataframe::DataFrame;
use deltalake::datafusion::datasource::{provider_as_source, MemTable};
use deltalake::datafusion::logical_expr::{
    LogicalPlan, LogicalPlanBuilder, TableScan, TableSource,
};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{MaterializedView, TableName};

/// The session's names of the rows of the keys touched (every change, then each key once)
/// and of each side's table at the version the refresh records.
const CHANGED_KEYS: &str = "__strata_changed_keys";
const TOUCHED_KEYS: &str = "__strata_touched_keys";
const SIDES: [&str; 2] = ["__strata_join_left", "__strata_join_right"];

/// The view a refresh writes: its declaration, its table, its stored schema and its commit.
pub(super) struct Target<'a> {
    pub(super) mv: &'a MaterializedView,
    pub(super) view: &'a DeltaTable,
    pub(super) schema: &'a SchemaRef,
    pub(super) commit: &'a PendingCommit,
}

/// One side of the join: the table it reads, at the version the refresh records, and the
/// versions whose changes it brings (`None` when it did not change).
struct Side {
    name: TableName,
    table: DeltaTable,
    changed: Option<(i64, i64)>,
}

/// Refreshes a join view (`joined`) from the changes of its tables that grew (`tables`), or
/// says why it must be recomputed whole.
pub(super) async fn refresh(
    wh: &Warehouse,
    ctx: &SessionContext,
    df: &DataFrame,
    target: &Target<'_>,
    grown: &Grown<'_>,
    tables: &[Growth],
    joined: &Joined,
) -> Result<Incremental> {
    if !target.mv.expectations.is_empty() {
        // Its expectations' counts are over all its rows, not the recomputed keys' only.
        return Ok(Err("it is a join with expectations"));
    }
    let Some(sides) = open_sides(wh, grown, tables, joined).await? else {
        return Ok(Err(
            "a side of its join reads a view, a CTE or an earlier version",
        ));
    };
    const STALE: &str = "its tables' columns changed since it was planned";
    let Some(touched) = touched_keys(ctx, &sides, joined, target.schema).await? else {
        return Ok(Err(STALE));
    };
    let mut report = MvReport {
        rows_read: touched.num_rows(),
        refresh: Refresh::Rejoined,
        ..Default::default()
    };
    let Some(recomputed) = restricted_plan(ctx, df, &sides, joined, &touched).await? else {
        return Ok(Err(STALE));
    };
    let name = target.mv.name.to_string();
    let replacing = (recomputed.clone(), touched.clone());
    if let Some(rows) = replace_touched(
        ctx,
        target.view,
        replacing.0,
        replacing.1,
        target.schema,
        &joined.keys,
        target.commit,
    )
    .await?
    {
        report.rows = rows;
        tracing::info!(view = %name, keys = report.rows_read, rows = report.rows,
            "incremental refresh of a join: the keys' rows replaced");
        return Ok(Ok(report));
    }
    let rows = replaced(
        ctx,
        target.view,
        recomputed,
        touched,
        target.schema,
        &joined.keys,
    )
    .await?;
    report.rows = rows.num_rows();
    tracing::info!(view = %name, keys = report.rows_read, rows = report.rows,
        "incremental refresh of a join");
    // The view is rewritten whole, consistent with the inputs it records whoever lands last.
    write_rows(
        target.view.clone(),
        vec![rows],
        RowChange::Overwrite,
        target.commit,
    )
    .await
    .context(|| format!("materialized view {name}: committing"))?;
    Ok(Ok(report))
}

/// The two sides' tables at the versions the refresh records, when each is a table the view
/// reads (`None` otherwise).
async fn open_sides(
    wh: &Warehouse,
    grown: &Grown<'_>,
    tables: &[Growth],
    joined: &Joined,
) -> Result<Option<Vec<Side>>> {
    let mut sides = Vec::with_capacity(2);
    for side in &joined.sides {
        let Some(read) = read_by(&side.table, grown.reads) else {
            return Ok(None);
        };
        let spelled = read.to_string();
        let changed = tables.iter().find(|g| g.table == spelled);
        let Some(until) = changed
            .map(|g| g.until)
            .or_else(|| incremental::version_in(grown.now, &spelled))
        else {
            return Ok(None);
        };
        let Some(table) = open_at(wh, read, until).await? else {
            return Ok(None);
        };
        sides.push(Side {
            name: read.clone(),
            table,
            changed: changed.map(|g| (g.from, g.until)),
        });
    }
    Ok(Some(sides))
}

/// The join key values of the sides' changed rows (inserted, deleted, updated: before and
/// after), each once, as the view's key columns; `None` when a key column is no longer in
/// a side's table.
async fn touched_keys(
    ctx: &SessionContext,
    sides: &[Side],
    joined: &Joined,
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>> {
    let keys: SchemaRef = Arc::new(
        schema
            .project(&joined.keys)
            .context(|| "the view's key columns".into())?,
    );
    let mut changed = Vec::new();
    for (side, columns) in sides.iter().zip(joined.sides.iter().map(|s| &s.columns)) {
        let Some((from, until)) = side.changed else {
            continue;
        };
        let feed =
            crate::storage::feed::read_feed(&side.table, Some(from), Some(until), true).await?;
        let of_keys: Option<Vec<_>> = columns
            .iter()
            .map(|c| Some(feed.column(feed.schema().index_of(c).ok()?).clone()))
            .collect();
        let Some(of_keys) = of_keys else {
            return Ok(None);
        };
        changed.push(arrow::cast_columns(of_keys, &keys)?);
    }
    let changed = concat_batches(&keys, &changed).context(|| "the keys changed".into())?;
    ctx.register_batch(CHANGED_KEYS, changed)
        .context(|| "the keys changed".into())?;
    let names: Vec<String> = keys.fields().iter().map(|f| f.name().clone()).collect();
    let distinct = ctx
        .sql(&incremental::distinct_sql(CHANGED_KEYS, &names))
        .await
        .context(|| "the keys changed".into())?;
    collect_as(distinct, &keys).await.map(Some)
}

/// The view's query over both sides' tables at the versions the refresh records, each
/// restricted to the rows whose join key is among `touched` (NULLs equal, so that a left
/// join's rows of a NULL key are recomputed when one changed); `None` when a table's schema
/// is no longer the one the query was planned with.
async fn restricted_plan(
    ctx: &SessionContext,
    df: &DataFrame,
    sides: &[Side],
    joined: &Joined,
    touched: &RecordBatch,
) -> Result<Option<LogicalPlan>> {
    let mut sources: Vec<(TableReference, Arc<dyn TableSource>, &[String])> = Vec::new();
    for ((side, name), of) in sides.iter().zip(SIDES).zip(&joined.sides) {
        crate::storage::session::register_table(ctx, name, &side.table, None).await?;
        let provider = ctx
            .table_provider(name)
            .await
            .context(|| format!("reading {}", side.name))?;
        sources.push((of.table.clone(), provider_as_source(provider), &of.columns));
    }
    let keys = Arc::new(
        MemTable::try_new(touched.schema(), vec![vec![touched.clone()]])
            .context(|| "the keys touched".into())?,
    );
    let keys = LogicalPlanBuilder::scan(TOUCHED_KEYS, provider_as_source(keys), None)
        .and_then(|b| b.build())
        .context(|| "the keys touched".into())?;
    let key_names: Vec<Column> = touched
        .schema()
        .fields()
        .iter()
        .map(|f| Column::new(Some(TOUCHED_KEYS), f.name()))
        .collect();
    let mut stale = false;
    let plan = df
        .logical_plan()
        .clone()
        .transform_up(|node| {
            let LogicalPlan::TableScan(scan) = node else {
                return Ok(Transformed::no(node));
            };
            let Some((_, source, columns)) = sources.iter().find(|(t, ..)| *t == scan.table_name)
            else {
                return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
            };
            stale |= source.schema() != scan.source.schema();
            let columns: Vec<Column> = columns
                .iter()
                .map(|c| Column::new(Some(scan.table_name.clone()), c))
                .collect();
            let scan = LogicalPlan::TableScan(TableScan {
                source: source.clone(),
                ..scan
            });
            LogicalPlanBuilder::from(scan)
                .join_detailed(
                    keys.clone(),
                    JoinType::LeftSemi,
                    (columns, key_names.clone()),
                    None,
                    NullEquality::NullEqualsNull,
                )?
                .build()
                .map(Transformed::yes)
        })
        .map(|t| t.data)
        .context(|| "planning the view over the keys touched".into())?;
    Ok((!stale).then_some(plan))
}
