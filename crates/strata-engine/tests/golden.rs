//! Golden scenarios on the engine's single-thread paths: every `tests/scenarios/**/*.scn`
//! file is one test, named by its path there (`cargo test -p strata-engine --test golden --
//! semantics/ties`). With the default `STRATA_PARALLEL_MIN_ROWS` (unset here) their small
//! inputs are folded and written on one thread; `golden_parallel` runs the same files on the
//! parallel paths. The runner is `golden_runner/`; the format is in `tests/scenarios/README.md`.

mod golden_runner;

fn main() -> std::process::ExitCode {
    golden_runner::main(golden_runner::Mode::SingleThread)
}
