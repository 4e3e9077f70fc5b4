//! Writing Delta tables: the Parquet settings strata writes with, appends (encoded on every
//! core for large inputs), new data files, and the two ways a commit is made: rows through
//! delta-rs's write builder ([`write_rows`]) and prepared actions ([`commit_actions`]), each
//! carrying a [`PendingCommit`].

use crate::error::{Context, EngineError, Result};
use crate::storage::commit::PendingCommit;
use crate::util::threads::{parallel_min_rows, parallelism};
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::parquet::basic::{Compression, Encoding};
use deltalake::datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use deltalake::datafusion::parquet::schema::types::ColumnPath;
use deltalake::kernel::transaction::CommitBuilder;
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::protocol::SaveMode;
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::writer::DeltaWriter;
use deltalake::writer::RecordBatchWriter;
use deltalake::DeltaTable;
use strata_sql::TableName;

/// `strata.parquet.compression`: the codec of the Parquet files strata writes into a table.
/// Snappy by default (what every Delta reader expects); strata's own event stores use
/// LZ4_RAW, which decodes about half again as fast at the same size.
pub(crate) const COMPRESSION_PROPERTY: &str = "strata.parquet.compression";

/// `strata.parquet.pageRows`: at most this many rows per Parquet data page (Parquet's
/// default, 20,000, when unset). strata's event stores use
/// 512 rows (`STORE_PAGE_ROWS` of the event store), so that a lookup by key reads few pages.
pub(crate) const PAGE_ROWS_PROPERTY: &str = "strata.parquet.pageRows";

/// `strata.parquet.plainColumns`: columns (comma-separated, any case) written in Parquet's
/// PLAIN encoding instead of through a dictionary. strata sets it on the AUTO CDC targets it
/// creates to their key and timeline columns, whose values are nearly all distinct: a
/// dictionary there saves no space, costs a hash of every value on write, and makes the read
/// of the key column that finds a batch's rows in the target (`storage/replace.rs`) go through it.
/// Files a [`FileStream`] writes locally also skip it for columns their first batch shows to
/// be nearly distinct (`storage/encoding.rs`).
pub(crate) const PLAIN_COLUMNS_PROPERTY: &str = "strata.parquet.plainColumns";

/// `strata.parquet.uncompressedColumns`: columns (comma-separated, any case) written without
/// the table's codec. For values that do not compress, such as random uuids as text
/// (Snappy leaves them at about 0.9 of their size): compressing them costs time, not space.
/// A database source sets it on the streaming tables it creates to their uuid columns.
pub(crate) const UNCOMPRESSED_COLUMNS_PROPERTY: &str = "strata.parquet.uncompressedColumns";

/// `strata.parquet.deltaColumns`: integer columns (comma-separated, any case; a listed
/// column of another type is ignored) written in Parquet's DELTA_BINARY_PACKED encoding,
/// without a dictionary and without the table's codec. strata sets it on the event stores
/// it creates to their integer key columns: a column sorted by key packs into a few bits a
/// value (a byte codec saves about 5% of a distinct sorted column, at the cost of a pass
/// over every byte on each write and read).
pub(crate) const DELTA_COLUMNS_PROPERTY: &str = "strata.parquet.deltaColumns";

/// `strata.parquet.pageStatisticsColumns`: when set, only these columns (comma-separated,
/// any case) keep statistics per data page (the column index); the others keep them per
/// column chunk (what Delta's file statistics are made from). strata sets it on the event
/// stores it creates to their key columns, the only ones a lookup by key consults
/// (`eventstore/pages.rs`): the minimum and maximum of every small page of every other
/// column cost time on each write and bytes in each file's page index.
pub(crate) const PAGE_STATISTICS_COLUMNS_PROPERTY: &str = "strata.parquet.pageStatisticsColumns";

/// The codecs [`COMPRESSION_PROPERTY`] accepts, in Spark's spelling.
const CODECS: &[&str] = &["snappy", "lz4_raw", "zstd", "gzip", "uncompressed"];

/// The Parquet codec named `value` (see [`CODECS`], any case; `none` is `uncompressed`).
pub(crate) fn parquet_codec(value: &str) -> Option<Compression> {
    Some(match value.trim().to_ascii_lowercase().as_str() {
        "snappy" => Compression::SNAPPY,
        "lz4_raw" => Compression::LZ4_RAW,
        "zstd" => Compression::ZSTD(Default::default()),
        "gzip" => Compression::GZIP(Default::default()),
        "uncompressed" | "none" => Compression::UNCOMPRESSED,
        _ => return None,
    })
}

/// A positive row count for [`PAGE_ROWS_PROPERTY`].
fn page_rows(value: &str) -> Option<usize> {
    value.trim().parse().ok().filter(|&n: &usize| n > 0)
}

/// Refuses an unknown [`COMPRESSION_PROPERTY`] or a bad [`PAGE_ROWS_PROPERTY`] in the
/// `TBLPROPERTIES` of `table`.
pub(crate) fn check_parquet_properties(
    table: &TableName,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    for (k, v) in properties {
        if k.eq_ignore_ascii_case(COMPRESSION_PROPERTY) && parquet_codec(v).is_none() {
            return Err(EngineError::plan(format!(
                "table {table}: {COMPRESSION_PROPERTY} = '{v}' is not a known codec; use one of {}",
                CODECS.join(", ")
            )));
        }
        if k.eq_ignore_ascii_case(PAGE_ROWS_PROPERTY) && page_rows(v).is_none() {
            return Err(EngineError::plan(format!(
                "table {table}: {PAGE_ROWS_PROPERTY} = '{v}' is not a positive number of rows"
            )));
        }
    }
    Ok(())
}

/// The Parquet writer settings for new files of `table`: its [`COMPRESSION_PROPERTY`] (else
/// Snappy), [`PAGE_ROWS_PROPERTY`], [`PLAIN_COLUMNS_PROPERTY`] and
/// [`UNCOMPRESSED_COLUMNS_PROPERTY`].
pub(crate) fn writer_properties(table: &DeltaTable) -> WriterProperties {
    let snapshot = table.snapshot().ok();
    let config = snapshot
        .map(|s| s.metadata().configuration().clone())
        .unwrap_or_default();
    let get = |name: &str| {
        config
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let codec = get(COMPRESSION_PROPERTY)
        .and_then(parquet_codec)
        .unwrap_or(Compression::SNAPPY);
    let mut props = WriterProperties::builder().set_compression(codec);
    if let Some(n) = get(PAGE_ROWS_PROPERTY).and_then(page_rows) {
        props = props
            .set_data_page_row_count_limit(n)
            .set_write_batch_size(n.min(1024));
    }
    if let Some(snapshot) = snapshot {
        let schema = snapshot.schema();
        for column in listed_columns(&schema, get(PLAIN_COLUMNS_PROPERTY)) {
            props = props.set_column_dictionary_enabled(column, false);
        }
        for column in listed_columns(&schema, get(UNCOMPRESSED_COLUMNS_PROPERTY)) {
            props = props.set_column_compression(column, Compression::UNCOMPRESSED);
        }
        let packed = listed_fields(&schema, get(DELTA_COLUMNS_PROPERTY))
            .into_iter()
            .filter(|f| is_integer(f));
        for column in packed.map(|f| ColumnPath::from(f.name().as_str())) {
            props = props
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column.clone(), Encoding::DELTA_BINARY_PACKED)
                .set_column_compression(column, Compression::UNCOMPRESSED);
        }
        if let Some(list) = get(PAGE_STATISTICS_COLUMNS_PROPERTY) {
            props = props.set_statistics_enabled(EnabledStatistics::Chunk);
            for column in listed_columns(&schema, Some(list)) {
                props = props.set_column_statistics_enabled(column, EnabledStatistics::Page);
            }
        }
    }
    props.build()
}

/// Whether `field` holds integers (what DELTA_BINARY_PACKED encodes).
fn is_integer(field: &deltalake::kernel::StructField) -> bool {
    use deltalake::kernel::{DataType, PrimitiveType};
    matches!(
        field.data_type(),
        DataType::Primitive(
            PrimitiveType::Long
                | PrimitiveType::Integer
                | PrimitiveType::Short
                | PrimitiveType::Byte
        )
    )
}

/// [`writer_properties`] of `table` for a file whose first batch is `first`: with the
/// dictionary off for the columns that batch shows it costs more than it saves, and the codec
/// off for those it would not shrink (`storage/encoding.rs`).
pub(crate) fn writer_properties_for(
    table: &DeltaTable,
    first: Option<&RecordBatch>,
) -> WriterProperties {
    let props = writer_properties(table);
    match first {
        Some(batch) => crate::storage::encoding::for_first_batch(props, batch),
        None => props,
    }
}

/// The columns of `schema` named in `list` (comma-separated, any case), in their own
/// spelling; a name the table lacks is ignored.
fn listed_columns(schema: &deltalake::kernel::StructType, list: Option<&str>) -> Vec<ColumnPath> {
    listed_fields(schema, list)
        .into_iter()
        .map(|f| ColumnPath::from(f.name().as_str()))
        .collect()
}

/// The fields of `schema` named in `list`, as [`listed_columns`] finds them.
fn listed_fields<'a>(
    schema: &'a deltalake::kernel::StructType,
    list: Option<&str>,
) -> Vec<&'a deltalake::kernel::StructField> {
    let Some(list) = list else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter_map(|name| {
            schema
                .fields()
                .find(|f| f.name().eq_ignore_ascii_case(name))
        })
        .collect()
}

/// Appends `batches`, and the data files already in the table's folder that `files` add,
/// to `table` in one commit, `commit`. Large inputs are cut into one range of rows per
/// core, each encoded to parquet by its own writer of a [`FileStream`] at the same time
/// (delta-rs encodes an unpartitioned write on one thread; a local table's files are
/// written as they are encoded, not built in memory first), and all files are committed
/// together.
pub(crate) async fn append(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
    files: Vec<deltalake::kernel::Add>,
    commit: &PendingCommit,
) -> Result<i64> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let parts = parallelism();
    if files.is_empty() && batches.is_empty() {
        // Nothing to add (a bulk load whose events fold to no rows): the commit still
        // records the positions.
        let operation = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: None,
            predicate: None,
        };
        return commit_actions(table, Vec::new(), operation, commit).await;
    }
    if files.is_empty() && (rows < parallel_min_rows() || parts == 1) {
        let written = write_rows(table.clone(), batches, RowChange::Append, commit)
            .await
            .context(|| format!("writing {}", table.table_url()))?;
        return Ok(written.version().map_or(-1, |v| v as i64));
    }
    let mut actions: Vec<Action> = files.into_iter().map(Action::Add).collect();
    actions.extend(
        write_side_by_side(table, batches, rows)
            .await?
            .into_iter()
            .map(Action::Add),
    );
    commit_actions(table, actions, append_operation(table)?, commit).await
}

/// The data files of an append of `batches` to `table`, written and not committed (see
/// [`commit_append`]): by one writer below [`parallel_min_rows`] rows, else as [`append`]
/// writes them. A caller that has other work to do before it may commit writes the files
/// meanwhile; files of an append never committed stay in no commit (a vacuum removes
/// them).
pub(crate) async fn stage_append(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
) -> Result<Vec<deltalake::kernel::Add>> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    match rows {
        0 => Ok(Vec::new()),
        _ if rows < parallel_min_rows() || parallelism() == 1 => write_files(table, batches).await,
        _ => write_side_by_side(table, batches, rows).await,
    }
}

/// Commits the files [`stage_append`] wrote to `table` as an append, in commit `commit`;
/// returns the table's new version.
pub(crate) async fn commit_append(
    table: &DeltaTable,
    files: Vec<deltalake::kernel::Add>,
    commit: &PendingCommit,
) -> Result<i64> {
    let actions = files.into_iter().map(Action::Add).collect();
    commit_actions(table, actions, append_operation(table)?, commit).await
}

/// The operation an append to `table` records.
fn append_operation(table: &DeltaTable) -> Result<DeltaOperation> {
    let partition_by: Vec<String> = table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .partition_columns()
        .to_vec();
    Ok(DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_by.is_empty()).then_some(partition_by),
        predicate: None,
    })
}

/// `batches` (`rows` rows) written to new data files of `table` by one writer per core, a
/// contiguous range of the rows each; nothing is committed.
async fn write_side_by_side(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
    rows: usize,
) -> Result<Vec<deltalake::kernel::Add>> {
    let parts = parallelism();
    // One contiguous group of rows per writer (each file then holds a range of the rows,
    // in order), handed over in slices of a row group side by side, without copying.
    let chunk = rows.div_ceil(parts).max(1);
    let mut groups: Vec<Vec<RecordBatch>> = vec![Vec::new()];
    let mut in_group = 0usize;
    for b in batches {
        let mut offset = 0;
        while offset < b.num_rows() {
            if in_group == chunk {
                groups.push(Vec::new());
                in_group = 0;
            }
            let take = (chunk - in_group)
                .min(b.num_rows() - offset)
                .min(STREAM_ROW_GROUP_ROWS);
            if let Some(g) = groups.last_mut() {
                g.push(b.slice(offset, take));
            }
            in_group += take;
            offset += take;
        }
    }
    let mut stream = FileStream::start(table)?;
    let mut groups: Vec<_> = groups.into_iter().map(Vec::into_iter).collect();
    let mut fed = true;
    while fed {
        fed = false;
        for (writer, group) in groups.iter_mut().enumerate() {
            if let Some(slice) = group.next() {
                stream.write_to(writer, slice).await?;
                fed = true;
            }
        }
    }
    stream.finish().await
}

/// Writes `batches` (in the table's layout) to new data files of `table` and returns their
/// `add` actions; nothing is committed.
pub(crate) async fn write_files(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
) -> Result<Vec<deltalake::kernel::Add>> {
    let what = || format!("writing {}", table.table_url());
    let mut writer = RecordBatchWriter::for_table(table)
        .context(what)?
        .with_writer_properties(writer_properties_for(table, batches.first()));
    for b in batches {
        writer.write(b).await.context(what)?;
    }
    writer.flush().await.context(what)
}

/// Batches a [`FileStream`] writer may hold before the caller waits.
const STREAM_QUEUE_BATCHES: usize = 2;

/// Rows per row group of the files a [`FileStream`] writes (Parquet's default is 1,048,576).
/// A writer holds its row group's encoded pages until the group is done; on the 10M-row
/// first-load benchmark a quarter of the default took the peak memory from about 375 to
/// 305 MiB, for 2% larger files (a dictionary per group) and no slower a load.
const STREAM_ROW_GROUP_ROWS: usize = 262_144;

/// Data files of `table` written while the rows still come: one writer per core, each fed
/// whole batches in turn and starting a new file at the table's target file size
/// (`delta.targetFileSize`). Nothing is committed: [`FileStream::finish`] gives the files'
/// `add` actions. Files of a stream that is dropped or fails stay in the table's folder,
/// in no commit (a vacuum removes them).
///
/// A local, unpartitioned table's files are encoded on threads of their own straight into
/// the file ([`write_local_files`]): memory holds a row group per writer
/// ([`STREAM_ROW_GROUP_ROWS`]). Other tables go
/// through delta-rs's writer, which builds each file in memory before it uploads it.
pub(crate) struct FileStream {
    feeds: Vec<tokio::sync::mpsc::Sender<RecordBatch>>,
    writers: Vec<tokio::task::JoinHandle<Result<Vec<deltalake::kernel::Add>>>>,
    next: usize,
    rows: usize,
}

impl FileStream {
    /// Starts the writers, in `table`'s layout and Parquet settings.
    pub(crate) fn start(table: &DeltaTable) -> Result<FileStream> {
        let what = || format!("writing {}", table.table_url());
        let target = table
            .snapshot()
            .context(|| "reading table state".into())?
            .table_config()
            .target_file_size()
            .get();
        let props = writer_properties(table)
            .into_builder()
            .set_max_row_group_row_count(Some(STREAM_ROW_GROUP_ROWS))
            .build();
        let local = match local_unpartitioned_dir(table)? {
            Some(dir) => Some((dir, crate::storage::table::table_schema(table)?)),
            None => None,
        };
        let mut feeds = Vec::new();
        let mut writers = Vec::new();
        for _ in 0..parallelism() {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(STREAM_QUEUE_BATCHES);
            feeds.push(tx);
            if let Some((dir, schema)) = &local {
                let (dir, schema, props) = (dir.clone(), schema.clone(), props.clone());
                writers.push(tokio::task::spawn_blocking(move || {
                    write_local_files(&dir, schema, props, target, rx)
                }));
                continue;
            }
            let mut writer = RecordBatchWriter::for_table(table)
                .context(what)?
                .with_writer_properties(props.clone())
                .with_target_file_size(target);
            let what = what();
            writers.push(tokio::spawn(async move {
                while let Some(batch) = rx.recv().await {
                    writer.write(batch).await.context(|| what.clone())?;
                }
                writer.flush().await.context(|| what.clone())
            }));
        }
        Ok(FileStream {
            feeds,
            writers,
            next: 0,
            rows: 0,
        })
    }

    /// Hands `batch` to the next writer (waiting while it is busy).
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let i = self.next;
        self.next += 1;
        self.write_to(i, batch).await
    }

    /// Hands `batch` to writer `i` (modulo their number; waiting while it is busy).
    async fn write_to(&mut self, i: usize, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let rows = batch.num_rows();
        let i = i % self.feeds.len();
        if self.feeds[i].send(batch).await.is_err() {
            // The writer has stopped: its error says why.
            let failed = self.writers.swap_remove(i);
            return Err(match failed.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => EngineError::internal("a file writer stopped early"),
                Err(e) => EngineError::internal(format!("a file writer failed: {e}")),
            });
        }
        self.rows += rows;
        Ok(())
    }

    /// The rows handed to the writers so far.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Finishes every file and returns their `add` actions.
    pub(crate) async fn finish(self) -> Result<Vec<deltalake::kernel::Add>> {
        drop(self.feeds);
        let mut adds = Vec::new();
        for w in self.writers {
            adds.extend(
                w.await
                    .map_err(|e| EngineError::internal(format!("a file writer failed: {e}")))??,
            );
        }
        Ok(adds)
    }
}

/// The folder of `table` when it is local, unpartitioned and without column mapping (its
/// files are then plain Parquet files of its columns, as [`write_local_files`] writes).
fn local_unpartitioned_dir(table: &DeltaTable) -> Result<Option<std::path::PathBuf>> {
    let url = table.table_url();
    if url.scheme() != "file" {
        return Ok(None);
    }
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let metadata = snapshot.metadata();
    let mapped = metadata
        .configuration()
        .get("delta.columnMapping.mode")
        .is_some_and(|m| !m.eq_ignore_ascii_case("none"));
    if !metadata.partition_columns().is_empty() || mapped {
        return Ok(None);
    }
    Ok(url.to_file_path().ok())
}

/// Writes the batches `rows` gives to new Parquet files in `dir` (a table's folder) with
/// `props`, starting a new file once one reaches `target` bytes; returns their `add`
/// actions, with statistics from the files' footers (`storage/adopt.rs`). Runs on a thread
/// of its own: encoding is the work.
fn write_local_files(
    dir: &std::path::Path,
    schema: deltalake::arrow::datatypes::SchemaRef,
    props: WriterProperties,
    target: u64,
    mut rows: tokio::sync::mpsc::Receiver<RecordBatch>,
) -> Result<Vec<deltalake::kernel::Add>> {
    use deltalake::datafusion::parquet::arrow::ArrowWriter;
    // The Parquet writer buffers its writes itself.
    type Open = (String, ArrowWriter<std::fs::File>);
    let codec = match props.compression(&ColumnPath::from("")) {
        Compression::UNCOMPRESSED => String::new(),
        c => format!(
            ".{}",
            c.to_string()
                .to_ascii_lowercase()
                .split('(')
                .next()
                .unwrap_or("")
        ),
    };
    let what = |name: &str| format!("writing {}", dir.join(name).display());
    let close = |(name, writer): Open| -> Result<deltalake::kernel::Add> {
        // Writes the footer and flushes what is buffered.
        let meta = writer.close().context(|| what(&name))?;
        let size = std::fs::metadata(dir.join(&name))
            .context(|| what(&name))?
            .len();
        let stats =
            crate::storage::adopt::stats(&meta, &schema, crate::storage::adopt::Bounds::Own)?;
        Ok(crate::storage::adopt::new_file_add(name, size, &stats))
    };
    let mut adds = Vec::new();
    let mut open: Option<Open> = None;
    while let Some(batch) = rows.blocking_recv() {
        let (name, writer) = match &mut open {
            Some(o) => o,
            None => {
                let name = format!("part-00000-{}-c000{codec}.parquet", uuid::Uuid::new_v4());
                let file = std::fs::File::create(dir.join(&name)).context(|| what(&name))?;
                // Columns the first batch shows to be nearly distinct skip the dictionary,
                // and those that would not shrink skip the codec.
                let props = crate::storage::encoding::for_first_batch(props.clone(), &batch);
                let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
                    .context(|| what(&name))?;
                open.insert((name, writer))
            }
        };
        let batch = if batch.schema() == schema {
            batch
        } else {
            crate::util::arrow::cast_batch(&batch, &schema)?
        };
        writer.write(&batch).context(|| what(name))?;
        if (writer.bytes_written() + writer.in_progress_size()) as u64 >= target {
            if let Some(o) = open.take() {
                adds.push(close(o)?);
            }
        }
    }
    if let Some(o) = open.take() {
        adds.push(close(o)?);
    }
    Ok(adds)
}

/// How the rows of one commit change its table.
pub(crate) enum RowChange {
    /// Added to the rows it has.
    Append,
    /// Added, and the table's schema takes the rows' new columns.
    AppendEvolving,
    /// The table's rows and schema replaced by these.
    Overwrite,
    /// The rows matching the predicate replaced by these.
    ReplaceWhere(deltalake::datafusion::prelude::Expr),
}

/// Writes `rows` to `table` in one commit, as `change` says, carrying `commit` (the run,
/// positions, commit info), with the table's Parquet settings: the one place a commit of
/// rows is made through delta-rs's write builder (prepared files and actions go through
/// [`commit_actions`]). The error is delta-rs's, for the caller to tell conflicts apart.
pub(crate) async fn write_rows(
    table: DeltaTable,
    rows: Vec<RecordBatch>,
    change: RowChange,
    commit: &PendingCommit,
) -> deltalake::DeltaResult<DeltaTable> {
    use deltalake::operations::write::SchemaMode;
    let props = writer_properties_for(&table, rows.first());
    let write = table
        .clone()
        .write(rows)
        .with_writer_properties(props)
        .with_commit_properties(commit.properties());
    match change {
        RowChange::Append => write.with_save_mode(SaveMode::Append),
        RowChange::AppendEvolving => write
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge),
        RowChange::Overwrite => write
            .with_save_mode(SaveMode::Overwrite)
            .with_schema_mode(SchemaMode::Overwrite),
        RowChange::ReplaceWhere(predicate) => write
            .with_save_mode(SaveMode::Overwrite)
            .with_replace_where(predicate),
    }
    .await
}

/// Commits `actions` to `table` (against the state it was loaded at) as one `operation`
/// as `commit`; returns the new version.
pub(crate) async fn commit_actions(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
    commit: &PendingCommit,
) -> Result<i64> {
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let done = CommitBuilder::from(commit.properties())
        .with_actions(actions)
        .build(Some(snapshot), table.log_store(), operation)
        .await
        .context(|| format!("committing to {}", table.table_url()))?;
    Ok(done.version() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::location::Location;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::parquet::file::reader::{FileReader, SerializedFileReader};
    use std::sync::Arc;

    /// A stream's files keep their row groups to [`STREAM_ROW_GROUP_ROWS`] rows, a column in
    /// `strata.parquet.uncompressedColumns` skips the table's codec, and distinct columns
    /// skip the dictionary.
    #[tokio::test]
    async fn streamed_files_cut_row_groups_and_honour_column_codecs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("copy", DataType::Int64, false),
        ]);
        let at = Location::parse(dir.path().to_str().expect("utf-8"), "table").expect("path");
        let conf = vec![(
            UNCOMPRESSED_COLUMNS_PROPERTY.to_string(),
            Some("COPY".to_string()),
        )];
        let table = crate::storage::table::create_delta(&at, "t", &schema, conf, None, vec![])
            .await
            .expect("create");
        let mut stream = FileStream::start(&table).expect("start");
        let schema = Arc::new(schema);
        let rows = STREAM_ROW_GROUP_ROWS as i64 + 1000;
        for part in 0..4 {
            let ids: Int64Array = (part * rows..(part + 1) * rows).collect();
            let ids = Arc::new(ids);
            let batch =
                RecordBatch::try_new(schema.clone(), vec![ids.clone(), ids]).expect("batch");
            stream.write(batch).await.expect("write");
        }
        let adds = stream.finish().await.expect("finish");

        let mut total = 0;
        for add in &adds {
            let file = std::fs::File::open(dir.path().join(&add.path)).expect("open");
            let reader = SerializedFileReader::new(file).expect("parquet");
            for rg in reader.metadata().row_groups() {
                assert!(rg.num_rows() as usize <= STREAM_ROW_GROUP_ROWS);
                let codecs: Vec<_> = rg.columns().iter().map(|c| c.compression()).collect();
                assert_eq!(codecs, [Compression::SNAPPY, Compression::UNCOMPRESSED]);
                // Distinct ids are written PLAIN from the start (`storage/encoding.rs`): no
                // dictionary page, where Parquet's fallback would have left one.
                assert!(rg
                    .columns()
                    .iter()
                    .all(|c| c.dictionary_page_offset().is_none()));
                total += rg.num_rows();
            }
        }
        assert_eq!(total, 4 * rows, "every row in some file");
    }

    /// Files written through delta-rs's writer (a batch's new target rows, small appends)
    /// decide per column from their first batch too: distinct ids go PLAIN, a column of a
    /// few values keeps its dictionary.
    #[tokio::test]
    async fn smaller_writes_skip_the_dictionary_of_distinct_columns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("few", DataType::Int64, false),
        ]);
        let at = Location::parse(dir.path().to_str().expect("utf-8"), "table").expect("path");
        let table = crate::storage::table::create_delta(&at, "t", &schema, vec![], None, vec![])
            .await
            .expect("create");
        let rows = 200_000i64;
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new((0..rows).collect::<Int64Array>()),
                Arc::new((0..rows).map(|i| i % 7).collect::<Int64Array>()),
            ],
        )
        .expect("batch");
        let adds = write_files(&table, vec![batch]).await.expect("write");
        assert!(!adds.is_empty());
        for add in &adds {
            let file = std::fs::File::open(dir.path().join(&add.path)).expect("open");
            let reader = SerializedFileReader::new(file).expect("parquet");
            for rg in reader.metadata().row_groups() {
                let dictionaries: Vec<bool> = rg
                    .columns()
                    .iter()
                    .map(|c| c.dictionary_page_offset().is_some())
                    .collect();
                assert_eq!(
                    dictionaries,
                    [false, true],
                    "id PLAIN, few with a dictionary"
                );
            }
        }
    }
}
