//! The real `strata` binary in temp dirs: run, query in each format, validate, and the error
//! cases with their exit codes and messages.

mod common;

use common::{stderr, stdout, table_files, walk, Project};
use std::path::Path;
use std::process::Command;

const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE users_cdc
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'userId INT, name STRING, city STRING, operation STRING, sequenceNum INT');
CREATE OR REFRESH STREAMING TABLE users;
CREATE FLOW users_flow AS AUTO CDC INTO users
FROM STREAM(users_cdc)
KEYS (userId)
APPLY AS DELETE WHEN operation = "DELETE"
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 2;
"#;

const BATCH1: &str = r#"{"userId": 124, "name": "Raul", "city": "Oaxaca", "operation": "INSERT", "sequenceNum": 1}
{"userId": 123, "name": "Isabel", "city": "Monterrey", "operation": "INSERT", "sequenceNum": 1}
{"userId": 125, "name": "Mercedes", "city": "Tijuana", "operation": "INSERT", "sequenceNum": 2}
{"userId": 126, "name": "Lily", "city": "Cancun", "operation": "INSERT", "sequenceNum": 2}
{"userId": 123, "name": null, "city": null, "operation": "DELETE", "sequenceNum": 6}
{"userId": 125, "name": "Mercedes", "city": "Guadalajara", "operation": "UPDATE", "sequenceNum": 6}
"#;

const BATCH2: &str = r#"{"userId": 125, "name": "Mercedes", "city": "Mexicali", "operation": "UPDATE", "sequenceNum": 5}
{"userId": 123, "name": "Isabel", "city": "Chihuahua", "operation": "UPDATE", "sequenceNum": 5}
"#;

#[test]
fn run_query_validate_late_events() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    let out = p.run();
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    assert!(
        stdout(&out).contains("ingested 6 row(s) from 1 file(s)"),
        "{}",
        stdout(&out)
    );

    p.file("data/cdc/002.json", BATCH2);
    let out = p.run();
    assert!(out.status.success(), "run failed: {}", stderr(&out));

    let csv = p.query("csv", "SELECT * FROM users ORDER BY userId, __START_AT");
    assert_eq!(
        csv,
        "userId,name,city,__START_AT,__END_AT\n\
         123,Isabel,Monterrey,1,5\n\
         123,Isabel,Chihuahua,5,6\n\
         124,Raul,Oaxaca,1,\n\
         125,Mercedes,Tijuana,2,5\n\
         125,Mercedes,Mexicali,5,6\n\
         125,Mercedes,Guadalajara,6,\n\
         126,Lily,Cancun,2,\n"
    );

    let json = p.query(
        "json",
        "SELECT userId, city, __END_AT FROM default.users WHERE userId = 124",
    );
    assert_eq!(
        json,
        "{\"userId\":124,\"city\":\"Oaxaca\",\"__END_AT\":null}\n"
    );

    let table = p.query("table", "SELECT count(*) AS n FROM users");
    assert!(table.contains("| n |"), "{table}");
    assert!(table.contains("| 7 |"), "{table}");

    let out = p.strata(&["validate", "users"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("users: ok"));

    // Nothing new: the run commits nothing.
    let before = table_files(&p.path("warehouse"));
    let out = p.run();
    assert!(out.status.success());
    assert!(stdout(&out).contains("no new files"), "{}", stdout(&out));
    assert_eq!(before, table_files(&p.path("warehouse")));
}

#[test]
fn empty_input_folder_waits_and_says_so() {
    let p = Project::new(&PIPELINE.replace(
        "format => 'json',\n  schema => 'userId INT, name STRING, city STRING, operation STRING, sequenceNum INT')",
        "format => 'json')",
    ));
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("waiting: default.users_cdc: no input files yet"),
        "{text}"
    );
    assert!(text.contains("waiting: flow users_flow"), "{text}");
    p.file("data/cdc/001.json", BATCH1);
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    // Schema inferred from the file: 123[1,6) 124[1,) 125[2,6) 125[6,) 126[2,).
    assert_eq!(p.query("csv", "SELECT count(*) AS n FROM users"), "n\n5\n");
}

#[test]
fn warehouse_from_environment() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    let wh = p.path("elsewhere");
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "pipeline.sql"])
        .current_dir(p.dir.path())
        .env("STRATA_WAREHOUSE", &wh)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(wh.join("default/users/_delta_log").is_dir());
    assert!(!p.path("warehouse").exists());
}

#[test]
fn malformed_pipeline_names_line_and_column() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE users;\n\
         CREATE FLOW f AS AUTO CDC INTO users FROM STREAM(x)\n\
         KEY (userId) SEQUENCE BY s;\n",
    );
    let out = p.run();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("pipeline.sql:3:1"), "{err}");
    assert!(err.contains("KEY"), "{err}");
    assert!(!p.path("warehouse/default").exists());
}

#[test]
fn unknown_column_fails_before_anything_runs() {
    let p = Project::new(&PIPELINE.replace("SEQUENCE BY sequenceNum", "SEQUENCE BY seqNum"));
    p.file("data/cdc/001.json", BATCH1);
    let out = p.run();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("flow users_flow"), "{err}");
    assert!(err.contains("seqNum"), "{err}");
    assert!(
        !p.path("warehouse/default").exists(),
        "nothing may be written"
    );
}

#[test]
fn null_key_rejects_the_batch_and_writes_nothing() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    assert!(p.run().status.success());
    let before = table_files(&p.path("warehouse"));
    p.file(
        "data/cdc/002.json",
        "{\"userId\": null, \"name\": \"X\", \"city\": \"Y\", \"operation\": \"INSERT\", \"sequenceNum\": 9}\n\
         {\"userId\": null, \"name\": \"Z\", \"city\": \"Y\", \"operation\": \"INSERT\", \"sequenceNum\": 9}\n",
    );
    let out = p.run();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("flow users_flow"), "{err}");
    assert!(err.contains("002.json"), "{err}");
    assert!(err.contains("userId"), "{err}");
    assert!(err.contains("2 row(s)"), "{err}");
    assert_eq!(
        before,
        table_files(&p.path("warehouse")),
        "tables unchanged"
    );
}

#[test]
fn unparsable_file_is_named() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        "{\"userId\": \"not a number\", \"sequenceNum\": 1}\n",
    );
    let out = p.run();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("001.json"), "{err}");
    assert!(!p.path("warehouse/default/users_cdc/_delta_log").exists());
}

#[test]
fn conflicting_tie_names_key_and_sequence() {
    let p = Project::new(PIPELINE);
    p.file(
        "data/cdc/001.json",
        "{\"userId\": 7, \"name\": \"A\", \"city\": \"x\", \"operation\": \"INSERT\", \"sequenceNum\": 3}\n\
         {\"userId\": 7, \"name\": \"B\", \"city\": \"x\", \"operation\": \"INSERT\", \"sequenceNum\": 3}\n",
    );
    let out = p.run();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("userId=7"), "{err}");
    assert!(err.contains("sequence value 3"), "{err}");
    let users = p.path("warehouse/default/users");
    let rows = if users.join("_delta_log").exists() {
        p.query("csv", "SELECT count(*) AS n FROM users")
    } else {
        "n\n0\n".to_string()
    };
    assert_eq!(rows, "n\n0\n");
}

#[test]
fn query_errors() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    assert!(p.run().status.success());
    let out = p.strata(&["query", "SELECT * FROM nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("table main.default.nope not found"),
        "{}",
        stderr(&out)
    );
    // A near miss names the table meant, in the catalog the user sees.
    let out = p.strata(&["query", "SELECT * FROM userz"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("table main.default.userz not found; did you mean main.default.users")
            && !err.contains("strata.default"),
        "{err}"
    );
    let out = p.strata(&["validate", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no table default.nope"),
        "{}",
        stderr(&out)
    );
    let out = p.strata(&["validate", "users_cdc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not an AUTO CDC target"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn validate_reports_broken_timelines() {
    // A table with two open versions for one key and an interval that ends before it starts,
    // written directly with deltalake (strata itself never writes one).
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("default/broken");
    std::fs::create_dir_all(&path).expect("mkdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use deltalake::arrow::array::{Int64Array, RecordBatch};
        use deltalake::arrow::datatypes::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("__START_AT", DataType::Int64, true),
            Field::new("__END_AT", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 2])),
                Arc::new(Int64Array::from(vec![1, 5, 9])),
                Arc::new(Int64Array::from(vec![None, None, Some(4)])),
            ],
        )
        .expect("batch");
        let url = url::Url::from_directory_path(&path).expect("url");
        let table = deltalake::DeltaTableBuilder::from_url(url)
            .expect("url")
            .build()
            .expect("handle")
            .create()
            .with_columns(["id", "__START_AT", "__END_AT"].map(|c| {
                deltalake::kernel::StructField::new(c, deltalake::kernel::DataType::LONG, true)
            }))
            .with_configuration([("strata.keys", Some("id")), ("strata.scdType", Some("2"))])
            .with_raise_if_key_not_exists(false)
            .await
            .expect("create");
        table.write(vec![batch]).await.expect("write");
    });
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["validate", "--warehouse"])
        .arg(dir.path())
        .arg("broken")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("key (id=1): has 2 open versions"), "{text}");
    assert!(
        text.contains("key (id=2): version starting at 9 does not end after it starts"),
        "{text}"
    );
    assert!(
        text.contains("key (id=1): version starting at 1 overlaps"),
        "{text}"
    );
}

const SNAPSHOT_PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE deliveries
AS SELECT * FROM STREAM read_files('data/snap', format => 'csv', header => true,
  schema => 'id INT, city STRING, v INT');
CREATE OR REFRESH STREAMING TABLE customers TBLPROPERTIES ('strata.scd.convention' = '${convention}');
CREATE FLOW customers_hist AS AUTO CDC FROM SNAPSHOT INTO customers
FROM STREAM(deliveries)
KEYS (id)
SNAPSHOT VERSION BY v
COLUMNS * EXCEPT (v)
STORED AS ${mode};
"#;

/// The history mode and the convention come from configuration values; a late snapshot is
/// reported and placed into history; `as_of` reads it back.
#[test]
fn snapshots_with_configured_mode_late_version_and_as_of() {
    let p = Project::new(SNAPSHOT_PIPELINE);
    std::fs::create_dir_all(p.path("data/snap")).expect("mkdir");
    p.file(
        "data/snap/001.csv",
        "id,city,v\n1,Oaxaca,1\n2,Monterrey,1\n1,Oaxaca,3\n2,Carmel,3\n",
    );

    // A missing value names the place and runs nothing.
    let out = p.run();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("5:87: configuration value `convention` is not set"),
        "{}",
        stderr(&out)
    );
    assert!(!p.path("warehouse/default/customers").exists());

    let run = |p: &Project| {
        p.strata(&[
            "run",
            "pipeline.sql",
            "--conf",
            "mode=SCD TYPE 2",
            "--conf",
            "convention=dbt",
        ])
    };
    let out = run(&p);
    assert!(out.status.success(), "run failed: {}", stderr(&out));

    p.file("data/snap/002.csv", "id,city,v\n1,Oaxaca,2\n2,Tijuana,2\n");
    let out = run(&p);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    assert!(
        stdout(&out).contains("snapshot version 2 arrived after version 3 was applied"),
        "{}",
        stdout(&out)
    );
    let csv = p.query(
        "csv",
        "SELECT id, city, dbt_valid_from, dbt_valid_to FROM customers ORDER BY id, dbt_valid_from",
    );
    assert_eq!(
        csv,
        "id,city,dbt_valid_from,dbt_valid_to\n\
         1,Oaxaca,1,\n\
         2,Monterrey,1,2\n\
         2,Tijuana,2,3\n\
         2,Carmel,3,\n"
    );
    let csv = p.query(
        "csv",
        "SELECT id, city FROM as_of('customers', 2) ORDER BY id",
    );
    assert_eq!(csv, "id,city\n1,Oaxaca\n2,Tijuana\n");
    let out = p.strata(&["validate", "customers"]);
    assert!(out.status.success(), "{}", stdout(&out));
}

/// A point-in-time table computes only new as-of values, and recomputes the ones a late
/// event can change.
#[test]
fn point_in_time_table_refreshes_incrementally() {
    let pipeline = |spine: &str| {
        format!(
            "CREATE OR REFRESH STREAMING TABLE cdc AS SELECT * FROM STREAM read_files('data/cdc', \
             format => 'csv', header => true, schema => 'id INT, name STRING, seq INT');\n\
             CREATE OR REFRESH STREAMING TABLE people;\n\
             CREATE FLOW f AS AUTO CDC INTO people FROM STREAM(cdc) KEYS (id) SEQUENCE BY seq \
             COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;\n\
             CREATE OR REFRESH POINT IN TIME TABLE people_pit KEYS (id) AS OF {spine} FROM people;\n"
        )
    };
    let p = Project::new(&pipeline("(10, 20, 30)"));
    p.file("data/cdc/001.csv", "id,name,seq\n1,a,10\n1,b,25\n2,c,15\n");
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("people_pit: 3 as-of value(s) computed (0 of them recomputed"),
        "{}",
        stdout(&out)
    );
    p.file("pipeline.sql", &pipeline("RANGE (10, 50, 10)"));
    let out = p.run();
    assert!(
        stdout(&out).contains("people_pit: 2 as-of value(s) computed (0 of them recomputed"),
        "{}",
        stdout(&out)
    );
    // A late event at 22 changes history from 22 on: as-of values 30, 40 and 50.
    p.file("data/cdc/002.csv", "id,name,seq\n1,x,22\n");
    let out = p.run();
    assert!(
        stdout(&out).contains("people_pit: 3 as-of value(s) computed (3 of them recomputed"),
        "{}",
        stdout(&out)
    );
    let csv = p.query(
        "csv",
        "SELECT as_of, id, people_start FROM people_pit ORDER BY as_of, id",
    );
    assert_eq!(
        csv,
        "as_of,id,people_start\n10,1,10\n20,1,10\n20,2,15\n30,1,25\n30,2,15\n\
         40,1,25\n40,2,15\n50,1,25\n50,2,15\n"
    );
    let out = p.run();
    assert!(
        stdout(&out).contains("people_pit: up to date"),
        "{}",
        stdout(&out)
    );
}

/// `strata.scd.partitionBy = 'start'` partitions a historised table by its start column;
/// the rows, `validate` and `as_of` are the same as without it.
#[test]
fn historised_table_partitioned_by_start() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE d AS SELECT * FROM STREAM read_files('data/snap', \
         format => 'csv', header => true, schema => 'id INT, city STRING, v DATE');\n\
         CREATE OR REFRESH STREAMING TABLE c TBLPROPERTIES ('strata.scd.convention' = 'kimball', \
         'strata.scd.partitionBy' = 'start');\n\
         CREATE FLOW f AS AUTO CDC FROM SNAPSHOT INTO c FROM STREAM(d) KEYS (id) \
         SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS SCD TYPE 2;\n",
    );
    std::fs::create_dir_all(p.path("data/snap")).expect("mkdir");
    p.file(
        "data/snap/001.csv",
        "id,city,v\n1,Oaxaca,2024-01-31\n2,Monterrey,2024-01-31\n1,Oaxaca,2024-02-29\n2,Carmel,2024-02-29\n",
    );
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(p.path("warehouse/default/c/valid_from=2024-01-31").is_dir());
    assert!(p.path("warehouse/default/c/valid_from=2024-02-29").is_dir());
    let csv = p.query(
        "csv",
        "SELECT id, city, valid_from, valid_to, is_current FROM c ORDER BY id, valid_from",
    );
    assert_eq!(
        csv,
        "id,city,valid_from,valid_to,is_current\n\
         1,Oaxaca,2024-01-31,9999-12-31,true\n\
         2,Monterrey,2024-01-31,2024-02-29,false\n\
         2,Carmel,2024-02-29,9999-12-31,true\n"
    );
    let csv = p.query(
        "csv",
        "SELECT id, city FROM as_of('c', DATE '2024-02-01') ORDER BY id",
    );
    assert_eq!(csv, "id,city\n1,Oaxaca\n2,Monterrey\n");
    let out = p.strata(&["validate", "c"]);
    assert!(out.status.success(), "{}", stdout(&out));
    // A second delivery changes key 1: a partitioned target's rows are replaced by delta-rs
    // (the one-pass rewrite handles unpartitioned tables only).
    p.file(
        "data/snap/002.csv",
        "id,city,v\n1,Puebla,2024-03-31\n2,Carmel,2024-03-31\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let csv =
        p.csv("SELECT id, city, valid_from, valid_to, is_current FROM c ORDER BY id, valid_from");
    assert_eq!(
        csv,
        "id,city,valid_from,valid_to,is_current\n\
         1,Oaxaca,2024-01-31,2024-03-31,false\n\
         1,Puebla,2024-03-31,9999-12-31,true\n\
         2,Monterrey,2024-01-31,2024-02-29,false\n\
         2,Carmel,2024-02-29,9999-12-31,true\n"
    );
    assert!(p.path("warehouse/default/c/valid_from=2024-03-31").is_dir());
    p.ok(&["validate", "c"]);
}

/// The bundled snapshot example (examples/customers) does what its README says.
#[test]
fn customers_example_runs_as_documented() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/customers");
    let p = Project::new("");
    for f in walk(&src) {
        let rel = f.strip_prefix(&src).expect("inside the example");
        let to = p.path(&rel.display().to_string());
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&f, &to).expect("copy");
    }
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::copy(
        p.path("late/2024-02.csv"),
        p.path("data/deliveries/2024-02.csv"),
    )
    .expect("copy");
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(
            "snapshot version 2024-02-29 arrived after version 2024-03-31 was applied: \
             placed into history between versions 2024-01-31 and 2024-03-31"
        ),
        "{}",
        stdout(&out)
    );
    let csv = p.query(
        "csv",
        "SELECT m.as_of, c.name, c.city, p.plan FROM customer_month_end m \
         LEFT JOIN dim_customer c ON c.surrogate_key = m.dim_customer_sk \
         LEFT JOIN dim_plan p ON p.surrogate_key = m.dim_plan_sk \
         WHERE m.as_of = DATE '2024-02-29' ORDER BY c.name",
    );
    assert_eq!(
        csv,
        "as_of,name,city,plan\n2024-02-29,Ana,Oaxaca,premium\n\
         2024-02-29,Ben,Carmel,premium\n2024-02-29,Cleo,Tijuana,\n"
    );
    let out = p.strata(&["validate", "dim_customer"]);
    assert!(out.status.success(), "{}", stdout(&out));
}

/// A date range spine keeps DATE values, and a second run with nothing new is up to date
/// (the values read back from the table equal the spine's).
#[test]
fn point_in_time_date_range_is_stable() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE cdc AS SELECT * FROM STREAM read_files('data/cdc', \
         format => 'csv', header => true, schema => 'id INT, plan STRING, day DATE');\n\
         CREATE OR REFRESH STREAMING TABLE plans;\n\
         CREATE FLOW f AS AUTO CDC INTO plans FROM STREAM(cdc) KEYS (id) SEQUENCE BY day \
         COLUMNS * EXCEPT (day) STORED AS SCD TYPE 2;\n\
         CREATE OR REFRESH POINT IN TIME TABLE pit KEYS (id) \
         AS OF RANGE (DATE '2024-01-01', DATE '2024-01-05', INTERVAL 1 DAY) FROM plans;\n",
    );
    p.file(
        "data/cdc/001.csv",
        "id,plan,day\n1,free,2024-01-02\n1,premium,2024-01-04\n",
    );
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = p.query(
        "csv",
        "SELECT as_of, arrow_typeof(as_of) AS t, plans_start FROM pit ORDER BY as_of",
    );
    assert_eq!(
        csv,
        "as_of,t,plans_start\n2024-01-02,Date32,2024-01-02\n2024-01-03,Date32,2024-01-02\n\
         2024-01-04,Date32,2024-01-04\n2024-01-05,Date32,2024-01-04\n"
    );
    let out = p.run();
    assert!(stdout(&out).contains("pit: up to date"), "{}", stdout(&out));
}

/// `as_of` on a table without history, or with the wrong arguments, is a clear error.
#[test]
fn as_of_errors_are_clear() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    assert!(p.run().status.success());
    let out = p.strata(&["query", "SELECT * FROM as_of('users_cdc', 1)"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("users_cdc keeps no history; as_of reads SCD type 2 and SNAPSHOTS tables"),
        "{}",
        stderr(&out)
    );
    let out = p.strata(&["query", "SELECT * FROM as_of('users')"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("as_of takes a table name and a value"),
        "{}",
        stderr(&out)
    );
    let out = p.strata(&["query", "SELECT * FROM as_of('nope', 1)"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no table default.nope"),
        "{}",
        stderr(&out)
    );
}

// --- YAML pipeline specs -------------------------------------------------------------------

const SPEC: &str = r#"name: shop
warehouse: wh
configuration:
  source_root: data
  currency: EUR
libraries:
  - sql/gold.sql
tables:
  - name: customers
    source:
      path: "${source_root}/customers"
      format: json
      schema: "id INT, name STRING, city STRING, op STRING, ts BIGINT"
    keys: [id]
    sequence_by: ts
    stored_as: SCD TYPE 2
    delete_when: "op = 'DELETE'"
    except_columns: [op, ts]
  - name: products
    source: { path: "${source_root}/products", format: csv, header: true, schema: "sku STRING, price INT, seq INT" }
    keys: [sku]
    sequence_by: seq
    scd_type: 1
"#;

const ORDERS_ENTRY: &str = r#"  - name: orders
    source: { path: data/orders, format: json, schema: "order_id INT, status STRING, v INT" }
    keys: [order_id]
    sequence_by: v
    stored_as: SCD TYPE 1
"#;

const GOLD: &str = "-- the price list, in ${currency}\n\
CREATE OR REFRESH STREAMING TABLE price_list\n\
AS SELECT sku, price, '${currency}' AS currency FROM STREAM(products);\n";

const CUSTOMERS: &str = r#"{"id": 1, "name": "Ann", "city": "Oslo", "op": "INSERT", "ts": 1}
{"id": 2, "name": "Bob", "city": "Rome", "op": "INSERT", "ts": 1}
{"id": 1, "name": "Ann", "city": "Bergen", "op": "UPDATE", "ts": 2}
{"id": 2, "name": null, "city": null, "op": "DELETE", "ts": 3}
"#;

/// A project with `spec.yaml`, `sql/gold.sql` and input files; the warehouse is `wh`.
fn spec_project(spec: &str, gold: &str) -> Project {
    let p = Project::new("");
    for dir in ["sql", "data/customers", "data/products", "data/orders"] {
        std::fs::create_dir_all(p.path(dir)).expect("mkdir");
    }
    p.file("spec.yaml", spec);
    p.file("sql/gold.sql", gold);
    p.file("data/customers/001.json", CUSTOMERS);
    p.file(
        "data/products/001.csv",
        "sku,price,seq\na,10,1\nb,20,1\na,12,2\n",
    );
    p
}

fn query_wh(p: &Project, sql: &str) -> String {
    let out = p.strata(&["query", "--warehouse", "wh", "--format", "csv", sql]);
    assert!(out.status.success(), "query failed: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn yaml_spec_runs_generated_flows_and_libraries() {
    let p = spec_project(SPEC, GOLD);
    let out = p.strata(&["run", "spec.yaml"]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("table default.customers_raw: ingested 4 row(s) from 1 file(s)"),
        "{text}"
    );
    assert!(text.contains("flow customers_flow:"), "{text}");
    assert!(text.contains("flow products_flow:"), "{text}");

    // SCD type 2 with deletes and excepted columns; the warehouse is the spec's `wh`.
    assert_eq!(
        query_wh(&p, "SELECT * FROM customers ORDER BY id, __START_AT"),
        "id,name,city,__START_AT,__END_AT\n\
         1,Ann,Oslo,1,2\n\
         1,Ann,Bergen,2,\n\
         2,Bob,Rome,1,3\n"
    );
    // SCD type 1 keeps the latest row per key.
    assert_eq!(
        query_wh(&p, "SELECT * FROM products ORDER BY sku"),
        "sku,price,seq\na,12,2\nb,20,1\n"
    );
    // The library reads a generated table, with configuration substituted.
    assert_eq!(
        query_wh(&p, "SELECT * FROM price_list ORDER BY sku"),
        "sku,price,currency\na,12,EUR\nb,20,EUR\n"
    );

    // Adding a table is a change of the spec only.
    p.file("spec.yaml", &format!("{SPEC}{ORDERS_ENTRY}"));
    p.file(
        "data/orders/001.json",
        "{\"order_id\": 7, \"status\": \"new\", \"v\": 1}\n{\"order_id\": 7, \"status\": \"paid\", \"v\": 2}\n",
    );
    let out = p.strata(&["run", "spec.yaml"]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("table default.orders_raw: ingested 2 row(s) from 1 file(s)"),
        "{text}"
    );
    assert!(
        text.contains("table default.customers_raw: no new files"),
        "{text}"
    );
    assert_eq!(
        query_wh(&p, "SELECT * FROM orders"),
        "order_id,status,v\n7,paid,2\n"
    );

    // --warehouse wins over the spec's, --conf over its configuration.
    let out = p.strata(&[
        "run",
        "spec.yaml",
        "--warehouse",
        "other",
        "--conf",
        "currency=USD",
    ]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let out = p.strata(&[
        "query",
        "--warehouse",
        "other",
        "--format",
        "csv",
        "SELECT DISTINCT currency FROM price_list",
    ]);
    assert_eq!(stdout(&out), "currency\nUSD\n", "{}", stderr(&out));
}

#[test]
fn plan_prints_the_graph_without_running() {
    let p = spec_project(SPEC, GOLD);
    let out = p.strata(&["plan", "spec.yaml"]);
    assert!(out.status.success(), "plan failed: {}", stderr(&out));
    let text = stdout(&out);
    let expected = [
        "pipeline shop (spec.yaml): 5 step(s)",
        " 1. ingest default.customers_raw: streaming table from read_files (json)",
        "    files data/customers -> default.customers_raw    [spec.yaml: tables[0] (customers)]",
        " 2. auto_cdc customers_flow: AUTO CDC flow, SCD TYPE 2, keys (id), sequence by ts, deletes",
        "    default.customers_raw -> default.customers    [spec.yaml: tables[0] (customers)]",
        " 4. auto_cdc products_flow: AUTO CDC flow, SCD TYPE 1, keys (sku), sequence by seq",
        " 5. ingest default.price_list: streaming table from STREAM",
        "    default.products -> default.price_list    [sql/gold.sql:2:1]",
    ];
    for line in expected {
        assert!(
            text.lines().any(|l| l == line),
            "missing line {line:?} in:\n{text}"
        );
    }
    assert!(!p.path("wh").exists(), "plan wrote a warehouse");

    let out = p.strata(&["plan", "spec.yaml", "--format", "json"]);
    assert!(out.status.success(), "plan failed: {}", stderr(&out));
    let steps: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[1]["kind"], "auto_cdc");
    assert_eq!(steps[1]["writes"], "default.customers");

    // A SQL file plans too.
    let p = Project::new(PIPELINE);
    let out = p.strata(&["plan", "pipeline.sql"]);
    assert!(out.status.success(), "plan failed: {}", stderr(&out));
    assert!(
        stdout(&out).contains(" 2. auto_cdc users_flow: AUTO CDC flow, SCD TYPE 2, keys (userId), sequence by sequenceNum, deletes"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn plan_and_run_fail_alike_on_a_sql_file() {
    let p = Project::new("CREATE STREAMING TABLE t;\nCREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (k) SEQUENCE BY v;\n");
    let run = p.run();
    let plan = p.strata(&["plan", "pipeline.sql"]);
    assert_eq!(plan.status.code(), Some(2));
    assert_eq!(stderr(&run), stderr(&plan));
    assert!(
        stderr(&plan).starts_with("error: pipeline.sql:2:1: flow f reads default.s"),
        "{}",
        stderr(&plan)
    );
}

/// Runs `run` and `plan` on the spec; both fail with exit 2 and the same message.
fn spec_error(spec: &str, gold: &str) -> String {
    let p = spec_project(spec, gold);
    let run = p.strata(&["run", "spec.yaml"]);
    assert_eq!(run.status.code(), Some(2), "{}", stdout(&run));
    let plan = p.strata(&["plan", "spec.yaml"]);
    assert_eq!(plan.status.code(), Some(2), "{}", stdout(&plan));
    assert_eq!(stderr(&run), stderr(&plan));
    assert!(
        !p.path("wh/default").exists(),
        "a failed spec wrote a table"
    );
    stderr(&run)
}

#[test]
fn yaml_spec_errors_name_file_entry_key_and_line() {
    // Unknown key: named, with its entry and line.
    let e = spec_error(
        &SPEC.replace(
            "    sequence_by: seq\n",
            "    sequence_by: seq\n    sequnce: 1\n",
        ),
        GOLD,
    );
    assert!(
        e.contains("spec.yaml: tables[1]: unknown field `sequnce`"),
        "{e}"
    );
    assert!(e.contains("at line 23 column 5"), "{e}");

    // Unknown top-level key.
    let e = spec_error(
        &SPEC.replace("name: shop\n", "name: shop\nwarehose: x\n"),
        GOLD,
    );
    assert!(e.contains("spec.yaml: unknown field `warehose`"), "{e}");
    assert!(e.contains("line 2"), "{e}");

    // A schema must be one plain name.
    let e = spec_error(
        &SPEC.replace("name: shop\n", "name: shop\nschema: sales.eu\n"),
        GOLD,
    );
    assert!(
        e.contains("spec.yaml: schema: `sales.eu` is not a schema name"),
        "{e}"
    );

    // Missing keys.
    let e = spec_error(&SPEC.replace("    keys: [sku]\n", ""), GOLD);
    assert!(
        e.contains("spec.yaml: tables[1]: missing field `keys`"),
        "{e}"
    );
    let e = spec_error(&SPEC.replace("name: shop\n", ""), GOLD);
    assert!(e.contains("spec.yaml: missing field `name`"), "{e}");
    let e = spec_error(&SPEC.replace("    sequence_by: ts\n", ""), GOLD);
    assert!(
        e.contains("spec.yaml: tables[0] (customers): sequence_by: needed"),
        "{e}"
    );

    // A bad option value names the entry.
    let e = spec_error(&SPEC.replace("scd_type: 1", "stored_as: SCD TYPE 3"), GOLD);
    assert!(
        e.contains(
            "error: spec.yaml: tables[1] (products): stored_as: expected SCD TYPE 1, SCD TYPE 2 \
             or SNAPSHOTS, found `SCD TYPE 3`"
        ),
        "{e}"
    );
    // A bad expression is a syntax error in the SQL generated for the entry.
    let e = spec_error(&SPEC.replace("\"op = 'DELETE'\"", "\"op = \""), GOLD);
    assert!(
        e.contains("error: spec.yaml: tables[0] (customers): generated SQL ")
            && e.contains("APPLY AS DELETE WHEN (op = )"),
        "{e}"
    );

    // Bad SQL in a library: the file and its own line:column.
    let e = spec_error(
        SPEC,
        "-- gold\n\nCREATE OR REFRESH STREAMING TABEL price_list;\n",
    );
    assert!(e.contains("error: sql/gold.sql:3:"), "{e}");
    // A plan error in a library, and a name declared both in a library and by an entry.
    let e = spec_error(
        SPEC,
        "CREATE STREAMING TABLE price_list AS SELECT * FROM STREAM(prodcts);\n",
    );
    assert!(
        e.contains(
            "error: sql/gold.sql:1:1: table default.price_list reads STREAM(default.prodcts)"
        ),
        "{e}"
    );
    let e = spec_error(SPEC, "CREATE STREAMING TABLE products;\n");
    assert!(
        e.contains(
            "error: sql/gold.sql:1:1: table default.products is declared twice \
             (first at spec.yaml: tables[1] (products))"
        ),
        "{e}"
    );
    // A configuration value that is not set, in a library.
    let e = spec_error(SPEC, &GOLD.replace("${currency}' AS", "${curency}' AS"));
    assert!(
        e.contains("error: sql/gold.sql:3:") && e.contains("`curency` is not set"),
        "{e}"
    );
}

#[test]
fn yaml_spec_with_a_python_library_says_to_run_it_with_python() {
    // The binary runs no Python: a `.py` library is refused before anything runs (the file
    // need not even exist), with the command that runs it.
    let spec = SPEC.replace("  - sql/gold.sql\n", "  - sql/gold.sql\n  - py/silver.py\n");
    let e = spec_error(&spec, GOLD);
    assert!(
        e.contains(
            "error: spec.yaml: libraries[1]: py/silver.py is a Python pipeline file, which the \
             strata binary does not run: run the spec with the strata Python package, \
             `python -m strata run spec.yaml`"
        ),
        "{e}"
    );
}

#[test]
fn shop_example_runs_as_documented() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shop");
    let p = Project::new("");
    for f in walk(&src) {
        let rel = f.strip_prefix(&src).expect("inside the example");
        if rel.starts_with("warehouse") {
            continue;
        }
        let to = p.path(&rel.display().to_string());
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&f, &to).expect("copy");
    }
    let out = p.strata(&["run", "spec.yaml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        p.query("table", "SELECT * FROM customers ORDER BY id, __START_AT"),
        "+----+------+--------+------------+----------+\n\
         | id | name | city   | __START_AT | __END_AT |\n\
         +----+------+--------+------------+----------+\n\
         | 1  | Ann  | Oslo   | 1          | 2        |\n\
         | 1  | Ann  | Bergen | 2          | NULL     |\n\
         | 2  | Bob  | Rome   | 1          | 3        |\n\
         +----+------+--------+------------+----------+\n"
    );
    assert_eq!(
        p.query("csv", "SELECT * FROM price_list ORDER BY sku"),
        "sku,price,currency\na,12,EUR\nb,20,EUR\n"
    );
}

/// The showcase example: two deliveries through bronze, silver (expectations) and gold (SCD2
/// dimensions, SCD1 facts, materialized views); its own check.py folds the source files in
/// plain Python and compares the answer with what strata computed.
#[test]
fn music_streaming_example_matches_its_independent_check() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/music_streaming");
    let scratch = tempfile::tempdir().expect("tempdir");
    let warehouse = scratch.path().join("warehouse");
    let out = Command::new("bash")
        .arg(here.join("run.sh"))
        .arg(&warehouse)
        .env("STRATA", env!("CARGO_BIN_EXE_strata"))
        .env_remove("STRATA_WAREHOUSE")
        .output()
        .expect("run.sh runs");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    // The answer next to the naive join, the expectations' counts, and the check's verdict.
    assert!(
        text.contains("| premium | 821     | 31.91               | 1385          | 53.59       |"),
        "{text}"
    );
    assert!(
        text.contains("| silver_users   | valid_user_id     | drop   | 414    | 3      |"),
        "{text}"
    );
    assert!(text.contains("dim_user: ok"), "{text}");
    assert!(text.trim_end().ends_with("ok"), "{text}");
}

/// `schema:` puts every unqualified name of the spec (generated tables and the libraries'
/// SQL, materialized view queries included) in that schema.
#[test]
fn yaml_spec_schema_holds_unqualified_names() {
    let gold = format!(
        "{GOLD}CREATE MATERIALIZED VIEW customer_count AS \
         SELECT count(*) AS n FROM customers WHERE __END_AT IS NULL;\n"
    );
    let p = spec_project(
        &SPEC.replace("name: shop\n", "name: shop\nschema: sales\n"),
        &gold,
    );
    let out = p.strata(&["run", "spec.yaml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(p.path("wh/sales/customers/_delta_log").is_dir());
    assert!(!p.path("wh/default").exists());
    assert_eq!(
        query_wh(
            &p,
            "SELECT sku, price, currency FROM sales.price_list ORDER BY sku, price"
        ),
        "sku,price,currency\na,12,EUR\nb,20,EUR\n"
    );
    assert_eq!(query_wh(&p, "SELECT n FROM sales.customer_count"), "n\n1\n");
    // --select takes names in the pipeline's schema.
    let out = p.strata(&["run", "spec.yaml", "--select", "customer_count"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("materialized view sales.customer_count"),
        "{}",
        stdout(&out)
    );
}

/// A URL of a scheme strata does not know is refused by name (exit 2) instead of becoming a
/// local folder called `ftp:`; a `file://` URL is a folder. (Object storage URLs: s3.rs.)
#[test]
fn unknown_url_warehouses_are_refused_and_file_urls_are_folders() {
    let p = Project::new(PIPELINE);
    let out = p.strata(&["run", "pipeline.sql", "--warehouse", "ftp://lake/wh"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ftp://lake/wh") && stderr(&out).contains("s3://"),
        "{}",
        stderr(&out)
    );
    assert!(!p.path("ftp:").exists(), "a folder named ftp: was created");
    let url = format!("file://{}", p.path("wh").display());
    p.file("data/cdc/001.json", BATCH1);
    p.ok(&["run", "pipeline.sql", "--warehouse", &url]);
    assert!(p.path("wh/default/users").exists());
}

/// Unity Catalog's three-part names: the warehouse is the catalog `main` (and `strata`) in
/// queries and `validate`; another catalog is named in the error.
#[test]
fn three_part_names_reach_the_warehouse_as_catalog_main() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    p.ok(&["run", "pipeline.sql"]);
    let main = p.csv("SELECT count(*) AS n FROM main.default.users");
    assert_eq!(main, p.csv("SELECT count(*) AS n FROM default.users"));
    assert_eq!(
        main,
        p.csv("SELECT count(*) AS n FROM strata.default.users")
    );
    assert!(p.ok(&["validate", "main.default.users"]).contains("ok"));
    let out = p.strata(&["validate", "hive.default.users"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("catalog hive is not this warehouse"),
        "{}",
        stderr(&out)
    );
}

/// Time travel as Databricks spells it: `VERSION AS OF` and `TIMESTAMP AS OF` in queries.
#[test]
fn version_and_timestamp_as_of_read_the_table_as_it_was() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    p.ok(&["run", "pipeline.sql"]);
    let first = p.csv("SELECT count(*) AS n FROM users_cdc");
    p.file("data/cdc/002.json", BATCH2);
    p.ok(&["run", "pipeline.sql"]);
    assert_ne!(p.csv("SELECT count(*) AS n FROM users_cdc"), first);
    // Version 0 created the table; version 1 took the first file.
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM users_cdc VERSION AS OF 1"),
        first
    );
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM main.default.users_cdc VERSION AS OF 1 AS c WHERE c.userId > 0"),
        first
    );
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM users_cdc TIMESTAMP AS OF '2100-01-01'"),
        p.csv("SELECT count(*) AS n FROM users_cdc")
    );
    let out = p.strata(&["query", "SELECT * FROM users_cdc VERSION AS OF 99"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("VERSION AS OF 99"),
        "{}",
        stderr(&out)
    );
}

/// `plan --format dot | mermaid` draw the dataset graph of the real pipeline.
#[test]
fn plan_draws_the_dataset_graph() {
    let p = Project::new(PIPELINE);
    let dot = p.ok(&["plan", "pipeline.sql", "--format", "dot"]);
    assert!(dot.starts_with("digraph pipeline {"), "{dot}");
    assert!(
        dot.contains("\"default.users_cdc\" -> \"default.users\" [label=\"auto_cdc users_flow\"];"),
        "{dot}"
    );
    let mermaid = p.ok(&["plan", "pipeline.sql", "--format", "mermaid"]);
    assert!(mermaid.starts_with("flowchart LR\n"), "{mermaid}");
    assert_eq!(mermaid.matches("-->").count(), 2, "{mermaid}");
}

/// `events --format json`: one JSON object per event-log record of the last run.
#[test]
fn events_print_as_json_lines() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    p.ok(&["run", "pipeline.sql"]);
    let out = p.ok(&["events", "--format", "json"]);
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(records.len(), 2, "{out}");
    assert!(records.iter().all(|r| r["status"] == "COMPLETED"), "{out}");
    assert!(records.iter().any(|r| r["flow"] == "users_flow"), "{out}");
}

/// `DESCRIBE HISTORY` and `DESCRIBE DETAIL` with Databricks' column names.
#[test]
fn describe_history_and_detail() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    p.ok(&["run", "pipeline.sql"]);
    p.file("data/cdc/002.json", BATCH2);
    p.ok(&["run", "pipeline.sql"]);
    let history = p.csv("DESCRIBE HISTORY main.default.users_cdc");
    let lines: Vec<&str> = history.lines().collect();
    assert!(
        lines[0].starts_with("version,timestamp,operation,operationParameters,readVersion"),
        "{history}"
    );
    // Created, then one append per run: newest first.
    assert_eq!(lines.len(), 4, "{history}");
    assert!(
        lines[1].starts_with("2,") && lines[3].starts_with("0,"),
        "{history}"
    );
    let detail = p.csv("DESCRIBE DETAIL users_cdc");
    let (header, row) = detail.split_once('\n').unwrap();
    assert!(
        header.starts_with("format,id,name,description,location"),
        "{detail}"
    );
    assert!(row.starts_with("delta,"), "{detail}");
    assert!(row.contains(",default.users_cdc,"), "{detail}");
}

/// `validate` checks history tables strata did not write: a dbt snapshot's columns are
/// found by themselves, the keys come from --keys, an open-end marker reads as open.
#[test]
fn validate_checks_a_dbt_snapshot_table_by_path() {
    let p = Project::new(
        "CREATE STREAMING TABLE snap AS SELECT * FROM STREAM read_files('data/snap', \
         format => 'csv', header => true, \
         schema => 'id INT, name STRING, dbt_valid_from TIMESTAMP, dbt_valid_to TIMESTAMP');\n",
    );
    std::fs::create_dir_all(p.path("data/snap")).unwrap();
    p.file(
        "data/snap/001.csv",
        "id,name,dbt_valid_from,dbt_valid_to\n\
         1,a,2024-01-01 00:00:00,2024-02-01 00:00:00\n\
         1,b,2024-02-01 00:00:00,9999-12-31 00:00:00\n\
         2,c,2024-01-01 00:00:00,9999-12-31 00:00:00\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let path = p.path("warehouse/default/snap").display().to_string();
    let out = p.ok(&[
        "validate",
        &path,
        "--keys",
        "id",
        "--open-end",
        "9999-12-31",
    ]);
    assert!(out.ends_with(": ok\n"), "{out}");
    // Without the marker, 9999-12-31 is an end like any other: still a valid timeline.
    // A broken table: two open versions of key 3, overlapping versions of key 4.
    p.file(
        "data/snap/002.csv",
        "id,name,dbt_valid_from,dbt_valid_to\n\
         3,d,2024-01-01 00:00:00,\n\
         3,e,2024-02-01 00:00:00,\n\
         4,f,2024-01-01 00:00:00,2024-03-01 00:00:00\n\
         4,g,2024-02-01 00:00:00,\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let out = p.strata(&[
        "validate",
        &path,
        "--keys",
        "id",
        "--open-end",
        "9999-12-31",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("key (id=3)") && said.contains("key (id=4)"),
        "{said}"
    );
    assert!(!said.contains("id=1") && !said.contains("id=2"), "{said}");
    // Without --keys a table strata did not write cannot be checked, and says why.
    let out = p.strata(&["validate", "snap"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--keys"), "{}", stderr(&out));
}

/// `validate` looks for gaps between a key's versions and keys with no open version, and
/// tells those a delete explains (from the target's event store) from violations; the keys it
/// finds with other than one open version are the ones the usual SQL check finds. `--format
/// json` gives one object. A table strata did not write has no deletes to explain a gap.
#[test]
fn validate_tells_deletes_from_gaps_and_speaks_json() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE cdc AS SELECT * FROM STREAM read_files('data/cdc', \
         format => 'csv', header => true, schema => 'id INT, name STRING, op STRING, seq INT');\n\
         CREATE OR REFRESH STREAMING TABLE users;\n\
         CREATE FLOW f AS AUTO CDC INTO users FROM STREAM(cdc) KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) \
         STORED AS SCD TYPE 2;\n\
         CREATE OR REFRESH STREAMING TABLE snap AS SELECT * FROM STREAM read_files('data/snap', \
         format => 'csv', header => true, schema => 'id INT, valid_from INT, valid_to INT');\n",
    );
    std::fs::create_dir_all(p.path("data/cdc")).unwrap();
    std::fs::create_dir_all(p.path("data/snap")).unwrap();
    // Key 1 deleted at 4 and back at 6 (a gap), key 2 deleted at 3, key 3 open.
    p.file(
        "data/cdc/001.csv",
        "id,name,op,seq\n1,a,U,1\n1,,D,4\n1,b,U,6\n2,c,U,1\n2,,D,3\n3,d,U,2\n",
    );
    // The same shape in a table strata did not write.
    p.file(
        "data/snap/001.csv",
        "id,valid_from,valid_to\n1,1,4\n1,6,\n2,1,3\n3,2,\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let out = p.ok(&["validate", "users"]);
    assert!(
        out.contains("users: key (id=1): deleted at 4 (not a violation)")
            && out.contains("users: key (id=2): deleted at 3 (not a violation)")
            && out.ends_with("users: ok; 2 gap(s) or closed key(s) explained by deletes\n"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&p.ok(&["validate", "users", "--format", "json"])).unwrap();
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(
        json["violations"].as_array().map(Vec::len),
        Some(0),
        "{json}"
    );
    let deleted: Vec<&str> = json["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, vec!["id=1", "id=2"], "{json}");
    // The usual SQL check (keys whose number of open versions is not 1) finds key 2, the
    // key validate finds without an open version.
    assert_eq!(
        p.csv("SELECT id FROM users GROUP BY id HAVING sum(CASE WHEN __END_AT IS NULL THEN 1 ELSE 0 END) <> 1"),
        "id\n2\n"
    );
    assert!(json["deleted"][1]["problem"]
        .as_str()
        .unwrap()
        .starts_with("has no open version"));
    // Outside strata, nothing says why key 1 has a gap and key 2 closed: both are reported.
    let path = p.path("warehouse/default/snap").display().to_string();
    let out = p.strata(&[
        "validate",
        &path,
        "--keys",
        "id",
        "--valid-from",
        "valid_from",
        "--valid-to",
        "valid_to",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("key (id=1): gap: the version starting at 1 ends at 4, the next starts at 6"),
        "{said}"
    );
    assert!(
        said.contains("key (id=2): has no open version (its last version ends at 3)"),
        "{said}"
    );
    assert!(!said.contains("id=3"), "{said}");
}

/// Nested types in a `schema =>` DDL string: JSON arrays, objects and maps read into Arrow
/// lists, structs and maps, with field access in the query.
#[test]
fn nested_types_in_a_schema_string_read_nested_json() {
    let p = Project::new(
        "CREATE STREAMING TABLE raw AS SELECT id, tags, addr.city AS city, attrs FROM STREAM \
         read_files('in', format => 'json', schema => 'id BIGINT, tags ARRAY<STRING>, \
         addr STRUCT<city: STRING, zip INT>, attrs MAP<STRING, STRING>');\n",
    );
    std::fs::create_dir_all(p.path("in")).expect("input folder");
    p.file(
        "in/a.json",
        "{\"id\":1,\"tags\":[\"a\",\"b\"],\"addr\":{\"city\":\"Oslo\",\"zip\":123},\"attrs\":{\"k\":\"v\"}}\n\
         {\"id\":2,\"tags\":[],\"addr\":{\"city\":\"Rome\",\"zip\":null},\"attrs\":{}}\n",
    );
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        p.csv(
            "SELECT id, cardinality(tags) AS n, tags[1] AS first, city, attrs['k'] AS k \
             FROM raw ORDER BY id"
        ),
        "id,n,first,city,k\n1,2,a,Oslo,v\n2,0,,Rome,\n"
    );
}

/// A streaming table with a BINARY column makes deltalake log a warning (it keeps no
/// statistics of binary columns): no dependency's line reaches the user at default
/// verbosity, and output that is not a terminal has no colour codes; `-v` shows strata's
/// progress and that warning, still without colour.
#[test]
fn dependency_logs_stay_quiet_and_pipes_get_no_colour() {
    let project = || {
        let p = Project::new(
            r#"
CREATE OR REFRESH STREAMING TABLE stamped
AS SELECT *, CAST(name AS BINARY) AS raw FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'userId INT, name STRING');
"#,
        );
        p.file("data/cdc/001.json", "{\"userId\": 1, \"name\": \"a\"}\n");
        p
    };
    let out = project().run();
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("deltalake"), "a dependency's line: {err}");
    assert!(!err.contains("WARN"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
    // The same first run with -v: strata's progress and the line the default kept back.
    let out = project().strata(&["-v", "run", "pipeline.sql"]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("INFO"), "-v shows progress: {err}");
    assert!(
        err.contains("WARN deltalake_core"),
        "-v shows dependencies' warnings: {err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
}

/// `--memory-limit` takes a size as people write it, and refuses what is not one before
/// anything runs (exit 2, the flag named).
#[test]
fn memory_limit_takes_sizes_and_refuses_the_rest() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/001.json", BATCH1);
    let out = p.strata(&["run", "pipeline.sql", "--memory-limit", "plenty"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--memory-limit"), "{}", stderr(&out));
    assert!(!p.path("warehouse").join("default/users").exists());
    let out = p.strata(&["run", "pipeline.sql", "--memory-limit", "64MiB"]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM users").lines().nth(1),
        Some("5")
    );
}
