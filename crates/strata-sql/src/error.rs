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
    /// contradictory flow options).
    #[error("{location}: {message}")]
    Plan { location: Location, message: String },
}

pub type Result<T, E = SqlError> = std::result::Result<T, E>;
