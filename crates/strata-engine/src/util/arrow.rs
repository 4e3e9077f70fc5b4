//! Small helpers between Arrow, DataFusion and Delta: quoting, casting, schemas, row format.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{Array, ArrayRef, RecordBatch};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use deltalake::arrow::row::{RowConverter, Rows, SortField};
use deltalake::datafusion::scalar::ScalarValue;
use std::cmp::Ordering;

/// The bytes of Arrow memory `batch`'s rows occupy: of a slice, its part of the buffers it
/// shares (`RecordBatch::get_array_memory_size` counts whole buffers: every slice of a batch
/// would count all of it), at least one byte per row.
pub(crate) fn slice_bytes(batch: &RecordBatch) -> usize {
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum();
    bytes.max(batch.num_rows())
}

/// Casts `batch` column by column (by position) to `schema`.
/// `batch` with `schema`'s columns, matched by name ignoring case and cast to their types; a
/// column the batch lacks is NULL, one `schema` lacks is left out.
pub(crate) fn align_by_name(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let bs = batch.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            match bs
                .fields()
                .iter()
                .position(|g| g.name().eq_ignore_ascii_case(f.name()))
            {
                Some(i) => batch.column(i).clone(),
                None => deltalake::arrow::array::new_null_array(f.data_type(), batch.num_rows()),
            }
        })
        .collect();
    cast_columns(columns, schema)
}

pub(crate) fn cast_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    cast_columns(batch.columns().to_vec(), schema)
}

/// `batch` (read from a data file) with `schema`'s columns, matched by name; a column the
/// file lacks (added to the table later) is NULL.
pub(crate) fn in_layout(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let arrow = batch.schema();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match arrow.index_of(f.name()) {
            Ok(p) => batch.column(p).clone(),
            Err(_) => deltalake::arrow::array::new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect();
    cast_columns(columns, schema)
}

/// A batch of `schema` from `columns`, each cast (by position) to its field's type.
pub(crate) fn cast_columns(columns: Vec<ArrayRef>, schema: &SchemaRef) -> Result<RecordBatch> {
    if columns.len() != schema.fields().len() {
        return Err(EngineError::internal(format!(
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
                cast(c.as_ref(), f.data_type()).context(|| {
                    format!(
                        "column {}: cannot convert to {}",
                        f.name(),
                        sql_type_name(f.data_type())
                    )
                })
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

/// The values of a column in a form whose byte or integer order is SQL's `ORDER BY` order.
pub(crate) enum Ordered {
    /// Integers, dates, times and timestamps without NULLs (where they matter): each value
    /// as an order-preserving `u64`, compared without indirection.
    Int(Vec<u64>),
    /// Anything else, in Arrow's row format.
    Rows(Rows),
}

impl Ordered {
    /// `ignore_null` marks rows whose NULLs need not keep their order (truncate events,
    /// which carry no key): they do not rule out the integer form.
    pub(crate) fn of(
        column: &ArrayRef,
        ignore_null: Option<&dyn Fn(usize) -> bool>,
    ) -> Result<Self> {
        if let Some(v) = ordered_u64(column, ignore_null) {
            return Ok(Ordered::Int(v));
        }
        Ok(Ordered::Rows(rows(std::slice::from_ref(column))?))
    }

    /// Several columns compared in turn (one integer-like column keeps the integer form).
    pub(crate) fn of_columns(
        columns: &[ArrayRef],
        ignore_null: Option<&dyn Fn(usize) -> bool>,
    ) -> Result<Self> {
        match columns {
            [one] => Self::of(one, ignore_null),
            _ => Ok(Ordered::Rows(rows(columns)?)),
        }
    }

    pub(crate) fn cmp(&self, a: u32, b: u32) -> Ordering {
        match self {
            Ordered::Int(v) => v[a as usize].cmp(&v[b as usize]),
            Ordered::Rows(r) => r.row(a as usize).cmp(&r.row(b as usize)),
        }
    }

    pub(crate) fn eq(&self, a: u32, b: u32) -> bool {
        match self {
            Ordered::Int(v) => v[a as usize] == v[b as usize],
            Ordered::Rows(r) => r.row(a as usize) == r.row(b as usize),
        }
    }

    /// `rows` split into `parts` lists by value ranges (integers: list `i` holds only values
    /// below those of list `i + 1`, so lists sorted one by one are sorted end to end), else
    /// by a hash of the value; each list in the order given, equal values in the same list.
    /// The ranges come from a sample of these values, so unlike [`Ordered::split`] two
    /// `Ordered` need not split alike.
    pub(crate) fn split_ranges(
        &self,
        rows: impl Iterator<Item = u32>,
        parts: usize,
    ) -> Vec<Vec<u32>> {
        let Ordered::Int(v) = self else {
            return self.split(rows, parts);
        };
        let parts = parts.max(1);
        if parts == 1 || v.is_empty() {
            return vec![rows.collect()];
        }
        let splitters = range_splitters(v, parts);
        let mut out = vec![Vec::new(); parts];
        for i in rows {
            out[splitters.partition_point(|&s| s <= v[i as usize])].push(i);
        }
        out
    }

    /// `rows` split into `parts` lists by a hash of their value, each list in the order
    /// given: equal values land in the same list, also across two `Ordered` of one form.
    pub(crate) fn split(&self, rows: impl Iterator<Item = u32>, parts: usize) -> Vec<Vec<u32>> {
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let parts = parts.max(1);
        let mut out = vec![Vec::new(); parts];
        for i in rows {
            let part = if parts == 1 {
                0
            } else {
                let hash = match self {
                    Ordered::Int(v) => hasher.hash_one(v[i as usize]),
                    Ordered::Rows(r) => hasher.hash_one(r.row(i as usize).data()),
                };
                (hash % parts as u64) as usize
            };
            out[part].push(i);
        }
        out
    }
}

/// `parts - 1` values that split `values` into `parts` ranges of about equal size: the
/// quantiles of an evenly spaced sample. Value `x` belongs to range
/// `splitters.partition_point(|&s| s <= x)`.
pub(crate) fn range_splitters(values: &[u64], parts: usize) -> Vec<u64> {
    let parts = parts.max(1);
    let step = (values.len() / (256 * parts)).max(1);
    let mut sample: Vec<u64> = values.iter().step_by(step).copied().collect();
    sample.sort_unstable();
    if sample.is_empty() {
        return Vec::new();
    }
    (1..parts)
        .map(|p| sample[p * sample.len() / parts])
        .collect()
}

/// The starts and ends of intervals (columns of one type) in forms comparable with each
/// other: integers where the type allows, else one row format. Open ends (NULL) must not be
/// compared.
pub(crate) enum Bounds {
    Int(Vec<u64>, Vec<u64>),
    Rows(Rows, Rows),
}

impl Bounds {
    pub(crate) fn new(starts: &ArrayRef, ends: &ArrayRef) -> Result<Self> {
        if let (Some(s), Some(e)) = (
            ordered_u64(starts, None),
            ordered_u64(ends, Some(&|_| true)),
        ) {
            return Ok(Bounds::Int(s, e));
        }
        let converter = RowConverter::new(vec![SortField::new(starts.data_type().clone())])
            .context(|| "row format".into())?;
        let convert = |c: &ArrayRef| {
            converter
                .convert_columns(std::slice::from_ref(c))
                .context(|| "row format".into())
        };
        Ok(Bounds::Rows(convert(starts)?, convert(ends)?))
    }

    /// The start of row `a` against the start of row `b`.
    pub(crate) fn start_cmp(&self, a: u32, b: u32) -> Ordering {
        match self {
            Bounds::Int(s, _) => s[a as usize].cmp(&s[b as usize]),
            Bounds::Rows(s, _) => s.row(a as usize).cmp(&s.row(b as usize)),
        }
    }

    /// The start of row `a` against the end of row `b`.
    pub(crate) fn start_vs_end(&self, a: u32, b: u32) -> Ordering {
        match self {
            Bounds::Int(s, e) => s[a as usize].cmp(&e[b as usize]),
            Bounds::Rows(s, e) => s.row(a as usize).cmp(&e.row(b as usize)),
        }
    }
}

/// Types whose values [`Ordered::of`] compares as integers (without NULLs): integers,
/// dates, times, timestamps and durations.
pub(crate) fn integer_like(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Timestamp(_, _)
            | DataType::Duration(_)
    )
}

/// Every value of an integer-like `column` as a `u64` in the same order (the sign bit
/// flipped), or `None` for other types and for NULLs outside the rows `ignore_null` accepts.
fn ordered_u64(column: &ArrayRef, ignore_null: Option<&dyn Fn(usize) -> bool>) -> Option<Vec<u64>> {
    use deltalake::arrow::datatypes::DataType as T;
    if !integer_like(column.data_type()) {
        return None;
    }
    if column.null_count() > 0 {
        let ignore = ignore_null?;
        if (0..column.len()).any(|i| column.is_null(i) && !ignore(i)) {
            return None;
        }
    }
    let ints = deltalake::arrow::compute::cast(column, &T::Int64).ok()?;
    let ints = ints
        .as_any()
        .downcast_ref::<deltalake::arrow::array::Int64Array>()?;
    Some(
        ints.values()
            .iter()
            .map(|&v| (v as u64) ^ (1 << 63))
            .collect(),
    )
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

/// The type a value is stored with: view and large layouts become their plain equivalents,
/// which is what Delta stores and what reading a table gives back, and timestamps become
/// Delta's (see [`delta_timestamp`]).
pub(crate) fn storage_type(t: &DataType) -> DataType {
    match t {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::Timestamp(unit, zone) => delta_timestamp(*unit, zone.is_some()),
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

/// The Delta type of a timestamp a query produced, as Spark types it: microseconds, either
/// `TIMESTAMP` (an instant, stored in UTC) or `TIMESTAMP_NTZ` (a wall-clock time).
///
/// DataFusion computes timestamps in nanoseconds (seconds for `from_unixtime`) without a
/// zone, as instants in UTC: `CAST(x AS TIMESTAMP)`, `to_timestamp(x)`,
/// `current_timestamp()`, `TIMESTAMP '...'` and arithmetic on them. Those are Spark's
/// `TIMESTAMP`. A zoneless microsecond timestamp is a `TIMESTAMP_NTZ` value read from a
/// table or file (or computed from one, or cast with `CAST(x AS TIMESTAMP_NTZ)`), and stays
/// one. Values keep their instant; nanoseconds are truncated, as Spark truncates them.
pub(crate) fn delta_timestamp(unit: TimeUnit, zoned: bool) -> DataType {
    let utc = || Some(std::sync::Arc::from("UTC"));
    match (unit, zoned) {
        (TimeUnit::Microsecond, false) => DataType::Timestamp(TimeUnit::Microsecond, None),
        _ => DataType::Timestamp(TimeUnit::Microsecond, utc()),
    }
}

/// `df` with its zoneless timestamps of another unit than microseconds cast to
/// microseconds: a Parquet file's wall-clock times (`TIMESTAMP(NANOS, isAdjustedToUTC =
/// false)`, as pandas writes them) are read as Delta's `TIMESTAMP_NTZ`, as Spark reads
/// them, not as the instants [`delta_timestamp`] makes of computed ones.
pub(crate) fn wall_clocks_in_micros(
    df: deltalake::datafusion::prelude::DataFrame,
) -> deltalake::datafusion::common::Result<deltalake::datafusion::prelude::DataFrame> {
    use deltalake::datafusion::common::Column;
    use deltalake::datafusion::logical_expr::{cast, Expr};
    let wall_clock =
        |t: &DataType| matches!(t, DataType::Timestamp(u, None) if *u != TimeUnit::Microsecond);
    if !df
        .schema()
        .fields()
        .iter()
        .any(|f| wall_clock(f.data_type()))
    {
        return Ok(df);
    }
    let columns = df
        .schema()
        .iter()
        .map(|(qualifier, f)| {
            let column = Expr::Column(Column::from((qualifier, f)));
            if wall_clock(f.data_type()) {
                cast(column, DataType::Timestamp(TimeUnit::Microsecond, None))
                    .alias_qualified(qualifier.cloned(), f.name())
            } else {
                column
            }
        })
        .collect::<Vec<_>>();
    df.select(columns)
}

/// A type as Spark SQL spells it (`INT`, `STRING`, `STRUCT<a: INT>`), for messages: one
/// function for every crate, beside the SQL type names it inverts.
pub(crate) use strata_sql::sql_type_name;

/// `a INT, b STRING` for messages.
pub(crate) fn describe_fields(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), sql_type_name(f.data_type())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of `batches` (all of `width` columns) concatenated, one column per core at a
/// time, letting go of each column's pieces once it is built: the peak is the result plus a
/// column per core, not twice the whole input as with `concat_batches`.
pub(crate) fn concat_columns(batches: Vec<RecordBatch>, width: usize) -> Result<Vec<ArrayRef>> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let mut pieces: Vec<Vec<ArrayRef>> = vec![Vec::with_capacity(batches.len()); width];
    for b in batches {
        for (i, c) in b.columns().iter().enumerate().take(width) {
            pieces[i].push(c.clone());
        }
    }
    // Columns side by side on the cores, each one's pieces let go once it is merged.
    crate::util::threads::per_column(pieces, crate::util::threads::threads_for(rows), |parts| {
        concat_arrays(&parts)
    })
}

/// `parts` (arrays of one type) as one array; a single part as it is.
pub(crate) fn concat_arrays(parts: &[ArrayRef]) -> Result<ArrayRef> {
    match parts {
        [one] => Ok(one.clone()),
        _ => {
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            deltalake::arrow::compute::concat(&refs).context(|| "concatenating rows".into())
        }
    }
}

/// Integer types whose every value is an `i64`.
pub(crate) fn fits_i64(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
    )
}

/// A schema as (de)serialized data: the bytes of an empty Arrow IPC stream of it (its
/// fields, types and metadata exactly), base64 in text formats. For `#[serde(with)]`.
pub(crate) mod schema_serde {
    use base64::Engine as _;
    use deltalake::arrow::datatypes::{Schema, SchemaRef};
    use deltalake::arrow::ipc::reader::StreamReader;
    use deltalake::arrow::ipc::writer::StreamWriter;
    use serde::de::Error as _;
    use serde::ser::Error as _;
    use std::sync::Arc;

    pub(crate) fn serialize<S: serde::Serializer>(
        schema: &SchemaRef,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        let mut writer = StreamWriter::try_new(&mut bytes, schema).map_err(S::Error::custom)?;
        writer.finish().map_err(S::Error::custom)?;
        drop(writer);
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<SchemaRef, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(D::Error::custom)?;
        let reader =
            StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(D::Error::custom)?;
        let schema: Schema = reader.schema().as_ref().clone();
        Ok(Arc::new(schema))
    }
}

/// `batch` as text: the bytes of an Arrow IPC stream of it, base64 (for a result a cluster
/// task sends back as JSON text).
pub(crate) fn batch_to_text(batch: &RecordBatch) -> Result<String> {
    use base64::Engine as _;
    use deltalake::arrow::ipc::writer::StreamWriter;
    let mut bytes = Vec::new();
    let mut writer =
        StreamWriter::try_new(&mut bytes, &batch.schema()).context(|| "encoding rows".into())?;
    writer.write(batch).context(|| "encoding rows".into())?;
    writer.finish().context(|| "encoding rows".into())?;
    drop(writer);
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The batch [`batch_to_text`] wrote (its pieces concatenated).
pub(crate) fn batch_from_text(text: &str) -> Result<RecordBatch> {
    use base64::Engine as _;
    use deltalake::arrow::ipc::reader::StreamReader;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| EngineError::internal(format!("decoding rows: {e}")))?;
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .context(|| "decoding rows".into())?;
    let schema = reader.schema();
    let pieces = reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "decoding rows".into())?;
    deltalake::arrow::compute::concat_batches(&schema, &pieces).context(|| "decoding rows".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::Field;

    #[test]
    fn a_batch_survives_its_text_form() {
        use deltalake::arrow::array::{Int64Array, StringArray};
        let schema = std::sync::Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                std::sync::Arc::new(Int64Array::from(vec![1, 2, 3])),
                std::sync::Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .expect("batch");
        let text = batch_to_text(&batch).expect("encodes");
        assert_eq!(batch_from_text(&text).expect("decodes"), batch);
        assert!(batch_from_text("not base64!").is_err());
    }

    #[test]
    fn computed_timestamps_are_stored_as_delta_types() {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let ntz = DataType::Timestamp(TimeUnit::Microsecond, None);
        // DataFusion's computed instants (nanoseconds or seconds, no zone): TIMESTAMP.
        for unit in [
            TimeUnit::Nanosecond,
            TimeUnit::Millisecond,
            TimeUnit::Second,
        ] {
            assert_eq!(storage_type(&DataType::Timestamp(unit, None)), utc);
        }
        // Any zone: the same instant in UTC.
        let paris = DataType::Timestamp(TimeUnit::Nanosecond, Some("Europe/Paris".into()));
        assert_eq!(storage_type(&paris), utc);
        // A wall-clock time in microseconds stays one.
        assert_eq!(storage_type(&ntz), ntz);
        let nested = DataType::Struct(
            vec![Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                true,
            )]
            .into(),
        );
        assert_eq!(
            storage_type(&nested),
            DataType::Struct(vec![Field::new("at", utc, true)].into())
        );
    }

    #[test]
    fn schemas_round_trip_through_serde_with_their_metadata() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Holder {
            #[serde(with = "super::schema_serde")]
            schema: SchemaRef,
        }
        use deltalake::arrow::datatypes::Field;
        let field = Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )
        .with_metadata([("comment".to_string(), "when".to_string())].into());
        let schema = std::sync::Arc::new(Schema::new(vec![
            field,
            Field::new("id", DataType::Int64, true),
        ]));
        let text = serde_json::to_string(&Holder {
            schema: schema.clone(),
        })
        .unwrap();
        let back: Holder = serde_json::from_str(&text).unwrap();
        assert_eq!(back.schema, schema);
    }
}
