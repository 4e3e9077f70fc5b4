//! A streaming table's record of the input files it took lives in its commit log; a run reads
//! a cached union of that record up to some version and only the commits after it
//! (`taken.rs`), so that the cost of a run does not grow with the table's age.
//!
//! These tests make the cache decide the outcome: once it is written, the commits it covers
//! are deleted from the log (the table still opens from its checkpoint), so a run that ignored
//! the cache would take the early files again.

use crate::common;
use std::path::Path;

const PIPELINE: &str = "CREATE OR REFRESH STREAMING TABLE raw \
     TBLPROPERTIES ('delta.checkpointInterval' = '5') \
     AS SELECT * FROM STREAM read_files('data', format => 'json');\n";

/// More runs than `taken::CACHE_AFTER` (32), one new file each.
const RUNS: usize = 36;

fn cache_files(wh_dir: &Path) -> Vec<String> {
    let dir = wh_dir.join("_strata/default/raw/taken/strata.files");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A project whose streaming table has taken `RUNS` files, one per run, and cached its
/// record: (its directory, the pipeline, the warehouse directory, the warehouse, `data/`).
async fn table_with_a_cache() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    strata_engine::Warehouse,
    std::path::PathBuf,
) {
    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    let data = dir.path().join("data");
    for n in 1..=RUNS {
        common::run_adding(&pipeline, &wh, &data, n).await;
    }
    // Run 33 found the table at version 32 (its creation and 32 appends), read those 33
    // commits and cached the union up to version 32.
    let cached = cache_files(&wh_dir);
    assert_eq!(cached, vec![format!("{:020}.json", 32)], "{cached:?}");
    (dir, pipeline, wh_dir, wh, data)
}

#[tokio::test]
async fn runs_read_the_cached_record_and_only_the_commits_after_it() {
    let (_dir, pipeline, wh_dir, wh, data) = table_with_a_cache().await;

    // Remove the commits the cache covers, up to the last checkpoint at or below it (30),
    // their commit info is gone, only the cache still says which files they took.
    let log = wh_dir.join("default/raw/_delta_log");
    for v in 0..30 {
        std::fs::remove_file(log.join(format!("{v:020}.json"))).expect("remove commit");
    }
    common::run_adding(&pipeline, &wh, &data, RUNS + 1).await;
    let text = common::query_text(
        &wh,
        "SELECT count(*) AS n, count(DISTINCT id) AS d FROM raw",
    )
    .await;
    assert!(text.contains(&format!("| {0} | {0} |", RUNS + 1)), "{text}");

    // A run with nothing new reads the cache and the few commits after it.
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("no-op run");
    assert!(report.ingests[0].files.is_empty());
}

#[tokio::test]
async fn a_cache_left_by_a_dropped_table_is_not_used_for_its_successor() {
    let (dir, pipeline, wh_dir, wh, data) = table_with_a_cache().await;
    // The table is dropped by hand (its cache under _strata stays) and created again by the
    // next run, while one of the old files is away: the new table takes all the others.
    std::fs::remove_dir_all(wh_dir.join("default/raw")).expect("drop the table");
    let away = dir.path().join("005.json");
    std::fs::rename(data.join("005.json"), &away).expect("move");
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run after the drop");
    assert_eq!(report.ingests[0].files.len(), RUNS - 1);
    // Grow the new table past the old cache's version, so that the old cache (which lists
    // 005.json) is a candidate, then bring the file back: the new table never took it.
    for n in RUNS + 1..=RUNS + 33 {
        common::run_adding(&pipeline, &wh, &data, n).await;
    }
    std::fs::rename(&away, data.join("005.json")).expect("move back");
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run with the file back");
    assert_eq!(report.ingests[0].files, vec!["005.json".to_string()]);
    let text = common::query_text(
        &wh,
        "SELECT count(*) AS n, count(DISTINCT id) AS d FROM raw",
    )
    .await;
    assert!(
        text.contains(&format!("| {0} | {0} |", RUNS + 33)),
        "{text}"
    );
}

#[tokio::test]
async fn a_full_refresh_deletes_the_cache_and_takes_every_file_again() {
    let (_dir, pipeline, wh_dir, wh, _data) = table_with_a_cache().await;
    let options = strata_engine::RunOptions {
        full_refresh: Some(Vec::new()),
        ..Default::default()
    };
    let report = strata_engine::run_pipeline(&pipeline, &wh, &options)
        .await
        .expect("full refresh");
    assert_eq!(report.ingests[0].files.len(), RUNS);
    assert!(
        cache_files(&wh_dir).is_empty(),
        "{:?}",
        cache_files(&wh_dir)
    );
    let text = common::query_text(&wh, "SELECT count(*) AS n FROM raw").await;
    assert!(text.contains(&format!("| {RUNS} |")), "{text}");
}
