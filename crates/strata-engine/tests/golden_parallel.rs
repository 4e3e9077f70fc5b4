//! Golden scenarios on the engine's parallel paths: the same files and runner as `golden`,
//! with `STRATA_PARALLEL_MIN_ROWS=1` set before anything else, so that every fold and every
//! write takes the parallel path that large inputs take (the engine reads the threshold once
//! per process, hence a binary of its own).

mod golden_runner;

fn main() -> std::process::ExitCode {
    golden_runner::main(golden_runner::Mode::Parallel)
}
