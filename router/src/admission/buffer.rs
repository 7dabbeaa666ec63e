//! The budget of request-body bytes one replica holds at once.
//!
//! Why: a request body is read whole before routing (the policy reads the
//! prompt, retries resend it), so `--max-payload-bytes` bounds one request
//! but not the sum: forty clients sending 60 MB at once would hold 2.4 GB
//! and get a pod with a 1 GiB limit OOM-killed, losing every stream on it.
//! Each body reserves its bytes here as they arrive (its declared length
//! at once, when it declares one); a body that does not fit gets 503 with
//! `Retry-After`, and the reservation is given back when the request stops
//! holding the body.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The replica's budget; shared behind an `Arc`.
#[derive(Debug)]
pub struct BufferBudget {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes of the budget held for one body, given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BufferBudget>,
    bytes: usize,
}

impl BufferBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` more if they fit.
    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// Reserves `bytes`, or `None` when they do not fit.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

impl Reservation {
    /// Makes the reservation at least `bytes`; false (nothing changed) when
    /// the rest does not fit.
    pub fn grow_to(&mut self, bytes: usize) -> bool {
        let more = bytes.saturating_sub(self.bytes);
        if more == 0 {
            return true;
        }
        if !self.budget.take(more) {
            return false;
        }
        self.bytes = bytes;
        true
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The memory this process may use, in bytes: the cgroup's limit (v2
/// `memory.max`, else v1 `memory.limit_in_bytes`) when one is set, else the
/// machine's memory; `None` when neither can be read.
pub fn memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|text| text.trim().parse::<u64>().ok())
        // v1 reports "no limit" as a number near 2^63.
        .filter(|limit| *limit < 1 << 60);
    cgroup.or_else(|| read("/proc/meminfo").and_then(|text| mem_total(&text)))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_the_budget_grow_and_are_given_back() {
        let budget = BufferBudget::new(100);
        let mut a = budget.reserve(60).unwrap();
        assert!(budget.reserve(50).is_none(), "60 + 50 > 100");
        let b = budget.reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(!a.grow_to(61), "no room left");
        assert_eq!(a.bytes(), 60);
        drop(b);
        assert!(a.grow_to(90));
        assert!(a.grow_to(10), "never shrinks");
        assert_eq!(budget.used(), 90);
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_machine_memory_is_read_from_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(mem_total(text), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB"), None);
        assert!(
            memory_limit().is_some_and(|m| m > 0),
            "this host has memory"
        );
    }
}
