//! Per-tenant usage, summed over the fleet: what each tenant was admitted
//! in the last seconds and holds in flight now, so a tenant's limit holds
//! once across every replica instead of once per replica.
//!
//! Each incarnation writes only its own [`Series`] per tenant: requests
//! and tokens admitted per second of its clock, and requests in flight.
//! Every round carries the seconds that changed since the last one, as
//! absolute values ([`Frame::Tenants`]); a new link is sent every live
//! second (see `outbox`). Peers keep the latest values per (incarnation,
//! tenant, second), and a tenant's fleet-wide window is this node's
//! series plus those of the counted peers: exact sums, like the in-flight
//! counts, with no store. The sum is kept as it changes (`aggregate`), so
//! admission reads one running total. A peer that stops counting (its link is gone,
//! it left, or a newer run of it took over) stops counting here at once.
//!
//! Staleness: a peer's admissions reach this node within about one push
//! gap plus delivery (the convergence lag), so R replicas admitting at
//! once can each admit what remains of a tenant's allowance before they
//! hear of the others: the overshoot is at most what the other R − 1
//! replicas admit within that time (the router documents the bound and
//! `tenant-bench` measures it).
//!
//! Clocks: seconds are the writer's. A peer's second ahead of this node's
//! clock counts at once (usage is never hidden); one too far from it
//! either way is dropped and counted.
//!
//! [`Frame::Tenants`]: shoal_proto::frames::Frame::Tenants

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use shoal_proto::frames::{
    Frame, FrameError, MAX_TENANT_NAME_BYTES, MAX_TENANT_SECONDS, MAX_TENANTS_PER_FRAME,
    TenantEntry, TenantsFrame, encode_prefixed,
};

mod aggregate;
mod series;

use aggregate::{AHEAD_SECS, Aggregate, Delta};
use series::Series;
pub use series::Usage;

use crate::bell::ChangeBell;
use crate::identity::Incarnation;

/// Longest window, in seconds, a tenant's usage is kept for.
pub const MAX_WINDOW_SECS: u64 = MAX_TENANT_SECONDS as u64;

/// The window a book sums over until told otherwise.
const DEFAULT_WINDOW_SECS: u64 = MAX_WINDOW_SECS;

/// How far a peer's second (on this clock) may lie behind the window, or
/// ahead of now, and still be kept: further is stale or broken.
const KEEP_BEYOND_WINDOW_SECS: u64 = AHEAD_SECS;

/// A peer's clock offset is re-estimated when a frame says it moved by at
/// least this much (a second either way is the frame's own rounding).
const OFFSET_STEP_SECS: i64 = 2;

/// A tenant's fleet-wide usage over the window, second by second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWindow {
    /// The window's first second (since the Unix epoch).
    pub first_sec: u64,
    /// Usage per second, oldest first (one entry per second of the
    /// window; a peer's seconds ahead of this clock count in the newest).
    pub seconds: Vec<Usage>,
    /// Requests in flight now.
    pub in_flight: u64,
}

impl TenantWindow {
    /// The window's total.
    pub fn total(&self) -> Usage {
        let mut total = Usage::default();
        for second in &self.seconds {
            total.add_saturating(*second);
        }
        total
    }
}

/// A tenant's fleet-wide totals over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantTotals {
    /// Usage over the window.
    pub used: Usage,
    /// Requests in flight now.
    pub in_flight: u64,
}

/// Whether a series is being added to the fleet sums or taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    In,
    Out,
}

#[derive(Debug)]
struct Book {
    /// This incarnation's usage, by tenant.
    own: HashMap<Arc<str>, Series>,
    /// Own tenants changed since the last round: the seconds touched (or
    /// none, for an in-flight change). Kept only with a mesh (a bell).
    dirty: HashMap<Arc<str>, Vec<u64>>,
    /// What each peer said, by tenant, its seconds mapped onto this clock.
    peers: HashMap<Incarnation, HashMap<Arc<str>, Series>>,
    /// Per peer: this clock's second minus the peer's, as first estimated.
    offsets: HashMap<Incarnation, i64>,
    /// The peers whose usage counts (verified links, newest runs).
    counted: HashSet<Incarnation>,
    /// Tenants this node knows (from its tenants file); a peer's others
    /// are dropped. `None`: every name is taken (tests, benches).
    known: Option<HashSet<Arc<str>>>,
    /// Seconds the fleet sums cover.
    window_secs: u64,
    /// Per tenant, own and counted peers' usage summed.
    fleet: HashMap<Arc<str>, Aggregate>,
    /// The second idle entries were last swept in.
    swept_sec: u64,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            own: HashMap::new(),
            dirty: HashMap::new(),
            peers: HashMap::new(),
            offsets: HashMap::new(),
            counted: HashSet::new(),
            known: None,
            window_secs: DEFAULT_WINDOW_SECS,
            fleet: HashMap::new(),
            swept_sec: 0,
        }
    }
}

impl Book {
    /// `tenant`'s fleet sum, moved to `now_sec` (made if missing).
    fn aggregate(&mut self, tenant: &Arc<str>, now_sec: u64) -> &mut Aggregate {
        let window = self.window_secs;
        let agg = self
            .fleet
            .entry(tenant.clone())
            .or_insert_with(|| Aggregate::new(window, now_sec));
        agg.advance(now_sec);
        agg
    }

    /// Adds every second and the in-flight count of `series` to
    /// `tenant`'s sum, or takes them out.
    fn count_series(&mut self, tenant: &Arc<str>, series: &Series, now_sec: u64, how: Count) {
        let agg = self.aggregate(tenant, now_sec);
        for (sec, usage) in &series.seconds {
            let (old, new) = match how {
                Count::In => (Usage::default(), *usage),
                Count::Out => (*usage, Usage::default()),
            };
            agg.apply(*sec, Delta { old, new });
        }
        agg.in_flight = match how {
            Count::In => agg.in_flight.saturating_add(series.in_flight),
            Count::Out => agg.in_flight.saturating_sub(series.in_flight),
        };
    }

    /// Adds every series of peer `inc` to the sums, or takes them out.
    fn count_peer(&mut self, inc: &Incarnation, now_sec: u64, how: Count) {
        let Some(tenants) = self.peers.get(inc).cloned() else {
            return;
        };
        for (tenant, series) in &tenants {
            self.count_series(tenant, series, now_sec, how);
            self.drop_if_idle(tenant);
        }
    }

    /// Maps peer `from`'s seconds onto this clock: the offset first
    /// estimated from a frame sent at `sent_sec` and received at
    /// `now_sec`, kept until a frame says it moved by
    /// [`OFFSET_STEP_SECS`] (then the peer's seconds are moved with it).
    fn offset_of(&mut self, from: &Incarnation, sent_sec: u64, now_sec: u64) -> i64 {
        let estimate = i64::try_from(now_sec)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(sent_sec).unwrap_or(i64::MAX));
        let Some(offset) = self.offsets.get(from).copied() else {
            self.offsets.insert(from.clone(), estimate);
            return estimate;
        };
        let moved = estimate.saturating_sub(offset);
        if moved.abs() < OFFSET_STEP_SECS {
            return offset;
        }
        let counted = self.counted.contains(from);
        if counted {
            self.count_peer(from, now_sec, Count::Out);
        }
        if let Some(tenants) = self.peers.get_mut(from) {
            for series in tenants.values_mut() {
                for (sec, _) in series.seconds.iter_mut() {
                    *sec = shift(*sec, moved);
                }
            }
        }
        if counted {
            self.count_peer(from, now_sec, Count::In);
        }
        self.offsets.insert(from.clone(), estimate);
        estimate
    }

    /// Once a second: forgets what nothing refreshes — sums with nothing
    /// in them, peers' seconds behind the window and idle series.
    fn sweep(&mut self, now_sec: u64) {
        if now_sec == self.swept_sec {
            return;
        }
        self.swept_sec = now_sec;
        let earliest = (now_sec + 1)
            .saturating_sub(MAX_WINDOW_SECS)
            .saturating_sub(KEEP_BEYOND_WINDOW_SECS);
        for tenants in self.peers.values_mut() {
            tenants.retain(|_, series| {
                series.trim(earliest);
                !series.is_idle()
            });
        }
        self.fleet.retain(|_, agg| {
            agg.advance(now_sec);
            agg.in_flight > 0 || agg.total() != Usage::default()
        });
    }

    /// Recomputes every sum from the series (after the window changed).
    fn rebuild(&mut self, now_sec: u64) {
        self.fleet.clear();
        let own: Vec<(Arc<str>, Series)> = self
            .own
            .iter()
            .map(|(t, s)| (t.clone(), s.clone()))
            .collect();
        let counted: Vec<(Arc<str>, Series)> = self
            .peers
            .iter()
            .filter(|(inc, _)| self.counted.contains(*inc))
            .flat_map(|(_, tenants)| tenants.iter().map(|(t, s)| (t.clone(), s.clone())))
            .collect();
        for (tenant, series) in own.iter().chain(&counted) {
            self.count_series(tenant, series, now_sec, Count::In);
        }
    }

    fn mark_dirty(&mut self, tenant: &Arc<str>, sec: Option<u64>) {
        let seconds = self.dirty.entry(tenant.clone()).or_default();
        if let Some(sec) = sec
            && !seconds.contains(&sec)
        {
            seconds.push(sec);
        }
    }

    fn drop_if_idle(&mut self, tenant: &str) {
        if self
            .fleet
            .get(tenant)
            .is_some_and(|a| a.in_flight == 0 && a.total() == Usage::default())
        {
            self.fleet.remove(tenant);
        }
    }
}

/// Every tenant's usage: this node's own, and its counted peers'.
#[derive(Debug, Default)]
pub struct TenantBook {
    book: Mutex<Book>,
    /// Rung on every own change so the next round carries it (none for a
    /// replica without a mesh).
    bell: Option<Weak<ChangeBell>>,
}

/// Why a peer's tenant entry was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TenantDrop {
    /// An empty or overlong tenant name.
    Name,
    /// More seconds than the longest window.
    Seconds,
    /// A second too far from this node's clock (after mapping the peer's
    /// clock onto it): stale, or a broken clock.
    Clock,
    /// A tenant this node's tenants file does not name.
    Unknown,
}

impl TenantDrop {
    /// Label of the dropped-frames counter.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            TenantDrop::Name => "bad_tenant_name",
            TenantDrop::Seconds => "bad_tenant_seconds",
            TenantDrop::Clock => "tenant_clock",
            TenantDrop::Unknown => "unknown_tenant",
        }
    }
}

impl TenantBook {
    /// A book for one replica with no mesh: own usage only.
    pub fn local() -> Self {
        Self::default()
    }

    /// A book whose own changes ring `bell`, so the mesh's next round
    /// carries them to the peers.
    pub(crate) fn meshed(bell: &Arc<ChangeBell>) -> Self {
        Self {
            book: Mutex::default(),
            bell: Some(Arc::downgrade(bell)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring(&self) {
        if let Some(bell) = self.bell.as_ref().and_then(Weak::upgrade) {
            bell.ring();
        }
    }

    /// Sums usage over the last `secs` seconds (1 to [`MAX_WINDOW_SECS`];
    /// the default is the longest). Changing it recomputes every sum.
    pub fn set_window(&self, secs: u64, now_sec: u64) {
        let secs = secs.clamp(1, MAX_WINDOW_SECS);
        let mut book = self.lock();
        if book.window_secs != secs {
            book.window_secs = secs;
            book.rebuild(now_sec);
        }
    }

    /// The tenants this node knows (its tenants file's): a peer's entries
    /// for others are dropped and counted, so what a peer can make this
    /// node keep is bounded by the file, whatever the peer sends.
    pub fn set_known(&self, names: impl IntoIterator<Item = Arc<str>>) {
        self.lock().known = Some(names.into_iter().collect());
    }

    /// Admits one request of `tenant` at second `now_sec` if `check`
    /// passes on the tenant's fleet-wide totals (as they stand before this
    /// request): then books `usage` in that second and one request in
    /// flight, and returns the totals after it. Check and booking are one
    /// step, so this replica's concurrent requests cannot both pass on the
    /// same room.
    pub fn admit<E>(
        &self,
        tenant: &Arc<str>,
        now_sec: u64,
        usage: Usage,
        check: impl FnOnce(&TenantTotals) -> Result<(), E>,
    ) -> Result<TenantTotals, E> {
        let mut book = self.lock();
        book.sweep(now_sec);
        let agg = book.aggregate(tenant, now_sec);
        let mut totals = TenantTotals {
            used: agg.total(),
            in_flight: agg.in_flight,
        };
        check(&totals)?;
        agg.add_at(now_sec, usage);
        agg.in_flight += 1;
        let series = book.own.entry(tenant.clone()).or_default();
        series.trim(now_sec.saturating_sub(MAX_WINDOW_SECS - 1));
        series.slot(now_sec).add_saturating(usage);
        series.in_flight += 1;
        if self.bell.is_some() {
            book.mark_dirty(tenant, Some(now_sec));
        }
        drop(book);
        self.ring();
        totals.used.add_saturating(usage);
        totals.in_flight += 1;
        Ok(totals)
    }

    /// Replaces what an admitted request of `tenant` booked in second
    /// `sec` (`booked`: its estimates) with what it used (`used`: the
    /// engine's report, or nothing for a request that was never served).
    /// A second already gone from the book changes nothing.
    pub fn settle(&self, tenant: &Arc<str>, sec: u64, booked: Usage, used: Usage) {
        let mut book = self.lock();
        let Some(series) = book.own.get_mut(tenant) else {
            return;
        };
        let Some(before) = series.get(sec) else {
            return;
        };
        let mut after = before;
        after.sub_saturating(booked);
        after.add_saturating(used);
        *series.slot(sec) = after;
        if let Some(agg) = book.fleet.get_mut(tenant) {
            agg.apply(
                sec,
                Delta {
                    old: before,
                    new: after,
                },
            );
        }
        if self.bell.is_some() {
            book.mark_dirty(tenant, Some(sec));
        }
        drop(book);
        self.ring();
    }

    /// One admitted request of `tenant` ended.
    pub fn finish(&self, tenant: &Arc<str>) {
        let mut book = self.lock();
        let Some(series) = book.own.get_mut(tenant) else {
            return;
        };
        series.in_flight = series.in_flight.saturating_sub(1);
        if let Some(agg) = book.fleet.get_mut(tenant) {
            agg.in_flight = agg.in_flight.saturating_sub(1);
        }
        if self.bell.is_some() {
            book.mark_dirty(tenant, None);
        }
        drop(book);
        self.ring();
    }

    /// `tenant`'s fleet-wide usage over the newest `secs` seconds of the
    /// window ending at `now_sec` (cheap: no window is built, for a
    /// scheduler that asks per decision).
    pub fn recent(&self, tenant: &str, now_sec: u64, secs: u64) -> Usage {
        let mut book = self.lock();
        match book.fleet.get_mut(tenant) {
            Some(agg) => {
                agg.advance(now_sec);
                agg.recent(secs)
            }
            None => Usage::default(),
        }
    }

    /// `tenant`'s fleet-wide window ending at `now_sec`, second by second.
    pub fn window(&self, tenant: &str, now_sec: u64) -> TenantWindow {
        let mut book = self.lock();
        let window = book.window_secs;
        match book.fleet.get_mut(tenant) {
            Some(agg) => {
                agg.advance(now_sec);
                let (first_sec, seconds) = agg.seconds();
                TenantWindow {
                    first_sec,
                    seconds,
                    in_flight: agg.in_flight,
                }
            }
            None => TenantWindow {
                first_sec: (now_sec + 1).saturating_sub(window),
                seconds: vec![Usage::default(); window as usize],
                in_flight: 0,
            },
        }
    }

    /// Own changes since the last call, as frames (dropping own tenants
    /// with nothing live left).
    pub(crate) fn frames(&self, now_sec: u64) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut book = self.lock();
        book.sweep(now_sec);
        let keep_from = now_sec.saturating_sub(MAX_WINDOW_SECS - 1);
        let mut entries = Vec::with_capacity(book.dirty.len());
        for (tenant, seconds) in &book.dirty {
            if let Some(series) = book.own.get(tenant) {
                entries.push(series.entry(tenant, |s| seconds.contains(&s)));
            }
        }
        // Encoded before anything is forgotten: a failure leaves the
        // changes flagged for the next round.
        let frames = encode(entries, now_sec)?;
        book.dirty.clear();
        book.own.retain(|_, series| {
            series.trim(keep_from);
            !series.is_idle()
        });
        Ok(frames)
    }

    /// Every own tenant's live seconds and in-flight count, as frames
    /// (for a new link).
    pub(crate) fn full_frames(&self, now_sec: u64) -> Result<Vec<Vec<u8>>, FrameError> {
        let keep_from = now_sec.saturating_sub(MAX_WINDOW_SECS - 1);
        let entries = self
            .lock()
            .own
            .iter()
            .map(|(tenant, series)| series.entry(tenant, |s| s >= keep_from))
            .collect();
        encode(entries, now_sec)
    }

    /// Takes a peer's entries (absolute values); returns what was dropped.
    pub(crate) fn deliver(
        &self,
        from: &Incarnation,
        frame: TenantsFrame,
        now_sec: u64,
    ) -> Vec<TenantDrop> {
        let mut dropped = Vec::new();
        let mut book = self.lock();
        book.sweep(now_sec);
        let keep_from = now_sec.saturating_sub(MAX_WINDOW_SECS - 1);
        let earliest = keep_from.saturating_sub(KEEP_BEYOND_WINDOW_SECS);
        let latest = now_sec.saturating_add(KEEP_BEYOND_WINDOW_SECS);
        let offset = book.offset_of(from, frame.sent_unix_sec, now_sec);
        let counted = book.counted.contains(from);
        let mut peer = book.peers.remove(from).unwrap_or_default();
        for entry in frame.entries {
            if entry.tenant.is_empty() || entry.tenant.len() > MAX_TENANT_NAME_BYTES {
                dropped.push(TenantDrop::Name);
                continue;
            }
            if book
                .known
                .as_ref()
                .is_some_and(|known| !known.contains(entry.tenant.as_str()))
            {
                dropped.push(TenantDrop::Unknown);
                continue;
            }
            if entry.seconds.len() > MAX_TENANT_SECONDS {
                dropped.push(TenantDrop::Seconds);
                continue;
            }
            let tenant: Arc<str> = match peer.get_key_value(entry.tenant.as_str()) {
                Some((name, _)) => name.clone(),
                None => Arc::from(entry.tenant.as_str()),
            };
            let series = peer.entry(tenant.clone()).or_default();
            let mut changes = Vec::with_capacity(entry.seconds.len());
            let in_flight_before = series.in_flight;
            series.in_flight = entry.in_flight;
            for second in entry.seconds {
                let sec = shift(second.unix_sec, offset);
                if sec < earliest || sec > latest {
                    dropped.push(TenantDrop::Clock);
                    continue;
                }
                let new = Usage {
                    requests: second.requests,
                    input_tokens: second.input_tokens,
                    output_tokens: second.output_tokens,
                };
                let slot = series.slot(sec);
                changes.push((sec, Delta { old: *slot, new }));
                *slot = new;
            }
            // Bounded: every second kept lies between `earliest` and `latest`.
            series.trim(earliest);
            if counted {
                let agg = book.aggregate(&tenant, now_sec);
                agg.in_flight = agg
                    .in_flight
                    .saturating_sub(in_flight_before)
                    .saturating_add(entry.in_flight);
                for (sec, delta) in changes {
                    agg.apply(sec, delta);
                }
                book.drop_if_idle(&tenant);
            }
        }
        peer.retain(|_, series| !series.is_idle());
        book.peers.insert(from.clone(), peer);
        dropped
    }

    /// The peers whose usage counts now; everything of the others is
    /// forgotten (a peer that comes back is sent its link's full copy).
    pub(crate) fn set_counted(&self, counted: &HashSet<Incarnation>, now_sec: u64) {
        let mut book = self.lock();
        let gone: Vec<Incarnation> = book
            .peers
            .keys()
            .filter(|inc| !counted.contains(*inc))
            .cloned()
            .collect();
        for inc in gone {
            if book.counted.contains(&inc) {
                book.count_peer(&inc, now_sec, Count::Out);
            }
            book.peers.remove(&inc);
            book.offsets.remove(&inc);
        }
        let joined: Vec<Incarnation> = counted
            .iter()
            .filter(|inc| !book.counted.contains(*inc))
            .cloned()
            .collect();
        for inc in joined {
            book.count_peer(&inc, now_sec, Count::In);
        }
        book.counted = counted.clone();
    }

    /// Tenants with any usage counted here (own or a counted peer's).
    #[cfg(test)]
    pub(crate) fn tenants(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self.lock().fleet.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(feature = "testsuite")]
impl TenantBook {
    /// For tests and benches without a mesh: counts `from` as a peer and
    /// takes `frame` as if it had sent it over its link.
    pub fn absorb_as_peer(&self, from: &Incarnation, frame: TenantsFrame, now_sec: u64) {
        let mut counted = self.lock().counted.clone();
        counted.insert(from.clone());
        self.set_counted(&counted, now_sec);
        self.deliver(from, frame, now_sec);
    }
}

/// `entries` as frames of at most [`MAX_TENANTS_PER_FRAME`], stamped with
/// this clock's second `now_sec`.
fn encode(entries: Vec<TenantEntry>, now_sec: u64) -> Result<Vec<Vec<u8>>, FrameError> {
    entries
        .chunks(MAX_TENANTS_PER_FRAME)
        .map(|chunk| {
            encode_prefixed(&Frame::Tenants(TenantsFrame {
                sent_unix_sec: now_sec,
                entries: chunk.to_vec(),
            }))
        })
        .collect()
}

/// `sec` moved by `offset` seconds (never below 0).
fn shift(sec: u64, offset: i64) -> u64 {
    if offset >= 0 {
        sec.saturating_add(offset.unsigned_abs())
    } else {
        sec.saturating_sub(offset.unsigned_abs())
    }
}

#[cfg(test)]
mod tests;
