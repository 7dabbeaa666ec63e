use super::*;

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// `body` with `stream_options` set as `ask_for_usage` should, the rest
/// of the keys equal to the original's.
fn assert_asks(body: &str, options: Value) -> Bytes {
    let out = ask_for_usage(body.as_bytes()).expect("should ask for usage");
    let mut got = json(&out);
    let mut want = json(body.as_bytes());
    assert_eq!(
        got["stream_options"],
        options,
        "{}",
        String::from_utf8_lossy(&out)
    );
    got.as_object_mut().unwrap().remove("stream_options");
    want.as_object_mut().unwrap().remove("stream_options");
    assert_eq!(got, want);
    out
}

#[test]
fn not_streaming_is_left_alone() {
    assert_eq!(ask_for_usage(br#"{"model":"m","prompt":"hi"}"#), None);
    assert_eq!(ask_for_usage(br#"{"model":"m","stream":false}"#), None);
    assert_eq!(ask_for_usage(br#"{"model":"m","stream":"true"}"#), None);
    assert_eq!(ask_for_usage(br#"{"model":"m","stream":null}"#), None);
}

#[test]
fn stream_without_options_gets_them_appended() {
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let out = assert_asks(body, serde_json::json!({"include_usage": true}));
    assert_eq!(
        &out[..],
        br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}"#
    );
}

#[test]
fn insertion_goes_after_whitespace_before_the_closing_brace() {
    let body = "\n { \"stream\" : true ,\n  \"model\": \"m\" \r\n\t}\n ";
    let out = assert_asks(body, serde_json::json!({"include_usage": true}));
    assert_eq!(
        &out[..],
        "\n { \"stream\" : true ,\n  \"model\": \"m\" \r\n\t,\"stream_options\":{\"include_usage\":true}}\n ".as_bytes()
    );
}

#[test]
fn existing_options_are_merged() {
    assert_asks(
        r#"{"stream":true,"stream_options":{"continuous_usage_stats":true},"model":"m"}"#,
        serde_json::json!({"continuous_usage_stats": true, "include_usage": true}),
    );
    let out = assert_asks(
        r#"{"stream":true,"stream_options":{ },"model":"m"}"#,
        serde_json::json!({"include_usage": true}),
    );
    assert_eq!(
        &out[..],
        br#"{"stream":true,"stream_options":{ "include_usage":true},"model":"m"}"#
    );
}

#[test]
fn include_usage_false_or_null_becomes_true() {
    let out = assert_asks(
        r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}"#,
        serde_json::json!({"include_usage": true, "continuous_usage_stats": true}),
    );
    assert_eq!(
        &out[..],
        br#"{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#
    );
    assert_asks(
        r#"{"stream":true,"stream_options":{"include_usage":null}}"#,
        serde_json::json!({"include_usage": true}),
    );
    // `null` options are no options.
    let out = assert_asks(
        r#"{"stream":true,"stream_options":null,"n":1}"#,
        serde_json::json!({"include_usage": true}),
    );
    assert_eq!(
        &out[..],
        br#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#
    );
}

#[test]
fn already_asked_is_left_alone() {
    assert_eq!(
        ask_for_usage(br#"{"stream":true,"stream_options":{"include_usage":true}}"#),
        None
    );
    assert_eq!(
        ask_for_usage(br#"{"stream_options":{"include_usage" : true},"stream":true}"#),
        None
    );
}

#[test]
fn nested_or_quoted_stream_options_do_not_count() {
    // In a message's text, in a nested object, and as a string value.
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"\"stream_options\":{\"include_usage\":true}"},{"role":"user","content":[{"stream_options":{"include_usage":true}}]}],"user":"stream_options","metadata":{"stream_options":null}}"#;
    let out = assert_asks(body, serde_json::json!({"include_usage": true}));
    assert!(out.ends_with(br#"null},"stream_options":{"include_usage":true}}"#));
    // A nested `stream` is not the request's.
    assert_eq!(
        ask_for_usage(br#"{"messages":[{"stream":true}],"x":{"stream":true}}"#),
        None
    );
    assert_eq!(
        ask_for_usage(br#"{"stream_options":"stream\":true"}"#),
        None
    );
}

#[test]
fn escaped_and_duplicate_keys_read_as_engines_read_them() {
    assert_eq!(
        ask_for_usage(br#"{"stream":true,"stream\u005foptions":{"include_usage":true}}"#),
        None
    );
    assert!(ask_for_usage(br#"{"str\u0065am":true}"#).is_some());
    // The last of duplicate keys wins.
    assert!(ask_for_usage(br#"{"stream":false,"stream":true}"#).is_some());
    assert_eq!(ask_for_usage(br#"{"stream":true,"stream":false}"#), None);
    assert_eq!(
        ask_for_usage(
            br#"{"stream":true,"stream_options":{},"stream_options":{"include_usage":true}}"#
        ),
        None
    );
}

#[test]
fn what_is_not_a_streaming_object_is_left_alone() {
    for body in [
        &b"[1,2]"[..],
        b"\"stream\"",
        b"true",
        b"",
        b"{",
        b"{\"stream\":true",
        b"{\"stream\":true}}",
        b"{\"stream\":true,}",
        b"{\"stream\":tru}",
        b"\xff{\"stream\":true}",
        br#"{"stream":true,"stream_options":"yes"}"#,
        br#"{"stream":true,"stream_options":[{"include_usage":true}]}"#,
        br#"{"stream":true,"stream_options":{"include_usage":"no"}}"#,
        br#"{"stream":true,"stream_options":{"include_usage":1}}"#,
    ] {
        assert_eq!(
            ask_for_usage(body),
            None,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    // Deep nesting is no stack overflow (nor quadratic).
    let deep = format!(
        r#"{{"stream":true,"x":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let out = ask_for_usage(deep.as_bytes()).unwrap();
    assert!(out.ends_with(br#"]],"stream_options":{"include_usage":true}}"#));
}

#[test]
fn unicode_and_escapes_survive_byte_for_byte() {
    let body = "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"h\\\"é\\\\\\\" 日本 🦀 \\u00e9 \\n}\"}]}";
    let out = assert_asks(body, serde_json::json!({"include_usage": true}));
    let close = body.len() - 1;
    let mut want = body.as_bytes()[..close].to_vec();
    want.extend_from_slice(br#","stream_options":{"include_usage":true}}"#);
    assert_eq!(&out[..], &want[..]);
}

const ROLE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n";

fn token(text: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"
    )
}

const USAGE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":12,\"completion_tokens\":7}}\n\n";

const DONE: &str = "data: [DONE]\n\n";

/// A vLLM answer to a stream with `include_usage`, and what the client
/// should get of it.
fn vllm_stream() -> (String, String) {
    let tokens = [
        token("Hel", "null"),
        token("lo", "null"),
        token("!", "\"stop\""),
    ]
    .concat();
    (
        [ROLE, &tokens, USAGE, DONE].concat(),
        [ROLE, &tokens, DONE].concat(),
    )
}

/// Everything a filter forwards for `pieces`, `finish` included.
fn run<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut filter = UsageChunkFilter::new();
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&filter.push(Bytes::copy_from_slice(piece)));
    }
    out.extend_from_slice(&filter.finish());
    out
}

#[test]
fn a_vllm_stream_loses_exactly_the_usage_chunk() {
    let (stream, want) = vllm_stream();
    let mut filter = UsageChunkFilter::new();
    let out = filter.push(Bytes::from(stream.clone()));
    assert_eq!(String::from_utf8_lossy(&out), want);
    assert!(filter.finish().is_empty());
    // And the usage tail still finds the usage in what the engine said.
    let reported = super::super::usage::reported(stream.as_bytes()).unwrap();
    assert_eq!(reported.output_tokens, Some(7));
}

#[test]
fn every_split_gives_the_same_output() {
    let (stream, want) = vllm_stream();
    let bytes = stream.as_bytes();
    for at in 0..=bytes.len() {
        let out = run([&bytes[..at], &bytes[at..]]);
        assert_eq!(String::from_utf8_lossy(&out), want, "split at {at}");
    }
    let out = run(bytes.chunks(1));
    assert_eq!(String::from_utf8_lossy(&out), want, "1-byte pieces");
    for size in [2, 3, 7, 64] {
        let out = run(bytes.chunks(size));
        assert_eq!(String::from_utf8_lossy(&out), want, "{size}-byte pieces");
    }
}

#[test]
fn complete_events_are_forwarded_at_once_and_uncopied() {
    let mut filter = UsageChunkFilter::new();
    let piece = Bytes::from([ROLE, &token("a", "null")].concat());
    let out = filter.push(piece.clone());
    assert_eq!(out, piece);
    assert_eq!(out.as_ptr(), piece.as_ptr());
    // A partial event is held; the rest of the piece goes now, uncopied.
    let piece = Bytes::from(format!("{}data: {{\"id\"", token("b", "null")));
    let out = filter.push(piece.clone());
    assert_eq!(out, token("b", "null").as_bytes());
    assert_eq!(out.as_ptr(), piece.as_ptr());
    // The event goes out with the push that completes it.
    let out = filter.push(Bytes::from_static(b":1}\n"));
    assert!(out.is_empty());
    let out = filter.push(Bytes::from_static(b"\n"));
    assert_eq!(&out[..], b"data: {\"id\":1}\n\n");
    assert!(filter.finish().is_empty());
}

#[test]
fn crlf_events_are_filtered_too() {
    let (stream, want) = vllm_stream();
    let (stream, want) = (stream.replace('\n', "\r\n"), want.replace('\n', "\r\n"));
    let bytes = stream.as_bytes();
    for at in 0..=bytes.len() {
        let out = run([&bytes[..at], &bytes[at..]]);
        assert_eq!(String::from_utf8_lossy(&out), want, "split at {at}");
    }
    assert_eq!(String::from_utf8_lossy(&run(bytes.chunks(1))), want);
}

#[test]
fn ordinary_and_odd_events_are_kept() {
    let kept = [
        // `"usage": null` with choices, and a usage object with choices
        // (continuous usage stats).
        token("x", "null"),
        "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1}}\n\n".to_owned(),
        // Empty choices but no usage, or a usage that is not an object.
        "data: {\"choices\":[],\"usage\":null}\n\n".to_owned(),
        "data: {\"choices\":[],\"usage\":7}\n\n".to_owned(),
        "data: {\"choices\":[]}\n\n".to_owned(),
        // Comments, malformed and non-object payloads, other fields.
        ": keep-alive \"usage\" \"choices\"\n\n".to_owned(),
        "data: {\"choices\":[],\"usage\":{\n\n".to_owned(),
        "data: [{\"choices\":[],\"usage\":{}}]\n\n".to_owned(),
        "event: ping\n\n".to_owned(),
        "\n".to_owned(),
        DONE.to_owned(),
    ]
    .concat();
    let bytes = kept.as_bytes();
    assert_eq!(String::from_utf8_lossy(&run([bytes])), kept);
    assert_eq!(String::from_utf8_lossy(&run(bytes.chunks(5))), kept);
    // The same with a usage chunk in the middle: only it goes.
    let at = token("x", "null").len();
    let with_usage = format!("{}{USAGE}{}", &kept[..at], &kept[at..]);
    assert_eq!(String::from_utf8_lossy(&run([with_usage.as_bytes()])), kept);
}

#[test]
fn usage_chunk_forms() {
    assert!(is_usage_only_chunk(USAGE.as_bytes()));
    assert!(is_usage_only_chunk(USAGE.trim_end().as_bytes()));
    assert!(is_usage_only_chunk(
        b"data:{\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\n"
    ));
    // Split over several data lines, with a comment and an id.
    assert!(is_usage_only_chunk(
        b": c\r\nid: 3\r\ndata: {\"choices\": [],\r\ndata: \"usage\": {}}\r\n\r\n"
    ));
    assert!(!is_usage_only_chunk(DONE.as_bytes()));
    assert!(!is_usage_only_chunk(token("x", "null").as_bytes()));
    assert!(!is_usage_only_chunk(b"{\"choices\":[],\"usage\":{}}\n\n"));
    assert!(!is_usage_only_chunk(b""));
    // Spaced as Python's json.dumps spaces it.
    assert!(is_usage_only_chunk(
        b"data: {\"choices\" : [ ], \"usage\": {\"prompt_tokens\": 1}}\n\n"
    ));
}

#[test]
fn token_chunks_fail_the_look_before_parsing() {
    let chunk = token("x", "null");
    assert!(!key_followed_by(chunk.as_bytes(), b"\"choices\"", b"[]"));
    assert!(!key_followed_by(chunk.as_bytes(), b"\"usage\"", b"{"));
    assert!(key_followed_by(USAGE.as_bytes(), b"\"choices\"", b"[]"));
    assert!(key_followed_by(USAGE.as_bytes(), b"\"usage\"", b"{"));
    assert!(key_followed_by(b"{\"a\":1,\"b\" :\n[\t]}", b"\"b\"", b"[]"));
    assert!(!key_followed_by(b"{\"b\"", b"\"b\"", b"[]"));
}

/// A usage-only chunk of exactly `len` bytes.
fn padded_usage(len: usize) -> String {
    let frame = "data: {\"choices\":[],\"usage\":{\"pad\":\"\"}}\n\n".len();
    let big = format!(
        "data: {{\"choices\":[],\"usage\":{{\"pad\":\"{}\"}}}}\n\n",
        "x".repeat(len - frame)
    );
    assert_eq!(big.len(), len);
    assert!(is_usage_only_chunk(big.as_bytes()));
    big
}

#[test]
fn an_event_over_the_bound_passes_through_intact() {
    let text = "y".repeat(3 * MAX_HELD);
    let big_token = token(&text, "null");
    let big_usage = padded_usage(MAX_HELD + 1);
    let stream = [ROLE, &big_token, &big_usage, USAGE, &big_token, DONE].concat();
    let want = [ROLE, &big_token, &big_usage, &big_token, DONE].concat();
    let bytes = stream.as_bytes();
    for size in [1000, 4096, MAX_HELD - 1, MAX_HELD + 1, bytes.len()] {
        let mut filter = UsageChunkFilter::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(size) {
            out.extend_from_slice(&filter.push(Bytes::copy_from_slice(piece)));
            assert!(filter.held.len() <= MAX_HELD, "held {}", filter.held.len());
        }
        out.extend_from_slice(&filter.finish());
        assert_eq!(out.len(), want.len(), "{size}-byte pieces");
        assert!(out == want.as_bytes(), "{size}-byte pieces: altered");
    }
    // A piece over the bound, its event unfinished, goes at once.
    let mut filter = UsageChunkFilter::new();
    let cut = ROLE.len() + MAX_HELD + 1;
    assert_eq!(
        filter.push(Bytes::copy_from_slice(&bytes[..cut - 1])).len(),
        ROLE.len()
    );
    assert_eq!(filter.held.len(), MAX_HELD);
    let out = filter.push(Bytes::copy_from_slice(&bytes[cut - 1..cut]));
    assert_eq!(out.len(), MAX_HELD + 1);
    assert!(filter.held.is_empty());
    let mut out = out.to_vec();
    out.extend_from_slice(&filter.push(Bytes::copy_from_slice(&bytes[cut..])));
    assert!(out == want.as_bytes()[ROLE.len()..]);
}

#[test]
fn a_usage_chunk_within_the_bound_is_dropped_however_split() {
    let usage = padded_usage(MAX_HELD);
    let stream = [ROLE, &usage, DONE].concat();
    let want = [ROLE, DONE].concat();
    for size in [1, 1000, MAX_HELD - 1, MAX_HELD + 1, stream.len()] {
        let out = run(stream.as_bytes().chunks(size));
        assert!(out == want.as_bytes(), "{size}-byte pieces");
    }
}

#[test]
fn finish_returns_what_is_held() {
    let mut filter = UsageChunkFilter::new();
    let out = filter.push(Bytes::from(format!("{ROLE}{}", USAGE.trim_end())));
    assert_eq!(String::from_utf8_lossy(&out), ROLE);
    assert_eq!(String::from_utf8_lossy(&filter.finish()), USAGE.trim_end());
    assert!(filter.finish().is_empty());
    assert!(filter.push(Bytes::new()).is_empty());
}
