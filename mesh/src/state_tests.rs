#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use proptest::prelude::*;

/// One frame's worth of state from one sender.
#[derive(Debug, Clone)]
enum Op {
    Slot { inc: u8, worker: u8, round: u64 },
    Snapshot { worker: u8, poller: u8, at: u64 },
}

fn inc(i: u8) -> Incarnation {
    Incarnation::new(format!("n{}", i % 2), u64::from(i / 2) + 1)
}

fn worker(w: u8) -> Arc<str> {
    Arc::from(format!("http://w{w}:8000"))
}

// A sender reads its atomics once per round, so the values at one marker
// are a function of the marker: model that deterministically.
fn values(i: u8, w: u8, round: u64) -> (Inflight, u64) {
    let seed = round * 31 + u64::from(i) * 7 + u64::from(w);
    (
        Inflight {
            requests: seed % 5,
            tokens: seed % 97,
            pending_prefill: seed % 13,
        },
        round * 100 + u64::from(w),
    )
}

fn apply(state: &mut FleetState, op: &Op) {
    match *op {
        Op::Slot {
            inc: i,
            worker: w,
            round,
        } => {
            let (inflight, dispatched) = values(i, w, round);
            state.apply_slot(&inc(i), &worker(w), round, inflight, dispatched);
        }
        Op::Snapshot {
            worker: w,
            poller,
            at,
        } => {
            let value = SnapshotValue {
                source: EngineKind::Vllm,
                load: EngineLoad {
                    token_usage: Some(f64::from(w) / 10.0),
                    waiting_requests: Some(at),
                    ..EngineLoad::default()
                },
                dispatched_mark: at * 3 + u64::from(poller),
            };
            state.apply_snapshot(&worker(w), value, (at, Arc::from(format!("n{poller}"))));
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u8..3, 0u64..12).prop_map(|(inc, worker, round)| Op::Slot { inc, worker, round }),
        (0u8..3, 0u8..3, 0u64..12).prop_map(|(worker, poller, at)| Op::Snapshot {
            worker,
            poller,
            at
        }),
    ]
}

fn state_of(ops: &[Op]) -> FleetState {
    let mut s = FleetState::new();
    for o in ops {
        apply(&mut s, o);
    }
    s
}

fn merged(a: &FleetState, b: &FleetState) -> FleetState {
    let mut out = a.clone();
    out.merge(b);
    out
}

proptest! {
    #[test]
    fn merge_is_commutative(a in prop::collection::vec(op(), 0..30), b in prop::collection::vec(op(), 0..30)) {
        let (a, b) = (state_of(&a), state_of(&b));
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
    }

    #[test]
    fn merge_is_associative(
        a in prop::collection::vec(op(), 0..20),
        b in prop::collection::vec(op(), 0..20),
        c in prop::collection::vec(op(), 0..20),
    ) {
        let (a, b, c) = (state_of(&a), state_of(&b), state_of(&c));
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
    }

    #[test]
    fn merge_is_idempotent(a in prop::collection::vec(op(), 0..30)) {
        let a = state_of(&a);
        prop_assert_eq!(merged(&a, &a), a.clone());
        prop_assert_eq!(merged(&merged(&a, &a), &a), a);
    }

    /// Frames delivered in any order, any number of times, give the state
    /// of in-order delivery: reordering and duplication are harmless.
    #[test]
    fn delivery_order_and_duplicates_do_not_matter(
        ops in prop::collection::vec(op(), 1..40),
        shuffle in prop::collection::vec(any::<prop::sample::Index>(), 0..80),
    ) {
        let in_order = state_of(&ops);
        let mut delivered: Vec<Op> = shuffle.iter().map(|i| i.get(&ops).clone()).collect();
        delivered.extend(ops.iter().rev().cloned());
        prop_assert_eq!(state_of(&delivered), in_order);
    }

    /// Losing frames only loses what a later frame of the same slot or an
    /// anti-entropy full sync (here: the last round of every slot) restores.
    #[test]
    fn lost_frames_are_repaired_by_a_full_sync(
        ops in prop::collection::vec(op(), 1..40),
        keep in prop::collection::vec(any::<bool>(), 40),
    ) {
        let truth = state_of(&ops);
        let mut lossy = FleetState::new();
        for (o, k) in ops.iter().zip(keep.iter()) {
            if *k { apply(&mut lossy, o); }
        }
        // Full sync: every sender re-sends the latest value of each slot and
        // each poller its latest snapshot.
        let full = state_of(&ops);
        lossy.merge(&full);
        prop_assert_eq!(lossy, truth);
    }
}

#[test]
fn inflight_sums_only_counted_incarnations() {
    let mut s = FleetState::new();
    let w = worker(0);
    let a = inc(0);
    let b = inc(1);
    let inflight = |r| Inflight {
        requests: r,
        tokens: r * 10,
        pending_prefill: r,
    };
    s.apply_slot(&a, &w, 1, inflight(2), 50);
    s.apply_slot(&b, &w, 1, inflight(3), 70);
    let both: HashSet<_> = [a.clone(), b.clone()].into();
    assert_eq!(s.inflight(&w, &both).requests, 5);
    let only_a: HashSet<_> = [a.clone()].into();
    assert_eq!(s.inflight(&w, &only_a).tokens, 20);
    // The dead incarnation's dispatched work keeps counting.
    assert_eq!(s.dispatched(&w), 120);
    s.forget(&b);
    assert_eq!(s.inflight(&w, &both).requests, 2);
    assert_eq!(s.dispatched(&w), 120);
    // An older round never overwrites a newer one.
    assert!(!s.apply_slot(&a, &w, 0, inflight(9), 10));
    assert_eq!(s.slot(&a, &w), Some(inflight(2)));
}

#[test]
fn snapshot_order_is_poll_time_then_poller() {
    let mut s = FleetState::new();
    let w = worker(1);
    let v = |m| SnapshotValue {
        source: EngineKind::Sglang,
        load: EngineLoad::default(),
        dispatched_mark: m,
    };
    assert!(s.apply_snapshot(&w, v(1), (10, Arc::from("a"))));
    assert!(s.apply_snapshot(&w, v(2), (10, Arc::from("b"))));
    assert!(!s.apply_snapshot(&w, v(3), (10, Arc::from("a"))));
    assert!(!s.apply_snapshot(&w, v(4), (9, Arc::from("z"))));
    assert_eq!(s.snapshot(&w).unwrap().0.dispatched_mark, 2);
}
