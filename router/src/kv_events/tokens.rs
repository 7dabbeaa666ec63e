//! Prompts into token ids, with the model's own Hugging Face tokenizer
//! (`tokenizer.json`), so they split into the same blocks the engine
//! caches.
//!
//! A completion's prompt is tokenized with the tokenizer's special tokens
//! added, as the engine adds them. A chat request is rendered with the
//! model's chat template (`--kv-chat-template`, `chat_template`) and the
//! result tokenized without them, as vLLM and SGLang do; without a
//! template its message contents are tokenized joined by newlines, which
//! against a real engine matches nothing (the template's role markers
//! start the engine's first block), so such requests are routed as
//! unmatched prompts — the fallback, never a wrong claim. Either way
//! through each tokenizer's prefix cache (`token_cache`), so a
//! conversation's later turns tokenize only their new text.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::chat_template::{ChatTemplate, TemplateMessage};
use super::token_cache::{Segmenter, TokenPrefix};
use crate::config::defaults::KV_TOKEN_CACHE_BYTES;
use crate::request::RequestInfo;

/// The tokenizers and chat templates by model name; `None` is the one for
/// every other model.
#[derive(Default, Clone)]
pub struct Tokenizers {
    by_model: HashMap<Option<String>, Arc<Segmenter>>,
    templates: HashMap<Option<String>, Arc<ChatTemplate>>,
    token_bytes: HashMap<Option<String>, Arc<[u16]>>,
}

impl std::fmt::Debug for Tokenizers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizers")
            .field("models", &self.by_model.keys().collect::<Vec<_>>())
            .field("templates", &self.templates.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `model`'s own entry in `map`, else the one for every model.
fn for_model<'a, T>(map: &'a HashMap<Option<String>, T>, model: Option<&str>) -> Option<&'a T> {
    model
        .and_then(|m| map.get(&Some(m.to_string())))
        .or_else(|| map.get(&None))
}

impl Tokenizers {
    /// Loads each `(model, path)` tokenizer and chat template; the error
    /// names the flag, the file and why.
    pub fn load(
        entries: &[(Option<String>, PathBuf)],
        templates: &[(Option<String>, PathBuf)],
    ) -> Result<Self, String> {
        let mut loaded = HashMap::new();
        for (model, path) in templates {
            loaded.insert(model.clone(), Arc::new(ChatTemplate::load(path)?));
        }
        let (mut by_model, mut token_bytes) = (HashMap::new(), HashMap::new());
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
            token_bytes.insert(model.clone(), byte_lengths(segmenter.tokenizer()));
            by_model.insert(model.clone(), Arc::new(segmenter));
        }
        Ok(Self {
            by_model,
            templates: loaded,
            token_bytes,
        })
    }

    /// Whether no tokenizer is configured.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty()
    }

    /// The token ids of `text` for `model` (its own tokenizer, else the
    /// default one), or `None` without a tokenizer or when encoding fails.
    pub fn encode(&self, model: Option<&str>, text: &str) -> Option<Vec<u32>> {
        for_model(&self.by_model, model)?.encode(text)
    }

    /// Whether a tokenizer serves `model` (else no prompt of it matches,
    /// unless its engine tokenizes it).
    pub fn serves(&self, model: Option<&str>) -> bool {
        for_model(&self.by_model, model).is_some()
    }

    /// The token ids the engine computes for `request`: the engine's own
    /// when it was asked (`RequestInfo::token_ids`), else a chat request
    /// through its model's chat template when one is configured, else its
    /// text as [`Tokenizers::encode`]; `None` without a tokenizer or text,
    /// or when rendering or encoding fails (the request then matches
    /// nothing and is routed as an unseen prompt).
    pub fn encode_request(&self, request: &RequestInfo) -> Option<Vec<u32>> {
        self.encode_request_while(request, |_| true)
            .map(|prefix| prefix.ids)
    }

    /// How many bytes of the tokenized text each token id stands for, for
    /// the tokenizer [`Tokenizers::encode_request_while`] uses on
    /// `request`; `None` when the ids are the engine's own (or no
    /// tokenizer serves it). A cached prefix's share of the prompt is then
    /// its bytes over the text's: a function of the ids alone, not of how
    /// deep this replica happened to tokenize (which its prefix cache
    /// decides), so every replica converts one prefix to one share.
    pub fn token_bytes(&self, request: &RequestInfo) -> Option<&[u16]> {
        if request.token_ids.is_some() {
            return None;
        }
        for_model(&self.token_bytes, request.model.as_deref()).map(|t| &t[..])
    }

    /// [`Tokenizers::encode_request`] as deep as `more` wants (see
    /// [`Segmenter::encode_while`]): the ids of a prefix of the prompt.
    pub fn encode_request_while(
        &self,
        request: &RequestInfo,
        more: impl FnMut(&[u32]) -> bool,
    ) -> Option<TokenPrefix> {
        let text = request.text.as_deref();
        if let Some(ids) = &request.token_ids {
            let bytes = text.map_or(0, str::len);
            return Some(TokenPrefix {
                ids: ids.to_vec(),
                bytes,
                text_bytes: bytes,
            });
        }
        let model = request.model.as_deref();
        let text = text?;
        let tokenizer = for_model(&self.by_model, model)?;
        let Some(template) =
            for_model(&self.templates, model).filter(|_| !request.turns.is_empty())
        else {
            return tokenizer.encode_while(text, true, more);
        };
        let messages: Vec<TemplateMessage<'_>> = request
            .turns
            .iter()
            .map(|turn| TemplateMessage {
                role: turn.role.as_deref().unwrap_or("user"),
                content: text.get(turn.content.clone()).unwrap_or_default(),
            })
            .collect();
        match template.render(&messages) {
            Ok(rendered) => tokenizer.encode_while(&rendered, false, more),
            Err(e) => {
                tracing::debug!(error = %e, "the chat template failed on a request");
                None
            }
        }
    }
}

/// Each token id's length in bytes as its own text (special tokens as
/// written, which is how a rendered chat template carries them). A
/// byte-level piece of a multi-byte character decodes to U+FFFD and is
/// counted as 3 bytes, a small bias shared by every replica.
fn byte_lengths(tokenizer: &tokenizers::Tokenizer) -> Arc<[u16]> {
    (0..tokenizer.get_vocab_size(true) as u32)
        .map(|id| {
            tokenizer
                .decode(&[id], false)
                .map_or(0, |text| u16::try_from(text.len()).unwrap_or(u16::MAX))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json")
    }

    #[test]
    fn a_model_uses_its_tokenizer_or_the_default() {
        let tokenizers = Tokenizers::load(&[(None, fixture())], &[]).unwrap();
        let ids = tokenizers.encode(Some("any"), "hello world").unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tokenizers.encode(None, "hello world"), Some(ids));
        let only_a = Tokenizers::load(&[(Some("a".into()), fixture())], &[]).unwrap();
        assert!(only_a.encode(Some("a"), "x").is_some());
        assert!(only_a.encode(Some("b"), "x").is_none());
    }

    #[test]
    fn a_chat_request_is_tokenized_through_its_template_without_added_special_tokens() {
        let template = fixture().with_file_name("chat_template.jinja");
        let tokenizers = Tokenizers::load(&[(None, fixture())], &[(None, template)]).unwrap();
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":"hello there"}]}"#;
        let request = crate::request::inspect(body, Some(1 << 16)).unwrap();
        let rendered = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello \
                        there<|im_end|>\n<|im_start|>assistant\n";
        let tokenizer = Tokenizer::from_file(fixture()).unwrap();
        let want = tokenizer.encode_fast(rendered, false).unwrap();
        assert_eq!(
            tokenizers.encode_request(&request),
            Some(want.get_ids().to_vec())
        );
        // A completion is its text with the special tokens added.
        let completion = crate::request::inspect(br#"{"prompt":"hello there"}"#, Some(64)).unwrap();
        assert_eq!(
            tokenizers.encode_request(&completion),
            tokenizers.encode(None, "hello there")
        );
        // Without a template, a chat request is its contents as they are.
        let plain = Tokenizers::load(&[(None, fixture())], &[]).unwrap();
        assert_eq!(
            plain.encode_request(&request),
            plain.encode(None, "be brief\nhello there")
        );
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let err = Tokenizers::load(&[(None, PathBuf::from("/nonexistent/tokenizer.json"))], &[])
            .unwrap_err();
        assert!(
            err.contains("--kv-tokenizer /nonexistent/tokenizer.json"),
            "{err}"
        );
    }
}
