//! TLS to the databases, with rustls.
//!
//! A connection's TLS options become one [`TlsSettings`], with libpq's `sslmode` meanings for
//! both kinds of source:
//!
//! | `sslmode` (PostgreSQL) | `ssl_mode` (MySQL) | TLS | certificate chain | host name |
//! |---|---|---|---|---|
//! | `disable` | `DISABLED` | no | - | - |
//! | `allow` (PostgreSQL's default here) | - | no | - | - |
//! | `prefer` | `PREFERRED` | when the server offers it | not checked | not checked |
//! | `require` | `REQUIRED` | yes | not checked (checked when a CA is given) | not checked |
//! | `verify-ca` | `VERIFY_CA` | yes | checked | not checked |
//! | `verify-full` | `VERIFY_IDENTITY` | yes | checked | checked |
//!
//! The CA comes from `sslrootcert` (MySQL: `ssl_ca`): a PEM file, or `system` for the
//! operating system's bundle (verify-full only, as libpq 16 has it). PostgreSQL falls back on
//! `~/.postgresql/root.crt` as libpq does; with a CA, `require` checks the chain (libpq's
//! rule, applied to MySQL's `REQUIRED` + `ssl_ca` too). A verifying mode without a CA is a
//! configuration error: strata never falls back on a built-in list of public CAs.
//!
//! A client certificate (`sslcert` and `sslkey`, libpq's names; MySQL: also `ssl_cert` and
//! `ssl_key`) is shown to servers that ask for one, on every connection: both files are read
//! when the settings are made, so a missing or unreadable file, or a key that is not the
//! certificate's, is refused before any connection is tried.
//!
//! tokio-postgres gets its TLS from [`PgTls`] below; pgwire-replication and mysql_async are
//! given the same settings in their own terms (see `conn.rs`). Every rustls configuration here
//! names the ring provider: the tree compiles aws-lc-rs too, and with two providers rustls has
//! no default of its own.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::rustls::{
    self,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::kind::SourceKind;

/// How much TLS a connection asks for, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TlsMode {
    /// Never.
    Disable,
    /// No TLS (libpq tries plain first and TLS second; strata connects plain only).
    Allow,
    /// TLS when the server offers it, nothing checked.
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS, the certificate chain checked against the CA.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyFull,
}

impl TlsMode {
    /// Whether a connection in this mode tries TLS at all.
    pub fn tries_tls(self) -> bool {
        self >= TlsMode::Prefer
    }
}

/// The PostgreSQL spellings (libpq's `sslmode`), which MySQL connections take too.
const LIBPQ_MODES: [(&str, TlsMode); 6] = [
    ("disable", TlsMode::Disable),
    ("allow", TlsMode::Allow),
    ("prefer", TlsMode::Prefer),
    ("require", TlsMode::Require),
    ("verify-ca", TlsMode::VerifyCa),
    ("verify-full", TlsMode::VerifyFull),
];

/// MySQL's `ssl_mode` spellings (its client's `--ssl-mode`).
const MYSQL_MODES: [(&str, TlsMode); 5] = [
    ("DISABLED", TlsMode::Disable),
    ("PREFERRED", TlsMode::Prefer),
    ("REQUIRED", TlsMode::Require),
    ("VERIFY_CA", TlsMode::VerifyCa),
    ("VERIFY_IDENTITY", TlsMode::VerifyFull),
];

/// Where the CA came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
enum CaOrigin {
    /// The option (`sslrootcert`, `ssl_ca`) names the file.
    Option,
    /// `system`: the operating system's bundle.
    System,
    /// libpq's default file, `~/.postgresql/root.crt`.
    HomeDefault,
}

/// A connection's TLS, resolved from its options (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// The mode in force (after `require` with a CA became `verify-ca`).
    pub mode: TlsMode,
    /// The PEM file of the CA(s) the server's certificate is checked against, when the mode
    /// checks it.
    pub root_cert: Option<PathBuf>,
    /// The option that sets the mode (`sslmode`, `ssl_mode`) and its value as written.
    mode_option: &'static str,
    mode_written: Option<String>,
    /// The option that names the CA (`sslrootcert`, `ssl_ca`) and where the CA came from.
    ca_option: &'static str,
    ca_origin: Option<CaOrigin>,
    /// The client certificate shown to a server that asks for one.
    pub client_cert: Option<ClientCert>,
}

/// A client certificate: the PEM files of its chain and of its private key, and the options
/// that named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    cert_option: &'static str,
    key_option: &'static str,
}

impl ClientCert {
    /// The certificate chain and the private key, read from their files; the error names
    /// the option and the file.
    fn load(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let certs = read_pem(self.cert_option, &self.cert, "client certificate", |p| {
            CertificateDer::pem_file_iter(p).and_then(|it| it.collect::<Result<Vec<_>, _>>())
        })?;
        if certs.is_empty() {
            return Err(format!(
                "{}: client certificate file '{}' holds no certificate (expected PEM: \
                 -----BEGIN CERTIFICATE-----)",
                self.cert_option,
                self.cert.display()
            ));
        }
        let key = read_pem(self.key_option, &self.key, "private key", |p| {
            PrivateKeyDer::from_pem_file(p)
        })?;
        Ok((certs, key))
    }

    /// The names the options give, for messages: `sslcert '/c.pem', sslkey '/c.key'`.
    pub fn describe(&self) -> String {
        format!(
            "{} '{}', {} '{}'",
            self.cert_option,
            self.cert.display(),
            self.key_option,
            self.key.display()
        )
    }
}

/// What `read` reads from the file `path` names (option `option`), or an error naming the
/// option and the file: missing, unreadable, not PEM, or without the item (`what`).
fn read_pem<T>(
    option: &str,
    path: &Path,
    what: &str,
    read: impl FnOnce(&Path) -> Result<T, rustls::pki_types::pem::Error>,
) -> Result<T, String> {
    use rustls::pki_types::pem::Error as E;
    let shown = path.display();
    if let Err(e) = std::fs::metadata(path) {
        return Err(match e.kind() {
            io::ErrorKind::NotFound => format!("{option}: {what} file '{shown}' does not exist"),
            _ => format!("{option}: cannot read the {what} file '{shown}': {e}"),
        });
    }
    read(path).map_err(|e| match e {
        E::Io(e) => format!("{option}: cannot read the {what} file '{shown}': {e}"),
        E::NoItemsFound => format!(
            "{option}: {what} file '{shown}' holds no {what} (expected PEM: -----BEGIN PRIVATE \
             KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)"
        ),
        other => format!("{option}: cannot read the {what} file '{shown}' as PEM: {other}"),
    })
}

impl TlsSettings {
    /// The way the connection's options spell `mode` (`verify-ca` or `VERIFY_CA`).
    pub fn spell(&self, mode: TlsMode) -> &'static str {
        spell(self.mode_option, mode)
    }

    /// The option that names the CA file (`sslrootcert`, `ssl_ca`).
    pub fn ca_option(&self) -> &'static str {
        self.ca_option
    }

    /// The option that sets the mode (`sslmode`, `ssl_mode`).
    pub fn mode_option(&self) -> &'static str {
        self.mode_option
    }
}

/// How the options read, for messages: `sslmode 'verify-full', sslrootcert '/etc/ca.pem'`.
impl fmt::Display for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mode_written {
            Some(v) => write!(f, "{} '{v}'", self.mode_option)?,
            None => write!(
                f,
                "{} not set, so '{}'",
                self.mode_option,
                self.spell(self.mode)
            )?,
        }
        let file = self
            .root_cert
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match &self.ca_origin {
            None => {}
            Some(_) if self.root_cert.is_none() => {}
            Some(CaOrigin::Option) => write!(f, ", {} '{file}'", self.ca_option)?,
            Some(CaOrigin::System) => write!(f, ", {} 'system' ({file})", self.ca_option)?,
            Some(CaOrigin::HomeDefault) => write!(f, ", CA file {file} (libpq's default)")?,
        }
        if let Some(c) = &self.client_cert {
            write!(f, ", {}", c.describe())?;
        }
        if self.mode_written.as_deref().and_then(parse_known) == Some(TlsMode::Require)
            && self.mode == TlsMode::VerifyCa
        {
            write!(
                f,
                ", so the certificate chain is checked ('{}' with a CA, as libpq does)",
                self.spell(TlsMode::Require)
            )?;
        }
        Ok(())
    }
}

fn spell(mode_option: &str, mode: TlsMode) -> &'static str {
    let table: &[(&'static str, TlsMode)] = if mode_option == "ssl_mode" {
        &MYSQL_MODES
    } else {
        &LIBPQ_MODES
    };
    table
        .iter()
        .find(|(_, m)| *m == mode)
        .map(|(n, _)| *n)
        // MySQL has no `allow`: it connects without TLS.
        .unwrap_or("DISABLED")
}

/// A mode in either spelling (for the `require` note in messages).
fn parse_known(v: &str) -> Option<TlsMode> {
    LIBPQ_MODES
        .iter()
        .chain(MYSQL_MODES.iter())
        .find(|(n, _)| n.eq_ignore_ascii_case(v.trim()))
        .map(|(_, m)| *m)
}

/// The mode an option's value names (case does not matter), or why not.
fn parse_mode(option: &str, value: &str) -> Result<TlsMode, String> {
    let table: &[(&str, TlsMode)] = if option == "ssl_mode" {
        &MYSQL_MODES
    } else {
        &LIBPQ_MODES
    };
    table
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(value.trim()))
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            format!(
                "option {option} = '{value}' is not a TLS mode (one of: {})",
                names.join(", ")
            )
        })
}

/// A connection's TLS settings from its options. `home` is the home directory (for libpq's
/// `~/.postgresql/root.crt`), `system_bundle` finds the operating system's CA bundle (for
/// `system`). The error says what is wrong, naming the option (the caller adds the
/// connection's name).
pub(crate) fn settings(
    kind: SourceKind,
    options: &BTreeMap<String, String>,
    home: Option<&Path>,
    system_bundle: &dyn Fn() -> Option<PathBuf>,
) -> Result<TlsSettings, String> {
    let (mode_names, ca_names): (&[&'static str], &[&'static str]) = match kind {
        SourceKind::Postgres => (&["sslmode"], &["sslrootcert"]),
        SourceKind::Mysql => (&["ssl_mode", "sslmode"], &["ssl_ca", "sslrootcert"]),
    };
    let pick = |names: &[&'static str]| -> Result<Option<(&'static str, String)>, String> {
        let given: Vec<(&'static str, String)> = names
            .iter()
            .filter_map(|n| options.get(*n).map(|v| (*n, v.trim().to_string())))
            .collect();
        match given.len() {
            0 => Ok(None),
            1 => Ok(given.into_iter().next()),
            _ => Err(format!(
                "options {} and {} say the same thing: give one of them",
                given[0].0, given[1].0
            )),
        }
    };
    let mode_given = pick(mode_names)?;
    let ca_given = pick(ca_names)?;
    let (cert_names, key_names): (&[&'static str], &[&'static str]) = match kind {
        SourceKind::Postgres => (&["sslcert"], &["sslkey"]),
        SourceKind::Mysql => (&["ssl_cert", "sslcert"], &["ssl_key", "sslkey"]),
    };
    let cert_given = pick(cert_names)?;
    let key_given = pick(key_names)?;
    let mode_option = mode_given.as_ref().map_or(mode_names[0], |(n, _)| *n);
    let ca_option = ca_given.as_ref().map_or(ca_names[0], |(n, _)| *n);
    let system = ca_given.as_ref().is_some_and(|(_, v)| v == "system");
    let mut mode = match &mode_given {
        Some((name, value)) => parse_mode(name, value)?,
        // libpq 16: sslrootcert=system without an sslmode means verify-full.
        None if system => TlsMode::VerifyFull,
        // Today's behaviour: no TLS unless asked for.
        None => match kind {
            SourceKind::Postgres => TlsMode::Allow,
            SourceKind::Mysql => TlsMode::Disable,
        },
    };
    if system && mode != TlsMode::VerifyFull {
        return Err(format!(
            "{ca_option} 'system' (the operating system's CAs, which sign the certificates of \
             many hosts) is only safe with {mode_option} '{}', which also checks the host name; \
             libpq refuses it with weaker modes too",
            spell(mode_option, TlsMode::VerifyFull)
        ));
    }
    let mut root_cert = None;
    let mut ca_origin = None;
    // A CA is of no use without TLS, nor to `prefer`, which checks nothing (and then a
    // missing file is no reason to refuse).
    if mode >= TlsMode::Require {
        match &ca_given {
            Some((name, _)) if system => {
                let bundle = system_bundle().ok_or_else(|| {
                    format!(
                        "{name} 'system': no CA bundle of the operating system was found \
                         (set SSL_CERT_FILE to one, or give the CA's PEM file)"
                    )
                })?;
                check_ca_file(name, &bundle)?;
                root_cert = Some(bundle);
                ca_origin = Some(CaOrigin::System);
            }
            Some((name, value)) => {
                let path = PathBuf::from(value);
                check_ca_file(name, &path)?;
                root_cert = Some(path);
                ca_origin = Some(CaOrigin::Option);
            }
            None if kind == SourceKind::Postgres => {
                if let Some(file) = home
                    .map(|h| h.join(".postgresql").join("root.crt"))
                    .filter(|p| p.is_file())
                {
                    check_ca_file("~/.postgresql/root.crt", &file)?;
                    root_cert = Some(file);
                    ca_origin = Some(CaOrigin::HomeDefault);
                }
            }
            None => {}
        }
    }
    // libpq: "if a root CA file exists, sslmode=require behaves like verify-ca".
    if mode == TlsMode::Require && root_cert.is_some() {
        mode = TlsMode::VerifyCa;
    }
    if matches!(mode, TlsMode::VerifyCa | TlsMode::VerifyFull) && root_cert.is_none() {
        let written = spell(mode_option, mode);
        let home_note = match kind {
            SourceKind::Postgres => " (~/.postgresql/root.crt, libpq's default, does not exist)",
            SourceKind::Mysql => "",
        };
        return Err(format!(
            "{mode_option} '{written}' checks the server's certificate, which needs the CA that \
             signed it: set {ca_option} to its PEM file{home_note}, or to 'system' for the \
             operating system's CAs (with '{}'), or use {mode_option} '{}' to encrypt without \
             checking",
            spell(mode_option, TlsMode::VerifyFull),
            spell(mode_option, TlsMode::Require),
        ));
    }
    let client_cert = client_cert(cert_given, key_given, cert_names[0], key_names[0])?;
    if client_cert.is_some() && !mode.tries_tls() {
        let c = client_cert
            .as_ref()
            .map(ClientCert::describe)
            .unwrap_or_default();
        return Err(format!(
            "a client certificate ({c}) is shown only over TLS, but {mode_option} '{}' does not \
             use it: set {mode_option} to '{}' or stronger",
            spell(mode_option, mode),
            spell(mode_option, TlsMode::Require),
        ));
    }
    Ok(TlsSettings {
        mode,
        root_cert,
        mode_option,
        mode_written: mode_given.map(|(_, v)| v),
        ca_option,
        ca_origin,
        client_cert,
    })
}

/// The client certificate the options name: both files or neither, read and checked to
/// make one identity (the key is the certificate's).
fn client_cert(
    cert: Option<(&'static str, String)>,
    key: Option<(&'static str, String)>,
    cert_name: &str,
    key_name: &str,
) -> Result<Option<ClientCert>, String> {
    let (cert_option, cert, key_option, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some((option, path)), None) => {
            return Err(format!(
                "{option} '{path}' is given without {key_name}: a client certificate needs its \
                 private key, set {key_name} to the key's PEM file"
            ))
        }
        (None, Some((option, path))) => {
            return Err(format!(
                "{option} '{path}' is given without {cert_name}: set {cert_name} to the PEM file \
                 of the client certificate this key belongs to"
            ))
        }
        (Some((co, c)), Some((ko, k))) => (co, c, ko, k),
    };
    let c = ClientCert {
        cert: PathBuf::from(cert),
        key: PathBuf::from(key),
        cert_option,
        key_option,
    };
    let (chain, private) = c.load()?;
    rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(RootCertStore::empty())
        .with_client_auth_cert(chain, private)
        .map_err(|e| {
            format!(
                "{} do not make a client certificate: {e} (is the key the certificate's?)",
                c.describe()
            )
        })?;
    Ok(Some(c))
}

/// A CA file must exist and hold at least one PEM certificate.
fn check_ca_file(option: &str, path: &Path) -> Result<(), String> {
    root_store(path)
        .map(drop)
        .map_err(|e| format!("{option}: {e}"))
}

/// The certificates of a PEM file as rustls's trust anchors; the error names the file.
fn root_store(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => format!("CA file '{shown}' does not exist"),
        _ => format!("cannot read the CA file '{shown}': {e}"),
    })?;
    if !meta.is_file() {
        return Err(format!("CA file '{shown}' is not a file"));
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the CA file '{shown}' as PEM: {e}"))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "CA file '{shown}' holds no usable certificate (expected PEM: -----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(roots)
}

/// The operating system's CA bundle (`SSL_CERT_FILE` first), for `sslrootcert=system`.
pub(crate) fn system_bundle() -> Option<PathBuf> {
    openssl_probe::probe().cert_file
}

fn ring() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's rustls provider, for drivers that build their configuration
/// with rustls's default (mysql_async): with both ring and aws-lc-rs compiled in, rustls has
/// no default and would panic. Harmless when one is installed already.
pub(crate) fn install_default_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The rustls client configuration for tokio-postgres: `None` when the mode never uses TLS.
pub(crate) fn client_config(s: &TlsSettings) -> Result<Option<rustls::ClientConfig>, String> {
    if !s.mode.tries_tls() {
        return Ok(None);
    }
    let provider = ring();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    let roots = || -> Result<Arc<RootCertStore>, String> {
        let path = s
            .root_cert
            .as_deref()
            .ok_or_else(|| format!("{}: no CA file", s.ca_option))?;
        root_store(path)
            .map(Arc::new)
            .map_err(|e| format!("{}: {e}", s.ca_option))
    };
    let wants_cert = match s.mode {
        TlsMode::VerifyFull => builder.with_root_certificates(roots()?),
        TlsMode::VerifyCa => {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots()?,
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("TLS set-up: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider))),
    };
    let config = match &s.client_cert {
        None => wants_cert.with_no_client_auth(),
        Some(c) => {
            let (chain, key) = c.load()?;
            wants_cert
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{}: {e}", c.describe()))?
        }
    };
    Ok(Some(config))
}

/// `prefer` and `require`: any certificate is taken (the connection is encrypted, but the
/// server is not authenticated, as in libpq); the handshake's signatures are still checked,
/// so the server holds the key of the certificate it shows.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked as for `verify-full`, a host name the certificate does
/// not list is forgiven. Both of rustls's variants of that error are: 0.23 reports the one
/// with context (`NotValidForNameContext`).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// TLS for tokio-postgres over rustls. Channel binding is not offered: SCRAM runs as with
/// libpq's default `channel_binding=prefer` against a server that does not bind.
#[derive(Clone, Debug)]
pub(crate) struct PgTls(pub Arc<rustls::ClientConfig>);

/// One connection attempt's TLS: the configuration and the host name to check.
pub(crate) struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    host: String,
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<PgTlsConnect> {
        // The name is checked in `connect`, which only runs when TLS is used: a unix-socket
        // connection passes "" here.
        Ok(PgTlsConnect {
            config: self.0.clone(),
            host: host.to_string(),
        })
    }
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host.clone()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("'{}' is not a host name TLS can check: {e}", self.host),
                )
            })?;
            tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await
                .map(PgTlsStream)
        })
    }
}

/// A tokio-postgres connection's stream under TLS.
pub(crate) struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA certificate (EC P-256), for the files the options name.
    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBlDCCATmgAwIBAgIUWRGo+9l34z0gCYAzJxwkVLmaDmUwCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTc3RyYXRhIHVuaXQgdGVzdCBDQTAgFw0yNjEyMDUwNTAxMzda
GA8yMTI2MTExMTA1MDEzN1owHjEcMBoGA1UEAwwTc3RyYXRhIHVuaXQgdGVzdCBD
QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABBEofe/6W6LPPnehL2tnTRr7A4ye
zzK7ECNPCa5zWJFBo2mia+M2JfuoX9QUtippgD76wosVQ8I67u59kWlJlJCjUzBR
MB0GA1UdDgQWBBQ6jRZmUhpzpyj0+q+J9uMEJ9uQETAfBgNVHSMEGDAWgBQ6jRZm
Uhpzpyj0+q+J9uMEJ9uQETAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kA
MEYCIQDa/uHqzV5deC/thtUiy05rK9nOMWpf+45K2aWdHF0PRwIhANgQd1/sExeH
t8RtmAMZFM1Z/oBLRmywCKKCum6DWlci
-----END CERTIFICATE-----
";

    /// A self-signed client certificate (EC P-256) made for these tests, its private key, and
    /// a key of another (unit-test material only: nothing trusts them).
    const CLIENT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBnDCCAUGgAwIBAgIUP+5IWYJxHdPqI8X8nj7tB1YyNHgwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXc3RyYXRhIHVuaXQgdGVzdCBjbGllbnQwIBcNMjYxMjA1MTMw
MzIzWhgPMjEyNjExMTExMzAzMjNaMCIxIDAeBgNVBAMMF3N0cmF0YSB1bml0IHRl
c3QgY2xpZW50MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE+Iy6OsyGRkQKCPK+
PLhWtObX2QZmReWC2Z/ac5hhtlUjxosiFWWseUvvl6YBgIFCzVvoj25DZ1RMhimx
JWKlTqNTMFEwHQYDVR0OBBYEFMqA4YcDLdxrz5veSilKXd01vw06MB8GA1UdIwQY
MBaAFMqA4YcDLdxrz5veSilKXd01vw06MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDSQAwRgIhAKi8RNCEwkSR15g+Li/ohDc6oCzYjV3xPkbUmENt4yu+AiEA
8bGvefbkk+fFZxJAaipu4BJynfpV1yBads3NmucTzCY=
-----END CERTIFICATE-----
";
    const CLIENT_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgR6jY+ZlNgLkqYiU/
ZBu7V56yqiS2uK1Ci5NgT5BQz5mhRANCAAT4jLo6zIZGRAoI8r48uFa05tfZBmZF
5YLZn9pzmGG2VSPGiyIVZax5S++XpgGAgULNW+iPbkNnVEyGKbElYqVO
-----END PRIVATE KEY-----
";
    const OTHER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg6MDHU97/2/3Qp44S
2sPFqK+PMPlHwjAduumILMUTmuShRANCAARZO7VpmBfgX0D2spiver6hguvX/C+N
WhoP4bzbJYynaTE06yzI5xmLW0pfeMpFiS4J9GIdj7lct8iQIUiGd1po
-----END PRIVATE KEY-----
";

    struct Dir {
        dir: tempfile::TempDir,
    }

    impl Dir {
        fn new() -> Dir {
            Dir {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        /// A file under the directory (its folders made), holding `text`.
        fn file(&self, rel: &str, text: &str) -> PathBuf {
            let p = self.dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }

        fn home(&self) -> Option<&Path> {
            Some(self.dir.path())
        }
    }

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Options, the mode they resolve to and the CA file it uses.
    type Case<'a> = (&'a [(&'a str, &'a str)], TlsMode, Option<&'a Path>);

    fn no_bundle() -> Option<PathBuf> {
        None
    }

    /// The mode and CA file the options resolve to, with `home` as the home directory.
    fn resolve(
        kind: SourceKind,
        pairs: &[(&str, &str)],
        home: Option<&Path>,
    ) -> Result<(TlsMode, Option<PathBuf>), String> {
        settings(kind, &opts(pairs), home, &no_bundle).map(|s| (s.mode, s.root_cert))
    }

    #[test]
    fn libpq_modes_and_their_defaults() {
        use SourceKind::Postgres as Pg;
        use TlsMode::*;
        let d = Dir::new();
        let ca = d.file("ca.pem", CA_PEM);
        let ca_s = ca.to_str().unwrap();
        let cases: [Case; 12] = [
            // No option: as before TLS existed, no TLS.
            (&[], Allow, None),
            (&[("sslmode", "disable")], Disable, None),
            (&[("sslmode", "allow")], Allow, None),
            (&[("sslmode", "prefer")], Prefer, None),
            (&[("sslmode", "require")], Require, None),
            (
                &[("sslmode", "Verify-Full"), ("sslrootcert", ca_s)],
                VerifyFull,
                Some(ca.as_path()),
            ),
            (
                &[("sslmode", "verify-ca"), ("sslrootcert", ca_s)],
                VerifyCa,
                Some(ca.as_path()),
            ),
            // require with a CA checks the chain, as libpq does.
            (
                &[("sslmode", "require"), ("sslrootcert", ca_s)],
                VerifyCa,
                Some(ca.as_path()),
            ),
            // prefer never checks; a mode without TLS never reads the CA.
            (
                &[("sslmode", "prefer"), ("sslrootcert", ca_s)],
                Prefer,
                None,
            ),
            (
                &[("sslmode", "disable"), ("sslrootcert", ca_s)],
                Disable,
                None,
            ),
            (&[("sslrootcert", ca_s)], Allow, None),
            (&[("sslmode", " require ")], Require, None),
        ];
        for (pairs, mode, root) in cases {
            assert_eq!(
                resolve(Pg, pairs, d.home()),
                Ok((mode, root.map(Path::to_path_buf))),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn mysql_modes_map_onto_the_same_and_take_the_libpq_spellings() {
        use SourceKind::Mysql as My;
        use TlsMode::*;
        let d = Dir::new();
        let ca = d.file("ca.pem", CA_PEM);
        let ca_s = ca.to_str().unwrap();
        // A home with libpq's default CA: MySQL does not look at it.
        d.file(".postgresql/root.crt", CA_PEM);
        let cases: [Case; 10] = [
            (&[], Disable, None),
            (&[("ssl_mode", "DISABLED")], Disable, None),
            (&[("ssl_mode", "preferred")], Prefer, None),
            (&[("ssl_mode", "REQUIRED")], Require, None),
            (
                &[("ssl_mode", "REQUIRED"), ("ssl_ca", ca_s)],
                VerifyCa,
                Some(ca.as_path()),
            ),
            (
                &[("ssl_mode", "VERIFY_CA"), ("ssl_ca", ca_s)],
                VerifyCa,
                Some(ca.as_path()),
            ),
            (
                &[("ssl_mode", "VERIFY_IDENTITY"), ("ssl_ca", ca_s)],
                VerifyFull,
                Some(ca.as_path()),
            ),
            (
                &[("sslmode", "verify-full"), ("sslrootcert", ca_s)],
                VerifyFull,
                Some(ca.as_path()),
            ),
            (
                &[("ssl_mode", "VERIFY_IDENTITY"), ("sslrootcert", ca_s)],
                VerifyFull,
                Some(ca.as_path()),
            ),
            (&[("sslmode", "allow")], Allow, None),
        ];
        for (pairs, mode, root) in cases {
            assert_eq!(
                resolve(My, pairs, d.home()),
                Ok((mode, root.map(Path::to_path_buf))),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn libpqs_default_ca_file_in_the_home_directory() {
        use SourceKind::Postgres as Pg;
        let d = Dir::new();
        let none = resolve(Pg, &[("sslmode", "verify-full")], d.home()).unwrap_err();
        assert!(
            none.contains("sslmode 'verify-full'")
                && none.contains("sslrootcert")
                && none.contains("~/.postgresql/root.crt"),
            "{none}"
        );
        let root = d.file(".postgresql/root.crt", CA_PEM);
        assert_eq!(
            resolve(Pg, &[("sslmode", "verify-full")], d.home()),
            Ok((TlsMode::VerifyFull, Some(root.clone())))
        );
        // ... and require then checks the chain.
        assert_eq!(
            resolve(Pg, &[("sslmode", "require")], d.home()),
            Ok((TlsMode::VerifyCa, Some(root.clone())))
        );
        // An explicit file wins over it.
        let other = d.file("other.pem", CA_PEM);
        assert_eq!(
            resolve(
                Pg,
                &[
                    ("sslmode", "verify-ca"),
                    ("sslrootcert", other.to_str().unwrap())
                ],
                d.home()
            ),
            Ok((TlsMode::VerifyCa, Some(other)))
        );
        // No home directory: nothing to fall back on.
        assert!(resolve(Pg, &[("sslmode", "verify-ca")], None).is_err());
        assert_eq!(
            resolve(Pg, &[("sslmode", "require")], None),
            Ok((TlsMode::Require, None))
        );
    }

    #[test]
    fn system_means_the_os_bundle_and_verify_full() {
        let d = Dir::new();
        let bundle = d.file("bundle.pem", CA_PEM);
        let found = || Some(bundle.clone());
        let s = |pairs: &[(&str, &str)], b: &dyn Fn() -> Option<PathBuf>| {
            settings(SourceKind::Postgres, &opts(pairs), None, b)
        };
        let ok = s(&[("sslrootcert", "system")], &found).unwrap();
        assert_eq!(
            (ok.mode, ok.root_cert.clone()),
            (TlsMode::VerifyFull, Some(bundle.clone()))
        );
        assert_eq!(
            ok.to_string(),
            format!(
                "sslmode not set, so 'verify-full', sslrootcert 'system' ({})",
                bundle.display()
            )
        );
        let ok = s(
            &[("sslmode", "verify-full"), ("sslrootcert", "system")],
            &found,
        )
        .unwrap();
        assert_eq!(ok.mode, TlsMode::VerifyFull);
        for weak in ["require", "verify-ca", "prefer", "disable"] {
            let e = s(&[("sslmode", weak), ("sslrootcert", "system")], &found).unwrap_err();
            assert!(
                e.contains("sslrootcert 'system'") && e.contains("'verify-full'"),
                "{weak}: {e}"
            );
        }
        let e = s(&[("sslrootcert", "system")], &no_bundle).unwrap_err();
        assert!(e.contains("SSL_CERT_FILE"), "{e}");
        let e = settings(
            SourceKind::Mysql,
            &opts(&[("ssl_mode", "VERIFY_CA"), ("ssl_ca", "system")]),
            None,
            &found,
        )
        .unwrap_err();
        assert!(
            e.contains("ssl_ca 'system'") && e.contains("ssl_mode 'VERIFY_IDENTITY'"),
            "{e}"
        );
    }

    #[test]
    fn bad_options_name_the_option_and_the_file() {
        use SourceKind::{Mysql as My, Postgres as Pg};
        let d = Dir::new();
        let e = resolve(Pg, &[("sslmode", "bogus")], None).unwrap_err();
        assert!(
            e.contains("sslmode = 'bogus'") && e.contains("verify-full"),
            "{e}"
        );
        // MySQL's names are MySQL's option's, libpq's are libpq's.
        let e = resolve(My, &[("ssl_mode", "require")], None).unwrap_err();
        assert!(e.contains("VERIFY_IDENTITY"), "{e}");
        let e = resolve(Pg, &[("sslmode", "REQUIRED")], None).unwrap_err();
        assert!(e.contains("sslmode = 'REQUIRED'"), "{e}");
        let e = resolve(
            Pg,
            &[
                ("sslmode", "verify-full"),
                ("sslrootcert", "/nonexistent/ca.pem"),
            ],
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("sslrootcert") && e.contains("'/nonexistent/ca.pem' does not exist"),
            "{e}"
        );
        let junk = d.file("junk.pem", "not a certificate\n");
        let e = resolve(
            My,
            &[("ssl_mode", "REQUIRED"), ("ssl_ca", junk.to_str().unwrap())],
            None,
        )
        .unwrap_err();
        assert!(
            e.starts_with("ssl_ca: ") && e.contains("no usable certificate"),
            "{e}"
        );
        let e = resolve(My, &[("ssl_mode", "VERIFY_CA")], None).unwrap_err();
        assert!(
            e.contains("ssl_mode 'VERIFY_CA'") && e.contains("set ssl_ca"),
            "{e}"
        );
        assert!(!e.contains("root.crt"), "{e}");
        let e = resolve(
            My,
            &[("ssl_mode", "REQUIRED"), ("sslmode", "require")],
            None,
        )
        .unwrap_err();
        assert!(e.contains("ssl_mode and sslmode"), "{e}");
        // A missing CA file does not matter when TLS is off.
        assert_eq!(
            resolve(
                Pg,
                &[
                    ("sslmode", "disable"),
                    ("sslrootcert", "/nonexistent/ca.pem")
                ],
                None
            ),
            Ok((TlsMode::Disable, None))
        );
    }

    #[test]
    fn the_description_reads_as_the_options_were_written() {
        let d = Dir::new();
        let ca = d.file("ca.pem", CA_PEM);
        let ca_s = ca.to_str().unwrap();
        let text = |kind, pairs: &[(&str, &str)]| {
            settings(kind, &opts(pairs), None, &no_bundle)
                .unwrap()
                .to_string()
        };
        assert_eq!(
            text(
                SourceKind::Postgres,
                &[("sslmode", "verify-full"), ("sslrootcert", ca_s)]
            ),
            format!("sslmode 'verify-full', sslrootcert '{ca_s}'")
        );
        assert_eq!(
            text(
                SourceKind::Mysql,
                &[("ssl_mode", "REQUIRED"), ("ssl_ca", ca_s)]
            ),
            format!(
                "ssl_mode 'REQUIRED', ssl_ca '{ca_s}', so the certificate chain is checked \
                 ('REQUIRED' with a CA, as libpq does)"
            )
        );
        assert_eq!(
            text(SourceKind::Postgres, &[]),
            "sslmode not set, so 'allow'"
        );
    }

    #[test]
    fn client_certificates_take_both_files_and_name_what_is_wrong() {
        use SourceKind::{Mysql as My, Postgres as Pg};
        let d = Dir::new();
        let cert = d.file("client.crt", CLIENT_PEM);
        let key = d.file("client.key", CLIENT_KEY);
        let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
        let got = |kind, pairs: &[(&str, &str)]| settings(kind, &opts(pairs), None, &no_bundle);
        let ok = got(Pg, &[("sslmode", "require"), ("sslcert", c), ("sslkey", k)]).unwrap();
        assert_eq!(
            ok.client_cert
                .as_ref()
                .map(|x| (x.cert.clone(), x.key.clone())),
            Some((cert.clone(), key.clone()))
        );
        assert_eq!(
            ok.to_string(),
            format!("sslmode 'require', sslcert '{c}', sslkey '{k}'")
        );
        assert!(client_config(&ok).unwrap().is_some());
        // MySQL takes its own names and libpq's.
        let my = got(
            My,
            &[("ssl_mode", "REQUIRED"), ("ssl_cert", c), ("ssl_key", k)],
        )
        .unwrap();
        assert!(my
            .to_string()
            .ends_with(&format!("ssl_cert '{c}', ssl_key '{k}'")));
        assert!(got(
            My,
            &[("ssl_mode", "REQUIRED"), ("sslcert", c), ("sslkey", k)]
        )
        .is_ok());

        let e = got(Pg, &[("sslmode", "require"), ("sslcert", c)]).unwrap_err();
        assert!(
            e.contains(&format!("sslcert '{c}' is given without sslkey")),
            "{e}"
        );
        let e = got(My, &[("ssl_mode", "REQUIRED"), ("ssl_key", k)]).unwrap_err();
        assert!(e.contains("is given without ssl_cert"), "{e}");
        let e = got(Pg, &[("sslcert", c), ("sslkey", k)]).unwrap_err();
        assert!(
            e.contains("shown only over TLS") && e.contains("sslmode 'allow'"),
            "{e}"
        );
        let e = got(
            Pg,
            &[
                ("sslmode", "require"),
                ("sslcert", c),
                ("sslkey", "/nonexistent/client.key"),
            ],
        )
        .unwrap_err();
        assert_eq!(
            e,
            "sslkey: private key file '/nonexistent/client.key' does not exist"
        );
        // A directory cannot be read as a file (unreadable files, as root reads anything).
        let dir = d.dir.path().to_str().unwrap();
        let e = got(
            Pg,
            &[("sslmode", "require"), ("sslcert", c), ("sslkey", dir)],
        )
        .unwrap_err();
        assert!(
            e.starts_with(&format!("sslkey: cannot read the private key file '{dir}'")),
            "{e}"
        );
        let junk = d.file("junk.key", "not a key\n");
        let j = junk.to_str().unwrap();
        let e = got(Pg, &[("sslmode", "require"), ("sslcert", c), ("sslkey", j)]).unwrap_err();
        assert!(e.contains("holds no private key"), "{e}");
        let e = got(Pg, &[("sslmode", "require"), ("sslcert", j), ("sslkey", k)]).unwrap_err();
        assert!(
            e.starts_with("sslcert: client certificate file") && e.contains("holds no certificate"),
            "{e}"
        );
        let other = d.file("other.key", OTHER_KEY);
        let o = other.to_str().unwrap();
        let e = got(Pg, &[("sslmode", "require"), ("sslcert", c), ("sslkey", o)]).unwrap_err();
        assert!(
            e.contains(&format!(
                "sslcert '{c}', sslkey '{o}' do not make a client certificate"
            )),
            "{e}"
        );
    }

    #[test]
    fn client_configs_build_for_every_tls_mode() {
        let d = Dir::new();
        let ca = d.file("ca.pem", CA_PEM);
        let ca_s = ca.to_str().unwrap();
        for (mode, tls) in [
            ("disable", false),
            ("allow", false),
            ("prefer", true),
            ("require", true),
            ("verify-ca", true),
            ("verify-full", true),
        ] {
            let s = settings(
                SourceKind::Postgres,
                &opts(&[("sslmode", mode), ("sslrootcert", ca_s)]),
                None,
                &no_bundle,
            )
            .unwrap();
            assert_eq!(client_config(&s).unwrap().is_some(), tls, "{mode}");
        }
    }
}
