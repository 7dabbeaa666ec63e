//! One engine's event stream: a ZMQ SUB socket on its publisher, the
//! sequence check, and replay from its ROUTER socket when batches are
//! missing.
//!
//! The stream's coverage (see [`Coverage`]) follows what was seen: from
//! seq 0, `Complete`; joined late or after a repaired-by-clearing gap,
//! `Suffix`; never connected, `Cold`. A lost batch may have removed
//! blocks, so a gap that replay cannot fill clears the stream's blocks:
//! the index may miss blocks, never claim one that is gone.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use zeromq::prelude::*;
use zeromq::{DealerSocket, SocketOptions, SubSocket, ZmqMessage};

use super::index::{Coverage, KvIndex, StreamId};
use super::sequence::{SeqTracker, Verdict};
use super::wire;

/// Largest payload accepted (real batches are kilobytes).
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;
/// How long a connect or a whole replay may take.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);
/// Most batches one replay may return (vLLM buffers 10,000).
const MAX_REPLAYED: usize = 100_000;
/// The end-of-replay marker's sequence number (-1 as 8 bytes).
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// Where one engine publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEndpoints {
    /// The PUB socket (`tcp://host:port`).
    pub events: String,
    /// The ROUTER replay socket, if the engine has one.
    pub replay: Option<String>,
}

/// What happened to a stream, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A batch was applied.
    Applied,
    /// A batch was not msgpack of the expected shape (dropped, counted).
    Malformed,
    /// A gap was filled by replay.
    Replayed,
    /// A gap could not be filled: the stream was cleared.
    Cleared,
    /// The engine restarted: the stream was cleared.
    Restarted,
}

/// Reads `endpoints` into `index` as stream `stream` until the task is
/// aborted. Connects (and reconnects) forever; `on_outcome` is told about
/// each batch.
pub async fn run(
    endpoints: StreamEndpoints,
    index: Arc<RwLock<KvIndex>>,
    stream: StreamId,
    on_outcome: impl Fn(Outcome) + Send + Sync,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut socket = SubSocket::with_options(socket_options());
        let connected = async {
            socket.subscribe("").await?;
            socket.connect(&endpoints.events).await
        };
        match tokio::time::timeout(SOCKET_TIMEOUT, connected).await {
            Ok(Ok(())) => {
                backoff = Duration::from_millis(100);
                let mut reader = StreamReader {
                    endpoints: &endpoints,
                    index: &index,
                    stream,
                    seq: SeqTracker::default(),
                    on_outcome: &on_outcome,
                };
                reader.read(&mut socket).await;
            }
            Ok(Err(e)) => {
                tracing::debug!(endpoint = %endpoints.events, error = %e, "kv events connect failed")
            }
            Err(_) => tracing::debug!(endpoint = %endpoints.events, "kv events connect timed out"),
        }
        write(&index).set_coverage(stream, Coverage::Cold);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn socket_options() -> SocketOptions {
    let mut options = SocketOptions::default();
    options.connect_timeout(SOCKET_TIMEOUT);
    options
}

fn write(index: &RwLock<KvIndex>) -> std::sync::RwLockWriteGuard<'_, KvIndex> {
    index
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct StreamReader<'a, F> {
    endpoints: &'a StreamEndpoints,
    index: &'a RwLock<KvIndex>,
    stream: StreamId,
    seq: SeqTracker,
    on_outcome: &'a F,
}

impl<F: Fn(Outcome)> StreamReader<'_, F> {
    async fn read(&mut self, socket: &mut SubSocket) {
        loop {
            let message = match socket.recv().await {
                Ok(message) => message,
                Err(e) => {
                    tracing::debug!(endpoint = %self.endpoints.events, error = %e, "kv events stream ended");
                    return;
                }
            };
            let Some((seq, payload)) = live_frames(&message) else {
                (self.on_outcome)(Outcome::Malformed);
                continue;
            };
            match self.seq.judge(seq) {
                Verdict::Apply => self.apply(seq, &payload),
                Verdict::Duplicate => {}
                Verdict::Joined => {
                    let covered = self.replay_from(0, seq).await;
                    let coverage = if covered == Some(0) {
                        Coverage::Complete
                    } else {
                        Coverage::Suffix
                    };
                    write(self.index).set_coverage(self.stream, coverage);
                    self.apply(seq, &payload);
                }
                Verdict::Gap { from } => {
                    if self.replay_from(from, seq).await != Some(from) {
                        self.clear(Coverage::Suffix, Outcome::Cleared);
                    } else {
                        (self.on_outcome)(Outcome::Replayed);
                    }
                    self.apply(seq, &payload);
                }
                Verdict::Restarted => {
                    self.seq.reset();
                    let coverage = if seq == 0 {
                        Coverage::Complete
                    } else {
                        Coverage::Suffix
                    };
                    self.clear(coverage, Outcome::Restarted);
                    if seq != 0 {
                        self.replay_from(0, seq).await;
                    }
                    self.apply(seq, &payload);
                }
            }
        }
    }

    fn clear(&mut self, coverage: Coverage, outcome: Outcome) {
        let mut index = write(self.index);
        index.clear(self.stream);
        index.set_coverage(self.stream, coverage);
        drop(index);
        (self.on_outcome)(outcome);
    }

    /// Applies one batch (a live one, or a replayed one the tracker
    /// accepted). An undecodable batch loses its events: the stream is
    /// cleared, as for a gap.
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        if self.seq.next() == 0 && seq == 0 {
            write(self.index).set_coverage(self.stream, Coverage::Complete);
        }
        self.seq.applied(seq);
        match wire::decode_batch(payload) {
            Ok(batch) => {
                write(self.index).apply(self.stream, &batch.events);
                (self.on_outcome)(Outcome::Applied);
            }
            Err(e) => {
                tracing::debug!(endpoint = %self.endpoints.events, seq, error = %e, "kv events batch dropped");
                (self.on_outcome)(Outcome::Malformed);
                self.clear(Coverage::Suffix, Outcome::Cleared);
            }
        }
    }

    /// Replays batches `from..until` from the engine's replay socket and
    /// applies them; returns the first sequence number the replay covered
    /// (`None`: no replay socket, or it failed).
    async fn replay_from(&mut self, from: u64, until: u64) -> Option<u64> {
        let endpoint = self.endpoints.replay.as_deref()?;
        let batches = match tokio::time::timeout(SOCKET_TIMEOUT, replay(endpoint, from)).await {
            Ok(Ok(batches)) => batches,
            Ok(Err(e)) => {
                tracing::debug!(endpoint, error = %e, "kv events replay failed");
                return None;
            }
            Err(_) => {
                tracing::debug!(endpoint, "kv events replay timed out");
                return None;
            }
        };
        let first = batches.first().map(|(seq, _)| *seq);
        for (seq, payload) in batches.iter().filter(|(seq, _)| *seq < until) {
            if self.seq.judge_replayed(*seq) == Verdict::Apply {
                self.apply(*seq, payload);
            }
        }
        // An empty replay of a non-empty range covers nothing.
        first.or((from >= until).then_some(from))
    }
}

/// The sequence number and payload of a live message: `[topic, seq,
/// payload]` (or `[seq, payload]` from a publisher without topics).
fn live_frames(message: &ZmqMessage) -> Option<(u64, Bytes)> {
    let frames: Vec<&Bytes> = message.iter().collect();
    let (seq, payload) = match frames.as_slice() {
        [_, seq, payload] | [seq, payload] => (seq, payload),
        _ => return None,
    };
    let seq: [u8; 8] = seq.as_ref().try_into().ok()?;
    (payload.len() <= MAX_PAYLOAD_BYTES).then(|| (u64::from_be_bytes(seq), (*payload).clone()))
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The socket failed.
    #[error(transparent)]
    Zmq(#[from] zeromq::ZmqError),
    /// A reply was not `["", (topic,) seq, payload]`.
    #[error("malformed replay reply")]
    Malformed,
    /// More batches than [`MAX_REPLAYED`].
    #[error("replay longer than {MAX_REPLAYED} batches")]
    TooLong,
}

/// Asks the ROUTER socket at `endpoint` for every buffered batch from
/// `from` on: sends `["", from as 8 bytes]` from a DEALER and reads
/// `["", (topic,) seq, payload]` replies until the end marker (vLLM and
/// SGLang, both the layouts before and after the topic frame was added).
pub async fn replay(endpoint: &str, from: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    let mut dealer = DealerSocket::with_options(socket_options());
    dealer.connect(endpoint).await?;
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .map_err(|_| ReplayError::Malformed)?;
    dealer.send(request).await?;
    let mut batches = Vec::new();
    loop {
        let reply = dealer.recv().await?;
        let frames: Vec<&Bytes> = reply.iter().collect();
        let (seq, payload) = match frames.as_slice() {
            [empty, _, seq, payload] | [empty, seq, payload] if empty.is_empty() => (seq, payload),
            _ => return Err(ReplayError::Malformed),
        };
        if seq.as_ref() == END_OF_REPLAY {
            return Ok(batches);
        }
        let seq: [u8; 8] = seq
            .as_ref()
            .try_into()
            .map_err(|_| ReplayError::Malformed)?;
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(ReplayError::Malformed);
        }
        if batches.len() >= MAX_REPLAYED {
            return Err(ReplayError::TooLong);
        }
        batches.push((u64::from_be_bytes(seq), (*payload).clone()));
    }
}
