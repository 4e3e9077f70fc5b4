//! Progress of `strata run` on stderr: on a terminal, a live line for the node running (files
//! and rows so far, elapsed time ticking, how many others run beside it) replaced by a
//! summary line when it ends; without a terminal, one plain line per node when it ends, so
//! logs stay readable.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_engine::{Progress, ProgressFn};

/// What the ticker shows: the nodes running, since when, and how far each has got.
type Running = Arc<Mutex<Vec<(String, Instant, String)>>>;

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// The progress callback for this process's stderr.
pub fn reporter() -> ProgressFn {
    if std::io::stderr().is_terminal() {
        live()
    } else {
        ProgressFn(Arc::new(|p| {
            if let Progress::Finished {
                node,
                summary,
                elapsed,
            } = p
            {
                eprintln!(
                    "{} {node}: {summary} ({})",
                    chrono::Local::now().format("%H:%M:%S"),
                    seconds(elapsed)
                );
            }
        }))
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn live() -> ProgressFn {
    let running: Running = Arc::new(Mutex::new(Vec::new()));
    let ticker = running.clone();
    std::thread::spawn(move || {
        let mut frame = 0usize;
        loop {
            std::thread::sleep(Duration::from_millis(120));
            let Ok(state) = ticker.lock() else { return };
            if let Some((node, since, detail)) = state.first() {
                frame = (frame + 1) % SPINNER.len();
                let more = match state.len() {
                    1 => String::new(),
                    n => format!(" (and {} more running)", n - 1),
                };
                let detail = if detail.is_empty() {
                    String::new()
                } else {
                    format!("{detail}, ")
                };
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K{} {node}: {detail}{}{more}",
                    SPINNER[frame],
                    seconds(since.elapsed())
                );
                let _ = err.flush();
            }
        }
    });
    ProgressFn(Arc::new(move |p| {
        let Ok(mut state) = running.lock() else {
            return;
        };
        match p {
            Progress::Started { node } => state.push((node, Instant::now(), String::new())),
            Progress::Update { node, detail } => {
                if let Some(entry) = state.iter_mut().find(|(n, _, _)| *n == node) {
                    entry.2 = detail;
                }
            }
            Progress::Finished {
                node,
                summary,
                elapsed,
            } => {
                state.retain(|(n, _, _)| *n != node);
                let mark = if summary == "FAILED" { '✗' } else { '✓' };
                eprintln!("\r\x1b[2K{mark} {node}: {summary} ({})", seconds(elapsed));
            }
        }
    }))
}
