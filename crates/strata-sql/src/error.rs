//! The crate's error type: a syntax error in the text, or a plan error in the dataset graph.
use crate::ast::Location;

/// Everything that can be wrong with a pipeline's text or its dataset graph.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The text does not parse. `snippet` is the offending source line with a caret line.
    #[error("{location}: {message}\n{snippet}")]
    Syntax {
        location: Location,
        message: String,
        snippet: String,
    },
    /// The statements parse but do not form a valid pipeline (unknown table, cycle,
    /// contradictory flow options). `first` is the earlier declaration a duplicate clashes
    /// with.
    #[error("{location}: {message}{}", first.map(|f| format!(" (first at {f})")).unwrap_or_default())]
    Plan {
        location: Location,
        message: String,
        first: Option<Location>,
    },
}

pub type Result<T, E = SqlError> = std::result::Result<T, E>;
