//! `pipelines.cdc.tombstoneGCThresholdInSeconds` (R9): accepted on a target, not acted on.
//! strata keeps every tombstone, so even with a threshold of 0 a late event older than a
//! delete does not bring its key back, and each run says the property is not acted on.

use crate::common;
use strata_engine::Warehouse;

#[tokio::test]
async fn tombstones_are_kept_whatever_the_threshold_and_the_run_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline = dir.path().join("pipeline.sql");
    std::fs::write(
        &pipeline,
        "CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data',
           format => 'csv', header => true, schema => 'id INT, v STRING, op STRING, seq INT');
         CREATE OR REFRESH STREAMING TABLE t
           TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '0');
         CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id)
           APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq);",
    )
    .expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let run = |file: &str, rows: &str| {
        let csv = format!("id,v,op,seq\n{rows}");
        std::fs::write(dir.path().join("data").join(file), csv).expect("write");
        strata_engine::run_pipeline_file(&pipeline, &wh)
    };
    run("001.csv", "1,a,U,1\n1,,D,5\n2,b,U,1\n")
        .await
        .expect("run 1");
    // A late upsert older than key 1's delete, in a later run.
    let report = run("002.csv", "1,late,U,3\n").await.expect("run 2");
    let notes = &report
        .flows
        .iter()
        .find(|f| f.flow == "f")
        .expect("f")
        .notes;
    assert!(
        notes.iter().any(|n| n.contains(
            "pipelines.cdc.tombstoneGCThresholdInSeconds is set on default.t but not acted on"
        )),
        "{notes:?}"
    );
    let rows = common::query_text(&wh, "SELECT id, v FROM t ORDER BY id").await;
    assert!(!rows.contains("late"), "{rows}");
    assert!(rows.contains("| 2  | b |"), "{rows}");
}
