//! The cargo-fuzz target `yaml_spec`: see fuzz/checks/yaml_spec.rs.
#![no_main]

#[path = "../checks/yaml_spec.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check(data);
});
