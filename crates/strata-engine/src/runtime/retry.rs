//! Starting a node again when it lost a race with another writer (its commit conflicted),
//! and the error of a node that kept losing.

use crate::error::EngineError;
use crate::storage::warehouse::Warehouse;
use strata_sql::TableName;

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
