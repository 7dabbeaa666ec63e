//! SGLang JSON load endpoints: `/v1/loads?include=core` and `/get_load`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::engines::sglang::{parse_get_load, parse_loads};

fuzz_target!(|data: &[u8]| {
    for load in [parse_loads(data), parse_get_load(data)]
        .into_iter()
        .flatten()
    {
        if let Some(k) = load.token_usage {
            assert!((0.0..=1.0).contains(&k), "KV usage out of range: {k}");
        }
        if let Some(t) = load.gen_throughput {
            assert!(t.is_finite() && t >= 0.0, "bad throughput: {t}");
        }
    }
});
