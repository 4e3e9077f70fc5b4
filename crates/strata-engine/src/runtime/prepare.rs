//! Preparing every node before anything runs: each dataset checked against the schemas it
//! will meet, in the plan's order (each sees the schemas of the datasets before it);
//! nothing is written yet.

use crate::error::{EngineError, Result};
use crate::ops::ingest::{IngestReport, IngestSetup, PipelineContext, Readiness};
use crate::runtime::retry::FlowRetry;
use crate::semantics::flow::FlowSetup;
use crate::storage::warehouse::Warehouse;
use deltalake::arrow::datatypes::SchemaRef;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use strata_sql::{FlowKind, Node, PipelinePlan, TableName};

/// The schemas of the datasets prepared so far, by table.
pub(crate) type Schemas = BTreeMap<TableName, SchemaRef>;

/// A node checked and ready to run.
pub(crate) enum Prepared {
    Ingest(Box<IngestSetup>),
    Flow(Box<FlowSetup>),
    /// Waits for input: its schema cannot be known yet.
    Waiting(String),
    /// A once flow that already ran: its skipped run, and its target's columns.
    Ran(Box<IngestReport>, SchemaRef),
    PointInTime(usize),
    MaterializedView(TableName),
}

/// One node of the plan, prepared.
pub(crate) struct PreparedNode {
    pub(crate) node: Node,
    pub(crate) prepared: Prepared,
    /// An ingestion's: the schemas it was prepared with, so that a retry prepares it the
    /// same way.
    pub(crate) known: Option<Schemas>,
}

/// Every node of a plan, prepared, and what their runs share.
pub(crate) struct PreparedPlan<'a> {
    pub(crate) plan: &'a PipelinePlan,
    /// The pipeline file as the user named it (for the commands errors suggest).
    pub(crate) pipeline: &'a str,
    /// The pipeline's folder (`read_files` paths are relative to it).
    pub(crate) dir: &'a Path,
    pub(crate) nodes: Vec<PreparedNode>,
    /// Every AUTO CDC flow, prepared: each ingestion checks its rows against those that
    /// read its table.
    pub(crate) flows: Vec<FlowSetup>,
    /// The AUTO CDC targets (streamed through their change feed).
    pub(crate) feeds: BTreeSet<TableName>,
    /// Every dataset the pipeline declares (a materialized view may read one that does not
    /// exist yet).
    pub(crate) declared: BTreeSet<TableName>,
}

impl<'a> PreparedPlan<'a> {
    /// What ingestions are prepared against.
    pub(crate) fn context(&'a self, wh: &'a Warehouse) -> PipelineContext<'a> {
        PipelineContext {
            wh,
            plan: self.plan,
            dir: self.dir,
            feeds: &self.feeds,
            pipeline: self.pipeline,
        }
    }
}

/// Checks the whole plan against the warehouse and prepares each node in order.
pub(crate) async fn prepare_all<'a>(
    wh: &Warehouse,
    plan: &'a PipelinePlan,
    pipeline: &'a str,
    dir: &'a Path,
    retry: &FlowRetry<'_>,
) -> Result<PreparedPlan<'a>> {
    check_batch_reads(wh, plan).await?;
    let properties = (plan.tables.iter().map(|(n, t)| (n, &t.properties)))
        .chain(plan.materialized.iter().map(|(n, m)| (n, &m.properties)))
        .chain(plan.pits.iter().map(|p| (&p.name, &p.properties)));
    for (name, props) in properties {
        crate::storage::write::check_parquet_properties(name, props)?;
    }
    let mut prepared = PreparedPlan {
        plan,
        pipeline,
        dir,
        nodes: Vec::new(),
        flows: Vec::new(),
        feeds: plan.flows.iter().map(|f| f.target.clone()).collect(),
        declared: plan
            .tables
            .keys()
            .chain(plan.materialized.keys())
            .cloned()
            .chain(plan.pits.iter().map(|p| p.name.clone()))
            .collect(),
    };
    let mut schemas = Schemas::new();
    for node in &plan.order {
        let (p, known) = match node {
            Node::Ingest(_) | Node::Append(_) => {
                let p = prepare_with_retries(&prepared.context(wh), node, &schemas, retry).await?;
                let known = schemas.clone();
                match &p {
                    Prepared::Ingest(setup) => {
                        // A streaming table's own query defines its columns; an append
                        // flow's only when nothing before it did.
                        let own = setup.append_flow.is_none();
                        let name = setup.table.name.clone();
                        if own || !schemas.contains_key(&name) {
                            schemas.insert(name, setup.schema.clone());
                        }
                    }
                    // A once flow that ran made its target: the table has the columns.
                    Prepared::Ran(_, schema) => {
                        if let Some(target) = plan.writes(node) {
                            schemas.entry(target).or_insert_with(|| schema.clone());
                        }
                    }
                    _ => {}
                }
                (p, Some(known))
            }
            Node::PointInTime(i) => (Prepared::PointInTime(*i), None),
            Node::MaterializedView(name) => (Prepared::MaterializedView(name.clone()), None),
            Node::Flow(i) => (
                prepare_flow_node(wh, plan, &prepared.feeds, *i, &mut schemas).await?,
                None,
            ),
        };
        prepared.nodes.push(PreparedNode {
            node: node.clone(),
            prepared: p,
            known,
        });
    }
    prepared.flows = prepared
        .nodes
        .iter()
        .filter_map(|n| match &n.prepared {
            Prepared::Flow(f) => Some(f.as_ref().clone()),
            _ => None,
        })
        .collect();
    let flows = prepared.flows.clone();
    for n in prepared.nodes.iter_mut() {
        with_downstream(&mut n.prepared, &flows);
    }
    Ok(prepared)
}

/// [`prepare_ingestion`], tried again after a transient failure (a database that refused
/// the connection its schema is read through) as the pipeline's flow retries allow.
async fn prepare_with_retries(
    context: &PipelineContext<'_>,
    node: &Node,
    schemas: &Schemas,
    retry: &FlowRetry<'_>,
) -> Result<Prepared> {
    let started = chrono::Utc::now();
    let mut tries = 1;
    loop {
        match prepare_ingestion(context, node, schemas).await {
            Err(e) => {
                let record = retry.record(context.plan, node, started);
                if !retry.again(tries, &e, record).await {
                    return Err(e);
                }
                tries += 1;
            }
            ok => return ok,
        }
    }
}

/// Prepares AUTO CDC flow `i` against its source's schema (its change feed's for a target
/// it streams from) and its existing event store and target; the flow's target schema is
/// added to `schemas`.
async fn prepare_flow_node(
    wh: &Warehouse,
    plan: &PipelinePlan,
    feeds: &BTreeSet<TableName>,
    i: usize,
    schemas: &mut Schemas,
) -> Result<Prepared> {
    let f = plan
        .flows
        .get(i)
        .ok_or_else(|| EngineError::internal(format!("planned flow {i} is missing")))?;
    let table_mode = matches!(f.kind, FlowKind::Snapshot { version_by: None });
    let feed = feeds.contains(&f.source) && !table_mode;
    let Some(source) = schemas.get(&f.source) else {
        return Ok(Prepared::Waiting(format!(
            "flow {}: its source {} has no schema yet",
            f.name, f.source
        )));
    };
    let source = match feed {
        true => crate::storage::feed::feed_schema(source),
        false => source.clone(),
    };
    let target = plan.tables.get(&f.target);
    let props = target.map(|t| t.properties.clone()).unwrap_or_default();
    let declared = target.and_then(|t| t.columns.as_deref());
    let mut setup = crate::ops::cdc::prepare_flow(f, &source, &props, declared).await?;
    setup.target_comment = target.and_then(|t| t.comment.clone());
    setup.target_partitions = target.map(|t| t.partitioned_by.clone()).unwrap_or_default();
    setup.source_feed = feed;
    crate::ops::cdc::check_existing(wh, &setup).await?;
    if let Some(prev) = schemas.get(&f.target) {
        if prev.fields() != setup.target_schema.fields() {
            return Err(EngineError::plan(format!(
                "flow {}: produces different columns for {} than another flow into it",
                f.name, f.target
            )));
        }
    }
    schemas.insert(f.target.clone(), setup.target_schema.clone());
    Ok(Prepared::Flow(Box::new(setup)))
}

/// Prepares an ingestion node (a streaming table's query or an append flow) with `known`,
/// the schemas of the datasets prepared before it.
pub(crate) async fn prepare_ingestion(
    context: &PipelineContext<'_>,
    node: &Node,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Prepared> {
    let plan = context.plan;
    let (table, append) = match node {
        Node::Ingest(name) => (
            plan.tables
                .get(name)
                .ok_or_else(|| EngineError::internal(format!("planned table {name} is missing")))?,
            None,
        ),
        Node::Append(i) => {
            let f = plan.appends.get(*i).ok_or_else(|| {
                EngineError::internal(format!("planned append flow {i} is missing"))
            })?;
            let table = plan.tables.get(&f.target).ok_or_else(|| {
                EngineError::internal(format!("planned table {} is missing", f.target))
            })?;
            (table, Some(f))
        }
        other => {
            return Err(EngineError::internal(format!(
                "{other:?} is not an ingestion"
            )))
        }
    };
    Ok(
        match crate::ops::ingest::prepare_ingest(context, table, append, known).await? {
            Readiness::Ready(setup) => Prepared::Ingest(setup),
            Readiness::Waiting(waits) => Prepared::Waiting(match append {
                None => format!("{}: {waits}", table.name),
                Some(f) => format!("flow {}: {waits}", f.name),
            }),
            Readiness::Ran(report, schema) => Prepared::Ran(report, schema),
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
                return Err(EngineError::plan_does(
                    what,
                    at.line,
                    format!(
                        "reads {t}, which is neither declared in the pipeline nor a table of \
                         the warehouse"
                    ),
                ));
            }
        }
    }
    Ok(())
}
