//! Which I/O thread a new client connection goes to: fill one thread
//! before waking the next.
//!
//! Why: an I/O thread that is busy only part of the time sleeps in
//! `epoll_wait` whenever its connections are all waiting, and each sleep
//! and wake-up is a context switch (~2–5 µs of kernel time here). Spread
//! evenly, a light load keeps every thread half idle and pays that switch
//! on most requests: measured against a fixed-response backend at 8
//! connections, two evenly loaded threads made 0.67 voluntary switches
//! per request and cost 20–22 µs of CPU per request; the same load on one
//! thread cost 18 µs, as nginx (whose kernel hands a quiet worker's
//! connections to one worker) did. So a new connection goes to the first
//! thread that is less than [`SPREAD_AT_BUSY`] busy, and only when every
//! thread is that busy to the least busy one: threads join in as the load
//! needs them. A connection stays on its thread for its life, so
//! [`FILL_MAX_OPEN`] also bounds how many a thread takes on while it looks
//! idle: a burst of connections arrives faster than busyness is measured,
//! and a thread serving that many connections seldom finds all of them
//! waiting at once, so spreading past it costs few sleeps. (With no such
//! bound, 64 connections opened at once all stayed on one thread, which
//! then capped throughput at one core.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A thread at least this busy (fraction of wall time not parked) takes
/// no new connection while another thread is less busy than this.
pub const SPREAD_AT_BUSY: f64 = 0.5;

/// A thread with this many open connections counts as busy whatever its
/// measured time: a burst of new connections spreads.
pub const FILL_MAX_OPEN: usize = 32;

/// How long the acceptor measures a thread's busyness over before it
/// trusts a new figure (a shorter window is mostly noise of single
/// requests).
const SAMPLE_WINDOW: Duration = Duration::from_millis(50);

/// Time one I/O thread spent not parked, kept by the runtime's park and
/// unpark hooks (two clock reads per sleep, none per request).
#[derive(Debug)]
pub struct BusyClock {
    origin: Instant,
    /// Nanoseconds awake before the current awake span.
    awake_ns: AtomicU64,
    /// Start of the current awake span (ns since `origin`, plus one so 0
    /// means parked).
    awake_since: AtomicU64,
}

impl BusyClock {
    /// A clock for a thread that starts awake now.
    pub fn new(origin: Instant) -> Self {
        let clock = Self {
            origin,
            awake_ns: AtomicU64::new(0),
            awake_since: AtomicU64::new(0),
        };
        clock.unparked();
        clock
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The thread woke up (the runtime's `on_thread_unpark`).
    pub fn unparked(&self) {
        self.awake_since
            .store(self.now_ns().saturating_add(1), Ordering::Relaxed);
    }

    /// The thread is going to sleep (the runtime's `on_thread_park`).
    pub fn parked(&self) {
        let since = self.awake_since.swap(0, Ordering::Relaxed);
        if since > 0 {
            let span = self.now_ns().saturating_sub(since - 1);
            self.awake_ns.fetch_add(span, Ordering::Relaxed);
        }
    }

    /// Nanoseconds awake so far, the current span included (a thread
    /// blocked inside a task is busy, not idle).
    pub fn awake_total(&self) -> u64 {
        let since = self.awake_since.load(Ordering::Relaxed);
        let current = match since {
            0 => 0,
            s => self.now_ns().saturating_sub(s - 1),
        };
        self.awake_ns
            .load(Ordering::Relaxed)
            .saturating_add(current)
    }
}

/// What the acceptor knows of one thread when it places a connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoThreadLoad {
    /// Fraction of recent wall time the thread was awake, 0..=1.
    pub busy: f64,
    /// Connections it serves now.
    pub open: usize,
}

/// The I/O thread a new connection goes to: the first that is neither
/// [`SPREAD_AT_BUSY`] busy nor holding [`FILL_MAX_OPEN`] connections, else
/// the least busy (fewest connections on a tie); `None` without threads.
pub fn place(io_threads: &[IoThreadLoad]) -> Option<usize> {
    let has_room = |l: &IoThreadLoad| l.busy < SPREAD_AT_BUSY && l.open < FILL_MAX_OPEN;
    io_threads.iter().position(has_room).or_else(|| {
        let load = |l: &IoThreadLoad| (l.busy.min(1.0), l.open);
        (0..io_threads.len()).min_by(|&a, &b| {
            let (ba, oa) = load(&io_threads[a]);
            let (bb, ob) = load(&io_threads[b]);
            ba.total_cmp(&bb).then(oa.cmp(&ob))
        })
    })
}

/// The acceptor's running measure of each thread's busyness: the awake
/// fraction over the last window of at least [`SAMPLE_WINDOW`].
#[derive(Debug)]
pub struct BusySampler {
    /// Per I/O thread: (when sampled, awake total then, fraction last measured).
    samples: Vec<(Instant, u64, f64)>,
}

impl BusySampler {
    /// A sampler for these clocks, starting now with every thread idle.
    pub fn new(clocks: &[&BusyClock]) -> Self {
        let now = Instant::now();
        Self {
            samples: clocks.iter().map(|c| (now, c.awake_total(), 0.0)).collect(),
        }
    }

    /// Each clock's busy fraction, refreshed where a window has passed.
    pub fn busy<'a>(&mut self, clocks: impl Iterator<Item = &'a BusyClock>) -> Vec<f64> {
        let now = Instant::now();
        self.samples
            .iter_mut()
            .zip(clocks)
            .map(|((at, total, fraction), clock)| {
                let elapsed = now.saturating_duration_since(*at);
                if elapsed >= SAMPLE_WINDOW {
                    let awake = clock.awake_total();
                    let span = elapsed.as_nanos().max(1) as f64;
                    *fraction = (awake.saturating_sub(*total) as f64 / span).clamp(0.0, 1.0);
                    *at = now;
                    *total = awake;
                }
                *fraction
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_thread(busy: f64, open: usize) -> IoThreadLoad {
        IoThreadLoad { busy, open }
    }

    #[test]
    fn a_quiet_first_thread_takes_every_connection() {
        assert_eq!(place(&[io_thread(0.0, 0), io_thread(0.0, 0)]), Some(0));
        assert_eq!(
            place(&[io_thread(0.3, FILL_MAX_OPEN - 1), io_thread(0.0, 0)]),
            Some(0)
        );
    }

    #[test]
    fn a_busy_or_full_thread_hands_new_connections_to_the_next() {
        assert_eq!(
            place(&[io_thread(0.7, 8), io_thread(0.1, 0), io_thread(0.0, 0)]),
            Some(1)
        );
        assert_eq!(
            place(&[io_thread(0.0, FILL_MAX_OPEN), io_thread(0.0, 0)]),
            Some(1)
        );
    }

    #[test]
    fn when_every_thread_is_busy_the_least_busy_takes_it() {
        assert_eq!(
            place(&[io_thread(0.9, 8), io_thread(0.6, 30), io_thread(0.8, 1)]),
            Some(1)
        );
        assert_eq!(
            place(&[io_thread(0.9, 8), io_thread(0.9, 3)]),
            Some(1),
            "tie: fewer open"
        );
        assert_eq!(place(&[]), None);
    }

    #[test]
    fn the_clock_counts_awake_time_and_not_parked_time() {
        let clock = BusyClock::new(Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        clock.parked();
        let awake = clock.awake_total();
        assert!(awake >= 20_000_000, "awake {awake} ns");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(clock.awake_total(), awake, "parked time is not counted");
        clock.unparked();
        std::thread::sleep(Duration::from_millis(10));
        assert!(
            clock.awake_total() >= awake + 10_000_000,
            "the current span counts"
        );
    }

    #[test]
    fn the_sampler_reports_the_awake_fraction_of_its_window() {
        let busy = BusyClock::new(Instant::now());
        let idle = BusyClock::new(Instant::now());
        idle.parked();
        let mut sampler = BusySampler::new(&[&busy, &idle]);
        assert_eq!(sampler.busy([&busy, &idle].into_iter()), vec![0.0, 0.0]);
        std::thread::sleep(SAMPLE_WINDOW + Duration::from_millis(10));
        let fractions = sampler.busy([&busy, &idle].into_iter());
        assert!(fractions[0] > 0.9, "{fractions:?}");
        assert!(fractions[1] < 0.01, "{fractions:?}");
    }
}
