//! What a watermark read asks for ([`WatermarkRead`]) and the checks of its columns against a
//! described table; the backends (`pg::read`, `mysql`) run it, [`crate::source`] hands the
//! batches out.

use arrow_array::RecordBatch;

use crate::batch::{ColumnKind, SourceSchema};
use crate::conn::Resolved;
use crate::error::{Result, SourceError};
use crate::object::SourceObject;
use crate::value::{LowerBound, Watermark};

/// Default rows per batch (64 Ki).
pub const DEFAULT_BATCH_ROWS: usize = 65_536;

/// A batch with the watermark of its last row.
pub(crate) type WatermarkBatch = (RecordBatch, Option<Watermark>);

/// Batches of a read running in a task of its own.
pub(crate) type BatchReceiver = tokio::sync::mpsc::Receiver<Result<WatermarkBatch>>;

/// A watermark (cursor) read: the rows whose watermark columns, compared as a tuple, are above
/// a lower bound, in watermark order.
#[derive(Clone, Debug)]
pub struct WatermarkRead {
    /// Table or query.
    pub object: SourceObject,
    /// One or more columns, compared as a tuple, in this order (ORDER BY them too). Rows with a
    /// NULL in any of them are never read.
    pub watermark_columns: Vec<String>,
    /// Columns to leave out (for example ones with types strata cannot map).
    pub exclude_columns: Vec<String>,
    /// `None`: read everything (first load).
    pub lower_bound: Option<LowerBound>,
    /// Rows per batch ([`DEFAULT_BATCH_ROWS`]).
    pub batch_rows: usize,
    /// PostgreSQL: how many ranges of the leading watermark column to read concurrently, in
    /// one snapshot (`None`: chosen from the table's estimated rows; 1: one query). MySQL /
    /// MariaDB reads are always one query.
    pub parallel: Option<usize>,
}

impl WatermarkRead {
    /// A read of everything, 64 Ki rows per batch.
    pub fn new(object: SourceObject, watermark_columns: Vec<String>) -> Self {
        WatermarkRead {
            object,
            watermark_columns,
            exclude_columns: vec![],
            lower_bound: None,
            batch_rows: DEFAULT_BATCH_ROWS,
            parallel: None,
        }
    }

    /// Leave these columns out.
    pub fn exclude(mut self, columns: Vec<String>) -> Self {
        self.exclude_columns = columns;
        self
    }

    /// Start at this bound.
    pub fn lower_bound(mut self, bound: Option<LowerBound>) -> Self {
        self.lower_bound = bound;
        self
    }

    /// Ranges read concurrently (PostgreSQL; `None`: automatic, see [`WatermarkRead::parallel`]).
    pub fn parallel(mut self, ranges: Option<usize>) -> Self {
        self.parallel = ranges;
        self
    }

    /// Rows per batch (at least 1).
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows.max(1);
        self
    }
}

/// Check the watermark and excluded columns against the described columns.
pub(crate) fn check_columns(
    r: &Resolved,
    object: &SourceObject,
    all_names: &[String],
    schema: &SourceSchema,
    watermark: &[String],
    exclude: &[String],
) -> Result<Vec<usize>> {
    let available = || all_names.join(", ");
    for e in exclude {
        if !all_names.contains(e) {
            return Err(SourceError::NoSuchColumn {
                connection: r.name().to_string(),
                object: object.label(),
                column: e.clone(),
                available: available(),
                hint: "it was named as a column to exclude".into(),
            });
        }
    }
    let mut idx = Vec::new();
    for w in watermark {
        match schema.index_of(w) {
            Some(i) => {
                if matches!(schema.columns[i].kind, ColumnKind::Binary) {
                    return Err(SourceError::Watermark {
                        detail: format!("{}: watermark column '{w}' is binary; pick a number, date, timestamp or text column", object.label()),
                    });
                }
                idx.push(i)
            }
            None => {
                return Err(SourceError::NoSuchColumn {
                    connection: r.name().to_string(),
                    object: object.label(),
                    column: w.clone(),
                    available: available(),
                    hint: if exclude.contains(w) {
                        "a watermark column cannot be excluded".into()
                    } else {
                        "it was named as a watermark column".into()
                    },
                })
            }
        }
    }
    Ok(idx)
}
