//! What a notification says, as plain values: which alert of an entry fires for a run's
//! outcome, the event-log record as JSON (the shape `strata events --format json` prints),
//! and an e-mail's subject and body. No I/O here.

use crate::load::settings::Alert;
use crate::runtime::event_log::{EventRecord, Status};
use serde::Serialize;

/// How a run ended, as notifications see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) failed: bool,
    /// The failure is one no retry could help (see [`crate::EngineError::is_transient`]).
    pub(crate) fatal: bool,
    /// A flow (or a dataset's own query) failed, rather than the run before any flow ran.
    pub(crate) flow_failed: bool,
}

/// The alert of `alerts` that fires for `outcome`, if any: one per entry and outcome, the
/// most specific asked for (a flow's failure, then a fatal failure, then any failure).
pub(crate) fn alert_for(alerts: &[Alert], outcome: Outcome) -> Option<Alert> {
    let asked = |a: Alert| alerts.contains(&a).then_some(a);
    if !outcome.failed {
        return asked(Alert::UpdateSuccess);
    }
    outcome
        .flow_failed
        .then(|| asked(Alert::FlowFailure))
        .flatten()
        .or_else(|| {
            outcome
                .fatal
                .then(|| asked(Alert::UpdateFatalFailure))
                .flatten()
        })
        .or_else(|| asked(Alert::UpdateFailure))
}

/// An event-log record as `strata events --format json` prints it (same keys, same order,
/// `started` in RFC 3339 with the stored microseconds).
#[derive(Debug, Serialize)]
pub(crate) struct RecordJson<'a> {
    run_id: &'a str,
    pipeline: &'a str,
    started: String,
    flow: &'a str,
    kind: &'a str,
    dataset: &'a str,
    status: &'a str,
    duration_ms: i64,
    rows_read: usize,
    rows_written: usize,
    rows_upserted: usize,
    rows_deleted: usize,
    versions_opened: usize,
    versions_closed: usize,
    rows_dropped: usize,
    message: Option<&'a str>,
    error: Option<&'a str>,
    expectations: Vec<ExpectationJson<'a>>,
}

#[derive(Debug, Serialize)]
struct ExpectationJson<'a> {
    name: &'a str,
    action: &'a str,
    passed: usize,
    failed: usize,
}

impl<'a> RecordJson<'a> {
    pub(crate) fn of(r: &'a EventRecord) -> Self {
        RecordJson {
            run_id: &r.run_id,
            pipeline: &r.pipeline,
            started: stored_time(r.started_at),
            flow: &r.flow,
            kind: r.kind,
            dataset: &r.dataset,
            status: r.status.as_str(),
            duration_ms: (r.ended_at - r.started_at).num_milliseconds().max(0),
            rows_read: r.rows_read,
            rows_written: r.rows_written,
            rows_upserted: r.rows_upserted,
            rows_deleted: r.rows_deleted,
            versions_opened: r.versions_opened,
            versions_closed: r.versions_closed,
            rows_dropped: r.rows_dropped,
            message: r.message.as_deref(),
            error: r.error.as_deref(),
            expectations: r
                .expectations
                .iter()
                .map(|e| ExpectationJson {
                    name: &e.name,
                    action: e.action.as_str(),
                    passed: e.passed,
                    failed: e.failed,
                })
                .collect(),
        }
    }

    pub(crate) fn to_text(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A time as the event log stores it (microseconds) and prints it (RFC 3339, UTC, `Z`).
fn stored_time(t: chrono::DateTime<chrono::Utc>) -> String {
    chrono::DateTime::from_timestamp_micros(t.timestamp_micros())
        .unwrap_or(t)
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// An e-mail's subject and plain-text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Email {
    pub(crate) subject: String,
    pub(crate) body: String,
}

/// The e-mail for `alert` about the run `record` (its `update` record) of the pipeline
/// called `name`: the subject names the pipeline, the run and its status; the body the
/// error and where it happened, then the record itself.
pub(crate) fn email(name: &str, alert: Alert, record: &EventRecord) -> Email {
    let status = match record.status {
        Status::Completed | Status::Skipped => "completed",
        _ => "FAILED",
    };
    let at = place(record);
    let subject = match &at {
        Some(at) if record.status == Status::Failed => {
            format!("[strata] {name}: run {} FAILED at {at}", record.run_id)
        }
        _ => format!("[strata] {name}: run {} {status}", record.run_id),
    };
    let mut body = format!(
        "Pipeline: {name} ({})\nRun:      {}\nStatus:   {}\nAlert:    {}\n",
        record.pipeline,
        record.run_id,
        record.status.as_str(),
        alert.as_str()
    );
    if let Some(at) = &at {
        body.push_str(&format!("Where:    {at}\n"));
    }
    if let Some(m) = &record.message {
        body.push_str(&format!("Outcome:  {m}\n"));
    }
    if let Some(e) = &record.error {
        body.push_str(&format!("\nError:\n{e}\n"));
    }
    body.push_str(&format!(
        "\nStarted {}, ended {} ({} ms).\n\nThe event-log record (strata events --format json):\n{}\n",
        stored_time(record.started_at),
        stored_time(record.ended_at),
        (record.ended_at - record.started_at).num_milliseconds().max(0),
        RecordJson::of(record).to_text()
    ));
    Email { subject, body }
}

/// `flow users_flow (into default.users)`, when the record names a flow.
fn place(record: &EventRecord) -> Option<String> {
    match (record.flow.is_empty(), record.dataset.is_empty()) {
        (true, true) => None,
        (false, true) => Some(format!("flow {}", record.flow)),
        (true, false) => Some(format!("dataset {}", record.dataset)),
        (false, false) => Some(format!("flow {} (into {})", record.flow, record.dataset)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn record(status: Status) -> EventRecord {
        let t = chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 8, 0, 0)
            .single()
            .unwrap();
        let mut r = EventRecord::new(
            "20261130T080000.000001Z-00000001",
            "pipelines/shop.sql",
            "default.users".into(),
            "users_flow".into(),
            "update",
            t + chrono::Duration::microseconds(1_500),
        );
        r.ended_at = r.started_at + chrono::Duration::milliseconds(250);
        r.status = status;
        r
    }

    const FAILURE: Outcome = Outcome {
        failed: true,
        fatal: true,
        flow_failed: true,
    };

    #[test]
    fn one_alert_per_entry_the_most_specific() {
        use Alert::*;
        assert_eq!(
            alert_for(&[UpdateFailure, FlowFailure], FAILURE),
            Some(FlowFailure)
        );
        assert_eq!(
            alert_for(&[UpdateFailure, UpdateFatalFailure], FAILURE),
            Some(UpdateFatalFailure)
        );
        let transient = Outcome {
            fatal: false,
            flow_failed: false,
            ..FAILURE
        };
        assert_eq!(
            alert_for(&[UpdateFatalFailure, FlowFailure], transient),
            None
        );
        assert_eq!(alert_for(&[UpdateFailure], transient), Some(UpdateFailure));
        let success = Outcome {
            failed: false,
            fatal: false,
            flow_failed: false,
        };
        assert_eq!(alert_for(&[UpdateFailure, FlowFailure], success), None);
        assert_eq!(alert_for(&[UpdateSuccess], success), Some(UpdateSuccess));
    }

    #[test]
    fn the_record_as_events_prints_it() {
        let mut r = record(Status::Failed);
        r.error = Some("flow users_flow: conflicting tie".into());
        let json: serde_json::Value = serde_json::from_str(&RecordJson::of(&r).to_text()).unwrap();
        assert_eq!(json["started"], "2026-11-30T08:00:00.001500Z");
        assert_eq!(json["status"], "FAILED");
        assert_eq!(json["kind"], "update");
        assert_eq!(json["duration_ms"], 250);
        assert_eq!(json["message"], serde_json::Value::Null);
        assert_eq!(json["expectations"], serde_json::json!([]));
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 18);
    }

    #[test]
    fn the_email_names_pipeline_run_status_error_and_place() {
        let mut r = record(Status::Failed);
        r.message = Some("not retried: a data error".into());
        r.error = Some("flow users_flow: conflicting tie at key (1)".into());
        let e = email("shop", Alert::FlowFailure, &r);
        assert_eq!(
            e.subject,
            "[strata] shop: run 20261130T080000.000001Z-00000001 FAILED at flow users_flow \
             (into default.users)"
        );
        assert!(e
            .body
            .contains("Error:\nflow users_flow: conflicting tie at key (1)\n"));
        assert!(e
            .body
            .contains("Where:    flow users_flow (into default.users)\n"));
        assert!(e.body.contains("Alert:    on-flow-failure\n"));
        let ok = email("shop", Alert::UpdateSuccess, &record(Status::Completed));
        assert_eq!(
            ok.subject,
            "[strata] shop: run 20261130T080000.000001Z-00000001 completed"
        );
    }
}
