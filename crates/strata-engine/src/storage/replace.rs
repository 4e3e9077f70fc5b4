//! Replacing the rows of some keys of a Delta table in one commit, rewriting only the files
//! that hold them.
//!
//! ```text
//!   every data file ──read its key columns──▶ holds a replaced key? ──no──▶ kept as it is
//!                                                   │ yes
//!                                                   ▼
//!                      read it whole, drop the replaced keys' rows, write the rest to new
//!                      files (one writer per core, side by side, each taking several
//!                      files' rows); the new rows go with the first
//!   _change_data/      the replaced rows as `delete`, the new rows as `insert`
//!   one commit:        remove + add per rewritten file, add of the new rows, the change
//!                      file, and the caller's application transactions
//! ```
//!
//! delta-rs's `replace_where` and MERGE find the files to rewrite with one scan, rewrite them
//! with another and derive the change feed with a third, on one thread per file. Here the
//! caller already knows the rows that go (the fold derived them) and the rows that come, so
//! each file is read once and the change feed is written from memory. Files are read and
//! written where the table lives (`storage/data_file.rs`: a local folder, or an object store
//! where a file is two requests: its footer, then the columns read); a file's deletion
//! vector, inline or in a deletion-vector file, is honoured (its rows stay deleted). A table
//! partitioned by its start value, or one with column mapping or deletion vectors at
//! absolute paths (written by another engine), goes through delta-rs.

use crate::error::{Context, EngineError, Result};
use crate::storage::commit::PendingCommit;
use crate::storage::data_file::{DataFile, Root};
use crate::storage::feed::CHANGE_TYPE;
use crate::util::arrow;
use deltalake::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use deltalake::arrow::compute::filter_record_batch;
use deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafusion::parquet::arrow::ArrowWriter;
use deltalake::kernel::{Action, AddCDCFile};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::DeltaTable;
use roaring::RoaringTreemap;
use std::sync::Arc;

/// The share of a file's rows (numerator, denominator) beyond which a deletion-vector table
/// rewrites the file without its deleted rows instead of growing its vector: readers then
/// no longer read rows only to drop them. A file with every row deleted is simply removed.
const REWRITE_AT_DELETED: (u64, u64) = (1, 4);

/// Rows read from a data file at a time.
const READ_BATCH_ROWS: usize = 64 * 1024;

/// What [`replace_keys`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replaced {
    pub files_read: usize,
    pub files_rewritten: usize,
    /// Files whose replaced rows were marked in their deletion vector instead.
    pub files_marked: usize,
}

impl std::fmt::Display for Replaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.files_marked > 0 {
            write!(
                f,
                "{} of {} file(s) given deletion vectors",
                self.files_marked, self.files_read
            )
        } else {
            write!(
                f,
                "{} of {} file(s) rewritten",
                self.files_rewritten, self.files_read
            )
        }
    }
}

/// The change feed rows of a replacement: the rows that go and the rows that come. Rows a
/// replacement writes again as they were are in neither (as in Delta's own feed, a row
/// copied unchanged into a new file is no change).
pub(crate) struct Feed {
    pub(crate) deleted: RecordBatch,
    pub(crate) inserted: RecordBatch,
}

/// Replaces every row of `table` whose key (columns `keys`) is a key of `old_rows` by
/// `new_rows`, in one commit, `commit`, whose change file holds `feed`. `old_rows` must be
/// exactly the rows the table holds for those keys. Returns `None`, having
/// done nothing, for a partitioned table or one with column mapping or deletion vectors
/// at absolute paths.
///
/// ```text
///  Layout::of ─▶ Shared::of ─▶ mark_replaced (deletion-vector tables)
///  (where and     (the replaced   or find_touched ─▶ rewrite_touched ─▶ change file, commit
///   how to write)  keys)          (files holding     (without them, one writer
///                                  one of them)       per core, the new rows with
///                                                     the first)
/// ```
pub(crate) async fn replace_keys(
    table: &DeltaTable,
    keys: &[String],
    old_rows: &RecordBatch,
    new_rows: RecordBatch,
    feed: &Feed,
    commit: &PendingCommit,
) -> Result<Option<Replaced>> {
    let table_name = table.table_url().to_string();
    let steps = crate::util::steps::Steps::new(&table_name, "replace: ");
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let Some(mut layout) = Layout::of(table, snapshot)? else {
        return Ok(None);
    };
    layout.read_vectors().await?;
    let schema = layout.schema.clone();
    let files: Vec<(String, deltalake::kernel::Remove)> = snapshot
        .log_data()
        .iter()
        .map(|f| (f.path().to_string(), f.remove_action(true)))
        .collect();
    let shared = Arc::new(Shared::of(schema.clone(), keys, old_rows, &new_rows)?);
    crate::util::steps::step!(debug, steps, "collected the replaced keys");
    if layout.marking {
        let marked = mark_replaced(table, &shared, &layout, snapshot, feed, new_rows).await?;
        crate::util::steps::step!(
            debug,
            steps,
            "marked the replaced rows in deletion vectors, wrote the new rows and the change file"
        );
        let n = marked.vectors.len();
        let mut actions: Vec<Action> = marked.vectors.into_iter().flatten().collect();
        actions.extend(marked.adds.into_iter().map(Action::Add));
        let what = format!(
            "the rows of {} key(s) ({}) replaced, old rows marked deleted",
            shared.count,
            keys.join(", ")
        );
        commit_replacement(
            table,
            vec![marked.cdc],
            actions,
            SaveMode::Append,
            what,
            commit,
        )
        .await?;
        crate::util::steps::step!(debug, steps, "committed");
        return Ok(Some(Replaced {
            files_read: files.len(),
            files_rewritten: 0,
            files_marked: n,
        }));
    }

    let touched = find_touched(&shared, &layout.root, &files).await?;
    crate::util::steps::step!(debug, steps, "found the files holding replaced keys");
    let new_rows = arrow::cast_batch(&new_rows, &schema)?;
    let mut actions = rewrite_touched(table, &shared, &mut layout, &touched, &new_rows).await?;
    actions.extend(touched.iter().map(|(_, r)| Action::Remove(r.clone())));
    let what = format!(
        "the rows of {} key(s) ({}) replaced",
        shared.count,
        keys.join(", ")
    );
    crate::util::steps::step!(debug, steps, "rewrote them");
    let cdc =
        write_change_file(table, &layout.root, &schema, &feed.deleted, &feed.inserted).await?;
    commit_replacement(table, vec![cdc], actions, SaveMode::Overwrite, what, commit).await?;
    crate::util::steps::step!(debug, steps, "wrote the change file and committed");
    Ok(Some(Replaced {
        files_read: files.len(),
        files_rewritten: touched.len(),
        files_marked: 0,
    }))
}

/// Replaces the rows of the keys `changed` (their key columns `keys`, in that order) by
/// files written already (by a cluster's tasks, or part by part): their add actions `adds`
/// and the change files `cdc` that tell both the deletes and the inserts. The keys' rows
/// are marked in deletion vectors or their files rewritten without them, as
/// [`replace_keys`] does, in one commit with the given files. `None`, having done nothing,
/// for a table [`replace_keys`] leaves to delta-rs (callers check [`replaces_in_place`]
/// first).
pub(crate) async fn replace_keys_with_files(
    table: &DeltaTable,
    keys: &[String],
    changed: &RecordBatch,
    adds: Vec<deltalake::kernel::Add>,
    cdc: Vec<AddCDCFile>,
    commit: &PendingCommit,
) -> Result<Option<Replaced>> {
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let Some(mut layout) = Layout::of(table, snapshot)? else {
        return Ok(None);
    };
    layout.read_vectors().await?;
    let shared = Arc::new(Shared::of_keys(layout.schema.clone(), keys, changed)?);
    let files_read = snapshot.log_data().iter().count();
    let what = format!(
        "the rows of {} key(s) ({}) replaced by files written on a cluster",
        shared.count,
        keys.join(", ")
    );
    let mut actions: Vec<Action> = cdc.into_iter().map(Action::Cdc).collect();
    let done = if layout.marking {
        let vectors = mark_deleted(table, &shared, &layout.root, snapshot, &layout.deleted).await?;
        let files_marked = vectors.len();
        actions.extend(vectors.into_iter().flatten());
        Replaced {
            files_read,
            files_rewritten: 0,
            files_marked,
        }
    } else {
        let files: Vec<(String, deltalake::kernel::Remove)> = snapshot
            .log_data()
            .iter()
            .map(|f| (f.path().to_string(), f.remove_action(true)))
            .collect();
        let touched = find_touched(&shared, &layout.root, &files).await?;
        let kept = rewrite_touched_files(table, &shared, &mut layout, &touched).await?;
        actions.extend(kept.into_iter().map(Action::Add));
        actions.extend(touched.iter().map(|(_, r)| Action::Remove(r.clone())));
        Replaced {
            files_read,
            files_rewritten: touched.len(),
            files_marked: 0,
        }
    };
    actions.extend(adds.into_iter().map(Action::Add));
    let mode = match layout.marking {
        true => SaveMode::Append,
        false => SaveMode::Overwrite,
    };
    commit_replacement(table, Vec::new(), actions, mode, what, commit).await?;
    Ok(Some(done))
}

/// Whether [`replace_keys`] replaces rows of `table` itself (else delta-rs does).
pub(crate) fn replaces_in_place(table: &DeltaTable) -> Result<bool> {
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    Ok(Layout::of(table, snapshot)?.is_some())
}

/// Where and how a replacement writes a table.
struct Layout {
    /// Where the table's files are.
    root: Root,
    schema: SchemaRef,
    /// The table has deletion vectors: replaced rows are marked, not rewritten.
    marking: bool,
    /// The rows each file's deletion vector already deletes, by path (those stored in
    /// files once [`Layout::read_vectors`] has read them).
    deleted: ahash::AHashMap<String, RoaringTreemap>,
    /// The data files whose vectors are in deletion-vector files, not read yet: the data
    /// file's path, the descriptor, and where in which file the vector is.
    stored: Vec<(
        String,
        deltalake::kernel::DeletionVectorDescriptor,
        (String, std::ops::Range<u64>),
    )>,
}

impl Layout {
    /// The files `touched` to rewrite, each with the rows its deletion vector deletes.
    fn files_of(
        &mut self,
        touched: &[(String, deltalake::kernel::Remove)],
    ) -> Vec<(DataFile, RoaringTreemap)> {
        touched
            .iter()
            .map(|(path, remove)| {
                (
                    DataFile::new(&self.root, path, remove.size),
                    self.deleted.remove(path).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The table's layout, or `None` when a replacement here cannot write it (delta-rs
    /// does).
    fn of(
        table: &DeltaTable,
        snapshot: &deltalake::table::state::DeltaTableState,
    ) -> Result<Option<Layout>> {
        // Files are read as plain parquet with logical column names, dropping the rows their
        // deletion vectors delete: a partitioned table, column mapping, or deletion vectors
        // at absolute paths (a table another engine wrote) go through delta-rs.
        let config = snapshot.metadata().configuration();
        let mapped = config
            .get("delta.columnMapping.mode")
            .is_some_and(|m| m != "none");
        let marking = config
            .get(crate::storage::dv::PROPERTY)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let mut deleted: ahash::AHashMap<String, RoaringTreemap> = ahash::AHashMap::new();
        let mut stored = Vec::new();
        for f in snapshot.log_data().iter() {
            if let Some(d) = f.deletion_vector_descriptor() {
                if let Some(rows) = crate::storage::dv::read_inline(&d)? {
                    deleted.insert(f.path().to_string(), rows);
                } else if let Some(at) = crate::storage::dv::file_of(&d) {
                    stored.push((f.path().to_string(), d, at));
                } else {
                    return Ok(None);
                }
            }
        }
        if !snapshot.metadata().partition_columns().is_empty() || mapped {
            return Ok(None);
        }
        let schema = crate::storage::table::table_schema(table)?;
        let root = Root::of(table);
        Ok(Some(Layout {
            root,
            schema,
            marking,
            deleted,
            stored,
        }))
    }

    /// Reads the vectors kept in deletion-vector files into `deleted`.
    async fn read_vectors(&mut self) -> Result<()> {
        for (path, dv, (file, range)) in std::mem::take(&mut self.stored) {
            let bytes = self.root.get(&file, range).await?;
            let rows = crate::storage::dv::read_stored(&dv, &file, &bytes)?;
            self.deleted.insert(path, rows);
        }
        Ok(())
    }
}

impl Shared {
    /// The keys (columns `keys` of `schema`) whose rows go: those of the old rows, and
    /// (should the table hold rows the caller did not know of) those of the new rows.
    fn of(
        schema: SchemaRef,
        keys: &[String],
        old_rows: &RecordBatch,
        new_rows: &RecordBatch,
    ) -> Result<Shared> {
        let key_at = key_positions(&schema, keys)?;
        let columns = |b: &RecordBatch| -> Vec<ArrayRef> {
            key_at.iter().map(|&i| b.column(i).clone()).collect()
        };
        let pieces = [columns(old_rows), columns(new_rows)];
        Self::of_key_columns(schema, key_at, &pieces)
    }

    /// The keys `changed` (the key columns `keys` of `schema`, in that order) whose rows go.
    fn of_keys(schema: SchemaRef, keys: &[String], changed: &RecordBatch) -> Result<Shared> {
        let key_at = key_positions(&schema, keys)?;
        if changed.num_columns() != key_at.len() {
            return Err(EngineError::internal(format!(
                "{} key column(s) of replaced keys for {} key(s)",
                changed.num_columns(),
                key_at.len()
            )));
        }
        Self::of_key_columns(schema, key_at, &[changed.columns().to_vec()])
    }

    /// The keys whose rows go, given as pieces of key columns (in the order of `key_at`,
    /// the key columns' positions in `schema`).
    fn of_key_columns(
        schema: SchemaRef,
        key_at: Vec<usize>,
        pieces: &[Vec<ArrayRef>],
    ) -> Result<Shared> {
        let converter = RowConverter::new(
            key_at
                .iter()
                .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                .collect(),
        )
        .context(|| "row format".into())?;
        let cast_pieces = pieces
            .iter()
            .map(|piece| {
                key_at
                    .iter()
                    .zip(piece)
                    .map(|(&i, c)| cast_to(c, schema.field(i).data_type()))
                    .collect::<Result<Vec<ArrayRef>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let mut gone = ahash::AHashSet::<Box<[u8]>>::new();
        let (gone_ints, count) = match gone_ints(&schema, &key_at, &cast_pieces)? {
            Some((ints, count)) => (Some(ints), count),
            None => {
                for cols in &cast_pieces {
                    let rows = converter
                        .convert_columns(cols)
                        .context(|| "row format".into())?;
                    for r in rows.iter() {
                        if !gone.contains(r.data()) {
                            gone.insert(r.data().into());
                        }
                    }
                }
                (None, gone.len())
            }
        };
        Ok(Shared {
            schema,
            key_at,
            converter,
            gone,
            gone_ints,
            count,
        })
    }
}

/// Where the key columns `keys` are in `schema`.
fn key_positions(schema: &Schema, keys: &[String]) -> Result<Vec<usize>> {
    keys.iter()
        .map(|k| {
            schema
                .index_of(k)
                .map_err(|_| EngineError::internal(format!("table has no key column {k}")))
        })
        .collect()
}

/// A single integer key is kept as plain integers, with how many there are: files are then
/// checked without converting their keys to the row format. `None` for other keys.
/// `pieces` hold the key columns.
fn gone_ints(
    schema: &Schema,
    key_at: &[usize],
    pieces: &[Vec<ArrayRef>],
) -> Result<Option<(crate::util::keyset::KeySet, usize)>> {
    Ok(match key_at {
        [k] if arrow::fits_i64(schema.field(*k).data_type()) => {
            let rows = pieces
                .iter()
                .filter_map(|p| p.first())
                .map(|c| c.len())
                .sum();
            let mut ints: Vec<i64> = Vec::with_capacity(rows);
            for piece in pieces {
                let col = int64(&piece[0])?;
                if col.null_count() > 0 {
                    return Err(EngineError::internal("a NULL key among replaced rows"));
                }
                ints.extend(col.as_primitive::<Int64Type>().values().iter().copied());
            }
            ints.sort_unstable();
            ints.dedup();
            Some((crate::util::keyset::KeySet::new(&ints), ints.len()))
        }
        _ => None,
    })
}

/// What marking the replaced rows wrote.
struct Marked {
    /// Each file's deletion-vector actions.
    vectors: Vec<Vec<Action>>,
    /// The file of new rows.
    adds: Vec<deltalake::kernel::Add>,
    /// The change file.
    cdc: AddCDCFile,
}

/// Marks the replaced rows in deletion vectors and writes the new rows and the change file.
async fn mark_replaced(
    table: &DeltaTable,
    shared: &Arc<Shared>,
    layout: &Layout,
    snapshot: &deltalake::table::state::DeltaTableState,
    feed: &Feed,
    new_rows: RecordBatch,
) -> Result<Marked> {
    // Three independent pieces of work, side by side: the vectors (a read of the
    // target's key columns, one file per core), the file of new rows, the change file.
    let (root, schema) = (&layout.root, &layout.schema);
    let new_rows = arrow::cast_batch(&new_rows, schema)?;
    let started = std::time::Instant::now();
    let rows_file = {
        let (table, rows) = (table.clone(), new_rows.clone());
        tokio::spawn(timed(started, "wrote the new rows", async move {
            match rows.num_rows() {
                0 => Ok(Vec::new()),
                _ => crate::storage::write::write_files(&table, vec![rows]).await,
            }
        }))
    };
    let (vectors, cdc) = tokio::try_join!(
        timed(
            started,
            "marked the deletion vectors",
            mark_deleted(table, shared, root, snapshot, &layout.deleted)
        ),
        timed(
            started,
            "wrote the change file",
            write_change_file(table, root, schema, &feed.deleted, &feed.inserted)
        ),
    )?;
    let adds = rows_file
        .await
        .map_err(|e| EngineError::internal(format!("a writing task failed: {e}")))??;
    Ok(Marked { vectors, adds, cdc })
}

/// `work`, and a debug line of how long after `started` it was done: the pieces of
/// [`mark_replaced`] run side by side, and their times show which one a run waits for.
async fn timed<T>(
    started: std::time::Instant,
    what: &'static str,
    work: impl std::future::Future<Output = T>,
) -> T {
    let out = work.await;
    tracing::debug!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "replace: {what}"
    );
    out
}

/// Which files hold a replaced key: key columns only, one file per core at a time.
async fn find_touched(
    shared: &Arc<Shared>,
    root: &Root,
    files: &[(String, deltalake::kernel::Remove)],
) -> Result<Vec<(String, deltalake::kernel::Remove)>> {
    let lanes = crate::util::threads::parallelism();
    let mut touched = Vec::new();
    for chunk in files.chunks(lanes) {
        let checks: Vec<_> = chunk
            .iter()
            .map(|(path, remove)| {
                let (shared, file) = (shared.clone(), DataFile::new(root, path, remove.size));
                tokio::task::spawn_blocking(move || shared.holds_gone_key(&file))
            })
            .collect();
        for ((path, remove), check) in chunk.iter().zip(checks) {
            let holds = check
                .await
                .map_err(|e| EngineError::internal(format!("a reading task failed: {e}")))??;
            if holds {
                touched.push((path.clone(), remove.clone()));
            }
        }
    }
    Ok(touched)
}

/// Rewrites the files that hold a replaced key without those rows, the new rows with them:
/// the files dealt to one writer per core (side by side), each writer putting the kept rows
/// of all its files into new files of the table's file size, so that a batch that touches
/// many small files leaves few behind. Returns the add actions.
async fn rewrite_touched(
    table: &DeltaTable,
    shared: &Arc<Shared>,
    layout: &mut Layout,
    touched: &[(String, deltalake::kernel::Remove)],
    new_rows: &RecordBatch,
) -> Result<Vec<Action>> {
    let files = layout.files_of(touched);
    let adds = rewrite_together(table, shared, files, Some(new_rows.clone())).await?;
    Ok(adds.into_iter().map(Action::Add).collect())
}

/// Rewrites the files that hold a replaced key without those rows (no new rows with them).
async fn rewrite_touched_files(
    table: &DeltaTable,
    shared: &Arc<Shared>,
    layout: &mut Layout,
    touched: &[(String, deltalake::kernel::Remove)],
) -> Result<Vec<deltalake::kernel::Add>> {
    let files = layout.files_of(touched);
    rewrite_together(table, shared, files, None).await
}

/// Writes the kept rows of `files` (each with the rows its deletion vector deletes) and
/// `extra` to new files: the files dealt round-robin to one writer per core, `extra` going
/// with the first. Returns the add actions.
async fn rewrite_together(
    table: &DeltaTable,
    shared: &Arc<Shared>,
    files: Vec<(DataFile, RoaringTreemap)>,
    extra: Option<RecordBatch>,
) -> Result<Vec<deltalake::kernel::Add>> {
    let lanes = crate::util::threads::parallelism().clamp(1, files.len().max(1));
    let mut groups: Vec<Vec<(DataFile, RoaringTreemap)>> = vec![Vec::new(); lanes];
    for (n, f) in files.into_iter().enumerate() {
        groups[n % lanes].push(f);
    }
    let file_size = rewrite_file_size(table, &groups);
    let mut extra = extra.filter(|r| r.num_rows() > 0);
    let with_extra = extra.is_some();
    let writers: Vec<_> = groups
        .into_iter()
        .enumerate()
        .filter(|(n, g)| !g.is_empty() || (*n == 0 && with_extra))
        .map(|(_, group)| {
            let (shared, table, extra) = (shared.clone(), table.clone(), extra.take());
            tokio::spawn(async move { shared.rewrite(group, &table, extra, file_size).await })
        })
        .collect();
    let mut adds = Vec::new();
    for w in writers {
        adds.extend(
            w.await
                .map_err(|e| EngineError::internal(format!("a rewriting task failed: {e}")))??,
        );
    }
    Ok(adds)
}

/// The size at which a rewriting writer starts a new file: the table's
/// `delta.targetFileSize` (else 100 MiB, deltalake's OPTIMIZE target), or the largest file
/// rewritten when larger, so that a large file is not cut into pieces.
fn rewrite_file_size(table: &DeltaTable, groups: &[Vec<(DataFile, RoaringTreemap)>]) -> u64 {
    const DEFAULT: u64 = 100 << 20;
    let configured = table
        .snapshot()
        .ok()
        .and_then(|s| {
            s.metadata()
                .configuration()
                .get("delta.targetFileSize")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(DEFAULT);
    groups
        .iter()
        .flatten()
        .filter_map(|(f, _)| f.size)
        .fold(configured, u64::max)
}

/// The commit-info entry telling what a replacement replaced.
const REPLACED_KEY: &str = "strata.replaced";

/// Adds the change files `cdc` (written by [`write_change_file`]) to `actions` and commits
/// them as one write.
async fn commit_replacement(
    table: &DeltaTable,
    cdc: Vec<AddCDCFile>,
    mut actions: Vec<Action>,
    mode: SaveMode,
    what: String,
    commit: &PendingCommit,
) -> Result<()> {
    actions.extend(cdc.into_iter().map(Action::Cdc));
    // What was replaced is told in the commit info, not as the operation's predicate: Delta's
    // conflict check parses a predicate as SQL (and would fail on these words when another
    // writer committed first).
    let operation = DeltaOperation::Write {
        mode,
        partition_by: None,
        predicate: None,
    };
    let commit = commit
        .clone()
        .with_info(REPLACED_KEY, serde_json::json!(what));
    crate::storage::write::commit_actions(table, actions, operation, &commit).await?;
    Ok(())
}

/// For a table that enables deletion vectors: the actions that mark the replaced keys' rows
/// deleted, one `Vec` per file holding such a row that is not deleted yet: its `remove`,
/// then an `add` of the same file with the grown vector, or, for a file that would be
/// mostly deleted, nothing: the kept rows of all such files are written again together
/// (without vectors), their adds going with the first of them. Each file's key columns are
/// read once, one file per core at a time.
async fn mark_deleted(
    table: &DeltaTable,
    shared: &Arc<Shared>,
    root: &Root,
    snapshot: &deltalake::table::state::DeltaTableState,
    vectors: &ahash::AHashMap<String, RoaringTreemap>,
) -> Result<Vec<Vec<Action>>> {
    struct File {
        path: String,
        remove: deltalake::kernel::Remove,
        add: deltalake::kernel::Add,
        deleted: RoaringTreemap,
    }
    let mut files = Vec::new();
    for f in snapshot.log_data().iter() {
        let deleted = vectors.get(f.path().as_ref()).cloned().unwrap_or_default();
        files.push(File {
            path: f.path().to_string(),
            remove: f.remove_action(true),
            add: deltalake::kernel::Add {
                path: f.path().to_string(),
                size: f.size(),
                modification_time: f.modification_time(),
                data_change: true,
                stats: f.stats().map(|s| loose_bounds(&s)),
                ..Default::default()
            },
            deleted,
        });
    }
    let lanes = crate::util::threads::parallelism();
    let mut out: Vec<Vec<Action>> = Vec::new();
    let (mut mostly_deleted, mut first_rewritten) = (Vec::new(), None);
    // The files marked (their index in `out`) and their new vectors.
    let mut marked: Vec<(usize, RoaringTreemap)> = Vec::new();
    for chunk in files.chunks(lanes) {
        let checks: Vec<_> = chunk
            .iter()
            .map(|f| {
                let (shared, file, deleted) = (
                    shared.clone(),
                    DataFile::new(root, &f.path, Some(f.add.size)),
                    f.deleted.clone(),
                );
                tokio::task::spawn_blocking(move || shared.gone_positions(&file, &deleted))
            })
            .collect();
        for (f, check) in chunk.iter().zip(checks) {
            let (gone, rows) = check
                .await
                .map_err(|e| EngineError::internal(format!("a reading task failed: {e}")))??;
            if gone.is_empty() {
                continue;
            }
            let deleted = &f.deleted | &gone;
            let mut actions = vec![Action::Remove(f.remove.clone())];
            if deleted.len() * REWRITE_AT_DELETED.1 > rows * REWRITE_AT_DELETED.0 {
                // Mostly deleted: what remains is written again, without a vector (below).
                let file = DataFile::new(root, &f.path, Some(f.add.size));
                mostly_deleted.push((file, f.deleted.clone()));
                first_rewritten.get_or_insert(out.len());
            } else {
                actions.push(Action::Add(f.add.clone()));
                marked.push((out.len(), deleted));
            }
            out.push(actions);
        }
    }
    let (at, vectors): (Vec<usize>, Vec<RoaringTreemap>) = marked.into_iter().unzip();
    let (descriptors, file) = crate::storage::dv::descriptors(&vectors)?;
    if let Some(file) = file {
        root.put(&file.path, file.bytes).await?;
    }
    for (at, dv) in at.into_iter().zip(descriptors) {
        if let Some(Action::Add(add)) = out[at].last_mut() {
            add.deletion_vector = Some(dv);
        }
    }
    if let Some(first) = first_rewritten {
        // The new files' adds go with the first rewritten file's remove.
        let adds = rewrite_together(table, shared, mostly_deleted, None).await?;
        out[first].extend(adds.into_iter().map(Action::Add));
    }
    Ok(out)
}

/// A file's statistics once rows may be deleted from it: the bounds still hold every
/// remaining value but may no longer be reached (`tightBounds = false`).
fn loose_bounds(stats: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(stats) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert("tightBounds".into(), serde_json::Value::Bool(false));
            serde_json::Value::Object(m).to_string()
        }
        _ => stats.to_string(),
    }
}

/// What every file task needs.
struct Shared {
    schema: SchemaRef,
    key_at: Vec<usize>,
    converter: RowConverter,
    /// The keys in the row format; empty when they are in `gone_ints`.
    gone: ahash::AHashSet<Box<[u8]>>,
    /// The keys as integers, for a single integer key column.
    gone_ints: Option<crate::util::keyset::KeySet>,
    /// How many keys go.
    count: usize,
}

impl Shared {
    /// Which rows of `batch` (in the table's layout) stay.
    fn keep_mask(&self, batch: &RecordBatch, key_cols: &[usize]) -> Result<BooleanArray> {
        if let (Some(ints), [c]) = (&self.gone_ints, key_cols) {
            // No replaced key is NULL: a row with a NULL key stays.
            let col = int64(batch.column(*c))?;
            let values = col.as_primitive::<Int64Type>();
            let nulls = values.nulls();
            let values = values.values();
            return Ok(BooleanArray::new(
                deltalake::arrow::buffer::BooleanBuffer::collect_bool(values.len(), |i| {
                    nulls.is_some_and(|n| n.is_null(i)) || !ints.contains(values[i])
                }),
                None,
            ));
        }
        let cols: Vec<ArrayRef> = key_cols
            .iter()
            .zip(&self.key_at)
            .map(|(&c, &k)| cast_to(batch.column(c), self.schema.field(k).data_type()))
            .collect::<Result<_>>()?;
        let rows = self
            .converter
            .convert_columns(&cols)
            .context(|| "row format".into())?;
        Ok(rows
            .iter()
            .map(|r| Some(!self.gone.contains(r.data())))
            .collect())
    }

    /// True when the data file `file` holds a row of a replaced key.
    fn holds_gone_key(&self, file: &DataFile) -> Result<bool> {
        let reader = self.reader(file, true)?;
        let key_cols: Vec<usize> = (0..self.key_at.len()).collect();
        for batch in reader {
            let batch = batch.context(|| format!("reading {}", file.label()))?;
            let keep = self.keep_mask(&batch, &key_cols)?;
            if keep.true_count() < batch.num_rows() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The positions of the rows of the data file `file` that hold a replaced key and are
    /// not in `deleted` yet, and how many rows the file has.
    fn gone_positions(
        &self,
        file: &DataFile,
        deleted: &RoaringTreemap,
    ) -> Result<(RoaringTreemap, u64)> {
        let reader = self.reader(file, true)?;
        let key_cols: Vec<usize> = (0..self.key_at.len()).collect();
        let mut gone = RoaringTreemap::new();
        let mut offset = 0u64;
        for batch in reader {
            let batch = batch.context(|| format!("reading {}", file.label()))?;
            let keep = self.keep_mask(&batch, &key_cols)?;
            if keep.true_count() < batch.num_rows() {
                // The rows not kept: the unset bits, a word at a time.
                let not_kept = !keep.values();
                gone.extend(
                    not_kept
                        .set_indices()
                        .map(|i| offset + i as u64)
                        .filter(|p| !deleted.contains(*p)),
                );
            }
            offset += batch.num_rows() as u64;
        }
        Ok((gone, offset))
    }

    /// A reader of the file's key columns (`keys_only`) or of all of them.
    fn reader(
        &self,
        file: &DataFile,
        keys_only: bool,
    ) -> Result<deltalake::datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader> {
        let names: Vec<&str> = self
            .key_at
            .iter()
            .map(|&k| self.schema.field(k).name().as_str())
            .collect();
        file.reader(keys_only.then_some(names.as_slice()), READ_BATCH_ROWS)
    }

    /// Writes `extra` and the rows of each of `files` whose key is not replaced and whose
    /// position is not in the file's `deleted` (its deletion vector) to new data files,
    /// through one writer streaming them out, a new file each `file_size` bytes.
    async fn rewrite(
        self: Arc<Self>,
        files: Vec<(DataFile, RoaringTreemap)>,
        table: &DeltaTable,
        extra: Option<RecordBatch>,
        file_size: u64,
    ) -> Result<Vec<deltalake::kernel::Add>> {
        let what = || format!("writing {}", table.table_url());
        let mut writer = RecordBatchWriter::for_table(table)
            .context(what)?
            .with_writer_properties(crate::storage::write::writer_properties(table))
            .with_target_file_size(file_size);
        if let Some(rows) = extra.filter(|r| r.num_rows() > 0) {
            writer.write(rows).await.context(what)?;
        }
        for (file, deleted) in files {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(4);
            let me = self.clone();
            let reading = tokio::task::spawn_blocking(move || me.read_kept(&file, &deleted, tx));
            while let Some(batch) = rx.recv().await {
                let batch = batch?;
                if batch.num_rows() > 0 {
                    writer.write(batch).await.context(what)?;
                }
            }
            reading
                .await
                .map_err(|e| EngineError::internal(format!("a reading task failed: {e}")))?;
        }
        writer.flush().await.context(what)
    }

    /// Sends the kept rows of `file` (key not replaced, position not in `deleted`), in the
    /// table's layout, to `tx`.
    fn read_kept(
        &self,
        file: &DataFile,
        deleted: &RoaringTreemap,
        tx: tokio::sync::mpsc::Sender<Result<RecordBatch>>,
    ) {
        let send = |r: Result<RecordBatch>| tx.blocking_send(r).is_ok();
        let reader = match self.reader(file, false) {
            Ok(r) => r,
            Err(e) => {
                send(Err(e));
                return;
            }
        };
        let mut offset = 0u64;
        for batch in reader {
            let out = batch
                .context(|| format!("reading {}", file.label()))
                .and_then(|b| {
                    let b = arrow::in_layout(&b, &self.schema)?;
                    let mut keep = self.keep_mask(&b, &self.key_at)?;
                    if !deleted.is_empty() {
                        let at = offset;
                        keep = (0..b.num_rows())
                            .map(|i| Some(keep.value(i) && !deleted.contains(at + i as u64)))
                            .collect();
                    }
                    offset += b.num_rows() as u64;
                    filter_record_batch(&b, &keep).context(|| "filtering rows".into())
                });
            let failed = out.is_err();
            if !send(out) || failed {
                return;
            }
        }
    }
}

fn int64(array: &ArrayRef) -> Result<ArrayRef> {
    deltalake::arrow::compute::cast(array, &DataType::Int64).context(|| "key values".into())
}

fn cast_to(array: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    deltalake::arrow::compute::cast(array, to).context(|| "casting keys".into())
}

/// Writes `deleted` as `delete` rows and `inserted` as `insert` rows to a new change data
/// file of `table` (at `root`), with the table's writer settings, and returns its action.
pub(crate) async fn write_change_file(
    table: &DeltaTable,
    root: &Root,
    schema: &SchemaRef,
    deleted: &RecordBatch,
    inserted: &RecordBatch,
) -> Result<AddCDCFile> {
    let props = crate::storage::write::writer_properties_for(table, Some(inserted));
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE, DataType::Utf8, false));
    let feed_schema = Arc::new(Schema::new(fields));
    let tagged = |b: &RecordBatch, kind: &str| -> Result<RecordBatch> {
        let mut cols = arrow::cast_batch(b, schema)?.columns().to_vec();
        cols.push(Arc::new(StringArray::from(vec![kind; b.num_rows()])));
        RecordBatch::try_new(feed_schema.clone(), cols).context(|| "change feed rows".into())
    };
    let (del, ins) = (tagged(deleted, "delete")?, tagged(inserted, "insert")?);
    let relative = format!("_change_data/cdc-{}.parquet", uuid::Uuid::new_v4());
    let what = format!("writing {}", root.label(&relative));
    let bytes = tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
        let mut w =
            ArrowWriter::try_new(Vec::new(), feed_schema, Some(props)).context(|| what.clone())?;
        for b in [del, ins] {
            w.write(&b).context(|| what.clone())?;
        }
        w.into_inner().context(|| what.clone())
    })
    .await
    .map_err(|e| EngineError::internal(format!("a writing task failed: {e}")))??;
    let size = bytes.len() as i64;
    root.put(&relative, bytes).await?;
    Ok(AddCDCFile {
        path: relative,
        size,
        partition_values: Default::default(),
        data_change: false,
        tags: None,
    })
}
