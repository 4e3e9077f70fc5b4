//! `strata optimize` and `strata vacuum`: their arguments and what they print.

use crate::{parse_conf, BoxError, WarehouseArg};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Compact small files (bin-packing, or Z-order), one commit per table; rows unchanged.
/// AUTO CDC targets' event stores are rewritten in key order, without the expired
/// tombstones of SCD type 1 targets.
#[derive(clap::Args, Debug)]
pub struct OptimizeArgs {
    /// Tables to optimize (`name`, `schema.name`, `event_log`), each with its event store
    /// [default: every table of the warehouse, its event store and the event log].
    tables: Vec<String>,
    #[command(flatten)]
    warehouse: WarehouseArg,
    /// Z-order by these columns (comma-separated) instead of bin-packing [default: the
    /// table's `pipelines.autoOptimize.zOrderCols`, if set].
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    zorder_by: Vec<String>,
    /// The file size to bin-pack to, in MiB [default: the table's `delta.targetFileSize`,
    /// else 100 MiB].
    #[arg(long, value_name = "MIB")]
    target_size_mib: Option<u64>,
    /// The memory an event store's sort may hold before it spills to disk, in MiB
    /// [default: 512].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(8..))]
    sort_memory_mib: Option<u64>,
    /// A pipeline whose flows say what event stores may forget (repeatable) [default: the
    /// pipelines the event log records].
    #[arg(long = "pipeline", value_name = "FILE")]
    pipelines: Vec<PathBuf>,
    /// A configuration value for planning those pipelines, as for `run` (repeatable).
    #[arg(long = "conf", value_name = "NAME=VALUE", value_parser = parse_conf)]
    conf: Vec<(String, String)>,
}

/// Remove files no version inside the retention window references.
#[derive(clap::Args, Debug)]
pub struct VacuumArgs {
    /// Tables to vacuum (`name`, `schema.name`, `event_log`) [default: every table, the
    /// event log and every event store].
    tables: Vec<String>,
    #[command(flatten)]
    warehouse: WarehouseArg,
    /// Keep the files of the versions of the last HOURS hours.
    #[arg(long, value_name = "HOURS", default_value_t = strata_engine::DEFAULT_RETAIN_HOURS)]
    retain: f64,
    /// Allow a `--retain` shorter than 168 hours (7 days).
    #[arg(long)]
    allow_short_retention: bool,
    /// List what would be removed; remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// A pipeline whose readers' unread files to keep (repeatable) [default: the pipelines
    /// the event log records].
    #[arg(long = "pipeline", value_name = "FILE")]
    pipelines: Vec<PathBuf>,
    /// A configuration value for planning those pipelines, as for `run` (repeatable).
    #[arg(long = "conf", value_name = "NAME=VALUE", value_parser = parse_conf)]
    conf: Vec<(String, String)>,
    /// Also delete the event-log records of runs that started more than N days ago.
    #[arg(long, value_name = "N")]
    event_log_days: Option<u32>,
    /// Also delete the tables `run --full-refresh` set aside before the retention window.
    #[arg(long)]
    set_aside: bool,
}

pub async fn optimize(args: OptimizeArgs) -> Result<ExitCode, BoxError> {
    let wh = args.warehouse.open()?;
    let options = strata_engine::OptimizeOptions {
        tables: args.tables,
        zorder_by: args.zorder_by,
        target_size: args.target_size_mib.map(|m| m.saturating_mul(1 << 20)),
        pipelines: args.pipelines,
        configuration: args.conf.into_iter().collect(),
        sort_memory: args.sort_memory_mib.map(|m| m.saturating_mul(1 << 20)),
    };
    let report = strata_engine::optimize(&wh, &options).await?;
    let mut out = std::io::stdout().lock();
    for t in &report {
        if let Some(why) = &t.skipped {
            writeln!(out, "{}: skipped ({why})", t.table)?;
            continue;
        }
        let how = match t.zorder_by.is_empty() {
            true => String::new(),
            false => format!(", Z-ordered by {}", t.zorder_by.join(", ")),
        };
        if t.files_removed == 0 && t.skipped.is_none() && t.events.is_none() {
            writeln!(
                out,
                "{}: {} file(s), nothing to compact{how}",
                t.table, t.files_before
            )?;
            continue;
        }
        let events = match t.events {
            Some((before, after)) => format!(
                ", {before} -> {after} event(s), {} expired tombstone(s) forgotten",
                t.tombstones_forgotten
            ),
            None => String::new(),
        };
        writeln!(
            out,
            "{}: {} file(s) ({}) -> {} file(s) ({}){how}{events}, version {}, {:.2} s",
            t.table,
            t.files_before,
            mib(t.bytes_before),
            t.files_after,
            mib(t.bytes_after),
            t.version,
            t.millis as f64 / 1000.0
        )?;
        if let Some(note) = &t.note {
            writeln!(out, "  {note}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn vacuum(args: VacuumArgs) -> Result<ExitCode, BoxError> {
    let wh = args.warehouse.open()?;
    let options = strata_engine::VacuumOptions {
        tables: args.tables,
        retain_hours: args.retain,
        allow_short_retention: args.allow_short_retention,
        dry_run: args.dry_run,
        pipelines: args.pipelines,
        configuration: args.conf.into_iter().collect(),
        event_log_days: args.event_log_days,
        set_aside: args.set_aside,
    };
    let report = strata_engine::vacuum(&wh, &options).await?;
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut out = std::io::stdout().lock();
    if !report.pipelines.is_empty() {
        writeln!(
            out,
            "readers protected: those of {}",
            report.pipelines.join(", ")
        )?;
    }
    for t in &report.tables {
        writeln!(out, "{}: {verb} {} file(s)", t.table, t.files.len())?;
        if report.dry_run {
            for f in &t.files {
                writeln!(out, "  {f}")?;
            }
        }
        for k in &t.kept_for {
            writeln!(out, "  {k}")?;
        }
    }
    if let Some(n) = report.event_log_records {
        writeln!(out, "event_log: {verb} {n} record(s)")?;
    }
    for d in &report.set_aside {
        writeln!(out, "set aside: {verb} {d}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The tables a run optimized after it, by their `pipelines.autoOptimize.minFiles`, and
/// the event stores whose small files it compacted.
pub fn print_auto_optimized(optimized: &[strata_engine::Optimized]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for t in optimized {
        writeln!(
            out,
            "optimized {}: {} file(s) -> {} file(s) ({})",
            t.table,
            t.files_before,
            t.files_after,
            t.note
                .as_deref()
                .unwrap_or("pipelines.autoOptimize.minFiles")
        )?;
    }
    Ok(())
}
