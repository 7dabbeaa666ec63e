#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Where stored objects live, recorded on one node, reaches every verified
//! peer's receiver over the real mTLS QUIC load plane; a peer's frame that
//! breaks the limits is dropped and counted.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ca, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::frames::{
    Frame, MAX_OBJECT_ID_BYTES, MAX_OBJECTS_PER_FRAME, ObjectEntry, ObjectsFrame,
};

type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn receiver(seen: &Seen) -> shoal_mesh::ObjectReceiver {
    let seen = seen.clone();
    Arc::new(move |entries: &[ObjectEntry]| {
        let mut seen = seen.lock().unwrap();
        seen.extend(entries.iter().map(|e| (e.id.clone(), e.worker.clone())));
    })
}

fn entry(id: &str) -> ObjectEntry {
    ObjectEntry {
        id: id.into(),
        worker: "http://w:1".into(),
    }
}

#[test]
fn an_object_learned_on_one_node_reaches_every_peer_once() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, |_| {});
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let seen: Vec<Seen> = nodes.iter().map(|_| Seen::default()).collect();
    for (node, seen) in nodes.iter().zip(&seen) {
        assert!(node.mesh().on_peer_objects(receiver(seen)));
    }
    let sender = nodes[0].mesh().object_sender();
    let ids: Vec<String> = (0..600).map(|i| format!("resp_{i}")).collect();
    for id in &ids {
        sender.send(id, "http://e1:8000");
    }
    // Too long to be accepted anywhere: dropped at the sender, counted.
    sender.send(&"x".repeat(MAX_OBJECT_ID_BYTES + 1), "http://e1:8000");
    let arrived = wait_until(Duration::from_secs(5), || {
        [1, 2]
            .iter()
            .all(|&i| seen[i].lock().unwrap().len() >= ids.len())
    });
    assert!(arrived, "every peer hears every object");
    // One more, sent after: rounds reach a peer in order, so once it is
    // in, any duplicate of the others would be in too.
    sender.send("resp_marker", "http://e1:8000");
    assert!(wait_until(Duration::from_secs(5), || {
        [1, 2].iter().all(|&i| {
            seen[i]
                .lock()
                .unwrap()
                .last()
                .is_some_and(|(id, _)| id == "resp_marker")
        })
    }));
    for i in [1, 2] {
        let mut got = seen[i].lock().unwrap().clone();
        assert_eq!(got.pop().map(|(id, _)| id).as_deref(), Some("resp_marker"));
        let want: Vec<(String, String)> = ids
            .iter()
            .map(|id| (id.clone(), "http://e1:8000".to_string()))
            .collect();
        assert_eq!(
            got, want,
            "node {i}: each once, in order, the long one never"
        );
    }
    assert!(seen[0].lock().unwrap().is_empty(), "not told its own");
}

/// A peer with a valid certificate that sends more entries in one frame
/// than a sender may, then a frame with one bad entry among good ones:
/// the first is dropped whole, the bad entry alone, each counted.
#[test]
fn an_oversized_frame_and_a_bad_entry_are_dropped_and_counted() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let seen = Seen::default();
    assert!(nodes[0].mesh().on_peer_objects(receiver(&seen)));
    let dropped = || nodes[0].mesh().status().traffic.frames_dropped;
    let before = dropped();
    let mut peer = common::RawPeer::connect(&nodes[0], &ca, "j1");
    let oversized = Frame::Objects(ObjectsFrame {
        entries: vec![entry("big"); MAX_OBJECTS_PER_FRAME + 1],
    });
    let mixed = Frame::Objects(ObjectsFrame {
        entries: vec![entry("ok_1"), entry(""), entry("ok_2")],
    });
    peer.send(&nodes[0], &oversized);
    peer.send(&nodes[0], &mixed);
    assert!(
        wait_until(Duration::from_secs(5), || seen.lock().unwrap().len() == 2),
        "the good entries arrive"
    );
    peer.close();
    assert_eq!(
        dropped(),
        before + 2,
        "the oversized frame and the bad entry"
    );
    let ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(ids, ["ok_1", "ok_2"]);
}
