//! SGLang Prometheus `/metrics` text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::engines::sglang::parse_metrics;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(load) = parse_metrics(text)
        && let Some(k) = load.token_usage
    {
        assert!((0.0..=1.0).contains(&k), "KV usage out of range: {k}");
    }
});
