//! Materialized views: the stored result of a batch query over the pipeline's tables, and
//! the (unstored) views their queries may use.
//!
//! A refresh recomputes the query and replaces the table's content in one Delta commit
//! (earlier versions stay readable through Delta time travel). The commit records what it
//! was computed from (`strata.inputs`: the query text and the version of every table read,
//! views resolved); when none of that changed, the refresh is skipped, so a run that brings
//! nothing new leaves the view untouched. When only the tables a view reads changed and the
//! query's shape allows, the view takes what changed instead ([`incremental`]: the result
//! over one table's new rows appended or combined, the groups or join keys the changed rows
//! touch recomputed); otherwise it is recomputed whole, and the report says why.

mod from_changes;
mod incremental;
mod rejoin;
mod replace;

use crate::error::{Context, EngineError, Result};
use crate::sql::expect::{self, ExpectationCount};
use crate::sql::session::{rewrite, warehouse_session_in};
use crate::sql::views::register_views;
use crate::storage::commit::PendingCommit;
use crate::storage::warehouse::Warehouse;
use crate::storage::write::{write_rows, RowChange};
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::dataframe::DataFrame;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use strata_sql::{MaterializedView, TableName, View};

const INPUTS_KEY: &str = "strata.inputs";

/// The files a view's query reads ([`strata_sql::BatchQuery::files`]), in order, each read
/// whole: its rows and the names of its files; or the path of one that has no file yet.
pub(crate) type FileInputs = std::result::Result<
    Vec<(
        SchemaRef,
        Vec<deltalake::arrow::array::RecordBatch>,
        Vec<String>,
    )>,
    String,
>;

/// What one refresh did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MvReport {
    pub table: String,
    /// Rows the query produced.
    pub rows_read: usize,
    /// Rows stored (after expectations dropped theirs).
    pub rows: usize,
    pub rows_dropped: usize,
    pub expectations: Vec<ExpectationCount>,
    pub skipped: Option<String>,
    pub refresh: Refresh,
    /// Why a view refreshed before was recomputed whole rather than from what changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recomputed_because: Option<String>,
}

/// How a refresh that ran reached the view's new content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refresh {
    /// Computed whole from everything the query reads.
    #[default]
    Recomputed,
    /// The query's result over the rows its input gained, appended.
    Appended,
    /// The query's result over the rows its input gained, combined per key with the view's
    /// rows (counts and sums added, minimums and maximums compared).
    Combined,
    /// The groups the input's changed rows touch, recomputed from the input, in place of
    /// the view's.
    Regrouped,
    /// The join keys the inputs' changed rows hold, their rows recomputed from the inputs in
    /// place of the view's.
    Rejoined,
}

/// A table a view reads, as opened when its refresh started, with the version of its data
/// that the refresh records.
struct Read {
    name: TableName,
    table: deltalake::DeltaTable,
    version: i64,
}

/// The tables `reads` (views already resolved) with their data versions, or the name of the
/// first one that does not exist yet.
async fn open_reads(
    wh: &Warehouse,
    reads: &[TableName],
) -> Result<std::result::Result<Vec<Read>, TableName>> {
    let mut out = Vec::new();
    for t in reads {
        match wh.open_table(t).await? {
            Some(table) => {
                // Upkeep (OPTIMIZE, VACUUM) changes no row: no reason to compute again.
                let version = crate::storage::changes::data_version(&table).await?;
                out.push(Read {
                    name: t.clone(),
                    table,
                    version,
                });
            }
            None => return Ok(Err(t.clone())),
        }
    }
    Ok(Ok(out))
}

/// Registers each table the view reads in `ctx` at the version the refresh records for it
/// (`reads`, from [`open_reads`]). The session opened the warehouse's tables again after
/// those versions were taken: a table that grew in between (another run's ingestion, say)
/// would put rows in the view that its commit does not record, and the next incremental
/// refresh would add them a second time.
async fn pin_reads(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    reads: Vec<Read>,
) -> Result<()> {
    for Read {
        name,
        mut table,
        version,
    } in reads
    {
        if crate::storage::table::version_of(&table) != version {
            table
                .load_version(version as u64)
                .await
                .context(|| format!("loading version {version} of {name}"))?;
        }
        let reference = crate::sql::session::reference_in(ctx, &name)?;
        let _ = ctx.deregister_table(reference.as_str());
        crate::storage::session::register_table(ctx, &reference, &table, None).await?;
    }
    Ok(())
}

/// What the latest refresh of `table` was computed from (its latest commit that is not
/// upkeep: an OPTIMIZE or VACUUM of the view records no inputs).
async fn last_inputs(table: &deltalake::DeltaTable) -> Result<Option<serde_json::Value>> {
    let mut history = table.history(None);
    while let Some(info) = history.next().await {
        let info = info.context(|| "reading table history".into())?;
        if info
            .operation
            .as_deref()
            .is_some_and(crate::storage::changes::is_upkeep_operation)
        {
            continue;
        }
        return Ok(info.info.get(INPUTS_KEY).cloned());
    }
    Ok(None)
}

/// Recomputes `mv` if what it reads changed. `reads` are the tables behind its query (views
/// resolved); `declared` the datasets of the pipeline, which may simply not exist yet.
pub(crate) async fn refresh(
    scope: &crate::ops::Scope<'_>,
    mv: &MaterializedView,
    views: &BTreeMap<TableName, View>,
    reads: &[TableName],
    declared: &BTreeSet<TableName>,
    schema: &str,
    files: FileInputs,
) -> Result<MvReport> {
    let (wh, run_id) = (scope.wh, scope.run_id);
    let name = &mv.name;
    let mut report = MvReport {
        table: name.to_string(),
        ..Default::default()
    };
    let opened = match open_reads(wh, reads).await? {
        Ok(v) => v,
        Err(missing) if declared.contains(&missing) => {
            report.skipped = Some(format!("{missing} has no data yet"));
            return Ok(report);
        }
        Err(missing) => {
            return Err(EngineError::plan_does(
                format!("materialized view {name}"),
                mv.location.line,
                format!(
                    "reads {missing}, which is neither declared in the pipeline nor a table of \
                     the warehouse"
                ),
            ))
        }
    };
    // The files it reads: a new file is a reason to compute again.
    let files = match files {
        Ok(files) => files,
        Err(empty) => {
            report.skipped = Some(format!("{empty} has no files yet"));
            return Ok(report);
        }
    };
    let versions: BTreeMap<String, i64> = opened
        .iter()
        .map(|r| (r.name.to_string(), r.version))
        .collect();
    let names: Vec<&Vec<String>> = files.iter().map(|(_, _, n)| n).collect();
    let inputs = match names.is_empty() {
        true => serde_json::json!({ "query": mv.query.sql, "versions": versions }),
        false => serde_json::json!({ "query": mv.query.sql, "versions": versions, "files": names }),
    };
    let existing = wh.open_table(name).await?;
    let last = match &existing {
        Some(t) => last_inputs(t).await?,
        None => None,
    };
    if last.as_ref() == Some(&inputs) {
        report.skipped = Some("nothing it reads has changed".into());
        return Ok(report);
    }

    let ctx = warehouse_session_in(wh, schema).await?;
    pin_reads(&ctx, opened).await?;
    register_views(wh, &ctx, views, schema, None).await?;
    for (i, (schema, batches, _)) in files.into_iter().enumerate() {
        let name = strata_sql::files_placeholder(i);
        let table = deltalake::datafusion::datasource::MemTable::try_new(schema, vec![batches])
            .context(|| format!("reading {name}"))?;
        ctx.register_table(name.as_str(), Arc::new(table))
            .context(|| format!("registering {name}"))?;
    }
    let sql = rewrite(wh, &ctx, &mv.query.sql, schema).await?;
    let err = |e: &dyn std::fmt::Display| {
        EngineError::plan_at(format!("materialized view {name}"), mv.location.line, e)
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
                    arrow::describe_fields(&planned)
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
                .map(|f| Field::new(f.name(), arrow::storage_type(f.data_type()), true))
                .collect::<Vec<_>>(),
        )),
    };
    // Every refresh lands right after the view it was computed from, or is a conflict (the
    // scheduler starts it again, and it then finds the view up to date or refreshes it from
    // there). Retried on top of another commit, a refresh would remove only the files it
    // saw: after a concurrent compaction of the view (its removes do not change data, so
    // Delta's conflict check lets them pass) the compacted copy of the old rows would stay
    // beside the new ones, and a view combined from its rows would count them twice.
    let commit = PendingCommit::of_run(run_id)
        .with_info(INPUTS_KEY, inputs.clone())
        .exactly_next();
    if let (Some(view), Some(last)) = (&existing, &last) {
        let grown = replace::Grown {
            last,
            now: &inputs,
            reads,
        };
        // A lost race stays one (the scheduler starts the refresh again); other errors are
        // placed at the view's declaration.
        match from_changes::refresh(wh, &ctx, &df, mv, view, &grown, &schema, &commit)
            .await
            .map_err(|e| if e.is_conflict() { e } else { err(&e) })?
        {
            Ok(r) => {
                return Ok(MvReport {
                    table: report.table,
                    ..r
                })
            }
            Err(why) => {
                tracing::info!(view = %name, why, "recomputing whole");
                report.recomputed_because = Some(why.to_string());
            }
        }
    }
    let rows = collect_as(df, &schema).await.map_err(|e| err(&e))?;
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
            crate::storage::table::check_partition_columns(&schema, &mv.partitioned_by)
                .map_err(|e| EngineError::plan(format!("materialized view {name}: {e}")))?;
            crate::storage::table::create_delta(
                &wh.table_location(name),
                &name.name,
                &schema,
                crate::storage::table::table_configuration(&mv.properties),
                mv.comment.as_deref(),
                mv.partitioned_by.clone(),
            )
            .await?
        }
    };
    write_rows(handle, vec![rows], RowChange::Overwrite, &commit)
        .await
        .context(|| format!("materialized view {name}: committing"))?;
    Ok(report)
}

/// The rows of `df` in the stored `schema`, as one batch.
pub(super) async fn collect_as(df: DataFrame, schema: &SchemaRef) -> Result<RecordBatch> {
    let batches = df
        .collect()
        .await
        .map_err(|e| EngineError::plan(e.to_string()))?;
    let cast = batches
        .iter()
        .map(|b| arrow::cast_batch(b, schema))
        .collect::<Result<Vec<_>>>()?;
    concat_batches(schema, &cast).context(|| "collecting rows".into())
}
