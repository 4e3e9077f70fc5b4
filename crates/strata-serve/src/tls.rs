//! TLS for every listener: a certificate chain and its private key, read from PEM files
//! (`--tls-cert`, `--tls-key`) and checked once before listening, so that a wrong path or
//! a key that does not go with the certificate stops the server with the file's name
//! rather than failing each client's handshake.
//!
//! The PostgreSQL listener and the web page get rustls server configurations of their own
//! (ring, TLS 1.2 and 1.3, the ALPN names `postgresql`, which libpq 17 offers, and
//! `http/1.1`); the Flight SQL listener hands the same PEM text to tonic.

use crate::error::{Result, ServeError};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The ALPN protocol name PostgreSQL clients offer (libpq 17 and later).
const POSTGRESQL_ALPN: &[u8] = b"postgresql";

/// The ALPN protocol name of the web page's HTTP/1.1.
const HTTP_ALPN: &[u8] = b"http/1.1";

/// A certificate chain and its key, read and checked. Its `Debug` shows neither.
#[derive(Clone)]
pub struct Tls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    pg: Arc<rustls::ServerConfig>,
    http: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the certificate chain at `cert` and the private key at `key` (PEM) and checks
    /// that they go together. Each error names the file at fault.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                ServeError::Tls(format!(
                    "cannot read the TLS {what} {}: {e}",
                    path.display()
                ))
            })
        };
        let cert_pem = read(cert, "certificate")?;
        let key_pem = read(key, "key")?;
        Tls::from_pem(
            cert_pem,
            key_pem,
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }

    /// [`Tls::load`] on the files' text, `cert_name` and `key_name` naming them in errors.
    pub(crate) fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        cert_name: &str,
        key_name: &str,
    ) -> Result<Tls> {
        let chain = certificates(&cert_pem, cert_name)?;
        let key = private_key(&key_pem, key_name)?;
        let mut pg = server_config(chain.clone(), key.clone_key(), cert_name, key_name)?;
        pg.alpn_protocols = vec![POSTGRESQL_ALPN.to_vec()];
        let mut http = server_config(chain, key, cert_name, key_name)?;
        http.alpn_protocols = vec![HTTP_ALPN.to_vec()];
        Ok(Tls {
            cert_pem,
            key_pem,
            pg: Arc::new(pg),
            http: Arc::new(http),
        })
    }

    /// The PostgreSQL listener's TLS acceptor.
    pub(crate) fn pg_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.pg.clone())
    }

    /// The web page's TLS acceptor (HTTP/1.1).
    pub(crate) fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.http.clone())
    }

    /// The Flight SQL listener's TLS configuration.
    pub(crate) fn flight_config(&self) -> tonic::transport::ServerTlsConfig {
        // tonic builds its rustls configuration with the process's default crypto
        // provider; the tree enables two (ring, and aws-lc-rs through deltalake's
        // reqwest), so none is chosen by itself. strata's TLS is ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        tonic::transport::ServerTlsConfig::new().identity(identity)
    }
}

/// The certificates of a PEM text, the server's first; at least one.
fn certificates(pem: &[u8], name: &str) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            ServeError::Tls(format!("the TLS certificate {name} is not valid PEM: {e}"))
        })?;
    if chain.is_empty() {
        return Err(ServeError::Tls(format!(
            "the TLS certificate {name} holds no certificate (expected PEM, \
             -----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(chain)
}

/// The private key of a PEM text (PKCS#8, PKCS#1 or SEC1).
fn private_key(pem: &[u8], name: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        ServeError::Tls(format!(
            "the TLS key {name} holds no usable private key (expected PEM, \
             -----BEGIN PRIVATE KEY-----): {e}"
        ))
    })
}

/// A rustls server configuration on ring with `chain` and `key`; an error when ring cannot
/// sign with the key or the key is not the certificate's.
fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_name: &str,
    key_name: &str,
) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| {
            ServeError::Tls(format!(
                "the TLS key {key_name} cannot be used (RSA, ECDSA P-256/P-384 or Ed25519 keys \
             are): {e}"
            ))
        })?;
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            ServeError::Tls(format!(
                "the TLS key {key_name} does not go with the certificate {cert_name}: {e}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_A_KEY: &str = "-----BEGIN PRIVATE KEY-----\nAAECAw==\n-----END PRIVATE KEY-----\n";
    const SOME_CERT: &str = "-----BEGIN CERTIFICATE-----\nAAECAw==\n-----END CERTIFICATE-----\n";

    fn error(cert: &str, key: &str) -> String {
        Tls::from_pem(cert.into(), key.into(), "dir/cert.pem", "dir/key.pem")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, SOME_CERT).unwrap();
        let e = Tls::load(&dir.path().join("missing.pem"), &cert).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "cannot read the TLS certificate {}",
                dir.path().join("missing.pem").display()
            )),
            "{e}"
        );
        let e = Tls::load(&cert, &dir.path().join("missing.key")).unwrap_err();
        assert!(e.to_string().contains("cannot read the TLS key"), "{e}");
        assert!(e.to_string().contains("missing.key"), "{e}");
    }

    #[test]
    fn a_file_without_a_certificate_or_key_is_named() {
        let e = error("just text\n", NOT_A_KEY);
        assert!(
            e.contains("the TLS certificate dir/cert.pem holds no certificate"),
            "{e}"
        );
        let e = error(SOME_CERT, "just text\n");
        assert!(
            e.contains("the TLS key dir/key.pem holds no usable private key"),
            "{e}"
        );
        // A key ring cannot read (the bytes are no key).
        let e = error(SOME_CERT, NOT_A_KEY);
        assert!(e.contains("the TLS key dir/key.pem cannot be used"), "{e}");
    }
}
