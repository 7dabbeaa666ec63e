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

/// How far behind the window a peer's second may lie and still be kept
/// (a peer's second ahead may be as far as the aggregate sums ahead).
const CLOCK_SLACK_SECS: u64 = AHEAD_SECS;

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
            total.add(*second);
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

#[derive(Debug)]
struct Book {
    own: HashMap<Arc<str>, Series>,
    /// Own tenants changed since the last round: the seconds touched (or
    /// none, for an in-flight change). Kept only with a mesh (a bell).
    dirty: HashMap<Arc<str>, Vec<u64>>,
    peers: HashMap<Incarnation, HashMap<Arc<str>, Series>>,
    counted: HashSet<Incarnation>,
    /// Seconds the fleet sums cover.
    window: u64,
    /// Per tenant, own and counted peers' usage summed.
    fleet: HashMap<Arc<str>, Aggregate>,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            own: HashMap::new(),
            dirty: HashMap::new(),
            peers: HashMap::new(),
            counted: HashSet::new(),
            window: DEFAULT_WINDOW_SECS,
            fleet: HashMap::new(),
        }
    }
}

impl Book {
    /// `tenant`'s fleet sum, moved to `now_sec` (made if missing).
    fn aggregate(&mut self, tenant: &Arc<str>, now_sec: u64) -> &mut Aggregate {
        let window = self.window;
        let agg = self
            .fleet
            .entry(tenant.clone())
            .or_insert_with(|| Aggregate::new(window, now_sec));
        agg.advance(now_sec);
        agg
    }

    /// Adds (`sign` true) or takes out every second and the in-flight
    /// count of `series` into `tenant`'s sum.
    fn count_series(&mut self, tenant: &Arc<str>, series: &Series, now_sec: u64, sign: bool) {
        let agg = self.aggregate(tenant, now_sec);
        for (sec, usage) in &series.seconds {
            let (old, new) = if sign {
                (Usage::default(), *usage)
            } else {
                (*usage, Usage::default())
            };
            agg.apply(*sec, Delta { old, new });
        }
        agg.in_flight = if sign {
            agg.in_flight.saturating_add(series.in_flight)
        } else {
            agg.in_flight.saturating_sub(series.in_flight)
        };
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
            self.count_series(tenant, series, now_sec, true);
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
    /// A second too far from this node's clock.
    Clock,
}

impl TenantDrop {
    /// Label of the dropped-frames counter.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            TenantDrop::Name => "bad_tenant_name",
            TenantDrop::Seconds => "bad_tenant_seconds",
            TenantDrop::Clock => "tenant_clock",
        }
    }
}

impl TenantBook {
    /// A book for one replica with no mesh: own usage only.
    pub fn local() -> Self {
        Self::default()
    }

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
        if book.window != secs {
            book.window = secs;
            book.rebuild(now_sec);
        }
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
        let agg = book.aggregate(tenant, now_sec);
        let mut totals = TenantTotals {
            used: agg.total(),
            in_flight: agg.in_flight,
        };
        check(&totals)?;
        agg.add(now_sec, usage);
        agg.in_flight += 1;
        let series = book.own.entry(tenant.clone()).or_default();
        series.trim(now_sec.saturating_sub(MAX_WINDOW_SECS - 1));
        series.slot(now_sec).add(usage);
        series.in_flight += 1;
        if self.bell.is_some() {
            book.mark_dirty(tenant, Some(now_sec));
        }
        drop(book);
        self.ring();
        totals.used.add(usage);
        totals.in_flight += 1;
        Ok(totals)
    }

    /// Replaces what an admitted request of `tenant` booked in second
    /// `sec` (`booked`: its estimates) with what it used (`used`, from the
    /// engine's report); requests are unchanged. A second already gone
    /// from the book changes nothing.
    pub fn settle(&self, tenant: &Arc<str>, sec: u64, booked: Usage, used: Usage) {
        let mut book = self.lock();
        let Some(series) = book.own.get_mut(tenant) else {
            return;
        };
        let Some(before) = series.get(sec) else {
            return;
        };
        let mut after = before;
        after.sub(Usage {
            requests: 0,
            ..booked
        });
        after.add(Usage {
            requests: 0,
            ..used
        });
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

    /// `tenant`'s fleet-wide window ending at `now_sec`, second by second.
    pub fn window(&self, tenant: &str, now_sec: u64) -> TenantWindow {
        let mut book = self.lock();
        let window = book.window;
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
        let dirty = std::mem::take(&mut book.dirty);
        let keep_from = now_sec.saturating_sub(MAX_WINDOW_SECS - 1);
        let mut entries = Vec::with_capacity(dirty.len());
        for (tenant, seconds) in dirty {
            if let Some(series) = book.own.get(&tenant) {
                entries.push(series.entry(&tenant, |s| seconds.contains(&s)));
            }
        }
        book.own.retain(|_, series| {
            series.trim(keep_from);
            !series.is_idle()
        });
        drop(book);
        encode(entries)
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
        encode(entries)
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
        let keep_from = now_sec.saturating_sub(MAX_WINDOW_SECS - 1);
        let earliest = keep_from.saturating_sub(CLOCK_SLACK_SECS);
        let latest = now_sec.saturating_add(CLOCK_SLACK_SECS);
        let counted = book.counted.contains(from);
        let mut peer = book.peers.remove(from).unwrap_or_default();
        for entry in frame.entries {
            if entry.tenant.is_empty() || entry.tenant.len() > MAX_TENANT_NAME_BYTES {
                dropped.push(TenantDrop::Name);
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
                if second.unix_sec < earliest || second.unix_sec > latest {
                    dropped.push(TenantDrop::Clock);
                    continue;
                }
                let new = Usage {
                    requests: second.requests,
                    input_tokens: second.input_tokens,
                    output_tokens: second.output_tokens,
                };
                let slot = series.slot(second.unix_sec);
                changes.push((second.unix_sec, Delta { old: *slot, new }));
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
            let was_counted = book.counted.contains(&inc);
            let Some(tenants) = book.peers.remove(&inc) else {
                continue;
            };
            if was_counted {
                for (tenant, series) in &tenants {
                    book.count_series(tenant, series, now_sec, false);
                    book.drop_if_idle(tenant);
                }
            }
        }
        let joined: Vec<Incarnation> = counted
            .iter()
            .filter(|inc| !book.counted.contains(*inc))
            .cloned()
            .collect();
        for inc in joined {
            let Some(tenants) = book.peers.get(&inc).cloned() else {
                continue;
            };
            for (tenant, series) in &tenants {
                book.count_series(tenant, series, now_sec, true);
            }
        }
        book.counted = counted.clone();
    }

    /// Tenants with any usage counted here (own or a counted peer's).
    pub fn tenants(&self) -> Vec<Arc<str>> {
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

fn encode(entries: Vec<TenantEntry>) -> Result<Vec<Vec<u8>>, FrameError> {
    entries
        .chunks(MAX_TENANTS_PER_FRAME)
        .map(|chunk| {
            encode_prefixed(&Frame::Tenants(TenantsFrame {
                entries: chunk.to_vec(),
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests;
