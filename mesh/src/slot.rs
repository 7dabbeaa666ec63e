//! The per-worker handle the router holds: its own slot as atomics, and the
//! rest of the fleet as an immutable view swapped in by the mesh.
//!
//! Booking and releasing touch only this replica's atomics (the same cost
//! with or without a mesh: a mesh-off replica holds a [`WorkerSlot::detached`]
//! slot). Reading the fleet load loads one `ArcSwap` pointer (no lock, no
//! allocation) and adds the own atomics to the remote sums the mesh
//! recomputed when the last frame arrived. The sync task reads the own
//! atomics every sync interval and pushes what changed.
//!
//! Work since the poll: the slot keeps a lifetime `dispatched` counter that
//! never leaves this process, and a `since_base` — the value `dispatched`
//! had when the freshest snapshot this replica knows was taken. Its own
//! `dispatched_since_poll` is the difference; the fleet value is the sum of
//! every live incarnation's own difference, so no replica ever compares its
//! total with another's (a restarted or renamed replica has no lifetime
//! history to compare).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use shoal_proto::{EngineKind, EngineLoad, LoadCounts, LoadFigures};

use crate::bell::ChangeBell;
use crate::identity::unix_millis;
use crate::state::SnapshotValue;

/// This replica's counters for one worker.
#[derive(Debug, Default)]
pub(crate) struct OwnCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) tokens: AtomicU64,
    pub(crate) pending_prefill: AtomicU64,
    /// Token-work ever dispatched by this incarnation (local only).
    pub(crate) dispatched: AtomicU64,
    /// `dispatched` when the freshest known snapshot was taken.
    pub(crate) since_base: AtomicU64,
    /// Poll time (ms) of that snapshot; 0 before the first.
    pub(crate) basis_ms: AtomicU64,
}

impl OwnCounters {
    // `#[inline]` here and on the readers below: the router reads these for
    // every candidate of every selection, from another crate; out of line,
    // the counts came back through the stack in a shape that stalled store
    // forwarding (half of a fleet-view read at 1,024 workers).
    #[inline]
    pub(crate) fn read(&self) -> LoadCounts {
        // `since_base` is a past value of `dispatched`; reading it second
        // can only make the difference smaller, and it saturates at 0.
        let dispatched = self.dispatched.load(Ordering::Relaxed);
        LoadCounts {
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            pending_prefill: self.pending_prefill.load(Ordering::Relaxed),
            dispatched_since_poll: dispatched
                .saturating_sub(self.since_base.load(Ordering::Relaxed)),
        }
    }

    /// Counts from a newer snapshot on: `base` is what `dispatched` was
    /// when it was taken. Never moves the base backwards.
    pub(crate) fn rebase(&self, base: u64, basis_ms: u64) {
        // A base is a past value of the lifetime counter, never ahead of it.
        debug_assert!(
            base <= self.dispatched.load(Ordering::Relaxed),
            "rebased past the dispatched work"
        );
        self.since_base.fetch_max(base, Ordering::Relaxed);
        self.basis_ms.fetch_max(basis_ms, Ordering::Relaxed);
    }
}

/// Time buckets a dispatch history's span is cut into; a bucket keeps its
/// first and its latest sample, so memory is bounded whatever the span or
/// the sampling rate (at most [`MAX_HISTORY_SAMPLES`], about 2 KiB a
/// worker), and a time just after a sample is answered as precisely as
/// the sampling allows.
pub(crate) const HISTORY_BUCKETS: u64 = 64;

/// Most samples a history holds: two per bucket over the span, plus the
/// buckets at its two edges and the sample before its start.
pub(crate) const MAX_HISTORY_SAMPLES: usize = 2 * (HISTORY_BUCKETS as usize + 2) + 1;

/// How far back a dispatch history reaches, and the width of its buckets
/// (the span over [`HISTORY_BUCKETS`]): memory is bounded by the bucket
/// count, reach by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryWindow {
    /// Reach, ms: a poll time this far back is answered exactly.
    pub(crate) span_ms: u64,
    /// Bucket width, ms.
    pub(crate) step_ms: u64,
}

impl HistoryWindow {
    /// A window reaching `span` back.
    pub(crate) fn new(span: Duration) -> Self {
        let span_ms = u64::try_from(span.as_millis()).unwrap_or(u64::MAX).max(1);
        Self {
            span_ms,
            step_ms: span_ms.div_ceil(HISTORY_BUCKETS),
        }
    }
}

/// What the own `dispatched` counter was at a past time, as the history
/// knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dispatched {
    /// A value sampled before that time (a lower bound of the counter then,
    /// so the work counted since is an over-estimate of at most a step).
    Then(u64),
    /// The time is older than the history reaches: the oldest sample it
    /// holds (the counter at or after the window's start). Counting from
    /// it undercounts the work between the poll and that sample, but keeps
    /// the count within the window's work: bounded, where keeping the
    /// older base would let it grow with every booking.
    Oldest(u64),
}

/// Recent values of the own `dispatched` counter over a [`HistoryWindow`],
/// so a snapshot learned from a peer rebases to what this replica had
/// dispatched when the engine was polled, not when the news arrived.
#[derive(Debug, Default)]
pub(crate) struct DispatchHistory {
    samples: VecDeque<(u64, u64)>,
    /// A sample was dropped: the history no longer reaches the counter's
    /// start, so a time before the oldest sample is unknown.
    truncated: bool,
}

impl DispatchHistory {
    /// A history that knows the counter was 0 at `created_ms`.
    pub(crate) fn starting_at(created_ms: u64) -> Self {
        Self {
            samples: VecDeque::from([(created_ms, 0)]),
            truncated: false,
        }
    }

    /// Records `value` at `now_ms` if it changed since the last sample
    /// (within a bucket, the latest sample replaces the one after the
    /// bucket's first); forgets samples no time in the window needs.
    pub(crate) fn sample(&mut self, now_ms: u64, value: u64, window: HistoryWindow) {
        // A clock that went back records nothing until it passes again.
        if let Some(&(t, v)) = self.samples.back()
            && (v == value || now_ms < t)
        {
            return;
        }
        let bucket = |t: u64| t / window.step_ms;
        let n = self.samples.len();
        let in_bucket = |i: usize| {
            self.samples
                .get(i)
                .is_some_and(|&(t, _)| bucket(t) == bucket(now_ms))
        };
        if n >= 2 && in_bucket(n - 2) && in_bucket(n - 1) {
            self.samples[n - 1] = (now_ms, value);
        } else {
            self.samples.push_back((now_ms, value));
        }
        // The oldest sample answers times before the second oldest; once
        // that one is past the window's start, no time in it needs it.
        let start = now_ms.saturating_sub(window.span_ms);
        while self.samples.get(1).is_some_and(|&(t, _)| t <= start)
            || self.samples.len() > MAX_HISTORY_SAMPLES
        {
            self.samples.pop_front();
            self.truncated = true;
        }
    }

    /// The counter at `at_ms`: the value sampled before it (a sample in
    /// the same millisecond may come after the poll, so it is not used),
    /// or the oldest sample when the history does not reach back.
    pub(crate) fn at(&self, at_ms: u64) -> Dispatched {
        match self.samples.iter().rev().find(|&&(t, _)| t < at_ms) {
            Some(&(_, v)) => Dispatched::Then(v),
            None if !self.truncated => Dispatched::Then(0),
            None => Dispatched::Oldest(self.samples.front().map_or(0, |&(_, v)| v)),
        }
    }
}

/// The freshest polled snapshot of a worker, by (poll time, poller).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotView {
    /// Engine family the numbers came from.
    pub source: EngineKind,
    /// The validated signals.
    pub load: EngineLoad,
    /// What they imply for scoring, derived once when the view is built
    /// (not by every selection).
    pub figures: LoadFigures,
    /// Poll time, ms since the Unix epoch, clamped to this replica's clock
    /// plus the skew bound when it was learned.
    pub polled_at_unix_ms: u64,
    /// When the engine was polled, on this replica's monotonic clock: the
    /// poll time's distance from the wall clock at learning, subtracted
    /// from the learning instant. Age is measured from here, so an old
    /// snapshot learned late is old, and a future-stamped one is no younger
    /// than the moment it arrived.
    pub taken_at: Instant,
}

impl SnapshotView {
    /// How old the engine's numbers are at `now`.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.taken_at)
    }
}

/// What the other live replicas contribute to one worker, recomputed by the
/// mesh when frames or membership change.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RemoteView {
    /// Sum over the counted peers' slots.
    pub(crate) counts: LoadCounts,
    /// The freshest snapshot any replica (this one included) polled.
    pub(crate) snapshot: Option<SnapshotView>,
    /// Names of the counted peers that poll this worker, sorted.
    pub(crate) pollers: Arc<[Arc<str>]>,
}

/// Fleet-wide load of one worker, as this replica sees it now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FleetLoad {
    /// Sums over live verified replicas and self.
    pub counts: LoadCounts,
    /// The freshest snapshot any replica polled, however old.
    pub snapshot: Option<SnapshotView>,
}

/// Shared state of one worker key.
#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) key: Arc<str>,
    /// This node's id for the key on the wire (dense, reused after removal).
    pub(crate) id: u32,
    /// Unique per entry ever created here: tells a link that an id now
    /// names another key and must be defined again.
    pub(crate) serial: u64,
    pub(crate) own: OwnCounters,
    /// Set on the first booking: the slot is sent in every full sync from
    /// then on (so a peer holding old values always gets corrected).
    pub(crate) touched: AtomicBool,
    /// This replica polls the worker's load (gossiped for poll ownership).
    pub(crate) polled: AtomicBool,
    pub(crate) remote: ArcSwap<RemoteView>,
    /// The last snapshot this replica polled, with a publish sequence that
    /// grows by one per poll (so links know what they already sent).
    pub(crate) own_snapshot: ArcSwap<Option<(u64, SnapshotValue)>>,
    pub(crate) history: Mutex<DispatchHistory>,
    /// Set with every change the links push, cleared by the round that
    /// reads it: a round reads only the entries that changed (see
    /// `outbox`), not every key.
    pub(crate) dirty: AtomicBool,
    /// Rung on every change the links push (see `bell`).
    pub(crate) bell: Arc<ChangeBell>,
}

impl WorkerEntry {
    pub(crate) fn new(key: Arc<str>, id: u32, serial: u64, bell: Arc<ChangeBell>) -> Self {
        Self {
            key,
            id,
            serial,
            own: OwnCounters::default(),
            touched: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            remote: ArcSwap::from_pointee(RemoteView::default()),
            own_snapshot: ArcSwap::from_pointee(None),
            history: Mutex::new(DispatchHistory::starting_at(unix_millis())),
            dirty: AtomicBool::new(false),
            bell,
        }
    }

    /// Records that something the links push changed and rings the bell.
    /// Release: a round that sees the flag (and clears it with Acquire)
    /// reads the values written before it.
    #[inline]
    pub(crate) fn changed(&self) {
        self.dirty.store(true, Ordering::Release);
        self.bell.ring();
    }

    /// Sets the change flag again without ringing: a round that could not
    /// send what it read leaves it for the next round.
    pub(crate) fn keep_changed(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Clears the change flag; true if it was set.
    pub(crate) fn take_changed(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) && self.dirty.swap(false, Ordering::AcqRel)
    }

    /// The replicas that poll this worker: the counted peers that say so,
    /// and `me` if this node does. Poll ownership is decided among them.
    pub(crate) fn pollers(&self, me: &Arc<str>) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self.remote.load().pollers.to_vec();
        if self.polled.load(Ordering::Relaxed) {
            names.push(me.clone());
            names.sort();
            names.dedup();
        }
        names
    }

    pub(crate) fn history(&self) -> std::sync::MutexGuard<'_, DispatchHistory> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Stamp taken when a poll starts: pass it back with the poll's result so
/// the snapshot is dated, and the own count rebased, to the poll's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollStamp {
    /// Poll start, ms since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Poll start on the monotonic clock.
    pub started: Instant,
    /// This incarnation's lifetime dispatched token-work at poll start.
    pub dispatched: u64,
}

/// The router's handle on one worker: book work in this replica's own slot
/// and read the fleet-wide load. Cheap to clone; hold it for the worker's
/// lifetime.
#[derive(Debug, Clone)]
pub struct WorkerSlot {
    pub(crate) entry: Arc<WorkerEntry>,
}

impl WorkerSlot {
    /// A slot that belongs to no mesh: the ledger of a replica that routes
    /// alone. Same booking code, same reads (the fleet is just this slot).
    pub fn detached(key: &str) -> Self {
        Self {
            // A bell nobody listens to: ringing it only sets a flag.
            entry: Arc::new(WorkerEntry::new(
                Arc::from(key),
                u32::MAX,
                0,
                Arc::default(),
            )),
        }
    }

    /// The worker key (its base URL).
    pub fn key(&self) -> &str {
        &self.entry.key
    }

    /// Books one request of `prompt_tokens` prompt and `token_work` total
    /// token-work in the own slot; dropping the booking releases it.
    pub fn book(&self, prompt_tokens: u64, token_work: u64) -> SlotBooking {
        if !self.entry.touched.load(Ordering::Relaxed) {
            self.entry.touched.store(true, Ordering::Relaxed);
        }
        let own = &self.entry.own;
        own.requests.fetch_add(1, Ordering::Relaxed);
        own.tokens.fetch_add(token_work, Ordering::Relaxed);
        own.pending_prefill
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        own.dispatched.fetch_add(token_work, Ordering::Relaxed);
        self.entry.changed();
        SlotBooking {
            entry: self.entry.clone(),
            token_work,
            pending_prefill: prompt_tokens,
        }
    }

    /// This replica's own counts now.
    #[inline]
    pub fn own(&self) -> LoadCounts {
        self.entry.own.read()
    }

    /// Poll time (ms) of the snapshot the own `dispatched_since_poll`
    /// counts from; 0 before the first.
    pub fn basis_polled_at_unix_ms(&self) -> u64 {
        self.entry.own.basis_ms.load(Ordering::Relaxed)
    }

    /// The fleet-wide load now: no lock, no allocation.
    #[inline]
    pub fn fleet(&self) -> FleetLoad {
        let own = self.entry.own.read();
        let remote = self.entry.remote.load();
        FleetLoad {
            counts: own + remote.counts,
            snapshot: remote.snapshot,
        }
    }

    /// Says whether this replica polls the worker's load endpoint. Poll
    /// ownership is shared only among the replicas that do, so a replica
    /// that stops polling (worker removed, `--worker-load-source none`)
    /// must say so.
    pub fn set_polled(&self, polled: bool) {
        if self.entry.polled.swap(polled, Ordering::Relaxed) != polled {
            self.entry.changed();
        }
    }

    /// Call when a poll of this worker starts; pass the stamp back with
    /// the poll's result ([`crate::Mesh::publish_snapshot`], or
    /// [`WorkerSlot::record_own_poll`] without a mesh).
    pub fn poll_stamp(&self) -> PollStamp {
        PollStamp {
            polled_at_unix_ms: unix_millis(),
            started: Instant::now(),
            dispatched: self.entry.own.dispatched.load(Ordering::Relaxed),
        }
    }

    /// A mesh-off replica polled the engine successfully: count its own
    /// work from the poll's start on.
    pub fn record_own_poll(&self, stamp: &PollStamp) {
        self.entry
            .own
            .rebase(stamp.dispatched, stamp.polled_at_unix_ms);
    }
}

/// One request's claim on a worker's own slot; dropping it releases the
/// claim (requests and in-flight tokens; work since the poll stays until
/// the engine reports it).
#[derive(Debug)]
pub struct SlotBooking {
    entry: Arc<WorkerEntry>,
    token_work: u64,
    pending_prefill: u64,
}

impl SlotBooking {
    /// The first response byte arrived: the prompt is no longer queued.
    pub fn first_byte(&mut self) {
        let pending = std::mem::take(&mut self.pending_prefill);
        if pending > 0 {
            let before = self
                .entry
                .own
                .pending_prefill
                .fetch_sub(pending, Ordering::Relaxed);
            debug_assert!(before >= pending, "pending prefill released twice");
            self.entry.changed();
        }
    }
}

impl Drop for SlotBooking {
    fn drop(&mut self) {
        self.first_byte();
        let own = &self.entry.own;
        // Each booking added exactly this; releasing more would wrap the
        // counters to a huge load.
        let requests = own.requests.fetch_sub(1, Ordering::Relaxed);
        let tokens = own.tokens.fetch_sub(self.token_work, Ordering::Relaxed);
        debug_assert!(
            requests >= 1 && tokens >= self.token_work,
            "a booking released more than was booked"
        );
        self.entry.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_releases_once_and_reads_add_remote() {
        let slot = WorkerSlot::detached("http://w:1");
        let mut booking = slot.book(40, 100);
        booking.first_byte();
        booking.first_byte();
        slot.entry.remote.store(Arc::new(RemoteView {
            counts: LoadCounts {
                requests: 2,
                tokens: 50,
                pending_prefill: 7,
                dispatched_since_poll: 1000,
            },
            ..RemoteView::default()
        }));
        let fleet = slot.fleet();
        assert_eq!(
            fleet.counts,
            LoadCounts {
                requests: 3,
                tokens: 150,
                pending_prefill: 7,
                dispatched_since_poll: 1100,
            }
        );
        drop(booking);
        assert_eq!(
            slot.own(),
            LoadCounts {
                requests: 0,
                tokens: 0,
                pending_prefill: 0,
                dispatched_since_poll: 100,
            }
        );
    }

    #[test]
    fn an_own_poll_counts_from_its_start() {
        let slot = WorkerSlot::detached("http://w:1");
        drop(slot.book(0, 100));
        let stamp = slot.poll_stamp();
        drop(slot.book(0, 30)); // routed while the poll was in flight
        slot.record_own_poll(&stamp);
        assert_eq!(slot.own().dispatched_since_poll, 30);
        assert_eq!(slot.basis_polled_at_unix_ms(), stamp.polled_at_unix_ms);
        // An older stamp never moves the base back.
        slot.entry.own.rebase(0, 1);
        assert_eq!(slot.own().dispatched_since_poll, 30);
    }

    #[test]
    fn history_finds_the_value_at_or_before_a_time() {
        let window = HistoryWindow::new(Duration::from_millis(640));
        assert_eq!(window.step_ms, 10);
        let mut h = DispatchHistory::starting_at(50);
        assert_eq!(h.at(10), Dispatched::Then(0), "before the counter existed");
        h.sample(52, 3, window); // the bucket's latest after its first
        h.sample(100, 5, window);
        h.sample(120, 5, window); // unchanged: not stored
        h.sample(140, 9, window);
        h.sample(143, 10, window);
        h.sample(147, 11, window); // replaces 143 (bucket 14 keeps 140, 147)
        assert_eq!(h.at(51), Dispatched::Then(0));
        assert_eq!(h.at(53), Dispatched::Then(3));
        assert_eq!(
            h.at(100),
            Dispatched::Then(3),
            "same millisecond: maybe after"
        );
        assert_eq!(h.at(101), Dispatched::Then(5));
        assert_eq!(h.at(140), Dispatched::Then(5));
        assert_eq!(h.at(145), Dispatched::Then(9), "143 was replaced");
        assert_eq!(h.at(148), Dispatched::Then(11));
        h.sample(130, 12, window); // the clock went back: ignored
        assert_eq!(h.at(10_000), Dispatched::Then(11));
    }

    /// The history reaches back by time, whatever the sampling rate: a
    /// sample every millisecond for ten seconds keeps at most
    /// `MAX_HISTORY_SAMPLES` and still answers any time in the span within
    /// two buckets; older times get the oldest sample.
    #[test]
    fn history_spans_its_window_in_bounded_memory() {
        let window = HistoryWindow::new(Duration::from_secs(3));
        let mut h = DispatchHistory::starting_at(0);
        for t in 1..=10_000u64 {
            h.sample(t, t, window);
            assert!(h.samples.len() <= MAX_HISTORY_SAMPLES);
        }
        assert_eq!(
            h.at(10_001),
            Dispatched::Then(10_000),
            "the newest is exact"
        );
        for back in [1500, 2900] {
            let at = 10_000 - back;
            match h.at(at) {
                Dispatched::Then(v) => {
                    assert!(v < at && v + 2 * window.step_ms >= at, "{v} at {at}")
                }
                other => panic!("{back} ms back: {other:?}"),
            }
        }
        // 5 s back is beyond the span: the oldest sample, itself at or
        // before the window's start (so the work since stays in the span).
        match h.at(5_000) {
            Dispatched::Oldest(v) => assert!(v <= 7_000 && v + 2 * window.step_ms >= 7_000, "{v}"),
            other => panic!("{other:?}"),
        }
    }
}
