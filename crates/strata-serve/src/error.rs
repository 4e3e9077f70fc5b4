//! The one error type of the crate.

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be listened on (taken, not this machine's).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The password is missing where it is needed, or cannot be read.
    #[error("{0}")]
    Password(String),
    /// The TLS certificate or key cannot be read or used (the message names the file).
    #[error("{0}")]
    Tls(String),
}

pub type Result<T, E = ServeError> = std::result::Result<T, E>;
