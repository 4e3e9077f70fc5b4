//! The test databases `scripts/services/with-services.sh` starts, for the tests that run
//! `read_database` pipelines: the servers' facts, seeding them, and running the binary with
//! the password in `SHOP_PW` only.

use std::path::Path;

use super::{stderr, stdout, Project};

/// One of the test servers, from the variables with-services.sh exports; the test fails
/// (it does not skip) when they are missing.
#[derive(Clone, Debug)]
pub struct Server {
    pub host: String,
    pub port: String,
    pub database: String,
    pub user: String,
    pub password: String,
    /// More options of the connections [`Server::connection`] declares (TLS).
    pub options: Vec<(String, String)>,
}

/// A variable with-services.sh exports, `{prefix}_{name}`; the test fails when it is missing.
pub fn fact(prefix: &str, name: &str) -> String {
    let key = format!("{prefix}_{name}");
    std::env::var(&key).unwrap_or_else(|_| {
        panic!(
            "{key} is not set: run the tests under scripts/services/with-services.sh \
             (the README's test command does)"
        )
    })
}

impl Server {
    pub fn from_env(prefix: &str) -> Server {
        Server {
            host: fact(prefix, "HOST"),
            port: fact(prefix, "PORT"),
            database: fact(prefix, "DATABASE"),
            user: fact(prefix, "USER"),
            password: fact(prefix, "PASSWORD"),
            options: vec![],
        }
    }

    /// The same server as its TLS-only user (`{prefix}_TLS_USER`, which it accepts only over
    /// TLS; its certificate names `localhost`), reached at `host`, with these options (TLS
    /// modes and CA files) in the connections the pipelines declare.
    pub fn tls_from_env(prefix: &str, host: &str, options: &[(&str, &str)]) -> Server {
        Server {
            host: host.to_string(),
            user: fact(prefix, "TLS_USER"),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Server::from_env(prefix)
        }
    }

    /// The same server as its client-certificate user (`{prefix}_CERT_USER`, which it accepts
    /// only over TLS with the certificate the test CA signed for it), reached at `host`, with
    /// these options.
    pub fn cert_from_env(prefix: &str, host: &str, options: &[(&str, &str)]) -> Server {
        Server {
            user: fact(prefix, "CERT_USER"),
            ..Server::tls_from_env(prefix, host, options)
        }
    }

    /// The libpq connection string of this server's user, without TLS (tokio-postgres's
    /// `NoTls`).
    pub fn dsn(&self) -> String {
        format!(
            "host={} port={} dbname={} user={} password={}",
            self.host, self.port, self.database, self.user, self.password
        )
    }

    /// `CREATE CONNECTION shop TYPE kind OPTIONS (...)` with the password in `SHOP_PW`.
    pub fn connection(&self, kind: &str) -> String {
        let more: String = self
            .options
            .iter()
            .map(|(k, v)| format!(", {k} '{v}'"))
            .collect();
        format!(
            "CREATE CONNECTION shop TYPE {kind} OPTIONS (host '{}', port '{}', database '{}', \
             user '{}', password_env 'SHOP_PW'{more});\n",
            self.host, self.port, self.database, self.user
        )
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A plain (no TLS) tokio-postgres client of the test PostgreSQL as `server`'s user.
async fn pg_client(server: &Server) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, conn) = tokio_postgres::connect(&server.dsn(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, task)
}

/// Runs `sql` (statements separated by `;`) on the test PostgreSQL.
pub fn pg(server: &Server, sql: &str) {
    runtime().block_on(async {
        let (client, task) = pg_client(server).await;
        client.batch_execute(sql).await.expect("seed PostgreSQL");
        drop(client);
        let _ = task.await;
    });
}

/// The value of a one-row, one-column query on the test PostgreSQL.
pub fn pg_value(server: &Server, sql: &str) -> Option<String> {
    runtime().block_on(async {
        let (client, task) = pg_client(server).await;
        let row = client.query_opt(sql, &[]).await.expect("query");
        drop(client);
        let _ = task.await;
        row.and_then(|r| r.get::<_, Option<String>>(0))
    })
}

/// Drops replication slot `slot` once no walsender holds it: PostgreSQL ends a finished run's
/// walsender shortly after the client leaves, so a drop right after a run can find the slot
/// still active. Waits up to 30 s for the slot to be released, then drops it (an error if
/// it is still held then, or does not exist).
pub fn drop_slot(server: &Server, slot: &str) {
    pg(
        server,
        &format!(
            "DO $$ BEGIN
               FOR i IN 1..300 LOOP
                 EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_replication_slots
                                       WHERE slot_name = '{slot}' AND active);
                 PERFORM pg_sleep(0.1);
               END LOOP;
               PERFORM pg_drop_replication_slot('{slot}');
             END $$"
        ),
    );
}

/// Runs `sql` (one statement per entry) on the test MariaDB.
pub fn mysql(server: &Server, statements: &[&str]) {
    use mysql_async::prelude::Queryable;
    runtime().block_on(async {
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname(server.host.clone())
            .tcp_port(server.port.parse().expect("port"))
            .db_name(Some(server.database.clone()))
            .user(Some(server.user.clone()))
            .pass(Some(server.password.clone()));
        let mut conn = mysql_async::Conn::new(opts)
            .await
            .expect("connect to MariaDB");
        for s in statements {
            conn.query_drop(*s).await.expect("seed MariaDB");
        }
        conn.disconnect().await.expect("disconnect");
    });
}

/// A table name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", super::unique_suffix())
}

/// `strata run` with the password in `SHOP_PW` only (the client's own variables removed).
pub fn run(p: &Project, password: &str) -> std::process::Output {
    run_with(p, password, &[])
}

/// `strata run pipeline.sql ARGS` with the password in `SHOP_PW` only.
pub fn run_with(p: &Project, password: &str, args: &[&str]) -> std::process::Output {
    p.command(&[&["run", "pipeline.sql"], args].concat())
        .env("SHOP_PW", password)
        .env_remove("PGPASSWORD")
        .env_remove("MYSQL_PWD")
        .output()
        .expect("strata runs")
}

/// `strata run pipeline.sql --full-refresh TABLES`, which must succeed.
pub fn full_refresh_ok(p: &Project, password: &str, tables: &str) {
    let out = run_with(p, password, &["--full-refresh", tables]);
    assert!(
        out.status.success(),
        "full refresh failed: {}",
        stderr(&out)
    );
}

pub fn run_ok(p: &Project, password: &str) -> String {
    let out = run(p, password);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    stdout(&out) + &stderr(&out)
}

/// The number of commits in a table's log.
pub fn commits(table_dir: &Path) -> usize {
    std::fs::read_dir(table_dir.join("_delta_log"))
        .expect("log")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".json"))
        })
        .count()
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

/// A pipeline reading `table`'s change log through `slot` (and `options`) into the change
/// table `{name}_changes`, applied to the SCD2 target `name` by key `id`.
pub fn cdc_history(server: &Server, name: &str, table: &str, slot: &str, options: &str) -> Project {
    Project::new(&format!(
        "{}CREATE STREAMING TABLE {name}_changes AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}'{options});
CREATE STREAMING TABLE {name};
CREATE FLOW {name}_flow AS AUTO CDC INTO {name} FROM STREAM({name}_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols)
STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ))
}
