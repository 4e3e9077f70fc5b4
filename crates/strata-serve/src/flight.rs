//! `strata serve --flight`: the warehouse over Arrow Flight SQL (ADBC, the JDBC Flight SQL
//! driver), read-only. Statements go through the same path as the PostgreSQL listener's
//! ([`strata_engine::prepare_query`], planned by DataFusion and checked to be a read, in a
//! memory pool of their own, under the same `--max-queries` permits) and their rows go
//! out as Arrow record batches.
//!
//! Nothing is kept between requests: a ticket and a prepared statement's handle carry the
//! statement's text, and each `DoGet` plans it again over the latest committed versions.
//! Authentication is a bearer token on every call: the server's token, or one handed out by
//! the handshake for the user and password. With a certificate and key the listener speaks
//! gRPC over TLS only.

use crate::auth::{check_flight_exposure, same_secret};
use crate::error::{Result, ServeError};
use crate::service::{parameter_types, Asker, Planned, Service};
use crate::statement::{kind_of, refusal, split_statements, Kind};
use crate::tls::Tls;
use crate::Shared;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    SqlNullOrdering, SqlSupportedCaseSensitivity, SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use base64::Engine;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::arrow::ipc::writer::IpcWriteOptions;
use deltalake::datafusion::common::ParamValues;
use deltalake::datafusion::scalar::ScalarValue;
use futures::{Stream, StreamExt};
use pgwire::error::PgWireError;
use prost::Message;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use tokio::net::TcpListener;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

/// How to serve Flight SQL.
#[derive(Clone)]
pub struct FlightOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The user name the handshake's basic authentication must give.
    pub user: String,
    /// The password the handshake's basic authentication must give (the PostgreSQL
    /// listener's).
    pub password: Option<String>,
    /// A bearer token clients may send on every call without a handshake.
    pub token: Option<String>,
    /// Listen without a token or password (loopback only).
    pub no_auth: bool,
    /// The certificate and key: the listener then speaks gRPC over TLS only.
    pub tls: Option<Tls>,
}

impl std::fmt::Debug for FlightOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightOptions")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("no_auth", &self.no_auth)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serves `shared`'s warehouse over Arrow Flight SQL at `options.addr` until `shutdown`
/// completes; then stops listening, lets the calls under way finish and returns.
/// `on_listen` is told the address listened on.
pub async fn serve_flight(
    shared: &Shared,
    options: FlightOptions,
    on_listen: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let secret = options.password.is_some() || options.token.is_some();
    check_flight_exposure(&options.addr, secret, options.no_auth)?;
    let listen_error = |source| ServeError::Listen {
        addr: options.addr,
        source,
    };
    let listener = TcpListener::bind(options.addr)
        .await
        .map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    let service = FlightSql {
        service: shared.service.clone(),
        auth: Auth {
            user: options.user.clone(),
            password: options.password.clone(),
            token: options.token.clone(),
            issued: Mutex::new(VecDeque::new()),
        },
    };
    on_listen(local);
    // Each accepted connection logged once (a gRPC client keeps one connection for its
    // calls).
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(socket, peer)| {
            tracing::info!(target: "strata_serve", "{peer}: Flight SQL connection");
            let _ = socket.set_nodelay(true);
            socket
        });
        Some((accepted, listener))
    });
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &options.tls {
        server = server.tls_config(tls.flight_config()).map_err(|e| {
            ServeError::Tls(format!(
                "the TLS certificate and key cannot be used for Flight SQL: {e}"
            ))
        })?;
    }
    server
        .add_service(FlightServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| ServeError::Listen {
            addr: local,
            source: std::io::Error::other(e),
        })?;
    tracing::info!(target: "strata_serve", "Flight SQL listener stopped");
    Ok(())
}

/// The Flight SQL service: the shared query handlers and who may call.
struct FlightSql {
    service: Arc<Service>,
    auth: Auth,
}

/// Who may call: a bearer token (the server's, or one the handshake handed out), or nobody
/// asked when neither a token nor a password is set.
struct Auth {
    user: String,
    password: Option<String>,
    token: Option<String>,
    /// Tokens handed out by handshakes, the oldest first (at most [`MAX_ISSUED`]).
    issued: Mutex<VecDeque<String>>,
}

/// How many handshake tokens are kept; the oldest is forgotten past this (its client
/// handshakes again).
const MAX_ISSUED: usize = 4096;

/// The header carrying credentials, both ways.
const AUTHORIZATION: &str = "authorization";

impl Auth {
    fn open(&self) -> bool {
        self.password.is_none() && self.token.is_none()
    }

    /// Whether `token` is the server's or one handed out.
    fn accepts(&self, token: &str) -> bool {
        if self.token.as_deref().is_some_and(|t| same_secret(t, token)) {
            return true;
        }
        let issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        issued.iter().any(|t| same_secret(t, token))
    }

    /// Whether `user` and `password` are the server's (the server's token is accepted
    /// as the password too).
    fn checks(&self, user: &str, password: &str) -> bool {
        same_secret(user, &self.user)
            && (self
                .password
                .as_deref()
                .is_some_and(|p| same_secret(p, password))
                || self
                    .token
                    .as_deref()
                    .is_some_and(|t| same_secret(t, password)))
    }

    /// The bearer token for a client that gave `user` and `password` (`None`: refused):
    /// the server's token when that was the password, else one handed out.
    fn login(&self, user: &str, password: &str) -> Option<String> {
        if !self.checks(user, password) {
            return None;
        }
        if let Some(token) = self.token.as_deref().filter(|t| same_secret(t, password)) {
            return Some(token.to_string());
        }
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        if issued.len() >= MAX_ISSUED {
            issued.pop_front();
        }
        issued.push_back(token.clone());
        Some(token)
    }
}

/// The credentials of an `authorization` header.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    Bearer(String),
    Basic { user: String, password: String },
}

/// `Bearer TOKEN` or `Basic base64(user:password)` (padded or not); `None` for anything
/// else.
fn credentials(header: &str) -> Option<Credentials> {
    let (scheme, value) = header.trim().split_once(' ')?;
    let value = value.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(Credentials::Bearer(value.to_string()));
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value.trim_end_matches('='))
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(Credentials::Basic {
        user: user.to_string(),
        password: password.to_string(),
    })
}

/// `sql` on one line, at most 200 characters, for the log.
fn one_line(sql: &str) -> String {
    let mut statement: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if statement.chars().count() > 200 {
        statement = statement.chars().take(200).collect::<String>() + "...";
    }
    statement
}

/// The calling peer, for the log.
fn peer<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "?".to_string(), |a| a.to_string())
}

impl FlightSql {
    /// Refuses a call without an accepted bearer token (when one is needed).
    fn check<T>(&self, request: &Request<T>) -> std::result::Result<(), Status> {
        if self.auth.open() {
            return Ok(());
        }
        let header = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let refused = |why: &str| {
            tracing::warn!(target: "strata_serve", "{}: Flight SQL call refused: {why}", peer(request));
            Err(Status::unauthenticated(format!(
                "{why}: send `authorization: Bearer TOKEN` (the server's token, or the one \
                 the handshake returns for the user and password)"
            )))
        };
        match header.and_then(credentials) {
            Some(Credentials::Bearer(token)) if self.auth.accepts(&token) => Ok(()),
            Some(Credentials::Bearer(_)) => refused("the token is not accepted"),
            Some(Credentials::Basic { user, password }) if self.auth.checks(&user, &password) => {
                Ok(())
            }
            Some(Credentials::Basic { .. }) => refused("wrong user or password"),
            None => refused("no credentials"),
        }
    }

    /// `sql` planned as a read through the PostgreSQL listener's path; other statements
    /// are refused.
    async fn plan(&self, sql: &str) -> std::result::Result<Planned, Status> {
        let mut statements = split_statements(sql);
        let sql = match statements.len() {
            0 => return Err(Status::invalid_argument("the statement is empty")),
            1 => statements.remove(0),
            _ => {
                return Err(Status::invalid_argument(
                    "a Flight SQL request holds one statement",
                ))
            }
        };
        match kind_of(&sql) {
            Kind::Refused(kind) => Err(Status::permission_denied(refusal(&kind))),
            Kind::Use => Err(Status::invalid_argument(
                "USE is not kept between Flight SQL requests: name tables with their schema \
                 (schema.table, or catalog.schema.table)",
            )),
            Kind::Session => Err(Status::invalid_argument(
                "settings and transactions are not kept over Flight SQL: every statement \
                 reads the latest committed version of every table",
            )),
            Kind::Read => {
                let asker = Asker::new(&self.auth.user);
                self.service
                    .parser
                    .plan_read(&sql, &asker)
                    .await
                    .map_err(status)
            }
        }
    }

    /// The columns `sql` returns, as sent (planned under a permit).
    async fn columns(&self, sql: &str) -> std::result::Result<SchemaRef, Status> {
        Ok(self.described(sql).await?.0)
    }

    /// The columns `sql` returns, as sent, and its parameters (`$1`, `$2`, ...) with the
    /// types the plan expects (Utf8 where it does not say).
    async fn described(&self, sql: &str) -> std::result::Result<(SchemaRef, Schema), Status> {
        let _running = self.service.permit().await.map_err(status)?;
        let (columns, parameters) = match self.plan(sql).await? {
            Planned::Rows(columns, _) => (columns, Vec::new()),
            Planned::Plan { plan, .. } => (
                Arc::new(plan.schema().as_arrow().clone()),
                parameter_types(&plan).map_err(status)?,
            ),
        };
        let parameters = parameters
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let t = t.as_ref().map_or(DataType::Utf8, sent_type);
                Field::new(format!("${}", i + 1), t, true)
            })
            .collect::<Vec<_>>();
        Ok((sent_schema(&columns), Schema::new(parameters)))
    }

    /// Runs `sql` to its first batch (under a permit) and streams its rows; a failure
    /// while they flow is logged for `peer`.
    async fn rows(
        &self,
        sql: &str,
        parameters: Option<RecordBatch>,
        peer: String,
    ) -> std::result::Result<DoGetStream, Status> {
        let (columns, batches) = {
            let _running = self.service.permit().await.map_err(status)?;
            let planned = match (self.plan(sql).await?, parameters) {
                (Planned::Plan { query, plan }, Some(values)) => {
                    let types = parameter_types(&plan).map_err(status)?;
                    let values = scalars(&values, &types)?;
                    let plan = plan
                        .replace_params_with_values(&ParamValues::from(values))
                        .map_err(|e| {
                            Status::invalid_argument(format!(
                                "binding parameters: {}",
                                e.strip_backtrace()
                            ))
                        })?;
                    Planned::Plan {
                        query,
                        plan: Box::new(plan),
                    }
                }
                (planned, _) => planned,
            };
            self.service.parser.stream(planned).await.map_err(status)?
        };
        let schema = sent_schema(&columns);
        let sent = schema.clone();
        let statement = one_line(sql);
        let batches = batches.map(move |b| {
            b.map_err(|e| {
                tracing::warn!(target: "strata_serve", "{peer}: query failed: {e} (query: {statement})");
                FlightError::ExternalError(e.into())
            })
            .and_then(|b| as_sent(&b, &sent).map_err(FlightError::Arrow))
        });
        Ok(encode(schema, batches))
    }

    /// Logs a failed statement (the one line per failed query) and passes its error on.
    fn failed<T>(&self, request: &Request<T>, sql: &str, e: Status) -> Status {
        tracing::warn!(
            target: "strata_serve",
            "{}: query failed: {} (query: {})",
            peer(request),
            e.message(),
            one_line(sql)
        );
        e
    }

    /// The tables of the warehouse: (schema, name, columns), in order.
    async fn tables(&self) -> std::result::Result<Vec<(String, String, SchemaRef)>, Status> {
        let wh = &self.service.parser.wh;
        let query = match strata_engine::prepare_query(wh, "SELECT 1", None).await {
            Ok(strata_engine::PreparedQuery::Sql(query)) => query,
            Ok(_) => return Ok(Vec::new()),
            Err(e) => return Err(Status::internal(strata_engine::chain(&e))),
        };
        let Some(catalog) = query.session.catalog(crate::catalog::REGISTERED_CATALOG) else {
            return Ok(Vec::new());
        };
        let mut schemas = catalog.schema_names();
        schemas.retain(|s| s != "information_schema" && s != "pg_catalog");
        schemas.sort();
        let mut out = Vec::new();
        for schema in schemas {
            let Some(provider) = catalog.schema(&schema) else {
                continue;
            };
            let mut names = provider.table_names();
            names.sort();
            for name in names {
                if let Ok(Some(table)) = provider.table(&name).await {
                    out.push((schema.clone(), name, sent_schema(&table.schema())));
                }
            }
        }
        Ok(out)
    }

    fn catalog(&self) -> &str {
        self.service.parser.wh.catalog()
    }
}

type DoGetStream =
    Pin<Box<dyn Stream<Item = std::result::Result<arrow_flight::FlightData, Status>> + Send>>;

/// `batches` of `schema` as Flight data.
fn encode(
    schema: SchemaRef,
    batches: impl Stream<Item = std::result::Result<RecordBatch, FlightError>> + Send + 'static,
) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map(|r| r.map_err(flight_status));
    Box::pin(stream)
}

/// An error while rows were being sent, for the client.
fn flight_status(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(status) => *status,
        FlightError::ExternalError(e) => {
            let message = e.to_string();
            match message.contains("Resources exhausted") {
                true => Status::resource_exhausted(message),
                false => Status::internal(message),
            }
        }
        other => Status::internal(other.to_string()),
    }
}

/// One batch of `rows` as a stream for [`encode`].
fn one_batch<E: Into<FlightError> + Send + 'static>(
    rows: std::result::Result<RecordBatch, E>,
) -> impl Stream<Item = std::result::Result<RecordBatch, FlightError>> + Send + 'static {
    futures::stream::once(async move { rows.map_err(Into::into) })
}

/// The PostgreSQL listener's error as a gRPC status: its SQLSTATE's class decides the code.
fn status(e: PgWireError) -> Status {
    let PgWireError::UserError(info) = e else {
        return Status::internal(e.to_string());
    };
    let message = info.message.clone();
    match info.code.as_str() {
        "25006" => Status::permission_denied(message),
        "42P01" => Status::not_found(message),
        "53200" => Status::resource_exhausted(message),
        "57P01" => Status::unavailable(message),
        code if code.starts_with("42") || code.starts_with("22") => {
            Status::invalid_argument(message)
        }
        _ => Status::internal(message),
    }
}

/// The columns as sent: string and binary views as plain strings and binaries (which
/// every Flight SQL client reads; the JDBC driver does not read views).
fn sent_schema(columns: &Schema) -> SchemaRef {
    let fields: Vec<Field> = columns
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(sent_type(f.data_type())))
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        columns.metadata().clone(),
    ))
}

fn sent_type(t: &DataType) -> DataType {
    match t {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

/// `batch` with the columns of `schema` (views cast).
fn as_sent(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> deltalake::arrow::error::Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(c.clone()),
            false => deltalake::arrow::compute::cast(c, f.data_type()),
        })
        .collect::<deltalake::arrow::error::Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

/// What a ticket or a prepared statement's handle holds: the statement's text after this
/// prefix.
const HANDLE_PREFIX: &[u8] = b"strata-sql:";

/// The handle of statement `sql`.
fn handle_of(sql: &str) -> Vec<u8> {
    [HANDLE_PREFIX, sql.as_bytes()].concat()
}

/// The statement a handle holds.
fn sql_of(handle: &[u8]) -> std::result::Result<String, Status> {
    handle
        .strip_prefix(HANDLE_PREFIX)
        .and_then(|sql| std::str::from_utf8(sql).ok())
        .map(str::to_string)
        .ok_or_else(|| Status::invalid_argument("not a statement handle of this server"))
}

/// What a prepared statement's handle holds once parameters are bound: the length of the
/// statement's text (4 bytes, little-endian), the text, and the values as an Arrow IPC
/// stream of one row, after this prefix.
const PARAMETERS_PREFIX: &[u8] = b"strata-sql+parameters:";

/// The handle of statement `sql` with `values` bound (one row, a column per parameter).
fn handle_with_parameters(sql: &str, values: &RecordBatch) -> std::result::Result<Vec<u8>, Status> {
    let encoding = |e: deltalake::arrow::error::ArrowError| {
        Status::invalid_argument(format!("encoding parameters: {e}"))
    };
    let length = u32::try_from(sql.len())
        .map_err(|_| Status::invalid_argument("the statement is too long"))?;
    let mut handle = [PARAMETERS_PREFIX, &length.to_le_bytes(), sql.as_bytes()].concat();
    let mut writer =
        deltalake::arrow::ipc::writer::StreamWriter::try_new(&mut handle, &values.schema())
            .map_err(encoding)?;
    writer.write(values).map_err(encoding)?;
    writer.finish().map_err(encoding)?;
    drop(writer);
    Ok(handle)
}

/// The statement a prepared statement's handle holds, and its bound values if any.
fn statement_of(handle: &[u8]) -> std::result::Result<(String, Option<RecordBatch>), Status> {
    let Some(rest) = handle.strip_prefix(PARAMETERS_PREFIX) else {
        return Ok((sql_of(handle)?, None));
    };
    let bad = || Status::invalid_argument("not a statement handle of this server");
    let (length, rest) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
    let length = u32::from_le_bytes(*length) as usize;
    if rest.len() < length {
        return Err(bad());
    }
    let (sql, values) = rest.split_at(length);
    let sql = std::str::from_utf8(sql).map_err(|_| bad())?.to_string();
    let mut reader =
        deltalake::arrow::ipc::reader::StreamReader::try_new(values, None).map_err(|_| bad())?;
    let values = reader.next().ok_or_else(bad)?.map_err(|_| bad())?;
    Ok((sql, Some(values)))
}

/// The bound `values` (one row) as scalars of the types the plan expects (`types`).
fn scalars(
    values: &RecordBatch,
    types: &[Option<DataType>],
) -> std::result::Result<Vec<ScalarValue>, Status> {
    if values.num_columns() != types.len() {
        return Err(Status::invalid_argument(format!(
            "the statement has {} parameters and {} were given",
            types.len(),
            values.num_columns()
        )));
    }
    values
        .columns()
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (column, t))| {
            let value = ScalarValue::try_from_array(column, 0)
                .map_err(|e| Status::invalid_argument(format!("parameter ${}: {e}", i + 1)))?;
            match t {
                Some(t) if value.data_type() != *t => value.cast_to(t).map_err(|e| {
                    Status::invalid_argument(format!(
                        "parameter ${}: {} as {t}: {}",
                        i + 1,
                        value.data_type(),
                        e.strip_backtrace()
                    ))
                }),
                _ => Ok(value),
            }
        })
        .collect()
}

/// The ticket that runs `sql`.
fn statement_ticket(sql: &str) -> Ticket {
    let ticket = TicketStatementQuery {
        statement_handle: handle_of(sql).into(),
    };
    Ticket::new(ticket.as_any().encode_to_vec())
}

/// The flight of one endpoint whose rows `ticket` fetches, in `schema`.
fn flight_info(
    schema: &Schema,
    ticket: Ticket,
    descriptor: FlightDescriptor,
) -> std::result::Result<Response<FlightInfo>, Status> {
    let info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?
        .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
        .with_descriptor(descriptor);
    Ok(Response::new(info))
}

/// What `GetSqlInfo` answers.
pub(crate) static SQL_INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "strata");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    // The Arrow format version (Schema.fbs).
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    // DataFusion sorts nulls last ascending and first descending: as the largest values.
    b.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(SqlInfo::SqlSchemaTerm, "schema");
    b.append(SqlInfo::SqlCatalogTerm, "catalog");
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.build().expect("the SqlInfo values are of their types")
});

/// The one table type.
const TABLE_TYPE: &str = "TABLE";

type HandshakeStream =
    Pin<Box<dyn Stream<Item = std::result::Result<HandshakeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<Response<HandshakeStream>, Status> {
        let header = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(credentials);
        let token = match (self.auth.open(), header) {
            (true, _) => None,
            (false, Some(Credentials::Basic { user, password })) => {
                match self.auth.login(&user, &password) {
                    Some(token) => Some(token),
                    None => {
                        tracing::warn!(target: "strata_serve", "{}: Flight SQL handshake refused: wrong user or password", peer(&request));
                        return Err(Status::unauthenticated("wrong user or password"));
                    }
                }
            }
            (false, Some(Credentials::Bearer(token))) if self.auth.accepts(&token) => Some(token),
            (false, _) => {
                tracing::warn!(target: "strata_serve", "{}: Flight SQL handshake refused: no accepted credentials", peer(&request));
                return Err(Status::unauthenticated(
                    "the handshake needs `authorization: Basic base64(user:password)` or an \
                     accepted bearer token",
                ));
            }
        };
        tracing::info!(target: "strata_serve", "{}: Flight SQL handshake{}", peer(&request),
            if token.is_some() { " (credentials checked)" } else { "" });
        let payload = token.clone().unwrap_or_default();
        let output = futures::stream::iter([Ok(HandshakeResponse {
            protocol_version: 0,
            payload: payload.into(),
        })]);
        let mut response: Response<HandshakeStream> = Response::new(Box::pin(output));
        if let Some(token) = token {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| Status::internal("the token is not a header value"))?;
            response.metadata_mut().insert(AUTHORIZATION, value);
        }
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let columns = match self.columns(&query.query).await {
            Ok(columns) => columns,
            Err(e) => return Err(self.failed(&request, &query.query, e)),
        };
        flight_info(
            &columns,
            statement_ticket(&query.query),
            request.into_inner(),
        )
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let sql = sql_of(&ticket.statement_handle)?;
        match self.rows(&sql, None, peer(&request)).await {
            Ok(rows) => Ok(Response::new(rows)),
            Err(e) => Err(self.failed(&request, &sql, e)),
        }
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> std::result::Result<ActionCreatePreparedStatementResult, Status> {
        self.check(&request)?;
        let (columns, parameters) = match self.described(&query.query).await {
            Ok(described) => described,
            Err(e) => return Err(self.failed(&request, &query.query, e)),
        };
        let ipc = |schema: &Schema| -> std::result::Result<bytes::Bytes, Status> {
            let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
                .try_into()
                .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?;
            Ok(bytes)
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle_of(&query.query).into(),
            dataset_schema: ipc(&columns)?,
            parameter_schema: ipc(&parameters)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> std::result::Result<(), Status> {
        // Nothing is kept for a prepared statement.
        self.check(&request)
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let (sql, _) = statement_of(&query.prepared_statement_handle)?;
        let columns = match self.columns(&sql).await {
            Ok(columns) => columns,
            Err(e) => return Err(self.failed(&request, &sql, e)),
        };
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&columns, ticket, request.into_inner())
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let (sql, parameters) = statement_of(&query.prepared_statement_handle)?;
        match self.rows(&sql, parameters, peer(&request)).await {
            Ok(rows) => Ok(Response::new(rows)),
            Err(e) => Err(self.failed(&request, &sql, e)),
        }
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<DoPutPreparedStatementResult, Status> {
        use futures::TryStreamExt;
        self.check(&request)?;
        let (sql, _) = statement_of(&query.prepared_statement_handle)?;
        let data = request.into_inner().map_err(FlightError::from);
        let batches: Vec<RecordBatch> =
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(data)
                .try_collect()
                .await
                .map_err(|e| Status::invalid_argument(format!("reading parameters: {e}")))?;
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let values = match batches.as_slice() {
            [] => None,
            [one] if one.num_rows() == 1 => Some(one.clone()),
            _ => {
                return Err(Status::invalid_argument(
                    "one row of parameters at a time: strata serve --flight runs a prepared \
                     statement with one set of values",
                ))
            }
        };
        let handle = match values {
            None => handle_of(&sql),
            Some(values) => handle_with_parameters(&sql, &values)?,
        };
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle.into()),
        })
    }

    async fn do_put_statement_update(
        &self,
        query: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<i64, Status> {
        self.check(&request)?;
        let kind = match kind_of(&query.query) {
            Kind::Refused(kind) => kind,
            _ => "an update".to_string(),
        };
        let e = Status::permission_denied(refusal(&kind));
        Err(self.failed(&request, &query.query, e))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<i64, Status> {
        self.check(&request)?;
        Err(Status::permission_denied(refusal("an update")))
    }

    async fn do_put_statement_ingest(
        &self,
        query: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<i64, Status> {
        self.check(&request)?;
        let what = format!("ingesting into {}", query.table);
        Err(Status::permission_denied(refusal(&what)))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let schema = query.into_builder().schema();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&schema, ticket, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let mut builder = query.into_builder();
        builder.append(self.catalog());
        let schema = builder.schema();
        Ok(Response::new(encode(schema, one_batch(builder.build()))))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let schema = query.clone().into_builder().schema();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&schema, ticket, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let tables = self.tables().await?;
        let mut schemas: Vec<&str> = tables.iter().map(|(s, _, _)| s.as_str()).collect();
        schemas.dedup();
        let mut builder = query.into_builder();
        for schema in schemas {
            builder.append(self.catalog(), schema);
        }
        let schema = builder.schema();
        Ok(Response::new(encode(schema, one_batch(builder.build()))))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let schema = query.clone().into_builder().schema();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&schema, ticket, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let tables = self.tables().await?;
        let mut builder = query.into_builder();
        for (schema, name, columns) in &tables {
            builder
                .append(self.catalog(), schema, name, TABLE_TYPE, columns)
                .map_err(|e| Status::internal(format!("listing tables: {e}")))?;
        }
        let schema = builder.schema();
        Ok(Response::new(encode(schema, one_batch(builder.build()))))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let schema = query.into_builder().schema();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&schema, ticket, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let mut builder = query.into_builder();
        builder.append(TABLE_TYPE);
        let schema = builder.schema();
        Ok(Response::new(encode(schema, one_batch(builder.build()))))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        let schema = query.clone().into_builder(&SQL_INFO).schema();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        flight_info(&schema, ticket, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<DoGetStream>, Status> {
        self.check(&request)?;
        let builder = query.into_builder(&SQL_INFO);
        let schema = builder.schema();
        Ok(Response::new(encode(schema, one_batch(builder.build()))))
    }

    async fn do_get_fallback(
        &self,
        request: Request<Ticket>,
        message: Any,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.check(&request)?;
        Err(Status::unimplemented(format!(
            "strata serve --flight does not answer {}",
            message.type_url
        )))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, StringViewArray};

    #[test]
    fn a_ticket_carries_its_statement() {
        let ticket = statement_ticket("SELECT 'a;b' FROM users");
        let any = Any::decode(&*ticket.ticket).unwrap();
        let message: TicketStatementQuery = any.unpack().unwrap().unwrap();
        assert_eq!(
            sql_of(&message.statement_handle).unwrap(),
            "SELECT 'a;b' FROM users"
        );
        let e = sql_of(b"SELECT 1").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(sql_of(&[b"strata-sql:".as_slice(), &[0xff, 0xfe]].concat()).is_err());
    }

    #[test]
    fn a_prepared_handle_carries_its_bound_values() {
        let values = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("$1", DataType::Int64, true),
                Field::new("$2", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(deltalake::arrow::array::Int64Array::from(vec![2])),
                Arc::new(deltalake::arrow::array::StringArray::from(vec!["Raul"])),
            ],
        )
        .unwrap();
        let handle = handle_with_parameters("SELECT $1, $2", &values).unwrap();
        let (sql, bound) = statement_of(&handle).unwrap();
        assert_eq!(sql, "SELECT $1, $2");
        assert_eq!(bound.unwrap(), values);
        assert_eq!(
            statement_of(&handle_of("SELECT 1")).unwrap(),
            ("SELECT 1".to_string(), None)
        );
        assert!(statement_of(&handle[..handle.len() / 2]).is_err());
        let types = [Some(DataType::Int32), None];
        assert_eq!(
            scalars(&values, &types).unwrap(),
            vec![
                ScalarValue::Int32(Some(2)),
                ScalarValue::Utf8(Some("Raul".into()))
            ]
        );
        assert!(scalars(&values, &[None]).is_err());
    }

    #[test]
    fn credentials_are_read_from_the_header() {
        assert_eq!(
            credentials("Bearer abc"),
            Some(Credentials::Bearer("abc".into()))
        );
        // "strata:s3cret", padded and not (Go's Flight client sends it unpadded).
        for header in ["Basic c3RyYXRhOnMzY3JldA==", "basic c3RyYXRhOnMzY3JldA"] {
            assert_eq!(
                credentials(header),
                Some(Credentials::Basic {
                    user: "strata".into(),
                    password: "s3cret".into()
                }),
                "{header}"
            );
        }
        assert_eq!(credentials("Digest x"), None);
        assert_eq!(credentials("Basic !!!"), None);
        assert_eq!(credentials("Bearer"), None);
    }

    fn auth(password: Option<&str>, token: Option<&str>) -> Auth {
        Auth {
            user: "strata".into(),
            password: password.map(String::from),
            token: token.map(String::from),
            issued: Mutex::new(VecDeque::new()),
        }
    }

    #[test]
    fn a_login_hands_out_a_token_that_is_then_accepted() {
        let a = auth(Some("pw"), None);
        assert!(!a.open());
        assert_eq!(a.login("strata", "wrong"), None);
        assert_eq!(a.login("other", "pw"), None);
        let token = a.login("strata", "pw").unwrap();
        assert_eq!(token.len(), 64);
        assert!(a.accepts(&token));
        assert!(!a.accepts("guess"));
        // The server's token is accepted as the password too, and is what comes back.
        let a = auth(None, Some("t0k"));
        assert_eq!(a.login("strata", "t0k").as_deref(), Some("t0k"));
        assert_eq!(a.login("strata", "pw"), None);
        assert!(a.accepts("t0k"));
        assert!(auth(None, None).open());
    }

    #[test]
    fn sql_info_says_read_only_and_names_the_server() {
        let batch = SQL_INFO
            .record_batch([
                SqlInfo::FlightSqlServerName as u32,
                SqlInfo::FlightSqlServerReadOnly as u32,
            ])
            .unwrap();
        assert_eq!(batch.num_rows(), 2);
        let shown = deltalake::arrow::util::pretty::pretty_format_batches(&[batch])
            .unwrap()
            .to_string();
        assert!(shown.contains("strata"), "{shown}");
        assert!(shown.contains("true"), "{shown}");
    }

    #[test]
    fn views_are_sent_as_plain_strings() {
        let columns = Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("n", DataType::Int64, false),
        ]);
        let sent = sent_schema(&columns);
        assert_eq!(sent.field(0).data_type(), &DataType::Utf8);
        assert_eq!(sent.field(1).data_type(), &DataType::Int64);
        let batch = RecordBatch::try_new(
            Arc::new(columns),
            vec![
                Arc::new(StringViewArray::from(vec![Some("a"), None])),
                Arc::new(deltalake::arrow::array::Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let out = as_sent(&batch, &sent).unwrap();
        assert_eq!(out.schema(), sent);
        assert_eq!(out.column(0).null_count(), 1);
    }

    #[test]
    fn errors_keep_their_kind() {
        let e = status(crate::service::user_error("25006", "read-only".into()));
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(e.message(), "read-only");
        let e = status(crate::service::user_error("42601", "syntax".into()));
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = status(crate::service::user_error("42P01", "no table".into()));
        assert_eq!(e.code(), tonic::Code::NotFound);
    }
}
