//! `DESCRIBE [TABLE] [EXTENDED] t`, `DESCRIBE HISTORY t`, `DESCRIBE DETAIL t` and `SHOW
//! TABLES [IN schema]` in `strata query`, with Databricks' column names: a table's columns
//! (with their comments, and with `EXTENDED` its details), its commits (newest first), a
//! one-row summary of its current state, the warehouse's tables.

use crate::error::{Context, EngineError, Result};
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::array::{
    ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
use deltalake::DeltaTable;
use futures::StreamExt;
use std::sync::Arc;
use strata_sql::TableName;

/// Which DESCRIBE (or SHOW TABLES) a query is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Describe {
    Table {
        name: TableName,
        extended: bool,
    },
    History(TableName),
    Detail(TableName),
    /// `SHOW TABLES [IN|FROM schema]`: `None` for every schema.
    ShowTables(Option<String>),
}

/// The words and names of a query, without its `;`.
fn words(sql: &str) -> Result<Vec<Token>> {
    Ok(crate::util::sql::tokens_of(sql)?
        .into_iter()
        .map(|t| t.token)
        .filter(|t| *t != Token::SemiColon)
        .collect())
}

/// `a.b.c` from `tokens` (alternating words and periods), or `None`.
fn dotted(tokens: &[Token]) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    for (n, t) in tokens.iter().enumerate() {
        match (n % 2, t) {
            (0, Token::Word(w)) => parts.push(w.value.clone()),
            (1, Token::Period) => {}
            _ => return None,
        }
    }
    (!parts.is_empty() && tokens.len() % 2 == 1).then_some(parts)
}

/// `DESCRIBE ...` or `SHOW TABLES ...` as a [`Describe`]; `None` for any other query
/// (pure: no I/O). `schema` is the schema of unqualified names.
pub(crate) fn describe_of(sql: &str, schema: &str) -> Result<Option<Describe>> {
    let upper = sql.trim_start().to_ascii_uppercase();
    if upper.starts_with("SHOW") {
        return show_tables_of(sql);
    }
    if !upper.starts_with("DESCRIBE") && !upper.starts_with("DESC ") {
        return Ok(None);
    }
    let tokens = words(sql)?;
    let word = |i: usize| match tokens.get(i) {
        Some(Token::Word(w)) => Some(w.value.to_ascii_uppercase()),
        _ => None,
    };
    let mut i = 1;
    if word(i).as_deref() == Some("TABLE") {
        i += 1;
    }
    let kind = match word(i).as_deref() {
        Some(k @ ("HISTORY" | "DETAIL" | "EXTENDED")) if tokens.len() > i + 1 => {
            i += 1;
            k.to_string()
        }
        _ => "TABLE".to_string(),
    };
    let Some(parts) = dotted(&tokens[i..]) else {
        if kind == "TABLE" {
            // Not a table name: DataFusion's own DESCRIBE (of a query) answers.
            return Ok(None);
        }
        return Err(EngineError::plan(format!(
            "query: DESCRIBE {kind} takes a table name"
        )));
    };
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let name = TableName::from_parts(&parts, schema).map_err(EngineError::NotFound)?;
    Ok(Some(match kind.as_str() {
        "HISTORY" => Describe::History(name),
        "DETAIL" => Describe::Detail(name),
        k => Describe::Table {
            name,
            extended: k == "EXTENDED",
        },
    }))
}

/// `SHOW TABLES [IN|FROM [catalog.]schema]`.
fn show_tables_of(sql: &str) -> Result<Option<Describe>> {
    let tokens = words(sql)?;
    let word = |i: usize| match tokens.get(i) {
        Some(Token::Word(w)) => Some(w.value.to_ascii_uppercase()),
        _ => None,
    };
    if word(1).as_deref() != Some("TABLES") {
        return Ok(None);
    }
    if tokens.len() == 2 {
        return Ok(Some(Describe::ShowTables(None)));
    }
    let in_schema = matches!(word(2).as_deref(), Some("IN" | "FROM"));
    match dotted(&tokens[3.min(tokens.len())..]) {
        Some(parts) if in_schema && parts.len() <= 2 => {
            if parts.len() == 2
                && !TableName::CATALOGS
                    .iter()
                    .any(|c| c.eq_ignore_ascii_case(&parts[0]))
            {
                return Err(EngineError::NotFound(format!(
                    "catalog {} is not this warehouse; its catalog is called {}",
                    parts[0],
                    TableName::CATALOGS.join(" or ")
                )));
            }
            Ok(Some(Describe::ShowTables(parts.last().cloned())))
        }
        _ => Ok(None),
    }
}

/// The rows of `describe`.
pub(crate) async fn run_describe(
    wh: &Warehouse,
    describe: &Describe,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let name = match describe {
        Describe::History(n) | Describe::Detail(n) | Describe::Table { name: n, .. } => n,
        Describe::ShowTables(schema) => {
            let batch = show_tables(wh, schema.as_deref()).await?;
            return Ok((batch.schema(), vec![batch]));
        }
    };
    let table = wh
        .open_table(name)
        .await?
        .ok_or_else(|| EngineError::NotFound(format!("no table {name} in {}", wh.root())))?;
    let batch = match describe {
        Describe::History(_) => history(&table).await?,
        Describe::Detail(_) => detail(&table, name).await?,
        Describe::Table { extended, .. } => columns(&table, name, *extended, wh.catalog())?,
        Describe::ShowTables(_) => unreachable!("answered above"),
    };
    Ok((batch.schema(), vec![batch]))
}

/// `SHOW TABLES`: `database`, `tableName`, `isTemporary`, as Databricks.
async fn show_tables(wh: &Warehouse, schema: Option<&str>) -> Result<RecordBatch> {
    let mut tables = wh.list_tables().await?;
    // The event log, which queries read as `event_log`, is listed like a table.
    let log = TableName::new(None, crate::storage::warehouse::EVENT_LOG_TABLE);
    if !tables.contains(&log)
        && crate::storage::table::open_delta(&wh.event_log_location())
            .await?
            .is_some()
    {
        tables.push(log);
        tables.sort();
    }
    let tables: Vec<TableName> = tables
        .into_iter()
        .filter(|t| schema.is_none_or(|s| t.schema.eq_ignore_ascii_case(s)))
        .collect();
    let fields = vec![
        Field::new("database", DataType::Utf8, false),
        Field::new("tableName", DataType::Utf8, false),
        Field::new("isTemporary", DataType::Boolean, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            tables.iter().map(|t| t.schema.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            tables.iter().map(|t| t.name.as_str()),
        )),
        Arc::new(BooleanArray::from(vec![false; tables.len()])),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| EngineError::internal(format!("SHOW TABLES: {e}")))
}

/// `DESCRIBE [EXTENDED] t`: `col_name`, `data_type` (Spark's spelling), `comment`, one row
/// per column; with `EXTENDED`, then the partition columns and the table's details, in
/// Databricks' layout (a blank row, then `# ...` headings).
fn columns(
    table: &DeltaTable,
    name: &TableName,
    extended: bool,
    catalog: &str,
) -> Result<RecordBatch> {
    let state = table.snapshot().context(|| "reading table state".into())?;
    let meta = state.metadata();
    let schema = crate::storage::table::table_schema(table)?;
    let mut rows: Vec<(String, String, Option<String>)> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut t = crate::semantics::declared::spark_name(f.data_type());
            if !f.is_nullable() {
                t.push_str(" NOT NULL");
            }
            let comment = f
                .metadata()
                .get(crate::semantics::declared::COMMENT_KEY)
                .cloned();
            (f.name().clone(), t, comment)
        })
        .collect();
    let blank = || (String::new(), String::new(), None);
    let partitions = meta.partition_columns();
    if !partitions.is_empty() {
        rows.push(blank());
        rows.push(("# Partition Information".into(), String::new(), None));
        rows.push((
            "# col_name".into(),
            "data_type".into(),
            Some("comment".into()),
        ));
        for p in partitions {
            if let Some(r) = rows.iter().find(|r| &r.0 == p).cloned() {
                rows.push(r);
            }
        }
    }
    if extended {
        let generated: Vec<String> = schema
            .fields()
            .iter()
            .filter_map(|f| {
                f.metadata()
                    .get(crate::semantics::declared::GENERATION_KEY)
                    .map(|e| format!("{} = {e}", f.name()))
            })
            .collect();
        let properties = meta
            .configuration()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        rows.push(blank());
        rows.push(("# Detailed Table Information".into(), String::new(), None));
        for (k, v) in [
            ("Catalog", Some(catalog.to_string())),
            ("Database", Some(name.schema.clone())),
            ("Table", Some(name.name.clone())),
            ("Type", Some("MANAGED".to_string())),
            ("Location", Some(table.table_url().to_string())),
            ("Provider", Some("delta".to_string())),
            ("Comment", meta.description().map(str::to_string)),
            (
                "Generated Columns",
                (!generated.is_empty()).then(|| generated.join(", ")),
            ),
            ("Table Properties", Some(format!("[{properties}]"))),
        ] {
            if let Some(v) = v {
                rows.push((k.to_string(), v, None));
            }
        }
    }
    let fields = vec![
        Field::new("col_name", DataType::Utf8, false),
        Field::new("data_type", DataType::Utf8, false),
        Field::new("comment", DataType::Utf8, true),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.1))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2.as_deref()))),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| EngineError::internal(format!("DESCRIBE: {e}")))
}

fn text(v: Option<&serde_json::Value>) -> Option<String> {
    v.map(|v| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// One row per commit, newest first.
async fn history(table: &DeltaTable) -> Result<RecordBatch> {
    let latest = crate::storage::table::version_of(table);
    let mut rows = Vec::new();
    let mut commits = table.history(None);
    while let Some(c) = commits.next().await {
        rows.push(c.context(|| "reading table history".into())?);
    }
    let version: Int64Array = (0..rows.len() as i64).map(|i| Some(latest - i)).collect();
    let timestamp: TimestampMillisecondArray = rows.iter().map(|c| c.timestamp).collect();
    let timestamp = timestamp.with_timezone("UTC");
    let operation: StringArray = rows.iter().map(|c| c.operation.clone()).collect();
    let parameters: StringArray = rows
        .iter()
        .map(|c| {
            c.operation_parameters
                .as_ref()
                .map(|p| serde_json::to_string(p).unwrap_or_default())
        })
        .collect();
    let read_version: Int64Array = rows
        .iter()
        .map(|c| c.read_version.map(|v| v as i64))
        .collect();
    let blind: BooleanArray = rows.iter().map(|c| c.is_blind_append).collect();
    let metrics: StringArray = rows
        .iter()
        .map(|c| text(c.info.get("operationMetrics")))
        .collect();
    let run: StringArray = rows
        .iter()
        .map(|c| text(c.info.get(crate::storage::commit::RUN_KEY)))
        .collect();
    let engine: StringArray = rows.iter().map(|c| c.engine_info.clone()).collect();
    let ms_utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let fields = vec![
        Field::new("version", DataType::Int64, false),
        Field::new("timestamp", ms_utc, true),
        Field::new("operation", DataType::Utf8, true),
        Field::new("operationParameters", DataType::Utf8, true),
        Field::new("readVersion", DataType::Int64, true),
        Field::new("isBlindAppend", DataType::Boolean, true),
        Field::new("operationMetrics", DataType::Utf8, true),
        Field::new("userMetadata", DataType::Utf8, true),
        Field::new("engineInfo", DataType::Utf8, true),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(version),
        Arc::new(timestamp),
        Arc::new(operation),
        Arc::new(parameters),
        Arc::new(read_version),
        Arc::new(blind),
        Arc::new(metrics),
        Arc::new(run),
        Arc::new(engine),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| EngineError::internal(format!("DESCRIBE HISTORY: {e}")))
}

/// One row: the table's format, id, location, files, size, properties and protocol.
async fn detail(table: &DeltaTable, name: &TableName) -> Result<RecordBatch> {
    let state = table.snapshot().context(|| "reading table state".into())?;
    let meta = state.metadata();
    let files = state.log_data();
    let size: i64 = files.iter().map(|f| f.size()).sum();
    let last = table
        .history(Some(1))
        .next()
        .await
        .transpose()
        .context(|| "reading table history".into())?
        .and_then(|c| c.timestamp);
    let properties = serde_json::to_string(meta.configuration()).unwrap_or_default();
    let partitions = serde_json::to_string(meta.partition_columns()).unwrap_or_default();
    let ms_utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let fields = vec![
        Field::new("format", DataType::Utf8, false),
        Field::new("id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, true),
        Field::new("location", DataType::Utf8, false),
        Field::new("createdAt", ms_utc.clone(), true),
        Field::new("lastModified", ms_utc, true),
        Field::new("partitionColumns", DataType::Utf8, false),
        Field::new("numFiles", DataType::Int64, false),
        Field::new("sizeInBytes", DataType::Int64, false),
        Field::new("properties", DataType::Utf8, false),
        Field::new("minReaderVersion", DataType::Int64, false),
        Field::new("minWriterVersion", DataType::Int64, false),
    ];
    let ts = |v: Option<i64>| {
        Arc::new(TimestampMillisecondArray::from(vec![v]).with_timezone("UTC")) as ArrayRef
    };
    let s = |v: String| Arc::new(StringArray::from(vec![v])) as ArrayRef;
    let n = |v: i64| Arc::new(Int64Array::from(vec![v])) as ArrayRef;
    let columns: Vec<ArrayRef> = vec![
        s("delta".into()),
        s(meta.id().to_string()),
        s(name.to_string()),
        Arc::new(StringArray::from(vec![meta
            .description()
            .map(str::to_string)])),
        s(table.table_url().to_string()),
        ts(meta.created_time()),
        ts(last),
        s(partitions),
        n(files.num_files() as i64),
        n(size),
        s(properties),
        n(state.protocol().min_reader_version() as i64),
        n(state.protocol().min_writer_version() as i64),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| EngineError::internal(format!("DESCRIBE DETAIL: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_history_and_detail_are_recognised_with_their_table() {
        let users = TableName::new(Some("default"), "users");
        assert_eq!(
            describe_of("DESCRIBE HISTORY users", "default").unwrap(),
            Some(Describe::History(users.clone()))
        );
        assert_eq!(
            describe_of("describe table detail main.default.users;", "default").unwrap(),
            Some(Describe::Detail(users))
        );
        assert_eq!(describe_of("SELECT 1", "default").unwrap(), None);
        assert!(describe_of("DESCRIBE HISTORY a b", "default").is_err());
    }

    #[test]
    fn describe_table_extended_and_show_tables_are_recognised() {
        let users = TableName::new(Some("default"), "users");
        let table = |extended| Describe::Table {
            name: users.clone(),
            extended,
        };
        assert_eq!(
            describe_of("DESCRIBE users", "default").unwrap(),
            Some(table(false))
        );
        assert_eq!(
            describe_of("DESC TABLE main.default.users", "default").unwrap(),
            Some(table(false))
        );
        assert_eq!(
            describe_of("DESCRIBE TABLE EXTENDED users;", "default").unwrap(),
            Some(table(true))
        );
        // A table named like a keyword is still a table.
        assert_eq!(
            describe_of("DESCRIBE history", "default").unwrap(),
            Some(Describe::Table {
                name: TableName::new(Some("default"), "history"),
                extended: false
            })
        );
        assert_eq!(describe_of("DESCRIBE SELECT 1", "default").unwrap(), None);
        assert_eq!(
            describe_of("SHOW TABLES", "default").unwrap(),
            Some(Describe::ShowTables(None))
        );
        assert_eq!(
            describe_of("show tables in main.gold", "default").unwrap(),
            Some(Describe::ShowTables(Some("gold".into())))
        );
        assert!(describe_of("SHOW TABLES IN other.gold", "default").is_err());
        assert_eq!(describe_of("SHOW COLUMNS FROM t", "default").unwrap(), None);
    }
}
