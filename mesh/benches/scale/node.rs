//! One replica in its own process (the parent's `--node` child): a real
//! `Mesh` on loopback with its own churn, snapshots and probes. It talks to
//! the parent in lines: prints `READY <gossip addr>`, then `FORMED` once it
//! counts every replica; reads `GO <t0 unix ms>`, measures the window
//! [t0 + warm-up, + secs]; prints `GONE` (observers) when the killed
//! victim left its view; reads `STOP`, prints `RESULT <json>` and exits.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shoal_mesh::{Mesh, MeshConfig, PemSource, TlsConfig, TrafficStatus, WorkerSlot};

use crate::load::{Churn, snapshots};
use crate::probe::{self, Seen};
use crate::usage::{process_cpu, rss_mib, unix_us};

/// What one configuration asks of every replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub replicas: usize,
    pub workers: usize,
    /// Bookings per second per replica.
    pub rate: u64,
    /// Snapshot interval of each poll owner, ms.
    pub poll_ms: u64,
    pub warmup_secs: f64,
    pub secs: f64,
    /// Replicas that watch every probe (polling costs them a little).
    pub observers: usize,
    /// Overrides of the mesh defaults (None: production default).
    pub sync_ms: Option<u64>,
    pub gap_ms: Option<u64>,
    pub max_push_rate: Option<u32>,
    pub anti_entropy_ms: Option<u64>,
    /// Whole-value slot updates only, as before packing (`--whole-values`),
    /// to measure both in one run.
    #[serde(default)]
    pub whole_values: bool,
    /// `Mesh::start_on_own_thread`, as the router starts it; false:
    /// `Mesh::start` on the node's runtime (`--shared-runtime`).
    pub own_thread: bool,
}

/// One child's orders.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub settings: Settings,
    pub index: usize,
    pub seeds: Vec<SocketAddr>,
    /// Holds `ca.pem`, `n<i>.crt`, `n<i>.key`.
    pub tls_dir: PathBuf,
    pub observer: bool,
    pub victim: bool,
}

/// What one replica measured over the window (rates per second).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub index: usize,
    pub payload_bytes_per_sec: f64,
    pub wire_bytes_per_sec: f64,
    pub gossip_bytes_per_sec: f64,
    pub frames_per_sec: f64,
    /// Process CPU minus the harness's own threads, in cores.
    pub mesh_cores: f64,
    pub process_cores: f64,
    pub bookings: u64,
    pub rss_mib: f64,
    /// RSS before the mesh started (the bare process).
    pub rss_base_mib: f64,
    pub window_us: (u64, u64),
    /// This replica's probe advances: (seq, sent at µs).
    pub sent: Vec<(u64, u64)>,
    pub seen: Seen,
}

/// Prints one protocol line and flushes it.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn config(spec: &Spec) -> MeshConfig {
    let s = &spec.settings;
    let name = format!("n{}", spec.index);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let tls = TlsConfig {
        ca: PemSource::Path(spec.tls_dir.join("ca.pem")),
        cert: PemSource::Path(spec.tls_dir.join(format!("{name}.crt"))),
        key: PemSource::Path(spec.tls_dir.join(format!("{name}.key"))),
    };
    let mut c = MeshConfig::new(name, "scale", any, any, tls);
    c.seeds = spec.seeds.iter().map(|a| a.to_string()).collect();
    if let Some(ms) = s.sync_ms {
        c.sync_interval = Duration::from_millis(ms);
    }
    if let Some(rate) = s.max_push_rate {
        c.max_push_rate = rate;
    }
    if let Some(ms) = s.gap_ms {
        c.push_min_gap = Duration::from_millis(ms);
    }
    if let Some(ms) = s.anti_entropy_ms {
        c.anti_entropy_interval = Duration::from_millis(ms);
    }
    c.speaks_packed = !s.whole_values;
    c
}

fn sleep_until_unix_us(at: u64) {
    let now = unix_us();
    if at > now {
        std::thread::sleep(Duration::from_micros(at - now));
    }
}

/// The harness threads' CPU so far, µs (subtracted from the process's).
fn harness_cpu(counters: &[&AtomicU64]) -> f64 {
    counters
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum::<u64>() as f64
        / 1e6
}

/// The next line from the parent; `None` once it is gone.
fn read_line(stdin: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    match stdin.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().to_string()),
    }
}

pub fn main(spec: Spec) {
    let s = spec.settings.clone();
    let rss_base_mib = rss_mib();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mesh = if s.own_thread {
        rt.block_on(Mesh::start_on_own_thread(config(&spec)))
    } else {
        rt.block_on(Mesh::start(config(&spec)))
    }
    .expect("mesh start");
    say(&format!("READY {}", mesh.gossip_addr()));
    let keys: Vec<String> = (0..s.workers)
        .map(|i| {
            format!(
                "http://10.{}.{}.{}:8000",
                i / 65536,
                (i / 256) % 256,
                i % 256
            )
        })
        .collect();
    let slots: Vec<WorkerSlot> = keys.iter().map(|k| mesh.worker(k)).collect();
    for slot in &slots {
        slot.set_polled(true);
    }
    let probes: Vec<WorkerSlot> = (0..s.replicas)
        .map(|i| mesh.worker(&probe::key(i)))
        .collect();
    let kill = mesh.worker(probe::KILL_KEY);
    let formed =
        crate::common::wait_every(Duration::from_millis(50), Duration::from_secs(600), || {
            mesh.members().len() == s.replicas
        });
    say(if formed { "FORMED" } else { "UNFORMED" });
    let mut stdin = std::io::stdin().lock();
    let go = read_line(&mut stdin).unwrap_or_default();
    let t0_ms: u64 = go
        .strip_prefix("GO ")
        .and_then(|v| v.parse().ok())
        .expect("GO <unix ms>");
    sleep_until_unix_us(t0_ms * 1000);
    let _victim_booking = spec.victim.then(|| kill.book(1, 1));
    let churn = Churn::start(vec![slots.clone()], s.rate);
    let stop = AtomicBool::new(false);
    let (sender_cpu, watcher_cpu) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut report = Report {
        index: spec.index,
        rss_base_mib,
        ..Report::default()
    };
    let meshes = [&mesh];
    let one = [slots.clone()];
    std::thread::scope(|scope| {
        scope.spawn(|| snapshots(&meshes, &one, Duration::from_millis(s.poll_ms), &stop));
        let sender = scope.spawn(|| probe::send(&probes[spec.index], &stop, &sender_cpu));
        let watcher = spec.observer.then(|| {
            scope.spawn(|| probe::watch(&mesh, spec.index, &probes, &kill, &stop, &watcher_cpu))
        });
        let start_us = t0_ms * 1000 + (s.warmup_secs * 1e6) as u64;
        let end_us = start_us + (s.secs * 1e6) as u64;
        sleep_until_unix_us(start_us);
        let counters = [&churn.cpu_us, &sender_cpu, &watcher_cpu];
        let (t_before, cpu_before, harness_before) =
            (mesh.traffic(), process_cpu(), harness_cpu(&counters));
        let booked_before = churn.booked.load(Ordering::Relaxed);
        let started = Instant::now();
        sleep_until_unix_us(end_us);
        let secs = started.elapsed().as_secs_f64();
        let (t_after, cpu_after, harness_after) =
            (mesh.traffic(), process_cpu(), harness_cpu(&counters));
        let rate = |f: fn(&TrafficStatus) -> u64| (f(&t_after) - f(&t_before)) as f64 / secs;
        report.payload_bytes_per_sec = rate(|t| t.bytes_sent);
        report.wire_bytes_per_sec = rate(|t| t.link_wire_bytes);
        report.gossip_bytes_per_sec = rate(|t| t.gossip_bytes_sent);
        report.frames_per_sec = rate(|t| t.frames_sent);
        let process = (cpu_after - cpu_before).as_secs_f64();
        report.process_cores = process / secs;
        report.mesh_cores = (process - (harness_after - harness_before)).max(0.0) / secs;
        report.bookings = churn.booked.load(Ordering::Relaxed) - booked_before;
        report.rss_mib = rss_mib();
        report.window_us = (start_us, end_us);
        // Keep running (the victim is killed now) until told to stop.
        while read_line(&mut stdin).is_some_and(|l| l != "STOP") {}
        stop.store(true, Ordering::Relaxed);
        report.sent = sender.join().unwrap_or_default();
        report
            .sent
            .retain(|(_, at)| (start_us..end_us).contains(at));
        if let Some(w) = watcher {
            report.seen = w.join().unwrap_or_default();
        }
    });
    churn.stop();
    say(&format!(
        "RESULT {}",
        serde_json::to_string(&report).expect("json")
    ));
    // Skip the orderly shutdown: the process is done.
    std::process::exit(0);
}
