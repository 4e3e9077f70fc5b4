//! The types `read_files` infers for the values of JSON and CSV files, as Databricks'
//! read_files does (`inferColumnTypes`, on by default). Pure: texts and JSON values in,
//! Arrow types out.
//!
//! A CSV cell is, in this order of preference:
//!
//! | text                                              | type                          |
//! |---------------------------------------------------|-------------------------------|
//! | `-?digits` within INT's range                     | INT                           |
//! | `-?digits` within BIGINT's range                  | BIGINT                        |
//! | `-?digits`, at most 38 digits                     | DECIMAL(digits, 0)            |
//! | a number with `.` or an exponent (`1.5`, `2e3`)   | DOUBLE                        |
//! | `yyyy-MM-dd`, a real date                         | DATE                          |
//! | `yyyy-MM-dd[T| ]HH:mm:ss[.f{1,9}][zone]`          | TIMESTAMP (microseconds, UTC) |
//! | `true` / `false` in any case                      | BOOLEAN                       |
//! | anything else                                     | STRING                        |
//!
//! The zone is `Z`, `±HH:mm` or `±HHmm`; a timestamp without one is read as UTC (Databricks
//! reads it in the session time zone, UTC unless set). A JSON value keeps its JSON kind:
//! an integer is BIGINT (DECIMAL(20,0) above BIGINT's range), another number DOUBLE, a
//! boolean BOOLEAN, anything else STRING; with `inferTimestamp => true` a string that is a
//! timestamp by the rule above is TIMESTAMP (Databricks' JSON option, off by default).
//!
//! A column's values meet at the narrowest type holding them all ([`widen`]): INT and BIGINT
//! are BIGINT, integers and DECIMAL a DECIMAL wide enough, any number and DOUBLE DOUBLE, DATE
//! and TIMESTAMP TIMESTAMP, any other mix STRING.

use deltalake::arrow::datatypes::{DataType, TimeUnit};
use serde_json::Value;

/// Digits of a DECIMAL at most (Delta's and Spark's limit).
const MAX_DECIMAL_DIGITS: u8 = 38;

/// How values are typed, from read_files' options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// `inferColumnTypes` (default true): CSV cells are typed; without it every CSV column is
    /// STRING (JSON values keep their JSON kinds either way).
    pub(crate) column_types: bool,
    /// JSON's `inferTimestamp` (default false; only with `inferColumnTypes`): JSON strings
    /// that are timestamps are TIMESTAMP.
    pub(crate) json_timestamps: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            column_types: true,
            json_timestamps: false,
        }
    }
}

/// Delta's TIMESTAMP: microseconds in UTC.
pub(crate) fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The type a non-empty CSV cell suggests under `rules`.
pub(crate) fn csv_type(text: &str, rules: Rules) -> DataType {
    if !rules.column_types {
        return DataType::Utf8;
    }
    if let Some(t) = integer_type(text) {
        return t;
    }
    if is_fraction(text) {
        return DataType::Float64;
    }
    if is_date(text) {
        return DataType::Date32;
    }
    if is_timestamp(text) {
        return timestamp_type();
    }
    if text.eq_ignore_ascii_case("true") || text.eq_ignore_ascii_case("false") {
        return DataType::Boolean;
    }
    DataType::Utf8
}

/// The type a JSON value suggests under `rules`; `None` for `null`, which says nothing.
pub(crate) fn json_type(v: &Value, rules: Rules) -> Option<DataType> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some(DataType::Boolean),
        Value::Number(n) if n.is_i64() => Some(DataType::Int64),
        Value::Number(n) if n.is_u64() => Some(DataType::Decimal128(20, 0)),
        Value::Number(_) => Some(DataType::Float64),
        Value::String(s) if rules.json_timestamps && is_timestamp(s) => Some(timestamp_type()),
        _ => Some(DataType::Utf8),
    }
}

/// The type holding values of types `a` and `b` (`None`: only NULLs so far).
pub(crate) fn widen(a: Option<DataType>, b: Option<DataType>) -> Option<DataType> {
    use DataType::*;
    let (x, y) = match (a, b) {
        (None, t) | (t, None) => return t,
        (Some(x), Some(y)) => (x, y),
    };
    if x == y {
        return Some(x);
    }
    Some(match (&x, &y) {
        (Int32, Int64) | (Int64, Int32) => Int64,
        (Float64, t) | (t, Float64) if integer_digits(t).is_some() => Float64,
        _ => match (integer_digits(&x), integer_digits(&y)) {
            (Some(p), Some(q)) => Decimal128(p.max(q).min(MAX_DECIMAL_DIGITS), 0),
            _ if is_timeish(&x) && is_timeish(&y) => timestamp_type(),
            _ => Utf8,
        },
    })
}

/// The decimal digits a whole-number type needs (DECIMAL's precision for it), as Spark
/// widens INT to DECIMAL(10,0) and BIGINT to DECIMAL(20,0).
fn integer_digits(t: &DataType) -> Option<u8> {
    match t {
        DataType::Int32 => Some(10),
        DataType::Int64 => Some(20),
        DataType::Decimal128(p, 0) => Some(*p),
        _ => None,
    }
}

fn is_timeish(t: &DataType) -> bool {
    matches!(t, DataType::Date32 | DataType::Timestamp(..))
}

/// INT, BIGINT or DECIMAL(digits, 0) for `-?digits`, by range; DOUBLE beyond 38 digits.
fn integer_type(text: &str) -> Option<DataType> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(if text.parse::<i32>().is_ok() {
        DataType::Int32
    } else if text.parse::<i64>().is_ok() {
        DataType::Int64
    } else {
        let significant = digits.trim_start_matches('0').len().max(1);
        match u8::try_from(significant) {
            Ok(p) if p <= MAX_DECIMAL_DIGITS => DataType::Decimal128(p, 0),
            _ => DataType::Float64,
        }
    })
}

/// A number written with a fraction or an exponent: `-?(d+.d*|.d+|d+)([eE][+-]?d+)?` with
/// a `.` or an exponent, finite.
fn is_fraction(text: &str) -> bool {
    let body = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (mantissa, None),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = all_digits(whole)
        && fraction.is_none_or(all_digits)
        && (whole.len() + fraction.map_or(0, str::len)) > 0;
    let exponent_ok = exponent.is_none_or(|e| {
        let d = e.strip_prefix(['+', '-']).unwrap_or(e);
        !d.is_empty() && all_digits(d)
    });
    mantissa_ok
        && exponent_ok
        && (fraction.is_some() || exponent.is_some())
        && text.parse::<f64>().is_ok_and(f64::is_finite)
}

/// `yyyy-MM-dd`, a date of the calendar.
fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
        && chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok()
}

/// `yyyy-MM-dd[T| ]HH:mm:ss[.f{1,9}][Z|±HH:mm|±HHmm]`, a real date and time.
fn is_timestamp(text: &str) -> bool {
    let b = text.as_bytes();
    if !text.is_ascii() || b.len() < 19 || !matches!(b[10], b'T' | b' ') {
        return false;
    }
    if !is_date(&text[..10]) {
        return false;
    }
    let time = &text[11..19];
    let shape_ok = time.bytes().enumerate().all(|(i, c)| {
        if i == 2 || i == 5 {
            c == b':'
        } else {
            c.is_ascii_digit()
        }
    });
    if !shape_ok {
        return false;
    }
    if chrono::NaiveTime::parse_from_str(time, "%H:%M:%S").is_err() {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(f) = rest.strip_prefix('.') {
        let n = f.bytes().take_while(u8::is_ascii_digit).count();
        if !(1..=9).contains(&n) {
            return false;
        }
        rest = &f[n..];
    }
    is_zone(rest)
}

/// Nothing, `Z`, `±HH:mm` or `±HHmm` (hours to 18, minutes to 59).
fn is_zone(text: &str) -> bool {
    if text.is_empty() || text == "Z" {
        return true;
    }
    let Some(offset) = text.strip_prefix(['+', '-']) else {
        return false;
    };
    let (h, m) = match offset.len() {
        5 if offset.as_bytes()[2] == b':' => (&offset[..2], &offset[3..]),
        4 => (&offset[..2], &offset[2..]),
        _ => return false,
    };
    let two = |s: &str| -> Option<u32> {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    matches!((two(h), two(m)), (Some(h), Some(m)) if h <= 18 && m <= 59)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;

    fn csv(text: &str) -> DataType {
        csv_type(text, Rules::default())
    }

    #[test]
    fn csv_integers_by_range() {
        assert_eq!(csv("0"), Int32);
        assert_eq!(csv("-2147483648"), Int32);
        assert_eq!(csv("2147483647"), Int32);
        assert_eq!(csv("2147483648"), Int64);
        assert_eq!(csv("-9223372036854775808"), Int64);
        assert_eq!(csv("9223372036854775808"), Decimal128(19, 0));
        assert_eq!(csv(&"9".repeat(38)), Decimal128(38, 0));
        assert_eq!(csv(&"9".repeat(39)), Float64);
        assert_eq!(csv("007"), Int32);
        assert_eq!(csv("+5"), Utf8);
        assert_eq!(csv("-"), Utf8);
    }

    #[test]
    fn csv_fractions_are_doubles() {
        for t in ["1.5", "-0.25", ".5", "5.", "1e3", "2.5E-3", "-1e+2"] {
            assert_eq!(csv(t), Float64, "{t}");
        }
        for t in [
            "1.2.3", "e3", "1e", ".", "-.", "1e400", "NaN", "1,5", "0x10",
        ] {
            assert_eq!(csv(t), Utf8, "{t}");
        }
    }

    #[test]
    fn csv_dates_and_timestamps() {
        let ts = timestamp_type();
        assert_eq!(csv("2024-01-31"), Date32);
        assert_eq!(csv("2024-02-30"), Utf8);
        assert_eq!(csv("2024-1-31"), Utf8);
        assert_eq!(csv("2024-01-01 10:00:00"), ts);
        assert_eq!(csv("2024-01-01T10:00:00"), ts);
        assert_eq!(csv("2024-01-01 10:00:00.123"), ts);
        assert_eq!(csv("2024-01-01T10:00:00.123456789"), ts);
        assert_eq!(csv("2024-01-01T10:00:00Z"), ts);
        assert_eq!(csv("2024-01-01T10:00:00.5+02:00"), ts);
        assert_eq!(csv("2024-01-01T10:00:00-0530"), ts);
        for t in [
            "2024-01-01 10:00",
            "2024-01-01 25:00:00",
            "2024-01-01T10:00:00.",
            "2024-01-01T10:00:00.1234567890",
            "2024-01-01T10:00:00+2",
            "2024-01-01T10:00:00 UTC",
            "2024-01-01X10:00:00",
            "2024-13-01 10:00:00",
        ] {
            assert_eq!(csv(t), Utf8, "{t}");
        }
    }

    #[test]
    fn csv_booleans_in_any_case() {
        assert_eq!(csv("true"), Boolean);
        assert_eq!(csv("FALSE"), Boolean);
        assert_eq!(csv("yes"), Utf8);
    }

    #[test]
    fn csv_without_column_types_is_text() {
        let off = Rules {
            column_types: false,
            ..Rules::default()
        };
        for t in ["1", "1.5", "2024-01-01", "2024-01-01 10:00:00", "true"] {
            assert_eq!(csv_type(t, off), Utf8, "{t}");
        }
    }

    #[test]
    fn json_values_keep_their_kinds() {
        let r = Rules::default();
        assert_eq!(json_type(&serde_json::json!(1), r), Some(Int64));
        assert_eq!(
            json_type(&serde_json::json!(u64::MAX), r),
            Some(Decimal128(20, 0))
        );
        assert_eq!(json_type(&serde_json::json!(1.5), r), Some(Float64));
        assert_eq!(json_type(&serde_json::json!(true), r), Some(Boolean));
        assert_eq!(json_type(&Value::Null, r), None);
        let ts = serde_json::json!("2024-01-01 10:00:00");
        assert_eq!(json_type(&ts, r), Some(Utf8));
        let on = Rules {
            json_timestamps: true,
            ..r
        };
        assert_eq!(json_type(&ts, on), Some(timestamp_type()));
        assert_eq!(json_type(&serde_json::json!("2024-01-01"), on), Some(Utf8));
    }

    #[test]
    fn widening() {
        let w = |a: DataType, b: DataType| widen(Some(a), Some(b)).unwrap();
        let ts = timestamp_type();
        assert_eq!(widen(None, Some(Int32)), Some(Int32));
        assert_eq!(widen(None, None), None);
        assert_eq!(w(Int32, Int64), Int64);
        assert_eq!(w(Int64, Int32), Int64);
        assert_eq!(w(Int32, Float64), Float64);
        assert_eq!(w(Float64, Int64), Float64);
        assert_eq!(w(Decimal128(25, 0), Float64), Float64);
        assert_eq!(w(Int64, Decimal128(19, 0)), Decimal128(20, 0));
        assert_eq!(w(Decimal128(30, 0), Int32), Decimal128(30, 0));
        assert_eq!(w(Date32, ts.clone()), ts);
        assert_eq!(w(ts.clone(), Date32), ts);
        assert_eq!(w(Int32, Utf8), Utf8);
        assert_eq!(w(Boolean, Int32), Utf8);
        assert_eq!(w(Date32, Int32), Utf8);
        assert_eq!(w(ts, Float64), Utf8);
    }
}
