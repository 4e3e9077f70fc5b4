//! The pipeline's views (`CREATE VIEW`), registered in a session for the queries that read
//! them.

use crate::error::{EngineError, Result};
use crate::sql::session::rewrite;
use crate::sql::session::{reference_in, rewrite_shape};
use crate::storage::warehouse::Warehouse;
use deltalake::datafusion::prelude::SessionContext;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use strata_sql::TableName;
use strata_sql::View;

/// Registers every view of the pipeline in `ctx` (each after the views it reads). With
/// `shapes`, for planning only: the table functions in the views read the tables' columns
/// (see [`rewrite_shape`]), and views that read a table outside `shapes` are
/// left out.
pub(crate) async fn register_views(
    wh: &Warehouse,
    ctx: &SessionContext,
    views: &BTreeMap<TableName, View>,
    schema: &str,
    shapes: Option<&crate::sql::shapes::Shapes>,
) -> Result<()> {
    let mut done: BTreeSet<&TableName> = BTreeSet::new();
    // With shapes, a view that reads a table without one (or such a view) is left out.
    let mut left_out: BTreeSet<&TableName> = BTreeSet::new();
    while done.len() < views.len() {
        let before = done.len();
        for (name, v) in views {
            if done.contains(name)
                || v.query
                    .reads
                    .iter()
                    .any(|r| views.contains_key(r) && !done.contains(r))
            {
                continue;
            }
            let unknown = |r: &TableName| match views.contains_key(r) {
                true => left_out.contains(r),
                false => shapes.is_some_and(|s| !s.contains_key(r)),
            };
            if v.query.reads.iter().any(unknown) {
                left_out.insert(name);
                done.insert(name);
                continue;
            }
            let sql = match shapes {
                Some(s) => rewrite_shape(ctx, &v.query.sql, schema, s)?,
                None => rewrite(wh, ctx, &v.query.sql, schema).await?,
            };
            let reference = reference_in(ctx, name)?;
            ctx.sql(&format!("CREATE OR REPLACE VIEW {reference} AS {sql}"))
                .await
                .map_err(|e| EngineError::plan(format!("view {name}: {e}")))?;
            done.insert(name);
        }
        if done.len() == before {
            return Err(EngineError::internal("views form a cycle"));
        }
    }
    Ok(())
}
