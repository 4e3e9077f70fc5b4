//! Source rows to events: the flow's SELECT (output columns, sequence, operation) run over
//! rows registered in a session.

use crate::error::{Context, Result};
use crate::semantics::events::with_run;
use crate::semantics::events::without_run;
use crate::semantics::flow::FlowSetup;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::prelude::SessionContext;

/// Evaluates the flow's SELECT over `source` rows registered in `ctx` as the placeholder:
/// events without their run column, in batches as the query made them.
pub(crate) async fn evaluate_events(
    ctx: &SessionContext,
    setup: &FlowSetup,
) -> Result<Vec<RecordBatch>> {
    let batches = ctx
        .sql(&setup.select_sql)
        .await
        .context(|| format!("flow {}", setup.flow.name))?
        .collect()
        .await
        .context(|| format!("flow {}: evaluating events", setup.flow.name))?;
    let partial = without_run(setup);
    batches
        .iter()
        .map(|b| arrow::cast_batch(b, &partial))
        .collect()
}

/// [`evaluate_events`] as one batch of run `run`.
pub(crate) async fn events_from(
    ctx: &SessionContext,
    setup: &FlowSetup,
    run: i64,
) -> Result<RecordBatch> {
    with_run(setup, evaluate_events(ctx, setup).await?, run)
}
