//! A streaming table that joins a table in batch whose columns are not known yet (a
//! materialized view of the same pipeline that has never been computed) waits for the next
//! run, saying so, and runs then.

use crate::common;
use strata_engine::Warehouse;

#[tokio::test]
async fn a_join_with_a_table_without_columns_waits_for_the_next_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in [
        ("data/cust/1.csv", "id,tier\n1,gold\n2,silver\n"),
        ("data/orders/1.csv", "oid,cid\n10,1\n11,2\n"),
    ] {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    let pipeline = dir.path().join("pipeline.sql");
    std::fs::write(
        &pipeline,
        "CREATE OR REFRESH STREAMING TABLE cust_raw AS SELECT * FROM STREAM read_files('data/cust',
           format => 'csv', header => true, schema => 'id INT, tier STRING');
         CREATE MATERIALIZED VIEW tiers AS SELECT id, tier FROM cust_raw;
         CREATE OR REFRESH STREAMING TABLE orders AS SELECT o.oid, t.tier
           FROM STREAM read_files('data/orders', format => 'csv', header => true,
                                  schema => 'oid INT, cid INT') o
           LEFT JOIN tiers t ON t.id = o.cid;",
    )
    .expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let first = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 1");
    assert_eq!(
        first.waiting,
        ["default.orders: it joins default.tiers, which has no columns yet"]
    );
    assert!(!dir.path().join("warehouse/default/orders").exists());
    let second = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    assert!(second.waiting.is_empty(), "{:?}", second.waiting);
    let rows = common::query_text(&wh, "SELECT oid, tier FROM orders ORDER BY oid").await;
    assert!(rows.contains("| 10  | gold   |"), "{rows}");
    assert!(rows.contains("| 11  | silver |"), "{rows}");
}
