//! Debezium change files: one JSON change event per line (the JSON converter's output, with
//! `{"schema":..., "payload":...}` or the bare payload), into the same row shape as PostgreSQL
//! CDC: the table's columns, then `_change_type`, `_commit_lsn`, `_change_seq`,
//! `_commit_timestamp`, `_unchanged_cols`.
//!
//! * `op`: `c` insert, `u` update, `d` delete (values from `before`), `r` snapshot,
//!   `t` truncate (all columns NULL); `m` (messages) and tombstone lines (`null`, or a
//!   `null` payload) are skipped.
//! * Ordering, PostgreSQL connector: `_commit_lsn`, `_change_seq` = the two LSNs of
//!   `source.sequence` (`[last committed LSN, LSN of the change]`), which order changes in commit
//!   order; without `sequence`: `source.lsn` and 0 (changes of interleaved transactions may then
//!   be misordered). MySQL connector: `_commit_lsn` = binlog file index × 2^32 + `pos`,
//!   `_change_seq` = `row`.
//! * `_commit_timestamp`: `source.ts_us`, else `source.ts_ms`, else the envelope's `ts_us` /
//!   `ts_ms`.
//! * Types: from the embedded schema (Kafka Connect types and Debezium logical types, see
//!   the README's table); without one, from the caller's Arrow schema. Kafka Connect's
//!   `struct`, `array` and `map` (and a declared STRUCT, ARRAY or MAP) become Delta structs,
//!   arrays and maps, to any depth: a struct is a JSON object, an array a JSON array, a map a
//!   JSON object (string keys) or an array of `[key, value]` pairs, with NULL at any level. A
//!   value that does not fit is reported with its path (`addr.zip`, `tags[2]`,
//!   `attrs['k']`).
//! * `__debezium_unavailable_value` (an unchanged TOASTed value) becomes NULL and the column's
//!   name in `_unchanged_cols`, as in PostgreSQL CDC.

use std::io::BufRead;

use arrow_array::RecordBatch;
use arrow_schema::{SchemaRef, TimeUnit};
use base64::Engine;
use serde_json::Value as Json;

use crate::batch::{meta, Cell, ChangeBuffer, ColBuilder, ColumnKind, StructField};
use crate::error::{Result, SourceError};
use crate::read::DEFAULT_BATCH_ROWS;
use crate::value::{parse_date, parse_decimal, parse_timestamp, parse_timestamptz};

/// Debezium's placeholder for a value it did not receive (unchanged TOASTed column).
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

/// How to read a Debezium file.
#[derive(Clone, Debug)]
pub struct DebeziumOptions {
    /// The table's columns, for lines without an embedded schema (ignored for lines that have
    /// one). Fields must be of the Arrow types strata produces (see [`ColumnKind`]), nested
    /// ones included.
    pub schema: Option<SchemaRef>,
    /// Without an embedded schema: the unit of integer timestamps (Debezium's
    /// `io.debezium.time.Timestamp` is milliseconds, `MicroTimestamp` microseconds).
    pub integer_timestamp_unit: TimeUnit,
    /// Columns to leave out.
    pub exclude_columns: Vec<String>,
    /// Rows per batch.
    pub batch_rows: usize,
}

impl Default for DebeziumOptions {
    fn default() -> Self {
        DebeziumOptions {
            schema: None,
            integer_timestamp_unit: TimeUnit::Microsecond,
            exclude_columns: vec![],
            batch_rows: DEFAULT_BATCH_ROWS,
        }
    }
}

/// How a JSON value becomes a cell.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dec {
    Int,
    Float,
    Bool,
    Str,
    /// base64 bytes.
    Bytes,
    /// Kafka Connect Decimal: base64 big-endian two's complement unscaled value at `scale`.
    Decimal {
        scale: i8,
    },
    /// Without a schema: a JSON number or numeric text (`decimal.handling.mode` string or
    /// double), else base64 bytes as [`Dec::Decimal`], or a variable-scale struct.
    LooseDecimal {
        scale: i8,
    },
    /// io.debezium.data.VariableScaleDecimal: {"scale":.., "value": base64}.
    VarDecimal {
        scale: i8,
    },
    /// Integer days, or a `YYYY-MM-DD` string.
    Date,
    /// Integer in this unit, or an ISO string.
    Timestamp(TimeUnit),
    /// ISO string with offset (ZonedTimestamp), or an integer in this unit.
    TimestampUtc(TimeUnit),
}

/// How a JSON value becomes a value of a column (or of a part of one).
#[derive(Clone, Debug)]
enum Decode {
    /// A scalar, read as `Dec` into a column of the kind (named in messages).
    Leaf(Dec, ColumnKind),
    /// A JSON object, its fields in the order of the struct's.
    Struct(Vec<Decode>),
    /// A JSON array.
    Array(Box<Decode>),
    /// A JSON object (string keys) or an array of `[key, value]` pairs.
    Map(Box<Decode>, Box<Decode>),
}

#[derive(Clone, Debug)]
struct Col {
    name: String,
    kind: ColumnKind,
    dec: Decode,
}

/// A column of the embedded schema (a field of `after` / `before`).
fn map_field(f: &Json) -> std::result::Result<Col, String> {
    let name = f
        .get("field")
        .and_then(Json::as_str)
        .ok_or("a schema field without \"field\"")?;
    let (kind, dec) = map_schema(f, name)?;
    Ok(Col {
        name: name.to_string(),
        kind,
        dec,
    })
}

/// A Kafka Connect schema (a column's, a struct field's, an array's items, a map's keys or
/// values) as a column kind and its decoding; `path` names it in messages.
fn map_schema(f: &Json, path: &str) -> std::result::Result<(ColumnKind, Decode), String> {
    let ty = f.get("type").and_then(Json::as_str).unwrap_or("");
    let logical = f.get("name").and_then(Json::as_str).unwrap_or("");
    let param = |k: &str| -> Option<i64> {
        f.get("parameters").and_then(|p| p.get(k)).and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
    };
    let unsupported = |why: &str| {
        Err(format!(
            "column '{path}' has type {ty}{}{}: {why}",
            if logical.is_empty() { "" } else { " / " },
            logical
        ))
    };
    let part = |key: &str, what: &str| -> std::result::Result<(ColumnKind, Decode), String> {
        match f.get(key) {
            Some(s) if s.is_object() => map_schema(s, &format!("{path}{what}")),
            _ => Err(format!(
                "column '{path}' has type {ty} without its \"{key}\" schema"
            )),
        }
    };
    let (kind, dec) = match (ty, logical) {
        ("int32", "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => {
            (ColumnKind::Date, Dec::Date)
        }
        (
            "int32" | "int64",
            "io.debezium.time.Time"
            | "io.debezium.time.MicroTime"
            | "io.debezium.time.NanoTime"
            | "org.apache.kafka.connect.data.Time",
        ) => return unsupported("Delta has no time-of-day type"),
        ("int64", "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp") => {
            (ColumnKind::Timestamp, Dec::Timestamp(TimeUnit::Millisecond))
        }
        ("int64", "io.debezium.time.MicroTimestamp") => {
            (ColumnKind::Timestamp, Dec::Timestamp(TimeUnit::Microsecond))
        }
        ("int64", "io.debezium.time.NanoTimestamp") => {
            (ColumnKind::Timestamp, Dec::Timestamp(TimeUnit::Nanosecond))
        }
        ("int8", _) => (ColumnKind::Int8, Dec::Int),
        ("int16", _) => (ColumnKind::Int16, Dec::Int),
        ("int32", _) => (ColumnKind::Int32, Dec::Int),
        ("int64", _) => (ColumnKind::Int64, Dec::Int),
        ("float" | "float32", _) => (ColumnKind::Float32, Dec::Float),
        ("double" | "float64", _) => (ColumnKind::Float64, Dec::Float),
        ("boolean", _) => (ColumnKind::Boolean, Dec::Bool),
        ("string", "io.debezium.time.ZonedTimestamp") => (
            ColumnKind::TimestampUtc,
            Dec::TimestampUtc(TimeUnit::Microsecond),
        ),
        ("string", "io.debezium.time.ZonedTime") => {
            return unsupported("Delta has no time-of-day type")
        }
        ("string", "io.debezium.time.IsoDate") => (ColumnKind::Date, Dec::Date),
        ("string", "io.debezium.time.IsoTimestamp") => {
            (ColumnKind::Timestamp, Dec::Timestamp(TimeUnit::Microsecond))
        }
        ("string", _) => (ColumnKind::Utf8, Dec::Str),
        ("bytes", "org.apache.kafka.connect.data.Decimal") => {
            let scale = param("scale").unwrap_or(0);
            let precision = param("connect.decimal.precision").unwrap_or(38);
            if !(0..=38).contains(&scale) || !(1..=38).contains(&precision) || scale > precision {
                return unsupported(&format!(
                    "DECIMAL({precision},{scale}) does not fit Delta's 38 digits"
                ));
            }
            (
                ColumnKind::Decimal {
                    precision: precision as u8,
                    scale: scale as i8,
                },
                Dec::Decimal { scale: scale as i8 },
            )
        }
        ("bytes", _) => (ColumnKind::Binary, Dec::Bytes),
        ("struct", "io.debezium.data.VariableScaleDecimal") => (
            ColumnKind::Decimal {
                precision: 38,
                scale: 18,
            },
            Dec::VarDecimal { scale: 18 },
        ),
        ("struct", _) => {
            let fields = f
                .get("fields")
                .and_then(Json::as_array)
                .ok_or_else(|| format!("column '{path}' has type struct without its \"fields\""))?;
            let mut kinds = Vec::with_capacity(fields.len());
            let mut decs = Vec::with_capacity(fields.len());
            for field in fields {
                let name = field.get("field").and_then(Json::as_str).ok_or_else(|| {
                    format!("column '{path}' has a struct field without \"field\"")
                })?;
                let (kind, dec) = map_schema(field, &format!("{path}.{name}"))?;
                // Optional or not, as the table's top-level columns: every value may be NULL.
                kinds.push(StructField {
                    name: name.to_string(),
                    kind,
                    nullable: true,
                });
                decs.push(dec);
            }
            return Ok((ColumnKind::Struct(kinds), Decode::Struct(decs)));
        }
        ("array", _) => {
            let (kind, dec) = part("items", "[]")?;
            return Ok((
                ColumnKind::Array(Box::new(kind)),
                Decode::Array(Box::new(dec)),
            ));
        }
        ("map", _) => {
            let (key, key_dec) = part("keys", ".key")?;
            let (value, value_dec) = part("values", ".value")?;
            return Ok((
                ColumnKind::Map(Box::new(key), Box::new(value)),
                Decode::Map(Box::new(key_dec), Box::new(value_dec)),
            ));
        }
        _ => return unsupported("no Delta mapping for this type"),
    };
    Ok((kind.clone(), Decode::Leaf(dec, kind)))
}

/// The columns of a declared schema.
fn cols_from_arrow(schema: &SchemaRef, unit: TimeUnit) -> std::result::Result<Vec<Col>, String> {
    schema
        .fields()
        .iter()
        .map(|f| {
            let kind = ColumnKind::from_data_type(f.data_type()).ok_or_else(|| {
                format!(
                    "column '{}': type {} is not one strata reads from Debezium files",
                    f.name(),
                    strata_sql::sql_type_name(f.data_type())
                )
            })?;
            Ok(Col {
                name: f.name().clone(),
                dec: declared_decode(&kind, unit),
                kind,
            })
        })
        .collect()
}

/// How a value of a declared column kind is read (`unit`: of integer timestamps).
fn declared_decode(kind: &ColumnKind, unit: TimeUnit) -> Decode {
    let dec = match kind {
        ColumnKind::Boolean => Dec::Bool,
        ColumnKind::Int8 | ColumnKind::Int16 | ColumnKind::Int32 | ColumnKind::Int64 => Dec::Int,
        ColumnKind::Float32 | ColumnKind::Float64 => Dec::Float,
        ColumnKind::Decimal { scale, .. } => Dec::LooseDecimal { scale: *scale },
        ColumnKind::Utf8 => Dec::Str,
        ColumnKind::Binary => Dec::Bytes,
        ColumnKind::Date => Dec::Date,
        ColumnKind::Timestamp => Dec::Timestamp(unit),
        ColumnKind::TimestampUtc => Dec::TimestampUtc(unit),
        ColumnKind::Struct(fields) => {
            return Decode::Struct(
                fields
                    .iter()
                    .map(|f| declared_decode(&f.kind, unit))
                    .collect(),
            )
        }
        ColumnKind::Array(element) => {
            return Decode::Array(Box::new(declared_decode(element, unit)))
        }
        ColumnKind::Map(key, value) => {
            return Decode::Map(
                Box::new(declared_decode(key, unit)),
                Box::new(declared_decode(value, unit)),
            )
        }
    };
    Decode::Leaf(dec, kind.clone())
}

/// Where a value is within its column, for messages: `addr.zip`, `tags[2]`, `attrs['k']`.
/// Built on the stack as the value is walked, written out only for an error.
enum At<'a> {
    Column(&'a str),
    Field(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'a Json),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Column(name) => write!(f, "{name}"),
            At::Field(up, name) => write!(f, "{up}.{name}"),
            At::Index(up, i) => write!(f, "{up}[{i}]"),
            At::Key(up, Json::String(k)) => write!(f, "{up}['{k}']"),
            At::Key(up, k) => write!(f, "{up}[{k}]"),
        }
    }
}

/// Appends `v` to `b`, read as `dec` says. `Ok(false)` when `v` is Debezium's
/// unavailable-value placeholder (appended as NULL). Errors name the value's place.
fn append_json(
    b: &mut ColBuilder,
    dec: &Decode,
    v: &Json,
    at: &At,
) -> std::result::Result<bool, String> {
    let fail = |e: String| format!("column '{at}': {e}");
    if v.is_null() {
        b.append_null();
        return Ok(true);
    }
    if !matches!(dec, Decode::Leaf(..)) && unavailable(v) {
        b.append_null();
        return Ok(false);
    }
    let wrong = |what: &str| fail(format!("JSON value {v} is not {what}"));
    match (dec, b) {
        (Decode::Leaf(dec, kind), b) => match cell(*dec, kind, v).map_err(fail)? {
            Some(c) => b.append_value(&c).map_err(fail)?,
            None => {
                b.append_null();
                return Ok(false);
            }
        },
        (Decode::Struct(decs), ColBuilder::Struct(s)) => {
            let Json::Object(o) = v else {
                return Err(wrong("a STRUCT (a JSON object)"));
            };
            for (dec, (field, child)) in decs.iter().zip(&mut s.fields) {
                let value = o.get(&field.name).unwrap_or(&Json::Null);
                let at = At::Field(at, &field.name);
                if value.is_null() && !field.nullable {
                    return Err(format!("column '{at}': NULL in a field declared NOT NULL"));
                }
                append_json(child, dec, value, &at)?;
            }
            s.end_value();
        }
        (Decode::Array(dec), ColBuilder::Array(a)) => {
            let Json::Array(items) = v else {
                return Err(wrong("an ARRAY (a JSON array)"));
            };
            for (i, item) in items.iter().enumerate() {
                append_json(&mut a.elements, dec, item, &At::Index(at, i))?;
            }
            a.end_value().map_err(fail)?;
        }
        (Decode::Map(key_dec, value_dec), ColBuilder::Map(m)) => {
            let mut entry = |key: &Json, value: &Json| -> std::result::Result<(), String> {
                if key.is_null() {
                    return Err(fail("a MAP key is NULL".into()));
                }
                if !append_json(&mut m.keys, key_dec, key, at)? {
                    return Err(fail("a MAP key is Debezium's unavailable value".into()));
                }
                append_json(&mut m.values, value_dec, value, &At::Key(at, key))?;
                Ok(())
            };
            match v {
                Json::Object(o) => {
                    for (k, value) in o {
                        entry(&Json::String(k.clone()), value)?;
                    }
                }
                Json::Array(pairs) => {
                    for pair in pairs {
                        match pair.as_array().map(Vec::as_slice) {
                            Some([k, value]) => entry(k, value)?,
                            _ => {
                                return Err(fail(format!(
                                    "map entry {pair} is not a [key, value] pair"
                                )))
                            }
                        }
                    }
                }
                _ => {
                    return Err(wrong(
                        "a MAP (a JSON object, or an array of [key, value] pairs)",
                    ))
                }
            }
            m.end_value().map_err(fail)?;
        }
        _ => {
            return Err(fail(
                "internal: the column's builder does not match its type".into(),
            ))
        }
    }
    Ok(true)
}

/// Debezium's placeholder for a nested value it did not receive: the text, or (PostgreSQL
/// arrays) an array holding only the text.
fn unavailable(v: &Json) -> bool {
    match v {
        Json::String(s) => s == UNAVAILABLE_VALUE,
        Json::Array(items) => {
            matches!(items.as_slice(), [Json::String(s)] if s == UNAVAILABLE_VALUE)
        }
        _ => false,
    }
}

fn to_micros(v: i64, unit: TimeUnit) -> std::result::Result<i64, String> {
    match unit {
        TimeUnit::Second => v
            .checked_mul(1_000_000)
            .ok_or_else(|| "timestamp out of range".into()),
        TimeUnit::Millisecond => v
            .checked_mul(1_000)
            .ok_or_else(|| "timestamp out of range".into()),
        TimeUnit::Microsecond => Ok(v),
        TimeUnit::Nanosecond => Ok(v.div_euclid(1_000)),
    }
}

fn b64(s: &str) -> std::result::Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("not base64: {e}"))
}

/// Text that reads as a decimal number (`-12.50`, `7`): digits with at most one point and a
/// leading sign. (A base64 string made only of digits is then read as a number: Debezium's
/// precise decimals are written with a schema, which removes the doubt.)
fn looks_numeric(s: &str) -> bool {
    let t = s.trim().trim_start_matches(['-', '+']);
    !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && t.bytes().filter(|b| *b == b'.').count() <= 1
}

fn be_signed(bytes: &[u8]) -> std::result::Result<i128, String> {
    if bytes.len() > 16 {
        return Err("decimal wider than 128 bits".into());
    }
    if bytes.is_empty() {
        return Ok(0);
    }
    let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0 };
    let mut buf = [fill; 16];
    buf[16 - bytes.len()..].copy_from_slice(bytes);
    Ok(i128::from_be_bytes(buf))
}

fn rescale(v: i128, from: i64, to: i8) -> std::result::Result<i128, String> {
    let to = to as i64;
    if from == to {
        Ok(v)
    } else if from < to {
        10i128
            .checked_pow((to - from) as u32)
            .and_then(|m| v.checked_mul(m))
            .ok_or_else(|| "decimal overflow".into())
    } else {
        let d = 10i128
            .checked_pow((from - to) as u32)
            .ok_or("decimal has too many decimals")?;
        if v % d != 0 {
            return Err(format!("decimal has more than {to} decimals"));
        }
        Ok(v / d)
    }
}

/// A JSON value as a cell of a column of `kind`; `Ok(None)` for the unavailable-value
/// placeholder.
fn cell(dec: Dec, kind: &ColumnKind, v: &Json) -> std::result::Result<Option<Cell>, String> {
    if v.is_null() {
        return Ok(Some(Cell::Null));
    }
    if v.as_str() == Some(UNAVAILABLE_VALUE) {
        return Ok(None);
    }
    let wrong = || format!("JSON value {v} is not a valid {}", kind.sql_name());
    Ok(Some(match dec {
        Dec::Int => Cell::Int(match v {
            Json::Number(n) => n.as_i64().ok_or_else(wrong)?,
            Json::String(s) => s.trim().parse().map_err(|_| wrong())?,
            Json::Bool(b) => *b as i64,
            _ => return Err(wrong()),
        }),
        Dec::Float => Cell::Float(match v {
            Json::Number(n) => n.as_f64().ok_or_else(wrong)?,
            Json::String(s) => s.trim().parse().map_err(|_| wrong())?,
            _ => return Err(wrong()),
        }),
        Dec::Bool => Cell::Bool(match v {
            Json::Bool(b) => *b,
            Json::Number(n) => n.as_i64().ok_or_else(wrong)? != 0,
            _ => return Err(wrong()),
        }),
        Dec::Str => Cell::Str(match v {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        }),
        Dec::Bytes => {
            let bytes = b64(v.as_str().ok_or_else(wrong)?)?;
            if bytes == UNAVAILABLE_VALUE.as_bytes() {
                return Ok(None);
            }
            Cell::Bytes(bytes)
        }
        Dec::Decimal { scale } => match v {
            Json::String(s) => {
                let bytes = b64(s)?;
                if bytes == UNAVAILABLE_VALUE.as_bytes() {
                    return Ok(None);
                }
                Cell::Decimal(be_signed(&bytes)?)
            }
            Json::Object(_) => return cell(Dec::VarDecimal { scale }, kind, v),
            _ => return Err(wrong()),
        },
        Dec::LooseDecimal { scale } => match v {
            // decimal.handling.mode=string / double give a number or numeric text...
            Json::String(s) if looks_numeric(s) => {
                let (u, sc) = parse_decimal(s)?;
                Cell::Decimal(rescale(u, sc as i64, scale)?)
            }
            Json::Number(n) => {
                let (u, sc) = parse_decimal(&n.to_string()).map_err(|_| wrong())?;
                Cell::Decimal(rescale(u, sc as i64, scale)?)
            }
            // ...precise mode gives base64 bytes.
            _ => return cell(Dec::Decimal { scale }, kind, v),
        },
        Dec::VarDecimal { scale } => {
            let s = v.get("scale").and_then(Json::as_i64).ok_or_else(wrong)?;
            let bytes = b64(v.get("value").and_then(Json::as_str).ok_or_else(wrong)?)?;
            Cell::Decimal(rescale(be_signed(&bytes)?, s, scale)?)
        }
        Dec::Date => Cell::Date(match v {
            Json::Number(n) => i32::try_from(n.as_i64().ok_or_else(wrong)?).map_err(|_| wrong())?,
            Json::String(s) => parse_date(s)?,
            _ => return Err(wrong()),
        }),
        Dec::Timestamp(unit) => Cell::Micros(match v {
            Json::Number(n) => to_micros(n.as_i64().ok_or_else(wrong)?, unit)?,
            Json::String(s) => parse_timestamp(s.trim_end_matches('Z'))?,
            _ => return Err(wrong()),
        }),
        Dec::TimestampUtc(unit) => Cell::Micros(match v {
            Json::Number(n) => to_micros(n.as_i64().ok_or_else(wrong)?, unit)?,
            Json::String(s) => parse_timestamptz(s)?,
            _ => return Err(wrong()),
        }),
    }))
}

/// Reads a Debezium change file in batches.
pub struct DebeziumReader<R> {
    input: R,
    file: String,
    options: DebeziumOptions,
    line_no: usize,
    line: String,
    cols: Vec<Col>,
    buf: Option<ChangeBuffer>,
    table: Option<String>,
    done: bool,
}

impl<R: BufRead> DebeziumReader<R> {
    /// Read from `input`; `file` names it in errors.
    pub fn new(input: R, file: impl Into<String>, options: DebeziumOptions) -> Self {
        DebeziumReader {
            input,
            file: file.into(),
            options: DebeziumOptions {
                batch_rows: options.batch_rows.max(1),
                ..options
            },
            line_no: 0,
            line: String::new(),
            cols: vec![],
            buf: None,
            table: None,
            done: false,
        }
    }

    /// The source table the events are about (`schema.table` or `db.table`), once known.
    pub fn source_table(&self) -> Option<&str> {
        self.table.as_deref()
    }

    fn err(&self, detail: impl Into<String>) -> SourceError {
        SourceError::Debezium {
            file: self.file.clone(),
            line: self.line_no,
            detail: detail.into(),
        }
    }

    /// The next batch (at most `batch_rows` rows), `None` at the end of the file.
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        while !self.done {
            self.line.clear();
            let n = self
                .input
                .read_line(&mut self.line)
                .map_err(|source| SourceError::Io {
                    file: self.file.clone(),
                    source,
                })?;
            if n == 0 {
                self.done = true;
                break;
            }
            self.line_no += 1;
            let text = self.line.trim();
            if text.is_empty() {
                continue;
            }
            let v: Json =
                serde_json::from_str(text).map_err(|e| self.err(format!("not JSON: {e}")))?;
            self.event(v)?;
            if self
                .buf
                .as_ref()
                .is_some_and(|b| b.rows >= self.options.batch_rows)
            {
                return self.take();
            }
        }
        self.take()
    }

    fn take(&mut self) -> Result<Option<RecordBatch>> {
        match &mut self.buf {
            Some(b) if b.rows > 0 => b.finish().map(Some).map_err(|source| SourceError::Arrow {
                object: self.file.clone(),
                source,
            }),
            _ => Ok(None),
        }
    }

    fn set_columns(&mut self, cols: Vec<Col>) -> Result<()> {
        let cols: Vec<Col> = cols
            .into_iter()
            .filter(|c| !self.options.exclude_columns.contains(&c.name))
            .collect();
        match &mut self.buf {
            None => {
                let spec: Vec<(String, ColumnKind)> = cols
                    .iter()
                    .map(|c| (c.name.clone(), c.kind.clone()))
                    .collect();
                self.buf = Some(ChangeBuffer::new(&spec, self.options.batch_rows));
            }
            Some(buf) => {
                for c in &cols {
                    match buf.position(&c.name) {
                        None => {
                            buf.add_column(&c.name, c.kind.clone());
                        }
                        Some(i) if buf.columns[i].1 != c.kind => {
                            return Err(SourceError::Debezium {
                                file: self.file.clone(),
                                line: self.line_no,
                                detail: format!(
                                    "column '{}' changed type from {} to {} within the file",
                                    c.name,
                                    buf.columns[i].1.sql_name(),
                                    c.kind.sql_name()
                                ),
                            })
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        self.cols = cols;
        Ok(())
    }

    fn event(&mut self, v: Json) -> Result<()> {
        let (schema, payload) = match v {
            Json::Null => return Ok(()),
            Json::Object(mut o) if o.contains_key("payload") => (
                o.remove("schema"),
                o.remove("payload").unwrap_or(Json::Null),
            ),
            other => (None, other),
        };
        if payload.is_null() {
            return Ok(()); // tombstone
        }
        let op = payload
            .get("op")
            .and_then(Json::as_str)
            .ok_or_else(|| self.err("no \"op\" in the change event"))?;
        let change_type = match op {
            "c" => meta::INSERT,
            "u" => meta::UPDATE,
            "d" => meta::DELETE,
            "r" => meta::SNAPSHOT,
            "t" => meta::TRUNCATE,
            "m" => return Ok(()),
            other => {
                return Err(self.err(format!(
                    "unknown op '{other}' (expected c, u, d, r, t or m)"
                )))
            }
        };
        // Columns: the embedded schema, else the caller's.
        let embedded = schema
            .as_ref()
            .and_then(|s| s.get("fields"))
            .and_then(Json::as_array)
            .and_then(|fields| {
                fields
                    .iter()
                    .find(|f| f.get("field").and_then(Json::as_str) == Some("after"))
                    .or_else(|| {
                        fields
                            .iter()
                            .find(|f| f.get("field").and_then(Json::as_str) == Some("before"))
                    })
                    .and_then(|f| f.get("fields"))
                    .and_then(Json::as_array)
                    .cloned()
            });
        match embedded {
            Some(fields) => {
                let mut cols = Vec::new();
                for f in &fields {
                    let name = f.get("field").and_then(Json::as_str).unwrap_or("");
                    if self.options.exclude_columns.iter().any(|e| e == name) {
                        continue;
                    }
                    match map_field(f) {
                        Ok(c) => cols.push(c),
                        Err(e) => return Err(self.err(format!("{e}; exclude the column"))),
                    }
                }
                self.set_columns(cols)?;
            }
            None if self.buf.is_none() => match self.options.schema.clone() {
                Some(s) => {
                    let cols = cols_from_arrow(&s, self.options.integer_timestamp_unit).map_err(|e| self.err(e))?;
                    self.set_columns(cols)?;
                }
                None => {
                    return Err(self.err(
                        "the event has no embedded schema and no schema was given; pass the table's schema \
                         (or enable the JSON converter's schemas)",
                    ))
                }
            },
            None => {}
        }
        let source = payload.get("source").cloned().unwrap_or(Json::Null);
        let table = match (
            source
                .get("schema")
                .or_else(|| source.get("db"))
                .and_then(Json::as_str),
            source.get("table").and_then(Json::as_str),
        ) {
            (Some(s), Some(t)) => Some(format!("{s}.{t}")),
            (None, Some(t)) => Some(t.to_string()),
            _ => None,
        };
        if let Some(t) = table {
            match &self.table {
                None => self.table = Some(t),
                Some(prev) if *prev != t => {
                    return Err(self.err(format!(
                        "the event is about table {t} but earlier lines are about {prev}; one file holds one table's changes"
                    )))
                }
                _ => {}
            }
        }
        let (lsn, seq) = self.position(&source)?;
        let ts = source
            .get("ts_us")
            .and_then(Json::as_i64)
            .or_else(|| source.get("ts_ms").and_then(Json::as_i64).map(|m| m * 1000))
            .or_else(|| payload.get("ts_us").and_then(Json::as_i64))
            .or_else(|| {
                payload
                    .get("ts_ms")
                    .and_then(Json::as_i64)
                    .map(|m| m * 1000)
            });
        let row = match op {
            "d" => payload.get("before"),
            "t" => None,
            _ => payload.get("after"),
        }
        .filter(|r| !r.is_null());
        if row.is_none() && op != "t" {
            return Err(self.err(format!(
                "op '{op}' without {}",
                if op == "d" { "\"before\"" } else { "\"after\"" }
            )));
        }
        let Some(buf) = self.buf.as_mut() else {
            return Err(self.err("internal: no columns"));
        };
        let mut unchanged = Vec::new();
        if let Some(row) = row {
            for c in &self.cols {
                let Some(idx) = buf.position(&c.name) else {
                    continue;
                };
                let v = row.get(&c.name).unwrap_or(&Json::Null);
                let available =
                    append_json(&mut buf.columns[idx].2, &c.dec, v, &At::Column(&c.name)).map_err(
                        |detail| SourceError::Debezium {
                            file: self.file.clone(),
                            line: self.line_no,
                            detail,
                        },
                    )?;
                if !available {
                    unchanged.push(c.name.clone());
                }
            }
        }
        buf.end_row(change_type, lsn, seq, ts, &unchanged);
        Ok(())
    }

    /// (`_commit_lsn`, `_change_seq`) from the source block.
    fn position(&self, source: &Json) -> Result<(i64, i64)> {
        let num = |v: Option<&Json>| -> Option<i64> {
            v.and_then(|x| {
                x.as_i64()
                    .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
            })
        };
        if let Some(file) = source.get("file").and_then(Json::as_str) {
            let index: i64 = file
                .rsplit('.')
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    self.err(format!(
                        "binlog file name '{file}' does not end in a number"
                    ))
                })?;
            let pos =
                num(source.get("pos")).ok_or_else(|| self.err("MySQL source without \"pos\""))?;
            if !(0..1 << 31).contains(&index) || !(0..1 << 32).contains(&pos) {
                return Err(self.err(format!("binlog position {file}:{pos} out of range")));
            }
            let row = num(source.get("row")).unwrap_or(0);
            return Ok(((index << 32) | pos, row));
        }
        // PostgreSQL: sequence = "[\"last committed lsn\",\"lsn\"]".
        if let Some(seq) = source.get("sequence").and_then(Json::as_str) {
            if let Ok(Json::Array(parts)) = serde_json::from_str::<Json>(seq) {
                if let (Some(a), Some(b)) = (num(parts.first()), num(parts.get(1))) {
                    return Ok((a, b));
                }
            }
        }
        if let Some(lsn) = num(source.get("lsn")) {
            return Ok((lsn, 0));
        }
        Err(self.err(
            "no source position: expected source.lsn / source.sequence (PostgreSQL connector) or \
             source.file and source.pos (MySQL connector)",
        ))
    }
}

/// Read a whole Debezium file held in memory into batches.
pub fn read_debezium(
    bytes: &[u8],
    file: &str,
    options: DebeziumOptions,
) -> Result<Vec<RecordBatch>> {
    let mut r = DebeziumReader::new(bytes, file, options);
    let mut out = Vec::new();
    while let Some(b) = r.next_batch()? {
        out.push(b);
    }
    Ok(out)
}
