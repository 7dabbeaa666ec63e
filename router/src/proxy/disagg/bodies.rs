//! The request bodies of a disaggregated request, per protocol.
//!
//! - SGLang: the request as the client sent it, plus `bootstrap_host`,
//!   `bootstrap_port` and `bootstrap_room` (arrays of one entry per
//!   sequence for a batch: `n` > 1 or a list of prompts), sent to both
//!   workers (sgl-model-gateway's `inject_bootstrap_into_value`).
//! - vLLM prefill: `kv_transfer_params` asking for a remote decode,
//!   `max_tokens` (and `max_completion_tokens`) 1, not streamed, without
//!   `stream_options` and `min_tokens` (vLLM's own disaggregation proxy
//!   sends exactly this).
//! - vLLM decode: the request as the client sent it, plus the
//!   `kv_transfer_params` the prefill worker answered with.

use bytes::Bytes;
use serde_json::{Map, Value, json};

/// A body that is not a JSON object: nothing to add fields to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAnObject;

fn object(body: &[u8]) -> Result<Map<String, Value>, NotAnObject> {
    serde_json::from_slice(body).map_err(|_| NotAnObject)
}

fn bytes(request: &Map<String, Value>) -> Bytes {
    // A map of JSON values always serializes.
    Bytes::from(serde_json::to_vec(request).unwrap_or_default())
}

/// Sequences one request runs: `n` for chat, or the number of prompts of
/// a completions list of strings (`None`: one, sent as scalars).
fn batch_size(request: &Map<String, Value>) -> Option<usize> {
    if let Some(n) = request.get("n").and_then(Value::as_u64).filter(|n| *n > 1) {
        return usize::try_from(n).ok();
    }
    match request.get("prompt").or_else(|| request.get("text")) {
        Some(Value::Array(list)) if list.iter().all(Value::is_string) && list.len() > 1 => {
            Some(list.len())
        }
        _ => None,
    }
}

/// SGLang's body: `body` with the prefill worker's bootstrap address and
/// a room per sequence (`rooms` draws them).
pub fn sglang(
    body: &[u8],
    host: &str,
    port: u16,
    mut rooms: impl FnMut() -> u64,
) -> Result<Bytes, NotAnObject> {
    let mut request = object(body)?;
    match batch_size(&request) {
        Some(n) => {
            request.insert("bootstrap_host".into(), json!(vec![host; n]));
            request.insert("bootstrap_port".into(), json!(vec![port; n]));
            let rooms: Vec<u64> = (0..n).map(|_| rooms()).collect();
            request.insert("bootstrap_room".into(), json!(rooms));
        }
        None => {
            request.insert("bootstrap_host".into(), json!(host));
            request.insert("bootstrap_port".into(), json!(port));
            request.insert("bootstrap_room".into(), json!(rooms()));
        }
    }
    Ok(bytes(&request))
}

/// A bootstrap room: a random 63-bit number, as SGLang's router draws it
/// (Python's `random.randint(0, 2**63 - 1)`).
pub fn room() -> u64 {
    rand::random::<u64>() & (i64::MAX as u64)
}

/// vLLM's prefill body for `body`.
pub fn vllm_prefill(body: &[u8]) -> Result<Bytes, NotAnObject> {
    let mut request = object(body)?;
    request.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null,
            "remote_host": null, "remote_port": null}),
    );
    request.insert("stream".into(), Value::Bool(false));
    request.insert("max_tokens".into(), json!(1));
    if request.contains_key("max_completion_tokens") {
        request.insert("max_completion_tokens".into(), json!(1));
    }
    request.remove("stream_options");
    request.remove("min_tokens");
    Ok(bytes(&request))
}

/// The `kv_transfer_params` of a vLLM prefill answer, if it has them.
pub fn vllm_transfer_params(answer: &[u8]) -> Option<Value> {
    let answer: Map<String, Value> = serde_json::from_slice(answer).ok()?;
    answer
        .get("kv_transfer_params")
        .filter(|p| p.is_object())
        .cloned()
}

/// vLLM's decode body: `body` with the prefill's `params`.
pub fn vllm_decode(body: &[u8], params: Value) -> Result<Bytes, NotAnObject> {
    let mut request = object(body)?;
    request.insert("kv_transfer_params".into(), params);
    Ok(bytes(&request))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn sglang_adds_scalars_for_one_sequence_and_arrays_for_a_batch() {
        let mut next = 7;
        let mut rooms = || {
            next += 1;
            next
        };
        let one = sglang(
            br#"{"messages":[],"stream":true}"#,
            "10.0.0.1",
            8998,
            &mut rooms,
        )
        .unwrap();
        let v = parsed(&one);
        assert_eq!(
            (
                &v["bootstrap_host"],
                &v["bootstrap_port"],
                &v["bootstrap_room"],
                &v["stream"]
            ),
            (&json!("10.0.0.1"), &json!(8998), &json!(8), &json!(true))
        );
        let batch = sglang(br#"{"prompt":["a","b","c"]}"#, "h", 1, &mut rooms).unwrap();
        let v = parsed(&batch);
        assert_eq!(v["bootstrap_host"], json!(["h", "h", "h"]));
        assert_eq!(v["bootstrap_room"], json!([9, 10, 11]));
        let n = sglang(br#"{"messages":[],"n":2}"#, "h", 1, &mut rooms).unwrap();
        assert_eq!(parsed(&n)["bootstrap_port"], json!([1, 1]));
        assert_eq!(sglang(b"[1]", "h", 1, &mut rooms), Err(NotAnObject));
        assert!(room() <= i64::MAX as u64);
    }

    #[test]
    fn vllm_prefill_asks_for_one_token_and_a_remote_decode() {
        let body = br#"{"messages":[],"stream":true,"max_tokens":300,"max_completion_tokens":300,"min_tokens":5,"stream_options":{"include_usage":true}}"#;
        let v = parsed(&vllm_prefill(body).unwrap());
        assert_eq!(v["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(
            (v["stream"].as_bool(), v["max_tokens"].as_u64()),
            (Some(false), Some(1))
        );
        assert_eq!(v["max_completion_tokens"], 1);
        assert!(v.get("stream_options").is_none() && v.get("min_tokens").is_none());
    }

    #[test]
    fn vllm_decode_carries_the_prefill_params_on_the_original_request() {
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":5}}"#;
        let params = vllm_transfer_params(answer).unwrap();
        let body = br#"{"prompt":"hi","stream":true,"max_tokens":30}"#;
        let v = parsed(&vllm_decode(body, params).unwrap());
        assert_eq!(v["kv_transfer_params"]["remote_request_id"], "r");
        assert_eq!(
            (v["stream"].as_bool(), v["max_tokens"].as_u64()),
            (Some(true), Some(30))
        );
        assert_eq!(vllm_transfer_params(br#"{"id":"x"}"#), None);
    }
}
