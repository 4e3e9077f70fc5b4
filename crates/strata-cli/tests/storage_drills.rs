//! Drills on the real binary with a warehouse on a small tmpfs: the disk fills up at many
//! points of a run, and the warehouse turns read-only. Each failed run exits non-zero with a
//! message that says what happened (`No space left on device`, `Read-only file system`) and
//! where (a path in the warehouse); every table is left at a version it had (the dataset
//! that failed, and those after it, at their previous version; a dataset that finished
//! before the disk filled keeps its commit, as docs/operations.md says) and stays readable;
//! once there is room again, a run converges to what a twin warehouse on an ordinary disk,
//! fed the same input, holds.
//!
//! These tests mount file systems: they need root and `mount`, and fail (never pass
//! silently) without them.

mod common;

use common::{delta_version, stderr, Project, Tmpfs};
use std::collections::BTreeMap;
use std::path::Path;

const PIPELINE: &str = concat!(
    common::events_and_history!(),
    r#"
CREATE OR REFRESH MATERIALIZED VIEW names AS
SELECT name, count(*) AS n FROM people_history WHERE __END_AT IS NULL GROUP BY name;
"#
);

/// Each table and the query that reads all of it.
const TABLES: [(&str, &str); 3] = [
    (
        "events_raw",
        "SELECT eid, id, name, op, seq FROM events_raw",
    ),
    ("people_history", "SELECT * FROM people_history"),
    ("names", "SELECT * FROM names"),
];

/// Free bytes left on the warehouse's file system before each failing run: the run fills
/// the rest at a different point each time (a data file, a change-data file, a commit's
/// JSON, the AUTO CDC event store, the event log).
const FILL_LEVELS: [u64; 17] = [
    0, 4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768, 36864, 40960, 45056, 49152, 53248,
    57344, 61440, 65536,
];

/// What a table is: its Delta version and its rows.
type Snapshot = BTreeMap<&'static str, (Option<u64>, Vec<String>)>;

#[test]
fn a_full_disk_fails_the_run_clearly_and_keeps_every_table_at_a_version_it_had() {
    let p = Project::new(PIPELINE);
    let fs = Tmpfs::mount(&p.path("warehouse"), "4m");
    let mut batch = 0;
    add_batch(&p, &mut batch);
    p.ok(&["run", "pipeline.sql"]);
    let mut before = snapshot(&p);

    let mut failed_at = Vec::new();
    for leave in FILL_LEVELS {
        add_batch(&p, &mut batch);
        fs.fill(leave);
        let clock = std::time::Instant::now();
        let out = p.run();
        let took = clock.elapsed().as_secs_f64();
        if out.status.success() {
            // It fitted: what it wrote is checked by the next run and the twin.
            fs.free();
            before = snapshot(&p);
            continue;
        }
        let error = error_line(&out);
        assert_names_the_cause(&out, &error, "No space left on device", &fs.dir);
        let after = snapshot(&p);
        assert_each_table_kept_a_version(&before, &after, &error);
        assert_commits_are_whole(&p);
        failed_at.push(format!("{leave} ({took:.1} s): {error}"));
        // Room again: the next run finishes the work.
        fs.free();
        p.ok(&["run", "pipeline.sql"]);
        before = snapshot(&p);
    }
    println!(
        "failed runs (bytes left (time): error):\n{}",
        failed_at.join("\n")
    );
    assert!(
        failed_at.len() >= 3,
        "the disk should have filled during at least 3 runs: {failed_at:?}"
    );
    assert_converges_like_a_twin(&p);
    let v = p.ok(&["validate", "people_history"]);
    assert!(v.contains("ok"), "{v}");
}

#[test]
fn a_read_only_warehouse_fails_the_run_clearly_and_still_answers_queries() {
    let p = Project::new(PIPELINE);
    let fs = Tmpfs::mount(&p.path("warehouse"), "16m");
    let mut batch = 0;
    add_batch(&p, &mut batch);
    p.ok(&["run", "pipeline.sql"]);
    let before = snapshot(&p);

    fs.remount("ro");
    add_batch(&p, &mut batch);
    let out = p.run();
    assert!(
        !out.status.success(),
        "a run on a read-only warehouse succeeded"
    );
    let error = error_line(&out);
    println!("the run on the read-only warehouse: {error}");
    assert_names_the_cause(&out, &error, "Read-only file system", &fs.dir);
    let after = snapshot(&p);
    assert_eq!(after, before, "a failed run changed a table");
    assert_each_table_kept_a_version(&before, &after, &error);
    // What only reads still works.
    let v = p.ok(&["validate", "people_history"]);
    assert!(v.contains("ok"), "{v}");
    p.ok(&["events"]);

    fs.remount("rw");
    p.ok(&["run", "pipeline.sql"]);
    assert_converges_like_a_twin(&p);
}

/// Writes the next input file: 200 upserts and deletes over 50 keys, with event ids and
/// sequence values unique across files (so that any order of runs folds to one result).
fn add_batch(p: &Project, batch: &mut u64) {
    let mut text = String::new();
    for i in 0..200u64 {
        let eid = *batch * 200 + i;
        let op = if eid % 11 == 5 { "D" } else { "U" };
        text.push_str(&format!(
            "{{\"eid\": {eid}, \"id\": {}, \"name\": \"n{}\", \"op\": \"{op}\", \"seq\": {eid}}}\n",
            eid * 7 % 50,
            eid % 9
        ));
    }
    p.file(&format!("data/cdc/b{batch:04}.json"), &text);
    *batch += 1;
}

/// Every table's version and rows (read with `strata query`: a failed run must leave each
/// of them readable).
fn snapshot(p: &Project) -> Snapshot {
    TABLES
        .iter()
        .map(|&(table, sql)| {
            let version = delta_version(&p.path("warehouse/default").join(table));
            (table, (version, p.sorted_csv(sql)))
        })
        .collect()
}

/// The `error:` line the CLI ends with.
fn error_line(out: &std::process::Output) -> String {
    let err = stderr(out);
    err.lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in\n{err}"))
        .to_string()
}

/// The run failed as a storage error (exit code 4), saying `cause` and where in the
/// warehouse, with no internal error and no panic of strata's own.
fn assert_names_the_cause(out: &std::process::Output, error: &str, cause: &str, wh: &Path) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(4), "exit code of: {err}");
    assert!(error.contains(cause), "`{cause}` not said: {error}");
    let wh = wh.display().to_string();
    assert!(
        error.contains(&wh),
        "the warehouse path {wh} not named: {error}"
    );
    assert!(!err.contains("internal error"), "{err}");
    assert!(!err.contains("panicked"), "a panic: {err}");
}

/// Each table is at the version it had, with the same rows, or one version on (its dataset
/// finished before the disk filled); at least one table did not move (the run failed
/// somewhere).
fn assert_each_table_kept_a_version(before: &Snapshot, after: &Snapshot, error: &str) {
    let mut unmoved = 0;
    for (table, (version, rows)) in after {
        let (old_version, old_rows) = &before[table];
        if version == old_version {
            assert_eq!(
                rows, old_rows,
                "{table}: same version, other rows ({error})"
            );
            unmoved += 1;
        } else {
            assert_eq!(
                *version,
                old_version.map(|v| v + 1),
                "{table}: from version {old_version:?} to {version:?} in one failed run ({error})"
            );
        }
    }
    assert!(
        unmoved > 0,
        "every table moved, yet the run failed: {error}"
    );
    // Each run has a new input file: the first dataset either commits or fails. So an error
    // of the event log (which fails on the same disk when the run's records are written)
    // with no table moved hides the error of the dataset that failed.
    assert!(
        unmoved < after.len() || !error.starts_with("error: writing the event log"),
        "no table moved, yet the error is the event log's, not the failed dataset's: {error}"
    );
}

/// Every commit file of every Delta table in the warehouse (tables, event stores, the event
/// log) is whole: each of its lines is JSON. A commit cut short by the full disk must not
/// be left under a version's name.
fn assert_commits_are_whole(p: &Project) {
    for file in common::walk(&p.path("warehouse")) {
        let in_log = file
            .parent()
            .is_some_and(|d| d.file_name().is_some_and(|n| n == "_delta_log"));
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let is_commit = name
            .strip_suffix(".json")
            .is_some_and(|v| v.parse::<u64>().is_ok());
        if !(in_log && is_commit) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("commit file");
        assert!(!text.trim().is_empty(), "{}: empty commit", file.display());
        for line in text.lines() {
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_ok(),
                "{}: a commit cut short: {line}",
                file.display()
            );
        }
    }
}

/// A twin on an ordinary disk, fed all the same input in one run, holds the same tables.
fn assert_converges_like_a_twin(p: &Project) {
    let twin = Project::new(PIPELINE);
    p.copy_input_to(&twin);
    twin.ok(&["run", "pipeline.sql"]);
    for (table, sql) in TABLES {
        assert_eq!(
            p.sorted_csv(sql),
            twin.sorted_csv(sql),
            "{table}: the warehouse that failed and its twin differ"
        );
    }
}
