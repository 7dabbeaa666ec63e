//! Serving client connections on per-core I/O threads.
//!
//! Why: a proxied request moves bytes between two sockets, the client's and
//! the worker's. On tokio's work-stealing runtime the task reading one and
//! the connection task writing the other often sit on different threads, so
//! every hop is a cross-thread wake-up (a futex and a cold cache). Profiles
//! of the proxy against a fast backend showed half of its CPU in the kernel
//! doing exactly that. Here each I/O thread is a single-threaded runtime
//! that keeps every connection handed to it, and it talks to workers over
//! connections pooled per thread (`engine_h1`): one request is read, routed,
//! forwarded and answered on one thread, as nginx's workers do.
//! Shared state (registry, policy, bookings, mesh) is the same `Arc`s on
//! every thread; only socket work is per thread. Background work (health
//! checks, load polls, the mesh) stays on the main runtime.
//!
//! One acceptor task (on the main runtime) accepts connections and hands
//! each to an I/O thread: the first one that is not yet busy, so a light
//! load runs on few threads and more join as it grows ([`placement`] says
//! why); any listener a caller bound (tests bind port 0) works unchanged.

mod activity;
mod guard;
mod placement;
mod table;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

use activity::{Activity, Counted};
use placement::{BusyClock, BusySampler, IoThreadLoad};
use table::ConnTable;

/// What the I/O threads serve each connection with: a hyper service
/// answering with axum's response type (the replica's `http::Front`).
pub trait ConnectionService:
    hyper::service::Service<
        http::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> ConnectionService for S where
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Makes the service of one connection from its peer's address (so the
/// service can tell a loopback admin from a remote one).
pub trait ServiceFactory<S: ConnectionService>:
    Fn(SocketAddr) -> S + Clone + Send + Sync + 'static
{
}

impl<S: ConnectionService, F> ServiceFactory<S> for F where
    F: Fn(SocketAddr) -> S + Clone + Send + Sync + 'static
{
}

/// Pause after an accept error that is not about one connection (e.g. out
/// of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// How many I/O threads `--io-threads 0` means: one per available core.
pub fn resolve_thread_count(flag: usize) -> usize {
    if flag > 0 {
        return flag;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The acceptor's handle on one I/O thread.
struct IoThreadHandle {
    connections: mpsc::UnboundedSender<std::net::TcpStream>,
    /// Connections the thread is serving now.
    open: Arc<AtomicUsize>,
    /// Time the thread spent awake (not parked).
    busy: Arc<BusyClock>,
}

/// What client connections are held to: the replica's defence against
/// slow and hostile clients (see `config::FrontConfig`).
#[derive(Debug, Clone, Copy)]
pub struct FrontLimits {
    /// Time a connection may go with no request in flight: to deliver its
    /// first request's headers (whatever protocol state it is in), and
    /// between a response's end and the next request (HTTP/1 keep-alive,
    /// HTTP/2 with no open stream).
    pub header_timeout: Duration,
    /// Client connections open at once; at the cap an idle one is closed
    /// to make room, or, when none is idle, the new one.
    pub max_connections: usize,
    /// Concurrent streams per HTTP/2 connection.
    pub h2_max_streams: u32,
}

impl Default for FrontLimits {
    /// Generous limits, for tests that do not exercise them.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            max_connections: 100_000,
            h2_max_streams: 256,
        }
    }
}

/// The running acceptor and I/O threads of one replica.
///
/// Dropping it without [`IoThreads::shutdown`] also stops them: the
/// acceptor and every thread see the stop signal's sender gone and wind
/// down the same way.
pub struct IoThreads {
    stop: watch::Sender<bool>,
    acceptor: tokio::task::JoinHandle<()>,
    finished: Vec<oneshot::Receiver<()>>,
}

impl IoThreads {
    /// Starts `count` I/O threads serving each connection with the service
    /// `make` builds for its peer, and the
    /// acceptor that feeds them from `listener` (spawned on the current
    /// runtime).
    pub fn start<S: ConnectionService>(
        listener: TcpListener,
        count: usize,
        limits: FrontLimits,
        make: impl ServiceFactory<S>,
    ) -> io::Result<Self> {
        let (stop, stop_rx) = watch::channel(false);
        let mut io_threads = Vec::with_capacity(count);
        let mut finished = Vec::with_capacity(count);
        let origin = Instant::now();
        let table = Arc::new(ConnTable::default());
        for index in 0..count.max(1) {
            let busy = Arc::new(BusyClock::new(origin));
            // I/O and timers only: the signal and process drivers (which
            // `enable_all` adds) would be checked on every turn for nothing.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .on_thread_park({
                    let busy = busy.clone();
                    move || busy.parked()
                })
                .on_thread_unpark({
                    let busy = busy.clone();
                    move || busy.unparked()
                })
                .build()?;
            let (connections, incoming) = mpsc::unbounded_channel();
            let open = Arc::new(AtomicUsize::new(0));
            let (done, finished_rx) = oneshot::channel();
            let thread = IoThread {
                make: make.clone(),
                stop: stop_rx.clone(),
                open: open.clone(),
                table: table.clone(),
                limits,
            };
            std::thread::Builder::new()
                .name(format!("shoal-io-{index}"))
                .spawn(move || {
                    runtime.block_on(thread.run(incoming));
                    // Connections still open after their graceful shutdown
                    // (none, normally) are dropped with the runtime here.
                    drop(runtime);
                    let _ = done.send(());
                })?;
            io_threads.push(IoThreadHandle {
                connections,
                open,
                busy,
            });
            finished.push(finished_rx);
        }
        let acceptor = tokio::spawn(accept(
            listener,
            io_threads,
            (limits.max_connections, table),
            stop_rx,
        ));
        Ok(Self {
            stop,
            acceptor,
            finished,
        })
    }

    /// Stops accepting (the listening socket closes), asks every open
    /// connection to finish its in-flight requests and close, and waits
    /// until all have.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.acceptor.await;
        for thread in self.finished {
            let _ = thread.await;
        }
    }
}

/// How often an accept failure that repeats is logged.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// Connections the front may hold beyond the cap while the idle ones it
/// closed to make room are going (each takes a moment on its own thread).
const EVICTION_SLACK: usize = 16;

/// Accepts until stopped, giving each connection to the I/O thread
/// [`placement::place`] picks. With `max_connections` open, an idle one is
/// closed to make room (`table`); when none is idle, the new connection is
/// closed at once (counted), so descriptors stay free for engines and the
/// mesh.
async fn accept(
    listener: TcpListener,
    io_threads: Vec<IoThreadHandle>,
    (max_connections, table): (usize, Arc<ConnTable>),
    mut stop: watch::Receiver<bool>,
) {
    let mut warned: Option<std::time::Instant> = None;
    let clocks: Vec<&BusyClock> = io_threads
        .iter()
        .map(|io_thread| io_thread.busy.as_ref())
        .collect();
    let mut sampler = BusySampler::new(&clocks);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(err) if is_per_connection(&err) => continue,
            Err(err) => {
                if warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARN_EVERY) {
                    tracing::warn!(error = %err, "accept failed; pausing (repeats are logged every 10 s)");
                    warned = Some(std::time::Instant::now());
                }
                crate::telemetry::client_connection_closed("accept_error");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let open: usize = io_threads
            .iter()
            .map(|l| l.open.load(Ordering::Relaxed))
            .sum();
        if open >= max_connections
            && (open >= max_connections.saturating_add(EVICTION_SLACK) || !table.evict_one())
        {
            crate::telemetry::client_connection_closed("limit");
            drop(stream);
            continue;
        }
        let busy = sampler.busy(clocks.iter().copied());
        let loads: Vec<IoThreadLoad> = io_threads
            .iter()
            .zip(busy)
            .map(|(io_thread, busy)| IoThreadLoad {
                busy,
                open: io_thread.open.load(Ordering::Relaxed),
            })
            .collect();
        let Some(io_thread) = placement::place(&loads).and_then(|i| io_threads.get(i)) else {
            break;
        };
        match stream.into_std() {
            Ok(stream) => {
                // Counted here, not when the thread picks it up, so a burst
                // of connections spreads before any thread has run.
                io_thread.open.fetch_add(1, Ordering::Relaxed);
                if io_thread.connections.send(stream).is_err() {
                    io_thread.open.fetch_sub(1, Ordering::Relaxed);
                    tracing::error!("an I/O thread is gone; dropping a connection");
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot hand over a connection"),
        }
    }
    // Dropping the listener closes the port; dropping the thread handles tells each
    // thread no more connections come.
}

/// What one I/O thread needs.
struct IoThread<F> {
    make: F,
    limits: FrontLimits,
    stop: watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
    table: Arc<ConnTable>,
}

impl<F> IoThread<F> {
    async fn run<S: ConnectionService>(
        self,
        mut incoming: mpsc::UnboundedReceiver<std::net::TcpStream>,
    ) where
        F: ServiceFactory<S>,
    {
        // Every connection holds a receiver; `closed()` resolves when the
        // last one is gone.
        let (all_closed, open_guard) = watch::channel(());
        let anchor = tokio::spawn(anchor_timer_wheel());
        while let Some(stream) = incoming.recv().await {
            let counted = OpenConnection(self.open.clone());
            let peer = stream.peer_addr();
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    let unknown = SocketAddr::from(([0, 0, 0, 0], 0));
                    let activity = Activity::new();
                    let listed = self.table.register(activity.clone());
                    let connection = serve_connection(
                        stream,
                        Counted::new((self.make)(peer.unwrap_or(unknown)), activity),
                        self.limits,
                        self.stop.clone(),
                        (open_guard.clone(), counted, listed),
                    );
                    tokio::spawn(connection);
                }
                Err(err) => tracing::warn!(error = %err, "cannot take over a connection"),
            }
        }
        drop(open_guard);
        all_closed.closed().await;
        anchor.abort();
    }
}

/// How far ahead an I/O thread always has a timer pending (see
/// [`anchor_timer_wheel`]). Shorter than any deadline a request arms.
const TIMER_ANCHOR: Duration = Duration::from_millis(500);

/// Keeps a timer pending on this thread at most [`TIMER_ANCHOR`] ahead.
///
/// Why: every proxied request arms a deadline (the attempt's `timeout_at`)
/// and drops it when the answer comes. tokio wakes its driver (an eventfd
/// write, then an extra `epoll_wait` return) whenever a new timer is due
/// before the driver's next planned wake-up, and with no other timer
/// pending, every request's deadline was: two syscalls per request. With
/// this timer pending, deadlines of a second or more are never the
/// earliest, so arming one costs no syscall; the price is two wake-ups a
/// second on an idle thread.
async fn anchor_timer_wheel() {
    loop {
        tokio::time::sleep(TIMER_ANCHOR).await;
    }
}

/// One open connection of an I/O thread: uncounted when dropped.
struct OpenConnection(Arc<AtomicUsize>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resolves once the stop flag is set or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Errors that concern only the connection being accepted.
fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one client connection (HTTP/1.1, or HTTP/2 with prior
/// knowledge) until it closes, or until its guard closes it: gracefully
/// once the stop flag is set (in-flight requests finish, idle keep-alive
/// closes) or when it sat idle too long or was picked to make room
/// (`guard`). `_open` is held for the connection's lifetime (see
/// [`IoThread::run`]).
async fn serve_connection<S: ConnectionService>(
    stream: TcpStream,
    app: Counted<S>,
    limits: FrontLimits,
    stop: watch::Receiver<bool>,
    _open: (watch::Receiver<()>, OpenConnection, table::Registration),
) {
    // Responses are written whole; never hold a small last segment back.
    let _ = stream.set_nodelay(true);
    let activity = app.activity().clone();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The guard times out a connection with no request in flight, in every
    // protocol state; hyper's own HTTP/1 header timer would only start at
    // the first byte and count the same connection twice.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_READ_BUFFER_BYTES);
    // HTTP/2: bounded streams; hyper's h2 also bounds pending and locally
    // reset streams (rapid-reset protection). Pings find a peer that is
    // gone while its streams are open.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_streams)
        .keep_alive_interval(Some(limits.header_timeout))
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(stream), app);
    tokio::pin!(connection);
    let guard::Signals {
        mut graceful,
        mut abort,
    } = guard::spawn(activity, limits.header_timeout, stop);
    let mut closing = false;
    loop {
        tokio::select! {
            biased;
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::trace!(error = %err, "connection ended with an error");
                }
                return;
            }
            _ = &mut graceful, if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = &mut abort => return,
        }
    }
}

/// hyper's HTTP/1 read buffer per connection, which bounds two things:
/// the largest request head (32 KiB, nginx's default of 4 × 8 KiB header
/// buffers; larger heads get 431), and how much of a body one poll of the
/// connection reads — hyper reads up to 16 buffers per poll, so with its
/// default (~400 KiB) a fast 60 MB upload held its I/O thread for 160 ms
/// at a time (debug build) and stalled every stream sharing it; at 32 KiB
/// a poll reads at most 512 KiB.
pub const MAX_READ_BUFFER_BYTES: usize = 32 * 1024;

/// How long an HTTP/2 client has to answer a keep-alive ping.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use axum::routing::get;

    use super::*;

    /// A router that answers with the name of the thread that served it,
    /// after `delay_ms` from the query (`/?delay_ms=200`), or after
    /// keeping its thread busy for `busy_ms` (`/?busy_ms=300`: the thread
    /// is blocked, as a thread doing that much work would be).
    fn app() -> axum::Router {
        axum::Router::new().route(
            "/",
            get(
                |query: axum::extract::Query<BTreeMap<String, u64>>| async move {
                    if let Some(ms) = query.get("delay_ms") {
                        tokio::time::sleep(Duration::from_millis(*ms)).await;
                    }
                    if let Some(ms) = query.get("busy_ms") {
                        std::thread::sleep(Duration::from_millis(*ms));
                    }
                    std::thread::current().name().unwrap_or("?").to_string()
                },
            ),
        )
    }

    async fn start(threads: usize) -> (IoThreads, String) {
        start_with(threads, FrontLimits::default()).await
    }

    async fn start_with(threads: usize, limits: FrontLimits) -> (IoThreads, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = hyper_util::service::TowerToHyperService::new(app());
        let io = IoThreads::start(listener, threads, limits, move |_peer| service.clone()).unwrap();
        (io, url)
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    #[tokio::test]
    async fn a_quiet_thread_takes_new_connections_and_a_busy_one_hands_them_on() {
        let (io, url) = start(2).await;
        // Four keep-alive connections, opened while the others stay open,
        // on an idle replica: the first thread takes them all. The pauses
        // let the acceptor measure each thread's busyness between them
        // (a thread whose parks went uncounted would look busy).
        let clients: Vec<reqwest::Client> = (0..4).map(|_| client()).collect();
        let mut served_by: BTreeMap<String, usize> = BTreeMap::new();
        for client in &clients {
            tokio::time::sleep(Duration::from_millis(80)).await;
            let name = client.get(&url).send().await.unwrap().text().await.unwrap();
            *served_by.entry(name).or_default() += 1;
        }
        assert_eq!(
            served_by,
            BTreeMap::from([("shoal-io-0".to_string(), 4)]),
            "a quiet thread takes every new connection"
        );
        // A connection stays on its thread for its next requests.
        for client in &clients {
            let again = client.get(&url).send().await.unwrap().text().await.unwrap();
            assert_eq!(again, "shoal-io-0");
        }
        // Keep the first thread busy; a connection opened meanwhile goes to
        // the second, which answers at once.
        let busy = tokio::spawn({
            let client = clients[0].clone();
            let url = format!("{url}/?busy_ms=600");
            async move { client.get(url).send().await?.text().await }
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        let fresh = client();
        let name = fresh.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(name, "shoal-io-1", "a busy thread hands new connections on");
        assert_eq!(busy.await.unwrap().unwrap(), "shoal-io-0");
        drop(clients);
        drop(fresh);
        io.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_finishes_in_flight_requests_then_refuses_connections() {
        let (io, url) = start(2).await;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let slow = tokio::spawn({
            let client = client.clone();
            let url = format!("{url}/?delay_ms=300");
            async move { client.get(url).send().await?.text().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        io.shutdown().await;
        let answer = slow.await.unwrap().expect("the in-flight request finishes");
        assert!(answer.starts_with("shoal-io-"), "{answer}");
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "shutdown waited for the in-flight request"
        );
        let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
        assert!(
            fresh.get(&url).send().await.is_err(),
            "the listener is closed after shutdown"
        );
    }

    /// Reads from `stream` until the server closes it; how long that took.
    async fn time_to_close(stream: &mut TcpStream) -> Duration {
        use tokio::io::AsyncReadExt;
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        started.elapsed()
    }

    #[tokio::test]
    async fn a_connection_idle_for_the_header_timeout_closes_and_a_busy_one_does_not() {
        use tokio::io::AsyncWriteExt;
        let limits = FrontLimits {
            header_timeout: Duration::from_millis(300),
            ..FrontLimits::default()
        };
        let (io, url) = start_with(1, limits).await;
        let addr = url.trim_start_matches("http://").to_string();
        // A request answered after 3 header timeouts is not cut: the rule
        // is about connections with nothing in flight.
        let slow = client()
            .get(format!("{url}/?delay_ms=900"))
            .send()
            .await
            .unwrap();
        assert_eq!(slow.status(), 200);
        // A connection that sends nothing, and a keep-alive one after its
        // answer, are closed once the timeout passes.
        let mut silent = TcpStream::connect(&addr).await.unwrap();
        let mut kept = TcpStream::connect(&addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let (silent_after, kept_after) =
            tokio::join!(time_to_close(&mut silent), time_to_close(&mut kept));
        for after in [silent_after, kept_after] {
            assert!(
                after >= Duration::from_millis(250),
                "closed after {after:?}"
            );
            assert!(after < Duration::from_secs(5), "closed after {after:?}");
        }
        io.shutdown().await;
    }
}
