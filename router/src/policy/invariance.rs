//! Fleet invariance: a view summed over three replicas' bookings must lead
//! every load-reading policy to the pick one replica holding all of those
//! bookings makes. This is what lets thresholds mean the same on 1 or N
//! replicas.

use std::sync::Arc;

use super::testkit::*;
use super::*;
use crate::config::{CacheAwareConfig, LeastLoadConfig};
use crate::fleet::FleetView;
use crate::workers::SlotBooking;

struct Worlds {
    workers: Vec<Arc<Worker>>,
    replicas: ReplicaFleet,
    held: Vec<SlotBooking>,
    next_replica: usize,
}

impl Worlds {
    /// Books `n` requests of `tokens` on `worker` in both worlds: on the
    /// worker's own ledger (one replica sees everything) and spread
    /// round-robin over the three replicas' slots.
    fn book(&mut self, worker: usize, n: usize, tokens: u64) {
        for _ in 0..n {
            let w = &self.workers[worker];
            self.held.push(w.ledger().book(tokens, tokens));
            let replica = self.next_replica % 3;
            self.next_replica += 1;
            self.held.push(self.replicas.book(replica, w, tokens));
        }
    }

    fn pick(
        &self,
        policy: &dyn Policy,
        candidates: &[usize],
        request: &RequestInfo,
    ) -> [Option<usize>; 2] {
        let set: Vec<_> = candidates
            .iter()
            .map(|&i| self.workers[i].clone())
            .collect();
        let views: [&dyn FleetView; 2] = [&fleet(), &self.replicas];
        views.map(|view| policy.select(&set, request, view).map(|i| candidates[i]))
    }
}

fn worlds() -> Worlds {
    let mut worlds = Worlds {
        workers: workers(4),
        replicas: ReplicaFleet::new(3),
        held: Vec::new(),
        next_replica: 0,
    };
    for (worker, n, tokens) in [(0, 90, 10), (1, 12, 30), (2, 6, 50), (3, 24, 20)] {
        worlds.book(worker, n, tokens);
    }
    // The poll: both worlds count their work since it from here.
    for (i, (queued, waiting)) in [(2000, 10), (0, 3), (0, 3), (2500, 50)]
        .into_iter()
        .enumerate()
    {
        let w = &worlds.workers[i];
        assert_eq!(
            w.ledger().counts().dispatched_since_poll,
            worlds.replicas.dispatched_since_poll(w)
        );
        worlds.replicas.learn_poll(w);
        set_load(
            w,
            engine()
                .queued(queued)
                .waiting(waiting)
                .usage(0.3)
                .throughput(2000.0),
        );
    }
    // Since the poll: 1000 / 4000 / 9000 / 0 tokens, one request per 1000.
    worlds.book(0, 1, 1000);
    worlds.book(1, 4, 1000);
    worlds.book(2, 9, 1000);
    worlds
}

#[test]
fn three_replicas_summed_pick_what_one_replica_with_everything_picks() {
    let worlds = worlds();
    let all = [0, 1, 2, 3];
    let some = plain();

    // least_load: 3000, 4000, 9000, 2500 tokens at 2000 tok/s.
    let least = LeastLoadPolicy::new(LeastLoadConfig::default());
    assert_eq!(worlds.pick(&least, &all, &some), [Some(3); 2]);

    // load_aware: queues 10, 3, 3, 50; the tie goes to fewer in-flight
    // requests (16 vs 15).
    let aware = LoadAwarePolicy::new(128);
    assert_eq!(worlds.pick(&aware, &all, &some), [Some(2); 2]);

    // power_of_two on fixed pairs: equal k, then queue, then in-flight.
    assert_eq!(worlds.pick(&PowerOfTwoPolicy, &[0, 3], &some), [Some(0); 2]);
    assert_eq!(worlds.pick(&PowerOfTwoPolicy, &[1, 2], &some), [Some(2); 2]);

    // cache_aware: worker 0 holds the prompt, but fleet-wide it has 91
    // requests in flight against 15: the count guard fires (it would not on
    // one replica's third of the traffic) and the least loaded wins.
    let request = text("a prompt that worker zero has cached already");
    let cache = [CacheAwareConfig::default(); 2].map(CacheAwarePolicy::new);
    for policy in &cache {
        let only = [worlds.workers[0].clone()];
        assert_eq!(policy.select(&only, &request, &fleet()), Some(0));
    }
    let views: [&dyn FleetView; 2] = [&fleet(), &worlds.replicas];
    let set: Vec<_> = worlds.workers.clone();
    let picks = [0, 1].map(|i| cache[i].select(&set, &request, views[i]));
    assert_eq!(picks, [Some(2); 2]);
}

#[test]
fn one_replica_alone_would_pick_differently() {
    // The control: replica 0's own third of the traffic shows a spread of
    // about 30 requests, under the guard's 64, so it would keep affinity
    // and pile more onto the busiest worker.
    let worlds = worlds();
    let alone = worlds.replicas.only(0);
    let request = text("a prompt that worker zero has cached already");
    let policy = CacheAwarePolicy::new(CacheAwareConfig::default());
    let only = [worlds.workers[0].clone()];
    assert_eq!(policy.select(&only, &request, &alone), Some(0));
    assert_eq!(policy.select(&worlds.workers, &request, &alone), Some(0));
    assert_eq!(
        policy.select(&worlds.workers, &request, &worlds.replicas),
        Some(2)
    );
}
