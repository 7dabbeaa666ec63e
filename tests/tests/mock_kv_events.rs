//! The mock engine's KV-cache events over real ZMQ sockets on loopback: a
//! real `mock-engine` process with the fixture tokenizer, a SUB socket for
//! the live stream and a DEALER for replay, payloads decoded with `rmpv`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use rmpv::Value;
use serde_json::json;
use shoal_tests::client::HttpClient;
use shoal_tests::mock::{REPLAY_END_SEQ, token_block_hashes};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const WAIT: Duration = Duration::from_secs(10);
const BLOCK: usize = 16;

fn tokenizer_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/tokenizer.json")
}

/// The fixture tokenizer's ids of `text` (what the mock must publish).
fn ids(text: &str) -> Vec<u32> {
    let tok = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    tok.encode(text, true).unwrap().get_ids().to_vec()
}

/// `n` pseudo-random lowercase letters from `seed` (deterministic).
fn letters(seed: u64, n: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// A running `mock-engine` process and the endpoints it printed.
struct Mock {
    _child: Child,
    _lines: Lines<BufReader<ChildStdout>>,
    url: String,
    pub_ep: String,
    replay_ep: String,
    client: HttpClient,
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("mock-engine printed in time")
        .unwrap()
        .expect("mock-engine printed a line")
}

async fn mock(extra: &[&str]) -> Mock {
    let tok = tokenizer_path();
    let mut args = vec![
        "--tokenizer",
        tok.to_str().unwrap(),
        "--kv-events-port",
        "0",
        "--kv-events-replay-port",
        "0",
        "--time-scale",
        "10",
    ];
    args.extend_from_slice(extra);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mock-engine"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = next_line(&mut lines).await;
    let url = listening
        .strip_prefix("mock-engine listening on ")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let kv = next_line(&mut lines).await;
    let field = |k: &str| {
        kv.strip_prefix("mock-engine kv-events ")
            .unwrap()
            .split(' ')
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    assert_eq!(field("engine"), url);
    assert_eq!(field("block-size"), BLOCK.to_string());
    let (pub_ep, replay_ep) = (field("pub"), field("replay"));
    assert!(pub_ep.starts_with("tcp://127.0.0.1:"), "{kv}");
    assert!(replay_ep.starts_with("tcp://127.0.0.1:"), "{kv}");
    assert_ne!(pub_ep, replay_ep);
    Mock {
        _child: child,
        _lines: lines,
        url,
        pub_ep,
        replay_ep,
        client: HttpClient::new(),
    }
}

/// One live message: seq and payload (the topic is checked to be empty).
async fn recv(sub: &mut SubSocket) -> (u64, Bytes) {
    let msg = tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("an event batch in time")
        .unwrap();
    let frames = msg.into_vec();
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    assert!(frames[0].is_empty(), "default topic is empty");
    let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
    (seq, frames[2].clone())
}

impl Mock {
    async fn complete(&self, prompt: &str) {
        let r = self
            .client
            .post_json(
                &format!("{}/v1/completions", self.url),
                &json!({"prompt": prompt, "max_tokens": 2}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }

    async fn reset(&self) {
        let r = self
            .client
            .post_raw(&format!("{}/reset_prefix_cache", self.url), "")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }

    async fn stats(&self) -> serde_json::Value {
        let r = self
            .client
            .get(&format!("{}/stats", self.url))
            .await
            .unwrap();
        r.json().unwrap()
    }

    /// A SUB socket that has provably joined: resets are sent (each one
    /// batch, so its seq is the number of resets before it) until one
    /// arrives live; returns the socket and the last seq published.
    async fn subscribe(&self) -> (SubSocket, u64) {
        let mut sub = SubSocket::new();
        sub.subscribe("").await.unwrap();
        tokio::time::timeout(WAIT, sub.connect(&self.pub_ep))
            .await
            .unwrap()
            .unwrap();
        for sent in 0..50u64 {
            self.reset().await;
            let Ok(msg) = tokio::time::timeout(Duration::from_millis(200), recv(&mut sub)).await
            else {
                continue;
            };
            let (mut seq, payload) = msg;
            assert_eq!(events(&payload), vec![Ev::Cleared]);
            while seq < sent {
                let (next, payload) = recv(&mut sub).await;
                assert_eq!(next, seq + 1, "live seqs grow by one");
                assert_eq!(events(&payload), vec![Ev::Cleared]);
                seq = next;
            }
            assert_eq!(seq, sent, "reset k is batch k: seq starts at 0");
            return (sub, seq);
        }
        panic!("the subscription never took");
    }
}

/// An event decoded from any of the three encodings.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u64,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn hash(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_i64().map(|i| i as u64))
        .unwrap_or_else(|| panic!("hash {v:?}"))
}

fn hash_list(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(hash).collect()
}

fn get<'a>(m: &'a [(Value, Value)], key: &str) -> &'a Value {
    &m.iter().find(|(k, _)| k.as_str() == Some(key)).unwrap().1
}

fn map_keys(v: &Value) -> Vec<&str> {
    v.as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().unwrap())
        .collect()
}

fn decode_event(v: &Value) -> Ev {
    let stored = |h: &Value, p: &Value, t: &Value, b: &Value| Ev::Stored {
        hashes: hash_list(h),
        parent: (!p.is_nil()).then(|| hash(p)),
        tokens: t
            .as_array()
            .unwrap()
            .iter()
            .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
            .collect(),
        block_size: b.as_u64().unwrap(),
    };
    match v {
        Value::Array(a) => match a[0].as_str().unwrap() {
            "BlockStored" => {
                assert_eq!(a.len(), 7, "vLLM 0.10.2 layout: {v:?}");
                assert!(a[5].is_nil());
                assert_eq!(a[6].as_str(), Some("GPU"));
                stored(&a[1], &a[2], &a[3], &a[4])
            }
            "BlockRemoved" => {
                assert_eq!(a.len(), 3);
                assert_eq!(a[2].as_str(), Some("GPU"));
                Ev::Removed(hash_list(&a[1]))
            }
            "AllBlocksCleared" => Ev::Cleared,
            other => panic!("unknown tag {other}"),
        },
        Value::Map(m) => match get(m, "type").as_str().unwrap() {
            "BlockStored" => {
                assert!(get(m, "lora_id").is_nil());
                assert_eq!(get(m, "medium").as_str(), Some("GPU"));
                let p = get(m, "parent_block_hash");
                stored(
                    get(m, "block_hashes"),
                    p,
                    get(m, "token_ids"),
                    get(m, "block_size"),
                )
            }
            "BlockRemoved" => {
                assert_eq!(get(m, "medium").as_str(), Some("GPU"));
                Ev::Removed(hash_list(get(m, "block_hashes")))
            }
            "AllBlocksCleared" => Ev::Cleared,
            other => panic!("unknown tag {other}"),
        },
        other => panic!("event is neither array nor map: {other:?}"),
    }
}

/// The raw event values of a payload, after checking the batch shape.
fn raw_events(payload: &[u8]) -> Vec<Value> {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let batch = v.as_array().expect("the batch is an array");
    assert_eq!(batch.len(), 3, "[ts, events, dp_rank]");
    let ts = batch[0].as_f64().unwrap();
    assert!(ts.is_finite() && ts > 1.6e9, "unix seconds: {ts}");
    assert_eq!(batch[2].as_u64(), Some(0), "dp_rank 0");
    let events = batch[1].as_array().unwrap().clone();
    assert!(!events.is_empty(), "no empty batches");
    events
}

fn events(payload: &[u8]) -> Vec<Ev> {
    raw_events(payload).iter().map(decode_event).collect()
}

/// Full blocks shared by two token sequences.
fn shared_blocks(a: &[u32], b: &[u32]) -> usize {
    a.chunks_exact(BLOCK)
        .zip(b.chunks_exact(BLOCK))
        .take_while(|(x, y)| x == y)
        .count()
}

/// Sends a replay request from `start` and reads to the end marker:
/// the replayed `(seq, payload)` pairs.
async fn replay(dealer: &mut DealerSocket, start: u64) -> Vec<(u64, Bytes)> {
    let req = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(req).unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let msg = tokio::time::timeout(WAIT, dealer.recv())
            .await
            .unwrap()
            .unwrap();
        let f = msg.into_vec();
        assert_eq!(f.len(), 4, "[b\"\", topic, seq, payload] (vLLM >= 0.26)");
        assert!(f[0].is_empty() && f[1].is_empty());
        if f[2][..] == REPLAY_END_SEQ {
            assert!(f[3].is_empty(), "end marker has an empty payload");
            return out;
        }
        out.push((
            u64::from_be_bytes(f[2][..].try_into().unwrap()),
            f[3].clone(),
        ));
    }
    panic!("no end marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_map_stores_token_blocks_extends_chains_clears_and_replays() {
    let m = mock(&[]).await;
    let (mut sub, mut last) = m.subscribe().await;
    let mut live = Vec::new();

    let a = letters(1, 300);
    let ids_a = ids(&a);
    let full_a = ids_a.len() / BLOCK;
    assert!(full_a >= 6, "{} tokens", ids_a.len());
    let hashes_a = token_block_hashes(&ids_a, BLOCK);
    m.complete(&a).await;
    let (seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, last + 1);
    last = seq;
    let raw = raw_events(&payload);
    assert_eq!(
        map_keys(&raw[0]),
        [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name"
        ],
        "vLLM 0.24 field order"
    );
    assert_eq!(
        events(&payload),
        vec![Ev::Stored {
            hashes: hashes_a.clone(),
            parent: None,
            tokens: ids_a[..full_a * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }],
        "the prompt's full blocks, tokens as the tokenizer gives them"
    );
    live.push((seq, payload));

    // Same first 200 letters, then different ones: only new blocks.
    let b = format!("{}{}", &a[..200], letters(2, 150));
    let ids_b = ids(&b);
    let hashes_b = token_block_hashes(&ids_b, BLOCK);
    let shared = shared_blocks(&ids_a, &ids_b);
    assert!(
        shared >= 4 && shared < hashes_b.len(),
        "{shared} shared blocks"
    );
    m.complete(&b).await;
    let (seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, last + 1);
    last = seq;
    assert_eq!(
        events(&payload),
        vec![Ev::Stored {
            hashes: hashes_b[shared..].to_vec(),
            parent: Some(hashes_a[shared - 1]),
            tokens: ids_b[shared * BLOCK..hashes_b.len() * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }],
        "new blocks only, parent = the last shared block"
    );
    live.push((seq, payload));

    // A repeat changes nothing, so the next batch is the reset's.
    m.complete(&a).await;
    m.reset().await;
    let (seq, payload) = recv(&mut sub).await;
    assert_eq!((seq, events(&payload)), (last + 1, vec![Ev::Cleared]));
    assert_eq!(map_keys(&raw_events(&payload)[0]), ["type"]);
    live.push((seq, payload));
    last = seq;

    // Replay: everything from 0 (syncing resets included), then from a seq.
    let mut dealer = DealerSocket::new();
    tokio::time::timeout(WAIT, dealer.connect(&m.replay_ep))
        .await
        .unwrap()
        .unwrap();
    let all = replay(&mut dealer, 0).await;
    let seqs: Vec<u64> = all.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..=last).collect::<Vec<_>>());
    for (seq, payload) in &live {
        assert_eq!(&all[*seq as usize].1, payload, "replay = live bytes");
    }
    let tail = replay(&mut dealer, live[1].0).await;
    assert_eq!(tail, live[1..].to_vec());
    assert!(
        replay(&mut dealer, last + 1).await.is_empty(),
        "only the end marker"
    );

    // A malformed request gets no answer; the next valid one does.
    let bad = vec![Bytes::new(), Bytes::from_static(b"\x01")];
    dealer
        .send(ZmqMessage::try_from(bad).unwrap())
        .await
        .unwrap();
    assert_eq!(replay(&mut dealer, last).await, live[2..].to_vec());
    let stats = m.stats().await;
    assert_eq!(stats["kv_events"]["endpoint"], m.pub_ep.as_str());
    assert_eq!(stats["kv_events"]["format"], "vllm-map");
    let kv = &stats["kv_events_stats"];
    assert_eq!(kv["invalid_replay_requests"], 1);
    assert_eq!(kv["replay_requests"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_array_reports_evictions_one_hash_per_event() {
    // Room for 4 blocks of 16 tokens.
    let m = mock(&[
        "--kv-events-format",
        "vllm-array",
        "--prefix-cache-tokens",
        "64",
    ])
    .await;
    let (mut sub, last) = m.subscribe().await;
    let a = letters(3, 150);
    let ids_a = ids(&a);
    let hashes_a = token_block_hashes(&ids_a, BLOCK);
    assert!(hashes_a.len() > 4);
    m.complete(&a).await;
    let (seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, last + 1);
    assert_eq!(raw_events(&payload)[0].as_array().unwrap().len(), 7);
    assert_eq!(
        events(&payload),
        vec![Ev::Stored {
            hashes: hashes_a[..4].to_vec(),
            parent: None,
            tokens: ids_a[..4 * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }],
        "a chain longer than the cache stores what fits"
    );

    let c = letters(4, 150);
    let ids_c = ids(&c);
    let hashes_c = token_block_hashes(&ids_c, BLOCK);
    assert_eq!(shared_blocks(&ids_a, &ids_c), 0);
    m.complete(&c).await;
    let (seq2, payload) = recv(&mut sub).await;
    assert_eq!(seq2, seq + 1);
    let evs = events(&payload);
    let mut removed: Vec<u64> = evs[..4]
        .iter()
        .map(|e| match e {
            Ev::Removed(h) => {
                assert_eq!(h.len(), 1, "one hash per BlockRemoved");
                h[0]
            }
            other => panic!("expected removals first, got {other:?}"),
        })
        .collect();
    assert_eq!(removed[0], hashes_a[3], "deepest block evicted first");
    removed.sort_unstable();
    let mut expected = hashes_a[..4].to_vec();
    expected.sort_unstable();
    assert_eq!(removed, expected);
    assert_eq!(
        evs[4..],
        [Ev::Stored {
            hashes: hashes_c[..4].to_vec(),
            parent: None,
            tokens: ids_c[..4 * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }]
    );
    m.reset().await;
    let (seq3, payload) = recv(&mut sub).await;
    assert_eq!(seq3, seq2 + 1);
    assert_eq!(
        raw_events(&payload),
        vec![Value::Array(vec!["AllBlocksCleared".into()])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_sends_signed_hashes_without_lora_name() {
    let m = mock(&["--kv-events-format", "sglang"]).await;
    let (mut sub, last) = m.subscribe().await;
    let a = letters(5, 400);
    let ids_a = ids(&a);
    let hashes_a = token_block_hashes(&ids_a, BLOCK);
    assert!(
        hashes_a.iter().any(|&h| h > i64::MAX as u64),
        "the prompt has a hash above 2^63 to exercise the sign"
    );
    m.complete(&a).await;
    let (seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, last + 1);
    let raw = raw_events(&payload);
    assert_eq!(
        map_keys(&raw[0]),
        [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium"
        ],
        "SGLang 0.5.23 fields"
    );
    let Value::Map(fields) = &raw[0] else {
        panic!("map event")
    };
    for (v, &h) in get(fields, "block_hashes")
        .as_array()
        .unwrap()
        .iter()
        .zip(&hashes_a)
    {
        assert_eq!(v.as_i64(), Some(h as i64), "signed i64 on the wire");
    }
    assert_eq!(
        events(&payload),
        vec![Ev::Stored {
            hashes: hashes_a.clone(),
            parent: None,
            tokens: ids_a[..hashes_a.len() * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }]
    );
}

#[tokio::test]
async fn kv_event_flags_are_validated() {
    let exe = env!("CARGO_BIN_EXE_mock-engine");
    let out = std::process::Command::new(exe)
        .args(["--kv-events-port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --tokenizer"));
    let out = std::process::Command::new(exe)
        .args(["--kv-events-format", "msgpack"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv-events-format"));
    let out = std::process::Command::new(exe)
        .args(["--tokenizer", "/nonexistent/tokenizer.json"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tokenizer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_answers_the_ids_the_cache_blocks_hold() {
    let template = tokenizer_path().with_file_name("chat_template.jinja");
    let m = mock(&["--chat-template", template.to_str().unwrap()]).await;
    let url = format!("{}/tokenize", m.url);
    let (mut sub, _) = m.subscribe().await;

    // A completion prompt: the tokenizer's ids, special tokens included.
    let text = letters(3, 300);
    let answer = m
        .client
        .post_json(&url, &json!({"model": "m", "prompt": text}))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.json().unwrap();
    let tokens: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    assert_eq!(tokens, ids(&text));
    assert_eq!(body["count"].as_u64(), Some(tokens.len() as u64));
    assert!(body["max_model_len"].as_u64().unwrap() > 0);

    // A chat request: rendered with the engine's template, so its ids are
    // not its content's; they are exactly what a chat request stores.
    let messages = json!([{"role": "user", "content": letters(4, 300)}]);
    let answer = m
        .client
        .post_json(
            &url,
            &json!({"messages": messages, "add_generation_prompt": true}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let chat_tokens: Vec<u32> =
        serde_json::from_value(answer.json().unwrap()["tokens"].clone()).unwrap();
    assert_ne!(chat_tokens[..BLOCK], ids(&letters(4, 300))[..BLOCK]);
    let r = m
        .client
        .post_json(
            &format!("{}/v1/chat/completions", m.url),
            &json!({"messages": messages, "max_tokens": 2}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, payload) = recv(&mut sub).await;
    let full = chat_tokens.len() / BLOCK;
    assert_eq!(
        events(&payload),
        vec![Ev::Stored {
            hashes: token_block_hashes(&chat_tokens, BLOCK),
            parent: None,
            tokens: chat_tokens[..full * BLOCK].to_vec(),
            block_size: BLOCK as u64,
        }]
    );
    assert_eq!(m.stats().await["tokenize_calls"].as_u64(), Some(2));

    // Bad bodies get a 400 with a reason.
    for bad in [&b"{nope"[..], b"{}", br#"{"messages": []}"#] {
        let r = m.client.post_raw(&url, bad.to_vec()).await.unwrap();
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(bad));
        assert!(r.text().contains("message"), "{}", r.text());
    }
}

#[tokio::test]
async fn a_mock_without_a_tokenizer_has_no_tokenize_route() {
    let engine = shoal_tests::mock::spawn_engine(
        shoal_tests::mock::EngineConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let r = HttpClient::new()
        .post_json(
            &format!("{}/tokenize", engine.url()),
            &json!({"prompt": "hi"}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert!(r.text().contains("--tokenizer"), "{}", r.text());
}
