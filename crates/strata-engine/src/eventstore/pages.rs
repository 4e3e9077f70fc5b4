//! Reading the stored events of a few keys without decoding the whole event store.
//!
//! A batch touches a small share of the keys, spread over the whole key space, so every row
//! group of the event store holds some of them and Parquet statistics per row group prune
//! nothing. The event store is therefore laid out for lookups by key: each file is written
//! sorted by key (`semantics/events.rs` puts new events in key order as it takes them,
//! `fold::columns_in_key_order`) in small data pages ([`STORE_PAGE_ROWS`] rows), and the page
//! index (each page's smallest and largest key) tells which pages can hold a touched key.
//! Only those pages' key column is read; then every column of exactly the rows holding a
//! touched key, the other rows of those pages skipped. The pages a batch reads grow with the
//! number of keys it touches, not with the size of the store.
//!
//! This path serves flows with one integer key (the common case, and what the page index
//! compares cheaply); other keys, and flows that apply truncates (which are events of no
//! key), read the store through DataFusion.

use crate::error::{Context, EngineError, Result};
use crate::storage::data_file::{read_range, Fetched};
use crate::util::keyset::KeySet;
use deltalake::arrow::array::{Array, RecordBatch};
use deltalake::arrow::compute::{cast, concat_batches};
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use deltalake::datafusion::parquet::arrow::ProjectionMask;
use deltalake::datafusion::parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use deltalake::datafusion::parquet::file::page_index::column_index::ColumnIndexMetaData;
use deltalake::datafusion::parquet::file::statistics::Statistics;
use deltalake::DeltaTable;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per data page of an event-store file: small enough that a page holds a few dozen
/// keys, so that a batch's keys leave most pages unread.
pub(crate) const STORE_PAGE_ROWS: usize = 512;

/// Creates an empty event store at `path` for a flow keyed by `keys`, with the layout the
/// page-index read relies on: LZ4_RAW, [`STORE_PAGE_ROWS`]-row pages, page statistics for
/// the key columns only, and integer keys packed as deltas (the files are sorted by key).
pub(crate) async fn create_store(
    path: &crate::storage::location::Location,
    schema: &deltalake::arrow::datatypes::Schema,
    keys: &[String],
) -> Result<deltalake::DeltaTable> {
    use crate::storage::write::{
        COMPRESSION_PROPERTY, DELTA_COLUMNS_PROPERTY, PAGE_ROWS_PROPERTY,
        PAGE_STATISTICS_COLUMNS_PROPERTY,
    };
    let keys = keys.join(",");
    crate::storage::table::create_delta(
        path,
        "events",
        schema,
        vec![
            (
                COMPRESSION_PROPERTY.to_string(),
                Some("lz4_raw".to_string()),
            ),
            (
                PAGE_ROWS_PROPERTY.to_string(),
                Some(STORE_PAGE_ROWS.to_string()),
            ),
            (
                PAGE_STATISTICS_COLUMNS_PROPERTY.to_string(),
                Some(keys.clone()),
            ),
            (DELTA_COLUMNS_PROPERTY.to_string(), Some(keys)),
        ],
        None,
        Vec::new(),
    )
    .await
}

/// The touched keys as sorted, distinct integers, when `keys` is one integer column.
pub(crate) fn int_keys(keys: &RecordBatch) -> Option<Vec<i64>> {
    let [column] = keys.columns() else {
        return None;
    };
    if !matches!(
        column.data_type(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    ) || column.null_count() > 0
    {
        return None;
    }
    let as_i64 = cast(column, &DataType::Int64).ok()?;
    let values = as_i64
        .as_any()
        .downcast_ref::<deltalake::arrow::array::Int64Array>()?;
    let mut out: Vec<i64> = values.values().to_vec();
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// The rows of the event store `table` (at `root`) whose column `key` holds one of `keys`
/// (sorted), in the layout `schema` (columns the older files lack are NULL). `None` when
/// the store has files this path cannot read exactly (deletion vectors) or is not on a
/// local file system.
pub(crate) async fn read_keys(
    table: &DeltaTable,
    root: &crate::storage::location::Location,
    key: &str,
    keys: Vec<i64>,
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>> {
    // The page-index read works on local files; a store elsewhere is read by the query
    // engine instead.
    let Some(root) = root.local() else {
        return Ok(None);
    };
    let state = table
        .snapshot()
        .context(|| "reading the event store's state".into())?;
    let mut files: Vec<(PathBuf, i64)> = Vec::new();
    for f in state.log_data().iter() {
        if f.deletion_vector_descriptor().is_some() {
            return Ok(None);
        }
        let path = f.object_store_path();
        files.push((root.join(path.as_ref()), f.size()));
    }
    // Largest files first, dealt round-robin: the threads get similar work.
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    let threads = crate::util::threads::parallelism().clamp(1, files.len().max(1));
    let mut lanes: Vec<Vec<PathBuf>> = vec![Vec::new(); threads];
    for (n, (p, _)) in files.into_iter().enumerate() {
        lanes[n % threads].push(p);
    }
    let out_schema = schema.clone();
    let set = KeySet::new(&keys);
    let (keys, schema, key) = (Arc::new(keys), schema.clone(), key.to_string());
    let read = tokio::task::spawn_blocking(move || {
        crate::util::threads::on_threads(lanes, "read", |lane| {
            lane.iter()
                .map(|p| read_file(p, &key, &keys, &set, &schema))
                .collect::<Result<Vec<_>>>()
        })
    })
    .await
    .map_err(|e| EngineError::internal(format!("a reading task failed: {e}")))??;
    let mut batches = Vec::new();
    for lane in read {
        batches.extend(lane?.into_iter().flatten());
    }
    concat_batches(&out_schema, &batches)
        .map(Some)
        .context(|| "concatenating stored events".into())
}

/// Whether a value of `keys` (sorted) lies in `lo..=hi`.
fn any_in(keys: &[i64], lo: i64, hi: i64) -> bool {
    let i = keys.partition_point(|&k| k < lo);
    i < keys.len() && keys[i] <= hi
}

/// The row groups of `meta` that may hold one of `keys` in leaf column `leaf`, each with
/// the rows of its pages that may (all its rows where the file has no page index).
fn selection(meta: &ParquetMetaData, leaf: usize, keys: &[i64]) -> Vec<(usize, Vec<RowSelector>)> {
    let mut groups = Vec::new();
    let bounds = |s: Option<&Statistics>| match s {
        Some(Statistics::Int64(v)) => v.min_opt().copied().zip(v.max_opt().copied()),
        Some(Statistics::Int32(v)) => v
            .min_opt()
            .map(|&x| x as i64)
            .zip(v.max_opt().map(|&x| x as i64)),
        _ => None,
    };
    for (g, rg) in meta.row_groups().iter().enumerate() {
        let rows = rg.num_rows() as usize;
        if let Some((lo, hi)) = bounds(rg.column(leaf).statistics()) {
            if !any_in(keys, lo, hi) {
                continue;
            }
        }
        let mut selectors: Vec<RowSelector> = Vec::new();
        let pages = meta
            .column_index()
            .and_then(|ci| ci.get(g))
            .and_then(|c| c.get(leaf))
            .zip(
                meta.offset_index()
                    .and_then(|oi| oi.get(g))
                    .and_then(|o| o.get(leaf)),
            );
        let Some((index, offsets)) = pages else {
            groups.push((g, vec![RowSelector::select(rows)]));
            continue;
        };
        let locations = offsets.page_locations();
        for (p, loc) in locations.iter().enumerate() {
            let first = loc.first_row_index as usize;
            let end = locations
                .get(p + 1)
                .map_or(rows, |n| n.first_row_index as usize);
            let hit = match index {
                ColumnIndexMetaData::INT64(ix) => ix
                    .min_value(p)
                    .zip(ix.max_value(p))
                    .is_none_or(|(&lo, &hi)| any_in(keys, lo, hi)),
                ColumnIndexMetaData::INT32(ix) => ix
                    .min_value(p)
                    .zip(ix.max_value(p))
                    .is_none_or(|(&lo, &hi)| any_in(keys, lo as i64, hi as i64)),
                _ => true,
            };
            let count = end.saturating_sub(first);
            match (selectors.last_mut(), hit) {
                (Some(last), _) if last.skip != hit => last.row_count += count,
                _ if hit => selectors.push(RowSelector::select(count)),
                _ => selectors.push(RowSelector::skip(count)),
            }
        }
        if selectors.iter().any(|s| !s.skip) {
            groups.push((g, selectors));
        }
    }
    groups
}

/// `coarse` narrowed to the rows whose key (`keys_read`: the key of every row `coarse`
/// selects, in order) is in `set`.
fn exact(coarse: &[RowSelector], keys_read: &[i64], set: &KeySet) -> Vec<RowSelector> {
    let mut out: Vec<RowSelector> = Vec::new();
    let mut push = |hit: bool, count: usize| match out.last_mut() {
        Some(last) if last.skip != hit => last.row_count += count,
        _ if count == 0 => {}
        _ if hit => out.push(RowSelector::select(count)),
        _ => out.push(RowSelector::skip(count)),
    };
    let mut at = 0;
    for s in coarse {
        if s.skip {
            push(false, s.row_count);
            continue;
        }
        for &k in &keys_read[at..at + s.row_count] {
            push(set.contains(k), 1);
        }
        at += s.row_count;
    }
    out
}

/// The rows of one event-store file whose `key` is in `keys` (also in `set`), in the layout
/// `schema`: the key column of the pages that may hold them first, then every column of
/// exactly those rows (the other rows of those pages are skipped, not decoded).
fn read_file(
    path: &Path,
    key: &str,
    keys: &[i64],
    set: &KeySet,
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>> {
    let what = || format!("reading {}", path.display());
    let file = std::fs::File::open(path).context(what)?;
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let meta = ArrowReaderMetadata::load(&file, options).context(what)?;
    let Some(leaf) = meta
        .parquet_schema()
        .columns()
        .iter()
        .position(|c| c.path().parts() == [key])
    else {
        return Err(EngineError::internal(format!(
            "{} has no key column {key}",
            path.display()
        )));
    };
    let reader = |g: usize, input: Fetched, projection: ProjectionMask, rows: Vec<RowSelector>| {
        ParquetRecordBatchReaderBuilder::new_with_metadata(input, meta.clone())
            .with_projection(projection)
            .with_row_groups(vec![g])
            .with_row_selection(RowSelection::from(rows))
            .with_batch_size(64 * 1024)
            .build()
            .context(what)
    };
    let key_only = ProjectionMask::leaves(meta.parquet_schema(), [leaf]);
    let leaves: Vec<usize> = (0..meta.parquet_schema().num_columns()).collect();
    let (mut candidates, mut selected) = (0usize, 0usize);
    let mut out = Vec::new();
    // A row group at a time: the bytes read are those of one group's pages.
    for (g, coarse) in selection(meta.metadata(), leaf, keys) {
        let mut keys_read: Vec<i64> = Vec::new();
        let key_pages = fetch_pages(&file, meta.metadata(), g, &[leaf], &coarse).context(what)?;
        for batch in reader(g, key_pages, key_only.clone(), coarse.clone())? {
            let k = cast(batch.context(what)?.column(0), &DataType::Int64).context(what)?;
            let k = k
                .as_any()
                .downcast_ref::<deltalake::arrow::array::Int64Array>()
                .ok_or_else(|| EngineError::internal("key values"))?;
            keys_read.extend(k.iter().map(|v| v.unwrap_or(i64::MIN)));
        }
        let rows = exact(&coarse, &keys_read, set);
        candidates += keys_read.len();
        let here: usize = rows.iter().filter(|s| !s.skip).map(|s| s.row_count).sum();
        if here == 0 {
            continue;
        }
        selected += here;
        let pages = fetch_pages(&file, meta.metadata(), g, &leaves, &rows).context(what)?;
        for batch in reader(g, pages, ProjectionMask::all(), rows)? {
            out.push(crate::util::arrow::in_layout(
                &batch.context(what)?,
                schema,
            )?);
        }
    }
    tracing::debug!(
        "store: {}: {selected} row(s) of the {candidates} in the pages that may hold the keys, \
         of {}",
        path.display(),
        meta.metadata().file_metadata().num_rows()
    );
    if out.is_empty() {
        return Ok(None);
    }
    concat_batches(schema, &out)
        .map(Some)
        .context(|| "concatenating stored events".into())
}

/// Pages closer than this in a file are read together, with the bytes between them: one
/// read of a few dozen KiB costs less than two system calls.
const READ_GAP: u64 = 8 * 1024;

/// The pages of leaf columns `leaves` in row group `group` of a file that hold rows `rows`
/// selects, read from `file` with one read per run of nearby pages. A store file's
/// 512-row pages made the reader's own page-by-page reads (a system call each) most of a
/// batch's store read.
fn fetch_pages(
    file: &std::fs::File,
    meta: &ParquetMetaData,
    group: usize,
    leaves: &[usize],
    rows: &[RowSelector],
) -> std::io::Result<Fetched> {
    let pieces = coalesce(page_ranges(meta, group, leaves, rows), READ_GAP)
        .into_iter()
        .map(|(start, end)| Ok((start, read_range(file, start..end)?)))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(Fetched::new(file.metadata()?.len(), pieces))
}

/// The byte ranges (start, end) of the pages [`fetch_pages`] reads: in each column chunk,
/// the data pages holding a selected row and, when one does, the dictionary page before
/// them; a whole chunk when the file has no page index for it.
fn page_ranges(
    meta: &ParquetMetaData,
    group: usize,
    leaves: &[usize],
    rows: &[RowSelector],
) -> Vec<(u64, u64)> {
    // The selected rows as (first, end) runs over the group's rows.
    let mut selected: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    for s in rows {
        if !s.skip && s.row_count > 0 {
            selected.push((at, at + s.row_count));
        }
        at += s.row_count;
    }
    let any_selected = |first: usize, end: usize| {
        let i = selected.partition_point(|&(_, e)| e <= first);
        selected.get(i).is_some_and(|&(s, _)| s < end)
    };
    let row_group = meta.row_group(group);
    let group_rows = row_group.num_rows() as usize;
    let mut ranges = Vec::new();
    if selected.is_empty() {
        return ranges;
    }
    for &leaf in leaves {
        let chunk = row_group.column(leaf);
        let (chunk_start, chunk_len) = chunk.byte_range();
        let locations = meta
            .offset_index()
            .and_then(|oi| oi.get(group))
            .and_then(|o| o.get(leaf))
            .map(|o| o.page_locations());
        let Some(locations) = locations.filter(|l| !l.is_empty()) else {
            ranges.push((chunk_start, chunk_start + chunk_len));
            continue;
        };
        let mut any = false;
        for (p, loc) in locations.iter().enumerate() {
            let first = loc.first_row_index as usize;
            let end = locations
                .get(p + 1)
                .map_or(group_rows, |n| n.first_row_index as usize);
            if any_selected(first, end) {
                let start = loc.offset as u64;
                ranges.push((start, start + loc.compressed_page_size as u64));
                any = true;
            }
        }
        let first_page = locations[0].offset as u64;
        if any && first_page > chunk_start {
            ranges.push((chunk_start, first_page));
        }
    }
    ranges
}

/// `ranges` sorted and merged where they overlap or lie at most `gap` bytes apart.
fn coalesce(mut ranges: Vec<(u64, u64)>, gap: u64) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(gap) => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::datafusion::parquet::file::reader::ChunkReader;

    /// Close keys (bitmap) and keys spread over the whole range (filtered hash set) answer
    /// like a plain set, for members and for values next to them.
    #[test]
    fn many_keys_with_filter_collisions_are_held_exactly() {
        let mut x: u64 = 5;
        for spread in [1_000i64, i64::MAX] {
            let mut keys: Vec<i64> = (0..20_000)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 1) as i64 % spread - spread / 2
                })
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let set = KeySet::new(&keys);
            let plain: std::collections::HashSet<i64> = keys.iter().copied().collect();
            for &k in &keys {
                for probe in [k, k.wrapping_add(1), k.wrapping_sub(1), k.wrapping_mul(3)] {
                    assert_eq!(set.contains(probe), plain.contains(&probe), "{probe}");
                }
            }
        }
    }

    /// A store file of 3 row groups of 1000 sorted keys in 100-row pages, read for a few
    /// keys (pages through the file), most keys (bytes read at once) and the keys of the last
    /// row group only (bytes from the middle of the file): exactly the rows of those keys.
    #[test]
    fn rows_of_the_keys_come_back_whichever_way_the_pages_are_read() {
        use deltalake::arrow::array::{Int64Array, StringArray};
        use deltalake::arrow::datatypes::{Field, Schema};
        use deltalake::datafusion::parquet::arrow::ArrowWriter;
        use deltalake::datafusion::parquet::file::properties::{
            EnabledStatistics, WriterProperties,
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.parquet");
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .set_data_page_row_count_limit(100)
            .set_write_batch_size(100)
            .set_statistics_enabled(EnabledStatistics::Page)
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            schema.clone(),
            Some(props),
        )
        .unwrap();
        let value = |k: i64| (k % 7 != 0).then(|| format!("v{k}"));
        let all: Vec<i64> = (0..3000).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(all.clone())),
                Arc::new(StringArray::from(
                    all.iter().map(|&k| value(k)).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let few = vec![5, 1234, 2999];
        let most: Vec<i64> = (0..3000).step_by(2).collect();
        let last: Vec<i64> = (2000..3000).step_by(3).collect();
        for keys in [few, most, last] {
            let set = KeySet::new(&keys);
            let got = read_file(&path, "k", &keys, &set, &schema)
                .unwrap()
                .unwrap();
            let k = got.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let s = got
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            assert_eq!(k.values().to_vec(), keys);
            for i in 0..got.num_rows() {
                assert_eq!(
                    s.is_valid(i).then(|| s.value(i).to_string()),
                    value(k.value(i))
                );
            }
        }
        // Outside the pages fetched is an error, not other bytes: the pages of row group 2
        // holding rows 50..150 of it are its 100-row pages 0 and 1, key column only.
        let meta = ArrowReaderMetadata::load(
            &std::fs::File::open(&path).unwrap(),
            ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
        )
        .unwrap();
        let rows = [
            RowSelector::skip(50),
            RowSelector::select(100),
            RowSelector::skip(850),
        ];
        let ranges = page_ranges(meta.metadata(), 2, &[0], &rows);
        let pages = meta.metadata().offset_index().unwrap()[2][0].page_locations();
        let chunk = meta.metadata().row_group(2).column(0).byte_range();
        let (p0, p1) = (&pages[0], &pages[1]);
        let mut want = vec![
            (
                p0.offset as u64,
                (p0.offset + p0.compressed_page_size as i64) as u64,
            ),
            (
                p1.offset as u64,
                (p1.offset + p1.compressed_page_size as i64) as u64,
            ),
        ];
        if chunk.0 < p0.offset as u64 {
            want.push((chunk.0, p0.offset as u64));
        }
        assert_eq!(ranges, want);
        let fetched = fetch_pages(
            &std::fs::File::open(&path).unwrap(),
            meta.metadata(),
            2,
            &[0],
            &rows,
        )
        .unwrap();
        let (start, end) = (chunk.0, p1.offset as u64 + p1.compressed_page_size as u64);
        assert!(fetched.get_bytes(start, (end - start) as usize).is_ok());
        assert!(fetched
            .get_bytes(start, (end - start) as usize + 1)
            .is_err());
        assert!(fetched.get_bytes(0, 4).is_err());
    }

    #[test]
    fn nearby_ranges_are_read_together() {
        let got = coalesce(
            vec![(100, 200), (0, 10), (210, 300), (5, 20), (1000, 1100)],
            10,
        );
        assert_eq!(got, vec![(0, 20), (100, 300), (1000, 1100)]);
    }

    #[test]
    fn a_key_in_range_is_found_by_binary_search() {
        let keys = [3, 8, 20];
        assert!(any_in(&keys, 1, 3));
        assert!(any_in(&keys, 4, 8));
        assert!(!any_in(&keys, 9, 19));
        assert!(any_in(&keys, 20, 20));
        assert!(!any_in(&keys, 21, 100));
        assert!(!any_in(&[], 0, 100));
    }

    #[test]
    fn key_sets_answer_alike_over_small_and_wide_ranges() {
        for keys in [vec![-3, 0, 5, 64, 65, 1000], vec![-(1 << 40), 7, 1 << 40]] {
            let set = KeySet::new(&keys);
            assert_eq!(
                matches!(set, KeySet::Bits { .. }),
                keys[0] == -3,
                "a small range is a bitmap"
            );
            for k in -70..1100 {
                assert_eq!(set.contains(k), keys.contains(&k), "{k}");
            }
            assert!(set.contains(*keys.last().unwrap()));
            assert!(!set.contains(i64::MIN) && !set.contains(i64::MAX));
        }
    }

    #[test]
    fn the_exact_selection_keeps_only_rows_of_the_keys() {
        // Rows 0..4 skipped (page without keys), 4..10 read: keys 1 1 2 3 3 4; rows 10..12
        // skipped.
        let coarse = [
            RowSelector::skip(4),
            RowSelector::select(6),
            RowSelector::skip(2),
        ];
        let set = KeySet::new(&[1, 3]);
        let got = exact(&coarse, &[1, 1, 2, 3, 3, 4], &set);
        let want = vec![
            RowSelector::skip(4),
            RowSelector::select(2),
            RowSelector::skip(1),
            RowSelector::select(2),
            RowSelector::skip(3),
        ];
        assert_eq!(got, want);
    }

    /// An event store made by [`create_store`] writes its integer key packed as deltas,
    /// without a dictionary or codec, keeps page statistics for the key only, and a lookup
    /// by key through the page index still finds exactly the rows of the keys.
    #[tokio::test]
    async fn a_new_store_packs_its_integer_key_and_indexes_only_its_pages() {
        use deltalake::arrow::array::{Int64Array, StringArray};
        use deltalake::arrow::datatypes::{Field, Schema};
        use deltalake::datafusion::parquet::basic::{Compression, Encoding};
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let dir = tempfile::tempdir().unwrap();
        let at = crate::storage::location::Location::parse(dir.path().to_str().unwrap(), "store")
            .unwrap();
        let store = create_store(&at, &schema, &["ID".to_string()])
            .await
            .unwrap();
        // Three events a key, in key order, as a store file holds them.
        let ids: Vec<i64> = (0..3000).map(|i| 10 * (i / 3)).collect();
        let name = |i: usize| format!("n{i}");
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from((0..3000).map(name).collect::<Vec<_>>())),
            ],
        )
        .unwrap();
        crate::storage::write::append(
            &store,
            vec![batch],
            Vec::new(),
            &crate::storage::commit::PendingCommit::default(),
        )
        .await
        .unwrap();
        let store = crate::storage::table::open_delta(&at)
            .await
            .unwrap()
            .unwrap();
        let files: Vec<_> = store
            .snapshot()
            .unwrap()
            .log_data()
            .iter()
            .map(|f| dir.path().join(f.object_store_path().as_ref()))
            .collect();
        assert_eq!(files.len(), 1);
        let meta = ArrowReaderMetadata::load(
            &std::fs::File::open(&files[0]).unwrap(),
            ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
        )
        .unwrap();
        let meta = meta.metadata();
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let (id, name) = (rg.column(0), rg.column(1));
            assert!(id.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED));
            assert_eq!(id.compression(), Compression::UNCOMPRESSED);
            assert!(id.dictionary_page_offset().is_none());
            assert_eq!(name.compression(), Compression::LZ4_RAW);
            let index = &meta.column_index().unwrap()[g];
            assert!(matches!(index[0], ColumnIndexMetaData::INT64(_)));
            assert!(matches!(index[1], ColumnIndexMetaData::NONE));
            // Every column's pages can still be found (the offset index).
            assert_eq!(meta.offset_index().unwrap()[g].len(), 2);
        }
        let keys = vec![0, 5000, 9990];
        let got = read_keys(&store, &at, "id", keys.clone(), &schema)
            .await
            .unwrap()
            .unwrap();
        let k = got.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let n = got
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let want: Vec<usize> = (0..3000).filter(|&i| keys.contains(&ids[i])).collect();
        assert_eq!(
            k.values().to_vec(),
            want.iter().map(|&i| ids[i]).collect::<Vec<_>>()
        );
        let names: Vec<String> = (0..n.len()).map(|i| n.value(i).to_string()).collect();
        assert_eq!(names, want.iter().map(|&i| name(i)).collect::<Vec<_>>());
    }
}
