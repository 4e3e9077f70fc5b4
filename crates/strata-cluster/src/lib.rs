//! strata on an Apache DataFusion Ballista cluster: the scheduler and executor processes
//! (`strata cluster scheduler`, `strata cluster executor`) with strata's plan codecs,
//! planner, functions and object stores, and the [`Connector`] a coordinator
//! (`strata run --cluster df://HOST:PORT`) opens sessions with.
//!
//! ```text
//!  strata run (coordinator) ──logical plan──▶ strata cluster scheduler ──stages──▶ executors
//!   plans the bulk load (strata-engine,        plans it (StrataQueryPlanner),      run them (the
//!   ops/cdc/cluster), commits the result       splits it into stages at the        shuffle, then
//!                                              hash shuffle                        FoldWriteExec)
//! ```
//!
//! Every process reads the warehouse's object store with its credentials from its own
//! environment (`AWS_*`, `AZURE_*`, `GOOGLE_*`), as `strata run` does: no secret travels
//! with a plan.

mod codec;
mod stores;

pub use codec::{LogicalCodec, PhysicalCodec};

use ballista::prelude::SessionContextExt;
use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{GetJobMetricsParams, JobStageMetrics};
use datafusion_proto::protobuf::LogicalPlanNode;
use deltalake::datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::prelude::{SessionConfig, SessionContext};
use std::net::SocketAddr;
use std::sync::Arc;
use strata_engine::cluster::StageDone;

/// What went wrong starting or reaching a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The address or a setting is not usable.
    #[error("{0}")]
    Config(String),
    /// A scheduler or executor stopped with an error.
    #[error("{what}: {message}")]
    Process { what: &'static str, message: String },
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// The runtime every cluster process and the coordinator use: strata's object stores.
fn runtime() -> deltalake::datafusion::common::Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(stores::WarehouseStores::default()))
        .build_arc()
}

/// The session configuration of the cluster: Ballista's, with strata's codecs. A bulk load
/// chooses its number of parts itself (each part folds within the memory limit): Ballista
/// plans it with its static planner, which keeps the session's physical rules (strata's
/// shuffle by key among them), and does not merge small shuffle partitions into one task.
fn config() -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::default()))
        .with_ballista_adaptive_query_planner(false)
        .with_ballista_coalesce_enabled(false)
}

/// The session state of a process of the cluster, for `config` (a client's settings).
fn state_for(
    config: SessionConfig,
) -> deltalake::datafusion::common::Result<deltalake::datafusion::execution::SessionState> {
    Ok(strata_engine::cluster::session_state(config, runtime()?))
}

/// A coordinator's way to the cluster at `url` (`df://host:port`).
pub struct Connector {
    url: String,
}

impl Connector {
    /// A connector to `url`, checked for its form (nothing is reached yet).
    pub fn new(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("df://").ok_or_else(|| {
            ClusterError::Config(format!(
                "--cluster {url}: a cluster is named df://HOST:PORT (its scheduler's address)"
            ))
        })?;
        match rest.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
            Some((host, Ok(_))) if !host.is_empty() => Ok(Connector {
                url: url.to_string(),
            }),
            _ => Err(ClusterError::Config(format!(
                "--cluster {url}: expected df://HOST:PORT"
            ))),
        }
    }
}

impl strata_engine::cluster::ClusterConnector for Connector {
    fn url(&self) -> String {
        self.url.clone()
    }

    fn connect(
        &self,
    ) -> futures::future::BoxFuture<'_, std::result::Result<SessionContext, String>> {
        Box::pin(async move {
            let state = state_for(config()).map_err(|e| e.to_string())?;
            SessionContext::remote_with_state(&self.url, state)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn stages_done(
        &self,
        plan: Arc<dyn ExecutionPlan>,
    ) -> futures::future::BoxFuture<'_, Option<Vec<StageDone>>> {
        Box::pin(async move {
            let job_id = job_of(&plan)?;
            let address = format!("http://{}", self.url.strip_prefix("df://")?);
            let mut client = SchedulerGrpcClient::connect(address).await.ok()?;
            let metrics = client
                .get_job_metrics(GetJobMetricsParams { job_id })
                .await
                .ok()?
                .into_inner();
            let mut stages: Vec<StageDone> = metrics.stages.iter().map(stage_done).collect();
            stages.sort_by_key(|s| s.stage);
            Some(stages)
        })
    }
}

/// The id of the job that `plan` (a Ballista session's physical plan, executing) runs.
fn job_of(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    if let Some(exec) = plan.downcast_ref::<DistributedQueryExec<LogicalPlanNode>>() {
        return exec.job_id().map(|id| id.to_string());
    }
    plan.children().into_iter().find_map(job_of)
}

/// A completed stage as the scheduler's metrics tell it: its top operator's output rows,
/// and whether strata's fold-and-write node runs in it.
fn stage_done(stage: &JobStageMetrics) -> StageDone {
    use ballista_core::serde::protobuf::operator_metric::Metric;
    let top = stage.operators.iter().min_by_key(|o| o.depth);
    let rows = top.and_then(|o| {
        let rows: Vec<u64> = o
            .metrics
            .iter()
            .filter_map(|m| match m.metric {
                Some(Metric::OutputRows(n)) => Some(n),
                _ => None,
            })
            .collect();
        (!rows.is_empty()).then(|| rows.iter().sum())
    });
    StageDone {
        stage: stage.stage_id,
        tasks: stage.partitions,
        rows,
        folds: stage
            .operators
            .iter()
            .any(|o| o.operator_type.contains("StrataFoldWrite")),
    }
}

/// Runs a scheduler on `bind` until it fails or the process is stopped.
pub async fn run_scheduler(bind: SocketAddr) -> Result<()> {
    use ballista_scheduler::cluster::BallistaCluster;
    use ballista_scheduler::config::SchedulerConfig;
    let process = |message: String| ClusterError::Process {
        what: "the scheduler",
        message,
    };
    let config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        external_host: bind.ip().to_string(),
        bind_port: bind.port(),
        override_config_producer: Some(Arc::new(config)),
        override_session_builder: Some(Arc::new(state_for)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::default())),
        // An executor that stops answering is given up after 30 s, and its tasks run again
        // elsewhere.
        executor_timeout_seconds: 30,
        expire_dead_executor_interval_seconds: 5,
        ..Default::default()
    };
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| process(e.to_string()))?;
    ballista_scheduler::scheduler_process::start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(|e| process(e.to_string()))
}

/// Where an executor listens and which scheduler it joins.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's address (`HOST:PORT`).
    pub scheduler: String,
    /// The host this executor binds and is reached at.
    pub host: String,
    /// Its Arrow Flight port (shuffle data) and gRPC port.
    pub port: u16,
    pub grpc_port: u16,
    /// Tasks it runs at a time (default: the machine's cores).
    pub slots: Option<usize>,
    /// Its folder for shuffle files (default: a temporary folder).
    pub work_dir: Option<String>,
}

/// Runs an executor until it fails or the process is stopped.
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
    let process = |message: String| ClusterError::Process {
        what: "the executor",
        message,
    };
    let (scheduler_host, scheduler_port) = options
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            ClusterError::Config(format!(
                "--scheduler {}: expected HOST:PORT",
                options.scheduler
            ))
        })?;
    let functions = state_for(config())
        .map(|s| BallistaFunctionRegistry::from(&s))
        .map_err(|e| process(e.to_string()))?;
    let mut config = ExecutorProcessConfig {
        bind_host: options.host.clone(),
        external_host: Some(options.host.clone()),
        port: options.port,
        grpc_port: options.grpc_port,
        scheduler_host,
        scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        work_dir: options.work_dir.clone(),
        print_thread_info: false,
        executor_heartbeat_interval_seconds: 5,
        override_function_registry: Some(Arc::new(functions)),
        override_runtime_producer: Some(Arc::new(|_: &SessionConfig| runtime())),
        override_config_producer: Some(Arc::new(config)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::default())),
        ..Default::default()
    };
    if let Some(slots) = options.slots {
        config.vcores = slots;
    }
    start_executor_process(Arc::new(config))
        .await
        .map_err(|e| process(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_named_by_its_scheduler() {
        assert!(Connector::new("df://localhost:50050").is_ok());
        for bad in [
            "localhost:50050",
            "df://localhost",
            "df://:50050",
            "http://h:1",
        ] {
            let e = Connector::new(bad).err().expect(bad).to_string();
            assert!(e.contains(bad) && e.contains("df://"), "{e}");
        }
    }
}
