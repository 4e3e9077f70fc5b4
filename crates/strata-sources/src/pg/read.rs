//! PostgreSQL describe and streamed reads (extended protocol, binary results).

use std::collections::HashMap;
use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::SchemaRef;
use bytes::BytesMut;
use futures::StreamExt;
use tokio_postgres::types::{to_sql_checked, Format, IsNull, ToSql, Type};
use tokio_postgres::{Client, GenericClient, Row, RowStream};

use super::types::{append_binary, map_type, watermark_value, PgDecode, Raw};
use crate::batch::{meta, ColBuilder, SourceColumn, SourceSchema};
use crate::conn::{pg_error_text, Resolved};
use crate::error::{Result, SourceError};
use crate::object::{pg_ident, SourceObject};
use crate::read::{check_columns, WatermarkRead};
use crate::value::Watermark;

/// A query parameter sent as text: the server parses it with the type it inferred for the
/// parameter (so one value type fits numeric, timestamptz, date, text, ...).
#[derive(Debug)]
pub(crate) struct TextParam(pub String);

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }
    fn accepts(_: &Type) -> bool {
        true
    }
    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }
    to_sql_checked!();
}

pub(crate) fn from_clause(object: &SourceObject) -> String {
    match object {
        SourceObject::Table(t) => t.pg_sql(),
        SourceObject::Query(q) => format!("({}) AS strata_q", SourceObject::query_body(q)),
    }
}

/// Describe a table or query: the schema (without excluded columns) and each kept column's
/// decoder.
pub(crate) async fn describe<C: GenericClient>(
    client: &C,
    r: &Resolved,
    object: &SourceObject,
    exclude: &[String],
) -> Result<(SourceSchema, Vec<PgDecode>, Vec<String>)> {
    let sql = format!("SELECT * FROM {}", from_clause(object));
    let stmt = client
        .prepare(&sql)
        .await
        .map_err(|e| r.query_error(object.label(), pg_error_text(&e)))?;
    // NOT NULL flags for table columns.
    let mut not_null: HashMap<(u32, i16), bool> = HashMap::new();
    let oids: std::collections::BTreeSet<u32> = stmt
        .columns()
        .iter()
        .filter_map(|c| c.table_oid())
        .collect();
    for oid in oids {
        let rows = client
            .query(
                "SELECT attnum, attnotnull FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum > 0",
                &[&oid],
            )
            .await
            .map_err(|e| r.query_error(object.label(), pg_error_text(&e)))?;
        for row in rows {
            not_null.insert((oid, row.get::<_, i16>(0)), row.get::<_, bool>(1));
        }
    }
    let mut columns = Vec::new();
    let mut decoders = Vec::new();
    let mut all = Vec::new();
    for c in stmt.columns() {
        let name = c.name().to_string();
        if all.contains(&name) {
            return Err(r.query_error(
                object.label(),
                format!("two columns are named '{name}'; give them distinct names (AS ...) in the query"),
            ));
        }
        all.push(name.clone());
        if exclude.contains(&name) {
            continue;
        }
        let mapped = map_type(c.type_(), c.type_modifier()).map_err(|(type_name, why)| {
            SourceError::UnsupportedType {
                connection: r.name().to_string(),
                object: object.label(),
                column: name.clone(),
                type_name,
                why,
            }
        })?;
        let nn = match (c.table_oid(), c.column_id()) {
            (Some(t), Some(a)) => not_null.get(&(t, a)).copied().unwrap_or(false),
            _ => false,
        };
        columns.push(SourceColumn {
            name,
            source_type: mapped.type_name.clone(),
            kind: mapped.kind,
            not_null: nn,
        });
        decoders.push(mapped.decode);
    }
    Ok((
        SourceSchema {
            object: match object {
                SourceObject::Table(t) => t.to_string(),
                SourceObject::Query(_) => "query".into(),
            },
            columns,
        },
        decoders,
        all,
    ))
}

pub(crate) async fn start(
    client: Arc<Client>,
    r: &Resolved,
    read: &WatermarkRead,
) -> Result<(SourceSchema, PgRowReader)> {
    let (schema, decoders, all) =
        describe(&*client, r, &read.object, &read.exclude_columns).await?;
    let wm_idx = check_columns(
        r,
        &read.object,
        &all,
        &schema,
        &read.watermark_columns,
        &read.exclude_columns,
    )?;
    let cols: Vec<String> = schema.columns.iter().map(|c| pg_ident(&c.name)).collect();
    let wm: Vec<String> = read.watermark_columns.iter().map(|c| pg_ident(c)).collect();
    let mut cond: Vec<String> = wm.iter().map(|c| format!("{c} IS NOT NULL")).collect();
    let mut params = Vec::new();
    if let Some(lb) = &read.lower_bound {
        let n = lb.watermark.values.len();
        let placeholders: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
        cond.push(format!(
            "({}) {} ({})",
            wm[..n].join(", "),
            if lb.inclusive { ">=" } else { ">" },
            placeholders.join(", ")
        ));
        params = lb
            .watermark
            .values
            .iter()
            .map(|v| TextParam(v.to_sql_text()))
            .collect();
    }
    let sql = format!(
        "SELECT {} FROM {} WHERE {} ORDER BY {}",
        if cols.is_empty() {
            "1".to_string()
        } else {
            cols.join(", ")
        },
        from_clause(&read.object),
        cond.join(" AND "),
        wm.join(", ")
    );
    let stream = client
        .query_raw(
            sql.as_str(),
            params.iter().map(|p| p as &(dyn ToSql + Sync)),
        )
        .await
        .map_err(|e| r.query_error(read.object.label(), pg_error_text(&e)))?;
    Ok((
        schema,
        PgRowReader {
            stream: Box::pin(stream),
            decoders,
            wm_idx,
            wm_names: read.watermark_columns.clone(),
            batch_rows: read.batch_rows.max(1),
            connection: r.name().to_string(),
            object: read.object.label(),
            scrub: r.password.secret.clone(),
            _client: client,
            meta: None,
            exhausted: false,
        },
    ))
}

/// Metadata columns appended to every row (the snapshot read of CDC uses them).
pub(crate) struct SnapshotMeta {
    pub commit_lsn: i64,
    pub commit_ts: i64,
}

impl SnapshotMeta {
    /// The metadata columns of `n` snapshot rows: change type `snapshot`, the consistent
    /// point as commit LSN, sequence 0, the snapshot's time, no unchanged columns.
    fn arrays(&self, n: usize) -> Vec<ArrayRef> {
        let mut unchanged = ListBuilder::new(StringBuilder::new());
        for _ in 0..n {
            unchanged.append_null();
        }
        vec![
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                meta::SNAPSHOT,
                n,
            ))),
            Arc::new(Int64Array::from_value(self.commit_lsn, n)),
            Arc::new(Int64Array::from_value(0, n)),
            Arc::new(TimestampMicrosecondArray::from_value(self.commit_ts, n).with_timezone("UTC")),
            Arc::new(unchanged.finish()),
        ]
    }
}

pub(crate) struct PgRowReader {
    pub stream: Pin<Box<RowStream>>,
    pub decoders: Vec<PgDecode>,
    pub wm_idx: Vec<usize>,
    pub wm_names: Vec<String>,
    pub batch_rows: usize,
    pub connection: String,
    pub object: String,
    pub scrub: Option<crate::Secret>,
    pub _client: Arc<Client>,
    pub meta: Option<SnapshotMeta>,
    /// The stream returned its end (a finished RowStream must not be polled again).
    pub exhausted: bool,
}

impl PgRowReader {
    fn value_error(&self, schema: &SourceSchema, i: usize, detail: String) -> SourceError {
        SourceError::Value {
            connection: self.connection.clone(),
            object: self.object.clone(),
            column: schema
                .columns
                .get(i)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            detail,
        }
    }

    pub async fn next_batch(
        &mut self,
        arrow: &SchemaRef,
        schema: &SourceSchema,
    ) -> Result<Option<(RecordBatch, Option<Watermark>)>> {
        let mut builders: Vec<ColBuilder> = schema
            .columns
            .iter()
            .map(|c| ColBuilder::new(c.kind, self.batch_rows))
            .collect();
        let mut n = 0usize;
        let mut last: Option<Row> = None;
        while n < self.batch_rows && !self.exhausted {
            match self.stream.next().await {
                None => self.exhausted = true,
                Some(Err(e)) => {
                    let text = pg_error_text(&e);
                    let text = self.scrub.as_ref().map(|s| s.scrub(&text)).unwrap_or(text);
                    return Err(SourceError::Query {
                        connection: self.connection.clone(),
                        object: self.object.clone(),
                        detail: text,
                    });
                }
                Some(Ok(row)) => {
                    for (i, b) in builders.iter_mut().enumerate() {
                        let raw: Option<Raw> = row
                            .try_get(i)
                            .map_err(|e| self.value_error(schema, i, e.to_string()))?;
                        append_binary(b, self.decoders[i], raw.map(|r| r.0))
                            .map_err(|e| self.value_error(schema, i, e))?;
                    }
                    n += 1;
                    last = Some(row);
                }
            }
        }
        if n == 0 {
            return Ok(None);
        }
        let wm = match &last {
            Some(row) if !self.wm_idx.is_empty() => {
                let mut values = Vec::new();
                for &i in &self.wm_idx {
                    let raw: Option<Raw> = row
                        .try_get(i)
                        .map_err(|e| self.value_error(schema, i, e.to_string()))?;
                    match watermark_value(self.decoders[i], raw.map(|r| r.0))
                        .map_err(|e| self.value_error(schema, i, e))?
                    {
                        Some(v) => values.push(v),
                        None => {
                            return Err(self.value_error(
                                schema,
                                i,
                                "internal: NULL watermark value".into(),
                            ))
                        }
                    }
                }
                Some(Watermark {
                    columns: self.wm_names.clone(),
                    values,
                })
            }
            _ => None,
        };
        let mut arrays: Vec<ArrayRef> = builders.iter_mut().map(|b| b.finish()).collect();
        if let Some(m) = &self.meta {
            arrays.extend(m.arrays(n));
        }
        let batch =
            RecordBatch::try_new(arrow.clone(), arrays).map_err(|source| SourceError::Arrow {
                object: self.object.clone(),
                source,
            })?;
        Ok(Some((batch, wm)))
    }
}
