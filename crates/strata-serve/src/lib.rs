//! Serving a warehouse to SQL clients: `strata serve --pg` speaks the PostgreSQL wire
//! protocol, so psql, psycopg, tokio-postgres and BI tools read the warehouse's tables
//! with the SQL `strata query` accepts, read-only; `--flight` speaks Arrow Flight SQL
//! (ADBC, the JDBC Flight SQL driver) over the same query path; `--http` serves a web page
//! of the pipelines' graphs, their last runs and the tables.
//!
//! A tour, bottom up:
//! - [`statement`] (pure): a client's text split into statements, and what kind each is:
//!   a read, `USE`, a setting or transaction statement, or a write that is refused.
//! - [`types`] (pure): the PostgreSQL type of each Arrow type, values in PostgreSQL's text
//!   and binary formats, parameters back into Arrow scalars.
//! - [`scram`] (pure): SCRAM-SHA-256's messages on the server's side, over a verifier of
//!   the password.
//! - [`auth`]: the user and password (from `STRATA_SERVE_PASSWORD` or a file), the rule
//!   that only a loopback address may go without one, and the SCRAM exchange of one
//!   connection.
//! - [`tls`]: the certificate and key (PEM files), checked before listening, for both
//!   listeners.
//! - [`catalog`]: `version()`, `current_database()`, a small `pg_catalog` for clients'
//!   introspection (`\dt`).
//! - [`service`]: the protocol's query handlers. A read goes through
//!   [`strata_engine::prepare_query`] (three-part names, `USE`, `as_of`, `table_changes`,
//!   time travel, `DESCRIBE`, `SHOW TABLES`) on a session opened for that statement,
//!   planned by DataFusion and checked to be a read.
//! - [`flight`]: the Flight SQL service: statements, prepared statements (their handle is
//!   their text), the catalog calls, bearer tokens and the handshake.
//! - [`server`]: the PostgreSQL listener, one task and one authentication state per connection, a
//!   log line per connection and per failed query, and a clean stop.
//! - [`web`]: the web page (axum): a pure page model built from the event log, the plans
//!   and a table's metadata, rendered to HTML and SVG, and the HTTP routes with basic or
//!   bearer authentication.
//!
//! The protocol itself is pgwire's (without a TLS backend of its own: the `SSLRequest` and
//! the TLS handshake are answered in [`server`]). This crate is above
//! `strata-engine` and below `strata-cli`.

pub mod auth;
mod catalog;
pub mod error;
mod flight;
mod pg_syntax;
mod scram;
mod server;
mod service;
mod statement;
mod tls;
mod types;
mod web;

pub use auth::{
    check_exposure, check_flight_exposure, check_http_exposure, read_password, read_token,
    PASSWORD_ENV, TOKEN_ENV,
};
pub use error::{Result, ServeError};
pub use flight::{serve_flight, FlightOptions};
pub use server::{serve_pg, PgOptions};
pub use tls::Tls;
pub use web::{serve_http, HttpOptions};

use std::sync::Arc;
use strata_engine::Warehouse;

/// What the listeners of one `strata serve` share: the warehouse, the permits to run a
/// read (`--max-queries` for the whole server, whichever protocol asks) and the memory one
/// statement may hold.
#[derive(Clone)]
pub struct Shared {
    service: Arc<service::Service>,
}

impl Shared {
    /// Serving `wh` with at most `max_queries` reads at once (at least one), each within
    /// `query_memory` bytes.
    pub fn new(wh: Warehouse, max_queries: usize, query_memory: u64) -> Shared {
        let query_memory = usize::try_from(query_memory).unwrap_or(usize::MAX);
        Shared {
            service: Arc::new(service::Service::new(wh, max_queries, query_memory)),
        }
    }
}

/// The address `strata serve --flight` listens on when given no value (the port Flight SQL
/// servers usually take, Dremio's and others').
pub const DEFAULT_FLIGHT_ADDR: &str = "127.0.0.1:32010";

/// The address `strata serve --pg` listens on when given no value (PostgreSQL's port plus
/// one, to stay clear of a local PostgreSQL).
pub const DEFAULT_PG_ADDR: &str = "127.0.0.1:5433";

/// The address `strata serve --http` listens on when given no value.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8765";

/// The user name clients log in as unless `--user` says otherwise.
pub const DEFAULT_USER: &str = "strata";

/// How many reads plan and compute at once unless `--max-queries` says otherwise.
pub const DEFAULT_MAX_QUERIES: usize = 16;
