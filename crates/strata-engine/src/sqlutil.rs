//! Small helpers between Arrow, DataFusion and Delta: quoting, casting, schemas, row format.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{Array, ArrayRef, RecordBatch};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::arrow::row::{RowConverter, Rows, SortField};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;

/// `name` as a double-quoted SQL identifier (DataFusion's default dialect).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `s` as a single-quoted SQL string literal.
pub(crate) fn quote_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Casts `batch` column by column (by position) to `schema`.
pub(crate) fn cast_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    cast_columns(batch.columns().to_vec(), schema)
}

/// A batch of `schema` from `columns`, each cast (by position) to its field's type.
pub(crate) fn cast_columns(columns: Vec<ArrayRef>, schema: &SchemaRef) -> Result<RecordBatch> {
    if columns.len() != schema.fields().len() {
        return Err(EngineError::Internal(format!(
            "batch has {} columns, expected {}",
            columns.len(),
            schema.fields().len()
        )));
    }
    let cols = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                cast(c.as_ref(), f.data_type())
                    .context(|| format!("column {}: cannot convert to {}", f.name(), f.data_type()))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), cols).context(|| "casting batch".into())
}

/// The non-NULL values of the first column of `batches`, as scalars.
pub(crate) fn scalars(batches: &[RecordBatch]) -> Result<Vec<ScalarValue>> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            if b.column(0).is_valid(i) {
                out.push(
                    ScalarValue::try_from_array(b.column(0), i)
                        .context(|| "reading values".into())?,
                );
            }
        }
    }
    Ok(out)
}

/// Arrow's row format of `columns`: ordered like SQL `ORDER BY`, equal as bytes.
pub(crate) fn rows(columns: &[ArrayRef]) -> Result<Rows> {
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).context(|| "row format".into())?;
    converter
        .convert_columns(columns)
        .context(|| "row format".into())
}

/// Type equality that ignores nullability of nested fields and the spelling of time zones.
pub(crate) fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::Timestamp(u1, z1), DataType::Timestamp(u2, z2)) => {
            u1 == u2 && z1.is_some() == z2.is_some()
        }
        (DataType::Struct(f1), DataType::Struct(f2)) => {
            f1.len() == f2.len()
                && f1
                    .iter()
                    .zip(f2.iter())
                    .all(|(x, y)| x.name() == y.name() && same_type(x.data_type(), y.data_type()))
        }
        _ => a == b,
    }
}

/// The type a value is stored with: view layouts become their plain equivalents, which is
/// what Delta stores and what reading a table gives back.
pub(crate) fn storage_type(t: &DataType) -> DataType {
    match t {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| {
                    std::sync::Arc::new(
                        f.as_ref()
                            .clone()
                            .with_data_type(storage_type(f.data_type())),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The Arrow schema of a Delta table.
pub(crate) fn table_schema(table: &DeltaTable) -> Result<SchemaRef> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .snapshot()
        .arrow_schema())
}

/// `a INT, b STRING` for messages.
pub(crate) fn describe_fields(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The arguments of `factor` if it calls the table function `function` (any case):
/// `Some(None)` when an argument is named (`f(x => 1)`), which strata's table functions do
/// not take; `None` for any other factor.
pub(crate) fn table_function_args<'a>(
    factor: &'a deltalake::datafusion::sql::sqlparser::ast::TableFactor,
    function: &str,
) -> Option<Option<Vec<&'a deltalake::datafusion::sql::sqlparser::ast::Expr>>> {
    use deltalake::datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, TableFactor};
    let TableFactor::Table {
        name,
        args: Some(args),
        ..
    } = factor
    else {
        return None;
    };
    if !name.to_string().eq_ignore_ascii_case(function) {
        return None;
    }
    Some(
        args.args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
    )
}

/// The columns of `batches` (all of `width` columns) concatenated, one column at a time,
/// letting go of each column's pieces once it is built: the peak is the result plus one
/// column, not twice the whole input as with `concat_batches`.
pub(crate) fn concat_columns(batches: Vec<RecordBatch>, width: usize) -> Result<Vec<ArrayRef>> {
    let mut pieces: Vec<Vec<ArrayRef>> = vec![Vec::with_capacity(batches.len()); width];
    for b in batches {
        for (i, c) in b.columns().iter().enumerate().take(width) {
            pieces[i].push(c.clone());
        }
    }
    let mut out = Vec::with_capacity(width);
    for column in pieces.iter_mut() {
        let parts = std::mem::take(column);
        let merged = match parts.as_slice() {
            [one] => one.clone(),
            _ => {
                let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                deltalake::arrow::compute::concat(&refs).context(|| "concatenating rows".into())?
            }
        };
        drop(parts);
        out.push(merged);
    }
    Ok(out)
}

/// The statements of `sql` if it mentions `function` (any case), for a rewrite of that table
/// function; `None` when it cannot hold a call.
pub(crate) fn statements_calling(
    sql: &str,
    function: &str,
) -> Result<Option<Vec<deltalake::datafusion::sql::sqlparser::ast::Statement>>> {
    use deltalake::datafusion::sql::sqlparser::{dialect::GenericDialect, parser::Parser};
    if !sql.to_ascii_lowercase().contains(function) {
        return Ok(None);
    }
    Parser::parse_sql(&GenericDialect {}, sql)
        .map(Some)
        .map_err(|e| EngineError::Plan(format!("query: {e}")))
}

/// Rewritten statements back to one SQL text.
pub(crate) fn statements_sql(
    statements: &[deltalake::datafusion::sql::sqlparser::ast::Statement],
) -> String {
    statements
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
