//! Streaming tables that read a database:
//! `FROM STREAM read_database('shop', table => 'public.orders', watermark => 'updated_at')`
//! by a watermark, or `read_database('shop', table => 'public.orders', mode => 'cdc')`
//! through PostgreSQL logical replication or the MySQL / MariaDB binlog.
//!
//! A watermark run: read the watermark the table recorded last (`sources/watermark.rs`),
//! read the rows above it in batches from a cursor (with an overlap window, from a point
//! before it, dropping rows the table already holds), run each batch through the query and
//! the checks, and commit the rows with the watermark of the last one in one Delta commit
//! per chunk (`chunk_bytes`, `chunk_rows`): memory holds one chunk, and a chunk ends only
//! where the watermark changes. The first run of a PostgreSQL table (`first_load =>
//! 'scan'`, the default) reads it in any order instead and writes the rows to data files
//! as they come, committed once with the highest watermark ([`take_whole_scan`]).
//!
//! A CDC run: read the position the table recorded last; without one (first run, full
//! refresh), create the slot (PostgreSQL), copy the table in a consistent snapshot (rows
//! with `_change_type = 'snapshot'`, written to data files as they come) and commit the
//! copy with the position the snapshot corresponds to ([`take_snapshot`]); then read every
//! change committed after that point up to a fence, in parts, each committed with the
//! position to resume from; only then advance the slot. PostgreSQL and MySQL / MariaDB run
//! the same steps through [`LogCdc`]; a binlog position is recorded as an LSN
//! (`file number << 32 | offset`, see `strata_sources::binlog`).
//!
//! Either way, a run that finds nothing new commits nothing, and a crash before the commit
//! leaves the table and its position as they were: the next run reads the same rows.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::commit::{Taken, Written};
use crate::ops::ingest::rows::{checked_rows, Running};
use crate::ops::ingest::{IngestReport, IngestSetup, Source};
use crate::ops::Scope;
use crate::sources::connection::{connection_spec, process_env};
use crate::sources::overlap::{self, Seen};
#[cfg(doc)]
use crate::sources::read::ChunkSize;
use crate::sources::read::{database_read, DatabaseRead, FirstLoad, ReadMode};
use crate::sources::resume::{self, CopyProgress, Stored, Window};
use crate::sources::toast;
use crate::sources::watermark;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::write::FileStream;
use crate::util::arrow::{align_by_name, slice_bytes};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{Schema, SchemaRef};
use deltalake::arrow::row::{OwnedRow, RowConverter, SortField};
use deltalake::DeltaTable;
use std::collections::HashMap;
use std::sync::Arc;
use strata_sources::{LogCdc, LowerBound, Lsn, ReadOptions, Watermark};
use strata_sql::{PipelinePlan, ReadDatabase};

/// The source of a `read_database` query and the schema of its rows, from the database's
/// own description of the table (or query), with the change columns in CDC mode: checked
/// before anything runs.
pub(super) async fn prepare_source(
    plan: &PipelinePlan,
    rd: &ReadDatabase,
    setup: &IngestSetup,
) -> Result<(Source, SchemaRef)> {
    let hint = match &setup.append_flow {
        None => setup.table.name.to_string(),
        Some(f) => format!("{}_{f}", setup.table.name),
    };
    let read = database_read(rd, &hint).map_err(|e| setup.err(e))?;
    let connection = plan
        .connections
        .get(&rd.connection)
        .ok_or_else(|| setup.err(format!("connection {} is not declared", rd.connection)))?;
    let spec = connection_spec(connection, &process_env)?;
    let source = strata_sources::Source::connect(&spec)
        .await
        .context(|| setup.err("reading its database").to_string())?;
    let description = source
        .describe(&read.object, &read.exclude)
        .await
        .context(|| setup.err("reading its database").to_string())?;
    let layout = read.column_layout(&description);
    let described = description.arrow_schema();
    let input = match read.mode {
        ReadMode::Watermark { .. } => described,
        ReadMode::Changes { .. } => {
            let mut fields: Vec<_> = described
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.extend(strata_sources::change_meta_fields());
            Arc::new(Schema::new(fields))
        }
    };
    Ok((
        Source::Database {
            spec,
            read,
            input: input.clone(),
            layout,
        },
        input,
    ))
}

/// The new rows of a database source, read, run through the query and checked; `None`
/// (the report says why) when the database has nothing new.
pub(super) async fn take_database(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let Source::Database { read, .. } = &setup.source else {
        return Err(EngineError::internal("not a database source"));
    };
    match read.mode {
        ReadMode::Watermark { .. } => take_watermark(scope, setup, existing, report).await,
        ReadMode::Changes { .. } => take_changes(scope, setup, existing, report).await,
    }
}

/// The rows above the table's watermark, read, run through the query, checked and
/// committed in chunks ([`ChunkSize`]): each chunk is one Delta commit carrying the
/// watermark of its last row, cut only where the watermark changes (inside a batch when
/// `chunk_rows` fills there, [`Boundary::cuts`]), so a crash between
/// chunks resumes after the last one committed. The last chunk is returned for the
/// ordinary commit; `None` (the report says why) when the database has nothing new.
async fn take_watermark(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let (
        Source::Database {
            spec, read, input, ..
        },
        Some(watermark_read),
    ) = (&setup.source, read_of(setup))
    else {
        return Err(EngineError::internal("not a watermark source"));
    };
    let ReadMode::Watermark {
        chunk: size,
        first_load,
        ..
    } = read.mode
    else {
        return Err(EngineError::internal("not a watermark source"));
    };
    let key = watermark::key(setup.append_flow.as_deref());
    let stored = match existing {
        Some(t) => watermark::stored(t, &key).await?,
        None => None,
    };
    let (bound, seen) = lower_bound(setup, read, existing, stored.as_ref()).await?;
    let place = format!(
        "connection {}, {} above {}",
        read.connection,
        read.object.label(),
        stored
            .as_ref()
            .map_or("(first load)".to_string(), describe_watermark)
    );
    let database = strata_sources::Source::connect(spec)
        .await
        .context(|| setup.err(&place).to_string())?;
    // A first load may take the table in any order: it is committed whole.
    let any_order = stored.is_none() && first_load == FirstLoad::Scan && !setup.evolve;
    let mut reader = database
        .read_watermark(
            &watermark_read
                .clone()
                .lower_bound(bound)
                .any_order(any_order),
        )
        .await
        .context(|| setup.err(&place).to_string())?;
    let mut running = Running::new(scope.wh, setup).await?;
    running.seen = seen;
    let ctx = crate::storage::session::new_session();
    let checks = RowChecks {
        setup,
        running: &running,
        ctx: &ctx,
        input,
        place: &place,
    };
    if !reader.in_watermark_order() {
        let rows = StreamedRows::new(checks, existing);
        return take_whole_scan(scope, rows, &mut reader, key, report).await;
    }
    let columns = watermark_read.watermark_columns.clone();
    let mut boundary = Boundary::new(&columns);
    let mut chunk = Chunk::default();
    // The table as the last chunk committed it (`None`: no chunk committed yet).
    let mut base: Option<DeltaTable> = None;
    // The position the table holds: stored, then each chunk's.
    let mut held = stored.as_ref().map(Watermark::to_json);
    // The chunk is full: it is committed with this watermark (its last row's) at the
    // first row whose watermark differs.
    let mut closing: Option<Watermark> = None;
    while let Some(mut batch) = reader
        .next_batch()
        .await
        .context(|| setup.err(&place).to_string())?
    {
        if let Some(reached) = closing.take() {
            let same = boundary.leading_equal(&batch)?;
            if same > 0 {
                let head = batch.slice(0, same);
                chunk.add(&checks, head, report).await?;
            }
            if same == batch.num_rows() {
                closing = Some(reached);
                continue;
            }
            batch = batch.slice(same, batch.num_rows() - same);
            held = Some(
                commit_chunk(
                    scope, setup, existing, &mut base, &key, &reached, &mut chunk, report,
                )
                .await?,
            );
            (scope.update)(committed_up_to(reader.rows_read(), &reached));
        }
        // A chunk of `chunk_rows` that fills inside this batch ends there, at the first
        // change of the watermark.
        let cuts = match size.rows {
            Some(limit) => boundary.cuts(&batch, chunk.rows, limit, reader.max_watermark())?,
            None => Vec::new(),
        };
        let mut start = 0;
        for (at, reached) in cuts {
            chunk
                .add(&checks, batch.slice(start, at - start), report)
                .await?;
            held = Some(
                commit_chunk(
                    scope, setup, existing, &mut base, &key, &reached, &mut chunk, report,
                )
                .await?,
            );
            (scope.update)(committed_up_to(reader.rows_read(), &reached));
            start = at;
        }
        let batch = batch.slice(start, batch.num_rows() - start);
        boundary.remember_last(&batch)?;
        chunk.add(&checks, batch, report).await?;
        if size.full(chunk.rows, chunk.bytes) {
            closing = reader.max_watermark().cloned();
        }
        (scope.update)(format!("{} row(s) read", reader.rows_read()));
    }
    let reached = reader.max_watermark().cloned();
    let moved = reached.as_ref().map(Watermark::to_json) != held;
    let has_rows = chunk.parts.iter().any(|b: &RecordBatch| b.num_rows() > 0);
    let Some(reached) = reached.filter(|_| moved || has_rows) else {
        if base.is_none() {
            report.skipped = Some("no new rows".into());
        }
        return Ok(None);
    };
    report.watermark = Some(describe_watermark(&reached));
    let table = match &base {
        Some(t) => Some(t),
        None => existing,
    };
    let commit = position_commit(scope, setup, table, key, reached.to_json()).await?;
    Ok(Some(Taken {
        base,
        ..Taken::rows(chunk.parts, chunk.events, commit)
    }))
}

/// A first load read in any order ([`strata_sources::WatermarkRead::any_order`]): every
/// batch of `reader` checked and written to data files as it comes (`rows`), returned for
/// one commit recording the highest watermark (under `key`). The downstream flows read the
/// rows from the table.
async fn take_whole_scan(
    scope: &Scope<'_>,
    mut rows: StreamedRows<'_>,
    reader: &mut strata_sources::WatermarkReader,
    key: String,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let Some(reached) = reader.max_watermark().cloned() else {
        report.skipped = Some("no new rows".into());
        return Ok(None);
    };
    report.watermark = Some(describe_watermark(&reached));
    while let Some(batch) = reader
        .next_batch()
        .await
        .context(|| rows.checks.setup.err(rows.checks.place).to_string())?
    {
        rows.add(scope, batch, report).await?;
        (scope.update)(format!("{} row(s) read", reader.rows_read()));
    }
    (scope.update)(format!(
        "{} row(s) read, finishing the files",
        reader.rows_read()
    ));
    let commit = position_commit(
        scope,
        rows.checks.setup,
        rows.table(),
        key,
        reached.to_json(),
    )
    .await?;
    Ok(Some(rows.into_taken(commit).await?))
}

/// What every batch read from the database goes through: the flow's query and checks
/// (`setup`, `running`, in the session `ctx`), for rows of the schema `input`; errors name
/// `place`.
#[derive(Clone, Copy)]
struct RowChecks<'a> {
    setup: &'a IngestSetup,
    running: &'a Running,
    ctx: &'a deltalake::datafusion::prelude::SessionContext,
    input: &'a SchemaRef,
    place: &'a str,
}

impl RowChecks<'_> {
    /// Runs `batch` (as read from the database) through the query and the checks; the
    /// downstream flows' events of its rows go to `events`.
    async fn check(
        &self,
        batch: RecordBatch,
        report: &mut IngestReport,
        events: &mut HashMap<String, Vec<RecordBatch>>,
    ) -> Result<Vec<RecordBatch>> {
        let df = self
            .ctx
            .read_batch(align_by_name(&batch, self.input)?)
            .context(|| "reading database rows".into())?;
        let (rows, _) =
            checked_rows(self.setup, self.running, df, self.place, report, events).await?;
        Ok(rows)
    }
}

/// Rows read from the database, run through the query and the checks, and written to new
/// data files of the streaming table as they come, for one commit ([`FileStream`]): the
/// table is created at the first row when it does not exist.
struct StreamedRows<'a> {
    checks: RowChecks<'a>,
    existing: Option<&'a DeltaTable>,
    created: Option<DeltaTable>,
    files: Option<FileStream>,
}

impl<'a> StreamedRows<'a> {
    fn new(checks: RowChecks<'a>, existing: Option<&'a DeltaTable>) -> Self {
        StreamedRows {
            checks,
            existing,
            created: None,
            files: None,
        }
    }

    /// The table the rows go to (`None` before the first row of a new table).
    fn table(&self) -> Option<&DeltaTable> {
        self.created.as_ref().or(self.existing)
    }

    /// Runs `batch` (as read from the database) through the query and the checks and
    /// hands its rows to the file writers.
    async fn add(
        &mut self,
        scope: &Scope<'_>,
        batch: RecordBatch,
        report: &mut IngestReport,
    ) -> Result<()> {
        let rows = self
            .checks
            .check(batch, report, &mut HashMap::new())
            .await?;
        for b in rows.into_iter().filter(|b| b.num_rows() > 0) {
            let files = match &mut self.files {
                Some(f) => f,
                None => {
                    let table = match self.existing {
                        Some(t) => t.clone(),
                        None => super::commit::create_table(scope, self.checks.setup).await?,
                    };
                    let files = FileStream::start(&table)?;
                    self.created = self.existing.is_none().then_some(table);
                    self.files.insert(files)
                }
            };
            files.write(b).await?;
        }
        Ok(())
    }

    /// The files finished, as what the run takes with `commit`; it builds on the table
    /// this created, if it did.
    async fn into_taken(self, commit: PendingCommit) -> Result<Taken> {
        let written = match self.files {
            Some(f) => {
                let rows = f.rows();
                Written {
                    adds: f.finish().await?,
                    rows,
                }
            }
            None => Written::default(),
        };
        Ok(Taken {
            written,
            base: self.created,
            ..Taken::rows(Vec::new(), HashMap::new(), commit)
        })
    }
}

/// The rows of a watermark load not committed yet, checked.
#[derive(Default)]
struct Chunk {
    parts: Vec<RecordBatch>,
    events: HashMap<String, Vec<RecordBatch>>,
    rows: usize,
    /// The Arrow memory the rows hold (of slices, their part: [`slice_bytes`]).
    bytes: usize,
}

impl Chunk {
    /// Runs `batch` (as read from the database) through `checks`.
    async fn add(
        &mut self,
        checks: &RowChecks<'_>,
        batch: RecordBatch,
        report: &mut IngestReport,
    ) -> Result<()> {
        let rows = checks.check(batch, report, &mut self.events).await?;
        self.rows += rows.iter().map(RecordBatch::num_rows).sum::<usize>();
        self.bytes += rows.iter().map(slice_bytes).sum::<usize>();
        self.parts.extend(rows);
        Ok(())
    }

    /// The chunk as a commit of its own. The downstream flows' events are dropped: they
    /// read what a run appended in more than one commit from the table.
    fn into_taken(self, commit: PendingCommit) -> Taken {
        Taken::rows(self.parts, HashMap::new(), commit)
    }
}

/// Commits `part` (a watermark load's chunk, a CDC run's part) as `commit` (one that records
/// its position: [`position_commit`]), building on `table`; returns the table as that
/// commit left it, which the next part builds on.
async fn commit_part(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    table: Option<&DeltaTable>,
    commit: PendingCommit,
    part: Chunk,
    report: &mut IngestReport,
) -> Result<DeltaTable> {
    let taken = part.into_taken(commit);
    let version = super::commit::commit_rows(scope, setup, table.cloned(), taken, report).await?;
    table_at(scope, setup, version).await
}

/// Commits a watermark load's `chunk` (left empty) with the watermark `reached`, building
/// on the chunk committed before (`base`, then this one), else on `existing`; returns the
/// position the table now holds.
#[allow(clippy::too_many_arguments)]
async fn commit_chunk(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    base: &mut Option<DeltaTable>,
    key: &str,
    reached: &Watermark,
    chunk: &mut Chunk,
    report: &mut IngestReport,
) -> Result<String> {
    let json = reached.to_json();
    report.watermark = Some(describe_watermark(reached));
    let part = std::mem::take(chunk);
    let table = base.as_ref().or(existing);
    let commit = position_commit(scope, setup, table, key.to_string(), json.clone()).await?;
    let committed = commit_part(scope, setup, table, commit, part, report).await?;
    *base = Some(committed);
    Ok(json)
}

/// The table as of `version`, the one this run's chunk just committed: the next chunk
/// builds on it, so that another writer's commit of the same position since conflicts.
async fn table_at(scope: &Scope<'_>, setup: &IngestSetup, version: i64) -> Result<DeltaTable> {
    let mut table = scope
        .wh
        .open_table(&setup.table.name)
        .await?
        .ok_or_else(|| EngineError::internal("a committed chunk's table is gone"))?;
    let at = u64::try_from(version)
        .map_err(|_| EngineError::internal(format!("a commit at version {version}")))?;
    table.load_version(at as _).await.context(|| {
        format!(
            "streaming table {}: reading version {version}",
            setup.table.name
        )
    })?;
    Ok(table)
}

/// Where rows of equal watermark end: the watermark columns of the last row read, in
/// Arrow's row format, compared with the first rows of the next batch (rows come in
/// watermark order, so rows of one watermark are contiguous).
struct Boundary {
    columns: Vec<String>,
    converter: Option<RowConverter>,
    last: Option<OwnedRow>,
}

impl Boundary {
    fn new(columns: &[String]) -> Boundary {
        Boundary {
            columns: columns.to_vec(),
            converter: None,
            last: None,
        }
    }

    /// The watermark columns of `batch` as rows.
    fn rows(&mut self, batch: &RecordBatch) -> Result<deltalake::arrow::row::Rows> {
        let arrays = self
            .columns
            .iter()
            .map(|c| {
                batch.column_by_name(c).cloned().ok_or_else(|| {
                    EngineError::internal(format!("watermark column {c} is not in the rows read"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if self.converter.is_none() {
            let fields = arrays
                .iter()
                .map(|a| SortField::new(a.data_type().clone()))
                .collect();
            self.converter =
                Some(RowConverter::new(fields).context(|| "comparing watermark values".into())?);
        }
        let converter = self
            .converter
            .as_ref()
            .ok_or_else(|| EngineError::internal("no row converter"))?;
        converter
            .convert_columns(&arrays)
            .context(|| "comparing watermark values".into())
    }

    /// Keeps the watermark of `batch`'s last row.
    fn remember_last(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let last = batch.slice(batch.num_rows() - 1, 1);
        self.last = Some(self.rows(&last)?.row(0).owned());
        Ok(())
    }

    /// Where chunks of `limit` rows end inside `batch`, the chunk in progress holding
    /// `held` rows: each at the first row, from the one that fills the chunk on, whose
    /// watermark differs from the row before it, with the watermark of that row before
    /// (which the chunk is committed with, and the next read starts after). Empty when no
    /// chunk fills before the batch's last row, or when the batch's values of the last row
    /// do not give exactly the watermark the reader reports for it (`last`): such a batch
    /// is only cut at its end.
    fn cuts(
        &mut self,
        batch: &RecordBatch,
        held: usize,
        limit: usize,
        last: Option<&Watermark>,
    ) -> Result<Vec<(usize, Watermark)>> {
        let n = batch.num_rows();
        let mut from = limit.saturating_sub(held).max(1);
        if from >= n {
            return Ok(Vec::new());
        }
        let own = Watermark::from_row(&self.columns, batch, n - 1);
        if own.is_none() || own.as_ref() != last {
            return Ok(Vec::new());
        }
        let rows = self.rows(batch)?;
        let mut out = Vec::new();
        while from < n {
            let Some(at) = (from..n).find(|&i| rows.row(i) != rows.row(i - 1)) else {
                break;
            };
            let reached = Watermark::from_row(&self.columns, batch, at - 1).ok_or_else(|| {
                EngineError::internal(format!("no watermark in row {} of a batch", at - 1))
            })?;
            out.push((at, reached));
            from = at + limit.max(1);
        }
        Ok(out)
    }

    /// How many rows at the start of `batch` have the watermark of the last row read.
    fn leading_equal(&mut self, batch: &RecordBatch) -> Result<usize> {
        let Some(last) = self.last.clone() else {
            return Ok(0);
        };
        let rows = self.rows(batch)?;
        Ok(rows.iter().take_while(|r| *r == last.row()).count())
    }
}

/// The commit of a database read that reached `reached` (a watermark's JSON, or an LSN),
/// recorded under `key` in its commit info, with the next count of [`AppId::Database`]: two
/// runs that read from the same position cannot both commit. The log is kept whole, since
/// the position lives in it.
async fn position_commit(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    key: String,
    reached: String,
) -> Result<PendingCommit> {
    let id = AppId::Database(setup.append_flow.as_deref());
    let previous = match existing {
        Some(t) => position(t, id).await?,
        None => None,
    };
    Ok(PendingCommit::of_run(scope.run_id)
        .keeping_log()
        .with_info(key, serde_json::Value::String(reached))
        .at(id, previous.map_or(0, |v| v + 1)))
}

/// The watermark read of a watermark source.
fn read_of(setup: &IngestSetup) -> Option<strata_sources::WatermarkRead> {
    match &setup.source {
        Source::Database { read, .. } => read.watermark_read(),
        _ => None,
    }
}

/// The changes of a CDC source since the LSN the table recorded (after copying the table
/// through the slot's snapshot on the first run), run through the query and checked, in
/// parts of `chunk_rows` changes read from one replication stream: each part but the last
/// is committed here with the LSN to resume from (the end of its last transaction), then
/// the stream tells the server it may drop the WAL before it; the last part is returned for
/// the ordinary commit, the slot advanced after it ([`SlotAdvance`]). A crash between parts
/// resumes after the last one committed.
async fn take_changes(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let (
        Source::Database {
            spec, read, input, ..
        },
        Some(config),
    ) = (&setup.source, cdc_config_of(setup))
    else {
        return Err(EngineError::internal("not a CDC source"));
    };
    let ReadMode::Changes {
        chunk_rows,
        first_load,
        ..
    } = read.mode
    else {
        return Err(EngineError::internal("not a CDC source"));
    };
    let flow = setup.append_flow.as_deref();
    let key = watermark::lsn_key(flow);
    let stored = match existing {
        Some(t) => resume::stored_read(t, flow).await?,
        None => Stored::Nothing,
    };
    let read_before = matches!(stored, Stored::Reading { .. });
    let tables: Vec<strata_sources::TableRef> =
        config.tables.iter().map(|t| t.table.clone()).collect();
    let cdc = LogCdc::connect(spec, config).await.context(|| {
        setup
            .err(format!("connection {}", read.connection))
            .to_string()
    })?;
    let place = format!(
        "connection {}, changes of {} through {}",
        read.connection,
        read.object.label(),
        cdc.log_label()
    );
    let running = Running::new(scope.wh, setup).await?;
    let ctx = crate::storage::session::new_session();
    let checks = RowChecks {
        setup,
        running: &running,
        ctx: &ctx,
        input,
        place: &place,
    };
    let mut chunk = Chunk::default();
    // The table as the last part (or the first copy) committed it (`None`: none yet). On a
    // first run (or after a full refresh), the first copy, going on with one that stopped.
    let (after, windows, mut base) = match stored {
        Stored::Reading { lsn, windows } => (lsn, windows, None),
        first => {
            let copy = FirstCopy {
                cdc: &cdc,
                checks,
                progress: match first {
                    Stored::Copying(progress) => Some(progress),
                    _ => None,
                },
                keyed: first_load == FirstLoad::Chunks,
                part_rows: chunk_rows,
            };
            let (lsn, table, windows) = take_snapshot(scope, setup, existing, copy, report).await?;
            (lsn, windows, Some(table))
        }
    };
    // The changes a resumed copy's rows already hold are dropped as they are read.
    let held = Held {
        tables,
        windows: resume::open_windows(&windows, after),
    };
    let options = ReadOptions {
        part_changes: Some(chunk_rows as u64),
        ..ReadOptions::default()
    };
    let mut changes = cdc
        .read_changes(after, options)
        .await
        .map_err(|e| resnapshot_hint(scope, setup, &place, e))?;
    let mut read_rows = 0usize;
    // Changes read since the last part was committed (or the read began).
    let mut part_rows;
    // Where the last part committed ends.
    let mut last_part: Option<Lsn> = None;
    loop {
        let reading = PartRead {
            scope,
            setup,
            input,
            place: &place,
            held: &held,
        };
        let (raw, key_changes, rows) = reading.read(&mut changes, &mut read_rows).await?;
        part_rows = rows;
        let table = base.as_ref().or(existing);
        let raw = fill_toast(&cdc, setup, read, &place, table, raw, key_changes).await?;
        for batch in raw {
            chunk.add(&checks, batch, report).await?;
        }
        let Some(end) = changes.part_end() else {
            break;
        };
        // A part: committed with the position after its last transaction, which the
        // server then hears it may drop the WAL before.
        report.watermark = Some(cdc.describe_position(end));
        let part = std::mem::take(&mut chunk);
        let commit = position_commit(scope, setup, table, key.clone(), end.to_string()).await?;
        let commit = resume::with_windows(commit, flow, &held.windows, end);
        base = Some(commit_part(scope, setup, table, commit, part, report).await?);
        changes.next_part();
        last_part = Some(end);
        (scope.update)(format!(
            "{read_rows} change(s) read, committed up to {}",
            cdc.describe_position(end)
        ));
    }
    let resume = changes
        .summary()
        .map(|s| s.resume_lsn)
        .ok_or_else(|| EngineError::internal("the change read ended without a summary"))?;
    let table = base.as_ref().or(existing);
    // Nothing after the position held (stored, the snapshot's or the last part's): no
    // commit.
    if part_rows == 0 {
        match last_part {
            // The stream may have closed before it told the server of the last part.
            Some(end) => advance_slot(&cdc, end).await,
            None if read_before => report.skipped = Some("no new changes".into()),
            None => {}
        }
        return Ok(None);
    }
    report.watermark = Some(cdc.describe_position(resume));
    let commit = position_commit(scope, setup, table, key, resume.to_string()).await?;
    let commit = resume::with_windows(commit, flow, &held.windows, resume);
    Ok(Some(Taken {
        after_commit: Some(Box::new(move || {
            Box::pin(SlotAdvance { cdc, to: resume }.run())
        })),
        base,
        ..Taken::rows(chunk.parts, chunk.events, commit)
    }))
}

/// What reading one part of a change stream needs.
struct PartRead<'a> {
    scope: &'a Scope<'a>,
    setup: &'a IngestSetup,
    input: &'a SchemaRef,
    place: &'a str,
    held: &'a Held,
}

impl PartRead<'_> {
    /// The changes of the stream's current part (to its end, or the stream's): each batch
    /// checked for columns the query does not know, the changes a resumed copy already
    /// holds dropped; with the key changes the batches report (`fill_toast` needs them) and
    /// the part's number of changes. `read_rows` counts every change of the read.
    async fn read(
        &self,
        changes: &mut strata_sources::LogChanges,
        read_rows: &mut usize,
    ) -> Result<(
        Vec<RecordBatch>,
        std::collections::HashSet<(i64, i64)>,
        usize,
    )> {
        let (scope, setup) = (self.scope, self.setup);
        let mut raw = Vec::new();
        let mut key_changes = std::collections::HashSet::new();
        let mut part_rows = 0usize;
        while let Some(tb) = changes
            .next_batch()
            .await
            .map_err(|e| resnapshot_hint(scope, setup, self.place, e))?
        {
            check_columns_known(scope, setup, self.input, self.place, &tb.batch)?;
            part_rows += tb.batch.num_rows();
            *read_rows += tb.batch.num_rows();
            raw.push(self.held.drop_held(&tb.table, tb.batch)?);
            key_changes.extend(tb.key_changes);
            (scope.update)(format!("{read_rows} change(s) read"));
        }
        Ok((raw, key_changes, part_rows))
    }
}

/// The source's tables and the windows of a resumed first copy a change read still
/// applies ([`resume`]).
struct Held {
    tables: Vec<strata_sources::TableRef>,
    windows: Vec<Window>,
}

impl Held {
    /// `batch` (changes of `table`) without the changes a window's rows already hold.
    fn drop_held(
        &self,
        table: &strata_sources::TableRef,
        batch: RecordBatch,
    ) -> Result<RecordBatch> {
        let Some(i) = self.index(table).filter(|_| !self.windows.is_empty()) else {
            return Ok(batch);
        };
        let held = resume::superseded(&batch, i, &self.windows)?;
        let kept = deltalake::arrow::compute::not(&held)
            .context(|| "dropping changes the copy holds".into())?;
        deltalake::arrow::compute::filter_record_batch(&batch, &kept)
            .context(|| "dropping changes the copy holds".into())
    }

    /// `t` among the source's tables (a table named without its schema or database is read
    /// from the connection's default one, which the batches name).
    fn index(&self, t: &strata_sources::TableRef) -> Option<usize> {
        self.tables.iter().position(|c| {
            c.name == t.name && (c.schema.is_none() || t.schema.is_none() || c.schema == t.schema)
        })
    }
}

/// A batch of changes has only columns the run was prepared with (`input`): a column the
/// source table gained after the run described it (the change log's Relation message
/// brings it mid-stream) is an error rather than dropped, and the part holding it is not
/// committed; the next run, prepared with the column, reads that part again.
fn check_columns_known(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    input: &SchemaRef,
    place: &str,
    batch: &RecordBatch,
) -> Result<()> {
    let schema = batch.schema();
    let unknown: Vec<String> = schema
        .fields()
        .iter()
        .filter(|f| {
            !input
                .fields()
                .iter()
                .any(|g| g.name().eq_ignore_ascii_case(f.name()))
        })
        .map(|f| format!("`{}`", f.name()))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(setup.err(format!(
        "{place}: the change log has column(s) {} that the source table did not have when this \
         run read its columns (added during the run); the changes since the last commit were \
         not written: run again to add the column(s), or, if the source no longer has them \
         (added and dropped again), `strata run {} --full-refresh {}`",
        unknown.join(", "),
        scope.pipeline,
        setup.table.name
    )))
}

/// A change read that failed: one that only a new snapshot recovers from (the slot was
/// dropped, or lost the changes strata needs; the binlog no longer has the recorded
/// position, or a table's columns changed in it) says the exact command that takes it, with
/// this table; other failures as they are.
fn resnapshot_hint(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    place: &str,
    e: strata_sources::SourceError,
) -> EngineError {
    if !e.needs_resnapshot() {
        return EngineError::Source {
            context: setup.err(place).to_string(),
            source: Box::new(e),
        };
    }
    EngineError::BadInput(format!(
        "{}: {e}: `strata run {} --full-refresh {}` (with every other table this connection's \
         change log feeds, comma-separated)",
        setup.err(place),
        scope.pipeline,
        setup.table.name
    ))
}

/// What a first copy needs: the source, the checks its rows go through, where an
/// interrupted copy stopped (`None`: start one), whether to read in key order
/// (`first_load => 'chunks'`) and the rows per part.
struct FirstCopy<'a> {
    cdc: &'a LogCdc,
    checks: RowChecks<'a>,
    progress: Option<CopyProgress>,
    keyed: bool,
    part_rows: usize,
}

/// The table as of a consistent snapshot, for a first CDC run (or one after a full
/// refresh): PostgreSQL's slot (re)created and the table copied through its exported
/// snapshot, or MySQL's table read in a consistent-snapshot transaction (rows with
/// `_change_type = 'snapshot'`), checked and written to data files as they come
/// ([`StreamedRows`]). A table with a primary key strata can order by is read in key order
/// and committed in parts of `part_rows` rows, each recording how far the copy got
/// ([`CopyProgress`]); a run that finds such a record goes on after it in a new snapshot
/// (a [`Window`]). The last commit records the first snapshot's position, from which the
/// changes are read. A first copy that stops before its first part's commit leaves a slot
/// behind, which the next first run drops and creates again. Returns that point, the table
/// as committed and the windows of the resumed parts.
async fn take_snapshot(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    copy: FirstCopy<'_>,
    report: &mut IngestReport,
) -> Result<(Lsn, DeltaTable, Vec<Window>)> {
    let Source::Database { read, .. } = &setup.source else {
        return Err(EngineError::internal("not a database source"));
    };
    let cdc = copy.cdc;
    let place = format!(
        "connection {}, {} through {}, initial snapshot",
        read.connection,
        read.object.label(),
        cdc.log_label()
    );
    let fail = || setup.err(&place).to_string();
    let (mut snapshot, mut progress) = match copy.progress {
        None => {
            cdc.reset().await.context(fail)?;
            let snapshot = cdc.start_snapshot(copy.keyed).await.context(fail)?;
            let progress = CopyProgress {
                consistent_point: snapshot.consistent_point(),
                position: strata_sources::CopyPosition::start(),
                windows: Vec::new(),
            };
            (snapshot, progress)
        }
        Some(mut progress) => {
            let snapshot = cdc
                .resume_snapshot(&progress.position)
                .await
                .map_err(|e| resnapshot_hint(scope, setup, &place, e))?;
            report.notes.push(format!(
                "the initial snapshot resumed after {}, as of {}",
                describe_copy_position(&progress.position),
                cdc.describe_position(snapshot.consistent_point())
            ));
            progress.windows.push(Window {
                table: progress.position.table,
                after: progress.position.after.clone(),
                before: snapshot.holds_changes_before(),
            });
            (snapshot, progress)
        }
    };
    let flow = setup.append_flow.as_deref();
    let mut base: Option<DeltaTable> = existing.cloned();
    let mut read_rows = 0usize;
    loop {
        let mut rows = StreamedRows::new(copy.checks, base.as_ref());
        let mut part = 0usize;
        let done = loop {
            let Some(tb) = snapshot.next_batch().await.context(fail)? else {
                break true;
            };
            read_rows += tb.batch.num_rows();
            part += tb.batch.num_rows();
            rows.add(scope, tb.batch, report).await?;
            (scope.update)(format!("{read_rows} row(s) of the initial snapshot"));
            if part >= copy.part_rows {
                if let Some(at) = snapshot.position() {
                    progress.position = at;
                    break false;
                }
            }
        };
        let commit = match done {
            true => {
                let at = progress.consistent_point;
                report.watermark = Some(cdc.describe_position(at));
                let key = watermark::lsn_key(flow);
                let commit = position_commit(scope, setup, rows.table(), key, at.to_string());
                resume::with_windows(commit.await?, flow, &progress.windows, at)
            }
            false => {
                let key = resume::copy_key(flow);
                position_commit(scope, setup, rows.table(), key, progress.to_json()).await?
            }
        };
        let mut taken = rows.into_taken(commit).await?;
        let table = taken.base.take().or_else(|| base.clone());
        let version = super::commit::commit_rows(scope, setup, table, taken, report).await?;
        let committed = table_at(scope, setup, version).await?;
        if done {
            return Ok((progress.consistent_point, committed, progress.windows));
        }
        base = Some(committed);
        (scope.update)(format!(
            "{read_rows} row(s) of the initial snapshot, committed up to {}",
            describe_copy_position(&progress.position)
        ));
    }
}

/// `key id = 41`, `the start of the source's table 2`: where a first copy stands, for
/// progress lines and notes.
fn describe_copy_position(p: &strata_sources::CopyPosition) -> String {
    match &p.after {
        Some(w) => format!("key {}", describe_watermark(w)),
        None => format!("the start of the source's table {}", p.table + 1),
    }
}

/// Updates that left a TOASTed value unchanged (REPLICA IDENTITY DEFAULT) get the value the
/// key last had, from these changes or the table.
async fn fill_toast(
    cdc: &LogCdc,
    setup: &IngestSetup,
    read: &DatabaseRead,
    place: &str,
    table: Option<&DeltaTable>,
    raw: Vec<RecordBatch>,
    key_changes: std::collections::HashSet<(i64, i64)>,
) -> Result<Vec<RecordBatch>> {
    if !toast::has_unchanged(&raw) {
        return Ok(raw);
    }
    let source = read
        .cdc_table()
        .ok_or_else(|| EngineError::internal("a CDC source without its table"))?;
    let key = cdc
        .key_columns(source)
        .await
        .context(|| setup.err(place).to_string())?;
    let fill = toast::Toast {
        source: source.to_string(),
        key,
        bronze: match table {
            Some(t) => toast::Bronze::Table(t),
            None => toast::Bronze::Empty,
        },
        key_changes,
    };
    toast::fill_unchanged(raw, &fill)
        .await
        .map_err(|e| setup.err(format!("{place}: {e}")))
}

/// The CDC configuration of a CDC source.
fn cdc_config_of(setup: &IngestSetup) -> Option<strata_sources::CdcConfig> {
    match &setup.source {
        Source::Database { read, .. } => read.cdc_config(),
        _ => None,
    }
}

/// What a CDC run does once its commit holds the position: let the server drop the WAL
/// before it (PostgreSQL; the binlog keeps nothing for strata). Failing here loses nothing
/// (the next run skips what the table recorded); the slot just keeps more WAL until a
/// later run advances it.
struct SlotAdvance {
    cdc: LogCdc,
    to: Lsn,
}

impl SlotAdvance {
    async fn run(self) {
        advance_slot(&self.cdc, self.to).await;
    }
}

/// Advances the slot to `to`, which a commit holds; a failure is only warned about (see
/// [`SlotAdvance`]).
async fn advance_slot(cdc: &LogCdc, to: Lsn) {
    if let Err(e) = cdc.advance(to).await {
        tracing::warn!("the replication slot was not advanced to {to}: {e}");
    }
}

/// Where this run's read starts: after the stored watermark, or (with an overlap window)
/// at a point before it, with the table's rows from that point to drop what is read again.
async fn lower_bound(
    setup: &IngestSetup,
    read: &DatabaseRead,
    existing: Option<&DeltaTable>,
    stored: Option<&Watermark>,
) -> Result<(Option<LowerBound>, Option<Seen>)> {
    let (Some(stored), Some(table)) = (stored, existing) else {
        return Ok((None, None));
    };
    let ReadMode::Watermark {
        overlap: Some(window),
        ..
    } = read.mode
    else {
        return Ok((Some(LowerBound::after(stored.clone())), None));
    };
    let bound = stored
        .overlap(window)
        .context(|| format!("connection {}: the overlap window", read.connection))?;
    let (Some(column), Some(from)) = (stored.columns.first(), bound.watermark.values.first())
    else {
        return Ok((Some(bound), None));
    };
    let seen = overlap::rows_from(table, &setup.schema, column, from).await?;
    Ok((Some(bound), Some(seen)))
}

/// `updated_at = 2024-01-31 12:00:00+00, id = 7`: for reports and errors.
/// The progress line after a chunk's commit: rows read so far, the watermark committed.
fn committed_up_to(rows_read: impl std::fmt::Display, reached: &Watermark) -> String {
    format!(
        "{rows_read} row(s) read, committed up to {}",
        describe_watermark(reached)
    )
}

fn describe_watermark(w: &Watermark) -> String {
    w.columns
        .iter()
        .zip(&w.values)
        .map(|(c, v)| format!("{c} = {}", v.to_sql_text()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int64Array};
    use strata_sources::WatermarkValue;

    fn grp(values: &[i64]) -> RecordBatch {
        let column: ArrayRef = Arc::new(Int64Array::from(values.to_vec()));
        RecordBatch::try_from_iter([("grp", column)]).unwrap()
    }

    fn mark(v: i64) -> Watermark {
        Watermark {
            columns: vec!["grp".into()],
            values: vec![WatermarkValue::Int(v)],
        }
    }

    #[test]
    fn chunks_end_inside_a_batch_at_the_first_change_of_the_watermark() {
        let mut boundary = Boundary::new(&["grp".to_string()]);
        let batch = grp(&[0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 4]);
        // Full after rows 0..3: the rows of 1 stay together, the chunk ends before the 2;
        // the next is full after three more rows (2, 3, 3), and ends before the 4.
        let cuts = boundary.cuts(&batch, 0, 3, Some(&mark(4))).unwrap();
        assert_eq!(cuts, [(5, mark(1)), (10, mark(3))]);
        // A chunk holding two rows already is full after the first row of this batch.
        let cuts = boundary.cuts(&batch, 2, 3, Some(&mark(4))).unwrap();
        assert_eq!(cuts, [(2, mark(0)), (5, mark(1)), (10, mark(3))]);
        // No change after the chunk fills: no cut (the chunk closes at a later batch).
        assert!(boundary
            .cuts(&grp(&[1, 1, 1, 1]), 0, 2, Some(&mark(1)))
            .unwrap()
            .is_empty());
        // The batch fills no chunk.
        assert!(boundary
            .cuts(&batch, 0, 11, Some(&mark(4)))
            .unwrap()
            .is_empty());
        // Values that do not give the reader's own watermark of the last row: cut only
        // between batches.
        assert!(boundary
            .cuts(&batch, 0, 3, Some(&mark(9)))
            .unwrap()
            .is_empty());
    }
}
