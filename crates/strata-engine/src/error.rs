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
    /// (unknown column, reserved name, changed key schema). Nothing has been written.
    #[error("{0}")]
    Plan(String),
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
    /// An invariant of strata itself was violated.
    #[error("internal error, this is a bug in strata: {0}")]
    Internal(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Adds a context sentence to errors of the layers below.
pub(crate) trait Context<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
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
