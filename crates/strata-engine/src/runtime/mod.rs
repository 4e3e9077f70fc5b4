//! A whole pipeline run: parse and plan (`load`), check every dataset against the schemas it
//! will meet (`prepare.rs`), then run each node once, in dependency order, recording each
//! in the event log (`scheduler.rs`, `node.rs`, `event_log.rs`); `--select` and
//! `--full-refresh` in `select.rs` and `full_refresh.rs`; retries after a lost race in
//! `retry.rs`; a run's attempts after a transient failure, and the notifications of how it
//! ended, in `update.rs` and `notify/`; `strata optimize` and `strata vacuum` in `upkeep.rs`.

pub(crate) mod event_log;
mod full_refresh;
pub(crate) mod lock;
pub(crate) mod logged;
mod node;
mod notify;
pub(crate) mod options;
mod prepare;
mod retry;
mod scheduler;
mod select;
mod store_upkeep;
mod update;
pub(crate) mod upkeep;

pub use options::{Optimized, Progress, ProgressFn, RunOptions, RunReport, Selection};

use crate::error::{EngineError, Result};
use crate::eventstore::handoff::Handoff;
use crate::load::file::plan_file;
use crate::load::sources::{PipelineSource, PlannedPipeline};
use crate::load::spec::pipeline_name;
use crate::runtime::full_refresh::{check_reset_allowed, set_aside};
use crate::runtime::prepare::prepare_all;
use crate::runtime::retry::FlowRetry;
use crate::runtime::scheduler::{run_nodes, Run};
use crate::runtime::select::{refresh_set, select};
use crate::runtime::update::{new_run_id, Ended, Update};
use crate::storage::location::Location;
use crate::storage::warehouse::Warehouse;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use strata_sql::{Node, PipelinePlan, SinkTarget, TableName};

/// Runs the pipeline in `path` once over all input not yet processed (triggered mode).
/// Relative paths inside the pipeline resolve against the pipeline file's folder.
pub async fn run_pipeline_file(path: &Path, wh: &Warehouse) -> Result<RunReport> {
    run_pipeline(path, wh, &RunOptions::default()).await
}

/// [`run_pipeline_file`] with pipeline configuration values, substituted for `${name}` in
/// the pipeline text before it is parsed.
pub async fn run_pipeline_file_with(
    path: &Path,
    wh: &Warehouse,
    configuration: &BTreeMap<String, String>,
) -> Result<RunReport> {
    let options = RunOptions {
        configuration: configuration.clone(),
        ..Default::default()
    };
    run_pipeline(path, wh, &options).await
}

/// Runs the pipeline in `path` (a SQL file, or a YAML spec: see [`crate::load_pipeline`])
/// with `options`, trying it again after a transient failure and telling whom the pipeline
/// names how it ended (`update.rs`).
pub async fn run_pipeline(path: &Path, wh: &Warehouse, options: &RunOptions) -> Result<RunReport> {
    let loaded = crate::load::spec::load_pipeline(path, &options.configuration)?;
    run_loaded(loaded, path, wh, options).await
}

/// [`run_pipeline`] of a YAML spec whose `.py` libraries the caller (the Python package)
/// has executed: `python` holds the SQL their declarations render to, planned and run with
/// the spec's tables and SQL libraries as one pipeline.
pub async fn run_pipeline_with_python(
    path: &Path,
    wh: &Warehouse,
    options: &RunOptions,
    python: Vec<PipelineSource>,
) -> Result<RunReport> {
    if !crate::load::spec::is_spec(path) {
        return Err(EngineError::internal(format!(
            "{}: Python libraries come with a YAML spec",
            path.display()
        )));
    }
    let mut loaded = crate::load::spec::load_pipeline_with_python(path, &options.configuration)?;
    loaded.sources.extend(python);
    run_loaded(loaded, path, wh, options).await
}

/// Runs a loaded pipeline: its attempts, the lock, the notifications.
async fn run_loaded(
    loaded: crate::load::spec::LoadedPipeline,
    path: &Path,
    wh: &Warehouse,
    options: &RunOptions,
) -> Result<RunReport> {
    let name = pipeline_name(loaded.name.as_deref(), path);
    let pipeline = path.display().to_string();
    // A spec's configuration, with the caller's values over it, is the run's: its memory
    // limit and flow retries are read from it as from `--conf`.
    let options = &RunOptions {
        configuration: loaded.configuration.clone(),
        ..options.clone()
    };
    let mut update = Update::new(wh, pipeline, name.clone(), &loaded.settings, options);
    let lock = match options.lock {
        Some(mode) => Some(lock::acquire(wh, &name, update.run_id(), mode).await?),
        None => None,
    };
    let result = loop {
        let ended = Ended::default();
        let options = update.options();
        let outcome = attempt(&loaded, path, wh, options, update.run_id(), &ended).await;
        let ended = ended.into_inner().unwrap_or_default();
        if let Some(result) = update.after(outcome, ended).await {
            break result;
        }
    };
    if let Some(lock) = lock {
        lock.release().await;
    }
    result
}

/// One attempt of a run: the pipeline planned (with `options`' configuration) and run.
async fn attempt(
    loaded: &crate::load::spec::LoadedPipeline,
    path: &Path,
    wh: &Warehouse,
    options: &RunOptions,
    run_id: &str,
    ended: &Ended,
) -> Result<RunReport> {
    if crate::load::spec::is_spec(path) {
        let PlannedPipeline { plan, map } = crate::load::sources::plan_sources(
            &loaded.sources,
            &loaded.configuration,
            &loaded.schema,
            // The warehouse's own name when the caller set one, else the spec's.
            match (&loaded.catalog, wh.catalog()) {
                (Some(spec), c) if c == strata_sql::TableName::CATALOGS[0] => spec,
                (_, c) => c,
            },
        )?;
        let file = PipelineFile::new(path, loaded.name.as_deref(), loaded.dir.clone());
        return run_plan(plan, &file, wh, options, run_id, ended)
            .await
            .map_err(|e| e.locate(|line| map.text_of(line)));
    }
    let (plan, pipeline_dir) = plan_file(path, &options.configuration, wh.catalog())?;
    let file = PipelineFile::new(path, None, pipeline_dir);
    run_plan(plan, &file, wh, options, run_id, ended).await
}

/// Which pipeline a run is of.
pub(crate) struct PipelineFile<'a> {
    /// The pipeline file, as the event log names it.
    path: &'a Path,
    /// Its name ([`pipeline_name`]).
    name: String,
    /// The folder relative paths in it resolve against.
    dir: PathBuf,
}

impl<'a> PipelineFile<'a> {
    fn new(path: &'a Path, spec_name: Option<&str>, dir: PathBuf) -> Self {
        PipelineFile {
            path,
            name: pipeline_name(spec_name, path),
            dir,
        }
    }
}

/// The tables of a full refresh, without the sinks in it, which a full refresh does not
/// clear (as in Lakeflow). A sink whose Delta table exists stops the refresh: its flows
/// would send rows it already holds again. Deleted, it is written afresh.
async fn keeping_sinks(
    wh: &Warehouse,
    plan: &PipelinePlan,
    tables: Vec<TableName>,
) -> Result<Vec<TableName>> {
    let mut kept = Vec::with_capacity(tables.len());
    for t in tables {
        if plan.tables.get(&t).is_none_or(|s| s.sink.is_none()) {
            kept.push(t);
            continue;
        }
        if wh.open_table(&t).await?.is_some() {
            if let Some((_, table)) = plan
                .tables
                .get(&t)
                .and_then(crate::ops::sink::database_sink)
            {
                return Err(EngineError::plan(format!(
                    "--full-refresh reaches sink {t}, whose outbox at {} records the rows sent \
                     to postgresql table {table}: a full refresh does not clear a sink, and its \
                     flows would send every row again. Empty that table, delete its row in \
                     {} and the outbox to have them sent again, or leave the tables upstream \
                     of the sink out of --full-refresh",
                    wh.table_location(&t),
                    strata_sources::POSITIONS_TABLE
                )));
            }
            return Err(EngineError::plan(format!(
                "--full-refresh reaches sink {t}, whose Delta table at {} keeps the rows it was \
                 given: a full refresh does not clear a sink, and its flows would send every \
                 row again. Delete that table to have them sent again, or leave the tables \
                 upstream of the sink out of --full-refresh",
                wh.table_location(&t)
            )));
        }
    }
    Ok(kept)
}

/// Where each sink of `plan` writes: its path (relative ones from the pipeline's folder
/// `dir`), or the location of the warehouse table it names.
fn sink_locations(
    plan: &PipelinePlan,
    dir: &Path,
    wh: &Warehouse,
) -> Result<std::collections::BTreeMap<TableName, Location>> {
    let mut sinks = std::collections::BTreeMap::new();
    for t in plan.tables.values() {
        let location = match &t.sink {
            // A PostgreSQL sink's outbox is the warehouse's table of its name (`ops/sink.rs`).
            None | Some(SinkTarget::Database { .. }) => continue,
            Some(SinkTarget::Table(table)) => wh.table_location(table),
            Some(SinkTarget::Path(path)) => {
                match Location::parse(path, &format!("sink {}", t.name))? {
                    Location::Local(p) if p.is_relative() => Location::Local(dir.join(p)),
                    other => other,
                }
            }
        };
        sinks.insert(t.name.clone(), location);
    }
    Ok(sinks)
}

/// Runs a planned pipeline of `file`. A run: its id; a full refresh sets the old tables
/// aside; every node is prepared (nothing written yet); then the selected nodes run
/// (`scheduler.rs`).
pub(crate) async fn run_plan(
    plan: PipelinePlan,
    file: &PipelineFile<'_>,
    wh: &Warehouse,
    options: &RunOptions,
    run_id: &str,
    ended: &Ended,
) -> Result<RunReport> {
    // The pipeline's PRIVATE datasets live in its own folder, seen by this run alone.
    let wh = &wh.with_private(&file.name, plan.private_tables());
    // Its sinks are Delta tables where they say (a path from the pipeline's folder).
    let wh = &wh.with_sinks(sink_locations(&plan, &file.dir, wh)?);
    let selected = select(&plan, options.select.as_ref())?;
    let run_id = run_id.to_string();
    let mut report = RunReport {
        run_id: run_id.clone(),
        ..Default::default()
    };
    if let Some(names) = &options.full_refresh {
        let tables = keeping_sinks(wh, &plan, refresh_set(&plan, names)?).await?;
        check_reset_allowed(wh, &plan, &tables).await?;
        report.set_aside = set_aside(wh, &tables, &run_id).await?;
    }
    // From here on, a table is read from its log once per run; later opens read only the
    // commits made since.
    let wh = &wh.keeping_opened_tables();
    let memory = crate::util::memory::resolve(&options.configuration)
        .map_err(crate::error::EngineError::BadInput)?;
    let flow_retries = crate::load::settings::FlowRetries::resolve(&options.configuration)
        .map_err(crate::error::EngineError::BadInput)?;
    let pipeline = file.path.display().to_string();
    let retry = FlowRetry {
        wh,
        options,
        run_id: &run_id,
        pipeline: &pipeline,
        policy: flow_retries,
    };
    let prepared = prepare_all(wh, &plan, &pipeline, &file.dir, &retry).await?;
    let run = Run {
        wh,
        prepared: &prepared,
        options,
        memory,
        run_id: &run_id,
        pipeline: pipeline.clone(),
        handoff: Handoff::default(),
        ended,
        flow_retries,
    };
    run_nodes(&run, &selected, &mut report).await?;
    let written: Vec<_> = selected.iter().filter_map(|n| plan.writes(n)).collect();
    let targets: Vec<_> = selected
        .iter()
        .filter_map(|n| match n {
            Node::Flow(i) => plan.flows.get(*i).map(|f| f.target.clone()),
            _ => None,
        })
        .collect();
    report.optimized = upkeep::auto_optimize(wh, &written, &targets).await;
    Ok(report)
}

/// Runs a planned pipeline read from `path` (the event log names it) with `options`;
/// relative paths resolve against `dir`. One attempt: no retries, no notifications.
pub async fn run_planned(
    planned: PlannedPipeline,
    path: &Path,
    dir: PathBuf,
    wh: &Warehouse,
    options: &RunOptions,
) -> Result<RunReport> {
    let PlannedPipeline { plan, map } = planned;
    run_plan(
        plan,
        &PipelineFile::new(path, None, dir),
        wh,
        options,
        &new_run_id(),
        &Ended::default(),
    )
    .await
    // Checks against schemas name a statement's line; say which text it is in.
    .map_err(|e| e.locate(|line| map.text_of(line)))
}
