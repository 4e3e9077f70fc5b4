//! Database sources for strata: what feeds streaming tables from PostgreSQL and MySQL, as
//! Arrow record batches, and the PostgreSQL tables sinks write. It does not parse pipelines
//! or write Delta.
//!
//! # Tour
//!
//! **Connections.** A [`ConnectionSpec`] names a connection (`name`, [`SourceKind`], host,
//! port, database, user, options) without needing its password: the engine passes a
//! [`Secret`] it read from an environment variable, or the password comes from `PGPASSWORD` /
//! `~/.pgpass` (PostgreSQL) or `MYSQL_PWD` / `~/.my.cnf` (MySQL); see [`conn`]. Secrets print as
//! `***`, and errors never contain them. TLS (rustls) follows libpq's `sslmode` and
//! `sslrootcert` (MySQL: `ssl_mode`, `ssl_ca`), on every connection, replication ones too.
//!
//! **Watermark reads** (PostgreSQL, MySQL, MariaDB). [`Source::connect`], then
//! [`Source::describe`] a table or query (its Arrow schema, see the type mapping in the
//! README), and [`Source::read_watermark`] the rows above a [`LowerBound`] (exclusive, or
//! inclusive for an overlap window: [`Watermark::overlap`]) in watermark order, as batches of
//! at most `batch_rows` rows ([`WatermarkReader::next_batch`]). The last row's watermark
//! ([`WatermarkReader::max_watermark`]) is stored by the engine as JSON ([`Watermark::to_json`])
//! and given back next run ([`Watermark::from_json`], [`LowerBound::after`]).
//!
//! ```no_run
//! # async fn f() -> strata_sources::Result<()> {
//! use strata_sources::*;
//! let spec = ConnectionSpec::new("shop", SourceKind::Postgres, "db.local", "shop", "reader");
//! let src = Source::connect(&spec).await?;
//! let stored: Option<String> = None; // the JSON the engine kept from the last run
//! let bound = stored.map(|j| Watermark::from_json(&j)).transpose()?.map(LowerBound::after);
//! let read = WatermarkRead::new(SourceObject::table("public.orders")?, vec!["updated_at".into(), "id".into()])
//!     .lower_bound(bound);
//! let mut reader = src.read_watermark(&read).await?;
//! while let Some(batch) = reader.next_batch().await? {
//!     // write `batch` out
//! #   let _ = batch;
//! }
//! let to_store = reader.max_watermark().map(Watermark::to_json); // commit it with the data
//! # let _ = to_store; Ok(()) }
//! ```
//!
//! **PostgreSQL log-based CDC** ([`PgCdc`]). A publication and a logical replication slot
//! (pgoutput); [`PgCdc::start_snapshot`] creates the slot exporting its snapshot and reads
//! every table in it ([`SnapshotReader`]); [`PgCdc::read_changes`] reads every change
//! committed before a fence, after the LSN the engine recorded ([`ChangeReader`], then
//! [`ChangeSummary::resume_lsn`]); [`PgCdc::advance_slot`] after the engine's Delta commit;
//! [`PgCdc::slot_status`] for the lag. Change batches carry the table's columns then
//! `_change_type`, `_commit_lsn`, `_change_seq`, `_commit_timestamp`, `_unchanged_cols`
//! (see [`batch::meta`]): `SEQUENCE BY STRUCT(_commit_lsn, _change_seq)` orders them exactly.
//!
//! Crash safety, per run: (1) `read_changes(recorded_lsn)`; (2) write the batches and record
//! `summary.resume_lsn` **in the same Delta commit**; (3) only then `advance_slot(resume_lsn)`.
//! A crash before (2) re-reads the same changes; a crash between (2) and (3) re-reads
//! nothing new (transactions at or below the recorded LSN are skipped). The slot never moves
//! by itself: the replication protocol only ever reports the slot's own position.
//!
//! **MySQL / MariaDB log-based CDC** ([`BinlogCdc`]). The binlog in row format:
//! [`BinlogCdc::start_snapshot`] reads every table in a consistent snapshot and says the
//! binlog position it corresponds to; [`BinlogCdc::read_changes`] reads the transactions
//! committed after a position up to the binlog's end when the read began, in the same change
//! batches as PostgreSQL's. Positions are [`Lsn`]s (`file number << 32 | offset`, see
//! [`binlog`]); nothing is kept on the server between runs. [`LogCdc`] runs either log
//! through the same calls.
//!
//! **PostgreSQL sinks** ([`PgSink`]): the one place this crate writes. A delivery of rows
//! the engine kept in a sink's Delta outbox, in one transaction with the outbox version it
//! sent (`src/pg/sink.rs`).
//!
//! **Debezium change files** ([`DebeziumReader`], [`read_debezium`]): JSON lines in the
//! same row shape.

#![warn(missing_docs)]

pub mod batch;
pub mod binlog;
pub mod cdc;
pub mod conn;
pub mod debezium;
pub mod error;
mod kind;
pub mod lsn;
mod mysql;
pub mod object;
mod pg;
pub mod read;
pub mod secret;
pub mod source;
mod tls;
pub mod value;

pub use batch::{change_meta_fields, ColumnKind, SourceColumn, SourceSchema};
pub use binlog::{BinlogCdc, BinlogChanges, BinlogSnapshot};
pub use cdc::{LogCdc, LogChanges, LogSnapshot};
pub use conn::{ConnectionSpec, PasswordLookup, PasswordOrigin, ResolvedPassword, SourceKind};
pub use debezium::{read_debezium, DebeziumOptions, DebeziumReader};
pub use error::{Result, SourceError};
pub use lsn::Lsn;
pub use object::{SourceObject, TableRef};
pub use pg::cdc::{
    CdcConfig, CdcTable, ChangeReader, ChangeSummary, CopyPosition, PgCdc, ReadOptions, SlotStatus,
    SnapshotReader, TableBatch, FENCE_PREFIX,
};
pub use pg::sink::{PgSink, POSITIONS_TABLE};
pub use pg::types::UNCONSTRAINED_NUMERIC;
pub use read::{WatermarkRead, DEFAULT_BATCH_ROWS};
pub use secret::Secret;
pub use source::{Source, WatermarkReader};
pub use value::{LowerBound, Overlap, Watermark, WatermarkValue};
