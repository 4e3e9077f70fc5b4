//! A whole pipeline run: parse, plan, check every dataset against the schemas it will meet,
//! then run each node once, in dependency order.

use crate::error::{Context, EngineError, Result};
use crate::flow::{self, FlowReport, FlowSetup};
use crate::ingest::{self, IngestReport, IngestSetup};
use crate::warehouse::Warehouse;
use deltalake::arrow::datatypes::SchemaRef;
use std::collections::BTreeMap;
use std::path::Path;
use strata_sql::{Node, PipelinePlan, TableName};

/// What a run did, node by node, in execution order.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub ingests: Vec<IngestReport>,
    pub flows: Vec<FlowReport>,
    pub pits: Vec<crate::pit::PitReport>,
    /// Datasets that did not run because their schema cannot be known yet (no input files
    /// and no `schema =>`), with the reason.
    pub waiting: Vec<String>,
}

enum Prepared {
    Ingest(Box<IngestSetup>),
    Flow(Box<FlowSetup>),
    /// Waits for input: its schema cannot be known yet.
    Waiting(String),
    /// A point-in-time table (index into the plan's `pits`).
    PointInTime(usize),
}

/// Runs the pipeline in `path` once over all input not yet processed (triggered mode).
/// Relative paths inside the pipeline resolve against the pipeline file's folder.
pub async fn run_pipeline_file(path: &Path, wh: &Warehouse) -> Result<RunReport> {
    run_pipeline_file_with(path, wh, &BTreeMap::new()).await
}

/// [`run_pipeline_file`] with pipeline configuration values, substituted for `${name}` in
/// the pipeline text before it is parsed.
pub async fn run_pipeline_file_with(
    path: &Path,
    wh: &Warehouse,
    configuration: &BTreeMap<String, String>,
) -> Result<RunReport> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).context(|| format!("cannot read {file}"))?;
    let text =
        strata_sql::substitute(&text, configuration).map_err(|source| EngineError::Pipeline {
            file: file.clone(),
            source: Box::new(source),
        })?;
    let pipeline_dir = std::fs::canonicalize(path)
        .context(|| format!("cannot resolve {file}"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let parsed = strata_sql::parse_pipeline(&text).map_err(|source| EngineError::Pipeline {
        file: file.clone(),
        source: Box::new(source),
    })?;
    let plan = strata_sql::plan_pipeline(parsed).map_err(|source| EngineError::Pipeline {
        file: file.clone(),
        source: Box::new(source),
    })?;
    run_plan(&plan, &pipeline_dir, wh).await
}

/// Runs a planned pipeline once; relative paths resolve against `pipeline_dir`.
pub(crate) async fn run_plan(
    plan: &PipelinePlan,
    pipeline_dir: &Path,
    wh: &Warehouse,
) -> Result<RunReport> {
    // Check everything before anything runs.
    let mut schemas: BTreeMap<TableName, SchemaRef> = BTreeMap::new();
    let mut prepared: Vec<Prepared> = Vec::new();
    for node in &plan.order {
        match node {
            Node::Ingest(name) => {
                let table = plan.tables.get(name).ok_or_else(|| {
                    EngineError::Internal(format!("planned table {name} is missing"))
                })?;
                match ingest::prepare_ingest(wh, table, pipeline_dir, &schemas).await? {
                    Some(setup) => {
                        schemas.insert(name.clone(), setup.schema.clone());
                        prepared.push(Prepared::Ingest(Box::new(setup)));
                    }
                    None => prepared.push(Prepared::Waiting(format!(
                        "{name}: no input files yet and no schema => to plan with"
                    ))),
                }
            }
            Node::PointInTime(i) => prepared.push(Prepared::PointInTime(*i)),
            Node::Flow(i) => {
                let f = plan
                    .flows
                    .get(*i)
                    .ok_or_else(|| EngineError::Internal(format!("planned flow {i} is missing")))?;
                match schemas.get(&f.source) {
                    Some(source) => {
                        let props = plan
                            .tables
                            .get(&f.target)
                            .map(|t| t.properties.clone())
                            .unwrap_or_default();
                        let setup = flow::prepare_flow(f, source, &props).await?;
                        flow::check_existing(wh, &setup).await?;
                        if let Some(prev) = schemas.get(&f.target) {
                            if prev.fields() != setup.target_schema.fields() {
                                return Err(EngineError::Plan(format!(
                                    "flow {}: produces different columns for {} than another flow into it",
                                    f.name, f.target
                                )));
                            }
                        }
                        schemas.insert(f.target.clone(), setup.target_schema.clone());
                        prepared.push(Prepared::Flow(Box::new(setup)));
                    }
                    None => prepared.push(Prepared::Waiting(format!(
                        "flow {}: its source {} has no schema yet",
                        f.name, f.source
                    ))),
                }
            }
        }
    }
    // Each ingestion checks its rows against the flows that will read them.
    let flows: Vec<FlowSetup> = prepared
        .iter()
        .filter_map(|p| match p {
            Prepared::Flow(f) => Some(f.as_ref().clone()),
            _ => None,
        })
        .collect();
    for p in prepared.iter_mut() {
        if let Prepared::Ingest(setup) = p {
            setup.downstream = flows
                .iter()
                .filter(|f| f.flow.source == setup.table.name)
                .cloned()
                .collect();
        }
    }

    let mut report = RunReport::default();
    for p in &prepared {
        match p {
            Prepared::Ingest(setup) => {
                tracing::info!(table = %setup.table.name, "ingesting");
                report.ingests.push(ingest::run_ingest(wh, setup).await?);
            }
            Prepared::Flow(setup) => {
                tracing::info!(flow = %setup.flow.name, "running flow");
                let props = plan
                    .tables
                    .get(&setup.flow.target)
                    .map(|t| t.properties.clone())
                    .unwrap_or_default();
                report.flows.push(flow::run_flow(wh, setup, &props).await?);
            }
            Prepared::Waiting(why) => report.waiting.push(why.clone()),
            Prepared::PointInTime(i) => {
                let pit = plan.pits.get(*i).ok_or_else(|| {
                    EngineError::Internal(format!("planned point-in-time table {i} is missing"))
                })?;
                tracing::info!(table = %pit.name, "refreshing point-in-time table");
                report.pits.push(crate::pit::refresh(wh, pit).await?);
            }
        }
    }
    Ok(report)
}
