//! Reading and writing a table's data files where the table lives: a local folder through
//! `std::fs`, an object store (S3, Azure, GCS) through the table's own store.
//!
//! A reader of an object fetches what the Parquet reader will ask for before it asks, so
//! that a file costs two requests, not one per page: the file's tail (its footer, in one
//! ranged GET), then the column chunks of the columns read, in one vectored request
//! (`get_ranges`, which merges neighbouring ranges). The Parquet reader then reads from
//! those bytes.

use crate::error::{Context, EngineError, Result};
use crate::storage::location::store_error;
use bytes::Bytes;
use deltalake::datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use deltalake::datafusion::parquet::arrow::ProjectionMask;
use deltalake::datafusion::parquet::errors::{ParquetError, Result as ParquetResult};
use deltalake::datafusion::parquet::file::reader::{ChunkReader, Length};
use deltalake::logstore::object_store::{path::Path as StorePath, ObjectStoreExt, PutPayload};
use deltalake::logstore::ObjectStoreRef;
use deltalake::DeltaTable;
use std::ops::Range;
use std::path::PathBuf;

/// The bytes fetched from the end of an object at first: the footer of most files (its
/// metadata and the 8-byte trailer); a larger footer costs one more request.
const TAIL_BYTES: u64 = 64 * 1024;

/// Where a table's data files are.
#[derive(Clone)]
pub(crate) enum Root {
    /// A local folder.
    Local(PathBuf),
    /// An object store rooted at the table, and the runtime its requests run on (readers
    /// block on them from blocking threads).
    Store {
        store: ObjectStoreRef,
        url: String,
        runtime: tokio::runtime::Handle,
    },
}

impl Root {
    /// The place of `table`'s data files. Call from within the runtime.
    pub(crate) fn of(table: &DeltaTable) -> Root {
        match table.table_url().to_file_path() {
            Ok(dir) => Root::Local(dir),
            Err(()) => Root::Store {
                store: table.object_store(),
                url: table.table_url().to_string(),
                runtime: tokio::runtime::Handle::current(),
            },
        }
    }

    /// `path` (relative to the table, as its log names it) for messages.
    pub(crate) fn label(&self, path: &str) -> String {
        match self {
            Root::Local(dir) => dir.join(path).display().to_string(),
            Root::Store { url, .. } => format!("{}/{path}", url.trim_end_matches('/')),
        }
    }

    /// A reader of the data file `path`, `size` bytes long, of the top-level columns
    /// `columns` (all when `None`). Blocks: call from a blocking thread.
    pub(crate) fn reader(
        &self,
        path: &str,
        size: Option<u64>,
        columns: Option<&[&str]>,
        batch_rows: usize,
    ) -> Result<ParquetRecordBatchReader> {
        let what = || format!("reading {}", self.label(path));
        match self {
            Root::Local(dir) => {
                let file = std::fs::File::open(dir.join(path))
                    .context(|| format!("opening {}", self.label(path)))?;
                let builder = ParquetRecordBatchReaderBuilder::try_new(file).context(what)?;
                let mask = projection(
                    builder.schema(),
                    builder.parquet_schema(),
                    columns,
                    &self.label(path),
                )?;
                builder
                    .with_projection(mask)
                    .with_batch_size(batch_rows)
                    .build()
                    .context(what)
            }
            Root::Store { store, runtime, .. } => {
                let location = Self::location(path, what)?;
                let size = match size.filter(|&s| s > 0) {
                    Some(s) => s,
                    None => {
                        runtime
                            .block_on(store.head(&location))
                            .map_err(store_error)
                            .context(what)?
                            .size
                    }
                };
                let tail_start = size.saturating_sub(TAIL_BYTES);
                let tail = runtime
                    .block_on(store.get_range(&location, tail_start..size))
                    .map_err(store_error)
                    .context(what)?;
                let mut fetched = Fetched::new(size, vec![(tail_start, tail)]);
                let meta = match ArrowReaderMetadata::load(&fetched, ArrowReaderOptions::new()) {
                    Ok(meta) => meta,
                    Err(_) => {
                        // A footer larger than the tail fetched: its length is in the tail.
                        let whole = footer_range(&fetched, size).context(what)?;
                        let bytes = runtime
                            .block_on(store.get_range(&location, whole.clone()))
                            .map_err(store_error)
                            .context(what)?;
                        fetched.add(whole.start, bytes);
                        ArrowReaderMetadata::load(&fetched, ArrowReaderOptions::new())
                            .context(what)?
                    }
                };
                let mask = projection(
                    meta.schema(),
                    meta.parquet_schema(),
                    columns,
                    &self.label(path),
                )?;
                let ranges = column_ranges(meta.metadata(), &mask);
                let chunks = runtime
                    .block_on(store.get_ranges(&location, &ranges))
                    .map_err(store_error)
                    .context(what)?;
                for (at, bytes) in ranges.iter().map(|r| r.start).zip(chunks) {
                    fetched.add(at, bytes);
                }
                ParquetRecordBatchReaderBuilder::new_with_metadata(fetched, meta)
                    .with_projection(mask)
                    .with_batch_size(batch_rows)
                    .build()
                    .context(what)
            }
        }
    }

    /// The object-store location of the table's file `path` (`what`: the error's place).
    fn location(path: &str, what: impl FnOnce() -> String) -> Result<StorePath> {
        StorePath::from_url_path(path)
            .map_err(std::io::Error::other)
            .context(what)
    }

    /// `work` on a blocking thread, its I/O error placed by `what`.
    async fn blocking<T: Send + 'static>(
        work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
        what: impl FnOnce() -> String,
    ) -> Result<T> {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| EngineError::internal(format!("a file task failed: {e}")))?
            .context(what)
    }

    /// The bytes `range` of the table's file `path`.
    pub(crate) async fn get(&self, path: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        let what = || format!("reading {}", self.label(path));
        match self {
            Root::Local(dir) => {
                let file = dir.join(path);
                let read = move || read_range(&std::fs::File::open(&file)?, range);
                Self::blocking(read, what).await
            }
            Root::Store { store, .. } => store
                .get_range(&Self::location(path, what)?, range)
                .await
                .map_err(store_error)
                .context(what),
        }
    }

    /// Writes `bytes` as the new file `path` of the table (its folders made as needed).
    pub(crate) async fn put(&self, path: &str, bytes: Vec<u8>) -> Result<()> {
        let what = || format!("writing {}", self.label(path));
        match self {
            Root::Local(dir) => {
                let file = dir.join(path);
                let write = move || {
                    if let Some(parent) = file.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::write(&file, bytes)
                };
                Self::blocking(write, what).await
            }
            Root::Store { store, .. } => {
                store
                    .put(&Self::location(path, what)?, PutPayload::from(bytes))
                    .await
                    .map_err(store_error)
                    .context(what)?;
                Ok(())
            }
        }
    }
}

/// The bytes `range` of the open `file`, read into memory that is not zeroed first; a
/// range reaching past the end of the file is an error.
pub(crate) fn read_range(
    mut file: &std::fs::File,
    range: std::ops::Range<u64>,
) -> std::io::Result<Bytes> {
    use std::io::{Read, Seek, SeekFrom};
    let len = range.end.saturating_sub(range.start);
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(range.start))?;
    file.take(len).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "bytes {}..{} lie past the end of the file",
                range.start, range.end
            ),
        ));
    }
    Ok(Bytes::from(bytes))
}

/// One data file of a table: where the table lives, its path as the log names it, and its
/// size when the log records it.
#[derive(Clone)]
pub(crate) struct DataFile {
    pub(crate) root: Root,
    pub(crate) path: String,
    pub(crate) size: Option<u64>,
}

impl DataFile {
    pub(crate) fn new(root: &Root, path: &str, size: Option<i64>) -> DataFile {
        DataFile {
            root: root.clone(),
            path: path.to_string(),
            size: size.and_then(|s| u64::try_from(s).ok()),
        }
    }

    /// The file's place, for messages.
    pub(crate) fn label(&self) -> String {
        self.root.label(&self.path)
    }

    /// A reader of its top-level columns `columns` (all when `None`). Blocks.
    pub(crate) fn reader(
        &self,
        columns: Option<&[&str]>,
        batch_rows: usize,
    ) -> Result<ParquetRecordBatchReader> {
        self.root.reader(&self.path, self.size, columns, batch_rows)
    }
}

/// The reader's view of the top-level columns `columns` (all when `None`) of a file whose
/// schema is `arrow` (as Parquet: `parquet`).
fn projection(
    arrow: &deltalake::arrow::datatypes::SchemaRef,
    parquet: &deltalake::datafusion::parquet::schema::types::SchemaDescriptor,
    columns: Option<&[&str]>,
    label: &str,
) -> Result<ProjectionMask> {
    let Some(names) = columns else {
        return Ok(ProjectionMask::all());
    };
    let roots: Vec<usize> = names
        .iter()
        .map(|n| {
            arrow
                .index_of(n)
                .map_err(|_| EngineError::internal(format!("{label} has no column {n}")))
        })
        .collect::<Result<_>>()?;
    Ok(ProjectionMask::roots(parquet, roots))
}

/// The byte ranges of the column chunks `mask` reads, in every row group.
fn column_ranges(
    meta: &deltalake::datafusion::parquet::file::metadata::ParquetMetaData,
    mask: &ProjectionMask,
) -> Vec<Range<u64>> {
    let mut ranges = Vec::new();
    for group in meta.row_groups() {
        for (leaf, column) in group.columns().iter().enumerate() {
            if mask.leaf_included(leaf) {
                let (start, len) = column.byte_range();
                ranges.push(start..start + len);
            }
        }
    }
    ranges
}

/// The range of a file's footer (metadata and trailer), from its trailer in `fetched`.
fn footer_range(fetched: &Fetched, size: u64) -> ParquetResult<Range<u64>> {
    // The trailer: the metadata's length (4 bytes, little-endian), then `PAR1`.
    let trailer = fetched.get_bytes(size.saturating_sub(8), 8)?;
    let length: [u8; 4] = trailer[..4]
        .try_into()
        .map_err(|_| ParquetError::General("a short footer".into()))?;
    let metadata_len = u64::from(u32::from_le_bytes(length));
    Ok(size.saturating_sub(metadata_len + 8)..size)
}

/// Parts of a file or object read ahead, served to the Parquet reader; a read outside them
/// is an error, not other bytes.
#[derive(Clone)]
pub(crate) struct Fetched {
    size: u64,
    /// (offset in the object, bytes)
    pieces: Vec<(u64, Bytes)>,
}

impl Fetched {
    /// `pieces` (offset, bytes) of a file of `size` bytes.
    pub(crate) fn new(size: u64, mut pieces: Vec<(u64, Bytes)>) -> Fetched {
        pieces.sort_by_key(|(at, _)| *at);
        Fetched { size, pieces }
    }

    /// Adds the piece `bytes` at offset `at`, keeping the pieces in order.
    fn add(&mut self, at: u64, bytes: Bytes) {
        let i = self.pieces.partition_point(|(p, _)| *p <= at);
        self.pieces.insert(i, (at, bytes));
    }

    /// The fetched bytes from `start` to the end of the piece holding it: the last piece
    /// starting at or before `start` (the pieces are in order; a read of thousands of pages
    /// looks each up), else any piece holding it (pieces may overlap).
    fn from(&self, start: u64) -> ParquetResult<Bytes> {
        let holds = |(at, b): &&(u64, Bytes)| *at <= start && start < at + b.len() as u64;
        let i = self.pieces.partition_point(|(at, _)| *at <= start);
        i.checked_sub(1)
            .and_then(|i| self.pieces.get(i))
            .filter(|p| holds(p))
            .or_else(|| self.pieces.iter().find(holds))
            .map(|(at, b)| b.slice((start - at) as usize..))
            .ok_or_else(|| {
                ParquetError::General(format!(
                    "byte {start} of the file was not read ahead (a reader asked for more than \
                     its columns)"
                ))
            })
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> ParquetResult<Self::T> {
        use bytes::Buf;
        Ok(self.from(start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> ParquetResult<Bytes> {
        let rest = self.from(start)?;
        if rest.len() < length {
            return Err(ParquetError::General(format!(
                "bytes {start}..{} of the file were not read ahead",
                start + length as u64
            )));
        }
        Ok(rest.slice(..length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetched_pieces_serve_reads_inside_them_only() {
        let f = Fetched::new(
            100,
            vec![
                (10, Bytes::from_static(b"abcdef")),
                (90, Bytes::from(vec![7u8; 10])),
            ],
        );
        assert_eq!(f.get_bytes(12, 3).expect("inside").as_ref(), b"cde");
        assert_eq!(f.get_bytes(95, 5).expect("tail").as_ref(), &[7u8; 5]);
        assert!(f.get_bytes(14, 4).is_err(), "runs past its piece");
        assert!(f.get_bytes(50, 1).is_err(), "not fetched");
        let mut read = String::new();
        std::io::Read::read_to_string(&mut f.get_read(13).expect("read"), &mut read).expect("utf8");
        assert_eq!(read, "def");
    }
}
