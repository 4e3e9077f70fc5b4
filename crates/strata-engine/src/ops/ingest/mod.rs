//! Streaming tables with an `AS SELECT ... FROM STREAM read_files(...)` (or `STREAM(t)`),
//! and append flows (`CREATE FLOW f AS INSERT INTO t BY NAME SELECT ... FROM STREAM(...)`):
//! append-only ingestion.
//!
//! Each run lists the input folder, takes the files not yet ingested in file-name order,
//! applies the query to each, checks the table's expectations, checks the rows against every
//! AUTO CDC flow that reads the table (NULL keys and sequences are rejected here, naming the
//! file, before anything is committed), and appends all rows in one Delta commit whose
//! commit info lists the files taken (`strata.files`, or `strata.files.<flow>` for an append
//! flow). A crash before the commit leaves nothing; after it, the files are known to be
//! taken (`storage/ledger.rs` reads that record back, through a cache). A table source is read from
//! the version after the one recorded in the target's application transaction
//! `strata-source:<table>` (`strata-append:<flow>` for an append flow); the source of an AUTO
//! CDC target is read through its change data feed (`storage/feed.rs`).
//!
//! A once flow (`INSERT INTO ONCE`, `once.rs`) reads its input in batch (every file under
//! its `read_files` path, or the tables its query names) and appends the rows in one commit
//! that also records `strata-once:<flow>` at that commit's own version; a target recording
//! it skips the flow, until a full refresh sets the target aside.

pub(crate) mod autoload;
mod commit;
mod database;
mod files;
mod history;
mod infer;
mod once;
mod prepare;
mod rows;
mod run;

pub(crate) use files::read_batch_files;
pub(crate) use prepare::{prepare_ingest, PipelineContext};
pub(crate) use run::run_ingest;

use crate::error::{EngineError, Result};
use crate::semantics::flow::FlowSetup;
use crate::sql::expect::ExpectationCount;
use crate::storage::commit::AppId;
use crate::storage::ledger;
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::datatypes::{Schema, SchemaRef};
use deltalake::DeltaTable;
use std::collections::BTreeMap;
use std::sync::Arc;
use strata_sql::{ReadFiles, StreamingTable, TableName};

const FILES_KEY: &str = "strata.files";
/// Delta's switch for deleting commit files older than the log retention. Off on streaming
/// tables that take files: their commit log is their record of the files taken.
const KEEP_LOG_PROPERTY: &str = "delta.enableExpiredLogCleanup";

/// What one ingestion run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IngestReport {
    pub table: String,
    /// The table's own name for its query, the flow's name for an append flow.
    pub flow: String,
    pub append: bool,
    /// A once flow (`INSERT INTO ONCE`).
    pub once: bool,
    pub files: Vec<String>,
    /// Rows the query produced.
    pub rows_read: usize,
    /// Rows appended (after expectations dropped theirs).
    pub rows: usize,
    pub rows_dropped: usize,
    pub expectations: Vec<ExpectationCount>,
    pub skipped: Option<String>,
    /// A database source: the watermark the table reached in this run.
    pub watermark: Option<String>,
    /// What the run reports besides its counts (a change-history table's gap).
    pub notes: Vec<String>,
}

/// What preparing an ingestion found.
pub(crate) enum Readiness {
    Ready(Box<IngestSetup>),
    /// Its schema cannot be known yet (no files, no `schema =>`, no table, a joined table
    /// with no columns yet): why. The table and its flows wait for input.
    Waiting(String),
    /// A once flow that already ran: its run's report (skipped, saying at which version it
    /// ran) and its target's columns. Its input is not looked at (it may be gone).
    Ran(Box<IngestReport>, SchemaRef),
}

/// A streaming table's query or an append flow, checked against its input's schema.
#[derive(Debug, Clone)]
pub(crate) struct IngestSetup {
    /// The table written, as declared.
    pub table: StreamingTable,
    /// `Some(flow name)` for an append flow, `None` for the table's own query.
    pub append_flow: Option<String>,
    /// A once flow (`INSERT INTO ONCE`): reads its whole input in batch, one time.
    pub once: bool,
    pub query_sql: String,
    pub source: Source,
    /// The schema of the table's rows.
    pub schema: SchemaRef,
    /// The table gains columns in this run (schema evolution).
    pub evolve: bool,
    /// Flows that read this table: their batch checks run before each commit.
    pub downstream: Vec<FlowSetup>,
    /// What the query joins in batch (a stream-static join); `None` when it reads only its
    /// stream.
    pub joins: Option<Joins>,
}

/// What a query that joins tables in batch resolves its names against: the pipeline's
/// views and default schema. The joined tables are read as they are when the query runs
/// (after the nodes that write them, in the same run), like a stream-static join in Spark:
/// rows taken earlier are not recomputed when a joined table changes later.
#[derive(Debug, Clone)]
pub(crate) struct Joins {
    views: BTreeMap<TableName, strata_sql::View>,
    schema: String,
}

#[derive(Debug, Clone)]
pub(crate) enum Source {
    Files {
        dir: files::InputDir,
        spec: ReadFiles,
        mode: autoload::Mode,
        /// Auto Loader mode: the input columns of this run (inferred and recorded, or
        /// declared), the rescued-data column among them.
        input: Option<Vec<(String, deltalake::arrow::datatypes::DataType)>>,
        /// Inferred mode: the new files the columns were inferred from, which the run takes.
        pending: Option<Vec<String>>,
    },
    /// A database table or query read by its watermark (`read_database`).
    Database {
        spec: strata_sources::ConnectionSpec,
        read: crate::sources::read::DatabaseRead,
        /// The columns the database describes (and the change columns in CDC mode): each
        /// batch read is aligned to them by name.
        input: SchemaRef,
        /// How the table is created to write some columns (without a Parquet dictionary,
        /// uncompressed), unless its properties say otherwise.
        layout: crate::sources::read::ColumnLayout,
    },
    /// An append-only table: the files added since the last read.
    Table(TableName),
    /// An AUTO CDC target: its change data feed since the last read.
    Feed(TableName),
    /// `STREAM table_changes(...)`: any Delta table's change data feed, every change kept
    /// (a change-history table, `history.rs`).
    Changes(history::ChangesSpec),
    /// A once flow's query over tables only: no input of its own (`once.rs`).
    Batch,
}

impl IngestSetup {
    /// The flow's name in reports and the event log.
    pub(crate) fn flow_name(&self) -> &str {
        self.append_flow
            .as_deref()
            .unwrap_or(self.table.name.name.as_str())
    }

    /// The commit-info key listing the input files taken.
    fn files_key(&self) -> String {
        match &self.append_flow {
            None => FILES_KEY.to_string(),
            Some(f) => format!("{FILES_KEY}.{f}"),
        }
    }

    /// What this ingestion has taken into `table` so far: its commit log's record, read
    /// through the cache of `storage/ledger.rs`.
    async fn taken(&self, wh: &Warehouse, table: &DeltaTable) -> Result<ledger::Taken> {
        let cache = wh.taken_cache_location(&self.table.name);
        ledger::read(table, &cache, &self.files_key(), &self.schema_key()).await
    }

    /// The commit-info key recording the inferred input columns.
    fn schema_key(&self) -> String {
        match &self.append_flow {
            None => crate::storage::ledger::SCHEMA_KEY.to_string(),
            Some(f) => format!("{}.{f}", crate::storage::ledger::SCHEMA_KEY),
        }
    }

    /// The application transaction recording how far a table source was read.
    pub(crate) fn source_app_id<'a>(&'a self, source: &'a TableName) -> AppId<'a> {
        match &self.append_flow {
            None => AppId::Source(source),
            Some(f) => AppId::Append(f),
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> EngineError {
        match &self.append_flow {
            None => table_err(&self.table.name, msg),
            Some(f) => EngineError::plan(format!("flow {f} (into {}): {msg}", self.table.name)),
        }
    }
}

fn arrow_schema(cols: &[strata_sql::ColumnDef]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(crate::semantics::declared::declared_field)
            .collect::<Vec<_>>(),
    ))
}

fn table_err(table: &TableName, msg: impl std::fmt::Display) -> EngineError {
    EngineError::plan(format!("streaming table {table}: {msg}"))
}
