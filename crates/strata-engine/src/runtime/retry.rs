//! Starting a node again: when it lost a race with another writer (its commit conflicted),
//! with the error of a node that kept losing; and when it failed transiently, up to
//! `pipelines.maxFlowRetryAttempts` times ([`FlowRetry`]), each failed attempt recorded.

use crate::error::EngineError;
use crate::load::settings::FlowRetries;
use crate::runtime::event_log::{self, EventRecord, Status};
use crate::runtime::options::RunOptions;
use crate::runtime::update::{stop_requested, wait};
use crate::storage::warehouse::Warehouse;
use strata_sql::{Node, PipelinePlan, TableName};

/// How many times a node that keeps losing races with other writers is tried.
pub(crate) const CONFLICT_ATTEMPTS: u32 = 6;

/// The pause before try `attempt + 1` of a node that lost a race: doubling from 50 ms, with
/// a jitter so that writers that collided do not collide again in step.
pub(crate) fn conflict_backoff(attempt: u32) -> std::time::Duration {
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
pub(crate) async fn gave_up(
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
                        crate::storage::table::version_of(&handle),
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

/// What a flow's retry needs to record itself: the run, its options (a stop request ends
/// the pause) and the pipeline's [`FlowRetries`].
pub(crate) struct FlowRetry<'a> {
    pub(crate) wh: &'a Warehouse,
    pub(crate) options: &'a RunOptions,
    pub(crate) run_id: &'a str,
    /// The pipeline file, as the event log names it.
    pub(crate) pipeline: &'a str,
    pub(crate) policy: FlowRetries,
}

impl FlowRetry<'_> {
    /// The record of node `node`'s attempt, started at `started`, for the event log.
    pub(crate) fn record(
        &self,
        plan: &PipelinePlan,
        node: &Node,
        started: chrono::DateTime<chrono::Utc>,
    ) -> EventRecord {
        EventRecord::for_node(self.run_id, self.pipeline, plan, node, started)
    }

    /// After attempt `attempt` (1-based) of a flow failed with `e`: whether to try it
    /// again. When so, the failed attempt is recorded (`record`, as a `RETRYING` record
    /// with its error, in the event log and as a warning) and the pause waited; a run asked
    /// to stop meanwhile is not retried.
    pub(crate) async fn again(&self, attempt: u32, e: &EngineError, record: EventRecord) -> bool {
        if !self.policy.retries_after(attempt, e) || stop_requested(self.options) {
            return false;
        }
        let pause = self.policy.pause_after(attempt);
        let message = self.policy.message(attempt, pause);
        tracing::warn!(
            "{} {}: {message}: {}",
            record.kind,
            record.flow,
            crate::error::chain(e)
        );
        let mut r = record;
        r.status = Status::Retrying;
        r.ended_at = chrono::Utc::now();
        r.error = Some(crate::error::chain(e));
        r.message = Some(message);
        if let Err(log) = event_log::append(self.wh, std::slice::from_ref(&r)).await {
            tracing::warn!("could not record the retry: {}", crate::error::chain(&log));
        }
        wait(pause, self.options).await
    }
}
