//! The fleet-wide worker set: the engines admins added or removed on any
//! replica, so every replica routes to the same set.
//!
//! Each worker URL is a last-writer-wins register: `present` (added) or
//! not (removed, a tombstone), stamped by the write that said so. Stamps
//! are hybrid logical clocks — the writer's wall clock in µs, raised past
//! every stamp it has seen — so a removal made after seeing an add always
//! wins over it, whatever the clocks say; ties break on the writer's node
//! name. Merging keeps the larger stamp: commutative, associative and
//! idempotent, so frames may be lost, repeated or reordered.
//!
//! Bounded: at most [`MAX_ENTRIES`] URLs; a tombstone is forgotten once its
//! stamp is older than the removal TTL (every replica forgets it at about
//! the same time, since the stamp is the writer's clock). A replica cut off
//! for longer than that TTL can bring back a worker removed meanwhile, the
//! usual price of forgetting tombstones. A stamp further ahead of this
//! node's clock than [`MAX_FUTURE`] is refused, so one broken clock cannot
//! pin an entry forever.
//!
//! This module knows nothing of URLs' syntax (the router validates them);
//! it bounds their length.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shoal_proto::frames::{MAX_KEY_BYTES, WorkerSetEntry};
use tokio::sync::watch;

use crate::identity::{unix_micros, valid_node_name};

/// Most worker URLs the set holds (present or removed).
pub const MAX_ENTRIES: usize = 10_000;
/// Largest lead of a peer's stamp over this node's clock that is accepted.
pub const MAX_FUTURE: Duration = Duration::from_secs(60);

/// The stamp of one write: hybrid logical clock, then writer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    /// µs since the Unix epoch, raised past every stamp the writer saw.
    pub hlc_us: u64,
    /// The writer's node name.
    pub origin: Arc<str>,
}

/// One URL's register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// In the set (added) or removed.
    pub present: bool,
    /// The write that decided it.
    pub stamp: Stamp,
}

/// Why a peer's entry was not merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Empty URL or longer than [`MAX_KEY_BYTES`].
    BadUrl,
    /// The origin is not a valid node name.
    BadOrigin,
    /// The stamp is more than [`MAX_FUTURE`] ahead of this node's clock.
    Future,
    /// The set already holds [`MAX_ENTRIES`] URLs.
    Full,
}

impl Refused {
    /// Label for the dropped-entries metric.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::BadUrl => "worker_set_url",
            Refused::BadOrigin => "worker_set_origin",
            Refused::Future => "worker_set_future",
            Refused::Full => "worker_set_full",
        }
    }
}

/// The set itself (no locking, no I/O): see the module doc.
#[derive(Debug)]
pub struct WorkerSet {
    origin: Arc<str>,
    entries: BTreeMap<Arc<str>, Register>,
    last_hlc_us: u64,
}

impl WorkerSet {
    /// An empty set whose own writes are stamped with `origin`.
    pub fn new(origin: impl Into<Arc<str>>) -> Self {
        Self {
            origin: origin.into(),
            entries: BTreeMap::new(),
            last_hlc_us: 0,
        }
    }

    /// The next stamp of this node's clock at wall time `now_us`.
    fn tick(&mut self, now_us: u64) -> Stamp {
        self.last_hlc_us = now_us.max(self.last_hlc_us.saturating_add(1));
        Stamp {
            hlc_us: self.last_hlc_us,
            origin: self.origin.clone(),
        }
    }

    /// Records this node's own write (an admin add or remove) at wall time
    /// `now_us`; it wins over every entry this node has seen.
    pub fn write(&mut self, url: &str, present: bool, now_us: u64) -> Result<Stamp, Refused> {
        check_url(url)?;
        if !self.entries.contains_key(url) && self.entries.len() >= MAX_ENTRIES {
            return Err(Refused::Full);
        }
        let stamp = self.tick(now_us);
        self.entries.insert(
            url.into(),
            Register {
                present,
                stamp: stamp.clone(),
            },
        );
        Ok(stamp)
    }

    /// Merges a peer's entry at this node's wall time `now_us`; true when
    /// it changed what this node holds.
    pub fn merge(&mut self, entry: &WorkerSetEntry, now_us: u64) -> Result<bool, Refused> {
        check_url(&entry.url)?;
        if !valid_node_name(&entry.origin) {
            return Err(Refused::BadOrigin);
        }
        let future_limit = now_us.saturating_add(MAX_FUTURE.as_micros() as u64);
        if entry.hlc_us > future_limit {
            return Err(Refused::Future);
        }
        self.last_hlc_us = self.last_hlc_us.max(entry.hlc_us);
        let stamp = Stamp {
            hlc_us: entry.hlc_us,
            origin: entry.origin.as_str().into(),
        };
        let full = self.entries.len() >= MAX_ENTRIES;
        match self.entries.get_mut(entry.url.as_str()) {
            Some(held) if held.stamp >= stamp => Ok(false),
            Some(held) => {
                *held = Register {
                    present: entry.present,
                    stamp,
                };
                Ok(true)
            }
            None if full => Err(Refused::Full),
            None => {
                self.entries.insert(
                    entry.url.as_str().into(),
                    Register {
                        present: entry.present,
                        stamp,
                    },
                );
                Ok(true)
            }
        }
    }

    /// The register of `url`, if any write named it.
    pub fn get(&self, url: &str) -> Option<&Register> {
        self.entries.get(url)
    }

    /// Every register, by URL.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Register)> {
        self.entries.iter()
    }

    /// Forgets the tombstones whose stamp is older than `ttl` at wall time
    /// `now_us`; how many.
    pub fn forget_removals(&mut self, now_us: u64, ttl: Duration) -> usize {
        let cutoff = now_us.saturating_sub(ttl.as_micros() as u64);
        let before = self.entries.len();
        self.entries
            .retain(|_, r| r.present || r.stamp.hlc_us >= cutoff);
        before - self.entries.len()
    }

    /// The wire form of every register.
    pub fn to_entries(&self) -> Vec<WorkerSetEntry> {
        self.entries
            .iter()
            .map(|(url, r)| WorkerSetEntry {
                url: url.to_string(),
                hlc_us: r.stamp.hlc_us,
                origin: r.stamp.origin.to_string(),
                present: r.present,
            })
            .collect()
    }
}

fn check_url(url: &str) -> Result<(), Refused> {
    if url.is_empty() || url.len() > MAX_KEY_BYTES {
        return Err(Refused::BadUrl);
    }
    Ok(())
}

/// A [`WorkerSet`] shared by the router and, when meshed, the load links:
/// every change bumps a version the router watches and rings `bell` (the
/// mesh's push bell), so peers hear of it at once.
#[derive(Debug, Clone)]
pub struct SharedWorkerSet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    set: Mutex<WorkerSet>,
    version: watch::Sender<u64>,
    removal_ttl: Duration,
    bell: Option<Arc<watch::Sender<u64>>>,
}

impl SharedWorkerSet {
    /// A set of this node's (`origin` stamps its writes), forgetting
    /// removals after `removal_ttl`; not shared with anyone.
    pub fn local(origin: impl Into<Arc<str>>, removal_ttl: Duration) -> Self {
        Self::with_bell(origin, removal_ttl, None)
    }

    pub(crate) fn with_bell(
        origin: impl Into<Arc<str>>,
        removal_ttl: Duration,
        bell: Option<Arc<watch::Sender<u64>>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                set: Mutex::new(WorkerSet::new(origin)),
                version: watch::Sender::new(0),
                removal_ttl,
                bell,
            }),
        }
    }

    /// The set, locked (held briefly: no I/O under it).
    pub fn lock(&self) -> MutexGuard<'_, WorkerSet> {
        self.inner.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (`present`) or removes `url` as this node's write, now.
    pub fn write(&self, url: &str, present: bool) -> Result<Stamp, Refused> {
        let stamp = self.lock().write(url, present, unix_micros())?;
        self.changed();
        Ok(stamp)
    }

    /// Merges a peer's entries; what was refused, for counting.
    pub fn merge(&self, entries: &[WorkerSetEntry]) -> Vec<Refused> {
        let now = unix_micros();
        let mut refused = Vec::new();
        let mut changed = false;
        {
            let mut set = self.lock();
            for entry in entries {
                match set.merge(entry, now) {
                    Ok(c) => changed |= c,
                    Err(r) => refused.push(r),
                }
            }
        }
        if changed {
            self.changed();
        }
        refused
    }

    /// Forgets expired removals (see [`WorkerSet::forget_removals`]).
    pub fn forget_removals(&self) -> usize {
        let forgotten = self
            .lock()
            .forget_removals(unix_micros(), self.inner.removal_ttl);
        if forgotten > 0 {
            self.changed();
        }
        forgotten
    }

    /// How long a removal is kept.
    pub fn removal_ttl(&self) -> Duration {
        self.inner.removal_ttl
    }

    /// The version, bumped on every change.
    pub fn version(&self) -> u64 {
        *self.inner.version.borrow()
    }

    /// Wakes when the set changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    fn changed(&self) {
        self.inner.version.send_modify(|v| *v += 1);
        if let Some(bell) = &self.inner.bell {
            bell.send_modify(|v| *v = v.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str, hlc_us: u64, origin: &str, present: bool) -> WorkerSetEntry {
        WorkerSetEntry {
            url: url.into(),
            hlc_us,
            origin: origin.into(),
            present,
        }
    }

    const NOW: u64 = 1_700_000_000_000_000;

    #[test]
    fn the_later_write_wins_and_merges_commute() {
        let writes = [
            entry("http://w:1", NOW, "a", true),
            entry("http://w:1", NOW + 5, "b", false),
            entry("http://w:1", NOW + 5, "a", true),
            entry("http://w:2", NOW + 1, "c", true),
        ];
        let mut states = Vec::new();
        for order in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 2, 0, 1]] {
            let mut set = WorkerSet::new("x");
            for i in order {
                set.merge(&writes[i], NOW).unwrap();
            }
            // Duplicates change nothing.
            for w in &writes {
                set.merge(w, NOW).unwrap();
            }
            states.push(set.to_entries());
        }
        assert!(states.windows(2).all(|w| w[0] == w[1]), "{states:?}");
        let w1 = &states[0][0];
        assert_eq!(
            (w1.present, w1.origin.as_str()),
            (false, "b"),
            "tie on the clock: larger origin"
        );
    }

    #[test]
    fn a_removal_after_seeing_an_add_wins_even_with_a_slow_clock() {
        let mut a = WorkerSet::new("a");
        // A peer with a clock 10 s ahead added the worker.
        a.merge(&entry("http://w:1", NOW + 10_000_000, "z", true), NOW)
            .unwrap();
        let stamp = a.write("http://w:1", false, NOW).unwrap();
        assert!(stamp.hlc_us > NOW + 10_000_000, "raised past what it saw");
        assert!(!a.get("http://w:1").unwrap().present);
    }

    #[test]
    fn hostile_entries_are_refused_and_the_set_is_bounded() {
        let mut set = WorkerSet::new("a");
        let far = NOW + MAX_FUTURE.as_micros() as u64 + 1;
        assert_eq!(
            set.merge(&entry("http://w:1", far, "b", true), NOW),
            Err(Refused::Future)
        );
        assert_eq!(
            set.merge(&entry("", NOW, "b", true), NOW),
            Err(Refused::BadUrl)
        );
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            set.merge(&entry(&long, NOW, "b", true), NOW),
            Err(Refused::BadUrl)
        );
        assert_eq!(
            set.merge(&entry("u", NOW, "bad name!", true), NOW),
            Err(Refused::BadOrigin)
        );
        for i in 0..MAX_ENTRIES {
            set.write(&format!("http://w:{i}"), true, NOW).unwrap();
        }
        assert_eq!(
            set.merge(&entry("http://new:1", NOW, "b", true), NOW),
            Err(Refused::Full)
        );
        assert_eq!(set.write("http://new:1", true, NOW), Err(Refused::Full));
        assert!(
            set.write("http://w:0", false, NOW).is_ok(),
            "known URLs still change"
        );
    }

    #[test]
    fn removals_are_forgotten_after_their_ttl_and_adds_are_kept() {
        let mut set = WorkerSet::new("a");
        set.write("http://gone:1", false, NOW).unwrap();
        set.write("http://kept:1", true, NOW).unwrap();
        let ttl = Duration::from_secs(60);
        assert_eq!(set.forget_removals(NOW + 59_000_000, ttl), 0);
        assert_eq!(set.forget_removals(NOW + 61_000_000, ttl), 1);
        assert!(set.get("http://gone:1").is_none());
        assert!(set.get("http://kept:1").is_some());
    }

    #[test]
    fn the_shared_set_bumps_its_version_and_rings_the_bell_on_change_only() {
        let bell = Arc::new(watch::Sender::new(0u64));
        let shared = SharedWorkerSet::with_bell("a", Duration::from_secs(1), Some(bell.clone()));
        let mut rx = shared.subscribe();
        shared.write("http://w:1", true).unwrap();
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!(*bell.borrow(), 1);
        let held = shared.lock().to_entries();
        assert!(shared.merge(&held).is_empty());
        assert!(
            !rx.has_changed().unwrap(),
            "an entry already held is no change"
        );
        assert_eq!(*bell.borrow(), 1);
    }
}
