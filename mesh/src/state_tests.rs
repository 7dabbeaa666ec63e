#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use super::*;
use proptest::prelude::*;

/// One frame entry from one sender. (Polling flags are not here: they
/// are not ordered by a marker but ride one ordered stream per link and are
/// re-asserted by every full sync.)
#[derive(Debug, Clone)]
enum Op {
    Slot { inc: u8, worker: u8, round: u64 },
    Basis { inc: u8, worker: u8, at: u64 },
    Snapshot { worker: u8, poller: u8, at: u64 },
}

fn inc(i: u8) -> Incarnation {
    Incarnation::new(format!("n{}", i % 2), u64::from(i / 2) + 1)
}

fn worker(w: u8) -> Arc<str> {
    Arc::from(format!("http://w{w}:8000"))
}

/// A fixed receiver clock, so every delivery order sees the same clamp.
fn clock() -> Clock {
    Clock {
        now: Instant::now(),
        unix_ms: 1_000,
    }
}

// A sender reads its atomics once per round, so the values at one marker
// are a function of the marker: model that deterministically.
fn values(i: u8, w: u8, round: u64) -> SlotValue {
    let seed = round * 31 + u64::from(i) * 7 + u64::from(w);
    SlotValue {
        counts: LoadCounts {
            requests: seed % 5,
            tokens: seed % 97,
            pending_prefill: seed % 13,
            dispatched_since_poll: seed % 41,
        },
        basis_ms: round * 10,
    }
}

fn apply(state: &mut FleetState, op: &Op, clock: Clock) {
    match *op {
        Op::Slot {
            inc: i,
            worker: w,
            round,
        } => {
            state.apply_slot(
                &inc(i),
                &worker(w),
                round,
                values(i, w, round).counts,
                clock.now,
            );
        }
        Op::Basis {
            inc: i,
            worker: w,
            at,
        } => {
            state.apply_basis(&inc(i), &worker(w), at, clock.now);
        }
        Op::Snapshot {
            worker: w,
            poller,
            at,
        } => {
            // Poll times up to 2.5 s past the receiver's clock: some clamp.
            let value = SnapshotValue {
                source: EngineKind::Vllm,
                load: EngineLoad {
                    token_usage: Some(f64::from(w) / 10.0),
                    waiting_requests: Some(at),
                    ..EngineLoad::default()
                },
                claimed_polled_at_ms: at * 100,
            };
            state.apply_snapshot(&worker(w), value, &Arc::from(format!("n{poller}")), clock);
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u8..3, 0u64..12).prop_map(|(inc, worker, round)| Op::Slot { inc, worker, round }),
        (0u8..4, 0u8..3, 0u64..3000).prop_map(|(inc, worker, at)| Op::Basis { inc, worker, at }),
        (0u8..3, 0u8..3, 0u64..36).prop_map(|(worker, poller, at)| Op::Snapshot {
            worker,
            poller,
            at
        }),
    ]
}

/// What a replica would read from the state: slot values and snapshots.
type Essence = (
    BTreeMap<(Incarnation, String), SlotValue>,
    BTreeMap<String, (String, u64, u64)>,
);

fn essence(s: &FleetState) -> Essence {
    let mut slots = BTreeMap::new();
    for (inc, peer) in &s.peers {
        for (w, r) in &peer.slots {
            slots.insert((inc.clone(), w.to_string()), r.value());
        }
    }
    let snaps = s
        .snapshots
        .iter()
        .map(|(w, st)| {
            (
                w.to_string(),
                (
                    st.poller.to_string(),
                    st.polled_at_ms,
                    st.value.claimed_polled_at_ms,
                ),
            )
        })
        .collect();
    (slots, snaps)
}

fn state_of(ops: &[Op], clock: Clock) -> FleetState {
    let mut s = FleetState::new();
    for o in ops {
        apply(&mut s, o, clock);
    }
    s
}

proptest! {
    /// Frames delivered in any order, any number of times, give the state
    /// of in-order delivery: reordering and duplication are harmless (the
    /// merge is commutative, associative and idempotent on the live path).
    #[test]
    fn delivery_order_and_duplicates_do_not_matter(
        ops in prop::collection::vec(op(), 1..40),
        shuffle in prop::collection::vec(any::<prop::sample::Index>(), 0..80),
    ) {
        let c = clock();
        let in_order = state_of(&ops, c);
        let mut delivered: Vec<Op> = shuffle.iter().map(|i| i.get(&ops).clone()).collect();
        delivered.extend(ops.iter().rev().cloned());
        prop_assert_eq!(essence(&state_of(&delivered, c)), essence(&in_order));
    }

    /// Losing frames only loses what a later frame of the same slot or an
    /// anti-entropy full sync (every sender's latest entries) restores.
    #[test]
    fn lost_frames_are_repaired_by_a_full_sync(
        ops in prop::collection::vec(op(), 1..40),
        keep in prop::collection::vec(any::<bool>(), 40),
    ) {
        let c = clock();
        let truth = state_of(&ops, c);
        let mut lossy = FleetState::new();
        for (o, k) in ops.iter().zip(keep.iter()) {
            if *k { apply(&mut lossy, o, c); }
        }
        for o in &ops {
            apply(&mut lossy, o, c);
        }
        prop_assert_eq!(essence(&lossy), essence(&truth));
    }

    /// The running totals always equal the sum recomputed over the counted
    /// incarnations, through merges, membership changes (a peer starting
    /// or stopping to count), expiry and forgetting.
    #[test]
    fn running_totals_equal_the_recomputed_sum(
        steps in prop::collection::vec((op(), 0u8..16, 0u8..10), 1..60),
    ) {
        let c = clock();
        let mut s = FleetState::new();
        let mut counted: HashSet<Incarnation> = HashSet::new();
        for (o, members, chore) in &steps {
            apply(&mut s, o, c);
            match chore {
                // Membership moves: the bits of `members` say who counts.
                0..=2 => {
                    counted = (0..4u8).filter(|i| members & (1 << i) != 0).map(inc).collect();
                    s.set_counted(&counted);
                }
                3 => s.forget(&inc(members % 4)),
                4 => {
                    s.expire_idle(c.now + Duration::from_secs(1), Duration::ZERO);
                }
                _ => {}
            }
            for w in 0..3u8 {
                prop_assert_eq!(s.total(&worker(w)), s.sum(&worker(w), &counted));
            }
        }
    }
}

fn slot(r: u64, since: u64) -> SlotValue {
    SlotValue {
        counts: LoadCounts {
            requests: r,
            tokens: r * 10,
            pending_prefill: r,
            dispatched_since_poll: since,
        },
        basis_ms: 0,
    }
}

#[test]
fn sums_only_counted_incarnations_and_forgets_the_dead_whole() {
    let mut s = FleetState::new();
    let now = Instant::now();
    let w = worker(0);
    let a = inc(0);
    let b = inc(1);
    s.apply_slot(&a, &w, 1, slot(2, 50).counts, now);
    s.apply_slot(&b, &w, 1, slot(3, 70).counts, now);
    let both: HashSet<_> = [a.clone(), b.clone()].into();
    assert_eq!(s.sum(&w, &both).requests, 5);
    assert_eq!(s.sum(&w, &both).dispatched_since_poll, 120);
    let only_a: HashSet<_> = [a.clone()].into();
    assert_eq!(s.sum(&w, &only_a).tokens, 20);
    // A dead incarnation's work since the poll leaves with it: the fleet
    // value never depends on history a reader may not have seen.
    assert_eq!(s.sum(&w, &only_a).dispatched_since_poll, 50);
    s.forget(&b);
    assert_eq!(s.sum(&w, &both).requests, 2);
    assert_eq!(s.footprint().incarnations, 1);
    // An older round never overwrites a newer one.
    assert!(!s.apply_slot(&a, &w, 0, slot(9, 9).counts, now));
    assert_eq!(s.slot(&a, &w), Some(slot(2, 50)));
}

#[test]
fn snapshot_order_is_poll_time_then_poller_and_resends_are_ignored() {
    let mut s = FleetState::new();
    let c = Clock {
        now: Instant::now(),
        unix_ms: 100_000,
    };
    let w = worker(1);
    let v = |at, waiting| SnapshotValue {
        source: EngineKind::Sglang,
        load: EngineLoad {
            waiting_requests: Some(waiting),
            ..EngineLoad::default()
        },
        claimed_polled_at_ms: at,
    };
    let (a, b, z): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "z".into());
    assert_eq!(s.apply_snapshot(&w, v(99_990, 1), &a, c), Some(99_990));
    assert_eq!(s.apply_snapshot(&w, v(99_990, 2), &b, c), Some(99_990));
    assert_eq!(s.apply_snapshot(&w, v(99_990, 3), &a, c), None);
    assert_eq!(s.apply_snapshot(&w, v(99_989, 4), &z, c), None);
    assert_eq!(s.apply_snapshot(&w, v(99_990, 2), &b, c), None, "a resend");
    let stored = s.snapshot(&w).unwrap();
    assert_eq!(stored.value.load.waiting_requests, Some(2));
    // Age is measured from the poll time: 10 ms old when learned.
    assert_eq!(c.now - stored.taken_at, Duration::from_millis(10));
}

#[test]
fn a_fast_clock_is_clamped_and_cannot_freeze_the_register() {
    let mut s = FleetState::new();
    let w = worker(2);
    let t0 = Instant::now();
    let at = |ms: u64| Clock {
        now: t0 + Duration::from_millis(ms),
        unix_ms: 1_000_000 + ms,
    };
    let v = |claimed| SnapshotValue {
        source: EngineKind::Vllm,
        load: EngineLoad::default(),
        claimed_polled_at_ms: claimed,
    };
    let (fast, honest): (Arc<str>, Arc<str>) = ("fast".into(), "honest".into());
    // An hour ahead (or u64::MAX): stored at the clamp, and no younger
    // than the moment it arrived.
    let hour = 3_600_000;
    assert_eq!(
        s.apply_snapshot(&w, v(1_000_000 + hour), &fast, at(0)),
        Some(1_000_000 + MAX_CLOCK_SKEW_MS)
    );
    assert_eq!(s.snapshot(&w).unwrap().taken_at, t0);
    // Its re-send (anti-entropy) is recognised, not re-clamped later.
    assert_eq!(
        s.apply_snapshot(&w, v(1_000_000 + hour), &fast, at(500)),
        None
    );
    // An honest poll within the skew bound loses; one past it wins.
    let early = MAX_CLOCK_SKEW_MS - 100;
    assert_eq!(
        s.apply_snapshot(&w, v(1_000_000 + early), &honest, at(early)),
        None
    );
    let later = MAX_CLOCK_SKEW_MS + 1;
    assert!(
        s.apply_snapshot(&w, v(1_000_000 + later), &honest, at(later))
            .is_some()
    );
    assert_eq!(&*s.snapshot(&w).unwrap().poller, "honest");
    // The displaced future snapshot, re-sent by anti-entropy, does not come
    // back (clamped anew to a later time it would win again).
    assert_eq!(
        s.apply_snapshot(&w, v(1_000_000 + hour), &fast, at(later + 500)),
        None
    );
    assert_eq!(&*s.snapshot(&w).unwrap().poller, "honest");
    assert!(
        s.apply_snapshot(&w, v(u64::MAX), &fast, at(later + 1))
            .is_some()
    );
}

#[test]
fn idle_entries_expire_and_pollers_are_counted_members_only() {
    let mut s = FleetState::new();
    let t0 = Instant::now();
    let (w0, w1) = (worker(0), worker(1));
    let (a, b) = (inc(0), inc(1));
    s.apply_polls(&a, &w0, true, t0);
    s.apply_polls(&b, &w0, true, t0);
    s.apply_slot(&a, &w1, 1, slot(0, 0).counts, t0);
    let only_a: HashSet<_> = [a.clone()].into();
    assert_eq!(s.pollers(&w0, &only_a), vec![Arc::<str>::from("n0")]);
    assert!(s.pollers_are(&w0, &only_a, &[Arc::from("n0")]));
    assert!(!s.pollers_are(&w0, &only_a, &[]));
    let both: HashSet<_> = [a.clone(), b.clone()].into();
    assert!(!s.pollers_are(&w0, &both, &[Arc::from("n0")]));
    assert!(s.apply_polls(&b, &w0, false, t0));
    // a keeps refreshing w0 (full syncs), not w1.
    let later = t0 + Duration::from_secs(5);
    s.apply_polls(&a, &w0, true, later);
    let gone = s.expire_idle(later + Duration::from_secs(1), Duration::from_secs(3));
    assert_eq!(gone, vec![w1.clone()]);
    assert!(s.mentions(&w0));
    assert!(!s.mentions(&w1));
    assert_eq!(
        s.footprint(),
        StateFootprint {
            incarnations: 1,
            slot_entries: 0,
            poll_entries: 1,
            snapshots: 0
        }
    );
}
