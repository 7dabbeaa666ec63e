//! Fleet-wide routing with real `shoal` processes meshed on loopback over
//! in-process mock engines: in-flight load seen fleet-wide, policies acting
//! on it, and poll ownership. Faults (kill, restart, drain) are in
//! `fleet_faults.rs`.
//!
//! The `shoal` binary is found next to this test in the target directory:
//! `cargo test --workspace` builds it; with `-p shoal-tests` run
//! `cargo build -p shoal` first (or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::time::{Duration, Instant};

use fleet_support::{Setup, chosen, engines, meshed, run, start, wait_for};
use serde_json::json;
use shoal_tests::fleet::same_url;
use shoal_tests::workload::{HeldStream, short_request, text};

/// (a) Requests held open through replica a show in replica c's fleet
/// in-flight within 1 s, and c's `least_load` sends its own requests
/// elsewhere. With no engine snapshots (`--worker-load-source none`) only
/// the mesh can tell c about a's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_requests_show_fleet_wide_within_1s_and_least_load_steers_away() {
    run(async {
        let s = meshed(
            3,
            &["--policy", "least_load", "--worker-load-source", "none"],
        )
        .await;
        let (a, c) = (0, 2);
        let mut held = Vec::new();
        for k in 0..2u64 {
            // From before the request is sent: routing, booking and the
            // push to c all fit in the second.
            let opened = Instant::now();
            let stream = HeldStream::open(&s.client, &s.fleet.url(a), &text(k, 4_000), 4_000)
                .await
                .unwrap();
            held.push(stream);
            let want = k + 1;
            wait_for(
                "c sees a's held requests",
                Duration::from_secs(1),
                async || {
                    let st = s.status(c).await?;
                    (st.inflight_from("a") == want).then_some(())
                },
            )
            .await;
            println!(
                "held request {want}: in c's view after {:?}",
                opened.elapsed()
            );
        }
        let active = s.active();
        let busy: Vec<usize> = (0..3).filter(|&i| active[i] > 0).collect();
        assert!(
            !busy.is_empty() && busy.len() < 3,
            "engines active: {active:?}"
        );
        let st = s.status(c).await.unwrap();
        for (i, engine) in s.engines.iter().enumerate() {
            let w = st.worker(&engine.url()).expect("c lists every worker");
            assert_eq!(
                w.inflight_requests > 0,
                busy.contains(&i),
                "{}",
                st.fleet_table()
            );
        }
        for k in 0..6u64 {
            let before = s.accepted();
            short_request(&s.client, &s.fleet.url(c), &text(100 + k, 200), 4)
                .await
                .unwrap();
            let to = chosen(&before, &s.accepted());
            assert!(
                !busy.contains(&to),
                "c's least_load sent request {k} to engine {to}, which holds a's requests \
                 (busy {busy:?}); c's view:\n{}",
                st.fleet_table()
            );
        }
        drop(held);
    })
    .await;
}

/// Three replicas over engine A only each hold 4 long requests sharing a
/// prefix (12 at A fleet-wide, 4 per replica); then engine B is added to
/// every replica and each sends one more request with that prefix. Returns
/// the engine (0 = A, 1 = B) each probe went to.
async fn imbalance_probes(mesh: bool) -> Vec<usize> {
    let args = [
        "--policy",
        "cache_aware",
        "--balance-abs-threshold",
        "8",
        "--worker-load-source",
        "none",
    ];
    let s: Setup = start(engines(2).await, &[0], mesh, &args).await;
    let prefix = text(42, 2_000);
    let mut held = Vec::new();
    for r in 0..3 {
        for k in 0..4 {
            let prompt = format!("{prefix} replica {r} request {k}");
            let stream = HeldStream::open(&s.client, &s.fleet.url(r), &prompt, 3_000).await;
            held.push(stream.unwrap());
        }
    }
    assert_eq!(s.active(), vec![12, 0]);
    if mesh {
        for r in 0..3 {
            let a_url = s.engines[0].url();
            wait_for(
                "every replica sees 12 at A",
                Duration::from_secs(3),
                async || {
                    let st = s.status(r).await?;
                    (st.worker(&a_url)?.inflight_requests == 12).then_some(())
                },
            )
            .await;
        }
    }
    let b_url = s.engines[1].url();
    // Meshed, one POST adds B on every replica (the worker set is
    // fleet-wide); alone, each replica needs its own.
    let posting = if mesh { 0..1 } else { 0..3 };
    for r in posting {
        let resp = s
            .client
            .post_json(
                &format!("{}/workers", s.fleet.url(r)),
                &json!({"url": b_url}),
            )
            .await
            .unwrap();
        assert_eq!(resp.status, 201, "{}", resp.text());
    }
    for r in 0..3 {
        wait_for(
            "every replica lists B",
            Duration::from_secs(1),
            async || {
                let resp = s
                    .client
                    .get(&format!("{}/workers", s.fleet.url(r)))
                    .await
                    .ok()?;
                resp.text().contains(&b_url).then_some(())
            },
        )
        .await;
    }
    let mut probes = Vec::new();
    for r in 0..3 {
        let before = s.accepted();
        let prompt = format!("{prefix} probe {r}");
        short_request(&s.client, &s.fleet.url(r), &prompt, 1)
            .await
            .unwrap();
        probes.push(chosen(&before, &s.accepted()));
    }
    if mesh && let Some(st) = s.status(2).await {
        print!("c's view:\n{}", st.fleet_table());
    }
    drop(held);
    probes
}

/// (b) With the mesh, the fleet imbalance guard of `cache_aware`
/// (`--balance-abs-threshold 8`: 12 vs 0 in flight) overrides prefix
/// affinity on every replica, though each sees only 4 of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_imbalance_guard_trips_on_fleet_counts() {
    let probes = run(imbalance_probes(true)).await;
    assert_eq!(
        probes,
        vec![1, 1, 1],
        "probes should avoid the overloaded A"
    );
}

/// (b, control) The same without the mesh: each replica sees 4 vs 0, below
/// the threshold, so affinity keeps sending the prefix to A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_mesh_the_guard_misses_the_imbalance() {
    let probes = run(imbalance_probes(false)).await;
    assert_eq!(probes, vec![0, 0, 0], "a per-replica view should miss it");
}

const POLL_MS: u64 = 200;
const WINDOW: Duration = Duration::from_secs(3);

/// Load-endpoint hits per engine during [`WINDOW`].
async fn polls_in_window(s: &Setup) -> Vec<u64> {
    let before = s.load_polls();
    tokio::time::sleep(WINDOW).await;
    let after = s.load_polls();
    before.iter().zip(&after).map(|(b, a)| a - b).collect()
}

fn poll_args() -> Vec<&'static str> {
    vec![
        "--policy",
        "least_load",
        "--worker-load-source",
        "sglang",
        "--load-poll-interval-ms",
        "200",
    ]
}

/// (e) With the mesh each engine is polled by its owner only: about once
/// per interval in total, not once per replica; every replica agrees on
/// the owners and has a fresh snapshot of every worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engine_is_polled_about_once_per_interval_in_total() {
    run(async {
        let s = meshed(2, &poll_args()).await;
        let urls: Vec<String> = s.engines.iter().map(|e| e.url()).collect();
        let mut owners: Vec<Vec<String>> = Vec::new();
        for r in 0..3 {
            let row = wait_for("owners and snapshots", Duration::from_secs(5), async || {
                let st = s.status(r).await?;
                urls.iter()
                    .map(|u| {
                        let w = st.worker(u)?;
                        w.snapshot.as_ref()?;
                        w.owner.clone()
                    })
                    .collect::<Option<Vec<String>>>()
            })
            .await;
            owners.push(row);
        }
        assert!(
            owners.iter().all(|o| *o == owners[0]),
            "owners differ: {owners:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let polls = polls_in_window(&s).await;
        let expected = WINDOW.as_millis() as u64 / POLL_MS;
        println!("load polls per engine in {WINDOW:?}: {polls:?} (one poller: ~{expected})");
        for (i, &n) in polls.iter().enumerate() {
            assert!(
                n * 2 >= expected && n * 2 <= expected * 3,
                "engine {i} polled {n} times in {WINDOW:?}; expected ~{expected} (owners {:?})\n{}",
                owners[0],
                s.log(0)
            );
        }
        for r in 0..3 {
            let st = s.status(r).await.unwrap();
            for w in &st.workers {
                let snap = w.snapshot.as_ref().unwrap();
                assert!(urls.iter().any(|u| same_url(u, &w.worker)));
                assert!(snap.age_ms < 3 * POLL_MS, "stale snapshot at {r}: {snap:?}");
            }
        }
    })
    .await;
}

/// (e, control) Without the mesh every replica polls every engine: three
/// times as often, which is what ownership saves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_mesh_every_replica_polls_every_engine() {
    run(async {
        let s = start(engines(2).await, &[0, 1], false, &poll_args()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let polls = polls_in_window(&s).await;
        let expected = WINDOW.as_millis() as u64 / POLL_MS;
        println!("load polls per engine in {WINDOW:?} without the mesh: {polls:?}");
        for &n in &polls {
            assert!(
                n * 10 >= expected * 22,
                "{polls:?}, expected ~{}",
                3 * expected
            );
        }
    })
    .await;
}

/// How long an idle fleet takes to forget a finished request everywhere
/// (its release pushed, a 100 ms poll taken and shared).
const SETTLE: Duration = Duration::from_millis(400);

/// `shoal_mesh_sightings_received_total` of replica `i`.
async fn sightings_received(s: &Setup, i: usize) -> Option<u64> {
    let resp = s
        .client
        .get(&format!("{}/metrics", s.fleet.url(i)))
        .await
        .ok()?;
    resp.text()
        .lines()
        .find_map(|l| l.strip_prefix("shoal_mesh_sightings_received_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// (f) `prefix_affinity` across replicas: a prompt seen once on replica a
/// has affinity on b and c the next time, as it would on one router (the
/// first sighting is shared over the mesh). Without the sharing, b's and
/// c's first sightings would go to least_load's pick, a random one of four
/// idle engines: all three replicas agreeing on all six prompts by chance
/// has odds of about 1 in 4^12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_seen_on_one_replica_has_affinity_on_every_replica_next_time() {
    run(async {
        let args = [
            "--policy",
            "prefix_affinity",
            "--load-poll-interval-ms",
            "100",
        ];
        let s = meshed(4, &args).await;
        for tag in 0..6u64 {
            let prompt = text(1_000 + tag, 2_000);
            short_request(&s.client, &s.fleet.url(0), &prompt, 1)
                .await
                .unwrap();
            tokio::time::sleep(SETTLE).await;
            for r in [1, 2] {
                wait_for(
                    "the peers hear of the first sighting",
                    Duration::from_secs(2),
                    async || (sightings_received(&s, r).await? > tag).then_some(()),
                )
                .await;
            }
            let mut picks = Vec::new();
            for r in [1, 2, 0] {
                let before = s.accepted();
                short_request(&s.client, &s.fleet.url(r), &prompt, 1)
                    .await
                    .unwrap();
                picks.push(chosen(&before, &s.accepted()));
                // The fleet is idle again before the next request: the
                // release has reached the peers and a poll has cleared the
                // work dispatched since the last one. In a fleet this idle
                // the load bound is tight (at one request in flight only
                // idle engines are admitted), so leftovers would overflow.
                tokio::time::sleep(SETTLE).await;
            }
            assert!(
                picks.iter().all(|&p| p == picks[0]),
                "prompt {tag}: b, c and a again picked {picks:?}\n{}",
                s.log(1)
            );
        }
    })
    .await;
}
