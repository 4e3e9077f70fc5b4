//! TLS to the real PostgreSQL and MariaDB (run under scripts/services/with-services.sh). Both
//! servers have TLS on, with a certificate for `localhost` signed by a test CA, and a user
//! they accept only over TLS: every read here that succeeds went over TLS. Each mode of the
//! `sslmode` / `ssl_mode` table is tried, and the refusals say where and why.

mod common;

use arrow_array::RecordBatch;
use common::*;
use strata_sources::*;

/// The `id`s of `table` read through `spec` (a watermark read on `id`), or the error.
async fn read_ids(spec: &ConnectionSpec, table: &str) -> Result<Vec<String>> {
    let src = Source::connect(spec).await?;
    let read = WatermarkRead::new(SourceObject::table(table)?, vec!["id".into()]);
    let mut reader = src.read_watermark(&read).await?;
    let mut batches = vec![];
    while let Some(b) = reader.next_batch().await? {
        batches.push(b);
    }
    Ok(ids(&batches))
}

fn ids(batches: &[RecordBatch]) -> Vec<String> {
    rows(batches, &["id"])
        .into_iter()
        .map(|r| r[0].clone())
        .collect()
}

fn ids_of(v: &[i32]) -> Vec<String> {
    v.iter().map(i32::to_string).collect()
}

/// A refused connection's error: a [`SourceError::Tls`] when `tls`, else any; its text
/// never holds the password.
fn refused(r: Result<Vec<String>>, tls: bool, password: &str) -> String {
    let e = r.expect_err("the connection should be refused");
    let text = e.to_string();
    assert!(
        !tls || matches!(e, SourceError::Tls { .. }),
        "not a TLS error: {text}"
    );
    assert!(!text.contains(password), "the password is in: {text}");
    text
}

#[tokio::test]
async fn pg_sslmodes_and_certificate_checks() {
    let Some(_) = pg_spec("pg_tls") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("tls_rows");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY); INSERT INTO {t} VALUES (1), (2), (3);"
        ))
        .await
        .unwrap();
    let table = format!("public.{t}");
    let ca = service_var("STRATA_TEST_PG_SSLROOTCERT");
    let other_ca = service_var("STRATA_TEST_PG_OTHER_CA");
    let password = service_var("STRATA_TEST_PG_PASSWORD");
    let spec = |host: &str, options: &[(&str, &str)]| {
        pg_tls_spec("pg_tls", host, options).expect("PostgreSQL facts")
    };
    let want = ids_of(&[1, 2, 3]);

    // Without TLS the user is turned away (so the reads below went over TLS), and the message
    // says how to connect.
    for options in [&[][..], &[("sslmode", "disable")], &[("sslmode", "allow")]] {
        let e = refused(
            read_ids(&spec("localhost", options), &table).await,
            false,
            &password,
        );
        assert!(
            e.contains("connection 'pg_tls'")
                && e.contains("no encryption")
                && e.contains("only over TLS: set sslmode to 'require'"),
            "{options:?}: {e}"
        );
    }
    // Encrypted, nothing checked.
    for mode in ["prefer", "require"] {
        let got = read_ids(&spec("127.0.0.1", &[("sslmode", mode)]), &table).await;
        assert_eq!(got.expect(mode), want, "{mode}");
    }
    // The chain and the name checked: the certificate names localhost.
    let full = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    assert_eq!(
        read_ids(&spec("localhost", &full), &table).await.unwrap(),
        want
    );
    // verify-ca checks the chain only: 127.0.0.1 is fine.
    let ca_only = [("sslmode", "verify-ca"), ("sslrootcert", ca.as_str())];
    assert_eq!(
        read_ids(&spec("127.0.0.1", &ca_only), &table)
            .await
            .unwrap(),
        want
    );

    // verify-full by a name the certificate does not list.
    let e = refused(
        read_ids(&spec("127.0.0.1", &full), &table).await,
        true,
        &password,
    );
    assert!(
        e.contains("connection 'pg_tls': TLS with PostgreSQL at 127.0.0.1:")
            && e.contains(&format!("(sslmode 'verify-full', sslrootcert '{ca}')"))
            && e.contains("not valid for name")
            && e.contains("does not name the host '127.0.0.1'")
            && e.contains("or use sslmode 'verify-ca'"),
        "{e}"
    );
    // verify-full against a CA that did not sign the certificate.
    let wrong = [
        ("sslmode", "verify-full"),
        ("sslrootcert", other_ca.as_str()),
    ];
    let e = refused(
        read_ids(&spec("localhost", &wrong), &table).await,
        true,
        &password,
    );
    assert!(
        e.contains("TLS with PostgreSQL at localhost:")
            && e.contains("sslmode 'verify-full'")
            && e.contains(&format!("not signed by a CA in sslrootcert ({other_ca})")),
        "{e}"
    );
    // require with a CA checks the chain, as libpq does.
    let e = refused(
        read_ids(
            &spec(
                "localhost",
                &[("sslmode", "require"), ("sslrootcert", other_ca.as_str())],
            ),
            &table,
        )
        .await,
        true,
        &password,
    );
    assert!(
        e.contains("sslmode 'require'")
            && e.contains("so the certificate chain is checked")
            && e.contains("not signed by a CA"),
        "{e}"
    );
}

#[tokio::test]
async fn pg_cdc_over_tls() {
    let ca = std::env::var("STRATA_TEST_PG_SSLROOTCERT").unwrap_or_default();
    let full = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    let Some(spec) = pg_tls_spec("pg_tls_cdc", "localhost", &full) else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("tls_cdc");
    let cleanup = Cleanup {
        slot: unique("slot"),
        publication: unique("pub"),
    };
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, name text); INSERT INTO {t} VALUES (1, 'a'), (2, 'b');"
        ))
        .await
        .unwrap();
    let config = || {
        CdcConfig::new(
            cleanup.slot.clone(),
            cleanup.publication.clone(),
            vec![TableRef::new("public", &t)],
        )
    };
    // The slot is made and its snapshot read on the replication connection, which runs as
    // the TLS-only user too.
    let cdc = PgCdc::connect(&spec, config()).await.expect("connect");
    let mut snapshot = cdc.start_snapshot(true).await.expect("snapshot");
    let cp = snapshot.consistent_point();
    let mut batches = vec![];
    while let Some(tb) = snapshot.next_batch().await.expect("snapshot batch") {
        batches.push(tb.batch);
    }
    assert_eq!(ids(&batches), ids_of(&[1, 2]));
    admin
        .batch_execute(&format!(
            "INSERT INTO {t} VALUES (3, 'c'); UPDATE {t} SET name = 'aa' WHERE id = 1;"
        ))
        .await
        .unwrap();
    let mut changes = cdc
        .read_changes(cp, ReadOptions::default())
        .await
        .expect("read changes");
    let mut batches = vec![];
    while let Some(tb) = changes.next_batch().await.expect("change batch") {
        batches.push(tb.batch);
    }
    assert_eq!(
        rows(&batches, &["id", "name", "_change_type"]),
        [["3", "c", "insert"], ["1", "aa", "update"]]
    );
}

/// pgwire-replication 0.5 checks the host name in verify-ca (it forgives only the variant
/// of the error rustls 0.23 no longer reports): by an address the certificate does not list,
/// queries work and the replication connection is refused, saying why. When an upgrade fixes
/// this, the snapshot succeeds: turn this into a success test and drop the note in the docs.
#[tokio::test]
async fn pg_cdc_verify_ca_by_address_is_refused_on_the_replication_connection() {
    let ca = std::env::var("STRATA_TEST_PG_SSLROOTCERT").unwrap_or_default();
    let ca_only = [("sslmode", "verify-ca"), ("sslrootcert", ca.as_str())];
    let Some(spec) = pg_tls_spec("pg_tls_ca", "127.0.0.1", &ca_only) else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("tls_ca");
    let cleanup = Cleanup {
        slot: unique("slot"),
        publication: unique("pub"),
    };
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY); INSERT INTO {t} VALUES (1);"
        ))
        .await
        .unwrap();
    let config = CdcConfig::new(
        cleanup.slot.clone(),
        cleanup.publication.clone(),
        vec![TableRef::new("public", &t)],
    );
    let cdc = PgCdc::connect(&spec, config).await.expect("connect");
    let e = match cdc.start_snapshot(true).await {
        Ok(_) => panic!("pgwire-replication now forgives the name in verify-ca: update this test and docs/sources.md"),
        Err(e) => e,
    };
    assert!(matches!(e, SourceError::Tls { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("TLS with PostgreSQL at 127.0.0.1:")
            && e.contains("sslmode 'verify-ca'")
            && e.contains("replication connection")
            && e.contains("checks the host name even in verify-ca"),
        "{e}"
    );
}

#[tokio::test]
async fn mysql_ssl_modes_and_certificate_checks() {
    use mysql_async::prelude::Queryable;
    let Some(_) = mysql_spec("my_tls") else {
        return;
    };
    let mut admin = mysql_admin().await;
    let t = unique("tls_rows");
    admin
        .query_drop(format!("CREATE TABLE {t} (id INT PRIMARY KEY)"))
        .await
        .unwrap();
    admin
        .query_drop(format!("INSERT INTO {t} VALUES (1), (2), (3)"))
        .await
        .unwrap();
    let ca = service_var("STRATA_TEST_MYSQL_SSL_CA");
    let other_ca = service_var("STRATA_TEST_MYSQL_OTHER_CA");
    let password = service_var("STRATA_TEST_MYSQL_PASSWORD");
    let spec = |host: &str, options: &[(&str, &str)]| {
        mysql_tls_spec("my_tls", host, options).expect("MariaDB facts")
    };
    let want = ids_of(&[1, 2, 3]);

    // The user is REQUIRE SSL: without TLS (the default too) it is refused.
    for options in [&[][..], &[("ssl_mode", "DISABLED")]] {
        let e = refused(
            read_ids(&spec("127.0.0.1", options), &t).await,
            false,
            &password,
        );
        assert!(e.contains("Access denied"), "{options:?}: {e}");
    }
    // Encrypted, nothing checked; then checked, in MySQL's and libpq's spellings.
    let verify = [("ssl_mode", "VERIFY_IDENTITY"), ("ssl_ca", ca.as_str())];
    let libpq = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    let ca_only = [("ssl_mode", "VERIFY_CA"), ("ssl_ca", ca.as_str())];
    let cases: [(&str, &[(&str, &str)]); 5] = [
        ("127.0.0.1", &[("ssl_mode", "PREFERRED")]),
        ("127.0.0.1", &[("ssl_mode", "required")]),
        ("localhost", &verify),
        ("localhost", &libpq),
        ("localhost", &ca_only),
    ];
    for (host, options) in cases {
        let got = read_ids(&spec(host, options), &t).await;
        assert_eq!(got.expect("read over TLS"), want, "{host} {options:?}");
    }
    // VERIFY_IDENTITY by a name the certificate does not list.
    let e = refused(
        read_ids(&spec("127.0.0.1", &verify), &t).await,
        true,
        &password,
    );
    assert!(
        e.contains("TLS with MySQL at 127.0.0.1:")
            && e.contains(&format!("(ssl_mode 'VERIFY_IDENTITY', ssl_ca '{ca}')"))
            && e.contains("does not name the host '127.0.0.1'")
            && e.contains("or use ssl_mode 'VERIFY_CA'"),
        "{e}"
    );
    // Against a CA that did not sign the certificate.
    let wrong = [
        ("ssl_mode", "VERIFY_IDENTITY"),
        ("ssl_ca", other_ca.as_str()),
    ];
    let e = refused(
        read_ids(&spec("localhost", &wrong), &t).await,
        true,
        &password,
    );
    assert!(
        e.contains("TLS with MySQL at localhost:")
            && e.contains("ssl_mode 'VERIFY_IDENTITY'")
            && e.contains(&format!("not signed by a CA in ssl_ca ({other_ca})")),
        "{e}"
    );
    // REQUIRED with a CA checks the chain.
    let required = [("ssl_mode", "REQUIRED"), ("ssl_ca", other_ca.as_str())];
    let e = refused(
        read_ids(&spec("localhost", &required), &t).await,
        true,
        &password,
    );
    assert!(e.contains("so the certificate chain is checked"), "{e}");
}
