//! Membership through chitchat: publishes this node's metadata keys, reads
//! who is alive, and dials a load session to each live peer ordered after
//! this node.
//!
//! Everything read here is a hint (chitchat is unauthenticated): it decides
//! whom to dial and, together with a verified inbound link, whom to count.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chitchat::{ChitchatHandle, ChitchatId};
use quinn::Endpoint;
use tokio::task::JoinHandle;

use crate::core::{Core, GossipInfo};
use crate::identity::Incarnation;
use crate::push::LinkTimings;
use crate::session;

/// Gossip key of the QUIC load-plane address.
pub(crate) const KEY_QUIC: &str = "quic_addr";
/// Gossip key of the HTTP address.
pub(crate) const KEY_HTTP: &str = "http_addr";
/// Gossip key of the build version.
pub(crate) const KEY_VERSION: &str = "version";
/// Gossip key of the readiness (`serving`, `draining`, `left`).
pub(crate) const KEY_READINESS: &str = "readiness";
/// Gossip key of the poll-ownership hash version (`ownership`); absent in
/// builds from before it existed, which hash as version 1.
pub(crate) const KEY_OWNERSHIP_HASH: &str = "ownership_hash";

/// Dialing tasks by peer incarnation (only for peers this node dials).
#[derive(Default)]
pub(crate) struct Dialers {
    links: HashMap<Incarnation, JoinHandle<()>>,
}

impl Dialers {
    /// Waits (bounded) for the dialing tasks to end after a shutdown
    /// signal, then aborts the rest.
    pub(crate) async fn join_all(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for (_, task) in self.links.drain() {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }

    pub(crate) fn abort_all(&mut self) {
        for (_, task) in self.links.drain() {
            task.abort();
        }
    }
}

/// Reads chitchat's view once: every other node with its keys and liveness.
async fn read_gossip(handle: &ChitchatHandle, me: &ChitchatId) -> HashMap<Incarnation, GossipInfo> {
    handle
        .with_chitchat(|chitchat| {
            let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
            chitchat
                .node_states()
                .iter()
                .filter(|(id, _)| *id != me)
                .map(|(id, state)| {
                    let info = GossipInfo {
                        live: live.contains(id),
                        gossip_addr: id.gossip_advertise_addr,
                        quic_addr: state.get(KEY_QUIC).and_then(|a| a.parse().ok()),
                        http_addr: state.get(KEY_HTTP).map(str::to_string),
                        readiness: state.get(KEY_READINESS).map(str::to_string),
                        version: state.get(KEY_VERSION).map(str::to_string),
                        ownership_hash: state.get(KEY_OWNERSHIP_HASH).map(str::to_string),
                        heartbeat: u64::from(state.heartbeat()),
                    };
                    (Incarnation::new(id.node_id.clone(), id.generation_id), info)
                })
                .collect()
        })
        .await
}

/// The peers to dial: every live incarnation, ordered after us (the other
/// half of the pairs dial us). Not just the newest generation per name, and
/// not filtered by a gossiped `left`: gossip is unauthenticated, so a forged
/// newer incarnation or a forged `left` must not make us drop the real
/// member's link. A peer that really left said so with an authenticated
/// `Bye`; a dead or superseded incarnation drops out of gossip's live set.
fn wanted(
    core: &Core,
    gossip: &HashMap<Incarnation, GossipInfo>,
) -> HashMap<Incarnation, SocketAddr> {
    gossip
        .iter()
        .filter(|(inc, info)| {
            info.live && inc.name != core.me.name && session::dials(&core.me, inc)
        })
        .filter_map(|(inc, info)| info.quic_addr.map(|addr| (inc.clone(), addr)))
        .collect()
}

/// Polls chitchat every `period`, updates the core and the outbound links.
pub(crate) async fn run(
    core: Arc<Core>,
    handle: Arc<ChitchatHandle>,
    endpoint: Endpoint,
    dialers: Arc<tokio::sync::Mutex<Dialers>>,
    timings: LinkTimings,
    period: Duration,
) {
    let me = handle.chitchat_id().clone();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let gossip = read_gossip(&handle, &me).await;
        let want = wanted(&core, &gossip);
        {
            let mut tables = core.tables();
            let now = Instant::now();
            for (inc, info) in &gossip {
                let changed = tables
                    .gossip
                    .get(inc)
                    .is_none_or(|old| old.heartbeat != info.heartbeat);
                if changed {
                    tables.heartbeat_seen.insert(inc.clone(), now);
                }
            }
            tables
                .heartbeat_seen
                .retain(|inc, _| gossip.contains_key(inc));
            tables.gossip = gossip;
            core.refresh_membership(&mut tables);
        }
        let mut dialers = dialers.lock().await;
        let gone: Vec<Incarnation> = dialers
            .links
            .iter()
            .filter(|(inc, task)| !want.contains_key(*inc) || task.is_finished())
            .map(|(inc, _)| inc.clone())
            .collect();
        if !gone.is_empty() {
            let mut tables = core.tables();
            for inc in &gone {
                if let Some(task) = dialers.links.remove(inc) {
                    // Gossip says the peer is gone: drop the session now. An
                    // aborted session cannot clean up after itself, so its
                    // link entry goes here.
                    task.abort();
                    tables.links.remove(inc);
                }
            }
            core.refresh_membership(&mut tables);
        }
        for (inc, addr) in want {
            if dialers.links.contains_key(&inc) {
                continue;
            }
            let task = tokio::spawn(session::dial_loop(
                core.clone(),
                endpoint.clone(),
                inc.clone(),
                addr,
                timings,
            ));
            dialers.links.insert(inc, task);
        }
    }
}

/// Re-resolves the seeds every `period` and gossips with each address, so a
/// DNS name (e.g. a headless Service) keeps seeding replicas that appear.
pub(crate) async fn refresh_seeds(
    handle: Arc<ChitchatHandle>,
    seeds: Vec<String>,
    own: SocketAddr,
    period: Duration,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for seed in &seeds {
            match tokio::net::lookup_host(seed.as_str()).await {
                Ok(addrs) => {
                    for addr in addrs.filter(|a| *a != own) {
                        let _ = handle.gossip(addr);
                    }
                }
                Err(e) => tracing::debug!(seed = %seed, error = %e, "mesh seed lookup failed"),
            }
        }
    }
}
