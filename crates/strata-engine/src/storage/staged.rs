//! Tables whose rows come from outside a pipeline: the result of a Python function
//! (`@dp.table` returning a pyarrow Table, a pandas or Polars DataFrame), stored whole as a
//! table of the warehouse before a run, which the pipeline's materialized view then reads
//! by name. Each call replaces every row in one Delta commit (a new version: what the
//! view's refresh compares), creating the table the first time and taking the new columns
//! when they changed. Earlier versions stay readable through time travel until a vacuum.

use crate::error::{Context, EngineError, Result};
use crate::storage::warehouse::Warehouse;
use crate::storage::write::RowChange;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use std::sync::Arc;
use strata_sql::TableName;

/// Replaces the rows of the warehouse table `name` (`t` or `schema.t`; unqualified names
/// are in `default_schema`) with `batches` of `schema`, whose columns are first given the
/// types Delta stores (see [`delta_type`]). Returns the number of rows written.
pub async fn replace_table_rows(
    wh: &Warehouse,
    name: &str,
    default_schema: &str,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    comment: &str,
) -> Result<usize> {
    let table_name = TableName::parse(name, default_schema)
        .map_err(|m| EngineError::plan(format!("staging {name}: {m}")))?;
    let stored = stored_schema(&schema)?;
    let mut rows = Vec::with_capacity(batches.len().max(1));
    for b in &batches {
        rows.push(arrow::cast_batch(b, &stored).map_err(|e| {
            EngineError::plan(format!(
                "staging {table_name}: cannot convert the columns ({}): {e}",
                arrow::describe_fields(&schema)
            ))
        })?);
    }
    if rows.is_empty() {
        // No batch at all: the write still replaces the rows (with none).
        rows.push(RecordBatch::new_empty(stored.clone()));
    }
    let count = rows.iter().map(RecordBatch::num_rows).sum();
    let table = match wh.open_table(&table_name).await? {
        Some(t) => t,
        None => {
            crate::storage::table::create_delta(
                &wh.table_location(&table_name),
                &table_name.name,
                &stored,
                crate::storage::table::table_configuration(&std::collections::BTreeMap::new()),
                Some(comment),
                Vec::new(),
            )
            .await?
        }
    };
    let commit = crate::storage::commit::PendingCommit::default();
    crate::storage::write::write_rows(table, rows, RowChange::Overwrite, &commit)
        .await
        .context(|| format!("staging {table_name}: committing"))?;
    Ok(count)
}

/// `schema` with every column nullable and of the type Delta stores for it.
fn stored_schema(schema: &Schema) -> Result<SchemaRef> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| {
            delta_type(f.data_type())
                .map(|t| Field::new(f.name(), t, true))
                .map_err(|m| EngineError::plan(format!("column {}: {m}", f.name())))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The type a column produced by a Python library is stored with: the layouts Delta has no
/// type for become the nearest one that holds every value exactly. Large and view strings,
/// binaries and lists become plain ones; timestamps of any unit become microseconds (Delta's
/// unit; nanoseconds are truncated), in UTC when they have a time zone; unsigned integers the
/// next wider signed type (`UInt64` a `DECIMAL(20, 0)`); `Float16` a `FLOAT`; `Date64` a
/// `DATE`; dictionary-encoded columns (pandas categoricals) their values. Time of day and
/// durations have no Delta type and are refused.
pub(crate) fn delta_type(t: &DataType) -> std::result::Result<DataType, String> {
    let field = |f: &Field| -> std::result::Result<Arc<Field>, String> {
        Ok(Arc::new(
            f.clone().with_data_type(delta_type(f.data_type())?),
        ))
    };
    Ok(match t {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        DataType::Date64 => DataType::Date32,
        DataType::Timestamp(_, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz.as_ref().map(|_| Arc::from("UTC")))
        }
        DataType::Dictionary(_, values) => delta_type(values)?,
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
            DataType::List(field(f)?)
        }
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| field(f))
                .collect::<std::result::Result<Fields, String>>()?,
        ),
        DataType::Map(f, sorted) => DataType::Map(field(f)?, *sorted),
        DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Duration(_)
        | DataType::Interval(_) => {
            return Err(format!(
                "{} has no Delta type (store it as a string or a number of units)",
                strata_sql::sql_type_name(t)
            ))
        }
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_layouts_become_delta_types() {
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        assert_eq!(
            delta_type(&ns).unwrap(),
            DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        let zoned = DataType::Timestamp(TimeUnit::Nanosecond, Some("Europe/Paris".into()));
        assert_eq!(
            delta_type(&zoned).unwrap(),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(
            delta_type(&DataType::UInt64).unwrap(),
            DataType::Decimal128(20, 0)
        );
        let categorical =
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::LargeUtf8));
        assert_eq!(delta_type(&categorical).unwrap(), DataType::Utf8);
        let list = DataType::LargeList(Arc::new(Field::new("item", DataType::Utf8View, true)));
        assert_eq!(
            delta_type(&list).unwrap(),
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
        );
        assert!(delta_type(&DataType::Time64(TimeUnit::Microsecond))
            .unwrap_err()
            .contains("no Delta type"));
    }
}
