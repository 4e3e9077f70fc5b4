//! `CREATE CONNECTION name TYPE postgresql|mysql OPTIONS (...)` → a [`ConnectionSpec`].
//!
//! Passwords never appear in pipeline text: a `password` option is refused, and the
//! password comes from the environment variable `password_env` names, else from the
//! client's usual places (`PGPASSWORD`, `~/.pgpass`; `MYSQL_PWD`, `~/.my.cnf`), as
//! `strata-sources` looks them up.

use crate::error::{EngineError, Result};
use strata_sources::{ConnectionSpec, Secret, SourceKind};
use strata_sql::Connection;

/// The options a connection takes besides the driver options `strata-sources` checks.
const OWN_OPTIONS: [&str; 5] = ["host", "port", "database", "user", "password_env"];

/// Where this process finds the value of an environment variable (the test seam: a
/// closure over a map, or the process's environment).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The spec `strata-sources` connects with, its password read from `env` when the
/// connection names a variable. Errors name the connection, its line and the option.
pub(crate) fn connection_spec(c: &Connection, env: Env<'_>) -> Result<ConnectionSpec> {
    let err =
        |msg: String| EngineError::plan_at(format!("connection {}", c.name), c.location.line, msg);
    let kind = match c.kind.as_str() {
        "postgresql" | "postgres" => SourceKind::Postgres,
        "mysql" | "mariadb" => SourceKind::Mysql,
        other => {
            return Err(err(format!(
                "unknown TYPE {other}: strata reads postgresql and mysql (MySQL and MariaDB)"
            )))
        }
    };
    if c.options.contains_key("password") {
        return Err(err(
            "a password is never written in pipeline text: name the environment variable \
             that holds it with password_env 'VARIABLE', or leave it to PGPASSWORD / \
             ~/.pgpass (PostgreSQL) or MYSQL_PWD / ~/.my.cnf (MySQL)"
                .to_string(),
        ));
    }
    let option = |name: &str| c.options.get(name).map(String::as_str);
    let required =
        |name: &str| option(name).ok_or_else(|| err(format!("the option {name} is missing")));
    let mut spec = ConnectionSpec::new(
        &c.name,
        kind,
        option("host").unwrap_or("localhost"),
        required("database")?,
        required("user")?,
    );
    if let Some(port) = option("port") {
        let port = port
            .parse::<u16>()
            .map_err(|_| err(format!("port '{port}' is not a port number")))?;
        spec = spec.with_port(port);
    }
    if let Some(var) = option("password_env") {
        let value = env(var).ok_or_else(|| {
            err(format!(
                "password_env names the environment variable {var}, which is not set"
            ))
        })?;
        spec = spec.with_password(Secret::new(value));
    }
    for (k, v) in &c.options {
        if !OWN_OPTIONS.contains(&k.as_str()) {
            spec = spec.with_option(k, v);
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(kind: &str, options: &[(&str, &str)]) -> Connection {
        Connection {
            name: "shop".into(),
            kind: kind.into(),
            options: strata_sql::string_map(options),
            location: strata_sql::Location { line: 3, column: 1 },
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn options_become_the_spec_and_the_password_comes_from_the_named_variable() {
        let c = conn(
            "postgresql",
            &[
                ("host", "db"),
                ("port", "6543"),
                ("database", "shop"),
                ("user", "etl"),
                ("password_env", "SHOP_PW"),
                ("sslmode", "disable"),
            ],
        );
        let env = |n: &str| (n == "SHOP_PW").then(|| "s3cret".to_string());
        let spec = connection_spec(&c, &env).unwrap();
        assert_eq!(spec.kind, SourceKind::Postgres);
        assert_eq!((spec.host.as_str(), spec.port()), ("db", 6543));
        assert_eq!(spec.password.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(
            spec.options.get("sslmode").map(String::as_str),
            Some("disable")
        );
        assert!(!format!("{spec:?}").contains("s3cret"));
    }

    #[test]
    fn a_written_password_an_unset_variable_and_a_bad_type_are_refused_by_name() {
        let pw = conn(
            "mysql",
            &[("database", "d"), ("user", "u"), ("password", "x")],
        );
        let e = connection_spec(&pw, &no_env).unwrap_err().to_string();
        assert!(
            e.contains("connection shop") && e.contains("password_env"),
            "{e}"
        );
        assert!(!e.contains("'x'"), "{e}");
        let unset = conn(
            "mysql",
            &[("database", "d"), ("user", "u"), ("password_env", "NOPE")],
        );
        let e = connection_spec(&unset, &no_env).unwrap_err().to_string();
        assert!(e.contains("NOPE") && e.contains("not set"), "{e}");
        let e = connection_spec(&conn("oracle", &[]), &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown TYPE oracle"), "{e}");
        let e = connection_spec(&conn("mariadb", &[("user", "u")]), &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("database is missing"), "{e}");
    }
}
