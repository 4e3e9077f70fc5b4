//! Parser tests: the documented example, the Spark lexical rules, every accepted spelling,
//! and the position and wording of syntax errors.

use arrow_schema::DataType;
use std::collections::BTreeMap;
use strata_sql::*;

const EXAMPLE: &str = r#"CREATE OR REFRESH STREAMING TABLE users_cdc
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
                                   schema => 'userId INT, name STRING, city STRING, operation STRING, sequenceNum INT');

CREATE OR REFRESH STREAMING TABLE users;

CREATE FLOW users_flow AS AUTO CDC INTO users
FROM STREAM(users_cdc)
KEYS (userId)
APPLY AS DELETE WHEN operation = "DELETE"
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 2
TRACK HISTORY ON * EXCEPT (city);
"#;

fn loc(line: u64, column: u64) -> Location {
    Location { line, column }
}

fn col(name: &str, data_type: DataType) -> ColumnDef {
    ColumnDef::new(name, data_type)
}

fn parse(text: &str) -> Pipeline {
    match parse_pipeline(text) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn only_flow(text: &str) -> CdcFlow {
    let p = parse(text);
    match p.statements.into_iter().last() {
        Some(Statement::Flow(f)) => {
            let mut exprs: Vec<&String> = f.delete_when.iter().chain(&f.truncate_when).collect();
            match &f.sequence_by {
                SequenceBy::Expr(e) => exprs.push(e),
                SequenceBy::Struct(fields) => exprs.extend(fields.iter().map(|(_, e)| e)),
            }
            for e in exprs {
                assert_reparses(&format!("SELECT {e}"));
            }
            f
        }
        other => panic!("expected a flow, got {other:?}"),
    }
}

fn only_table(text: &str) -> StreamingTable {
    let p = parse(text);
    match p.statements.into_iter().next() {
        Some(Statement::StreamingTable(t)) => {
            if let Some(q) = &t.query {
                assert_reparses(&q.sql);
            }
            t
        }
        other => panic!("expected a table, got {other:?}"),
    }
}

/// The syntax error for `text`: (line, column, message, snippet).
fn syntax_error(text: &str) -> (u64, u64, String, String) {
    match parse_pipeline(text) {
        Err(SqlError::Syntax {
            location,
            message,
            snippet,
        }) => (location.line, location.column, message, snippet),
        other => panic!("expected a syntax error for {text:?}, got {other:?}"),
    }
}

/// The SQL handed to the engine must read back in DataFusion's default dialect.
fn assert_reparses(sql: &str) {
    use sqlparser::{dialect::GenericDialect, parser::Parser};
    if let Err(e) = Parser::parse_sql(&GenericDialect {}, sql) {
        panic!("{sql:?} does not parse back: {e}");
    }
}

fn flow_with(clauses: &str) -> String {
    format!("CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (id) {clauses}")
}

#[test]
fn documented_example_parses_exactly() {
    let expected = Pipeline {
        statements: vec![
            Statement::StreamingTable(StreamingTable {
                expectations: Vec::new(),
                name: TableName::new(None, "users_cdc"),
                columns: None,
                comment: None,
                properties: BTreeMap::new(),
                partitioned_by: Vec::new(),
                cluster_by: Vec::new(),
                query: Some(SourceQuery {
                    sql: "SELECT * FROM __strata_source".to_string(),
                    source: QuerySource::ReadFiles(ReadFiles {
                        path: "data/cdc".to_string(),
                        format: FileFormat::Json,
                        schema: Some(vec![
                            col("userId", DataType::Int32),
                            col("name", DataType::Utf8),
                            col("city", DataType::Utf8),
                            col("operation", DataType::Utf8),
                            col("sequenceNum", DataType::Int32),
                        ]),
                        header: false,
                        delimiter: b',',
                        other_options: BTreeMap::new(),
                        location: loc(2, 25),
                    }),
                    reads: Vec::new(),
                }),
                private: false,
                sink: None,
                location: loc(1, 1),
            }),
            Statement::StreamingTable(StreamingTable {
                expectations: Vec::new(),
                name: TableName::new(None, "users"),
                columns: None,
                comment: None,
                properties: BTreeMap::new(),
                partitioned_by: Vec::new(),
                cluster_by: Vec::new(),
                query: None,
                private: false,
                sink: None,
                location: loc(5, 1),
            }),
            Statement::Flow(CdcFlow {
                kind: FlowKind::Changes,
                name: "users_flow".to_string(),
                target: TableName::new(None, "users"),
                source: TableName::new(None, "users_cdc"),
                keys: vec!["userId".to_string()],
                ignore_null_updates: false,
                delete_when: Some("operation = 'DELETE'".to_string()),
                truncate_when: None,
                sequence_by: SequenceBy::Expr("sequenceNum".to_string()),
                columns: ColumnSelection::Except(vec![
                    "operation".to_string(),
                    "sequenceNum".to_string(),
                ]),
                stored_as: ScdType::Type2,
                track_history: Some(ColumnSelection::Except(vec!["city".to_string()])),
                once: false,
                location: loc(7, 1),
            }),
        ],
        default_schema: TableName::DEFAULT_SCHEMA.to_string(),
    };
    assert_eq!(parse(EXAMPLE), expected);
}

#[test]
fn double_quotes_are_strings_and_backticks_identifiers() {
    let f = only_flow(&flow_with(
        r#"APPLY AS DELETE WHEN `op code` = "DELETE" AND "it's" <> 'x' SEQUENCE BY `seq num`"#,
    ));
    assert_eq!(
        f.delete_when.as_deref(),
        Some(r#"`op code` = 'DELETE' AND 'it''s' <> 'x'"#)
    );
    assert_eq!(f.sequence_by, SequenceBy::Expr("`seq num`".to_string()));
}

#[test]
fn keywords_are_case_insensitive_and_names_keep_their_case() {
    let f = only_flow(
        "create flow MyFlow as auto cdc into Live.Target from stream(live.Src) keys (Id) \
         apply as delete when Op = 'D' sequence by Seq stored as scd type 1",
    );
    assert_eq!(f.name, "MyFlow");
    assert_eq!(f.target, TableName::new(None, "Target"));
    assert_eq!(f.source, TableName::new(None, "Src"));
    assert_eq!(f.keys, vec!["Id"]);
    assert_eq!(f.delete_when.as_deref(), Some("Op = 'D'"));
    assert_eq!(f.stored_as, ScdType::Type1);
}

#[test]
fn clauses_in_any_order() {
    let a = only_flow(&flow_with(
        "SEQUENCE BY seq APPLY AS DELETE WHEN op = 'D' COLUMNS a, b IGNORE NULL UPDATES \
         STORED AS SCD TYPE 1 APPLY AS TRUNCATE WHEN op = 'T'",
    ));
    let b = only_flow(&flow_with(
        "APPLY AS TRUNCATE WHEN op = 'T' IGNORE NULL UPDATES COLUMNS (a, b) \
         STORED AS SCD TYPE 1 APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq",
    ));
    assert_eq!(a, b);
    assert!(a.ignore_null_updates);
    assert_eq!(a.truncate_when.as_deref(), Some("op = 'T'"));
    assert_eq!(
        a.columns,
        ColumnSelection::Only(vec!["a".into(), "b".into()])
    );
    assert_eq!(a.track_history, None);
    assert_eq!(a.stored_as, ScdType::Type1);
}

#[test]
fn defaults_when_clauses_are_absent() {
    let f = only_flow(&flow_with("SEQUENCE BY ts"));
    assert!(!f.ignore_null_updates);
    assert_eq!(f.delete_when, None);
    assert_eq!(f.columns, ColumnSelection::All);
    assert_eq!(f.stored_as, ScdType::Type1);
    assert_eq!(f.track_history, None);
    let f = only_flow(&flow_with(
        "SEQUENCE BY ts STORED AS SCD TYPE 2 TRACK HISTORY ON a, b",
    ));
    assert_eq!(
        f.track_history,
        Some(ColumnSelection::Only(vec!["a".into(), "b".into()]))
    );
    let f = only_flow(&flow_with("SEQUENCE BY ts COLUMNS *"));
    assert_eq!(f.columns, ColumnSelection::All);
}

#[test]
fn stream_source_spellings() {
    for from in [
        "STREAM(s)",
        "STREAM (s)",
        "STREAM s",
        "s",
        "STREAM(LIVE.s)",
        "live.s",
        "stream(`s`)",
    ] {
        let f = only_flow(&format!(
            "CREATE FLOW f AS AUTO CDC INTO t FROM {from} KEYS (id) SEQUENCE BY ts"
        ));
        assert_eq!(f.source, TableName::new(None, "s"), "{from}");
    }
    let f = only_flow(
        "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(bronze.s) KEYS (id) SEQUENCE BY ts",
    );
    assert_eq!(f.source, TableName::new(Some("bronze"), "s"));
    // A table may be called `stream`.
    let f = only_flow("CREATE FLOW f AS AUTO CDC INTO t FROM stream KEYS (id) SEQUENCE BY ts");
    assert_eq!(f.source, TableName::new(None, "stream"));
}

#[test]
fn legacy_apply_changes_spellings() {
    let modern = only_flow(
        "CREATE FLOW users AS AUTO CDC INTO users FROM STREAM(cdc) KEYS (id) SEQUENCE BY ts",
    );
    let in_flow = only_flow(
        "CREATE FLOW users AS APPLY CHANGES INTO users FROM STREAM(cdc) KEYS (id) SEQUENCE BY ts",
    );
    let standalone =
        only_flow("APPLY CHANGES INTO LIVE.users FROM STREAM(LIVE.cdc) KEYS (id) SEQUENCE BY ts");
    assert_eq!(modern, in_flow);
    assert_eq!(modern, standalone);
    assert_eq!(standalone.name, "users");
}

#[test]
fn struct_sequence() {
    let f = only_flow(&flow_with("SEQUENCE BY struct(ts, seq + 1, t.b)"));
    assert_eq!(
        f.sequence_by,
        SequenceBy::Struct(vec![
            ("ts".into(), "ts".into()),
            ("c1".into(), "seq + 1".into()),
            ("b".into(), "t.b".into()),
        ])
    );
    let f = only_flow(&flow_with("SEQUENCE BY STRUCT(a, b) STORED AS SCD TYPE 2"));
    assert_eq!(
        f.sequence_by,
        SequenceBy::Struct(vec![("a".into(), "a".into()), ("b".into(), "b".into())])
    );
    assert_eq!(f.stored_as, ScdType::Type2);
}

#[test]
fn comments_and_empty_statements() {
    let text = "-- a pipeline\n/* block /* nested */ comment */\n;;\
                CREATE STREAMING TABLE t -- trailing\n;\n\
                CREATE FLOW f AS AUTO CDC INTO t /* here */ FROM s KEYS (id) -- k\n SEQUENCE BY ts;;";
    let p = parse(text);
    assert_eq!(p.statements.len(), 2);
    assert_eq!(parse("").statements.len(), 0);
    assert_eq!(parse("  -- only a comment\n").statements.len(), 0);
}

#[test]
fn streaming_table_clauses() {
    let t = only_table(
        "CREATE STREAMING TABLE bronze.events (id BIGINT NOT NULL COMMENT 'key', amount DECIMAL(10,2)) \
         TBLPROPERTIES ('quality' = 'bronze', pipelines.reset.allowed = false) COMMENT \"raw events\"",
    );
    assert_eq!(t.name, TableName::new(Some("bronze"), "events"));
    assert_eq!(
        t.columns,
        Some(vec![
            ColumnDef {
                nullable: false,
                comment: Some("key".into()),
                ..col("id", DataType::Int64)
            },
            col("amount", DataType::Decimal128(10, 2)),
        ])
    );
    assert_eq!(t.comment.as_deref(), Some("raw events"));
    assert_eq!(
        t.properties.get("quality").map(String::as_str),
        Some("bronze")
    );
    assert_eq!(
        t.properties
            .get("pipelines.reset.allowed")
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(t.query, None);

    let t = only_table("CREATE STREAMING LIVE TABLE IF NOT EXISTS `My Table`");
    assert_eq!(t.name, TableName::new(None, "My Table"));
}

#[test]
fn source_query_variants() {
    let t = only_table(
        "CREATE STREAMING TABLE s AS SELECT id, CAST(v AS INT) AS v FROM STREAM(LIVE.raw) r WHERE r.op <> \"x\"",
    );
    let q = t.query.unwrap();
    assert_eq!(q.source, QuerySource::Table(TableName::new(None, "raw")));
    assert_eq!(
        q.sql,
        "SELECT id, CAST(v AS INT) AS v FROM __strata_source r WHERE r.op <> 'x'"
    );

    for from in ["STREAM raw", "STREAM(raw)", "stream raw AS x"] {
        let t = only_table(&format!("CREATE STREAMING TABLE s AS SELECT * FROM {from}"));
        let q = t.query.unwrap();
        assert_eq!(q.source, QuerySource::Table(TableName::new(None, "raw")));
        assert!(
            q.sql.starts_with("SELECT * FROM __strata_source"),
            "{}",
            q.sql
        );
    }

    for from in [
        "read_files('p', format => 'csv', header => 'false', sep => ';', inferSchema => true)",
        "STREAM(read_files('p', format => 'csv', header => false, delimiter => ';', INFERSCHEMA => 'true'))",
        "STREAM read_files(\"p\", format => \"CSV\", header => false, sep => ';', inferschema => true)",
    ] {
        let t = only_table(&format!("CREATE STREAMING TABLE s AS SELECT a FROM {from} AS f"));
        let q = t.query.unwrap();
        assert_eq!(q.sql, "SELECT a FROM __strata_source AS f");
        let QuerySource::ReadFiles(rf) = q.source else {
            panic!("{from}")
        };
        assert_eq!(rf.path, "p");
        assert_eq!(rf.format, FileFormat::Csv);
        assert!(!rf.header);
        assert_eq!(rf.delimiter, b';');
        assert_eq!(
            rf.other_options.get("inferschema").map(String::as_str),
            Some("true"),
            "{from}"
        );
    }

    // Qualified columns keep working: the source keeps its name as an alias.
    let t = only_table("CREATE STREAMING TABLE s AS SELECT raw.x FROM STREAM(LIVE.raw)");
    assert_eq!(
        t.query.unwrap().sql,
        "SELECT raw.x FROM __strata_source AS raw"
    );

    // A column called `stream` is not a source marker.
    let t = only_table("CREATE STREAMING TABLE s AS SELECT stream, a FROM STREAM(raw)");
    assert_eq!(
        t.query.unwrap().sql,
        "SELECT stream, a FROM __strata_source AS raw"
    );
}

#[test]
fn source_query_errors() {
    let (l, c, m, _) = syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM raw");
    assert_eq!((l, c), (1, 29));
    assert!(m.contains("streaming source"), "{m}");

    let (l, c, m, _) = syntax_error(
        "CREATE STREAMING TABLE s AS SELECT * FROM STREAM(a) JOIN STREAM(b) ON a.x = b.x",
    );
    assert_eq!((l, c), (1, 65));
    assert!(m.contains("exactly one streaming source"), "{m}");

    let (l, c, m, _) = syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM read_files('p')");
    assert_eq!((l, c), (1, 43));
    assert!(m.contains("format"), "{m}");

    let (l, c, m, _) =
        syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM read_files('p', format => 'xml')");
    assert_eq!((l, c), (1, 69));
    assert!(m.contains("unknown format 'xml'"), "{m}");

    let (l, c, m, _) = syntax_error(
        "CREATE STREAMING TABLE s AS SELECT * FROM read_files('p', format => 'csv', sep => ';;')",
    );
    assert_eq!((l, c), (1, 83));
    assert!(m.contains("one ASCII character"), "{m}");

    // An error inside the schema string points into the pipeline text.
    let (l, c, m, _) = syntax_error(
        "CREATE STREAMING TABLE s AS\nSELECT * FROM read_files('p', format => 'json', schema => 'a INT, b FOO')",
    );
    assert_eq!((l, c), (2, 69));
    assert_eq!(m, "unknown column type 'FOO'");

    let (l, c, m, _) = syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM STREAM(raw) WHERE");
    assert_eq!((l, c), (1, 60));
    assert_eq!(m, "expected an expression, found end of input");

    let (l, c, m, _) =
        syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM STREAM(SELECT * FROM raw)");
    assert_eq!((l, c), (1, 50));
    assert!(m.contains("not a query"), "{m}");

    let (_, _, m, _) =
        syntax_error("CREATE STREAMING TABLE s AS SELECT * FROM STREAM(raw) garbage garbage;");
    assert!(m.starts_with("expected end of statement"), "{m}");
}

#[test]
fn misspelled_keys_points_at_the_token() {
    let text = "CREATE OR REFRESH STREAMING TABLE users;\n\
                \n\
                CREATE FLOW users_flow AS AUTO CDC INTO users\n\
                FROM STREAM(users_cdc)\n\
                KEY (userId)\n\
                SEQUENCE BY sequenceNum;";
    let (l, c, m, snippet) = syntax_error(text);
    assert_eq!((l, c), (5, 1));
    assert_eq!(m, "expected KEYS, found 'KEY'");
    assert_eq!(snippet, "KEY (userId)\n^");
}

#[test]
fn syntax_errors_name_what_was_expected() {
    let cases: &[(&str, (u64, u64), &str)] = &[
        ("SELECT 1", (1, 1), "expected CREATE, APPLY CHANGES or SET, found 'SELECT'"),
        (
            "CREATE OR REPLACE STREAMING TABLE t",
            (1, 11),
            "expected REFRESH, found 'REPLACE'",
        ),
        (
            "CREATE TABLE t",
            (1, 8),
            "expected STREAMING TABLE, MATERIALIZED VIEW, VIEW, FLOW, POINT IN TIME TABLE, SINK or CONNECTION, found 'TABLE'",
        ),
        (
            "CREATE STREAMING TABLE",
            (1, 23),
            "expected a table name, found end of input",
        ),
        (
            "CREATE STREAMING TABLE t;",
            (1, 0),
            "",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS id SEQUENCE BY x",
            (1, 46),
            "expected '(', found 'id'",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id);",
            (1, 50),
            "expected SEQUENCE BY (a flow needs one), found ';'",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY",
            (1, 62),
            "expected an expression, found end of input",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY x STORED AS SCD TYPE 3",
            (1, 84),
            "expected 1 or 2, found '3'",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY x SEQUENCE BY y",
            (1, 65),
            "duplicate SEQUENCE BY clause",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY x COLUMNS a COLUMNS b",
            (1, 75),
            "duplicate COLUMNS clause",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY x APPLY AS UPDATE WHEN y",
            (1, 74),
            "expected DELETE or TRUNCATE, found 'UPDATE'",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY x BOGUS",
            (1, 65),
            "expected IGNORE NULL UPDATES, APPLY AS DELETE WHEN, APPLY AS TRUNCATE WHEN, \
             SEQUENCE BY, COLUMNS, STORED AS SCD TYPE, TRACK HISTORY ON or end of statement, \
             found 'BOGUS'",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO a.b.c FROM s KEYS (id) SEQUENCE BY x",
            (1, 32),
            "'a.b.c': catalog a is not this warehouse; its catalog is called main or strata",
        ),
        (
            "CREATE STREAMING TABLE t AS SELECT 'unterminated",
            (1, 36),
            "unterminated string literal",
        ),
    ];
    for (text, (line, column), message) in cases {
        if message.is_empty() {
            assert!(parse_pipeline(text).is_ok(), "{text}");
            continue;
        }
        let (l, c, m, _) = syntax_error(text);
        assert_eq!((&m.as_str(), (l, c)), (message, (*line, *column)), "{text}");
    }
}

#[test]
fn materialized_views_views_and_append_flows() {
    let p = parse(
        "CREATE OR REFRESH MATERIALIZED VIEW gold.totals (\n\
           CONSTRAINT positive EXPECT (n > 0) ON VIOLATION DROP ROW\n\
         ) COMMENT 'per city' AS\n\
         WITH c AS (SELECT * FROM users) SELECT city, count(*) AS n FROM c\n\
         JOIN v ON c.id = v.id WHERE c.id IN (SELECT id FROM LIVE.vips)\n\
         AND EXISTS (SELECT 1 FROM table_changes('silver', 0)) GROUP BY city;\n\
         CREATE TEMPORARY VIEW v AS SELECT * FROM as_of('dim', 3);\n\
         CREATE LIVE TABLE legacy AS SELECT 1 AS one;\n\
         CREATE FLOW f AS INSERT INTO all_rows BY NAME SELECT * FROM STREAM(s)",
    );
    let [Statement::MaterializedView(m), Statement::View(v), Statement::MaterializedView(l), Statement::AppendFlow(f)] =
        p.statements.as_slice()
    else {
        panic!("unexpected statements {:?}", p.statements);
    };
    assert_eq!(m.name, TableName::new(Some("gold"), "totals"));
    assert_eq!(m.comment.as_deref(), Some("per city"));
    assert_eq!(m.columns, None);
    assert_eq!(m.expectations.len(), 1);
    assert_eq!(m.expectations[0].name, "positive");
    assert_eq!(m.expectations[0].condition, "n > 0");
    assert_eq!(m.expectations[0].action, ExpectAction::Drop);
    // The CTE name is not a table; subqueries in WHERE and table_changes are read too.
    let t = |n: &str| TableName::new(None, n);
    assert_eq!(
        m.query.reads,
        vec![t("users"), t("v"), t("vips"), t("silver")]
    );
    assert_reparses(&m.query.sql);
    assert_eq!(v.query.reads, vec![t("dim")]);
    assert_eq!(l.query.reads, Vec::<TableName>::new());
    assert_eq!(f.target, t("all_rows"));
    assert_eq!(f.query.source, QuerySource::Table(t("s")));
}

#[test]
fn a_streaming_table_joins_tables_in_batch() {
    let t = only_table(
        "CREATE STREAMING TABLE enriched AS SELECT o.*, c.tier, p.price\n\
         FROM STREAM(orders) o\n\
         LEFT JOIN customers c ON c.id = o.customer_id\n\
         JOIN as_of('gold.prices', DATE '2024-01-31') p ON p.sku = o.sku\n\
         WHERE o.sku NOT IN (SELECT sku FROM retired)",
    );
    let q = t.query.expect("a query");
    let n = |s: Option<&str>, n: &str| TableName::new(s, n);
    assert_eq!(q.source, QuerySource::Table(n(None, "orders")));
    // The stream itself is not among the batch reads; as_of's table and subqueries are.
    assert_eq!(
        q.reads,
        vec![
            n(None, "customers"),
            n(Some("gold"), "prices"),
            n(None, "retired")
        ]
    );
    assert!(
        q.sql.contains("FROM __strata_source o LEFT JOIN"),
        "{}",
        q.sql
    );
    assert_reparses(&q.sql);
}

#[test]
fn expectations_in_a_streaming_table() {
    let t = only_table(
        "CREATE STREAMING TABLE s (\n\
           id INT NOT NULL,\n\
           CONSTRAINT valid_id EXPECT (id IS NOT NULL) ON VIOLATION DROP ROW,\n\
           CONSTRAINT known EXPECT (plan IN ('free', 'premium')),\n\
           CONSTRAINT sane EXPECT (ts > '2000-01-01') ON VIOLATION FAIL UPDATE\n\
         ) AS SELECT * FROM STREAM(raw)",
    );
    assert_eq!(t.columns.as_ref().map(Vec::len), Some(1));
    let got: Vec<(&str, &str, ExpectAction, u64)> = t
        .expectations
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.condition.as_str(),
                e.action,
                e.location.line,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("valid_id", "id IS NOT NULL", ExpectAction::Drop, 3),
            (
                "known",
                "plan IN ('free', 'premium')",
                ExpectAction::Warn,
                4
            ),
            ("sane", "ts > '2000-01-01'", ExpectAction::Fail, 5),
        ]
    );
    // Only constraints: no declared columns.
    let t = only_table(
        "CREATE STREAMING TABLE s (CONSTRAINT c EXPECT (x > 0)) AS SELECT * FROM STREAM(r)",
    );
    assert_eq!(t.columns, None);
}

#[test]
fn new_statement_errors_say_where() {
    let cases: [(&str, (u64, u64), &str); 6] = [
        (
            "CREATE MATERIALIZED VIEW v AS SELECT * FROM STREAM(s)",
            (1, 52),
            "STREAM(...) belongs in a streaming table",
        ),
        (
            "CREATE FLOW f AS INSERT INTO t SELECT * FROM STREAM(s)",
            (1, 32),
            "INSERT INTO target BY NAME",
        ),
        (
            "CREATE STREAMING TABLE s (CONSTRAINT c EXPECT (x > 0) ON VIOLATION IGNORE) AS SELECT * FROM STREAM(r)",
            (1, 68),
            "expected DROP ROW or FAIL UPDATE",
        ),
        (
            "CREATE STREAMING TABLE s (CONSTRAINT c EXPECT (x > 0), CONSTRAINT C EXPECT (y > 0)) AS SELECT * FROM STREAM(r)",
            (1, 56),
            "expectation 'C' is declared twice",
        ),
        (
            "CREATE FLOW f AS MERGE INTO t",
            (1, 18),
            "expected AUTO CDC or INSERT INTO",
        ),
        (
            "CREATE VIEW v (CONSTRAINT c EXPECT (x > 0)) AS SELECT 1",
            (1, 15),
            "a view has no column list",
        ),
    ];
    for (text, (line, column), message) in cases {
        let (l, c, m, _) = syntax_error(text);
        assert!(m.contains(message), "{text}: {m}");
        assert_eq!((l, c), (line, column), "{text}: {m}");
    }
}

#[test]
fn error_display_has_location_and_snippet() {
    let err = parse_pipeline("CREATE STREAMING TABLE t\n  FOO").unwrap_err();
    assert_eq!(
        err.to_string(),
        "2:3: expected a column list, COMMENT, PARTITIONED BY, CLUSTER BY, TBLPROPERTIES, AS or end of statement, found 'FOO'\n  FOO\n  ^"
    );
}

/// Mutations and truncations of the example must give `Ok` or `Err`, never a panic.
#[test]
fn garbage_never_panics() {
    let mut inputs: Vec<String> = Vec::new();
    let chars: Vec<char> = EXAMPLE.chars().collect();
    let n = chars.len();
    // Truncations at many points, including inside strings and comments.
    for cut in (0..n).step_by(7) {
        inputs.push(chars[..cut].iter().collect());
    }
    // Single-character deletions and replacements with troublesome characters.
    for (k, pos) in (0..n).step_by(13).enumerate() {
        let mut deleted = chars.clone();
        deleted.remove(pos);
        inputs.push(deleted.iter().collect());
        let mut replaced = chars.clone();
        replaced[pos] = ['(', ')', '"', '\'', ';', '`', '*', ',', '.', '\\', 'é', '/'][k % 12];
        inputs.push(replaced.iter().collect());
    }
    // Word-level shuffles: drop each word in turn.
    let words: Vec<&str> = EXAMPLE.split_whitespace().collect();
    for skip in 0..words.len() {
        let text: Vec<&str> = words
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, w)| *w)
            .collect();
        inputs.push(text.join(" "));
    }
    inputs.extend(
        [
            "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((",
            "CREATE STREAMING TABLE t AS SELECT ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1 FROM STREAM(s)",
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(",
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM()",
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(SELECT 1)",
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(foo(1))",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files()",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files(1, 2, format => 3)",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files('p', format => 'json', schema => 'a INT, a INT')",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files('p', format => 'json', schema => 'a \"x')",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files('p', format => 'json', schema => '\na\n INT(')",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files('p', format => 'json', format => 'csv')",
            "CREATE STREAMING TABLE t AS SELECT * FROM read_files('p', format => *)",
            "CREATE STREAMING TABLE t AS SELECT * FROM cloud_files('p', 'json', map('a', *))",
            "CREATE STREAMING TABLE t AS SELECT * FROM cloud_files('p', 'json', map(DISTINCT 'a', 'b'))",
            "CREATE STREAMING TABLE t AS SELECT * FROM cloud_files('p', 'json', map)",
            "CREATE STREAMING TABLE t AS SELECT * FROM cloud_files('p', 'json', map('a' => 'b'))",
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(cloud_files('p', 'json', map('a', 'b', 'c')))",
            "CREATE STREAMING TABLE t AS SELECT * FROM x, STREAM y, STREAM(z)",
            "CREATE STREAMING TABLE t AS WITH a AS (SELECT * FROM STREAM(s)) SELECT * FROM a",
            "CREATE STREAMING TABLE t AS SELECT * FROM (SELECT * FROM STREAM s) UNION ALL SELECT 1",
            "CREATE STREAMING TABLE t AS SELECT * FROM t WHERE x IN (SELECT y FROM STREAM(z))",
            "CREATE STREAMING TABLE t (a DECIMAL(99999999999999999999, 1))",
            "CREATE STREAMING TABLE t (a DECIMAL(-1))",
            "CREATE STREAMING TABLE t TBLPROPERTIES ('a' = 'b', 'a' = 'c')",
            "CREATE STREAMING TABLE t COMMENT 'a' COMMENT 'b'",
            "APPLY",
            "APPLY CHANGES INTO",
            "CREATE FLOW",
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (",
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS () SEQUENCE BY STRUCT(",
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS () SEQUENCE BY STRUCT()",
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (a) TRACK HISTORY ON * EXCEPT",
            "\u{feff}\u{0}\u{1}",
            "/* unterminated comment",
            "`unterminated",
            "\"unterminated",
            "é",
            ";;;;",
        ]
        .map(String::from),
    );
    assert!(inputs.len() > 50);
    for text in &inputs {
        let result = std::panic::catch_unwind(|| parse_pipeline(text));
        assert!(result.is_ok(), "panicked on {text:?}");
        if let Ok(Ok(p)) = result {
            // Whatever parses must also plan or fail cleanly.
            let _ = plan_pipeline(p);
        }
    }
}

#[test]
fn snapshot_flows_parse_in_every_spelling() {
    let text = "CREATE FLOW h AS AUTO CDC FROM SNAPSHOT INTO customers
        FROM STREAM(deliveries) KEYS (customer_id)
        STORED AS SCD TYPE 2 SNAPSHOT VERSION BY reporting_date
        COLUMNS * EXCEPT (reporting_date) TRACK HISTORY ON * EXCEPT (last_login);
        APPLY CHANGES FROM SNAPSHOT INTO balances FROM accounts KEYS (id) STORED AS SNAPSHOTS;";
    let p = parse_pipeline(text).expect("parses");
    let flows: Vec<&CdcFlow> = p
        .statements
        .iter()
        .filter_map(|s| match s {
            Statement::Flow(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(
        flows[0].kind,
        FlowKind::Snapshot {
            version_by: Some("reporting_date".into())
        }
    );
    assert_eq!(flows[0].stored_as, ScdType::Type2);
    assert_eq!(
        flows[0].sequence_by,
        SequenceBy::Expr("reporting_date".into())
    );
    assert_eq!(flows[1].name, "balances");
    assert_eq!(flows[1].kind, FlowKind::Snapshot { version_by: None });
    assert_eq!(flows[1].stored_as, ScdType::Snapshots);
}

#[test]
fn snapshot_flows_reject_change_event_clauses() {
    let cases = [
        (
            "CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM s KEYS (id) SEQUENCE BY v",
            (1, 65),
            "SEQUENCE BY is not allowed in AUTO CDC FROM SNAPSHOT",
        ),
        (
            "CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO t FROM s KEYS (id) APPLY AS DELETE WHEN x",
            (1, 65),
            "APPLY AS is not allowed in AUTO CDC FROM SNAPSHOT",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY v STORED AS SNAPSHOTS",
            (1, 65),
            "STORED AS SNAPSHOTS needs snapshots",
        ),
        (
            "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SNAPSHOT VERSION BY v SEQUENCE BY v",
            (1, 51),
            "SNAPSHOT VERSION BY belongs to AUTO CDC FROM SNAPSHOT flows",
        ),
    ];
    for (text, (line, column), message) in cases {
        let (l, c, m, _) = syntax_error(text);
        assert!(m.starts_with(message), "{text}: {m}");
        assert_eq!((l, c), (line, column), "{text}");
    }
}

#[test]
fn unqualified_names_take_the_pipeline_schema() {
    let p = parse_pipeline_in(
        "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(LIVE.raw);\n\
         CREATE MATERIALIZED VIEW m AS SELECT * FROM t JOIN other.d ON true;",
        "sales",
    )
    .unwrap();
    assert_eq!(p.default_schema, "sales");
    let [Statement::StreamingTable(t), Statement::MaterializedView(m)] = p.statements.as_slice()
    else {
        panic!("{:?}", p.statements)
    };
    assert_eq!(t.name, TableName::new(Some("sales"), "t"));
    assert_eq!(
        t.query.as_ref().map(|q| q.source.clone()),
        Some(QuerySource::Table(TableName::new(Some("sales"), "raw")))
    );
    assert_eq!(
        m.query.reads,
        vec![
            TableName::new(Some("sales"), "t"),
            TableName::new(Some("other"), "d")
        ]
    );
}

#[test]
fn connections_and_database_sources_parse() {
    let p = parse(
        "CREATE CONNECTION IF NOT EXISTS shop TYPE postgresql OPTIONS (host 'db', port '5432', \
         database 'shop', user = 'etl') COMMENT 'the shop';\n\
         CREATE STREAMING TABLE orders AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.orders', watermark => 'updated_at, id', batch_rows => 500);",
    );
    let Statement::Connection(c) = &p.statements[0] else {
        panic!("not a connection: {:?}", p.statements[0]);
    };
    assert_eq!((c.name.as_str(), c.kind.as_str()), ("shop", "postgresql"));
    let options: Vec<(&str, &str)> = c
        .options
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        options,
        [
            ("database", "shop"),
            ("host", "db"),
            ("port", "5432"),
            ("user", "etl")
        ]
    );
    let Statement::StreamingTable(t) = &p.statements[1] else {
        panic!("not a table");
    };
    let Some(QuerySource::ReadDatabase(rd)) = t.query.as_ref().map(|q| &q.source) else {
        panic!("not a database source: {:?}", t.query);
    };
    assert_eq!(rd.connection, "shop");
    assert_eq!(rd.options["table"], "public.orders");
    assert_eq!(rd.options["watermark"], "updated_at, id");
    assert_eq!(rd.options["batch_rows"], "500");
    assert_eq!(rd.location, loc(2, 55));
}

#[test]
fn database_sources_name_a_declared_connection_once() {
    let e = plan_pipeline(parse(
        "CREATE STREAMING TABLE orders AS SELECT * FROM STREAM read_database('shop', table => 't');",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("connection 'shop', which is not declared"),
        "{e}"
    );
    let e = plan_pipeline(parse(
        "CREATE CONNECTION a TYPE mysql OPTIONS (database 'd');\n\
         CREATE CONNECTION a TYPE mysql OPTIONS (database 'e');",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("connection a is declared twice") && e.contains("first at 1:1"),
        "{e}"
    );
    let (_, _, msg, _) = syntax_error(
        "CREATE STREAMING TABLE o AS SELECT * FROM STREAM read_database(table => 't');",
    );
    assert!(msg.contains("needs a connection name"), "{msg}");
}

#[test]
fn three_part_names_in_the_warehouse_catalog_and_curly_quotes() {
    let flow = only_flow(
        "CREATE FLOW f AS AUTO CDC INTO main.cdc_data.users FROM STREAM(strata.cdc_data.raw) \
         KEYS (id) SEQUENCE BY ts",
    );
    assert_eq!(flow.target, TableName::new(Some("cdc_data"), "users"));
    assert_eq!(flow.source, TableName::new(Some("cdc_data"), "raw"));
    let (line, column, msg, _) = syntax_error(
        "CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id)\n\
         APPLY AS DELETE WHEN operation = \u{2018}DELETE\u{2019} SEQUENCE BY ts",
    );
    assert_eq!((line, column), (2, 34));
    assert!(
        msg.contains("curly") && msg.contains("straight quotes"),
        "{msg}"
    );
    // Inside a string they are just text.
    let t = only_table("CREATE STREAMING TABLE t AS SELECT 'it\u{2019}s' AS s FROM STREAM(src)");
    assert!(t.query.unwrap().sql.contains('\u{2019}'));
}

/// `STREAM table_changes(...)` is a streaming source: a name or a path, a start given by
/// name or as the second argument, options lower-cased; `PARTITIONED BY` / `CLUSTER BY`
/// land on the dataset, and `CLUSTER BY` is recorded as the Z-order columns.
#[test]
fn table_changes_sources_and_table_layout_clauses() {
    let t = only_table(
        "CREATE OR REFRESH STREAMING TABLE h PARTITIONED BY (d) AS SELECT *, \
         CAST(_commit_timestamp AS DATE) AS d FROM STREAM table_changes('gold.orders', \
         startingVersion => 3, onMissingVersions => 'snapshot')",
    );
    assert_eq!(t.partitioned_by, vec!["d".to_string()]);
    let Some(QuerySource::Changes(tc)) = t.query.map(|q| q.source) else {
        panic!("not a table_changes source");
    };
    assert_eq!(
        tc.source,
        ChangeSource::Table(TableName::new(Some("gold"), "orders"))
    );
    assert_eq!(
        tc.options.get("startingversion").map(String::as_str),
        Some("3")
    );
    assert_eq!(
        tc.options.get("onmissingversions").map(String::as_str),
        Some("snapshot")
    );
    let t = only_table(
        "CREATE STREAMING TABLE h CLUSTER BY (a, b) AS SELECT * FROM STREAM \
         table_changes('../lake/orders', '2024-01-01')",
    );
    assert_eq!(t.cluster_by, vec!["a".to_string(), "b".to_string()]);
    let Some(QuerySource::Changes(tc)) = t.query.map(|q| q.source) else {
        panic!("not a table_changes source");
    };
    assert_eq!(tc.source, ChangeSource::Path("../lake/orders".into()));
    assert_eq!(
        tc.options.get("startingtimestamp").map(String::as_str),
        Some("2024-01-01")
    );
    let plan = strata_sql::plan_pipeline(
        parse_pipeline(
            "CREATE STREAMING TABLE h CLUSTER BY (a) AS SELECT * FROM STREAM \
             table_changes('o', startingVersion => 0)",
        )
        .expect("parse"),
    )
    .expect("plan");
    let h = plan.tables.values().next().expect("table");
    assert_eq!(
        h.properties
            .get("pipelines.autoOptimize.zOrderCols")
            .map(String::as_str),
        Some("a")
    );
    let both = strata_sql::plan_pipeline(
        parse_pipeline(
            "CREATE MATERIALIZED VIEW m PARTITIONED BY (a) CLUSTER BY (b) AS SELECT 1 AS a, 2 AS b",
        )
        .expect("parse"),
    );
    assert!(both.is_err());
}

/// `AUTO CDC INTO t FROM STREAM read_database(..., mode => 'cdc')` declares `t_changes` and
/// a flow from it with the change log's defaults; a watermark load there is refused.
#[test]
fn a_flow_straight_from_a_change_log_declares_its_change_table() {
    let p = parse(
        "CREATE FLOW f AS AUTO CDC INTO gold.acct FROM STREAM read_database('shop', \
         table => 'public.acct', mode => 'cdc') KEYS (id) COLUMNS * EXCEPT (note) \
         STORED AS SCD TYPE 2;",
    );
    let [Statement::StreamingTable(t), Statement::Flow(f)] = p.statements.as_slice() else {
        panic!("{:?}", p.statements)
    };
    assert_eq!(t.name, TableName::new(Some("gold"), "acct_changes"));
    assert!(matches!(
        t.query.as_ref().map(|q| &q.source),
        Some(QuerySource::ReadDatabase(r)) if r.connection == "shop"
    ));
    assert_eq!(f.source, t.name);
    assert_eq!(f.delete_when.as_deref(), Some("_change_type = 'delete'"));
    assert!(matches!(&f.sequence_by, SequenceBy::Struct(s) if s.len() == 2));
    let ColumnSelection::Except(except) = &f.columns else {
        panic!("{:?}", f.columns)
    };
    assert_eq!(except[0], "note");
    assert!(CHANGE_COLUMNS.iter().all(|c| except.iter().any(|e| e == c)));
    let e = parse_pipeline(
        "CREATE FLOW f AS AUTO CDC INTO acct FROM STREAM read_database('shop', \
         table => 'public.acct', watermark => 'id') KEYS (id) SEQUENCE BY id;",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("mode => 'cdc'"), "{e}");
}

/// `INSERT INTO ONCE` (and Lakeflow's newer `INSERT ONCE INTO`) is a one-time flow whose
/// query is a batch query: `read_files(...)` without STREAM is its source, else it reads
/// tables only; a table called `once` is still a table.
#[test]
fn once_flows() {
    let p = parse(
        "CREATE FLOW backfill AS INSERT INTO ONCE raw BY NAME\n\
           SELECT id, amount FROM read_files('data/old', format => 'csv', header => true) f\n\
           JOIN regions r ON r.id = f.region;\n\
         CREATE FLOW seed AS INSERT ONCE INTO raw BY NAME SELECT * FROM old.orders\n\
           UNION ALL SELECT * FROM table_changes('archive', 0);\n\
         CREATE FLOW f AS INSERT INTO once BY NAME SELECT * FROM STREAM(s);\n\
         CREATE FLOW g AS insert into once.t by name SELECT * FROM STREAM(s)",
    );
    let [Statement::AppendFlow(backfill), Statement::AppendFlow(seed), Statement::AppendFlow(f), Statement::AppendFlow(g)] =
        p.statements.as_slice()
    else {
        panic!("unexpected statements {:?}", p.statements);
    };
    let t = |s: Option<&str>, n: &str| TableName::new(s, n);
    assert!(backfill.once && seed.once);
    assert_eq!(backfill.target, t(None, "raw"));
    let QuerySource::ReadFiles(rf) = &backfill.query.source else {
        panic!("{:?}", backfill.query.source);
    };
    assert_eq!(rf.path, "data/old");
    assert_eq!(backfill.query.reads, vec![t(None, "regions")]);
    assert!(
        backfill
            .query
            .sql
            .contains("FROM __strata_source f JOIN regions"),
        "{}",
        backfill.query.sql
    );
    assert_reparses(&backfill.query.sql);
    assert_eq!(seed.query.source, QuerySource::Batch);
    assert_eq!(
        seed.query.reads,
        vec![t(Some("old"), "orders"), t(None, "archive")]
    );
    assert_reparses(&seed.query.sql);
    assert!(!f.once && !g.once);
    assert_eq!(f.target, t(None, "once"));
    assert_eq!(g.target, t(Some("once"), "t"));
}

#[test]
fn once_flow_errors_say_where() {
    let cases: [(&str, (u64, u64), &str); 5] = [
        (
            "CREATE FLOW b AS INSERT INTO ONCE t BY NAME SELECT * FROM STREAM(s)",
            (1, 59),
            "a once flow (INSERT INTO ONCE) reads its input in batch",
        ),
        (
            "CREATE FLOW b AS INSERT INTO ONCE t BY NAME\nSELECT * FROM STREAM read_files('d', format => 'json')",
            (2, 15),
            "remove STREAM",
        ),
        (
            "CREATE FLOW b AS INSERT ONCE INTO ONCE t BY NAME SELECT 1",
            (1, 35),
            "ONCE is written twice",
        ),
        (
            "CREATE FLOW b AS INSERT INTO ONCE t BY NAME SELECT * FROM read_files('a', format => 'json')\n\
             UNION ALL SELECT * FROM read_files('b', format => 'json')",
            (2, 25),
            "a once flow reads at most one read_files(...); this is a second one",
        ),
        (
            "CREATE FLOW b AS INSERT INTO ONCE t BY NAME SELECT * FROM read_database('shop', table => 'x')",
            (1, 59),
            "a once flow cannot read read_database(...) yet",
        ),
    ];
    for (text, (line, column), message) in cases {
        let (l, c, m, _) = syntax_error(text);
        assert!(m.contains(message), "{text}: {m}");
        assert_eq!((l, c), (line, column), "{text}: {m}");
    }
}

/// The one source query of `text` (a streaming table or an append flow), its read_files
/// source at `location` 0:0 so that two spellings compare.
fn files_query(text: &str) -> (SourceQuery, Location) {
    let query = match parse(text).statements.into_iter().next() {
        Some(Statement::StreamingTable(t)) => t.query.expect("a query"),
        Some(Statement::AppendFlow(f)) => f.query,
        other => panic!("expected a streaming table or an append flow, got {other:?}"),
    };
    assert_reparses(&query.sql);
    let mut query = query;
    let QuerySource::ReadFiles(rf) = &mut query.source else {
        panic!("{text}: expected read_files, got {:?}", query.source)
    };
    let at = std::mem::take(&mut rf.location);
    (query, at)
}

/// Where `needle` first starts in `text`: (line, column), 1-based.
fn position_of(text: &str, needle: &str) -> (u64, u64) {
    let index = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} in {text:?}"));
    let before = &text[..index];
    let line = before.matches('\n').count() as u64 + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() as u64 + 1;
    (line, column)
}

/// Legacy DLT's `cloud_files(path, format[, map(...)])` is Auto Loader's streaming source:
/// the same read_files source (and query) as the read_files call it stands for.
#[test]
fn cloud_files_is_read_files() {
    let same = [
        (
            "cloud_files('data/in', 'json')",
            "STREAM read_files('data/in', format => 'json')",
        ),
        (
            "cloud_files(\"data/in\", \"JSON\", map(\"cloudFiles.inferColumnTypes\", \"true\"))",
            "read_files('data/in', format => 'json')",
        ),
        (
            "STREAM cloud_files('p', 'csv', map('header', 'true', 'sep', ';', \
             'cloudFiles.format', 'CSV', 'rescuedDataColumn', '_bad', \
             'cloudFiles.schemaEvolutionMode', 'addNewColumns'))",
            "STREAM read_files('p', format => 'csv', header => true, sep => ';', \
             rescuedDataColumn => '_bad')",
        ),
        (
            "STREAM(cloud_files('p', 'csv', map('delimiter', '|', 'schema', 'id INT, name STRING', \
             'cloudFiles.schemaEvolutionMode', 'none', 'multiLine', 'true', 'Encoding', 'UTF-8', \
             'header', 'false')))",
            "STREAM(read_files('p', format => 'csv', delimiter => '|', \
             schema => 'id INT, name STRING', multiLine => true, encoding => 'UTF-8'))",
        ),
        (
            "cloud_files('p', 'json', map('schema', 'a BIGINT', 'rescuedDataColumn', '_r', \
             'cloudFiles.schemaEvolutionMode', 'rescue', 'CLOUDFILES.INFERCOLUMNTYPES', true, \
             'format', 'json', 'inferSchema', 'true'))",
            "read_files('p', format => 'json', schema => 'a BIGINT', rescuedDataColumn => '_r', \
             inferSchema => 'true')",
        ),
        (
            "cloud_files('p', 'csv', map('header', 'true', 'cloudFiles.inferColumnTypes', 'FALSE'))",
            "read_files('p', format => 'csv', header => true, inferColumnTypes => false)",
        ),
        (
            "cloud_files('p', 'json', map('inferColumnTypes', 'false', 'inferTimestamp', 'True'))",
            "read_files('p', format => 'json', inferColumnTypes => 'false', \
             inferTimestamp => true)",
        ),
        (
            "cloud_files('s3://bucket/in', 'parquet', map())",
            "read_files('s3://bucket/in', format => 'parquet')",
        ),
    ];
    for (legacy, current) in same {
        for shape in [
            "CREATE OR REFRESH STREAMING LIVE TABLE raw AS SELECT * FROM {}",
            "CREATE STREAMING TABLE raw AS SELECT id, upper(name) AS name FROM {} AS f WHERE f.id > 1",
            "CREATE FLOW f AS INSERT INTO t BY NAME SELECT * FROM {} JOIN LIVE.dim d ON d.k = k",
        ] {
            let (a, _) = files_query(&shape.replace("{}", legacy));
            let (b, _) = files_query(&shape.replace("{}", current));
            assert_eq!(a, b, "{legacy} / {current} in {shape}");
        }
    }

    // Field by field, for one map, and at the place of the function's name.
    let text = "CREATE OR REFRESH STREAMING LIVE TABLE raw AS\nSELECT * FROM cloud_files('in', 'csv',\n  map('header', 'true', 'sep', ';', 'cloudFiles.inferColumnTypes', 'true', 'rescuedDataColumn', '_bad'))";
    let (q, at) = files_query(text);
    assert_eq!(at, loc(2, 15));
    assert_eq!(q.sql, "SELECT * FROM __strata_source");
    assert_eq!(
        q.source,
        QuerySource::ReadFiles(ReadFiles {
            path: "in".to_string(),
            format: FileFormat::Csv,
            schema: None,
            header: true,
            delimiter: b';',
            other_options: BTreeMap::from([("rescueddatacolumn".to_string(), "_bad".to_string())]),
            location: Location::default(),
        })
    );

    // The legacy pipeline of issue 40 (tests/scenarios/ingest/cloud_files_legacy.scn)
    // parses and plans: its flow is named after its target.
    let p = parse(
        "CREATE OR REFRESH STREAMING LIVE TABLE raw
AS SELECT * FROM cloud_files('data/in', 'json', map('cloudFiles.inferColumnTypes', 'true'));
CREATE OR REFRESH STREAMING LIVE TABLE t;
APPLY CHANGES INTO LIVE.t
FROM STREAM(LIVE.raw)
KEYS (id)
APPLY AS DELETE WHEN op = \"DELETE\"
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;",
    );
    let [Statement::StreamingTable(raw), Statement::StreamingTable(_), Statement::Flow(flow)] =
        &p.statements[..]
    else {
        panic!("{:?}", p.statements)
    };
    assert!(matches!(
        raw.query.as_ref().map(|q| &q.source),
        Some(QuerySource::ReadFiles(ReadFiles {
            format: FileFormat::Json,
            schema: None,
            ..
        }))
    ));
    assert_eq!(flow.name, "t");
    assert_eq!(flow.source, TableName::new(None, "raw"));
    plan_pipeline(p).expect("plans");
}

#[test]
fn cloud_files_errors_say_where() {
    let table =
        |from: &str| format!("CREATE OR REFRESH STREAMING LIVE TABLE raw AS SELECT * FROM {from}");
    let cases: &[(&str, &str, &str)] = &[
        // (the FROM, where the error points, what the message contains)
        ("cloud_files('in')", "cloud_files", "cloud_files needs a format as its second argument"),
        ("cloud_files()", "cloud_files", "cloud_files needs a path as its first argument"),
        ("cloud_files(1, 'json')", "1,", "the path of cloud_files must be a string"),
        ("cloud_files('in', json)", "json", "the format of cloud_files must be a string"),
        ("cloud_files('in', 'xml')", "'xml'", "unknown format 'xml': expected json, csv, parquet or debezium"),
        ("cloud_files('in', format => 'json')", "format", "cloud_files takes no name => value arguments"),
        ("cloud_files('in', 'json', 'header')", "'header'", "the third argument of cloud_files is a map"),
        ("cloud_files('in', 'json', map('a', 'b'), 'x')", "'x'", "cloud_files takes a path, a format and a map"),
        // An odd number of map arguments: the name left without a value.
        ("cloud_files('in', 'json', map('header'))", "'header'", "option 'header' has no value"),
        ("cloud_files('in', 'csv', map('header', 'true', 'sep'))", "'sep'", "option 'sep' has no value"),
        ("cloud_files('in', 'json', map(1, 'true'))", "1,", "a cloud_files option name must be a string, found 1"),
        ("cloud_files('in', 'json', map('header', upper('x')))", "upper", "option 'header' must be a literal"),
        // Options read_files does not know, named as written.
        (
            "cloud_files('in', 'json', map('cloudFiles.inferColumnTypes', 'true', 'cloudFiles.maxFileAge', '10'))",
            "'cloudFiles.maxFileAge'",
            "cloud_files option 'cloudFiles.maxFileAge' is not supported",
        ),
        ("cloud_files('in', 'json', map('mode', 'PERMISSIVE'))", "'mode'", "cloud_files option 'mode' is not supported"),
        // What read_files does not do.
        (
            "cloud_files('in', 'json', map('cloudFiles.format', 'csv'))",
            "'csv'",
            "option 'cloudFiles.format' is 'csv', but the format of cloud_files (its second argument) is 'json'",
        ),
        (
            "cloud_files('in', 'json', map('cloudFiles.inferColumnTypes', 'yes'))",
            "'yes'",
            "option 'cloudFiles.inferColumnTypes' must be true or false, found 'yes'",
        ),
        (
            "cloud_files('in', 'json', map('inferTimestamp', '1'))",
            "'1'",
            "option 'inferTimestamp' must be true or false, found '1'",
        ),
        (
            "cloud_files('in', 'json', map('cloudFiles.inferColumnTypes', 'false', 'inferColumnTypes', 'false'))",
            "'inferColumnTypes'",
            "option 'inferColumnTypes' is given twice",
        ),
        (
            "cloud_files('in', 'json', map('cloudFiles.schemaEvolutionMode', 'addNewColumns', 'schema', 'a INT'))",
            "'addNewColumns'",
            "option 'cloudFiles.schemaEvolutionMode' is 'addNewColumns', which read_files does not do here",
        ),
        (
            "cloud_files('in', 'json', map('cloudFiles.schemaEvolutionMode', 'failOnNewColumns'))",
            "'failOnNewColumns'",
            "option 'cloudFiles.schemaEvolutionMode' is 'failOnNewColumns', which read_files does not do here",
        ),
        // read_files' own checks, naming the option as written.
        ("cloud_files('in', 'csv', map('Header', 'maybe'))", "'maybe'", "option 'Header' must be true or false, found 'maybe'"),
        ("cloud_files('in', 'csv', map('sep', ';;'))", "';;'", "option 'sep' must be one ASCII character, found ';;'"),
        ("cloud_files('in', 'csv', map('sep', ';', 'delimiter', ','))", "'delimiter'", "option 'delimiter' is given twice"),
        ("cloud_files('in', 'csv', map('header', 'true', 'HEADER', 'false'))", "'HEADER'", "option 'HEADER' is given twice"),
        (
            "cloud_files('in', 'json', map('cloudFiles.format', 'json', 'format', 'json'))",
            "'format'",
            "option 'format' is given twice",
        ),
        // An error inside the schema string points into it.
        ("cloud_files('in', 'json', map('schema', 'a INT, b FOO'))", "FOO", "unknown column type 'FOO'"),
    ];
    for (from, at, message) in cases {
        let text = table(from);
        let (l, c, m, snippet) = syntax_error(&text);
        let from_at = position_of(&text, "FROM ").1 + 5;
        let (_, needle) = position_of(from, at);
        assert_eq!((l, c), (1, from_at + needle - 1), "{from}: {m}");
        assert!(m.contains(message), "{from}: {m}");
        assert!(snippet.starts_with(&text), "{snippet}");
    }

    // Positions on later lines.
    let text = "CREATE OR REFRESH STREAMING LIVE TABLE raw AS\nSELECT * FROM cloud_files('in', 'json',\n  map('cloudFiles.inferColumnTypes', 'true',\n      'cloudFiles.useNotifications', 'true'))";
    let (l, c, m, _) = syntax_error(text);
    assert_eq!((l, c), (4, 7), "{m}");
    assert!(m.contains("'cloudFiles.useNotifications'"), "{m}");
    let text =
        "CREATE STREAMING TABLE raw AS\nSELECT * FROM cloud_files('in',\n  'csv', map('header'))";
    let (l, c, m, _) = syntax_error(text);
    assert_eq!((l, c), (3, 14), "{m}");
    assert!(m.contains("option 'header' has no value"), "{m}");

    // A once flow reads in batch: cloud_files is a streaming source.
    let (l, c, m, _) = syntax_error(
        "CREATE FLOW b AS INSERT INTO ONCE t BY NAME\nSELECT * FROM cloud_files('d', 'json')",
    );
    assert_eq!((l, c), (2, 15));
    assert!(
        m.contains("a once flow (INSERT INTO ONCE) reads its input in batch"),
        "{m}"
    );

    // One streaming source: cloud_files next to STREAM(t) is a second one.
    let (l, c, m, _) = syntax_error(
        "CREATE STREAMING TABLE s AS SELECT * FROM STREAM(a) JOIN cloud_files('d', 'json') f ON a.x = f.x",
    );
    assert_eq!((l, c), (1, 58));
    assert!(m.contains("exactly one streaming source"), "{m}");
}

#[test]
fn private_datasets_parse_with_their_kind() {
    let p = parse(
        "CREATE OR REFRESH PRIVATE STREAMING TABLE raw AS SELECT * FROM STREAM(src);\n\
         CREATE PRIVATE MATERIALIZED VIEW mv AS SELECT * FROM raw;\n\
         CREATE PRIVATE LIVE TABLE legacy AS SELECT * FROM raw;\n\
         CREATE STREAMING TABLE public_t AS SELECT * FROM STREAM(src);",
    );
    let private: Vec<(String, bool)> = p
        .statements
        .iter()
        .map(|s| match s {
            Statement::StreamingTable(t) => (t.name.name.clone(), t.private),
            Statement::MaterializedView(m) => (m.name.name.clone(), m.private),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        private,
        [
            ("raw".to_string(), true),
            ("mv".to_string(), true),
            ("legacy".to_string(), true),
            ("public_t".to_string(), false)
        ]
    );
    let (l, c, m, _) = syntax_error("CREATE OR REFRESH PRIVATE VIEW v AS SELECT 1");
    assert!(
        m.contains("PRIVATE applies to a streaming table or a materialized view"),
        "{m}"
    );
    assert_eq!((l, c), (1, 19));
}

#[test]
fn auto_cdc_once_is_a_private_copy_a_once_append_and_the_flow() {
    let p = parse(
        "CREATE FLOW backfill AS AUTO CDC ONCE INTO users FROM history KEYS (id) \
         SEQUENCE BY seq STORED AS SCD TYPE 2",
    );
    let [Statement::StreamingTable(t), Statement::AppendFlow(a), Statement::Flow(f)] =
        &p.statements[..]
    else {
        panic!("{:?}", p.statements)
    };
    let staging = TableName::new(None, "__once_backfill");
    assert_eq!((&t.name, t.private, &t.query), (&staging, true, &None));
    assert_eq!(
        (a.name.as_str(), &a.target, a.once),
        ("backfill__backfill", &staging, true)
    );
    assert_eq!(a.query.source, QuerySource::Batch);
    assert_eq!(a.query.reads, [TableName::new(None, "history")]);
    assert_eq!(a.query.sql, "SELECT * FROM \"default\".\"history\"");
    assert_eq!(
        (f.name.as_str(), &f.source, f.once),
        ("backfill", &staging, true)
    );
    assert_eq!(f.target, TableName::new(None, "users"));
    assert_eq!(f.stored_as, ScdType::Type2);
    // A table called `once` is still a target.
    assert!(
        !only_flow("CREATE FLOW f AS AUTO CDC INTO once FROM STREAM(s) KEYS (id) SEQUENCE BY s")
            .once
    );
    let cases: [(&str, (u64, u64), &str); 2] = [
        (
            "CREATE FLOW b AS AUTO CDC ONCE INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY s",
            (1, 44),
            "AUTO CDC ONCE reads its source in batch",
        ),
        (
            "CREATE FLOW b AS AUTO CDC ONCE FROM SNAPSHOT INTO t FROM s KEYS (id)",
            (1, 27),
            "AUTO CDC ONCE applies change events",
        ),
    ];
    for (text, (line, column), message) in cases {
        let (l, c, m, _) = syntax_error(text);
        assert!(m.contains(message), "{text}: {m}");
        assert_eq!((l, c), (line, column), "{text}: {m}");
    }
}

/// A Databricks notebook exported as a `.sql` file separates its cells with
/// `-- COMMAND ----------` lines and needs no `;` between them: each cell is a statement.
#[test]
fn notebook_cell_boundaries_end_statements() {
    let p = parse(
        "-- Databricks notebook source\n\
         CREATE LIVE TABLE a AS SELECT 1 AS x\n\
         \n\
         -- COMMAND ----------\n\
         \n\
         CREATE LIVE TABLE b AS SELECT x FROM a\n\
         -- COMMAND --------- (not a boundary: one dash short)\n",
    );
    assert_eq!(p.statements.len(), 2);
    // Only the exact line is a boundary; any other comment is still a comment.
    let err = parse_pipeline(
        "CREATE LIVE TABLE a AS SELECT 1 AS x\n-- COMMAND\nCREATE LIVE TABLE b AS SELECT 2 AS y",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("3:1"), "{err}");
}

/// `CREATE MATERIALIZED VIEW IF NOT EXISTS name` (Databricks SQL's spelling) declares `name`,
/// as `CREATE STREAMING TABLE IF NOT EXISTS` does.
#[test]
fn materialized_view_if_not_exists() {
    let p = parse("CREATE MATERIALIZED VIEW IF NOT EXISTS mv AS SELECT 1 AS x;");
    match p.statements.as_slice() {
        [Statement::MaterializedView(m)] => assert_eq!(m.name.name, "mv"),
        _ => panic!("one materialized view expected"),
    }
}

#[test]
fn column_names_spark_allows_that_sqlparser_reserves() {
    // `offset`, `limit`, `end`, `values` end a select list in sqlparser's generic dialect
    // after a comma; `interval`, `struct`, `trim` and `exists` start special forms. Spark
    // reads them all as columns; the SQL handed on names them in backticks.
    let t = only_table(
        "CREATE STREAMING TABLE t AS SELECT id, offset, limit, `end`, end AS e, values, \
         interval, struct, trim FROM STREAM(s) WHERE offset > 1 AND exists = true",
    );
    assert_eq!(
        t.query.map(|q| q.sql).as_deref(),
        Some(
            "SELECT id, `offset`, `limit`, `end`, `end` AS e, `values`, `interval`, `struct`, \
             `trim` FROM __strata_source AS s WHERE `offset` > 1 AND `exists` = true"
        )
    );
    let f = only_flow(
        "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (offset, limit) \
         APPLY AS DELETE WHEN end = 'D' SEQUENCE BY offset",
    );
    assert_eq!(f.keys, vec!["offset", "limit"]);
    assert_eq!(f.delete_when.as_deref(), Some("`end` = 'D'"));
    assert_eq!(f.sequence_by, SequenceBy::Expr("`offset`".to_string()));
    let f = only_flow(
        "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY STRUCT(offset, ts)",
    );
    assert_eq!(
        f.sequence_by,
        SequenceBy::Struct(vec![
            ("offset".to_string(), "`offset`".to_string()),
            ("ts".to_string(), "ts".to_string())
        ])
    );
    // Trailing commas are not Spark's: the comma before FROM is an error.
    let (_, _, message, _) =
        syntax_error("CREATE MATERIALIZED VIEW m AS SELECT id, offset, FROM s");
    assert!(message.contains("expected"), "{message}");
}

#[test]
fn triple_quoted_strings_are_strings() {
    let t = only_table(
        "CREATE STREAMING TABLE t COMMENT \"\"\"Raw \"orders\",\nas landed\"\"\" \
         AS SELECT *, '''it's''' AS note FROM STREAM(s)",
    );
    assert_eq!(t.comment.as_deref(), Some("Raw \"orders\",\nas landed"));
    assert_eq!(
        t.query.map(|q| q.sql).as_deref(),
        Some("SELECT *, 'it''s' AS note FROM __strata_source AS s")
    );
}

#[test]
fn a_streaming_aggregation_is_refused_with_the_materialized_view_it_should_be() {
    for query in [
        "SELECT city, count(*) AS n FROM STREAM(rides) GROUP BY city",
        "SELECT count(*) FROM STREAM(rides)",
        "SELECT DISTINCT city FROM STREAM(rides)",
        "SELECT * FROM (SELECT city, SUM(km) AS km FROM STREAM(rides) GROUP BY city)",
        "WITH c AS (SELECT city, max(km) AS km FROM STREAM(rides) GROUP BY ALL) SELECT * FROM c",
        "SELECT id, row_number() OVER (PARTITION BY city ORDER BY km) AS r FROM STREAM(rides)",
        "SELECT city, n FROM STREAM read_files('in', format => 'json') GROUP BY city, n",
    ] {
        let text = format!("CREATE STREAMING TABLE t AS {query}");
        let (line, column, message, _) = syntax_error(&text);
        assert_eq!((line, column), (1, 29), "{query}");
        assert!(
            message.starts_with("this query aggregates its streaming source")
                && message.contains("Make it a materialized view"),
            "{query}: {message}"
        );
    }
    // The same in an append flow.
    let (_, _, message, _) = syntax_error(
        "CREATE FLOW f AS INSERT INTO t BY NAME SELECT city, count(*) AS n FROM STREAM(rides) GROUP BY city",
    );
    assert!(message.starts_with("this query aggregates"), "{message}");
    // Aggregating the static side of a stream-static join, a scalar function, or a batch
    // query (a materialized view, a once flow) is not a streaming aggregation.
    only_table(
        "CREATE STREAMING TABLE t AS SELECT r.id, upper(r.city) AS city, m.km FROM STREAM(rides) r \
         JOIN (SELECT city, max(km) AS km FROM cities GROUP BY city) m ON r.city = m.city",
    );
    parse("CREATE MATERIALIZED VIEW m AS SELECT city, count(*) AS n FROM rides GROUP BY city");
    parse(
        "CREATE FLOW f AS INSERT INTO ONCE t BY NAME SELECT city, count(*) AS n FROM rides GROUP BY city",
    );
}

#[test]
fn informational_key_constraints_are_recorded_as_properties() {
    let t = only_table(
        "CREATE STREAMING TABLE sales (\
           order_num BIGINT NOT NULL, \
           line BIGINT PRIMARY KEY, \
           customer_key BIGINT FOREIGN KEY REFERENCES dbdemos.tpch.customers_dim, \
           date_key BIGINT CONSTRAINT date_fk FOREIGN KEY REFERENCES date_dim (key) NOT ENFORCED RELY, \
           CONSTRAINT valid CHECK_PLACEHOLDER \
         )"
        .replace("CONSTRAINT valid CHECK_PLACEHOLDER", "CONSTRAINT valid EXPECT (line > 0)")
        .as_str(),
    );
    assert_eq!(t.expectations.len(), 1);
    assert_eq!(
        t.properties,
        BTreeMap::from([
            (
                "strata.constraint.date_fk".to_string(),
                "FOREIGN KEY (date_key) REFERENCES date_dim (key)".to_string()
            ),
            (
                "strata.constraint.fk_customer_key".to_string(),
                "FOREIGN KEY (customer_key) REFERENCES dbdemos.tpch.customers_dim".to_string()
            ),
            (
                "strata.constraint.pk_line".to_string(),
                "PRIMARY KEY (line)".to_string()
            ),
        ])
    );
    let t = only_table(
        "CREATE STREAMING TABLE f (a INT, b INT, CONSTRAINT f_pk PRIMARY KEY(a, b TIMESERIES) RELY, \
         FOREIGN KEY (b) REFERENCES d (id)) TBLPROPERTIES ('x' = 'y')",
    );
    assert_eq!(
        t.properties
            .get("strata.constraint.f_pk")
            .map(String::as_str),
        Some("PRIMARY KEY (a, b)")
    );
    assert_eq!(
        t.properties
            .get("strata.constraint.fk_b")
            .map(String::as_str),
        Some("FOREIGN KEY (b) REFERENCES d (id)")
    );
    assert_eq!(t.properties.get("x").map(String::as_str), Some("y"));
    let (line, column, message, _) =
        syntax_error("CREATE STREAMING TABLE f (a INT, CONSTRAINT p PRIMARY KEY (z))");
    assert_eq!((line, column), (1, 34));
    assert!(
        message.contains("column z, which the column list does not declare"),
        "{message}"
    );
}

#[test]
fn legacy_incremental_live_tables_and_set_statements() {
    let p = parse(
        "SET spark.databricks.cloudFiles.schemaInference.sampleSize.numFiles = 100;\n\
         SET spark.source;\n\
         CREATE INCREMENTAL LIVE TABLE customers COMMENT 'target';",
    );
    assert_eq!(p.statements.len(), 1);
    let Statement::StreamingTable(t) = &p.statements[0] else {
        panic!("a streaming table")
    };
    assert_eq!(
        (t.name.name.as_str(), t.query.is_none()),
        ("customers", true)
    );
}

#[test]
fn materialized_views_read_files_in_batch() {
    let p = parse(
        "CREATE MATERIALIZED VIEW m AS SELECT r.id, c._c1 FROM parquet.`data/rides` AS r \
         JOIN csv.`data/cities/*.csv` c ON r.city = c._c0 \
         JOIN read_files('data/extra', format => 'json', schemaHints => 'id BIGINT') x ON x.id = r.id \
         JOIN parquet.rides p ON p.id = r.id",
    );
    let Statement::MaterializedView(m) = &p.statements[0] else {
        panic!("a materialized view")
    };
    assert_eq!(
        m.query.sql,
        "SELECT r.id, c._c1 FROM __strata_files_0 AS r JOIN __strata_files_1 c ON r.city = c._c0 \
         JOIN __strata_files_2 x ON x.id = r.id JOIN parquet.rides p ON p.id = r.id"
    );
    let files: Vec<(&str, FileFormat, bool)> = m
        .query
        .files
        .iter()
        .map(|f| (f.spec.path.as_str(), f.spec.format, f.direct))
        .collect();
    assert_eq!(
        files,
        vec![
            ("data/rides", FileFormat::Parquet, true),
            ("data/cities/*.csv", FileFormat::Csv, true),
            ("data/extra", FileFormat::Json, false),
        ]
    );
    // `parquet.rides` (no backticks) is a table of a schema named parquet.
    assert_eq!(
        m.query.reads,
        vec![TableName::new(Some("parquet"), "rides")]
    );
    let (line, column, message, _) = syntax_error("CREATE VIEW v AS SELECT * FROM json.`data/x`");
    assert_eq!((line, column), (1, 32));
    assert_eq!(
        message,
        "a view cannot read files yet; read them in a materialized view"
    );
}
