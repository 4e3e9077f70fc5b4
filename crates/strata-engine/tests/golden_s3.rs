//! Golden scenarios on object storage: the same files and runner as `golden` (single-thread
//! paths), with each scenario's warehouse and input files under a prefix of its own in the
//! bucket of the S3-compatible server (moto) that `scripts/services/with-services.sh` starts;
//! every scenario must give the same rows as on local disk. Without that server
//! (`STRATA_TEST_S3_ENDPOINT` unset) the target fails, saying how to start it.

mod golden_runner;

fn main() -> std::process::ExitCode {
    golden_runner::main(golden_runner::Mode::S3)
}
