//! Rewriting the target after a batch: a batch that changes 20,000 keys, run from a test
//! thread (a small stack; delta-rs's `replace_where`, used before, walked the key predicate
//! recursively and overflowed), and a batch that rewrites only the files holding its keys.

use crate::common;

use std::path::PathBuf;
use strata_engine::Warehouse;

/// A folder with `data/` and a pipeline: CSV files (id, v, seq) into `raw`, and an AUTO CDC
/// flow from it into `t` keyed by `id` with `stored_as` appended; its warehouse.
fn setup(stored_as: &str) -> (tempfile::TempDir, PathBuf, Warehouse) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline = dir.path().join("pipeline.sql");
    std::fs::write(
        &pipeline,
        format!(
            "CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data', \
             format => 'csv', header => true, schema => 'id BIGINT, v STRING, seq BIGINT');\n\
             CREATE OR REFRESH STREAMING TABLE t;\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id) SEQUENCE BY seq \
             COLUMNS * EXCEPT (seq) {stored_as};\n"
        ),
    )
    .expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    (dir, pipeline, wh)
}

#[tokio::test]
async fn a_batch_changing_20k_keys_runs_on_a_small_stack() {
    let (dir, pipeline, wh) = setup("");
    let n = 20_000;
    for (file, value, seq) in [("001.csv", "a", 1), ("002.csv", "b", 2)] {
        let mut csv = String::from("id,v,seq\n");
        for i in 0..n {
            csv.push_str(&format!("{i},{value},{seq}\n"));
        }
        std::fs::write(dir.path().join("data").join(file), csv).expect("write");
        let report = strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .expect("run");
        assert_eq!(report.flows[0].keys_changed, n);
    }
    let text = common::query_text(&wh, "SELECT v, count(*) AS n FROM t GROUP BY v").await;
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| b") || l.starts_with("| a"))
        .collect();
    assert_eq!(rows, vec![format!("| b | {n} |").as_str()]);
}

/// The paths of the `add` (or `remove`) actions of commit `version` of the table at `table`.
fn actions(table: &std::path::Path, version: u64, kind: &str) -> Vec<String> {
    let log = std::fs::read_to_string(table.join(format!("_delta_log/{version:020}.json")))
        .expect("commit file");
    let mut paths: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get(kind)?.get("path")?.as_str().map(str::to_string))
        .collect();
    paths.sort();
    paths
}

#[tokio::test]
async fn a_batch_rewrites_only_the_files_holding_its_keys() {
    let (dir, pipeline, wh) = setup("STORED AS SCD TYPE 2");
    let target = dir.path().join("warehouse/default/t");
    // Run 1: keys 0..1000; run 2: keys 1000..2000 (new keys: no file holds them);
    // run 3: one change to key 1500, which only run 2's file holds.
    let batches: [(&str, std::ops::Range<i64>, &str, i64); 3] = [
        ("001.csv", 0..1000, "a", 1),
        ("002.csv", 1000..2000, "b", 2),
        ("003.csv", 1500..1501, "c", 3),
    ];
    for (file, ids, value, seq) in batches {
        let mut csv = String::from("id,v,seq\n");
        for i in ids {
            csv.push_str(&format!("{i},{value},{seq}\n"));
        }
        std::fs::write(dir.path().join("data").join(file), csv).expect("write");
        strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .expect("run");
    }
    // Versions of t: 0 created, 1 run 1, 2 run 2, 3 run 3.
    assert!(
        actions(&target, 2, "remove").is_empty(),
        "run 2 rewrote a file"
    );
    let run2_files: Vec<String> = actions(&target, 2, "add");
    assert!(!run2_files.is_empty());
    assert_eq!(
        actions(&target, 3, "remove"),
        run2_files,
        "run 3 removes run 2's files only"
    );
    let text = common::query_text(
        &wh,
        "SELECT count(*) AS n, sum(CASE WHEN __END_AT IS NULL THEN 1 ELSE 0 END) AS open, \
         max(CASE WHEN id = 1500 AND __END_AT IS NULL THEN v END) AS v1500 FROM t",
    )
    .await;
    assert!(text.contains("| 2001 | 2000 | c     |"), "{text}");
}
