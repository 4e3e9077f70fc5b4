//! The reference model: the fold of the semantics page over plain values, written as plainly
//! as possible and independently of [`crate::fold_scd2`]. Property tests compare the real
//! engine (real Delta tables) and the generic fold against it.
//!
//! Keys and sequence values are `i64`, values are `Option<String>` (NULL or text).

use crate::EventKind;
use std::collections::BTreeMap;

pub type Value = Option<String>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefEvent {
    /// Ignored for truncates.
    pub key: i64,
    pub seq: i64,
    pub kind: EventKind,
    pub values: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefFlow {
    pub ignore_null_updates: bool,
    /// `tracked[i]`: column `i` is tracked (SCD2). All `true` without `TRACK HISTORY`.
    pub tracked: Vec<bool>,
}

/// A row of an SCD2 result: key, values, start, end.
pub type RefVersion = (i64, Vec<Value>, i64, Option<i64>);

/// Groups events by key in sequence order after truncates and ties are applied.
/// Errors name the key and sequence of a conflicting tie.
fn events_by_key(events: &[RefEvent]) -> Result<BTreeMap<i64, Vec<RefEvent>>, String> {
    let watermark = events
        .iter()
        .filter(|e| e.kind == EventKind::Truncate)
        .map(|e| e.seq)
        .max();
    let mut by_key: BTreeMap<i64, BTreeMap<i64, Vec<RefEvent>>> = BTreeMap::new();
    for e in events {
        if e.kind == EventKind::Truncate || watermark.is_some_and(|t| e.seq <= t) {
            continue;
        }
        by_key
            .entry(e.key)
            .or_default()
            .entry(e.seq)
            .or_default()
            .push(e.clone());
    }
    let mut out = BTreeMap::new();
    for (key, by_seq) in by_key {
        let mut evs = Vec::new();
        for (seq, tied) in by_seq {
            if let Some(d) = tied.iter().find(|e| e.kind == EventKind::Delete) {
                evs.push(d.clone());
            } else if tied.iter().all(|e| *e == tied[0]) {
                evs.push(tied[0].clone());
            } else {
                return Err(format!("conflicting tie at key {key} seq {seq}"));
            }
        }
        out.insert(key, evs);
    }
    Ok(out)
}

/// SCD type 2's view of truncates (R3): each is a delete of every key at its sequence, so
/// history before it stays and every version open then is closed there.
fn truncates_as_deletes(events: &[RefEvent]) -> Vec<RefEvent> {
    let keys: std::collections::BTreeSet<i64> = events
        .iter()
        .filter(|e| e.kind != EventKind::Truncate)
        .map(|e| e.key)
        .collect();
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        match e.kind {
            EventKind::Truncate => out.extend(keys.iter().map(|&key| RefEvent {
                key,
                seq: e.seq,
                kind: EventKind::Delete,
                values: e.values.clone(),
            })),
            _ => out.push(e.clone()),
        }
    }
    out
}

/// [`conflicting_ties`] for an SCD type 2 target, where a truncate deletes every key at its
/// sequence instead of discarding what is older: exactly when [`scd2`] succeeds.
pub fn conflicting_ties_scd2(events: &[RefEvent]) -> Vec<(i64, i64)> {
    conflicting_ties(&truncates_as_deletes(events))
}

/// Every conflicting tie (R5) among `events`: the (key, sequence) pairs holding two different
/// upserts and no delete, once truncates have discarded what they discard (R3). Empty
/// exactly when [`scd1`] and [`scd2`] succeed; those report only the first.
pub fn conflicting_ties(events: &[RefEvent]) -> Vec<(i64, i64)> {
    let watermark = events
        .iter()
        .filter(|e| e.kind == EventKind::Truncate)
        .map(|e| e.seq)
        .max();
    let mut tied: BTreeMap<(i64, i64), Vec<&RefEvent>> = BTreeMap::new();
    for e in events {
        if e.kind == EventKind::Truncate || watermark.is_some_and(|t| e.seq <= t) {
            continue;
        }
        tied.entry((e.key, e.seq)).or_default().push(e);
    }
    tied.into_iter()
        .filter(|(_, evs)| {
            evs.iter().all(|e| e.kind != EventKind::Delete) && evs.iter().any(|e| *e != evs[0])
        })
        .map(|(at, _)| at)
        .collect()
}

fn fill(flow: &RefFlow, new: &[Value], old: &[Value]) -> Vec<Value> {
    new.iter()
        .zip(old)
        .map(|(n, o)| match n {
            None if flow.ignore_null_updates => o.clone(),
            _ => n.clone(),
        })
        .collect()
}

/// SCD type 1: key → current values.
pub fn scd1(flow: &RefFlow, events: &[RefEvent]) -> Result<BTreeMap<i64, Vec<Value>>, String> {
    let mut out = BTreeMap::new();
    for (key, evs) in events_by_key(events)? {
        let mut state: Option<Vec<Value>> = None;
        for e in evs {
            state = match e.kind {
                EventKind::Delete => None,
                _ => Some(match &state {
                    Some(old) => fill(flow, &e.values, old),
                    None => e.values.clone(),
                }),
            };
        }
        if let Some(s) = state {
            out.insert(key, s);
        }
    }
    Ok(out)
}

/// SCD type 2: every version, ordered by key and start. A truncate closes every version
/// open at its sequence, as a delete of every key would.
pub fn scd2(flow: &RefFlow, events: &[RefEvent]) -> Result<Vec<RefVersion>, String> {
    let mut out = Vec::new();
    for (key, evs) in events_by_key(&truncates_as_deletes(events))? {
        let mut open: Option<(Vec<Value>, i64)> = None;
        for e in evs {
            if e.kind == EventKind::Delete {
                if let Some((v, start)) = open.take() {
                    out.push((key, v, start, Some(e.seq)));
                }
                continue;
            }
            let v = match &open {
                Some((old, _)) => fill(flow, &e.values, old),
                None => e.values.clone(),
            };
            let same_tracked =
                |old: &Vec<Value>| (0..v.len()).all(|i| !flow.tracked[i] || v[i] == old[i]);
            open = match open {
                Some((old, start)) if same_tracked(&old) => Some((v, start)),
                Some((old, start)) => {
                    out.push((key, old, start, Some(e.seq)));
                    Some((v, e.seq))
                }
                None => Some((v, e.seq)),
            };
        }
        if let Some((v, start)) = open {
            out.push((key, v, start, None));
        }
    }
    Ok(out)
}

/// One delivered snapshot: its version and its rows (key → values).
pub type RefSnapshot = (i64, BTreeMap<i64, Vec<Value>>);

/// AUTO CDC FROM SNAPSHOT, SCD type 2 (semantics page §4): walk each key through the
/// snapshots in version order. Present with new tracked values: close the open version and
/// open one at this version; present with only untracked changes: update the open version in
/// place; absent: close the open version at this version. `snapshots` may come in any order;
/// versions must be distinct.
pub fn snapshot_scd2(flow: &RefFlow, snapshots: &[RefSnapshot]) -> Vec<RefVersion> {
    let mut ordered: Vec<&RefSnapshot> = snapshots.iter().collect();
    ordered.sort_by_key(|s| s.0);
    let keys: std::collections::BTreeSet<i64> =
        ordered.iter().flat_map(|s| s.1.keys().copied()).collect();
    let mut out = Vec::new();
    for key in keys {
        let mut open: Option<(Vec<Value>, i64)> = None;
        for (version, rows) in &ordered {
            match (rows.get(&key), open.take()) {
                (None, None) => {}
                (None, Some((v, start))) => out.push((key, v, start, Some(*version))),
                (Some(new), None) => open = Some((new.clone(), *version)),
                (Some(new), Some((old, start))) => {
                    let same = (0..new.len()).all(|i| !flow.tracked[i] || new[i] == old[i]);
                    if same {
                        open = Some((new.clone(), start));
                    } else {
                        out.push((key, old, start, Some(*version)));
                        open = Some((new.clone(), *version));
                    }
                }
            }
        }
        if let Some((v, start)) = open {
            out.push((key, v, start, None));
        }
    }
    out
}

/// AUTO CDC FROM SNAPSHOT, SCD type 1: the rows of the latest version.
pub fn snapshot_scd1(snapshots: &[RefSnapshot]) -> BTreeMap<i64, Vec<Value>> {
    snapshots
        .iter()
        .max_by_key(|s| s.0)
        .map(|s| s.1.clone())
        .unwrap_or_default()
}
