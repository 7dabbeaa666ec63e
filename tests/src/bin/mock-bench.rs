//! `mock-bench`: how many concurrent streams and tokens/s mock engines sustain
//! and at what CPU share. Starts `--engines` engines (in this process, or in a
//! child `mock-engine` process with `--external`), drives `--concurrency`
//! streaming chat requests for `--duration-secs` (at most 60), and prints
//! throughput, TTFT (client-side and engine-side from `/stats`) and CPU time
//! from `/proc/<pid>/stat` (utime + stime, USER_HZ = 100) over wall time.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use shoal_tests::client::HttpClient;
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use tokio::io::AsyncBufReadExt;

/// Bounded load benchmark of the mock engine.
#[derive(Debug, Parser)]
#[command(name = "mock-bench")]
struct Cli {
    /// Engines to start.
    #[arg(long, default_value_t = 8)]
    engines: usize,
    /// Concurrent streaming clients (spread round-robin over engines).
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Measurement time in seconds (1..=60).
    #[arg(long, default_value_t = 15)]
    duration_secs: u64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 256)]
    max_tokens: u64,
    /// Prompt length in characters (tokens = chars / 4).
    #[arg(long, default_value_t = 2000)]
    prompt_chars: usize,
    /// Tokens per SSE event at most.
    #[arg(long, default_value_t = 4)]
    tokens_per_chunk: u32,
    /// Engine time scale.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Run the engines in a child `mock-engine` process (beside this binary)
    /// and report its CPU share separately from the load generator's.
    #[arg(long)]
    external: bool,
}

#[derive(Default)]
struct Tally {
    tokens: AtomicU64,
    events: AtomicU64,
    completed: AtomicU64,
    errors: AtomicU64,
    active: AtomicI64,
    ttft_us: std::sync::Mutex<Vec<u64>>,
}

/// CPU seconds (user + system) of process `pid` ("self" for this one).
fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn one_request(
    client: &HttpClient,
    url: &str,
    body: &Value,
    tally: &Tally,
) -> Result<(), String> {
    let t0 = Instant::now();
    let mut sse = client
        .post_stream(url, body, &[])
        .await
        .map_err(|e| e.to_string())?;
    if sse.status != 200 {
        return Err(format!("status {}", sse.status));
    }
    let mut first = true;
    while let Some(data) = sse.next_data().await.map_err(|e| e.to_string())? {
        if data == "[DONE]" {
            tally.completed.fetch_add(1, Ordering::Relaxed);
            break;
        }
        let chunk: Value = serde_json::from_str(&data).map_err(|e| e.to_string())?;
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            if first {
                first = false;
                let us = t0.elapsed().as_micros() as u64;
                tally
                    .ttft_us
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(us);
            }
            tally
                .tokens
                .fetch_add(c.len() as u64 / 4, Ordering::Relaxed);
            tally.events.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

async fn worker(client: HttpClient, url: String, cli: Arc<Cli>, id: usize, tally: Arc<Tally>) {
    let mut n = 0u64;
    loop {
        // Distinct prompts per request (no prefix-cache hits beyond chance).
        let prompt: String = format!("{id}-{n}-")
            .repeat(cli.prompt_chars / 6 + 1)
            .chars()
            .take(cli.prompt_chars)
            .collect();
        let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": cli.max_tokens, "stream": true});
        tally.active.fetch_add(1, Ordering::Relaxed);
        let r = one_request(&client, &url, &body, &tally).await;
        tally.active.fetch_sub(1, Ordering::Relaxed);
        if r.is_err() {
            tally.errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n += 1;
    }
}

async fn start_external(
    cli: &Cli,
    cfg: &EngineConfig,
) -> Result<(tokio::process::Child, Vec<String>), String> {
    let exe = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("mock-engine");
    let mut child = tokio::process::Command::new(&exe)
        .args([
            "--engines",
            &cli.engines.to_string(),
            "--base-port",
            "0",
            "--flavor",
            cfg.flavor.as_str(),
        ])
        .args([
            "--tokens-per-chunk",
            &cli.tokens_per_chunk.to_string(),
            "--time-scale",
            &cli.time_scale.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut urls = Vec::new();
    while urls.len() < cli.engines {
        let line = lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("mock-engine exited")?;
        if let Some(rest) = line.strip_prefix("mock-engine listening on ") {
            urls.push(
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
    }
    Ok((child, urls))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Arc::new(Cli::parse());
    if !(1..=60).contains(&cli.duration_secs) || cli.engines == 0 || cli.concurrency == 0 {
        eprintln!("mock-bench: --duration-secs must be 1..=60, --engines and --concurrency >= 1");
        return ExitCode::from(2);
    }
    let cfg = EngineConfig {
        flavor: Flavor::Vllm,
        tokens_per_chunk: cli.tokens_per_chunk,
        time_scale: cli.time_scale,
        ..EngineConfig::default()
    };
    if let Err(e) = cfg.validate() {
        eprintln!("mock-bench: {e}");
        return ExitCode::from(2);
    }
    let mut _child = None;
    let mut _handles: Vec<EngineHandle> = Vec::new();
    let urls: Vec<String> = if cli.external {
        match start_external(&cli, &cfg).await {
            Ok((c, urls)) => {
                _child = Some(c);
                urls
            }
            Err(e) => {
                eprintln!("mock-bench: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        let host = std::net::IpAddr::from([127, 0, 0, 1]);
        match spawn_engines(&cfg, host, 0, cli.engines).await {
            Ok(h) => {
                _handles = h;
                _handles.iter().map(EngineHandle::url).collect()
            }
            Err(e) => {
                eprintln!("mock-bench: {e}");
                return ExitCode::from(1);
            }
        }
    };
    let child_pid = _child.as_ref().and_then(|c| c.id()).map(|p| p.to_string());
    let client = HttpClient::new();
    let tally = Arc::new(Tally::default());
    let (self0, child0) = (cpu_secs("self"), child_pid.as_deref().and_then(cpu_secs));
    let t0 = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..cli.concurrency {
        let url = format!("{}/v1/chat/completions", urls[i % urls.len()]);
        workers.spawn(worker(client.clone(), url, cli.clone(), i, tally.clone()));
    }
    let deadline = t0 + Duration::from_secs(cli.duration_secs);
    let (mut active_sum, mut samples) = (0i64, 0i64);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        active_sum += tally.active.load(Ordering::Relaxed);
        samples += 1;
    }
    let wall = t0.elapsed().as_secs_f64();
    let self_cpu = cpu_secs("self").zip(self0).map(|(a, b)| a - b);
    let child_cpu = child_pid
        .as_deref()
        .and_then(cpu_secs)
        .zip(child0)
        .map(|(a, b)| a - b);
    workers.abort_all();
    let mut queue = Vec::new();
    let mut ttft = Vec::new();
    for u in &urls {
        if let Ok(v) = client
            .get(&format!("{u}/stats"))
            .await
            .and_then(|r| r.json())
        {
            for r in v["recent"].as_array().into_iter().flatten() {
                queue.extend(r["queue_ms"].as_f64());
                ttft.extend(r["ttft_ms"].as_f64());
            }
        }
    }
    let mut client_ttft: Vec<f64> = tally
        .ttft_us
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|&u| u as f64 / 1000.0)
        .collect();
    let tokens = tally.tokens.load(Ordering::Relaxed) as f64;
    let mode = if cli.external {
        "external mock-engine process"
    } else {
        "in-process"
    };
    println!(
        "mock-bench: {} engines ({mode}), {} clients, {wall:.1} s, max_tokens={}, prompt={} tokens, tokens_per_chunk={}, time_scale={}",
        cli.engines,
        cli.concurrency,
        cli.max_tokens,
        cli.prompt_chars / 4,
        cli.tokens_per_chunk,
        cli.time_scale
    );
    println!(
        "  concurrent streams (mean in flight): {:.1}",
        active_sum as f64 / samples.max(1) as f64
    );
    println!(
        "  completed streams: {}  errors: {}",
        tally.completed.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed)
    );
    println!(
        "  tokens/s delivered: {:.0}  SSE events/s: {:.0}",
        tokens / wall,
        tally.events.load(Ordering::Relaxed) as f64 / wall
    );
    println!(
        "  client TTFT ms p50/p99: {:.1}/{:.1}",
        pct(&mut client_ttft, 0.5),
        pct(&mut client_ttft, 0.99)
    );
    println!(
        "  engine queue ms p50/p99: {:.1}/{:.1}  engine TTFT ms p50/p99: {:.1}/{:.1}",
        pct(&mut queue, 0.5),
        pct(&mut queue, 0.99),
        pct(&mut ttft, 0.5),
        pct(&mut ttft, 0.99)
    );
    if let Some(c) = self_cpu {
        let who = if cli.external {
            "load generator"
        } else {
            "engines + load generator"
        };
        println!(
            "  CPU ({who}, this process): {c:.2} s over {wall:.1} s = {:.1}% of one core",
            100.0 * c / wall
        );
    }
    if let Some(c) = child_cpu {
        println!(
            "  CPU (mock-engine process): {c:.2} s over {wall:.1} s = {:.1}% of one core",
            100.0 * c / wall
        );
    }
    ExitCode::SUCCESS
}
