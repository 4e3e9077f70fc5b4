//! `read_database` over TLS on the real binary, against the real PostgreSQL and MariaDB that
//! `scripts/services/with-services.sh` starts with TLS on: a certificate for `localhost`
//! signed by a test CA, and a user each server accepts only over TLS (so rows that arrive
//! came over TLS). Rows arrive with `require` and `verify-full` (`REQUIRED`,
//! `VERIFY_IDENTITY`), a CDC pipeline runs over TLS, and a certificate strata must not trust
//! (another CA, a host name it does not list) fails the run, naming the connection, the host
//! and the TLS options, with nothing written and the password nowhere.

mod common;

use common::database::{
    cdc_history, drop_slot, fact, files_containing, mysql, pg, pg_value, run, run_ok, unique,
    Server,
};
use common::{stderr, Project};

const PG: &str = "STRATA_TEST_PG";
const MY: &str = "STRATA_TEST_MYSQL";

/// A watermark load of `table` into `orders_raw` through `server`'s connection.
fn load(server: &Server, kind: &str, table: &str) -> Project {
    Project::new(&format!(
        "{}CREATE STREAMING TABLE orders_raw AS SELECT * FROM STREAM read_database('shop', \
         table => '{table}', watermark => 'updated_at');\n",
        server.connection(kind)
    ))
}

/// A run that must fail as bad input (exit code 2), writing nothing and never printing the
/// password; its stderr.
fn refused(p: &Project, server: &Server) -> String {
    let out = run(p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        !err.contains(&server.password),
        "the password was printed: {err}"
    );
    assert!(
        !p.path("warehouse/default/orders_raw").exists(),
        "a refused run wrote the table"
    );
    err
}

/// The rows arrived and the password is in nothing strata printed or wrote.
fn assert_loaded(p: &Project, said: &str, password: &str, want: &str) {
    assert_eq!(p.csv("SELECT id, v FROM orders_raw ORDER BY id"), want);
    assert!(!said.contains(password), "the password was printed");
    let found = files_containing(&p.path("warehouse"), password);
    assert!(found.is_empty(), "the password is in {found:?}");
}

#[test]
fn postgres_rows_arrive_over_tls_and_untrusted_certificates_are_refused() {
    let plain = Server::from_env(PG);
    let ca = fact(PG, "SSLROOTCERT");
    let other_ca = fact(PG, "OTHER_CA");
    let table = unique("tls_orders");
    pg(
        &plain,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);
             INSERT INTO {table} VALUES (1, 'a', '2024-01-01 10:00:00+00'), (2, 'b', '2024-01-01 11:00:00+00');"
        ),
    );
    let table = format!("public.{table}");

    // require: encrypted, the certificate not checked; a second run reads the new row.
    let require = Server::tls_from_env(PG, "127.0.0.1", &[("sslmode", "require")]);
    let p = load(&require, "postgresql", &table);
    let mut said = run_ok(&p, &require.password);
    assert_loaded(&p, &said, &require.password, "id,v\n1,a\n2,b\n");
    pg(
        &plain,
        &format!("INSERT INTO {table} VALUES (3, 'c', '2024-01-02 10:00:00+00');"),
    );
    said += &run_ok(&p, &require.password);
    assert_loaded(&p, &said, &require.password, "id,v\n1,a\n2,b\n3,c\n");

    // verify-full with the CA, by the name the certificate lists.
    let full = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    let verified = Server::tls_from_env(PG, "localhost", &full);
    let p = load(&verified, "postgresql", &table);
    let said = run_ok(&p, &verified.password);
    assert_loaded(&p, &said, &verified.password, "id,v\n1,a\n2,b\n3,c\n");

    // Without TLS the user is refused, and the message says how to connect.
    let no_tls = Server::tls_from_env(PG, "127.0.0.1", &[]);
    let err = refused(&load(&no_tls, "postgresql", &table), &no_tls);
    assert!(
        err.contains("connection 'shop'")
            && err.contains("no encryption")
            && err.contains("set sslmode to 'require'"),
        "{err}"
    );

    // verify-full by an address the certificate does not list.
    let by_address = Server::tls_from_env(PG, "127.0.0.1", &full);
    let err = refused(&load(&by_address, "postgresql", &table), &by_address);
    assert!(
        err.contains("connection 'shop': TLS with PostgreSQL at 127.0.0.1:")
            && err.contains(&format!("(sslmode 'verify-full', sslrootcert '{ca}')"))
            && err.contains("does not name the host '127.0.0.1'"),
        "{err}"
    );

    // verify-full against a CA that did not sign the server's certificate.
    let wrong = [
        ("sslmode", "verify-full"),
        ("sslrootcert", other_ca.as_str()),
    ];
    let wrong_ca = Server::tls_from_env(PG, "localhost", &wrong);
    let err = refused(&load(&wrong_ca, "postgresql", &table), &wrong_ca);
    assert!(
        err.contains("connection 'shop': TLS with PostgreSQL at localhost:")
            && err.contains(&format!(
                "(sslmode 'verify-full', sslrootcert '{other_ca}')"
            ))
            && err.contains("not signed by a CA in sslrootcert"),
        "{err}"
    );

    // A CA file that is not there: refused before connecting, naming the option and file.
    let missing = [
        ("sslmode", "verify-full"),
        ("sslrootcert", "/nonexistent/ca.pem"),
    ];
    let no_file = Server::tls_from_env(PG, "localhost", &missing);
    let err = refused(&load(&no_file, "postgresql", &table), &no_file);
    assert!(
        err.contains("connection 'shop'")
            && err.contains("sslrootcert: CA file '/nonexistent/ca.pem' does not exist"),
        "{err}"
    );
}

#[test]
fn postgres_cdc_pipeline_runs_over_tls() {
    let plain = Server::from_env(PG);
    let ca = fact(PG, "SSLROOTCERT");
    // The replication connection logs in as the TLS-only user too (pg_hba rejects it on a
    // plain replication connection).
    let tls = Server::tls_from_env(
        PG,
        "localhost",
        &[("sslmode", "verify-full"), ("sslrootcert", ca.as_str())],
    );
    let table = unique("tls_cust");
    let slot = unique("strata_tls_slot");
    pg(
        &plain,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, name text, city text);
             INSERT INTO {table} VALUES (1, 'Ann', 'Oslo'), (2, 'Bob', 'Rome');"
        ),
    );
    let p = cdc_history(&tls, "cust", &table, &slot, "");
    let mut said = run_ok(&p, &tls.password);
    assert_eq!(
        p.csv("SELECT id, _change_type FROM cust_changes ORDER BY id"),
        "id,_change_type\n1,snapshot\n2,snapshot\n"
    );
    pg(
        &plain,
        &format!(
            "UPDATE {table} SET city = 'Bergen' WHERE id = 1; DELETE FROM {table} WHERE id = 2;
             INSERT INTO {table} VALUES (3, 'Cy', 'Nice');"
        ),
    );
    said += &run_ok(&p, &tls.password);
    assert_eq!(
        p.csv("SELECT id, city, __END_AT IS NULL AS open FROM cust ORDER BY id, __START_AT"),
        "id,city,open\n1,Oslo,false\n1,Bergen,true\n2,Rome,false\n3,Nice,true\n"
    );
    assert!(!said.contains(&tls.password), "the password was printed");
    drop_slot(&plain, &slot);
}

#[test]
fn mysql_rows_arrive_over_tls_and_untrusted_certificates_are_refused() {
    let plain = Server::from_env(MY);
    let ca = fact(MY, "SSL_CA");
    let other_ca = fact(MY, "OTHER_CA");
    let table = unique("tls_orders");
    mysql(
        &plain,
        &[
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, v varchar(20), updated_at datetime(6) NOT NULL)"
            ),
            &format!(
                "INSERT INTO {table} VALUES (1, 'a', '2024-01-01 10:00:00'), (2, 'b', '2024-01-01 11:00:00')"
            ),
        ],
    );

    // REQUIRED: encrypted, the certificate not checked.
    let required = Server::tls_from_env(MY, "127.0.0.1", &[("ssl_mode", "REQUIRED")]);
    let p = load(&required, "mysql", &table);
    let said = run_ok(&p, &required.password);
    assert_loaded(&p, &said, &required.password, "id,v\n1,a\n2,b\n");

    // VERIFY_IDENTITY with the CA, by the name the certificate lists.
    let identity = [("ssl_mode", "VERIFY_IDENTITY"), ("ssl_ca", ca.as_str())];
    let verified = Server::tls_from_env(MY, "localhost", &identity);
    let p = load(&verified, "mysql", &table);
    let said = run_ok(&p, &verified.password);
    assert_loaded(&p, &said, &verified.password, "id,v\n1,a\n2,b\n");

    // Without TLS the user (REQUIRE SSL) is refused.
    let no_tls = Server::tls_from_env(MY, "127.0.0.1", &[("ssl_mode", "DISABLED")]);
    let err = refused(&load(&no_tls, "mysql", &table), &no_tls);
    assert!(
        err.contains("connection 'shop'") && err.contains("Access denied"),
        "{err}"
    );

    // VERIFY_IDENTITY by an address the certificate does not list.
    let by_address = Server::tls_from_env(MY, "127.0.0.1", &identity);
    let err = refused(&load(&by_address, "mysql", &table), &by_address);
    assert!(
        err.contains("connection 'shop': TLS with MySQL at 127.0.0.1:")
            && err.contains(&format!("(ssl_mode 'VERIFY_IDENTITY', ssl_ca '{ca}')"))
            && err.contains("does not name the host '127.0.0.1'"),
        "{err}"
    );

    // VERIFY_IDENTITY against a CA that did not sign the server's certificate.
    let wrong = [
        ("ssl_mode", "VERIFY_IDENTITY"),
        ("ssl_ca", other_ca.as_str()),
    ];
    let wrong_ca = Server::tls_from_env(MY, "localhost", &wrong);
    let err = refused(&load(&wrong_ca, "mysql", &table), &wrong_ca);
    assert!(
        err.contains("connection 'shop': TLS with MySQL at localhost:")
            && err.contains(&format!(
                "(ssl_mode 'VERIFY_IDENTITY', ssl_ca '{other_ca}')"
            ))
            && err.contains("not signed by a CA in ssl_ca"),
        "{err}"
    );
}

/// PostgreSQL's client-certificate user (`hostssl ... cert` in pg_hba: TLS and the
/// certificate the test CA signed for it, no password): rows arrive with `sslcert` and
/// `sslkey`, and a CDC pipeline runs with them (the replication connection shows the
/// certificate too). Without them the run fails naming the connection and the two options;
/// a key file that is missing or cannot be read is named before anything is tried.
#[test]
fn postgres_client_certificates_log_in_for_queries_and_replication() {
    let plain = Server::from_env(PG);
    let ca = fact(PG, "SSLROOTCERT");
    let cert = fact(PG, "SSLCERT");
    let key = fact(PG, "SSLKEY");
    let table = unique("cert_orders");
    pg(
        &plain,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);
             INSERT INTO {table} VALUES (1, 'a', '2024-01-01 10:00:00+00'), (2, 'b', '2024-01-01 11:00:00+00');"
        ),
    );
    let with_cert = [
        ("sslmode", "verify-full"),
        ("sslrootcert", ca.as_str()),
        ("sslcert", cert.as_str()),
        ("sslkey", key.as_str()),
    ];
    let server = Server::cert_from_env(PG, "localhost", &with_cert);
    let p = load(&server, "postgresql", &table);
    let said = run_ok(&p, &server.password);
    assert_loaded(&p, &said, &server.password, "id,v\n1,a\n2,b\n");

    // The replication connection logs in with the certificate too (pg_hba has `cert` for
    // replication as well, and nothing else for this user).
    let slot = unique("strata_cert_slot");
    let p = cdc_history(&server, "cust", &table, &slot, "");
    run_ok(&p, &server.password);
    pg(
        &plain,
        &format!("UPDATE {table} SET v = 'c' WHERE id = 1; DELETE FROM {table} WHERE id = 2;"),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, v, __END_AT IS NULL AS open FROM cust ORDER BY id, __START_AT"),
        "id,v,open\n1,a,false\n1,c,true\n2,b,false\n"
    );
    drop_slot(&plain, &slot);

    // Without the certificate: refused by the server, the options named.
    let without = Server::cert_from_env(
        PG,
        "localhost",
        &[("sslmode", "verify-full"), ("sslrootcert", ca.as_str())],
    );
    let err = refused(&load(&without, "postgresql", &table), &without);
    assert!(
        err.contains("connection 'shop'")
            && err.contains("requires a valid client certificate")
            && err.contains("set the options sslcert and sslkey"),
        "{err}"
    );

    // A key file that does not exist, or cannot be read (a directory): the file is named.
    for bad in ["/nonexistent/client.key", "/"] {
        let options = [
            ("sslmode", "verify-full"),
            ("sslrootcert", ca.as_str()),
            ("sslcert", cert.as_str()),
            ("sslkey", bad),
        ];
        let broken = Server::cert_from_env(PG, "localhost", &options);
        let err = refused(&load(&broken, "postgresql", &table), &broken);
        assert!(
            err.contains("connection 'shop'") && err.contains("sslkey: "),
            "{err}"
        );
        assert!(
            err.contains(&format!("private key file '{bad}' does not exist"))
                || err.contains(&format!("cannot read the private key file '{bad}'")),
            "{err}"
        );
    }
}

/// MariaDB's client-certificate user (`REQUIRE X509`): rows arrive and a binlog CDC
/// pipeline runs with `ssl_cert` / `ssl_key` (libpq's `sslcert` / `sslkey` too); without
/// them the run fails naming the connection and the options; a key file that cannot be read
/// is named.
#[test]
fn mysql_client_certificates_log_in_for_queries_and_the_binlog() {
    let plain = Server::from_env(MY);
    let ca = fact(MY, "SSL_CA");
    let cert = fact(MY, "SSL_CERT");
    let key = fact(MY, "SSL_KEY");
    let table = unique("cert_orders");
    mysql(
        &plain,
        &[
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, v varchar(20), updated_at datetime(6) NOT NULL)"
            ),
            &format!(
                "INSERT INTO {table} VALUES (1, 'a', '2024-01-01 10:00:00'), (2, 'b', '2024-01-01 11:00:00')"
            ),
        ],
    );
    let with_cert = [
        ("ssl_mode", "VERIFY_IDENTITY"),
        ("ssl_ca", ca.as_str()),
        ("ssl_cert", cert.as_str()),
        ("ssl_key", key.as_str()),
    ];
    let server = Server::cert_from_env(MY, "localhost", &with_cert);
    let p = load(&server, "mysql", &table);
    let said = run_ok(&p, &server.password);
    assert_loaded(&p, &said, &server.password, "id,v\n1,a\n2,b\n");

    // The binlog client connects with it too; libpq's names work as well.
    let libpq_names = [
        ("sslmode", "verify-full"),
        ("sslrootcert", ca.as_str()),
        ("sslcert", cert.as_str()),
        ("sslkey", key.as_str()),
    ];
    let server = Server::cert_from_env(MY, "localhost", &libpq_names);
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE cust;
CREATE FLOW cust_flow AS AUTO CDC INTO cust FROM STREAM read_database('shop',
  table => '{table}', mode => 'cdc')
KEYS (id) STORED AS SCD TYPE 2;
",
        server.connection("mysql")
    ));
    run_ok(&p, &server.password);
    mysql(
        &plain,
        &[&format!("UPDATE {table} SET v = 'c' WHERE id = 1")],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, v, __END_AT IS NULL AS open FROM cust ORDER BY id, __START_AT"),
        "id,v,open\n1,a,false\n1,c,true\n2,b,true\n"
    );

    // Without the certificate: refused by the server, the options named.
    let without = Server::cert_from_env(
        MY,
        "localhost",
        &[("ssl_mode", "VERIFY_IDENTITY"), ("ssl_ca", ca.as_str())],
    );
    let err = refused(&load(&without, "mysql", &table), &without);
    assert!(
        err.contains("connection 'shop'")
            && err.contains("Access denied")
            && err.contains("set the options ssl_cert and ssl_key"),
        "{err}"
    );

    // A key file that cannot be read (a directory): the file is named.
    let options = [
        ("ssl_mode", "VERIFY_IDENTITY"),
        ("ssl_ca", ca.as_str()),
        ("ssl_cert", cert.as_str()),
        ("ssl_key", "/"),
    ];
    let broken = Server::cert_from_env(MY, "localhost", &options);
    let err = refused(&load(&broken, "mysql", &table), &broken);
    assert!(
        err.contains("connection 'shop'")
            && err.contains("ssl_key: cannot read the private key file '/'"),
        "{err}"
    );
}

/// A PostgreSQL sink writes through a connection that verifies the server's certificate
/// (verify-full), as the sources read through it; the password appears nowhere.
#[test]
fn a_postgres_sink_writes_over_tls() {
    let plain = Server::from_env(PG);
    let ca = fact(PG, "SSLROOTCERT");
    let (source, sink) = (unique("tls_sink_src"), unique("tls_sink_out"));
    pg(
        &plain,
        &format!(
            "CREATE TABLE {source} (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);
             INSERT INTO {source} VALUES (1, 'a', '2024-01-01 10:00:00+00'), (2, 'b', '2024-01-01 11:00:00+00');"
        ),
    );
    let full = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    let verified = Server::tls_from_env(PG, "localhost", &full);
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE src AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{source}', watermark => 'updated_at');
CREATE SINK out_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{sink}');
CREATE FLOW out_flow AS INSERT INTO out_pg BY NAME SELECT id, v FROM STREAM(src);
",
        verified.connection("postgresql")
    ));
    let said = run_ok(&p, &verified.password);
    assert!(said.contains("2 row(s) sent to postgresql table"), "{said}");
    assert!(
        !said.contains(&verified.password),
        "the password was printed"
    );
    assert_eq!(
        pg_value(
            &plain,
            &format!("SELECT string_agg(id || ':' || v, ',' ORDER BY id) FROM public.{sink}")
        )
        .as_deref(),
        Some("1:a,2:b")
    );
}
