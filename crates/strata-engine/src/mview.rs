//! Materialized views: the stored result of a batch query over the pipeline's tables, and
//! the (unstored) views their queries may use.
//!
//! A refresh recomputes the query and replaces the table's content in one Delta commit
//! (earlier versions stay readable through Delta time travel). The commit records what it
//! was computed from (`strata.inputs`: the query text and the version of every table read,
//! views resolved); when none of that changed, the refresh is skipped, so a run that brings
//! nothing new leaves the view untouched. Incremental maintenance is not attempted: the
//! view is always recomputed whole when an input changed.

use crate::error::{Context, EngineError, Result};
use crate::expect::{self, ExpectationCount};
use crate::query::{rewrite, warehouse_session_in};
use crate::sqlutil;
use crate::warehouse::{self, Warehouse};
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use strata_sql::{MaterializedView, TableName, View};

const INPUTS_KEY: &str = "strata.inputs";

/// What one refresh did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MvReport {
    pub table: String,
    /// Rows the query produced.
    pub rows_read: usize,
    /// Rows stored (after expectations dropped theirs).
    pub rows: usize,
    pub rows_dropped: usize,
    pub expectations: Vec<ExpectationCount>,
    pub skipped: Option<String>,
}

/// Registers every view of the pipeline in `ctx` (each after the views it reads). With
/// `shapes`, for planning only: the table functions in the views read the tables' columns
/// (see [`crate::query::rewrite_shape`]), and views that read a table outside `shapes` are
/// left out.
pub(crate) async fn register_views(
    wh: &Warehouse,
    ctx: &SessionContext,
    views: &BTreeMap<TableName, View>,
    schema: &str,
    shapes: Option<&crate::query::Shapes>,
) -> Result<()> {
    let mut done: BTreeSet<&TableName> = BTreeSet::new();
    // With shapes, a view that reads a table without one (or such a view) is left out.
    let mut left_out: BTreeSet<&TableName> = BTreeSet::new();
    while done.len() < views.len() {
        let before = done.len();
        for (name, v) in views {
            if done.contains(name)
                || v.query
                    .reads
                    .iter()
                    .any(|r| views.contains_key(r) && !done.contains(r))
            {
                continue;
            }
            let unknown = |r: &TableName| match views.contains_key(r) {
                true => left_out.contains(r),
                false => shapes.is_some_and(|s| !s.contains_key(r)),
            };
            if v.query.reads.iter().any(unknown) {
                left_out.insert(name);
                done.insert(name);
                continue;
            }
            let sql = match shapes {
                Some(s) => crate::query::rewrite_shape(ctx, &v.query.sql, schema, s)?,
                None => rewrite(wh, ctx, &v.query.sql, schema).await?,
            };
            let reference = crate::query::reference_in(ctx, name)?;
            ctx.sql(&format!("CREATE OR REPLACE VIEW {reference} AS {sql}"))
                .await
                .map_err(|e| EngineError::Plan(format!("view {name}: {e}")))?;
            done.insert(name);
        }
        if done.len() == before {
            return Err(EngineError::Internal("views form a cycle".into()));
        }
    }
    Ok(())
}

/// The versions of the tables `reads` (views already resolved), or the name of the first
/// one that does not exist yet.
async fn input_versions(
    wh: &Warehouse,
    reads: &[TableName],
) -> Result<std::result::Result<BTreeMap<String, i64>, TableName>> {
    let mut out = BTreeMap::new();
    for t in reads {
        match wh.open_table(t).await? {
            Some(table) => {
                out.insert(t.to_string(), crate::flow::version_of(&table));
            }
            None => return Ok(Err(t.clone())),
        }
    }
    Ok(Ok(out))
}

/// What the latest refresh of `table` was computed from.
async fn last_inputs(table: &deltalake::DeltaTable) -> Result<Option<serde_json::Value>> {
    let mut history = table.history(Some(1));
    if let Some(info) = history.next().await {
        let info = info.context(|| "reading table history".into())?;
        return Ok(info.info.get(INPUTS_KEY).cloned());
    }
    Ok(None)
}

/// Recomputes `mv` if what it reads changed. `reads` are the tables behind its query (views
/// resolved); `declared` the datasets of the pipeline, which may simply not exist yet.
pub(crate) async fn refresh(
    wh: &Warehouse,
    mv: &MaterializedView,
    views: &BTreeMap<TableName, View>,
    reads: &[TableName],
    declared: &BTreeSet<TableName>,
    schema: &str,
) -> Result<MvReport> {
    let name = &mv.name;
    let mut report = MvReport {
        table: name.to_string(),
        ..Default::default()
    };
    let versions = match input_versions(wh, reads).await? {
        Ok(v) => v,
        Err(missing) if declared.contains(&missing) => {
            report.skipped = Some(format!("{missing} has no data yet"));
            return Ok(report);
        }
        Err(missing) => {
            return Err(EngineError::Plan(format!(
                "materialized view {name} (line {}) reads {missing}, which is neither declared in \
                 the pipeline nor a table of the warehouse",
                mv.location.line
            )))
        }
    };
    let inputs = serde_json::json!({ "query": mv.query.sql, "versions": versions });
    let existing = wh.open_table(name).await?;
    if let Some(t) = &existing {
        if last_inputs(t).await?.as_ref() == Some(&inputs) {
            report.skipped = Some("nothing it reads has changed".into());
            return Ok(report);
        }
    }

    let ctx = warehouse_session_in(wh, schema).await?;
    register_views(wh, &ctx, views, schema, None).await?;
    let sql = rewrite(wh, &ctx, &mv.query.sql, schema).await?;
    let err = |e: &dyn std::fmt::Display| {
        EngineError::Plan(format!(
            "materialized view {name} (line {}): {e}",
            mv.location.line
        ))
    };
    let df = ctx.sql(&sql).await.map_err(|e| err(&e))?;
    let planned: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let schema: SchemaRef = match &mv.columns {
        Some(cols) => {
            if cols.len() != planned.fields().len() {
                return Err(err(&format!(
                    "declares {} column(s) but its query produces {} ({})",
                    cols.len(),
                    planned.fields().len(),
                    sqlutil::describe_fields(&planned)
                )));
            }
            Arc::new(Schema::new(
                cols.iter()
                    .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
                    .collect::<Vec<_>>(),
            ))
        }
        None => Arc::new(Schema::new(
            planned
                .fields()
                .iter()
                .map(|f| Field::new(f.name(), sqlutil::storage_type(f.data_type()), true))
                .collect::<Vec<_>>(),
        )),
    };
    let batches = df.collect().await.map_err(|e| err(&e))?;
    let cast = batches
        .iter()
        .map(|b| sqlutil::cast_batch(b, &schema))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| err(&e))?;
    let rows = concat_batches(&schema, &cast).context(|| "collecting rows".into())?;
    report.rows_read = rows.num_rows();
    let (rows, counts) = expect::apply(
        &mv.expectations,
        &name.to_string(),
        "the query's result",
        rows,
    )
    .await?;
    report.rows = rows.num_rows();
    report.rows_dropped = report.rows_read - report.rows;
    report.expectations = counts;

    let handle = match existing {
        Some(t) => t,
        None => {
            warehouse::create_delta(
                &wh.table_path(name),
                &name.name,
                &schema,
                warehouse::table_configuration(&mv.properties),
                mv.comment.as_deref(),
                Vec::new(),
            )
            .await?
        }
    };
    let props = crate::warehouse::writer_properties(&handle);
    handle
        .write(vec![rows])
        .with_writer_properties(props)
        .with_save_mode(SaveMode::Overwrite)
        .with_schema_mode(SchemaMode::Overwrite)
        .with_commit_properties(
            CommitProperties::default().with_metadata([(INPUTS_KEY.to_string(), inputs)]),
        )
        .await
        .context(|| format!("materialized view {name}: committing"))?;
    Ok(report)
}
