//! Table upkeep on the real binary: `strata optimize` compacts and changes no row, and no
//! reader downstream takes a compaction for new data; `strata vacuum` removes what no
//! version in its window needs, refuses short windows without a flag, keeps what a pending
//! reader still needs, trims the event log and the tables a full refresh set aside; a
//! `kill -9` during an optimize leaves tables every reader opens; AUTO CDC targets with
//! optimizes between runs converge to the same rows as without.

mod common;

use common::{stderr, stdout, Project};

/// Bronze from files; silver streams bronze's files; an SCD2 and an SCD1 target fold it;
/// `changes` streams the SCD2 target's change feed; a materialized view counts.
const PIPELINE: &str = r#"
CREATE OR REFRESH STREAMING TABLE bronze
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'eid BIGINT, id BIGINT, name STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE silver AS SELECT * FROM STREAM(bronze);
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_flow AS AUTO CDC INTO history FROM STREAM(bronze)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op, seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE current;
CREATE FLOW current_flow AS AUTO CDC INTO current FROM STREAM(bronze)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op) STORED AS SCD TYPE 1;
CREATE OR REFRESH STREAMING TABLE changes AS SELECT * FROM STREAM(history);
CREATE OR REFRESH MATERIALIZED VIEW names AS
SELECT name, count(*) AS n FROM current GROUP BY name;
"#;

/// Every table's rows, sorted, as one text (the event log left out).
const TABLES: [&str; 6] = ["bronze", "silver", "history", "current", "changes", "names"];

fn rows(p: &Project, table: &str) -> Vec<String> {
    let mut lines: Vec<String> = p
        .csv(&format!("SELECT * FROM {table}"))
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn all_rows(p: &Project) -> Vec<(String, Vec<String>)> {
    TABLES.iter().map(|t| (t.to_string(), rows(p, t))).collect()
}

/// A small deterministic generator (no dependency): xorshift.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Writes `data/cdc/<name>.json`: `n` upserts and deletes over 20 keys with unique event
/// ids and sequence values, some late.
fn write_batch(p: &Project, name: &str, n: usize, rng: &mut Rng, next: &mut u64) {
    let mut text = String::new();
    for _ in 0..n {
        *next += 1;
        let id = rng.below(20);
        let op = if rng.below(6) == 0 { "D" } else { "U" };
        // Late events: a sequence value below the latest one.
        let seq = if rng.below(4) == 0 {
            next.saturating_sub(rng.below(10)) * 10 + 1
        } else {
            *next * 10
        };
        let name = ["ana", "bo", "cy", "di"][rng.below(4) as usize];
        text.push_str(&format!(
            "{{\"eid\": {next}, \"id\": {id}, \"name\": \"{name}\", \"op\": \"{op}\", \"seq\": {seq}}}\n"
        ));
    }
    p.file(&format!("data/cdc/{name}.json"), &text);
}

/// The number of data files of a table's latest version, as `DESCRIBE DETAIL` says.
fn files_of(p: &Project, table: &str) -> usize {
    let out = p.query("json", &format!("DESCRIBE DETAIL {table}"));
    let detail: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    detail["numFiles"]
        .as_u64()
        .unwrap_or_else(|| panic!("numFiles of {table}: {out}")) as usize
}

/// A fresh project with the same input files, run once: what every target must equal.
fn fresh_run_of(p: &Project) -> Vec<(String, Vec<String>)> {
    let fresh = Project::new(PIPELINE);
    for e in std::fs::read_dir(p.path("data/cdc"))
        .expect("input")
        .flatten()
    {
        std::fs::copy(e.path(), fresh.path("data/cdc").join(e.file_name())).expect("copy");
    }
    let out = fresh.run();
    assert!(out.status.success(), "{}", stderr(&out));
    all_rows(&fresh)
}

/// The rows that do not depend on how the input was split into runs (bronze, silver and
/// the targets; the change feed's commit versions do).
fn converging(rows: &[(String, Vec<String>)]) -> Vec<(String, Vec<String>)> {
    rows.iter()
        .filter(|(t, _)| t != "changes")
        .cloned()
        .collect()
}

#[test]
fn optimize_compacts_changes_no_row_and_downstream_takes_nothing_from_it() {
    let p = Project::new(PIPELINE);
    let (mut rng, mut next) = (Rng(0x5eed), 0u64);
    for i in 0..3 {
        write_batch(&p, &format!("{i:03}"), 12, &mut rng, &mut next);
        let out = p.run();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let before = all_rows(&p);
    let bronze_files = files_of(&p, "bronze");
    assert_eq!(bronze_files, 3);

    let out = p.ok(&["optimize"]);
    assert!(
        out.contains("default.bronze: 3 file(s)") && out.contains("-> 1 file(s)"),
        "{out}"
    );
    assert!(out.contains("event_log: "), "{out}");
    for t in ["bronze", "silver", "history", "current", "changes"] {
        assert_eq!(files_of(&p, t), 1, "{t} after optimize: {out}");
    }
    assert_eq!(all_rows(&p), before, "optimize changed rows");

    // A run after the optimize finds nothing new anywhere.
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    let report = stdout(&out);
    assert!(
        report.contains("table default.silver: no new input (only upkeep commits"),
        "{report}"
    );
    assert!(
        report.contains("materialized view default.names: nothing it reads has changed"),
        "{report}"
    );
    assert_eq!(all_rows(&p), before, "a run after optimize changed rows");

    // New input after the optimize: each row taken once, targets as one run over all.
    write_batch(&p, "003", 12, &mut rng, &mut next);
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM silver"),
        "n,d\n48,48\n"
    );
    assert_eq!(converging(&all_rows(&p)), converging(&fresh_run_of(&p)));

    // Z-order by a column, and an unknown column named.
    let out = p.ok(&["optimize", "history", "--zorder-by", "id"]);
    assert!(out.contains("Z-ordered by id"), "{out}");
    let out = p.strata(&["optimize", "history", "--zorder-by", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no column nosuch"),
        "{}",
        stderr(&out)
    );
    let out = p.strata(&["optimize", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no table default.nosuch"),
        "{}",
        stderr(&out)
    );
}

/// Files a reader has not read yet, compacted away before it runs: it reads them as they
/// were added (nothing lost, nothing twice), and a vacuum in between keeps them for it.
#[test]
fn files_compacted_before_a_reader_ran_are_read_once_and_kept_by_vacuum() {
    let p = Project::new(PIPELINE);
    let (mut rng, mut next) = (Rng(0xfeed), 0u64);
    write_batch(&p, "000", 10, &mut rng, &mut next);
    p.ok(&["run", "pipeline.sql"]);
    for i in 1..3 {
        write_batch(&p, &format!("{i:03}"), 10, &mut rng, &mut next);
        p.ok(&["run", "pipeline.sql", "--select", "bronze"]);
    }
    p.ok(&["optimize", "bronze"]);
    assert_eq!(files_of(&p, "bronze"), 1);

    // The short window needs its flag, and says so.
    let out = p.strata(&["vacuum", "--retain", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--allow-short-retention") && stderr(&out).contains("refused"),
        "{}",
        stderr(&out)
    );

    let dry = p.ok(&[
        "vacuum",
        "--retain",
        "0",
        "--allow-short-retention",
        "--dry-run",
    ]);
    assert!(
        dry.contains("that streaming table default.silver has not read yet"),
        "{dry}"
    );
    assert!(
        dry.contains("that flow history_flow has not read yet"),
        "{dry}"
    );
    assert!(
        dry.contains("default.bronze: would remove 0 file(s)"),
        "{dry}"
    );
    let files_before = common::walk(&p.path("warehouse/default/bronze")).len();
    let out = p.ok(&["vacuum", "--retain", "0", "--allow-short-retention"]);
    assert!(out.contains("default.bronze: removed 0 file(s)"), "{out}");
    assert!(
        common::walk(&p.path("warehouse/default/bronze")).len() >= files_before,
        "vacuum removed files a reader needs"
    );

    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM silver"),
        "n,d\n30,30\n"
    );
    assert_eq!(converging(&all_rows(&p)), converging(&fresh_run_of(&p)));

    // Everything read: now the compacted files go, and every table reads the same.
    let before = all_rows(&p);
    let dry = p.ok(&[
        "vacuum",
        "--retain",
        "0",
        "--allow-short-retention",
        "--dry-run",
    ]);
    assert!(
        dry.contains("default.bronze: would remove 3 file(s)"),
        "{dry}"
    );
    let out = p.ok(&["vacuum", "--retain", "0", "--allow-short-retention"]);
    assert!(out.contains("default.bronze: removed 3 file(s)"), "{out}");
    assert_eq!(
        common::walk(&p.path("warehouse/default/bronze"))
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "parquet"))
            .count(),
        1
    );
    assert_eq!(all_rows(&p), before, "vacuum changed rows");
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(all_rows(&p), before, "a run after vacuum changed rows");
}

#[test]
fn vacuum_trims_the_event_log_and_removes_set_aside_tables() {
    let p = Project::new(PIPELINE);
    let (mut rng, mut next) = (Rng(0xabc), 0u64);
    write_batch(&p, "000", 5, &mut rng, &mut next);
    p.ok(&["run", "pipeline.sql"]);
    p.ok(&["run", "pipeline.sql", "--full-refresh", "current"]);
    let aside = p.path("warehouse/_strata/full_refresh");
    assert_eq!(std::fs::read_dir(&aside).expect("set aside").count(), 1);
    let records = p.csv("SELECT count(*) AS n FROM event_log");
    assert_ne!(records, "n\n0\n");

    // Inside the window: nothing goes.
    let out = p.ok(&["vacuum", "--set-aside", "--event-log-days", "1"]);
    assert!(out.contains("event_log: removed 0 record(s)"), "{out}");
    assert!(!out.contains("set aside:"), "{out}");
    assert_eq!(std::fs::read_dir(&aside).expect("set aside").count(), 1);

    let dry = p.ok(&[
        "vacuum",
        "--set-aside",
        "--event-log-days",
        "0",
        "--retain",
        "0",
        "--allow-short-retention",
        "--dry-run",
    ]);
    assert!(dry.contains("set aside: would remove"), "{dry}");
    assert_eq!(std::fs::read_dir(&aside).expect("set aside").count(), 1);
    assert_eq!(p.csv("SELECT count(*) AS n FROM event_log"), records);
    let out = p.ok(&[
        "vacuum",
        "--set-aside",
        "--event-log-days",
        "0",
        "--retain",
        "0",
        "--allow-short-retention",
    ]);
    assert!(out.contains("set aside: removed"), "{out}");
    assert_eq!(std::fs::read_dir(&aside).expect("set aside").count(), 0);
    assert_eq!(p.csv("SELECT count(*) AS n FROM event_log"), "n\n0\n");
    // The log keeps recording.
    p.ok(&["run", "pipeline.sql"]);
    assert_ne!(p.csv("SELECT count(*) AS n FROM event_log"), "n\n0\n");
}

/// A pipeline the event log names that cannot be planned any more blocks a vacuum (its
/// readers could not be protected) until the pipelines are named.
#[test]
fn vacuum_refuses_when_the_pipelines_readers_are_unknown() {
    let p = Project::new(PIPELINE);
    let (mut rng, mut next) = (Rng(0x77), 0u64);
    write_batch(&p, "000", 5, &mut rng, &mut next);
    p.ok(&["run", "pipeline.sql"]);
    std::fs::rename(p.path("pipeline.sql"), p.path("moved.sql")).expect("move");
    let out = p.strata(&["vacuum"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pipeline pipeline.sql, which the event log records,")
            && stderr(&out).contains("--pipeline FILE"),
        "{}",
        stderr(&out)
    );
    let out = p.ok(&["vacuum", "--pipeline", "moved.sql"]);
    assert!(
        out.contains("readers protected: those of moved.sql"),
        "{out}"
    );
}

/// An SCD1 target whose tombstones expire after a second, and an SCD2 one, from one bronze.
const EXPIRING: &str = r#"
CREATE OR REFRESH STREAMING TABLE bronze
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'eid BIGINT, id BIGINT, name STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE current
TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '1');
CREATE FLOW current_flow AS AUTO CDC INTO current FROM STREAM(bronze)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op) STORED AS SCD TYPE 1;
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_flow AS AUTO CDC INTO history FROM STREAM(bronze)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (eid, op, seq) STORED AS SCD TYPE 2;
"#;

/// [`write_batch`] with every sequence value used once (late ones moved up to a free
/// value), so that no two events of a key tie.
fn write_untied_batch(p: &Project, name: &str, n: usize, rng: &mut Rng, used: &mut Vec<u64>) {
    let mut text = String::new();
    for _ in 0..n {
        let eid = used.len() as u64 + 1;
        let id = rng.below(20);
        let op = if rng.below(6) == 0 { "D" } else { "U" };
        let mut seq = match rng.below(4) {
            0 => eid.saturating_sub(rng.below(10)) * 10 + 1,
            _ => eid * 10,
        };
        while used.contains(&seq) {
            seq += 1;
        }
        used.push(seq);
        let name = ["ana", "bo", "cy", "di"][rng.below(4) as usize];
        text.push_str(&format!(
            "{{\"eid\": {eid}, \"id\": {id}, \"name\": \"{name}\", \"op\": \"{op}\", \"seq\": {seq}}}\n"
        ));
    }
    p.file(&format!("data/cdc/{name}.json"), &text);
}

/// The numbers of an event store's line of `strata optimize`: events before and after,
/// tombstones forgotten.
fn store_line(out: &str, table: &str) -> (u64, u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("default.{table} (event store): ")))
        .unwrap_or_else(|| panic!("no event-store line for {table}: {out}"));
    // "..., X -> Y event(s), Z expired tombstone(s) forgotten, ..."
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let before = |word: &str, back: usize| {
        let i = words.iter().position(|w| *w == word).expect(word);
        words[i - back]
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{line}"))
    };
    (
        before("event(s)", 3),
        before("event(s)", 1),
        before("expired", 1),
    )
}

/// `strata optimize` rewrites the event stores: the SCD1 store without its expired
/// tombstones and the events they hid, the SCD2 store whole; a twin warehouse never
/// optimized, fed the same input at the same pace, keeps identical tables throughout,
/// late events older than a forgotten delete included.
#[test]
fn event_store_compaction_forgets_expired_tombstones_and_changes_no_result() {
    let compacted = Project::new(EXPIRING);
    let twin = Project::new(EXPIRING);
    let (mut rng, mut used) = (Rng(0x70b5), Vec::new());
    let tables = ["bronze", "current", "history"];
    let snapshot =
        |p: &Project| -> Vec<Vec<String>> { tables.iter().map(|t| rows(p, t)).collect() };
    for round in 0..4 {
        for part in 0..2 {
            let name = format!("{round:03}-{part}");
            write_untied_batch(&compacted, &name, 40, &mut rng, &mut used);
            std::fs::copy(
                compacted.path(&format!("data/cdc/{name}.json")),
                twin.path(&format!("data/cdc/{name}.json")),
            )
            .expect("copy");
            for p in [&compacted, &twin] {
                let out = p.run();
                assert!(out.status.success(), "{}", stderr(&out));
            }
            // Every delete of the runs so far expires before the next step, on both sides.
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
        let before = snapshot(&compacted);
        assert_eq!(
            before,
            snapshot(&twin),
            "round {round}: before the optimize"
        );
        let out = compacted.ok(&["optimize"]);
        let (events_before, events_after, forgotten) = store_line(&out, "current");
        assert!(
            forgotten > 0 && events_after < events_before,
            "round {round}: nothing forgotten: {out}"
        );
        let (h_before, h_after, h_forgotten) = store_line(&out, "history");
        assert_eq!((h_after, h_forgotten), (h_before, 0), "{out}");
        assert!(out.contains("tombstones kept: SCD type 2"), "{out}");
        assert_eq!(
            snapshot(&compacted),
            before,
            "round {round}: optimize changed rows"
        );
        // Right after, there is nothing left to do.
        let again = compacted.ok(&["optimize", "current"]);
        assert!(
            again.contains(
                "default.current (event store): skipped (one file and no expired tombstones)"
            ),
            "{again}"
        );
    }
    // A run after the compactions, with new input: the same tables as the twin's.
    write_untied_batch(&compacted, "last", 40, &mut rng, &mut used);
    std::fs::copy(
        compacted.path("data/cdc/last.json"),
        twin.path("data/cdc/last.json"),
    )
    .expect("copy");
    for p in [&compacted, &twin] {
        let out = p.run();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_eq!(snapshot(&compacted), snapshot(&twin));
    let out = compacted.ok(&["validate", "history"]);
    assert!(out.contains("history: ok"), "{out}");
}

/// An event store far larger than the sort's memory (`--sort-memory-mib 8`): the sort
/// spills to disk and merges from there, and the store keeps every event, the target every
/// row.
#[test]
fn an_event_store_larger_than_the_sort_memory_is_compacted_through_disk() {
    let p = Project::new(
        r#"
CREATE OR REFRESH STREAMING TABLE bronze
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'id BIGINT, name STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE history;
CREATE FLOW history_flow AS AUTO CDC INTO history FROM STREAM(bronze)
KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
"#,
    );
    let per_file = 100_000u64;
    for f in 0..3u64 {
        let mut text = String::new();
        for i in 0..per_file {
            let seq = f * per_file + i;
            text.push_str(&format!(
                "{{\"id\": {}, \"name\": \"name-{seq}-padding-padding\", \"seq\": {seq}}}\n",
                (seq * 7919) % 40_000
            ));
        }
        p.file(&format!("data/cdc/{f}.json"), &text);
        p.ok(&["run", "pipeline.sql"]);
    }
    let summary = "SELECT count(*) AS n, count(DISTINCT id) AS k, count(__END_AT) AS closed, \
                   sum(__START_AT) AS s FROM history";
    let before = p.csv(summary);
    let out = p.ok(&["optimize", "history", "--sort-memory-mib", "8"]);
    let (events_before, events_after, _) = store_line(&out, "history");
    assert_eq!((events_before, events_after), (300_000, 300_000), "{out}");
    assert!(
        out.contains("default.history (event store): 3 file(s)"),
        "{out}"
    );
    assert_eq!(p.csv(summary), before);
    // The compacted store serves the next run: one more delivery, then a fresh
    // warehouse given all of it agrees.
    p.file(
        "data/cdc/3.json",
        "{\"id\": 1, \"name\": \"late\", \"seq\": 7}\n{\"id\": 2, \"name\": \"new\", \"seq\": 999999}\n",
    );
    p.ok(&["run", "pipeline.sql"]);
    let after = p.csv(summary);
    std::fs::remove_dir_all(p.path("warehouse")).expect("remove warehouse");
    p.ok(&["run", "pipeline.sql"]);
    assert_eq!(p.csv(summary), after);
    let refused = p.strata(&["optimize", "history", "--sort-memory-mib", "1"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}

/// Rounds of new input with optimizes (some killed with SIGKILL part-way) between the
/// runs: every table stays readable, and the targets equal one run over all the input.
#[test]
fn optimizes_between_runs_and_killed_ones_change_no_result() {
    let rounds: usize = std::env::var("STRATA_DRILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let p = Project::new(PIPELINE);
    let (mut rng, mut next) = (Rng(0x1234_5678), 0u64);
    for round in 0..rounds {
        for part in 0..2 {
            write_batch(&p, &format!("{round:03}-{part}"), 15, &mut rng, &mut next);
            let out = p.run();
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let before = all_rows(&p);
        let mut child = p
            .command(&["optimize"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("optimize starts");
        std::thread::sleep(std::time::Duration::from_millis(rng.below(120)));
        // SIGKILL: no chance to clean up.
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            all_rows(&p),
            before,
            "round {round}: a killed optimize changed rows"
        );
        if round % 2 == 1 {
            p.ok(&["optimize"]);
            assert_eq!(all_rows(&p), before, "round {round}: optimize changed rows");
        }
    }
    let out = p.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(converging(&all_rows(&p)), converging(&fresh_run_of(&p)));
    let before = all_rows(&p);
    // What the killed optimizes left behind (files no commit names) goes with a vacuum.
    p.ok(&["optimize"]);
    p.ok(&["vacuum", "--retain", "0", "--allow-short-retention"]);
    assert_eq!(all_rows(&p), before);
    let out = p.ok(&["validate", "history"]);
    assert!(out.contains("history: ok"), "{out}");
}

/// `pipelines.autoOptimize.minFiles`: a run optimizes a table it wrote once the table has
/// that many files, and the readers downstream take nothing from it.
#[test]
fn a_run_optimizes_a_table_past_its_min_files() {
    let p = Project::new(
        r#"
CREATE OR REFRESH STREAMING TABLE bronze
TBLPROPERTIES ('pipelines.autoOptimize.minFiles' = '3')
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'eid BIGINT, id BIGINT, name STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE silver AS SELECT * FROM STREAM(bronze);
"#,
    );
    let (mut rng, mut next) = (Rng(0x99), 0u64);
    for i in 0..2 {
        write_batch(&p, &format!("{i:03}"), 5, &mut rng, &mut next);
        let out = p.ok(&["run", "pipeline.sql"]);
        assert!(!out.contains("optimized"), "{out}");
    }
    write_batch(&p, "002", 5, &mut rng, &mut next);
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(
        out.contains("optimized default.bronze: 3 file(s) -> 1 file(s)"),
        "{out}"
    );
    assert!(!out.contains("optimized default.silver"), "{out}");
    assert_eq!(files_of(&p, "bronze"), 1);
    write_batch(&p, "003", 5, &mut rng, &mut next);
    p.ok(&["run", "pipeline.sql"]);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM silver"),
        "n,d\n20,20\n"
    );
}

/// After a run, an AUTO CDC target's event store has its small files (one or more per run)
/// compacted into one once there are ten, so that a batch reads few files however many
/// came before; the targets are what a store never compacted gives (its target has
/// `pipelines.autoOptimize.managed = false`) after every run, and the same as one run over
/// all the input.
#[test]
fn a_run_compacts_the_small_files_of_its_event_stores() {
    let p = Project::new(PIPELINE);
    let unmanaged = PIPELINE.replace(
        "CREATE OR REFRESH STREAMING TABLE history;",
        "CREATE OR REFRESH STREAMING TABLE history \
         TBLPROPERTIES ('pipelines.autoOptimize.managed' = 'false');",
    );
    let twin = Project::new(&unmanaged);
    let (mut rng, mut next) = (Rng(0x5_7012e), 0u64);
    let mut compacted_at = Vec::new();
    for i in 0..23 {
        write_batch(&p, &format!("{i:03}"), 12, &mut rng, &mut next);
        std::fs::copy(
            p.path(&format!("data/cdc/{i:03}.json")),
            twin.path(&format!("data/cdc/{i:03}.json")),
        )
        .expect("copy");
        let out = p.ok(&["run", "pipeline.sql"]);
        if out.contains("optimized default.history (event store): 10 file(s) -> 1 file(s)") {
            assert!(
                out.contains("optimized default.current (event store): 10 file(s) -> 1 file(s)"),
                "{out}"
            );
            compacted_at.push(i);
        }
        let twin_out = twin.ok(&["run", "pipeline.sql"]);
        assert!(
            !twin_out.contains("default.history (event store)"),
            "{twin_out}"
        );
        assert_eq!(
            converging(&all_rows(&p)),
            converging(&all_rows(&twin)),
            "after run {i}"
        );
    }
    // Ten files: the first ten runs' stores, then the compacted one and nine more runs'.
    assert_eq!(
        compacted_at,
        [9, 18],
        "the runs after which the stores were compacted"
    );
    assert_eq!(converging(&all_rows(&p)), converging(&fresh_run_of(&p)));
    let out = p.ok(&["validate", "history"]);
    assert!(out.contains("history: ok"), "{out}");
}

/// The same for a snapshot flow, whose store keeps a digest of its last snapshot: after
/// its small files are compacted, the next snapshots are compared with the same state.
#[test]
fn a_snapshot_flows_store_is_compacted_after_a_run_without_changing_a_row() {
    let pipeline = |managed: &str| {
        format!(
            r#"
CREATE OR REFRESH STREAMING TABLE deliveries
AS SELECT * FROM STREAM read_files('data/plans', format => 'csv', header => true,
  schema => 'id BIGINT, plan STRING, v BIGINT');
CREATE OR REFRESH STREAMING TABLE plans
TBLPROPERTIES ('pipelines.autoOptimize.managed' = '{managed}');
CREATE FLOW plans_flow AS AUTO CDC FROM SNAPSHOT INTO plans FROM STREAM(deliveries)
KEYS (id) SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS SCD TYPE 2;
"#
        )
    };
    let p = Project::new(&pipeline("true"));
    let twin = Project::new(&pipeline("false"));
    let mut rng = Rng(0x5ab);
    let mut compactions = 0;
    for v in 1..=12u64 {
        let mut csv = String::from("id,plan,v\n");
        for id in 0..30u64 {
            if rng.below(8) > 0 {
                let plan = ["free", "pro", "team"][rng.below(3) as usize];
                csv.push_str(&format!("{id},{plan},{v}\n"));
            }
        }
        for q in [&p, &twin] {
            q.file(&format!("data/plans/v{v:03}.csv"), &csv);
        }
        let out = p.ok(&["run", "pipeline.sql"]);
        compactions += out.matches("optimized default.plans (event store)").count();
        twin.ok(&["run", "pipeline.sql"]);
        assert_eq!(rows(&p, "plans"), rows(&twin, "plans"), "after version {v}");
    }
    assert_eq!(compactions, 1, "ten runs' small files compacted once");
    let out = p.ok(&["validate", "plans"]);
    assert!(out.contains("plans: ok"), "{out}");
}
