//! `read_files` on fuzzed JSON and CSV files, through the public API only: the input becomes
//! one or two files in a temp folder (split at the first NUL byte, each delivered in its own
//! run, so schema inference and evolution meet across runs) and a tiny pipeline runs over
//! them with `strata_engine::run_pipeline` on a temp warehouse; each successful run is read
//! back with `strata_engine::query`. Errors are fine; a panic (anywhere, also on a worker
//! thread) is a crash, an internal error ("this is a bug in strata") is a crash, and a
//! rejected input file must be named in the error (`file in/0001.json: ...`), or the flow it
//! failed (`flow f: ...`).
//!
//! The first byte picks the pipeline (`mode & 0x0f`; the seeds use ASCII digits):
//! bit 0: CSV instead of JSON; bit 1: a declared `schema =>` instead of inference;
//! bit 2: an AUTO CDC flow (SCD type 2 on the declared schema, type 1 when inferred,
//! keyed by `id`, sequenced by `seq`) reads the table; bit 3: CSV without a header row.
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets/read_files.rs) and the workspace
//! smoke test (crates/strata-engine/tests/fuzz_smoke.rs).

use std::sync::OnceLock;
use strata_engine::{EngineError, RunOptions, Warehouse};

const JSON_SCHEMA: &str = "id BIGINT, name STRING, city STRING, op STRING, seq BIGINT, \
                           ts TIMESTAMP, amount DECIMAL(10,2), ok BOOLEAN, day DATE, \
                           tags ARRAY<STRING>, attrs STRUCT<a: INT, b: STRING>";
const CSV_SCHEMA: &str = "id BIGINT, name STRING, city STRING, op STRING, seq BIGINT, \
                          ts TIMESTAMP, amount DECIMAL(10,2), ok BOOLEAN, day DATE";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fn pipeline(mode: u8) -> String {
    let csv = mode & 1 != 0;
    let declared = mode & 2 != 0;
    let flow = mode & 4 != 0;
    let no_header = mode & 8 != 0;
    let mut options = vec![format!("format => '{}'", if csv { "csv" } else { "json" })];
    if csv {
        options.push(format!("header => {}", !no_header));
    }
    if declared {
        options.push(format!(
            "schema => '{}'",
            if csv { CSV_SCHEMA } else { JSON_SCHEMA }
        ));
    }
    let mut sql = format!(
        "CREATE STREAMING TABLE t AS SELECT * FROM STREAM read_files('in', {});\n",
        options.join(", ")
    );
    if flow {
        sql.push_str(&format!(
            "CREATE OR REFRESH STREAMING TABLE target;\n\
             CREATE FLOW f AS AUTO CDC INTO target FROM STREAM(t) KEYS (id)\n\
             APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq STORED AS SCD TYPE {};\n",
            if declared { 2 } else { 1 }
        ));
    }
    sql
}

async fn run(mode: u8, files: Vec<&[u8]>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).expect("input folder");
    let path = dir.path().join("pipeline.sql");
    std::fs::write(&path, pipeline(mode)).expect("pipeline");
    let wh = Warehouse::open(dir.path().join("wh")).expect("warehouse");
    let ext = if mode & 1 != 0 { "csv" } else { "json" };
    for (i, content) in files.into_iter().enumerate() {
        let name = format!("{:04}.{ext}", i + 1);
        std::fs::write(input.join(&name), content).expect("input file");
        match strata_engine::run_pipeline(&path, &wh, &RunOptions::default()).await {
            Ok(_) => {
                for sql in ["SELECT * FROM t", "SELECT * FROM target"] {
                    if let Err(EngineError::Internal(m)) = strata_engine::query(&wh, sql).await {
                        panic!("{sql}: internal error: {m}");
                    }
                }
                if mode & 6 == 6 {
                    if let Err(EngineError::Internal(m)) =
                        strata_engine::validate(&wh, "target").await
                    {
                        panic!("validate: internal error: {m}");
                    }
                }
            }
            Err(e) => {
                let message = strata_engine::chain(&e);
                match &e {
                    EngineError::Internal(_) => panic!("internal error: {message}"),
                    EngineError::BadInput(_) => assert!(
                        message.contains(".json")
                            || message.contains(".csv")
                            || message.contains("flow f"),
                        "a rejected input names no file: {message}"
                    ),
                    _ => {}
                }
                // A failed run commits nothing; later files are not needed to find more.
                return;
            }
        }
    }
}

/// The check on one input; a panic (on any thread) is a finding.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mode = mode & 0x0f;
    let files: Vec<&[u8]> = match rest.iter().position(|&b| b == 0) {
        Some(at) => vec![&rest[..at], &rest[at + 1..]],
        None => vec![rest],
    };
    runtime().block_on(run(mode, files));
}
