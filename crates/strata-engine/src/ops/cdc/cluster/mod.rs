//! A flow's bulk load, or a large batch, on a cluster (Apache DataFusion Ballista, through
//! `strata-cluster`): the same parts as a local bulk load (`ops/cdc/bulk.rs`), with the
//! cluster's shuffle in place of the local split and its executors folding and writing the
//! parts.
//!
//! ```text
//!  coordinator (strata run)                     cluster
//!  ─────────────────────────                    ────────────────────────────────────
//!  create the event store and target (empty)
//!  plan: source files ─▶ SELECT ─▶ hash by key ─▶ FoldWriteExec (plan.rs) per partition:
//!                                                  order, check, write store files,
//!                                                  fold, write target files
//!  ◀── one row per partition: add actions, counts
//!  commit the event store, then the target (bulk.rs: commit_bulk), as a local load does
//! ```
//!
//! A batch into a target with rows (`run_batch_on_cluster`) sends the same plan with the
//! event store's version: each task also reads the stored events of its keys, folds the
//! rows before and after, and writes only what changed (`batch.rs`); the coordinator's
//! target commit marks the changed keys' old rows deleted (`storage/replace.rs`).
//!
//! Executors commit nothing: a failed or killed job leaves files in no commit (a vacuum
//! removes them) and the next run starts over. The input is read as Parquet files by path,
//! so a source with deletion vectors, column mapping or partition columns is loaded
//! locally (the run's notes say why).

mod batch;
mod job;
pub(crate) mod plan;

use crate::error::{EngineError, Result};
use crate::ops::cdc::bulk::{commit_bulk, Bulk, Input, Written};
use crate::ops::cdc::large_batch::{commit_batch, BatchWritten};
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::flow::FlowSetup;
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use plan::{FoldWriteExec, FoldWriteNode, ShuffleByKey, StrataQueryPlanner};

/// Opens sessions whose queries run on a cluster (implemented by `strata-cluster`).
pub trait ClusterConnector: Send + Sync {
    /// The cluster's address as the user gave it (`df://host:50050`).
    fn url(&self) -> String;
    /// A session whose collected queries run on the cluster.
    fn connect(
        &self,
    ) -> futures::future::BoxFuture<'_, std::result::Result<SessionContext, String>>;
    /// The stages of the job that `plan` (planned in a session of [`Self::connect`], and
    /// executing) runs that have completed so far; `None` when the cluster cannot tell (the
    /// job has not started, or the scheduler does not answer).
    fn stages_done(
        &self,
        plan: Arc<dyn ExecutionPlan>,
    ) -> futures::future::BoxFuture<'_, Option<Vec<StageDone>>>;
}

/// A completed stage of a cluster job, as its scheduler tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageDone {
    /// The stage's number in its job.
    pub stage: u32,
    /// Its tasks (one per partition).
    pub tasks: u32,
    /// The rows its tasks put out, when the scheduler reports them.
    pub rows: Option<u64>,
    /// The stage folds and writes (strata's node), else it reads and shuffles.
    pub folds: bool,
}

impl StageDone {
    /// What the stage did, for progress lines (`stage 1 (read and shuffle the events): 2
    /// task(s), 3000 row(s)`).
    fn describe(&self) -> String {
        let what = match self.folds {
            true => "fold and write",
            false => "read and shuffle the events",
        };
        let rows = self
            .rows
            .map(|r| format!(", {r} row(s)"))
            .unwrap_or_default();
        format!(
            "stage {} ({what}): {} task(s){rows}",
            self.stage, self.tasks
        )
    }
}

/// `strata run --cluster`: where bulk loads go.
#[derive(Clone)]
pub struct ClusterRun {
    pub connector: Arc<dyn ClusterConnector>,
    /// A first load of fewer events runs locally (`--cluster-min-events`).
    pub min_events: u64,
}

impl std::fmt::Debug for ClusterRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ClusterRun({}, min {})",
            self.connector.url(),
            self.min_events
        )
    }
}

/// A session state for a cluster's scheduler, executors and coordinator: strata's SQL types,
/// functions and file-reading settings over `config` (which carries the cluster's own
/// settings), the cluster nodes planned by [`StrataQueryPlanner`], and `runtime` (whose
/// object stores reach the warehouse).
pub fn session_state(
    config: deltalake::datafusion::prelude::SessionConfig,
    runtime: Arc<deltalake::datafusion::execution::runtime_env::RuntimeEnv>,
) -> deltalake::datafusion::execution::SessionState {
    let config = crate::storage::session::with_file_settings(config);
    let mut rules =
        deltalake::datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    rules.push(Arc::new(ShuffleByKey));
    crate::storage::session::session_planned_by(
        config,
        Some(runtime),
        Some(Arc::new(StrataQueryPlanner)),
        Some(rules),
    )
    .state()
}

/// Whether the bulk load `bulk` runs on the run's cluster: `Err` with the reason it runs
/// locally (`None`: there is no cluster).
pub(super) fn placement<'a>(
    scope: &Scope<'a>,
    bulk: &Bulk<'_>,
) -> std::result::Result<&'a ClusterRun, Option<String>> {
    let cluster = scope.cluster.ok_or(None)?;
    let Input::Source {
        source, changes, ..
    } = &bulk.from
    else {
        return Err(Some(
            "rebuilding the target from its event store runs locally".into(),
        ));
    };
    if bulk.expected < cluster.min_events {
        return Err(Some(format!(
            "{} event(s), fewer than --cluster-min-events {}: loaded locally",
            bulk.expected, cluster.min_events
        )));
    }
    source_reason(source, &changes.live).map_or(Ok(cluster), |r| Err(Some(r)))
}

/// Why the executors cannot read the files `live` of `source` as plain Parquet files.
fn source_reason(source: &DeltaTable, live: &[String]) -> Option<String> {
    let snapshot = match source.snapshot() {
        Ok(s) => s,
        Err(e) => return Some(format!("the source's snapshot: {e}")),
    };
    let meta = snapshot.metadata();
    if !meta.partition_columns().is_empty() {
        return Some("the source is partitioned: loaded locally".into());
    }
    if meta
        .configuration()
        .iter()
        .any(|(k, v)| k == "delta.columnMapping.mode" && v != "none")
    {
        return Some("the source uses column mapping: loaded locally".into());
    }
    let live: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
    let has_dv = snapshot
        .log_data()
        .iter()
        .any(|f| live.contains(f.path().as_ref()) && f.deletion_vector_descriptor().is_some());
    has_dv.then(|| "the source has deletion vectors: loaded locally".into())
}

/// Runs the bulk load `bulk` of `setup` on `cluster` (see the module docs).
pub(super) async fn run_on_cluster(
    scope: &Scope<'_>,
    cluster: &ClusterRun,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    bulk: Bulk<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let Input::Source { store, .. } = &bulk.from else {
        return Err(EngineError::internal("a cluster load reads its source"));
    };
    let on = connect(cluster, setup).await?;
    let store = match store {
        Some(s) => s.clone(),
        None => {
            crate::eventstore::pages::create_store(
                bulk.store_path,
                &setup.event_schema,
                &setup.key_names,
            )
            .await?
        }
    };
    let target = match &bulk.target {
        Some(t) => t.clone(),
        None => super::target::create_target(scope, setup, target_properties).await?,
    };
    let sent = send(scope, &on, setup, &bulk, &target, None, report).await?;
    report.notes.push(format!(
        "bulk load on the cluster {}: {} event(s) folded in {} part(s) of whole keys by its \
         executors in {:.1} s",
        cluster.connector.url(),
        sent.written.events,
        sent.tasks,
        sent.seconds
    ));
    let written = Written {
        store: Some((&store, sent.written.store_adds)),
        target: &target,
        target_adds: sent.written.target_adds,
        events: sent.written.events,
        decided_at: sent.written.decided_at,
    };
    commit_bulk(scope, setup, &bulk, written, report).await
}

/// Runs the batch `bulk` of `setup` into a target with rows on `cluster` (`batch.rs`): the
/// executors fold the new events with the stored events of their keys and write the files;
/// here the commits (`large_batch.rs`: `commit_batch`).
pub(super) async fn run_batch_on_cluster(
    scope: &Scope<'_>,
    cluster: &ClusterRun,
    setup: &FlowSetup,
    bulk: Bulk<'_>,
    report: &mut FlowReport,
) -> Result<()> {
    let Some(target) = &bulk.target else {
        return Err(EngineError::internal("a batch on the cluster has a target"));
    };
    let on = connect(cluster, setup).await?;
    let sent = send(
        scope,
        &on,
        setup,
        &bulk,
        target,
        Some(bulk.store_version),
        report,
    )
    .await?;
    report.notes.push(format!(
        "batch on the cluster {}: {} new event(s) folded with the stored events of {} key(s) \
         in {} part(s) by its executors in {:.1} s",
        cluster.connector.url(),
        sent.written.events,
        report.keys_touched,
        sent.tasks,
        sent.seconds
    ));
    commit_batch(scope, setup, &bulk, sent.written, report).await
}

/// What a job's partitions gave, gathered.
struct Sent {
    tasks: usize,
    seconds: f64,
    written: BatchWritten,
}

/// A cluster and a session on it.
struct Connected<'a> {
    cluster: &'a ClusterRun,
    ctx: SessionContext,
}

/// A session on `cluster` for a job of `setup`'s flow; a cluster that cannot be reached is
/// bad input (its address), before anything is created or written.
async fn connect<'a>(cluster: &'a ClusterRun, setup: &FlowSetup) -> Result<Connected<'a>> {
    let ctx = cluster.connector.connect().await.map_err(|e| {
        EngineError::BadInput(format!(
            "flow {}: cannot reach the cluster {}: {e}",
            setup.flow.name,
            cluster.connector.url()
        ))
    })?;
    Ok(Connected { cluster, ctx })
}

/// Sends the job of `bulk` (a first load, or with `stored_at` a batch folded with the
/// event store's events as of that version) to `cluster`, writing into `target`, and
/// gathers its partitions' results, counted into `report`.
async fn send(
    scope: &Scope<'_>,
    on: &Connected<'_>,
    setup: &FlowSetup,
    bulk: &Bulk<'_>,
    target: &DeltaTable,
    stored_at: Option<i64>,
    report: &mut FlowReport,
) -> Result<Sent> {
    let (cluster, ctx) = (on.cluster, &on.ctx);
    let flow = &setup.flow;
    let work = match stored_at {
        Some(_) => "batch",
        None => "bulk load",
    };
    let within = |e: EngineError| {
        e.within(|| format!("flow {}: {work} on {}", flow.name, cluster.connector.url()))
    };
    let Input::Source {
        source,
        changes,
        from,
        run,
        ..
    } = &bulk.from
    else {
        return Err(EngineError::internal("a cluster job reads its source"));
    };
    drop(
        scope
            .handoff
            .take(&flow.source, &flow.name, *from, bulk.source_version),
    );
    (scope.update)(format!(
        "{work}: {} event(s) on the cluster {}",
        bulk.expected,
        cluster.connector.url()
    ));
    let job = job::FoldJob {
        setup: setup.clone(),
        store: bulk.store_path.to_string(),
        target: target.table_url().to_string(),
        run: *run,
        place: format!(
            "the rows of {} added after version {}",
            flow.source,
            from.map_or("(start)".to_string(), |v| v.to_string())
        ),
        stored_at,
        decided_at: chrono::Utc::now().timestamp_millis(),
    };
    let decided_at = job.decided_at;
    let parts = crate::util::spill::parts_for(
        bulk.expected,
        super::bulk::EVENT_BYTES_IN_MEMORY,
        scope.memory,
    )?
    .max(MIN_PARTS);
    let started = std::time::Instant::now();
    register_files(ctx, source, &changes.live).await?;
    let (batches, stages) = run_job(scope, cluster, ctx, source, setup, job, parts)
        .await
        .map_err(within)?;
    if !stages.is_empty() {
        report.notes.push(format!(
            "{work} on the cluster {}: {}",
            cluster.connector.url(),
            stages.join("; ")
        ));
    }
    let results = job::read_results(&batches)?;
    let mut sent = Sent {
        tasks: results.len(),
        seconds: 0.0,
        written: BatchWritten {
            decided_at,
            ..Default::default()
        },
    };
    for part in results {
        let written = &mut sent.written;
        written.store_adds.extend(part.store_adds);
        written.target_adds.extend(part.target_adds);
        written.add(part.outcome, part.cdc_adds, part.changed_keys, report);
    }
    sent.seconds = started.elapsed().as_secs_f64();
    Ok(sent)
}

/// The fewest partitions a cluster load is split into, so that two executors share it.
const MIN_PARTS: usize = 4;

/// Plans the job over the source's files registered in `ctx` (a cluster session) and collects
/// its result rows, telling each stage as the cluster completes it ([`watch_stages`]).
async fn run_job(
    scope: &Scope<'_>,
    cluster: &ClusterRun,
    ctx: &SessionContext,
    source: &DeltaTable,
    setup: &FlowSetup,
    job: job::FoldJob,
    parts: usize,
) -> Result<(Vec<deltalake::arrow::array::RecordBatch>, Vec<String>)> {
    use deltalake::datafusion::logical_expr::{Extension, LogicalPlan};
    let what = || "planning the bulk load".to_string();
    let events = ctx
        .sql(&setup.select_sql)
        .await
        .map_err(|e| EngineError::of_query(what(), e))?;
    let (state, events) = events.into_parts();
    let node = plan::FoldWriteNode::new(&job, setup.key_names.clone(), parts, events)?;
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    let frame = deltalake::datafusion::dataframe::DataFrame::new(state, plan);
    let task_ctx = Arc::new(frame.task_ctx());
    let physical = frame
        .create_physical_plan()
        .await
        .map_err(|e| EngineError::of_query(what(), e))?;
    let work = deltalake::datafusion::physical_plan::collect(physical.clone(), task_ctx);
    let (batches, stages) = watch_stages(scope, cluster, physical, work).await;
    let batches = batches.map_err(|e| {
        let text = e.to_string();
        match plan::rejected_input(&text) {
            Some(rejection) => EngineError::BadInput(rejection),
            None if plan::store_failure(&text) => EngineError::of_query(
                format!(
                    "the cluster's executors could not read or write the warehouse \
                     (the source {}); each executor reaches it with the credentials of \
                     its own environment (AWS_*, AZURE_*, GOOGLE_*): check them on every \
                     executor",
                    source.table_url()
                ),
                e,
            ),
            None => EngineError::of_query("running the bulk load on the cluster", e),
        }
    })?;
    Ok((batches, stages))
}

/// How often the scheduler is asked which stages completed.
const STAGE_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Awaits `work` (the job `plan` running on `cluster`), asking the scheduler every
/// [`STAGE_POLL`] which stages completed: each is told on the run's progress line and in
/// the log as it completes, and listed with the second it was seen done in the returned
/// lines (once more asked when the job ends).
async fn watch_stages<T>(
    scope: &Scope<'_>,
    cluster: &ClusterRun,
    plan: Arc<dyn ExecutionPlan>,
    work: impl std::future::Future<Output = T>,
) -> (T, Vec<String>) {
    let started = std::time::Instant::now();
    let mut told: Vec<String> = Vec::new();
    let tell = |stages: Option<Vec<StageDone>>, told: &mut Vec<String>| {
        for stage in stages.unwrap_or_default().iter().skip(told.len()) {
            let line = format!(
                "{} done at {:.1} s",
                stage.describe(),
                started.elapsed().as_secs_f64()
            );
            tracing::info!("cluster {}: {line}", cluster.connector.url());
            (scope.update)(format!("on the cluster: {line}"));
            told.push(line);
        }
    };
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tokio::time::sleep(STAGE_POLL) => {
                tell(cluster.connector.stages_done(plan.clone()).await, &mut told);
            }
        }
    };
    tell(cluster.connector.stages_done(plan).await, &mut told);
    (out, told)
}

/// Registers the files `live` of `source` in `ctx` as the flow's source table: Parquet files
/// by URL with the table's schema, which a cluster's scheduler and executors read from the
/// same store.
async fn register_files(ctx: &SessionContext, source: &DeltaTable, live: &[String]) -> Result<()> {
    use deltalake::datafusion::datasource::file_format::parquet::ParquetFormat;
    use deltalake::datafusion::datasource::listing::{
        ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
    };
    let what = || format!("reading {}", source.table_url());
    let base = source.table_url().clone();
    let base = match base.as_str().ends_with('/') {
        true => base,
        false => url::Url::parse(&format!("{base}/"))
            .map_err(|e| EngineError::internal(format!("{}: {e}", what())))?,
    };
    let urls = live
        .iter()
        .map(|file| {
            let url = base
                .join(file)
                .map_err(|e| EngineError::internal(format!("{}: {file}: {e}", what())))?;
            ListingTableUrl::parse(url.as_str()).map_err(|e| EngineError::of_query(what(), e))
        })
        .collect::<Result<Vec<_>>>()?;
    let schema = crate::storage::table::table_schema(source)?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension("");
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .with_schema(schema);
    let table = ListingTable::try_new(config).map_err(|e| EngineError::of_query(what(), e))?;
    ctx.register_table(strata_sql::SOURCE_PLACEHOLDER, Arc::new(table))
        .map_err(|e| EngineError::of_query(what(), e))?;
    Ok(())
}
