//! Preparing a streaming table's query (or an append flow) before anything runs: its input,
//! its row schema (declared, inferred, evolved), and what it joins.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::arrow_schema;
use crate::ops::ingest::autoload;
use crate::ops::ingest::files::input_root;
use crate::ops::ingest::files::list_files;
use crate::ops::ingest::files::read_file;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Joins;
use crate::ops::ingest::Source;
use crate::sql::shapes::Shapes;
use crate::storage::feed;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::Field;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::prelude::SessionContext;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use strata_sql::PipelinePlan;
use strata_sql::QuerySource;
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
            ctx: crate::storage::session::new_session(),
            joins: None,
        },
        Some(j) => {
            let mut shapes = Shapes::new();
            for t in plan.joined_tables(query) {
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
            Planning {
                ctx,
                joins: Some((j, shapes)),
            }
        }
    };
    let existing_table = wh.open_table(&table.name).await?;
    let (source, input_schema) = match &query.source {
        QuerySource::ReadFiles(spec) => {
            let dir = pipeline_dir.join(crate::storage::warehouse::local_path(
                Path::new(&spec.path),
                "read_files path",
            )?);
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
                    None => match list_files(&dir)?.first() {
                        Some(first) => {
                            let ctx = crate::storage::session::file_session();
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
        QuerySource::ReadDatabase(rd) => {
            let (source, schema) = super::database::prepare_source(plan, rd, &setup).await?;
            (source, Some(schema))
        }
        QuerySource::Table(t) if feeds.contains(t) => (
            Source::Feed(t.clone()),
            known.get(t).map(|s| feed::feed_schema(s)),
        ),
        QuerySource::Table(t) => (Source::Table(t.clone()), known.get(t).cloned()),
    };
    setup.source = source;
    let existing = match &existing_table {
        Some(t) => Some(crate::storage::table::table_schema(t)?),
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
                .map(|f| Field::new(f.name(), arrow::storage_type(f.data_type()), true))
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
                            arrow::describe_fields(&t)
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
            // Auto Loader input and database tables gain columns as their source does.
            let auto = matches!(
                setup.source,
                Source::Files {
                    mode: autoload::Mode::Autoload { .. },
                    ..
                } | Source::Database { .. }
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
                setup.evolve = true;
                setup.schema = Arc::new(Schema::new(fields));
                return Ok(Ok(setup));
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
        (None, None, None) => return Ok(Err(NO_INPUT.to_string())),
    };
    setup.schema = schema;
    Ok(Ok(setup))
}
