//! Property tests: random change streams over a small key space, split into random batches
//! delivered in random order (some delivered twice), run through the real engine on real
//! Delta tables, compared after the last run with the reference model of `strata-core`; the
//! SCD2 invariants are checked after every run. Some SCD type 1 cases set the tombstone
//! threshold to 0, so every delete expires after its run; their reference folds the events
//! left once the expired deletes are forgotten with what they hid (`folded_events`).
//!
//! Each case runs the real pipeline several times, so the case count is small by default;
//! `PROPTEST_CASES=200 cargo test -p strata-engine --test property` runs more.

use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use proptest::prelude::*;
use std::fmt::Write as _;
use strata_core::reference::{self, RefEvent, RefFlow};
use strata_core::EventKind;
use strata_engine::Warehouse;

#[derive(Debug, Clone)]
struct Case {
    events: Vec<RefEvent>,
    /// Batch boundaries over the shuffled events.
    batches: Vec<Vec<RefEvent>>,
    /// Index of a batch delivered a second time, if any.
    replay: Option<usize>,
    scd2: bool,
    ignore_nulls: bool,
    track_city: bool,
    /// The target enables deletion vectors: replaced rows are marked, not rewritten.
    deletion_vectors: bool,
    /// SCD type 1 with `pipelines.cdc.tombstoneGCThresholdInSeconds = 0`: a delete expires
    /// as soon as its run is over, and later runs forget it with the events it hid.
    expire: bool,
}

fn value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![3 => "[ab]".prop_map(Some), 1 => Just(None)]
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(
            |(scd2, ignore_nulls, track_city, deletion_vectors, expire)| {
                let event = (0i64..4, 0u8..10, value(), value()).prop_map(move |(key, k, a, b)| {
                    let kind = match k {
                        0 | 1 => EventKind::Delete,
                        2 if !scd2 => EventKind::Truncate,
                        _ => EventKind::Upsert,
                    };
                    RefEvent {
                        key,
                        seq: 0,
                        kind,
                        values: vec![a, b],
                    }
                });
                (
                    proptest::collection::vec(event, 1..25),
                    any::<u64>(),
                    1usize..5,
                    any::<bool>(),
                )
                    .prop_map(move |(mut events, seed, n_batches, replay)| {
                        // Unique sequence values, then a deterministic shuffle for arrival order.
                        for (i, e) in events.iter_mut().enumerate() {
                            e.seq = i as i64 * 10 + 1;
                        }
                        let mut arrival = events.clone();
                        let mut s = seed | 1;
                        for i in (1..arrival.len()).rev() {
                            s ^= s << 13;
                            s ^= s >> 7;
                            s ^= s << 17;
                            arrival.swap(i, (s % (i as u64 + 1)) as usize);
                        }
                        let size = arrival.len().div_ceil(n_batches);
                        let batches: Vec<Vec<RefEvent>> =
                            arrival.chunks(size).map(|c| c.to_vec()).collect();
                        let replay = replay.then(|| (seed as usize) % batches.len());
                        Case {
                            events,
                            batches,
                            replay,
                            scd2,
                            ignore_nulls,
                            track_city,
                            deletion_vectors,
                            expire: expire && !scd2,
                        }
                    })
            },
        )
}

impl Case {
    /// The batches in delivery order, the replayed one again at the end.
    fn deliveries(&self) -> Vec<&Vec<RefEvent>> {
        let mut out: Vec<&Vec<RefEvent>> = self.batches.iter().collect();
        if let Some(r) = self.replay {
            out.push(&self.batches[r]);
        }
        out
    }
}

fn json_line(e: &RefEvent) -> String {
    let v = |x: &Option<String>| {
        x.as_ref()
            .map_or("null".to_string(), |s| format!("\"{s}\""))
    };
    let (key, op) = match e.kind {
        EventKind::Upsert => (e.key.to_string(), "U"),
        EventKind::Delete => (e.key.to_string(), "D"),
        EventKind::Truncate => ("null".to_string(), "T"),
    };
    format!(
        "{{\"id\": {key}, \"name\": {}, \"city\": {}, \"op\": \"{op}\", \"seq\": {}}}",
        v(&e.values[0]),
        v(&e.values[1]),
        e.seq
    )
}

fn pipeline(c: &Case) -> String {
    let mut sql = String::from(
        "CREATE OR REFRESH STREAMING TABLE cdc AS SELECT * FROM STREAM read_files('data', \
         format => 'json', schema => 'id BIGINT, name STRING, city STRING, op STRING, seq BIGINT');\n",
    );
    let target = target_table(c.deletion_vectors);
    if c.expire {
        // The same statement with the threshold added to its properties.
        let with = match target.strip_suffix(";\n") {
            Some(t) if t.contains("TBLPROPERTIES (") => t.replacen(
                "TBLPROPERTIES (",
                "TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '0', ",
                1,
            ),
            Some(t) => {
                format!("{t} TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '0')")
            }
            None => unreachable!("target statements end with ';'"),
        };
        sql.push_str(&with);
        sql.push_str(";\n");
    } else {
        sql.push_str(target);
    }
    sql.push_str("CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(cdc) KEYS (id)\n");
    if c.ignore_nulls {
        sql.push_str("IGNORE NULL UPDATES\n");
    }
    sql.push_str("APPLY AS DELETE WHEN op = 'D'\n");
    if !c.scd2 {
        sql.push_str("APPLY AS TRUNCATE WHEN op = 'T'\n");
    }
    sql.push_str("SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)\n");
    if c.scd2 {
        sql.push_str("STORED AS SCD TYPE 2\n");
        if !c.track_city {
            sql.push_str("TRACK HISTORY ON * EXCEPT (city)\n");
        }
    } else {
        sql.push_str("STORED AS SCD TYPE 1\n");
    }
    sql.push(';');
    sql
}

/// The target's statement, with deletion vectors (the default) or with files rewritten.
fn target_table(deletion_vectors: bool) -> &'static str {
    if deletion_vectors {
        "CREATE OR REFRESH STREAMING TABLE t;\n"
    } else {
        "CREATE OR REFRESH STREAMING TABLE t TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');\n"
    }
}

fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "NULL".into())
}

/// The events the fold sees after the last delivery: every event, unless the target
/// forgets expired tombstones. Then (threshold 0) each delete delivered before the last
/// delivery is forgotten with the events of its key at or below its sequence delivered no
/// later than it (`tombstones.rs`); a redelivered event counts once.
fn folded_events(c: &Case) -> Vec<RefEvent> {
    if !c.expire {
        return c.events.clone();
    }
    let deliveries = c.deliveries();
    let last = deliveries.len() - 1;
    let stored: Vec<(usize, &RefEvent)> = deliveries
        .iter()
        .enumerate()
        .flat_map(|(run, batch)| batch.iter().map(move |e| (run, e)))
        .collect();
    let forgotten = |(run, e): &(usize, &RefEvent)| {
        e.kind != EventKind::Truncate
            && stored.iter().any(|(d_run, d)| {
                d.kind == EventKind::Delete
                    && *d_run < last
                    && d.key == e.key
                    && e.seq <= d.seq
                    && run <= d_run
            })
    };
    let mut kept: Vec<RefEvent> = Vec::new();
    for s in stored.iter().filter(|s| !forgotten(s)) {
        if !kept.iter().any(|k| k.seq == s.1.seq) {
            kept.push(s.1.clone());
        }
    }
    kept.sort_by_key(|e| e.seq);
    kept
}

fn expected(c: &Case) -> Vec<String> {
    let flow = RefFlow {
        ignore_null_updates: c.ignore_nulls,
        tracked: vec![true, !c.scd2 || c.track_city],
    };
    if c.scd2 {
        reference::scd2(&flow, &c.events)
            .expect("unique sequences never tie")
            .into_iter()
            .map(|(k, v, s, e)| {
                format!(
                    "{k}|{}|{}|{s}|{}",
                    cell(&v[0]),
                    cell(&v[1]),
                    e.map_or("NULL".into(), |e| e.to_string())
                )
            })
            .collect()
    } else {
        reference::scd1(&flow, &folded_events(c))
            .expect("unique sequences never tie")
            .into_iter()
            .map(|(k, v)| format!("{k}|{}|{}", cell(&v[0]), cell(&v[1])))
            .collect()
    }
}

async fn actual(wh: &Warehouse, scd2: bool) -> Vec<String> {
    let sql = if scd2 {
        "SELECT id, name, city, __START_AT, __END_AT FROM t ORDER BY id, __START_AT"
    } else {
        "SELECT id, name, city FROM t ORDER BY id"
    };
    rows_of(wh, sql).await
}

async fn run_case(c: &Case) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, pipeline(c)).map_err(|e| e.to_string())?;
    let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
    for (i, batch) in c.deliveries().iter().enumerate() {
        let mut text = String::new();
        for e in batch.iter() {
            let _ = writeln!(text, "{}", json_line(e));
        }
        std::fs::write(data.join(format!("{i:04}.json")), text).map_err(|e| e.to_string())?;
        strata_engine::run_pipeline_file(&pipeline_path, &wh)
            .await
            .map_err(|e| format!("run {i}: {e}"))?;
        if c.scd2 {
            let v = strata_engine::validate(&wh, "t")
                .await
                .map_err(|e| e.to_string())?;
            if !v.is_empty() {
                return Err(format!("run {i}: SCD2 invariants broken: {v:?}"));
            }
        }
    }
    let want = expected(c);
    let got = actual(&wh, c.scd2).await;
    if got != want {
        return Err(format!(
            "pipeline:\n{}\nexpected:\n{}\ngot:\n{}",
            pipeline(c),
            want.join("\n"),
            got.join("\n")
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// AUTO CDC FROM SNAPSHOT: snapshots delivered in any order, some first with wrong content and
// then redelivered, equal the snapshots applied in version order (reference model).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapMode {
    Scd1,
    Scd2,
    Scd2TrackName,
    Snapshots,
}

#[derive(Debug, Clone)]
struct SnapCase {
    /// The final content of each version.
    snapshots: Vec<reference::RefSnapshot>,
    /// Runs, each a list of deliveries (version, rows); a version at most once per run.
    runs: Vec<Vec<reference::RefSnapshot>>,
    mode: SnapMode,
    deletion_vectors: bool,
}

fn snapshot_rows() -> impl Strategy<Value = std::collections::BTreeMap<i64, Vec<Option<String>>>> {
    proptest::collection::btree_map(
        0i64..5,
        (value(), value()).prop_map(|(a, b)| vec![a, b]),
        0..5,
    )
}

fn snap_case() -> impl Strategy<Value = SnapCase> {
    (
        proptest::collection::vec(snapshot_rows(), 1..6),
        proptest::collection::vec(snapshot_rows(), 0..3),
        any::<u64>(),
        1usize..5,
        prop_oneof![
            Just(SnapMode::Scd1),
            Just(SnapMode::Scd2),
            Just(SnapMode::Scd2TrackName),
            Just(SnapMode::Snapshots)
        ],
        any::<bool>(),
    )
        .prop_map(|(finals, wrong, seed, per_run, mode, deletion_vectors)| {
            let snapshots: Vec<reference::RefSnapshot> = finals
                .into_iter()
                .enumerate()
                .map(|(i, rows)| (i as i64 * 10 + 10, rows))
                .collect();
            // Deliveries: every final version, plus wrong first deliveries of some versions.
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            let mut order: Vec<reference::RefSnapshot> = snapshots.clone();
            for i in (1..order.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            // A version without rows cannot be delivered as rows: it never arrives.
            order.retain(|d| !d.1.is_empty());
            for rows in wrong {
                if order.is_empty() || rows.is_empty() {
                    break;
                }
                let v = order[(next() % order.len() as u64) as usize].0;
                // The wrong delivery goes before the final one of the same version.
                let pos = order.iter().position(|d| d.0 == v).unwrap_or(0);
                let at = (next() % (pos as u64 + 1)) as usize;
                order.insert(at, (v, rows));
            }
            let mut runs: Vec<Vec<reference::RefSnapshot>> = Vec::new();
            for d in order {
                let fits = runs
                    .last()
                    .is_some_and(|r| r.len() < per_run && r.iter().all(|x| x.0 != d.0));
                if fits {
                    if let Some(r) = runs.last_mut() {
                        r.push(d);
                    }
                } else {
                    runs.push(vec![d]);
                }
            }
            SnapCase {
                snapshots,
                runs,
                mode,
                deletion_vectors,
            }
        })
}

fn snap_pipeline(c: &SnapCase) -> String {
    let stored = match c.mode {
        SnapMode::Scd1 => "SCD TYPE 1",
        SnapMode::Scd2 | SnapMode::Scd2TrackName => "SCD TYPE 2",
        SnapMode::Snapshots => "SNAPSHOTS",
    };
    let track = if c.mode == SnapMode::Scd2TrackName {
        " TRACK HISTORY ON name"
    } else {
        ""
    };
    format!(
        "CREATE OR REFRESH STREAMING TABLE deliveries AS SELECT * FROM STREAM read_files('data', \
         format => 'json', schema => 'id BIGINT, name STRING, city STRING, v BIGINT');\n\
         {}\
         CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM STREAM(deliveries) KEYS (id)\n\
         SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS {stored}{track};",
        target_table(c.deletion_vectors)
    )
}

fn snap_expected(c: &SnapCase) -> Vec<String> {
    let row = |k: &i64, v: &[Option<String>]| format!("{k}|{}|{}", cell(&v[0]), cell(&v[1]));
    match c.mode {
        SnapMode::Scd1 => reference::snapshot_scd1(&c.snapshots)
            .iter()
            .map(|(k, v)| row(k, v))
            .collect(),
        SnapMode::Snapshots => {
            let mut out: Vec<(i64, i64, String)> = Vec::new();
            for (version, rows) in &c.snapshots {
                for (k, v) in rows {
                    out.push((*k, *version, format!("{}|{version}|{version}", row(k, v))));
                }
            }
            out.sort();
            out.into_iter().map(|x| x.2).collect()
        }
        SnapMode::Scd2 | SnapMode::Scd2TrackName => {
            let flow = RefFlow {
                ignore_null_updates: false,
                tracked: vec![true, c.mode == SnapMode::Scd2],
            };
            reference::snapshot_scd2(&flow, &c.snapshots)
                .into_iter()
                .map(|(k, v, s, e)| {
                    format!(
                        "{}|{s}|{}",
                        row(&k, &v),
                        e.map_or("NULL".into(), |e| e.to_string())
                    )
                })
                .collect()
        }
    }
}

async fn run_snap_case(c: &SnapCase) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, snap_pipeline(c)).map_err(|e| e.to_string())?;
    let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
    let scd2 = matches!(c.mode, SnapMode::Scd2 | SnapMode::Scd2TrackName);
    for (i, run) in c.runs.iter().enumerate() {
        let mut text = String::new();
        for (version, rows) in run {
            for (k, v) in rows {
                let json =
                    |x: &Option<String>| x.as_ref().map_or("null".into(), |s| format!("\"{s}\""));
                let _ = writeln!(
                    text,
                    "{{\"id\": {k}, \"name\": {}, \"city\": {}, \"v\": {version}}}",
                    json(&v[0]),
                    json(&v[1])
                );
            }
        }
        // An empty delivery still counts as a snapshot only if it has rows; skip empty runs.
        if text.is_empty() {
            continue;
        }
        std::fs::write(data.join(format!("{i:04}.json")), text).map_err(|e| e.to_string())?;
        strata_engine::run_pipeline_file(&pipeline_path, &wh)
            .await
            .map_err(|e| format!("run {i}: {e}"))?;
        if scd2 {
            let v = strata_engine::validate(&wh, "t")
                .await
                .map_err(|e| e.to_string())?;
            if !v.is_empty() {
                return Err(format!("run {i}: SCD2 invariants broken: {v:?}"));
            }
        }
    }
    // Versions whose final content is empty were never delivered as rows: they do not exist.
    let delivered: Vec<reference::RefSnapshot> = c
        .snapshots
        .iter()
        .filter(|s| !s.1.is_empty())
        .cloned()
        .collect();
    let want = snap_expected(&SnapCase {
        snapshots: delivered,
        ..c.clone()
    });
    let sql = match c.mode {
        SnapMode::Scd1 => "SELECT id, name, city FROM t ORDER BY id".to_string(),
        _ => {
            "SELECT id, name, city, __START_AT, __END_AT FROM t ORDER BY id, __START_AT".to_string()
        }
    };
    let got = if want.is_empty() && delivered_nothing(c) {
        Vec::new()
    } else {
        rows_of(&wh, &sql).await
    };
    if got != want {
        return Err(format!(
            "pipeline:\n{}\nruns: {:?}\nexpected:\n{}\ngot:\n{}",
            snap_pipeline(c),
            c.runs,
            want.join("\n"),
            got.join("\n")
        ));
    }
    Ok(())
}

fn delivered_nothing(c: &SnapCase) -> bool {
    c.runs.iter().all(|r| r.iter().all(|d| d.1.is_empty()))
}

async fn rows_of(wh: &Warehouse, sql: &str) -> Vec<String> {
    let (_, batches) = strata_engine::query(wh, sql).await.expect("query");
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let f: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("format"))
            .collect();
        for r in 0..b.num_rows() {
            out.push(
                f.iter()
                    .map(|x| x.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    out
}

/// Runs one case on a fresh two-thread runtime (each case runs the real pipeline).
fn block_on(case: impl std::future::Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(case)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(16),
        max_shrink_iters: 64,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn engine_equals_reference_under_any_arrival_order(c in case()) {
        let result = block_on(run_case(&c));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }

    #[test]
    fn snapshots_in_any_order_equal_version_order(c in snap_case()) {
        let result = block_on(run_snap_case(&c));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
