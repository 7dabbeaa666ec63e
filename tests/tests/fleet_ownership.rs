//! Poll ownership with real `shoal` processes: a worker is owned only by
//! a replica that polls it, so it never waits dark for an owner that will
//! not poll. See `fleet.rs` for how the `shoal` binary is found.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::time::Duration;

use fleet_support::{engines, run, start, wait_for};

const POLL_MS: u64 = 200;
/// `--load-stale-after-ms` defaults to three poll intervals.
const STALE_MS: u64 = 3 * POLL_MS;

/// A worker only replica `b` routes to (in its own `--worker-urls`): every replica
/// agrees `b` owns it (it is the only poller), and `b`'s snapshot of it
/// stays younger than the stale limit for seconds on end. (Were ownership
/// computed over all members, the owner would be `a` or `c` two times in
/// three; `b` would poll it only after the snapshot went stale.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_seeded_on_one_replica_is_owned_by_it_and_stays_lit() {
    run(async {
        let poll = POLL_MS.to_string();
        let s = start(
            engines(3).await,
            &[0, 1],
            true,
            &[
                "--policy",
                "least_load",
                "--worker-load-source",
                "sglang",
                "--load-poll-interval-ms",
                &poll,
            ],
        )
        .await;
        let extra = s.engines[2].url();
        // Only b routes to the extra worker: it is in b's own seeds (an
        // admin add would reach every replica through the worker set).
        let mut s = s;
        let seeds = [0, 1, 2].map(|i| s.engines[i].url()).join(",");
        s.fleet.kill9(1).unwrap();
        s.fleet.append_args(1, ["--worker-urls".to_string(), seeds]);
        s.fleet.restart(1).await.unwrap();
        s.fleet.wait_meshed(Duration::from_secs(15)).await.unwrap();
        for i in 0..3 {
            wait_for(
                "every replica sees b as the only poller and the owner",
                Duration::from_secs(5),
                async || {
                    let st = s.status(i).await?;
                    let w = st.worker(&extra)?;
                    (w.owner.as_deref() == Some("b") && w.pollers == ["b"]).then_some(())
                },
            )
            .await;
        }
        wait_for("b has a snapshot", Duration::from_secs(5), async || {
            s.status(1)
                .await?
                .worker(&extra)?
                .snapshot
                .as_ref()
                .map(|_| ())
        })
        .await;
        let mut ages = Vec::new();
        for _ in 0..60 {
            let st = s.status(1).await.unwrap();
            let snap = st.worker(&extra).and_then(|w| w.snapshot.clone());
            ages.push(snap.map_or(u64::MAX, |sn| sn.age_ms));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let worst = ages.iter().copied().max().unwrap_or(u64::MAX);
        println!("snapshot age on b over 3 s: worst {worst} ms (stale after {STALE_MS} ms)");
        assert!(
            worst < STALE_MS,
            "the worker went stale on the replica that alone routes to it: ages {ages:?}\n{}",
            s.log(1)
        );
    })
    .await;
}
