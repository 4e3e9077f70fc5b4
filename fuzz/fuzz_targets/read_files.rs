//! The cargo-fuzz target `read_files`: see fuzz/checks/read_files.rs.
#![no_main]

#[path = "../checks/read_files.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check(data);
});
