//! Disaggregated prefill/decode fleets end to end: three meshed `shoal`
//! replicas over two prefill and two decode mock engines that speak the
//! engines' handoff protocols (`mock::disagg`). This file proves that:
//!
//! - SGLang bootstrap mode: every request, streamed or not, chat,
//!   completions or `/generate`, sent through any replica, is prefilled on
//!   a prefill engine and decoded on a decode engine that received its KV
//!   under the room Shoal drew (no decode waits in vain); the prefill
//!   pool's bootstrap ports come from `GET /server_info`;
//! - a prefill pool that refuses every request is a 503 or 502 naming the
//!   prefill pool, not a decode worker waiting out its timeout;
//! - vLLM `kv_transfer_params` mode: the same, the decode engine fetching
//!   the blocks the prefill answer named; a prompt under
//!   `--pd-min-prompt-tokens` skips the prefill pool;
//! - a `precise_prefix` prefill policy sends a prompt to the prefill
//!   engine whose KV events (real ZMQ sockets) say it holds the prompt's
//!   prefix, through every replica.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};
use shoal_tests::mock::{
    DEFAULT_MODEL, EngineConfig, EngineHandle, Flavor, PdCounters, PdRole, spawn_engines,
};

/// One fleet at a time (2 cores).
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Two prefill and two decode engines of `flavor`, and three meshed
/// replicas over them with `args`.
struct Rig {
    prefill: Vec<EngineHandle>,
    decode: Vec<EngineHandle>,
    fleet: Fleet,
    client: HttpClient,
}

async fn engines(flavor: Flavor, role: PdRole) -> Vec<EngineHandle> {
    let cfg = EngineConfig {
        flavor,
        pd_role: role,
        time_scale: 20.0,
        pd_handoff_timeout_ms: 3_000,
        ..EngineConfig::default()
    };
    spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, 2)
        .await
        .unwrap()
}

impl Rig {
    async fn start(flavor: Flavor, args: &[&str]) -> Self {
        let prefill = engines(flavor, PdRole::Prefill).await;
        let decode = engines(flavor, PdRole::Decode).await;
        Self::over(prefill, decode, args).await
    }

    /// Three meshed replicas over `prefill` and `decode` with `args`.
    async fn over(prefill: Vec<EngineHandle>, decode: Vec<EngineHandle>, args: &[&str]) -> Self {
        let join = |e: &[EngineHandle]| {
            e.iter()
                .map(EngineHandle::url)
                .collect::<Vec<_>>()
                .join(",")
        };
        let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
        let cfg = FleetConfig::new(bin, 3, Vec::new())
            .args(["--worker-load-source", "none", "--policy", "least_load"])
            .args([
                "--prefill-urls".to_string(),
                join(&prefill),
                "--decode-urls".to_string(),
                join(&decode),
            ])
            .args(args.iter().copied());
        let fleet = Fleet::start(cfg).await.unwrap_or_else(|e| panic!("{e}"));
        fleet.wait_meshed(Duration::from_secs(20)).await.unwrap();
        Self {
            prefill,
            decode,
            fleet,
            client: HttpClient::new(),
        }
    }

    /// Each engine's handoff counters.
    async fn counters(&self, engines: &[EngineHandle]) -> Vec<PdCounters> {
        let mut out = Vec::new();
        for e in engines {
            let r = self
                .client
                .get(&format!("{}/mock/pd", e.url()))
                .await
                .unwrap();
            out.push(serde_json::from_slice(&r.body).unwrap());
        }
        out
    }

    /// The sum of `field` over `engines`' counters.
    async fn total(&self, engines: &[EngineHandle], field: fn(&PdCounters) -> u64) -> u64 {
        self.counters(engines).await.iter().map(field).sum()
    }

    fn logs(&self) -> String {
        (0..self.fleet.len())
            .map(|i| self.fleet.log_tail(i, 15))
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

/// The requests each replica is sent: (path, body).
fn requests(generate: bool) -> Vec<(&'static str, Value)> {
    let prompt = "a long prompt worth disaggregating ".repeat(20);
    let mut r = vec![
        (
            "/v1/chat/completions",
            json!({"model": DEFAULT_MODEL, "max_tokens": 8, "stream": true,
            "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": DEFAULT_MODEL, "max_tokens": 8,
            "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/completions",
            json!({"model": DEFAULT_MODEL, "max_tokens": 8, "prompt": prompt}),
        ),
    ];
    if generate {
        r.push((
            "/generate",
            json!({"text": prompt, "sampling_params": {"max_new_tokens": 8}}),
        ));
    }
    r
}

/// Sends every request through every replica: each must succeed (a
/// stream must end with `[DONE]`); returns how many were sent.
async fn send_all(rig: &Rig, generate: bool) -> u64 {
    let mut sent = 0;
    for i in 0..rig.fleet.len() {
        for (path, body) in requests(generate) {
            let url = format!("{}{path}", rig.fleet.url(i));
            if body["stream"] == true {
                let mut s = rig.client.post_stream(&url, &body, &[]).await.unwrap();
                assert_eq!(s.status, 200, "{path} via {i}\n{}", rig.logs());
                let mut last = None;
                while let Some(data) = s.next_data().await.unwrap() {
                    last = Some(data);
                }
                assert_eq!(last.as_deref(), Some("[DONE]"), "{path} via {i}");
            } else {
                let r = rig.client.post_json(&url, &body).await.unwrap();
                assert_eq!(
                    r.status,
                    200,
                    "{path} via {i}: {}\n{}",
                    r.text(),
                    rig.logs()
                );
            }
            sent += 1;
        }
    }
    sent
}

async fn alone<F: std::future::Future>(body: F) -> F::Output {
    let _alone = ONE_AT_A_TIME.acquire().await;
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(120), body)
        .await
        .unwrap_or_else(|_| panic!("the test exceeded its bound"));
    println!("test body took {:?}", started.elapsed());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_bootstrap_mode_prefills_and_decodes_every_request_through_every_replica() {
    alone(async {
        let rig = Rig::start(Flavor::Sglang, &["--pd-protocol", "sglang"]).await;
        let sent = send_all(&rig, true).await;
        let prefill = rig.counters(&rig.prefill).await;
        let decode = rig.counters(&rig.decode).await;
        assert_eq!(
            prefill.iter().map(|c| c.stored).sum::<u64>(),
            sent,
            "{prefill:?}"
        );
        assert_eq!(
            prefill.iter().map(|c| c.served).sum::<u64>(),
            sent,
            "{prefill:?}"
        );
        assert_eq!(
            decode.iter().map(|c| c.received).sum::<u64>(),
            sent,
            "{decode:?}"
        );
        assert_eq!(
            decode.iter().map(|c| c.missing + c.local).sum::<u64>(),
            0,
            "{decode:?}"
        );
        // Both pools are used (least_load spreads each pool on its own).
        assert!(prefill.iter().all(|c| c.stored > 0), "{prefill:?}");
        assert!(decode.iter().all(|c| c.received > 0), "{decode:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_pool_that_refuses_everything_is_an_error_naming_it() {
    alone(async {
        let rig = Rig::start(
            Flavor::Sglang,
            &["--pd-protocol", "sglang", "--retry-max-retries", "1"],
        )
        .await;
        for e in &rig.prefill {
            let url = format!("{}/mock/fault", e.url());
            let r = rig
                .client
                .post_json(&url, &json!({"mode": "fail"}))
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
        let (path, body) = &requests(false)[1];
        let started = Instant::now();
        let r = rig
            .client
            .post_json(&format!("{}{path}", rig.fleet.url(1)), body)
            .await
            .unwrap();
        assert!(
            r.status == 502 || r.status == 503,
            "{} {}",
            r.status,
            r.text()
        );
        assert!(r.text().contains("prefill"), "{}", r.text());
        // Well before the decode engines' 3 s handoff timeout.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(rig.total(&rig.decode, |c| c.received).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_transfer_params_mode_prefills_then_decodes_and_short_prompts_skip_prefill() {
    alone(async {
        let rig = Rig::start(
            Flavor::Vllm,
            &["--pd-protocol", "vllm", "--pd-min-prompt-tokens", "64"],
        )
        .await;
        let sent = send_all(&rig, false).await;
        assert_eq!(rig.total(&rig.prefill, |c| c.stored).await, sent);
        assert_eq!(rig.total(&rig.prefill, |c| c.served).await, sent);
        assert_eq!(rig.total(&rig.decode, |c| c.received).await, sent);
        assert_eq!(
            rig.total(&rig.decode, |c| c.recomputed + c.missing).await,
            0
        );
        // A short prompt goes to a decode engine alone.
        let short = json!({"model": DEFAULT_MODEL, "max_tokens": 4, "prompt": "hi"});
        let r = rig
            .client
            .post_json(&format!("{}/v1/completions", rig.fleet.url(2)), &short)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(rig.total(&rig.decode, |c| c.local).await, 1);
        assert_eq!(rig.total(&rig.prefill, |c| c.stored).await, sent);
        let scrape = rig
            .client
            .get(&format!("{}/metrics", rig.fleet.url(2)))
            .await
            .unwrap();
        let scrape = scrape.text();
        assert!(
            scrape
                .lines()
                .any(|l| l.starts_with("shoal_disagg_requests_total")
                    && l.contains("path=\"decode_only\"")),
            "{scrape}"
        );
    })
    .await;
}

/// The mock engines' tokenizer (the replicas hash prompts with it too).
fn tokenizer() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/tokenizer/tokenizer.json")
        .display()
        .to_string()
}

/// Families of prompts: each shares a long history.
const FAMILIES: u64 = 6;

fn history(f: u64) -> String {
    shoal_tests::workload::text(2000 + f, 1500)
}

/// The sum over `url`'s scrape of the KV-event batches it applied.
async fn applied_batches(client: &HttpClient, url: &str) -> u64 {
    let scrape = client.get(&format!("{url}/metrics")).await.unwrap().text();
    scrape
        .lines()
        .filter(|l| {
            l.starts_with("shoal_kv_event_batches_total{") && l.contains("result=\"applied\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Each engine's `stored` count (prefills handed over).
async fn stored(rig: &Rig) -> Vec<u64> {
    rig.counters(&rig.prefill)
        .await
        .iter()
        .map(|c| c.stored)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precise_prefix_prefill_policy_sends_a_prompt_to_the_prefill_engine_holding_its_prefix() {
    alone(async {
        let cfg = EngineConfig {
            flavor: Flavor::Sglang,
            pd_role: PdRole::Prefill,
            time_scale: 20.0,
            tokenizer: Some(tokenizer().into()),
            kv_events_port: Some(0),
            kv_events_replay_port: Some(0),
            ..EngineConfig::default()
        };
        let prefill = spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, 2)
            .await
            .unwrap();
        let decode = engines(Flavor::Sglang, PdRole::Decode).await;
        let mut args: Vec<String> = [
            "--pd-protocol",
            "sglang",
            "--prefill-policy",
            "precise_prefix",
            "--kv-tokenizer",
        ]
        .map(String::from)
        .into();
        args.push(tokenizer());
        for e in &prefill {
            let kv = e.kv_events().unwrap();
            let replay = kv.replay_endpoint.clone().unwrap();
            args.push("--kv-events-endpoint".into());
            args.push(format!("{}={}|{replay}", e.url(), kv.endpoint));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let rig = Rig::over(prefill, decode, &args).await;
        // Each family's history is cached on a prefill engine the test
        // chooses (sent to it directly, alternating), so a policy that
        // ignored the events would miss about half of what follows.
        for f in 0..FAMILIES {
            let home = &rig.prefill[(f % 2) as usize];
            let body = json!({"model": DEFAULT_MODEL, "max_tokens": 1, "prompt": history(f),
                "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 90_000 + f});
            let r = rig
                .client
                .post_json(&format!("{}/v1/completions", home.url()), &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        // Every replica has applied the same events, and no more arrive.
        let started = Instant::now();
        let mut last = Vec::new();
        loop {
            let mut now = Vec::new();
            for i in 0..rig.fleet.len() {
                now.push(applied_batches(&rig.client, &rig.fleet.url(i)).await);
            }
            let settled = now == last && now.iter().all(|n| *n >= FAMILIES);
            if settled {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "the replicas never applied the engines' events: {now:?}\n{}",
                rig.logs()
            );
            last = now;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // Later prompts (history + more) through the other replicas land
        // on their history's engine.
        let mut missed = Vec::new();
        for replica in [1, 2] {
            for f in 0..FAMILIES {
                let before = stored(&rig).await;
                let prompt = format!(
                    "{} {}",
                    history(f),
                    shoal_tests::workload::text(7000 + f, 200)
                );
                let body = json!({"model": DEFAULT_MODEL, "max_tokens": 4, "prompt": prompt});
                let url = format!("{}/v1/completions", rig.fleet.url(replica));
                let r = rig.client.post_json(&url, &body).await.unwrap();
                assert_eq!(r.status, 200, "{}\n{}", r.text(), rig.logs());
                // The prefill answer is drained after the client's: wait
                // for its handoff to be counted.
                let started = Instant::now();
                let after = loop {
                    let after = stored(&rig).await;
                    if after.iter().sum::<u64>() > before.iter().sum::<u64>() {
                        break after;
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "no prefill counted"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                let took = (0..2).find(|&i| after[i] > before[i]).unwrap();
                if took != (f % 2) as usize {
                    missed.push((replica, f, took));
                }
            }
        }
        assert!(
            missed.is_empty(),
            "(replica, family, engine) off their home: {missed:?}"
        );
    })
    .await;
}
