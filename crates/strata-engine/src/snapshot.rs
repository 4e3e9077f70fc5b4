//! AUTO CDC FROM SNAPSHOT: full extracts turned into change events.
//!
//! A snapshot flow keeps the same event store as a change-event flow, so history is still
//! "the fold over all events" (semantics page §1) and late data is placed exactly. Applying
//! snapshot `v` (semantics page §4) writes, at sequence `v`:
//!
//! - an upsert for every key that is new or changed against the state at the applied version
//!   before `v` (`p`), a delete for every key of that state missing from `v`;
//! - a *marker* event (op 3, no key) that records `v` as applied, by this run;
//! - when `v` is older than an applied version (`n`, the next one), *pins* at `n` for the keys
//!   whose state at `v` changed and that have no event at `n`: they restore the state at `n`
//!   as it was, so inserting `v` changes history only in `[v, n)`.
//!
//! A redelivered version replaces what it contributed: events at `v` written by an earlier run
//! than `v`'s latest marker are superseded (see [`register_effective`]). The state at any
//! applied version other than the ones a run delivers is unchanged by that run, which is what
//! lets the run compute every state it needs from the store as it was.
//!
//! `STORED AS SNAPSHOTS` keeps no event store: [`run_snapshots_mode`] writes each delivery's
//! rows with start = end = version, replacing a redelivered version's rows in the same commit.

use crate::digest;
use crate::error::{Context, EngineError, Result};
use crate::flow::{self, FlowReport, FlowSetup};
use crate::fold::{self, FoldSpec, OP_COL, RUN_COL, SEQ_COL};
use crate::sqlutil::{self, quote_ident, Ordered};
use crate::warehouse::{self, Warehouse};
use ahash::{AHashMap, AHashSet};
use deltalake::arrow::array::{
    new_null_array, ArrayRef, BooleanArray, Int64Array, Int8Array, RecordBatch, UInt32Array,
};
use deltalake::arrow::compute::{self, concat_batches};
use deltalake::arrow::datatypes::{Schema, SchemaRef};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{col, lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use std::sync::Arc;

/// Op code of a marker event: "version `seq` was delivered by run `run`".
pub(crate) const OP_MARKER: i8 = 3;

/// What applying the pending snapshots of one run produces.
pub(crate) struct SnapshotEvents {
    /// Upserts, deletes and pins: the new input of the fold.
    pub events: RecordBatch,
    /// One marker per applied version.
    pub markers: RecordBatch,
    /// Keys of stored events that redeliveries supersede (they must be re-derived too).
    pub superseded: Option<RecordBatch>,
    /// Late versions and redeliveries, for the run report.
    pub notes: Vec<String>,
    /// The digest of the state after this run, when the run's last version is the newest
    /// applied and was diffed by digest (`digest.rs`).
    pub state_digest: Option<digest::Digest>,
}

/// One snapshot's rows (data columns): the pieces they arrived in, put into one batch only
/// when something needs them so (a 10M-row snapshot diffed by digest never is).
struct Snap {
    schema: SchemaRef,
    pieces: Vec<RecordBatch>,
    whole: std::sync::OnceLock<RecordBatch>,
}

impl Snap {
    fn new(schema: SchemaRef, pieces: Vec<RecordBatch>) -> Self {
        Snap {
            schema,
            pieces,
            whole: std::sync::OnceLock::new(),
        }
    }

    fn num_rows(&self) -> usize {
        self.pieces.iter().map(RecordBatch::num_rows).sum()
    }

    /// The rows as one batch.
    fn batch(&self) -> Result<&RecordBatch> {
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
            .ok_or_else(|| EngineError::Internal("snapshot rows".into()))
    }

    /// Rows `idx` (positions over all pieces), in that order.
    fn take(&self, idx: &[u32]) -> Result<RecordBatch> {
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

    /// [`make_events`] of rows `idx`.
    fn events(
        &self,
        setup: &FlowSetup,
        idx: &[u32],
        v: &ScalarValue,
        op: i8,
        run: i64,
    ) -> Result<RecordBatch> {
        if self.pieces.len() == 1 || self.whole.get().is_some() {
            return make_events(setup, self.batch()?, idx, v, op, run);
        }
        let rows = self.take(idx)?;
        let all: Vec<u32> = (0..rows.num_rows() as u32).collect();
        make_events(setup, &rows, &all, v, op, run)
    }
}

/// A snapshot's rows grouped by version, ascending.
struct Versions {
    /// (version, row indices of the snapshot rows)
    groups: Vec<(ScalarValue, Vec<u32>)>,
}

fn render_version(v: &ScalarValue) -> String {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => s.clone(),
        other => other.to_string(),
    }
}

/// The version of every row of `pieces` when they all have the same one (and there is a
/// row), else `None`.
fn one_version(setup: &FlowSetup, pieces: &[RecordBatch]) -> Result<Option<ScalarValue>> {
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
fn group_versions(setup: &FlowSetup, rows: &RecordBatch) -> Result<Versions> {
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
    let seq_rows = sqlutil::rows(std::slice::from_ref(seq))?;
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

/// Registers `name` as the effective events of table `events` (the event store, or some
/// keys' stored events): data events (no markers) whose run is not older than the latest
/// marker of their version in the event store. `new_markers`, when given, count as markers too
/// (the run's own deliveries supersede what they replace).
pub(crate) async fn register_effective(
    ctx: &SessionContext,
    setup: &FlowSetup,
    name: &str,
    events: &str,
    new_markers: Option<&RecordBatch>,
) -> Result<()> {
    let markers_table = format!("{name}_markers");
    let _ = ctx.deregister_table(&markers_table);
    let markers = match new_markers {
        Some(m) => m.clone(),
        None => RecordBatch::new_empty(setup.event_schema.clone()),
    };
    ctx.register_batch(&markers_table, markers)
        .context(|| "registering markers".into())?;
    let (seq, op, run) = (
        quote_ident(SEQ_COL),
        quote_ident(OP_COL),
        quote_ident(RUN_COL),
    );
    let sql = format!(
        "SELECT e.* FROM {events} e JOIN \
           (SELECT {seq} AS v, max({run}) AS r FROM \
              (SELECT {seq}, {run} FROM __strata_events WHERE {op} = {OP_MARKER} \
               UNION ALL SELECT {seq}, {run} FROM {markers_table}) GROUP BY {seq}) m \
         ON e.{seq} = m.v WHERE e.{op} < {OP_MARKER} AND e.{run} >= m.r"
    );
    let df = ctx
        .sql(&sql)
        .await
        .context(|| "planning the effective events".into())?;
    let _ = ctx.deregister_table(name);
    ctx.register_table(name, df.into_view())
        .context(|| format!("registering {name}"))?;
    Ok(())
}

/// Versions recorded by markers in the store registered as `__strata_events`, ascending.
async fn stored_versions(ctx: &SessionContext) -> Result<Vec<ScalarValue>> {
    let batches = ctx
        .sql(&format!(
            "SELECT DISTINCT {} FROM __strata_events WHERE {} = {OP_MARKER}",
            quote_ident(SEQ_COL),
            quote_ident(OP_COL)
        ))
        .await
        .context(|| "reading applied versions".into())?
        .collect()
        .await
        .context(|| "reading applied versions".into())?;
    let mut out = sqlutil::scalars(&batches)?;
    out.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Ok(out)
}

/// Effective stored events (view `__strata_effective_old`) whose version satisfies `pred`.
async fn stored_events(
    ctx: &SessionContext,
    setup: &FlowSetup,
    pred: deltalake::datafusion::prelude::Expr,
) -> Result<RecordBatch> {
    let batches = ctx
        .table("__strata_effective_old")
        .await
        .context(|| "reading the event store".into())?
        .filter(pred)
        .context(|| "reading the event store".into())?
        .collect()
        .await
        .context(|| "reading the event store".into())?;
    let cast = batches
        .iter()
        .map(|b| sqlutil::cast_batch(b, &setup.event_schema))
        .collect::<Result<Vec<_>>>()?;
    concat_batches(&setup.event_schema, &cast).context(|| "reading the event store".into())
}

/// What a state digest of this flow must have been made for (one key column), else `None`.
fn digest_fingerprint(setup: &FlowSetup) -> Option<String> {
    match setup.spec.keys.as_slice() {
        [k] => Some(digest::fingerprint(&data_schema(setup), *k)),
        _ => None,
    }
}

/// Starts writing `state` (from [`to_events`]) as the digest of the state after event-store
/// version `store_version`, in `dir`, on a thread of its own (`digest::Writer`).
pub(crate) fn write_digest(
    setup: &FlowSetup,
    dir: std::path::PathBuf,
    store_version: i64,
    state: digest::Digest,
) -> Option<digest::Writer> {
    let (Some(fingerprint), [key]) = (digest_fingerprint(setup), setup.spec.keys.as_slice()) else {
        return None;
    };
    Some(digest::Writer::start(
        dir,
        store_version,
        fingerprint,
        setup.out_cols[*key].clone(),
        state,
        setup.flow.name.clone(),
    ))
}

/// The digest of a state (data columns, key column `key`).
fn digest_of_state(state: &RecordBatch, key: usize) -> Result<digest::Digest> {
    digest::of_batch(state, key)?
        .map(|s| s.digest)
        .ok_or_else(|| EngineError::Internal("the stored state has keys of another form".into()))
}

/// The data columns of the event schema: the shape of one snapshot.
fn data_schema(setup: &FlowSetup) -> SchemaRef {
    Arc::new(Schema::new(
        setup.event_schema.fields()[..setup.spec.n_out].to_vec(),
    ))
}

/// The state at stored version `v`: the SCD1 fold of the stored events up to `v`.
async fn state_at(ctx: &SessionContext, setup: &FlowSetup, v: &ScalarValue) -> Result<RecordBatch> {
    let events = stored_events(ctx, setup, col(SEQ_COL).lt_eq(lit(v.clone()))).await?;
    let spec = FoldSpec {
        scd2: false,
        ..setup.spec.clone()
    };
    Ok(fold::fold_batch(&events, &spec, &data_schema(setup))?.0)
}

/// Key rows (row format) of `batch`'s key columns, owned.
fn key_set(setup: &FlowSetup, batch: &RecordBatch) -> Result<AHashSet<Vec<u8>>> {
    let keys = setup.key_rows(batch)?;
    Ok((0..batch.num_rows())
        .map(|i| keys.row(i).data().to_vec())
        .collect())
}

/// The difference between two states (data columns): rows of `new` that are new or changed,
/// and rows of `old` whose key is gone.
#[derive(Clone)]
struct Diff {
    upserts: Vec<u32>,
    deletes: Vec<u32>,
}

/// Rejects a snapshot `batch` in which a key appears twice; `version` names it in the error.
fn reject_duplicate_keys(
    setup: &FlowSetup,
    batch: &RecordBatch,
    version: &ScalarValue,
) -> Result<()> {
    diff(setup, batch, &batch.slice(0, 0), version).map(|_| ())
}

/// The error for row `i` of snapshot `batch` (version `version`), whose key appears twice.
fn appears_twice(
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
fn diff(
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
    let parts = crate::warehouse::threads_for(rows);
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
            _ => Err(EngineError::Internal("snapshot keys in two forms".into())),
        }
    };
    let results = crate::warehouse::on_threads(
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
fn changed_pairs(
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
fn make_events(
    setup: &FlowSetup,
    rows: &RecordBatch,
    idx: &[u32],
    v: &ScalarValue,
    op: i8,
    run: i64,
) -> Result<RecordBatch> {
    let n = idx.len();
    let all_in_order = n == rows.num_rows() && idx.iter().enumerate().all(|(i, &j)| i as u32 == j);
    let mut cols: Vec<ArrayRef> = if all_in_order {
        rows.columns()[..setup.spec.n_out].to_vec()
    } else {
        let idx = UInt32Array::from(idx.to_vec());
        rows.columns()[..setup.spec.n_out]
            .iter()
            .map(|c| compute::take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<_, _>>()
            .context(|| "building snapshot events".into())?
    };
    cols.push(
        v.to_array_of_size(n)
            .context(|| "building snapshot events".into())?,
    );
    cols.push(Arc::new(Int8Array::from(vec![op; n])));
    cols.push(Arc::new(Int64Array::from(vec![run; n])));
    sqlutil::cast_columns(cols, &setup.event_schema)
}

/// Delete events at version `v` for `keys` (the one key column); the other data columns are
/// NULL, as the fold reads nothing but the key of a delete.
fn delete_events(
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
    sqlutil::cast_columns(cols, &setup.event_schema)
}

fn marker(setup: &FlowSetup, v: &ScalarValue, run: i64) -> Result<RecordBatch> {
    let mut cols: Vec<ArrayRef> = setup.event_schema.fields()[..setup.spec.n_out]
        .iter()
        .map(|f| new_null_array(f.data_type(), 1))
        .collect();
    cols.push(v.to_array_of_size(1).context(|| "marker".into())?);
    cols.push(Arc::new(Int8Array::from(vec![OP_MARKER])));
    cols.push(Arc::new(Int64Array::from(vec![run])));
    sqlutil::cast_columns(cols, &setup.event_schema)
}

/// The rows of `b` at `idx`; `b` itself (no copy) when `idx` is all of it, in any order.
fn take_rows(b: &RecordBatch, idx: &[u32]) -> Result<RecordBatch> {
    if idx.len() == b.num_rows() {
        return Ok(b.clone());
    }
    compute::take_record_batch(b, &UInt32Array::from(idx.to_vec())).context(|| "rows".into())
}

fn data_only(setup: &FlowSetup, rows: &RecordBatch) -> Result<RecordBatch> {
    RecordBatch::try_new(
        data_schema(setup),
        rows.columns()[..setup.spec.n_out].to_vec(),
    )
    .context(|| "snapshot rows".into())
}

/// Turns the snapshot rows of this run (event schema, op 0) into events against the store
/// registered as `__strata_events` (`has_store`).
///
/// `current`, when given, is the target as of the latest stored version (the target is in
/// step with the store): the state at that version is then read from it rather than folded
/// from the whole store, which is the common case of a snapshot newer than all before it.
/// In that case, with one integer key, `digest_at` (the digest directory and the store
/// version) says where the digest of that state may already be (`digest.rs`).
pub(crate) async fn to_events(
    ctx: &SessionContext,
    setup: &FlowSetup,
    has_store: bool,
    current: Option<&DeltaTable>,
    digest_at: (&std::path::Path, i64),
    rows: &[RecordBatch],
    run: i64,
) -> Result<SnapshotEvents> {
    let steps = warehouse::Steps::new(&setup.flow.name, "snapshot: ");
    let step = |what: &str| warehouse::step!(debug, steps, what);
    // One version (the common case): its rows stay in the pieces they came in. Several: the
    // rows are put in one batch and grouped.
    let one = one_version(setup, rows)?;
    let whole = match &one {
        Some(_) => None,
        None => Some(match rows {
            [b] => b.clone(),
            _ => {
                let schema = rows
                    .first()
                    .map_or_else(|| setup.event_schema.clone(), |b| b.schema());
                concat_batches(&schema, rows).context(|| "snapshot rows".into())?
            }
        }),
    };
    let versions = match (&one, &whole) {
        (Some(v), _) => Versions {
            groups: vec![(v.clone(), Vec::new())],
        },
        (None, Some(w)) => group_versions(setup, w)?,
        (None, None) => Versions { groups: Vec::new() },
    };
    let mut applied: Vec<ScalarValue> = Vec::new();
    if has_store {
        register_effective(
            ctx,
            setup,
            "__strata_effective_old",
            "__strata_events",
            None,
        )
        .await?;
        applied = stored_versions(ctx).await?;
    }
    step("grouped the versions and listed the stored ones");
    let stored: Vec<ScalarValue> = applied.clone();
    let pending: Vec<ScalarValue> = versions.groups.iter().map(|g| g.0.clone()).collect();
    let empty = RecordBatch::new_empty(data_schema(setup));
    let mut parts: Vec<RecordBatch> = Vec::new();
    let mut markers: Vec<RecordBatch> = Vec::new();
    let mut superseded: Vec<RecordBatch> = Vec::new();
    let mut notes = Vec::new();
    let mut last: Option<(ScalarValue, Snap)> = None;
    let mut current_state: Option<RecordBatch> = None;
    // Keys given a pin at a version earlier in this run: their state there is already
    // restored as it was (a later version's state before it is no longer the old one).
    let mut pinned: Vec<(ScalarValue, AHashSet<Vec<u8>>)> = Vec::new();
    // One key column: a version newer than all before it is diffed by digest.
    let digest_key = match setup.spec.keys.as_slice() {
        [k] => Some(*k),
        _ => None,
    };
    let fingerprint = digest_fingerprint(setup);
    let mut last_digest: Option<(ScalarValue, digest::Digest)> = None;

    for (v, idx) in &versions.groups {
        let snap = match &whole {
            None => Snap::new(
                data_schema(setup),
                rows.iter()
                    .map(|b| data_only(setup, b))
                    .collect::<Result<_>>()?,
            ),
            Some(w) => Snap::new(
                data_schema(setup),
                vec![data_only(setup, &take_rows(w, idx)?)?],
            ),
        };
        let p = applied.iter().rev().find(|a| *a < v).cloned();
        let n = applied.iter().find(|a| *a > v).cloned();
        let redelivery = stored.contains(v);

        let latest_stored = stored.last();
        let mut state = async |at: &ScalarValue| -> Result<RecordBatch> {
            match current {
                Some(t) if Some(at) == latest_stored => {
                    if current_state.is_none() {
                        current_state = Some(target_state(setup, t).await?);
                    }
                    Ok(current_state.clone().unwrap_or_else(|| empty.clone()))
                }
                _ => state_at(ctx, setup, at).await,
            }
        };
        let newest = n.is_none() && !redelivery;
        // The state before `v` from the digest file: the latest stored version, not
        // re-derived earlier in this run.
        let p_in_run = |lv: &ScalarValue| p.as_ref() == Some(lv);
        let (dir, at) = digest_at;
        let from_file = match (current, &fingerprint) {
            (Some(_), Some(fp))
                if p.is_some()
                    && p.as_ref() == latest_stored
                    && !last_digest.as_ref().is_some_and(|(lv, _)| p_in_run(lv))
                    && !last.as_ref().is_some_and(|(lv, _)| p_in_run(lv)) =>
            {
                Some((dir, at, fp))
            }
            _ => None,
        };
        let (by_digest, saved) = match (digest_key, newest) {
            (Some(k), true) => std::thread::scope(|scope| {
                // Read the file while the snapshot is hashed.
                // Its own clock: the step after the join shows the longer of the two.
                let loading = from_file.map(|(dir, at, fp)| {
                    scope.spawn(move || {
                        let clock = warehouse::Steps::new(&setup.flow.name, "snapshot: ");
                        let d = digest::load(dir, at, fp);
                        warehouse::step!(debug, clock, "loaded the state digest");
                        d
                    })
                });
                let hashed = digest::of_pieces(&snap.pieces, k);
                let saved = loading.and_then(|h| h.join().ok()).flatten();
                hashed.map(|d| (d.map(|d| (k, d)), saved))
            })?,
            _ => (None, None),
        };
        if let Some((k, sd)) = by_digest {
            step("hashed the snapshot's rows and sorted its keys");
            let old = match &p {
                None => digest::Digest::empty(snap.schema.field(k).data_type()),
                Some(p) => match (last_digest.take(), &last, saved) {
                    // The version before was applied earlier in this run.
                    (Some((lv, d)), _, _) if &lv == p => d,
                    (_, Some((lv, ls)), _) if lv == p => digest_of_state(ls.batch()?, k)?,
                    (_, _, Some(d)) => d,
                    _ => digest_of_state(&state(p).await?, k)?,
                },
            };
            step("read the state digest before the version");
            let d = digest::diff(&sd, &old).map_err(|i| match snap.take(&[i]) {
                Ok(row) => appears_twice(setup, &row, 0, v),
                Err(e) => e,
            })?;
            step("diffed by digest");
            parts.push(snap.events(setup, &d.upserts, v, 0, run)?);
            parts.push(delete_events(setup, k, old.keys_at(&d.deletes)?, v, run)?);
            markers.push(marker(setup, v, run)?);
            let pos = applied.partition_point(|a| a < v);
            applied.insert(pos, v.clone());
            last_digest = Some((v.clone(), sd.digest));
            last = Some((v.clone(), snap));
            continue;
        }
        last_digest = None;
        let state_p = match &p {
            None => empty.clone(),
            Some(p) => match &last {
                Some((lv, ls)) if lv == p => ls.batch()?.clone(),
                _ => state(p).await?,
            },
        };
        let old_state_v = if redelivery {
            state(v).await?
        } else {
            state_p.clone()
        };

        step("read the state before the version");
        let snap = snap.batch()?.clone();
        let d = diff(setup, &snap, &state_p, v)?;
        step("diffed");
        parts.push(make_events(setup, &snap, &d.upserts, v, 0, run)?);
        parts.push(make_events(setup, &state_p, &d.deletes, v, 1, run)?);
        markers.push(marker(setup, v, run)?);

        let changed = if redelivery {
            diff(setup, &snap, &old_state_v, v)?
        } else {
            d.clone()
        };
        let n_changed = changed.upserts.len() + changed.deletes.len();
        if redelivery {
            superseded.push(stored_events(ctx, setup, col(SEQ_COL).eq(lit(v.clone()))).await?);
            notes.push(format!(
                "snapshot version {} redelivered: it replaces the earlier delivery ({} key(s) differ)",
                render_version(v),
                n_changed
            ));
        }
        if let Some(n) = &n {
            if !redelivery {
                notes.push(format!(
                    "snapshot version {} arrived after version {} was applied: placed into history{}",
                    render_version(v),
                    render_version(n),
                    match &p {
                        Some(p) => format!(" between versions {} and {}", render_version(p), render_version(n)),
                        None => " before it".to_string(),
                    }
                ));
            }
            // Pins keep the state at `n` as it was for the keys `v` changed, unless `n` is
            // itself delivered again later in this run (then it is re-derived from `v`).
            if n_changed > 0 && !pending.contains(n) {
                let mut at_n = key_set(
                    setup,
                    &stored_events(ctx, setup, col(SEQ_COL).eq(lit(n.clone()))).await?,
                )?;
                if let Some((_, keys)) = pinned.iter().find(|(at, _)| at == n) {
                    at_n.extend(keys.iter().cloned());
                }
                let (sk, ok) = (setup.key_rows(&snap)?, setup.key_rows(&old_state_v)?);
                let old_keys: AHashMap<&[u8], u32> = (0..old_state_v.num_rows())
                    .map(|i| (ok.row(i).data(), i as u32))
                    .collect();
                let mut pin_upserts: Vec<u32> = Vec::new();
                let mut pin_deletes: Vec<u32> = Vec::new();
                for &i in &changed.upserts {
                    let k = sk.row(i as usize).data();
                    if at_n.contains(k) {
                        continue;
                    }
                    if let Some(&j) = old_keys.get(k) {
                        // Changed value: restore the old one at n.
                        pin_upserts.push(j);
                    } else {
                        pin_deletes.push(i);
                    }
                }
                for &j in &changed.deletes {
                    if !at_n.contains(ok.row(j as usize).data()) {
                        pin_upserts.push(j);
                    }
                }
                let now_pinned = pin_upserts
                    .iter()
                    .map(|&j| ok.row(j as usize).data().to_vec())
                    .chain(
                        pin_deletes
                            .iter()
                            .map(|&i| sk.row(i as usize).data().to_vec()),
                    );
                match pinned.iter_mut().find(|(at, _)| at == n) {
                    Some((_, keys)) => keys.extend(now_pinned),
                    None => pinned.push((n.clone(), now_pinned.collect())),
                }
                parts.push(make_events(setup, &old_state_v, &pin_upserts, n, 0, run)?);
                parts.push(make_events(setup, &snap, &pin_deletes, n, 1, run)?);
            }
        }
        if !applied.contains(v) {
            let pos = applied.partition_point(|a| a < v);
            applied.insert(pos, v.clone());
        }
        last = Some((v.clone(), Snap::new(data_schema(setup), vec![snap])));
    }

    let events =
        concat_batches(&setup.event_schema, &parts).context(|| "snapshot events".into())?;
    let markers =
        concat_batches(&setup.event_schema, &markers).context(|| "snapshot markers".into())?;
    let superseded = match superseded.is_empty() {
        true => None,
        false => Some(
            concat_batches(&setup.event_schema, &superseded)
                .context(|| "superseded events".into())?,
        ),
    };
    // The digest describes the state after the run when its version is the newest applied.
    let state_digest = last_digest
        .filter(|(v, _)| applied.last() == Some(v))
        .map(|(_, d)| d);
    Ok(SnapshotEvents {
        events,
        markers,
        superseded,
        notes,
        state_digest,
    })
}

/// The current rows of the target (open versions for SCD type 2) as data columns.
async fn target_state(setup: &FlowSetup, target: &DeltaTable) -> Result<RecordBatch> {
    let ctx = warehouse::new_session();
    flow::register_table(&ctx, "t", target, None).await?;
    let mut df = ctx
        .table("t")
        .await
        .context(|| "reading the target".into())?;
    if setup.spec.scd2 {
        let end = Expr::Column(Column::new_unqualified(setup.timeline.valid_to.as_str()));
        let end_type = setup
            .target_schema
            .field_with_name(&setup.timeline.valid_to)
            .map(|f| f.data_type().clone())
            .context(|| "reading the target".into())?;
        let open = match setup.timeline.open_end_value(&end_type)? {
            Some(marker) => end.clone().is_null().or(end.eq(lit(marker))),
            None => end.is_null(),
        };
        df = df.filter(open).context(|| "reading the target".into())?;
    }
    let cols: Vec<Expr> = setup
        .out_cols
        .iter()
        .map(|c| Expr::Column(Column::new_unqualified(c.as_str())))
        .collect();
    let batches = df
        .select(cols)
        .context(|| "reading the target".into())?
        .collect()
        .await
        .context(|| "reading the target".into())?;
    let schema = data_schema(setup);
    let cast = batches
        .into_iter()
        .map(|b| sqlutil::cast_batch(&b, &schema))
        .collect::<Result<Vec<_>>>()?;
    if cast.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    // Column by column, each column's pieces freed once merged: a lower peak than a copy of
    // every batch at once.
    let columns = sqlutil::concat_columns(cast, schema.fields().len())?;
    RecordBatch::try_new(schema, columns).context(|| "reading the target".into())
}

/// `STORED AS SNAPSHOTS`: every delivery's rows with start = end = version, written straight
/// to the target. A redelivered version's rows are replaced in the same commit.
pub(crate) async fn run_snapshots_mode(
    wh: &Warehouse,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<FlowReport> {
    let f = &setup.flow;
    let mut report = FlowReport {
        flow: f.name.clone(),
        ..Default::default()
    };
    let Some(source) = wh.open_table(&f.source).await? else {
        report.skipped = Some(format!("source {} has no data yet", f.source));
        return Ok(report);
    };
    let app_id = format!("strata-flow:{}", f.name);
    let target = wh.open_table(&f.target).await?;
    let from = match &target {
        Some(t) => flow::txn_version(t, &app_id).await?,
        None => None,
    };
    let source_version = flow::version_of(&source);
    if from.is_some_and(|v| v >= source_version) {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    let ctx = warehouse::new_session();
    let files = if setup.table_mode() {
        None
    } else {
        Some(flow::new_files(&source, from).await?)
    };
    flow::register_table(&ctx, strata_sql::SOURCE_PLACEHOLDER, &source, files).await?;
    let rows = flow::events_from(&ctx, setup, 0).await?;
    let place = format!("the rows of {}", f.source);
    flow::validate_events(setup, std::slice::from_ref(&rows), &place)?;
    let versions = group_versions(setup, &rows)?;
    report.source_versions = Some((from, source_version));
    report.events = rows.num_rows();
    if versions.groups.is_empty() {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    let timeline = &setup.timeline;
    let start_col = timeline.valid_from.clone();

    // Versions already in the target.
    let mut existing: Vec<ScalarValue> = Vec::new();
    if let Some(t) = &target {
        flow::register_table(&ctx, "__strata_target", t, None).await?;
        let batches = ctx
            .sql(&format!(
                "SELECT DISTINCT {} FROM __strata_target",
                quote_ident(&start_col)
            ))
            .await
            .context(|| "reading versions".into())?
            .collect()
            .await
            .context(|| "reading versions".into())?;
        existing = sqlutil::scalars(&batches)?;
    }
    let old_max = existing
        .iter()
        .max_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))
        .cloned();
    let mut replace: Vec<ScalarValue> = Vec::new();
    let mut parts = Vec::new();
    let new_max = versions.groups.last().map(|g| g.0.clone());
    let overall_max = match (&old_max, &new_max) {
        (Some(a), Some(b)) if a > b => Some(a.clone()),
        (_, b) => b.clone(),
    };
    for (v, idx) in &versions.groups {
        if existing.contains(v) {
            report.notes.push(format!(
                "snapshot version {} redelivered: its rows are replaced",
                render_version(v)
            ));
        } else if old_max.as_ref().is_some_and(|m| m > v) {
            report.notes.push(format!(
                "snapshot version {} arrived after a later version was applied: added to history",
                render_version(v)
            ));
        }
        replace.push(v.clone());
        let snap = take_rows(&rows, idx)?;
        // A key twice in one version is an error here too.
        reject_duplicate_keys(setup, &snap, v)?;
        let n = snap.num_rows();
        let mut cols: Vec<ArrayRef> = snap.columns()[..setup.spec.n_out].to_vec();
        let seq = snap.column(setup.spec.n_out).clone();
        cols.push(seq.clone());
        cols.push(seq);
        let internal = RecordBatch::try_new(setup.fold_schema.clone(), cols)
            .context(|| "snapshot rows".into())?;
        let mut mapped = timeline.apply(
            &internal,
            setup.spec.n_out,
            &setup.spec.keys,
            &setup.target_schema,
        )?;
        if let Some(flag) = &timeline.current_flag {
            let current = overall_max.as_ref() == Some(v);
            mapped = with_flag(&mapped, flag, current, n)?;
        }
        report.rows_inserted += n;
        parts.push(mapped);
    }
    // The previous latest version is no longer current.
    if let (Some(flag), Some(old), Some(all)) = (&timeline.current_flag, &old_max, &overall_max) {
        if old != all && !replace.contains(old) {
            let prev = ctx
                .table("__strata_target")
                .await
                .context(|| "reading the previous version".into())?
                .filter(
                    Expr::Column(Column::new_unqualified(start_col.as_str())).eq(lit(old.clone())),
                )
                .context(|| "reading the previous version".into())?
                .collect()
                .await
                .context(|| "reading the previous version".into())?;
            for b in prev {
                let b = sqlutil::cast_batch(&b, &setup.target_schema)?;
                let n = b.num_rows();
                parts.push(with_flag(&b, flag, false, n)?);
            }
            replace.push(old.clone());
        }
    }
    let rows_out =
        concat_batches(&setup.target_schema, &parts).context(|| "snapshot rows".into())?;
    let handle = match target {
        Some(t) => t,
        None => {
            warehouse::create_delta(
                &wh.table_path(&f.target),
                &f.target.name,
                &setup.target_schema,
                flow::target_configuration(setup, target_properties),
                None,
                setup.timeline.partition_columns(),
            )
            .await?
        }
    };
    let start_ref = Expr::Column(Column::new_unqualified(start_col.as_str()));
    let predicate = start_ref.in_list(replace.into_iter().map(lit).collect(), false);
    let props = warehouse::writer_properties(&handle);
    handle
        .write(vec![rows_out])
        .with_writer_properties(props)
        .with_save_mode(SaveMode::Overwrite)
        .with_replace_where(predicate)
        .with_commit_properties(
            CommitProperties::default()
                .with_application_transaction(Transaction::new(&app_id, source_version)),
        )
        .await
        .context(|| format!("flow {}: writing {}", f.name, f.target))?;
    report.keys_changed = report.rows_inserted;
    Ok(report)
}

fn with_flag(b: &RecordBatch, flag: &str, value: bool, n: usize) -> Result<RecordBatch> {
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
