//! Parquet input files whose columns are already the streaming table's are taken into the
//! table as they are (copied, not decoded and re-encoded); every other input is written
//! row by row. Either way the table and the flows reading it hold the same rows.

use crate::common;

use deltalake::arrow::array::{ArrayRef, Int64Array, LargeStringArray, StringArray};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// Writes `data/<file>` with columns id, name (as given), seq, op.
fn write_parquet(dir: &Path, file: &str, ids: &[i64], name: ArrayRef, seq: i64, op: &str) {
    common::write_parquet(
        &dir.join("data").join(file),
        vec![
            ("id", Arc::new(Int64Array::from(ids.to_vec()))),
            ("name", name),
            ("seq", Arc::new(Int64Array::from(vec![seq; ids.len()]))),
            ("op", Arc::new(StringArray::from(vec![op; ids.len()]))),
        ],
        &[],
    );
}

/// The `add` actions of every commit of the table at `table_dir`, oldest first.
fn adds(table_dir: &Path) -> Vec<Value> {
    let mut logs: Vec<_> = std::fs::read_dir(table_dir.join("_delta_log"))
        .expect("log")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    logs.sort();
    logs.iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .expect("commit")
                .lines()
                .filter_map(|l| {
                    serde_json::from_str::<Value>(l)
                        .expect("json")
                        .get("add")
                        .cloned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many of the table's data files are byte-for-byte copies of `input`.
fn copies_of(table_dir: &Path, input: &Path) -> usize {
    let want = std::fs::read(input).expect("input");
    adds(table_dir)
        .iter()
        .filter(|a| {
            let path = a["path"].as_str().expect("path");
            std::fs::read(table_dir.join(path)).expect("data file") == want
        })
        .count()
}

const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE raw
AS SELECT * FROM STREAM read_files('data', format => 'parquet');
CREATE OR REFRESH STREAMING TABLE filtered
AS SELECT * FROM STREAM read_files('data', format => 'parquet') WHERE id > 1;
CREATE OR REFRESH STREAMING TABLE rewritten
TBLPROPERTIES ('strata.ingest.reuseFiles' = 'false')
AS SELECT * FROM STREAM read_files('data', format => 'parquet');
CREATE OR REFRESH STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id)
APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (seq, op)
STORED AS SCD TYPE 2;
";

#[tokio::test]
async fn files_in_the_tables_layout_are_copied_in_and_read_like_written_ones() {
    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    let raw = wh_dir.join("default/raw");

    let names: ArrayRef = Arc::new(StringArray::from(vec![Some("ann"), None, Some("cy")]));
    write_parquet(dir.path(), "001.parquet", &[1, 2, 3], names, 10, "U");
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 1");
    assert_eq!(report.flows[0].keys_changed, 3);

    let first = dir.path().join("data/001.parquet");
    assert_eq!(copies_of(&raw, &first), 1, "raw takes the file as it is");
    assert_eq!(
        copies_of(&wh_dir.join("default/filtered"), &first),
        0,
        "a query that drops rows writes what it keeps"
    );
    assert_eq!(
        copies_of(&wh_dir.join("default/rewritten"), &first),
        0,
        "strata.ingest.reuseFiles = false writes the rows"
    );
    let add = &adds(&raw)[0];
    let stats: Value = serde_json::from_str(add["stats"].as_str().expect("stats")).expect("json");
    assert_eq!(stats["numRecords"], 3);
    assert_eq!(stats["minValues"]["id"], 1);
    assert_eq!(stats["maxValues"]["id"], 3);
    assert_eq!(stats["nullCount"]["name"], 1);
    assert_eq!(stats["nullCount"]["id"], 0);
    assert!(stats["minValues"].get("name").is_none(), "no string bounds");

    // Large strings (as Polars writes them) are not the table's type: written row by row.
    let names: ArrayRef = Arc::new(LargeStringArray::from(vec![Some("bea"), Some("dan")]));
    write_parquet(dir.path(), "002.parquet", &[1, 2], names, 20, "U");
    // Same layout as the table: copied in.
    let names: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>]));
    write_parquet(dir.path(), "003.parquet", &[3], names, 30, "D");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    assert_eq!(copies_of(&raw, &dir.path().join("data/002.parquet")), 0);
    assert_eq!(copies_of(&raw, &dir.path().join("data/003.parquet")), 1);

    // A file without rows is taken (not read again) but not copied in.
    let names: ArrayRef = Arc::new(StringArray::from(Vec::<Option<&str>>::new()));
    write_parquet(dir.path(), "004.parquet", &[], names, 40, "U");
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 3");
    assert_eq!(copies_of(&raw, &dir.path().join("data/004.parquet")), 0);
    assert!(report.ingests.iter().any(|i| i.files == ["004.parquet"]));

    let all = "\
+----+------+-----+----+
| id | name | seq | op |
+----+------+-----+----+
| 1  | ann  | 10  | U  |
| 1  | bea  | 20  | U  |
| 2  |      | 10  | U  |
| 2  | dan  | 20  | U  |
| 3  | cy   | 10  | U  |
| 3  |      | 30  | D  |
+----+------+-----+----+";
    for table in ["raw", "rewritten"] {
        let rows = common::query_text(
            &wh,
            &format!("SELECT id, name, seq, op FROM {table} ORDER BY id, seq"),
        )
        .await;
        assert_eq!(rows, all, "{table}");
    }
    // A filter on the key prunes files by their statistics and still finds its rows.
    let rows = common::query_text(&wh, "SELECT id, seq FROM raw WHERE id = 3 ORDER BY seq").await;
    assert_eq!(
        rows,
        "\
+----+-----+
| id | seq |
+----+-----+
| 3  | 10  |
| 3  | 30  |
+----+-----+"
    );
    let rows = common::query_text(&wh, "SELECT count(*) AS n FROM filtered").await;
    assert!(rows.contains("| 4 |"), "filtered keeps ids 2 and 3: {rows}");
    let rows = common::query_text(
        &wh,
        "SELECT id, name, __START_AT, __END_AT FROM t ORDER BY id, __START_AT",
    )
    .await;
    assert_eq!(
        rows,
        "\
+----+------+------------+----------+
| id | name | __START_AT | __END_AT |
+----+------+------------+----------+
| 1  | ann  | 10         | 20       |
| 1  | bea  | 20         |          |
| 2  |      | 10         | 20       |
| 2  | dan  | 20         |          |
| 3  | cy   | 10         | 30       |
+----+------+------------+----------+"
    );
}
