//! Delivering a PostgreSQL sink (`CREATE SINK s OPTIONS (format 'postgresql', ...)`).
//!
//! The flows into such a sink write its outbox, a Delta table of the warehouse under the
//! sink's name, as they write any table (append flows append, AUTO CDC flows keep the
//! current state or the history), with their positions in the outbox's commits. After each
//! flow into the sink, [`deliver`] sends the PostgreSQL table what the outbox gained since
//! the version the table last received, in one PostgreSQL transaction that also records the
//! version sent (`strata-sources`' `PgSink`). So a crash after the outbox's commit and
//! before the delivery's leaves the rows in the outbox, and the next run sends them; no
//! version is ever sent twice.
//!
//! What is sent: an append-only outbox's added rows, streamed; an AUTO CDC outbox's rows of
//! every key a change touched, which replace that key's rows in the PostgreSQL table (its
//! primary key: the flow's keys, with `__START_AT` for SCD type 2); on its first delivery,
//! all of its rows, streamed.

use crate::error::{Context, EngineError, Result};
use crate::ops::Scope;
use crate::sources::connection::{connection_spec, process_env};
use crate::storage::feed;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::prelude::{DataFrame, SessionContext};
use deltalake::DeltaTable;
use std::sync::Arc;
use strata_sql::{PipelinePlan, ScdType, SinkTarget, StreamingTable};

/// What one delivery sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SinkReport {
    /// The PostgreSQL table.
    pub table: String,
    /// The outbox version the table holds after the delivery (`None`: no outbox yet).
    pub version: Option<i64>,
    /// Outbox versions sent in this delivery (0: the table was up to date).
    pub versions_sent: i64,
    /// Rows copied into the table.
    pub rows: u64,
    /// Keys whose rows were replaced (an AUTO CDC sink).
    pub keys_replaced: usize,
    /// Columns the PostgreSQL table lacked and was given (NULL in its earlier rows).
    pub columns_added: Vec<String>,
}

impl SinkReport {
    /// One line for the event log and progress display.
    pub fn summary(&self) -> String {
        if self.versions_sent == 0 {
            return format!("postgresql table {} is up to date", self.table);
        }
        let mut m = format!(
            "{} row(s) sent to postgresql table {} (through outbox version {}",
            self.rows,
            self.table,
            self.version.unwrap_or(-1)
        );
        if self.keys_replaced > 0 {
            m.push_str(&format!(", {} key(s) replaced", self.keys_replaced));
        }
        m.push(')');
        if !self.columns_added.is_empty() {
            m.push_str(&format!(
                "; added column(s) {} to it",
                self.columns_added.join(", ")
            ));
        }
        m
    }
}

/// How the rows of an outbox are sent: the keys whose rows replace theirs (AUTO CDC), and
/// the PostgreSQL table's primary key.
struct Keys {
    replaced: Vec<String>,
    primary: Vec<String>,
}

/// The PostgreSQL sink `table` is, if it is one: its connection's name and table.
pub(crate) fn database_sink(table: &StreamingTable) -> Option<(&str, &str)> {
    match &table.sink {
        Some(SinkTarget::Database { connection, table }) => Some((connection, table)),
        _ => None,
    }
}

/// Sends the PostgreSQL table of sink `sink` what its outbox gained since the version it
/// holds, in one transaction (see the module docs): the outbox as it is now, the table's
/// delivered version (locked), then the rows sent and the new version committed.
pub(crate) async fn deliver(
    scope: &Scope<'_>,
    plan: &PipelinePlan,
    sink: &StreamingTable,
) -> Result<SinkReport> {
    let (connection, target) = database_sink(sink)
        .ok_or_else(|| EngineError::internal(format!("{} is not a database sink", sink.name)))?;
    let mut report = SinkReport {
        table: target.to_string(),
        ..Default::default()
    };
    let Some(outbox) = Outbox::open(scope, sink).await? else {
        return Ok(report);
    };
    let keys = sink_keys(plan, sink);
    let context = || format!("sink {}", sink.name);
    let spec = plan
        .connections
        .get(connection)
        .map(|c| connection_spec(c, &process_env))
        .ok_or_else(|| {
            EngineError::internal(format!(
                "sink {}: connection {connection} is missing",
                sink.name
            ))
        })??;
    let mut pg = strata_sources::PgSink::connect(&spec, target, &outbox.id)
        .await
        .context(context)?;
    let primary = keys.as_ref().map_or(&[][..], |k| &k.primary[..]);
    let delivered = pg.begin(&outbox.schema, primary).await.context(context)?;
    report.version = delivered;
    if delivered.is_some_and(|d| d >= outbox.version) {
        pg.rollback().await.context(context)?;
        return Ok(report);
    }
    report.rows = send(&mut pg, &outbox, keys.as_ref(), delivered, &mut report).await?;
    report.columns_added = pg.columns_added().to_vec();
    pg.finish(outbox.version).await.context(context)?;
    report.version = Some(outbox.version);
    report.versions_sent = outbox.version - delivered.unwrap_or(-1);
    Ok(report)
}

/// A sink's outbox as a delivery reads it: at one version, with its columns and its Delta
/// table id (which the PostgreSQL table's position names).
struct Outbox {
    table: DeltaTable,
    version: i64,
    schema: SchemaRef,
    id: String,
}

impl Outbox {
    /// The outbox of `sink` as it is now (`None`: no flow has written it yet).
    async fn open(scope: &Scope<'_>, sink: &StreamingTable) -> Result<Option<Outbox>> {
        let Some(table) = scope.wh.open_table(&sink.name).await? else {
            return Ok(None);
        };
        let id = table
            .snapshot()
            .context(|| format!("sink {}: reading its outbox", sink.name))?
            .metadata()
            .id()
            .to_string();
        Ok(Some(Outbox {
            version: crate::storage::table::version_of(&table),
            schema: crate::storage::table::table_schema(&table)?,
            table,
            id,
        }))
    }
}

/// Sends the outbox's rows after version `delivered` in the delivery `pg` began: appended
/// rows, or an AUTO CDC outbox's first delivery (all of it), streamed; later AUTO CDC
/// deliveries replace the rows of the keys the changes since then touched. Returns the rows
/// copied.
async fn send(
    pg: &mut strata_sources::PgSink,
    outbox: &Outbox,
    keys: Option<&Keys>,
    delivered: Option<i64>,
    report: &mut SinkReport,
) -> Result<u64> {
    let context = || format!("postgresql table {}", report.table);
    let columns: Vec<String> = outbox
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let ctx = crate::storage::session::new_session();
    match (keys, delivered) {
        (None, _) | (Some(_), None) => {
            let rows = match keys {
                None => added_rows(&ctx, outbox, delivered).await?,
                Some(_) => {
                    crate::storage::session::register_table(&ctx, "outbox", &outbox.table, None)
                        .await?;
                    select_columns(&ctx, "outbox", &outbox.schema).await?
                }
            };
            let stream = rows
                .execute_stream()
                .await
                .context(|| "reading the sink's outbox".into())?;
            pg.copy_rows(&columns, stream).await.context(context)
        }
        (Some(keys), Some(_)) => {
            let changes =
                feed::read_feed(&outbox.table, delivered, Some(outbox.version), true).await?;
            let (touched, rows) = touched_rows(&ctx, outbox, changes, &keys.replaced).await?;
            report.keys_replaced = touched.iter().map(RecordBatch::num_rows).sum();
            pg.delete_keys(&keys.replaced, &touched)
                .await
                .context(context)?;
            let rows = futures::stream::iter(rows.into_iter().map(Ok::<_, String>));
            pg.copy_rows(&columns, rows).await.context(context)
        }
    }
}

/// The keys of the AUTO CDC flow writing `sink` (`None`: append flows only).
fn sink_keys(plan: &PipelinePlan, sink: &StreamingTable) -> Option<Keys> {
    let flow = plan.flows.iter().find(|f| f.target == sink.name)?;
    let mut primary = flow.keys.clone();
    if flow.stored_as == ScdType::Type2 {
        primary.push("__START_AT".to_string());
    }
    Some(Keys {
        replaced: flow.keys.clone(),
        primary,
    })
}

/// The rows an append-only outbox gained after version `from`, up to the version read, read
/// as a streaming table reads its source's new rows (not through the change feed, whose
/// `_change_type` column a sink of change rows also has).
async fn added_rows(ctx: &SessionContext, outbox: &Outbox, from: Option<i64>) -> Result<DataFrame> {
    let table = &outbox.table;
    let changes = crate::storage::changes::changes_since(table, from).await?;
    crate::storage::changes::register_new_rows(
        ctx,
        "outbox_rows",
        table,
        from,
        outbox.version,
        &changes,
    )
    .await?;
    select_columns(ctx, "outbox_rows", &outbox.schema).await
}

/// The columns of `schema` (the outbox's, in its order) of the table `name` in `ctx`.
async fn select_columns(ctx: &SessionContext, name: &str, schema: &SchemaRef) -> Result<DataFrame> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| quote_ident(f.name()))
        .collect::<Vec<_>>()
        .join(", ");
    ctx.sql(&format!("SELECT {columns} FROM {}", quote_ident(name)))
        .await
        .context(|| "reading the sink's outbox".into())
}

/// The distinct keys `changes` touch, and the outbox's rows (as of the version read) of
/// those keys.
async fn touched_rows(
    ctx: &SessionContext,
    outbox: &Outbox,
    changes: RecordBatch,
    keys: &[String],
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
    let what = || "reading the sink's rows".to_string();
    ctx.register_batch("changes", changes).context(what)?;
    crate::storage::session::register_table(ctx, "outbox", &outbox.table, None).await?;
    let list = keys
        .iter()
        .map(|k| quote_ident(k))
        .collect::<Vec<_>>()
        .join(", ");
    let touched = ctx
        .sql(&format!("SELECT DISTINCT {list} FROM changes"))
        .await
        .context(what)?;
    let touched_schema = Arc::new(touched.schema().as_arrow().clone());
    let touched = touched.collect().await.context(what)?;
    ctx.register_table(
        "touched",
        Arc::new(MemTable::try_new(touched_schema, vec![touched.clone()]).context(what)?),
    )
    .context(what)?;
    let columns = outbox
        .schema
        .fields()
        .iter()
        .map(|f| format!("o.{}", quote_ident(f.name())))
        .collect::<Vec<_>>()
        .join(", ");
    let matches = keys
        .iter()
        .map(|k| format!("t.{k} = o.{k}", k = quote_ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let rows = ctx
        .sql(&format!(
            "SELECT {columns} FROM outbox o WHERE EXISTS (SELECT 1 FROM touched t WHERE {matches})"
        ))
        .await
        .context(what)?
        .collect()
        .await
        .context(what)?;
    Ok((touched, rows))
}
