//! PostgreSQL sinks: rows a pipeline sends to a PostgreSQL table, exactly once.
//!
//! The engine keeps what a sink sends in a Delta table of its own (its outbox) and hands a
//! delivery the outbox's rows since the outbox version the PostgreSQL table last received.
//! A delivery is one PostgreSQL transaction ([`PgSink::begin`], [`PgSink::delete_keys`],
//! [`PgSink::copy_rows`], then [`PgSink::finish`]):
//!
//! 1. the table `strata_sink_positions` (in the target's schema) and the target (with the
//!    primary key the engine asks for) are created when missing; a column the target lacks
//!    is added to it (NULL in its earlier rows);
//! 2. the sink's row in `strata_sink_positions` is locked (a concurrent delivery waits) and
//!    says which outbox version the table holds, and of which outbox (its Delta table id:
//!    a table fed by another outbox is refused);
//! 3. the target's rows of the keys the delivery replaces are deleted, the rows are copied
//!    in (`COPY ... FROM STDIN`, text format), and the position is set to the version sent.
//!
//! A crash before `COMMIT` leaves the table and its position as they were, and the next
//! delivery sends the same versions again; after it, they are never sent again.

use std::fmt::Write as _;

use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use bytes::Bytes;
use futures::SinkExt;

use crate::conn::{pg_error_text, ConnectionSpec, Resolved};
use crate::error::{Result, SourceError};
use crate::object::{pg_ident, TableRef};

/// The table, in the target's schema, that records each sink's delivered outbox version.
pub const POSITIONS_TABLE: &str = "strata_sink_positions";

/// The advisory lock key sinks take while they create their tables (any fixed number).
const CREATE_LOCK: i64 = 0x5374_7261_7461;

/// A PostgreSQL table a sink writes, over one connection.
pub struct PgSink {
    r: Resolved,
    client: tokio_postgres::Client,
    table: TableRef,
    /// The outbox's Delta table id: which outbox the table's rows came from.
    outbox: String,
    /// A transaction is open ([`PgSink::begin`] until finish or rollback).
    open: bool,
    /// The columns the delivery begun added to the target.
    added: Vec<String>,
}

impl PgSink {
    /// Connects for the sink writing `table` (`schema.table` or `table`) from the outbox
    /// whose Delta table id is `outbox`.
    pub async fn connect(spec: &ConnectionSpec, table: &str, outbox: &str) -> Result<PgSink> {
        let r = Resolved::new(spec)?;
        let table = TableRef::parse(table).map_err(|detail| r.query_error("sink", detail))?;
        let client = r.pg_connect().await?;
        Ok(PgSink {
            r,
            client,
            table,
            outbox: outbox.to_string(),
            open: false,
            added: Vec::new(),
        })
    }

    /// Begins a delivery: creates the positions table, and the target with `columns` and
    /// `primary_key` when it is missing; adds the columns an existing target lacks
    /// ([`PgSink::columns_added`]); locks the sink's position and returns the outbox version
    /// the table holds (`None`: none yet). End it with [`PgSink::finish`] or
    /// [`PgSink::rollback`].
    pub async fn begin(&mut self, columns: &Schema, primary_key: &[String]) -> Result<Option<i64>> {
        let create = create_table_sql(&self.table, columns, primary_key)
            .map_err(|detail| self.err(detail))?;
        let positions = self.positions();
        // Created in a transaction of their own, one creator at a time (a lock of this
        // transaction only): two CREATE TABLE IF NOT EXISTS at once can both try to create.
        self.execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); \
             CREATE TABLE IF NOT EXISTS {positions} (sink text PRIMARY KEY, outbox text NOT NULL, \
             version bigint NOT NULL, delivered_at timestamptz NOT NULL DEFAULT now()); \
             {create}; COMMIT"
        ))
        .await?;
        self.execute("BEGIN").await?;
        self.open = true;
        self.added = self.add_missing_columns(columns).await?;
        let sink = self.table.to_string();
        let row = self
            .client
            .query_opt(
                &format!("SELECT outbox, version FROM {positions} WHERE sink = $1 FOR UPDATE"),
                &[&sink],
            )
            .await
            .map_err(|e| self.err(pg_error_text(&e)))?;
        match row {
            None => Ok(None),
            Some(row) => {
                let outbox: String = row.get(0);
                if outbox != self.outbox {
                    return Err(self.err(format!(
                        "its rows came from another outbox (Delta table id {outbox}, this sink's \
                         is {}): another sink writes this table, or this sink's table was \
                         created again; give the sink another table, or delete the row \
                         sink = '{sink}' of {positions} after emptying the table",
                        self.outbox
                    )));
                }
                Ok(Some(row.get(1)))
            }
        }
    }

    /// Deletes the target's rows whose `keys` match a row of `replaced` (the keys whose
    /// rows the delivery replaces), in the delivery begun.
    pub async fn delete_keys(&mut self, keys: &[String], replaced: &[RecordBatch]) -> Result<()> {
        if !replaced.iter().any(|b| b.num_rows() > 0) {
            return Ok(());
        }
        let target = self.target();
        let names = keys
            .iter()
            .map(|k| pg_ident(k))
            .collect::<Vec<_>>()
            .join(", ");
        self.execute(&format!(
            "CREATE TEMP TABLE strata_sink_keys ON COMMIT DROP AS \
             SELECT {names} FROM {target} WITH NO DATA"
        ))
        .await?;
        let batches = futures::stream::iter(replaced.iter().cloned().map(Ok::<_, String>));
        self.copy_in("strata_sink_keys", keys, batches).await?;
        let matches = keys
            .iter()
            .map(|k| format!("t.{k} = k.{k}", k = pg_ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        self.execute(&format!(
            "DELETE FROM {target} t USING strata_sink_keys k WHERE {matches}"
        ))
        .await
    }

    /// Copies the `columns` of every batch of `rows` into the target, in the delivery begun,
    /// as they come (a failed batch fails the delivery). Returns the rows copied.
    pub async fn copy_rows<S, E>(&mut self, columns: &[String], rows: S) -> Result<u64>
    where
        S: futures::Stream<Item = std::result::Result<RecordBatch, E>>,
        E: std::fmt::Display,
    {
        let target = self.target();
        self.copy_in(&target, columns, rows).await
    }

    /// Ends the delivery begun: records `version` as the outbox version the table now holds,
    /// and commits.
    pub async fn finish(&mut self, version: i64) -> Result<()> {
        let sink = self.table.to_string();
        self.client
            .execute(
                &format!(
                    "INSERT INTO {} (sink, outbox, version) VALUES ($1, $2, $3) \
                     ON CONFLICT (sink) DO UPDATE SET outbox = EXCLUDED.outbox, \
                     version = EXCLUDED.version, delivered_at = now()",
                    self.positions()
                ),
                &[&sink, &self.outbox, &version],
            )
            .await
            .map_err(|e| self.err(pg_error_text(&e)))?;
        self.execute("COMMIT").await?;
        self.open = false;
        Ok(())
    }

    /// The columns the delivery begun added to the target (it lacked them).
    pub fn columns_added(&self) -> &[String] {
        &self.added
    }

    /// Ends the delivery begun without changing anything.
    pub async fn rollback(&mut self) -> Result<()> {
        if self.open {
            self.open = false;
            self.execute("ROLLBACK").await?;
        }
        Ok(())
    }

    /// The target, quoted.
    fn target(&self) -> String {
        self.table.pg_sql()
    }

    fn positions(&self) -> String {
        TableRef {
            schema: self.table.schema.clone(),
            name: POSITIONS_TABLE.to_string(),
        }
        .pg_sql()
    }

    /// Adds to the target, in the delivery begun, each column of `columns` it lacks (NULL in
    /// its rows so far), as a streaming table gains the columns its source gains; returns
    /// their names.
    async fn add_missing_columns(&self, columns: &Schema) -> Result<Vec<String>> {
        let rows = self
            .client
            .query(
                "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = $1::text::regclass \
                 AND a.attnum > 0 AND NOT a.attisdropped",
                &[&self.target()],
            )
            .await
            .map_err(|e| self.err(pg_error_text(&e)))?;
        let have: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let mut added = Vec::new();
        for f in columns.fields() {
            if have.iter().any(|h| h == f.name()) {
                continue;
            }
            let ty = column_type(f.name(), f.data_type()).map_err(|e| self.err(e))?;
            self.execute(&format!(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {ty}",
                self.target(),
                pg_ident(f.name())
            ))
            .await?;
            added.push(f.name().clone());
        }
        Ok(added)
    }

    /// Copies `columns` of the batches of `batches` into `table` (already quoted, or a temp
    /// table's name), as they come.
    async fn copy_in<S, E>(&self, table: &str, columns: &[String], batches: S) -> Result<u64>
    where
        S: futures::Stream<Item = std::result::Result<RecordBatch, E>>,
        E: std::fmt::Display,
    {
        use futures::StreamExt;
        let list = columns
            .iter()
            .map(|c| pg_ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let sink = self
            .client
            .copy_in::<_, Bytes>(&format!("COPY {table} ({list}) FROM STDIN"))
            .await
            .map_err(|e| self.err(pg_error_text(&e)))?;
        futures::pin_mut!(sink);
        futures::pin_mut!(batches);
        while let Some(batch) = batches.next().await {
            let batch = batch.map_err(|e| self.err(format!("reading the rows to send: {e}")))?;
            let text = copy_text(&batch, columns).map_err(|detail| self.err(detail))?;
            if !text.is_empty() {
                sink.send(Bytes::from(text))
                    .await
                    .map_err(|e| self.err(pg_error_text(&e)))?;
            }
        }
        sink.as_mut()
            .finish()
            .await
            .map_err(|e| self.err(pg_error_text(&e)))
    }

    async fn execute(&self, sql: &str) -> Result<()> {
        self.client
            .batch_execute(sql)
            .await
            .map_err(|e| self.err(pg_error_text(&e)))
    }

    fn err(&self, detail: impl std::fmt::Display) -> SourceError {
        self.r
            .query_error(format!("sink table {}", self.table), detail)
    }
}

/// The PostgreSQL type of column `name` of type `t`, or the error naming it and saying what
/// a sink sends.
fn column_type(name: &str, t: &DataType) -> std::result::Result<String, String> {
    pg_type(t).ok_or_else(|| {
        format!(
            "column {name} has type {t}, which a PostgreSQL sink does not send (it sends \
             numbers, strings, booleans, dates, timestamps, decimals, binary and structs); \
             cast it in the flow's query"
        )
    })
}

/// `CREATE TABLE IF NOT EXISTS` for `table` with `columns` and `primary_key`.
fn create_table_sql(
    table: &TableRef,
    columns: &Schema,
    primary_key: &[String],
) -> std::result::Result<String, String> {
    let mut parts = Vec::with_capacity(columns.fields().len() + 1);
    for f in columns.fields() {
        let ty = column_type(f.name(), f.data_type())?;
        let not_null = if primary_key.contains(f.name()) {
            " NOT NULL"
        } else {
            ""
        };
        parts.push(format!("{} {ty}{not_null}", pg_ident(f.name())));
    }
    if !primary_key.is_empty() {
        let key = primary_key
            .iter()
            .map(|k| pg_ident(k))
            .collect::<Vec<_>>()
            .join(", ");
        parts.push(format!("PRIMARY KEY ({key})"));
    }
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        table.pg_sql(),
        parts.join(", ")
    ))
}

/// The PostgreSQL type a column of `t` is created with; `None` for types a sink does not
/// send (lists, maps, intervals).
pub fn pg_type(t: &DataType) -> Option<String> {
    Some(match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 => "bigint".into(),
        DataType::UInt64 => "numeric(20, 0)".into(),
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "bytea".into(),
        DataType::FixedSizeBinary(_) => "bytea".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) if *s >= 0 => {
            format!("numeric({p}, {s})")
        }
        // As a JSON object (an SCD2 `__START_AT` of `SEQUENCE BY STRUCT(...)`, a struct
        // column): jsonb compares by value, so it may be part of a primary key.
        DataType::Struct(_) => "jsonb".into(),
        _ => return None,
    })
}

/// `columns` of `batch` in COPY's text format: a line per row, fields separated by tabs,
/// `\N` for NULL, backslash, tab, newline and carriage return escaped; binary as `\\x`
/// and hex; timestamps in ISO 8601 (with `Z` when they have a time zone).
pub(crate) fn copy_text(
    batch: &RecordBatch,
    columns: &[String],
) -> std::result::Result<Vec<u8>, String> {
    use arrow_cast::display::{ArrayFormatter, FormatOptions};
    let arrays: Vec<&dyn Array> = columns
        .iter()
        .map(|c| {
            batch
                .column_by_name(c)
                .map(|a| a.as_ref())
                .ok_or_else(|| format!("the rows have no column {c}"))
        })
        .collect::<std::result::Result<_, _>>()?;
    for (a, c) in arrays.iter().zip(columns) {
        column_type(c, a.data_type())?;
    }
    // A timestamp with a time zone is an instant in UTC: formatted as the UTC wall time
    // with `+00:00` (Arrow's own formatting of a zone name needs its chrono-tz feature).
    let utc: Vec<bool> = arrays
        .iter()
        .map(|a| matches!(a.data_type(), DataType::Timestamp(_, Some(_))))
        .collect();
    let arrays: Vec<arrow_array::ArrayRef> = arrays
        .iter()
        .map(|a| match a.data_type() {
            DataType::Timestamp(unit, Some(_)) => a
                .to_data()
                .into_builder()
                .data_type(DataType::Timestamp(*unit, None))
                .build()
                .map(arrow_array::make_array)
                .map_err(|e| e.to_string()),
            _ => Ok(arrow_array::make_array(a.to_data())),
        })
        .collect::<std::result::Result<_, _>>()?;
    // A struct column: each row's value as a JSON object (NULL fields written as null).
    let json: Vec<Option<Vec<String>>> = arrays
        .iter()
        .map(|a| match a.data_type() {
            DataType::Struct(_) => struct_json(a.as_ref()).map(Some),
            _ => Ok(None),
        })
        .collect::<std::result::Result<_, _>>()?;
    let options = FormatOptions::default().with_timestamp_format(Some("%Y-%m-%dT%H:%M:%S%.f"));
    let formatters = arrays
        .iter()
        .map(|a| ArrayFormatter::try_new(a.as_ref(), &options).map_err(|e| e.to_string()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut out = String::new();
    let mut field = String::new();
    for row in 0..batch.num_rows() {
        for (i, (a, f)) in arrays.iter().zip(&formatters).enumerate() {
            let a = a.as_ref();
            if i > 0 {
                out.push('\t');
            }
            if a.is_null(row) {
                out.push_str("\\N");
                continue;
            }
            field.clear();
            if let Some(rows) = &json[i] {
                field.push_str(&rows[row]);
            } else if is_binary(a.data_type()) {
                field.push_str("\\x");
                let _ = write!(field, "{}", f.value(row));
            } else {
                let _ = write!(field, "{}", f.value(row));
                if utc[i] {
                    field.push_str("+00:00");
                }
            }
            escape_into(&mut out, &field);
        }
        out.push('\n');
    }
    Ok(out.into_bytes())
}

/// Each row of the struct column `a` as a JSON object (one string per row; a NULL row's is
/// not read).
fn struct_json(a: &dyn Array) -> std::result::Result<Vec<String>, String> {
    let structs = a
        .as_any()
        .downcast_ref::<arrow_array::StructArray>()
        .ok_or_else(|| "a struct column that is not a StructArray".to_string())?;
    // The fields as columns of their own (the struct's own NULL rows are not read; their
    // fields may hold anything, so every field is taken as nullable).
    let (fields, columns, _) = structs.clone().into_parts();
    let fields: Vec<arrow_schema::Field> = fields
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let batch = RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), columns)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::LineDelimited>(&mut out);
    writer.write(&batch).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    drop(writer);
    let text = String::from_utf8(out).map_err(|e| e.to_string())?;
    Ok(text.lines().map(str::to_string).collect())
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// `value` escaped for COPY's text format.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        BinaryArray, Date32Array, Int64Array, StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{Field, TimeUnit};
    use std::sync::Arc;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("raw", DataType::Binary, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a\tb\\c\nd"), None])),
                Arc::new(Date32Array::from(vec![Some(19723), None])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(1_704_067_200_500_000), None])
                        .with_timezone("UTC"),
                ),
                Arc::new(BinaryArray::from(vec![Some(&b"\x01\xff"[..]), None])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn copy_text_escapes_and_marks_nulls() {
        let cols: Vec<String> = ["id", "note", "day", "at", "raw"]
            .map(String::from)
            .to_vec();
        let text = String::from_utf8(copy_text(&batch(), &cols).unwrap()).unwrap();
        assert_eq!(
            text,
            "1\ta\\tb\\\\c\\nd\t2024-01-01\t2024-01-01T00:00:00.500+00:00\t\\\\x01ff\n\
             2\t\\N\t\\N\t\\N\t\\N\n"
        );
    }

    #[test]
    fn copy_text_takes_the_columns_asked_for_in_their_order() {
        let cols = vec!["note".to_string(), "id".to_string()];
        let text = String::from_utf8(copy_text(&batch(), &cols).unwrap()).unwrap();
        assert_eq!(text, "a\\tb\\\\c\\nd\t1\n\\N\t2\n");
        let e = copy_text(&batch(), &["nope".to_string()]).unwrap_err();
        assert!(e.contains("no column nope"), "{e}");
    }

    #[test]
    fn struct_columns_go_as_json_objects() {
        use arrow_array::StructArray;
        let lsn = Arc::new(Int64Array::from(vec![Some(7), None, Some(9)])) as arrow_array::ArrayRef;
        let seq = Arc::new(Int64Array::from(vec![0, 1, 2])) as arrow_array::ArrayRef;
        let at = StructArray::try_new(
            vec![
                Arc::new(Field::new("_commit_lsn", DataType::Int64, true)),
                Arc::new(Field::new("_change_seq", DataType::Int64, false)),
            ]
            .into(),
            vec![lsn, seq],
            Some(vec![true, true, false].into()),
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "at",
            at.data_type().clone(),
            true,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(at)]).unwrap();
        let text = String::from_utf8(copy_text(&batch, &["at".to_string()]).unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"_commit_lsn\":7,\"_change_seq\":0}\n{\"_commit_lsn\":null,\"_change_seq\":1}\n\\N\n"
        );
    }

    #[test]
    fn created_tables_have_the_primary_key_and_refuse_nested_types() {
        let schema = batch().schema();
        let sql =
            create_table_sql(&TableRef::new("gold", "Cust"), &schema, &["id".into()]).unwrap();
        assert_eq!(
            sql,
            "CREATE TABLE IF NOT EXISTS \"gold\".\"Cust\" (\"id\" bigint NOT NULL, \"note\" text, \
             \"day\" date, \"at\" timestamptz, \"raw\" bytea, PRIMARY KEY (\"id\"))"
        );
        let nested = Schema::new(vec![Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        )]);
        let e = create_table_sql(&TableRef::new("s", "t"), &nested, &[]).unwrap_err();
        assert!(e.contains("column tags") && e.contains("cast it"), "{e}");
    }
}
