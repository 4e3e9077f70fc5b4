//! Which columns of a new Parquet file skip the dictionary, and which skip the codec,
//! decided from the file's first batch ([`for_first_batch`]).
//!
//! Parquet's writer puts every value of a column through a dictionary (hashing it and
//! comparing it with the values already there) until the dictionary page reaches its limit
//! (1 MiB by default), then falls back to PLAIN for the rest of the row group. For a column
//! of nearly distinct values (keys, names, amounts, timestamps) that limit is reached within
//! each row group of 262,144 rows, so the hashing buys nothing: on a first load of a 10M-row
//! snapshot it was about an eighth of the run's CPU time. Such columns are written PLAIN from
//! the start; the file holds the same values in the same encoding it would have fallen back
//! to.
//!
//! A column counts as nearly distinct when two samples of the batch are: its first rows (so
//! that a column sorted into runs of repeated values keeps its dictionary and the runs it
//! encodes) and rows spread over the whole batch (so that a column cycling through a few
//! values does too); and when a row group of such values would overflow the dictionary page.
//!
//! A column of many repeated values (amounts of 100,000 values in a row group of 262,144
//! rows) fits the dictionary page, but its dictionary outgrows the core's cache: interning
//! each value then waits on a cache miss. On a first load of a 10M-row snapshot that one
//! column's dictionary was about a tenth of the run's CPU time, to make the table's files 3%
//! smaller. A column whose row group is estimated to hold more than
//! [`CACHED_DICTIONARY_BYTES`] of distinct values is written PLAIN too, unless its first
//! rows repeat (a column sorted into runs). The distinct values of a row group are estimated
//! from the spread rows as draws from a uniform distribution ([`Samples::group_distinct`]).
//!
//! Files laid out for lookups by key (small data pages, as in an event store: see
//! `eventstore/pages.rs`) weigh the dictionary differently. A lookup reads a few pages of
//! each row group it touches, and with them the whole dictionary page of every column: a
//! dictionary of tens of thousands of keys, names or amounts is read and decoded to use a
//! few dozen of its values. There a column keeps its dictionary only when the estimated
//! dictionary of a row group is small ([`LOOKUP_DICTIONARY_BYTES`]), as for a column of a
//! few repeated values.
//!
//! A column written PLAIN whose values do not compress (random integers, keys in no order,
//! measurements as floats) loses a few percent of its bytes
//! to Snappy or LZ4 at the cost of a pass over every byte on each write and read: on a first
//! load of a 10M-row snapshot the key column (80 MB) kept 95% of its size under Snappy. Such
//! a column is written without the codec when the codec keeps at least
//! [`INCOMPRESSIBLE_SHARE`] of a sample of its first values
//! ([`uncompressed_where_it_saves_nothing`]); the table's other codecs (ZSTD, GZIP) are left
//! as chosen.

use deltalake::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute;
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafusion::parquet::basic::{Compression, Encoding};
use deltalake::datafusion::parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};
use deltalake::datafusion::parquet::schema::types::ColumnPath;

/// Rows in each sample.
const SAMPLE_ROWS: usize = 4096;

/// Fewer sampled rows than this tell nothing: the column keeps its dictionary.
const MIN_SAMPLE_ROWS: usize = 1024;

/// The share of distinct values in both samples at and above which a column is nearly
/// distinct.
const DISTINCT_SHARE: f64 = 0.99;

/// In an ordinary file, the largest estimated dictionary of a row group (bytes) a column
/// keeps when its first rows do not repeat: about what stays in a core's cache (L2) beside
/// the writer's own buffers.
const CACHED_DICTIONARY_BYTES: usize = 256 * 1024;

/// Data pages of at most this many rows mark a file laid out for lookups by key.
const LOOKUP_PAGE_ROWS: usize = 4096;

/// In a file laid out for lookups, the largest estimated dictionary of a row group (bytes) a
/// column keeps: a few pages' worth.
const LOOKUP_DICTIONARY_BYTES: usize = 16 * 1024;

/// A PLAIN column whose sample keeps at least this share of its bytes under the table's codec
/// is written without it.
const INCOMPRESSIBLE_SHARE: f64 = 0.9;

/// Bytes of a column's first values (as PLAIN lays them out) compressed to tell.
const CODEC_SAMPLE_BYTES: usize = 64 * 1024;

/// `props` for a new file whose first batch is `batch`: the dictionary off where it costs
/// more than it saves ([`plain_where_distinct`]), then the codec off for the PLAIN columns
/// it would not shrink ([`uncompressed_where_it_saves_nothing`]).
pub(crate) fn for_first_batch(props: WriterProperties, batch: &RecordBatch) -> WriterProperties {
    uncompressed_where_it_saves_nothing(plain_where_distinct(props, batch), batch)
}

/// `props` with the codec off for the top-level columns of `batch` written PLAIN (without a
/// dictionary) whose first values keep at least [`INCOMPRESSIBLE_SHARE`] of their bytes under
/// the column's codec, when that is Snappy or LZ4_RAW; `props` as they are when there is none.
fn uncompressed_where_it_saves_nothing(
    props: WriterProperties,
    batch: &RecordBatch,
) -> WriterProperties {
    let off = columns_where(batch, |path, c| {
        let plain = !props.dictionary_enabled(path)
            && props.encoding(path).is_none_or(|e| e == Encoding::PLAIN);
        plain
            && plain_sample(c).is_some_and(|sample| {
                compressed_len(props.compression(path), &sample)
                    .is_some_and(|n| n as f64 >= INCOMPRESSIBLE_SHARE * sample.len() as f64)
            })
    });
    for_each_column(props, off, |b, path| {
        b.set_column_compression(path, Compression::UNCOMPRESSED)
    })
}

/// The paths of the top-level columns of `batch` for which `keep` holds.
fn columns_where(
    batch: &RecordBatch,
    keep: impl Fn(&ColumnPath, &ArrayRef) -> bool,
) -> Vec<ColumnPath> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| (ColumnPath::from(f.name().as_str()), c))
        .filter(|(path, c)| keep(path, c))
        .map(|(path, _)| path)
        .collect()
}

/// `props` with `set` applied for each of `columns`; `props` as they are when there is none.
fn for_each_column(
    props: WriterProperties,
    columns: Vec<ColumnPath>,
    set: impl Fn(WriterPropertiesBuilder, ColumnPath) -> WriterPropertiesBuilder,
) -> WriterProperties {
    if columns.is_empty() {
        return props;
    }
    columns.into_iter().fold(props.into_builder(), set).build()
}

/// The first values of `column` laid out as Parquet's PLAIN encoding writes them (fixed-width
/// values as they are, byte arrays each after its 4-byte length), up to
/// [`CODEC_SAMPLE_BYTES`]; `None` for other types and for columns too short to tell.
fn plain_sample(column: &ArrayRef) -> Option<Vec<u8>> {
    if column.len() < MIN_SAMPLE_ROWS {
        return None;
    }
    // Byte arrays: each value after its length, until the sample is full.
    let lengths_and_bytes = |values: &mut dyn Iterator<Item = &[u8]>| {
        let mut out = Vec::with_capacity(CODEC_SAMPLE_BYTES + 64);
        for v in values {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
            if out.len() >= CODEC_SAMPLE_BYTES {
                break;
            }
        }
        out
    };
    let out = match column.data_type() {
        DataType::Utf8 => lengths_and_bytes(
            &mut column
                .as_string::<i32>()
                .iter()
                .flatten()
                .map(str::as_bytes),
        ),
        DataType::LargeUtf8 => lengths_and_bytes(
            &mut column
                .as_string::<i64>()
                .iter()
                .flatten()
                .map(str::as_bytes),
        ),
        DataType::Utf8View => {
            lengths_and_bytes(&mut column.as_string_view().iter().flatten().map(str::as_bytes))
        }
        DataType::Binary => lengths_and_bytes(&mut column.as_binary::<i32>().iter().flatten()),
        DataType::BinaryView => lengths_and_bytes(&mut column.as_binary_view().iter().flatten()),
        DataType::Boolean => return None,
        dt => {
            let width = dt.primitive_width()?;
            let data = column.to_data();
            let rows = column.len().min(CODEC_SAMPLE_BYTES / width);
            let start = data.offset() * width;
            data.buffers()
                .first()?
                .get(start..start + rows * width)?
                .to_vec()
        }
    };
    Some(out)
}

/// The length of `sample` compressed by `codec`, for Snappy and LZ4_RAW (`None` for other
/// codecs: they are left as the table chose them).
fn compressed_len(codec: Compression, sample: &[u8]) -> Option<usize> {
    match codec {
        Compression::SNAPPY => snap::raw::Encoder::new()
            .compress_vec(sample)
            .ok()
            .map(|c| c.len()),
        Compression::LZ4_RAW => Some(lz4_flex::block::compress(sample).len()),
        _ => None,
    }
}

/// `props` with the dictionary off for the top-level columns of `batch` whose dictionary
/// costs more than it saves (the module docs), or `props` as they are when there is none.
fn plain_where_distinct(props: WriterProperties, batch: &RecordBatch) -> WriterProperties {
    let group_rows = props.max_row_group_row_count().unwrap_or(batch.num_rows());
    let limit = props.dictionary_page_size_limit();
    let lookups = props.data_page_row_count_limit() <= LOOKUP_PAGE_ROWS;
    let plain = columns_where(batch, |path, c| {
        if !props.dictionary_enabled(path) {
            return false;
        }
        let Some(samples) = Samples::of(c) else {
            return false;
        };
        if lookups {
            samples.dictionary_bytes(group_rows) > LOOKUP_DICTIONARY_BYTES
        } else {
            samples.nearly_distinct(group_rows, limit) || samples.outgrows_cache(group_rows)
        }
    });
    for_each_column(props, plain, |b, path| {
        b.set_column_dictionary_enabled(path, false)
    })
}

/// What the two samples of a column (the module docs) show.
struct Samples {
    /// The share of distinct values among the first rows.
    first: f64,
    /// The share of distinct values among the rows spread over the batch.
    spread: f64,
    /// How many distinct values the spread rows hold, of `spread_rows`.
    spread_distinct: usize,
    spread_rows: usize,
    /// About how many bytes a value takes in a dictionary.
    width: usize,
}

impl Samples {
    /// The samples of `column`, when it is a leaf Parquet keeps a dictionary for and long
    /// enough to tell.
    fn of(column: &ArrayRef) -> Option<Samples> {
        if !leaf_with_dictionary(column.data_type()) || column.len() < MIN_SAMPLE_ROWS {
            return None;
        }
        let first = column.slice(0, column.len().min(SAMPLE_ROWS));
        let stride = column.len().div_ceil(SAMPLE_ROWS).max(1);
        let spread =
            UInt32Array::from_iter_values((0..column.len()).step_by(stride).map(|i| i as u32));
        let spread = compute::take(column.as_ref(), &spread, None).ok()?;
        let (first_distinct, first_rows) = distinct(&first)?;
        let (spread_distinct, spread_rows) = distinct(&spread)?;
        Some(Samples {
            first: first_distinct as f64 / first_rows as f64,
            spread: spread_distinct as f64 / spread_rows as f64,
            spread_distinct,
            spread_rows,
            width: value_width(&spread),
        })
    }

    /// Both samples are nearly all distinct and a row group of `group_rows` such values
    /// would not fit a dictionary page of `limit` bytes.
    fn nearly_distinct(&self, group_rows: usize, limit: usize) -> bool {
        self.first >= DISTINCT_SHARE
            && self.spread >= DISTINCT_SHARE
            && group_rows.saturating_mul(self.width) > limit
    }

    /// The first rows do not repeat (at most half of them are repeats) and a row group of
    /// `group_rows` rows is estimated to hold more than [`CACHED_DICTIONARY_BYTES`] of
    /// distinct values.
    fn outgrows_cache(&self, group_rows: usize) -> bool {
        self.first > 0.5
            && (self.group_distinct(group_rows) * self.width as f64)
                > CACHED_DICTIONARY_BYTES as f64
    }

    /// About how many distinct values a row group of `group_rows` rows holds, were the
    /// values drawn uniformly from a set of `d` values: the `d` for which `spread_rows` draws
    /// yield the `spread_distinct` values seen (a sample of all distinct values: as many as
    /// the row group has rows).
    fn group_distinct(&self, group_rows: usize) -> f64 {
        let (seen, drawn, group) = (
            self.spread_distinct as f64,
            self.spread_rows as f64,
            group_rows as f64,
        );
        if seen >= drawn {
            return group;
        }
        let expected = |d: f64, draws: f64| d * (1.0 - (-draws / d).exp());
        // `expected(d, drawn)` grows with `d`: bisect between the values seen and a set so
        // large that nearly every draw would be new.
        let (mut low, mut high) = (seen, drawn * drawn * 4.0);
        for _ in 0..100 {
            let mid = (low + high) / 2.0;
            match expected(mid, drawn) < seen {
                true => low = mid,
                false => high = mid,
            }
        }
        expected(high, group).min(group)
    }

    /// About how many bytes the dictionary of a row group of `group_rows` rows takes. Few
    /// distinct values in both samples (at most half of each) are about all there are (the
    /// spread rows' count); more grow with the rows, at the rate of the denser sample (the
    /// first rows of a column sorted into runs repeat each value, the spread rows do not).
    fn dictionary_bytes(&self, group_rows: usize) -> usize {
        let few = self.spread_distinct * 2 <= self.spread_rows && self.first <= 0.5;
        let values = if few {
            self.spread_distinct
        } else {
            (self.first.min(self.spread) * group_rows as f64) as usize
        };
        values.saturating_mul(self.width)
    }
}

/// Types Parquet's writer keeps a dictionary for, as one leaf column: not booleans (never a
/// dictionary), not nested types (their leaves have paths of their own).
fn leaf_with_dictionary(t: &DataType) -> bool {
    !matches!(
        t,
        DataType::Boolean
            | DataType::Null
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(_, _)
            | DataType::Struct(_)
            | DataType::Map(_, _)
            | DataType::Union(_, _)
            | DataType::Dictionary(_, _)
            | DataType::RunEndEncoded(_, _)
    )
}

/// How many distinct values `sample` holds and how many non-NULL values (`None` when it
/// has too few to tell).
fn distinct(sample: &ArrayRef) -> Option<(usize, usize)> {
    let values = sample.len() - sample.null_count();
    if values < MIN_SAMPLE_ROWS {
        return None;
    }
    let converter = RowConverter::new(vec![SortField::new(sample.data_type().clone())]).ok()?;
    let rows = converter
        .convert_columns(std::slice::from_ref(sample))
        .ok()?;
    let seen: ahash::AHashSet<&[u8]> = (0..sample.len())
        .filter(|&i| sample.is_valid(i))
        .map(|i| rows.row(i).data())
        .collect();
    Some((seen.len(), values))
}

/// About how many bytes a value of `sample` takes in a dictionary.
fn value_width(sample: &ArrayRef) -> usize {
    match sample.data_type().primitive_width() {
        Some(w) => w,
        None => (sample
            .to_data()
            .buffers()
            .iter()
            .map(|b| b.len())
            .sum::<usize>()
            / sample.len().max(1))
        .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Float64Array, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn props() -> WriterProperties {
        WriterProperties::builder()
            .set_max_row_group_row_count(Some(262_144))
            .build()
    }

    fn dictionary(p: &WriterProperties, column: &str) -> bool {
        p.dictionary_enabled(&ColumnPath::from(column))
    }

    /// Random integers and floats written PLAIN skip Snappy and LZ4_RAW;
    /// integers in runs, repeating text, columns with a dictionary, a batch too short to
    /// tell, and a table codec other than those two keep their codec.
    #[test]
    fn only_plain_columns_that_do_not_shrink_skip_the_codec() {
        let n = 20_000u64;
        // A 64-bit mix of the row number: values with no pattern a byte codec finds.
        let mix = |i: u64| {
            let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("random", DataType::Int64, false),
            Field::new("runs", DataType::Int64, false),
            Field::new("floats", DataType::Float64, false),
            Field::new("names", DataType::Utf8, false),
            Field::new("cities", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| mix(i) as i64))),
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| (i / 10) as i64),
                )),
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| (mix(i) >> 11) as f64 / (1u64 << 53) as f64 * 1e6),
                )),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("name_{}_of_the_customer", i)),
                )),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| ["Oslo", "Lima", "Pune"][(mix(i) % 3) as usize]),
                )),
            ],
        )
        .unwrap();
        let codec = |p: &WriterProperties, c: &str| p.compression(&ColumnPath::from(c));
        for table_codec in [Compression::SNAPPY, Compression::LZ4_RAW] {
            let mut builder = WriterProperties::builder().set_compression(table_codec);
            for c in ["random", "runs", "floats", "names"] {
                builder = builder.set_column_dictionary_enabled(ColumnPath::from(c), false);
            }
            let p = uncompressed_where_it_saves_nothing(builder.build(), &batch);
            assert_eq!(codec(&p, "random"), Compression::UNCOMPRESSED);
            assert_eq!(codec(&p, "floats"), Compression::UNCOMPRESSED);
            for kept in ["runs", "names", "cities"] {
                assert_eq!(codec(&p, kept), table_codec, "{kept}");
            }
            let short = batch.slice(0, MIN_SAMPLE_ROWS - 1);
            let p = WriterProperties::builder()
                .set_compression(table_codec)
                .set_dictionary_enabled(false)
                .build();
            let p = uncompressed_where_it_saves_nothing(p, &short);
            assert_eq!(codec(&p, "random"), table_codec);
        }
        let zstd = WriterProperties::builder()
            .set_compression(Compression::ZSTD(Default::default()))
            .set_dictionary_enabled(false)
            .build();
        let p = uncompressed_where_it_saves_nothing(zstd, &batch);
        assert_eq!(codec(&p, "random"), Compression::ZSTD(Default::default()));
        // Through both decisions: the random column is nearly distinct, so it goes PLAIN and
        // then uncompressed; the runs keep their dictionary and codec.
        let snappy = || {
            props()
                .into_builder()
                .set_compression(Compression::SNAPPY)
                .build()
        };
        let p = for_first_batch(snappy(), &batch);
        assert!(!dictionary(&p, "random"));
        assert_eq!(codec(&p, "random"), Compression::UNCOMPRESSED);
        assert!(dictionary(&p, "runs"));
        assert_eq!(codec(&p, "runs"), Compression::SNAPPY);
    }

    /// Distinct keys and names go PLAIN; a few cities, keys sorted into runs of ten, and a
    /// column cycling through 500 values keep their dictionary, as does every column of a
    /// batch too small to sample.
    #[test]
    fn only_nearly_distinct_columns_skip_the_dictionary() {
        let n = 100_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("city", DataType::Utf8, true),
            Field::new("runs", DataType::Int64, false),
            Field::new("cycle", DataType::Int64, false),
        ]));
        let names: StringArray = (0..n)
            .map(|i| (i % 7 != 0).then(|| format!("name-{}", i * 7919 % n)))
            .collect();
        let cities: StringArray = (0..n).map(|i| Some(format!("city-{}", i % 32))).collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * 31 % n))),
                Arc::new(names),
                Arc::new(cities),
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 10))),
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 500))),
            ],
        )
        .unwrap();
        let p = plain_where_distinct(props(), &batch);
        assert!(!dictionary(&p, "key"));
        assert!(!dictionary(&p, "name"));
        assert!(dictionary(&p, "city"));
        assert!(dictionary(&p, "runs"));
        assert!(dictionary(&p, "cycle"));
        let p = plain_where_distinct(props(), &batch.slice(0, 1000));
        assert!(dictionary(&p, "key") && dictionary(&p, "name"));
    }

    /// In a file laid out for lookups, keys sorted into runs and amounts of many values skip
    /// the dictionary too; a few cities and a column of 500 values (a 4 KB dictionary)
    /// keep it.
    #[test]
    fn lookup_files_keep_only_small_dictionaries() {
        let n = 100_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("runs", DataType::Int64, false),
            Field::new("amount", DataType::Int64, false),
            Field::new("city", DataType::Utf8, true),
            Field::new("cycle", DataType::Int64, false),
        ]));
        let cities: StringArray = (0..n).map(|i| Some(format!("city-{}", i % 32))).collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 10))),
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| i * 7919 % 20_000),
                )),
                Arc::new(cities),
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 500))),
            ],
        )
        .unwrap();
        let lookups = WriterProperties::builder()
            .set_max_row_group_row_count(Some(262_144))
            .set_data_page_row_count_limit(512)
            .build();
        let p = plain_where_distinct(lookups, &batch);
        assert!(!dictionary(&p, "runs"));
        assert!(!dictionary(&p, "amount"));
        assert!(dictionary(&p, "city"));
        assert!(dictionary(&p, "cycle"));
        // The same batch in an ordinary file: none is nearly distinct.
        let p = plain_where_distinct(props(), &batch);
        assert!(["runs", "amount", "city", "cycle"]
            .iter()
            .all(|c| dictionary(&p, c)));
    }

    /// Amounts of 100,000 values drawn at random (a dictionary of about 800 KB a row group)
    /// skip the dictionary; amounts of 5,000 values (40 KB) keep it, as do 100,000 values
    /// sorted into runs. The estimates (of a row group of 262,144 rows: 92,700 and 5,000
    /// expected) are within the noise of 4,096 draws.
    #[test]
    fn dictionaries_larger_than_the_cache_are_skipped() {
        let n = 1_000_000u64;
        // Values drawn at random (splitmix64 of the row number): a multiplicative sequence
        // would spread evenly over the values, never repeating within the sample.
        let random = |i: u64| {
            let mut z = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let scattered = |values: u64| {
            Int64Array::from_iter_values((0..n).map(move |i| (random(i) % values) as i64))
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("many", DataType::Int64, false),
            Field::new("some", DataType::Int64, false),
            Field::new("sorted", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(scattered(100_000)),
                Arc::new(scattered(5_000)),
                Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i / 10))),
            ],
        )
        .unwrap();
        let samples = |c: usize| Samples::of(batch.column(c)).unwrap();
        let estimate = samples(0).group_distinct(262_144);
        assert!((70_000.0..=120_000.0).contains(&estimate), "{estimate}");
        let estimate = samples(1).group_distinct(262_144);
        assert!((4_500.0..=5_500.0).contains(&estimate), "{estimate}");
        let p = plain_where_distinct(props(), &batch);
        assert!(!dictionary(&p, "many"));
        assert!(dictionary(&p, "some"));
        assert!(dictionary(&p, "sorted"));
    }

    /// A row group small enough for its distinct values to fit the dictionary page keeps it.
    #[test]
    fn a_dictionary_that_fits_is_kept() {
        let schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..50_000))],
        )
        .unwrap();
        let small_groups = WriterProperties::builder()
            .set_max_row_group_row_count(Some(10_000))
            .build();
        assert!(dictionary(
            &plain_where_distinct(small_groups, &batch),
            "key"
        ));
        assert!(!dictionary(&plain_where_distinct(props(), &batch), "key"));
    }
}
