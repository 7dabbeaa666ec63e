#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Frames are split by their encoded size, so state made of long worker
//! URLs (up to `MAX_KEY_BYTES`) still crosses a link: a node that joins
//! after it was written gets all of it, and nothing the outbox records as
//! sent was never encoded.

mod common;

use std::time::Duration;

use common::{Ca, Node, cluster, config, wait_every, wait_for_full_mesh};

/// A URL of exactly `len` bytes, distinct per `i`.
fn long_url(i: usize, len: usize) -> String {
    let head = format!("http://w{i}.example:8000/");
    format!("{head}{}", "p".repeat(len - head.len()))
}

/// `n0` alone, then `n1` joining it; returns both once meshed.
fn late_joiner(ca: &Ca, n0: Vec<Node>) -> Vec<Node> {
    let mut nodes = n0;
    let seed = nodes[0].mesh().gossip_addr();
    nodes.push(Node::start(config("n1", ca.tls("n1"), &[seed])));
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "the late joiner never meshed"
    );
    nodes
}

/// 600 worker-set entries of 2,000-byte URLs (1.2 MB, more than one
/// frame may hold) written before `n1` joins all reach it.
#[test]
fn a_worker_set_of_long_urls_crosses_a_new_link() {
    let ca = Ca::new("ca");
    let n0 = cluster(&ca, 1, |_| {});
    let set = n0[0].mesh().worker_set();
    for i in 0..600 {
        set.write(&long_url(i, 2000), true).unwrap();
    }
    let nodes = late_joiner(&ca, n0);
    let theirs = nodes[1].mesh().worker_set();
    let all = wait_every(Duration::from_millis(50), Duration::from_secs(10), || {
        theirs.lock().iter().count() == 600
    });
    assert!(
        all,
        "the late joiner holds {} of 600 entries (drops on n0: {:?})",
        theirs.lock().iter().count(),
        nodes[0].mesh().dropped_by_reason()
    );
    assert_eq!(theirs.lock().to_entries(), set.lock().to_entries());
}

/// 600 workers with 2,000-byte keys booked on `n0` (each a key definition
/// and a slot): a node joining later counts every one of them.
#[test]
fn slots_of_workers_with_long_keys_reach_a_late_joiner() {
    let ca = Ca::new("ca");
    let n0 = cluster(&ca, 1, |_| {});
    let keys: Vec<String> = (0..600).map(|i| long_url(i, 2000)).collect();
    let _held: Vec<_> = keys
        .iter()
        .map(|k| n0[0].mesh().worker(k).book(1, 10))
        .collect();
    let nodes = late_joiner(&ca, n0);
    let slots: Vec<_> = keys.iter().map(|k| nodes[1].mesh().worker(k)).collect();
    let counted = || {
        slots
            .iter()
            .filter(|s| s.fleet().counts.requests == 1)
            .count()
    };
    let all = wait_every(Duration::from_millis(50), Duration::from_secs(10), || {
        counted() == keys.len()
    });
    assert!(all, "the late joiner counts {} of 600 slots", counted());
}

/// 1,100 workers with 2,000-byte keys that `n0` polls but has not booked:
/// their key definitions alone (2.2 MB) reach a node joining later, which
/// then knows `n0` polls each.
#[test]
fn key_definitions_of_many_long_keys_reach_a_late_joiner() {
    let ca = Ca::new("ca");
    let n0 = cluster(&ca, 1, |_| {});
    let keys: Vec<String> = (0..1100).map(|i| long_url(i, 2000)).collect();
    let _slots: Vec<_> = keys
        .iter()
        .map(|k| {
            let slot = n0[0].mesh().worker(k);
            slot.set_polled(true);
            slot
        })
        .collect();
    let nodes = late_joiner(&ca, n0);
    let known = || {
        keys.iter()
            .filter(|k| nodes[1].mesh().owner(k).as_deref() == Some("n0"))
            .count()
    };
    let all = wait_every(Duration::from_millis(100), Duration::from_secs(10), || {
        known() == keys.len()
    });
    assert!(all, "the late joiner knows n0 polls {} of 1,100", known());
}
