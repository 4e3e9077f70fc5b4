//! Shared helpers for the database tests: connection specs from the environment that
//! `scripts/services/with-services.sh` exports, unique object names, admin connections.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use arrow_array::{Array, RecordBatch};
use strata_sources::{ConnectionSpec, Secret, SourceKind};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test (or test run) uses: prefix + pid + counter + time.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 100_000)
        .unwrap_or(0);
    format!("{prefix}_{}_{n}_{t}", std::process::id())
}

fn skip_or_fail(what: &str, var: &str) -> bool {
    if std::env::var("STRATA_SKIP_DB_TESTS").as_deref() == Ok("1") {
        // Straight to the process's stderr: the test harness captures eprintln! of passing
        // tests, and this must be seen.
        use std::io::Write;
        let msg = format!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !!! STRATA_SKIP_DB_TESTS=1: a {what} test was SKIPPED ({var} is not set).\n\
             !!! NOTHING WAS TESTED against {what}.\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        let _ = std::io::stderr().write_all(msg.as_bytes());
        return true;
    }
    panic!(
        "{var} is not set: this test needs a real {what}. Run the tests under \
         scripts/services/with-services.sh (e.g. `scripts/services/with-services.sh cargo test -p strata-sources`), \
         or set STRATA_SKIP_DB_TESTS=1 to skip the database tests explicitly."
    );
}

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set (with-services.sh sets it)"))
}

/// The test PostgreSQL, with the password passed explicitly (as the engine would), or
/// `None` when skipping.
pub fn pg_spec(name: &str) -> Option<ConnectionSpec> {
    if std::env::var("STRATA_TEST_PG_HOST").is_err() {
        skip_or_fail("PostgreSQL", "STRATA_TEST_PG_HOST");
        return None;
    }
    Some(
        ConnectionSpec::new(
            name,
            SourceKind::Postgres,
            env("STRATA_TEST_PG_HOST"),
            env("STRATA_TEST_PG_DATABASE"),
            env("STRATA_TEST_PG_USER"),
        )
        .with_port(env("STRATA_TEST_PG_PORT").parse().expect("port"))
        .with_password(Secret::new(env("STRATA_TEST_PG_PASSWORD"))),
    )
}

/// The test MariaDB, password passed explicitly, or `None` when skipping.
pub fn mysql_spec(name: &str) -> Option<ConnectionSpec> {
    if std::env::var("STRATA_TEST_MYSQL_HOST").is_err() {
        skip_or_fail("MySQL/MariaDB", "STRATA_TEST_MYSQL_HOST");
        return None;
    }
    Some(
        ConnectionSpec::new(
            name,
            SourceKind::Mysql,
            env("STRATA_TEST_MYSQL_HOST"),
            env("STRATA_TEST_MYSQL_DATABASE"),
            env("STRATA_TEST_MYSQL_USER"),
        )
        .with_port(env("STRATA_TEST_MYSQL_PORT").parse().expect("port"))
        .with_password(Secret::new(env("STRATA_TEST_MYSQL_PASSWORD"))),
    )
}

/// A variable with-services.sh exports (the services' facts), e.g. the test CA's file.
pub fn service_var(var: &str) -> String {
    env(var)
}

/// The test PostgreSQL as its TLS-only user (`STRATA_TEST_PG_TLS_USER`: pg_hba rejects it
/// without TLS), at `host` (the certificate names `localhost`, not `127.0.0.1`), with these
/// options; `None` when skipping.
pub fn pg_tls_spec(name: &str, host: &str, options: &[(&str, &str)]) -> Option<ConnectionSpec> {
    let mut spec = pg_spec(name)?;
    spec.user = env("STRATA_TEST_PG_TLS_USER");
    spec.host = host.to_string();
    for (k, v) in options {
        spec = spec.with_option(*k, *v);
    }
    Some(spec)
}

/// The test MariaDB as its TLS-only user (`STRATA_TEST_MYSQL_TLS_USER`, created REQUIRE SSL),
/// at `host`, with these options; `None` when skipping.
pub fn mysql_tls_spec(name: &str, host: &str, options: &[(&str, &str)]) -> Option<ConnectionSpec> {
    let mut spec = mysql_spec(name)?;
    spec.user = env("STRATA_TEST_MYSQL_TLS_USER");
    spec.host = host.to_string();
    for (k, v) in options {
        spec = spec.with_option(*k, *v);
    }
    Some(spec)
}

/// Drops the test's slot and publication when the test ends (also when it fails), so a
/// failing test does not keep WAL or slot capacity.
pub struct Cleanup {
    pub slot: String,
    pub publication: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let slot = self.slot.clone();
        let publication = self.publication.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let admin = pg_admin().await;
                let _ = admin
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
                        &[&slot],
                    )
                    .await;
                let _ = admin.batch_execute(&format!("DROP PUBLICATION IF EXISTS {publication}")).await;
            });
        })
        .join();
    }
}

/// A plain tokio-postgres client for setting tests up.
pub async fn pg_admin() -> tokio_postgres::Client {
    let url = env("STRATA_TEST_PG_URL");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A plain mysql_async connection for setting tests up.
pub async fn mysql_admin() -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&env("STRATA_TEST_MYSQL_URL")).expect("url");
    let mut c = mysql_async::Conn::new(opts)
        .await
        .expect("connect to the test MariaDB");
    use mysql_async::prelude::Queryable;
    c.query_drop("SET time_zone = '+00:00'").await.unwrap();
    c
}

/// Rows of batches as strings (via Arrow's display), column by column, for comparisons.
pub fn rows(batches: &[RecordBatch], columns: &[&str]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        let cols: Vec<_> = columns
            .iter()
            .map(|c| {
                b.column_by_name(c)
                    .unwrap_or_else(|| panic!("no column {c}"))
                    .clone()
            })
            .collect();
        for r in 0..b.num_rows() {
            out.push(
                cols.iter()
                    .map(|a| {
                        if a.is_null(r) {
                            "NULL".to_string()
                        } else {
                            arrow_cast_display(a.as_ref(), r)
                        }
                    })
                    .collect(),
            );
        }
    }
    out
}

/// A cell as text.
/// A value as [`arrow_cast_display`] writes it, `NULL` for a NULL (nested values too).
pub fn value_text(a: &dyn Array, r: usize) -> String {
    if a.is_null(r) {
        "NULL".to_string()
    } else {
        arrow_cast_display(a, r)
    }
}

pub fn arrow_cast_display(a: &dyn Array, r: usize) -> String {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    use arrow_schema::{DataType, TimeUnit};
    match a.data_type() {
        DataType::Boolean => a.as_boolean().value(r).to_string(),
        DataType::Int8 => a.as_primitive::<Int8Type>().value(r).to_string(),
        DataType::Int16 => a.as_primitive::<Int16Type>().value(r).to_string(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(r).to_string(),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(r).to_string(),
        DataType::Float32 => a.as_primitive::<Float32Type>().value(r).to_string(),
        DataType::Float64 => a.as_primitive::<Float64Type>().value(r).to_string(),
        DataType::Decimal128(_, s) => {
            let v = a.as_primitive::<Decimal128Type>().value(r);
            format!("{v}e-{s}")
        }
        DataType::Utf8 => a.as_string::<i32>().value(r).to_string(),
        DataType::Binary => format!("{:02x?}", a.as_binary::<i32>().value(r)),
        DataType::Date32 => a.as_primitive::<Date32Type>().value(r).to_string(),
        DataType::Timestamp(TimeUnit::Microsecond, _) => a
            .as_primitive::<TimestampMicrosecondType>()
            .value(r)
            .to_string(),
        DataType::List(_) => {
            let l = a.as_list::<i32>().value(r);
            format!(
                "[{}]",
                (0..l.len())
                    .map(|i| value_text(l.as_ref(), i))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            format!(
                "{{{}}}",
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| format!("{}: {}", f.name(), value_text(c.as_ref(), r)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        DataType::Map(..) => {
            let m = a.as_map().value(r);
            format!(
                "{{{}}}",
                (0..m.len())
                    .map(|i| format!(
                        "{}: {}",
                        value_text(m.column(0).as_ref(), i),
                        value_text(m.column(1).as_ref(), i)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        other => format!("<{other}>"),
    }
}
