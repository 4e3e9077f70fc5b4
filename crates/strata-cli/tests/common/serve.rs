//! A running `strata serve` for the serving tests (`serve.rs`, `web.rs`): started in a
//! project, its log collected as it comes, stopped with SIGTERM (killed when dropped).

use super::Project;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    /// The port the server said it listens on.
    pub port: u16,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `strata serve args...` in `p` with `env` (and without the secrets of the
    /// caller's environment), and waits for the line with `marker` followed by the port
    /// listened on.
    pub fn spawn(p: &Project, args: &[&str], marker: &str, env: &[(&str, &str)]) -> Server {
        let mut all = vec!["serve"];
        all.extend_from_slice(args);
        let mut command = p.command(&all);
        command.env_remove("STRATA_SERVE_PASSWORD");
        command.env_remove("STRATA_SERVE_TOKEN");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("strata serve starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let port = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!(
                    "strata serve ended before listening: {}",
                    log.lock().unwrap()
                );
            };
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some((_, rest)) = line.split_once(marker) {
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                break port.parse().expect("port");
            }
        };
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Server { child, port, log }
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log as it fills, still readable once [`Server::stop`] has taken the server (its
    /// last lines may come after the exit).
    pub fn shared_log(&self) -> Arc<Mutex<String>> {
        self.log.clone()
    }

    /// The log once it has a line containing `needle` (the server may write it after its
    /// answer), failing after 10 s without.
    pub fn log_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits (at most 20 s) for the server to exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "strata serve did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
