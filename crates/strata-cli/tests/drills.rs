//! Drills on the real binary: several `strata run` started at the same moment on one
//! warehouse, round after round with new input in between. After every round each input
//! row is in the bronze table exactly once, and every target equals what one run over all
//! the input gives on a fresh warehouse (the fold of every event, which arrival order and
//! batching do not change). So does every materialized view, refreshed incrementally by
//! the runs racing each other: appended (`upserts`), combined per key (`per_name`),
//! touched groups recomputed (`names`) and join keys recomputed (`current_names`, a join of
//! the SCD type 1 table with the history); a last lone run says which it did.
//!
//! `STRATA_DRILL_ROUNDS` sets the number of rounds (3 by default, as CI runs it);
//! `STRATA_DRILL_RUNS` the runs started together (3).

mod common;

use common::{env_usize, run_together, Project, Rng};

const PIPELINE: &str = concat!(
    common::events_and_history!(),
    common::people_scd1!(),
    r#"
CREATE OR REFRESH MATERIALIZED VIEW names AS
SELECT name, count(*) AS n FROM people GROUP BY name;
CREATE OR REFRESH MATERIALIZED VIEW upserts AS
SELECT eid, id, name FROM events_raw WHERE op = 'U';
CREATE OR REFRESH MATERIALIZED VIEW per_name AS
SELECT name, count(*) AS n, max(seq) AS last FROM events_raw GROUP BY name;
CREATE OR REFRESH MATERIALIZED VIEW current_names AS
SELECT p.id, p.name, h.name AS history_name FROM people p JOIN people_history h
ON p.id = h.id WHERE h.__END_AT IS NULL;
"#
);

/// Writes round `round`'s input: a few JSON files of upserts and deletes over 50 keys, with
/// globally unique event ids and sequence values, some of them late.
fn write_round(p: &Project, round: usize, rng: &mut Rng, next_eid: &mut u64) -> usize {
    let mut rows = 0;
    for file in 0..3 {
        let mut text = String::new();
        for _ in 0..200 {
            let eid = *next_eid;
            *next_eid += 1;
            let id = rng.below(50);
            let op = if rng.below(10) == 0 { "D" } else { "U" };
            let name = ["ana", "bo", "cy", "di"][rng.below(4) as usize];
            // Mostly increasing with the event id, sometimes far back (late).
            let seq = if rng.below(8) == 0 {
                eid.saturating_sub(rng.below(500))
            } else {
                eid
            };
            // Unique sequence values per key: the event id breaks ties.
            let seq = seq * 100_000 + eid % 100_000;
            text.push_str(&format!(
                "{{\"eid\": {eid}, \"id\": {id}, \"name\": \"{name}\", \"op\": \"{op}\", \"seq\": {seq}}}\n"
            ));
            rows += 1;
        }
        p.file(&format!("data/cdc/r{round:03}_{file}.json"), &text);
    }
    rows
}

const TABLES: [&str; 6] = [
    "SELECT * FROM people_history",
    "SELECT * FROM people",
    "SELECT * FROM names",
    "SELECT * FROM upserts",
    "SELECT * FROM per_name",
    "SELECT * FROM current_names",
];

#[test]
fn runs_started_together_take_each_file_once_and_converge() {
    let rounds = env_usize("STRATA_DRILL_ROUNDS", 3);
    let runs = env_usize("STRATA_DRILL_RUNS", 3);
    let p = Project::new(PIPELINE);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut next_eid = 1u64;
    let mut delivered = 0usize;
    for round in 0..rounds {
        delivered += write_round(&p, round, &mut rng, &mut next_eid);
        run_together(
            (0..runs).map(|_| p.command(&["run", "pipeline.sql"])),
            &format!("round {round}"),
        );
        let counts = p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM events_raw");
        assert_eq!(
            counts.trim(),
            format!("n,d\n{delivered},{delivered}"),
            "round {round}: every input row exactly once in the bronze table"
        );
    }
    // A lone run says how it refreshed the join view.
    write_round(&p, rounds, &mut rng, &mut next_eid);
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(
        out.contains("materialized view default.current_names: incremental: ")
            && out.contains("join key(s) its inputs' changed rows hold recomputed"),
        "the join view is refreshed from its inputs' changes:\n{out}"
    );
    // The same input, one run, a fresh warehouse: the fold of every event.
    let fresh = Project::new(PIPELINE);
    p.copy_input_to(&fresh);
    fresh.ok(&["run", "pipeline.sql"]);
    for sql in TABLES {
        assert_eq!(
            p.sorted_csv(sql),
            fresh.sorted_csv(sql),
            "{sql}: concurrent rounds and one run over everything differ"
        );
    }
    let v = p.ok(&["validate", "people_history"]);
    assert!(v.contains("ok"), "{v}");
}

const ONCE_PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE all_rows (id BIGINT, src STRING);
CREATE FLOW live AS INSERT INTO all_rows BY NAME
SELECT id, 'live' AS src FROM STREAM read_files('data/cdc', format => 'json', schema => 'id BIGINT');
CREATE FLOW backfill AS INSERT INTO ONCE all_rows BY NAME
SELECT id, 'old' AS src FROM read_files('data/old', format => 'json', schema => 'id BIGINT');
"#;

/// A once flow (`INSERT INTO ONCE`, a backfill over many files) under runs killed
/// (SIGKILL) at random moments, then runs started together, then clean runs: its rows are
/// in the table exactly once (a run killed before its commit left nothing, one killed after
/// left the rows and the record together), and the live flow's files are taken once each.
#[test]
fn a_once_flow_appends_exactly_once_across_kills_and_runs_started_together() {
    // Enough files that a run takes about a second: the kills land before, during and
    // after its commit.
    const OLD_FILES: u64 = 300;
    const ROWS_PER_FILE: u64 = 100;
    let rounds = env_usize("STRATA_DRILL_ROUNDS", 3);
    let runs = env_usize("STRATA_DRILL_RUNS", 3);
    let p = Project::new(ONCE_PIPELINE);
    std::fs::create_dir_all(p.path("data/old")).expect("mkdir");
    for f in 0..OLD_FILES {
        let text: String = (0..ROWS_PER_FILE)
            .map(|r| format!("{{\"id\": {}}}\n", f * ROWS_PER_FILE + r))
            .collect();
        p.file(&format!("data/old/{f:03}.json"), &text);
    }
    let mut rng = Rng(0x0dd_0bce_5eed_0002);
    let mut live = 0u64;
    for round in 0..rounds {
        p.file(
            &format!("data/cdc/{round:03}.json"),
            &format!("{{\"id\": {}}}\n", 1_000_000 + round),
        );
        live += 1;
        let mut child = p
            .command(&["run", "pipeline.sql"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("strata starts");
        std::thread::sleep(std::time::Duration::from_millis(30 + rng.below(1200)));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    p.file("data/cdc/last.json", "{\"id\": 2000000}\n");
    live += 1;
    run_together(
        (0..runs).map(|_| p.command(&["run", "pipeline.sql"])),
        "after the kills",
    );
    // Files that arrive in the backfill's folder later are not taken.
    p.file("data/old/late.json", "{\"id\": 999999}\n");
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(out.contains("once flow already ran at version"), "{out}");
    let old = OLD_FILES * ROWS_PER_FILE;
    assert_eq!(
        p.csv(
            "SELECT src, count(*) AS n, count(DISTINCT id) AS d FROM all_rows \
             GROUP BY src ORDER BY src"
        )
        .trim(),
        format!("src,n,d\nlive,{live},{live}\nold,{old},{old}"),
        "the backfill's rows exactly once, each live file once"
    );
}
