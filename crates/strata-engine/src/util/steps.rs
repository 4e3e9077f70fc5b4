//! Timed phase logs: what a piece of work just did, how long it has run, and the memory the
//! process holds.

/// The clock of the timed logs of one piece of work for flow (or ingestion) `flow`, written
/// with [`step!`]: each logs what was just done, prefixed by `scope` (`"fold: "`, or `""`),
/// with the time since the work started and the process's resident memory.
pub(crate) struct Steps<'a> {
    pub(crate) flow: &'a str,
    pub(crate) scope: &'static str,
    start: std::time::Instant,
}

impl<'a> Steps<'a> {
    pub(crate) fn new(flow: &'a str, scope: &'static str) -> Self {
        Steps {
            flow,
            scope,
            start: std::time::Instant::now(),
        }
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// `step!(level, steps, what)`: logs step `what` of [`Steps`] `steps` at `level` (`info`
/// for the phases of a flow run, `debug` for the steps inside them), under the caller's
/// module.
macro_rules! step {
    ($level:ident, $steps:expr, $what:expr) => {
        tracing::$level!(
            flow = %$steps.flow,
            elapsed_ms = $steps.elapsed_ms(),
            rss_mib = $crate::util::steps::rss_mib(),
            "{}{}",
            $steps.scope,
            $what
        )
    };
}

/// The process's resident memory in MiB, for phase logs (`None` where `/proc` is missing).
pub(crate) fn rss_mib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096 / (1 << 20))
}

pub(crate) use step;
