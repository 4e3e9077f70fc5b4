//! Work on every core: how many threads a piece of work gets, and running it on them.

use crate::error::{EngineError, Result};
use deltalake::arrow::array::ArrayRef;

/// Below this many rows a write encodes its parquet on one thread, and a fold runs on one
/// thread. `STRATA_PARALLEL_MIN_ROWS` overrides it (the golden scenarios set it to 1 so that
/// the parallel paths run on their small inputs too).
pub(crate) fn parallel_min_rows() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("STRATA_PARALLEL_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500_000)
    })
}

/// Runs CPU-bound `work` (a fold, a comparison, hashing a snapshot) on tokio's blocking
/// pool rather than on the async scheduler, so that datasets the scheduler runs side by side
/// keep going while it runs. `what` names it if the worker dies.
pub(crate) async fn off_scheduler<T, F>(what: &str, work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::internal(format!("{what}: the worker failed: {e}")))?
}

/// Threads for work over `rows` rows: one below [`parallel_min_rows`], else one per core.
pub(crate) fn threads_for(rows: usize) -> usize {
    if rows < parallel_min_rows() {
        1
    } else {
        parallelism()
    }
}

/// How many threads parallel work uses: the cores, at most 8.
pub(crate) fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

/// `work` on every item, one scoped thread per item (on the calling thread when there is
/// only one), results in item order. A thread that panics becomes an internal error naming
/// `what` it did.
pub(crate) fn on_threads<T: Send, R: Send>(
    items: Vec<T>,
    what: &str,
    work: impl Fn(T) -> R + Sync,
) -> Result<Vec<R>> {
    if items.len() <= 1 {
        return Ok(items.into_iter().map(work).collect());
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || work(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| EngineError::internal(format!("a {what} thread panicked")))
            })
            .collect()
    })
}

/// `columns` made into arrays by `make` on `threads` lanes side by side, in their order;
/// each input is let go as soon as its array is made.
pub(crate) fn per_column<T: Send>(
    columns: Vec<T>,
    threads: usize,
    make: impl Fn(T) -> Result<ArrayRef> + Sync,
) -> Result<Vec<ArrayRef>> {
    let width = columns.len();
    let lane_count = threads.clamp(1, width.max(1));
    let mut lanes: Vec<Vec<(usize, T)>> = (0..lane_count).map(|_| Vec::new()).collect();
    for (c, column) in columns.into_iter().enumerate() {
        lanes[c % lane_count].push((c, column));
    }
    let gathered = crate::util::threads::on_threads(lanes, "gather", |lane| {
        lane.into_iter()
            .map(|(c, column)| Ok((c, make(column)?)))
            .collect::<Result<Vec<_>>>()
    })?;
    let mut out: Vec<(usize, ArrayRef)> = Vec::with_capacity(width);
    for lane in gathered {
        out.extend(lane?);
    }
    out.sort_by_key(|(c, _)| *c);
    Ok(out.into_iter().map(|(_, a)| a).collect())
}
