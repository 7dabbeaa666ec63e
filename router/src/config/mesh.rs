//! Mesh flags: how a replica finds its peers and proves who it is.
//!
//! The mesh is on when `--mesh-peer-urls` or `--mesh-port` is given. It then
//! needs the three TLS files and an address peers can reach; both are
//! checked here so a misconfigured replica fails at start with the flag's
//! name instead of silently routing on a 1/N view.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the mesh flags.
pub const MESH_FLAGS: &str = "Mesh";

/// The `--mesh-*` flags; the mesh is started from this group.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = MESH_FLAGS)]
pub struct MeshArgs {
    /// Gossip seeds as HOST:PORT (a DNS name resolving to many addresses,
    /// e.g. a headless Service, seeds them all and is re-resolved); space or
    /// comma separated. Turns the mesh on.
    #[arg(long, env = "SHOAL_MESH_PEER_URLS", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',', value_parser = parsers::host_port)]
    pub mesh_peer_urls: Vec<String>,

    /// Address the mesh's UDP sockets (gossip and QUIC) bind to.
    #[arg(long, env = "SHOAL_MESH_HOST", default_value = defaults::MESH_HOST)]
    pub mesh_host: IpAddr,

    /// Gossip UDP port (0 picks a free one). Turns the mesh on [default when on: 30001].
    #[arg(long, env = "SHOAL_MESH_PORT")]
    pub mesh_port: Option<u16>,

    /// QUIC load-plane UDP port (0 picks a free one).
    #[arg(long, env = "SHOAL_MESH_QUIC_PORT", default_value_t = defaults::MESH_QUIC_PORT)]
    pub mesh_quic_port: u16,

    /// Host or IP peers use to reach this replica (required when --mesh-host is 0.0.0.0 or ::).
    #[arg(long, env = "SHOAL_MESH_ADVERTISE_HOST")]
    pub mesh_advertise_host: Option<String>,

    /// This replica's node name: a DNS name, unique in the cluster, named by
    /// its certificate [default: the host name].
    #[arg(long, env = "SHOAL_MESH_NAME")]
    pub mesh_name: Option<String>,

    /// Cluster id; gossip and frames from another cluster are refused.
    #[arg(long, env = "SHOAL_MESH_CLUSTER_ID", default_value = defaults::MESH_CLUSTER_ID)]
    pub mesh_cluster_id: String,

    /// PEM file of the cluster CA every peer certificate must chain to.
    #[arg(long, env = "SHOAL_MESH_TLS_CA", value_name = "FILE")]
    pub mesh_tls_ca: Option<PathBuf>,

    /// PEM file of this replica's certificate (names --mesh-name; server and client auth).
    #[arg(long, env = "SHOAL_MESH_TLS_CERT", value_name = "FILE")]
    pub mesh_tls_cert: Option<PathBuf>,

    /// PEM file of this replica's private key.
    #[arg(long, env = "SHOAL_MESH_TLS_KEY", value_name = "FILE")]
    pub mesh_tls_key: Option<PathBuf>,

    /// Heartbeat: changed in-flight counts are pushed to peers at least this often, in milliseconds (a change is pushed at once; see --mesh-push-min-gap-ms).
    #[arg(long, env = "SHOAL_MESH_SYNC_INTERVAL_MS", default_value_t = defaults::MESH_SYNC_INTERVAL_MS, value_parser = parsers::positive_u64)]
    pub mesh_sync_interval_ms: u64,

    /// Shortest gap between two pushes made on change, in milliseconds: a quiet replica pushes a booking at once, a busy one coalesces its changes into one push per gap. At most --mesh-sync-interval-ms.
    #[arg(long, env = "SHOAL_MESH_PUSH_MIN_GAP_MS", default_value_t = defaults::MESH_PUSH_MIN_GAP_MS, value_parser = parsers::positive_u64)]
    pub mesh_push_min_gap_ms: u64,

    /// Most pushes on change per second summed over all peer links: with many peers the push gap stretches past --mesh-push-min-gap-ms to peers / this rate, so more changes share a packet.
    #[arg(long, env = "SHOAL_MESH_MAX_PUSH_RATE", default_value_t = defaults::MESH_MAX_PUSH_RATE, value_parser = parsers::positive_u32)]
    pub mesh_max_push_rate: u32,
}

/// The host name, for the default node name.
fn host_name() -> Option<String> {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
}

impl MeshArgs {
    /// Whether this replica joins a mesh.
    pub fn enabled(&self) -> bool {
        !self.mesh_peer_urls.is_empty() || self.mesh_port.is_some()
    }

    /// The node name: `--mesh-name`, else the host name.
    pub fn node_name(&self) -> String {
        self.mesh_name
            .clone()
            .or_else(host_name)
            .unwrap_or_else(|| defaults::MESH_NAME_FALLBACK.to_string())
    }

    /// Gossip port in effect.
    pub fn gossip_port(&self) -> u16 {
        self.mesh_port.unwrap_or(defaults::MESH_PORT)
    }

    /// Heartbeat push interval.
    pub fn sync_interval(&self) -> Duration {
        Duration::from_millis(self.mesh_sync_interval_ms)
    }

    /// Shortest gap between pushes made on change.
    pub fn push_min_gap(&self) -> Duration {
        Duration::from_millis(self.mesh_push_min_gap_ms)
    }

    /// Checks the flags that only matter when the mesh is on, so a
    /// misconfigured replica fails at start naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        // The host name only matters once the mesh is on (a certificate
        // must name it); an explicit --mesh-name is always checked.
        if self.enabled() || self.mesh_name.is_some() {
            let name = self.node_name();
            if !parsers::is_dns_name(&name) {
                return Err(format!(
                    "--mesh-name `{name}` must be a DNS name (letters, digits, '-', '.'), as named by the node certificate"
                ));
            }
        }
        if !self.enabled() {
            return Ok(());
        }
        for (flag, value) in [
            ("--mesh-tls-ca", &self.mesh_tls_ca),
            ("--mesh-tls-cert", &self.mesh_tls_cert),
            ("--mesh-tls-key", &self.mesh_tls_key),
        ] {
            match value {
                None => {
                    return Err(format!(
                        "{flag} is required when the mesh is on (create files with `shoal mesh gen-certs`)"
                    ));
                }
                Some(path) if !path.is_file() => {
                    return Err(format!("{flag}: {} is not a readable file", path.display()));
                }
                Some(_) => {}
            }
        }
        if self.mesh_host.is_unspecified() && self.mesh_advertise_host.is_none() {
            return Err(format!(
                "--mesh-advertise-host is required when --mesh-host is {} (peers need an address to reach this replica)",
                self.mesh_host
            ));
        }
        if self.mesh_port.is_some_and(|p| p != 0) && self.mesh_port == Some(self.mesh_quic_port) {
            return Err("--mesh-port and --mesh-quic-port must differ".into());
        }
        if self.mesh_cluster_id.trim().is_empty() {
            return Err("--mesh-cluster-id must not be empty".into());
        }
        if self.mesh_push_min_gap_ms > self.mesh_sync_interval_ms {
            return Err(format!(
                "--mesh-push-min-gap-ms ({}) must not exceed --mesh-sync-interval-ms ({})",
                self.mesh_push_min_gap_ms, self.mesh_sync_interval_ms
            ));
        }
        Ok(())
    }
}
