//! Reading a warehouse: SQL over all its tables, and the SCD2 integrity check.

use crate::error::{Context, EngineError, Result};
use crate::semantics::integrity::Violation;
use crate::semantics::integrity::{check_snapshots, check_timelines, Findings};
use crate::semantics::timeline::Timeline;
use crate::sql::session::rewrite;
use crate::sql::session::warehouse_session_in;
use crate::storage::session::new_session;
use crate::storage::session::register_table;
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::error::DataFusionError;
use deltalake::datafusion::prelude::SessionContext;
use std::sync::Arc;
use strata_sql::TableName;

/// Runs `sql` over every table of `wh`.
pub async fn query(wh: &Warehouse, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let prepared = match prepare_query(wh, sql, None).await? {
        PreparedQuery::Use(_) => {
            return Err(EngineError::plan(
                "query: nothing to run after USE (give the query after it, in the same text)",
            ))
        }
        PreparedQuery::Rows(schema, batches) => return Ok((schema, batches)),
        PreparedQuery::Sql(q) => q,
    };
    let df = prepared
        .session
        .sql(&prepared.sql)
        .await
        .map_err(|e| prepared.error(e))?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::of_query("query", e))?;
    Ok((schema, batches))
}

/// A query of `strata query` made ready to run (by [`prepare_query`]).
pub enum PreparedQuery {
    /// The text held only `USE` statements: the schema they select.
    Use(String),
    /// `DESCRIBE ...` or `SHOW TABLES ...`: its rows, already read.
    Rows(SchemaRef, Vec<RecordBatch>),
    /// Any other query: SQL for DataFusion over a session of the warehouse.
    Sql(SqlQuery),
}

/// SQL ready for DataFusion: `sql` is the query with strata's names and table functions
/// (`main.s.t`, `as_of`, `table_changes`, `VERSION AS OF`) rewritten into what `session`
/// has registered, every table of the warehouse at its latest committed version.
pub struct SqlQuery {
    pub session: SessionContext,
    pub sql: String,
    /// The schema of unqualified table names.
    pub schema: String,
    catalog: String,
}

impl SqlQuery {
    /// DataFusion's error planning or running this query as `strata query` reports it: a
    /// missing table named in the user's catalog with the nearest names, SQL that does not
    /// parse or plan as the user's mistake.
    pub fn error(&self, e: DataFusionError) -> EngineError {
        missing_table(&self.session, &self.catalog, &e.to_string())
            .unwrap_or_else(|| EngineError::of_query("query", e))
    }
}

/// `sql` (one query, after any leading `USE` statements) made ready to run over the latest
/// committed version of every table of `wh`. Unqualified table names are in `schema`
/// (`default` when `None`) unless a leading `USE` selects another. `DESCRIBE` and `SHOW
/// TABLES` are read here.
pub async fn prepare_query(
    wh: &Warehouse,
    sql: &str,
    schema: Option<&str>,
) -> Result<PreparedQuery> {
    let (used, sql) = crate::sql::catalog::leading_use(sql, wh.catalog())?;
    if sql.trim().is_empty() {
        if let Some(used) = used {
            return Ok(PreparedQuery::Use(used));
        }
    }
    let schema = used
        .as_deref()
        .or(schema)
        .unwrap_or(TableName::DEFAULT_SCHEMA);
    let sql =
        crate::sql::catalog::rewrite_catalog(sql, wh.catalog())?.unwrap_or_else(|| sql.to_string());
    if let Some(d) = crate::sql::describe::describe_of(&sql, schema)? {
        let (columns, rows) = crate::sql::describe::run_describe(wh, &d).await?;
        return Ok(PreparedQuery::Rows(columns, rows));
    }
    let session = warehouse_session_in(wh, schema).await?;
    let sql = rewrite(wh, &session, &sql, schema).await?;
    Ok(PreparedQuery::Sql(SqlQuery {
        session,
        sql,
        schema: schema.to_string(),
        catalog: wh.catalog().to_string(),
    }))
}

/// DataFusion's "table 'strata.default.x' not found" as the user sees the warehouse: the
/// catalog by its name (`main`), and the tables of the warehouse with the nearest names.
fn missing_table(ctx: &SessionContext, catalog: &str, error: &str) -> Option<EngineError> {
    let (_, rest) = error.split_once("table '")?;
    let (name, _) = rest.split_once("' not found")?;
    let parts: Vec<&str> = name.split('.').collect();
    let [_, schema, table] = parts.as_slice() else {
        return None;
    };
    let known: Vec<String> = ctx
        .catalog("strata")
        .map(|c| {
            c.schema_names()
                .into_iter()
                .filter(|s| s != "information_schema")
                .flat_map(|s| {
                    let names = c.schema(&s).map(|p| p.table_names()).unwrap_or_default();
                    names.into_iter().map(move |t| (s.clone(), t))
                })
                .map(|(s, t)| format!("{catalog}.{s}.{t}"))
                .collect()
        })
        .unwrap_or_default();
    let wanted = format!("{catalog}.{schema}.{table}");
    let near = nearest_names(&wanted, &known);
    let hint = match near.as_slice() {
        [] if known.is_empty() => "; the warehouse has no tables yet".to_string(),
        [] => String::new(),
        names => format!("; did you mean {}?", names.join(", ")),
    };
    Some(EngineError::NotFound(format!(
        "query: table {wanted} not found{hint}"
    )))
}

/// Up to three of `known` within a few edits of `wanted` (or sharing its last part up to
/// case), nearest first.
fn nearest_names(wanted: &str, known: &[String]) -> Vec<String> {
    use deltalake::datafusion::common::utils::datafusion_strsim::levenshtein;
    let last = |n: &str| n.rsplit('.').next().unwrap_or(n).to_ascii_lowercase();
    let mut scored: Vec<(usize, &String)> = known
        .iter()
        .map(|k| {
            let d = levenshtein(&last(wanted), &last(k)).min(levenshtein(wanted, k));
            (d, k)
        })
        .filter(|(d, k)| *d <= 1 + last(wanted).len() / 3 || last(k) == last(wanted))
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, k)| k.clone()).collect()
}

/// How `validate` reads a history table that strata did not write (a dbt snapshot, a
/// hand-made SCD2 table): its key and validity columns, and the value that marks an open
/// end when it is not NULL (`9999-12-31`). Unset fields come from the table's strata
/// properties, else from the column names of dbt (`dbt_valid_from`, `dbt_valid_to`) or
/// Databricks (`__START_AT`, `__END_AT`).
#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    pub keys: Option<Vec<String>>,
    pub valid_from: Option<String>,
    pub valid_to: Option<String>,
    pub open_end: Option<String>,
}

/// Checks an SCD2 table of the warehouse: at most one open version per key, no overlapping
/// intervals, `__START_AT < __END_AT`.
pub async fn validate(wh: &Warehouse, name: &str) -> Result<Vec<Violation>> {
    validate_with(wh, name, &ValidateOptions::default()).await
}

/// [`validate`] of a table of the warehouse or at a path (a folder holding `_delta_log`),
/// strata's or another tool's, read as `options` say.
pub async fn validate_with(
    wh: &Warehouse,
    name: &str,
    options: &ValidateOptions,
) -> Result<Vec<Violation>> {
    Ok(validate_report(wh, name, options).await?.violations)
}

/// What `validate` found: the violations, and the keys whose gap or missing open version a
/// delete or truncate strata applied explains (not violations; for a table strata did not write, such
/// keys are among the violations, as nothing says why they closed).
#[derive(Debug, Clone, Default)]
pub struct ValidationReport {
    pub violations: Vec<Violation>,
    pub deleted: Vec<Violation>,
}

/// [`validate_with`], with the keys that deletes explain.
pub async fn validate_report(
    wh: &Warehouse,
    name: &str,
    options: &ValidateOptions,
) -> Result<ValidationReport> {
    let found = |violations| ValidationReport {
        violations,
        deleted: Vec::new(),
    };
    let at = crate::storage::location::Location::parse(name, "table").ok();
    let is_path = match &at {
        Some(l @ crate::storage::location::Location::Object(_)) => l.has_delta_log().await?,
        Some(l) => l.local().is_some_and(|p| p.join("_delta_log").is_dir()),
        None => false,
    };
    let (table_name, table) = if let Some(path) = at.filter(|_| is_path) {
        let table = crate::storage::table::open_delta(&path)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("no Delta table at {name}")))?;
        (name.to_string(), table)
    } else {
        let table_name =
            TableName::parse(name, TableName::DEFAULT_SCHEMA).map_err(EngineError::NotFound)?;
        let table = wh.open_table(&table_name).await?.ok_or_else(|| {
            EngineError::NotFound(format!("no table {table_name} in {}", wh.root()))
        })?;
        (table_name.to_string(), table)
    };
    let config = crate::storage::table::table_properties(&table)?;
    if options.keys.is_some() {
        return Ok(found(
            validate_external(&table, &table_name, options).await?,
        ));
    }
    if config.contains_key(crate::semantics::pit::SOURCES_PROPERTY) {
        return Ok(found(
            crate::sql::pit_check::validate_pit(wh, &table, &table_name, &config).await?,
        ));
    }
    let keys: Vec<String> = crate::storage::table::recorded_keys(&config).ok_or_else(|| {
        EngineError::plan(format!(
            "{table_name} is not an AUTO CDC target of strata (no strata.keys property); \
                 to check a history table another tool wrote, name its key columns with \
                 --keys a,b"
        ))
    })?;
    let mode = config.get("strata.scdType").cloned().unwrap_or_default();
    if mode != "2" && mode != "snapshots" {
        return Err(EngineError::plan(format!(
            "{table_name} is not an SCD type 2 or SNAPSHOTS table; validate checks timelines"
        )));
    }
    let timeline = Timeline::from_properties(&config)?;
    let k = quoted_list(&keys);
    let sql = format!(
        "SELECT {k}, {}, {} FROM t",
        quote_ident(&timeline.valid_from),
        quote_ident(&timeline.valid_to)
    );
    let Some(batch) = timeline_rows(&table, &sql).await? else {
        return Ok(found(Vec::new()));
    };
    if mode == "snapshots" {
        return Ok(found(check_snapshots(&batch, &keys)?));
    }
    // The convention's open-end marker means "open", like NULL.
    let mut cols = batch.columns().to_vec();
    let n = keys.len();
    cols[n + 1] = timeline.open_as_null(&cols[n + 1])?;
    let batch = RecordBatch::try_new(batch.schema(), cols).context(|| "validate".into())?;
    let all = check_timelines(&batch, &keys, Findings::Reported)?;
    // A table at a path has no event store here to say which keys were deleted.
    let (deletes, truncates) = match TableName::parse(&table_name, TableName::DEFAULT_SCHEMA) {
        Ok(t) if !is_path => known_deletes(wh, &t, &keys).await?,
        _ => Default::default(),
    };
    // A version ending at a delete of its key, or at a truncate (which deletes every key).
    let (deleted, violations): (Vec<Violation>, Vec<Violation>) = all.into_iter().partition(|v| {
        v.ends_at.as_ref().is_some_and(|at| {
            truncates.contains(at) || deletes.contains(&(v.key.clone(), at.clone()))
        })
    });
    Ok(ValidationReport {
        violations,
        deleted,
    })
}

/// The (key, sequence value) of every delete in the event store of target `name`, displayed
/// as the integrity check displays keys and timeline values.
async fn known_deletes(
    wh: &Warehouse,
    name: &TableName,
    keys: &[String],
) -> Result<(
    std::collections::HashSet<(String, String)>,
    std::collections::HashSet<String>,
)> {
    use crate::semantics::fold::{OP_COL, SEQ_COL};
    use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
    let mut out = std::collections::HashSet::new();
    let mut truncates = std::collections::HashSet::new();
    let Some(store) = crate::storage::table::open_delta(&wh.event_store_location(name)).await?
    else {
        return Ok((out, truncates));
    };
    let options = FormatOptions::default().with_null("NULL");
    let sql = format!(
        "SELECT {} FROM t WHERE {} = 2",
        quote_ident(SEQ_COL),
        quote_ident(OP_COL)
    );
    if let Some(batch) = timeline_rows(&store, &sql).await? {
        let seq = ArrayFormatter::try_new(batch.column(0).as_ref(), &options)
            .context(|| "validate: reading truncates".into())?;
        truncates.extend((0..batch.num_rows()).map(|r| seq.value(r).to_string()));
    }
    let sql = format!(
        "SELECT {}, {} FROM t WHERE {} = 1",
        quoted_list(keys),
        quote_ident(SEQ_COL),
        quote_ident(OP_COL)
    );
    let Some(batch) = timeline_rows(&store, &sql).await? else {
        return Ok((out, truncates));
    };
    let fmts = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "validate: reading deletes".into())?;
    let n = keys.len();
    for r in 0..batch.num_rows() {
        let key = keys
            .iter()
            .enumerate()
            .map(|(c, k)| format!("{k}={}", fmts[c].value(r)))
            .collect::<Vec<_>>()
            .join(", ");
        out.insert((key, fmts[n].value(r).to_string()));
    }
    Ok((out, truncates))
}

/// [`validate_with`] for a table without strata's properties: its columns as `options` name
/// them or as dbt or Databricks name them.
async fn validate_external(
    table: &deltalake::DeltaTable,
    table_name: &str,
    options: &ValidateOptions,
) -> Result<Vec<Violation>> {
    let schema = crate::storage::table::table_schema(table)?;
    let has = |c: &str| schema.index_of(c).is_ok();
    let guess = |ours: &Option<String>, dbt: &str, databricks: &str| {
        ours.clone()
            .or_else(|| has(dbt).then(|| dbt.to_string()))
            .or_else(|| has(databricks).then(|| databricks.to_string()))
    };
    let (Some(from), Some(to)) = (
        guess(&options.valid_from, "dbt_valid_from", "__START_AT"),
        guess(&options.valid_to, "dbt_valid_to", "__END_AT"),
    ) else {
        return Err(EngineError::plan(format!(
            "{table_name}: which columns hold each row's validity? Pass --valid-from COL and \
             --valid-to COL (dbt's dbt_valid_from/dbt_valid_to and Databricks' \
             __START_AT/__END_AT are found by themselves)"
        )));
    };
    let keys = options.keys.clone().unwrap_or_default();
    for c in keys.iter().chain([&from, &to]) {
        if !has(c) {
            return Err(EngineError::plan(format!(
                "{table_name} has no column {c} ({})",
                crate::util::arrow::describe_fields(&schema)
            )));
        }
    }
    let k = quoted_list(&keys);
    // The open-end marker (if any) reads as NULL, as the check expects of an open row.
    let to_expr = match &options.open_end {
        None => quote_ident(&to),
        Some(marker) => format!(
            "CASE WHEN CAST({0} AS VARCHAR) LIKE {1} THEN NULL ELSE {0} END",
            quote_ident(&to),
            crate::util::sql::quote_str(&format!("{marker}%"))
        ),
    };
    let sql = format!(
        "SELECT {k}, {} AS __from, {to_expr} AS __to FROM t",
        quote_ident(&from)
    );
    let Some(batch) = timeline_rows(table, &sql).await? else {
        return Ok(Vec::new());
    };
    check_timelines(&batch, &keys, Findings::Reported)
}

/// `names` as a comma-separated list of quoted identifiers.
fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rows `sql` selects from `table` (registered as `t`) in one batch; `None` when there
/// are none. Both validations read their key and timeline columns this way.
async fn timeline_rows(table: &deltalake::DeltaTable, sql: &str) -> Result<Option<RecordBatch>> {
    let ctx = new_session();
    register_table(&ctx, "t", table, None).await?;
    let batches = ctx
        .sql(sql)
        .await
        .context(|| "validate".into())?
        .collect()
        .await
        .context(|| "validate".into())?;
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    concat_batches(&first.schema(), &batches)
        .map(Some)
        .context(|| "validate".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_are_few_and_close() {
        let known: Vec<String> = [
            "main.default.customer",
            "main.default.orders",
            "main.gold.Customers",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            nearest_names("main.default.customers", &known),
            // The same name in another schema (any case) first, then one edit away.
            vec![
                "main.gold.Customers".to_string(),
                "main.default.customer".to_string()
            ]
        );
        assert!(nearest_names("main.default.zzz", &known).is_empty());
    }
}
