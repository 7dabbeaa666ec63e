//! Kubernetes discovery: the Ready endpoints of the EndpointSlices that
//! match `--discovery-selector` become workers.
//!
//! How: the `kube` crate's watcher (list, then watch from the list's
//! resourceVersion; bookmarks on) feeds a reflector store; after every
//! change the whole store is turned into the set of endpoint URLs
//! ([`ready_endpoints`]) and handed to [`WorkerSources::set_discovered`].
//! What that guarantees:
//! - only endpoints that are ready, serving and not terminating are
//!   routed (with `publishNotReadyAddresses` every endpoint reads ready,
//!   so `ready` alone would route terminating pods); a terminating pod
//!   stops getting new requests while its requests in flight finish;
//! - a slice that gives no worker at all (several ports and no
//!   `--discovery-port`, the named port missing, FQDN addresses) is
//!   warned about and counted in `shoal_discovery_skipped_slices{reason}`;
//! - a watch that fails or ends is restarted with backoff; an expired
//!   resourceVersion (410 Gone) or a lost stream of events forces a fresh
//!   list, and the store is replaced whole when that list completes, so a
//!   DELETE missed while the watch was down cannot persist;
//! - until the first list completes, nothing is discovered, and a failing
//!   API server never empties the set (the last known endpoints stay).
//!
//! Every replica watches for itself: one long-lived watch per replica is
//! what kube-proxy does on every node, the API server serves it from its
//! watch cache, and a replica keeps following the fleet while the mesh is
//! partitioned. Nothing discovered travels over the mesh.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};

use super::WorkerSources;
use crate::config::defaults::{KV_EVENTS_PORT_NAME, KV_EVENTS_REPLAY_PORT_NAME};
use crate::config::{DiscoveryConfig, DiscoveryScheme};
use crate::url::normalize_url;
use crate::workers::{KvEventSockets, Served};

/// Pause before retrying to build a client (no credentials yet, bad
/// kubeconfig); the watch itself backs off on its own.
const CLIENT_RETRY: Duration = Duration::from_secs(5);

/// Which port of an endpoint to route to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortChoice {
    /// This number, whatever the slice lists.
    Number(u16),
    /// The slice port with this name.
    Named(String),
    /// The slice's port when it lists exactly one (besides the KV-event
    /// ports).
    Only,
}

impl PortChoice {
    /// Reads `--discovery-port`: a number or a port name.
    pub fn parse(flag: Option<&str>) -> Self {
        match flag.map(str::trim) {
            None | Some("") => PortChoice::Only,
            Some(text) => match text.parse::<u16>() {
                Ok(n) if n > 0 => PortChoice::Number(n),
                _ => PortChoice::Named(text.to_string()),
            },
        }
    }

    /// The port to use for the endpoints of `slice` and its entry in the
    /// slice (absent for a number not listed), or why there is none.
    fn of<'s>(&self, slice: &'s EndpointSlice) -> Result<(u16, Option<&'s EndpointPort>), Skip> {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = match self {
            PortChoice::Number(n) => {
                let listed = ports.iter().find(|p| p.port == Some(i32::from(*n)));
                return Ok((*n, listed));
            }
            PortChoice::Named(name) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name))
                .ok_or(Skip::NoPort)?,
            // The KV-event ports are not candidates for the HTTP port.
            PortChoice::Only => {
                let mut http = ports.iter().filter(|p| {
                    !matches!(
                        p.name.as_deref(),
                        Some(KV_EVENTS_PORT_NAME | KV_EVENTS_REPLAY_PORT_NAME)
                    )
                });
                match (http.next(), http.next()) {
                    (Some(only), None) => only,
                    (None, _) => return Err(Skip::NoPort),
                    (Some(_), Some(_)) => return Err(Skip::AmbiguousPort),
                }
            }
        };
        let number = port
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or(Skip::NoPort)?;
        Ok((number, Some(port)))
    }
}

/// Why a whole slice gave no worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// Several ports and no `--discovery-port` to choose one.
    AmbiguousPort,
    /// The chosen port is not in the slice (or has no number).
    NoPort,
    /// FQDN addresses (not routed: they would need DNS per request).
    AddressType,
}

impl Skip {
    /// Every reason, for the gauge.
    pub const ALL: [Skip; 3] = [Skip::AmbiguousPort, Skip::NoPort, Skip::AddressType];

    /// The gauge's label.
    pub fn label(self) -> &'static str {
        match self {
            Skip::AmbiguousPort => "ambiguous_port",
            Skip::NoPort => "no_port",
            Skip::AddressType => "address_type",
        }
    }
}

/// What the slices said: the workers, and the slices that gave none.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Worker URL → the model its slice's label names, if any.
    pub endpoints: BTreeMap<String, Option<String>>,
    /// Worker URL → its engine's KV-event sockets, for slices that list a
    /// port named [`KV_EVENTS_PORT_NAME`] (`precise_prefix` subscribes).
    pub kv_events: BTreeMap<String, KvEventSockets>,
    /// Names of the slices skipped whole, by reason.
    pub skipped: BTreeMap<Skip, Vec<String>>,
    /// Worker URLs whose slice's role label says `prefill` (the prefill
    /// pool of a disaggregated fleet).
    pub prefill: BTreeSet<String>,
}

/// The slice labels discovery reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SliceLabels<'a> {
    /// The label naming the model (`--discovery-model-label`).
    pub model: Option<&'a str>,
    /// The label naming the pool, `prefill` or else decode
    /// (`--discovery-role-label`).
    pub role: Option<&'a str>,
}

impl<'a> From<Option<&'a str>> for SliceLabels<'a> {
    /// The model label alone.
    fn from(model: Option<&'a str>) -> Self {
        Self { model, role: None }
    }
}

/// Whether an endpoint takes new requests: ready, serving and not
/// terminating. `ready` alone is not enough: a Service with
/// `publishNotReadyAddresses` reports every endpoint ready, terminating
/// pods included; `serving` is the pod's own readiness there.
fn routable(endpoint: &k8s_openapi::api::discovery::v1::Endpoint) -> bool {
    let Some(c) = &endpoint.conditions else {
        return true;
    };
    c.ready.unwrap_or(true) && c.serving.unwrap_or(true) && !c.terminating.unwrap_or(false)
}

/// The worker URL of every routable endpoint (see [`routable`]) in
/// `slices` (deduplicated: an endpoint may appear in two slices while they
/// are rebalanced), with the model named by its slice's `model_label`, if
/// any, and in the prefill pool when its role label says so. The scheme is
/// `scheme`, else https for a port whose appProtocol or name is `https`,
/// else http. Slices that give no worker at all are listed by reason.
pub fn ready_endpoints<'a>(
    slices: &[Arc<EndpointSlice>],
    port: &PortChoice,
    scheme: Option<DiscoveryScheme>,
    labels: impl Into<SliceLabels<'a>>,
) -> Discovered {
    let labels = labels.into();
    let model_label = labels.model;
    let mut out = Discovered::default();
    for slice in slices {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let v6 = match slice.address_type.as_str() {
            "IPv4" => false,
            "IPv6" => true,
            _ => {
                out.skipped.entry(Skip::AddressType).or_default().push(name);
                continue;
            }
        };
        let (number, listed) = match port.of(slice) {
            Ok(found) => found,
            Err(skip) => {
                out.skipped.entry(skip).or_default().push(name);
                continue;
            }
        };
        let tls = match scheme {
            Some(DiscoveryScheme::Https) => true,
            Some(DiscoveryScheme::Http) => false,
            None => listed.is_some_and(|p| {
                p.app_protocol.as_deref() == Some("https") || p.name.as_deref() == Some("https")
            }),
        };
        let scheme = if tls { "https" } else { "http" };
        let model = model_label.and_then(|label| {
            slice
                .metadata
                .labels
                .as_ref()?
                .get(label)
                .filter(|m| !m.is_empty())
                .cloned()
        });
        let label = |name: Option<&str>| {
            let name = name?;
            slice.metadata.labels.as_ref()?.get(name).cloned()
        };
        let prefill = label(labels.role).is_some_and(|role| role == "prefill");
        let events_port = named_port(slice, KV_EVENTS_PORT_NAME);
        let replay_port = named_port(slice, KV_EVENTS_REPLAY_PORT_NAME);
        for endpoint in slice.endpoints.iter().filter(|e| routable(e)) {
            let Some(address) = endpoint.addresses.first() else {
                continue;
            };
            let host = if v6 {
                format!("[{address}]")
            } else {
                address.clone()
            };
            if let Ok(url) = normalize_url(&format!("{scheme}://{host}:{number}")) {
                if let Some(events) = events_port {
                    out.kv_events
                        .entry(url.clone())
                        .or_insert_with(|| KvEventSockets {
                            events: format!("tcp://{host}:{events}"),
                            replay: replay_port.map(|p| format!("tcp://{host}:{p}")),
                        });
                }
                if prefill {
                    out.prefill.insert(url.clone());
                }
                out.endpoints.entry(url).or_insert_with(|| model.clone());
            }
        }
    }
    out
}

/// The number of the slice's port called `name`, if it lists one.
fn named_port(slice: &EndpointSlice, name: &str) -> Option<u16> {
    slice
        .ports
        .as_deref()?
        .iter()
        .find(|p| p.name.as_deref() == Some(name))?
        .port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// The client and namespace from in-cluster credentials or `$KUBECONFIG`.
async fn connect(config: &DiscoveryConfig) -> Result<(Client, String), String> {
    // kube builds its TLS configuration with rustls' process-wide default
    // provider: make it ring, the only one linked.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kube_config = match &config.discovery_kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--discovery-kubeconfig {}: {e}", path.display()))?;
            let options = kube::config::KubeConfigOptions::default();
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("--discovery-kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes credentials (in-cluster or $KUBECONFIG): {e}"))?,
    };
    let namespace = config
        .discovery_namespace
        .clone()
        .unwrap_or_else(|| kube_config.default_namespace.clone());
    let client = Client::try_from(kube_config).map_err(|e| format!("Kubernetes client: {e}"))?;
    Ok((client, namespace))
}

/// Watches the selected EndpointSlices forever and keeps `sources`'
/// discovered set equal to their Ready endpoints (aborted with the replica).
pub async fn run(config: DiscoveryConfig, sources: Arc<WorkerSources>) {
    let selector = config.discovery_selector.clone().unwrap_or_default();
    let port = PortChoice::parse(config.discovery_port.as_deref());
    let (client, namespace) = loop {
        match connect(&config).await {
            Ok(ok) => break ok,
            Err(err) => {
                tracing::error!(error = %err, "discovery cannot start; retrying");
                crate::telemetry::discovery_error("client");
                tokio::time::sleep(CLIENT_RETRY).await;
            }
        }
    };
    tracing::info!(%namespace, %selector, ?port, "watching EndpointSlices");
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let (store, writer) = reflector::store();
    let events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut warned = BTreeMap::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                let labels = SliceLabels {
                    model: config.discovery_model_label.as_deref(),
                    role: config.discovery_role_label.as_deref(),
                };
                let found = ready_endpoints(&store.state(), &port, config.discovery_scheme, labels);
                report_skipped(&found.skipped, &mut warned);
                apply(&sources, found);
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(err) => {
                tracing::warn!(error = %err, "EndpointSlice watch failed; retrying");
                crate::telemetry::discovery_error(watch_error_kind(&err));
            }
        }
    }
}

/// Hands the endpoints to the sources, gives each new worker its model
/// hint (kept only until its own `/v1/models` is read) and each worker its
/// KV-event sockets and pool.
fn apply(sources: &WorkerSources, discovered: Discovered) {
    let found = discovered.endpoints;
    let urls: BTreeSet<String> = found.keys().cloned().collect();
    let count = urls.len();
    let done = sources.set_discovered(urls);
    crate::telemetry::discovered_endpoints(count);
    if !done.added.is_empty() || !done.removed.is_empty() {
        tracing::info!(added = ?done.added, removed = ?done.removed, "discovered endpoints changed");
    }
    let registry = sources.registry();
    for worker in registry.all().iter() {
        if found.contains_key(worker.url()) {
            worker.set_discovered_prefill(discovered.prefill.contains(worker.url()));
        }
        if let Some(sockets) = discovered.kv_events.get(worker.url()) {
            worker.set_kv_event_sockets(Some(sockets.clone()));
        }
        if let Some(Some(model)) = found.get(worker.url())
            && worker.served().ids().is_none()
        {
            registry.set_served(worker, Served::models([model.as_str()]));
        }
    }
}

/// Sets the skipped-slices gauge and warns once per change of what is
/// skipped (`warned` holds what was last warned about).
fn report_skipped(skipped: &BTreeMap<Skip, Vec<String>>, warned: &mut BTreeMap<Skip, Vec<String>>) {
    for reason in Skip::ALL {
        let slices = skipped.get(&reason).map(Vec::as_slice).unwrap_or_default();
        crate::telemetry::discovery_skipped_slices(reason.label(), slices.len());
        if !slices.is_empty() && warned.get(&reason).map(Vec::as_slice) != Some(slices) {
            let hint = match reason {
                Skip::AmbiguousPort => "they list several ports: set --discovery-port",
                Skip::NoPort => "they do not list the port --discovery-port names",
                Skip::AddressType => "FQDN slices are not routed",
            };
            tracing::warn!(?slices, "EndpointSlices give no worker: {hint}");
        }
    }
    *warned = skipped.clone();
}

/// A short label for a watch error (the metric's `kind`).
fn watch_error_kind(err: &watcher::Error) -> &'static str {
    match err {
        watcher::Error::InitialListFailed(_) => "list",
        watcher::Error::WatchStartFailed(_) => "watch_start",
        watcher::Error::WatchError(status) if status.code == 410 => "gone",
        watcher::Error::WatchError(_) => "watch_status",
        watcher::Error::WatchFailed(_) => "watch_failed",
        watcher::Error::NoResourceVersion => "no_resource_version",
    }
}

#[cfg(test)]
mod tests;
