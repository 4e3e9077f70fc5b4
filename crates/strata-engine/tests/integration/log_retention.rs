//! A streaming table remembers which input files it took in its Delta commit log (the commit
//! info of each append). Delta writers delete commit files older than the table's log
//! retention once a checkpoint covers them; if that happened to a streaming table, its record
//! of early files would go with them and the next run would take those files again. strata
//! therefore keeps the log of the tables it ingests files into: its commits never clean it up,
//! and new streaming tables say so to other writers (`delta.enableExpiredLogCleanup = false`).
//!
//! Here the retention is one second and a checkpoint comes every second commit, so without
//! that every run would re-ingest the files of runs checkpointed more than a second ago.

use crate::common;

#[tokio::test]
async fn files_taken_long_ago_are_not_taken_again() {
    takes_each_file_once("", "false").await;
}

/// A table whose property allows the clean-up (as tables created before strata set it do
/// not forbid it) still keeps its log under strata's own commits.
#[tokio::test]
async fn strata_commits_keep_the_log_whatever_the_table_says() {
    takes_each_file_once(", 'delta.enableExpiredLogCleanup' = 'true'", "true").await;
}

async fn takes_each_file_once(extra_properties: &str, cleanup_property: &str) {
    let (dir, pipeline, wh_dir, wh) = common::project(&format!(
        "CREATE OR REFRESH STREAMING TABLE raw \
         TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 1 second', \
                        'delta.checkpointInterval' = '2'{extra_properties}) \
         AS SELECT * FROM STREAM read_files('data', format => 'json');\n"
    ));
    let data = dir.path().join("data");
    for run in 1..=6 {
        common::run_adding(&pipeline, &wh, &data, run).await;
        // Let every commit so far age past the one-second retention.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let text = common::query_text(
        &wh,
        "SELECT count(*) AS n, count(DISTINCT id) AS d FROM raw",
    )
    .await;
    assert!(text.contains("| 6 | 6 |"), "{text}");

    let commits = std::fs::read_dir(wh_dir.join("default/raw/_delta_log"))
        .expect("log")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".json"))
        })
        .count();
    assert_eq!(
        commits, 7,
        "the table's creation and six appends are all still in the log"
    );

    let table = wh
        .open_table(&strata_sql::TableName::new(None, "raw"))
        .await
        .expect("open")
        .expect("table");
    let config = table
        .snapshot()
        .expect("state")
        .metadata()
        .configuration()
        .clone();
    assert_eq!(
        config
            .get("delta.enableExpiredLogCleanup")
            .map(String::as_str),
        Some(cleanup_property),
        "{config:?}"
    );
}

/// Tables strata creates get Delta's own checkpoint interval (10, not delta-rs's 100), so
/// opening one reads a checkpoint and at most nine commits: on object storage a run's
/// requests do not grow with the table's age. Event stores too; a table that sets the
/// property keeps its own.
#[tokio::test]
async fn tables_are_checkpointed_every_ten_commits() {
    let (dir, pipeline, wh_dir, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'json');\n\
         CREATE OR REFRESH STREAMING TABLE own TBLPROPERTIES ('delta.checkpointInterval' = '50') \
         AS SELECT * FROM STREAM read_files('data', format => 'json');\n\
         CREATE OR REFRESH STREAMING TABLE dim;\n\
         CREATE FLOW dim_flow AS AUTO CDC INTO dim FROM STREAM(raw) KEYS (id) SEQUENCE BY id \
         STORED AS SCD TYPE 1;\n",
    );
    let data = dir.path().join("data");
    for run in 1..=11 {
        common::run_adding(&pipeline, &wh, &data, run).await;
    }
    // delta-rs checkpoints the tenth commit (version 9).
    let checkpointed = |table: &str| {
        wh_dir
            .join(table)
            .join("_delta_log/00000000000000000009.checkpoint.parquet")
            .exists()
    };
    assert!(checkpointed("default/raw"), "a streaming table");
    assert!(checkpointed("default/dim"), "an AUTO CDC target");
    assert!(
        checkpointed("_strata/default/dim/events"),
        "its event store"
    );
    assert!(
        !checkpointed("default/own"),
        "a table with its own interval"
    );
}
