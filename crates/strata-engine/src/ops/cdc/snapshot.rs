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

use crate::error::{Context, EngineError, Result};
use crate::eventstore::digest;
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::{self, FoldSpec, OP_COL, RUN_COL, SEQ_COL};
use crate::semantics::snapshot::appears_twice;
use crate::semantics::snapshot::data_only;
use crate::semantics::snapshot::data_schema;
use crate::semantics::snapshot::delete_events;
use crate::semantics::snapshot::diff;
use crate::semantics::snapshot::group_versions;
use crate::semantics::snapshot::key_set;
use crate::semantics::snapshot::make_events;
use crate::semantics::snapshot::one_version;
use crate::semantics::snapshot::render_version;
use crate::semantics::snapshot::take_rows;
use crate::semantics::snapshot::Snap;
use crate::semantics::snapshot::OP_MARKER;
use crate::semantics::snapshot::{marker, Versions};
use crate::util::arrow;
use crate::util::sql::quote_ident;
use crate::util::threads::off_scheduler;
use ahash::{AHashMap, AHashSet};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::row::Rows;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{col, lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;

/// What applying the pending snapshots of one run produces.
pub(crate) struct SnapshotEvents {
    /// Upserts, deletes and pins: the new input of the fold, in pieces.
    pub events: Vec<RecordBatch>,
    /// Every event upserts a key that no other event of the run has, and nothing was stored
    /// before (a first snapshot): the fold of each is its own row (`target::first_rows`).
    pub one_per_key: bool,
    /// One marker per applied version.
    pub markers: RecordBatch,
    /// Keys of stored events that redeliveries supersede (they must be re-derived too).
    pub superseded: Option<RecordBatch>,
    /// Late versions and redeliveries, for the run report.
    pub notes: Vec<String>,
    /// The digest of the state after this run, when the run's last version is the newest
    /// applied and was diffed by digest (`eventstore/digest.rs`).
    pub state_digest: Option<digest::Digest>,
}

impl SnapshotEvents {
    /// The events of a change-event flow's run: no markers, nothing superseded.
    pub(crate) fn just(events: RecordBatch) -> Self {
        SnapshotEvents {
            markers: RecordBatch::new_empty(events.schema()),
            events: vec![events],
            one_per_key: false,
            superseded: None,
            notes: Vec::new(),
            state_digest: None,
        }
    }
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
    let mut out = arrow::scalars(&batches)?;
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
        .map(|b| arrow::cast_batch(b, &setup.event_schema))
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
        .ok_or_else(|| EngineError::internal("the stored state has keys of another form"))
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

/// Turns the snapshot rows of this run (event schema, op 0) into events against the store
/// registered as `__strata_events` (`has_store`).
///
/// `current`, when given, is the target as of the latest stored version (the target is in
/// step with the store): the state at that version is then read from it rather than folded
/// from the whole store, which is the common case of a snapshot newer than all before it.
/// In that case, with one integer key, `digest_at` (the digest directory and the store
/// version) says where the digest of that state may already be (`eventstore/digest.rs`).
///
/// ```text
///  Delivery::group ─▶ stored_versions ─▶ per version: place ─▶ by_digest, else by_diff
///  (the versions      (those applied       (its neighbours    (upserts, deletes,   ─▶ finish
///   delivered)         before)              p and n)           marker, pins)
/// ```
pub(crate) async fn to_events(
    ctx: &SessionContext,
    setup: &FlowSetup,
    has_store: bool,
    current: Option<&DeltaTable>,
    digest_at: (Option<&std::path::Path>, i64),
    rows: Vec<RecordBatch>,
    run: i64,
) -> Result<SnapshotEvents> {
    let steps = crate::util::steps::Steps::new(&setup.flow.name, "snapshot: ");
    let (mut delivery, versions) = Delivery::group(setup, rows)?;
    let mut stored: Vec<ScalarValue> = Vec::new();
    if has_store {
        register_effective(
            ctx,
            setup,
            "__strata_effective_old",
            "__strata_events",
            None,
        )
        .await?;
        stored = stored_versions(ctx).await?;
    }
    crate::util::steps::step!(
        debug,
        steps,
        "grouped the versions and listed the stored ones"
    );
    let pending: Vec<ScalarValue> = versions.groups.iter().map(|g| g.0.clone()).collect();
    let mut applying = Applying::new(run, &steps, stored.clone());
    let mut states = States {
        ctx,
        setup,
        current,
        stored,
        current_state: None,
        empty: RecordBatch::new_empty(data_schema(setup)),
    };
    let digests = Digests {
        // One key column: a version newer than all before it is diffed by digest.
        key: match setup.spec.keys.as_slice() {
            [k] => Some(*k),
            _ => None,
        },
        fingerprint: digest_fingerprint(setup),
        at: digest_at,
    };
    for (v, idx) in &versions.groups {
        let snap = delivery.snap(setup, idx)?;
        let place = applying.place(&states.stored, v);
        let from_file = applying.digest_file(&states, &digests, &place);
        let ((by_digest, saved), snap) = match (digests.key, place.newest()) {
            (Some(k), true) => {
                let from_file = from_file.map(|(d, at, fp)| (d.to_path_buf(), at, fp.to_string()));
                let flow = setup.flow.name.clone();
                off_scheduler("hashing a snapshot", move || {
                    let file = from_file
                        .as_ref()
                        .map(|(d, at, fp)| (d.as_path(), *at, fp.as_str()));
                    Ok((hash_snapshot(&flow, &snap, k, file)?, snap))
                })
                .await?
            }
            _ => ((None, None), snap),
        };
        match by_digest {
            Some((k, sd)) => {
                applying
                    .by_digest(&mut states, v, &place, snap, k, sd, saved)
                    .await?
            }
            None => {
                applying.last_digest = None;
                applying
                    .by_diff(&mut states, v, &place, snap, &pending)
                    .await?
            }
        }
    }
    applying.finish(setup, !has_store && pending.len() == 1)
}

/// The snapshot rows of one run, handed out version by version.
struct Delivery {
    /// One version (the common case): its rows in the pieces they came in, until its
    /// [`Snap`] takes them.
    pieces: Option<Vec<RecordBatch>>,
    /// Several versions: the rows in one batch.
    whole: Option<RecordBatch>,
}

impl Delivery {
    /// The rows, and the versions they hold with each one's rows.
    fn group(setup: &FlowSetup, rows: Vec<RecordBatch>) -> Result<(Delivery, Versions)> {
        if let Some(v) = one_version(setup, &rows)? {
            let versions = Versions {
                groups: vec![(v, Vec::new())],
            };
            let delivery = Delivery {
                pieces: Some(rows),
                whole: None,
            };
            return Ok((delivery, versions));
        }
        let whole = match rows.as_slice() {
            [b] => b.clone(),
            _ => {
                let schema = rows
                    .first()
                    .map_or_else(|| setup.event_schema.clone(), |b| b.schema());
                concat_batches(&schema, &rows).context(|| "snapshot rows".into())?
            }
        };
        let versions = group_versions(setup, &whole)?;
        let delivery = Delivery {
            pieces: None,
            whole: Some(whole),
        };
        Ok((delivery, versions))
    }

    /// The data rows of one version (`idx`: its rows in `whole`; the one version takes the
    /// pieces, so that nothing else holds them).
    fn snap(&mut self, setup: &FlowSetup, idx: &[u32]) -> Result<Snap> {
        let pieces = match &self.whole {
            Some(w) => vec![data_only(setup, &take_rows(w, idx)?)?],
            None => self
                .pieces
                .take()
                .unwrap_or_default()
                .iter()
                .map(|b| data_only(setup, b))
                .collect::<Result<_>>()?,
        };
        Ok(Snap::new(data_schema(setup), pieces))
    }
}

/// Where the states before the versions come from: the target (the state at the latest
/// stored version, when in step) or the fold of the stored events.
struct States<'a> {
    ctx: &'a SessionContext,
    setup: &'a FlowSetup,
    current: Option<&'a DeltaTable>,
    /// The versions applied before this run, ascending.
    stored: Vec<ScalarValue>,
    /// The target's rows, once read.
    current_state: Option<RecordBatch>,
    empty: RecordBatch,
}

impl States<'_> {
    /// The state at stored version `at`.
    async fn at(&mut self, at: &ScalarValue) -> Result<RecordBatch> {
        match self.current {
            Some(t) if Some(at) == self.stored.last() => {
                if self.current_state.is_none() {
                    self.current_state = Some(target_state(self.setup, t).await?);
                }
                Ok(self
                    .current_state
                    .clone()
                    .unwrap_or_else(|| self.empty.clone()))
            }
            _ => state_at(self.ctx, self.setup, at).await,
        }
    }
}

/// How versions are diffed by digest: the one key column, the digests' fingerprint, and
/// where the digest of the latest stored state may be (its directory, its store version).
struct Digests<'a> {
    key: Option<usize>,
    fingerprint: Option<String>,
    at: (Option<&'a std::path::Path>, i64),
}

/// Where a delivered version falls among the applied ones.
struct Place {
    /// The applied version before it.
    p: Option<ScalarValue>,
    /// The applied version after it.
    n: Option<ScalarValue>,
    /// It was applied before this run.
    redelivery: bool,
}

impl Place {
    /// Newer than every version applied.
    fn newest(&self) -> bool {
        self.n.is_none() && !self.redelivery
    }
}

/// What applying the versions so far produced, and what the next ones need of it.
struct Applying<'a> {
    run: i64,
    steps: &'a crate::util::steps::Steps<'a>,
    /// Every version applied, stored or by this run, ascending.
    applied: Vec<ScalarValue>,
    parts: Vec<RecordBatch>,
    markers: Vec<RecordBatch>,
    superseded: Vec<RecordBatch>,
    notes: Vec<String>,
    /// The version applied last in this run, and its rows.
    last: Option<(ScalarValue, Snap)>,
    /// Keys given a pin at a version earlier in this run: their state there is already
    /// restored as it was (a later version's state before it is no longer the old one).
    pinned: Vec<(ScalarValue, AHashSet<Vec<u8>>)>,
    /// The digest of the version applied last, when it was diffed by digest.
    last_digest: Option<(ScalarValue, digest::Digest)>,
}

impl<'a> Applying<'a> {
    /// Nothing applied yet by this run; `stored`: the versions applied before.
    fn new(run: i64, steps: &'a crate::util::steps::Steps<'a>, stored: Vec<ScalarValue>) -> Self {
        Applying {
            run,
            steps,
            applied: stored,
            parts: Vec::new(),
            markers: Vec::new(),
            superseded: Vec::new(),
            notes: Vec::new(),
            last: None,
            pinned: Vec::new(),
            last_digest: None,
        }
    }

    fn step(&self, what: &str) {
        crate::util::steps::step!(debug, self.steps, what);
    }

    /// Where `v` falls among the applied versions.
    fn place(&self, stored: &[ScalarValue], v: &ScalarValue) -> Place {
        Place {
            p: self.applied.iter().rev().find(|a| *a < v).cloned(),
            n: self.applied.iter().find(|a| *a > v).cloned(),
            redelivery: stored.contains(v),
        }
    }

    /// Where the digest of the state before the version may be read: the latest stored
    /// version's, when that is the state before it and was not derived earlier in this run.
    fn digest_file<'d>(
        &self,
        states: &States<'_>,
        digests: &'d Digests<'_>,
        place: &Place,
    ) -> Option<(&'d std::path::Path, i64, &'d str)> {
        let p_in_run = |lv: &ScalarValue| place.p.as_ref() == Some(lv);
        let (dir, at) = digests.at;
        let dir = dir?;
        match (states.current, &digests.fingerprint) {
            (Some(_), Some(fp))
                if place.p.is_some()
                    && place.p.as_ref() == states.stored.last()
                    && !self
                        .last_digest
                        .as_ref()
                        .is_some_and(|(lv, _)| p_in_run(lv))
                    && !self.last.as_ref().is_some_and(|(lv, _)| p_in_run(lv)) =>
            {
                Some((dir, at, fp.as_str()))
            }
            _ => None,
        }
    }

    /// Applies version `v` by digest (`sd`, the snapshot's; key column `k`; `saved`, the
    /// state digest read from its file).
    #[allow(clippy::too_many_arguments)]
    async fn by_digest(
        &mut self,
        states: &mut States<'_>,
        v: &ScalarValue,
        place: &Place,
        snap: Snap,
        k: usize,
        sd: digest::SnapshotDigest,
        saved: Option<digest::Digest>,
    ) -> Result<()> {
        let setup = states.setup;
        self.step("hashed the snapshot's rows and sorted its keys");
        let old = match &place.p {
            None => digest::Digest::empty(snap.schema.field(k).data_type()),
            Some(p) => match (self.last_digest.take(), &self.last, saved) {
                // The version before was applied earlier in this run.
                (Some((lv, d)), _, _) if &lv == p => d,
                (_, Some((lv, ls)), _) if lv == p => digest_of_state(ls.batch()?, k)?,
                (_, _, Some(d)) => d,
                _ => digest_of_state(&states.at(p).await?, k)?,
            },
        };
        self.step("read the state digest before the version");
        let (d, sd, old) = off_scheduler("diffing by digest", move || {
            let d = digest::diff(&sd, &old);
            Ok((d, sd, old))
        })
        .await?;
        let d = d.map_err(|i| match snap.take(&[i]) {
            Ok(row) => appears_twice(setup, &row, 0, v),
            Err(e) => e,
        })?;
        self.step("diffed by digest");
        let run = self.run;
        let upserts = match &d.upserts {
            digest::Upserts::All => snap.all_events(setup, v, 0, run)?,
            digest::Upserts::Rows(rows) => snap.events(setup, rows, v, 0, run)?,
        };
        self.parts.extend(upserts);
        self.parts
            .push(delete_events(setup, k, old.keys_at(&d.deletes)?, v, run)?);
        self.markers.push(marker(setup, v, run)?);
        let pos = self.applied.partition_point(|a| a < v);
        self.applied.insert(pos, v.clone());
        self.last_digest = Some((v.clone(), sd.digest));
        self.last = Some((v.clone(), snap));
        Ok(())
    }

    /// Applies version `v` by diffing its rows against the state before it, superseding
    /// a redelivery's earlier events and pinning the next version's state for a late one.
    async fn by_diff(
        &mut self,
        states: &mut States<'_>,
        v: &ScalarValue,
        place: &Place,
        snap: Snap,
        pending: &[ScalarValue],
    ) -> Result<()> {
        let (setup, run) = (states.setup, self.run);
        let state_p = match &place.p {
            None => states.empty.clone(),
            Some(p) => match &self.last {
                Some((lv, ls)) if lv == p => ls.batch()?.clone(),
                _ => states.at(p).await?,
            },
        };
        let old_state_v = if place.redelivery {
            states.at(v).await?
        } else {
            state_p.clone()
        };

        self.step("read the state before the version");
        let snap = snap.batch()?.clone();
        let diff_off = |old: &RecordBatch| {
            let (s, new, old, v) = (setup.clone(), snap.clone(), old.clone(), v.clone());
            off_scheduler("diffing a snapshot", move || diff(&s, &new, &old, &v))
        };
        let d = diff_off(&state_p).await?;
        self.step("diffed");
        self.parts
            .push(make_events(setup, &snap, &d.upserts, v, 0, run)?);
        self.parts
            .push(make_events(setup, &state_p, &d.deletes, v, 1, run)?);
        self.markers.push(marker(setup, v, run)?);

        let changed = if place.redelivery {
            diff_off(&old_state_v).await?
        } else {
            d.clone()
        };
        let n_changed = changed.upserts.len() + changed.deletes.len();
        if place.redelivery {
            self.superseded
                .push(stored_events(states.ctx, setup, col(SEQ_COL).eq(lit(v.clone()))).await?);
            self.notes.push(format!(
                "snapshot version {} redelivered: it replaces the earlier delivery ({} key(s) differ)",
                render_version(v),
                n_changed
            ));
        }
        if let Some(n) = &place.n {
            if !place.redelivery {
                self.notes.push(late_note(v, place.p.as_ref(), n));
            }
            // Pins keep the state at `n` as it was for the keys `v` changed, unless `n` is
            // itself delivered again later in this run (then it is re-derived from `v`).
            if n_changed > 0 && !pending.contains(n) {
                self.pin(states, n, &snap, &old_state_v, &changed).await?;
            }
        }
        if !self.applied.contains(v) {
            let pos = self.applied.partition_point(|a| a < v);
            self.applied.insert(pos, v.clone());
        }
        self.last = Some((v.clone(), Snap::new(data_schema(setup), vec![snap])));
        Ok(())
    }

    /// Pins at `n` the keys a late (or redelivered) version changed (`changed`: `snap` against
    /// `old_state_v`, the state at the version before), unless they have an event at `n` or
    /// were pinned there earlier in this run.
    async fn pin(
        &mut self,
        states: &States<'_>,
        n: &ScalarValue,
        snap: &RecordBatch,
        old_state_v: &RecordBatch,
        changed: &crate::semantics::snapshot::Diff,
    ) -> Result<()> {
        let (setup, run) = (states.setup, self.run);
        let mut at_n = key_set(
            setup,
            &stored_events(states.ctx, setup, col(SEQ_COL).eq(lit(n.clone()))).await?,
        )?;
        if let Some((_, keys)) = self.pinned.iter().find(|(at, _)| at == n) {
            at_n.extend(keys.iter().cloned());
        }
        let (sk, ok) = (setup.key_rows(snap)?, setup.key_rows(old_state_v)?);
        let pins = pins(changed, &sk, &ok, &at_n);
        let now_pinned = pins
            .upserts
            .iter()
            .map(|&j| ok.row(j as usize).data().to_vec())
            .chain(
                pins.deletes
                    .iter()
                    .map(|&i| sk.row(i as usize).data().to_vec()),
            );
        match self.pinned.iter_mut().find(|(at, _)| at == n) {
            Some((_, keys)) => keys.extend(now_pinned),
            None => self.pinned.push((n.clone(), now_pinned.collect())),
        }
        self.parts
            .push(make_events(setup, old_state_v, &pins.upserts, n, 0, run)?);
        self.parts
            .push(make_events(setup, snap, &pins.deletes, n, 1, run)?);
        Ok(())
    }

    /// The events, markers, superseded events and notes of the run; `first`: the run
    /// delivers one version and nothing was stored before.
    fn finish(self, setup: &FlowSetup, first: bool) -> Result<SnapshotEvents> {
        let events: Vec<RecordBatch> = self
            .parts
            .into_iter()
            .filter(|p| p.num_rows() > 0)
            .collect();
        let markers = concat_batches(&setup.event_schema, &self.markers)
            .context(|| "snapshot markers".into())?;
        let superseded = match self.superseded.is_empty() {
            true => None,
            false => Some(
                concat_batches(&setup.event_schema, &self.superseded)
                    .context(|| "superseded events".into())?,
            ),
        };
        // The digest describes the state after the run when its version is the newest
        // applied.
        let applied = self.applied;
        let state_digest = self
            .last_digest
            .filter(|(v, _)| applied.last() == Some(v))
            .map(|(_, d)| d);
        Ok(SnapshotEvents {
            events,
            // Against an empty state a version has upserts only, of distinct keys (a key
            // that appears twice was refused by the diff).
            one_per_key: first,
            markers,
            superseded,
            notes: self.notes,
            state_digest,
        })
    }
}

/// The digest of a snapshot's rows by key column `k` (`None` when the key is not
/// integer-like), and the state digest read from `from_file` (on a thread of its own while
/// the snapshot is hashed).
#[allow(clippy::type_complexity)]
fn hash_snapshot(
    flow: &str,
    snap: &Snap,
    k: usize,
    from_file: Option<(&std::path::Path, i64, &str)>,
) -> Result<(
    Option<(usize, digest::SnapshotDigest)>,
    Option<digest::Digest>,
)> {
    std::thread::scope(|scope| {
        // Read the file while the snapshot is hashed.
        // Its own clock: the step after the join shows the longer of the two.
        let loading = from_file.map(|(dir, at, fp)| {
            scope.spawn(move || {
                let clock = crate::util::steps::Steps::new(flow, "snapshot: ");
                let d = digest::load(dir, at, fp);
                crate::util::steps::step!(debug, clock, "loaded the state digest");
                d
            })
        });
        let hashed = digest::of_pieces(&snap.pieces, k);
        let saved = loading.and_then(|h| h.join().ok()).flatten();
        hashed.map(|d| (d.map(|d| (k, d)), saved))
    })
}

/// The note on a version `v` that arrived after version `n` was applied (`p`: the one
/// before it).
fn late_note(v: &ScalarValue, p: Option<&ScalarValue>, n: &ScalarValue) -> String {
    format!(
        "snapshot version {} arrived after version {} was applied: placed into history{}",
        render_version(v),
        render_version(n),
        match p {
            Some(p) => format!(
                " between versions {} and {}",
                render_version(p),
                render_version(n)
            ),
            None => " before it".to_string(),
        }
    )
}

/// The pins of a late version at the next applied one.
#[derive(Debug, PartialEq)]
struct Pins {
    /// Rows of the old state whose values are restored.
    upserts: Vec<u32>,
    /// Rows of the snapshot whose keys are deleted again.
    deletes: Vec<u32>,
}

/// The pins for the keys of `changed` (snapshot rows with keys `sk` against the old state's
/// rows with keys `ok`) that have no event at the next version (`at_n`): a changed value
/// restores the old one, a new key is deleted, a deleted key comes back.
fn pins(
    changed: &crate::semantics::snapshot::Diff,
    sk: &Rows,
    ok: &Rows,
    at_n: &AHashSet<Vec<u8>>,
) -> Pins {
    let old_keys: AHashMap<&[u8], u32> = (0..ok.num_rows())
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
    Pins {
        upserts: pin_upserts,
        deletes: pin_deletes,
    }
}

/// The current rows of the target (open versions for SCD type 2) as data columns.
async fn target_state(setup: &FlowSetup, target: &DeltaTable) -> Result<RecordBatch> {
    let ctx = crate::storage::session::new_session();
    crate::storage::session::register_table(&ctx, "t", target, None).await?;
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
        .map(|b| arrow::cast_batch(&b, &schema))
        .collect::<Result<Vec<_>>>()?;
    if cast.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    // Column by column, each column's pieces freed once merged: a lower peak than a copy of
    // every batch at once.
    let columns = arrow::concat_columns(cast, schema.fields().len())?;
    RecordBatch::try_new(schema, columns).context(|| "reading the target".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantics::snapshot::Diff;
    use deltalake::arrow::array::{ArrayRef, Int64Array};
    use deltalake::arrow::datatypes::DataType;
    use deltalake::arrow::row::{RowConverter, SortField};
    use std::sync::Arc;

    fn rows(keys: &[i64]) -> Rows {
        let converter = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let col: ArrayRef = Arc::new(Int64Array::from(keys.to_vec()));
        converter.convert_columns(&[col]).unwrap()
    }

    /// A late version's changed keys are pinned at the next version unless that version has
    /// an event for them: a changed value restores the old row, a new key is deleted again,
    /// a deleted key comes back.
    #[test]
    fn pins_keep_the_next_version_as_it_was() {
        // The snapshot: 1 changed, 2 new, 3 changed but with an event at the next version.
        let sk = rows(&[1, 2, 3]);
        // The state before: 4 deleted by the snapshot, 5 too but with an event at the next.
        let ok = rows(&[3, 1, 4, 5]);
        let changed = Diff {
            upserts: vec![0, 1, 2],
            deletes: vec![2, 3],
        };
        let at_n: AHashSet<Vec<u8>> = [sk.row(2).data().to_vec(), ok.row(3).data().to_vec()]
            .into_iter()
            .collect();
        assert_eq!(
            pins(&changed, &sk, &ok, &at_n),
            Pins {
                upserts: vec![1, 2],
                deletes: vec![1],
            }
        );
        assert_eq!(
            pins(&changed, &sk, &ok, &AHashSet::new()),
            Pins {
                upserts: vec![1, 0, 2, 3],
                deletes: vec![1],
            }
        );
    }
}
