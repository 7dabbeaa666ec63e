//! Replica faults with real `shoal` processes meshed on loopback: `kill -9`
//! under load, a restart (new incarnation) and a SIGTERM drain. See
//! `fleet.rs` for how the `shoal` binary is found.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fleet_support::{meshed, run, wait_for};
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::MeshStatus;
use shoal_tests::workload::{HeldStream, short_request, text};
use tokio::task::JoinSet;

/// Holds `n` long streams through replica `r`.
async fn hold(s: &fleet_support::Setup, r: usize, n: u64, seed: u64) -> Vec<HeldStream> {
    let mut held = Vec::new();
    for k in 0..n {
        let prompt = text(seed + k, 800);
        held.push(
            HeldStream::open(&s.client, &s.fleet.url(r), &prompt, 4_000)
                .await
                .unwrap(),
        );
    }
    held
}

/// Whether node `name` still shows in a view: a counted incarnation or a
/// share of in-flight load.
fn still_counts(st: &MeshStatus, name: &str) -> bool {
    st.members_named(name).any(|m| m.counted) || st.inflight_from(name) > 0
}

/// (c) `kill -9` of replica a while it holds requests and b and c serve a
/// steady load: every request through b and c succeeds, and a's load
/// leaves their views within 10 s (then their fleet totals drop to 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_nothing_elsewhere_and_its_load_leaves_the_views() {
    run(async {
        let mut s = meshed(
            3,
            &[
                "--policy",
                "least_load",
                "--worker-load-source",
                "sglang",
                "--load-poll-interval-ms",
                "200",
            ],
        )
        .await;
        let held = hold(&s, 0, 3, 1).await;
        for r in [1, 2] {
            wait_for("a's load in the view", Duration::from_secs(2), async || {
                (s.status(r).await?.inflight_from("a") == 3).then_some(())
            })
            .await;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut load = JoinSet::new();
        for (r, lane) in [(1, 0), (1, 1), (2, 0), (2, 1)] {
            let (url, client, stop) = (s.fleet.url(r), s.client.clone(), stop.clone());
            load.spawn(async move {
                let (mut ok, mut errors) = (0u64, Vec::new());
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let prompt = text(1_000_000 * (r * 10 + lane) as u64 + k, 300);
                    match short_request(&client, &url, &prompt, 16).await {
                        Ok(()) => ok += 1,
                        Err(e) => errors.push(format!("via {url}: {e}")),
                    }
                }
                (ok, errors)
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.fleet.kill9(0).unwrap();
        drop(held);
        let killed = Instant::now();
        for r in [1, 2] {
            wait_for(
                "a's load leaves the view",
                Duration::from_secs(10),
                async || {
                    let st = s.status(r).await?;
                    (!still_counts(&st, "a")).then_some(())
                },
            )
            .await;
        }
        println!(
            "a left b's and c's views {:?} after kill -9",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed())).await;
        stop.store(true, Ordering::Relaxed);
        let (mut ok, mut errors) = (0, Vec::new());
        while let Some(lane) = load.join_next().await {
            let (n, e) = lane.unwrap();
            ok += n;
            errors.extend(e);
        }
        println!("{ok} requests through b and c succeeded");
        assert!(errors.is_empty(), "{} failed: {errors:#?}", errors.len());
        assert!(ok >= 8, "too little load: {ok}");
        for r in [1, 2] {
            wait_for(
                "fleet totals drop to 0",
                Duration::from_secs(3),
                async || (s.status(r).await?.total_inflight() == 0).then_some(()),
            )
            .await;
        }
    })
    .await;
}

/// (d) Replica a restarts (kill -9, then the same name and ports): a new
/// generation. Sampled continuously, c's view never counts two
/// incarnations of a nor more than the 3 requests a really holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_is_never_double_counted() {
    run(async {
        let mut s = meshed(
            2,
            &["--policy", "least_load", "--worker-load-source", "none"],
        )
        .await;
        let gen1 = s.status(0).await.unwrap().generation;
        let held = hold(&s, 0, 3, 10).await;
        wait_for("c sees a's 3", Duration::from_secs(2), async || {
            (s.status(2).await?.inflight_from("a") == 3).then_some(())
        })
        .await;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (url, stop) = (format!("{}/mesh/status", s.fleet.url(2)), stop.clone());
            tokio::spawn(async move {
                let client = HttpClient::new();
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(resp) = client.get(&url).await
                        && let Ok(st) = serde_json::from_slice::<MeshStatus>(&resp.body)
                    {
                        let counted_a = st.members_named("a").filter(|m| m.counted).count();
                        samples.push((st.total_inflight(), counted_a));
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                samples
            })
        };
        s.fleet.kill9(0).unwrap();
        drop(held);
        s.fleet.restart(0).await.unwrap_or_else(|e| panic!("{e}"));
        let gen2 = wait_for("a answers again", Duration::from_secs(5), async || {
            Some(s.status(0).await?.generation)
        })
        .await;
        assert!(
            gen2 > gen1,
            "restart must be a new generation ({gen1} -> {gen2})"
        );
        let held = hold(&s, 0, 3, 20).await;
        wait_for(
            "c counts the new a's 3 only",
            Duration::from_secs(10),
            async || {
                let st = s.status(2).await?;
                let shares: Vec<_> = st
                    .workers
                    .iter()
                    .flat_map(|w| &w.shares)
                    .filter(|sh| sh.name() == "a" && sh.requests > 0)
                    .collect();
                (st.inflight_from("a") == 3
                    && shares.iter().all(|sh| sh.generation() == Some(gen2)))
                .then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.await.unwrap();
        println!("{} samples of c's view during the restart", samples.len());
        assert!(samples.len() >= 20);
        let worst = samples.iter().map(|s| s.0).max().unwrap_or(0);
        assert!(
            worst <= 3,
            "c counted {worst} in flight (a holds 3): {samples:?}"
        );
        assert!(
            samples.iter().all(|s| s.1 <= 1),
            "two a's counted: {samples:?}"
        );
        drop(held);
    })
    .await;
}

/// (f) SIGTERM to replica a with a stream in flight: a's readiness turns to
/// draining (also in c's view), b and c keep serving, new connections to a
/// are refused after the settle time, the stream finishes whole, a exits 0
/// and leaves c's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_replica_drains_without_failing_in_flight_requests() {
    run(async {
        let mut s = meshed(
            2,
            &[
                "--policy",
                "least_load",
                "--worker-load-source",
                "none",
                "--drain-settle-secs",
                "2",
            ],
        )
        .await;
        let a = s.fleet.url(0);
        // ~300 tokens at ~12 ms each: it outlives the 2 s settle time.
        let stream = HeldStream::open(&s.client, &a, &text(5, 400), 300)
            .await
            .unwrap();
        let finished = tokio::spawn(stream.finish());
        s.fleet.sigterm(0).unwrap();
        let signalled = Instant::now();
        wait_for(
            "a's readiness says draining",
            Duration::from_secs(1),
            async || {
                let r = HttpClient::new()
                    .get(&format!("{a}/readiness"))
                    .await
                    .ok()?;
                (r.status == 503 && r.text().contains("draining")).then_some(())
            },
        )
        .await;
        wait_for("c sees a draining", Duration::from_secs(2), async || {
            let st = s.status(2).await?;
            st.members_named("a")
                .any(|m| m.readiness.as_deref() == Some("draining"))
                .then_some(())
        })
        .await;
        for r in [1, 2] {
            short_request(&s.client, &s.fleet.url(r), &text(50 + r as u64, 200), 8)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2_500).saturating_sub(signalled.elapsed())).await;
        let late = HttpClient::new().get(&format!("{a}/liveness")).await;
        assert!(
            late.is_err(),
            "a new connection after the settle time: {late:?}"
        );
        let tokens = finished
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}\n{}", s.log(0)));
        assert_eq!(tokens, 300, "the in-flight stream finished whole");
        let exit = s.fleet.wait_exit(0, Duration::from_secs(10)).await.unwrap();
        assert!(exit.success(), "a exited with {exit}\n{}", s.log(0));
        println!(
            "a drained and exited {:?} after SIGTERM",
            signalled.elapsed()
        );
        wait_for("a leaves c's view", Duration::from_secs(5), async || {
            let st = s.status(2).await?;
            (!still_counts(&st, "a")).then_some(())
        })
        .await;
    })
    .await;
}
