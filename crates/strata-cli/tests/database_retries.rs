//! A run, or one flow inside it, retried after a real transient failure: the pipeline reads
//! the test PostgreSQL (`scripts/services/with-services.sh` starts it) through a local port
//! where nothing listens at first, so the first attempt's connection is refused; once strata
//! says it will try again, the test opens that port as a TCP proxy to the real server, and
//! the next attempt loads the rows.

mod common;

use common::Project;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the tests under scripts/services/with-services.sh \
             (the README's test command does)"
        )
    })
}

/// Runs `sql` on the test PostgreSQL.
fn pg(sql: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (client, conn) =
            tokio_postgres::connect(&var("STRATA_TEST_PG_URL"), tokio_postgres::NoTls)
                .await
                .expect("connect to the test PostgreSQL");
        let task = tokio::spawn(conn);
        client.batch_execute(sql).await.expect("seed PostgreSQL");
        drop(client);
        let _ = task.await;
    });
}

/// Forwards every connection `listener` accepts to `target`, both ways.
fn proxy(listener: TcpListener, target: String) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(client) = conn else { return };
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let (mut c2, mut s2) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            let (mut c1, mut s1) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c1, &mut s1);
                let _ = s1.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

/// A fresh table `<prefix>_<pid>_<n>_<nanos>` on the test PostgreSQL holding `n` orders with
/// rising `updated_at`; its name.
fn seeded_orders(prefix: &str, n: usize) -> String {
    let table = common::database::unique(prefix);
    let rows: Vec<String> = (1..=n)
        .map(|i| format!("({i}, 'new', '2024-01-01 {:02}:00:00+00')", 9 + i))
        .collect();
    pg(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, status text, updated_at timestamptz NOT NULL);
         INSERT INTO {table} VALUES {};",
        rows.join(", ")
    ));
    table
}

/// A port on loopback nothing listens on yet.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A project loading `table` by watermark through `127.0.0.1:port`.
fn pipeline_through(port: u16, table: &str) -> Project {
    Project::new(&format!(
        "CREATE CONNECTION shop TYPE postgresql OPTIONS (host '127.0.0.1', port '{port}', \
         database '{}', user '{}', password_env 'SHOP_PW');
CREATE STREAMING TABLE orders_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'updated_at');
",
        var("STRATA_TEST_PG_DATABASE"),
        var("STRATA_TEST_PG_USER"),
    ))
}

/// Runs `strata run pipeline.sql ARGS` in `p`; once `ready` has returned true for the
/// stderr lines so far, opens `port` as a proxy to the test PostgreSQL. Whether the run
/// succeeded, and everything it said on stderr.
fn run_opening_port(
    p: &Project,
    args: &[&str],
    port: u16,
    mut ready: impl FnMut(&str) -> bool,
) -> (bool, String) {
    let mut all = vec!["run", "pipeline.sql"];
    all.extend_from_slice(args);
    let mut child = p
        .command(&all)
        .env("SHOP_PW", var("STRATA_TEST_PG_PASSWORD"))
        .env_remove("PGPASSWORD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strata starts");
    let mut said = String::new();
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        said.push_str(&line);
        said.push('\n');
        if ready(&line) {
            let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port is still free");
            proxy(
                listener,
                format!(
                    "{}:{}",
                    var("STRATA_TEST_PG_HOST"),
                    var("STRATA_TEST_PG_PORT")
                ),
            );
            break;
        }
    }
    for line in lines {
        said.push_str(&line.expect("stderr line"));
        said.push('\n');
    }
    let status = child.wait().expect("strata ends");
    (status.success(), said)
}

#[test]
fn a_refused_database_connection_is_retried_and_the_run_succeeds() {
    let table = seeded_orders("retry_orders", 2);
    let port = free_port();
    let p = pipeline_through(port, &table);
    let args = [
        "--retries",
        "2",
        "--conf",
        "strata.updateRetryBackoff=1s",
        // The run as a whole is retried here, not the flow inside it.
        "--conf",
        "pipelines.maxFlowRetryAttempts=0",
    ];
    // Once strata says it will try again, open the port.
    let (ok, said) = run_opening_port(&p, &args, port, |line| line.contains("trying again"));
    assert!(ok, "the retried run failed: {said}");
    assert!(
        said.contains("attempt 1 of 3 failed with a transient error"),
        "{said}"
    );

    assert_eq!(p.csv("SELECT count(*) AS n FROM orders_raw"), "n\n2\n");
    let log: Vec<serde_json::Value> = p
        .ok(&["events", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let kinds: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    // One run: the retry, the ingestion that then worked, the outcome.
    assert!(log.iter().all(|e| e["run_id"] == log[0]["run_id"]));
    assert_eq!(
        kinds,
        [
            ("update", "RETRYING"),
            ("ingest", "COMPLETED"),
            ("update", "COMPLETED")
        ],
        "{log:#?}"
    );
    let retry = &log[0];
    assert_eq!(
        retry["message"],
        "attempt 1 of 3 failed with a transient error; trying again in 1 s"
    );
    let error = retry["error"].as_str().unwrap().to_ascii_lowercase();
    assert!(error.contains("connection refused"), "{error}");
    assert_eq!(log[2]["message"], "run completed (attempt 2 of 3)");
}

/// A database that refuses the connection is the environment failing, not the pipeline:
/// without retries the run exits 4 (as a storage failure does), names the connection, and
/// writes nothing.
#[test]
fn a_refused_database_connection_exits_as_an_environment_failure() {
    let p = pipeline_through(free_port(), "orders");
    let out = p
        .command(&["run", "pipeline.sql"])
        .env("SHOP_PW", var("STRATA_TEST_PG_PASSWORD"))
        .env_remove("PGPASSWORD")
        .output()
        .expect("strata runs");
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.to_ascii_lowercase().contains("connection refused"),
        "{err}"
    );
    assert!(err.contains("shop"), "{err}");
    assert!(!p.path("warehouse/default/orders_raw").exists());
}

/// `pipelines.maxFlowRetryAttempts`: a flow whose database refused the connection is tried
/// again inside the same run (no `--retries`), each failed attempt recorded in the event log
/// as `RETRYING` with its error, and the run succeeds once the connection works.
#[test]
fn a_flow_that_failed_transiently_is_retried_inside_the_run() {
    let table = seeded_orders("flow_retry_orders", 3);
    let port = free_port();
    let p = pipeline_through(port, &table);
    let args = [
        "--conf",
        "pipelines.maxFlowRetryAttempts=3",
        "--conf",
        "strata.flowRetryBackoff=500ms",
    ];
    // Let two attempts fail, then open the port.
    let mut retries = 0;
    let (ok, said) = run_opening_port(&p, &args, port, |line| {
        retries += usize::from(line.contains("retrying the flow"));
        retries == 2
    });
    assert!(ok, "the retried flow failed: {said}");
    assert!(
        said.contains("attempt 1 of 4 of this flow failed with a transient error"),
        "{said}"
    );
    assert_eq!(p.csv("SELECT count(*) AS n FROM orders_raw"), "n\n3\n");
    let log: Vec<serde_json::Value> = p
        .ok(&["events", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let kinds: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["flow"].as_str().unwrap(),
                e["status"].as_str().unwrap(),
            )
        })
        .collect();
    // One run, no run-level retry: two failed attempts of the flow, then the one that worked.
    assert!(log.iter().all(|e| e["run_id"] == log[0]["run_id"]));
    assert_eq!(
        kinds,
        [
            ("ingest", "orders_raw", "RETRYING"),
            ("ingest", "orders_raw", "RETRYING"),
            ("ingest", "orders_raw", "COMPLETED"),
        ],
        "{log:#?}"
    );
    assert_eq!(
        log[0]["message"],
        "attempt 1 of 4 of this flow failed with a transient error; retrying the flow in \
         500 ms (pipelines.maxFlowRetryAttempts = 3)"
    );
    assert_eq!(
        log[1]["message"],
        "attempt 2 of 4 of this flow failed with a transient error; retrying the flow in \
         1 s (pipelines.maxFlowRetryAttempts = 3)"
    );
    for retry in &log[..2] {
        let error = retry["error"].as_str().unwrap().to_ascii_lowercase();
        assert!(error.contains("connection refused"), "{error}");
    }
    assert_eq!(log[2]["rows_written"], 3);
}
