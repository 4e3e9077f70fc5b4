//! Expired tombstones of SCD type 1 targets (semantics rule R9).
//!
//! A delete leaves a tombstone in the event store, so that a late event older than the
//! delete does not bring the key back. The target property
//! `pipelines.cdc.tombstoneGCThresholdInSeconds` (default two days) bounds how long: a
//! delete processed at time `t` expires at `t + threshold`. From then on, when a run folds
//! its key, the delete is forgotten together with every event of the key whose sequence is
//! at or below the delete's and that was processed before the delete expired (events the
//! delete hid). Events processed later are kept, so a late event older than the forgotten
//! delete brings the key back, and a later-still one is placed against it as usual.
//!
//! Forgetting never changes an SCD type 1 row at the moment of expiry: after a delete only
//! events with a higher sequence count, and those are kept. So the target stays the fold of
//! the events that are not forgotten without being rewritten, and the forgotten events may
//! stay in the event store (they are skipped each time their key is read). SCD type 2
//! targets keep their tombstones: there the delete ends a version of the key's history.
//!
//! When each event was processed is the instant its run decided which tombstones had
//! expired, recorded in the run's event-store commit ([`DECIDED_AT`]; the commit time for
//! commits written before it was recorded) and found through the event's `__strata_run`.
//! Using the decision instant, not the commit time, keeps a run that straddles an expiry
//! consistent: an event its run hid behind a delete counts as processed before that delete
//! expired. A commit file removed by log cleanup counts as processed before every known
//! commit.

use crate::error::{Context, EngineError, Result};
use crate::storage::location::Location;
use crate::util::arrow;
use deltalake::arrow::array::{Array, BooleanArray, Int64Array, Int8Array, RecordBatch};
use deltalake::arrow::compute::filter_record_batch;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use strata_core::EventKind;

/// The target property that sets how long tombstones are kept, in seconds.
pub(crate) const PROPERTY: &str = "pipelines.cdc.tombstoneGCThresholdInSeconds";
/// Two days, as in Lakeflow.
pub(crate) const DEFAULT_SECONDS: u64 = 172_800;
/// The commit-info key of an event-store commit holding when its run decided which
/// tombstones had expired (milliseconds since the epoch).
pub(crate) const DECIDED_AT: &str = "strata.decidedAt";

/// The threshold `properties` set (keys compared without case), in seconds.
pub(crate) fn threshold(properties: &BTreeMap<String, String>) -> Result<u64> {
    match properties
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(PROPERTY))
    {
        None => Ok(DEFAULT_SECONDS),
        Some((k, v)) => v.trim().parse::<u64>().map_err(|_| {
            EngineError::plan(format!(
                "{k} = '{v}' is not a number of seconds (a whole number, 0 or more)"
            ))
        }),
    }
}

/// When the runs of event-store versions decided (milliseconds since the epoch, see
/// [`commit_time`]), read from their commit files once each; `None` for a version whose
/// commit file is gone.
pub(crate) struct CommitTimes {
    /// The local `_delta_log` folder, read as versions are asked for; `None` when the
    /// times were all read up front (an object store).
    log: Option<PathBuf>,
    known: HashMap<i64, Option<i64>>,
}

impl CommitTimes {
    /// The commit times of the event store at `store` for the runs of `events` (stored
    /// events: run column at `n_out + 2`): read as asked for from a local folder, read up
    /// front (one request per distinct run) from an object store.
    pub(crate) async fn of_runs(
        store: &Location,
        events: &RecordBatch,
        n_out: usize,
    ) -> Result<Self> {
        if let Some(dir) = store.local() {
            return Ok(Self::new(dir.to_path_buf()));
        }
        let runs = events
            .column(n_out + 2)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| EngineError::internal("event runs"))?;
        let versions: std::collections::BTreeSet<i64> = runs.iter().flatten().collect();
        let log = store.join("_delta_log");
        let mut known = HashMap::new();
        for v in versions {
            let name = format!("{v:020}.json");
            let time = match log.read_file(&name).await? {
                Some(bytes) => Some(commit_time(&String::from_utf8_lossy(&bytes)).ok_or_else(
                    || EngineError::internal(format!("{log}/{name}: no commitInfo timestamp")),
                )?),
                None => None,
            };
            known.insert(v, time);
        }
        Ok(CommitTimes { log: None, known })
    }

    /// The versions of the Delta table at `table_dir`.
    pub(crate) fn new(table_dir: PathBuf) -> Self {
        CommitTimes {
            log: Some(table_dir.join("_delta_log")),
            known: HashMap::new(),
        }
    }

    fn at(&mut self, version: i64) -> Result<Option<i64>> {
        if let Some(t) = self.known.get(&version) {
            return Ok(*t);
        }
        let Some(log) = &self.log else {
            return Ok(None);
        };
        let path = log.join(format!("{version:020}.json"));
        let time = match std::fs::read_to_string(&path) {
            Ok(text) => Some(commit_time(&text).ok_or_else(|| {
                EngineError::internal(format!("{}: no commitInfo timestamp", path.display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).context(|| format!("reading {}", path.display())),
        };
        self.known.insert(version, time);
        Ok(time)
    }
}

/// When a Delta commit file's run decided ([`DECIDED_AT`]), else its commit time.
fn commit_time(text: &str) -> Option<i64> {
    text.lines().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let info = v.get("commitInfo")?;
        info.get(DECIDED_AT)
            .and_then(serde_json::Value::as_i64)
            .or_else(|| info.get("timestamp")?.as_i64())
    })
}

/// [`forget_expired`] of `events` stored in the event store at `store`, with their runs'
/// commit times read from it ([`CommitTimes::of_runs`]).
pub(crate) async fn forget_expired_in(
    store: &Location,
    events: &RecordBatch,
    keys: &[usize],
    n_out: usize,
    threshold_secs: u64,
    now: i64,
) -> Result<(RecordBatch, usize)> {
    let mut times = CommitTimes::of_runs(store, events, n_out).await?;
    forget_expired(events, keys, n_out, threshold_secs, now, &mut times)
}

/// `events` (stored events, in the event-store layout: output columns with the keys at
/// `keys`, then sequence, kind and run) without the expired tombstones and the events they
/// hid, as of `now` (milliseconds since the epoch), and how many tombstones were forgotten.
pub(crate) fn forget_expired(
    events: &RecordBatch,
    keys: &[usize],
    n_out: usize,
    threshold_secs: u64,
    now: i64,
    times: &mut CommitTimes,
) -> Result<(RecordBatch, usize)> {
    let kinds = events
        .column(n_out + 1)
        .as_any()
        .downcast_ref::<Int8Array>()
        .ok_or_else(|| EngineError::internal("event kinds"))?;
    let runs = events
        .column(n_out + 2)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| EngineError::internal("event runs"))?;
    let threshold = i64::try_from(threshold_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    // The expired deletes, with the instant each expired (`None`: processed before every
    // known commit, so it expired before any of them).
    let mut expired: Vec<(usize, Option<i64>)> = Vec::new();
    for i in 0..events.num_rows() {
        if kinds.is_null(i) || kinds.value(i) != EventKind::Delete.code() {
            continue;
        }
        match times.at(runs.value(i))? {
            None => expired.push((i, None)),
            Some(t) if t.saturating_add(threshold) <= now => {
                expired.push((i, Some(t.saturating_add(threshold))))
            }
            Some(_) => {}
        }
    }
    if expired.is_empty() {
        return Ok((events.clone(), 0));
    }
    let key_columns: Vec<_> = keys.iter().map(|&k| events.column(k).clone()).collect();
    let key_rows = arrow::rows(&key_columns)?;
    let seq_rows = arrow::rows(&[events.column(n_out).clone()])?;
    let mut by_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
    for i in 0..events.num_rows() {
        by_key.entry(key_rows.row(i).data()).or_default().push(i);
    }
    let mut keep = vec![true; events.num_rows()];
    for &(d, expiry) in &expired {
        let Some(same_key) = by_key.get(key_rows.row(d).data()) else {
            continue;
        };
        for &e in same_key {
            if seq_rows.row(e) > seq_rows.row(d) {
                continue;
            }
            // Processed before the delete expired: in its run or an earlier one, or in a
            // later run committed before the expiry.
            let hidden = runs.value(e) <= runs.value(d)
                || match (expiry, times.at(runs.value(e))?) {
                    (Some(x), Some(t)) => t < x,
                    (Some(_), None) => true,
                    (None, t) => t.is_none(),
                };
            if hidden {
                keep[e] = false;
            }
        }
    }
    let kept = filter_record_batch(events, &BooleanArray::from(keep))
        .context(|| "dropping expired tombstones".into())?;
    Ok((kept, expired.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int32Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// Events (key, value, seq, kind, run) in the event-store layout.
    fn events(rows: &[(i32, &str, i32, EventKind, i64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Utf8, true),
            Field::new("__strata_seq", DataType::Int32, true),
            Field::new("__strata_op", DataType::Int8, false),
            Field::new("__strata_run", DataType::Int64, false),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.3.code()))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.4))),
        ];
        RecordBatch::try_new(schema, columns).expect("batch")
    }

    /// A store log whose version `v` was committed at `times[v]` seconds (`None`: its
    /// commit file is gone).
    fn log(times: &[Option<i64>]) -> (tempfile::TempDir, CommitTimes) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("_delta_log")).expect("mkdir");
        for (v, t) in times.iter().enumerate() {
            if let Some(t) = t {
                let text = format!(
                    "{{\"commitInfo\":{{\"timestamp\":{},\"operation\":\"WRITE\"}}}}\n{{\"add\":{{}}}}\n",
                    t * 1000
                );
                std::fs::write(dir.path().join(format!("_delta_log/{v:020}.json")), text)
                    .expect("write");
            }
        }
        let times = CommitTimes::new(dir.path().to_path_buf());
        (dir, times)
    }

    fn values(batch: &RecordBatch) -> Vec<String> {
        let v = batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("v");
        (0..batch.num_rows())
            .map(|i| v.value(i).to_string())
            .collect()
    }

    #[test]
    fn an_expired_delete_is_forgotten_with_what_it_hid_and_nothing_later() {
        use EventKind::{Delete, Upsert};
        // Runs 0..4 committed at 0, 10, 100, 200, 300 s; threshold 50 s; now 1000 s.
        let (_dir, mut times) = log(&[Some(0), Some(10), Some(100), Some(200), Some(300)]);
        let batch = events(&[
            (1, "a", 1, Upsert, 0),
            (1, "del", 5, Delete, 1), // expires at 60 s
            (1, "hidden", 3, Upsert, 1),
            (1, "after", 7, Upsert, 2), // a higher sequence: kept
            (1, "late", 2, Upsert, 3),  // processed after the expiry: kept
            (2, "b", 1, Upsert, 0),     // another key
            (3, "del3", 9, Delete, 4),  // processed at 300 s: expires at 350 s
            (3, "c", 4, Upsert, 0),
        ]);
        let (kept, n) = forget_expired(&batch, &[0], 2, 50, 1_000_000, &mut times).expect("ok");
        assert_eq!(n, 2);
        assert_eq!(values(&kept), ["after", "late", "b"]);
        // Before key 3's delete expires, it and what it hides stay.
        let (kept, n) = forget_expired(&batch, &[0], 2, 50, 340_000, &mut times).expect("ok");
        assert_eq!(n, 1);
        assert_eq!(values(&kept), ["after", "late", "b", "del3", "c"]);
        // A threshold no delete has reached yet changes nothing.
        let (kept, n) = forget_expired(&batch, &[0], 2, 10_000, 1_000_000, &mut times).expect("ok");
        assert_eq!((n, kept.num_rows()), (0, batch.num_rows()));
    }

    #[test]
    fn a_delete_whose_commit_file_is_gone_counts_as_old() {
        use EventKind::{Delete, Upsert};
        // Versions 0 and 1 cleaned up; 2 committed at 500 s.
        let (_dir, mut times) = log(&[None, None, Some(500)]);
        let batch = events(&[
            (1, "a", 1, Upsert, 0),
            (1, "del", 5, Delete, 1),
            (1, "late", 2, Upsert, 2),
        ]);
        let (kept, n) = forget_expired(&batch, &[0], 2, 3600, 600_000, &mut times).expect("ok");
        assert_eq!(n, 1);
        assert_eq!(values(&kept), ["late"]);
    }

    #[test]
    fn the_decision_instant_comes_before_the_commit_time() {
        let with = r#"{"commitInfo":{"timestamp":2000,"strata.decidedAt":1500}}"#;
        let without = "{\"protocol\":{}}\n{\"commitInfo\":{\"timestamp\":2000}}";
        assert_eq!(commit_time(with), Some(1500));
        assert_eq!(commit_time(without), Some(2000));
        assert_eq!(commit_time("{\"add\":{}}"), None);
    }

    #[test]
    fn the_threshold_is_whole_seconds() {
        let props = |v: &str| BTreeMap::from([(PROPERTY.to_ascii_lowercase(), v.to_string())]);
        assert_eq!(
            threshold(&BTreeMap::new()).expect("default"),
            DEFAULT_SECONDS
        );
        assert_eq!(threshold(&props("0")).expect("zero"), 0);
        assert_eq!(threshold(&props(" 3600 ")).expect("hour"), 3600);
        let err = threshold(&props("two days"))
            .expect_err("words")
            .to_string();
        assert!(err.contains("is not a number of seconds"), "{err}");
    }
}
