//! The cargo-fuzz target `sql_parse_plan`: see fuzz/checks/sql_parse_plan.rs.
#![no_main]

#[path = "../checks/sql_parse_plan.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check(data);
});
