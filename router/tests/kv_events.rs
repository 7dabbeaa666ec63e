//! The KV-event subscriber over real ZMQ sockets on loopback: a publisher
//! (PUB) and a replay socket (ROUTER) in the test play the engine, sending
//! vLLM-format batches; the router's subscriber builds its index from them.
//! Covers: from seq 0 (complete), a late join warmed by replay, a gap
//! filled by replay, a gap replay cannot fill (cleared), an engine restart,
//! a malformed batch, and both event encodings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rmpv::Value;
use shoal::kv_events::subscriber::{self, Outcome, StreamEndpoints};
use shoal::kv_events::{Coverage, KvIndex, StreamId, chain};
use zeromq::prelude::*;
use zeromq::{PubSocket, RouterSocket, ZmqMessage};

const BS: usize = 4;

/// The replay buffer: `(seq, payload)` of each batch kept.
type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// One event encoding the engine under test uses.
#[derive(Clone, Copy)]
enum Encoding {
    /// vLLM 0.10.2–0.23: positional arrays.
    Array,
    /// vLLM ≥ 0.24: maps tagged by `type`.
    Map,
}

fn stored(enc: Encoding, hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> Value {
    let hashes = Value::Array(hashes.iter().map(|h| Value::from(*h)).collect());
    let parent = parent.map_or(Value::Nil, Value::from);
    let tokens = Value::Array(tokens.iter().map(|t| Value::from(*t)).collect());
    match enc {
        Encoding::Array => Value::Array(vec![
            "BlockStored".into(),
            hashes,
            parent,
            tokens,
            Value::from(BS as u64),
            Value::Nil,
            "GPU".into(),
        ]),
        Encoding::Map => Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            ("block_hashes".into(), hashes),
            ("parent_block_hash".into(), parent),
            ("token_ids".into(), tokens),
            ("block_size".into(), Value::from(BS as u64)),
            ("lora_id".into(), Value::Nil),
            ("medium".into(), "GPU".into()),
            ("lora_name".into(), Value::Nil),
        ]),
    }
}

fn batch(events: Vec<Value>) -> Vec<u8> {
    let value = Value::Array(vec![Value::from(1.5), Value::Array(events), Value::from(0)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

/// The engine side: a PUB socket and a ROUTER replay socket with a buffer
/// of every batch published (or only the last `keep`).
struct Engine {
    publisher: PubSocket,
    endpoints: StreamEndpoints,
    buffer: Buffer,
    next_seq: u64,
    replay_task: tokio::task::JoinHandle<()>,
}

impl Engine {
    async fn start(with_replay: bool) -> Self {
        let mut publisher = PubSocket::new();
        let events = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
        let buffer: Buffer = Arc::default();
        let mut router = RouterSocket::new();
        let replay = router.bind("tcp://127.0.0.1:0").await.unwrap();
        let served = buffer.clone();
        let replay_task = tokio::spawn(async move {
            while let Ok(request) = router.recv().await {
                let frames: Vec<Bytes> = request.into_vec();
                let [identity, _empty, start] = frames.as_slice() else {
                    continue;
                };
                let start = u64::from_be_bytes(start.as_ref().try_into().unwrap());
                let batches: Vec<(u64, Vec<u8>)> = served
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(seq, _)| *seq >= start)
                    .cloned()
                    .collect();
                for (seq, payload) in batches {
                    let reply = vec![
                        identity.clone(),
                        Bytes::new(),
                        Bytes::new(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        Bytes::from(payload),
                    ];
                    router
                        .send(ZmqMessage::try_from(reply).unwrap())
                        .await
                        .unwrap();
                }
                let end = vec![
                    identity.clone(),
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::from_static(&[0xff; 8]),
                    Bytes::new(),
                ];
                router
                    .send(ZmqMessage::try_from(end).unwrap())
                    .await
                    .unwrap();
            }
        });
        Self {
            publisher,
            endpoints: StreamEndpoints {
                events: events.to_string(),
                replay: with_replay.then(|| replay.to_string()),
            },
            buffer,
            next_seq: 0,
            replay_task,
        }
    }

    /// Numbers `payload` and buffers it; sends it live unless `lose` (a
    /// batch the subscriber never sees live).
    async fn publish(&mut self, payload: Vec<u8>, lose: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        if !lose {
            self.send_raw(seq, payload).await;
        }
    }

    async fn send_raw(&mut self, seq: u64, payload: Vec<u8>) {
        let message = ZmqMessage::try_from(vec![
            Bytes::from_static(b""),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ])
        .unwrap();
        self.publisher.send(message).await.unwrap();
    }

    /// The engine restarted: numbering and buffer start over.
    fn restart(&mut self) {
        self.next_seq = 0;
        self.buffer.lock().unwrap().clear();
    }

    /// Drops the replay buffer's oldest batches (it holds `keep`).
    fn trim_buffer(&self, keep: usize) {
        let mut buffer = self.buffer.lock().unwrap();
        let extra = buffer.len().saturating_sub(keep);
        buffer.drain(..extra);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

struct Subscriber {
    index: Arc<RwLock<KvIndex>>,
    stream: StreamId,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    fn start(endpoints: StreamEndpoints) -> Self {
        let index = Arc::new(RwLock::new(KvIndex::new(BS, 10_000)));
        let stream = index.write().unwrap().add_stream(7);
        let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let seen = outcomes.clone();
        let task = tokio::spawn(subscriber::run(
            endpoints,
            index.clone(),
            stream,
            move |o| seen.lock().unwrap().push(o),
        ));
        Self {
            index,
            stream,
            outcomes,
            task,
        }
    }

    fn depth(&self, tokens: &[u32]) -> usize {
        let mut out = Vec::new();
        let blocks = chain::blocks(chain::seed(None), tokens, BS);
        self.index.read().unwrap().matches(&blocks, &mut out);
        out.first().map_or(0, |(_, d)| *d)
    }

    fn coverage(&self) -> Coverage {
        self.index.read().unwrap().coverage(self.stream)
    }

    fn count(&self, outcome: Outcome) -> usize {
        self.outcomes
            .lock()
            .unwrap()
            .iter()
            .filter(|o| **o == outcome)
            .count()
    }

    /// Waits (bounded) until `check` holds.
    async fn until(&self, what: &str, check: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes throwaway batches until the subscriber has applied one (a
/// PUB drops everything sent before the SUB's subscription arrives).
async fn connect(engine: &mut Engine, sub: &Subscriber) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sub.count(Outcome::Applied) == 0 {
        assert!(Instant::now() < deadline, "subscriber never connected");
        engine.publish(batch(vec![]), false).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const PROMPT: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

#[tokio::test]
async fn a_stream_from_seq_zero_is_complete_in_either_encoding() {
    for enc in [Encoding::Array, Encoding::Map] {
        let mut engine = Engine::start(true).await;
        let sub = Subscriber::start(engine.endpoints.clone());
        connect(&mut engine, &sub).await;
        // Whether the first throwaway batch was seen live or replayed, the
        // stream's history reaches seq 0.
        sub.until("complete", |s| s.coverage() == Coverage::Complete)
            .await;
        engine
            .publish(
                batch(vec![stored(enc, &[11, 12], None, &PROMPT[..8])]),
                false,
            )
            .await;
        engine
            .publish(
                batch(vec![stored(enc, &[13], Some(12), &PROMPT[8..])]),
                false,
            )
            .await;
        sub.until("three blocks", |s| s.depth(&PROMPT) == 3).await;
        let removed = Value::Map(vec![
            ("type".into(), "BlockRemoved".into()),
            (
                "block_hashes".into(),
                Value::Array(vec![Value::from(13u64)]),
            ),
            ("medium".into(), "GPU".into()),
        ]);
        engine.publish(batch(vec![removed]), false).await;
        sub.until("removal", |s| s.depth(&PROMPT) == 2).await;
    }
}

#[tokio::test]
async fn a_late_subscriber_warms_up_from_the_replay_socket() {
    let mut engine = Engine::start(true).await;
    // History the subscriber was not there for.
    engine
        .publish(
            batch(vec![stored(Encoding::Map, &[11, 12], None, &PROMPT[..8])]),
            false,
        )
        .await;
    let sub = Subscriber::start(engine.endpoints.clone());
    connect(&mut engine, &sub).await;
    sub.until("replayed history", |s| s.depth(&PROMPT) == 2)
        .await;
    assert_eq!(
        sub.coverage(),
        Coverage::Complete,
        "the buffer reached seq 0"
    );

    // A late joiner whose replay buffer lost the start: blocks from the
    // buffer are known, coverage is a suffix.
    let mut engine = Engine::start(true).await;
    engine
        .publish(
            batch(vec![stored(Encoding::Map, &[11], None, &PROMPT[..4])]),
            false,
        )
        .await;
    engine
        .publish(
            batch(vec![stored(Encoding::Map, &[12], Some(11), &PROMPT[4..8])]),
            false,
        )
        .await;
    engine.trim_buffer(1);
    let sub = Subscriber::start(engine.endpoints.clone());
    connect(&mut engine, &sub).await;
    sub.until("suffix", |s| s.coverage() == Coverage::Suffix)
        .await;
    assert_eq!(
        sub.depth(&PROMPT),
        0,
        "a block whose parent was never seen is not indexed"
    );
}

#[tokio::test]
async fn gaps_are_filled_by_replay_or_cleared() {
    let mut engine = Engine::start(true).await;
    let sub = Subscriber::start(engine.endpoints.clone());
    connect(&mut engine, &sub).await;
    // A batch lost on the live stream arrives through replay.
    engine
        .publish(
            batch(vec![stored(Encoding::Array, &[11, 12], None, &PROMPT[..8])]),
            true,
        )
        .await;
    engine.publish(batch(vec![]), false).await;
    sub.until("replayed gap", |s| s.count(Outcome::Replayed) == 1)
        .await;
    assert_eq!(sub.depth(&PROMPT), 2);
    assert_eq!(sub.coverage(), Coverage::Complete);

    // A gap the buffer no longer holds: the stream is cleared (a lost
    // batch may have removed blocks) and continues as a suffix.
    engine.publish(batch(vec![]), true).await;
    engine.trim_buffer(0);
    engine
        .publish(
            batch(vec![stored(Encoding::Array, &[21], None, &[9, 9, 9, 9])]),
            false,
        )
        .await;
    sub.until("cleared", |s| s.count(Outcome::Cleared) == 1)
        .await;
    assert_eq!(sub.depth(&PROMPT), 0);
    assert_eq!(
        sub.depth(&[9, 9, 9, 9]),
        1,
        "the batch after the gap is applied"
    );
    assert_eq!(sub.coverage(), Coverage::Suffix);
}

#[tokio::test]
async fn gaps_without_a_replay_socket_clear_and_restarts_start_over() {
    let mut engine = Engine::start(false).await;
    let sub = Subscriber::start(engine.endpoints.clone());
    connect(&mut engine, &sub).await;
    engine
        .publish(
            batch(vec![stored(Encoding::Map, &[11, 12], None, &PROMPT[..8])]),
            false,
        )
        .await;
    sub.until("stored", |s| s.depth(&PROMPT) == 2).await;
    // The engine restarts: seq 0 again, its cache empty.
    engine.restart();
    engine
        .publish(
            batch(vec![stored(Encoding::Map, &[31], None, &[5, 5, 5, 5])]),
            false,
        )
        .await;
    sub.until("restart", |s| s.count(Outcome::Restarted) == 1)
        .await;
    assert_eq!(
        sub.depth(&PROMPT),
        0,
        "the old blocks went with the restart"
    );
    assert_eq!(sub.depth(&[5, 5, 5, 5]), 1);
    assert_eq!(sub.coverage(), Coverage::Complete);
    // A malformed batch loses its events: counted, and the stream cleared.
    engine.send_raw(1, vec![0xc1, 0xff, 0x00]).await;
    sub.until("malformed", |s| s.count(Outcome::Malformed) == 1)
        .await;
    assert_eq!(sub.depth(&[5, 5, 5, 5]), 0);
    assert_eq!(sub.coverage(), Coverage::Suffix);
}
