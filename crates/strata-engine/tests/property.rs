//! Property tests: random change streams over a small key space, split into random batches
//! delivered in random order (some delivered twice), run through the real engine on real
//! Delta tables and compared with the reference model of `strata-core` after EVERY run: after
//! each delivery the target must equal the reference fold of all events delivered so far.
//!
//! What the generated cases cover (see `Shape`):
//! - SCD type 1 and SCD type 2 (with or without `TRACK HISTORY`, SCD2 invariants checked
//!   after every run), both with truncates (R3: SCD1 drops what is older, SCD2 closes every
//!   open version), `IGNORE NULL UPDATES`, deletion vectors on or off;
//! - keys: one BIGINT (a negative value and one above 2^53 among them), two columns (BIGINT,
//!   STRING) or one STRING (empty, case variants, non-ASCII, a quote);
//! - ties (R5): events at one key and sequence value: identical duplicates (collapse), a
//!   delete next to an upsert (the delete wins), an upsert at a truncate's sequence
//!   (discarded), and in some cases two different upserts: the run that delivers them must
//!   fail naming the key and the sequence value, and leave the target as it was; later runs
//!   fail too until a delete at that key and sequence (or a truncate above it) settles it;
//! - two AUTO CDC flows from two sources into one target (the target is the fold of the
//!   union of their events);
//! - SCD type 2 targets partitioned by their start (`strata.scd.partitionBy`, the MERGE path);
//! - SCD type 1 targets of one flow with the tombstone threshold at 0, so every delete
//!   expires after its run; their reference folds the events left once the expired deletes are forgotten with
//!   what they hid (`folded_events`).
//!
//! AUTO CDC FROM SNAPSHOT has its own property (snapshots delivered in any order, some first
//! with wrong content), also compared after every run, partitioned targets included.
//!
//! Budgets (each property): at most `PROPTEST_CASES` cases (default 256) and a wall-clock
//! budget `STRATA_PROPERTY_SECS` (default 180 s for the change-event property, 75 s for the
//! snapshot one): once the budget is spent no new case is run (proptest still draws them,
//! which costs nothing). A failing case is shrunk whatever the budget (at most 256 steps or
//! 10 minutes; `PROPTEST_MAX_SHRINK_ITERS` changes the steps), and its seed is saved in
//! `tests/property.regressions`, which is committed and replayed first on every run (a seed
//! replays its case only while the strategies below are unchanged).
//!
//! The engine reads `STRATA_PARALLEL_MIN_ROWS` once per process (default 500000 rows: below
//! that folds, writes and digests run on one thread). `parallel_paths_equal_the_reference`
//! therefore runs this test binary again as a child process with the variable at 1 and a
//! budget of `STRATA_PROPERTY_PARALLEL_SECS` (default 50 s) per property, so the parallel
//! paths meet the reference in CI too. `scripts/property-long.sh` runs many more cases.

use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use strata_core::reference::{self, RefEvent, RefFlow};
use strata_core::EventKind;
use strata_engine::Warehouse;

const ENGINE_PROPERTY: &str = "engine_equals_reference_under_any_arrival_order";
const SNAPSHOT_PROPERTY: &str = "snapshots_in_any_order_equal_version_order";

// ---------------------------------------------------------------------------------------
// Budgets.

/// The case limit of every property: `PROPTEST_CASES`, else 256.
fn case_limit() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

/// A wall-clock budget for one property: cases drawn after it is spent are not run.
struct Budget {
    name: &'static str,
    default_secs: u64,
    start: OnceLock<Instant>,
    ran: AtomicUsize,
    skipped: AtomicUsize,
    /// Once a case failed, every case runs: shrinking must not stop at the budget.
    failing: AtomicBool,
}

impl Budget {
    const fn new(name: &'static str, default_secs: u64) -> Self {
        Budget {
            name,
            default_secs,
            start: OnceLock::new(),
            ran: AtomicUsize::new(0),
            skipped: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
        }
    }

    fn secs(&self) -> u64 {
        std::env::var("STRATA_PROPERTY_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.default_secs)
    }

    /// True when the next case should run.
    fn admit(&self) -> bool {
        let start = *self.start.get_or_init(Instant::now);
        let within = start.elapsed() < Duration::from_secs(self.secs());
        if within || self.failing.load(Ordering::SeqCst) {
            let ran = self.ran.fetch_add(1, Ordering::SeqCst) + 1;
            if ran == case_limit() as usize {
                eprintln!(
                    "{}: all {ran} cases run in {:.0?} ({})",
                    self.name,
                    start.elapsed(),
                    tallied(self.name)
                );
            }
            return true;
        }
        if self.skipped.fetch_add(1, Ordering::SeqCst) == 0 {
            eprintln!(
                "{}: the {} s budget is spent after {} cases; the rest are not run ({})",
                self.name,
                self.secs(),
                self.ran.load(Ordering::SeqCst),
                tallied(self.name)
            );
        }
        false
    }

    fn failed(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }
}

static ENGINE_BUDGET: Budget = Budget::new(ENGINE_PROPERTY, 180);
static SNAPSHOT_BUDGET: Budget = Budget::new(SNAPSHOT_PROPERTY, 75);

/// What the cases run so far exercised (printed with the budget's summary, `--nocapture`).
static TALLY: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn tally(what: impl Into<String>) {
    if let Ok(mut t) = TALLY.lock() {
        *t.entry(what.into()).or_default() += 1;
    }
}

fn tallied(prefix: &str) -> String {
    TALLY.lock().map_or(String::new(), |t| {
        t.iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| format!("{k} {v}")))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

// ---------------------------------------------------------------------------------------
// Keys.

/// The key columns of a case. A case's events carry a key index (`RefEvent::key`, what the
/// reference folds by); the shape turns it into column values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// `id BIGINT`: [`INT_KEYS`].
    Int,
    /// `id BIGINT, region STRING`: index `k` is `(k / 2, ["x", "y"][k % 2])`, so keys share
    /// one column's value with others.
    Composite,
    /// `id STRING`: [`TEXT_KEYS`].
    Text,
}

/// A negative key and one above 2^53 (a JSON reader going through f64 would merge it with
/// its neighbour).
const INT_KEYS: [i64; 4] = [3, -2, 0, 9_007_199_254_740_993];
/// Empty, two that differ only in case, non-ASCII, a space, a quote and a `|`.
const TEXT_KEYS: [&str; 6] = ["a", "A", "", "é", "a b", "q\"u|"];

impl Keys {
    /// How many distinct keys (indices `0..count`).
    fn count(self) -> i64 {
        match self {
            Keys::Int => INT_KEYS.len() as i64,
            Keys::Composite => 6,
            Keys::Text => TEXT_KEYS.len() as i64,
        }
    }

    fn ddl(self) -> &'static str {
        match self {
            Keys::Int => "id BIGINT",
            Keys::Composite => "id BIGINT, region STRING",
            Keys::Text => "id STRING",
        }
    }

    fn names(self) -> &'static str {
        match self {
            Keys::Int | Keys::Text => "id",
            Keys::Composite => "id, region",
        }
    }

    /// The column values of key `k`, as (name, JSON, rendered) triples.
    fn columns(self, k: i64) -> Vec<(&'static str, String, String)> {
        let text = |s: &str| (serde_json::Value::from(s).to_string(), s.to_string());
        match self {
            Keys::Int => {
                let v = INT_KEYS[k as usize];
                vec![("id", v.to_string(), v.to_string())]
            }
            Keys::Composite => {
                let (j, r) = text(["x", "y"][k as usize % 2]);
                vec![
                    ("id", (k / 2).to_string(), (k / 2).to_string()),
                    ("region", j, r),
                ]
            }
            Keys::Text => {
                let (j, r) = text(TEXT_KEYS[k as usize]);
                vec![("id", j, r)]
            }
        }
    }

    /// The JSON fields of key `k`, or all NULL (a truncate's row).
    fn json(self, k: Option<i64>) -> String {
        self.columns(k.unwrap_or(0))
            .into_iter()
            .map(|(n, j, _)| format!("\"{n}\": {}", if k.is_some() { &j } else { "null" }))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Key `k` as a query prints its columns, joined with `|`.
    fn render(self, k: i64) -> String {
        self.columns(k)
            .into_iter()
            .map(|(_, _, r)| r)
            .collect::<Vec<_>>()
            .join("|")
    }

    /// Key `k` as an error names it (`id=1, region=y`).
    fn describe(self, k: i64) -> String {
        self.columns(k)
            .into_iter()
            .map(|(n, _, r)| format!("{n}={r}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// ---------------------------------------------------------------------------------------
// AUTO CDC INTO: change events.

/// Which ties a case generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ties {
    None,
    /// Identical duplicates, a delete next to an upsert, an upsert at a truncate's sequence.
    Settled,
    /// Also two different upserts at one key and sequence (single-flow cases without
    /// tombstone expiry only: with two flows one flow may commit before the other fails).
    Conflicting,
}

/// A case's options.
#[derive(Debug, Clone, Copy)]
struct Shape {
    scd2: bool,
    ignore_nulls: bool,
    track_city: bool,
    /// The target enables deletion vectors: replaced rows are marked, not rewritten.
    deletion_vectors: bool,
    /// SCD type 1 with `pipelines.cdc.tombstoneGCThresholdInSeconds = 0`: a delete expires
    /// as soon as its run is over, and later runs forget it with the events it hid.
    expire: bool,
    keys: Keys,
    /// Two flows from two sources (`cdc`, `cdc2`) into the target.
    two_flows: bool,
    /// SCD type 2 target partitioned by its start column (written through MERGE).
    partitioned: bool,
    ties: Ties,
    /// `strata optimize` and `strata vacuum --retain 0` (protecting the pipeline's readers)
    /// between runs: upkeep never changes what a run reads or writes.
    upkeep: bool,
}

/// An event and the flow (source) it is delivered through.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    flow: usize,
    event: RefEvent,
}

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    /// Batch boundaries over the shuffled events.
    batches: Vec<Vec<Ev>>,
    /// Index of a batch delivered a second time (at the end), if any.
    replay: Option<usize>,
}

fn value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![3 => "[ab]".prop_map(Some), 1 => Just(None)]
}

fn keys() -> impl Strategy<Value = Keys> {
    prop_oneof![2 => Just(Keys::Int), 1 => Just(Keys::Composite), 1 => Just(Keys::Text)]
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), keys(), prop::bool::weighted(0.3)),
        (
            prop::bool::weighted(0.35),
            prop_oneof![
                2 => Just(Ties::None),
                2 => Just(Ties::Settled),
                2 => Just(Ties::Conflicting)
            ],
            prop::bool::weighted(0.3),
        ),
    )
        .prop_map(
            |(
                (scd2, ignore_nulls, track_city, deletion_vectors),
                (expire, keys, two_flows),
                (partitioned, ties, upkeep),
            )| {
                // Expiry is timed per flow run: with two flows into the target and a
                // threshold of 0, a delete one flow processed has expired by the time the
                // other flow runs in the same pipeline run, so an older event it delivers
                // brings the key back. The reference expires at pipeline-run granularity.
                let expire = expire && !scd2 && !two_flows;
                Shape {
                    scd2,
                    ignore_nulls,
                    track_city,
                    deletion_vectors,
                    expire,
                    keys,
                    two_flows,
                    partitioned: partitioned && scd2,
                    upkeep,
                    ties: if ties == Ties::Conflicting && (two_flows || expire) {
                        Ties::Settled
                    } else {
                        ties
                    },
                }
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    shape().prop_flat_map(|s| {
        let n = s.keys.count();
        let flows: usize = if s.two_flows { 2 } else { 1 };
        let event =
            (0..n, 0u8..10, value(), value(), 0..flows).prop_map(move |(key, k, a, b, flow)| {
                let kind = match k {
                    0 | 1 => EventKind::Delete,
                    2 => EventKind::Truncate,
                    _ => EventKind::Upsert,
                };
                Ev {
                    flow,
                    event: RefEvent {
                        key,
                        seq: 0,
                        kind,
                        values: vec![a, b],
                    },
                }
            });
        // (which event to tie with, how, key and values for a new event, flow)
        let tie = (
            any::<prop::sample::Index>(),
            0u8..8,
            0..n,
            value(),
            value(),
            0..flows,
        );
        let n_ties = if s.ties == Ties::None { 0..1 } else { 1..4 };
        (
            proptest::collection::vec(event, 1..25),
            proptest::collection::vec(tie, n_ties),
            any::<u64>(),
            1usize..5,
            any::<bool>(),
        )
            .prop_map(move |(mut events, ties, seed, n_batches, replay)| {
                // Unique sequence values for the drawn events; ties copy one.
                for (i, e) in events.iter_mut().enumerate() {
                    e.event.seq = i as i64 * 10 + 1;
                }
                let drawn = events.len();
                for (ix, how, key, a, b, flow) in ties {
                    let orig = events[ix.index(drawn)].event.clone();
                    let mut e = orig.clone();
                    let conflicting = s.ties == Ties::Conflicting;
                    match (orig.kind, how) {
                        // Two different upserts: a conflict (half of the ties of such cases).
                        (EventKind::Upsert, 4..) if conflicting => {
                            e.values = vec![a, b];
                            if e.values == orig.values {
                                e.values[0] = match e.values[0].as_deref() {
                                    Some("a") => Some("b".into()),
                                    _ => Some("a".into()),
                                };
                            }
                        }
                        // An identical duplicate.
                        (_, 0..=2) => {}
                        // An upsert at a truncate's sequence: discarded with what it truncates.
                        (EventKind::Truncate, _) => {
                            e = RefEvent {
                                key,
                                seq: orig.seq,
                                kind: EventKind::Upsert,
                                values: vec![a, b],
                            };
                        }
                        // A delete next to the upsert, or an upsert next to the delete.
                        (EventKind::Upsert, 3..=5) | (EventKind::Delete, _) => {
                            e.kind = match orig.kind {
                                EventKind::Upsert => EventKind::Delete,
                                _ => EventKind::Upsert,
                            };
                            e.values = vec![a, b];
                        }
                        (EventKind::Upsert, _) => {}
                    }
                    // Two ties on one delete or truncate put two upserts at its sequence;
                    // delivered before it, different ones conflict. Outside `Conflicting`
                    // cases a later one copies the first's values (regression:
                    // `one_flow_commits_before_another_fails`).
                    if !conflicting && e.kind == EventKind::Upsert {
                        if let Some(first) = events.iter().find(|x| {
                            x.event.kind == EventKind::Upsert
                                && x.event.key == e.key
                                && x.event.seq == e.seq
                        }) {
                            e.values = first.event.values.clone();
                        }
                    }
                    events.push(Ev { flow, event: e });
                }
                // A deterministic shuffle for arrival order.
                let mut s_ = seed | 1;
                for i in (1..events.len()).rev() {
                    s_ ^= s_ << 13;
                    s_ ^= s_ >> 7;
                    s_ ^= s_ << 17;
                    events.swap(i, (s_ % (i as u64 + 1)) as usize);
                }
                let size = events.len().div_ceil(n_batches);
                let batches: Vec<Vec<Ev>> = events.chunks(size).map(|c| c.to_vec()).collect();
                let replay = replay.then(|| (seed as usize) % batches.len());
                Case {
                    shape: s,
                    batches,
                    replay,
                }
            })
    })
}

impl Case {
    /// The batches in delivery order, the replayed one again at the end.
    fn deliveries(&self) -> Vec<&Vec<Ev>> {
        let mut out: Vec<&Vec<Ev>> = self.batches.iter().collect();
        if let Some(r) = self.replay {
            out.push(&self.batches[r]);
        }
        out
    }

    fn flows(&self) -> usize {
        if self.shape.two_flows {
            2
        } else {
            1
        }
    }
}

fn json_line(keys: Keys, e: &RefEvent) -> String {
    let v = |x: &Option<String>| {
        x.as_ref()
            .map_or("null".to_string(), |s| format!("\"{s}\""))
    };
    let (key, op) = match e.kind {
        EventKind::Upsert => (Some(e.key), "U"),
        EventKind::Delete => (Some(e.key), "D"),
        EventKind::Truncate => (None, "T"),
    };
    format!(
        "{{{}, \"name\": {}, \"city\": {}, \"op\": \"{op}\", \"seq\": {}}}",
        keys.json(key),
        v(&e.values[0]),
        v(&e.values[1]),
        e.seq
    )
}

/// Source table, input folder and flow name of flow `f`.
fn flow_names(f: usize) -> (&'static str, &'static str, &'static str) {
    match f {
        0 => ("cdc", "data", "f"),
        _ => ("cdc2", "data2", "f2"),
    }
}

/// The target statement: `CREATE OR REFRESH STREAMING TABLE t [TBLPROPERTIES (...)];`.
fn target_table(deletion_vectors: bool, partitioned: bool, expire: bool) -> String {
    let mut props = Vec::new();
    if !deletion_vectors {
        props.push("'delta.enableDeletionVectors' = 'false'");
    }
    if partitioned {
        props.push("'strata.scd.partitionBy' = 'start'");
    }
    if expire {
        props.push("'pipelines.cdc.tombstoneGCThresholdInSeconds' = '0'");
    }
    if props.is_empty() {
        "CREATE OR REFRESH STREAMING TABLE t;\n".into()
    } else {
        format!(
            "CREATE OR REFRESH STREAMING TABLE t TBLPROPERTIES ({});\n",
            props.join(", ")
        )
    }
}

fn pipeline(c: &Case) -> String {
    let s = &c.shape;
    let mut sql = String::new();
    for f in 0..c.flows() {
        let (source, folder, _) = flow_names(f);
        let _ = writeln!(
            sql,
            "CREATE OR REFRESH STREAMING TABLE {source} AS SELECT * FROM STREAM read_files('{folder}', \
             format => 'json', schema => '{}, name STRING, city STRING, op STRING, seq BIGINT');",
            s.keys.ddl()
        );
    }
    sql.push_str(&target_table(s.deletion_vectors, s.partitioned, s.expire));
    for f in 0..c.flows() {
        let (source, _, flow) = flow_names(f);
        let _ = writeln!(
            sql,
            "CREATE FLOW {flow} AS AUTO CDC INTO t FROM STREAM({source}) KEYS ({})",
            s.keys.names()
        );
        if s.ignore_nulls {
            sql.push_str("IGNORE NULL UPDATES\n");
        }
        sql.push_str("APPLY AS DELETE WHEN op = 'D'\n");
        sql.push_str("APPLY AS TRUNCATE WHEN op = 'T'\n");
        sql.push_str("SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)\n");
        if s.scd2 {
            sql.push_str("STORED AS SCD TYPE 2\n");
            if !s.track_city {
                sql.push_str("TRACK HISTORY ON * EXCEPT (city)\n");
            }
        } else {
            sql.push_str("STORED AS SCD TYPE 1\n");
        }
        sql.push_str(";\n");
    }
    sql
}

fn cell(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "NULL".into())
}

/// The events the fold sees after delivery `last`: every event delivered so far, unless
/// the target forgets expired tombstones. Then (threshold 0) each delete delivered before
/// delivery `last` is forgotten with the events of its key at or below its sequence
/// delivered no later than it (`tombstones.rs`); a redelivered event counts once.
fn folded_events(c: &Case, last: usize) -> Vec<RefEvent> {
    let deliveries = c.deliveries();
    let stored: Vec<(usize, &RefEvent)> = deliveries[..=last]
        .iter()
        .enumerate()
        .flat_map(|(run, batch)| batch.iter().map(move |e| (run, &e.event)))
        .collect();
    if !c.shape.expire {
        return stored.into_iter().map(|(_, e)| e.clone()).collect();
    }
    let forgotten = |(run, e): &(usize, &RefEvent)| {
        e.kind != EventKind::Truncate
            && stored.iter().any(|(d_run, d)| {
                d.kind == EventKind::Delete
                    && *d_run < last
                    && d.key == e.key
                    && e.seq <= d.seq
                    && run <= d_run
            })
    };
    let mut kept: Vec<RefEvent> = Vec::new();
    for s in stored.iter().filter(|s| !forgotten(s)) {
        if !kept.contains(s.1) {
            kept.push(s.1.clone());
        }
    }
    kept
}

/// The target's rows (sorted) after delivery `last`, or the conflicting ties (key, sequence)
/// that must make that run fail.
fn expected(c: &Case, last: usize) -> Result<Vec<String>, Vec<(i64, i64)>> {
    let s = &c.shape;
    let events = folded_events(c, last);
    let ties = match s.scd2 {
        true => reference::conflicting_ties_scd2(&events),
        false => reference::conflicting_ties(&events),
    };
    if !ties.is_empty() {
        return Err(ties);
    }
    let flow = RefFlow {
        ignore_null_updates: s.ignore_nulls,
        tracked: vec![true, !s.scd2 || s.track_city],
    };
    let mut rows: Vec<String> = if s.scd2 {
        reference::scd2(&flow, &events)
            .expect("no conflicting ties")
            .into_iter()
            .map(|(k, v, start, end)| {
                format!(
                    "{}|{}|{}|{start}|{}",
                    s.keys.render(k),
                    cell(&v[0]),
                    cell(&v[1]),
                    end.map_or("NULL".into(), |e| e.to_string())
                )
            })
            .collect()
    } else {
        reference::scd1(&flow, &events)
            .expect("no conflicting ties")
            .into_iter()
            .map(|(k, v)| format!("{}|{}|{}", s.keys.render(k), cell(&v[0]), cell(&v[1])))
            .collect()
    };
    rows.sort();
    Ok(rows)
}

async fn actual(wh: &Warehouse, s: &Shape) -> Result<Vec<String>, String> {
    let sql = if s.scd2 {
        format!(
            "SELECT {}, name, city, __START_AT, __END_AT FROM t",
            s.keys.names()
        )
    } else {
        format!("SELECT {}, name, city FROM t", s.keys.names())
    };
    let mut rows = rows_of(wh, &sql).await?;
    rows.sort();
    Ok(rows)
}

async fn run_case(c: &Case) -> Result<(), String> {
    let s = &c.shape;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for f in 0..c.flows() {
        std::fs::create_dir_all(dir.path().join(flow_names(f).1)).map_err(|e| e.to_string())?;
    }
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, pipeline(c)).map_err(|e| e.to_string())?;
    let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
    let context = |i: usize| format!("pipeline:\n{}after delivery {i}", pipeline(c));
    let t = |what: &str| tally(format!("{ENGINE_PROPERTY}{what}"));
    t(if s.scd2 { "scd2" } else { "scd1" });
    t(match s.keys {
        Keys::Int => "bigint key",
        Keys::Composite => "composite key",
        Keys::Text => "string key",
    });
    for (on, what) in [
        (s.two_flows, "two flows"),
        (s.partitioned, "partitioned"),
        (s.expire, "expiring tombstones"),
        (s.ties != Ties::None, "ties"),
        (s.upkeep, "optimize and vacuum between runs"),
    ] {
        if on {
            t(what);
        }
    }
    // The target after the last successful run (`None`: no run succeeded yet).
    let mut last_good: Option<Vec<String>> = None;
    for (i, batch) in c.deliveries().iter().enumerate() {
        for f in 0..c.flows() {
            let mut text = String::new();
            for e in batch.iter().filter(|e| e.flow == f) {
                let _ = writeln!(text, "{}", json_line(s.keys, &e.event));
            }
            if !text.is_empty() {
                let path = dir
                    .path()
                    .join(flow_names(f).1)
                    .join(format!("{i:04}.json"));
                std::fs::write(path, text).map_err(|e| e.to_string())?;
            }
        }
        let run = strata_engine::run_pipeline_file(&pipeline_path, &wh).await;
        match expected(c, i) {
            Ok(want) => {
                if let Err(e) = run {
                    return Err(format!(
                        "run {i} failed: {}\n{}",
                        strata_engine::chain(&e),
                        context(i)
                    ));
                }
                if s.scd2 {
                    let v = strata_engine::validate(&wh, "t")
                        .await
                        .map_err(|e| e.to_string())?;
                    if !v.is_empty() {
                        return Err(format!(
                            "run {i}: SCD2 invariants broken: {v:?}\n{}",
                            context(i)
                        ));
                    }
                }
                let got = actual(&wh, s).await?;
                if got != want {
                    return Err(format!(
                        "{}\nexpected:\n{}\ngot:\n{}",
                        context(i),
                        want.join("\n"),
                        got.join("\n")
                    ));
                }
                if s.partitioned && i == 0 {
                    // The option took effect: the target's files live in start partitions.
                    let table = dir.path().join("wh").join("default").join("t");
                    let parts = std::fs::read_dir(&table)
                        .map_err(|e| format!("{}: {e}", table.display()))?
                        .filter_map(|e| e.ok())
                        .filter(|e| e.file_name().to_string_lossy().starts_with("__START_AT="))
                        .count();
                    if parts == 0 && !got.is_empty() {
                        return Err(format!("no __START_AT= partitions in {}", table.display()));
                    }
                }
                t("runs compared");
                last_good = Some(got);
                if s.upkeep {
                    upkeep(&wh, &pipeline_path).await?;
                    let after = actual(&wh, s).await?;
                    if Some(&after) != last_good.as_ref() {
                        return Err(format!(
                            "run {i}: optimize and vacuum changed the target\n{}",
                            context(i)
                        ));
                    }
                }
            }
            Err(ties) => {
                let message = match run {
                    Ok(_) => {
                        return Err(format!(
                            "run {i} succeeded, but the events delivered so far hold conflicting \
                             ties at (key, sequence) {ties:?}\n{}",
                            context(i)
                        ))
                    }
                    Err(e) => strata_engine::chain(&e),
                };
                let named = ties.iter().any(|(k, seq)| {
                    message.contains(&format!(
                        "two different upserts for key ({}) at the same sequence value {seq}",
                        s.keys.describe(*k)
                    ))
                });
                if !named {
                    return Err(format!(
                        "run {i}: the error does not name one of the conflicting ties \
                         {ties:?}: {message}\n{}",
                        context(i)
                    ));
                }
                // Nothing of the failed run reaches the target (before any successful run
                // the target may not exist yet).
                let got = match &last_good {
                    Some(_) => actual(&wh, s).await?,
                    None => actual(&wh, s).await.unwrap_or_default(),
                };
                t("runs failing on a conflicting tie, as expected");
                let before = last_good.clone().unwrap_or_default();
                if got != before {
                    return Err(format!(
                        "run {i} failed on a conflicting tie ({message}) but changed the target\n{}\nbefore:\n{}\nafter:\n{}",
                        context(i),
                        before.join("\n"),
                        got.join("\n")
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every table and event store compacted (expired tombstones forgotten by the pipeline's
/// flows), then every file no version needs removed at once (the pipeline's readers
/// protected), as `strata optimize --pipeline pipeline.sql` and `strata vacuum --retain 0
/// --allow-short-retention --pipeline pipeline.sql` do.
async fn upkeep(wh: &Warehouse, pipeline: &std::path::Path) -> Result<(), String> {
    let optimize = strata_engine::OptimizeOptions {
        pipelines: vec![pipeline.to_path_buf()],
        ..Default::default()
    };
    strata_engine::optimize(wh, &optimize)
        .await
        .map_err(|e| format!("optimize: {}", strata_engine::chain(&e)))?;
    let vacuum = strata_engine::VacuumOptions {
        retain_hours: 0.0,
        allow_short_retention: true,
        pipelines: vec![pipeline.to_path_buf()],
        ..Default::default()
    };
    strata_engine::vacuum(wh, &vacuum)
        .await
        .map_err(|e| format!("vacuum: {}", strata_engine::chain(&e)))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// AUTO CDC FROM SNAPSHOT: snapshots delivered in any order, some first with wrong content and
// then redelivered, equal the snapshots applied in version order (reference model), after
// every run: the versions delivered so far, each with the content it was last delivered with.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapMode {
    Scd1,
    Scd2,
    Scd2TrackName,
    Snapshots,
}

#[derive(Debug, Clone)]
struct SnapCase {
    /// The final content of each version.
    snapshots: Vec<reference::RefSnapshot>,
    /// Runs, each a list of deliveries (version, rows); a version at most once per run.
    runs: Vec<Vec<reference::RefSnapshot>>,
    mode: SnapMode,
    deletion_vectors: bool,
    /// SCD2 or SNAPSHOTS target partitioned by its start column.
    partitioned: bool,
}

fn snapshot_rows() -> impl Strategy<Value = std::collections::BTreeMap<i64, Vec<Option<String>>>> {
    proptest::collection::btree_map(
        0i64..5,
        (value(), value()).prop_map(|(a, b)| vec![a, b]),
        0..5,
    )
}

fn snap_case() -> impl Strategy<Value = SnapCase> {
    (
        proptest::collection::vec(snapshot_rows(), 1..6),
        proptest::collection::vec(snapshot_rows(), 0..3),
        any::<u64>(),
        1usize..5,
        prop_oneof![
            Just(SnapMode::Scd1),
            Just(SnapMode::Scd2),
            Just(SnapMode::Scd2TrackName),
            Just(SnapMode::Snapshots)
        ],
        any::<bool>(),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(finals, wrong, seed, per_run, mode, deletion_vectors, partitioned)| {
                let snapshots: Vec<reference::RefSnapshot> = finals
                    .into_iter()
                    .enumerate()
                    .map(|(i, rows)| (i as i64 * 10 + 10, rows))
                    .collect();
                // Deliveries: every final version, plus wrong first deliveries of some versions.
                let mut s = seed | 1;
                let mut next = || {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s
                };
                let mut order: Vec<reference::RefSnapshot> = snapshots.clone();
                for i in (1..order.len()).rev() {
                    let j = (next() % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                // A version without rows cannot be delivered as rows: it never arrives.
                order.retain(|d| !d.1.is_empty());
                for rows in wrong {
                    if order.is_empty() || rows.is_empty() {
                        break;
                    }
                    let v = order[(next() % order.len() as u64) as usize].0;
                    // The wrong delivery goes before the final one of the same version.
                    let pos = order.iter().position(|d| d.0 == v).unwrap_or(0);
                    let at = (next() % (pos as u64 + 1)) as usize;
                    order.insert(at, (v, rows));
                }
                let mut runs: Vec<Vec<reference::RefSnapshot>> = Vec::new();
                for d in order {
                    let fits = runs
                        .last()
                        .is_some_and(|r| r.len() < per_run && r.iter().all(|x| x.0 != d.0));
                    if fits {
                        if let Some(r) = runs.last_mut() {
                            r.push(d);
                        }
                    } else {
                        runs.push(vec![d]);
                    }
                }
                SnapCase {
                    snapshots,
                    runs,
                    mode,
                    deletion_vectors,
                    partitioned: partitioned && mode != SnapMode::Scd1,
                }
            },
        )
}

fn snap_pipeline(c: &SnapCase) -> String {
    let stored = match c.mode {
        SnapMode::Scd1 => "SCD TYPE 1",
        SnapMode::Scd2 | SnapMode::Scd2TrackName => "SCD TYPE 2",
        SnapMode::Snapshots => "SNAPSHOTS",
    };
    let track = if c.mode == SnapMode::Scd2TrackName {
        " TRACK HISTORY ON name"
    } else {
        ""
    };
    format!(
        "CREATE OR REFRESH STREAMING TABLE deliveries AS SELECT * FROM STREAM read_files('data', \
         format => 'json', schema => 'id BIGINT, name STRING, city STRING, v BIGINT');\n\
         {}\
         CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM STREAM(deliveries) KEYS (id)\n\
         SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS {stored}{track};",
        target_table(c.deletion_vectors, c.partitioned, false)
    )
}

/// The expected rows (in query order) when `snapshots` are the versions delivered so far.
fn snap_expected(mode: SnapMode, snapshots: &[reference::RefSnapshot]) -> Vec<String> {
    let row = |k: &i64, v: &[Option<String>]| format!("{k}|{}|{}", cell(&v[0]), cell(&v[1]));
    match mode {
        SnapMode::Scd1 => reference::snapshot_scd1(snapshots)
            .iter()
            .map(|(k, v)| row(k, v))
            .collect(),
        SnapMode::Snapshots => {
            let mut out: Vec<(i64, i64, String)> = Vec::new();
            for (version, rows) in snapshots {
                for (k, v) in rows {
                    out.push((*k, *version, format!("{}|{version}|{version}", row(k, v))));
                }
            }
            out.sort();
            out.into_iter().map(|x| x.2).collect()
        }
        SnapMode::Scd2 | SnapMode::Scd2TrackName => {
            let flow = RefFlow {
                ignore_null_updates: false,
                tracked: vec![true, mode == SnapMode::Scd2],
            };
            reference::snapshot_scd2(&flow, snapshots)
                .into_iter()
                .map(|(k, v, s, e)| {
                    format!(
                        "{}|{s}|{}",
                        row(&k, &v),
                        e.map_or("NULL".into(), |e| e.to_string())
                    )
                })
                .collect()
        }
    }
}

async fn run_snap_case(c: &SnapCase) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, snap_pipeline(c)).map_err(|e| e.to_string())?;
    let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
    let scd2 = matches!(c.mode, SnapMode::Scd2 | SnapMode::Scd2TrackName);
    let t = |what: &str| tally(format!("{SNAPSHOT_PROPERTY}{what}"));
    t(&format!("{:?}", c.mode));
    if c.partitioned {
        t("partitioned");
    }
    let sql = match c.mode {
        SnapMode::Scd1 => "SELECT id, name, city FROM t ORDER BY id",
        _ => "SELECT id, name, city, __START_AT, __END_AT FROM t ORDER BY id, __START_AT",
    };
    // Each version delivered so far, with the content it was last delivered with.
    let mut delivered: std::collections::BTreeMap<i64, reference::RefSnapshot> =
        std::collections::BTreeMap::new();
    for (i, run) in c.runs.iter().enumerate() {
        let mut text = String::new();
        for (version, rows) in run {
            delivered.insert(*version, (*version, rows.clone()));
            for (k, v) in rows {
                let json =
                    |x: &Option<String>| x.as_ref().map_or("null".into(), |s| format!("\"{s}\""));
                let _ = writeln!(
                    text,
                    "{{\"id\": {k}, \"name\": {}, \"city\": {}, \"v\": {version}}}",
                    json(&v[0]),
                    json(&v[1])
                );
            }
        }
        // Every delivery has rows (see `snap_case`); an empty run would deliver nothing.
        if text.is_empty() {
            continue;
        }
        std::fs::write(data.join(format!("{i:04}.json")), text).map_err(|e| e.to_string())?;
        strata_engine::run_pipeline_file(&pipeline_path, &wh)
            .await
            .map_err(|e| format!("run {i}: {}", strata_engine::chain(&e)))?;
        if scd2 {
            let v = strata_engine::validate(&wh, "t")
                .await
                .map_err(|e| e.to_string())?;
            if !v.is_empty() {
                return Err(format!("run {i}: SCD2 invariants broken: {v:?}"));
            }
        }
        let so_far: Vec<reference::RefSnapshot> = delivered.values().cloned().collect();
        let want = snap_expected(c.mode, &so_far);
        let got = rows_of(&wh, sql).await?;
        t("runs compared");
        if got != want {
            return Err(format!(
                "pipeline:\n{}\nafter run {i} of {:?}\nexpected:\n{}\ngot:\n{}",
                snap_pipeline(c),
                c.runs,
                want.join("\n"),
                got.join("\n")
            ));
        }
    }
    // The generator's promise: every version was last delivered with its final content.
    let finals: Vec<&reference::RefSnapshot> =
        c.snapshots.iter().filter(|s| !s.1.is_empty()).collect();
    if delivered.values().collect::<Vec<_>>() != finals {
        return Err(format!(
            "the case does not end with the final snapshots: {c:?}"
        ));
    }
    Ok(())
}

async fn rows_of(wh: &Warehouse, sql: &str) -> Result<Vec<String>, String> {
    let (_, batches) = strata_engine::query(wh, sql)
        .await
        .map_err(|e| format!("{sql}: {}", strata_engine::chain(&e)))?;
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let f: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("format"))
            .collect();
        for r in 0..b.num_rows() {
            out.push(
                f.iter()
                    .map(|x| x.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    Ok(out)
}

/// Runs one case on a fresh two-thread runtime (each case runs the real pipeline).
fn block_on(case: impl std::future::Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(case)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: case_limit(),
        max_shrink_iters: std::env::var("PROPTEST_MAX_SHRINK_ITERS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        // Shrinking runs whole cases too; stop after 10 minutes with the smallest so far.
        max_shrink_time: 600_000,
        // Failing seeds land in tests/property.regressions (committed) and run first.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        .. ProptestConfig::default()
    })]

    #[test]
    fn engine_equals_reference_under_any_arrival_order(c in case()) {
        if !ENGINE_BUDGET.admit() {
            return Ok(());
        }
        let result = block_on(run_case(&c));
        if result.is_err() {
            ENGINE_BUDGET.failed();
        }
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }

    #[test]
    fn snapshots_in_any_order_equal_version_order(c in snap_case()) {
        if !SNAPSHOT_BUDGET.admit() {
            return Ok(());
        }
        let result = block_on(run_snap_case(&c));
        if result.is_err() {
            SNAPSHOT_BUDGET.failed();
        }
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}

/// Both properties again in a child process of this test binary with
/// `STRATA_PARALLEL_MIN_ROWS=1`, so every fold, write and digest takes its parallel path,
/// and `STRATA_STREAM_MIN_ROWS=1`, so every first load of a change flow is a bulk load
/// (the engine reads the variables once per process, hence the child). Skipped when the
/// variable is already set: then this process is on those paths itself.
#[test]
fn parallel_paths_equal_the_reference() {
    if std::env::var_os("STRATA_PARALLEL_MIN_ROWS").is_some() {
        eprintln!("STRATA_PARALLEL_MIN_ROWS is set: the other properties run on those paths");
        return;
    }
    let secs = std::env::var("STRATA_PROPERTY_PARALLEL_SECS").unwrap_or_else(|_| "50".into());
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args(["--exact", ENGINE_PROPERTY, SNAPSHOT_PROPERTY])
        .args(["--test-threads=2", "--nocapture"])
        .env("STRATA_PARALLEL_MIN_ROWS", "1")
        .env("STRATA_STREAM_MIN_ROWS", "1")
        .env("STRATA_PROPERTY_SECS", &secs)
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "with STRATA_PARALLEL_MIN_ROWS=1:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("2 passed"),
        "the child ran other tests than both properties:\n{stdout}"
    );
    eprintln!("with STRATA_PARALLEL_MIN_ROWS=1 ({secs} s per property):\n{stderr}");
}

/// Regression (a case the engine property drew with two flows): flows commit one by one, so
/// when two flows into one target bring two different upserts at one key and sequence, the
/// flow that runs first commits and the other fails naming the tie. The target then holds
/// exactly the first flow's events, folded; once the delete that settles the tie arrives,
/// later runs converge to the reference over every event.
#[test]
fn one_flow_commits_before_another_fails() {
    let ev = |flow: usize, seq: i64, kind: EventKind, values: [Option<&str>; 2]| Ev {
        flow,
        event: RefEvent {
            key: 0,
            seq,
            kind,
            values: values.iter().map(|v| v.map(String::from)).collect(),
        },
    };
    let (a, up, del) = (Some("a"), EventKind::Upsert, EventKind::Delete);
    let c = Case {
        shape: Shape {
            scd2: true,
            ignore_nulls: false,
            track_city: true,
            deletion_vectors: false,
            expire: false,
            keys: Keys::Text,
            two_flows: true,
            partitioned: false,
            ties: Ties::Settled,
            upkeep: false,
        },
        batches: vec![
            vec![
                ev(0, 51, up, [None, a]),
                ev(0, 31, del, [a, a]),
                ev(1, 51, up, [a, a]),
            ],
            vec![ev(0, 51, del, [a, a])],
        ],
        replay: None,
    };
    let result = block_on(async {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let pipeline_path = dir.path().join("pipeline.sql");
        std::fs::write(&pipeline_path, pipeline(&c)).map_err(|e| e.to_string())?;
        let wh = Warehouse::open(dir.path().join("wh")).map_err(|e| e.to_string())?;
        let deliver = |i: usize| -> Result<(), String> {
            for f in 0..2 {
                let folder = dir.path().join(flow_names(f).1);
                std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
                let text: String = c.batches[i]
                    .iter()
                    .filter(|e| e.flow == f)
                    .map(|e| json_line(c.shape.keys, &e.event) + "\n")
                    .collect();
                std::fs::write(folder.join(format!("{i:04}.json")), text)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        deliver(0)?;
        let Err(e) = strata_engine::run_pipeline_file(&pipeline_path, &wh).await else {
            return Err("run 0 succeeded over two different upserts at (a, 51)".into());
        };
        let message = strata_engine::chain(&e);
        if !message.contains("two different upserts for key (id=a) at the same sequence value 51") {
            return Err(format!("run 0 failed for another reason: {message}"));
        }
        // The target holds one flow's events: which one ran first is the scheduler's choice.
        let one_flow = |f: usize| {
            let only = Case {
                batches: vec![c.batches[0]
                    .iter()
                    .filter(|e| e.flow == f)
                    .cloned()
                    .collect()],
                ..c.clone()
            };
            expected(&only, 0).expect("one flow has no tie")
        };
        let got = actual(&wh, &c.shape).await?;
        if got != one_flow(0) && got != one_flow(1) {
            return Err(format!(
                "after the failed run the target is neither flow's events alone:\n{}",
                got.join("\n")
            ));
        }
        deliver(1)?;
        // The flow that failed may meet the tie once more before the other flow commits
        // the delete that settles it; within two runs both have.
        for _ in 0..2 {
            if strata_engine::run_pipeline_file(&pipeline_path, &wh)
                .await
                .is_ok()
            {
                break;
            }
        }
        strata_engine::run_pipeline_file(&pipeline_path, &wh)
            .await
            .map_err(|e| strata_engine::chain(&e))?;
        let want = expected(&c, 1).map_err(|t| format!("ties left: {t:?}"))?;
        let got = actual(&wh, &c.shape).await?;
        if got != want {
            return Err(format!(
                "expected:\n{}\ngot:\n{}",
                want.join("\n"),
                got.join("\n")
            ));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
