//! The event log: one record per dataset or flow per run, appended to a Delta table in the
//! warehouse (`<warehouse>/_strata/event_log`), queryable as `event_log` with `strata query`
//! and shown by `strata events`.
//!
//! A record is appended as soon as its node finishes (or fails), in its own commit, so the
//! log of an interrupted run shows how far it got. The log is strata's own bookkeeping: a
//! failure to write it fails the run, as a run whose outcome cannot be recorded should not
//! pass silently.

use crate::error::{Context, EngineError, Result};
use crate::sql::expect::ExpectationCount;
use crate::storage::commit::PendingCommit;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{write_rows, RowChange};
use deltalake::arrow::array::{
    ArrayRef, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    TimestampMicrosecondArray,
};
use deltalake::arrow::buffer::OffsetBuffer;
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{FlowKind, Node, PipelinePlan};

pub use crate::storage::warehouse::EVENT_LOG_TABLE;

/// How a node's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Completed,
    /// Nothing new to do.
    Skipped,
    Failed,
    /// A run (kind `update`) failed transiently and starts again.
    Retrying,
    /// Something went wrong that does not change the run's outcome (kind `notification`:
    /// a notification that could not be delivered).
    Warning,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "COMPLETED",
            Status::Skipped => "SKIPPED",
            Status::Failed => "FAILED",
            Status::Retrying => "RETRYING",
            Status::Warning => "WARNING",
        }
    }
}

/// One record of the event log. Counts that do not apply to a kind of node are 0.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub run_id: String,
    pub pipeline: String,
    /// The dataset written, qualified (`default.users`).
    pub dataset: String,
    /// The flow's name; for a streaming table's own query, a materialized view or a
    /// point-in-time table, the table's name.
    pub flow: String,
    /// `ingest`, `append`, `cdc`, `snapshot`, `materialized_view`, `point_in_time`; for the
    /// run as a whole (retries, its outcome) `update`; `notification` for a notification
    /// that could not be delivered.
    pub kind: &'static str,
    pub status: Status,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub ended_at: chrono::DateTime<chrono::Utc>,
    pub rows_read: usize,
    pub rows_written: usize,
    pub rows_upserted: usize,
    pub rows_deleted: usize,
    pub versions_opened: usize,
    pub versions_closed: usize,
    pub rows_dropped: usize,
    pub expectations: Vec<ExpectationCount>,
    pub message: Option<String>,
    pub error: Option<String>,
}

impl EventRecord {
    /// The record of plan node `node` (its table, flow and kind), started at `started`,
    /// with every count at 0.
    pub(crate) fn for_node(
        run_id: &str,
        pipeline: &str,
        plan: &PipelinePlan,
        node: &Node,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        EventRecord::new(
            run_id,
            pipeline,
            plan.writes(node).map(|t| t.to_string()).unwrap_or_default(),
            node_flow_name(plan, node),
            node_kind(plan, node),
            started,
        )
    }

    /// A record with every count at 0.
    pub(crate) fn new(
        run_id: &str,
        pipeline: &str,
        dataset: String,
        flow: String,
        kind: &'static str,
        started_at: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        EventRecord {
            run_id: run_id.to_string(),
            pipeline: pipeline.to_string(),
            dataset,
            flow,
            kind,
            status: Status::Completed,
            started_at,
            ended_at: started_at,
            rows_read: 0,
            rows_written: 0,
            rows_upserted: 0,
            rows_deleted: 0,
            versions_opened: 0,
            versions_closed: 0,
            rows_dropped: 0,
            expectations: Vec::new(),
            message: None,
            error: None,
        }
    }
}

fn expectation_fields() -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, true),
        Field::new("action", DataType::Utf8, true),
        Field::new("passed", DataType::Int64, true),
        Field::new("failed", DataType::Int64, true),
    ])
}

fn schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let count = |n: &str| Field::new(n, DataType::Int64, true);
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, true),
        Field::new("pipeline", DataType::Utf8, true),
        Field::new("dataset", DataType::Utf8, true),
        Field::new("flow", DataType::Utf8, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("started_at", ts.clone(), true),
        Field::new("ended_at", ts, true),
        count("duration_ms"),
        count("rows_read"),
        count("rows_written"),
        count("rows_upserted"),
        count("rows_deleted"),
        count("versions_opened"),
        count("versions_closed"),
        count("rows_dropped"),
        Field::new(
            "expectations",
            DataType::List(Arc::new(Field::new(
                "element",
                DataType::Struct(expectation_fields()),
                true,
            ))),
            true,
        ),
        Field::new("message", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
    ]))
}

pub(crate) fn to_batch(records: &[EventRecord]) -> Result<RecordBatch> {
    let strings = |f: &dyn Fn(&EventRecord) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from(records.iter().map(f).collect::<Vec<_>>()))
    };
    let counts = |f: &dyn Fn(&EventRecord) -> usize| -> ArrayRef {
        Arc::new(Int64Array::from(
            records.iter().map(|r| f(r) as i64).collect::<Vec<_>>(),
        ))
    };
    let times = |f: &dyn Fn(&EventRecord) -> chrono::DateTime<chrono::Utc>| -> ArrayRef {
        Arc::new(
            TimestampMicrosecondArray::from(
                records
                    .iter()
                    .map(|r| f(r).timestamp_micros())
                    .collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        )
    };
    let all: Vec<&ExpectationCount> = records.iter().flat_map(|r| &r.expectations).collect();
    let values = StructArray::try_new(
        expectation_fields(),
        vec![
            Arc::new(StringArray::from(
                all.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                all.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                all.iter().map(|e| e.passed as i64).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                all.iter().map(|e| e.failed as i64).collect::<Vec<_>>(),
            )),
        ],
        None,
    )
    .context(|| "event log expectations".into())?;
    let list = ListArray::try_new(
        Arc::new(Field::new(
            "element",
            DataType::Struct(expectation_fields()),
            true,
        )),
        OffsetBuffer::from_lengths(records.iter().map(|r| r.expectations.len())),
        Arc::new(values),
        None,
    )
    .context(|| "event log expectations".into())?;
    RecordBatch::try_new(
        schema(),
        vec![
            strings(&|r| Some(r.run_id.clone())),
            strings(&|r| Some(r.pipeline.clone())),
            strings(&|r| Some(r.dataset.clone())),
            strings(&|r| Some(r.flow.clone())),
            strings(&|r| Some(r.kind.to_string())),
            strings(&|r| Some(r.status.as_str().to_string())),
            times(&|r| r.started_at),
            times(&|r| r.ended_at),
            counts(&|r| (r.ended_at - r.started_at).num_milliseconds().max(0) as usize),
            counts(&|r| r.rows_read),
            counts(&|r| r.rows_written),
            counts(&|r| r.rows_upserted),
            counts(&|r| r.rows_deleted),
            counts(&|r| r.versions_opened),
            counts(&|r| r.versions_closed),
            counts(&|r| r.rows_dropped),
            Arc::new(list),
            strings(&|r| r.message.clone()),
            strings(&|r| r.error.clone()),
        ],
    )
    .context(|| "event log record".into())
}

/// How many times an append that lost a race is tried again on the log as it now is.
const APPEND_ATTEMPTS: usize = 5;

/// Appends `batch` to the event log `table` (at `path`). A commit that conflicts with one
/// another run made at the same moment (the log's first commits, made by runs started
/// together, can carry table metadata, which Delta's conflict check does not let an
/// append pass) committed nothing: the log is read again and the append tried again.
async fn append_retrying(
    mut table: DeltaTable,
    batch: RecordBatch,
    path: &crate::storage::location::Location,
) -> Result<DeltaTable> {
    let mut attempt = 1;
    loop {
        match write_rows(
            table.clone(),
            vec![batch.clone()],
            RowChange::Append,
            &PendingCommit::default(),
        )
        .await
        {
            Ok(t) => return Ok(t),
            Err(e) if crate::error::is_conflict(&e) && attempt < APPEND_ATTEMPTS => {
                tracing::debug!("event log: append attempt {attempt} lost a race ({e}); again");
                attempt += 1;
                table.update_state().await.map_err(|e| EngineError::Delta {
                    context: format!("reading the event log at {path}"),
                    source: Box::new(e),
                })?;
            }
            Err(e) => {
                return Err(EngineError::Delta {
                    context: format!("writing the event log at {path}"),
                    source: Box::new(e),
                })
            }
        }
    }
}

/// Appends `records` to the event log of `wh` in one commit. The table is opened once per
/// process and kept as each commit leaves it (a commit made elsewhere in between is an
/// append too, which Delta's conflict check lets through).
pub(crate) async fn append(wh: &Warehouse, records: &[EventRecord]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let steps = crate::util::steps::Steps::new("event_log", "event log: ");
    let batch = to_batch(records)?;
    let path = wh.event_log_location();
    // The kept handle only while its log is still there (someone may have removed the event
    // log between two runs of a long-lived process: then it is opened or created afresh).
    let kept = wh.take_event_log();
    let kept = match kept {
        Some(t) if path.has_delta_log().await? => Some(t),
        _ => None,
    };
    let table = match kept {
        Some(t) => t,
        None => match crate::storage::table::open_delta(&path).await? {
            Some(t) => t,
            None => match crate::storage::table::create_delta(
                &path,
                EVENT_LOG_TABLE,
                &schema(),
                // A checkpoint every 10 commits, as for every table strata creates.
                vec![],
                Some("strata's event log: one record per dataset or flow per run"),
                Vec::new(),
            )
            .await
            {
                Ok(t) => t,
                // Another run created it at the same moment: append to that one.
                Err(e) if e.is_conflict() => {
                    crate::storage::table::open_delta(&path).await?.ok_or(e)?
                }
                Err(e) => return Err(e),
            },
        },
    };
    crate::util::steps::step!(debug, steps, "opened");
    let table = append_retrying(table, batch, &path).await?;
    crate::util::steps::step!(debug, steps, "appended");
    wh.keep_event_log(table);
    Ok(())
}

/// The event log's `kind` of a node.
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

/// The event log's `flow` of a node: the flow's name, else the table's.
fn node_flow_name(plan: &PipelinePlan, node: &Node) -> String {
    match node {
        Node::Flow(i) => plan.flows.get(*i).map(|f| f.name.clone()),
        Node::Append(i) => plan.appends.get(*i).map(|f| f.name.clone()),
        other => plan.writes(other).map(|t| t.name),
    }
    .unwrap_or_default()
}
