//! The Arrow side: column kinds every source maps into (scalars, and the nested STRUCT, ARRAY
//! and MAP of Debezium's payloads), column builders, and the buffer that collects change rows
//! per table (with schema widening).

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder,
    Float64Builder, Int16Builder, Int32Builder, Int64Builder, Int8Builder, ListBuilder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{
    ArrayRef, BinaryArray, ListArray, MapArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};

/// The Arrow (and Delta) type of a source column. Delta has no unsigned integers, no time of
/// day and no intervals; every kind here has a Delta type. Database columns are scalars;
/// Debezium payloads also hold the nested kinds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ColumnKind {
    /// BOOLEAN.
    Boolean,
    /// BYTE (TINYINT).
    Int8,
    /// SHORT (SMALLINT).
    Int16,
    /// INT.
    Int32,
    /// LONG (BIGINT).
    Int64,
    /// FLOAT.
    Float32,
    /// DOUBLE.
    Float64,
    /// DECIMAL(precision, scale), precision 1..=38.
    Decimal {
        /// Total digits.
        precision: u8,
        /// Digits after the point (0..=precision).
        scale: i8,
    },
    /// STRING.
    Utf8,
    /// BINARY.
    Binary,
    /// DATE.
    Date,
    /// TIMESTAMP_NTZ: `Timestamp(Microsecond, None)`.
    Timestamp,
    /// TIMESTAMP (an instant): `Timestamp(Microsecond, "UTC")`.
    TimestampUtc,
    /// STRUCT<name: T, ...>, its fields in order.
    Struct(Vec<StructField>),
    /// ARRAY<T>: a list whose elements may be NULL (Arrow's element field is `element`).
    Array(Box<ColumnKind>),
    /// MAP<K, V>: keys never NULL, values may be (Arrow's entries are `key_value` of `key`
    /// and `value`, as Delta names them).
    Map(Box<ColumnKind>, Box<ColumnKind>),
}

/// One field of a [`ColumnKind::Struct`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StructField {
    /// Field name.
    pub name: String,
    /// Its type.
    pub kind: ColumnKind,
    /// False for a field declared NOT NULL (a value without it is refused).
    pub nullable: bool,
}

/// The Arrow field of an ARRAY's elements.
fn element_field(t: DataType) -> FieldRef {
    Arc::new(Field::new("element", t, true))
}

/// The Arrow entries field of a MAP.
fn map_entries(key: DataType, value: DataType) -> FieldRef {
    Arc::new(Field::new(
        "key_value",
        DataType::Struct(Fields::from(vec![
            Field::new("key", key, false),
            Field::new("value", value, true),
        ])),
        false,
    ))
}

impl ColumnKind {
    /// The Arrow type.
    pub fn data_type(&self) -> DataType {
        match self {
            ColumnKind::Boolean => DataType::Boolean,
            ColumnKind::Int8 => DataType::Int8,
            ColumnKind::Int16 => DataType::Int16,
            ColumnKind::Int32 => DataType::Int32,
            ColumnKind::Int64 => DataType::Int64,
            ColumnKind::Float32 => DataType::Float32,
            ColumnKind::Float64 => DataType::Float64,
            ColumnKind::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            ColumnKind::Utf8 => DataType::Utf8,
            ColumnKind::Binary => DataType::Binary,
            ColumnKind::Date => DataType::Date32,
            ColumnKind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnKind::TimestampUtc => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
            ColumnKind::Struct(fields) => DataType::Struct(
                fields
                    .iter()
                    .map(|f| Field::new(&f.name, f.kind.data_type(), f.nullable))
                    .collect(),
            ),
            ColumnKind::Array(element) => DataType::List(element_field(element.data_type())),
            ColumnKind::Map(key, value) => {
                DataType::Map(map_entries(key.data_type(), value.data_type()), false)
            }
        }
    }

    /// The type as SQL spells it (`INT`, `STRUCT<city: STRING>`), for messages.
    pub fn sql_name(&self) -> String {
        strata_sql::sql_type_name(&self.data_type())
    }

    /// The kind of an Arrow type, if it is one strata produces.
    pub fn from_data_type(dt: &DataType) -> Option<ColumnKind> {
        Some(match dt {
            DataType::Boolean => ColumnKind::Boolean,
            DataType::Int8 => ColumnKind::Int8,
            DataType::Int16 => ColumnKind::Int16,
            DataType::Int32 => ColumnKind::Int32,
            DataType::Int64 => ColumnKind::Int64,
            DataType::Float32 => ColumnKind::Float32,
            DataType::Float64 => ColumnKind::Float64,
            DataType::Decimal128(p, s) => ColumnKind::Decimal {
                precision: *p,
                scale: *s,
            },
            DataType::Utf8 => ColumnKind::Utf8,
            DataType::Binary => ColumnKind::Binary,
            DataType::Date32 => ColumnKind::Date,
            DataType::Timestamp(TimeUnit::Microsecond, None) => ColumnKind::Timestamp,
            DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => ColumnKind::TimestampUtc,
            DataType::Struct(fields) => ColumnKind::Struct(
                fields
                    .iter()
                    .map(|f| {
                        Some(StructField {
                            name: f.name().clone(),
                            kind: ColumnKind::from_data_type(f.data_type())?,
                            nullable: f.is_nullable(),
                        })
                    })
                    .collect::<Option<_>>()?,
            ),
            DataType::List(f) => {
                ColumnKind::Array(Box::new(ColumnKind::from_data_type(f.data_type())?))
            }
            DataType::Map(entries, false) => match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => ColumnKind::Map(
                    Box::new(ColumnKind::from_data_type(kv[0].data_type())?),
                    Box::new(ColumnKind::from_data_type(kv[1].data_type())?),
                ),
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// One column of a source table or query, as strata reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceColumn {
    /// Column name.
    pub name: String,
    /// The source's type, as the source spells it (`numeric(12,2)`, `bigint unsigned`).
    pub source_type: String,
    /// The Arrow type it is read as.
    pub kind: ColumnKind,
    /// False only when the source says the column cannot be NULL (as far as strata can tell);
    /// the Arrow fields strata produces are always nullable.
    pub not_null: bool,
    /// Nearly all its values are distinct, as far as the source tells: a single-column
    /// unique index, or statistics counting distinct values in more than half the rows
    /// (PostgreSQL tables; `false` when unknown).
    pub distinct: bool,
}

/// The columns of a table or query, in order (excluded columns left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSchema {
    /// `schema.table`, or `query` for a query.
    pub object: String,
    /// The columns read.
    pub columns: Vec<SourceColumn>,
}

impl SourceSchema {
    /// The Arrow schema of the batches (all fields nullable).
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| Field::new(&c.name, c.kind.data_type(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// The index of a column by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// A growable Arrow column of one [`ColumnKind`].
#[allow(missing_docs)]
pub(crate) enum ColBuilder {
    Bool(BooleanBuilder),
    I8(Int8Builder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Dec(Decimal128Builder, u8, i8),
    /// Text, kept as bytes: checked as UTF-8 all at once when the column is finished
    /// ([`ColBuilder::finish`]), which costs a fraction of a check per value.
    Str(BinaryBuilder),
    Bin(BinaryBuilder),
    Date(Date32Builder),
    Ts(TimestampMicrosecondBuilder),
    TsUtc(TimestampMicrosecondBuilder),
    Struct(StructCol),
    Array(ArrayCol),
    Map(MapCol),
}

/// A STRUCT column being built: a builder per field, and which rows are NULL. A value is
/// one value appended to every field, then [`StructCol::end_value`].
pub(crate) struct StructCol {
    pub fields: Vec<(StructField, ColBuilder)>,
    nulls: NullBufferBuilder,
}

impl StructCol {
    /// Ends a (non-NULL) value whose fields were appended.
    pub fn end_value(&mut self) {
        self.nulls.append_non_null();
    }
}

/// An ARRAY column being built: a value is its elements appended to `elements`, then
/// [`ArrayCol::end_value`].
pub(crate) struct ArrayCol {
    pub elements: Box<ColBuilder>,
    rows: ListRows,
}

impl ArrayCol {
    /// Ends a (non-NULL) value whose elements were appended.
    pub fn end_value(&mut self) -> Result<(), String> {
        self.rows.end_value(self.elements.len())
    }
}

/// A MAP column being built: a value is its entries appended to `keys` and `values` (one
/// each, keys never NULL), then [`MapCol::end_value`].
pub(crate) struct MapCol {
    pub keys: Box<ColBuilder>,
    pub values: Box<ColBuilder>,
    rows: ListRows,
}

impl MapCol {
    /// Ends a (non-NULL) value whose entries were appended.
    pub fn end_value(&mut self) -> Result<(), String> {
        self.rows.end_value(self.keys.len())
    }
}

/// The rows of a list-shaped column (ARRAY, MAP): where each ends among the children, and
/// which are NULL.
struct ListRows {
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
}

impl ListRows {
    fn new(capacity: usize) -> ListRows {
        ListRows {
            offsets: vec![0],
            nulls: NullBufferBuilder::new(capacity),
        }
    }

    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Ends a value at `children` children (Arrow's lists count them in 32 bits).
    fn end_value(&mut self, children: usize) -> Result<(), String> {
        let end = i32::try_from(children).map_err(|_| {
            "more than 2^31 nested values in one batch; read smaller batches".to_string()
        })?;
        self.offsets.push(end);
        self.nulls.append_non_null();
        Ok(())
    }

    /// A NULL value: no children.
    fn append_null(&mut self) {
        let end = self.offsets.last().copied().unwrap_or(0);
        self.offsets.push(end);
        self.nulls.append_null();
    }

    /// The offsets and NULLs so far; starts again empty.
    fn finish(&mut self) -> (OffsetBuffer<i32>, Option<arrow_buffer::NullBuffer>) {
        let done = std::mem::replace(&mut self.offsets, vec![0]);
        // Starts at 0 and never decreases: children only grow.
        (
            OffsetBuffer::new(ScalarBuffer::from(done)),
            self.nulls.finish(),
        )
    }
}

impl ColBuilder {
    pub fn new(kind: &ColumnKind, capacity: usize) -> ColBuilder {
        Self::with_value_bytes(kind, capacity, capacity.min(1 << 16) * 8)
    }

    /// A builder for `capacity` rows whose text or binary values take about `value_bytes`
    /// (the size of the previous batch's: no buffer regrown and copied on the way).
    pub fn with_value_bytes(kind: &ColumnKind, capacity: usize, value_bytes: usize) -> ColBuilder {
        let cap = capacity.min(1 << 16);
        match kind {
            ColumnKind::Boolean => ColBuilder::Bool(BooleanBuilder::with_capacity(cap)),
            ColumnKind::Int8 => ColBuilder::I8(Int8Builder::with_capacity(cap)),
            ColumnKind::Int16 => ColBuilder::I16(Int16Builder::with_capacity(cap)),
            ColumnKind::Int32 => ColBuilder::I32(Int32Builder::with_capacity(cap)),
            ColumnKind::Int64 => ColBuilder::I64(Int64Builder::with_capacity(cap)),
            ColumnKind::Float32 => ColBuilder::F32(Float32Builder::with_capacity(cap)),
            ColumnKind::Float64 => ColBuilder::F64(Float64Builder::with_capacity(cap)),
            ColumnKind::Decimal { precision, scale } => {
                ColBuilder::Dec(Decimal128Builder::with_capacity(cap), *precision, *scale)
            }
            ColumnKind::Utf8 => ColBuilder::Str(BinaryBuilder::with_capacity(cap, value_bytes)),
            ColumnKind::Binary => ColBuilder::Bin(BinaryBuilder::with_capacity(cap, value_bytes)),
            ColumnKind::Date => ColBuilder::Date(Date32Builder::with_capacity(cap)),
            ColumnKind::Timestamp => {
                ColBuilder::Ts(TimestampMicrosecondBuilder::with_capacity(cap))
            }
            ColumnKind::TimestampUtc => {
                ColBuilder::TsUtc(TimestampMicrosecondBuilder::with_capacity(cap))
            }
            ColumnKind::Struct(fields) => ColBuilder::Struct(StructCol {
                fields: fields
                    .iter()
                    .map(|f| (f.clone(), ColBuilder::new(&f.kind, cap)))
                    .collect(),
                nulls: NullBufferBuilder::new(cap),
            }),
            ColumnKind::Array(element) => ColBuilder::Array(ArrayCol {
                elements: Box::new(ColBuilder::new(element, cap)),
                rows: ListRows::new(cap),
            }),
            ColumnKind::Map(key, value) => ColBuilder::Map(MapCol {
                keys: Box::new(ColBuilder::new(key, cap)),
                values: Box::new(ColBuilder::new(value, cap)),
                rows: ListRows::new(cap),
            }),
        }
    }

    /// The bytes of the text or binary values appended so far (0 for other kinds).
    pub fn value_bytes(&self) -> usize {
        match self {
            ColBuilder::Str(b) => b.values_slice().len(),
            ColBuilder::Bin(b) => b.values_slice().len(),
            _ => 0,
        }
    }

    pub fn append_null(&mut self) {
        match self {
            ColBuilder::Bool(b) => b.append_null(),
            ColBuilder::I8(b) => b.append_null(),
            ColBuilder::I16(b) => b.append_null(),
            ColBuilder::I32(b) => b.append_null(),
            ColBuilder::I64(b) => b.append_null(),
            ColBuilder::F32(b) => b.append_null(),
            ColBuilder::F64(b) => b.append_null(),
            ColBuilder::Dec(b, ..) => b.append_null(),
            ColBuilder::Str(b) => b.append_null(),
            ColBuilder::Bin(b) => b.append_null(),
            ColBuilder::Date(b) => b.append_null(),
            ColBuilder::Ts(b) | ColBuilder::TsUtc(b) => b.append_null(),
            // A NULL struct still has a (NULL) value in each field.
            ColBuilder::Struct(s) => {
                for (_, f) in &mut s.fields {
                    f.append_null();
                }
                s.nulls.append_null();
            }
            ColBuilder::Array(a) => a.rows.append_null(),
            ColBuilder::Map(m) => m.rows.append_null(),
        }
    }

    pub fn append_nulls(&mut self, n: usize) {
        for _ in 0..n {
            self.append_null();
        }
    }

    pub fn append_value(&mut self, v: &Cell) -> Result<(), String> {
        match (self, v) {
            (b, Cell::Null) => b.append_null(),
            (ColBuilder::Bool(b), Cell::Bool(x)) => b.append_value(*x),
            (ColBuilder::I8(b), Cell::Int(x)) => b.append_value(narrow(*x, "TINYINT")?),
            (ColBuilder::I16(b), Cell::Int(x)) => b.append_value(narrow(*x, "SMALLINT")?),
            (ColBuilder::I32(b), Cell::Int(x)) => b.append_value(narrow(*x, "INT")?),
            (ColBuilder::I64(b), Cell::Int(x)) => b.append_value(narrow(*x, "BIGINT")?),
            (ColBuilder::F32(b), Cell::Float(x)) => b.append_value(*x as f32),
            (ColBuilder::F64(b), Cell::Float(x)) => b.append_value(*x),
            (ColBuilder::Dec(b, p, _), Cell::Decimal(x)) => {
                if !fits_precision(*x, *p) {
                    return Err(format!(
                        "value with {} digits exceeds DECIMAL precision {p}",
                        digits(*x)
                    ));
                }
                b.append_value(*x)
            }
            (ColBuilder::Str(b), Cell::Str(x)) => b.append_value(x.as_bytes()),
            (ColBuilder::Bin(b), Cell::Bytes(x)) => b.append_value(x),
            (ColBuilder::Date(b), Cell::Date(x)) => b.append_value(*x),
            (ColBuilder::Ts(b), Cell::Micros(x)) | (ColBuilder::TsUtc(b), Cell::Micros(x)) => {
                b.append_value(*x)
            }
            (_, other) => return Err(format!("internal: value {other:?} does not fit the column")),
        }
        Ok(())
    }

    /// The column's values so far as an array; the builder is empty afterwards. Fails only
    /// for text that is not UTF-8 (naming the first such row of the column).
    pub fn finish(&mut self) -> Result<ArrayRef, String> {
        Ok(match self {
            ColBuilder::Bool(b) => Arc::new(b.finish()),
            ColBuilder::I8(b) => Arc::new(b.finish()),
            ColBuilder::I16(b) => Arc::new(b.finish()),
            ColBuilder::I32(b) => Arc::new(b.finish()),
            ColBuilder::I64(b) => Arc::new(b.finish()),
            ColBuilder::F32(b) => Arc::new(b.finish()),
            ColBuilder::F64(b) => Arc::new(b.finish()),
            ColBuilder::Dec(b, p, s) => {
                // Precision and scale were checked when the kind was made (1..=38).
                let arr = b.finish();
                Arc::new(arr.clone().with_precision_and_scale(*p, *s).unwrap_or(arr))
            }
            ColBuilder::Str(b) => Arc::new(utf8_array(b.finish())?),
            ColBuilder::Bin(b) => Arc::new(b.finish()),
            ColBuilder::Date(b) => Arc::new(b.finish()),
            ColBuilder::Ts(b) => Arc::new(b.finish()),
            ColBuilder::TsUtc(b) => Arc::new(b.finish().with_timezone("UTC")),
            ColBuilder::Struct(s) => {
                let rows = s.nulls.len();
                let nulls = s.nulls.finish();
                let children = s
                    .fields
                    .iter_mut()
                    .map(|(_, b)| b.finish())
                    .collect::<Result<Vec<_>, _>>()?;
                if children.is_empty() {
                    Arc::new(StructArray::new_empty_fields(rows, nulls))
                } else {
                    let fields: Fields = s
                        .fields
                        .iter()
                        .zip(&children)
                        .map(|((f, _), c)| Field::new(&f.name, c.data_type().clone(), f.nullable))
                        .collect();
                    Arc::new(
                        StructArray::try_new(fields, children, nulls)
                            .map_err(|e| format!("internal: {e}"))?,
                    )
                }
            }
            ColBuilder::Array(a) => {
                let elements = a.elements.finish()?;
                let (offsets, nulls) = a.rows.finish();
                Arc::new(
                    ListArray::try_new(
                        element_field(elements.data_type().clone()),
                        offsets,
                        elements,
                        nulls,
                    )
                    .map_err(|e| format!("internal: {e}"))?,
                )
            }
            ColBuilder::Map(m) => {
                let keys = m.keys.finish()?;
                let values = m.values.finish()?;
                let entries_field =
                    map_entries(keys.data_type().clone(), values.data_type().clone());
                let DataType::Struct(kv) = entries_field.data_type() else {
                    return Err("internal: map entries are not a struct".into());
                };
                let entries = StructArray::try_new(kv.clone(), vec![keys, values], None)
                    .map_err(|e| format!("internal: {e}"))?;
                let (offsets, nulls) = m.rows.finish();
                Arc::new(
                    MapArray::try_new(entries_field, offsets, entries, nulls, false)
                        .map_err(|e| format!("internal: {e}"))?,
                )
            }
        })
    }

    pub fn len(&self) -> usize {
        use arrow_array::builder::ArrayBuilder;
        match self {
            ColBuilder::Bool(b) => b.len(),
            ColBuilder::I8(b) => b.len(),
            ColBuilder::I16(b) => b.len(),
            ColBuilder::I32(b) => b.len(),
            ColBuilder::I64(b) => b.len(),
            ColBuilder::F32(b) => b.len(),
            ColBuilder::F64(b) => b.len(),
            ColBuilder::Dec(b, ..) => b.len(),
            ColBuilder::Str(b) => b.len(),
            ColBuilder::Bin(b) => b.len(),
            ColBuilder::Date(b) => b.len(),
            ColBuilder::Ts(b) | ColBuilder::TsUtc(b) => b.len(),
            ColBuilder::Struct(s) => s.nulls.len(),
            ColBuilder::Array(a) => a.rows.len(),
            ColBuilder::Map(m) => m.rows.len(),
        }
    }
}

/// `values` as text: one UTF-8 check of all the bytes (no copy), or an error naming the
/// first value that is not UTF-8 (its row in the batch, counting from 1).
fn utf8_array(values: BinaryArray) -> Result<StringArray, String> {
    match StringArray::try_from_binary(values.clone()) {
        Ok(text) => Ok(text),
        Err(_) => {
            let (row, e) = values
                .iter()
                .enumerate()
                .find_map(|(i, v)| Some((i, std::str::from_utf8(v?).err()?)))
                .map_or((0, String::new()), |(i, e)| (i + 1, format!(" ({e})")));
            Err(format!(
                "the value in row {row} of the batch is not valid UTF-8{e}"
            ))
        }
    }
}

fn narrow<T: TryFrom<i64>>(x: i64, what: &str) -> Result<T, String> {
    T::try_from(x).map_err(|_| format!("value {x} is out of range for {what}"))
}

/// Number of decimal digits of |x| (0 has 1).
pub(crate) fn digits(x: i128) -> u32 {
    let mut v = x.unsigned_abs();
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// |x| < 10^precision (one comparison; precision above 38 always fits an i128).
pub(crate) fn fits_precision(x: i128, precision: u8) -> bool {
    match POW10.get(precision as usize) {
        Some(&bound) => x.unsigned_abs() < bound as u128,
        None => true,
    }
}

/// `10^i` for every `i` an i128 holds (0 to 38): looked up per value on hot paths, where
/// `checked_pow` multiplied them out every time.
pub(crate) const POW10: [i128; 39] = {
    let mut t = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// One value on its way into a [`ColBuilder`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Unscaled value at the column's scale.
    Decimal(i128),
    Str(String),
    Bytes(Vec<u8>),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since 1970-01-01 (UTC for TimestampUtc).
    Micros(i64),
}

/// The metadata columns every change row carries, after the table's columns.
pub mod meta {
    /// `insert`, `update`, `delete`, `truncate` or `snapshot` (Utf8, never NULL).
    pub const CHANGE_TYPE: &str = "_change_type";
    /// The transaction's commit LSN as BIGINT (PostgreSQL); for Debezium MySQL the binlog
    /// position `file_index * 2^32 + pos`.
    pub const COMMIT_LSN: &str = "_commit_lsn";
    /// Position of the change inside its transaction, 0.. (BIGINT).
    pub const CHANGE_SEQ: &str = "_change_seq";
    /// Commit time, `Timestamp(Microsecond, "UTC")`.
    pub const COMMIT_TIMESTAMP: &str = "_commit_timestamp";
    /// `List<Utf8>`: the columns whose value did not change and was not sent (unchanged
    /// TOASTed values); those columns are NULL in the row. NULL when there are none.
    pub const UNCHANGED_COLS: &str = "_unchanged_cols";

    /// `_change_type` values.
    pub const INSERT: &str = "insert";
    /// `_change_type` of an update (the row holds the new values).
    pub const UPDATE: &str = "update";
    /// `_change_type` of a delete (the row holds the old key, or the whole old row with
    /// REPLICA IDENTITY FULL).
    pub const DELETE: &str = "delete";
    /// `_change_type` of a TRUNCATE: one row per table, all table columns NULL.
    pub const TRUNCATE: &str = "truncate";
    /// `_change_type` of a row copied by the initial snapshot (and Debezium `op: r`); apply it
    /// like an insert (an upsert by key).
    pub const SNAPSHOT: &str = "snapshot";
}

/// The Arrow fields of the metadata columns, in order.
pub fn change_meta_fields() -> Vec<Field> {
    vec![
        Field::new(meta::CHANGE_TYPE, DataType::Utf8, false),
        Field::new(meta::COMMIT_LSN, DataType::Int64, false),
        Field::new(meta::CHANGE_SEQ, DataType::Int64, false),
        Field::new(
            meta::COMMIT_TIMESTAMP,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(
            meta::UNCHANGED_COLS,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ]
}

/// Rows of one table's changes: the table's columns plus the metadata columns. Columns can be
/// added while rows are collected (earlier rows get NULL).
pub(crate) struct ChangeBuffer {
    pub columns: Vec<(String, ColumnKind, ColBuilder)>,
    change_type: StringBuilder,
    commit_lsn: Int64Builder,
    change_seq: Int64Builder,
    commit_ts: TimestampMicrosecondBuilder,
    unchanged: ListBuilder<StringBuilder>,
    pub rows: usize,
}

impl ChangeBuffer {
    pub fn new(columns: &[(String, ColumnKind)], capacity: usize) -> Self {
        ChangeBuffer {
            columns: columns
                .iter()
                .map(|(n, k)| (n.clone(), k.clone(), ColBuilder::new(k, capacity)))
                .collect(),
            change_type: StringBuilder::new(),
            commit_lsn: Int64Builder::new(),
            change_seq: Int64Builder::new(),
            commit_ts: TimestampMicrosecondBuilder::new(),
            unchanged: ListBuilder::new(StringBuilder::new()),
            rows: 0,
        }
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|(n, ..)| n == name)
    }

    /// Add a column at the end; rows already collected get NULL.
    pub fn add_column(&mut self, name: &str, kind: ColumnKind) -> usize {
        let mut b = ColBuilder::new(&kind, self.rows.max(16));
        b.append_nulls(self.rows);
        self.columns.push((name.to_string(), kind, b));
        self.columns.len() - 1
    }

    /// Finish a row: every table column must have received one value (or gets NULL here).
    pub fn end_row(
        &mut self,
        change_type: &str,
        commit_lsn: i64,
        seq: i64,
        commit_ts: Option<i64>,
        unchanged: &[String],
    ) {
        self.rows += 1;
        for (_, _, b) in &mut self.columns {
            while b.len() < self.rows {
                b.append_null();
            }
        }
        self.change_type.append_value(change_type);
        self.commit_lsn.append_value(commit_lsn);
        self.change_seq.append_value(seq);
        self.commit_ts.append_option(commit_ts);
        if unchanged.is_empty() {
            self.unchanged.append_null();
        } else {
            for c in unchanged {
                self.unchanged.values().append_value(c);
            }
            self.unchanged.append(true);
        }
    }

    pub fn schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .columns
            .iter()
            .map(|(n, k, _)| Field::new(n, k.data_type(), true))
            .collect();
        fields.extend(change_meta_fields());
        Arc::new(Schema::new(fields))
    }

    /// The collected rows as a batch; the buffer is empty afterwards (columns kept).
    pub fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let schema = self.schema();
        let mut arrays: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|(name, _, b)| {
                b.finish().map_err(|e| {
                    arrow_schema::ArrowError::InvalidArgumentError(format!("column {name}: {e}"))
                })
            })
            .collect::<Result<_, _>>()?;
        arrays.push(Arc::new(self.change_type.finish()));
        arrays.push(Arc::new(self.commit_lsn.finish()));
        arrays.push(Arc::new(self.change_seq.finish()));
        arrays.push(Arc::new(self.commit_ts.finish().with_timezone("UTC")));
        arrays.push(Arc::new(self.unchanged.finish()));
        self.rows = 0;
        RecordBatch::try_new(schema, arrays)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    #[test]
    fn widening_buffer() {
        let mut b = ChangeBuffer::new(&[("a".into(), ColumnKind::Int64)], 4);
        let ColBuilder::I64(a) = &mut b.columns[0].2 else {
            panic!()
        };
        a.append_value(1);
        b.end_row("insert", 10, 0, Some(5), &[]);
        let c = b.add_column("c", ColumnKind::Utf8);
        b.columns[0].2.append_value(&Cell::Int(2)).unwrap();
        b.columns[c].2.append_value(&Cell::Str("x".into())).unwrap();
        b.end_row("update", 11, 0, None, &["z".to_string()]);
        let batch = b.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema().field(1).name(), "c");
        assert!(batch.column(1).is_null(0));
        assert_eq!(batch.schema().fields().len(), 2 + 5);
        assert!(batch.column(6).is_null(0));
        assert!(!batch.column(6).is_null(1));
    }

    #[test]
    fn text_is_checked_as_utf8_when_finished() {
        let mut b = ColBuilder::new(&ColumnKind::Utf8, 4);
        b.append_value(&Cell::Str("añ".into())).unwrap();
        b.append_null();
        let ColBuilder::Str(raw) = &mut b else {
            panic!()
        };
        raw.append_value(b"ok");
        let text = b.finish().unwrap();
        let text = text.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(
            text.iter().collect::<Vec<_>>(),
            [Some("añ"), None, Some("ok")]
        );
        let ColBuilder::Str(raw) = &mut b else {
            panic!()
        };
        raw.append_value(b"fine");
        raw.append_value([b'a', 0xff]);
        let e = b.finish().unwrap_err();
        assert!(e.contains("row 2") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn decimal_precision_checked() {
        let mut b = ColBuilder::new(
            &ColumnKind::Decimal {
                precision: 3,
                scale: 1,
            },
            1,
        );
        assert!(b.append_value(&Cell::Decimal(999)).is_ok());
        assert!(b.append_value(&Cell::Decimal(-1000)).is_err());
        assert_eq!(digits(0), 1);
        assert!(fits_precision(-99, 2) && !fits_precision(100, 2) && fits_precision(i128::MIN, 39));
        assert!(fits_precision(POW10[38] - 1, 38) && !fits_precision(POW10[38], 38));
        assert!(!fits_precision(-POW10[37], 37) && fits_precision(0, 0) && !fits_precision(1, 0));
        assert_eq!(digits(i128::MIN), 39);
    }

    /// `STRUCT<city: STRING, zip: INT NOT NULL>`, `ARRAY<INT>`, `MAP<STRING, ARRAY<INT>>`.
    fn nested_kinds() -> [ColumnKind; 3] {
        [
            ColumnKind::Struct(vec![
                StructField {
                    name: "city".into(),
                    kind: ColumnKind::Utf8,
                    nullable: true,
                },
                StructField {
                    name: "zip".into(),
                    kind: ColumnKind::Int32,
                    nullable: false,
                },
            ]),
            ColumnKind::Array(Box::new(ColumnKind::Int32)),
            ColumnKind::Map(
                Box::new(ColumnKind::Utf8),
                Box::new(ColumnKind::Array(Box::new(ColumnKind::Int32))),
            ),
        ]
    }

    #[test]
    fn nested_kinds_are_the_declared_types() {
        let ddl = strata_sql::parse_ddl_schema(
            "a STRUCT<city: STRING, zip: INT NOT NULL>, b ARRAY<INT>, c MAP<STRING, ARRAY<INT>>",
        )
        .unwrap();
        for (kind, col) in nested_kinds().iter().zip(&ddl) {
            // The same Arrow type as the SQL declaration, both ways.
            assert_eq!(kind.data_type(), col.data_type);
            assert_eq!(
                ColumnKind::from_data_type(&col.data_type).as_ref(),
                Some(kind)
            );
        }
        assert_eq!(
            nested_kinds().map(|k| k.sql_name()),
            [
                "STRUCT<city: STRING, zip: INT>",
                "ARRAY<INT>",
                "MAP<STRING, ARRAY<INT>>"
            ]
        );
        let time = DataType::Time64(TimeUnit::Microsecond);
        let list = DataType::List(element_field(time));
        assert_eq!(ColumnKind::from_data_type(&list), None);
    }

    #[test]
    fn nested_columns_hold_nulls_at_every_level() {
        let [st, arr, map] = nested_kinds();
        let mut b = ChangeBuffer::new(&[("s".into(), st), ("a".into(), arr), ("m".into(), map)], 2);
        // Row 1: s = {city: NULL, zip: 1}, a = [7, NULL], m = {"k": [NULL], "n": NULL}.
        let [s, a, m] = &mut b.columns[..] else {
            panic!()
        };
        let ColBuilder::Struct(s) = &mut s.2 else {
            panic!()
        };
        s.fields[0].1.append_null();
        s.fields[1].1.append_value(&Cell::Int(1)).unwrap();
        s.end_value();
        let ColBuilder::Array(a) = &mut a.2 else {
            panic!()
        };
        a.elements.append_value(&Cell::Int(7)).unwrap();
        a.elements.append_null();
        a.end_value().unwrap();
        let ColBuilder::Map(m) = &mut m.2 else {
            panic!()
        };
        m.keys.append_value(&Cell::Str("k".into())).unwrap();
        let ColBuilder::Array(inner) = m.values.as_mut() else {
            panic!()
        };
        inner.elements.append_null();
        inner.end_value().unwrap();
        m.keys.append_value(&Cell::Str("n".into())).unwrap();
        m.values.append_null();
        m.end_value().unwrap();
        b.end_row("insert", 1, 0, None, &[]);
        // Row 2: every column NULL (the NOT NULL field is masked by its NULL struct).
        b.end_row("delete", 2, 0, None, &[]);
        let batch = b.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        for c in 0..3 {
            assert!(
                batch.column(c).is_valid(0) && batch.column(c).is_null(1),
                "{c}"
            );
        }
        let s = batch
            .column(0)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        assert!(s.column(0).is_null(0));
        let zip = s
            .column(1)
            .as_any()
            .downcast_ref::<arrow_array::Int32Array>()
            .unwrap();
        assert_eq!(zip.value(0), 1);
        let a = batch
            .column(1)
            .as_any()
            .downcast_ref::<ListArray>()
            .unwrap();
        assert_eq!(a.value_offsets(), &[0, 2, 2]);
        let items = a.value(0);
        assert!(items.is_valid(0) && items.is_null(1));
        let m = batch.column(2).as_any().downcast_ref::<MapArray>().unwrap();
        assert_eq!(m.value_offsets(), &[0, 2, 2]);
        let values = m.values().as_any().downcast_ref::<ListArray>().unwrap();
        assert!(values.is_valid(0) && values.value(0).is_null(0) && values.is_null(1));
        // Finished builders start again empty, in the same types.
        b.end_row("insert", 3, 0, None, &[]);
        let again = b.finish().unwrap();
        assert_eq!(again.schema(), batch.schema());
        assert_eq!(again.num_rows(), 1);
    }

    #[test]
    fn empty_struct_counts_its_rows() {
        let mut b = ColBuilder::new(&ColumnKind::Struct(vec![]), 2);
        let ColBuilder::Struct(s) = &mut b else {
            panic!()
        };
        s.end_value();
        b.append_null();
        let arr = b.finish().unwrap();
        assert_eq!((arr.len(), arr.null_count()), (2, 1));
        assert_eq!(arr.data_type(), &DataType::Struct(Fields::empty()));
    }
}
