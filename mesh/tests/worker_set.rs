#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The fleet-wide worker set over real links: whose entries a peer may
//! send, how far ahead a stamp may be, and how replicas repair what they
//! missed or refused.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Ca, Node, RawPeer, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::frames::{Frame, WorkerSetEntry, WorkerSetFrame};

fn unix_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

fn entry(url: &str, origin: &str, hlc_us: u64) -> WorkerSetEntry {
    WorkerSetEntry {
        url: url.into(),
        hlc_us,
        origin: origin.into(),
        present: true,
    }
}

fn holds(node: &Node, url: &str) -> bool {
    node.mesh().worker_set().lock().get(url).is_some()
}

fn grew(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, reason: &str) -> u64 {
    after.get(reason).unwrap_or(&0) - before.get(reason).unwrap_or(&0)
}

/// A peer with a valid certificate (`j1`, connected to `n0` only) sends
/// an entry in the name of `n1` — a live, counted peer of `n0`, which
/// speaks for itself — and one of its own stamped 30 s ahead: both are
/// refused and counted by reason, and neither reaches any replica. Its
/// entry in its own name, and one relayed for a node that is not a live
/// peer, are accepted (and repaired on to `n1`, which `j1` never talks to).
#[test]
fn forged_origins_and_far_future_stamps_are_refused_and_counted() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    nodes[1]
        .mesh()
        .worker_set()
        .write("http://10.6.0.1:8000", true)
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || holds(
        &nodes[0],
        "http://10.6.0.1:8000"
    )));
    let honest: Vec<_> = nodes
        .iter()
        .map(|n| n.mesh().worker_set().lock().to_entries())
        .collect();
    let before = nodes[0].mesh().dropped_by_reason();
    let mut peer = RawPeer::connect(&nodes[0], &ca, "j1");
    let now = unix_us();
    peer.send(
        &nodes[0],
        &Frame::Workers(WorkerSetFrame {
            entries: vec![
                // Removes n1's worker in n1's name.
                WorkerSetEntry {
                    present: false,
                    ..entry("http://10.6.0.1:8000", "n1", now + 1_000_000)
                },
                entry("http://10.6.0.66:8000", "n1", now),
                entry("http://10.6.0.67:8000", "j1", now + 30_000_000),
            ],
        }),
    );
    // A frame after them, as a barrier.
    peer.send(
        &nodes[0],
        &Frame::Workers(WorkerSetFrame {
            entries: vec![
                entry("http://10.6.0.2:8000", "j1", now),
                entry("http://10.6.0.3:8000", "ghost", now),
            ],
        }),
    );
    assert!(
        wait_until(Duration::from_secs(5), || holds(
            &nodes[0],
            "http://10.6.0.2:8000"
        )),
        "the honest entry never merged"
    );
    let after = nodes[0].mesh().dropped_by_reason();
    assert_eq!(
        grew(&before, &after, "worker_set_forged_origin"),
        2,
        "{after:?}"
    );
    assert_eq!(grew(&before, &after, "worker_set_future"), 1, "{after:?}");
    assert!(
        holds(&nodes[0], "http://10.6.0.3:8000"),
        "a relay for a non-peer"
    );
    // The relayed and j1's own entries reach n1 by repair; the refused
    // ones never reach anyone.
    assert!(
        wait_until(Duration::from_secs(5), || holds(
            &nodes[1],
            "http://10.6.0.3:8000"
        ) && holds(
            &nodes[1],
            "http://10.6.0.2:8000"
        )),
        "n1 never repaired the entries it missed"
    );
    for (i, node) in nodes.iter().enumerate() {
        let now: Vec<WorkerSetEntry> = node
            .mesh()
            .worker_set()
            .lock()
            .to_entries()
            .into_iter()
            .filter(|e| !e.url.ends_with(".2:8000") && !e.url.ends_with(".3:8000"))
            .collect();
        assert_eq!(now, honest[i], "n{i}'s honest set changed");
    }
    peer.close();
}

/// `n1`'s worker-set clock runs 5 s behind (an injected clock): `n0`'s
/// write reaches it stamped more than the skew bound ahead and is refused,
/// counted, and refused again as the digest repair re-sends it. Once
/// `n1`'s clock is right, the next repair lands it — no other change in
/// the set needed.
#[test]
fn an_entry_refused_as_future_lands_once_the_receivers_clock_allows() {
    const U: &str = "http://10.6.1.1:8000";
    let offset_us = Arc::new(AtomicI64::new(-5_000_000));
    let clock: shoal_mesh::worker_set::WallClock = {
        let offset_us = offset_us.clone();
        Arc::new(move || unix_us().saturating_add_signed(offset_us.load(Ordering::Relaxed)))
    };
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |c| {
        if c.node_name == "n1" {
            c.worker_set_clock = Some(clock.clone());
        }
    });
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let refused = || {
        *nodes[1]
            .mesh()
            .dropped_by_reason()
            .get("worker_set_future")
            .unwrap_or(&0)
    };
    nodes[0].mesh().worker_set().write(U, true).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || refused() >= 1),
        "the write was not refused as ahead of n1's clock"
    );
    assert!(!holds(&nodes[1], U));
    // The repair keeps offering it while n1's clock is behind.
    assert!(
        wait_until(Duration::from_secs(10), || refused() >= 2),
        "the refused entry was never sent again"
    );
    assert!(!holds(&nodes[1], U));
    offset_us.store(0, Ordering::Relaxed);
    assert!(
        wait_until(Duration::from_secs(10), || holds(&nodes[1], U)),
        "the entry never landed once n1's clock allowed it ({} refusals)",
        refused()
    );
    assert_eq!(
        nodes[1].mesh().worker_set().lock().to_entries(),
        nodes[0].mesh().worker_set().lock().to_entries()
    );
}
