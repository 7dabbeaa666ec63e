//! Turning the `--mesh-*` flags into a running [`Mesh`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shoal_mesh::proto::frames::ObjectEntry;
use shoal_mesh::{Mesh, MeshConfig, PemSource, TlsConfig};

use crate::objects::ObjectTable;
use crate::policy::Sightings;

use crate::config::MeshArgs;

/// Why the mesh could not start.
#[derive(Debug, thiserror::Error)]
#[error("mesh: {0}")]
pub struct MeshStartError(String);

fn pem(path: &Option<std::path::PathBuf>, flag: &str) -> Result<PemSource, MeshStartError> {
    path.clone()
        .map(PemSource::Path)
        .ok_or_else(|| MeshStartError(format!("{flag} is required")))
}

/// What the mesh needs from flags outside `--mesh-*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshTimings {
    /// How long the fleet-wide worker set keeps a removal
    /// (`--worker-removal-ttl-secs`).
    pub worker_removal_ttl: Duration,
    /// Age past which a snapshot is not routed on (`--load-stale-after-ms`):
    /// the own dispatch history reaches back this far, so any snapshot
    /// still routed on rebases the own work since the poll exactly.
    pub snapshot_stale_after: Duration,
}

/// Builds the mesh configuration from the flags.
pub fn mesh_config(
    args: &MeshArgs,
    http_addr: SocketAddr,
    timings: MeshTimings,
) -> Result<MeshConfig, MeshStartError> {
    let tls = TlsConfig {
        ca: pem(&args.mesh_tls_ca, "--mesh-tls-ca")?,
        cert: pem(&args.mesh_tls_cert, "--mesh-tls-cert")?,
        key: pem(&args.mesh_tls_key, "--mesh-tls-key")?,
    };
    let mut mesh = MeshConfig::new(
        args.node_name(),
        args.mesh_cluster_id.clone(),
        SocketAddr::new(args.mesh_host, args.gossip_port()),
        SocketAddr::new(args.mesh_host, args.mesh_quic_port),
        tls,
    );
    mesh.advertise_host = args.mesh_advertise_host.clone();
    mesh.seeds = args.mesh_peer_urls.clone();
    mesh.sync_interval = args.sync_interval();
    mesh.push_min_gap = args.push_min_gap();
    mesh.max_push_rate = args.mesh_max_push_rate;
    mesh.version = env!("CARGO_PKG_VERSION").to_string();
    mesh.worker_removal_ttl = timings.worker_removal_ttl;
    mesh.dispatch_history = timings.snapshot_stale_after;
    let advertised_http = match &args.mesh_advertise_host {
        Some(host) if http_addr.ip().is_unspecified() => format!("{host}:{}", http_addr.port()),
        _ => http_addr.to_string(),
    };
    mesh.http_addr = Some(advertised_http);
    mesh.validate().map_err(MeshStartError)?;
    Ok(mesh)
}

/// Starts the mesh when the flags turn it on, on a thread of its own
/// (`Mesh::start_on_own_thread`): a push round then wakes that one thread
/// instead of the announcer thread and the main runtime's workers, so the
/// mesh costs less CPU under proxy load and preempts the I/O threads less
/// (tests/BENCHMARKS.md, "The mesh's own CPU under proxy load").
pub async fn start(
    args: &MeshArgs,
    http_addr: SocketAddr,
    timings: MeshTimings,
) -> Result<Option<Arc<Mesh>>, MeshStartError> {
    if !args.enabled() {
        return Ok(None);
    }
    let mesh_config = mesh_config(args, http_addr, timings)?;
    let mesh = Mesh::start_on_own_thread(mesh_config)
        .await
        .map_err(|e| MeshStartError(e.to_string()))?;
    tracing::info!(
        node = %mesh.incarnation(),
        gossip = %mesh.gossip_addr(),
        quic = %mesh.quic_addr(),
        seeds = ?args.mesh_peer_urls,
        "mesh started"
    );
    Ok(Some(Arc::new(mesh)))
}

/// Makes `sightings` fleet-wide: keys new here go to every peer, and the
/// peers' keys are recorded here (the mesh holds only a weak reference, so
/// the table goes when the policy does).
pub fn share_sightings(mesh: &Mesh, sightings: &Arc<Sightings>) {
    let sender = mesh.sighting_sender();
    sightings.share_with(Box::new(move |key| sender.send(key)));
    let table = Arc::downgrade(sightings);
    mesh.on_peer_sightings(Arc::new(move |keys: &[u64]| {
        if let Some(table) = table.upgrade() {
            table.absorb(keys);
        }
    }));
}

/// Makes `objects` fleet-wide: where an object created here lives goes to
/// every peer, and the peers' pairs are recorded here (the mesh holds only
/// a weak reference to the table).
pub fn share_objects(mesh: &Mesh, objects: &Arc<ObjectTable>) {
    let sender = mesh.object_sender();
    objects.share_with(Box::new(move |id, worker| sender.send(id, worker)));
    let table = Arc::downgrade(objects);
    mesh.on_peer_objects(Arc::new(move |entries: &[ObjectEntry]| {
        if let Some(table) = table.upgrade() {
            table.absorb(entries.iter().map(|e| (e.id.as_str(), e.worker.as_str())));
        }
    }));
}
