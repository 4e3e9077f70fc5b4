//! Incremental refresh of materialized views against recomputation: random batches of
//! upserts and deletes (some late) flow into a bronze table, an SCD type 1 target and an
//! SCD type 2 history; after every run each view over them equals its query run directly
//! over the same tables, whichever refresh the run chose (appended, combined per key,
//! touched groups recomputed, or whole). The event log must show each kind of incremental
//! refresh used, so that the comparison covers them.

use crate::common;

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
";

/// The views, each with the ORDER BY that makes its rows comparable.
const VIEWS: [(&str, &str, &str); 6] = [
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
];

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One batch: upserts and deletes over 12 keys and 4 cities (and no city), sequence values
/// rising with a few late ones.
fn batch(rng: &mut Rng, seq: &mut i64) -> String {
    const CITIES: [&str; 5] = ["\"Oslo\"", "\"Rome\"", "\"oslo\"", "\"Lima\"", "null"];
    let mut out = String::new();
    for _ in 0..(8 + rng.below(10)) {
        *seq += 3;
        let late = match rng.below(5) {
            0 => (rng.below(20) as i64).min(*seq - 1),
            _ => 0,
        };
        let op = match rng.below(4) {
            0 => "DELETE",
            _ => "UPSERT",
        };
        out.push_str(&format!(
            "{{\"id\": {}, \"city\": {}, \"score\": {}, \"op\": \"{op}\", \"seq\": {}}}\n",
            rng.below(12),
            CITIES[rng.below(5) as usize],
            rng.below(100),
            *seq - late,
        ));
    }
    out
}

#[tokio::test]
async fn incremental_refreshes_equal_the_queries_over_all_rows() {
    let mut text = PIPELINE.to_string();
    for (name, sql, _) in VIEWS {
        text.push_str(&format!(
            "CREATE OR REFRESH MATERIALIZED VIEW {name} AS {sql};\n"
        ));
    }
    let (dir, pipeline, _, wh) = common::project(&text);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seq = 100;
    for run in 0..8 {
        std::fs::write(
            dir.path().join(format!("data/{run:03}.json")),
            batch(&mut rng, &mut seq),
        )
        .expect("write");
        strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
        for (name, sql, order) in VIEWS {
            let stored =
                common::query_text(&wh, &format!("SELECT * FROM {name} ORDER BY {order}")).await;
            let direct =
                common::query_text(&wh, &format!("SELECT * FROM ({sql}) ORDER BY {order}")).await;
            assert_eq!(
                stored, direct,
                "run {run}: view {name} differs from its query"
            );
        }
    }
    // Every kind of refresh ran, each where expected.
    let kinds = common::query_text(
        &wh,
        "SELECT flow, CASE WHEN message LIKE '%appended (incremental)' THEN 'appended' \
         WHEN message LIKE '%combined into%' THEN 'combined' \
         WHEN message LIKE '%touched by changed rows%' THEN 'regrouped' \
         ELSE 'whole' END AS refresh, count(*) AS runs \
         FROM event_log WHERE kind = 'materialized_view' AND status = 'COMPLETED' \
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .await;
    for (view, refresh) in [
        ("upserted", "appended"),
        ("per_op", "combined"),
        ("ids_per_city", "regrouped"),
        ("by_city", "regrouped"),
        ("current_by_city", "regrouped"),
        ("people_count", "whole"),
    ] {
        let line = kinds
            .lines()
            .find(|l| l.contains(&format!("| {view} ")) && l.contains(&format!("| {refresh} ")));
        assert!(line.is_some(), "{view} never refreshed {refresh}:\n{kinds}");
    }
}
