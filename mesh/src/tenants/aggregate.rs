//! One tenant's fleet-wide usage kept summed as it changes, so admitting a
//! request reads one running total instead of adding up every
//! incarnation's seconds (at 1,000 tenants and a 64-replica view that sum
//! was most of admission's cost, and most of it cache misses).
//!
//! A ring of per-second sums covers the window behind the newest second
//! seen (`head`) and the clock slack ahead of it (a peer's second ahead of
//! this clock counts at once); `total` is the ring's sum. Every change is
//! a delta at one second: an own admission or settlement, or a counted
//! peer's new absolute value minus its old one. Moving `head` forward
//! takes the seconds that leave the window out of `total`.

use super::Usage;

/// Seconds the ring holds: the longest window plus the clock slack ahead,
/// rounded up to a power of two (seconds map to slots by `sec % RING`).
const RING: u64 = 128;

/// How far ahead of `head` a second may lie and still be summed.
pub(super) const AHEAD_SECS: u64 = 30;

/// A tenant's usage summed over the counted incarnations.
#[derive(Debug, Clone)]
pub(super) struct Aggregate {
    ring: Box<[Usage]>,
    /// Newest second the window has moved to.
    head: u64,
    /// Window length, seconds.
    window: u64,
    /// Sum of the ring over (`head - window`, `head + AHEAD_SECS`].
    total: Usage,
    pub(super) in_flight: u64,
}

/// A signed change of one second's usage.
#[derive(Debug, Clone, Copy)]
pub(super) struct Delta {
    pub(super) old: Usage,
    pub(super) new: Usage,
}

impl Aggregate {
    pub(super) fn new(window: u64, now_sec: u64) -> Self {
        Self {
            ring: vec![Usage::default(); RING as usize].into_boxed_slice(),
            head: now_sec,
            window,
            total: Usage::default(),
            in_flight: 0,
        }
    }

    fn slot(&mut self, sec: u64) -> &mut Usage {
        &mut self.ring[(sec % RING) as usize]
    }

    fn counts(&self, sec: u64) -> bool {
        sec + self.window > self.head && sec <= self.head + AHEAD_SECS
    }

    /// Moves the window to end at `now_sec` (never backwards).
    pub(super) fn advance(&mut self, now_sec: u64) {
        if now_sec <= self.head {
            return;
        }
        // Seconds (head - window, now - window] leave; at most a ring's worth.
        let leaving_from = (self.head + 1).saturating_sub(self.window);
        let leaving_to = (now_sec + 1).saturating_sub(self.window);
        let steps = leaving_to.saturating_sub(leaving_from).min(RING);
        for sec in leaving_to.saturating_sub(steps)..leaving_to {
            let gone = std::mem::take(self.slot(sec));
            self.total.sub_saturating(gone);
        }
        self.head = now_sec;
    }

    /// Applies `delta` at second `sec`, if that second is summed.
    pub(super) fn apply(&mut self, sec: u64, delta: Delta) {
        if !self.counts(sec) {
            return;
        }
        let slot = self.slot(sec);
        slot.sub_saturating(delta.old);
        slot.add_saturating(delta.new);
        self.total.sub_saturating(delta.old);
        self.total.add_saturating(delta.new);
    }

    /// Adds `usage` at second `sec`.
    pub(super) fn add_at(&mut self, sec: u64, usage: Usage) {
        self.apply(
            sec,
            Delta {
                old: Usage::default(),
                new: usage,
            },
        );
    }

    /// The running total over the window.
    pub(super) fn total(&self) -> Usage {
        self.total
    }

    /// The window second by second, oldest first (seconds ahead of `head`
    /// counted in the newest).
    /// The sum of the newest `secs` seconds of the window (those ahead of
    /// this clock included), without building the window.
    pub(super) fn recent(&self, secs: u64) -> Usage {
        let first = (self.head + 1).saturating_sub(self.window.min(secs));
        let mut out = Usage::default();
        for s in first..=self.head + AHEAD_SECS {
            out.add_saturating(self.ring[(s % RING) as usize]);
        }
        out
    }

    pub(super) fn seconds(&self) -> (u64, Vec<Usage>) {
        let first = (self.head + 1).saturating_sub(self.window);
        let mut out: Vec<Usage> = (first..=self.head)
            .map(|s| self.ring[(s % RING) as usize])
            .collect();
        if let Some(newest) = out.last_mut() {
            for s in self.head + 1..=self.head + AHEAD_SECS {
                newest.add_saturating(self.ring[(s % RING) as usize]);
            }
        }
        (first, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: u64) -> Usage {
        Usage {
            requests: n,
            ..Usage::default()
        }
    }

    #[test]
    fn the_total_follows_adds_and_the_window_sliding_past_them() {
        let mut agg = Aggregate::new(10, 100);
        agg.add_at(100, req(2));
        agg.add_at(95, req(1));
        agg.add_at(90, req(7)); // before the window: not summed
        assert_eq!(agg.total().requests, 3);
        agg.advance(104);
        assert_eq!(agg.total().requests, 3, "95 stays until 105");
        agg.advance(105);
        assert_eq!(agg.total().requests, 2);
        agg.advance(110);
        assert_eq!(agg.total().requests, 0);
        agg.add_at(110, req(1));
        agg.advance(10_000);
        assert_eq!(agg.total().requests, 0, "a long gap empties it");
        assert!(agg.ring.iter().all(|u| u.requests == 0));
    }

    #[test]
    fn a_second_ahead_counts_now_and_stays_until_it_leaves() {
        let mut agg = Aggregate::new(10, 100);
        agg.add_at(103, req(4));
        agg.add_at(100 + AHEAD_SECS + 1, req(50)); // too far ahead
        assert_eq!(agg.total().requests, 4);
        let (first, seconds) = agg.seconds();
        assert_eq!((first, seconds.len()), (91, 10));
        assert_eq!(seconds[9].requests, 4);
        agg.advance(112);
        assert_eq!(agg.total().requests, 4);
        agg.advance(113);
        assert_eq!(agg.total().requests, 0);
    }

    #[test]
    fn recent_sums_the_newest_seconds_only() {
        let mut agg = Aggregate::new(10, 100);
        agg.add_at(95, req(1));
        agg.add_at(99, req(10));
        agg.add_at(100, req(100));
        assert_eq!(agg.recent(2).requests, 110);
        assert_eq!(agg.recent(6).requests, 111);
        assert_eq!(agg.recent(60).requests, agg.total().requests);
    }

    #[test]
    fn a_replaced_value_moves_the_total_by_its_difference() {
        let mut agg = Aggregate::new(10, 100);
        agg.add_at(99, req(5));
        agg.apply(
            99,
            Delta {
                old: req(5),
                new: req(3),
            },
        );
        assert_eq!(agg.total().requests, 3);
        assert_eq!(agg.seconds().1[8].requests, 3);
    }
}
