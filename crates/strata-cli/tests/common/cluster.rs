//! A real cluster for the tests: `scripts/services/cluster.sh` starts a scheduler and two
//! executors of the binary under test as separate processes on loopback ports, with the
//! object-store server's credentials in their environment; dropping the [`Cluster`] stops
//! them.

use super::object_store::Server;
use std::path::PathBuf;
use std::process::Command;

pub struct Cluster {
    dir: tempfile::TempDir,
    /// `df://127.0.0.1:PORT`.
    pub url: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/cluster.sh")
}

impl Cluster {
    /// A scheduler and two executors reaching `server` with its own secret.
    pub fn start(server: &dyn Server) -> Cluster {
        Cluster::start_with_secret(server, server.secret())
    }

    /// A scheduler and two executors reaching `server` with `secret` (a wrong one: executors
    /// that lack the warehouse's credentials).
    pub fn start_with_secret(server: &dyn Server, secret: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = Command::new(script());
        c.args(["start", &dir.path().display().to_string()])
            .env("STRATA_BIN", env!("CARGO_BIN_EXE_strata"))
            .env_remove("RUST_LOG");
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with(server.env_prefix())) {
            c.env_remove(k);
        }
        c.envs(server.env(secret));
        let out = c.output().expect("cluster.sh runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let cluster = Cluster {
            url: text
                .lines()
                .find_map(|l| l.strip_prefix("export STRATA_TEST_CLUSTER_URL="))
                .unwrap_or_default()
                .to_string(),
            dir,
        };
        assert!(
            out.status.success() && cluster.url.starts_with("df://"),
            "the cluster did not start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.logs()
        );
        cluster
    }

    /// The pid of `process` (`scheduler`, `executor-1`, `executor-2`).
    pub fn pid(&self, process: &str) -> u32 {
        let file = self.dir.path().join(format!("cluster/{process}.pid"));
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid in {}", file.display()))
    }

    /// Kills `process` with SIGKILL.
    pub fn kill(&self, process: &str) {
        let pid = self.pid(process);
        let status = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -9 {process} ({pid})");
    }

    /// Every process's log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for name in ["scheduler", "executor-1", "executor-2"] {
            let path = self.dir.path().join(format!("cluster/{name}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            all.push_str(&format!("--- {name} (last lines)\n"));
            for line in tail.into_iter().rev() {
                all.push_str(line);
                all.push('\n');
            }
        }
        all
    }

    /// Waits (at most 120 s) until one of `executors` runs a task of the fold stage (stage 2:
    /// after the stage that reads the files and shuffles the events); whether one did.
    pub fn wait_until_folding(&self, executors: &[&str]) -> bool {
        self.wait_for_fold_tasks(executors, 0)
    }

    /// The fold-stage tasks `executors` have started so far.
    pub fn fold_tasks(&self, executors: &[&str]) -> usize {
        executors
            .iter()
            .map(|process| {
                self.log(process)
                    .lines()
                    .filter(|l| l.contains("Execute task") && l.contains("/2."))
                    .count()
            })
            .sum()
    }

    /// Waits until `executors` have started more than `seen` fold-stage tasks (a later
    /// job's); `false` after two minutes.
    pub fn wait_for_fold_tasks(&self, executors: &[&str], seen: usize) -> bool {
        let started = std::time::Instant::now();
        while self.fold_tasks(executors) <= seen {
            if started.elapsed() > std::time::Duration::from_secs(120) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        true
    }

    /// The log of `process` so far.
    pub fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("cluster/{process}.log")))
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", &self.dir.path().display().to_string()])
            .output();
    }
}
