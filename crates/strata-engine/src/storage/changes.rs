//! What a table's commits after a version changed, told apart from upkeep.
//!
//! A reader that streams from a table (`STREAM(t)`, an AUTO CDC flow, an append flow) finds
//! its new rows in the files added since the version it last read. Upkeep commits add and
//! remove files too, but change no row: OPTIMIZE (bin-packing, Z-order) removes small files
//! and adds the same rows in bigger ones, all with `dataChange = false`, and VACUUM records
//! `VACUUM START` / `VACUUM END` commits that hold no file at all. Such a commit is no news
//! to a reader: its added files hold rows the reader has taken already, and its removes are
//! no deletes (Delta's change data feed skips them for the same reason).
//!
//! A compaction may also rewrite files a reader has not read yet: their rows now sit in a
//! new file beside rows it has read. The reader then reads the files as they were added
//! (the table's change data feed does: they are still on disk until VACUUM removes them,
//! and `strata vacuum` keeps them while a pending reader needs them).

use crate::error::{Context, Result};
use deltalake::kernel::Action;
use deltalake::DeltaTable;
use std::collections::HashSet;

/// The commits of a table after a reader's position, as that reader sees them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Changes {
    /// Every commit after the position is upkeep (or there is none): nothing to read.
    pub(crate) only_upkeep: bool,
    /// Every commit after the position only added rows or is upkeep: no row removed or
    /// rewritten, no schema, property or protocol change. False when a commit file of the
    /// range is gone (log cleanup): what it did is unknown.
    pub(crate) only_appends: bool,
    /// Files added with data after the position that the latest version still holds,
    /// sorted.
    pub(crate) live: Vec<String>,
    /// Files added with data after the position and since rewritten by upkeep: their rows
    /// are now in files that also hold older rows, so the reader must read these files as
    /// they were added.
    pub(crate) rewritten: Vec<String>,
}

/// What kind of change one commit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitKind {
    /// Rows were added, removed or changed (or something other than files changed: the
    /// schema, properties, a position).
    Data,
    /// Files rearranged without changing a row (`dataChange = false` on every file), or a
    /// VACUUM's record.
    Upkeep,
}

/// The operations whose commits change no row, as their commit info names them.
const UPKEEP_OPERATIONS: [&str; 3] = ["OPTIMIZE", "VACUUM START", "VACUUM END"];

/// Whether `operation` (as a commit info names it) is upkeep: OPTIMIZE or VACUUM.
pub(crate) fn is_upkeep_operation(operation: &str) -> bool {
    UPKEEP_OPERATIONS.contains(&operation)
}

/// Whether a commit of these actions is upkeep (see the module docs).
pub(crate) fn commit_kind(actions: &[Action]) -> CommitKind {
    let mut files = 0usize;
    for a in actions {
        match a {
            Action::Add(add) if add.data_change => return CommitKind::Data,
            Action::Remove(r) if r.data_change => return CommitKind::Data,
            Action::Add(_) | Action::Remove(_) => files += 1,
            Action::Cdc(_) | Action::Metadata(_) | Action::Protocol(_) => return CommitKind::Data,
            Action::Txn(_) => return CommitKind::Data,
            Action::CommitInfo(_) | Action::DomainMetadata(_) => {}
        }
    }
    let upkeep_operation = actions.iter().any(|a| {
        matches!(a, Action::CommitInfo(ci)
            if ci.operation.as_deref().is_some_and(|op| UPKEEP_OPERATIONS.contains(&op)))
    });
    match files > 0 || upkeep_operation {
        true => CommitKind::Upkeep,
        false => CommitKind::Data,
    }
}

/// The actions of commit `version` of `table`; `None` if its commit file is gone (log
/// cleanup).
pub(crate) async fn read_commit(table: &DeltaTable, version: i64) -> Result<Option<Vec<Action>>> {
    let Ok(v) = u64::try_from(version) else {
        return Ok(None);
    };
    let bytes = table
        .log_store()
        .read_commit_entry(v)
        .await
        .context(|| format!("reading commit {version} of {}", table.table_url()))?;
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    deltalake::logstore::get_actions(v, &bytes)
        .map(Some)
        .context(|| format!("reading commit {version} of {}", table.table_url()))
}

/// The newest version of `table` whose commit is not upkeep, -1 if none: what a reader of
/// the whole table (a materialized view) compares with the version it last read, so that an
/// OPTIMIZE or a VACUUM of its input does not make it compute again. A commit whose file is
/// gone counts as data.
pub(crate) async fn data_version(table: &DeltaTable) -> Result<i64> {
    let mut v = crate::storage::table::version_of(table);
    while v >= 0 {
        match read_commit(table, v).await? {
            Some(actions) if commit_kind(&actions) == CommitKind::Upkeep => v -= 1,
            _ => return Ok(v),
        }
    }
    Ok(v)
}

/// The changes of `source` after version `from` (all of it when `None`), as a reader of
/// its added rows sees them (see the module docs). When a commit file of the range is gone
/// (log cleanup), every file the latest version holds and the version at `from` did not
/// counts as added.
pub(crate) async fn changes_since(source: &DeltaTable, from: Option<i64>) -> Result<Changes> {
    let now = crate::storage::table::table_files(source)?;
    let latest = crate::storage::table::version_of(source);
    let Some(from) = from else {
        let mut live: Vec<String> = now.into_iter().collect();
        live.sort();
        return Ok(Changes {
            only_upkeep: latest < 0,
            only_appends: true,
            live,
            rewritten: Vec::new(),
        });
    };
    let now_decoded: HashSet<String> = now.iter().map(|p| percent_decoded(p)).collect();
    let mut only_upkeep = true;
    let mut only_appends = true;
    let mut added: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for v in (from + 1)..=latest {
        let Some(actions) = read_commit(source, v).await? else {
            return by_difference(source, from, now).await;
        };
        if commit_kind(&actions) == CommitKind::Upkeep {
            continue;
        }
        only_upkeep = false;
        only_appends &= actions.iter().all(|a| match a {
            Action::Add(_) | Action::Txn(_) | Action::CommitInfo(_) => true,
            Action::DomainMetadata(_) => true,
            Action::Remove(r) => !r.data_change,
            Action::Cdc(_) | Action::Metadata(_) | Action::Protocol(_) => false,
        });
        for a in &actions {
            if let Action::Add(add) = a {
                let path = percent_decoded(&add.path);
                if add.data_change && seen.insert(path.clone()) {
                    added.push(path);
                }
            }
        }
    }
    // Paths as the table state spells them (what a scan's file selection matches).
    let spelled: std::collections::HashMap<String, &String> =
        now.iter().map(|p| (percent_decoded(p), p)).collect();
    let mut live = Vec::new();
    let mut rewritten = Vec::new();
    for path in added {
        match now_decoded.contains(&path) {
            true => live.push(spelled[&path].clone()),
            false => rewritten.push(path),
        }
    }
    live.sort();
    rewritten.sort();
    // Files added and later removed with data (deleted rows) are not rewritten: a reader
    // of added rows never sees them, as before. Only files whose rows still exist count.
    let rewritten = rewritten_by_upkeep(source, from, latest, rewritten).await?;
    Ok(Changes {
        only_upkeep,
        only_appends,
        live,
        rewritten,
    })
}

/// Of `candidates` (files added after `from` that the latest version no longer holds), the
/// ones an upkeep commit removed.
async fn rewritten_by_upkeep(
    source: &DeltaTable,
    from: i64,
    latest: i64,
    candidates: Vec<String>,
) -> Result<Vec<String>> {
    if candidates.is_empty() {
        return Ok(candidates);
    }
    let mut wanted: HashSet<String> = candidates.into_iter().collect();
    let mut out = Vec::new();
    for v in (from + 1)..=latest {
        let Some(actions) = read_commit(source, v).await? else {
            continue;
        };
        for a in &actions {
            if let Action::Remove(r) = a {
                let path = percent_decoded(&r.path);
                if !r.data_change && wanted.remove(&path) {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Registers as `name` the rows `changes` found added to `table` after `from`, up to
/// `until`: the files still live, or, when upkeep rewrote some of them before they were
/// read, the inserts of the table's change data feed, which reads every file as it was
/// added (`storage/changes.rs`).
pub(crate) async fn register_new_rows(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    name: &str,
    table: &DeltaTable,
    from: Option<i64>,
    until: i64,
    changes: &Changes,
) -> Result<()> {
    if changes.rewritten.is_empty() {
        return crate::storage::session::register_table(
            ctx,
            name,
            table,
            Some(changes.live.clone()),
        )
        .await;
    }
    tracing::info!(
        "{} file(s) of {} were compacted before they were read; reading its change feed",
        changes.rewritten.len(),
        table.table_url()
    );
    let feed = crate::storage::feed::read_feed(table, from, Some(until), false).await?;
    let rows = crate::storage::feed::inserted_rows(&feed)?;
    ctx.register_batch(name, rows)
        .context(|| format!("registering {name}"))?;
    Ok(())
}

/// The files the latest version holds and the version `from` did not: what readers took
/// before strata told upkeep apart, for a table whose log no longer holds every commit.
async fn by_difference(source: &DeltaTable, from: i64, now: HashSet<String>) -> Result<Changes> {
    let mut old = source.clone();
    old.load_version(from as u64)
        .await
        .context(|| format!("loading source version {from}"))?;
    let old = crate::storage::table::table_files(&old)?;
    let mut live: Vec<String> = now.difference(&old).cloned().collect();
    live.sort();
    Ok(Changes {
        only_upkeep: false,
        only_appends: false,
        live,
        rewritten: Vec::new(),
    })
}

/// What a reader at a version still needs of a table's files, beyond its latest version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unread {
    /// Versions whose files VACUUM must keep: `r - 1` for every commit `r` after the
    /// reader's position that removes a file the reader may still read: a file removed
    /// with its rows (a change feed reads it for the deletes), or one added after the
    /// position and rewritten by upkeep. A file removed at `r` is in version `r - 1`.
    pub(crate) versions: Vec<i64>,
    /// The time (ms since the epoch) of the oldest commit after the position that wrote
    /// change files (`_change_data/`, which no version holds): VACUUM keeps files written
    /// since.
    pub(crate) oldest_change_files: Option<i64>,
}

/// What a reader of `table` at version `from` (-1: before the first) still needs.
pub(crate) async fn unread_since(table: &DeltaTable, from: i64) -> Result<Unread> {
    let latest = crate::storage::table::version_of(table);
    let mut out = Unread::default();
    let mut added: HashSet<String> = HashSet::new();
    for v in (from + 1).max(0)..=latest {
        let Some(actions) = read_commit(table, v).await? else {
            continue;
        };
        let mut needs_previous = false;
        let mut change_files = false;
        let mut at = None;
        for a in &actions {
            match a {
                Action::Add(add) if add.data_change => {
                    added.insert(percent_decoded(&add.path));
                }
                Action::Remove(r) => {
                    needs_previous |= r.data_change || added.contains(&percent_decoded(&r.path))
                }
                Action::Cdc(_) => change_files = true,
                Action::CommitInfo(ci) => at = ci.in_commit_timestamp.or(ci.timestamp),
                _ => {}
            }
        }
        if needs_previous && v > 0 {
            out.versions.push(v - 1);
        }
        if change_files && out.oldest_change_files.is_none() {
            // Without a recorded time, keep every change file.
            out.oldest_change_files = Some(at.unwrap_or(0));
        }
    }
    Ok(out)
}

/// `path` with `%XX` escapes decoded (Delta's log spells paths as URIs).
pub(crate) fn percent_decoded(path: &str) -> String {
    if !path.contains('%') {
        return path.to_string();
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::kernel::{Add, CommitInfo, Remove};

    fn add(path: &str, data_change: bool) -> Action {
        Action::Add(Add {
            path: path.into(),
            data_change,
            ..Default::default()
        })
    }

    fn remove(path: &str, data_change: bool) -> Action {
        Action::Remove(Remove {
            path: path.into(),
            data_change,
            ..Default::default()
        })
    }

    fn info(op: &str) -> Action {
        Action::CommitInfo(CommitInfo {
            operation: Some(op.into()),
            ..Default::default()
        })
    }

    #[test]
    fn compaction_and_vacuum_are_upkeep_and_everything_else_is_data() {
        let compaction = [info("OPTIMIZE"), add("c", false), remove("a", false)];
        assert_eq!(commit_kind(&compaction), CommitKind::Upkeep);
        assert_eq!(commit_kind(&[info("VACUUM START")]), CommitKind::Upkeep);
        assert_eq!(commit_kind(&[info("VACUUM END")]), CommitKind::Upkeep);
        assert_eq!(
            commit_kind(&[info("WRITE"), add("b", true)]),
            CommitKind::Data
        );
        assert_eq!(
            commit_kind(&[info("DELETE"), remove("b", true)]),
            CommitKind::Data
        );
        // A rewrite that also deletes rows changes data.
        let mixed = [info("OPTIMIZE"), add("c", false), remove("a", true)];
        assert_eq!(commit_kind(&mixed), CommitKind::Data);
        // A commit without files that is no VACUUM (a position, a property) is data.
        assert_eq!(commit_kind(&[info("WRITE")]), CommitKind::Data);
    }

    #[test]
    fn paths_are_compared_decoded() {
        assert_eq!(
            percent_decoded("a%3Db/part%20x.parquet"),
            "a=b/part x.parquet"
        );
        assert_eq!(percent_decoded("plain.parquet"), "plain.parquet");
        assert_eq!(percent_decoded("odd%"), "odd%");
        assert_eq!(percent_decoded("odd%4"), "odd%4");
    }
}
