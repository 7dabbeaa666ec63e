//! The multipart `model` field reader on arbitrary bodies and boundaries:
//! it must never panic, and a value it returns is a short slice of the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::request::{multipart_boundary, multipart_field};

fuzz_target!(|data: &[u8]| {
    // First line: the content type; the rest: the body.
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let (head, body) = data.split_at(split);
    let content_type = String::from_utf8_lossy(head);
    let boundary = multipart_boundary(&content_type).unwrap_or("b");
    if let Some(value) = multipart_field(body, boundary, "model") {
        assert!(value.len() <= 1024);
        let start = value.as_ptr() as usize;
        let base = body.as_ptr() as usize;
        assert!(start >= base && start + value.len() <= base + body.len());
    }
});
