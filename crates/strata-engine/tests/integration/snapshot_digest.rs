//! The state digest of a snapshot flow (`digest.rs`) is a cache: a run with it, a run whose
//! digest is missing and a run whose digest is unreadable give the same tables; and runs do
//! diff against it (a digest that lies changes the outcome).

use crate::common;

use std::path::{Path, PathBuf};

const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE deliveries AS SELECT * FROM STREAM read_files('data', \
format => 'json', schema => 'id BIGINT, name STRING, city STRING, v BIGINT');
CREATE OR REFRESH STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM STREAM(deliveries) KEYS (id)
SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS SCD TYPE 2
TRACK HISTORY ON * EXCEPT (city);
";

/// One snapshot version: (version, rows of id, name, city).
type Delivery = (i64, Vec<(i64, &'static str, Option<&'static str>)>);

/// Deliveries, one file per run.
fn runs() -> Vec<Vec<Delivery>> {
    vec![
        vec![(
            10,
            vec![
                (1, "ann", Some("oslo")),
                (2, "bob", None),
                (3, "cy", Some("rome")),
                (4, "dan", Some("nice")),
            ],
        )],
        // Changed name (2), changed untracked city (4: to NULL), removed (3), new (5).
        vec![(
            20,
            vec![
                (1, "ann", Some("oslo")),
                (2, "bo", None),
                (4, "dan", None),
                (5, "eve", Some("bonn")),
            ],
        )],
        // A late version, then a newer one in the same run.
        vec![
            (
                15,
                vec![(1, "ann", Some("oslo")), (2, "bob", None), (3, "cy", None)],
            ),
            (
                30,
                vec![(2, "bo", None), (4, "dan", None), (6, "fay", None)],
            ),
        ],
        // A redelivery of the newest version, changed, then a new one.
        vec![
            (30, vec![(2, "bo", None), (6, "fay", Some("ulm"))]),
            (
                40,
                vec![(2, "bo", None), (6, "fay", Some("ulm")), (1, "ann", None)],
            ),
        ],
        vec![(50, vec![(1, "ann", None), (7, "gus", Some("graz"))])],
    ]
}

fn write_run(dir: &Path, n: usize, deliveries: &[Delivery]) {
    let mut text = String::new();
    for (v, rows) in deliveries {
        for (id, name, city) in rows {
            let city = city.map_or("null".to_string(), |c| format!("\"{c}\""));
            text.push_str(&format!(
                "{{\"id\": {id}, \"name\": \"{name}\", \"city\": {city}, \"v\": {v}}}\n"
            ));
        }
    }
    std::fs::write(dir.join("data").join(format!("run-{n:03}.json")), text).expect("write");
}

fn digests(wh_dir: &Path) -> Vec<PathBuf> {
    let dir = wh_dir.join("_strata/default/t/state");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Runs every delivery in a fresh project; `before_run` may touch the digest first.
async fn history(before_run: impl Fn(&Path)) -> Vec<String> {
    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    let mut tables = Vec::new();
    for (n, deliveries) in runs().iter().enumerate() {
        before_run(&wh_dir);
        write_run(dir.path(), n, deliveries);
        strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .unwrap_or_else(|e| panic!("run {n}: {e}"));
        tables.push(common::query_text(&wh, "SELECT * FROM t ORDER BY id, __START_AT").await);
    }
    tables
}

#[tokio::test]
async fn runs_without_a_digest_or_with_a_broken_one_give_the_same_tables() {
    let with = history(|_| {}).await;
    let without = history(|wh| {
        for d in digests(wh) {
            std::fs::remove_file(d).expect("remove");
        }
    })
    .await;
    let broken = history(|wh| {
        for d in digests(wh) {
            std::fs::write(d, b"not parquet").expect("overwrite");
        }
    })
    .await;
    assert_eq!(with, without);
    assert_eq!(with, broken);
    // Key 1 is missing from 30 and back at 40; key 4 from the late 15 and from 30; city is
    // untracked, so a version keeps the last city seen within it.
    let last = "\
+----+------+------+------------+----------+
| id | name | city | __START_AT | __END_AT |
+----+------+------+------------+----------+
| 1  | ann  | oslo | 10         | 30       |
| 1  | ann  |      | 40         |          |
| 2  | bob  |      | 10         | 20       |
| 2  | bo   |      | 20         | 50       |
| 3  | cy   |      | 10         | 20       |
| 4  | dan  | nice | 10         | 15       |
| 4  | dan  |      | 20         | 30       |
| 5  | eve  | bonn | 20         | 30       |
| 6  | fay  | ulm  | 30         | 50       |
| 7  | gus  | graz | 50         |          |
+----+------+------+------------+----------+";
    assert_eq!(with.last().map(String::as_str), Some(last));
}

#[tokio::test]
async fn a_run_writes_one_digest_named_by_the_event_store_version() {
    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    let all = runs();
    write_run(dir.path(), 0, &all[0]);
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 0");
    let first = digests(&wh_dir);
    assert_eq!(first.len(), 1);
    let store_version = |p: &Path| -> i64 {
        let name = p.file_name().and_then(|n| n.to_str()).expect("name");
        name.trim_start_matches("digest-")
            .trim_end_matches(".arrow")
            .parse()
            .expect("a version")
    };
    let store_log = |v: i64| {
        wh_dir
            .join("_strata/default/t/events/_delta_log")
            .join(format!("{v:020}.json"))
    };
    assert!(store_log(store_version(&first[0])).exists());
    assert!(!store_log(store_version(&first[0]) + 1).exists());
    let kept = dir.path().join("digest-after-run-0.arrow");
    std::fs::copy(&first[0], &kept).expect("keep");
    write_run(dir.path(), 1, &all[1]);
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 1");
    let second = digests(&wh_dir);
    assert_eq!(second.len(), 1, "older digests are removed");
    assert_eq!(store_version(&second[0]), store_version(&first[0]) + 1);
    assert!(!store_log(store_version(&second[0]) + 1).exists());

    // A digest that lies is believed (the run diffs against it, not against the target):
    // this one says the state after run 1 was run 0's, so version 30 (the same rows as 20)
    // re-applies run 1's changes as if they were new, and the history shows it.
    std::fs::copy(&kept, &second[0]).expect("swap in the older digest");
    write_run(dir.path(), 2, &[(30, all[1][0].1.clone())]);
    let report = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run 2");
    assert!(
        report.flows[0].keys_touched > 0,
        "an unchanged snapshot diffed against the target would touch no key"
    );
}
