//! Snapshots as pure functions over Arrow batches: grouping a delivery by version, the
//! difference between a snapshot and a state (upserts, deletes), and the events, markers
//! and pins that record it (the rules are in `ops/cdc/snapshot.rs` and docs/history.md).

use crate::error::{Context, EngineError, Result};
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold;
use crate::util::arrow;
use crate::util::arrow::Ordered;
use ahash::AHashMap;
use ahash::AHashSet;
use deltalake::arrow::array::new_null_array;
use deltalake::arrow::array::ArrayRef;
use deltalake::arrow::array::BooleanArray;
use deltalake::arrow::array::Int64Array;
use deltalake::arrow::array::Int8Array;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::array::UInt32Array;
use deltalake::arrow::compute;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::scalar::ScalarValue;
use std::sync::Arc;

/// Op code of a marker event: "version `seq` was delivered by run `run`".
pub(crate) const OP_MARKER: i8 = 3;

/// One snapshot's rows (data columns): the pieces they arrived in, put into one batch only
/// when something needs them so (a 10M-row snapshot diffed by digest never is).
pub(crate) struct Snap {
    pub(crate) schema: SchemaRef,
    pub(crate) pieces: Vec<RecordBatch>,
    pub(crate) whole: std::sync::OnceLock<RecordBatch>,
}

impl Snap {
    pub(crate) fn new(schema: SchemaRef, pieces: Vec<RecordBatch>) -> Self {
        Snap {
            schema,
            pieces,
            whole: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn num_rows(&self) -> usize {
        self.pieces.iter().map(RecordBatch::num_rows).sum()
    }

    /// The rows as one batch.
    pub(crate) fn batch(&self) -> Result<&RecordBatch> {
        if self.whole.get().is_none() {
            let b = match self.pieces.as_slice() {
                [one] => one.clone(),
                _ => {
                    concat_batches(&self.schema, &self.pieces).context(|| "snapshot rows".into())?
                }
            };
            let _ = self.whole.set(b);
        }
        self.whole
            .get()
            .ok_or_else(|| EngineError::internal("snapshot rows"))
    }

    /// Rows `idx` (positions over all pieces), in that order.
    pub(crate) fn take(&self, idx: &[u32]) -> Result<RecordBatch> {
        if self.pieces.len() == 1 || idx.len() == self.num_rows() {
            return take_rows(self.batch()?, idx);
        }
        let mut starts = Vec::with_capacity(self.pieces.len());
        let mut at = 0usize;
        for b in &self.pieces {
            starts.push(at);
            at += b.num_rows();
        }
        let at: Vec<(usize, usize)> = idx
            .iter()
            .map(|&i| {
                let p = starts.partition_point(|&s| s <= i as usize) - 1;
                (p, i as usize - starts[p])
            })
            .collect();
        let refs: Vec<&RecordBatch> = self.pieces.iter().collect();
        compute::interleave_record_batch(&refs, &at).context(|| "snapshot rows".into())
    }

    /// [`make_events`] of every row, in order: one batch per piece, sharing its columns.
    pub(crate) fn all_events(
        &self,
        setup: &FlowSetup,
        v: &ScalarValue,
        op: i8,
        run: i64,
    ) -> Result<Vec<RecordBatch>> {
        let longest = self.pieces.iter().map(RecordBatch::num_rows).max();
        let shared = EventColumns::new(setup, v, op, run, longest.unwrap_or(0))?;
        self.pieces
            .iter()
            .filter(|p| p.num_rows() > 0)
            .map(|p| shared.events_of(setup, p.columns()[..setup.spec.n_out].to_vec()))
            .collect()
    }

    /// [`make_events`] of rows `idx`. Every row (`idx` as long as the snapshot: every key new
    /// or changed) is the rows in the order they came, as [`take_rows`] keeps a batch taken
    /// whole: one batch per piece, sharing its columns. (A first snapshot's diff says "every
    /// row" without a list, and its caller takes [`Snap::all_events`] directly.)
    pub(crate) fn events(
        &self,
        setup: &FlowSetup,
        idx: &[u32],
        v: &ScalarValue,
        op: i8,
        run: i64,
    ) -> Result<Vec<RecordBatch>> {
        if idx.len() == self.num_rows() {
            return self.all_events(setup, v, op, run);
        }
        if self.pieces.len() == 1 || self.whole.get().is_some() {
            return Ok(vec![make_events(setup, self.batch()?, idx, v, op, run)?]);
        }
        let rows = self.take(idx)?;
        let data = rows.columns()[..setup.spec.n_out].to_vec();
        Ok(vec![events_of(setup, data, v, op, run)?])
    }
}

/// A snapshot's rows grouped by version, ascending.
pub(crate) struct Versions {
    /// (version, row indices of the snapshot rows)
    pub(crate) groups: Vec<(ScalarValue, Vec<u32>)>,
}

pub(crate) fn render_version(v: &ScalarValue) -> String {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => s.clone(),
        other => other.to_string(),
    }
}

/// The version of every row of `pieces` when they all have the same one (and there is a
/// row), else `None`.
pub(crate) fn one_version(
    setup: &FlowSetup,
    pieces: &[RecordBatch],
) -> Result<Option<ScalarValue>> {
    let Some(first) = pieces.iter().find(|b| b.num_rows() > 0) else {
        return Ok(None);
    };
    let v = ScalarValue::try_from_array(first.column(setup.spec.n_out), 0)
        .context(|| "reading a snapshot version".into())?;
    let scalar = v
        .to_scalar()
        .context(|| "reading a snapshot version".into())?;
    for b in pieces {
        let same = deltalake::arrow::compute::kernels::cmp::not_distinct(
            b.column(setup.spec.n_out),
            &scalar,
        )
        .context(|| "grouping snapshot versions".into())?;
        if same.true_count() != b.num_rows() {
            return Ok(None);
        }
    }
    Ok(Some(v))
}

/// Groups `rows` (event schema: data, seq, op, run) by version, ascending.
pub(crate) fn group_versions(setup: &FlowSetup, rows: &RecordBatch) -> Result<Versions> {
    let seq = rows.column(setup.spec.n_out);
    if rows.num_rows() == 0 {
        return Ok(Versions { groups: Vec::new() });
    }
    // The common case, one version per run, needs no sort.
    let first =
        ScalarValue::try_from_array(seq, 0).context(|| "reading a snapshot version".into())?;
    let first_scalar = first
        .to_scalar()
        .context(|| "reading a snapshot version".into())?;
    let same = deltalake::arrow::compute::kernels::cmp::not_distinct(seq, &first_scalar)
        .context(|| "grouping snapshot versions".into())?;
    if same.true_count() == rows.num_rows() {
        return Ok(Versions {
            groups: vec![(first, (0..rows.num_rows() as u32).collect())],
        });
    }
    let seq_rows = arrow::rows(std::slice::from_ref(seq))?;
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_by(|&a, &b| seq_rows.row(a as usize).cmp(&seq_rows.row(b as usize)));
    let mut groups: Vec<(ScalarValue, Vec<u32>)> = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        if pos == 0 || seq_rows.row(order[pos - 1] as usize) != seq_rows.row(i as usize) {
            let v = ScalarValue::try_from_array(seq, i as usize)
                .context(|| "reading a snapshot version".into())?;
            groups.push((v, Vec::new()));
        }
        if let Some(g) = groups.last_mut() {
            g.1.push(i);
        }
    }
    Ok(Versions { groups })
}

/// The data columns of the event schema: the shape of one snapshot.
pub(crate) fn data_schema(setup: &FlowSetup) -> SchemaRef {
    Arc::new(Schema::new(
        setup.event_schema.fields()[..setup.spec.n_out].to_vec(),
    ))
}

/// Key rows (row format) of `batch`'s key columns, owned.
pub(crate) fn key_set(setup: &FlowSetup, batch: &RecordBatch) -> Result<AHashSet<Vec<u8>>> {
    let keys = setup.key_rows(batch)?;
    Ok((0..batch.num_rows())
        .map(|i| keys.row(i).data().to_vec())
        .collect())
}

/// The difference between two states (data columns): rows of `new` that are new or changed,
/// and rows of `old` whose key is gone.
#[derive(Clone)]
pub(crate) struct Diff {
    pub(crate) upserts: Vec<u32>,
    pub(crate) deletes: Vec<u32>,
}

/// Rejects a snapshot `batch` in which a key appears twice; `version` names it in the error.
pub(crate) fn reject_duplicate_keys(
    setup: &FlowSetup,
    batch: &RecordBatch,
    version: &ScalarValue,
) -> Result<()> {
    diff(setup, batch, &batch.slice(0, 0), version).map(|_| ())
}

/// The error for row `i` of snapshot `batch` (version `version`), whose key appears twice.
pub(crate) fn appears_twice(
    setup: &FlowSetup,
    batch: &RecordBatch,
    i: u32,
    version: &ScalarValue,
) -> EngineError {
    EngineError::BadInput(format!(
        "flow {}: key ({}) appears twice in snapshot version {}; a snapshot holds one row per \
         key. The run was rejected and nothing was written",
        setup.flow.name,
        fold::describe_key(batch, &setup.spec.keys, i as usize),
        render_version(version),
    ))
}

/// `version` names the snapshot `new` is, for the error on a key that appears twice in it.
///
/// Keys are independent: large snapshots are split into parts by a hash of the key and the
/// parts diffed side by side.
pub(crate) fn diff(
    setup: &FlowSetup,
    new: &RecordBatch,
    old: &RecordBatch,
    version: &ScalarValue,
) -> Result<Diff> {
    // Keys as integers where the single key column allows, else in row format (one
    // converter for both sides, so equal keys have equal bytes).
    let key_cols = |b: &RecordBatch| -> Vec<ArrayRef> {
        setup
            .spec
            .keys
            .iter()
            .map(|&k| b.column(k).clone())
            .collect()
    };
    let (nk, ok) = match (
        Ordered::of_columns(&key_cols(new), None)?,
        Ordered::of_columns(&key_cols(old), None)?,
    ) {
        (n @ Ordered::Int(_), o @ Ordered::Int(_)) => (n, o),
        _ => (
            Ordered::Rows(setup.key_rows(new)?),
            Ordered::Rows(setup.key_rows(old)?),
        ),
    };
    // Matched keys compare column by column (NULL equals NULL), in chunks of pairs.
    let value_cols: Vec<usize> = (0..new.num_columns())
        .filter(|c| !setup.spec.keys.contains(c))
        .collect();
    let changed = |pairs: &[(u32, u32)]| changed_pairs(new, old, &value_cols, pairs);
    let rows = new.num_rows().max(old.num_rows());
    let parts = crate::util::threads::threads_for(rows);
    let new_parts = nk.split(0..new.num_rows() as u32, parts);
    let old_parts = ok.split(0..old.num_rows() as u32, parts);
    let twice = |i: u32| appears_twice(setup, new, i, version);
    let diff_part = |(new_rows, old_rows): (Vec<u32>, Vec<u32>)| -> Result<Diff> {
        match (&nk, &ok) {
            (Ordered::Int(n), Ordered::Int(o)) => diff_keys(
                &new_rows,
                &old_rows,
                |i| n[i as usize],
                |j| o[j as usize],
                &changed,
                &twice,
            ),
            (Ordered::Rows(n), Ordered::Rows(o)) => diff_keys(
                &new_rows,
                &old_rows,
                |i| n.row(i as usize).data(),
                |j| o.row(j as usize).data(),
                &changed,
                &twice,
            ),
            _ => Err(EngineError::internal("snapshot keys in two forms")),
        }
    };
    let results = crate::util::threads::on_threads(
        new_parts.into_iter().zip(old_parts).collect(),
        "diff",
        diff_part,
    )?;
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    for r in results {
        let d = r?;
        upserts.extend(d.upserts);
        deletes.extend(d.deletes);
    }
    upserts.sort_unstable();
    deletes.sort_unstable();
    Ok(Diff { upserts, deletes })
}

/// Picks, from matched (new row, old row) pairs, the new rows whose values differ.
type ChangedRows<'a> = dyn Fn(&[(u32, u32)]) -> Result<Vec<u32>> + 'a;

/// The diff of one part of the keys: `new_rows` of the snapshot against `old_rows` of the
/// state, matched by key (`new_key`, `old_key`); `changed` picks, from matched (new, old)
/// pairs, the new rows whose values differ.
fn diff_keys<K: std::hash::Hash + Eq>(
    new_rows: &[u32],
    old_rows: &[u32],
    new_key: impl Fn(u32) -> K,
    old_key: impl Fn(u32) -> K,
    changed: &ChangedRows,
    twice: &dyn Fn(u32) -> EngineError,
) -> Result<Diff> {
    let mut new_by_key: AHashMap<K, u32> = AHashMap::with_capacity(new_rows.len());
    for &i in new_rows {
        if new_by_key.insert(new_key(i), i).is_some() {
            return Err(twice(i));
        }
    }
    let mut seen = vec![false; new_rows.iter().max().map_or(0, |&m| m as usize + 1)];
    let mut matched: Vec<(u32, u32)> = Vec::with_capacity(new_rows.len().min(old_rows.len()));
    let mut deletes = Vec::new();
    for &j in old_rows {
        match new_by_key.get(&old_key(j)) {
            Some(&i) => {
                seen[i as usize] = true;
                matched.push((i, j));
            }
            None => deletes.push(j),
        }
    }
    drop(new_by_key);
    let mut upserts = changed(&matched)?;
    upserts.extend(new_rows.iter().copied().filter(|&i| !seen[i as usize]));
    Ok(Diff { upserts, deletes })
}

/// Pairs compared per step of [`changed_pairs`]: enough for the kernels to run at speed,
/// few enough that the gathered values stay small.
const PAIRS_PER_CHUNK: usize = 64 * 1024;

/// The new rows of matched (new row, old row) `pairs` whose `columns` differ (NULL equals
/// NULL), compared a chunk of pairs at a time with Arrow's `distinct` kernel; column types
/// that kernel does not compare go through a row-by-row comparator.
pub(crate) fn changed_pairs(
    new: &RecordBatch,
    old: &RecordBatch,
    columns: &[usize],
    pairs: &[(u32, u32)],
) -> Result<Vec<u32>> {
    let ctx = || "comparing snapshots".to_string();
    let mut out = Vec::new();
    for chunk in pairs.chunks(PAIRS_PER_CHUNK) {
        let ni = UInt32Array::from_iter_values(chunk.iter().map(|p| p.0));
        let oj = UInt32Array::from_iter_values(chunk.iter().map(|p| p.1));
        let mut differs = vec![false; chunk.len()];
        for &c in columns {
            let a = compute::take(new.column(c).as_ref(), &ni, None).context(ctx)?;
            let b = compute::take(old.column(c).as_ref(), &oj, None).context(ctx)?;
            match compute::kernels::cmp::distinct(&a, &b) {
                Ok(d) => {
                    for i in d.values().set_indices() {
                        differs[i] = true;
                    }
                }
                Err(_) => {
                    let cmp = deltalake::arrow::array::make_comparator(
                        a.as_ref(),
                        b.as_ref(),
                        deltalake::arrow::compute::SortOptions::default(),
                    )
                    .context(ctx)?;
                    for (i, d) in differs.iter_mut().enumerate() {
                        *d = *d || cmp(i, i) != std::cmp::Ordering::Equal;
                    }
                }
            }
        }
        out.extend(
            chunk
                .iter()
                .zip(&differs)
                .filter(|(_, &d)| d)
                .map(|(p, _)| p.0),
        );
    }
    Ok(out)
}

/// Events in the event schema: the data columns of `rows` at `idx`, at version `v`.
pub(crate) fn make_events(
    setup: &FlowSetup,
    rows: &RecordBatch,
    idx: &[u32],
    v: &ScalarValue,
    op: i8,
    run: i64,
) -> Result<RecordBatch> {
    let data: Vec<ArrayRef> = if idx.len() == rows.num_rows() && in_order(idx) {
        rows.columns()[..setup.spec.n_out].to_vec()
    } else {
        let idx = UInt32Array::from(idx.to_vec());
        rows.columns()[..setup.spec.n_out]
            .iter()
            .map(|c| compute::take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<_, _>>()
            .context(|| "building snapshot events".into())?
    };
    events_of(setup, data, v, op, run)
}

/// `idx` is `0, 1, 2, ...`.
fn in_order(idx: &[u32]) -> bool {
    idx.iter().enumerate().all(|(i, &j)| i as u32 == j)
}

/// Events in the event schema with data columns `data`, at version `v`.
fn events_of(
    setup: &FlowSetup,
    cols: Vec<ArrayRef>,
    v: &ScalarValue,
    op: i8,
    run: i64,
) -> Result<RecordBatch> {
    let n = cols.first().map_or(0, |c| c.len());
    EventColumns::new(setup, v, op, run, n)?.events_of(setup, cols)
}

/// The version, op and run columns of events that share all three, built once in the event
/// schema's types and sliced for each batch: a first snapshot's 10M events in pieces then
/// add 17 bytes per row of their longest piece, not per event.
struct EventColumns {
    seq: ArrayRef,
    op: ArrayRef,
    run: ArrayRef,
}

impl EventColumns {
    /// Columns of `rows` rows: version `v`, op `op`, run `run`.
    fn new(setup: &FlowSetup, v: &ScalarValue, op: i8, run: i64, rows: usize) -> Result<Self> {
        let what = || "building snapshot events".to_string();
        let seq_type = setup.event_schema.field(setup.spec.n_out).data_type();
        let seq = v.to_array_of_size(rows).context(what)?;
        let seq = match seq.data_type() == seq_type {
            true => seq,
            false => compute::cast(&seq, seq_type).context(what)?,
        };
        Ok(EventColumns {
            seq,
            op: Arc::new(Int8Array::from(vec![op; rows])),
            run: Arc::new(Int64Array::from(vec![run; rows])),
        })
    }

    /// The events with data columns `cols` (at most as many rows as the shared columns).
    fn events_of(&self, setup: &FlowSetup, mut cols: Vec<ArrayRef>) -> Result<RecordBatch> {
        let n = cols.first().map_or(0, |c| c.len());
        cols.extend([&self.seq, &self.op, &self.run].map(|c| c.slice(0, n)));
        arrow::cast_columns(cols, &setup.event_schema)
    }
}

/// Delete events at version `v` for `keys` (the one key column); the other data columns are
/// NULL, as the fold reads nothing but the key of a delete.
pub(crate) fn delete_events(
    setup: &FlowSetup,
    key: usize,
    keys: ArrayRef,
    v: &ScalarValue,
    run: i64,
) -> Result<RecordBatch> {
    let n = keys.len();
    let mut cols: Vec<ArrayRef> = setup.event_schema.fields()[..setup.spec.n_out]
        .iter()
        .enumerate()
        .map(|(c, f)| match c == key {
            true => keys.clone(),
            false => new_null_array(f.data_type(), n),
        })
        .collect();
    cols.push(
        v.to_array_of_size(n)
            .context(|| "building snapshot events".into())?,
    );
    cols.push(Arc::new(Int8Array::from(vec![1i8; n])));
    cols.push(Arc::new(Int64Array::from(vec![run; n])));
    arrow::cast_columns(cols, &setup.event_schema)
}

pub(crate) fn marker(setup: &FlowSetup, v: &ScalarValue, run: i64) -> Result<RecordBatch> {
    let mut cols: Vec<ArrayRef> = setup.event_schema.fields()[..setup.spec.n_out]
        .iter()
        .map(|f| new_null_array(f.data_type(), 1))
        .collect();
    cols.push(v.to_array_of_size(1).context(|| "marker".into())?);
    cols.push(Arc::new(Int8Array::from(vec![OP_MARKER])));
    cols.push(Arc::new(Int64Array::from(vec![run])));
    arrow::cast_columns(cols, &setup.event_schema)
}

/// The rows of `b` at `idx`; `b` itself (no copy) when `idx` is all of it, in any order.
pub(crate) fn take_rows(b: &RecordBatch, idx: &[u32]) -> Result<RecordBatch> {
    if idx.len() == b.num_rows() {
        return Ok(b.clone());
    }
    compute::take_record_batch(b, &UInt32Array::from(idx.to_vec())).context(|| "rows".into())
}

pub(crate) fn data_only(setup: &FlowSetup, rows: &RecordBatch) -> Result<RecordBatch> {
    RecordBatch::try_new(
        data_schema(setup),
        rows.columns()[..setup.spec.n_out].to_vec(),
    )
    .context(|| "snapshot rows".into())
}

pub(crate) fn with_flag(b: &RecordBatch, flag: &str, value: bool, n: usize) -> Result<RecordBatch> {
    let i = b
        .schema()
        .index_of(flag)
        .context(|| format!("current flag {flag}"))?;
    let mut cols = b.columns().to_vec();
    cols[i] = Arc::new(BooleanArray::from(vec![value; n]));
    RecordBatch::try_new(b.schema(), cols).context(|| "current flag".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray, StructArray};
    use deltalake::arrow::datatypes::{DataType, Field};

    /// Matched pairs differ when any compared column differs; NULL equals NULL; struct
    /// columns (compared row by row) and pairs beyond one chunk are compared too.
    #[test]
    fn changed_pairs_finds_exactly_the_differing_rows() {
        let n = PAIRS_PER_CHUNK + 1001; // the last row, 66536, is not a multiple of 7
        let int = |f: &dyn Fn(usize) -> Option<i64>| -> ArrayRef {
            Arc::new(Int64Array::from((0..n).map(f).collect::<Vec<_>>()))
        };
        let text = |f: &dyn Fn(usize) -> Option<String>| -> ArrayRef {
            Arc::new(StringArray::from((0..n).map(f).collect::<Vec<_>>()))
        };
        let nested = |a: ArrayRef| -> ArrayRef {
            Arc::new(StructArray::from(vec![(
                Arc::new(Field::new("x", DataType::Int64, true)),
                a,
            )]))
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "n",
                DataType::Struct(vec![Field::new("x", DataType::Int64, true)].into()),
                false,
            ),
        ]));
        let batch = |v: ArrayRef, s: ArrayRef, x: ArrayRef| {
            RecordBatch::try_new(
                schema.clone(),
                vec![int(&|i| Some(i as i64)), v, s, nested(x)],
            )
            .expect("batch")
        };
        // Old rows: NULLs every 7th value and string.
        let old = batch(
            int(&|i| (i % 7 != 0).then_some(i as i64)),
            text(&|i| (i % 7 != 0).then(|| format!("s{i}"))),
            int(&|i| Some(i as i64)),
        );
        // New rows: row 3 changes its number, row 14 (NULL before) gets one, row 10 its
        // string, row 21 its struct field, the last row its string; NULLs elsewhere stay.
        let last = n - 1;
        let new = batch(
            int(&|i| match i {
                3 => Some(-3),
                14 => Some(14),
                _ => (i % 7 != 0).then_some(i as i64),
            }),
            text(&|i| match i {
                10 => Some("changed".into()),
                i if i == last => None,
                _ => (i % 7 != 0).then(|| format!("s{i}")),
            }),
            int(&|i| Some(if i == 21 { -21 } else { i as i64 })),
        );
        // Pairs in reverse order of the old rows, as a hash match would give them.
        let pairs: Vec<(u32, u32)> = (0..n as u32).rev().map(|i| (i, i)).collect();
        let mut changed = changed_pairs(&new, &old, &[1, 2, 3], &pairs).expect("compare");
        changed.sort_unstable();
        let expected: Vec<u32> = vec![3, 10, 14, 21, last as u32];
        assert_eq!(changed, expected);
    }
}
