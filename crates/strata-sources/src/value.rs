//! Watermark values: what the engine stores between runs (as JSON text) and gives back.

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime};
use serde_json::{json, Value as Json};

use crate::batch::digits;
use crate::error::{Result, SourceError};

/// One watermark column's value.
///
/// JSON form (see [`Watermark::to_json`]): `{"type":"int","value":42}`,
/// `{"type":"decimal","value":"-12.50"}`, `{"type":"float","value":1.5}`,
/// `{"type":"string","value":"abc"}`, `{"type":"bool","value":true}`,
/// `{"type":"date","value":"2024-01-31"}`,
/// `{"type":"timestamp","value":"2024-01-31T12:00:00.123456"}` (no time zone),
/// `{"type":"timestamptz","value":"2024-01-31T12:00:00.123456Z"}` (an instant, UTC).
#[derive(Clone, Debug, PartialEq)]
pub enum WatermarkValue {
    /// Integer columns (MySQL `bigint unsigned` values are decimals).
    Int(i64),
    /// Decimal: `unscaled * 10^-scale`.
    Decimal {
        /// The digits.
        unscaled: i128,
        /// Digits after the point.
        scale: i8,
    },
    /// Floating point (compared as the source compares them).
    Float(f64),
    /// Text (compared with the source's collation).
    Str(String),
    /// Boolean.
    Bool(bool),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since 1970-01-01, no time zone.
    Timestamp(i64),
    /// Microseconds since 1970-01-01 UTC.
    TimestampUtc(i64),
}

/// The watermark: the values of the watermark columns (compared as a tuple) of the last row
/// read, in column order. Store [`Watermark::to_json`] and give it back with
/// [`Watermark::from_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct Watermark {
    /// Watermark column names, in comparison order.
    pub columns: Vec<String>,
    /// One value per column (a lower bound may carry fewer: a prefix of the columns).
    pub values: Vec<WatermarkValue>,
}

/// Where an incremental read starts.
#[derive(Clone, Debug, PartialEq)]
pub struct LowerBound {
    /// The values to compare with (a prefix of the watermark columns).
    pub watermark: Watermark,
    /// `false`: rows strictly above (the normal incremental read); `true`: rows at or above
    /// (an overlap window; the engine de-duplicates).
    pub inclusive: bool,
}

impl LowerBound {
    /// Rows strictly above `w` (the next incremental read).
    pub fn after(w: Watermark) -> Self {
        LowerBound {
            watermark: w,
            inclusive: false,
        }
    }

    /// Rows at or above `w`.
    pub fn from(w: Watermark) -> Self {
        LowerBound {
            watermark: w,
            inclusive: true,
        }
    }
}

/// How far back an overlap window reaches from the stored watermark (on its first column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// For integer and decimal columns: subtract this number (in the column's units).
    Amount(i64),
    /// For timestamp and date columns: subtract this duration (dates: rounded up to whole
    /// days).
    Duration(std::time::Duration),
}

impl WatermarkValue {
    fn type_tag(&self) -> &'static str {
        match self {
            WatermarkValue::Int(_) => "int",
            WatermarkValue::Decimal { .. } => "decimal",
            WatermarkValue::Float(_) => "float",
            WatermarkValue::Str(_) => "string",
            WatermarkValue::Bool(_) => "bool",
            WatermarkValue::Date(_) => "date",
            WatermarkValue::Timestamp(_) => "timestamp",
            WatermarkValue::TimestampUtc(_) => "timestamptz",
        }
    }

    /// The value as SQL text both PostgreSQL and MySQL parse for the column's type
    /// (`2024-01-31 12:00:00.123456+00`, `-12.50`, ...).
    pub fn to_sql_text(&self) -> String {
        match self {
            WatermarkValue::Int(v) => v.to_string(),
            WatermarkValue::Decimal { unscaled, scale } => decimal_text(*unscaled, *scale),
            WatermarkValue::Float(v) => {
                if v.is_nan() {
                    "NaN".into()
                } else if v.is_infinite() {
                    if *v > 0.0 {
                        "Infinity".into()
                    } else {
                        "-Infinity".into()
                    }
                } else {
                    format!("{v:?}")
                }
            }
            WatermarkValue::Str(s) => s.clone(),
            WatermarkValue::Bool(b) => b.to_string(),
            WatermarkValue::Date(d) => date_text(*d),
            WatermarkValue::Timestamp(t) => micros_text(*t, ' '),
            WatermarkValue::TimestampUtc(t) => format!("{}+00", micros_text(*t, ' ')),
        }
    }

    fn to_json_value(&self) -> Json {
        let value = match self {
            WatermarkValue::Int(v) => json!(v),
            WatermarkValue::Float(v) if v.is_finite() => json!(v),
            WatermarkValue::Float(_) => json!(self.to_sql_text()),
            WatermarkValue::Bool(b) => json!(b),
            WatermarkValue::Timestamp(t) => json!(micros_text(*t, 'T')),
            WatermarkValue::TimestampUtc(t) => json!(format!("{}Z", micros_text(*t, 'T'))),
            other => json!(other.to_sql_text()),
        };
        json!({"type": self.type_tag(), "value": value})
    }

    fn from_json_value(v: &Json) -> std::result::Result<WatermarkValue, String> {
        let tag = v
            .get("type")
            .and_then(Json::as_str)
            .ok_or("a value without \"type\"")?;
        let value = v.get("value").ok_or("a value without \"value\"")?;
        let text = || {
            value
                .as_str()
                .ok_or_else(|| format!("{tag} value is not a string"))
        };
        Ok(match tag {
            "int" => {
                WatermarkValue::Int(value.as_i64().ok_or("int value is not a 64-bit integer")?)
            }
            "float" => WatermarkValue::Float(match value {
                Json::String(s) => s.parse::<f64>().map_err(|_| format!("bad float '{s}'"))?,
                v => v.as_f64().ok_or("float value is not a number")?,
            }),
            "bool" => WatermarkValue::Bool(value.as_bool().ok_or("bool value is not a boolean")?),
            "string" => WatermarkValue::Str(text()?.to_string()),
            "decimal" => {
                let (unscaled, scale) = parse_decimal(text()?)?;
                WatermarkValue::Decimal { unscaled, scale }
            }
            "date" => WatermarkValue::Date(parse_date(text()?)?),
            "timestamp" => WatermarkValue::Timestamp(parse_timestamp(text()?)?),
            "timestamptz" => WatermarkValue::TimestampUtc(parse_timestamptz(text()?)?),
            other => return Err(format!("unknown value type '{other}'")),
        })
    }

    /// This value moved back by an overlap amount.
    pub fn minus(&self, overlap: Overlap) -> Result<WatermarkValue> {
        let bad = |what: &str| SourceError::Watermark {
            detail: format!(
                "an overlap of {overlap:?} cannot be applied to a {} watermark ({what})",
                self.type_tag()
            ),
        };
        Ok(match (self, overlap) {
            (WatermarkValue::Int(v), Overlap::Amount(n)) => {
                WatermarkValue::Int(v.saturating_sub(n))
            }
            (WatermarkValue::Decimal { unscaled, scale }, Overlap::Amount(n)) => {
                let step = (n as i128)
                    .checked_mul(10i128.pow((*scale).max(0) as u32))
                    .ok_or_else(|| bad("too large"))?;
                WatermarkValue::Decimal {
                    unscaled: unscaled.checked_sub(step).ok_or_else(|| bad("too large"))?,
                    scale: *scale,
                }
            }
            (WatermarkValue::Float(v), Overlap::Amount(n)) => WatermarkValue::Float(v - n as f64),
            (WatermarkValue::Timestamp(t), Overlap::Duration(d)) => WatermarkValue::Timestamp(
                t.saturating_sub(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            ),
            (WatermarkValue::TimestampUtc(t), Overlap::Duration(d)) => {
                WatermarkValue::TimestampUtc(
                    t.saturating_sub(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
                )
            }
            (WatermarkValue::Date(days), Overlap::Duration(d)) => {
                let back = d.as_micros().div_ceil(DAY_MICROS as u128);
                WatermarkValue::Date(days.saturating_sub(i32::try_from(back).unwrap_or(i32::MAX)))
            }
            _ => {
                return Err(bad(
                    "use an amount for numbers, a duration for dates and timestamps",
                ))
            }
        })
    }
}

impl Watermark {
    /// The watermark of row `row` of `batch` (as a reader gave it), from its Arrow values of
    /// `columns`: the same values the reader reports for its last row
    /// ([`crate::WatermarkReader::max_watermark`]) for every column type a watermark may
    /// have. `None` when a column is missing, NULL, or of a type a watermark does not take.
    pub fn from_row(
        columns: &[String],
        batch: &arrow_array::RecordBatch,
        row: usize,
    ) -> Option<Watermark> {
        let values = columns
            .iter()
            .map(|c| value_at(batch.column_by_name(c)?.as_ref(), row))
            .collect::<Option<Vec<_>>>()?;
        Some(Watermark {
            columns: columns.to_vec(),
            values,
        })
    }

    /// The JSON text to store: `{"columns":[...],"values":[{"type":..,"value":..},...]}`.
    pub fn to_json(&self) -> String {
        json!({
            "columns": self.columns,
            "values": self.values.iter().map(WatermarkValue::to_json_value).collect::<Vec<_>>(),
        })
        .to_string()
    }

    /// Parse what [`Watermark::to_json`] wrote.
    pub fn from_json(text: &str) -> Result<Watermark> {
        let err = |detail: String| {
            SourceError::Watermark {
            detail: format!(
                "stored watermark {text:?} cannot be read: {detail}; run a full refresh to start over"
            ),
        }
        };
        let v: Json = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let columns = v
            .get("columns")
            .and_then(Json::as_array)
            .ok_or_else(|| err("no \"columns\" list".into()))?
            .iter()
            .map(|c| {
                c.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err("a column name is not a string".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let values = v
            .get("values")
            .and_then(Json::as_array)
            .ok_or_else(|| err("no \"values\" list".into()))?
            .iter()
            .map(|x| WatermarkValue::from_json_value(x).map_err(err))
            .collect::<Result<Vec<_>>>()?;
        if values.len() > columns.len() || values.is_empty() {
            return Err(err(format!(
                "{} values for {} columns",
                values.len(),
                columns.len()
            )));
        }
        Ok(Watermark { columns, values })
    }

    /// An inclusive lower bound `overlap` back from this watermark, on its first column only
    /// (rows with an equal first column and any later columns are read again). The engine
    /// de-duplicates what it reads twice.
    pub fn overlap(&self, overlap: Overlap) -> Result<LowerBound> {
        let first = self.values.first().ok_or_else(|| SourceError::Watermark {
            detail: "an empty watermark has no overlap".into(),
        })?;
        Ok(LowerBound::from(Watermark {
            columns: self.columns.clone(),
            values: vec![first.minus(overlap)?],
        }))
    }
}

pub(crate) fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        let mut s = unscaled.to_string();
        if unscaled != 0 {
            s.extend(std::iter::repeat_n('0', (-scale) as usize));
        }
        return s;
    }
    let neg = unscaled < 0;
    let mut digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    if digits.len() <= scale {
        digits = format!("{}{}", "0".repeat(scale + 1 - digits.len()), digits);
    }
    let (int, frac) = digits.split_at(digits.len() - scale);
    format!("{}{int}.{frac}", if neg { "-" } else { "" })
}

/// Parse `-12.50` / `1e3`-free decimal text into (unscaled, scale).
pub(crate) fn parse_decimal(s: &str) -> std::result::Result<(i128, i8), String> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!("'{s}' is not a decimal number"));
    }
    if frac.len() > 38 {
        return Err(format!("'{s}' has more than 38 decimals"));
    }
    let all = format!("{int}{frac}");
    let all = all.trim_start_matches('0');
    let v: i128 = if all.is_empty() {
        0
    } else {
        all.parse()
            .map_err(|_| format!("'{s}' has more than 38 digits"))?
    };
    if digits(v) > 38 {
        return Err(format!("'{s}' has more than 38 digits"));
    }
    Ok((if neg { -v } else { v }, frac.len() as i8))
}

fn date_text(days: i32) -> String {
    match NaiveDate::from_num_days_from_ce_opt(days.saturating_add(719_163)) {
        Some(d) => d.format("%Y-%m-%d").to_string(),
        None => days.to_string(),
    }
}

fn micros_text(t: i64, sep: char) -> String {
    match DateTime::from_timestamp_micros(t) {
        Some(dt) => dt
            .naive_utc()
            .format(&format!("%Y-%m-%d{sep}%H:%M:%S%.6f"))
            .to_string(),
        None => t.to_string(),
    }
}

pub(crate) fn parse_date(s: &str) -> std::result::Result<i32, String> {
    let d = NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d")
        .map_err(|e| format!("bad date '{s}': {e}"))?;
    Ok(d.num_days_from_ce() - 719_163)
}

pub(crate) fn parse_timestamp(s: &str) -> std::result::Result<i64, String> {
    let t = s.trim();
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"] {
        if let Ok(dt) = NaiveDateTime::parse_from_str(t, fmt) {
            return Ok(dt.and_utc().timestamp_micros());
        }
    }
    Err(format!(
        "bad timestamp '{s}' (expected YYYY-MM-DDTHH:MM:SS[.ffffff])"
    ))
}

/// An instant with an offset (`Z`, `+02:00`, `+0200`, `+02`) into UTC microseconds.
pub(crate) fn parse_timestamptz(s: &str) -> std::result::Result<i64, String> {
    let t = s.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(t) {
        return Ok(dt.timestamp_micros());
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z"] {
        if let Ok(dt) = DateTime::parse_from_str(t, fmt) {
            return Ok(dt.timestamp_micros());
        }
    }
    if let Some(naive) = t.strip_suffix('Z') {
        return parse_timestamp(naive);
    }
    Err(format!(
        "bad timestamp with time zone '{s}' (expected RFC 3339, e.g. 2024-01-31T12:00:00.5Z)"
    ))
}

/// One day in microseconds.
pub(crate) const DAY_MICROS: i64 = 86_400_000_000;

/// One Arrow value as a watermark value (`None`: NULL, out of range, or a type a
/// watermark does not take).
fn value_at(array: &dyn arrow_array::Array, row: usize) -> Option<WatermarkValue> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    use arrow_schema::{DataType, TimeUnit};
    if row >= array.len() || array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Boolean => WatermarkValue::Bool(array.as_boolean().value(row)),
        DataType::Int8 => WatermarkValue::Int(array.as_primitive::<Int8Type>().value(row).into()),
        DataType::Int16 => WatermarkValue::Int(array.as_primitive::<Int16Type>().value(row).into()),
        DataType::Int32 => WatermarkValue::Int(array.as_primitive::<Int32Type>().value(row).into()),
        DataType::Int64 => WatermarkValue::Int(array.as_primitive::<Int64Type>().value(row)),
        DataType::Float32 => {
            WatermarkValue::Float(array.as_primitive::<Float32Type>().value(row).into())
        }
        DataType::Float64 => WatermarkValue::Float(array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(_, scale) => WatermarkValue::Decimal {
            unscaled: array.as_primitive::<Decimal128Type>().value(row),
            scale: *scale,
        },
        DataType::Utf8 => WatermarkValue::Str(array.as_string::<i32>().value(row).to_string()),
        DataType::Date32 => WatermarkValue::Date(array.as_primitive::<Date32Type>().value(row)),
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(row);
            match zone {
                Some(_) => WatermarkValue::TimestampUtc(micros),
                None => WatermarkValue::Timestamp(micros),
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_every_type() {
        let w = Watermark {
            columns: (0..9).map(|i| format!("c{i}")).collect(),
            values: vec![
                WatermarkValue::Int(i64::MIN),
                WatermarkValue::Decimal {
                    unscaled: -1250,
                    scale: 2,
                },
                WatermarkValue::Decimal {
                    unscaled: 18_446_744_073_709_551_615,
                    scale: 0,
                },
                WatermarkValue::Float(0.1),
                WatermarkValue::Str("naïve \"quoted\"".into()),
                WatermarkValue::Date(-719_162),
                WatermarkValue::Timestamp(1_706_702_400_123_456),
                WatermarkValue::TimestampUtc(-1),
                WatermarkValue::Bool(true),
            ],
        };
        let text = w.to_json();
        assert!(text.contains(r#""value":"-12.50""#), "{text}");
        assert!(
            text.contains(r#""value":"2024-01-31T12:00:00.123456""#),
            "{text}"
        );
        assert!(
            text.contains(r#""value":"1969-12-31T23:59:59.999999Z""#),
            "{text}"
        );
        assert_eq!(Watermark::from_json(&text).unwrap(), w);
    }

    #[test]
    fn sql_text() {
        assert_eq!(
            WatermarkValue::Decimal {
                unscaled: 5,
                scale: 3
            }
            .to_sql_text(),
            "0.005"
        );
        assert_eq!(
            WatermarkValue::Decimal {
                unscaled: -5,
                scale: 3
            }
            .to_sql_text(),
            "-0.005"
        );
        assert_eq!(
            WatermarkValue::Decimal {
                unscaled: 5,
                scale: 0
            }
            .to_sql_text(),
            "5"
        );
        assert_eq!(
            WatermarkValue::TimestampUtc(0).to_sql_text(),
            "1970-01-01 00:00:00.000000+00"
        );
        assert_eq!(WatermarkValue::Date(0).to_sql_text(), "1970-01-01");
        assert_eq!(WatermarkValue::Float(1e300).to_sql_text(), "1e300");
    }

    #[test]
    fn bad_json_says_full_refresh() {
        for bad in [
            "",
            "{}",
            r#"{"columns":["a"],"values":[{"type":"wat","value":1}]}"#,
            r#"{"columns":["a"],"values":[]}"#,
        ] {
            let e = Watermark::from_json(bad).unwrap_err().to_string();
            assert!(e.contains("full refresh"), "{e}");
        }
    }

    #[test]
    fn overlaps() {
        let w = Watermark {
            columns: vec!["ts".into(), "id".into()],
            values: vec![
                WatermarkValue::TimestampUtc(10 * DAY_MICROS),
                WatermarkValue::Int(7),
            ],
        };
        let lb = w
            .overlap(Overlap::Duration(std::time::Duration::from_secs(3600)))
            .unwrap();
        assert!(lb.inclusive);
        assert_eq!(
            lb.watermark.values,
            vec![WatermarkValue::TimestampUtc(
                10 * DAY_MICROS - 3_600_000_000
            )]
        );
        let d = WatermarkValue::Date(100)
            .minus(Overlap::Duration(std::time::Duration::from_secs(86_401)))
            .unwrap();
        assert_eq!(d, WatermarkValue::Date(98));
        let d = WatermarkValue::Decimal {
            unscaled: 1000,
            scale: 2,
        }
        .minus(Overlap::Amount(3))
        .unwrap();
        assert_eq!(
            d,
            WatermarkValue::Decimal {
                unscaled: 700,
                scale: 2
            }
        );
        assert!(WatermarkValue::Str("a".into())
            .minus(Overlap::Amount(1))
            .is_err());
    }

    #[test]
    fn decimal_parsing() {
        assert_eq!(parse_decimal("-12.50").unwrap(), (-1250, 2));
        assert_eq!(parse_decimal("0.000").unwrap(), (0, 3));
        assert_eq!(
            parse_decimal("18446744073709551615").unwrap(),
            (18_446_744_073_709_551_615, 0)
        );
        assert!(parse_decimal("1e3").is_err());
        assert!(parse_decimal("").is_err());
        assert!(parse_decimal(".").is_err());
        assert!(parse_decimal(&"9".repeat(39)).is_err());
    }

    #[test]
    fn timestamptz_parsing() {
        assert_eq!(parse_timestamptz("1970-01-01T01:00:00+01:00").unwrap(), 0);
        assert_eq!(
            parse_timestamptz("1970-01-01 00:00:00.5+00").unwrap(),
            500_000
        );
        assert_eq!(
            parse_timestamptz("1970-01-01T00:00:01Z").unwrap(),
            1_000_000
        );
    }

    #[test]
    fn a_rows_watermark_from_its_arrow_values() {
        use arrow_array::{
            ArrayRef, Date32Array, Decimal128Array, Int32Array, RecordBatch, StringArray,
            TimestampMicrosecondArray,
        };
        use std::sync::Arc;
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("n", Arc::new(Int32Array::from(vec![Some(7), None]))),
            (
                "amount",
                Arc::new(
                    Decimal128Array::from(vec![-1250, 1])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ),
            ("name", Arc::new(StringArray::from(vec!["a", "b"]))),
            ("day", Arc::new(Date32Array::from(vec![19753, 0]))),
            (
                "at",
                Arc::new(TimestampMicrosecondArray::from(vec![5, 6]).with_timezone("UTC")),
            ),
            (
                "local",
                Arc::new(TimestampMicrosecondArray::from(vec![8, 9])),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let names: Vec<String> = ["n", "amount", "name", "day", "at", "local"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let w = Watermark::from_row(&names, &batch, 0).unwrap();
        assert_eq!(
            w.values,
            vec![
                WatermarkValue::Int(7),
                WatermarkValue::Decimal {
                    unscaled: -1250,
                    scale: 2
                },
                WatermarkValue::Str("a".into()),
                WatermarkValue::Date(19753),
                WatermarkValue::TimestampUtc(5),
                WatermarkValue::Timestamp(8),
            ]
        );
        assert_eq!(w.columns, names);
        // A NULL value, a missing column, a row past the end: none.
        assert_eq!(Watermark::from_row(&names, &batch, 1), None);
        assert_eq!(Watermark::from_row(&["x".to_string()], &batch, 0), None);
        assert_eq!(Watermark::from_row(&names[1..], &batch, 2), None);
    }
}
