//! vLLM Prometheus `/metrics` text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::engines::vllm::parse_metrics;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_metrics(text);
    }
});
