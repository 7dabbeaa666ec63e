//! What every HTTP handler shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use shoal_mesh::Mesh;

use crate::admission::Admission;
use crate::admission::buffer::BufferBudget;
use crate::auth::Auth;
use crate::config::Config;
use crate::fleet::FleetView;
use crate::objects::ObjectTable;
use crate::policy::Policy;
use crate::proxy::{Disagg, Forwarder};
use crate::request::Route;
use crate::sources::WorkerSources;
use crate::telemetry::RouteMetrics;
use crate::upstream::HttpClient;
use crate::workers::Registry;

/// Shared state of one replica's HTTP front.
#[derive(Debug)]
pub struct AppState {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The API keys (swapped whole on a configuration reload; the side
    /// client reads the worker key from the same cell).
    pub auth: Arc<ArcSwap<Auth>>,
    /// The workers.
    pub registry: Arc<Registry>,
    /// Where the workers come from (admin changes go through it).
    pub sources: Arc<WorkerSources>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// Where policies read load from.
    pub fleet: Arc<dyn FleetView>,
    /// Forwards inference requests (its own client, retries, deadline).
    pub forwarder: Forwarder,
    /// The prefill/decode dispatch of a disaggregated fleet
    /// (`--prefill-urls`).
    pub disagg: Option<Disagg>,
    /// Client for side requests (model lists).
    pub side_client: HttpClient,
    /// Per-request metric handles of each route, by [`Route::index`].
    pub route_metrics: [Arc<RouteMetrics>; Route::ALL.len()],
    /// Prometheus handle, if this process owns the recorder.
    pub metrics: Option<PrometheusHandle>,
    /// The mesh, when this replica shares load with peers.
    pub mesh: Option<Arc<Mesh>>,
    /// Overload admission (`--max-concurrent-requests`).
    pub admission: Admission,
    /// Request-body bytes held at once (`--max-buffered-request-bytes`).
    pub buffer_budget: Arc<BufferBudget>,
    /// Which worker holds each stored object (fleet-wide with the mesh).
    pub objects: Arc<ObjectTable>,
    /// Tenants and their fleet-wide limits (`--tenants-file`).
    pub tenants: Option<crate::tenants::TenantGate>,
    /// Set on SIGTERM: readiness answers 503 while in-flight work finishes.
    pub draining: AtomicBool,
}

impl AppState {
    /// Every policy the replica routes with: the main one and, in a
    /// disaggregated fleet, each pool's.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<dyn Policy>> {
        let pools = self.disagg.as_ref().map(Disagg::pool_policies);
        std::iter::once(&self.policy).chain(pools.into_iter().flatten())
    }

    /// How much prompt text a request keeps for routing: the most any
    /// policy in use reads (a `precise_prefix` prefill pool behind a
    /// `least_load` main policy still needs the prompt).
    pub fn prompt_text_limit(&self) -> Option<usize> {
        self.policies().filter_map(|p| p.prompt_text_limit()).max()
    }

    /// The KV-event index a request's prompt is tokenized for, if any
    /// policy in use routes on one.
    pub fn kv_events(&self) -> Option<Arc<crate::kv_events::KvEvents>> {
        self.policies().find_map(|p| p.kv_events())
    }

    /// Whether the replica is shutting down.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
