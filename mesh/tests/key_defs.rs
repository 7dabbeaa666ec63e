#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Worker keys over a real link: a key definition the receiver refuses
//! unbinds the id it named (later entries for that id are dropped and
//! counted, never merged into the key the id named before).

mod common;

use std::time::Duration;

use common::{Ca, RawPeer, cluster, wait_until};
use shoal_mesh::proto::LoadCounts;
use shoal_mesh::proto::frames::{Frame, KeyDef, MAX_KEY_BYTES, SlotEntry, Update};

fn update(round: u64, keys: Vec<KeyDef>, slots: Vec<(u32, u64)>) -> Frame {
    Frame::Update(Update {
        round,
        keys,
        slots: slots
            .into_iter()
            .map(|(id, requests)| SlotEntry {
                id,
                counts: LoadCounts {
                    requests,
                    ..LoadCounts::default()
                },
            })
            .collect(),
        ..Update::default()
    })
}

fn key(id: u32, key: &str) -> KeyDef {
    KeyDef {
        id,
        key: key.into(),
        polled: false,
    }
}

/// A peer binds id 0 to worker A and books 5 requests on it, then
/// redefines id 0 with a key the receiver refuses (too long) and sends 9
/// for it: A keeps 5, the 9 is dropped as an unknown id and counted.
#[test]
fn a_refused_key_definition_unbinds_its_id() {
    const A: &str = "http://10.8.0.1:8000";
    const B: &str = "http://10.8.0.2:8000";
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 1, |_| {});
    let node = &nodes[0];
    let a = node.mesh().worker(A);
    let b = node.mesh().worker(B);
    let mut peer = RawPeer::connect(node, &ca, "j1");
    peer.send(node, &update(1, vec![key(0, A)], vec![(0, 5)]));
    assert!(
        wait_until(Duration::from_secs(5), || a.fleet().counts.requests == 5),
        "the peer's slot for A never counted"
    );
    let drops = || node.mesh().dropped_by_reason();
    let before = drops();
    let too_long = format!("http://{}", "x".repeat(MAX_KEY_BYTES));
    peer.send(node, &update(2, vec![key(0, &too_long)], vec![(0, 9)]));
    // A frame after it, as a barrier: once B counts, the one before merged.
    peer.send(node, &update(3, vec![key(1, B)], vec![(1, 1)]));
    assert!(wait_until(Duration::from_secs(5), || b
        .fleet()
        .counts
        .requests
        == 1));
    assert_eq!(
        a.fleet().counts.requests,
        5,
        "the slot sent for the refused key was merged into A"
    );
    let after = drops();
    let grew = |reason: &str| after.get(reason).unwrap_or(&0) - before.get(reason).unwrap_or(&0);
    assert_eq!(grew("bad_key"), 1, "{after:?}");
    assert_eq!(grew("unknown_key"), 1, "{after:?}");
    peer.close();
}
