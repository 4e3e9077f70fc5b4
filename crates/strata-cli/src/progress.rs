//! Progress of `strata run` on stderr: on a terminal, a live line for the node running (its
//! elapsed time ticking) replaced by a summary line when it ends; without a terminal, one
//! plain line per node when it ends, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_engine::{Progress, ProgressFn};

/// What the ticker shows: the node running and since when.
type Running = Arc<Mutex<Option<(String, Instant)>>>;

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
    let running: Running = Arc::new(Mutex::new(None));
    let ticker = running.clone();
    std::thread::spawn(move || {
        let mut frame = 0usize;
        loop {
            std::thread::sleep(Duration::from_millis(120));
            let Ok(state) = ticker.lock() else { return };
            if let Some((node, since)) = state.as_ref() {
                frame = (frame + 1) % SPINNER.len();
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K{} {node} … {}",
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
            Progress::Started { node } => *state = Some((node, Instant::now())),
            Progress::Finished {
                node,
                summary,
                elapsed,
            } => {
                *state = None;
                let mark = if summary == "FAILED" { '✗' } else { '✓' };
                eprintln!("\r\x1b[2K{mark} {node}: {summary} ({})", seconds(elapsed));
            }
        }
    }))
}
