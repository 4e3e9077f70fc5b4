//! Golden scenarios on Azure Blob Storage: the same files and runner as `golden` (single-thread
//! paths), with each scenario's warehouse and input files under a prefix of its own in the
//! container of the Azure Storage emulator (Azurite) that `scripts/services/with-services.sh`
//! starts, as `az://` URLs; every scenario must give the same rows as on local disk. Without
//! the emulator (`STRATA_TEST_AZURE_BLOB_URL` unset) the target fails, saying how to start it.

mod golden_runner;

fn main() -> std::process::ExitCode {
    golden_runner::main(golden_runner::Mode::Azure)
}
