//! `STORED AS SNAPSHOTS`: every delivery's rows with start = end = version, written straight
//! to the target. A redelivered version's rows are replaced in the same commit.

use crate::error::{Context, Result};
use crate::ops::cdc::FlowReport;
use crate::semantics::flow::FlowSetup;
use crate::semantics::snapshot::group_versions;
use crate::semantics::snapshot::reject_duplicate_keys;
use crate::semantics::snapshot::render_version;
use crate::semantics::snapshot::take_rows;
use crate::semantics::snapshot::with_flag;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::ArrayRef;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::lit;
use deltalake::datafusion::prelude::Expr;
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::protocol::SaveMode;

/// `STORED AS SNAPSHOTS`: every delivery's rows with start = end = version, written straight
/// to the target. A redelivered version's rows are replaced in the same commit.
pub(crate) async fn run_snapshots_mode(
    wh: &Warehouse,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<FlowReport> {
    let f = &setup.flow;
    let mut report = FlowReport {
        flow: f.name.clone(),
        ..Default::default()
    };
    let Some(source) = wh.open_table(&f.source).await? else {
        report.skipped = Some(format!("source {} has no data yet", f.source));
        return Ok(report);
    };
    let app_id = format!("strata-flow:{}", f.name);
    let target = wh.open_table(&f.target).await?;
    let from = match &target {
        Some(t) => crate::storage::table::txn_version(t, &app_id).await?,
        None => None,
    };
    let source_version = crate::storage::table::version_of(&source);
    if from.is_some_and(|v| v >= source_version) {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    let ctx = crate::storage::session::new_session();
    let files = if setup.table_mode() {
        None
    } else {
        Some(crate::storage::table::new_files(&source, from).await?)
    };
    crate::storage::session::register_table(&ctx, strata_sql::SOURCE_PLACEHOLDER, &source, files)
        .await?;
    let rows = crate::eventstore::evaluate::events_from(&ctx, setup, 0).await?;
    let place = format!("the rows of {}", f.source);
    crate::semantics::events::validate_events(setup, std::slice::from_ref(&rows), &place)?;
    let versions = group_versions(setup, &rows)?;
    report.source_versions = Some((from, source_version));
    report.events = rows.num_rows();
    if versions.groups.is_empty() {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    let timeline = &setup.timeline;
    let start_col = timeline.valid_from.clone();

    // Versions already in the target.
    let mut existing: Vec<ScalarValue> = Vec::new();
    if let Some(t) = &target {
        crate::storage::session::register_table(&ctx, "__strata_target", t, None).await?;
        let batches = ctx
            .sql(&format!(
                "SELECT DISTINCT {} FROM __strata_target",
                quote_ident(&start_col)
            ))
            .await
            .context(|| "reading versions".into())?
            .collect()
            .await
            .context(|| "reading versions".into())?;
        existing = arrow::scalars(&batches)?;
    }
    let old_max = existing
        .iter()
        .max_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))
        .cloned();
    let mut replace: Vec<ScalarValue> = Vec::new();
    let mut parts = Vec::new();
    let new_max = versions.groups.last().map(|g| g.0.clone());
    let overall_max = match (&old_max, &new_max) {
        (Some(a), Some(b)) if a > b => Some(a.clone()),
        (_, b) => b.clone(),
    };
    for (v, idx) in &versions.groups {
        if existing.contains(v) {
            report.notes.push(format!(
                "snapshot version {} redelivered: its rows are replaced",
                render_version(v)
            ));
        } else if old_max.as_ref().is_some_and(|m| m > v) {
            report.notes.push(format!(
                "snapshot version {} arrived after a later version was applied: added to history",
                render_version(v)
            ));
        }
        replace.push(v.clone());
        let snap = take_rows(&rows, idx)?;
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
            let current = overall_max.as_ref() == Some(v);
            mapped = with_flag(&mapped, flag, current, n)?;
        }
        report.rows_inserted += n;
        parts.push(mapped);
    }
    // The previous latest version is no longer current.
    if let (Some(flag), Some(old), Some(all)) = (&timeline.current_flag, &old_max, &overall_max) {
        if old != all && !replace.contains(old) {
            let prev = ctx
                .table("__strata_target")
                .await
                .context(|| "reading the previous version".into())?
                .filter(
                    Expr::Column(Column::new_unqualified(start_col.as_str())).eq(lit(old.clone())),
                )
                .context(|| "reading the previous version".into())?
                .collect()
                .await
                .context(|| "reading the previous version".into())?;
            for b in prev {
                let b = arrow::cast_batch(&b, &setup.target_schema)?;
                let n = b.num_rows();
                parts.push(with_flag(&b, flag, false, n)?);
            }
            replace.push(old.clone());
        }
    }
    let rows_out =
        concat_batches(&setup.target_schema, &parts).context(|| "snapshot rows".into())?;
    let handle = match target {
        Some(t) => t,
        None => {
            crate::storage::table::create_delta(
                &wh.table_path(&f.target),
                &f.target.name,
                &setup.target_schema,
                super::setup::target_configuration(setup, target_properties),
                None,
                setup.timeline.partition_columns(),
            )
            .await?
        }
    };
    let start_ref = Expr::Column(Column::new_unqualified(start_col.as_str()));
    let predicate = start_ref.in_list(replace.into_iter().map(lit).collect(), false);
    let props = crate::storage::write::writer_properties(&handle);
    handle
        .write(vec![rows_out])
        .with_writer_properties(props)
        .with_save_mode(SaveMode::Overwrite)
        .with_replace_where(predicate)
        .with_commit_properties(
            CommitProperties::default()
                .with_application_transaction(Transaction::new(&app_id, source_version)),
        )
        .await
        .context(|| format!("flow {}: writing {}", f.name, f.target))?;
    report.keys_changed = report.rows_inserted;
    Ok(report)
}
