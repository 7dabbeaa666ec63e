#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What one worker-set write costs on the wire at N = 16 replicas: the
//! writer sends the changed entry to each peer, and nobody re-broadcasts
//! it, so the fleet sends O(N · |delta|) bytes — not the N · (N − 1) ·
//! |set| of every replica resending its whole set on every change.

mod common;

use std::time::{Duration, Instant};

use common::{Ca, Node, cluster, wait_every, wait_for_full_mesh};
use shoal_mesh::proto::frame_size::chunks_by_size;
use shoal_mesh::proto::frames::{Frame, WorkerSetEntry, WorkerSetFrame, encode_prefixed};

const N: usize = 16;
const SET: usize = 200;

fn url(i: usize) -> String {
    format!("http://10.20.{}.{}:8000", i / 256, i % 256)
}

/// Worker-set bytes sent so far, summed over the fleet.
fn fleet_bytes(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .map(|n| n.mesh().traffic().worker_set_bytes_sent)
        .sum()
}

/// Waits until the fleet sent no worker-set byte for a whole second (at
/// most `within`); returns the total then.
fn settled(nodes: &[Node], within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    let mut last = fleet_bytes(nodes);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = fleet_bytes(nodes);
        if now == last || Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

/// Bytes of the whole set as the frames a replica would send.
fn whole_set_bytes(entries: &[WorkerSetEntry]) -> usize {
    chunks_by_size(entries)
        .map(|chunk| {
            encode_prefixed(&Frame::Workers(WorkerSetFrame {
                entries: chunk.to_vec(),
            }))
            .unwrap()
            .len()
        })
        .sum()
}

#[test]
fn one_write_costs_bytes_proportional_to_the_replicas_not_the_set() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, N, |c| {
        // No digest in the measurement (they are a fixed cost per
        // interval, not per write), and a slower heartbeat and patient
        // links so 16 nodes on a small machine keep their links.
        c.anti_entropy_interval = Duration::from_secs(120);
        c.sync_interval = Duration::from_millis(100);
        c.link_idle_timeout = Duration::from_secs(10);
        c.link_keepalive = Duration::from_millis(500);
    });
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(60)),
        "the mesh of {N} did not form"
    );
    for i in 0..SET {
        nodes[i % N]
            .mesh()
            .worker_set()
            .write(&url(i), true)
            .unwrap();
    }
    let everywhere = |n: usize| {
        wait_every(Duration::from_millis(100), Duration::from_secs(30), || {
            nodes
                .iter()
                .all(|node| node.mesh().worker_set().lock().iter().count() == n)
        })
    };
    assert!(everywhere(SET), "the set did not reach every replica");
    let before = settled(&nodes, Duration::from_secs(30));
    let links_before: usize = nodes.iter().map(|n| n.mesh().footprint().links).sum();

    nodes[5].mesh().worker_set().write(&url(SET), true).unwrap();
    assert!(everywhere(SET + 1), "the write did not reach every replica");
    let after = settled(&nodes, Duration::from_secs(30));
    let links_after: usize = nodes.iter().map(|n| n.mesh().footprint().links).sum();

    let cost = after - before;
    let written = nodes[5].mesh().worker_set().lock().to_entries();
    let delta: Vec<WorkerSetEntry> = written
        .iter()
        .filter(|e| e.url == url(SET))
        .cloned()
        .collect();
    let delta_bytes = whole_set_bytes(&delta) as u64;
    let whole = whole_set_bytes(&written) as u64;
    let old_cost = (N * (N - 1)) as u64 * whole;
    println!(
        "worker-set write at N = {N}, |set| = {}: {cost} bytes fleet-wide \
         ({:.1} frames of {delta_bytes} bytes); resending the whole set \
         ({whole} bytes) from every replica to every peer: {old_cost} bytes ({:.0}x)",
        SET + 1,
        cost as f64 / delta_bytes as f64,
        old_cost as f64 / cost.max(1) as f64
    );
    assert_eq!(
        links_before, links_after,
        "a link restarted during the measurement"
    );
    assert!(
        cost <= 2 * (N as u64 - 1) * delta_bytes,
        "{cost} bytes: more than the writer's one frame per peer (twice over)"
    );
    assert!(cost * 100 < old_cost, "{cost} not far below {old_cost}");
}
