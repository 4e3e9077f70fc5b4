//! The dataset graph of `strata plan --format dot | mermaid`: one node per table a step
//! writes (labelled with what the step does) and per input it reads from outside the
//! pipeline (files, databases, tables of other pipelines), one edge per read.

use std::collections::BTreeMap;
use strata_engine::PlanStep;

/// The nodes of the graph in first-seen order: name → (label, written by a step).
fn nodes(steps: &[PlanStep]) -> Vec<(String, String, bool)> {
    let mut out: Vec<(String, String, bool)> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut add = |name: &str, label: String, written: bool| match index.get(name) {
        Some(&i) if written => {
            // A table written by a step: its writer's label wins over a bare read.
            out[i] = (name.to_string(), label, true);
        }
        Some(_) => {}
        None => {
            index.insert(name.to_string(), out.len());
            out.push((name.to_string(), label, written));
        }
    };
    for step in steps {
        for read in &step.reads {
            add(read, read.clone(), false);
        }
        add(
            &step.writes,
            format!("{}\n{}", step.writes, step.detail),
            true,
        );
    }
    out
}

/// Graphviz: `strata plan p.sql --format dot | dot -Tsvg > plan.svg`.
pub fn dot(steps: &[PlanStep]) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::from("digraph pipeline {\n  rankdir=LR;\n  node [shape=box];\n");
    for (name, label, written) in nodes(steps) {
        let shape = if written { "" } else { ", shape=note" };
        out.push_str(&format!(
            "  {} [label={}{shape}];\n",
            quote(&name),
            quote(&label).replace('\n', "\\n")
        ));
    }
    for step in steps {
        for read in &step.reads {
            out.push_str(&format!(
                "  {} -> {} [label={}];\n",
                quote(read),
                quote(&step.writes),
                quote(&format!("{} {}", step.kind, step.name))
            ));
        }
    }
    out.push_str("}\n");
    out
}

/// Mermaid (renders in GitHub and GitLab markdown inside a ```mermaid block).
pub fn mermaid(steps: &[PlanStep]) -> String {
    let text = |s: &str| s.replace('"', "#quot;").replace('\n', "<br/>");
    let nodes = nodes(steps);
    let id: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| (name.as_str(), i))
        .collect();
    let mut out = String::from("flowchart LR\n");
    for (i, (_, label, written)) in nodes.iter().enumerate() {
        let (open, close) = if *written { ("[", "]") } else { ("[/", "/]") };
        out.push_str(&format!("  n{i}{open}\"{}\"{close}\n", text(label)));
    }
    for step in steps {
        for read in &step.reads {
            out.push_str(&format!(
                "  n{} -->|\"{} {}\"| n{}\n",
                id[read.as_str()],
                text(step.kind),
                text(&step.name),
                id[step.writes.as_str()]
            ));
        }
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
