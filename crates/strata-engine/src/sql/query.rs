//! Reading a warehouse: SQL over all its tables, and the SCD2 integrity check.

use crate::error::{Context, EngineError, Result};
use crate::semantics::integrity::Violation;
use crate::semantics::integrity::{check_snapshots, check_timelines};
use crate::semantics::timeline::Timeline;
use crate::sql::session::rewrite;
use crate::sql::session::warehouse_session;
use crate::storage::session::new_session;
use crate::storage::session::register_table;
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;
use std::sync::Arc;
use strata_sql::TableName;

/// Runs `sql` over every table of `wh`.
pub async fn query(wh: &Warehouse, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    if let Some(d) = crate::sql::describe::describe_of(sql, TableName::DEFAULT_SCHEMA)? {
        return crate::sql::describe::run_describe(wh, &d).await;
    }
    let ctx = warehouse_session(wh).await?;
    let sql = rewrite(wh, &ctx, sql, TableName::DEFAULT_SCHEMA).await?;
    let df = ctx
        .sql(&sql)
        .await
        .map_err(|e| EngineError::of_query("query", e))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::of_query("query", e))?;
    Ok((schema, batches))
}

/// Checks an SCD2 table: at most one open version per key, no overlapping intervals,
/// `__START_AT < __END_AT`.
pub async fn validate(wh: &Warehouse, name: &str) -> Result<Vec<Violation>> {
    let table_name =
        TableName::parse(name, TableName::DEFAULT_SCHEMA).map_err(EngineError::NotFound)?;
    let table = wh.open_table(&table_name).await?.ok_or_else(|| {
        EngineError::NotFound(format!("no table {table_name} in {}", wh.root().display()))
    })?;
    let config = crate::storage::table::table_properties(&table)?;
    let keys: Vec<String> = config
        .get("strata.keys")
        .map(|k| k.split(',').map(str::to_string).collect())
        .ok_or_else(|| {
            EngineError::plan(format!(
                "{table_name} is not an AUTO CDC target of strata (no strata.keys property)"
            ))
        })?;
    let mode = config.get("strata.scdType").cloned().unwrap_or_default();
    if mode != "2" && mode != "snapshots" {
        return Err(EngineError::plan(format!(
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
