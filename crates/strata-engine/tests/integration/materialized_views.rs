//! Incremental refresh of materialized views against recomputation, as a property: random
//! sequences of change batches (upserts, deletes and late events of people; upserts and
//! deletes of cities) flow into a bronze table, an SCD type 1 target and an SCD type 2
//! history of people, and an SCD type 1 target of cities; after every run each view over
//! them equals its query run directly over the same tables, whichever refresh the run chose
//! (appended, combined per key, touched groups recomputed, join keys recomputed, or whole).
//! The views cover projections and filters, GROUP BY with count, sum, min, max and avg, inner
//! and left joins (on one column and on two, over the SCD type 2 history too). Over all
//! cases, the event log must show each kind of refresh used where expected, so that the
//! comparison covers them.
//!
//! `PROPTEST_CASES` sets the number of cases (default 24, each of two to four runs); a
//! failing case is shrunk (at most `PROPTEST_MAX_SHRINK_ITERS`, default 32, steps) and its
//! seed saved in `materialized_views.regressions` beside this file, replayed first on later
//! runs.

use crate::common;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use strata_engine::Warehouse;

const PIPELINE: &str = "
CREATE OR REFRESH STREAMING TABLE events
AS SELECT * FROM STREAM read_files('data', format => 'json',
  schema => 'id BIGINT, city STRING, score BIGINT, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE people;
CREATE FLOW people_flow AS AUTO CDC INTO people FROM STREAM(events) KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
  STORED AS SCD TYPE 1;
CREATE OR REFRESH STREAMING TABLE people_history;
CREATE FLOW history_flow AS AUTO CDC INTO people_history FROM STREAM(events) KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
  STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE city_events
AS SELECT * FROM STREAM read_files('cities', format => 'json',
  schema => 'city STRING, country STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE city_info;
CREATE FLOW city_flow AS AUTO CDC INTO city_info FROM STREAM(city_events) KEYS (city)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
  STORED AS SCD TYPE 1;
";

/// The views, each with the ORDER BY that makes its rows comparable.
const VIEWS: [(&str, &str, &str); 9] = [
    (
        "upserted",
        "SELECT id, score * 2 AS doubled, upper(city) AS city FROM events WHERE op = 'UPSERT'",
        "id, doubled, city",
    ),
    (
        "per_op",
        "SELECT op, count(*) AS n, sum(score) AS total, min(seq) AS first, max(seq) AS last \
         FROM events GROUP BY op",
        "op",
    ),
    (
        "ids_per_city",
        "SELECT city, count(DISTINCT id) AS ids FROM events GROUP BY city",
        "city",
    ),
    (
        "by_city",
        "SELECT city, count(*) AS n, sum(score) AS total, min(score) AS lo, max(score) AS hi, \
         avg(score) AS mean FROM people GROUP BY city",
        "city",
    ),
    (
        "current_by_city",
        "SELECT lower(city) AS city, count(*) AS open, max(score) AS hi FROM people_history \
         WHERE __END_AT IS NULL GROUP BY lower(city)",
        "city",
    ),
    (
        "people_count",
        "SELECT count(*) AS n, sum(score) AS total FROM people",
        "n",
    ),
    (
        "people_cities",
        "SELECT p.city, p.id, p.score, c.country FROM people p JOIN city_info c \
         ON p.city = c.city WHERE p.score > 20",
        "id",
    ),
    (
        "history_cities",
        "SELECT h.city, h.id, h.__START_AT AS since, h.__END_AT AS until, c.country \
         FROM people_history h LEFT JOIN city_info c ON h.city = c.city",
        "id, since",
    ),
    (
        "same_city",
        "SELECT p.id, p.city, h.__START_AT AS since, h.score AS then FROM people p \
         JOIN people_history h ON p.id = h.id AND p.city = h.city",
        "id, since",
    ),
];

/// The refresh each view must have taken at least once over all cases.
const EXPECTED_KINDS: [(&str, &str); 9] = [
    ("upserted", "appended"),
    ("per_op", "combined"),
    ("ids_per_city", "regrouped"),
    ("by_city", "regrouped"),
    ("current_by_city", "regrouped"),
    ("people_count", "whole"),
    ("people_cities", "rejoined"),
    ("history_cities", "rejoined"),
    ("same_city", "rejoined"),
];

const CITIES: [&str; 5] = ["\"Oslo\"", "\"Rome\"", "\"oslo\"", "\"Lima\"", "null"];
const COUNTRIES: [&str; 3] = ["\"NO\"", "\"IT\"", "\"PE\""];

/// One change of a person: an upsert or a delete of `id`, maybe `late` (its sequence value
/// below those of that many events before it, so that it may lose to one already applied).
#[derive(Debug, Clone)]
struct PersonChange {
    id: u8,
    city: usize,
    score: u8,
    delete: bool,
    late: Option<u8>,
}

/// One change of a city (never the NULL one): its country set, or the city deleted.
#[derive(Debug, Clone)]
struct CityChange {
    city: usize,
    country: usize,
    delete: bool,
}

/// What one run brings.
#[derive(Debug, Clone)]
struct Batch {
    people: Vec<PersonChange>,
    cities: Vec<CityChange>,
}

fn person_change() -> impl Strategy<Value = PersonChange> {
    (
        0u8..10,
        0..CITIES.len(),
        0u8..100,
        prop::bool::weighted(0.25),
        prop::option::weighted(0.2, 1u8..20),
    )
        .prop_map(|(id, city, score, delete, late)| PersonChange {
            id,
            city,
            score,
            delete,
            late,
        })
}

fn city_change() -> impl Strategy<Value = CityChange> {
    (
        0..CITIES.len() - 1,
        0..COUNTRIES.len(),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(city, country, delete)| CityChange {
            city,
            country,
            delete,
        })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        prop::collection::vec(person_change(), 1..10),
        prop::collection::vec(city_change(), 0..4),
    )
        .prop_map(|(people, cities)| Batch { people, cities })
}

/// Two to four batches; the first one sets at least one city, so that every table exists
/// after the first run.
fn batches() -> impl Strategy<Value = Vec<Batch>> {
    (city_change(), prop::collection::vec(batch(), 2..=4)).prop_map(|(first, mut batches)| {
        batches[0].cities.insert(
            0,
            CityChange {
                delete: false,
                ..first
            },
        );
        batches
    })
}

/// The JSON lines of a batch's people and cities. Events are numbered across runs (`n`, at
/// most 999 in a case); the sequence value of event `n` is `1000 * n`, or, when it is `late`
/// by `l`, `1000 * (n - l) + n`: below the events after `n - l`, and unique, as a key's
/// sequence values must be.
fn json_lines(batch: &Batch, n: &mut i64) -> (String, String) {
    let mut seq = |late: Option<u8>| {
        *n += 1;
        match late {
            Some(l) => 1000 * (*n - i64::from(l)).max(0) + *n,
            None => 1000 * *n,
        }
    };
    let mut people = String::new();
    for p in &batch.people {
        let at = seq(p.late);
        let op = if p.delete { "DELETE" } else { "UPSERT" };
        people.push_str(&format!(
            "{{\"id\": {}, \"city\": {}, \"score\": {}, \"op\": \"{op}\", \"seq\": {at}}}\n",
            p.id, CITIES[p.city], p.score,
        ));
    }
    let mut cities = String::new();
    for c in &batch.cities {
        let at = seq(None);
        let op = if c.delete { "DELETE" } else { "UPSERT" };
        cities.push_str(&format!(
            "{{\"city\": {}, \"country\": {}, \"op\": \"{op}\", \"seq\": {at}}}\n",
            CITIES[c.city], COUNTRIES[c.country],
        ));
    }
    (people, cities)
}

fn project() -> (tempfile::TempDir, std::path::PathBuf, Warehouse) {
    let mut text = PIPELINE.to_string();
    for (name, sql, _) in VIEWS {
        text.push_str(&format!(
            "CREATE OR REFRESH MATERIALIZED VIEW {name} AS {sql};\n"
        ));
    }
    let (dir, pipeline, _, wh) = common::project(&text);
    std::fs::create_dir_all(dir.path().join("cities")).expect("mkdir");
    (dir, pipeline, wh)
}

/// Every view against its query run directly; the first that differs.
async fn views_differ(wh: &Warehouse) -> Option<String> {
    for (name, sql, order) in VIEWS {
        let stored =
            common::query_text(wh, &format!("SELECT * FROM {name} ORDER BY {order}")).await;
        let direct =
            common::query_text(wh, &format!("SELECT * FROM ({sql}) ORDER BY {order}")).await;
        if stored != direct {
            return Some(format!(
                "view {name} differs from its query\n--- view\n{stored}\n--- query\n{direct}"
            ));
        }
    }
    None
}

/// The (view, refresh) pairs of the event log's completed refreshes.
async fn refresh_kinds(wh: &Warehouse) -> BTreeSet<(String, String)> {
    let (_, batches) = strata_engine::query(
        wh,
        "SELECT flow, CASE WHEN message LIKE '%appended (incremental)' THEN 'appended' \
         WHEN message LIKE '%combined into%' THEN 'combined' \
         WHEN message LIKE '%touched by changed rows%' THEN 'regrouped' \
         WHEN message LIKE '%join key(s) of changed rows recomputed%' THEN 'rejoined' \
         ELSE 'whole' END AS refresh \
         FROM event_log WHERE kind = 'materialized_view' AND status = 'COMPLETED'",
    )
    .await
    .expect("event log");
    let mut out = BTreeSet::new();
    for b in batches {
        let text = |i: usize| {
            deltalake::arrow::compute::cast(
                b.column(i),
                &deltalake::arrow::datatypes::DataType::Utf8,
            )
            .expect("cast")
        };
        let (flows, kinds) = (text(0), text(1));
        let (flows, kinds) = (
            deltalake::arrow::array::AsArray::as_string::<i32>(&flows),
            deltalake::arrow::array::AsArray::as_string::<i32>(&kinds),
        );
        for i in 0..b.num_rows() {
            out.insert((flows.value(i).to_string(), kinds.value(i).to_string()));
        }
    }
    out
}

/// Runs the pipeline after each batch and compares the views with their queries.
async fn run_case(
    batches: &[Batch],
    seen: &Mutex<BTreeSet<(String, String)>>,
) -> Result<(), String> {
    let (dir, pipeline, wh) = project();
    let mut n = 0;
    for (run, batch) in batches.iter().enumerate() {
        let (people, cities) = json_lines(batch, &mut n);
        write(&dir.path().join(format!("data/{run:03}.json")), &people);
        if !cities.is_empty() {
            write(&dir.path().join(format!("cities/{run:03}.json")), &cities);
        }
        strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .map_err(|e| format!("run {run}: {e}"))?;
        if let Some(diff) = views_differ(&wh).await {
            return Err(format!("after run {run}: {diff}"));
        }
    }
    let kinds = refresh_kinds(&wh).await;
    seen.lock().expect("kinds seen").extend(kinds);
    Ok(())
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn env_number(name: &str, default: u32) -> u32 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not `{v}`")),
        Err(_) => default,
    }
}

#[test]
fn incremental_refreshes_equal_the_queries_after_every_batch() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases: env_number("PROPTEST_CASES", 24),
        max_shrink_iters: env_number("PROPTEST_MAX_SHRINK_ITERS", 32),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        source_file: Some(file!()),
        ..Config::default()
    });
    let seen = Mutex::new(BTreeSet::new());
    let outcome = runner.run(&batches(), |batches| {
        rt.block_on(run_case(&batches, &seen))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    // Every kind of refresh ran, each where expected.
    let seen = seen.into_inner().expect("kinds seen");
    for (view, refresh) in EXPECTED_KINDS {
        assert!(
            seen.contains(&(view.to_string(), refresh.to_string())),
            "{view} never refreshed {refresh}: {seen:?}"
        );
    }
}
