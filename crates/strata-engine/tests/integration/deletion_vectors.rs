//! Targets with `delta.enableDeletionVectors = true`: a run marks the rows it replaces as
//! deleted in their files' deletion vectors instead of rewriting the files, reads see the
//! rows that remain, and the change feed (and a flow reading it) is the same as without.

use crate::common;

use serde_json::Value;
use std::path::Path;
use strata_engine::Warehouse;

const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data', format => 'csv',
  header => true, schema => 'id BIGINT, v STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE t TBLPROPERTIES ('delta.enableDeletionVectors' = 'true');
CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id) APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE s TBLPROPERTIES ('delta.enableDeletionVectors' = 'true');
CREATE FLOW fs AS AUTO CDC INTO s FROM STREAM(raw) KEYS (id) APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq COLUMNS * EXCEPT (op, seq);
CREATE OR REFRESH STREAMING TABLE gold;
CREATE FLOW fg AS AUTO CDC INTO gold FROM STREAM(s) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete' SEQUENCE BY _commit_version
COLUMNS * EXCEPT (_change_type, _commit_version, _commit_timestamp) STORED AS SCD TYPE 2;
";

/// The `add` (or `remove`) actions of commit `version` of the table at `table`.
fn actions(table: &Path, version: u64, kind: &str) -> Vec<Value> {
    let log = std::fs::read_to_string(table.join(format!("_delta_log/{version:020}.json")))
        .expect("commit file");
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get(kind).cloned())
        .collect()
}

fn paths(actions: &[Value]) -> Vec<&str> {
    let mut p: Vec<&str> = actions.iter().filter_map(|a| a["path"].as_str()).collect();
    p.sort();
    p
}

/// A folder with the pipeline, its warehouse and `t`'s folder, after run 1 delivered keys
/// `0..n` (value `a`, sequence 1); the paths of the files run 1 added to `t`.
async fn loaded(
    n: i64,
) -> (
    tempfile::TempDir,
    Warehouse,
    std::path::PathBuf,
    Vec<String>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    std::fs::write(dir.path().join("pipeline.sql"), PIPELINE).expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let t = dir.path().join("warehouse/default/t");
    let rows: String = (0..n).map(|i| format!("{i},a,U,1\n")).collect();
    deliver(&dir, &wh, "001.csv", rows).await;
    let first = paths(&actions(&t, 1, "add"))
        .into_iter()
        .map(str::to_string)
        .collect();
    (dir, wh, t, first)
}

/// Writes `data/<file>` (CSV rows after the header) and runs the pipeline.
async fn deliver(dir: &tempfile::TempDir, wh: &Warehouse, file: &str, rows: String) {
    let csv = format!("id,v,op,seq\n{rows}");
    std::fs::write(dir.path().join("data").join(file), csv).expect("write");
    strata_engine::run_pipeline_file(&dir.path().join("pipeline.sql"), wh)
        .await
        .expect("run");
}

async fn count(wh: &Warehouse, sql: &str) -> String {
    let text = common::query_text(wh, sql).await;
    text.lines().nth(3).unwrap_or_default().to_string()
}

#[tokio::test]
async fn replaced_rows_are_marked_in_deletion_vectors_not_rewritten() {
    // Run 1: keys 0..1000 (t version 1).
    let (dir, wh, t, first) = loaded(1000).await;
    assert_eq!(first.len(), 1);

    // Run 2 (t version 2): keys 10..20 change, key 5 is deleted, key 7 gets a late event.
    let mut rows: String = (10..20).map(|i| format!("{i},b,U,2\n")).collect();
    rows.push_str("5,a,D,2\n7,z,U,0\n");
    deliver(&dir, &wh, "002.csv", rows).await;
    let removed = actions(&t, 2, "remove");
    let added = actions(&t, 2, "add");
    assert_eq!(
        paths(&removed),
        vec![first[0].as_str()],
        "run 1's file is replaced..."
    );
    let marked: Vec<&Value> = added
        .iter()
        .filter(|a| a["path"] == first[0].as_str())
        .collect();
    assert_eq!(marked.len(), 1, "...by itself with a deletion vector");
    let dv = &marked[0]["deletionVector"];
    assert_eq!(dv["storageType"], "i");
    assert_eq!(
        dv["cardinality"], 12,
        "the old rows of keys 5, 7 and 10..20"
    );
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM t").await,
        "| 1011 |",
        "1000 + 10 new versions + key 7's late one"
    );
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM t WHERE __END_AT IS NULL").await,
        "| 999 |"
    );
    let key7 = common::query_text(
        &wh,
        "SELECT v, __START_AT, __END_AT FROM t WHERE id = 7 ORDER BY __START_AT",
    )
    .await;
    assert!(key7.contains("| z | 0          | 1        |"), "{key7}");
    assert!(key7.contains("| a | 1          |          |"), "{key7}");

    // Run 3 (t version 3): key 10 changes again. Its rows are in run 2's new file; its row
    // in run 1's file is deleted already, so that file is left as it is.
    deliver(&dir, &wh, "003.csv", "10,c,U,3\n".into()).await;
    let run2_new: Vec<&str> = paths(&added)
        .into_iter()
        .filter(|p| *p != first[0])
        .collect();
    assert_eq!(paths(&actions(&t, 3, "remove")), run2_new);
    let key10 = common::query_text(&wh, "SELECT v FROM t WHERE id = 10 ORDER BY __START_AT").await;
    assert_eq!(
        key10.lines().filter(|l| l.starts_with("| ")).count(),
        4,
        "{key10}"
    );
    assert!(key10.contains("| c |"), "{key10}");

    // The SCD1 target and the gold history built from its change feed.
    assert_eq!(count(&wh, "SELECT count(*) AS n FROM s").await, "| 999 |");
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM s WHERE v = 'b'").await,
        "| 9 |"
    );
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM gold WHERE __END_AT IS NULL").await,
        "| 999 |"
    );
    let gold10 =
        common::query_text(&wh, "SELECT v FROM gold WHERE id = 10 ORDER BY __START_AT").await;
    let vs: Vec<&str> = gold10
        .lines()
        .filter(|l| l.starts_with("| ") && !l.contains(" v "))
        .collect();
    assert_eq!(vs, vec!["| a |", "| b |", "| c |"], "{gold10}");
    let deleted = common::query_text(
        &wh,
        "SELECT count(*) AS n FROM gold WHERE id = 5 AND __END_AT IS NOT NULL",
    )
    .await;
    assert!(deleted.contains("| 1 |"), "{deleted}");
}

/// A vector over 1 KiB goes to a deletion-vector file beside the data, not into the log;
/// the next run reads it back from there and adds to it.
#[tokio::test]
async fn large_vectors_are_kept_in_deletion_vector_files() {
    let (dir, wh, t, first) = loaded(10_000).await;
    let vector = |version: u64| {
        actions(&t, version, "add")
            .into_iter()
            .find(|a| a["path"] == first[0].as_str())
            .map(|a| a["deletionVector"].clone())
            .expect("run 1's file marked")
    };
    let vector_files = || {
        let mut names: Vec<String> = std::fs::read_dir(&t)
            .expect("table folder")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("deletion_vector_") && n.ends_with(".bin"))
            .collect();
        names.sort();
        names
    };
    // Every tenth key from `first` gets value `v` at sequence `seq`.
    let every_tenth = |first: i64, v: &str, seq: u32| -> String {
        (first..10_000)
            .step_by(10)
            .map(|i| format!("{i},{v},U,{seq}\n"))
            .collect()
    };
    // Run 2: every tenth key changes, 1000 rows of run 1's file go.
    deliver(&dir, &wh, "002.csv", every_tenth(0, "b", 2)).await;
    let dv = vector(2);
    assert_eq!(dv["storageType"], "u", "{dv}");
    assert_eq!(dv["cardinality"], 1000);
    assert_eq!(vector_files().len(), 1);
    // Run 3: another 1000 keys of the same file: its vector is read back and grows.
    deliver(&dir, &wh, "003.csv", every_tenth(5, "c", 3)).await;
    let dv = vector(3);
    assert_eq!(dv["storageType"], "u", "{dv}");
    assert_eq!(
        dv["cardinality"], 2000,
        "run 2's deletes kept, run 3's added"
    );
    assert_eq!(vector_files().len(), 2, "one file per run that marks");
    assert_eq!(count(&wh, "SELECT count(*) AS n FROM t").await, "| 12000 |");
    assert_eq!(
        count(
            &wh,
            "SELECT count(*) AS n FROM t WHERE __END_AT IS NULL AND v = 'a'"
        )
        .await,
        "| 8000 |"
    );
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM s WHERE v = 'a'").await,
        "| 8000 |"
    );
}

/// A file whose rows would be mostly deleted (here 30 of 100, over the quarter at which
/// strata stops growing a vector) is rewritten without them instead.
#[tokio::test]
async fn a_mostly_deleted_file_is_rewritten_without_a_vector() {
    let (dir, wh, t, first) = loaded(100).await;
    let rows: String = (0..30).map(|i| format!("{i},b,U,2\n")).collect();
    deliver(&dir, &wh, "002.csv", rows).await;
    assert_eq!(
        paths(&actions(&t, 2, "remove")),
        first.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let added = actions(&t, 2, "add");
    assert!(
        added.iter().all(|a| a["path"] != first[0].as_str()),
        "{added:?}"
    );
    assert!(
        added
            .iter()
            .all(|a| a.get("deletionVector").is_none_or(Value::is_null)),
        "no vector: {added:?}"
    );
    assert_eq!(count(&wh, "SELECT count(*) AS n FROM t").await, "| 130 |");
    assert_eq!(
        count(
            &wh,
            "SELECT count(*) AS n FROM t WHERE __END_AT IS NULL AND v = 'b'"
        )
        .await,
        "| 30 |"
    );
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM t WHERE __END_AT IS NULL").await,
        "| 100 |"
    );
}

/// Turning the property on in an existing target's TBLPROPERTIES (here one created with it
/// off) enables deletion vectors from the next run on (the protocol is upgraded); setting
/// it to false again makes later runs rewrite files, the vectors already written staying
/// valid.
#[tokio::test]
async fn the_property_can_be_turned_on_and_off_for_an_existing_target() {
    let with = "'delta.enableDeletionVectors' = 'true'";
    let without = "'delta.enableDeletionVectors' = 'false'";
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline = dir.path().join("pipeline.sql");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let t = dir.path().join("warehouse/default/t");
    let run = |sql: String, file: &str, rows: String| {
        std::fs::write(&pipeline, sql).expect("write");
        let csv = format!("id,v,op,seq\n{rows}");
        std::fs::write(dir.path().join("data").join(file), csv).expect("write");
        strata_engine::run_pipeline_file(&pipeline, &wh)
    };
    let rows: String = (0..1000).map(|i| format!("{i},a,U,1\n")).collect();
    run(PIPELINE.replace(with, without), "001.csv", rows)
        .await
        .expect("run 1");
    let report = run(PIPELINE.to_string(), "002.csv", "10,b,U,2\n".into())
        .await
        .expect("run 2");
    let f = report.flows.iter().find(|f| f.flow == "f").expect("flow f");
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("deletion vectors enabled")),
        "{:?}",
        f.notes
    );
    let version = std::fs::read_dir(t.join("_delta_log"))
        .expect("log")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json"))
        })
        .count() as u64
        - 1;
    let marked = actions(&t, version, "add")
        .iter()
        .filter(|a| a.get("deletionVector").is_some_and(|d| !d.is_null()))
        .count();
    assert_eq!(marked, 1, "run 2 marked the row of key 10 in run 1's file");
    let off = PIPELINE.replace(with, without);
    run(off, "003.csv", "500,c,U,3\n".into())
        .await
        .expect("run 3");
    assert_eq!(count(&wh, "SELECT count(*) AS n FROM t").await, "| 1002 |");
    assert_eq!(
        count(&wh, "SELECT count(*) AS n FROM t WHERE __END_AT IS NULL").await,
        "| 1000 |"
    );
    let v = common::query_text(
        &wh,
        "SELECT v FROM t WHERE id IN (10, 500) AND __END_AT IS NULL ORDER BY id",
    )
    .await;
    assert!(v.contains("| b |") && v.contains("| c |"), "{v}");
}

/// AUTO CDC targets are created with deletion vectors unless their TBLPROPERTIES turn them
/// off; a target partitioned by its start (written through delta-rs) and the append-only
/// tables get none, so their protocol stays readable by every Delta reader.
#[tokio::test]
async fn targets_get_deletion_vectors_unless_told_otherwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    std::fs::write(
        dir.path().join("data/001.csv"),
        "id,v,op,seq\n1,a,U,1\n2,a,U,1\n",
    )
    .expect("write");
    let pipeline = "\
CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data', format => 'csv',
  header => true, schema => 'id BIGINT, v STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE plain;
CREATE FLOW f1 AS AUTO CDC INTO plain FROM STREAM(raw) KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE off TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');
CREATE FLOW f2 AS AUTO CDC INTO off FROM STREAM(raw) KEYS (id) SEQUENCE BY seq;
CREATE OR REFRESH STREAMING TABLE parted TBLPROPERTIES ('strata.scd.partitionBy' = 'start');
CREATE FLOW f3 AS AUTO CDC INTO parted FROM STREAM(raw) KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2;
";
    std::fs::write(dir.path().join("pipeline.sql"), pipeline).expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let report = strata_engine::run_pipeline_file(&dir.path().join("pipeline.sql"), &wh)
        .await
        .expect("run");
    // The run says so where it created a target with vectors it was not asked for.
    let told: Vec<&str> = report
        .flows
        .iter()
        .filter(|f| f.notes.iter().any(|n| n.contains("with deletion vectors")))
        .map(|f| f.flow.as_str())
        .collect();
    assert_eq!(told, ["f1"]);
    let setting = |table: &str| -> Option<String> {
        let log = dir
            .path()
            .join(format!("warehouse/default/{table}/_delta_log"));
        actions(&log.join(".."), 0, "metaData")[0]["configuration"]["delta.enableDeletionVectors"]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(setting("plain").as_deref(), Some("true"));
    assert_eq!(setting("off").as_deref(), Some("false"));
    assert_eq!(setting("parted"), None);
    assert_eq!(setting("raw"), None);
    assert_eq!(count(&wh, "SELECT count(*) AS n FROM plain").await, "| 2 |");
}

/// A run rewrites every row of a changed key, but its change feed holds only what changed:
/// the version it closed and the one it opened, not the key's older versions rewritten as
/// they were (Delta's own feed leaves a row copied unchanged out too). A flow reading the
/// feed sees the same.
#[tokio::test]
async fn the_change_feed_leaves_out_rows_rewritten_unchanged() {
    // Run 1: keys 0..100 (t version 1); run 2: key 10 gets version b (t version 2).
    let (dir, wh, _t, _) = loaded(100).await;
    deliver(&dir, &wh, "002.csv", "10,b,U,2\n".into()).await;
    // Run 3: key 10 gets version c; its first version (a, closed by run 2) stays as it was.
    deliver(&dir, &wh, "003.csv", "10,c,U,3\n".into()).await;
    let feed = common::query_text(
        &wh,
        "SELECT id, v, __START_AT, __END_AT, _change_type FROM table_changes('t', 3, 3) \
         ORDER BY _change_type, __START_AT",
    )
    .await;
    let body: Vec<&str> = feed
        .lines()
        .skip(3)
        .filter(|l| l.starts_with("| "))
        .collect();
    assert_eq!(
        body,
        [
            "| 10 | b | 2          | 3        | update_postimage |",
            "| 10 | c | 3          |          | update_postimage |",
            "| 10 | b | 2          |          | update_preimage  |",
        ],
        "{feed}"
    );
    let all = count(&wh, "SELECT count(*) AS n FROM t WHERE id = 10").await;
    assert_eq!(all, "| 3 |", "the key's three versions are all there");
}
