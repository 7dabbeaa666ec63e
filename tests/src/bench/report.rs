//! Per-scenario figures of the fleet benchmark: what the engines' `/stats`
//! and the replicas' `/mesh/status` say, the summary of one scenario, and
//! the markdown table.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::cpu::CpuUsage;
use super::driver::{KvSample, LoadResult, quantile};
use crate::client::HttpClient;
use crate::fleet::Fleet;

/// Engine-side figures from every engine's `GET /stats`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    /// Queue wait (arrival to first admission) of every finished request, ms.
    #[serde(skip)]
    pub queue_ms: Vec<f64>,
    /// Requests each engine finished (in engine order).
    pub finished_per_engine: Vec<u64>,
    /// Preemptions (KV overflow) summed over engines.
    pub preemptions: u64,
    /// Cached / total prompt tokens over all engines.
    pub cache_hit_rate: f64,
    /// Load-endpoint polls the engines served.
    pub load_polls: u64,
}

/// Reads `GET /stats` of every engine (all records kept by the ring).
pub async fn engine_stats(client: &HttpClient, engine_urls: &[String]) -> EngineStats {
    let mut out = EngineStats::default();
    let (mut prompt, mut cached) = (0.0, 0.0);
    for url in engine_urls {
        let v = match client.get(&format!("{url}/stats")).await {
            Ok(r) if r.status == 200 => r.json().unwrap_or_default(),
            _ => Value::Null,
        };
        let num = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
        out.preemptions += num("/snapshot/counters/preemptions") as u64;
        out.load_polls += num("/load_polls") as u64;
        prompt += num("/snapshot/counters/prompt_tokens_total");
        cached += num("/snapshot/counters/cached_prompt_tokens_total");
        let recent = v
            .get("recent")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        out.finished_per_engine.push(recent.len() as u64);
        out.queue_ms.extend(
            recent
                .iter()
                .filter_map(|r| r.get("queue_ms").and_then(Value::as_f64)),
        );
    }
    out.cache_hit_rate = if prompt > 0.0 { cached / prompt } else { 0.0 };
    out
}

/// Mesh traffic summed over the replicas (counters are cumulative).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MeshTraffic {
    /// Load-plane payload bytes sent.
    pub bytes_sent: u64,
    /// Gossip bytes sent.
    pub gossip_bytes_sent: u64,
    /// UDP bytes of the load links (QUIC overhead included).
    pub link_wire_bytes: u64,
    /// Median over replicas of their median convergence lag, ms.
    pub lag_p50_ms: Option<f64>,
    /// Highest over replicas of their p99 convergence lag, ms.
    pub lag_p99_ms: Option<f64>,
}

/// Reads every replica's `/mesh/status` traffic counters (`None` without
/// the mesh).
pub async fn mesh_traffic(fleet: &Fleet) -> Option<MeshTraffic> {
    let mut t = MeshTraffic::default();
    let mut p50s = Vec::new();
    let mut p99: Option<f64> = None;
    for i in 0..fleet.len() {
        let s = fleet.status(i).await.ok()?;
        let n = |k: &str| s.traffic.get(k).and_then(Value::as_u64).unwrap_or(0);
        t.bytes_sent += n("bytes_sent");
        t.gossip_bytes_sent += n("gossip_bytes_sent");
        t.link_wire_bytes += n("link_wire_bytes");
        let f = |k: &str| s.traffic.get(k).and_then(Value::as_f64);
        if let Some(v) = f("convergence_lag_p50_ms") {
            p50s.push(v);
        }
        if let Some(v) = f("convergence_lag_p99_ms") {
            p99 = Some(p99.map_or(v, |m| m.max(v)));
        }
    }
    t.lag_p50_ms = (!p50s.is_empty()).then(|| quantile(&p50s, 0.5));
    t.lag_p99_ms = p99;
    Some(t)
}

/// The figures of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// `group/label`, e.g. `least_load/mesh` or `least_load_vllm/oracle`.
    pub name: String,
    /// The `--policies` entry (policy × workload × engine flavor).
    pub group: String,
    /// Routing policy (`shoal --policy`).
    pub policy: String,
    /// Mock engines' load-endpoint flavor (`sglang`, `vllm`).
    pub engine_flavor: String,
    /// Seed of the arrival and size sequence.
    pub seed: u64,
    /// `oracle`, `no-mesh` or `mesh`.
    pub label: String,
    /// Workload kind.
    pub workload: String,
    /// Replicas.
    pub replicas: usize,
    /// Mesh on.
    pub mesh: bool,
    /// Offered load, requests per wall second.
    pub offered_rps: f64,
    /// Requests sent.
    pub sent: u64,
    /// Requests completed.
    pub completed: u64,
    /// Failed requests.
    pub errors: u64,
    /// Requests that timed out.
    pub timeouts: u64,
    /// Arrivals dropped by the generator's in-flight cap.
    pub dropped: u64,
    /// First few error messages.
    pub error_samples: Vec<String>,
    /// Completed requests per wall second.
    pub completed_rps: f64,
    /// Client TTFT p50, ms.
    pub ttft_p50_ms: f64,
    /// Client TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// Every completed request's client TTFT, ms (for pooling over seeds;
    /// not written to the JSON).
    #[serde(skip)]
    pub ttft_samples_ms: Vec<f64>,
    /// Engine queue wait p50, ms.
    pub queue_p50_ms: f64,
    /// Engine queue wait p99, ms.
    pub queue_p99_ms: f64,
    /// Client end-to-end p99, ms.
    pub e2e_p99_ms: f64,
    /// Mean of the sampled KV spread (max − min), percentage points.
    pub kv_spread_mean_pct: f64,
    /// p99 of the sampled KV spread, percentage points.
    pub kv_spread_p99_pct: f64,
    /// Seconds any engine spent above the KV threshold.
    pub kv_high_secs: f64,
    /// Generator send lag p99, ms (how late arrivals went out: load on the box).
    pub send_lag_p99_ms: f64,
    /// Engine-side figures.
    pub engines: EngineStats,
    /// Mesh traffic during the load (mesh scenarios).
    pub mesh_traffic: Option<MeshTraffic>,
    /// Mesh load-plane + gossip bytes per second, all replicas.
    pub mesh_bytes_per_s: Option<f64>,
    /// Cores used during the load by the replicas, the engines and the box.
    pub cpu: CpuUsage,
    /// KV samples over time.
    pub kv_series: Vec<KvSample>,
}

/// Scenario identity: (group, policy, engine flavor, seed, label, workload,
/// replicas, mesh).
#[derive(Debug, Clone)]
pub struct ScenarioId {
    /// The `--policies` entry.
    pub group: String,
    /// Routing policy.
    pub policy: String,
    /// Mock engines' flavor name.
    pub engine_flavor: String,
    /// Seed of the arrivals.
    pub seed: u64,
    /// `oracle`, `no-mesh` or `mesh`.
    pub label: String,
    /// Workload kind name.
    pub workload: String,
    /// Replicas.
    pub replicas: usize,
    /// Mesh on.
    pub mesh: bool,
}

/// Builds the figures of one scenario.
pub fn summarize(
    id: ScenarioId,
    offered_rps: f64,
    load: LoadResult,
    engines: EngineStats,
    traffic: Option<(MeshTraffic, f64)>,
    cpu: CpuUsage,
) -> ScenarioResult {
    let secs = load.elapsed.as_secs_f64().max(1e-9);
    let spreads: Vec<f64> = load.kv.iter().map(|s| 100.0 * s.spread).collect();
    let spread_mean = if spreads.is_empty() {
        f64::NAN
    } else {
        spreads.iter().sum::<f64>() / spreads.len() as f64
    };
    let mesh_bytes_per_s =
        traffic.map(|(t, s)| (t.bytes_sent + t.gossip_bytes_sent) as f64 / s.max(1e-9));
    ScenarioResult {
        name: format!("{}/{}", id.group, id.label),
        group: id.group,
        policy: id.policy,
        engine_flavor: id.engine_flavor,
        seed: id.seed,
        label: id.label,
        workload: id.workload,
        replicas: id.replicas,
        mesh: id.mesh,
        offered_rps,
        sent: load.sent,
        completed: load.completed,
        errors: load.errors,
        timeouts: load.timeouts,
        dropped: load.dropped,
        error_samples: load.error_samples,
        completed_rps: load.completed as f64 / secs,
        ttft_p50_ms: quantile(&load.ttft_ms, 0.5),
        ttft_p99_ms: quantile(&load.ttft_ms, 0.99),
        ttft_samples_ms: load.ttft_ms.clone(),
        queue_p50_ms: quantile(&engines.queue_ms, 0.5),
        queue_p99_ms: quantile(&engines.queue_ms, 0.99),
        e2e_p99_ms: quantile(&load.e2e_ms, 0.99),
        kv_spread_mean_pct: spread_mean,
        kv_spread_p99_pct: quantile(&spreads, 0.99),
        kv_high_secs: load.kv_high_secs,
        send_lag_p99_ms: quantile(&load.send_lag_ms, 0.99),
        engines,
        mesh_traffic: traffic.map(|(t, _)| t),
        mesh_bytes_per_s,
        cpu,
        kv_series: load.kv,
    }
}

/// `v` with `digits` decimals, `–` when absent or not finite.
pub fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "–".to_string(), |x| format!("{x:.digits$}"))
}

/// The results of one seed as a markdown table; `× oracle` compares TTFT
/// p99 with the oracle of the same group and seed; the CPU columns are
/// cores used during the load (replicas; engines + load generator; whole
/// box).
pub fn markdown_table(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | R | TTFT p50 ms | TTFT p99 ms | p99 × oracle | queue p99 ms | e2e p99 ms \
         | KV spread mean / p99 pp | >95% KV s | done req/s | errors | cache hit | mesh lag p50 / p99 ms | mesh KB/s \
         | replicas CPU cores | engines+gen CPU cores | box CPU cores |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let oracle = results
            .iter()
            .find(|o| o.group == r.group && o.seed == r.seed && o.label == "oracle")
            .map(|o| o.ttft_p99_ms);
        let ratio = oracle.map(|o| r.ttft_p99_ms / o);
        let lag = r.mesh_traffic.map_or_else(
            || "–".to_string(),
            |t| format!("{} / {}", opt(t.lag_p50_ms, 1), opt(t.lag_p99_ms, 1)),
        );
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.1} / {:.1} | {:.1} | {:.1} | {} | {:.0}% | {} | {} | {} | {} | {} |",
            r.name,
            r.replicas,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            opt(ratio, 2),
            r.queue_p99_ms,
            r.e2e_p99_ms,
            r.kv_spread_mean_pct,
            r.kv_spread_p99_pct,
            r.kv_high_secs,
            r.completed_rps,
            r.errors + r.timeouts + r.dropped,
            100.0 * r.engines.cache_hit_rate,
            lag,
            opt(r.mesh_bytes_per_s.map(|b| b / 1e3), 1),
            opt(r.cpu.replicas_cores, 2),
            opt(r.cpu.engines_cores, 2),
            opt(r.cpu.machine_cores, 2),
        );
    }
    out
}
