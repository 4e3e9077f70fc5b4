//! What a watermark read asks for ([`WatermarkRead`]) and the checks of its columns against a
//! described table; the backends (`pg::read`, `mysql`) run it, [`crate::source`] hands the
//! batches out.

use arrow_array::RecordBatch;

use crate::batch::{ColumnKind, SourceColumn, SourceSchema};
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
    /// The rows may come in any order: a first load (no lower bound) of a PostgreSQL table
    /// then reads the table as it lies on disk, in ranges of its pages, and the highest
    /// watermark is found by the server in the same snapshot
    /// ([`crate::WatermarkReader::in_watermark_order`] says whether it did). Ignored for
    /// queries, MySQL / MariaDB and reads from a lower bound, which stay in watermark order.
    pub any_order: bool,
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
            any_order: false,
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

    /// Let the rows come in any order (see [`WatermarkRead::any_order`]).
    pub fn any_order(mut self, yes: bool) -> Self {
        self.any_order = yes;
        self
    }

    /// Rows per batch (at least 1).
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows.max(1);
        self
    }
}

impl WatermarkRead {
    /// Check this read's watermark and excluded columns against its described table or
    /// query (see [`describe_columns`]).
    pub(crate) fn check_described<D>(
        &self,
        r: &Resolved,
        (schema, decoders, all): (SourceSchema, Vec<D>, Vec<String>),
    ) -> Result<Described<D>> {
        let wm_idx = check_columns(
            r,
            &self.object,
            &all,
            &schema,
            &self.watermark_columns,
            &self.exclude_columns,
        )?;
        Ok(Described {
            schema,
            decoders,
            wm_idx,
        })
    }
}

/// What a watermark read decodes: the described table or query (its kept columns), each
/// column's decoder, and where its watermark columns are.
#[derive(Clone)]
pub(crate) struct Described<D> {
    pub schema: SourceSchema,
    pub decoders: Vec<D>,
    pub wm_idx: Vec<usize>,
}

/// A result column as a backend's driver describes it: its name, whether it is NOT NULL,
/// whether nearly all its values are distinct ([`SourceColumn::distinct`]), and its mapping (decoder, Arrow kind, source type name) or the type's name and why strata
/// cannot read it (an error only when the column is kept).
pub(crate) struct ResultColumn<D> {
    pub name: String,
    pub not_null: bool,
    pub distinct: bool,
    pub mapping: std::result::Result<(D, ColumnKind, String), (String, String)>,
}

/// A described table or query: the schema of its kept (not excluded) columns, each kept
/// column's decoder, and the names of all its columns (for [`check_columns`]). Two columns of
/// one name, or a kept column of a type strata cannot read, are errors.
pub(crate) fn describe_columns<D>(
    r: &Resolved,
    object: &SourceObject,
    exclude: &[String],
    result_columns: impl IntoIterator<Item = ResultColumn<D>>,
) -> Result<(SourceSchema, Vec<D>, Vec<String>)> {
    let mut columns = Vec::new();
    let mut decoders = Vec::new();
    let mut all = Vec::new();
    for c in result_columns {
        let name = c.name;
        if all.contains(&name) {
            return Err(r.query_error(
                object.label(),
                format!("two columns are named '{name}'; give them distinct names (AS ...) in the query"),
            ));
        }
        all.push(name.clone());
        if exclude.contains(&name) {
            continue;
        }
        let (decode, kind, source_type) =
            c.mapping
                .map_err(|(type_name, why)| SourceError::UnsupportedType {
                    connection: r.name().to_string(),
                    object: object.label(),
                    column: name.clone(),
                    type_name,
                    why,
                })?;
        columns.push(SourceColumn {
            name,
            source_type,
            kind,
            not_null: c.not_null,
            distinct: c.distinct,
        });
        decoders.push(decode);
    }
    let schema = SourceSchema {
        object: match object {
            SourceObject::Table(t) => t.to_string(),
            SourceObject::Query(_) => "query".into(),
        },
        columns,
    };
    Ok((schema, decoders, all))
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
