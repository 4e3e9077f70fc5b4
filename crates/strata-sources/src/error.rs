//! The crate's one error type.
//!
//! Every variant carries the place as data (connection name, object, column, slot, LSN, file
//! line) and its message says the way out. No message ever contains a password: errors from
//! the drivers are scrubbed of the connection's password before they are stored (see
//! [`crate::Secret::scrub`]), and nothing here formats a [`crate::Secret`] other than as `***`.

use std::path::PathBuf;

use crate::lsn::Lsn;

/// Result alias for this crate.
pub type Result<T, E = SourceError> = std::result::Result<T, E>;

/// Everything that can go wrong reading a source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The connection spec itself is wrong (unknown option, bad value, empty name).
    #[error("connection '{connection}': {detail}")]
    Config {
        /// Connection name.
        connection: String,
        /// What is wrong and how to fix it.
        detail: String,
    },

    /// No password was found where strata looks for one.
    #[error(
        "connection '{connection}': the server asks for a password for user '{user}' and none was found \
         (looked in: {looked}); pass one through the pipeline's secret (an environment variable), \
         or set {env_var}, or add it to {file_hint}"
    )]
    NoPassword {
        /// Connection name.
        connection: String,
        /// The user the server asked a password for.
        user: String,
        /// Where strata looked, in order (never a password).
        looked: String,
        /// The environment variable that would have supplied it.
        env_var: &'static str,
        /// The password file that would have supplied it.
        file_hint: &'static str,
    },

    /// A password file exists but cannot be used.
    #[error("connection '{connection}': password file {}: {detail}", path.display())]
    PasswordFile {
        /// Connection name.
        connection: String,
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        detail: String,
    },

    /// Connecting or authenticating failed.
    #[error(
        "connection '{connection}': cannot connect to {kind} at {host}:{port} as '{user}': {detail}; \
         check that the server runs and accepts TCP connections there, and the user and password"
    )]
    Connect {
        /// Connection name.
        connection: String,
        /// `PostgreSQL` or `MySQL`.
        kind: &'static str,
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// User.
        user: String,
        /// The driver's reason (password scrubbed).
        detail: String,
    },

    /// TLS with the server failed for good: it offers none, or its certificate is not trusted
    /// for the host. The connection's TLS options are named; no retry can help.
    #[error(
        "connection '{connection}': TLS with {kind} at {host}:{port} failed ({settings}): \
         {detail}"
    )]
    Tls {
        /// Connection name.
        connection: String,
        /// `PostgreSQL` or `MySQL`.
        kind: &'static str,
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// The TLS options as written (`sslmode 'verify-full', sslrootcert '/etc/ca.pem'`).
        settings: String,
        /// The driver's reason (password scrubbed), then what to do about it.
        detail: String,
    },

    /// The server refused a statement (missing table, permission, syntax of a source query).
    #[error("connection '{connection}', {object}: {detail}")]
    Query {
        /// Connection name.
        connection: String,
        /// The table, query or slot the statement was about.
        object: String,
        /// The server's reason (password scrubbed) and, where known, what to do.
        detail: String,
    },

    /// A column has a type strata cannot map to a Delta type.
    #[error(
        "connection '{connection}', {object}: column '{column}' has type {type_name}, which strata cannot \
         read ({why}); exclude the column, or read the table through a query that casts it \
         (for example to text)"
    )]
    UnsupportedType {
        /// Connection name.
        connection: String,
        /// Table or query.
        object: String,
        /// Column name.
        column: String,
        /// The source's type name, e.g. `integer[]`, `interval`, `numeric(50,2)`.
        type_name: String,
        /// Why (e.g. no Delta type, precision over 38).
        why: String,
    },

    /// A value cannot be represented in the column's Arrow type.
    #[error("connection '{connection}', {object}: column '{column}': {detail}")]
    Value {
        /// Connection name.
        connection: String,
        /// Table or query.
        object: String,
        /// Column name.
        column: String,
        /// The value problem and the way out.
        detail: String,
    },

    /// A named column (watermark or excluded column) does not exist.
    #[error(
        "connection '{connection}', {object}: no column '{column}' (columns: {available}); {hint}"
    )]
    NoSuchColumn {
        /// Connection name.
        connection: String,
        /// Table or query.
        object: String,
        /// The missing column.
        column: String,
        /// The columns that exist.
        available: String,
        /// What the column was asked for.
        hint: String,
    },

    /// A stored watermark cannot be used.
    #[error("watermark: {detail}")]
    Watermark {
        /// What is wrong; the way out is usually a full refresh.
        detail: String,
    },

    /// The replication slot the engine's state refers to does not exist (dropped, or never
    /// created on this server).
    #[error(
        "connection '{connection}': replication slot '{slot}' does not exist{}; the changes since then \
         are lost to strata. Re-snapshot with a full refresh of the tables fed by this slot, which \
         creates the slot again and copies the tables",
        recorded_lsn.map(|l| format!(" (strata recorded LSN {l} for it)")).unwrap_or_default()
    )]
    SlotMissing {
        /// Connection name.
        connection: String,
        /// Slot name.
        slot: String,
        /// The LSN the engine recorded, if it gave one.
        recorded_lsn: Option<Lsn>,
    },

    /// The slot exists but cannot deliver what the engine needs.
    #[error("connection '{connection}': replication slot '{slot}': {detail}")]
    Slot {
        /// Connection name.
        connection: String,
        /// Slot name.
        slot: String,
        /// What is wrong and the way out.
        detail: String,
        /// True when only a re-snapshot (full refresh) recovers.
        resnapshot: bool,
    },

    /// The replication stream failed or sent something unexpected.
    #[error("connection '{connection}': replication slot '{slot}'{}: {detail}",
        lsn.map(|l| format!(" at LSN {l}")).unwrap_or_default())]
    Replication {
        /// Connection name.
        connection: String,
        /// Slot name.
        slot: String,
        /// Where in the stream, if known.
        lsn: Option<Lsn>,
        /// What happened and what to do.
        detail: String,
    },

    /// The binlog (MySQL / MariaDB CDC) cannot deliver what the engine needs, or its stream
    /// failed.
    #[error("connection '{connection}': binlog{}: {detail}",
        position.as_ref().map(|p| format!(" at {p}")).unwrap_or_default())]
    Binlog {
        /// Connection name.
        connection: String,
        /// Where in the binlog (`binlog file #3, offset 1234`), if known.
        position: Option<String>,
        /// What happened and the way out.
        detail: String,
        /// True when only a re-snapshot (full refresh) recovers.
        resnapshot: bool,
    },

    /// A Debezium change file line cannot be read.
    #[error("{file}:{line}: {detail}")]
    Debezium {
        /// File name as given by the caller.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: String,
    },

    /// Reading a change file failed.
    #[error("{file}: {source}")]
    Io {
        /// File name as given by the caller.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },

    /// Building an Arrow batch failed (a bug in strata if it happens).
    #[error("{object}: cannot build an Arrow batch: {source}")]
    Arrow {
        /// Table or file.
        object: String,
        /// Arrow's error.
        source: arrow_schema::ArrowError,
    },
}

impl SourceError {
    /// True when the engine should re-snapshot (full refresh) to recover: the slot is gone or
    /// invalidated, the binlog no longer has the recorded position, or a table read through
    /// the binlog changed its columns.
    pub fn needs_resnapshot(&self) -> bool {
        matches!(
            self,
            SourceError::SlotMissing { .. }
                | SourceError::Slot {
                    resnapshot: true,
                    ..
                }
                | SourceError::Binlog {
                    resnapshot: true,
                    ..
                }
        )
    }
}
