//! `read_files` like Databricks Auto Loader: schema inference, schema evolution and rescued
//! data for JSON and CSV.
//!
//! Without `schema =>`, the columns are inferred from the files new in a run, each value
//! typed as Databricks' read_files types it (`infer.rs`: CSV cells INT, BIGINT, DECIMAL,
//! DOUBLE, DATE, TIMESTAMP, BOOLEAN or STRING, JSON values by their JSON kind; a column's
//! values widened to one type), and merged with the columns of earlier runs, which keep
//! their types: new columns are added at the end, none is dropped. The inferred columns are
//! recorded in each ingestion commit, so the next run starts from them. `inferColumnTypes
//! => false` makes every CSV column STRING; `inferTimestamp => true` types JSON timestamp
//! strings.
//!
//! A value that does not fit its column's type is not lost and does not fail the run: the
//! column is NULL and `_rescued_data` holds a JSON object with the original value under the
//! column's name and `_file_path`, the file's path under the `read_files` folder. With
//! `schema =>`, the same happens when the option `rescuedDataColumn` names the column; fields
//! of the file outside the schema are rescued too.

use super::infer::{self, Rules};
use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray};
use deltalake::arrow::compute::{cast_with_options, CastOptions};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use strata_sql::{FileFormat, ReadFiles};

/// The name of the rescued-data column when the schema is inferred.
pub(crate) const RESCUED: &str = crate::semantics::declared::RESCUED_COLUMN;

/// How `read_files` reads: with its declared schema as it always did, or Auto Loader style.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mode {
    /// `schema =>` given and no rescued-data column: DataFusion's readers, a value that does
    /// not fit fails the file.
    Declared,
    /// Inferred (`schema =>` absent) or rescued (`rescuedDataColumn` given): strata's reader.
    Autoload { rescued: String, inferred: bool },
}

/// The mode of a `read_files` call.
pub(crate) fn mode(spec: &ReadFiles) -> Result<Mode> {
    let rescued = spec.other_options.get("rescueddatacolumn").cloned();
    match (&spec.schema, spec.format, rescued) {
        (Some(_), _, None) => Ok(Mode::Declared),
        (_, FileFormat::Parquet | FileFormat::Debezium, _) => Ok(Mode::Declared),
        (schema, _, rescued) => {
            rules(spec)?;
            Ok(Mode::Autoload {
                rescued: rescued.unwrap_or_else(|| RESCUED.to_string()),
                inferred: schema.is_none(),
            })
        }
    }
}

/// How values are typed, from the options `inferColumnTypes` (default true) and, for JSON,
/// `inferTimestamp` (default false), each `true` or `false` in any case.
pub(crate) fn rules(spec: &ReadFiles) -> Result<Rules> {
    let flag = |key: &str, written: &str, default: bool| -> Result<bool> {
        match spec.other_options.get(key) {
            None => Ok(default),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(EngineError::plan(format!(
                "read_files('{}'): option {written} must be true or false, found '{v}'",
                spec.path
            ))),
        }
    };
    let column_types = flag("infercolumntypes", "inferColumnTypes", true)?;
    let timestamps = flag("infertimestamp", "inferTimestamp", false)?;
    Ok(Rules {
        column_types,
        json_timestamps: column_types && timestamps && spec.format == FileFormat::Json,
    })
}

/// One input row: its fields in the order written.
type Record = Vec<(String, Value)>;

/// A JSON object with its fields in the order written (serde_json's `Map` sorts them).
struct Ordered(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// `{"k":v,...}` with the keys in the order given.
fn object_text(entries: &[(String, Value)]) -> String {
    let fields: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// The JSON objects of a JSON Lines file, naming the line of any that does not parse.
fn json_records(path: &Path) -> Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Ordered>(line) {
            Ok(Ordered(m)) => out.push(m),
            Err(e) if e.is_data() => {
                return Err(EngineError::BadInput(format!(
                    "file {} line {}: expected a JSON object",
                    path.display(),
                    i + 1
                )))
            }
            Err(e) => {
                return Err(EngineError::BadInput(format!(
                    "file {} line {}: not valid JSON: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(out)
}

fn csv_format(spec: &ReadFiles) -> deltalake::arrow::csv::reader::Format {
    deltalake::arrow::csv::reader::Format::default()
        .with_header(spec.header)
        .with_delimiter(spec.delimiter)
}

/// The columns of `files`, in order of first appearance, with the types inference gives
/// them (see the module docs).
pub(crate) fn infer(
    files: &[std::path::PathBuf],
    spec: &ReadFiles,
) -> Result<Vec<(String, DataType)>> {
    let rules = rules(spec)?;
    let mut columns: Vec<(String, Option<DataType>)> = Vec::new();
    let mut add =
        |name: &str, t: Option<DataType>| match columns.iter_mut().find(|(n, _)| n == name) {
            Some((_, old)) => *old = infer::widen(old.take(), t),
            None => columns.push((name.to_string(), t)),
        };
    for path in files {
        match spec.format {
            FileFormat::Json => {
                for record in json_records(path)? {
                    for (k, v) in &record {
                        add(k, infer::json_type(v, rules));
                    }
                }
            }
            FileFormat::Csv => {
                let (names, rows) = csv_rows(path, spec)?;
                for name in &names {
                    add(name, None);
                }
                for row in &rows {
                    for (k, v) in row {
                        add(k, v.as_str().map(|text| infer::csv_type(text, rules)));
                    }
                }
            }
            FileFormat::Parquet | FileFormat::Debezium => {}
        }
    }
    let inferred = columns
        .into_iter()
        .map(|(n, t)| (n, t.unwrap_or(DataType::Utf8)))
        .collect();
    match files.is_empty() {
        true => Ok(inferred),
        false => Ok(with_hints(inferred, &schema_hints(spec)?)),
    }
}

/// The columns of option `schemaHints` (`'id BIGINT, at DATE'`), as Auto Loader takes them:
/// the types of those columns, whatever inference finds.
fn schema_hints(spec: &ReadFiles) -> Result<Vec<(String, DataType)>> {
    let Some(text) = spec.other_options.get("schemahints") else {
        return Ok(Vec::new());
    };
    let columns = strata_sql::parse_ddl_schema(text).map_err(|e| {
        EngineError::plan(format!(
            "read_files('{}'): option schemaHints '{text}': {}",
            spec.path,
            e.to_string().lines().next().unwrap_or_default()
        ))
    })?;
    Ok(columns.into_iter().map(|c| (c.name, c.data_type)).collect())
}

/// `inferred` with each hinted column's type the hint's (names matched in any case); hinted
/// columns the files do not have are added after the inferred ones.
fn with_hints(
    mut inferred: Vec<(String, DataType)>,
    hints: &[(String, DataType)],
) -> Vec<(String, DataType)> {
    for (name, t) in hints {
        match inferred
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some((_, old)) => *old = t.clone(),
            None => inferred.push((name.clone(), t.clone())),
        }
    }
    inferred
}

/// The input columns of a run: `previous` (recorded by earlier runs, types kept) plus the
/// columns of `inferred` they lack, then the rescued-data column last unless already there.
pub(crate) fn merge(
    previous: &[(String, DataType)],
    inferred: &[(String, DataType)],
    rescued: &str,
) -> Vec<(String, DataType)> {
    let mut out: Vec<(String, DataType)> = previous.to_vec();
    let had_rescued = out.iter().any(|(n, _)| n == rescued);
    for (n, t) in inferred {
        if n != rescued && !out.iter().any(|(m, _)| m.eq_ignore_ascii_case(n)) {
            out.push((n.clone(), t.clone()));
        }
    }
    // On the first run the rescued column goes last; columns added later follow it.
    if !had_rescued {
        out.push((rescued.to_string(), DataType::Utf8));
    }
    out
}

pub(crate) fn schema_of(columns: &[(String, DataType)]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, t)| Field::new(n, t.clone(), true))
            .collect::<Vec<_>>(),
    ))
}

/// One value as text for casting, if its JSON kind can hold a value of type `t` (a JSON
/// string never becomes a number or a boolean, a fraction never an integer).
fn json_text(v: &Value, t: &DataType) -> std::result::Result<Option<String>, ()> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match (v, t) {
        (Value::Null, _) => Ok(None),
        (_, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => Ok(Some(text(v))),
        (Value::Bool(b), DataType::Boolean) => Ok(Some(b.to_string())),
        (_, DataType::Boolean) => Err(()),
        (Value::Number(n), t) if t.is_integer() => {
            if n.is_i64() || n.is_u64() {
                Ok(Some(n.to_string()))
            } else {
                Err(())
            }
        }
        (_, t) if t.is_integer() => Err(()),
        (Value::Number(n), t) if t.is_floating() || matches!(t, DataType::Decimal128(..)) => {
            Ok(Some(n.to_string()))
        }
        (_, t) if t.is_floating() => Err(()),
        (Value::String(s), _) => Ok(Some(s.clone())),
        (Value::Number(n), _) => Ok(Some(n.to_string())),
        _ => Err(()),
    }
}

/// Reads one file into `schema` (the input columns, the rescued column among them): values
/// that do not fit are rescued; with `keep_extra`, so are fields outside the schema.
///
/// ```text
///  file_records ─▶ per column: field_texts ─▶ cast_column ─▶ rescue_extra ─▶ rescued_column
///  (names, rows)   (text per row, misfits)    (misfits and     (fields outside  (the rescued
///                                              failed casts     the schema)      values as
///                                              rescued)                          JSON)
/// ```
pub(crate) fn read(
    path: &Path,
    relative: &str,
    spec: &ReadFiles,
    schema: &SchemaRef,
    rescued: &str,
    keep_extra: bool,
) -> Result<RecordBatch> {
    let (names, rows) = file_records(path, spec)?;
    let n = rows.len();
    let mut rescue: Vec<Record> = vec![Vec::new(); n];
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let is_csv = spec.format == FileFormat::Csv;
    for field in schema.fields() {
        if field.name() == rescued {
            columns.push(new_null_array(&DataType::Utf8, n));
            continue;
        }
        let (texts, misfit) = field_texts(field, &rows, is_csv);
        columns.push(cast_column(
            path,
            field,
            &rows,
            texts,
            &misfit,
            &mut rescue,
        )?);
    }
    if keep_extra {
        rescue_extra(&names, schema, &rows, &mut rescue);
    }
    if let Ok(at) = schema.index_of(rescued) {
        columns[at] = Arc::new(rescued_column(rescue, relative));
    }
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))
}

/// A file's field names, in order of first appearance, and its rows: per row, the values as
/// (text for casting | does not fit, original JSON value).
fn file_records(path: &Path, spec: &ReadFiles) -> Result<(Vec<String>, Vec<Record>)> {
    Ok(match spec.format {
        FileFormat::Json => {
            let records = json_records(path)?;
            let mut names: Vec<String> = Vec::new();
            for m in &records {
                for (k, _) in m {
                    if !names.contains(k) {
                        names.push(k.clone());
                    }
                }
            }
            let rows = records;
            (names, rows)
        }
        _ => csv_rows(path, spec)?,
    })
}

/// Each row's value of `field` as text to cast (`None` for a missing value or one that
/// does not fit), and which rows' values do not fit its type.
fn field_texts(field: &Field, rows: &[Record], is_csv: bool) -> (Vec<Option<String>>, Vec<bool>) {
    let n = rows.len();
    let mut texts: Vec<Option<String>> = Vec::with_capacity(n);
    let mut misfit = vec![false; n];
    for (i, row) in rows.iter().enumerate() {
        let value = row
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(field.name()))
            .map(|(_, v)| v);
        match value {
            None => texts.push(None),
            Some(v) if is_csv => {
                let t = v.as_str().unwrap_or_default();
                if !csv_text_fits(t, field.data_type()) {
                    texts.push(None);
                    misfit[i] = true;
                } else {
                    texts.push(Some(t.to_string()));
                }
            }
            Some(v) => match json_text(v, field.data_type()) {
                Ok(t) => texts.push(t),
                Err(()) => {
                    texts.push(None);
                    misfit[i] = true;
                }
            },
        }
    }
    (texts, misfit)
}

/// Whether a CSV cell may be cast to `t`: a BOOLEAN is `true` or `false` (in any case; a
/// cast would take `yes` and `1` too), a DECIMAL without a scale a whole number (a cast
/// would round `1.5`). Other misfits are the cells whose cast fails.
fn csv_text_fits(text: &str, t: &DataType) -> bool {
    match t {
        DataType::Boolean => {
            text.eq_ignore_ascii_case("true") || text.eq_ignore_ascii_case("false")
        }
        DataType::Decimal128(_, 0) => {
            let digits = text.strip_prefix('-').unwrap_or(text);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
        _ => true,
    }
}

/// `texts` cast to `field`'s type; the original values of the rows that did not fit or
/// whose cast failed are added to `rescue` (and are NULL in the column).
fn cast_column(
    path: &Path,
    field: &Field,
    rows: &[Record],
    texts: Vec<Option<String>>,
    misfit: &[bool],
    rescue: &mut [Record],
) -> Result<ArrayRef> {
    let raw = StringArray::from(texts);
    let cast =
        cast_with_options(&raw, field.data_type(), &CastOptions::default()).map_err(|e| {
            EngineError::BadInput(format!(
                "file {}: column {}: {e}",
                path.display(),
                field.name()
            ))
        })?;
    for i in 0..rows.len() {
        if misfit[i] || (raw.is_valid(i) && cast.is_null(i)) {
            let original = rows[i]
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(field.name()))
                .map(|(_, v)| v.clone())
                .unwrap_or(Value::Null);
            rescue[i].push((field.name().clone(), original));
        }
    }
    Ok(if misfit.iter().any(|&m| m) {
        let keep: deltalake::arrow::array::BooleanArray = misfit.iter().map(|m| Some(!m)).collect();
        deltalake::arrow::compute::nullif(
            &cast,
            &deltalake::arrow::compute::not(&keep).context(|| "rescue".into())?,
        )
        .context(|| "rescue".into())?
    } else {
        cast
    })
}

/// Adds each row's non-NULL values of the fields outside `schema` (`names`: the file's) to
/// `rescue`.
fn rescue_extra(names: &[String], schema: &SchemaRef, rows: &[Record], rescue: &mut [Record]) {
    for name in names {
        if schema
            .fields()
            .iter()
            .any(|f| f.name().eq_ignore_ascii_case(name))
        {
            continue;
        }
        for (i, row) in rows.iter().enumerate() {
            if let Some((_, v)) = row.iter().find(|(k, _)| k == name) {
                if !v.is_null() {
                    rescue[i].push((name.clone(), v.clone()));
                }
            }
        }
    }
}

/// The rescued-data column: each row's rescued values with the file's path (`relative`) as
/// a JSON object, NULL for a row with none.
fn rescued_column(rescue: Vec<Record>, relative: &str) -> StringArray {
    rescue
        .into_iter()
        .map(|mut m| {
            if m.is_empty() {
                None
            } else {
                m.push(("_file_path".into(), Value::String(relative.to_string())));
                Some(object_text(&m))
            }
        })
        .collect()
}

/// A CSV file's column names and its rows as (name, text value) pairs; empty cells are
/// absent (NULL). The names are the header's; without one (`header => false`, the
/// default), the declared columns' by position, else `_c0`, `_c1`, ... as Spark names them.
fn csv_rows(path: &Path, spec: &ReadFiles) -> Result<(Vec<String>, Vec<Record>)> {
    let file = std::fs::File::open(path).context(|| format!("cannot read {}", path.display()))?;
    let (inferred, _) = csv_format(spec)
        .infer_schema(file, Some(0))
        .map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))?;
    let names: Vec<String> = match spec.header {
        true => inferred.fields().iter().map(|f| f.name().clone()).collect(),
        false => (0..inferred.fields().len())
            .map(|i| headerless_name(spec, i))
            .collect(),
    };
    let strings = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let file = std::fs::File::open(path).context(|| format!("cannot read {}", path.display()))?;
    let reader = deltalake::arrow::csv::ReaderBuilder::new(strings)
        .with_format(csv_format(spec))
        .build(file)
        .map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch =
            batch.map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))?;
        let cols: Vec<&StringArray> = batch
            .columns()
            .iter()
            .map(|c| c.as_any().downcast_ref::<StringArray>())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| EngineError::internal("CSV column is not a string"))?;
        for i in 0..batch.num_rows() {
            rows.push(
                names
                    .iter()
                    .zip(&cols)
                    .filter(|(_, c)| c.is_valid(i) && !c.value(i).is_empty())
                    .map(|(n, c)| (n.clone(), Value::String(c.value(i).to_string())))
                    .collect(),
            );
        }
    }
    Ok((names, rows))
}

/// The name of column `i` (0-based) of a CSV file without a header: the declared column's
/// at that position, else `_c{i}`.
fn headerless_name(spec: &ReadFiles, i: usize) -> String {
    spec.schema
        .as_ref()
        .and_then(|s| s.get(i))
        .map(|c| c.name.clone())
        .unwrap_or_else(|| format!("_c{i}"))
}

/// The `_metadata` column's type: `file_path`, `file_name`, `file_size`,
/// `file_modification_time`.
pub(crate) fn metadata_type() -> DataType {
    DataType::Struct(
        vec![
            Field::new("file_path", DataType::Utf8, true),
            Field::new("file_name", DataType::Utf8, true),
            Field::new("file_size", DataType::Int64, true),
            Field::new(
                "file_modification_time",
                DataType::Timestamp(
                    deltalake::arrow::datatypes::TimeUnit::Microsecond,
                    Some("UTC".into()),
                ),
                true,
            ),
        ]
        .into(),
    )
}

/// Whether a query reads `_metadata`.
pub(crate) fn wants_metadata(sql: &str) -> bool {
    sql.to_ascii_lowercase().contains("_metadata")
}

/// Whether a query names `_metadata` itself (not only its fields, `_metadata.file_name`).
pub(crate) fn names_metadata(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    lower
        .match_indices("_metadata")
        .any(|(i, m)| !lower[i + m.len()..].starts_with('.'))
}

/// `df` with the `_metadata` column of the file at `path`, whose `file_path` is `shown` (the
/// object URL of a file staged from an object store).
pub(crate) fn with_metadata(
    df: deltalake::datafusion::prelude::DataFrame,
    path: &Path,
    shown: &str,
) -> Result<deltalake::datafusion::prelude::DataFrame> {
    use deltalake::datafusion::prelude::lit;
    use deltalake::datafusion::scalar::ScalarValue;
    let meta = std::fs::metadata(path).context(|| format!("cannot read {}", path.display()))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_micros() as i64);
    let value = deltalake::datafusion::functions::core::expr_fn::named_struct(vec![
        lit("file_path"),
        lit(shown.to_string()),
        lit("file_name"),
        lit(path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()),
        lit("file_size"),
        lit(meta.len() as i64),
        lit("file_modification_time"),
        lit(ScalarValue::TimestampMicrosecond(
            modified,
            Some("UTC".into()),
        )),
    ]);
    df.with_column("_metadata", value)
        .context(|| format!("file {}: _metadata", path.display()))
}
