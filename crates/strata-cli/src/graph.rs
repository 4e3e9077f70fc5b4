//! The dataset graph of `strata plan --format dot | mermaid`: one node per table a step
//! writes (labelled with what the step does) and per input it reads from outside the
//! pipeline (files, databases, tables of other pipelines), one edge per read.

use strata_engine::{DatasetGraph, PlanStep};

/// Graphviz: `strata plan p.sql --format dot | dot -Tsvg > plan.svg`.
pub fn dot(steps: &[PlanStep]) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("digraph pipeline {\n  rankdir=LR;\n  node [shape=box];\n");
    let graph = DatasetGraph::of(steps);
    for node in &graph.nodes {
        let shape = if node.written { "" } else { ", shape=note" };
        out.push_str(&format!(
            "  {} [label={}{shape}];\n",
            quote(&node.name),
            quote(&node.label).replace('\n', "\\n")
        ));
    }
    for edge in &graph.edges {
        out.push_str(&format!(
            "  {} -> {} [label={}];\n",
            quote(&edge.from),
            quote(&edge.to),
            quote(&edge.step)
        ));
    }
    out.push_str("}\n");
    out
}

/// Mermaid (renders in GitHub and GitLab markdown inside a ```mermaid block).
pub fn mermaid(steps: &[PlanStep]) -> String {
    let text = |s: &str| s.replace('"', "#quot;").replace('\n', "<br/>");
    let graph = DatasetGraph::of(steps);
    let id = graph.index();
    let mut out = String::from("flowchart LR\n");
    for (i, node) in graph.nodes.iter().enumerate() {
        let (open, close) = if node.written {
            ("[", "]")
        } else {
            ("[/", "/]")
        };
        out.push_str(&format!("  n{i}{open}\"{}\"{close}\n", text(&node.label)));
    }
    for edge in &graph.edges {
        out.push_str(&format!(
            "  n{} -->|\"{}\"| n{}\n",
            id[edge.from.as_str()],
            text(&edge.step),
            id[edge.to.as_str()]
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps() -> Vec<PlanStep> {
        vec![
            PlanStep {
                kind: "ingest",
                name: "default.raw".into(),
                detail: "streaming table from read_files (json)".into(),
                reads: vec!["files data/cdc".into()],
                writes: "default.raw".into(),
                origin: "p.sql:1:1".into(),
            },
            PlanStep {
                kind: "auto_cdc",
                name: "f".into(),
                detail: "AUTO CDC flow, SCD TYPE 2, keys (id), sequence by \"seq\"".into(),
                reads: vec!["default.raw".into()],
                writes: "default.users".into(),
                origin: "p.sql:3:1".into(),
            },
        ]
    }

    #[test]
    fn dot_has_a_node_per_dataset_and_input_and_an_edge_per_read() {
        let d = dot(&steps());
        assert!(d.starts_with("digraph pipeline {"));
        assert!(d.contains("\"files data/cdc\" [label=\"files data/cdc\", shape=note];"));
        assert!(d.contains("\"default.raw\" -> \"default.users\" [label=\"auto_cdc f\"];"));
        assert!(d.contains("sequence by \\\"seq\\\""), "{d}");
        assert_eq!(d.matches(" -> ").count(), 2);
    }

    #[test]
    fn mermaid_names_nodes_by_index_and_escapes_quotes() {
        let m = mermaid(&steps());
        assert!(m.starts_with("flowchart LR\n"));
        assert!(m.contains("  n0[/\"files data/cdc\"/]\n"), "{m}");
        assert!(m.contains("n1 -->|\"auto_cdc f\"| n2"), "{m}");
        assert!(m.contains("#quot;seq#quot;"), "{m}");
    }
}
