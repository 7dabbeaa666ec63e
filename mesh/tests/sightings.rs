#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Prompt-key sightings recorded on one node reach every verified peer's
//! receiver over the real mTLS QUIC load plane, and only theirs.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ca, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::frames::{Frame, MAX_SIGHTINGS_PER_FRAME, SightingsFrame};

type Seen = Arc<Mutex<Vec<u64>>>;

fn receiver(seen: &Seen) -> shoal_mesh::SightingReceiver {
    let seen = seen.clone();
    Arc::new(move |keys: &[u64]| seen.lock().unwrap().extend_from_slice(keys))
}

#[test]
fn a_sighting_on_one_node_reaches_every_peer_once_and_not_itself() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, |_| {});
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );
    let seen: Vec<Seen> = nodes.iter().map(|_| Seen::default()).collect();
    for (node, seen) in nodes.iter().zip(&seen) {
        assert!(node.mesh().on_peer_sightings(receiver(seen)));
        assert!(
            !node.mesh().on_peer_sightings(receiver(seen)),
            "the first receiver wins"
        );
    }

    let sender = nodes[0].mesh().sighting_sender();
    let keys: Vec<u64> = (1..=2_000u64)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for &key in &keys {
        sender.send(key);
    }
    nodes[1].mesh().sighting_sender().send(7);

    let want: BTreeSet<u64> = keys.iter().copied().collect();
    let arrived = wait_until(Duration::from_secs(5), || {
        [1, 2].iter().all(|&i| {
            let got = seen[i].lock().unwrap();
            want.iter().all(|k| got.contains(k))
        }) && seen[0].lock().unwrap().contains(&7)
            && seen[2].lock().unwrap().contains(&7)
    });
    assert!(arrived, "every peer hears every key");
    // One more key, sent after: rounds reach a peer in order, so once it
    // is in, any duplicate of the others would be in too.
    const MARKER: u64 = 0x5eed;
    sender.send(MARKER);
    assert!(wait_until(Duration::from_secs(5), || {
        [1, 2]
            .iter()
            .all(|&i| seen[i].lock().unwrap().contains(&MARKER))
    }));
    for i in [1, 2] {
        let got = seen[i].lock().unwrap();
        let from_0 = got.iter().filter(|k| want.contains(k)).count();
        assert_eq!(from_0, keys.len(), "node {i}: each key once");
    }
    let own = seen[0].lock().unwrap();
    assert!(
        own.iter().all(|k| !want.contains(k)),
        "a node is not told its own sightings"
    );
    assert!(
        !seen[1].lock().unwrap().contains(&7),
        "nor is the sender of 7"
    );
}

/// A peer holding a valid certificate that sends more keys in one frame
/// than a sender may: the frame is dropped and counted, none of its keys
/// reach the router, and the peer's next, well-formed frame still does.
#[test]
fn an_oversized_sightings_frame_is_dropped_whole_and_counted() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let seen = Seen::default();
    assert!(nodes[0].mesh().on_peer_sightings(receiver(&seen)));
    let dropped = || nodes[0].mesh().status().traffic.frames_dropped;
    let before = dropped();
    let mut peer = common::RawPeer::connect(&nodes[0], &ca, "j1");
    let oversized = Frame::Sightings(SightingsFrame {
        keys: vec![11; MAX_SIGHTINGS_PER_FRAME + 1],
    });
    peer.send(&nodes[0], &oversized);
    peer.send(
        &nodes[0],
        &Frame::Sightings(SightingsFrame { keys: vec![12] }),
    );
    assert!(
        wait_until(Duration::from_secs(5), || seen
            .lock()
            .unwrap()
            .contains(&12)),
        "the well-formed frame after it arrives"
    );
    peer.close();
    assert_eq!(dropped(), before + 1, "the oversized frame, counted");
    assert_eq!(*seen.lock().unwrap(), [12], "none of its keys delivered");
}
