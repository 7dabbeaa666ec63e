//! Overload: more concurrent streams than the engines can hold, through a
//! real `shoal` replica with the admission limit configured. The router
//! answers the excess at once with 429 (queue full) or, after
//! `--queue-timeout-secs`, 503 — both OpenAI-shaped with `Retry-After` —
//! instead of letting clients time out; admitted streams finish whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde_json::Value;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};
use shoal_tests::mock::{EngineConfig, Flavor, TOKEN_TEXT, spawn_engines};
use shoal_tests::workload::{HeldStream, chat, text};
use tokio::task::JoinSet;

/// Engines hold this many running requests each.
const ENGINE_SLOTS: usize = 2;
const ENGINES: usize = 2;
/// Admission: exactly what the engines hold, a queue of 2, 1 s wait.
const LIMIT: usize = ENGINE_SLOTS * ENGINES;
const QUEUE: usize = 2;
/// Streams offered at once: four times what fits.
const OFFERED: usize = 4 * LIMIT;
/// Output tokens per stream: ~200 × 12 ms ≈ 2.4 s, longer than the queue wait.
const MAX_TOKENS: u64 = 200;

#[derive(Debug)]
enum Outcome {
    /// Admitted; the stream finished with this many tokens.
    Streamed(u64),
    /// Refused: status, Retry-After, error code, seconds until the answer.
    Refused(u16, Option<String>, String, f64),
}

async fn offer(client: HttpClient, base: String, k: u64) -> Result<Outcome, String> {
    let started = Instant::now();
    let url = format!("{base}/v1/chat/completions");
    let body = Bytes::from(chat(&text(k, 200), MAX_TOKENS, true).to_string());
    let resp = client
        .send(Method::POST, &url, &[], Some(body))
        .await
        .map_err(|e| format!("request {k}: {e}"))?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("request {k}: body broke: {e}"))?
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    if status == 200 {
        let mut tokens = 0;
        let mut done = false;
        for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                done = true;
            } else if let Some(piece) = serde_json::from_str::<Value>(data)
                .ok()
                .and_then(|v| v.pointer("/choices/0/delta/content").cloned())
                .and_then(|c| c.as_str().map(str::to_string))
            {
                tokens += piece.matches(TOKEN_TEXT).count() as u64;
            }
        }
        return if done {
            Ok(Outcome::Streamed(tokens))
        } else {
            Err(format!(
                "request {k}: stream without [DONE] after {tokens} tokens"
            ))
        };
    }
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/code")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("unparsed: {body}"));
    Ok(Outcome::Refused(
        status,
        retry_after,
        code,
        started.elapsed().as_secs_f64(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_streams_get_429_or_503_with_retry_after_not_timeouts() {
    let bound = Duration::from_secs(40);
    tokio::time::timeout(bound, async {
        let cfg = EngineConfig {
            flavor: Flavor::Sglang,
            max_running: ENGINE_SLOTS,
            ..EngineConfig::default()
        };
        let engines = spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, ENGINES)
            .await
            .unwrap();
        let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
        let limit = LIMIT.to_string();
        let queue = QUEUE.to_string();
        let fleet_cfg = FleetConfig::new(bin, 1, engines.iter().map(|e| e.url()).collect())
            .mesh(false)
            .args([
                "--policy",
                "least_load",
                "--worker-load-source",
                "none",
                "--max-concurrent-requests",
                &limit,
                "--queue-size",
                &queue,
                "--queue-timeout-secs",
                "1",
            ]);
        let fleet = Fleet::start(fleet_cfg)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let client = HttpClient::new();
        let started = Instant::now();
        let mut offered = JoinSet::new();
        for k in 0..OFFERED as u64 {
            offered.spawn(offer(client.clone(), fleet.url(0), 100 + k));
        }
        let mut outcomes = Vec::new();
        while let Some(done) = offered.join_next().await {
            outcomes.push(
                done.unwrap()
                    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.log_tail(0, 20))),
            );
        }
        let took = started.elapsed();
        let streamed: Vec<u64> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Streamed(n) => Some(*n),
                Outcome::Refused(..) => None,
            })
            .collect();
        let refused: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Refused(s, r, c, t) => Some((*s, r.clone(), c.clone(), *t)),
                Outcome::Streamed(_) => None,
            })
            .collect();
        let n429 = refused.iter().filter(|r| r.0 == 429).count();
        let n503 = refused.iter().filter(|r| r.0 == 503).count();
        println!(
            "{OFFERED} streams offered, limit {LIMIT}, queue {QUEUE}: {} streamed, \
             {n429} × 429, {n503} × 503, all answered in {took:?}",
            streamed.len()
        );
        assert_eq!(streamed.len() + refused.len(), OFFERED);
        assert!(
            streamed.len() >= LIMIT,
            "at least the limit is served: {outcomes:?}"
        );
        assert!(
            streamed.iter().all(|&n| n == MAX_TOKENS),
            "admitted streams finish whole: {streamed:?}"
        );
        assert!(n429 >= OFFERED - LIMIT - QUEUE - 2, "{outcomes:?}");
        assert!(n503 >= 1, "queued requests time out with 503: {outcomes:?}");
        for (status, retry_after, code, secs) in &refused {
            assert_eq!(retry_after.as_deref(), Some("1"), "{status} {code}");
            match status {
                429 => {
                    assert_eq!(code, "router_overloaded");
                    assert!(*secs < 1.0, "429 is immediate, took {secs} s");
                }
                503 => {
                    assert_eq!(code, "queue_timeout");
                    assert!(*secs < 2.5, "503 after the 1 s queue wait, took {secs} s");
                }
                other => panic!("unexpected status {other} ({code})"),
            }
        }
        let metrics = client
            .get(&format!("{}/metrics", fleet.url(0)))
            .await
            .unwrap()
            .text();
        assert!(
            metrics.contains("# HELP shoal_admission_rejected_total"),
            "{metrics}"
        );
        let counted: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("shoal_admission_rejected_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert_eq!(counted as usize, refused.len(), "{metrics}");
        // Once the load is gone, the replica serves again.
        let again = HeldStream::open(&client, &fleet.url(0), &text(9, 50), 5)
            .await
            .unwrap();
        assert_eq!(again.finish().await.unwrap(), 5);
        for e in engines {
            e.shutdown().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the overload test exceeded {bound:?}"));
}

/// The fleet-aware guard: with `--worker-max-inflight 1` over one engine,
/// a stream held through replica a fills the worker fleet-wide, so a
/// request to replica c (which books nothing itself) is shed with 503
/// `fleet_saturated` + Retry-After; once the stream ends, c serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_full_across_the_fleet_is_shed_by_every_replica() {
    let bound = Duration::from_secs(40);
    tokio::time::timeout(bound, async {
        let cfg = EngineConfig {
            flavor: Flavor::Sglang,
            ..EngineConfig::default()
        };
        let engines = spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, 1)
            .await
            .unwrap();
        let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
        let fleet_cfg = FleetConfig::new(bin, 3, vec![engines[0].url()]).args([
            "--worker-load-source",
            "none",
            "--worker-max-inflight",
            "1",
        ]);
        let fleet = Fleet::start(fleet_cfg)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        fleet
            .wait_meshed(Duration::from_secs(15))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let client = HttpClient::new();
        let held = HeldStream::open(&client, &fleet.url(0), &text(1, 100), 2_000)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let shed = loop {
            let r = client
                .post_json(
                    &format!("{}/v1/chat/completions", fleet.url(2)),
                    &chat(&text(2, 100), 4, false),
                )
                .await
                .unwrap();
            if r.status == 503 || Instant::now() >= deadline {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(shed.status, 503, "{}", shed.text());
        assert_eq!(shed.header("retry-after"), Some("1"));
        assert_eq!(shed.json().unwrap()["error"]["code"], "fleet_saturated");
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = client
                .post_json(
                    &format!("{}/v1/chat/completions", fleet.url(2)),
                    &chat(&text(3, 100), 4, false),
                )
                .await
                .unwrap();
            if r.status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "c never served again: {}",
                r.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the fleet-saturation test exceeded {bound:?}"));
}
