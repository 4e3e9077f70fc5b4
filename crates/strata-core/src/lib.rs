//! # strata-core: the semantics of AUTO CDC, with no I/O
//!
//! This crate answers one question: *given every change event ever applied to one key, what
//! does the target hold for that key?* It is the fold of `docs/semantics.md`, section 1,
//! written once and used by the engine on Arrow data and by the tests on plain values.
//!
//! ```text
//!  events of one key ──order_events──▶ sorted, ties settled (R5) ──fold_scd1──▶ Option<values>
//!   (any arrival order)                                          └─fold_scd2──▶ Vec<Version>
//! ```
//!
//! The fold is generic over an [`EventModel`]: the model says how to compare sequence values,
//! how to compare and fill values, and what kind an event is. Events themselves are opaque
//! handles (`Copy`), so the engine can fold row indices into Arrow arrays without copying
//! values, while [`reference`] folds plain Rust values.
//!
//! Truncates (R3) are not per key. In SCD type 1, [`truncate_watermark`] finds the newest one
//! and [`drop_truncated`] discards every event at or below it before a key is folded. In SCD
//! type 2 a truncate is a delete of every key at its sequence: the engine adds the truncates
//! to each key's events, and [`fold_scd2`] closes the open version at each of them.
//!
//! [`reference`] is the deliberately boring model the property tests compare everything with.

pub mod reference;

use std::cmp::Ordering;

/// What an event does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    Upsert,
    Delete,
    Truncate,
}

impl EventKind {
    /// The code stored in strata's event store.
    pub fn code(self) -> i8 {
        match self {
            EventKind::Upsert => 0,
            EventKind::Delete => 1,
            EventKind::Truncate => 2,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            0 => Some(EventKind::Upsert),
            1 => Some(EventKind::Delete),
            2 => Some(EventKind::Truncate),
            _ => None,
        }
    }
}

/// How the fold sees events and their values.
///
/// `Event` is a cheap handle (a row index, a reference); `Values` is what a version holds
/// (a row index, or a mix of row indices per column once `IGNORE NULL UPDATES` has filled
/// NULLs from an older version).
pub trait EventModel {
    type Event: Copy;
    type Values: Clone;

    fn kind(&self, e: Self::Event) -> EventKind;
    /// Orders two events of one key by their sequence value.
    fn seq_cmp(&self, a: Self::Event, b: Self::Event) -> Ordering;
    /// The output values an upsert carries.
    fn values(&self, e: Self::Event) -> Self::Values;
    /// `fill(new, old)` of the semantics: under `IGNORE NULL UPDATES`, every NULL of `new`
    /// takes `old`'s value. Only called when the flow ignores null updates.
    fn fill(&self, new: Self::Values, old: &Self::Values) -> Self::Values;
    /// True when the tracked columns (`TRACK HISTORY ON`, default all) are equal.
    fn tracked_eq(&self, a: &Self::Values, b: &Self::Values) -> bool;
    /// True when two events at the same key and sequence are the same event delivered twice
    /// (kind and every value equal).
    fn identical(&self, a: Self::Event, b: Self::Event) -> bool;
}

/// The fold's options that do not live in the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FoldOptions {
    pub ignore_null_updates: bool,
}

/// Two different upserts at one key and one sequence value (R5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConflictingTie<E> {
    pub first: E,
    pub second: E,
}

/// Sorts one key's events by sequence and settles ties (R5): byte-identical duplicates
/// collapse into one event, a delete beats an upsert, two different upserts are an error.
/// A truncate among them (SCD type 2, where it deletes every key) counts as a delete.
pub fn order_events<M: EventModel>(
    model: &M,
    events: &mut Vec<M::Event>,
) -> Result<(), ConflictingTie<M::Event>> {
    // Stable, so that among identical duplicates the first delivered is the one kept.
    events.sort_by(|a, b| model.seq_cmp(*a, *b));
    if events
        .windows(2)
        .all(|w| model.seq_cmp(w[0], w[1]) == Ordering::Less)
    {
        return Ok(()); // no ties: nothing to settle
    }
    let mut settled: Vec<M::Event> = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        let mut j = i + 1;
        while j < events.len() && model.seq_cmp(events[i], events[j]) == Ordering::Equal {
            j += 1;
        }
        let tied = &events[i..j];
        // Decided on the whole group, so that the outcome does not depend on arrival order.
        let ends =
            |e: &&M::Event| matches!(model.kind(**e), EventKind::Delete | EventKind::Truncate);
        if let Some(&delete) = tied.iter().find(ends) {
            settled.push(delete);
        } else {
            let first = tied[0];
            if let Some(&other) = tied[1..].iter().find(|e| !model.identical(first, **e)) {
                return Err(ConflictingTie {
                    first,
                    second: other,
                });
            }
            settled.push(first);
        }
        i = j;
    }
    *events = settled;
    Ok(())
}

/// The newest truncate among `events`, if any (R3).
pub fn truncate_watermark<M: EventModel>(
    model: &M,
    events: impl IntoIterator<Item = M::Event>,
) -> Option<M::Event> {
    events
        .into_iter()
        .filter(|e| model.kind(*e) == EventKind::Truncate)
        .max_by(|a, b| model.seq_cmp(*a, *b))
}

/// Drops every event at or below the truncate `watermark` (R3).
pub fn drop_truncated<M: EventModel>(
    model: &M,
    events: &mut Vec<M::Event>,
    watermark: Option<M::Event>,
) {
    if let Some(t) = watermark {
        events.retain(|e| model.seq_cmp(*e, t) == Ordering::Greater);
    }
}

/// SCD type 1: the state after folding one key's ordered events, `None` if the key is
/// deleted or never upserted.
pub fn fold_scd1<M: EventModel>(
    model: &M,
    events: &[M::Event],
    options: FoldOptions,
) -> Option<M::Values> {
    let mut state: Option<M::Values> = None;
    for &e in events {
        match model.kind(e) {
            EventKind::Delete => state = None,
            EventKind::Upsert => {
                let new = model.values(e);
                state = Some(match (&state, options.ignore_null_updates) {
                    (Some(old), true) => model.fill(new, old),
                    _ => new,
                });
            }
            EventKind::Truncate => {}
        }
    }
    state
}

/// One SCD type 2 version: valid for `start <= s < end`, current when `end` is `None`.
/// `start` and `end` are the events whose sequence values bound the interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version<E, V> {
    pub values: V,
    pub start: E,
    pub end: Option<E>,
}

/// SCD type 2: the versions of one key after folding its ordered events.
///
/// An upsert whose tracked values equal the open version's updates it in place (untracked
/// columns take the newest values, the start stays); any other upsert closes the open
/// version at its sequence and opens a new one; a delete, or a truncate (a delete of every
/// key), closes the open version.
pub fn fold_scd2<M: EventModel>(
    model: &M,
    events: &[M::Event],
    options: FoldOptions,
) -> Vec<Version<M::Event, M::Values>> {
    let mut out = Vec::new();
    let mut open: Option<(M::Values, M::Event)> = None;
    for &e in events {
        match model.kind(e) {
            EventKind::Delete | EventKind::Truncate => {
                if let Some((values, start)) = open.take() {
                    out.push(Version {
                        values,
                        start,
                        end: Some(e),
                    });
                }
            }
            EventKind::Upsert => {
                let new = model.values(e);
                open = Some(match open.take() {
                    None => (new, e),
                    Some((old, start)) => {
                        let v = if options.ignore_null_updates {
                            model.fill(new, &old)
                        } else {
                            new
                        };
                        if model.tracked_eq(&v, &old) {
                            (v, start)
                        } else {
                            out.push(Version {
                                values: old,
                                start,
                                end: Some(e),
                            });
                            (v, e)
                        }
                    }
                });
            }
        }
    }
    if let Some((values, start)) = open {
        out.push(Version {
            values,
            start,
            end: None,
        });
    }
    out
}
