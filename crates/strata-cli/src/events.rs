//! `strata events`: the event log, readably. One block per run (newest last), one line per
//! dataset or flow, with its expectations and error under it. The records are read by
//! [`strata_engine::read_events`].

use std::io::Write;
use strata_engine::{LoggedEvent, Warehouse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Prints the records of the last `last` runs (only `flow`'s records, if given).
pub async fn show(wh: &Warehouse, last: usize, flow: Option<&str>) -> Result<(), BoxError> {
    let Some((_, batches)) = strata_engine::read_events(wh, last, flow).await? else {
        println!(
            "no runs recorded yet in {} (the event log is written by `strata run`)",
            wh.root()
        );
        return Ok(());
    };
    let events = strata_engine::logged_events(&batches)?;
    let mut out = std::io::stdout().lock();
    let mut current_run = String::new();
    for (shown, e) in events.iter().enumerate() {
        if e.run_id != current_run {
            writeln!(
                out,
                "{}run {} ({}), started {}",
                if shown > 0 { "\n" } else { "" },
                e.run_id,
                e.pipeline,
                e.started
            )?;
            current_run = e.run_id.clone();
        }
        write_event(&mut out, e)?;
    }
    if events.is_empty() {
        match flow {
            Some(f) => writeln!(out, "no records for flow {f}")?,
            None => writeln!(out, "no runs recorded yet")?,
        }
    }
    Ok(())
}

/// One record's lines.
fn write_event(out: &mut impl Write, e: &LoggedEvent) -> std::io::Result<()> {
    if e.is_run_record() {
        // The run as a whole: its retries and outcome, an undelivered notification.
        let at = if e.flow.is_empty() {
            String::new()
        } else {
            format!(" at {} -> {}", e.flow, e.dataset)
        };
        writeln!(
            out,
            "  {:<9} {}{at}: {}",
            e.status,
            e.kind,
            e.message.as_deref().unwrap_or("NULL")
        )?;
        if let Some(error) = &e.error {
            writeln!(out, "            error: {error}")?;
        }
        return Ok(());
    }
    let mut counts = vec![format!("read {}", e.rows_read)];
    for (v, label) in [
        (e.rows_written, "written"),
        (e.rows_upserted, "upserted"),
        (e.rows_deleted, "deleted"),
        (e.versions_opened, "versions opened"),
        (e.versions_closed, "versions closed"),
        (e.rows_dropped, "dropped"),
    ] {
        if v != 0 {
            counts.push(format!("{label} {v}"));
        }
    }
    writeln!(
        out,
        "  {:<9} {} {} -> {} ({} ms): {}",
        e.status,
        e.kind,
        e.flow,
        e.dataset,
        e.duration_ms,
        counts.join(", ")
    )?;
    if let Some(message) = e.message.as_deref().filter(|m| !m.is_empty()) {
        writeln!(out, "            {message}")?;
    }
    for x in &e.expectations {
        writeln!(
            out,
            "            expectation {} ({}): {} passed, {} failed",
            x.name, x.action, x.passed, x.failed
        )?;
    }
    if let Some(error) = &e.error {
        writeln!(out, "            error: {error}")?;
    }
    Ok(())
}
