//! One run of an ingestion: new input → the query → expectations → downstream checks → one
//! commit.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::autoload;
use crate::ops::ingest::commit::{commit_rows, files_commit, Taken};
use crate::ops::ingest::files::read_input_file;
use crate::ops::ingest::rows::{self, checked_rows, Running};
use crate::ops::ingest::IngestReport;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Source;
use crate::ops::Scope;
use crate::storage::adopt;
use crate::storage::commit::{position, PendingCommit};
use crate::storage::feed;
use deltalake::arrow::array::RecordBatch;
use deltalake::DeltaTable;
use futures::future::BoxFuture;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use strata_sql::FileFormat;
use strata_sql::ReadFiles;
use strata_sql::TableName;

/// Whether Parquet input files may be taken into the table as they are: not turned off by
/// `strata.ingest.reuseFiles = false`, and the table has no partitions, column mapping,
/// constraints, generated columns or row tracking, which a copied file would bypass.
fn reuse_allowed(setup: &IngestSetup, existing: Option<&DeltaTable>) -> bool {
    let blocked = |k: &str, v: &str| {
        (k == adopt::REUSE_PROPERTY && v.eq_ignore_ascii_case("false"))
            || k.starts_with("delta.constraints.")
            || k.starts_with("delta.columnMapping")
            || (k == "delta.enableRowTracking" && v.eq_ignore_ascii_case("true"))
    };
    if setup.table.properties.iter().any(|(k, v)| blocked(k, v)) {
        return false;
    }
    if setup
        .schema
        .fields()
        .iter()
        .any(|f| !f.metadata().is_empty())
    {
        return false;
    }
    match existing.map(DeltaTable::snapshot) {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(state)) => {
            let meta = state.metadata();
            meta.partition_columns().is_empty()
                && !meta
                    .configuration()
                    .iter()
                    .any(|(k, v)| blocked(k, v.as_str()))
        }
    }
}

/// Runs one ingestion: new input → one commit ([`take_files`] or [`take_table`], then
/// [`commit_rows`]).
pub(crate) async fn run_ingest(scope: &Scope<'_>, setup: &IngestSetup) -> Result<IngestReport> {
    let mut report = IngestReport {
        table: setup.table.name.to_string(),
        flow: setup.flow_name().to_string(),
        append: setup.append_flow.is_some(),
        once: setup.once,
        ..Default::default()
    };
    let existing = scope.wh.open_table(&setup.table.name).await?;
    let taken = match &setup.source {
        _ if setup.once => {
            super::once::take_once(scope, setup, existing.as_ref(), &mut report).await?
        }
        Source::Files { .. } => take_files(scope, setup, existing.as_ref(), &mut report).await?,
        Source::Database { .. } => {
            super::database::take_database(scope, setup, existing.as_ref(), &mut report).await?
        }
        Source::Table(source) | Source::Feed(source) => {
            take_table(scope, setup, source, existing.as_ref(), &mut report).await?
        }
        Source::Changes(_) => {
            super::history::take_changes(scope, setup, existing.as_ref(), &mut report).await?
        }
        Source::Batch => {
            return Err(EngineError::internal(format!(
                "{} reads tables in batch but is not a once flow",
                setup.flow_name()
            )))
        }
    };
    if let Some(mut taken) = taken {
        let after_commit = taken.after_commit.take();
        // A take that committed chunks of its own builds on its last one.
        let existing = taken.base.take().or(existing);
        commit_rows(scope, setup, existing, taken, &mut report).await?;
        if let Some(after) = after_commit {
            after().await;
        }
    }
    Ok(report)
}

/// The input files not taken yet, in file-name order, each read, run through the query and
/// checked; `None` (the report says why) when there is none.
async fn take_files(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let Source::Files {
        dir,
        spec,
        mode,
        pending,
        ..
    } = &setup.source
    else {
        return Err(EngineError::internal("not a file source"));
    };
    let new = files_to_take(scope, setup, dir, pending.as_deref(), existing).await?;
    if new.is_empty() {
        report.skipped = Some("no new files".into());
        return Ok(None);
    }
    let running = Running::new(scope.wh, setup).await?;
    let reuse = spec.format == FileFormat::Parquet
        && matches!(mode, autoload::Mode::Declared)
        && !autoload::wants_metadata(&setup.query_sql)
        && !setup.evolve
        && setup.append_flow.is_none()
        && reuse_allowed(setup, existing);
    let commit = files_commit(scope, setup, existing, &new).await?;
    let mut taken = Taken::rows(Vec::new(), HashMap::new(), commit);
    // The flows' checked events are kept for them while they take at most a share of the
    // memory limit; past it the flows read the files back (a bulk load streams them).
    let mut keep_events = true;
    let mut not_kept = HashMap::new();
    // Two files are read and run through the query at a time, in sessions of their own
    // (without joins, whose session is the warehouse's): the next file's read overlaps
    // this one's checks and the end of its read, when one core is idle. The files are
    // checked and taken one by one, in file-name order.
    let lanes = match setup.joins {
        None => vec![running, Running::new(scope.wh, setup).await?],
        Some(_) => vec![running],
    };
    let reads: Vec<_> = (new.iter().enumerate())
        .map(|(n, file)| read_and_query(setup, &lanes[n % lanes.len()], n, file))
        .collect();
    let mut queried = futures::stream::iter(reads).buffered(lanes.len());
    while let Some(read) = queried.next().await {
        let QueriedFile {
            n,
            path,
            place,
            rows,
        } = read?;
        let events = match keep_events {
            true => &mut taken.events,
            false => &mut not_kept,
        };
        let running = &lanes[n % lanes.len()];
        let (rows, unchanged) =
            rows::checked_queried_rows(setup, running, rows, &place, report, events)
                .await
                .map_err(|e| name_the_line(setup, spec, &path, e))?;
        not_kept.clear();
        if keep_events && kept_bytes(&taken.events) > scope.memory / KEPT_EVENTS_SHARE {
            taken.events.clear();
            keep_events = false;
        }
        let has_rows = rows.iter().any(|b| b.num_rows() > 0);
        let reusable = match reuse && unchanged && has_rows {
            true => adopt::inspect(&path, &setup.schema)?,
            false => None,
        };
        match reusable {
            Some(file) => {
                report.rows += rows.iter().map(RecordBatch::num_rows).sum::<usize>();
                taken.reused.push(file);
            }
            None => taken.parts.extend(rows),
        }
        (scope.update)(format!(
            "{} of {} file(s), {} row(s)",
            n + 1,
            new.len(),
            report.rows_read
        ));
    }
    drop(queried);
    report.files = new;
    Ok(Some(taken))
}

/// One input file read and run through the query, not checked yet.
struct QueriedFile {
    /// The file's place among the run's files.
    n: usize,
    path: PathBuf,
    /// The file as errors name it.
    place: String,
    /// The query's rows, and whether they are the file's own (`rows::apply_query`).
    rows: (Vec<RecordBatch>, bool),
}

/// Input `file` (the run's `n`th) read and run through the query in `running`'s session.
/// Boxed: the futures go into a stream that is held across awaits.
fn read_and_query<'a>(
    setup: &'a IngestSetup,
    running: &'a Running,
    n: usize,
    file: &'a str,
) -> BoxFuture<'a, Result<QueriedFile>> {
    Box::pin(async move {
        let Source::Files { dir, spec, .. } = &setup.source else {
            return Err(EngineError::internal("not a file source"));
        };
        let path = dir.file(file).await?;
        let place = format!("file {}", path.display());
        let df = read_input_file(setup, &path, file).await?;
        let rows = rows::apply_query(setup, running, df, &place)
            .await
            .map_err(|e| name_the_line(setup, spec, &path, e))?;
        Ok(QueriedFile {
            n,
            path,
            place,
            rows,
        })
    })
}

/// The share of the memory limit the checked events kept for the flows may take.
const KEPT_EVENTS_SHARE: u64 = 4;

/// The memory the kept events hold.
fn kept_bytes(events: &HashMap<String, Vec<RecordBatch>>) -> u64 {
    events
        .values()
        .flatten()
        .map(|b| b.get_array_memory_size() as u64)
        .sum()
}

/// The files a run takes: those its preparation inferred the columns from (inferred Auto
/// Loader mode), else every file under `dir` the table has not taken.
async fn files_to_take(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    dir: &super::files::InputDir,
    pending: Option<&[String]>,
    existing: Option<&DeltaTable>,
) -> Result<Vec<String>> {
    if let Some(files) = pending {
        return Ok(files.to_vec());
    }
    let taken = match existing {
        Some(t) => setup.taken(scope.wh, t).await?.files,
        None => BTreeSet::new(),
    };
    Ok(dir
        .list()
        .await?
        .into_iter()
        .filter(|f| !taken.contains(f))
        .collect())
}

/// The rows of `source_name` added since the table last read it (its change feed for an
/// AUTO CDC target), run through the query and checked; `None` (the report says why) when
/// there are none.
async fn take_table(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    source_name: &TableName,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let Some(source) = scope.wh.open_table(source_name).await? else {
        report.skipped = Some(format!("source {source_name} has no data yet"));
        return Ok(None);
    };
    let id = setup.source_app_id(source_name);
    let from = match existing {
        Some(t) => position(t, id).await?,
        None => None,
    };
    let version = crate::storage::table::version_of(&source);
    if from.is_some_and(|f| f >= version) {
        report.skipped = Some("no new input".into());
        return Ok(None);
    }
    let changes = crate::storage::changes::changes_since(&source, from).await?;
    if changes.only_upkeep {
        report.skipped = Some("no new input (only upkeep commits such as OPTIMIZE)".into());
        return Ok(None);
    }
    let ctx = crate::storage::session::new_session();
    let df = if matches!(setup.source, Source::Feed(_)) {
        let feed = feed::read_feed(&source, from, Some(version), false).await?;
        ctx.read_batch(feed)
            .context(|| "reading the change feed".into())?
    } else {
        crate::storage::changes::register_new_rows(
            &ctx,
            "__strata_input",
            &source,
            from,
            version,
            &changes,
        )
        .await?;
        ctx.table("__strata_input")
            .await
            .context(|| "reading source".into())?
    };
    let place = format!(
        "the rows of {source_name} added after version {}",
        from.map_or("(start)".to_string(), |v| v.to_string())
    );
    let running = Running::new(scope.wh, setup).await?;
    let mut events = HashMap::new();
    let (parts, _) = checked_rows(setup, &running, df, &place, report, &mut events).await?;
    Ok(Some(Taken::rows(
        parts,
        events,
        PendingCommit::of_run(scope.run_id).at(id, version),
    )))
}

/// A JSON input file that failed to read, named with its first line that does not parse
/// (Arrow's reader says what went wrong but not where); other errors as they are.
fn name_the_line(
    setup: &IngestSetup,
    spec: &ReadFiles,
    path: &Path,
    e: EngineError,
) -> EngineError {
    if spec.format != FileFormat::Json {
        return e;
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return e;
    };
    match super::files::first_bad_json_line(&text) {
        Some(bad) => setup.err(format!("file {} {bad}", path.display())),
        None => e,
    }
}
