//! The engine's one error type.
//!
//! User mistakes (a bad pipeline, a bad batch, an unknown table) are kept apart from failures
//! of the storage or query layers and from internal invariant violations, which are worded
//! as bugs.

use deltalake::datafusion::error::DataFusionError;
use deltalake::DeltaTableError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The pipeline text does not parse or does not plan.
    #[error("{file}:{source}")]
    Pipeline {
        file: String,
        #[source]
        source: Box<strata_sql::SqlError>,
    },
    /// A YAML pipeline spec is malformed, or a text of a pipeline assembled from several
    /// (a spec's libraries and generated SQL) does not parse or plan; the message names the
    /// file, or the spec entry, and the place.
    #[error("{0}")]
    Spec(String),
    /// The pipeline is well formed but cannot run against these schemas or tables
    /// (unknown column, reserved name, changed key schema). Nothing has been written. `at`
    /// names the statement when the error is about one (`flow users_flow (line 5)`); `msg`
    /// is the rest of the sentence, starting with its separator when `at` is set.
    #[error("{}{msg}", at.as_ref().map(ToString::to_string).unwrap_or_default())]
    Plan { at: Option<Place>, msg: String },
    /// A batch of input was rejected (NULL key, NULL sequence, conflicting tie, unparsable
    /// file). Nothing of that run of that flow was written.
    #[error("{0}")]
    BadInput(String),
    /// The user asked for something that does not exist (a table in `query`/`validate`).
    #[error("{0}")]
    NotFound(String),
    /// Another writer committed to a table first, in a way this commit cannot be placed
    /// after (the same application transaction, a file this commit replaces, the table
    /// created at the same moment). Nothing of this commit was written; the dataset's run
    /// can be tried again from the start, which the runtime does.
    #[error("{context}: another writer committed first: {source}")]
    Conflict {
        context: String,
        #[source]
        source: Box<DeltaTableError>,
    },
    /// Another run of the pipeline holds its lock (`strata run --lock`).
    #[error("{0}")]
    Locked(String),
    #[error("{context}: {source}")]
    Delta {
        context: String,
        #[source]
        source: Box<DeltaTableError>,
    },
    #[error("{context}: {source}")]
    DataFusion {
        context: String,
        #[source]
        source: Box<DataFusionError>,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A database source could not be read (connection, query, types, watermark, slot);
    /// the source's message names the connection and the object, never a password.
    #[error("{context}: {source}")]
    Source {
        context: String,
        #[source]
        source: Box<strata_sources::SourceError>,
    },
    /// An invariant of strata itself was violated.
    #[error("internal error, this is a bug in strata: {0}")]
    Internal(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Where in a pipeline's text an error is: the dataset or flow it is about and its
/// statement's line, in the text that holds it when the pipeline has several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// `flow users_flow`, `materialized view default.plans`.
    pub what: String,
    /// The statement's line (in the pipeline as planned; see [`Place::text`]).
    pub line: u64,
    /// The text the statement is in, when the pipeline has several (a YAML spec's
    /// libraries and generated SQL): set by the loader, which also makes `line` local.
    pub text: Option<Text>,
}

/// A text of a pipeline of several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// A file the user wrote: places say `file:line`.
    File(String),
    /// SQL generated from a spec entry (`spec.yaml: tables[0] (raw)`): places name the
    /// entry only, its lines being strata's.
    Generated(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.text {
            None => write!(f, "{} (line {})", self.what, self.line),
            Some(Text::File(file)) => write!(f, "{} ({file}:{})", self.what, self.line),
            Some(Text::Generated(entry)) => write!(f, "{} ({entry})", self.what),
        }
    }
}

impl EngineError {
    /// A violated invariant of strata itself (a bug), saying which.
    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        EngineError::Internal(msg.into())
    }

    /// A plan error about no statement in particular.
    pub(crate) fn plan(msg: impl Into<String>) -> Self {
        EngineError::Plan {
            at: None,
            msg: msg.into(),
        }
    }

    /// A plan error about `what` (`flow users_flow`), declared at `line`: `what (line N):
    /// msg`.
    pub(crate) fn plan_at(what: impl Into<String>, line: u64, msg: impl std::fmt::Display) -> Self {
        EngineError::Plan {
            at: Some(Place {
                what: what.into(),
                line,
                text: None,
            }),
            msg: format!(": {msg}"),
        }
    }

    /// A plan error saying what the statement of `what` at `line` does wrong, as one
    /// sentence: `what (line N) reads t, which ...`.
    pub(crate) fn plan_does(
        what: impl Into<String>,
        line: u64,
        does: impl std::fmt::Display,
    ) -> Self {
        EngineError::Plan {
            at: Some(Place {
                what: what.into(),
                line,
                text: None,
            }),
            msg: format!(" {does}"),
        }
    }

    /// This error with `context` in front: storage and query errors keep their source under
    /// the new context; a user's error (plan, input) is returned as it is.
    pub(crate) fn within(mut self, context: impl FnOnce() -> String) -> Self {
        match &mut self {
            EngineError::Delta { context: c, .. }
            | EngineError::Conflict { context: c, .. }
            | EngineError::DataFusion { context: c, .. }
            | EngineError::Io { context: c, .. } => *c = format!("{}: {c}", context()),
            _ => {}
        }
        self
    }

    /// A query's error: the user's mistake (SQL that does not parse or plan, an unknown
    /// column) as a plan error `what: ...`, anything else (reading, executing) as a query
    /// error carrying its source.
    pub(crate) fn of_query(what: impl Into<String>, e: DataFusionError) -> Self {
        let what = what.into();
        match e.find_root() {
            DataFusionError::Plan(..)
            | DataFusionError::SQL(..)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(..) => EngineError::plan(format!("{what}: {e}")),
            _ => EngineError::DataFusion {
                context: what,
                source: Box::new(e),
            },
        }
    }

    /// This error with its place (if any) in the text that holds it, per `locate` (which
    /// maps a line of the pipeline as planned to its text and local line).
    pub(crate) fn locate(self, locate: impl Fn(u64) -> Option<(Text, u64)>) -> Self {
        match self {
            EngineError::Plan {
                at: Some(mut place),
                msg,
            } if place.text.is_none() => {
                if let Some((text, line)) = locate(place.line) {
                    place.text = Some(text);
                    place.line = line;
                }
                EngineError::Plan {
                    at: Some(place),
                    msg,
                }
            }
            other => other,
        }
    }
}

/// Adds a context sentence to errors of the layers below.
pub(crate) trait Context<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, strata_sources::SourceError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| EngineError::Source {
            context: context(),
            source: Box::new(source),
        })
    }
}

impl<T> Context<T> for std::result::Result<T, DeltaTableError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| {
            let (context, source) = (context(), Box::new(source));
            if is_conflict(&source) {
                EngineError::Conflict { context, source }
            } else {
                EngineError::Delta { context, source }
            }
        })
    }
}

/// Whether a failed commit lost a race with another writer: the version it meant to write
/// exists, or the winning commit conflicts with it (Delta's conflict checker).
pub(crate) fn is_conflict(e: &DeltaTableError) -> bool {
    use deltalake::kernel::transaction::TransactionError as T;
    matches!(
        e,
        DeltaTableError::VersionAlreadyExists(_)
            | DeltaTableError::Transaction {
                source: T::CommitConflict(_) | T::VersionAlreadyExists(_) | T::MaxCommitAttempts(_)
            }
    )
}

impl EngineError {
    /// Whether this is a lost race with another writer ([`EngineError::Conflict`]): the
    /// dataset's run may be tried again from the start.
    pub fn is_conflict(&self) -> bool {
        matches!(self, EngineError::Conflict { .. })
    }
}

impl EngineError {
    /// Whether another attempt of the whole run may succeed without anyone changing the
    /// pipeline or its input: the environment failed (a connection refused, reset or timed
    /// out, a database that did not answer, an object store's error, a full disk, another
    /// writer committing first). A data or pipeline error (a NULL key, a conflicting tie, a
    /// failed expectation, a schema or plan error, a missing file or table, a password
    /// refused) is not: another attempt would meet it again. Unknown failures of the layers
    /// below count as permanent, so that a retry is only spent where it can help.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Pipeline { .. }
            | EngineError::Spec(_)
            | EngineError::Plan { .. }
            | EngineError::BadInput(_)
            | EngineError::NotFound(_)
            | EngineError::Locked(_)
            | EngineError::Internal(_) => false,
            EngineError::Conflict { .. } => true,
            EngineError::Io { source, .. } => transient_kind(source.kind()),
            EngineError::Delta { source, .. } => transient_cause(source.as_ref()),
            EngineError::DataFusion { source, .. } => transient_cause(source.as_ref()),
            EngineError::Source { source, .. } => transient_source(source),
        }
    }
}

/// I/O failures that can pass on their own: the network, a busy or full device. A missing
/// file, a permission, malformed data are not.
fn transient_kind(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::AddrInUse
            | K::AddrNotAvailable
            | K::BrokenPipe
            | K::TimedOut
            | K::Interrupted
            | K::WouldBlock
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
            | K::ResourceBusy
            | K::StorageFull
            | K::QuotaExceeded
            | K::StaleNetworkFileHandle
    )
}

/// Whether the first I/O or object-store error in `e`'s chain of causes is transient.
fn transient_cause(e: &(dyn std::error::Error + 'static)) -> bool {
    use deltalake::ObjectStoreError as O;
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return transient_kind(io.kind());
        }
        // One of ours wrapped by a layer below (a table provider's error inside DataFusion).
        if let Some(engine) = err.downcast_ref::<EngineError>() {
            return engine.is_transient();
        }
        if let Some(source) = err.downcast_ref::<strata_sources::SourceError>() {
            return transient_source(source);
        }
        if let Some(store) = err.downcast_ref::<O>() {
            return match store {
                // A local or remote store's own failure: decided by its I/O cause when it
                // has one (a local file system), else an HTTP store's error after its own
                // retries (a 5xx, a timeout): transient.
                O::Generic { source, .. } => {
                    source_chain_io(source.as_ref()).is_none_or(transient_kind)
                }
                O::JoinError { .. } => true,
                _ => false,
            };
        }
        cur = err.source();
    }
    false
}

/// The kind of the first I/O error in `e`'s chain.
fn source_chain_io(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

/// A database source: no connection (refused, timed out, dropped) or a replication stream
/// that broke is transient; a refused password, a database, table or column that does not
/// exist, a type or value strata cannot read, TLS that failed (`Tls`: an untrusted
/// certificate, a server without TLS) are not.
fn transient_source(e: &strata_sources::SourceError) -> bool {
    use strata_sources::SourceError as S;
    let dropped = |detail: &str| {
        let d = detail.to_ascii_lowercase();
        [
            "connection refused",
            "connection reset",
            "connection closed",
            "broken pipe",
            "timed out",
            "timeout",
            "no answer within",
            "server closed the connection",
            "terminating connection",
            "unexpected eof",
            "i/o error",
            "io error",
        ]
        .iter()
        .any(|m| d.contains(m))
    };
    match e {
        S::Connect { detail, .. } => {
            let d = detail.to_ascii_lowercase();
            let refused_login = [
                "password",
                "authentication",
                "access denied",
                "does not exist",
                "pg_hba.conf",
                "unknown database",
                "client certificate",
            ]
            .iter()
            .any(|m| d.contains(m));
            !refused_login
        }
        S::Query { detail, .. } => dropped(detail),
        S::Replication { .. } => true,
        // A binlog stream that failed or stalled, or a read that met the table changing as
        // it began ("run again"); not a position that is gone, nor a table whose columns
        // changed in a way binlog CDC cannot follow.
        S::Binlog {
            resnapshot: false,
            detail,
            ..
        } => detail.contains("stream") || detail.contains("run again") || dropped(detail),
        S::Io { source, .. } => transient_kind(source.kind()),
        _ => false,
    }
}

impl<T> Context<T> for std::result::Result<T, DataFusionError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| EngineError::DataFusion {
            context: context(),
            source: Box::new(source),
        })
    }
}

impl<T> Context<T> for std::result::Result<T, deltalake::arrow::error::ArrowError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| EngineError::DataFusion {
            context: context(),
            source: Box::new(DataFusionError::ArrowError(Box::new(source), None)),
        })
    }
}

impl<T> Context<T>
    for std::result::Result<T, deltalake::datafusion::parquet::errors::ParquetError>
{
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| EngineError::DataFusion {
            context: context(),
            source: Box::new(DataFusionError::ParquetError(Box::new(source))),
        })
    }
}

impl<T> Context<T> for std::result::Result<T, std::io::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| EngineError::Io {
            context: context(),
            source,
        })
    }
}

/// `e` and its causes, joined with `: `; a cause whose text the message before it already
/// contains is not repeated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error as IoError, ErrorKind};

    fn io(kind: ErrorKind) -> EngineError {
        EngineError::Io {
            context: "reading".into(),
            source: IoError::new(kind, "x"),
        }
    }

    fn connect(detail: &str) -> EngineError {
        EngineError::Source {
            context: "table orders_raw".into(),
            source: Box::new(strata_sources::SourceError::Connect {
                connection: "shop".into(),
                kind: "PostgreSQL",
                host: "db".into(),
                port: 5432,
                user: "etl".into(),
                detail: detail.into(),
            }),
        }
    }

    #[test]
    fn data_and_pipeline_errors_are_never_transient() {
        for e in [
            EngineError::BadInput("flow f: conflicting tie at key (1) and sequence 3".into()),
            EngineError::BadInput("flow f: NULL key".into()),
            EngineError::plan("unknown column x"),
            EngineError::Spec("spec.yaml: name: must not be empty".into()),
            EngineError::NotFound("table t".into()),
            EngineError::Internal("bug".into()),
            EngineError::DataFusion {
                context: "expectation".into(),
                source: Box::new(DataFusionError::Execution(
                    "expectation valid_id failed".into(),
                )),
            },
            io(ErrorKind::NotFound),
            io(ErrorKind::PermissionDenied),
            io(ErrorKind::InvalidData),
            connect("password authentication failed for user \"etl\""),
            connect("database \"shop\" does not exist"),
            connect(
                "connection requires a valid client certificate (SQLSTATE 28000); the server \
                 takes this user only with a client certificate: set the options sslcert and \
                 sslkey",
            ),
            // A certificate strata must not trust stays untrusted however often it is tried.
            EngineError::Source {
                context: "table orders_raw".into(),
                source: Box::new(strata_sources::SourceError::Tls {
                    connection: "shop".into(),
                    kind: "PostgreSQL",
                    host: "db".into(),
                    port: 5432,
                    settings: "sslmode 'verify-full', sslrootcert '/etc/ca.pem'".into(),
                    detail: "error performing TLS handshake: invalid peer certificate: \
                             UnknownIssuer; the server's certificate is not signed by a CA in \
                             sslrootcert"
                        .into(),
                }),
            },
        ] {
            assert!(!e.is_transient(), "{e}");
        }
    }

    #[test]
    fn the_environment_failing_is_transient() {
        let store = |source: IoError| EngineError::Delta {
            context: "commit".into(),
            source: Box::new(DeltaTableError::ObjectStore {
                source: deltalake::ObjectStoreError::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(source),
                },
            }),
        };
        for e in [
            io(ErrorKind::ConnectionRefused),
            io(ErrorKind::TimedOut),
            io(ErrorKind::StorageFull),
            store(IoError::new(ErrorKind::ConnectionReset, "reset")),
            EngineError::DataFusion {
                context: "reading".into(),
                source: Box::new(DataFusionError::IoError(IoError::new(
                    ErrorKind::BrokenPipe,
                    "pipe",
                ))),
            },
            EngineError::DataFusion {
                context: "reading".into(),
                source: Box::new(DataFusionError::External(Box::new(connect(
                    "error connecting to server: Connection refused (os error 111)",
                )))),
            },
            connect("error connecting to server: Connection refused (os error 111)"),
            connect("no answer within 10 s"),
            EngineError::Source {
                context: "table changes".into(),
                source: Box::new(strata_sources::SourceError::Binlog {
                    connection: "shop".into(),
                    position: None,
                    detail: "table shop.t was changed (`ALTER TABLE t ADD x INT`) while this \
                             read began; run again"
                        .into(),
                    resnapshot: false,
                }),
            },
            EngineError::Conflict {
                context: "t".into(),
                source: Box::new(DeltaTableError::VersionAlreadyExists(3)),
            },
        ] {
            assert!(e.is_transient(), "{e}");
        }
        assert!(!store(IoError::new(ErrorKind::PermissionDenied, "denied")).is_transient());
    }
}
