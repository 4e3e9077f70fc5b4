//! The event log is opened once per process and kept as each record's commit leaves it: runs
//! in one process and runs from a second warehouse handle (as another process would make)
//! interleave without losing a record, a new event log writes a checkpoint every 10
//! commits, and an event log removed under a kept handle is started afresh.

use crate::common;

use strata_engine::Warehouse;

#[tokio::test]
async fn records_of_interleaved_handles_are_all_kept_and_checkpointed() {
    let (dir, pipeline, wh_dir, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'json', schema => 'id INT');\n\
         CREATE OR REFRESH MATERIALIZED VIEW n AS SELECT count(*) AS n FROM raw;\n",
    );
    let other = Warehouse::open(&wh_dir).expect("second handle");
    let data = dir.path().join("data");
    // Seven runs, alternating handles; two records (the table and the view) each.
    for run in 0..7 {
        std::fs::write(
            data.join(format!("{run:03}.json")),
            format!("{{\"id\": {run}}}\n"),
        )
        .expect("write");
        let handle = if run % 2 == 0 { &wh } else { &other };
        strata_engine::run_pipeline_file(&pipeline, handle)
            .await
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
    }
    let text = common::query_text(
        &wh,
        "SELECT count(*) AS records, count(DISTINCT run_id) AS runs FROM event_log",
    )
    .await;
    assert!(text.contains("| 14      | 7    |"), "{text}");
    assert_eq!(
        common::query_text(&wh, "SELECT n FROM n")
            .await
            .lines()
            .nth(3),
        Some("| 7 |")
    );
    let log = wh_dir.join("_strata/event_log/_delta_log");
    assert!(
        log.join("_last_checkpoint").is_file(),
        "no checkpoint after 14 commits: {:?}",
        std::fs::read_dir(&log).map(|d| d.count())
    );

    // The event log removed while a process keeps its handle: the next run starts a new one.
    std::fs::remove_dir_all(wh_dir.join("_strata/event_log")).expect("remove");
    std::fs::write(data.join("007.json"), "{\"id\": 7}\n").expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run after the event log was removed");
    let text = common::query_text(&wh, "SELECT count(*) AS records FROM event_log").await;
    assert!(text.contains("| 2       |"), "{text}");
}

/// Every table a run commits to names the run in that commit's info (`strata.run`), the id
/// the event log records: streaming tables, AUTO CDC targets, materialized views and
/// point-in-time tables alike.
#[tokio::test]
async fn every_commit_of_a_run_names_the_run() {
    let (dir, pipeline, wh_dir, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'json', schema => 'id INT, v STRING, seq INT');\n\
         CREATE OR REFRESH STREAMING TABLE hist;\n\
         CREATE FLOW h AS AUTO CDC INTO hist FROM STREAM(raw) KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2;\n\
         CREATE OR REFRESH MATERIALIZED VIEW n AS SELECT count(*) AS n FROM raw;\n\
         CREATE OR REFRESH POINT IN TIME TABLE pit KEYS (id) AS OF (1, 2) FROM hist;\n",
    );
    std::fs::write(
        dir.path().join("data/001.json"),
        "{\"id\": 1, \"v\": \"a\", \"seq\": 1}\n{\"id\": 1, \"v\": \"b\", \"seq\": 2}\n",
    )
    .expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run");
    let text = common::query_text(&wh, "SELECT DISTINCT run_id FROM event_log").await;
    let run_id = text
        .lines()
        .nth(3)
        .and_then(|l| l.split('|').nth(1))
        .map(str::trim)
        .expect("one run id")
        .to_string();
    for table in ["raw", "hist", "n", "pit"] {
        let log = wh_dir.join("default").join(table).join("_delta_log");
        let last = std::fs::read_dir(&log)
            .expect("table log")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .max()
            .expect("a commit");
        let commit = std::fs::read_to_string(&last).expect("commit");
        let info = commit
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|a| a.get("commitInfo").cloned())
            .expect("commit info");
        assert_eq!(
            info.get("strata.run").and_then(|v| v.as_str()),
            Some(run_id.as_str()),
            "{table}: {info}"
        );
    }
}
