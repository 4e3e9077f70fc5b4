//! The rows the touched keys had before a run against the rows they have after it: which
//! keys changed, and the change counts of the run's report.

use crate::error::{EngineError, Result};
use crate::semantics::flow::FlowSetup;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;

/// Compares the rows the touched keys have before the run (`old`) with the rows they have
/// after it (`new`), both in the target layout: which keys changed, as row indices, and how
/// many rows and versions changed. One row-format conversion of each side serves both.
pub(crate) fn compare(
    setup: &FlowSetup,
    old: &RecordBatch,
    new: &RecordBatch,
) -> Result<ChangeSet> {
    let lanes = match old.num_rows() + new.num_rows() {
        n if n >= PARALLEL_COMPARE_ROWS => crate::util::threads::parallelism(),
        _ => 1,
    };
    compare_in_lanes(setup, old, new, lanes)
}

/// [`compare`], the keys compared in `lanes` lanes side by side.
pub(crate) fn compare_in_lanes(
    setup: &FlowSetup,
    old: &RecordBatch,
    new: &RecordBatch,
    lanes: usize,
) -> Result<ChangeSet> {
    // Each side's keys and whole rows in the row format, the two sides side by side.
    use deltalake::arrow::row::Rows;
    let convert = |b: &RecordBatch| -> Result<(Rows, Rows)> {
        Ok((setup.key_rows(b)?, arrow::rows(b.columns())?))
    };
    let (old_side, new_side) = std::thread::scope(|scope| {
        let old_side = scope.spawn(|| convert(old));
        let new_side = convert(new);
        (old_side.join(), new_side)
    });
    let old_side = old_side.map_err(|_| EngineError::internal("a row-format thread panicked"))?;
    let ((old_keys, old_rows), (new_keys, new_rows)) = (old_side?, new_side?);
    // SCD type 2 and snapshots: versions are told apart by their start, open ones by a NULL
    // end (whatever the open-end marker).
    let timeline = match setup.flow.stored_as.has_timeline() {
        false => None,
        true => {
            let schema = &setup.target_schema;
            let index = |name: &str| {
                schema
                    .index_of(name)
                    .map_err(|_| EngineError::internal(format!("target has no column {name}")))
            };
            let (s, e) = (
                index(&setup.timeline.valid_from)?,
                index(&setup.timeline.valid_to)?,
            );
            Some((
                arrow::rows(&[old.column(s).clone()])?,
                arrow::rows(&[new.column(s).clone()])?,
                setup.timeline.open_as_null(old.column(e))?,
                setup.timeline.open_as_null(new.column(e))?,
            ))
        }
    };
    // Each key's rows on both sides. Sized for the keys, not the rows (a key has several
    // versions): fresh memory is dear.
    let mut by_key: ahash::AHashMap<&[u8], (Vec<u32>, Vec<u32>)> = ahash::AHashMap::new();
    for i in 0..old.num_rows() {
        by_key
            .entry(old_keys.row(i).data())
            .or_default()
            .0
            .push(i as u32);
    }
    for i in 0..new.num_rows() {
        by_key
            .entry(new_keys.row(i).data())
            .or_default()
            .1
            .push(i as u32);
    }
    // The keys' comparisons, side by side in lanes of keys.
    let groups: Vec<(Vec<u32>, Vec<u32>)> = by_key.into_values().collect();
    let sides = Sides {
        old_rows: &old_rows,
        new_rows: &new_rows,
        timeline: timeline.as_ref(),
    };
    let chunk = groups.len().div_ceil(lanes).max(1);
    let parts =
        crate::util::threads::on_threads(groups.chunks(chunk).collect(), "comparing", |keys| {
            sides.compare_keys(keys)
        })?;
    let mut out = ChangeSet::default();
    for part in parts {
        out.absorb(part);
    }
    out.delete_rows.sort_unstable();
    out.insert_rows.sort_unstable();
    out.old_rows.sort_unstable();
    out.feed_deleted.sort_unstable();
    out.feed_inserted.sort_unstable();
    out.rows_deleted = out.old_rows.len();
    Ok(out)
}

/// Rows on both sides at and above which [`compare`] compares the keys on every core.
const PARALLEL_COMPARE_ROWS: usize = 50_000;

/// The two sides of a comparison in the row format: whole rows, and for a target with a
/// timeline each side's starts and open ends (NULL where open).
struct Sides<'a> {
    old_rows: &'a deltalake::arrow::row::Rows,
    new_rows: &'a deltalake::arrow::row::Rows,
    timeline: Option<&'a Timeline>,
}

/// Each side's starts in the row format and ends (NULL where open), old side first.
type Timeline = (
    deltalake::arrow::row::Rows,
    deltalake::arrow::row::Rows,
    deltalake::arrow::array::ArrayRef,
    deltalake::arrow::array::ArrayRef,
);

impl Sides<'_> {
    /// The changes of `keys` (each key's old and new row numbers): which keys changed,
    /// their rows, and the counts, row numbers in no particular order.
    fn compare_keys(&self, keys: &[(Vec<u32>, Vec<u32>)]) -> ChangeSet {
        let (old_rows, new_rows) = (self.old_rows, self.new_rows);
        let mut out = ChangeSet::default();
        let report = &mut out.counts;
        // Each key's whole rows on each side, sorted, with their row numbers.
        let (mut od, mut nd): (Vec<Numbered>, Vec<Numbered>) = (Vec::new(), Vec::new());
        for (o, n) in keys {
            od.clear();
            od.extend(o.iter().map(|&i| (old_rows.row(i as usize).data(), i)));
            od.sort_unstable();
            nd.clear();
            nd.extend(n.iter().map(|&i| (new_rows.row(i as usize).data(), i)));
            nd.sort_unstable();
            let (gone, came) = row_difference(&od, &nd);
            if !gone.is_empty() || !came.is_empty() {
                out.keys += 1;
                out.delete_rows.extend(o.first());
                out.insert_rows.extend_from_slice(n);
                out.old_rows.extend_from_slice(o);
                report.rows_written += came.len();
                out.feed_deleted.extend(gone);
                out.feed_inserted.extend(came);
            }
            match self.timeline {
                Some((old_start, new_start, old_end, new_end)) => {
                    let (os, ns) = (
                        |i: u32| old_start.row(i as usize).data(),
                        |i: u32| new_start.row(i as usize).data(),
                    );
                    report.versions_opened += n
                        .iter()
                        .filter(|&&j| !o.iter().any(|&i| os(i) == ns(j)))
                        .count();
                    report.versions_closed += o
                        .iter()
                        .filter(|&&i| {
                            old_end.is_null(i as usize)
                                && n.iter()
                                    .any(|&j| new_end.is_valid(j as usize) && ns(j) == os(i))
                        })
                        .count();
                }
                None => {
                    let before = o.last().map(|&i| old_rows.row(i as usize).data());
                    report.keys_upserted += n
                        .iter()
                        .filter(|&&j| before != Some(new_rows.row(j as usize).data()))
                        .count();
                    report.keys_deleted += usize::from(!o.is_empty() && n.is_empty());
                }
            }
        }
        out
    }
}

/// A row in the row format, with its row number.
type Numbered<'a> = (&'a [u8], u32);

/// The row numbers of the rows only `old` holds and of those only `new` holds (both sorted
/// by row, a row held twice on one side and once on the other counting once).
fn row_difference(old: &[Numbered], new: &[Numbered]) -> (Vec<u32>, Vec<u32>) {
    let (mut gone, mut came) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        match old[i].0.cmp(new[j].0) {
            std::cmp::Ordering::Equal => (i, j) = (i + 1, j + 1),
            std::cmp::Ordering::Less => {
                gone.push(old[i].1);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                came.push(new[j].1);
                j += 1;
            }
        }
    }
    gone.extend(old[i..].iter().map(|r| r.1));
    came.extend(new[j..].iter().map(|r| r.1));
    (gone, came)
}

/// The change counts for a target that had no rows before the run: every one of its `rows`
/// new rows is new.
pub(crate) fn count_first_rows(setup: &FlowSetup, rows: usize) -> Counts {
    let timeline = setup.flow.stored_as.has_timeline();
    Counts {
        rows_written: rows,
        versions_opened: if timeline { rows } else { 0 },
        keys_upserted: if timeline { 0 } else { rows },
        ..Counts::default()
    }
}

/// How many rows and versions a run changed (the event log's counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Counts {
    /// Rows whose values were not there before (inserted or updated rows).
    pub(crate) rows_written: usize,
    /// SCD type 2: versions (key, start) that did not exist before / that were open before
    /// and are closed now.
    pub(crate) versions_opened: usize,
    pub(crate) versions_closed: usize,
    /// SCD type 1: keys whose current row was inserted or changed / removed.
    pub(crate) keys_upserted: usize,
    pub(crate) keys_deleted: usize,
}

#[derive(Debug, Default, PartialEq)]
pub(crate) struct ChangeSet {
    pub(crate) keys: usize,
    /// One old row per changed key that exists in the target (its key drives the delete).
    pub(crate) delete_rows: Vec<u32>,
    /// Every new row of a changed key.
    pub(crate) insert_rows: Vec<u32>,
    /// Every old row of a changed key.
    pub(crate) old_rows: Vec<u32>,
    /// The old rows of the changed keys that no new row repeats, and the new rows that
    /// repeat no old row: the change feed's deletes and inserts. The rows of a changed key
    /// that stay as they were are rewritten, not changed, and stay out of the feed.
    pub(crate) feed_deleted: Vec<u32>,
    pub(crate) feed_inserted: Vec<u32>,
    pub(crate) rows_deleted: usize,
    pub(crate) counts: Counts,
}

impl ChangeSet {
    /// Adds the changes of `other` (of other keys) to these.
    fn absorb(&mut self, other: ChangeSet) {
        self.keys += other.keys;
        self.delete_rows.extend(other.delete_rows);
        self.insert_rows.extend(other.insert_rows);
        self.old_rows.extend(other.old_rows);
        self.feed_deleted.extend(other.feed_deleted);
        self.feed_inserted.extend(other.feed_inserted);
        self.rows_deleted += other.rows_deleted;
        let (c, o) = (&mut self.counts, other.counts);
        c.rows_written += o.rows_written;
        c.versions_opened += o.versions_opened;
        c.versions_closed += o.versions_closed;
        c.keys_upserted += o.keys_upserted;
        c.keys_deleted += o.keys_deleted;
    }
}

#[cfg(test)]
mod tests {
    use super::row_difference;

    /// Rows on both sides cancel out, once per pair; what is left on each side is its
    /// change, by row number.
    #[test]
    fn rows_held_on_both_sides_are_no_change() {
        let old: Vec<super::Numbered> = vec![(b"a", 4), (b"b", 0), (b"b", 2), (b"d", 1)];
        let new: Vec<super::Numbered> = vec![(b"a", 3), (b"b", 1), (b"c", 0), (b"e", 2)];
        assert_eq!(row_difference(&old, &new), (vec![2, 1], vec![0, 2]));
        assert_eq!(row_difference(&old, &old), (vec![], vec![]));
        assert_eq!(row_difference(&[], &new), (vec![], vec![3, 1, 0, 2]));
    }
}
