//! Starting and stopping a mesh node, and the API the router uses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    AckFrequencyConfig, ConnectionId, ConnectionIdGenerator, Endpoint, EndpointConfig, IdleTimeout,
    TransportConfig, VarInt,
};

/// A peer acknowledges at least every this many packets of a load link.
const ACK_EVERY_PACKETS: u32 = 10;
use shoal_proto::{EngineKind, EngineLoad};
use tokio::task::JoinHandle;

use crate::config::MeshConfig;
use crate::core::{Core, READINESS_LEFT};
use crate::gossip_transport::PreBound;
use crate::identity::{Incarnation, next_generation};
use crate::membership::{
    self, Dialers, KEY_HTTP, KEY_OWNERSHIP_HASH, KEY_QUIC, KEY_READINESS, KEY_VERSION,
};
use crate::objects::{ObjectReceiver, ObjectSender};
use crate::push::LinkTimings;
use crate::sightings::{SightingReceiver, SightingSender};
use crate::slot::{PollStamp, WorkerSlot};
use crate::status::{self, Footprint, MeshStatus};
use crate::telemetry::TrafficStatus;
use crate::tenants::TenantBook;
use crate::worker_set::SharedWorkerSet;
use crate::{timings, tls};

/// Why a mesh could not start.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A config field is invalid.
    #[error("invalid mesh config: {0}")]
    Config(String),
    /// The TLS material could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// A socket could not be bound or an address resolved.
    #[error("mesh network setup: {0}")]
    Io(String),
}

/// Readiness a replica publishes to its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Accepting new requests.
    Serving,
    /// Finishing in-flight requests, accepting no new ones.
    Draining,
}

impl Readiness {
    /// The gossip value.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Serving => "serving",
            Readiness::Draining => "draining",
        }
    }
}

/// A running mesh node. Dropping it stops every task abruptly (peers see a
/// crash); call [`Mesh::shutdown`] to leave the cluster gracefully.
pub struct Mesh {
    core: Arc<Core>,
    chitchat: Arc<ChitchatHandle>,
    endpoint: Endpoint,
    dialers: Arc<tokio::sync::Mutex<Dialers>>,
    membership_task: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    gossip_addr: SocketAddr,
    quic_addr: SocketAddr,
    gossip_interval: Duration,
    /// The thread the mesh's tasks run on, when it has its own
    /// ([`Mesh::start_on_own_thread`]); last, so it ends after the rest.
    pub(crate) own_thread: Option<crate::own_thread::OwnThread>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("me", &self.core.me)
            .field("gossip_addr", &self.gossip_addr)
            .field("quic_addr", &self.quic_addr)
            .finish_non_exhaustive()
    }
}

async fn advertise_ip(config: &MeshConfig) -> Result<IpAddr, MeshError> {
    let ip = match &config.advertise_host {
        Some(host) => match host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| MeshError::Io(format!("resolving advertise host {host}: {e}")))?
                .next()
                .map(|a| a.ip())
                .ok_or_else(|| MeshError::Io(format!("advertise host {host} has no address")))?,
        },
        None => config.quic_bind.ip(),
    };
    if ip.is_unspecified() {
        return Err(MeshError::Config(
            "advertise_host is required when binding an unspecified address".into(),
        ));
    }
    Ok(ip)
}

fn transport(config: &MeshConfig) -> Result<TransportConfig, MeshError> {
    let mut t = TransportConfig::default();
    let idle = IdleTimeout::try_from(config.link_idle_timeout)
        .map_err(|e| MeshError::Config(format!("link_idle_timeout: {e}")))?;
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(config.link_keepalive))
        .max_concurrent_uni_streams(VarInt::from_u32(1))
        .max_concurrent_bidi_streams(VarInt::from_u32(0));
    // Pushes on change are many small packets: ask the peer to acknowledge
    // every tenth (or after its max ACK delay) instead of every second, so
    // ACK-only packets do not cost more than the pushes they acknowledge.
    // Only data the peer already has is at stake (the stream retransmits,
    // and the next push supersedes it anyway).
    let mut acks = AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(VarInt::from_u32(ACK_EVERY_PACKETS - 1));
    t.ack_frequency_config(Some(acks));
    Ok(t)
}

/// Length of the connection ids this node issues: a mesh node holds one
/// link per peer, so 4 random bytes never collide in practice, and every
/// packet of a push on change is 4 bytes shorter than with quinn's 8.
const CID_LEN: usize = 4;

/// Issues [`CID_LEN`]-byte random connection ids.
struct ShortCids;

impl ConnectionIdGenerator for ShortCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut bytes = [0u8; CID_LEN];
        if rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut bytes)
            .is_err()
        {
            // Uniqueness is what the endpoint needs; the clock gives it
            // when the system RNG is unavailable.
            bytes = (crate::identity::unix_micros() as u32).to_le_bytes();
        }
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

fn endpoint(config: &MeshConfig, tls: tls::TlsConfigs) -> Result<Endpoint, MeshError> {
    let transport = Arc::new(transport(config)?);
    let server_crypto =
        QuicServerConfig::try_from(tls.server).map_err(|e| MeshError::Config(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport.clone());
    let client_crypto =
        QuicClientConfig::try_from(tls.client).map_err(|e| MeshError::Config(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
    client.transport_config(transport);
    let mut endpoint_config = EndpointConfig::default();
    endpoint_config.cid_generator(|| Box::new(ShortCids));
    let bind_error =
        |e: std::io::Error| MeshError::Io(format!("binding QUIC {}: {e}", config.quic_bind));
    let socket = std::net::UdpSocket::bind(config.quic_bind).map_err(bind_error)?;
    let mut endpoint = Endpoint::new(
        endpoint_config,
        Some(server),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(bind_error)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// The wall clock the worker set runs on: the system's, or a test's.
fn worker_set_clock(config: &MeshConfig) -> crate::worker_set::WallClock {
    #[cfg(feature = "testsuite")]
    if let Some(clock) = &config.worker_set_clock {
        return clock.clone();
    }
    let _ = config;
    Arc::new(crate::identity::unix_micros)
}

impl Mesh {
    /// Binds the gossip and QUIC sockets, joins the cluster through the
    /// seeds and starts pushing this node's slots. Must run in a Tokio
    /// runtime; the background tasks live on it (see
    /// [`Mesh::start_on_own_thread`] for a runtime of the mesh's own).
    pub async fn start(config: MeshConfig) -> Result<Mesh, MeshError> {
        config.validate().map_err(MeshError::Config)?;
        #[cfg(feature = "testsuite")]
        let own_name = (!config.allow_unnamed_certificate).then_some(config.node_name.as_str());
        #[cfg(not(feature = "testsuite"))]
        let own_name = Some(config.node_name.as_str());
        let tls = tls::load(&config.tls, own_name)?;
        let ip = advertise_ip(&config).await?;
        let me = Incarnation::new(config.node_name.as_str(), next_generation(0));
        let mut core = Core::new(
            me.clone(),
            config.cluster_id.clone(),
            config.forget_after,
            config.worker_removal_ttl,
            config.anti_entropy_interval,
            worker_set_clock(&config),
        );
        core.push_pacing = (config.push_min_gap, config.max_push_rate);
        core.history = crate::slot::HistoryWindow::new(config.dispatch_history);
        #[cfg(feature = "testsuite")]
        {
            core.tap = config.tap.clone();
            core.ownership_hash = config.ownership_hash_version;
            core.speaks_packed = config.speaks_packed;
        }
        let core = Arc::new(core);
        let endpoint = endpoint(&config, tls)?;
        let quic_port = endpoint
            .local_addr()
            .map_err(|e| MeshError::Io(e.to_string()))?
            .port();
        let quic_addr = SocketAddr::new(ip, quic_port);
        let (gossip_transport, gossip_local) = PreBound::bind(config.gossip_bind, core.clone())
            .await
            .map_err(|e| MeshError::Io(e.to_string()))?;
        let gossip_addr = SocketAddr::new(ip, gossip_local.port());
        let fd = &config.failure_detector;
        let chitchat_config = ChitchatConfig {
            chitchat_id: ChitchatId::new(me.name.clone(), me.generation, gossip_addr),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: fd.gossip_interval,
            listen_addr: gossip_local,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: fd.phi_threshold,
                sampling_window_size: fd.sampling_window,
                max_interval: fd.max_interval,
                initial_interval: fd.initial_interval,
                dead_node_grace_period: fd.dead_node_grace_period,
            },
            marked_for_deletion_grace_period: timings::GOSSIP_TOMBSTONE_GRACE,
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        let mut keys = vec![
            (KEY_QUIC.to_string(), quic_addr.to_string()),
            (KEY_VERSION.to_string(), config.version.clone()),
            (KEY_READINESS.to_string(), "serving".to_string()),
            (
                KEY_OWNERSHIP_HASH.to_string(),
                core.ownership_hash.to_string(),
            ),
        ];
        if let Some(http) = &config.http_addr {
            keys.push((KEY_HTTP.to_string(), http.clone()));
        }
        let transport: &dyn Transport = &gossip_transport;
        let chitchat = Arc::new(
            chitchat::spawn_chitchat(chitchat_config, keys, transport)
                .await
                .map_err(|e| MeshError::Io(format!("starting gossip: {e}")))?,
        );
        let timings = LinkTimings {
            connect_timeout: config.link_idle_timeout,
        };
        let announcer = crate::bell::start_announcer(
            core.worker_keys.bell().clone(),
            Arc::downgrade(&core.changes),
            config.push_min_gap,
        );
        let dialers = Arc::new(tokio::sync::Mutex::new(Dialers::default()));
        let mut tasks = vec![
            tokio::spawn(crate::session::accept_loop(core.clone(), endpoint.clone())),
            tokio::spawn(crate::housekeeping::run(core.clone(), config.sync_interval)),
            tokio::spawn(crate::push::rounds(core.clone(), config.sync_interval)),
            announcer,
        ];
        if !config.seeds.is_empty() {
            tasks.push(tokio::spawn(membership::refresh_seeds(
                chitchat.clone(),
                config.seeds.clone(),
                gossip_local,
                config.seed_refresh_interval,
            )));
        }
        let membership_task = tokio::spawn(membership::run(
            core.clone(),
            chitchat.clone(),
            endpoint.clone(),
            dialers.clone(),
            timings,
            fd.gossip_interval.min(timings::MEMBERSHIP_READ_MAX),
        ));
        tracing::info!(node = %me, %gossip_addr, %quic_addr, "mesh started");
        Ok(Mesh {
            core,
            chitchat,
            endpoint,
            dialers,
            membership_task: Some(membership_task),
            tasks,
            gossip_addr,
            quic_addr,
            gossip_interval: fd.gossip_interval,
            own_thread: None,
        })
    }

    /// This node's incarnation.
    pub fn incarnation(&self) -> &Incarnation {
        &self.core.me
    }

    /// Gossip address peers use for this node (use it as a seed).
    pub fn gossip_addr(&self) -> SocketAddr {
        self.gossip_addr
    }

    /// QUIC load-plane address peers use for this node.
    pub fn quic_addr(&self) -> SocketAddr {
        self.quic_addr
    }

    /// The fleet-wide worker set this node shares with its peers: its
    /// changes are pushed to every verified peer at once, and the peers'
    /// arrive merged (see `worker_set`).
    pub fn worker_set(&self) -> SharedWorkerSet {
        self.core.worker_set.clone()
    }

    /// The handle of worker `key` (its base URL), registered if new. Hold it:
    /// booking and reading through it never lock. Call
    /// [`WorkerSlot::set_polled`] if this replica polls the worker.
    pub fn worker(&self, key: &str) -> WorkerSlot {
        match self.core.worker_keys.get_or_create(key, false) {
            Some(entry) => WorkerSlot { entry },
            // Only past 2^32 keys: such a worker still works locally.
            None => WorkerSlot::detached(key),
        }
    }

    /// Shares a snapshot this node polled: `stamp` is the
    /// [`WorkerSlot::poll_stamp`] taken when the poll started. If it is the
    /// freshest this node knows, its own work since the poll counts from
    /// the stamp on. The poller is always this node.
    pub fn publish_snapshot(
        &self,
        slot: &WorkerSlot,
        stamp: &PollStamp,
        source: EngineKind,
        load: EngineLoad,
    ) {
        let value = self
            .core
            .apply_own_snapshot(&slot.entry, stamp, source, load);
        let seq = slot
            .entry
            .own_snapshot
            .load()
            .as_ref()
            .map_or(1, |(seq, _)| seq + 1);
        slot.entry.own_snapshot.store(Arc::new(Some((seq, value))));
        slot.entry.changed();
    }

    /// The handle through which the router shares the keys of prompts it
    /// sees for the first time with every peer (fleet-wide affinity
    /// evidence; see `sightings`).
    pub fn sighting_sender(&self) -> SightingSender {
        SightingSender::new(&self.core.sightings, self.core.worker_keys.bell())
    }

    /// Sets where the keys peers saw are delivered; false if one was set
    /// already (the first call wins).
    pub fn on_peer_sightings(&self, receiver: SightingReceiver) -> bool {
        self.core.sightings.set_receiver(receiver)
    }

    /// The handle through which the router tells every peer where an
    /// object created through it lives (see `objects`).
    pub fn object_sender(&self) -> ObjectSender {
        ObjectSender::new(&self.core.objects, self.core.worker_keys.bell())
    }

    /// Sets where the (object id, worker) pairs peers learned are
    /// delivered; false if one was set already (the first call wins).
    pub fn on_peer_objects(&self, receiver: ObjectReceiver) -> bool {
        self.core.objects.set_receiver(receiver)
    }

    /// Every tenant's usage, fleet-wide: the router admits each tenant's
    /// requests against it, and its own admissions reach every peer in
    /// the next round (see `tenants`).
    pub fn tenant_book(&self) -> Arc<TenantBook> {
        self.core.tenants.clone()
    }

    /// Poll ownership of `worker` (rendezvous hashing) among the replicas
    /// that poll it: the counted peers that say they do, and this node if
    /// it does. `None` when nobody polls it.
    fn poll_owner(&self, worker: &str) -> Option<Arc<str>> {
        let entry = self.core.worker_keys.get(worker)?;
        let pollers = entry.pollers(&self.core.me.name);
        crate::ownership::owner(&pollers, worker).cloned()
    }

    /// True when this node is the poll owner of `worker` among the live
    /// verified replicas that poll it. Alone, it owns what it polls.
    pub fn owns(&self, worker: &str) -> bool {
        self.poll_owner(worker)
            .is_some_and(|o| *o == *self.core.me.name)
    }

    /// Name of the poll owner of `worker`, if any replica polls it.
    pub fn owner(&self, worker: &str) -> Option<String> {
        self.poll_owner(worker).map(|o| o.to_string())
    }

    /// Names of the live verified members, this node included, sorted.
    pub fn members(&self) -> Vec<String> {
        self.core
            .members
            .load()
            .iter()
            .map(|n| n.to_string())
            .collect()
    }

    /// How much this node keeps: live keys and state entries. Bounded by
    /// the live fleet (see the churn test); also in `/mesh/status`.
    pub fn footprint(&self) -> Footprint {
        status::footprint(&self.core)
    }

    /// Publishes this node's readiness in gossip.
    pub async fn set_readiness(&self, readiness: Readiness) {
        self.set_key(KEY_READINESS, readiness.as_str()).await;
    }

    async fn set_key(&self, key: &str, value: &str) {
        self.chitchat
            .with_chitchat(|c| c.self_node_state().set(key, value))
            .await;
    }

    /// The frame, byte and lag counters alone: what [`Mesh::status`]
    /// reports under `traffic`, without walking every worker (for callers
    /// that read it often, like the scale benchmark).
    pub fn traffic(&self) -> TrafficStatus {
        self.core.telemetry.status()
    }

    /// How many frames, links and entries were dropped, by reason (what
    /// `/mesh/status` shows as `dropped_by_reason`).
    pub fn dropped_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        status::dropped_by_reason(&self.core)
    }

    /// The `/mesh/status` view.
    pub fn status(&self) -> MeshStatus {
        status::build(
            &self.core,
            self.gossip_addr.to_string(),
            self.quic_addr.to_string(),
        )
    }

    /// Leaves the cluster: gossips `left`, sends `Bye` on every load link
    /// (peers stop counting this node at once), then closes everything.
    /// Bounded to about two seconds.
    pub async fn shutdown(mut self) {
        self.set_key(KEY_READINESS, READINESS_LEFT).await;
        if let Some(task) = self.membership_task.take() {
            task.abort();
        }
        // Every session pushes its last changes and says `Bye`.
        self.core.shutdown.send_replace(true);
        let deadline = tokio::time::Instant::now() + timings::SHUTDOWN_BYE_WAIT;
        while !self.core.tables().links.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(timings::SHUTDOWN_POLL).await;
        }
        self.dialers
            .lock()
            .await
            .join_all(timings::SHUTDOWN_DIALER_JOIN)
            .await;
        // Let one or two gossip rounds carry `left`.
        tokio::time::sleep((self.gossip_interval * 2).min(timings::SHUTDOWN_GOSSIP_LEFT_MAX)).await;
        self.endpoint.close(0u32.into(), b"shutdown");
        let _ =
            tokio::time::timeout(timings::SHUTDOWN_ENDPOINT_IDLE, self.endpoint.wait_idle()).await;
        let _ = self.chitchat.initiate_shutdown();
        for task in self.tasks.drain(..) {
            task.abort();
        }
        tracing::info!(node = %self.core.me, "mesh left the cluster");
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if let Some(task) = self.membership_task.take() {
            task.abort();
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        if let Ok(mut dialers) = self.dialers.try_lock() {
            dialers.abort_all();
        }
        self.chitchat.abort();
        // Ends every session (peers see the connection close).
        self.endpoint.close(0u32.into(), b"dropped");
    }
}
