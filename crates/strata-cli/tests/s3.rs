//! Warehouses on object storage, on the real binary against the S3-compatible server that
//! `scripts/services/with-services.sh` starts (moto, checking credentials as S3 does;
//! `STRATA_TEST_S3_*`). Each test works under its own prefix of the bucket. The drills shared
//! with the Azure emulator (`azure.rs`) are in `common/object_store.rs`.
mod common;

use common::object_store::{self as store, OnStore, Server, BATCH1, BATCH2, PIPELINE, S3};
use common::{stderr, stdout};

#[test]
fn the_test_server_refuses_a_second_create_of_one_key() {
    store::server_refuses_a_second_create_of_one_key(&S3::from_env());
}

#[test]
fn an_s3_warehouse_runs_like_a_local_one() {
    store::a_warehouse_runs_like_a_local_one(&S3::from_env());
}

#[test]
fn runs_started_together_on_s3_take_each_file_once() {
    store::runs_started_together_take_each_file_once(&S3::from_env());
}

/// Credentials the store refuses: the run fails at once with exit code 4 (storage), a
/// message that says the store refused the credentials and names the variables to check,
/// and neither secret in the output; nothing is written.
#[test]
fn refused_credentials_fail_clearly_without_printing_a_secret() {
    let s3 = S3::from_env();
    let wrong = "wrong-secret-do-not-print-8f3a".to_string();
    let w = OnStore {
        secret: wrong.clone(),
        ..OnStore::new(&s3, "refused", PIPELINE)
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
    let right = OnStore {
        url: w.url.clone(),
        ..OnStore::new(&s3, "refused", PIPELINE)
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
    let key_of = |name: &str| format!("{}/{name}", s3.key_of(&input));
    let pipeline = format!(
        "{PIPELINE}\nCREATE OR REFRESH STREAMING TABLE remote_cdc AS SELECT * FROM STREAM \
         read_files('{input}', format => 'json', schema => 'userId INT, name STRING, city \
         STRING, operation STRING, sequenceNum INT');\n\
         CREATE OR REFRESH STREAMING TABLE remote_users;\n\
         CREATE FLOW remote_flow AS AUTO CDC INTO remote_users FROM STREAM(remote_cdc) \
         KEYS (userId) APPLY AS DELETE WHEN operation = \"DELETE\" SEQUENCE BY sequenceNum \
         COLUMNS * EXCEPT (operation, sequenceNum) STORED AS SCD TYPE 2;\n"
    );
    let w = OnStore {
        url,
        ..OnStore::new(&s3, "input", &pipeline)
    };
    for (n, batch) in [BATCH1, BATCH2].iter().enumerate() {
        let name = format!("{n:03}.json");
        w.p.file(&format!("data/cdc/{name}"), batch);
        store::put(&s3, &key_of(&name), batch);
        // Hidden files are not input, as on local disk.
        store::put(&s3, &key_of(&format!("_tmp_{name}")), "not json");
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

#[test]
fn event_store_small_files_compact_on_s3() {
    store::event_store_small_files_compact_on_the_store(&S3::from_env());
}
