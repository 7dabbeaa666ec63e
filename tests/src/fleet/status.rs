//! A lenient, typed reading of a replica's `GET /mesh/status` (the JSON of
//! `shoal_mesh`'s `MeshStatus`): only the fields the tests and the demo use,
//! every one defaulted so a newer replica with more fields still parses.

use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::Value;

/// `GET /mesh/status` of one replica.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MeshStatus {
    /// This node's name.
    pub node: String,
    /// This node's generation (start time, µs).
    pub generation: u64,
    /// Cluster id.
    pub cluster_id: String,
    /// Gossip address peers use.
    pub gossip_addr: String,
    /// QUIC load-plane address peers use.
    pub quic_addr: String,
    /// Every other incarnation the node knows of.
    pub members: Vec<Member>,
    /// Per-worker fleet totals.
    pub workers: Vec<WorkerLoad>,
    /// Frames, bytes and convergence lag, as sent.
    pub traffic: Value,
    /// What the node's fleet state holds (newer replicas only), as sent.
    pub footprint: Option<Value>,
}

/// One other incarnation as the node sees it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Member {
    /// Node name.
    pub name: String,
    /// Generation.
    pub generation: u64,
    /// Alive by gossip.
    pub live: bool,
    /// Its load link is up with a certificate naming it.
    pub verified: bool,
    /// Its slots count in the fleet totals.
    pub counted: bool,
    /// It said goodbye.
    pub left: bool,
    /// Published readiness (`serving`, `draining`, `left`).
    pub readiness: Option<String>,
    /// Published HTTP address.
    pub http_addr: Option<String>,
    /// Since its last load frame, ms.
    pub last_frame_age_ms: Option<u64>,
}

/// One replica's share of a worker's in-flight load.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Share {
    /// `name#generation`.
    pub replica: String,
    /// Requests in flight.
    pub requests: u64,
    /// Token-work in flight.
    pub tokens: u64,
    /// Prompt tokens awaiting a first byte.
    pub pending_prefill: u64,
    /// Token-work this incarnation routed there since the snapshot it
    /// counts from (newer replicas only).
    pub dispatched_since_poll: Option<u64>,
    /// Poll time of that snapshot, ms since the Unix epoch (newer replicas
    /// only).
    pub basis_polled_at_unix_ms: Option<u64>,
}

impl Share {
    /// The node name part of `replica`.
    pub fn name(&self) -> &str {
        self.replica.split('#').next().unwrap_or_default()
    }

    /// The generation part of `replica`.
    pub fn generation(&self) -> Option<u64> {
        self.replica
            .split_once('#')
            .and_then(|(_, g)| g.parse().ok())
    }
}

/// The freshest snapshot of a worker.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SnapshotInfo {
    /// Engine family.
    pub source: Value,
    /// Replica that polled it.
    pub poller: String,
    /// Poll time, ms since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Age of the engine's numbers (from the poll time), ms.
    pub age_ms: u64,
}

/// Fleet view of one worker.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct WorkerLoad {
    /// Worker key (base URL).
    pub worker: String,
    /// Fleet in-flight requests.
    pub inflight_requests: u64,
    /// Fleet in-flight token-work.
    pub inflight_tokens: u64,
    /// Fleet pending prefill tokens.
    pub pending_prefill_tokens: u64,
    /// Dispatched since the freshest snapshot's poll.
    pub dispatched_since_poll: u64,
    /// Each counted replica's share, the node itself first.
    pub shares: Vec<Share>,
    /// Freshest snapshot, if any.
    pub snapshot: Option<SnapshotInfo>,
    /// Poll owner.
    pub owner: Option<String>,
    /// Replicas that have polled it (newer replicas only).
    pub pollers: Vec<String>,
}

impl WorkerLoad {
    /// In-flight requests of replica `name`'s shares (any generation).
    pub fn requests_from(&self, name: &str) -> u64 {
        self.shares
            .iter()
            .filter(|s| s.name() == name)
            .map(|s| s.requests)
            .sum()
    }
}

/// `a` and `b` name the same base URL (ignoring a trailing slash).
pub fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

impl MeshStatus {
    /// Names of the peers whose load counts, sorted.
    pub fn counted_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.counted)
            .map(|m| m.name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// Every incarnation of node `name` this node knows of.
    pub fn members_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Member> + 'a {
        self.members.iter().filter(move |m| m.name == name)
    }

    /// The fleet view of the worker at `url`.
    pub fn worker(&self, url: &str) -> Option<&WorkerLoad> {
        self.workers.iter().find(|w| same_url(&w.worker, url))
    }

    /// Fleet in-flight requests summed over all workers.
    pub fn total_inflight(&self) -> u64 {
        self.workers.iter().map(|w| w.inflight_requests).sum()
    }

    /// In-flight requests of replica `name`'s shares over all workers.
    pub fn inflight_from(&self, name: &str) -> u64 {
        self.workers.iter().map(|w| w.requests_from(name)).sum()
    }

    /// The per-worker fleet in-flight as a small table: worker, requests,
    /// tokens, each replica's share of requests, the poll owner.
    pub fn fleet_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "  {:<26} {:>8} {:>8}  {:<8} shares (replica=requests)",
            "worker", "requests", "tokens", "owner"
        );
        for w in &self.workers {
            let shares: Vec<String> = w
                .shares
                .iter()
                .map(|s| format!("{}={}", s.name(), s.requests))
                .collect();
            let _ = writeln!(
                out,
                "  {:<26} {:>8} {:>8}  {:<8} {}",
                w.worker,
                w.inflight_requests,
                w.inflight_tokens,
                w.owner.as_deref().unwrap_or("-"),
                shares.join(" ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker with the per-incarnation fields: pollers, per-share counts
    /// and a footprint.
    const NEW: &str = r#"{"node":"b","generation":7,"members":[],"workers":[{
        "worker":"http://w:1","inflight_requests":0,"inflight_tokens":0,
        "pending_prefill_tokens":0,"dispatched_since_poll":72,"pollers":["a","c"],
        "shares":[{"replica":"b#7","requests":0,"tokens":0,"pending_prefill":0,
                   "dispatched_since_poll":72,"basis_polled_at_unix_ms":5}],
        "snapshot":{"source":"sglang","poller":"a","polled_at_unix_ms":5,"age_ms":1},
        "owner":"a"}],"footprint":{"incarnations":3}}"#;

    #[test]
    fn reads_the_per_incarnation_worker_fields() {
        let new: MeshStatus = serde_json::from_str(NEW).unwrap();
        let w = &new.workers[0];
        assert_eq!(w.dispatched_since_poll, 72);
        assert_eq!(w.pollers, ["a", "c"]);
        assert_eq!(w.shares[0].dispatched_since_poll, Some(72));
        assert_eq!(w.shares[0].basis_polled_at_unix_ms, Some(5));
        assert_eq!(new.footprint.as_ref().unwrap()["incarnations"], 3);
    }
}
