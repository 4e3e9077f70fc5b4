//! A plan's dataset graph: one node per table a step writes (labelled with what the step
//! does) and per input it reads from outside the pipeline (files, databases, tables of other
//! pipelines), one edge per read. `strata plan --format dot | mermaid` and the web page of
//! `strata serve --http` draw it.

use crate::load::sources::PlanStep;
use std::collections::BTreeMap;

/// One dataset or outside input of a [`DatasetGraph`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GraphNode {
    /// The dataset (`default.users`) or the input as the plan names it (`files data/cdc`).
    pub name: String,
    /// The name and, for a written dataset, what its step does, on a second line.
    pub label: String,
    /// Written by a step of the pipeline (else an input read from outside it).
    pub written: bool,
}

/// One read: `from` is read by step `step` (`auto_cdc users_flow`), which writes `to`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GraphEdge {
    pub from: String,
    pub to: String,
    pub step: String,
}

/// The nodes in first-seen order and the edges in step order.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct DatasetGraph {
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
}

impl DatasetGraph {
    /// The graph of `steps` (a plan's steps in execution order).
    pub fn of(steps: &[PlanStep]) -> DatasetGraph {
        let mut nodes: Vec<GraphNode> = Vec::new();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        let mut add = |name: &str, label: String, written: bool| match index.get(name) {
            Some(&i) if written => {
                // A table written by a step: its writer's label wins over a bare read.
                nodes[i] = GraphNode {
                    name: name.to_string(),
                    label,
                    written,
                };
            }
            Some(_) => {}
            None => {
                index.insert(name.to_string(), nodes.len());
                nodes.push(GraphNode {
                    name: name.to_string(),
                    label,
                    written,
                });
            }
        };
        let mut edges = Vec::new();
        for step in steps {
            for read in &step.reads {
                add(read, read.clone(), false);
                edges.push(GraphEdge {
                    from: read.clone(),
                    to: step.writes.clone(),
                    step: format!("{} {}", step.kind, step.name),
                });
            }
            add(
                &step.writes,
                format!("{}\n{}", step.writes, step.detail),
                true,
            );
        }
        DatasetGraph { nodes, edges }
    }

    /// The position of each node in [`DatasetGraph::nodes`], by name.
    pub fn index(&self) -> BTreeMap<&str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &'static str, name: &str, reads: &[&str], writes: &str) -> PlanStep {
        PlanStep {
            kind,
            name: name.into(),
            detail: format!("{kind} step"),
            reads: reads.iter().map(|r| r.to_string()).collect(),
            writes: writes.into(),
            origin: "p.sql:1:1".into(),
        }
    }

    #[test]
    fn a_node_per_dataset_and_input_an_edge_per_read_writers_label_wins() {
        let steps = vec![
            step("ingest", "default.raw", &["files data/cdc"], "default.raw"),
            step(
                "auto_cdc",
                "f",
                &["default.raw", "default.dim"],
                "default.users",
            ),
            step("ingest", "default.dim", &["files data/dim"], "default.dim"),
        ];
        let g = DatasetGraph::of(&steps);
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "files data/cdc",
                "default.raw",
                "default.dim",
                "default.users",
                "files data/dim"
            ]
        );
        // default.dim was first seen as a read; its writer's label replaced the bare name.
        assert_eq!(g.nodes[2].label, "default.dim\ningest step");
        assert!(g.nodes[2].written);
        assert!(!g.nodes[0].written);
        assert_eq!(g.edges.len(), 4);
        assert_eq!(
            g.edges[1],
            GraphEdge {
                from: "default.raw".into(),
                to: "default.users".into(),
                step: "auto_cdc f".into()
            }
        );
        assert_eq!(g.index()["default.users"], 3);
    }
}
