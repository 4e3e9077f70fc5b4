//! PostgreSQL types: which Arrow type each maps to, and decoding of the binary wire format
//! (query results in binary, and pgoutput with `binary 'true'`) straight into Arrow builders.
//! One-dimensional arrays of a mapped type are Delta ARRAYs, composite types STRUCTs.

use std::error::Error as StdError;

use tokio_postgres::types::{FromSql, Kind, Type};

use crate::batch::{fits_precision, ColBuilder, ColumnKind, StructField, POW10};
use crate::value::WatermarkValue;

/// How to decode one column's binary value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PgDecode {
    Bool,
    Int2,
    Int4,
    Int8,
    Oid,
    Float4,
    Float8,
    /// numeric into Decimal128 at this precision/scale (scale >= 0).
    Numeric {
        precision: u8,
        scale: i8,
    },
    /// text-like: UTF-8 bytes as sent (text, varchar, bpchar, name, enum labels, json, xml).
    Text,
    /// "char": one byte.
    Char,
    /// jsonb: a version byte (1) then the text.
    Jsonb,
    Uuid,
    Bytea,
    Date,
    Timestamp,
    TimestampTz,
    /// A one-dimensional array of the element's decode.
    Array(Box<PgDecode>),
    /// A composite (row) type: its fields' decodes in order.
    Composite(Vec<PgDecode>),
}

/// A mapped column type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PgMapped {
    pub decode: PgDecode,
    pub kind: ColumnKind,
    /// `format_type`-like name for messages and `source_type`.
    pub type_name: String,
}

/// `numeric` without a declared precision is read as DECIMAL(38,18); values needing more
/// integer digits (above 20) or more than 18 decimals are an error naming the column.
pub const UNCONSTRAINED_NUMERIC: (u8, i8) = (38, 18);

pub(crate) const PG_EPOCH_DAYS: i32 = 10_957; // 2000-01-01 - 1970-01-01
pub(crate) const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

fn numeric_typmod(typmod: i32) -> Option<(i32, i32)> {
    if typmod < 4 {
        return None;
    }
    let t = typmod - 4;
    let precision = (t >> 16) & 0xffff;
    // PostgreSQL 15+ allows negative scales (stored as 11-bit two's complement).
    let scale = ((t & 0x7ff) ^ 1024) - 1024;
    Some((precision, scale))
}

/// Map a built-in type by OID. `Err(why)` for types strata cannot read; `None` for OIDs that
/// are not built in (look them up in the catalog: enums and domains are readable).
pub(crate) fn map_builtin(oid: u32, typmod: i32) -> Option<Result<PgMapped, (String, String)>> {
    let ty = Type::from_oid(oid)?;
    let ok = |decode, kind, name: &str| {
        Some(Ok(PgMapped {
            decode,
            kind,
            type_name: name.to_string(),
        }))
    };
    let unsupported = |why: &str| Some(Err((ty.name().to_string(), why.to_string())));
    match ty {
        Type::BOOL => ok(PgDecode::Bool, ColumnKind::Boolean, "boolean"),
        Type::INT2 => ok(PgDecode::Int2, ColumnKind::Int16, "smallint"),
        Type::INT4 => ok(PgDecode::Int4, ColumnKind::Int32, "integer"),
        Type::INT8 => ok(PgDecode::Int8, ColumnKind::Int64, "bigint"),
        Type::OID => ok(PgDecode::Oid, ColumnKind::Int64, "oid"),
        Type::FLOAT4 => ok(PgDecode::Float4, ColumnKind::Float32, "real"),
        Type::FLOAT8 => ok(PgDecode::Float8, ColumnKind::Float64, "double precision"),
        Type::NUMERIC => match numeric_typmod(typmod) {
            None => {
                let (p, s) = UNCONSTRAINED_NUMERIC;
                ok(
                    PgDecode::Numeric {
                        precision: p,
                        scale: s,
                    },
                    ColumnKind::Decimal {
                        precision: p,
                        scale: s,
                    },
                    "numeric",
                )
            }
            Some((p, s)) => {
                let name = format!("numeric({p},{s})");
                // A negative scale rounds to tens, hundreds...: read as an integer decimal.
                let (p2, s2) = if s < 0 { (p - s, 0) } else { (p, s) };
                if !(1..=38).contains(&p2) {
                    return Some(Err((name, "Delta decimals have at most 38 digits".into())));
                }
                let (p2, s2) = (p2 as u8, s2 as i8);
                Some(Ok(PgMapped {
                    decode: PgDecode::Numeric {
                        precision: p2,
                        scale: s2,
                    },
                    kind: ColumnKind::Decimal {
                        precision: p2,
                        scale: s2,
                    },
                    type_name: name,
                }))
            }
        },
        Type::TEXT => ok(PgDecode::Text, ColumnKind::Utf8, "text"),
        Type::VARCHAR => ok(PgDecode::Text, ColumnKind::Utf8, "character varying"),
        Type::BPCHAR => ok(PgDecode::Text, ColumnKind::Utf8, "character"),
        Type::NAME => ok(PgDecode::Text, ColumnKind::Utf8, "name"),
        Type::CHAR => ok(PgDecode::Char, ColumnKind::Utf8, "\"char\""),
        Type::JSON => ok(PgDecode::Text, ColumnKind::Utf8, "json"),
        Type::JSONB => ok(PgDecode::Jsonb, ColumnKind::Utf8, "jsonb"),
        Type::XML => ok(PgDecode::Text, ColumnKind::Utf8, "xml"),
        Type::UUID => ok(PgDecode::Uuid, ColumnKind::Utf8, "uuid"),
        Type::BYTEA => ok(PgDecode::Bytea, ColumnKind::Binary, "bytea"),
        Type::DATE => ok(PgDecode::Date, ColumnKind::Date, "date"),
        Type::TIMESTAMP => ok(
            PgDecode::Timestamp,
            ColumnKind::Timestamp,
            "timestamp without time zone",
        ),
        Type::TIMESTAMPTZ => ok(
            PgDecode::TimestampTz,
            ColumnKind::TimestampUtc,
            "timestamp with time zone",
        ),
        Type::TIME | Type::TIMETZ => unsupported("Delta has no time-of-day type"),
        Type::INTERVAL => unsupported("Delta has no interval type"),
        Type::MONEY => unsupported("its binary form depends on lc_monetary; cast it to numeric"),
        _ => match ty.kind() {
            Kind::Array(element) => Some(map_builtin(element.oid(), typmod)?.map(array_of)),
            Kind::Range(_) | Kind::Multirange(_) => unsupported("ranges are not mapped"),
            _ => unsupported("no Delta mapping for this type"),
        },
    }
}

/// Map a type tokio-postgres described (result columns of a prepared statement: domains are
/// already their base type there; enums carry their labels).
pub(crate) fn map_type(ty: &Type, typmod: i32) -> Result<PgMapped, (String, String)> {
    if let Some(m) = map_builtin(ty.oid(), typmod) {
        return m;
    }
    match ty.kind() {
        Kind::Enum(_) => Ok(PgMapped {
            decode: PgDecode::Text,
            kind: ColumnKind::Utf8,
            type_name: ty.name().to_string(),
        }),
        Kind::Domain(base) => map_type(base, -1),
        Kind::Array(element) => map_type(element, typmod).map(array_of),
        Kind::Composite(fields) => composite_of(
            ty.name(),
            fields
                .iter()
                .map(|f| Ok((f.name().to_string(), map_type(f.type_(), -1)?)))
                .collect::<Result<Vec<_>, (String, String)>>()?,
        ),
        _ => Err((
            ty.name().to_string(),
            "no Delta mapping for this type".into(),
        )),
    }
}

/// The ARRAY of a mapped element type.
pub(crate) fn array_of(element: PgMapped) -> PgMapped {
    PgMapped {
        decode: PgDecode::Array(Box::new(element.decode)),
        kind: ColumnKind::Array(Box::new(element.kind)),
        type_name: format!("{}[]", element.type_name),
    }
}

/// The STRUCT of a composite type `name` of mapped `fields` (name, mapping) in order.
pub(crate) fn composite_of(
    name: &str,
    fields: Vec<(String, PgMapped)>,
) -> Result<PgMapped, (String, String)> {
    if fields.is_empty() {
        return Err((name.to_string(), "a composite type without fields".into()));
    }
    let decode = PgDecode::Composite(fields.iter().map(|(_, m)| m.decode.clone()).collect());
    let kind = ColumnKind::Struct(
        fields
            .into_iter()
            .map(|(name, m)| StructField {
                name,
                kind: m.kind,
                nullable: true,
            })
            .collect(),
    );
    Ok(PgMapped {
        decode,
        kind,
        type_name: name.to_string(),
    })
}

/// The raw bytes of a result value, whatever its type.
pub(crate) struct Raw<'a>(pub &'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Raw(raw))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

fn be<const N: usize>(raw: &[u8]) -> Result<[u8; N], String> {
    raw.try_into()
        .map_err(|_| format!("expected {N} bytes in the binary value, got {}", raw.len()))
}

fn utf8(raw: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(raw).map_err(|e| format!("value is not valid UTF-8 ({e})"))
}

pub(crate) fn date_days(raw: &[u8]) -> Result<i32, String> {
    let d = i32::from_be_bytes(be::<4>(raw)?);
    if d == i32::MAX || d == i32::MIN {
        return Err(format!(
            "date {} has no Delta equivalent; filter it out or cast it in a query",
            if d > 0 { "infinity" } else { "-infinity" }
        ));
    }
    d.checked_add(PG_EPOCH_DAYS)
        .ok_or_else(|| "date out of range".to_string())
}

pub(crate) fn timestamp_micros(raw: &[u8]) -> Result<i64, String> {
    let t = i64::from_be_bytes(be::<8>(raw)?);
    if t == i64::MAX || t == i64::MIN {
        return Err(format!(
            "timestamp {} has no Delta equivalent; filter it out or cast it in a query",
            if t > 0 { "infinity" } else { "-infinity" }
        ));
    }
    t.checked_add(PG_EPOCH_MICROS)
        .ok_or_else(|| "timestamp out of range".to_string())
}

/// A binary uuid in its canonical text form (`8-4-4-4-12` lower-case hex digits), written
/// into `out`.
fn uuid_chars(raw: &[u8], out: &mut [u8; 36]) -> Result<(), String> {
    /// Each byte's two hex digits.
    const HEX2: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [HEX[i >> 4], HEX[i & 0xf]];
            i += 1;
        }
        t
    };
    /// Where each byte's digits go: after the dashes at 8, 13, 18 and 23.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let b = be::<16>(raw)?;
    for (byte, at) in b.iter().zip(AT) {
        out[at..at + 2].copy_from_slice(&HEX2[*byte as usize]);
    }
    for at in [8, 13, 18, 23] {
        out[at] = b'-';
    }
    Ok(())
}

pub(crate) fn uuid_text(raw: &[u8]) -> Result<String, String> {
    let mut out = [0u8; 36];
    uuid_chars(raw, &mut out)?;
    Ok(out.iter().map(|&c| c as char).collect())
}

/// Decode a binary NUMERIC exactly into an unscaled i128 at `scale`. NaN, infinities, values
/// with more decimals than `scale` (non-zero ones) and overflow are errors.
pub(crate) fn numeric_to_i128(raw: &[u8], scale: i8) -> Result<i128, String> {
    if raw.len() < 8 {
        return Err("truncated numeric".into());
    }
    let ndigits = i16::from_be_bytes([raw[0], raw[1]]);
    let weight = i16::from_be_bytes([raw[2], raw[3]]) as i32;
    let sign = u16::from_be_bytes([raw[4], raw[5]]);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Err("numeric value NaN has no Delta equivalent; filter it out (WHERE col <> 'NaN') or cast it".into()),
        0xD000 => return Err("numeric value Infinity has no Delta equivalent; filter it out or cast it".into()),
        0xF000 => return Err("numeric value -Infinity has no Delta equivalent; filter it out or cast it".into()),
        s => return Err(format!("numeric with unknown sign word {s:#x}")),
    }
    if ndigits < 0 || raw.len() != 8 + 2 * ndigits as usize {
        return Err("malformed numeric".into());
    }
    let overflow = || format!("numeric value does not fit DECIMAL(38,{scale})");
    let scale = scale as i32;
    let mut acc: i128 = 0;
    for i in 0..ndigits as usize {
        let d = u16::from_be_bytes([raw[8 + 2 * i], raw[9 + 2 * i]]) as u32;
        if d >= 10_000 {
            return Err("malformed numeric digit".into());
        }
        // This group is worth d * 10000^(weight - i); at our scale: d * 10^(4*(weight-i) + scale).
        let exp = 4 * (weight - i as i32) + scale;
        if exp >= 0 {
            let m = *POW10.get(exp as usize).ok_or_else(overflow)?;
            let term = (d as i128).checked_mul(m).ok_or_else(overflow)?;
            acc = acc.checked_add(term).ok_or_else(overflow)?;
        } else if -exp > 4 {
            if d != 0 {
                return Err(too_many_decimals(scale));
            }
        } else {
            // A group of four digits, `-exp` of them below the scale: small numbers.
            let div = 10u32.pow((-exp) as u32);
            if !d.is_multiple_of(div) {
                return Err(too_many_decimals(scale));
            }
            acc = acc.checked_add((d / div) as i128).ok_or_else(overflow)?;
        }
    }
    Ok(if sign == 0x4000 { -acc } else { acc })
}

fn too_many_decimals(scale: i32) -> String {
    format!(
        "numeric value has more than {scale} decimal digits, which its DECIMAL column cannot hold \
         exactly; declare the column numeric(p,s) or read it through a query with a cast"
    )
}

/// Append one binary value (`None` = SQL NULL) to a builder made for the decode's kind.
pub(crate) fn append_binary(
    b: &mut ColBuilder,
    decode: &PgDecode,
    raw: Option<&[u8]>,
) -> Result<(), String> {
    let Some(raw) = raw else {
        b.append_null();
        return Ok(());
    };
    match (decode, b) {
        (PgDecode::Array(element), ColBuilder::Array(a)) => {
            for value in array_elements(raw)? {
                append_binary(&mut a.elements, element, value)?;
            }
            a.end_value()?;
        }
        (PgDecode::Composite(fields), ColBuilder::Struct(s)) => {
            let values = record_fields(raw)?;
            if values.len() != fields.len() {
                return Err(format!(
                    "a composite value has {} field(s) where its type has {}",
                    values.len(),
                    fields.len()
                ));
            }
            for ((decode, (_, b)), value) in fields.iter().zip(s.fields.iter_mut()).zip(values) {
                append_binary(b, decode, value)?;
            }
            s.end_value();
        }
        (PgDecode::Bool, ColBuilder::Bool(b)) => b.append_value(be::<1>(raw)?[0] != 0),
        (PgDecode::Int2, ColBuilder::I16(b)) => b.append_value(i16::from_be_bytes(be(raw)?)),
        (PgDecode::Int4, ColBuilder::I32(b)) => b.append_value(i32::from_be_bytes(be(raw)?)),
        (PgDecode::Int8, ColBuilder::I64(b)) => b.append_value(i64::from_be_bytes(be(raw)?)),
        (PgDecode::Oid, ColBuilder::I64(b)) => b.append_value(u32::from_be_bytes(be(raw)?) as i64),
        (PgDecode::Float4, ColBuilder::F32(b)) => b.append_value(f32::from_be_bytes(be(raw)?)),
        (PgDecode::Float8, ColBuilder::F64(b)) => b.append_value(f64::from_be_bytes(be(raw)?)),
        (&PgDecode::Numeric { precision, scale }, ColBuilder::Dec(b, ..)) => {
            let v = numeric_to_i128(raw, scale)?;
            if !fits_precision(v, precision) {
                return Err(format!(
                    "numeric value does not fit DECIMAL({precision},{scale}) (too many digits); \
                     declare the column numeric(p,s) or read it through a query with a cast"
                ));
            }
            b.append_value(v)
        }
        // Text is checked as UTF-8 when the batch's column is finished (`ColBuilder::finish`).
        (PgDecode::Text, ColBuilder::Str(b)) => b.append_value(raw),
        (PgDecode::Char, ColBuilder::Str(b)) => {
            b.append_value(String::from_utf8_lossy(raw).as_bytes())
        }
        (PgDecode::Jsonb, ColBuilder::Str(b)) => match raw.split_first() {
            Some((1, text)) => b.append_value(text),
            _ => return Err("unknown jsonb binary version".into()),
        },
        (PgDecode::Uuid, ColBuilder::Str(b)) => {
            let mut out = [0u8; 36];
            uuid_chars(raw, &mut out)?;
            b.append_value(out)
        }
        (PgDecode::Bytea, ColBuilder::Bin(b)) => b.append_value(raw),
        (PgDecode::Date, ColBuilder::Date(b)) => b.append_value(date_days(raw)?),
        (PgDecode::Timestamp, ColBuilder::Ts(b))
        | (PgDecode::TimestampTz, ColBuilder::TsUtc(b)) => b.append_value(timestamp_micros(raw)?),
        (d, _) => {
            return Err(format!(
                "internal: decoder {d:?} does not match the column's builder"
            ))
        }
    }
    Ok(())
}

/// One binary value as a watermark value (`Ok(None)` for NULL).
pub(crate) fn watermark_value(
    decode: &PgDecode,
    raw: Option<&[u8]>,
) -> Result<Option<WatermarkValue>, String> {
    let Some(raw) = raw else { return Ok(None) };
    Ok(Some(match *decode {
        PgDecode::Bool => WatermarkValue::Bool(be::<1>(raw)?[0] != 0),
        PgDecode::Int2 => WatermarkValue::Int(i16::from_be_bytes(be(raw)?) as i64),
        PgDecode::Int4 => WatermarkValue::Int(i32::from_be_bytes(be(raw)?) as i64),
        PgDecode::Int8 => WatermarkValue::Int(i64::from_be_bytes(be(raw)?)),
        PgDecode::Oid => WatermarkValue::Int(u32::from_be_bytes(be(raw)?) as i64),
        PgDecode::Float4 => WatermarkValue::Float(f32::from_be_bytes(be(raw)?) as f64),
        PgDecode::Float8 => WatermarkValue::Float(f64::from_be_bytes(be(raw)?)),
        PgDecode::Numeric { scale, .. } => WatermarkValue::Decimal {
            unscaled: numeric_to_i128(raw, scale)?,
            scale,
        },
        PgDecode::Text => WatermarkValue::Str(utf8(raw)?.to_string()),
        PgDecode::Char => WatermarkValue::Str(String::from_utf8_lossy(raw).into_owned()),
        PgDecode::Jsonb => return Err("a jsonb column cannot be a watermark".into()),
        PgDecode::Uuid => WatermarkValue::Str(uuid_text(raw)?),
        PgDecode::Bytea => return Err("a bytea column cannot be a watermark".into()),
        PgDecode::Date => WatermarkValue::Date(date_days(raw)?),
        PgDecode::Timestamp => WatermarkValue::Timestamp(timestamp_micros(raw)?),
        PgDecode::TimestampTz => WatermarkValue::TimestampUtc(timestamp_micros(raw)?),
        PgDecode::Array(_) | PgDecode::Composite(_) => {
            return Err("an array or composite column cannot be a watermark".into())
        }
    }))
}

/// Reads a 4-byte big-endian integer at `*at`, moving past it.
fn take_i32(raw: &[u8], at: &mut usize) -> Result<i32, String> {
    let bytes = raw
        .get(*at..*at + 4)
        .ok_or_else(|| "truncated binary value".to_string())?;
    *at += 4;
    Ok(i32::from_be_bytes(bytes.try_into().expect("4 bytes")))
}

/// A length-prefixed value at `*at` (length -1: NULL), moving past it.
fn take_value<'a>(raw: &'a [u8], at: &mut usize) -> Result<Option<&'a [u8]>, String> {
    let len = take_i32(raw, at)?;
    if len < 0 {
        return Ok(None);
    }
    let value = raw
        .get(*at..*at + len as usize)
        .ok_or_else(|| "truncated binary value".to_string())?;
    *at += len as usize;
    Ok(Some(value))
}

/// The elements of a binary array (`array_send`): dimensions, a NULL flag, the element
/// type, each dimension's size and lower bound, then each element length-prefixed. An
/// empty array has no dimension; more than one is refused (Delta's ARRAY is a list).
fn array_elements(raw: &[u8]) -> Result<Vec<Option<&[u8]>>, String> {
    let mut at = 0;
    let dims = take_i32(raw, &mut at)?;
    let _has_nulls = take_i32(raw, &mut at)?;
    let _element_type = take_i32(raw, &mut at)?;
    match dims {
        0 => return Ok(Vec::new()),
        1 => {}
        n => {
            return Err(format!(
                "a {n}-dimensional array has no Delta type (ARRAY is one-dimensional); \
                 unnest it or cast it to text in a query"
            ))
        }
    }
    let size = take_i32(raw, &mut at)?;
    let _lower_bound = take_i32(raw, &mut at)?;
    (0..size.max(0)).map(|_| take_value(raw, &mut at)).collect()
}

/// The fields of a binary composite value (`record_send`): their count, then each one's
/// type and length-prefixed value.
fn record_fields(raw: &[u8]) -> Result<Vec<Option<&[u8]>>, String> {
    let mut at = 0;
    let count = take_i32(raw, &mut at)?;
    (0..count.max(0))
        .map(|_| {
            let _field_type = take_i32(raw, &mut at)?;
            take_value(raw, &mut at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend((digits.len() as i16).to_be_bytes());
        v.extend(weight.to_be_bytes());
        v.extend(sign.to_be_bytes());
        v.extend(dscale.to_be_bytes());
        for d in digits {
            v.extend(d.to_be_bytes());
        }
        v
    }

    #[test]
    fn numeric_decoding() {
        // 12345.67 = [1, 2345, 6700] weight 1
        let raw = numeric(1, 0, 2, &[1, 2345, 6700]);
        assert_eq!(numeric_to_i128(&raw, 2).unwrap(), 1_234_567);
        assert_eq!(numeric_to_i128(&raw, 4).unwrap(), 123_456_700);
        assert!(numeric_to_i128(&raw, 1).is_err());
        // -0.0001
        let raw = numeric(-1, 0x4000, 4, &[1]);
        assert_eq!(numeric_to_i128(&raw, 4).unwrap(), -1);
        assert_eq!(numeric_to_i128(&raw, 18).unwrap(), -100_000_000_000_000);
        // 1.5 at scale 1 (a group cut by the scale); 0.00001 at scale 4 (a group below it)
        assert_eq!(
            numeric_to_i128(&numeric(0, 0, 1, &[1, 5000]), 1).unwrap(),
            15
        );
        assert!(numeric_to_i128(&numeric(-2, 0, 5, &[1000]), 4).is_err());
        assert_eq!(numeric_to_i128(&numeric(-2, 0, 5, &[0]), 4).unwrap(), 0);
        // zero
        assert_eq!(numeric_to_i128(&numeric(0, 0, 0, &[]), 2).unwrap(), 0);
        // 1e20 = [1, 0000 x5] weight 5
        let raw = numeric(5, 0, 0, &[1]);
        assert_eq!(numeric_to_i128(&raw, 0).unwrap(), 10i128.pow(20));
        assert!(numeric_to_i128(&raw, 18).is_ok()); // 10^38 fits i128
        let raw = numeric(10, 0, 0, &[1]);
        assert!(numeric_to_i128(&raw, 18).is_err()); // 10^58: overflow
                                                     // NaN / infinities
        assert!(numeric_to_i128(&numeric(0, 0xC000, 0, &[]), 2)
            .unwrap_err()
            .contains("NaN"));
        assert!(numeric_to_i128(&numeric(0, 0xD000, 0, &[]), 2)
            .unwrap_err()
            .contains("Infinity"));
        // garbage
        assert!(numeric_to_i128(&[0, 5, 0], 2).is_err());
        assert!(numeric_to_i128(&numeric(0, 0, 0, &[10_000]), 0).is_err());
    }

    #[test]
    fn typmods() {
        // numeric(12,2): ((12 << 16) | 2) + 4
        let m = map_builtin(1700, ((12 << 16) | 2) + 4).unwrap().unwrap();
        assert_eq!(
            m.kind,
            ColumnKind::Decimal {
                precision: 12,
                scale: 2
            }
        );
        let m = map_builtin(1700, -1).unwrap().unwrap();
        assert_eq!(
            m.kind,
            ColumnKind::Decimal {
                precision: 38,
                scale: 18
            }
        );
        assert!(map_builtin(1700, ((50 << 16) | 2) + 4).unwrap().is_err());
        // numeric(5,-2) (scale stored as 11-bit two's complement)
        let m = map_builtin(1700, ((5 << 16) | (0x800 - 2)) + 4)
            .unwrap()
            .unwrap();
        assert_eq!(
            m.kind,
            ColumnKind::Decimal {
                precision: 7,
                scale: 0
            }
        );
        assert!(map_builtin(1186, -1).unwrap().is_err()); // interval
        let ints = map_builtin(1007, -1).unwrap().unwrap(); // int4[]
        assert_eq!(ints.kind, ColumnKind::Array(Box::new(ColumnKind::Int32)));
        assert_eq!(ints.type_name, "integer[]");
        assert!(map_builtin(3904, -1).unwrap().is_err()); // int4range
        assert!(map_builtin(999_999, -1).is_none());
    }

    /// Binary arrays and records as PostgreSQL sends them (`array_send`, `record_send`).
    #[test]
    fn arrays_and_records_decode_into_lists_and_structs() {
        let value = |v: Option<&[u8]>| match v {
            Some(b) => [(b.len() as i32).to_be_bytes().to_vec(), b.to_vec()].concat(),
            None => (-1i32).to_be_bytes().to_vec(),
        };
        let ints = map_builtin(1007, -1).unwrap().unwrap();
        let mut b = ColBuilder::new(&ints.kind, 4);
        // [1, NULL]: one dimension of 2 from lower bound 1, element type int4 (23).
        let mut raw = [1i32, 1, 23, 2, 1].map(i32::to_be_bytes).concat();
        raw.extend(value(Some(&1i32.to_be_bytes())));
        raw.extend(value(None));
        append_binary(&mut b, &ints.decode, Some(&raw)).unwrap();
        // An empty array has no dimension.
        let empty = [0i32, 0, 23].map(i32::to_be_bytes).concat();
        append_binary(&mut b, &ints.decode, Some(&empty)).unwrap();
        append_binary(&mut b, &ints.decode, None).unwrap();
        let matrix = [2i32, 0, 23, 1, 1, 1, 1].map(i32::to_be_bytes).concat();
        let e = append_binary(&mut b, &ints.decode, Some(&matrix)).unwrap_err();
        assert!(e.contains("2-dimensional"), "{e}");

        let pair = composite_of(
            "pair",
            vec![
                ("n".into(), map_builtin(23, -1).unwrap().unwrap()),
                ("s".into(), map_builtin(25, -1).unwrap().unwrap()),
            ],
        )
        .unwrap();
        let mut b = ColBuilder::new(&pair.kind, 2);
        let mut raw = 2i32.to_be_bytes().to_vec();
        raw.extend(23u32.to_be_bytes());
        raw.extend(value(Some(&7i32.to_be_bytes())));
        raw.extend(25u32.to_be_bytes());
        raw.extend(value(None));
        append_binary(&mut b, &pair.decode, Some(&raw)).unwrap();
        let short = 1i32.to_be_bytes().to_vec();
        let e = append_binary(&mut b, &pair.decode, Some(&short)).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn times_and_uuid() {
        assert_eq!(date_days(&0i32.to_be_bytes()).unwrap(), 10_957);
        assert!(date_days(&i32::MAX.to_be_bytes())
            .unwrap_err()
            .contains("infinity"));
        assert_eq!(
            timestamp_micros(&0i64.to_be_bytes()).unwrap(),
            PG_EPOCH_MICROS
        );
        assert!(timestamp_micros(&i64::MIN.to_be_bytes())
            .unwrap_err()
            .contains("-infinity"));
        let u = [
            0xa0u8, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
            0x0a, 0x11,
        ];
        assert_eq!(
            uuid_text(&u).unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
    }
}
