//! A run killed while creating a table can leave the table's `_delta_log` folder without a
//! commit (empty, or holding a writer's temporary file). That is no table yet: queries of
//! the other tables work, and the next run creates it.

use crate::common;

#[tokio::test]
async fn a_log_folder_without_a_commit_is_no_table_yet() {
    let (dir, pipeline, wh_dir, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'json', schema => 'id INT, seq INT');\n\
         CREATE OR REFRESH STREAMING TABLE latest;\n\
         CREATE FLOW f AS AUTO CDC INTO latest FROM STREAM(raw) KEYS (id) SEQUENCE BY seq;\n",
    );
    std::fs::write(
        dir.path().join("data/001.json"),
        "{\"id\": 1, \"seq\": 1}\n",
    )
    .expect("write");
    // What a kill between creating the folder and renaming the first commit into it leaves.
    let log = wh_dir.join("default/latest/_delta_log");
    std::fs::create_dir_all(&log).expect("mkdir");
    std::fs::write(log.join("00000000000000000000.json#1"), "{\"commitInfo\"").expect("write");
    let (_, tables) = strata_engine::query(&wh, "SHOW TABLES")
        .await
        .expect("query");
    let listed = deltalake::arrow::util::pretty::pretty_format_batches(&tables)
        .expect("format")
        .to_string();
    assert!(
        !listed.contains("latest"),
        "a table without a commit: {listed}"
    );
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("the run creates the table");
    assert_eq!(
        common::query_text(&wh, "SELECT * FROM latest").await,
        "+----+-----+\n| id | seq |\n+----+-----+\n| 1  | 1   |\n+----+-----+"
    );
}
