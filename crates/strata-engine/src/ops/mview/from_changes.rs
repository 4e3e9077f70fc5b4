//! Refreshing a materialized view from what changed in the one table it reads: the result
//! over the rows the table gained, appended or combined per key with the view's rows, or the
//! groups its changed rows touch, recomputed in place of the view's. Which shapes of query
//! allow which is [`super::incremental`]'s to say; this module reads and writes.

use super::incremental::{self, Grouped, Shape};
use super::replace::{open_at, read_by, replace_touched, replaced, Grown, Incremental, VIEW_ROWS};
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
/// the rows it changed, the whole input, and the view's rows with the new groups.
const NEW_ROWS: &str = "__strata_new_rows";
const CHANGED_ROWS: &str = "__strata_changed_rows";
const WHOLE_INPUT: &str = "__strata_whole_input";
const COMBINED: &str = "__strata_combined";

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

/// Refreshes `view` from what changed in its inputs since the last refresh, when only they
/// changed and the query's shape allows ([`incremental`]); otherwise says why it must be
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
) -> Result<Incremental> {
    let shape = match incremental::shape_of(df.logical_plan()) {
        Ok(shape) => shape,
        Err(why) => return Ok(Err(why)),
    };
    let planned: Vec<&String> = df.schema().fields().iter().map(|f| f.name()).collect();
    let stored: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
    if planned != stored {
        // Declared column names: the view's rows and the query's do not line up by name.
        return Ok(Err("it declares its column names"));
    }
    let tables = match incremental::tables_grown(grown.last, grown.now) {
        Ok(tables) => tables,
        Err(why) => return Ok(Err(why)),
    };
    if let Shape::Joined(joined) = &shape {
        let target = super::rejoin::Target {
            mv,
            view,
            schema,
            commit,
        };
        return super::rejoin::refresh(wh, ctx, df, &target, grown, &tables, joined).await;
    }
    let one = match incremental::only_table(tables, grown.reads.len()) {
        Ok(one) => one,
        Err(why) => return Ok(Err(why)),
    };
    let Some(input) = Input::open(wh, df, grown.reads, &one).await? else {
        return Ok(Err(
            "it reads a view, a CTE or an earlier version of its table",
        ));
    };
    let changes = crate::storage::changes::changes_since(&input.table, Some(input.from)).await?;
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
        (Shape::Rows, false) => return Ok(Err("its table lost or changed rows")),
        // A dropped group would be missing from the rows the next refresh builds on.
        (Shape::Groups(_), _) if !mv.expectations.is_empty() => {
            return Ok(Err("it is grouped and has expectations"))
        }
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
            let touched = touched_groups(ctx, df, &input, schema, keys).await?;
            report.rows_read = touched.num_rows();
            crate::storage::session::register_table(ctx, WHOLE_INPUT, &input.table, None).await?;
            let whole = input
                .plan_over(ctx, df.logical_plan(), WHOLE_INPUT)
                .await?
                .ok_or_else(|| crate::error::EngineError::internal("a table of another schema"))?;
            report.refresh = Refresh::Regrouped;
            let replacing = (whole.clone(), touched.clone());
            if let Some(rows) =
                replace_touched(ctx, view, replacing.0, replacing.1, schema, keys, commit).await?
            {
                report.rows = rows;
                return Ok(Ok(report));
            }
            let rows = replaced(ctx, view, whole, touched, schema, keys).await?;
            (rows, RowChange::Overwrite)
        }
        (Shape::Groups(_), _) => {
            return Ok(Err(
                "it is a global aggregate and its table lost or changed rows",
            ))
        }
        (Shape::Joined(_), _) => return Ok(Err("it is a join")),
    };
    report.rows = rows.num_rows();
    tracing::info!(view = %name, input = %input.name, refresh = ?report.refresh,
        rows = report.rows, "incremental refresh");
    // The commit lands right after the view it was computed from (`exactly_next`, set by
    // `refresh` in mod.rs): another run's append of the same new rows in between would
    // double them.
    write_rows(view.clone(), vec![rows], change, commit)
        .await
        .context(|| format!("materialized view {name}: committing"))?;
    Ok(Ok(report))
}

impl Input {
    /// The table that grew (one of `reads`) at the version the refresh records, when the
    /// query reads it by one scan of its latest rows; `None` otherwise.
    async fn open(
        wh: &Warehouse,
        df: &DataFrame,
        reads: &[TableName],
        grown: &incremental::Growth,
    ) -> Result<Option<Input>> {
        let Some(scan) = one_scan(df.logical_plan()) else {
            return Ok(None);
        };
        let Some(read) = read_by(&scan.table_name, reads) else {
            return Ok(None);
        };
        if read.to_string() != grown.table {
            return Ok(None);
        }
        let Some(table) = open_at(wh, read, grown.until).await? else {
            return Ok(None);
        };
        Ok(Some(Input {
            name: read.clone(),
            table,
            scan,
            from: grown.from,
            until: grown.until,
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

/// The keys of the groups the input's changed rows touch (inserted, deleted or updated,
/// before and after), one row each.
async fn touched_groups(
    ctx: &SessionContext,
    df: &DataFrame,
    input: &Input,
    schema: &SchemaRef,
    keys: &[usize],
) -> Result<RecordBatch> {
    // The query over the changed rows gives one row per group they fall in (after its
    // filters, before and after each change).
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
    touched
        .project(keys)
        .context(|| "the keys of the groups touched".into())
}
