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
    register_parts(ctx, view, recomputed, touched).await?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let sql = incremental::regroup_sql(VIEW_ROWS, RECOMPUTED, TOUCHED, &names, keys);
    let df = ctx
        .sql(&sql)
        .await
        .context(|| "recomputing the keys touched".into())?;
    collect_as(df, schema).await
}

/// Registers the keys touched, the recomputed rows and the view's rows in `ctx` (in place of
/// earlier ones).
async fn register_parts(
    ctx: &SessionContext,
    view: &DeltaTable,
    recomputed: LogicalPlan,
    touched: RecordBatch,
) -> Result<()> {
    // Registered again when an attempt to replace the keys fell back to a rewrite.
    for name in [TOUCHED, RECOMPUTED, VIEW_ROWS] {
        ctx.deregister_table(name)
            .context(|| format!("unregistering {name}"))?;
    }
    ctx.register_batch(TOUCHED, touched)
        .context(|| "the keys touched".into())?;
    ctx.register_table(
        RECOMPUTED,
        DataFrame::new(ctx.state(), recomputed).into_view(),
    )
    .context(|| "recomputing the keys touched".into())?;
    crate::storage::session::register_table(ctx, VIEW_ROWS, view, None).await
}

/// Replaces the view's rows of the keys `touched` (columns `keys`) by the ones `recomputed`
/// gives for them, in one commit, `commit`, which must land right after the version read
/// (another refresh in between makes it a conflict, and the refresh starts again): their
/// old rows marked deleted, or the files holding them rewritten, the new rows added, and a
/// change file (`storage/replace.rs`). Returns the view's row count after it, or `None`,
/// having done nothing, when the view's table cannot be changed that way or a touched key
/// is NULL (the caller then rewrites it whole with [`replaced`]).
pub(super) async fn replace_touched(
    ctx: &SessionContext,
    view: &DeltaTable,
    recomputed: LogicalPlan,
    touched: RecordBatch,
    schema: &SchemaRef,
    keys: &[usize],
    commit: &crate::storage::commit::PendingCommit,
) -> Result<Option<usize>> {
    register_parts(ctx, view, recomputed, touched).await?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let rows_of = |table: &str| incremental::touched_rows_sql(table, TOUCHED, &names, keys);
    let query = |sql: String| async move {
        let df = ctx
            .sql(&sql)
            .await
            .context(|| "recomputing the keys touched".into())?;
        collect_as(df, schema).await
    };
    let old = query(rows_of(VIEW_ROWS)).await?;
    let new = query(rows_of(RECOMPUTED)).await?;
    let held = ctx
        .sql(&format!("SELECT count(*) FROM \"{VIEW_ROWS}\""))
        .await
        .context(|| "counting the view's rows".into())?
        .collect()
        .await
        .context(|| "counting the view's rows".into())?;
    let held = held
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<deltalake::arrow::array::Int64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or_default() as usize;
    // Key replacement matches keys that hold a value: a NULL group or join key is
    // rewritten with the view.
    let null_key = |rows: &RecordBatch| keys.iter().any(|&k| rows.column(k).null_count() > 0);
    if null_key(&old) || null_key(&new) {
        return Ok(None);
    }
    let after = held - old.num_rows() + new.num_rows();
    let key_names: Vec<String> = keys.iter().map(|&k| names[k].clone()).collect();
    let commit = commit.clone().exactly_next();
    // A changed key's row differs on both sides: the feed is the rows themselves.
    let feed = crate::storage::replace::Feed {
        deleted: old.clone(),
        inserted: new.clone(),
    };
    let done =
        crate::storage::replace::replace_keys(view, &key_names, &old, new, &feed, &commit).await?;
    Ok(done.map(|_| after))
}
