//! What a client sent, before anything runs: the statements of a query text and what kind
//! each is (pure: no I/O). The server reads (queries, `DESCRIBE`, `SHOW TABLES`), keeps a
//! connection's settings (`USE`, `SET`, `SHOW`, transactions) and refuses everything that
//! would write.

use deltalake::datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use deltalake::datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// What a statement asks of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A query, `DESCRIBE`, `SHOW TABLES`, `EXPLAIN`: read through `strata query`'s path.
    /// Anything not recognised is read too, so that the SQL parser names its mistake.
    Read,
    /// `USE [CATALOG|SCHEMA] name`: the connection's schema of unqualified names.
    Use,
    /// `SET`, `SHOW name`, `RESET`, `DISCARD`, `BEGIN`, `COMMIT`, `ROLLBACK`: a connection
    /// setting or a transaction boundary, answered without reading the warehouse.
    Session,
    /// A statement that would write or change the warehouse (or that the server does not
    /// keep, like cursors): refused with its kind (`INSERT`, `CREATE TABLE`).
    Refused(String),
}

/// The statements of `text` (split at `;` outside strings, quoted names and comments),
/// each without its `;`, empty ones left out. Text that does not tokenize is one
/// statement, for the parser to report.
pub(crate) fn split_statements(text: &str) -> Vec<String> {
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, text).tokenize() else {
        return vec![text.trim().to_string()];
    };
    let mut out = Vec::new();
    let mut current = String::new();
    for token in tokens {
        if token == Token::SemiColon {
            out.push(std::mem::take(&mut current));
        } else {
            current.push_str(&token.to_string());
        }
    }
    out.push(current);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The kind of one statement, from its first words.
pub(crate) fn kind_of(statement: &str) -> Kind {
    let words = first_words(statement, 6);
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    match word(0) {
        "USE" => Kind::Use,
        "SHOW" if matches!(word(1), "TABLES") => Kind::Read,
        "SET" | "SHOW" | "RESET" | "DISCARD" | "BEGIN" | "START" | "COMMIT" | "END"
        | "ROLLBACK" | "ABORT" => Kind::Session,
        "CREATE" | "DROP" | "ALTER" => Kind::Refused(ddl_kind(&words)),
        "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "TRUNCATE" | "COPY" | "GRANT" | "REVOKE"
        | "VACUUM" | "OPTIMIZE" | "ANALYZE" | "REFRESH" | "COMMENT" | "LOCK" | "CLUSTER"
        | "REINDEX" | "CALL" | "DO" | "LOAD" | "PREPARE" | "EXECUTE" | "DEALLOCATE" | "DECLARE"
        | "FETCH" | "MOVE" | "CLOSE" | "LISTEN" | "NOTIFY" | "UNLISTEN" | "CHECKPOINT"
        | "REASSIGN" | "SECURITY" | "IMPORT" | "RESTORE" | "UNDROP" => {
            Kind::Refused(word(0).to_string())
        }
        _ => Kind::Read,
    }
}

/// `CREATE TABLE`, `DROP VIEW`, `CREATE OR REPLACE VIEW` -> `CREATE VIEW`: the statement and
/// what it creates, drops or alters.
fn ddl_kind(words: &[String]) -> String {
    let object = words[1..].iter().find(|w| {
        !matches!(
            w.as_str(),
            "OR" | "REPLACE" | "TEMP" | "TEMPORARY" | "EXTERNAL"
        )
    });
    match object {
        Some(o) => format!("{} {o}", words[0]),
        None => words[0].clone(),
    }
}

/// The first `n` words of `statement` (keywords and names, upper-cased); comments and
/// punctuation (an opening parenthesis) are not words.
pub(crate) fn first_words(statement: &str, n: usize) -> Vec<String> {
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, statement).tokenize() else {
        return Vec::new();
    };
    tokens
        .into_iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.value.to_ascii_uppercase()),
            _ => None,
        })
        .take(n)
        .collect()
}

/// The error for a refused statement of kind `kind`.
pub(crate) fn refusal(kind: &str) -> String {
    let why = match kind {
        "DECLARE" | "FETCH" | "MOVE" | "CLOSE" => "cursors are not kept; run the query itself",
        "PREPARE" | "EXECUTE" | "DEALLOCATE" => {
            "SQL-level prepared statements are not kept; use the client's prepared statements \
             (the extended query protocol)"
        }
        _ => "the warehouse changes only through `strata run`",
    };
    format!("strata serve is read-only: {kind} is refused ({why})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_strings_names_and_comments() {
        assert_eq!(
            split_statements("SELECT 'a;b' AS \"x;y\"; -- c;d\nSELECT 2;;  "),
            vec!["SELECT 'a;b' AS \"x;y\"", "-- c;d\nSELECT 2"]
        );
        assert_eq!(split_statements("  ;  "), Vec::<String>::new());
        assert_eq!(
            split_statements("SELECT $$a;b$$"),
            vec!["SELECT $$a;b$$".to_string()]
        );
        // Unbalanced quotes: one statement, for the parser to report.
        assert_eq!(split_statements("SELECT 'a; 1"), vec!["SELECT 'a; 1"]);
    }

    #[test]
    fn reads_settings_and_writes_are_told_apart() {
        for read in [
            "SELECT 1",
            "with t as (select 1) select * from t",
            "(SELECT 1)",
            "DESCRIBE users",
            "DESCRIBE HISTORY users",
            "SHOW TABLES",
            "show tables in default",
            "EXPLAIN SELECT 1",
            "VALUES (1)",
            "SELEC 1",
            "/* hi */ SELECT 1",
        ] {
            assert_eq!(kind_of(read), Kind::Read, "{read}");
        }
        for session in [
            "SET extra_float_digits = 3",
            "SHOW search_path",
            "BEGIN",
            "commit",
            "ROLLBACK",
            "START TRANSACTION READ ONLY",
            "DISCARD ALL",
            "RESET ALL",
        ] {
            assert_eq!(kind_of(session), Kind::Session, "{session}");
        }
        assert_eq!(kind_of("USE gold"), Kind::Use);
        let refused = |s: &str| match kind_of(s) {
            Kind::Refused(k) => k,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(refused("insert into users values (1)"), "INSERT");
        assert_eq!(refused("UPDATE users SET name = 'x'"), "UPDATE");
        assert_eq!(refused("DELETE FROM users"), "DELETE");
        assert_eq!(refused("CREATE TABLE t (a INT)"), "CREATE TABLE");
        assert_eq!(
            refused("create or replace view v as select 1"),
            "CREATE VIEW"
        );
        assert_eq!(refused("DROP TABLE users"), "DROP TABLE");
        assert_eq!(refused("ALTER TABLE users ADD COLUMN x INT"), "ALTER TABLE");
        assert_eq!(refused("COPY users TO STDOUT"), "COPY");
        assert_eq!(refused("TRUNCATE users"), "TRUNCATE");
        assert_eq!(refused("DECLARE c CURSOR FOR SELECT 1"), "DECLARE");
    }

    #[test]
    fn a_refusal_names_the_statement() {
        let m = refusal("INSERT");
        assert!(m.contains("read-only: INSERT is refused"), "{m}");
        assert!(refusal("FETCH").contains("cursors"));
    }
}
