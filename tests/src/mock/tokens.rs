//! How a prompt is cut into prefix-cache blocks: 64-character blocks of the
//! prompt text (the default), or, given `--tokenizer`, blocks of
//! `--kv-block-size` token ids from a Hugging Face `tokenizer.json`, the way
//! vLLM and SGLang page their KV cache, so the mock can publish real
//! KV-cache events.
//!
//! Token block `i` is identified by the mock's own engine hash, chained over
//! blocks `0..=i` (a block matches only when its whole prefix does).

use std::path::Path;
use std::sync::Arc;

use super::chat_template::ChatTemplate;
use super::prefix_cache::block_hashes;
use super::requests::ParsedRequest;

/// A prompt's prefix-cache blocks and what the cache needs to account for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptBlocks {
    /// Chained hashes of the full blocks, in order.
    pub hashes: Vec<u64>,
    /// The prompt's token ids (token blocks only; empty for text blocks).
    pub token_ids: Vec<u32>,
}

/// Cuts prompts into blocks: by characters or by tokens.
#[derive(Clone)]
pub enum Blocker {
    /// Blocks of this many prompt characters.
    Chars(usize),
    /// Blocks of `block_size` token ids of `tokenizer`'s encoding.
    Tokens {
        /// The loaded `tokenizer.json`.
        tokenizer: Arc<tokenizers::Tokenizer>,
        /// Tokens per block.
        block_size: usize,
        /// The template chat requests are rendered with, if any.
        chat_template: Option<Arc<ChatTemplate>>,
    },
}

impl std::fmt::Debug for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::Chars(n) => write!(f, "Chars({n})"),
            Blocker::Tokens { block_size, .. } => write!(f, "Tokens({block_size})"),
        }
    }
}

/// Loads a Hugging Face `tokenizer.json`; the error names the flag and path.
pub fn load_tokenizer(path: &Path) -> Result<Arc<tokenizers::Tokenizer>, String> {
    tokenizers::Tokenizer::from_file(path)
        .map(Arc::new)
        .map_err(|e| format!("--tokenizer {}: {e}", path.display()))
}

impl Blocker {
    /// Cuts `text` into blocks; fails only if the tokenizer fails.
    pub fn blocks(&self, text: &str) -> Result<PromptBlocks, String> {
        match self {
            Blocker::Chars(n) => Ok(PromptBlocks {
                hashes: block_hashes(text, *n),
                token_ids: Vec::new(),
            }),
            Blocker::Tokens {
                tokenizer,
                block_size,
                ..
            } => token_blocks(tokenizer, *block_size, text, true),
        }
    }

    /// Cuts a request's prompt into blocks: a chat request through the
    /// chat template when there is one (then without added special
    /// tokens), anything else as [`Blocker::blocks`] of its text.
    pub fn request_blocks(&self, request: &ParsedRequest) -> Result<PromptBlocks, String> {
        match self {
            Blocker::Tokens {
                tokenizer,
                block_size,
                chat_template: Some(template),
            } if !request.messages.is_empty() => {
                let text = template.render(&request.messages)?;
                token_blocks(tokenizer, *block_size, &text, false)
            }
            _ => self.blocks(&request.prompt_text),
        }
    }

    /// Prompt tokens the cached `blocks` of a prompt stand for in the
    /// timing model's `prompt_tokens` (the chars/4 rule). Text blocks hold
    /// a quarter of their characters; token blocks hold the same fraction
    /// of `prompt_tokens` as of the tokenized prompt. At least one prompt
    /// token is always left to prefill.
    pub fn cached_tokens(&self, blocks: usize, prompt: &PromptBlocks, prompt_tokens: u64) -> u64 {
        let cached = match self {
            Blocker::Chars(n) => (blocks * n) as u64 / 4,
            Blocker::Tokens { block_size, .. } => {
                let total = prompt.token_ids.len() as u128;
                let part = ((blocks * block_size) as u128).min(total);
                (u128::from(prompt_tokens) * part)
                    .checked_div(total)
                    .map_or(0, |c| c as u64)
            }
        };
        cached.min(prompt_tokens.saturating_sub(1))
    }

    /// Prompt tokens one cached block stands for (the `/stats` gauge of
    /// cached tokens and the cache's capacity in blocks).
    pub fn block_tokens(&self) -> u64 {
        match self {
            Blocker::Chars(n) => (*n as u64 / 4).max(1),
            Blocker::Tokens { block_size, .. } => (*block_size as u64).max(1),
        }
    }

    /// Tokens per block when blocks are token blocks.
    pub fn token_block_size(&self) -> Option<usize> {
        match self {
            Blocker::Chars(_) => None,
            Blocker::Tokens { block_size, .. } => Some(*block_size),
        }
    }
}

/// The token blocks of `text`, special tokens added when `special`.
fn token_blocks(
    tokenizer: &tokenizers::Tokenizer,
    block_size: usize,
    text: &str,
    special: bool,
) -> Result<PromptBlocks, String> {
    let enc = tokenizer
        .encode(text, special)
        .map_err(|e| format!("cannot tokenize the prompt: {e}"))?;
    let token_ids = enc.get_ids().to_vec();
    Ok(PromptBlocks {
        hashes: token_block_hashes(&token_ids, block_size),
        token_ids,
    })
}

/// The seed standing in for a missing parent block ("MOCKENG1").
const ROOT: u64 = 0x4d4f_434b_454e_4731;

/// The mock engine's hash of a block of `tokens` after a block hashed to
/// `parent`: FNV-1a over the parent and the tokens (little-endian), then
/// the splitmix64 finalizer. Not the router's hash, on purpose: engines'
/// hashes are opaque to it.
pub fn token_block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = parent
        .to_le_bytes()
        .into_iter()
        .chain(tokens.iter().flat_map(|t| t.to_le_bytes()));
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Chained engine hashes of the full `block_size`-token blocks of `tokens`.
pub fn token_block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = ROOT;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|chunk| {
            parent = token_block_hash(parent, chunk);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Blocker {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/tokenizer.json");
        Blocker::Tokens {
            tokenizer: load_tokenizer(&path).unwrap(),
            block_size: 4,
            chat_template: None,
        }
    }

    #[test]
    fn token_chains_match_only_shared_prefixes() {
        let a = token_block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        let b = token_block_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3, "the partial block has no hash");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        assert_eq!(token_block_hash(a[0], &[3, 4]), a[1]);
        assert_ne!(
            token_block_hash(ROOT, &[1, 2]),
            token_block_hash(ROOT, &[2, 1])
        );
    }

    #[test]
    fn the_fixture_tokenizer_cuts_prompts_into_token_blocks() {
        let blocker = fixture();
        let p = blocker.blocks("abcdefghijklmnopqrstuvwxyz").unwrap();
        assert!(p.token_ids.len() >= 10, "{:?}", p.token_ids);
        assert_eq!(p.hashes.len(), p.token_ids.len() / 4);
        assert_eq!(p.hashes, token_block_hashes(&p.token_ids, 4));
        let err = load_tokenizer(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(err.contains("--tokenizer"), "{err}");
    }

    #[test]
    fn cached_fraction_of_tokens_applies_to_the_prompt_count() {
        let blocker = fixture();
        let p = PromptBlocks {
            hashes: vec![1, 2],
            token_ids: (0..10).collect(),
        };
        // 2 blocks of 4 = 8 of 10 tokens; 80% of 50 prompt tokens.
        assert_eq!(blocker.cached_tokens(2, &p, 50), 40);
        assert_eq!(blocker.cached_tokens(0, &p, 50), 0);
        assert_eq!(
            blocker.cached_tokens(2, &p, 5),
            4,
            "one token left to prefill"
        );
        assert_eq!(Blocker::Chars(64).cached_tokens(2, &p, 100), 32);
    }
}
