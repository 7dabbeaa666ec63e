//! Mesh counters: kept as atomics for `/mesh/status` and mirrored to the
//! `metrics` facade for Prometheus.
//!
//! Metric names: `shoal_mesh_members`, `shoal_mesh_peers_connected`,
//! `shoal_mesh_foreign_ownership_hash_peers` (gauges);
//! `shoal_mesh_frames_sent_total`, `shoal_mesh_frames_received_total`,
//! `shoal_mesh_packed_frames_received_total`,
//! `shoal_mesh_frames_dropped_total{reason}`, `shoal_mesh_bytes_sent_total`,
//! `shoal_mesh_bytes_received_total`, `shoal_mesh_gossip_bytes_sent_total`,
//! `shoal_mesh_gossip_bytes_received_total`, `shoal_mesh_link_wire_bytes_total`,
//! `shoal_mesh_link_resyncs_total`, `shoal_mesh_sightings_received_total`,
//! `shoal_mesh_sightings_dropped_total`, `shoal_mesh_poll_times_clamped_total`,
//! `shoal_mesh_rebase_history_short_total`,
//! `shoal_mesh_worker_set_bytes_sent_total`, `shoal_mesh_objects_received_total`,
//! `shoal_mesh_objects_dropped_total` (counters);
//! `shoal_mesh_convergence_lag_seconds` (histogram: from the sender's
//! previous read of its slots to the merge here, an upper bound on how stale
//! a change carried by the frame was when it became visible).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

const LAG_SAMPLES: usize = 2048;

/// Counters of one mesh node.
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    packed_frames_received: AtomicU64,
    frames_dropped: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    gossip_bytes_sent: AtomicU64,
    gossip_bytes_received: AtomicU64,
    link_wire_bytes: AtomicU64,
    worker_set_bytes_sent: AtomicU64,
    rebase_history_short: AtomicU64,
    /// `frames_dropped` by reason (reasons are a fixed set of labels).
    drops: Mutex<BTreeMap<&'static str, u64>>,
    lag_us: Mutex<VecDeque<u64>>,
}

/// Totals for `/mesh/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TrafficStatus {
    /// Load frames sent to peers.
    pub frames_sent: u64,
    /// Load frames received and accepted.
    pub frames_received: u64,
    /// Of those, frames with packed slot changes: 0 while peers exist means
    /// none of them packs (a build from before packing, mid-rollout).
    pub packed_frames_received: u64,
    /// Frames, connections and datagrams dropped as bad or unauthenticated.
    pub frames_dropped: u64,
    /// Load-plane payload bytes sent (frames with their length prefix).
    pub bytes_sent: u64,
    /// Load-plane payload bytes received.
    pub bytes_received: u64,
    /// Gossip bytes sent (chitchat datagrams).
    pub gossip_bytes_sent: u64,
    /// Gossip bytes received (valid chitchat datagrams).
    pub gossip_bytes_received: u64,
    /// UDP bytes (both ways, QUIC headers, ACKs and keep-alives included)
    /// of this node's outbound load links.
    pub link_wire_bytes: u64,
    /// Worker-set frame bytes sent (own writes, whole sets to new links,
    /// digests and repairs), summed over links.
    pub worker_set_bytes_sent: u64,
    /// Peer snapshots older than the own dispatch history reaches: the own
    /// count was rebased to the history's oldest sample instead.
    pub rebase_history_short: u64,
    /// Median convergence lag over the recent frames, ms.
    pub convergence_lag_p50_ms: Option<f64>,
    /// 99th percentile of the same, ms.
    pub convergence_lag_p99_ms: Option<f64>,
}

impl Telemetry {
    /// Counts `frames` frames of `bytes` bytes in all written on one link.
    pub(crate) fn frames_sent(&self, frames: usize, bytes: usize) {
        self.frames_sent.fetch_add(frames as u64, Ordering::Relaxed);
        self.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_frames_sent_total").increment(frames as u64);
        metrics::counter!("shoal_mesh_bytes_sent_total").increment(bytes as u64);
    }

    /// A link fell too many rounds behind and was sent the transcript again.
    pub(crate) fn link_resync(&self) {
        metrics::counter!("shoal_mesh_link_resyncs_total").increment(1);
    }

    pub(crate) fn frame_received(&self, bytes: usize) {
        self.frames_received.fetch_add(1, Ordering::Relaxed);
        self.bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_frames_received_total").increment(1);
        metrics::counter!("shoal_mesh_bytes_received_total").increment(bytes as u64);
    }

    /// Counts one received frame of packed slot changes (after
    /// [`Telemetry::frame_received`]).
    pub(crate) fn packed_frame_received(&self) {
        self.packed_frames_received.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_packed_frames_received_total").increment(1);
    }

    /// Counts object pairs a peer reported (see `objects`).
    pub(crate) fn objects_received(&self, entries: usize) {
        metrics::counter!("shoal_mesh_objects_received_total").increment(entries as u64);
    }

    /// Counts prompt keys a peer reported seeing (see `sightings`).
    pub(crate) fn sightings_received(&self, keys: usize) {
        metrics::counter!("shoal_mesh_sightings_received_total").increment(keys as u64);
    }

    /// Counts one dropped frame, refused connection or bad entry.
    pub(crate) fn dropped(&self, reason: &'static str) {
        self.frames_dropped.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut drops) = self.drops.lock() {
            *drops.entry(reason).or_default() += 1;
        }
        metrics::counter!("shoal_mesh_frames_dropped_total", "reason" => reason).increment(1);
    }

    /// Counts worker-set bytes written on one link.
    pub(crate) fn worker_set_sent(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.worker_set_bytes_sent
            .fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_worker_set_bytes_sent_total").increment(bytes as u64);
    }

    /// The drops so far, by reason.
    pub(crate) fn drops(&self) -> BTreeMap<&'static str, u64> {
        self.drops.lock().map(|d| d.clone()).unwrap_or_default()
    }

    pub(crate) fn gossip_sent(&self, bytes: usize) {
        self.gossip_bytes_sent
            .fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_gossip_bytes_sent_total").increment(bytes as u64);
    }

    pub(crate) fn gossip_received(&self, bytes: usize) {
        self.gossip_bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_gossip_bytes_received_total").increment(bytes as u64);
    }

    pub(crate) fn link_wire(&self, bytes: u64) {
        self.link_wire_bytes.fetch_add(bytes, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_link_wire_bytes_total").increment(bytes);
    }

    pub(crate) fn lag(&self, lag: Duration) {
        metrics::histogram!("shoal_mesh_convergence_lag_seconds").record(lag.as_secs_f64());
        if let Ok(mut samples) = self.lag_us.lock() {
            if samples.len() == LAG_SAMPLES {
                samples.pop_front();
            }
            samples.push_back(u64::try_from(lag.as_micros()).unwrap_or(u64::MAX));
        }
    }

    /// A peer's snapshot claimed a poll time past this clock plus the skew
    /// bound (its clock runs ahead, or it lies): stored clamped.
    pub(crate) fn clamped_poll_time(&self) {
        metrics::counter!("shoal_mesh_poll_times_clamped_total").increment(1);
    }

    /// A peer's snapshot is older than the own dispatch history reaches:
    /// the own count was rebased to the oldest sample the history holds.
    pub(crate) fn rebase_history_short(&self) {
        self.rebase_history_short.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("shoal_mesh_rebase_history_short_total").increment(1);
    }

    /// The largest cross-replica disagreement on work since the poll this
    /// replica can see, over all workers (see `housekeeping`).
    pub(crate) fn stale_basis(&self, tokens: u64) {
        metrics::gauge!("shoal_mesh_stale_basis_tokens").set(tokens as f64);
    }

    pub(crate) fn membership(&self, members: usize, connected: usize, foreign_hash: usize) {
        metrics::gauge!("shoal_mesh_members").set(members as f64);
        metrics::gauge!("shoal_mesh_peers_connected").set(connected as f64);
        metrics::gauge!("shoal_mesh_foreign_ownership_hash_peers").set(foreign_hash as f64);
    }

    pub(crate) fn status(&self) -> TrafficStatus {
        let (p50, p99) = match self.lag_us.lock() {
            Ok(samples) => {
                let mut sorted: Vec<u64> = samples.iter().copied().collect();
                sorted.sort_unstable();
                (percentile(&sorted, 0.50), percentile(&sorted, 0.99))
            }
            Err(_) => (None, None),
        };
        TrafficStatus {
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            packed_frames_received: self.packed_frames_received.load(Ordering::Relaxed),
            frames_dropped: self.frames_dropped.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            gossip_bytes_sent: self.gossip_bytes_sent.load(Ordering::Relaxed),
            gossip_bytes_received: self.gossip_bytes_received.load(Ordering::Relaxed),
            link_wire_bytes: self.link_wire_bytes.load(Ordering::Relaxed),
            worker_set_bytes_sent: self.worker_set_bytes_sent.load(Ordering::Relaxed),
            rebase_history_short: self.rebase_history_short.load(Ordering::Relaxed),
            convergence_lag_p50_ms: p50,
            convergence_lag_p99_ms: p99,
        }
    }
}

/// Nearest-rank percentile of sorted µs samples, in ms.
fn percentile(sorted: &[u64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    let idx = rank.clamp(1, sorted.len()) - 1;
    sorted.get(idx).map(|us| *us as f64 / 1000.0)
}

/// Registers HELP text and units for every mesh metric with the installed
/// `metrics` recorder, so Prometheus exposition carries `# HELP` lines.
/// Call it once after the recorder is installed (the router does).
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    // Drops are rare: their series start at 0 so dashboards read 0.
    for reason in [
        "handshake",
        "no_hello",
        "wrong_cluster",
        "unverified",
        "oversize",
        "undecodable",
        "version",
        "unexpected_hello",
        "oversize_sightings",
        "worker_set_forged_origin",
        "worker_set_future",
        "worker_set_full",
        "worker_digest_shape",
        "worker_digest_early",
        "oversize_objects",
        "bad_object",
        "oversize_tenants",
        "bad_tenant_name",
        "bad_tenant_seconds",
        "tenant_clock",
        "unknown_tenant",
    ] {
        metrics::counter!("shoal_mesh_frames_dropped_total", "reason" => reason).increment(0);
    }
    metrics::counter!("shoal_mesh_link_resyncs_total").increment(0);
    metrics::counter!("shoal_mesh_worker_set_bytes_sent_total").increment(0);
    metrics::counter!("shoal_mesh_sightings_dropped_total").increment(0);
    metrics::counter!("shoal_mesh_objects_dropped_total").increment(0);
    describe_counter!(
        "shoal_mesh_objects_received_total",
        "Stored-object locations (object id, worker) peers reported."
    );
    describe_counter!(
        "shoal_mesh_objects_dropped_total",
        "Stored-object locations not shared: the outbound queue was full, or the id or URL too long."
    );
    describe_counter!(
        "shoal_mesh_sightings_received_total",
        "Prompt keys peers reported seeing for the first time (fleet-wide affinity evidence)."
    );
    describe_counter!(
        "shoal_mesh_sightings_dropped_total",
        "Prompt keys not shared because the outbound queue was full."
    );
    describe_gauge!(
        "shoal_mesh_members",
        "Live verified mesh members, this replica included."
    );
    describe_gauge!(
        "shoal_mesh_peers_connected",
        "Peers with an mTLS QUIC load link up."
    );
    describe_gauge!(
        "shoal_mesh_foreign_ownership_hash_peers",
        "Counted peers that gossip another poll-ownership hash version (a mixed-version rollout): they elect poll owners among themselves."
    );
    describe_counter!(
        "shoal_mesh_frames_sent_total",
        "Load-plane frames sent to peers."
    );
    describe_counter!(
        "shoal_mesh_frames_received_total",
        "Load-plane frames received and accepted."
    );
    describe_counter!(
        "shoal_mesh_packed_frames_received_total",
        "Load-plane frames received with packed slot changes."
    );
    describe_counter!(
        "shoal_mesh_frames_dropped_total",
        "Frames, links and datagrams dropped as bad or unauthenticated, by reason."
    );
    describe_counter!(
        "shoal_mesh_bytes_sent_total",
        Unit::Bytes,
        "Load-plane frame bytes sent."
    );
    describe_counter!(
        "shoal_mesh_bytes_received_total",
        Unit::Bytes,
        "Load-plane frame bytes received."
    );
    describe_counter!(
        "shoal_mesh_gossip_bytes_sent_total",
        Unit::Bytes,
        "Gossip (chitchat) bytes sent."
    );
    describe_counter!(
        "shoal_mesh_gossip_bytes_received_total",
        Unit::Bytes,
        "Gossip (chitchat) bytes received from valid datagrams."
    );
    describe_counter!(
        "shoal_mesh_link_wire_bytes_total",
        Unit::Bytes,
        "UDP bytes of this replica's outbound QUIC load links, QUIC overhead included."
    );
    describe_counter!(
        "shoal_mesh_link_resyncs_total",
        "Load links that fell too many rounds behind (a stalled peer) and were sent the whole transcript again."
    );
    describe_counter!(
        "shoal_mesh_poll_times_clamped_total",
        "Peer snapshots whose poll time was ahead of this clock by more than the skew bound."
    );
    describe_counter!(
        "shoal_mesh_rebase_history_short_total",
        "Peer snapshots older than this replica's dispatch history reaches: its own work since the poll was counted from the history's oldest sample (bounded by the history's span)."
    );

    describe_counter!(
        "shoal_mesh_worker_set_bytes_sent_total",
        Unit::Bytes,
        "Worker-set frame bytes sent: own writes, whole sets to new links, digests and repairs."
    );
    describe_gauge!(
        "shoal_mesh_stale_basis_tokens",
        "Largest per-worker work-since-poll that peers count from an older snapshot than this replica's: how far replicas disagree on dispatched_since_poll."
    );
    describe_histogram!(
        "shoal_mesh_convergence_lag_seconds",
        Unit::Seconds,
        "From the sender's read of its slots to the merge here (an upper bound on staleness)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&samples, 0.5), Some(50.0));
        assert_eq!(percentile(&samples, 0.99), Some(99.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
