//! llama.cpp server `GET /slots` JSON: the KV-usage estimate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::engines::llamacpp::parse_slots;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(k)) = parse_slots(data) {
        assert!((0.0..=1.0).contains(&k), "KV usage out of range: {k}");
    }
});
