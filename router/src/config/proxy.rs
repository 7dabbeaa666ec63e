//! Proxy flags: what one request may be (body size), how long it may take
//! (connect and whole-request deadlines), and when the fleet is too busy to
//! take it (per-worker in-flight cap).

use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the proxy flags.
pub const PROXY_FLAGS: &str = "Proxy";

/// The request-size, deadline and shedding flags of the proxy path.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = PROXY_FLAGS)]
pub struct ProxyConfig {
    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, env = "SHOAL_MAX_PAYLOAD_BYTES", default_value_t = defaults::MAX_PAYLOAD_BYTES, value_parser = parsers::positive_usize)]
    pub max_payload_bytes: usize,

    /// Request-body bytes this replica holds at once, over all requests
    /// being read or forwarded; a body that does not fit gets 503 with
    /// Retry-After. 0 = a quarter of the memory limit (the cgroup's, else
    /// the machine's), and never less than --max-payload-bytes.
    #[arg(long, env = "SHOAL_MAX_BUFFERED_REQUEST_BYTES", default_value_t = defaults::MAX_BUFFERED_REQUEST_BYTES)]
    pub max_buffered_request_bytes: usize,

    /// Deadline for a whole proxied request, streaming included.
    #[arg(long, env = "SHOAL_REQUEST_TIMEOUT_SECS", default_value_t = defaults::REQUEST_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub request_timeout_secs: u64,

    /// Deadline for one attempt's response headers; past it the attempt
    /// fails: an idempotent request (GET, DELETE, ...) is retried on
    /// another worker, a POST gets 504 (the engine may be running it).
    /// Non-streamed requests answer only when done: keep this above the
    /// longest one. 0 = off.
    #[arg(long, env = "SHOAL_ATTEMPT_TIMEOUT_SECS", default_value_t = defaults::ATTEMPT_TIMEOUT_SECS)]
    pub attempt_timeout_secs: u64,

    /// Deadline for opening a connection to a worker, in milliseconds.
    #[arg(long, env = "SHOAL_CONNECT_TIMEOUT_MS", default_value_t = defaults::CONNECT_TIMEOUT_MS, value_parser = parsers::positive_u64)]
    pub connect_timeout_ms: u64,

    /// Add `x-shoal-worker: URL` (the worker that answered) to proxied
    /// responses. Off: the fleet's topology stays private.
    #[arg(long, env = "SHOAL_EXPOSE_WORKER_HEADER")]
    pub expose_worker_header: bool,

    /// Shed a request with 503 and Retry-After when every available worker
    /// already has this many requests in flight across the fleet (the mesh's
    /// view when meshed). 0 = off.
    #[arg(long, env = "SHOAL_WORKER_MAX_INFLIGHT", default_value_t = defaults::WORKER_MAX_INFLIGHT)]
    pub worker_max_inflight: u64,

    /// Stored objects (Responses API responses, files, batches) whose
    /// engine this replica remembers, newest first, so requests about them
    /// go to that engine; one forgotten is located by asking the workers
    /// one at a time. 0 = remember none.
    #[arg(long, env = "SHOAL_STORED_OBJECTS_CAPACITY", default_value_t = defaults::STORED_OBJECTS_CAPACITY)]
    pub stored_objects_capacity: usize,
}

impl Default for ProxyConfig {
    /// The flag defaults.
    fn default() -> Self {
        Self {
            max_payload_bytes: defaults::MAX_PAYLOAD_BYTES,
            max_buffered_request_bytes: defaults::MAX_BUFFERED_REQUEST_BYTES,
            request_timeout_secs: defaults::REQUEST_TIMEOUT_SECS,
            attempt_timeout_secs: defaults::ATTEMPT_TIMEOUT_SECS,
            connect_timeout_ms: defaults::CONNECT_TIMEOUT_MS,
            worker_max_inflight: defaults::WORKER_MAX_INFLIGHT,
            expose_worker_header: false,
            stored_objects_capacity: defaults::STORED_OBJECTS_CAPACITY,
        }
    }
}

impl ProxyConfig {
    /// The buffered request bytes budget in effect on a host whose memory
    /// limit is `memory` bytes (`None`: unknown).
    pub fn buffer_budget(&self, memory: Option<u64>) -> usize {
        if self.max_buffered_request_bytes > 0 {
            return self.max_buffered_request_bytes;
        }
        let share = memory.map_or(u64::MAX, |m| m / defaults::BUFFERED_REQUEST_MEMORY_SHARE);
        usize::try_from(share)
            .unwrap_or(usize::MAX)
            .max(self.max_payload_bytes)
    }

    /// Deadline for a whole request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// Deadline for one attempt's response headers (`None`: off).
    pub fn attempt_timeout(&self) -> Option<Duration> {
        (self.attempt_timeout_secs > 0).then(|| Duration::from_secs(self.attempt_timeout_secs))
    }

    /// Deadline for opening a connection to a worker.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}
