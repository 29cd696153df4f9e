#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| porch_tests::fuzz::names(data));
