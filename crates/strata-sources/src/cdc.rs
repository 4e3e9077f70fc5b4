//! Log-based CDC over either change log: PostgreSQL's logical replication ([`PgCdc`]) or
//! the MySQL / MariaDB binlog ([`BinlogCdc`]), behind one control plane ([`LogCdc`]) so the
//! engine runs both through the same steps: snapshot, changes in parts, commit, advance.
//!
//! Both give the same change batches ([`TableBatch`]: the table's columns then
//! `_change_type`, `_commit_lsn`, `_change_seq`, `_commit_timestamp`, `_unchanged_cols`)
//! and the same positions ([`Lsn`]; a binlog position is encoded as
//! [`crate::binlog::position_lsn`] says).

use crate::binlog::{BinlogCdc, BinlogChanges, BinlogSnapshot};
use crate::conn::{ConnectionSpec, SourceKind};
use crate::error::Result;
use crate::lsn::Lsn;
use crate::object::TableRef;
use crate::pg::cdc::{
    CdcConfig, ChangeReader, ChangeSummary, CopyPosition, PgCdc, ReadOptions, SnapshotReader,
    TableBatch,
};

/// The CDC control plane of a connection, whichever database it is.
#[derive(Debug)]
pub enum LogCdc {
    /// PostgreSQL: a replication slot and publication.
    Postgres(PgCdc),
    /// MySQL / MariaDB: the binlog.
    Mysql(BinlogCdc),
}

impl LogCdc {
    /// Connect and check the server's settings for log-based CDC.
    pub async fn connect(spec: &ConnectionSpec, cfg: CdcConfig) -> Result<LogCdc> {
        Ok(match spec.kind {
            SourceKind::Postgres => LogCdc::Postgres(PgCdc::connect(spec, cfg).await?),
            SourceKind::Mysql => LogCdc::Mysql(BinlogCdc::connect(spec, cfg).await?),
        })
    }

    /// The config.
    pub fn config(&self) -> &CdcConfig {
        match self {
            LogCdc::Postgres(c) => c.config(),
            LogCdc::Mysql(c) => c.config(),
        }
    }

    /// Where the changes come from, for messages: `slot strata_orders` or `the binlog`.
    pub fn log_label(&self) -> String {
        match self {
            LogCdc::Postgres(c) => format!("slot {}", c.config().slot),
            LogCdc::Mysql(_) => "the binlog".to_string(),
        }
    }

    /// A position for messages: `lsn 0/16B3748` or `binlog file #3, offset 1234`.
    pub fn describe_position(&self, lsn: Lsn) -> String {
        match self {
            LogCdc::Postgres(_) => format!("lsn {lsn}"),
            LogCdc::Mysql(_) => crate::binlog::describe_position(lsn),
        }
    }

    /// Before a first snapshot: drop what an earlier one left on the server (PostgreSQL's
    /// slot; nothing for the binlog).
    pub async fn reset(&self) -> Result<()> {
        match self {
            LogCdc::Postgres(c) => c.drop_slot().await.map(|_| ()),
            LogCdc::Mysql(_) => Ok(()),
        }
    }

    /// The initial snapshot and the position it corresponds to. `keyed`: tables with a
    /// primary key of types strata orders as the database does are read in key order, so
    /// that an interrupted copy can resume ([`LogSnapshot::position`],
    /// [`LogCdc::resume_snapshot`]); else every table is read as it lies.
    pub async fn start_snapshot(&self, keyed: bool) -> Result<LogSnapshot> {
        Ok(match self {
            LogCdc::Postgres(c) => LogSnapshot::Postgres(Box::new(c.start_snapshot(keyed).await?)),
            LogCdc::Mysql(c) => {
                LogSnapshot::Mysql(c.start_snapshot(&CopyPosition::start(), keyed).await?)
            }
        })
    }

    /// The rest of an interrupted first copy after `from`, in a new snapshot: PostgreSQL's
    /// exported by a temporary slot ([`PgCdc::resume_snapshot`]), MySQL's a new consistent
    /// snapshot. The changes are still read from the first snapshot's position.
    pub async fn resume_snapshot(&self, from: &CopyPosition) -> Result<LogSnapshot> {
        Ok(match self {
            LogCdc::Postgres(c) => LogSnapshot::Postgres(Box::new(c.resume_snapshot(from).await?)),
            LogCdc::Mysql(c) => LogSnapshot::Mysql(c.start_snapshot(from, true).await?),
        })
    }

    /// The changes committed after `after` up to a fence set now.
    pub async fn read_changes(&self, after: Lsn, options: ReadOptions) -> Result<LogChanges> {
        Ok(match self {
            LogCdc::Postgres(c) => LogChanges::Postgres(c.read_changes(after, options).await?),
            LogCdc::Mysql(c) => LogChanges::Mysql(c.read_changes(after, options).await?),
        })
    }

    /// After the Delta commit that recorded `to`: let the server drop the log before it
    /// (PostgreSQL's slot; the binlog keeps nothing for strata, so nothing to do).
    pub async fn advance(&self, to: Lsn) -> Result<()> {
        match self {
            LogCdc::Postgres(c) => c.advance_slot(to).await.map(|_| ()),
            LogCdc::Mysql(_) => Ok(()),
        }
    }

    /// The key columns the change log identifies `table`'s rows by (PostgreSQL's replica
    /// identity, MySQL's primary key).
    pub async fn key_columns(&self, table: &TableRef) -> Result<Vec<String>> {
        match self {
            LogCdc::Postgres(c) => Ok(c.identity(table).await?.1),
            LogCdc::Mysql(c) => c.primary_key(table).await,
        }
    }
}

/// A running initial snapshot.
#[derive(Debug)]
pub enum LogSnapshot {
    /// Through a PostgreSQL slot's exported snapshot (boxed: it holds its read buffers).
    Postgres(Box<SnapshotReader>),
    /// A MySQL / MariaDB consistent-snapshot transaction.
    Mysql(BinlogSnapshot),
}

impl LogSnapshot {
    /// The position the snapshot corresponds to.
    pub fn consistent_point(&self) -> Lsn {
        match self {
            LogSnapshot::Postgres(s) => s.consistent_point(),
            LogSnapshot::Mysql(s) => s.consistent_point(),
        }
    }

    /// Where the rows returned so far end, to resume from (`None`: not at a point a copy
    /// can resume from).
    pub fn position(&self) -> Option<CopyPosition> {
        match self {
            LogSnapshot::Postgres(s) => s.position(),
            LogSnapshot::Mysql(s) => s.position(),
        }
    }

    /// The changes the snapshot holds are those whose `_commit_lsn` is below this:
    /// PostgreSQL's consistent point (a transaction committed at it is streamed, not in
    /// the snapshot), one past a binlog position (a change's `_commit_lsn` is the end of
    /// its transaction, so one ending at the snapshot's position is in it).
    pub fn holds_changes_before(&self) -> Lsn {
        match self {
            LogSnapshot::Postgres(s) => s.consistent_point(),
            LogSnapshot::Mysql(s) => Lsn::from_i64(s.consistent_point().to_i64() + 1),
        }
    }

    /// The next batch; `None` when every table was read.
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        match self {
            LogSnapshot::Postgres(s) => s.next_batch().await,
            LogSnapshot::Mysql(s) => s.next_batch().await,
        }
    }
}

/// A running change read.
#[derive(Debug)]
pub enum LogChanges {
    /// From a PostgreSQL slot.
    Postgres(ChangeReader),
    /// From the binlog.
    Mysql(BinlogChanges),
}

impl LogChanges {
    /// The next batch, or `None` at the end of a part or of the read.
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        match self {
            LogChanges::Postgres(c) => c.next_batch().await,
            LogChanges::Mysql(c) => c.next_batch().await,
        }
    }

    /// Where the part just read ends, if the read stopped at the end of a part.
    pub fn part_end(&self) -> Option<Lsn> {
        match self {
            LogChanges::Postgres(c) => c.part_end(),
            LogChanges::Mysql(c) => c.part_end(),
        }
    }

    /// Goes on after the part was committed.
    pub fn next_part(&mut self) {
        match self {
            LogChanges::Postgres(c) => c.next_part(),
            LogChanges::Mysql(c) => c.next_part(),
        }
    }

    /// What the read took, once it ended.
    pub fn summary(&self) -> Option<&ChangeSummary> {
        match self {
            LogChanges::Postgres(c) => c.summary(),
            LogChanges::Mysql(c) => c.summary(),
        }
    }
}
