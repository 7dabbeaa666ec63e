//! Helpers for the per-tenant limit tests (`tenant_limits.rs`): a rig of
//! real `shoal` replicas reading a tenants file over an in-process mock
//! engine, run one at a time; the requests and checks of their answers are
//! in `answer`, the paced load and held streams in `load`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod answer;
pub mod load;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_tests::bench::tenants::start_tenant_fleet;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, locate_shoal};
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};

/// The key of `acme`, the tenant most tests put limits on.
pub const ACME_KEY: &str = "acme-key-00000001";
/// The key of `bob`, a second tenant (unlimited, or limited alone).
pub const BOB_KEY: &str = "bob-key-000000001";

/// One fleet at a time: the paced tests count admissions against a
/// window, and two fleets side by side on a 2-core box would stretch the
/// pacing.
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Runs `body` alone (no other fleet of this binary at the same time) and
/// fails it after `bound` (start-up included).
pub async fn run<F: Future>(bound: Duration, body: F) -> F::Output {
    let _alone = ONE_AT_A_TIME.acquire().await;
    let started = Instant::now();
    let out = tokio::time::timeout(bound, body)
        .await
        .unwrap_or_else(|_| panic!("the test exceeded its bound of {bound:?}"));
    println!("test body took {:?}", started.elapsed());
    out
}

/// The allowance per window of a per-minute limit, as the spec defines it.
pub fn allowance(per_minute: u64, window_secs: u64) -> u64 {
    (per_minute * window_secs / 60).max(1)
}

/// Mock engines, `shoal` replicas over them reading a tenants file, and a
/// client.
pub struct Rig {
    /// Kept alive for the replicas (dropping a handle stops its engine).
    _engines: Vec<EngineHandle>,
    /// The `shoal` replicas under test.
    pub fleet: Fleet,
    /// A pooled client for the test's requests.
    pub client: HttpClient,
    /// The tenants file the replicas read (rewritten by reload tests).
    pub file: PathBuf,
    /// Holds the tenants file (removed when dropped).
    _dir: tempfile::TempDir,
}

impl Rig {
    /// `replicas` replicas (meshed, and waited for, when `mesh`) over one
    /// real-time mock SGLang engine, all started with `--tenants-file`
    /// holding `tenants`.
    pub async fn start(replicas: usize, mesh: bool, tenants: &str) -> Self {
        let cfg = EngineConfig {
            flavor: Flavor::Sglang,
            ..EngineConfig::default()
        };
        Self::start_with(replicas, mesh, tenants, &cfg, &[]).await
    }

    /// [`Rig::start`] over one engine of `cfg`, the replicas also given
    /// `extra_args`.
    pub async fn start_with(
        replicas: usize,
        mesh: bool,
        tenants: &str,
        cfg: &EngineConfig,
        extra_args: &[String],
    ) -> Self {
        let engines = spawn_engines(cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, 1)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bin = locate_shoal(None).unwrap_or_else(|e| panic!("{e}"));
        let t = Instant::now();
        let urls = engines.iter().map(|e| e.url()).collect();
        let (fleet, file) = start_tenant_fleet(
            bin,
            replicas,
            mesh,
            urls,
            tenants,
            dir.path(),
            Duration::from_secs(15),
            extra_args,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{replicas} replica(s){} up after {:?}",
            if mesh { ", meshed," } else { "" },
            t.elapsed()
        );
        Self {
            _engines: engines,
            fleet,
            client: HttpClient::new(),
            file,
            _dir: dir,
        }
    }

    /// Every replica's base URL, for spreading requests over them.
    pub fn urls(&self) -> Vec<String> {
        (0..self.fleet.len()).map(|i| self.fleet.url(i)).collect()
    }

    /// Every replica's log tail, for failure messages.
    pub fn logs(&self) -> String {
        (0..self.fleet.len())
            .map(|i| {
                format!(
                    "--- {} log ---\n{}\n",
                    self.fleet.name(i),
                    self.fleet.log_tail(i, 15)
                )
            })
            .collect()
    }

    /// `GET /tenants` of replica `i`, parsed; `None` if it does not answer
    /// 200 with JSON.
    pub async fn tenants(&self, i: usize) -> Option<Value> {
        let resp = self
            .client
            .get(&format!("{}/tenants", self.fleet.url(i)))
            .await
            .ok()?;
        if resp.status != 200 {
            return None;
        }
        resp.json().ok()
    }

    /// `kill -HUP` replica `i`: how the reload test makes it reread the file.
    pub fn hangup(&self, i: usize) {
        let pid = self.fleet.pid(i).expect("running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -HUP {pid}: {status}");
    }
}

/// The value of `shoal_config_reloads_total{result="..."}` (0 if absent):
/// how a test sees that a reload was rejected.
pub async fn reloads(rig: &Rig, result: &str) -> Option<u64> {
    let metrics = rig
        .client
        .get(&format!("{}/metrics", rig.fleet.url(0)))
        .await
        .ok()?
        .text();
    let prefix = format!("shoal_config_reloads_total{{result=\"{result}\"}} ");
    Some(
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64),
    )
}

/// Runs `shoal` on a tenants file (by flag, or by `SHOAL_TENANTS_FILE`
/// when `via_env`) and returns its exit status and everything it said; a
/// `shoal` still running after 10 s has started, and fails the test.
pub async fn start_on(
    bin: &Path,
    file: &Path,
    via_env: bool,
) -> (std::process::ExitStatus, String) {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", "0"])
        .env_remove("RUST_LOG")
        .env_remove("SHOAL_TENANTS_FILE")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if via_env {
        cmd.env("SHOAL_TENANTS_FILE", file);
    } else {
        cmd.arg("--tenants-file").arg(file);
    }
    let child = cmd.spawn().unwrap();
    match tokio::time::timeout(Duration::from_secs(10), child.wait_with_output()).await {
        Ok(out) => {
            let out = out.unwrap();
            let said = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            (out.status, said)
        }
        Err(_) => panic!(
            "shoal still runs 10 s after starting on {} (via_env {via_env}): it accepted it",
            file.display()
        ),
    }
}
