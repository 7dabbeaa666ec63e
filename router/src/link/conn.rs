//! One HTTP/1.1 connection to an engine, and the idle connections each
//! thread keeps for reuse.
//!
//! Why per thread: an I/O thread serves a request start to finish (see
//! `serving`), so a connection taken from its own pool is used and given
//! back on that thread with no lock and no cross-thread wake-up. A
//! connection is given back only after its response was read to the end.
//! Nobody watches an idle connection, so the pool checks one before reuse
//! when it sat idle for a while (a non-blocking read: an engine that closed
//! it shows end-of-file), drops those idle past [`IDLE_TIMEOUT`], and the
//! caller retries once on a fresh connection if a reused one turns out
//! closed before any answer byte (`link::send`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// An idle connection older than this is closed, not reused (engines'
/// own keep-alive timeouts are often shorter; see [`PROBE_AFTER`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An idle connection older than this is checked for end-of-file before
/// reuse (a syscall saved on busy connections, whose engine cannot have
/// timed them out).
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
/// Idle connections kept per engine per thread.
pub const MAX_IDLE_PER_ENGINE: usize = 256;
/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 16 * 1024;
/// How often a pool sweeps every engine's idle list for expired ones.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// An open connection to one engine with its read buffer.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// Bytes read and not consumed yet.
    pub buf: BytesMut,
    /// The engine's `host:port`: the pool key.
    authority: Arc<str>,
    idle_since: Instant,
}

impl Conn {
    /// Opens a connection (TCP_NODELAY: requests are written whole).
    pub async fn connect(authority: Arc<str>, timeout: Duration) -> Result<Self, ConnectError> {
        let connecting = TcpStream::connect(&*authority);
        let stream = match tokio::time::timeout(timeout, connecting).await {
            Err(_) => return Err(ConnectError::Timeout(timeout)),
            Ok(Err(err)) => return Err(ConnectError::Io(err)),
            Ok(Ok(stream)) => stream,
        };
        stream.set_nodelay(true).map_err(ConnectError::Io)?;
        Ok(Self {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            authority,
            idle_since: Instant::now(),
        })
    }

    /// Writes `head` then `body` (vectored; both whole).
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
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }

    /// [`Conn::poll_fill`] as a future.
    pub async fn fill(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Whether an idle connection can take a request: not expired, and,
    /// when idle long enough for the engine to have closed it, no
    /// end-of-file or stray bytes waiting.
    fn is_reusable(&self, now: Instant) -> bool {
        let idle = now.saturating_duration_since(self.idle_since);
        if idle >= IDLE_TIMEOUT {
            return false;
        }
        if idle < PROBE_AFTER {
            return true;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(err) if err.kind() == io::ErrorKind::WouldBlock)
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
