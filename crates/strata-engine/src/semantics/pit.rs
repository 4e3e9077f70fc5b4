//! Point-in-time tables as pure functions: which as-of values a refresh computes again
//! ([`plan_refresh`]) and the SQL that computes them ([`pit_sql`]). `ops/pit.rs` does the
//! reading and writing.

use crate::util::sql::quote_ident;
use deltalake::datafusion::scalar::ScalarValue;
use std::cmp::Ordering;

/// The as-of column of every point-in-time table.
pub(crate) const AS_OF_COL: &str = "as_of";

/// Since where the historised tables changed, as far as a refresh must care.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Changed {
    /// Nothing changed.
    Nothing,
    /// History changed from this value on: every as-of value at or after it may differ.
    From(ScalarValue),
    /// Anything may have changed (an unreadable feed, a bound of another type).
    Everything,
}

impl Changed {
    /// Both changes together: the earlier bound.
    pub(crate) fn and(self, other: Changed) -> Changed {
        match (self, other) {
            (Changed::Everything, _) | (_, Changed::Everything) => Changed::Everything,
            (Changed::Nothing, c) | (c, Changed::Nothing) => c,
            (Changed::From(a), Changed::From(b)) => Changed::From(if b < a { b } else { a }),
        }
    }

    /// Whether the rows of as-of value `v` may differ now.
    fn affects(&self, v: &ScalarValue) -> bool {
        match self {
            Changed::Nothing => false,
            Changed::Everything => true,
            Changed::From(b) => v.partial_cmp(b) != Some(Ordering::Less),
        }
    }
}

/// What a refresh does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RefreshPlan {
    /// As-of values to compute: new in the spine, or affected by changed history.
    pub(crate) compute: Vec<ScalarValue>,
    /// Of those, how many the table already holds (computed again).
    pub(crate) recomputed: usize,
    /// As-of values the table holds that left the spine.
    pub(crate) removed: Vec<ScalarValue>,
}

/// The refresh of a table holding `existing` as-of values whose spine is now `wanted`,
/// after `changed`.
pub(crate) fn plan_refresh(
    wanted: &[ScalarValue],
    existing: &[ScalarValue],
    changed: &Changed,
) -> RefreshPlan {
    let compute: Vec<ScalarValue> = wanted
        .iter()
        .filter(|v| !existing.contains(v) || changed.affects(v))
        .cloned()
        .collect();
    RefreshPlan {
        recomputed: compute.iter().filter(|v| existing.contains(v)).count(),
        removed: existing
            .iter()
            .filter(|v| !wanted.contains(v))
            .cloned()
            .collect(),
        compute,
    }
}

/// One historised table a point-in-time table reads.
#[derive(Debug, Clone)]
pub(crate) struct PitSource {
    /// How the table is addressed in the session (`"schema"."name"`).
    pub(crate) reference: String,
    /// Its timeline's start and end columns.
    pub(crate) valid_from: String,
    pub(crate) valid_to: String,
    /// A `SNAPSHOTS` table: one version per delivered snapshot, start = end.
    pub(crate) snapshots: bool,
    /// The column the PIT table records: the surrogate key, else the start.
    pub(crate) column: String,
    /// Its column in the PIT table (`<table>_sk` or `<table>_start`).
    pub(crate) out_name: String,
}

/// Table properties of a point-in-time table, written when it is created: its keys and the
/// historised tables it reads (`schema.name`, comma-separated), so that `validate` can
/// compute its rows again.
pub(crate) const KEYS_PROPERTY: &str = "strata.pit.keys";
pub(crate) const SOURCES_PROPERTY: &str = "strata.pit.sources";

/// How a PIT table reads historised table `name` (addressed as `reference` in a session),
/// whose timeline is `timeline`: by its surrogate key if it has one, else by its start.
pub(crate) fn pit_source(
    reference: String,
    name: &str,
    timeline: &crate::semantics::timeline::Timeline,
    snapshots: bool,
) -> PitSource {
    let (column, suffix) = match &timeline.surrogate_key {
        Some(sk) => (sk.clone(), "sk"),
        None => (timeline.valid_from.clone(), "start"),
    };
    PitSource {
        reference,
        valid_from: timeline.valid_from.clone(),
        valid_to: timeline.valid_to.clone(),
        snapshots,
        column,
        out_name: format!("{name}_{suffix}"),
    }
}

/// How [`pit_sql`] finds the rows of a source that is not a `SNAPSHOTS` table (a range
/// source, whose versions hold from their start until their end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ranges {
    /// By a range join of the spine with the source: every version compared with every
    /// as-of value. `validate` recomputes a table this way, independently of a refresh.
    Joined,
    /// Already expanded (each version over the as-of values it [`covered`]) into table
    /// [`expanded_table`]`(i)` of columns (as_of, keys..., c): the work is the output.
    Expanded,
}

/// The table holding source `i`'s expanded rows under [`Ranges::Expanded`].
pub(crate) fn expanded_table(i: usize) -> String {
    format!("__strata_pit_s{i}")
}

/// The positions in `spine` (ascending, distinct) of the as-of values a version valid from
/// `start` until `end` (`None`: still open) covers, `start <= as_of < end`.
pub(crate) fn covered<T: Ord>(spine: &[T], start: &T, end: Option<&T>) -> std::ops::Range<usize> {
    let lo = spine.partition_point(|v| v < start);
    let hi = end.map_or(spine.len(), |e| spine.partition_point(|v| v < e));
    lo..hi.max(lo)
}

/// The query computing the PIT rows of the as-of values in table `__strata_spine` (one
/// column, `as_of`): per source, each key's version valid at each as-of value (for a
/// `SNAPSHOTS` table, the latest snapshot at or before it; a range source's rows as `ranges`
/// says); with several sources, their rows full-outer-joined on (as_of, keys).
pub(crate) fn pit_sql(keys: &[String], sources: &[PitSource], ranges: Ranges) -> String {
    let keys_of = |alias: &str| {
        keys.iter()
            .map(|k| format!("{alias}.{}", quote_ident(k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ctes: Vec<String> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (src, from, to, col) = (
                &s.reference,
                quote_ident(&s.valid_from),
                quote_ident(&s.valid_to),
                quote_ident(&s.column),
            );
            let body = if s.snapshots {
                format!(
                    "SELECT v.{AS_OF_COL}, {}, t.{col} AS c FROM \
                       (SELECT sp.{AS_OF_COL}, max(d.st) AS st FROM __strata_spine sp \
                        JOIN (SELECT DISTINCT {from} AS st FROM {src}) d ON d.st <= sp.{AS_OF_COL} \
                        GROUP BY sp.{AS_OF_COL}) v \
                     JOIN {src} t ON t.{from} = v.st",
                    keys_of("t")
                )
            } else if ranges == Ranges::Expanded {
                format!("SELECT * FROM {}", expanded_table(i))
            } else {
                format!(
                    "SELECT sp.{AS_OF_COL}, {}, t.{col} AS c FROM __strata_spine sp JOIN {src} t \
                     ON t.{from} <= sp.{AS_OF_COL} AND (t.{to} IS NULL OR sp.{AS_OF_COL} < t.{to})",
                    keys_of("t")
                )
            };
            format!("s{i} AS ({body})")
        })
        .collect();
    // One source: its rows are the answer. More: full outer joins on (as_of, keys), the
    // as-of value and keys taken from whichever side has them.
    let coalesced = |col: &str, upto: usize| match upto {
        0 => format!("s0.{col}"),
        _ => format!(
            "coalesce({})",
            (0..=upto)
                .map(|i| format!("s{i}.{col}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let last = sources.len().saturating_sub(1);
    let mut select = format!("SELECT {} AS {AS_OF_COL}", coalesced(AS_OF_COL, last));
    for k in keys {
        let q = quote_ident(k);
        select.push_str(&format!(", {} AS {q}", coalesced(&q, last)));
    }
    for (i, s) in sources.iter().enumerate() {
        select.push_str(&format!(", s{i}.c AS {}", quote_ident(&s.out_name)));
    }
    let mut from = "s0".to_string();
    for i in 1..sources.len() {
        let on = std::iter::once(format!(
            "s{i}.{AS_OF_COL} = {}",
            coalesced(AS_OF_COL, i - 1)
        ))
        .chain(keys.iter().map(|k| {
            let q = quote_ident(k);
            format!("s{i}.{q} = {}", coalesced(&q, i - 1))
        }))
        .collect::<Vec<_>>()
        .join(" AND ");
        from.push_str(&format!(" FULL OUTER JOIN s{i} ON {on}"));
    }
    format!("WITH {} {select} FROM {from}", ctes.join(", "))
}

/// A PIT row as `validate` reports it: its as-of value and keys (`as_of=3, id=1`) and the
/// versions it points at (`customers_start=1, plans_start=2`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PitRow {
    pub(crate) key: String,
    pub(crate) points_at: String,
}

/// The violations of a PIT table whose rows, computed again from its sources, differ:
/// `unexpected` rows are in the table but not in the recomputation, `missing` the other way
/// round, `duplicated` (as-of value and keys, count) appear more than once.
pub(crate) fn pit_violations(
    unexpected: &[PitRow],
    missing: &[PitRow],
    duplicated: &[(String, i64)],
) -> Vec<crate::semantics::integrity::Violation> {
    use crate::semantics::integrity::Violation;
    let mut out: Vec<Violation> = Vec::new();
    for u in unexpected {
        let problem = match missing.iter().find(|m| m.key == u.key) {
            Some(m) => format!(
                "points at {}, but the versions valid at its as-of value are {}",
                u.points_at, m.points_at
            ),
            None => format!(
                "points at {}, but no version of its key is valid at its as-of value",
                u.points_at
            ),
        };
        out.push(Violation {
            key: u.key.clone(),
            problem,
            ends_at: None,
        });
    }
    for m in missing
        .iter()
        .filter(|m| !unexpected.iter().any(|u| u.key == m.key))
    {
        out.push(Violation {
            key: m.key.clone(),
            problem: format!(
                "has no row, but {} are valid at its as-of value",
                m.points_at
            ),
            ends_at: None,
        });
    }
    for (key, n) in duplicated {
        out.push(Violation {
            key: key.clone(),
            problem: format!("{n} rows for one as-of value and key"),
            ends_at: None,
        });
    }
    out.sort_by(|a, b| (&a.key, &a.problem).cmp(&(&b.key, &b.problem)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pit_violations_pair_a_wrong_row_with_the_right_versions() {
        let row = |k: &str, p: &str| PitRow {
            key: k.into(),
            points_at: p.into(),
        };
        let v = pit_violations(
            &[
                row("as_of=3, id=1", "c_start=5"),
                row("as_of=9, id=4", "c_start=1"),
            ],
            &[
                row("as_of=3, id=1", "c_start=1"),
                row("as_of=4, id=2", "c_start=3"),
            ],
            &[("as_of=5, id=1".into(), 2)],
        );
        let text: Vec<String> = v
            .iter()
            .map(|v| format!("{}: {}", v.key, v.problem))
            .collect();
        assert_eq!(
            text,
            vec![
                "as_of=3, id=1: points at c_start=5, but the versions valid at its as-of value are c_start=1",
                "as_of=4, id=2: has no row, but c_start=3 are valid at its as-of value",
                "as_of=5, id=1: 2 rows for one as-of value and key",
                "as_of=9, id=4: points at c_start=1, but no version of its key is valid at its as-of value",
            ]
        );
    }

    fn days(v: &[i32]) -> Vec<ScalarValue> {
        v.iter().map(|d| ScalarValue::Date32(Some(*d))).collect()
    }

    /// New spine values are computed; existing ones only from the changed bound on; values
    /// that left the spine are removed.
    #[test]
    fn a_refresh_computes_new_and_affected_values_and_removes_the_rest() {
        let existing = days(&[1, 2, 3, 4]);
        let wanted = days(&[2, 3, 4, 5]);
        let none = plan_refresh(&wanted, &existing, &Changed::Nothing);
        assert_eq!(none.compute, days(&[5]));
        assert_eq!((none.recomputed, none.removed), (0, days(&[1])));
        let from3 = plan_refresh(
            &wanted,
            &existing,
            &Changed::From(ScalarValue::Date32(Some(3))),
        );
        assert_eq!(from3.compute, days(&[3, 4, 5]));
        assert_eq!(from3.recomputed, 2);
        let all = plan_refresh(&wanted, &existing, &Changed::Everything);
        assert_eq!(all.compute, wanted);
        assert_eq!(all.recomputed, 3);
    }

    /// Two changes together reach back to the earlier one; anything and everything wins.
    #[test]
    fn changes_combine_to_the_earlier_bound() {
        let at = |d| Changed::From(ScalarValue::Date32(Some(d)));
        assert_eq!(at(5).and(at(3)), at(3));
        assert_eq!(Changed::Nothing.and(at(4)), at(4));
        assert_eq!(at(4).and(Changed::Everything), Changed::Everything);
        assert_eq!(Changed::Nothing.and(Changed::Nothing), Changed::Nothing);
    }

    /// Table `default.name` with Databricks' timeline columns, recorded by its start.
    fn source(name: &str, snapshots: bool) -> PitSource {
        PitSource {
            reference: format!("\"default\".\"{name}\""),
            valid_from: "__START_AT".into(),
            valid_to: "__END_AT".into(),
            snapshots,
            column: "__START_AT".into(),
            out_name: format!("{name}_start"),
        }
    }

    /// One source reads its rows directly; two are joined on the as-of value and the keys,
    /// each taken from whichever side has them.
    #[test]
    fn the_sql_joins_sources_on_as_of_and_keys() {
        let keys = vec!["id".to_string()];
        let one = pit_sql(&keys, &[source("a", false)], Ranges::Joined);
        assert!(
            one.contains(
                "SELECT s0.as_of AS as_of, s0.\"id\" AS \"id\", s0.c AS \"a_start\" FROM s0"
            ),
            "{one}"
        );
        assert!(
            one.contains("t.\"__END_AT\" IS NULL OR sp.as_of < t.\"__END_AT\""),
            "{one}"
        );
        let two = pit_sql(
            &keys,
            &[source("a", false), source("b", true)],
            Ranges::Joined,
        );
        assert!(
            two.contains("FULL OUTER JOIN s1 ON s1.as_of = s0.as_of AND s1.\"id\" = s0.\"id\""),
            "{two}"
        );
        assert!(
            two.contains("coalesce(s0.as_of, s1.as_of) AS as_of"),
            "{two}"
        );
        assert!(
            two.contains("max(d.st) AS st"),
            "snapshots take the latest one: {two}"
        );
    }

    /// Expanded sources are read from their tables; snapshot sources still join.
    #[test]
    fn expanded_sources_are_read_from_their_tables() {
        let keys = vec!["id".to_string()];
        let sql = pit_sql(
            &keys,
            &[source("a", false), source("b", true)],
            Ranges::Expanded,
        );
        assert!(
            sql.contains("s0 AS (SELECT * FROM __strata_pit_s0)"),
            "{sql}"
        );
        assert!(!sql.contains("__END_AT"), "no range join left: {sql}");
        assert!(sql.contains("max(d.st) AS st"), "{sql}");
    }

    /// A version covers the as-of values from its start (included) to its end (excluded),
    /// all of them from its start on while it is open, none if it ends where it starts.
    #[test]
    fn a_version_covers_the_as_of_values_from_its_start_to_its_end() {
        let spine = [10, 20, 30, 40];
        assert_eq!(covered(&spine, &20, Some(&40)), 1..3);
        assert_eq!(covered(&spine, &15, Some(&31)), 1..3);
        assert_eq!(covered(&spine, &15, None), 1..4);
        assert_eq!(covered(&spine, &5, Some(&10)), 0..0);
        assert_eq!(covered(&spine, &41, None), 4..4);
        assert_eq!(covered(&spine, &20, Some(&20)), 1..1);
        assert_eq!(
            covered(&spine, &30, Some(&20)),
            2..2,
            "an end before the start"
        );
        assert_eq!(covered::<i32>(&[], &1, None), 0..0);
    }
}
