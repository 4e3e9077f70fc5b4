//! A short fuzz run of the three cargo-fuzz targets in the ordinary debug build, for CI.
//!
//! Each target's check (fuzz/checks/TARGET.rs, the same code the cargo-fuzz binaries of
//! fuzz/ run) gets, in this order:
//! 1. every seed `fuzz/make_seeds.py` derives from tests/scenarios, examples and the docs
//!    (it is run into a temp dir; it needs `python3`);
//! 2. every input committed under fuzz/regressions/TARGET/ (inputs that once failed);
//! 3. `STRATA_FUZZ_SECONDS` (20 by default) of mutations of those inputs: bit flips, byte
//!    sets, deletes, duplications, splices between inputs and tokens of fuzz/dict/TARGET.dict.
//!    The random seed is printed; `STRATA_FUZZ_SEED=N` repeats a run's sequence of inputs.
//!
//! This is an uninstrumented mutation run: it has no coverage feedback, so it finds shallow
//! crashes near the seeds, not deep ones. The coverage-guided run is scripts/fuzz.sh.
//!
//! A finding is a panic during a check, on any thread (the checks assert their contracts by
//! panicking), or one input taking more than a minute. The input is saved under
//! fuzz/artifacts/TARGET/ (ignored by git) and the failure message says how to replay it:
//! `STRATA_FUZZ_REPLAY=PATH cargo test --workspace --test fuzz_smoke TARGET` runs the check
//! on that one file, as does `cargo fuzz run TARGET PATH`. Once fixed, the input belongs in
//! fuzz/regressions/TARGET/.
//!
//! The targets run one at a time (a lock), so that a panic on a worker thread belongs to the
//! input being checked.

#[path = "../../../fuzz/checks/read_files.rs"]
mod read_files;
#[path = "../../../fuzz/checks/sql_parse_plan.rs"]
mod sql_parse_plan;
#[path = "../../../fuzz/checks/yaml_spec.rs"]
mod yaml_spec;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What `scripts/fuzz.sh` gives libFuzzer as `-max_len`.
const MAX_LEN: usize = 8192;
/// One input taking longer is a finding (libFuzzer's `-timeout` in scripts/fuzz.sh).
const SLOW: Duration = Duration::from_secs(60);

struct Target {
    name: &'static str,
    check: fn(&[u8]),
    /// The check skips input that is not UTF-8: mutations are made valid UTF-8 again.
    text: bool,
    /// The first byte picks a mode (read_files): mutations also set it to one of the 16.
    mode_byte: bool,
}

#[test]
fn sql_parse_plan() {
    smoke(&Target {
        name: "sql_parse_plan",
        check: sql_parse_plan::check,
        text: true,
        mode_byte: false,
    });
}

#[test]
fn yaml_spec() {
    smoke(&Target {
        name: "yaml_spec",
        check: yaml_spec::check,
        text: true,
        mode_byte: false,
    });
}

#[test]
fn read_files() {
    smoke(&Target {
        name: "read_files",
        check: read_files::check,
        text: false,
        mode_byte: true,
    });
}

fn smoke(target: &Target) {
    let _one_at_a_time = serial();
    count_panics();
    if let Ok(path) = std::env::var("STRATA_FUZZ_REPLAY") {
        return replay_one(target, Path::new(&path));
    }
    let seeds = seeds(target.name);
    let regressions = read_inputs(&repo().join("fuzz/regressions").join(target.name));
    assert!(
        !seeds.is_empty(),
        "{}: make_seeds.py made no seed",
        target.name
    );
    let clock = Instant::now();
    for input in seeds.iter().chain(&regressions) {
        check_or_report(target, input, "a seed or regression input");
    }
    let replayed = clock.elapsed();
    let mut pool = seeds;
    pool.extend(regressions);
    let (n, seed) = mutate_for(target, &pool, budget());
    println!(
        "fuzz_smoke {}: {} seed and regression input(s) in {:.1}s, then {n} mutated input(s) \
         in {:.1}s (STRATA_FUZZ_SEED={seed}); no finding",
        target.name,
        pool.len(),
        replayed.as_secs_f64(),
        (clock.elapsed() - replayed).as_secs_f64()
    );
}

/// Phase 3: mutated inputs until `budget` is spent. Returns how many and the random seed.
fn mutate_for(target: &Target, pool: &[Vec<u8>], budget: Duration) -> (u64, u64) {
    let seed = std::env::var("STRATA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!(
        "fuzz_smoke {}: mutating for {}s with STRATA_FUZZ_SEED={seed}",
        target.name,
        budget.as_secs()
    );
    let dict = dictionary(target.name);
    let mut rng = Rng::new(seed);
    let deadline = Instant::now() + budget;
    let mut n = 0;
    while Instant::now() < deadline {
        let input = mutant(target, pool, &dict, &mut rng);
        check_or_report(
            target,
            &input,
            &format!("mutated input {n} of STRATA_FUZZ_SEED={seed}"),
        );
        n += 1;
    }
    (n, seed)
}

/// One input to check: a pool input with 1 to 8 mutations stacked.
fn mutant(target: &Target, pool: &[Vec<u8>], dict: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let mut data = pool[rng.below(pool.len())].clone();
    for _ in 0..1 + rng.below(8) {
        mutate(&mut data, pool, dict, rng);
    }
    if target.mode_byte && !data.is_empty() && rng.below(8) == 0 {
        data[0] = b'0' + rng.below(16) as u8;
    }
    data.truncate(MAX_LEN);
    if target.text && std::str::from_utf8(&data).is_err() {
        // Mended, so that the check does not just skip it.
        data = String::from_utf8_lossy(&data).into_owned().into_bytes();
    }
    data
}

/// Bytes the mutations write: structure of JSON, CSV, YAML and SQL, and edges.
const INTERESTING: &[u8] = b"\0\xff\x7f\n\r\t \"'`;,:{}[]()-+.0123456789$\\#=*";

fn mutate(data: &mut Vec<u8>, pool: &[Vec<u8>], dict: &[Vec<u8>], rng: &mut Rng) {
    let len = data.len();
    let other = &pool[rng.below(pool.len())];
    match rng.below(9) {
        0 if len > 0 => data[rng.below(len)] ^= 1 << rng.below(8),
        1 if len > 0 => data[rng.below(len)] = INTERESTING[rng.below(INTERESTING.len())],
        2 if len > 0 => {
            let (at, n) = range(len, rng);
            data.drain(at..at + n);
        }
        3 if len > 0 => {
            let (at, n) = range(len, rng);
            let piece = data[at..at + n].to_vec();
            let to = rng.below(len + 1);
            data.splice(to..to, piece);
        }
        4 if !dict.is_empty() => {
            let token = &dict[rng.below(dict.len())];
            let to = rng.below(len + 1);
            data.splice(to..to, token.iter().copied());
        }
        5 if !dict.is_empty() && len > 0 => {
            let token = &dict[rng.below(dict.len())];
            let (at, n) = range(len, rng);
            data.splice(at..at + n, token.iter().copied());
        }
        6 if !other.is_empty() => {
            // Splice: this input's head, the other's tail.
            let cut = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        7 if !other.is_empty() => {
            let (at, n) = range(other.len(), rng);
            let to = rng.below(len + 1);
            data.splice(to..to, other[at..at + n].iter().copied());
        }
        8 if len > 0 => {
            // A line or a statement repeated: many of the contracts are about order.
            let at = rng.below(len);
            let end = data[at..]
                .iter()
                .position(|&b| b == b'\n' || b == b';')
                .map_or(len, |p| at + p + 1);
            let piece = data[at..end].to_vec();
            data.splice(end..end, piece);
        }
        _ => data.push(INTERESTING[rng.below(INTERESTING.len())]),
    }
}

/// A short range inside `len` (> 0): its start and length (1 to 64 bytes).
fn range(len: usize, rng: &mut Rng) -> (usize, usize) {
    let at = rng.below(len);
    let n = 1 + rng.below((len - at).min(64));
    (at, n)
}

/// Runs the check on `input`; on a finding saves the input and fails the test, saying how
/// to replay it.
fn check_or_report(target: &Target, input: &[u8], what: &str) {
    if let Err(finding) = check_one(target, input) {
        let saved = save(target.name, input);
        panic!(
            "fuzz_smoke {}: {what} fails: {finding}\n\
             the input is saved as {}\n\
             replay: STRATA_FUZZ_REPLAY={} cargo test --workspace --test fuzz_smoke {}\n\
             (or `cargo fuzz run {} {}`); once fixed, commit it to fuzz/regressions/{}/",
            target.name,
            saved.display(),
            saved.display(),
            target.name,
            target.name,
            saved.display(),
            target.name
        );
    }
}

/// The check on one input: a panic on this thread or any other while it runs, or more
/// than [`SLOW`], is a finding.
fn check_one(target: &Target, input: &[u8]) -> Result<(), String> {
    let before = PANICS.load(Ordering::SeqCst);
    let clock = Instant::now();
    let watchdog = Watchdog::start(target.name, input);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| (target.check)(input)));
    drop(watchdog);
    let panics = PANICS.load(Ordering::SeqCst) - before;
    if outcome.is_err() || panics > 0 {
        let last = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
        return Err(format!("{panics} panic(s), the last: {last}"));
    }
    if clock.elapsed() > SLOW {
        return Err(format!("it took {:.0}s", clock.elapsed().as_secs_f64()));
    }
    Ok(())
}

/// Saves the input being checked and ends the process when it hangs well past [`SLOW`]
/// (a loop that never ends would otherwise leave nothing to replay).
struct Watchdog(Option<Arc<Mutex<bool>>>);

impl Watchdog {
    fn start(target: &'static str, input: &[u8]) -> Watchdog {
        let done = Arc::new(Mutex::new(false));
        let input = input.to_vec();
        let flag = Arc::clone(&done);
        std::thread::spawn(move || {
            let clock = Instant::now();
            while clock.elapsed() < 5 * SLOW {
                std::thread::sleep(Duration::from_millis(200));
                if *flag.lock().unwrap_or_else(|p| p.into_inner()) {
                    return;
                }
            }
            let saved = save(target, &input);
            eprintln!(
                "fuzz_smoke {target}: an input still runs after {}s (a hang); saved as {}",
                clock.elapsed().as_secs(),
                saved.display()
            );
            std::process::abort();
        });
        Watchdog(Some(done))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        }
    }
}

/// `STRATA_FUZZ_REPLAY`: one file through the check. A relative path is taken from the
/// repository's root (cargo runs the test in crates/strata-engine).
fn replay_one(target: &Target, path: &Path) {
    let path = &repo().join(path);
    let input = std::fs::read(path)
        .unwrap_or_else(|e| panic!("STRATA_FUZZ_REPLAY {}: {e}", path.display()));
    if let Err(finding) = check_one(target, &input) {
        panic!("{} on {}: {finding}", path.display(), target.name);
    }
    println!("{} on {}: no finding", path.display(), target.name);
}

/// Saves a failing input as fuzz/artifacts/TARGET/smoke-HASH.
fn save(target: &str, input: &[u8]) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut h);
    let dir = repo().join("fuzz/artifacts").join(target);
    let path = dir.join(format!("smoke-{:016x}", h.finish()));
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, input))
        .unwrap_or_else(|e| panic!("saving the failing input as {}: {e}", path.display()));
    path
}

fn repo() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    repo.canonicalize().unwrap_or(repo)
}

/// Phase 1's inputs: the seeds `fuzz/make_seeds.py` makes for `target`, in a temp dir of
/// this test's own (removed when it ends).
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = repo().join("fuzz/make_seeds.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("python3 {} (needs python3): {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    read_inputs(&dir.path().join(target))
}

/// Every file of `dir` (none when it does not exist), in name order.
fn read_inputs(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.retain(|p| p.is_file());
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// The tokens of fuzz/dict/TARGET.dict (libFuzzer's format: `"..."` or `name="..."` per
/// line, with `\\`, `\"` and `\xNN` escapes).
fn dictionary(target: &str) -> Vec<Vec<u8>> {
    let path = repo().join("fuzz/dict").join(format!("{target}.dict"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the dictionary {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let (start, end) = (l.find('"')?, l.rfind('"')?);
            (end > start).then(|| unescape(&l[start + 1..end]))
        })
        .collect()
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 2..i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], b.get(i + 1)) {
            (b'\\', Some(b'x')) if hex.is_some() => {
                out.extend(hex);
                i += 4;
            }
            (b'\\', Some(&c)) => {
                out.push(c);
                i += 2;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn budget() -> Duration {
    let seconds = std::env::var("STRATA_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(seconds)
}

static PANICS: AtomicUsize = AtomicUsize::new(0);
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Counts every panic of the process (on any thread) and keeps the last one's message,
/// then prints it as the default hook does.
fn count_panics() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            if let Ok(mut last) = LAST_PANIC.lock() {
                *last = format!("(thread {thread}) {info}");
            }
            default(info);
        }));
    });
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// xorshift64*: small, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as usize % n.max(1)
    }
}
