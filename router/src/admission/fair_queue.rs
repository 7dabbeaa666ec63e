//! The order queued requests get a freed slot in: strict priority between
//! classes, and weighted fair share by token-work between the flows of a
//! class.
//!
//! Within a class, first by the fleet: each flow belongs to a group (its
//! tenant) whose grants across the fleet are counted over the mesh
//! ([`FleetShare`]); the waiting flow whose group was granted the least
//! token-work lately for its weight goes first. So a tenant whose traffic
//! reaches few replicas is served first there until it has its share of
//! the whole fleet, instead of half of those replicas' slots.
//!
//! Between flows of equal service (a tenant's own flows, refined by fairness
//! id, or tenants level at the moment), start-time fair queueing (SFQ;
//! Goyal, Vin and Cheng, 1996): a waiter's start tag is the later of the
//! class's virtual clock and its flow's previous finish tag, its finish
//! tag is its start plus `cost / weight`, and the waiter with the smallest
//! start tag goes next (the clock moves to it). While two flows both have
//! waiters, each gets token-work in proportion to its weight however many
//! requests it queues; a flow that was idle starts at the clock, so it
//! earns no credit for the time it sent nothing. It is deficit round
//! robin's fairness with one decision per freed slot, which is how slots
//! free here.
//!
//! Pure and synchronous: [`Admission`](super::Admission) holds it under a
//! lock and does the waking.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::class::{Ask, Priority};
use crate::tenants::share::FleetShare;

/// Virtual-time units per token of cost (so a weight divides finely).
const TAG_UNITS_PER_TOKEN: u64 = 1 << 10;

/// A queued item and its tags.
#[derive(Debug)]
struct Entry<T> {
    id: u64,
    start: u64,
    item: T,
}

/// One flow's waiters, oldest first.
#[derive(Debug)]
struct Flow<T> {
    /// Finish tag of its newest waiter.
    finish: u64,
    /// Its weight (from its first waiter's ask).
    weight: u64,
    /// Its group's hold on the fleet's slots (none: counts as none held).
    share: Option<Arc<dyn FleetShare>>,
    waiters: VecDeque<Entry<T>>,
}

impl<T> Flow<T> {
    /// Its group's token-work granted lately, fleet-wide, per unit of
    /// weight (scaled); each group read once per decision (`cache`).
    fn served(&self, cache: &mut HashMap<*const (), u64>) -> u64 {
        let Some(share) = &self.share else {
            return 0;
        };
        let key = Arc::as_ptr(share).cast::<()>();
        let served = *cache.entry(key).or_insert_with(|| share.served());
        served.saturating_mul(TAG_UNITS_PER_TOKEN) / self.weight.max(1)
    }
}

/// One class's flows and virtual clock.
#[derive(Debug)]
struct Class<T> {
    clock: u64,
    flows: HashMap<Arc<str>, Flow<T>>,
    len: usize,
}

impl<T> Default for Class<T> {
    fn default() -> Self {
        Self {
            clock: 0,
            flows: HashMap::new(),
            len: 0,
        }
    }
}

impl<T> Class<T> {
    /// The flow whose group was granted the least token-work lately for
    /// its weight, then whose oldest waiter has the smallest start tag (then
    /// the earlier arrival).
    fn next_flow(&self) -> Option<Arc<str>> {
        let mut cache = HashMap::new();
        self.flows
            .iter()
            .filter_map(|(name, flow)| {
                let head = flow.waiters.front()?;
                Some(((flow.served(&mut cache), head.start, head.id), name))
            })
            .min_by_key(|(key, _)| *key)
            .map(|(_, name)| name.clone())
    }

    /// The flow whose newest waiter is furthest from service: the reverse
    /// of [`Class::next_flow`]'s order.
    fn last_flow(&self) -> Option<(Arc<str>, u64)> {
        let mut cache = HashMap::new();
        self.flows
            .iter()
            .filter_map(|(name, flow)| {
                let tail = flow.waiters.back()?;
                Some(((flow.served(&mut cache), flow.finish, tail.id), name))
            })
            .max_by_key(|(key, _)| *key)
            .map(|((_, _, id), name)| (name.clone(), id))
    }

    /// Takes the waiter `id` of `flow` out.
    fn take(&mut self, flow: &Arc<str>, id: u64) -> Option<T> {
        let queue = self.flows.get_mut(flow)?;
        let at = queue.waiters.iter().position(|e| e.id == id)?;
        let was_tail = at + 1 == queue.waiters.len();
        let entry = queue.waiters.remove(at)?;
        if was_tail && at > 0 {
            // A waiter that leaves unserved from the end is not charged:
            // the flow's next one starts where it would have.
            queue.finish = entry.start;
        }
        if queue.waiters.is_empty() {
            self.flows.remove(flow);
        }
        self.len -= 1;
        if self.len == 0 {
            // Nothing waits: tags restart, so they never grow without end.
            self.clock = 0;
        }
        Some(entry.item)
    }
}

/// Queued requests by class and flow; see the module doc for the order.
#[derive(Debug)]
pub struct FairQueue<T> {
    classes: [Class<T>; 3],
    /// Where each queued id is: its class and flow.
    index: HashMap<u64, (Priority, Arc<str>)>,
    next_id: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            classes: Default::default(),
            index: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Waiters of every class.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Waiters of `class`.
    pub fn len_of(&self, class: Priority) -> usize {
        self.classes[class.index()].len
    }

    /// Queues `item` as `ask` says; its id takes it out again
    /// ([`FairQueue::remove`]).
    pub fn push(&mut self, ask: &Ask, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let class = &mut self.classes[ask.priority.index()];
        let clock = class.clock;
        let flow = class.flows.entry(ask.flow.clone()).or_insert_with(|| Flow {
            finish: clock,
            weight: ask.weight.max(1),
            share: ask.share.clone(),
            waiters: VecDeque::new(),
        });
        // A reloaded weight or share applies from the next waiter on.
        flow.weight = ask.weight.max(1);
        flow.share = ask.share.clone();
        let start = clock.max(flow.finish);
        let span = ask
            .cost
            .max(1)
            .saturating_mul(TAG_UNITS_PER_TOKEN)
            .checked_div(ask.weight.max(1))
            .unwrap_or(u64::MAX)
            .max(1);
        flow.finish = start.saturating_add(span);
        flow.waiters.push_back(Entry { id, start, item });
        class.len += 1;
        self.index.insert(id, (ask.priority, ask.flow.clone()));
        id
    }

    /// The next waiter to serve: the highest class's, and within it the
    /// flow that is furthest behind its fair share.
    pub fn pop(&mut self) -> Option<T> {
        for class in &mut self.classes {
            let Some(flow) = class.next_flow() else {
                continue;
            };
            let queue = class.flows.get_mut(&flow)?;
            let entry = queue.waiters.front()?;
            let (id, start) = (entry.id, entry.start);
            class.clock = class.clock.max(start);
            self.index.remove(&id);
            return class.take(&flow, id);
        }
        None
    }

    /// Takes waiter `id` out (it gave up); `None` when it already left.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let (class, flow) = self.index.remove(&id)?;
        self.classes[class.index()].take(&flow, id)
    }

    /// Takes out the sheddable waiter furthest from service (the newest
    /// of the flow that would be served last), to make room for a request
    /// of a higher class; `None` when no sheddable request waits.
    pub fn evict_sheddable(&mut self) -> Option<T> {
        let class = &mut self.classes[Priority::Sheddable.index()];
        let (flow, id) = class.last_flow()?;
        self.index.remove(&id);
        class.take(&flow, id)
    }

    /// Waiters by flow and class (for the operator's view).
    pub fn depths(&self) -> Vec<(Arc<str>, Priority, usize)> {
        let mut out = Vec::new();
        for (class, queue) in Priority::ALL.into_iter().zip(&self.classes) {
            for (name, flow) in &queue.flows {
                out.push((name.clone(), class, flow.waiters.len()));
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ask(priority: Priority, flow: &str, weight: u64, cost: u64) -> Ask {
        Ask {
            priority,
            flow: Arc::from(flow),
            weight,
            cost,
            share: None,
        }
    }

    /// Serves `slots` waiters from two always-backlogged flows and returns
    /// the token-work each got.
    fn shares(a: (u64, u64, usize), b: (u64, u64, usize), slots: usize) -> (u64, u64) {
        let mut q = FairQueue::default();
        // (weight, cost, how many it keeps queued)
        for _ in 0..a.2 {
            q.push(&ask(Priority::Standard, "a", a.0, a.1), ("a", a.1));
        }
        for _ in 0..b.2 {
            q.push(&ask(Priority::Standard, "b", b.0, b.1), ("b", b.1));
        }
        let (mut got_a, mut got_b) = (0, 0);
        for _ in 0..slots {
            let (flow, cost) = q.pop().unwrap();
            // Each flow refills what it lost: both stay backlogged.
            if flow == "a" {
                got_a += cost;
                q.push(&ask(Priority::Standard, "a", a.0, a.1), ("a", a.1));
            } else {
                got_b += cost;
                q.push(&ask(Priority::Standard, "b", b.0, b.1), ("b", b.1));
            }
        }
        (got_a, got_b)
    }

    #[test]
    fn equal_weights_share_token_work_equally_whatever_each_queues() {
        let (a, b) = shares((1, 100, 50), (1, 100, 10), 6000);
        let share = a as f64 / (a + b) as f64;
        assert!((share - 0.5).abs() < 0.01, "a got {share}");
    }

    #[test]
    fn shares_follow_token_work_not_request_counts() {
        // a sends requests 4x as large: it gets a quarter of the requests
        // and half of the work.
        let (a, b) = shares((1, 400, 20), (1, 100, 20), 5000);
        let share = a as f64 / (a + b) as f64;
        assert!((share - 0.5).abs() < 0.02, "a got {share}");
    }

    #[test]
    fn weights_divide_the_work() {
        let (a, b) = shares((3, 100, 20), (1, 100, 20), 8000);
        let share = a as f64 / (a + b) as f64;
        assert!((share - 0.75).abs() < 0.01, "a got {share}");
    }

    #[test]
    fn a_higher_class_always_goes_first() {
        let mut q = FairQueue::default();
        q.push(&ask(Priority::Sheddable, "x", 1, 1), "shed");
        q.push(&ask(Priority::Standard, "x", 1, 1), "std");
        q.push(&ask(Priority::Critical, "y", 1, 1_000_000), "crit");
        assert_eq!(q.len_of(Priority::Critical), 1);
        assert_eq!(q.pop(), Some("crit"));
        assert_eq!(q.pop(), Some("std"));
        assert_eq!(q.pop(), Some("shed"));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn one_flow_is_served_in_arrival_order() {
        let mut q = FairQueue::default();
        for i in 0..10 {
            q.push(&ask(Priority::Standard, "a", 1, 10 + i), i);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn an_idle_flow_earns_no_credit() {
        let mut q = FairQueue::default();
        for _ in 0..100 {
            q.push(&ask(Priority::Standard, "a", 1, 10), "a");
        }
        for _ in 0..50 {
            q.pop();
        }
        // b arrives late: it alternates with a from now on, it does not get
        // the 50 turns a had alone.
        for _ in 0..10 {
            q.push(&ask(Priority::Standard, "b", 1, 10), "b");
        }
        let next: Vec<_> = (0..10).map(|_| q.pop().unwrap()).collect();
        let bs = next.iter().filter(|f| **f == "b").count();
        assert!((4..=6).contains(&bs), "{next:?}");
    }

    #[test]
    fn removal_and_eviction_take_the_right_waiter() {
        let mut q = FairQueue::default();
        let first = q.push(&ask(Priority::Sheddable, "s", 1, 5), 1);
        q.push(&ask(Priority::Sheddable, "s", 1, 5), 2);
        q.push(&ask(Priority::Standard, "t", 1, 5), 3);
        assert_eq!(q.remove(first), Some(1));
        assert_eq!(q.remove(first), None);
        assert_eq!(q.evict_sheddable(), Some(2));
        assert_eq!(q.evict_sheddable(), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.depths(), vec![(Arc::from("t"), Priority::Standard, 1)]);
        assert_eq!(q.pop(), Some(3));
    }

    /// A share whose fleet-wide hold the test sets.
    #[derive(Debug, Default)]
    struct Held(std::sync::atomic::AtomicU64);

    impl FleetShare for Held {
        fn served(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn start(&self, _work: u64) -> crate::tenants::share::Running {
            Box::new(())
        }
    }

    #[test]
    fn the_group_holding_least_of_the_fleet_goes_first() {
        let (a, b) = (Arc::new(Held::default()), Arc::new(Held::default()));
        let mut q = FairQueue::default();
        let with = |flow: &str, share: &Arc<Held>, weight: u64| Ask {
            share: Some(share.clone() as Arc<dyn FleetShare>),
            ..ask(Priority::Standard, flow, weight, 10)
        };
        for _ in 0..3 {
            q.push(&with("a", &a, 1), "a");
        }
        for _ in 0..3 {
            q.push(&with("b", &b, 1), "b");
        }
        // Elsewhere in the fleet, a was granted 5 and b 1: b goes first
        // though a's waiters are older, until the two level.
        a.0.store(5, std::sync::atomic::Ordering::Relaxed);
        b.0.store(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(q.pop(), Some("b"));
        b.0.store(5, std::sync::atomic::Ordering::Relaxed);
        // Level: the older waiter (a's) goes.
        assert_eq!(q.pop(), Some("a"));
        // A weight of 3 makes 9 granted count as 3 against b's 5.
        let mut q = FairQueue::default();
        q.push(&with("b", &b, 1), "b");
        q.push(&with("c", &a, 3), "c");
        a.0.store(9, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(q.pop(), Some("c"));
    }

    #[test]
    fn eviction_takes_from_the_flow_furthest_ahead() {
        let mut q = FairQueue::default();
        for i in 0..5 {
            q.push(&ask(Priority::Sheddable, "heavy", 1, 100), ("heavy", i));
        }
        q.push(&ask(Priority::Sheddable, "light", 1, 100), ("light", 0));
        assert_eq!(q.evict_sheddable(), Some(("heavy", 4)));
    }
}
