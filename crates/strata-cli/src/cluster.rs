//! `strata cluster scheduler|executor`, and `strata run --cluster`'s connector.

use crate::BoxError;
use clap::Subcommand;
use std::process::ExitCode;

/// `--cluster-min-events`'s default: a first load of fewer events is quicker here than
/// shipped to a cluster.
pub(crate) const DEFAULT_MIN_EVENTS: u64 = 1_000_000;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Run the scheduler: it plans the bulk loads `strata run --cluster df://ADDR` sends and
    /// hands their tasks to the executors.
    Scheduler {
        /// Listen at ADDR (IP:PORT or HOST:PORT).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50050", value_parser = crate::parse_listen_addr)]
        bind: std::net::SocketAddr,
    },
    /// Run an executor: it joins the scheduler and runs tasks (reading source files, the
    /// shuffle by key, folding and writing a part's files).
    Executor {
        /// The scheduler's address.
        #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
        scheduler: String,
        /// The host this executor listens on and is reached at.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// The port other executors fetch shuffle data from (Arrow Flight).
        #[arg(long, default_value_t = 50051)]
        port: u16,
        /// The port the scheduler reaches this executor at (gRPC).
        #[arg(long, default_value_t = 50052)]
        grpc_port: u16,
        /// Tasks run at a time [default: the machine's cores].
        #[arg(long, value_name = "N")]
        slots: Option<usize>,
        /// The folder for shuffle files [default: a temporary folder].
        #[arg(long, value_name = "DIR")]
        work_dir: Option<std::path::PathBuf>,
    },
}

/// Runs a cluster process until it stops (Ctrl-C or SIGTERM).
pub(crate) async fn run(command: ClusterCommand) -> Result<ExitCode, BoxError> {
    let (what, work) = match command {
        ClusterCommand::Scheduler { bind } => {
            eprintln!("strata cluster scheduler: listening on {bind} (df://{bind})");
            (
                "scheduler",
                tokio::spawn(strata_cluster::run_scheduler(bind)),
            )
        }
        ClusterCommand::Executor {
            scheduler,
            host,
            port,
            grpc_port,
            slots,
            work_dir,
        } => {
            eprintln!(
                "strata cluster executor: joining the scheduler at {scheduler}, listening on \
                 {host}:{port} (shuffle) and {host}:{grpc_port} (tasks)"
            );
            let options = strata_cluster::ExecutorOptions {
                scheduler,
                host,
                port,
                grpc_port,
                slots,
                work_dir: work_dir.map(|d| d.display().to_string()),
            };
            (
                "executor",
                tokio::spawn(strata_cluster::run_executor(options)),
            )
        }
    };
    tokio::select! {
        done = work => {
            done.map_err(|e| format!("the {what} stopped: {e}"))??;
            Ok(ExitCode::SUCCESS)
        }
        _ = stopped() => {
            eprintln!("strata cluster {what}: stopped");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The configuration keys of `--cluster` and `--cluster-min-events`.
const URL_KEY: &str = "strata.cluster";
const MIN_EVENTS_KEY: &str = "strata.cluster.minEvents";

/// `strata run`'s cluster: `--cluster URL` (else `strata.cluster` of the pipeline's
/// `settings`), with `--cluster-min-events N` (else `strata.cluster.minEvents`, else
/// [`DEFAULT_MIN_EVENTS`]).
pub(crate) fn from_settings(
    url: Option<String>,
    min_events: Option<u64>,
    settings: &std::collections::BTreeMap<String, String>,
) -> Result<Option<strata_engine::cluster::ClusterRun>, BoxError> {
    let Some(url) = url.or_else(|| settings.get(URL_KEY).cloned()) else {
        if min_events.is_some() {
            return Err("--cluster-min-events needs a cluster: --cluster URL".into());
        }
        return Ok(None);
    };
    let min_events = match (min_events, settings.get(MIN_EVENTS_KEY)) {
        (Some(n), _) => n,
        (None, Some(text)) => text
            .trim()
            .parse()
            .map_err(|_| format!("{MIN_EVENTS_KEY} = {text:?}: expected a number of events"))?,
        (None, None) => DEFAULT_MIN_EVENTS,
    };
    let connector = strata_cluster::Connector::new(&url)?;
    Ok(Some(strata_engine::cluster::ClusterRun {
        connector: std::sync::Arc::new(connector),
        min_events,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_comes_from_the_flag_else_the_configuration() {
        let conf = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let none = from_settings(None, None, &conf(&[])).unwrap();
        assert!(none.is_none());
        let set = conf(&[(URL_KEY, "df://h:1"), (MIN_EVENTS_KEY, "5")]);
        let c = from_settings(None, None, &set).unwrap().unwrap();
        assert_eq!((c.connector.url(), c.min_events), ("df://h:1".into(), 5));
        let c = from_settings(Some("df://g:2".into()), Some(7), &set)
            .unwrap()
            .unwrap();
        assert_eq!((c.connector.url(), c.min_events), ("df://g:2".into(), 7));
        let c = from_settings(Some("df://g:2".into()), None, &conf(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(c.min_events, DEFAULT_MIN_EVENTS);
        let bad = conf(&[(URL_KEY, "df://h:1"), (MIN_EVENTS_KEY, "lots")]);
        let e = from_settings(None, None, &bad).err().unwrap().to_string();
        assert!(e.contains(MIN_EVENTS_KEY) && e.contains("lots"), "{e}");
        assert!(from_settings(None, Some(3), &conf(&[])).is_err());
        assert!(from_settings(Some("h:1".into()), None, &conf(&[])).is_err());
    }
}
