//! Where the worker list comes from, and how its sources agree.
//!
//! Three sources feed the registry the request path reads:
//! - **seeds**: this replica's `--worker-urls` (static configuration);
//! - the **fleet-wide worker set** (`shoal_mesh::worker_set`): what an admin
//!   added or removed with `POST`/`DELETE /workers` on *any* replica,
//!   shared over the authenticated mesh (a set of this replica's own
//!   without one);
//! - **discovery** (Kubernetes EndpointSlices): every replica watches the
//!   API server itself, so all see the same Ready endpoints without the
//!   mesh relaying them.
//!
//! The rule, per URL: an admin write decides — added, it is routed;
//! removed, it is not (even if seeded or discovered) until the removal TTL
//! passes or someone adds it again; between admin writes the latest wins
//! fleet-wide. With no admin write, a seeded or discovered URL is routed.
//! [`WorkerSources::reconcile`] makes the registry match; every change of
//! any source calls it, so requests in flight on a removed worker finish
//! while new ones stop going there.

pub mod kubernetes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use shoal_mesh::SharedWorkerSet;

use crate::policy::Policy;
use crate::url::normalize_url;
use crate::workers::{Registry, Worker};

/// How often expired removals are forgotten and the registry re-checked
/// against the sources (changes are applied at once besides).
const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// Why a worker is in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Added through the admin API (on this or another replica).
    Admin,
    /// In this replica's `--worker-urls`.
    Seed,
    /// A Ready endpoint found by discovery.
    Discovery,
}

/// Why an admin change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdminError {
    /// The URL is already routed.
    #[error("worker {0} is already registered")]
    Exists(String),
    /// The URL is not routed.
    #[error("no worker {0} is registered")]
    NotFound(String),
    /// The fleet-wide set refused the write (full, or a bad URL).
    #[error("the worker set refused {0}: {1}")]
    Refused(String, &'static str),
}

/// What one reconcile changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// URLs added to the registry.
    pub added: Vec<String>,
    /// URLs removed from it.
    pub removed: Vec<String>,
}

/// The sources of one replica's worker list and the registry they feed.
pub struct WorkerSources {
    registry: Arc<Registry>,
    policy: Arc<dyn Policy>,
    set: SharedWorkerSet,
    seeds: Mutex<BTreeSet<String>>,
    discovered: Mutex<BTreeSet<String>>,
    /// One reconcile at a time, so two never interleave their registry edits.
    reconciling: Mutex<()>,
}

impl std::fmt::Debug for WorkerSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSources").finish_non_exhaustive()
    }
}

impl WorkerSources {
    /// Sources feeding `registry` (removals tell `policy`), with the
    /// fleet-wide `set` and this replica's normalised `seeds`.
    pub fn new(
        registry: Arc<Registry>,
        policy: Arc<dyn Policy>,
        set: SharedWorkerSet,
        seeds: &[String],
    ) -> Self {
        Self {
            registry,
            policy,
            set,
            seeds: Mutex::new(seeds.iter().cloned().collect()),
            discovered: Mutex::new(BTreeSet::new()),
            reconciling: Mutex::new(()),
        }
    }

    /// The registry these sources feed.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The fleet-wide worker set these sources read.
    pub fn worker_set(&self) -> &SharedWorkerSet {
        &self.set
    }

    /// Every URL the sources say to route, with why.
    pub fn desired(&self) -> BTreeMap<String, Source> {
        let mut out: BTreeMap<String, Source> = BTreeMap::new();
        for url in lock(&self.seeds).iter() {
            out.insert(url.clone(), Source::Seed);
        }
        for url in lock(&self.discovered).iter() {
            out.entry(url.clone()).or_insert(Source::Discovery);
        }
        let set = self.set.lock();
        for (url, register) in set.iter() {
            // A peer's URL is used only in the form this build would have
            // written it (the mesh carries strings; the rule is ours).
            if normalize_url(url).ok().as_deref() != Some(&**url) {
                continue;
            }
            if register.present {
                out.insert(url.to_string(), Source::Admin);
            } else {
                out.remove(&**url);
            }
        }
        out
    }

    /// Why `url` is routed, if it is.
    pub fn source_of(&self, url: &str) -> Option<Source> {
        self.desired().get(url).copied()
    }

    /// Makes the registry hold exactly the desired URLs: new ones are
    /// added, gone ones removed (their requests in flight finish).
    pub fn reconcile(&self) -> Reconciled {
        let _one = lock(&self.reconciling);
        let desired = self.desired();
        let current = self.registry.all();
        let mut done = Reconciled::default();
        for worker in current.iter() {
            if !desired.contains_key(worker.url())
                && let Ok(removed) = self.registry.remove(worker.url())
            {
                self.policy.on_worker_removed(&removed);
                tracing::info!(worker = removed.url(), "worker removed");
                done.removed.push(removed.url().to_string());
            }
        }
        for (url, source) in desired {
            if current.iter().any(|w| w.url() == url) {
                continue;
            }
            if self.registry.add(url.clone()).is_ok() {
                tracing::info!(worker = %url, ?source, "worker added");
                done.added.push(url);
            }
        }
        done
    }

    /// `POST /workers`: adds the (normalised) `url` fleet-wide. A URL only
    /// this replica seeds or discovers is added too (every replica then
    /// routes it, as a `DELETE` of it removes it from every replica); one
    /// an admin already added is [`AdminError::Exists`].
    pub fn add(&self, url: &str) -> Result<Arc<Worker>, AdminError> {
        if self.set.lock().get(url).is_some_and(|r| r.present) {
            return Err(AdminError::Exists(url.to_string()));
        }
        self.set
            .write(url, true)
            .map_err(|r| AdminError::Refused(url.to_string(), r.reason()))?;
        self.reconcile();
        self.registry
            .all()
            .iter()
            .find(|w| w.url() == url)
            .cloned()
            .ok_or_else(|| AdminError::NotFound(url.to_string()))
    }

    /// `DELETE /workers/{url}`: removes `url` fleet-wide, whatever source
    /// routed it (for the removal TTL; see the module doc).
    pub fn remove(&self, url: &str) -> Result<(), AdminError> {
        if !self.desired().contains_key(url) {
            return Err(AdminError::NotFound(url.to_string()));
        }
        self.set
            .write(url, false)
            .map_err(|r| AdminError::Refused(url.to_string(), r.reason()))?;
        self.reconcile();
        Ok(())
    }

    /// Replaces this replica's seeds (a configuration reload changed
    /// `--worker-urls`).
    pub fn set_seeds(&self, urls: &[String]) -> Reconciled {
        *lock(&self.seeds) = urls.iter().cloned().collect();
        self.reconcile()
    }

    /// Replaces what discovery found (normalised URLs of Ready endpoints).
    pub fn set_discovered(&self, urls: BTreeSet<String>) -> Reconciled {
        *lock(&self.discovered) = urls;
        self.reconcile()
    }

    /// Applies fleet-wide changes as they arrive and forgets expired
    /// removals, forever (aborted with the replica).
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.set.subscribe();
        let mut tick = tokio::time::interval(RECONCILE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tick.tick() => {
                    self.set.forget_removals();
                }
            }
            self.reconcile();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
