//! Change-history tables over a source outside the pipeline, written by delta-rs with the
//! change data feed on (updates and deletes write change files, as Spark does), and the
//! table properties strata sets on what it creates (append-only, partitions, clustering).

use crate::common;
use deltalake::arrow::array::{Int32Array, RecordBatch, StringArray};
use deltalake::arrow::datatypes::{DataType as ArrowType, Field, Schema};
use deltalake::kernel::{DataType, StructField};
use deltalake::DeltaTable;
use deltalake::TableProperty;
use std::path::Path;
use std::sync::Arc;

async fn ops(path: &Path) -> DeltaTable {
    std::fs::create_dir_all(path).expect("mkdir");
    let url = url::Url::from_directory_path(path).expect("url");
    DeltaTable::try_from_url(url).await.expect("ops")
}

fn rows(ids: &[i32], cities: &[&str]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", ArrowType::Int32, true),
        Field::new("city", ArrowType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int32Array::from(ids.to_vec())),
            Arc::new(StringArray::from(cities.to_vec())),
        ],
    )
    .expect("batch")
}

const PIPELINE: &str = "CREATE OR REFRESH STREAMING TABLE orders_history AS \
    SELECT * EXCEPT (_commit_timestamp) FROM STREAM table_changes('outside/orders', \
    startingVersion => 0);\n";

#[tokio::test]
async fn an_outside_table_written_by_delta_rs_is_kept_change_by_change() {
    let (dir, pipeline, _, wh) = common::project(PIPELINE);
    let source = dir.path().join("outside").join("orders");
    let table = ops(&source)
        .await
        .create()
        .with_columns(vec![
            StructField::new("id", DataType::INTEGER, true),
            StructField::new("city", DataType::STRING, true),
        ])
        .with_configuration_property(TableProperty::EnableChangeDataFeed, Some("true"))
        .await
        .expect("create");
    let table = table
        .write(vec![rows(&[1, 2], &["Paris", "Rome"])])
        .await
        .expect("insert");
    let (table, _) = table
        .update()
        .with_predicate("id = 1")
        .with_update("city", "'Lyon'")
        .await
        .expect("update");
    let (table, _) = table
        .delete()
        .with_predicate("id = 2")
        .await
        .expect("delete");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 1");
    let sql = "SELECT id, city, _change_type, _commit_version FROM orders_history \
               ORDER BY _commit_version, _change_type, id";
    let expected_first = [
        "| 1  | Paris | insert           | 1               |",
        "| 2  | Rome  | insert           | 1               |",
        "| 1  | Lyon  | update_postimage | 2               |",
        "| 1  | Paris | update_preimage  | 2               |",
        "| 2  | Rome  | delete           | 3               |",
    ];
    let text = common::query_text(&wh, sql).await;
    let body: Vec<&str> = text
        .lines()
        .skip(3)
        .filter(|l| l.starts_with("| "))
        .collect();
    assert_eq!(body, expected_first, "{text}");

    // A write that changes nothing (Lyon to Lyon) is kept as the source recorded it
    // (delta-rs records this one as a delete and an insert); a run takes only what is new.
    let (_table, _) = table
        .update()
        .with_predicate("id = 1")
        .with_update("city", "'Lyon'")
        .await
        .expect("no-op update");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    let text = common::query_text(&wh, sql).await;
    let body: Vec<&str> = text
        .lines()
        .skip(3)
        .filter(|l| l.starts_with("| "))
        .collect();
    let mut expected = expected_first.to_vec();
    expected.extend([
        "| 1  | Lyon  | delete           | 4               |",
        "| 1  | Lyon  | insert           | 4               |",
    ]);
    assert_eq!(body, expected, "{text}");
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 3");
    assert_eq!(report.ingests[0].skipped.as_deref(), Some("no new changes"));

    // The history table is append-only: Delta refuses a delete from any writer.
    let history = wh
        .open_table(&strata_sql::TableName::new(None, "orders_history"))
        .await
        .expect("open")
        .expect("exists");
    let append_only = history
        .snapshot()
        .expect("state")
        .metadata()
        .configuration()
        .get("delta.appendOnly")
        .cloned();
    assert_eq!(append_only.as_deref(), Some("true"));
    let refused = history.delete().with_predicate("id = 1").await;
    assert!(
        refused.is_err(),
        "a delete from the history table went through"
    );
}

#[tokio::test]
async fn partitioned_by_and_cluster_by_reach_the_tables() {
    let (dir, pipeline, _, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw CLUSTER BY (v) AS SELECT * FROM STREAM \
         read_files('data', format => 'json', schema => 'id INT, v STRING, seq INT');\n\
         CREATE OR REFRESH STREAMING TABLE hist PARTITIONED BY (_commit_date) AS \
         SELECT *, CAST(_commit_timestamp AS DATE) AS _commit_date \
         FROM STREAM table_changes('raw', startingVersion => 0);\n\
         CREATE OR REFRESH STREAMING TABLE dim PARTITIONED BY (v);\n\
         CREATE FLOW dim_flow AS AUTO CDC INTO dim FROM STREAM(raw) KEYS (id) SEQUENCE BY seq \
         COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;\n\
         CREATE MATERIALIZED VIEW by_v PARTITIONED BY (v) AS SELECT v, count(*) AS n FROM raw GROUP BY v;\n",
    );
    std::fs::write(
        dir.path().join("data").join("001.json"),
        "{\"id\": 1, \"v\": \"a\", \"seq\": 1}\n{\"id\": 2, \"v\": \"b\", \"seq\": 1}\n",
    )
    .expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run");
    std::fs::write(
        dir.path().join("data").join("002.json"),
        "{\"id\": 1, \"v\": \"b\", \"seq\": 2}\n",
    )
    .expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    let meta = |name: &'static str| {
        let wh = &wh;
        async move {
            let t = wh
                .open_table(&strata_sql::TableName::new(None, name))
                .await
                .expect("open")
                .expect("exists");
            let s = t.snapshot().expect("state");
            let parts: Vec<String> = s.metadata().partition_columns().to_vec();
            let config: std::collections::HashMap<String, String> = s
                .metadata()
                .configuration()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (parts, config)
        }
    };
    let (parts, config) = meta("raw").await;
    assert!(parts.is_empty());
    assert_eq!(
        config
            .get("pipelines.autoOptimize.zOrderCols")
            .map(String::as_str),
        Some("v")
    );
    assert_eq!(meta("hist").await.0, vec!["_commit_date".to_string()]);
    assert_eq!(meta("dim").await.0, vec!["v".to_string()]);
    assert_eq!(meta("by_v").await.0, vec!["v".to_string()]);
    let text = common::query_text(
        &wh,
        "SELECT id, v, __END_AT IS NULL AS open FROM dim ORDER BY id, v",
    )
    .await;
    assert!(text.contains("| 1  | a | false |"), "{text}");
    assert!(text.contains("| 1  | b | true  |"), "{text}");
    // strata optimize orders raw by its clustering column.
    let options = strata_engine::OptimizeOptions {
        tables: vec!["raw".to_string()],
        ..Default::default()
    };
    let optimized = strata_engine::optimize(&wh, &options)
        .await
        .expect("optimize");
    assert_eq!(optimized[0].zorder_by, vec!["v".to_string()]);
}
