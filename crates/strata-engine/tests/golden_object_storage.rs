//! Golden scenarios on object storage: the same files and runner as `golden` (single-thread
//! paths), each scenario twice, with its warehouse and input files under a prefix of its own
//! in the bucket of the S3-compatible server (moto; tests `s3:<scenario>`) and in the
//! container of the Azure Storage emulator (Azurite, as `az://` URLs; tests
//! `azure:<scenario>`), both started by `scripts/services/with-services.sh`; every scenario
//! must give the same rows as on local disk. A server that is not set up
//! (`STRATA_TEST_S3_ENDPOINT` or `STRATA_TEST_AZURE_BLOB_URL` unset) fails the test
//! `s3:server` or `azure:server`, saying how to start it. Four scenarios run at once unless
//! `--test-threads` says otherwise: the time goes to the two servers, one core each.

mod golden_runner;

fn main() -> std::process::ExitCode {
    golden_runner::main(golden_runner::Mode::ObjectStorage)
}
