//! Property tests: random change streams over a small key space, split into random batches
//! delivered in random order (some delivered twice), run through the real engine on real
//! Delta tables, compared after the last run with the reference model of `strata-core`; the
//! SCD2 invariants are checked after every run.
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
}

fn value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![3 => "[ab]".prop_map(Some), 1 => Just(None)]
}

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_flat_map(
        |(scd2, ignore_nulls, track_city)| {
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
                    }
                })
        },
    )
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
         format => 'json', schema => 'id BIGINT, name STRING, city STRING, op STRING, seq BIGINT');\n\
         CREATE OR REFRESH STREAMING TABLE t;\n\
         CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(cdc) KEYS (id)\n",
    );
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

fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "NULL".into())
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
        reference::scd1(&flow, &c.events)
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

async fn run_case(c: &Case) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, pipeline(c)).map_err(|e| e.to_string())?;
    let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
    let mut deliveries: Vec<&Vec<RefEvent>> = c.batches.iter().collect();
    if let Some(r) = c.replay {
        deliveries.push(&c.batches[r]);
    }
    for (i, batch) in deliveries.iter().enumerate() {
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

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(16),
        max_shrink_iters: 64,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn engine_equals_reference_under_any_arrival_order(c in case()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let result = rt.block_on(run_case(&c));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
