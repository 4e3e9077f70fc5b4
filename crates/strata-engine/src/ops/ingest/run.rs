//! One run of an ingestion: new input → the query → expectations → downstream checks → one
//! commit.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::autoload;
use crate::ops::ingest::files::read_file;
use crate::ops::ingest::IngestReport;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Source;
use crate::ops::ingest::KEEP_LOG_PROPERTY;
use crate::ops::Scope;
use crate::sql::expect;
use crate::storage::adopt;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::feed;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use crate::util::steps::{step, Steps};
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::prelude::DataFrame;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::sync::Arc;
use strata_sql::FileFormat;
use strata_sql::TableName;
use strata_sql::SOURCE_PLACEHOLDER;

/// Where a query runs on each input of one run: with joins, a session over the warehouse
/// as it is now (the joined tables, the pipeline's views) and the query with its table
/// functions rewritten.
pub(super) struct Running {
    ctx: SessionContext,
    sql: String,
    /// An overlap window's rows already in the table (`sources/overlap.rs`): the query's
    /// rows equal to one of them are not appended again.
    pub(super) seen: Option<crate::sources::overlap::Seen>,
}

impl Running {
    pub(super) async fn new(wh: &Warehouse, setup: &IngestSetup) -> Result<Running> {
        let Some(j) = &setup.joins else {
            return Ok(Running {
                ctx: crate::storage::session::new_session(),
                sql: setup.query_sql.clone(),
                seen: None,
            });
        };
        let ctx = crate::sql::session::warehouse_session_in(wh, &j.schema).await?;
        crate::sql::views::register_views(wh, &ctx, &j.views, &j.schema, None)
            .await
            .map_err(|e| setup.err(e))?;
        let sql = crate::sql::session::rewrite(wh, &ctx, &setup.query_sql, &j.schema)
            .await
            .map_err(|e| setup.err(e))?;
        Ok(Running {
            ctx,
            sql,
            seen: None,
        })
    }
}

/// Applies the table's query to `input` rows and casts them to the table's schema. The flag
/// is true when the query passed the input's rows and columns through unchanged, already in
/// the table's column names and types (see `storage/adopt.rs`).
async fn apply_query(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
) -> Result<(Vec<RecordBatch>, bool)> {
    let ctx = &running.ctx;
    let _ = ctx.deregister_table(SOURCE_PLACEHOLDER);
    ctx.register_table(SOURCE_PLACEHOLDER, input.into_view())
        .context(|| "registering input".into())?;
    let query = ctx
        .sql(&running.sql)
        .await
        .context(|| format!("streaming table {}", setup.table.name))?;
    let unchanged = adopt::passes_rows_through(query.logical_plan())
        && adopt::same_columns(query.schema().as_arrow(), &setup.schema);
    let batches = query
        .collect()
        .await
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    let cast = batches
        .iter()
        .map(|b| {
            if setup.append_flow.is_some() || matches!(setup.source, Source::Changes(_)) {
                arrow::align_by_name(b, &setup.schema)
            } else {
                arrow::cast_batch(b, &setup.schema)
            }
        })
        .collect::<Result<Vec<_>>>()
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    Ok((
        cast.into_iter().filter(|b| b.num_rows() > 0).collect(),
        unchanged,
    ))
}

/// Rejects rows that a downstream flow would reject, naming `place`. Each flow's events,
/// checked, are added to `events` under the flow's name (for flows that read what is
/// appended).
async fn check_downstream(
    setup: &IngestSetup,
    rows: &[RecordBatch],
    place: &str,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    for flow_setup in &setup.downstream {
        let ctx = crate::storage::session::new_session();
        let table = MemTable::try_new(first.schema(), vec![rows.to_vec()])
            .context(|| "registering rows".into())?;
        ctx.register_table(SOURCE_PLACEHOLDER, Arc::new(table))
            .context(|| "registering rows".into())?;
        let checked = crate::eventstore::evaluate::evaluate_events(&ctx, flow_setup).await?;
        crate::semantics::events::validate_events(flow_setup, &checked, place)?;
        // A flow that takes its source's whole content (a snapshot in table mode) reads
        // the table, not the rows appended: nothing to keep for it.
        if !flow_setup.table_mode() {
            events
                .entry(flow_setup.flow.name.clone())
                .or_default()
                .extend(checked);
        }
    }
    Ok(())
}

/// The query's rows of one input, checked: expectations applied (counts added to
/// `report`), then the downstream flows' checks on the rows kept (their events added to
/// `events`). The flag is true when the rows are the input's, unchanged and all kept, in
/// the table's columns, with no NULL in a NOT NULL column.
pub(super) async fn checked_rows(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
    report: &mut IngestReport,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<(Vec<RecordBatch>, bool)> {
    let steps = crate::util::steps::Steps::new(setup.flow_name(), "ingest: ");
    let step =
        |what: &str| crate::util::steps::step!(debug, steps, format_args!("{what} ({place})"));
    let (mut rows, mut unchanged) = apply_query(setup, running, input, place).await?;
    step("read and applied the query");
    if let Some(seen) = &running.seen {
        rows = seen.drop_seen(rows)?;
        unchanged = false;
    }
    let before: usize = rows.iter().map(RecordBatch::num_rows).sum();
    report.rows_read += before;
    if !setup.table.expectations.is_empty() {
        let all = deltalake::arrow::compute::concat_batches(&setup.schema, &rows)
            .context(|| "concatenating rows".into())?;
        let (kept, counts) = expect::apply(
            &setup.table.expectations,
            &setup.table.name.to_string(),
            place,
            all,
        )
        .await?;
        report.rows_dropped += before - kept.num_rows();
        unchanged &= kept.num_rows() == before;
        expect::accumulate(&mut report.expectations, counts);
        rows = vec![kept];
        step("applied the expectations");
    }
    check_downstream(setup, &rows, place, events).await?;
    step("checked the rows for the downstream flows");
    unchanged &= setup
        .schema
        .fields()
        .iter()
        .enumerate()
        .all(|(i, f)| f.is_nullable() || rows.iter().all(|b| b.column(i).null_count() == 0));
    Ok((rows, unchanged))
}

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
        ..Default::default()
    };
    let existing = scope.wh.open_table(&setup.table.name).await?;
    let taken = match &setup.source {
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
    };
    if let Some(mut taken) = taken {
        let after_commit = taken.after_commit.take();
        // A take that committed chunks of its own builds on its last one.
        let existing = taken.base.take().or(existing);
        commit_rows(scope, setup, existing, taken, &mut report).await?;
        if let Some(advance) = after_commit {
            advance.run().await;
        }
    }
    Ok(report)
}

/// What one ingestion takes, checked, before its commit.
pub(super) struct Taken {
    /// Rows to write (their files are written at the commit).
    pub(super) parts: Vec<RecordBatch>,
    /// Parquet input files taken into the table as they are (`storage/adopt.rs`).
    pub(super) reused: Vec<adopt::Reusable>,
    /// The downstream flows' events of the rows taken, handed over after the commit.
    pub(super) events: HashMap<String, Vec<RecordBatch>>,
    /// What the commit records (the files, source version or watermark taken).
    pub(super) commit: PendingCommit,
    /// What to do once the commit is in (a CDC source's slot is advanced).
    pub(super) after_commit: Option<super::database::SlotAdvance>,
    /// The table as of the last chunk a take committed itself (a large watermark load),
    /// which this commit builds on: a writer that recorded the same position since then
    /// makes it conflict.
    pub(super) base: Option<DeltaTable>,
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
        return Err(EngineError::Internal("not a file source".into()));
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
    let mut taken = Taken {
        parts: Vec::new(),
        reused: Vec::new(),
        events: HashMap::new(),
        commit: files_commit(scope, setup, existing, &new).await?,
        after_commit: None,
        base: None,
    };
    for (n, file) in new.iter().enumerate() {
        let path = dir.file(file).await?;
        let place = format!("file {}", path.display());
        let df = read_input_file(setup, &path, file).await?;
        let (rows, unchanged) =
            checked_rows(setup, &running, df, &place, report, &mut taken.events).await?;
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
    report.files = new;
    Ok(Some(taken))
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

/// One input file as a DataFrame: read Auto Loader style (inferred or declared columns,
/// rescued data) or with DataFusion's reader, with `_metadata` when the query asks for it.
async fn read_input_file(
    setup: &IngestSetup,
    path: &std::path::Path,
    file: &str,
) -> Result<DataFrame> {
    let Source::Files {
        spec, mode, input, ..
    } = &setup.source
    else {
        return Err(EngineError::Internal("not a file source".into()));
    };
    let ctx = crate::storage::session::file_session();
    let df = match (mode, input) {
        (autoload::Mode::Autoload { rescued, inferred }, Some(columns)) => {
            let batch = autoload::read(
                path,
                file,
                spec,
                &autoload::schema_of(columns),
                rescued.as_str(),
                !inferred,
            )?;
            ctx.read_batch(batch)
                .context(|| format!("file {}", path.display()))?
        }
        _ => read_file(&ctx, path, spec).await?,
    };
    match autoload::wants_metadata(&setup.query_sql) {
        true => autoload::with_metadata(df, path),
        false => Ok(df),
    }
}

/// The commit of a run taking files `new`: the files (and the inferred input columns) in
/// its commit info, the next count of [`AppId::Files`], and a log that must not be trimmed:
/// the files taken are recorded only there (Delta writers delete expired commit files once
/// a checkpoint covers them, and the next run would take their files again).
async fn files_commit(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    new: &[String],
) -> Result<PendingCommit> {
    let id = AppId::Files(setup.append_flow.as_deref());
    let previous = match existing {
        Some(t) => position(t, id).await?,
        None => None,
    };
    let mut commit = PendingCommit::of_run(scope.run_id)
        .keeping_log()
        .with_info(setup.files_key(), serde_json::json!(new))
        .at(id, previous.map_or(0, |v| v + 1));
    if let Source::Files {
        mode: autoload::Mode::Autoload { inferred: true, .. },
        input: Some(columns),
        ..
    } = &setup.source
    {
        commit = commit.with_info(
            setup.schema_key(),
            crate::storage::ledger::columns_to_json(columns),
        );
    }
    Ok(commit)
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
    Ok(Some(Taken {
        parts,
        reused: Vec::new(),
        events,
        commit: PendingCommit::of_run(scope.run_id).at(id, version),
        after_commit: None,
        base: None,
    }))
}

/// Commits what was taken in one commit (creating the table on its first run, adding
/// columns when its schema evolves), then hands the downstream flows' events over. Returns
/// the version committed.
pub(super) async fn commit_rows(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<DeltaTable>,
    mut taken: Taken,
    report: &mut IngestReport,
) -> Result<i64> {
    let name = &setup.table.name;
    report.rows += taken.parts.iter().map(RecordBatch::num_rows).sum::<usize>();
    if taken.parts.is_empty() && taken.reused.is_empty() {
        // The input is taken even when the query keeps none of its rows.
        taken
            .parts
            .push(RecordBatch::new_empty(setup.schema.clone()));
    }
    let table = match existing {
        Some(t) => t,
        None => create_table(scope, setup).await?,
    };
    if setup.evolve {
        let props = crate::storage::write::writer_properties(&table);
        let written = table
            .write(taken.parts)
            .with_writer_properties(props)
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(taken.commit.properties())
            .with_schema_mode(deltalake::operations::write::SchemaMode::Merge)
            .await
            .context(|| format!("streaming table {name}: committing"))?;
        return Ok(written.version().map_or(-1, |v| v as i64));
    }
    // The version before, as a downstream flow's position counts it (`None`: no data files
    // yet); unknown when the table state cannot be read.
    let before = table
        .snapshot()
        .ok()
        .map(|s| (s.log_data().num_files() > 0).then(|| crate::storage::table::version_of(&table)));
    let steps = Steps::new(setup.flow_name(), "ingest: ");
    let table_dir = scope.wh.table_location(name);
    let mut adds = Vec::with_capacity(taken.reused.len());
    for f in &taken.reused {
        adds.push(adopt::copy_in(f, &table_dir).await?);
    }
    if !adds.is_empty() {
        step!(debug, steps, "copied the reused parquet files in");
    }
    let after = crate::storage::write::append(&table, taken.parts, adds, &taken.commit).await?;
    step!(debug, steps, "appended and committed");
    if let (Some(before), true) = (before, after >= 0) {
        scope.handoff.keep(name, before, after, taken.events);
    }
    Ok(after)
}

/// Creates the streaming table with its declared properties; one that takes files keeps
/// its whole log (see [`files_commit`]), for other writers (Spark, delta-rs) too.
async fn create_table(scope: &Scope<'_>, setup: &IngestSetup) -> Result<DeltaTable> {
    let properties = &setup.table.properties;
    let mut configuration = crate::storage::table::table_configuration(properties);
    // A change-history table's log also records the source's table id next to its
    // position: kept like the record of files taken.
    let keeps_log = matches!(
        setup.source,
        Source::Files { .. } | Source::Database { .. } | Source::Changes(_)
    );
    if keeps_log && !crate::storage::table::sets_property(properties, KEEP_LOG_PROPERTY) {
        configuration.push((KEEP_LOG_PROPERTY.to_string(), Some("false".to_string())));
    }
    if matches!(setup.source, Source::Changes(_)) {
        match properties.get(APPEND_ONLY_PROPERTY) {
            Some(v) if !v.eq_ignore_ascii_case("true") => {
                return Err(setup.err(format!(
                    "'{APPEND_ONLY_PROPERTY}' = '{v}': a change-history table is append-only; \
                     leave the property out"
                )))
            }
            Some(_) => {}
            None => configuration.push((APPEND_ONLY_PROPERTY.to_string(), Some("true".into()))),
        }
    }
    let name = &setup.table.name;
    let partitions = &setup.table.partitioned_by;
    crate::storage::table::check_partition_columns(&setup.schema, partitions)
        .map_err(|e| setup.err(e))?;
    crate::storage::table::create_delta(
        &scope.wh.table_location(name),
        &name.name,
        &setup.schema,
        configuration,
        setup.table.comment.as_deref(),
        partitions.clone(),
    )
    .await
}

/// Delta's switch refusing every commit that removes or changes rows.
const APPEND_ONLY_PROPERTY: &str = "delta.appendOnly";
