//! Once flows (`CREATE FLOW f AS INSERT INTO ONCE t BY NAME SELECT ...`): a backfill that
//! runs one time.
//!
//! The query is a batch query: over every file under its `read_files` path (read together,
//! so aggregates and `DISTINCT` see the whole input), or over tables only. Its rows are
//! appended in one commit that also records the application transaction
//! `strata-once:<flow>` (`AppId::Once`) at that commit's own version, so the record and the
//! rows are one atomic step: a run that dies before the commit leaves neither (the next run
//! runs the flow), one that dies after leaves both (the next run skips it). The commit
//! must land on exactly the version it recorded: if another writer committed first, it
//! fails as a conflict and the scheduler prepares the flow again, which then finds the
//! record when the other writer was this flow in a concurrent run. A run that appends no
//! row still commits the record.
//!
//! A target that records the flow skips it, saying at which version it ran, without
//! looking at its input (a backfill's files may be gone). `--full-refresh` sets the target
//! aside, and with it the record: the flow runs again into the new table.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::commit::Taken;
use crate::ops::ingest::rows::{checked_rows, Running};
use crate::ops::ingest::IngestReport;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Readiness;
use crate::ops::ingest::Source;
use crate::ops::Scope;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::warehouse::Warehouse;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::prelude::DataFrame;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use std::collections::HashMap;
use std::sync::Arc;
use strata_sql::TableName;

/// The version at which once flow `flow` ran into `table` (the commit holding its rows),
/// if it did.
pub(super) async fn ran_at(table: &DeltaTable, flow: &str) -> Result<Option<i64>> {
    position(table, AppId::Once(flow)).await
}

/// Why a once flow that ran at `version` is skipped.
fn already_ran(version: i64, target: &TableName) -> String {
    format!(
        "once flow already ran at version {version} of {target}; a full refresh of \
         {target} runs it again"
    )
}

/// Once flow `flow` into `target`, when it already ran: its skipped run and the target's
/// columns.
pub(super) async fn ran(
    wh: &Warehouse,
    target: &TableName,
    flow: &str,
) -> Result<Option<Readiness>> {
    let Some(table) = wh.open_table(target).await? else {
        return Ok(None);
    };
    let Some(version) = ran_at(&table, flow).await? else {
        return Ok(None);
    };
    let report = IngestReport {
        table: target.to_string(),
        flow: flow.to_string(),
        append: true,
        once: true,
        skipped: Some(already_ran(version, target)),
        ..Default::default()
    };
    let schema = crate::storage::table::table_schema(&table)?;
    Ok(Some(Readiness::Ran(Box::new(report), schema)))
}

/// The whole input of a once flow, run through its query and checked; `None` (the report
/// says why) when the target already records the flow.
pub(super) async fn take_once(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let flow = setup.flow_name();
    // Checked again on the table this run commits on top of (a concurrent run may have run
    // the flow since it was prepared).
    if let Some(t) = existing {
        if let Some(version) = ran_at(t, flow).await? {
            report.skipped = Some(already_ran(version, &setup.table.name));
            return Ok(None);
        }
    }
    let running = Running::new(scope.wh, setup).await?;
    let mut events = HashMap::new();
    let (parts, commit) = match &setup.source {
        Source::Files { dir, pending, .. } => {
            let files = match pending {
                Some(files) => files.clone(),
                None => dir.list().await?,
            };
            let commit = super::commit::files_commit(scope, setup, existing, &files).await?;
            if files.is_empty() {
                report.notes.push(format!(
                    "no files under {}: recorded as done with no rows",
                    dir.display()
                ));
                (Vec::new(), commit)
            } else {
                let input = read_all(setup, dir, &files).await?;
                let place = format!("the {} file(s) under {}", files.len(), dir.display());
                let (rows, _) =
                    checked_rows(setup, &running, input, &place, report, &mut events).await?;
                report.files = files;
                (rows, commit)
            }
        }
        Source::Batch => {
            let input = SessionContext::new()
                .read_empty()
                .context(|| "an empty input".into())?;
            let (rows, _) =
                checked_rows(setup, &running, input, "its query", report, &mut events).await?;
            (rows, PendingCommit::of_run(scope.run_id))
        }
        _ => {
            return Err(EngineError::internal(format!(
                "once flow {flow} reads neither files nor tables in batch"
            )))
        }
    };
    Ok(Some(Taken::rows(parts, events, commit)))
}

/// Every file, read (each as the flow's `read_files` options say) and put together by
/// column name: one input, so that the query sees all of it at once.
async fn read_all(
    setup: &IngestSetup,
    dir: &super::files::InputDir,
    files: &[String],
) -> Result<DataFrame> {
    let ctx = SessionContext::new();
    let mut all: Option<DataFrame> = None;
    for file in files {
        let path = dir.file(file).await?;
        let df = super::files::read_input_file(setup, &path, file).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        // Read now, so that a file that does not parse is named.
        let batches = df
            .collect()
            .await
            .map_err(|e| setup.err(format!("file {}: {e}", path.display())))?;
        let table = MemTable::try_new(schema, vec![batches])
            .context(|| format!("file {}", path.display()))?;
        let df = ctx
            .read_table(Arc::new(table))
            .context(|| format!("file {}", path.display()))?;
        all = Some(match all {
            None => df,
            Some(before) => before
                .union_by_name(df)
                .map_err(|e| setup.err(format!("file {}: {e}", path.display())))?,
        });
    }
    all.ok_or_else(|| EngineError::internal("no input files to read"))
}
