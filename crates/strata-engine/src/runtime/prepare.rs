//! Preparing every node before anything runs: each dataset checked against the schemas it
//! will meet (nothing written yet).

use crate::error::{EngineError, Result};
use crate::ops::ingest::IngestSetup;
use crate::semantics::flow::FlowSetup;
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::datatypes::SchemaRef;
use std::collections::BTreeMap;
use strata_sql::Node;
use strata_sql::PipelinePlan;
use strata_sql::TableName;

/// The schemas of the datasets prepared so far, by table.
pub(crate) type Schemas = BTreeMap<TableName, SchemaRef>;

pub(crate) enum Prepared {
    Ingest(Box<IngestSetup>),
    Flow(Box<FlowSetup>),
    /// Waits for input: its schema cannot be known yet.
    Waiting(String),
    PointInTime(usize),
    MaterializedView(TableName),
}

/// Prepares an ingestion node (a streaming table's query or an append flow) with `known`,
/// the schemas of the datasets prepared before it.
pub(crate) async fn prepare_ingestion(
    context: &crate::ops::ingest::PipelineContext<'_>,
    node: &Node,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Prepared> {
    let plan = context.plan;
    let (table, append) = match node {
        Node::Ingest(name) => (
            plan.tables
                .get(name)
                .ok_or_else(|| EngineError::Internal(format!("planned table {name} is missing")))?,
            None,
        ),
        Node::Append(i) => {
            let f = plan.appends.get(*i).ok_or_else(|| {
                EngineError::Internal(format!("planned append flow {i} is missing"))
            })?;
            let table = plan.tables.get(&f.target).ok_or_else(|| {
                EngineError::Internal(format!("planned table {} is missing", f.target))
            })?;
            (table, Some(f))
        }
        other => {
            return Err(EngineError::Internal(format!(
                "{other:?} is not an ingestion"
            )))
        }
    };
    Ok(
        match crate::ops::ingest::prepare_ingest(context, table, append, known).await? {
            Ok(setup) => Prepared::Ingest(Box::new(setup)),
            Err(waits) => Prepared::Waiting(match append {
                None => format!("{}: {waits}", table.name),
                Some(f) => format!("flow {}: {waits}", f.name),
            }),
        },
    )
}

/// Gives an ingestion the flows that read its table: its rows are checked against them
/// before each commit.
pub(crate) fn with_downstream(p: &mut Prepared, flows: &[FlowSetup]) {
    if let Prepared::Ingest(setup) = p {
        setup.downstream = flows
            .iter()
            .filter(|f| f.flow.source == setup.table.name)
            .cloned()
            .collect();
    }
}

/// Every table a materialized view or view reads is declared in the pipeline or exists in
/// the warehouse.
pub(crate) async fn check_batch_reads(wh: &Warehouse, plan: &PipelinePlan) -> Result<()> {
    let queries = plan
        .materialized
        .values()
        .map(|m| {
            (
                format!("materialized view {}", m.name),
                m.location,
                &m.query.reads,
            )
        })
        .chain(
            plan.views
                .values()
                .map(|v| (format!("view {}", v.name), v.location, &v.query.reads)),
        )
        .chain(plan.tables.values().filter_map(|t| {
            let q = t.query.as_ref()?;
            Some((format!("streaming table {}", t.name), t.location, &q.reads))
        }))
        .chain(
            plan.appends
                .iter()
                .map(|f| (format!("flow {}", f.name), f.location, &f.query.reads)),
        );
    for (what, at, reads) in queries {
        for t in reads {
            let declared = plan.tables.contains_key(t)
                || plan.materialized.contains_key(t)
                || plan.views.contains_key(t)
                || plan.pits.iter().any(|p| &p.name == t);
            if !declared && wh.open_table(t).await?.is_none() {
                return Err(EngineError::Plan(format!(
                    "{what} (line {}) reads {t}, which is neither declared in the pipeline nor a \
                     table of the warehouse",
                    at.line
                )));
            }
        }
    }
    Ok(())
}
