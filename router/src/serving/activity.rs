//! What one client connection is doing: how many of its requests are
//! still being answered, and since when it has been idle.
//!
//! Why the front keeps this itself: hyper's HTTP/1 header timeout starts
//! only once the connection's first byte is read, and hyper-util's
//! protocol sniff (HTTP/1 or HTTP/2 with prior knowledge) reads that byte
//! with no deadline at all; HTTP/2 has no idle timeout. A socket that
//! writes nothing, or half of the HTTP/2 preface, or an HTTP/2 connection
//! that never opens a stream, would hold a slot of the connection cap
//! forever. Counting requests at the service boundary covers every
//! protocol state in one rule: a connection with no request in flight for
//! the header timeout is closed (`guard`), and the longest-idle one is the
//! one given up when the cap is reached (`table`).
//!
//! Cost per request: two uncontended atomic updates on the connection's
//! own cache line, and one clock read when its last response ends.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::Notify;

/// The activity of one client connection (shared by its service, its
/// guard task and the connection table).
#[derive(Debug)]
pub struct Activity {
    /// When the connection was handed to its I/O thread.
    opened: Instant,
    /// Requests whose response has not ended (HTTP/2: open streams).
    in_flight: AtomicU32,
    /// Requests the connection has delivered (a complete head).
    served: AtomicU64,
    /// When the connection last went idle, in ms since `opened` (0: it
    /// has been idle since it opened).
    idle_since_ms: AtomicU64,
    /// Set once the table picked this connection to close.
    evicted: AtomicBool,
    /// Wakes the guard task when the connection is evicted.
    evict: Notify,
}

impl Activity {
    /// A connection opened now, idle until its first request.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_flight: AtomicU32::new(0),
            served: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        })
    }

    /// When the connection went idle, or `None` while a request is being
    /// answered.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.idle_since_ms.load(Ordering::Relaxed);
        Some(self.opened + Duration::from_millis(ms))
    }

    /// Whether the connection ever delivered a complete request head.
    pub fn has_served(&self) -> bool {
        self.served.load(Ordering::Relaxed) > 0
    }

    /// Marks the connection for closing; false if it already was.
    pub fn evict(&self) -> bool {
        if self.evicted.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.evict.notify_one();
        true
    }

    /// Whether [`Activity::evict`] was called.
    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Resolves once the connection is evicted.
    pub async fn evicted(&self) {
        while !self.is_evicted() {
            self.evict.notified().await;
        }
    }

    /// Counts a request that starts now; the guard counts it done.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.served.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// One request of a connection being answered: dropped when its response
/// body ends or is abandoned (the client reset the stream, the connection
/// closed), which makes the connection idle if it was the last.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        // The idle time is stored before the count reaches 0, so a reader
        // that sees no request in flight sees when the last one ended.
        if activity.in_flight.load(Ordering::Acquire) == 1 {
            let ms = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
            activity.idle_since_ms.store(ms, Ordering::Relaxed);
        }
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// The future of a request the connection service is answering: holds
    /// its [`InFlight`] until the response exists, then hands it to the
    /// body.
    pub struct Answering<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F> Answering<F> {
    /// `inner`, counted as one request in flight until its answer ends.
    pub fn new(inner: F, in_flight: InFlight) -> Self {
        Self {
            inner,
            in_flight: Some(in_flight),
        }
    }
}

impl<F, B, E> std::future::Future for Answering<F>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<CountedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let in_flight = this.in_flight.take();
        Poll::Ready(Ok(response.map(|inner| CountedBody {
            inner,
            _in_flight: in_flight,
        })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted in flight until
    /// hyper drops it (written out, or abandoned).
    pub struct CountedBody<B> {
        #[pin]
        inner: B,
        _in_flight: Option<InFlight>,
    }
}

impl<B> http_body::Body for CountedBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The service of one connection, counting each request in flight on the
/// connection's [`Activity`] until its response ends.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Counted<S> {
    /// `inner`, counting on `activity`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }

    /// The activity it counts on.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl<S> hyper::service::Service<http::Request<hyper::body::Incoming>> for Counted<S>
where
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
        >,
{
    type Response = http::Response<CountedBody<axum::body::Body>>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn call(&self, request: http::Request<hyper::body::Incoming>) -> Self::Future {
        let in_flight = self.activity.start();
        Answering::new(self.inner.call(request), in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_idle_when_its_last_request_ends() {
        let activity = Activity::new();
        let opened = activity.idle_since().unwrap();
        assert!(!activity.has_served());
        let first = activity.start();
        let second = activity.start();
        assert_eq!(activity.idle_since(), None, "busy while answering");
        drop(first);
        assert_eq!(activity.idle_since(), None, "one still in flight");
        std::thread::sleep(Duration::from_millis(5));
        drop(second);
        let idle = activity.idle_since().unwrap();
        assert!(idle > opened, "idle from the end of the last request");
        assert!(activity.has_served());
    }

    #[test]
    fn eviction_is_marked_once() {
        let activity = Activity::new();
        assert!(!activity.is_evicted());
        assert!(activity.evict());
        assert!(!activity.evict(), "already marked");
        assert!(activity.is_evicted());
    }
}
