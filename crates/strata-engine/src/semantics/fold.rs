//! The fold of `strata-core` over Arrow data.
//!
//! Input: one [`RecordBatch`] of events in the event-store layout (output columns, then
//! `__strata_seq`, `__strata_op`, `__strata_run`). Output: the target rows of every key the
//! batch holds. Events are row indices; values are row indices too, so nothing is copied
//! until the output columns are gathered with `take` at the end.
//!
//! Comparisons go through Arrow's row format, which orders every Arrow type (structs
//! included) the way the SQL `ORDER BY` would, and makes equality a byte comparison.

use crate::error::{Context, EngineError, Result};
use crate::util::arrow::Ordered;
use crate::util::threads::per_column;
use deltalake::arrow::array::{make_comparator, DynComparator};
use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, Int8Array, RecordBatch, StringArray, UInt32Array,
};
use deltalake::arrow::compute::take;
use deltalake::arrow::compute::SortOptions;
use deltalake::arrow::datatypes::Int64Type;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::cmp::Ordering;
use std::sync::Arc;
use strata_core::{EventKind, EventModel, FoldOptions};

pub(crate) const SEQ_COL: &str = "__strata_seq";
pub(crate) const OP_COL: &str = "__strata_op";
pub(crate) const RUN_COL: &str = "__strata_run";
pub(crate) const START_COL: &str = "__START_AT";
pub(crate) const END_COL: &str = "__END_AT";

/// What the fold needs to know about a flow's columns, as indices into the event batch.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct FoldSpec {
    /// Output columns (event-store columns `0..n_out`).
    pub n_out: usize,
    pub keys: Vec<usize>,
    /// Tracked output columns (SCD2); all of them without `TRACK HISTORY`.
    pub tracked: Vec<usize>,
    pub scd2: bool,
    pub options: FoldOptions,
    pub flow: String,
}

/// A version's values: one event's row, or (after `IGNORE NULL UPDATES` filled some NULLs
/// from older versions) a row index per output column.
#[derive(Debug, Clone)]
enum Values {
    One(u32),
    Mixed(Arc<[u32]>),
}

impl Values {
    fn source(&self, col: usize) -> u32 {
        match self {
            Values::One(i) => *i,
            Values::Mixed(v) => v[col],
        }
    }
}

struct ArrowModel<'a> {
    batch: &'a RecordBatch,
    spec: &'a FoldSpec,
    ops: &'a Int8Array,
    /// Sequence values in a form that compares fast: sorting compares them millions of times.
    seq: Ordered,
    /// One equality test per output column. Values are compared far less often than
    /// sequences (once per upsert), so these save the memory a row-format copy would take.
    columns: Vec<ColumnEq<'a>>,
    /// The tracked columns, and all output columns, in the order to compare them: fixed-width
    /// ones first, as they are cheap and a difference anywhere settles the answer. Key
    /// columns are left out: the fold only compares events of one key.
    tracked: Vec<usize>,
    all: Vec<usize>,
}

impl<'a> ArrowModel<'a> {
    fn new(batch: &'a RecordBatch, spec: &'a FoldSpec, ops: &'a Int8Array) -> Result<Self> {
        let seq = Ordered::of(batch.column(spec.n_out), None)?;
        // NULLs compare equal to NULLs: an update from NULL to NULL is no change.
        let options = SortOptions::default();
        let columns = (0..spec.n_out)
            .map(|i| {
                let c = batch.column(i);
                if let Some(s) = c.as_string_opt::<i32>() {
                    return Ok(ColumnEq::Utf8(s));
                }
                if let Some(v) = c.as_primitive_opt::<Int64Type>() {
                    return Ok(ColumnEq::Int64(v));
                }
                make_comparator(c.as_ref(), c.as_ref(), options)
                    .map(ColumnEq::Other)
                    .context(|| format!("comparing values of {}", batch.schema().field(i).name()))
            })
            .collect::<Result<Vec<_>>>()?;
        let cheap_first = |cols: &[usize]| {
            let mut cols: Vec<usize> = cols
                .iter()
                .copied()
                .filter(|c| !spec.keys.contains(c))
                .collect();
            cols.sort_by_key(|&c| !batch.column(c).data_type().is_primitive());
            cols
        };
        let all: Vec<usize> = (0..spec.n_out).collect();
        Ok(ArrowModel {
            batch,
            spec,
            ops,
            seq,
            columns,
            tracked: cheap_first(&spec.tracked),
            all: cheap_first(&all),
        })
    }

    fn column_eq(&self, c: usize, a: u32, b: u32) -> bool {
        a == b || self.columns[c].eq(a as usize, b as usize)
    }
}

/// Equality of two values of one column (NULL equals NULL), without a dynamic call for the
/// most common column types.
enum ColumnEq<'a> {
    Utf8(&'a StringArray),
    Int64(&'a Int64Array),
    Other(DynComparator),
}

impl ColumnEq<'_> {
    fn eq(&self, a: usize, b: usize) -> bool {
        match self {
            ColumnEq::Utf8(s) => match (s.is_null(a), s.is_null(b)) {
                (false, false) => s.value(a).as_bytes() == s.value(b).as_bytes(),
                (x, y) => x == y,
            },
            ColumnEq::Int64(v) => match (v.is_null(a), v.is_null(b)) {
                (false, false) => v.value(a) == v.value(b),
                (x, y) => x == y,
            },
            ColumnEq::Other(cmp) => cmp(a, b) == Ordering::Equal,
        }
    }
}

impl EventModel for ArrowModel<'_> {
    type Event = u32;
    type Values = Values;

    fn kind(&self, e: u32) -> EventKind {
        EventKind::from_code(self.ops.value(e as usize)).unwrap_or(EventKind::Upsert)
    }

    fn seq_cmp(&self, a: u32, b: u32) -> Ordering {
        self.seq.cmp(a, b)
    }

    fn values(&self, e: u32) -> Values {
        Values::One(e)
    }

    fn fill(&self, new: Values, old: &Values) -> Values {
        let merged: Vec<u32> = (0..self.spec.n_out)
            .map(|c| {
                let n = new.source(c);
                if self.batch.column(c).is_null(n as usize) {
                    old.source(c)
                } else {
                    n
                }
            })
            .collect();
        Values::Mixed(merged.into())
    }

    fn tracked_eq(&self, a: &Values, b: &Values) -> bool {
        self.tracked
            .iter()
            .all(|&c| self.column_eq(c, a.source(c), b.source(c)))
    }

    fn identical(&self, a: u32, b: u32) -> bool {
        self.ops.value(a as usize) == self.ops.value(b as usize)
            && self.all.iter().all(|&c| self.column_eq(c, a, b))
    }
}

/// Renders the key of row `i` for messages: `userId=123`.
pub(crate) fn describe_key(batch: &RecordBatch, keys: &[usize], i: usize) -> String {
    keys.iter()
        .map(|&k| {
            format!(
                "{}={}",
                batch.schema().field(k).name(),
                render(batch.column(k), i)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn render(array: &ArrayRef, i: usize) -> String {
    let options = FormatOptions::default().with_null("NULL");
    match ArrayFormatter::try_new(array.as_ref(), &options) {
        Ok(f) => f.value(i).to_string(),
        Err(_) => "?".to_string(),
    }
}

/// The output of folding one part of the keys: for each output column the event row its
/// value comes from, and for SCD type 2 the event rows of each version's start and end.
#[derive(Default)]
struct Folded {
    /// One list per output column, or a single one for all when every value of a version
    /// comes from one event (always, unless `IGNORE NULL UPDATES` mixes them).
    value_idx: Vec<Vec<u32>>,
    starts: Vec<u32>,
    ends: Vec<Option<u32>>,
    groups: usize,
}

/// How a part's events are sorted into key order (see `sort_part`).
enum SortBy<'a> {
    /// A single integer-like key (with an integer-like sequence): sorted on the key here,
    /// each key's events by sequence in `order_events`.
    Ints(&'a [u64]),
    /// Key columns, then the sequence, in Arrow's row format.
    Rows(deltalake::arrow::row::Rows),
}

/// Folds every key of `events` into target rows with schema `target`; also returns how many
/// keys the events hold.
///
/// `events` may hold events of any arrival order, old and new; truncates (NULL keys) are
/// applied to every key.
pub(crate) fn fold_batch(
    events: &RecordBatch,
    spec: &FoldSpec,
    target: &SchemaRef,
) -> Result<(RecordBatch, usize)> {
    let parts = crate::util::threads::threads_for(events.num_rows());
    fold_batch_in(events, spec, target, parts)
}

/// [`fold_batch`] with the keys split into `parts` parts folded side by side.
///
/// ```text
///  keys, sequences ─▶ split_ranges ─▶ sort_part ─▶ fold_part ─▶ gather_rows
///  (comparable form)  (by key hash)   (per part,   (per part,   (the parts' value
///                                      on threads)  on threads)  positions into columns)
/// ```
///
/// The phases are called once per part: the per-event loops stay inside them.
fn fold_batch_in(
    events: &RecordBatch,
    spec: &FoldSpec,
    target: &SchemaRef,
    parts: usize,
) -> Result<(RecordBatch, usize)> {
    let ops = events
        .column(spec.n_out + 1)
        .as_any()
        .downcast_ref::<Int8Array>()
        .ok_or_else(|| EngineError::internal("event store op column is not Int8"))?;
    let steps = crate::util::steps::Steps::new(&spec.flow, "fold: ");
    let step = |what: &str| crate::util::steps::step!(debug, steps, what);
    let model = ArrowModel::new(events, spec, ops)?;
    let key_cols: Vec<ArrayRef> = spec
        .keys
        .iter()
        .map(|&i| events.column(i).clone())
        .collect();
    let is_truncate = |i: usize| ops.value(i) == EventKind::Truncate.code();
    // One key column of an integer-like type: keys and sequences compare as integers.
    let keys = match (key_cols.as_slice(), &model.seq) {
        ([key], Ordered::Int(_)) => Ordered::of(key, Some(&is_truncate))?,
        _ => Ordered::Rows(crate::util::arrow::rows(&key_cols)?),
    };

    // Truncates (R3): in SCD type 1 everything at or below the newest one is dropped; in SCD
    // type 2 each is a delete of every key, added to each key's events.
    let (watermark, truncates): (Option<u32>, Vec<u32>) = match spec.scd2 {
        false => (
            strata_core::truncate_watermark(&model, 0..events.num_rows() as u32),
            Vec::new(),
        ),
        true => (
            None,
            (0..events.num_rows())
                .filter(|&i| is_truncate(i))
                .map(|i| i as u32)
                .collect(),
        ),
    };
    step("keys and sequences in comparable form");
    // Keys are independent: split them into parts by a hash of the key, and sort and fold
    // the parts side by side.
    let partitions = keys.split_ranges(
        (0..events.num_rows() as u32).filter(|&i| model.kind(i) != EventKind::Truncate),
        parts,
    );
    step("split into parts");
    // Sort every part by key: a single integer-like key by a stable radix sort (arrival order
    // within a key, sequences ordered per key by `order_events`); else by (key, sequence,
    // arrival) with one row-format value per event, whose order is a memcmp.
    let sort_by = match (&keys, &model.seq) {
        (Ordered::Int(k), Ordered::Int(_)) => SortBy::Ints(k),
        _ => {
            let mut sort_cols = key_cols.clone();
            sort_cols.push(events.column(spec.n_out).clone());
            SortBy::Rows(crate::util::arrow::rows(&sort_cols)?)
        }
    };
    let partitions =
        crate::util::threads::on_threads(partitions, "sort", |order| sort_part(&sort_by, order))?
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
    drop(sort_by);
    step("sorted");
    let lanes = if spec.options.ignore_null_updates {
        spec.n_out
    } else {
        1
    };
    let truncated = Truncated {
        watermark,
        truncates: &truncates,
    };
    let folded = crate::util::threads::on_threads(partitions, "fold", |order| {
        fold_part(&model, &keys, &truncated, lanes, order)
    })?;
    step("folded the parts");
    let (rows, groups) = gather_rows(events, spec, target, parts, lanes, folded)?;
    step("gathered the output columns");
    Ok((rows, groups))
}

/// One part's events (`order`) sorted into key order.
fn sort_part(sort_by: &SortBy<'_>, mut order: Vec<u32>) -> Result<Vec<u32>> {
    match sort_by {
        // Already in key order (events sorted by `columns_in_key_order`): nothing to do.
        SortBy::Ints(k)
            if order
                .windows(2)
                .all(|w| k[w[0] as usize] <= k[w[1] as usize]) => {}
        SortBy::Ints(k) => {
            // By key only, keeping arrival order within a key (a stable radix sort):
            // `order_events` then sorts each key's few events by sequence, which for
            // events that mostly arrive in sequence order is a check, not a sort.
            order = sorted_by_int_key(k, &order)?;
        }
        SortBy::Rows(rows) => order.sort_unstable_by(|&a, &b| {
            rows.row(a as usize)
                .cmp(&rows.row(b as usize))
                .then(a.cmp(&b))
        }),
    }
    Ok(order)
}

/// How truncates (R3) act on every key of a fold.
struct Truncated<'a> {
    /// SCD type 1: the newest truncate, at or below which every event is dropped.
    watermark: Option<u32>,
    /// SCD type 2: every truncate, a delete of each key at its sequence.
    truncates: &'a [u32],
}

/// Folds one part's events (`order`, in key order) key by key: truncated events dropped
/// (SCD type 1) or the truncates added as deletes (SCD type 2), each key's events ordered
/// by sequence, then its versions.
fn fold_part(
    model: &ArrowModel<'_>,
    keys: &Ordered,
    truncated: &Truncated<'_>,
    lanes: usize,
    order: Vec<u32>,
) -> Result<Folded> {
    let (events, spec) = (model.batch, model.spec);
    let mut out = Folded {
        value_idx: vec![Vec::new(); lanes],
        ..Default::default()
    };
    let mut group: Vec<u32> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        out.groups += 1;
        let mut j = i + 1;
        while j < order.len() && keys.eq(order[i], order[j]) {
            j += 1;
        }
        group.clear();
        group.extend_from_slice(&order[i..j]);
        group.extend_from_slice(truncated.truncates);
        strata_core::drop_truncated(model, &mut group, truncated.watermark);
        strata_core::order_events(model, &mut group).map_err(|tie| {
            EngineError::BadInput(format!(
                "flow {}: two different upserts for key ({}) at the same sequence value {}; \
                 make the sequence unique per key or remove one of them",
                spec.flow,
                describe_key(events, &spec.keys, tie.first as usize),
                render(events.column(spec.n_out), tie.first as usize),
            ))
        })?;
        let value_idx = &mut out.value_idx;
        let mut push = |values: &Values| {
            for (c, idx) in value_idx.iter_mut().enumerate() {
                idx.push(values.source(c));
            }
        };
        if spec.scd2 {
            for v in strata_core::fold_scd2(model, &group, spec.options) {
                push(&v.values);
                out.starts.push(v.start);
                out.ends.push(v.end);
            }
        } else if let Some(values) = strata_core::fold_scd1(model, &group, spec.options) {
            push(&values);
        }
        i = j;
    }
    Ok(out)
}

/// The target rows of the folded parts (their values taken from `events`, `parts` columns
/// at a time), and how many keys they hold.
fn gather_rows(
    events: &RecordBatch,
    spec: &FoldSpec,
    target: &SchemaRef,
    parts: usize,
    lanes: usize,
    folded: Vec<Result<Folded>>,
) -> Result<(RecordBatch, usize)> {
    let mut value_idx: Vec<Vec<u32>> = vec![Vec::new(); lanes];
    let mut starts: Vec<u32> = Vec::new();
    let mut ends: Vec<Option<u32>> = Vec::new();
    let mut groups = 0;
    for part in folded {
        let part = part?;
        groups += part.groups;
        for (all, mine) in value_idx.iter_mut().zip(part.value_idx) {
            all.extend(mine);
        }
        starts.extend(part.starts);
        ends.extend(part.ends);
    }

    let value_idx: Vec<UInt32Array> = value_idx.into_iter().map(UInt32Array::from).collect();
    let mut jobs: Vec<(&ArrayRef, UInt32Array)> = (0..spec.n_out)
        .map(|c| (events.column(c), value_idx[c % lanes].clone()))
        .collect();
    drop(value_idx);
    if spec.scd2 {
        let seq = events.column(spec.n_out);
        jobs.push((seq, UInt32Array::from(starts)));
        jobs.push((seq, UInt32Array::from(ends)));
    }
    let columns = gather(jobs, parts)?;
    let rows = RecordBatch::try_new(target.clone(), columns).context(|| {
        format!(
            "flow {}: folded rows do not match the target schema",
            spec.flow
        )
    })?;
    Ok((rows, groups))
}

/// `order` (positions into `keys`) sorted by key, stably (`util/sort.rs`, on this thread).
pub(crate) fn sorted_by_int_key(keys: &[u64], order: &[u32]) -> Result<Vec<u32>> {
    let values: Vec<u64> = order.iter().map(|&i| keys[i as usize]).collect();
    Ok(crate::util::sort::sorted_rows(values, 1)?
        .into_iter()
        .map(|p| order[p as usize])
        .collect())
}

/// `take` of every (column, indices) job, on up to `threads` threads, in job order.
fn gather(jobs: Vec<(&ArrayRef, UInt32Array)>, threads: usize) -> Result<Vec<ArrayRef>> {
    per_column(jobs, threads, |(a, idx)| take_column(a, idx))
}

/// The rows of `pieces` (batches of one schema, `width` columns) as one set of columns in
/// the order of column `key`, arrival order kept within a key, when `key` is integer-like
/// without NULLs; `None` otherwise. Each column is concatenated and gathered in its own
/// turn, its pieces let go as soon as it is done, so that memory grows by about one column.
/// The fold (and the event store after it) then walks the events in memory order.
pub(crate) fn columns_in_key_order(
    pieces: Vec<RecordBatch>,
    width: usize,
    key: usize,
) -> Result<std::result::Result<Vec<ArrayRef>, Vec<RecordBatch>>> {
    let key_parts: Vec<ArrayRef> = pieces.iter().map(|b| b.column(key).clone()).collect();
    let key_column = crate::util::arrow::concat_arrays(&key_parts)?;
    drop(key_parts);
    let Ordered::Int(k) = Ordered::of(&key_column, None)? else {
        return Ok(Err(pieces));
    };
    let parts = crate::util::threads::threads_for(k.len());
    let idx = UInt32Array::from(crate::util::sort::sorted_rows(k, parts)?);
    // Columns moved out of the pieces, dealt to one lane per core.
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::with_capacity(pieces.len()); width];
    for b in pieces {
        for (c, a) in b.columns().iter().enumerate().take(width) {
            columns[c].push(a.clone());
        }
    }
    let gathered = per_column(columns, parts, |col: Vec<ArrayRef>| {
        let whole = crate::util::arrow::concat_arrays(&col)?;
        drop(col);
        take_column(&whole, idx.clone())
    })?;
    Ok(Ok(gathered))
}

fn take_column(array: &ArrayRef, idx: UInt32Array) -> Result<ArrayRef> {
    if let Some(gathered) = crate::util::gather::take_bytes(array, &idx) {
        return Ok(gathered);
    }
    take(array.as_ref(), &idx, None).context(|| "gathering output rows".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};

    /// The sort by key keeps the input order among equal keys, for keys close together, far
    /// apart (more digits), and all equal.
    #[test]
    fn radix_sort_is_a_stable_sort_by_key() {
        let mut x: u64 = 7;
        for spread in [1_000u64, u64::MAX, 0] {
            let items: Vec<(u64, u32)> = (0..50_000u32)
                .map(|i| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = if spread == 0 {
                        5
                    } else {
                        (1 << 63) + (x >> 1) % spread
                    };
                    (k, i)
                })
                .collect();
            let mut expected = items.clone();
            expected.sort_by_key(|&(k, _)| k); // stable
            let keys: Vec<u64> = items.iter().map(|&(k, _)| k).collect();
            let order: Vec<u32> = items.iter().map(|&(_, i)| i).collect();
            let got: Vec<(u64, u32)> = sorted_by_int_key(&keys, &order)
                .unwrap()
                .into_iter()
                .map(|i| (keys[i as usize], i))
                .collect();
            assert_eq!(got, expected, "spread {spread}");
        }
        assert!(sorted_by_int_key(&[], &[]).unwrap().is_empty());
    }

    /// Folding the keys in parts (threads) gives the rows one part gives, for SCD type 1 and
    /// 2, with deletes, late events and a truncate.
    #[test]
    fn folding_in_parts_equals_folding_whole() {
        let n = 20_000usize;
        let mut ids = Vec::new();
        let mut vals = Vec::new();
        let mut seqs = Vec::new();
        let mut ops: Vec<i8> = Vec::new();
        let mut x: u64 = 42;
        for i in 0..n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ids.push(Some((x >> 33) as i64 % 997));
            vals.push(Some((x >> 20) as i64 % 7));
            // Unique sequence per event, in shuffled order (late events).
            seqs.push(((i * 7919) % n) as i64 + 10);
            ops.push(if (x >> 40).is_multiple_of(10) { 1 } else { 0 });
        }
        // One truncate in the middle of the sequence range.
        ids.push(None);
        vals.push(None);
        seqs.push((n / 2) as i64);
        ops.push(2);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
            Field::new(SEQ_COL, DataType::Int64, true),
            Field::new(OP_COL, DataType::Int8, true),
            Field::new(RUN_COL, DataType::Int64, true),
        ]));
        let rows = ids.len();
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(Int64Array::from(vals)),
                Arc::new(Int64Array::from(seqs)),
                Arc::new(Int8Array::from(ops)),
                Arc::new(Int64Array::from(vec![0i64; rows])),
            ],
        )
        .unwrap();
        for scd2 in [false, true] {
            let spec = FoldSpec {
                n_out: 2,
                keys: vec![0],
                tracked: vec![0, 1],
                scd2,
                options: FoldOptions::default(),
                flow: "f".into(),
            };
            let mut fields = vec![
                Field::new("id", DataType::Int64, true),
                Field::new("v", DataType::Int64, true),
            ];
            if scd2 {
                fields.push(Field::new(START_COL, DataType::Int64, true));
                fields.push(Field::new(END_COL, DataType::Int64, true));
            }
            let target = Arc::new(Schema::new(fields));
            let sorted = |b: &RecordBatch| {
                let rows = crate::util::arrow::rows(b.columns()).unwrap();
                let mut v: Vec<Vec<u8>> = (0..b.num_rows())
                    .map(|i| rows.row(i).data().to_vec())
                    .collect();
                v.sort();
                v
            };
            let (whole, g1) = fold_batch_in(&events, &spec, &target, 1).unwrap();
            let (split, g4) = fold_batch_in(&events, &spec, &target, 4).unwrap();
            assert_eq!(g1, g4);
            assert!(whole.num_rows() > 100, "scd2={scd2}: {}", whole.num_rows());
            assert_eq!(sorted(&whole), sorted(&split), "scd2={scd2}");
        }
    }
}
