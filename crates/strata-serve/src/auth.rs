//! Who may connect: the user name and password (the password from the environment or a
//! file, never the command line), the bearer token, whether the address may go without
//! them, and the SCRAM-SHA-256 verifier PostgreSQL clients prove they know the password
//! against (the password itself never crosses the wire, and the server keeps only the
//! verifier).

use crate::error::{Result, ServeError};
use crate::scram::{self, Exchange, ScramError, Verifier};
use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use pgwire::api::auth::mechanism::{AuthMechanism, AuthState};
use pgwire::api::{ClientInfo, METADATA_USER};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// The environment variable holding the server's password.
pub const PASSWORD_ENV: &str = "STRATA_SERVE_PASSWORD";

/// The environment variable holding the Flight SQL listener's bearer token.
pub const TOKEN_ENV: &str = "STRATA_SERVE_TOKEN";

/// The password clients must give: the first line of `file` when given, else `env` (the
/// value of [`PASSWORD_ENV`]); `None` when neither is set. An empty password is an error.
pub fn read_password(env: Option<String>, file: Option<&Path>) -> Result<Option<String>> {
    read_secret(env, file, PASSWORD_ENV, "password")
}

/// The bearer token Flight SQL clients may give instead of the user and password: the
/// first line of `file` when given, else `env` (the value of [`TOKEN_ENV`]).
pub fn read_token(env: Option<String>, file: Option<&Path>) -> Result<Option<String>> {
    read_secret(env, file, TOKEN_ENV, "token")
}

/// A secret (`what`: password, token) from the first line of `file`, else `env` (the value
/// of the variable `env_name`).
fn read_secret(
    env: Option<String>,
    file: Option<&Path>,
    env_name: &str,
    what: &str,
) -> Result<Option<String>> {
    let (secret, from) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ServeError::Password(format!("cannot read {what} file {}: {e}", path.display()))
            })?;
            let first = text.lines().next().unwrap_or("").to_string();
            (Some(first), format!("{what} file {}", path.display()))
        }
        None => (env, env_name.to_string()),
    };
    match secret {
        Some(p) if p.is_empty() => Err(ServeError::Password(format!("{from} is empty"))),
        other => Ok(other),
    }
}

/// Refuses to listen for Flight SQL clients with neither a token nor a password unless
/// asked to (`no_auth`) on a loopback address.
pub fn check_flight_exposure(addr: &SocketAddr, secret: bool, no_auth: bool) -> Result<()> {
    check_secret_exposure(addr, secret, no_auth, "Flight SQL clients")
}

/// Refuses to serve the web page with neither a token nor a password unless asked to
/// (`no_auth`) on a loopback address.
pub fn check_http_exposure(addr: &SocketAddr, secret: bool, no_auth: bool) -> Result<()> {
    check_secret_exposure(addr, secret, no_auth, "Web page readers (--http)")
}

/// Refuses to listen for `clients` with neither a token nor a password unless asked to
/// (`no_auth`) on a loopback address.
fn check_secret_exposure(
    addr: &SocketAddr,
    secret: bool,
    no_auth: bool,
    clients: &str,
) -> Result<()> {
    let set = format!(
        "set {TOKEN_ENV} (or --token-file FILE) for a bearer token, or {PASSWORD_ENV} (or \
         --password-file FILE) for the user and password"
    );
    match (secret, no_auth) {
        (true, _) => Ok(()),
        (false, true) if addr.ip().is_loopback() => Ok(()),
        (false, true) => Err(ServeError::Password(format!(
            "--no-auth is only allowed on a loopback address (127.0.0.1, ::1), and {addr} is \
             reachable from other machines: {set}"
        ))),
        (false, false) => Err(ServeError::Password(format!(
            "{clients} need a token or a password: {set} (or, on a loopback address only, \
             --no-auth to let anyone on this machine connect)"
        ))),
    }
}

/// `a == b` in a time that does not depend on where they differ (a guessed secret is not
/// found one byte at a time).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

/// Refuses to listen without a password unless asked to (`no_auth`) on a loopback address.
pub fn check_exposure(addr: &SocketAddr, password: Option<&str>, no_auth: bool) -> Result<()> {
    match (password, no_auth) {
        (Some(_), _) => Ok(()),
        (None, true) if addr.ip().is_loopback() => Ok(()),
        (None, true) => Err(ServeError::Password(format!(
            "--no-auth is only allowed on a loopback address (127.0.0.1, ::1), and {addr} is \
             reachable from other machines: set {PASSWORD_ENV} or pass --password-file FILE"
        ))),
        (None, false) => Err(ServeError::Password(format!(
            "clients need a password: set {PASSWORD_ENV} or pass --password-file FILE (or, \
             on a loopback address only, --no-auth to let anyone on this machine connect)"
        ))),
    }
}

/// The one user the server accepts and the SCRAM-SHA-256 verifier of its password (the
/// password itself is not kept). Its `Debug` shows the user only.
pub(crate) struct Login {
    user: String,
    verifier: Verifier,
}

impl Login {
    /// `user` and the verifier of `password`, with a salt of its own and
    /// [`scram::ITERATIONS`] rounds, as PostgreSQL derives its own.
    pub(crate) fn new(user: &str, password: &str) -> Login {
        Login {
            user: user.to_string(),
            verifier: Verifier::new(password, random_bytes::<16>().to_vec(), scram::ITERATIONS),
        }
    }
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// `N` random bytes from the system's source (a salt, a nonce).
fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // The system's source failed (it does not on Linux): the clock and the process's
        // hash seed, which still differ between connections.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    bytes
}

/// One connection's SCRAM-SHA-256 exchange against the server's [`Login`]: the mechanism
/// list, then the client's first message (answered with the salt, the iteration count
/// and the nonce), then its proof (answered with the server's signature).
pub(crate) struct ScramLogin {
    login: Arc<Login>,
    exchange: Option<Exchange>,
}

impl ScramLogin {
    pub(crate) fn new(login: Arc<Login>) -> ScramLogin {
        ScramLogin {
            login,
            exchange: None,
        }
    }
}

#[async_trait]
impl AuthMechanism for ScramLogin {
    async fn begin(&mut self, _client: &(dyn ClientInfo + Send + Sync)) -> PgWireResult<AuthState> {
        Ok(AuthState::InProgress(Authentication::SASL(vec![
            scram::MECHANISM.to_string(),
        ])))
    }

    async fn next(
        &mut self,
        client: &(dyn ClientInfo + Send + Sync),
        message: PasswordMessageFamily,
    ) -> PgWireResult<AuthState> {
        let user = client
            .metadata()
            .get(METADATA_USER)
            .cloned()
            .unwrap_or_default();
        let refused = |e: ScramError| match e {
            ScramError::Malformed(why) => PgWireError::InvalidScramMessage(why),
            ScramError::WrongPassword => PgWireError::InvalidPassword(user.clone()),
        };
        match self.exchange.take() {
            None => {
                let initial = message.into_sasl_initial_response()?;
                if initial.auth_method != scram::MECHANISM {
                    return Err(PgWireError::UnsupportedSASLAuthMethod(initial.auth_method));
                }
                if user != self.login.user {
                    // The same answer as a wrong password: which users exist is not told.
                    return Err(PgWireError::InvalidPassword(user));
                }
                let first = initial.data.unwrap_or_default();
                let nonce = BASE64.encode(random_bytes::<18>());
                let (server_first, exchange) =
                    scram::server_first(&self.login.verifier, &first, &nonce).map_err(refused)?;
                self.exchange = Some(exchange);
                Ok(AuthState::InProgress(Authentication::SASLContinue(
                    server_first.into(),
                )))
            }
            Some(exchange) => {
                let last = message.into_sasl_response()?;
                let server_final = exchange
                    .server_final(&self.login.verifier, &last.data)
                    .map_err(refused)?;
                Ok(AuthState::Ok {
                    final_message: Some(Authentication::SASLFinal(server_final.into())),
                    identity: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_comes_from_the_file_before_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(
            read_password(Some("env".into()), Some(&file)).unwrap(),
            Some("s3cret".to_string())
        );
        assert_eq!(
            read_password(Some("env".into()), None).unwrap(),
            Some("env".to_string())
        );
        assert_eq!(read_password(None, None).unwrap(), None);
        let e = read_password(Some(String::new()), None).unwrap_err();
        assert!(
            e.to_string().contains("STRATA_SERVE_PASSWORD is empty"),
            "{e}"
        );
        let e = read_password(None, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(e.to_string().contains("cannot read password file"), "{e}");
    }

    #[test]
    fn only_loopback_listens_without_a_password_and_only_when_asked() {
        let lo: SocketAddr = "127.0.0.1:5433".parse().unwrap();
        let lo6: SocketAddr = "[::1]:5433".parse().unwrap();
        let all: SocketAddr = "0.0.0.0:5433".parse().unwrap();
        assert!(check_exposure(&lo, None, true).is_ok());
        assert!(check_exposure(&lo6, None, true).is_ok());
        assert!(check_exposure(&all, Some("pw"), false).is_ok());
        let e = check_exposure(&all, None, true).unwrap_err();
        assert!(e.to_string().contains("only allowed on a loopback"), "{e}");
        let e = check_exposure(&lo, None, false).unwrap_err();
        assert!(e.to_string().contains("STRATA_SERVE_PASSWORD"), "{e}");
        assert!(e.to_string().contains("--no-auth"), "{e}");
    }

    #[test]
    fn a_token_comes_from_its_file_or_variable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t0ken\nignored\n").unwrap();
        assert_eq!(
            read_token(Some("env".into()), Some(&file)).unwrap(),
            Some("t0ken".to_string())
        );
        let e = read_token(Some(String::new()), None).unwrap_err();
        assert!(e.to_string().contains("STRATA_SERVE_TOKEN is empty"), "{e}");
        let e = read_token(None, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(e.to_string().contains("cannot read token file"), "{e}");
    }

    #[test]
    fn flight_listens_without_a_secret_only_on_loopback_and_when_asked() {
        let lo: SocketAddr = "127.0.0.1:32010".parse().unwrap();
        let all: SocketAddr = "0.0.0.0:32010".parse().unwrap();
        assert!(check_flight_exposure(&lo, false, true).is_ok());
        assert!(check_flight_exposure(&all, true, false).is_ok());
        let e = check_flight_exposure(&all, false, true).unwrap_err();
        assert!(e.to_string().contains("only allowed on a loopback"), "{e}");
        let e = check_flight_exposure(&lo, false, false).unwrap_err();
        assert!(e.to_string().contains("STRATA_SERVE_TOKEN"), "{e}");
        assert!(e.to_string().starts_with("Flight SQL clients"), "{e}");
    }

    #[test]
    fn the_web_page_is_served_without_a_secret_only_on_loopback_and_when_asked() {
        let lo: SocketAddr = "127.0.0.1:8765".parse().unwrap();
        let all: SocketAddr = "0.0.0.0:8765".parse().unwrap();
        assert!(check_http_exposure(&lo, false, true).is_ok());
        assert!(check_http_exposure(&all, true, false).is_ok());
        let e = check_http_exposure(&all, false, true).unwrap_err();
        assert!(e.to_string().contains("only allowed on a loopback"), "{e}");
        let e = check_http_exposure(&lo, false, false).unwrap_err();
        assert!(e.to_string().contains("--http"), "{e}");
        assert!(e.to_string().contains("STRATA_SERVE_PASSWORD"), "{e}");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
        assert!(same_secret("", ""));
    }

    #[test]
    fn the_kept_verifier_is_not_shown() {
        let login = Login::new("strata", "s3cret");
        let shown = format!("{login:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("key") && !shown.contains("salt"), "{shown}");
        assert!(shown.contains("strata"), "{shown}");
    }

    /// Each server draws its own salt, so two verifiers of one password differ.
    #[test]
    fn each_login_has_its_own_salt() {
        let a = format!("{:?}", random_bytes::<16>());
        let b = format!("{:?}", random_bytes::<16>());
        assert_ne!(a, b);
    }
}
