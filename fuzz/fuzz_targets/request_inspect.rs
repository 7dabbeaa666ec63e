//! The request-body inspector (token estimate) on arbitrary bodies, with
//! and without keeping the prompt text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::request::inspect;

/// Bytes of prompt text kept (prefix_affinity's default key length).
const LIMIT: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let with_text = inspect(data, Some(LIMIT));
    let without = inspect(data, None);
    match (with_text, without) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.prompt_tokens, b.prompt_tokens);
            assert_eq!(a.max_output_tokens, b.max_output_tokens);
            assert!(b.text.is_none());
            // At most the limit, plus what ends the last character.
            assert!(a.text.is_some_and(|t| t.len() <= LIMIT + 3));
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("keeping text changed the verdict: {a:?} vs {b:?}"),
    }
});
