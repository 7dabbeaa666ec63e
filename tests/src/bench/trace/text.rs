//! Prompt text for trace requests, which carry block ids but no text.
//!
//! Block id `k` always becomes the same chunk of lowercase words, derived
//! from `k` alone, and a prompt is its blocks' chunks in `hash_ids` order,
//! cut to the prompt's length. So two requests whose ids share a prefix
//! share that much text, and the engines' prefix caches and the router's
//! prefix policies see exactly the reuse the trace recorded; a partial
//! last block is a prefix of the same block's full chunk, so a later turn
//! that fills the block still matches it.

use crate::workload::text;

/// Mixes a block id into the seed of its chunk (so ids 0, 1, 2 do not
/// start from neighbouring generator states).
const BLOCK_SALT: u64 = 0x6d6f_6f6e_6361_6b65;

/// One step of SplitMix64: a small, fast, well-mixed generator whose output
/// is fixed by its seed on every platform (rand's StdRng may change
/// between versions; the block text must not).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `chars` characters of lowercase words (2 to 9 letters, one space
/// between), the same for the same `id` and different for different ids.
pub fn block_text(id: u64, chars: usize) -> String {
    let mut state = id ^ BLOCK_SALT;
    let mut out = String::with_capacity(chars);
    let mut word_left = 0u64;
    while out.len() < chars {
        let r = splitmix(&mut state);
        if word_left == 0 {
            if !out.is_empty() {
                out.push(' ');
                if out.len() == chars {
                    break;
                }
            }
            word_left = 2 + r % 8;
        }
        out.push(char::from(b'a' + ((r >> 32) % 26) as u8));
        word_left -= 1;
    }
    out
}

/// How long a block's text is: the trace's block size after length
/// scaling, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockText {
    /// Characters of one full block.
    pub block_chars: usize,
}

impl BlockText {
    /// The prompt of a request with block ids `ids`, `chars` characters
    /// long: the blocks' chunks in order, the last one cut. If rounding
    /// made `chars` longer than all the blocks, the rest is text unique to
    /// `tail_seed` (it was never shared).
    pub fn prompt(&self, ids: &[u64], chars: usize, tail_seed: u64) -> String {
        let mut out = String::with_capacity(chars);
        for &id in ids {
            let left = chars - out.len();
            if left == 0 {
                break;
            }
            out.push_str(&block_text(id, self.block_chars.min(left)));
        }
        if out.len() < chars {
            out.push_str(&text(tail_seed, chars - out.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn block_text_is_words_of_the_asked_length_and_fixed_by_its_id() {
        for chars in [1, 2, 26, 104, 2048] {
            let t = block_text(7, chars);
            assert_eq!(t.len(), chars);
            assert!(t.chars().all(|c| c == ' ' || c.is_ascii_lowercase()));
            assert_eq!(t, block_text(7, chars));
        }
        let t = block_text(7, 2048);
        assert!(!t.starts_with(' ') && !t.contains("  "));
        let words = t.split(' ').count();
        assert!((200..700).contains(&words), "{words} words");
        // A shorter chunk of the same id is a prefix of the longer one.
        assert!(t.starts_with(&block_text(7, 100)));
    }

    #[test]
    fn different_ids_give_different_text() {
        let texts: HashSet<String> = (0..2_000).map(|id| block_text(id, 26)).collect();
        assert_eq!(texts.len(), 2_000);
        assert_ne!(block_text(0, 64), block_text(u64::MAX, 64));
    }

    #[test]
    fn equal_id_prefixes_give_equal_text_prefixes() {
        let b = BlockText { block_chars: 104 };
        let a = b.prompt(&[0, 1, 2, 3], 400, 1);
        let c = b.prompt(&[0, 1, 2, 9, 10], 500, 2);
        assert_eq!(a.len(), 400);
        assert_eq!(c.len(), 500);
        let common = a.bytes().zip(c.bytes()).take_while(|(x, y)| x == y).count();
        // Three shared blocks, and the fourth differs from its first chars
        // (a chance match of a letter or two is allowed).
        assert!((3 * 104..3 * 104 + 3).contains(&common), "{common}");
        // Different first ids share (almost) nothing.
        let d = b.prompt(&[5, 1, 2, 3], 400, 1);
        let common = a.bytes().zip(d.bytes()).take_while(|(x, y)| x == y).count();
        assert!(common < 3, "{common}");
    }

    #[test]
    fn the_partial_last_block_is_cut_and_a_later_turn_extends_it() {
        let b = BlockText { block_chars: 100 };
        let turn1 = b.prompt(&[4, 5], 130, 1);
        assert_eq!(turn1.len(), 130);
        assert_eq!(&turn1[100..], &block_text(5, 30));
        // The next turn fills block 5 and adds block 6: turn 1 is a prefix.
        let turn2 = b.prompt(&[4, 5, 6], 250, 2);
        assert!(turn2.starts_with(&turn1));
    }

    #[test]
    fn lengths_follow_the_block_size_and_rounding_overflow_is_unique_tail() {
        for block_chars in [4, 26, 104, 2048] {
            let b = BlockText { block_chars };
            let p = b.prompt(&[1, 2, 3], 3 * block_chars - 1, 0);
            assert_eq!(p.len(), 3 * block_chars - 1);
            assert_eq!(&p[..block_chars], block_text(1, block_chars));
        }
        let b = BlockText { block_chars: 10 };
        let p = b.prompt(&[1, 2], 25, 77);
        assert_eq!(p.len(), 25);
        assert_eq!(&p[20..], text(77, 5));
    }
}
