//! Worker-list flags: how long an admin removal lasts fleet-wide, and
//! where discovery finds engines (Kubernetes EndpointSlices).

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{defaults, parsers};

/// Help heading of the worker-list flags.
pub const DISCOVERY_FLAGS: &str = "Workers and discovery";

/// Where engines are discovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoveryKind {
    /// Only `--worker-urls` and the admin API.
    None,
    /// Ready endpoints of Kubernetes EndpointSlices matching
    /// `--discovery-selector` in `--discovery-namespace`.
    Kubernetes,
}

/// How discovered engines are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoveryScheme {
    /// `http://` (the engines' default).
    Http,
    /// `https://`, verified as `--worker-tls-ca` says.
    Https,
}

/// The worker-list group: the worker sources and discovery are built from it.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = DISCOVERY_FLAGS)]
pub struct DiscoveryConfig {
    /// Seconds a worker removed with `DELETE /workers` stays removed on
    /// every replica (even if seeded or discovered) before the removal is
    /// forgotten.
    #[arg(long, env = "SHOAL_WORKER_REMOVAL_TTL_SECS", default_value_t = defaults::WORKER_REMOVAL_TTL_SECS, value_parser = parsers::positive_u64)]
    pub worker_removal_ttl_secs: u64,

    /// Engine discovery: `kubernetes` watches EndpointSlices (in-cluster
    /// credentials, or $KUBECONFIG) and routes to their Ready endpoints.
    #[arg(long, env = "SHOAL_DISCOVERY", value_enum, default_value_t = DiscoveryKind::None)]
    pub discovery: DiscoveryKind,

    /// Kubeconfig file to reach the API server with, instead of the
    /// in-cluster service account or $KUBECONFIG.
    #[arg(long, env = "SHOAL_DISCOVERY_KUBECONFIG", value_name = "FILE")]
    pub discovery_kubeconfig: Option<std::path::PathBuf>,

    /// Namespace whose EndpointSlices are watched [default: this pod's
    /// namespace, else the kubeconfig's].
    #[arg(long, env = "SHOAL_DISCOVERY_NAMESPACE")]
    pub discovery_namespace: Option<String>,

    /// Label selector of the EndpointSlices to watch, e.g.
    /// `kubernetes.io/service-name=vllm` (a Service's slices carry its name
    /// and its labels). Required with `--discovery kubernetes`.
    #[arg(long, env = "SHOAL_DISCOVERY_SELECTOR")]
    pub discovery_selector: Option<String>,

    /// Port of the endpoints to route to: a number, or the name of a port
    /// in the slices [default: the slice's port when it has exactly one].
    #[arg(long, env = "SHOAL_DISCOVERY_PORT")]
    pub discovery_port: Option<String>,

    /// Label on the EndpointSlices (copied from their Service) whose value
    /// names the model their engines serve; used until an engine's own
    /// `/v1/models` has been read.
    #[arg(long, env = "SHOAL_DISCOVERY_MODEL_LABEL")]
    pub discovery_model_label: Option<String>,

    /// Label on the EndpointSlices (copied from their Service) whose value
    /// `prefill` puts their engines in the prefill pool of a disaggregated
    /// fleet (any other value, or none: the decode pool). Needs
    /// --pd-protocol.
    #[arg(long, env = "SHOAL_DISCOVERY_ROLE_LABEL")]
    pub discovery_role_label: Option<String>,

    /// Scheme of discovered engines [default: https for a port whose
    /// appProtocol or name is `https`, else http].
    #[arg(long, env = "SHOAL_DISCOVERY_SCHEME", value_enum)]
    pub discovery_scheme: Option<DiscoveryScheme>,
}

impl DiscoveryConfig {
    /// How long an admin removal lasts.
    pub fn worker_removal_ttl(&self) -> Duration {
        Duration::from_secs(self.worker_removal_ttl_secs)
    }

    /// Checks the flags that only make sense together.
    pub fn validate(&self) -> Result<(), String> {
        match self.discovery {
            DiscoveryKind::Kubernetes => {
                if self
                    .discovery_selector
                    .as_deref()
                    .is_none_or(|s| s.trim().is_empty())
                {
                    return Err(
                        "--discovery kubernetes needs --discovery-selector (e.g. kubernetes.io/service-name=vllm)"
                            .into(),
                    );
                }
            }
            DiscoveryKind::None => {
                let stray = [
                    (
                        "--discovery-kubeconfig",
                        self.discovery_kubeconfig.is_some(),
                    ),
                    ("--discovery-namespace", self.discovery_namespace.is_some()),
                    ("--discovery-selector", self.discovery_selector.is_some()),
                    ("--discovery-port", self.discovery_port.is_some()),
                    (
                        "--discovery-role-label",
                        self.discovery_role_label.is_some(),
                    ),
                    (
                        "--discovery-model-label",
                        self.discovery_model_label.is_some(),
                    ),
                    ("--discovery-scheme", self.discovery_scheme.is_some()),
                ];
                if let Some((flag, _)) = stray.iter().find(|(_, set)| *set) {
                    return Err(format!("{flag} needs --discovery kubernetes"));
                }
            }
        }
        Ok(())
    }
}
