//! What the incremental refreshes of materialized views share: the inputs of the last
//! refresh and of this one, the tables a view's scans read at the versions a refresh
//! records, and the view's rows of some keys replaced by those recomputed from its inputs
//! (the groups touched of a GROUP BY, the join keys touched of a join).

use super::incremental;
use super::{collect_as, MvReport};
use crate::error::{Context, Result};
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::common::TableReference;
use deltalake::datafusion::dataframe::DataFrame;
use deltalake::datafusion::logical_expr::LogicalPlan;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use strata_sql::TableName;

/// The session's names of the query over whole inputs, the view's rows and the keys
/// touched.
const RECOMPUTED: &str = "__strata_recomputed";
pub(super) const VIEW_ROWS: &str = "__strata_view_rows";
const TOUCHED: &str = "__strata_touched";

/// What the last refresh read and what a refresh now reads.
pub(super) struct Grown<'a> {
    pub(super) last: &'a serde_json::Value,
    pub(super) now: &'a serde_json::Value,
    /// The tables behind the query (views resolved).
    pub(super) reads: &'a [TableName],
}

/// What an incremental refresh gives: the report of the refresh it made, or why the view
/// must be recomputed whole.
pub(super) type Incremental = std::result::Result<MvReport, &'static str>;

/// The table of `reads` that a scan named `named` reads, when it is one: not a view, a
/// time-travel read or a CTE by that name, which are not the table's latest rows.
pub(super) fn read_by<'a>(named: &TableReference, reads: &'a [TableName]) -> Option<&'a TableName> {
    let mut matching = reads.iter().filter(|read| {
        named.table().eq_ignore_ascii_case(&read.name)
            && named
                .schema()
                .is_none_or(|s| s.eq_ignore_ascii_case(&read.schema))
    });
    match (matching.next(), matching.next()) {
        (Some(read), None) => Some(read),
        _ => None,
    }
}

/// `read` at version `until`, when it exists.
pub(super) async fn open_at(
    wh: &Warehouse,
    read: &TableName,
    until: i64,
) -> Result<Option<DeltaTable>> {
    let Some(mut table) = wh.open_table(read).await? else {
        return Ok(None);
    };
    if crate::storage::table::version_of(&table) != until {
        table
            .load_version(until as u64)
            .await
            .context(|| format!("loading version {until} of {read}"))?;
    }
    Ok(Some(table))
}

/// The view's rows with those of the keys `touched` (the view's `keys` columns) replaced by
/// the rows of `recomputed` (the query over whole inputs) with those keys; the rows of other
/// keys stay. Keys compare as GROUP BY compares them (NULLs equal).
pub(super) async fn replaced(
    ctx: &SessionContext,
    view: &DeltaTable,
    recomputed: LogicalPlan,
    touched: RecordBatch,
    schema: &SchemaRef,
    keys: &[usize],
) -> Result<RecordBatch> {
    ctx.register_batch(TOUCHED, touched)
        .context(|| "the keys touched".into())?;
    ctx.register_table(
        RECOMPUTED,
        DataFrame::new(ctx.state(), recomputed).into_view(),
    )
    .context(|| "recomputing the keys touched".into())?;
    crate::storage::session::register_table(ctx, VIEW_ROWS, view, None).await?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let sql = incremental::regroup_sql(VIEW_ROWS, RECOMPUTED, TOUCHED, &names, keys);
    let df = ctx
        .sql(&sql)
        .await
        .context(|| "recomputing the keys touched".into())?;
    collect_as(df, schema).await
}
