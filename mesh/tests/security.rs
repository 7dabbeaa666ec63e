#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Outsiders, impostors and junk change nothing and crash nothing.

mod common;

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use common::{Ca, Node, cluster, config, wait_for_full_mesh, wait_until};
use quinn::crypto::rustls::QuicClientConfig;

const W: &str = "http://10.2.0.1:8000";

fn dropped(node: &Node) -> u64 {
    node.mesh().status().traffic.frames_dropped
}

#[test]
fn node_with_certificate_from_another_ca_changes_nothing() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let _a = nodes[0].mesh().worker(W).book(1, 10);
    for n in &nodes {
        n.mesh().worker(W).set_polled(true);
    }

    let rogue_ca = Ca::new("rogue");
    let seed = nodes[0].mesh().gossip_addr();
    let rogue = Node::start(config("n9", rogue_ca.tls("n9"), &[seed]));
    let _r: Vec<_> = (0..50)
        .map(|_| rogue.mesh().worker(W).book(1000, 1000))
        .collect();
    // The rogue gossips its way into the member list (a hint) ...
    assert!(wait_until(Duration::from_secs(5), || {
        nodes[0]
            .mesh()
            .status()
            .members
            .iter()
            .any(|m| m.name == "n9" && m.live)
    }));
    // ... but its handshakes fail and its load never counts, either way.
    assert!(wait_until(Duration::from_secs(5), || dropped(&nodes[0]) > 0));
    let untouched = !wait_until(Duration::from_millis(1500), || {
        nodes.iter().any(|n| {
            let f = n.mesh().worker(W).fleet();
            f.counts.requests != 1 || f.counts.dispatched_since_poll != 10
        })
    });
    assert!(untouched, "rogue load was counted");
    let status = nodes[0].mesh().status();
    let m = status.members.iter().find(|m| m.name == "n9").unwrap();
    assert!(!m.verified && !m.counted);
    assert_eq!(rogue.mesh().worker(W).fleet().counts.requests, 50);
    assert_eq!(
        nodes[0].mesh().members(),
        vec!["n0".to_string(), "n1".to_string()]
    );
    assert!(wait_until(Duration::from_secs(5), || nodes[1]
        .mesh()
        .owns(W)
        != nodes[0].mesh().owns(W)));
}

#[test]
fn certificate_naming_another_node_is_refused() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    // A valid cluster certificate, but for "n1", used by a node calling
    // itself "evil".
    let seed = nodes[0].mesh().gossip_addr();
    // (Our binary refuses to start like this; a hostile one would not.)
    let mut evil_config = config("evil", ca.tls("n1"), &[seed]);
    evil_config.allow_unnamed_certificate = true;
    let evil = Node::start(evil_config);
    let _e = evil.mesh().worker(W).book(1, 1000);
    assert!(wait_until(Duration::from_secs(5), || dropped(&nodes[0]) > 0));
    let untouched = !wait_until(Duration::from_millis(1500), || {
        nodes
            .iter()
            .any(|n| n.mesh().worker(W).fleet().counts.requests != 0)
    });
    assert!(untouched);
    assert_eq!(nodes[0].mesh().members().len(), 2);
}

#[test]
fn garbage_on_gossip_and_quic_ports_crashes_nothing() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..2000usize {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 1400) as usize + 1;
        let mut buf: Vec<u8> = (0..len).map(|j| (seed >> (j % 56)) as u8).collect();
        if i % 4 == 0 {
            // Chitchat's magic number and version, then junk.
            buf[0] = 0xB4;
            if len > 2 {
                buf[1] = 0xA4;
                buf[2] = 0;
            }
        }
        junk.send_to(&buf, nodes[0].mesh().gossip_addr()).unwrap();
        junk.send_to(&buf, nodes[0].mesh().quic_addr()).unwrap();
    }
    // Still a healthy cluster.
    let _b = nodes[1].mesh().worker(W).book(1, 10);
    assert!(wait_until(Duration::from_secs(5), || {
        nodes[0].mesh().worker(W).fleet().counts.requests == 1
    }));
    assert_eq!(nodes[0].mesh().members().len(), 2);
}

/// A client holding a valid cluster certificate that sends junk: no Hello,
/// then a Hello followed by undecodable frames and an oversized length.
#[test]
fn authenticated_junk_is_dropped_and_counted() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 2, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let target = nodes[0].mesh().quic_addr();
    let before = dropped(&nodes[0]);
    let tls = shoal_mesh::tls::load(&ca.tls("j1"), Some("j1")).unwrap();
    nodes[0].block_on(async {
        let client_crypto = QuicClientConfig::try_from(tls.client.clone()).unwrap();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(client_crypto)));

        // 1. Junk instead of a Hello.
        let conn = ep.connect(target, "n0").unwrap().await.unwrap();
        let mut s = conn.open_uni().await.unwrap();
        s.write_all(&[0, 0, 0, 5, 1, 2, 3, 4, 5]).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(3), conn.closed()).await;

        // 2. A valid Hello, then junk frames, then a huge length prefix.
        let conn = ep.connect(target, "n0").unwrap().await.unwrap();
        let mut s = conn.open_uni().await.unwrap();
        let hello = shoal_mesh::proto::frames::Frame::Hello(shoal_mesh::proto::frames::Hello {
            cluster_id: "test-cluster".into(),
            node: "j1".into(),
            generation: 1,
        });
        s.write_all(&shoal_mesh::proto::frames::encode_prefixed(&hello).unwrap())
            .await
            .unwrap();
        for n in 0..20u8 {
            s.write_all(&[0, 0, 0, 3, 0xFF, n, 0xFE]).await.unwrap();
        }
        s.write_all(&[0xFF, 0xFF, 0xFF, 0xFF]).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(3), conn.closed()).await;
        ep.close(0u32.into(), b"");
    });
    assert!(wait_until(Duration::from_secs(3), || dropped(&nodes[0]) >= before + 22));
    // The junk peer was never counted, and the cluster still works.
    assert_eq!(nodes[0].mesh().members().len(), 2);
    let _b = nodes[1].mesh().worker(W).book(1, 10);
    assert!(wait_until(Duration::from_secs(5), || {
        nodes[0].mesh().worker(W).fleet().counts.requests == 1
    }));
}
