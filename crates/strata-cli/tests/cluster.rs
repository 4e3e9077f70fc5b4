//! Bulk loads on a real cluster: `strata run --cluster` against a scheduler and two
//! executors of the binary under test (`scripts/services/cluster.sh`, separate processes on
//! loopback ports), with warehouses on the S3-compatible test server (moto). Each test
//! compares the cluster's tables with the same pipeline run on this machine only.
mod common;

use common::cluster::Cluster;
use common::object_store::{delta_rows, OnStore, S3};
use common::stderr;

const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE raw
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'id BIGINT, code STRING, name STRING, score DOUBLE, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_flow AS AUTO CDC INTO history FROM STREAM(raw)
KEYS (id)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE current TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');
CREATE FLOW current_flow AS AUTO CDC INTO current FROM STREAM(raw)
KEYS (code)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 1;
"#;

/// A small deterministic generator (the tests must be repeatable).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

fn event(id: u64, op: &str, seq: u64, rng: &mut Lcg) -> String {
    let name = format!("n{}", rng.next(1000));
    let score = rng.next(1_000_000) as f64 / 7.0;
    format!(
        r#"{{"id": {id}, "code": "k{id}", "name": "{name}", "score": {score}, "op": "{op}", "seq": {seq}}}"#
    )
}

/// The first delivery, as two files: for each of `keys` keys one to four upserts 10 apart in
/// sequence, every eleventh key deleted last; the second file holds late events (sequence
/// between two earlier ones) for every fifth key.
fn first_delivery(keys: u64) -> (String, String) {
    let mut rng = Lcg(7);
    let (mut a, mut b) = (String::new(), String::new());
    for id in 0..keys {
        let n = 1 + rng.next(4);
        for j in 1..=n {
            let op = if j == n && id % 11 == 0 {
                "DELETE"
            } else {
                "UPSERT"
            };
            a.push_str(&event(id, op, 10 * j, &mut rng));
            a.push('\n');
        }
        if id % 5 == 0 {
            b.push_str(&event(id, "UPSERT", 10 * n - 5, &mut rng));
            b.push('\n');
        }
    }
    (a, b)
}

/// A later delivery: late updates, deletes, a key deleted in the first delivery inserted
/// again, and new keys.
fn later_delivery(keys: u64) -> String {
    let mut rng = Lcg(11);
    let mut out = String::new();
    for id in (0..keys).step_by(3) {
        let (op, seq) = match id % 4 {
            0 => ("UPSERT", 13),
            1 => ("DELETE", 100),
            _ => ("UPSERT", 100),
        };
        out.push_str(&event(id, op, seq, &mut rng));
        out.push('\n');
    }
    for id in keys..keys + 50 {
        out.push_str(&event(id, "UPSERT", 10, &mut rng));
        out.push('\n');
    }
    out
}

/// What both runs must agree on: every row of both targets, the history's change feed and
/// both event stores.
fn tables(w: &OnStore) -> Vec<String> {
    let stores = ["history", "current"]
        .map(|t| delta_rows(w.server, &format!("{}/_strata/default/{t}/events", w.url)).join("\n"));
    [
        "SELECT id, code, name, score, __START_AT, __END_AT FROM history ORDER BY id, __START_AT",
        "SELECT code, id, name, score FROM current ORDER BY code",
        "SELECT _change_type, id, name, score, __START_AT, __END_AT FROM table_changes('history', 0) \
         ORDER BY id, __START_AT, _change_type, _commit_version",
    ]
    .iter()
    .map(|sql| w.csv(sql))
    .chain(stores)
    .collect()
}

/// The arguments of a run whose first loads go to the cluster at `url`, whatever their size.
fn on_cluster(url: &str) -> [&str; 6] {
    [
        "run",
        "pipeline.sql",
        "--cluster",
        url,
        "--cluster-min-events",
        "1",
    ]
}

/// Two warehouses named after `test` holding the same first delivery of `keys` keys, the
/// first of them (the local reference) already run on this machine only.
fn local_and_remote<'a>(s3: &'a S3, test: &str, keys: u64) -> (OnStore<'a>, OnStore<'a>) {
    let local = OnStore::new(s3, &format!("{test}-local"), PIPELINE);
    let remote = OnStore::new(s3, test, PIPELINE);
    let (a, b) = first_delivery(keys);
    for w in [&local, &remote] {
        w.p.file("data/cdc/001.json", &a);
        w.p.file("data/cdc/002.json", &b);
    }
    local.ok(&["run", "pipeline.sql"]);
    (local, remote)
}

fn assert_same(local: &[String], remote: &[String], cluster: &Cluster) {
    for (i, (l, r)) in local.iter().zip(remote).enumerate() {
        assert!(l.lines().count() > 100, "a real table: {l}");
        let first = l.lines().zip(r.lines()).find(|(a, b)| a != b);
        assert!(
            l == r,
            "table {i} of the cluster's run differs from the local one ({} vs {} lines; \
             first difference: {first:?})\n{}",
            l.lines().count(),
            r.lines().count(),
            cluster.logs()
        );
    }
}

/// A first load of two flows (integer and string keys, SCD 2 and SCD 1, late events and
/// deletes) runs on the cluster, and gives the tables, change feed and event stores a local
/// run gives; so do a second, incremental batch afterwards (late events, deletes,
/// re-inserts; on the cluster too, being above `--cluster-min-events`), a small batch
/// (here) and a full refresh (on the cluster again).
#[test]
fn a_backfill_on_the_cluster_equals_a_local_one() {
    let s3 = S3::from_env();
    let cluster = Cluster::start(&s3);
    let (local, remote) = local_and_remote(&s3, "cluster-remote", 3000);
    let on_cluster = on_cluster(&cluster.url);
    let out = remote.ok(&on_cluster);
    for flow in ["history_flow", "current_flow"] {
        assert!(
            out.lines()
                .any(|l| l.contains(flow) && l.contains("bulk load on the cluster")),
            "{flow} ran on the cluster: {out}"
        );
        // Each stage is told as the scheduler completes it: the read and shuffle of every
        // event, then the fold and write of the parts.
        let stages = out
            .lines()
            .find(|l| l.contains(flow) && l.contains("stage 1"))
            .unwrap_or_else(|| panic!("{flow}'s stages are told: {out}"));
        let (a, b) = first_delivery(3000);
        let events = a.lines().count() + b.lines().count();
        assert!(
            stages.contains("(read and shuffle the events): ")
                && stages.contains(&format!(" task(s), {events} row(s) done at"))
                && stages.contains("(fold and write): 4 task(s), 4 row(s) done at"),
            "{stages}"
        );
    }
    assert_same(&tables(&local), &tables(&remote), &cluster);

    let later = later_delivery(3000);
    for w in [&local, &remote] {
        w.p.file("data/cdc/003.json", &later);
    }
    local.ok(&["run", "pipeline.sql"]);
    let out = remote.ok(&on_cluster);
    for flow in ["history_flow", "current_flow"] {
        assert!(
            out.lines()
                .any(|l| l.contains(flow) && l.contains("batch on the cluster")),
            "{flow}'s batch (at least --cluster-min-events) ran on the cluster: {out}"
        );
    }
    assert_same(&tables(&local), &tables(&remote), &cluster);

    // A batch below --cluster-min-events runs here.
    let small = "{\"id\": 7, \"code\": \"k7\", \"name\": \"late\", \"score\": 1.5, \"op\": \"UPSERT\", \"seq\": 15}\n";
    for w in [&local, &remote] {
        w.p.file("data/cdc/004.json", small);
    }
    local.ok(&["run", "pipeline.sql"]);
    let out = remote.ok(&[&on_cluster[..4], &["--cluster-min-events", "1000"]].concat());
    assert!(
        !out.contains("on the cluster"),
        "a small batch runs here: {out}"
    );
    assert_same(&tables(&local), &tables(&remote), &cluster);

    // A full refresh rebuilds the targets from every event: a first load again, on the
    // cluster.
    local.ok(&["run", "pipeline.sql", "--full-refresh"]);
    let out = remote.ok(&[&on_cluster[..], &["--full-refresh"]].concat());
    assert!(out.contains("bulk load on the cluster"), "{out}");
    assert_same(&tables(&local), &tables(&remote), &cluster);
}

/// Below `--cluster-min-events` (default 1,000,000) a first load stays on this machine: no
/// cluster answers at that address, and the run succeeds.
#[test]
fn a_small_first_load_stays_local() {
    let s3 = S3::from_env();
    let w = OnStore::new(&s3, "cluster-small", PIPELINE);
    let (a, _) = first_delivery(20);
    w.p.file("data/cdc/001.json", &a);
    let out = w.ok(&["run", "pipeline.sql", "--cluster", "df://127.0.0.1:9"]);
    assert!(!out.contains("on the cluster"), "{out}");
    assert!(!w.csv("SELECT count(*) AS n FROM history").contains("\n0\n"));
}

/// A cluster that cannot be reached fails the run with its address, and commits nothing.
#[test]
fn an_unreachable_cluster_fails_cleanly() {
    let s3 = S3::from_env();
    let w = OnStore::new(&s3, "cluster-down", PIPELINE);
    let (a, _) = first_delivery(20);
    w.p.file("data/cdc/001.json", &a);
    let out = w.strata(&on_cluster("df://127.0.0.1:9"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("df://127.0.0.1:9"), "{err}");
    let rows = w.csv("SELECT count(*) AS n FROM history");
    assert!(rows.contains("\n0"), "nothing committed: {rows}");
    let store = format!("{}/_strata/default/history/events", w.url);
    assert!(delta_rows(w.server, &store).is_empty(), "no event stored");
    // The same pipeline without the cluster converges (and the store read above sees its
    // events).
    w.ok(&["run", "pipeline.sql"]);
    assert!(!w.csv("SELECT count(*) AS n FROM history").contains("\n0"));
    assert!(!delta_rows(w.server, &store).is_empty());
}

/// Executors without the warehouse's credentials (a wrong secret in their environment):
/// the run fails, saying the executors could not read the warehouse and where, with
/// nothing in the target; the same run without the cluster converges.
#[test]
fn executors_without_the_warehouse_credentials_fail_cleanly() {
    let s3 = S3::from_env();
    let cluster = Cluster::start_with_secret(&s3, "not-the-secret");
    let w = OnStore::new(&s3, "cluster-creds", PIPELINE);
    let (a, _) = first_delivery(20);
    w.p.file("data/cdc/001.json", &a);
    let out = w.strata(&on_cluster(&cluster.url));
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("executor") && err.contains("s3://"), "{err}");
    assert!(!err.contains("not-the-secret"), "{err}");
    let rows = w.csv("SELECT count(*) AS n FROM history");
    assert!(rows.contains("\n0"), "nothing committed: {rows}");
    w.ok(&["run", "pipeline.sql"]);
    assert!(!w.csv("SELECT count(*) AS n FROM history").contains("\n0"));
}

/// A drill: one executor is killed (SIGKILL) while the backfill runs. The run either
/// completes on the other executor or fails with nothing in the target; a rerun then gives
/// the local run's tables.
#[test]
fn a_killed_executor_leaves_nothing_partial() {
    let s3 = S3::from_env();
    let cluster = Cluster::start(&s3);
    let (local, remote) = local_and_remote(&s3, "cluster-drill", 60_000);
    let run = remote
        .command(&on_cluster(&cluster.url))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("strata runs");
    // Kill the first executor once it runs a task of the fold stage.
    assert!(
        cluster.wait_until_folding(&["executor-1"]),
        "the executor folds: {}",
        cluster.logs()
    );
    cluster.kill("executor-1");
    let out = run.wait_with_output().expect("the run ends");
    let history = remote.csv("SELECT count(*) AS n FROM history");
    eprintln!(
        "drill: with an executor killed the run {}",
        match out.status.success() {
            true => "completed".to_string(),
            false => format!("failed: {}", stderr(&out)),
        }
    );
    if !out.status.success() {
        assert!(history.contains("\n0"), "nothing committed: {history}");
        remote.ok(&on_cluster(&cluster.url));
    }
    assert_same(&tables(&local), &tables(&remote), &cluster);
}

/// Input a task rejects (two different upserts of a key at one sequence value) fails the
/// run as it does here: exit code 2, the flow and key named, nothing in the target.
#[test]
fn input_rejected_on_the_cluster_fails_like_here() {
    let s3 = S3::from_env();
    let cluster = Cluster::start(&s3);
    let w = OnStore::new(&s3, "cluster-rejected", PIPELINE);
    let (a, _) = first_delivery(200);
    w.p.file("data/cdc/001.json", &a);
    w.p.file(
        "data/cdc/002.json",
        "{\"id\": 5, \"code\": \"k5\", \"name\": \"zz\", \"score\": 1, \"op\": \"UPSERT\", \"seq\": 10}\n\
         {\"id\": 5, \"code\": \"k5\", \"name\": \"yy\", \"score\": 1, \"op\": \"UPSERT\", \"seq\": 10}\n",
    );
    let out = w.strata(&on_cluster(&cluster.url));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}\n{}", cluster.logs());
    assert!(
        err.contains("two different upserts for key (id=5) at the same sequence value 10")
            || err
                .contains("two different upserts for key (code=k5) at the same sequence value 10"),
        "{err}"
    );
    assert!(
        !err.contains("Ballista") && !err.contains("DataFusionError"),
        "{err}"
    );
    let rows = w.csv("SELECT count(*) AS n FROM history");
    assert!(rows.contains("\n0"), "nothing committed: {rows}");
}

/// A drill: the coordinator (`strata run`) is killed (SIGKILL) while the cluster folds. Its
/// commits are the only ones, so the targets hold nothing; a rerun gives the local run's
/// tables. Then the same while the cluster folds a later batch: whatever the kill left (no
/// commit, or the events committed and the target not), a rerun gives the local tables.
#[test]
fn a_killed_coordinator_leaves_nothing_partial() {
    let s3 = S3::from_env();
    let cluster = Cluster::start(&s3);
    let (local, remote) = local_and_remote(&s3, "cluster-coord", 60_000);
    let on_cluster = on_cluster(&cluster.url);
    let mut run = remote
        .command(&on_cluster)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("strata runs");
    cluster.wait_until_folding(&["executor-1", "executor-2"]);
    run.kill().expect("SIGKILL");
    run.wait().expect("the run ends");
    for table in ["history", "current"] {
        let rows = remote.csv(&format!("SELECT count(*) AS n FROM {table}"));
        assert!(rows.contains("\n0"), "nothing committed to {table}: {rows}");
    }
    remote.ok(&on_cluster);
    assert_same(&tables(&local), &tables(&remote), &cluster);

    let later = later_delivery(60_000);
    for w in [&local, &remote] {
        w.p.file("data/cdc/003.json", &later);
    }
    local.ok(&["run", "pipeline.sql"]);
    let (before, seen) = (
        remote.csv("SELECT count(*) AS n FROM history"),
        cluster.fold_tasks(&["executor-1", "executor-2"]),
    );
    let mut run = remote
        .command(&on_cluster)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("strata runs");
    assert!(
        cluster.wait_for_fold_tasks(&["executor-1", "executor-2"], seen),
        "the batch folds on the cluster: {}",
        cluster.logs()
    );
    run.kill().expect("SIGKILL");
    run.wait().expect("the run ends");
    eprintln!(
        "drill: the coordinator killed during a batch; history held {} rows before, {} after",
        before.lines().nth(1).unwrap_or("?"),
        remote
            .csv("SELECT count(*) AS n FROM history")
            .lines()
            .nth(1)
            .unwrap_or("?")
    );
    remote.ok(&on_cluster);
    assert_same(&tables(&local), &tables(&remote), &cluster);
}
