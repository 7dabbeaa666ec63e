//! Every open client connection, so that at the connection cap the front
//! closes an idle one instead of refusing the newcomer.
//!
//! Why: if a new connection at `--max-client-connections` were closed on
//! arrival, connections that send nothing could hold the cap while
//! the kubelet's `/liveness` and `/readiness` probes — a fresh connection
//! each — were refused, and the pod restarted for an attack it was
//! weathering. nginx answers the same shortage by closing its "reusable"
//! connections (idle keep-alive, or waiting for a request) oldest first
//! (`ngx_drain_connections`). Here, at the cap, a sample of open
//! connections is read and the one waiting longest for a first request is
//! closed; failing that, the longest-idle keep-alive one idle for at least
//! [`KEEPALIVE_MIN_IDLE`]. A connection with a request in flight is never
//! chosen. Sampling (as Redis's approximate
//! LRU does) keeps the choice O(1) whatever the number of connections.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::Rng;

use super::activity::Activity;

/// Open connections read to pick one to close (all of them when there
/// are no more).
const SAMPLES: usize = 16;

/// The open connections of one replica, in slots reused as they close.
#[derive(Debug, Default)]
pub struct ConnTable {
    inner: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    slots: Vec<Option<Arc<Activity>>>,
    free: Vec<usize>,
}

/// A connection's place in the table, given up when dropped.
#[derive(Debug)]
pub struct Registration {
    table: Arc<ConnTable>,
    slot: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.table.lock();
        if let Some(slot) = inner.slots.get_mut(self.slot) {
            *slot = None;
            inner.free.push(self.slot);
        }
    }
}

impl ConnTable {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists `activity` until the returned registration is dropped.
    pub fn register(self: &Arc<Self>, activity: Arc<Activity>) -> Registration {
        let mut inner = self.lock();
        let slot = match inner.free.pop() {
            Some(slot) => {
                inner.slots[slot] = Some(activity);
                slot
            }
            None => {
                inner.slots.push(Some(activity));
                inner.slots.len() - 1
            }
        };
        Registration {
            table: self.clone(),
            slot,
        }
    }

    /// Marks one idle connection for closing (see the module doc) and
    /// returns true, or false when the sample found none idle.
    pub fn evict_one(&self) -> bool {
        let victim = {
            let inner = self.lock();
            if inner.slots.is_empty() {
                return false;
            }
            let len = inner.slots.len();
            let mut rng = rand::rng();
            // A small table is read whole; a large one sampled.
            let picks = (0..len.min(SAMPLES)).map(|i| match len > SAMPLES {
                true => rng.random_range(0..len),
                false => i,
            });
            let mut best: Option<(Rank, &Arc<Activity>)> = None;
            for slot in picks {
                let Some(activity) = &inner.slots[slot] else {
                    continue;
                };
                let Some(rank) = Rank::of(activity) else {
                    continue;
                };
                if best.as_ref().is_none_or(|(top, _)| rank < *top) {
                    best = Some((rank, activity));
                }
            }
            best.map(|(_, activity)| activity.clone())
        };
        victim.is_some_and(|activity| activity.evict())
    }
}

/// Least idle time of a keep-alive connection (one that served a request)
/// before it may be closed to make room: a client between two requests
/// of a busy connection would see its next request fail on a closed
/// socket, and its connection is no attacker's.
pub const KEEPALIVE_MIN_IDLE: Duration = Duration::from_secs(1);

/// How good a candidate for closing a connection is: lower is better.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    /// Connections that never delivered a request go first.
    served: bool,
    /// Then the one idle longest.
    idle_since: Instant,
}

impl Rank {
    /// The rank of `activity`, or `None` when it may not be closed (a
    /// request in flight, or already being closed).
    fn of(activity: &Activity) -> Option<Self> {
        if activity.is_evicted() {
            return None;
        }
        let served = activity.has_served();
        let idle_since = activity.idle_since()?;
        if served && idle_since.elapsed() < KEEPALIVE_MIN_IDLE {
            return None;
        }
        Some(Self { served, idle_since })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_waiting_for_its_first_request_goes_before_a_busy_or_served_one() {
        let table = Arc::new(ConnTable::default());
        let busy = Activity::new();
        let _request = busy.start();
        let served = Activity::new();
        drop(served.start());
        let active = Activity::new();
        drop(active.start());
        let silent = Activity::new();
        let _regs: Vec<Registration> = [&busy, &served, &active, &silent]
            .into_iter()
            .map(|a| table.register(a.clone()))
            .collect();
        assert!(table.evict_one());
        assert!(silent.is_evicted(), "the one that never sent a request");
        assert!(!served.is_evicted());
        assert!(
            !table.evict_one(),
            "keep-alive connections idle for less than the minimum are kept"
        );
        std::thread::sleep(KEEPALIVE_MIN_IDLE);
        drop(active.start());
        assert!(table.evict_one());
        assert!(served.is_evicted(), "then the long-idle keep-alive one");
        assert!(!active.is_evicted(), "not one that just answered");
        assert!(!busy.is_evicted(), "never one with a request in flight");
        assert!(!table.evict_one(), "nothing left to close");
    }

    #[test]
    fn slots_are_given_back_and_reused() {
        let table = Arc::new(ConnTable::default());
        let first = table.register(Activity::new());
        drop(first);
        let second = table.register(Activity::new());
        assert_eq!(second.slot, 0);
        assert_eq!(table.lock().slots.len(), 1);
        drop(second);
        assert!(!table.evict_one(), "an empty table closes nothing");
    }
}
