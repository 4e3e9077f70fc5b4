//! SCRAM-SHA-256 on the server's side (RFC 5802 with RFC 7677's hash), as PostgreSQL speaks
//! it: pure functions over the exchange's messages, the I/O being pgwire's.
//!
//! The server keeps a [`Verifier`] of the password (its salt, iteration count, stored key
//! and server key), never the password; the client proves it knows the password without
//! sending it, and the server's final message proves the server knew the verifier. Channel
//! binding (`SCRAM-SHA-256-PLUS`) is not offered: a client that asks for it is refused, one
//! that could use it is told by the mechanism list that it cannot. As PostgreSQL does, the
//! user name inside the exchange is ignored (libpq sends an empty one): the user is the
//! startup message's.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use std::num::NonZeroU32;

/// The SASL mechanism's name.
pub(crate) const MECHANISM: &str = "SCRAM-SHA-256";

/// PBKDF2 rounds of a verifier, PostgreSQL's default (`scram_iterations`).
pub(crate) const ITERATIONS: u32 = 4096;

/// What a password is checked against: `StoredKey := H(HMAC(SaltedPassword, "Client
/// Key"))` and `ServerKey := HMAC(SaltedPassword, "Server Key")`, with
/// `SaltedPassword := PBKDF2-HMAC-SHA-256(SASLprep(password), salt, iterations)`.
pub(crate) struct Verifier {
    salt: Vec<u8>,
    iterations: NonZeroU32,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// The verifier of `password` with `salt` and `iterations` rounds (at least one).
    pub(crate) fn new(password: &str, salt: Vec<u8>, iterations: u32) -> Verifier {
        let iterations = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
        // SASLprep, as libpq applies it; a password it rejects is used as it is (as
        // PostgreSQL does).
        let prepared = stringprep::saslprep(password)
            .map(|p| p.into_owned())
            .unwrap_or_else(|_| password.to_string());
        let mut salted = [0u8; digest::SHA256_OUTPUT_LEN];
        pbkdf2::derive(
            pbkdf2::PBKDF2_HMAC_SHA256,
            iterations,
            &salt,
            prepared.as_bytes(),
            &mut salted,
        );
        let client_key = hmac_sha256(&salted, b"Client Key");
        Verifier {
            salt,
            iterations,
            stored_key: digest::digest(&digest::SHA256, &client_key)
                .as_ref()
                .to_vec(),
            server_key: hmac_sha256(&salted, b"Server Key"),
        }
    }
}

/// Why an exchange failed: a message that does not follow the protocol, or a proof that
/// does not match the verifier (a wrong password).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScramError {
    Malformed(String),
    WrongPassword,
}

/// The exchange after the server's first message, waiting for the client's final one.
#[derive(Debug)]
pub(crate) struct Exchange {
    client_first_bare: String,
    server_first: String,
    /// The client's nonce followed by the server's.
    nonce: String,
    /// The client's GS2 header, which its final message repeats (`c=`).
    gs2_header: String,
}

/// The server's first message for the client's first (`client_first`), with the server's
/// part of the nonce `server_nonce` (printable, no comma), and the exchange to finish.
pub(crate) fn server_first(
    verifier: &Verifier,
    client_first: &[u8],
    server_nonce: &str,
) -> Result<(String, Exchange), ScramError> {
    let message = std::str::from_utf8(client_first)
        .map_err(|_| malformed("the client's first message is not UTF-8"))?;
    let (gs2_header, bare) = split_gs2_header(message)?;
    let client_nonce = bare
        .split(',')
        .find_map(|attr| attr.strip_prefix("r="))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| malformed("the client's first message has no nonce (r=)"))?;
    if bare.split(',').any(|attr| attr.starts_with("m=")) {
        return Err(malformed("mandatory SCRAM extensions are not supported"));
    }
    let nonce = format!("{client_nonce}{server_nonce}");
    let server_first = format!(
        "r={nonce},s={},i={}",
        BASE64.encode(&verifier.salt),
        verifier.iterations
    );
    let exchange = Exchange {
        client_first_bare: bare.to_string(),
        server_first: server_first.clone(),
        nonce,
        gs2_header: gs2_header.to_string(),
    };
    Ok((server_first, exchange))
}

impl Exchange {
    /// The server's final message (`v=ServerSignature`) when the client's final message
    /// proves it knows the password.
    pub(crate) fn server_final(
        &self,
        verifier: &Verifier,
        client_final: &[u8],
    ) -> Result<String, ScramError> {
        let message = std::str::from_utf8(client_final)
            .map_err(|_| malformed("the client's final message is not UTF-8"))?;
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("the client's final message has no proof (p=)"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs.next().and_then(|a| a.strip_prefix("c="));
        if binding != Some(BASE64.encode(&self.gs2_header).as_str()) {
            return Err(malformed(
                "the client's final message does not repeat its channel binding header (c=)",
            ));
        }
        if attrs.next().and_then(|a| a.strip_prefix("r=")) != Some(self.nonce.as_str()) {
            return Err(malformed(
                "the client's final message does not carry the exchange's nonce (r=)",
            ));
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| malformed("the client's proof is not base64"))?;
        if proof.len() != digest::SHA256_OUTPUT_LEN {
            return Err(malformed("the client's proof is not 32 bytes"));
        }
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let client_signature = hmac_sha256(&verifier.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let stored_key = digest::digest(&digest::SHA256, &client_key);
        if !same_bytes(stored_key.as_ref(), &verifier.stored_key) {
            return Err(ScramError::WrongPassword);
        }
        let server_signature = hmac_sha256(&verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", BASE64.encode(server_signature)))
    }
}

/// The client's first message split into its GS2 header (`n,,` or `y,,`, with the commas)
/// and the bare message; channel binding (`p=`) and an authorization identity are refused.
fn split_gs2_header(message: &str) -> Result<(&str, &str), ScramError> {
    let flag = message.split(',').next().unwrap_or("");
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => {
            return Err(malformed(
                "channel binding was asked for, and the server offers SCRAM-SHA-256 without it",
            ))
        }
        _ => {
            return Err(malformed(
                "the client's first message does not start with a GS2 header (n,,)",
            ))
        }
    }
    let rest = &message[flag.len()..];
    let rest = rest
        .strip_prefix(',')
        .ok_or_else(|| malformed("the client's first message has no GS2 header"))?;
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("the client's first message has no GS2 header"))?;
    if !authzid.is_empty() {
        return Err(malformed("an authorization identity (a=) is not supported"));
    }
    let header_len = flag.len() + 1 + authzid.len() + 1;
    Ok((&message[..header_len], bare))
}

fn malformed(what: &str) -> ScramError {
    ScramError::Malformed(what.to_string())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

/// `a == b` in a time that does not depend on where they differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example exchange (user `user`, password `pencil`), byte for byte.
    #[test]
    fn rfc_7677_example() {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let verifier = Verifier::new("pencil", salt, 4096);
        let (first, exchange) = server_first(
            &verifier,
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        )
        .unwrap();
        assert_eq!(
            first,
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,\
             i=4096"
        );
        let last = exchange
            .server_final(
                &verifier,
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(last, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    /// A real client's exchange (postgres-protocol's, which tokio-postgres uses) passes
    /// with the right password and fails with a wrong one.
    #[test]
    fn postgres_protocols_client_logs_in_with_the_password_only() {
        use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
        let verifier = Verifier::new("s3cret", b"0123456789abcdef".to_vec(), ITERATIONS);
        for (password, accepted) in [("s3cret", true), ("wrong", false)] {
            let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
            let (first, exchange) =
                server_first(&verifier, client.message(), "c2VydmVyLW5vbmNl").unwrap();
            client.update(first.as_bytes()).unwrap();
            match exchange.server_final(&verifier, client.message()) {
                Ok(last) => {
                    assert!(accepted, "{password} accepted");
                    client
                        .finish(last.as_bytes())
                        .expect("the server's signature");
                }
                Err(e) => {
                    assert!(!accepted, "{password}: {e:?}");
                    assert_eq!(e, ScramError::WrongPassword);
                }
            }
        }
    }

    #[test]
    fn messages_off_the_protocol_are_refused() {
        let verifier = Verifier::new("pw", b"salt".to_vec(), 1);
        let refused = |first: &[u8]| match server_first(&verifier, first, "s") {
            Err(ScramError::Malformed(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(refused(b"p=tls-server-end-point,,n=,r=abc").contains("channel binding"));
        assert!(refused(b"n,a=admin,n=,r=abc").contains("authorization identity"));
        assert!(refused(b"n,,n=,s=abc").contains("no nonce"));
        assert!(refused(b"x,,n=,r=abc").contains("GS2 header"));
        assert!(refused(b"n,,m=ext,n=,r=abc").contains("mandatory"));

        let (_, exchange) = server_first(&verifier, b"y,,n=,r=abc", "def").unwrap();
        let final_refused = |last: &[u8]| match exchange.server_final(&verifier, last) {
            Err(ScramError::Malformed(why)) => why,
            other => panic!("{other:?}"),
        };
        // The header repeated must be the client's own (`y,,` here, not `n,,`).
        assert!(final_refused(b"c=biws,r=abcdef,p=AAAA").contains("c="));
        assert!(final_refused(b"c=eSws,r=abcXYZ,p=AAAA").contains("nonce"));
        assert!(final_refused(b"c=eSws,r=abcdef").contains("no proof"));
        assert!(final_refused(b"c=eSws,r=abcdef,p=AAAA").contains("32 bytes"));
        let zero = BASE64.encode([0u8; 32]);
        assert_eq!(
            exchange.server_final(&verifier, format!("c=eSws,r=abcdef,p={zero}").as_bytes()),
            Err(ScramError::WrongPassword)
        );
    }

    #[test]
    fn the_verifier_is_not_shown() {
        let shown = format!("{:?}", Verifier::new("s3cret", b"salt".to_vec(), 4096));
        assert_eq!(shown, "Verifier { iterations: 4096, .. }");
    }
}
