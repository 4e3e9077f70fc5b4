//! The `strata` command: run pipelines, query and validate warehouses, and keep their
//! tables in shape (`optimize`, `vacuum`).
//!
//! Exit codes: 0 success; 1 `validate` found violations; 2 the pipeline, the input or the
//! request is wrong (a bad pipeline, a rejected batch, an unknown table); 3 another writer
//! kept committing to a table first (the run retried and gave up; nothing of that dataset
//! was written); 4 storage or a query's execution failed (the environment: a full disk, a
//! read-only warehouse, a lost connection); 5 an internal error (a bug in strata). Errors
//! print their whole chain on one line.

mod cluster;
mod events;
mod graph;
mod progress;
mod python;
mod upkeep;

use clap::{Parser, Subcommand, ValueEnum};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_engine::{PlanStep, RunOptions, RunReport, Selection, Warehouse};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "strata",
    version,
    about = "Declarative CDC pipelines (AUTO CDC, SCD type 1 and 2) on Delta Lake"
)]
struct Cli {
    /// Log progress (info level); RUST_LOG overrides.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every flow of a pipeline once over all input not yet processed.
    Run {
        /// The pipeline: a SQL file, or a YAML spec (.yaml/.yml).
        pipeline: PathBuf,
        #[command(flatten)]
        warehouse: WarehouseArg,
        /// A configuration value, substituted for `${NAME}` in the pipeline text
        /// (repeatable), e.g. `--conf customers_mode='SCD TYPE 2'`.
        #[arg(long = "conf", value_name = "NAME=VALUE", value_parser = parse_conf)]
        conf: Vec<(String, String)>,
        /// Refresh only this dataset (or flow); with a trailing `+`, also everything
        /// downstream of it.
        #[arg(long, value_name = "NAME[+]")]
        select: Option<Selection>,
        /// Rebuild tables from their sources: all of them, or the ones named (comma-separated
        /// or repeated) and everything that reads them. Tables with
        /// `pipelines.reset.allowed = false` are refused. Old content is kept under
        /// `<warehouse>/_strata/full_refresh/`.
        #[arg(long, value_name = "TABLE", num_args = 0.., value_delimiter = ',')]
        full_refresh: Option<Vec<String>>,
        /// Keep running: pick up new input every `--interval` until SIGINT or SIGTERM, which
        /// let the commit in flight finish and then stop.
        #[arg(long)]
        continuous: bool,
        /// The pause between runs in continuous mode, e.g. `500ms`, `5s`, `1m`.
        #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_interval)]
        interval: Duration,
        /// Try a run that failed transiently (a lost connection, a storage error) up to N
        /// more times, never one that failed on its data or pipeline; the same as `--conf
        /// pipelines.numUpdateRetryAttempts=N` [default: the pipeline's, else 0].
        #[arg(long, value_name = "N")]
        retries: Option<u32>,
        /// One run of this pipeline at a time on the warehouse: `fail` stops at once (exit 3)
        /// when another run holds it, `wait` waits for that run to end (at most
        /// --lock-timeout). Without it runs may overlap, safely.
        #[arg(long, value_enum, value_name = "fail|wait")]
        lock: Option<LockArg>,
        /// How long `--lock wait` waits, e.g. `30m`.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_interval)]
        lock_timeout: Duration,
        /// The memory a run's large work may take, e.g. `4GiB`: a first load of more events
        /// than fit sorts on local disk (the temp dir) past it; the same as `--conf
        /// strata.memoryLimit=SIZE` or STRATA_MEMORY_LIMIT [default: an eighth of the
        /// machine's memory, at least 1 GiB].
        #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
        memory_limit: Option<u64>,
        /// Run first loads of AUTO CDC flows on the Apache DataFusion Ballista cluster whose
        /// scheduler is at URL (`df://HOST:PORT`, see `strata cluster`); this process plans
        /// and commits. The warehouse must be where the executors reach it (object storage).
        #[arg(long, value_name = "URL")]
        cluster: Option<String>,
        /// A first load of fewer events stays on this machine [default: 1000000]. Both may
        /// also be set as `--conf strata.cluster=URL` and `strata.cluster.minEvents=N` (or in
        /// a YAML spec's configuration).
        #[arg(long, value_name = "N")]
        cluster_min_events: Option<u64>,
    },
    /// Run the processes of a cluster for `strata run --cluster`: one scheduler, and
    /// executors that join it (Apache DataFusion Ballista with strata's plans). Each reads
    /// the warehouse with the object-store credentials of its own environment.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Show the event log: what each run did, dataset by dataset.
    Events {
        #[command(flatten)]
        warehouse: WarehouseArg,
        /// How many of the latest runs to show [default: 1, or 10 with --flow].
        #[arg(long, value_name = "N")]
        last: Option<usize>,
        /// Only this flow's (or dataset's own query's) records.
        #[arg(long, value_name = "NAME")]
        flow: Option<String>,
        /// `text`: one block per run; `json`: JSON Lines, one record per line.
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
    /// Print a pipeline's dataset graph in execution order; runs nothing.
    Plan {
        /// The pipeline: a SQL file, or a YAML spec (.yaml/.yml).
        pipeline: PathBuf,
        /// A configuration value, as for `run` (repeatable).
        #[arg(long = "conf", value_name = "NAME=VALUE", value_parser = parse_conf)]
        conf: Vec<(String, String)>,
        /// Output format: plain text, or JSON (one object per step, one per line).
        #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
        format: PlanFormat,
    },
    /// Run SQL over every table of the warehouse (`name` or `schema.name`).
    Query {
        /// The SQL to run.
        sql: String,
        #[command(flatten)]
        warehouse: WarehouseArg,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Serve the warehouse, read-only: `--pg` speaks the PostgreSQL wire protocol (psql,
    /// psycopg, JDBC and BI tools), `--flight` Arrow Flight SQL (ADBC, the JDBC Flight SQL
    /// driver), both with the SQL `strata query` accepts; `--http` serves a web page of the
    /// pipelines' graphs, their last runs and the tables. Any of them, in one process; each
    /// query reads the latest committed version of every table.
    #[command(after_help = SERVE_EXAMPLE)]
    Serve {
        #[command(flatten)]
        warehouse: WarehouseArg,
        /// Listen for PostgreSQL clients at ADDR (IP:PORT or HOST:PORT) [without a value:
        /// 127.0.0.1:5433]
        #[arg(long, value_name = "ADDR", num_args = 0..=1,
              default_missing_value = strata_serve::DEFAULT_PG_ADDR, value_parser = parse_listen_addr)]
        pg: Option<std::net::SocketAddr>,
        /// Listen for Arrow Flight SQL clients at ADDR (IP:PORT or HOST:PORT) [without a
        /// value: 127.0.0.1:32010]
        #[arg(long, value_name = "ADDR", num_args = 0..=1,
              default_missing_value = strata_serve::DEFAULT_FLIGHT_ADDR, value_parser = parse_listen_addr)]
        flight: Option<std::net::SocketAddr>,
        /// Serve the web page at ADDR (IP:PORT or HOST:PORT) [without a value:
        /// 127.0.0.1:8765]
        #[arg(long, value_name = "ADDR", num_args = 0..=1,
              default_missing_value = strata_serve::DEFAULT_HTTP_ADDR, value_parser = parse_listen_addr)]
        http: Option<std::net::SocketAddr>,
        /// The user name clients log in as.
        #[arg(long, default_value = strata_serve::DEFAULT_USER)]
        user: String,
        /// A file whose first line is the password clients must give [default:
        /// $STRATA_SERVE_PASSWORD]
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// A file whose first line is a bearer token Flight SQL and web clients may send
        /// instead of the user and password [default: $STRATA_SERVE_TOKEN]
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Let clients connect without a password (only on a loopback address).
        #[arg(long)]
        no_auth: bool,
        /// The certificate chain (PEM) every listener presents; with it, every client must
        /// connect over TLS (https:// for the web page). Needs --tls-key.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key (PEM) of --tls-cert's certificate.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// At most N queries plan and compute at once; the others wait their turn.
        #[arg(long, value_name = "N", default_value_t = strata_serve::DEFAULT_MAX_QUERIES as u32,
              value_parser = clap::value_parser!(u32).range(1..))]
        max_queries: u32,
        /// The memory one query may hold, e.g. `2GiB`: sorts and aggregates spill to the
        /// temp dir past it where they can, else the query fails (SQLSTATE 53200) [default:
        /// an eighth of the machine's memory, at least 1 GiB].
        #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
        query_memory: Option<u64>,
    },
    /// Compact small files (bin-packing, or Z-order), one commit per table; rows unchanged.
    Optimize(upkeep::OptimizeArgs),
    /// Remove files no version inside the retention window references (default 7 days),
    /// keeping what the pipelines' readers have not read yet.
    Vacuum(upkeep::VacuumArgs),
    /// Check an SCD type 2 table's timeline; exit 1 if it is broken.
    Validate {
        /// The table: `name`, `schema.name` or `catalog.schema.name` in the warehouse, or
        /// the path of any Delta table (a dbt snapshot, a hand-made SCD2 table).
        table: String,
        #[command(flatten)]
        warehouse: WarehouseArg,
        /// Key columns of a table strata did not write (comma-separated).
        #[arg(long, value_delimiter = ',')]
        keys: Option<Vec<String>>,
        /// The column where a version starts [default: dbt_valid_from, else __START_AT].
        #[arg(long)]
        valid_from: Option<String>,
        /// The column where a version ends [default: dbt_valid_to, else __END_AT].
        #[arg(long)]
        valid_to: Option<String>,
        /// The value that marks an open end when it is not NULL (e.g. 9999-12-31).
        #[arg(long)]
        open_end: Option<String>,
        /// Output format: plain text, or one JSON object (table, ok, violations, deleted).
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
}

#[derive(clap::Args, Debug)]
struct WarehouseArg {
    /// Warehouse folder or object store URL (s3://, gs://, abfss://; settings from AWS_*,
    /// GOOGLE_*, AZURE_*) [default: $STRATA_WAREHOUSE, else ./warehouse]
    #[arg(long, value_name = "DIR")]
    warehouse: Option<PathBuf>,
    /// The warehouse's catalog name in three-part names (`prod.gold.orders`) [default: a
    /// pipeline spec's `catalog`, else main; `main` and `strata` are always accepted]
    #[arg(long, value_name = "NAME")]
    catalog: Option<String>,
}

impl WarehouseArg {
    fn open(&self) -> strata_engine::Result<Warehouse> {
        self.open_or(None, None)
    }

    /// `--warehouse`, else a pipeline spec's `warehouse`, else the environment's; named
    /// `--catalog`, else as the spec says.
    fn open_or(
        &self,
        spec: Option<PathBuf>,
        spec_catalog: Option<String>,
    ) -> strata_engine::Result<Warehouse> {
        let dir = self
            .warehouse
            .clone()
            .or(spec)
            .or_else(|| std::env::var_os("STRATA_WAREHOUSE").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("warehouse"));
        let wh = Warehouse::open(dir)?;
        Ok(match self.catalog.clone().or(spec_catalog) {
            Some(c) => wh.with_catalog(&c),
            None => wh,
        })
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PlanFormat {
    /// One numbered line per step.
    Text,
    /// JSON Lines: one object per step.
    Json,
    /// Graphviz: `strata plan p.sql --format dot | dot -Tsvg > plan.svg`.
    Dot,
    /// A Mermaid flowchart (renders in GitHub and GitLab markdown).
    Mermaid,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LockArg {
    /// Stop at once when another run of the pipeline holds the lock.
    Fail,
    /// Wait for it to end.
    Wait,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum TextOrJson {
    /// For people (events: one block per run, one line per dataset or flow).
    Text,
    /// For machines (events: JSON Lines, one event-log record per line; validate: one
    /// object).
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// An aligned grid.
    Table,
    /// CSV with a header row.
    Csv,
    /// JSON Lines: one object per row.
    Json,
}

/// Turns transparent huge pages off for this process. mimalloc asks for them on its large
/// regions, and a run allocates and frees hundreds of MiB of Arrow buffers in bursts: each
/// fault of a region it gave back then zeroes a whole 2 MiB page. On a 10M-event bulk run
/// that was a third of the CPU time (kernel `clear_page_erms`); without huge pages the run
/// took 10.6-10.9 s instead of 13.5-14.4 s, at the same peak memory.
#[cfg(target_os = "linux")]
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and only sets a flag of
    // this process; it touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn no_transparent_huge_pages() {}

/// Keeps quiet about the one panic a dependency raises and catches on purpose: when a
/// Parquet file's upload fails while completing (a full disk, a read-only warehouse),
/// deltalake aborts it with object_store's `BufWriter::abort`, which panics ("Already shut
/// down") once shutdown has begun; deltalake catches that panic, warns, and returns the
/// write's own error, which strata reports. The default hook would still print the panic
/// as if strata had crashed. Every other panic is printed as before.
fn quiet_caught_dependency_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let caught_by_deltalake = info.location().is_some_and(|l| {
            let file = l.file().replace('\\', "/");
            file.contains("/object_store-") && file.ends_with("/src/buffered.rs")
        }) && info.payload().downcast_ref::<&str>()
            == Some(&"Already shut down");
        if !caught_by_deltalake {
            default(info);
        }
    }));
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    quiet_caught_dependency_panics();
    let cli = Cli::parse();
    if let Command::Run {
        pipeline,
        warehouse,
        conf,
        select,
        full_refresh,
        continuous,
        memory_limit,
        ..
    } = &cli.command
    {
        if python::is_python(pipeline) {
            if *continuous {
                eprintln!("error: --continuous is not available for Python pipelines yet");
                return ExitCode::from(2);
            }
            let mut args: Vec<std::ffi::OsString> = vec![pipeline.into()];
            if let Some(w) = &warehouse.warehouse {
                args.extend(["--warehouse".into(), w.into()]);
            }
            for (k, v) in conf {
                args.extend(["--conf".into(), format!("{k}={v}").into()]);
            }
            if let Some(bytes) = memory_limit {
                let key = strata_engine::memory::CONFIG_KEY;
                args.extend(["--conf".into(), format!("{key}={bytes}").into()]);
            }
            if let Some(s) = select {
                let s = format!("{}{}", s.name, if s.downstream { "+" } else { "" });
                args.extend(["--select".into(), s.into()]);
            }
            if let Some(tables) = full_refresh {
                args.push("--full-refresh".into());
                args.extend(tables.iter().map(Into::into));
            }
            return python::delegate(args);
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_filter(cli.verbose)));
    // Colour only on a terminal, and never with NO_COLOR set (no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
    // Query planning recurses over expression trees (a batch's key predicate can be
    // thousands of terms deep), so the work runs on runtime threads with roomy stacks
    // (reserved address space; memory is only used as deep as the recursion goes).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(64 << 20)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match tokio::spawn(execute(cli.command)).await {
            Ok(result) => result,
            Err(e) => Err(BoxError::from(format!(
                "internal error, this is a bug in strata: {e}"
            ))),
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", chain(e.as_ref()));
            ExitCode::from(exit_code(e.as_ref()))
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The exit code of a failed command, by what went wrong (documented at the top of this
/// file and in the README).
fn exit_code(e: &(dyn std::error::Error + Send + Sync + 'static)) -> u8 {
    use strata_engine::EngineError as E;
    match e.downcast_ref::<E>() {
        // Another writer kept committing first: nothing of that dataset was written, and
        // running again later is the way out.
        Some(E::Conflict { .. } | E::Locked(_)) => 3,
        // Storage, or a query's execution, failed (a full disk, a lost connection):
        // retrying may help; the pipeline is not at fault.
        Some(E::Delta { .. } | E::DataFusion { .. } | E::Io { .. }) => 4,
        // A database that refused or dropped the connection, or did not answer: the
        // environment, as for storage; a source error about the data or the pipeline (a
        // missing table, a type strata cannot read, a refused password) is bad input.
        Some(e @ E::Source { .. }) if e.is_transient() => 4,
        Some(E::Internal(_)) => 5,
        // The pipeline, the input or the request is wrong.
        _ => 2,
    }
}

async fn execute(command: Command) -> Result<ExitCode, BoxError> {
    match command {
        Command::Run {
            pipeline,
            warehouse,
            conf,
            select,
            full_refresh,
            continuous,
            interval,
            retries,
            lock,
            lock_timeout,
            memory_limit,
            cluster,
            cluster_min_events,
        } => {
            let mut configuration: std::collections::BTreeMap<String, String> =
                conf.into_iter().collect();
            if let Some(n) = retries {
                configuration.insert("pipelines.numUpdateRetryAttempts".into(), n.to_string());
            }
            if let Some(bytes) = memory_limit {
                configuration.insert(strata_engine::memory::CONFIG_KEY.into(), bytes.to_string());
            }
            // A spec may name its warehouse; --warehouse wins.
            // The cluster: --cluster, else the configuration's (--conf or the spec's).
            let mut settings = configuration.clone();
            let wh = if strata_engine::is_spec(&pipeline) {
                let loaded = strata_engine::load_pipeline(&pipeline, &configuration)?;
                settings = loaded.configuration.clone();
                warehouse.open_or(loaded.warehouse, loaded.catalog)?
            } else {
                warehouse.open()?
            };
            let cluster = cluster::from_settings(cluster, cluster_min_events, &settings)?;
            let stop = Arc::new(AtomicBool::new(false));
            let options = RunOptions {
                configuration,
                select,
                full_refresh,
                progress: Some(progress::reporter()),
                stop: Some(stop.clone()),
                cluster,
                lock: lock.map(|l| match l {
                    LockArg::Fail => strata_engine::LockMode::Fail,
                    LockArg::Wait => strata_engine::LockMode::Wait(lock_timeout),
                }),
            };
            if continuous {
                return run_continuous(&pipeline, &wh, options, interval, stop).await;
            }
            let report = strata_engine::run_pipeline(&pipeline, &wh, &options).await?;
            print_report(&report, false)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Events {
            warehouse,
            last,
            flow,
            format,
        } => {
            let wh = warehouse.open()?;
            let last = last.unwrap_or(if flow.is_some() { 10 } else { 1 });
            match format {
                TextOrJson::Text => events::show(&wh, last, flow.as_deref()).await?,
                TextOrJson::Json => {
                    if let Some((schema, batches)) =
                        strata_engine::read_events(&wh, last, flow.as_deref()).await?
                    {
                        write_batches(&schema, &batches, Format::Json)?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan {
            pipeline,
            conf,
            format,
        } => {
            let conf: std::collections::BTreeMap<String, String> = conf.into_iter().collect();
            let loaded = strata_engine::load_pipeline(&pipeline, &conf)?;
            let planned = strata_engine::plan_sources(
                &loaded.sources,
                &loaded.configuration,
                &loaded.schema,
                loaded.catalog.as_deref().unwrap_or("main"),
            )?;
            print_plan(&pipeline, &loaded, &planned.steps(), format)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Query {
            sql,
            warehouse,
            format,
        } => {
            let wh = warehouse.open()?;
            let (schema, batches) = strata_engine::query(&wh, &sql).await?;
            write_batches(&schema, &batches, format)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            warehouse,
            pg,
            flight,
            http,
            user,
            password_file,
            token_file,
            no_auth,
            tls_cert,
            tls_key,
            max_queries,
            query_memory,
        } => {
            let listeners = Listeners {
                pg,
                flight,
                http,
                user,
                password_file,
                token_file,
                no_auth,
                tls: tls_cert.zip(tls_key),
            };
            let limits = ServeLimits {
                max_queries: max_queries as usize,
                query_memory: query_memory.unwrap_or_else(strata_engine::memory::default_limit),
            };
            serve(warehouse, listeners, limits).await
        }
        Command::Optimize(args) => upkeep::optimize(args).await,
        Command::Cluster(command) => cluster::run(command).await,
        Command::Vacuum(args) => upkeep::vacuum(args).await,
        Command::Validate {
            table,
            warehouse,
            keys,
            valid_from,
            valid_to,
            open_end,
            format,
        } => {
            let wh = warehouse.open()?;
            let options = strata_engine::ValidateOptions {
                keys,
                valid_from,
                valid_to,
                open_end,
            };
            let report = strata_engine::validate_report(&wh, &table, &options).await?;
            print_validation(&table, &report, format)?;
            Ok(match report.violations.is_empty() {
                true => ExitCode::SUCCESS,
                false => ExitCode::from(1),
            })
        }
    }
}

/// What `strata validate` found, as text (one line per violation, then the keys deletes
/// explain, then a summary) or as one JSON object.
fn print_validation(
    table: &str,
    report: &strata_engine::ValidationReport,
    format: TextOrJson,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if format == TextOrJson::Json {
        let item = |v: &strata_engine::Violation| serde_json::json!({"key": v.key, "problem": v.problem, "ends_at": v.ends_at});
        let json = serde_json::json!({
            "table": table,
            "ok": report.violations.is_empty(),
            "violations": report.violations.iter().map(item).collect::<Vec<_>>(),
            "deleted": report.deleted.iter().map(item).collect::<Vec<_>>(),
        });
        return writeln!(out, "{json}");
    }
    for v in &report.violations {
        writeln!(out, "{table}: key ({}): {}", v.key, v.problem)?;
    }
    for v in &report.deleted {
        let at = v.ends_at.as_deref().unwrap_or("?");
        writeln!(
            out,
            "{table}: key ({}): deleted at {at} (not a violation)",
            v.key
        )?;
    }
    let deleted = match report.deleted.len() {
        0 => String::new(),
        n => format!("; {n} gap(s) or closed key(s) explained by deletes"),
    };
    match report.violations.len() {
        0 => writeln!(out, "{table}: ok{deleted}"),
        n => writeln!(out, "{table}: {n} violation(s){deleted}"),
    }
}

/// Runs the pipeline again and again, `interval` apart, until SIGINT or SIGTERM. A signal
/// during a run lets the node in flight finish its commit; nothing after it starts.
async fn run_continuous(
    pipeline: &std::path::Path,
    wh: &Warehouse,
    mut options: RunOptions,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> Result<ExitCode, BoxError> {
    let wake = Arc::new(tokio::sync::Notify::new());
    {
        let (stop, wake) = (stop.clone(), wake.clone());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("stopping: finishing the commit in flight");
            stop.store(true, Ordering::SeqCst);
            wake.notify_one();
        });
    }
    eprintln!(
        "running continuously every {}; stop with Ctrl-C or SIGTERM",
        humanize(interval)
    );
    let mut runs = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let report = strata_engine::run_pipeline(pipeline, wh, &options).await?;
        print_report(&report, true)?;
        runs += 1;
        // A full refresh happens once; later runs pick up new input.
        options.full_refresh = None;
        if report.stopped {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = wake.notified() => {}
        }
    }
    eprintln!("stopped after {runs} run(s)");
    Ok(ExitCode::SUCCESS)
}

fn humanize(d: Duration) -> String {
    if !d.as_millis().is_multiple_of(1000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} s", d.as_secs())
    }
}

/// `--interval`: a duration ([`strata_engine::parse_duration`]) above zero.
fn parse_interval(s: &str) -> Result<Duration, String> {
    match strata_engine::parse_duration(s)? {
        d if d.is_zero() => Err(format!("the interval must be positive, got '{}'", s.trim())),
        d => Ok(d),
    }
}

/// `strata serve --help`'s example.
const SERVE_EXAMPLE: &str = "Example:
  STRATA_SERVE_PASSWORD=s3cret strata serve --warehouse ./warehouse --pg 127.0.0.1:5433
  PGPASSWORD=s3cret psql -h 127.0.0.1 -p 5433 -U strata -d main -c 'SELECT * FROM users'

Arrow Flight SQL (ADBC: grpc://127.0.0.1:32010 with user strata and the password, or
a bearer token from STRATA_SERVE_TOKEN or --token-file), next to PostgreSQL or alone:
  STRATA_SERVE_PASSWORD=s3cret strata serve --warehouse ./warehouse --pg --flight

The web page (http://127.0.0.1:8765/: the pipelines' graphs, their last runs, the
tables; HTTP basic auth with user strata and the password, or the bearer token):
  STRATA_SERVE_PASSWORD=s3cret strata serve --warehouse ./warehouse --pg --http

TLS on every listener (every client must then use it; https:// for the web page):
  strata serve --pg 0.0.0.0:5433 --tls-cert server.pem --tls-key server.key
  psql 'host=db.example.com port=5433 user=strata dbname=main sslmode=verify-full sslrootcert=ca.pem'

Without a password (loopback only): strata serve --pg --http --no-auth.
Stop with Ctrl-C or SIGTERM.";

/// What one `strata serve` lets its queries take.
struct ServeLimits {
    max_queries: usize,
    query_memory: u64,
}

/// Where one `strata serve` listens and who may connect.
struct Listeners {
    pg: Option<std::net::SocketAddr>,
    flight: Option<std::net::SocketAddr>,
    http: Option<std::net::SocketAddr>,
    user: String,
    password_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
    no_auth: bool,
    /// The certificate and key files (`--tls-cert`, `--tls-key`).
    tls: Option<(PathBuf, PathBuf)>,
}

/// `strata serve`: listens until SIGINT or SIGTERM, then closes its connections and exits 0.
async fn serve(
    warehouse: WarehouseArg,
    listeners: Listeners,
    limits: ServeLimits,
) -> Result<ExitCode, BoxError> {
    let Listeners {
        pg,
        flight,
        http,
        user,
        password_file,
        token_file,
        no_auth,
        tls,
    } = listeners;
    if pg.is_none() && flight.is_none() && http.is_none() {
        return Err(
            "strata serve: nothing to serve; give --pg [ADDR] to listen for \
                    PostgreSQL clients, --flight [ADDR] for Arrow Flight SQL clients or \
                    --http [ADDR] for the web page (see strata serve --help)"
                .into(),
        );
    }
    let password = strata_serve::read_password(
        std::env::var(strata_serve::PASSWORD_ENV).ok(),
        password_file.as_deref(),
    )?;
    let token = match flight.or(http) {
        Some(_) => strata_serve::read_token(
            std::env::var(strata_serve::TOKEN_ENV).ok(),
            token_file.as_deref(),
        )?,
        None => None,
    };
    if let Some(addr) = pg {
        strata_serve::check_exposure(&addr, password.as_deref(), no_auth)?;
    }
    if let Some(addr) = flight {
        let secret = password.is_some() || token.is_some();
        strata_serve::check_flight_exposure(&addr, secret, no_auth)?;
    }
    if let Some(addr) = http {
        let secret = password.is_some() || token.is_some();
        strata_serve::check_http_exposure(&addr, secret, no_auth)?;
    }
    let tls = match tls {
        Some((cert, key)) => Some(strata_serve::Tls::load(&cert, &key)?),
        None => None,
    };
    for addr in pg.iter().chain(flight.iter()).chain(http.iter()) {
        if tls.is_none() && !addr.ip().is_loopback() {
            eprintln!(
                "note: {addr} is reachable from other machines and TLS is off: rows (and a \
                 Flight bearer token) cross the network in the clear; give --tls-cert and \
                 --tls-key to encrypt"
            );
        }
    }
    let wh = warehouse.open()?;
    let root = wh.root().to_string();
    let catalog = wh.catalog().to_string();
    let shared = strata_serve::Shared::new(wh, limits.max_queries, limits.query_memory);
    // One stop signal for every listener.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        let _ = stop.send(true);
    });
    let until_stopped = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let pg_listener = async {
        let Some(addr) = pg else {
            return Ok(());
        };
        let auth = match (&password, &tls) {
            (Some(_), None) => "password required",
            (Some(_), Some(_)) => "password and TLS required",
            (None, None) => "no password",
            (None, Some(_)) => "no password, TLS required",
        };
        let ssl = if tls.is_some() {
            " sslmode=require"
        } else {
            ""
        };
        let on_listen = |at: std::net::SocketAddr| {
            eprintln!(
                "serving {root} to PostgreSQL clients on {at} ({auth}; read-only): \
                 psql 'host={} port={} user={user} dbname={catalog}{ssl}'",
                at.ip(),
                at.port()
            );
        };
        let options = strata_serve::PgOptions {
            addr,
            user: user.clone(),
            password: password.clone(),
            no_auth,
            tls: tls.clone(),
        };
        strata_serve::serve_pg(&shared, options, on_listen, until_stopped()).await
    };
    let flight_listener = async {
        let Some(addr) = flight else {
            return Ok(());
        };
        let auth = match (&token, &password) {
            (Some(_), Some(_)) => "bearer token, or user and password through the handshake",
            (Some(_), None) => "bearer token",
            (None, Some(_)) => "user and password through the handshake",
            (None, None) => "no authentication",
        };
        let scheme = if tls.is_some() { "grpc+tls" } else { "grpc" };
        let on_listen = |at: std::net::SocketAddr| {
            eprintln!(
                "serving {root} to Arrow Flight SQL clients on {at} ({auth}; read-only): \
                 {scheme}://{at}"
            );
        };
        let options = strata_serve::FlightOptions {
            addr,
            user: user.clone(),
            password: password.clone(),
            token: token.clone(),
            no_auth,
            tls: tls.clone(),
        };
        strata_serve::serve_flight(&shared, options, on_listen, until_stopped()).await
    };
    let http_listener = async {
        let Some(addr) = http else {
            return Ok(());
        };
        let auth = match (&token, &password) {
            (Some(_), Some(_)) => "basic auth with the user and password, or the bearer token",
            (Some(_), None) => "bearer token (or basic auth with it as the password)",
            (None, Some(_)) => "basic auth with the user and password",
            (None, None) => "no authentication",
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let on_listen = |at: std::net::SocketAddr| {
            eprintln!("serving {root} as a web page on {at} ({auth}; read-only): {scheme}://{at}/");
        };
        let options = strata_serve::HttpOptions {
            addr,
            user: user.clone(),
            password: password.clone(),
            token: token.clone(),
            no_auth,
            tls: tls.clone(),
        };
        strata_serve::serve_http(&shared, options, on_listen, until_stopped()).await
    };
    tokio::try_join!(pg_listener, flight_listener, http_listener)?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("stopping: closing connections");
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    eprintln!("stopping: closing connections");
}

/// `--pg`'s, `--flight`'s and `--http`'s address: `IP:PORT`, or `HOST:PORT` resolved to its first address.
fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    s.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("expected IP:PORT or HOST:PORT (like 127.0.0.1:5433), got '{s}'"))
}

/// The log filter unless RUST_LOG sets one: strata's own warnings by default and no
/// dependency's lines (deltalake, DataFusion and object_store log what strata reports
/// itself, or what a user cannot act on); with `-v` strata's progress and the
/// dependencies' warnings, less the Delta kernel's errors for expected conditions (a table
/// that does not exist yet) and delta-rs's warning for every commit another writer beat.
fn log_filter(verbose: bool) -> String {
    const OURS: [&str; 5] = [
        "strata",
        "strata_cli",
        "strata_engine",
        "strata_sources",
        "strata_sql",
    ];
    let (ours, theirs) = match verbose {
        true => ("info", "warn"),
        false => ("warn", "off"),
    };
    let mut filter = vec![theirs.to_string()];
    filter.extend(OURS.iter().map(|c| format!("{c}={ours}")));
    // The server's lines (one per connection, one per failed query) are its output.
    filter.push("strata_serve=info".to_string());
    if verbose {
        filter.extend(
            [
                "buoyant_kernel=off",
                "deltalake_core::operations::merge=error",
                "deltalake_core::kernel::transaction=error",
                "deltalake_core::operations::vacuum=error",
            ]
            .map(String::from),
        );
    }
    filter.join(",")
}

fn parse_memory(s: &str) -> Result<u64, String> {
    strata_engine::memory::parse_size(s)
}

fn parse_conf(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got '{s}'")),
    }
}

fn print_plan(
    path: &std::path::Path,
    loaded: &strata_engine::LoadedPipeline,
    steps: &[PlanStep],
    format: PlanFormat,
) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    match format {
        PlanFormat::Json => {
            for step in steps {
                writeln!(out, "{}", serde_json::to_string(step)?)?;
            }
        }
        PlanFormat::Dot => write!(out, "{}", graph::dot(steps))?,
        PlanFormat::Mermaid => write!(out, "{}", graph::mermaid(steps))?,
        PlanFormat::Text => {
            match &loaded.name {
                Some(name) => writeln!(
                    out,
                    "pipeline {name} ({}): {} step(s)",
                    path.display(),
                    steps.len()
                )?,
                None => writeln!(out, "pipeline {}: {} step(s)", path.display(), steps.len())?,
            }
            for (i, step) in steps.iter().enumerate() {
                writeln!(
                    out,
                    "{:>2}. {} {}: {}",
                    i + 1,
                    step.kind,
                    step.name,
                    step.detail
                )?;
                writeln!(
                    out,
                    "    {} -> {}    [{}]",
                    step.reads.join(", "),
                    step.writes,
                    step.origin
                )?;
            }
        }
    }
    Ok(())
}

/// The run's outcome on stdout, node by node. `quiet` leaves out what found nothing new
/// (continuous mode, where most runs find nothing).
fn print_report(report: &RunReport, quiet: bool) -> std::io::Result<()> {
    print_run_report(report, quiet)?;
    upkeep::print_auto_optimized(&report.optimized)
}

fn print_run_report(report: &RunReport, quiet: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for (table, moved) in &report.set_aside {
        writeln!(
            out,
            "full refresh: {table} rebuilt from its sources; its previous content is kept in {moved}",
        )?;
    }
    for i in &report.ingests {
        let what = if i.append {
            format!("flow {} (into {})", i.flow, i.table)
        } else {
            format!("table {}", i.table)
        };
        write_outcome(&mut out, &what, &i.skipped, quiet, || {
            let from = if !i.files.is_empty() {
                format!("from {} file(s)", i.files.len())
            } else if i.once {
                "once (a one-time flow)".to_string()
            } else {
                "from its source table".to_string()
            };
            format!(
                "ingested {} row(s) {from}{}",
                i.rows,
                dropped_by_expectations(i.rows_dropped)
            )
        })?;
        for note in &i.notes {
            writeln!(out, "{what}: {note}")?;
        }
        for e in &i.expectations {
            if e.failed > 0 {
                writeln!(
                    out,
                    "{what}: expectation {} ({}): {} of {} row(s) failed",
                    e.name,
                    e.action.as_str(),
                    e.failed,
                    e.passed + e.failed
                )?;
            }
        }
    }
    for w in &report.waiting {
        writeln!(out, "waiting: {w}")?;
    }
    for f in &report.flows {
        let what = format!("flow {}", f.flow);
        write_outcome(&mut out, &what, &f.skipped, quiet, || {
            format!(
                "{} event(s), {} key(s) changed, {} row(s) written, {} row(s) replaced{}",
                f.events,
                f.keys_changed,
                f.rows_inserted,
                f.rows_deleted,
                if f.recovered {
                    " (completed an interrupted earlier run)"
                } else {
                    ""
                }
            )
        })?;
        for note in &f.notes {
            writeln!(out, "{what}: {note}")?;
        }
    }
    for v in &report.views {
        let what = format!("materialized view {}", v.table);
        write_outcome(&mut out, &what, &v.skipped, quiet, || match v.refresh {
            strata_engine::Refresh::Recomputed => format!(
                "recomputed{}, {} row(s){}",
                v.recomputed_because
                    .as_ref()
                    .map(|why| format!(" because {why}"))
                    .unwrap_or_default(),
                v.rows,
                dropped_by_expectations(v.rows_dropped)
            ),
            strata_engine::Refresh::Appended => format!(
                "incremental: {} row(s) from its input's new rows appended{}",
                v.rows,
                dropped_by_expectations(v.rows_dropped)
            ),
            strata_engine::Refresh::Combined => format!(
                "incremental: {} group(s) of its input's new rows combined into {} row(s)",
                v.rows_read, v.rows
            ),
            strata_engine::Refresh::Regrouped => format!(
                "incremental: {} group(s) its input's changed rows touch recomputed, {} row(s)",
                v.rows_read, v.rows
            ),
            strata_engine::Refresh::Rejoined => format!(
                "incremental: {} join key(s) its inputs' changed rows hold recomputed, {} row(s)",
                v.rows_read, v.rows
            ),
        })?;
    }
    for p in &report.pits {
        let what = format!("point-in-time table {}", p.table);
        write_outcome(&mut out, &what, &p.skipped, quiet, || {
            format!(
                "{} as-of value(s) computed ({} of them recomputed because history changed), \
                 {} removed, {} row(s) written",
                p.computed, p.recomputed, p.removed, p.rows
            )
        })?;
    }
    if report.stopped {
        writeln!(
            out,
            "stopped before the remaining datasets (signal received)"
        )?;
    }
    Ok(())
}

/// A node's line in the run's outcome: why it was skipped (left out when `quiet`), else
/// what it did.
fn write_outcome(
    out: &mut impl Write,
    what: &str,
    skipped: &Option<String>,
    quiet: bool,
    done: impl FnOnce() -> String,
) -> std::io::Result<()> {
    match skipped {
        Some(_) if quiet => Ok(()),
        Some(why) => writeln!(out, "{what}: {why}"),
        None => writeln!(out, "{what}: {}", done()),
    }
}

/// `, N dropped by expectations` when rows were dropped, else nothing.
fn dropped_by_expectations(rows: usize) -> String {
    if rows > 0 {
        format!(", {rows} dropped by expectations")
    } else {
        String::new()
    }
}

fn write_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: Format,
) -> Result<(), BoxError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match format {
        Format::Table => {
            let options =
                deltalake::arrow::util::display::FormatOptions::default().with_null("NULL");
            let text = if batches.is_empty() {
                deltalake::arrow::util::pretty::pretty_format_batches_with_options(
                    &[RecordBatch::new_empty(schema.clone())],
                    &options,
                )?
            } else {
                deltalake::arrow::util::pretty::pretty_format_batches_with_options(
                    batches, &options,
                )?
            };
            writeln!(out, "{text}")?;
        }
        Format::Csv => {
            let mut writer = deltalake::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            if batches.is_empty() {
                writer.write(&RecordBatch::new_empty(schema.clone()))?;
            }
            for b in batches {
                writer.write(b)?;
            }
        }
        Format::Json => {
            let mut writer = deltalake::arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, deltalake::arrow::json::writer::LineDelimited>(&mut out);
            for b in batches {
                writer.write(b)?;
            }
            writer.finish()?;
        }
    }
    out.flush()?;
    Ok(())
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    strata_engine::chain(e)
}

fn is_broken_pipe(e: &BoxError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::BrokenPipe {
                return true;
            }
        }
        cur = err.source();
    }
    false
}
