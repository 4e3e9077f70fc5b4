//! Refreshing a materialized view from what changed in the one table it reads: the result
//! over the rows the table gained, appended or combined per key with the view's rows, or the
//! groups its changed rows touch, recomputed in place of the view's. Which shapes of query
//! allow which is [`super::incremental`]'s to say; this module reads and writes.

use super::incremental::{self, Grouped, Shape};
use super::{collect_as, MvReport, Refresh};
use crate::error::{Context, Result};
use crate::sql::expect;
use crate::storage::commit::PendingCommit;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{write_rows, RowChange};
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::dataframe::DataFrame;
use deltalake::datafusion::datasource::{provider_as_source, MemTable};
use deltalake::datafusion::logical_expr::{LogicalPlan, TableScan};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{MaterializedView, TableName};

/// The session's names of what an incremental refresh reads: the rows the input gained,
/// the rows it changed, the whole input, the query over it, the view's rows, the keys of
/// the groups touched, and the view's rows with the new groups.
const NEW_ROWS: &str = "__strata_new_rows";
const CHANGED_ROWS: &str = "__strata_changed_rows";
const WHOLE_INPUT: &str = "__strata_whole_input";
const RECOMPUTED: &str = "__strata_recomputed";
const VIEW_ROWS: &str = "__strata_view_rows";
const TOUCHED: &str = "__strata_touched";
const COMBINED: &str = "__strata_combined";

/// What the last refresh read and what a refresh now reads.
pub(super) struct Grown<'a> {
    pub(super) last: &'a serde_json::Value,
    pub(super) now: &'a serde_json::Value,
    /// The tables behind the query (views resolved).
    pub(super) reads: &'a [TableName],
}

/// The one table a view reads, at the version the refresh records, with the scan that reads
/// it in the view's query.
struct Input {
    name: TableName,
    table: DeltaTable,
    scan: TableScan,
    /// The version the last refresh read.
    from: i64,
    until: i64,
}

/// Refreshes `view` from what changed in its one input since the last refresh, when only
/// that input changed and the query's shape allows ([`incremental`]); `None` when it must be
/// recomputed whole. `schema` is the view's stored schema, `commit` its commit.
#[allow(clippy::too_many_arguments)]
pub(super) async fn refresh(
    wh: &Warehouse,
    ctx: &SessionContext,
    df: &DataFrame,
    mv: &MaterializedView,
    view: &DeltaTable,
    grown: &Grown<'_>,
    schema: &SchemaRef,
    commit: &PendingCommit,
) -> Result<Option<MvReport>> {
    let Some((input, from, until)) = incremental::only_one_table_grew(grown.last, grown.now) else {
        return Ok(None);
    };
    let Some(shape) = incremental::shape_of(df.logical_plan()) else {
        return Ok(None);
    };
    let planned: Vec<&String> = df.schema().fields().iter().map(|f| f.name()).collect();
    let stored: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
    if planned != stored {
        // Declared column names: the view's rows and the query's do not line up by name.
        return Ok(None);
    }
    let Some(input) = Input::open(wh, df, grown.reads, &input, from, until).await? else {
        return Ok(None);
    };
    let changes = crate::storage::changes::changes_since(&input.table, Some(from)).await?;
    let appends = changes.only_appends;
    let name = mv.name.to_string();
    let mut report = MvReport::default();
    let (rows, change) = match (&shape, appends) {
        (Shape::Rows, true) => {
            let new = collect_as(new_rows(ctx, df, &input, &changes).await?, schema).await?;
            report.rows_read = new.num_rows();
            let (rows, counts) =
                expect::apply(&mv.expectations, &name, "the query's result", new).await?;
            report.expectations = counts;
            report.rows_dropped = report.rows_read - rows.num_rows();
            report.refresh = Refresh::Appended;
            (rows, RowChange::Append)
        }
        (Shape::Rows, false) => return Ok(None),
        // A dropped group would be missing from the rows the next refresh builds on.
        (Shape::Groups(_), _) if !mv.expectations.is_empty() => return Ok(None),
        (
            Shape::Groups(Grouped {
                combine: Some(combine),
                ..
            }),
            true,
        ) => {
            let new = collect_as(new_rows(ctx, df, &input, &changes).await?, schema).await?;
            report.rows_read = new.num_rows();
            let rows = combined(ctx, view, new, schema, combine).await?;
            report.refresh = Refresh::Combined;
            (rows, RowChange::Overwrite)
        }
        // A global aggregate is one group: recomputing it is recomputing the view.
        (Shape::Groups(Grouped { keys, .. }), _) if !keys.is_empty() => {
            let (rows, touched) = regrouped(ctx, df, &input, view, schema, keys).await?;
            report.rows_read = touched;
            report.refresh = Refresh::Regrouped;
            (rows, RowChange::Overwrite)
        }
        (Shape::Groups(_), _) => return Ok(None),
    };
    report.rows = rows.num_rows();
    tracing::info!(view = %name, input = %input.name, refresh = ?report.refresh,
        rows = report.rows, "incremental refresh");
    // An append computed from the view as it was must land right after it: another run's
    // append of the same new rows in between would double them (a conflict makes the
    // scheduler start the refresh again, which then finds the view up to date). A view
    // rewritten whole is consistent with the inputs it records, whoever lands last.
    let commit = match change {
        RowChange::Append => commit.clone().exactly_next(),
        _ => commit.clone(),
    };
    write_rows(view.clone(), vec![rows], change, &commit)
        .await
        .context(|| format!("materialized view {name}: committing"))?;
    Ok(Some(report))
}

impl Input {
    /// The table `input` (as the inputs record spells it, one of `reads`) at version
    /// `until`, when the query reads it by one scan of its latest rows; `None` otherwise.
    async fn open(
        wh: &Warehouse,
        df: &DataFrame,
        reads: &[TableName],
        input: &str,
        from: i64,
        until: i64,
    ) -> Result<Option<Input>> {
        let Some(read) = reads.iter().find(|t| t.to_string() == input) else {
            return Ok(None);
        };
        let Some(scan) = one_scan(df.logical_plan()) else {
            return Ok(None);
        };
        let named = &scan.table_name;
        if !named.table().eq_ignore_ascii_case(&read.name)
            || named
                .schema()
                .is_some_and(|s| !s.eq_ignore_ascii_case(&read.schema))
        {
            // A view, a time-travel read or a CTE by that name: not the table's latest rows.
            return Ok(None);
        }
        let Some(mut table) = wh.open_table(read).await? else {
            return Ok(None);
        };
        if crate::storage::table::version_of(&table) != until {
            table
                .load_version(until as u64)
                .await
                .context(|| format!("loading version {until} of {read}"))?;
        }
        Ok(Some(Input {
            name: read.clone(),
            table,
            scan,
            from,
            until,
        }))
    }

    /// `plan` reading `name` (registered in `ctx`) in place of this input's scan, when its
    /// rows have the scan's schema.
    async fn plan_over(
        &self,
        ctx: &SessionContext,
        plan: &LogicalPlan,
        name: &str,
    ) -> Result<Option<LogicalPlan>> {
        let provider = ctx
            .table_provider(name)
            .await
            .context(|| format!("reading {}", self.name))?;
        if provider.schema() != self.scan.source.schema() {
            return Ok(None);
        }
        incremental::with_scan_of(plan.clone(), provider_as_source(provider))
            .map(Some)
            .context(|| format!("planning the view over {}", self.name))
    }
}

/// The query over only the rows `input` gained after the last refresh (`changes`).
async fn new_rows(
    ctx: &SessionContext,
    df: &DataFrame,
    input: &Input,
    changes: &crate::storage::changes::Changes,
) -> Result<DataFrame> {
    crate::storage::changes::register_new_rows(
        ctx,
        NEW_ROWS,
        &input.table,
        Some(input.from),
        input.until,
        changes,
    )
    .await?;
    let plan = input
        .plan_over(ctx, df.logical_plan(), NEW_ROWS)
        .await?
        .ok_or_else(|| crate::error::EngineError::internal("new rows of another schema"))?;
    Ok(DataFrame::new(ctx.state(), plan))
}

/// The one table scan of `plan`.
fn one_scan(plan: &LogicalPlan) -> Option<TableScan> {
    use deltalake::datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut scans = Vec::new();
    let _ = plan.apply(|p| {
        if let LogicalPlan::TableScan(s) = p {
            scans.push(s.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match scans.len() {
        1 => scans.pop(),
        _ => None,
    }
}

/// A grouped view's rows combined per key with `new` (the query's result over new rows).
async fn combined(
    ctx: &SessionContext,
    view: &DeltaTable,
    new: RecordBatch,
    schema: &SchemaRef,
    combine: &[incremental::Combine],
) -> Result<RecordBatch> {
    crate::storage::session::register_table(ctx, VIEW_ROWS, view, None).await?;
    let held = ctx
        .table(VIEW_ROWS)
        .await
        .context(|| "reading the view's rows".into())?;
    let held = collect_as(held, schema).await?;
    let both = MemTable::try_new(schema.clone(), vec![vec![held, new]])
        .context(|| "combining groups".into())?;
    ctx.register_table(COMBINED, Arc::new(both))
        .context(|| "combining groups".into())?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let sql = incremental::combine_sql(COMBINED, &names, combine);
    let df = ctx.sql(&sql).await.context(|| "combining groups".into())?;
    collect_as(df, schema).await
}

/// A grouped view's rows with the groups the input's changed rows touch (inserted, deleted
/// or updated, before and after) recomputed from the whole input, and the number of groups
/// touched.
async fn regrouped(
    ctx: &SessionContext,
    df: &DataFrame,
    input: &Input,
    view: &DeltaTable,
    schema: &SchemaRef,
    keys: &[usize],
) -> Result<(RecordBatch, usize)> {
    // The groups touched: the query over the changed rows gives one row per group they
    // fall in (after its filters, before and after each change).
    let feed =
        crate::storage::feed::read_feed(&input.table, Some(input.from), Some(input.until), true)
            .await?;
    let columns: Vec<usize> = (0..feed.num_columns().saturating_sub(3)).collect();
    let changed = feed
        .project(&columns)
        .context(|| format!("the changes of {}", input.name))?;
    let source = input.scan.source.schema();
    let changed = arrow::cast_batch(&changed, &source)?;
    let changed = MemTable::try_new(source, vec![vec![changed]])
        .context(|| format!("the changes of {}", input.name))?;
    ctx.register_table(CHANGED_ROWS, Arc::new(changed))
        .context(|| format!("the changes of {}", input.name))?;
    let over_changes = input
        .plan_over(ctx, df.logical_plan(), CHANGED_ROWS)
        .await?
        .ok_or_else(|| crate::error::EngineError::internal("changed rows of another schema"))?;
    let touched = collect_as(DataFrame::new(ctx.state(), over_changes), schema).await?;
    let touched = touched
        .project(keys)
        .context(|| "the keys of the groups touched".into())?;
    let count = touched.num_rows();
    ctx.register_batch(TOUCHED, touched)
        .context(|| "the keys of the groups touched".into())?;
    // The query over the whole input, of which only the touched groups are taken.
    crate::storage::session::register_table(ctx, WHOLE_INPUT, &input.table, None).await?;
    let whole = input
        .plan_over(ctx, df.logical_plan(), WHOLE_INPUT)
        .await?
        .ok_or_else(|| crate::error::EngineError::internal("a table of another schema"))?;
    ctx.register_table(RECOMPUTED, DataFrame::new(ctx.state(), whole).into_view())
        .context(|| "recomputing the groups touched".into())?;
    crate::storage::session::register_table(ctx, VIEW_ROWS, view, None).await?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let sql = incremental::regroup_sql(VIEW_ROWS, RECOMPUTED, TOUCHED, &names, keys);
    let df = ctx
        .sql(&sql)
        .await
        .context(|| "recomputing the groups touched".into())?;
    Ok((collect_as(df, schema).await?, count))
}
