#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Several nodes converge to identical fleet totals, snapshots and owners.

mod common;

use std::time::Duration;

use common::{Ca, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::{EngineKind, EngineLoad, LoadSnapshot};

#[test]
fn four_nodes_converge_to_identical_totals() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 4, |_| {});
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );

    let workers: Vec<String> = (0..6).map(|i| format!("http://10.0.0.{i}:8000")).collect();
    let mut bookings = Vec::new();
    let (mut req, mut tok, mut pre, mut disp) =
        (vec![0u64; 6], vec![0u64; 6], vec![0u64; 6], vec![0u64; 6]);
    for (n, node) in nodes.iter().enumerate() {
        for (w, key) in workers.iter().enumerate() {
            let slot = node.mesh().worker(key);
            for k in 0..(n + w) % 4 {
                let prompt = 10 * (k as u64 + 1) + n as u64;
                let work = prompt + 100;
                let mut b = slot.book(prompt, work);
                req[w] += 1;
                tok[w] += work;
                disp[w] += work;
                if k % 2 == 0 {
                    b.first_byte();
                } else {
                    pre[w] += prompt;
                }
                bookings.push(b);
            }
        }
    }
    let agree = |req: &[u64], tok: &[u64], pre: &[u64], disp: &[u64]| {
        nodes.iter().all(|node| {
            workers.iter().enumerate().all(|(w, key)| {
                let f = node.mesh().worker(key).fleet();
                f.inflight_requests == req[w]
                    && f.inflight_tokens == tok[w]
                    && f.pending_prefill_tokens == pre[w]
                    && f.dispatched_total == disp[w]
            })
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), || agree(&req, &tok, &pre, &disp)),
        "totals did not converge"
    );

    // Releasing everything converges to zero in flight, dispatched kept.
    drop(bookings);
    let zero = vec![0u64; 6];
    assert!(
        wait_until(Duration::from_secs(5), || agree(&zero, &zero, &zero, &disp)),
        "release did not converge"
    );

    // A snapshot polled by one node reaches all with its mark and poller.
    let owner_name = nodes[0].mesh().owner(&workers[0]).unwrap();
    let poller = nodes
        .iter()
        .find(|n| n.mesh().incarnation().name.as_ref() == owner_name)
        .unwrap();
    let slot = poller.mesh().worker(&workers[0]);
    let stamp = slot.poll_stamp();
    assert_eq!(stamp.dispatched_mark, disp[0]);
    poller.mesh().publish_snapshot(
        &slot,
        &LoadSnapshot {
            source: EngineKind::Vllm,
            load: EngineLoad {
                token_usage: Some(0.42),
                ..EngineLoad::default()
            },
            polled_at_unix_ms: stamp.polled_at_unix_ms,
            poller: "ignored".into(),
            dispatched_mark: stamp.dispatched_mark,
        },
    );
    let _extra = nodes[3].mesh().worker(&workers[0]).book(5, 50);
    assert!(wait_until(Duration::from_secs(5), || {
        nodes.iter().all(|n| {
            let f = n.mesh().worker(&workers[0]).fleet();
            f.snapshot.is_some_and(|s| s.load.token_usage == Some(0.42))
                && f.dispatched_since_poll() == 50
        })
    }));
    let status = nodes[1].mesh().status();
    let w0 = status
        .workers
        .iter()
        .find(|w| w.worker == workers[0])
        .unwrap();
    assert_eq!(w0.snapshot.as_ref().unwrap().poller, owner_name);
    assert_eq!(
        status
            .members
            .iter()
            .filter(|m| m.counted && m.verified)
            .count(),
        3
    );
    assert!(status.traffic.frames_received > 0);

    // Every node agrees on each worker's owner, and exactly one owns it.
    for key in &workers {
        let owners: Vec<String> = nodes.iter().map(|n| n.mesh().owner(key).unwrap()).collect();
        assert!(
            owners.iter().all(|o| *o == owners[0]),
            "owners differ: {owners:?}"
        );
        assert_eq!(nodes.iter().filter(|n| n.mesh().owns(key)).count(), 1);
    }
    serde_json::to_string(&status).unwrap();
}

#[test]
fn dns_seed_joins_the_cluster() {
    let ca = Ca::new("ca");
    let first = common::Node::start(common::config("a0", ca.tls("a0"), &[]));
    let port = first.mesh().gossip_addr().port();
    let mut c = common::config("a1", ca.tls("a1"), &[]);
    c.seeds = vec![format!("localhost:{port}")];
    c.seed_refresh_interval = Duration::from_millis(200);
    let second = common::Node::start(c);
    assert!(wait_for_full_mesh(
        &[&first, &second],
        Duration::from_secs(10)
    ));
    let _b = second.mesh().worker("http://x:1").book(3, 30);
    assert!(wait_until(Duration::from_secs(5), || {
        first.mesh().worker("http://x:1").fleet().inflight_tokens == 30
    }));
}
