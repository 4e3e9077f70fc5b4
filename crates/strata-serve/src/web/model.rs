//! The pages' model (pure): plain values built from the event log's records, the pipelines'
//! dataset graphs and a table's metadata, with the graph laid out for drawing. Gathering
//! them ([`super::gather`]), rendering ([`super::render`]) and HTTP ([`super`]) are apart.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use strata_engine::{DatasetGraph, LoggedEvent};

/// How many runs of each pipeline the overview shows.
pub const RUNS_SHOWN: usize = 5;

/// The overview page: every pipeline the event log records, with its graph and last runs.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// The warehouse's location.
    pub warehouse: String,
    /// The event log's Delta version (`None`: no run recorded yet): the page reloads when
    /// it changes.
    pub event_log_version: Option<i64>,
    pub pipelines: Vec<PipelineView>,
    /// Every table of the warehouse (`schema.name`).
    pub tables: Vec<String>,
}

/// One pipeline: its graph and its last runs, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineView {
    /// The pipeline as `strata run` was given it (its path).
    pub pipeline: String,
    pub graph: GraphView,
    /// Why the graph holds only the datasets the event log names (the pipeline could not
    /// be planned here), if it does.
    pub graph_note: Option<String>,
    pub runs: Vec<RunView>,
}

/// One run: a record per dataset or flow, and the run's own records (retries, its outcome,
/// undelivered notifications).
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub run_id: String,
    /// When its first record's node started.
    pub started: String,
    /// The outcome record's status when the run has one (retries or notifications set),
    /// else `FAILED` when any record failed, else `COMPLETED` (also while a run is still in
    /// progress: the event log holds no record of a run until its first dataset ends, and
    /// none saying it ended unless retries or notifications are set).
    pub status: String,
    pub datasets: Vec<LoggedEvent>,
    pub run_records: Vec<LoggedEvent>,
}

/// A dataset graph laid out left to right: inputs in the first column, each dataset one
/// column right of the furthest dataset it reads.
#[derive(Debug, Clone, Serialize, Default)]
pub struct GraphView {
    pub nodes: Vec<NodeView>,
    pub edges: Vec<EdgeView>,
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    pub name: String,
    /// What its step does (empty for an input).
    pub detail: String,
    /// Written by a step of the pipeline (else an input read from outside it).
    pub written: bool,
    /// The node is a table of the warehouse (its page exists).
    pub is_table: bool,
    /// Its status in the newest run that has a record of it.
    pub status: Option<String>,
    /// Its box's top left corner.
    pub x: u32,
    pub y: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct EdgeView {
    pub from: String,
    pub to: String,
    /// The step that reads `from` to write `to` (`auto_cdc users_flow`).
    pub step: String,
}

/// A node's box.
pub const NODE_WIDTH: u32 = 230;
pub const NODE_HEIGHT: u32 = 44;
const COLUMN_GAP: u32 = 70;
const ROW_GAP: u32 = 18;
const MARGIN: u32 = 10;

/// What the overview is built from.
pub struct OverviewInput {
    pub warehouse: String,
    pub event_log_version: Option<i64>,
    /// The records of the last runs, oldest run first ([`strata_engine::read_events`]).
    pub events: Vec<LoggedEvent>,
    /// Each pipeline's graph from its plan, or why it could not be planned.
    pub graphs: BTreeMap<String, Result<DatasetGraph, String>>,
    pub tables: Vec<String>,
}

/// The overview: one entry per pipeline the records name (in the order of their newest
/// run, newest first), each with its last [`RUNS_SHOWN`] runs.
pub fn overview(input: OverviewInput) -> Overview {
    let tables: BTreeSet<&str> = input.tables.iter().map(String::as_str).collect();
    // (pipeline, its runs, the position of its newest run among all runs)
    let mut by_pipeline: Vec<(String, Vec<RunView>, usize)> = Vec::new();
    for (at, run) in runs_of(&input.events).into_iter().enumerate() {
        let pipeline = run_pipeline(&run);
        match by_pipeline.iter_mut().find(|(p, _, _)| *p == pipeline) {
            Some((_, runs, newest)) => {
                runs.push(run);
                *newest = at;
            }
            None => by_pipeline.push((pipeline, vec![run], at)),
        }
    }
    // Newest first: the runs within a pipeline, and the pipelines by their newest run.
    for (_, runs, _) in &mut by_pipeline {
        runs.reverse();
        runs.truncate(RUNS_SHOWN);
    }
    by_pipeline.sort_by_key(|(_, _, newest)| std::cmp::Reverse(*newest));
    let pipelines = by_pipeline
        .into_iter()
        .map(|(pipeline, runs, _)| {
            let (graph, graph_note) = match input.graphs.get(&pipeline) {
                Some(Ok(g)) => (g.clone(), None),
                Some(Err(why)) => (logged_graph(&runs), Some(why.clone())),
                None => (logged_graph(&runs), Some("not planned".to_string())),
            };
            PipelineView {
                graph: layout(&graph, &latest_status(&runs), &tables),
                graph_note,
                pipeline,
                runs,
            }
        })
        .collect();
    Overview {
        warehouse: input.warehouse,
        event_log_version: input.event_log_version,
        pipelines,
        tables: input.tables,
    }
}

/// The records grouped by run, in their order.
fn runs_of(events: &[LoggedEvent]) -> Vec<RunView> {
    let mut runs: Vec<RunView> = Vec::new();
    for e in events {
        if runs.last().map(|r| r.run_id != e.run_id).unwrap_or(true) {
            runs.push(RunView {
                run_id: e.run_id.clone(),
                started: e.started.clone(),
                status: String::new(),
                datasets: Vec::new(),
                run_records: Vec::new(),
            });
        }
        let Some(run) = runs.last_mut() else { continue };
        match e.is_run_record() {
            true => run.run_records.push(e.clone()),
            false => run.datasets.push(e.clone()),
        }
    }
    for run in &mut runs {
        run.status = run_status(run);
    }
    runs
}

fn run_status(run: &RunView) -> String {
    let failed = run.datasets.iter().any(|e| e.status == "FAILED");
    let outcome = run
        .run_records
        .iter()
        .rev()
        .find(|e| e.kind == "update" && e.status != "RETRYING");
    match (outcome, failed) {
        (Some(e), _) => e.status.clone(),
        (None, true) => "FAILED".to_string(),
        (None, false) => "COMPLETED".to_string(),
    }
}

fn run_pipeline(run: &RunView) -> String {
    run.datasets
        .iter()
        .chain(&run.run_records)
        .map(|e| e.pipeline.clone())
        .next()
        .unwrap_or_default()
}

/// Each dataset's status in the newest run (of `runs`, newest first) that has a record of it.
fn latest_status(runs: &[RunView]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for run in runs.iter().rev() {
        for e in &run.datasets {
            out.insert(e.dataset.clone(), e.status.clone());
        }
    }
    out
}

/// A graph of the datasets the records name, without edges (when the plan is not at hand).
fn logged_graph(runs: &[RunView]) -> DatasetGraph {
    let mut graph = DatasetGraph::default();
    let mut seen = BTreeSet::new();
    for e in runs.iter().rev().flat_map(|r| &r.datasets) {
        if !e.dataset.is_empty() && seen.insert(e.dataset.clone()) {
            graph.nodes.push(strata_engine::GraphNode {
                name: e.dataset.clone(),
                label: e.dataset.clone(),
                written: true,
            });
        }
    }
    graph
}

/// Columns by longest path from the inputs, rows in first-seen order within a column.
pub fn layout(
    graph: &DatasetGraph,
    status: &BTreeMap<String, String>,
    tables: &BTreeSet<&str>,
) -> GraphView {
    let index = graph.index();
    let mut column = vec![0u32; graph.nodes.len()];
    // Relaxed once per node at most: a plan has no cycles, and this stops even if it had.
    for _ in 0..graph.nodes.len() {
        let mut changed = false;
        for e in &graph.edges {
            let (Some(&f), Some(&t)) = (index.get(e.from.as_str()), index.get(e.to.as_str()))
            else {
                continue;
            };
            if column[t] < column[f] + 1 {
                column[t] = column[f] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows_used: BTreeMap<u32, u32> = BTreeMap::new();
    let nodes: Vec<NodeView> = graph
        .nodes
        .iter()
        .zip(&column)
        .map(|(n, &c)| {
            let row = rows_used.entry(c).or_default();
            let y = MARGIN + *row * (NODE_HEIGHT + ROW_GAP);
            *row += 1;
            NodeView {
                name: n.name.clone(),
                detail: n
                    .label
                    .split_once('\n')
                    .map(|(_, d)| d)
                    .unwrap_or("")
                    .to_string(),
                written: n.written,
                is_table: tables.contains(n.name.as_str()),
                status: status.get(&n.name).cloned(),
                x: MARGIN + c * (NODE_WIDTH + COLUMN_GAP),
                y,
            }
        })
        .collect();
    let columns = column.iter().max().map_or(0, |m| m + 1);
    let rows = rows_used.values().max().copied().unwrap_or(0);
    GraphView {
        edges: graph
            .edges
            .iter()
            .map(|e| EdgeView {
                from: e.from.clone(),
                to: e.to.clone(),
                step: e.step.clone(),
            })
            .collect(),
        nodes,
        width: 2 * MARGIN + columns * NODE_WIDTH + columns.saturating_sub(1) * COLUMN_GAP,
        height: 2 * MARGIN + rows * NODE_HEIGHT + rows.saturating_sub(1) * ROW_GAP,
    }
}

/// A table's page: its columns, row count, recent Delta history and a sample of rows.
#[derive(Debug, Clone, Serialize)]
pub struct TablePage {
    /// `schema.name`.
    pub name: String,
    /// `DESCRIBE`'s rows: column name, type, comment.
    pub columns: Grid,
    pub row_count: i64,
    /// `DESCRIBE HISTORY`'s newest rows.
    pub history: Grid,
    /// The first rows a scan returns.
    pub sample: Grid,
}

/// How many commits and rows a table's page shows.
pub const HISTORY_SHOWN: usize = 10;
pub const SAMPLE_ROWS: usize = 20;

/// Rows of text under column names.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Grid {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Grid {
    /// Only the columns named in `keep` that the grid has, in `keep`'s order, and the
    /// first `limit` rows.
    pub fn select(&self, keep: &[&str], limit: usize) -> Grid {
        let at: Vec<usize> = keep
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| c == k))
            .collect();
        Grid {
            columns: at.iter().map(|&i| self.columns[i].clone()).collect(),
            rows: self
                .rows
                .iter()
                .take(limit)
                .map(|r| {
                    at.iter()
                        .map(|&i| r.get(i).cloned().unwrap_or_default())
                        .collect()
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_engine::{GraphEdge, GraphNode};

    fn record(run: &str, dataset: &str, status: &str, written: i64) -> LoggedEvent {
        LoggedEvent {
            run_id: run.into(),
            pipeline: "p.sql".into(),
            started: format!("{run} start"),
            flow: dataset.rsplit('.').next().unwrap_or("").into(),
            kind: "ingest".into(),
            dataset: dataset.into(),
            status: status.into(),
            rows_written: written,
            ..LoggedEvent::default()
        }
    }

    fn graph() -> DatasetGraph {
        let node = |name: &str, written: bool| GraphNode {
            name: name.into(),
            label: if written {
                format!("{name}\nwhat it does")
            } else {
                name.into()
            },
            written,
        };
        let edge = |from: &str, to: &str| GraphEdge {
            from: from.into(),
            to: to.into(),
            step: format!("step {to}"),
        };
        DatasetGraph {
            nodes: vec![
                node("files data/cdc", false),
                node("default.raw", true),
                node("default.users", true),
                node("default.other", true),
            ],
            edges: vec![
                edge("files data/cdc", "default.raw"),
                edge("default.raw", "default.users"),
                edge("files data/cdc", "default.other"),
            ],
        }
    }

    #[test]
    fn runs_are_grouped_per_pipeline_newest_first_with_each_nodes_latest_status() {
        let mut other = record("r2", "default.x", "SKIPPED", 0);
        other.pipeline = "q.sql".into();
        let events = vec![
            record("r1", "default.raw", "COMPLETED", 3),
            record("r1", "default.users", "COMPLETED", 2),
            other,
            record("r3", "default.raw", "COMPLETED", 1),
            record("r3", "default.users", "FAILED", 0),
        ];
        let o = overview(OverviewInput {
            warehouse: "wh".into(),
            event_log_version: Some(4),
            events,
            graphs: BTreeMap::from([
                ("p.sql".to_string(), Ok(graph())),
                ("q.sql".to_string(), Err("cannot read q.sql".to_string())),
            ]),
            tables: vec!["default.raw".into(), "default.users".into()],
        });
        let names: Vec<&str> = o.pipelines.iter().map(|p| p.pipeline.as_str()).collect();
        // p.sql ran last, though q.sql was first seen after p.sql's first run.
        assert_eq!(names, ["p.sql", "q.sql"]);
        let p = &o.pipelines[0];
        let runs: Vec<(&str, &str)> = p
            .runs
            .iter()
            .map(|r| (r.run_id.as_str(), r.status.as_str()))
            .collect();
        assert_eq!(runs, [("r3", "FAILED"), ("r1", "COMPLETED")]);
        assert_eq!(p.runs[1].datasets[0].rows_written, 3);
        assert_eq!(p.graph_note, None);
        let users = p
            .graph
            .nodes
            .iter()
            .find(|n| n.name == "default.users")
            .unwrap();
        assert_eq!(users.status.as_deref(), Some("FAILED"));
        assert!(users.is_table);
        assert_eq!(users.detail, "what it does");
        // Without a plan: the datasets the log names, no edges, and why.
        let q = &o.pipelines[1];
        assert_eq!(q.graph_note.as_deref(), Some("cannot read q.sql"));
        assert_eq!(q.graph.nodes.len(), 1);
        assert!(q.graph.edges.is_empty());
    }

    #[test]
    fn the_layout_puts_each_dataset_right_of_what_it_reads() {
        let g = layout(&graph(), &BTreeMap::new(), &BTreeSet::new());
        let at = |name: &str| {
            let n = g.nodes.iter().find(|n| n.name == name).unwrap();
            (n.x, n.y)
        };
        let column = NODE_WIDTH + COLUMN_GAP;
        assert_eq!(at("files data/cdc"), (MARGIN, MARGIN));
        assert_eq!(at("default.raw"), (MARGIN + column, MARGIN));
        assert_eq!(
            at("default.other"),
            (MARGIN + column, MARGIN + NODE_HEIGHT + ROW_GAP)
        );
        assert_eq!(at("default.users"), (MARGIN + 2 * column, MARGIN));
        assert_eq!(g.width, 2 * MARGIN + 3 * NODE_WIDTH + 2 * COLUMN_GAP);
        assert_eq!(g.height, 2 * MARGIN + 2 * NODE_HEIGHT + ROW_GAP);
        assert_eq!(g.edges.len(), 3);
    }

    #[test]
    fn an_outcome_record_sets_the_runs_status() {
        let outcome = |run: &str, status: &str| {
            let mut e = record(run, "", status, 0);
            e.kind = "update".into();
            e
        };
        let runs = runs_of(&[
            record("r1", "default.raw", "COMPLETED", 1),
            outcome("r1", "FAILED"),
            // A failed attempt retried: the outcome, not the first attempt's record.
            record("r2", "default.raw", "FAILED", 0),
            outcome("r2", "RETRYING"),
            record("r2", "default.raw", "COMPLETED", 1),
            outcome("r2", "COMPLETED"),
        ]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].status, "FAILED");
        assert_eq!(runs[0].run_records.len(), 1);
        assert_eq!(runs[0].datasets.len(), 1);
        assert_eq!(runs[1].status, "COMPLETED");
        assert_eq!(runs[1].datasets.len(), 2);
        assert_eq!(runs[1].run_records.len(), 2);
    }

    #[test]
    fn a_grid_keeps_the_named_columns_and_the_first_rows() {
        let g = Grid {
            columns: vec!["a".into(), "b".into(), "c".into()],
            rows: vec![
                vec!["1".into(), "2".into(), "3".into()],
                vec!["4".into(), "5".into(), "6".into()],
            ],
        };
        let s = g.select(&["c", "missing", "a"], 1);
        assert_eq!(s.columns, ["c", "a"]);
        assert_eq!(s.rows, [["3", "1"]]);
    }
}
