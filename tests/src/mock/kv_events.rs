//! Publishing KV-cache events over ZMQ the way vLLM and SGLang do, so a
//! router's event ingest can be tested against real sockets.
//!
//! * PUB socket (`--kv-events-port`): one 3-frame message per batch,
//!   `[topic, seq as 8-byte big-endian u64, msgpack payload]`; `seq` starts
//!   at 0 and grows by one per batch. A batch is published once per
//!   scheduler step that changed the cache, and once per
//!   `/reset_prefix_cache`. Messages sent while no subscriber is connected
//!   are lost, as with any PUB socket (they stay in the replay buffer).
//! * ROUTER socket (`--kv-events-replay-port`): the last
//!   `--kv-events-buffer-steps` batches. A DEALER sends `[b"", start_seq]`
//!   (8 bytes, big-endian) and gets one message per buffered batch with
//!   `seq >= start_seq`, `[b"", topic, seq, payload]` (vLLM ≥ 0.26), then
//!   the end marker `[b"", b"", ff×8, b""]`. Any other request is logged,
//!   counted and gets no reply, like vLLM.
//! * One data-parallel rank: `dp_rank` is always 0.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::watch;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::config::EngineConfig;
use super::kv_wire::{KvEvent, KvEventsFormat, encode_batch};

/// The seq frame of the replay end marker (vLLM's `END_SEQ`, -1 as i64).
pub const REPLAY_END_SEQ: [u8; 8] = [0xff; 8];

/// Where and how an engine publishes its KV-cache events (`/stats`,
/// the `mock-engine kv-events` line and [`super::EngineHandle`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvEventsInfo {
    /// The PUB endpoint, `tcp://IP:PORT` with the port resolved.
    pub endpoint: String,
    /// The ROUTER replay endpoint, if any.
    pub replay_endpoint: Option<String>,
    /// The wire encoding.
    #[serde(serialize_with = "as_str")]
    pub format: KvEventsFormat,
    /// Tokens per block.
    pub block_size: usize,
    /// Frame 0 of every message.
    pub topic: String,
}

fn as_str<S: serde::Serializer>(f: &KvEventsFormat, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.as_str())
}

/// Counters of the publisher, shown in `/stats`.
#[derive(Debug, Default)]
pub struct KvStats {
    published_batches: AtomicU64,
    published_payload_bytes: AtomicU64,
    failed_batches: AtomicU64,
    replay_requests: AtomicU64,
    invalid_replay_requests: AtomicU64,
    replayed_batches: AtomicU64,
}

/// A copy of [`KvStats`] for serialising.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvStatsView {
    /// Batches given a seq and sent on the PUB socket.
    pub published_batches: u64,
    /// Their msgpack payload bytes (what each subscriber receives, less
    /// the topic, seq and ZMTP framing).
    pub published_payload_bytes: u64,
    /// Batches that could not be encoded or sent (their seq is skipped).
    pub failed_batches: u64,
    /// Valid replay requests answered.
    pub replay_requests: u64,
    /// Malformed replay requests (logged, not answered).
    pub invalid_replay_requests: u64,
    /// Batches sent in replay answers.
    pub replayed_batches: u64,
}

impl KvStats {
    /// The counters now.
    pub fn view(&self) -> KvStatsView {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KvStatsView {
            published_batches: get(&self.published_batches),
            published_payload_bytes: get(&self.published_payload_bytes),
            failed_batches: get(&self.failed_batches),
            replay_requests: get(&self.replay_requests),
            invalid_replay_requests: get(&self.invalid_replay_requests),
            replayed_batches: get(&self.replayed_batches),
        }
    }
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The engine's end of a publisher: where to send batches, and what to report.
#[derive(Debug)]
pub(crate) struct KvLink {
    pub tx: UnboundedSender<Vec<KvEvent>>,
    pub info: KvEventsInfo,
    pub stats: Arc<KvStats>,
}

/// Bound sockets waiting for [`KvSockets::spawn`].
pub(crate) struct KvSockets {
    publisher: PubSocket,
    replay: Option<RouterSocket>,
    rx: UnboundedReceiver<Vec<KvEvent>>,
    info: KvEventsInfo,
    stats: Arc<KvStats>,
    buffer_steps: usize,
}

async fn bind<S: Socket>(socket: &mut S, flag: &str, ip: IpAddr, port: u16) -> io::Result<String> {
    let want = format!("tcp://{}", SocketAddr::new(ip, port));
    socket
        .bind(&want)
        .await
        .map(|ep| ep.to_string())
        .map_err(|e| io::Error::other(format!("{flag} {port}: cannot bind {want}: {e}")))
}

/// Binds the PUB (and replay ROUTER) sockets of an engine on `ip` if
/// `cfg` asks for events; the link goes to the engine, the sockets to
/// [`KvSockets::spawn`] once the engine exists.
pub(crate) async fn bind_sockets(
    cfg: &EngineConfig,
    ip: IpAddr,
    block_size: usize,
) -> io::Result<Option<(KvLink, KvSockets)>> {
    let Some(port) = cfg.kv_events_port else {
        return Ok(None);
    };
    let mut publisher = PubSocket::new();
    let endpoint = bind(&mut publisher, "--kv-events-port", ip, port).await?;
    let (replay, replay_endpoint) = match cfg.kv_events_replay_port {
        Some(port) => {
            let mut router = RouterSocket::new();
            let ep = bind(&mut router, "--kv-events-replay-port", ip, port).await?;
            (Some(router), Some(ep))
        }
        None => (None, None),
    };
    let info = KvEventsInfo {
        endpoint,
        replay_endpoint,
        format: cfg.kv_events_format,
        block_size,
        topic: cfg.kv_events_topic.clone(),
    };
    let stats = Arc::new(KvStats::default());
    let (tx, rx) = unbounded_channel();
    let link = KvLink {
        tx,
        info: info.clone(),
        stats: stats.clone(),
    };
    let sockets = KvSockets {
        publisher,
        replay,
        rx,
        info,
        stats,
        buffer_steps: cfg.kv_events_buffer_steps.max(1),
    };
    Ok(Some((link, sockets)))
}

/// The last published batches, `(seq, payload)`, oldest first.
type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

fn multipart(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl KvSockets {
    /// Starts the publishing and replay tasks; both end when `dead` turns
    /// true (the engine stopped), closing the sockets.
    pub(crate) fn spawn(self, dead: watch::Receiver<bool>) {
        let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
        let topic = Bytes::from(self.info.topic.clone().into_bytes());
        if let Some(router) = self.replay {
            tokio::spawn(replay_loop(
                router,
                buffer.clone(),
                topic.clone(),
                self.stats.clone(),
                dead.clone(),
            ));
        }
        let publisher = Publisher {
            socket: self.publisher,
            format: self.info.format,
            topic,
            next_seq: 0,
            buffer,
            buffer_steps: self.buffer_steps,
            stats: self.stats,
        };
        tokio::spawn(publisher.run(self.rx, dead));
    }
}

struct Publisher {
    socket: PubSocket,
    format: KvEventsFormat,
    topic: Bytes,
    next_seq: u64,
    buffer: Buffer,
    buffer_steps: usize,
    stats: Arc<KvStats>,
}

impl Publisher {
    async fn run(
        mut self,
        mut rx: UnboundedReceiver<Vec<KvEvent>>,
        mut dead: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                () = async { let _ = dead.wait_for(|d| *d).await; } => break,
                batch = rx.recv() => match batch {
                    Some(events) => self.publish(&events).await,
                    None => break,
                },
            }
        }
    }

    /// Gives `events` the next seq, buffers them for replay (before the
    /// live send, so whoever sees seq N live can replay it) and sends them.
    async fn publish(&mut self, events: &[KvEvent]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = match encode_batch(self.format, unix_now(), events, 0) {
            Ok(p) => Bytes::from(p),
            Err(e) => {
                tracing::warn!(seq, "mock-engine: cannot encode a KV-event batch: {e}");
                count(&self.stats.failed_batches);
                return;
            }
        };
        {
            let mut buf = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buf.len() >= self.buffer_steps {
                buf.pop_front();
            }
            buf.push_back((seq, payload.clone()));
        }
        let seq8 = Bytes::copy_from_slice(&seq.to_be_bytes());
        let bytes = payload.len() as u64;
        let Some(msg) = multipart(vec![self.topic.clone(), seq8, payload]) else {
            count(&self.stats.failed_batches);
            return;
        };
        match self.socket.send(msg).await {
            Ok(()) => {
                count(&self.stats.published_batches);
                self.stats
                    .published_payload_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(seq, "mock-engine: cannot publish a KV-event batch: {e}");
                count(&self.stats.failed_batches);
            }
        }
    }
}

/// A replay request `[identity, b"", start_seq]`: the identity and the
/// start seq, or why it is invalid.
pub fn parse_replay_request(frames: &[Bytes]) -> Result<(Bytes, u64), String> {
    let [identity, delimiter, start] = frames else {
        return Err(format!(
            "expected 3 frames [identity, empty, start_seq], got {}",
            frames.len()
        ));
    };
    if !delimiter.is_empty() {
        return Err("the frame after the identity must be empty".to_string());
    }
    let start: [u8; 8] = start[..].try_into().map_err(|_| {
        format!(
            "start_seq must be an 8-byte big-endian integer, got {} bytes",
            start.len()
        )
    })?;
    Ok((identity.clone(), u64::from_be_bytes(start)))
}

async fn replay_loop(
    mut router: RouterSocket,
    buffer: Buffer,
    topic: Bytes,
    stats: Arc<KvStats>,
    mut dead: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            () = async { let _ = dead.wait_for(|d| *d).await; } => break,
            msg = router.recv() => msg,
        };
        let frames: Vec<Bytes> = match msg {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!("mock-engine: KV-event replay socket: {e}");
                continue;
            }
        };
        let (identity, start) = match parse_replay_request(&frames) {
            Ok(r) => r,
            Err(why) => {
                tracing::warn!("mock-engine: invalid KV-event replay request: {why}");
                count(&stats.invalid_replay_requests);
                continue;
            }
        };
        count(&stats.replay_requests);
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let empty = Bytes::new();
        let replies = batches
            .into_iter()
            .map(|(seq, payload)| {
                let seq8 = Bytes::copy_from_slice(&seq.to_be_bytes());
                (
                    true,
                    vec![
                        identity.clone(),
                        empty.clone(),
                        topic.clone(),
                        seq8,
                        payload,
                    ],
                )
            })
            .chain(std::iter::once((
                false,
                vec![
                    identity.clone(),
                    empty.clone(),
                    empty.clone(),
                    Bytes::from_static(&REPLAY_END_SEQ),
                    empty.clone(),
                ],
            )));
        for (is_batch, frames) in replies {
            let Some(msg) = multipart(frames) else {
                break;
            };
            if let Err(e) = router.send(msg).await {
                tracing::warn!("mock-engine: KV-event replay answer not sent: {e}");
                break;
            }
            if is_batch {
                count(&stats.replayed_batches);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_requests_are_three_frames_with_an_8_byte_seq() {
        let id = Bytes::from_static(b"peer");
        let ok = [
            id.clone(),
            Bytes::new(),
            Bytes::copy_from_slice(&7u64.to_be_bytes()),
        ];
        assert_eq!(parse_replay_request(&ok), Ok((id.clone(), 7)));
        let short = [id.clone(), Bytes::new(), Bytes::from_static(&[7])];
        assert!(parse_replay_request(&short).unwrap_err().contains("8-byte"));
        let no_delim = [id.clone(), Bytes::from_static(b"x"), ok[2].clone()];
        assert!(
            parse_replay_request(&no_delim)
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            parse_replay_request(&ok[..2])
                .unwrap_err()
                .contains("3 frames")
        );
    }
}
