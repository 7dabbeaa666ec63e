//! A model's chat template, rendered as the engine renders it, so a chat
//! request tokenizes to the engine's own token ids (role markers and all)
//! and its blocks match the blocks the engine reports caching.
//!
//! vLLM and SGLang render `messages` with the Jinja `chat_template` from
//! the model's `tokenizer_config.json` (`add_generation_prompt` on, the
//! config's `bos_token`/`eos_token` in scope) and tokenize the result
//! without adding special tokens again (the template writes them). Shoal
//! does the same with `minijinja` and its Python-compatibility methods
//! (`.strip()`, `.startswith()`, … which Hugging Face templates call).
//! What a template needs beyond that (tools, images) is not passed: such
//! a request renders without them, its tail then differs from the
//! engine's, and only its matching prefix counts.

use std::path::Path;

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

/// One message as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateMessage<'a> {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: &'a str,
    /// The message's text (its text parts joined by newlines).
    pub content: &'a str,
}

/// A compiled chat template and the special tokens it is given.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// The template's name in the environment.
const NAME: &str = "chat";

impl ChatTemplate {
    /// Reads `path`: a `tokenizer_config.json` (its `chat_template`, a
    /// string or a list of named templates of which `default` is used, and
    /// its `bos_token`/`eos_token`), or any other file as the template's
    /// Jinja source. The error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, String> {
        let named = |e: String| format!("--kv-chat-template {}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
        let is_json = path.extension().is_some_and(|x| x == "json");
        if !is_json {
            return Self::new(text, String::new(), String::new()).map_err(named);
        }
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| named(e.to_string()))?;
        let source = match &config["chat_template"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_string)
                .ok_or_else(|| named("no chat_template named \"default\"".into()))?,
            _ => return Err(named("no chat_template in it".into())),
        };
        Self::new(
            source,
            token(&config["bos_token"]),
            token(&config["eos_token"]),
        )
        .map_err(named)
    }

    /// Compiles `source`; the error says where it does not parse.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| format!("the chat template does not parse: {e}"))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The prompt text the engine would build from `messages`, ending with
    /// the assistant's generation prompt; the error is the template's.
    pub fn render(&self, messages: &[TemplateMessage<'_>]) -> Result<String, String> {
        let template = self.env.get_template(NAME).map_err(|e| e.to_string())?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| e.to_string())
    }
}

/// A special token as `tokenizer_config.json` writes it: a string, or an
/// added-token object with its `content`.
fn token(value: &serde_json::Value) -> String {
    value
        .as_str()
        .or_else(|| value["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ChatML, as Qwen's and many others' `tokenizer_config.json` carry it.
    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn messages() -> Vec<TemplateMessage<'static>> {
        vec![
            TemplateMessage {
                role: "system",
                content: "be brief",
            },
            TemplateMessage {
                role: "user",
                content: " hello ",
            },
        ]
    }

    #[test]
    fn chatml_renders_as_the_engine_renders_it() {
        let template = ChatTemplate::new(CHATML.into(), String::new(), String::new()).unwrap();
        assert_eq!(
            template.render(&messages()).unwrap(),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_tokenizer_config_gives_its_template_and_special_tokens() {
        let dir = std::env::temp_dir().join(format!("shoal-chat-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer_config.json");
        let config = serde_json::json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"},
            ],
        });
        std::fs::write(&path, config.to_string()).unwrap();
        let template = ChatTemplate::load(&path).unwrap();
        assert_eq!(
            template.render(&messages()).unwrap(),
            "<s>[system] be brief</s>[user]  hello </s>"
        );
        std::fs::write(&path, "{\"eos_token\": \"</s>\"}").unwrap();
        let err = ChatTemplate::load(&path).unwrap_err();
        assert!(
            err.contains("no chat_template") && err.contains("tokenizer_config.json"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_template_that_raises_or_does_not_parse_is_an_error() {
        let raising = "{{ raise_exception('Conversation roles must alternate') }}";
        let template = ChatTemplate::new(raising.into(), String::new(), String::new()).unwrap();
        let err = template.render(&messages()).unwrap_err();
        assert!(err.contains("roles must alternate"), "{err}");
        let err = ChatTemplate::new("{% for %}".into(), String::new(), String::new()).unwrap_err();
        assert!(err.contains("does not parse"), "{err}");
        let missing = ChatTemplate::load(Path::new("/nonexistent/chat.jinja")).unwrap_err();
        assert!(
            missing.contains("--kv-chat-template /nonexistent/chat.jinja"),
            "{missing}"
        );
    }
}
