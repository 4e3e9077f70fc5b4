//! Sessions over a warehouse: every table registered by name, strata's table functions
//! (`as_of`, `table_changes`) rewritten, and sessions of empty tables for planning.

use crate::error::{Context, EngineError, Result};
use crate::sql::shapes::Shapes;
use crate::storage::session::register_table;
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::catalog::MemorySchemaProvider;
use deltalake::datafusion::prelude::SessionContext;
use std::sync::Arc;
use strata_sql::TableName;

/// A session where every table of `wh` is registered as `schema.name`, unqualified table
/// names being in `schema`.
pub(crate) async fn warehouse_session_in(wh: &Warehouse, schema: &str) -> Result<SessionContext> {
    let ctx = crate::storage::session::new_session_in(schema);
    let tables = wh.list_tables().await?;
    let log = TableName::new(None, crate::storage::warehouse::EVENT_LOG_TABLE);
    if !tables.contains(&log) {
        if let Some(t) = crate::storage::table::open_delta(&wh.event_log_location()).await? {
            register_table(&ctx, crate::storage::warehouse::EVENT_LOG_TABLE, &t, None).await?;
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
        .ok_or_else(|| EngineError::internal("catalog strata missing"))?;
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
    let sql =
        crate::sql::catalog::rewrite_catalog(sql, wh.catalog())?.unwrap_or_else(|| sql.to_string());
    let sql = crate::sql::time_travel::rewrite_time_travel(wh, ctx, &sql, schema)
        .await?
        .unwrap_or(sql);
    let sql = crate::sql::as_of::rewrite_as_of(wh, &sql, schema)
        .await?
        .unwrap_or(sql);
    Ok(
        crate::sql::table_changes::rewrite_table_changes(wh, ctx, &sql, schema)
            .await?
            .unwrap_or(sql),
    )
}

/// [`rewrite`] for planning only: `as_of` reads its table's columns, `table_changes` an
/// empty feed of its table's columns (from `shapes`).
pub(crate) fn rewrite_shape(
    ctx: &SessionContext,
    sql: &str,
    schema: &str,
    shapes: &Shapes,
) -> Result<String> {
    let sql = crate::sql::catalog::rewrite_catalog(sql, TableName::CATALOGS[0])?
        .unwrap_or_else(|| sql.to_string());
    let sql = crate::sql::as_of::shape_as_of(&sql)?.unwrap_or(sql);
    Ok(crate::sql::table_changes::shape_table_changes(ctx, &sql, schema, shapes)?.unwrap_or(sql))
}

/// A session for planning a query over `shapes`: each table is registered empty, with its
/// columns, as `schema.name` (and `name` for the tables of `default_schema`).
pub(crate) fn shape_session(default_schema: &str, shapes: &Shapes) -> Result<SessionContext> {
    let ctx = crate::storage::session::new_session_in(default_schema);
    for (name, columns) in shapes {
        let reference = reference_in(&ctx, name)?;
        ctx.register_batch(&reference, RecordBatch::new_empty(columns.clone()))
            .context(|| format!("registering {name}"))?;
    }
    Ok(ctx)
}
