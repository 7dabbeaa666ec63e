//! The fleet benchmark (`fleet-bench`): mock engines in this process, real
//! `shoal` replicas from the [`Fleet`](crate::fleet::Fleet) harness, and an
//! open-loop Poisson load generator spreading requests round robin over the
//! replicas. One [`run_scenario`] call measures one (policy, engine
//! flavor, replicas, mesh) combination on fresh engines and fresh replicas;
//! [`plan`] lists the combinations, [`summary`] aggregates them over seeds.
//!
//! Time: the engines run `time_scale` times faster than real time, and the
//! router's load-poll and mesh-sync intervals are divided by the same
//! factor, so in model time every scenario sees the router's default
//! staleness (1 s polls, 20 ms mesh pushes) while a run takes
//! `1 / time_scale` of the wall time. Latencies are reported in wall ms.

pub mod cpu;
pub mod disagg;
pub mod driver;
pub mod fairness;
pub mod kv;
pub mod plan;
pub mod plot;
pub mod pooled;
pub mod probe_view;
pub mod report;
pub mod summary;
pub mod tenants;
pub mod trace;
pub mod workload;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use crate::client::HttpClient;
use crate::fleet::{Fleet, FleetConfig};
use crate::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use cpu::CpuSample;
use driver::{LoadOptions, run_load};
use report::{ScenarioId, ScenarioResult, engine_stats, mesh_traffic, summarize};
use workload::Schedule;

/// One scenario: which policy on which engines, how many replicas, mesh
/// or not.
#[derive(Debug, Clone)]
pub struct ScenarioSpec {
    /// The `--policies` entry it belongs to ([`plan::Choice::name`]); names
    /// the scenario, since two entries may run the same policy.
    pub group: String,
    /// Routing policy (`shoal --policy`).
    pub policy: String,
    /// Load-endpoint flavor of the mock engines.
    pub flavor: Flavor,
    /// `oracle`, `no-mesh` or `mesh`.
    pub label: String,
    /// Replicas.
    pub replicas: usize,
    /// Mesh on.
    pub mesh: bool,
}

/// What every scenario of a run shares.
#[derive(Debug, Clone)]
pub struct BenchSetup {
    /// The `shoal` binary.
    pub shoal_bin: PathBuf,
    /// Engine parameters shared by every scenario (time scale included);
    /// each scenario sets its own flavor ([`BenchSetup::engine_for`]).
    pub engine: EngineConfig,
    /// Number of engines.
    pub engines: usize,
    /// Load-poll interval in model ms (divided by the time scale for shoal).
    pub poll_interval_model_ms: f64,
    /// Mesh-sync interval in model ms (divided by the time scale for shoal).
    pub mesh_sync_model_ms: f64,
    /// Shortest gap between mesh pushes on change, in model ms (divided by
    /// the time scale for shoal).
    pub mesh_push_gap_model_ms: f64,
    /// Extra flags for every replica.
    pub extra_args: Vec<String>,
    /// Load-generator knobs.
    pub load: LoadOptions,
    /// Set when a policy of the run routes on KV events: every scenario's
    /// engines then tokenize and publish events (see [`kv`]).
    pub kv_events: Option<kv::KvEventsSetup>,
    /// Set for a disaggregated fleet (`--disagg`): the engines split into a
    /// prefill and a decode pool (see [`disagg`]).
    pub disagg: Option<disagg::DisaggSetup>,
}

impl BenchSetup {
    /// The engine configuration of `spec`: the shared one with the
    /// scenario's flavor, so flavors differ in nothing else.
    pub fn engine_for(&self, spec: &ScenarioSpec) -> EngineConfig {
        let cfg = EngineConfig {
            flavor: spec.flavor,
            ..self.engine.clone()
        };
        match &self.kv_events {
            Some(kv) => kv.engine(cfg),
            None => cfg,
        }
    }

    /// Wall milliseconds of `model_ms`, at least 1.
    pub fn wall_ms(&self, model_ms: f64) -> u64 {
        (model_ms / self.engine.time_scale).round().max(1.0) as u64
    }

    /// The flags given to every replica of `spec`.
    pub fn replica_args(&self, spec: &ScenarioSpec) -> Vec<String> {
        let poll = self.wall_ms(self.poll_interval_model_ms);
        let mut args: Vec<String> = vec![
            "--policy".into(),
            spec.policy.clone(),
            "--load-poll-interval-ms".into(),
            poll.to_string(),
            "--load-stale-after-ms".into(),
            (3 * poll).to_string(),
        ];
        if spec.mesh {
            args.extend([
                "--mesh-sync-interval-ms".into(),
                self.wall_ms(self.mesh_sync_model_ms).to_string(),
                "--mesh-push-min-gap-ms".into(),
                self.wall_ms(self.mesh_push_gap_model_ms).to_string(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// Runs one scenario on fresh engines and replicas; `Err` only when the
/// setup fails (request failures are counted in the result).
pub async fn run_scenario(
    setup: &BenchSetup,
    spec: &ScenarioSpec,
    schedule: &Schedule,
    progress: &ProgressBar,
) -> Result<ScenarioResult, String> {
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut args = setup.replica_args(spec);
    let engines = match &setup.disagg {
        Some(pd) => {
            let pools = pd.spawn(&setup.engine_for(spec), setup.engines).await?;
            args.extend(pools.args);
            pools.engines
        }
        None => spawn_engines(&setup.engine_for(spec), localhost, 0, setup.engines)
            .await
            .map_err(|e| format!("cannot start mock engines: {e}"))?,
    };
    let urls: Vec<String> = engines.iter().map(EngineHandle::url).collect();
    if let Some(kv) = setup
        .kv_events
        .as_ref()
        .filter(|_| spec.policy == kv::EVENT_POLICY)
    {
        args.extend(kv.replica_args(&engines));
    }
    // A disaggregated fleet's workers come as its two pools.
    let seeds = match setup.disagg {
        Some(_) => Vec::new(),
        None => urls.clone(),
    };
    let cfg = FleetConfig::new(setup.shoal_bin.clone(), spec.replicas, seeds)
        .mesh(spec.mesh)
        .args(args);
    let fleet = Fleet::start(cfg).await.map_err(|e| e.0)?;
    if spec.mesh {
        fleet
            .wait_meshed(Duration::from_secs(30))
            .await
            .map_err(|e| e.0)?;
    }
    // Let every replica (or poll owner) read every engine at least once.
    let poll = Duration::from_millis(setup.wall_ms(setup.poll_interval_model_ms));
    tokio::time::sleep(2 * poll + Duration::from_millis(300)).await;
    let replicas: Vec<String> = (0..fleet.len()).map(|i| fleet.url(i)).collect();
    let before = if spec.mesh {
        mesh_traffic(&fleet).await
    } else {
        None
    };
    let pids: Vec<u32> = (0..fleet.len()).filter_map(|i| fleet.pid(i)).collect();
    let cpu_before = CpuSample::take(&pids);
    let started = Instant::now();
    let stop_probe = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = (spec.policy == kv::EVENT_POLICY && replicas.len() > 1).then(|| {
        tokio::spawn(kv::probe_agreement(
            replicas.clone(),
            std::sync::Arc::new(schedule.clone()),
            started,
            Duration::from_millis(50),
            10_000,
            stop_probe.clone(),
        ))
    });
    let handles = engines.iter().map(|e| e.engine().clone()).collect();
    let load = run_load(schedule, &replicas, handles, &setup.load, progress).await;
    let secs = started.elapsed().as_secs_f64();
    stop_probe.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(probe) = probe
        && let Ok(agreement) = probe.await
    {
        eprintln!("{}", agreement.line());
    }
    let cpu = CpuSample::take(&pids).usage_since(&cpu_before);
    let after = if spec.mesh {
        mesh_traffic(&fleet).await
    } else {
        None
    };
    let traffic = before.zip(after).map(|(b, a)| {
        let mut d = a;
        d.bytes_sent = a.bytes_sent.saturating_sub(b.bytes_sent);
        d.gossip_bytes_sent = a.gossip_bytes_sent.saturating_sub(b.gossip_bytes_sent);
        d.link_wire_bytes = a.link_wire_bytes.saturating_sub(b.link_wire_bytes);
        (d, secs)
    });
    let stats = engine_stats(&HttpClient::new(), &urls).await;
    if spec.policy == kv::EVENT_POLICY {
        eprintln!("{}", kv::traffic_line(&engines, spec.replicas, secs));
    }
    drop(fleet);
    for e in engines {
        e.shutdown().await;
    }
    let id = ScenarioId {
        group: spec.group.clone(),
        policy: spec.policy.clone(),
        engine_flavor: spec.flavor.as_str().to_string(),
        seed: schedule.seed,
        label: spec.label.clone(),
        workload: schedule.workload.clone(),
        replicas: spec.replicas,
        mesh: spec.mesh,
    };
    Ok(summarize(id, schedule.rate, load, stats, traffic, cpu))
}
