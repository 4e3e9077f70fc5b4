//! Which nodes a run runs: `--select NAME[+]`, and the tables a `--full-refresh` rebuilds.

use crate::error::{EngineError, Result};
use crate::runtime::options::Selection;
use std::collections::BTreeSet;
use strata_sql::{Node, PipelinePlan, TableName};

/// `schema.name` or `name` (in `default_schema`) as a table name.
fn parse_table_name(s: &str, default_schema: &str) -> TableName {
    TableName::parse(s, default_schema).unwrap_or_else(|_| match s.split_once('.') {
        Some((schema, name)) => TableName::new(Some(schema), name),
        None => TableName::new(Some(default_schema), s),
    })
}

/// The nodes that read, directly or not, what `start` writes (`start` included).
fn downstream(plan: &PipelinePlan, start: Vec<Node>) -> BTreeSet<usize> {
    let index = |n: &Node| plan.order.iter().position(|m| m == n);
    let mut out: BTreeSet<usize> = start.iter().filter_map(index).collect();
    // The order is topological: one pass in order reaches everything downstream.
    for (i, node) in plan.order.iter().enumerate() {
        let reads = plan.reads(node);
        let feeds_on_selected = out.iter().any(|&j| {
            plan.writes(&plan.order[j])
                .is_some_and(|w| reads.contains(&w))
        });
        if feeds_on_selected {
            out.insert(i);
        }
    }
    out
}

/// The nodes a `--select` runs (every node without one).
pub(crate) fn select(plan: &PipelinePlan, selection: Option<&Selection>) -> Result<Vec<Node>> {
    let Some(sel) = selection else {
        return Ok(plan.order.clone());
    };
    let table = parse_table_name(&sel.name, &plan.default_schema);
    let direct: Vec<Node> = plan
        .order
        .iter()
        .filter(|n| {
            plan.writes(n).as_ref() == Some(&table)
                || match n {
                    Node::Flow(i) => plan.flows.get(*i).is_some_and(|f| f.name == sel.name),
                    Node::Append(i) => plan.appends.get(*i).is_some_and(|f| f.name == sel.name),
                    _ => false,
                }
        })
        .cloned()
        .collect();
    if direct.is_empty() {
        return Err(EngineError::NotFound(format!(
            "--select {}: the pipeline has no dataset or flow named {}",
            sel.name, sel.name
        )));
    }
    if !sel.downstream {
        return Ok(direct);
    }
    Ok(downstream(plan, direct)
        .into_iter()
        .map(|i| plan.order[i].clone())
        .collect())
}

/// The stored tables a full refresh rebuilds: all of them, or the named ones and every
/// table that reads them (whose progress through them would no longer mean anything).
pub(crate) fn refresh_set(plan: &PipelinePlan, names: &[String]) -> Result<Vec<TableName>> {
    let start: Vec<Node> = if names.is_empty() {
        plan.order.clone()
    } else {
        let mut start = Vec::new();
        for n in names {
            let t = parse_table_name(n, &plan.default_schema);
            let writers: Vec<Node> = plan
                .order
                .iter()
                .filter(|node| plan.writes(node).as_ref() == Some(&t))
                .cloned()
                .collect();
            if writers.is_empty() && !plan.tables.contains_key(&t) {
                return Err(EngineError::NotFound(format!(
                    "--full-refresh {n}: the pipeline has no table {t}"
                )));
            }
            start.extend(writers);
        }
        start
    };
    let mut tables: Vec<TableName> = downstream(plan, start)
        .into_iter()
        .filter_map(|i| plan.writes(&plan.order[i]))
        .collect();
    for n in names {
        tables.push(parse_table_name(n, &plan.default_schema));
    }
    // An AUTO CDC ONCE flow's backfill runs again when its target is refreshed: its
    // private staging table is refreshed with it.
    let staging: Vec<TableName> = plan
        .flows
        .iter()
        .filter(|f| f.once && tables.contains(&f.target))
        .map(|f| f.source.clone())
        .collect();
    tables.extend(staging);
    tables.sort();
    tables.dedup();
    Ok(tables)
}
