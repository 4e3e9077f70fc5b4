//! Crashes and the states they leave, on the real binary: `strata run` killed (SIGKILL) at
//! random moments during a pipeline with every kind of dataset (ingestion, AUTO CDC into
//! SCD1 and SCD2, snapshots, a point-in-time table, a materialized view) and during full
//! refreshes; then the states a crash leaves at known places, pinned one by one: a target
//! behind its event store (killed between the two commits), an ingest killed after copying
//! an adopted Parquet file, a table set aside by a full refresh and moved back, continuous
//! mode stopped by SIGINT, and input files still being written; and bulk loads (split on
//! local disk) killed at random moments. After each, runs converge to what one run over all
//! the input gives on a fresh warehouse.
//!
//! `STRATA_DRILL_ROUNDS` sets the crash drill's rounds (8 by default, as CI runs it) and
//! `STRATA_DRILL_SEED` its seed (printed).

mod common;

use common::{delta_version, drill_seed, env_usize, stderr, Project, Rng};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const PIPELINE: &str = concat!(
    common::events_and_history!(),
    common::people_scd1!(),
    r#"
CREATE OR REFRESH STREAMING TABLE plan_deliveries
AS SELECT * FROM STREAM read_files('data/plans', format => 'csv', header => true,
  schema => 'id BIGINT, plan STRING, v BIGINT');
CREATE OR REFRESH STREAMING TABLE plans;
CREATE FLOW plans_flow AS AUTO CDC FROM SNAPSHOT INTO plans FROM STREAM(plan_deliveries)
KEYS (id) SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS SCD TYPE 2;

CREATE OR REFRESH POINT IN TIME TABLE people_pit
KEYS (id)
AS OF (SELECT DISTINCT v FROM plan_deliveries)
FROM people_history, plans;

CREATE OR REFRESH MATERIALIZED VIEW names AS
SELECT name, count(*) AS n FROM people GROUP BY name;
"#
);

/// Every table of [`PIPELINE`], as queries whose rows must match a fresh warehouse's.
const TABLES: [&str; 7] = [
    "SELECT * FROM events_raw",
    "SELECT * FROM people_history",
    "SELECT * FROM people",
    "SELECT * FROM plan_deliveries",
    "SELECT * FROM plans",
    "SELECT * FROM people_pit",
    "SELECT * FROM names",
];

/// One delivery: a JSON file of change events over 40 keys (unique event ids; sequence
/// values unique per key, some late) and a snapshot of the plans as version `round + 1`.
struct Input {
    next_eid: u64,
    delivered: u64,
}

impl Input {
    fn deliver(&mut self, p: &Project, round: usize, rng: &mut Rng) {
        let mut events = String::new();
        for _ in 0..300 {
            let eid = self.next_eid;
            self.next_eid += 1;
            let id = rng.below(40);
            let op = if rng.below(10) == 0 { "D" } else { "U" };
            let name = ["ana", "bo", "cy", "di"][rng.below(4) as usize];
            let seq = match rng.below(8) {
                0 => eid.saturating_sub(rng.below(400)),
                _ => eid,
            } * 100_000
                + eid % 100_000;
            events.push_str(&format!(
                "{{\"eid\": {eid}, \"id\": {id}, \"name\": \"{name}\", \"op\": \"{op}\", \"seq\": {seq}}}\n"
            ));
        }
        self.delivered += 300;
        p.file(&format!("data/cdc/r{round:03}.json"), &events);
        let version = (round as u64 + 1) * 30_000_000;
        let mut plans = String::from("id,plan,v\n");
        for id in 0..40u64 {
            if rng.below(5) > 0 {
                let plan = ["free", "pro", "team"][rng.below(3) as usize];
                plans.push_str(&format!("{id},{plan},{version}\n"));
            }
        }
        p.file(&format!("data/plans/v{round:03}.csv"), &plans);
    }
}

fn new_project() -> Project {
    let p = Project::new(PIPELINE);
    std::fs::create_dir_all(p.path("data/plans")).expect("mkdir");
    p
}

/// Starts `args`, kills it (SIGKILL) after `after`; whether it was still running then.
fn start_and_kill(p: &Project, args: &[&str], after: Duration) -> bool {
    kill_after(p.command(args), after)
}

/// Starts `command`, kills it (SIGKILL) after `after`; whether it was still running then.
fn kill_after(mut command: std::process::Command, after: Duration) -> bool {
    let mut child: Child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strata starts");
    std::thread::sleep(after);
    let running = child.try_wait().expect("wait").is_none();
    let _ = child.kill();
    let _ = child.wait();
    running
}

/// What must hold after any crash: every table that exists opens, and the bronze table
/// holds no input row twice.
fn check_after_crash(p: &Project, what: &str) {
    for sql in TABLES {
        let table = sql.rsplit(' ').next().unwrap_or_default();
        let log = p.path(&format!("warehouse/default/{table}/_delta_log"));
        let committed = std::fs::read_dir(&log).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".json"))
        });
        if !committed {
            // Not created yet, set aside by a full refresh that was killed, or a creation
            // killed before its first commit file was in place (the table does not exist).
            continue;
        }
        let out = p.strata(&[
            "query",
            "--format",
            "csv",
            &format!("SELECT count(*) AS n FROM {table}"),
        ]);
        assert!(
            out.status.success(),
            "{what}: {table} does not open: {}",
            stderr(&out)
        );
    }
    if p.path("warehouse/default/events_raw/_delta_log").exists() {
        let counts = p.csv("SELECT count(*) - count(DISTINCT eid) AS doubled FROM events_raw");
        assert_eq!(
            counts.trim(),
            "doubled\n0",
            "{what}: an input row taken twice"
        );
    }
}

/// The tables equal what one run over all the input gives on a fresh warehouse, and every
/// history table validates.
fn assert_converged(p: &Project, what: &str) {
    let fresh = new_project();
    p.copy_input_to(&fresh);
    fresh.ok(&["run", "pipeline.sql"]);
    for sql in TABLES {
        assert_eq!(
            p.sorted_csv(sql),
            fresh.sorted_csv(sql),
            "{what}: {sql} differs from one run over all the input"
        );
    }
    for table in ["people_history", "plans", "people_pit"] {
        let v = p.ok(&["validate", table]);
        assert!(v.contains("ok"), "{what}: validate {table}: {v}");
    }
}

#[test]
fn runs_killed_at_random_moments_converge_to_one_run_over_all_the_input() {
    let rounds = env_usize("STRATA_DRILL_ROUNDS", 8);
    let seed = drill_seed();
    eprintln!("crash drill: seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    // One clean run first, so later kills also land in the runs that find tables to update.
    input.deliver(&p, 0, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    // How long a run takes here (debug or release, a loaded machine or not): kills are
    // spread over that time, so they land in every phase of a run.
    let started = Instant::now();
    input.deliver(&p, 1, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    let typical = started.elapsed().as_millis() as u64;
    let (mut kills, mut full_refresh_kills) = (0, 0);
    for round in 2..rounds + 2 {
        input.deliver(&p, round, &mut rng);
        // Some kills hit a full refresh of a target (set aside, then rebuilt from the start).
        let full_refresh = rng.below(4) == 0;
        let args: &[&str] = match full_refresh {
            true => &["run", "pipeline.sql", "--full-refresh", "people_history"],
            false => &["run", "pipeline.sql"],
        };
        let after = Duration::from_millis(10 + rng.below(typical + typical / 4));
        if start_and_kill(&p, args, after) {
            kills += 1;
            full_refresh_kills += usize::from(full_refresh);
        }
        check_after_crash(&p, &format!("round {round} (killed after {after:?})"));
        // Every other round, a run that is let finish: it must succeed after any crash.
        if round % 2 == 0 {
            p.ok(&["run", "pipeline.sql"]);
            check_after_crash(&p, &format!("round {round}, the run after the kill"));
        }
    }
    p.ok(&["run", "pipeline.sql"]);
    let counts = p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM events_raw");
    let n = input.delivered;
    assert_eq!(
        counts.trim(),
        format!("n,d\n{n},{n}"),
        "every input row exactly once"
    );
    assert_converged(&p, "after the crash drill");
    eprintln!(
        "crash drill: {rounds} rounds, {kills} runs killed while running \
         ({full_refresh_kills} of them full refreshes), {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        kills > 0,
        "no run was still running when killed: the drill tested nothing"
    );
}

/// Bulk loads (`STRATA_STREAM_MIN_ROWS=1` makes every first load and full refresh of a change
/// flow one, split into at least three parts on local disk) killed at random moments, before,
/// during and between their commits: the tables converge to one in-memory run over all the
/// input, and the temp dirs of killed loads are gone once a later bulk load has started.
#[test]
fn bulk_loads_killed_at_random_moments_converge() {
    let rounds = env_usize("STRATA_DRILL_ROUNDS", 8);
    let seed = drill_seed();
    eprintln!("bulk drill: seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let p = new_project();
    let tmp = p.path("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    for round in 0..3 {
        input.deliver(&p, round, &mut rng);
    }
    let bulk = |args: &[&str]| {
        let mut c = p.command(args);
        c.env("STRATA_STREAM_MIN_ROWS", "1").env("TMPDIR", &tmp);
        c
    };
    let refresh = ["run", "pipeline.sql", "--full-refresh", "people_history"];
    let started = Instant::now();
    let out = bulk(&["run", "pipeline.sql"])
        .output()
        .expect("strata runs");
    assert!(out.status.success(), "first bulk load: {}", stderr(&out));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(said.contains("bulk load: "), "not a bulk load: {said}");
    let typical = started.elapsed().as_millis() as u64;
    let mut kills = 0;
    for round in 3..rounds + 3 {
        input.deliver(&p, round, &mut rng);
        let after = Duration::from_millis(10 + rng.below(typical + typical / 4));
        if kill_after(bulk(&refresh), after) {
            kills += 1;
        }
        check_after_crash(&p, &format!("bulk round {round} (killed after {after:?})"));
        if round % 2 == 0 {
            let out = bulk(&["run", "pipeline.sql"])
                .output()
                .expect("strata runs");
            assert!(out.status.success(), "round {round}: {}", stderr(&out));
        }
    }
    let out = bulk(&refresh).output().expect("strata runs");
    assert!(out.status.success(), "last bulk load: {}", stderr(&out));
    assert_converged(&p, "after the bulk drill");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("strata-bulk-"))
        .collect();
    assert!(left.is_empty(), "spill dirs left behind: {left:?}");
    eprintln!("bulk drill: {rounds} rounds, {kills} bulk loads killed while running");
    assert!(
        kills > 0,
        "no run was still running when killed: the drill tested nothing"
    );
}

/// Large batches (`STRATA_STREAM_MIN_ROWS=1` makes every later batch of a change flow into a
/// target with rows one: split into parts on local disk, each folded with its keys' stored
/// events) killed at random moments, before, during and between their commits: the tables
/// converge to in-memory runs over all the input.
#[test]
fn large_batches_killed_at_random_moments_converge() {
    let rounds = env_usize("STRATA_DRILL_ROUNDS", 8);
    let seed = drill_seed();
    eprintln!("large-batch drill: seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let p = new_project();
    let tmp = p.path("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    input.deliver(&p, 0, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    let large = |args: &[&str]| {
        let mut c = p.command(args);
        c.env("STRATA_STREAM_MIN_ROWS", "1").env("TMPDIR", &tmp);
        c
    };
    input.deliver(&p, 1, &mut rng);
    let started = Instant::now();
    let out = large(&["run", "pipeline.sql"])
        .output()
        .expect("strata runs");
    assert!(out.status.success(), "first large batch: {}", stderr(&out));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(said.contains("large batch: "), "not a large batch: {said}");
    let typical = started.elapsed().as_millis() as u64;
    let mut kills = 0;
    for round in 2..rounds + 2 {
        input.deliver(&p, round, &mut rng);
        let after = Duration::from_millis(10 + rng.below(typical + typical / 4));
        if kill_after(large(&["run", "pipeline.sql"]), after) {
            kills += 1;
        }
        check_after_crash(
            &p,
            &format!("large-batch round {round} (killed after {after:?})"),
        );
    }
    let out = large(&["run", "pipeline.sql"])
        .output()
        .expect("strata runs");
    assert!(out.status.success(), "last large batch: {}", stderr(&out));
    assert_converged(&p, "after the large-batch drill");
    eprintln!("large-batch drill: {rounds} rounds, {kills} runs killed while running");
    assert!(
        kills > 0,
        "no run was still running when killed: the drill tested nothing"
    );
}

/// The newest commit file of the Delta table at `table` under the project.
fn last_commit(p: &Project, table: &str) -> std::path::PathBuf {
    let dir = p.path(table);
    let v = delta_version(&dir).expect("a Delta table");
    dir.join(format!("_delta_log/{v:020}.json"))
}

#[test]
fn a_target_left_behind_its_event_store_catches_up() {
    let mut rng = Rng(0x007a_6e7b_3b1d_0001);
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    input.deliver(&p, 0, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    input.deliver(&p, 1, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    // A crash between the event store's commit and the target's: the target's last commit
    // never happened (its data files stay behind, unreferenced).
    for target in ["people_history", "people", "plans"] {
        let commit = last_commit(&p, &format!("warehouse/default/{target}"));
        std::fs::remove_file(&commit).expect("remove the target's last commit");
    }
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(out.contains("people_history_flow"), "{out}");
    assert_converged(&p, "a target behind its event store");
}

#[test]
fn an_ingest_killed_after_copying_an_adopted_file_takes_it_once() {
    // Parquet input whose columns are the table's: the file is copied in, not rewritten.
    let pipeline = "CREATE OR REFRESH STREAMING TABLE copied \
                    AS SELECT * FROM STREAM read_files('data/pq', format => 'parquet');\n";
    let source = Project::new(
        "CREATE OR REFRESH STREAMING TABLE rows AS SELECT * FROM STREAM read_files('data/cdc', \
         format => 'json', schema => 'id BIGINT, name STRING');\n",
    );
    let lines: String = (0..500)
        .map(|i| format!("{{\"id\": {i}, \"name\": \"n{i}\"}}\n"))
        .collect();
    source.file("data/cdc/001.json", &lines);
    source.ok(&["run", "pipeline.sql"]);
    let p = Project::new(pipeline);
    std::fs::create_dir_all(p.path("data/pq")).expect("mkdir");
    let data_file = common::walk(&source.path("warehouse/default/rows"))
        .into_iter()
        .find(|f| f.extension().is_some_and(|e| e == "parquet"))
        .expect("a data file");
    std::fs::copy(&data_file, p.path("data/pq/001.parquet")).expect("copy");
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(out.contains("500 row(s)"), "{out}");
    // The crash: the copy is in the table's folder, its commit never happened.
    std::fs::remove_file(last_commit(&p, "warehouse/default/copied")).expect("remove the commit");
    let copies = |p: &Project| {
        common::walk(&p.path("warehouse/default/copied"))
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "parquet"))
            .count()
    };
    assert_eq!(copies(&p), 1, "the copied file stays behind");
    p.ok(&["run", "pipeline.sql"]);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS d FROM copied")
            .trim(),
        "n,d\n500,500",
        "the file's rows exactly once"
    );
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(out.contains("no new files"), "{out}");
}

#[test]
fn a_table_set_aside_by_a_full_refresh_is_restored_by_moving_it_back() {
    let mut rng = Rng(0x5e7a_51de_0001);
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    for round in 0..3 {
        input.deliver(&p, round, &mut rng);
        p.ok(&["run", "pipeline.sql"]);
    }
    let table = p.path("warehouse/default/people_history");
    let (before, version) = (
        p.sorted_csv("SELECT * FROM people_history"),
        delta_version(&table),
    );
    p.ok(&["run", "pipeline.sql", "--full-refresh", "people_history"]);
    assert_ne!(
        delta_version(&table),
        version,
        "the refresh made a new table"
    );
    // Restoring, as docs/operations.md says: move the set-aside folders back.
    let aside = std::fs::read_dir(p.path("warehouse/_strata/full_refresh"))
        .expect("set-aside folder")
        .flatten()
        .next()
        .expect("one refresh")
        .path();
    for (from, to) in [
        ("default/people_history", "default/people_history"),
        (
            "events/default/people_history",
            "_strata/default/people_history/events",
        ),
    ] {
        let to = p.path(&format!("warehouse/{to}"));
        std::fs::remove_dir_all(&to).expect("remove the rebuilt table");
        std::fs::rename(aside.join(from), &to).expect("move back");
    }
    assert_eq!(delta_version(&table), version, "the old table is back");
    assert_eq!(p.sorted_csv("SELECT * FROM people_history"), before);
    // The restored table goes on from where it was.
    input.deliver(&p, 3, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    assert_converged(&p, "a restored table");
}

#[test]
fn empty_and_half_written_input_files_are_taken_once_they_are_whole() {
    let mut rng = Rng(0x0e3b_7f11_e001);
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    input.deliver(&p, 0, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    // A writer created its file and has not written yet: nothing is taken from it.
    p.file("data/cdc/r001.json", "");
    let out = p.ok(&["run", "pipeline.sql"]);
    assert!(
        out.contains("table default.events_raw: no new files"),
        "{out}"
    );
    // Half written: the run fails naming the file and line, and nothing changes (this
    // round's plans are not delivered, so no other dataset has anything to do).
    input.deliver(&p, 1, &mut rng);
    std::fs::remove_file(p.path("data/plans/v001.csv")).expect("remove");
    let whole = std::fs::read_to_string(p.path("data/cdc/r001.json")).expect("read");
    // Cut inside line 151 (a cut that falls between lines leaves a whole, shorter file,
    // which no reader can tell from a finished one: docs/operations.md says to write input
    // files under a name starting with `_` or `.` and rename them when done).
    let line_151 = whole.match_indices('\n').nth(149).expect("300 lines").0 + 1;
    let cut = &whole[..line_151 + 20];
    let cut_line = 151;
    p.file("data/cdc/r001.json", cut);
    let before = common::table_files(&p.path("warehouse"));
    let out = p.run();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("r001.json line {cut_line}, column"))
            && err.contains("the file ends inside this line"),
        "{err}"
    );
    assert_eq!(
        common::table_files(&p.path("warehouse")),
        before,
        "the failed run wrote nothing"
    );
    // Once whole, it is taken, every row once.
    p.file("data/cdc/r001.json", &whole);
    p.ok(&["run", "pipeline.sql"]);
    let n = input.delivered;
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT eid) AS d FROM events_raw")
            .trim(),
        format!("n,d\n{n},{n}")
    );
    assert_converged(&p, "after an empty and a half-written file");
}

/// Continuous mode stopped by SIGINT at random moments while files arrive, started again
/// each time: nothing lost, nothing twice.
#[test]
fn continuous_mode_stopped_by_sigint_loses_nothing() {
    let mut rng = Rng(drill_seed());
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    let mut round = 0;
    for stop in 0..4 {
        let mut child = p
            .command(&["run", "pipeline.sql", "--continuous", "--interval", "200ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("strata starts");
        for _ in 0..2 {
            input.deliver(&p, round, &mut rng);
            round += 1;
            std::thread::sleep(Duration::from_millis(100 + rng.below(1500)));
        }
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(120);
        while child.try_wait().expect("wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "stop {stop}: did not stop after SIGINT"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        assert!(out.status.success(), "stop {stop}: {}", stderr(&out));
        assert!(stderr(&out).contains("stopped after"), "{}", stderr(&out));
        check_after_crash(&p, &format!("after SIGINT {stop}"));
    }
    p.ok(&["run", "pipeline.sql"]);
    assert_converged(&p, "continuous mode stopped by SIGINT");
}

/// Continuous mode meets a bad file: it stops with exit code 2 and the tables stay as the
/// runs before left them; once the file is mended, a run takes it.
#[test]
fn continuous_mode_stops_at_a_bad_file_leaving_the_tables_as_they_were() {
    let mut rng = Rng(0xc071_bad0_0001);
    let p = new_project();
    let mut input = Input {
        next_eid: 1,
        delivered: 0,
    };
    input.deliver(&p, 0, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    let before = common::table_files(&p.path("warehouse"));
    p.file(
        "data/cdc/r001.json",
        "{\"eid\": 100000, \"id\": 1, \"name\": \"x\", \"op\": \"U\", \"seq\": \"not a number\"}\n",
    );
    let out = p
        .command(&["run", "pipeline.sql", "--continuous", "--interval", "200ms"])
        .output()
        .expect("strata runs");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("r001.json"), "{}", stderr(&out));
    assert_eq!(
        common::table_files(&p.path("warehouse")),
        before,
        "nothing written"
    );
    input.deliver(&p, 1, &mut rng);
    p.ok(&["run", "pipeline.sql"]);
    assert_converged(&p, "after continuous mode stopped at a bad file");
}
