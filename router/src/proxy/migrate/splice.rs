//! Makes a continuation's events read as the rest of the first stream.
//!
//! Each event of the continuation gets the first stream's `id`,
//! `created` and `model`; its role delta is dropped (the client already
//! has one), and so is any event left with nothing to say; its usage is
//! restated for the whole request: completion tokens summed over the
//! legs, prompt tokens the original prompt's (the continuation's prompt
//! counted the replayed text too); the prompt's token ids it names
//! (`return_token_ids`) are nulled, the client has the original's.
//! `[DONE]` and anything that is not a
//! JSON chunk pass as they are. Only migrated streams pay for this parse.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::Value;

use super::transcript::{data_of, events};

/// Rewrites one continuation's events.
#[derive(Debug)]
pub struct Splicer {
    /// The first stream's `id`, `created` and `model`.
    identity: [(&'static str, Option<Value>); 3],
    /// Output tokens the client had before this continuation.
    tokens_before: u64,
}

impl Splicer {
    /// A splicer for a continuation of the stream whose first event was
    /// `first`, after `tokens_before` output tokens.
    pub fn new(first: &Value, tokens_before: u64) -> Self {
        let field = |key: &'static str| (key, first.get(key).cloned());
        Self {
            identity: [field("id"), field("created"), field("model")],
            tokens_before,
        }
    }

    /// The client's form of the whole events in `events_bytes`.
    pub fn rewrite(&self, events_bytes: &Bytes) -> Bytes {
        let mut out = BytesMut::with_capacity(events_bytes.len());
        for event in events(events_bytes) {
            match data_of(event).map(serde_json::from_slice::<Value>) {
                Some(Ok(Value::Object(chunk))) => {
                    if let Some(chunk) = self.chunk(Value::Object(chunk)) {
                        out.put_slice(b"data: ");
                        // A Value always serializes.
                        let _ = serde_json::to_writer((&mut out).writer(), &chunk);
                        out.put_slice(b"\n\n");
                    }
                }
                _ => out.put_slice(event),
            }
        }
        out.freeze()
    }

    /// One chunk in the client's form, or `None` when nothing is left of it.
    fn chunk(&self, mut chunk: Value) -> Option<Value> {
        for (key, value) in &self.identity {
            if let (Some(value), Some(slot)) = (value, chunk.get_mut(*key)) {
                *slot = value.clone();
            }
        }
        // The client has the prompt's ids from the first leg; a
        // continuation's would name its longer prompt (`return_token_ids`).
        if let Some(ids) = chunk.get_mut("prompt_token_ids") {
            *ids = Value::Null;
        }
        let mut says_something = false;
        if let Some(choices) = chunk.get_mut("choices").and_then(Value::as_array_mut) {
            for choice in choices.iter_mut() {
                if let Some(ids) = choice.get_mut("prompt_token_ids") {
                    *ids = Value::Null;
                }
                says_something |= choice
                    .get("token_ids")
                    .and_then(Value::as_array)
                    .is_some_and(|ids| !ids.is_empty());
                if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                    delta.remove("role");
                    let empty = |v: &Value| v.is_null() || v.as_str() == Some("");
                    says_something |= delta.values().any(|v| !empty(v));
                }
                says_something |= choice.get("text").is_some_and(|t| t.as_str() != Some(""));
                says_something |= choice.get("finish_reason").is_some_and(|f| !f.is_null());
            }
        }
        if let Some(usage) = chunk.get_mut("usage").filter(|u| u.is_object()) {
            says_something = true;
            self.restate(usage);
        }
        let has_choices = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        (says_something || !has_choices).then_some(chunk)
    }

    /// Restates a continuation's usage for the whole request.
    fn restate(&self, usage: &mut Value) {
        let get = |usage: &Value, key| usage.get(key).and_then(Value::as_u64);
        let completion = get(usage, "completion_tokens").map(|c| c + self.tokens_before);
        let prompt = get(usage, "prompt_tokens").map(|p| p.saturating_sub(self.tokens_before));
        if let Some(c) = completion {
            usage["completion_tokens"] = Value::from(c);
        }
        if let Some(p) = prompt {
            usage["prompt_tokens"] = Value::from(p);
        }
        if let (Some(p), Some(c)) = (prompt, completion) {
            usage["total_tokens"] = Value::from(p + c);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stream(chunks: &[Value]) -> Bytes {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        Bytes::from(s)
    }

    fn datas(b: &Bytes) -> Vec<String> {
        events(b)
            .filter_map(data_of)
            .map(|d| String::from_utf8_lossy(d).into_owned())
            .collect()
    }

    #[test]
    fn the_continuation_takes_the_first_identity_and_drops_its_role_chunk() {
        let first = json!({"id": "chatcmpl-A", "created": 1, "model": "m"});
        let splicer = Splicer::new(&first, 4);
        let head = |delta: Value, finish: Value| {
            json!({"id": "chatcmpl-B", "created": 9, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let input = stream(&[
            head(json!({"role": "assistant", "content": ""}), Value::Null),
            head(json!({"content": " world"}), Value::Null),
            head(json!({}), json!("length")),
            json!({"id": "chatcmpl-B", "created": 9, "model": "m", "choices": [],
                "usage": {"prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20}}),
        ]);
        let out = splicer.rewrite(&input);
        let datas = datas(&out);
        assert_eq!(datas.len(), 4, "{datas:?}");
        let chunks: Vec<Value> = datas[..3]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(
            chunks
                .iter()
                .all(|c| c["id"] == "chatcmpl-A" && c["created"] == 1)
        );
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"content": " world"})
        );
        assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
        assert_eq!(
            chunks[2]["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20})
        );
        assert_eq!(datas[3], "[DONE]");
    }

    #[test]
    fn a_continuations_prompt_ids_are_nulled_and_an_ids_only_chunk_kept() {
        let splicer = Splicer::new(&json!({"id": "cmpl-A"}), 1);
        let input = Bytes::from_static(
            b"data: {\"id\":\"cmpl-B\",\"choices\":[{\"index\":0,\"text\":\"\",\"prompt_token_ids\":[1,2,9],\"token_ids\":[7]}]}\n\n",
        );
        let chunk: Value = serde_json::from_str(&datas(&splicer.rewrite(&input))[0]).unwrap();
        let choice = &chunk["choices"][0];
        assert_eq!(
            (&choice["prompt_token_ids"], &choice["token_ids"]),
            (&Value::Null, &json!([7]))
        );
    }

    #[test]
    fn completion_text_and_comments_pass() {
        let splicer = Splicer::new(&json!({"id": "cmpl-A"}), 1);
        let input = Bytes::from_static(
            b": ping\n\ndata: {\"id\":\"cmpl-B\",\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":null}]}\n\n",
        );
        let out = splicer.rewrite(&input);
        assert!(out.starts_with(b": ping\n\n"));
        let data = datas(&out);
        let chunk: Value = serde_json::from_str(&data[0]).unwrap();
        assert_eq!(
            (chunk["id"].as_str(), chunk["choices"][0]["text"].as_str()),
            (Some("cmpl-A"), Some("x"))
        );
    }
}
