//! Reading the stored events (or a target's rows) of the keys a batch touches, through
//! DataFusion, or through the event store's page index (`pages.rs`) where it applies.

use crate::error::{Context, Result};
use crate::semantics::events::Touched;
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::OP_COL;
use crate::util::arrow;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::DeltaTable;

/// The stored events of the `touched` keys read through the page index of the event store
/// `store` (at `place`), when the flow has one integer key; `None` when that read does not
/// apply (other keys, every key touched, a store `pages::read_keys` cannot read exactly).
pub(crate) async fn read_touched_by_pages(
    store: &DeltaTable,
    place: &crate::storage::location::Location,
    setup: &FlowSetup,
    touched: &Touched,
) -> Result<Option<RecordBatch>> {
    let (Touched::Keys(keys), [key]) = (touched, setup.key_names.as_slice()) else {
        return Ok(None);
    };
    let Some(keys) = super::pages::int_keys(keys) else {
        return Ok(None);
    };
    super::pages::read_keys(store, place, key, keys, &setup.event_schema).await
}

pub(crate) async fn collect_sql(
    ctx: &SessionContext,
    sql: &str,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let batches = ctx
        .sql(sql)
        .await
        .context(|| format!("planning {sql}"))?
        .collect()
        .await
        .context(|| format!("running {sql}"))?;
    let cast = batches
        .iter()
        .map(|b| arrow::cast_batch(b, schema))
        .collect::<Result<Vec<_>>>()?;
    concat_batches(schema, &cast).context(|| "concatenating".into())
}

/// Rows of the table registered as `table` whose keys are in `touched` (plus, for the event
/// store, every truncate).
pub(crate) async fn read_slice(
    ctx: &SessionContext,
    setup: &FlowSetup,
    table: &str,
    touched: &Touched,
    schema: &SchemaRef,
    with_truncates: bool,
) -> Result<RecordBatch> {
    let sql = match touched {
        Touched::All => format!("SELECT * FROM {table}"),
        Touched::Keys(keys) => {
            let _ = ctx.deregister_table("__strata_keys");
            ctx.register_batch("__strata_keys", keys.clone())
                .context(|| "registering keys".into())?;
            let on = setup
                .key_names
                .iter()
                .map(|k| format!("t.{q} = k.{q}", q = quote_ident(k)))
                .collect::<Vec<_>>()
                .join(" AND ");
            let mut sql =
                format!("SELECT t.* FROM {table} t LEFT SEMI JOIN __strata_keys k ON {on}");
            if with_truncates {
                sql.push_str(&format!(
                    " UNION ALL SELECT * FROM {table} WHERE {} = 2",
                    quote_ident(OP_COL)
                ));
            }
            sql
        }
    };
    collect_sql(ctx, &sql, schema).await
}
