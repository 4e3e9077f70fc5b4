//! What the CLI test files share: a project folder in a temp dir and the real binary run in
//! it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod object_store;

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

    pub fn file(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).expect("write");
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
