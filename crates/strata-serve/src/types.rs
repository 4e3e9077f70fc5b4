//! Arrow values as PostgreSQL sees them (pure: no I/O): the PostgreSQL type of each Arrow
//! type strata writes, a value's text and binary encodings, and a client's parameter
//! values back into Arrow scalars.
//!
//! | Arrow (Delta)                          | PostgreSQL                  |
//! |----------------------------------------|-----------------------------|
//! | Boolean                                | `bool`                      |
//! | Int8, Int16, UInt8                     | `int2`                      |
//! | Int32, UInt16                          | `int4`                      |
//! | Int64, UInt32                          | `int8`                      |
//! | UInt64                                 | `numeric(20,0)`             |
//! | Float16, Float32                       | `float4`                    |
//! | Float64                                | `float8`                    |
//! | Decimal(p, s)                          | `numeric(p,s)`              |
//! | Utf8, LargeUtf8, Utf8View              | `text`                      |
//! | Binary, LargeBinary, BinaryView, Fixed | `bytea`                     |
//! | Date32, Date64                         | `date`                      |
//! | Timestamp without a zone (TIMESTAMP_NTZ) | `timestamp`               |
//! | Timestamp with a zone (TIMESTAMP)      | `timestamptz` (shown in UTC)|
//! | Time32, Time64                         | `time`                      |
//! | List, Struct, Map (nested)             | `json` (the value as JSON)  |
//! | anything else                          | `text` (Arrow's display)    |

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, NaiveDate};
use deltalake::arrow::array::{Array, ArrayRef, AsArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type,
    Int64Type, Time64MicrosecondType, TimeUnit, TimestampMicrosecondType,
};
use deltalake::arrow::error::ArrowError;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::scalar::ScalarValue;
use pgwire::api::Type;
use std::fmt::Write;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
/// Days from the Unix epoch to PostgreSQL's.
const PG_EPOCH_DAYS: i32 = 10_957;

/// The Arrow type a column of type `dt` is cast to before it is encoded, when it is not
/// encoded as it is: the few types [`pg_type`] and the encoders know.
pub(crate) fn encoded_type(dt: &DataType) -> Option<DataType> {
    use DataType::*;
    Some(match dt {
        Dictionary(_, value) => encoded_type(value).unwrap_or_else(|| value.as_ref().clone()),
        Int8 | UInt8 => Int16,
        UInt16 => Int32,
        UInt32 => Int64,
        UInt64 => Decimal128(20, 0),
        Float16 => Float32,
        Decimal32(p, s) | Decimal64(p, s) => Decimal128(*p, *s),
        LargeUtf8 | Utf8View => Utf8,
        LargeBinary | BinaryView | FixedSizeBinary(_) => Binary,
        Date64 => Date32,
        Timestamp(unit, tz) if *unit != TimeUnit::Microsecond => {
            Timestamp(TimeUnit::Microsecond, tz.clone())
        }
        Time32(_) | Time64(TimeUnit::Nanosecond) => Time64(TimeUnit::Microsecond),
        _ => return None,
    })
}

/// The PostgreSQL type of an Arrow column of type `dt`, and its type modifier
/// (`numeric(p,s)`'s precision and scale; -1 for none).
pub(crate) fn pg_type(dt: &DataType) -> (Type, i32) {
    use DataType::*;
    if let Some(encoded) = encoded_type(dt) {
        return pg_type(&encoded);
    }
    let t = match dt {
        Boolean => Type::BOOL,
        Int16 => Type::INT2,
        Int32 => Type::INT4,
        Int64 => Type::INT8,
        Float32 => Type::FLOAT4,
        Float64 => Type::FLOAT8,
        Decimal128(p, s) | Decimal256(p, s) => {
            let modifier = match *s >= 0 {
                true => ((i32::from(*p) << 16) | i32::from(*s)) + 4,
                false => -1,
            };
            return (Type::NUMERIC, modifier);
        }
        Utf8 | Null => Type::TEXT,
        Binary => Type::BYTEA,
        Date32 => Type::DATE,
        Timestamp(_, None) => Type::TIMESTAMP,
        Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        Time64(_) => Type::TIME,
        List(_) | LargeList(_) | FixedSizeList(..) | ListView(_) | LargeListView(_) | Struct(_)
        | Map(..) => Type::JSON,
        _ => Type::TEXT,
    };
    (t, -1)
}

/// `pg_type.typlen` of `t`: its fixed width, or -1.
pub(crate) fn type_size(t: &Type) -> i16 {
    match *t {
        Type::BOOL => 1,
        Type::INT2 => 2,
        Type::INT4 | Type::FLOAT4 | Type::DATE => 4,
        Type::INT8 | Type::FLOAT8 | Type::TIMESTAMP | Type::TIMESTAMPTZ | Type::TIME => 8,
        _ => -1,
    }
}

/// The Arrow type of a parameter a client declared as `t` (when the query does not say).
pub(crate) fn arrow_type_of(t: &Type) -> Option<DataType> {
    Some(match *t {
        Type::BOOL => DataType::Boolean,
        Type::INT2 => DataType::Int16,
        Type::INT4 => DataType::Int32,
        Type::INT8 => DataType::Int64,
        Type::FLOAT4 => DataType::Float32,
        Type::FLOAT8 => DataType::Float64,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => DataType::Utf8,
        Type::BYTEA => DataType::Binary,
        Type::DATE => DataType::Date32,
        Type::TIMESTAMP => DataType::Timestamp(TimeUnit::Microsecond, None),
        Type::TIMESTAMPTZ => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        _ => return None,
    })
}

/// One column of a batch made ready to encode: cast to its encoded type.
pub(crate) struct Column {
    array: ArrayRef,
    binary: bool,
}

impl Column {
    /// `array` to be encoded in binary (`binary`) or text.
    pub(crate) fn new(array: &ArrayRef, binary: bool) -> Result<Column, ArrowError> {
        let array = match encoded_type(array.data_type()) {
            Some(t) => cast(array, &t)?,
            None => array.clone(),
        };
        Ok(Column { array, binary })
    }

    /// Appends the value at `row` to a DataRow's buffer: its length, then its bytes (-1 for
    /// NULL).
    pub(crate) fn encode(&self, row: usize, out: &mut BytesMut) -> Result<(), ArrowError> {
        if self.array.is_null(row) {
            out.put_i32(-1);
            return Ok(());
        }
        let at = out.len();
        out.put_i32(0);
        match self.binary {
            true => encode_binary(&self.array, row, out)?,
            false => {
                let mut text = String::new();
                encode_text(self.array.as_ref(), row, &mut text)?;
                out.put_slice(text.as_bytes());
            }
        }
        let len = (out.len() - at - 4) as i32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }
}

/// The PostgreSQL text of the value at `row` (not NULL) of `array` (of an encoded type).
pub(crate) fn encode_text(
    array: &dyn Array,
    row: usize,
    out: &mut String,
) -> Result<(), ArrowError> {
    use DataType::*;
    match array.data_type() {
        Boolean => out.push(if array.as_boolean().value(row) {
            't'
        } else {
            'f'
        }),
        Int16 => write_display(out, array.as_primitive::<Int16Type>().value(row)),
        Int32 => write_display(out, array.as_primitive::<Int32Type>().value(row)),
        Int64 => write_display(out, array.as_primitive::<Int64Type>().value(row)),
        Float32 => {
            let v = array.as_primitive::<Float32Type>().value(row);
            float_text(out, f64::from(v), v.to_string(), format!("{v:e}"), 6)
        }
        Float64 => {
            let v = array.as_primitive::<Float64Type>().value(row);
            float_text(out, v, v.to_string(), format!("{v:e}"), 15)
        }
        Decimal128(_, s) => out.push_str(&decimal_text(
            array.as_primitive::<Decimal128Type>().value(row),
            *s,
        )),
        Utf8 => out.push_str(array.as_string::<i32>().value(row)),
        Binary => {
            out.push_str("\\x");
            for b in array.as_binary::<i32>().value(row) {
                let _ = write!(out, "{b:02x}");
            }
        }
        Date32 => out.push_str(&date_text(array.as_primitive::<Date32Type>().value(row))),
        Timestamp(_, tz) => {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(row);
            out.push_str(&timestamp_text(micros));
            if tz.is_some() {
                out.push_str("+00");
            }
        }
        Time64(_) => {
            let micros = array.as_primitive::<Time64MicrosecondType>().value(row);
            out.push_str(&time_text(micros));
        }
        t if pg_type(t).0 == Type::JSON => write_json(array, row, out)?,
        _ => {
            let options = FormatOptions::default();
            let f = ArrayFormatter::try_new(array, &options)?;
            let _ = write!(out, "{}", f.value(row));
        }
    }
    Ok(())
}

fn write_display(out: &mut String, v: impl std::fmt::Display) {
    let _ = write!(out, "{v}");
}

/// PostgreSQL's text of a float: `NaN`, `Infinity`, `-Infinity`, else the shortest digits
/// that read back as the same value, as PostgreSQL 12+ writes them: `fixed` (Rust's
/// shortest display) unless the decimal exponent is below -4 or at least `digits` (15 for
/// `float8`, 6 for `float4`), then `1.5e+20`, `1e-05` (from `exponent`, Rust's `{:e}`).
fn float_text(out: &mut String, v: f64, fixed: String, exponent: String, digits: i32) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let parsed = exponent
            .split_once('e')
            .and_then(|(m, e)| Some((m, e.parse::<i32>().ok()?)));
        match parsed {
            Some((mantissa, e)) if v != 0.0 && (e < -4 || e >= digits) => {
                let sign = if e < 0 { '-' } else { '+' };
                let _ = write!(out, "{mantissa}e{sign}{:02}", e.abs());
            }
            _ => out.push_str(&fixed),
        }
    }
}

/// `value` scaled by `scale` digits as decimal text (`-12.30` for -1230 at scale 2).
pub(crate) fn decimal_text(value: i128, scale: i8) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    if scale <= 0 {
        let zeros = if value == 0 { 0 } else { (-scale) as usize };
        return format!("{sign}{digits}{}", "0".repeat(zeros));
    }
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// `YYYY-MM-DD` of a day counted from 1970-01-01.
pub(crate) fn date_text(days: i32) -> String {
    match NaiveDate::from_num_days_from_ce_opt(days.saturating_add(719_163)) {
        Some(d) => d.format("%Y-%m-%d").to_string(),
        None => days.to_string(),
    }
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` of microseconds from 1970-01-01 00:00.
pub(crate) fn timestamp_text(micros: i64) -> String {
    match DateTime::from_timestamp_micros(micros) {
        Some(t) => {
            let base = t.naive_utc().format("%Y-%m-%d %H:%M:%S").to_string();
            base + &fraction(micros.rem_euclid(1_000_000))
        }
        None => micros.to_string(),
    }
}

/// `HH:MM:SS[.ffffff]` of microseconds from midnight.
fn time_text(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    format!(
        "{:02}:{:02}:{:02}{}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        fraction(micros.rem_euclid(1_000_000))
    )
}

/// `.ffffff` without its trailing zeros; nothing for a whole second.
fn fraction(micros: i64) -> String {
    if micros == 0 {
        return String::new();
    }
    let f = format!(".{micros:06}");
    f.trim_end_matches('0').to_string()
}

/// The value at `row` of a nested array (or of any array, inside one) as JSON: lists as
/// arrays, structs and maps as objects, numbers as numbers, anything else as a string of
/// its display.
pub(crate) fn write_json(
    array: &dyn Array,
    row: usize,
    out: &mut String,
) -> Result<(), ArrowError> {
    use DataType::*;
    if array.is_null(row) {
        out.push_str("null");
        return Ok(());
    }
    match array.data_type() {
        Boolean => out.push_str(if array.as_boolean().value(row) {
            "true"
        } else {
            "false"
        }),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Decimal32(..)
        | Decimal64(..) | Decimal128(..) | Decimal256(..) => {
            let options = FormatOptions::default();
            let f = ArrayFormatter::try_new(array, &options)?;
            let _ = write!(out, "{}", f.value(row));
        }
        Float16 | Float32 | Float64 => {
            let options = FormatOptions::default();
            let f = ArrayFormatter::try_new(array, &options)?;
            let text = f.value(row).to_string();
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() => out.push_str(&text),
                _ => json_string(out, &text),
            }
        }
        Utf8 => json_string(out, array.as_string::<i32>().value(row)),
        LargeUtf8 => json_string(out, array.as_string::<i64>().value(row)),
        Utf8View => json_string(out, array.as_string_view().value(row)),
        List(_) => json_list(&array.as_list::<i32>().value(row), out)?,
        LargeList(_) => json_list(&array.as_list::<i64>().value(row), out)?,
        FixedSizeList(..) => json_list(&array.as_fixed_size_list().value(row), out)?,
        Struct(fields) => {
            let s = array.as_struct();
            out.push('{');
            for (i, (field, column)) in fields.iter().zip(s.columns()).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(out, field.name());
                out.push(':');
                write_json(column.as_ref(), row, out)?;
            }
            out.push('}');
        }
        Map(..) => {
            let entries = array.as_map().value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            out.push('{');
            for i in 0..entries.len() {
                if i > 0 {
                    out.push(',');
                }
                let mut key = String::new();
                match keys.data_type() {
                    Utf8 | LargeUtf8 | Utf8View => {
                        let options = FormatOptions::default();
                        let f = ArrayFormatter::try_new(keys.as_ref(), &options)?;
                        let _ = write!(key, "{}", f.value(i));
                    }
                    _ => write_json(keys.as_ref(), i, &mut key)?,
                }
                json_string(out, &key);
                out.push(':');
                write_json(values.as_ref(), i, out)?;
            }
            out.push('}');
        }
        Dictionary(_, value) => {
            let plain = cast(&array.slice(row, 1), value)?;
            write_json(plain.as_ref(), 0, out)?;
        }
        _ => {
            let one = array.slice(row, 1);
            let plain = match encoded_type(one.data_type()) {
                Some(t) => cast(&one, &t)?,
                None => one,
            };
            let mut text = String::new();
            encode_text(plain.as_ref(), 0, &mut text)?;
            json_string(out, &text);
        }
    }
    Ok(())
}

fn json_list(values: &ArrayRef, out: &mut String) -> Result<(), ArrowError> {
    out.push('[');
    for i in 0..values.len() {
        if i > 0 {
            out.push(',');
        }
        write_json(values.as_ref(), i, out)?;
    }
    out.push(']');
    Ok(())
}

fn json_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::String(s.to_string()).to_string());
}

/// The PostgreSQL binary encoding of the value at `row` (not NULL) of `array`.
fn encode_binary(array: &ArrayRef, row: usize, out: &mut BytesMut) -> Result<(), ArrowError> {
    use DataType::*;
    match array.data_type() {
        Boolean => out.put_u8(u8::from(array.as_boolean().value(row))),
        Int16 => out.put_i16(array.as_primitive::<Int16Type>().value(row)),
        Int32 => out.put_i32(array.as_primitive::<Int32Type>().value(row)),
        Int64 => out.put_i64(array.as_primitive::<Int64Type>().value(row)),
        Float32 => out.put_f32(array.as_primitive::<Float32Type>().value(row)),
        Float64 => out.put_f64(array.as_primitive::<Float64Type>().value(row)),
        Binary => out.put_slice(array.as_binary::<i32>().value(row)),
        Date32 => {
            let days = array.as_primitive::<Date32Type>().value(row);
            out.put_i32(days.saturating_sub(PG_EPOCH_DAYS));
        }
        Timestamp(..) => {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(row);
            out.put_i64(micros.saturating_sub(PG_EPOCH_MICROS));
        }
        Time64(_) => out.put_i64(array.as_primitive::<Time64MicrosecondType>().value(row)),
        Decimal128(..) | Decimal256(..) => {
            let mut text = String::new();
            match array.data_type() {
                Decimal128(_, s) => {
                    text = decimal_text(array.as_primitive::<Decimal128Type>().value(row), *s)
                }
                _ => {
                    let options = FormatOptions::default();
                    let f = ArrayFormatter::try_new(array.as_ref(), &options)?;
                    let _ = write!(text, "{}", f.value(row));
                }
            }
            numeric_binary(&text, out)?;
        }
        // text, json and everything shown as text: the binary form is the text.
        _ => {
            let mut text = String::new();
            encode_text(array.as_ref(), row, &mut text)?;
            out.put_slice(text.as_bytes());
        }
    }
    Ok(())
}

/// PostgreSQL's binary `numeric` of a decimal text (`-123.4500`): digit count, weight,
/// sign, display scale, then base-10000 digits.
pub(crate) fn numeric_binary(text: &str, out: &mut BytesMut) -> Result<(), ArrowError> {
    let bad = || ArrowError::ParseError(format!("not a decimal number: {text}"));
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let int = int.trim_start_matches('0');
    let dscale = frac.len();
    let int_padded = format!("{}{int}", "0".repeat((4 - int.len() % 4) % 4));
    let frac_padded = format!("{frac}{}", "0".repeat((4 - frac.len() % 4) % 4));
    let all = int_padded + &frac_padded;
    let mut digits: Vec<i16> = all
        .as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).ok().and_then(|s| s.parse().ok()))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let mut weight = (int.len().div_ceil(4) as i16) - 1;
    while digits.first() == Some(&0) {
        digits.remove(0);
        weight -= 1;
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    if digits.is_empty() {
        weight = 0;
    }
    out.put_i16(digits.len() as i16);
    out.put_i16(weight);
    out.put_u16(if negative && !digits.is_empty() {
        0x4000
    } else {
        0
    });
    out.put_u16(dscale as u16);
    for d in digits {
        out.put_i16(d);
    }
    Ok(())
}

/// The decimal text of a binary `numeric`.
pub(crate) fn numeric_text(bytes: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i16> {
        Some(i16::from_be_bytes(bytes.get(i..i + 2)?.try_into().ok()?))
    };
    let (ndigits, weight, sign, dscale) = (word(0)?, word(2)?, word(4)? as u16, word(6)?);
    if sign == 0xC000 {
        return Some("NaN".to_string());
    }
    let digits: Vec<i16> = (0..ndigits as usize)
        .map(|i| word(8 + 2 * i))
        .collect::<Option<_>>()?;
    let mut int = String::new();
    for i in 0..=weight.max(-1) {
        let d = digits.get(i as usize).copied().unwrap_or(0);
        if int.is_empty() {
            if d != 0 {
                int = d.to_string();
            }
        } else {
            int.push_str(&format!("{d:04}"));
        }
    }
    if int.is_empty() {
        int.push('0');
    }
    let mut frac = String::new();
    let mut i = weight + 1;
    while (frac.len() as i16) < dscale {
        let d = if i < 0 {
            0
        } else {
            digits.get(i as usize).copied().unwrap_or(0)
        };
        frac.push_str(&format!("{d:04}"));
        i += 1;
    }
    frac.truncate(dscale.max(0) as usize);
    let sign = if sign == 0x4000 { "-" } else { "" };
    Some(match frac.is_empty() {
        true => format!("{sign}{int}"),
        false => format!("{sign}{int}.{frac}"),
    })
}

/// A parameter's value: `bytes` (NULL when `None`) in binary or text format, sent as type
/// `declared`, as a scalar of `target` (the type the query expects, when known).
pub(crate) fn decode_parameter(
    bytes: Option<&[u8]>,
    binary: bool,
    declared: &Type,
    target: Option<&DataType>,
) -> Result<ScalarValue, String> {
    let target = target.cloned().or_else(|| arrow_type_of(declared));
    let Some(bytes) = bytes else {
        return ScalarValue::try_from(target.as_ref().unwrap_or(&DataType::Null))
            .map_err(|e| e.to_string());
    };
    let value = match binary {
        false => ScalarValue::Utf8(Some(
            std::str::from_utf8(bytes)
                .map_err(|_| "a text parameter is not UTF-8".to_string())?
                .to_string(),
        )),
        true => binary_parameter(bytes, declared)?,
    };
    match target {
        Some(t) if value.data_type() != t => value
            .cast_to(&t)
            .map_err(|e| format!("parameter of type {declared} as {t}: {e}")),
        _ => Ok(value),
    }
}

fn binary_parameter(bytes: &[u8], declared: &Type) -> Result<ScalarValue, String> {
    let fixed = |n: usize| -> Result<&[u8], String> {
        match bytes.len() == n {
            true => Ok(bytes),
            false => Err(format!(
                "a binary {declared} parameter of {} bytes",
                bytes.len()
            )),
        }
    };
    let be8 = |b: &[u8]| i64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
    Ok(match *declared {
        Type::BOOL => ScalarValue::Boolean(Some(fixed(1)?[0] != 0)),
        Type::INT2 => ScalarValue::Int16(Some(i16::from_be_bytes(
            fixed(2)?.try_into().unwrap_or([0; 2]),
        ))),
        Type::INT4 => ScalarValue::Int32(Some(i32::from_be_bytes(
            fixed(4)?.try_into().unwrap_or([0; 4]),
        ))),
        Type::INT8 => ScalarValue::Int64(Some(be8(fixed(8)?))),
        Type::FLOAT4 => ScalarValue::Float32(Some(f32::from_be_bytes(
            fixed(4)?.try_into().unwrap_or([0; 4]),
        ))),
        Type::FLOAT8 => ScalarValue::Float64(Some(f64::from_bits(be8(fixed(8)?) as u64))),
        Type::BYTEA => ScalarValue::Binary(Some(bytes.to_vec())),
        Type::DATE => ScalarValue::Date32(Some(
            i32::from_be_bytes(fixed(4)?.try_into().unwrap_or([0; 4])) + PG_EPOCH_DAYS,
        )),
        Type::TIMESTAMP => {
            ScalarValue::TimestampMicrosecond(Some(be8(fixed(8)?) + PG_EPOCH_MICROS), None)
        }
        Type::TIMESTAMPTZ => ScalarValue::TimestampMicrosecond(
            Some(be8(fixed(8)?) + PG_EPOCH_MICROS),
            Some("UTC".into()),
        ),
        Type::NUMERIC => ScalarValue::Utf8(Some(
            numeric_text(bytes).ok_or_else(|| "a malformed binary numeric".to_string())?,
        )),
        _ => ScalarValue::Utf8(Some(
            String::from_utf8(bytes.to_vec())
                .map_err(|_| format!("a binary {declared} parameter is not supported"))?,
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{
        BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
        Int32Array, Int8Array, ListArray, StringArray, StructArray, TimestampMicrosecondArray,
        TimestampMillisecondArray,
    };
    use deltalake::arrow::datatypes::{Field, Fields, Int32Type as I32};
    use std::sync::Arc;

    fn text(array: ArrayRef) -> Vec<Option<String>> {
        let column = Column::new(&array, false).unwrap();
        (0..array.len())
            .map(|row| {
                let mut out = BytesMut::new();
                column.encode(row, &mut out).unwrap();
                let len = i32::from_be_bytes(out[..4].try_into().unwrap());
                (len >= 0).then(|| String::from_utf8(out[4..].to_vec()).unwrap())
            })
            .collect()
    }

    fn binary(array: ArrayRef, row: usize) -> Vec<u8> {
        let column = Column::new(&array, true).unwrap();
        let mut out = BytesMut::new();
        column.encode(row, &mut out).unwrap();
        out[4..].to_vec()
    }

    #[test]
    fn every_delta_type_has_its_postgresql_type() {
        use DataType::*;
        let utc = Some("UTC".into());
        for (arrow, pg) in [
            (Boolean, Type::BOOL),
            (Int8, Type::INT2),
            (Int16, Type::INT2),
            (Int32, Type::INT4),
            (Int64, Type::INT8),
            (Float32, Type::FLOAT4),
            (Float64, Type::FLOAT8),
            (Decimal128(10, 2), Type::NUMERIC),
            (Utf8, Type::TEXT),
            (Utf8View, Type::TEXT),
            (Binary, Type::BYTEA),
            (Date32, Type::DATE),
            (Timestamp(TimeUnit::Microsecond, None), Type::TIMESTAMP),
            (Timestamp(TimeUnit::Microsecond, utc), Type::TIMESTAMPTZ),
            (List(Arc::new(Field::new("item", Int32, true))), Type::JSON),
            (Struct(Fields::empty()), Type::JSON),
            (Dictionary(Box::new(Int32), Box::new(Utf8)), Type::TEXT),
        ] {
            assert_eq!(pg_type(&arrow).0, pg, "{arrow}");
        }
        // numeric(10,2): the modifier PostgreSQL gives it.
        assert_eq!(pg_type(&Decimal128(10, 2)).1, (10 << 16 | 2) + 4);
        assert_eq!(pg_type(&Int64).1, -1);
    }

    #[test]
    fn values_in_postgresql_text() {
        assert_eq!(
            text(Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false)
            ]))),
            vec![Some("t".into()), None, Some("f".into())]
        );
        assert_eq!(
            text(Arc::new(Int8Array::from(vec![-3]))),
            vec![Some("-3".into())]
        );
        assert_eq!(
            text(Arc::new(Float64Array::from(vec![
                1.5,
                f64::NAN,
                f64::INFINITY
            ]))),
            vec![
                Some("1.5".into()),
                Some("NaN".into()),
                Some("Infinity".into())
            ]
        );
        // As PostgreSQL writes them: exponents below -4 or from 15 digits (6 for real).
        let floats = [1e20, -1.5e-5, 123.0, 0.0001, 0.0, 123456789012345.0, 1e15];
        assert_eq!(
            text(Arc::new(Float64Array::from(floats.to_vec()))),
            [
                "1e+20",
                "-1.5e-05",
                "123",
                "0.0001",
                "0",
                "123456789012345",
                "1e+15"
            ]
            .map(|s| Some(s.to_string()))
            .to_vec()
        );
        assert_eq!(
            text(Arc::new(Float32Array::from(vec![
                1234567.0, 123456.0, 0.25
            ]))),
            ["1.234567e+06", "123456", "0.25"]
                .map(|s| Some(s.to_string()))
                .to_vec()
        );
        let d = Decimal128Array::from(vec![12345, -5, 0])
            .with_precision_and_scale(10, 2)
            .unwrap();
        assert_eq!(
            text(Arc::new(d)),
            vec![
                Some("123.45".into()),
                Some("-0.05".into()),
                Some("0.00".into())
            ]
        );
        assert_eq!(
            text(Arc::new(BinaryArray::from(vec![&b"\x01\xab"[..]]))),
            vec![Some("\\x01ab".into())]
        );
        assert_eq!(
            text(Arc::new(Date32Array::from(vec![19_723]))),
            vec![Some("2024-01-01".into())]
        );
        // 2024-01-01 10:00:00.5: no zone, then UTC.
        let micros = 1_704_103_200_500_000;
        assert_eq!(
            text(Arc::new(TimestampMicrosecondArray::from(vec![micros]))),
            vec![Some("2024-01-01 10:00:00.5".into())]
        );
        assert_eq!(
            text(Arc::new(
                TimestampMillisecondArray::from(vec![micros / 1000]).with_timezone("UTC")
            )),
            vec![Some("2024-01-01 10:00:00.5+00".into())]
        );
        assert_eq!(
            text(Arc::new(StringArray::from(vec!["Isabel"]))),
            vec![Some("Isabel".into())]
        );
    }

    #[test]
    fn nested_values_are_json() {
        let list = ListArray::from_iter_primitive::<I32, _, _>(vec![
            Some(vec![Some(1), None, Some(3)]),
            None,
        ]);
        assert_eq!(text(Arc::new(list)), vec![Some("[1,null,3]".into()), None]);
        let s = StructArray::from(vec![
            (
                Arc::new(Field::new("city", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["Oa\"xaca"])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("zip", DataType::Int32, true)),
                Arc::new(Int32Array::from(vec![68000])) as ArrayRef,
            ),
        ]);
        assert_eq!(
            text(Arc::new(s)),
            vec![Some(r#"{"city":"Oa\"xaca","zip":68000}"#.into())]
        );
    }

    #[test]
    fn maps_are_json_objects() {
        use deltalake::arrow::array::{Int32Builder, MapBuilder, StringBuilder};
        let mut b = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        b.keys().append_value("a");
        b.values().append_value(1);
        b.keys().append_value("b\"");
        b.values().append_null();
        b.append(true).unwrap();
        b.append(false).unwrap();
        let map: ArrayRef = Arc::new(b.finish());
        assert_eq!(pg_type(map.data_type()).0, Type::JSON);
        assert_eq!(
            text(map),
            vec![Some(r#"{"a":1,"b\"":null}"#.to_string()), None]
        );
    }

    #[test]
    fn values_in_postgresql_binary() {
        assert_eq!(
            binary(Arc::new(Int32Array::from(vec![258])), 0),
            vec![0, 0, 1, 2]
        );
        // 2000-01-02 00:00:00: one day after PostgreSQL's epoch.
        let micros = PG_EPOCH_MICROS + 86_400_000_000;
        assert_eq!(
            binary(Arc::new(TimestampMicrosecondArray::from(vec![micros])), 0),
            86_400_000_000i64.to_be_bytes().to_vec()
        );
        assert_eq!(
            binary(Arc::new(Date32Array::from(vec![PG_EPOCH_DAYS + 1])), 0),
            1i32.to_be_bytes().to_vec()
        );
    }

    #[test]
    fn numerics_round_trip_through_binary() {
        for text in [
            "123.45",
            "-0.05",
            "0",
            "0.00",
            "10000",
            "12345678.9",
            "-1",
            "0.0001",
        ] {
            let mut out = BytesMut::new();
            numeric_binary(text, &mut out).unwrap();
            assert_eq!(numeric_text(&out).as_deref(), Some(text), "{text}");
        }
        // 123.45: two digits (123, 4500), weight 0, positive, scale 2.
        let mut out = BytesMut::new();
        numeric_binary("123.45", &mut out).unwrap();
        assert_eq!(out.to_vec(), vec![0, 2, 0, 0, 0, 0, 0, 2, 0, 123, 17, 148]);
    }

    #[test]
    fn parameters_become_scalars_of_the_expected_type() {
        assert_eq!(
            decode_parameter(Some(b"42"), false, &Type::UNKNOWN, Some(&DataType::Int64)),
            Ok(ScalarValue::Int64(Some(42)))
        );
        assert_eq!(
            decode_parameter(
                Some(&7i32.to_be_bytes()),
                true,
                &Type::INT4,
                Some(&DataType::Int64)
            ),
            Ok(ScalarValue::Int64(Some(7)))
        );
        assert_eq!(
            decode_parameter(Some(b"x"), true, &Type::TEXT, None),
            Ok(ScalarValue::Utf8(Some("x".into())))
        );
        assert_eq!(
            decode_parameter(None, false, &Type::INT4, None),
            Ok(ScalarValue::Int32(None))
        );
        assert!(
            decode_parameter(Some(b"x"), false, &Type::UNKNOWN, Some(&DataType::Int32)).is_err()
        );
    }
}
