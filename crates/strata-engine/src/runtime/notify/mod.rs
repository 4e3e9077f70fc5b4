//! Telling someone how a run ended: for each notification entry whose alerts match the
//! outcome, the run's `update` record is POSTed as JSON to its webhook and e-mailed to its
//! recipients ([`message`] decides what is said, [`smtp`] sends the e-mail).
//!
//! A notification that cannot be delivered is a `WARNING` record (kind `notification`) in
//! the event log and a warning on stderr; it never changes the run's outcome. A webhook's
//! URL is never printed whole (it often holds a token): messages name its host.

pub(crate) mod message;
mod smtp;

use crate::load::settings::{Alert, Notification, Smtp, UpdateSettings};
use crate::runtime::event_log::{self, EventRecord, Status};
use crate::runtime::notify::message::{Outcome, RecordJson};
use crate::storage::warehouse::Warehouse;
use std::time::Duration;
use strata_sources::Secret;

/// The longest a webhook's POST may take.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends what `settings` asks for about `record` (the run's `update` record) of the
/// pipeline called `name`, and records each notification that could not be delivered.
pub(crate) async fn notify(
    wh: &Warehouse,
    settings: &UpdateSettings,
    name: &str,
    record: &EventRecord,
    outcome: Outcome,
) {
    let mut warnings = Vec::new();
    for n in &settings.notifications {
        let Some(alert) = message::alert_for(&n.alerts, outcome) else {
            continue;
        };
        for failure in deliver(n, settings.smtp.as_ref(), name, alert, record).await {
            tracing::warn!("{failure}");
            let mut w = EventRecord::new(
                &record.run_id,
                &record.pipeline,
                record.dataset.clone(),
                record.flow.clone(),
                "notification",
                chrono::Utc::now(),
            );
            w.status = Status::Warning;
            w.message = Some(format!(
                "{} notification not delivered; the run's outcome stands",
                alert.as_str()
            ));
            w.error = Some(failure);
            warnings.push(w);
        }
    }
    if let Err(e) = event_log::append(wh, &warnings).await {
        tracing::warn!(
            "could not record the undelivered notifications in the event log: {}",
            crate::error::chain(&e)
        );
    }
}

/// Delivers one entry's notification; what could not be delivered, one message each.
async fn deliver(
    n: &Notification,
    smtp: Option<&Smtp>,
    name: &str,
    alert: Alert,
    record: &EventRecord,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(url) = &n.webhook {
        if let Err(e) = post(url, alert, record).await {
            failures.push(format!("webhook at {}: {e}", host_of(url)));
        }
    }
    if !n.email_recipients.is_empty() {
        let sent = match smtp {
            Some(smtp) => mail(smtp, &n.email_recipients, name, alert, record).await,
            None => Err("no SMTP server is set".to_string()),
        };
        if let Err(e) = sent {
            failures.push(format!("e-mail to {}: {e}", n.email_recipients.join(", ")));
        }
    }
    failures
}

/// POSTs the record to `url` as JSON; an answer other than 2xx is a failure.
async fn post(url: &str, alert: Alert, record: &EventRecord) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(WEBHOOK_TIMEOUT)
        .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| crate::error::chain(&e.without_url()))?;
    let answer = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("X-Strata-Alert", alert.as_str())
        .body(RecordJson::of(record).to_text())
        .send()
        .await
        .map_err(|e| crate::error::chain(&e.without_url()))?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the server answered HTTP {status}"))
    }
}

/// `host[:port]` of a URL, for messages.
fn host_of(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| u.port().map_or(h.to_string(), |p| format!("{h}:{p}")))
        })
        .unwrap_or_else(|| "an unparsable URL".into())
}

/// E-mails the notification to `to` through `smtp`.
async fn mail(
    smtp: &Smtp,
    to: &[String],
    name: &str,
    alert: Alert,
    record: &EventRecord,
) -> Result<(), String> {
    let password = match &smtp.password_env {
        None => None,
        Some(var) => Some(Secret::new(std::env::var(var).map_err(|_| {
            format!("the environment variable {var} (smtp password_env) is not set")
        })?)),
    };
    let text = message::email(name, alert, record);
    let parse = |a: &str| {
        a.parse::<lettre::message::Mailbox>()
            .map_err(|e| format!("`{a}` is not an e-mail address: {e}"))
    };
    let from = parse(&smtp.from)?;
    let mut builder = lettre::Message::builder()
        .from(from)
        .subject(text.subject)
        .header(lettre::message::header::ContentType::TEXT_PLAIN);
    for r in to {
        builder = builder.to(parse(r)?);
    }
    let email = builder
        .body(text.body)
        .map_err(|e| format!("cannot build the message: {e}"))?;
    let envelope = email.envelope();
    let mail = smtp::Envelope {
        from: envelope.from().map(|a| a.to_string()).unwrap_or_default(),
        to: envelope.to().iter().map(|a| a.to_string()).collect(),
        message: email.formatted(),
    };
    smtp::send(smtp, password.as_ref(), &mail)
        .await
        .map_err(|e| format!("via {}:{}: {e}", smtp.host, smtp.port()))
}
