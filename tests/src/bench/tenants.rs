//! The tenant-limit benchmark's rig and load (`tenant-bench`): `shoal`
//! replicas reading one tenants file over in-process mock engines, and the
//! two offers it measures with: requests paced at a fixed rate and spread
//! over the replicas by a seeded choice (the allowance cases), and
//! requests sent as fast as a number of clients can (the overshoot case).
//!
//! Kept apart from the bin so the bin stays a plan and a table; the
//! cross-process tests have their own helpers (`tests/tests/tenants_support`),
//! which panic where these return errors.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use crate::client::HttpClient;
use crate::fleet::{Fleet, FleetConfig};
use crate::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use crate::workload::{chat, text};

/// The window of every tenant of the bench: short, so that one offer fills
/// it and a whole run stays within minutes.
pub const WINDOW_SECS: u64 = 6;
/// Output tokens per minute of the allowance cases: 1,000 per 6 s window
/// (the L).
pub const OUTPUT_TPM: u64 = 10_000;
/// Output tokens each request of the allowance cases asks for: the unit
/// admissions are counted in.
pub const TOKENS_PER_REQUEST: u64 = 10;
/// Most failure messages an offer keeps (their count is kept whole).
const MAX_KEPT_FAILURES: usize = 5;

/// The allowance per window of a per-minute limit, as `docs/tenants.md`
/// defines it (`rate × window_secs / 60`, at least 1): what admissions are
/// weighed against.
pub fn allowance(per_minute: u64, window_secs: u64) -> u64 {
    (per_minute * window_secs / 60).max(1)
}

/// How a request picks its replica: the two traffic shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spread {
    /// Uniformly at random over the replicas.
    Even,
    /// This share to replica 0, the rest uniformly over the others.
    Skewed(f64),
}

impl Spread {
    /// The table's name for it (`even`, `90/10`).
    pub fn label(self) -> String {
        match self {
            Spread::Even => "even".to_string(),
            Spread::Skewed(share) => {
                let pct = (share * 100.0).round() as u32;
                format!("{pct}/{}", 100 - pct.min(100))
            }
        }
    }

    /// A replica out of `n` for the next request.
    fn pick(self, rng: &mut StdRng, n: usize) -> usize {
        match self {
            Spread::Even => rng.random_range(0..n),
            Spread::Skewed(share) => {
                if n == 1 || rng.random_bool(share.clamp(0.0, 1.0)) {
                    0
                } else {
                    1 + rng.random_range(0..n - 1)
                }
            }
        }
    }
}

/// One tenant of the bench's tenants file: a fresh name per case, so no
/// two cases share a window.
#[derive(Debug, Clone)]
pub struct TenantSpec {
    /// The tenant's name (letters, digits, `-`): labels the case.
    pub name: String,
    /// `output_tokens_per_minute`, if limited.
    pub output_tokens_per_minute: Option<u64>,
    /// `requests_per_minute`, if limited.
    pub requests_per_minute: Option<u64>,
}

impl TenantSpec {
    /// A tenant limited on output tokens per minute only.
    pub fn output_tokens(name: &str, per_minute: u64) -> Self {
        Self {
            name: name.to_string(),
            output_tokens_per_minute: Some(per_minute),
            requests_per_minute: None,
        }
    }

    /// A tenant limited on requests per minute only.
    pub fn requests(name: &str, per_minute: u64) -> Self {
        Self {
            name: name.to_string(),
            output_tokens_per_minute: None,
            requests_per_minute: Some(per_minute),
        }
    }

    /// The tenant's one key, derived from its name so cases need not
    /// carry it around.
    pub fn key(&self) -> String {
        format!("{}-key-000000001", self.name)
    }
}

/// The tenants file holding `tenants`, with the bench's window.
pub fn tenants_file(tenants: &[TenantSpec]) -> String {
    let mut out = format!("window_secs = {WINDOW_SECS}\n");
    for t in tenants {
        out.push_str(&format!("[tenants.{}]\nkeys = [\"{}\"]\n", t.name, t.key()));
        if let Some(n) = t.output_tokens_per_minute {
            out.push_str(&format!("output_tokens_per_minute = {n}\n"));
        }
        if let Some(n) = t.requests_per_minute {
            out.push_str(&format!("requests_per_minute = {n}\n"));
        }
    }
    out
}

/// Mock engines, `shoal` replicas over them reading one tenants file, and
/// a client: one fleet of the bench, reused by every case it can serve.
pub struct Rig {
    /// Kept alive for the replicas (dropping a handle stops its engine).
    engines: Vec<EngineHandle>,
    /// The replicas under test.
    pub fleet: Fleet,
    /// A pooled client for every request of the offers.
    pub client: HttpClient,
    /// Holds the tenants file while the replicas run.
    _dir: tempfile::TempDir,
}

/// Starts `replicas` `shoal` replicas over `engines` (meshed, and waited
/// for up to `mesh_wait`, when `mesh`), all reading a tenants file of
/// `tenants_toml` written into `dir` and given `extra_args`; returns the
/// fleet and the file (to rewrite for a reload). Shared by `tenant-bench`,
/// `fairness-bench` and the cross-process tenant tests.
#[allow(clippy::too_many_arguments)]
pub async fn start_tenant_fleet(
    shoal: PathBuf,
    replicas: usize,
    mesh: bool,
    engines: Vec<String>,
    tenants_toml: &str,
    dir: &Path,
    mesh_wait: Duration,
    extra_args: &[String],
) -> Result<(Fleet, PathBuf), String> {
    let file = dir.join("tenants.toml");
    std::fs::write(&file, tenants_toml).map_err(|e| format!("{}: {e}", file.display()))?;
    let path = file.to_string_lossy().into_owned();
    let fleet_cfg = FleetConfig::new(shoal, replicas, engines).mesh(mesh).args([
        "--worker-load-source",
        "none",
        "--tenants-file",
        path.as_str(),
    ]);
    let fleet_cfg = fleet_cfg.args(extra_args.iter().cloned());
    let fleet = Fleet::start(fleet_cfg).await.map_err(|e| e.0)?;
    if mesh {
        fleet.wait_meshed(mesh_wait).await.map_err(|e| e.0)?;
    }
    Ok((fleet, file))
}

impl Rig {
    /// Starts `engines` mock SGLang engines at `time_scale` and `replicas`
    /// replicas over them (meshed, and waited for, when `mesh`), all
    /// reading a tenants file of `tenants`.
    pub async fn start(
        shoal: PathBuf,
        replicas: usize,
        mesh: bool,
        engines: usize,
        time_scale: f64,
        tenants: &[TenantSpec],
    ) -> Result<Self, String> {
        let cfg = EngineConfig {
            flavor: Flavor::Sglang,
            time_scale,
            ..EngineConfig::default()
        };
        let handles = spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, engines)
            .await
            .map_err(|e| format!("cannot start {engines} mock engines: {e}"))?;
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let urls = handles.iter().map(|e| e.url()).collect();
        let (fleet, _) = start_tenant_fleet(
            shoal,
            replicas,
            mesh,
            urls,
            &tenants_file(tenants),
            dir.path(),
            Duration::from_secs(30),
            &[],
        )
        .await?;
        Ok(Self {
            engines: handles,
            fleet,
            client: HttpClient::new(),
            _dir: dir,
        })
    }

    /// Every replica's base URL, for spreading requests over them.
    pub fn urls(&self) -> Vec<String> {
        (0..self.fleet.len()).map(|i| self.fleet.url(i)).collect()
    }

    /// Stops the replicas, then the engines: the next fleet starts on a
    /// quiet box.
    pub async fn stop(self) {
        let Self {
            engines, mut fleet, ..
        } = self;
        fleet.shutdown(Duration::from_secs(3)).await;
        drop(fleet);
        for e in engines {
            e.shutdown().await;
        }
    }

    /// How stale a peer's admissions can be when a replica reads them:
    /// the largest convergence lag p99 any replica's `/mesh/status`
    /// reports (from the sender's read of its state before the change to
    /// the receiver's merge: the push gap plus delivery). `None` without
    /// the mesh or before any lag was measured.
    pub async fn staleness_p99(&self) -> Option<Duration> {
        let mut worst: Option<f64> = None;
        for i in 0..self.fleet.len() {
            let url = format!("{}/mesh/status", self.fleet.url(i));
            let Ok(resp) = self.client.get(&url).await else {
                continue;
            };
            let Ok(json) = serde_json::from_str::<serde_json::Value>(&resp.text()) else {
                continue;
            };
            if let Some(ms) = json
                .pointer("/traffic/convergence_lag_p99_ms")
                .and_then(|v| v.as_f64())
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
            {
                worst = Some(worst.map_or(ms, |w| w.max(ms)));
            }
        }
        worst.map(|ms| Duration::from_secs_f64(ms / 1e3))
    }
}

/// What an offer got back: the figures of one table row.
#[derive(Debug, Clone, Default)]
pub struct Offered {
    /// Requests sent (each answered or failed).
    pub offered: usize,
    /// Requests answered 200.
    pub admitted: usize,
    /// Requests answered 429, by error code.
    pub refused: BTreeMap<String, usize>,
    /// Per replica: (offered, admitted).
    pub per_replica: Vec<(usize, usize)>,
    /// Answers neither 200 nor 429, and requests that failed outright.
    pub failed: usize,
    /// Up to [`MAX_KEPT_FAILURES`] of those, for the report.
    pub failures: Vec<String>,
    /// From the first request sent to the last answer.
    pub elapsed: Duration,
    /// From the first request sent to the last one sent.
    pub last_sent: Duration,
    /// Unpaced offers: the requests sent up to the send of the last one
    /// admitted, and that span: the rate at which the fleet admitted
    /// while the allowance lasted (what the overshoot bound scales with).
    pub admission_phase: Option<(usize, Duration)>,
}

impl Offered {
    /// 429s of any code.
    pub fn refused_total(&self) -> usize {
        self.refused.values().sum()
    }

    /// Counts one answer (or failure) of replica `r`.
    fn record(&mut self, r: usize, answer: Result<(u16, Option<String>), String>) {
        self.offered += 1;
        self.per_replica[r].0 += 1;
        match answer {
            Ok((200, _)) => {
                self.admitted += 1;
                self.per_replica[r].1 += 1;
            }
            Ok((429, code)) => {
                *self.refused.entry(code.unwrap_or_default()).or_default() += 1;
            }
            Ok((status, code)) => self.fail(format!("replica {r}: {status} {code:?}")),
            Err(e) => self.fail(format!("replica {r}: {e}")),
        }
    }

    /// Counts a failure, keeping the first few messages.
    fn fail(&mut self, why: String) {
        self.failed += 1;
        if self.failures.len() < MAX_KEPT_FAILURES {
            self.failures.push(why);
        }
    }
}

/// Posts one non-streamed chat request of `max_tokens` with `key` and
/// reads the answer whole: its status and, for an error, `error.code`.
async fn ask(
    client: &HttpClient,
    base: &str,
    key: &str,
    content: &str,
    max_tokens: u64,
) -> Result<(u16, Option<String>), String> {
    let url = format!("{base}/v1/chat/completions");
    let auth = format!("Bearer {key}");
    let body = Bytes::from(chat(content, max_tokens, false).to_string());
    let resp = client
        .send(
            Method::POST,
            &url,
            &[("authorization", auth.as_str())],
            Some(body),
        )
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("POST {url}: the body broke: {e}"))?
        .to_bytes();
    let status = parts.status.as_u16();
    let code = (status != 200)
        .then(|| {
            serde_json::from_slice::<serde_json::Value>(&body)
                .ok()?
                .pointer("/error/code")?
                .as_str()
                .map(str::to_string)
        })
        .flatten();
    Ok((status, code))
}

/// Offers requests of `max_tokens` from `key` at `rate` per second for
/// `span`, each to a replica picked by `spread` (seeded), each without
/// waiting for the ones before (open loop: the pace does not bend to the
/// answers).
pub async fn offer_paced(
    rig: &Rig,
    key: &str,
    (rate, span): (f64, Duration),
    spread: Spread,
    seed: u64,
    max_tokens: u64,
) -> Offered {
    let urls = rig.urls();
    let mut rng = StdRng::seed_from_u64(seed);
    let count = (rate * span.as_secs_f64()).round() as usize;
    let mut out = Offered {
        per_replica: vec![(0, 0); urls.len()],
        ..Offered::default()
    };
    let key: Arc<str> = Arc::from(key);
    let mut tasks = JoinSet::new();
    let start = tokio::time::Instant::now();
    for k in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate)).await;
        let r = spread.pick(&mut rng, urls.len());
        out.last_sent = start.elapsed();
        let (client, base, key) = (rig.client.clone(), urls[r].clone(), key.clone());
        let content = text(seed.wrapping_mul(1_000_003).wrapping_add(k as u64), 64);
        tasks.spawn(async move { (r, ask(&client, &base, &key, &content, max_tokens).await) });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((r, answer)) => out.record(r, answer),
            Err(e) => out.fail(format!("a request task failed: {e}")),
        }
    }
    out.elapsed = start.elapsed();
    out
}

/// Offers requests of `max_tokens` from `key` for `span` as fast as
/// `clients` clients can, each sending its next request when the last is
/// answered, each to a replica picked uniformly (seeded per client).
pub async fn offer_unpaced(
    rig: &Rig,
    key: &str,
    clients: usize,
    span: Duration,
    seed: u64,
    max_tokens: u64,
) -> Offered {
    let urls: Arc<Vec<String>> = Arc::new(rig.urls());
    let n = urls.len();
    let key: Arc<str> = Arc::from(key);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..clients {
        let (client, urls, key, stop) =
            (rig.client.clone(), urls.clone(), key.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(c as u64));
            let mut answers = Vec::new();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) && start.elapsed() < span {
                let r = rng.random_range(0..n);
                let sent = start.elapsed();
                let content = text(seed ^ ((c as u64) << 32) ^ k, 64);
                let answer = ask(&client, &urls[r], &key, &content, max_tokens).await;
                answers.push((r, sent, answer));
                k += 1;
            }
            answers
        });
    }
    let mut out = Offered {
        per_replica: vec![(0, 0); n],
        ..Offered::default()
    };
    let mut sends = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(answers) => {
                for (r, sent, a) in answers {
                    out.last_sent = out.last_sent.max(sent);
                    sends.push((sent, matches!(a, Ok((200, _)))));
                    out.record(r, a);
                }
            }
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                out.fail(format!("a client task failed: {e}"));
            }
        }
    }
    out.elapsed = start.elapsed();
    out.admission_phase = sends
        .iter()
        .filter(|(_, admitted)| *admitted)
        .map(|(sent, _)| *sent)
        .max()
        .map(|last| (sends.iter().filter(|(s, _)| *s <= last).count(), last));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_is_the_rate_over_the_window() {
        assert_eq!(allowance(OUTPUT_TPM, WINDOW_SECS), 1000);
        assert_eq!(allowance(1, 6), 1);
    }

    #[test]
    fn spreads_pick_as_labelled() {
        let mut rng = StdRng::seed_from_u64(7);
        let picks: Vec<usize> = (0..10_000)
            .map(|_| Spread::Skewed(0.9).pick(&mut rng, 4))
            .collect();
        let zero = picks.iter().filter(|&&r| r == 0).count();
        assert!((8_800..=9_200).contains(&zero), "{zero}");
        assert!(picks.iter().all(|&r| r < 4));
        assert_eq!(Spread::Skewed(0.9).label(), "90/10");
        assert_eq!(Spread::Even.label(), "even");
        assert_eq!(Spread::Skewed(0.9).pick(&mut rng, 1), 0);
    }

    #[test]
    fn the_tenants_file_names_every_limit() {
        let file = tenants_file(&[
            TenantSpec::output_tokens("a-even", 10_000),
            TenantSpec::requests("burst", 6_000),
        ]);
        assert!(file.starts_with("window_secs = 6\n"));
        assert!(file.contains("[tenants.a-even]\nkeys = [\"a-even-key-000000001\"]\n"));
        assert!(file.contains("output_tokens_per_minute = 10000\n"));
        assert!(file.contains("requests_per_minute = 6000\n"));
    }
}
