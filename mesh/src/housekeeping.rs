//! The node's periodic chores, off the request path:
//!
//! - every sync interval, sample each worker's own dispatched counter, so a
//!   snapshot learned from a peer rebases the own count to the poll's time;
//! - every [`SWEEP_INTERVAL`], forget what left: incarnations dead for
//!   `forget_after` (via `refresh_membership`), entries their sender stopped
//!   refreshing, and worker keys nobody uses (not held by the router, idle,
//!   not polled here, named by no peer) — so memory and per-sync work
//!   follow the live fleet, not its history;
//! - with each sweep, measure the largest disagreement on work since the
//!   poll this node can see (the `shoal_mesh_stale_basis_tokens` gauge).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::core::{Core, Tables};
use crate::identity::{Incarnation, unix_millis};
use crate::slot::WorkerEntry;
use crate::worker_keys::unused;

/// How often forgotten things are swept.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Runs the chores forever (aborted with the mesh).
pub(crate) async fn run(core: Arc<Core>, sample_every: Duration) {
    let mut tick = tokio::time::interval(sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sweep = Instant::now();
    loop {
        tick.tick().await;
        sample_histories(&core);
        if last_sweep.elapsed() >= SWEEP_INTERVAL {
            sweep(&core);
            last_sweep = Instant::now();
        }
    }
}

/// Records each worker's own dispatched counter (only when it changed).
pub(crate) fn sample_histories(core: &Core) {
    let now_ms = unix_millis();
    for entry in core.worker_keys.list().iter() {
        let dispatched = entry.own.dispatched.load(Ordering::Relaxed);
        entry.history().sample(now_ms, dispatched, core.history);
    }
}

/// Forgets what left and refreshes the disagreement gauge.
pub(crate) fn sweep(core: &Core) {
    let now = Instant::now();
    let mut tables = core.tables();
    core.refresh_membership(&mut tables);
    let expired = tables.state.expire_idle(now, core.forget_after);
    let entries = core.worker_keys.list();
    let mut candidates: Vec<Arc<str>> = Vec::new();
    let mut live_idle: HashSet<Arc<str>> = HashSet::new();
    for entry in entries.iter() {
        if unused(entry) && !tables.state.mentions(&entry.key) {
            let since = *tables.idle_keys.entry(entry.key.clone()).or_insert(now);
            live_idle.insert(entry.key.clone());
            if now.saturating_duration_since(since) >= core.forget_after {
                candidates.push(entry.key.clone());
            }
        }
    }
    tables.idle_keys.retain(|key, _| live_idle.contains(key));
    drop(entries);
    let removed = core.worker_keys.remove_if_unused(&candidates);
    for key in &removed {
        tables.state.remove_snapshot(key);
        tables.own_polled_at.remove(key);
        tables.idle_keys.remove(key);
    }
    for key in expired {
        if let Some(entry) = core.worker_keys.get(&key) {
            core.publish_view(&tables, &entry, true);
        }
    }
    let worst = core
        .worker_keys
        .list()
        .iter()
        .map(|entry| stale_basis_tokens(&tables, &core.me, entry))
        .max()
        .unwrap_or(0);
    core.telemetry.stale_basis(worst);
}

/// Work since the poll that counted peers count from an older snapshot
/// than the freshest this node holds for `entry` (they have not learned it
/// yet, or cannot): the part of the fleet value replicas may disagree on.
/// Transient within a sync interval of each poll; lasting means trouble.
pub(crate) fn stale_basis_tokens(tables: &Tables, me: &Incarnation, entry: &WorkerEntry) -> u64 {
    let Some(freshest) = tables.state.snapshot(&entry.key).map(|s| s.polled_at_ms) else {
        return 0;
    };
    let mut stale = 0u64;
    let own = entry.own.read();
    if entry.own.basis_ms.load(Ordering::Relaxed) < freshest {
        stale = stale.saturating_add(own.dispatched_since_poll);
    }
    for inc in tables.counted.iter().filter(|inc| *inc != me) {
        if let Some(slot) = tables.state.slot(inc, &entry.key)
            && slot.basis_ms < freshest
        {
            stale = stale.saturating_add(slot.counts.dispatched_since_poll);
        }
    }
    stale
}
