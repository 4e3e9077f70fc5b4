//! `strata serve --pg`: the real binary serving a warehouse built by `strata run`, read by
//! the real `psql` (Debian's postgresql-client) and by tokio-postgres (the extended
//! protocol: prepared statements, parameters, binary values); `strata serve --flight` read
//! by arrow-flight's Flight SQL client.

mod common;

use common::serve::Server;
use common::{stderr, Project};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::types::{FromSql, Type};

const PASSWORD: &str = "s3cret-pg";

/// An SCD2 AUTO CDC target with every kind of column strata writes: integers, a decimal, a
/// double, a boolean, a timestamp with zone and one without, a date, an array, a struct and
/// a map.
const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE orders_cdc
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'id BIGINT, name STRING, qty INT, amount DECIMAL(10,2), score DOUBLE, active BOOLEAN, placed_at TIMESTAMP, local_at TIMESTAMP_NTZ, day DATE, tags ARRAY<STRING>, addr STRUCT<city: STRING, zip INT>, attrs MAP<STRING, STRING>, seq INT');
CREATE OR REFRESH STREAMING TABLE orders;
CREATE FLOW orders_flow AS AUTO CDC INTO orders
FROM STREAM(orders_cdc)
KEYS (id)
SEQUENCE BY seq
COLUMNS * EXCEPT (seq)
STORED AS SCD TYPE 2;
"#;

const FIRST: &str = r#"{"id": 1, "name": "Isabel", "qty": 3, "amount": "123.45", "score": 1.5, "active": true, "placed_at": "2024-01-01T10:00:00Z", "local_at": "2024-01-01T10:00:00.5", "day": "2024-01-01", "tags": ["a", "b"], "addr": {"city": "Monterrey", "zip": 64000}, "attrs": {"tier": "gold", "note": "a \"quote\""}, "seq": 1}
{"id": 2, "name": "Raul", "qty": 1, "amount": "-0.05", "score": 2.25, "active": false, "placed_at": "2024-02-29T23:59:59.123456Z", "local_at": "2024-02-29T23:59:59", "day": "2024-02-29", "tags": [], "addr": {"city": "Oaxaca", "zip": null}, "attrs": {}, "seq": 1}
{"id": 1, "name": "Isabel", "qty": 4, "amount": "200.00", "score": 1.5, "active": true, "placed_at": "2024-01-02T10:00:00Z", "local_at": "2024-01-02T10:00:00", "day": "2024-01-02", "tags": null, "addr": null, "seq": 2}
"#;

const SECOND: &str = r#"{"id": 3, "name": "Lily", "qty": 7, "amount": "9.99", "score": 0.5, "active": true, "placed_at": "2024-03-01T00:00:00Z", "local_at": "2024-03-01T00:00:00", "day": "2024-03-01", "tags": ["c"], "addr": {"city": "Cancun", "zip": 77500}, "seq": 1}
"#;

/// How the tests start `strata serve` (the shared [`Server`] of `common::serve`).
impl Server {
    /// Starts `strata serve --pg 127.0.0.1:0 extra...` in `p` with `env`, and waits for the
    /// line saying where it listens.
    fn start(p: &Project, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let listen = ["--pg", "127.0.0.1:0"];
        Server::start_on(p, &listen, "PostgreSQL clients on 127.0.0.1:", extra, env)
    }

    /// Starts `strata serve listen... extra...` and waits for the line with `marker`
    /// followed by the port listened on.
    fn start_on(
        p: &Project,
        listen: &[&str],
        marker: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let args: Vec<&str> = listen.iter().chain(extra).copied().collect();
        Server::spawn(p, &args, marker, env)
    }
}

/// psql on a running server.
impl Server {
    /// `psql` with `args` and the password `password`.
    fn psql_as(&self, password: &str, args: &[&str]) -> std::process::Output {
        Command::new("psql")
            .args(["-X", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "strata", "-d", "main", "-v", "ON_ERROR_STOP=1"])
            .args(args)
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("psql runs")
    }

    /// `sql` through `psql --csv`: the output, which must be a success.
    fn psql_csv(&self, sql: &str) -> String {
        let out = self.psql_as(PASSWORD, &["--csv", "-c", sql]);
        assert!(
            out.status.success(),
            "psql -c {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

fn project() -> Project {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", FIRST);
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    p
}

/// psql: rows with their PostgreSQL text (timestamps with the zone in UTC, decimals,
/// nested values as JSON), `\dt`, what clients send on connect, errors with their SQLSTATE
/// that leave the session usable, writes refused, a wrong password refused.
#[test]
fn psql_reads_the_warehouse_and_cannot_write() {
    let p = project();
    let server = Server::start(&p, &[], &[("STRATA_SERVE_PASSWORD", PASSWORD)]);
    assert!(
        server.log().contains("password required; read-only"),
        "{}",
        server.log()
    );
    assert!(!server.log().contains(PASSWORD), "{}", server.log());

    assert_eq!(
        server.psql_csv(
            "SELECT id, name, qty, amount, score, active, placed_at, local_at, day, tags, addr, \
             __START_AT, __END_AT FROM orders ORDER BY id, __START_AT"
        ),
        "id,name,qty,amount,score,active,placed_at,local_at,day,tags,addr,__START_AT,__END_AT\n\
         1,Isabel,3,123.45,1.5,t,2024-01-01 10:00:00+00,2024-01-01 10:00:00.5,2024-01-01,\
         \"[\"\"a\"\",\"\"b\"\"]\",\"{\"\"city\"\":\"\"Monterrey\"\",\"\"zip\"\":64000}\",1,2\n\
         1,Isabel,4,200.00,1.5,t,2024-01-02 10:00:00+00,2024-01-02 10:00:00,2024-01-02,,,2,\n\
         2,Raul,1,-0.05,2.25,f,2024-02-29 23:59:59.123456+00,2024-02-29 23:59:59,2024-02-29,\
         [],\"{\"\"city\"\":\"\"Oaxaca\"\",\"\"zip\"\":null}\",1,\n"
    );
    // A map as a JSON object.
    assert_eq!(
        server.psql_csv("SELECT id, attrs FROM orders ORDER BY id, __START_AT"),
        r#"id,attrs
1,"{""tier"":""gold"",""note"":""a \""quote\""""}"
1,
2,{}
"#
    );
    // strata's own SQL: as_of(), three-part names, DESCRIBE, SHOW TABLES.
    assert_eq!(
        server.psql_csv("SELECT id, qty FROM as_of(orders, 1) ORDER BY id"),
        "id,qty\n1,3\n2,1\n"
    );
    assert_eq!(
        server.psql_csv("SELECT count(*) AS n FROM main.default.orders WHERE __END_AT IS NULL"),
        "n\n2\n"
    );
    assert!(server
        .psql_csv("DESCRIBE orders")
        .contains("amount,\"DECIMAL(10,2)\",\n"));
    assert_eq!(
        server.psql_csv("SHOW TABLES"),
        "database,tableName,isTemporary\ndefault,event_log,f\ndefault,orders,f\n\
         default,orders_cdc,f\n"
    );

    // psql's \dt, through pg_catalog.
    assert_eq!(
        server.psql_csv("\\dt"),
        "Schema,Name,Type,Owner\ndefault,event_log,table,strata\ndefault,orders,table,strata\n\
         default,orders_cdc,table,strata\n"
    );
    // psql's \d TABLE: its eight catalog queries (pg_syntax.rs adapts them), the columns
    // with PostgreSQL's type names.
    assert_eq!(
        server.psql_csv("\\d orders"),
        "Column,Type,Collation,Nullable,Default\nid,bigint,,,\nname,text,,,\n\
         qty,integer,,,\namount,\"numeric(10,2)\",,,\nscore,double precision,,,\n\
         active,boolean,,,\nplaced_at,timestamp with time zone,,,\n\
         local_at,timestamp without time zone,,,\nday,date,,,\ntags,json,,,\n\
         addr,json,,,\nattrs,json,,,\n__START_AT,integer,,,\n__END_AT,integer,,,\n"
    );
    // What a JDBC-style client (DBeaver, Metabase) sends on connect and to list schemas,
    // tables and columns, in one session.
    let out = server.psql_as(
        PASSWORD,
        &[
            "--csv",
            "-c",
            "SET extra_float_digits = 3",
            "-c",
            "SET application_name = 'PostgreSQL JDBC Driver'",
            "-c",
            "SELECT version()",
            "-c",
            "SELECT current_database(), current_schema()",
            "-c",
            "SHOW search_path",
            "-c",
            "SHOW TRANSACTION ISOLATION LEVEL",
            "-c",
            "BEGIN READ ONLY",
            "-c",
            "SELECT datname FROM pg_catalog.pg_database",
            "-c",
            "SELECT nspname FROM pg_catalog.pg_namespace ORDER BY nspname",
            "-c",
            "SELECT table_schema, table_name FROM information_schema.tables \
             WHERE table_schema = 'default' ORDER BY table_name",
            "-c",
            "SELECT column_name, data_type FROM information_schema.columns \
             WHERE table_name = 'orders' AND column_name IN ('id', 'amount') \
             ORDER BY column_name",
            "-c",
            "SELECT a.attname, t.typname, a.attnotnull FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             WHERE c.relname = 'orders' AND n.nspname = 'default' AND a.attnum > 0 \
             ORDER BY a.attnum",
            "-c",
            "COMMIT",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "SET\n",
        "version()\n\"PostgreSQL 16.6 (strata ",
        "current_database(),current_schema()\nmain,default\n",
        "search_path\ndefault\n",
        "transaction_isolation\nread committed\n",
        "BEGIN\n",
        "datname\nmain\n",
        "nspname\ndefault\npg_catalog\n",
        "table_schema,table_name\ndefault,event_log\ndefault,orders\ndefault,orders_cdc\n",
        "column_name,data_type\namount,\"Decimal128(10, 2)\"\nid,Int64\n",
        "attname,typname,attnotnull\nid,int8,f\nname,text,f\nqty,int4,f\namount,numeric,f\n\
         score,float8,f\nactive,bool,f\nplaced_at,timestamptz,f\nlocal_at,timestamp,f\n\
         day,date,f\ntags,json,f\naddr,json,f\nattrs,json,f\n__START_AT,int4,f\n\
         __END_AT,int4,f\n",
        "COMMIT\n",
    ] {
        assert!(said.contains(expected), "{expected:?} not in:\n{said}");
    }

    // Errors come back with their SQLSTATE; the session goes on.
    let out = server.psql_as(
        PASSWORD,
        &[
            "-v",
            "VERBOSITY=verbose",
            "-v",
            "ON_ERROR_STOP=0",
            "-c",
            "SELECT * FROM nosuch",
            "-c",
            "SELECT nosuch FROM orders",
            "-c",
            "SELEC 1",
            "-c",
            "INSERT INTO orders (id) VALUES (9)",
            "-c",
            "DROP TABLE orders",
            "-c",
            "",
            "-c",
            "SELECT 41 + 1 AS answer",
        ],
    );
    let errors = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "ERROR:  42P01: query: table main.default.nosuch not found",
        "ERROR:  42703: query: Schema error: No field named nosuch",
        "ERROR:  42601: query: SQL error: ParserError",
        "LINE 1: SELEC 1\n        ^",
        "ERROR:  25006: strata serve is read-only: INSERT is refused",
        "ERROR:  25006: strata serve is read-only: DROP TABLE is refused",
    ] {
        assert!(errors.contains(expected), "{expected:?} not in:\n{errors}");
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("answer \n--------\n     42\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A wrong password, and a user other than --user's, are refused.
    let out = server.psql_as("wrong", &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("authentication failed"), "{said}");
    let out = Command::new("psql")
        .args(["-X", "-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-U", "someone", "-d", "main", "-c", "SELECT 1"])
        .env("PGPASSWORD", PASSWORD)
        .output()
        .expect("psql runs");
    assert!(!out.status.success());

    let log = server.log();
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(log.contains("connected as user strata"), "{log}");
    assert!(log.contains("query failed"), "{log}");
    assert!(!log.contains(PASSWORD), "{log}");
}

/// A value as the server sent it in binary, whatever its type.
struct Raw(Vec<u8>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Microseconds from PostgreSQL's epoch (2000-01-01) in a binary timestamp.
fn pg_micros(raw: &Raw) -> i64 {
    i64::from_be_bytes(raw.0.as_slice().try_into().expect("8 bytes")) + 946_684_800_000_000
}

/// tokio-postgres: a prepared statement with parameters, described with its columns' and
/// parameters' types, values read in binary (integers, doubles, text, numeric, timestamps
/// with and without zone, dates, JSON), errors that leave the connection usable, and the
/// same connection seeing rows committed by a later `strata run`, a long query cancelled.
#[test]
fn prepared_statements_read_typed_values_and_see_new_commits() {
    let p = project();
    let server = Server::start(
        &p,
        &["--user", "reader"],
        &[("STRATA_SERVE_PASSWORD", PASSWORD)],
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let config = format!(
        "host=127.0.0.1 port={} user=reader password={PASSWORD} dbname=main",
        server.port
    );
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
            .await
            .expect("connects");
        let connection = tokio::spawn(connection);

        let statement = client
            .prepare(
                "SELECT id, name, qty, amount, score, placed_at, local_at, day, addr \
                 FROM orders WHERE id = $1 AND name = $2 AND __END_AT IS NULL",
            )
            .await
            .expect("prepares");
        assert_eq!(statement.params(), &[Type::INT8, Type::TEXT]);
        let types: Vec<Type> = statement
            .columns()
            .iter()
            .map(|c| c.type_().clone())
            .collect();
        assert_eq!(
            types,
            vec![
                Type::INT8,
                Type::TEXT,
                Type::INT4,
                Type::NUMERIC,
                Type::FLOAT8,
                Type::TIMESTAMPTZ,
                Type::TIMESTAMP,
                Type::DATE,
                Type::JSON
            ]
        );
        let rows = client
            .query(&statement, &[&2i64, &"Raul"])
            .await
            .expect("runs");
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.get::<_, i64>(0), 2);
        assert_eq!(row.get::<_, String>(1), "Raul");
        assert_eq!(row.get::<_, i32>(2), 1);
        // numeric -0.05: one base-10000 digit (500), weight -1, negative, scale 2.
        assert_eq!(
            row.get::<_, Raw>(3).0,
            vec![0, 1, 255, 255, 0x40, 0, 0, 2, 1, 244]
        );
        assert_eq!(row.get::<_, f64>(4), 2.25);
        let placed = chrono::DateTime::from_timestamp_micros(pg_micros(&row.get::<_, Raw>(5)))
            .expect("timestamp");
        assert_eq!(placed.to_rfc3339(), "2024-02-29T23:59:59.123456+00:00");
        let local = chrono::DateTime::from_timestamp_micros(pg_micros(&row.get::<_, Raw>(6)))
            .expect("timestamp")
            .naive_utc();
        assert_eq!(local.to_string(), "2024-02-29 23:59:59");
        let day = i32::from_be_bytes(row.get::<_, Raw>(7).0.try_into().expect("4 bytes"));
        assert_eq!(day, 8825, "2024-02-29 is 8825 days after 2000-01-01");
        assert_eq!(
            String::from_utf8(row.get::<_, Raw>(8).0).expect("utf-8"),
            r#"{"city":"Oaxaca","zip":null}"#
        );

        // The same statement with other values; none that match.
        let rows = client
            .query(&statement, &[&1i64, &"Isabel"])
            .await
            .expect("runs");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].get::<_, i32>(2), 4);
        assert!(client
            .query(&statement, &[&99i64, &"x"])
            .await
            .expect("runs")
            .is_empty());

        // Errors come back with their SQLSTATE and the connection stays usable.
        let e = client
            .query("SELECT nosuch FROM orders", &[])
            .await
            .expect_err("unknown column");
        assert_eq!(e.code().map(|c| c.code()), Some("42703"), "{e:?}");
        let e = client
            .query("DELETE FROM orders WHERE id = $1", &[&1i64])
            .await
            .expect_err("a write");
        assert_eq!(e.code().map(|c| c.code()), Some("25006"), "{e:?}");
        assert_eq!(count(&client).await, 3);

        // New data committed while the connection is open: the next query sees it.
        p.file("data/cdc/002.json", SECOND);
        let out = p.run();
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(count(&client).await, 4);
        let rows = client
            .query(&statement, &[&3i64, &"Lily"])
            .await
            .expect("runs");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].get::<_, f64>(4), 0.5);

        // The empty query is answered.
        client.simple_query(";").await.expect("the empty query");

        // The simple protocol through tokio-postgres: text values.
        let messages = client
            .simple_query("SELECT amount, tags FROM orders WHERE id = 3")
            .await
            .expect("runs");
        let row = messages
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .expect("a row");
        assert_eq!(row.get(0), Some("9.99"));
        assert_eq!(row.get(1), Some(r#"["c"]"#));

        // A client's cancel request stops a long query (SQLSTATE 57014); the connection
        // goes on.
        let token = client.cancel_token();
        let canceller = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            token.cancel_query(tokio_postgres::NoTls).await
        });
        let long = client.simple_query("SELECT count(*) FROM range(1000000000000)");
        let e = tokio::time::timeout(Duration::from_secs(60), long)
            .await
            .expect("the cancelled query stops")
            .expect_err("the query is cancelled");
        assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e:?}");
        canceller
            .await
            .expect("task")
            .expect("the cancel request is sent");
        assert_eq!(count(&client).await, 4);

        drop(client);
        let _ = connection.await;
    });
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

async fn count(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .expect("counts")
        .get::<_, i64>(0)
}

/// `--max-queries 1`: a second query waits while the first computes, and runs once the
/// first is cancelled.
#[test]
fn queries_beyond_max_queries_wait_their_turn() {
    let p = project();
    let server = Server::start(
        &p,
        &["--max-queries", "1"],
        &[("STRATA_SERVE_PASSWORD", PASSWORD)],
    );
    let config = format!(
        "host=127.0.0.1 port={} user=strata password={PASSWORD} dbname=main",
        server.port
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let connect = || tokio_postgres::connect(&config, tokio_postgres::NoTls);
        let (first, c1) = connect().await.expect("connects");
        let (second, c2) = connect().await.expect("connects");
        tokio::spawn(c1);
        tokio::spawn(c2);
        let token = first.cancel_token();
        let long = tokio::spawn(async move {
            first
                .simple_query("SELECT count(*) FROM range(1000000000000)")
                .await
                .map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let quick = tokio::spawn(async move {
            let rows = second.query("SELECT count(*) FROM orders", &[]).await;
            rows.map(|r| r[0].get::<_, i64>(0))
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !quick.is_finished(),
            "a second query ran beside the first under --max-queries 1"
        );
        token
            .cancel_query(tokio_postgres::NoTls)
            .await
            .expect("the cancel request is sent");
        let e = long.await.expect("task").expect_err("cancelled");
        assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e:?}");
        let n = tokio::time::timeout(Duration::from_secs(30), quick)
            .await
            .expect("the second query runs once the first is done")
            .expect("task")
            .expect("the second query succeeds");
        assert_eq!(n, 3);
    });
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

/// Without a password the server refuses to start unless asked (`--no-auth`), and then only
/// on a loopback address; a query past `--query-memory` fails alone.
#[test]
fn a_password_is_required_unless_no_auth_on_loopback() {
    let p = project();
    let out = p
        .command(&["serve", "--pg", "127.0.0.1:0"])
        .env_remove("STRATA_SERVE_PASSWORD")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(said.contains("STRATA_SERVE_PASSWORD"), "{said}");
    assert!(said.contains("--no-auth"), "{said}");
    let out = p
        .command(&["serve", "--pg", "0.0.0.0:0", "--no-auth"])
        .env_remove("STRATA_SERVE_PASSWORD")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only allowed on a loopback"),
        "{}",
        stderr(&out)
    );

    let server = Server::start(&p, &["--no-auth", "--query-memory", "16MiB"], &[]);
    assert_eq!(
        server.psql_csv("SELECT count(*) AS n FROM orders"),
        "n\n3\n"
    );
    // A query past --query-memory fails with SQLSTATE 53200; the server goes on.
    let out = server.psql_as(
        "",
        &[
            "-v",
            "VERBOSITY=verbose",
            "-c",
            "SELECT cardinality(array_agg(value)) FROM range(10000000)",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("ERROR:  53200: query: Resources exhausted"),
        "{said}"
    );
    assert_eq!(
        server.psql_csv("SELECT count(*) AS n FROM orders"),
        "n\n3\n"
    );
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

/// A Flight SQL client of `server`'s Flight listener (no credentials yet).
async fn flight_client(
    port: u16,
) -> arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    arrow_flight::sql::client::FlightSqlServiceClient::new(channel)
}

/// The rows of every endpoint of `info`, as one pretty table.
async fn flight_rows(
    client: &mut arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>,
    info: arrow_flight::FlightInfo,
) -> String {
    use futures::TryStreamExt;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.expect("a ticket");
        let stream = client.do_get(ticket).await.expect("do_get");
        let got: Vec<_> = stream.try_collect().await.expect("rows");
        batches.extend(got);
    }
    deltalake::arrow::util::pretty::pretty_format_batches(&batches)
        .expect("prints")
        .to_string()
}

/// Flight SQL next to PostgreSQL in one process: a query and a prepared statement with
/// their exact rows (strings as plain Utf8), the tables listed, SqlInfo read-only, writes
/// refused, a wrong password or token refused, the user and password through the handshake
/// and the server's bearer token, one stop for both listeners.
#[test]
fn flight_sql_reads_the_warehouse_and_cannot_write() {
    use arrow_flight::sql::{CommandGetTables, SqlInfo};
    let p = project();
    let token = "t0ken-flight";
    let token_file = p.path("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let server = Server::start_on(
        &p,
        &["--pg", "127.0.0.1:0", "--flight", "127.0.0.1:0"],
        "PostgreSQL clients on 127.0.0.1:",
        &["--token-file", token_file.to_str().unwrap()],
        &[("STRATA_SERVE_PASSWORD", PASSWORD)],
    );
    // The Flight line comes after the PostgreSQL one.
    let deadline = Instant::now() + Duration::from_secs(20);
    let flight_port: u16 = loop {
        let log = server.log();
        if let Some((_, rest)) = log.split_once("Flight SQL clients on 127.0.0.1:") {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            break port.parse().expect("port");
        }
        assert!(Instant::now() < deadline, "no Flight listener: {log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = server.log();
    assert!(log.contains("bearer token, or user and password"), "{log}");
    assert!(!log.contains(PASSWORD) && !log.contains(token), "{log}");
    // Both listeners answer.
    assert_eq!(
        server.psql_csv("SELECT count(*) AS n FROM orders"),
        "n\n3\n"
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // No credentials, a wrong token, a wrong password: refused.
        let mut client = flight_client(flight_port).await;
        let e = client.execute("SELECT 1".into(), None).await.unwrap_err();
        assert!(e.to_string().contains("no credentials"), "{e}");
        client.set_token("wrong".into());
        let e = client.execute("SELECT 1".into(), None).await.unwrap_err();
        assert!(e.to_string().contains("the token is not accepted"), "{e}");
        let mut client = flight_client(flight_port).await;
        let e = client.handshake("strata", "wrong").await.unwrap_err();
        assert!(e.to_string().contains("wrong user or password"), "{e}");

        // The user and password through the handshake: a bearer token back.
        let mut client = flight_client(flight_port).await;
        client
            .handshake("strata", PASSWORD)
            .await
            .expect("handshake");
        assert!(client.token().is_some());
        let info = client
            .execute(
                "SELECT id, name, qty, amount, __START_AT, __END_AT FROM orders \
                 ORDER BY id, __START_AT"
                    .into(),
                None,
            )
            .await
            .expect("execute");
        let schema = info.clone().try_decode_schema().expect("schema");
        assert_eq!(
            schema.field_with_name("name").unwrap().data_type(),
            &deltalake::arrow::datatypes::DataType::Utf8
        );
        assert_eq!(
            flight_rows(&mut client, info).await,
            "+----+--------+-----+--------+------------+----------+\n\
             | id | name   | qty | amount | __START_AT | __END_AT |\n\
             +----+--------+-----+--------+------------+----------+\n\
             | 1  | Isabel | 3   | 123.45 | 1          | 2        |\n\
             | 1  | Isabel | 4   | 200.00 | 2          |          |\n\
             | 2  | Raul   | 1   | -0.05  | 1          |          |\n\
             +----+--------+-----+--------+------------+----------+"
        );

        // The server's token, without a handshake: a prepared statement.
        let mut client = flight_client(flight_port).await;
        client.set_token(token.into());
        let mut prepared = client
            .prepare(
                "SELECT name, qty FROM orders WHERE __END_AT IS NULL ORDER BY id".into(),
                None,
            )
            .await
            .expect("prepare");
        assert_eq!(prepared.dataset_schema().unwrap().field(0).name(), "name");
        let info = prepared.execute().await.expect("execute prepared");
        assert_eq!(
            flight_rows(&mut client, info).await,
            "+--------+-----+\n\
             | name   | qty |\n\
             +--------+-----+\n\
             | Isabel | 4   |\n\
             | Raul   | 1   |\n\
             +--------+-----+"
        );
        prepared.close().await.expect("close");

        // Bound parameters: the values travel in the handle the server hands back.
        let mut prepared = client
            .prepare(
                "SELECT name, qty FROM orders WHERE id = $1 AND qty > $2 ORDER BY qty".into(),
                None,
            )
            .await
            .expect("prepare with parameters");
        let types: Vec<_> = prepared
            .parameter_schema()
            .unwrap()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        use deltalake::arrow::datatypes::DataType;
        assert_eq!(
            types,
            vec![
                ("$1".into(), DataType::Int64),
                ("$2".into(), DataType::Int32)
            ]
        );
        let values = deltalake::arrow::array::RecordBatch::try_from_iter([
            (
                "$1",
                std::sync::Arc::new(deltalake::arrow::array::Int64Array::from(vec![1]))
                    as deltalake::arrow::array::ArrayRef,
            ),
            (
                "$2",
                std::sync::Arc::new(deltalake::arrow::array::Int32Array::from(vec![3])),
            ),
        ])
        .unwrap();
        prepared.set_parameters(values).expect("parameters");
        let info = prepared.execute().await.expect("execute with parameters");
        assert_eq!(
            flight_rows(&mut client, info).await,
            "+--------+-----+\n\
             | name   | qty |\n\
             +--------+-----+\n\
             | Isabel | 4   |\n\
             +--------+-----+"
        );
        prepared.close().await.expect("close");

        // The tables, with their columns.
        let info = client
            .get_tables(CommandGetTables {
                catalog: None,
                db_schema_filter_pattern: None,
                table_name_filter_pattern: Some("orders%".into()),
                table_types: vec![],
                include_schema: false,
            })
            .await
            .expect("get_tables");
        assert_eq!(
            flight_rows(&mut client, info).await,
            "+--------------+----------------+------------+------------+\n\
             | catalog_name | db_schema_name | table_name | table_type |\n\
             +--------------+----------------+------------+------------+\n\
             | main         | default        | orders     | TABLE      |\n\
             | main         | default        | orders_cdc | TABLE      |\n\
             +--------------+----------------+------------+------------+"
        );
        let info = client
            .get_sql_info(vec![
                SqlInfo::FlightSqlServerName,
                SqlInfo::FlightSqlServerReadOnly,
            ])
            .await
            .expect("sql info");
        let shown = flight_rows(&mut client, info).await;
        assert!(
            shown.contains("strata") && shown.contains("true"),
            "{shown}"
        );

        // Writes are refused, by statement and by update.
        let e = client
            .execute("DELETE FROM orders".into(), None)
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("read-only: DELETE is refused"),
            "{e}"
        );
        let e = client
            .execute_update("INSERT INTO orders VALUES (1)".into(), None)
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("read-only: INSERT is refused"),
            "{e}"
        );
        // A mistake is the client's error, and the server goes on.
        let e = client
            .execute("SELECT * FROM no_such_table".into(), None)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no_such_table"), "{e}");
        let info = client
            .execute("SELECT count(*) AS n FROM orders".into(), None)
            .await
            .expect("execute");
        assert!(flight_rows(&mut client, info).await.contains("| 3 |"));
    });
    let log = server.log();
    assert!(log.contains("Flight SQL connection"), "{log}");
    assert!(log.contains("query failed"), "{log}");
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
fn flight_needs_a_token_or_password_unless_no_auth_on_loopback() {
    let p = project();
    let out = p
        .command(&["serve", "--flight", "127.0.0.1:0"])
        .env_remove("STRATA_SERVE_PASSWORD")
        .env_remove("STRATA_SERVE_TOKEN")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(said.contains("STRATA_SERVE_TOKEN"), "{said}");
    assert!(said.contains("--no-auth"), "{said}");
    let server = Server::start_on(
        &p,
        &["--flight", "127.0.0.1:0"],
        "Flight SQL clients on 127.0.0.1:",
        &["--no-auth", "--query-memory", "16MiB"],
        &[],
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use futures::TryStreamExt;
        let mut client = flight_client(server.port).await;
        let info = client
            .execute("SELECT count(*) AS n FROM orders".into(), None)
            .await
            .expect("execute");
        assert!(flight_rows(&mut client, info).await.contains("| 3 |"));
        // A query past --query-memory fails alone (ResourceExhausted); the server goes on.
        let info = client
            .execute(
                "SELECT cardinality(array_agg(value)) FROM range(10000000)".into(),
                None,
            )
            .await
            .expect("planned");
        let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
        let e = match client.do_get(ticket).await {
            Ok(stream) => stream
                .try_collect::<Vec<_>>()
                .await
                .expect_err("past the memory limit")
                .to_string(),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("Resources exhausted"), "{e}");
        let info = client
            .execute("SELECT count(*) AS n FROM orders".into(), None)
            .await
            .expect("execute");
        assert!(flight_rows(&mut client, info).await.contains("| 3 |"));
    });
    assert!(server.log().contains("query failed"), "{}", server.log());
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

/// A test certificate authority, a server certificate it signed (for `localhost` and
/// `127.0.0.1`) with its key, and a second authority that signed nothing of the server's:
/// made by the `openssl` command (Debian's openssl package) in `dir`.
struct Certs {
    ca: std::path::PathBuf,
    other_ca: std::path::PathBuf,
    other_key: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command runs (Debian's openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn certs(p: &Project) -> Certs {
    let dir = p.path("tls");
    std::fs::create_dir_all(&dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, pem, subject) = (
            format!("{ca}.key"),
            format!("{ca}.pem"),
            format!("/CN=strata test {ca}"),
        );
        let mut args = vec!["req", "-x509"];
        args.extend(ec);
        args.extend([
            "-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subject,
        ]);
        openssl(&dir, &args);
    }
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&dir, &args);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    Certs {
        ca: dir.join("ca.pem"),
        other_ca: dir.join("other-ca.pem"),
        other_key: dir.join("other-ca.key"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    }
}

/// `psql` on `server` with the connection string `conninfo` (host, port, user and database
/// given), the password `password`, and `args`.
fn psql_conninfo(
    server: &Server,
    conninfo: &str,
    password: &str,
    args: &[&str],
) -> std::process::Output {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=strata dbname=main {conninfo}",
        server.port
    );
    Command::new("psql")
        .args(["-X", "-v", "ON_ERROR_STOP=1", &conninfo])
        .args(args)
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGSSLMODE")
        .output()
        .expect("psql runs")
}

/// With `--tls-cert` and `--tls-key`, psql verifies the server against the test CA
/// (`sslmode=verify-full`) and queries over TLS 1.3, SCRAM-SHA-256 checking the password;
/// another CA, a client without TLS and a wrong password are refused, each saying why; Ctrl-C
/// in psql still cancels a query (libpq sends the cancel request in the clear).
#[test]
fn psql_over_tls_verifies_the_server_and_scram_checks_the_password() {
    let p = project();
    let certs = certs(&p);
    let (cert, key) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap());
    let server = Server::start(
        &p,
        &["--tls-cert", cert, "--tls-key", key],
        &[("STRATA_SERVE_PASSWORD", PASSWORD)],
    );
    assert!(
        server
            .log()
            .contains("password and TLS required; read-only): psql 'host=127.0.0.1"),
        "{}",
        server.log()
    );
    let verify = format!(
        "sslmode=verify-full sslrootcert={}",
        certs.ca.to_str().unwrap()
    );

    let out = psql_conninfo(
        &server,
        &verify,
        PASSWORD,
        &["--csv", "-c", "SELECT count(*) AS n FROM orders"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n\n3\n");
    // TLS 1.3.
    let out = psql_conninfo(&server, &verify, PASSWORD, &["-c", "\\conninfo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("SSL connection (protocol: TLSv1.3"), "{said}");

    // A server certificate the client's CA did not sign.
    let other = format!(
        "sslmode=verify-full sslrootcert={}",
        certs.other_ca.to_str().unwrap()
    );
    let out = psql_conninfo(&server, &other, PASSWORD, &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("certificate verify failed"),
        "{}",
        stderr(&out)
    );
    // A client that does not ask for TLS.
    let out = psql_conninfo(&server, "sslmode=disable", PASSWORD, &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("strata serve requires TLS on this listener"),
        "{}",
        stderr(&out)
    );
    // A wrong password over TLS.
    let out = psql_conninfo(&server, &verify, "wrong", &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("authentication failed for user \"strata\""),
        "{}",
        stderr(&out)
    );

    // Ctrl-C in psql: libpq sends its cancel request in the clear, which the listener
    // serves though it refuses startups without TLS; the query stops with SQLSTATE 57014.
    let connected = server.log().matches("connected as user").count();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=strata dbname=main {verify}",
        server.port
    );
    let long = Command::new("psql")
        .args(["-X", "-v", "VERBOSITY=verbose", &conninfo])
        .args(["-c", "SELECT count(*) FROM range(1000000000000)"])
        .env("PGPASSWORD", PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.log().matches("connected as user").count() == connected {
        assert!(Instant::now() < deadline, "psql did not connect");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = long.id().to_string();
    let _ = Command::new("kill").args(["-INT", &pid]).status();
    let out = long.wait_with_output().expect("psql ends");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("57014"), "{}", stderr(&out));

    let log = server.log();
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(
        log.contains("connected as user strata (database main, password checked, TLS)"),
        "{log}"
    );
    assert!(
        log.contains("refused: the client did not ask for TLS"),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
}

/// The certificate and key are read before listening: a missing file, a file without a
/// key, a key of another certificate, and one of the pair alone stop the server with the
/// file named.
#[test]
fn tls_files_are_checked_before_listening() {
    let p = project();
    let certs = certs(&p);
    let (cert, key) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap());
    let missing = p.path("tls/nosuch.pem");
    let missing = missing.to_str().unwrap();
    let refused = |extra: &[&str]| {
        let mut args = vec!["serve", "--pg", "127.0.0.1:0", "--flight", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        args.push("--no-auth");
        let out = p
            .command(&args)
            .env_remove("STRATA_SERVE_PASSWORD")
            .env_remove("STRATA_SERVE_TOKEN")
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{extra:?} started");
        stderr(&out)
    };
    let said = refused(&["--tls-cert", missing, "--tls-key", key]);
    assert!(
        said.contains(&format!("cannot read the TLS certificate {missing}")),
        "{said}"
    );
    let said = refused(&["--tls-cert", cert, "--tls-key", missing]);
    assert!(
        said.contains(&format!("cannot read the TLS key {missing}")),
        "{said}"
    );
    let said = refused(&["--tls-cert", cert, "--tls-key", cert]);
    assert!(
        said.contains(&format!("the TLS key {cert} holds no usable private key")),
        "{said}"
    );
    let other_key = certs.other_key.to_str().unwrap();
    let said = refused(&["--tls-cert", cert, "--tls-key", other_key]);
    assert!(
        said.contains(&format!(
            "the TLS key {other_key} does not go with the certificate {cert}"
        )),
        "{said}"
    );
    let said = refused(&["--tls-cert", cert]);
    assert!(said.contains("--tls-key"), "{said}");
}

/// A Flight SQL client of a TLS listener at `port` trusting the CA certificate at `ca`.
async fn flight_tls_client(
    port: u16,
    ca: &std::path::Path,
) -> Result<
    arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel>,
    tonic::transport::Error,
> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let ca = std::fs::read(ca).expect("the CA certificate");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("endpoint")
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(arrow_flight::sql::client::FlightSqlServiceClient::new(
        channel,
    ))
}

/// Flight SQL over TLS: arrow-flight's client trusting the test CA queries with the bearer
/// token; one trusting another CA cannot connect, and a client without TLS gets no answer.
#[test]
fn flight_sql_over_tls() {
    let p = project();
    let certs = certs(&p);
    let (cert, key) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap());
    let token = "t0ken-tls";
    let server = Server::start_on(
        &p,
        &["--flight", "127.0.0.1:0"],
        "Flight SQL clients on 127.0.0.1:",
        &["--tls-cert", cert, "--tls-key", key],
        &[("STRATA_SERVE_TOKEN", token)],
    );
    assert!(
        server
            .log()
            .contains(&format!("grpc+tls://127.0.0.1:{}", server.port)),
        "{}",
        server.log()
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut client = flight_tls_client(server.port, &certs.ca)
            .await
            .expect("connects over TLS");
        client.set_token(token.into());
        let info = client
            .execute("SELECT count(*) AS n FROM orders".into(), None)
            .await
            .expect("execute");
        assert!(flight_rows(&mut client, info).await.contains("| 3 |"));

        // tonic connects lazily on some versions: the refusal may come with the first call.
        let refused = match flight_tls_client(server.port, &certs.other_ca).await {
            Err(e) => format!("{e:?}"),
            Ok(mut client) => {
                client.set_token(token.into());
                format!(
                    "{:?}",
                    client
                        .execute("SELECT 1".into(), None)
                        .await
                        .expect_err("another CA")
                )
            }
        };
        assert!(refused.contains("UnknownIssuer"), "{refused}");

        // A client without TLS: no connection, or no answer to its first call.
        let plain =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.port))
                .expect("endpoint")
                .connect()
                .await;
        if let Ok(channel) = plain {
            let mut plain = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
            plain.set_token(token.into());
            plain
                .execute("SELECT 1".into(), None)
                .await
                .expect_err("a client without TLS");
        }
    });
    let log = server.log();
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(!log.contains(token), "{log}");
}

/// `curl` with `args`: its exit status, its standard output and its standard error.
fn curl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "60"])
        .args(args)
        .output()
        .expect("the curl command runs (Debian's curl package)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_web_page_over_tls() {
    let p = project();
    let certs = certs(&p);
    let (cert, key) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap());
    let password = "s3cret-web-tls";
    let server = Server::start_on(
        &p,
        &["--http", "127.0.0.1:0"],
        "as a web page on 127.0.0.1:",
        &["--tls-cert", cert, "--tls-key", key],
        &[("STRATA_SERVE_PASSWORD", password)],
    );
    assert!(
        server
            .log()
            .contains(&format!("https://127.0.0.1:{}/", server.port)),
        "{}",
        server.log()
    );
    let url = format!(
        "https://localhost:{}/api/tables/default.orders",
        server.port
    );
    let user = format!("strata:{password}");
    let ca = certs.ca.to_str().unwrap();

    // The right authority and the password: the table's page model.
    let (code, body, err) = curl(&["--cacert", ca, "--user", &user, &url]);
    assert_eq!(code, 0, "{err}");
    let table: serde_json::Value = serde_json::from_str(body.trim()).expect("JSON");
    assert_eq!(table["name"], "default.orders", "{body}");
    // Over TLS, the password is still asked for.
    let (code, body, err) = curl(&["--cacert", ca, "--write-out", "%{http_code}", &url]);
    assert_eq!((code, body.ends_with("401")), (0, true), "{body} {err}");
    // Another authority: curl refuses the certificate (exit 60).
    let other = certs.other_ca.to_str().unwrap();
    let (code, _, err) = curl(&["--cacert", other, "--user", &user, &url]);
    assert_eq!(code, 60, "{err}");
    // Plain HTTP gets no page.
    let plain = format!("http://127.0.0.1:{}/api/tables/default.orders", server.port);
    let (code, body, _) = curl(&["--user", &user, &plain]);
    assert!(code != 0 && !body.contains("orders"), "{code} {body}");
    let log = server.log_with("TLS handshake failed");
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(!log.contains(password), "{log}");
}
