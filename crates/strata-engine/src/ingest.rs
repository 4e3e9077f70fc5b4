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
//! taken (`taken.rs` reads that record back, through a cache). A table source is read from
//! the version after the one recorded in the target's application transaction
//! `strata-source:<table>` (`strata-append:<flow>` for an append flow); the source of an AUTO
//! CDC target is read through its change data feed (`changes.rs`).

use crate::adopt;
use crate::autoload;
use crate::changes;
use crate::error::{Context, EngineError, Result};
use crate::expect::{self, ExpectationCount};
use crate::flow::{self, FlowSetup};
use crate::mview;
use crate::query::{self, Shapes};
use crate::sqlutil;
use crate::taken;
use crate::warehouse::{self, Warehouse};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::prelude::{
    CsvReadOptions, DataFrame, JsonReadOptions, ParquetReadOptions, SessionContext,
};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_sql::{
    FileFormat, PipelinePlan, QuerySource, ReadFiles, SourceQuery, StreamingTable, TableName,
    SOURCE_PLACEHOLDER,
};

const FILES_KEY: &str = "strata.files";
/// Delta's switch for deleting commit files older than the log retention. Off on streaming
/// tables that take files: their commit log is their record of the files taken.
const KEEP_LOG_PROPERTY: &str = "delta.enableExpiredLogCleanup";

/// What one ingestion run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub table: String,
    /// The table's own name for its query, the flow's name for an append flow.
    pub flow: String,
    pub append: bool,
    pub files: Vec<String>,
    /// Rows the query produced.
    pub rows_read: usize,
    /// Rows appended (after expectations dropped theirs).
    pub rows: usize,
    pub rows_dropped: usize,
    pub expectations: Vec<ExpectationCount>,
    pub skipped: Option<String>,
}

/// A streaming table's query or an append flow, checked against its input's schema.
#[derive(Debug, Clone)]
pub(crate) struct IngestSetup {
    /// The table written, as declared.
    pub table: StreamingTable,
    /// `Some(flow name)` for an append flow, `None` for the table's own query.
    pub append_flow: Option<String>,
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
        dir: PathBuf,
        spec: ReadFiles,
        mode: autoload::Mode,
        /// Auto Loader mode: the input columns of this run (inferred and recorded, or
        /// declared), the rescued-data column among them.
        input: Option<Vec<(String, deltalake::arrow::datatypes::DataType)>>,
        /// Inferred mode: the new files the columns were inferred from, which the run takes.
        pending: Option<Vec<String>>,
    },
    /// An append-only table: the files added since the last read.
    Table(TableName),
    /// An AUTO CDC target: its change data feed since the last read.
    Feed(TableName),
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
    /// through the cache of `taken.rs`.
    async fn taken(&self, wh: &Warehouse, table: &DeltaTable) -> Result<taken::Taken> {
        let cache = wh.taken_cache_path(&self.table.name);
        taken::read(table, &cache, &self.files_key(), &self.schema_key()).await
    }

    /// The commit-info key recording the inferred input columns.
    fn schema_key(&self) -> String {
        match &self.append_flow {
            None => autoload::SCHEMA_KEY.to_string(),
            Some(f) => format!("{}.{f}", autoload::SCHEMA_KEY),
        }
    }

    /// The application transaction each commit that takes input files carries. It orders
    /// them: two runs that took files from the same state of the table both write it, and
    /// Delta's conflict check lets only the first commit (the other run starts again and
    /// finds the files taken).
    fn files_app_id(&self) -> String {
        match &self.append_flow {
            None => "strata-files".to_string(),
            Some(f) => format!("strata-files:{f}"),
        }
    }

    /// The application transaction recording how far a table source was read.
    fn source_app_id(&self, source: &TableName) -> String {
        match &self.append_flow {
            None => format!("strata-source:{source}"),
            Some(f) => format!("strata-append:{f}"),
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> EngineError {
        match &self.append_flow {
            None => table_err(&self.table.name, msg),
            Some(f) => EngineError::Plan(format!("flow {f} (into {}): {msg}", self.table.name)),
        }
    }
}

fn arrow_schema(cols: &[strata_sql::ColumnDef]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
            .collect::<Vec<_>>(),
    ))
}

fn table_err(table: &TableName, msg: impl std::fmt::Display) -> EngineError {
    EngineError::Plan(format!("streaming table {table}: {msg}"))
}

/// Every input file under `dir` (or `dir` itself if it is a file), relative names, sorted.
/// Names starting with `.` or `_` are skipped, as Spark does.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    if dir.is_file() {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        return Ok(vec![name.to_string()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let entries =
            std::fs::read_dir(&abs).context(|| format!("cannot list {}", abs.display()))?;
        for entry in entries {
            let entry = entry.context(|| format!("cannot list {}", abs.display()))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let child = rel.join(&name);
            if entry.path().is_dir() {
                stack.push(child);
            } else {
                out.push(child.to_string_lossy().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn input_root(dir: &Path) -> PathBuf {
    if dir.is_file() {
        dir.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        dir.to_path_buf()
    }
}

/// Reads one input file into a DataFrame, with the declared schema if any.
async fn read_file(ctx: &SessionContext, path: &Path, spec: &ReadFiles) -> Result<DataFrame> {
    let path_str = path.to_string_lossy().to_string();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let schema = spec.schema.as_ref().map(|s| arrow_schema(s));
    let result = match spec.format {
        FileFormat::Json => {
            let mut opts = JsonReadOptions::default().file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_json(path_str, opts).await
        }
        FileFormat::Csv => {
            let mut opts = CsvReadOptions::new()
                .has_header(spec.header)
                .delimiter(spec.delimiter)
                .file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_csv(path_str, opts).await
        }
        FileFormat::Parquet => {
            let mut opts = ParquetReadOptions::default().file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_parquet(path_str, opts).await
        }
    };
    result.map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))
}

/// Where a query is planned, before anything runs: with joins, each joined table is an
/// empty table of its columns (`shapes`: this run's schema of a table the pipeline writes,
/// else the warehouse's), with the pipeline's views over them.
struct Planning<'a> {
    ctx: SessionContext,
    joins: Option<(&'a Joins, Shapes)>,
}

impl Planning<'_> {
    /// Plans `sql` over `input` (registered as the placeholder).
    async fn plan(&self, sql: &str, input: SchemaRef) -> Result<SchemaRef> {
        let sql = match &self.joins {
            Some((j, shapes)) => query::rewrite_shape(&self.ctx, sql, &j.schema, shapes)?,
            None => sql.to_string(),
        };
        let _ = self.ctx.deregister_table(SOURCE_PLACEHOLDER);
        self.ctx
            .register_batch(SOURCE_PLACEHOLDER, RecordBatch::new_empty(input))
            .context(|| "registering input".into())?;
        let df = self.ctx.sql(&sql).await.context(|| sql.to_string())?;
        Ok(Arc::new(df.schema().as_arrow().clone()))
    }
}

/// Where a query runs on each input of one run: with joins, a session over the warehouse
/// as it is now (the joined tables, the pipeline's views) and the query with its table
/// functions rewritten.
struct Running {
    ctx: SessionContext,
    sql: String,
}

impl Running {
    async fn new(wh: &Warehouse, setup: &IngestSetup) -> Result<Running> {
        let Some(j) = &setup.joins else {
            return Ok(Running {
                ctx: warehouse::new_session(),
                sql: setup.query_sql.clone(),
            });
        };
        let ctx = query::warehouse_session_in(wh, &j.schema).await?;
        mview::register_views(wh, &ctx, &j.views, &j.schema, None)
            .await
            .map_err(|e| setup.err(e))?;
        let sql = query::rewrite(wh, &ctx, &setup.query_sql, &j.schema)
            .await
            .map_err(|e| setup.err(e))?;
        Ok(Running { ctx, sql })
    }
}

/// What every streaming query of a pipeline is checked against before the run.
pub(crate) struct PipelineContext<'a> {
    pub wh: &'a Warehouse,
    pub plan: &'a PipelinePlan,
    /// The pipeline file's folder (`read_files` paths are relative to it).
    pub dir: &'a Path,
    /// The AUTO CDC targets (read through their change feed).
    pub feeds: &'a BTreeSet<TableName>,
}

/// Checks a streaming table's query (or, with `append`, an append flow into it) and finds
/// its row schema. `Err(why)` when it cannot be known yet (no files, no `schema =>`, no
/// table, a joined table with no columns yet): the table and its flows wait for input.
/// `known` holds the schemas of the datasets prepared before.
pub(crate) async fn prepare_ingest(
    pipeline: &PipelineContext<'_>,
    table: &StreamingTable,
    append: Option<&strata_sql::AppendFlow>,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<std::result::Result<IngestSetup, String>> {
    let PipelineContext {
        wh,
        plan,
        dir: pipeline_dir,
        feeds,
    } = *pipeline;
    const NO_INPUT: &str = "no input files yet and no schema => to plan with";
    let query: &SourceQuery = match (append, &table.query) {
        (Some(f), _) => &f.query,
        (None, Some(q)) => q,
        (None, None) => {
            return Err(EngineError::Internal(format!(
                "{} has no query",
                table.name
            )))
        }
    };
    let mut setup = IngestSetup {
        table: table.clone(),
        append_flow: append.map(|f| f.name.clone()),
        query_sql: query.sql.clone(),
        source: Source::Table(table.name.clone()),
        schema: Arc::new(Schema::empty()),
        evolve: false,
        downstream: Vec::new(),
        joins: (!query.reads.is_empty()).then(|| Joins {
            views: plan.views.clone(),
            schema: plan.default_schema.clone(),
        }),
    };
    let planning = match &setup.joins {
        None => Planning {
            ctx: warehouse::new_session(),
            joins: None,
        },
        Some(j) => {
            let mut shapes = Shapes::new();
            for t in plan.joined_tables(query) {
                let columns = match known.get(&t) {
                    Some(s) => s.clone(),
                    None => match wh.open_table(&t).await? {
                        Some(existing) => sqlutil::table_schema(&existing)?,
                        None => return Ok(Err(format!("it joins {t}, which has no columns yet"))),
                    },
                };
                shapes.insert(t, columns);
            }
            let ctx = query::shape_session(&j.schema, &shapes)?;
            mview::register_views(wh, &ctx, &j.views, &j.schema, Some(&shapes)).await?;
            Planning {
                ctx,
                joins: Some((j, shapes)),
            }
        }
    };
    let existing_table = wh.open_table(&table.name).await?;
    let (source, input_schema) = match &query.source {
        QuerySource::ReadFiles(spec) => {
            let dir = pipeline_dir.join(&spec.path);
            if !dir.exists() {
                return Err(setup.err(format!("read_files path {} does not exist", dir.display())));
            }
            for key in spec.other_options.keys() {
                if !matches!(
                    key.as_str(),
                    "multiline" | "inferschema" | "encoding" | "rescueddatacolumn"
                ) {
                    return Err(setup.err(format!("read_files option `{key}` is not supported")));
                }
            }
            let mode = autoload::mode(spec).map_err(|e| setup.err(e))?;
            let mut input = None;
            let mut pending = None;
            let schema = match &mode {
                autoload::Mode::Declared => match &spec.schema {
                    Some(cols) => Some(arrow_schema(cols)),
                    None => match list_files(&dir)?.first() {
                        Some(first) => {
                            let ctx = warehouse::file_session();
                            let df = read_file(&ctx, &input_root(&dir).join(first), spec).await?;
                            Some(Arc::new(df.schema().as_arrow().clone()))
                        }
                        None => None,
                    },
                },
                autoload::Mode::Autoload { rescued, inferred } => {
                    let columns = if *inferred {
                        let (taken, previous) = match &existing_table {
                            Some(t) => {
                                let taken = setup.taken(wh, t).await?;
                                (taken.files, taken.columns)
                            }
                            None => (BTreeSet::new(), Vec::new()),
                        };
                        let new: Vec<String> = list_files(&dir)?
                            .into_iter()
                            .filter(|f| !taken.contains(f))
                            .collect();
                        let root = input_root(&dir);
                        let paths: Vec<PathBuf> = new.iter().map(|f| root.join(f)).collect();
                        let inferred = autoload::infer(&paths, spec)?;
                        // The run takes exactly the files the columns were inferred from; a
                        // file arriving later waits for the next run (and its inference).
                        pending = Some(new);
                        (!(previous.is_empty() && inferred.is_empty()))
                            .then(|| autoload::merge(&previous, &inferred, rescued))
                    } else {
                        let declared: Vec<(String, deltalake::arrow::datatypes::DataType)> = spec
                            .schema
                            .iter()
                            .flatten()
                            .map(|c| (c.name.clone(), c.data_type.clone()))
                            .collect();
                        Some(autoload::merge(&declared, &[], rescued))
                    };
                    let schema = columns.as_deref().map(autoload::schema_of);
                    input = columns;
                    schema
                }
            };
            let schema = match schema {
                Some(s) if autoload::wants_metadata(&query.sql) => {
                    let mut fields: Vec<Field> =
                        s.fields().iter().map(|f| f.as_ref().clone()).collect();
                    fields.push(Field::new("_metadata", autoload::metadata_type(), true));
                    Some(Arc::new(Schema::new(fields)))
                }
                other => other,
            };
            (
                Source::Files {
                    dir,
                    spec: spec.clone(),
                    mode,
                    input,
                    pending,
                },
                schema,
            )
        }
        QuerySource::Table(t) if feeds.contains(t) => (
            Source::Feed(t.clone()),
            known.get(t).map(|s| changes::feed_schema(s)),
        ),
        QuerySource::Table(t) => (Source::Table(t.clone()), known.get(t).cloned()),
    };
    setup.source = source;
    let existing = match &existing_table {
        Some(t) => Some(sqlutil::table_schema(t)?),
        None => None,
    };
    let planned = match input_schema {
        Some(input) => {
            let planned = planning
                .plan(&query.sql, input.clone())
                .await
                .map_err(|e| setup.err(e))?;
            // `_metadata` is not part of `*`: unless the query names it bare, it is left out.
            if planned.index_of("_metadata").is_ok() && !autoload::names_metadata(&query.sql) {
                setup.query_sql = format!(
                    "SELECT * EXCLUDE (\"_metadata\") FROM ({}) AS __strata_query",
                    query.sql
                );
                Some(
                    planning
                        .plan(&setup.query_sql, input)
                        .await
                        .map_err(|e| setup.err(e))?,
                )
            } else {
                Some(planned)
            }
        }
        None => None,
    };
    let fresh = |p: &SchemaRef| -> SchemaRef {
        Arc::new(Schema::new(
            p.fields()
                .iter()
                .map(|f| Field::new(f.name(), sqlutil::storage_type(f.data_type()), true))
                .collect::<Vec<_>>(),
        ))
    };
    if append.is_some() {
        // Columns match by name; the table's columns come from its declaration, the table
        // itself, an earlier writer of this run, or else this flow.
        let target = table
            .columns
            .as_ref()
            .map(|c| arrow_schema(c))
            .or(existing)
            .or_else(|| known.get(&table.name).cloned());
        let schema = match (target, &planned) {
            (Some(t), Some(p)) => {
                for f in p.fields() {
                    if t.fields()
                        .iter()
                        .all(|g| !g.name().eq_ignore_ascii_case(f.name()))
                    {
                        return Err(setup.err(format!(
                            "the query produces column {}, which {} does not have ({})",
                            f.name(),
                            table.name,
                            sqlutil::describe_fields(&t)
                        )));
                    }
                }
                t
            }
            (Some(t), None) => t,
            (None, Some(p)) => fresh(p),
            (None, None) => return Ok(Err(NO_INPUT.to_string())),
        };
        setup.schema = schema;
        return Ok(Ok(setup));
    }
    let schema = match (planned, existing, &table.columns) {
        (_, _, Some(cols)) => arrow_schema(cols),
        (Some(p), Some(e), None) => {
            let prefix = p
                .fields()
                .iter()
                .zip(e.fields())
                .all(|(a, b)| a.name() == b.name());
            let auto = matches!(
                setup.source,
                Source::Files {
                    mode: autoload::Mode::Autoload { .. },
                    ..
                }
            );
            if prefix && auto && p.fields().len() > e.fields().len() {
                // Schema evolution: the new input columns are added to the table.
                let mut fields: Vec<Field> =
                    e.fields().iter().map(|f| f.as_ref().clone()).collect();
                for f in &p.fields()[e.fields().len()..] {
                    fields.push(Field::new(
                        f.name(),
                        sqlutil::storage_type(f.data_type()),
                        true,
                    ));
                }
                setup.evolve = true;
                setup.schema = Arc::new(Schema::new(fields));
                return Ok(Ok(setup));
            }
            if !prefix || p.fields().len() != e.fields().len() {
                return Err(setup.err(format!(
                    "the query now produces ({}) but the table has ({}); a full refresh is needed",
                    sqlutil::describe_fields(&p),
                    sqlutil::describe_fields(&e)
                )));
            }
            e
        }
        (Some(p), None, None) => fresh(&p),
        (None, Some(e), None) => e,
        (None, None, None) => return Ok(Err(NO_INPUT.to_string())),
    };
    setup.schema = schema;
    Ok(Ok(setup))
}

/// Applies the table's query to `input` rows and casts them to the table's schema. The flag
/// is true when the query passed the input's rows and columns through unchanged, already in
/// the table's column names and types (see `adopt.rs`).
async fn apply_query(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
) -> Result<(Vec<RecordBatch>, bool)> {
    let ctx = &running.ctx;
    let _ = ctx.deregister_table(SOURCE_PLACEHOLDER);
    ctx.register_table(SOURCE_PLACEHOLDER, input.into_view())
        .context(|| "registering input".into())?;
    let query = ctx
        .sql(&running.sql)
        .await
        .context(|| format!("streaming table {}", setup.table.name))?;
    let unchanged = adopt::passes_rows_through(query.logical_plan())
        && adopt::same_columns(query.schema().as_arrow(), &setup.schema);
    let batches = query
        .collect()
        .await
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    let cast = batches
        .iter()
        .map(|b| {
            if setup.append_flow.is_some() {
                align_by_name(b, &setup.schema)
            } else {
                sqlutil::cast_batch(b, &setup.schema)
            }
        })
        .collect::<Result<Vec<_>>>()
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    Ok((
        cast.into_iter().filter(|b| b.num_rows() > 0).collect(),
        unchanged,
    ))
}

/// `batch` with `schema`'s columns, matched by name ignoring case; a column the batch lacks
/// is NULL.
fn align_by_name(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let bs = batch.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            match bs
                .fields()
                .iter()
                .position(|g| g.name().eq_ignore_ascii_case(f.name()))
            {
                Some(i) => batch.column(i).clone(),
                None => deltalake::arrow::array::new_null_array(f.data_type(), batch.num_rows()),
            }
        })
        .collect();
    sqlutil::cast_columns(columns, schema)
}

/// Rejects rows that a downstream flow would reject, naming `place`. Each flow's events,
/// checked, are added to `events` under the flow's name (for flows that read what is
/// appended).
async fn check_downstream(
    setup: &IngestSetup,
    rows: &[RecordBatch],
    place: &str,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    for flow_setup in &setup.downstream {
        let ctx = warehouse::new_session();
        let table = MemTable::try_new(first.schema(), vec![rows.to_vec()])
            .context(|| "registering rows".into())?;
        ctx.register_table(SOURCE_PLACEHOLDER, Arc::new(table))
            .context(|| "registering rows".into())?;
        let checked = flow::evaluate_events(&ctx, flow_setup).await?;
        flow::validate_events(flow_setup, &checked, place)?;
        // A flow that takes its source's whole content (a snapshot in table mode) reads
        // the table, not the rows appended: nothing to keep for it.
        if !flow_setup.table_mode() {
            events
                .entry(flow_setup.flow.name.clone())
                .or_default()
                .extend(checked);
        }
    }
    Ok(())
}

/// The query's rows of one input, checked: expectations applied (counts added to
/// `report`), then the downstream flows' checks on the rows kept (their events added to
/// `events`). The flag is true when the rows are the input's, unchanged and all kept, in
/// the table's columns, with no NULL in a NOT NULL column.
async fn checked_rows(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
    report: &mut IngestReport,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<(Vec<RecordBatch>, bool)> {
    let steps = warehouse::Steps::new(setup.flow_name(), "ingest: ");
    let step = |what: &str| warehouse::step!(debug, steps, format_args!("{what} ({place})"));
    let (mut rows, mut unchanged) = apply_query(setup, running, input, place).await?;
    step("read and applied the query");
    let before: usize = rows.iter().map(RecordBatch::num_rows).sum();
    report.rows_read += before;
    if !setup.table.expectations.is_empty() {
        let all = deltalake::arrow::compute::concat_batches(&setup.schema, &rows)
            .context(|| "concatenating rows".into())?;
        let (kept, counts) = expect::apply(
            &setup.table.expectations,
            &setup.table.name.to_string(),
            place,
            all,
        )
        .await?;
        report.rows_dropped += before - kept.num_rows();
        unchanged &= kept.num_rows() == before;
        expect::accumulate(&mut report.expectations, counts);
        rows = vec![kept];
        step("applied the expectations");
    }
    check_downstream(setup, &rows, place, events).await?;
    step("checked the rows for the downstream flows");
    unchanged &= setup
        .schema
        .fields()
        .iter()
        .enumerate()
        .all(|(i, f)| f.is_nullable() || rows.iter().all(|b| b.column(i).null_count() == 0));
    Ok((rows, unchanged))
}

/// Whether Parquet input files may be taken into the table as they are: not turned off by
/// `strata.ingest.reuseFiles = false`, and the table has no partitions, column mapping,
/// constraints, generated columns or row tracking, which a copied file would bypass.
fn reuse_allowed(setup: &IngestSetup, existing: Option<&DeltaTable>) -> bool {
    let blocked = |k: &str, v: &str| {
        (k == adopt::REUSE_PROPERTY && v.eq_ignore_ascii_case("false"))
            || k.starts_with("delta.constraints.")
            || k.starts_with("delta.columnMapping")
            || (k == "delta.enableRowTracking" && v.eq_ignore_ascii_case("true"))
    };
    if setup.table.properties.iter().any(|(k, v)| blocked(k, v)) {
        return false;
    }
    if setup
        .schema
        .fields()
        .iter()
        .any(|f| !f.metadata().is_empty())
    {
        return false;
    }
    match existing.map(DeltaTable::snapshot) {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(state)) => {
            let meta = state.metadata();
            meta.partition_columns().is_empty()
                && !meta
                    .configuration()
                    .iter()
                    .any(|(k, v)| blocked(k, v.as_str()))
        }
    }
}

/// Runs one ingestion: new input → one commit.
pub(crate) async fn run_ingest(
    wh: &Warehouse,
    setup: &IngestSetup,
    update: &(dyn Fn(String) + Send + Sync),
) -> Result<IngestReport> {
    let name = &setup.table.name;
    let mut report = IngestReport {
        table: name.to_string(),
        flow: setup.flow_name().to_string(),
        append: setup.append_flow.is_some(),
        ..Default::default()
    };
    let existing = wh.open_table(name).await?;
    let mut commit = CommitProperties::default();
    let mut parts: Vec<RecordBatch> = Vec::new();
    // The downstream flows' events of the rows appended, for the handover after the commit.
    let mut events: HashMap<String, Vec<RecordBatch>> = HashMap::new();
    // Parquet input files taken into the table as they are (`adopt.rs`).
    let mut reused: Vec<adopt::Reusable> = Vec::new();
    match &setup.source {
        Source::Files {
            dir,
            spec,
            mode,
            input,
            pending,
        } => {
            // The files taken are recorded only in the commit log: this commit must not
            // delete expired commit files (Delta writers do once a checkpoint covers them),
            // or the next run would take their files again.
            commit = commit.with_cleanup_expired_logs(Some(false));
            let key = setup.files_key();
            let new: Vec<String> = match pending {
                Some(files) => files.clone(),
                None => {
                    let taken = match &existing {
                        Some(t) => setup.taken(wh, t).await?.files,
                        None => BTreeSet::new(),
                    };
                    list_files(dir)?
                        .into_iter()
                        .filter(|f| !taken.contains(f))
                        .collect()
                }
            };
            if new.is_empty() {
                report.skipped = Some("no new files".into());
                return Ok(report);
            }
            let root = input_root(dir);
            let running = Running::new(wh, setup).await?;
            let reuse = spec.format == FileFormat::Parquet
                && matches!(mode, autoload::Mode::Declared)
                && !autoload::wants_metadata(&setup.query_sql)
                && !setup.evolve
                && setup.append_flow.is_none()
                && reuse_allowed(setup, existing.as_ref());
            let mut taken = 0usize;
            for file in &new {
                let path = root.join(file);
                let place = format!("file {}", path.display());
                let ctx = warehouse::file_session();
                let df = match (mode, input) {
                    (autoload::Mode::Autoload { rescued, inferred }, Some(columns)) => {
                        let batch = autoload::read(
                            &path,
                            file,
                            spec,
                            &autoload::schema_of(columns),
                            rescued.as_str(),
                            !inferred,
                        )?;
                        ctx.read_batch(batch)
                            .context(|| format!("file {}", path.display()))?
                    }
                    _ => read_file(&ctx, &path, spec).await?,
                };
                let df = if autoload::wants_metadata(&setup.query_sql) {
                    autoload::with_metadata(df, &path)?
                } else {
                    df
                };
                let (rows, unchanged) =
                    checked_rows(setup, &running, df, &place, &mut report, &mut events).await?;
                let has_rows = rows.iter().any(|b| b.num_rows() > 0);
                let reusable = match reuse && unchanged && has_rows {
                    true => adopt::inspect(&path, &setup.schema)?,
                    false => None,
                };
                match reusable {
                    Some(file) => {
                        report.rows += rows.iter().map(RecordBatch::num_rows).sum::<usize>();
                        reused.push(file);
                    }
                    None => parts.extend(rows),
                }
                taken += 1;
                update(format!(
                    "{} of {} file(s), {} row(s)",
                    taken,
                    new.len(),
                    report.rows_read
                ));
            }
            // One call: each `with_metadata` replaces what an earlier one set.
            let mut metadata = vec![(key, serde_json::json!(new))];
            if let (autoload::Mode::Autoload { inferred: true, .. }, Some(columns)) = (mode, input)
            {
                metadata.push((setup.schema_key(), autoload::to_json(columns)));
            }
            commit = commit.with_metadata(metadata);
            let app_id = setup.files_app_id();
            let previous = match &existing {
                Some(t) => flow::txn_version(t, &app_id).await?,
                None => None,
            };
            let next = previous.map_or(0, |v| v + 1);
            commit = commit.with_application_transaction(Transaction::new(&app_id, next));
            report.files = new;
        }
        Source::Table(source_name) | Source::Feed(source_name) => {
            let Some(source) = wh.open_table(source_name).await? else {
                report.skipped = Some(format!("source {source_name} has no data yet"));
                return Ok(report);
            };
            let app_id = setup.source_app_id(source_name);
            let from = match &existing {
                Some(t) => flow::txn_version(t, &app_id).await?,
                None => None,
            };
            let version = flow::version_of(&source);
            if from.is_some_and(|f| f >= version) {
                report.skipped = Some("no new input".into());
                return Ok(report);
            }
            let ctx = warehouse::new_session();
            let df = if matches!(setup.source, Source::Feed(_)) {
                let feed = changes::read_feed(&source, from, Some(version), false).await?;
                ctx.read_batch(feed)
                    .context(|| "reading the change feed".into())?
            } else {
                let files = flow::new_files(&source, from).await?;
                flow::register_table(&ctx, "__strata_input", &source, Some(files)).await?;
                ctx.table("__strata_input")
                    .await
                    .context(|| "reading source".into())?
            };
            let place = format!(
                "the rows of {source_name} added after version {}",
                from.map_or("(start)".to_string(), |v| v.to_string())
            );
            let running = Running::new(wh, setup).await?;
            parts.extend(
                checked_rows(setup, &running, df, &place, &mut report, &mut events)
                    .await?
                    .0,
            );
            commit = commit.with_application_transaction(Transaction::new(&app_id, version));
        }
    }
    report.rows += parts.iter().map(RecordBatch::num_rows).sum::<usize>();
    if parts.is_empty() && reused.is_empty() {
        // The input is taken even when the query keeps none of its rows.
        parts.push(RecordBatch::new_empty(setup.schema.clone()));
    }
    let handle = match existing {
        Some(t) => t,
        None => {
            let mut configuration = warehouse::table_configuration(&setup.table.properties);
            let keeps_files = matches!(setup.source, Source::Files { .. });
            if keeps_files && !warehouse::sets_property(&setup.table.properties, KEEP_LOG_PROPERTY)
            {
                // Other writers (Spark, delta-rs) must not delete the commits either.
                configuration.push((KEEP_LOG_PROPERTY.to_string(), Some("false".to_string())));
            }
            warehouse::create_delta(
                &wh.table_path(name),
                &name.name,
                &setup.schema,
                configuration,
                setup.table.comment.as_deref(),
                Vec::new(),
            )
            .await?
        }
    };
    if setup.evolve {
        let props = warehouse::writer_properties(&handle);
        handle
            .write(parts)
            .with_writer_properties(props)
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(commit)
            .with_schema_mode(deltalake::operations::write::SchemaMode::Merge)
            .await
            .context(|| format!("streaming table {name}: committing"))?;
    } else {
        // The version before, as a downstream flow's position counts it (`None`: no data
        // files yet); unknown when the table state cannot be read.
        let before = handle
            .snapshot()
            .ok()
            .map(|s| (s.log_data().num_files() > 0).then(|| flow::version_of(&handle)));
        let steps = warehouse::Steps::new(setup.flow_name(), "ingest: ");
        let table_dir = wh.table_path(name);
        let adds = reused
            .iter()
            .map(|f| adopt::copy_in(f, &table_dir))
            .collect::<Result<Vec<_>>>()?;
        if !adds.is_empty() {
            warehouse::step!(debug, steps, "copied the reused parquet files in");
        }
        let after = warehouse::append(&handle, parts, adds, commit).await?;
        warehouse::step!(debug, steps, "appended and committed");
        if let (Some(before), true) = (before, after >= 0) {
            wh.keep_appended(&wh.table_path(name), before, after, events);
        }
    }
    Ok(report)
}
