#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A mesh started on its own thread: two nodes whose
//! callers' runtimes do nothing but start them link, carry each other's
//! bookings, and leave; the mesh thread ends with its node. Alone in its
//! binary, so the thread count is this test's.

mod common;

use std::time::Duration;

use common::{Ca, config, wait_until};
use shoal_mesh::Mesh;

/// Threads of this process named `shoal-mesh` (Linux `/proc`).
fn mesh_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == "shoal-mesh")
        .count()
}

#[test]
fn a_mesh_on_its_own_thread_links_counts_and_ends_with_its_node() {
    // The caller's runtime: one thread, idle once the meshes are started.
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = Ca::new("ca");
    let a = caller
        .block_on(Mesh::start_on_own_thread(config("a", ca.tls("a"), &[])))
        .unwrap();
    let b = caller
        .block_on(Mesh::start_on_own_thread(config(
            "b",
            ca.tls("b"),
            &[a.gossip_addr()],
        )))
        .unwrap();
    assert_eq!(mesh_threads(), 2, "one thread per mesh");

    // The caller's runtime is not running now: everything below happens on
    // the meshes' threads.
    let key = "http://10.0.0.1:8000";
    let booking = a.worker(key).book(30, 130);
    let seen_on_b = wait_until(Duration::from_secs(10), || {
        let fleet = b.worker(key).fleet();
        fleet.counts.requests == 1 && fleet.counts.tokens == 130
    });
    assert!(seen_on_b, "b never counted a's booking");
    drop(booking);
    let released_on_b = wait_until(Duration::from_secs(10), || {
        b.worker(key).fleet().counts.requests == 0
    });
    assert!(released_on_b, "b never saw the release");

    // A graceful leave (run on the caller's runtime) ends the thread.
    caller.block_on(a.shutdown());
    assert!(
        wait_until(Duration::from_secs(10), || mesh_threads() == 1),
        "a's mesh thread outlived its node"
    );
    // So does dropping a node without a word.
    drop(b);
    assert!(
        wait_until(Duration::from_secs(10), || mesh_threads() == 0),
        "b's mesh thread outlived its node"
    );
}
