//! The listener: one task per connection, each with its own authentication state, until
//! the shutdown future completes.

use crate::auth::{check_exposure, Login};
use crate::error::{Result, ServeError};
use crate::service::Service;
use crate::Shared;
use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::md5pass::Md5PasswordAuthStartupHandler;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::{DefaultServerParameterProvider, StartupHandler};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::{
    ClientInfo, ConnectionManager, ErrorHandler, PgWireConnectionState, PgWireServerHandlers,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// How to serve the PostgreSQL protocol.
#[derive(Clone)]
pub struct PgOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The user name clients log in as.
    pub user: String,
    /// The password every client must give (MD5 exchange); `None`: none asked, which
    /// needs `no_auth` and a loopback address.
    pub password: Option<String>,
    /// Listen without a password (loopback only).
    pub no_auth: bool,
}

impl Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("no_auth", &self.no_auth)
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
    let password = options
        .password
        .as_deref()
        .map(|p| Arc::new(Login::new(&options.user, p)));
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
                        password: password.clone(),
                        manager: manager.clone(),
                    };
                    connections.spawn(async move {
                        if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
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

/// The handlers of one connection: the shared query handlers, and an authentication state
/// of its own.
struct Connection {
    service: Arc<Service>,
    password: Option<Arc<Login>>,
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
        let auth = match &self.password {
            None => Auth::Open(Open {
                manager: self.manager.clone(),
            }),
            Some(login) => {
                let mut parameters = DefaultServerParameterProvider::default();
                parameters.server_version = "16.6".to_string();
                parameters.default_transaction_read_only = true;
                parameters.search_path = "default".to_string();
                parameters.is_superuser = false;
                parameters.time_zone = "UTC".to_string();
                Auth::Md5(Box::new(
                    Md5PasswordAuthStartupHandler::new(login.clone(), Arc::new(parameters))
                        .with_connection_manager(self.manager.clone()),
                ))
            }
        };
        Arc::new(Startup { auth })
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.manager.clone()))
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }
}

/// A connection's authentication, logging each connection once it is established.
struct Startup {
    auth: Auth,
}

enum Auth {
    /// No password asked.
    Open(Open),
    /// PostgreSQL's MD5 exchange against the server's user and password.
    Md5(Box<Md5PasswordAuthStartupHandler<Login, DefaultServerParameterProvider>>),
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
        match &self.auth {
            Auth::Open(open) => open.on_startup(client, message).await?,
            Auth::Md5(md5) => md5.on_startup(client, message).await?,
        }
        if !was_ready && matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            let meta = client.metadata();
            let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("?");
            tracing::info!(
                target: "strata_serve",
                "{}: connected as user {} (database {}{})",
                client.socket_addr(),
                get(pgwire::api::METADATA_USER),
                get(pgwire::api::METADATA_DATABASE),
                if matches!(self.auth, Auth::Md5(_)) { ", password checked" } else { "" }
            );
        }
        Ok(())
    }
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
