//! Routing policies: pick one worker among the available candidates.
//!
//! Every policy implements [`Policy`]; the router asks it what it needs
//! (capability methods) and never looks at which policy it is. Policies read
//! load only through the [`FleetView`], so their thresholds mean the same on
//! one replica and on a meshed fleet.

mod random;
mod round_robin;

use std::sync::Arc;

use crate::config::{Config, PolicyKind};
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

pub use random::RandomPolicy;
pub use round_robin::RoundRobinPolicy;

/// A routing policy.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// Name for logs and metrics (never used for dispatch).
    fn name(&self) -> &'static str;

    /// Index into `candidates` of the worker to use, or `None` to refuse.
    /// `candidates` is never empty and holds only available workers.
    fn select(
        &self,
        candidates: &[Arc<Worker>],
        request: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize>;

    /// Whether [`RequestInfo::text`] must be filled (prefix-matching policies).
    fn needs_request_text(&self) -> bool {
        false
    }

    /// Whether the policy reads engine snapshots (and so needs load polling).
    fn reads_engine_load(&self) -> bool {
        false
    }

    /// Called when a worker leaves the registry, to drop per-worker state.
    fn on_worker_removed(&self, _url: &str) {}
}

/// Builds the configured policy.
pub fn build(config: &Config) -> Arc<dyn Policy> {
    match config.policy {
        PolicyKind::RoundRobin => Arc::new(RoundRobinPolicy::default()),
        PolicyKind::Random => Arc::new(RandomPolicy),
    }
}
