//! The serde view behind `/mesh/status`: this node, every member it knows
//! of, per-worker fleet totals with each replica incarnation's share
//! (including the work since the poll it contributes, and the snapshot it
//! counts from), snapshot sources and poll owners, the traffic counters and
//! the footprint of what the node keeps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use shoal_proto::{EngineKind, LoadCounts};

use crate::core::{Core, Tables};
use crate::housekeeping::stale_basis_tokens;
use crate::identity::Incarnation;
use crate::ownership;
use crate::slot::{WorkerEntry, WorkerSlot};
use crate::state::StateFootprint;
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
    /// `traffic.frames_dropped` by reason (the labels of
    /// `shoal_mesh_frames_dropped_total`), so an operator sees why.
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// How much this node keeps (bounded by the live fleet).
    pub footprint: Footprint,
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
    /// Published poll-ownership hash version (absent: version 1).
    pub ownership_hash: Option<String>,
    /// It shares poll ownership with this node (counted, and it hashes as
    /// this node does); a counted member that does not elects owners
    /// with the members of its own hash version.
    pub co_owner: bool,
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

/// One replica incarnation's own counts for a worker: what it contributes
/// to the fleet sums, so an operator can see who disagrees.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaShare {
    /// `name#generation`.
    pub replica: String,
    /// Its own counts (in flight, and work since the snapshot it counts
    /// from), as JSON fields of the share itself.
    #[serde(flatten)]
    pub counts: LoadCounts,
    /// Poll time (ms) of that snapshot; 0 before its first.
    pub basis_polled_at_unix_ms: u64,
}

/// The freshest snapshot of a worker.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotStatus {
    /// Engine family.
    pub source: EngineKind,
    /// Replica that polled it.
    pub poller: String,
    /// Poll time, ms since the Unix epoch, as stored (clamped to this
    /// replica's clock plus the skew bound).
    pub polled_at_unix_ms: u64,
    /// Poll time as the poller claimed it.
    pub claimed_polled_at_unix_ms: u64,
    /// Age of the engine's numbers, ms, measured from the poll time.
    pub age_ms: u64,
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
    /// Fleet token-work routed since the engine's last report: the sum of
    /// every counted incarnation's own count (the shares).
    pub dispatched_since_poll: u64,
    /// Part of that counted from an older snapshot than the freshest here
    /// (transient; lasting means replicas disagree).
    pub stale_basis_tokens: u64,
    /// Each counted replica's share, this node first.
    pub shares: Vec<ReplicaShare>,
    /// Freshest snapshot, if any.
    pub snapshot: Option<SnapshotStatus>,
    /// Poll owner among the replicas that poll it.
    pub owner: Option<String>,
    /// Replicas that poll it (this node included if it does), sorted.
    pub pollers: Vec<String>,
}

/// How much a node keeps; every number follows the live fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Footprint {
    /// Worker keys this node holds.
    pub worker_keys: usize,
    /// Wire ids handed out (ids are reused, so this tracks the peak).
    pub wire_ids: u32,
    /// Entries of the CRDT state.
    pub state: StateFootprint,
    /// Incarnations gossip lists (chitchat forgets the dead after its grace).
    pub gossip_members: usize,
    /// Verified load links.
    pub links: usize,
    /// Incarnations that said goodbye, not yet forgotten.
    pub left: usize,
    /// Incarnations not counted, waiting to be forgotten.
    pub dead: usize,
    /// Worker keys waiting to be forgotten.
    pub idle_keys: usize,
    /// Per-worker own poll times kept.
    pub own_poll_times: usize,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn footprint_of(core: &Core, tables: &Tables) -> Footprint {
    let (worker_keys, wire_ids) = core.worker_keys.sizes();
    Footprint {
        worker_keys,
        wire_ids,
        state: tables.state.footprint(),
        gossip_members: tables.gossip.len(),
        links: tables.links.len(),
        left: tables.left.len(),
        dead: tables.dead_since.len(),
        idle_keys: tables.idle_keys.len(),
        own_poll_times: tables.own_polled_at.len(),
    }
}

pub(crate) fn dropped_by_reason(core: &Core) -> BTreeMap<String, u64> {
    core.telemetry
        .drops()
        .into_iter()
        .map(|(reason, n)| (reason.to_string(), n))
        .collect()
}

pub(crate) fn footprint(core: &Core) -> Footprint {
    let tables = core.tables();
    footprint_of(core, &tables)
}

fn worker_status(
    core: &Core,
    tables: &Tables,
    counted: &[&Incarnation],
    entry: &Arc<WorkerEntry>,
) -> WorkerStatus {
    let slot = WorkerSlot {
        entry: entry.clone(),
    };
    let fleet = slot.fleet();
    let mut shares = vec![ReplicaShare {
        replica: core.me.to_string(),
        counts: slot.own(),
        basis_polled_at_unix_ms: slot.basis_polled_at_unix_ms(),
    }];
    for inc in counted {
        if let Some(s) = tables.state.slot(inc, &entry.key) {
            shares.push(ReplicaShare {
                replica: inc.to_string(),
                counts: s.counts,
                basis_polled_at_unix_ms: s.basis_ms,
            });
        }
    }
    let now = Instant::now();
    let snapshot = tables.state.snapshot(&entry.key).map(|s| SnapshotStatus {
        source: s.value.source,
        poller: s.poller.to_string(),
        polled_at_unix_ms: s.polled_at_ms,
        claimed_polled_at_unix_ms: s.value.claimed_polled_at_ms,
        age_ms: ms(now.saturating_duration_since(s.taken_at)),
    });
    let pollers = entry.pollers(&core.me.name);
    WorkerStatus {
        worker: entry.key.to_string(),
        inflight_requests: fleet.counts.requests,
        inflight_tokens: fleet.counts.tokens,
        pending_prefill_tokens: fleet.counts.pending_prefill,
        dispatched_since_poll: fleet.counts.dispatched_since_poll,
        stale_basis_tokens: stale_basis_tokens(tables, &core.me, entry),
        shares,
        snapshot,
        owner: ownership::owner(&pollers, &entry.key).map(|o| o.to_string()),
        pollers: pollers.iter().map(|p| p.to_string()).collect(),
    }
}

pub(crate) fn build(core: &Core, gossip_addr: String, quic_addr: String) -> MeshStatus {
    let entries = core.worker_keys.list();
    let tables = core.tables();
    let known: BTreeSet<&Incarnation> = tables.gossip.keys().chain(tables.links.keys()).collect();
    let members = known
        .into_iter()
        .map(|inc| {
            let g = tables.gossip.get(inc);
            let link = tables.links.get(inc);
            MemberStatus {
                name: inc.name.to_string(),
                generation: inc.generation,
                live: g.is_some_and(|g| g.live),
                verified: link.is_some(),
                counted: tables.counted.contains(inc),
                left: tables.left.contains(inc),
                readiness: g.and_then(|g| g.readiness.clone()),
                version: g.and_then(|g| g.version.clone()),
                ownership_hash: g.and_then(|g| g.ownership_hash.clone()),
                co_owner: tables.co_owners.contains(inc),
                gossip_addr: g.map(|g| g.gossip_addr.to_string()),
                quic_addr: g.and_then(|g| g.quic_addr.map(|a| a.to_string())),
                http_addr: g.and_then(|g| g.http_addr.clone()),
                last_heartbeat_age_ms: tables.heartbeat_seen.get(inc).map(|t| ms(t.elapsed())),
                last_frame_age_ms: link.map(|l| ms(l.last_frame.elapsed())),
                link_addr: link.map(|l| l.remote.to_string()),
            }
        })
        .collect();
    let mut counted: Vec<&Incarnation> = tables.counted.iter().collect();
    counted.sort();
    let workers = entries
        .iter()
        .map(|entry| worker_status(core, &tables, &counted, entry))
        .collect();
    let footprint = footprint_of(core, &tables);
    drop(tables);
    MeshStatus {
        node: core.me.name.to_string(),
        generation: core.me.generation,
        cluster_id: core.cluster_id.clone(),
        gossip_addr,
        quic_addr,
        members,
        workers,
        traffic: core.telemetry.status(),
        dropped_by_reason: dropped_by_reason(core),
        footprint,
    }
}
