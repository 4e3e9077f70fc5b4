//! How far a CDC source has read ([`stored_read`]): its position, or where an interrupted
//! first copy stands, and which changes the parts copied after a resume already hold.
//!
//! The first copy of a table with a primary key strata can order by reads it in key order and
//! commits it in parts, each recording a [`CopyProgress`] (`strata.copy` in its commit
//! info): the first copy's consistent point, where the rows committed so far end, and the
//! resumed parts so far. A run that finds one resumes the copy after that key in a new
//! snapshot, whose rows carry the new snapshot's consistent point: a [`Window`]. The
//! changes are still read from the first consistent point, so a change committed before a
//! window's point to a row that window copied is already in the row: [`superseded`]
//! finds those, and the run drops them. The copy's last commit records the position as
//! every CDC commit does, with the windows (`strata.copy.windows`) as long as the changes
//! read have not passed them.

use crate::error::{Context, EngineError, Result};
use crate::sources::overlap::scalar_of;
use crate::storage::commit::PendingCommit;
use deltalake::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Int64Type};
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::DeltaTable;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use strata_sources::{CopyPosition, Lsn, Watermark};

/// The commit-info key of a first copy's progress (`strata.copy`, `strata.copy.<flow>`).
pub(crate) fn copy_key(append_flow: Option<&str>) -> String {
    match append_flow {
        None => "strata.copy".to_string(),
        Some(f) => format!("strata.copy.{f}"),
    }
}

/// The commit-info key of the windows of a resumed first copy that the changes read have
/// not passed yet (`strata.copy.windows`, `strata.copy.windows.<flow>`).
fn windows_key(append_flow: Option<&str>) -> String {
    match append_flow {
        None => "strata.copy.windows".to_string(),
        Some(f) => format!("strata.copy.windows.{f}"),
    }
}

/// A part of a first copy taken after a resume: the rows of the source's table number
/// `table` with a key above `after` (all of them for `None`), and every row of the tables
/// after it, as of a snapshot that holds the changes whose `_commit_lsn` is below `before`
/// (`strata_sources::LogSnapshot::holds_changes_before`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window {
    pub(crate) table: usize,
    pub(crate) after: Option<Watermark>,
    pub(crate) before: Lsn,
}

/// Where an interrupted first copy stands (see the module's documentation).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CopyProgress {
    /// The first copy's consistent point: the changes are read from it.
    pub(crate) consistent_point: Lsn,
    /// Where the rows committed so far end.
    pub(crate) position: CopyPosition,
    /// The parts copied after a resume so far.
    pub(crate) windows: Vec<Window>,
}

#[derive(Serialize, Deserialize)]
struct WindowJson {
    table: usize,
    after: Option<String>,
    before: String,
}

#[derive(Serialize, Deserialize)]
struct ProgressJson {
    consistent_point: String,
    table: usize,
    after: Option<String>,
    windows: Vec<WindowJson>,
}

impl Window {
    fn to_json(&self) -> WindowJson {
        WindowJson {
            table: self.table,
            after: self.after.as_ref().map(Watermark::to_json),
            before: self.before.to_string(),
        }
    }

    fn from_json(j: WindowJson) -> Result<Window> {
        Ok(Window {
            table: j.table,
            after: j.after.as_deref().map(watermark).transpose()?,
            before: lsn(&j.before)?,
        })
    }
}

fn lsn(text: &str) -> Result<Lsn> {
    text.parse().map_err(|_| unreadable(text))
}

fn watermark(text: &str) -> Result<Watermark> {
    Watermark::from_json(text).map_err(|_| unreadable(text))
}

fn unreadable(text: &str) -> EngineError {
    EngineError::internal(format!(
        "the first copy's progress recorded in the table's log does not read back: {text}"
    ))
}

impl CopyProgress {
    /// The JSON text recorded under [`copy_key`].
    pub(crate) fn to_json(&self) -> String {
        let j = ProgressJson {
            consistent_point: self.consistent_point.to_string(),
            table: self.position.table,
            after: self.position.after.as_ref().map(Watermark::to_json),
            windows: self.windows.iter().map(Window::to_json).collect(),
        };
        serde_json::to_string(&j).unwrap_or_default()
    }

    pub(crate) fn from_json(text: &str) -> Result<CopyProgress> {
        let j: ProgressJson = serde_json::from_str(text).map_err(|_| unreadable(text))?;
        Ok(CopyProgress {
            consistent_point: lsn(&j.consistent_point)?,
            position: CopyPosition {
                table: j.table,
                after: j.after.as_deref().map(watermark).transpose()?,
            },
            windows: j
                .windows
                .into_iter()
                .map(Window::from_json)
                .collect::<Result<_>>()?,
        })
    }
}

/// The windows a commit at `position` records: those a change read from there has not
/// passed yet (under [`windows_key`] for `append_flow`), none when it has passed them all.
pub(crate) fn with_windows(
    commit: PendingCommit,
    append_flow: Option<&str>,
    windows: &[Window],
    position: Lsn,
) -> PendingCommit {
    let open: Vec<WindowJson> = open_windows(windows, position)
        .iter()
        .map(Window::to_json)
        .collect();
    match open.is_empty() {
        true => commit,
        false => commit.with_info(
            windows_key(append_flow),
            serde_json::Value::String(serde_json::to_string(&open).unwrap_or_default()),
        ),
    }
}

/// The windows a change read starting after `from` must still apply: those whose point it
/// has not passed.
pub(crate) fn open_windows(windows: &[Window], from: Lsn) -> Vec<Window> {
    windows
        .iter()
        .filter(|w| w.before > from)
        .cloned()
        .collect()
}

/// How far a CDC source's table has read, as its log says.
#[derive(Debug, PartialEq)]
pub(crate) enum Stored {
    /// Nothing yet: a first copy starts.
    Nothing,
    /// A first copy stopped there.
    Copying(CopyProgress),
    /// The changes are read after `lsn`, with the windows its commit carried.
    Reading { lsn: Lsn, windows: Vec<Window> },
}

/// How far `table` has read for `append_flow`, from the newest commit that recorded a
/// position (`strata.lsn`, with its windows) or a first copy's progress, in one walk of
/// its history.
pub(crate) async fn stored_read(table: &DeltaTable, append_flow: Option<&str>) -> Result<Stored> {
    let (lsn_key, copy) = (
        crate::sources::watermark::lsn_key(append_flow),
        copy_key(append_flow),
    );
    let text = |info: &std::collections::HashMap<String, serde_json::Value>, key: &str| match info
        .get(key)
    {
        Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
        Some(other) => Err(unreadable(&other.to_string())),
        None => Ok(None),
    };
    let mut history = table.history(None);
    while let Some(info) = history.next().await {
        let info = info.context(|| "reading table history".into())?.info;
        if let Some(at) = text(&info, &lsn_key)? {
            let windows = match text(&info, &windows_key(append_flow))? {
                Some(j) => serde_json::from_str::<Vec<WindowJson>>(&j)
                    .map_err(|_| unreadable(&j))?
                    .into_iter()
                    .map(Window::from_json)
                    .collect::<Result<_>>()?,
                None => Vec::new(),
            };
            return Ok(Stored::Reading {
                lsn: lsn(&at)?,
                windows,
            });
        }
        if let Some(progress) = text(&info, &copy)? {
            return CopyProgress::from_json(&progress).map(Stored::Copying);
        }
    }
    Ok(Stored::Nothing)
}

/// Which rows of `batch` (changes of the source's table number `table`) a window already
/// holds: committed (`_commit_lsn`) before the window's point, to a row of the part it
/// copied (the table after the window's table, or the window's table with a key above the
/// window's `after`, compared as the copy ordered them).
pub(crate) fn superseded(
    batch: &RecordBatch,
    table: usize,
    windows: &[Window],
) -> Result<BooleanArray> {
    let rows = batch.num_rows();
    let mut out = vec![false; rows];
    let lsns = batch
        .column_by_name(strata_sources::batch::meta::COMMIT_LSN)
        .ok_or_else(|| EngineError::internal("a change batch without _commit_lsn"))?;
    let lsns = cast(lsns, &DataType::Int64).context(|| "reading _commit_lsn".into())?;
    let lsns = lsns.as_primitive::<Int64Type>();
    for w in windows.iter().filter(|w| w.table <= table) {
        let before = w.before.to_i64();
        let above = match (&w.after, w.table == table) {
            (Some(after), true) => Some(keys_above(batch, after)?),
            _ => None,
        };
        for (r, skip) in out.iter_mut().enumerate() {
            let in_part = above.as_ref().is_none_or(|a| a[r]);
            if in_part && lsns.is_valid(r) && lsns.value(r) < before {
                *skip = true;
            }
        }
    }
    Ok(BooleanArray::from(out))
}

/// For each row of `batch`: whether its key (the columns `after` names) is above `after`.
fn keys_above(batch: &RecordBatch, after: &Watermark) -> Result<Vec<bool>> {
    let mut columns = Vec::new();
    let mut bound = Vec::new();
    for (name, value) in after.columns.iter().zip(&after.values) {
        let col = batch.column_by_name(name).ok_or_else(|| {
            EngineError::internal(format!("key column {name} is not in the change rows"))
        })?;
        let scalar = scalar_of(value, col.data_type())?;
        bound.push(
            scalar
                .to_array()
                .context(|| format!("the copy's last key value of {name}"))?,
        );
        columns.push(col.clone());
    }
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).context(|| "comparing keys".into())?;
    let rows = converter
        .convert_columns(&columns)
        .context(|| "comparing keys".into())?;
    let bound = converter
        .convert_columns(&bound)
        .context(|| "comparing keys".into())?;
    let bound = bound.row(0);
    Ok((0..batch.num_rows()).map(|r| rows.row(r) > bound).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;
    use strata_sources::WatermarkValue;

    fn batch(keys: &[&str], lsns: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Utf8, false),
                Field::new("_commit_lsn", DataType::Int64, false),
            ])),
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(lsns.to_vec())),
            ],
        )
        .unwrap()
    }

    fn after(k: &str) -> Option<Watermark> {
        Some(Watermark {
            columns: vec!["k".into()],
            values: vec![WatermarkValue::Str(k.into())],
        })
    }

    #[test]
    fn a_change_is_superseded_only_above_the_key_and_before_the_point() {
        let b = batch(&["a", "m", "z", "Z", "zz"], &[5, 5, 5, 5, 20]);
        let w = [Window {
            table: 0,
            after: after("m"),
            before: Lsn::from_i64(10),
        }];
        let s = superseded(&b, 0, &w).unwrap();
        // Bytewise: "Z" sorts below "m"; "zz" is above but committed after the point.
        assert_eq!(
            s.iter().map(Option::unwrap).collect::<Vec<_>>(),
            vec![false, false, true, false, false]
        );
        // A later table was copied whole in the window; an earlier one not at all.
        assert!(superseded(&b, 1, &w)
            .unwrap()
            .iter()
            .take(4)
            .all(|x| x == Some(true)));
        let later = [Window {
            table: 1,
            ..w[0].clone()
        }];
        assert_eq!(superseded(&b, 0, &later).unwrap().true_count(), 0);
    }

    #[test]
    fn windows_of_two_resumes_each_cover_their_part() {
        let b = batch(&["c", "h", "q"], &[15, 15, 15]);
        let w = [
            Window {
                table: 0,
                after: after("b"),
                before: Lsn::from_i64(10),
            },
            Window {
                table: 0,
                after: after("p"),
                before: Lsn::from_i64(20),
            },
        ];
        // "c" and "h" were copied at 10 (the change at 15 is new to them), "q" at 20.
        let s = superseded(&b, 0, &w).unwrap();
        assert_eq!(
            s.iter().map(Option::unwrap).collect::<Vec<_>>(),
            vec![false, false, true]
        );
        assert_eq!(open_windows(&w, Lsn::from_i64(12)).len(), 1);
    }

    #[test]
    fn progress_reads_back() {
        let p = CopyProgress {
            consistent_point: Lsn::from_i64(42),
            position: CopyPosition {
                table: 0,
                after: after("it's"),
            },
            windows: vec![Window {
                table: 0,
                after: None,
                before: Lsn::from_i64(50),
            }],
        };
        assert_eq!(CopyProgress::from_json(&p.to_json()).unwrap(), p);
    }
}
