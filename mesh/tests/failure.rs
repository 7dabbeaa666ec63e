#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Crashes, restarts and graceful leaves.

mod common;

use std::time::{Duration, Instant};

use common::{Ca, Node, cluster, config, wait_for_full_mesh, wait_until};

const W: &str = "http://10.1.0.1:8000";

#[test]
fn killed_node_stops_counting_and_loses_ownership() {
    let ca = Ca::new("ca");
    let mut nodes = cluster(&ca, 3, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let _a = nodes[0].mesh().worker(W).book(10, 100);
    let _c = nodes[2].mesh().worker(W).book(20, 200);
    let both = |n: &Node| n.mesh().worker(W).fleet().counts.requests == 2;
    assert!(wait_until(Duration::from_secs(5), || both(&nodes[0])
        && both(&nodes[1])));
    // Every node polls 40 workers; find those n2 owns, as every node agrees.
    let keys: Vec<String> = (0..40).map(|i| format!("http://o{i}:1")).collect();
    let slots: Vec<_> = nodes
        .iter()
        .flat_map(|n| keys.iter().map(|k| n.mesh().worker(k)))
        .collect();
    for s in &slots {
        s.set_polled(true);
    }
    let agreed = |k: &String| {
        let o: Vec<Option<String>> = nodes.iter().map(|n| n.mesh().owner(k)).collect();
        o[0].is_some() && o.iter().all(|x| *x == o[0])
    };
    assert!(wait_until(Duration::from_secs(5), || keys
        .iter()
        .all(agreed)));
    let owned: Vec<String> = keys
        .iter()
        .filter(|k| nodes[2].mesh().owns(k))
        .take(5)
        .cloned()
        .collect();
    assert!(!owned.is_empty());

    let victim = nodes.pop().unwrap();
    let killed = Instant::now();
    victim.crash();
    let forgotten = wait_until(Duration::from_secs(6), || {
        nodes
            .iter()
            .all(|n| n.mesh().worker(W).fleet().counts.requests == 1)
    });
    let took = killed.elapsed();
    assert!(forgotten, "dead node still counted");
    // Link idle timeout is 1 s: detection must be within about that.
    assert!(took < Duration::from_secs(3), "detection took {took:?}");
    // Its work since the poll left with it: what remains is the survivors'.
    assert_eq!(
        nodes[0]
            .mesh()
            .worker(W)
            .fleet()
            .counts
            .dispatched_since_poll,
        100
    );
    for k in &owned {
        let o0 = nodes[0].mesh().owner(k).unwrap();
        assert_ne!(o0, "n2");
        assert_eq!(nodes[1].mesh().owner(k).unwrap(), o0);
        assert_eq!(nodes.iter().filter(|n| n.mesh().owns(k)).count(), 1);
    }
    let status = nodes[0].mesh().status();
    let dead = status.members.iter().find(|m| m.name == "n2").unwrap();
    assert!(!dead.counted);
}

#[test]
fn restarted_node_never_double_counts() {
    let ca = Ca::new("ca");
    let mut nodes = cluster(&ca, 3, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let _a = nodes[0].mesh().worker(W).book(1, 10);
    let old: Vec<_> = (0..5)
        .map(|_| nodes[2].mesh().worker(W).book(1, 10))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || {
        nodes[0].mesh().worker(W).fleet().counts.requests == 6
    }));
    let seed = nodes[0].mesh().gossip_addr();
    let victim = nodes.pop().unwrap();
    std::mem::forget(old); // the crashed process's bookings die with it
    victim.crash();
    // Restart at once, before the old incarnation is detected as dead.
    let restarted = Node::start(config("n2", ca.tls("n2"), &[seed]));
    let _new: Vec<_> = (0..3)
        .map(|_| restarted.mesh().worker(W).book(1, 10))
        .collect();
    let mut max_seen = 0;
    let settled = wait_until(Duration::from_secs(8), || {
        let f = nodes[0].mesh().worker(W).fleet();
        max_seen = max_seen.max(f.counts.requests);
        f.counts.requests == 4 && restarted.mesh().worker(W).fleet().counts.requests == 4
    });
    assert!(settled, "restarted node not counted exactly once");
    assert!(max_seen <= 6, "double-counted: saw {max_seen}");
    // Watch a while longer: old and new never add up.
    let steady = !wait_until(Duration::from_millis(1500), || {
        nodes[0].mesh().worker(W).fleet().counts.requests != 4
    });
    assert!(steady);
    let status = nodes[0].mesh().status();
    let counted: Vec<_> = status
        .members
        .iter()
        .filter(|m| m.name == "n2" && m.counted)
        .collect();
    assert_eq!(counted.len(), 1);
    assert_eq!(
        counted[0].generation,
        restarted.mesh().incarnation().generation
    );
}

#[test]
fn graceful_leave_stops_counting_at_once() {
    let ca = Ca::new("ca");
    let mut nodes = cluster(&ca, 3, |c| c.link_idle_timeout = Duration::from_secs(10));
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let _b = nodes[2].mesh().worker(W).book(1, 10);
    assert!(wait_until(Duration::from_secs(5), || {
        nodes[0].mesh().worker(W).fleet().counts.requests == 1
    }));
    let leaving = nodes.pop().unwrap();
    let t = Instant::now();
    leaving.stop();
    assert!(wait_until(Duration::from_secs(2), || {
        nodes
            .iter()
            .all(|n| n.mesh().worker(W).fleet().counts.requests == 0)
    }));
    // Well before the 10 s idle timeout: the goodbye did it.
    assert!(t.elapsed() < Duration::from_secs(4));
    assert!(wait_until(Duration::from_secs(2), || nodes[0]
        .mesh()
        .members()
        .len()
        == 2));
}
