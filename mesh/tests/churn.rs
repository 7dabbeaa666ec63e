#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Churn: what a long-lived node keeps follows the live fleet, not its
//! history. Workers and replica incarnations come and go; afterwards every
//! map of the mesh (worker keys, CRDT state, gossip, links, departed and dead
//! incarnations, idle keys) and the work each sync does are back at their
//! baseline. Run with `--nocapture` to see the figures.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Ca, Node, config, wait_every, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::{EngineKind, EngineLoad, LoadCounts};
use shoal_mesh::{Footprint, Incarnation, MeshConfig, TlsConfig, WorkerSlot};

/// Phase A: worker keys added and removed.
const WORKERS: usize = 1_000;
/// Phase B: node names, each started this many times.
const NAMES: usize = 20;
const STARTS_PER_NAME: usize = 10;
/// Incarnations alive at once in phase B.
const BATCH: usize = 10;
/// The worker the long-lived nodes keep a request on throughout.
const W_HOME: &str = "http://10.8.0.2:8000";
/// Token-work of each long-lived node's request on [`W_HOME`].
const HOME_TOKENS: u64 = 100;
/// The worker every incarnation of phase B books on.
const W_CHURN: &str = "http://10.8.0.1:8000";
/// Bound on every "back to baseline" wait.
const SETTLE_WITHIN: Duration = Duration::from_secs(25);
/// Window of the traffic rate measurements.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Short timings so forgetting takes seconds: full syncs every 200 ms,
/// forget after 1.5 s, links idle out after 1 s, gossip drops the dead
/// after 1.5 s.
fn churn_config(name: &str, tls: TlsConfig, seeds: &[SocketAddr]) -> MeshConfig {
    let mut c = config(name, tls, seeds);
    // Many nodes share two cores: push changes every 100 ms, not 20.
    c.sync_interval = Duration::from_millis(100);
    c.anti_entropy_interval = Duration::from_millis(200);
    c.forget_after = Duration::from_millis(1_500);
    c.link_idle_timeout = Duration::from_secs(1);
    c.link_keepalive = Duration::from_millis(200);
    c.failure_detector.dead_node_grace_period = Duration::from_millis(1_500);
    c
}

/// The footprint's figures, named (`wire_ids` is a high-water mark: ids
/// are reused, so it is printed but not expected back at baseline).
fn figures(f: &Footprint) -> [(&'static str, usize); 12] {
    [
        ("worker_keys", f.worker_keys),
        ("wire_ids (peak)", f.wire_ids as usize),
        ("state.incarnations", f.state.incarnations),
        ("state.slot_entries", f.state.slot_entries),
        ("state.poll_entries", f.state.poll_entries),
        ("state.snapshots", f.state.snapshots),
        ("gossip_members", f.gossip_members),
        ("links", f.links),
        ("left", f.left),
        ("dead", f.dead),
        ("idle_keys", f.idle_keys),
        ("own_poll_times", f.own_poll_times),
    ]
}

/// The figures of `now` that differ from `base` (all but `wire_ids`).
fn off_baseline(now: &Footprint, base: &Footprint) -> Vec<String> {
    figures(now)
        .iter()
        .zip(figures(base).iter())
        .filter(|((name, _), _)| !name.starts_with("wire_ids"))
        .filter(|((_, n), (_, b))| n != b)
        .map(|((name, n), (_, b))| format!("{name} {n} (baseline {b})"))
        .collect()
}

/// Field-wise maximum.
fn peak(a: &Footprint, b: &Footprint) -> Footprint {
    let mut p = *a;
    p.worker_keys = p.worker_keys.max(b.worker_keys);
    p.wire_ids = p.wire_ids.max(b.wire_ids);
    p.state.incarnations = p.state.incarnations.max(b.state.incarnations);
    p.state.slot_entries = p.state.slot_entries.max(b.state.slot_entries);
    p.state.poll_entries = p.state.poll_entries.max(b.state.poll_entries);
    p.state.snapshots = p.state.snapshots.max(b.state.snapshots);
    p.gossip_members = p.gossip_members.max(b.gossip_members);
    p.links = p.links.max(b.links);
    p.left = p.left.max(b.left);
    p.dead = p.dead.max(b.dead);
    p.idle_keys = p.idle_keys.max(b.idle_keys);
    p.own_poll_times = p.own_poll_times.max(b.own_poll_times);
    p
}

fn print_table(title: &str, columns: &[(&str, &Footprint)]) {
    println!("\n{title}");
    let mut header = format!("  {:<20}", "figure");
    for (name, _) in columns {
        header += &format!(" {name:>10}");
    }
    println!("{header}");
    let rows: Vec<[(&str, usize); 12]> = columns.iter().map(|(_, f)| figures(f)).collect();
    for r in 0..12 {
        let mut line = format!("  {:<20}", rows[0][r].0);
        for row in &rows {
            line += &format!(" {:>10}", row[r].1);
        }
        println!("{line}");
    }
}

/// Per-second traffic of one node over a window: load-plane frames and
/// their payload bytes, UDP bytes on its links, gossip bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Rate {
    frames: f64,
    frame_bytes: f64,
    wire_bytes: f64,
    gossip_bytes: f64,
}

/// Measures the traffic rate of every node over the same window.
fn rates(nodes: &[&Node]) -> Vec<Rate> {
    let before: Vec<_> = nodes.iter().map(|n| n.mesh().status().traffic).collect();
    let t = Instant::now();
    std::thread::sleep(RATE_WINDOW);
    let secs = t.elapsed().as_secs_f64();
    nodes
        .iter()
        .zip(before)
        .map(|(n, b)| {
            let a = n.mesh().status().traffic;
            let per_s = |x: u64, y: u64| x.saturating_sub(y) as f64 / secs;
            Rate {
                frames: per_s(a.frames_sent, b.frames_sent),
                frame_bytes: per_s(a.bytes_sent, b.bytes_sent),
                wire_bytes: per_s(a.link_wire_bytes, b.link_wire_bytes),
                gossip_bytes: per_s(a.gossip_bytes_sent, b.gossip_bytes_sent),
            }
        })
        .collect()
}

fn print_rates(title: &str, columns: &[(&str, Rate)]) {
    println!("\n{title} (per second, sent, over {RATE_WINDOW:?})");
    let mut header = format!("  {:<20}", "traffic");
    for (name, _) in columns {
        header += &format!(" {name:>10}");
    }
    println!("{header}");
    type Field = fn(&Rate) -> f64;
    let fields: [(&str, Field); 4] = [
        ("load frames", |r| r.frames),
        ("load frame bytes", |r| r.frame_bytes),
        ("link UDP bytes", |r| r.wire_bytes),
        ("gossip bytes", |r| r.gossip_bytes),
    ];
    for (name, get) in fields {
        let mut line = format!("  {name:<20}");
        for (_, r) in columns {
            line += &format!(" {:>10.0}", get(r));
        }
        println!("{line}");
    }
}

/// After churn a node must do about the work it did at baseline: at most
/// twice the baseline rate plus a small allowance (keep-alives and gossip
/// rounds jitter; a leak grows with the churn, here by hundreds of times).
fn assert_rate_back(node: &str, after: Rate, base: Rate) {
    let close = |a: f64, b: f64, slack: f64| a <= 2.0 * b + slack;
    assert!(
        close(after.frame_bytes, base.frame_bytes, 1_024.0)
            && close(after.frames, base.frames, 20.0)
            && close(after.wire_bytes, base.wire_bytes, 4_096.0)
            && close(after.gossip_bytes, base.gossip_bytes, 4_096.0),
        "{node} still does more work per sync: after {after:?}, baseline {base:?}"
    );
}

/// The counted incarnations `observer` holds a booking of `W_CHURN` from.
fn shares(observer: &Node) -> Vec<String> {
    observer
        .mesh()
        .status()
        .workers
        .into_iter()
        .filter(|w| w.worker == W_CHURN)
        .flat_map(|w| w.shares)
        .filter(|s| s.counts.requests == 1)
        .map(|s| s.replica)
        .collect()
}

/// Waits until both nodes' footprints are back at their baselines; returns
/// how long it took, or the figures still off.
fn settle(nodes: &[(&str, &Node, &Footprint)]) -> Result<Duration, String> {
    let t = Instant::now();
    let back = wait_until(SETTLE_WITHIN, || {
        nodes
            .iter()
            .all(|(_, n, base)| off_baseline(&n.mesh().footprint(), base).is_empty())
    });
    if back {
        return Ok(t.elapsed());
    }
    Err(nodes
        .iter()
        .map(|(name, n, base)| format!("{name}: {:?}", off_baseline(&n.mesh().footprint(), base)))
        .collect::<Vec<_>>()
        .join("; "))
}

/// Sets the flag when dropped (also while unwinding).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `work` while sampling the footprints of `nodes` every 20 ms;
/// returns its result and each node's field-wise peak.
fn with_peaks<R>(nodes: &[&Node], work: impl FnOnce() -> R) -> (R, Vec<Footprint>) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peaks: Vec<Footprint> = nodes.iter().map(|n| n.mesh().footprint()).collect();
            while !done.load(Ordering::Relaxed) {
                for (p, n) in peaks.iter_mut().zip(nodes) {
                    *p = peak(p, &n.mesh().footprint());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peaks
        });
        let result = {
            let _stop = SetOnDrop(&done);
            work()
        };
        (result, sampler.join().unwrap())
    })
}

/// 1,000 workers added and removed, and 200 replica incarnations started
/// and killed (three in four crash without a goodbye, one in four leaves
/// gracefully): a long-lived observer's maps and a long-lived peer's
/// return to their baseline sizes, and so does the per-sync traffic.
/// Prints baseline, peak and after for every figure.
#[test]
fn churn_returns_maps_and_per_sync_work_to_baseline() {
    let test_start = Instant::now();
    let ca = Ca::new("ca");
    let o = Node::start(churn_config("obs", ca.tls("obs"), &[]));
    let seed = o.mesh().gossip_addr();
    let p = Node::start(churn_config("peer", ca.tls("peer"), &[seed]));
    assert!(wait_for_full_mesh(&[&o, &p], Duration::from_secs(10)));
    // The live fleet: one worker both route to, with a request in flight
    // from each, so every full sync carries something.
    let _home_o = o.mesh().worker(W_HOME).book(10, HOME_TOKENS);
    let _home_p = p.mesh().worker(W_HOME).book(10, HOME_TOKENS);
    assert!(wait_until(Duration::from_secs(5), || [&o, &p]
        .iter()
        .all(|n| n.mesh().worker(W_HOME).fleet().counts.requests == 2)));
    // Let gossip and the first full syncs settle.
    std::thread::sleep(Duration::from_secs(1));
    let base_o = o.mesh().footprint();
    let base_p = p.mesh().footprint();
    for base in [&base_o, &base_p] {
        assert_eq!(
            (base.links, base.gossip_members, base.worker_keys),
            (1, 1, 1)
        );
        assert_eq!((base.state.incarnations, base.state.slot_entries), (1, 1));
    }
    let base_rate = rates(&[&o, &p]);

    // Phase A: P registers 1,000 workers, polls them, books and releases a
    // request on each and publishes a snapshot of each; O learns them all.
    // Then P stops polling them and drops every handle (the router removed
    // them).
    let ((held_rate, settled_a), peaks_a) = with_peaks(&[&o, &p], || {
        let keys: Vec<String> = (0..WORKERS)
            .map(|i| format!("http://10.9.{}.{}:8000", i / 250, i % 250))
            .collect();
        let slots: Vec<WorkerSlot> = keys.iter().map(|k| p.mesh().worker(k)).collect();
        for slot in &slots {
            slot.set_polled(true);
            drop(slot.book(100, 200));
            let stamp = slot.poll_stamp();
            let load = EngineLoad {
                waiting_requests: Some(1),
                ..EngineLoad::default()
            };
            p.mesh()
                .publish_snapshot(slot, &stamp, EngineKind::Vllm, load);
        }
        let learned = wait_until(Duration::from_secs(20), || {
            let f = o.mesh().footprint();
            f.worker_keys >= WORKERS
                && f.state.slot_entries >= WORKERS
                && f.state.poll_entries >= WORKERS
                && f.state.snapshots >= WORKERS
        });
        assert!(
            learned,
            "O never learned the workers: {:?}",
            o.mesh().footprint()
        );
        let held_rate = rates(&[&o, &p]);
        for slot in &slots {
            slot.set_polled(false);
        }
        drop(slots);
        (held_rate, settle(&[("O", &o, &base_o), ("P", &p, &base_p)]))
    });
    print_table(
        &format!("phase A: {WORKERS} workers added and removed"),
        &[
            ("O base", &base_o),
            ("O peak", &peaks_a[0]),
            ("O after", &o.mesh().footprint()),
            ("P base", &base_p),
            ("P peak", &peaks_a[1]),
            ("P after", &p.mesh().footprint()),
        ],
    );
    match &settled_a {
        Ok(took) => println!("  back at baseline {took:?} after the handles were dropped"),
        Err(off) => println!("  NOT back at baseline after {SETTLE_WITHIN:?}: {off}"),
    }
    let after_a_rate = rates(&[&o, &p]);
    print_rates(
        "phase A traffic",
        &[
            ("O base", base_rate[0]),
            ("O held", held_rate[0]),
            ("O after", after_a_rate[0]),
            ("P base", base_rate[1]),
            ("P held", held_rate[1]),
            ("P after", after_a_rate[1]),
        ],
    );
    if let Err(off) = settled_a {
        panic!("phase A: not back at baseline: {off}");
    }

    // Phase B: 200 incarnations, 10 at a time, of 20 names (half dial O,
    // half are dialed by it). Each joins through O, is counted, books on
    // W_CHURN until O sees it, then crashes (or, one in four, leaves).
    let names: Vec<String> = (0..NAMES / 2)
        .flat_map(|i| [format!("a-churn-{i}"), format!("z-churn-{i}")])
        .collect();
    let tls: Vec<TlsConfig> = names.iter().map(|n| ca.tls(n)).collect();
    let ((crashed, stopped, churned, settled_b), peaks_b) = with_peaks(&[&o, &p], || {
        let phase_b = Instant::now();
        let (mut crashed, mut stopped) = (0, 0);
        let mut leaving = Vec::new();
        for round in 0..NAMES * STARTS_PER_NAME / BATCH {
            let first = (round * BATCH) % NAMES;
            let nodes: Vec<Node> = (first..first + BATCH)
                .map(|i| Node::start(churn_config(&names[i], tls[i].clone(), &[seed])))
                .collect();
            let incs: Vec<Incarnation> = nodes
                .iter()
                .map(|n| n.mesh().incarnation().clone())
                .collect();
            // Each new incarnation counts O (the link is verified on both
            // ends in the same handshake), then books; O showing its
            // booking as a counted share means O counts it.
            assert!(
                wait_until(Duration::from_secs(15), || nodes.iter().all(|n| n
                    .mesh()
                    .members()
                    .iter()
                    .any(|m| m == "obs"))),
                "round {round}: a new incarnation never counted O"
            );
            let bookings: Vec<_> = nodes
                .iter()
                .map(|n| n.mesh().worker(W_CHURN).book(1, 10))
                .collect();
            assert!(
                wait_every(Duration::from_millis(50), Duration::from_secs(10), || {
                    let shares = shares(&o);
                    incs.iter().all(|inc| shares.contains(&inc.to_string()))
                }),
                "round {round}: O does not count every new incarnation's booking"
            );
            for (k, node) in nodes.into_iter().enumerate() {
                if k % 4 == 3 {
                    stopped += 1;
                    leaving.push(std::thread::spawn(move || node.stop()));
                } else {
                    crashed += 1;
                    node.crash();
                }
            }
            // The bookings died with their processes.
            drop(bookings);
        }
        for t in leaving {
            t.join().unwrap();
        }
        let churned = phase_b.elapsed();
        let settled = settle(&[("O", &o, &base_o), ("P", &p, &base_p)]);
        (crashed, stopped, churned, settled)
    });
    print_table(
        &format!(
            "phase B: {} incarnations of {NAMES} names ({crashed} crashed, {stopped} left) \
             in {churned:?}",
            crashed + stopped
        ),
        &[
            ("O base", &base_o),
            ("O peak", &peaks_b[0]),
            ("O after", &o.mesh().footprint()),
            ("P base", &base_p),
            ("P peak", &peaks_b[1]),
            ("P after", &p.mesh().footprint()),
        ],
    );
    match &settled_b {
        Ok(took) => println!("  back at baseline {took:?} after the last one died"),
        Err(off) => println!("  NOT back at baseline after {SETTLE_WITHIN:?}: {off}"),
    }
    let after_b_rate = rates(&[&o, &p]);
    print_rates(
        "phase B traffic",
        &[
            ("O base", base_rate[0]),
            ("O after", after_b_rate[0]),
            ("P base", base_rate[1]),
            ("P after", after_b_rate[1]),
        ],
    );
    println!("\nwhole test: {:?}", test_start.elapsed());
    if let Err(off) = settled_b {
        panic!("phase B: not back at baseline: {off}");
    }
    assert_eq!(crashed + stopped, NAMES * STARTS_PER_NAME);
    // What a load-reading policy sees afterwards is what one router would:
    // nothing of the 200 dead incarnations' work, only the two requests
    // the long-lived nodes still hold.
    for (name, node) in [("O", &o), ("P", &p)] {
        let churned = node.mesh().worker(W_CHURN).fleet().counts;
        assert_eq!(
            churned,
            LoadCounts::default(),
            "{name}: the churned worker still carries dead incarnations' work"
        );
        let home = node.mesh().worker(W_HOME).fleet().counts;
        assert_eq!(home.requests, 2, "{name}: {home:?}");
        assert_eq!(
            home.dispatched_since_poll,
            2 * HOME_TOKENS,
            "{name}: {home:?}"
        );
    }
    assert_eq!(
        o.mesh().members(),
        vec!["obs".to_string(), "peer".to_string()]
    );
    for (node, after, base) in [
        ("O", after_a_rate[0], base_rate[0]),
        ("P", after_a_rate[1], base_rate[1]),
        ("O", after_b_rate[0], base_rate[0]),
        ("P", after_b_rate[1], base_rate[1]),
    ] {
        assert_rate_back(node, after, base);
    }
}
