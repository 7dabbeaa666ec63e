//! Per-tenant limits (`--tenants-file`) with real `shoal` processes over
//! in-process mock engines. This file proves that:
//!
//! - one router admits exactly a tenant's request allowance per sliding
//!   window and answers the excess 429 `tenant_rate_limited` with
//!   `Retry-After` and OpenAI's `x-ratelimit-*` headers, while another
//!   tenant is unaffected and unknown keys get 401;
//! - a meshed fleet shares each tenant's usage: an output-token allowance
//!   is granted once across the fleet (within 5 %), whether the traffic is
//!   spread evenly or lands mostly on one replica; without the mesh each
//!   replica grants it on its own (the baseline, more than twice as much);
//! - `max_concurrent` counts streams in flight fleet-wide (429
//!   `tenant_concurrency`) and frees its slots when they finish;
//! - a bad tenants file stops `shoal` at start naming the problem, and on
//!   reload (SIGHUP) a good file applies new limits while a bad one
//!   changes nothing;
//! - `GET /tenants` reports limits and fleet-wide usage on every replica.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first with `-p shoal-tests`, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tenants_support;

use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_tests::fleet::{locate_shoal, spawn_logged};
use shoal_tests::wait::wait_for;
use shoal_tests::workload::text;
use tenants_support::answer::{Answer, ask, rate_headers, refusal};
use tenants_support::load::{
    Held, OUTPUT_TPM, Spread, TOKENS_PER_REQUEST, TOKENS_REPLICAS, TOKENS_WINDOW_SECS,
    offer_tokens, output_token_tenants,
};
use tenants_support::{ACME_KEY, BOB_KEY, Rig, allowance, reloads, run, start_on};
use tokio::task::JoinSet;

/// Test 1: one router, 100 requests per 5 s window. 200 offered within
/// ~2 s by four clients: exactly 100 admitted, the rest 429
/// `tenant_rate_limited` with Retry-After and the request headers, the
/// remaining count going down to 0; bob (no limits) is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_router_admits_exactly_the_request_allowance_per_window() {
    const WINDOW_SECS: u64 = 5;
    const RPM: u64 = 1200;
    const OFFERED: usize = 200;
    const CLIENTS: usize = 4;
    run(Duration::from_secs(25), async {
        let limit = allowance(RPM, WINDOW_SECS);
        assert_eq!(limit, 100);
        let window = Duration::from_secs(WINDOW_SECS);
        let tenants = format!(
            "window_secs = {WINDOW_SECS}\n\
             [tenants.acme]\nkeys = [\"{ACME_KEY}\"]\nrequests_per_minute = {RPM}\n\
             [tenants.bob]\nkeys = [\"{BOB_KEY}\"]\n"
        );
        let rig = Rig::start(1, false, &tenants).await;
        let base = rig.fleet.url(0);

        for key in [None, Some("nobody-key-0000001")] {
            let a = ask(&rig.client, &base, key, "who are you", 1).await;
            assert_eq!(a.status, 401, "key {key:?}: {}", a.brief());
        }

        let started = Instant::now();
        let first = ask(&rig.client, &base, Some(ACME_KEY), &text(0, 64), 1).await;
        assert_eq!(first.status, 200, "{}\n{}", first.brief(), rig.logs());
        let first_remaining = rate_headers(&first, "requests", limit, window)
            .unwrap_or_else(|e| panic!("first request: {e}"));
        assert_eq!(
            first_remaining,
            limit - 1,
            "the first request leaves {} of {limit}: {}",
            limit - 1,
            first.brief()
        );

        // The other 199 from four clients, one request per 40 ms each.
        let mut clients = JoinSet::new();
        for c in 0..CLIENTS {
            let (client, base) = (rig.client.clone(), base.clone());
            clients.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(40));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut answers = Vec::new();
                for k in (1..OFFERED).filter(|k| k % CLIENTS == c) {
                    tick.tick().await;
                    let a = ask(&client, &base, Some(ACME_KEY), &text(k as u64, 64), 1).await;
                    answers.push((k, a));
                }
                answers
            });
        }
        let mut per_client = Vec::new();
        while let Some(done) = clients.join_next().await {
            per_client.push(done.unwrap());
        }
        let took = started.elapsed();
        let all: Vec<&Answer> = std::iter::once(&first)
            .chain(per_client.iter().flatten().map(|(_, a)| a))
            .collect();
        let admitted = all.iter().filter(|a| a.status == 200).count();
        let refused = all.iter().filter(|a| a.status == 429).count();
        println!(
            "{OFFERED} requests offered in {took:?}: {admitted} admitted, {refused} refused \
             (allowance {limit} per {WINDOW_SECS} s)"
        );
        assert!(
            took < window,
            "offering took {took:?}, not within one {window:?} window: the count would \
             include expiries ({admitted} admitted)"
        );
        assert_eq!(
            admitted + refused,
            OFFERED,
            "every answer is 200 or 429: {:?}",
            all.iter()
                .filter(|a| a.status != 200 && a.status != 429)
                .map(|a| a.brief())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            admitted as u64,
            limit,
            "exactly the allowance is admitted: {admitted} of {OFFERED} offered, limit {limit}\n{}",
            rig.logs()
        );

        let mut admitted_remaining = Vec::new();
        for a in &all {
            let remaining =
                rate_headers(a, "requests", limit, window).unwrap_or_else(|e| panic!("{e}"));
            if a.status == 200 {
                admitted_remaining.push(remaining);
            } else {
                refusal(a, "tenant_rate_limited", WINDOW_SECS).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(remaining, 0, "a refusal leaves nothing: {}", a.brief());
            }
        }
        assert_eq!(
            admitted_remaining.iter().min(),
            Some(&0),
            "the remaining count reaches 0 on the last admitted request: {admitted_remaining:?}"
        );
        // Each client is sequential: what it sees remaining only goes down.
        for answers in &per_client {
            let seen: Vec<u64> = answers
                .iter()
                .filter(|(_, a)| a.status == 200)
                .map(|(_, a)| {
                    a.number("x-ratelimit-remaining-requests")
                        .unwrap_or(u64::MAX)
                })
                .collect();
            assert!(
                seen.windows(2).all(|w| w[1] < w[0]) && seen.iter().all(|&r| r < first_remaining),
                "one client's admitted requests see the remaining count fall: {seen:?} \
                 (after the first request: {first_remaining})"
            );
        }

        // bob has no limits: all admitted, and no rate-limit headers.
        let mut bob = Vec::new();
        for k in 0..20u64 {
            bob.push(ask(&rig.client, &base, Some(BOB_KEY), &text(1_000 + k, 64), 1).await);
        }
        let bob_admitted = bob.iter().filter(|a| a.status == 200).count();
        assert_eq!(
            bob_admitted,
            bob.len(),
            "bob is unaffected by acme's limit: {:?}",
            bob.iter().map(Answer::brief).collect::<Vec<_>>()
        );
        for a in &bob {
            assert!(
                a.header("x-ratelimit-limit-requests").is_none(),
                "bob has no request limit, so no header: {}",
                a.brief()
            );
        }
    })
    .await;
}

/// Test 2: three meshed replicas share a 1000-output-token allowance per
/// 6 s window: offered at twice the allowance rate, the fleet admits
/// 950..=1050 tokens, with the traffic spread evenly (a) or 90 % on
/// replica 0 (b).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meshed_fleet_grants_an_output_token_allowance_once() {
    run(Duration::from_secs(35), async {
        let limit = allowance(OUTPUT_TPM, TOKENS_WINDOW_SECS);
        assert_eq!(limit, 1000);
        let rig = Rig::start(TOKENS_REPLICAS, true, &output_token_tenants()).await;
        let mut figures = Vec::new();
        for (key, spread, seed) in [
            ("even-key-00000001", Spread::Even, 1),
            ("skewed-key-0000001", Spread::Skewed(0.9), 2),
        ] {
            let p = offer_tokens(&rig, key, 2.0, spread, seed).await;
            let tokens = p.admitted as u64 * TOKENS_PER_REQUEST;
            figures.push((spread, tokens, p.offered));
            assert!(
                p.offered as u64 * TOKENS_PER_REQUEST > limit * 3 / 2,
                "the offer must exceed the allowance: {} requests × {TOKENS_PER_REQUEST} tokens",
                p.offered
            );
            assert!(
                (limit * 95 / 100..=limit * 105 / 100).contains(&tokens),
                "{spread:?}: the fleet admitted {tokens} output tokens ({} requests of {} \
                 offered, per replica (offered, admitted) {:?}); the allowance is {limit} \
                 once fleet-wide, within 5 %\n{}",
                p.admitted,
                p.offered,
                p.per_replica,
                rig.logs()
            );
            assert!(
                p.refused
                    .get("tenant_tokens_exhausted")
                    .copied()
                    .unwrap_or(0)
                    > 0,
                "{spread:?}: the excess is refused as tenant_tokens_exhausted: {:?}",
                p.refused
            );
        }
        println!("meshed, admitted output tokens (allowance {limit}): {figures:?}");
    })
    .await;
}

/// Test 3 (baseline): the same tenants on three replicas without the
/// mesh: each replica grants the allowance on its own, so evenly spread
/// traffic gets more than twice the allowance admitted, and no replica
/// more than its own allowance. The offer is 4 × the allowance rate: at
/// test 2's 2 × nothing could show more than 2 × admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_mesh_each_replica_grants_the_allowance_alone() {
    run(Duration::from_secs(30), async {
        let limit = allowance(OUTPUT_TPM, TOKENS_WINDOW_SECS);
        let rig = Rig::start(TOKENS_REPLICAS, false, &output_token_tenants()).await;
        let p = offer_tokens(&rig, "even-key-00000001", 4.0, Spread::Even, 3).await;
        let tokens = p.admitted as u64 * TOKENS_PER_REQUEST;
        println!(
            "no mesh, {TOKENS_REPLICAS} replicas: admitted {tokens} output tokens; the \
             allowance is {limit} (2 × = {}, one per replica = {})",
            2 * limit,
            TOKENS_REPLICAS as u64 * limit
        );
        assert!(
            tokens > 2 * limit,
            "each replica limits alone: admitted {tokens} output tokens, expected more than \
             2 × {limit}; per replica (offered, admitted) {:?}",
            p.per_replica
        );
        for (r, &(offered, admitted)) in p.per_replica.iter().enumerate() {
            let got = admitted as u64 * TOKENS_PER_REQUEST;
            assert!(
                got <= limit * 105 / 100,
                "replica {r} alone admitted {got} output tokens ({admitted} of {offered}), \
                 over its own allowance {limit}"
            );
        }
    })
    .await;
}

/// Test 4: `max_concurrent = 4` across two meshed replicas: with four
/// streams held open, two through each replica, a fifth request to either
/// replica is refused 429 `tenant_concurrency`; once the streams have
/// finished, requests are admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_counts_streams_in_flight_fleet_wide() {
    const MAX_CONCURRENT: usize = 4;
    /// ~400 × 12 ms ≈ 5 s per stream: open while the probes run.
    const STREAM_TOKENS: u64 = 400;
    run(Duration::from_secs(30), async {
        let tenants = format!(
            "window_secs = 60\n[tenants.acme]\nkeys = [\"{ACME_KEY}\"]\nmax_concurrent = {MAX_CONCURRENT}\n"
        );
        let rig = Rig::start(2, true, &tenants).await;
        let mut held = Vec::new();
        for k in 0..MAX_CONCURRENT {
            let r = k % 2;
            let s = Held::open(
                &rig.client,
                &rig.fleet.url(r),
                ACME_KEY,
                &text(k as u64, 200),
                STREAM_TOKENS,
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "stream {k} of {MAX_CONCURRENT} (via replica {r}) is within the limit: {e}\n{}",
                    rig.logs()
                )
            });
            held.push(s);
        }
        let opened = Instant::now();
        for r in [0, 1] {
            // The other replica's streams arrive within a push gap; a
            // short request admitted before then is counted, not failed.
            let mut leaked = Vec::new();
            let refused = wait_for(
                "a fifth request is refused",
                Duration::from_secs(3),
                async || {
                    let a = ask(
                        &rig.client,
                        &rig.fleet.url(r),
                        Some(ACME_KEY),
                        &text(100 + r as u64, 64),
                        1,
                    )
                    .await;
                    if a.status == 429 {
                        Some(a)
                    } else {
                        leaked.push(a.brief());
                        None
                    }
                },
            )
            .await;
            println!(
                "replica {r}: refused {:?} after the streams opened; admitted before: {leaked:?}",
                opened.elapsed()
            );
            refusal(&refused, "tenant_concurrency", 60).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                leaked.len() <= 1,
                "replica {r} admitted {} requests over max_concurrent {MAX_CONCURRENT} with \
                 {MAX_CONCURRENT} streams open: {leaked:?}",
                leaked.len()
            );
            // Converged: the next one is refused at once.
            let again = ask(
                &rig.client,
                &rig.fleet.url(r),
                Some(ACME_KEY),
                &text(200 + r as u64, 64),
                1,
            )
            .await;
            refusal(&again, "tenant_concurrency", 60)
                .unwrap_or_else(|e| panic!("replica {r}, second probe: {e}"));
        }
        assert!(
            opened.elapsed() < Duration::from_secs(4),
            "the probes ran {:?}: the streams may have finished meanwhile",
            opened.elapsed()
        );
        let mut finishers = JoinSet::new();
        for (k, s) in held.into_iter().enumerate() {
            finishers.spawn(async move { (k, s.finish().await) });
        }
        while let Some(done) = finishers.join_next().await {
            let (k, got) = done.unwrap();
            assert_eq!(
                got,
                Ok(STREAM_TOKENS),
                "held stream {k} runs to its end, unaffected by the refusals"
            );
        }
        for r in [1, 0] {
            let admitted = wait_for(
                "a request is admitted once the streams finished",
                Duration::from_secs(3),
                async || {
                    let a = ask(
                        &rig.client,
                        &rig.fleet.url(r),
                        Some(ACME_KEY),
                        &text(300 + r as u64, 64),
                        1,
                    )
                    .await;
                    (a.status == 200).then_some(a)
                },
            )
            .await;
            println!("replica {r} admits again: {}", admitted.brief());
        }
    })
    .await;
}

/// Test 5: each bad tenants file stops `shoal` at start (non-zero exit)
/// with a message naming the file and the offending tenant or key; the
/// same command line with a good file starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tenants_file_stops_shoal_at_start_naming_the_problem() {
    run(Duration::from_secs(40), async {
        let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap();
        let good = |name: &str| format!("[tenants.{name}]\nkeys = [\"{name}-key-000001\"]\n");
        // (file name, content, words the message must hold besides the
        // file name, via the environment variable)
        let cases: Vec<(&str, String, Vec<&str>, bool)> = vec![
            (
                "not-toml.toml",
                "[tenants.acme\nkeys = = [\n".to_string(),
                vec![],
                false,
            ),
            (
                "unknown-key.toml",
                format!("{}requests_per_hour = 5\n", good("acme")),
                vec!["requests_per_hour"],
                false,
            ),
            (
                "no-keys.toml",
                format!(
                    "{}[tenants.keyless]\nrequests_per_minute = 60\n",
                    good("acme")
                ),
                vec!["keyless"],
                false,
            ),
            (
                "empty-keys.toml",
                format!("{}[tenants.emptykeys]\nkeys = []\n", good("acme")),
                vec!["emptykeys"],
                false,
            ),
            (
                "zero-limit.toml",
                format!("{}requests_per_minute = 0\n", good("zeroed")),
                vec!["zeroed", "requests_per_minute"],
                false,
            ),
            (
                "fractional-limit.toml",
                format!("{}output_tokens_per_minute = 1.5\n", good("halfway")),
                vec!["halfway", "output_tokens_per_minute"],
                false,
            ),
            (
                "long-window.toml",
                format!("window_secs = 61\n{}", good("acme")),
                vec!["window_secs"],
                true,
            ),
        ];
        for (name, content, words, via_env) in &cases {
            let file = dir.path().join(name);
            std::fs::write(&file, content).unwrap();
            let (status, said) = start_on(&bin, &file, *via_env).await;
            println!("{name}: {status}; {}", said.trim());
            assert!(
                !status.success(),
                "{name}: shoal must exit non-zero, got {status}; it said: {said}"
            );
            assert!(
                !said.contains("unexpected argument"),
                "{name}: shoal does not know the flag yet: {said}"
            );
            for word in std::iter::once(name).chain(words) {
                assert!(
                    said.contains(word),
                    "{name}: the message must name {word:?}; it said: {said}\nfile:\n{content}"
                );
            }
        }

        // The control: the same command line with a good file starts.
        let file = dir.path().join("good.toml");
        std::fs::write(
            &file,
            format!(
                "window_secs = 60\n{}requests_per_minute = 60\nmax_concurrent = 2\n",
                good("acme")
            ),
        )
        .unwrap();
        let args: Vec<String> = ["--host", "127.0.0.1", "--port", "0", "--tenants-file"]
            .into_iter()
            .map(String::from)
            .chain([file.to_string_lossy().into_owned()])
            .collect();
        let (mut child, addr) = spawn_logged(
            &bin,
            &args,
            &[],
            &dir.path().join("good.log"),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|e| panic!("a good tenants file starts shoal: {e}"));
        println!("good file: listening on {addr}");
        let _ = child.kill();
        let _ = child.wait();
    })
    .await;
}

/// Test 6: bob may make 1 request per 60 s window: the second is refused.
/// The file is rewritten to allow 600 and SIGHUP sent: bob is admitted
/// again within a bounded poll, under the new limit. A broken file sent
/// the same way is rejected whole: the 600 stay in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_raised_limit_and_a_bad_file_changes_nothing() {
    run(Duration::from_secs(25), async {
        let window = Duration::from_secs(60);
        let tenants = |rpm: u64| {
            format!(
                "window_secs = 60\n[tenants.bob]\nkeys = [\"{BOB_KEY}\"]\nrequests_per_minute = {rpm}\n"
            )
        };
        let rig = Rig::start(1, false, &tenants(1)).await;
        let base = rig.fleet.url(0);
        let first = ask(&rig.client, &base, Some(BOB_KEY), &text(1, 64), 1).await;
        assert_eq!(first.status, 200, "{}\n{}", first.brief(), rig.logs());
        assert_eq!(
            rate_headers(&first, "requests", 1, window),
            Ok(0),
            "allowance 1: nothing remains after the first"
        );
        let second = ask(&rig.client, &base, Some(BOB_KEY), &text(2, 64), 1).await;
        refusal(&second, "tenant_rate_limited", 60).unwrap_or_else(|e| panic!("{e}"));

        std::fs::write(&rig.file, tenants(600)).unwrap();
        rig.hangup(0);
        let t = Instant::now();
        let mut seed = 10;
        let admitted = wait_for(
            "bob is admitted under the raised limit",
            Duration::from_secs(5),
            async || {
                seed += 1;
                let a = ask(&rig.client, &base, Some(BOB_KEY), &text(seed, 64), 1).await;
                (a.status == 200).then_some(a)
            },
        )
        .await;
        println!("raised limit in force after {:?}", t.elapsed());
        rate_headers(&admitted, "requests", 600, window)
            .unwrap_or_else(|e| panic!("the new limit shows: {e}"));

        let rejected_before = reloads(&rig, "rejected").await.unwrap_or(0);
        std::fs::write(
            &rig.file,
            "window_secs = 60\n[tenants.bob]\nkeys = [\"bob-key-000000001\"]\nrequests_per_minute = 0\n",
        )
        .unwrap();
        rig.hangup(0);
        wait_for(
            "the broken tenants file is counted as a rejected reload",
            Duration::from_secs(5),
            async || (reloads(&rig, "rejected").await? > rejected_before).then_some(()),
        )
        .await;
        let after = ask(&rig.client, &base, Some(BOB_KEY), &text(99, 64), 1).await;
        assert_eq!(
            after.status,
            200,
            "the old tenants stay in force: {}\n{}",
            after.brief(),
            rig.logs()
        );
        rate_headers(&after, "requests", 600, window)
            .unwrap_or_else(|e| panic!("the limit is still 600: {e}"));
    })
    .await;
}

/// Test 7: `GET /tenants` on two meshed replicas, after requests through
/// replica 0 only: both report the limits and the same fleet-wide usage
/// (requests, output tokens, nothing in flight), and replica 0 the
/// refusal it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_tenants_shows_limits_and_fleet_wide_usage_on_every_replica() {
    const ACME_REQUESTS: u64 = 5;
    const MAX_TOKENS: u64 = 10;
    run(Duration::from_secs(25), async {
        let tenants = format!(
            "window_secs = 60\n\
             [tenants.acme]\nkeys = [\"{ACME_KEY}\"]\nrequests_per_minute = 600\n\
             output_tokens_per_minute = 6000\nmax_concurrent = 8\n\
             [tenants.tight]\nkeys = [\"tight-key-0000001\"]\nrequests_per_minute = 2\n\
             [tenants.bob]\nkeys = [\"{BOB_KEY}\"]\n"
        );
        let rig = Rig::start(2, true, &tenants).await;
        let base = rig.fleet.url(0);
        for k in 0..ACME_REQUESTS {
            let a = ask(&rig.client, &base, Some(ACME_KEY), &text(k, 64), MAX_TOKENS).await;
            assert_eq!(a.status, 200, "{}\n{}", a.brief(), rig.logs());
        }
        let tight: Vec<u16> = {
            let mut s = Vec::new();
            for k in 0..3 {
                s.push(
                    ask(
                        &rig.client,
                        &base,
                        Some("tight-key-0000001"),
                        &text(50 + k, 64),
                        1,
                    )
                    .await
                    .status,
                );
            }
            s
        };
        assert_eq!(tight, vec![200, 200, 429], "tight's allowance is 2");

        let tenant = |v: &Value, name: &str| -> Option<Value> {
            v["tenants"]
                .as_array()?
                .iter()
                .find(|t| t["name"] == name)
                .cloned()
        };
        let want_output = ACME_REQUESTS * MAX_TOKENS;
        let mut views = Vec::new();
        for r in [1, 0] {
            let mut last = None;
            let got = shoal_tests::wait::poll_until(Duration::from_secs(3), async || {
                let Some(v) = rig.tenants(r).await else {
                    return false;
                };
                let ok = tenant(&v, "acme").is_some_and(|a| {
                    a["used"]["requests"] == ACME_REQUESTS
                        && a["used"]["output_tokens"] == want_output
                        && a["used"]["in_flight"] == 0
                }) && tenant(&v, "tight").is_some_and(|t| t["used"]["requests"] == 2);
                last = Some(v);
                ok
            })
            .await;
            assert!(
                got,
                "replica {r}'s /tenants should show acme's {ACME_REQUESTS} requests and \
                 {want_output} output tokens (none in flight) and tight's 2 requests, all made \
                 through replica 0; last view: {}",
                last.as_ref()
                    .map_or_else(|| "no answer".to_string(), Value::to_string)
            );
            views.push((r, last.unwrap_or_default()));
        }
        for (r, v) in &views {
            assert_eq!(v["window_secs"], 60, "replica {r}: {v}");
            let acme = tenant(v, "acme").unwrap_or_default();
            let limits = &acme["limits"];
            assert_eq!(limits["requests"], 600, "replica {r}: {acme}");
            assert_eq!(limits["output_tokens"], 6000, "replica {r}: {acme}");
            assert_eq!(limits["max_concurrent"], 8, "replica {r}: {acme}");
            assert!(
                limits["tokens"].is_null() && limits["input_tokens"].is_null(),
                "unset limits are null, replica {r}: {acme}"
            );
            let used = &acme["used"];
            assert!(
                used["input_tokens"].as_u64().is_some_and(|n| n > 0)
                    && used["tokens"].as_u64().is_some_and(|n| n >= want_output),
                "input and total tokens are counted too, replica {r}: {acme}"
            );
            let bob = tenant(v, "bob").unwrap_or_default();
            for l in [
                "requests",
                "tokens",
                "input_tokens",
                "output_tokens",
                "max_concurrent",
            ] {
                assert!(
                    bob["limits"].get(l).is_some_and(Value::is_null),
                    "bob has no limits (null {l}), replica {r}: {bob}"
                );
            }
        }
        let zero = &views.iter().find(|(r, _)| *r == 0).unwrap().1;
        let tight = tenant(zero, "tight").unwrap_or_default();
        assert_eq!(
            tight["rejected"]["tenant_rate_limited"], 1,
            "replica 0 refused tight once: {tight}"
        );
        assert_eq!(tight["limits"]["requests"], allowance(2, 60), "{tight}");
    })
    .await;
}
