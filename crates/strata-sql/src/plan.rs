//! The dataset graph of a parsed pipeline.
//!
//! Checks what a single statement cannot: that every table a statement names is declared
//! in the pipeline, that no name is declared twice, that the flows agree with each other
//! and with their targets, and that the graph has no cycle. Then orders the work so that
//! everything runs after what it reads.

use crate::ast::*;
use crate::error::{Result, SqlError};
use std::collections::{BTreeMap, BTreeSet};

/// One unit of work in execution order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Run the `AS SELECT` of this streaming table (ingestion).
    Ingest(TableName),
    /// Run this AUTO CDC flow (index into [`PipelinePlan::flows`]).
    Flow(usize),
    /// Refresh this point-in-time table (index into [`PipelinePlan::pits`]); these run after
    /// every ingestion and flow.
    PointInTime(usize),
}

/// A validated pipeline: every referenced table is defined, the graph is acyclic, every
/// flow's options agree with each other. `order` runs a flow after its source.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelinePlan {
    pub tables: BTreeMap<TableName, StreamingTable>,
    pub flows: Vec<CdcFlow>,
    pub pits: Vec<PitTable>,
    pub order: Vec<Node>,
}

fn plan_error(location: Location, message: impl Into<String>) -> SqlError {
    SqlError::Plan {
        location,
        message: message.into(),
    }
}

/// Validates the graph of `pipeline`.
pub fn plan_pipeline(pipeline: Pipeline) -> Result<PipelinePlan> {
    // Statement index of each table and flow: the tie-breaker of the execution order.
    let mut tables: BTreeMap<TableName, StreamingTable> = BTreeMap::new();
    let mut table_stmt: BTreeMap<TableName, usize> = BTreeMap::new();
    let mut flows: Vec<CdcFlow> = Vec::new();
    let mut flow_stmt: Vec<usize> = Vec::new();
    let mut pits: Vec<PitTable> = Vec::new();
    for (i, statement) in pipeline.statements.into_iter().enumerate() {
        match statement {
            Statement::PointInTime(p) => pits.push(p),
            Statement::StreamingTable(t) => {
                if let Some(first) = tables.get(&t.name) {
                    return Err(plan_error(
                        t.location,
                        format!(
                            "table {} is declared twice (first at {})",
                            t.name, first.location
                        ),
                    ));
                }
                table_stmt.insert(t.name.clone(), i);
                tables.insert(t.name.clone(), t);
            }
            Statement::Flow(f) => {
                if let Some(first) = flows.iter().find(|g| g.name == f.name) {
                    return Err(plan_error(
                        f.location,
                        format!(
                            "flow {} is declared twice (first at {})",
                            f.name, first.location
                        ),
                    ));
                }
                flow_stmt.push(i);
                flows.push(f);
            }
        }
    }

    for t in tables.values() {
        if let Some(SourceQuery {
            source: QuerySource::Table(src),
            ..
        }) = &t.query
        {
            if !tables.contains_key(src) {
                return Err(plan_error(
                    t.location,
                    format!(
                        "table {} reads STREAM({src}), which is not declared in this pipeline",
                        t.name
                    ),
                ));
            }
        }
    }

    for (i, f) in flows.iter().enumerate() {
        check_flow(f, &tables)?;
        // Flows into one table share its layout and merge semantics, so they must agree.
        if let Some(other) = flows[..i].iter().find(|g| g.target == f.target) {
            let snapshot = |g: &CdcFlow| matches!(g.kind, FlowKind::Snapshot { .. });
            if snapshot(other) != snapshot(f) {
                return Err(plan_error(
                    f.location,
                    format!(
                        "flows {} and {} cannot share a target: {} is written by both an AUTO CDC \
                         FROM SNAPSHOT flow and a change-event AUTO CDC flow; give each its own table",
                        other.name, f.name, f.target
                    ),
                ));
            }
            if snapshot(f) {
                return Err(plan_error(
                    f.location,
                    format!(
                        "flows {} and {} cannot share a target: {} already receives snapshots from {}; \
                         a snapshot flow must be the only flow into its target",
                        other.name, f.name, f.target, other.name
                    ),
                ));
            }
            if other.stored_as != f.stored_as || !same_keys(&other.keys, &f.keys) {
                return Err(plan_error(
                    f.location,
                    format!(
                        "flows {} and {} both write {} but with different keys or SCD type; \
                         flows into one table must agree on both",
                        other.name, f.name, f.target
                    ),
                ));
            }
        }
    }

    let mut order = order(&tables, &table_stmt, &flows, &flow_stmt)?;
    for (i, p) in pits.iter().enumerate() {
        check_pit(p, &pits[..i], &tables, &flows)?;
        order.push(Node::PointInTime(i));
    }
    Ok(PipelinePlan {
        tables,
        flows,
        pits,
        order,
    })
}

fn check_flow(f: &CdcFlow, tables: &BTreeMap<TableName, StreamingTable>) -> Result<()> {
    let err = |m: String| Err(plan_error(f.location, m));
    match tables.get(&f.target) {
        None => {
            return err(format!(
            "flow {} writes {}, which is not declared; declare it with CREATE STREAMING TABLE {}",
            f.name, f.target, f.target.name
        ))
        }
        Some(t) if t.query.is_some() => {
            return err(format!(
                "flow {} writes {}, but that table is filled by its own AS query; \
                 the target of AUTO CDC must be a streaming table without a query",
                f.name, f.target
            ))
        }
        Some(_) => {}
    }
    if !tables.contains_key(&f.source) {
        return err(format!(
            "flow {} reads {}, which is not declared in this pipeline",
            f.name, f.source
        ));
    }
    if f.keys.is_empty() {
        return err(format!("flow {} has no KEYS", f.name));
    }
    let mut seen = BTreeSet::new();
    for k in &f.keys {
        if !seen.insert(k.to_ascii_lowercase()) {
            return err(format!(
                "flow {}: column {k} is listed twice in KEYS",
                f.name
            ));
        }
    }
    if f.truncate_when.is_some() && f.stored_as == ScdType::Type2 {
        return err(format!(
            "flow {}: APPLY AS TRUNCATE WHEN is supported for SCD type 1 only, not with STORED AS SCD TYPE 2",
            f.name
        ));
    }
    if f.track_history.is_some() && f.stored_as != ScdType::Type2 {
        return err(format!(
            "flow {}: TRACK HISTORY needs STORED AS SCD TYPE 2; {} keeps no versions to track",
            f.name, f.stored_as
        ));
    }
    Ok(())
}

fn check_pit(
    p: &PitTable,
    earlier: &[PitTable],
    tables: &BTreeMap<TableName, StreamingTable>,
    flows: &[CdcFlow],
) -> Result<()> {
    let err = |m: String| Err(plan_error(p.location, m));
    if tables.contains_key(&p.name) || earlier.iter().any(|e| e.name == p.name) {
        return err(format!("table {} is declared twice", p.name));
    }
    if p.keys.is_empty() {
        return err(format!("point-in-time table {} has no KEYS", p.name));
    }
    if p.sources.is_empty() {
        return err(format!("point-in-time table {} reads no table", p.name));
    }
    for (i, s) in p.sources.iter().enumerate() {
        if p.sources[..i].contains(s) {
            return err(format!(
                "point-in-time table {}: {s} is listed twice in FROM",
                p.name
            ));
        }
        let writer = flows.iter().find(|f| &f.target == s);
        match writer {
            Some(f) if f.stored_as.has_timeline() => {}
            Some(f) => {
                return err(format!(
                    "point-in-time table {}: {s} is stored as {} and keeps no history; \
                     FROM takes SCD TYPE 2 or SNAPSHOTS tables",
                    p.name, f.stored_as
                ))
            }
            None => {
                return err(format!(
                    "point-in-time table {} reads {s}, which is not the target of an AUTO CDC \
                     flow of this pipeline",
                    p.name
                ))
            }
        }
    }
    Ok(())
}

/// Keys compare as sets of names, ignoring case (Spark resolves columns that way).
fn same_keys(a: &[String], b: &[String]) -> bool {
    let set =
        |v: &[String]| -> BTreeSet<String> { v.iter().map(|k| k.to_ascii_lowercase()).collect() };
    set(a) == set(b)
}

/// Topological order of the work: a node runs after every node that writes what it reads.
/// Among the nodes that are ready, the one declared first runs first, so the order is
/// deterministic and follows the file where the graph allows.
fn order(
    tables: &BTreeMap<TableName, StreamingTable>,
    table_stmt: &BTreeMap<TableName, usize>,
    flows: &[CdcFlow],
    flow_stmt: &[usize],
) -> Result<Vec<Node>> {
    struct Item {
        node: Node,
        stmt: usize,
        location: Location,
        /// The table this node reads, if any.
        reads: Option<TableName>,
        writes: TableName,
    }
    let mut items: Vec<Item> = Vec::new();
    for t in tables.values() {
        if let Some(q) = &t.query {
            items.push(Item {
                node: Node::Ingest(t.name.clone()),
                stmt: table_stmt.get(&t.name).copied().unwrap_or(usize::MAX),
                location: t.location,
                reads: match &q.source {
                    QuerySource::Table(src) => Some(src.clone()),
                    QuerySource::ReadFiles(_) => None,
                },
                writes: t.name.clone(),
            });
        }
    }
    for (i, f) in flows.iter().enumerate() {
        items.push(Item {
            node: Node::Flow(i),
            stmt: flow_stmt.get(i).copied().unwrap_or(usize::MAX),
            location: f.location,
            reads: Some(f.source.clone()),
            writes: f.target.clone(),
        });
    }
    items.sort_by_key(|it| it.stmt);

    // deps[i]: the items that must run before item i (the writers of what it reads).
    let deps: Vec<Vec<usize>> = items
        .iter()
        .map(|it| {
            items
                .iter()
                .enumerate()
                .filter(|(_, w)| it.reads.as_ref() == Some(&w.writes))
                .map(|(j, _)| j)
                .collect()
        })
        .collect();
    let mut done = vec![false; items.len()];
    let mut order = Vec::with_capacity(items.len());
    while order.len() < items.len() {
        let ready = (0..items.len()).find(|&i| !done[i] && deps[i].iter().all(|&d| done[d]));
        match ready {
            Some(i) => {
                done[i] = true;
                order.push(items[i].node.clone());
            }
            None => {
                // Every node left waits on another node left: follow the waits from the
                // first one until a node repeats, which names one actual cycle.
                let first = (0..items.len()).find(|&i| !done[i]).unwrap_or(0);
                let mut path = vec![first];
                let mut current = first;
                let cycle = loop {
                    let next = deps
                        .get(current)
                        .and_then(|d| d.iter().copied().find(|&j| !done[j]));
                    match next {
                        Some(j) => match path.iter().position(|&p| p == j) {
                            Some(pos) => break path.split_off(pos),
                            None => {
                                path.push(j);
                                current = j;
                            }
                        },
                        None => break path,
                    }
                };
                let names: Vec<String> = cycle
                    .iter()
                    .rev()
                    .map(|&i| match &items[i].node {
                        Node::Ingest(t) => format!("table {t}"),
                        Node::Flow(f) => format!(
                            "flow {}",
                            flows.get(*f).map(|f| f.name.as_str()).unwrap_or("?")
                        ),
                        Node::PointInTime(i) => format!("point-in-time table {i}"),
                    })
                    .collect();
                let location = cycle
                    .iter()
                    .map(|&i| &items[i])
                    .min_by_key(|it| it.stmt)
                    .map(|it| it.location)
                    .unwrap_or_default();
                return Err(plan_error(
                    location,
                    format!(
                        "the pipeline has a cycle: {} -> {} (each reads what the one before writes)",
                        names.join(" -> "),
                        names.first().map(String::as_str).unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(order)
}
