//! `strata optimize` of an AUTO CDC target's event store: which events it may forget, by
//! the pipelines that write the target, then the compaction itself (`eventstore/compact.rs`).
//!
//! ```text
//!   the pipelines (named, else those the event log records) ─plan─▶ the flows into the
//!   target ─forget_rule─▶ forget expired tombstones after N s, or keep every event (SCD2,
//!   snapshot flows, no pipeline known) ─▶ compact ─▶ the digest carried over to the new
//!   version (snapshot flows)
//! ```

use crate::error::{Context, Result};
use crate::eventstore::compact::{self, Rules};
use crate::runtime::options::Optimized;
use crate::runtime::options::MANAGED_PROPERTY;
use crate::storage::commit::PendingCommit;
use crate::storage::location::Location;
use crate::storage::table::{open_delta, property, table_properties};
use crate::storage::warehouse::Warehouse;
use std::time::Instant;
use strata_sql::{FlowKind, PipelinePlan, ScdType, TableName};

/// What may be forgotten of a target's event store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Forget {
    /// Deletes older than this many seconds and what they hid (SCD type 1 change flows).
    After(u64),
    /// Every event is kept, for this reason.
    Nothing(String),
}

/// What the flows of `plans` into `target` allow the compaction of its store to forget.
pub(crate) fn forget_rule(plans: &[PipelinePlan], target: &TableName) -> Result<Forget> {
    let flows: Vec<_> = plans
        .iter()
        .flat_map(|p| p.flows.iter().map(move |f| (p, f)))
        .filter(|(_, f)| &f.target == target)
        .collect();
    let Some((plan, _)) = flows.first() else {
        return Ok(Forget::Nothing(format!(
            "no pipeline known writes {target}, so its tombstones' expiry is unknown (name \
             the pipeline with --pipeline)"
        )));
    };
    if flows
        .iter()
        .any(|(_, f)| matches!(f.kind, FlowKind::Snapshot { .. }))
    {
        return Ok(Forget::Nothing(
            "a snapshot flow writes it: its deletes are kept".into(),
        ));
    }
    if flows.iter().any(|(_, f)| f.stored_as != ScdType::Type1) {
        return Ok(Forget::Nothing(
            "SCD type 2: its deletes end versions of history and are kept".into(),
        ));
    }
    let properties = plan
        .tables
        .get(target)
        .map(|t| t.properties.clone())
        .unwrap_or_default();
    Ok(Forget::After(crate::eventstore::tombstones::threshold(
        &properties,
    )?))
}

/// One event store's compaction, reported as [`Optimized`].
pub(crate) async fn optimize_store(
    target: &TableName,
    label: &str,
    path: &Location,
    wh: &Warehouse,
    forget: &Forget,
    sort_memory: Option<u64>,
    run: &PendingCommit,
) -> Result<Optimized> {
    let store = open_delta(path)
        .await?
        .ok_or_else(|| crate::error::EngineError::NotFound(format!("no Delta table at {label}")))?;
    let target_table = open_target(wh, target).await?;
    let rules = Rules {
        keys: key_columns(target, &target_table)?,
        forget_after_secs: match forget {
            Forget::After(secs) => Some(*secs),
            Forget::Nothing(_) => None,
        },
        sort_memory: sort_memory
            .and_then(|m| usize::try_from(m).ok())
            .unwrap_or(compact::DEFAULT_SORT_MEMORY),
        only: None,
    };
    let note = match forget {
        Forget::Nothing(why) => Some(format!("tombstones kept: {why}")),
        Forget::After(_) => None,
    };
    compact_store(&store, label, path, &rules, note, run).await
}

/// After a run that wrote `target`: its event store's small files compacted into one once
/// there are enough of them (`compact::small_files`); `None` when there are not, or the
/// target has `pipelines.autoOptimize.managed = false`.
pub(crate) async fn compact_small_files(
    wh: &Warehouse,
    target: &TableName,
    run: &PendingCommit,
) -> Result<Option<Optimized>> {
    let path = wh.event_store_location(target);
    let Some(store) = open_delta(&path).await? else {
        return Ok(None);
    };
    let files: Vec<(String, i64, Option<usize>)> = store
        .snapshot()
        .context(|| "reading the event store's state".into())?
        .log_data()
        .iter()
        .map(|f| (f.path().to_string(), f.size(), f.num_records()))
        .collect();
    let Some(small) = compact::small_files(&files) else {
        return Ok(None);
    };
    // The target only once there is something to compact: most runs end above.
    let target_table = open_target(wh, target).await?;
    let properties = table_properties(&target_table)?;
    if property(&properties, MANAGED_PROPERTY).is_some_and(|v| v == "false") {
        return Ok(None);
    }
    let note = format!("its {} small file(s), of {}", small.len(), files.len());
    let rules = Rules {
        keys: key_columns(target, &target_table)?,
        forget_after_secs: None,
        sort_memory: compact::DEFAULT_SORT_MEMORY,
        only: Some(small),
    };
    let label = format!("{target} (event store)");
    compact_store(&store, &label, &path, &rules, Some(note), run)
        .await
        .map(Some)
}

/// Compacts `store` (at `path`) by `rules` and reports it, carrying a snapshot flow's
/// digest over to the new version when no event was forgotten and no other commit came
/// between (a run that committed events meanwhile made the digest of the version read
/// stale; without a digest the next run compares with the target instead).
async fn compact_store(
    store: &deltalake::DeltaTable,
    label: &str,
    path: &Location,
    rules: &Rules,
    note: Option<String>,
    run: &PendingCommit,
) -> Result<Optimized> {
    let started = Instant::now();
    let bytes_before: u64 = store
        .snapshot()
        .context(|| "reading the event store's state".into())?
        .log_data()
        .iter()
        .filter(|f| {
            rules
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|p| p.as_str() == f.path().as_ref()))
        })
        .map(|f| u64::try_from(f.size()).unwrap_or(0))
        .sum();
    let now = chrono::Utc::now().timestamp_millis();
    let done = compact::compact(store, path, rules, now, run).await?;
    let before = crate::storage::table::version_of(store);
    if done.skipped.is_none() && done.tombstones_forgotten == 0 && done.version == before + 1 {
        if let Some(dir) = crate::eventstore::digest::dir_for(path) {
            crate::eventstore::digest::carry_over(&dir, before, done.version)?;
        }
    }
    let rewritten = |n: usize| match done.skipped {
        Some(_) => 0,
        None => n as u64,
    };
    Ok(Optimized {
        table: label.to_string(),
        files_before: done.files_before,
        files_after: done.files_after,
        bytes_before,
        bytes_after: done.bytes_written.unwrap_or(bytes_before),
        files_removed: rewritten(done.files_before),
        files_added: rewritten(done.files_after),
        zorder_by: Vec::new(),
        version: done.version,
        millis: started.elapsed().as_millis(),
        skipped: done.skipped,
        events: (done.events_before > 0).then_some((done.events_before, done.events_after)),
        tombstones_forgotten: done.tombstones_forgotten,
        note,
    })
}

async fn open_target(wh: &Warehouse, target: &TableName) -> Result<deltalake::DeltaTable> {
    wh.open_table(target).await?.ok_or_else(|| {
        crate::error::EngineError::NotFound(format!(
            "{target} has an event store but no table: run its pipeline first"
        ))
    })
}

/// The key columns `target` records (`strata.keys`).
fn key_columns(target: &TableName, table: &deltalake::DeltaTable) -> Result<Vec<String>> {
    crate::storage::table::recorded_keys(&table_properties(table)?).ok_or_else(|| {
        crate::error::EngineError::internal(format!(
            "{target} does not record its key columns ({})",
            crate::storage::table::KEYS_PROPERTY
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(sql: &str) -> PipelinePlan {
        strata_sql::plan_pipeline(strata_sql::parse_pipeline(sql).expect("parse")).expect("plan")
    }

    fn t(name: &str) -> TableName {
        TableName::parse(name, TableName::DEFAULT_SCHEMA).expect("name")
    }

    const SOURCE: &str = "CREATE STREAMING TABLE src AS SELECT * FROM STREAM read_files('in', \
                          format => 'json');\n";

    #[test]
    fn scd1_change_flows_forget_after_the_threshold() {
        let p = plan(&format!(
            "{SOURCE}CREATE STREAMING TABLE t TBLPROPERTIES \
             ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '60');\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(src) KEYS (id) SEQUENCE BY seq \
             STORED AS SCD TYPE 1;"
        ));
        assert_eq!(forget_rule(&[p], &t("t")).expect("rule"), Forget::After(60));
        let p = plan(&format!(
            "{SOURCE}CREATE STREAMING TABLE t;\nCREATE FLOW f AS AUTO CDC INTO t FROM \
             STREAM(src) KEYS (id) SEQUENCE BY seq;"
        ));
        assert_eq!(
            forget_rule(&[p], &t("t")).expect("rule"),
            Forget::After(crate::eventstore::tombstones::DEFAULT_SECONDS)
        );
    }

    #[test]
    fn scd2_snapshot_and_unknown_targets_keep_everything() {
        let p = plan(&format!(
            "{SOURCE}CREATE STREAMING TABLE t;\nCREATE FLOW f AS AUTO CDC INTO t FROM \
             STREAM(src) KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2;"
        ));
        let rule = forget_rule(std::slice::from_ref(&p), &t("t")).expect("rule");
        assert!(matches!(rule, Forget::Nothing(why) if why.contains("SCD type 2")));
        let rule = forget_rule(&[p], &t("other")).expect("rule");
        assert!(matches!(rule, Forget::Nothing(why) if why.contains("--pipeline")));
        let p = plan(&format!(
            "{SOURCE}CREATE STREAMING TABLE t;\nCREATE FLOW f AS AUTO CDC FROM SNAPSHOT \
             INTO t FROM STREAM(src) KEYS (id) SNAPSHOT VERSION BY v STORED AS SCD TYPE 1;"
        ));
        let rule = forget_rule(&[p], &t("t")).expect("rule");
        assert!(matches!(rule, Forget::Nothing(why) if why.contains("snapshot")));
    }
}
