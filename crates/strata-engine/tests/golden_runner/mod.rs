//! The golden-scenario runner shared by the `golden`, `golden_parallel` and
//! `golden_object_storage` test targets: one test per `tests/scenarios/**/*.scn` file, named
//! by its path there without `.scn` (`semantics/ties`), run against the real engine on real
//! Delta tables in a temp dir (`golden_object_storage`: each file twice, as
//! `s3:semantics/ties` in the S3-compatible test server's bucket and as
//! `azure:semantics/ties` in the Azure Storage emulator's container).
//! The format and how to run, filter and complete scenarios are in `tests/scenarios/README.md`.
//!
//! The targets are libtest-mimic harnesses (`harness = false`), so the usual libtest
//! arguments work: `--list`, a name filter, `--exact`, `--test-threads`.
//! `STRATA_GOLDEN_COMPLETE=1` rewrites the expected blocks of the scenarios run from their
//! actual output, in place, for review.

mod place;
mod run;
mod scenario;

use libtest_mimic::{Arguments, Failed, Trial};
use place::Storage;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Which of the engine's paths the scenarios take. The engine reads
/// `STRATA_PARALLEL_MIN_ROWS` once per process, so each mode is a test binary of its own
/// (and each binary constructs only its own variant).
#[allow(dead_code)]
pub enum Mode {
    /// The default threshold: these small inputs take the single-thread fold and write.
    SingleThread,
    /// `STRATA_PARALLEL_MIN_ROWS=1`: every fold and write takes the parallel path; and
    /// `STRATA_STREAM_MIN_ROWS=1`: every first load of a change flow is a bulk load
    /// (`ops/cdc/bulk.rs`: sorted by DataFusion, folded a chunk at a time); and
    /// `STRATA_DV_INLINE_MAX_BYTES=0`: every deletion vector goes to a deletion-vector file.
    Parallel,
    /// The default threshold, each scenario twice: with its warehouse and input files under a
    /// prefix of its own in the bucket of the S3-compatible server, and in the container of
    /// the Azure Storage emulator (Azurite, as `az://` URLs), both started by
    /// `scripts/services/with-services.sh` (`STRATA_TEST_S3_*`, `STRATA_TEST_AZURE_*`);
    /// deletion vectors in deletion-vector files, as in `Parallel`. Each server answers one
    /// request at a time on one core, so the two run side by side ([`OBJECT_STORAGE_THREADS`]
    /// scenarios at once unless `--test-threads` says otherwise).
    ObjectStorage,
}

/// How many scenarios `golden_object_storage` runs at once by default: two per server, whose
/// time goes to the servers (moto and Azurite each use one core), not to this process.
const OBJECT_STORAGE_THREADS: usize = 4;

/// The prefixes of `golden_object_storage`'s test names: `s3:semantics/ties`.
const S3_TRIALS: &str = "s3:";
const AZURE_TRIALS: &str = "azure:";

pub fn main(mode: Mode) -> ExitCode {
    // Before anything else runs (no thread exists yet, and the engine has not read it).
    let storages = match mode {
        Mode::SingleThread => {
            std::env::remove_var("STRATA_PARALLEL_MIN_ROWS");
            std::env::remove_var("STRATA_STREAM_MIN_ROWS");
            std::env::remove_var("STRATA_DV_INLINE_MAX_BYTES");
            vec![("", Ok(Storage::Local))]
        }
        Mode::Parallel => {
            std::env::set_var("STRATA_PARALLEL_MIN_ROWS", "1");
            std::env::set_var("STRATA_STREAM_MIN_ROWS", "1");
            std::env::set_var("STRATA_DV_INLINE_MAX_BYTES", "0");
            vec![("", Ok(Storage::Local))]
        }
        Mode::ObjectStorage => {
            std::env::remove_var("STRATA_PARALLEL_MIN_ROWS");
            std::env::remove_var("STRATA_STREAM_MIN_ROWS");
            std::env::set_var("STRATA_DV_INLINE_MAX_BYTES", "0");
            vec![(S3_TRIALS, s3_from_env()), (AZURE_TRIALS, azure_from_env())]
        }
    };
    let mut args = Arguments::from_args();
    if matches!(mode, Mode::ObjectStorage) && args.test_threads.is_none() {
        args.test_threads = Some(OBJECT_STORAGE_THREADS);
    }
    if std::env::var_os("STRATA_SCENARIO").is_some() {
        eprintln!(
            "STRATA_SCENARIO is no longer read: pass a filter instead, e.g. \
             `cargo test -p strata-engine --test golden -- semantics/ties`"
        );
        return ExitCode::FAILURE;
    }
    let complete = match std::env::var("STRATA_GOLDEN_COMPLETE").as_deref() {
        Err(_) | Ok("") | Ok("0") => false,
        Ok("1") => true,
        Ok(other) => {
            eprintln!("STRATA_GOLDEN_COMPLETE must be 1 (or 0), not `{other}`");
            return ExitCode::FAILURE;
        }
    };
    if complete && matches!(mode, Mode::ObjectStorage) {
        eprintln!(
            "STRATA_GOLDEN_COMPLETE=1 completes scenarios from a run on local disk: use the \
             `golden` target (this one must then give the same rows)"
        );
        return ExitCode::FAILURE;
    }
    let root = repo_root();
    let scenarios = match discover(&root.join("tests/scenarios")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("golden scenarios: {e}");
            return ExitCode::FAILURE;
        }
    };
    libtest_mimic::run(&args, trials(&root, &scenarios, storages, complete)).exit_code()
}

/// One trial per scenario and storage, named `{prefix}{scenario}`, the storages of a scenario
/// next to each other (so that each server has work from start to end). A storage whose
/// server is not set up gives one failing trial, `{prefix}server`, saying how to start it
/// (a filter for the other storage leaves it out).
fn trials(
    root: &Path,
    scenarios: &[(String, PathBuf)],
    storages: Vec<(&'static str, Result<Storage, String>)>,
    complete: bool,
) -> Vec<Trial> {
    let mut out = Vec::new();
    let mut ready = Vec::new();
    for (prefix, storage) in storages {
        match storage {
            Ok(s) => ready.push((prefix, s)),
            Err(e) => out.push(Trial::test(
                format!("{prefix}server"),
                move || Err(e.into()),
            )),
        }
    }
    for (name, path) in scenarios {
        let display = path
            .strip_prefix(root)
            .unwrap_or(path)
            .display()
            .to_string();
        for (prefix, storage) in &ready {
            let (name, path, display) = (name.clone(), path.clone(), display.clone());
            let storage = storage.clone();
            out.push(Trial::test(format!("{prefix}{name}"), move || {
                scenario_test(&path, &name, &display, &storage, complete)
            }));
        }
    }
    out
}

/// The checkout being tested. `cargo test` sets `CARGO_MANIFEST_DIR` when it runs the test,
/// which names that checkout even when the binary was built from another clone sharing the
/// same `CARGO_TARGET_DIR`; the path compiled in is the fallback (a binary run directly).
fn repo_root() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = crate_dir.join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Every `*.scn` under `dir`, as (test name, path), sorted. Refuses an empty or missing
/// folder, and files that are neither scenarios nor notes (`*.md`), so that a misnamed
/// scenario is not silently skipped. Hidden files and editor backups (`~`) are ignored.
fn discover(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries {
            let p = e.map_err(|e| e.to_string())?.path();
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with('.') || name.ends_with('~') {
                continue;
            }
            if p.is_dir() {
                walk(&p, out)?;
            } else if p.extension().is_some_and(|x| x == "scn") {
                out.push(p);
            } else if p.extension().is_none_or(|x| x != "md") {
                return Err(format!(
                    "{} is not a scenario: scenario files end in .scn (notes in .md)",
                    p.display()
                ));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    if files.is_empty() {
        return Err(format!("no *.scn files under {}", dir.display()));
    }
    files.sort();
    Ok(files
        .into_iter()
        .map(|p| {
            let name = p
                .strip_prefix(dir)
                .expect("under the folder")
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            (name, p)
        })
        .collect())
}

/// The one runtime every scenario of the process runs on (each test thread blocks on it), as
/// the CLI and the Python module run the engine: the engine keeps one object-store client per
/// bucket or container for the whole process, and that client's pooled connections belong to
/// the runtime that opened them. With a runtime per scenario, a request that took a
/// connection opened on the runtime of a scenario that had since ended failed with
/// `dispatch task is gone: runtime dropped the dispatch task` (30 of the scenarios on
/// Azurite, in one run).
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One scenario file: parse, run, and in completion mode write the completed file back.
fn scenario_test(
    path: &Path,
    name: &str,
    display: &str,
    storage: &Storage,
    complete: bool,
) -> Result<(), Failed> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{display}: {e}"))?;
    let scenario = scenario::parse(display, &text, complete)?;
    let mut edits = runtime()?.block_on(run::run(&scenario, name, display, storage, complete))?;
    if edits.is_empty() {
        return Ok(());
    }
    let n = edits.len();
    edits.sort_by_key(|e| std::cmp::Reverse(e.start));
    let mut lines = scenario.lines;
    for e in edits {
        lines.splice(e.start..e.end, e.lines);
    }
    let mut out = lines.join("\n");
    if scenario.ends_with_newline {
        out.push('\n');
    }
    std::fs::write(path, out).map_err(|e| format!("{display}: {e}"))?;
    eprintln!("completed {display}: {n} block(s) rewritten");
    Ok(())
}

/// The test server a mode of the target runs against, as `scripts/services/with-services.sh`
/// starts it and names it.
struct Server {
    /// Its trials' prefix in the test target (`s3:`).
    prefix_of_trials: &'static str,
    /// What it is, for the message (`the S3-compatible test server`).
    what: &'static str,
    /// Its name in `STRATA_SERVICES` (`s3`).
    service: &'static str,
    /// The prefix of the variables `with-services.sh` exports for it (`STRATA_TEST_S3_`).
    prefix: &'static str,
}

impl Server {
    /// The variable `{prefix}{name}`, or why it is missing and how to run the target.
    fn var(&self, name: &str) -> Result<String, String> {
        let key = format!("{}{name}", self.prefix);
        std::env::var(&key).map_err(|_| {
            format!(
                "{key} is not set: the golden scenarios on {} need {}; run them under \
                 scripts/services/with-services.sh (scripts/test.sh does), e.g. \
                 `STRATA_SERVICES={} scripts/services/with-services.sh cargo test --workspace \
                 --test golden_object_storage -- {}`",
                self.service, self.what, self.service, self.prefix_of_trials
            )
        })
    }
}

/// Replaces every variable of the caller whose name starts with one of `prefixes` with
/// `settings` (before any thread exists: `main` calls this first).
fn set_env(prefixes: &[&str], settings: Vec<(&str, String)>) {
    for (k, _) in std::env::vars().filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p))) {
        std::env::remove_var(k);
    }
    for (k, v) in settings {
        std::env::set_var(k, v);
    }
}

/// A name for this run of the target: the prefix of the bucket or container it works under.
fn run_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("golden-{}-{nanos}", std::process::id())
}

/// The S3-compatible test server from `STRATA_TEST_S3_*`, handed to the engine (and to the
/// runner's own client) as the `AWS_*` settings it reads, with any other `AWS_*` of the
/// caller removed. Each run of the target works under a prefix of its own.
fn s3_from_env() -> Result<Storage, String> {
    let server = Server {
        prefix_of_trials: S3_TRIALS,
        what: "the S3-compatible test server (moto)",
        service: "s3",
        prefix: "STRATA_TEST_S3_",
    };
    let var = |name: &str| server.var(name);
    let endpoint = var("ENDPOINT")?;
    let bucket = var("BUCKET")?;
    let settings = vec![
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ACCESS_KEY_ID", var("ACCESS_KEY_ID")?),
        ("AWS_SECRET_ACCESS_KEY", var("SECRET_ACCESS_KEY")?),
        ("AWS_REGION", var("REGION")?),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    set_env(&["AWS_"], settings);
    Ok(Storage::S3 {
        bucket,
        run: run_prefix(),
    })
}

/// Azurite's documented account key (not a secret; object_store's default in emulator mode).
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The Azure Storage emulator (Azurite) from `STRATA_TEST_AZURE_*`, handed to the engine (and
/// to the runner's own client) as the object_store emulator settings it reads
/// (`MicrosoftAzureBuilder::from_env`: `AZURE_STORAGE_USE_EMULATOR`, `AZURITE_BLOB_STORAGE_URL`,
/// the account and its well-known key), with any other `AZURE_*` / `AZURITE_*` of the caller
/// removed; the same settings the CLI tests give the binary. Each run of the target works
/// under a prefix of its own.
fn azure_from_env() -> Result<Storage, String> {
    let server = Server {
        prefix_of_trials: AZURE_TRIALS,
        what: "the Azure Storage emulator (Azurite)",
        service: "azurite",
        prefix: "STRATA_TEST_AZURE_",
    };
    let var = |name: &str| server.var(name);
    let blob_url = var("BLOB_URL")?;
    let account = var("ACCOUNT")?;
    let container = var("CONTAINER")?;
    let settings = vec![
        ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
        ("AZURITE_BLOB_STORAGE_URL", blob_url),
        ("AZURE_STORAGE_ACCOUNT_NAME", account),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.to_string()),
    ];
    set_env(&["AZURE_", "AZURITE_"], settings);
    Ok(Storage::Azure {
        container,
        run: run_prefix(),
    })
}
