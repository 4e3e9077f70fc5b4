//! Reading the event log back: the records of the last runs (for `strata events` and the
//! web page of `strata serve --http`), as Arrow batches and as typed records.

use crate::error::{EngineError, Result};
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::array::{
    Array, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
};
use deltalake::arrow::datatypes::{DataType, SchemaRef};

/// One record of the event log as read back (see `EventRecord` for what each field means).
/// Text fields the log holds as null are `None`; counts it holds as null are 0.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct LoggedEvent {
    pub run_id: String,
    pub pipeline: String,
    /// When the record's node started, as text (`2026-12-05T10:00:00.123456Z`).
    pub started: String,
    pub flow: String,
    pub kind: String,
    pub dataset: String,
    pub status: String,
    pub duration_ms: i64,
    pub rows_read: i64,
    pub rows_written: i64,
    pub rows_upserted: i64,
    pub rows_deleted: i64,
    pub versions_opened: i64,
    pub versions_closed: i64,
    pub rows_dropped: i64,
    pub message: Option<String>,
    pub error: Option<String>,
    pub expectations: Vec<LoggedExpectation>,
}

impl LoggedEvent {
    /// A record of the run as a whole (`update`: a retry or the outcome; `notification`),
    /// not of one dataset.
    pub fn is_run_record(&self) -> bool {
        self.kind == "update" || self.kind == "notification"
    }
}

/// One expectation's counts in one record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoggedExpectation {
    pub name: String,
    /// `warn`, `drop`, `fail`.
    pub action: String,
    pub passed: i64,
    pub failed: i64,
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The records of the last `last` runs (only `flow`'s records, if given), oldest run first;
/// `None` when nothing was recorded yet. A run's records come in the order things happened:
/// datasets and flows as they started, the run's own (`update`: a retry, the outcome;
/// `notification`) as they ended.
pub async fn read_events(
    wh: &Warehouse,
    last: usize,
    flow: Option<&str>,
) -> Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
    if !wh.event_log_location().has_delta_log().await? {
        return Ok(None);
    }
    let filter = flow
        .map(|f| format!("WHERE flow = {}", quote(f)))
        .unwrap_or_default();
    let sql = format!(
        "WITH runs AS (SELECT run_id, min(started_at) AS run_start FROM event_log {filter} \
           GROUP BY run_id ORDER BY run_start DESC LIMIT {last}) \
         SELECT e.run_id, e.pipeline, CAST(e.started_at AS VARCHAR) AS started, e.flow, e.kind, \
           e.dataset, e.status, e.duration_ms, e.rows_read, e.rows_written, e.rows_upserted, \
           e.rows_deleted, e.versions_opened, e.versions_closed, e.rows_dropped, \
           e.message, e.error, e.expectations \
         FROM event_log e JOIN runs r ON e.run_id = r.run_id {} \
         ORDER BY r.run_start, \
           CASE WHEN e.kind IN ('update', 'notification') THEN e.ended_at ELSE e.started_at END, \
           e.ended_at",
        flow.map(|f| format!("WHERE e.flow = {}", quote(f)))
            .unwrap_or_default()
    );
    Ok(Some(crate::sql::query::query(wh, &sql).await?))
}

/// The event log's Delta version: it changes with every record a run appends (`None`:
/// no run recorded yet).
pub async fn event_log_version(wh: &Warehouse) -> Result<Option<i64>> {
    Ok(crate::storage::table::open_delta(&wh.event_log_location())
        .await?
        .map(|t| crate::storage::table::version_of(&t)))
}

/// The typed records of batches [`read_events`] returned, in their order.
pub fn logged_events(batches: &[RecordBatch]) -> Result<Vec<LoggedEvent>> {
    let mut out = Vec::new();
    for batch in batches {
        let text = |name: &str| text_column(batch, name);
        let count = |name: &str| count_column(batch, name);
        let (run_id, pipeline, started, flow, kind, dataset, status) = (
            text("run_id")?,
            text("pipeline")?,
            text("started")?,
            text("flow")?,
            text("kind")?,
            text("dataset")?,
            text("status")?,
        );
        let (message, error) = (text("message")?, text("error")?);
        let counts = [
            count("duration_ms")?,
            count("rows_read")?,
            count("rows_written")?,
            count("rows_upserted")?,
            count("rows_deleted")?,
            count("versions_opened")?,
            count("versions_closed")?,
            count("rows_dropped")?,
        ];
        let expectations = batch
            .column_by_name("expectations")
            .and_then(|c| c.as_any().downcast_ref::<ListArray>());
        for i in 0..batch.num_rows() {
            let s = |a: &StringArray| a.is_valid(i).then(|| a.value(i).to_string());
            let n = |a: &Int64Array| if a.is_valid(i) { a.value(i) } else { 0 };
            out.push(LoggedEvent {
                run_id: s(&run_id).unwrap_or_default(),
                pipeline: s(&pipeline).unwrap_or_default(),
                started: s(&started).unwrap_or_default(),
                flow: s(&flow).unwrap_or_default(),
                kind: s(&kind).unwrap_or_default(),
                dataset: s(&dataset).unwrap_or_default(),
                status: s(&status).unwrap_or_default(),
                duration_ms: n(&counts[0]),
                rows_read: n(&counts[1]),
                rows_written: n(&counts[2]),
                rows_upserted: n(&counts[3]),
                rows_deleted: n(&counts[4]),
                versions_opened: n(&counts[5]),
                versions_closed: n(&counts[6]),
                rows_dropped: n(&counts[7]),
                message: s(&message),
                error: s(&error),
                expectations: expectations
                    .map(|list| expectations_of(list, i))
                    .transpose()?
                    .unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// A text column by name (strings may come back as `Utf8View` from Parquet: read as plain
/// strings); an all-null column when the batch has none.
fn text_column(batch: &RecordBatch, name: &str) -> Result<StringArray> {
    let Some(column) = batch.column_by_name(name) else {
        return Ok(StringArray::new_null(batch.num_rows()));
    };
    let cast = deltalake::arrow::compute::cast(column, &DataType::Utf8)
        .map_err(|e| EngineError::internal(format!("event log column {name}: {e}")))?;
    cast.as_any()
        .downcast_ref::<StringArray>()
        .cloned()
        .ok_or_else(|| EngineError::internal(format!("event log column {name} is not text")))
}

/// A count column by name; all null when the batch has none.
fn count_column(batch: &RecordBatch, name: &str) -> Result<Int64Array> {
    let Some(column) = batch.column_by_name(name) else {
        return Ok(Int64Array::new_null(batch.num_rows()));
    };
    let cast = deltalake::arrow::compute::cast(column, &DataType::Int64)
        .map_err(|e| EngineError::internal(format!("event log column {name}: {e}")))?;
    cast.as_any()
        .downcast_ref::<Int64Array>()
        .cloned()
        .ok_or_else(|| EngineError::internal(format!("event log column {name} is not a count")))
}

/// The expectations of row `i`.
fn expectations_of(list: &ListArray, i: usize) -> Result<Vec<LoggedExpectation>> {
    if list.is_null(i) {
        return Ok(Vec::new());
    }
    let values = list.value(i);
    let Some(s) = values.as_any().downcast_ref::<StructArray>() else {
        return Err(EngineError::internal(
            "event log expectations are not a list of structs",
        ));
    };
    let as_batch = RecordBatch::from(s.clone());
    let (names, actions) = (
        text_column(&as_batch, "name")?,
        text_column(&as_batch, "action")?,
    );
    let (passed, failed) = (
        count_column(&as_batch, "passed")?,
        count_column(&as_batch, "failed")?,
    );
    Ok((0..s.len())
        .map(|j| LoggedExpectation {
            name: names.value(j).to_string(),
            action: actions.value(j).to_string(),
            passed: passed.value(j),
            failed: failed.value(j),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::event_log::{EventRecord, Status};
    use crate::sql::expect::ExpectationCount;

    #[test]
    fn records_read_back_as_they_were_written() {
        let started = chrono::DateTime::parse_from_rfc3339("2026-12-05T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let mut r = EventRecord::new(
            "run-1",
            "p.sql",
            "default.users".into(),
            "users_flow".into(),
            "cdc",
            started,
        );
        r.ended_at = started + chrono::Duration::milliseconds(1500);
        r.rows_read = 7;
        r.rows_upserted = 5;
        r.versions_opened = 6;
        r.versions_closed = 2;
        r.status = Status::Failed;
        r.error = Some("flow users_flow: boom".into());
        r.expectations = vec![ExpectationCount {
            name: "valid_id".into(),
            action: strata_sql::ExpectAction::Drop,
            passed: 6,
            failed: 1,
        }];
        let update = EventRecord::new(
            "run-1",
            "p.sql",
            String::new(),
            String::new(),
            "update",
            started,
        );
        let batch = crate::runtime::event_log::to_batch(&[r, update]).unwrap();
        let events = logged_events(&[batch]).unwrap();
        assert_eq!(events.len(), 2);
        let e = &events[0];
        assert_eq!(
            (
                e.run_id.as_str(),
                e.dataset.as_str(),
                e.flow.as_str(),
                e.kind.as_str()
            ),
            ("run-1", "default.users", "users_flow", "cdc")
        );
        assert_eq!(e.status, "FAILED");
        assert_eq!(e.duration_ms, 1500);
        assert_eq!(
            (
                e.rows_read,
                e.rows_written,
                e.rows_upserted,
                e.versions_opened,
                e.versions_closed
            ),
            (7, 0, 5, 6, 2)
        );
        assert_eq!(e.error.as_deref(), Some("flow users_flow: boom"));
        assert_eq!(e.message, None);
        assert_eq!(
            e.expectations,
            vec![LoggedExpectation {
                name: "valid_id".into(),
                action: "drop".into(),
                passed: 6,
                failed: 1
            }]
        );
        assert!(!e.is_run_record());
        assert!(events[1].is_run_record());
        assert!(events[1].expectations.is_empty());
    }
}
