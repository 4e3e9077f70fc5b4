//! Informational PRIMARY KEY and FOREIGN KEY constraints of a column list, as Unity Catalog
//! has them: recorded on the Delta table as `strata.constraint.<name>` properties, never
//! enforced (tests/scenarios/ingest/set_and_key_constraints.scn shows a duplicate key kept).

use crate::common;

#[tokio::test]
async fn key_constraints_are_recorded_on_the_table() {
    let (dir, pipeline, _wh_dir, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE orders (\n\
           id BIGINT,\n\
           customer BIGINT CONSTRAINT orders_customer_fk FOREIGN KEY REFERENCES customers (id),\n\
           CONSTRAINT orders_pk PRIMARY KEY (id) RELY\n\
         ) AS SELECT id, customer FROM STREAM read_files('data', format => 'json');\n",
    );
    std::fs::write(
        dir.path().join("data/001.json"),
        "{\"id\": 1, \"customer\": 7}\n{\"id\": 1, \"customer\": 8}\n",
    )
    .expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run");
    let table = wh
        .open_table(&strata_sql::TableName::new(None, "orders"))
        .await
        .expect("open")
        .expect("table");
    let config = table
        .snapshot()
        .expect("state")
        .metadata()
        .configuration()
        .clone();
    let get = |k: &str| config.get(k).map(String::as_str);
    assert_eq!(
        get("strata.constraint.orders_pk"),
        Some("PRIMARY KEY (id)"),
        "{config:?}"
    );
    assert_eq!(
        get("strata.constraint.orders_customer_fk"),
        Some("FOREIGN KEY (customer) REFERENCES customers (id)"),
        "{config:?}"
    );
    let text = common::query_text(&wh, "SELECT count(*) AS n FROM orders").await;
    assert!(text.contains("| 2 |"), "not enforced: {text}");
}
