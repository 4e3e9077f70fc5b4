//! The SCD2 integrity check: at most one open version per key, no overlapping intervals,
//! start before end (for a `SNAPSHOTS` table: one row per key and version). Run on the rows
//! a flow is about to write, and by `strata validate` over a whole table.

use crate::error::{Context, EngineError, Result};
use crate::semantics::timeline::Timeline;
use crate::util::arrow;
use crate::util::arrow::Bounds;
use crate::util::arrow::Ordered;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::buffer::NullBuffer;
use deltalake::arrow::util::display::ArrayFormatter;
use deltalake::arrow::util::display::FormatOptions;
use std::cmp::Ordering;
use std::sync::Arc;

/// One broken invariant of an SCD2 table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `userId=123`
    pub key: String,
    pub problem: String,
    /// For a gap after a version or a key with no open version: where that version ends,
    /// as displayed (a delete at that sequence value explains it).
    pub ends_at: Option<String>,
}

impl Violation {
    fn new(key: String, problem: String) -> Self {
        Violation {
            key,
            problem,
            ends_at: None,
        }
    }

    /// The violation of a version that ends at `at` (see [`Violation::ends_at`]).
    fn ending_at(self, at: String) -> Self {
        Violation {
            ends_at: Some(at),
            ..self
        }
    }
}

/// A row's key as violations name it: `name=value` for each key column, `, `-separated
/// (the key columns' formatters first in `fmts`).
fn key_text(keys: &[String], fmts: &[ArrayFormatter<'_>], row: usize) -> String {
    keys.iter()
        .enumerate()
        .map(|(c, name)| format!("{name}={}", fmts[c].value(row)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The SCD2 integrity check on rows about to be written (keys in `keys`, the convention's
/// timeline columns by name): the violations, if any.
pub(crate) fn check_rows(
    rows: &RecordBatch,
    keys: &[String],
    timeline: &Timeline,
) -> Result<Vec<Violation>> {
    let column = |name: &str| {
        rows.column_by_name(name)
            .cloned()
            .ok_or_else(|| EngineError::internal(format!("rows have no column {name}")))
    };
    let mut cols = keys.iter().map(|k| column(k)).collect::<Result<Vec<_>>>()?;
    cols.push(column(&timeline.valid_from)?);
    cols.push(timeline.open_as_null(&column(&timeline.valid_to)?)?);
    let fields: Vec<deltalake::arrow::datatypes::Field> = keys
        .iter()
        .chain([&timeline.valid_from, &timeline.valid_to])
        .zip(&cols)
        .map(|(n, c)| deltalake::arrow::datatypes::Field::new(n, c.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::new(deltalake::arrow::datatypes::Schema::new(fields)),
        cols,
    )
    .context(|| "integrity check".into())?;
    check_timelines(&batch, keys, Findings::Ignored)
}

/// A `SNAPSHOTS` table: at most one row per key in each version.
pub(crate) fn check_snapshots(batch: &RecordBatch, keys: &[String]) -> Result<Vec<Violation>> {
    let n = keys.len();
    let rows = arrow::rows(&batch.columns()[..n + 1])?;
    let mut order: Vec<usize> = (0..batch.num_rows()).collect();
    order.sort_by(|&a, &b| rows.row(a).cmp(&rows.row(b)));
    let options = FormatOptions::default().with_null("NULL");
    let fmts = (0..=n)
        .map(|c| ArrayFormatter::try_new(batch.column(c).as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "validate".into())?;
    let mut out = Vec::new();
    for w in order.windows(2) {
        if rows.row(w[0]) == rows.row(w[1]) {
            out.push(Violation::new(
                key_text(keys, &fmts, w[0]),
                format!("appears twice in version {}", fmts[n].value(w[0])),
            ));
        }
    }
    Ok(out)
}

/// Whether [`check_timelines`] also reports gaps between a key's versions and keys with no
/// open version: a table may hold them (a delete closes a key's version), so only
/// `validate` looks for them, to tell them from the deletes it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Findings {
    Reported,
    Ignored,
}

/// The rows in key order, each key's versions by start: as they are when they come grouped
/// by key with each key's versions in start order (as a fold writes them), else sorted.
fn key_order(key_of: &Ordered, bounds: &Bounds, rows: u32) -> Vec<u32> {
    let grouped = {
        let runs_ordered = (1..rows)
            .all(|i| !key_of.eq(i - 1, i) || bounds.start_cmp(i - 1, i) != Ordering::Greater);
        // Each key's run must be its only one: the first rows of the runs hold distinct keys.
        let mut firsts = (0..rows).filter(|&i| i == 0 || !key_of.eq(i - 1, i));
        runs_ordered
            && match &key_of {
                Ordered::Int(v) => {
                    let mut seen = ahash::AHashSet::with_capacity(v.len() / 4);
                    firsts.all(|i| seen.insert(v[i as usize]))
                }
                Ordered::Rows(r) => {
                    let mut seen = ahash::AHashSet::with_capacity(r.num_rows() / 4);
                    firsts.all(|i| seen.insert(r.row(i as usize).data()))
                }
            }
    };
    let mut order: Vec<u32> = (0..rows).collect();
    if !grouped {
        order.sort_unstable_by(|&a, &b| {
            key_of
                .cmp(a, b)
                .then_with(|| bounds.start_cmp(a, b))
                .then(a.cmp(&b))
        });
    }
    order
}

/// The checks of [`validate`] over `keys..., __START_AT, __END_AT` rows, done here rather than
/// in SQL so that every sequence type (structs included) compares as `ORDER BY` would.
pub(crate) fn check_timelines(
    batch: &RecordBatch,
    keys: &[String],
    findings: Findings,
) -> Result<Vec<Violation>> {
    let n = keys.len();
    let (start, end) = (batch.column(n), batch.column(n + 1));
    // Integers where the types allow (8 bytes a value), else Arrow's row format.
    let key_of = Ordered::of_columns(&batch.columns()[..n], None)?;
    let bounds = Bounds::new(start, end)?;
    if findings == Findings::Ignored
        && sound_in_key_order(&key_of, &bounds, end.nulls(), batch.num_rows() as u32)
    {
        return Ok(Vec::new());
    }
    all_violations(batch, keys, findings, &key_of, &bounds)
}

/// Whether rows `0..rows` come in strictly ascending key order with each key's versions one
/// after another in start order, each ending after it starts (or open, NULL in `open_ends`)
/// and before the next begins, so only a key's last version can be open: rows in which
/// [`check_timelines`] finds nothing to report when gaps and keys without an open version
/// are not findings. One pass over the rows, as a fold writes them, without the sort and
/// the set of keys [`key_order`] needs for rows in any order; `false` decides nothing.
fn sound_in_key_order(
    key_of: &Ordered,
    bounds: &Bounds,
    open_ends: Option<&NullBuffer>,
    rows: u32,
) -> bool {
    let open = |i: u32| open_ends.is_some_and(|n| n.is_null(i as usize));
    (0..rows).all(|i| {
        let ends_after_start = open(i) || bounds.start_vs_end(i, i) == Ordering::Less;
        ends_after_start
            && (i == 0
                || match key_of.cmp(i - 1, i) {
                    Ordering::Less => true,
                    Ordering::Equal => {
                        !open(i - 1) && bounds.start_vs_end(i, i - 1) != Ordering::Less
                    }
                    Ordering::Greater => false,
                })
    })
}

/// Every violation [`check_timelines`] reports, over rows in any order.
fn all_violations(
    batch: &RecordBatch,
    keys: &[String],
    findings: Findings,
    key_of: &Ordered,
    bounds: &Bounds,
) -> Result<Vec<Violation>> {
    let n = keys.len();
    let end = batch.column(n + 1);
    let options = FormatOptions::default().with_null("NULL");
    let fmt = |c: usize| ArrayFormatter::try_new(batch.column(c).as_ref(), &options);
    let key_fmt = (0..n)
        .map(fmt)
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "validate".into())?;
    let (start_fmt, end_fmt) = (
        fmt(n).context(|| "validate".into())?,
        fmt(n + 1).context(|| "validate".into())?,
    );
    let describe = |i: u32| key_text(keys, &key_fmt, i as usize);
    let order = key_order(key_of, bounds, batch.num_rows() as u32);
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j < order.len() && key_of.eq(order[i], order[j]) {
            j += 1;
        }
        let group = &order[i..j];
        let open = group.iter().filter(|&&r| end.is_null(r as usize)).count();
        if open > 1 {
            out.push(Violation::new(
                describe(group[0]),
                format!("has {open} open versions"),
            ));
        }
        if let (Findings::Reported, 0, Some(&last)) = (findings, open, group.last()) {
            let at = end_fmt.value(last as usize).to_string();
            let problem = format!("has no open version (its last version ends at {at})");
            out.push(Violation::new(describe(last), problem).ending_at(at));
        }
        for (pos, &r) in group.iter().enumerate() {
            let open = end.is_null(r as usize);
            let (starts, ends) = (start_fmt.value(r as usize), end_fmt.value(r as usize));
            if !open && bounds.start_vs_end(r, r) != Ordering::Less {
                let problem = format!(
                    "version starting at {starts} does not end after it starts (ends at {ends})"
                );
                out.push(Violation::new(describe(r), problem));
            }
            let Some(&next) = group.get(pos + 1) else {
                continue;
            };
            let next_starts = start_fmt.value(next as usize);
            if open || bounds.start_vs_end(next, r) == Ordering::Less {
                let problem = format!(
                    "version starting at {starts} overlaps the next one, starting at {next_starts}"
                );
                out.push(Violation::new(describe(r), problem));
            } else if findings == Findings::Reported
                && bounds.start_vs_end(next, r) == Ordering::Greater
            {
                let at = ends.to_string();
                let problem = format!(
                    "gap: the version starting at {starts} ends at {at}, \
                     the next starts at {next_starts}"
                );
                out.push(Violation::new(describe(r), problem).ending_at(at));
            }
        }
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};

    /// The check run before a flow commits finds two open versions and an overlap.
    #[test]
    fn check_rows_finds_broken_timelines() {
        let timeline = Timeline::from_properties(&std::collections::HashMap::new()).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new(&timeline.valid_from, DataType::Int64, true),
            Field::new(&timeline.valid_to, DataType::Int64, true),
        ]));
        let batch = |ids: Vec<i64>, starts: Vec<i64>, ends: Vec<Option<i64>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(starts)),
                    Arc::new(Int64Array::from(ends)),
                ],
            )
            .unwrap()
        };
        let keys = vec!["id".to_string()];
        let good = batch(vec![1, 1, 2], vec![1, 5, 1], vec![Some(5), None, None]);
        assert!(check_rows(&good, &keys, &timeline).unwrap().is_empty());
        let two_open = batch(vec![1, 1], vec![1, 5], vec![None, None]);
        let v = check_rows(&two_open, &keys, &timeline).unwrap();
        assert!(
            v.iter().any(|v| v.problem == "has 2 open versions"),
            "{v:?}"
        );
        let overlap = batch(vec![1, 1], vec![1, 5], vec![Some(7), None]);
        let v = check_rows(&overlap, &keys, &timeline).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].problem.contains("overlaps the next one"), "{v:?}");
        // Rows not grouped by key (as files return them) are sorted before the check: the
        // same overlap with key 2 between, and the later version first.
        let scattered = batch(vec![1, 2, 1], vec![5, 1, 1], vec![None, None, Some(7)]);
        let v = check_rows(&scattered, &keys, &timeline).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].problem.contains("overlaps the next one"), "{v:?}");
        let scattered_good = batch(vec![1, 2, 1], vec![5, 1, 1], vec![None, None, Some(5)]);
        assert!(check_rows(&scattered_good, &keys, &timeline)
            .unwrap()
            .is_empty());
        // Gaps and keys with no open version are findings of validate only.
        let gapped = batch(vec![1, 1, 2], vec![1, 7, 1], vec![Some(5), None, Some(3)]);
        assert!(check_rows(&gapped, &keys, &timeline).unwrap().is_empty());
        let v = check_timelines(&gapped, &keys, Findings::Reported).unwrap();
        let found: Vec<(&str, Option<&str>)> = v
            .iter()
            .map(|v| (v.key.as_str(), v.ends_at.as_deref()))
            .collect();
        assert_eq!(
            found,
            vec![("id=1", Some("5")), ("id=2", Some("3"))],
            "{v:?}"
        );
        assert!(v[0].problem.starts_with("gap: "), "{v:?}");
        assert!(v[1].problem.starts_with("has no open version"), "{v:?}");
    }

    /// The one-pass check of rows in key order agrees with the full check: on small random
    /// timelines (sorted by key and start or shuffled, integer keys and bounds or text keys
    /// in Arrow's row format), it passes only rows in which the full check finds nothing,
    /// and it passes every sound timeline laid out as a fold writes it.
    #[test]
    fn the_one_pass_check_passes_only_what_the_full_check_passes() {
        use deltalake::arrow::array::{ArrayRef, StringArray};
        let mut x: u64 = 11;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let keys = vec!["id".to_string()];
        let (mut passed, mut sound_seen) = (0, 0);
        for round in 0..4000 {
            let n = 1 + next(7) as usize;
            // Each key's versions: random starts and ends, or a sound chain (each ends where
            // the next starts, the last one open).
            let mut rows: Vec<(i64, i64, Option<i64>)> = Vec::new();
            let sound = round % 2 == 0;
            let mut key = 0i64;
            while rows.len() < n {
                key += 1 + next(2) as i64;
                let versions = 1 + next(3) as usize;
                let mut at = next(3) as i64;
                for v in 0..versions {
                    if sound {
                        let end = (v + 1 < versions).then(|| at + 1 + next(3) as i64);
                        rows.push((key, at, end));
                        at = end.unwrap_or(at);
                    } else {
                        let end = (next(4) != 0).then(|| next(6) as i64);
                        rows.push((key, next(6) as i64, end));
                    }
                }
            }
            if round % 3 == 2 {
                let (last, pick) = (rows.len() - 1, next(rows.len() as u64) as usize);
                rows.swap(pick, last);
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let key_columns: [ArrayRef; 2] = [
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|k| format!("k{k:03}")),
                )),
            ];
            for key_column in key_columns {
                let schema = Arc::new(Schema::new(vec![
                    Field::new("id", key_column.data_type().clone(), true),
                    Field::new("s", DataType::Int64, true),
                    Field::new("e", DataType::Int64, true),
                ]));
                let batch = RecordBatch::try_new(
                    schema,
                    vec![
                        key_column,
                        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                        Arc::new(Int64Array::from(
                            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                        )),
                    ],
                )
                .unwrap();
                let key_of = Ordered::of_columns(&batch.columns()[..1], None).unwrap();
                let bounds = Bounds::new(batch.column(1), batch.column(2)).unwrap();
                let one_pass = sound_in_key_order(
                    &key_of,
                    &bounds,
                    batch.column(2).nulls(),
                    batch.num_rows() as u32,
                );
                let full =
                    all_violations(&batch, &keys, Findings::Ignored, &key_of, &bounds).unwrap();
                if one_pass {
                    assert!(full.is_empty(), "{rows:?}: {full:?}");
                    passed += 1;
                }
                if sound && round % 3 != 2 {
                    assert!(one_pass, "{rows:?}");
                    sound_seen += 1;
                }
                assert_eq!(
                    check_timelines(&batch, &keys, Findings::Ignored).unwrap(),
                    full
                );
            }
        }
        assert!(
            passed > sound_seen && sound_seen > 1000,
            "{passed} {sound_seen}"
        );
    }
}
