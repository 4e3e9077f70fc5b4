//! Running the prepared nodes: each after the nodes that write what it reads (and after the
//! earlier writers of its own table), independent ones side by side (up to four at a
//! time), each retried when another writer committed first or when it failed transiently
//! (`pipelines.maxFlowRetryAttempts`), each recorded in the event log as soon as it ends. A
//! failure lets the nodes in flight finish and starts nothing more.

use crate::error::{EngineError, Result};
use crate::eventstore::handoff::Handoff;
use crate::load::settings::FlowRetries;
use crate::ops::Scope;
use crate::runtime::event_log::{self, EventRecord, Status};
use crate::runtime::node::{run_node, summary, NodeOutput};
use crate::runtime::options::{Progress, RunOptions, RunReport};
use crate::runtime::prepare::{
    prepare_ingestion, with_downstream, Prepared, PreparedNode, PreparedPlan,
};
use crate::runtime::retry::{conflict_backoff, gave_up, FlowRetry, CONFLICT_ATTEMPTS};
use crate::storage::warehouse::Warehouse;
use futures::StreamExt;
use std::time::{Duration, Instant};
use strata_sql::{Node, PipelinePlan};

/// What every node of one run shares.
pub(crate) struct Run<'a> {
    pub(crate) wh: &'a Warehouse,
    pub(crate) prepared: &'a PreparedPlan<'a>,
    pub(crate) options: &'a RunOptions,
    /// The memory limit of the run's large work, in bytes (`util/memory.rs`).
    pub(crate) memory: u64,
    pub(crate) run_id: &'a str,
    /// The pipeline file, as the event log names it.
    pub(crate) pipeline: String,
    /// Checked events kept for a reader in this run; dropped with the run (a reader that
    /// does not come in this run reads the files next time).
    pub(crate) handoff: Handoff,
    /// Each node's record as it ends (for the run's outcome and its notifications).
    pub(crate) ended: &'a crate::runtime::update::Ended,
    /// How often a node that failed transiently is tried again.
    pub(crate) flow_retries: FlowRetries,
}

impl Run<'_> {
    pub(crate) fn flow_retry(&self) -> FlowRetry<'_> {
        FlowRetry {
            wh: self.wh,
            options: self.options,
            run_id: self.run_id,
            pipeline: &self.pipeline,
            policy: self.flow_retries,
        }
    }
}

/// A node that ended: its index, description, duration, record and outcome.
type Ended = (usize, String, Duration, EventRecord, Result<NodeOutput>);

/// Runs the `selected` nodes (all when no `--select`), filling `report`; the first failure
/// is the run's error.
pub(crate) async fn run_nodes(
    run: &Run<'_>,
    selected: &[Node],
    report: &mut RunReport,
) -> Result<()> {
    let nodes: Vec<&PreparedNode> = run
        .prepared
        .nodes
        .iter()
        .filter(|n| selected.contains(&n.node))
        .collect();
    let deps = dependencies(run.prepared.plan, &nodes);
    let limit = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    let mut started = vec![false; nodes.len()];
    let mut done = vec![false; nodes.len()];
    let mut running = futures::stream::FuturesUnordered::new();
    let mut failure: Option<EngineError> = None;
    loop {
        while failure.is_none() && running.len() < limit {
            let Some(i) =
                (0..nodes.len()).find(|&i| !started[i] && deps[i].iter().all(|&d| done[d]))
            else {
                break;
            };
            if stop_requested(run.options) {
                report.stopped = true;
                break;
            }
            started[i] = true;
            running.push(run_one(run, i, nodes[i]));
        }
        let Some((i, describe, elapsed, mut record, outcome)) = running.next().await else {
            break;
        };
        done[i] = true;
        match outcome {
            Ok(out) => out.add_to(report),
            Err(e) => {
                record.status = Status::Failed;
                record.error = Some(crate::error::chain(&e));
                failure.get_or_insert(e);
            }
        }
        // A log that cannot be written (a full disk) fails the run, but the dataset's own
        // error, when it failed, is what the caller must see; the datasets still running
        // end before the run does (none is dropped halfway).
        if let Err(log) = event_log::append(run.wh, std::slice::from_ref(&record)).await {
            match &failure {
                Some(_) => tracing::warn!(
                    "{describe}: its record was not written to the event log: {}",
                    crate::error::chain(&log)
                ),
                None => failure = Some(log),
            }
        }
        if let Ok(mut ended) = run.ended.lock() {
            ended.push(record.clone());
        }
        if let Some(progress) = &run.options.progress {
            (progress.0)(Progress::Finished {
                node: describe,
                summary: summary(&record),
                elapsed,
            });
        }
    }
    failure.map_or(Ok(()), Err)
}

/// For each node, the earlier nodes it waits for: those that write what it reads, earlier
/// writers of its own table, and, for a point-in-time table, every ingestion and flow.
fn dependencies(plan: &PipelinePlan, nodes: &[&PreparedNode]) -> Vec<Vec<usize>> {
    (0..nodes.len())
        .map(|j| {
            let reads = plan.reads(&nodes[j].node);
            let writes = plan.writes(&nodes[j].node);
            (0..j)
                .filter(|&i| {
                    let w = plan.writes(&nodes[i].node);
                    w.as_ref().is_some_and(|w| reads.contains(w))
                        || (w.is_some() && w == writes)
                        || (matches!(nodes[j].node, Node::PointInTime(_))
                            && matches!(
                                nodes[i].node,
                                Node::Ingest(_) | Node::Flow(_) | Node::Append(_)
                            ))
                })
                .collect()
        })
        .collect()
}

fn stop_requested(options: &RunOptions) -> bool {
    options
        .stop
        .as_ref()
        .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
}

/// Runs node `i`, with progress reports and retries, into its event-log record.
async fn run_one(run: &Run<'_>, i: usize, n: &PreparedNode) -> Ended {
    let plan = run.prepared.plan;
    let describe = plan.describe(&n.node);
    if let Some(progress) = &run.options.progress {
        (progress.0)(Progress::Started {
            node: describe.clone(),
        });
    }
    let record =
        EventRecord::for_node(run.run_id, &run.pipeline, plan, &n.node, chrono::Utc::now());
    let progress = run.options.progress.clone();
    let node_name = describe.clone();
    let update = move |detail: String| {
        if let Some(p) = &progress {
            (p.0)(Progress::Update {
                node: node_name.clone(),
                detail,
            });
        }
    };
    let clock = Instant::now();
    let (mut record, outcome) = run_with_retries(run, n, record, &update).await;
    record.ended_at = chrono::Utc::now();
    (i, describe, clock.elapsed(), record, outcome)
}

/// Runs a node; one that lost a race with another writer starts again from the start, on
/// the tables as they now are (an ingestion is prepared again: the files it meant to take
/// may be taken), up to [`CONFLICT_ATTEMPTS`] times; one that failed transiently starts
/// again the same way after a pause, as often as [`FlowRetries`] allows, each failed
/// attempt recorded.
async fn run_with_retries(
    run: &Run<'_>,
    n: &PreparedNode,
    first: EventRecord,
    update: &(dyn Fn(String) + Send + Sync),
) -> (EventRecord, Result<NodeOutput>) {
    let plan = run.prepared.plan;
    let scope = Scope {
        wh: run.wh,
        run_id: run.run_id,
        pipeline: &run.pipeline,
        handoff: &run.handoff,
        memory: run.memory,
        cluster: run.options.cluster.as_ref(),
        dir: run.prepared.dir,
        update,
    };
    let retry = run.flow_retry();
    let mut again: Option<Prepared> = None;
    let mut attempt = 1;
    let mut tries = 1;
    loop {
        let mut record = first.clone();
        let p = again.as_ref().unwrap_or(&n.prepared);
        let outcome = run_node(
            &scope,
            plan,
            &n.node,
            p,
            &run.prepared.declared,
            &mut record,
        )
        .await;
        match outcome {
            Err(e) if e.is_conflict() => {
                if attempt >= CONFLICT_ATTEMPTS {
                    let table = plan.writes(&n.node);
                    return (
                        record,
                        Err(gave_up(run.wh, table.as_ref(), e, attempt).await),
                    );
                }
                tracing::warn!(
                    node = %plan.describe(&n.node),
                    attempt,
                    "another writer committed first ({e}); starting this dataset again"
                );
                tokio::time::sleep(conflict_backoff(attempt)).await;
                attempt += 1;
            }
            Err(e) => {
                if !retry.again(tries, &e, record.clone()).await {
                    return (record, Err(e));
                }
                tries += 1;
            }
            ok => return (record, ok),
        }
        match prepare_again(run, n).await {
            Ok(Some(p)) => again = Some(p),
            Ok(None) => {}
            Err(e) => return (record, Err(e)),
        }
    }
}

/// An ingestion prepared anew for another attempt (the files or rows it meant to take may
/// have been taken meanwhile); `None` for the other nodes, which prepare as they run.
async fn prepare_again(run: &Run<'_>, n: &PreparedNode) -> Result<Option<Prepared>> {
    let (Node::Ingest(_) | Node::Append(_), Some(known)) = (&n.node, &n.known) else {
        return Ok(None);
    };
    let context = run.prepared.context(run.wh);
    let mut p = prepare_ingestion(&context, &n.node, known).await?;
    with_downstream(&mut p, &run.prepared.flows);
    Ok(Some(p))
}
