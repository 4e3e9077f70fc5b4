//! PostgreSQL log-based CDC for triggered runs: publication + logical replication slot
//! (pgoutput), an initial snapshot exported by the slot, then bounded reads of committed
//! changes up to a fence.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use pgwire_replication::{ReplicationClient, ReplicationEvent};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::pgoutput::{self, Message, Relation, TupleValue};
use super::read::{describe, PgRowReader, SnapshotMeta, TextParam};
use super::types::{append_binary, map_builtin, PgDecode, PgMapped, PG_EPOCH_MICROS};
use crate::batch::{change_meta_fields, meta, ChangeBuffer, ColumnKind, SourceSchema};
use crate::conn::{pg_error_text, ConnectionSpec, Resolved};
use crate::error::{Result, SourceError};
use crate::lsn::Lsn;
use crate::object::{pg_ident, SourceObject, TableRef};
use crate::read::DEFAULT_BATCH_ROWS;
use crate::tls::TlsMode;

/// The prefix of the logical decoding message that bounds a run.
pub const FENCE_PREFIX: &str = "strata-fence";

/// One source table of a CDC connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdcTable {
    /// The table (`schema.table`; no schema means `public`).
    pub table: TableRef,
    /// Columns not to read (for example ones with types strata cannot map). A publication
    /// column list does the same on the server.
    pub exclude_columns: Vec<String>,
}

impl CdcTable {
    /// All columns of a table.
    pub fn new(table: TableRef) -> Self {
        CdcTable {
            table,
            exclude_columns: vec![],
        }
    }
}

/// What a CDC source reads and through which slot and publication.
#[derive(Clone, Debug)]
pub struct CdcConfig {
    /// Replication slot name: lowercase letters, digits and `_`, at most 63 characters.
    pub slot: String,
    /// Publication name: letters, digits and `_`.
    pub publication: String,
    /// `true`: strata creates the publication (`FOR TABLE` the tables) when it does not exist
    /// and adds missing tables to it when the snapshot is taken. `false`: the publication must
    /// exist and contain the tables.
    pub create_publication: bool,
    /// The tables to deliver (others in the publication are ignored).
    pub tables: Vec<CdcTable>,
    /// Rows per batch and table.
    pub batch_rows: usize,
}

impl CdcConfig {
    /// A config that manages its own publication.
    pub fn new(
        slot: impl Into<String>,
        publication: impl Into<String>,
        tables: Vec<TableRef>,
    ) -> Self {
        CdcConfig {
            slot: slot.into(),
            publication: publication.into(),
            create_publication: true,
            tables: tables.into_iter().map(CdcTable::new).collect(),
            batch_rows: DEFAULT_BATCH_ROWS,
        }
    }

    fn table_key(t: &TableRef) -> (String, String) {
        (
            t.schema.clone().unwrap_or_else(|| "public".into()),
            t.name.clone(),
        )
    }
}

/// The slot as the server reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotStatus {
    /// The slot.
    pub slot: String,
    /// Up to where the consumer confirmed (strata: what the engine committed and advanced to).
    pub confirmed_flush_lsn: Lsn,
    /// The oldest WAL the slot keeps.
    pub restart_lsn: Option<Lsn>,
    /// The server's current WAL position.
    pub current_wal_lsn: Lsn,
    /// WAL bytes between `confirmed_flush_lsn` and `current_wal_lsn`: how far behind strata
    /// is (and roughly what the server retains for it).
    pub lag_bytes: u64,
    /// A session is streaming from the slot now.
    pub active: bool,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+).
    pub wal_status: Option<String>,
}

/// One batch of one table's rows.
#[derive(Clone, Debug)]
pub struct TableBatch {
    /// The source table.
    pub table: TableRef,
    /// Table columns, then `_change_type`, `_commit_lsn`, `_change_seq`, `_commit_timestamp`,
    /// `_unchanged_cols`.
    pub batch: RecordBatch,
    /// Columns this batch has that this table's earlier batches of the run did not (a column
    /// added to the source table mid-stream; earlier rows of this batch have NULL there).
    pub added_columns: Vec<String>,
    /// The updates of this batch that changed the row's key, as (`_commit_lsn`,
    /// `_change_seq`): each follows the `delete` of the old key at (`_commit_lsn`,
    /// `_change_seq - 1`), whose last values are the row's (unchanged TOASTed values are
    /// taken from the old key).
    pub key_changes: Vec<(i64, i64)>,
}

/// How far a first copy in key order got: every row of the tables before `table` (its
/// index among the config's tables) is copied, and of `table` every row whose key is at or
/// below `after` (`None`: none of it). Recorded with each part of the copy, it is where an
/// interrupted copy resumes ([`PgCdc::resume_snapshot`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CopyPosition {
    /// The table being copied.
    pub table: usize,
    /// The key (primary key columns, in order) of the last row of `table` copied.
    pub after: Option<crate::value::Watermark>,
}

impl CopyPosition {
    /// Nothing copied yet: a first copy's start.
    pub fn start() -> Self {
        CopyPosition {
            table: 0,
            after: None,
        }
    }

    /// The key a copy from here starts after in the table numbered `index` (one at or after
    /// `table`): `after` in `table`, none in the tables after it.
    pub fn after_in(&self, index: usize) -> Option<crate::value::Watermark> {
        self.after.clone().filter(|_| index == self.table)
    }
}

/// Options of one change read.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Stop at the first transaction end after this many changes were taken (the summary is
    /// then not `complete`; run again for the rest). `None`: read up to the fence.
    pub max_changes: Option<u64>,
    /// End a part at the first transaction end after this many changes since the last part
    /// (see [`ChangeReader::part_end`]): the stream stays open while the caller commits the
    /// part. `None`: one part, the whole read.
    pub part_changes: Option<u64>,
    /// Fail when the server sends nothing (not even a keepalive) for this long.
    pub idle_timeout: Duration,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            max_changes: None,
            part_changes: None,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// What a change read took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeSummary {
    /// **The LSN to record** with the Delta commit of these batches, and to give back as
    /// `after` next run, and to advance the slot to after the commit. The fence when the read
    /// reached it (everything committed before it has been seen), else the end LSN of the
    /// last transaction taken, else the `after` it was given.
    pub resume_lsn: Lsn,
    /// The end LSN of the last transaction taken, if any.
    pub last_commit_end_lsn: Option<Lsn>,
    /// The fence this read stopped at (or would have).
    pub fence_lsn: Lsn,
    /// The read reached the fence (false after `max_changes`).
    pub complete: bool,
    /// Transactions taken.
    pub transactions: u64,
    /// Change rows produced (a key-changing update counts 2: delete + update).
    pub rows: u64,
    /// Transactions skipped because they were at or below `after`.
    pub skipped_transactions: u64,
    /// Per table: columns added mid-stream during this read.
    pub added_columns: BTreeMap<TableRef, Vec<String>>,
    /// Per table: columns that disappeared mid-stream (NULL in later rows).
    pub dropped_columns: BTreeMap<TableRef, Vec<String>>,
}

/// The CDC control plane for one connection, slot and publication.
pub struct PgCdc {
    r: Resolved,
    client: Arc<Client>,
    cfg: CdcConfig,
}

impl std::fmt::Debug for PgCdc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCdc")
            .field("spec", &self.r.spec)
            .field("config", &self.cfg)
            .finish()
    }
}

fn valid_name(s: &str, allow_upper: bool) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'_'
                || (allow_upper && b.is_ascii_uppercase())
        })
}

impl PgCdc {
    /// Connect and check the config (names, PostgreSQL 14+ for binary pgoutput, wal_level).
    pub async fn connect(spec: &ConnectionSpec, cfg: CdcConfig) -> Result<PgCdc> {
        let r = Resolved::new(spec)?;
        let config_error = |detail: String| SourceError::Config {
            connection: spec.name.clone(),
            detail,
        };
        if !valid_name(&cfg.slot, false) {
            return Err(config_error(format!(
                "replication slot name '{}' is not valid: use lowercase letters, digits and '_' (at most 63)",
                cfg.slot
            )));
        }
        if !valid_name(&cfg.publication, true) {
            return Err(config_error(format!(
                "publication name '{}' is not valid: use letters, digits and '_' (at most 63)",
                cfg.publication
            )));
        }
        if cfg.tables.is_empty() {
            return Err(config_error("a CDC source needs at least one table".into()));
        }
        let client = Arc::new(r.pg_connect().await?);
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, current_setting('wal_level')",
                &[],
            )
            .await
            .map_err(|e| r.query_error("server settings", pg_error_text(&e)))?;
        let version: i32 = row.get(0);
        let wal_level: String = row.get(1);
        if version < 140_000 {
            return Err(config_error(format!(
                "log-based CDC needs PostgreSQL 14 or newer (binary pgoutput); the server is {}",
                version
            )));
        }
        if wal_level != "logical" {
            return Err(config_error(format!(
                "the server has wal_level = {wal_level}; log-based CDC needs wal_level = logical \
                 (set it in postgresql.conf and restart the server)"
            )));
        }
        Ok(PgCdc {
            r,
            client,
            cfg: CdcConfig {
                batch_rows: cfg.batch_rows.max(1),
                ..cfg
            },
        })
    }

    /// The config.
    pub fn config(&self) -> &CdcConfig {
        &self.cfg
    }

    fn slot_error(&self, detail: impl Into<String>, resnapshot: bool) -> SourceError {
        SourceError::Slot {
            connection: self.r.name().to_string(),
            slot: self.cfg.slot.clone(),
            detail: detail.into(),
            resnapshot,
        }
    }

    fn q_err(&self, what: &str, e: tokio_postgres::Error) -> SourceError {
        self.r.query_error(what, pg_error_text(&e))
    }

    /// How the server identifies `table`'s rows in its change log: the replica identity
    /// (`'d'` default, `'f'` full, `'i'` index, `'n'` nothing) and the columns of the key
    /// it uses (the primary key, or the replica identity index; empty when there is none).
    /// An update that leaves a TOASTed value unchanged omits it unless the identity is full.
    pub async fn identity(&self, table: &TableRef) -> Result<(char, Vec<String>)> {
        let what = format!("the replica identity of table {table}");
        let row = self
            .client
            .query_one(
                "SELECT c.oid, c.relreplident::text FROM pg_catalog.pg_class c \
                 WHERE c.oid = $1::text::regclass",
                &[&table.pg_sql()],
            )
            .await
            .map_err(|e| self.q_err(&what, e))?;
        let oid: u32 = row.get(0);
        let identity: String = row.get(1);
        let identity = identity.chars().next().unwrap_or('d');
        let rows = self
            .client
            .query(
                "SELECT a.attname::text FROM pg_catalog.pg_index i \
                 JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 WHERE i.indrelid = $1 AND CASE WHEN $2::text = 'i' THEN i.indisreplident ELSE i.indisprimary END \
                 ORDER BY k.n",
                &[&oid, &identity.to_string()],
            )
            .await
            .map_err(|e| self.q_err(&what, e))?;
        Ok((identity, rows.iter().map(|r| r.get(0)).collect()))
    }

    /// The slot's state, or `None` if it does not exist.
    pub async fn slot_status(&self) -> Result<Option<SlotStatus>> {
        let rows = self
            .client
            .query(
                "SELECT s.plugin::text, d.datname::text, s.active, s.restart_lsn::text, s.confirmed_flush_lsn::text, \
                        s.wal_status, pg_current_wal_lsn()::text, \
                        COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint \
                   FROM pg_catalog.pg_replication_slots s LEFT JOIN pg_catalog.pg_database d ON d.oid = s.datoid \
                  WHERE s.slot_name = $1",
                &[&self.cfg.slot],
            )
            .await
            .map_err(|e| self.q_err(&format!("slot {}", self.cfg.slot), e))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let plugin: Option<String> = row.get(0);
        let db: Option<String> = row.get(1);
        if plugin.as_deref() != Some("pgoutput") {
            return Err(self.slot_error(
                format!(
                    "is not a pgoutput logical slot (plugin {plugin:?}); pick another slot name"
                ),
                false,
            ));
        }
        if db.as_deref() != Some(self.r.spec.database.as_str()) {
            return Err(self.slot_error(
                format!(
                    "belongs to database {db:?}, not '{}'; pick another slot name",
                    self.r.spec.database
                ),
                false,
            ));
        }
        let lsn = |i: usize| -> Option<Lsn> {
            row.get::<_, Option<String>>(i).and_then(|s| s.parse().ok())
        };
        Ok(Some(SlotStatus {
            slot: self.cfg.slot.clone(),
            confirmed_flush_lsn: lsn(4).unwrap_or_default(),
            restart_lsn: lsn(3),
            current_wal_lsn: lsn(6).unwrap_or_default(),
            lag_bytes: row.get::<_, i64>(7).max(0) as u64,
            active: row.get(2),
            wal_status: row.get(5),
        }))
    }

    /// The slot's state once no session streams from it: a replication connection that just
    /// ended (this process's previous read, or a crashed run's) releases the slot a moment
    /// later. Waits up to 10 s, then says another session holds it.
    async fn status_when_inactive(&self, recorded: Option<Lsn>) -> Result<SlotStatus> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = self
                .slot_status()
                .await?
                .ok_or_else(|| SourceError::SlotMissing {
                    connection: self.r.name().to_string(),
                    slot: self.cfg.slot.clone(),
                    recorded_lsn: recorded,
                })?;
            if !st.active {
                return Ok(st);
            }
            if std::time::Instant::now() > deadline {
                return Err(self.slot_error(
                    "is in use by another session (another strata run?); wait for it to finish",
                    false,
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Bytes of WAL between the slot's confirmed position and the server's current position.
    pub async fn slot_lag(&self) -> Result<u64> {
        match self.slot_status().await? {
            Some(s) => Ok(s.lag_bytes),
            None => Err(SourceError::SlotMissing {
                connection: self.r.name().to_string(),
                slot: self.cfg.slot.clone(),
                recorded_lsn: None,
            }),
        }
    }

    async fn publication_tables(&self) -> Result<Option<Vec<(String, String)>>> {
        let exists = self
            .client
            .query(
                "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1",
                &[&self.cfg.publication],
            )
            .await
            .map_err(|e| self.q_err(&format!("publication {}", self.cfg.publication), e))?;
        if exists.is_empty() {
            return Ok(None);
        }
        let rows = self
            .client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables WHERE pubname = $1",
                &[&self.cfg.publication],
            )
            .await
            .map_err(|e| self.q_err(&format!("publication {}", self.cfg.publication), e))?;
        Ok(Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    fn missing_tables(&self, members: &[(String, String)]) -> Vec<TableRef> {
        self.cfg
            .tables
            .iter()
            .filter(|t| !members.contains(&CdcConfig::table_key(&t.table)))
            .map(|t| t.table.clone())
            .collect()
    }

    fn qualified(t: &TableRef) -> String {
        let (s, n) = CdcConfig::table_key(t);
        format!("{}.{}", pg_ident(&s), pg_ident(&n))
    }

    /// Every table exists and can publish updates and deletes: a table without a replica
    /// identity in a publication makes UPDATE and DELETE fail on the source.
    async fn check_tables(&self) -> Result<()> {
        for t in &self.cfg.tables {
            let (schema, name) = CdcConfig::table_key(&t.table);
            let row = self
                .client
                .query_opt(
                    "SELECT c.relreplident::text, c.relkind::text,                             EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)                        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace                       WHERE n.nspname = $1 AND c.relname = $2",
                    &[&schema, &name],
                )
                .await
                .map_err(|e| self.q_err(&format!("table {}", t.table), e))?;
            let Some(row) = row else {
                return Err(self
                    .r
                    .query_error(format!("table {schema}.{name}"), "does not exist"));
            };
            let ident: String = row.get(0);
            let kind: String = row.get(1);
            let has_pk: bool = row.get(2);
            if kind != "r" && kind != "p" {
                return Err(self.r.query_error(
                    format!("table {schema}.{name}"),
                    "is not a table (views and materialized views cannot be published)",
                ));
            }
            if ident == "n" || (ident == "d" && !has_pk) {
                return Err(self.r.query_error(
                    format!("table {schema}.{name}"),
                    "has no replica identity (no primary key, or REPLICA IDENTITY NOTHING): in a publication,                      UPDATE and DELETE on it would fail on the source. Add a primary key, or run                      ALTER TABLE ... REPLICA IDENTITY FULL, then run again",
                ));
            }
        }
        Ok(())
    }

    async fn ensure_publication(&self) -> Result<()> {
        self.check_tables().await?;
        let what = format!("publication {}", self.cfg.publication);
        match self.publication_tables().await? {
            None if self.cfg.create_publication => {
                let list: Vec<String> = self.cfg.tables.iter().map(|t| Self::qualified(&t.table)).collect();
                self.client
                    .batch_execute(&format!(
                        "CREATE PUBLICATION {} FOR TABLE {}",
                        pg_ident(&self.cfg.publication),
                        list.join(", ")
                    ))
                    .await
                    .map_err(|e| self.q_err(&what, e))
            }
            None => Err(self.r.query_error(
                what,
                "does not exist; create it (CREATE PUBLICATION ... FOR TABLE ...) or let strata manage it",
            )),
            Some(members) => {
                let missing = self.missing_tables(&members);
                if missing.is_empty() {
                    return Ok(());
                }
                if !self.cfg.create_publication {
                    return Err(self.r.query_error(
                        what,
                        format!(
                            "does not contain {}; add them (ALTER PUBLICATION ... ADD TABLE ...)",
                            missing.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                let list: Vec<String> = missing.iter().map(Self::qualified).collect();
                self.client
                    .batch_execute(&format!(
                        "ALTER PUBLICATION {} ADD TABLE {}",
                        pg_ident(&self.cfg.publication),
                        list.join(", ")
                    ))
                    .await
                    .map_err(|e| self.q_err(&what, e))
            }
        }
    }

    /// First use: make sure the publication has the tables, create the slot exporting its
    /// snapshot, and read every table in that snapshot. The stream then starts exactly at
    /// [`SnapshotReader::consistent_point`]: no gap, no overlap.
    ///
    /// Record the consistent point with the Delta commit of the snapshot batches (it is the
    /// `after` of the first [`PgCdc::read_changes`]). A slot of the same name must not exist
    /// (a first run that crashed leaves one: [`PgCdc::drop_slot`] it, as a full refresh does).
    ///
    /// `keyed`: each table with a primary key of types strata orders as PostgreSQL does is
    /// read in key order, so that [`SnapshotReader::position`] says where to resume.
    pub async fn start_snapshot(&self, keyed: bool) -> Result<SnapshotReader> {
        if self.slot_status().await?.is_some() {
            return Err(self.slot_error(
                "already exists, so strata cannot take a fresh snapshot through it; if this is a first run \
                 or a full refresh, drop the slot (pg_drop_replication_slot, or a full refresh which drops it) \
                 and run again",
                false,
            ));
        }
        self.ensure_publication().await?;
        self.exported_snapshot(&self.cfg.slot, false, keyed, &CopyPosition::start())
            .await
    }

    /// Resumes a first copy that stopped at `from` (killed, or failed after some parts were
    /// committed), in a new snapshot exported by a temporary slot: the rows after `from`
    /// as of that snapshot, whose [`SnapshotReader::consistent_point`] is the temporary
    /// slot's. The slot of the copy must still exist: its changes are read from the first
    /// copy's consistent point on. A change committed before the new consistent point to a
    /// row the resumed copy holds is already in that row: the caller skips it.
    pub async fn resume_snapshot(&self, from: &CopyPosition) -> Result<SnapshotReader> {
        if self.slot_status().await?.is_none() {
            return Err(self.slot_error(
                "is gone, so the interrupted first copy cannot go on (the changes since it \
                 began are lost to strata); re-snapshot with a full refresh",
                true,
            ));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let temporary = format!("strata_resume_{}_{nanos}", std::process::id());
        self.exported_snapshot(&temporary, true, true, from).await
    }

    /// Creates `slot` (`temporary`: dropped when its connection ends) exporting its
    /// snapshot, and opens a reader of the tables from `from` on in that snapshot.
    async fn exported_snapshot(
        &self,
        slot: &str,
        temporary: bool,
        keyed: bool,
        from: &CopyPosition,
    ) -> Result<SnapshotReader> {
        let repl_cfg = self.r.replication_config(slot, &self.cfg.publication)?;
        let mut gated = ReplicationClient::connect_gated(repl_cfg)
            .await
            .map_err(|e| self.repl_error(None, e))?;
        let rows = gated
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {slot}{} LOGICAL pgoutput EXPORT_SNAPSHOT",
                if temporary { " TEMPORARY" } else { "" }
            ))
            .await
            .map_err(|e| self.repl_error(None, e))?;
        let field = |i: usize| -> Option<String> {
            rows.first()
                .and_then(|r| r.get(i).cloned().flatten())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        let (Some(cp), Some(snapshot)) = (field(1), field(2)) else {
            return Err(self.slot_error(
                "CREATE_REPLICATION_SLOT returned no consistent point / snapshot",
                false,
            ));
        };
        let out = self.read_exported(&snapshot, &cp, keyed, from).await;
        // The exporting session must stay open until the snapshot is imported; then end it
        // (a temporary slot goes with it). A slot of the copy that failed to start is
        // dropped: the next first run creates it again.
        drop(gated);
        if out.is_err() && !temporary {
            let _ = self.drop_slot().await;
        }
        out
    }

    /// A reader of the tables from `from` on in the exported `snapshot`, whose slot became
    /// consistent at `cp`.
    async fn read_exported(
        &self,
        snapshot: &str,
        cp: &str,
        keyed: bool,
        from: &CopyPosition,
    ) -> Result<SnapshotReader> {
        let consistent_point: Lsn = cp
            .parse()
            .map_err(|e| self.slot_error(format!("bad consistent point: {e}"), false))?;
        let mut tables = VecDeque::new();
        for (i, t) in self.cfg.tables.iter().enumerate().skip(from.table) {
            let order = match keyed {
                true => self.copy_order(&t.table).await?,
                false => None,
            };
            tables.push_back(CopyTable {
                index: i,
                table: t.clone(),
                order,
                after: from.after_in(i),
            });
        }
        self.import_snapshot(snapshot, consistent_point, tables)
            .await
    }

    /// The primary key of `table` as a copy in key order sorts it (text in byte order, as
    /// Arrow compares it), or `None` when it has none or one of its columns is of a type
    /// whose order strata does not reproduce (floats, enums, padded `char`, ...).
    async fn copy_order(&self, table: &TableRef) -> Result<Option<Vec<KeyColumn>>> {
        let rows = self
            .client
            .query(
                "SELECT a.attname::text, t.typname::text FROM pg_catalog.pg_index i \
                 JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
                 WHERE i.indrelid = $1::text::regclass AND i.indisprimary ORDER BY k.n",
                &[&table.pg_sql()],
            )
            .await
            .map_err(|e| self.q_err(&format!("the primary key of table {table}"), e))?;
        let mut key = Vec::new();
        for row in &rows {
            let (name, typ): (String, String) = (row.get(0), row.get(1));
            let bytewise = match typ.as_str() {
                "int2" | "int4" | "int8" | "numeric" | "date" | "timestamp" | "timestamptz"
                | "uuid" => false,
                "text" | "varchar" => true,
                _ => return Ok(None),
            };
            key.push(KeyColumn { name, bytewise });
        }
        Ok((!key.is_empty()).then_some(key))
    }

    async fn import_snapshot(
        &self,
        snapshot: &str,
        consistent_point: Lsn,
        tables: VecDeque<CopyTable>,
    ) -> Result<SnapshotReader> {
        let client = Arc::new(self.r.pg_connect().await?);
        if !snapshot.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(self.slot_error(format!("unexpected snapshot name {snapshot:?}"), false));
        }
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot}'"
            ))
            .await
            .map_err(|e| self.q_err("snapshot", e))?;
        let row = client
            .query_one("SELECT (extract(epoch FROM now()) * 1000000)::bigint", &[])
            .await
            .map_err(|e| self.q_err("snapshot", e))?;
        let position = tables.front().map(|t| CopyPosition {
            table: t.index,
            after: t.after.clone(),
        });
        Ok(SnapshotReader {
            r: self.r.clone(),
            client,
            tables,
            current: None,
            consistent_point,
            snapshot_micros: row.get(0),
            batch_rows: self.cfg.batch_rows,
            finished: false,
            position,
        })
    }

    fn repl_error(&self, lsn: Option<Lsn>, e: pgwire_replication::PgWireError) -> SourceError {
        let text = self.r.scrub(&e.to_string());
        if e.is_tls() {
            let lower = text.to_ascii_lowercase();
            if let Some(mut hint) = self.r.tls_failure_hint(&lower) {
                if self.r.tls.mode == TlsMode::VerifyCa && lower.contains("not valid for name") {
                    hint.push_str(
                        "; the replication connection checks the host name even in verify-ca \
                         (pgwire-replication 0.5 with rustls 0.23), so verify-ca works for CDC \
                         only by a name the certificate lists for now",
                    );
                }
                return self
                    .r
                    .tls_error(format!("replication connection: {text}"), hint);
            }
        }
        let hint = if text.contains("is active for PID") {
            "; another session (another strata run?) is reading this slot: wait for it to finish"
        } else if text.contains("does not exist") {
            "; re-snapshot with a full refresh"
        } else {
            ""
        };
        SourceError::Replication {
            connection: self.r.name().to_string(),
            slot: self.cfg.slot.clone(),
            lsn,
            detail: format!("{text}{hint}"),
        }
    }

    /// Writes a fence into the log now (a logical message, [`FENCE_PREFIX`]): a read stops
    /// once it has seen every transaction committed before it.
    async fn write_fence(&self) -> Result<Lsn> {
        let fence: String = self
            .client
            .query_one(
                "SELECT pg_logical_emit_message(false, $1, ''::text)::text",
                &[&FENCE_PREFIX],
            )
            .await
            .map_err(|e| self.q_err("fence", e))?
            .get(0);
        fence
            .parse()
            .map_err(|e| self.slot_error(format!("bad fence LSN: {e}"), false))
    }

    /// Read every change committed before a fence written now, after `after` (the LSN the
    /// engine recorded: the consistent point after the snapshot, then each run's
    /// [`ChangeSummary::resume_lsn`]). Transactions at or below `after` are skipped. The slot
    /// is not moved: call [`PgCdc::advance_slot`] after the Delta commit.
    pub async fn read_changes(&self, after: Lsn, options: ReadOptions) -> Result<ChangeReader> {
        let status = self.status_when_inactive(Some(after)).await?;
        if status.wal_status.as_deref() == Some("lost") {
            return Err(self.slot_error(
                "was invalidated: the server removed WAL it still needed (max_slot_wal_keep_size); the \
                 changes since are lost to strata. Re-snapshot: run a full refresh",
                true,
            ));
        }
        if status.confirmed_flush_lsn > after {
            return Err(self.slot_error(
                format!(
                    "was advanced to {} beyond the LSN strata recorded ({after}); the changes in between were \
                     consumed elsewhere and are lost to strata. Re-snapshot: run a full refresh (and let only \
                     strata advance this slot)",
                    status.confirmed_flush_lsn
                ),
                true,
            ));
        }
        match self.publication_tables().await? {
            None => {
                return Err(self.r.query_error(
                    format!("publication {}", self.cfg.publication),
                    "does not exist (dropped?); re-snapshot with a full refresh",
                ))
            }
            Some(members) => {
                let missing = self.missing_tables(&members);
                if !missing.is_empty() {
                    return Err(self.r.query_error(
                        format!("publication {}", self.cfg.publication),
                        format!(
                            "does not contain {}; a table added after the initial snapshot needs one: run a full refresh",
                            missing.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
        }
        let fence = self.write_fence().await?;
        let start = if after == Lsn::ZERO {
            status.confirmed_flush_lsn
        } else {
            after
        };
        let repl_cfg = self
            .r
            .replication_config(&self.cfg.slot, &self.cfg.publication)?
            .with_start_lsn(start.into())
            // Report only what the slot already confirmed: the protocol never moves the slot.
            .with_ack_lsn(status.confirmed_flush_lsn.into())
            .with_stop_lsn(fence.into())
            .with_binary(true)
            .with_buffer_size(1024);
        let mut repl = ReplicationClient::connect(repl_cfg)
            .await
            .map_err(|e| self.repl_error(Some(start), e))?;
        repl.wait_started()
            .await
            .map_err(|e| self.repl_error(Some(start), e))?;
        let wanted = self
            .cfg
            .tables
            .iter()
            .map(|t| (CdcConfig::table_key(&t.table), t.clone()))
            .collect();
        Ok(ChangeReader {
            r: self.r.clone(),
            slot: self.cfg.slot.clone(),
            client: self.client.clone(),
            repl: Some(repl),
            options,
            batch_rows: self.cfg.batch_rows,
            after,
            fence,
            wanted,
            relations: HashMap::new(),
            types: HashMap::new(),
            buffers: BTreeMap::new(),
            key_changes: BTreeMap::new(),
            ready: VecDeque::new(),
            txn: None,
            summary: ChangeSummary {
                resume_lsn: after,
                last_commit_end_lsn: None,
                fence_lsn: fence,
                complete: false,
                transactions: 0,
                rows: 0,
                skipped_transactions: 0,
                added_columns: BTreeMap::new(),
                dropped_columns: BTreeMap::new(),
            },
            stopping: false,
            done: false,
            last_lsn: start,
            part_rows: 0,
            part_end: None,
        })
    }

    /// After the Delta commit that recorded `to`: move the slot's confirmed position there,
    /// so the server can drop WAL before it. Clamped: an LSN at or below the slot's position
    /// is a no-op (PostgreSQL refuses to go backwards). Returns the slot's position after.
    /// With several tables fed by one slot, advance to the smallest LSN recorded among them.
    pub async fn advance_slot(&self, to: Lsn) -> Result<Lsn> {
        let status = self.status_when_inactive(Some(to)).await?;
        if to <= status.confirmed_flush_lsn {
            return Ok(status.confirmed_flush_lsn);
        }
        let row = self
            .client
            .query_one(
                "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2)",
                &[
                    &TextParam(self.cfg.slot.clone()) as &(dyn ToSql + Sync),
                    &TextParam(to.to_string()),
                ],
            )
            .await
            .map_err(|e| {
                self.slot_error(
                    format!("cannot advance to {to}: {}", pg_error_text(&e)),
                    false,
                )
            })?;
        let end: Option<String> = row.get(0);
        Ok(end.and_then(|s| s.parse().ok()).unwrap_or(to))
    }

    /// Drop the slot (full refresh, or giving the source up): the server stops retaining WAL
    /// for it. Returns whether it existed.
    pub async fn drop_slot(&self) -> Result<bool> {
        match self.status_when_inactive(None).await {
            Err(SourceError::SlotMissing { .. }) => return Ok(false),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let rows = self
            .client
            .query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                &[&self.cfg.slot],
            )
            .await
            .map_err(|e| self.slot_error(format!("cannot drop it: {}", pg_error_text(&e)), false))?;
        Ok(!rows.is_empty())
    }

    /// Drop the publication if strata manages it (`create_publication`). Returns whether it
    /// was dropped.
    pub async fn drop_publication(&self) -> Result<bool> {
        if !self.cfg.create_publication {
            return Ok(false);
        }
        self.client
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {}",
                pg_ident(&self.cfg.publication)
            ))
            .await
            .map_err(|e| self.q_err(&format!("publication {}", self.cfg.publication), e))?;
        Ok(true)
    }
}

/// A primary key column as a copy in key order sorts it: text `bytewise` (`COLLATE "C"`,
/// the order of its UTF-8 bytes), other types in their own order.
#[derive(Clone, Debug)]
struct KeyColumn {
    name: String,
    bytewise: bool,
}

/// A table a snapshot reader copies: its index among the config's tables, its key order
/// (`None`: read as it lies, resumable only at its start) and the key to start after.
#[derive(Clone, Debug)]
struct CopyTable {
    index: usize,
    table: CdcTable,
    order: Option<Vec<KeyColumn>>,
    after: Option<crate::value::Watermark>,
}

/// The table being read: its reference, description, Arrow schema, row reader, whether it
/// gave a row yet, and whether its rows come in key order.
struct OpenTable {
    index: usize,
    table: TableRef,
    schema: SourceSchema,
    arrow: SchemaRef,
    reader: PgRowReader,
    any: bool,
    keyed: bool,
}

/// The initial snapshot: every table's rows as of the slot's consistent point, as change rows
/// with `_change_type = 'snapshot'`, `_commit_lsn` = the consistent point, `_change_seq` = 0.
pub struct SnapshotReader {
    r: Resolved,
    client: Arc<Client>,
    tables: VecDeque<CopyTable>,
    current: Option<OpenTable>,
    consistent_point: Lsn,
    snapshot_micros: i64,
    batch_rows: usize,
    finished: bool,
    /// Where the rows returned so far end (`None`: inside a table read as it lies).
    position: Option<CopyPosition>,
}

impl std::fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("connection", &self.r.spec.name)
            .field("consistent_point", &self.consistent_point)
            .finish()
    }
}

impl SnapshotReader {
    /// The slot's consistent point: record it with the snapshot's Delta commit; the first
    /// change read starts after it.
    pub fn consistent_point(&self) -> Lsn {
        self.consistent_point
    }

    /// Where the rows returned so far end, to resume from: `None` inside a table read as it
    /// lies (without a primary key strata can order by), and after the last table.
    pub fn position(&self) -> Option<CopyPosition> {
        self.position.clone()
    }

    /// The next batch, table by table (a table without rows gives one empty batch, so its
    /// schema is known); `None` when all tables were read (the snapshot transaction is then
    /// closed).
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        loop {
            if self.finished {
                return Ok(None);
            }
            if self.current.is_none() {
                let Some(t) = self.tables.pop_front() else {
                    self.finished = true;
                    self.position = None;
                    let _ = self.client.batch_execute("COMMIT").await;
                    return Ok(None);
                };
                let open = self.open_table(t).await?;
                if !open.keyed {
                    self.position = None;
                }
                self.current = Some(open);
            }
            let Some(open) = self.current.as_mut() else {
                continue;
            };
            match open.reader.next_batch(&open.arrow, &open.schema).await? {
                Some((batch, last_key)) => {
                    open.any = true;
                    if open.keyed {
                        self.position = Some(CopyPosition {
                            table: open.index,
                            after: last_key,
                        });
                    }
                    return Ok(Some(TableBatch {
                        table: open.table.clone(),
                        batch,
                        added_columns: vec![],
                        key_changes: vec![],
                    }));
                }
                None => {
                    let empty = !open.any;
                    let out = TableBatch {
                        table: open.table.clone(),
                        batch: RecordBatch::new_empty(open.arrow.clone()),
                        added_columns: vec![],
                        key_changes: vec![],
                    };
                    self.position = Some(CopyPosition {
                        table: open.index + 1,
                        after: None,
                    });
                    self.current = None;
                    if empty {
                        return Ok(Some(out));
                    }
                }
            }
        }
    }

    async fn open_table(&self, t: CopyTable) -> Result<OpenTable> {
        let (s, n) = CdcConfig::table_key(&t.table.table);
        let table = TableRef::new(s, n);
        let object = SourceObject::Table(table.clone());
        let (schema, decoders, all) =
            describe(&*self.client, &self.r, &object, &t.table.exclude_columns).await?;
        crate::read::check_columns(
            &self.r,
            &object,
            &all,
            &schema,
            &[],
            &t.table.exclude_columns,
        )?;
        let cols: Vec<String> = schema.columns.iter().map(|c| pg_ident(&c.name)).collect();
        // Key order needs every key column among the columns read.
        let key_idx: Option<Vec<usize>> = t.order.as_ref().and_then(|key| {
            key.iter()
                .map(|k| schema.columns.iter().position(|c| c.name == k.name))
                .collect()
        });
        let order = t.order.as_ref().filter(|_| key_idx.is_some());
        let sql = format!(
            "SELECT {} FROM {}{}",
            if cols.is_empty() {
                "1".to_string()
            } else {
                cols.join(", ")
            },
            table.pg_sql(),
            order.map_or(String::new(), |key| key_order_clause(key, t.after.as_ref()))
        );
        let mut reader = PgRowReader::start_copy(
            self.client.clone(),
            &self.r,
            &object,
            decoders,
            self.batch_rows,
            &sql,
        )
        .await?
        .with_meta(SnapshotMeta {
            commit_lsn: self.consistent_point.to_i64(),
            commit_ts: self.snapshot_micros,
        });
        if let (Some(key), Some(idx)) = (order, key_idx) {
            reader = reader.tracking(idx, key.iter().map(|k| k.name.clone()).collect());
        }
        let mut fields: Vec<arrow_schema::Field> = schema
            .arrow_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.extend(change_meta_fields());
        Ok(OpenTable {
            index: t.index,
            table,
            schema,
            arrow: Arc::new(Schema::new(fields)),
            reader,
            any: false,
            keyed: order.is_some(),
        })
    }
}

/// ` WHERE (key) > (after) ORDER BY key` for a copy in key order, text compared bytewise.
fn key_order_clause(key: &[KeyColumn], after: Option<&crate::value::Watermark>) -> String {
    let cols: Vec<String> = key
        .iter()
        .map(|k| match k.bytewise {
            true => format!("{} COLLATE \"C\"", pg_ident(&k.name)),
            false => pg_ident(&k.name),
        })
        .collect();
    let cond = match after {
        Some(w) if !w.values.is_empty() => {
            let values: Vec<String> = w.values.iter().map(super::read::value_literal).collect();
            format!(" WHERE ({}) > ({})", cols.join(", "), values.join(", "))
        }
        _ => String::new(),
    };
    format!("{cond} ORDER BY {}", cols.join(", "))
}

/// A table's relation as the stream last described it.
struct RelState {
    /// `None`: not one of the config's tables (ignored).
    table: Option<TableRef>,
    /// Per relation column: where it goes in the table's buffer, and how to decode it
    /// (`None`: excluded).
    cols: Vec<Option<(usize, PgDecode)>>,
    names: Vec<String>,
    /// Relation column indexes of the primary key (for REPLICA IDENTITY FULL updates), or of
    /// the replica identity.
    key: Vec<usize>,
}

struct Txn {
    commit_lsn: Lsn,
    commit_micros: i64,
    seq: i64,
    skip: bool,
}

/// A running change read. Batches come per table as they fill (`batch_rows`) and at the end;
/// memory stays bounded by the batch size per table.
pub struct ChangeReader {
    r: Resolved,
    slot: String,
    client: Arc<Client>,
    repl: Option<ReplicationClient>,
    options: ReadOptions,
    batch_rows: usize,
    after: Lsn,
    fence: Lsn,
    wanted: HashMap<(String, String), CdcTable>,
    relations: HashMap<u32, RelState>,
    types: HashMap<(u32, i32), std::result::Result<PgMapped, (String, String)>>,
    buffers: BTreeMap<TableRef, (ChangeBuffer, Vec<String>)>,
    /// Per table, the buffered updates that changed their row's key (`TableBatch::key_changes`).
    key_changes: BTreeMap<TableRef, Vec<(i64, i64)>>,
    ready: VecDeque<TableBatch>,
    txn: Option<Txn>,
    summary: ChangeSummary,
    stopping: bool,
    done: bool,
    last_lsn: Lsn,
    /// Change rows taken since the last part ended.
    part_rows: u64,
    /// A part ended at this LSN (the end of its last transaction) and was not taken on.
    part_end: Option<Lsn>,
}

/// A type being resolved (boxed: resolving an array or composite resolves its parts).
type Resolving<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::result::Result<PgMapped, (String, String)>>
            + Send
            + 'a,
    >,
>;

impl std::fmt::Debug for ChangeReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeReader")
            .field("connection", &self.r.spec.name)
            .field("slot", &self.slot)
            .field("after", &self.after)
            .field("fence", &self.fence)
            .field("summary", &self.summary)
            .finish()
    }
}

impl ChangeReader {
    /// The fence this read stops at.
    pub fn fence_lsn(&self) -> Lsn {
        self.fence
    }

    /// What the read took; `Some` once [`ChangeReader::next_batch`] returned `None`.
    pub fn summary(&self) -> Option<&ChangeSummary> {
        self.done.then_some(&self.summary)
    }

    fn err(&self, detail: impl Into<String>) -> SourceError {
        SourceError::Replication {
            connection: self.r.name().to_string(),
            slot: self.slot.clone(),
            lsn: Some(self.last_lsn),
            detail: detail.into(),
        }
    }

    /// Where the part just read ends (the end LSN of its last transaction), when
    /// [`ChangeReader::next_batch`] returned `None` at the end of a part rather than of the
    /// read ([`ReadOptions::part_changes`]). Commit the part with this position, then call
    /// [`ChangeReader::next_part`].
    pub fn part_end(&self) -> Option<Lsn> {
        self.part_end.filter(|_| self.ready.is_empty())
    }

    /// Goes on to the next part once the one ending at [`ChangeReader::part_end`] is
    /// committed: the server is told it may drop the WAL before that point (the slot's
    /// confirmed position moves with the stream's next status update).
    pub fn next_part(&mut self) {
        if let Some(end) = self.part_end.take() {
            if let Some(repl) = &self.repl {
                repl.update_applied_lsn(end.into());
            }
        }
        self.part_rows = 0;
    }

    /// The next batch of one table's changes, or `None` at the end of a part
    /// ([`ChangeReader::part_end`]) or of the read (then see [`ChangeReader::summary`]).
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Ok(Some(b));
            }
            if self.done || self.part_end.is_some() {
                return Ok(None);
            }
            let Some(repl) = self.repl.as_mut() else {
                self.finish_read()?;
                continue;
            };
            let ev = match tokio::time::timeout(self.options.idle_timeout, repl.recv()).await {
                Err(_) => {
                    return Err(self.err(format!(
                        "the server sent nothing for {} s; check the server and run again",
                        self.options.idle_timeout.as_secs()
                    )))
                }
                Ok(Err(e)) => {
                    let text = self.r.scrub(&e.to_string());
                    return Err(self.err(format!("the replication stream failed: {text}")));
                }
                Ok(Ok(ev)) => ev,
            };
            match ev {
                None => {
                    self.repl = None;
                    if !self.summary.complete && !self.stopping {
                        return Err(self.err(format!(
                            "the stream ended before the fence {} was reached; run again",
                            self.fence
                        )));
                    }
                    self.wait_released().await;
                }
                Some(ev) => self.handle(ev).await?,
            }
        }
    }

    /// The server releases the slot a moment after the replication connection closed; wait
    /// for that (up to 10 s) so that the engine's next step (a Delta commit, then
    /// `advance_slot`) finds it free.
    async fn wait_released(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let active = self
                .client
                .query_opt(
                    "SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                    &[&self.slot],
                )
                .await;
            match active {
                Ok(Some(row)) if row.get::<_, bool>(0) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => return,
            }
        }
    }

    /// Every table's buffered rows into `ready`.
    fn flush_all(&mut self) -> Result<()> {
        let tables: Vec<TableRef> = self.buffers.keys().cloned().collect();
        for t in tables {
            self.flush(&t)?;
        }
        Ok(())
    }

    fn finish_read(&mut self) -> Result<()> {
        self.flush_all()?;
        self.summary.resume_lsn = if self.summary.complete {
            self.fence.max(self.after)
        } else {
            self.summary
                .last_commit_end_lsn
                .unwrap_or(self.after)
                .max(self.after)
        };
        self.done = true;
        Ok(())
    }

    fn flush(&mut self, t: &TableRef) -> Result<()> {
        if let Some((buf, added)) = self.buffers.get_mut(t) {
            if buf.rows == 0 {
                return Ok(());
            }
            let batch = buf.finish().map_err(|source| SourceError::Arrow {
                object: t.to_string(),
                source,
            })?;
            self.ready.push_back(TableBatch {
                table: t.clone(),
                batch,
                added_columns: std::mem::take(added),
                key_changes: self.key_changes.remove(t).unwrap_or_default(),
            });
        }
        Ok(())
    }

    async fn handle(&mut self, ev: ReplicationEvent) -> Result<()> {
        if self.stopping {
            // Stopped after max_changes: what still arrives belongs to the next run.
            return Ok(());
        }
        match ev {
            ReplicationEvent::KeepAlive { .. } => {}
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                let commit_lsn = Lsn::from(final_lsn);
                self.last_lsn = commit_lsn;
                if self.txn.is_some() {
                    return Err(self.err("a transaction began inside another (protocol error)"));
                }
                // A transaction whose commit record starts below `after` ended at or before it.
                let skip = commit_lsn < self.after;
                self.txn = Some(Txn {
                    commit_lsn,
                    commit_micros: commit_time_micros.saturating_add(PG_EPOCH_MICROS),
                    seq: 0,
                    skip,
                });
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                let Some(txn) = self.txn.take() else {
                    return Err(self.err("a commit without a transaction (protocol error)"));
                };
                let end = Lsn::from(end_lsn);
                self.last_lsn = end;
                if txn.skip {
                    self.summary.skipped_transactions += 1;
                } else {
                    self.summary.transactions += 1;
                    self.summary.last_commit_end_lsn = Some(end);
                    if self
                        .options
                        .part_changes
                        .is_some_and(|n| self.part_rows >= n)
                    {
                        self.flush_all()?;
                        self.part_end = Some(end);
                    }
                    if let Some(max) = self.options.max_changes {
                        if self.summary.rows >= max {
                            self.stopping = true;
                            if let Some(repl) = &self.repl {
                                repl.stop();
                            }
                        }
                    }
                }
            }
            ReplicationEvent::Message { prefix, lsn, .. } => {
                if prefix == FENCE_PREFIX && Lsn::from(lsn) >= self.fence {
                    self.summary.complete = true;
                }
            }
            ReplicationEvent::StoppedAt { reached } => {
                if Lsn::from(reached) >= self.fence && self.txn.is_none() {
                    self.summary.complete = true;
                }
            }
            ReplicationEvent::XLogData { data, .. } => {
                let msg = pgoutput::decode(&data)
                    .map_err(|e| self.err(format!("cannot decode pgoutput: {e}")))?;
                self.message(msg).await?;
            }
        }
        Ok(())
    }

    /// The mapping of a column type the stream names by OID: built in, else looked up in
    /// the catalog (enums, domains, arrays of them, composite types), and remembered.
    fn resolve_type(&mut self, oid: u32, typmod: i32) -> Resolving<'_> {
        Box::pin(self.resolve_type_now(oid, typmod))
    }

    async fn resolve_type_now(
        &mut self,
        oid: u32,
        typmod: i32,
    ) -> std::result::Result<PgMapped, (String, String)> {
        if let Some(m) = map_builtin(oid, typmod) {
            return m;
        }
        if let Some(m) = self.types.get(&(oid, typmod)) {
            return m.clone();
        }
        let mut cur = (oid, typmod);
        let mut out = Err((format!("type {oid}"), "unknown type".to_string()));
        for _ in 0..8 {
            if let Some(m) = map_builtin(cur.0, cur.1) {
                out = m;
                break;
            }
            let row = self
                .client
                .query_opt(
                    "SELECT typtype::text, typbasetype, typtypmod, format_type(oid, NULL), \
                            typelem, typlen, typrelid \
                     FROM pg_catalog.pg_type WHERE oid = $1",
                    &[&cur.0],
                )
                .await;
            let Ok(Some(row)) = row else {
                break;
            };
            let typtype: String = row.get(0);
            let name: String = row.get(3);
            let element: u32 = row.get(4);
            let len: i16 = row.get(5);
            let relation: u32 = row.get(6);
            match typtype.as_str() {
                "b" if element != 0 && len == -1 => {
                    out = self
                        .resolve_type(element, cur.1)
                        .await
                        .map(super::types::array_of);
                    break;
                }
                "c" => {
                    out = self.composite(&name, relation).await;
                    break;
                }
                "e" => {
                    out = Ok(PgMapped {
                        decode: PgDecode::Text,
                        kind: ColumnKind::Utf8,
                        type_name: name,
                    });
                    break;
                }
                "d" => {
                    let base: u32 = row.get(1);
                    let base_mod: i32 = row.get(2);
                    cur = (base, if cur.1 >= 0 { cur.1 } else { base_mod });
                }
                _ => {
                    out = Err((name, "no Delta mapping for this type".into()));
                    break;
                }
            }
        }
        self.types.insert((oid, typmod), out.clone());
        out
    }

    /// A composite type's mapping: its attributes (of the type's relation) in order.
    async fn composite(
        &mut self,
        name: &str,
        relation: u32,
    ) -> std::result::Result<PgMapped, (String, String)> {
        let rows = self
            .client
            .query(
                "SELECT attname::text, atttypid, atttypmod FROM pg_catalog.pg_attribute \
                 WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&relation],
            )
            .await
            .map_err(|e| (name.to_string(), format!("reading its fields: {e}")))?;
        let mut fields = Vec::with_capacity(rows.len());
        for row in rows {
            let field: String = row.get(0);
            let mapped = self.resolve_type(row.get(1), row.get(2)).await?;
            fields.push((field, mapped));
        }
        super::types::composite_of(name, fields)
    }

    async fn relation(&mut self, rel: Relation) -> Result<()> {
        let key = (rel.namespace.clone(), rel.name.clone());
        let Some(cfg) = self.wanted.get(&key).cloned() else {
            self.relations.insert(
                rel.oid,
                RelState {
                    table: None,
                    cols: vec![],
                    names: vec![],
                    key: vec![],
                },
            );
            return Ok(());
        };
        let table = TableRef::new(rel.namespace.clone(), rel.name.clone());
        let mut mapped = Vec::with_capacity(rel.columns.len());
        for c in &rel.columns {
            if cfg.exclude_columns.contains(&c.name) {
                mapped.push(None);
                continue;
            }
            let m = self
                .resolve_type(c.type_oid, c.typmod)
                .await
                .map_err(|(type_name, why)| SourceError::UnsupportedType {
                    connection: self.r.name().to_string(),
                    object: format!("table {table}"),
                    column: c.name.clone(),
                    type_name,
                    why,
                })?;
            mapped.push(Some(m));
        }
        let batch_rows = self.batch_rows;
        let (buf, added_pending) = self.buffers.entry(table.clone()).or_insert_with(|| {
            let cols: Vec<(String, ColumnKind)> = rel
                .columns
                .iter()
                .zip(&mapped)
                .filter_map(|(c, m)| m.as_ref().map(|m| (c.name.clone(), m.kind.clone())))
                .collect();
            (ChangeBuffer::new(&cols, batch_rows), vec![])
        });
        let mut cols = Vec::with_capacity(rel.columns.len());
        let mut added = vec![];
        for (c, m) in rel.columns.iter().zip(&mapped) {
            let Some(m) = m else {
                cols.push(None);
                continue;
            };
            let idx = match buf.position(&c.name) {
                Some(i) => {
                    if buf.columns[i].1 != m.kind {
                        return Err(SourceError::Replication {
                            connection: self.r.name().to_string(),
                            slot: self.slot.clone(),
                            lsn: Some(self.last_lsn),
                            detail: format!(
                                "table {table}: column '{}' changed type mid-stream (now {}); strata cannot \
                                 convert the rows already written: run a full refresh",
                                c.name, m.type_name
                            ),
                        });
                    }
                    i
                }
                None => {
                    added.push(c.name.clone());
                    buf.add_column(&c.name, m.kind.clone())
                }
            };
            cols.push(Some((idx, m.decode.clone())));
        }
        let present: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        let dropped: Vec<String> = buf
            .columns
            .iter()
            .map(|(n, ..)| n.clone())
            .filter(|n| !present.contains(&n.as_str()))
            .collect();
        added_pending.extend(added.iter().cloned());
        if !added.is_empty() {
            self.summary
                .added_columns
                .entry(table.clone())
                .or_default()
                .extend(added);
        }
        for d in dropped {
            let e = self
                .summary
                .dropped_columns
                .entry(table.clone())
                .or_default();
            if !e.contains(&d) {
                e.push(d);
            }
        }
        // The key used to tell a key-changing update: the primary key with REPLICA IDENTITY
        // FULL (where every column is flagged), else the replica identity columns.
        let key = if rel.replica_identity == b'f' {
            let rows = self
                .client
                .query(
                    "SELECT a.attname::text FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a \
                       ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                      WHERE i.indrelid = $1 AND i.indisprimary",
                    &[&rel.oid],
                )
                .await
                .map_err(|e| self.r.query_error(format!("table {table}"), pg_error_text(&e)))?;
            let pk: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            rel.columns
                .iter()
                .enumerate()
                .filter(|(_, c)| pk.contains(&c.name))
                .map(|(i, _)| i)
                .collect()
        } else {
            rel.columns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.key)
                .map(|(i, _)| i)
                .collect()
        };
        self.relations.insert(
            rel.oid,
            RelState {
                table: Some(table),
                cols,
                names: rel.columns.iter().map(|c| c.name.clone()).collect(),
                key,
            },
        );
        Ok(())
    }

    async fn message(&mut self, msg: Message<'_>) -> Result<()> {
        if let Message::Relation(rel) = msg {
            return self.relation(rel).await;
        }
        let (commit_lsn, commit_micros, skip) = match &self.txn {
            Some(t) => (t.commit_lsn, t.commit_micros, t.skip),
            None => match msg {
                Message::Insert { .. }
                | Message::Update { .. }
                | Message::Delete { .. }
                | Message::Truncate { .. } => {
                    return Err(self.err("a change outside a transaction (protocol error)"))
                }
                _ => return Ok(()),
            },
        };
        if skip {
            return Ok(());
        }
        match msg {
            Message::Insert { rel, new } => {
                self.row(rel, meta::INSERT, &new, None, commit_lsn, commit_micros)?;
            }
            Message::Update { rel, old, new } => {
                let key_changed = match (&old, self.relations.get(&rel)) {
                    (Some((_, old_vals)), Some(state)) => {
                        state
                            .key
                            .iter()
                            .any(|&i| match (old_vals.get(i), new.get(i)) {
                                (Some(a), Some(b)) => !matches!(b, TupleValue::Unchanged) && a != b,
                                _ => false,
                            })
                    }
                    _ => false,
                };
                if key_changed {
                    if let Some((_, old_vals)) = &old {
                        self.row(rel, meta::DELETE, old_vals, None, commit_lsn, commit_micros)?;
                    }
                }
                let full_old = old
                    .as_ref()
                    .filter(|(k, _)| *k == b'O')
                    .map(|(_, v)| v.as_slice());
                if key_changed {
                    // Before the row: appending it may flush the buffer.
                    self.note_key_change(rel, commit_lsn);
                }
                self.row(rel, meta::UPDATE, &new, full_old, commit_lsn, commit_micros)?;
            }
            Message::Delete { rel, old, .. } => {
                self.row(rel, meta::DELETE, &old, None, commit_lsn, commit_micros)?;
            }
            Message::Truncate { rels } => {
                for rel in rels {
                    self.row(rel, meta::TRUNCATE, &[], None, commit_lsn, commit_micros)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Records that the update about to be appended for `rel` (the transaction's next change)
    /// changes its row's key.
    fn note_key_change(&mut self, rel: u32, commit_lsn: Lsn) {
        let (Some(txn), Some(table)) = (
            self.txn.as_ref(),
            self.relations.get(&rel).and_then(|s| s.table.clone()),
        ) else {
            return;
        };
        self.key_changes
            .entry(table)
            .or_default()
            .push((commit_lsn.to_i64(), txn.seq));
    }

    /// Append one change row. `fill` is the old row (REPLICA IDENTITY FULL) that supplies
    /// unchanged TOASTed values.
    fn row(
        &mut self,
        rel: u32,
        change_type: &str,
        values: &[TupleValue<'_>],
        fill: Option<&[TupleValue<'_>]>,
        commit_lsn: Lsn,
        commit_micros: i64,
    ) -> Result<()> {
        let seq = match self.txn.as_mut() {
            Some(t) => {
                let s = t.seq;
                t.seq += 1;
                s
            }
            None => 0,
        };
        let Some(state) = self.relations.get(&rel) else {
            return Err(self.err(format!(
                "a change for relation {rel} before its Relation message (protocol error)"
            )));
        };
        let Some(table) = state.table.clone() else {
            return Ok(());
        };
        if !values.is_empty() && values.len() != state.cols.len() {
            return Err(self.err(format!(
                "table {table}: a row with {} columns for a relation of {} (protocol error)",
                values.len(),
                state.cols.len()
            )));
        }
        let Some((buf, _)) = self.buffers.get_mut(&table) else {
            return Err(self.err(format!("table {table}: no buffer (internal error)")));
        };
        let mut unchanged = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let Some((idx, decode)) = &state.cols[i] else {
                continue;
            };
            let mut v = *v;
            if v == TupleValue::Unchanged {
                if let Some(old) = fill.and_then(|f| f.get(i)) {
                    if !matches!(old, TupleValue::Unchanged) {
                        v = *old;
                    }
                }
            }
            let builder = &mut buf.columns[*idx].2;
            let res = match v {
                TupleValue::Null => {
                    builder.append_null();
                    Ok(())
                }
                TupleValue::Unchanged => {
                    builder.append_null();
                    unchanged.push(state.names[i].clone());
                    Ok(())
                }
                TupleValue::Binary(raw) => append_binary(builder, decode, Some(raw)),
                TupleValue::Text(_) => {
                    Err("the server sent a text value where binary was requested".to_string())
                }
            };
            if let Err(detail) = res {
                return Err(SourceError::Value {
                    connection: self.r.name().to_string(),
                    object: format!("table {table}"),
                    column: state.names[i].clone(),
                    detail: format!("{detail} (transaction committed at LSN {commit_lsn})"),
                });
            }
        }
        buf.end_row(
            change_type,
            commit_lsn.to_i64(),
            seq,
            Some(commit_micros),
            &unchanged,
        );
        self.summary.rows += 1;
        self.part_rows += 1;
        if buf.rows >= self.batch_rows {
            self.flush(&table)?;
        }
        Ok(())
    }
}
