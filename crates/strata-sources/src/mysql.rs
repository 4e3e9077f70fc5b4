//! MySQL / MariaDB: type mapping, describe and streamed watermark reads (binary protocol).

use arrow_array::{ArrayRef, RecordBatch};
use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::prelude::Queryable;
use mysql_async::{Column, Conn, Value};

use crate::batch::{Cell, ColBuilder, ColumnKind, SourceSchema};
use crate::conn::Resolved;
use crate::error::{Result, SourceError};
use crate::object::{mysql_ident, SourceObject};
use crate::read::{describe_columns, BatchReceiver, Described, ResultColumn, WatermarkRead};
use crate::value::{parse_decimal, Watermark, WatermarkValue};

/// How a MySQL value becomes a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MyDecode {
    /// Any integer into Int8/16/32/64 (range-checked), YEAR too.
    Int,
    /// BIGINT UNSIGNED into DECIMAL(20,0).
    U64Decimal,
    Float,
    Decimal {
        scale: i8,
    },
    Text,
    Bytes,
    Date,
    DateTime,
}

const BINARY_CHARSET: u16 = 63;

/// Map a result column. `Err((type name, why))` for types strata cannot read.
pub(crate) fn map_column(
    c: &Column,
) -> std::result::Result<(MyDecode, ColumnKind, String), (String, String)> {
    use ColumnType::*;
    let unsigned = c.flags().contains(ColumnFlags::UNSIGNED_FLAG);
    let u = if unsigned { " unsigned" } else { "" };
    let binary = c.character_set() == BINARY_CHARSET;
    let t = c.column_type();
    let ok = |d, k, name: String| Ok((d, k, name));
    match t {
        MYSQL_TYPE_TINY => ok(
            MyDecode::Int,
            if unsigned {
                ColumnKind::Int16
            } else {
                ColumnKind::Int8
            },
            format!("tinyint{u}"),
        ),
        MYSQL_TYPE_SHORT => ok(
            MyDecode::Int,
            if unsigned {
                ColumnKind::Int32
            } else {
                ColumnKind::Int16
            },
            format!("smallint{u}"),
        ),
        MYSQL_TYPE_INT24 => ok(MyDecode::Int, ColumnKind::Int32, format!("mediumint{u}")),
        MYSQL_TYPE_LONG => ok(
            MyDecode::Int,
            if unsigned {
                ColumnKind::Int64
            } else {
                ColumnKind::Int32
            },
            format!("int{u}"),
        ),
        MYSQL_TYPE_LONGLONG if unsigned => ok(
            MyDecode::U64Decimal,
            ColumnKind::Decimal {
                precision: 20,
                scale: 0,
            },
            "bigint unsigned".into(),
        ),
        MYSQL_TYPE_LONGLONG => ok(MyDecode::Int, ColumnKind::Int64, "bigint".into()),
        MYSQL_TYPE_YEAR => ok(MyDecode::Int, ColumnKind::Int16, "year".into()),
        MYSQL_TYPE_FLOAT => ok(MyDecode::Float, ColumnKind::Float32, "float".into()),
        MYSQL_TYPE_DOUBLE => ok(MyDecode::Float, ColumnKind::Float64, "double".into()),
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
            let scale = c.decimals() as u32;
            // The display length counts a sign (signed columns) and a point (scale > 0).
            let precision = c.column_length() as i64 - i64::from(!unsigned) - i64::from(scale > 0);
            let name = format!("decimal({precision},{scale}){u}");
            if !(1..=38).contains(&precision) || scale as i64 > precision {
                return Err((name, "Delta decimals have at most 38 digits".into()));
            }
            ok(
                MyDecode::Decimal { scale: scale as i8 },
                ColumnKind::Decimal {
                    precision: precision as u8,
                    scale: scale as i8,
                },
                name,
            )
        }
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => ok(MyDecode::Date, ColumnKind::Date, "date".into()),
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => {
            ok(MyDecode::DateTime, ColumnKind::Timestamp, "datetime".into())
        }
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => ok(
            MyDecode::DateTime,
            ColumnKind::TimestampUtc,
            "timestamp".into(),
        ),
        MYSQL_TYPE_JSON => ok(MyDecode::Text, ColumnKind::Utf8, "json".into()),
        MYSQL_TYPE_ENUM => ok(MyDecode::Text, ColumnKind::Utf8, "enum".into()),
        MYSQL_TYPE_SET => ok(MyDecode::Text, ColumnKind::Utf8, "set".into()),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING | MYSQL_TYPE_STRING => {
            if c.flags()
                .intersects(ColumnFlags::ENUM_FLAG | ColumnFlags::SET_FLAG)
            {
                ok(MyDecode::Text, ColumnKind::Utf8, "enum".into())
            } else if binary {
                ok(MyDecode::Bytes, ColumnKind::Binary, "varbinary".into())
            } else {
                ok(MyDecode::Text, ColumnKind::Utf8, "varchar".into())
            }
        }
        MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB | MYSQL_TYPE_BLOB => {
            if binary {
                ok(MyDecode::Bytes, ColumnKind::Binary, "blob".into())
            } else {
                ok(MyDecode::Text, ColumnKind::Utf8, "text".into())
            }
        }
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => {
            Err(("time".into(), "Delta has no time-of-day type".into()))
        }
        MYSQL_TYPE_BIT => Err((
            "bit".into(),
            "no Delta mapping for bit strings; cast it to an integer".into(),
        )),
        MYSQL_TYPE_GEOMETRY => Err(("geometry".into(), "no Delta mapping for geometry".into())),
        other => Err((
            format!("{other:?}"),
            "no Delta mapping for this type".into(),
        )),
    }
}

fn text(v: &[u8]) -> std::result::Result<String, String> {
    String::from_utf8(v.to_vec()).map_err(|_| "value is not valid UTF-8".to_string())
}

fn days_from_ymd(y: u16, m: u8, d: u8) -> std::result::Result<i32, String> {
    use chrono::Datelike;
    if y == 0 && m == 0 && d == 0 {
        return Err("zero date 0000-00-00 has no Delta equivalent; filter it out (or set NO_ZERO_DATE and fix the rows)".into());
    }
    chrono::NaiveDate::from_ymd_opt(y as i32, m as u32, d as u32)
        .map(|x| x.num_days_from_ce() - 719_163)
        .ok_or_else(|| format!("invalid date {y:04}-{m:02}-{d:02}"))
}

/// One value as a cell of its column.
pub(crate) fn cell(decode: MyDecode, v: &Value) -> std::result::Result<Cell, String> {
    Ok(match (decode, v) {
        (_, Value::NULL) => Cell::Null,
        (MyDecode::Int, Value::Int(i)) => Cell::Int(*i),
        (MyDecode::Int, Value::UInt(u)) => {
            Cell::Int(i64::try_from(*u).map_err(|_| format!("value {u} is out of range"))?)
        }
        (MyDecode::Int, Value::Bytes(b)) => Cell::Int(
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or("not an integer")?,
        ),
        (MyDecode::U64Decimal, Value::UInt(u)) => Cell::Decimal(*u as i128),
        (MyDecode::U64Decimal, Value::Int(i)) => Cell::Decimal(*i as i128),
        (MyDecode::U64Decimal, Value::Bytes(b)) => Cell::Decimal(
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or("not an unsigned integer")? as i128,
        ),
        (MyDecode::Float, Value::Float(f)) => Cell::Float(*f as f64),
        (MyDecode::Float, Value::Double(f)) => Cell::Float(*f),
        (MyDecode::Float, Value::Bytes(b)) => Cell::Float(
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or("not a number")?,
        ),
        (MyDecode::Decimal { scale }, Value::Bytes(b)) => {
            let s = std::str::from_utf8(b).map_err(|_| "decimal is not text")?;
            let (unscaled, got) = parse_decimal(s)?;
            Cell::Decimal(rescale(unscaled, got, scale)?)
        }
        (MyDecode::Decimal { scale }, Value::Int(i)) => {
            Cell::Decimal(rescale(*i as i128, 0, scale)?)
        }
        (MyDecode::Text, Value::Bytes(b)) => Cell::Str(text(b)?),
        (MyDecode::Bytes, Value::Bytes(b)) => Cell::Bytes(b.clone()),
        (MyDecode::Date, Value::Date(y, m, d, ..)) => Cell::Date(days_from_ymd(*y, *m, *d)?),
        (MyDecode::DateTime, Value::Date(y, m, d, hh, mm, ss, us)) => {
            let days = days_from_ymd(*y, *m, *d)? as i64;
            Cell::Micros(
                days * 86_400_000_000
                    + (*hh as i64 * 3600 + *mm as i64 * 60 + *ss as i64) * 1_000_000
                    + *us as i64,
            )
        }
        (d, v) => return Err(format!("unexpected value {v:?} for a {d:?} column")),
    })
}

fn rescale(unscaled: i128, from: i8, to: i8) -> std::result::Result<i128, String> {
    if from == to {
        return Ok(unscaled);
    }
    if from < to {
        return 10i128
            .checked_pow((to - from) as u32)
            .and_then(|m| unscaled.checked_mul(m))
            .ok_or_else(|| "decimal overflow".to_string());
    }
    let div = 10i128.pow((from - to) as u32);
    if unscaled % div != 0 {
        return Err(format!("decimal value has more than {to} decimals"));
    }
    Ok(unscaled / div)
}

pub(crate) fn cell_watermark(kind: &ColumnKind, c: &Cell) -> Option<WatermarkValue> {
    Some(match (kind, c) {
        (_, Cell::Null) => return None,
        (ColumnKind::Decimal { scale, .. }, Cell::Decimal(v)) => WatermarkValue::Decimal {
            unscaled: *v,
            scale: *scale,
        },
        (ColumnKind::TimestampUtc, Cell::Micros(t)) => WatermarkValue::TimestampUtc(*t),
        (_, Cell::Micros(t)) => WatermarkValue::Timestamp(*t),
        (_, Cell::Int(i)) => WatermarkValue::Int(*i),
        (_, Cell::Float(f)) => WatermarkValue::Float(*f),
        (_, Cell::Str(s)) => WatermarkValue::Str(s.clone()),
        (_, Cell::Bool(b)) => WatermarkValue::Bool(*b),
        (_, Cell::Date(d)) => WatermarkValue::Date(*d),
        (_, Cell::Decimal(v)) => WatermarkValue::Decimal {
            unscaled: *v,
            scale: 0,
        },
        (_, Cell::Bytes(_)) => return None,
    })
}

fn from_clause(object: &SourceObject) -> String {
    match object {
        SourceObject::Table(t) => t.mysql_sql(),
        SourceObject::Query(q) => format!("({}) AS strata_q", SourceObject::query_body(q)),
    }
}

pub(crate) async fn describe(
    conn: &mut Conn,
    r: &Resolved,
    object: &SourceObject,
    exclude: &[String],
) -> Result<(SourceSchema, Vec<MyDecode>, Vec<String>)> {
    let sql = format!("SELECT * FROM {}", from_clause(object));
    let stmt = conn
        .prep(sql)
        .await
        .map_err(|e| r.query_error(object.label(), e.to_string()))?;
    let stmt_columns = stmt.columns();
    let result_columns = stmt_columns.iter().map(|c| ResultColumn {
        name: c.name_str().to_string(),
        not_null: c.flags().contains(ColumnFlags::NOT_NULL_FLAG),
        distinct: false,
        mapping: map_column(c),
    });
    let described = describe_columns(r, object, exclude, result_columns)?;
    let _ = conn.close(stmt).await;
    Ok(described)
}

/// The placeholder of a value compared with a column of `kind`: a string compared with a
/// DECIMAL would be compared as a double.
pub(crate) fn placeholder(kind: &ColumnKind) -> String {
    match kind {
        ColumnKind::Decimal { precision, scale } => {
            format!("CAST(? AS DECIMAL({precision},{scale}))")
        }
        _ => "?".to_string(),
    }
}

pub(crate) fn param(v: &WatermarkValue) -> Value {
    match v {
        WatermarkValue::Int(i) => Value::Int(*i),
        WatermarkValue::Float(f) => Value::Double(*f),
        WatermarkValue::Bool(b) => Value::Int(*b as i64),
        WatermarkValue::Date(_)
        | WatermarkValue::Timestamp(_)
        | WatermarkValue::TimestampUtc(_) => {
            let micros = match v {
                WatermarkValue::Date(d) => *d as i64 * 86_400_000_000,
                WatermarkValue::Timestamp(t) | WatermarkValue::TimestampUtc(t) => *t,
                _ => 0,
            };
            match chrono::DateTime::from_timestamp_micros(micros) {
                Some(dt) => {
                    use chrono::{Datelike, Timelike};
                    let n = dt.naive_utc();
                    Value::Date(
                        n.year().clamp(0, 9999) as u16,
                        n.month() as u8,
                        n.day() as u8,
                        n.hour() as u8,
                        n.minute() as u8,
                        n.second() as u8,
                        n.nanosecond() / 1000,
                    )
                }
                None => Value::Bytes(v.to_sql_text().into_bytes()),
            }
        }
        other => Value::Bytes(other.to_sql_text().into_bytes()),
    }
}

pub(crate) async fn start(
    r: &Resolved,
    read: &WatermarkRead,
) -> Result<(SourceSchema, BatchReceiver)> {
    let mut conn = r.mysql_connect().await?;
    let described = match describe(&mut conn, r, &read.object, &read.exclude_columns).await {
        Ok(x) => x,
        Err(e) => {
            let _ = conn.disconnect().await;
            return Err(e);
        }
    };
    let Described {
        schema,
        decoders,
        wm_idx,
    } = read.check_described(r, described)?;
    let cols: Vec<String> = schema
        .columns
        .iter()
        .map(|c| mysql_ident(&c.name))
        .collect();
    let wm: Vec<String> = read
        .watermark_columns
        .iter()
        .map(|c| mysql_ident(c))
        .collect();
    let mut cond: Vec<String> = wm.iter().map(|c| format!("{c} IS NOT NULL")).collect();
    let mut params = Vec::new();
    if let Some(lb) = &read.lower_bound {
        let n = lb.watermark.values.len();
        let placeholders: Vec<String> = wm_idx[..n]
            .iter()
            .map(|&i| placeholder(&schema.columns[i].kind))
            .collect();
        cond.push(format!(
            "({}) {} ({})",
            wm[..n].join(", "),
            if lb.inclusive { ">=" } else { ">" },
            placeholders.join(", ")
        ));
        params = lb.watermark.values.iter().map(param).collect();
    }
    let sql = format!(
        "SELECT {} FROM {} WHERE {} ORDER BY {}",
        cols.join(", "),
        from_clause(&read.object),
        cond.join(" AND "),
        wm.join(", ")
    );
    let arrow = schema.arrow_schema();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let task = ReadTask {
        arrow: arrow.clone(),
        schema: schema.clone(),
        decoders,
        wm_idx,
        wm_names: read.watermark_columns.clone(),
        batch_rows: read.batch_rows.max(1),
        connection: r.name().to_string(),
        object: read.object.label(),
        scrub: r.password.secret.clone(),
    };
    tokio::spawn(async move {
        let out = task.run(&mut conn, sql, params, &tx).await;
        if let Err(e) = out {
            let _ = tx.send(Err(e)).await;
        }
        let _ = conn.disconnect().await;
    });
    Ok((schema, rx))
}

struct ReadTask {
    arrow: arrow_schema::SchemaRef,
    schema: SourceSchema,
    decoders: Vec<MyDecode>,
    wm_idx: Vec<usize>,
    wm_names: Vec<String>,
    batch_rows: usize,
    connection: String,
    object: String,
    scrub: Option<crate::Secret>,
}

type Batches = tokio::sync::mpsc::Sender<Result<(RecordBatch, Option<Watermark>)>>;

impl ReadTask {
    fn query_error(&self, e: mysql_async::Error) -> SourceError {
        let t = e.to_string();
        SourceError::Query {
            connection: self.connection.clone(),
            object: self.object.clone(),
            detail: self.scrub.as_ref().map(|s| s.scrub(&t)).unwrap_or(t),
        }
    }

    async fn run(
        &self,
        conn: &mut Conn,
        sql: String,
        params: Vec<Value>,
        tx: &Batches,
    ) -> Result<()> {
        let params = if params.is_empty() {
            mysql_async::Params::Empty
        } else {
            mysql_async::Params::Positional(params)
        };
        let mut result = conn
            .exec_iter(sql, params)
            .await
            .map_err(|e| self.query_error(e))?;
        let mut done = false;
        while !done {
            let mut builders: Vec<ColBuilder> = self
                .schema
                .columns
                .iter()
                .map(|c| ColBuilder::new(&c.kind, self.batch_rows))
                .collect();
            let mut n = 0;
            let mut last_wm: Vec<Cell> = Vec::new();
            while n < self.batch_rows {
                let Some(row) = result.next().await.map_err(|e| self.query_error(e))? else {
                    done = true;
                    break;
                };
                for (i, b) in builders.iter_mut().enumerate() {
                    let v = row.as_ref(i).unwrap_or(&Value::NULL);
                    let c = cell(self.decoders[i], v).map_err(|d| self.value_error(i, d))?;
                    b.append_value(&c).map_err(|d| self.value_error(i, d))?;
                }
                last_wm = self
                    .wm_idx
                    .iter()
                    .map(|&i| {
                        cell(self.decoders[i], row.as_ref(i).unwrap_or(&Value::NULL))
                            .unwrap_or(Cell::Null)
                    })
                    .collect();
                n += 1;
            }
            if n == 0 {
                break;
            }
            let values: Vec<WatermarkValue> = self
                .wm_idx
                .iter()
                .zip(&last_wm)
                .filter_map(|(&i, c)| cell_watermark(&self.schema.columns[i].kind, c))
                .collect();
            let wm = (values.len() == self.wm_idx.len()).then(|| Watermark {
                columns: self.wm_names.clone(),
                values,
            });
            let mut arrays: Vec<ArrayRef> = Vec::with_capacity(builders.len());
            for (i, b) in builders.iter_mut().enumerate() {
                arrays.push(b.finish().map_err(|e| self.value_error(i, e))?);
            }
            let batch = RecordBatch::try_new(self.arrow.clone(), arrays).map_err(|source| {
                SourceError::Arrow {
                    object: self.object.clone(),
                    source,
                }
            })?;
            if tx.send(Ok((batch, wm))).await.is_err() {
                // The reader was dropped: stop reading.
                return Ok(());
            }
        }
        Ok(())
    }

    fn value_error(&self, i: usize, detail: String) -> SourceError {
        SourceError::Value {
            connection: self.connection.clone(),
            object: self.object.clone(),
            column: self
                .schema
                .columns
                .get(i)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            detail,
        }
    }
}
