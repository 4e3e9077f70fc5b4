//! Where tables live and how they are opened.
//!
//! ```text
//!   <warehouse>/<schema>/<table>/_delta_log          user-visible Delta tables
//!   <warehouse>/_strata/<schema>/<table>/events      event store of an AUTO CDC target
//! ```
//!
//! Folders starting with `_` or `.` at the top level are strata's own and are not tables.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::Schema;
use deltalake::datafusion::execution::context::SessionContext;
use deltalake::datafusion::parquet::basic::Compression;
use deltalake::datafusion::parquet::file::properties::WriterProperties;
use deltalake::datafusion::parquet::schema::types::ColumnPath;
use deltalake::datafusion::prelude::SessionConfig;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, StructType};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use strata_sql::TableName;

/// A folder of Delta tables.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: PathBuf,
    /// The events of the rows a streaming table was just appended, kept for the flows that
    /// read them next in the same process (see [`Warehouse::keep_appended`]).
    appended: Arc<Mutex<HashMap<PathBuf, Appended>>>,
    /// The event log as this process last committed to it (see `event_log::append`), so
    /// that a run's records do not each open it again.
    event_log: Arc<Mutex<Option<DeltaTable>>>,
}

/// One append to a streaming table, as committed.
#[derive(Debug)]
struct Appended {
    /// The table's version before the append, `None` if it held no data files then.
    before: Option<i64>,
    /// The version the append committed.
    after: i64,
    /// Per reading flow (by name), the events it derives from the rows appended.
    events: HashMap<String, Vec<RecordBatch>>,
}

impl Warehouse {
    /// Opens (and creates, if missing) the warehouse folder.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref();
        std::fs::create_dir_all(root)
            .context(|| format!("cannot create warehouse folder {}", root.display()))?;
        let root = std::fs::canonicalize(root)
            .context(|| format!("cannot open warehouse folder {}", root.display()))?;
        Ok(Warehouse {
            root,
            appended: Arc::default(),
            event_log: Arc::default(),
        })
    }

    /// Keeps, per flow that reads the table at `path`, the events it derives from the rows
    /// just appended (committed as version `after`; `before`: the version before, `None` if
    /// the table had no data files), so that the flow, when its unread input is exactly
    /// those rows, takes them from memory instead of reading back and evaluating the files
    /// just written. A newer append replaces what was kept.
    pub(crate) fn keep_appended(
        &self,
        path: &Path,
        before: Option<i64>,
        after: i64,
        events: HashMap<String, Vec<RecordBatch>>,
    ) {
        if let Ok(mut kept) = self.appended.lock() {
            kept.insert(
                path.to_path_buf(),
                Appended {
                    before,
                    after,
                    events,
                },
            );
        }
    }

    /// Takes the event log handle this process last committed with, if any.
    pub(crate) fn take_event_log(&self) -> Option<DeltaTable> {
        self.event_log.lock().ok().and_then(|mut t| t.take())
    }

    /// Keeps `table` as the event log handle for the next record.
    pub(crate) fn keep_event_log(&self, table: DeltaTable) {
        if let Ok(mut kept) = self.event_log.lock() {
            *kept = Some(table);
        }
    }

    /// Drops everything kept by [`Warehouse::keep_appended`].
    pub(crate) fn forget_appended(&self) {
        if let Ok(mut kept) = self.appended.lock() {
            kept.clear();
        }
    }

    /// The events kept by [`Warehouse::keep_appended`] for `flow` reading the table at
    /// `path`, if they come from exactly its rows added after version `from` (`None`: from
    /// the start) up to `now`. They are handed over once; a later read goes to the files.
    pub(crate) fn take_appended(
        &self,
        path: &Path,
        flow: &str,
        from: Option<i64>,
        now: i64,
    ) -> Option<Vec<RecordBatch>> {
        let mut kept = self.appended.lock().ok()?;
        let a = kept.get_mut(path)?;
        if a.after != now || a.before != from {
            return None;
        }
        a.events.remove(flow)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn table_path(&self, name: &TableName) -> PathBuf {
        self.root.join(&name.schema).join(&name.name)
    }

    /// Where strata keeps its own state of table `name` (event store, caches):
    /// `_strata/<schema>/<name>`.
    fn state_path(&self, name: &TableName) -> PathBuf {
        self.root
            .join("_strata")
            .join(&name.schema)
            .join(&name.name)
    }

    /// The event store of the AUTO CDC target `name`.
    pub fn event_store_path(&self, name: &TableName) -> PathBuf {
        self.state_path(name).join("events")
    }

    /// The cached record of the input files the streaming table `name` has taken (`taken.rs`).
    pub fn taken_cache_path(&self, name: &TableName) -> PathBuf {
        self.state_path(name).join("taken")
    }

    /// Every table of the warehouse, sorted.
    pub fn list_tables(&self) -> Result<Vec<TableName>> {
        let mut out = Vec::new();
        for schema in read_dir_sorted(&self.root)? {
            let Some(schema_name) = visible_dir_name(&schema) else {
                continue;
            };
            for table in read_dir_sorted(&schema)? {
                let Some(table_name) = visible_dir_name(&table) else {
                    continue;
                };
                if table.join("_delta_log").is_dir() {
                    out.push(TableName::new(Some(&schema_name), &table_name));
                }
            }
        }
        Ok(out)
    }

    /// Opens an existing table; `None` if there is no Delta table at its path.
    pub async fn open_table(&self, name: &TableName) -> Result<Option<DeltaTable>> {
        open_delta(&self.table_path(name)).await
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    Ok(entries)
}

fn visible_dir_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    (path.is_dir() && !name.starts_with('_') && !name.starts_with('.')).then(|| name.to_string())
}

pub(crate) fn table_url(path: &Path) -> Result<url::Url> {
    std::fs::create_dir_all(path).context(|| format!("cannot create {}", path.display()))?;
    url::Url::from_directory_path(path)
        .map_err(|_| EngineError::Internal(format!("not an absolute path: {}", path.display())))
}

/// Opens the Delta table at `path`, `None` if there is none yet.
pub(crate) async fn open_delta(path: &Path) -> Result<Option<DeltaTable>> {
    if !path.join("_delta_log").is_dir() {
        return Ok(None);
    }
    let url = table_url(path)?;
    let table = deltalake::open_table(url)
        .await
        .context(|| format!("cannot open Delta table {}", path.display()))?;
    Ok(Some(table))
}

/// The properties (Delta configuration) of `table`: `strata.keys`, `strata.scdType`, the
/// timeline convention, and whatever `TBLPROPERTIES` set.
pub(crate) fn table_properties(table: &DeltaTable) -> Result<HashMap<String, String>> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .configuration()
        .clone())
}

/// `strata.parquet.compression`: the codec of the Parquet files strata writes into a table.
/// Snappy by default (what every Delta reader expects); strata's own event stores use
/// LZ4_RAW, which decodes about half again as fast at the same size.
pub(crate) const COMPRESSION_PROPERTY: &str = "strata.parquet.compression";

/// `strata.parquet.pageRows`: at most this many rows per Parquet data page (Parquet's
/// default, 20,000, when unset). strata's event stores use
/// [`crate::store::STORE_PAGE_ROWS`], so that a lookup by key reads few pages.
pub(crate) const PAGE_ROWS_PROPERTY: &str = "strata.parquet.pageRows";

/// `strata.parquet.plainColumns`: columns (comma-separated, any case) written in Parquet's
/// PLAIN encoding instead of through a dictionary. strata sets it on the AUTO CDC targets it
/// creates to their key and timeline columns, whose values are nearly all distinct: a
/// dictionary there saves no space, costs a hash of every value on write, and makes the read
/// of the key column that finds a batch's rows in the target (`rewrite.rs`) go through it.
pub(crate) const PLAIN_COLUMNS_PROPERTY: &str = "strata.parquet.plainColumns";

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
            return Err(EngineError::Plan(format!(
                "table {table}: {COMPRESSION_PROPERTY} = '{v}' is not a known codec; use one of {}",
                CODECS.join(", ")
            )));
        }
        if k.eq_ignore_ascii_case(PAGE_ROWS_PROPERTY) && page_rows(v).is_none() {
            return Err(EngineError::Plan(format!(
                "table {table}: {PAGE_ROWS_PROPERTY} = '{v}' is not a positive number of rows"
            )));
        }
    }
    Ok(())
}

/// The Parquet writer settings for new files of `table`: its [`COMPRESSION_PROPERTY`] (else
/// Snappy), [`PAGE_ROWS_PROPERTY`] and [`PLAIN_COLUMNS_PROPERTY`].
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
    if let (Some(list), Some(snapshot)) = (get(PLAIN_COLUMNS_PROPERTY), snapshot) {
        let schema = snapshot.schema();
        for name in list.split(',').map(str::trim) {
            // The column's own spelling; a name the table lacks is ignored.
            if let Some(f) = schema
                .fields()
                .find(|f| f.name().eq_ignore_ascii_case(name))
            {
                props =
                    props.set_column_dictionary_enabled(ColumnPath::from(f.name().as_str()), false);
            }
        }
    }
    props.build()
}

/// Table properties as written in `TBLPROPERTIES`, plus the change data feed that every
/// strata table has enabled (R12), as Delta configuration entries.
pub(crate) fn table_configuration<'a>(
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<(String, Option<String>)> {
    let mut conf: Vec<(String, Option<String>)> = properties
        .into_iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    conf.push((
        "delta.enableChangeDataFeed".to_string(),
        Some("true".to_string()),
    ));
    conf
}

/// Whether `properties` (as written in `TBLPROPERTIES`) set `name`, in any case.
pub(crate) fn sets_property(
    properties: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> bool {
    properties.keys().any(|k| k.eq_ignore_ascii_case(name))
}

/// Creates an empty Delta table at `path`. Properties outside Delta's own (`strata.*`,
/// `pipelines.*`) are kept as written.
pub(crate) async fn create_delta(
    path: &Path,
    name: &str,
    schema: &Schema,
    configuration: Vec<(String, Option<String>)>,
    comment: Option<&str>,
    partition_columns: Vec<String>,
) -> Result<DeltaTable> {
    let url = table_url(path)?;
    let handle = DeltaTableBuilder::from_url(url)
        .and_then(|b| b.build())
        .context(|| format!("cannot open {}", path.display()))?;
    let st: StructType = schema
        .try_into_kernel()
        .map_err(|e| EngineError::Internal(format!("schema not representable in Delta: {e}")))?;
    let mut create = handle
        .create()
        .with_table_name(name)
        .with_columns(st.fields().cloned())
        .with_configuration(configuration)
        .with_partition_columns(partition_columns)
        .with_raise_if_key_not_exists(false);
    if let Some(c) = comment {
        create = create.with_comment(c);
    }
    match create.await {
        Ok(table) => Ok(table),
        // Another writer created the table at the same moment: a lost race, which the
        // dataset's run settles by starting again on the table as it now is.
        Err(source) if path.join("_delta_log").join(FIRST_COMMIT).exists() => {
            Err(EngineError::Conflict {
                context: format!("creating Delta table {}", path.display()),
                source: Box::new(source),
            })
        }
        Err(e) => Err(e).context(|| format!("cannot create Delta table {}", path.display())),
    }
}

/// The commit file of a table's version 0.
const FIRST_COMMIT: &str = "00000000000000000000.json";

/// A DataFusion session with strata's settings: identifiers keep their case as written (so
/// `sequenceNum` means the column `sequenceNum`), and the default schema is `default`.
pub fn new_session() -> SessionContext {
    new_session_in(TableName::DEFAULT_SCHEMA)
}

/// [`new_session`] whose unqualified table names are in `schema`.
pub(crate) fn new_session_in(schema: &str) -> SessionContext {
    SessionContext::new_with_config(session_config(schema))
}

fn session_config(schema: &str) -> SessionConfig {
    let mut config = SessionConfig::new()
        .with_default_catalog_and_schema("strata", schema)
        .with_create_default_catalog_and_schema(true)
        .with_information_schema(true);
    config.options_mut().sql_parser.enable_ident_normalization = false;
    config
}

/// A session for reading input files: their strings decode straight into the string type
/// tables store, instead of into string views that every row is then copied out of (for a
/// 10M-row snapshot file, about a third less memory and time).
pub(crate) fn file_session() -> SessionContext {
    let mut config = session_config(TableName::DEFAULT_SCHEMA);
    config
        .options_mut()
        .execution
        .parquet
        .schema_force_view_types = false;
    SessionContext::new_with_config(config)
}

/// Below this many rows a write encodes its parquet on one thread, and a fold runs on one
/// thread. `STRATA_PARALLEL_MIN_ROWS` overrides it (the golden scenarios set it to 1 so that
/// the parallel paths run on their small inputs too).
pub(crate) fn parallel_min_rows() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("STRATA_PARALLEL_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500_000)
    })
}

/// Threads for work over `rows` rows: one below [`parallel_min_rows`], else one per core.
pub(crate) fn threads_for(rows: usize) -> usize {
    if rows < parallel_min_rows() {
        1
    } else {
        parallelism()
    }
}

/// The clock of the timed logs of one piece of work for flow (or ingestion) `flow`, written
/// with [`step!`]: each logs what was just done, prefixed by `scope` (`"fold: "`, or `""`),
/// with the time since the work started and the process's resident memory.
pub(crate) struct Steps<'a> {
    pub(crate) flow: &'a str,
    pub(crate) scope: &'static str,
    start: std::time::Instant,
}

impl<'a> Steps<'a> {
    pub(crate) fn new(flow: &'a str, scope: &'static str) -> Self {
        Steps {
            flow,
            scope,
            start: std::time::Instant::now(),
        }
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// `step!(level, steps, what)`: logs step `what` of [`Steps`] `steps` at `level` (`info`
/// for the phases of a flow run, `debug` for the steps inside them), under the caller's
/// module.
macro_rules! step {
    ($level:ident, $steps:expr, $what:expr) => {
        tracing::$level!(
            flow = %$steps.flow,
            elapsed_ms = $steps.elapsed_ms(),
            rss_mib = $crate::warehouse::rss_mib(),
            "{}{}",
            $steps.scope,
            $what
        )
    };
}
pub(crate) use step;

/// The process's resident memory in MiB, for phase logs (`None` where `/proc` is missing).
pub(crate) fn rss_mib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096 / (1 << 20))
}

/// How many threads parallel work uses: the cores, at most 8.
pub(crate) fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

/// `work` on every item, one scoped thread per item (on the calling thread when there is
/// only one), results in item order. A thread that panics becomes an internal error naming
/// `what` it did.
pub(crate) fn on_threads<T: Send, R: Send>(
    items: Vec<T>,
    what: &str,
    work: impl Fn(T) -> R + Sync,
) -> Result<Vec<R>> {
    if items.len() <= 1 {
        return Ok(items.into_iter().map(work).collect());
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || work(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| EngineError::Internal(format!("a {what} thread panicked")))
            })
            .collect()
    })
}

/// Appends `batches`, and the data files already in the table's folder that `files` add,
/// to `table` in one commit carrying `commit`. Large inputs are cut into one slice per core,
/// each encoded to parquet by its own writer at the same time (delta-rs encodes an
/// unpartitioned write on one thread), and all files are committed together.
pub(crate) async fn append(
    table: &DeltaTable,
    batches: Vec<RecordBatch>,
    files: Vec<deltalake::kernel::Add>,
    commit: CommitProperties,
) -> Result<i64> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let parts = parallelism();
    if files.is_empty() && (rows < parallel_min_rows() || parts == 1 || batches.is_empty()) {
        let written = table
            .clone()
            .write(batches)
            .with_writer_properties(writer_properties(table))
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(commit)
            .await
            .context(|| format!("writing {}", table.table_url()))?;
        return Ok(written.version().map_or(-1, |v| v as i64));
    }
    // One group of whole batches (cut where needed) per writer, in order, without copying.
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
            let take = (chunk - in_group).min(b.num_rows() - offset);
            if let Some(g) = groups.last_mut() {
                g.push(b.slice(offset, take));
            }
            in_group += take;
            offset += take;
        }
    }
    let mut writers = Vec::new();
    for group in groups.into_iter().filter(|g| !g.is_empty()) {
        let table = table.clone();
        writers.push(tokio::spawn(
            async move { write_files(&table, group).await },
        ));
    }
    let mut actions: Vec<Action> = files.into_iter().map(Action::Add).collect();
    for w in writers {
        let adds = w
            .await
            .map_err(|e| EngineError::Internal(format!("a writer task failed: {e}")))??;
        actions.extend(adds.into_iter().map(Action::Add));
    }
    let partition_by: Vec<String> = table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .partition_columns()
        .to_vec();
    let operation = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_by.is_empty()).then_some(partition_by),
        predicate: None,
    };
    commit_actions(table, actions, operation, commit).await
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
        .with_writer_properties(writer_properties(table));
    for b in batches {
        writer.write(b).await.context(what)?;
    }
    writer.flush().await.context(what)
}

/// Commits `actions` to `table` (against the state it was loaded at) as one `operation`
/// carrying `commit`; returns the new version.
pub(crate) async fn commit_actions(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
    commit: CommitProperties,
) -> Result<i64> {
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let done = CommitBuilder::from(commit)
        .with_actions(actions)
        .build(Some(snapshot), table.log_store(), operation)
        .await
        .context(|| format!("committing to {}", table.table_url()))?;
    Ok(done.version() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field};
    use std::sync::Arc;

    /// Events kept after an append are handed over only to their flow, when its unread
    /// input is exactly that append, only once, and not after the run forgets them.
    #[test]
    fn appended_events_go_to_their_flow_reading_exactly_that_append() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wh = Warehouse::open(dir.path()).expect("warehouse");
        let path = dir.path().join("default/t");
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let rows = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))])
            .expect("batch");
        let events = || {
            HashMap::from([
                ("f".to_string(), vec![rows.clone()]),
                ("g".to_string(), vec![rows.slice(0, 1)]),
            ])
        };
        let keep = || wh.keep_appended(&path, Some(3), 4, events());
        keep();
        // A reader that last read version 2 (or the start), or a table now at version 5,
        // would miss rows: it reads the files.
        assert!(wh.take_appended(&path, "f", Some(2), 4).is_none());
        assert!(wh.take_appended(&path, "f", None, 4).is_none());
        assert!(wh.take_appended(&path, "f", Some(3), 5).is_none());
        assert!(wh
            .take_appended(&dir.path().join("default/u"), "f", Some(3), 4)
            .is_none());
        assert!(
            wh.take_appended(&path, "h", Some(3), 4).is_none(),
            "not its flow"
        );
        let taken = wh
            .take_appended(&path, "f", Some(3), 4)
            .expect("handed over");
        assert_eq!(taken[0].num_rows(), 2);
        assert!(
            wh.take_appended(&path, "f", Some(3), 4).is_none(),
            "taken once"
        );
        let other = wh.take_appended(&path, "g", Some(3), 4).expect("its own");
        assert_eq!(other[0].num_rows(), 1);
        keep();
        wh.forget_appended();
        assert!(
            wh.take_appended(&path, "f", Some(3), 4).is_none(),
            "forgotten"
        );
        // A table that had no data files before the append: a reader from the start.
        wh.keep_appended(&path, None, 1, events());
        assert!(wh.take_appended(&path, "f", Some(0), 1).is_none());
        assert!(wh.take_appended(&path, "f", None, 1).is_some());
    }
}
