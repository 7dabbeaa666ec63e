//! Prompts into token ids, with the model's own Hugging Face tokenizer
//! (`tokenizer.json`), so they split into the same blocks the engine
//! caches.
//!
//! The router tokenizes the prompt text it extracted (message contents
//! joined by newlines, or the completion prompt), adding the tokenizer's
//! special tokens as a completion request does, through each tokenizer's
//! prefix cache (`token_cache`), so a conversation's later turns tokenize
//! only their new text. Chat templates are not
//! applied yet: against a real engine serving chat, the first block then
//! differs from the engine's (its template's role markers) and such
//! requests match nothing — they are routed as unmatched prompts, which is
//! the fallback, never a wrong claim.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::token_cache::Segmenter;
use crate::config::defaults::KV_TOKEN_CACHE_BYTES;

/// The tokenizers by model name; `None` is the one for every other model.
#[derive(Default, Clone)]
pub struct Tokenizers {
    by_model: HashMap<Option<String>, Arc<Segmenter>>,
}

impl std::fmt::Debug for Tokenizers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizers")
            .field("models", &self.by_model.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Tokenizers {
    /// Loads each `(model, path)`; the error names the file and why.
    pub fn load(entries: &[(Option<String>, PathBuf)]) -> Result<Self, String> {
        let mut by_model = HashMap::new();
        for (model, path) in entries {
            let tokenizer = Tokenizer::from_file(path)
                .map_err(|e| format!("--kv-tokenizer {}: {e}", path.display()))?;
            let segmenter = Segmenter::new(Arc::new(tokenizer), KV_TOKEN_CACHE_BYTES);
            if !segmenter.caches() {
                tracing::info!(
                    path = %path.display(),
                    "this tokenizer does not split exactly at word boundaries: prompts are \
                     tokenized whole, without the prefix cache"
                );
            }
            by_model.insert(model.clone(), Arc::new(segmenter));
        }
        Ok(Self { by_model })
    }

    /// Whether no tokenizer is configured.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty()
    }

    /// The token ids of `text` for `model` (its own tokenizer, else the
    /// default one), or `None` without a tokenizer or when encoding fails.
    pub fn encode(&self, model: Option<&str>, text: &str) -> Option<Vec<u32>> {
        let tokenizer = model
            .and_then(|m| self.by_model.get(&Some(m.to_string())))
            .or_else(|| self.by_model.get(&None))?;
        tokenizer.encode(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json")
    }

    #[test]
    fn a_model_uses_its_tokenizer_or_the_default() {
        let tokenizers = Tokenizers::load(&[(None, fixture())]).unwrap();
        let ids = tokenizers.encode(Some("any"), "hello world").unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tokenizers.encode(None, "hello world"), Some(ids));
        let only_a = Tokenizers::load(&[(Some("a".into()), fixture())]).unwrap();
        assert!(only_a.encode(Some("a"), "x").is_some());
        assert!(only_a.encode(Some("b"), "x").is_none());
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let err =
            Tokenizers::load(&[(None, PathBuf::from("/nonexistent/tokenizer.json"))]).unwrap_err();
        assert!(
            err.contains("--kv-tokenizer /nonexistent/tokenizer.json"),
            "{err}"
        );
    }
}
