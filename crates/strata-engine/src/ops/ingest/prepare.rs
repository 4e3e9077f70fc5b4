//! Preparing a streaming table's query (or an append flow) before anything runs: its input,
//! its row schema (declared, inferred, evolved), and what it joins.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::arrow_schema;
use crate::ops::ingest::autoload;
use crate::ops::ingest::files::read_file;
use crate::ops::ingest::files::InputDir;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Joins;
use crate::ops::ingest::Readiness;
use crate::ops::ingest::Source;
use crate::sql::shapes::Shapes;
use crate::storage::feed;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::datatypes::Field;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use strata_sql::PipelinePlan;
use strata_sql::QuerySource;
use strata_sql::ReadFiles;
use strata_sql::SourceQuery;
use strata_sql::StreamingTable;
use strata_sql::TableName;
use strata_sql::SOURCE_PLACEHOLDER;

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
            Some((j, shapes)) => {
                crate::sql::session::rewrite_shape(&self.ctx, sql, &j.schema, shapes)?
            }
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

/// What every streaming query of a pipeline is checked against before the run.
pub(crate) struct PipelineContext<'a> {
    pub wh: &'a Warehouse,
    pub plan: &'a PipelinePlan,
    /// The pipeline file's folder (`read_files` paths are relative to it).
    pub dir: &'a Path,
    /// The AUTO CDC targets (read through their change feed).
    pub feeds: &'a BTreeSet<TableName>,
    /// The pipeline file as the user named it (for the commands errors suggest).
    pub pipeline: &'a str,
}

/// Checks a streaming table's query (or, with `append`, an append flow into it) and finds
/// its row schema. `known` holds the schemas of the datasets prepared before.
///
/// ```text
///  query_of ─▶ planning_for ─▶ input_of ─▶ plan_query ─▶ append_schema / table_schema
///  (the flow's   (a session with  (the source   (the query's    (the table's columns:
///   or table's    the joined       and its       columns over    declared, existing,
///   query)        tables' shapes)  columns)      the input)      evolved or fresh)
/// ```
pub(crate) async fn prepare_ingest(
    pipeline: &PipelineContext<'_>,
    table: &StreamingTable,
    append: Option<&strata_sql::AppendFlow>,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Readiness> {
    let wh = pipeline.wh;
    if let Some(g) = table
        .columns
        .iter()
        .flatten()
        .find(|c| c.generated.is_some())
    {
        return Err(super::table_err(
            &table.name,
            format!(
                "column `{}` is GENERATED: generated columns are computed on AUTO CDC targets; \
                 on a streaming table with a query, compute it in the query",
                g.name
            ),
        ));
    }
    if let Some(f) = append.filter(|f| f.once) {
        if let Some(ran) = super::once::ran(wh, &table.name, &f.name).await? {
            return Ok(ran);
        }
    }
    let query = query_of(table, append)?;
    let mut setup = IngestSetup {
        table: table.clone(),
        append_flow: append.map(|f| f.name.clone()),
        once: append.is_some_and(|f| f.once),
        query_sql: query.sql.clone(),
        source: Source::Table(table.name.clone()),
        schema: Arc::new(Schema::empty()),
        evolve: false,
        downstream: Vec::new(),
        joins: (!query.reads.is_empty()).then(|| Joins {
            views: pipeline.plan.views.clone(),
            schema: pipeline.plan.default_schema.clone(),
        }),
    };
    let planning = match planning_for(pipeline, query, setup.joins.as_ref(), known).await? {
        Ok(planning) => planning,
        Err(why) => return Ok(Readiness::Waiting(why)),
    };
    let existing_table = wh.open_table(&table.name).await?;
    let (source, input_schema) =
        input_of(pipeline, query, &setup, existing_table.as_ref(), known).await?;
    setup.source = source;
    let existing = match &existing_table {
        Some(t) => Some(crate::storage::table::table_schema(t)?),
        None => None,
    };
    let planned = match input_schema {
        Some(input) => {
            let (planned, rewritten) = plan_query(&planning, query, &setup, input).await?;
            if let Some(sql) = rewritten {
                setup.query_sql = sql;
            }
            Some(planned)
        }
        None => None,
    };
    let schema = match append {
        Some(_) => append_schema(&setup, table, planned, existing, known)?,
        None => table_schema(pipeline, &setup, table, planned, existing)?,
    };
    let Some(RowSchema { schema, evolve }) = schema else {
        return Ok(Readiness::Waiting(NO_INPUT.to_string()));
    };
    setup.evolve = evolve;
    setup.schema = schema;
    Ok(Readiness::Ready(Box::new(setup)))
}

/// Why a table with no input files and no declared columns waits.
const NO_INPUT: &str = "no input files yet and no schema => to plan with";

/// The append flow's query, else the table's.
fn query_of<'a>(
    table: &'a StreamingTable,
    append: Option<&'a strata_sql::AppendFlow>,
) -> Result<&'a SourceQuery> {
    match (append, &table.query) {
        (Some(f), _) => Ok(&f.query),
        (None, Some(q)) => Ok(q),
        (None, None) => Err(EngineError::internal(format!(
            "{} has no query",
            table.name
        ))),
    }
}

/// Where the query is planned: with `joins`, a session over the shapes of the tables it
/// joins (this run's schema of a table prepared before, else the warehouse's) and the
/// pipeline's views; `Err(why)` when a joined table has no columns yet.
async fn planning_for<'a>(
    pipeline: &PipelineContext<'_>,
    query: &SourceQuery,
    joins: Option<&'a Joins>,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<std::result::Result<Planning<'a>, String>> {
    let wh = pipeline.wh;
    let Some(j) = joins else {
        return Ok(Ok(Planning {
            ctx: crate::storage::session::new_session(),
            joins: None,
        }));
    };
    let mut shapes = Shapes::new();
    for t in pipeline.plan.joined_tables(query) {
        let columns = match known.get(&t) {
            Some(s) => s.clone(),
            None => match wh.open_table(&t).await? {
                Some(existing) => crate::storage::table::table_schema(&existing)?,
                None => return Ok(Err(format!("it joins {t}, which has no columns yet"))),
            },
        };
        shapes.insert(t, columns);
    }
    let ctx = crate::sql::session::shape_session(&j.schema, &shapes)?;
    crate::sql::views::register_views(wh, &ctx, &j.views, &j.schema, Some(&shapes)).await?;
    Ok(Ok(Planning {
        ctx,
        joins: Some((j, shapes)),
    }))
}

/// The query's source and the columns of its input (`None` when they cannot be known yet).
async fn input_of(
    pipeline: &PipelineContext<'_>,
    query: &SourceQuery,
    setup: &IngestSetup,
    existing_table: Option<&DeltaTable>,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<(Source, Option<SchemaRef>)> {
    Ok(match &query.source {
        QuerySource::ReadFiles(spec) => {
            files_input(pipeline, query, spec, setup, existing_table).await?
        }
        QuerySource::ReadDatabase(rd) => {
            let (source, schema) =
                super::database::prepare_source(pipeline.plan, rd, setup).await?;
            (source, Some(schema))
        }
        QuerySource::Table(t) if pipeline.feeds.contains(t) => (
            Source::Feed(t.clone()),
            known.get(t).map(|s| feed::feed_schema(s)),
        ),
        QuerySource::Table(t) => (Source::Table(t.clone()), known.get(t).cloned()),
        QuerySource::Changes(tc) => {
            let spec = super::history::spec_of(tc, pipeline.dir).map_err(|e| setup.err(e))?;
            let schema = super::history::input_schema(pipeline.wh, &spec, known).await?;
            (Source::Changes(spec), schema)
        }
        // The query reads only tables; its input is empty and unused.
        QuerySource::Batch => (Source::Batch, Some(Arc::new(Schema::empty()))),
    })
}

/// A `read_files` source: its folder and options checked, and its columns (declared, read
/// from the first file, or inferred by Auto Loader), with `_metadata` when the query reads
/// it.
async fn files_input(
    pipeline: &PipelineContext<'_>,
    query: &SourceQuery,
    spec: &ReadFiles,
    setup: &IngestSetup,
    existing_table: Option<&DeltaTable>,
) -> Result<(Source, Option<SchemaRef>)> {
    let dir = input_dir(setup, &spec.path, pipeline.dir)?;
    if !dir.exists().await? {
        return Err(setup.err(match dir.glob() {
            Some(glob) => format!(
                "read_files path {}: no file matches the glob {} under {}",
                spec.path,
                glob.as_str(),
                dir.display()
            ),
            None => format!("read_files path {} does not exist", dir.display()),
        }));
    }
    for key in spec.other_options.keys() {
        if !matches!(
            key.as_str(),
            "multiline"
                | "inferschema"
                | "encoding"
                | "rescueddatacolumn"
                | "infercolumntypes"
                | "infertimestamp"
                | "schemahints"
                | "maxfilespertrigger"
                | "maxbytespertrigger"
        ) {
            return Err(setup.err(format!("read_files option `{key}` is not supported")));
        }
    }
    // A rate limit of Auto Loader's micro-batches: a run takes every new file, as Lakeflow's
    // triggered update does over as many micro-batches as the limit makes.
    if let Some(n) = spec.other_options.get("maxfilespertrigger") {
        if n.parse::<u64>().map_or(true, |n| n == 0) {
            return Err(setup.err(format!(
                "read_files option maxFilesPerTrigger must be a whole number above 0, found '{n}'"
            )));
        }
    }
    let mode = autoload::mode(spec).map_err(|e| setup.err(e))?;
    let mut input = None;
    let mut pending = None;
    let schema = match &mode {
        autoload::Mode::Declared => declared_schema(spec, &dir).await?,
        autoload::Mode::Autoload { rescued, inferred } => {
            let columns = match *inferred {
                true => {
                    let (columns, new) =
                        inferred_columns(pipeline.wh, spec, setup, existing_table, &dir, rescued)
                            .await?;
                    // The run takes exactly the files the columns were inferred from; a
                    // file arriving later waits for the next run (and its inference).
                    pending = Some(new);
                    columns
                }
                false => {
                    let declared: Vec<(String, DataType)> = spec
                        .schema
                        .iter()
                        .flatten()
                        .map(|c| (c.name.clone(), c.data_type.clone()))
                        .collect();
                    Some(autoload::merge(&declared, &[], rescued))
                }
            };
            let schema = columns.as_deref().map(autoload::schema_of);
            input = columns;
            schema
        }
    };
    let schema = match schema {
        Some(s) if autoload::wants_metadata(&query.sql) => {
            let mut fields: Vec<Field> = s.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new("_metadata", autoload::metadata_type(), true));
            Some(Arc::new(Schema::new(fields)))
        }
        other => other,
    };
    Ok((
        Source::Files {
            dir,
            spec: spec.clone(),
            mode,
            input,
            pending,
        },
        schema,
    ))
}

/// [`InputDir::at`]; a bad glob is an error of the table.
fn input_dir(setup: &IngestSetup, path: &str, dir: &Path) -> Result<InputDir> {
    InputDir::at(path, dir)?.map_err(|e| setup.err(format!("read_files path {path}: {e}")))
}

/// The columns of `read_files` input without Auto Loader: those declared (Debezium's
/// followed by the change columns), else the first file's.
async fn declared_schema(spec: &ReadFiles, dir: &InputDir) -> Result<Option<SchemaRef>> {
    Ok(match &spec.schema {
        // Debezium's declared columns are the table's; the change columns follow.
        Some(cols) if spec.format == strata_sql::FileFormat::Debezium => {
            let mut fields: Vec<Field> = arrow_schema(cols)
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.extend(strata_sources::change_meta_fields());
            Some(Arc::new(Schema::new(fields)))
        }
        Some(cols) => Some(arrow_schema(cols)),
        None => match dir.list().await?.first() {
            Some(first) => {
                let ctx = crate::storage::session::file_session();
                let df = read_file(&ctx, &dir.file(first).await?, spec).await?;
                Some(Arc::new(df.schema().as_arrow().clone()))
            }
            None => None,
        },
    })
}

/// Auto Loader's inferred columns: those the table took before merged with those of the
/// files not taken yet (`None` when there are neither), and those files.
async fn inferred_columns(
    wh: &Warehouse,
    spec: &ReadFiles,
    setup: &IngestSetup,
    existing_table: Option<&DeltaTable>,
    dir: &InputDir,
    rescued: &str,
) -> Result<(Option<Vec<(String, DataType)>>, Vec<String>)> {
    let (taken, previous) = match existing_table {
        Some(t) => {
            let taken = setup.taken(wh, t).await?;
            (taken.files, taken.columns)
        }
        None => (BTreeSet::new(), Vec::new()),
    };
    let new: Vec<String> = dir
        .list()
        .await?
        .into_iter()
        .filter(|f| !taken.contains(f))
        .collect();
    let mut paths: Vec<PathBuf> = Vec::with_capacity(new.len());
    for f in &new {
        paths.push(dir.file(f).await?);
    }
    let inferred = autoload::infer(&paths, spec)?;
    let columns = (!(previous.is_empty() && inferred.is_empty()))
        .then(|| autoload::merge(&previous, &inferred, rescued));
    Ok((columns, new))
}

/// The query's columns over `input`, and the query rewritten when it must leave out
/// `_metadata`.
async fn plan_query(
    planning: &Planning<'_>,
    query: &SourceQuery,
    setup: &IngestSetup,
    input: SchemaRef,
) -> Result<(SchemaRef, Option<String>)> {
    let planned = planning
        .plan(&query.sql, input.clone())
        .await
        .map_err(|e| setup.err(e))?;
    // `_metadata` is not part of `*`: unless the query names it bare, it is left out.
    if planned.index_of("_metadata").is_ok() && !autoload::names_metadata(&query.sql) {
        let sql = format!(
            "SELECT * EXCLUDE (\"_metadata\") FROM ({}) AS __strata_query",
            query.sql
        );
        let planned = planning.plan(&sql, input).await.map_err(|e| setup.err(e))?;
        Ok((planned, Some(sql)))
    } else {
        Ok((planned, None))
    }
}

/// A new table's columns from the query's: all nullable, in their storage types.
fn fresh(p: &SchemaRef) -> SchemaRef {
    Arc::new(Schema::new(
        p.fields()
            .iter()
            .map(|f| Field::new(f.name(), arrow::storage_type(f.data_type()), true))
            .collect::<Vec<_>>(),
    ))
}

/// The rows a table stores.
struct RowSchema {
    schema: SchemaRef,
    /// The table gains the input's new columns (schema evolution).
    evolve: bool,
}

/// The table schema an append flow writes (it never evolves the table); `None` when it
/// cannot be known yet.
fn append_schema(
    setup: &IngestSetup,
    table: &StreamingTable,
    planned: Option<SchemaRef>,
    existing: Option<SchemaRef>,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Option<RowSchema>> {
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
                        arrow::describe_fields(&t)
                    )));
                }
            }
            t
        }
        (Some(t), None) => t,
        (None, Some(p)) => fresh(p),
        (None, None) => return Ok(None),
    };
    Ok(Some(RowSchema {
        schema,
        evolve: false,
    }))
}

/// A streaming table's schema, evolved when its input gained columns; `None` when it cannot
/// be known yet.
fn table_schema(
    pipeline: &PipelineContext<'_>,
    setup: &IngestSetup,
    table: &StreamingTable,
    planned: Option<SchemaRef>,
    existing: Option<SchemaRef>,
) -> Result<Option<RowSchema>> {
    if let (Source::Changes(_), Some(p), Some(e), None) =
        (&setup.source, &planned, &existing, &table.columns)
    {
        // A change-history table gains columns by name, after the feed's own.
        let (schema, evolve) = super::history::evolved_schema(setup, p, e)?;
        return Ok(Some(RowSchema { schema, evolve }));
    }
    if let (Source::Database { .. }, Some(p), Some(e), None) =
        (&setup.source, &planned, &existing, &table.columns)
    {
        // A database table gains columns by name, after the table's own (in CDC mode the
        // change columns come before them).
        return match followed_columns(p, e) {
            Ok((schema, evolve)) => Ok(Some(RowSchema { schema, evolve })),
            Err(changes) => Err(setup.err(format!(
                "{}; the rows already written hold the old columns: `strata run {} \
                 --full-refresh {}` reads the source again",
                describe_changes(&changes, p, e),
                pipeline.pipeline,
                table.name
            ))),
        };
    }
    let schema = match (planned, existing, &table.columns) {
        (Some(p), _, Some(cols)) => {
            // The declaration is the table's schema: the query's columns must match it.
            let produced: Vec<(String, DataType)> = p
                .fields()
                .iter()
                .map(|f| (f.name().clone(), arrow::storage_type(f.data_type())))
                .collect();
            crate::semantics::declared::conform(
                &produced,
                cols,
                &[],
                "the query",
                &table.name.to_string(),
            )
            .map_err(|e| setup.err(e))?;
            arrow_schema(cols)
        }
        (None, _, Some(cols)) => arrow_schema(cols),
        (Some(p), Some(e), None) => {
            let prefix = p
                .fields()
                .iter()
                .zip(e.fields())
                .all(|(a, b)| a.name() == b.name());
            // Auto Loader input gains columns as its files do.
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
                        arrow::storage_type(f.data_type()),
                        true,
                    ));
                }
                return Ok(Some(RowSchema {
                    schema: Arc::new(Schema::new(fields)),
                    evolve: true,
                }));
            }
            if !prefix || p.fields().len() != e.fields().len() {
                return Err(setup.err(format!(
                    "the query now produces ({}) but the table has ({}); a full refresh is needed",
                    arrow::describe_fields(&p),
                    arrow::describe_fields(&e)
                )));
            }
            e
        }
        (Some(p), None, None) => fresh(&p),
        (None, Some(e), None) => e,
        (None, None, None) => return Ok(None),
    };
    Ok(Some(RowSchema {
        schema,
        evolve: false,
    }))
}

/// How a column of a database source's streaming table no longer matches the query's.
#[derive(Debug, Clone, PartialEq)]
enum ColumnChange {
    /// The query no longer produces it: the source dropped or renamed it.
    Gone { name: String, was: DataType },
    /// The query produces it in another type: the source changed its type.
    Retyped {
        name: String,
        was: DataType,
        now: DataType,
    },
}

/// A database source's streaming table as its query now fills it (`planned`): the table's
/// columns (`existing`), matched by name, then the query's new columns, nullable (rows
/// already written read NULL there; nothing is rewritten). The flag says whether columns
/// were added. Columns the query no longer produces, or produces in another type, cannot
/// be followed: they are returned, every one.
fn followed_columns(
    planned: &Schema,
    existing: &Schema,
) -> std::result::Result<(SchemaRef, bool), Vec<ColumnChange>> {
    let mut changes = Vec::new();
    for e in existing.fields() {
        match planned.field_with_name(e.name()) {
            Err(_) => changes.push(ColumnChange::Gone {
                name: e.name().clone(),
                was: e.data_type().clone(),
            }),
            Ok(p) => {
                let now = arrow::storage_type(p.data_type());
                if !stored_as(&now, e.data_type()) {
                    changes.push(ColumnChange::Retyped {
                        name: e.name().clone(),
                        was: e.data_type().clone(),
                        now,
                    });
                }
            }
        }
    }
    if !changes.is_empty() {
        return Err(changes);
    }
    let mut fields: Vec<Field> = existing
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let added: Vec<Field> = planned
        .fields()
        .iter()
        .filter(|p| existing.field_with_name(p.name()).is_err())
        .map(|p| Field::new(p.name(), arrow::storage_type(p.data_type()), true))
        .collect();
    let evolve = !added.is_empty();
    fields.extend(added);
    Ok((Arc::new(Schema::new(fields)), evolve))
}

/// Whether values of type `now` (a query's column) are stored in a column of type `stored`
/// (read back from Delta) as they were before: the same type, a timestamp of any unit
/// (Delta keeps microseconds) with or without a time zone as before, or NULLs; lists and
/// structs by their elements and fields (Delta names a list's element field its own way).
fn stored_as(now: &DataType, stored: &DataType) -> bool {
    match (now, stored) {
        (DataType::Timestamp(_, z1), DataType::Timestamp(_, z2)) => z1.is_some() == z2.is_some(),
        (DataType::Null, _) => true,
        (
            DataType::List(a) | DataType::LargeList(a) | DataType::ListView(a),
            DataType::List(b) | DataType::LargeList(b),
        ) => stored_as(a.data_type(), b.data_type()),
        (DataType::Struct(a), DataType::Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.name() == y.name() && stored_as(x.data_type(), y.data_type()))
        }
        _ => arrow::same_type(now, stored),
    }
}

/// `changes` in words, with SQL type names; a column gone while others are new may have
/// been renamed, so the new ones are named too.
fn describe_changes(changes: &[ColumnChange], planned: &Schema, existing: &Schema) -> String {
    let mut parts: Vec<String> = changes
        .iter()
        .map(|c| match c {
            ColumnChange::Gone { name, was } => format!(
                "column `{name}` ({}) is no longer produced: the source dropped or renamed it",
                arrow::sql_type_name(was)
            ),
            ColumnChange::Retyped { name, was, now } => format!(
                "column `{name}` is now {} but the table has it as {}: the source changed its type",
                arrow::sql_type_name(now),
                arrow::sql_type_name(was)
            ),
        })
        .collect();
    let new: Vec<String> = planned
        .fields()
        .iter()
        .filter(|p| existing.field_with_name(p.name()).is_err())
        .map(|p| format!("`{}` ({})", p.name(), arrow::sql_type_name(p.data_type())))
        .collect();
    let gone = changes
        .iter()
        .any(|c| matches!(c, ColumnChange::Gone { .. }));
    if gone && !new.is_empty() {
        parts.push(format!("new column(s) {}", new.join(", ")));
    }
    format!(
        "the source's columns changed in a way the table cannot follow: {}",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(cols: &[(&str, DataType)]) -> Schema {
        Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn a_database_table_gains_new_columns_after_its_own() {
        // CDC: the source's new column comes before the change columns in the query's
        // output; the table keeps its order and takes it at the end.
        let existing = schema(&[("id", DataType::Int32), ("_change_type", DataType::Utf8)]);
        let planned = schema(&[
            ("id", DataType::Int32),
            ("city", DataType::Utf8View),
            ("_change_type", DataType::Utf8),
        ]);
        let (got, evolve) = followed_columns(&planned, &existing).unwrap();
        assert!(evolve);
        let names: Vec<&str> = got.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "_change_type", "city"]);
        assert_eq!(got.field(2).data_type(), &DataType::Utf8);
        assert!(got.field(2).is_nullable());
        // The same columns in another order: nothing to add.
        let reordered = schema(&[("_change_type", DataType::Utf8), ("id", DataType::Int32)]);
        let (got, evolve) = followed_columns(&reordered, &existing).unwrap();
        assert!(!evolve);
        assert_eq!(got.as_ref(), &existing);
        // A list whose element field Delta names differently is the same column.
        let list =
            |element: &str| DataType::List(Arc::new(Field::new(element, DataType::Utf8, true)));
        let stored = schema(&[("_unchanged_cols", list("element"))]);
        let produced = schema(&[("_unchanged_cols", list("item"))]);
        assert!(followed_columns(&produced, &stored).is_ok());
    }

    #[test]
    fn dropped_renamed_and_retyped_columns_are_each_named() {
        let existing = schema(&[
            ("id", DataType::Int32),
            ("city", DataType::Utf8),
            ("n", DataType::Int32),
        ]);
        let planned = schema(&[
            ("id", DataType::Int32),
            ("town", DataType::Utf8),
            ("n", DataType::Int64),
        ]);
        let changes = followed_columns(&planned, &existing).unwrap_err();
        assert_eq!(
            changes,
            [
                ColumnChange::Gone {
                    name: "city".into(),
                    was: DataType::Utf8
                },
                ColumnChange::Retyped {
                    name: "n".into(),
                    was: DataType::Int32,
                    now: DataType::Int64
                }
            ]
        );
        assert_eq!(
            describe_changes(&changes, &planned, &existing),
            "the source's columns changed in a way the table cannot follow: column `city` \
             (STRING) is no longer produced: the source dropped or renamed it; column `n` is \
             now BIGINT but the table has it as INT: the source changed its type; new \
             column(s) `town` (STRING)"
        );
    }
}
