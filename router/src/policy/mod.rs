//! Routing policies: pick one worker among the available candidates.
//!
//! Every policy implements [`Policy`]; the router asks it what it needs
//! (capability methods) and never looks at which policy it is. Policies read
//! load only through the [`FleetView`], so their thresholds mean the same on
//! one replica and on a meshed fleet.
//!
//! Shared rules every policy follows (each fixes a way a router herds or
//! misreads load):
//! - one clock read per selection, passed to every [`FleetView::load`];
//! - engine numbers are re-checked where they are used (`signals`): a
//!   non-finite or out-of-range value is missing, never compared;
//! - a worker missing an engine signal must not win by default: a
//!   per-worker term (least_load's KV barrier) is imputed for it from the
//!   worst reporting candidate; a term that compares workers with each
//!   other (cache_aware's KV imbalance guards) is skipped unless every
//!   candidate has a fresh reading;
//! - ties are broken uniformly at random (`pick::MinPick`);
//! - bookings are visible to the very next selection, so concurrent
//!   selections water-fill instead of herding.
//!
//! # Adding a policy
//!
//! Every place a new policy touches, in order; nothing else lists policies
//! by hand (benches, tests and docs derive their lists from
//! [`PolicyKind::names`](crate::config::PolicyKind::names)):
//!
//! 1. Write `policy/<name>.rs`: a type implementing [`Policy`]. It states
//!    what it needs through the trait's capability methods (request text,
//!    token-work, per-worker clean-up, background upkeep, fleet-wide
//!    sightings of prompt keys); nothing outside
//!    this module ever asks which policy is running. If it has knobs, it
//!    keeps them in `knobs::Knobs` and implements [`Policy::reconfigure`],
//!    or a configuration reload silently keeps the old values.
//! 2. Declare it here: a `mod <name>;` line and a `pub use` of its type
//!    below.
//! 3. Add a variant to `PolicyKind` (`config/routing.rs`); its doc comment
//!    is the `--policy` value's help.
//! 4. If it has knobs: a `#[derive(Args)]` group next to the others in
//!    `config/routing.rs` (fields named after their flags, defaults in
//!    `config/defaults.rs`, bad values rejected by a `config/parsers.rs`
//!    parser), with its own help-heading constant, flattened into
//!    `RoutingConfig`, and both re-exported from `config/mod.rs`.
//! 5. Add its row to [`catalog_entry`]: the compiler rejects a `PolicyKind`
//!    without one, the catalog tests check the row's name and flag
//!    heading, and a policy file whose `impl Policy` no `--policy` value
//!    builds fails them too (checked by dropping a dummy policy's file in
//!    this directory: the test named it).
//! 6. Describe it in the policies page of the docs and regenerate the flag
//!    reference (`SHOAL_UPDATE_README=1 cargo test -p shoal --test readme`).

mod cache_aware;
mod knobs;
mod least_load;
mod load_aware;
mod pick;
mod power_of_two;
mod precise_prefix;
mod prefix_affinity;
mod prefix_tree;
mod random;
mod round_robin;
mod sightings;
mod signals;

mod catalog;

#[cfg(test)]
mod invariance;
#[cfg(test)]
mod testkit;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::config::RoutingConfig;
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

pub use cache_aware::CacheAwarePolicy;
pub use catalog::{CatalogEntry, build, catalog_entry};
pub use least_load::LeastLoadPolicy;
pub use load_aware::{LoadAwarePolicy, queue_score};
pub use power_of_two::PowerOfTwoPolicy;
pub use precise_prefix::PrecisePrefixPolicy;
pub use prefix_affinity::PrefixAffinityPolicy;
pub use prefix_tree::TreeUpkeep;
pub use random::RandomPolicy;
pub use round_robin::RoundRobinPolicy;
pub use sightings::{ShareSighting, Sightings};

/// A routing policy: the one interface the router routes through, so a
/// policy's needs are asked for, never inferred from its name.
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

    /// How many leading bytes of prompt text [`RequestInfo::text`] must
    /// hold for this policy (prefix-matching policies), or `None` when it
    /// reads no text. Bounded, so that a huge prompt is never copied whole
    /// for routing: the router keeps at most this much of it.
    fn prompt_text_limit(&self) -> Option<usize> {
        None
    }

    /// The table of recently seen prompt keys the policy decides with, if
    /// it keeps one: the router shares it with the mesh's peers, so
    /// "seen before" means seen anywhere in the fleet (see [`Sightings`]).
    fn sightings(&self) -> Option<Arc<Sightings>> {
        None
    }

    /// Token-work to book for `request` on the chosen worker. The default is
    /// the request's own estimate; a policy whose scores are token-work
    /// counts a request without an estimate at a configured mean instead of
    /// zero, so such requests still water-fill.
    fn token_work(&self, request: &RequestInfo) -> u64 {
        request.token_work()
    }

    /// Takes new knobs from `routing` (a configuration reload), keeping
    /// what the policy learned; policies without knobs have nothing to do.
    fn reconfigure(&self, _routing: &RoutingConfig) {}

    /// Called when a worker leaves the registry, to drop per-worker state.
    /// Must be cheap: heavy clean-up belongs in [`Policy::background_task`].
    fn on_worker_removed(&self, _worker: &Worker) {}

    /// Upkeep the policy needs off the request path (e.g. prefix-tree
    /// eviction), spawned where the replica starts its other background
    /// tasks. It runs until the replica stops; it is asked for again to
    /// restart it after a panic, so each call must return a fresh task.
    fn background_task(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// The engines' KV-event index the policy routes on, if it uses one:
    /// the replica runs its subscriptions (one stream per registered
    /// worker rank) next to its other background tasks.
    fn kv_events(&self) -> Option<Arc<crate::kv_events::KvEvents>> {
        None
    }
}
