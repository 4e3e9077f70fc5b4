//! The plan pieces a cluster runs: [`FoldWriteNode`] (logical) and [`FoldWriteExec`]
//! (physical) take one hash partition of a flow's events (whole keys) and do its part of
//! the job (`job.rs`): a first load's part orders and checks them, writes them to the event
//! store's files, folds them and writes the folded rows to the target's files, exactly as
//! one part of a local bulk load (`ops/cdc/bulk.rs`: `order_part`, `write_part`); a batch's
//! part also folds the stored events of its keys (`batch.rs`). They commit nothing: each
//! partition returns one row with the Delta add actions of the files it wrote and its
//! counts, and the coordinator makes the commits.
//!
//! ```text
//!  source files ─▶ the flow's SELECT ─▶ hash shuffle by key ─▶ FoldWriteExec ─▶ one row per
//!  (ListingTable)   (events)             (Ballista's stages)    per partition     partition
//! ```
//!
//! Both nodes carry their [`FoldJob`] as JSON text (the flow's setup, the tables' places,
//! the run number): [`FoldWriteNode::to_bytes`] and [`FoldWriteExec::to_bytes`] are what a
//! cluster's codecs send, read back by `from_bytes`.

use super::job::{result_schema, FoldJob, PartResult};
use crate::error::{EngineError, Result};
use crate::semantics::events::without_run;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::catalog::Session;
use deltalake::datafusion::common::tree_node::TreeNodeRecursion;
use deltalake::datafusion::common::{DFSchema, DFSchemaRef, DataFusionError};
use deltalake::datafusion::execution::context::QueryPlanner;
use deltalake::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use deltalake::datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use deltalake::datafusion::logical_expr::{
    Expr, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use deltalake::datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use deltalake::datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use deltalake::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use deltalake::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties,
};
use deltalake::datafusion::physical_planner::{
    DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner,
};
use futures::TryStreamExt;
use std::sync::Arc;

/// The bytes a node is sent as: a tag, then the job and the key columns as JSON.
const TAG: &[u8] = b"strata.fold_write.v1:";

#[derive(serde::Serialize, serde::Deserialize)]
struct Wire {
    job: String,
    keys: Vec<String>,
    parts: usize,
}

fn encode(job: &str, keys: &[String], parts: usize) -> Vec<u8> {
    let wire = Wire {
        job: job.to_string(),
        keys: keys.to_vec(),
        parts,
    };
    let mut bytes = TAG.to_vec();
    bytes.extend(serde_json::to_vec(&wire).unwrap_or_default());
    bytes
}

fn decode(bytes: &[u8]) -> Option<std::result::Result<Wire, DataFusionError>> {
    let body = bytes.strip_prefix(TAG)?;
    Some(serde_json::from_slice(body).map_err(|e| {
        DataFusionError::Internal(format!("decoding a strata fold-and-write node: {e}"))
    }))
}

/// The logical node: fold and write `input` (the flow's events) in `parts` partitions of
/// whole keys (the physical plan shuffles it by key: [`ShuffleByKey`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FoldWriteNode {
    /// The [`FoldJob`] as JSON.
    job: String,
    keys: Vec<String>,
    /// The partitions the events are shuffled into.
    parts: usize,
    input: LogicalPlan,
    schema: DFSchemaRef,
}

impl FoldWriteNode {
    /// The node folding `input` (the events), shuffled by the key columns `keys` into
    /// `parts` partitions.
    pub(crate) fn new(
        job: &FoldJob,
        keys: Vec<String>,
        parts: usize,
        input: LogicalPlan,
    ) -> Result<Self> {
        let job = serde_json::to_string(job)
            .map_err(|e| EngineError::internal(format!("encoding a cluster job: {e}")))?;
        Self::with(job, keys, parts, input)
            .map_err(|e| EngineError::of_query("planning the cluster job", e))
    }

    fn with(
        job: String,
        keys: Vec<String>,
        parts: usize,
        input: LogicalPlan,
    ) -> deltalake::datafusion::common::Result<Self> {
        Ok(FoldWriteNode {
            job,
            keys,
            parts,
            input,
            schema: Arc::new(DFSchema::try_from(result_schema())?),
        })
    }

    /// The node as a cluster's logical codec sends it (its input goes separately).
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(&self.job, &self.keys, self.parts)
    }

    /// The node `bytes` holds over `input`; `None` when `bytes` is not such a node.
    pub fn from_bytes(
        bytes: &[u8],
        input: LogicalPlan,
    ) -> Option<deltalake::datafusion::common::Result<Self>> {
        decode(bytes).map(|wire| wire.and_then(|w| Self::with(w.job, w.keys, w.parts, input)))
    }
}

/// Ordered by the job, keys and parts (the schema is the same for every node); nodes equal
/// in those over different inputs are not ordered.
impl PartialOrd for FoldWriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.job, &self.keys, self.parts)
            .partial_cmp(&(&other.job, &other.keys, other.parts))
            .filter(|o| o.is_ne() || self.input == other.input)
    }
}

impl UserDefinedLogicalNodeCore for FoldWriteNode {
    fn name(&self) -> &str {
        "StrataFoldWrite"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "StrataFoldWrite: keys=[{}]", self.keys.join(", "))
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> deltalake::datafusion::common::Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Plan("StrataFoldWrite has one input".to_string()))?;
        Self::with(self.job.clone(), self.keys.clone(), self.parts, input)
    }
}

/// The physical node of [`FoldWriteNode`]: one result row per input partition.
#[derive(Debug)]
pub struct FoldWriteExec {
    job: String,
    keys: Vec<String>,
    parts: usize,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl FoldWriteExec {
    fn new(job: String, keys: Vec<String>, parts: usize, input: Arc<dyn ExecutionPlan>) -> Self {
        let partitions = input.properties().partitioning.partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(result_schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        FoldWriteExec {
            job,
            keys,
            parts,
            input,
            properties: Arc::new(properties),
        }
    }

    /// The node as a cluster's physical codec sends it (its input goes separately).
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(&self.job, &self.keys, self.parts)
    }

    /// The node `bytes` holds over `input`; `None` when `bytes` is not such a node.
    pub fn from_bytes(
        bytes: &[u8],
        input: Arc<dyn ExecutionPlan>,
    ) -> Option<deltalake::datafusion::common::Result<Self>> {
        decode(bytes).map(|wire| wire.map(|w| Self::new(w.job, w.keys, w.parts, input)))
    }

    /// This node over `input` shuffled by key into its parts (whatever distribution
    /// operators were above `input`).
    fn shuffled(&self) -> deltalake::datafusion::common::Result<Self> {
        use deltalake::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
        use deltalake::datafusion::physical_plan::repartition::RepartitionExec;
        let mut input = self.input.clone();
        loop {
            let next = match (
                input.downcast_ref::<RepartitionExec>(),
                input.downcast_ref::<CoalescePartitionsExec>(),
            ) {
                (Some(r), _) => r.input().clone(),
                (None, Some(c)) => c.input().clone(),
                (None, None) => break,
            };
            input = next;
        }
        let keys = key_exprs(&self.keys, &input.schema())?;
        let shuffle = RepartitionExec::try_new(input, Partitioning::Hash(keys, self.parts.max(1)))?;
        Ok(Self::new(
            self.job.clone(),
            self.keys.clone(),
            self.parts,
            Arc::new(shuffle),
        ))
    }
}

/// The key columns `keys` of `schema` as physical expressions.
fn key_exprs(
    keys: &[String],
    schema: &SchemaRef,
) -> deltalake::datafusion::common::Result<Vec<Arc<dyn PhysicalExpr>>> {
    keys.iter()
        .map(|k| deltalake::datafusion::physical_expr::expressions::col(k, schema))
        .collect()
}

impl DisplayAs for FoldWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "StrataFoldWriteExec: keys=[{}]", self.keys.join(", "))
    }
}

impl ExecutionPlan for FoldWriteExec {
    fn name(&self) -> &str {
        "StrataFoldWriteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        match key_exprs(&self.keys, &self.input.schema()) {
            Ok(keys) => vec![Distribution::KeyPartitioned(keys)],
            Err(_) => vec![Distribution::UnspecifiedDistribution],
        }
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(
            &Arc<dyn PhysicalExpr>,
        ) -> deltalake::datafusion::common::Result<TreeNodeRecursion>,
    ) -> deltalake::datafusion::common::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> deltalake::datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Plan("StrataFoldWriteExec has one input".to_string())
        })?;
        Ok(Arc::new(Self::new(
            self.job.clone(),
            self.keys.clone(),
            self.parts,
            input,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> deltalake::datafusion::common::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let job = self.job.clone();
        let work = async move {
            let job: FoldJob = serde_json::from_str(&job).map_err(|e| {
                DataFusionError::Internal(format!("decoding a strata cluster job: {e}"))
            })?;
            let batches: Vec<RecordBatch> = input.try_collect().await?;
            run_part(job, batches).await.map_err(to_task_error)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            result_schema(),
            futures::stream::once(work),
        )))
    }
}

/// One partition's result row: a first load's part ([`FoldJob::load_part`]) or a batch's
/// (`batch.rs`), over the partition's non-empty input batches.
async fn run_part(job: FoldJob, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    let split_schema = without_run(&job.setup);
    let batches = batches
        .iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| crate::util::arrow::cast_batch(b, &split_schema))
        .collect::<Result<Vec<_>>>()?;
    let result = match (batches.is_empty(), job.stored_at) {
        (true, _) => PartResult::empty(),
        (false, Some(version)) => super::batch::run_part(&job, version, batches).await?,
        (false, None) => job.load_part(batches).await?,
    };
    result.to_row()
}

/// Where a task's rejection of its input starts and ends in the text of a failed job: the
/// cluster hands a task's error back as text, and the coordinator finds the rejection in it
/// ([`rejected_input`]).
const REJECTED: (&str, &str) = ("[strata rejected the input: ", " :strata]");

/// A task's error as the cluster carries it: a rejected input (a conflicting tie, a NULL
/// in a NOT NULL column) marked so that the coordinator reports it as one.
fn to_task_error(e: EngineError) -> DataFusionError {
    match e {
        EngineError::BadInput(msg) => {
            DataFusionError::Execution(format!("{}{msg}{}", REJECTED.0, REJECTED.1))
        }
        other => DataFusionError::External(Box::new(other)),
    }
}

/// The input rejection a failed job's error text `text` carries, if any.
pub(crate) fn rejected_input(text: &str) -> Option<String> {
    let start = text.find(REJECTED.0)? + REJECTED.0.len();
    let len = text[start..].find(REJECTED.1)?;
    Some(text[start..start + len].to_string())
}

/// Whether a failed job's error text `text` says a task could not read or write the
/// object store (a task's error reaches the coordinator as text, through the scheduler).
pub(crate) fn store_failure(text: &str) -> bool {
    text.contains("Object Store error") || text.contains("ObjectStore error")
}

/// Plans [`FoldWriteNode`] as [`FoldWriteExec`].
#[derive(Debug, Default)]
struct FoldWritePlanner;

#[async_trait::async_trait]
impl ExtensionPlanner for FoldWritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning: &PhysicalPlanningContext,
    ) -> deltalake::datafusion::common::Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<FoldWriteNode>() else {
            return Ok(None);
        };
        let input = physical_inputs
            .first()
            .cloned()
            .ok_or_else(|| DataFusionError::Plan("StrataFoldWrite has one input".to_string()))?;
        Ok(Some(Arc::new(FoldWriteExec::new(
            node.job.clone(),
            node.keys.clone(),
            node.parts,
            input,
        ))))
    }
}

/// The query planner of a session that plans strata's cluster nodes (a scheduler's).
#[derive(Debug, Default)]
pub struct StrataQueryPlanner;

#[async_trait::async_trait]
impl QueryPlanner for StrataQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> deltalake::datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(FoldWritePlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// Puts the shuffle by key into `parts` partitions under every [`FoldWriteExec`], after
/// DataFusion's own rules: they drop a repartition whose input has one partition (one
/// partition holds every key), which would fold a single-file load in one task.
#[derive(Debug, Default)]
pub struct ShuffleByKey;

impl deltalake::datafusion::physical_optimizer::PhysicalOptimizerRule for ShuffleByKey {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &deltalake::datafusion::config::ConfigOptions,
    ) -> deltalake::datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        use deltalake::datafusion::common::tree_node::{Transformed, TreeNode};
        plan.transform_up(|node| match node.downcast_ref::<FoldWriteExec>() {
            Some(fold) => Ok(Transformed::yes(
                Arc::new(fold.shuffled()?) as Arc<dyn ExecutionPlan>
            )),
            None => Ok(Transformed::no(node)),
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "strata_shuffle_by_key"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_input_is_found_in_a_failed_jobs_text() {
        let msg = "flow f: two different upserts for key (id=5) at the same sequence value 10";
        let carried = format!(
            "Job 1 failed: Task failed: DataFusionError(Shared({}))",
            to_task_error(EngineError::BadInput(msg.into()))
        );
        assert_eq!(rejected_input(&carried).as_deref(), Some(msg));
        assert_eq!(rejected_input("Job 1 failed: executor lost"), None);
    }

    #[test]
    fn an_object_store_failure_is_told_from_other_job_failures() {
        assert!(store_failure(
            "Job 1 failed: DataFusion error: Object Store error: The operation lacked the \
             necessary privileges to complete for path wh/default/raw/part-0.parquet"
        ));
        assert!(!store_failure("Job 1 failed: executor lost"));
    }
}
