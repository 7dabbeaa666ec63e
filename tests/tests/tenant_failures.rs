//! Per-tenant limits when a replica fails, with real `shoal` processes
//! over an in-process mock engine. This file proves that:
//!
//! - a replica killed mid-window (`kill -9`) stops counting on the
//!   survivors within the mesh's link idle timeout: its admissions leave
//!   their `/tenants` usage, and the survivors then admit the tenant's
//!   whole allowance again (at most one more: the overshoot bound of
//!   `docs/tenants.md` for sequential traffic);
//! - a replica restarted under the same name does not count twice: the
//!   old run's admissions are gone everywhere, the new run's are seen by
//!   the others, and the allowance left is exactly the allowance minus
//!   what the live runs admitted.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tenants_support;

use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_tests::wait::poll_until;
use shoal_tests::workload::text;
use tenants_support::answer::{Answer, ask, refusal};
use tenants_support::{ACME_KEY, Rig, allowance, run};

/// The tests' window: long enough that nothing slides out of it while a
/// test runs (each takes well under 20 s from its first admission).
const WINDOW_SECS: u64 = 20;
/// 60 requests per 20 s window.
const RPM: u64 = 180;
/// The mesh's link idle timeout (`MeshConfig::link_idle_timeout`, 3 s by
/// default, not a `shoal` flag): a peer whose link is silent this long
/// stops counting. A `kill -9`ed replica's link goes silent at once.
const LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Slack on top of it for a loaded 2-core box (gossip reads every 100 ms,
/// the `/tenants` polls, a debug build).
const MARGIN: Duration = Duration::from_secs(4);

/// The tenants file of both tests: acme, 60 requests per 20 s.
fn tenants() -> String {
    format!(
        "window_secs = {WINDOW_SECS}\n[tenants.acme]\nkeys = [\"{ACME_KEY}\"]\nrequests_per_minute = {RPM}\n"
    )
}

/// acme's fleet-wide `used.requests` as replica `i` reports it in
/// `GET /tenants`; `None` if it does not answer.
async fn used_requests(rig: &Rig, i: usize) -> Option<u64> {
    let v = rig.tenants(i).await?;
    v["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == "acme")?
        .pointer("/used/requests")
        .and_then(Value::as_u64)
}

/// Sends `n` requests through replica `r` one after the other, each
/// expected to be admitted; `seed` keeps the prompts apart.
async fn admit(rig: &Rig, r: usize, n: u64, seed: u64) {
    let base = rig.fleet.url(r);
    for k in 0..n {
        let a = ask(&rig.client, &base, Some(ACME_KEY), &text(seed + k, 64), 1).await;
        assert_eq!(
            a.status,
            200,
            "request {k} of {n} through replica {r} is within the allowance: {}\n{}",
            a.brief(),
            rig.logs()
        );
    }
}

/// Waits up to `within` until every replica of `replicas` reports
/// `want` requests used; panics with what each last reported. Returns
/// how long it took.
async fn wait_used(rig: &Rig, replicas: &[usize], want: u64, within: Duration) -> Duration {
    let started = Instant::now();
    let mut last = vec![None; replicas.len()];
    let ok = poll_until(within, async || {
        for (k, &i) in replicas.iter().enumerate() {
            last[k] = used_requests(rig, i).await;
        }
        last.iter().all(|u| *u == Some(want))
    })
    .await;
    assert!(
        ok,
        "replicas {replicas:?} should report used.requests = {want} within {within:?}; they \
         report {last:?}\n{}",
        rig.logs()
    );
    started.elapsed()
}

/// Offers `n` requests one after the other, alternating over `replicas`;
/// returns every answer in order.
async fn alternate(rig: &Rig, replicas: &[usize], n: usize, seed: u64) -> Vec<(usize, Answer)> {
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let r = replicas[k % replicas.len()];
        let a = ask(
            &rig.client,
            &rig.fleet.url(r),
            Some(ACME_KEY),
            &text(seed + k as u64, 64),
            1,
        )
        .await;
        out.push((r, a));
    }
    out
}

/// Test 1: three meshed replicas, acme allowed 60 requests per 20 s.
/// 30 admitted through replica 2 are seen by replicas 0 and 1; replica 2
/// is killed (`kill -9`): within the link idle timeout (plus margin) the
/// survivors report 0 used, and together they then admit 60 more (at
/// most 61) before refusing `tenant_rate_limited`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_usage_leaves_the_survivors_count() {
    const BEFORE_KILL: u64 = 30;
    const AFTER: usize = 75;
    run(Duration::from_secs(30), async {
        let limit = allowance(RPM, WINDOW_SECS);
        assert_eq!(limit, 60);
        let mut rig = Rig::start(3, true, &tenants()).await;
        admit(&rig, 2, BEFORE_KILL, 0).await;
        let seen = wait_used(&rig, &[0, 1], BEFORE_KILL, Duration::from_secs(3)).await;
        println!("replicas 0 and 1 count replica 2's {BEFORE_KILL} admissions after {seen:?}");

        rig.fleet.kill9(2).unwrap();
        let killed = Instant::now();
        let dropped = wait_used(&rig, &[0, 1], 0, LINK_IDLE_TIMEOUT + MARGIN).await;
        println!(
            "replica 2 killed: its admissions left replicas 0 and 1's count after {dropped:?} \
             (link idle timeout {LINK_IDLE_TIMEOUT:?})"
        );

        let answers = alternate(&rig, &[0, 1], AFTER, 1_000).await;
        let took = killed.elapsed();
        let admitted = answers.iter().filter(|(_, a)| a.status == 200).count();
        let first_refusal = answers.iter().position(|(_, a)| a.status != 200);
        let per_replica: Vec<usize> = [0, 1]
            .iter()
            .map(|&r| {
                answers
                    .iter()
                    .filter(|(i, a)| *i == r && a.status == 200)
                    .count()
            })
            .collect();
        println!(
            "after the kill, {AFTER} requests alternating over replicas 0 and 1: {admitted} \
             admitted (per replica {per_replica:?}), first refusal at #{first_refusal:?}; \
             {took:?} since the kill"
        );
        assert!(
            (limit as usize..=limit as usize + 1).contains(&admitted),
            "the survivors admit the allowance {limit} once the dead replica's usage has left \
             (one more at most: the overshoot bound); they admitted {admitted}: {:?}",
            answers
                .iter()
                .filter(|(_, a)| a.status != 200)
                .take(3)
                .map(|(r, a)| format!("replica {r}: {}", a.brief()))
                .collect::<Vec<_>>()
        );
        assert!(
            first_refusal.is_some_and(|k| k >= limit as usize),
            "the first {limit} requests are all admitted (the dead replica's {BEFORE_KILL} no \
             longer count); the first refusal came at #{first_refusal:?}"
        );
        for (r, a) in answers.iter().skip(limit as usize + 1) {
            refusal(a, "tenant_rate_limited", WINDOW_SECS)
                .unwrap_or_else(|e| panic!("replica {r}, past the allowance: {e}"));
        }
        assert!(
            took < Duration::from_secs(WINDOW_SECS),
            "the survivors' admissions ran {took:?} after the kill: some may have left the \
             {WINDOW_SECS} s window"
        );
        wait_used(&rig, &[0, 1], admitted as u64, Duration::from_secs(3)).await;
    })
    .await;
}

/// Test 2: three meshed replicas, acme allowed 60 requests per 20 s.
/// 10 admitted through replica 2, seen by the others; replica 2 is killed
/// and restarted at once (a new run, same name and ports): the old run's
/// 10 leave every count, 5 admitted through the new run are counted as 5
/// (not 15) everywhere, 3 through replica 0 are seen by the new run, and
/// replica 2 then admits exactly 60 − 8 = 52 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_is_not_counted_twice() {
    const OLD_RUN: u64 = 10;
    const NEW_RUN: u64 = 5;
    const VIA_ZERO: u64 = 3;
    run(Duration::from_secs(30), async {
        let limit = allowance(RPM, WINDOW_SECS);
        let mut rig = Rig::start(3, true, &tenants()).await;
        admit(&rig, 2, OLD_RUN, 0).await;
        wait_used(&rig, &[0, 1, 2], OLD_RUN, Duration::from_secs(3)).await;

        rig.fleet.kill9(2).unwrap();
        let killed = Instant::now();
        rig.fleet.restart(2).await.unwrap();
        let restarted = killed.elapsed();
        rig.fleet
            .wait_meshed(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", rig.logs()));
        let meshed = killed.elapsed();
        let gone = wait_used(&rig, &[0, 1, 2], 0, LINK_IDLE_TIMEOUT + MARGIN).await;
        println!(
            "replica 2 restarted after {restarted:?}, meshed after {meshed:?}; the old run's \
             {OLD_RUN} left every count {gone:?} later ({:?} after the kill)",
            killed.elapsed()
        );

        admit(&rig, 2, NEW_RUN, 100).await;
        wait_used(&rig, &[0, 1, 2], NEW_RUN, Duration::from_secs(3)).await;
        // Settled: nobody adds the old run back (a late frame, a resync).
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..3 {
            assert_eq!(
                used_requests(&rig, i).await,
                Some(NEW_RUN),
                "replica {i} counts only the new run's {NEW_RUN}, not the old run's {OLD_RUN} too"
            );
        }

        admit(&rig, 0, VIA_ZERO, 200).await;
        let used = NEW_RUN + VIA_ZERO;
        wait_used(&rig, &[0, 1, 2], used, Duration::from_secs(3)).await;

        let answers = alternate(&rig, &[2], (limit - used) as usize + 5, 300).await;
        let admitted = answers.iter().filter(|(_, a)| a.status == 200).count() as u64;
        println!(
            "through the restarted replica: {admitted} more admitted with {used} used (allowance \
             {limit}); {:?} since the kill",
            killed.elapsed()
        );
        assert_eq!(
            admitted,
            limit - used,
            "the restarted replica admits what is left of the allowance, no more and no less \
             (fewer would mean the old run still counts): {:?}",
            answers
                .iter()
                .filter(|(_, a)| a.status != 200)
                .take(2)
                .map(|(_, a)| a.brief())
                .collect::<Vec<_>>()
        );
        for (_, a) in answers.iter().skip(admitted as usize) {
            refusal(a, "tenant_rate_limited", WINDOW_SECS).unwrap_or_else(|e| panic!("{e}"));
        }
    })
    .await;
}
