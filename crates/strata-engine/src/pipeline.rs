//! A whole pipeline run: parse, plan, check every dataset against the schemas it will meet,
//! then run each node once, in dependency order, recording each in the event log.

use crate::error::{Context, EngineError, Result};
use crate::event_log::{self, EventRecord, Status};
use crate::flow::{self, FlowReport, FlowSetup};
use crate::ingest::{self, IngestReport, IngestSetup};
use crate::mview::{self, MvReport};
use crate::pit::PitReport;
use crate::warehouse::Warehouse;
use deltalake::arrow::datatypes::SchemaRef;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use strata_sql::{FlowKind, Node, PipelinePlan, TableName};

/// What a run did, node by node, in execution order.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// The id of the run's records in the event log.
    pub run_id: String,
    pub ingests: Vec<IngestReport>,
    pub flows: Vec<FlowReport>,
    pub views: Vec<MvReport>,
    pub pits: Vec<PitReport>,
    /// Datasets that did not run because their schema cannot be known yet (no input files
    /// and no `schema =>`, or a joined table with no columns yet), with the reason.
    pub waiting: Vec<String>,
    /// Tables a full refresh set aside, and where their old content now is.
    pub set_aside: Vec<(TableName, PathBuf)>,
    /// The run was asked to stop ([`RunOptions::stop`]) before all its nodes ran.
    pub stopped: bool,
}

/// How to run a pipeline beyond its text.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Values substituted for `${name}` in the pipeline text before it is parsed.
    pub configuration: BTreeMap<String, String>,
    /// `--select NAME[+]`: run only what writes this dataset (or this flow), and with
    /// `downstream` everything that reads it, directly or not.
    pub select: Option<Selection>,
    /// `--full-refresh [TABLE ...]`: `Some(empty)` rebuilds every table, `Some(names)`
    /// those tables and everything that reads them.
    pub full_refresh: Option<Vec<String>>,
    /// Called as each node starts and ends (progress display).
    pub progress: Option<ProgressFn>,
    /// When set (by a signal handler), the run stops before its next node: the node in
    /// flight finishes its commit, nothing after it starts. [`RunReport::stopped`] says so.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A callback for [`Progress`] events.
#[derive(Clone)]
pub struct ProgressFn(pub std::sync::Arc<dyn Fn(Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn")
    }
}

/// A node starting or ending, for progress displays.
#[derive(Debug, Clone)]
pub enum Progress {
    Started {
        node: String,
    },
    /// How far a running node has got (`3 of 10 file(s), 120000 row(s)`).
    Update {
        node: String,
        detail: String,
    },
    Finished {
        node: String,
        summary: String,
        elapsed: std::time::Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub name: String,
    pub downstream: bool,
}

impl std::str::FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (name, downstream) = match s.strip_suffix('+') {
            Some(n) => (n, true),
            None => (s, false),
        };
        if name.is_empty() {
            return Err("expected a dataset or flow name, optionally followed by +".into());
        }
        Ok(Selection {
            name: name.to_string(),
            downstream,
        })
    }
}

/// The schemas of the datasets prepared so far, by table.
type Schemas = BTreeMap<TableName, SchemaRef>;

enum Prepared {
    Ingest(Box<IngestSetup>),
    Flow(Box<FlowSetup>),
    /// Waits for input: its schema cannot be known yet.
    Waiting(String),
    PointInTime(usize),
    MaterializedView(TableName),
}

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

/// Parses and plans the pipeline in `path` without running anything.
pub fn plan_file(
    path: &Path,
    configuration: &BTreeMap<String, String>,
) -> Result<(PipelinePlan, PathBuf)> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).context(|| format!("cannot read {file}"))?;
    let pipeline_error = |source| EngineError::Pipeline {
        file: file.clone(),
        source: Box::new(source),
    };
    let text = strata_sql::substitute(&text, configuration).map_err(pipeline_error)?;
    let pipeline_dir = std::fs::canonicalize(path)
        .context(|| format!("cannot resolve {file}"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let parsed = strata_sql::parse_pipeline(&text).map_err(pipeline_error)?;
    let plan = strata_sql::plan_pipeline(parsed).map_err(pipeline_error)?;
    Ok((plan, pipeline_dir))
}

/// Runs the pipeline in `path` (a SQL file, or a YAML spec: see [`crate::load_pipeline`])
/// with `options`.
pub async fn run_pipeline(path: &Path, wh: &Warehouse, options: &RunOptions) -> Result<RunReport> {
    if crate::spec::is_spec(path) {
        let loaded = crate::spec::load_pipeline(path, &options.configuration)?;
        let planned =
            crate::sources::plan_sources(&loaded.sources, &loaded.configuration, &loaded.schema)?;
        return crate::sources::run_planned(planned, path, loaded.dir, wh, options).await;
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
        crate::warehouse::check_parquet_properties(name, props)?;
    }
    let feeds: BTreeSet<TableName> = plan.flows.iter().map(|f| f.target.clone()).collect();
    let mut schemas: BTreeMap<TableName, SchemaRef> = BTreeMap::new();
    let mut prepared: Vec<(Node, Prepared)> = Vec::new();
    let context = ingest::PipelineContext {
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
                        crate::changes::feed_schema(s)
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
                        let mut setup = flow::prepare_flow(f, &source, &props).await?;
                        setup.source_feed = feed;
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
            let (plan, declared, context, flows) = (&plan, &declared, &context, &flows);
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
                    match run_node(wh, plan, p, declared, &mut record, &update).await {
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
    // Rows kept for a reader that did not come in this run are read from the files next time.
    wh.forget_appended();
    match failure {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// How many times a node that keeps losing races with other writers is tried.
const CONFLICT_ATTEMPTS: u32 = 6;

/// The pause before try `attempt + 1` of a node that lost a race: doubling from 50 ms, with
/// a jitter so that writers that collided do not collide again in step.
fn conflict_backoff(attempt: u32) -> std::time::Duration {
    let base = 50u64 << attempt.min(6);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let jitter = (nanos ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9)) % base;
    std::time::Duration::from_millis(base + jitter)
}

/// The error of a node that lost its race [`CONFLICT_ATTEMPTS`] times: names the table and
/// the latest writer of it, as its last commit tells.
async fn gave_up(
    wh: &Warehouse,
    table: Option<&TableName>,
    e: EngineError,
    attempts: u32,
) -> EngineError {
    let mut last = String::new();
    if let Some(t) = table {
        if let Ok(Some(handle)) = wh.open_table(t).await {
            let mut history = handle.history(Some(1));
            if let Some(Ok(c)) = futures::StreamExt::next(&mut history).await {
                {
                    last = format!(
                        "; its latest commit: version {}, {} at {}{}",
                        crate::flow::version_of(&handle),
                        c.operation.as_deref().unwrap_or("an operation"),
                        c.timestamp
                            .and_then(chrono::DateTime::from_timestamp_millis)
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_else(|| "an unknown time".into()),
                        c.info
                            .get("strata.run")
                            .and_then(|r| r.as_str())
                            .map(|r| format!(" by strata run {r}"))
                            .or_else(|| c.engine_info.as_deref().map(|e| format!(" by {e}")))
                            .unwrap_or_default()
                    );
                }
            }
        }
    }
    let what = table.map_or_else(|| "a table".to_string(), |t| t.to_string());
    EngineError::Conflict {
        context: format!(
            "{what}: other writers committed first {attempts} time(s) in a row{last}; this run \
             wrote nothing of it (run again once the other writer is done)"
        ),
        source: match e {
            EngineError::Conflict { source, .. } => source,
            other => Box::new(deltalake::DeltaTableError::Generic(other.to_string())),
        },
    }
}

/// Prepares an ingestion node (a streaming table's query or an append flow) with `known`,
/// the schemas of the datasets prepared before it.
async fn prepare_ingestion(
    context: &ingest::PipelineContext<'_>,
    node: &Node,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Prepared> {
    let plan = context.plan;
    let (table, append) = match node {
        Node::Ingest(name) => (
            plan.tables
                .get(name)
                .ok_or_else(|| EngineError::Internal(format!("planned table {name} is missing")))?,
            None,
        ),
        Node::Append(i) => {
            let f = plan.appends.get(*i).ok_or_else(|| {
                EngineError::Internal(format!("planned append flow {i} is missing"))
            })?;
            let table = plan.tables.get(&f.target).ok_or_else(|| {
                EngineError::Internal(format!("planned table {} is missing", f.target))
            })?;
            (table, Some(f))
        }
        other => {
            return Err(EngineError::Internal(format!(
                "{other:?} is not an ingestion"
            )))
        }
    };
    Ok(
        match ingest::prepare_ingest(context, table, append, known).await? {
            Ok(setup) => Prepared::Ingest(Box::new(setup)),
            Err(waits) => Prepared::Waiting(match append {
                None => format!("{}: {waits}", table.name),
                Some(f) => format!("flow {}: {waits}", f.name),
            }),
        },
    )
}

/// Gives an ingestion the flows that read its table: its rows are checked against them
/// before each commit.
fn with_downstream(p: &mut Prepared, flows: &[FlowSetup]) {
    if let Prepared::Ingest(setup) = p {
        setup.downstream = flows
            .iter()
            .filter(|f| f.flow.source == setup.table.name)
            .cloned()
            .collect();
    }
}

/// What one node run adds to the run's report.
enum NodeOutput {
    Ingest(IngestReport),
    Flow(FlowReport),
    Waiting(String),
    PointInTime(PitReport),
    View(MvReport),
}

impl NodeOutput {
    fn add_to(self, report: &mut RunReport) {
        match self {
            NodeOutput::Ingest(r) => report.ingests.push(r),
            NodeOutput::Flow(r) => report.flows.push(r),
            NodeOutput::Waiting(w) => report.waiting.push(w),
            NodeOutput::PointInTime(r) => report.pits.push(r),
            NodeOutput::View(r) => report.views.push(r),
        }
    }
}

/// Every table a materialized view or view reads is declared in the pipeline or exists in
/// the warehouse.
async fn check_batch_reads(wh: &Warehouse, plan: &PipelinePlan) -> Result<()> {
    let queries = plan
        .materialized
        .values()
        .map(|m| {
            (
                format!("materialized view {}", m.name),
                m.location,
                &m.query.reads,
            )
        })
        .chain(
            plan.views
                .values()
                .map(|v| (format!("view {}", v.name), v.location, &v.query.reads)),
        )
        .chain(plan.tables.values().filter_map(|t| {
            let q = t.query.as_ref()?;
            Some((format!("streaming table {}", t.name), t.location, &q.reads))
        }))
        .chain(
            plan.appends
                .iter()
                .map(|f| (format!("flow {}", f.name), f.location, &f.query.reads)),
        );
    for (what, at, reads) in queries {
        for t in reads {
            let declared = plan.tables.contains_key(t)
                || plan.materialized.contains_key(t)
                || plan.views.contains_key(t)
                || plan.pits.iter().any(|p| &p.name == t);
            if !declared && wh.open_table(t).await?.is_none() {
                return Err(EngineError::Plan(format!(
                    "{what} (line {}) reads {t}, which is neither declared in the pipeline nor a \
                     table of the warehouse",
                    at.line
                )));
            }
        }
    }
    Ok(())
}

/// Runs one prepared node, filling `record` with what it did.
async fn run_node(
    wh: &Warehouse,
    plan: &PipelinePlan,
    p: &Prepared,
    declared: &BTreeSet<TableName>,
    record: &mut EventRecord,
    update: &(dyn Fn(String) + Send + Sync),
) -> Result<NodeOutput> {
    Ok(match p {
        Prepared::Ingest(setup) => {
            tracing::info!(table = %setup.table.name, flow = setup.flow_name(), "ingesting");
            let r = ingest::run_ingest(wh, setup, update).await?;
            record.rows_read = r.rows_read;
            record.rows_written = r.rows;
            record.rows_dropped = r.rows_dropped;
            record.expectations = r.expectations.clone();
            skipped_or(record, &r.skipped, || {
                format!("{} file(s), {} row(s) appended", r.files.len(), r.rows)
            });
            NodeOutput::Ingest(r)
        }
        Prepared::Flow(setup) => {
            tracing::info!(flow = %setup.flow.name, "running flow");
            let props = plan
                .tables
                .get(&setup.flow.target)
                .map(|t| t.properties.clone())
                .unwrap_or_default();
            let r = flow::run_flow(wh, setup, &props, update).await?;
            record.rows_read = r.events;
            record.rows_written = r.rows_written;
            record.rows_upserted = r.keys_upserted;
            record.rows_deleted = r.keys_deleted;
            record.versions_opened = r.versions_opened;
            record.versions_closed = r.versions_closed;
            skipped_or(record, &r.skipped, || {
                let mut m = format!(
                    "{} event(s), {} key(s) touched, {} changed",
                    r.events, r.keys_touched, r.keys_changed
                );
                for n in &r.notes {
                    m.push_str("; ");
                    m.push_str(n);
                }
                m
            });
            NodeOutput::Flow(r)
        }
        Prepared::Waiting(why) => {
            record.status = Status::Skipped;
            record.message = Some(why.clone());
            NodeOutput::Waiting(why.clone())
        }
        Prepared::PointInTime(i) => {
            let pit = plan.pits.get(*i).ok_or_else(|| {
                EngineError::Internal(format!("planned point-in-time table {i} is missing"))
            })?;
            tracing::info!(table = %pit.name, "refreshing point-in-time table");
            let r = crate::pit::refresh(wh, pit, &plan.default_schema).await?;
            record.rows_written = r.rows;
            skipped_or(record, &r.skipped, || {
                format!(
                    "{} as-of value(s) computed ({} recomputed), {} removed",
                    r.computed, r.recomputed, r.removed
                )
            });
            NodeOutput::PointInTime(r)
        }
        Prepared::MaterializedView(name) => {
            let mv = plan.materialized.get(name).ok_or_else(|| {
                EngineError::Internal(format!("planned materialized view {name} is missing"))
            })?;
            tracing::info!(table = %name, "refreshing materialized view");
            let reads = plan.reads(&Node::MaterializedView(name.clone()));
            let r =
                mview::refresh(wh, mv, &plan.views, &reads, declared, &plan.default_schema).await?;
            record.rows_read = r.rows_read;
            record.rows_written = r.rows;
            record.rows_dropped = r.rows_dropped;
            record.expectations = r.expectations.clone();
            skipped_or(record, &r.skipped, || format!("{} row(s)", r.rows));
            NodeOutput::View(r)
        }
    })
}

fn skipped_or(record: &mut EventRecord, skipped: &Option<String>, done: impl FnOnce() -> String) {
    match skipped {
        Some(why) => {
            record.status = Status::Skipped;
            record.message = Some(why.clone());
        }
        None => record.message = Some(done()),
    }
}

/// One line for a progress display.
fn summary(r: &EventRecord) -> String {
    match (r.status, &r.message) {
        (Status::Failed, _) => "FAILED".to_string(),
        (_, Some(m)) => m.clone(),
        (s, None) => s.as_str().to_string(),
    }
}

fn node_kind(plan: &PipelinePlan, node: &Node) -> &'static str {
    match node {
        Node::Ingest(_) => "ingest",
        Node::Append(_) => "append",
        Node::Flow(i) => match plan.flows.get(*i).map(|f| &f.kind) {
            Some(FlowKind::Snapshot { .. }) => "snapshot",
            _ => "cdc",
        },
        Node::MaterializedView(_) => "materialized_view",
        Node::PointInTime(_) => "point_in_time",
    }
}

fn node_flow_name(plan: &PipelinePlan, node: &Node) -> String {
    match node {
        Node::Flow(i) => plan.flows.get(*i).map(|f| f.name.clone()),
        Node::Append(i) => plan.appends.get(*i).map(|f| f.name.clone()),
        other => plan.writes(other).map(|t| t.name),
    }
    .unwrap_or_default()
}

/// `schema.name` or `name` (in `default_schema`) as a table name.
fn parse_table_name(s: &str, default_schema: &str) -> TableName {
    match s.split_once('.') {
        Some((schema, name)) => TableName::new(Some(schema), name),
        None => TableName::new(Some(default_schema), s),
    }
}

/// The nodes that read, directly or not, what `start` writes (`start` included).
fn downstream(plan: &PipelinePlan, start: Vec<Node>) -> BTreeSet<usize> {
    let index = |n: &Node| plan.order.iter().position(|m| m == n);
    let mut out: BTreeSet<usize> = start.iter().filter_map(index).collect();
    // The order is topological: one pass in order reaches everything downstream.
    for (i, node) in plan.order.iter().enumerate() {
        let reads = plan.reads(node);
        let feeds_on_selected = out.iter().any(|&j| {
            plan.writes(&plan.order[j])
                .is_some_and(|w| reads.contains(&w))
        });
        if feeds_on_selected {
            out.insert(i);
        }
    }
    out
}

/// The nodes a `--select` runs (every node without one).
fn select(plan: &PipelinePlan, selection: Option<&Selection>) -> Result<Vec<Node>> {
    let Some(sel) = selection else {
        return Ok(plan.order.clone());
    };
    let table = parse_table_name(&sel.name, &plan.default_schema);
    let direct: Vec<Node> = plan
        .order
        .iter()
        .filter(|n| {
            plan.writes(n).as_ref() == Some(&table)
                || match n {
                    Node::Flow(i) => plan.flows.get(*i).is_some_and(|f| f.name == sel.name),
                    Node::Append(i) => plan.appends.get(*i).is_some_and(|f| f.name == sel.name),
                    _ => false,
                }
        })
        .cloned()
        .collect();
    if direct.is_empty() {
        return Err(EngineError::NotFound(format!(
            "--select {}: the pipeline has no dataset or flow named {}",
            sel.name, sel.name
        )));
    }
    if !sel.downstream {
        return Ok(direct);
    }
    Ok(downstream(plan, direct)
        .into_iter()
        .map(|i| plan.order[i].clone())
        .collect())
}

/// The stored tables a full refresh rebuilds: all of them, or the named ones and every
/// table that reads them (whose progress through them would no longer mean anything).
fn refresh_set(plan: &PipelinePlan, names: &[String]) -> Result<Vec<TableName>> {
    let start: Vec<Node> = if names.is_empty() {
        plan.order.clone()
    } else {
        let mut start = Vec::new();
        for n in names {
            let t = parse_table_name(n, &plan.default_schema);
            let writers: Vec<Node> = plan
                .order
                .iter()
                .filter(|node| plan.writes(node).as_ref() == Some(&t))
                .cloned()
                .collect();
            if writers.is_empty() && !plan.tables.contains_key(&t) {
                return Err(EngineError::NotFound(format!(
                    "--full-refresh {n}: the pipeline has no table {t}"
                )));
            }
            start.extend(writers);
        }
        start
    };
    let mut tables: Vec<TableName> = downstream(plan, start)
        .into_iter()
        .filter_map(|i| plan.writes(&plan.order[i]))
        .collect();
    for n in names {
        tables.push(parse_table_name(n, &plan.default_schema));
    }
    tables.sort();
    tables.dedup();
    Ok(tables)
}

/// Refuses a full refresh that would reset a table declared (or created) with
/// `pipelines.reset.allowed = false`.
async fn check_reset_allowed(
    wh: &Warehouse,
    plan: &PipelinePlan,
    tables: &[TableName],
) -> Result<()> {
    const KEY: &str = "pipelines.reset.allowed";
    let mut refused = Vec::new();
    for t in tables {
        let declared = plan
            .tables
            .get(t)
            .and_then(|d| d.properties.get(KEY).cloned())
            .or_else(|| {
                plan.materialized
                    .get(t)
                    .and_then(|m| m.properties.get(KEY).cloned())
            });
        // A table not created yet has nothing to lose.
        let Some(table) = wh.open_table(t).await? else {
            continue;
        };
        let stored = crate::warehouse::table_properties(&table)?
            .get(KEY)
            .cloned();
        let guarded = [declared, stored]
            .iter()
            .flatten()
            .any(|v| v.eq_ignore_ascii_case("false"));
        if guarded {
            refused.push(t.to_string());
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(EngineError::Plan(format!(
        "full refresh refused: {} ha{} pipelines.reset.allowed = false, so its history cannot \
         be wiped and rebuilt (its sources may no longer hold it); nothing was changed. \
         Refresh other tables by name, or change the property if a rebuild is really meant",
        refused.join(", "),
        if refused.len() == 1 { "s" } else { "ve" }
    )))
}

/// Moves each table (and its event store) out of the way, into
/// `<warehouse>/_strata/full_refresh/<run>/`, so the run rebuilds it from its sources and
/// the old content stays on disk until the user deletes it.
fn set_aside(
    wh: &Warehouse,
    tables: &[TableName],
    run_id: &str,
) -> Result<Vec<(TableName, PathBuf)>> {
    let base = wh.root().join("_strata").join("full_refresh").join(run_id);
    let mut out = Vec::new();
    for t in tables {
        let moves = [
            (wh.table_path(t), base.join(&t.schema).join(&t.name)),
            (
                wh.event_store_path(t),
                base.join("events").join(&t.schema).join(&t.name),
            ),
        ];
        let mut moved = false;
        for (from, to) in moves {
            if !from.exists() {
                continue;
            }
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)
                    .context(|| format!("cannot create {}", parent.display()))?;
            }
            std::fs::rename(&from, &to)
                .context(|| format!("cannot move {} to {}", from.display(), to.display()))?;
            moved = true;
        }
        // Caches derived from the old table and event store (the state digest, the record of
        // files taken) go: they are checked against what they were made for, but the rebuilt
        // table should not even meet them.
        for cache in [
            crate::digest::dir_for(&wh.event_store_path(t)),
            wh.taken_cache_path(t),
        ] {
            if cache.exists() {
                std::fs::remove_dir_all(&cache)
                    .context(|| format!("cannot remove {}", cache.display()))?;
            }
        }
        if moved {
            out.push((t.clone(), base.join(&t.schema).join(&t.name)));
        }
    }
    Ok(out)
}
