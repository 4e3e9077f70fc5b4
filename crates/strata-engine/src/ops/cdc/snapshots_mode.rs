//! `STORED AS SNAPSHOTS`: every delivery's rows with start = end = version, written straight
//! to the target (no event store). A redelivered version's rows are replaced in the same
//! commit. Phases: [`read_deliveries`] → [`existing_versions`] → [`version_rows`] (and
//! [`demote_previous`] under a current flag) → [`commit_versions`].

use crate::error::{Context, Result};
use crate::ops::cdc::FlowReport;
use crate::ops::Scope;
use crate::semantics::flow::FlowSetup;
use crate::semantics::snapshot::{
    group_versions, reject_duplicate_keys, render_version, take_rows, with_flag, Versions,
};
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::session::register_table;
use crate::storage::write::{write_rows, RowChange};
use crate::util::arrow;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::{ArrayRef, RecordBatch};
use deltalake::arrow::compute::concat_batches;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::DeltaTable;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Runs a `STORED AS SNAPSHOTS` flow once over the deliveries it has not taken.
pub(crate) async fn run_snapshots_mode(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
) -> Result<FlowReport> {
    let f = &setup.flow;
    let mut report = FlowReport::of(&f.name);
    let Some(source) = scope.wh.open_table(&f.source).await? else {
        report.skipped = Some(format!("source {} has no data yet", f.source));
        return Ok(report);
    };
    let target = scope.wh.open_table(&f.target).await?;
    let from = match &target {
        Some(t) => position(t, AppId::Flow(&f.name)).await?,
        None => None,
    };
    let source_version = crate::storage::table::version_of(&source);
    if from.is_some_and(|v| v >= source_version) {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    if from.is_some()
        && crate::storage::changes::changes_since(&source, from)
            .await?
            .only_upkeep
    {
        report.skipped = Some("no new input (only upkeep commits such as OPTIMIZE)".to_string());
        return Ok(report);
    }
    let ctx = crate::storage::session::new_session();
    let rows = read_deliveries(&ctx, setup, &source, from).await?;
    let versions = group_versions(setup, &rows)?;
    report.source_versions = Some((from, source_version));
    report.events = rows.num_rows();
    if versions.groups.is_empty() {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    let existing = existing_versions(&ctx, setup, target.as_ref()).await?;
    let mut write = version_rows(setup, &rows, &versions, &existing, &mut report)?;
    demote_previous(&ctx, setup, &existing, &mut write).await?;
    let commit = PendingCommit::of_run(scope.run_id).at(AppId::Flow(&f.name), source_version);
    commit_versions(scope, setup, target_properties, target, write, &commit).await?;
    report.keys_changed = report.rows_inserted;
    Ok(report)
}

/// The rows delivered since `from` (the whole source in table mode), as checked events.
async fn read_deliveries(
    ctx: &SessionContext,
    setup: &FlowSetup,
    source: &DeltaTable,
    from: Option<i64>,
) -> Result<RecordBatch> {
    match setup.table_mode() {
        true => register_table(ctx, strata_sql::SOURCE_PLACEHOLDER, source, None).await?,
        false => {
            let changes = crate::storage::changes::changes_since(source, from).await?;
            let until = crate::storage::table::version_of(source);
            crate::storage::changes::register_new_rows(
                ctx,
                strata_sql::SOURCE_PLACEHOLDER,
                source,
                from,
                until,
                &changes,
            )
            .await?
        }
    }
    let rows = crate::eventstore::evaluate::events_from(ctx, setup, 0).await?;
    let place = format!("the rows of {}", setup.flow.source);
    crate::semantics::events::validate_events(setup, std::slice::from_ref(&rows), &place)?;
    Ok(rows)
}

/// The versions the target holds (registered in `ctx` as `__strata_target`), and the newest.
struct Existing {
    versions: Vec<ScalarValue>,
    max: Option<ScalarValue>,
}

async fn existing_versions(
    ctx: &SessionContext,
    setup: &FlowSetup,
    target: Option<&DeltaTable>,
) -> Result<Existing> {
    let mut versions = Vec::new();
    if let Some(t) = target {
        register_table(ctx, "__strata_target", t, None).await?;
        let sql = format!(
            "SELECT DISTINCT {} FROM __strata_target",
            quote_ident(&setup.timeline.valid_from)
        );
        let batches = ctx
            .sql(&sql)
            .await
            .context(|| "reading versions".into())?
            .collect()
            .await
            .context(|| "reading versions".into())?;
        versions = arrow::scalars(&batches)?;
    }
    let max = versions
        .iter()
        .max_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal))
        .cloned();
    Ok(Existing { versions, max })
}

/// The rows to write and the versions whose rows they replace.
struct VersionWrite {
    parts: Vec<RecordBatch>,
    replace: Vec<ScalarValue>,
    /// The newest version once the run is done.
    newest: Option<ScalarValue>,
}

/// Each delivered version's rows in the target layout (start = end = version; a current
/// flag on the newest version), with notes for redeliveries and late versions.
fn version_rows(
    setup: &FlowSetup,
    rows: &RecordBatch,
    versions: &Versions,
    existing: &Existing,
    report: &mut FlowReport,
) -> Result<VersionWrite> {
    let timeline = &setup.timeline;
    let newest_delivered = versions.groups.last().map(|g| g.0.clone());
    let newest = match (&existing.max, &newest_delivered) {
        (Some(a), Some(b)) if a > b => Some(a.clone()),
        (_, b) => b.clone(),
    };
    let mut write = VersionWrite {
        parts: Vec::new(),
        replace: Vec::new(),
        newest,
    };
    for (v, idx) in &versions.groups {
        if existing.versions.contains(v) {
            report.notes.push(format!(
                "snapshot version {} redelivered: its rows are replaced",
                render_version(v)
            ));
        } else if existing.max.as_ref().is_some_and(|m| m > v) {
            report.notes.push(format!(
                "snapshot version {} arrived after a later version was applied: added to history",
                render_version(v)
            ));
        }
        write.replace.push(v.clone());
        let snap = take_rows(rows, idx)?;
        // A key twice in one version is an error here too.
        reject_duplicate_keys(setup, &snap, v)?;
        let n = snap.num_rows();
        let mut cols: Vec<ArrayRef> = snap.columns()[..setup.spec.n_out].to_vec();
        let seq = snap.column(setup.spec.n_out).clone();
        cols.push(seq.clone());
        cols.push(seq);
        let internal = RecordBatch::try_new(setup.fold_schema.clone(), cols)
            .context(|| "snapshot rows".into())?;
        let mut mapped = timeline.apply(
            &internal,
            setup.spec.n_out,
            &setup.spec.keys,
            &setup.target_schema,
        )?;
        if let Some(flag) = &timeline.current_flag {
            mapped = with_flag(&mapped, flag, write.newest.as_ref() == Some(v), n)?;
        }
        report.rows_inserted += n;
        write.parts.push(mapped);
    }
    Ok(write)
}

/// Under a current flag, the previous newest version is no longer current when a newer
/// one arrived: its rows are written again with the flag off.
async fn demote_previous(
    ctx: &SessionContext,
    setup: &FlowSetup,
    existing: &Existing,
    write: &mut VersionWrite,
) -> Result<()> {
    let (Some(flag), Some(old), Some(newest)) =
        (&setup.timeline.current_flag, &existing.max, &write.newest)
    else {
        return Ok(());
    };
    if old == newest || write.replace.contains(old) {
        return Ok(());
    }
    let start = Expr::Column(Column::new_unqualified(setup.timeline.valid_from.as_str()));
    let prev = ctx
        .table("__strata_target")
        .await
        .context(|| "reading the previous version".into())?
        .filter(start.eq(lit(old.clone())))
        .context(|| "reading the previous version".into())?
        .collect()
        .await
        .context(|| "reading the previous version".into())?;
    for b in prev {
        let b = arrow::cast_batch(&b, &setup.target_schema)?;
        let n = b.num_rows();
        write.parts.push(with_flag(&b, flag, false, n)?);
    }
    write.replace.push(old.clone());
    Ok(())
}

/// Replaces the rows of the written versions in the target (created on the first run) in
/// one commit, `commit`.
async fn commit_versions(
    scope: &Scope<'_>,
    setup: &FlowSetup,
    target_properties: &BTreeMap<String, String>,
    target: Option<DeltaTable>,
    write: VersionWrite,
    commit: &PendingCommit,
) -> Result<()> {
    let f = &setup.flow;
    let rows =
        concat_batches(&setup.target_schema, &write.parts).context(|| "snapshot rows".into())?;
    let target = match target {
        Some(t) => t,
        None => super::target::create_target(scope, setup, target_properties).await?,
    };
    let start = Expr::Column(Column::new_unqualified(setup.timeline.valid_from.as_str()));
    let predicate = start.in_list(write.replace.into_iter().map(lit).collect(), false);
    write_rows(
        target,
        vec![rows],
        RowChange::ReplaceWhere(predicate),
        commit,
    )
    .await
    .context(|| format!("flow {}: writing {}", f.name, f.target))?;
    Ok(())
}
