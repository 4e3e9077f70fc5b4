//! Warehouses on object storage, on the real binary against the S3-compatible server that
//! `scripts/services/with-services.sh` starts (moto, checking credentials as S3 does;
//! `STRATA_TEST_S3_*`). Each test works under its own prefix of the bucket.
mod common;

use common::{stderr, stdout, Project};
use std::process::{Child, Command, Output};

const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE users_cdc
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'userId INT, name STRING, city STRING, operation STRING, sequenceNum INT');
CREATE OR REFRESH STREAMING TABLE users;
CREATE FLOW users_flow AS AUTO CDC INTO users
FROM STREAM(users_cdc)
KEYS (userId)
APPLY AS DELETE WHEN operation = "DELETE"
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 2;
CREATE OR REFRESH MATERIALIZED VIEW cities AS
SELECT city, count(*) AS n FROM users WHERE __END_AT IS NULL GROUP BY city;
"#;

const BATCH1: &str = r#"{"userId": 124, "name": "Raul", "city": "Oaxaca", "operation": "INSERT", "sequenceNum": 1}
{"userId": 123, "name": "Isabel", "city": "Monterrey", "operation": "INSERT", "sequenceNum": 1}
{"userId": 125, "name": "Mercedes", "city": "Tijuana", "operation": "INSERT", "sequenceNum": 2}
{"userId": 126, "name": "Lily", "city": "Cancun", "operation": "INSERT", "sequenceNum": 2}
{"userId": 123, "name": null, "city": null, "operation": "DELETE", "sequenceNum": 6}
{"userId": 125, "name": "Mercedes", "city": "Guadalajara", "operation": "UPDATE", "sequenceNum": 6}
"#;

const BATCH2: &str = r#"{"userId": 125, "name": "Mercedes", "city": "Mexicali", "operation": "UPDATE", "sequenceNum": 5}
{"userId": 123, "name": "Isabel", "city": "Chihuahua", "operation": "UPDATE", "sequenceNum": 5}
"#;

/// The test server's facts.
struct S3 {
    endpoint: String,
    bucket: String,
    key_id: String,
    secret: String,
    region: String,
}

impl S3 {
    fn from_env() -> S3 {
        let var = |name: &str| {
            let key = format!("STRATA_TEST_S3_{name}");
            std::env::var(&key).unwrap_or_else(|_| {
                panic!(
                    "{key} is not set: run the tests under scripts/services/with-services.sh \
                     (the README's test command does)"
                )
            })
        };
        S3 {
            endpoint: var("ENDPOINT"),
            bucket: var("BUCKET"),
            key_id: var("ACCESS_KEY_ID"),
            secret: var("SECRET_ACCESS_KEY"),
            region: var("REGION"),
        }
    }

    /// A prefix of the bucket no other test (or earlier run) uses.
    fn warehouse(&self, test: &str) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!(
            "s3://{}/{test}-{}-{nanos}/wh",
            self.bucket,
            std::process::id()
        )
    }
}

impl S3 {
    /// Writes `text` as the object `key` of the test bucket.
    fn put(&self, key: &str, text: &str) {
        use deltalake::logstore::object_store::{
            aws::AmazonS3Builder, path::Path, ObjectStoreExt, PutPayload,
        };
        let store = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region(&self.region)
            .with_access_key_id(&self.key_id)
            .with_secret_access_key(&self.secret)
            .build()
            .expect("an S3 client");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(store.put(&Path::from(key), PutPayload::from(text.to_string())))
            .expect("put");
    }
}

/// A project whose commands reach the warehouse `url` on the test server with `secret`.
struct OnS3<'a> {
    p: Project,
    s3: &'a S3,
    url: String,
    secret: String,
}

impl OnS3<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = self.p.command(args);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
            c.env_remove(k);
        }
        c.env("STRATA_WAREHOUSE", &self.url)
            .env("AWS_ACCESS_KEY_ID", &self.s3.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env("AWS_REGION", &self.s3.region)
            .env("AWS_ENDPOINT_URL", &self.s3.endpoint)
            .env("AWS_ALLOW_HTTP", "true");
        c
    }

    fn strata(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("strata runs")
    }

    /// Runs `args`, which must succeed and print no secret; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.strata(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed: {}",
            stderr(&out)
        );
        self.no_secret(&out);
        stdout(&out)
    }

    fn csv(&self, sql: &str) -> String {
        self.ok(&["query", "--format", "csv", sql])
    }

    fn no_secret(&self, out: &Output) {
        for text in [stdout(out), stderr(out)] {
            assert!(
                !text.contains(&self.s3.secret),
                "a secret was printed: {text}"
            );
        }
    }
}

/// The test server honours conditional put, which strata's commits rely on: a second
/// create of one key is refused (else the drill below would prove nothing).
#[test]
fn the_test_server_refuses_a_second_create_of_one_key() {
    use deltalake::logstore::object_store::{
        aws::AmazonS3Builder, path::Path, Error, ObjectStore, PutMode, PutOptions,
    };
    let s3 = S3::from_env();
    let store = AmazonS3Builder::new()
        .with_bucket_name(&s3.bucket)
        .with_endpoint(&s3.endpoint)
        .with_allow_http(true)
        .with_region(&s3.region)
        .with_access_key_id(&s3.key_id)
        .with_secret_access_key(&s3.secret)
        .build()
        .expect("an S3 client");
    let key = s3
        .warehouse("create")
        .replace(&format!("s3://{}/", s3.bucket), "");
    let path = Path::from(format!("{key}/00000000000000000000.json"));
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        store
            .put_opts(&path, "first".into(), create())
            .await
            .expect("the first create");
        let second = store.put_opts(&path, "second".into(), create()).await;
        assert!(
            matches!(second, Err(Error::AlreadyExists { .. })),
            "{second:?}"
        );
    });
}

/// Everything a user does with a warehouse, on S3: runs (ingestion from local files, AUTO
/// CDC SCD2, a materialized view), `query`, `validate`, `events`, a re-run that finds
/// nothing new, a full refresh; the same rows as the same runs on local disk, and the
/// secret nowhere (output, event log, table history and properties).
#[test]
fn an_s3_warehouse_runs_like_a_local_one() {
    let s3 = S3::from_env();
    let w = OnS3 {
        p: Project::new(PIPELINE),
        url: s3.warehouse("like-local"),
        secret: s3.secret.clone(),
        s3: &s3,
    };
    let local = Project::new(PIPELINE);
    let mut wrote = Vec::new();
    for (n, batch) in [BATCH1, BATCH2].iter().enumerate() {
        let name = format!("data/cdc/{n:03}.json");
        w.p.file(&name, batch);
        local.file(&name, batch);
        wrote.push(w.ok(&["run", "pipeline.sql"]));
        local.ok(&["run", "pipeline.sql"]);
    }
    assert!(
        wrote[0].contains("ingested 6 row(s) from 1 file(s)"),
        "{}",
        wrote[0]
    );
    for sql in [
        "SELECT * FROM users ORDER BY userId, __START_AT",
        "SELECT * FROM users_cdc ORDER BY userId, sequenceNum",
        "SELECT * FROM cities ORDER BY city",
    ] {
        assert_eq!(w.csv(sql), local.csv(sql), "{sql}");
    }
    assert!(w.ok(&["validate", "users"]).contains("ok"));
    let again = w.ok(&["run", "pipeline.sql"]);
    assert!(again.contains("no new files"), "{again}");
    assert_eq!(
        w.csv("SELECT count(*) AS n FROM users_cdc").trim(),
        "n\n8",
        "a re-run takes nothing twice"
    );
    assert!(w.ok(&["events"]).contains("users_flow"));
    let tables = w.csv("SHOW TABLES");
    assert!(
        tables.contains("users_cdc") && tables.contains("cities"),
        "{tables}"
    );
    // The secret is nowhere a user or another reader could see it.
    for sql in [
        "SELECT * FROM event_log",
        "DESCRIBE HISTORY users",
        "DESCRIBE DETAIL users",
        "DESCRIBE TABLE EXTENDED users_cdc",
    ] {
        let text = w.ok(&["query", sql]);
        assert!(!text.contains(&s3.secret), "{sql}: {text}");
        assert!(!text.contains(&s3.key_id), "{sql}: {text}");
    }
    // A full refresh moves the old objects aside and rebuilds the same rows.
    let before = w.csv("SELECT * FROM users ORDER BY userId, __START_AT");
    let refreshed = w.ok(&[
        "run",
        "pipeline.sql",
        "--full-refresh",
        "users_cdc",
        "users",
    ]);
    assert!(
        refreshed.contains("previous content is kept in s3://"),
        "{refreshed}"
    );
    assert_eq!(
        w.csv("SELECT * FROM users ORDER BY userId, __START_AT"),
        before
    );
    assert!(w.ok(&["validate", "users"]).contains("ok"));
}

/// Runs started together on one S3 warehouse, round after round with new input: every
/// input row lands in the bronze table exactly once (Delta's conditional commits and
/// transaction ids, the commit itself an `If-None-Match: *` put), and the target equals one
/// run over everything on local disk.
#[test]
fn runs_started_together_on_s3_take_each_file_once() {
    let s3 = S3::from_env();
    let w = OnS3 {
        p: Project::new(PIPELINE),
        url: s3.warehouse("together"),
        secret: s3.secret.clone(),
        s3: &s3,
    };
    let mut delivered = 0;
    for round in 0..2usize {
        for file in 0..3usize {
            let mut text = String::new();
            for i in 0..40usize {
                let id = (round * 1000 + file * 100 + i) % 37;
                let seq = round * 10_000 + file * 1000 + i;
                text.push_str(&format!(
                    "{{\"userId\": {id}, \"name\": \"n{seq}\", \"city\": \"c{}\", \"operation\": \"UPSERT\", \"sequenceNum\": {seq}}}\n",
                    seq % 5
                ));
                delivered += 1;
            }
            w.p.file(&format!("data/cdc/r{round}_{file}.json"), &text);
        }
        let children: Vec<Child> = (0..3)
            .map(|_| {
                w.command(&["run", "pipeline.sql"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("strata starts")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().expect("strata ends");
            assert!(
                out.status.success(),
                "round {round}: a run failed ({:?}): {}",
                out.status.code(),
                stderr(&out)
            );
            w.no_secret(&out);
        }
        assert_eq!(
            w.csv("SELECT count(*) AS n, count(DISTINCT sequenceNum) AS d FROM users_cdc")
                .trim(),
            format!("n,d\n{delivered},{delivered}"),
            "round {round}: every input row exactly once"
        );
    }
    let local = Project::new(PIPELINE);
    for f in std::fs::read_dir(w.p.path("data/cdc")).expect("list") {
        let f = f.expect("entry").path();
        let name = f.file_name().expect("name").to_string_lossy().to_string();
        std::fs::copy(&f, local.path(&format!("data/cdc/{name}"))).expect("copy");
    }
    local.ok(&["run", "pipeline.sql"]);
    for sql in [
        "SELECT * FROM users ORDER BY userId, __START_AT",
        "SELECT * FROM cities ORDER BY city",
    ] {
        assert_eq!(w.csv(sql), local.csv(sql), "{sql}");
    }
    assert!(w.ok(&["validate", "users"]).contains("ok"));
}

/// Credentials the store refuses: the run fails at once with exit code 4 (storage), a
/// message that says the store refused the credentials and names the variables to check,
/// and neither secret in the output; nothing is written.
#[test]
fn refused_credentials_fail_clearly_without_printing_a_secret() {
    let s3 = S3::from_env();
    let wrong = "wrong-secret-do-not-print-8f3a".to_string();
    let w = OnS3 {
        p: Project::new(PIPELINE),
        url: s3.warehouse("refused"),
        secret: wrong.clone(),
        s3: &s3,
    };
    w.p.file("data/cdc/001.json", BATCH1);
    for args in [
        &["run", "pipeline.sql"][..],
        &["query", "SELECT 1 AS one"][..],
    ] {
        let out = w.strata(args);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("refused the credentials") && err.contains("AWS_SECRET_ACCESS_KEY"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        for text in [stdout(&out), err] {
            assert!(
                !text.contains(&wrong) && !text.contains(&s3.secret),
                "{text}"
            );
        }
    }
    let right = OnS3 {
        p: Project::new(PIPELINE),
        url: w.url.clone(),
        secret: s3.secret.clone(),
        s3: &s3,
    };
    let tables = right.csv("SHOW TABLES");
    assert!(!tables.contains("users"), "nothing was written: {tables}");
}

/// `read_files` from an object-store prefix and from a local folder in one pipeline, on an
/// S3 warehouse: the same rows as local input, each file taken once across runs.
#[test]
fn read_files_takes_input_from_s3_like_local_input() {
    let s3 = S3::from_env();
    let url = s3.warehouse("input");
    let input = format!("{}/input/cdc", url.trim_end_matches("/wh"));
    let key_of = |name: &str| {
        let rest = input
            .strip_prefix(&format!("s3://{}/", s3.bucket))
            .expect("in bucket");
        format!("{rest}/{name}")
    };
    let pipeline = format!(
        "{PIPELINE}\nCREATE OR REFRESH STREAMING TABLE remote_cdc AS SELECT * FROM STREAM \
         read_files('{input}', format => 'json', schema => 'userId INT, name STRING, city \
         STRING, operation STRING, sequenceNum INT');\n\
         CREATE OR REFRESH STREAMING TABLE remote_users;\n\
         CREATE FLOW remote_flow AS AUTO CDC INTO remote_users FROM STREAM(remote_cdc) \
         KEYS (userId) APPLY AS DELETE WHEN operation = \"DELETE\" SEQUENCE BY sequenceNum \
         COLUMNS * EXCEPT (operation, sequenceNum) STORED AS SCD TYPE 2;\n"
    );
    let w = OnS3 {
        p: Project::new(&pipeline),
        url,
        secret: s3.secret.clone(),
        s3: &s3,
    };
    for (n, batch) in [BATCH1, BATCH2].iter().enumerate() {
        let name = format!("{n:03}.json");
        w.p.file(&format!("data/cdc/{name}"), batch);
        s3.put(&key_of(&name), batch);
        // Hidden files are not input, as on local disk.
        s3.put(&key_of(&format!("_tmp_{name}")), "not json");
        let out = w.ok(&["run", "pipeline.sql"]);
        assert!(out.contains("table default.remote_cdc: ingested"), "{out}");
    }
    let again = w.ok(&["run", "pipeline.sql"]);
    assert!(again.contains("no new files"), "{again}");
    assert_eq!(
        w.csv("SELECT * EXCEPT (__START_AT) FROM remote_users ORDER BY userId, __END_AT"),
        w.csv("SELECT * EXCEPT (__START_AT) FROM users ORDER BY userId, __END_AT")
    );
    assert_eq!(w.csv("SELECT count(*) AS n FROM remote_cdc").trim(), "n\n8");
    assert!(w.ok(&["validate", "remote_users"]).contains("ok"));
}
