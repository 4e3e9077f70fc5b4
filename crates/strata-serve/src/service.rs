//! The PostgreSQL protocol's query handlers over a warehouse: the simple query protocol
//! (a text of statements) and the extended one (parse, bind with parameters, describe,
//! execute). Every read goes through `strata query`'s preparation
//! ([`strata_engine::prepare_query`]) on a session opened for that statement, so each
//! statement reads the latest committed version of every table, tables created since the
//! server started included. A prepared statement is planned again when it runs.

use crate::catalog::{self, Names};
use crate::pg_syntax::{self, Adapted};
use crate::statement::{first_words, kind_of, refusal, split_statements, Kind};
use crate::types::{decode_parameter, pg_type, type_size, Column};
use async_trait::async_trait;
use bytes::BytesMut;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::common::ParamValues;
use deltalake::datafusion::execution::context::SQLOptions;
use deltalake::datafusion::execution::memory_pool::FairSpillPool;
use deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder;
use deltalake::datafusion::execution::session_state::SessionStateBuilder;
use deltalake::datafusion::logical_expr::LogicalPlan;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::datafusion::scalar::ScalarValue;
use futures::stream::BoxStream;
use futures::{Sink, StreamExt};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, Type, METADATA_USER};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::messages::PgWireBackendMessage;
use std::fmt::Debug;
use std::sync::Arc;
use strata_engine::{EngineError, PreparedQuery, SqlQuery, Warehouse};

/// The client metadata key holding the connection's schema of unqualified names (set by
/// `USE`).
const SCHEMA_KEY: &str = "strata.schema";

/// Answers a connection's queries over one warehouse.
pub(crate) struct Service {
    pub(crate) parser: Arc<StatementParser>,
    /// Permits to run a read: at most this many plan and compute at once, the others wait.
    pub(crate) running: Arc<tokio::sync::Semaphore>,
}

impl Service {
    /// A service over `wh` running at most `max_queries` reads at once (at least one),
    /// and each within `query_memory` bytes.
    pub(crate) fn new(wh: Warehouse, max_queries: usize, query_memory: usize) -> Service {
        Service {
            parser: Arc::new(StatementParser { wh, query_memory }),
            running: Arc::new(tokio::sync::Semaphore::new(max_queries.max(1))),
        }
    }

    /// Waits for a permit to run a read (held while it plans and until its first rows are
    /// ready; rows already flowing hold none, so one client's statements cannot wait on
    /// each other).
    pub(crate) async fn permit(&self) -> PgWireResult<tokio::sync::SemaphorePermit<'_>> {
        self.running
            .acquire()
            .await
            .map_err(|_| user_error("57P01", "the server is stopping".to_string()))
    }
}

/// Plans statements through `strata query`'s path.
pub(crate) struct StatementParser {
    pub(crate) wh: Warehouse,
    /// The memory one statement's operators may hold (sorts and aggregates spill to the
    /// temp dir past it where they can, else the statement fails).
    query_memory: usize,
}

/// A statement of the extended protocol as parsed: what to run when it is executed.
#[derive(Clone, Debug)]
pub(crate) enum Prepared {
    /// A read, planned again when executed: its result columns and parameter types as
    /// parsed.
    Read {
        sql: String,
        columns: SchemaRef,
        parameters: Vec<Option<DataType>>,
    },
    /// `USE`: the schema it selects.
    Use(String),
    /// A setting, `SHOW` or transaction statement.
    Session(String),
}

impl Prepared {
    /// The statement as the client wrote it, for the log.
    fn text(&self) -> String {
        match self {
            Prepared::Read { sql, .. } | Prepared::Session(sql) => sql.clone(),
            Prepared::Use(schema) => format!("USE {schema}"),
        }
    }
}

/// A read ready to run: rows already read (`DESCRIBE`, `SHOW TABLES`) or a plan over a
/// session of the warehouse.
pub(crate) enum Planned {
    Rows(SchemaRef, Vec<RecordBatch>),
    Plan {
        query: Box<SqlQuery>,
        plan: Box<LogicalPlan>,
    },
}

/// Who is asking: the connection's schema of unqualified names (if `USE` set one) and
/// user.
pub(crate) struct Asker {
    schema: Option<String>,
    user: String,
}

impl Asker {
    /// A client of `user` whose unqualified names are in the default schema.
    pub(crate) fn new(user: &str) -> Asker {
        Asker {
            schema: None,
            user: user.to_string(),
        }
    }
}

fn asker<C: ClientInfo + ?Sized>(client: &C) -> Asker {
    let meta = client.metadata();
    Asker {
        schema: meta.get(SCHEMA_KEY).cloned(),
        user: meta.get(METADATA_USER).cloned().unwrap_or_default(),
    }
}

impl StatementParser {
    /// `sql` (one statement) prepared through `strata query`'s path and planned; only
    /// reads plan.
    pub(crate) async fn plan_read(&self, sql: &str, asker: &Asker) -> PgWireResult<Planned> {
        let adapted = match pg_syntax::adapt(sql) {
            Adapted::Same => None,
            Adapted::Sql(sql) => Some(sql),
            Adapted::NoRows(columns) => return Ok(Planned::Rows(text_columns(&columns), vec![])),
        };
        let sql = adapted.as_deref().unwrap_or(sql);
        let prepared = strata_engine::prepare_query(&self.wh, sql, asker.schema.as_deref())
            .await
            .map_err(engine_error)?;
        let query = match prepared {
            PreparedQuery::Rows(columns, rows) => return Ok(Planned::Rows(columns, rows)),
            PreparedQuery::Use(_) => {
                return Err(user_error(
                    "42601",
                    "USE must be a statement of its own".to_string(),
                ))
            }
            PreparedQuery::Sql(query) => query,
        };
        let mut query = query;
        query.session = within_memory(&query.session, self.query_memory)
            .map_err(|e| user_error("XX000", format!("setting up a session: {e}")))?;
        let names = Names {
            database: self.wh.catalog(),
            schema: &query.schema,
            user: &asker.user,
        };
        catalog::register(&query.session, &names, &query.sql)
            .await
            .map_err(|e| user_error("XX000", format!("setting up pg_catalog: {e}")))?;
        let plan = query
            .session
            .state()
            .create_logical_plan(&query.sql)
            .await
            .map_err(|e| engine_error(query.error(e)))?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| {
                user_error(
                    "25006",
                    format!("strata serve is read-only: {}", e.strip_backtrace()),
                )
            })?;
        Ok(Planned::Plan {
            query: Box::new(query),
            plan: Box::new(plan),
        })
    }

    /// The schema `sql` (a `USE` statement) selects.
    async fn schema_of_use(&self, sql: &str) -> PgWireResult<String> {
        match strata_engine::prepare_query(&self.wh, sql, None)
            .await
            .map_err(engine_error)?
        {
            PreparedQuery::Use(schema) => Ok(schema),
            _ => Err(user_error(
                "42601",
                format!("`{sql}` is not USE CATALOG name, USE SCHEMA name or USE name"),
            )),
        }
    }

    /// Runs `planned` with `parameters` bound, its rows in `format`.
    async fn run(
        &self,
        planned: Planned,
        parameters: Vec<ScalarValue>,
        format: &Format,
    ) -> PgWireResult<Response> {
        match planned {
            Planned::Rows(columns, rows) => {
                Ok(Response::Query(encode_rows(&columns, &rows, format)?))
            }
            Planned::Plan { query, plan } => {
                let plan = match parameters.is_empty() {
                    true => *plan,
                    false => plan
                        .replace_params_with_values(&ParamValues::from(parameters))
                        .map_err(|e| engine_error(query.error(e)))?,
                };
                let columns: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
                let mut batches = query
                    .session
                    .execute_logical_plan(plan)
                    .await
                    .map_err(|e| engine_error(query.error(e)))?
                    .execute_stream()
                    .await
                    .map_err(|e| engine_error(query.error(e)))?;
                // The plan runs to its first batch here, where a client's cancel request
                // can stop it (an aggregate or a sort does its work before its first
                // batch); the rest is encoded and sent batch by batch as it comes.
                let first = batches.next().await;
                let batches = futures::stream::iter(first).chain(batches);
                let binary = binary_columns(&columns, format);
                let rows = batches.flat_map(move |batch| {
                    let rows = match batch {
                        Ok(batch) => encode_batch(&batch, &binary),
                        Err(e) => {
                            let message = format!("query: {}", e.strip_backtrace());
                            let code = match message.contains("Resources exhausted") {
                                true => "53200",
                                false => "58000",
                            };
                            vec![Err(user_error(code, message))]
                        }
                    };
                    futures::stream::iter(rows)
                });
                let fields = Arc::new(fields(&columns, format));
                Ok(Response::Query(QueryResponse::new(fields, rows)))
            }
        }
    }

    /// Runs `planned` (no parameters) to its first batch: its columns, and its batches as
    /// they come (an error in them is the message for the client).
    pub(crate) async fn stream(
        &self,
        planned: Planned,
    ) -> PgWireResult<(SchemaRef, BoxStream<'static, Result<RecordBatch, String>>)> {
        match planned {
            Planned::Rows(columns, rows) => Ok((
                columns,
                futures::stream::iter(rows.into_iter().map(Ok)).boxed(),
            )),
            Planned::Plan { query, plan } => {
                let columns: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
                let mut batches = query
                    .session
                    .execute_logical_plan(*plan)
                    .await
                    .map_err(|e| engine_error(query.error(e)))?
                    .execute_stream()
                    .await
                    .map_err(|e| engine_error(query.error(e)))?;
                let first = batches.next().await;
                let batches = futures::stream::iter(first)
                    .chain(batches)
                    .map(|b| b.map_err(|e| format!("query: {}", e.strip_backtrace())));
                Ok((columns, batches.boxed()))
            }
        }
    }

    /// The extended protocol's Parse: one statement, planned to describe it.
    async fn parse_one(&self, asker: &Asker, sql: &str) -> PgWireResult<Option<Prepared>> {
        let mut statements = split_statements(sql);
        let sql = match statements.len() {
            0 => return Ok(None),
            1 => statements.remove(0),
            _ => {
                return Err(user_error(
                    "42601",
                    "a prepared statement holds one statement".to_string(),
                ))
            }
        };
        match kind_of(&sql) {
            Kind::Refused(kind) => Err(user_error("25006", refusal(&kind))),
            Kind::Use => Ok(Some(Prepared::Use(self.schema_of_use(&sql).await?))),
            Kind::Session => Ok(Some(Prepared::Session(sql))),
            Kind::Read => {
                let (columns, parameters) = match self.plan_read(&sql, asker).await? {
                    Planned::Rows(columns, _) => (columns, Vec::new()),
                    Planned::Plan { plan, .. } => (
                        Arc::new(plan.schema().as_arrow().clone()),
                        parameter_types(&plan)?,
                    ),
                };
                Ok(Some(Prepared::Read {
                    sql,
                    columns,
                    parameters,
                }))
            }
        }
    }
}

/// `session` (its tables, functions and object stores) with a memory pool of `bytes` of
/// its own.
/// A schema of text columns named `names`.
fn text_columns(names: &[String]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ))
}

fn within_memory(
    session: &SessionContext,
    bytes: usize,
) -> deltalake::datafusion::error::Result<SessionContext> {
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(session.runtime_env().object_store_registry.clone())
        .with_memory_pool(Arc::new(FairSpillPool::new(bytes)))
        .build_arc()?;
    let state = SessionStateBuilder::new_from_existing(session.state())
        .with_runtime_env(runtime)
        .build();
    Ok(SessionContext::new_with_state(state))
}

/// The result columns of `columns` for the client, each in its format of `format`.
fn fields(columns: &Schema, format: &Format) -> Vec<FieldInfo> {
    columns
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (t, modifier) = pg_type(f.data_type());
            let size = type_size(&t);
            FieldInfo::new(f.name().clone(), None, None, t, format.format_for(i))
                .with_type_size(size)
                .with_type_modifier(modifier)
        })
        .collect()
}

/// `rows` of `columns` as a query response, each column in its format of `format`.
fn encode_rows(
    columns: &Schema,
    rows: &[RecordBatch],
    format: &Format,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(fields(columns, format));
    let binary = binary_columns(columns, format);
    let out: Vec<_> = rows
        .iter()
        .flat_map(|batch| encode_batch(batch, &binary))
        .collect();
    Ok(QueryResponse::new(fields, futures::stream::iter(out)))
}

/// Which of `columns` the client wants in binary.
fn binary_columns(columns: &Schema, format: &Format) -> Vec<bool> {
    (0..columns.fields().len())
        .map(|i| format.format_for(i) == FieldFormat::Binary)
        .collect()
}

/// The rows of `batch` as DataRows, column `i` in binary when `binary[i]`; an encoding
/// error ends them.
fn encode_batch(batch: &RecordBatch, binary: &[bool]) -> Vec<PgWireResult<DataRow>> {
    let encoding_error = |e| user_error("XX000", format!("encoding a result: {e}"));
    let encoders = match batch
        .columns()
        .iter()
        .enumerate()
        .map(|(i, a)| Column::new(a, binary.get(i).copied().unwrap_or(false)))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(encoders) => encoders,
        Err(e) => return vec![Err(encoding_error(e))],
    };
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut data = BytesMut::new();
        for column in &encoders {
            if let Err(e) = column.encode(row, &mut data) {
                out.push(Err(encoding_error(e)));
                return out;
            }
        }
        out.push(Ok(DataRow::new(data, encoders.len() as i16)));
    }
    out
}

/// The parameters of `plan` in order (`$1`, `$2`, ...), with their types where DataFusion
/// inferred them.
pub(crate) fn parameter_types(plan: &LogicalPlan) -> PgWireResult<Vec<Option<DataType>>> {
    let found = plan
        .get_parameter_types()
        .map_err(|e| user_error("42P18", format!("parameter types: {e}")))?;
    let mut numbered: Vec<(usize, Option<DataType>)> = found
        .into_iter()
        .filter_map(|(name, t)| {
            let n = name.trim_start_matches('$').parse::<usize>().ok()?;
            Some((n, t))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| *n);
    let count = numbered.last().map_or(0, |(n, _)| *n);
    let mut types = vec![None; count];
    for (n, t) in numbered {
        if n >= 1 {
            types[n - 1] = t;
        }
    }
    Ok(types)
}

/// The PostgreSQL type of a parameter of Arrow type `t` (text when not known).
fn parameter_pg_type(t: &Option<DataType>) -> Type {
    t.as_ref().map_or(Type::TEXT, |t| pg_type(t).0)
}

/// An error for the client with its SQLSTATE `code`.
pub(crate) fn user_error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        code.to_string(),
        message,
    )))
}

/// The SQLSTATE of an engine error: a missing table, SQL that does not parse, an unknown
/// column, another mistake in the query, anything else.
pub(crate) fn sqlstate(e: &EngineError, message: &str) -> &'static str {
    match e {
        EngineError::NotFound(_) => "42P01",
        EngineError::Plan { .. }
            if message.contains("ParserError") || message.contains("arser error") =>
        {
            "42601"
        }
        EngineError::Plan { .. } if message.contains("No field named") => "42703",
        EngineError::Plan { .. } if message.contains("not found") => "42P01",
        EngineError::Plan { .. } | EngineError::BadInput(_) => "42000",
        _ if message.contains("Resources exhausted") => "53200",
        EngineError::Internal(_) => "XX000",
        _ => "58000",
    }
}

/// An engine error for the client: the whole chain on one line, with its SQLSTATE.
fn engine_error(e: EngineError) -> PgWireError {
    let message = strata_engine::chain(&e);
    user_error(sqlstate(&e, &message), message)
}

/// Where in `sql` (1-based, in characters) the parser's error `message` ("... at Line: 2,
/// Column: 5") points, for the client to show.
pub(crate) fn error_position(message: &str, sql: &str) -> Option<usize> {
    let (_, rest) = message.rsplit_once("Line: ")?;
    let (line, rest) = rest.split_once(", Column: ")?;
    let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let (line, column): (usize, usize) = (line.parse().ok()?, column.parse().ok()?);
    let before: usize = sql
        .split_inclusive('\n')
        .take(line.checked_sub(1)?)
        .map(|l| l.chars().count())
        .sum();
    Some(before + column)
}

/// Logs a statement's failure (the one line per failed query).
fn log_failure<C: ClientInfo + ?Sized>(client: &C, sql: &str, error: &PgWireError) {
    let message = match error {
        PgWireError::UserError(info) => format!("{} (SQLSTATE {})", info.message, info.code),
        other => other.to_string(),
    };
    let mut statement: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if statement.chars().count() > 200 {
        statement = statement.chars().take(200).collect::<String>() + "...";
    }
    tracing::warn!(
        target: "strata_serve",
        "{}: query failed: {message} (query: {statement})",
        client.socket_addr()
    );
}

/// The answer to a setting, `SHOW` or transaction statement: settings are accepted and
/// not kept, `SHOW` answers what a PostgreSQL server of this kind would, transactions are
/// boundaries only (every statement reads the latest committed versions).
fn session_response(sql: &str, asker: &Asker, format: &Format) -> PgWireResult<Response> {
    let words = first_words(sql, 3);
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    Ok(match word(0) {
        "BEGIN" | "START" => Response::TransactionStart(Tag::new("BEGIN")),
        "COMMIT" | "END" => Response::TransactionEnd(Tag::new("COMMIT")),
        "ROLLBACK" | "ABORT" => Response::TransactionEnd(Tag::new("ROLLBACK")),
        "SHOW" => {
            let name = show_name(sql);
            let value = setting(&name, asker);
            let schema = Schema::new(vec![deltalake::arrow::datatypes::Field::new(
                &name,
                DataType::Utf8,
                false,
            )]);
            let batch = RecordBatch::try_new(
                Arc::new(schema.clone()),
                vec![Arc::new(deltalake::arrow::array::StringArray::from(vec![
                    value,
                ]))],
            )
            .map_err(|e| user_error("XX000", e.to_string()))?;
            let mut response = encode_rows(&schema, &[batch], format)?;
            response.set_command_tag("SHOW");
            Response::Query(response)
        }
        "DISCARD" => Response::Execution(Tag::new("DISCARD ALL")),
        "RESET" => Response::Execution(Tag::new("RESET")),
        _ => Response::Execution(Tag::new("SET")),
    })
}

/// The setting `SHOW name` asks for, lower-cased (`SHOW TRANSACTION ISOLATION LEVEL` is
/// `transaction_isolation`).
fn show_name(sql: &str) -> String {
    let words: Vec<String> = first_words(sql, 5)
        .into_iter()
        .skip(1)
        .map(|w| w.to_ascii_lowercase())
        .collect();
    match words.join(" ").as_str() {
        "transaction isolation level" => "transaction_isolation".to_string(),
        "time zone" => "timezone".to_string(),
        _ => words.first().cloned().unwrap_or_default(),
    }
}

/// What `SHOW name` answers.
fn setting(name: &str, asker: &Asker) -> String {
    match name {
        "server_version" => "16.6".to_string(),
        "server_version_num" => "160006".to_string(),
        "server_encoding" | "client_encoding" => "UTF8".to_string(),
        "transaction_isolation" | "default_transaction_isolation" => "read committed".to_string(),
        "transaction_read_only" | "default_transaction_read_only" => "on".to_string(),
        "standard_conforming_strings" | "integer_datetimes" => "on".to_string(),
        "datestyle" => "ISO, MDY".to_string(),
        "timezone" => "UTC".to_string(),
        "intervalstyle" => "postgres".to_string(),
        "max_identifier_length" => "63".to_string(),
        "is_superuser" => "off".to_string(),
        "search_path" => asker
            .schema
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        "session_authorization" => asker.user.clone(),
        _ => String::new(),
    }
}

#[async_trait]
impl SimpleQueryHandler for Service {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut responses = Vec::new();
        for sql in split_statements(query) {
            match self.simple_statement(client, &sql).await {
                Ok(response) => responses.push(response),
                Err(e) => {
                    log_failure(client, &sql, &e);
                    // The statements before it have answered; the rest do not run.
                    match e {
                        PgWireError::UserError(mut info) => {
                            let start = query.find(sql.as_str()).unwrap_or(0);
                            info.position = error_position(&info.message, &sql)
                                .map(|p| (query[..start].chars().count() + p).to_string());
                            responses.push(Response::Error(info))
                        }
                        other => return Err(other),
                    }
                    break;
                }
            }
        }
        if responses.is_empty() {
            responses.push(Response::EmptyQuery);
        }
        Ok(responses)
    }
}

impl Service {
    /// One statement of a simple query.
    async fn simple_statement<C>(&self, client: &mut C, sql: &str) -> PgWireResult<Response>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let p = &self.parser;
        let who = asker(client);
        match kind_of(sql) {
            Kind::Refused(kind) => Err(user_error("25006", refusal(&kind))),
            Kind::Use => {
                let schema = p.schema_of_use(sql).await?;
                client.metadata_mut().insert(SCHEMA_KEY.to_string(), schema);
                Ok(Response::Execution(Tag::new("USE")))
            }
            Kind::Session => session_response(sql, &who, &Format::UnifiedText),
            Kind::Read => {
                let _running = self.permit().await?;
                let planned = p.plan_read(sql, &who).await?;
                p.run(planned, Vec::new(), &Format::UnifiedText).await
            }
        }
    }

    /// The extended protocol's Execute: a read planned again over the latest versions,
    /// its parameters bound.
    async fn execute<C>(&self, client: &mut C, portal: &Portal<Prepared>) -> PgWireResult<Response>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let p = &self.parser;
        let who = asker(client);
        match &portal.statement.statement {
            Prepared::Use(schema) => {
                client
                    .metadata_mut()
                    .insert(SCHEMA_KEY.to_string(), schema.clone());
                Ok(Response::Execution(Tag::new("USE")))
            }
            Prepared::Session(sql) => session_response(sql, &who, &portal.result_column_format),
            Prepared::Read { sql, .. } => {
                let _running = self.permit().await?;
                let planned = p.plan_read(sql, &who).await?;
                let parameters = match &planned {
                    Planned::Plan { plan, .. } => {
                        let types = parameter_types(plan)?;
                        bind(portal, &types)?
                    }
                    Planned::Rows(..) => Vec::new(),
                };
                p.run(planned, parameters, &portal.result_column_format)
                    .await
            }
        }
    }
}

/// The portal's parameter values as scalars of the types the plan expects (`types`).
fn bind(portal: &Portal<Prepared>, types: &[Option<DataType>]) -> PgWireResult<Vec<ScalarValue>> {
    if portal.parameters.len() != types.len() {
        return Err(user_error(
            "08P01",
            format!(
                "the statement has {} parameters and {} were given",
                types.len(),
                portal.parameters.len()
            ),
        ));
    }
    let declared = &portal.statement.parameter_types;
    portal
        .parameters
        .iter()
        .enumerate()
        .map(|(i, value)| {
            let sent_as = declared
                .get(i)
                .cloned()
                .flatten()
                .filter(|t| *t != Type::UNKNOWN)
                .unwrap_or_else(|| parameter_pg_type(&types[i]));
            decode_parameter(
                value.as_deref(),
                portal.parameter_format.is_binary(i),
                &sent_as,
                types[i].as_ref(),
            )
            .map_err(|e| user_error("22P02", format!("parameter ${}: {e}", i + 1)))
        })
        .collect()
}

#[async_trait]
impl QueryParser for StatementParser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut parsed = self.parse_one(&asker(client), sql).await;
        if let Err(e) = &mut parsed {
            log_failure(client, sql, e);
            if let PgWireError::UserError(info) = e {
                info.position = error_position(&info.message, sql).map(|p| p.to_string());
            }
        }
        parsed
    }

    fn get_parameter_types(&self, statement: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(match statement {
            Prepared::Read { parameters, .. } => parameters.iter().map(parameter_pg_type).collect(),
            _ => Vec::new(),
        })
    }

    fn get_result_schema(
        &self,
        statement: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.unwrap_or(&Format::UnifiedText);
        Ok(match statement {
            Prepared::Read { columns, .. } => fields(columns, format),
            Prepared::Session(sql) if kind_of(sql) == Kind::Session && sql_is_show(sql) => {
                let name = show_name(sql);
                let schema = Schema::new(vec![deltalake::arrow::datatypes::Field::new(
                    &name,
                    DataType::Utf8,
                    false,
                )]);
                fields(&schema, format)
            }
            _ => Vec::new(),
        })
    }
}

fn sql_is_show(sql: &str) -> bool {
    first_words(sql, 1).first().map(String::as_str) == Some("SHOW")
}

#[async_trait]
impl ExtendedQueryHandler for Service {
    type Statement = Prepared;
    type QueryParser = StatementParser;

    fn query_parser(&self) -> Arc<StatementParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let result = self.execute(client, portal).await;
        if let Err(e) = &result {
            log_failure(client, &portal.statement.statement.text(), e);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn parameters_are_listed_in_order_with_their_types() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t (a INT, b VARCHAR)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let plan = ctx
            .state()
            .create_logical_plan("SELECT * FROM t WHERE b = $2 AND a = $1")
            .await
            .unwrap();
        assert_eq!(
            parameter_types(&plan).unwrap(),
            vec![Some(DataType::Int32), Some(DataType::Utf8View)]
        );
        let plan = ctx.state().create_logical_plan("SELECT 1").await.unwrap();
        assert!(parameter_types(&plan).unwrap().is_empty());
    }

    #[test]
    fn parser_errors_point_into_the_statement() {
        let message = "query: SQL error: ParserError(\"Expected: end of statement, found: x at \
                       Line: 2, Column: 8\")";
        assert_eq!(error_position(message, "SELECT 1\nFROM t x y"), Some(17));
        assert_eq!(error_position("no place", "SELECT 1"), None);
    }

    #[test]
    fn engine_errors_carry_their_sqlstate() {
        let code = |e: EngineError| sqlstate(&e, &e.to_string());
        assert_eq!(code(EngineError::NotFound("x".into())), "42P01");
        assert_eq!(code(EngineError::Internal("x".into())), "XX000");
    }

    #[test]
    fn show_answers_what_clients_ask_on_connect() {
        let who = Asker {
            schema: None,
            user: "strata".into(),
        };
        assert_eq!(
            show_name("SHOW TRANSACTION ISOLATION LEVEL"),
            "transaction_isolation"
        );
        assert_eq!(show_name("show search_path"), "search_path");
        assert_eq!(setting("search_path", &who), "default");
        assert_eq!(setting("transaction_read_only", &who), "on");
        assert_eq!(setting("no_such_setting", &who), "");
    }
}
