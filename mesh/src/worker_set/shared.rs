//! The worker set shared by the router and the load links.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shoal_proto::frames::WorkerSetEntry;
use tokio::sync::watch;

use super::{Refused, Sender, Stamp, WorkerSet};
use crate::identity::unix_micros;

/// The wall clock the set stamps and judges entries with, µs since the
/// Unix epoch (the system clock; tests put a skewed one in its place).
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A [`WorkerSet`] shared by the router and, when meshed, the load links:
/// every change bumps a version the router watches; this node's own
/// writes also ring `bell` (the mesh's push bell), so peers hear of them at
/// once (what it merges from peers is not sent on: see the module doc).
#[derive(Clone)]
pub struct SharedWorkerSet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedWorkerSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWorkerSet")
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

struct Inner {
    set: Mutex<WorkerSet>,
    version: watch::Sender<u64>,
    removal_ttl: Duration,
    bell: Option<Arc<watch::Sender<u64>>>,
    clock: WallClock,
}

impl SharedWorkerSet {
    /// A set of this node's (`origin` stamps its writes), forgetting
    /// removals after `removal_ttl`; not shared with anyone.
    pub fn local(origin: impl Into<Arc<str>>, removal_ttl: Duration) -> Self {
        Self::build(
            WorkerSet::new(origin),
            removal_ttl,
            None,
            Arc::new(unix_micros),
        )
    }

    /// The set of a meshed node: `set` (its origin and start), its own
    /// writes ringing `bell`, judged and stamped by `clock`.
    pub(crate) fn meshed(
        set: WorkerSet,
        removal_ttl: Duration,
        bell: Arc<watch::Sender<u64>>,
        clock: WallClock,
    ) -> Self {
        Self::build(set, removal_ttl, Some(bell), clock)
    }

    fn build(
        set: WorkerSet,
        removal_ttl: Duration,
        bell: Option<Arc<watch::Sender<u64>>>,
        clock: WallClock,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                set: Mutex::new(set),
                version: watch::Sender::new(0),
                removal_ttl,
                bell,
                clock,
            }),
        }
    }

    /// The set, locked (held briefly: no I/O under it).
    pub fn lock(&self) -> MutexGuard<'_, WorkerSet> {
        self.inner.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        (self.inner.clock)()
    }

    /// Adds (`present`) or removes `url` as this node's write, now.
    pub fn write(&self, url: &str, present: bool) -> Result<Stamp, Refused> {
        let stamp = self.lock().write(url, present, self.now())?;
        self.changed();
        if let Some(bell) = &self.inner.bell {
            bell.send_modify(|v| *v = v.wrapping_add(1));
        }
        Ok(stamp)
    }

    /// Merges entries trusting their origins (a local merge); what was
    /// refused, for counting.
    pub fn merge(&self, entries: &[WorkerSetEntry]) -> Vec<Refused> {
        self.merge_with(entries, |set, entry, now| set.merge(entry, now))
    }

    /// Merges the entries `sender` sent, judging their origins (see the
    /// module doc); what was refused, for counting.
    pub fn merge_from(&self, sender: &Sender<'_>, entries: &[WorkerSetEntry]) -> Vec<Refused> {
        self.merge_with(entries, |set, entry, now| {
            set.merge_from(entry, sender, now)
        })
    }

    fn merge_with(
        &self,
        entries: &[WorkerSetEntry],
        mut merge: impl FnMut(&mut WorkerSet, &WorkerSetEntry, u64) -> Result<bool, Refused>,
    ) -> Vec<Refused> {
        let now = self.now();
        // A removal older than the TTL is forgotten here already (or soon
        // will be): merging it back would only bring it back until the
        // next sweep, and make digests disagree meanwhile.
        let expired = now.saturating_sub(self.inner.removal_ttl.as_micros() as u64);
        let mut refused = Vec::new();
        let mut changed = false;
        {
            let mut set = self.lock();
            for entry in entries {
                if !entry.present && entry.hlc_us < expired {
                    continue;
                }
                match merge(&mut set, entry, now) {
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
            .forget_removals(self.now(), self.inner.removal_ttl);
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
    }
}
