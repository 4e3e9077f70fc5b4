//! DataFusion sessions with strata's settings, and Delta tables registered in them.

use crate::error::{Context, Result};
use deltalake::arrow::datatypes::{DataType, Field, FieldRef, TimeUnit};
use deltalake::datafusion::common::Result as DFResult;
use deltalake::datafusion::execution::context::QueryPlanner;
use deltalake::datafusion::execution::runtime_env::RuntimeEnv;
use deltalake::datafusion::execution::SessionStateBuilder;
use deltalake::datafusion::logical_expr::planner::TypePlanner;
use deltalake::datafusion::physical_optimizer::PhysicalOptimizerRule;
use deltalake::datafusion::prelude::SessionConfig;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::datafusion::sql::sqlparser::ast::DataType as SqlType;
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::TableName;

/// A DataFusion session with strata's settings: identifiers keep their case as written (so
/// `sequenceNum` means the column `sequenceNum`), and the default schema is `default`.
pub fn new_session() -> SessionContext {
    new_session_in(TableName::DEFAULT_SCHEMA)
}

/// [`new_session`] whose unqualified table names are in `schema`.
pub(crate) fn new_session_in(schema: &str) -> SessionContext {
    session_with(session_config(schema), None)
}

/// A session of `config` (and `runtime`, else the default one) that reads SQL types
/// ([`SparkTypes`]) and datetime patterns ([`super::spark_functions`]) as Spark does.
fn session_with(config: SessionConfig, runtime: Option<Arc<RuntimeEnv>>) -> SessionContext {
    session_planned_by(config, runtime, None, None)
}

/// [`session_with`], physical plans made by `planner` and rewritten by `physical_rules`
/// when given.
pub(crate) fn session_planned_by(
    config: SessionConfig,
    runtime: Option<Arc<RuntimeEnv>>,
    planner: Option<Arc<dyn QueryPlanner + Send + Sync>>,
    physical_rules: Option<Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>>,
) -> SessionContext {
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_type_planner(Arc::new(SparkTypes));
    if let Some(runtime) = runtime {
        state = state.with_runtime_env(runtime);
    }
    if let Some(planner) = planner {
        state = state.with_query_planner(planner);
    }
    if let Some(rules) = physical_rules {
        state = state.with_physical_optimizer_rules(rules);
    }
    let ctx = SessionContext::new_with_state(state.build());
    super::spark_functions::register(&ctx);
    ctx
}

/// `config` with the settings of [`file_session`]: strata's SQL settings, strings read into
/// the type tables store.
pub(crate) fn with_file_settings(config: SessionConfig) -> SessionConfig {
    let mut config = config
        .with_default_catalog_and_schema("strata", TableName::DEFAULT_SCHEMA)
        .with_create_default_catalog_and_schema(true)
        .with_information_schema(true);
    config.options_mut().sql_parser.enable_ident_normalization = false;
    config
        .options_mut()
        .execution
        .parquet
        .schema_force_view_types = false;
    config
}

/// The SQL types Spark has and DataFusion reads otherwise or not at all: `TIMESTAMP_NTZ`
/// (a wall-clock time, microseconds without a zone), `TIMESTAMP_LTZ` (an instant,
/// microseconds in UTC: Delta's `TIMESTAMP`) and `BINARY` (bytes of any length). DataFusion reads `TIMESTAMP` as nanoseconds
/// without a zone; the stored type of such a value is Delta's `TIMESTAMP`
/// ([`crate::util::arrow::storage_type`]).
#[derive(Debug)]
struct SparkTypes;

impl TypePlanner for SparkTypes {
    fn plan_type_field(&self, sql_type: &SqlType) -> DFResult<Option<FieldRef>> {
        Ok(spark_type(sql_type).map(|t| Arc::new(Field::new("", t, true))))
    }
}

/// The Arrow type of the Spark SQL types DataFusion does not read as Spark does.
fn spark_type(sql_type: &SqlType) -> Option<DataType> {
    match sql_type {
        SqlType::TimestampNtz(None) => Some(DataType::Timestamp(TimeUnit::Microsecond, None)),
        // Spark's BINARY has no length: variable-length bytes.
        SqlType::Binary(None) => Some(DataType::Binary),
        SqlType::Custom(name, args)
            if args.is_empty() && name.to_string().eq_ignore_ascii_case("TIMESTAMP_LTZ") =>
        {
            Some(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some(Arc::from("UTC")),
            ))
        }
        _ => None,
    }
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
    Ok(session_with(config, Some(runtime)))
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
    session_with(config, None)
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn type_of(sql: &str) -> DataType {
        let df = new_session().sql(sql).await.unwrap();
        df.schema().field(0).data_type().clone()
    }

    #[tokio::test]
    async fn spark_timestamp_types_are_microseconds() {
        assert_eq!(
            type_of("SELECT CAST('2024-01-01 10:00:00' AS TIMESTAMP_NTZ)").await,
            DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        assert_eq!(
            type_of("SELECT CAST('2024-01-01 10:00:00' AS TIMESTAMP_LTZ)").await,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        // DataFusion's own reading of TIMESTAMP stays (an instant without a zone); what is
        // stored of it is Delta's TIMESTAMP.
        assert_eq!(
            type_of("SELECT CAST('2024-01-01' AS TIMESTAMP)").await,
            DataType::Timestamp(TimeUnit::Nanosecond, None)
        );
    }

    #[tokio::test]
    async fn spark_binary_is_bytes_of_any_length() {
        assert_eq!(
            type_of("SELECT CAST('abc' AS BINARY)").await,
            DataType::Binary
        );
    }
}
