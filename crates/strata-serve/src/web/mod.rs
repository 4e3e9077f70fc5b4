//! `strata serve --http`: the warehouse's web page, read-only. The overview (`/`) draws each
//! pipeline's dataset graph and its last runs from the event log; a table's page
//! (`/tables/{schema.name}`) shows its schema, row count, recent Delta history and a sample
//! of rows. The same models are served as JSON (`/api/pipelines`, `/api/tables/{name}`,
//! `/api/status`); the stylesheet and the script are embedded (`/assets/`).
//!
//! - [`model`] (pure): the pages' values and the graph's layout.
//! - [`gather`]: reading them from the warehouse through the engine.
//! - [`render`] (pure): HTML and SVG, every value escaped.
//! - here: the routes, authentication (HTTP basic with the user and password, or a bearer
//!   token), a log line per failed request, and a clean stop.

mod gather;
mod model;
mod render;

use crate::auth::{check_http_exposure, same_secret};
use crate::error::{Result, ServeError};
use crate::service::Service;
use crate::tls::Tls;
use crate::Shared;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{Listener, ListenerExt};
use axum::Router;
use gather::PageError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// How to serve the web page.
#[derive(Clone)]
pub struct HttpOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The user name HTTP basic authentication must give.
    pub user: String,
    /// The password HTTP basic authentication must give (the other listeners').
    pub password: Option<String>,
    /// A bearer token browsers' scripts and tools may send instead (also accepted as the
    /// basic password).
    pub token: Option<String>,
    /// Listen without a password or token (loopback only).
    pub no_auth: bool,
    /// Serve HTTPS only, with this certificate and key.
    pub tls: Option<Tls>,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("no_auth", &self.no_auth)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Who may read the pages: nobody needs to say when neither a password nor a token is set.
struct Credentials {
    user: String,
    password: Option<String>,
    token: Option<String>,
}

impl Credentials {
    /// Whether the request's `Authorization` header value lets it in.
    fn admit(&self, authorization: Option<&str>) -> Admission {
        if self.password.is_none() && self.token.is_none() {
            return Admission::Open;
        }
        let Some(value) = authorization else {
            return Admission::Refused("no credentials");
        };
        let secret_ok = |given: &str| {
            self.password
                .as_deref()
                .is_some_and(|p| same_secret(given, p))
                || self.token.as_deref().is_some_and(|t| same_secret(given, t))
        };
        let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value, ""));
        let ok = match scheme.to_ascii_lowercase().as_str() {
            "bearer" => self
                .token
                .as_deref()
                .is_some_and(|t| same_secret(rest.trim(), t)),
            "basic" => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(rest.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|s| {
                        s.split_once(':')
                            .map(|(u, p)| (u.to_string(), p.to_string()))
                    })
                    .is_some_and(|(user, given)| user == self.user && secret_ok(&given))
            }
            _ => false,
        };
        match ok {
            true => Admission::Admitted,
            false => Admission::Refused("wrong credentials"),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// No credentials asked.
    Open,
    Admitted,
    Refused(&'static str),
}

/// What the handlers share.
struct Web {
    service: Arc<Service>,
    credentials: Credentials,
}

/// Why a request failed, for the log line (set on the response by the handler).
#[derive(Clone)]
struct Failure(String);

/// Serves `shared`'s warehouse as web pages at `options.addr` until `shutdown` completes;
/// then stops listening, lets the requests in flight finish and returns. `on_listen` is
/// told the address listened on.
pub async fn serve_http(
    shared: &Shared,
    options: HttpOptions,
    on_listen: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let secret = options.password.is_some() || options.token.is_some();
    check_http_exposure(&options.addr, secret, options.no_auth)?;
    let listen_error = |source| ServeError::Listen {
        addr: options.addr,
        source,
    };
    let listener = TcpListener::bind(options.addr)
        .await
        .map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    let web = Arc::new(Web {
        service: shared.service.clone(),
        credentials: Credentials {
            user: options.user.clone(),
            password: options.password.clone(),
            token: options.token.clone(),
        },
    });
    let app = routes(web).into_make_service_with_connect_info::<SocketAddr>();
    on_listen(local);
    match &options.tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            let listener = TlsListener {
                tcp: listener,
                acceptor: tls.http_acceptor(),
            };
            // `tap_io` makes the peer's address the connection's info, as for TCP.
            axum::serve(listener.tap_io(|_| {}), app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
    .map_err(listen_error)?;
    tracing::info!(target: "strata_serve", "web page stopped");
    Ok(())
}

/// How long a client may take over its TLS handshake before the listener moves on.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP listener whose connections are TLS sessions (HTTPS). A handshake that fails (a
/// client speaking plain HTTP, one that does not trust the certificate) or takes longer
/// than [`TLS_HANDSHAKE_TIMEOUT`] is logged and its connection dropped.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, peer) = Listener::accept(&mut self.tcp).await;
            let handshake = self.acceptor.accept(stream);
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(tls)) => return (tls, peer),
                Ok(Err(e)) => tracing::warn!(
                    target: "strata_serve",
                    "web page: {peer}: TLS handshake failed ({e}); HTTPS only on this listener"
                ),
                Err(_) => tracing::warn!(
                    target: "strata_serve",
                    "web page: {peer}: no TLS handshake within {}s",
                    TLS_HANDSHAKE_TIMEOUT.as_secs()
                ),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

fn routes(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(overview_html))
        .route("/tables/{name}", get(table_html))
        .route("/api/pipelines", get(overview_json))
        .route("/api/tables/{name}", get(table_json))
        .route("/api/status", get(status_json))
        .route("/assets/page.css", get(css))
        .route("/assets/page.js", get(js))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(web.clone(), guard))
        .with_state(web)
}

/// Every request: refused without the credentials when they are asked for; a log line for
/// every request that fails (refused, unknown, an error while reading the warehouse).
async fn guard(
    State(web): State<Arc<Web>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Admission::Refused(why) = web.credentials.admit(authorization) {
        tracing::warn!(target: "strata_serve", "{peer}: {method} {path}: 401 refused ({why})");
        let mut response = (
            StatusCode::UNAUTHORIZED,
            html_headers(),
            render::error_page(
                "Authentication required",
                "Log in with the server's user and password (STRATA_SERVE_PASSWORD), or send \
                 its bearer token (STRATA_SERVE_TOKEN).",
            ),
        )
            .into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"strata\", charset=\"UTF-8\""),
        );
        return response;
    }
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let why = response
            .extensions()
            .get::<Failure>()
            .map(|f| f.0.clone())
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string());
        tracing::warn!(target: "strata_serve", "{peer}: {method} {path}: {} {why}", status.as_u16());
    }
    response
}

fn html_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h
}

fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h
}

/// As a page, or as JSON.
#[derive(Clone, Copy)]
enum Shape {
    Html,
    Json,
}

fn ok(shape: Shape, html: impl FnOnce() -> String, value: &impl serde::Serialize) -> Response {
    match shape {
        Shape::Html => (StatusCode::OK, html_headers(), html()).into_response(),
        Shape::Json => match serde_json::to_string(value) {
            Ok(text) => (StatusCode::OK, json_headers(), text).into_response(),
            Err(e) => failed(
                shape,
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding JSON: {e}"),
            ),
        },
    }
}

fn failed(shape: Shape, status: StatusCode, message: String) -> Response {
    let mut response = match shape {
        Shape::Html => (
            status,
            html_headers(),
            render::error_page(status.canonical_reason().unwrap_or("Error"), &message),
        )
            .into_response(),
        Shape::Json => (
            status,
            json_headers(),
            serde_json::json!({ "error": message }).to_string(),
        )
            .into_response(),
    };
    response.extensions_mut().insert(Failure(message));
    response
}

fn page_error(shape: Shape, e: PageError) -> Response {
    match e {
        PageError::NotFound(m) => failed(shape, StatusCode::NOT_FOUND, m),
        PageError::Engine(m) => failed(shape, StatusCode::INTERNAL_SERVER_ERROR, m),
    }
}

/// A permit to read, shared with the SQL listeners' `--max-queries`.
async fn permit(web: &Web) -> Option<tokio::sync::SemaphorePermit<'_>> {
    web.service.running.acquire().await.ok()
}

fn stopping(shape: Shape) -> Response {
    failed(
        shape,
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is stopping".into(),
    )
}

async fn overview(web: &Web, shape: Shape) -> Response {
    let Some(_permit) = permit(web).await else {
        return stopping(shape);
    };
    match gather::read_overview(&web.service.parser.wh).await {
        Ok(o) => ok(shape, || render::overview_page(&o), &o),
        Err(e) => page_error(shape, e),
    }
}

async fn table(web: &Web, name: &str, shape: Shape) -> Response {
    let Some(_permit) = permit(web).await else {
        return stopping(shape);
    };
    match gather::read_table(&web.service.parser.wh, name).await {
        Ok(t) => ok(shape, || render::table_page(&t), &t),
        Err(e) => page_error(shape, e),
    }
}

async fn overview_html(State(web): State<Arc<Web>>) -> Response {
    overview(&web, Shape::Html).await
}

async fn overview_json(State(web): State<Arc<Web>>) -> Response {
    overview(&web, Shape::Json).await
}

async fn table_html(State(web): State<Arc<Web>>, Path(name): Path<String>) -> Response {
    table(&web, &name, Shape::Html).await
}

async fn table_json(State(web): State<Arc<Web>>, Path(name): Path<String>) -> Response {
    table(&web, &name, Shape::Json).await
}

/// What the page's script polls: the event log's version.
async fn status_json(State(web): State<Arc<Web>>) -> Response {
    match strata_engine::event_log_version(&web.service.parser.wh).await {
        Ok(v) => ok(
            Shape::Json,
            String::new,
            &serde_json::json!({ "event_log_version": v }),
        ),
        Err(e) => page_error(Shape::Json, e.into()),
    }
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("page.css"))
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("page.js"))
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        text,
    )
        .into_response()
}

async fn not_found(request: Request) -> Response {
    let shape = match request.uri().path().starts_with("/api/") {
        true => Shape::Json,
        false => Shape::Html,
    };
    failed(
        shape,
        StatusCode::NOT_FOUND,
        format!("no page at {}", request.uri().path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn basic(user_password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
    }

    #[test]
    fn basic_auth_takes_the_user_and_password_or_token_and_bearer_the_token() {
        let c = Credentials {
            user: "strata".into(),
            password: Some("s3cret".into()),
            token: Some("t0ken".into()),
        };
        assert_eq!(c.admit(Some(&basic("strata:s3cret"))), Admission::Admitted);
        assert_eq!(c.admit(Some(&basic("strata:t0ken"))), Admission::Admitted);
        assert_eq!(c.admit(Some("Bearer t0ken")), Admission::Admitted);
        assert_eq!(c.admit(Some("bearer  t0ken ")), Admission::Admitted);
        assert_eq!(c.admit(None), Admission::Refused("no credentials"));
        for wrong in [
            basic("strata:wrong"),
            basic("other:s3cret"),
            basic("strata"),
            "Bearer s3cret".to_string(),
            "Basic !!!".to_string(),
            "Digest x".to_string(),
        ] {
            assert_eq!(
                c.admit(Some(&wrong)),
                Admission::Refused("wrong credentials"),
                "{wrong}"
            );
        }
    }

    #[test]
    fn without_secrets_every_request_is_let_in() {
        let c = Credentials {
            user: "strata".into(),
            password: None,
            token: None,
        };
        assert_eq!(c.admit(None), Admission::Open);
    }

    #[test]
    fn a_token_only_server_refuses_a_password_it_does_not_have() {
        let c = Credentials {
            user: "strata".into(),
            password: None,
            token: Some("t0ken".into()),
        };
        assert_eq!(
            c.admit(Some(&basic("strata:"))),
            Admission::Refused("wrong credentials")
        );
        assert_eq!(c.admit(Some("Bearer t0ken")), Admission::Admitted);
    }
}
