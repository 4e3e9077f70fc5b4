//! Parquet input files, read without a declared schema: plain strings (as DuckDB and pyarrow
//! write them) and large strings (as Polars writes them) land in the same `string` column,
//! run after run, and flow on into an SCD type 2 target.

use crate::common;

use deltalake::arrow::array::{ArrayRef, Int64Array, LargeStringArray, StringArray};
use deltalake::arrow::datatypes::DataType;
use std::path::Path;
use std::sync::Arc;
use strata_engine::Warehouse;

/// Writes `data/<file>` with columns id, name (`name` as given), seq.
fn write_parquet(dir: &Path, file: &str, ids: &[i64], name: ArrayRef, seq: i64) {
    common::write_parquet(
        &dir.join("data").join(file),
        vec![
            ("id", Arc::new(Int64Array::from(ids.to_vec()))),
            ("name", name),
            ("seq", Arc::new(Int64Array::from(vec![seq; ids.len()]))),
        ],
        &["id", "seq"],
    );
}

#[tokio::test]
async fn plain_and_large_string_files_feed_one_string_column() {
    for large_first in [false, true] {
        one_then_the_other(large_first).await;
    }
}

/// A plain-string file, then a large-string one (or the other way round).
async fn one_then_the_other(large_first: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline = dir.path().join("pipeline.sql");
    std::fs::write(
        &pipeline,
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'parquet');\n\
         CREATE OR REFRESH STREAMING TABLE t;\n\
         CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id) SEQUENCE BY seq \
         COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;\n",
    )
    .expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");

    let names = |a: Option<&str>, b: Option<&str>, large: bool| -> ArrayRef {
        if large {
            Arc::new(LargeStringArray::from(vec![a, b]))
        } else {
            Arc::new(StringArray::from(vec![a, b]))
        }
    };
    let first = names(Some("ann"), None, large_first);
    write_parquet(dir.path(), "001.parquet", &[1, 2], first, 10);
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 1");
    let second = names(Some("bea"), Some("cy"), !large_first);
    write_parquet(dir.path(), "002.parquet", &[1, 2], second, 20);
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2: the other string layout into the same table");
    assert_eq!(report.flows[0].keys_changed, 2);

    let (schema, _) = strata_engine::query(&wh, "SELECT name FROM raw LIMIT 0")
        .await
        .expect("schema");
    assert!(
        matches!(
            schema.field(0).data_type(),
            DataType::Utf8 | DataType::Utf8View
        ),
        "raw.name is {} (large first: {large_first})",
        schema.field(0).data_type()
    );
    let rows = common::query_text(
        &wh,
        "SELECT id, name, __START_AT, __END_AT FROM t ORDER BY id, __START_AT",
    )
    .await;
    let expected = "\
+----+------+------------+----------+
| id | name | __START_AT | __END_AT |
+----+------+------------+----------+
| 1  | ann  | 10         | 20       |
| 1  | bea  | 20         |          |
| 2  |      | 10         | 20       |
| 2  | cy   | 20         |          |
+----+------+------------+----------+";
    assert_eq!(rows, expected, "large first: {large_first}");
}
