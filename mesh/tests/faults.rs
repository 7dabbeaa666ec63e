#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Frames dropped, duplicated and reordered between decode and merge (by a
//! tap on every node) still converge to the exact totals.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ca, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::frames::Update;
use shoal_mesh::{FrameTap, Incarnation};

/// Drops ~30 %, duplicates ~20 % and holds back ~30 % of updates, releasing
/// held ones (in reverse) after later frames of the same sender.
struct Chaos {
    state: Mutex<(u64, HashMap<Incarnation, Vec<Update>>)>,
}

impl FrameTap for Chaos {
    fn on_update(&self, from: &Incarnation, update: Update) -> Vec<Update> {
        let mut guard = self.state.lock().unwrap();
        let (seed, held) = &mut *guard;
        let held = held.entry(from.clone()).or_default();
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let roll = (*seed >> 33) % 100;
        let mut out = Vec::new();
        match roll {
            0..=29 => {}
            30..=49 => {
                out.push(update.clone());
                out.push(update);
            }
            50..=79 => held.push(update),
            _ => out.push(update),
        }
        if roll % 3 == 0 {
            out.extend(held.drain(..).rev());
        }
        out
    }
}

#[test]
fn dropped_duplicated_reordered_frames_still_converge() {
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, |c| {
        c.tap = Some(Arc::new(Chaos {
            state: Mutex::new((c.node_name.len() as u64 + 7, HashMap::new())),
        }));
    });
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));

    let workers: Vec<String> = (0..20).map(|i| format!("http://w{i}:8000")).collect();
    let mut expected = vec![(0u64, 0u64); workers.len()];
    let mut live = Vec::new();
    // Churn: book and release over ~40 sync intervals.
    for round in 0..40u64 {
        for (n, node) in nodes.iter().enumerate() {
            let w = ((round * 7 + n as u64 * 3) % workers.len() as u64) as usize;
            let work = 10 + round + n as u64;
            let booking = node.mesh().worker(&workers[w]).book(1, work);
            expected[w].1 += work;
            if round % 3 == 0 {
                expected[w].0 += 1;
                live.push(booking);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let converged = wait_until(Duration::from_secs(8), || {
        nodes.iter().all(|node| {
            workers.iter().enumerate().all(|(w, key)| {
                let f = node.mesh().worker(key).fleet();
                f.counts.requests == expected[w].0
                    && f.counts.dispatched_since_poll == expected[w].1
            })
        })
    });
    if !converged {
        for (n, node) in nodes.iter().enumerate() {
            for (w, key) in workers.iter().enumerate() {
                let f = node.mesh().worker(key).fleet();
                if f.counts.requests != expected[w].0
                    || f.counts.dispatched_since_poll != expected[w].1
                {
                    eprintln!("node {n} worker {w}: {f:?} expected {:?}", expected[w]);
                }
            }
        }
        eprintln!(
            "{}",
            serde_json::to_string_pretty(&nodes[0].mesh().status().traffic).unwrap()
        );
    }
    assert!(converged, "did not converge under frame chaos");
    drop(live);
}
