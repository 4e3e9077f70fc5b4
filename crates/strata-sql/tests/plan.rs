//! Planner tests: the execution order and every dataset-graph error.

use strata_sql::*;

fn plan(text: &str) -> Result<PipelinePlan> {
    plan_pipeline(parse_pipeline(text).unwrap_or_else(|e| panic!("{e}")))
}

/// The plan error for `text`: (line, message as displayed after the location).
fn plan_error(text: &str) -> (u64, String) {
    match plan(text) {
        Err(e @ SqlError::Plan { .. }) => {
            let SqlError::Plan { location, .. } = &e else {
                unreachable!()
            };
            let shown = e.to_string();
            let message = shown
                .strip_prefix(&format!("{location}: "))
                .unwrap_or(&shown);
            (location.line, message.to_string())
        }
        other => panic!("expected a plan error for {text}, got {other:?}"),
    }
}

fn t(name: &str) -> TableName {
    TableName::new(None, name)
}

const CDC: &str =
    "CREATE STREAMING TABLE cdc AS SELECT * FROM STREAM read_files('d', format => 'json');\n";

#[test]
fn documented_example_plans() {
    let p = plan(
        "CREATE STREAMING TABLE users;\n\
         CREATE FLOW users_flow AS AUTO CDC INTO users FROM STREAM(users_cdc) KEYS (userId)\n\
           SEQUENCE BY seq STORED AS SCD TYPE 2 TRACK HISTORY ON * EXCEPT (city);\n\
         CREATE STREAMING TABLE users_cdc AS SELECT * FROM STREAM read_files('d', format => 'json');",
    )
    .unwrap();
    assert_eq!(p.tables.len(), 2);
    assert_eq!(p.flows.len(), 1);
    // The ingest comes first although it is declared last: the flow reads its table.
    assert_eq!(p.order, vec![Node::Ingest(t("users_cdc")), Node::Flow(0)]);
}

#[test]
fn order_follows_the_graph_then_the_file() {
    let p = plan(&format!(
        "{CDC}\
         CREATE STREAMING TABLE silver;\n\
         CREATE STREAMING TABLE gold;\n\
         CREATE FLOW to_gold AS AUTO CDC INTO gold FROM STREAM(silver_view) KEYS (id) SEQUENCE BY ts;\n\
         CREATE FLOW to_silver AS AUTO CDC INTO silver FROM STREAM(cdc) KEYS (id) SEQUENCE BY ts;\n\
         CREATE STREAMING TABLE silver_view AS SELECT * FROM STREAM(silver);\n\
         CREATE STREAMING TABLE other AS SELECT * FROM STREAM read_files('e', format => 'csv');"
    ))
    .unwrap();
    assert_eq!(
        p.order,
        vec![
            Node::Ingest(t("cdc")),
            Node::Flow(1),
            Node::Ingest(t("silver_view")),
            Node::Flow(0),
            Node::Ingest(t("other")),
        ]
    );
}

#[test]
fn two_flows_into_one_target() {
    let base = format!(
        "{CDC}CREATE STREAMING TABLE cdc2 AS SELECT * FROM STREAM read_files('e', format => 'json');\n\
         CREATE STREAMING TABLE target;\n\
         CREATE FLOW a AS AUTO CDC INTO target FROM cdc KEYS (id, k) SEQUENCE BY ts STORED AS SCD TYPE 2;\n"
    );
    let ok = plan(&format!(
        "{base}CREATE FLOW b AS AUTO CDC INTO target FROM cdc2 KEYS (K, id) SEQUENCE BY ts STORED AS SCD TYPE 2;"
    ))
    .unwrap();
    assert_eq!(ok.order.len(), 4);

    let (line, m) = plan_error(&format!(
        "{base}CREATE FLOW b AS AUTO CDC INTO target FROM cdc2 KEYS (id, k) SEQUENCE BY ts;"
    ));
    assert_eq!(line, 5);
    assert!(m.contains("different keys or SCD type"), "{m}");
    let (_, m) = plan_error(&format!(
        "{base}CREATE FLOW b AS AUTO CDC INTO target FROM cdc2 KEYS (id) SEQUENCE BY ts STORED AS SCD TYPE 2;"
    ));
    assert!(m.contains("different keys or SCD type"), "{m}");
}

#[test]
fn graph_errors() {
    let cases: &[(&str, u64, &str)] = &[
        (
            "CREATE STREAMING TABLE a;\nCREATE STREAMING TABLE LIVE.a;",
            2,
            "table default.a is declared twice",
        ),
        (
            "CREATE STREAMING TABLE a;\nCREATE STREAMING TABLE b;\n\
             CREATE FLOW f AS AUTO CDC INTO a FROM b KEYS (id) SEQUENCE BY ts;\n\
             CREATE FLOW f AS AUTO CDC INTO b FROM a KEYS (id) SEQUENCE BY ts;",
            4,
            "flow f is declared twice",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE FLOW f AS AUTO CDC INTO nowhere FROM s KEYS (id) SEQUENCE BY ts;",
            2,
            "writes default.nowhere, which is not declared",
        ),
        (
            "CREATE STREAMING TABLE t;\nCREATE FLOW f AS AUTO CDC INTO t FROM nowhere KEYS (id) SEQUENCE BY ts;",
            2,
            "reads default.nowhere, which is not declared",
        ),
        (
            "CREATE STREAMING TABLE t AS SELECT * FROM STREAM(nowhere);",
            1,
            "reads STREAM(default.nowhere), which is not declared",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t AS SELECT * FROM STREAM(s);\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts;",
            3,
            "filled by its own AS query",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t;\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts TRACK HISTORY ON a;",
            3,
            "TRACK HISTORY needs STORED AS SCD TYPE 2",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t;\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS () SEQUENCE BY ts;",
            3,
            "has no KEYS",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t;\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id, ID) SEQUENCE BY ts;",
            3,
            "column ID is listed twice in KEYS",
        ),
        (
            "CREATE STREAMING TABLE a;\nCREATE STREAMING TABLE b;\n\
             CREATE FLOW a_to_b AS AUTO CDC INTO b FROM a KEYS (id) SEQUENCE BY ts;\n\
             CREATE FLOW b_to_a AS AUTO CDC INTO a FROM b KEYS (id) SEQUENCE BY ts;",
            3,
            "cycle",
        ),
        (
            "CREATE STREAMING TABLE a;\n\
             CREATE FLOW self AS AUTO CDC INTO a FROM a KEYS (id) SEQUENCE BY ts;",
            2,
            "cycle: flow self -> flow self",
        ),
        (
            "CREATE STREAMING TABLE a AS SELECT * FROM STREAM(a);",
            1,
            "cycle",
        ),
    ];
    for (text, line, fragment) in cases {
        let (l, m) = plan_error(text);
        assert!(m.contains(fragment), "{text}: {m}");
        assert_eq!(l, *line, "{text}: {m}");
    }
}

#[test]
fn snapshot_flows_own_their_target() {
    let (line, m) = plan_error(&format!(
        "{CDC}CREATE STREAMING TABLE t;\n\
         CREATE FLOW a AS AUTO CDC FROM SNAPSHOT INTO t FROM cdc KEYS (id) SNAPSHOT VERSION BY v;\n\
         CREATE FLOW b AS AUTO CDC INTO t FROM STREAM(cdc) KEYS (id) SEQUENCE BY v;"
    ));
    assert_eq!(line, 4);
    assert!(m.contains("cannot share a target"), "{m}");
    let (line, m) = plan_error(&format!(
        "{CDC}CREATE STREAMING TABLE t;\n\
         CREATE FLOW a AS AUTO CDC FROM SNAPSHOT INTO t FROM cdc KEYS (id) SNAPSHOT VERSION BY v;\n\
         CREATE FLOW b AS AUTO CDC FROM SNAPSHOT INTO t FROM cdc KEYS (id) SNAPSHOT VERSION BY v;"
    ));
    assert_eq!(line, 4);
    assert!(m.contains("must be the only flow into its target"), "{m}");
    let (_, m) = plan_error(&format!(
        "{CDC}CREATE STREAMING TABLE t;\n\
         CREATE FLOW a AS AUTO CDC FROM SNAPSHOT INTO t FROM cdc KEYS (id) STORED AS SNAPSHOTS \
         TRACK HISTORY ON x;"
    ));
    assert!(
        m.contains("TRACK HISTORY needs STORED AS SCD TYPE 2; SNAPSHOTS"),
        "{m}"
    );
}

#[test]
fn point_in_time_tables_read_historised_targets() {
    let flows = "CREATE STREAMING TABLE h;\n\
         CREATE FLOW fh AS AUTO CDC INTO h FROM STREAM(cdc) KEYS (id) SEQUENCE BY v STORED AS SCD TYPE 2;\n\
         CREATE STREAMING TABLE c;\n\
         CREATE FLOW fc AS AUTO CDC INTO c FROM STREAM(cdc) KEYS (id) SEQUENCE BY v;\n";
    let ok = plan(&format!(
        "{CDC}{flows}CREATE POINT IN TIME TABLE p KEYS (id) AS OF (1, 2) FROM h;"
    ))
    .unwrap();
    assert_eq!(ok.order.last(), Some(&Node::PointInTime(0)));
    let (line, m) = plan_error(&format!(
        "{CDC}{flows}CREATE POINT IN TIME TABLE p KEYS (id) AS OF (1) FROM c;"
    ));
    assert_eq!(line, 6);
    assert!(
        m.contains("c is stored as SCD TYPE 1 and keeps no history"),
        "{m}"
    );
    let (_, m) = plan_error(&format!(
        "{CDC}{flows}CREATE POINT IN TIME TABLE p KEYS (id) AS OF (1) FROM cdc;"
    ));
    assert!(m.contains("not the target of an AUTO CDC flow"), "{m}");
    let (_, m) = plan_error(&format!(
        "{CDC}{flows}CREATE POINT IN TIME TABLE p KEYS (id) AS OF (1) FROM h, h;"
    ));
    assert!(m.contains("listed twice in FROM"), "{m}");
}

#[test]
fn materialized_views_and_append_flows_order_by_what_they_read() {
    // The view is declared first but reads the CDC target through a view.
    let p = plan(
        "CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n FROM recent;\n\
         CREATE VIEW recent AS SELECT * FROM users WHERE id > 0;\n\
         CREATE STREAMING TABLE raw AS SELECT * FROM STREAM read_files('d', format => 'json');\n\
         CREATE STREAMING TABLE users;\n\
         CREATE FLOW f AS AUTO CDC INTO users FROM STREAM(raw) KEYS (id) SEQUENCE BY ts;\n\
         CREATE STREAMING TABLE everything;\n\
         CREATE FLOW copy AS INSERT INTO everything BY NAME SELECT * FROM STREAM(users);",
    )
    .unwrap();
    assert_eq!(
        p.order,
        vec![
            Node::Ingest(t("raw")),
            Node::Flow(0),
            Node::MaterializedView(t("totals")),
            Node::Append(0),
        ]
    );
    assert_eq!(
        p.reads(&Node::MaterializedView(t("totals"))),
        vec![t("users")]
    );
}

#[test]
fn a_stream_static_join_runs_after_the_tables_it_joins() {
    // The enriched stream is declared first but joins the SCD2 target (through a view)
    // and its current state: it runs after the flow that writes them.
    let p = plan(
        "CREATE STREAMING TABLE enriched AS SELECT o.*, c.tier FROM STREAM(orders) o\n\
           JOIN as_of('customers', 3) c ON c.id = o.cid JOIN vips v ON v.id = o.cid;\n\
         CREATE VIEW vips AS SELECT id FROM customers WHERE tier = 'gold';\n\
         CREATE STREAMING TABLE orders AS SELECT * FROM STREAM read_files('o', format => 'json');\n\
         CREATE STREAMING TABLE raw AS SELECT * FROM STREAM read_files('d', format => 'json');\n\
         CREATE STREAMING TABLE customers;\n\
         CREATE FLOW f AS AUTO CDC INTO customers FROM STREAM(raw) KEYS (id) SEQUENCE BY ts\n\
           STORED AS SCD TYPE 2;",
    )
    .unwrap();
    assert_eq!(
        p.order,
        vec![
            Node::Ingest(t("orders")),
            Node::Ingest(t("raw")),
            Node::Flow(0),
            Node::Ingest(t("enriched")),
        ]
    );
    assert_eq!(
        p.reads(&Node::Ingest(t("enriched"))),
        vec![t("orders"), t("customers")]
    );
}

#[test]
fn materialized_view_and_append_flow_errors() {
    let cases: &[(&str, u64, &str)] = &[
        (
            "CREATE MATERIALIZED VIEW a AS SELECT * FROM b;\nCREATE MATERIALIZED VIEW b AS SELECT * FROM a;",
            1,
            "cycle: materialized view default.b -> materialized view default.a -> materialized view default.b",
        ),
        (
            "CREATE MATERIALIZED VIEW a AS SELECT * FROM a;",
            1,
            "reads itself",
        ),
        (
            "CREATE VIEW a AS SELECT * FROM b;\nCREATE VIEW b AS SELECT * FROM a;",
            1,
            "cycle: view default.a -> view default.b -> view default.a",
        ),
        (
            "CREATE MATERIALIZED VIEW m AS SELECT 1 AS x;\nCREATE STREAMING TABLE s AS SELECT * FROM STREAM(m);",
            2,
            "STREAM(default.m), which is a materialized view",
        ),
        (
            // An AUTO CDC flow from a live table (a materialized view) says what the source
            // is, not that it is undeclared.
            "CREATE LIVE TABLE m AS SELECT 1 AS id, 1 AS ts;\nCREATE STREAMING TABLE t;\n\
             APPLY CHANGES INTO t FROM stream(m) KEYS (id) SEQUENCE BY ts;",
            3,
            "flow t reads STREAM(default.m), which is a materialized view",
        ),
        (
            "CREATE FLOW f AS INSERT INTO nowhere BY NAME SELECT * FROM STREAM read_files('d', format => 'json');",
            1,
            "inserts into default.nowhere, which is not declared",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t;\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts;\n\
             CREATE FLOW g AS INSERT INTO t BY NAME SELECT * FROM STREAM(s);",
            4,
            "which an AUTO CDC flow writes",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE STREAMING TABLE t (CONSTRAINT c EXPECT (id > 0));\n\
             CREATE FLOW f AS AUTO CDC INTO t FROM s KEYS (id) SEQUENCE BY ts;",
            2,
            "is the target of an AUTO CDC flow; expectations belong on the table",
        ),
        (
            "CREATE STREAMING TABLE raw AS SELECT * FROM STREAM read_files('d', format => 'json');\n\
             CREATE STREAMING TABLE s AS SELECT * FROM STREAM(raw) r WHERE r.id NOT IN (SELECT id FROM s);",
            2,
            "streaming table default.s reads itself in its query",
        ),
        (
            "CREATE STREAMING TABLE raw AS SELECT * FROM STREAM read_files('d', format => 'json');\n\
             CREATE STREAMING TABLE t;\n\
             CREATE FLOW f AS INSERT INTO t BY NAME SELECT * FROM STREAM(raw) JOIN t ON true;",
            3,
            "flow f reads default.t, the table it inserts into",
        ),
        (
            "CREATE STREAMING TABLE a AS SELECT * FROM STREAM read_files('d', format => 'json') JOIN b ON true;\n\
             CREATE STREAMING TABLE b AS SELECT * FROM STREAM(a);",
            1,
            "cycle",
        ),
        (
            "CREATE STREAMING TABLE s;\nCREATE MATERIALIZED VIEW s AS SELECT 1 AS x;",
            2,
            "table default.s is declared twice (first at 1:1)",
        ),
    ];
    for (text, line, fragment) in cases {
        let (l, m) = plan_error(text);
        assert!(m.contains(fragment), "{text}: {m}");
        assert_eq!(l, *line, "{text}: {m}");
    }
}

/// A once flow runs after what its batch query reads (tables, views resolved); its target
/// must be a declared streaming table that no AUTO CDC flow writes, and it may not read it.
#[test]
fn once_flows_run_after_what_they_read() {
    let p = plan(
        "CREATE STREAMING TABLE all_orders;\n\
         CREATE FLOW seed AS INSERT INTO ONCE all_orders BY NAME SELECT * FROM recent;\n\
         CREATE VIEW recent AS SELECT * FROM orders WHERE id > 0;\n\
         CREATE MATERIALIZED VIEW orders AS SELECT 1 AS id;",
    )
    .unwrap();
    assert!(p.appends[0].once);
    assert_eq!(
        p.order,
        vec![Node::MaterializedView(t("orders")), Node::Append(0)]
    );
    assert_eq!(p.reads(&Node::Append(0)), vec![t("orders")]);
    let cases: &[(&str, u64, &str)] = &[
        (
            "CREATE FLOW seed AS INSERT INTO ONCE nowhere BY NAME SELECT 1 AS id;",
            1,
            "flow seed inserts into default.nowhere, which is not declared",
        ),
        (
            "CREATE STREAMING TABLE t;\n\
             CREATE FLOW seed AS INSERT INTO ONCE t BY NAME SELECT * FROM t WHERE id > 1;",
            2,
            "flow seed reads default.t, the table it inserts into",
        ),
        (
            &format!(
                "{CDC}CREATE STREAMING TABLE t;\n\
                 CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(cdc) KEYS (id) SEQUENCE BY ts;\n\
                 CREATE FLOW seed AS INSERT INTO ONCE t BY NAME SELECT * FROM cdc;"
            ),
            4,
            "which an AUTO CDC flow writes",
        ),
    ];
    for (text, line, message) in cases {
        let (l, m) = plan_error(text);
        assert!(m.contains(message), "{text}: {m}");
        assert_eq!(l, *line, "{text}: {m}");
    }
}
