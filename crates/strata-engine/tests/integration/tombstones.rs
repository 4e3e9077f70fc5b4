//! `pipelines.cdc.tombstoneGCThresholdInSeconds` (R9, `tombstones.rs`): an SCD type 1
//! target forgets a delete once it is older than the threshold, so a late event older than
//! the delete brings its key back; an SCD type 2 target keeps its deletes (they end versions
//! of its history) and its runs say the property is not acted on there.

use crate::common;
use strata_engine::Warehouse;

/// A pipeline folder with one source (`id, v, op, seq`) and the target `t`, stored as
/// `stored_as`, with the threshold `threshold`.
struct Setup {
    dir: tempfile::TempDir,
    wh: Warehouse,
}

impl Setup {
    fn new(stored_as: &str, threshold: &str) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
        std::fs::write(
            dir.path().join("pipeline.sql"),
            format!(
                "CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data',
                   format => 'csv', header => true, schema => 'id INT, v STRING, op STRING, seq INT');
                 CREATE OR REFRESH STREAMING TABLE t
                   TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '{threshold}');
                 CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id)
                   APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
                   STORED AS {stored_as};"
            ),
        )
        .expect("write");
        let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
        Setup { dir, wh }
    }

    /// Delivers `rows` as `file` and runs the pipeline; the flow's notes.
    async fn run(&self, file: &str, rows: &str) -> strata_engine::Result<Vec<String>> {
        let csv = format!("id,v,op,seq\n{rows}");
        std::fs::write(self.dir.path().join("data").join(file), csv).expect("write");
        let report =
            strata_engine::run_pipeline_file(&self.dir.path().join("pipeline.sql"), &self.wh)
                .await?;
        Ok(report
            .flows
            .iter()
            .filter(|f| f.flow == "f")
            .flat_map(|f| f.notes.clone())
            .collect())
    }

    async fn rows(&self, sql: &str) -> String {
        common::query_text(&self.wh, sql).await
    }
}

#[tokio::test]
async fn an_scd1_target_forgets_expired_deletes_and_a_late_event_brings_the_key_back() {
    let s = Setup::new("SCD TYPE 1", "0");
    s.run("001.csv", "1,a,U,1\n1,,D,5\n2,b,U,1\n2,,D,5\n")
        .await
        .expect("run 1");
    assert!(!s.rows("SELECT * FROM t").await.contains("| 1 "));
    // Key 1's delete (processed in run 1) has expired: a late upsert older than it brings
    // the key back. Key 2 is not touched: still deleted.
    let notes = s.run("002.csv", "1,late,U,3\n").await.expect("run 2");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("1 tombstone(s) older than 0 s forgotten")),
        "{notes:?}"
    );
    let rows = s.rows("SELECT id, v FROM t ORDER BY id").await;
    assert!(rows.contains("| 1  | late |"), "{rows}");
    assert!(!rows.contains("| 2 "), "{rows}");
    // An even older late event is placed against the resurrected key as usual: the
    // higher sequence (3) wins.
    s.run("003.csv", "1,older,U,2\n").await.expect("run 3");
    let rows = s.rows("SELECT id, v FROM t ORDER BY id").await;
    assert!(rows.contains("| 1  | late |"), "{rows}");
    // A newer delete hides it again until it expires in turn.
    s.run("004.csv", "1,,D,9\n").await.expect("run 4");
    assert!(!s.rows("SELECT * FROM t").await.contains("| 1 "));
}

#[tokio::test]
async fn within_the_threshold_a_delete_keeps_late_events_out() {
    let s = Setup::new("SCD TYPE 1", "3600");
    s.run("001.csv", "1,a,U,1\n1,,D,5\n").await.expect("run 1");
    let notes = s.run("002.csv", "1,late,U,3\n").await.expect("run 2");
    assert!(notes.iter().all(|n| !n.contains("forgotten")), "{notes:?}");
    assert!(!s.rows("SELECT * FROM t").await.contains("late"));
}

#[tokio::test]
async fn an_scd2_target_keeps_its_deletes_and_says_the_property_is_not_acted_on() {
    let s = Setup::new("SCD TYPE 2", "0");
    s.run("001.csv", "1,a,U,1\n1,,D,5\n").await.expect("run 1");
    let notes = s.run("002.csv", "1,late,U,3\n").await.expect("run 2");
    assert!(
        notes.iter().any(|n| n
            .contains("pipelines.cdc.tombstoneGCThresholdInSeconds is not acted on for default.t")),
        "{notes:?}"
    );
    // The late event splits the closed version; nothing is open.
    let rows = s
        .rows("SELECT count(*) AS n FROM t WHERE __END_AT IS NULL")
        .await;
    assert!(rows.contains("| 0 |"), "{rows}");
}

#[tokio::test]
async fn a_threshold_that_is_not_seconds_is_an_error_before_anything_runs() {
    let s = Setup::new("SCD TYPE 1", "2 days");
    let err = s
        .run("001.csv", "1,a,U,1\n")
        .await
        .expect_err("bad threshold");
    let msg = err.to_string();
    assert!(msg.contains("is not a number of seconds"), "{msg}");
    assert!(!s.dir.path().join("warehouse/default/raw").exists());
}
