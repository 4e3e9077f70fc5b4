//! The state digest of a snapshot flow: what a new snapshot is diffed against.
//!
//! Applying snapshot `v` needs the state it replaces (semantics page §4): every key of the
//! state at the version before, and whether its row differs from `v`'s. Reading that state
//! from the target means decoding every column of every open row, and comparing it means
//! gathering every column of every matched pair: for a 10M-row snapshot, seconds spent on rows
//! of which 99% did not change. The digest keeps, for the state at the latest applied version,
//! each key with a 64-bit hash of its other columns, sorted by key. A new snapshot is hashed
//! the same way, sorted by key, and merged with the digest: new keys, changed keys (hashes
//! differ) and missing keys fall out of one pass over two sorted lists of integers.
//!
//! Equal rows always hash equal (NULL equals NULL, as the full comparison has it). Two rows
//! that differ hash equal with probability about 2^-64 per changed row; such a change would
//! be missed, which is the one difference from comparing values.
//!
//! The digest is a cache, never the record: it is a function of the event store (the state at
//! the latest applied version is the fold of the stored events), written after the store commit
//! of the run that made it, and named by that store version (`state/digest-<version>.arrow`
//! next to the event store: an Arrow IPC file of uncompressed columns, read straight into
//! memory). The file holds the keys in the order-preserving form the merge compares
//! (`util::arrow::Ordered::Int`) and the hashes, used as read without a conversion; a key of
//! another type than a 64-bit integer also keeps a column of its own values. A run uses it
//! only when its version is the store's and the target reflects the store; otherwise (a
//! crash between the commits, a digest from an older strata, a changed schema, no digest yet)
//! the run reads the target as before and writes a new one. It serves flows with one
//! integer-like key, like the page-index store read (`eventstore/pages.rs`).

use crate::error::{Context, EngineError, Result};
use crate::storage::location::Location;
use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use deltalake::arrow::buffer::ScalarBuffer;
use deltalake::arrow::compute;
use deltalake::arrow::datatypes::{
    DataType, Field, Schema, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use deltalake::arrow::ipc::reader::FileReader;
use deltalake::arrow::ipc::writer::FileWriter;
use deltalake::arrow::row::{RowConverter, SortField};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use twox_hash::XxHash3_64;

/// Raised when the hashing or the file layout changes: older digests are then ignored.
const FORMAT: &str = "4";
const STAMP_KEY: &str = "strata.digest";
const HASH_COL: &str = "__strata_hash";
/// The column of a digest file holding the keys in their order-preserving form, each as its
/// gap from the key before ([`gaps_in`]).
const ORDER_COL: &str = "__strata_key_order";
/// The schema metadata of a digest file holding its first key's order-preserving form.
const FIRST_KEY: &str = "strata.digest.first";
/// The schema metadata of a digest file holding its number of keys.
const KEY_COUNT: &str = "strata.digest.keys";
/// Keys in each batch of a digest file (small in tests, so that they write several).
const BATCH_ROWS: usize = if cfg!(test) { 256 } else { 1 << 20 };
/// The fewest bytes a key takes in a digest file: a one-byte gap and its hash.
const MIN_KEY_BYTES: u64 = 9;

/// Keys of one state, ascending, each with the hash of its other columns.
pub(crate) struct Digest {
    keys: Keys,
    /// The keys in order-preserving integer form (`util::arrow::Ordered::Int`): made by a
    /// sort, or as read from a digest file.
    ordered: ScalarBuffer<u64>,
    hashes: ScalarBuffer<u64>,
}

/// The key column of a digest in its own type: as read (in key order), a snapshot's
/// key column in pieces with the row of each position (put in key order only when needed),
/// or 64-bit integers without NULLs, which `ordered` holds as they are (nothing else is
/// kept: a first snapshot's run then lets go of the row order once it is diffed).
enum Keys {
    Sorted(ArrayRef),
    Rows(Vec<ArrayRef>, Arc<Vec<u32>>),
    Int64,
}

impl Digest {
    pub(crate) fn empty(key_type: &DataType) -> Digest {
        Digest {
            keys: Keys::Sorted(deltalake::arrow::array::new_empty_array(key_type)),
            ordered: ScalarBuffer::from(Vec::new()),
            hashes: ScalarBuffer::from(Vec::new()),
        }
    }

    /// The key values at `positions`.
    pub(crate) fn keys_at(&self, positions: &[u32]) -> Result<ArrayRef> {
        let (column, idx) = match &self.keys {
            Keys::Int64 => {
                let values = positions.iter().map(|&p| unflip(self.ordered[p as usize]));
                return Ok(Arc::new(
                    deltalake::arrow::array::Int64Array::from_iter_values(values),
                ));
            }
            Keys::Sorted(c) => (c.clone(), UInt32Array::from(positions.to_vec())),
            Keys::Rows(pieces, rows) => (
                crate::util::arrow::concat_arrays(pieces)?,
                UInt32Array::from_iter_values(positions.iter().map(|&p| rows[p as usize])),
            ),
        };
        compute::take(column.as_ref(), &idx, None).context(|| "reading digest keys".into())
    }

    /// What a digest file holds: the order-preserving keys, the hashes, and the key column in
    /// key order unless the keys are 64-bit integers (rebuilt from the first when read). The
    /// snapshot's key column and row order are let go: a 10M-key digest being saved then
    /// holds 160 MB, not 320.
    fn into_parts(self) -> Result<(ScalarBuffer<u64>, ScalarBuffer<u64>, Option<ArrayRef>)> {
        let keys = match self.keys {
            Keys::Int64 => None,
            _ => Some(self.sorted_keys()?),
        };
        Ok((self.ordered, self.hashes, keys))
    }

    /// The whole key column, in key order.
    fn sorted_keys(&self) -> Result<ArrayRef> {
        match &self.keys {
            Keys::Int64 => {
                let values = self.ordered.iter().map(|&u| unflip(u));
                Ok(Arc::new(
                    deltalake::arrow::array::Int64Array::from_iter_values(values),
                ))
            }
            Keys::Sorted(c) => Ok(c.clone()),
            Keys::Rows(pieces, rows) => compute::take(
                crate::util::arrow::concat_arrays(pieces)?.as_ref(),
                &UInt32Array::from(rows.as_ref().clone()),
                None,
            )
            .context(|| "ordering digest keys".into()),
        }
    }
}

/// A 64-bit integer from its order-preserving form (`util::arrow::Ordered::Int`).
fn unflip(u: u64) -> i64 {
    (u ^ (1 << 63)) as i64
}

/// A snapshot's digest and, for each of its positions, the snapshot row it came from.
pub(crate) struct SnapshotDigest {
    pub(crate) digest: Digest,
    pub(crate) rows: Arc<Vec<u32>>,
}

/// The digest of `batch` (one row per key expected; duplicates are found by [`diff`]):
/// column `key` as the key, the others hashed. `None` when the key is not integer-like.
pub(crate) fn of_batch(batch: &RecordBatch, key: usize) -> Result<Option<SnapshotDigest>> {
    of_pieces(std::slice::from_ref(batch), key)
}

/// [`of_batch`] of the rows of `pieces` (batches of one schema) one after the other,
/// without first copying them into one batch.
pub(crate) fn of_pieces(pieces: &[RecordBatch], key: usize) -> Result<Option<SnapshotDigest>> {
    if pieces.is_empty() {
        return Err(EngineError::internal("a digest of no batch"));
    }
    // The keys' order-preserving form straight from the pieces: no copy of the key column
    // first (fresh memory costs a page fault per 4 KiB).
    let n: usize = pieces.iter().map(RecordBatch::num_rows).sum();
    let mut ordered = Vec::with_capacity(n);
    for p in pieces {
        match crate::util::arrow::Ordered::of(p.column(key), None)? {
            crate::util::arrow::Ordered::Int(v) => ordered.extend_from_slice(&v),
            crate::util::arrow::Ordered::Rows(_) => return Ok(None),
        }
    }
    let threads = crate::util::threads::threads_for(n);
    // The rows are hashed once the sort has let go of its buffers, and each position's
    // hash is gathered before the rows are split out of the sorted items. (Gathering in
    // place, following the permutation's cycles, would save another copy but is a chain of
    // dependent random reads: 1.5 s instead of 0.03 s for 10M rows.)
    let (ordered, rows, hashes) = crate::util::sort::sorted_carrying(ordered, threads, || {
        piece_hashes(pieces, key, threads)
    })?;
    let rows = Arc::new(rows);
    // A 64-bit integer key without NULLs: its order-preserving form is the value with the
    // sign bit flipped, so keys come back from `ordered` without a gather over the column.
    let int64 = pieces.iter().all(|b| {
        let c = b.column(key);
        c.data_type() == &DataType::Int64 && c.null_count() == 0
    });
    let keys = match int64 {
        true => Keys::Int64,
        false => Keys::Rows(
            pieces.iter().map(|b| b.column(key).clone()).collect(),
            rows.clone(),
        ),
    };
    Ok(Some(SnapshotDigest {
        digest: Digest {
            keys,
            ordered: ScalarBuffer::from(ordered),
            hashes: ScalarBuffer::from(hashes),
        },
        rows,
    }))
}

/// The hash of every row of `pieces` (one after the other) over all columns but `key`. A
/// piece longer than a thread's share is cut into shares, so that one large batch is hashed
/// on every thread too.
fn piece_hashes(pieces: &[RecordBatch], key: usize, threads: usize) -> Result<Vec<u64>> {
    let n: usize = pieces.iter().map(RecordBatch::num_rows).sum();
    let per = n.div_ceil(threads.max(1)).max(1);
    let mut slices = Vec::new();
    for b in pieces {
        let values: Vec<ArrayRef> = (0..b.num_columns())
            .filter(|&c| c != key)
            .map(|c| b.column(c).clone())
            .collect();
        for start in (0..b.num_rows()).step_by(per) {
            let len = per.min(b.num_rows() - start);
            slices.push((len, values.iter().map(|c| c.slice(start, len)).collect()));
        }
    }
    hashes_of(slices, threads)
}

/// The hash of every row of `pieces` ((rows, columns of that many rows) each), one piece
/// after the other: runs of whole pieces with about the same number of rows, one per thread,
/// each hashing into its own part of the output.
fn hashes_of(pieces: Vec<(usize, Vec<ArrayRef>)>, threads: usize) -> Result<Vec<u64>> {
    let n: usize = pieces.iter().map(|p| p.0).sum();
    let per = n.div_ceil(threads.max(1)).max(1);
    let mut runs: Vec<Vec<(usize, Vec<ArrayRef>)>> = vec![Vec::new()];
    let mut in_run = 0;
    for p in pieces {
        in_run += p.0;
        if let Some(run) = runs.last_mut() {
            run.push(p);
        }
        if in_run >= per {
            runs.push(Vec::new());
            in_run = 0;
        }
    }
    let mut out = vec![0u64; n];
    let mut jobs = Vec::with_capacity(runs.len());
    let mut rest: &mut [u64] = &mut out;
    for run in runs {
        let (mine, others) = rest.split_at_mut(run.iter().map(|p| p.0).sum());
        jobs.push((run, mine));
        rest = others;
    }
    for done in crate::util::threads::on_threads(jobs, "hash", |(run, mut h)| {
        for (rows, columns) in run {
            let (mine, others) = h.split_at_mut(rows);
            for c in &columns {
                hash_column(c.as_ref(), mine)?;
            }
            h = others;
        }
        Ok::<_, EngineError>(())
    })? {
        done?;
    }
    Ok(out)
}

/// Mixed into a row's hash for a NULL.
const NULL_TAG: u64 = 0x9e37_79b9_7f4a_7c15;

/// Folds each value of `array` into `h` (one entry per row): XXH3 of the value's bytes,
/// seeded with the hash so far, so that column order and boundaries count.
fn hash_column(array: &dyn Array, h: &mut [u64]) -> Result<()> {
    let nulls = array.logical_nulls();
    let nulls = nulls.as_ref();
    match array.data_type() {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            fold_values(h, nulls, |i| a.value(i).as_bytes());
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            fold_values(h, nulls, |i| a.value(i).as_bytes());
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            fold_values(h, nulls, |i| a.value(i).as_bytes());
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            fold_values(h, nulls, |i| a.value(i));
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            fold_values(h, nulls, |i| a.value(i));
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            fold_values(h, nulls, |i| a.value(i));
        }
        DataType::Boolean => {
            let a = array.as_boolean();
            fold_values(
                h,
                nulls,
                |i| if a.value(i) { &[1u8][..] } else { &[0u8][..] },
            );
        }
        dt if dt.primitive_width().is_some() => {
            let width = dt.primitive_width().unwrap_or(1);
            let data = array.to_data();
            let values = data.buffers()[0].as_slice();
            let offset = data.offset();
            fold_values(h, nulls, |i| {
                &values[(offset + i) * width..(offset + i + 1) * width]
            });
        }
        dt => {
            // Nested and other types: their row-format bytes, which are equal exactly for
            // equal values.
            let converter = RowConverter::new(vec![SortField::new(dt.clone())])
                .context(|| "hashing a column".into())?;
            let rows = converter
                .convert_columns(&[deltalake::arrow::array::make_array(array.to_data())])
                .context(|| "hashing a column".into())?;
            for (i, hi) in h.iter_mut().enumerate() {
                *hi = XxHash3_64::oneshot_with_seed(*hi, rows.row(i).as_ref());
            }
        }
    }
    Ok(())
}

/// Folds `bytes(i)` (row `i`'s value, unless `nulls` marks it NULL) into `h[i]`.
fn fold_values<'a>(
    h: &mut [u64],
    nulls: Option<&deltalake::arrow::buffer::NullBuffer>,
    bytes: impl Fn(usize) -> &'a [u8],
) {
    for (i, hi) in h.iter_mut().enumerate() {
        *hi = if nulls.is_none_or(|n| n.is_valid(i)) {
            XxHash3_64::oneshot_with_seed(*hi, bytes(i))
        } else {
            XxHash3_64::oneshot_with_seed(*hi ^ NULL_TAG, &[0xff])
        };
    }
}

/// The outcome of diffing a snapshot against the state before it.
pub(crate) struct Diff {
    /// Snapshot rows whose key is new or whose row changed.
    pub(crate) upserts: Upserts,
    /// Positions in the old digest of the keys the snapshot lacks, in key order.
    pub(crate) deletes: Vec<u32>,
}

/// Which snapshot rows a [`Diff`] upserts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Upserts {
    /// Every row (a diff against an empty state: a first snapshot's 10M rows need no list of
    /// 40 MB saying so).
    All,
    /// These rows, in key order.
    Rows(Vec<u32>),
}

/// Merges the snapshot's digest with the old state's. `Err(row)` names a snapshot row whose
/// key appears twice.
pub(crate) fn diff(new: &SnapshotDigest, old: &Digest) -> std::result::Result<Diff, u32> {
    let (nk, nh) = (&new.digest.ordered, &new.digest.hashes);
    let (ok, oh) = (&old.ordered, &old.hashes);
    if ok.is_empty() {
        return match (1..nk.len()).find(|&i| nk[i] == nk[i - 1]) {
            Some(i) => Err(new.rows[i]),
            None => Ok(Diff {
                upserts: Upserts::All,
                deletes: Vec::new(),
            }),
        };
    }
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < nk.len() {
        if i > 0 && nk[i] == nk[i - 1] {
            return Err(new.rows[i]);
        }
        while j < ok.len() && ok[j] < nk[i] {
            deletes.push(j as u32);
            j += 1;
        }
        if j < ok.len() && ok[j] == nk[i] {
            if oh[j] != nh[i] {
                upserts.push(new.rows[i]);
            }
            j += 1;
        } else {
            upserts.push(new.rows[i]);
        }
        i += 1;
    }
    deletes.extend(j as u32..ok.len() as u32);
    Ok(Diff {
        upserts: Upserts::Rows(upserts),
        deletes,
    })
}

/// What a digest must have been made for: the data columns (names and types, key first) and
/// the hashing format.
pub(crate) fn fingerprint(schema: &Schema, key: usize) -> String {
    let mut s = format!("format={FORMAT};key={}", schema.field(key).name());
    for f in schema.fields() {
        s.push_str(&format!(";{}:{}", f.name(), f.data_type()));
    }
    s
}

fn file_of(dir: &Path, store_version: i64) -> PathBuf {
    dir.join(format!("digest-{store_version:020}.arrow"))
}

/// The digest of the state after store version `store_version`, when one was written for it
/// and for `fingerprint`; `None` otherwise (the caller reads the state instead), also when
/// the file cannot be read: it is a cache.
pub(crate) fn load(dir: &Path, store_version: i64, fingerprint: &str) -> Option<Digest> {
    let path = file_of(dir, store_version);
    match read(&path, fingerprint) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("ignoring the state digest {}: {e}", path.display());
            None
        }
    }
}

fn read(path: &Path, fingerprint: &str) -> Result<Option<Digest>> {
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(None);
    };
    let what = || format!("reading {}", path.display());
    let file_len = file.metadata().context(what)?.len();
    let reader = FileReader::try_new(BufReader::new(file), None).context(what)?;
    if reader
        .schema()
        .metadata()
        .get(STAMP_KEY)
        .map(String::as_str)
        != Some(fingerprint)
    {
        return Ok(None);
    }
    let schema = reader.schema();
    let meta = |k: &str| schema.metadata().get(k).and_then(|v| v.parse::<u64>().ok());
    let (Some(first), Some(count)) = (meta(FIRST_KEY), meta(KEY_COUNT)) else {
        return Ok(None);
    };
    // The key column of its own type, when the keys are not 64-bit integers.
    let key_column = schema
        .fields()
        .iter()
        .position(|f| f.name() != ORDER_COL && f.name() != HASH_COL);
    let (Some(gaps_at), Some(hashes_at)) = (
        schema.index_of(ORDER_COL).ok(),
        schema.index_of(HASH_COL).ok(),
    ) else {
        return Ok(None);
    };
    // Batch by batch into buffers of the digest's length: no batch is held past its turn.
    // A count the file is too short to hold is not believed (nor reserved).
    let Some(count) = usize::try_from(count)
        .ok()
        .filter(|&n| n as u64 <= file_len / MIN_KEY_BYTES)
    else {
        return Ok(None);
    };
    let mut ordered = Vec::with_capacity(count);
    let mut hashes = Vec::with_capacity(count);
    let mut key_pieces = Vec::new();
    let mut key = first;
    for batch in reader {
        let batch = batch.context(what)?;
        let h = batch.column(hashes_at);
        let Some(h) = h
            .as_primitive_opt::<UInt64Type>()
            .filter(|h| h.null_count() == 0)
        else {
            return Ok(None);
        };
        hashes.extend_from_slice(h.values());
        match keys_from_gaps(key, batch.column(gaps_at).as_ref(), &mut ordered) {
            Some(last) => key = last,
            None => return Ok(None),
        }
        if let Some(i) = key_column {
            key_pieces.push(batch.column(i).clone());
        }
    }
    let keys = match key_column {
        Some(_) if key_pieces.is_empty() => return Ok(None),
        Some(_) => Keys::Sorted(crate::util::arrow::concat_arrays(&key_pieces)?),
        None => Keys::Int64,
    };
    if hashes.len() != ordered.len() || ordered.len() != count {
        return Ok(None);
    }
    let (ordered, hashes) = (ScalarBuffer::from(ordered), ScalarBuffer::from(hashes));
    Ok(Some(Digest {
        keys,
        ordered,
        hashes,
    }))
}

/// The narrowest unsigned type that holds every gap between successive keys of `ordered`
/// (ascending, in order-preserving form). A digest file holds each key as its gap from the
/// key before (0 for the first, which the file's metadata holds): keys handed out in
/// sequence take one byte each instead of eight. A first load writes its digest into fresh
/// page-cache pages, and on a virtual machine whose host takes back freed memory each of
/// them costs a fault (benchmarks/README.md, "a smaller state digest").
fn gap_type(ordered: &[u64]) -> DataType {
    let widest = ordered
        .windows(2)
        .map(|w| w[1].wrapping_sub(w[0]))
        .max()
        .unwrap_or(0);
    match widest {
        w if w <= u8::MAX as u64 => DataType::UInt8,
        w if w <= u16::MAX as u64 => DataType::UInt16,
        w if w <= u32::MAX as u64 => DataType::UInt32,
        _ => DataType::UInt64,
    }
}

/// The gaps of the keys `ordered[range]`, each from the key before it in `ordered` (0 for
/// the very first key), as `width` ([`gap_type`] of `ordered`).
fn gaps_in(ordered: &[u64], range: Range<usize>, width: &DataType) -> ArrayRef {
    let gaps = range.map(|i| match i {
        0 => 0,
        _ => ordered[i].wrapping_sub(ordered[i - 1]),
    });
    match width {
        DataType::UInt8 => Arc::new(UInt8Array::from_iter_values(gaps.map(|g| g as u8))),
        DataType::UInt16 => Arc::new(UInt16Array::from_iter_values(gaps.map(|g| g as u16))),
        DataType::UInt32 => Arc::new(UInt32Array::from_iter_values(gaps.map(|g| g as u32))),
        _ => Arc::new(UInt64Array::from_iter_values(gaps)),
    }
}

/// Appends to `out` the keys that `gaps` ([`gaps_in`]) lay out after the key `last` (the
/// first key, before the first gap of all), and returns the last of them; `None` for a
/// column of another type, with NULLs, or whose sums leave 64 bits (not a digest this code
/// wrote).
fn keys_from_gaps(last: u64, gaps: &dyn Array, out: &mut Vec<u64>) -> Option<u64> {
    fn sums(mut key: u64, gaps: impl Iterator<Item = u64>, out: &mut Vec<u64>) -> Option<u64> {
        for g in gaps {
            key = key.checked_add(g)?;
            out.push(key);
        }
        Some(key)
    }
    if gaps.null_count() != 0 {
        return None;
    }
    match gaps.data_type() {
        DataType::UInt8 => {
            let values = gaps.as_primitive::<UInt8Type>().values();
            sums(last, values.iter().map(|&g| g as u64), out)
        }
        DataType::UInt16 => {
            let values = gaps.as_primitive::<UInt16Type>().values();
            sums(last, values.iter().map(|&g| g as u64), out)
        }
        DataType::UInt32 => {
            let values = gaps.as_primitive::<UInt32Type>().values();
            sums(last, values.iter().map(|&g| g as u64), out)
        }
        DataType::UInt64 => {
            let values = gaps.as_primitive::<UInt64Type>().values();
            sums(last, values.iter().copied(), out)
        }
        _ => None,
    }
}

/// Writes `digest` as the state after store version `store_version` (to a temporary name,
/// then renamed), and removes the digests of older versions.
///
/// The file written is the previous digest's, when there is one: renamed to the temporary
/// name first (a run killed while writing leaves no digest under any version's name, and
/// the next run reads the state instead), then overwritten from its start and cut to length.
/// Its pages are in memory after the run read it, and on a virtual machine whose host takes
/// back freed memory, writing 160 MB into pages the file already has took 0.02-0.05 s where
/// a new file took 0.9-1.8 s (benchmarks/README.md).
pub(crate) fn save(
    dir: &Path,
    store_version: i64,
    fingerprint: &str,
    key_name: &str,
    digest: Digest,
) -> Result<()> {
    let what = || format!("writing the state digest in {}", dir.display());
    std::fs::create_dir_all(dir).context(what)?;
    let (ordered, hashes, keys) = digest.into_parts()?;
    // The fingerprint rides in the schema's metadata: a digest made for other columns or
    // by another format is never used.
    let width = gap_type(&ordered);
    let stamp = HashMap::from([
        (STAMP_KEY.to_string(), fingerprint.to_string()),
        (
            FIRST_KEY.to_string(),
            ordered.first().copied().unwrap_or(0).to_string(),
        ),
        (KEY_COUNT.to_string(), ordered.len().to_string()),
    ]);
    let mut fields = vec![
        Field::new(ORDER_COL, width.clone(), false),
        Field::new(HASH_COL, DataType::UInt64, false),
    ];
    if let Some(keys) = &keys {
        fields.push(Field::new(key_name, keys.data_type().clone(), false));
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, stamp));
    // In batches: the gaps of one batch at a time are all the memory the file takes.
    let n = ordered.len();
    let batches = (0..n.div_ceil(BATCH_ROWS).max(1)).map(|b| {
        let range = b * BATCH_ROWS..((b + 1) * BATCH_ROWS).min(n);
        let mut columns: Vec<ArrayRef> = vec![
            gaps_in(&ordered, range.clone(), &width),
            Arc::new(UInt64Array::new(
                hashes.slice(range.start, range.len()),
                None,
            )),
        ];
        if let Some(keys) = &keys {
            columns.push(keys.slice(range.start, range.len()));
        }
        RecordBatch::try_new(schema.clone(), columns)
    });
    let target = file_of(dir, store_version);
    let tmp = dir.join(format!(".digest-{store_version:020}.tmp"));
    if let Some(previous) = latest_file(dir).filter(|p| *p != target) {
        // A failed rename leaves a new file to be written instead.
        let _ = std::fs::rename(previous, &tmp);
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)
        .context(what)?;
    let mut writer = FileWriter::try_new(BufWriter::new(file), &schema).context(what)?;
    for batch in batches {
        writer.write(&batch.context(what)?).context(what)?;
    }
    writer.finish().context(what)?;
    let mut out = writer.into_inner().context(what)?;
    std::io::Write::flush(&mut out).context(what)?;
    let file = out.into_inner().map_err(|e| e.into_error()).context(what)?;
    let written = std::io::Seek::stream_position(&mut &file).context(what)?;
    file.set_len(written).context(what)?;
    drop(file);
    std::fs::rename(&tmp, &target).context(what)?;
    // Older digests describe states the store has moved past.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p != target {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    Ok(())
}

/// A digest being written on a thread of its own; dropping the writer waits for it. A digest
/// is a cache: failing to write one is logged, and the next run reads the state instead.
pub(crate) struct Writer(Option<std::thread::JoinHandle<()>>);

impl Writer {
    pub(crate) fn start(
        dir: PathBuf,
        store_version: i64,
        fingerprint: String,
        key_name: String,
        digest: Digest,
        flow: String,
    ) -> Writer {
        let handle = std::thread::spawn(move || {
            let clock = std::time::Instant::now();
            match save(&dir, store_version, &fingerprint, &key_name, digest) {
                Ok(()) => tracing::debug!(
                    flow = %flow,
                    elapsed_ms = clock.elapsed().as_millis() as u64,
                    "wrote the state digest"
                ),
                Err(e) => tracing::warn!(flow = %flow, "the state digest was not written: {e}"),
            }
        });
        Writer(Some(handle))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

/// The digest file of the newest store version in `dir`, if any.
fn latest_file(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("digest-") && n.ends_with(".arrow"))
        })
        .max()
}

/// Makes the digest of the state after store version `from`, when there is one, also the
/// digest of the state after `to`: for store commits that change no event (a compaction).
/// Returns whether there was one.
pub(crate) fn carry_over(dir: &Path, from: i64, to: i64) -> Result<bool> {
    let source = file_of(dir, from);
    if !source.exists() {
        return Ok(false);
    }
    let tmp = dir.join(format!(".digest-{to:020}.tmp"));
    let what = || format!("copying {} to version {to}", source.display());
    std::fs::copy(&source, &tmp).context(what)?;
    std::fs::rename(&tmp, file_of(dir, to)).context(what)?;
    Ok(true)
}

/// Where a flow's target keeps its digest, given its event store's location: a local
/// folder beside it, for local warehouses only (on object storage the state is read from
/// the target each run).
pub(crate) fn dir_for(store_path: &Location) -> Option<PathBuf> {
    Some(store_path.local()?.with_file_name("state"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};

    fn batch(keys: Vec<i64>, names: Vec<Option<&str>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    /// New, changed, unchanged (NULL included) and missing keys, whatever the row order.
    #[test]
    fn a_merge_of_digests_finds_new_changed_and_missing_keys() {
        let old = of_batch(
            &batch(
                vec![5, 1, 3, 9],
                vec![Some("e"), Some("a"), None, Some("i")],
            ),
            0,
        )
        .unwrap()
        .unwrap();
        let new = of_batch(
            &batch(
                vec![3, 7, 1, 5],
                vec![None, Some("g"), Some("a"), Some("E")],
            ),
            0,
        )
        .unwrap()
        .unwrap();
        let d = diff(&new, &old.digest).unwrap();
        // Rows of `new`: 3 (row 0) unchanged NULL, 7 (row 1) new, 1 (row 2) unchanged,
        // 5 (row 3) changed; old key 9 is gone.
        assert_eq!(d.upserts, Upserts::Rows(vec![3, 1]));
        let gone = old.digest.keys_at(&d.deletes).unwrap();
        assert_eq!(
            gone.as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .values(),
            &[9]
        );
        let twice = of_batch(&batch(vec![2, 4, 2], vec![None, None, None]), 0)
            .unwrap()
            .unwrap();
        assert!(matches!(diff(&twice, &old.digest), Err(r) if r == 0 || r == 2));
        // Against the empty state: every row, or the row whose key appears twice.
        let empty = Digest::empty(&DataType::Int64);
        let d = diff(&new, &empty).unwrap();
        assert_eq!((d.upserts, d.deletes), (Upserts::All, vec![]));
        assert!(matches!(diff(&twice, &empty), Err(r) if r == 0 || r == 2));
    }

    /// A digest's keys come back in key order, negative and extreme ones included, for a
    /// 64-bit key (rebuilt from the sorted form) as for a narrower one (gathered).
    #[test]
    fn sorted_keys_come_back_in_key_order() {
        let keys = vec![5, -3, 0, i64::MIN, i64::MAX, -1];
        let d = of_batch(&batch(keys.clone(), vec![None; 6]), 0)
            .unwrap()
            .unwrap();
        let mut want = keys.clone();
        want.sort();
        let got = d.digest.sorted_keys().unwrap();
        assert_eq!(
            got.as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .values(),
            &want[..]
        );
        // Saved as sorted (no key column of its own: rebuilt from the sorted form), with
        // the hashes in the same order.
        let (ordered, hashes) = (d.digest.ordered.clone(), d.digest.hashes.clone());
        let (kept_order, kept, own) = d.digest.into_parts().unwrap();
        assert_eq!((kept_order, kept), (ordered, hashes));
        assert!(own.is_none());
        let narrow = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)])),
            vec![Arc::new(deltalake::arrow::array::Int32Array::from(vec![
                4, -2, 9,
            ]))],
        )
        .unwrap();
        let d = of_batch(&narrow, 0).unwrap().unwrap();
        let got = d.digest.sorted_keys().unwrap();
        assert_eq!(
            got.as_primitive::<deltalake::arrow::datatypes::Int32Type>()
                .values(),
            &[-2, 4, 9]
        );
        // A narrow key is saved with its own column too, and read back from it.
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), 1, "f", "k", d.digest).unwrap();
        let loaded = load(dir.path(), 1, "f").unwrap();
        assert!(matches!(loaded.keys, Keys::Sorted(_)));
        assert_eq!(
            loaded
                .keys_at(&[2, 0])
                .unwrap()
                .as_primitive::<deltalake::arrow::datatypes::Int32Type>()
                .values(),
            &[9, -2]
        );
        // Keys at sorted positions: a narrow key in pieces (gathered from them), a 64-bit
        // one (rebuilt from its sorted form) and one loaded from a file (as read).
        let pieces = of_pieces(&[narrow.slice(0, 1), narrow.slice(1, 2)], 0)
            .unwrap()
            .unwrap();
        let got = pieces.digest.keys_at(&[2, 0]).unwrap();
        assert_eq!(
            got.as_primitive::<deltalake::arrow::datatypes::Int32Type>()
                .values(),
            &[9, -2]
        );
        let wide = of_batch(&batch(keys, vec![None; 6]), 0).unwrap().unwrap();
        let got = wide.digest.keys_at(&[5, 0]).unwrap();
        let at = |g: &ArrayRef| {
            g.as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        };
        assert_eq!(at(&got), vec![i64::MAX, i64::MIN]);
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), 1, "f", "k", wide.digest).unwrap();
        let loaded = load(dir.path(), 1, "f").unwrap();
        assert_eq!(
            at(&loaded.keys_at(&[5, 0]).unwrap()),
            vec![i64::MAX, i64::MIN]
        );
    }

    /// The digest of a snapshot in pieces is the digest of the same rows in one batch, and a
    /// snapshot of nothing but its key has a hash per row.
    #[test]
    fn pieces_digest_like_one_batch() {
        let whole = batch(
            vec![9, 3, 7, 1, 5],
            vec![Some("i"), None, Some("g"), Some("a"), Some("")],
        );
        let pieces = [whole.slice(0, 2), whole.slice(2, 0), whole.slice(2, 3)];
        let one = of_batch(&whole, 0).unwrap().unwrap();
        let many = of_pieces(&pieces, 0).unwrap().unwrap();
        assert_eq!(one.digest.ordered, many.digest.ordered);
        assert_eq!(one.digest.hashes, many.digest.hashes);
        assert_eq!(one.rows, many.rows);
        let keys_only = whole.project(&[0]).unwrap();
        let d = of_pieces(&[keys_only.slice(0, 3), keys_only.slice(3, 2)], 0)
            .unwrap()
            .unwrap();
        assert_eq!(d.digest.hashes.len(), 5);
    }

    /// Hashes do not depend on how the rows are cut: one batch or pieces, one thread or
    /// several (a large batch is cut into one share per thread).
    #[test]
    fn hashes_do_not_depend_on_pieces_or_threads() {
        let names: Vec<Option<&str>> = (0..7).map(|i| [Some("a"), None, Some("")][i % 3]).collect();
        let whole = batch((0..7).collect(), names);
        let want = piece_hashes(std::slice::from_ref(&whole), 0, 1).unwrap();
        for threads in [2, 3, 8] {
            let one = piece_hashes(std::slice::from_ref(&whole), 0, threads).unwrap();
            assert_eq!(one, want, "{threads} thread(s)");
            let pieces = [whole.slice(0, 5), whole.slice(5, 0), whole.slice(5, 2)];
            assert_eq!(
                piece_hashes(&pieces, 0, threads).unwrap(),
                want,
                "{threads} thread(s)"
            );
        }
    }

    /// A NULL, an empty string and a string differ; equal rows hash equal.
    #[test]
    fn hashes_tell_null_from_empty() {
        let b = batch(vec![1, 2, 3, 4], vec![None, Some(""), Some("x"), None]);
        let h = piece_hashes(&[b], 0, 1).unwrap();
        assert_ne!(h[0], h[1]);
        assert_ne!(h[1], h[2]);
        assert_eq!(h[0], h[3]);
    }

    #[test]
    fn keys_come_back_from_their_gaps_in_the_narrowest_type() {
        let cases: [(&[u64], DataType); 5] = [
            (&[], DataType::UInt8),
            (&[7], DataType::UInt8),
            (
                &[1 << 63, (1 << 63) + 1, (1 << 63) + 3, (1 << 63) + 300],
                DataType::UInt16,
            ),
            (&[5, 5, 70_005], DataType::UInt32),
            (&[0, u64::MAX], DataType::UInt64),
        ];
        for (keys, width) in cases {
            assert_eq!(gap_type(keys), width, "{keys:?}");
            // Cut in two anywhere, the halves' gaps lay the keys out again.
            for cut in 0..=keys.len() {
                let first = keys.first().copied().unwrap_or(0);
                let mut back = Vec::new();
                let mut last = first;
                for range in [0..cut, cut..keys.len()] {
                    let gaps = gaps_in(keys, range.clone(), &width);
                    assert_eq!(gaps.len(), range.len());
                    last = keys_from_gaps(last, gaps.as_ref(), &mut back).unwrap();
                }
                assert_eq!(back, keys);
            }
        }
        // Gaps that leave 64 bits, or of another type, are not a digest this code wrote.
        let mut out = Vec::new();
        assert!(keys_from_gaps(1, &UInt64Array::from(vec![0, u64::MAX]), &mut out).is_none());
        assert!(keys_from_gaps(0, &Int64Array::from(vec![0]), &mut out).is_none());
    }

    #[test]
    fn a_digest_whose_count_its_file_cannot_hold_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let d = of_batch(&batch(vec![2, 1], vec![Some("b"), None]), 0)
            .unwrap()
            .unwrap()
            .digest;
        save(dir.path(), 1, "f", "k", d).unwrap();
        assert_eq!(load(dir.path(), 1, "f").unwrap().ordered.len(), 2);
        // The same file with its count raised past what its bytes can hold: ignored (and
        // nothing of that size reserved), as a cache that cannot be read is.
        let path = file_of(dir.path(), 1);
        let file = std::fs::File::open(&path).unwrap();
        let reader = FileReader::try_new(BufReader::new(file), None).unwrap();
        let mut meta = reader.schema().metadata().clone();
        let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
        meta.insert(KEY_COUNT.to_string(), (1u64 << 60).to_string());
        let schema = Arc::new(batches[0].schema().as_ref().clone().with_metadata(meta));
        let out = std::fs::File::create(&path).unwrap();
        let mut w = FileWriter::try_new(out, &schema).unwrap();
        for b in batches {
            let b = RecordBatch::try_new(schema.clone(), b.columns().to_vec()).unwrap();
            w.write(&b).unwrap();
        }
        w.finish().unwrap();
        assert!(load(dir.path(), 1, "f").is_none());
    }

    #[test]
    fn a_saved_digest_of_narrower_keys_keeps_their_column_across_batches() {
        use deltalake::arrow::array::Int32Array;
        let n = 1000;
        let keys: Vec<i32> = (0..n).map(|i| (i * 7919) % 100_003 - 50_000).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("v", DataType::Int32, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(keys.clone())),
            Arc::new(Int32Array::from_iter((0..n).map(Some))),
        ];
        let digest = || {
            let b = RecordBatch::try_new(schema.clone(), columns.clone()).unwrap();
            of_batch(&b, 0).unwrap().unwrap().digest
        };
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), 1, "f", "k", digest()).unwrap();
        let back = load(dir.path(), 1, "f").unwrap();
        let made = digest();
        assert_eq!(back.ordered, made.ordered);
        assert_eq!(back.hashes, made.hashes);
        let all: Vec<u32> = (0..n as u32).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        let read = back.keys_at(&all).unwrap();
        assert_eq!(
            read.as_primitive::<deltalake::arrow::datatypes::Int32Type>()
                .values()
                .to_vec(),
            sorted
        );
    }

    #[test]
    fn a_saved_digest_loads_only_for_its_version_and_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let digest = || {
            of_batch(&batch(vec![2, 1], vec![Some("b"), None]), 0)
                .unwrap()
                .unwrap()
                .digest
        };
        save(dir.path(), 4, "f", "k", digest()).unwrap();
        assert!(load(dir.path(), 3, "f").is_none());
        assert!(load(dir.path(), 4, "g").is_none());
        let back = load(dir.path(), 4, "f").unwrap();
        assert_eq!(back.ordered, digest().ordered);
        assert_eq!(back.hashes, digest().hashes);
        save(dir.path(), 5, "f", "k", digest()).unwrap();
        assert!(load(dir.path(), 4, "f").is_none());
        assert_eq!(load(dir.path(), 5, "f").unwrap().ordered.len(), 2);
        // Each save rewrites the previous digest's file: a longer digest, then a shorter one
        // (the file is cut to length), read back exactly; no other file is left.
        let sized = |n: i64| {
            of_batch(&batch((0..n).collect(), vec![Some("v"); n as usize]), 0)
                .unwrap()
                .unwrap()
                .digest
        };
        for (v, n) in [(6, 1000), (7, 3), (8, 500)] {
            let d = sized(n);
            let (ordered, hashes) = (d.ordered.clone(), d.hashes.clone());
            save(dir.path(), v, "f", "k", d).unwrap();
            let back = load(dir.path(), v, "f").unwrap();
            assert_eq!(back.ordered, ordered);
            assert_eq!(back.hashes, hashes);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
            let fresh = tempfile::tempdir().unwrap();
            save(fresh.path(), v, "f", "k", sized(n)).unwrap();
            let len = |d: &Path| std::fs::metadata(file_of(d, v)).unwrap().len();
            assert_eq!(len(dir.path()), len(fresh.path()));
        }
    }
}
