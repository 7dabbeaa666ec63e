//! The chat template a mock engine renders chat requests with before it
//! tokenizes them (`--chat-template`), as vLLM and SGLang do: Jinja over
//! `messages` with the generation prompt added, then tokenized without
//! the tokenizer's special tokens (the template writes them). The router
//! renders its own copy; this one is written apart from it so a test
//! compares two renderings, not one.

use std::path::Path;

/// A compiled template (its Jinja source file).
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// Reads and compiles the Jinja file at `path`; the error names it.
    pub fn load(path: &Path) -> Result<Self, String> {
        let named = |e: String| format!("--chat-template {}: {e}", path.display());
        let source = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_template_owned("chat", source)
            .map_err(|e| named(e.to_string()))?;
        Ok(Self { env })
    }

    /// The prompt text for `(role, content)` messages.
    pub fn render(&self, messages: &[(String, String)]) -> Result<String, String> {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, content)| minijinja::context! { role => role, content => content })
            .collect();
        self.env
            .get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    add_generation_prompt => true,
                })
            })
            .map_err(|e| format!("the chat template failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_template_renders_chatml() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/chat_template.jinja");
        let template = ChatTemplate::load(&path).unwrap();
        let text = template.render(&[("user".into(), "hi".into())]).unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let err = ChatTemplate::load(Path::new("/nonexistent.jinja")).unwrap_err();
        assert!(err.contains("--chat-template /nonexistent.jinja"), "{err}");
    }
}
