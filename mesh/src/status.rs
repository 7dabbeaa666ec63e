//! The serde view behind `/mesh/status`: this node, every member it knows
//! of, per-worker fleet totals with each replica's share, snapshot sources
//! and poll owners, and the traffic counters.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;
use shoal_proto::EngineKind;

use crate::core::Core;
use crate::identity::Incarnation;
use crate::ownership;
use crate::telemetry::TrafficStatus;

/// Everything `/mesh/status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct MeshStatus {
    /// This node's name.
    pub node: String,
    /// This node's generation (start time, µs).
    pub generation: u64,
    /// Cluster id.
    pub cluster_id: String,
    /// Gossip address peers use for this node.
    pub gossip_addr: String,
    /// QUIC load-plane address peers use for this node.
    pub quic_addr: String,
    /// Every other incarnation known from gossip or a load link.
    pub members: Vec<MemberStatus>,
    /// Per-worker fleet totals.
    pub workers: Vec<WorkerStatus>,
    /// Frames, bytes and convergence lag.
    pub traffic: TrafficStatus,
}

/// One other incarnation as this node sees it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    /// Node name.
    pub name: String,
    /// Generation.
    pub generation: u64,
    /// Chitchat's failure detector says alive.
    pub live: bool,
    /// A load link with a certificate naming this node is up.
    pub verified: bool,
    /// Its slots count in the fleet totals.
    pub counted: bool,
    /// It said goodbye.
    pub left: bool,
    /// Published readiness (`serving`, `draining`, `left`).
    pub readiness: Option<String>,
    /// Published version.
    pub version: Option<String>,
    /// Gossip address.
    pub gossip_addr: Option<String>,
    /// Published QUIC address.
    pub quic_addr: Option<String>,
    /// Published HTTP address.
    pub http_addr: Option<String>,
    /// Since its gossip heartbeat last moved, ms.
    pub last_heartbeat_age_ms: Option<u64>,
    /// Since its last load frame, ms.
    pub last_frame_age_ms: Option<u64>,
    /// Source address of its verified load link.
    pub link_addr: Option<String>,
}

/// One replica's share of a worker's in-flight load.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaShare {
    /// `name#generation`.
    pub replica: String,
    /// Requests in flight.
    pub requests: u64,
    /// Token-work in flight.
    pub tokens: u64,
    /// Prompt tokens awaiting a first byte.
    pub pending_prefill: u64,
}

/// The freshest snapshot of a worker.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotStatus {
    /// Engine family.
    pub source: EngineKind,
    /// Replica that polled it.
    pub poller: String,
    /// Poll time, ms since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Since this node learned it, ms.
    pub age_ms: u64,
    /// Fleet dispatched token-work at poll start.
    pub dispatched_mark: u64,
}

/// Fleet view of one worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    /// Worker key (base URL).
    pub worker: String,
    /// Fleet in-flight requests.
    pub inflight_requests: u64,
    /// Fleet in-flight token-work.
    pub inflight_tokens: u64,
    /// Fleet pending prefill tokens.
    pub pending_prefill_tokens: u64,
    /// Fleet dispatched token-work.
    pub dispatched_total: u64,
    /// Dispatched since the freshest snapshot's poll.
    pub dispatched_since_poll: u64,
    /// Each counted replica's share, this node first.
    pub shares: Vec<ReplicaShare>,
    /// Freshest snapshot, if any.
    pub snapshot: Option<SnapshotStatus>,
    /// Poll owner.
    pub owner: Option<String>,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn build(core: &Core, gossip_addr: String, quic_addr: String) -> MeshStatus {
    let owners = core.owners.load_full();
    let entries = core.registry.list();
    let book = core.book();
    let known: BTreeSet<&Incarnation> = book.gossip.keys().chain(book.links.keys()).collect();
    let members = known
        .into_iter()
        .map(|inc| {
            let g = book.gossip.get(inc);
            let link = book.links.get(inc);
            MemberStatus {
                name: inc.name.to_string(),
                generation: inc.generation,
                live: g.is_some_and(|g| g.live),
                verified: link.is_some(),
                counted: book.counted.contains(inc),
                left: book.left.contains(inc),
                readiness: g.and_then(|g| g.readiness.clone()),
                version: g.and_then(|g| g.version.clone()),
                gossip_addr: g.map(|g| g.gossip_addr.to_string()),
                quic_addr: g.and_then(|g| g.quic_addr.map(|a| a.to_string())),
                http_addr: g.and_then(|g| g.http_addr.clone()),
                last_heartbeat_age_ms: book.heartbeat_seen.get(inc).map(|t| ms(t.elapsed())),
                last_frame_age_ms: link.map(|l| ms(l.last_frame.elapsed())),
                link_addr: link.map(|l| l.remote.to_string()),
            }
        })
        .collect();
    let mut counted: Vec<&Incarnation> = book.counted.iter().collect();
    counted.sort();
    let workers = entries
        .iter()
        .map(|entry| {
            let slot = crate::slot::WorkerSlot {
                entry: entry.clone(),
            };
            let fleet = slot.fleet();
            let own = slot.own();
            let mut shares = vec![ReplicaShare {
                replica: core.me.to_string(),
                requests: own.requests,
                tokens: own.tokens,
                pending_prefill: own.pending_prefill,
            }];
            for inc in &counted {
                if let Some(s) = book.state.slot(inc, &entry.key) {
                    shares.push(ReplicaShare {
                        replica: inc.to_string(),
                        requests: s.requests,
                        tokens: s.tokens,
                        pending_prefill: s.pending_prefill,
                    });
                }
            }
            let snapshot = book
                .state
                .snapshot(&entry.key)
                .map(|(value, marker, learned)| SnapshotStatus {
                    source: value.source,
                    poller: marker.1.to_string(),
                    polled_at_unix_ms: marker.0,
                    age_ms: ms(learned.elapsed()),
                    dispatched_mark: value.dispatched_mark,
                });
            WorkerStatus {
                worker: entry.key.to_string(),
                inflight_requests: fleet.inflight_requests,
                inflight_tokens: fleet.inflight_tokens,
                pending_prefill_tokens: fleet.pending_prefill_tokens,
                dispatched_total: fleet.dispatched_total,
                dispatched_since_poll: fleet.dispatched_since_poll(),
                shares,
                snapshot,
                owner: ownership::owner(&owners, &entry.key).map(|o: &Arc<str>| o.to_string()),
            }
        })
        .collect();
    drop(book);
    MeshStatus {
        node: core.me.name.to_string(),
        generation: core.me.generation,
        cluster_id: core.cluster_id.clone(),
        gossip_addr,
        quic_addr,
        members,
        workers,
        traffic: core.telemetry.status(),
    }
}
