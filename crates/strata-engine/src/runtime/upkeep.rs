//! Table upkeep: `strata optimize` and `strata vacuum`.
//!
//! ```text
//!   optimize   every table (or the ones named), the event log ─▶ deltalake's OPTIMIZE:
//!              small files bin-packed to the target size (or Z-ordered), one commit per
//!              table, dataChange = false: readers see the same rows (storage/changes.rs);
//!              the targets' event stores ─▶ rewritten in key order, expired tombstones
//!              forgotten (runtime/store_upkeep.rs, eventstore/compact.rs)
//!   vacuum     the tables, the event log, the event stores ─▶ deltalake's VACUUM (full):
//!              files no version inside the retention window references, except those a
//!              pending reader of a pipeline still reads; then, when asked, event-log
//!              records older than N days and the tables set aside by --full-refresh
//! ```
//!
//! The readers a vacuum protects are the pipeline's own: every streaming table, append
//! flow, AUTO CDC flow and point-in-time table that reads a table by position (a version
//! recorded in a Delta application transaction). It finds them by planning the pipelines
//! (the ones named, else the ones the event log records) and reading their positions.
//! The pipelines' flows also say what an event-store compaction may forget.

use crate::error::{Context, EngineError, Result};
use crate::runtime::options::{Optimized, MANAGED_PROPERTY, MIN_FILES_PROPERTY, ZORDER_PROPERTY};
use crate::runtime::store_upkeep;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::location::Location;
use crate::storage::table::{file_stats, open_delta, property, table_properties};
use crate::storage::warehouse::{Warehouse, EVENT_LOG_TABLE};
use deltalake::operations::optimize::OptimizeType;
use deltalake::operations::vacuum::VacuumMode;
use deltalake::DeltaTable;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::time::Instant;
use strata_sql::{PipelinePlan, QuerySource, ScdType, TableName};

/// The retention window VACUUM keeps by default: 7 days, as Delta's
/// `delta.deletedFileRetentionDuration`.
pub const DEFAULT_RETAIN_HOURS: f64 = 168.0;

/// What `strata optimize` does.
#[derive(Debug, Clone, Default)]
pub struct OptimizeOptions {
    /// Tables (`name`, `schema.name`, `event_log`); empty: every table and the event log.
    pub tables: Vec<String>,
    /// Z-order by these columns instead of bin-packing (else by the table's
    /// `pipelines.autoOptimize.zOrderCols`, if set).
    pub zorder_by: Vec<String>,
    /// The file size to bin-pack to, in bytes (else the table's `delta.targetFileSize`,
    /// else deltalake's default, 100 MiB).
    pub target_size: Option<u64>,
    /// The pipelines whose flows say what event stores may forget; empty: those the event
    /// log records.
    pub pipelines: Vec<PathBuf>,
    /// Configuration values for planning `pipelines`.
    pub configuration: BTreeMap<String, String>,
    /// The memory, in bytes, an event store's sort may hold before it spills to disk
    /// (else 512 MiB).
    pub sort_memory: Option<u64>,
}

/// Optimizes the tables `options` names (every table and the event log when none), one
/// atomic commit each with `dataChange = false`.
pub async fn optimize(wh: &Warehouse, options: &OptimizeOptions) -> Result<Vec<Optimized>> {
    let run = PendingCommit::of_run(&upkeep_run_id("optimize")).keeping_log();
    let targets = targets(wh, &options.tables, true).await?;
    let plans = match targets.iter().any(|t| t.store_of.is_some()) {
        true => pipeline_plans(wh, &options.pipelines, &options.configuration).await,
        false => Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for target in targets {
        out.push(match &target.store_of {
            None => optimize_one(&target, options, &run).await?,
            Some(of) => {
                let forget = match &plans {
                    Ok(plans) => store_upkeep::forget_rule(plans, of)?,
                    Err(why) => store_upkeep::Forget::Nothing(why.clone()),
                };
                store_upkeep::optimize_store(
                    of,
                    &target.label,
                    &target.path,
                    wh,
                    &forget,
                    options.sort_memory,
                    &run,
                )
                .await?
            }
        });
    }
    Ok(out)
}

/// The plans of `pipelines` (else of those the event log records); why not, when one
/// cannot be planned.
async fn pipeline_plans(
    wh: &Warehouse,
    pipelines: &[PathBuf],
    configuration: &BTreeMap<String, String>,
) -> std::result::Result<Vec<PipelinePlan>, String> {
    let paths = match pipelines.is_empty() {
        false => pipelines.to_vec(),
        true => logged_pipelines(wh)
            .await
            .map_err(|e| format!("the event log cannot be read: {}", crate::error::chain(&e)))?,
    };
    let mut plans = Vec::new();
    for path in paths {
        let (plan, _) = plan_any(&path, configuration, wh.catalog()).map_err(|e| {
            format!(
                "pipeline {} cannot be planned ({}); name the pipelines with --pipeline FILE \
                 (and their --conf values)",
                path.display(),
                crate::error::chain(&e)
            )
        })?;
        plans.push(plan);
    }
    Ok(plans)
}

async fn optimize_one(
    target: &Target,
    options: &OptimizeOptions,
    run: &PendingCommit,
) -> Result<Optimized> {
    let started = Instant::now();
    let table = open_target(target).await?;
    let properties = table_properties(&table)?;
    let (files_before, bytes_before) = file_stats(&table)?;
    let mut report = Optimized {
        table: target.label.clone(),
        files_before,
        files_after: files_before,
        bytes_before,
        bytes_after: bytes_before,
        version: crate::storage::table::version_of(&table),
        ..Default::default()
    };
    let unmanaged = property(&properties, MANAGED_PROPERTY).is_some_and(|v| v == "false");
    if !target.named && unmanaged {
        report.skipped = Some(format!("{MANAGED_PROPERTY} = false"));
        return Ok(report);
    }
    let zorder_by = match options.zorder_by.is_empty() {
        false => options.zorder_by.clone(),
        true => property(&properties, ZORDER_PROPERTY)
            .map(|v| {
                v.split(',')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
    };
    check_columns(&table, &target.label, &zorder_by)?;
    let mut builder = table
        .clone()
        .optimize()
        .with_writer_properties(crate::storage::write::writer_properties(&table))
        .with_commit_properties(run.properties());
    if !zorder_by.is_empty() {
        builder = builder.with_type(OptimizeType::ZOrder(zorder_by.clone()));
    }
    if let Some(size) = options.target_size.and_then(NonZeroU64::new) {
        builder = builder.with_target_size(size);
    }
    let (after, metrics) = builder
        .await
        .context(|| format!("optimizing {}", target.label))?;
    let (files_after, bytes_after) = file_stats(&after)?;
    report.files_after = files_after;
    report.bytes_after = bytes_after;
    report.files_removed = metrics.num_files_removed;
    report.files_added = metrics.num_files_added;
    report.zorder_by = zorder_by;
    report.version = crate::storage::table::version_of(&after);
    report.millis = started.elapsed().as_millis();
    Ok(report)
}

/// Optimizes each of `tables` (written by a run that just ended) whose
/// `pipelines.autoOptimize.minFiles` its file count has reached, then compacts the small
/// files of the event stores of `targets` (the AUTO CDC targets it wrote) where there are
/// enough. A failure (another writer committed first, say) is logged and leaves the table
/// for the next run: the run itself succeeded.
pub(crate) async fn auto_optimize(
    wh: &Warehouse,
    tables: &[TableName],
    targets: &[TableName],
) -> Vec<Optimized> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for t in tables {
        if !seen.insert(t.clone()) {
            continue;
        }
        match auto_optimize_one(wh, t).await {
            Ok(Some(report)) => out.push(report),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "{t}: not optimized after the run ({MIN_FILES_PROPERTY}): {}",
                crate::error::chain(&e)
            ),
        }
    }
    let run = PendingCommit::of_run(&upkeep_run_id("compact")).keeping_log();
    let mut seen = BTreeSet::new();
    for t in targets {
        if !seen.insert(t.clone()) {
            continue;
        }
        match store_upkeep::compact_small_files(wh, t, &run).await {
            Ok(Some(report)) => out.push(report),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "{t}: its event store's small files not compacted after the run: {}",
                crate::error::chain(&e)
            ),
        }
    }
    out
}

async fn auto_optimize_one(wh: &Warehouse, name: &TableName) -> Result<Option<Optimized>> {
    let Some(table) = wh.open_table(name).await? else {
        return Ok(None);
    };
    let properties = table_properties(&table)?;
    let Some(min) = property(&properties, MIN_FILES_PROPERTY) else {
        return Ok(None);
    };
    let min: usize = min.trim().parse().map_err(|_| {
        EngineError::plan(format!(
            "{name}: {MIN_FILES_PROPERTY} must be a number of files, got '{min}'"
        ))
    })?;
    if file_stats(&table)?.0 < min.max(2) {
        return Ok(None);
    }
    let target = Target {
        label: name.to_string(),
        name: Some(name.clone()),
        path: wh.table_location(name),
        named: false,
        store_of: None,
    };
    let run = PendingCommit::of_run(&upkeep_run_id("optimize")).keeping_log();
    let report = optimize_one(&target, &OptimizeOptions::default(), &run).await?;
    Ok((report.skipped.is_none() && report.files_removed > 0).then_some(report))
}

/// The Z-order columns must be columns of the table and not its partition columns.
fn check_columns(table: &DeltaTable, label: &str, columns: &[String]) -> Result<()> {
    let schema = crate::storage::table::table_schema(table)?;
    let partitions = table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .partition_columns()
        .to_vec();
    for c in columns {
        if schema.field_with_name(c).is_err() {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(EngineError::plan(format!(
                "optimize {label}: no column {c} to Z-order by (its columns: {})",
                names.join(", ")
            )));
        }
        if partitions.contains(c) {
            return Err(EngineError::plan(format!(
                "optimize {label}: {c} is a partition column; Z-order by other columns \
                 (each partition is ordered on its own)"
            )));
        }
    }
    Ok(())
}

/// What `strata vacuum` does.
#[derive(Debug, Clone)]
pub struct VacuumOptions {
    /// Tables (`name`, `schema.name`, `event_log`); empty: every table, the event log and
    /// every event store.
    pub tables: Vec<String>,
    /// Keep files that versions of the last `retain_hours` reference.
    pub retain_hours: f64,
    /// Allow `retain_hours` below [`DEFAULT_RETAIN_HOURS`] (and below a table's own
    /// `delta.deletedFileRetentionDuration`).
    pub allow_short_retention: bool,
    /// Only list what would be removed.
    pub dry_run: bool,
    /// The pipelines whose readers to protect; empty: those the event log records.
    pub pipelines: Vec<PathBuf>,
    /// Configuration values for planning `pipelines`.
    pub configuration: BTreeMap<String, String>,
    /// Also delete event-log records that started more than this many days ago.
    pub event_log_days: Option<u32>,
    /// Also delete the tables `--full-refresh` set aside before the retention window.
    pub set_aside: bool,
}

impl Default for VacuumOptions {
    fn default() -> Self {
        VacuumOptions {
            tables: Vec::new(),
            retain_hours: DEFAULT_RETAIN_HOURS,
            allow_short_retention: false,
            dry_run: false,
            pipelines: Vec::new(),
            configuration: BTreeMap::new(),
            event_log_days: None,
            set_aside: false,
        }
    }
}

/// One table's vacuum.
#[derive(Debug, Clone, Default)]
pub struct Vacuumed {
    pub table: String,
    /// Files deleted (or, in a dry run, that would be), relative to the table.
    pub files: Vec<String>,
    /// Readers whose unread files were kept, one sentence each.
    pub kept_for: Vec<String>,
}

/// What `strata vacuum` did.
#[derive(Debug, Clone, Default)]
pub struct VacuumReport {
    pub dry_run: bool,
    pub tables: Vec<Vacuumed>,
    /// Event-log records deleted (or that would be).
    pub event_log_records: Option<usize>,
    /// Set-aside folders deleted (or that would be).
    pub set_aside: Vec<Location>,
    /// The pipelines whose readers were protected.
    pub pipelines: Vec<String>,
}

/// Vacuums the tables `options` names (every table, the event log and the event stores
/// when none), keeping what pending readers still need.
pub async fn vacuum(wh: &Warehouse, options: &VacuumOptions) -> Result<VacuumReport> {
    let targets = targets(wh, &options.tables, true).await?;
    check_retention(options, &targets)?;
    let (pipelines, readers) = pipeline_readers(wh, options).await?;
    let mut report = VacuumReport {
        dry_run: options.dry_run,
        pipelines,
        ..Default::default()
    };
    if let Some(days) = options.event_log_days {
        report.event_log_records = Some(trim_event_log(wh, days, options.dry_run).await?);
    }
    if options.set_aside {
        report.set_aside = remove_set_aside(wh, options).await?;
    }
    let run = PendingCommit::of_run(&upkeep_run_id("vacuum")).keeping_log();
    for target in &targets {
        report
            .tables
            .push(vacuum_one(target, options, &readers, &run).await?);
    }
    Ok(report)
}

fn check_retention(options: &VacuumOptions, targets: &[Target]) -> Result<()> {
    if !options.retain_hours.is_finite() || options.retain_hours < 0.0 {
        return Err(EngineError::plan(format!(
            "vacuum: --retain must be a number of hours, 0 or more, got {}",
            options.retain_hours
        )));
    }
    if options.retain_hours >= DEFAULT_RETAIN_HOURS || options.allow_short_retention {
        return Ok(());
    }
    let names: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
    Err(EngineError::plan(format!(
        "vacuum refused: --retain {} hour(s) is shorter than the default {} hours (7 days); \
         a reader still on an older version of {} (a query, Spark, DuckDB, a run in flight) \
         would lose its files, and time travel before the window breaks. Nothing was \
         removed; pass --allow-short-retention to vacuum with this window anyway",
        options.retain_hours,
        DEFAULT_RETAIN_HOURS,
        if names.len() == 1 {
            names[0].to_string()
        } else {
            format!("these tables ({})", names.join(", "))
        }
    )))
}

async fn vacuum_one(
    target: &Target,
    options: &VacuumOptions,
    readers: &[Reader],
    run: &PendingCommit,
) -> Result<Vacuumed> {
    let table = open_target(target).await?;
    let mut report = Vacuumed {
        table: target.label.clone(),
        ..Default::default()
    };
    let mut keep: BTreeSet<i64> = BTreeSet::new();
    let mut retention_ms = (options.retain_hours * 3_600_000.0) as i64;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let latest = crate::storage::table::version_of(&table);
    for reader in readers
        .iter()
        .filter(|r| target.name.as_ref() == Some(&r.source))
    {
        let from = reader.position.unwrap_or(-1);
        if from >= latest {
            continue;
        }
        let unread = crate::storage::changes::unread_since(&table, from).await?;
        let place = format!(
            "{} has not read yet ({}; it reads after version {from})",
            reader.name, reader.pipeline
        );
        if !unread.versions.is_empty() {
            report.kept_for.push(format!(
                "kept the files of {} version(s) of {} that {place}",
                unread.versions.len(),
                target.label,
            ));
            keep.extend(unread.versions);
        }
        if let Some(at) = unread.oldest_change_files {
            // Change files are no version's files: keep every file written since the
            // oldest commit that wrote some, with an hour's margin for its writing.
            let needed = now_ms.saturating_sub(at).saturating_add(3_600_000);
            if needed > retention_ms {
                retention_ms = needed;
                report.kept_for.push(format!(
                    "kept the files of {} written in the last {:.1} hour(s): change files \
                     that {place}",
                    target.label,
                    needed as f64 / 3_600_000.0
                ));
            }
        }
    }
    let keep: Vec<u64> = keep
        .into_iter()
        .filter_map(|v| u64::try_from(v).ok())
        .collect();
    let retention = chrono::Duration::milliseconds(retention_ms);
    let mut builder = table
        .vacuum()
        .with_mode(VacuumMode::Full)
        .with_retention_period(retention)
        .with_enforce_retention_duration(!options.allow_short_retention)
        .with_dry_run(options.dry_run)
        .with_commit_properties(run.properties());
    if !keep.is_empty() {
        builder = builder.with_keep_versions(&keep);
    }
    let (_, metrics) = builder
        .await
        .context(|| format!("vacuuming {}", target.label))?;
    let root = match &target.path {
        Location::Local(p) => p.to_string_lossy().to_string(),
        Location::Object(u) => u.path().trim_matches('/').to_string(),
    };
    report.files = metrics
        .files_deleted
        .into_iter()
        .map(|f| relative_to(&f, &root))
        .collect();
    report.files.sort();
    Ok(report)
}

/// `file` (a path or URL deltalake reports) relative to the table folder `root`.
fn relative_to(file: &str, root: &str) -> String {
    let trimmed = file.strip_prefix("file://").unwrap_or(file);
    trimmed
        .strip_prefix(root)
        .map(|r| r.trim_start_matches('/').to_string())
        .unwrap_or_else(|| file.to_string())
}

/// A reader of a table by position.
#[derive(Debug, Clone)]
struct Reader {
    /// `flow users_flow`, `streaming table default.silver`, ...
    name: String,
    pipeline: String,
    source: TableName,
    /// The version it has read up to; `None`: it has read nothing yet.
    position: Option<i64>,
}

/// The pipelines to protect and their readers by position.
async fn pipeline_readers(
    wh: &Warehouse,
    options: &VacuumOptions,
) -> Result<(Vec<String>, Vec<Reader>)> {
    let paths: Vec<PathBuf> = match options.pipelines.is_empty() {
        false => options.pipelines.clone(),
        true => logged_pipelines(wh).await?,
    };
    let mut names = Vec::new();
    let mut readers = Vec::new();
    for path in paths {
        let shown = path.display().to_string();
        let (plan, name) = plan_any(&path, &options.configuration, wh.catalog()).map_err(|e| {
            EngineError::plan(format!(
                "vacuum refused: pipeline {shown}{} cannot be planned, so the readers it \
                 declares cannot be protected ({}); nothing was removed. Name the pipelines \
                 that write this warehouse with --pipeline FILE (and their --conf values)",
                if options.pipelines.is_empty() {
                    ", which the event log records,"
                } else {
                    ""
                },
                crate::error::chain(&e)
            ))
        })?;
        // The pipeline's private datasets are readers too, in its private folder.
        let wh = &wh.with_private(&name, plan.private_tables());
        readers.extend(readers_of(wh, &plan, &shown).await?);
        names.push(shown);
    }
    Ok((names, readers))
}

/// The plan of the pipeline at `path`, and the pipeline's name.
fn plan_any(
    path: &Path,
    configuration: &BTreeMap<String, String>,
    catalog: &str,
) -> Result<(PipelinePlan, String)> {
    if crate::load::spec::is_spec(path) {
        let loaded = crate::load::spec::load_pipeline(path, configuration)?;
        let planned = crate::load::sources::plan_sources(
            &loaded.sources,
            &loaded.configuration,
            &loaded.schema,
            loaded.catalog.as_deref().unwrap_or(catalog),
        )?;
        let name = crate::load::spec::pipeline_name(loaded.name.as_deref(), path);
        return Ok((planned.plan, name));
    }
    let plan = crate::load::file::plan_file(path, configuration, catalog)?.0;
    Ok((plan, crate::load::spec::pipeline_name(None, path)))
}

/// Every distinct pipeline the event log records.
async fn logged_pipelines(wh: &Warehouse) -> Result<Vec<PathBuf>> {
    let Some(log) = open_delta(&wh.event_log_location()).await? else {
        return Ok(Vec::new());
    };
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "event_log", &log, None).await?;
    let batches = ctx
        .sql("SELECT DISTINCT pipeline FROM event_log WHERE pipeline IS NOT NULL ORDER BY 1")
        .await
        .context(|| "reading the event log".into())?
        .collect()
        .await
        .context(|| "reading the event log".into())?;
    let mut out = Vec::new();
    for b in &batches {
        let column = deltalake::arrow::compute::cast(
            b.column(0),
            &deltalake::arrow::datatypes::DataType::Utf8,
        )
        .context(|| "reading the event log".into())?;
        let strings = column
            .as_any()
            .downcast_ref::<deltalake::arrow::array::StringArray>()
            .ok_or_else(|| EngineError::internal("event log pipeline is not text"))?;
        out.extend(strings.iter().flatten().map(PathBuf::from));
    }
    Ok(out)
}

/// The readers by position that `plan` declares, with their positions now.
async fn readers_of(wh: &Warehouse, plan: &PipelinePlan, pipeline: &str) -> Result<Vec<Reader>> {
    let mut out = Vec::new();
    let reader = |name: String, source: &TableName, position: Option<i64>| Reader {
        name,
        pipeline: format!("pipeline {pipeline}"),
        source: source.clone(),
        position,
    };
    for (name, table) in &plan.tables {
        if let Some(QuerySource::Table(source)) = table.query.as_ref().map(|q| &q.source) {
            let at = position_in(&wh.table_location(name), AppId::Source(source)).await?;
            out.push(reader(format!("streaming table {name}"), source, at));
        }
        if let Some(QuerySource::Changes(strata_sql::TableChanges {
            source: strata_sql::ChangeSource::Table(source),
            ..
        })) = table.query.as_ref().map(|q| &q.source)
        {
            let label = source.to_string();
            let at = position_in(&wh.table_location(name), AppId::History(&label)).await?;
            out.push(reader(format!("change-history table {name}"), source, at));
        }
    }
    for append in &plan.appends {
        if let QuerySource::Table(source) = &append.query.source {
            let at = position_in(
                &wh.table_location(&append.target),
                AppId::Append(&append.name),
            )
            .await?;
            out.push(reader(format!("append flow {}", append.name), source, at));
        }
    }
    for flow in &plan.flows {
        let holder = match flow.stored_as {
            ScdType::Snapshots => wh.table_location(&flow.target),
            _ => wh.event_store_location(&flow.target),
        };
        let at = position_in(&holder, AppId::Flow(&flow.name)).await?;
        out.push(reader(format!("flow {}", flow.name), &flow.source, at));
    }
    for pit in &plan.pits {
        for source in &pit.sources {
            let id = AppId::Pit {
                pit: &pit.name,
                source,
            };
            let at = position_in(&wh.table_location(&pit.name), id).await?;
            out.push(reader(
                format!("point-in-time table {}", pit.name),
                source,
                at,
            ));
        }
    }
    Ok(out)
}

async fn position_in(path: &Location, id: AppId<'_>) -> Result<Option<i64>> {
    match open_delta(path).await? {
        Some(t) => position(&t, id).await,
        None => Ok(None),
    }
}

/// Deletes the event-log records that started more than `days` days ago (in a dry run,
/// counts them); returns how many.
async fn trim_event_log(wh: &Warehouse, days: u32, dry_run: bool) -> Result<usize> {
    let Some(log) = open_delta(&wh.event_log_location()).await? else {
        return Ok(0);
    };
    let cutoff = chrono::Utc::now() - chrono::Duration::days(i64::from(days));
    let cutoff = deltalake::datafusion::prelude::lit(
        deltalake::datafusion::scalar::ScalarValue::TimestampMicrosecond(
            Some(cutoff.timestamp_micros()),
            Some("UTC".into()),
        ),
    );
    let predicate = deltalake::datafusion::prelude::col("started_at").lt(cutoff);
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "event_log", &log, None).await?;
    let old = ctx
        .table("event_log")
        .await
        .context(|| "reading the event log".into())?
        .filter(predicate.clone())
        .context(|| "reading the event log".into())?
        .count()
        .await
        .context(|| "reading the event log".into())?;
    if dry_run || old == 0 {
        return Ok(old);
    }
    let commit = PendingCommit::of_run(&upkeep_run_id("vacuum"));
    log.delete()
        .with_predicate(predicate)
        .with_commit_properties(commit.properties())
        .await
        .context(|| "deleting old event-log records".into())?;
    wh.take_event_log();
    Ok(old)
}

/// Deletes (in a dry run, lists) the folders of `_strata/full_refresh/` set aside before
/// the retention window.
async fn remove_set_aside(wh: &Warehouse, options: &VacuumOptions) -> Result<Vec<Location>> {
    let base = wh.state_root().join("full_refresh");
    let cutoff = chrono::Utc::now()
        - chrono::Duration::milliseconds((options.retain_hours * 3_600_000.0) as i64);
    let mut out = Vec::new();
    for name in base.list_dirs().await? {
        let dir = base.join(&name);
        let at = match set_aside_at(&name) {
            Some(at) => at,
            None => match dir.modified().await {
                Some(m) => chrono::DateTime::<chrono::Utc>::from(m),
                None => continue,
            },
        };
        if at >= cutoff {
            continue;
        }
        if !options.dry_run {
            dir.remove_all().await?;
        }
        out.push(dir);
    }
    Ok(out)
}

/// When a full refresh set the folder `name` aside: the start of the run its name is the
/// id of (`20261130T101500.123456Z-...`); `None` for another name (then the folder's
/// modification time tells).
fn set_aside_at(name: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let stamp = name.split('-').next().unwrap_or(name);
    chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%S%.fZ")
        .ok()
        .map(|t| t.and_utc())
}

/// A table upkeep works on.
#[derive(Debug, Clone)]
struct Target {
    /// `default.users`, `event_log`, `default.users (event store)`.
    label: String,
    /// The table's name when readers may read it by position.
    name: Option<TableName>,
    path: Location,
    /// Named by the user (rather than found by listing the warehouse).
    named: bool,
    /// The target whose event store this is.
    store_of: Option<TableName>,
}

/// The tables `names` names, or every table of the warehouse and the event log (and, with
/// `stores`, the event stores) when it is empty.
async fn targets(wh: &Warehouse, names: &[String], stores: bool) -> Result<Vec<Target>> {
    let event_log = Target {
        label: EVENT_LOG_TABLE.to_string(),
        name: None,
        path: wh.event_log_location(),
        named: !names.is_empty(),
        store_of: None,
    };
    let mut out = Vec::new();
    let listed: Vec<(TableName, bool)> = match names.is_empty() {
        true => wh
            .list_tables()
            .await?
            .into_iter()
            .map(|t| (t, false))
            .collect(),
        false => {
            let mut named = Vec::new();
            for n in names {
                if n.eq_ignore_ascii_case(EVENT_LOG_TABLE) {
                    out.push(event_log.clone());
                    continue;
                }
                let t = TableName::parse(n, TableName::DEFAULT_SCHEMA)
                    .map_err(EngineError::NotFound)?;
                if !wh.table_location(&t).has_delta_log().await? {
                    return Err(EngineError::NotFound(format!(
                        "no table {t} in {}",
                        wh.root()
                    )));
                }
                named.push((t, true));
            }
            named
        }
    };
    for (t, named) in listed {
        out.push(Target {
            label: t.to_string(),
            name: Some(t.clone()),
            path: wh.table_location(&t),
            named,
            store_of: None,
        });
        let store = wh.event_store_location(&t);
        if stores && store.has_delta_log().await? {
            out.push(Target {
                label: format!("{t} (event store)"),
                name: None,
                path: store,
                named,
                store_of: Some(t.clone()),
            });
        }
    }
    if names.is_empty() && event_log.path.has_delta_log().await? {
        out.push(event_log);
    }
    Ok(out)
}

async fn open_target(target: &Target) -> Result<DeltaTable> {
    open_delta(&target.path)
        .await?
        .ok_or_else(|| EngineError::NotFound(format!("no Delta table at {}", target.label)))
}

/// The id an upkeep command records in its commits (`strata.run`), as a run's.
fn upkeep_run_id(what: &str) -> String {
    format!(
        "{}-{what}-{:08x}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"),
        std::process::id()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_aside_folders_are_dated_by_their_run_id() {
        let at = set_aside_at("20261130T101500.123456Z-0000abcd").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-11-30T10:15:00.123456+00:00");
    }

    #[test]
    fn deleted_files_are_shown_relative_to_their_table() {
        assert_eq!(
            relative_to("file:///wh/default/t/part-1.parquet", "/wh/default/t"),
            "part-1.parquet"
        );
        assert_eq!(
            relative_to("part-1.parquet", "/wh/default/t"),
            "part-1.parquet"
        );
    }
}
