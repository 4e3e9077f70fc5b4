//! The engine's one error type.
//!
//! User mistakes (a bad pipeline, a bad batch, an unknown table) are kept apart from failures
//! of the storage or query layers and from internal invariant violations, which are worded
//! as bugs.

use deltalake::datafusion::error::DataFusionError;
use deltalake::DeltaTableError;

#[derive(Debug, thiserror::Error)]
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
    pub(crate) fn within(self, context: impl FnOnce() -> String) -> Self {
        let wrap = |c: String| format!("{}: {c}", context());
        match self {
            EngineError::Delta { context: c, source } => EngineError::Delta {
                context: wrap(c),
                source,
            },
            EngineError::Conflict { context: c, source } => EngineError::Conflict {
                context: wrap(c),
                source,
            },
            EngineError::DataFusion { context: c, source } => EngineError::DataFusion {
                context: wrap(c),
                source,
            },
            EngineError::Io { context: c, source } => EngineError::Io {
                context: wrap(c),
                source,
            },
            other => other,
        }
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
