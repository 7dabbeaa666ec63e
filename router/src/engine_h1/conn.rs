//! One HTTP/1.1 connection to an engine, and the idle connections each
//! thread keeps for reuse.
//!
//! Why per thread: an I/O thread serves a request start to finish (see
//! `serving`), so a connection taken from its own pool is used and given
//! back on that thread with no lock and no cross-thread wake-up. A
//! connection is given back only after its response was read to the end.
//! Nobody watches an idle connection, so the pool checks one before reuse
//! when it sat idle for a while (a non-blocking read: an engine that closed
//! it shows end-of-file) and drops those idle past [`IDLE_TIMEOUT`].
//!
//! Why the check matters: a reused connection that turns out closed after
//! the request was written is sent again on a fresh one only for
//! idempotent methods (`engine_h1::send`, `retry_rule`); a `POST` fails
//! instead, since the router cannot tell an engine that closed an idle
//! connection from one that read the request and died. Engines close idle
//! connections after their keep-alive timeout (uvicorn's, under vLLM and
//! SGLang, is 5 s), always longer than [`PROBE_AFTER`], so the check sees
//! those closes before anything is written, and a `POST` loses only to a
//! close that lands between the check and the write.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// An idle connection older than this is closed, not reused (engines'
/// own keep-alive timeouts are often shorter; see [`PROBE_AFTER`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An idle connection older than this is checked for end-of-file before
/// reuse (a syscall saved on busy connections, whose engine cannot have
/// timed them out: engines' keep-alive timeouts are seconds).
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
/// Idle connections kept per engine per thread.
pub const MAX_IDLE_PER_ENGINE: usize = 256;
/// Bytes a new connection reads from the socket at a time (at least): an
/// SSE event or a short chat completion fits, and 10,000 open streams hold
/// 20 MiB of buffers rather than 160 at 16 KiB or 40 at 4 KiB (a buffer is
/// a page once touched; two of these share one). Larger answers grow it.
/// tests/BENCHMARKS.md, "One `shoal` process at scale".
const MIN_READ_CHUNK: usize = 2 * 1024;
/// The read size a connection grows to (doubling each time a read fills
/// all the room it had) when its responses are large.
const MAX_READ_CHUNK: usize = 16 * 1024;
/// How often a pool sweeps every engine's idle list for expired ones.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The socket of a connection: plain TCP, or TLS over it (`https://`).
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a TLS connection is opened with: the client configuration and the
/// name the engine's certificate must carry (also sent as SNI).
pub type TlsTarget = (Arc<rustls::ClientConfig>, ServerName<'static>);

/// An open connection to one engine with its read buffer.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    /// Bytes read and not consumed yet.
    pub buf: BytesMut,
    /// The pool key: the engine's `host:port`, `tls://`-prefixed for TLS.
    authority: Arc<str>,
    idle_since: Instant,
    /// Bytes to make room for before a read (see [`MIN_READ_CHUNK`]).
    read_chunk: usize,
}

impl Conn {
    /// Opens a connection to `addr` (`host:port`) pooled under `key`, over
    /// TLS when `tls` says so, all within `timeout` (TCP_NODELAY: requests
    /// are written whole).
    pub async fn connect(
        key: Arc<str>,
        addr: &str,
        tls: Option<TlsTarget>,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let connecting = async {
            let tcp = TcpStream::connect(addr).await.map_err(ConnectError::Io)?;
            tcp.set_nodelay(true).map_err(ConnectError::Io)?;
            match tls {
                None => Ok(Stream::Plain(tcp)),
                Some((config, name)) => TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map(|s| Stream::Tls(Box::new(s)))
                    .map_err(ConnectError::Tls),
            }
        };
        let stream = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| ConnectError::Timeout(timeout))??;
        Ok(Self {
            stream,
            buf: BytesMut::with_capacity(MIN_READ_CHUNK),
            authority: key,
            idle_since: Instant::now(),
            read_chunk: MIN_READ_CHUNK,
        })
    }

    /// Writes `head` then `body` (vectored; both whole).
    ///
    /// An error means the last byte did not leave: each write call either
    /// hands its bytes to the socket (or the TLS session) or fails, and a
    /// TLS flush fails only while records are still unsent. So the engine
    /// cannot have the whole request, which the retry rule relies on.
    pub async fn write_request(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        let (mut head_sent, mut body_sent) = (0, 0);
        while head_sent < head.len() || body_sent < body.len() {
            let slices = [
                IoSlice::new(&head[head_sent..]),
                IoSlice::new(&body[body_sent..]),
            ];
            let n = self.stream.write_vectored(&slices).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_head = n.min(head.len() - head_sent);
            head_sent += from_head;
            body_sent += n - from_head;
        }
        if let Stream::Tls(_) = self.stream {
            // TLS records may still sit in the session's buffer.
            self.stream.flush().await?;
        }
        Ok(())
    }

    /// Reads more bytes into [`Conn::buf`]; `Ok(0)` is end-of-file.
    ///
    /// Through `AsyncRead::poll_read`, not `try_read_buf`: a read that
    /// returns less than it asked for tells tokio the socket is drained, so
    /// the next response is awaited without a read that can only fail with
    /// `EAGAIN` (nginx's `ready` flag does the same). With `try_read_buf`
    /// that failed read was one syscall of every proxied request.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.read_chunk / 4 {
            self.buf.reserve(self.read_chunk);
        }
        let room = self.buf.capacity() - self.buf.len();
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf);
        if let Poll::Ready(Ok(n)) = read
            && n == room
            && self.read_chunk < MAX_READ_CHUNK
        {
            self.read_chunk *= 2;
        }
        read
    }

    /// [`Conn::poll_fill`] as a future.
    pub async fn fill(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Whether an idle connection can take a request: not expired, and,
    /// when idle long enough for the engine to have closed it, no
    /// end-of-file or stray bytes waiting.
    pub(super) fn is_reusable(&self, now: Instant) -> bool {
        let idle = now.saturating_duration_since(self.idle_since);
        if idle >= IDLE_TIMEOUT {
            return false;
        }
        if idle < PROBE_AFTER {
            return true;
        }
        // Under TLS the probe reads the TCP socket beneath the session: an
        // idle connection has nothing to say, so a byte there (a
        // close_notify alert, or anything out of step) condemns it just as
        // end-of-file does, and the byte it took is never missed.
        let tcp = match &self.stream {
            Stream::Plain(tcp) => tcp,
            Stream::Tls(tls) => tls.get_ref().0,
        };
        let mut probe = [0u8; 1];
        matches!(tcp.try_read(&mut probe), Err(err) if err.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connect did not finish in time.
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    /// The connect failed.
    #[error("connect failed: {0}")]
    Io(io::Error),
    /// The TLS handshake failed (untrusted certificate, wrong name, ...).
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
}

/// One thread's idle connections, by engine.
#[derive(Default)]
struct Pool {
    idle: HashMap<Arc<str>, Vec<Conn>>,
    last_sweep: Option<Instant>,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A reusable idle connection to `authority` from this thread's pool, the
/// most recently used first.
pub fn take(authority: &str) -> Option<Conn> {
    let now = Instant::now();
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let list = pool.idle.get_mut(authority)?;
        while let Some(conn) = list.pop() {
            if conn.is_reusable(now) {
                return Some(conn);
            }
        }
        None
    })
}

impl Conn {
    /// Marks it idle from `now` (it goes back to a pool) and whether it
    /// may be reused: nothing is left in its buffer after the response.
    pub(super) fn idle_from(&mut self, now: Instant) -> bool {
        self.idle_since = now;
        self.buf.is_empty()
    }

    /// Its pool key.
    pub(super) fn authority(&self) -> &Arc<str> {
        &self.authority
    }
}

/// Gives a connection whose last response was read to the end back to this
/// thread's pool (or closes it when the pool for its engine is full).
pub fn put(mut conn: Conn) {
    if !conn.buf.is_empty() {
        // Bytes after the response: the connection is out of step.
        return;
    }
    let now = Instant::now();
    conn.idle_since = now;
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool
            .last_sweep
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
        {
            pool.last_sweep = Some(now);
            pool.idle.retain(|_, list| {
                list.retain(|c| now.saturating_duration_since(c.idle_since) < IDLE_TIMEOUT);
                !list.is_empty()
            });
        }
        let list = pool.idle.entry(conn.authority.clone()).or_default();
        if list.len() < MAX_IDLE_PER_ENGINE {
            list.push(conn);
        }
    });
}

/// Idle connections this thread holds to `authority`.
#[cfg(test)]
pub fn idle_count(authority: &str) -> usize {
    POOL.with(|pool| pool.borrow().idle.get(authority).map_or(0, Vec::len))
}

#[cfg(test)]
mod read_size_tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// Small responses (SSE events) keep a connection's read size at its
    /// minimum; a large body grows it, up to the maximum.
    #[tokio::test]
    async fn the_read_size_starts_small_and_grows_only_for_large_bodies() {
        const EVENT: &[u8] = b"data: {\"token\":\"x\"}\n\n";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (go_large, large) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            for _ in 0..20 {
                socket.write_all(EVENT).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            large.await.unwrap();
            socket.write_all(&vec![b'y'; 256 * 1024]).await.unwrap();
        });
        let mut conn = Conn::connect(addr.clone().into(), &addr, None, Duration::from_secs(5))
            .await
            .unwrap();
        let mut got = 0;
        while got < 20 * EVENT.len() {
            let n = conn.fill().await.unwrap();
            assert!(n > 0, "the server closed early");
            got += n;
            conn.buf.clear();
        }
        assert_eq!(conn.read_chunk, MIN_READ_CHUNK);
        assert!(conn.buf.capacity() <= MIN_READ_CHUNK);
        go_large.send(()).unwrap();
        let mut got = 0;
        while got < 256 * 1024 {
            let n = conn.fill().await.unwrap();
            assert!(n > 0, "the server closed early");
            got += n;
            conn.buf.clear();
        }
        assert_eq!(conn.read_chunk, MAX_READ_CHUNK);
        server.await.unwrap();
    }
}
