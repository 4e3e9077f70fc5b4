//! A commit as a value: what a dataset's run records in the one Delta commit that holds its
//! rows, built before anything is written and handed to the writer.
//!
//! Positions are Delta application transactions (`txn` actions): the version of an input a
//! table has taken, under an id that says whose input it is ([`AppId`]). A commit that
//! records a position conflicts with any other commit that recorded the same id after the
//! state it was computed from (Delta's conflict check), so two runs that took the same
//! input cannot both commit it: the second one starts again (`EngineError::Conflict`).

use crate::error::{Context, Result};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use serde_json::Value;
use std::fmt;
use strata_sql::TableName;

/// Whose input a position is: the one place that spells the application ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppId<'a> {
    /// An AUTO CDC flow's position in its source, in its event store (and in its target
    /// and a `SNAPSHOTS` target): `strata-flow:<flow>`.
    Flow(&'a str),
    /// The event-store version a target reflects: `strata-events`.
    Events,
    /// A streaming table's position in the table it streams from: `strata-source:<table>`.
    Source(&'a TableName),
    /// An append flow's position in the table it streams from: `strata-append:<flow>`.
    Append(&'a str),
    /// A once flow (`INSERT INTO ONCE`) ran, in the commit that holds its rows:
    /// `strata-once:<flow>`, recording that commit's own version.
    Once(&'a str),
    /// The commits that take input files, counted: `strata-files` for a streaming table's
    /// own query, `strata-files:<flow>` for an append flow.
    Files(Option<&'a str>),
    /// The commits that take rows from a database by watermark, counted:
    /// `strata-database` for a streaming table's own query, `strata-database:<flow>` for an
    /// append flow (the watermark itself is in the commit info).
    Database(Option<&'a str>),
    /// A change-history table's position in the change feed of its source (a table name
    /// or a path, as written): `strata-history:<source>`.
    History(&'a str),
    /// A point-in-time table's position in one historised table:
    /// `strata-pit:<pit table>:<table>`.
    Pit {
        pit: &'a TableName,
        source: &'a TableName,
    },
}

impl fmt::Display for AppId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppId::Flow(flow) => write!(f, "strata-flow:{flow}"),
            AppId::Events => f.write_str("strata-events"),
            AppId::Source(table) => write!(f, "strata-source:{table}"),
            AppId::Append(flow) => write!(f, "strata-append:{flow}"),
            AppId::Once(flow) => write!(f, "strata-once:{flow}"),
            AppId::Files(None) => f.write_str("strata-files"),
            AppId::Files(Some(flow)) => write!(f, "strata-files:{flow}"),
            AppId::Database(None) => f.write_str("strata-database"),
            AppId::Database(Some(flow)) => write!(f, "strata-database:{flow}"),
            AppId::History(source) => write!(f, "strata-history:{source}"),
            AppId::Pit { pit, source } => write!(f, "strata-pit:{pit}:{source}"),
        }
    }
}

/// The position `table` records under `id`, if any.
pub(crate) async fn position(table: &DeltaTable, id: AppId<'_>) -> Result<Option<i64>> {
    let app_id = id.to_string();
    table
        .snapshot()
        .context(|| "reading table state".into())?
        .transaction_version(table.log_store().as_ref(), &app_id)
        .await
        .context(|| format!("reading transaction {app_id}"))
}

/// The commit-info entry naming the run that made a commit (`strata.run`), so that a run
/// that loses a race can name the other writer.
pub(crate) const RUN_KEY: &str = "strata.run";

/// What one commit records besides its actions: positions, commit-info entries, and whether
/// it may trim the table's log.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingCommit {
    positions: Vec<(String, i64)>,
    info: Vec<(String, Value)>,
    keep_log: bool,
    /// The commit must land exactly on the version after the state it was computed from
    /// (no rebasing over another writer's commit).
    exact: bool,
}

impl PendingCommit {
    /// A commit of the run `run` (its id, as the event log records it).
    pub(crate) fn of_run(run: &str) -> Self {
        PendingCommit::default().with_info(RUN_KEY, Value::String(run.to_string()))
    }

    /// Records that the table has taken its input under `id` up to `version`.
    pub(crate) fn at(mut self, id: AppId<'_>, version: i64) -> Self {
        self.positions.push((id.to_string(), version));
        self
    }

    /// Adds a commit-info entry (a later entry of the same key replaces an earlier one).
    pub(crate) fn with_info(mut self, key: impl Into<String>, value: Value) -> Self {
        let key = key.into();
        self.info.retain(|(k, _)| *k != key);
        self.info.push((key, value));
        self
    }

    /// The commit must not delete expired commit files (Delta writers do once a checkpoint
    /// covers them): the table's log is the record of something (the files it took).
    pub(crate) fn keeping_log(mut self) -> Self {
        self.keep_log = true;
        self
    }

    /// The commit fails, as a conflict, when another writer committed since the state it
    /// was computed from, instead of being retried on top of that commit: for a commit
    /// that records its own version (`AppId::Once`), which must not move.
    pub(crate) fn exactly_next(mut self) -> Self {
        self.exact = true;
        self
    }

    /// The positions this commit records, as `(app id, version)`.
    #[cfg(test)]
    pub(crate) fn positions(&self) -> &[(String, i64)] {
        &self.positions
    }

    /// The commit's properties for delta-rs.
    pub(crate) fn properties(&self) -> CommitProperties {
        let mut props = CommitProperties::default();
        for (id, version) in &self.positions {
            props = props.with_application_transaction(Transaction::new(id, *version));
        }
        if !self.info.is_empty() {
            props = props.with_metadata(self.info.clone());
        }
        if self.keep_log {
            props = props.with_cleanup_expired_logs(Some(false));
        }
        if self.exact {
            props = props.with_max_retries(0);
        }
        props
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of id is spelled as the tables written before this type recorded them.
    #[test]
    fn app_ids_keep_their_spelling() {
        let t = TableName::new(None, "users");
        let p = TableName::new(Some("gold"), "pit");
        let ids = [
            (AppId::Flow("f"), "strata-flow:f"),
            (AppId::Events, "strata-events"),
            (AppId::Source(&t), "strata-source:default.users"),
            (AppId::Append("a"), "strata-append:a"),
            (AppId::Once("b"), "strata-once:b"),
            (AppId::Files(None), "strata-files"),
            (AppId::Files(Some("a")), "strata-files:a"),
            (
                AppId::Pit {
                    pit: &p,
                    source: &t,
                },
                "strata-pit:gold.pit:default.users",
            ),
        ];
        for (id, spelled) in ids {
            assert_eq!(id.to_string(), spelled);
        }
    }

    /// Positions and info entries all reach the commit; an entry set twice keeps the last.
    #[test]
    fn a_pending_commit_carries_its_positions_and_info() {
        let c = PendingCommit::of_run("r1")
            .at(AppId::Events, 7)
            .at(AppId::Flow("f"), 3)
            .with_info("k", Value::from(1))
            .with_info("k", Value::from(2));
        assert_eq!(
            c.positions(),
            &[
                ("strata-events".to_string(), 7),
                ("strata-flow:f".to_string(), 3)
            ]
        );
        assert_eq!(
            c.info,
            vec![
                (RUN_KEY.to_string(), Value::from("r1")),
                ("k".to_string(), Value::from(2))
            ]
        );
        assert!(!c.keep_log && c.keeping_log().keep_log);
    }
}
