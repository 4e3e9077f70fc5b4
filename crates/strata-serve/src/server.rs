//! The listener: one task per connection, each with its own authentication state, until
//! the shutdown future completes. With a certificate and key, every client must ask for
//! TLS (PostgreSQL's `SSLRequest`, answered here: pgwire is built without a TLS backend of
//! its own, and the TLS connection is then run through pgwire's message loop functions):
//! one that does not is refused with a FATAL error, as a `hostssl` line of PostgreSQL's
//! `pg_hba.conf` would.

use crate::auth::{check_exposure, Login, ScramLogin};
use crate::error::{Result, ServeError};
use crate::service::Service;
use crate::tls::Tls;
use crate::Shared;
use async_trait::async_trait;
use bytes::BytesMut;
use futures::Sink;
use futures::StreamExt;
use pgwire::api::auth::driver::{AuthDriver, AuthOutcome};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::{
    protocol_negotiation, save_startup_parameters_to_metadata, DefaultServerParameterProvider,
    StartupHandler,
};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::{
    ClientInfo, ConnectionManager, DefaultClient, ErrorHandler, PgWireConnectionState,
    PgWireServerHandlers,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{process_error, process_message, PgWireMessageServerCodec};
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{Framed, FramedParts};

/// How to serve the PostgreSQL protocol.
#[derive(Clone)]
pub struct PgOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The user name clients log in as.
    pub user: String,
    /// The password every client must prove it knows (SCRAM-SHA-256); `None`: none
    /// asked, which needs `no_auth` and a loopback address.
    pub password: Option<String>,
    /// Listen without a password (loopback only).
    pub no_auth: bool,
    /// The certificate and key: every client must then connect over TLS.
    pub tls: Option<Tls>,
}

impl Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("no_auth", &self.no_auth)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serves `shared`'s warehouse over the PostgreSQL wire protocol at `options.addr` until `shutdown`
/// completes; then stops listening, closes the open connections and returns. `on_listen`
/// is told the address listened on (the port chosen when `addr` asks for port 0).
pub async fn serve_pg(
    shared: &Shared,
    options: PgOptions,
    on_listen: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    check_exposure(&options.addr, options.password.as_deref(), options.no_auth)?;
    let listen_error = |source| ServeError::Listen {
        addr: options.addr,
        source,
    };
    let listener = TcpListener::bind(options.addr)
        .await
        .map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    let service = shared.service.clone();
    // Connections by process id and secret key, for clients' cancel requests.
    let manager = Arc::new(ConnectionManager::new());
    let startup = Arc::new(startup(&options, manager.clone()));
    let acceptor = options.tls.as_ref().map(Tls::pg_acceptor);
    on_listen(local);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let handlers = Connection {
                        service: service.clone(),
                        startup: startup.clone(),
                        manager: manager.clone(),
                    };
                    let acceptor = acceptor.clone();
                    connections.spawn(async move {
                        let served = match acceptor {
                            None => pgwire::tokio::process_socket(socket, None, handlers).await,
                            Some(acceptor) => process_tls_socket(socket, acceptor, handlers).await,
                        };
                        if let Err(e) = served {
                            tracing::warn!(target: "strata_serve", "{peer}: connection lost: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!(target: "strata_serve", "accepting a connection: {e}"),
            },
            // Finished connections leave the set as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let open = connections.len();
    connections.shutdown().await;
    tracing::info!(target: "strata_serve", "stopped ({open} open connections closed)");
    Ok(())
}

/// How clients authenticate: SCRAM-SHA-256 against the verifier of the password, or
/// nothing asked.
fn startup(options: &PgOptions, manager: Arc<ConnectionManager>) -> Startup {
    let auth = match &options.password {
        None => Auth::Open(Open { manager }),
        Some(password) => Auth::Scram(Box::new(Scram {
            login: Arc::new(Login::new(&options.user, password)),
            driver: AuthDriver::new(server_parameters()).with_connection_manager(manager),
        })),
    };
    Startup {
        auth,
        tls_required: options.tls.is_some(),
    }
}

/// The server parameters told to clients once they are in.
fn server_parameters() -> DefaultServerParameterProvider {
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.server_version = "16.6".to_string();
    parameters.default_transaction_read_only = true;
    parameters.search_path = "default".to_string();
    parameters.is_superuser = false;
    parameters.time_zone = "UTC".to_string();
    parameters
}

/// The handlers of one connection: the shared query handlers and authentication (whose
/// state is kept on each connection).
struct Connection {
    service: Arc<Service>,
    startup: Arc<Startup>,
    manager: Arc<ConnectionManager>,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.service.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.manager.clone()))
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }
}

/// Connections' authentication: refusing a client without TLS when TLS is required, then
/// the password exchange, logging each connection once it is established.
struct Startup {
    auth: Auth,
    tls_required: bool,
}

enum Auth {
    /// No password asked.
    Open(Open),
    /// SCRAM-SHA-256 against the verifier of the server's user and password.
    Scram(Box<Scram>),
}

/// The SCRAM-SHA-256 exchange, one [`ScramLogin`] per connection (kept on the connection
/// by pgwire's driver between messages).
struct Scram {
    login: Arc<Login>,
    driver: AuthDriver<DefaultServerParameterProvider>,
}

#[async_trait]
impl StartupHandler for Scram {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let outcome = match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                let login = Box::new(ScramLogin::new(self.login.clone()));
                self.driver.begin_authentication(client, login).await?
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                self.driver.advance_authentication(client, message).await?
            }
            _ => return Ok(()),
        };
        match outcome {
            AuthOutcome::InProgress => Ok(()),
            AuthOutcome::Authenticated { final_message, .. } => {
                self.driver
                    .complete_authentication(client, final_message)
                    .await
            }
        }
    }
}

struct Open {
    manager: Arc<ConnectionManager>,
}

impl NoopStartupHandler for Open {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.manager.clone())
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let was_ready = matches!(client.state(), PgWireConnectionState::ReadyForQuery);
        if self.tls_required
            && !client.is_secure()
            && matches!(message, PgWireFrontendMessage::Startup(_))
        {
            tracing::warn!(
                target: "strata_serve",
                "{}: refused: the client did not ask for TLS",
                client.socket_addr()
            );
            return Err(tls_required_error());
        }
        match &self.auth {
            Auth::Open(open) => open.on_startup(client, message).await?,
            Auth::Scram(scram) => scram.on_startup(client, message).await?,
        }
        if !was_ready && matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            let meta = client.metadata();
            let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("?");
            tracing::info!(
                target: "strata_serve",
                "{}: connected as user {} (database {}{}{})",
                client.socket_addr(),
                get(pgwire::api::METADATA_USER),
                get(pgwire::api::METADATA_DATABASE),
                if matches!(self.auth, Auth::Scram(_)) {
                    ", password checked"
                } else {
                    ""
                },
                if client.is_secure() { ", TLS" } else { "" }
            );
        }
        Ok(())
    }
}

/// What a client that did not ask for TLS is told when TLS is required: SQLSTATE 28000
/// (invalid authorization), FATAL, as PostgreSQL answers a client no `pg_hba.conf` line
/// lets in.
fn tls_required_error() -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_string(),
        "28000".to_string(),
        "strata serve requires TLS on this listener: connect with sslmode=require, or \
         sslmode=verify-full and sslrootcert=the CA's certificate"
            .to_string(),
    )))
}

/// Logs the errors the query handlers have not logged: authentication failures, lost
/// connections, failures while rows were being sent.
struct LogErrors;

impl ErrorHandler for LogErrors {
    fn on_error<C>(&self, client: &C, error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        if !matches!(error, PgWireError::UserError(_)) {
            tracing::warn!(target: "strata_serve", "{}: {error}", client.socket_addr());
        }
    }
}

/// How long a client has to ask for TLS and log in, as pgwire gives a plain connection.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// PostgreSQL's `SSLRequest` and `GSSENCRequest`: a length of 8 and these codes.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// What a client's first eight bytes ask for.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    /// TLS (`SSLRequest`).
    Tls,
    /// GSSAPI encryption, which the server declines (the client may then ask for TLS).
    Gss,
    /// Anything else: a startup or cancel message, in the clear.
    Plain,
}

fn opening(head: &[u8; 8]) -> Opening {
    let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    match (length, code) {
        (8, SSL_REQUEST) => Opening::Tls,
        (8, GSSENC_REQUEST) => Opening::Gss,
        _ => Opening::Plain,
    }
}

/// One connection to a listener with TLS: the `SSLRequest` answered and the TLS handshake
/// made here, then pgwire's message loop over the TLS stream. A client that opens in the
/// clear goes through the same loop unencrypted: its startup message is refused by
/// [`Startup`], a cancel request is served (libpq sends those in the clear).
async fn process_tls_socket<H: PgWireServerHandlers>(
    mut socket: TcpStream,
    acceptor: TlsAcceptor,
    handlers: H,
) -> std::io::Result<()> {
    let peer = socket.peer_addr()?;
    socket.set_nodelay(true)?;
    let timeout = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(timeout);
    let head = loop {
        let mut head = [0u8; 8];
        tokio::select! {
            _ = &mut timeout => return Ok(()),
            read = socket.read_exact(&mut head) => { read?; }
        }
        match opening(&head) {
            Opening::Gss => socket.write_all(b"N").await?,
            Opening::Tls => break None,
            Opening::Plain => break Some(head),
        }
    };
    match head {
        Some(head) => process_messages(socket, &head, peer, false, timeout, handlers).await,
        None => {
            socket.write_all(b"S").await?;
            let tls = tokio::select! {
                _ = &mut timeout => return Ok(()),
                tls = acceptor.accept(socket) => tls?,
            };
            process_messages(tls, &[], peer, true, timeout, handlers).await
        }
    }
}

/// pgwire's message loop (as its `process_socket` runs it) over `io`, whose first bytes
/// `read` were already read: messages to the handlers until the client leaves, a FATAL
/// error, a cancel request, or the startup taking past `timeout`.
async fn process_messages<T, H>(
    io: T,
    read: &[u8],
    peer: SocketAddr,
    secure: bool,
    mut timeout: std::pin::Pin<&mut tokio::time::Sleep>,
    handlers: H,
) -> std::io::Result<()>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
    H: PgWireServerHandlers,
{
    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    let mut parts = FramedParts::new(
        io,
        PgWireMessageServerCodec::new(DefaultClient::new(peer, secure)),
    );
    parts.read_buf = BytesMut::from(read);
    let mut socket = Framed::from_parts(parts);
    socket.set_state(PgWireConnectionState::AwaitingStartup);
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let message = if starting {
            tokio::select! {
                _ = &mut timeout => None,
                message = socket.next() => message,
            }
        } else {
            socket.next().await
        };
        let Some(Ok(message)) = message else {
            break;
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        let in_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let is_cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        let processed = process_message(
            message,
            &mut socket,
            startup.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await;
        if let Err(mut e) = processed {
            errors.on_error(&socket, &mut e);
            let fatal = e.is_fatal();
            process_error(&mut socket, e, in_extended).await?;
            if fatal {
                break;
            }
        }
        if is_cancel {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_say_what_the_client_asks_for() {
        let ssl = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        assert_eq!(opening(&ssl), Opening::Tls);
        let gss = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];
        assert_eq!(opening(&gss), Opening::Gss);
        // A startup message (length, protocol 3.0) and a cancel request (length 16).
        assert_eq!(opening(&[0, 0, 0, 41, 0, 3, 0, 0]), Opening::Plain);
        assert_eq!(
            opening(&[0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e]),
            Opening::Plain
        );
        // TLS from the first byte (a ClientHello): not answered, so not TLS.
        assert_eq!(opening(&[0x16, 3, 1, 2, 0, 1, 0, 1]), Opening::Plain);
    }
}
