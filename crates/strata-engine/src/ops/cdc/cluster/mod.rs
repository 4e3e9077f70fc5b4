//! A flow's bulk load on a cluster (Apache DataFusion Ballista, through `strata-cluster`):
//! the same parts as a local bulk load (`ops/cdc/bulk.rs`), with the cluster's shuffle
//! in place of the local split and its executors folding and writing the parts.
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
//! Executors commit nothing: a failed or killed job leaves files in no commit (a vacuum
//! removes them) and the next run starts over. The input is read as Parquet files by path,
//! so a source with deletion vectors, column mapping or partition columns is loaded
//! locally (the run's notes say why).

pub(crate) mod plan;

use crate::error::{EngineError, Result};
use crate::ops::cdc::bulk::{commit_bulk, Bulk, Input, Written};
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::flow::FlowSetup;
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
    let flow = &setup.flow;
    let within = |e: EngineError| {
        e.within(|| {
            format!(
                "flow {}: bulk load on {}",
                flow.name,
                cluster.connector.url()
            )
        })
    };
    let Input::Source {
        source,
        changes,
        from,
        store,
        run,
    } = &bulk.from
    else {
        return Err(EngineError::internal("a cluster load reads its source"));
    };
    drop(
        scope
            .handoff
            .take(&flow.source, &flow.name, None, bulk.source_version),
    );
    (scope.update)(format!(
        "bulk load: {} event(s) on the cluster {}",
        bulk.expected,
        cluster.connector.url()
    ));
    let ctx = cluster.connector.connect().await.map_err(|e| {
        EngineError::BadInput(format!(
            "flow {}: cannot reach the cluster {}: {e}",
            flow.name,
            cluster.connector.url()
        ))
    })?;
    let store = match store {
        Some(s) => s.clone(),
        None => {
            crate::eventstore::pages::create_store(bulk.store_path, &setup.event_schema).await?
        }
    };
    let target = match &bulk.target {
        Some(t) => t.clone(),
        None => super::target::create_target(scope, setup, target_properties).await?,
    };
    let job = plan::FoldJob {
        setup: setup.clone(),
        store: bulk.store_path.to_string(),
        target: target.table_url().to_string(),
        run: *run,
        place: format!(
            "the rows of {} added after version {}",
            flow.source,
            from.map_or("(start)".to_string(), |v| v.to_string())
        ),
    };
    let parts = crate::util::spill::parts_for(
        bulk.expected,
        super::bulk::EVENT_BYTES_IN_MEMORY,
        scope.memory,
    )?
    .max(MIN_PARTS);
    let started = std::time::Instant::now();
    let batches = run_job(&ctx, source, &changes.live, setup, job, parts)
        .await
        .map_err(within)?;
    let results = plan::read_results(&batches)?;
    let tasks = results.len();
    let (mut store_adds, mut target_adds, mut events) = (Vec::new(), Vec::new(), 0);
    for part in results {
        part.outcome.add_to(report);
        events += part.outcome.events;
        store_adds.extend(part.store_adds);
        target_adds.extend(part.target_adds);
    }
    report.notes.push(format!(
        "bulk load on the cluster {}: {events} event(s) folded in {tasks} part(s) of whole \
         keys by its executors in {:.1} s",
        cluster.connector.url(),
        started.elapsed().as_secs_f64()
    ));
    let written = Written {
        store: Some((&store, store_adds)),
        target: &target,
        target_adds,
        events,
        decided_at: chrono::Utc::now().timestamp_millis(),
    };
    commit_bulk(scope, setup, &bulk, written, report).await
}

/// The fewest partitions a cluster load is split into, so that two executors share it.
const MIN_PARTS: usize = 4;

/// Plans the job over the source files `live` in `ctx` (a cluster session) and collects
/// its result rows.
async fn run_job(
    ctx: &SessionContext,
    source: &DeltaTable,
    live: &[String],
    setup: &FlowSetup,
    job: plan::FoldJob,
    parts: usize,
) -> Result<Vec<deltalake::arrow::array::RecordBatch>> {
    use deltalake::datafusion::logical_expr::{Extension, LogicalPlan};
    let what = || "planning the bulk load".to_string();
    register_files(ctx, source, live).await?;
    let events = ctx
        .sql(&setup.select_sql)
        .await
        .map_err(|e| EngineError::of_query(what(), e))?;
    let (state, events) = events.into_parts();
    let node = plan::FoldWriteNode::new(&job, setup.key_names.clone(), parts, events)?;
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    deltalake::datafusion::dataframe::DataFrame::new(state, plan)
        .collect()
        .await
        .map_err(|e| {
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
        })
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
