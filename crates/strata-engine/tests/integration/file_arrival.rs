//! A file that arrives while a run is under way (after the run planned its inputs) waits for
//! the next run: an inferred schema is inferred from exactly the files the run takes, so a
//! late file's new column is neither dropped nor read against columns that lack it.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use strata_engine::{Progress, ProgressFn, RunOptions};

#[tokio::test]
async fn a_file_arriving_during_a_run_waits_for_the_next_one() {
    let (dir, pipeline, _, wh) = common::project(
        "CREATE OR REFRESH STREAMING TABLE raw \
         AS SELECT * FROM STREAM read_files('data', format => 'json');\n",
    );
    let data = dir.path().join("data");
    std::fs::write(data.join("001.json"), "{\"id\": 1, \"name\": \"a\"}\n").expect("write");

    // Everything is planned before the first dataset starts: write the late file then.
    let written = Arc::new(AtomicBool::new(false));
    let late = data.join("002.json");
    let hook = {
        let written = written.clone();
        ProgressFn(Arc::new(move |p| {
            if matches!(p, Progress::Started { .. }) && !written.swap(true, Ordering::SeqCst) {
                std::fs::write(&late, "{\"id\": 2, \"name\": \"b\", \"city\": \"Oslo\"}\n")
                    .expect("write");
            }
        }))
    };
    let options = RunOptions {
        progress: Some(hook),
        ..Default::default()
    };
    let report = strata_engine::run_pipeline(&pipeline, &wh, &options)
        .await
        .expect("run 1");
    assert!(written.load(Ordering::SeqCst));
    assert_eq!(report.ingests[0].files, vec!["001.json".to_string()]);

    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    assert_eq!(report.ingests[0].files, vec!["002.json".to_string()]);
    let text = common::query_text(&wh, "SELECT id, name, city FROM raw ORDER BY id").await;
    assert!(text.contains("| 1  | a    |      |"), "{text}");
    assert!(text.contains("| 2  | b    | Oslo |"), "{text}");
}
