//! The parsed form of a pipeline: one [`Statement`] per SQL statement, in file order.
//!
//! Expressions (conditions, sequence expressions, the SELECT of a streaming table) are kept
//! as SQL text that DataFusion's default dialect accepts: the parser has already applied the
//! Spark lexical rules (a double-quoted token became a single-quoted string literal, backticks
//! quote identifiers), so the engine hands these strings straight to DataFusion.

use arrow_schema::DataType;
use std::collections::BTreeMap;
use std::fmt;

/// A place in the pipeline text, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub line: u64,
    pub column: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// `schema.name` or `name`; the schema defaults to `default`. A legacy `LIVE.` prefix
/// is dropped by the parser (`LIVE.users` is `default.users`).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    pub const DEFAULT_SCHEMA: &'static str = "default";

    /// The names the warehouse answers to as a catalog in three-part names
    /// (`main.default.users`): `main`, Unity Catalog's default, and `strata`.
    pub const CATALOGS: [&'static str; 2] = ["main", "strata"];

    /// `name`, `schema.name`, `LIVE.name` or `catalog.schema.name` (the catalog one of
    /// [`TableName::CATALOGS`]) from its parts; unqualified names go to `default_schema`.
    pub fn from_parts(parts: &[&str], default_schema: &str) -> Result<Self, String> {
        match parts {
            [name] => Ok(TableName::new(Some(default_schema), name)),
            [schema, name] if schema.eq_ignore_ascii_case("live") => {
                Ok(TableName::new(Some(default_schema), name))
            }
            [schema, name] => Ok(TableName::new(Some(schema), name)),
            [catalog, schema, name]
                if Self::CATALOGS
                    .iter()
                    .any(|c| c.eq_ignore_ascii_case(catalog)) =>
            {
                Ok(TableName::new(Some(schema), name))
            }
            [catalog, _, _] => Err(format!(
                "'{}': catalog {catalog} is not this warehouse; its catalog is called {}",
                parts.join("."),
                Self::CATALOGS.join(" or ")
            )),
            _ => Err(format!(
                "'{}' is not a table name (name, schema.name or catalog.schema.name)",
                parts.join(".")
            )),
        }
    }

    /// [`TableName::from_parts`] of a dotted name (no quoting).
    pub fn parse(text: &str, default_schema: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split('.').map(str::trim).collect();
        Self::from_parts(&parts, default_schema)
    }

    pub fn new(schema: Option<&str>, name: &str) -> Self {
        TableName {
            schema: schema.unwrap_or(Self::DEFAULT_SCHEMA).to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// One statement of a pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    StreamingTable(StreamingTable),
    Flow(CdcFlow),
    PointInTime(PitTable),
    MaterializedView(MaterializedView),
    View(View),
    AppendFlow(AppendFlow),
    Connection(Connection),
}

/// `CREATE CONNECTION [IF NOT EXISTS] name TYPE postgresql OPTIONS (host 'h', port '5432',
/// database 'shop', user 'etl', password_env 'SHOP_PASSWORD') [COMMENT '...']`: a database
/// the pipeline's `read_database(...)` sources name. The engine checks the type and options.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    pub name: String,
    /// The `TYPE`, lower-cased as written (`postgresql`, `mysql`, ...).
    pub kind: String,
    /// Option names lower-cased, values as written.
    pub options: BTreeMap<String, String>,
    pub location: Location,
}

/// What happens to a row that fails an expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectAction {
    /// No `ON VIOLATION`: the row is kept and counted.
    Warn,
    /// `ON VIOLATION DROP ROW`: the row is dropped and counted.
    Drop,
    /// `ON VIOLATION FAIL UPDATE`: the run fails; nothing of the batch is committed.
    Fail,
}

impl ExpectAction {
    /// The name the event log uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ExpectAction::Warn => "warn",
            ExpectAction::Drop => "drop",
            ExpectAction::Fail => "fail",
        }
    }
}

/// `CONSTRAINT name EXPECT (condition) [ON VIOLATION DROP ROW | FAIL UPDATE]`. A row passes
/// when the condition is true; false and NULL are violations.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    pub name: String,
    /// Condition SQL.
    pub condition: String,
    pub action: ExpectAction,
    pub location: Location,
}

/// `CREATE [OR REFRESH] MATERIALIZED VIEW name [(cols, constraints)] [COMMENT] [TBLPROPERTIES]
/// AS SELECT ...`: the stored result of a batch query, recomputed when what it reads changed.
#[derive(Debug, Clone, PartialEq)]
pub struct MaterializedView {
    pub name: TableName,
    pub columns: Option<Vec<ColumnDef>>,
    pub expectations: Vec<Expectation>,
    pub comment: Option<String>,
    pub properties: BTreeMap<String, String>,
    /// `PARTITIONED BY (cols)`: the Delta partition columns the table is created with.
    pub partitioned_by: Vec<String>,
    /// `CLUSTER BY (cols)`: the table's clustering columns, which `strata optimize` orders
    /// its files by (the planner records them as `pipelines.autoOptimize.zOrderCols`).
    pub cluster_by: Vec<String>,
    pub query: BatchQuery,
    /// `CREATE PRIVATE MATERIALIZED VIEW`: kept where only the pipeline that declares it
    /// reads it (not in the warehouse's catalog).
    pub private: bool,
    pub location: Location,
}

/// `CREATE [TEMPORARY] VIEW name AS SELECT ...`: a named query, not stored, for the queries
/// of materialized views and other views.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub name: TableName,
    pub query: BatchQuery,
    pub location: Location,
}

/// A batch query (no `STREAM`) and the tables it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchQuery {
    pub sql: String,
    /// Every table named in a FROM clause (CTE names excluded), including the first argument
    /// of `table_changes('t', ...)` and `as_of('t', ...)`, in text order, without repeats.
    pub reads: Vec<TableName>,
    /// The files a materialized view's query reads in batch: each `read_files(...)` and
    /// each Spark direct read (``parquet.`path` ``, ``json.`path` ``, ``csv.`path` ``), in text
    /// order. The SQL names the i-th as the table [`files_placeholder`]`(i)`.
    pub files: Vec<FileRead>,
}

/// Files a batch query reads.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRead {
    pub spec: ReadFiles,
    /// Spark's direct read (``parquet.`path` ``): its reader's defaults (CSV columns `_c0`,
    /// `_c1`, ... as STRING; no rescued-data column), not read_files' inference.
    pub direct: bool,
}

/// The table name the SQL of a [`BatchQuery`] gives its `i`-th [`FileRead`].
pub fn files_placeholder(i: usize) -> String {
    format!("__strata_files_{i}")
}

/// `CREATE FLOW name AS INSERT INTO target BY NAME SELECT ... FROM STREAM(source)`: appends
/// the new rows of one streaming source to a streaming table, matching columns by name.
///
/// `INSERT INTO ONCE target` (or `INSERT ONCE INTO target`) is a one-time flow (a
/// backfill): its query is a batch query, with `read_files(...)` (every file under the
/// path) or [`QuerySource::Batch`] (tables only) as its source, and the engine runs it in
/// the first update after it is declared and again only after a full refresh of its
/// target.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendFlow {
    pub name: String,
    pub target: TableName,
    pub query: SourceQuery,
    /// `INSERT INTO ONCE`: a one-time flow.
    pub once: bool,
    pub location: Location,
}

/// `CREATE [OR REFRESH] POINT IN TIME TABLE name [TBLPROPERTIES (...)] KEYS (k, ...)
/// AS OF spine FROM t1, t2, ...`: for every as-of value of the spine and every key of the
/// historised tables, the surrogate key (or start) of each table's version valid then.
#[derive(Debug, Clone, PartialEq)]
pub struct PitTable {
    pub name: TableName,
    pub keys: Vec<String>,
    pub spine: Spine,
    /// The historised tables (SCD type 2 or `SNAPSHOTS` targets of this pipeline).
    pub sources: Vec<TableName>,
    pub properties: BTreeMap<String, String>,
    pub location: Location,
}

/// The as-of values of a point-in-time table.
#[derive(Debug, Clone, PartialEq)]
pub enum Spine {
    /// `AS OF (v1, v2, ...)`: constant expressions (SQL).
    List(Vec<String>),
    /// `AS OF RANGE (start, stop, step)`: `start`, `start + step`, ... up to `stop` included.
    Range {
        start: String,
        stop: String,
        step: String,
    },
    /// `AS OF (SELECT ...)`: the first column of a query over the warehouse's tables.
    Query(String),
}

/// A declared column: `name TYPE [NOT NULL] [GENERATED ALWAYS AS (expr)] [COMMENT '...']`.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    pub comment: Option<String>,
    /// `GENERATED ALWAYS AS (expr)`: the SQL of the expression, over the table's other
    /// columns (dataset column lists only).
    pub generated: Option<String>,
}

impl ColumnDef {
    /// A nullable column with no comment, not generated.
    pub fn new(name: impl Into<String>, data_type: DataType) -> Self {
        ColumnDef {
            name: name.into(),
            data_type,
            nullable: true,
            comment: None,
            generated: None,
        }
    }
}

/// `CREATE [OR REFRESH] STREAMING TABLE name [(cols)] [COMMENT '...'] [TBLPROPERTIES (...)]
/// [AS SELECT ...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamingTable {
    pub name: TableName,
    pub columns: Option<Vec<ColumnDef>>,
    /// `CONSTRAINT ... EXPECT ...` entries of the column list, in order.
    pub expectations: Vec<Expectation>,
    pub comment: Option<String>,
    /// `TBLPROPERTIES ('k' = 'v', ...)`, keys as written.
    pub properties: BTreeMap<String, String>,
    /// `PARTITIONED BY (cols)`: the Delta partition columns the table is created with.
    pub partitioned_by: Vec<String>,
    /// `CLUSTER BY (cols)`: the table's clustering columns, which `strata optimize` orders
    /// its files by (the planner records them as `pipelines.autoOptimize.zOrderCols`).
    pub cluster_by: Vec<String>,
    /// `None` for a table that only receives flows (an AUTO CDC target).
    pub query: Option<SourceQuery>,
    /// `CREATE PRIVATE STREAMING TABLE`: kept where only the pipeline that declares it
    /// reads it (not in the warehouse's catalog).
    pub private: bool,
    /// `CREATE SINK`: where the rows of the append flows into it go, outside the
    /// pipeline's datasets (it has no query and no columns of its own).
    pub sink: Option<SinkTarget>,
    pub location: Location,
}

/// Where a sink writes: a Delta table at a path (relative paths from the pipeline's
/// folder) or a table of the warehouse, or a PostgreSQL table through a declared
/// connection (`format 'postgresql'`).
#[derive(Debug, Clone, PartialEq)]
pub enum SinkTarget {
    Path(String),
    Table(TableName),
    Database {
        /// The `CREATE CONNECTION` it writes through.
        connection: String,
        /// The table, `schema.table` or `table`, as written.
        table: String,
    },
}

/// The `AS SELECT ...` of a streaming table.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceQuery {
    /// The query with its one streaming source (`STREAM read_files(...)`, `cloud_files(...)`,
    /// `STREAM(t)`, `STREAM t`) replaced by the table name [`SOURCE_PLACEHOLDER`]. Everything
    /// else (projection, WHERE, casts) is untouched.
    pub sql: String,
    pub source: QuerySource,
    /// The tables the query reads in batch besides its streaming source (a stream-static
    /// join: `JOIN customers`, `JOIN as_of('customers', ...)`), as in [`BatchQuery::reads`].
    pub reads: Vec<TableName>,
}

/// The columns a database change log (`read_database(..., mode => 'cdc')`) adds to a
/// table's own: kept in the change table, left out of an AUTO CDC target.
pub const CHANGE_COLUMNS: [&str; 5] = [
    "_change_type",
    "_commit_lsn",
    "_change_seq",
    "_commit_timestamp",
    "_unchanged_cols",
];

/// The table property an informational `PRIMARY KEY` or `FOREIGN KEY` constraint of a
/// dataset's column list is recorded under, followed by the constraint's name (its value:
/// `PRIMARY KEY (id)`, `FOREIGN KEY (c) REFERENCES customers (id)`). Not enforced, as in
/// Unity Catalog.
pub const KEY_CONSTRAINT_PREFIX: &str = "strata.constraint.";

/// The name the engine registers the new input rows under when it runs a [`SourceQuery`].
pub const SOURCE_PLACEHOLDER: &str = "__strata_source";

#[derive(Debug, Clone, PartialEq)]
pub enum QuerySource {
    ReadFiles(ReadFiles),
    ReadDatabase(ReadDatabase),
    Table(TableName),
    /// `STREAM table_changes('t' | 'path', startingVersion => 0, ...)`: the change data
    /// feed of any Delta table, every change kept (a change-history table).
    Changes(TableChanges),
    /// No input of its own: the query reads tables in batch (only the query of a once
    /// flow, `INSERT INTO ONCE t BY NAME SELECT * FROM backfill_table`, has it).
    Batch,
}

/// `STREAM table_changes('orders', startingVersion => 0)` (or `startingTimestamp =>
/// '2024-01-01 00:00:00'`, or a start as the second argument, as Databricks'
/// `table_changes`): the change data feed of a Delta table, read incrementally. Option
/// names are lower-cased; the engine checks their values.
#[derive(Debug, Clone, PartialEq)]
pub struct TableChanges {
    pub source: ChangeSource,
    /// Every option, lower-cased key (`startingversion`, `startingtimestamp`,
    /// `onmissingversions`, ...), value as text. A second positional argument is
    /// `startingversion` when it is a number, else `startingtimestamp`.
    pub options: BTreeMap<String, String>,
    pub location: Location,
}

/// What a change-history table reads: a table of the warehouse (declared in the pipeline
/// or not), or a Delta table at a path (written by another tool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeSource {
    Table(TableName),
    /// As written: relative paths are resolved by the engine against the pipeline file.
    Path(String),
}

/// `read_database('connection', table => 'public.orders', watermark => 'updated_at, id',
/// overlap => '10 minutes', exclude => 'blob_col', batch_rows => 50000)` (or `query =>
/// 'SELECT ...'` instead of `table =>`): a database table read incrementally by its
/// watermark columns. Option names are lower-cased; the engine checks their values.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadDatabase {
    pub connection: String,
    /// Every option, lower-cased key, value as text.
    pub options: BTreeMap<String, String>,
    pub location: Location,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Json,
    Csv,
    Parquet,
    /// Debezium change events, one JSON envelope per line: read into the table's columns
    /// and the change columns (`_change_type`, `_commit_lsn`, ...), as database CDC.
    Debezium,
}

/// `read_files(path, format => 'json', schema => 'a INT, b STRING', header => true, ...)`,
/// or legacy DLT's `cloud_files(path, 'json', map('header', 'true', ...))`, which is the same.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadFiles {
    /// As written; relative paths are resolved by the engine against the pipeline file.
    pub path: String,
    pub format: FileFormat,
    /// Parsed `schema =>` option.
    pub schema: Option<Vec<ColumnDef>>,
    /// CSV: `header => true|false` (default false, as in Spark and Lakeflow).
    pub header: bool,
    /// CSV: `sep`/`delimiter` (default `,`).
    pub delimiter: u8,
    /// Every other option, lower-cased key, value as text. The engine rejects the ones it
    /// does not know.
    pub other_options: BTreeMap<String, String>,
    pub location: Location,
}

/// `COLUMNS a, b` / `COLUMNS * EXCEPT (a, b)`, also used for `TRACK HISTORY ON`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ColumnSelection {
    #[default]
    All,
    Only(Vec<String>),
    Except(Vec<String>),
}

/// How a target keeps history: `STORED AS SCD TYPE 1 | SCD TYPE 2 | SNAPSHOTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ScdType {
    /// The current state only.
    #[default]
    Type1,
    /// One row per version of a key, with a validity interval.
    Type2,
    /// Every delivered snapshot's rows, each with start = end = its version (snapshot flows
    /// only). Same physical layout as SCD type 2.
    Snapshots,
}

impl ScdType {
    /// Whether the target carries the interval columns.
    pub fn has_timeline(self) -> bool {
        matches!(self, ScdType::Type2 | ScdType::Snapshots)
    }
}

impl fmt::Display for ScdType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScdType::Type1 => "SCD TYPE 1",
            ScdType::Type2 => "SCD TYPE 2",
            ScdType::Snapshots => "SNAPSHOTS",
        })
    }
}

/// What feeds a flow: change events, or full snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum FlowKind {
    /// `AUTO CDC INTO`: each source row is a change event ordered by `SEQUENCE BY`.
    #[default]
    Changes,
    /// `AUTO CDC FROM SNAPSHOT INTO`: each delivery is a full extract.
    Snapshot {
        /// `SNAPSHOT VERSION BY expr` (SQL); `None` is table mode: each run takes the
        /// source's whole content as one snapshot, versioned by the run's UTC timestamp.
        version_by: Option<String>,
    },
}

/// `SEQUENCE BY expr` or `SEQUENCE BY STRUCT(a, b)`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum SequenceBy {
    Expr(String),
    /// Orders by the first expression, then the next. Each entry is (field name, expression
    /// SQL); the field name is the column name for a plain column, else `c0`, `c1`, ...
    Struct(Vec<(String, String)>),
}

/// `CREATE FLOW name AS AUTO CDC INTO target FROM STREAM(source) KEYS (...) ...`
/// (or the legacy `APPLY CHANGES INTO` spelling).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CdcFlow {
    pub name: String,
    pub kind: FlowKind,
    pub target: TableName,
    pub source: TableName,
    pub keys: Vec<String>,
    pub ignore_null_updates: bool,
    /// Condition SQL of `APPLY AS DELETE WHEN`.
    pub delete_when: Option<String>,
    /// Condition SQL of `APPLY AS TRUNCATE WHEN`.
    pub truncate_when: Option<String>,
    /// For snapshot flows, the version expression (table mode: the run's timestamp).
    pub sequence_by: SequenceBy,
    pub columns: ColumnSelection,
    pub stored_as: ScdType,
    /// `TRACK HISTORY ON ...`; `None` means every column is tracked.
    pub track_history: Option<ColumnSelection>,
    /// `AUTO CDC ONCE`: a one-time backfill. Its `source` is the private staging table that
    /// its once append flow fills from the table it names (see the parser's
    /// `once_cdc_flow`); a full refresh of the target refreshes that table too, so the
    /// backfill runs again.
    pub once: bool,
    pub location: Location,
}

/// A parsed pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    pub statements: Vec<Statement>,
    /// The schema unqualified table names were resolved in (`default` unless the pipeline
    /// was parsed with another).
    pub default_schema: String,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline {
            statements: Vec::new(),
            default_schema: TableName::DEFAULT_SCHEMA.to_string(),
        }
    }
}
