//! Which database a connection talks to: shared by connection specs (`conn.rs`) and TLS
//! settings (`tls.rs`).

use std::fmt;

/// Which database a connection talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// PostgreSQL (10+; log-based CDC needs 15+ for the tested path, binary pgoutput needs 14+).
    Postgres,
    /// MySQL 5.7+/8 or MariaDB 10.3+.
    Mysql,
}

impl SourceKind {
    /// `PostgreSQL` / `MySQL`.
    pub fn label(self) -> &'static str {
        match self {
            SourceKind::Postgres => "PostgreSQL",
            SourceKind::Mysql => "MySQL",
        }
    }

    /// 5432 / 3306.
    pub fn default_port(self) -> u16 {
        match self {
            SourceKind::Postgres => 5432,
            SourceKind::Mysql => 3306,
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::Postgres => "postgresql",
            SourceKind::Mysql => "mysql",
        })
    }
}
