//! What a read names: a table (`schema.table`) or a query, and how each dialect quotes
//! identifiers. The vocabulary below both the watermark reads and log-based CDC.

use std::fmt;

use crate::error::{Result, SourceError};

/// A table name, `schema.table` (PostgreSQL schema; MySQL database) or just `table` (the
/// connection's default schema / database). Names are taken as written (case-sensitive) and
/// always quoted in generated SQL; a part may be written double-quoted to contain a dot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    /// Schema (PostgreSQL) or database (MySQL); `None` = default.
    pub schema: Option<String>,
    /// Table name.
    pub name: String,
}

impl TableRef {
    /// A table in a schema.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        TableRef {
            schema: Some(schema.into()),
            name: name.into(),
        }
    }

    /// Parse `schema.table`, `table`, `"my.schema"."Table"`.
    pub fn parse(text: &str) -> std::result::Result<TableRef, String> {
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut chars = text.trim().chars().peekable();
        let mut quoted_part = false;
        while let Some(c) = chars.next() {
            match c {
                '"' | '`' => {
                    quoted_part = true;
                    let close = c;
                    loop {
                        match chars.next() {
                            Some(x) if x == close => {
                                if chars.peek() == Some(&close) {
                                    chars.next();
                                    cur.push(close);
                                } else {
                                    break;
                                }
                            }
                            Some(x) => cur.push(x),
                            None => return Err(format!("unclosed quote in table name '{text}'")),
                        }
                    }
                }
                '.' => {
                    parts.push(std::mem::take(&mut cur));
                    quoted_part = false;
                }
                c => cur.push(c),
            }
        }
        let _ = quoted_part;
        parts.push(cur);
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "'{text}' is not a table name (expected schema.table or table)"
            ));
        }
        match parts.len() {
            1 => Ok(TableRef {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.pop().unwrap_or_default();
                Ok(TableRef {
                    schema: parts.pop(),
                    name,
                })
            }
            _ => Err(format!(
                "'{text}' is not a table name (expected schema.table or table)"
            )),
        }
    }

    pub(crate) fn pg_sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", pg_ident(s), pg_ident(&self.name)),
            None => pg_ident(&self.name),
        }
    }

    pub(crate) fn mysql_sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", mysql_ident(s), mysql_ident(&self.name)),
            None => mysql_ident(&self.name),
        }
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

pub(crate) fn pg_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

pub(crate) fn mysql_ident(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// What to read: a table, or a query (its result columns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceObject {
    /// A table.
    Table(TableRef),
    /// A `SELECT` (no trailing semicolon needed); read as `SELECT ... FROM (query) AS q`.
    Query(String),
}

impl SourceObject {
    /// Parse a `schema.table` name.
    pub fn table(text: &str) -> Result<SourceObject> {
        TableRef::parse(text)
            .map(SourceObject::Table)
            .map_err(|detail| SourceError::Watermark { detail })
    }

    /// How errors name it.
    pub fn label(&self) -> String {
        match self {
            SourceObject::Table(t) => format!("table {t}"),
            SourceObject::Query(_) => "query".to_string(),
        }
    }

    pub(crate) fn query_body(q: &str) -> &str {
        q.trim().trim_end_matches(';').trim_end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(
            TableRef::parse("public.users").unwrap(),
            TableRef::new("public", "users")
        );
        assert_eq!(
            TableRef::parse("users").unwrap(),
            TableRef {
                schema: None,
                name: "users".into()
            }
        );
        assert_eq!(
            TableRef::parse("\"my.schema\".\"Odd\"\"Name\"").unwrap(),
            TableRef::new("my.schema", "Odd\"Name")
        );
        assert_eq!(
            TableRef::parse("`db`.`t`").unwrap(),
            TableRef::new("db", "t")
        );
        assert!(TableRef::parse("a.b.c").is_err());
        assert!(TableRef::parse("a.").is_err());
        assert!(TableRef::parse("\"a").is_err());
        assert_eq!(TableRef::new("s", "t\"x").pg_sql(), "\"s\".\"t\"\"x\"");
        assert_eq!(TableRef::new("s", "t`x").mysql_sql(), "`s`.`t``x`");
    }
}
