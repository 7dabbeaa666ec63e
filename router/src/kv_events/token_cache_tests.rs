use std::path::PathBuf;

use super::*;

fn fixture() -> Arc<Tokenizer> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json");
    Arc::new(Tokenizer::from_file(path).unwrap())
}

fn whole(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer
        .encode_fast(text, true)
        .unwrap()
        .get_ids()
        .to_vec()
}

/// Deterministic pseudo-prose with digits, punctuation and newlines.
fn prose(seed: u64, bytes: usize) -> String {
    let words = [
        "the", "router", "engine", "cache", "block", "Token", "x", "42", "3.14", "(a)", "b,",
        "naïve", "日本", "\n", "  ", "end.", "it's", "foo_bar",
    ];
    let mut state = seed;
    let mut out = String::new();
    while out.len() < bytes {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push_str(words[(state >> 33) as usize % words.len()]);
        out.push(' ');
    }
    out
}

#[test]
fn splits_are_spaces_between_letters_a_segment_apart() {
    let text = prose(1, 10 * SEGMENT_BYTES);
    let cuts = splits(&text);
    assert!(cuts.len() >= 5, "{}", cuts.len());
    let b = text.as_bytes();
    let mut last = 0;
    for &s in &cuts {
        assert_eq!(b[s], b' ');
        assert!(b[s - 1].is_ascii_alphabetic() && b[s + 1].is_ascii_alphabetic());
        assert!(s >= last + SEGMENT_BYTES);
        last = s;
    }
    assert!(splits("short text").is_empty());
    // Text with no safe split is one segment however long.
    assert!(splits(&"1 ".repeat(4 * SEGMENT_BYTES)).is_empty());
}

#[test]
fn segmented_ids_are_the_whole_texts_ids_for_the_fixture() {
    let tokenizer = fixture();
    assert!(Segmenter::check(&tokenizer));
    let seg = Segmenter::new(tokenizer.clone(), 1 << 20);
    assert!(seg.caches());
    for seed in 0..40 {
        let text = prose(seed, 3 * SEGMENT_BYTES + (seed as usize * 97));
        assert_eq!(
            seg.encode(&text),
            Some(whole(&tokenizer, &text)),
            "seed {seed}"
        );
    }
}

#[test]
fn a_later_turn_reuses_the_cached_prefix_and_gets_the_same_ids() {
    let tokenizer = fixture();
    let seg = Segmenter::new(tokenizer.clone(), 1 << 20);
    let history = prose(7, 6 * SEGMENT_BYTES);
    assert_eq!(seg.encode(&history), Some(whole(&tokenizer, &history)));
    let hits_before = seg.cache.lock().unwrap().current.len();
    assert!(hits_before >= 5);
    // The next turn: the history and new text; and a branch that shares
    // only the first part.
    for next in [
        format!("{history}and then the next question"),
        format!("{}something else entirely", &history[..3 * SEGMENT_BYTES]),
    ] {
        assert_eq!(seg.encode(&next), Some(whole(&tokenizer, &next)));
    }
    // An exact repeat is served from the cache.
    assert_eq!(seg.encode(&history), Some(whole(&tokenizer, &history)));
}

#[test]
fn the_budget_bounds_what_is_kept() {
    let tokenizer = fixture();
    let budget = 64 * 1024;
    let seg = Segmenter::new(tokenizer.clone(), budget);
    for seed in 0..50 {
        let text = prose(100 + seed, 4 * SEGMENT_BYTES);
        assert_eq!(seg.encode(&text), Some(whole(&tokenizer, &text)));
        let cache = seg.cache.lock().unwrap();
        assert!(cache.current_bytes <= budget / 2, "{}", cache.current_bytes);
    }
    // Too big to keep: tokenized, not cached.
    let huge = prose(9, budget);
    assert_eq!(seg.encode(&huge), Some(whole(&tokenizer, &huge)));
}

#[test]
fn no_budget_or_an_inexact_tokenizer_tokenizes_whole() {
    let tokenizer = fixture();
    let off = Segmenter::new(tokenizer.clone(), 0);
    assert!(!off.caches());
    let text = prose(3, 3 * SEGMENT_BYTES);
    assert_eq!(off.encode(&text), Some(whole(&tokenizer, &text)));
    assert!(off.cache.lock().unwrap().current.is_empty());
    // A tokenizer whose post-processor appends a token to every encoding
    // (BERT-style `[SEP]`) is not segment-exact, and the check says so.
    let mut appending = (*tokenizer).clone();
    let sep = ("<|endoftext|>".to_string(), 0);
    let template = tokenizers::processors::template::TemplateProcessing::builder()
        .try_single("$A <|endoftext|>")
        .unwrap()
        .special_tokens(vec![sep])
        .build()
        .unwrap();
    appending.with_post_processor(Some(template));
    assert!(!Segmenter::check(&appending));
}
