//! Reading a warehouse: SQL over all its tables, and the SCD2 integrity check.

use crate::error::{Context, EngineError, Result};
use crate::flow::register_table;
use crate::sqlutil::quote_ident;
use crate::warehouse::{new_session, Warehouse};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::catalog::MemorySchemaProvider;
use deltalake::datafusion::prelude::SessionContext;
use std::sync::Arc;
use strata_sql::TableName;

/// A session where every table of `wh` is registered as `schema.name` (and `name` for the
/// default schema).
async fn warehouse_session(wh: &Warehouse) -> Result<SessionContext> {
    let ctx = new_session();
    let catalog = ctx
        .catalog("strata")
        .ok_or_else(|| EngineError::Internal("catalog strata missing".into()))?;
    for name in wh.list_tables()? {
        if catalog.schema(&name.schema).is_none() {
            catalog
                .register_schema(&name.schema, Arc::new(MemorySchemaProvider::new()))
                .context(|| format!("registering schema {}", name.schema))?;
        }
        if let Some(table) = wh.open_table(&name).await? {
            let reference = format!("{}.{}", quote_ident(&name.schema), quote_ident(&name.name));
            register_table(&ctx, &reference, &table, None).await?;
        }
    }
    Ok(ctx)
}

/// Runs `sql` over every table of `wh`.
pub async fn query(wh: &Warehouse, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let ctx = warehouse_session(wh).await?;
    let df = ctx
        .sql(sql)
        .await
        .map_err(|e| EngineError::Plan(format!("query: {e}")))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::Plan(format!("query: {e}")))?;
    Ok((schema, batches))
}

/// One broken invariant of an SCD2 table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `userId=123`
    pub key: String,
    pub problem: String,
}

/// Checks an SCD2 table: at most one open version per key, no overlapping intervals,
/// `__START_AT < __END_AT`.
pub async fn validate(wh: &Warehouse, name: &str) -> Result<Vec<Violation>> {
    let table_name = match name.split_once('.') {
        Some((s, n)) => TableName::new(Some(s), n),
        None => TableName::new(None, name),
    };
    let table = wh.open_table(&table_name).await?.ok_or_else(|| {
        EngineError::NotFound(format!("no table {table_name} in {}", wh.root().display()))
    })?;
    let config = table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .configuration()
        .clone();
    let keys: Vec<String> = config
        .get("strata.keys")
        .map(|k| k.split(',').map(str::to_string).collect())
        .ok_or_else(|| {
            EngineError::Plan(format!(
                "{table_name} is not an AUTO CDC target of strata (no strata.keys property)"
            ))
        })?;
    if config.get("strata.scdType").map(String::as_str) != Some("2") {
        return Err(EngineError::Plan(format!(
            "{table_name} is not an SCD type 2 table; validate checks SCD2 timelines"
        )));
    }
    let ctx = new_session();
    register_table(&ctx, "t", &table, None).await?;
    let k = keys
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let (s, e) = (quote_ident("__START_AT"), quote_ident("__END_AT"));
    let checks = [
        format!(
            "SELECT {k}, 'has ' || CAST(count(*) AS VARCHAR) || ' open versions' FROM t \
             WHERE {e} IS NULL GROUP BY {k} HAVING count(*) > 1"
        ),
        format!(
            "SELECT {k}, 'version starting at ' || CAST({s} AS VARCHAR) || ' does not end after it starts (ends at ' || CAST({e} AS VARCHAR) || ')' \
             FROM t WHERE {e} IS NOT NULL AND NOT ({s} < {e})"
        ),
        format!(
            "SELECT {k}, 'version starting at ' || CAST({s} AS VARCHAR) || ' overlaps the next one, starting at ' || CAST(nxt AS VARCHAR) \
             FROM (SELECT *, LEAD({s}) OVER (PARTITION BY {k} ORDER BY {s}) AS nxt FROM t) \
             WHERE nxt IS NOT NULL AND ({e} IS NULL OR {e} > nxt)"
        ),
    ];
    let mut out = Vec::new();
    for sql in checks {
        let batches = ctx
            .sql(&sql)
            .await
            .context(|| "validate".into())?
            .collect()
            .await
            .context(|| "validate".into())?;
        let options = FormatOptions::default().with_null("NULL");
        for b in batches {
            let formatters = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<Vec<_>, _>>()
                .context(|| "validate".into())?;
            for row in 0..b.num_rows() {
                let key = keys
                    .iter()
                    .enumerate()
                    .map(|(i, name)| format!("{name}={}", formatters[i].value(row)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let problem = formatters[keys.len()].value(row).to_string();
                out.push(Violation { key, problem });
            }
        }
    }
    Ok(out)
}
