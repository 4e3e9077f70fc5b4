//! Taking a Parquet input file into a streaming table as it is.
//!
//! When a streaming table's query passes a Parquet file's rows through unchanged
//! (`SELECT * FROM STREAM read_files(..., format => 'parquet')`, or its columns in file
//! order) and the file's columns already have the table's names and Delta types, the file's
//! bytes are exactly what a Delta writer would have to produce. Ingestion then copies the
//! file into the table's folder and commits an `add` action for it, instead of decoding and
//! re-encoding every row (a 10M-row delivery: seconds of work). The rows are still read,
//! checked against the expectations and the downstream flows before anything is committed,
//! and handed to those flows; only the write is skipped.
//!
//! The `add` carries the file's row count and, from the Parquet footer, null counts of every
//! top-level column and min/max of integer, date and timestamp columns ([`stats`]; other
//! columns simply have no min/max, which Delta allows: string bounds of other writers may
//! follow the old signed byte order). The table property `strata.ingest.reuseFiles = false`
//! turns this off.

use crate::error::{Context, Result};
use crate::storage::location::Location;
use deltalake::arrow::array::{Array, ArrayRef, AsArray};
use deltalake::arrow::compute;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::{
    DataType, Date32Type, Int16Type, Int32Type, Int64Type, Int8Type, TimeUnit,
    TimestampMicrosecondType,
};
use deltalake::datafusion::logical_expr::{Expr, LogicalPlan};
use deltalake::datafusion::parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use deltalake::datafusion::parquet::arrow::parquet_to_arrow_schema;
use deltalake::datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use deltalake::kernel::Add;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The table property that turns file reuse off.
pub(crate) const REUSE_PROPERTY: &str = "strata.ingest.reuseFiles";

/// True when `plan` (a query over one registered input) returns every input column, in
/// order and unrenamed, and every row: projections of plain columns over an unfiltered,
/// unlimited scan.
pub(crate) fn passes_rows_through(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => {
            let input = p.input.schema();
            p.expr.len() == input.fields().len()
                && p.expr.iter().zip(input.columns()).all(|(e, c)| match e {
                    Expr::Column(col) => col.name == c.name,
                    _ => false,
                })
                && passes_rows_through(&p.input)
        }
        LogicalPlan::SubqueryAlias(a) => passes_rows_through(&a.input),
        LogicalPlan::TableScan(s) => {
            let all = s.source.schema().fields().len();
            s.filters.is_empty()
                && s.fetch.is_none()
                && s.projection
                    .as_ref()
                    .is_none_or(|p| p.iter().copied().eq(0..all))
        }
        _ => false,
    }
}

/// True when `columns` (a query's output) has exactly `table`'s column names and types, in
/// order.
pub(crate) fn same_columns(columns: &Schema, table: &Schema) -> bool {
    columns.fields().len() == table.fields().len()
        && columns
            .fields()
            .iter()
            .zip(table.fields())
            .all(|(c, t)| c.name() == t.name() && c.data_type() == t.data_type())
}

/// A Parquet input file whose columns are the table's, ready to be copied in.
#[derive(Debug)]
pub(crate) struct Reusable {
    source: PathBuf,
    stats: Value,
}

/// Reads the footer of the Parquet file `source`: `Some` when its own columns have exactly
/// the names and types of the table's `schema` (then every Delta reader reads its rows as
/// the table's), `None` when they do not.
pub(crate) fn inspect(source: &Path, schema: &Schema) -> Result<Option<Reusable>> {
    let place = || format!("file {}", source.display());
    let file = std::fs::File::open(source).context(place)?;
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .context(place)?;
    let file_schema = parquet_to_arrow_schema(
        meta.file_metadata().schema_descr(),
        meta.file_metadata().key_value_metadata(),
    )
    .context(place)?;
    if !same_columns(&file_schema, schema) {
        return Ok(None);
    }
    Ok(Some(Reusable {
        source: source.to_path_buf(),
        stats: stats(&meta, &file_schema, Bounds::Written)?,
    }))
}

/// Copies `file` into the table folder `table_dir` under a new name and returns its `add`
/// action; nothing is committed (a crash before the commit leaves an unreferenced file,
/// as any Delta writer does).
pub(crate) async fn copy_in(file: &Reusable, table_dir: &Location) -> Result<Add> {
    let name = format!("part-00000-{}-c000.parquet", uuid::Uuid::new_v4());
    let what = || format!("copying {} into {table_dir}", file.source.display());
    let size = match table_dir {
        Location::Local(dir) => std::fs::copy(&file.source, dir.join(&name)).context(what)?,
        Location::Object(_) => {
            let bytes = std::fs::read(&file.source).context(what)?;
            let size = bytes.len() as u64;
            table_dir.write_file(&name, bytes.into()).await?;
            size
        }
    };
    Ok(new_file_add(name, size, &file.stats))
}

/// The `add` action of a new data file `name` of an unpartitioned table, `size` bytes,
/// with `stats` ([`stats`]), written now.
pub(crate) fn new_file_add(name: String, size: u64, stats: &Value) -> Add {
    Add {
        path: name,
        partition_values: HashMap::new(),
        size: size as i64,
        modification_time: chrono::Utc::now().timestamp_millis(),
        data_change: true,
        stats: Some(stats.to_string()),
        ..Default::default()
    }
}

/// Which columns' bounds a file's footer is trusted for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bounds {
    /// A file another writer wrote: integer, date and timestamp columns.
    Written,
    /// A file strata's own Parquet writer wrote: string columns too (its bounds compare
    /// bytes unsigned, as Delta does).
    Own,
}

/// Delta file statistics from a Parquet footer: `numRecords`, `nullCount` of every
/// top-level column whose row groups all record it, and `minValues`/`maxValues` of the
/// columns `bounds` trusts whose row groups all record them ([`bound`]). strata's own
/// streamed writes (`storage/write.rs`) take theirs from here too.
pub(crate) fn stats(meta: &ParquetMetaData, schema: &Schema, bounds: Bounds) -> Result<Value> {
    let groups = meta.row_groups();
    let rows: i64 = groups.iter().map(|g| g.num_rows()).sum();
    let (mut mins, mut maxes, mut nulls) = (Map::new(), Map::new(), Map::new());
    let parquet = meta.file_metadata().schema_descr();
    for field in schema.fields() {
        if field.data_type().is_nested() {
            continue;
        }
        let what = || format!("statistics of column {}", field.name());
        let conv = StatisticsConverter::try_new(field.name(), schema, parquet).context(what)?;
        let counts = conv.row_group_null_counts(groups).context(what)?;
        if counts.null_count() == 0 {
            nulls.insert(
                field.name().clone(),
                json!(compute::sum(&counts).unwrap_or(0)),
            );
        }
        let lo = conv.row_group_mins(groups).context(what)?;
        let hi = conv.row_group_maxes(groups).context(what)?;
        // A row group without a bound leaves the file without one.
        if lo.null_count() > 0 || hi.null_count() > 0 || lo.is_empty() {
            continue;
        }
        if lo.data_type() == &DataType::Utf8 && bounds != Bounds::Own {
            continue;
        }
        if let (Some(lo), Some(hi)) = (bound(&lo, false), bound(&hi, true)) {
            mins.insert(field.name().clone(), lo);
            maxes.insert(field.name().clone(), hi);
        }
    }
    Ok(json!({
        "numRecords": rows,
        "minValues": mins,
        "maxValues": maxes,
        "nullCount": nulls,
    }))
}

/// The least (or, with `max`, the greatest) of per-row-group bounds, as Delta's JSON stats
/// spell it; `None` for types left without min/max. Timestamps are written in milliseconds,
/// as Delta does, rounded outwards (down for a min, up for a max), so the bound still holds
/// every value; strings are compared as bytes (Delta's order), and a row group's bound the
/// Parquet writer truncated is still a bound.
fn bound(values: &ArrayRef, max: bool) -> Option<Value> {
    macro_rules! int {
        ($t:ty) => {{
            let a = values.as_primitive::<$t>();
            let v = if max {
                compute::max(a)
            } else {
                compute::min(a)
            };
            v.map(|v| json!(v))
        }};
    }
    match values.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::Date32 => {
            let a = values.as_primitive::<Date32Type>();
            let days = if max {
                compute::max(a)
            } else {
                compute::min(a)
            }?;
            let date = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)?
                .checked_add_signed(chrono::Duration::days(days.into()))?;
            Some(json!(date.format("%Y-%m-%d").to_string()))
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let a = values.as_primitive::<TimestampMicrosecondType>();
            let micros = if max {
                compute::max(a)
            } else {
                compute::min(a)
            }?;
            let millis = if max {
                micros.div_euclid(1000) + i64::from(micros.rem_euclid(1000) != 0)
            } else {
                micros.div_euclid(1000)
            };
            let at = chrono::DateTime::from_timestamp_millis(millis)?;
            let zone = if zone.is_some() { "Z" } else { "" };
            Some(json!(format!(
                "{}{zone}",
                at.format("%Y-%m-%dT%H:%M:%S%.3f")
            )))
        }
        DataType::Utf8 => {
            let a = values.as_string::<i32>();
            let v = if max {
                compute::max_string(a)
            } else {
                compute::min_string(a)
            }?;
            Some(json!(v))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{StringArray, TimestampMicrosecondArray};
    use std::sync::Arc;

    #[test]
    fn timestamp_bounds_round_outwards_to_milliseconds() {
        let utc: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![1_500_001, 2_000_000, -1_500])
                .with_timezone("UTC"),
        );
        assert_eq!(bound(&utc, false), Some(json!("1969-12-31T23:59:59.998Z")));
        let later: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![1_500_001, 2_000_000]).with_timezone("UTC"),
        );
        assert_eq!(
            bound(&later, false),
            Some(json!("1970-01-01T00:00:01.500Z"))
        );
        let ntz: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![1_500_001, 2_000_001]));
        assert_eq!(bound(&ntz, true), Some(json!("1970-01-01T00:00:02.001")));
        let exact: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![2_000_000]));
        assert_eq!(bound(&exact, true), Some(json!("1970-01-01T00:00:02.000")));
    }

    #[test]
    fn string_bounds_compare_as_bytes() {
        let s: ArrayRef = Arc::new(StringArray::from(vec!["b", "B", "é", "a"]));
        assert_eq!(bound(&s, false), Some(json!("B")));
        assert_eq!(bound(&s, true), Some(json!("é")));
    }
}
