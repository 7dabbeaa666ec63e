//! The request-body inspector (token estimate) on arbitrary bodies, with
//! and without keeping the prompt text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::request::inspect;

fuzz_target!(|data: &[u8]| {
    let with_text = inspect(data, true);
    let without = inspect(data, false);
    match (with_text, without) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.prompt_tokens, b.prompt_tokens);
            assert_eq!(a.max_output_tokens, b.max_output_tokens);
            assert!(b.text.is_none());
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("want_text changed the verdict: {a:?} vs {b:?}"),
    }
});
