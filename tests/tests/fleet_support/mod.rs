//! Helpers for the fleet tests: real `shoal` replicas (the harness in
//! `shoal_tests::fleet`) over in-process mock engines, serialized so the
//! fleets of different tests do not compete for the CPU.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, MeshStatus, locate_shoal};
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};

/// Each test's bound, start-up included.
pub const TEST_BOUND: Duration = Duration::from_secs(30);

/// Fleets one test binary runs at once. The tests mostly wait (for polls,
/// quiet periods, a restarted process), so two fleets side by side halve
/// a binary's wall time on a 2-core box; more would let CPU contention
/// stretch the intervals the assertions count in.
const FLEETS_AT_ONCE: usize = 2;

static FLEETS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(FLEETS_AT_ONCE);

/// Runs `body` (with at most [`FLEETS_AT_ONCE`] fleets at a time) and
/// fails it after [`TEST_BOUND`].
pub async fn run<F: Future>(body: F) -> F::Output {
    run_for(TEST_BOUND, body).await
}

/// Runs `body` (with at most [`FLEETS_AT_ONCE`] fleets at a time) and
/// fails it after `bound`.
pub async fn run_for<F: Future>(bound: Duration, body: F) -> F::Output {
    let _few_at_a_time = FLEETS.acquire().await;
    let started = Instant::now();
    let out = tokio::time::timeout(bound, body)
        .await
        .unwrap_or_else(|_| panic!("the test exceeded its bound of {bound:?}"));
    println!("test body took {:?}", started.elapsed());
    out
}

/// Mock engines, the replicas over them and a client.
pub struct Setup {
    /// In-process mock SGLang engines.
    pub engines: Vec<EngineHandle>,
    /// The `shoal` replicas (`a`, `b`, `c`).
    pub fleet: Fleet,
    /// A pooled client.
    pub client: HttpClient,
}

/// Starts `engines` mock SGLang engines (real-time) on loopback.
pub async fn engines(n: usize) -> Vec<EngineHandle> {
    let cfg = EngineConfig {
        flavor: Flavor::Sglang,
        ..EngineConfig::default()
    };
    spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, n)
        .await
        .unwrap()
}

/// Three replicas over `workers` (indexes into `engines`) with `args`;
/// meshed (and waited for) when `mesh`.
pub async fn start(
    engines: Vec<EngineHandle>,
    workers: &[usize],
    mesh: bool,
    args: &[&str],
) -> Setup {
    start_with_spares(engines, workers, mesh, args, &[]).await
}

/// [`start`], with certificates also made for `spares`, the names of
/// replicas a test adds later (`Fleet::add_replica`).
pub async fn start_with_spares(
    engines: Vec<EngineHandle>,
    workers: &[usize],
    mesh: bool,
    args: &[&str],
    spares: &[&str],
) -> Setup {
    let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
    let urls = workers.iter().map(|&i| engines[i].url()).collect();
    let cfg = FleetConfig::new(bin, 3, urls)
        .mesh(mesh)
        .args(args.iter().copied())
        .spare_names(spares.iter().copied());
    let fleet = Fleet::start(cfg).await.unwrap_or_else(|e| panic!("{e}"));
    if mesh {
        let t = Instant::now();
        fleet
            .wait_meshed(Duration::from_secs(15))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        println!("meshed after {:?}", t.elapsed());
    }
    Setup {
        engines,
        fleet,
        client: HttpClient::new(),
    }
}

/// Three meshed replicas over `n` fresh engines, all of them workers.
pub async fn meshed(n: usize, args: &[&str]) -> Setup {
    let all: Vec<usize> = (0..n).collect();
    start(engines(n).await, &all, true, args).await
}

#[allow(unused_imports)] // not every test binary waits
pub use shoal_tests::wait::wait_for;

impl Setup {
    /// `/mesh/status` of replica `i`, or `None` if it does not answer.
    pub async fn status(&self, i: usize) -> Option<MeshStatus> {
        self.fleet.status(i).await.ok()
    }

    /// Requests each engine has accepted so far.
    pub fn accepted(&self) -> Vec<u64> {
        self.engines
            .iter()
            .map(|e| e.snapshot().counters.requests_total)
            .collect()
    }

    /// Requests running or waiting at each engine now.
    pub fn active(&self) -> Vec<usize> {
        self.engines
            .iter()
            .map(|e| {
                let s = e.snapshot();
                s.running + s.waiting
            })
            .collect()
    }

    /// Load-endpoint hits of each engine so far.
    pub fn load_polls(&self) -> Vec<u64> {
        self.engines.iter().map(EngineHandle::load_polls).collect()
    }

    /// Replica `i`'s log tail, for failure messages.
    pub fn log(&self, i: usize) -> String {
        format!(
            "--- {} log ---\n{}",
            self.fleet.name(i),
            self.fleet.log_tail(i, 20)
        )
    }
}

/// Which engine's accepted count grew between `before` and `after`
/// (exactly one must have, by exactly one).
pub fn chosen(before: &[u64], after: &[u64]) -> usize {
    let grown: Vec<usize> = (0..before.len())
        .filter(|&i| after[i] != before[i])
        .collect();
    assert_eq!(grown.len(), 1, "before {before:?} after {after:?}");
    assert_eq!(after[grown[0]], before[grown[0]] + 1);
    grown[0]
}

/// One `shoal` process started with a shell command line (so a test can
/// set `ulimit -n` before it), killed when dropped.
pub struct SoloShoal {
    child: std::process::Child,
    /// `host:port` it listens on.
    pub addr: String,
}

impl SoloShoal {
    /// Starts `shoal --host 127.0.0.1 --port 0 ARGS` after `prelude` (a
    /// shell command such as `ulimit -n 256`, or empty) and waits for its
    /// "listening" line.
    pub fn start(prelude: &str, args: &str) -> Self {
        use std::io::{BufRead, BufReader};
        let bin = locate_shoal(None).unwrap();
        let prelude = match prelude {
            "" => String::new(),
            p => format!("{p} && "),
        };
        let script = format!(
            "{prelude}exec {} --host 127.0.0.1 --port 0 {args}",
            bin.display()
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("shoal starts");
        Self { child, addr }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://host:port`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A line of `/proc/PID/status` (`VmHWM`, `VmRSS`, ...) in kB.
    pub fn status_kb(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

impl Drop for SoloShoal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of counter `name` with label `reason` in a Prometheus text
/// scrape (0 when absent).
pub fn counter(metrics: &str, name: &str, reason: &str) -> u64 {
    let prefix = format!("{name}{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
