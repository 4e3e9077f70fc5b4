//! Warehouses on the object-store test servers that `scripts/services/with-services.sh`
//! starts (moto for S3, `STRATA_TEST_S3_*`; Azurite for Azure Blob Storage / ADLS,
//! `STRATA_TEST_AZURE_*`), the real binary run against them, and the drills that run the same
//! way on either (`s3.rs`, `azure.rs`). Each test works under its own prefix.

use super::{stderr, stdout, Project};
use deltalake::logstore::object_store::{
    aws::AmazonS3Builder, azure::MicrosoftAzureBuilder, path::Path as StorePath, ObjectStore,
    ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use std::process::{Command, Output};
use std::sync::Arc;

pub const PIPELINE: &str = r#"
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

pub const BATCH1: &str = r#"{"userId": 124, "name": "Raul", "city": "Oaxaca", "operation": "INSERT", "sequenceNum": 1}
{"userId": 123, "name": "Isabel", "city": "Monterrey", "operation": "INSERT", "sequenceNum": 1}
{"userId": 125, "name": "Mercedes", "city": "Tijuana", "operation": "INSERT", "sequenceNum": 2}
{"userId": 126, "name": "Lily", "city": "Cancun", "operation": "INSERT", "sequenceNum": 2}
{"userId": 123, "name": null, "city": null, "operation": "DELETE", "sequenceNum": 6}
{"userId": 125, "name": "Mercedes", "city": "Guadalajara", "operation": "UPDATE", "sequenceNum": 6}
"#;

pub const BATCH2: &str = r#"{"userId": 125, "name": "Mercedes", "city": "Mexicali", "operation": "UPDATE", "sequenceNum": 5}
{"userId": 123, "name": "Isabel", "city": "Chihuahua", "operation": "UPDATE", "sequenceNum": 5}
"#;

/// A test server: where a test's warehouse goes, what the binary needs in its environment to
/// reach it, and a client for the tests' own requests.
pub trait Server {
    /// A warehouse URL under a prefix no other test (or earlier run) uses.
    fn warehouse(&self, test: &str) -> String;
    /// The environment the binary reaches the server with, the secret being `secret`.
    fn env(&self, secret: &str) -> Vec<(&'static str, String)>;
    /// The prefix of the environment variables of this kind of store (removed first).
    fn env_prefix(&self) -> &'static str;
    /// The secret the server accepts (never printed).
    fn secret(&self) -> &str;
    /// The key naming the secret, where it is not part of the warehouse URL (never printed).
    fn key_id(&self) -> Option<&str>;
    /// A client of the bucket or container.
    fn client(&self) -> Arc<dyn ObjectStore>;
    /// The object key of `url` (one of [`Server::warehouse`]'s, or below one) in the bucket.
    fn key_of(&self, url: &str) -> String;
}

fn from_env(prefix: &str, name: &str) -> String {
    let key = format!("{prefix}{name}");
    std::env::var(&key).unwrap_or_else(|_| {
        panic!(
            "{key} is not set: run the tests under scripts/services/with-services.sh (the \
             README's test command does)"
        )
    })
}

/// A prefix of the test bucket or container no other test (or earlier run) uses.
fn unique(test: &str) -> String {
    format!("{test}-{}", super::unique_suffix().replace('_', "-"))
}

/// The S3-compatible server (moto).
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    pub key_id: String,
    pub secret: String,
    pub region: String,
}

impl S3 {
    pub fn from_env() -> S3 {
        let var = |name: &str| from_env("STRATA_TEST_S3_", name);
        S3 {
            endpoint: var("ENDPOINT"),
            bucket: var("BUCKET"),
            key_id: var("ACCESS_KEY_ID"),
            secret: var("SECRET_ACCESS_KEY"),
            region: var("REGION"),
        }
    }
}

impl Server for S3 {
    fn warehouse(&self, test: &str) -> String {
        format!("s3://{}/{}/wh", self.bucket, unique(test))
    }

    fn env(&self, secret: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", self.key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
            ("AWS_REGION", self.region.clone()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }

    fn env_prefix(&self) -> &'static str {
        "AWS_"
    }

    fn secret(&self) -> &str {
        &self.secret
    }

    fn key_id(&self) -> Option<&str> {
        Some(&self.key_id)
    }

    fn client(&self) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_bucket_name(&self.bucket)
                .with_endpoint(&self.endpoint)
                .with_allow_http(true)
                .with_region(&self.region)
                .with_access_key_id(&self.key_id)
                .with_secret_access_key(&self.secret)
                .build()
                .expect("an S3 client"),
        )
    }

    fn key_of(&self, url: &str) -> String {
        url.strip_prefix(&format!("s3://{}/", self.bucket))
            .expect("in the test bucket")
            .to_string()
    }
}

/// The Azure Blob Storage / ADLS emulator (Azurite), reached with object_store's emulator
/// settings: its well-known account `devstoreaccount1` and key.
pub struct Azure {
    pub blob_url: String,
    pub account: String,
    pub container: String,
    /// `abfss://container@account.dfs.core.windows.net/...` URLs instead of `az://container/...`.
    pub abfss: bool,
}

/// Azurite's documented account key (not a secret; object_store uses it in emulator mode).
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

impl Azure {
    pub fn from_env(abfss: bool) -> Azure {
        let var = |name: &str| from_env("STRATA_TEST_AZURE_", name);
        Azure {
            blob_url: var("BLOB_URL"),
            account: var("ACCOUNT"),
            container: var("CONTAINER"),
            abfss,
        }
    }

    fn root(&self) -> String {
        match self.abfss {
            true => format!(
                "abfss://{}@{}.dfs.core.windows.net",
                self.container, self.account
            ),
            false => format!("az://{}", self.container),
        }
    }
}

impl Server for Azure {
    fn warehouse(&self, test: &str) -> String {
        format!("{}/{}/wh", self.root(), unique(test))
    }

    fn env(&self, secret: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
            ("AZURITE_BLOB_STORAGE_URL", self.blob_url.clone()),
            ("AZURE_STORAGE_ACCOUNT_NAME", self.account.clone()),
            ("AZURE_STORAGE_ACCOUNT_KEY", secret.to_string()),
        ]
    }

    fn env_prefix(&self) -> &'static str {
        "AZURE_"
    }

    fn secret(&self) -> &str {
        AZURITE_KEY
    }

    fn key_id(&self) -> Option<&str> {
        None // the account name is part of abfss:// URLs
    }

    /// Azurite's account as an ordinary endpoint (emulator mode would read its URL from this
    /// process's environment, which tests running side by side must not change).
    fn client(&self) -> Arc<dyn ObjectStore> {
        Arc::new(
            MicrosoftAzureBuilder::new()
                .with_endpoint(format!("{}/{}", self.blob_url, self.account))
                .with_allow_http(true)
                .with_account(&self.account)
                .with_access_key(AZURITE_KEY)
                .with_container_name(&self.container)
                .build()
                .expect("an Azure client"),
        )
    }

    fn key_of(&self, url: &str) -> String {
        url.strip_prefix(&format!("{}/", self.root()))
            .expect("in the test container")
            .to_string()
    }
}

/// Writes `text` as the object `key` of the server's bucket or container.
pub fn put(server: &dyn Server, key: &str, text: &str) {
    let store = server.client();
    runtime()
        .block_on(store.put(&StorePath::from(key), PutPayload::from(text.to_string())))
        .expect("put");
}

/// The text of the newest commit of the Delta table at `url` on the server.
pub fn latest_commit(server: &dyn Server, url: &str) -> String {
    let store = server.client();
    let log = StorePath::from(format!("{}/_delta_log", server.key_of(url)));
    runtime().block_on(async {
        let commits = log_commits(store.as_ref(), &log).await;
        let newest = commits.last().expect("a commit");
        let bytes = store
            .get(newest)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        String::from_utf8(bytes.to_vec()).expect("utf8")
    })
}

/// The commit files of the Delta log `log` in `store`, in version order.
async fn log_commits(store: &dyn ObjectStore, log: &StorePath) -> Vec<StorePath> {
    let mut commits: Vec<StorePath> = store
        .list_with_delimiter(Some(log))
        .await
        .expect("list the log")
        .objects
        .into_iter()
        .map(|m| m.location)
        .filter(|p| p.as_ref().ends_with(".json"))
        .collect();
    commits.sort();
    commits
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A project whose commands reach the warehouse `url` on `server` with `secret`.
pub struct OnStore<'a> {
    pub p: Project,
    pub server: &'a dyn Server,
    pub url: String,
    pub secret: String,
}

impl<'a> OnStore<'a> {
    /// A project running `pipeline` on a fresh warehouse of `server` (named after `test`),
    /// with the server's own secret.
    pub fn new(server: &'a dyn Server, test: &str, pipeline: &str) -> OnStore<'a> {
        OnStore {
            p: Project::new(pipeline),
            url: server.warehouse(test),
            secret: server.secret().to_string(),
            server,
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = self.p.command(args);
        let prefix = self.server.env_prefix();
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with(prefix)) {
            c.env_remove(k);
        }
        c.env("STRATA_WAREHOUSE", &self.url);
        for (k, v) in self.server.env(&self.secret) {
            c.env(k, v);
        }
        c
    }

    pub fn strata(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("strata runs")
    }

    /// Runs `args`, which must succeed and print no secret; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.strata(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed: {}",
            stderr(&out)
        );
        self.no_secret(&out);
        stdout(&out)
    }

    pub fn csv(&self, sql: &str) -> String {
        self.ok(&["query", "--format", "csv", sql])
    }

    pub fn no_secret(&self, out: &Output) {
        for text in [stdout(out), stderr(out)] {
            assert!(
                !text.contains(self.server.secret()),
                "a secret was printed: {text}"
            );
        }
    }
}

/// The test server honours conditional put, which strata's commits rely on: a second create
/// of one key is refused (else the drill of runs started together would prove nothing).
pub fn server_refuses_a_second_create_of_one_key(server: &dyn Server) {
    use deltalake::logstore::object_store::Error;
    let store = server.client();
    let key = server.key_of(&server.warehouse("create"));
    let path = StorePath::from(format!("{key}/00000000000000000000.json"));
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    runtime().block_on(async {
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

/// Everything a user does with a warehouse, on the server: runs (ingestion from local files,
/// AUTO CDC SCD2, a materialized view), `query`, `validate`, `events`, a re-run that finds
/// nothing new, a full refresh; the same rows as the same runs on local disk, and the secret
/// nowhere (output, event log, table history and properties).
pub fn a_warehouse_runs_like_a_local_one(server: &dyn Server) {
    let w = OnStore::new(server, "like-local", PIPELINE);
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
    // The second batch replaced the old rows the way it does on disk: through the
    // deletion-vector path of strata's replace (here the one file touched is mostly
    // replaced, so it is written again rather than given a vector), not a MERGE.
    let commit = latest_commit(server, &format!("{}/default/users", w.url));
    assert!(
        commit.contains("old rows marked deleted") && !commit.contains("\"MERGE\""),
        "{commit}"
    );
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
        assert!(!text.contains(server.secret()), "{sql}: {text}");
        if let Some(key_id) = server.key_id() {
            assert!(!text.contains(key_id), "{sql}: {text}");
        }
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
    let scheme = w.url.split("://").next().expect("a URL");
    assert!(
        refreshed.contains(&format!("previous content is kept in {scheme}://")),
        "{refreshed}"
    );
    assert_eq!(
        w.csv("SELECT * FROM users ORDER BY userId, __START_AT"),
        before
    );
    assert!(w.ok(&["validate", "users"]).contains("ok"));
}

/// Runs started together on one warehouse of the server, round after round with new input:
/// every input row lands in the bronze table exactly once (Delta's conditional commits and
/// transaction ids, the commit itself a create-only put: `If-None-Match: *`), and the target
/// equals one run over everything on local disk.
pub fn runs_started_together_take_each_file_once(server: &dyn Server) {
    let w = OnStore::new(server, "together", PIPELINE);
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
        let outs = super::run_together(
            (0..3).map(|_| w.command(&["run", "pipeline.sql"])),
            &format!("round {round}"),
        );
        for out in &outs {
            w.no_secret(out);
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

/// Eleven runs with one new file each: after the tenth, the run compacts the AUTO CDC
/// target's ten small event-store files on the server into one (read back through the
/// store's own object-store backend), and after every run the tables equal the same runs'
/// on local disk.
pub fn event_store_small_files_compact_on_the_store(server: &dyn Server) {
    let w = OnStore::new(server, "store-compaction", PIPELINE);
    let local = Project::new(PIPELINE);
    let cities = ["Oaxaca", "Monterrey", "Tijuana", "Cancun"];
    let mut compacted = Vec::new();
    for run in 0..11usize {
        let mut text = String::new();
        for i in 0..6usize {
            let (id, seq) = (120 + (run * 7 + i * 3) % 9, run * 10 + i);
            let op = match (run + i) % 5 {
                0 => "DELETE",
                _ => "UPDATE",
            };
            let city = cities[(run + i) % cities.len()];
            text.push_str(&format!(
                "{{\"userId\": {id}, \"name\": \"u{id}\", \"city\": \"{city}\", \
                 \"operation\": \"{op}\", \"sequenceNum\": {seq}}}\n"
            ));
        }
        let name = format!("data/cdc/{run:03}.json");
        w.p.file(&name, &text);
        local.file(&name, &text);
        let out = w.ok(&["run", "pipeline.sql"]);
        if out.contains("optimized default.users (event store): 10 file(s) -> 1 file(s)") {
            compacted.push(run);
        }
        local.ok(&["run", "pipeline.sql"]);
        for sql in [
            "SELECT * FROM users ORDER BY userId, __START_AT",
            "SELECT * FROM cities ORDER BY city",
        ] {
            assert_eq!(w.csv(sql), local.csv(sql), "after run {run}: {sql}");
        }
    }
    assert_eq!(compacted, [9], "the store compacted after the tenth run");
    assert!(w.ok(&["validate", "users"]).contains("ok"));
}

/// Every row of the Delta table at `url` on the server, one line per row (its values as
/// text, columns in table order), sorted: the table's live files by its log (adds not
/// removed since, without deletion vectors), read as Parquet. For tables strata reads
/// nowhere else, such as an event store.
pub fn delta_rows(server: &dyn Server, url: &str) -> Vec<String> {
    use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
    use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let store = server.client();
    let root = server.key_of(url);
    let log = StorePath::from(format!("{root}/_delta_log"));
    runtime().block_on(async {
        let commits = log_commits(store.as_ref(), &log).await;
        let mut live = std::collections::BTreeSet::new();
        for commit in commits {
            let bytes = store
                .get(&commit)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes");
            for line in String::from_utf8(bytes.to_vec()).expect("utf8").lines() {
                let action: serde_json::Value = serde_json::from_str(line).expect("json");
                if let Some(add) = action.get("add") {
                    assert!(
                        add.get("deletionVector").is_none_or(|d| d.is_null()),
                        "no deletion vectors in {url}"
                    );
                    live.insert(add["path"].as_str().expect("a path").to_string());
                }
                if let Some(remove) = action.get("remove") {
                    live.remove(remove["path"].as_str().expect("a path"));
                }
            }
        }
        let mut rows = Vec::new();
        let options = FormatOptions::default().with_null("NULL");
        for file in live {
            let path = StorePath::from(format!("{root}/{file}"));
            let bytes = store
                .get(&path)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes");
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .expect("parquet")
                .build()
                .expect("a reader");
            for batch in reader {
                let batch = batch.expect("a batch");
                let columns: Vec<ArrayFormatter> = batch
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("format"))
                    .collect();
                for r in 0..batch.num_rows() {
                    let values: Vec<String> =
                        columns.iter().map(|c| c.value(r).to_string()).collect();
                    rows.push(values.join(","));
                }
            }
        }
        rows.sort();
        rows
    })
}
