//! How a mesh is configured: identity, addresses, TLS material and timings.

use std::net::SocketAddr;
use std::path::PathBuf;
#[cfg(feature = "testsuite")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "testsuite")]
use crate::tap::FrameTap;

/// PEM text, given inline or read from a file at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemSource {
    /// Read the PEM from this file when the mesh starts.
    Path(PathBuf),
    /// Use these PEM bytes as they are.
    Bytes(Vec<u8>),
}

impl PemSource {
    /// The PEM bytes, reading the file if needed.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        match self {
            PemSource::Path(path) => std::fs::read(path),
            PemSource::Bytes(bytes) => Ok(bytes.clone()),
        }
    }
}

/// The cluster CA and this node's certificate chain and private key. The
/// certificate must name the node (a DNS SAN equal to the node name) and
/// allow both server and client authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// CA certificate(s) every peer certificate must chain to.
    pub ca: PemSource,
    /// This node's certificate chain, leaf first.
    pub cert: PemSource,
    /// This node's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PemSource,
}

/// Settings of chitchat's phi-accrual failure detector and gossip.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureDetectorSettings {
    /// How often a node gossips with a few random peers.
    pub gossip_interval: Duration,
    /// Phi above which a peer is declared dead.
    pub phi_threshold: f64,
    /// Heartbeat intervals kept to estimate the arrival distribution.
    pub sampling_window: usize,
    /// Heartbeat gaps longer than this are ignored as outliers.
    pub max_interval: Duration,
    /// Assumed heartbeat interval before any sample exists.
    pub initial_interval: Duration,
    /// How long a dead node stays listed before chitchat forgets it.
    pub dead_node_grace_period: Duration,
}

impl Default for FailureDetectorSettings {
    fn default() -> Self {
        Self {
            gossip_interval: Duration::from_millis(200),
            phi_threshold: 8.0,
            sampling_window: 1000,
            max_interval: Duration::from_secs(5),
            initial_interval: Duration::from_secs(1),
            // Matches `MeshConfig::forget_after`: departed members leave
            // gossip's view when their state leaves the fleet view.
            dead_node_grace_period: Duration::from_secs(600),
        }
    }
}

/// Everything [`crate::Mesh::start`] needs.
#[derive(Clone)]
pub struct MeshConfig {
    /// Node name: a DNS name, unique in the cluster, named by the certificate.
    pub node_name: String,
    /// Cluster id; gossip and load frames from another cluster are refused.
    pub cluster_id: String,
    /// UDP address chitchat binds (port 0 picks a free port).
    pub gossip_bind: SocketAddr,
    /// UDP address the QUIC load plane binds (port 0 picks a free port).
    pub quic_bind: SocketAddr,
    /// Host (IP or DNS name) peers use to reach this node; `None` uses the
    /// bind IP, which must then not be unspecified.
    pub advertise_host: Option<String>,
    /// Seeds as `host:port` gossip addresses; DNS names are re-resolved
    /// every [`MeshConfig::seed_refresh_interval`].
    pub seeds: Vec<String>,
    /// HTTP address published for `/mesh/status` readers (metadata only).
    pub http_addr: Option<String>,
    /// Version string published in the gossip metadata.
    pub version: String,
    /// mTLS material for the load plane.
    pub tls: TlsConfig,
    /// Heartbeat: changed slot values are pushed at least this often (a
    /// change is pushed at once; see `push_min_gap`). Default 20 ms.
    pub sync_interval: Duration,
    /// Shortest time between two pushes made on change: a change on a quiet
    /// node goes out at once, changes on a busy one are coalesced into one
    /// push per gap. Default [`DEFAULT_PUSH_MIN_GAP_MS`]; at most
    /// `sync_interval`.
    pub push_min_gap: Duration,
    /// Most pushes on change a node sends per second, summed over its links:
    /// with many peers the gap between pushes stretches past `push_min_gap`
    /// to `links / max_push_rate`. Default [`DEFAULT_MAX_PUSH_RATE`].
    pub max_push_rate: u32,
    /// Every entry a node sends is re-sent (refreshed) once per this
    /// interval, a slice with every round, so a peer that missed a frame
    /// heals and an entry its sender stopped refreshing can be forgotten.
    /// Default [`DEFAULT_ANTI_ENTROPY_INTERVAL`].
    pub anti_entropy_interval: Duration,
    /// How far back each worker's own dispatch history reaches: a snapshot
    /// learned from a peer up to this old (a slow poll, a poller's clock
    /// behind) rebases this replica's `dispatched_since_poll` to what it
    /// had dispatched at the poll's time; an older one rebases it to the
    /// history's oldest sample (counted in
    /// `shoal_mesh_rebase_history_short_total`). Set it to at least the
    /// age past which a snapshot is not routed on (the router passes its
    /// `--load-stale-after-ms`). Memory is bounded whatever the span (its
    /// buckets widen). Default [`DEFAULT_DISPATCH_HISTORY`].
    pub dispatch_history: Duration,
    /// Gossip and failure-detector settings.
    pub failure_detector: FailureDetectorSettings,
    /// A load link silent for this long is closed and its peer stops
    /// counting. Default 3 s.
    pub link_idle_timeout: Duration,
    /// Keep-alive interval on load links (well below the idle timeout).
    pub link_keepalive: Duration,
    /// How often DNS seeds are re-resolved and re-contacted. Default 30 s.
    pub seed_refresh_interval: Duration,
    /// How long what left the fleet is kept before it is forgotten: a dead
    /// incarnation's entries, a worker key nobody uses, an entry its sender
    /// stopped refreshing. Must exceed the anti-entropy interval (full
    /// syncs refresh live entries). Default 10 min.
    pub forget_after: Duration,
    /// How long a worker removed from the fleet-wide worker set stays
    /// removed (its tombstone) before it is forgotten and a seed or
    /// discovery may bring it back. Default [`DEFAULT_WORKER_REMOVAL_TTL`].
    pub worker_removal_ttl: Duration,
    /// Test hook: sees every received update before it is merged.
    #[cfg(feature = "testsuite")]
    pub tap: Option<Arc<dyn FrameTap>>,
    /// Test hook: the wall clock (µs since the Unix epoch) the worker set
    /// stamps writes and judges peers' stamps with, so a test can run a
    /// replica whose clock is behind or ahead.
    #[cfg(feature = "testsuite")]
    pub worker_set_clock: Option<crate::worker_set::WallClock>,
    /// Test hook: start even with a certificate that does not name this
    /// node (to stand in for a hostile peer; peers must refuse it).
    #[cfg(feature = "testsuite")]
    pub allow_unnamed_certificate: bool,
    /// Test hook: the ownership hash version this node gossips (a build
    /// always uses [`crate::ownership::OWNERSHIP_HASH_VERSION`]), so a test
    /// can stand in for a replica of a build that hashes differently.
    #[cfg(feature = "testsuite")]
    pub ownership_hash_version: u32,
    /// Test hook: `false` makes this node neither say nor take packed slot
    /// changes, as a build from before them (a mixed-version test, and the
    /// scale bench's whole-value side).
    #[cfg(feature = "testsuite")]
    pub speaks_packed: bool,
}

impl std::fmt::Debug for MeshConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshConfig")
            .field("node_name", &self.node_name)
            .field("cluster_id", &self.cluster_id)
            .field("gossip_bind", &self.gossip_bind)
            .field("quic_bind", &self.quic_bind)
            .field("advertise_host", &self.advertise_host)
            .field("seeds", &self.seeds)
            .field("sync_interval", &self.sync_interval)
            .field("push_min_gap", &self.push_min_gap)
            .field("max_push_rate", &self.max_push_rate)
            .field("anti_entropy_interval", &self.anti_entropy_interval)
            .field("dispatch_history", &self.dispatch_history)
            .field("failure_detector", &self.failure_detector)
            .finish_non_exhaustive()
    }
}

/// Default interval of the periodic push of changed counts, in
/// milliseconds: the fallback that carries what on-change pushes coalesced.
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 20;

/// Default shortest gap between pushes made on change, in milliseconds
/// (chosen by `cargo bench -p shoal-mesh --bench convergence`: see
/// tests/BENCHMARKS.md).
pub const DEFAULT_PUSH_MIN_GAP_MS: u64 = 4;

/// Default most pushes on change per second summed over a node's links
/// (below it the gap is `push_min_gap`; a 64-replica mesh pushes every
/// 31.5 ms instead of 4 ms: see the mesh-scale figures in
/// tests/BENCHMARKS.md).
pub const DEFAULT_MAX_PUSH_RATE: u32 = 2000;

/// Default refresh period of every sent entry. Refreshes are a rolling
/// slice of every round, encoded once for all links; they only heal what a
/// link lost (a new or resynced link gets a full copy at once), so they can
/// be slow: at 30 s they stay a small share of the bytes of a large mesh.
pub const DEFAULT_ANTI_ENTROPY_INTERVAL: Duration = Duration::from_secs(30);

/// Default reach of the own dispatch history: the stale limit of a
/// router on its default poll interval (3 polls of 1 s).
pub const DEFAULT_DISPATCH_HISTORY: Duration = Duration::from_secs(3);

/// Default time a removed worker stays removed fleet-wide (one hour: long
/// past any partition the mesh rides out, short enough that the tombstones
/// of an autoscaled fleet stay few).
pub const DEFAULT_WORKER_REMOVAL_TTL: Duration = Duration::from_secs(3600);

impl MeshConfig {
    /// A config with the default timings; addresses and TLS must be given.
    pub fn new(
        node_name: impl Into<String>,
        cluster_id: impl Into<String>,
        gossip_bind: SocketAddr,
        quic_bind: SocketAddr,
        tls: TlsConfig,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            cluster_id: cluster_id.into(),
            gossip_bind,
            quic_bind,
            advertise_host: None,
            seeds: Vec::new(),
            http_addr: None,
            version: env!("CARGO_PKG_VERSION").to_string(),
            tls,
            sync_interval: Duration::from_millis(DEFAULT_SYNC_INTERVAL_MS),
            push_min_gap: Duration::from_millis(DEFAULT_PUSH_MIN_GAP_MS),
            max_push_rate: DEFAULT_MAX_PUSH_RATE,
            anti_entropy_interval: DEFAULT_ANTI_ENTROPY_INTERVAL,
            dispatch_history: DEFAULT_DISPATCH_HISTORY,
            failure_detector: FailureDetectorSettings::default(),
            link_idle_timeout: Duration::from_secs(3),
            link_keepalive: Duration::from_millis(500),
            seed_refresh_interval: Duration::from_secs(30),
            forget_after: Duration::from_secs(600),
            worker_removal_ttl: DEFAULT_WORKER_REMOVAL_TTL,
            #[cfg(feature = "testsuite")]
            tap: None,
            #[cfg(feature = "testsuite")]
            ownership_hash_version: crate::ownership::OWNERSHIP_HASH_VERSION,
            #[cfg(feature = "testsuite")]
            speaks_packed: true,
            #[cfg(feature = "testsuite")]
            allow_unnamed_certificate: false,
            #[cfg(feature = "testsuite")]
            worker_set_clock: None,
        }
    }

    /// Rejects settings the mesh cannot run with, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if !crate::identity::valid_node_name(&self.node_name) {
            return Err(format!(
                "node_name {:?} must be a DNS name (letters, digits, '-', '.')",
                self.node_name
            ));
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 128 {
            return Err("cluster_id must be 1..=128 bytes".into());
        }
        let positive = [
            ("sync_interval", self.sync_interval),
            ("push_min_gap", self.push_min_gap),
            ("anti_entropy_interval", self.anti_entropy_interval),
            ("dispatch_history", self.dispatch_history),
            ("gossip_interval", self.failure_detector.gossip_interval),
            ("link_idle_timeout", self.link_idle_timeout),
            ("link_keepalive", self.link_keepalive),
            ("seed_refresh_interval", self.seed_refresh_interval),
            ("worker_removal_ttl", self.worker_removal_ttl),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(format!("{name} must be greater than zero"));
            }
        }
        if self.max_push_rate == 0 {
            return Err("max_push_rate must be greater than zero".into());
        }
        if self.push_min_gap > self.sync_interval {
            return Err("push_min_gap must not exceed sync_interval".into());
        }
        if self.forget_after <= self.anti_entropy_interval * 2 {
            return Err(
                "forget_after must exceed two anti_entropy_intervals (full syncs keep live entries)"
                    .into(),
            );
        }
        if self.link_keepalive >= self.link_idle_timeout {
            return Err("link_keepalive must be shorter than link_idle_timeout".into());
        }
        let phi = self.failure_detector.phi_threshold;
        if !phi.is_finite() || phi <= 0.0 {
            return Err("failure_detector.phi_threshold must be finite and > 0".into());
        }
        if self.failure_detector.sampling_window == 0 {
            return Err("failure_detector.sampling_window must be > 0".into());
        }
        Ok(())
    }
}
