//! Running one prepared node of the plan and filling its event-log record.

use crate::error::{EngineError, Result};
use crate::ops::cdc::FlowReport;
use crate::ops::ingest::IngestReport;
use crate::ops::mview::{MvReport, Refresh};
use crate::ops::pit::PitReport;
use crate::ops::sink::SinkReport;
use crate::ops::Scope;
use crate::runtime::event_log::EventRecord;
use crate::runtime::event_log::Status;
use crate::runtime::options::RunReport;
use crate::runtime::prepare::Prepared;
use std::collections::BTreeSet;
use strata_sql::Node;
use strata_sql::PipelinePlan;
use strata_sql::TableName;

/// What one node run adds to the run's report.
pub(crate) enum NodeOutput {
    Ingest(IngestReport),
    Flow(FlowReport),
    Waiting(String),
    PointInTime(PitReport),
    View(MvReport),
    /// A node writing a PostgreSQL sink, and the delivery after it.
    Delivered(Box<NodeOutput>, SinkReport),
}

impl NodeOutput {
    pub(crate) fn add_to(self, report: &mut RunReport) {
        match self {
            NodeOutput::Ingest(r) => report.ingests.push(r),
            NodeOutput::Flow(r) => report.flows.push(r),
            NodeOutput::Waiting(w) => report.waiting.push(w),
            NodeOutput::PointInTime(r) => report.pits.push(r),
            NodeOutput::View(r) => report.views.push(r),
            NodeOutput::Delivered(node, sink) => {
                node.add_to(report);
                report.sinks.push(sink);
            }
        }
    }
}

/// Runs one prepared node `node`, filling `record` with what it did; a node writing a
/// PostgreSQL sink then delivers it ([`crate::ops::sink`]), also when it had nothing new
/// (an earlier run may have stopped between the outbox's commit and the delivery).
pub(crate) async fn run_node(
    scope: &Scope<'_>,
    plan: &PipelinePlan,
    node: &Node,
    p: &Prepared,
    declared: &BTreeSet<TableName>,
    record: &mut EventRecord,
) -> Result<NodeOutput> {
    let output = run_prepared(scope, plan, p, declared, record).await?;
    let sink = plan
        .writes(node)
        .and_then(|t| plan.tables.get(&t))
        .filter(|t| crate::ops::sink::database_sink(t).is_some());
    let Some(sink) = sink else {
        return Ok(output);
    };
    tracing::info!(sink = %sink.name, "delivering sink");
    let delivered = crate::ops::sink::deliver(scope, plan, sink).await?;
    let line = delivered.summary();
    record.message = Some(match record.message.take() {
        Some(m) => format!("{m}; {line}"),
        None => line,
    });
    Ok(NodeOutput::Delivered(Box::new(output), delivered))
}

/// Runs one prepared node, filling `record` with what it did.
async fn run_prepared(
    scope: &Scope<'_>,
    plan: &PipelinePlan,
    p: &Prepared,
    declared: &BTreeSet<TableName>,
    record: &mut EventRecord,
) -> Result<NodeOutput> {
    Ok(match p {
        Prepared::Ingest(setup) => {
            tracing::info!(table = %setup.table.name, flow = setup.flow_name(), "ingesting");
            let r = crate::ops::ingest::run_ingest(scope, setup).await?;
            record.rows_read = r.rows_read;
            record.rows_written = r.rows;
            record.rows_dropped = r.rows_dropped;
            record.expectations = r.expectations.clone();
            skipped_or(record, &r.skipped, || {
                let mut m = match (r.once, r.files.len()) {
                    (true, 0) => format!("{} row(s) appended (once flow)", r.rows),
                    (true, n) => format!("{n} file(s), {} row(s) appended (once flow)", r.rows),
                    (false, n) => format!("{n} file(s), {} row(s) appended", r.rows),
                };
                for n in &r.notes {
                    m.push_str("; ");
                    m.push_str(n);
                }
                m
            });
            NodeOutput::Ingest(r)
        }
        Prepared::Flow(setup) => {
            tracing::info!(flow = %setup.flow.name, "running flow");
            let props = plan
                .tables
                .get(&setup.flow.target)
                .map(|t| t.properties.clone())
                .unwrap_or_default();
            let r = crate::ops::cdc::run_flow(scope, setup, &props).await?;
            record.rows_read = r.events;
            record.rows_written = r.rows_written;
            record.rows_upserted = r.keys_upserted;
            record.rows_deleted = r.keys_deleted;
            record.versions_opened = r.versions_opened;
            record.versions_closed = r.versions_closed;
            skipped_or(record, &r.skipped, || {
                let mut m = format!(
                    "{} event(s), {} key(s) touched, {} changed",
                    r.events, r.keys_touched, r.keys_changed
                );
                for n in &r.notes {
                    m.push_str("; ");
                    m.push_str(n);
                }
                m
            });
            NodeOutput::Flow(r)
        }
        Prepared::Ran(report, _) => {
            record.status = Status::Skipped;
            record.message = report.skipped.clone();
            NodeOutput::Ingest(report.as_ref().clone())
        }
        Prepared::Waiting(why) => {
            record.status = Status::Skipped;
            record.message = Some(why.clone());
            NodeOutput::Waiting(why.clone())
        }
        Prepared::PointInTime(i) => {
            let pit = plan.pits.get(*i).ok_or_else(|| {
                EngineError::internal(format!("planned point-in-time table {i} is missing"))
            })?;
            tracing::info!(table = %pit.name, "refreshing point-in-time table");
            let r = crate::ops::pit::refresh(scope, pit, &plan.default_schema).await?;
            record.rows_written = r.rows;
            skipped_or(record, &r.skipped, || {
                format!(
                    "{} as-of value(s) computed ({} recomputed), {} removed",
                    r.computed, r.recomputed, r.removed
                )
            });
            NodeOutput::PointInTime(r)
        }
        Prepared::MaterializedView(name) => {
            let mv = plan.materialized.get(name).ok_or_else(|| {
                EngineError::internal(format!("planned materialized view {name} is missing"))
            })?;
            tracing::info!(table = %name, "refreshing materialized view");
            let reads = plan.reads(&Node::MaterializedView(name.clone()));
            let files = read_view_files(mv, scope.dir).await?;
            let r = crate::ops::mview::refresh(
                scope,
                mv,
                &plan.views,
                &reads,
                declared,
                &plan.default_schema,
                files,
            )
            .await?;
            record.rows_read = r.rows_read;
            record.rows_written = r.rows;
            record.rows_dropped = r.rows_dropped;
            record.expectations = r.expectations.clone();
            skipped_or(record, &r.skipped, || match r.refresh {
                Refresh::Recomputed => match &r.recomputed_because {
                    Some(why) => format!("{} row(s), recomputed because {why}", r.rows),
                    None => format!("{} row(s)", r.rows),
                },
                Refresh::Appended => format!("{} row(s) appended (incremental)", r.rows),
                Refresh::Combined => format!(
                    "{} group(s) of new rows combined into {} row(s) (incremental)",
                    r.rows_read, r.rows
                ),
                Refresh::Regrouped => format!(
                    "{} group(s) touched by changed rows recomputed, {} row(s) (incremental)",
                    r.rows_read, r.rows
                ),
                Refresh::Rejoined => format!(
                    "{} join key(s) of changed rows recomputed, {} row(s) (incremental)",
                    r.rows_read, r.rows
                ),
            });
            NodeOutput::View(r)
        }
    })
}

fn skipped_or(record: &mut EventRecord, skipped: &Option<String>, done: impl FnOnce() -> String) {
    match skipped {
        Some(why) => {
            record.status = Status::Skipped;
            record.message = Some(why.clone());
        }
        None => record.message = Some(done()),
    }
}

/// One line for a progress display.
pub(crate) fn summary(r: &EventRecord) -> String {
    match (r.status, &r.message) {
        (Status::Failed, _) => "FAILED".to_string(),
        (_, Some(m)) => m.clone(),
        (s, None) => s.as_str().to_string(),
    }
}

/// Every file a materialized view's query reads, read now (relative to the pipeline's
/// folder `dir`), or the path of the first that has no file yet.
async fn read_view_files(
    mv: &strata_sql::MaterializedView,
    dir: &std::path::Path,
) -> Result<crate::ops::mview::FileInputs> {
    let mut out = Vec::with_capacity(mv.query.files.len());
    for read in &mv.query.files {
        match crate::ops::ingest::read_batch_files(read, dir).await? {
            Some(taken) => out.push(taken),
            None => return Ok(Err(read.spec.path.clone())),
        }
    }
    Ok(Ok(out))
}
