//! Compaction of an event store (`strata optimize`).
//!
//! ```text
//!   the store's files ──ORDER BY key, sequence, run (DataFusion, spilling to disk past
//!        │              the sort memory, 512 MiB by default)──▶ chunks cut between keys (KeyChunks)
//!        ▼
//!   expired SCD1 tombstones and the events they hid forgotten (tombstones.rs), when the
//!        │              target's flows forget them
//!        ▼
//!   new files of at most FILE_ROWS events, each in key order in small pages (pages.rs)
//!        ▼
//!   one commit: the files read removed, the new ones added, dataChange = false (OPTIMIZE)
//! ```
//!
//! `strata optimize` rewrites every file. A run's compaction after it (`small_files`)
//! rewrites only the store's small files (one or more per run) into one, once there are
//! ten: the files a batch reads stay few however many batches came before, and the large
//! files are not rewritten again. It forgets nothing.
//!
//! What a run reads of the store stays what it was: the events it forgets are those every
//! later run forgets anyway (an expired delete stays expired, and what it hid is fixed by
//! when events were processed, which the events' run numbers and the store's commit files
//! keep), so no target changes. Events keep their run numbers; the compaction's commit is
//! an upkeep commit that no event names, and a flow treats a store whose newer commits are
//! all upkeep as in step with its target (`ops/cdc/run.rs`). A run committing events while
//! the compaction runs keeps them: the commit removes only the files it read. Being sorted
//! as a whole, the new files cover disjoint key ranges, so a batch's keys touch few of them.

use crate::error::{Context, EngineError, Result};
use crate::eventstore::tombstones::{self, CommitTimes};
use crate::storage::commit::PendingCommit;
use crate::storage::location::Location;
use crate::util::arrow;
use crate::util::chunks::KeyChunks;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;
use futures::StreamExt;
use std::collections::HashSet;

/// Events per file the compaction writes (about 30-100 MiB of Parquet for typical rows).
pub(crate) const FILE_ROWS: usize = 1_000_000;
/// Events gathered before a chunk is cut (at a key boundary) and handed on.
const CHUNK_ROWS: usize = 65_536;
/// The memory the sort may hold before it spills to disk, unless told otherwise.
pub(crate) const DEFAULT_SORT_MEMORY: usize = 512 << 20;

/// How a store is compacted.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// The target's key columns.
    pub(crate) keys: Vec<String>,
    /// Forget deletes older than this many seconds and what they hid (SCD type 1 targets
    /// fed by change flows, `tombstones.rs`); `None`: keep every event.
    pub(crate) forget_after_secs: Option<u64>,
    /// The memory the sort may hold before it spills to disk.
    pub(crate) sort_memory: usize,
    /// The files to rewrite (paths relative to the store, [`small_files`]); `None`: every
    /// file. Only a rewrite of every file may forget tombstones (it sees every event of a
    /// key).
    pub(crate) only: Option<Vec<String>>,
}

/// A store file below this size is small: a run's compaction after it rewrites the small
/// files together and leaves the large ones (a million events or so each) alone. A file of
/// at least half a compacted file's events ([`FILE_ROWS`]) is not small whatever its size:
/// narrow events compress below this size, and a compaction's own files must not count as
/// small (else every later run would rewrite them again).
pub(crate) const SMALL_FILE_BYTES: i64 = 32 << 20;
/// How many small files a store holds before a run compacts them: each is a footer and
/// column chunks to read for every later batch on object storage.
pub(crate) const SMALL_FILES_TO_COMPACT: usize = 10;

/// The small files of a store whose `files` are (path, bytes, events when the log has
/// them), when there are enough of them to compact ([`SMALL_FILES_TO_COMPACT`]); in the
/// order given.
pub(crate) fn small_files(files: &[(String, i64, Option<usize>)]) -> Option<Vec<String>> {
    let small: Vec<String> = files
        .iter()
        .filter(|(_, bytes, events)| {
            *bytes < SMALL_FILE_BYTES && events.is_none_or(|n| n < FILE_ROWS / 2)
        })
        .map(|(path, _, _)| path.clone())
        .collect();
    (small.len() >= SMALL_FILES_TO_COMPACT).then_some(small)
}

/// What a compaction did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Compacted {
    pub(crate) files_before: usize,
    pub(crate) files_after: usize,
    /// The bytes of the files written (`None`: nothing was written).
    pub(crate) bytes_written: Option<u64>,
    pub(crate) events_before: usize,
    pub(crate) events_after: usize,
    /// Expired deletes forgotten (the events they hid went with them).
    pub(crate) tombstones_forgotten: usize,
    /// The store's version after the commit.
    pub(crate) version: i64,
    /// Why nothing was done.
    pub(crate) skipped: Option<String>,
}

/// Compacts the event store `store` (at `location`) by `rules`, `now` being the instant
/// (milliseconds since the epoch) against which tombstones expire.
pub(crate) async fn compact(
    store: &DeltaTable,
    location: &Location,
    rules: &Rules,
    now: i64,
    commit: &PendingCommit,
) -> Result<Compacted> {
    if rules.only.is_some() && rules.forget_after_secs.is_some() {
        return Err(EngineError::internal(
            "a compaction of some of a store's files cannot forget tombstones",
        ));
    }
    let layout = Layout::of(store, rules)?;
    let read: HashSet<String> = match &rules.only {
        Some(files) => files.iter().cloned().collect(),
        None => crate::storage::table::table_files(store)?,
    };
    let mut report = Compacted {
        files_before: read.len(),
        files_after: read.len(),
        version: crate::storage::table::version_of(store),
        ..Default::default()
    };
    let ctx = crate::storage::session::spilling_session(rules.sort_memory, 1)?;
    crate::storage::session::register_table(&ctx, "__strata_store", store, rules.only.clone())
        .await?;
    if read.len() <= 1 && expired_deletes(&ctx, &layout, location, rules, now).await? == 0 {
        report.skipped = Some(match read.len() {
            0 => "no events".to_string(),
            _ => "one file and no expired tombstones".to_string(),
        });
        return Ok(report);
    }
    let (adds, counts) = rewrite(&ctx, store, &layout, location, rules, now).await?;
    report.events_before = counts.read;
    report.events_after = counts.written;
    report.tombstones_forgotten = counts.forgotten;
    report.files_after = adds.len();
    report.bytes_written = Some(
        adds.iter()
            .map(|a| u64::try_from(a.size).unwrap_or(0))
            .sum(),
    );
    report.version = commit_rewrite(store, &read, adds, commit).await?;
    Ok(report)
}

/// Where the parts of an event sit in the store's schema.
struct Layout {
    schema: SchemaRef,
    keys: Vec<usize>,
    /// Output columns before the sequence, kind and run.
    n_out: usize,
}

impl Layout {
    fn of(store: &DeltaTable, rules: &Rules) -> Result<Layout> {
        let schema = crate::storage::table::table_schema(store)?;
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        use crate::semantics::fold::{OP_COL, RUN_COL, SEQ_COL};
        if names.len() < 4 || names[names.len() - 3..] != [SEQ_COL, OP_COL, RUN_COL] {
            return Err(EngineError::internal(format!(
                "{} is not an event store (its last columns are not {SEQ_COL}, {OP_COL}, \
                 {RUN_COL})",
                store.table_url()
            )));
        }
        let keys = rules
            .keys
            .iter()
            .map(|k| {
                names.iter().position(|n| n == k).ok_or_else(|| {
                    EngineError::internal(format!(
                        "{}: no key column {k} in the event store",
                        store.table_url()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if keys.is_empty() {
            return Err(EngineError::internal(format!(
                "{}: no key columns known for the event store",
                store.table_url()
            )));
        }
        Ok(Layout {
            n_out: names.len() - 3,
            schema,
            keys,
        })
    }

    fn order_by(&self) -> String {
        let mut cols: Vec<String> = self
            .keys
            .iter()
            .map(|&k| quote_ident(self.schema.field(k).name()))
            .collect();
        for c in self.n_out..self.schema.fields().len() {
            if c != self.n_out + 1 {
                cols.push(quote_ident(self.schema.field(c).name()));
            }
        }
        cols.join(", ")
    }
}

/// How many stored deletes have expired by `now`.
async fn expired_deletes(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    layout: &Layout,
    location: &Location,
    rules: &Rules,
    now: i64,
) -> Result<usize> {
    let Some(secs) = rules.forget_after_secs else {
        return Ok(0);
    };
    let sql = format!(
        "SELECT * FROM __strata_store WHERE {} = {}",
        quote_ident(crate::semantics::fold::OP_COL),
        strata_core::EventKind::Delete.code()
    );
    let deletes = crate::eventstore::read::collect_sql(ctx, &sql, &layout.schema).await?;
    let mut times = CommitTimes::of_runs(location, &deletes, layout.n_out).await?;
    let (_, n) =
        tombstones::forget_expired(&deletes, &layout.keys, layout.n_out, secs, now, &mut times)?;
    Ok(n)
}

#[derive(Default)]
struct Counts {
    read: usize,
    written: usize,
    forgotten: usize,
}

/// Reads every event in key order and writes what is kept as new files (not committed).
async fn rewrite(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    store: &DeltaTable,
    layout: &Layout,
    location: &Location,
    rules: &Rules,
    now: i64,
) -> Result<(Vec<deltalake::kernel::Add>, Counts)> {
    let sql = format!(
        "SELECT * FROM __strata_store ORDER BY {}",
        layout.order_by()
    );
    let mut stream = ctx
        .sql(&sql)
        .await
        .context(|| format!("planning {sql}"))?
        .execute_stream()
        .await
        .context(|| format!("running {sql}"))?;
    let mut chunks = KeyChunks::new(layout.schema.clone(), layout.keys.clone(), CHUNK_ROWS);
    let mut file = FileBuffer::default();
    let mut adds = Vec::new();
    let mut counts = Counts::default();
    let mut times = location.local().map(|d| CommitTimes::new(d.to_path_buf()));
    loop {
        let next = stream.next().await;
        let ready = match &next {
            Some(batch) => {
                let batch = batch.as_ref().map_err(|e| {
                    EngineError::internal(format!("reading {}: {e}", store.table_url()))
                })?;
                counts.read += batch.num_rows();
                chunks.push(arrow::cast_batch(batch, &layout.schema)?)?
            }
            None => chunks.finish()?,
        };
        for chunk in ready {
            let kept = match rules.forget_after_secs {
                None => chunk,
                Some(secs) => {
                    let mut fetched;
                    let times = match &mut times {
                        Some(t) => t,
                        None => {
                            fetched = CommitTimes::of_runs(location, &chunk, layout.n_out).await?;
                            &mut fetched
                        }
                    };
                    let (kept, n) = tombstones::forget_expired(
                        &chunk,
                        &layout.keys,
                        layout.n_out,
                        secs,
                        now,
                        times,
                    )?;
                    counts.forgotten += n;
                    kept
                }
            };
            counts.written += kept.num_rows();
            if let Some(full) = file.push(kept) {
                adds.extend(write_file(store, full).await?);
            }
        }
        if next.is_none() {
            break;
        }
    }
    if let Some(rest) = file.take() {
        adds.extend(write_file(store, rest).await?);
    }
    Ok((adds, counts))
}

async fn write_file(
    store: &DeltaTable,
    batches: Vec<RecordBatch>,
) -> Result<Vec<deltalake::kernel::Add>> {
    let mut adds = crate::storage::write::write_files(store, batches).await?;
    for a in &mut adds {
        a.data_change = false;
    }
    Ok(adds)
}

/// Commits the new files in place of the files `read` (of the version the store was read
/// at).
async fn commit_rewrite(
    store: &DeltaTable,
    read: &HashSet<String>,
    adds: Vec<deltalake::kernel::Add>,
    commit: &PendingCommit,
) -> Result<i64> {
    let snapshot = store.snapshot().context(|| "reading table state".into())?;
    let mut actions: Vec<Action> = snapshot
        .log_data()
        .iter()
        .filter(|f| read.contains(f.path().as_ref()))
        .map(|f| Action::Remove(f.remove_action(false)))
        .collect();
    actions.extend(adds.into_iter().map(Action::Add));
    let operation = DeltaOperation::Optimize {
        predicate: None,
        target_size: 0,
    };
    crate::storage::write::commit_actions(store, actions, operation, commit).await
}

/// The events of the file being filled, handed out once it holds [`FILE_ROWS`].
#[derive(Default)]
struct FileBuffer {
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl FileBuffer {
    fn push(&mut self, batch: RecordBatch) -> Option<Vec<RecordBatch>> {
        if batch.num_rows() == 0 {
            return None;
        }
        self.rows += batch.num_rows();
        self.batches.push(batch);
        match self.rows >= FILE_ROWS {
            true => self.take(),
            false => None,
        }
    }

    fn take(&mut self) -> Option<Vec<RecordBatch>> {
        self.rows = 0;
        let batches = std::mem::take(&mut self.batches);
        (!batches.is_empty()).then_some(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(keys: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(keys.to_vec()))])
            .expect("batch")
    }

    #[test]
    fn small_files_are_compacted_once_there_are_enough() {
        let files = |sizes: &[i64]| -> Vec<(String, i64, Option<usize>)> {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &b)| (format!("part-{i}.parquet"), b, Some(1_000)))
                .collect()
        };
        let nine_small = files(&[1_000; 9]);
        assert_eq!(small_files(&nine_small), None);
        let mut ten = nine_small.clone();
        ten.push(("big.parquet".into(), SMALL_FILE_BYTES, Some(1_000)));
        assert_eq!(small_files(&ten), None, "a large file does not count");
        ten.push((
            "compacted.parquet".into(),
            SMALL_FILE_BYTES / 2,
            Some(FILE_ROWS),
        ));
        assert_eq!(
            small_files(&ten),
            None,
            "a file of a compaction's size in events does not count, however few its bytes"
        );
        ten.push(("last.parquet".into(), SMALL_FILE_BYTES - 1, None));
        let picked = small_files(&ten).expect("ten small files");
        assert_eq!(picked.len(), 10);
        assert!(!picked.contains(&"big.parquet".to_string()));
        assert!(!picked.contains(&"compacted.parquet".to_string()));
        assert_eq!(picked.last().map(String::as_str), Some("last.parquet"));
    }

    #[test]
    fn a_file_is_handed_out_when_full() {
        let mut f = FileBuffer::default();
        assert!(f.push(batch(&[])).is_none());
        assert!(f.push(batch(&[1, 2])).is_none());
        assert!(f.take().is_some());
        assert!(f.take().is_none());
    }
}
