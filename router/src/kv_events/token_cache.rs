//! Token ids of recent prompts' prefixes, so that a conversation's next
//! turn (which resends every earlier one) tokenizes only its new text.
//!
//! A prompt is cut into segments of about [`SEGMENT_BYTES`] at *safe
//! splits*: a space between two ASCII letters ("…word word…"). Byte-level
//! BPE tokenizers of the GPT-2 / Llama-3 / Qwen family pre-split text with
//! a regex that always starts a new piece at " word" after a letter, and
//! merge only inside pieces, so tokenizing the segments one by one (special
//! tokens only on the first) gives exactly the ids of tokenizing the whole.
//! That is checked, not assumed: [`Segmenter::check`] compares the two on
//! a fixed set of texts when a tokenizer loads, and a tokenizer that
//! fails it is always tokenized whole (no cache).
//!
//! The cache maps the hash of the text up to each split to the ids up to
//! it (one shared array per prompt); a lookup takes the longest cached
//! prefix and tokenizes the segments after it. Two generations bound the
//! memory: when the current one holds half of the budget it becomes the
//! previous one and the old previous is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokenizers::Tokenizer;

/// Bytes of text after which a prompt is split at the next safe split.
pub const SEGMENT_BYTES: usize = 256;

/// The byte offsets where `text` is cut into segments, ascending, each a
/// space with an ASCII letter on both sides, at least [`SEGMENT_BYTES`]
/// after the previous cut (the text's end is not listed).
pub fn splits(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / SEGMENT_BYTES);
    let mut from = SEGMENT_BYTES;
    while from + 1 < bytes.len() {
        let Some(found) = memchr::memchr_iter(b' ', &bytes[from..])
            .map(|i| from + i)
            .find(|&s| {
                s + 1 < bytes.len()
                    && bytes[s - 1].is_ascii_alphabetic()
                    && bytes[s + 1].is_ascii_alphabetic()
            })
        else {
            break;
        };
        out.push(found);
        from = found + SEGMENT_BYTES;
    }
    out
}

/// A streaming 64-bit hash of text, one word at a time (the cache's keys;
/// collisions are as rare as in the block chain).
fn hash_bytes(h: u64, bytes: &[u8]) -> u64 {
    let mut z = super::chain::fold_bytes(h, bytes) ^ (bytes.len() as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The ids up to one split of some prompt: a prefix of a shared array.
#[derive(Clone)]
struct Checkpoint {
    ids: Arc<[u32]>,
    len: usize,
}

/// Two generations of checkpoints and the bytes the current one holds.
#[derive(Default)]
struct Generations {
    current: HashMap<u64, Checkpoint>,
    previous: HashMap<u64, Checkpoint>,
    current_bytes: usize,
}

/// Bytes one checkpoint entry costs beside the ids (key, value, table).
const ENTRY_BYTES: usize = 48;

/// One tokenizer with its prefix cache (or without, if the segmented
/// tokenization is not exact for it).
pub struct Segmenter {
    tokenizer: Arc<Tokenizer>,
    exact: bool,
    budget_bytes: usize,
    cache: Mutex<Generations>,
}

impl std::fmt::Debug for Segmenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segmenter")
            .field("exact", &self.exact)
            .field("budget_bytes", &self.budget_bytes)
            .finish()
    }
}

impl Segmenter {
    /// Wraps `tokenizer` with a cache of `budget_bytes` (0: none), after
    /// checking that segmented tokenization is exact for it.
    pub fn new(tokenizer: Arc<Tokenizer>, budget_bytes: usize) -> Self {
        let exact = budget_bytes > 0 && Self::check(&tokenizer);
        Self {
            tokenizer,
            exact,
            budget_bytes,
            cache: Mutex::new(Generations::default()),
        }
    }

    /// The tokenizer it wraps.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether prompts are tokenized by segments through the cache.
    pub fn caches(&self) -> bool {
        self.exact
    }

    /// Whether tokenizing by segments gives the whole text's ids on a
    /// fixed set of texts: prose, code, digits, punctuation runs, spacing,
    /// newlines and non-ASCII scripts.
    pub fn check(tokenizer: &Tokenizer) -> bool {
        check_texts().iter().all(|text| {
            let whole = tokenizer
                .encode_fast(text.as_str(), true)
                .map(|e| e.get_ids().to_vec());
            match (
                whole,
                encode_segments(tokenizer, text, &splits(text), 0, Vec::new()),
            ) {
                (Ok(whole), Some(parts)) => whole == parts,
                _ => false,
            }
        })
    }

    /// The token ids of `text` (special tokens added as a completion
    /// request's are), reusing the longest cached prefix; `None` if the
    /// tokenizer fails.
    pub fn encode(&self, text: &str) -> Option<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// [`Segmenter::encode`], adding the tokenizer's special tokens only
    /// when `special` (a rendered chat template writes its own).
    pub fn encode_with(&self, text: &str, special: bool) -> Option<Vec<u32>> {
        self.encode_while(text, special, |_| true)
            .map(|prefix| prefix.ids)
    }

    /// The token ids of a prefix of `text`, segment by segment: after each
    /// segment (and after the cached prefix) `more` sees the ids so far
    /// and says whether to go on. A router needs a prompt's tokens only as
    /// deep as some engine may cache them, and tokenizing is most of a
    /// selection's cost, so the caller stops at the first block no engine
    /// holds. A tokenizer that is not exact by segments tokenizes the whole
    /// text. `None` if the tokenizer fails.
    pub fn encode_while(
        &self,
        text: &str,
        special: bool,
        mut more: impl FnMut(&[u32]) -> bool,
    ) -> Option<TokenPrefix> {
        if !self.exact {
            let ids = self
                .tokenizer
                .encode_fast(text, special)
                .ok()?
                .get_ids()
                .to_vec();
            more(&ids);
            return Some(TokenPrefix::whole(ids, text));
        }
        let cuts = splits(text);
        // keys[k]: the text before cut k (the last key is the whole text).
        let mut keys = Vec::with_capacity(cuts.len() + 1);
        let mut start = 0;
        // "TOKCACHE", apart for texts tokenized without special tokens.
        let mut h = 0x544f_4b43_4143_4845 ^ u64::from(!special);
        for &end in cuts.iter().chain(std::iter::once(&text.len())) {
            h = hash_bytes(h, &text.as_bytes()[start..end]);
            keys.push(h);
            start = end;
        }
        let hit = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            keys.iter().enumerate().rev().find_map(|(k, key)| {
                cache
                    .current
                    .get(key)
                    .or_else(|| cache.previous.get(key))
                    .map(|c| (k, c.clone()))
            })
        };
        let (done, ids) = match hit {
            Some((k, c)) if k + 1 == keys.len() => {
                let ids = c.ids.get(..c.len)?.to_vec();
                more(&ids);
                return Some(TokenPrefix::whole(ids, text));
            }
            Some((k, c)) => (k + 1, c.ids.get(..c.len)?.to_vec()),
            None => (0, Vec::with_capacity(text.len() / 3)),
        };
        // The id count after each segment; the reused prefix's last one is
        // known (kept so a hot prefix survives the generations), the ones
        // before it are not needed.
        let mut ends = vec![0; done];
        if let Some(last) = ends.last_mut() {
            *last = ids.len();
        }
        let ids = if done > 0 && !more(&ids) {
            // Stopped at the cached prefix: keep it in the current
            // generation, so a hot prefix outlives the rotation.
            self.remember(&keys, &ends, done - 1, &ids);
            ids
        } else {
            let segments = Segments {
                text,
                cuts: &cuts,
                special,
            };
            let ids = encode_segments_recording(
                &self.tokenizer,
                segments,
                done,
                ids,
                &mut ends,
                &mut more,
            )?;
            self.remember(&keys, &ends, done.saturating_sub(1), &ids);
            ids
        };
        // Segments covered: `ends` has one entry per segment read.
        let covered = match ends.len() {
            0 => 0,
            n if n >= keys.len() => text.len(),
            n => cuts[n - 1],
        };
        Some(TokenPrefix {
            ids,
            bytes: covered,
            text_bytes: text.len(),
        })
    }

    /// Records the checkpoints of segments `from..` of a prompt.
    fn remember(&self, keys: &[u64], ends: &[usize], from: usize, ids: &[u32]) {
        let shared: Arc<[u32]> = Arc::from(ids);
        let cost = ids.len() * 4 + keys.len() * ENTRY_BYTES;
        if cost > self.budget_bytes / 2 {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.current_bytes + cost > self.budget_bytes / 2 {
            cache.previous = std::mem::take(&mut cache.current);
            cache.current_bytes = 0;
        }
        cache.current_bytes += cost;
        for (&key, &len) in keys.iter().zip(ends).skip(from) {
            let ids = shared.clone();
            cache.current.insert(key, Checkpoint { ids, len });
        }
    }
}

/// The token ids of a prefix of a text (all of it, unless the caller
/// stopped early), and how much of the text they cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPrefix {
    /// The ids of the text's first `bytes` bytes.
    pub ids: Vec<u32>,
    /// Bytes of the text tokenized (a segment boundary, or its length).
    pub bytes: usize,
    /// The text's length in bytes.
    pub text_bytes: usize,
}

impl TokenPrefix {
    fn whole(ids: Vec<u32>, text: &str) -> Self {
        Self {
            ids,
            bytes: text.len(),
            text_bytes: text.len(),
        }
    }

    /// Whether the whole text was tokenized.
    pub fn is_whole(&self) -> bool {
        self.bytes >= self.text_bytes
    }

    /// The whole text's length in tokens: exact when it was all
    /// tokenized, else extrapolated from the tokens per byte of the part
    /// that was.
    pub fn estimated_tokens(&self) -> usize {
        if self.is_whole() || self.bytes == 0 {
            return self.ids.len();
        }
        (self.ids.len() as u128 * self.text_bytes as u128 / self.bytes as u128) as usize
    }
}

/// A text cut into segments, and whether its first segment gets the
/// tokenizer's special tokens.
#[derive(Clone, Copy)]
struct Segments<'a> {
    text: &'a str,
    cuts: &'a [usize],
    special: bool,
}

/// Tokenizes segments `from..` of `text` (cut at `cuts`) onto `ids`,
/// special tokens only on segment 0; `None` if the tokenizer fails.
fn encode_segments(
    tokenizer: &Tokenizer,
    text: &str,
    cuts: &[usize],
    from: usize,
    ids: Vec<u32>,
) -> Option<Vec<u32>> {
    let segments = Segments {
        text,
        cuts,
        special: true,
    };
    encode_segments_recording(tokenizer, segments, from, ids, &mut Vec::new(), &mut |_| {
        true
    })
}

/// [`encode_segments`], pushing onto `ends` the id count after each
/// segment it tokenizes.
fn encode_segments_recording(
    tokenizer: &Tokenizer,
    Segments {
        text,
        cuts,
        special,
    }: Segments<'_>,
    from: usize,
    mut ids: Vec<u32>,
    ends: &mut Vec<usize>,
    more: &mut dyn FnMut(&[u32]) -> bool,
) -> Option<Vec<u32>> {
    let starts = std::iter::once(0).chain(cuts.iter().copied());
    let stops = cuts.iter().copied().chain(std::iter::once(text.len()));
    for (k, (start, stop)) in starts.zip(stops).enumerate().skip(from) {
        let segment = text.get(start..stop)?;
        let encoding = tokenizer.encode_fast(segment, special && k == 0).ok()?;
        ids.extend_from_slice(encoding.get_ids());
        ends.push(ids.len());
        if !more(&ids) {
            break;
        }
    }
    Some(ids)
}

/// The texts [`Segmenter::check`] compares on: long enough to be cut
/// several times, and varied in what sits around the cuts.
fn check_texts() -> Vec<String> {
    let pieces = [
        "the quick brown fox jumps over the lazy dog",
        "fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); }",
        "Prices rose 12.5% to $1,024.00 in Q3 2025 (up from 987)",
        "well...   spaced    out\ttabs\tand  double  spaces",
        "line one\nline two\r\nline three\n\n  indented line",
        "Ünïcödé naïve café — 日本語のテキスト 中文 emoji 🙂 done",
        "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\nhi",
        "CamelCaseWords and snake_case_words and kebab-case-words",
        "'s 't 're 've 'm 'll 'd quotes \"double\" and 'single'",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    ];
    (0..pieces.len())
        .map(|rotate| {
            let mut text = String::new();
            let mut i = rotate;
            while text.len() < 20 * SEGMENT_BYTES {
                text.push_str(pieces[i % pieces.len()]);
                text.push(if i % 3 == 0 { '\n' } else { ' ' });
                i += rotate + 1;
            }
            text
        })
        .collect()
}

#[cfg(test)]
#[path = "token_cache_tests.rs"]
mod tests;
