#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Packed slot changes (only the fields that changed, against what the
//! stream said before) leave every replica's view exactly what whole values
//! did: under random booking churn with engine snapshots rebasing the work
//! since the poll, in a mesh where every node packs and in one where a node
//! stands in for a build from before packing; and a packed frame that does
//! not unpack is dropped, counted, without ending the session.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Ca, Node, RawPeer, cluster, wait_every, wait_for_full_mesh, wait_until};
use shoal_mesh::SlotBooking;
use shoal_mesh::proto::frames::{Frame, KeyDef, PackedUpdate};
use shoal_mesh::proto::slot_pack::{self, SlotChange};
use shoal_mesh::proto::{EngineKind, EngineLoad, LoadCounts};

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Each node's own share of each worker, as that node reports it.
fn own_shares(nodes: &[Node]) -> BTreeMap<(String, String), (LoadCounts, u64)> {
    let mut own = BTreeMap::new();
    for node in nodes {
        for w in node.mesh().status().workers {
            let share = &w.shares[0];
            own.insert(
                (share.replica.clone(), w.worker.clone()),
                (share.counts, share.basis_polled_at_unix_ms),
            );
        }
    }
    own
}

/// True when every node holds, for every peer and worker, exactly the
/// counts and basis that peer holds for itself.
fn views_match_owners(nodes: &[Node]) -> bool {
    let own = own_shares(nodes);
    nodes.iter().all(|node| {
        node.mesh().status().workers.iter().all(|w| {
            w.shares.iter().skip(1).all(|share| {
                own.get(&(share.replica.clone(), w.worker.clone()))
                    == Some(&(share.counts, share.basis_polled_at_unix_ms))
            })
        })
    })
}

/// Books, answers and releases at random on every node for `ops` steps,
/// with each worker's poll owner publishing a snapshot now and then, and
/// returns the bookings still open with the in-flight totals they hold.
fn churn(nodes: &[Node], workers: &[String], ops: usize) -> (Vec<SlotBooking>, Vec<LoadCounts>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut open: Vec<(usize, SlotBooking, u64, u64, bool)> = Vec::new();
    for step in 0..ops {
        let n = rng.below(nodes.len() as u64) as usize;
        let w = rng.below(workers.len() as u64) as usize;
        match rng.below(10) {
            0..=3 => {
                let prompt = 1 + rng.below(5_000);
                let work = prompt + rng.below(2_000);
                let b = nodes[n].mesh().worker(&workers[w]).book(prompt, work);
                open.push((w, b, prompt, work, false));
            }
            4..=5 if !open.is_empty() => {
                let i = rng.below(open.len() as u64) as usize;
                open[i].1.first_byte();
                open[i].4 = true;
            }
            6..=8 if !open.is_empty() => {
                let i = rng.below(open.len() as u64) as usize;
                drop(open.swap_remove(i));
            }
            _ => {
                for node in nodes {
                    if node.mesh().owns(&workers[w]) {
                        let slot = node.mesh().worker(&workers[w]);
                        let stamp = slot.poll_stamp();
                        node.mesh().publish_snapshot(
                            &slot,
                            &stamp,
                            EngineKind::Vllm,
                            EngineLoad {
                                token_usage: Some((step % 100) as f64 / 100.0),
                                ..EngineLoad::default()
                            },
                        );
                    }
                }
            }
        }
        if step % 50 == 0 {
            // Let some rounds go out between bursts (a booking's changes
            // then land in different rounds, as in a real router).
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    let mut totals = vec![LoadCounts::default(); workers.len()];
    for (w, _, prompt, work, answered) in &open {
        totals[*w].requests += 1;
        totals[*w].tokens += work;
        if !answered {
            totals[*w].pending_prefill += prompt;
        }
    }
    (open.into_iter().map(|o| o.1).collect(), totals)
}

/// Runs the churn on `nodes` and checks every view: in-flight totals
/// exact, work since the poll equal everywhere, every peer's share and
/// basis as its owner holds them.
fn churn_and_check(nodes: &[Node]) {
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );
    let workers: Vec<String> = (0..40).map(|i| format!("http://10.1.0.{i}:8000")).collect();
    let slots: Vec<_> = nodes
        .iter()
        .flat_map(|n| workers.iter().map(|w| n.mesh().worker(w)))
        .collect();
    for s in &slots {
        s.set_polled(true);
    }
    assert!(
        wait_until(Duration::from_secs(5), || workers.iter().all(|w| nodes
            .iter()
            .filter(|n| n.mesh().owns(w))
            .count()
            == 1)),
        "poll owners did not settle"
    );
    let (_open, totals) = churn(nodes, &workers, 3_000);
    let exact = || {
        nodes.iter().all(|node| {
            workers.iter().zip(&totals).all(|(w, want)| {
                let got = node.mesh().worker(w).fleet().counts;
                got.requests == want.requests
                    && got.tokens == want.tokens
                    && got.pending_prefill == want.pending_prefill
            })
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), exact),
        "in-flight totals differ"
    );
    let same_since_poll = || {
        workers.iter().all(|w| {
            let first = nodes[0]
                .mesh()
                .worker(w)
                .fleet()
                .counts
                .dispatched_since_poll;
            nodes
                .iter()
                .all(|n| n.mesh().worker(w).fleet().counts.dispatched_since_poll == first)
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), same_since_poll),
        "work since the poll differs between nodes"
    );
    assert!(
        wait_every(Duration::from_millis(100), Duration::from_secs(10), || {
            views_match_owners(nodes)
        }),
        "a node's copy of a peer's share or basis differs from the peer's own"
    );
}

/// No rolling refresh within the test (it re-says every field, and would
/// heal a wrong packing before the checks look).
fn no_refresh(c: &mut shoal_mesh::MeshConfig) {
    c.anti_entropy_interval = Duration::from_secs(120);
}

#[test]
fn packed_changes_keep_every_view_exact_under_churn() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, no_refresh);
    churn_and_check(&nodes);
    for node in &nodes {
        let traffic = node.mesh().status().traffic;
        assert!(
            traffic.packed_frames_received > 0,
            "{traffic:?}: nobody packed"
        );
        assert_eq!(
            node.mesh().dropped_by_reason().get("bad_packed"),
            None,
            "a packed frame did not unpack"
        );
    }
}

#[test]
fn a_node_that_does_not_pack_still_shares_exact_load() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, |c| {
        no_refresh(c);
        if c.node_name == "n0" {
            c.speaks_packed = false;
        }
    });
    churn_and_check(&nodes);
    let packed = |i: usize| nodes[i].mesh().status().traffic.packed_frames_received;
    assert_eq!(packed(0), 0, "n0 was sent packed frames it never asked for");
    assert!(
        packed(1) > 0 && packed(2) > 0,
        "n1 and n2 did not pack to each other"
    );
}

#[test]
fn a_packed_frame_that_does_not_unpack_is_dropped_and_the_link_kept() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 1, |_| {});
    let node = &nodes[0];
    let worker = "http://10.2.0.1:8000";
    let slot = node.mesh().worker(worker);
    let mut peer = RawPeer::connect(node, &ca, "j1");
    let frame = |round: u64, slots: Vec<u8>| {
        Frame::Packed(PackedUpdate {
            round,
            keys: vec![KeyDef {
                id: 0,
                key: worker.into(),
                polled: false,
            }],
            slots,
            ..PackedUpdate::default()
        })
    };
    let mut whole = Vec::new();
    slot_pack::pack(
        &[SlotChange {
            id: 0,
            requests: Some(2),
            tokens: Some(70),
            pending_prefill: Some(0),
            dispatched_since_poll: Some(70),
            ..SlotChange::default()
        }],
        &mut whole,
    );
    peer.send(node, &frame(1, whole));
    assert!(wait_until(Duration::from_secs(5), || slot
        .fleet()
        .counts
        .requests
        == 2));
    // Unknown field bits: dropped whole, counted.
    peer.send(node, &frame(2, vec![0, 0x80]));
    // Then a change of one field: the others read as the stream said.
    let mut one = Vec::new();
    slot_pack::pack(
        &[SlotChange {
            id: 0,
            requests: Some(1),
            ..SlotChange::default()
        }],
        &mut one,
    );
    peer.send(node, &frame(3, one));
    assert!(
        wait_until(Duration::from_secs(5), || slot.fleet().counts.requests == 1),
        "the frame after a bad one was not merged"
    );
    assert_eq!(slot.fleet().counts.tokens, 70);
    assert_eq!(node.mesh().dropped_by_reason().get("bad_packed"), Some(&1));
    peer.close();
}
