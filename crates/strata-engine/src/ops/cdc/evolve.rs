//! Bringing an existing event store and target in line with the flow before it runs: the
//! columns it newly produces, and the target's deletion-vector setting.

use crate::error::{Context, EngineError, Result};
use crate::ops::cdc::setup::added_columns;
use crate::semantics::flow::FlowSetup;
use crate::storage::warehouse::Warehouse;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::Action;
use deltalake::kernel::MetadataExt;
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;

/// Adds the columns the flow now produces beyond those its event store and target have
/// (its source gained a column under `COLUMNS *`, or the flow lists more): one
/// metadata-only commit per table, so the rows already there read NULL in them. Returns
/// the columns added; `check_existing` has refused every other change of columns.
pub(crate) async fn evolve_tables(
    wh: &Warehouse,
    setup: &FlowSetup,
    target: Option<DeltaTable>,
) -> Result<Evolved> {
    let flow = &setup.flow;
    let mut added = Vec::new();
    let mut tables = [
        (
            wh.open_at(&wh.event_store_location(&flow.target)).await?,
            &setup.event_schema,
        ),
        (target, &setup.target_schema),
    ];
    for (table, want) in &mut tables {
        let Some(table) = table else { continue };
        let have = crate::storage::table::table_schema(table)?;
        let Some(new) = added_columns(&have, want).filter(|a| !a.is_empty()) else {
            continue;
        };
        let snapshot = table.snapshot().context(|| "reading table state".into())?;
        let st: deltalake::kernel::StructType = want.as_ref().try_into_kernel().map_err(|e| {
            EngineError::internal(format!("schema not representable in Delta: {e}"))
        })?;
        let fields: Vec<_> = st
            .fields()
            .filter(|f| new.contains(f.name()))
            .cloned()
            .collect();
        let metadata = snapshot.metadata().clone().with_schema(&st).map_err(|e| {
            EngineError::internal(format!("adding columns to {}: {e}", table.table_url()))
        })?;
        crate::storage::write::commit_actions(
            table,
            vec![Action::Metadata(metadata)],
            DeltaOperation::AddColumn { fields },
            &crate::storage::commit::PendingCommit::default(),
        )
        .await?;
        table
            .update_state()
            .await
            .context(|| format!("reading {} after adding columns", table.table_url()))?;
        for c in new {
            if !added.contains(&c) {
                added.push(c);
            }
        }
    }
    let [(store, _), (target, _)] = tables;
    Ok(Evolved {
        added,
        store,
        target,
    })
}

/// A flow's tables after [`evolve_tables`]: the columns it added, and the event store and
/// target as they now are (`None` where there is none yet), for the run to go on from
/// without opening them again.
pub(crate) struct Evolved {
    pub(crate) added: Vec<String>,
    pub(crate) store: Option<DeltaTable>,
    pub(crate) target: Option<DeltaTable>,
}

/// Sets the existing `target`'s `delta.enableDeletionVectors` to what the pipeline now
/// declares for it, when the two differ (the property was added to, or changed in, the
/// TBLPROPERTIES of a target that already exists); enabling it upgrades the table's
/// protocol. Returns the target as it now is, and the new setting when it changed. Vectors
/// already written stay valid either way; with the property off, the next run that
/// replaces their rows rewrites those files.
pub(crate) async fn follow_deletion_vectors(
    target: DeltaTable,
    setup: &FlowSetup,
    declared: &std::collections::BTreeMap<String, String>,
) -> Result<(DeltaTable, Option<bool>)> {
    let Some(want) = declared
        .get(crate::storage::dv::PROPERTY)
        .map(|v| v.eq_ignore_ascii_case("true"))
    else {
        return Ok((target, None));
    };
    let has = crate::storage::table::table_properties(&target)?
        .get(crate::storage::dv::PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if has == want {
        return Ok((target, None));
    }
    let target = target
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            crate::storage::dv::PROPERTY.to_string(),
            want.to_string(),
        )]))
        .await
        .context(|| {
            format!(
                "setting {} on {}",
                crate::storage::dv::PROPERTY,
                setup.flow.target
            )
        })?;
    Ok((target, Some(want)))
}
