//! `strata events`: the event log, readably. One block per run (newest last), one line per
//! dataset or flow, with its expectations and error under it.

use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::io::Write;
use strata_engine::Warehouse;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The records of the last `last` runs (only `flow`'s records, if given), oldest run first;
/// `None` when nothing was recorded yet. A run's records come in the order things happened:
/// datasets and flows as they started, the run's own (`update`: a retry, the outcome;
/// `notification`) as they ended.
pub async fn records(
    wh: &Warehouse,
    last: usize,
    flow: Option<&str>,
) -> Result<Option<(deltalake::arrow::datatypes::SchemaRef, Vec<RecordBatch>)>, BoxError> {
    if !wh.root().join("_strata").join("event_log").exists().await? {
        return Ok(None);
    }
    let filter = flow
        .map(|f| format!("WHERE flow = {}", quote(f)))
        .unwrap_or_default();
    let sql = format!(
        "WITH runs AS (SELECT run_id, min(started_at) AS run_start FROM event_log {filter} \
           GROUP BY run_id ORDER BY run_start DESC LIMIT {last}) \
         SELECT e.run_id, e.pipeline, CAST(e.started_at AS VARCHAR) AS started, e.flow, e.kind, \
           e.dataset, e.status, e.duration_ms, e.rows_read, e.rows_written, e.rows_upserted, \
           e.rows_deleted, e.versions_opened, e.versions_closed, e.rows_dropped, \
           e.message, e.error, e.expectations \
         FROM event_log e JOIN runs r ON e.run_id = r.run_id {} \
         ORDER BY r.run_start, \
           CASE WHEN e.kind IN ('update', 'notification') THEN e.ended_at ELSE e.started_at END, \
           e.ended_at",
        flow.map(|f| format!("WHERE e.flow = {}", quote(f)))
            .unwrap_or_default()
    );
    Ok(Some(strata_engine::query(wh, &sql).await?))
}

/// Prints the records of the last `last` runs (only `flow`'s records, if given).
pub async fn show(wh: &Warehouse, last: usize, flow: Option<&str>) -> Result<(), BoxError> {
    let Some((_, batches)) = records(wh, last, flow).await? else {
        println!(
            "no runs recorded yet in {} (the event log is written by `strata run`)",
            wh.root()
        );
        return Ok(());
    };
    let mut out = std::io::stdout().lock();
    let mut current_run = String::new();
    let mut shown = 0usize;
    for b in &batches {
        let cell = Cells::new(b)?;
        for i in 0..b.num_rows() {
            let run = cell.get("run_id", i);
            if run != current_run {
                writeln!(
                    out,
                    "{}run {run} ({}), started {}",
                    if shown > 0 { "\n" } else { "" },
                    cell.get("pipeline", i),
                    cell.get("started", i)
                )?;
                current_run = run;
            }
            shown += 1;
            let kind = cell.get("kind", i);
            if kind == "update" || kind == "notification" {
                // The run as a whole: its retries and outcome, an undelivered notification.
                let flow = cell.get("flow", i);
                let at = if flow.is_empty() {
                    String::new()
                } else {
                    format!(" at {flow} -> {}", cell.get("dataset", i))
                };
                writeln!(
                    out,
                    "  {:<9} {kind}{at}: {}",
                    cell.get("status", i),
                    cell.get("message", i)
                )?;
                let error = cell.get("error", i);
                if error != "NULL" {
                    writeln!(out, "            error: {error}")?;
                }
                continue;
            }
            let mut counts = vec![format!("read {}", cell.get("rows_read", i))];
            for (col, label) in [
                ("rows_written", "written"),
                ("rows_upserted", "upserted"),
                ("rows_deleted", "deleted"),
                ("versions_opened", "versions opened"),
                ("versions_closed", "versions closed"),
                ("rows_dropped", "dropped"),
            ] {
                let v = cell.get(col, i);
                if v != "0" {
                    counts.push(format!("{label} {v}"));
                }
            }
            writeln!(
                out,
                "  {:<9} {} {} -> {} ({} ms): {}",
                cell.get("status", i),
                cell.get("kind", i),
                cell.get("flow", i),
                cell.get("dataset", i),
                cell.get("duration_ms", i),
                counts.join(", ")
            )?;
            let message = cell.get("message", i);
            if message != "NULL" && !message.is_empty() {
                writeln!(out, "            {message}")?;
            }
            for e in expectations(b, i) {
                writeln!(out, "            expectation {e}")?;
            }
            let error = cell.get("error", i);
            if error != "NULL" {
                writeln!(out, "            error: {error}")?;
            }
        }
    }
    if shown == 0 {
        match flow {
            Some(f) => writeln!(out, "no records for flow {f}")?,
            None => writeln!(out, "no runs recorded yet")?,
        }
    }
    Ok(())
}

/// Text of the cells of one batch, by column name.
struct Cells<'a> {
    batch: &'a RecordBatch,
    formatters: Vec<ArrayFormatter<'a>>,
}

impl<'a> Cells<'a> {
    fn new(batch: &'a RecordBatch) -> Result<Self, BoxError> {
        let options = FormatOptions::default().with_null("NULL");
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Cells { batch, formatters })
    }

    fn get(&self, column: &str, row: usize) -> String {
        match self.batch.schema().index_of(column) {
            Ok(i) => self.formatters[i].value(row).to_string(),
            Err(_) => String::new(),
        }
    }
}

/// `name (action): P passed, F failed` for each expectation of row `i`.
fn expectations(batch: &RecordBatch, i: usize) -> Vec<String> {
    use deltalake::arrow::array::{Int64Array, ListArray, StringArray, StructArray};
    use deltalake::arrow::datatypes::DataType;
    let Some(list) = batch
        .column_by_name("expectations")
        .and_then(|c| c.as_any().downcast_ref::<ListArray>())
    else {
        return Vec::new();
    };
    if list.is_null(i) {
        return Vec::new();
    }
    let values = list.value(i);
    let Some(s) = values.as_any().downcast_ref::<StructArray>() else {
        return Vec::new();
    };
    // Strings may come back as Utf8View from Parquet; read them as plain strings.
    let text = |name: &str| {
        s.column_by_name(name)
            .and_then(|c| deltalake::arrow::compute::cast(c, &DataType::Utf8).ok())
            .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
    };
    let int = |name: &str| {
        s.column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>().cloned())
    };
    let (Some(names), Some(actions), Some(passed), Some(failed)) =
        (text("name"), text("action"), int("passed"), int("failed"))
    else {
        return Vec::new();
    };
    (0..s.len())
        .map(|j| {
            format!(
                "{} ({}): {} passed, {} failed",
                names.value(j),
                actions.value(j),
                passed.value(j),
                failed.value(j)
            )
        })
        .collect()
}
