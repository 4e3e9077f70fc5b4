//! A run as a whole (Lakeflow's "update"): attempts of the pipeline, the next one after a
//! pause when the last failed transiently and `pipelines.numUpdateRetryAttempts` allows,
//! never after a data or pipeline error; then the notifications of its final outcome, once.
//!
//! All attempts share the run's id, so `strata events` shows them as one run. When retries
//! or notifications are set, the log gets records of kind `update`: `RETRYING` for each
//! failed attempt that is tried again, then the outcome (`COMPLETED`, or `FAILED` saying
//! whether it was retried and why not), naming the flow that failed.

use crate::error::{EngineError, Result};
use crate::load::settings::{humanize, UpdateSettings};
use crate::runtime::event_log::{self, EventRecord, Status};
use crate::runtime::notify::{self, message::Outcome};
use crate::runtime::options::{RunOptions, RunReport};
use crate::storage::warehouse::Warehouse;
use std::sync::Mutex;
use std::time::Duration;

/// The records of an attempt's datasets and flows, as they end.
pub(crate) type Ended = Mutex<Vec<EventRecord>>;

/// A run's id: its start time (UTC, microseconds) and the process id, so that runs of
/// several processes never share one.
pub(crate) fn new_run_id() -> String {
    format!(
        "{}-{:08x}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ"),
        std::process::id()
    )
}

/// A run being attempted: what names it in the log and in notifications, and how far it
/// got. The caller runs an attempt with [`Update::options`] and [`Update::run_id`], then
/// hands its outcome to [`Update::after`], until that says the run is over.
pub(crate) struct Update<'a> {
    wh: &'a Warehouse,
    /// The pipeline file, as the event log names it.
    pipeline: String,
    /// The spec's name, else the file's, for messages.
    name: String,
    settings: &'a UpdateSettings,
    run_id: String,
    options: RunOptions,
    /// The attempt running or last run, from 1.
    n: u32,
    started: chrono::DateTime<chrono::Utc>,
    attempt_started: chrono::DateTime<chrono::Utc>,
}

impl<'a> Update<'a> {
    pub(crate) fn new(
        wh: &'a Warehouse,
        pipeline: String,
        name: String,
        settings: &'a UpdateSettings,
        options: &RunOptions,
    ) -> Self {
        let now = chrono::Utc::now();
        Update {
            wh,
            pipeline,
            name,
            settings,
            run_id: new_run_id(),
            options: options.clone(),
            n: 1,
            started: now,
            attempt_started: now,
        }
    }

    /// The options of the next attempt (a full refresh that already set its tables aside
    /// is not repeated).
    pub(crate) fn options(&self) -> &RunOptions {
        &self.options
    }

    /// The id every attempt of this run shares.
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    /// After an attempt that ended with `outcome`, its datasets' records in `ended`: the
    /// run's result when it is over (notifications sent), or `None` after the pause before
    /// the next attempt.
    pub(crate) async fn after(
        &mut self,
        outcome: Result<RunReport>,
        ended: Vec<EventRecord>,
    ) -> Option<Result<RunReport>> {
        let attempts = self.settings.retries.saturating_add(1);
        let n = self.n;
        let e = match outcome {
            Ok(report) => {
                if self.settings.records_updates() {
                    let mut r = self.record(self.started, &ended, None);
                    r.status = Status::Completed;
                    r.message = Some(format!("run completed (attempt {n} of {attempts})"));
                    if let Err(e) = event_log::append(self.wh, std::slice::from_ref(&r)).await {
                        return Some(Err(e));
                    }
                    // A run that found nothing new (most cycles of --continuous) tells no one.
                    if ended.iter().any(|e| e.status == Status::Completed) {
                        let outcome = Outcome {
                            failed: false,
                            fatal: false,
                            flow_failed: false,
                        };
                        notify::notify(self.wh, self.settings, &self.name, &r, outcome).await;
                    }
                }
                return Some(Ok(report));
            }
            Err(e) => e,
        };
        let transient = e.is_transient();
        if transient && n < attempts && !stop_requested(&self.options) {
            let pause = self.settings.pause_after(n);
            let mut r = self.record(self.attempt_started, &ended, Some(&e));
            r.status = Status::Retrying;
            let mut m = format!(
                "attempt {n} of {attempts} failed with a transient error; trying again in {}",
                humanize(pause)
            );
            // The tables a full refresh set aside stay aside; the next attempt rebuilds
            // what this one did not, as a plain run.
            let aside = self.wh.state_root().join("full_refresh").join(&self.run_id);
            if self.options.full_refresh.is_some() && aside.exists().await.unwrap_or(false) {
                self.options.full_refresh = None;
                m.push_str(&format!(
                    " (the tables the full refresh set aside are in {})",
                    aside
                ));
            }
            r.message = Some(m.clone());
            tracing::warn!("run {}: {m}: {}", self.run_id, crate::error::chain(&e));
            if let Err(log) = event_log::append(self.wh, std::slice::from_ref(&r)).await {
                tracing::warn!("could not record the retry: {}", crate::error::chain(&log));
            }
            if wait(pause, &self.options).await {
                self.n += 1;
                self.attempt_started = chrono::Utc::now();
                return None;
            }
        }
        if self.settings.records_updates() {
            let mut r = self.record(self.started, &ended, Some(&e));
            r.status = Status::Failed;
            let stopped = stop_requested(&self.options);
            r.message = Some(why_it_ended(transient, n, attempts, stopped));
            // The run's own error is what the caller must see, not the log's.
            if let Err(log) = event_log::append(self.wh, std::slice::from_ref(&r)).await {
                tracing::warn!(
                    "could not record the run's outcome: {}",
                    crate::error::chain(&log)
                );
            }
            let outcome = Outcome {
                failed: true,
                fatal: !transient,
                flow_failed: first_failed(&ended).is_some(),
            };
            notify::notify(self.wh, self.settings, &self.name, &r, outcome).await;
        }
        Some(Err(e))
    }

    /// The `update` record of an attempt that ended with `error` (or none), naming the
    /// dataset and flow that failed, with the counts of what its datasets did.
    fn record(
        &self,
        started: chrono::DateTime<chrono::Utc>,
        ended: &[EventRecord],
        error: Option<&EngineError>,
    ) -> EventRecord {
        let failed = first_failed(ended);
        let mut r = EventRecord::new(
            &self.run_id,
            &self.pipeline,
            failed.map(|f| f.dataset.clone()).unwrap_or_default(),
            failed.map(|f| f.flow.clone()).unwrap_or_default(),
            "update",
            started,
        );
        r.ended_at = chrono::Utc::now();
        for e in ended {
            r.rows_read += e.rows_read;
            r.rows_written += e.rows_written;
            r.rows_upserted += e.rows_upserted;
            r.rows_deleted += e.rows_deleted;
            r.versions_opened += e.versions_opened;
            r.versions_closed += e.versions_closed;
            r.rows_dropped += e.rows_dropped;
        }
        r.error = error.map(|e| crate::error::chain(e));
        r
    }
}

/// Why a failed run was not tried again.
fn why_it_ended(transient: bool, n: u32, attempts: u32, stopped: bool) -> String {
    if !transient {
        format!(
            "not retried: a data or pipeline error, which another attempt would meet \
             again (attempt {n} of {attempts})"
        )
    } else if stopped && n < attempts {
        format!("not retried: the run was asked to stop (attempt {n} of {attempts})")
    } else if attempts == 1 {
        "failed with a transient error; not retried (pipelines.numUpdateRetryAttempts \
         is 0)"
            .to_string()
    } else {
        format!("failed with a transient error on each of {attempts} attempts")
    }
}

/// The first dataset or flow of an attempt that failed.
fn first_failed(ended: &[EventRecord]) -> Option<&EventRecord> {
    ended.iter().find(|r| r.status == Status::Failed)
}

pub(crate) fn stop_requested(options: &RunOptions) -> bool {
    options
        .stop
        .as_ref()
        .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
}

/// Waits `pause`; false when the run was asked to stop meanwhile.
pub(crate) async fn wait(pause: Duration, options: &RunOptions) -> bool {
    let until = tokio::time::Instant::now() + pause;
    while tokio::time::Instant::now() < until {
        if stop_requested(options) {
            return false;
        }
        let left = until - tokio::time::Instant::now();
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
    !stop_requested(options)
}
