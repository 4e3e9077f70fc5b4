//! `DESCRIBE HISTORY t` and `DESCRIBE DETAIL t` in `strata query`, with Databricks' column
//! names: a table's commits (newest first) and a one-row summary of its current state.
//! (`DESCRIBE t` and `SHOW TABLES` are DataFusion's own.)

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

/// Which DESCRIBE a query is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Describe {
    History(TableName),
    Detail(TableName),
}

/// `DESCRIBE [TABLE] HISTORY|DETAIL name [;]` as a [`Describe`]; `None` for any other query
/// (pure: no I/O).
pub(crate) fn describe_of(sql: &str, schema: &str) -> Result<Option<Describe>> {
    let upper = sql.trim_start().to_ascii_uppercase();
    if !upper.starts_with("DESCRIBE") && !upper.starts_with("DESC ") {
        return Ok(None);
    }
    let tokens: Vec<Token> = crate::util::sql::tokens_of(sql)?
        .into_iter()
        .map(|t| t.token)
        .filter(|t| *t != Token::SemiColon)
        .collect();
    let word = |i: usize| match tokens.get(i) {
        Some(Token::Word(w)) => Some(w.value.to_ascii_uppercase()),
        _ => None,
    };
    let mut i = 1;
    if word(i).as_deref() == Some("TABLE") {
        i += 1;
    }
    let kind = match word(i).as_deref() {
        Some("HISTORY") => "HISTORY",
        Some("DETAIL") => "DETAIL",
        _ => return Ok(None),
    };
    let mut parts = Vec::new();
    for (n, t) in tokens[i + 1..].iter().enumerate() {
        match (n % 2, t) {
            (0, Token::Word(w)) => parts.push(w.value.clone()),
            (1, Token::Period) => {}
            _ => {
                return Err(EngineError::plan(format!(
                    "query: DESCRIBE {kind} takes a table name, found {t}"
                )))
            }
        }
    }
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    if parts.is_empty() {
        return Err(EngineError::plan(format!(
            "query: DESCRIBE {kind} takes a table name"
        )));
    }
    let name = TableName::from_parts(&parts, schema).map_err(EngineError::NotFound)?;
    Ok(Some(match kind {
        "HISTORY" => Describe::History(name),
        _ => Describe::Detail(name),
    }))
}

/// The rows of `describe`.
pub(crate) async fn run_describe(
    wh: &Warehouse,
    describe: &Describe,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let name = match describe {
        Describe::History(n) | Describe::Detail(n) => n,
    };
    let table = wh.open_table(name).await?.ok_or_else(|| {
        EngineError::NotFound(format!("no table {name} in {}", wh.root().display()))
    })?;
    let batch = match describe {
        Describe::History(_) => history(&table).await?,
        Describe::Detail(_) => detail(&table, name).await?,
    };
    Ok((batch.schema(), vec![batch]))
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
        .map_err(|e| EngineError::Internal(format!("DESCRIBE HISTORY: {e}")))
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
        .map_err(|e| EngineError::Internal(format!("DESCRIBE DETAIL: {e}")))
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
        assert_eq!(describe_of("DESCRIBE users", "default").unwrap(), None);
        assert_eq!(describe_of("SELECT 1", "default").unwrap(), None);
        assert!(describe_of("DESCRIBE HISTORY", "default").is_err());
        assert!(describe_of("DESCRIBE HISTORY a b", "default").is_err());
    }
}
