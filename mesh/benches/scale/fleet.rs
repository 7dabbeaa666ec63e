//! One configuration, run as R real processes: certificates from one test
//! CA, the first replica seeding the rest, a common start time, a SIGKILL
//! for the victim after the window, and the replicas' reports matched into
//! fleet figures.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shoal_mesh::PemSource;

use crate::common::Ca;
use crate::node::{Report, Settings, Spec};
use crate::usage::unix_us;

/// What one configuration measured (per-replica figures are means over
/// the replicas, `_max` the busiest one).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub replicas: usize,
    pub workers: usize,
    pub rate: u64,
    pub poll_ms: u64,
    /// First spawn until every replica counted every other.
    pub formation_secs: f64,
    /// Load-plane frames with their length prefix, bytes/s.
    pub payload_bytes_per_sec: f64,
    pub payload_bytes_per_sec_max: f64,
    /// UDP bytes of the load links (QUIC headers, ACKs, keep-alives).
    pub wire_bytes_per_sec: f64,
    pub wire_bytes_per_sec_max: f64,
    pub gossip_bytes_per_sec: f64,
    pub frames_per_sec: f64,
    /// Mesh CPU per replica in cores (its process minus the harness's
    /// churn and probe threads), and the same per booking in µs.
    pub cpu_cores_per_replica: f64,
    pub cpu_us_per_booking: f64,
    /// Every replica's process CPU over the machine's cores: near 1, the
    /// machine is the bottleneck and the lags are the machine's, not the
    /// mesh's.
    pub machine_busy: f64,
    /// Whole replica process, and what the mesh added to the bare process.
    pub rss_mib_per_replica: f64,
    pub rss_mesh_mib_per_replica: f64,
    /// Booking at A until B's view shows it, over every (probe, observer).
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
    /// Until the last observer saw it, per probe.
    pub lag_all_p99_ms: f64,
    pub lag_samples: usize,
    /// Probes an observer never saw (nor anything newer from that sender).
    pub lag_lost: usize,
    /// SIGKILL of one replica until its booking left every observer's view.
    pub removal_secs: Option<f64>,
    /// ... and until it left every observer's member list.
    pub removal_members_secs: Option<f64>,
}

struct Replica {
    child: Child,
    stdin: ChildStdin,
}

/// Writes the CA and each replica's certificate and key into `dir`.
fn write_certs(dir: &std::path::Path, replicas: usize) {
    let ca = Ca::new("scale-ca");
    let bytes = |p: &PemSource| match p {
        PemSource::Bytes(b) => b.clone(),
        PemSource::Path(path) => std::fs::read(path).expect("pem"),
    };
    for i in 0..replicas {
        let name = format!("n{i}");
        let tls = ca.tls(&name);
        if i == 0 {
            std::fs::write(dir.join("ca.pem"), bytes(&tls.ca)).expect("ca");
        }
        std::fs::write(dir.join(format!("{name}.crt")), bytes(&tls.cert)).expect("cert");
        std::fs::write(dir.join(format!("{name}.key")), bytes(&tls.key)).expect("key");
    }
}

fn spawn(spec: &Spec, lines: &std::sync::mpsc::Sender<(usize, String)>) -> Replica {
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .arg("--node")
        .arg(serde_json::to_string(spec).expect("spec"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn replica");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    let (index, tx) = (spec.index, lines.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((index, line)).is_err() {
                return;
            }
        }
    });
    Replica { child, stdin }
}

/// Waits for `count` lines starting with `prefix` (one per replica),
/// keeping the others' results aside. Panics past `within`.
fn collect(
    rx: &Receiver<(usize, String)>,
    prefix: &str,
    count: usize,
    within: Duration,
    aside: &mut Vec<(usize, String)>,
) -> HashMap<usize, String> {
    let deadline = Instant::now() + within;
    let mut got = HashMap::new();
    while got.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, line) = rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "{} of {count} replicas said {prefix} in {within:?}",
                got.len()
            )
        });
        match line.strip_prefix(prefix) {
            Some(rest) => {
                got.insert(i, rest.trim().to_string());
            }
            None => aside.push((i, line)),
        }
    }
    got
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs one configuration end to end.
pub fn run(s: &Settings) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    write_certs(dir.path(), s.replicas);
    let victim = s.replicas - 1;
    let observers = s.observers.clamp(1, s.replicas.saturating_sub(1).max(1));
    let spec = |index: usize, seeds: Vec<SocketAddr>| Spec {
        settings: s.clone(),
        index,
        seeds,
        tls_dir: dir.path().to_path_buf(),
        observer: index < observers && index != victim,
        victim: index == victim,
    };
    let (tx, rx) = channel();
    let mut aside = Vec::new();
    let started = Instant::now();
    let mut replicas = vec![spawn(&spec(0, Vec::new()), &tx)];
    let ready = collect(&rx, "READY ", 1, Duration::from_secs(60), &mut aside);
    let seed: SocketAddr = ready[&0].parse().expect("gossip address");
    for i in 1..s.replicas {
        replicas.push(spawn(&spec(i, vec![seed]), &tx));
    }
    collect(
        &rx,
        "READY ",
        s.replicas - 1,
        Duration::from_secs(120),
        &mut aside,
    );
    let formed = collect(
        &rx,
        "FORMED",
        s.replicas,
        Duration::from_secs(600),
        &mut aside,
    );
    assert_eq!(
        formed.len(),
        s.replicas,
        "every replica formed the full mesh"
    );
    let formation_secs = started.elapsed().as_secs_f64();
    let t0_ms = unix_us() / 1000 + 500;
    for r in &mut replicas {
        let _ = writeln!(r.stdin, "GO {t0_ms}");
        let _ = r.stdin.flush();
    }
    let window_end_us = t0_ms * 1000 + ((s.warmup_secs + s.secs) * 1e6) as u64;
    let now = unix_us();
    std::thread::sleep(
        Duration::from_micros(window_end_us.saturating_sub(now)) + Duration::from_millis(500),
    );
    let _ = replicas[victim].child.kill();
    let killed_us = unix_us();
    let _ = replicas[victim].child.wait();
    let watching = (0..observers).filter(|&i| i != victim).count();
    // Observers say GONE when the victim left their view; 30 s at most.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut gone = 0;
    while gone < watching {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((_, line)) if line == "GONE" => gone += 1,
            Ok(other) => aside.push(other),
            Err(_) => break,
        }
    }
    for (i, r) in replicas.iter_mut().enumerate() {
        if i != victim {
            let _ = writeln!(r.stdin, "STOP");
            let _ = r.stdin.flush();
        }
    }
    let results = collect(
        &rx,
        "RESULT ",
        s.replicas - 1,
        Duration::from_secs(60),
        &mut aside,
    );
    for r in &mut replicas {
        let _ = r.child.wait();
    }
    let reports: Vec<Report> = results
        .values()
        .map(|json| serde_json::from_str(json).expect("report"))
        .collect();
    let mut out = summarize(s, &reports, killed_us);
    out.formation_secs = formation_secs;
    out
}

/// Fleet figures from the survivors' reports.
fn summarize(s: &Settings, reports: &[Report], killed_us: u64) -> Outcome {
    let n = reports.len().max(1) as f64;
    let mean = |f: fn(&Report) -> f64| reports.iter().map(f).sum::<f64>() / n;
    let max = |f: fn(&Report) -> f64| reports.iter().map(f).fold(0.0, f64::max);
    let bookings: u64 = reports.iter().map(|r| r.bookings).sum();
    let secs = reports
        .first()
        .map_or(1.0, |r| (r.window_us.1 - r.window_us.0) as f64 / 1e6);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let mesh_cpu: f64 = reports.iter().map(|r| r.mesh_cores).sum();
    // Match probe advances with observations.
    let senders: HashMap<u32, &[(u64, u64)]> = reports
        .iter()
        .map(|r| (r.index as u32, r.sent.as_slice()))
        .collect();
    let (mut pairs, mut lost) = (Vec::new(), 0usize);
    let mut last_seen: HashMap<(u32, u64), u64> = HashMap::new();
    for observer in reports.iter().filter(|r| !r.seen.probes.is_empty()) {
        let mut seen: HashMap<(u32, u64), u64> = HashMap::new();
        let mut newest: HashMap<u32, u64> = HashMap::new();
        for &(sender, seq, at) in &observer.seen.probes {
            seen.insert((sender, seq), at);
            let e = newest.entry(sender).or_default();
            *e = (*e).max(seq);
        }
        for (&sender, sent) in &senders {
            if sender as usize == observer.index {
                continue;
            }
            for &(seq, at) in sent.iter() {
                match seen.get(&(sender, seq)) {
                    Some(&seen_at) => {
                        pairs.push(seen_at.saturating_sub(at) as f64 / 1000.0);
                        let e = last_seen.entry((sender, seq)).or_insert(0);
                        *e = (*e).max(seen_at.saturating_sub(at));
                    }
                    // Superseded by a newer number before this observer
                    // looked: not lost.
                    None if newest.get(&sender).is_some_and(|&n| n > seq) => {}
                    None => lost += 1,
                }
            }
        }
    }
    pairs.sort_by(f64::total_cmp);
    let mut alls: Vec<f64> = last_seen.values().map(|&us| us as f64 / 1000.0).collect();
    alls.sort_by(f64::total_cmp);
    let watchers: Vec<&Report> = reports
        .iter()
        .filter(|r| !r.seen.probes.is_empty())
        .collect();
    let removal = |f: fn(&Report) -> Option<u64>| -> Option<f64> {
        let times: Option<Vec<u64>> = watchers.iter().map(|r| f(r)).collect();
        times
            .and_then(|t| t.into_iter().max())
            .map(|at| at.saturating_sub(killed_us) as f64 / 1e6)
    };
    Outcome {
        replicas: s.replicas,
        workers: s.workers,
        rate: s.rate,
        poll_ms: s.poll_ms,
        formation_secs: 0.0,
        payload_bytes_per_sec: mean(|r| r.payload_bytes_per_sec),
        payload_bytes_per_sec_max: max(|r| r.payload_bytes_per_sec),
        wire_bytes_per_sec: mean(|r| r.wire_bytes_per_sec),
        wire_bytes_per_sec_max: max(|r| r.wire_bytes_per_sec),
        gossip_bytes_per_sec: mean(|r| r.gossip_bytes_per_sec),
        frames_per_sec: mean(|r| r.frames_per_sec),
        cpu_cores_per_replica: mean(|r| r.mesh_cores),
        cpu_us_per_booking: mesh_cpu * secs * 1e6 / bookings.max(1) as f64,
        machine_busy: reports.iter().map(|r| r.process_cores).sum::<f64>() / cores,
        rss_mib_per_replica: mean(|r| r.rss_mib),
        rss_mesh_mib_per_replica: mean(|r| r.rss_mib - r.rss_base_mib),
        lag_p50_ms: pct(&pairs, 0.5),
        lag_p99_ms: pct(&pairs, 0.99),
        lag_max_ms: pairs.last().copied().unwrap_or(f64::NAN),
        lag_all_p99_ms: pct(&alls, 0.99),
        lag_samples: pairs.len(),
        lag_lost: lost,
        removal_secs: removal(|r| r.seen.kill_load_gone_us),
        removal_members_secs: removal(|r| r.seen.kill_member_gone_us),
    }
}
