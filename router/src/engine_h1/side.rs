//! Side requests to engines (health checks, load polls, model lists,
//! tokenize calls) on connections of their own, shared by every thread.
//!
//! Why not the proxy's per-thread pool: a worker's side requests take
//! turns (`Worker::side_turn`) and run on whichever thread their task is
//! on, so per-thread pools would end up holding a side connection to
//! every engine on every thread. Here an engine has at most one idle side
//! connection, whatever thread used it last.
//!
//! Why not a general pooled client (hyper-util's, which side requests
//! used before): each of its connections holds a connection task, an
//! 8,992-byte channel block and an 8 KiB head buffer besides its read
//! buffer, ~20 KiB an engine kept for the pool's idle timeout; here a
//! connection is its socket and a 2 KiB read buffer (tests/BENCHMARKS.md,
//! "Live heap against RSS").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http_body_util::BodyExt;

use super::conn::Conn;
use super::{Connector, EngineError, Home, Request, Wire, exchange, is_stale, may_resend};

/// How often the idle connections of engines no longer asked are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Why a side request failed.
#[derive(Debug, thiserror::Error)]
pub enum SideError {
    /// The exchange with the engine failed.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// The body was longer than the caller reads.
    #[error("response body over {0} bytes")]
    TooLarge(usize),
}

/// The idle side connections, at most one per engine.
#[derive(Debug, Default)]
pub struct SidePool {
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    by_engine: HashMap<Arc<str>, Conn>,
    last_sweep: Option<Instant>,
}

impl SidePool {
    /// Sends `request` to the worker at `base` and reads its whole answer,
    /// at most `max_bytes` of body. An idle connection to the engine is
    /// reused; one the engine had closed is replaced once, as `send` does.
    pub async fn fetch(
        &self,
        base: &str,
        request: Request<'_>,
        connector: &Connector,
        max_bytes: usize,
    ) -> Result<(StatusCode, Bytes), SideError> {
        let wire = Wire::prepare(base, &request)?;
        let key = wire.pool_key();
        let mut answer = None;
        if let Some(conn) = self.take(&key) {
            match exchange(conn, &wire.head, request, Home::Reader).await {
                Err(err) if is_stale(&err) && may_resend(request.method, &err) => {}
                done => answer = Some(done?),
            }
        }
        let response = match answer {
            Some(response) => response,
            None => {
                let conn = wire.connect(key, connector).await?;
                exchange(conn, &wire.head, request, Home::Reader).await?
            }
        };
        let status = response.status();
        let mut body = response.into_body();
        let mut read = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                if read.len() + data.len() > max_bytes {
                    return Err(SideError::TooLarge(max_bytes));
                }
                read.extend_from_slice(&data);
            }
        }
        if let Some(conn) = body.take_reusable() {
            self.put(conn);
        }
        Ok((status, read.freeze()))
    }

    /// The engine's idle connection, if it is still good.
    fn take(&self, key: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let conn = idle.by_engine.remove(key)?;
        conn.is_reusable(Instant::now()).then_some(conn)
    }

    /// Keeps `conn` as its engine's idle connection (one is enough: side
    /// requests to an engine take turns), sweeping out expired ones now
    /// and then.
    fn put(&self, mut conn: Conn) {
        let now = Instant::now();
        if !conn.idle_from(now) {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle
            .last_sweep
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
        {
            idle.last_sweep = Some(now);
            idle.by_engine.retain(|_, c| c.is_reusable(now));
        }
        let key = conn.authority().clone();
        idle.by_engine.entry(key).or_insert(conn);
    }

    /// Idle connections held.
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.by_engine.len()
    }
}
