//! An overlap window reads again the rows at or above a point before the stored watermark
//! (for sources whose watermark column is set by transactions that commit out of order).
//! The rows already in the table are not appended twice: [`Seen`] holds the table's rows
//! inside the window and drops each new row equal to one of them, once per copy (a
//! multiset: two equal rows in the source and one in the table let one through).
//!
//! Rows are compared as the streaming table's query produced them; a query that adds a
//! value of its own (`current_timestamp()`) makes every re-read row new.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{BooleanArray, RecordBatch};
use deltalake::arrow::compute::filter_record_batch;
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafusion::prelude::{ident, lit};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;
use std::collections::HashMap;
use std::sync::Mutex;
use strata_sources::WatermarkValue;

/// The rows of a table inside an overlap window, counted by their encoded form.
pub(crate) struct Seen {
    converter: RowConverter,
    counts: Mutex<HashMap<Vec<u8>, usize>>,
}

impl Seen {
    /// The rows of `batches` (all of `schema`).
    pub(crate) fn new(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Seen> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)
            .map_err(|e| EngineError::internal(format!("comparing rows: {e}")))?;
        let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
        for b in batches {
            let rows = converter
                .convert_columns(b.columns())
                .map_err(|e| EngineError::internal(format!("comparing rows: {e}")))?;
            for row in rows.iter() {
                *counts.entry(row.as_ref().to_vec()).or_default() += 1;
            }
        }
        Ok(Seen {
            converter,
            counts: Mutex::new(counts),
        })
    }

    /// `batches` without the rows already seen (each seen row cancels one new copy).
    pub(crate) fn drop_seen(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let mut counts = self
            .counts
            .lock()
            .map_err(|_| EngineError::internal("overlap rows lock poisoned"))?;
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            let rows = self
                .converter
                .convert_columns(b.columns())
                .map_err(|e| EngineError::internal(format!("comparing rows: {e}")))?;
            let keep: BooleanArray = rows
                .iter()
                .map(|row| match counts.get_mut(row.as_ref()) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        Some(false)
                    }
                    _ => Some(true),
                })
                .collect();
            if keep.true_count() == b.num_rows() {
                out.push(b);
            } else {
                out.push(
                    filter_record_batch(&b, &keep)
                        .map_err(|e| EngineError::internal(format!("filtering rows: {e}")))?,
                );
            }
        }
        Ok(out)
    }
}

/// `v` as a value of a column of type `dt`.
pub(crate) fn scalar_of(v: &WatermarkValue, dt: &DataType) -> Result<ScalarValue> {
    let raw = match v {
        WatermarkValue::Int(i) => ScalarValue::Int64(Some(*i)),
        WatermarkValue::Decimal { unscaled, scale } => {
            ScalarValue::Decimal128(Some(*unscaled), 38, *scale)
        }
        WatermarkValue::Float(f) => ScalarValue::Float64(Some(*f)),
        WatermarkValue::Str(s) => ScalarValue::Utf8(Some(s.clone())),
        WatermarkValue::Bool(b) => ScalarValue::Boolean(Some(*b)),
        WatermarkValue::Date(d) => ScalarValue::Date32(Some(*d)),
        WatermarkValue::Timestamp(t) => ScalarValue::TimestampMicrosecond(Some(*t), None),
        WatermarkValue::TimestampUtc(t) => {
            ScalarValue::TimestampMicrosecond(Some(*t), Some("UTC".into()))
        }
    };
    raw.cast_to(dt).map_err(|e| {
        EngineError::internal(format!(
            "the overlap's lower bound as {}: {e}",
            crate::util::arrow::sql_type_name(dt)
        ))
    })
}

/// The rows of `table` whose `column` is at or above `from`, in the columns and types of
/// `rows` (the query's rows as they are appended): what an overlap window may read again.
pub(crate) async fn rows_from(
    table: &DeltaTable,
    rows: &SchemaRef,
    column: &str,
    from: &WatermarkValue,
) -> Result<Seen> {
    let schema = crate::storage::table::table_schema(table)?;
    let field = schema
        .fields()
        .iter()
        .find(|f| f.name().eq_ignore_ascii_case(column))
        .ok_or_else(|| {
            EngineError::plan(format!(
                "an overlap window needs the watermark column {column} in the table, to \
                 recognise the rows it reads again; keep it in the query's columns"
            ))
        })?;
    let bound = scalar_of(from, field.data_type())?;
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "__strata_seen", table, None).await?;
    let batches = ctx
        .table("__strata_seen")
        .await
        .context(|| "reading the rows inside the overlap window".into())?
        .filter(ident(field.name()).gt_eq(lit(bound)))
        .context(|| "reading the rows inside the overlap window".into())?
        .collect()
        .await
        .context(|| "reading the rows inside the overlap window".into())?;
    // By name: a column the table gained in this run (schema evolution) is NULL in its rows.
    let batches = batches
        .iter()
        .map(|b| crate::util::arrow::align_by_name(b, rows))
        .collect::<Result<Vec<_>>>()?;
    Seen::new(rows, &batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{Field, Schema, TimeUnit};
    use std::sync::Arc;

    fn batch(ids: &[i64], names: &[Option<&str>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn rows_already_in_the_table_are_dropped_once_per_copy() {
        let old = batch(&[1, 2, 2], &[Some("a"), None, None]);
        let seen = Seen::new(&old.schema(), &[old]).unwrap();
        let new = batch(
            &[1, 1, 2, 2, 2, 3],
            &[Some("a"), Some("a"), None, None, None, Some("c")],
        );
        let kept = seen.drop_seen(vec![new]).unwrap();
        let ids: Vec<i64> = kept
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        // One "1 a" and two "2 NULL" were in the table: one of each copy is left over.
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn a_lower_bound_takes_the_column_type() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        assert_eq!(
            scalar_of(&WatermarkValue::TimestampUtc(5), &ts).unwrap(),
            ScalarValue::TimestampMicrosecond(Some(5), Some("UTC".into()))
        );
        assert_eq!(
            scalar_of(&WatermarkValue::Int(7), &DataType::Int32).unwrap(),
            ScalarValue::Int32(Some(7))
        );
        assert_eq!(
            scalar_of(
                &WatermarkValue::Decimal {
                    unscaled: 1250,
                    scale: 2
                },
                &DataType::Decimal128(10, 2)
            )
            .unwrap(),
            ScalarValue::Decimal128(Some(1250), 10, 2)
        );
    }
}
