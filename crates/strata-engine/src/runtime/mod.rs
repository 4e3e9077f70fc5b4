//! A whole pipeline run: parse, plan, check every dataset against the schemas it will meet,
//! then run each node once, in dependency order, recording each in the event log.

pub(crate) mod event_log;
mod full_refresh;
mod node;
pub(crate) mod options;
mod prepare;
mod retry;
mod select;

pub use options::{Progress, ProgressFn, RunOptions, RunReport, Selection};

use crate::error::{EngineError, Result};
use crate::eventstore::handoff::Handoff;
use crate::load::file::plan_file;
use crate::load::sources::PlannedPipeline;
use crate::ops::Scope;
use crate::runtime::event_log::{EventRecord, Status};
use crate::runtime::full_refresh::check_reset_allowed;
use crate::runtime::full_refresh::set_aside;
use crate::runtime::node::node_flow_name;
use crate::runtime::node::node_kind;
use crate::runtime::node::run_node;
use crate::runtime::node::summary;
use crate::runtime::prepare::check_batch_reads;
use crate::runtime::prepare::prepare_ingestion;
use crate::runtime::prepare::with_downstream;
use crate::runtime::prepare::Prepared;
use crate::runtime::prepare::Schemas;
use crate::runtime::retry::conflict_backoff;
use crate::runtime::retry::gave_up;
use crate::runtime::retry::CONFLICT_ATTEMPTS;
use crate::runtime::select::refresh_set;
use crate::runtime::select::select;
use crate::semantics::flow::FlowSetup;
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::datatypes::SchemaRef;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use strata_sql::{FlowKind, Node, PipelinePlan, TableName};

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
/// with `options`.
pub async fn run_pipeline(path: &Path, wh: &Warehouse, options: &RunOptions) -> Result<RunReport> {
    if crate::load::spec::is_spec(path) {
        let loaded = crate::load::spec::load_pipeline(path, &options.configuration)?;
        let planned = crate::load::sources::plan_sources(
            &loaded.sources,
            &loaded.configuration,
            &loaded.schema,
        )?;
        return run_planned(planned, path, loaded.dir, wh, options).await;
    }
    let (plan, pipeline_dir) = plan_file(path, &options.configuration)?;
    run_plan(plan, path, pipeline_dir, wh, options).await
}

/// Runs a planned pipeline read from `path`; relative paths resolve against `pipeline_dir`.
pub(crate) async fn run_plan(
    plan: PipelinePlan,
    path: &Path,
    pipeline_dir: PathBuf,
    wh: &Warehouse,
    options: &RunOptions,
) -> Result<RunReport> {
    let selected = select(&plan, options.select.as_ref())?;
    let run_started = chrono::Utc::now();
    let run_id = format!(
        "{}-{:08x}",
        run_started.format("%Y%m%dT%H%M%S%.6fZ"),
        std::process::id()
    );
    let mut report = RunReport {
        run_id: run_id.clone(),
        ..Default::default()
    };
    if let Some(names) = &options.full_refresh {
        let tables = refresh_set(&plan, names)?;
        check_reset_allowed(wh, &plan, &tables).await?;
        report.set_aside = set_aside(wh, &tables, &run_id)?;
    }

    // Check everything before anything runs.
    check_batch_reads(wh, &plan).await?;
    let properties = (plan.tables.iter().map(|(n, t)| (n, &t.properties)))
        .chain(plan.materialized.iter().map(|(n, m)| (n, &m.properties)))
        .chain(plan.pits.iter().map(|p| (&p.name, &p.properties)));
    for (name, props) in properties {
        crate::storage::write::check_parquet_properties(name, props)?;
    }
    let feeds: BTreeSet<TableName> = plan.flows.iter().map(|f| f.target.clone()).collect();
    let mut schemas: BTreeMap<TableName, SchemaRef> = BTreeMap::new();
    let mut prepared: Vec<(Node, Prepared)> = Vec::new();
    let context = crate::ops::ingest::PipelineContext {
        wh,
        plan: &plan,
        dir: &pipeline_dir,
        feeds: &feeds,
    };
    // What each ingestion was prepared with, so that a retry prepares it the same way.
    let mut known_before: BTreeMap<usize, Schemas> = BTreeMap::new();
    for (at, node) in plan.order.iter().enumerate() {
        let p = match node {
            Node::Ingest(_) | Node::Append(_) => {
                let p = prepare_ingestion(&context, node, &schemas).await?;
                known_before.insert(at, schemas.clone());
                if let Prepared::Ingest(setup) = &p {
                    schemas
                        .entry(setup.table.name.clone())
                        .and_modify(|s| {
                            if setup.append_flow.is_none() {
                                *s = setup.schema.clone()
                            }
                        })
                        .or_insert_with(|| setup.schema.clone());
                }
                p
            }
            Node::PointInTime(i) => Prepared::PointInTime(*i),
            Node::MaterializedView(name) => Prepared::MaterializedView(name.clone()),
            Node::Flow(i) => {
                let f = plan
                    .flows
                    .get(*i)
                    .ok_or_else(|| EngineError::Internal(format!("planned flow {i} is missing")))?;
                let table_mode = matches!(f.kind, FlowKind::Snapshot { version_by: None });
                let feed = feeds.contains(&f.source) && !table_mode;
                let source = schemas.get(&f.source).map(|s| {
                    if feed {
                        crate::storage::feed::feed_schema(s)
                    } else {
                        s.clone()
                    }
                });
                match source {
                    Some(source) => {
                        let props = plan
                            .tables
                            .get(&f.target)
                            .map(|t| t.properties.clone())
                            .unwrap_or_default();
                        let mut setup = crate::ops::cdc::prepare_flow(f, &source, &props).await?;
                        setup.source_feed = feed;
                        crate::ops::cdc::check_existing(wh, &setup).await?;
                        if let Some(prev) = schemas.get(&f.target) {
                            if prev.fields() != setup.target_schema.fields() {
                                return Err(EngineError::Plan(format!(
                                    "flow {}: produces different columns for {} than another flow into it",
                                    f.name, f.target
                                )));
                            }
                        }
                        schemas.insert(f.target.clone(), setup.target_schema.clone());
                        Prepared::Flow(Box::new(setup))
                    }
                    None => Prepared::Waiting(format!(
                        "flow {}: its source {} has no schema yet",
                        f.name, f.source
                    )),
                }
            }
        };
        prepared.push((node.clone(), p));
    }
    // Each ingestion checks its rows against the flows that will read them.
    let flows: Vec<FlowSetup> = prepared
        .iter()
        .filter_map(|(_, p)| match p {
            Prepared::Flow(f) => Some(f.as_ref().clone()),
            _ => None,
        })
        .collect();
    for (_, p) in prepared.iter_mut() {
        with_downstream(p, &flows);
    }

    let declared: BTreeSet<TableName> = plan
        .tables
        .keys()
        .chain(plan.materialized.keys())
        .cloned()
        .chain(plan.pits.iter().map(|p| p.name.clone()))
        .collect();
    let pipeline_name = path.display().to_string();
    // Run the selected nodes: each after the nodes that write what it reads (and after the
    // earlier writers of its own table), independent ones side by side.
    let nodes: Vec<(&Node, &Prepared, Option<&Schemas>)> = prepared
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| selected.contains(n))
        .map(|(at, (n, p))| (n, p, known_before.get(&at)))
        .collect();
    let deps: Vec<Vec<usize>> = (0..nodes.len())
        .map(|j| {
            let reads = plan.reads(nodes[j].0);
            let writes = plan.writes(nodes[j].0);
            (0..j)
                .filter(|&i| {
                    let w = plan.writes(nodes[i].0);
                    w.as_ref().is_some_and(|w| reads.contains(w))
                        || (w.is_some() && w == writes)
                        || (matches!(nodes[j].0, Node::PointInTime(_))
                            && matches!(
                                nodes[i].0,
                                Node::Ingest(_) | Node::Flow(_) | Node::Append(_)
                            ))
                })
                .collect()
        })
        .collect();
    let limit = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    let stop_requested = || {
        options
            .stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
    };
    // Checked events kept for a reader in this run; dropped with the run (a reader that does
    // not come in this run reads the files next time).
    let handoff = Handoff::default();
    let mut started_nodes = vec![false; nodes.len()];
    let mut done = vec![false; nodes.len()];
    let mut running = futures::stream::FuturesUnordered::new();
    let mut failure: Option<EngineError> = None;
    loop {
        while failure.is_none() && running.len() < limit {
            let Some(i) =
                (0..nodes.len()).find(|&i| !started_nodes[i] && deps[i].iter().all(|&d| done[d]))
            else {
                break;
            };
            if stop_requested() {
                report.stopped = true;
                break;
            }
            started_nodes[i] = true;
            let (node, p, known) = nodes[i];
            let describe = plan.describe(node);
            if let Some(progress) = &options.progress {
                (progress.0)(Progress::Started {
                    node: describe.clone(),
                });
            }
            let record = EventRecord::new(
                &run_id,
                &pipeline_name,
                plan.writes(node).map(|t| t.to_string()).unwrap_or_default(),
                node_flow_name(&plan, node),
                node_kind(&plan, node),
                chrono::Utc::now(),
            );
            let (plan, declared, context, flows, handoff, run_id) = (
                &plan,
                &declared,
                &context,
                &flows,
                &handoff,
                run_id.as_str(),
            );
            let progress = options.progress.clone();
            let node_name = describe.clone();
            running.push(async move {
                let clock = std::time::Instant::now();
                let first = record;
                let mut record = first.clone();
                let update = move |detail: String| {
                    if let Some(p) = &progress {
                        (p.0)(Progress::Update {
                            node: node_name.clone(),
                            detail,
                        });
                    }
                };
                // A node that lost a race with another writer starts again from the start,
                // on the tables as they now are (an ingestion is prepared again: the files
                // it meant to take may be taken).
                let mut again: Option<Prepared> = None;
                let mut attempt = 1;
                let outcome = loop {
                    let p = again.as_ref().unwrap_or(p);
                    let scope = Scope {
                        wh,
                        run_id,
                        handoff,
                        update: &update,
                    };
                    match run_node(&scope, plan, p, declared, &mut record).await {
                        Err(e) if e.is_conflict() && attempt < CONFLICT_ATTEMPTS => {
                            tracing::warn!(
                                node = %plan.describe(node),
                                attempt,
                                "another writer committed first ({e}); starting this dataset again"
                            );
                            tokio::time::sleep(conflict_backoff(attempt)).await;
                            attempt += 1;
                            record = first.clone();
                            if let (Node::Ingest(_) | Node::Append(_), Some(known)) = (node, known)
                            {
                                match prepare_ingestion(context, node, known).await {
                                    Ok(mut p) => {
                                        with_downstream(&mut p, flows);
                                        again = Some(p);
                                    }
                                    Err(e) => break Err(e),
                                }
                            }
                        }
                        Err(e) if e.is_conflict() => {
                            break Err(gave_up(wh, plan.writes(node).as_ref(), e, attempt).await)
                        }
                        other => break other,
                    }
                };
                record.ended_at = chrono::Utc::now();
                (i, describe, clock.elapsed(), record, outcome)
            });
        }
        let Some((i, describe, elapsed, mut record, outcome)) =
            futures::StreamExt::next(&mut running).await
        else {
            break;
        };
        done[i] = true;
        match outcome {
            Ok(out) => out.add_to(&mut report),
            Err(e) => {
                record.status = Status::Failed;
                record.error = Some(crate::error::chain(&e));
                failure.get_or_insert(e);
            }
        }
        event_log::append(wh, std::slice::from_ref(&record)).await?;
        if let Some(progress) = &options.progress {
            (progress.0)(Progress::Finished {
                node: describe,
                summary: summary(&record),
                elapsed,
            });
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Runs a planned pipeline read from `path` (the event log names it) with `options`;
/// relative paths resolve against `dir`.
pub async fn run_planned(
    planned: PlannedPipeline,
    path: &Path,
    dir: PathBuf,
    wh: &Warehouse,
    options: &RunOptions,
) -> Result<RunReport> {
    let PlannedPipeline { plan, map } = planned;
    run_plan(plan, path, dir, wh, options)
        .await
        .map_err(|e| match e {
            // Checks against schemas quote a flow's line; say which text it is in.
            EngineError::Plan(m) => EngineError::Plan(map.relocate_message(&m)),
            e => e,
        })
}
