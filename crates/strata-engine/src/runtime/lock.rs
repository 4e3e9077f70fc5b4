//! `strata run --lock fail|wait`: one run of a pipeline at a time on a warehouse, as
//! Databricks runs one update per pipeline. Sugar on top of the guarantee, not the guarantee:
//! Delta's conditional commits keep overlapping runs correct without it (docs/operations.md).
//!
//! The lock is one object, `_strata/locks/<pipeline>.json`, created only if absent (a local
//! `create_new`, or an object store's conditional put), holding who runs: run id, host,
//! process id and start time. The run removes it when it ends, failed or not. One left by a
//! process that died (same host, process gone) or older than [`STALE_AFTER`] is taken over.

use crate::error::{EngineError, Result};
use crate::storage::location::Location;
use crate::storage::warehouse::Warehouse;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a run does when another run of its pipeline holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Stop at once with an error naming the other run (exit code 3).
    Fail,
    /// Wait for the other run to end, checking every second, for at most this long.
    Wait(Duration),
}

/// A lock untouched for this long is taken to be left by a run that died elsewhere.
pub const STALE_AFTER: Duration = Duration::from_secs(12 * 3600);

/// Who holds a pipeline's lock.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Holder {
    run_id: String,
    host: String,
    pid: u32,
    /// Seconds since the Unix epoch.
    started: u64,
}

impl Holder {
    fn me(run_id: &str) -> Holder {
        Holder {
            run_id: run_id.to_string(),
            host: host_name(),
            pid: std::process::id(),
            started: now_secs(),
        }
    }

    /// Left by a process that is gone: on this host with no such process, or too old.
    fn is_stale(&self) -> bool {
        let dead_here = self.host == host_name() && !process_alive(self.pid);
        dead_here || now_secs().saturating_sub(self.started) > STALE_AFTER.as_secs()
    }

    fn describe(&self) -> String {
        format!(
            "run {} (process {} on {}, started {} s ago)",
            self.run_id,
            self.pid,
            self.host,
            now_secs().saturating_sub(self.started)
        )
    }
}

/// A held lock; [`PipelineLock::release`] gives it back.
pub(crate) struct PipelineLock {
    dir: Location,
    file: String,
}

/// The lock object's name for pipeline `key` (its spec name or file): its letters and digits
/// kept, anything else `_`.
fn file_name(key: &str) -> String {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.json")
}

/// Takes the lock of pipeline `key` for run `run_id`, as `mode` says.
pub(crate) async fn acquire(
    wh: &Warehouse,
    key: &str,
    run_id: &str,
    mode: LockMode,
) -> Result<PipelineLock> {
    let dir = wh.root().join("_strata").join("locks");
    if let Some(local) = dir.local() {
        std::fs::create_dir_all(local)
            .map_err(|e| EngineError::plan(format!("cannot create {}: {e}", local.display())))?;
    }
    let file = file_name(key);
    let me = serde_json::to_vec(&Holder::me(run_id)).unwrap_or_default();
    let started = std::time::Instant::now();
    loop {
        if dir.create_file(&file, me.clone().into()).await? {
            return Ok(PipelineLock { dir, file });
        }
        let holder: Option<Holder> = dir
            .read_file(&file)
            .await?
            .and_then(|b| serde_json::from_slice(&b).ok());
        match holder {
            // Gone between our try and our read: try again.
            None if dir.read_file(&file).await?.is_none() => continue,
            Some(h) if h.is_stale() => {
                tracing::warn!(
                    "pipeline {key}: taking over the lock left by {}",
                    h.describe()
                );
                dir.remove_file(&file).await?;
                continue;
            }
            other => {
                let who = other.map_or_else(|| "another run".to_string(), |h| h.describe());
                match mode {
                    LockMode::Wait(limit) if started.elapsed() < limit => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    LockMode::Wait(limit) => {
                        return Err(EngineError::Locked(format!(
                            "pipeline {key} is still running ({who}) after waiting {} s",
                            limit.as_secs()
                        )))
                    }
                    LockMode::Fail => {
                        return Err(EngineError::Locked(format!(
                            "pipeline {key} is already running on this warehouse ({who}); \
                             --lock wait waits for it to end"
                        )))
                    }
                }
            }
        }
    }
}

impl PipelineLock {
    /// Gives the lock back (a failure to is logged: the lock then goes stale).
    pub(crate) async fn release(self) {
        if let Err(e) = self.dir.remove_file(&self.file).await {
            tracing::warn!("could not remove the pipeline lock {}: {e}", self.file);
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Whether process `pid` exists on this host (Linux: its `/proc` entry; elsewhere assumed).
fn process_alive(pid: u32) -> bool {
    let proc = std::path::Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_stale_when_its_process_is_gone_or_it_is_old() {
        let mut h = Holder::me("r1");
        assert!(!h.is_stale(), "this process holds it");
        h.pid = u32::MAX - 7;
        assert!(h.is_stale(), "no such process here");
        let mut old = Holder::me("r2");
        old.host = "elsewhere".into();
        old.pid = u32::MAX - 7;
        assert!(!old.is_stale(), "another host's process cannot be checked");
        old.started = now_secs() - STALE_AFTER.as_secs() - 1;
        assert!(old.is_stale());
        assert_eq!(
            file_name("shop pipeline/v2.sql"),
            "shop_pipeline_v2_sql.json"
        );
    }
}
