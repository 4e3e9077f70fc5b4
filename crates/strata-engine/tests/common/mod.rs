//! Helpers shared by the engine's integration tests.

use strata_engine::Warehouse;

/// The result of `sql` over the warehouse as an aligned text grid (Arrow's pretty format).
pub async fn query_text(wh: &Warehouse, sql: &str) -> String {
    let (_, batches) = strata_engine::query(wh, sql).await.expect("query");
    deltalake::arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string()
}
