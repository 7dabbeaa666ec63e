//! Streams that survive their engine's death, with a real `shoal` process
//! over real `mock-engine` processes killed with SIGKILL mid-stream.
//!
//! The engines number their output tokens (`--numbered-output`: token k
//! is `w{k} `) and continue an open assistant turn (or a completions
//! prompt) from the words it holds, so a stream's text shows any token
//! lost, repeated or reordered at the splice. This file proves that:
//!
//! - with `--migration-limit 2`, 50 streams (chat and completions,
//!   alternating) whose serving engine is killed at a random point each
//!   end well-formed: one `id`, one role delta, one `[DONE]`, text
//!   `w0 … w{max_tokens-1}` exactly, the usage chunk's completion tokens
//!   equal to `max_tokens`; and `shoal_migrations_total` counts 50
//!   resumed;
//! - without it (the default), the same 50 kills cut each client's body;
//! - a request a text continuation cannot serve (`n = 2`) is cut, not
//!   continued, and counted as ineligible;
//! - a completions stream that names its token ids (`return_token_ids`)
//!   is continued from them, exactly: its prompt is token ids, which no
//!   text continuation could extend, and its client sees the prompt's ids
//!   once and the output's ids `w0 … w39` in order.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, free_ports, locate_shoal};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// Streams per run, as the goal states.
const STREAMS: usize = 50;
/// Output tokens each stream asks for.
const MAX_TOKENS: u64 = 40;

/// One fleet at a time: the runs kill engines and time nothing, but two
/// side by side on a 2-core box would slow both.
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// A `mock-engine` process on a fixed port, restartable after a kill.
struct Engine {
    port: u16,
    child: Option<Child>,
}

impl Engine {
    /// Starts (or restarts) the engine on its port and waits until it
    /// listens.
    async fn start(port: u16) -> Self {
        let mut engine = Self { port, child: None };
        engine.spawn().await;
        engine
    }

    async fn spawn(&mut self) {
        let port = self.port.to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mock-engine"))
                .args([
                    "--base-port",
                    port.as_str(),
                    "--flavor",
                    "vllm",
                    "--numbered-output",
                    "--tokens-per-chunk",
                    "1",
                    "--decode-base-ms",
                    "3",
                    "--decode-per-req-ms",
                    "0",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
            if let Ok(Ok(Some(line))) = line
                && line.starts_with("mock-engine listening on ")
            {
                // Keep reading stdout so the engine never blocks on it.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                self.child = Some(child);
                return;
            }
            // The port may still be held by the killed process: retry.
            let _ = child.kill().await;
            assert!(
                Instant::now() < deadline,
                "mock-engine did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, waited for.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }
}

/// Three engines and one `shoal` over them with `args`.
async fn rig(args: &[&str]) -> (Vec<Engine>, Fleet) {
    let (ports, _) = free_ports(3, 0).unwrap();
    let mut engines = Vec::new();
    for port in ports {
        engines.push(Engine::start(port).await);
    }
    let urls = engines.iter().map(Engine::url).collect();
    let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
    let cfg = FleetConfig::new(bin, 1, urls)
        .mesh(false)
        .args([
            "--worker-load-source",
            "none",
            "--expose-worker-header",
            "--policy",
            "least_load",
        ])
        .args(args.iter().copied());
    let fleet = Fleet::start(cfg).await.unwrap_or_else(|e| panic!("{e}"));
    (engines, fleet)
}

/// What a client read of one stream.
struct Read {
    /// Every event's data, in order.
    events: Vec<String>,
    /// The body ended with an error (cut), not cleanly.
    cut: bool,
}

/// The request for stream `i`: chat on even `i`, completions on odd.
fn request(i: usize) -> (String, Value) {
    let common = json!({"model": "mock/Qwen3-8B", "stream": true, "max_tokens": MAX_TOKENS,
        "stream_options": {"include_usage": true}});
    let mut body = common.clone();
    if i.is_multiple_of(2) {
        body["messages"] = json!([{"role": "user", "content": format!("story number {i}")}]);
        ("/v1/chat/completions".into(), body)
    } else {
        body["prompt"] = json!(format!("Once upon a time, story {i}:\n"));
        ("/v1/completions".into(), body)
    }
}

/// Opens stream `i` through `base`, kills its engine after `kill_after`
/// text events, reads the rest, and restarts the engine.
async fn killed_stream(
    client: &HttpClient,
    base: &str,
    engines: &mut [Engine],
    i: usize,
    body: Value,
    path: &str,
    kill_after: usize,
) -> Read {
    let url = format!("{base}{path}");
    let mut s = client.post_stream(&url, &body, &[]).await.unwrap();
    assert_eq!(s.status, 200, "stream {i}");
    let worker = s.headers["x-shoal-worker"].to_str().unwrap().to_string();
    let mut events = Vec::new();
    let mut texts = 0;
    let mut cut = false;
    let mut killed = None;
    loop {
        if killed.is_none() && texts >= kill_after {
            let k = engines.iter().position(|e| e.url() == worker).unwrap();
            engines[k].kill().await;
            killed = Some(k);
        }
        match s.next_data().await {
            Ok(Some(data)) => {
                if !text_of(&data).is_empty() {
                    texts += 1;
                }
                events.push(data);
            }
            Ok(None) => break,
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    let k = killed.unwrap_or_else(|| panic!("stream {i} ended before the kill: {events:?}"));
    engines[k].spawn().await;
    Read { events, cut }
}

/// A chunk's text: chat's delta content or completions' text.
fn text_of(data: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return String::new();
    };
    let choice = &v["choices"][0];
    choice["delta"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Why `read` is not one well-formed stream of `w0 … w{MAX_TOKENS-1}`.
fn malformed(read: &Read, chat: bool) -> Option<String> {
    if read.cut {
        return Some("the body was cut".into());
    }
    let done = read.events.iter().filter(|e| *e == "[DONE]").count();
    if done != 1 || read.events.last().map(String::as_str) != Some("[DONE]") {
        return Some(format!(
            "{done} [DONE] events, last {:?}",
            read.events.last()
        ));
    }
    let chunks: Vec<Value> = read.events[..read.events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).map_err(|_| e.clone()))
        .collect::<Result<_, _>>()
        .ok()?;
    let id = &chunks[0]["id"];
    if chunks.iter().any(|c| &c["id"] != id) {
        return Some("more than one id".into());
    }
    let roles = chunks
        .iter()
        .filter(|c| !c["choices"][0]["delta"]["role"].is_null())
        .count();
    if chat && roles != 1 {
        return Some(format!("{roles} role deltas"));
    }
    let text: String = read.events.iter().map(|e| text_of(e)).collect();
    let expected: String = (0..MAX_TOKENS).map(|k| format!("w{k} ")).collect();
    if text != expected {
        return Some(format!("text {text:?}"));
    }
    let usage = chunks
        .iter()
        .filter_map(|c| c["usage"]["completion_tokens"].as_u64());
    let usage: Vec<u64> = usage.collect();
    if usage != [MAX_TOKENS] {
        return Some(format!("usage completion tokens {usage:?}"));
    }
    None
}

/// A counter's value in a Prometheus scrape (0 when absent).
fn counter(scrape: &str, name: &str, label: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `shoal_migrations_total{outcome}` in replica 0's scrape.
async fn migrations(client: &HttpClient, fleet: &Fleet, outcome: &str) -> f64 {
    let scrape = client
        .get(&format!("{}/metrics", fleet.url(0)))
        .await
        .unwrap();
    let scrape = String::from_utf8_lossy(&scrape.body).into_owned();
    counter(
        &scrape,
        "shoal_migrations_total",
        &format!("outcome=\"{outcome}\""),
    )
}

/// Runs `body` alone, failed after `bound`.
async fn alone<F: std::future::Future>(bound: Duration, body: F) -> F::Output {
    let _alone = ONE_AT_A_TIME.acquire().await;
    tokio::time::timeout(bound, body)
        .await
        .unwrap_or_else(|_| panic!("the test exceeded its bound of {bound:?}"))
}

/// Runs the [`STREAMS`] streams through `fleet`, each killed at a random
/// point (the same points for every run): each stream's number, where it
/// was killed and what its client read.
async fn kill_every_stream(
    engines: &mut [Engine],
    fleet: &Fleet,
    client: &HttpClient,
) -> Vec<(usize, usize, Read)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5ea1);
    let mut reads = Vec::new();
    for i in 0..STREAMS {
        let (path, body) = request(i);
        let kill_after = rng.random_range(1..MAX_TOKENS as usize - 4);
        let read = killed_stream(client, &fleet.url(0), engines, i, body, &path, kill_after).await;
        reads.push((i, kill_after, read));
    }
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_migration_50_killed_streams_end_whole_and_exact() {
    alone(Duration::from_secs(240), async {
        let (mut engines, fleet) = rig(&["--migration-limit", "2"]).await;
        let client = HttpClient::new();
        let bad: Vec<String> = kill_every_stream(&mut engines, &fleet, &client)
            .await
            .into_iter()
            .filter_map(|(i, kill_after, read)| {
                let why = malformed(&read, i.is_multiple_of(2))?;
                Some(format!("stream {i} (killed after {kill_after}): {why}"))
            })
            .collect();
        assert!(
            bad.is_empty(),
            "{} of {STREAMS} malformed:\n{}\n{}",
            bad.len(),
            bad.join("\n"),
            fleet.log_tail(0, 30)
        );
        assert_eq!(migrations(&client, &fleet, "resumed").await, STREAMS as f64);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migration_the_50_killed_streams_are_cut() {
    alone(Duration::from_secs(240), async {
        let (mut engines, fleet) = rig(&[]).await;
        let client = HttpClient::new();
        let whole: Vec<usize> = kill_every_stream(&mut engines, &fleet, &client)
            .await
            .into_iter()
            .filter(|(_, _, read)| !read.cut || read.events.iter().any(|e| e == "[DONE]"))
            .map(|(i, _, _)| i)
            .collect();
        assert!(whole.is_empty(), "streams not cut: {whole:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_continuation_cannot_serve_is_cut_and_counted() {
    alone(Duration::from_secs(120), async {
        let (mut engines, fleet) = rig(&["--migration-limit", "2"]).await;
        let client = HttpClient::new();
        let (path, mut body) = request(0);
        body["n"] = json!(2);
        let read = killed_stream(&client, &fleet.url(0), &mut engines, 0, body, &path, 3).await;
        assert!(read.cut, "{:?}", read.events);
        assert_eq!(migrations(&client, &fleet, "ineligible").await, 1.0);
        assert_eq!(migrations(&client, &fleet, "resumed").await, 0.0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streams_that_name_their_token_ids_are_continued_from_them() {
    alone(Duration::from_secs(120), async {
        let (mut engines, fleet) = rig(&["--migration-limit", "2"]).await;
        let client = HttpClient::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x1d5);
        let mut bad = Vec::new();
        for i in 0..10 {
            // A prompt of token ids has no text to append to: only the
            // ids the stream names can continue it.
            let body = json!({"model": "mock/Qwen3-8B", "stream": true, "max_tokens": MAX_TOKENS,
                "stream_options": {"include_usage": true}, "prompt": [1, 2, 3],
                "return_token_ids": true});
            let kill_after = rng.random_range(1..MAX_TOKENS as usize - 4);
            let read = killed_stream(
                &client,
                &fleet.url(0),
                &mut engines,
                i,
                body,
                "/v1/completions",
                kill_after,
            )
            .await;
            if let Some(why) = malformed(&read, false) {
                bad.push(format!("stream {i} (killed after {kill_after}): {why}"));
                continue;
            }
            let chunks: Vec<Value> = read
                .events
                .iter()
                .filter_map(|e| serde_json::from_str(e).ok())
                .collect();
            let prompts: Vec<&Value> = chunks
                .iter()
                .map(|c| &c["choices"][0]["prompt_token_ids"])
                .filter(|p| !p.is_null())
                .collect();
            let ids: Vec<u64> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["token_ids"].as_array())
                .flatten()
                .filter_map(Value::as_u64)
                .collect();
            let expected: Vec<u64> = (0..MAX_TOKENS).map(|k| 1_000_000 + k).collect();
            if prompts != [&json!([1, 2, 3])] || ids != expected {
                bad.push(format!(
                    "stream {i}: prompt ids {prompts:?}, output ids {ids:?}"
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "{}\n{}",
            bad.join("\n"),
            fleet.log_tail(0, 30)
        );
        assert_eq!(migrations(&client, &fleet, "resumed").await, 10.0);
    })
    .await;
}
