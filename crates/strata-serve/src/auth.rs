//! Who may connect: the user name and password (the password from the environment or a
//! file, never the command line), whether the address may go without one, and PostgreSQL's
//! MD5 password exchange over them (the password itself never crosses the wire).

use crate::error::{Result, ServeError};
use async_trait::async_trait;
use pgwire::api::auth::md5pass::hash_md5_password;
use pgwire::api::auth::{AuthSource, LoginInfo, Password};
use pgwire::error::{PgWireError, PgWireResult};
use std::net::SocketAddr;
use std::path::Path;

/// The environment variable holding the server's password.
pub const PASSWORD_ENV: &str = "STRATA_SERVE_PASSWORD";

/// The password clients must give: the first line of `file` when given, else `env` (the
/// value of [`PASSWORD_ENV`]); `None` when neither is set. An empty password is an error.
pub fn read_password(env: Option<String>, file: Option<&Path>) -> Result<Option<String>> {
    let (password, from) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ServeError::Password(format!("cannot read password file {}: {e}", path.display()))
            })?;
            let first = text.lines().next().unwrap_or("").to_string();
            (Some(first), format!("password file {}", path.display()))
        }
        None => (env, PASSWORD_ENV.to_string()),
    };
    match password {
        Some(p) if p.is_empty() => Err(ServeError::Password(format!("{from} is empty"))),
        other => Ok(other),
    }
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

/// The one user and password the server accepts, for the MD5 exchange: each connection
/// gets its own salt. Its `Debug` shows the user only.
pub(crate) struct Login {
    user: String,
    password: String,
}

impl Login {
    pub(crate) fn new(user: &str, password: &str) -> Login {
        Login {
            user: user.to_string(),
            password: password.to_string(),
        }
    }
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &self.user)
            .field("password", &"..")
            .finish()
    }
}

/// Four random bytes (a connection's MD5 salt).
fn salt() -> [u8; 4] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let v = h.finish().to_le_bytes();
    [v[0], v[1], v[2], v[3]]
}

#[async_trait]
impl AuthSource for Login {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let user = login.user().unwrap_or_default();
        if user != self.user {
            // The same answer as a wrong password: which users exist is not told.
            return Err(PgWireError::InvalidPassword(user.to_string()));
        }
        let salt = salt();
        let hash = hash_md5_password(&self.user, &self.password, &salt);
        Ok(Password::new(Some(salt.to_vec()), hash.into_bytes()))
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
    fn the_kept_password_is_not_shown() {
        let login = Login::new("strata", "s3cret");
        let shown = format!("{login:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("strata"), "{shown}");
    }
}
