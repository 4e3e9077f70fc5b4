//! PostgreSQL describe and streamed reads: `COPY (SELECT ...) TO STDOUT (FORMAT binary)`,
//! decoded into Arrow builders as the bytes arrive.

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
use tokio_postgres::{Client, CopyOutStream, GenericClient};

use super::copy::{CopyParser, Tuple};
use super::types::{append_binary, map_type, watermark_value, PgDecode};
use crate::batch::{meta, ColBuilder, SourceSchema};
use crate::conn::{pg_error_text, Resolved};
use crate::error::{Result, SourceError};
use crate::object::{pg_ident, SourceObject};
use crate::read::{describe_columns, ResultColumn, WatermarkRead};
use crate::value::{LowerBound, Watermark, WatermarkValue};

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

/// Per column of the table `$1` (an oid): its number, NOT NULL, and whether nearly all its
/// values are distinct: the only key column of a unique index, or more distinct values than
/// half the rows in the planner's statistics (`n_distinct` below -0.5 is a fraction of the
/// rows; above 0, a count).
const COLUMN_FLAGS: &str = "SELECT a.attnum, a.attnotnull, \
       EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
               WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1 \
                 AND i.indkey[0] = a.attnum AND i.indpred IS NULL) \
       OR COALESCE((SELECT s.n_distinct < -0.5 \
                           OR (c.reltuples > 0 AND s.n_distinct > 0.5 * c.reltuples) \
                    FROM pg_catalog.pg_stats s \
                    WHERE s.schemaname = n.nspname AND s.tablename = c.relname \
                      AND s.attname = a.attname AND NOT s.inherited), false) \
FROM pg_catalog.pg_attribute a \
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
WHERE a.attrelid = $1 AND a.attnum > 0";

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
    // Per column of a table: NOT NULL, and nearly all values distinct.
    let mut flags: HashMap<(u32, i16), (bool, bool)> = HashMap::new();
    let oids: std::collections::BTreeSet<u32> = stmt
        .columns()
        .iter()
        .filter_map(|c| c.table_oid())
        .collect();
    for oid in oids {
        let rows = client
            .query(COLUMN_FLAGS, &[&oid])
            .await
            .map_err(|e| r.query_error(object.label(), pg_error_text(&e)))?;
        for row in rows {
            flags.insert(
                (oid, row.get::<_, i16>(0)),
                (row.get::<_, bool>(1), row.get::<_, bool>(2)),
            );
        }
    }
    let flag = |c: &tokio_postgres::Column| match (c.table_oid(), c.column_id()) {
        (Some(t), Some(a)) => flags.get(&(t, a)).copied().unwrap_or_default(),
        _ => (false, false),
    };
    let result_columns = stmt.columns().iter().map(|c| ResultColumn {
        name: c.name().to_string(),
        not_null: flag(c).0,
        distinct: flag(c).1,
        mapping: map_type(c.type_(), c.type_modifier()).map(|m| (m.decode, m.kind, m.type_name)),
    });
    describe_columns(r, object, exclude, result_columns)
}

/// A string as an SQL literal (COPY takes no parameters): quotes doubled, and backslashes
/// too in an `E'...'` literal, as libpq's `PQescapeLiteral` does, so the text means the same
/// whatever `standard_conforming_strings` says.
pub(crate) fn sql_literal(text: &str) -> String {
    if text.contains('\\') {
        format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", text.replace('\'', "''"))
    }
}

/// A watermark value as an untyped SQL literal: the server reads it as the type of the
/// column it is compared with (as it did a text parameter).
pub(crate) fn value_literal(v: &WatermarkValue) -> String {
    sql_literal(&v.to_sql_text())
}

/// The condition of a lower bound: the watermark tuple above (or at) the bound's values.
pub(crate) fn lower_bound_condition(wm: &[String], lb: &LowerBound) -> String {
    let n = lb.watermark.values.len();
    let values: Vec<String> = lb.watermark.values.iter().map(value_literal).collect();
    format!(
        "({}) {} ({})",
        wm[..n].join(", "),
        if lb.inclusive { ">=" } else { ">" },
        values.join(", ")
    )
}

/// The conditions of the rows a watermark read takes: every watermark column (`wm`, quoted)
/// set, and the tuple above the lower bound.
fn watermark_conditions(read: &WatermarkRead, wm: &[String]) -> Vec<String> {
    let mut cond: Vec<String> = wm.iter().map(|c| format!("{c} IS NOT NULL")).collect();
    if let Some(lb) = &read.lower_bound {
        cond.push(lower_bound_condition(wm, lb));
    }
    cond
}

/// The query of a watermark read (or of one range of it: `extra` conditions): the kept
/// columns of the rows whose watermark columns are all set and above the lower bound, in
/// watermark order when `ordered` (a first load's scan takes them as they lie).
pub(crate) fn watermark_select(
    read: &WatermarkRead,
    schema: &SourceSchema,
    extra: &[String],
    ordered: bool,
) -> String {
    let cols: Vec<String> = schema.columns.iter().map(|c| pg_ident(&c.name)).collect();
    let wm: Vec<String> = read.watermark_columns.iter().map(|c| pg_ident(c)).collect();
    let mut cond = watermark_conditions(read, &wm);
    cond.extend(extra.iter().cloned());
    let order = if ordered {
        format!(" ORDER BY {}", wm.join(", "))
    } else {
        String::new()
    };
    format!(
        "SELECT {} FROM {} WHERE {}{order}",
        if cols.is_empty() {
            "1".to_string()
        } else {
            cols.join(", ")
        },
        from_clause(&read.object),
        cond.join(" AND "),
    )
}

/// The query of a read's highest watermark: the watermark columns of the rows
/// [`watermark_select`] reads, highest first, one row.
pub(crate) fn max_watermark_select(read: &WatermarkRead) -> String {
    let wm: Vec<String> = read.watermark_columns.iter().map(|c| pg_ident(c)).collect();
    let desc: Vec<String> = wm.iter().map(|c| format!("{c} DESC")).collect();
    format!(
        "SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1",
        wm.join(", "),
        from_clause(&read.object),
        watermark_conditions(read, &wm).join(" AND "),
        desc.join(", ")
    )
}

/// What a watermark read of PostgreSQL decodes: the described table and where its watermark
/// columns are.
pub(crate) type Described = crate::read::Described<PgDecode>;

/// Describe the read's table or query and check its watermark and excluded columns.
pub(crate) async fn describe_read<C: GenericClient>(
    client: &C,
    r: &Resolved,
    read: &WatermarkRead,
) -> Result<Described> {
    let described = describe(client, r, &read.object, &read.exclude_columns).await?;
    read.check_described(r, described)
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

/// Rows of a binary COPY, decoded into Arrow batches (see [`super::copy`]).
pub(crate) struct PgRowReader {
    stream: Pin<Box<CopyOutStream>>,
    parser: CopyParser,
    /// Fields per tuple (the kept columns; one when none is kept, `SELECT 1`).
    width: usize,
    decoders: Vec<PgDecode>,
    wm_idx: Vec<usize>,
    wm_names: Vec<String>,
    /// The watermark columns' bytes of the last row decoded (`None`: NULL).
    last_wm: Vec<Option<Vec<u8>>>,
    batch_rows: usize,
    /// Per column, the value bytes its text builder starts with.
    value_bytes: Vec<usize>,
    connection: String,
    object: String,
    scrub: Option<crate::Secret>,
    _client: Arc<Client>,
    meta: Option<SnapshotMeta>,
    /// The stream returned its end (a finished stream must not be polled again).
    exhausted: bool,
}

impl PgRowReader {
    /// Starts `COPY (select) TO STDOUT (FORMAT binary)` on `client`.
    pub(crate) async fn copy(
        client: Arc<Client>,
        r: &Resolved,
        read: &WatermarkRead,
        d: &Described,
        select: &str,
    ) -> Result<PgRowReader> {
        let reader = PgRowReader::start_copy(
            client,
            r,
            &read.object,
            d.decoders.clone(),
            read.batch_rows,
            select,
        )
        .await?;
        Ok(reader.tracking(d.wm_idx.clone(), read.watermark_columns.clone()))
    }

    /// Starts the COPY of `select`'s rows (no watermark tracked: see [`PgRowReader::copy`]).
    pub(crate) async fn start_copy(
        client: Arc<Client>,
        r: &Resolved,
        object: &SourceObject,
        decoders: Vec<PgDecode>,
        batch_rows: usize,
        select: &str,
    ) -> Result<PgRowReader> {
        let sql = format!("COPY ({select}) TO STDOUT (FORMAT binary)");
        let stream = client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| r.query_error(object.label(), pg_error_text(&e)))?;
        Ok(PgRowReader {
            stream: Box::pin(stream),
            parser: CopyParser::default(),
            width: decoders.len().max(1),
            decoders,
            wm_idx: vec![],
            wm_names: vec![],
            last_wm: vec![],
            batch_rows: batch_rows.max(1),
            value_bytes: vec![],
            connection: r.name().to_string(),
            object: object.label(),
            scrub: r.password.secret.clone(),
            _client: client,
            meta: None,
            exhausted: false,
        })
    }

    /// Tracks the values of these columns (`idx` among the decoded ones, named `names`) in
    /// each batch's last row, as [`PgRowReader::next_batch`] returns them.
    pub(crate) fn tracking(mut self, idx: Vec<usize>, names: Vec<String>) -> Self {
        self.last_wm = vec![None; idx.len()];
        self.wm_idx = idx;
        self.wm_names = names;
        self
    }

    /// Appends these metadata columns to every batch.
    pub(crate) fn with_meta(mut self, meta: SnapshotMeta) -> Self {
        self.meta = Some(meta);
        self
    }

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

    fn stream_error(&self, detail: String) -> SourceError {
        let detail = self
            .scrub
            .as_ref()
            .map(|s| s.scrub(&detail))
            .unwrap_or(detail);
        SourceError::Query {
            connection: self.connection.clone(),
            object: self.object.clone(),
            detail,
        }
    }

    /// The next bytes of the stream into the parser; false at its end.
    async fn fill(&mut self) -> Result<bool> {
        match self.stream.next().await {
            None => Ok(false),
            Some(Err(e)) => Err(self.stream_error(pg_error_text(&e))),
            Some(Ok(bytes)) => {
                self.parser.push(bytes);
                Ok(true)
            }
        }
    }

    /// Reads to the end of the stream after the trailer (the server's completion).
    async fn finish_stream(&mut self) -> Result<()> {
        while self.fill().await? {}
        self.exhausted = true;
        Ok(())
    }

    /// Decodes the tuple the parser holds into `builders` and keeps its watermark bytes.
    fn decode_tuple(&mut self, schema: &SourceSchema, builders: &mut [ColBuilder]) -> Result<()> {
        for (i, b) in builders.iter_mut().enumerate() {
            append_binary(b, &self.decoders[i], self.parser.field(i))
                .map_err(|e| self.value_error(schema, i, e))?;
        }
        for (k, &i) in self.wm_idx.iter().enumerate() {
            match (self.parser.field(i), &mut self.last_wm[k]) {
                (None, slot) => *slot = None,
                (Some(f), Some(kept)) => {
                    kept.clear();
                    kept.extend_from_slice(f);
                }
                (Some(f), slot) => *slot = Some(f.to_vec()),
            }
        }
        self.parser.consume();
        Ok(())
    }

    /// The watermark of the last row decoded.
    fn last_watermark(&self, schema: &SourceSchema) -> Result<Option<Watermark>> {
        if self.wm_idx.is_empty() {
            return Ok(None);
        }
        let mut values = Vec::new();
        for (k, &i) in self.wm_idx.iter().enumerate() {
            match watermark_value(&self.decoders[i], self.last_wm[k].as_deref())
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
        Ok(Some(Watermark {
            columns: self.wm_names.clone(),
            values,
        }))
    }

    pub async fn next_batch(
        &mut self,
        arrow: &SchemaRef,
        schema: &SourceSchema,
    ) -> Result<Option<(RecordBatch, Option<Watermark>)>> {
        if self.value_bytes.len() != schema.columns.len() {
            self.value_bytes = vec![self.batch_rows.min(1 << 16) * 8; schema.columns.len()];
        }
        let mut builders: Vec<ColBuilder> = schema
            .columns
            .iter()
            .zip(&self.value_bytes)
            .map(|(c, &bytes)| ColBuilder::with_value_bytes(&c.kind, self.batch_rows, bytes))
            .collect();
        let mut n = 0usize;
        while n < self.batch_rows && !self.exhausted {
            match self
                .parser
                .next_tuple(self.width)
                .map_err(|e| self.stream_error(e))?
            {
                Tuple::Row => {
                    self.decode_tuple(schema, &mut builders)?;
                    n += 1;
                }
                Tuple::End => self.finish_stream().await?,
                Tuple::Incomplete => {
                    if !self.fill().await? {
                        return Err(self.stream_error(
                            "the COPY stream ended inside a row or without its trailer".into(),
                        ));
                    }
                }
            }
        }
        if n == 0 {
            return Ok(None);
        }
        let wm = self.last_watermark(schema)?;
        // The next batch's text columns, sized as this one's (a little more).
        for (kept, b) in self.value_bytes.iter_mut().zip(&builders) {
            *kept = (*kept).max(b.value_bytes() + b.value_bytes() / 8);
        }
        let mut arrays = Vec::with_capacity(builders.len() + 5);
        for (i, b) in builders.iter_mut().enumerate() {
            arrays.push(b.finish().map_err(|e| self.value_error(schema, i, e))?);
        }
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
