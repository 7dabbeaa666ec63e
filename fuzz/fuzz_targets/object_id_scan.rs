//! The stored-object id scanner on arbitrary answer bodies: it must never
//! panic, it reads at most its limit, what it returns is a valid id, and
//! where the body is split into frames does not change what it finds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::objects::{IdScanner, SCAN_LIMIT, is_valid_id};

fuzz_target!(|data: &[u8]| {
    let whole = IdScanner::default().feed(data);
    if let Some(id) = &whole {
        assert!(is_valid_id(id), "{id:?}");
    }
    // The first byte picks a frame size for the split run.
    let piece = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut scanner = IdScanner::default();
    let mut split = None;
    for chunk in data.chunks(piece) {
        if let Some(id) = scanner.feed(chunk) {
            split = Some(id);
            break;
        }
    }
    assert_eq!(whole, split);
    if data.len() >= SCAN_LIMIT {
        assert!(scanner.is_done());
    }
});
