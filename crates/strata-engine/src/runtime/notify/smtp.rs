//! Sending one e-mail over SMTP: EHLO, STARTTLS (or TLS from the start), AUTH PLAIN, MAIL
//! FROM, RCPT TO, DATA, QUIT, on tokio and the tree's rustls. lettre formats the message;
//! its own transport is not used (see the workspace manifest for why).
//!
//! No error names what was sent for AUTH, and the server's replies are scrubbed of the
//! password before they reach a message.

use crate::load::settings::{Smtp, SmtpTls};
use std::sync::Arc;
use std::time::Duration;
use strata_sources::Secret;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest wait for the server: to connect, and for each reply.
const TIMEOUT: Duration = Duration::from_secs(20);

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// An e-mail ready to send: the envelope's addresses and the formatted message.
pub(crate) struct Envelope {
    pub(crate) from: String,
    pub(crate) to: Vec<String>,
    pub(crate) message: Vec<u8>,
}

/// Sends `mail` through `smtp`, logging in as its user with `password`. The error says
/// which step failed and the server's answer.
pub(crate) async fn send(
    smtp: &Smtp,
    password: Option<&Secret>,
    mail: &Envelope,
) -> Result<(), String> {
    let at = format!("{}:{}", smtp.host, smtp.port());
    let scrub = |t: String| password.map_or_else(|| t.clone(), |p| p.scrub(&t));
    let tcp = tokio::time::timeout(
        TIMEOUT,
        tokio::net::TcpStream::connect((smtp.host.as_str(), smtp.port())),
    )
    .await
    .map_err(|_| {
        format!(
            "cannot connect to {at}: no answer within {} s",
            TIMEOUT.as_secs()
        )
    })?
    .map_err(|e| format!("cannot connect to {at}: {e}"))?;
    let stream: Box<dyn Stream> = match smtp.tls {
        SmtpTls::Tls => Box::new(tls(&smtp.host, tcp).await?),
        SmtpTls::Starttls | SmtpTls::None => Box::new(tcp),
    };
    let mut c = Conversation {
        io: BufReader::new(stream),
    };
    c.expect("the greeting", 220).await?;
    let mut features = c.ehlo().await?;
    if smtp.tls == SmtpTls::Starttls {
        if !features.iter().any(|f| f.eq_ignore_ascii_case("STARTTLS")) {
            let _ = c.command("QUIT", "QUIT", 221).await;
            return Err(format!(
                "{at} does not offer STARTTLS, so nothing was sent; set tls: none (or \
                 strata.smtp.tls=none) for a relay that needs no encryption"
            ));
        }
        c.command("STARTTLS", "STARTTLS", 220).await?;
        let plain = c.io.into_inner();
        c = Conversation {
            io: BufReader::new(Box::new(tls(&smtp.host, plain).await?)),
        };
        features = c.ehlo().await?;
    }
    if let (Some(user), Some(password)) = (&smtp.user, password) {
        let offers_plain = features.iter().any(|f| {
            let mut words = f.split_whitespace();
            words.next().is_some_and(|w| w.eq_ignore_ascii_case("AUTH"))
                && words.any(|m| m.eq_ignore_ascii_case("PLAIN"))
        });
        if !offers_plain {
            return Err(format!(
                "{at} does not offer AUTH PLAIN, which strata logs in with"
            ));
        }
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("\0{user}\0{}", password.expose()));
        c.command(&format!("AUTH PLAIN {token}"), "AUTH PLAIN", 235)
            .await
            .map_err(scrub)?;
    }
    c.command(&format!("MAIL FROM:<{}>", mail.from), "MAIL FROM", 250)
        .await?;
    for to in &mail.to {
        c.command(&format!("RCPT TO:<{to}>"), "RCPT TO", 250)
            .await?;
    }
    c.command("DATA", "DATA", 354).await?;
    c.data(&mail.message).await?;
    let _ = c.command("QUIT", "QUIT", 221).await;
    Ok(())
}

/// `stream` wrapped in TLS to `host`, checked against the system's root certificates.
async fn tls<S: Stream>(
    host: &str,
    stream: S,
) -> Result<tokio_rustls::client::TlsStream<S>, String> {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("TLS: {host}: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS with {host}: {e}"))
}

struct Conversation {
    io: BufReader<Box<dyn Stream>>,
}

impl Conversation {
    /// Reads one reply (all its lines): its code and its text lines.
    async fn reply(&mut self) -> Result<(u16, Vec<String>), String> {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(TIMEOUT, self.io.read_line(&mut line))
                .await
                .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
                .map_err(|e| format!("reading the server's answer: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
            let line = line.trim_end();
            let code = line
                .get(..3)
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| format!("not an SMTP answer: `{line}`"))?;
            let last = line.as_bytes().get(3) != Some(&b'-');
            lines.push(line.get(4..).unwrap_or("").to_string());
            if last {
                return Ok((code, lines));
            }
        }
    }

    async fn expect(&mut self, what: &str, code: u16) -> Result<Vec<String>, String> {
        let (got, lines) = self.reply().await.map_err(|e| format!("{what}: {e}"))?;
        if got != code && !(code == 250 && got == 251) {
            return Err(format!(
                "{what}: the server answered {got} {}",
                lines.join(" ")
            ));
        }
        Ok(lines)
    }

    /// Sends `line`, named `what` in errors (never the line itself: it may hold a
    /// credential), and expects `code`.
    async fn command(&mut self, line: &str, what: &str, code: u16) -> Result<Vec<String>, String> {
        let io = self.io.get_mut();
        io.write_all(format!("{line}\r\n").as_bytes())
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        io.flush().await.map_err(|e| format!("{what}: {e}"))?;
        self.expect(what, code).await
    }

    /// EHLO; the extensions the server offers (`STARTTLS`, `AUTH PLAIN LOGIN`, ...).
    async fn ehlo(&mut self) -> Result<Vec<String>, String> {
        let lines = self.command("EHLO localhost", "EHLO", 250).await?;
        Ok(lines.into_iter().skip(1).collect())
    }

    /// The message after DATA: lines starting with `.` get another one, then `.` alone.
    async fn data(&mut self, message: &[u8]) -> Result<(), String> {
        let mut out = Vec::with_capacity(message.len() + 16);
        let mut at_line_start = true;
        for &b in message {
            if at_line_start && b == b'.' {
                out.push(b'.');
            }
            out.push(b);
            at_line_start = b == b'\n';
        }
        if !out.ends_with(b"\r\n") {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b".\r\n");
        let io = self.io.get_mut();
        io.write_all(&out)
            .await
            .map_err(|e| format!("sending the message: {e}"))?;
        io.flush()
            .await
            .map_err(|e| format!("sending the message: {e}"))?;
        self.expect("the message", 250).await.map(|_| ())
    }
}
