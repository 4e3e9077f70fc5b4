//! Warehouses on Azure Blob Storage / ADLS, on the real binary against the emulator that
//! `scripts/services/with-services.sh` starts (Azurite, `STRATA_TEST_AZURE_*`), reached as
//! object_store's emulator (`AZURE_STORAGE_USE_EMULATOR`, the account devstoreaccount1 and its
//! well-known key): the drills of `s3.rs` (`common/object_store.rs`), with `az://` and
//! `abfss://` warehouse URLs. Each test works under its own prefix of the container.
mod common;

use common::object_store::{self as store, Azure};

/// Azurite honours create-only puts (`If-None-Match: *`), which strata's commits rely on.
#[test]
fn the_emulator_refuses_a_second_create_of_one_key() {
    store::server_refuses_a_second_create_of_one_key(&Azure::from_env(false));
}

#[test]
fn an_az_warehouse_runs_like_a_local_one() {
    store::a_warehouse_runs_like_a_local_one(&Azure::from_env(false));
}

#[test]
fn runs_started_together_on_abfss_take_each_file_once() {
    store::runs_started_together_take_each_file_once(&Azure::from_env(true));
}

#[test]
fn event_store_small_files_compact_on_azure() {
    store::event_store_small_files_compact_on_the_store(&Azure::from_env(true));
}
