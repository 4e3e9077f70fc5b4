//! DataFusion sessions with strata's settings, and Delta tables registered in them.

use crate::error::{Context, Result};
use deltalake::datafusion::prelude::SessionConfig;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use strata_sql::TableName;

/// A DataFusion session with strata's settings: identifiers keep their case as written (so
/// `sequenceNum` means the column `sequenceNum`), and the default schema is `default`.
pub fn new_session() -> SessionContext {
    new_session_in(TableName::DEFAULT_SCHEMA)
}

/// [`new_session`] whose unqualified table names are in `schema`.
pub(crate) fn new_session_in(schema: &str) -> SessionContext {
    SessionContext::new_with_config(session_config(schema))
}

fn session_config(schema: &str) -> SessionConfig {
    let mut config = SessionConfig::new()
        .with_default_catalog_and_schema("strata", schema)
        .with_create_default_catalog_and_schema(true)
        .with_information_schema(true);
    config.options_mut().sql_parser.enable_ident_normalization = false;
    config
}

/// A session for one sort over a whole table that need not fit in memory: `partitions`
/// sorters sharing the budget (one keeps the whole budget its own), operators spilling to
/// disk once they hold `memory` bytes in all, and a reservation kept back for merging what
/// was spilled.
pub(crate) fn spilling_session(memory: usize, partitions: usize) -> Result<SessionContext> {
    use deltalake::datafusion::execution::memory_pool::FairSpillPool;
    let runtime = deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_pool(std::sync::Arc::new(FairSpillPool::new(memory)))
        .build_arc()
        .context(|| "setting up a session".into())?;
    let mut config =
        session_config(TableName::DEFAULT_SCHEMA).with_target_partitions(partitions.max(1));
    config.options_mut().execution.sort_spill_reservation_bytes = (memory / 8).max(1 << 20);
    Ok(SessionContext::new_with_config_rt(config, runtime))
}

/// A session for reading input files: their strings decode straight into the string type
/// tables store, instead of into string views that every row is then copied out of (for a
/// 10M-row snapshot file, about a third less memory and time).
pub(crate) fn file_session() -> SessionContext {
    let mut config = session_config(TableName::DEFAULT_SCHEMA);
    config
        .options_mut()
        .execution
        .parquet
        .schema_force_view_types = false;
    SessionContext::new_with_config(config)
}

/// Reads every row of `table` restricted to `files` (all files when `None`) in a new session.
pub(crate) async fn register_table(
    ctx: &SessionContext,
    name: &str,
    table: &DeltaTable,
    files: Option<Vec<String>>,
) -> Result<()> {
    table
        .update_datafusion_session(&ctx.state())
        .context(|| "registering object store".into())?;
    let mut builder = table.table_provider();
    if let Some(f) = files {
        builder = builder.with_file_paths(f);
    }
    let provider = builder
        .await
        .context(|| format!("reading {}", table.table_url()))?;
    ctx.register_table(name, provider)
        .context(|| format!("registering {name}"))?;
    Ok(())
}
