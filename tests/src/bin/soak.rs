//! `soak`: N minutes of mixed streaming traffic through three meshed `shoal`
//! replicas over mock engines that fail and recover, then the checks a long
//! run is for: resident memory flat (±10 % from the end of the warm-up to
//! the end), no leaked in-flight bookings (every replica's fleet in-flight
//! returns to 0 in `/mesh/status` once traffic stops), and bounded queues
//! (the request rate and the client's concurrency are capped).
//!
//! ```text
//! cargo build --release -p shoal -p shoal-tests
//! target/release/soak --minutes 30
//! ```
//!
//! Exits 0 when every check passes, 1 otherwise, 2 on bad usage.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::Rng;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};
use shoal_tests::mock::{EngineConfig, EngineHandle, FaultMode, Flavor, spawn_engine};
use shoal_tests::workload::{HeldStream, short_request, text};
use tokio::sync::Semaphore;

/// Long-running traffic with engine faults through a meshed Shoal fleet.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Cli {
    /// Length of the traffic phase, minutes (fractions allowed).
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Warm-up before the first RSS sample, seconds (capped at a fifth of the run).
    #[arg(long, default_value_t = 60)]
    warmup_secs: u64,
    /// Requests started per second (the rate is fixed, not closed-loop).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Requests in flight at most; a tick finding them all busy is skipped.
    #[arg(long, default_value_t = 64)]
    max_in_flight: usize,
    /// Mock engines.
    #[arg(long, default_value_t = 3)]
    engines: usize,
    /// Seconds between engine faults (each lasts a third of this).
    #[arg(long, default_value_t = 30)]
    fault_every_secs: u64,
    /// The shoal binary [default: next to this one, or $SHOAL_BIN].
    #[arg(long)]
    shoal_bin: Option<PathBuf>,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    /// Failures by reason (status or error kind), at most 32 reasons.
    reasons: std::sync::Mutex<BTreeMap<String, u64>>,
}

/// A short, bounded-cardinality reason for a failure message.
fn reason(message: &str) -> String {
    if let Some(pos) = message.find("answered ") {
        let status: String = message[pos + 9..].chars().take(3).collect();
        let code = message
            .split("\"code\":\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("");
        return format!("HTTP {status} {code}");
    }
    message
        .split(':')
        .next_back()
        .unwrap_or(message)
        .trim()
        .chars()
        .take(60)
        .collect()
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn rss_all(fleet: &Fleet) -> Vec<Option<u64>> {
    (0..fleet.len())
        .map(|i| fleet.pid(i).and_then(rss_kib))
        .collect()
}

/// One request: a stream (70 %) read to its end, or a short completion.
async fn one(client: HttpClient, url: String, k: u64, counts: Arc<Counts>) {
    let (stream, max_tokens) = {
        let mut rng = rand::rng();
        (rng.random_bool(0.7), rng.random_range(8..160u64))
    };
    let prompt = text(k, 200 + (k % 7) as usize * 150);
    let result = if stream {
        match HeldStream::open(&client, &url, &prompt, max_tokens).await {
            Ok(held) => held.finish().await.map(|_| ()),
            Err(e) => Err(e),
        }
    } else {
        short_request(&client, &url, &prompt, max_tokens).await
    };
    match result {
        Ok(()) => counts.ok.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            if let Ok(mut reasons) = counts.reasons.lock() {
                let key = reason(&e.to_string());
                if reasons.len() < 32 || reasons.contains_key(&key) {
                    *reasons.entry(key).or_default() += 1;
                }
            }
            counts.failed.fetch_add(1, Ordering::Relaxed)
        }
    };
}

/// Cycles faults over the engines until `until`: each engine in turn fails
/// (503), hangs, serves garbage metrics, or dies and is restarted on the
/// same address; then recovers.
async fn faults(
    mut engines: Vec<Option<EngineHandle>>,
    cfg: EngineConfig,
    every: Duration,
    until: Instant,
    log: Arc<std::sync::Mutex<Vec<String>>>,
) -> Vec<Option<EngineHandle>> {
    let modes = [
        FaultMode::Fail,
        FaultMode::Hang,
        FaultMode::GarbageMetrics,
        FaultMode::Die,
    ];
    let mut round = 0usize;
    let started = Instant::now();
    while Instant::now() + every < until {
        tokio::time::sleep(every * 2 / 3).await;
        let i = round % engines.len();
        let mode = modes[round % modes.len()];
        round += 1;
        let Some(handle) = engines[i].as_mut() else {
            continue;
        };
        let addr: SocketAddr = handle.addr();
        handle.set_fault(mode);
        if let Ok(mut l) = log.lock() {
            l.push(format!(
                "{:>6.0}s engine {i} {mode:?}",
                started.elapsed().as_secs_f64()
            ));
        }
        tokio::time::sleep(every / 3).await;
        if mode == FaultMode::Die {
            if let Some(mut dead) = engines[i].take() {
                dead.stopped().await;
            }
            for _ in 0..50 {
                if let Ok(h) = spawn_engine(cfg.clone(), addr).await {
                    engines[i] = Some(h);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else if let Some(h) = engines[i].as_ref() {
            h.set_fault(FaultMode::None);
        }
    }
    engines
}

fn pct(start: u64, end: u64) -> f64 {
    if start == 0 {
        return 0.0;
    }
    (end as f64 - start as f64) * 100.0 / start as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if !(cli.minutes > 0.0 && cli.rate > 0.0 && cli.engines > 0 && cli.max_in_flight > 0) {
        eprintln!("soak: --minutes, --rate, --engines and --max-in-flight must be positive");
        return ExitCode::from(2);
    }
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<bool, String> {
    let total = Duration::from_secs_f64(cli.minutes * 60.0);
    let warmup = Duration::from_secs(cli.warmup_secs).min(total / 5);
    let cfg = EngineConfig {
        flavor: Flavor::Sglang,
        ..EngineConfig::default()
    };
    let mut engines = Vec::new();
    for _ in 0..cli.engines {
        let h = spawn_engine(cfg.clone(), SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(|e| format!("cannot start a mock engine: {e}"))?;
        engines.push(Some(h));
    }
    let urls: Vec<String> = engines.iter().flatten().map(EngineHandle::url).collect();
    let bin = locate_shoal(cli.shoal_bin.as_deref()).map_err(|e| e.0)?;
    let fleet_cfg = FleetConfig::new(bin, 3, urls).args([
        "--policy",
        "least_load",
        "--worker-load-source",
        "sglang",
        "--load-poll-interval-ms",
        "200",
        "--request-timeout-secs",
        "15",
        "--health-check-interval-secs",
        "1",
        "--cb-timeout-duration-secs",
        "3",
        "--log-level",
        "warn,shoal::app=info",
    ]);
    let fleet = Fleet::start(fleet_cfg).await.map_err(|e| e.0)?;
    fleet
        .wait_meshed(Duration::from_secs(20))
        .await
        .map_err(|e| e.0)?;
    println!(
        "soak: {:.1} min, {} req/s, 3 replicas, {} engines, warm-up {warmup:?}; logs in {}",
        cli.minutes,
        cli.rate,
        cli.engines,
        fleet.dir().display()
    );
    let rss_boot = rss_all(&fleet);
    let counts = Arc::new(Counts::default());
    let fault_log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let until = started + total;
    let fault_task = tokio::spawn(faults(
        engines,
        cfg.clone(),
        Duration::from_secs(cli.fault_every_secs.max(3)),
        until,
        fault_log.clone(),
    ));
    let client = HttpClient::new();
    let slots = Arc::new(Semaphore::new(cli.max_in_flight));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / cli.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut rss_start: Option<Vec<Option<u64>>> = None;
    let mut next_report = started + Duration::from_secs(60);
    let mut k = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        if rss_start.is_none() && started.elapsed() >= warmup {
            rss_start = Some(rss_all(&fleet));
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(60);
            println!(
                "{:>5.0}s sent {} ok {} failed {} skipped {} rss KiB {:?}",
                started.elapsed().as_secs_f64(),
                counts.sent.load(Ordering::Relaxed),
                counts.ok.load(Ordering::Relaxed),
                counts.failed.load(Ordering::Relaxed),
                counts.skipped.load(Ordering::Relaxed),
                rss_all(&fleet)
            );
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            counts.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        k += 1;
        counts.sent.fetch_add(1, Ordering::Relaxed);
        let url = fleet.url((k % 3) as usize);
        let (client, counts) = (client.clone(), counts.clone());
        tokio::spawn(async move {
            one(client, url, k, counts).await;
            drop(permit);
        });
    }
    let traffic_secs = started.elapsed().as_secs_f64();
    // Let in-flight requests end (the request timeout bounds them).
    let drained = tokio::time::timeout(
        Duration::from_secs(30),
        slots.acquire_many(cli.max_in_flight as u32),
    )
    .await
    .is_ok();
    let engines = fault_task.await.map_err(|e| e.to_string())?;
    for h in engines.iter().flatten() {
        h.set_fault(FaultMode::None);
    }
    let rss_end = rss_all(&fleet);
    let rss_start = rss_start.unwrap_or_else(|| rss_boot.clone());
    // No leaked bookings: every replica's fleet in-flight returns to 0.
    let mut leaked = BTreeMap::new();
    let settle = Instant::now() + Duration::from_secs(15);
    loop {
        leaked.clear();
        for i in 0..fleet.len() {
            match fleet.status(i).await {
                Ok(st) if st.total_inflight() == 0 => {}
                Ok(st) => {
                    leaked.insert(fleet.name(i).to_string(), st.total_inflight());
                }
                Err(e) => {
                    leaked.insert(format!("{} ({e})", fleet.name(i)), u64::MAX);
                }
            }
        }
        if leaked.is_empty() || Instant::now() >= settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (sent, ok, failed, skipped) = (
        counts.sent.load(Ordering::Relaxed),
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.skipped.load(Ordering::Relaxed),
    );
    println!("\nfaults injected:");
    if let Ok(l) = fault_log.lock() {
        for line in l.iter() {
            println!("  {line}");
        }
    }
    println!("\n| metric | value |\n|---|---|");
    println!("| traffic duration | {:.1} min |", traffic_secs / 60.0);
    println!("| requests sent / ok / failed | {sent} / {ok} / {failed} |");
    if let Ok(reasons) = counts.reasons.lock() {
        for (why, n) in reasons.iter() {
            println!("| failed: {why} | {n} |");
        }
    }
    println!("| ticks skipped (client at --max-in-flight) | {skipped} |");
    println!("| client drained within 30 s | {drained} |");
    let mut rss_ok = true;
    for i in 0..fleet.len() {
        let (s, e) = (rss_start[i].unwrap_or(0), rss_end[i].unwrap_or(0));
        let change = pct(s, e);
        let flat = s > 0 && e > 0 && change.abs() <= 10.0;
        rss_ok &= flat;
        println!(
            "| replica {} RSS KiB boot / after warm-up / end | {} / {s} / {e} ({change:+.1} %{}) |",
            fleet.name(i),
            rss_boot[i].unwrap_or(0),
            if flat { "" } else { ", NOT FLAT" }
        );
    }
    println!(
        "| fleet in-flight after traffic | {} |",
        if leaked.is_empty() {
            "0 on every replica".to_string()
        } else {
            format!("LEAKED {leaked:?}")
        }
    );
    let pass = rss_ok && leaked.is_empty() && drained && ok > 0;
    println!("\nsoak {}", if pass { "PASSED" } else { "FAILED" });
    Ok(pass)
}
