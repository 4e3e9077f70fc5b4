//! Running and watching, on the real binary: `strata events`, `--select`, `--full-refresh`
//! and its guard, continuous mode stopped by SIGTERM while files arrive, and the plain
//! progress lines written when stderr is not a terminal.

mod common;

use common::{table_files, Project};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE users_cdc (
  CONSTRAINT valid_id EXPECT (id IS NOT NULL) ON VIOLATION DROP ROW,
  CONSTRAINT known_plan EXPECT (plan IN ('free', 'premium'))
)
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'id INT, plan STRING, seq INT');
CREATE OR REFRESH STREAMING TABLE users
TBLPROPERTIES ('pipelines.reset.allowed' = 'false');
CREATE FLOW users_flow AS AUTO CDC INTO users FROM STREAM(users_cdc)
KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH MATERIALIZED VIEW plans AS
SELECT plan, count(*) AS users FROM users WHERE __END_AT IS NULL GROUP BY plan;
"#;

#[test]
fn events_show_each_run_with_counts_expectations_and_errors() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        r#"{"id": 1, "plan": "free", "seq": 1}
{"id": null, "plan": "free", "seq": 1}
{"id": 2, "plan": "trial", "seq": 1}
"#,
    );
    let out = p.strata(&["run", "pipeline.sql"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let stdout = common::stdout(&out);
    assert!(
        stdout.contains(
            "table default.users_cdc: ingested 2 row(s) from 1 file(s), 1 dropped by expectations"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("expectation known_plan (warn): 1 of 3 row(s) failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("materialized view default.plans: recomputed, 2 row(s)"),
        "{stdout}"
    );
    // Without a terminal, progress is one plain line per dataset on stderr.
    let stderr = common::stderr(&out);
    assert!(stderr.contains("flow users_flow: 2 event(s)"), "{stderr}");
    assert!(
        !stderr.contains('\r'),
        "no terminal control codes: {stderr:?}"
    );

    let events = p.ok(&["events"]);
    for want in [
        "COMPLETED ingest users_cdc -> default.users_cdc",
        "read 3, written 2, dropped 1",
        "expectation valid_id (drop): 2 passed, 1 failed",
        "expectation known_plan (warn): 2 passed, 1 failed",
        "COMPLETED cdc users_flow -> default.users",
        "versions opened 2",
        "COMPLETED materialized_view plans -> default.plans",
    ] {
        assert!(events.contains(want), "missing `{want}` in\n{events}");
    }
    assert_eq!(events.matches("\nrun ").count() + 1, 1, "one run: {events}");

    // A second run with a batch that fails a downstream check: a FAILED record with the
    // error, and `--last 2` shows both runs.
    p.file(
        "data/cdc/002.json",
        r#"{"id": 3, "plan": "free", "seq": null}
"#,
    );
    let out = p.strata(&["run", "pipeline.sql"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let events = p.ok(&["events", "--last", "2"]);
    assert!(events.contains("FAILED    ingest users_cdc"), "{events}");
    assert!(events.contains("error: "), "{events}");
    assert!(events.contains("NULL SEQUENCE BY value"), "{events}");
    assert_eq!(events.matches("run ").count(), 2, "two runs:\n{events}");
    let flow_only = p.ok(&["events", "--flow", "users_flow"]);
    assert!(flow_only.contains("cdc users_flow"), "{flow_only}");
    assert!(!flow_only.contains("users_cdc ->"), "{flow_only}");
    // The log is a table like any other.
    assert_eq!(
        p.csv("SELECT status, count(*) AS n FROM event_log GROUP BY status ORDER BY status"),
        "status,n\nCOMPLETED,3\nFAILED,1\n"
    );
}

#[test]
fn select_runs_only_what_is_asked() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        "{\"id\": 1, \"plan\": \"free\", \"seq\": 1}\n",
    );
    let out = p.ok(&["run", "pipeline.sql", "--select", "users_cdc"]);
    assert!(
        out.contains("table default.users_cdc: ingested 1 row(s)"),
        "{out}"
    );
    assert!(!out.contains("users_flow"), "{out}");
    assert!(!p.path("warehouse/default/users").exists());
    let out = p.ok(&["run", "pipeline.sql", "--select", "users+"]);
    assert!(out.contains("flow users_flow: 1 event(s)"), "{out}");
    assert!(
        out.contains("materialized view default.plans: recomputed"),
        "{out}"
    );
    assert!(!out.contains("table default.users_cdc"), "{out}");
    let out = p.strata(&["run", "pipeline.sql", "--select", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::stderr(&out).contains("the pipeline has no dataset or flow named nosuch"),
        "{}",
        common::stderr(&out)
    );
}

#[test]
fn full_refresh_is_refused_for_guarded_tables_and_rebuilds_the_others() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        "{\"id\": 1, \"plan\": \"free\", \"seq\": 1}\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let before = table_files(&p.path("warehouse"));
    // users keeps history (reset not allowed); refreshing it or its source is refused.
    for args in [
        vec!["run", "pipeline.sql", "--full-refresh"],
        vec!["run", "pipeline.sql", "--full-refresh", "users_cdc"],
        vec!["run", "pipeline.sql", "--full-refresh", "users"],
    ] {
        let out = p.strata(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = common::stderr(&out);
        assert!(
            err.contains("full refresh refused: default.users has pipelines.reset.allowed = false"),
            "{args:?}: {err}"
        );
        assert_eq!(table_files(&p.path("warehouse")), before, "{args:?}");
    }
    // The materialized view alone may be rebuilt; its old content is kept aside.
    let out = p.ok(&["run", "pipeline.sql", "--full-refresh", "plans"]);
    assert!(
        out.contains(
            "full refresh: default.plans rebuilt from its sources; its previous content is kept in"
        ),
        "{out}"
    );
    assert_eq!(p.csv("SELECT * FROM plans"), "plan,users\nfree,1\n");
    let kept: Vec<_> = std::fs::read_dir(p.path("warehouse/_strata/full_refresh"))
        .expect("kept")
        .collect();
    assert_eq!(kept.len(), 1);
}

#[test]
fn continuous_mode_picks_up_files_and_stops_cleanly_on_sigterm() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        "{\"id\": 1, \"plan\": \"free\", \"seq\": 1}\n",
    );
    let mut child = p
        .command(&["run", "pipeline.sql", "--continuous", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let wait_for = |sql: &str, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = p.strata(&["query", "--format", "csv", sql]);
            if out.status.success() && common::stdout(&out) == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {want:?}, last: {} {}",
                common::stdout(&out),
                common::stderr(&out)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let count = "SELECT count(*) AS n FROM users";
    wait_for(count, "n\n1\n");
    // Files arriving while it runs are taken, each once.
    for i in 2..=6 {
        p.file(
            &format!("data/cdc/{i:03}.json"),
            &format!("{{\"id\": {i}, \"plan\": \"premium\", \"seq\": 1}}\n"),
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    wait_for(count, "n\n6\n");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    assert!(code.success(), "exit {code:?}: {}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("stopped after"),
        "{}",
        common::stderr(&out)
    );
    // Nothing lost, nothing twice. The signal may have stopped a run before its last
    // datasets; a triggered run completes them and finds no new file.
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS k FROM users_cdc"),
        "n,k\n6,6\n"
    );
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(
        out.contains("table default.users_cdc: no new files"),
        "{out}"
    );
    assert_eq!(
        p.csv("SELECT plan, users FROM plans ORDER BY plan"),
        "plan,users\nfree,1\npremium,5\n"
    );
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS k FROM users WHERE __END_AT IS NULL"),
        "n,k\n6,6\n"
    );
}

#[test]
fn bad_interval_is_an_error() {
    let p = Project::new(PIPELINE);
    let out = p.strata(&[
        "run",
        "pipeline.sql",
        "--continuous",
        "--interval",
        "5 parsecs",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::stderr(&out).contains("unknown duration unit 'parsecs'"),
        "{}",
        common::stderr(&out)
    );
}

/// Batches changing thousands of keys: their rows are replaced file by file (rewrite.rs)
/// through the real binary, and both give the right table.
#[test]
fn large_batches_replace_the_changed_keys() {
    let pipeline = r#"
CREATE OR REFRESH STREAMING TABLE raw
AS SELECT * FROM STREAM read_files('data/cdc', format => 'csv', header => true,
  schema => 'id BIGINT, v STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
"#;
    for changed in [9_500usize, 30_000] {
        let p = Project::new(pipeline);
        let mut first = String::from("id,v,seq\n");
        for i in 0..35_000 {
            first.push_str(&format!("{i},a,1\n"));
        }
        p.file("data/cdc/001.csv", &first);
        p.ok(&["run", "pipeline.sql"]);
        let mut second = String::from("id,v,seq\n");
        for i in 0..changed {
            second.push_str(&format!("{i},b,2\n"));
        }
        p.file("data/cdc/002.csv", &second);
        let out = p.ok(&["run", "pipeline.sql"]);
        assert!(out.contains(&format!("{changed} key(s) changed")), "{out}");
        assert_eq!(
            p.csv("SELECT v, count(*) AS n FROM t WHERE __END_AT IS NULL GROUP BY v ORDER BY v"),
            format!("v,n\na,{}\nb,{changed}\n", 35_000 - changed)
        );
        assert_eq!(
            p.csv("SELECT count(*) AS n FROM t WHERE __END_AT = 2"),
            format!("n\n{changed}\n")
        );
        assert!(p.ok(&["validate", "t"]).contains("t: ok"));
    }
}

/// The warehouse as a named catalog: `--catalog prod` (or a spec's `catalog: prod`) makes
/// `prod.schema.table` name its tables in pipelines and queries, `main` and `strata` still
/// answer, another catalog is refused by name; `USE CATALOG` / `USE SCHEMA` set the schema
/// of unqualified names; `SHOW TABLES` and `DESCRIBE TABLE EXTENDED` answer with
/// Databricks' columns, the table comment and column comments among them.
#[test]
fn a_named_catalog_use_show_tables_and_describe_extended() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE prod.bronze.events (id BIGINT COMMENT 'event id', \
         kind STRING) COMMENT 'raw events' AS SELECT * FROM STREAM \
         read_files('data', format => 'json', schema => 'id BIGINT, kind STRING');\n\
         CREATE OR REFRESH MATERIALIZED VIEW gold.kinds AS \
         SELECT kind, count(*) AS n FROM prod.bronze.events GROUP BY kind;\n",
    );
    std::fs::create_dir_all(p.path("data")).unwrap();
    p.file(
        "data/001.json",
        "{\"id\": 1, \"kind\": \"a\"}\n{\"id\": 2, \"kind\": \"a\"}\n",
    );
    // Without the catalog's name, `prod` is not this warehouse.
    let refused = p.strata(&["run", "pipeline.sql"]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        common::stderr(&refused)
    );
    assert!(
        common::stderr(&refused).contains("catalog prod is not this warehouse"),
        "{}",
        common::stderr(&refused)
    );
    p.ok(&["run", "pipeline.sql", "--catalog", "prod"]);
    let q = |sql: &str| p.ok(&["query", "--catalog", "prod", "--format", "csv", sql]);
    assert_eq!(q("SELECT n FROM prod.gold.kinds"), "n\n2\n");
    assert_eq!(q("SELECT count(*) AS c FROM main.bronze.events"), "c\n2\n");
    assert_eq!(
        q("USE CATALOG prod; USE SCHEMA gold; SELECT kind FROM kinds"),
        "kind\na\n"
    );
    assert_eq!(q("USE bronze; SELECT count(*) AS c FROM events"), "c\n2\n");
    let other = p.strata(&["query", "--catalog", "prod", "USE CATALOG dev; SELECT 1"]);
    assert!(!other.status.success());
    assert!(
        common::stderr(&other).contains("catalog dev is not this warehouse"),
        "{}",
        common::stderr(&other)
    );
    assert_eq!(
        q("SHOW TABLES IN bronze"),
        "database,tableName,isTemporary\nbronze,events,false\n"
    );
    let described = q("DESCRIBE TABLE EXTENDED bronze.events");
    for line in [
        "col_name,data_type,comment",
        "id,BIGINT,event id",
        "kind,STRING,",
        "# Detailed Table Information,,",
        "Catalog,prod,",
        "Database,bronze,",
        "Comment,raw events,",
        "Provider,delta,",
    ] {
        assert!(
            described.lines().any(|l| l == line),
            "{line:?} in\n{described}"
        );
    }
    // A spec names its catalog itself.
    p.file(
        "spec.yaml",
        "name: shop\ncatalog: prod\nlibraries: [pipeline.sql]\n",
    );
    // (Without it the run is refused, as above.)
    p.ok(&["run", "spec.yaml"]);
}

/// `--lock`: one run of a pipeline at a time. A lock held by a live process (this test)
/// refuses `--lock fail` at once (exit 3, naming the run holding it) and makes `--lock wait`
/// wait, here until its timeout; a lock left by a process that is gone is taken over; the
/// lock is removed when a run ends; without `--lock` runs do not look at it.
#[test]
fn lock_refuses_or_waits_for_a_running_pipeline() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE t AS SELECT * FROM STREAM \
         read_files('data', format => 'json', schema => 'id INT');\n",
    );
    std::fs::create_dir_all(p.path("data")).unwrap();
    p.file("data/001.json", "{\"id\": 1}\n");
    let locks = p.path("warehouse/_strata/locks");
    std::fs::create_dir_all(&locks).unwrap();
    let lock = locks.join("pipeline_sql.json");
    let held_by = |pid: u32| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        format!(
            "{{\"run_id\":\"other-run\",\"host\":\"{}\",\"pid\":{pid},\"started\":{now}}}",
            host.trim()
        )
    };
    std::fs::write(&lock, held_by(std::process::id())).unwrap();
    let refused = p.strata(&["run", "pipeline.sql", "--lock", "fail"]);
    assert_eq!(
        refused.status.code(),
        Some(3),
        "{}",
        common::stderr(&refused)
    );
    assert!(
        common::stderr(&refused)
            .contains("pipeline pipeline.sql is already running on this warehouse (run other-run"),
        "{}",
        common::stderr(&refused)
    );
    let started = Instant::now();
    let waited = p.strata(&[
        "run",
        "pipeline.sql",
        "--lock",
        "wait",
        "--lock-timeout",
        "2s",
    ]);
    assert_eq!(waited.status.code(), Some(3), "{}", common::stderr(&waited));
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(
        common::stderr(&waited).contains("is still running (run other-run"),
        "{}",
        common::stderr(&waited)
    );
    assert!(
        !p.path("warehouse/default/t").exists(),
        "refused runs wrote nothing"
    );
    // Left by a process that is gone: taken over, and removed when the run ends.
    std::fs::write(&lock, held_by(u32::MAX - 7)).unwrap();
    p.ok(&["run", "pipeline.sql", "--lock", "fail"]);
    assert_eq!(p.csv("SELECT count(*) AS n FROM t"), "n\n1\n");
    assert!(!lock.exists(), "the run removed its lock");
    // Without --lock a run does not look at the lock.
    std::fs::write(&lock, held_by(std::process::id())).unwrap();
    p.file("data/002.json", "{\"id\": 2}\n");
    p.ok(&["run", "pipeline.sql"]);
    assert_eq!(p.csv("SELECT count(*) AS n FROM t"), "n\n2\n");
}
