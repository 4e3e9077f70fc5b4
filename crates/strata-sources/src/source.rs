//! Watermark (cursor) reads from PostgreSQL and MySQL / MariaDB: a [`Source`] connection
//! starts a backend's read and hands its batches out as a [`WatermarkReader`].

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::batch::SourceSchema;
use crate::conn::{ConnectionSpec, Resolved, SourceKind};
use crate::error::{Result, SourceError};
use crate::object::SourceObject;
use crate::read::WatermarkRead;
use crate::value::Watermark;
use crate::{mysql, pg};

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
        let (schema, inner, scanned) = match &self.pg {
            Some(client) => self.start_pg(client, read).await?,
            None => {
                // MySQL / MariaDB reads are always in watermark order.
                let (schema, batches) = mysql::start(&self.resolved, read).await?;
                (
                    schema,
                    ReaderInner::Ranges(pg::ranges::RangeQueue::one(batches)),
                    None,
                )
            }
        };
        Ok(WatermarkReader {
            arrow: schema.arrow_schema(),
            schema,
            ordered: scanned.is_none(),
            max: scanned.flatten(),
            rows: 0,
            inner,
        })
    }
}

/// A PostgreSQL read started: the columns read, where the batches come from, and for a
/// read in any order ([`pg::scan`]) the highest watermark of its rows (`Some(None)`: no
/// row has one).
type PgStart = (SourceSchema, ReaderInner, Option<Option<Watermark>>);

impl Source {
    /// A PostgreSQL read: described; a first load in any order of a table scanned as it
    /// lies on disk ([`pg::scan`]); else planned ([`pg::ranges::plan`]), then ranges read
    /// concurrently in one snapshot, or one COPY on this connection.
    async fn start_pg(
        &self,
        client: &Arc<tokio_postgres::Client>,
        read: &WatermarkRead,
    ) -> Result<PgStart> {
        let r = &self.resolved;
        let d = pg::read::describe_read(&**client, r, read).await?;
        let arrow = d.schema.arrow_schema();
        let scan = read.any_order
            && read.lower_bound.is_none()
            && matches!(read.object, SourceObject::Table(_));
        if scan {
            let layout = pg::scan::layout(client, r, read).await?;
            let (batches, max) = pg::scan::open(r, read, &d, &layout, arrow).await?;
            return Ok((d.schema, ReaderInner::Ranges(batches), Some(max)));
        }
        // Splitting is an optimization: a plan or a snapshot that cannot be had (statistics
        // of an odd type, a server refusing more connections or exported snapshots) leaves
        // the one query, which gives the same rows.
        let parallel = match pg::ranges::plan(client, r, read, &d).await {
            Ok(Some(plan)) => match pg::ranges::open(r, read, &d, &plan, arrow.clone()).await {
                Ok(ranges) => Some(ranges),
                Err(e) => {
                    tracing::warn!("{}: reading in one query: {e}", read.object.label());
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("{}: reading in one query: {e}", read.object.label());
                None
            }
        };
        let ranges = match parallel {
            Some(ranges) => ranges,
            None => {
                let select = pg::read::watermark_select(read, &d.schema, &[], true);
                let reader =
                    pg::read::PgRowReader::copy(client.clone(), r, read, &d, &select).await?;
                pg::ranges::RangeQueue::one(pg::ranges::spawn(reader, d.schema.clone(), arrow))
            }
        };
        Ok((d.schema, ReaderInner::Ranges(ranges), None))
    }
}

/// Where a reader's batches come from: read tasks, drained in order (one per range of a
/// parallel PostgreSQL read; one for a serial read).
enum ReaderInner {
    Ranges(pg::ranges::RangeQueue),
    Done,
}

/// A running watermark read. Memory stays bounded by the batch size: each read task decodes
/// at most a few batches ahead of the caller (`pg::ranges::READ_AHEAD_BATCHES` per range; the
/// server waits meanwhile).
pub struct WatermarkReader {
    schema: SourceSchema,
    arrow: SchemaRef,
    /// Batches come in watermark order (else `max` is the server's, set at the start).
    ordered: bool,
    max: Option<Watermark>,
    rows: u64,
    inner: ReaderInner,
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
            ReaderInner::Ranges(ranges) => ranges.next().await.transpose(),
        };
        match out {
            Ok(Some((batch, wm))) => {
                self.rows += batch.num_rows() as u64;
                if self.ordered && wm.is_some() {
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

    /// In watermark order: the watermark of the last row read so far (the maximum);
    /// `None` if no row was read. In any order: the highest watermark of all the rows the
    /// read will give, from the start. Store it after the batches are committed; give it
    /// back as [`LowerBound::after`] next run.
    pub fn max_watermark(&self) -> Option<&Watermark> {
        self.max.as_ref()
    }

    /// Whether batches come in watermark order. `false` for a read that asked for any
    /// order and got it ([`WatermarkRead::any_order`]): it can only be committed whole.
    pub fn in_watermark_order(&self) -> bool {
        self.ordered
    }

    /// Rows read so far.
    pub fn rows_read(&self) -> u64 {
        self.rows
    }
}
