//! Connection specs, password resolution, and opening connections.
//!
//! A pipeline names a connection without its password. The password comes, in this order:
//!
//! * PostgreSQL: the spec's explicit [`Secret`] (the engine passes one it read from an
//!   environment variable), else `PGPASSWORD`, else the password file (`PGPASSFILE`, else
//!   `~/.pgpass`; lines `host:port:database:user:password`, `*` matches anything, `\` escapes
//!   `:` and `\`; the first matching line wins; a file readable or writable by group or others
//!   is ignored, as libpq does).
//! * MySQL / MariaDB: the explicit secret, else `MYSQL_PWD`, else `password` in the `[client]`
//!   section of `~/.my.cnf` (a world-writable file is ignored, as the MySQL client does).
//!
//! With none found, the connection is attempted without a password (trust / socket auth);
//! when the server then asks for one, the error says where strata looked.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Result, SourceError};
use crate::secret::Secret;
use crate::tls::{self, PgTls, TlsMode, TlsSettings};

pub use crate::kind::SourceKind;

/// A named connection as a pipeline declares it. `Debug` prints the password as `***`.
///
/// Options (all optional):
/// * PostgreSQL: `sslmode` (`disable`, `allow` (the default: no TLS), `prefer`, `require`,
///   `verify-ca`, `verify-full`, as in libpq), `sslrootcert` (the CA's PEM file, or `system`;
///   default `~/.postgresql/root.crt` when it exists), `sslcert` and `sslkey` (a client
///   certificate and its private key, PEM files), `connect_timeout` (seconds),
///   `application_name`.
/// * MySQL: `ssl_mode` (`DISABLED` (the default), `PREFERRED`, `REQUIRED`, `VERIFY_CA`,
///   `VERIFY_IDENTITY`) or libpq's `sslmode`, `ssl_ca` or `sslrootcert`, `ssl_cert` or
///   `sslcert` and `ssl_key` or `sslkey`, `connect_timeout` (seconds).
///
/// The TLS modes mean what libpq's do (the `tls` module has the table).
#[derive(Clone, Debug)]
pub struct ConnectionSpec {
    /// The connection's name in the pipeline (appears in every error).
    pub name: String,
    /// PostgreSQL or MySQL.
    pub kind: SourceKind,
    /// Host name or IP address.
    pub host: String,
    /// Port; `None` means the kind's default.
    pub port: Option<u16>,
    /// Database name.
    pub database: String,
    /// User name.
    pub user: String,
    /// An explicit password (from the engine's secret handling). `None`: look it up.
    pub password: Option<Secret>,
    /// Driver options, see the type's documentation.
    pub options: BTreeMap<String, String>,
}

impl ConnectionSpec {
    /// A spec with the kind's default port, no explicit password and no options.
    pub fn new(
        name: impl Into<String>,
        kind: SourceKind,
        host: impl Into<String>,
        database: impl Into<String>,
        user: impl Into<String>,
    ) -> Self {
        ConnectionSpec {
            name: name.into(),
            kind,
            host: host.into(),
            port: None,
            database: database.into(),
            user: user.into(),
            password: None,
            options: BTreeMap::new(),
        }
    }

    /// Set the port.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Set the explicit password.
    pub fn with_password(mut self, password: Secret) -> Self {
        self.password = Some(password);
        self
    }

    /// Set a driver option.
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// The port, or the kind's default.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(self.kind.default_port())
    }

    /// Find the password the way the type's documentation says, from this process's
    /// environment and home directory.
    pub fn resolve_password(&self) -> Result<ResolvedPassword> {
        self.resolve_password_in(&PasswordLookup::from_process())
    }

    /// Find the password from the given environment (tests, or an engine with its own
    /// environment handling).
    pub fn resolve_password_in(&self, env: &PasswordLookup) -> Result<ResolvedPassword> {
        if let Some(p) = &self.password {
            return Ok(ResolvedPassword::found(
                p.clone(),
                PasswordOrigin::Explicit,
                vec![],
            ));
        }
        let (env_var, env_value, file) = match self.kind {
            SourceKind::Postgres => ("PGPASSWORD", &env.pgpassword, PasswordFile::PgPass),
            SourceKind::Mysql => ("MYSQL_PWD", &env.mysql_pwd, PasswordFile::MyCnf),
        };
        let mut notes = Vec::new();
        if let Some(p) = env_value.as_ref().filter(|p| !p.expose().is_empty()) {
            return Ok(ResolvedPassword::found(
                p.clone(),
                PasswordOrigin::EnvVar(env_var),
                notes,
            ));
        }
        notes.push(format!("{env_var} (not set)"));
        match file.path(env) {
            None => notes.push(format!("~/{} (no home directory)", file.home_name())),
            Some(path) => match self.password_in_file(&path, file)? {
                Ok((line, pw)) => {
                    return Ok(ResolvedPassword::found(
                        Secret::new(pw),
                        PasswordOrigin::File { path, line },
                        notes,
                    ))
                }
                Err(why) => notes.push(format!("{} ({why})", path.display())),
            },
        }
        Ok(ResolvedPassword {
            secret: None,
            origin: PasswordOrigin::NotFound,
            notes,
        })
    }

    /// The password this connection finds in a password file: its 1-based line and value, or
    /// why there is none (no such file, ignored for its permissions, no line for it).
    fn password_in_file(
        &self,
        path: &Path,
        file: PasswordFile,
    ) -> Result<std::result::Result<(usize, String), String>> {
        let text = match read_password_file(&self.name, path, file)? {
            Ok(text) => text,
            Err(why) => return Ok(Err(why)),
        };
        Ok(match file {
            PasswordFile::PgPass => {
                let host = if self.host.is_empty() {
                    "localhost"
                } else {
                    &self.host
                };
                let port = self.port().to_string();
                pgpass_lookup(&text, host, &port, &self.database, &self.user).ok_or_else(|| {
                    format!(
                        "no line matches {host}:{port}:{}:{}",
                        self.database, self.user
                    )
                })
            }
            PasswordFile::MyCnf => {
                mycnf_client_password(&text).ok_or_else(|| "no password in [client]".to_string())
            }
        })
    }

    fn config_error(&self, detail: impl Into<String>) -> SourceError {
        SourceError::Config {
            connection: self.name.clone(),
            detail: detail.into(),
        }
    }

    /// The TLS the options ask for (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`; MySQL's
    /// `ssl_mode`, `ssl_ca`, `ssl_cert`, `ssl_key`),
    /// with libpq's default CA file under `env`'s home directory. A mode strata does not know,
    /// a CA file that is missing or holds no certificate, or a verifying mode without a CA
    /// is an error naming the option.
    pub(crate) fn tls_settings_in(&self, env: &PasswordLookup) -> Result<TlsSettings> {
        tls::settings(
            self.kind,
            &self.options,
            env.home.as_deref(),
            &tls::system_bundle,
        )
        .map_err(|e| self.config_error(e))
    }

    fn connect_timeout(&self) -> Result<Option<Duration>> {
        match self.options.get("connect_timeout") {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(|s| Some(Duration::from_secs(s)))
                .map_err(|_| {
                    self.config_error(format!(
                        "option connect_timeout = '{v}' is not a whole number of seconds"
                    ))
                }),
        }
    }
}

/// Where strata looks for passwords: the environment variables and home directory that
/// matter. [`PasswordLookup::from_process`] reads the real ones. `Debug` prints `***` for the
/// variables that hold passwords.
#[derive(Clone, Debug, Default)]
pub struct PasswordLookup {
    /// `PGPASSWORD`.
    pub pgpassword: Option<Secret>,
    /// `PGPASSFILE`.
    pub pgpassfile: Option<PathBuf>,
    /// `MYSQL_PWD`.
    pub mysql_pwd: Option<Secret>,
    /// `HOME`.
    pub home: Option<PathBuf>,
}

impl PasswordLookup {
    /// From this process's environment.
    pub fn from_process() -> Self {
        PasswordLookup {
            pgpassword: std::env::var("PGPASSWORD").ok().map(Secret::new),
            pgpassfile: std::env::var_os("PGPASSFILE").map(PathBuf::from),
            mysql_pwd: std::env::var("MYSQL_PWD").ok().map(Secret::new),
            home: std::env::var_os("HOME").map(PathBuf::from),
        }
    }
}

/// A password found (or not) and where it came from. Safe to log: the secret prints as `***`.
#[derive(Clone, Debug)]
pub struct ResolvedPassword {
    /// The password, if one was found.
    pub secret: Option<Secret>,
    /// Where it came from.
    pub origin: PasswordOrigin,
    /// What was looked at before (for messages): e.g. `PGPASSWORD (not set)`.
    pub notes: Vec<String>,
}

impl ResolvedPassword {
    fn found(secret: Secret, origin: PasswordOrigin, notes: Vec<String>) -> Self {
        ResolvedPassword {
            secret: Some(secret),
            origin,
            notes,
        }
    }
}

/// Where a password came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordOrigin {
    /// The spec's explicit secret.
    Explicit,
    /// An environment variable (`PGPASSWORD`, `MYSQL_PWD`).
    EnvVar(&'static str),
    /// A password file, and the 1-based line the password is on.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
    },
    /// Nowhere: connect without a password.
    NotFound,
}

impl fmt::Display for PasswordOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordOrigin::Explicit => f.write_str("the connection's secret"),
            PasswordOrigin::EnvVar(v) => f.write_str(v),
            PasswordOrigin::File { path, line } => write!(f, "{} line {line}", path.display()),
            PasswordOrigin::NotFound => f.write_str("nowhere"),
        }
    }
}

/// A password file, with the rule of the client it imitates for when to ignore it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PasswordFile {
    /// libpq's `.pgpass`: ignored when group or others have any access.
    PgPass,
    /// MySQL's `.my.cnf`: ignored when world-writable.
    MyCnf,
}

impl PasswordFile {
    /// Its name in the home directory.
    fn home_name(self) -> &'static str {
        match self {
            PasswordFile::PgPass => ".pgpass",
            PasswordFile::MyCnf => ".my.cnf",
        }
    }

    /// Where to read it: `PGPASSFILE` for `.pgpass` when set, else the home directory
    /// (`None` without one).
    fn path(self, env: &PasswordLookup) -> Option<PathBuf> {
        match (self, &env.pgpassfile) {
            (PasswordFile::PgPass, Some(p)) => Some(p.clone()),
            _ => env.home.as_ref().map(|h| h.join(self.home_name())),
        }
    }
}

/// A password file's text, or why it is not read (missing, or ignored for its permissions);
/// an error when it is there but cannot be read.
fn read_password_file(
    connection: &str,
    path: &Path,
    file: PasswordFile,
) -> Result<std::result::Result<String, String>> {
    let unreadable = |e: std::io::Error| SourceError::PasswordFile {
        connection: connection.to_string(),
        path: path.to_path_buf(),
        detail: format!("cannot read it: {e}"),
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Err("no such file".into()))
        }
        Err(e) => return Err(unreadable(e)),
    };
    if !meta.is_file() {
        return Ok(Err("not a plain file: ignored".into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        match file {
            PasswordFile::PgPass if mode & 0o077 != 0 => {
                return Ok(Err(format!(
                    "has group or world access (mode {:o}): ignored, as libpq does; \
                     run chmod 0600 on it",
                    mode & 0o777
                )))
            }
            PasswordFile::MyCnf if mode & 0o002 != 0 => {
                return Ok(Err(format!(
                    "is world-writable (mode {:o}): ignored, as the MySQL client does; \
                     run chmod 0600 on it",
                    mode & 0o777
                )))
            }
            _ => {}
        }
    }
    let _ = file;
    let bytes = std::fs::read(path).map_err(unreadable)?;
    Ok(Ok(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Split one pgpass line into its fields, undoing `\` escapes; `*` stays a wildcard only when
/// it is a whole unescaped field. Returns `None` for lines with fewer than five fields.
fn pgpass_fields(line: &str) -> Option<Vec<(String, bool)>> {
    // (value, is_wildcard)
    let mut fields = Vec::with_capacity(5);
    let mut cur = String::new();
    let mut escaped_any = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if fields.len() == 4 {
            // The password: the rest of the line, escapes undone.
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                _ => cur.push(c),
            }
            continue;
        }
        match c {
            '\\' => {
                escaped_any = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ':' => {
                let wildcard = cur == "*" && !escaped_any;
                fields.push((std::mem::take(&mut cur), wildcard));
                escaped_any = false;
            }
            _ => cur.push(c),
        }
    }
    if fields.len() != 4 {
        return None;
    }
    fields.push((cur, false));
    Some(fields)
}

/// The first pgpass line matching `host:port:database:user`: its 1-based number and password.
pub(crate) fn pgpass_lookup(
    text: &str,
    host: &str,
    port: &str,
    database: &str,
    user: &str,
) -> Option<(usize, String)> {
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches(['\r', '\n']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(fields) = pgpass_fields(line) else {
            continue;
        };
        let want = [host, port, database, user];
        let all = fields[..4]
            .iter()
            .zip(want)
            .all(|((value, wildcard), w)| *wildcard || value == w);
        if all {
            return Some((i + 1, fields[4].0.clone()));
        }
    }
    None
}

/// `password` from the `[client]` section of a MySQL option file: its 1-based line and value.
/// Later lines override earlier ones, as in MySQL.
pub(crate) fn mycnf_client_password(text: &str) -> Option<(usize, String)> {
    let mut in_client = false;
    let mut found = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            let name = line.trim_start_matches('[').split(']').next().unwrap_or("");
            in_client = name.trim().eq_ignore_ascii_case("client");
            continue;
        }
        if !in_client {
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (line, ""),
        };
        // MySQL treats '-' and '_' alike in option names.
        if key.replace('-', "_") != "password" {
            continue;
        }
        found = Some((i + 1, mycnf_value(value)));
    }
    found
}

fn mycnf_value(v: &str) -> String {
    let quote = v.chars().next().filter(|c| *c == '"' || *c == '\'');
    if let Some(q) = quote {
        let mut out = String::new();
        let mut chars = v[1..].chars();
        while let Some(c) = chars.next() {
            if c == q {
                break;
            }
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    Some('b') => out.push('\u{8}'),
                    Some('s') => out.push(' '),
                    Some(o) => out.push(o),
                    None => {}
                }
            } else {
                out.push(c);
            }
        }
        out
    } else {
        // An unquoted value ends at a comment.
        let end = v.find('#').unwrap_or(v.len());
        v[..end].trim_end().to_string()
    }
}

/// The session settings of every PostgreSQL connection, replication ones too: UTC, ISO dates,
/// floats in full, and no JIT compilation (PostgreSQL 11 and later): a read's queries are
/// scans whose plans JIT compiles for tens of milliseconds each and gains nothing on.
const PG_SESSION_OPTIONS: &str =
    "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=3 -c jit=off";

/// A resolved connection: the spec plus its password. Opening connections goes through here.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub spec: ConnectionSpec,
    pub password: ResolvedPassword,
    /// The TLS the options ask for.
    pub tls: TlsSettings,
    /// tokio-postgres's TLS (a PostgreSQL connection whose mode tries TLS), built once.
    pg_tls: Option<PgTls>,
}

impl Resolved {
    /// The spec with its password and TLS settings; bad TLS options fail here, before any
    /// connection is tried.
    pub fn new(spec: &ConnectionSpec) -> Result<Self> {
        if spec.name.trim().is_empty() {
            return Err(SourceError::Config {
                connection: spec.name.clone(),
                detail: "the connection has no name".into(),
            });
        }
        let env = PasswordLookup::from_process();
        let password = spec.resolve_password_in(&env)?;
        let tls = spec.tls_settings_in(&env)?;
        let pg_tls = match spec.kind {
            SourceKind::Postgres => tls::client_config(&tls)
                .map_err(|e| spec.config_error(e))?
                .map(|c| PgTls(std::sync::Arc::new(c))),
            SourceKind::Mysql => None,
        };
        Ok(Resolved {
            spec: spec.clone(),
            password,
            tls,
            pg_tls,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// A driver message with the password taken out.
    pub fn scrub(&self, text: &str) -> String {
        match &self.password.secret {
            Some(s) => s.scrub(text),
            None => text.to_string(),
        }
    }

    /// The error for a failed connection attempt: a missing password when none was found and
    /// the server asked for one, else the driver's reason.
    pub fn connect_error(&self, detail: String) -> SourceError {
        let mut detail = self.scrub(&detail);
        let lower = detail.to_ascii_lowercase();
        if let Some(hint) = self.tls_failure_hint(&lower) {
            return self.tls_error(detail, hint);
        }
        if let Some(hint) = self.client_cert_hint(&lower) {
            detail.push_str(&hint);
        }
        if self.tls.mode.tries_tls() {
            detail.push_str(&format!(" (TLS: {})", self.tls));
        } else if self.spec.kind == SourceKind::Postgres && lower.contains("no encryption") {
            detail.push_str(&format!(
                "; the server takes this user only over TLS: set {} to '{}' (or '{}' with {})",
                self.tls.mode_option(),
                self.tls.spell(TlsMode::Require),
                self.tls.spell(TlsMode::VerifyFull),
                self.tls.ca_option(),
            ));
        }
        let asked_for_password = lower.contains("password")
            || lower.contains("access denied")
            || lower.contains("authentication");
        if self.password.secret.is_none() && asked_for_password {
            let (env_var, file_hint) = match self.spec.kind {
                SourceKind::Postgres => ("PGPASSWORD", "~/.pgpass (or the file PGPASSFILE names)"),
                SourceKind::Mysql => ("MYSQL_PWD", "the [client] section of ~/.my.cnf"),
            };
            return SourceError::NoPassword {
                connection: self.spec.name.clone(),
                user: self.spec.user.clone(),
                looked: self.password.notes.join(", "),
                env_var,
                file_hint,
            };
        }
        SourceError::Connect {
            connection: self.spec.name.clone(),
            kind: self.spec.kind.label(),
            host: self.spec.host.clone(),
            port: self.spec.port(),
            user: self.spec.user.clone(),
            detail,
        }
    }

    /// When a refusal (a driver's message, lower case) may be for a client certificate: what
    /// to set, or which one was refused.
    fn client_cert_hint(&self, lower: &str) -> Option<String> {
        let (cert, key) = match self.spec.kind {
            SourceKind::Postgres => ("sslcert", "sslkey"),
            SourceKind::Mysql => ("ssl_cert", "ssl_key"),
        };
        let wants_cert = lower.contains("requires a valid client certificate")
            || lower.contains("certificaterequired")
            || lower.contains("certificate required");
        let refused_cert = lower.contains("certificate authentication failed")
            || lower.contains("unknownca")
            || lower.contains("badcertificate");
        match &self.tls.client_cert {
            None if wants_cert => Some(format!(
                "; the server takes this user only with a client certificate: set the options \
                 {cert} and {key} to the PEM files of the certificate and its private key"
            )),
            None if self.spec.kind == SourceKind::Mysql && lower.contains("access denied") => {
                Some(format!(
                    "; if the account requires a client certificate (REQUIRE X509, SUBJECT or \
                     ISSUER), set the options {cert} and {key} to the PEM files of the \
                     certificate and its private key"
                ))
            }
            Some(c) if wants_cert || refused_cert => Some(format!(
                "; the server refused the client certificate ({}): it must be signed by a CA \
                 the server trusts and name the user (PostgreSQL: CN = the user name)",
                c.describe()
            )),
            _ => None,
        }
    }

    /// The error for TLS that failed (the server offers none, or its certificate is not
    /// trusted for the host): permanent, naming the host, the TLS options and the way out.
    pub fn tls_error(&self, detail: String, hint: String) -> SourceError {
        SourceError::Tls {
            connection: self.spec.name.clone(),
            kind: self.spec.kind.label(),
            host: self.spec.host.clone(),
            port: self.spec.port(),
            settings: self.tls.to_string(),
            detail: format!("{}; {hint}", self.scrub(&detail)),
        }
    }

    /// When a driver's message (lower case) says that TLS itself failed, what to do about it.
    /// A connection lost during the handshake is not such a failure: it may pass.
    pub fn tls_failure_hint(&self, lower: &str) -> Option<String> {
        let s = &self.tls;
        if !s.mode.tries_tls() {
            return None;
        }
        let host = &self.spec.host;
        let ca = || {
            s.root_cert
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        if lower.contains("not valid for name") || lower.contains("notvalidforname") {
            let mut hint = format!(
                "the server's certificate does not name the host '{host}': connect by a name \
                 the certificate lists"
            );
            if s.mode == TlsMode::VerifyFull {
                hint.push_str(&format!(
                    ", or use {} '{}' to check the CA but not the name",
                    s.mode_option(),
                    s.spell(TlsMode::VerifyCa)
                ));
            }
            if s.mode == TlsMode::VerifyCa && self.spec.kind == SourceKind::Mysql {
                hint.push_str(
                    "; mysql_async 0.37 checks the name in VERIFY_CA too (its issue #404, \
                     fixed upstream but not released yet), so VERIFY_CA works only by a name \
                     the certificate lists for now",
                );
            }
            return Some(hint);
        }
        if lower.contains("unknownissuer")
            || lower.contains("unknown issuer")
            || lower.contains("badsignature")
        {
            return Some(format!(
                "the server's certificate is not signed by a CA in {} ({}): give the CA that \
                 signed it",
                s.ca_option(),
                ca()
            ));
        }
        if lower.contains("certificate expired") || lower.contains("certificate not valid yet") {
            return Some(
                "the server's certificate is out of its validity period: the server needs a \
                 current one (or this machine's clock is wrong)"
                    .to_string(),
            );
        }
        if lower.contains("does not support tls")
            || lower.contains("sslrequest rejected")
            || lower.contains("asked for ssl")
        {
            let weaker = match self.spec.kind {
                SourceKind::Postgres => "ssl = on in postgresql.conf",
                SourceKind::Mysql => "ssl_cert and ssl_key in the server's configuration",
            };
            return Some(format!(
                "the server does not offer TLS: turn it on there ({weaker}), or set {} to '{}' \
                 to connect without it where the network is trusted",
                s.mode_option(),
                s.spell(TlsMode::Disable)
            ));
        }
        if let Some(c) = &s.client_cert {
            let refused = [
                "unknownca",
                "badcertificate",
                "certificateunknown",
                "decrypterror",
            ];
            if lower.contains("alert") && refused.iter().any(|a| lower.contains(a)) {
                return Some(format!(
                    "the server refused the client certificate ({}): it must be signed by a CA \
                     the server trusts (and, for PostgreSQL's cert login, name the user)",
                    c.describe()
                ));
            }
        }
        if lower.contains("invalid peer certificate")
            || lower.contains("received fatal alert")
            || lower.contains("peer is incompatible")
            || lower.contains("peer misbehaved")
        {
            return Some(format!(
                "the TLS handshake with {host} failed; check the server's certificate and TLS \
                 settings against {} and {}",
                s.mode_option(),
                s.ca_option()
            ));
        }
        None
    }

    pub fn query_error(&self, object: impl Into<String>, detail: impl fmt::Display) -> SourceError {
        SourceError::Query {
            connection: self.spec.name.clone(),
            object: object.into(),
            detail: self.scrub(&detail.to_string()),
        }
    }

    /// The password found, as the drivers take it.
    fn password_text(&self) -> Option<String> {
        self.password
            .secret
            .as_ref()
            .map(|s| s.expose().to_string())
    }

    fn check_options(&self, known: &[&str]) -> Result<()> {
        for k in self.spec.options.keys() {
            if !known.contains(&k.as_str()) {
                return Err(self.spec.config_error(format!(
                    "unknown option '{k}' for a {} connection (known: {})",
                    self.spec.kind.label(),
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Open a PostgreSQL connection (session time zone UTC; the connection task is spawned on
    /// the current Tokio runtime).
    pub async fn pg_connect(&self) -> Result<tokio_postgres::Client> {
        let spec = &self.spec;
        if spec.kind != SourceKind::Postgres {
            return Err(spec.config_error("this is not a PostgreSQL connection"));
        }
        self.check_options(&[
            "sslmode",
            "sslrootcert",
            "sslcert",
            "sslkey",
            "connect_timeout",
            "application_name",
        ])?;
        let mut cfg = tokio_postgres::Config::new();
        cfg.host(&spec.host)
            .port(spec.port())
            .user(&spec.user)
            .dbname(&spec.database)
            .application_name(
                spec.options
                    .get("application_name")
                    .map(String::as_str)
                    .unwrap_or("strata"),
            )
            .options(PG_SESSION_OPTIONS);
        cfg.ssl_mode(pg_ssl_mode(self.tls.mode));
        if let Some(t) = spec.connect_timeout()? {
            cfg.connect_timeout(t);
        }
        if let Some(p) = &self.password.secret {
            cfg.password(p.expose());
        }
        let opened = match &self.pg_tls {
            None => cfg
                .connect(tokio_postgres::NoTls)
                .await
                .map(|(client, connection)| self.spawn_connection(client, connection)),
            Some(tls) => cfg
                .connect(tls.clone())
                .await
                .map(|(client, connection)| self.spawn_connection(client, connection)),
        };
        opened.map_err(|e| self.connect_error(pg_error_text(&e)))
    }

    /// Runs a tokio-postgres connection's task on the current runtime (its end is logged,
    /// password scrubbed) and returns its client.
    fn spawn_connection<S, T>(
        &self,
        client: tokio_postgres::Client,
        connection: tokio_postgres::Connection<S, T>,
    ) -> tokio_postgres::Client
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let name = self.spec.name.clone();
        let scrubber = self.password.secret.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                let text = pg_error_text(&e);
                let text = scrubber.map(|s| s.scrub(&text)).unwrap_or(text);
                tracing::debug!(connection = %name, "PostgreSQL connection ended: {text}");
            }
        });
        client
    }

    /// Options for a replication (walsender) connection to the same server.
    pub fn replication_config(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<pgwire_replication::ReplicationConfig> {
        let spec = &self.spec;
        Ok(pgwire_replication::ReplicationConfig::new(
            spec.host.clone(),
            spec.user.clone(),
            self.password_text().unwrap_or_default(),
            spec.database.clone(),
            slot.to_string(),
            publication.to_string(),
        )
        .with_port(spec.port())
        .with_application_name("strata-cdc")
        .with_options(PG_SESSION_OPTIONS)
        .with_tls(self.pgwire_tls()))
    }

    /// The replication connection's TLS, in pgwire-replication's terms. Its `verify-ca`
    /// checks the host name too (pgwire-replication 0.5 forgives only the error variant
    /// rustls 0.23 no longer reports): it fails closed, and `repl_error` says so.
    fn pgwire_tls(&self) -> pgwire_replication::TlsConfig {
        use pgwire_replication::{SslMode as M, TlsConfig as T};
        let ca = self.tls.root_cert.clone();
        let t = match self.tls.mode {
            TlsMode::Disable | TlsMode::Allow => T::disabled(),
            TlsMode::Prefer => T {
                mode: M::Prefer,
                ..T::default()
            },
            TlsMode::Require => T::require(),
            TlsMode::VerifyCa => T::verify_ca(ca),
            TlsMode::VerifyFull => T::verify_full(ca),
        };
        let t = match &self.tls.client_cert {
            Some(c) if self.tls.mode.tries_tls() => {
                t.with_client_cert(c.cert.clone(), c.key.clone())
            }
            _ => t,
        };
        // pgwire refuses verify-full by an IP address unless told the name to check: the
        // address itself, which rustls then checks against the certificate's IP entries.
        if self.tls.mode == TlsMode::VerifyFull
            && self.spec.host.parse::<std::net::IpAddr>().is_ok()
        {
            t.with_sni_hostname(self.spec.host.clone())
        } else {
            t
        }
    }

    /// Open a MySQL / MariaDB connection (session time zone `+00:00`, utf8mb4).
    pub async fn mysql_connect(&self) -> Result<mysql_async::Conn> {
        let spec = &self.spec;
        if spec.kind != SourceKind::Mysql {
            return Err(spec.config_error("this is not a MySQL connection"));
        }
        self.check_options(&[
            "connect_timeout",
            "ssl_mode",
            "ssl_ca",
            "ssl_cert",
            "ssl_key",
            "sslmode",
            "sslrootcert",
            "sslcert",
            "sslkey",
        ])?;
        let timeout = spec.connect_timeout()?;
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname(spec.host.clone())
            .tcp_port(spec.port())
            .user(Some(spec.user.clone()))
            .pass(self.password_text())
            .db_name(Some(spec.database.clone()))
            .prefer_socket(false)
            .init(vec![
                "SET time_zone = '+00:00'".to_string(),
                "SET NAMES utf8mb4".to_string(),
            ]);
        let ssl = self.mysql_ssl_opts();
        if ssl.is_some() {
            tls::install_default_provider();
        }
        let conn = match self.mysql_open(opts.clone().ssl_opts(ssl), timeout).await? {
            // `prefer`: a server without TLS is talked to in plain.
            Err(mysql_async::Error::Driver(
                mysql_async::DriverError::NoClientSslFlagFromServer,
            )) if self.tls.mode == TlsMode::Prefer => {
                self.mysql_open(opts.ssl_opts(None::<mysql_async::SslOpts>), timeout)
                    .await?
            }
            other => other,
        };
        conn.map_err(|e| self.connect_error(e.to_string()))
    }

    /// One MySQL connection attempt; the outer error is the timeout.
    async fn mysql_open(
        &self,
        opts: mysql_async::OptsBuilder,
        timeout: Option<Duration>,
    ) -> Result<std::result::Result<mysql_async::Conn, mysql_async::Error>> {
        let fut = mysql_async::Conn::new(opts);
        match timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| self.connect_error(format!("no answer within {} s", t.as_secs()))),
            None => Ok(fut.await),
        }
    }

    /// mysql_async's TLS options for the mode (`None`: plain). `prefer` and `require` take
    /// any certificate; the verifying modes trust the CA file alone (not the built-in public
    /// CAs). mysql_async 0.37's VERIFY_CA checks the host name too (see `tls_failure_hint`).
    fn mysql_ssl_opts(&self) -> Option<mysql_async::SslOpts> {
        let identity =
            self.tls.client_cert.as_ref().map(|c| {
                mysql_async::ClientIdentity::new(c.cert.clone().into(), c.key.clone().into())
            });
        self.mysql_server_check()
            .map(|o| o.with_client_identity(identity))
    }

    /// mysql_async's TLS options for checking the server (see `mysql_ssl_opts`).
    fn mysql_server_check(&self) -> Option<mysql_async::SslOpts> {
        use mysql_async::SslOpts;
        let with_ca = |ca: &Path| {
            SslOpts::default()
                .with_root_certs(vec![ca.to_path_buf().into()])
                .with_disable_built_in_roots(true)
        };
        match (self.tls.mode, self.tls.root_cert.as_deref()) {
            (TlsMode::Disable | TlsMode::Allow, _) => None,
            (TlsMode::Prefer | TlsMode::Require, _) => {
                Some(SslOpts::default().with_danger_accept_invalid_certs(true))
            }
            (TlsMode::VerifyCa, Some(ca)) => {
                Some(with_ca(ca).with_danger_skip_domain_validation(true))
            }
            (TlsMode::VerifyFull, Some(ca)) => Some(with_ca(ca)),
            // Refused when the settings were made; fail closed all the same (no CA at all).
            (TlsMode::VerifyCa | TlsMode::VerifyFull, None) => {
                Some(SslOpts::default().with_disable_built_in_roots(true))
            }
        }
    }
}

/// tokio-postgres's mode: the verifying modes are `require` to it (the certificate checks are
/// in the rustls configuration).
fn pg_ssl_mode(mode: TlsMode) -> tokio_postgres::config::SslMode {
    use tokio_postgres::config::SslMode;
    match mode {
        TlsMode::Disable | TlsMode::Allow => SslMode::Disable,
        TlsMode::Prefer => SslMode::Prefer,
        TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
    }
}

/// A tokio-postgres error's full text: the server's message, detail and hint when there is one.
pub(crate) fn pg_error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        if let Some(h) = db.hint() {
            s.push_str(&format!("; hint: {h}"));
        }
        s
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            s.push_str(&format!(": {inner}"));
            src = inner.source();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PGPASS: &str = "\
# comment
db1.example.com:5432:sales:alice:pw-sales
*:5432:*:bob:pw\\:with\\:colons
localhost:*:*:carol:pw\\\\back
h\\:x:5432:*:dave:escaped-host
*:*:*:*:fallback
";

    #[test]
    fn pgpass_matching() {
        // host, port, database, user: the line that matches and its password.
        let cases = [
            (("db1.example.com", "5432", "sales", "alice"), 2, "pw-sales"),
            // Not the same database: falls through to the wildcard line.
            (("db1.example.com", "5432", "hr", "alice"), 6, "fallback"),
            (("any", "5432", "x", "bob"), 3, "pw:with:colons"),
            (("any", "5433", "x", "bob"), 6, "fallback"),
            (("localhost", "6000", "x", "carol"), 4, "pw\\back"),
            (("h:x", "5432", "x", "dave"), 5, "escaped-host"),
            (("hx", "5432", "x", "dave"), 6, "fallback"),
        ];
        for ((h, p, d, u), line, password) in cases {
            assert_eq!(
                pgpass_lookup(PGPASS, h, p, d, u),
                Some((line, password.to_string())),
                "{h}:{p}:{d}:{u}"
            );
        }
    }

    #[test]
    fn pgpass_escaped_star_is_literal_and_short_lines_skipped() {
        let text = "\\*:5432:db:u:literal\nshort:line\n*:5432:db:u:wild\n";
        assert_eq!(
            pgpass_lookup(text, "*", "5432", "db", "u"),
            Some((1, "literal".into()))
        );
        assert_eq!(
            pgpass_lookup(text, "h", "5432", "db", "u"),
            Some((3, "wild".into()))
        );
        assert_eq!(pgpass_lookup("", "h", "1", "d", "u"), None);
        // CRLF line endings.
        assert_eq!(
            pgpass_lookup("h:1:d:u:pw\r\n", "h", "1", "d", "u"),
            Some((1, "pw".into()))
        );
    }

    #[test]
    fn mycnf_parsing() {
        let text = "\
[mysqld]
password=server-side
[client]
user = me
password = \"quoted # not a comment\"
[mysql]
password=other
[client]
# later lines win
pass_word=ignored
password=plain # trailing comment
";
        assert_eq!(mycnf_client_password(text), Some((11, "plain".into())));
        assert_eq!(
            mycnf_client_password("[client]\npassword='a\\'b'\n"),
            Some((2, "a'b".into()))
        );
        assert_eq!(
            mycnf_client_password("[client]\npassword = \"x y\"\n"),
            Some((2, "x y".into()))
        );
        assert_eq!(mycnf_client_password("[mysqld]\npassword=x\n"), None);
    }

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        #[cfg(not(unix))]
        let _ = mode;
        p
    }

    fn pg_spec() -> ConnectionSpec {
        ConnectionSpec::new("src", SourceKind::Postgres, "db.local", "shop", "app").with_port(6543)
    }

    #[test]
    fn resolution_order_postgres() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "pgpass",
            "db.local:6543:shop:app:from-file\n",
            0o600,
        );
        let mut env = PasswordLookup {
            pgpassword: Some(Secret::new("from-env")),
            pgpassfile: Some(file.clone()),
            mysql_pwd: Some(Secret::new("mysql-env")),
            home: Some(dir.path().to_path_buf()),
        };
        let explicit = pg_spec().with_password(Secret::new("explicit"));
        let r = explicit.resolve_password_in(&env).unwrap();
        assert_eq!(r.origin, PasswordOrigin::Explicit);
        assert_eq!(r.secret.unwrap().expose(), "explicit");

        let r = pg_spec().resolve_password_in(&env).unwrap();
        assert_eq!(r.origin, PasswordOrigin::EnvVar("PGPASSWORD"));
        assert_eq!(r.secret.unwrap().expose(), "from-env");

        env.pgpassword = None;
        let r = pg_spec().resolve_password_in(&env).unwrap();
        assert_eq!(
            r.origin,
            PasswordOrigin::File {
                path: file.clone(),
                line: 1
            }
        );
        assert_eq!(r.secret.unwrap().expose(), "from-file");

        // Without PGPASSFILE: ~/.pgpass.
        env.pgpassfile = None;
        let r = pg_spec().resolve_password_in(&env).unwrap();
        assert_eq!(r.origin, PasswordOrigin::NotFound);
        assert!(
            r.notes.iter().any(|n| n.contains(".pgpass (no such file)")),
            "{:?}",
            r.notes
        );
        write(dir.path(), ".pgpass", "*:*:*:app:home-file\n", 0o600);
        let r = pg_spec().resolve_password_in(&env).unwrap();
        assert_eq!(r.secret.unwrap().expose(), "home-file");
    }

    #[cfg(unix)]
    #[test]
    fn pgpass_with_group_access_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "pgpass", "*:*:*:*:leaky\n", 0o640);
        let env = PasswordLookup {
            pgpassfile: Some(file),
            ..Default::default()
        };
        let r = pg_spec().resolve_password_in(&env).unwrap();
        assert!(r.secret.is_none());
        let notes = r.notes.join("; ");
        assert!(notes.contains("group or world access"), "{notes}");
        assert!(!notes.contains("leaky"));
    }

    #[test]
    fn resolution_order_mysql() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ConnectionSpec::new("m", SourceKind::Mysql, "h", "d", "u");
        let mut env = PasswordLookup {
            mysql_pwd: Some(Secret::new("env-pw")),
            pgpassword: Some(Secret::new("pg-env")),
            home: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let r = spec.resolve_password_in(&env).unwrap();
        assert_eq!(r.origin, PasswordOrigin::EnvVar("MYSQL_PWD"));
        assert_eq!(r.secret.unwrap().expose(), "env-pw");
        env.mysql_pwd = None;
        let r = spec.resolve_password_in(&env).unwrap();
        assert_eq!(r.origin, PasswordOrigin::NotFound);
        write(dir.path(), ".my.cnf", "[client]\npassword=cnf-pw\n", 0o600);
        let r = spec.resolve_password_in(&env).unwrap();
        assert_eq!(r.secret.unwrap().expose(), "cnf-pw");
        #[cfg(unix)]
        {
            write(dir.path(), ".my.cnf", "[client]\npassword=cnf-pw\n", 0o666);
            let r = spec.resolve_password_in(&env).unwrap();
            assert!(r.secret.is_none());
            assert!(r.notes.join(" ").contains("world-writable"));
        }
    }

    /// The error opening a connection with these options (with a password, so none is looked
    /// up) that must fail before connecting (the host does not exist: a connection tried
    /// would fail differently).
    async fn refused(kind: SourceKind, options: &[(&str, &str)]) -> String {
        let mut spec = ConnectionSpec::new("src", kind, "db.invalid", "shop", "app")
            .with_password(Secret::new("pw-123456"));
        for (k, v) in options {
            spec = spec.with_option(*k, *v);
        }
        let e = match Resolved::new(&spec) {
            Err(e) => e,
            Ok(r) => match kind {
                SourceKind::Postgres => r.pg_connect().await.map(drop).unwrap_err(),
                SourceKind::Mysql => r.mysql_connect().await.map(drop).unwrap_err(),
            },
        };
        assert!(
            matches!(e, SourceError::Config { .. }),
            "not refused before connecting: {e}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("connection 'src': ") && !e.contains("pw-123456"),
            "{e}"
        );
        e
    }

    #[tokio::test]
    async fn bad_options_are_refused_before_connecting() {
        use SourceKind::{Mysql, Postgres};
        let e = refused(Postgres, &[("sslmod", "disable")]).await;
        assert!(e.contains("unknown option 'sslmod'"), "{e}");
        let e = refused(Mysql, &[("connect_timeout", "soon")]).await;
        assert!(e.contains("connect_timeout"), "{e}");
        let e = refused(Postgres, &[("sslmode", "bogus")]).await;
        assert!(e.contains("sslmode = 'bogus'"), "{e}");
        let e = refused(Mysql, &[("ssl_mode", "VERIFY_CA")]).await;
        assert!(
            e.contains("ssl_mode 'VERIFY_CA'") && e.contains("ssl_ca"),
            "{e}"
        );
        let e = refused(
            Postgres,
            &[
                ("sslmode", "verify-full"),
                ("sslrootcert", "/nonexistent/ca.pem"),
            ],
        )
        .await;
        assert!(
            e.contains("sslrootcert") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let e = refused(
            Postgres,
            &[("sslmode", "require"), ("sslrootcert", "system")],
        )
        .await;
        assert!(e.contains("sslrootcert 'system'"), "{e}");
        // A MySQL option on a PostgreSQL connection.
        let e = refused(Postgres, &[("ssl_ca", "/etc/ca.pem")]).await;
        assert!(e.contains("unknown option 'ssl_ca'"), "{e}");
        let e =
            Resolved::new(&ConnectionSpec::new(" ", SourceKind::Mysql, "h", "d", "u")).unwrap_err();
        assert!(e.to_string().contains("no name"), "{e}");
    }

    #[test]
    fn debug_of_spec_and_resolution_hides_the_password() {
        let spec = pg_spec().with_password(Secret::new("s3cr3t-value"));
        let r = spec
            .resolve_password_in(&PasswordLookup::default())
            .unwrap();
        for text in [
            format!("{spec:?}"),
            format!("{r:?}"),
            format!("{}", r.origin),
        ] {
            assert!(!text.contains("s3cr3t-value"), "{text}");
        }
    }
}
