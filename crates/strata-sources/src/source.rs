//! Watermark (cursor) reads from PostgreSQL and MySQL / MariaDB.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::batch::{ColumnKind, SourceSchema};
use crate::conn::{ConnectionSpec, Resolved, SourceKind};
use crate::error::{Result, SourceError};
use crate::value::{LowerBound, Watermark};
use crate::{mysql, pg};

/// Default rows per batch (64 Ki).
pub const DEFAULT_BATCH_ROWS: usize = 65_536;

/// A table name, `schema.table` (PostgreSQL schema; MySQL database) or just `table` (the
/// connection's default schema / database). Names are taken as written (case-sensitive) and
/// always quoted in generated SQL; a part may be written double-quoted to contain a dot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    /// Schema (PostgreSQL) or database (MySQL); `None` = default.
    pub schema: Option<String>,
    /// Table name.
    pub name: String,
}

impl TableRef {
    /// A table in a schema.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        TableRef {
            schema: Some(schema.into()),
            name: name.into(),
        }
    }

    /// Parse `schema.table`, `table`, `"my.schema"."Table"`.
    pub fn parse(text: &str) -> std::result::Result<TableRef, String> {
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut chars = text.trim().chars().peekable();
        let mut quoted_part = false;
        while let Some(c) = chars.next() {
            match c {
                '"' | '`' => {
                    quoted_part = true;
                    let close = c;
                    loop {
                        match chars.next() {
                            Some(x) if x == close => {
                                if chars.peek() == Some(&close) {
                                    chars.next();
                                    cur.push(close);
                                } else {
                                    break;
                                }
                            }
                            Some(x) => cur.push(x),
                            None => return Err(format!("unclosed quote in table name '{text}'")),
                        }
                    }
                }
                '.' => {
                    parts.push(std::mem::take(&mut cur));
                    quoted_part = false;
                }
                c => cur.push(c),
            }
        }
        let _ = quoted_part;
        parts.push(cur);
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "'{text}' is not a table name (expected schema.table or table)"
            ));
        }
        match parts.len() {
            1 => Ok(TableRef {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.pop().unwrap_or_default();
                Ok(TableRef {
                    schema: parts.pop(),
                    name,
                })
            }
            _ => Err(format!(
                "'{text}' is not a table name (expected schema.table or table)"
            )),
        }
    }

    pub(crate) fn pg_sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", pg_ident(s), pg_ident(&self.name)),
            None => pg_ident(&self.name),
        }
    }

    pub(crate) fn mysql_sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", mysql_ident(s), mysql_ident(&self.name)),
            None => mysql_ident(&self.name),
        }
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

pub(crate) fn pg_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

pub(crate) fn mysql_ident(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// What to read: a table, or a query (its result columns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceObject {
    /// A table.
    Table(TableRef),
    /// A `SELECT` (no trailing semicolon needed); read as `SELECT ... FROM (query) AS q`.
    Query(String),
}

impl SourceObject {
    /// Parse a `schema.table` name.
    pub fn table(text: &str) -> Result<SourceObject> {
        TableRef::parse(text)
            .map(SourceObject::Table)
            .map_err(|detail| SourceError::Watermark { detail })
    }

    /// How errors name it.
    pub fn label(&self) -> String {
        match self {
            SourceObject::Table(t) => format!("table {t}"),
            SourceObject::Query(_) => "query".to_string(),
        }
    }

    pub(crate) fn query_body(q: &str) -> &str {
        q.trim().trim_end_matches(';').trim_end()
    }
}

/// A watermark (cursor) read: the rows whose watermark columns, compared as a tuple, are above
/// a lower bound, in watermark order.
#[derive(Clone, Debug)]
pub struct WatermarkRead {
    /// Table or query.
    pub object: SourceObject,
    /// One or more columns, compared as a tuple, in this order (ORDER BY them too). Rows with a
    /// NULL in any of them are never read.
    pub watermark_columns: Vec<String>,
    /// Columns to leave out (for example ones with types strata cannot map).
    pub exclude_columns: Vec<String>,
    /// `None`: read everything (first load).
    pub lower_bound: Option<LowerBound>,
    /// Rows per batch ([`DEFAULT_BATCH_ROWS`]).
    pub batch_rows: usize,
}

impl WatermarkRead {
    /// A read of everything, 64 Ki rows per batch.
    pub fn new(object: SourceObject, watermark_columns: Vec<String>) -> Self {
        WatermarkRead {
            object,
            watermark_columns,
            exclude_columns: vec![],
            lower_bound: None,
            batch_rows: DEFAULT_BATCH_ROWS,
        }
    }

    /// Leave these columns out.
    pub fn exclude(mut self, columns: Vec<String>) -> Self {
        self.exclude_columns = columns;
        self
    }

    /// Start at this bound.
    pub fn lower_bound(mut self, bound: Option<LowerBound>) -> Self {
        self.lower_bound = bound;
        self
    }

    /// Rows per batch (at least 1).
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows.max(1);
        self
    }
}

/// A connection to a source database for describing and watermark reads.
pub struct Source {
    resolved: Resolved,
    pg: Option<Arc<tokio_postgres::Client>>,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("spec", &self.resolved.spec)
            .finish()
    }
}

impl Source {
    /// Connect (resolving the password, see [`crate::conn`]).
    pub async fn connect(spec: &ConnectionSpec) -> Result<Source> {
        let resolved = Resolved::new(spec)?;
        let pg = match spec.kind {
            SourceKind::Postgres => Some(Arc::new(resolved.pg_connect().await?)),
            SourceKind::Mysql => {
                // Check now that the connection works; reads open their own.
                let conn = resolved.mysql_connect().await?;
                let _ = conn.disconnect().await;
                None
            }
        };
        Ok(Source { resolved, pg })
    }

    /// The connection spec (password prints as `***`).
    pub fn spec(&self) -> &ConnectionSpec {
        &self.resolved.spec
    }

    /// The columns of a table or query and their Arrow types, without `exclude` columns. An
    /// unsupported type is an error naming the column, unless excluded.
    pub async fn describe(
        &self,
        object: &SourceObject,
        exclude: &[String],
    ) -> Result<SourceSchema> {
        match &self.pg {
            Some(client) => Ok(
                pg::read::describe(&**client, &self.resolved, object, exclude)
                    .await?
                    .0,
            ),
            None => {
                let mut conn = self.resolved.mysql_connect().await?;
                let out = mysql::describe(&mut conn, &self.resolved, object, exclude).await;
                let _ = conn.disconnect().await;
                Ok(out?.0)
            }
        }
    }

    /// Start a watermark read; batches come from [`WatermarkReader::next_batch`].
    pub async fn read_watermark(&self, read: &WatermarkRead) -> Result<WatermarkReader> {
        if read.watermark_columns.is_empty() {
            return Err(SourceError::Watermark {
                detail: format!(
                    "{}: a watermark read needs at least one watermark column",
                    read.object.label()
                ),
            });
        }
        if let Some(lb) = &read.lower_bound {
            let w = &lb.watermark;
            let n = w.values.len();
            if n == 0
                || n > read.watermark_columns.len()
                || w.columns.len() < n
                || w.columns[..n] != read.watermark_columns[..n]
            {
                return Err(SourceError::Watermark {
                    detail: format!(
                        "{}: the stored watermark is over columns ({}) but the read's watermark columns are ({}); \
                         run a full refresh after changing the watermark columns",
                        read.object.label(),
                        w.columns.join(", "),
                        read.watermark_columns.join(", ")
                    ),
                });
            }
        }
        match &self.pg {
            Some(client) => pg::read::start(client.clone(), &self.resolved, read).await,
            None => mysql::start(&self.resolved, read).await,
        }
    }
}

pub(crate) enum ReaderInner {
    Pg(pg::read::PgRowReader),
    Channel(tokio::sync::mpsc::Receiver<Result<(RecordBatch, Option<Watermark>)>>),
    Done,
}

/// A running watermark read. Memory stays bounded by the batch size: rows are pulled from the
/// server as batches are taken.
pub struct WatermarkReader {
    pub(crate) schema: SourceSchema,
    pub(crate) arrow: SchemaRef,
    pub(crate) max: Option<Watermark>,
    pub(crate) rows: u64,
    pub(crate) inner: ReaderInner,
}

impl fmt::Debug for WatermarkReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatermarkReader")
            .field("object", &self.schema.object)
            .field("rows", &self.rows)
            .field("max", &self.max)
            .finish()
    }
}

impl WatermarkReader {
    /// The Arrow schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.arrow.clone()
    }

    /// The source columns read (names, source types, kinds).
    pub fn source_schema(&self) -> &SourceSchema {
        &self.schema
    }

    /// The next batch (at most `batch_rows` rows), or `None` at the end.
    pub async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let out = match &mut self.inner {
            ReaderInner::Done => return Ok(None),
            ReaderInner::Pg(r) => r.next_batch(&self.arrow, &self.schema).await,
            ReaderInner::Channel(rx) => match rx.recv().await {
                None => Ok(None),
                Some(Err(e)) => Err(e),
                Some(Ok(x)) => Ok(Some(x)),
            },
        };
        match out {
            Ok(Some((batch, wm))) => {
                self.rows += batch.num_rows() as u64;
                if wm.is_some() {
                    self.max = wm;
                }
                Ok(Some(batch))
            }
            Ok(None) => {
                self.inner = ReaderInner::Done;
                Ok(None)
            }
            Err(e) => {
                self.inner = ReaderInner::Done;
                Err(e)
            }
        }
    }

    /// The watermark of the last row read so far (the maximum, as rows come in watermark
    /// order); `None` if no row was read. Store it after the batches are committed; give it
    /// back as [`LowerBound::after`] next run.
    pub fn max_watermark(&self) -> Option<&Watermark> {
        self.max.as_ref()
    }

    /// Rows read so far.
    pub fn rows_read(&self) -> u64 {
        self.rows
    }
}

/// Check the watermark and excluded columns against the described columns.
pub(crate) fn check_columns(
    r: &Resolved,
    object: &SourceObject,
    all_names: &[String],
    schema: &SourceSchema,
    watermark: &[String],
    exclude: &[String],
) -> Result<Vec<usize>> {
    let available = || all_names.join(", ");
    for e in exclude {
        if !all_names.contains(e) {
            return Err(SourceError::NoSuchColumn {
                connection: r.name().to_string(),
                object: object.label(),
                column: e.clone(),
                available: available(),
                hint: "it was named as a column to exclude".into(),
            });
        }
    }
    let mut idx = Vec::new();
    for w in watermark {
        match schema.index_of(w) {
            Some(i) => {
                if matches!(schema.columns[i].kind, ColumnKind::Binary) {
                    return Err(SourceError::Watermark {
                        detail: format!("{}: watermark column '{w}' is binary; pick a number, date, timestamp or text column", object.label()),
                    });
                }
                idx.push(i)
            }
            None => {
                return Err(SourceError::NoSuchColumn {
                    connection: r.name().to_string(),
                    object: object.label(),
                    column: w.clone(),
                    available: available(),
                    hint: if exclude.contains(w) {
                        "a watermark column cannot be excluded".into()
                    } else {
                        "it was named as a watermark column".into()
                    },
                })
            }
        }
    }
    Ok(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(
            TableRef::parse("public.users").unwrap(),
            TableRef::new("public", "users")
        );
        assert_eq!(
            TableRef::parse("users").unwrap(),
            TableRef {
                schema: None,
                name: "users".into()
            }
        );
        assert_eq!(
            TableRef::parse("\"my.schema\".\"Odd\"\"Name\"").unwrap(),
            TableRef::new("my.schema", "Odd\"Name")
        );
        assert_eq!(
            TableRef::parse("`db`.`t`").unwrap(),
            TableRef::new("db", "t")
        );
        assert!(TableRef::parse("a.b.c").is_err());
        assert!(TableRef::parse("a.").is_err());
        assert!(TableRef::parse("\"a").is_err());
        assert_eq!(TableRef::new("s", "t\"x").pg_sql(), "\"s\".\"t\"\"x\"");
        assert_eq!(TableRef::new("s", "t`x").mysql_sql(), "`s`.`t``x`");
    }
}
