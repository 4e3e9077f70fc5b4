//! One input's rows made ready to commit: the table's query applied, the expectations,
//! and the checks of the flows that read the table (shared by every kind of source).

use crate::error::{Context, Result};
use crate::ops::ingest::IngestReport;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Source;
use crate::sql::expect;
use crate::storage::adopt;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::prelude::DataFrame;
use deltalake::datafusion::prelude::SessionContext;
use std::collections::HashMap;
use std::sync::Arc;
use strata_sql::SOURCE_PLACEHOLDER;

/// Where a query runs on each input of one run: with joins, a session over the warehouse
/// as it is now (the joined tables, the pipeline's views) and the query with its table
/// functions rewritten.
pub(super) struct Running {
    ctx: SessionContext,
    sql: String,
    /// An overlap window's rows already in the table (`sources/overlap.rs`): the query's
    /// rows equal to one of them are not appended again.
    pub(super) seen: Option<crate::sources::overlap::Seen>,
}

impl Running {
    pub(super) async fn new(wh: &Warehouse, setup: &IngestSetup) -> Result<Running> {
        let Some(j) = &setup.joins else {
            return Ok(Running {
                ctx: crate::storage::session::new_session(),
                sql: setup.query_sql.clone(),
                seen: None,
            });
        };
        let ctx = crate::sql::session::warehouse_session_in(wh, &j.schema).await?;
        crate::sql::views::register_views(wh, &ctx, &j.views, &j.schema, None)
            .await
            .map_err(|e| setup.err(e))?;
        let sql = crate::sql::session::rewrite(wh, &ctx, &setup.query_sql, &j.schema)
            .await
            .map_err(|e| setup.err(e))?;
        Ok(Running {
            ctx,
            sql,
            seen: None,
        })
    }
}

/// Applies the table's query to `input` rows and casts them to the table's schema. The flag
/// is true when the query passed the input's rows and columns through unchanged, already in
/// the table's column names and types (see `storage/adopt.rs`). Queries may run side by side
/// in sessions of their own (a [`Running`] each).
pub(super) async fn apply_query(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
) -> Result<(Vec<RecordBatch>, bool)> {
    let steps = crate::util::steps::Steps::new(setup.flow_name(), "ingest: ");
    let ctx = &running.ctx;
    let _ = ctx.deregister_table(SOURCE_PLACEHOLDER);
    ctx.register_table(SOURCE_PLACEHOLDER, input.into_view())
        .context(|| "registering input".into())?;
    let query = ctx
        .sql(&running.sql)
        .await
        .context(|| format!("streaming table {}", setup.table.name))?;
    let unchanged = adopt::passes_rows_through(query.logical_plan())
        && adopt::same_columns(query.schema().as_arrow(), &setup.schema);
    let batches = query
        .collect()
        .await
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    let cast = batches
        .iter()
        .map(|b| {
            // A database table that gained columns has them after its own, where the
            // query (in CDC mode) has them before the change columns.
            let database =
                matches!(setup.source, Source::Database { .. }) && setup.table.columns.is_none();
            if setup.append_flow.is_some() || database || matches!(setup.source, Source::Changes(_))
            {
                arrow::align_by_name(b, &setup.schema)
            } else {
                arrow::cast_batch(b, &setup.schema)
            }
        })
        .collect::<Result<Vec<_>>>()
        .map_err(|e| setup.err(format!("{place}: {e}")))?;
    crate::util::steps::step!(
        debug,
        steps,
        format_args!("read and applied the query ({place})")
    );
    Ok((
        cast.into_iter().filter(|b| b.num_rows() > 0).collect(),
        unchanged,
    ))
}

/// Rejects rows that a downstream flow would reject, naming `place`. Each flow's events,
/// checked, are added to `events` under the flow's name (for flows that read what is
/// appended).
async fn check_downstream(
    setup: &IngestSetup,
    rows: &[RecordBatch],
    place: &str,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    for flow_setup in &setup.downstream {
        let ctx = crate::storage::session::new_session();
        let table = MemTable::try_new(first.schema(), vec![rows.to_vec()])
            .context(|| "registering rows".into())?;
        ctx.register_table(SOURCE_PLACEHOLDER, Arc::new(table))
            .context(|| "registering rows".into())?;
        let checked = crate::eventstore::evaluate::evaluate_events(&ctx, flow_setup).await?;
        crate::semantics::events::validate_events(flow_setup, &checked, place)?;
        // A flow that takes its source's whole content (a snapshot in table mode) reads
        // the table, not the rows appended: nothing to keep for it.
        if !flow_setup.table_mode() {
            events
                .entry(flow_setup.flow.name.clone())
                .or_default()
                .extend(checked);
        }
    }
    Ok(())
}

/// The query's rows of one input, checked: expectations applied (counts added to
/// `report`), then the downstream flows' checks on the rows kept (their events added to
/// `events`). The flag is true when the rows are the input's, unchanged and all kept, in
/// the table's columns, with no NULL in a NOT NULL column.
pub(super) async fn checked_rows(
    setup: &IngestSetup,
    running: &Running,
    input: DataFrame,
    place: &str,
    report: &mut IngestReport,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<(Vec<RecordBatch>, bool)> {
    let queried = apply_query(setup, running, input, place).await?;
    checked_queried_rows(setup, running, queried, place, report, events).await
}

/// The rest of [`checked_rows`], for rows [`apply_query`] gave (`queried`, with its flag):
/// the rows an overlap window has seen dropped, the expectations applied, the downstream
/// flows' checks.
pub(super) async fn checked_queried_rows(
    setup: &IngestSetup,
    running: &Running,
    queried: (Vec<RecordBatch>, bool),
    place: &str,
    report: &mut IngestReport,
    events: &mut HashMap<String, Vec<RecordBatch>>,
) -> Result<(Vec<RecordBatch>, bool)> {
    let steps = crate::util::steps::Steps::new(setup.flow_name(), "ingest: ");
    let step =
        |what: &str| crate::util::steps::step!(debug, steps, format_args!("{what} ({place})"));
    let (mut rows, mut unchanged) = queried;
    if let Some(seen) = &running.seen {
        rows = seen.drop_seen(rows)?;
        unchanged = false;
    }
    let before: usize = rows.iter().map(RecordBatch::num_rows).sum();
    report.rows_read += before;
    if !setup.table.expectations.is_empty() {
        let all = deltalake::arrow::compute::concat_batches(&setup.schema, &rows)
            .context(|| "concatenating rows".into())?;
        let (kept, counts) = expect::apply(
            &setup.table.expectations,
            &setup.table.name.to_string(),
            place,
            all,
        )
        .await?;
        report.rows_dropped += before - kept.num_rows();
        unchanged &= kept.num_rows() == before;
        expect::accumulate(&mut report.expectations, counts);
        rows = vec![kept];
        step("applied the expectations");
    }
    check_downstream(setup, &rows, place, events).await?;
    step("checked the rows for the downstream flows");
    unchanged &= setup
        .schema
        .fields()
        .iter()
        .enumerate()
        .all(|(i, f)| f.is_nullable() || rows.iter().all(|b| b.column(i).null_count() == 0));
    Ok((rows, unchanged))
}
