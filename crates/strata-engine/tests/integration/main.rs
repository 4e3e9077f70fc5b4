//! The engine's integration tests on real Delta tables in temp dirs, one module per topic.
//!
//! They share one test binary (one link of DataFusion and delta-rs instead of one per file),
//! which keeps a cold build's disk use and link time down. The golden scenarios
//! (`golden.rs`) and the property tests (`property.rs`) stay binaries of their own: the
//! scenarios set a process-wide environment variable, and both are run on their own often.
//!
//! `cargo test -p strata-engine --test integration snapshot_digest` runs one module.

mod common;

mod bulk;
mod compression;
mod deletion_vectors;
mod event_log;
mod file_arrival;
mod half_created;
mod history;
mod key_constraints;
mod large_batch;
mod log_retention;
mod materialized_views;
mod parquet_input;
mod reuse_files;
mod snapshot_digest;
mod stream_joins;
mod taken_cache;
mod tombstones;
