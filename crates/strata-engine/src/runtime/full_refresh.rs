//! `--full-refresh`: the guard (`pipelines.reset.allowed = false`) and setting the old
//! tables aside so the run rebuilds them from their sources.

use crate::error::{Context, EngineError, Result};
use crate::storage::location::Location;
use crate::storage::warehouse::Warehouse;
use strata_sql::PipelinePlan;
use strata_sql::TableName;

/// Refuses a full refresh that would reset a table declared (or created) with
/// `pipelines.reset.allowed = false`.
pub(crate) async fn check_reset_allowed(
    wh: &Warehouse,
    plan: &PipelinePlan,
    tables: &[TableName],
) -> Result<()> {
    const KEY: &str = "pipelines.reset.allowed";
    let mut refused = Vec::new();
    let mut history = Vec::new();
    for t in tables {
        let declared = plan
            .tables
            .get(t)
            .and_then(|d| d.properties.get(KEY).cloned())
            .or_else(|| {
                plan.materialized
                    .get(t)
                    .and_then(|m| m.properties.get(KEY).cloned())
            });
        // A table not created yet has nothing to lose.
        let Some(table) = wh.open_table(t).await? else {
            continue;
        };
        let stored = crate::storage::table::table_properties(&table)?
            .get(KEY)
            .cloned();
        // A change-history table holds what its source may no longer have: it is reset
        // only when its declaration says so explicitly.
        let is_history = plan.tables.get(t).is_some_and(|d| {
            matches!(
                d.query.as_ref().map(|q| &q.source),
                Some(strata_sql::QuerySource::Changes(_))
            )
        });
        if is_history
            && !declared
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            history.push(t.to_string());
            continue;
        }
        let guarded = [declared, stored]
            .iter()
            .flatten()
            .any(|v| v.eq_ignore_ascii_case("false"));
        if guarded {
            refused.push(t.to_string());
        }
    }
    if !history.is_empty() {
        return Err(EngineError::plan(format!(
            "full refresh refused: {} {} a change-history table, which keeps changes its \
             source may no longer hold; nothing was changed. To rebuild it anyway, declare \
             TBLPROPERTIES ('{KEY}' = 'true') on it",
            history.join(", "),
            if history.len() == 1 { "is" } else { "are" }
        )));
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(EngineError::plan(format!(
        "full refresh refused: {} ha{} pipelines.reset.allowed = false, so its history cannot \
         be wiped and rebuilt (its sources may no longer hold it); nothing was changed. \
         Refresh other tables by name, or change the property if a rebuild is really meant",
        refused.join(", "),
        if refused.len() == 1 { "s" } else { "ve" }
    )))
}

/// Moves each table (and its event store) out of the way, into
/// `<warehouse>/_strata/full_refresh/<run>/`, so the run rebuilds it from its sources and
/// the old content stays on disk until the user deletes it.
pub(crate) async fn set_aside(
    wh: &Warehouse,
    tables: &[TableName],
    run_id: &str,
) -> Result<Vec<(TableName, Location)>> {
    let base = wh.state_root().join("full_refresh").join(run_id);
    let mut out = Vec::new();
    for t in tables {
        let moves = [
            (wh.table_location(t), base.join(&t.schema).join(&t.name)),
            (
                wh.event_store_location(t),
                base.join("events").join(&t.schema).join(&t.name),
            ),
        ];
        let mut moved = false;
        for (from, to) in moves {
            wh.forget_table(&from);
            moved |= from.move_to(&to).await?;
        }
        // Caches derived from the old table and event store (the state digest, the record of
        // files taken) go: they are checked against what they were made for, but the rebuilt
        // table should not even meet them.
        if let Some(cache) = crate::eventstore::digest::dir_for(&wh.event_store_location(t)) {
            if cache.exists() {
                std::fs::remove_dir_all(&cache)
                    .context(|| format!("cannot remove {}", cache.display()))?;
            }
        }
        wh.taken_cache_location(t).remove_all().await?;
        if moved {
            out.push((t.clone(), base.join(&t.schema).join(&t.name)));
        }
    }
    Ok(out)
}
