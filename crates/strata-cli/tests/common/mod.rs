//! What the CLI test files share: a project folder in a temp dir and the real binary run in
//! it.
#![allow(dead_code, unused_macros, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod cluster;
pub mod database;
pub mod object_store;
pub mod serve;

/// A temp folder holding `pipeline.sql` and `data/cdc/`; the warehouse is `./warehouse`.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new(pipeline: &str) -> Project {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("data/cdc")).expect("mkdir");
        std::fs::write(dir.path().join("pipeline.sql"), pipeline).expect("write");
        Project { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `text` to `rel`, making its folder if needed.
    pub fn file(&self, rel: &str, text: &str) {
        let path = self.path(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::write(path, text).expect("write");
    }

    /// The binary, run in the project folder with no warehouse or log settings inherited.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
        c.args(args)
            .current_dir(self.dir.path())
            .env_remove("STRATA_WAREHOUSE")
            .env_remove("RUST_LOG");
        c
    }

    pub fn strata(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("strata runs")
    }

    pub fn run(&self) -> Output {
        self.strata(&["run", "pipeline.sql"])
    }

    /// Runs `args`, which must succeed, and returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.strata(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed: {}",
            stderr(&out)
        );
        stdout(&out)
    }

    pub fn query(&self, format: &str, sql: &str) -> String {
        let out = self.strata(&["query", "--format", format, sql]);
        assert!(out.status.success(), "query failed: {}", stderr(&out));
        stdout(&out)
    }

    pub fn csv(&self, sql: &str) -> String {
        self.query("csv", sql)
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Every file of the warehouse's tables and event stores; the event log, which records
/// every run (failed ones too), is left out.
pub fn table_files(p: &Path) -> Vec<String> {
    let mut out: Vec<String> = walk(p)
        .into_iter()
        .map(|f| f.strip_prefix(p).unwrap_or(&f).display().to_string())
        .filter(|f| !f.starts_with("_strata/event_log"))
        .collect();
    out.sort();
    out
}

pub fn walk(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(p) {
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

impl Project {
    /// `sql`'s rows as CSV lines, sorted (for queries without an order).
    pub fn sorted_csv(&self, sql: &str) -> Vec<String> {
        let mut lines: Vec<String> = self.csv(sql).lines().map(str::to_string).collect();
        lines.sort();
        lines
    }

    /// Copies every input file under `data/` into `other`'s (a twin fed the same input).
    pub fn copy_input_to(&self, other: &Project) {
        for f in walk(&self.path("data")) {
            let rel = f.strip_prefix(self.dir.path()).expect("under the project");
            let to = other.dir.path().join(rel);
            std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
            std::fs::copy(&f, &to).expect("copy");
        }
    }
}

/// The version of the Delta table at `table` (its newest `_delta_log/N.json`), if any.
pub fn delta_version(table: &Path) -> Option<u64> {
    std::fs::read_dir(table.join("_delta_log"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".json")?.parse::<u64>().ok()
        })
        .max()
}

/// A tmpfs of a given size mounted on a folder (disk-full and read-only drills), unmounted
/// when dropped. Needs root and `mount`; without them the test fails, saying so.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`4m`) on `dir`, which is created.
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let at = dir.display().to_string();
        mount(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &at]);
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    /// `mount -o remount,OPTIONS`: `ro`, `rw`, `size=64m`.
    pub fn remount(&self, options: &str) {
        let dir = self.dir.display().to_string();
        mount(&["-o", &format!("remount,{options}"), &dir]);
    }

    /// Fills the file system with a ballast file (`.ballast` at its root) until `leave`
    /// bytes (rounded to pages) are free.
    pub fn fill(&self, leave: u64) {
        use std::io::Write;
        let path = self.ballast();
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::File::create(&path).expect("ballast");
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        f.set_len(written.saturating_sub(leave)).expect("ballast");
    }

    /// Removes the ballast: the room `fill` took is free again.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.ballast());
    }

    fn ballast(&self) -> PathBuf {
        self.dir.join(".ballast")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let done = Command::new("umount").arg(&self.dir).status();
        if !done.is_ok_and(|s| s.success()) {
            // Busy (a process still holds a file): detach it now, free it when let go.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

fn mount(args: &[&str]) {
    let out = Command::new("mount")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("this test needs root and `mount`: mount {args:?}: {e}"));
    assert!(
        out.status.success(),
        "this test needs root and `mount` (tmpfs, remount): mount {args:?} failed: {}",
        stderr(&out)
    );
}

/// A whole-number setting from the environment (drill sizes), else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator (no dependency): xorshift.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Pipeline text the drills share, as literals they `concat!` their own datasets to: a
/// bronze table of JSON change events under `data/cdc` (`eid`, `id`, `name`, `op`, `seq`)
/// and its SCD type 2 history `people_history`.
macro_rules! events_and_history {
    () => {
        r#"
CREATE OR REFRESH STREAMING TABLE events_raw
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'eid BIGINT, id BIGINT, name STRING, op STRING, seq BIGINT');

CREATE OR REFRESH STREAMING TABLE people_history;
CREATE FLOW people_history_flow AS AUTO CDC INTO people_history FROM STREAM(events_raw)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op, seq) STORED AS SCD TYPE 2;
"#
    };
}
pub(crate) use events_and_history;

/// The SCD type 1 table `people` over [`events_and_history`]'s bronze table.
macro_rules! people_scd1 {
    () => {
        r#"
CREATE OR REFRESH STREAMING TABLE people;
CREATE FLOW people_flow AS AUTO CDC INTO people FROM STREAM(events_raw)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op) STORED AS SCD TYPE 1;
"#
    };
}
pub(crate) use people_scd1;

/// `<pid>_<n>_<nanos>`: a suffix no other name made by this process (`n` counts them) or by
/// another test process uses. Tests start two at a time at the same instant, so the time
/// alone can repeat: two tests once drew the same slot name and raced to create it.
pub fn unique_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{}_{n}_{nanos}", std::process::id())
}

/// A seed from `STRATA_DRILL_SEED`, else from the clock (odd, never 0); drills print it so
/// that a failure replays.
pub fn drill_seed() -> u64 {
    std::env::var("STRATA_DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        })
}

/// Starts every command at once (a concurrency drill's runs), waits for all of them and
/// returns their outputs; each must succeed (`what` names the round in the message).
pub fn run_together(commands: impl IntoIterator<Item = Command>, what: &str) -> Vec<Output> {
    let children: Vec<std::process::Child> = commands
        .into_iter()
        .map(|mut c| {
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("strata starts")
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("strata ends");
            assert!(
                out.status.success(),
                "{what}: a run started together failed ({:?}): {}",
                out.status.code(),
                stderr(&out)
            );
            out
        })
        .collect()
}
