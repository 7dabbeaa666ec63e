//! The node's shared core: identity, worker keys, the fleet state and
//! what membership and the load links say about each peer. Background tasks
//! update it; the router's hot path never locks it (it reads the per-worker
//! views this module publishes).
//!
//! Where a peer's frame becomes state: [`Core::apply_update`] (called by
//! `session::receive` for every decoded update) turns each entry into one
//! [`FleetState`] call and republishes the views of the workers it touched.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use shoal_proto::frames::{MAX_KEY_BYTES, Update, WorkerSetEntry};
use shoal_proto::{EngineKind, EngineLoad};

use crate::identity::{Incarnation, unix_micros};
use crate::objects::ObjectExchange;
use crate::outbox::Outbox;
use crate::sightings::SightingExchange;
use crate::slot::{Dispatched, HistoryWindow, PollStamp, RemoteView, SnapshotView, WorkerEntry};
use crate::state::{Clock, FleetState, SnapshotValue, clamp_poll_time};
#[cfg(feature = "testsuite")]
use crate::tap::FrameTap;
use crate::telemetry::Telemetry;
use crate::tenants::TenantBook;
use crate::worker_keys::WorkerKeys;
use crate::worker_set::{Sender, SharedWorkerSet, WallClock, WorkerSet};

/// What chitchat says about one incarnation (hints only: unauthenticated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GossipInfo {
    pub(crate) live: bool,
    pub(crate) gossip_addr: SocketAddr,
    pub(crate) quic_addr: Option<SocketAddr>,
    pub(crate) http_addr: Option<String>,
    pub(crate) readiness: Option<String>,
    pub(crate) version: Option<String>,
    /// Gossiped `ownership_hash` value, as published (see `ownership`).
    pub(crate) ownership_hash: Option<String>,
    pub(crate) heartbeat: u64,
}

/// An inbound load link whose certificate named the incarnation's node.
#[derive(Debug, Clone)]
pub(crate) struct LinkInfo {
    pub(crate) conn_id: usize,
    pub(crate) remote: SocketAddr,
    pub(crate) last_frame: Instant,
}

/// Mutable bookkeeping, behind one mutex used only by background tasks.
/// Every map is bounded by the live fleet: what leaves is forgotten after
/// [`Core::forget_after`] (see `housekeeping`).
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) state: FleetState,
    pub(crate) gossip: HashMap<Incarnation, GossipInfo>,
    pub(crate) heartbeat_seen: HashMap<Incarnation, Instant>,
    pub(crate) links: HashMap<Incarnation, LinkInfo>,
    pub(crate) left: HashSet<Incarnation>,
    pub(crate) dead_since: HashMap<Incarnation, Instant>,
    /// Live verified peers whose slots count (never includes self).
    pub(crate) counted: HashSet<Incarnation>,
    /// The counted peers that share poll ownership with this node: those
    /// whose gossiped ownership hash version is this node's. A peer of a
    /// build that hashes differently still counts (its load is real), but
    /// it elects owners with its own kind, so no worker goes unpolled.
    pub(crate) co_owners: HashSet<Incarnation>,
    /// Last snapshot poll time this node published, per worker.
    pub(crate) own_polled_at: HashMap<Arc<str>, u64>,
    /// Worker keys nobody uses, with since when.
    pub(crate) idle_keys: HashMap<Arc<str>, Instant>,
}

/// Readiness values published in gossip.
pub(crate) const READINESS_LEFT: &str = "left";

pub(crate) struct Core {
    pub(crate) me: Incarnation,
    pub(crate) cluster_id: String,
    /// The ownership hash version this node gossips and shares ownership
    /// under ([`crate::ownership::OWNERSHIP_HASH_VERSION`]).
    pub(crate) ownership_hash: u32,
    pub(crate) worker_keys: WorkerKeys,
    pub(crate) tables: Mutex<Tables>,
    /// Names of live verified members plus self, sorted.
    pub(crate) members: ArcSwap<Vec<Arc<str>>>,
    pub(crate) telemetry: Telemetry,
    /// Round counter of this incarnation's updates (strictly increasing).
    pub(crate) round: AtomicU64,
    #[cfg(feature = "testsuite")]
    pub(crate) tap: Option<Arc<dyn FrameTap>>,
    /// How long a dead incarnation, an unused worker key or an entry its
    /// sender stopped refreshing is kept before it is forgotten.
    pub(crate) forget_after: Duration,
    /// Shortest gap between pushes on change and the most pushes per
    /// second over all links: the bell's gap follows the link count.
    pub(crate) push_pacing: (Duration, u32),
    /// How far back, and how finely, each worker's own dispatch history
    /// is kept (see `slot::DispatchHistory`).
    pub(crate) history: HistoryWindow,
    /// Flipped once on graceful shutdown: every session says `Bye`.
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    /// Bumped when own slots changed (see `bell`): every link pushes.
    pub(crate) changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// The fleet-wide worker set; this node's writes ring `changes` too.
    pub(crate) worker_set: SharedWorkerSet,
    /// What the peers were told, and the rounds every link sends.
    pub(crate) outbox: Outbox,
    /// Says, and reads, packed slot changes (false only as a test's
    /// stand-in for an older build).
    pub(crate) speaks_packed: bool,
    /// Prompt keys seen here for the first time, for the next round, and
    /// where the peers' go.
    pub(crate) sightings: Arc<SightingExchange>,
    /// Where objects created through this node live, for the next round,
    /// and where the peers' pairs go.
    pub(crate) objects: Arc<ObjectExchange>,
    /// Per-tenant usage: this node's own for the next round, and the
    /// counted peers'.
    pub(crate) tenants: Arc<TenantBook>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn new(
        me: Incarnation,
        cluster_id: String,
        forget_after: Duration,
        worker_removal_ttl: Duration,
        refresh_every: Duration,
        clock: WallClock,
    ) -> Self {
        let members = vec![me.name.clone()];
        let changes = Arc::new(tokio::sync::watch::Sender::new(0));
        // The generation is this run's start (µs): entries in its own name
        // stamped before it are a previous run's, which peers relay back.
        let worker_set = SharedWorkerSet::meshed(
            WorkerSet::new(me.name.clone()).started_at(me.generation),
            worker_removal_ttl,
            changes.clone(),
            clock,
        );
        let worker_keys = WorkerKeys::default();
        let tenants = Arc::new(TenantBook::meshed(worker_keys.bell()));
        Self {
            me,
            cluster_id,
            ownership_hash: crate::ownership::OWNERSHIP_HASH_VERSION,
            worker_keys,
            tables: Mutex::new(Tables::default()),
            members: ArcSwap::from_pointee(members),
            telemetry: Telemetry::default(),
            round: AtomicU64::new(0),
            #[cfg(feature = "testsuite")]
            tap: None,
            forget_after,
            push_pacing: (
                Duration::from_millis(crate::config::DEFAULT_PUSH_MIN_GAP_MS),
                crate::config::DEFAULT_MAX_PUSH_RATE,
            ),
            history: HistoryWindow::new(crate::config::DEFAULT_DISPATCH_HISTORY),
            shutdown: tokio::sync::watch::Sender::new(false),
            changes,
            worker_set,
            outbox: Outbox::new(refresh_every),
            speaks_packed: true,
            sightings: Arc::default(),
            objects: Arc::default(),
            tenants,
        }
    }

    /// Merges worker-set entries `from` sent, judging their origins
    /// against the live verified members; refusals are counted by reason.
    pub(crate) fn merge_workers(&self, from: &Incarnation, entries: &[WorkerSetEntry]) {
        let members = self.members.load();
        let live = |name: &str| members.binary_search_by(|m| (**m).cmp(name)).is_ok();
        let sender = Sender {
            name: &from.name,
            is_live_peer: &live,
        };
        for refused in self.worker_set.merge_from(&sender, entries) {
            self.telemetry.dropped(refused.reason());
        }
    }

    pub(crate) fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads what the counted peers contribute to `entry` and publishes it
    /// (the router reads it without locks). Who polls the worker is
    /// re-derived (one look per counted peer) only when `pollers_moved`.
    pub(crate) fn publish_view(&self, tables: &Tables, entry: &WorkerEntry, pollers_moved: bool) {
        let snapshot = tables.state.snapshot(&entry.key).map(|s| SnapshotView {
            source: s.value.source,
            load: s.value.load,
            figures: shoal_proto::LoadFigures::of(&s.value.load),
            polled_at_unix_ms: s.polled_at_ms,
            taken_at: s.taken_at,
        });
        let current = entry.remote.load();
        let pollers = if !pollers_moved
            || tables
                .state
                .pollers_are(&entry.key, &tables.co_owners, &current.pollers)
        {
            current.pollers.clone()
        } else {
            tables.state.pollers(&entry.key, &tables.co_owners).into()
        };
        let view = RemoteView {
            counts: tables.state.total(&entry.key),
            snapshot,
            pollers,
        };
        if **current != view {
            entry.remote.store(Arc::new(view));
        }
    }

    fn publish_key(&self, tables: &Tables, key: &str, pollers_moved: bool) {
        if let Some(entry) = self.worker_keys.get_or_create(key, true) {
            self.publish_view(tables, &entry, pollers_moved);
        }
    }

    pub(crate) fn publish_all(&self, tables: &Tables) {
        for entry in self.worker_keys.list().iter() {
            self.publish_view(tables, entry, true);
        }
    }

    /// Re-derives which peers count after gossip, links or byes changed,
    /// forgets incarnations dead for longer than `forget_after`, and
    /// republishes every view if the counted set moved.
    pub(crate) fn refresh_membership(&self, tables: &mut Tables) {
        // Only authenticated facts decide who counts: a verified load link
        // (its certificate names the peer, its Hello gives the generation)
        // and an authenticated Bye. Gossip is unauthenticated, so a forged
        // "newer incarnation" or a forged `left` must not un-count a peer;
        // a restarted peer supersedes its old incarnation once its new link
        // verifies, and a dead one stops counting when its link times out.
        let mut newest: HashMap<&str, u64> = HashMap::new();
        for inc in tables.links.keys() {
            let newest_gen = newest.entry(&inc.name).or_insert(0);
            *newest_gen = (*newest_gen).max(inc.generation);
        }
        let counted: HashSet<Incarnation> = tables
            .links
            .keys()
            .filter(|inc| {
                inc.name != self.me.name
                    && !tables.left.contains(*inc)
                    && newest.get(&*inc.name) == Some(&inc.generation)
            })
            .cloned()
            .collect();
        let now = Instant::now();
        let known: Vec<Incarnation> = tables
            .gossip
            .keys()
            .chain(tables.state.incarnations())
            .chain(tables.left.iter())
            .cloned()
            .collect();
        for inc in known {
            if counted.contains(&inc) {
                tables.dead_since.remove(&inc);
            } else {
                tables.dead_since.entry(inc).or_insert(now);
            }
        }
        let expired: Vec<Incarnation> = tables
            .dead_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= self.forget_after)
            .map(|(inc, _)| inc.clone())
            .collect();
        for inc in expired {
            tables.state.forget(&inc);
            tables.left.remove(&inc);
            tables.dead_since.remove(&inc);
        }
        // Gossip is a hint, and so is this: a forged version can only make
        // this node poll more (it owns what it would have shared), never
        // leave a worker unpolled.
        let co_owners: HashSet<Incarnation> = counted
            .iter()
            .filter(|inc| {
                tables.gossip.get(*inc).is_none_or(|g| {
                    crate::ownership::gossiped_hash_version(g.ownership_hash.as_deref())
                        == Some(self.ownership_hash)
                })
            })
            .cloned()
            .collect();
        let foreign = counted.len() - co_owners.len();
        let co_owners_moved = co_owners != tables.co_owners;
        tables.co_owners = co_owners;
        let counted_moved = counted != tables.counted;
        if counted_moved {
            tables.state.set_counted(&counted);
            self.tenants
                .set_counted(&counted, crate::identity::unix_secs());
            tables.counted = counted;
            let mut names: Vec<Arc<str>> = tables.counted.iter().map(|i| i.name.clone()).collect();
            names.push(self.me.name.clone());
            names.sort();
            names.dedup();
            self.members.store(Arc::new(names));
        }
        if counted_moved || co_owners_moved {
            self.publish_all(tables);
        }
        let (min_gap, max_rate) = self.push_pacing;
        self.worker_keys.bell().set_gap(crate::bell::push_gap(
            min_gap,
            tables.links.len(),
            max_rate,
        ));
        self.telemetry
            .membership(tables.counted.len() + 1, tables.links.len(), foreign);
    }

    /// Merges one update from `from`, resolving worker ids through the
    /// link's dictionary. Bad entries are dropped and counted; a peer's
    /// engine numbers pass the same validation as an engine's.
    pub(crate) fn apply_update(
        &self,
        from: &Incarnation,
        dict: &mut HashMap<u32, Arc<str>>,
        update: Update,
    ) {
        let mut polls: Vec<(Arc<str>, bool)> = Vec::with_capacity(update.keys.len());
        for def in update.keys {
            // A refused definition unbinds the id: the sender no longer
            // means the key it named before, so entries for the id are
            // dropped (counted) until a definition is accepted.
            if def.key.is_empty() || def.key.len() > MAX_KEY_BYTES {
                dict.remove(&def.id);
                self.telemetry.dropped("bad_key");
                continue;
            }
            match self.worker_keys.get_or_create(&def.key, true) {
                Some(entry) => {
                    dict.insert(def.id, entry.key.clone());
                    polls.push((entry.key.clone(), def.polled));
                }
                None => {
                    dict.remove(&def.id);
                    self.telemetry.dropped("too_many_keys");
                }
            }
        }
        let clock = Clock::now();
        let mut tables = self.tables();
        let mut touched: Vec<Arc<str>> = Vec::new();
        let mut polls_moved: Vec<Arc<str>> = Vec::new();
        for (key, polled) in polls {
            if tables.state.apply_polls(from, &key, polled, clock.now) {
                polls_moved.push(key.clone());
                touched.push(key);
            }
        }
        for slot in update.slots {
            let Some(key) = dict.get(&slot.id) else {
                self.telemetry.dropped("unknown_key");
                continue;
            };
            if tables
                .state
                .apply_slot(from, key, update.round, slot.counts, clock.now)
            {
                touched.push(key.clone());
            }
        }
        for basis in update.bases {
            let Some(key) = dict.get(&basis.id) else {
                self.telemetry.dropped("unknown_key");
                continue;
            };
            // Only /mesh/status and the disagreement gauge read it: no
            // view to republish.
            tables
                .state
                .apply_basis(from, key, basis.polled_at_unix_ms, clock.now);
        }
        for snap in update.snapshots {
            let Some(key) = dict.get(&snap.id) else {
                self.telemetry.dropped("unknown_key");
                continue;
            };
            let value = SnapshotValue {
                source: snap.source,
                load: snap.load.revalidated(),
                claimed_polled_at_ms: snap.polled_at_unix_ms,
            };
            if clamp_poll_time(snap.polled_at_unix_ms, clock.unix_ms) < snap.polled_at_unix_ms {
                self.telemetry.clamped_poll_time();
            }
            // The poller is the authenticated sender, never a claimed name.
            if let Some(polled_at) = tables.state.apply_snapshot(key, value, &from.name, clock) {
                self.rebase_to_peer_snapshot(key, polled_at);
                touched.push(key.clone());
            }
        }
        if let Some(link) = tables.links.get_mut(from) {
            link.last_frame = Instant::now();
        }
        touched.sort();
        touched.dedup();
        polls_moved.sort();
        for key in &touched {
            self.publish_key(&tables, key, polls_moved.binary_search(key).is_ok());
        }
        drop(tables);
        if !touched.is_empty() && update.prev_read_at_unix_us > 0 {
            let lag = unix_micros().saturating_sub(update.prev_read_at_unix_us);
            self.telemetry.lag(Duration::from_micros(lag));
        }
    }

    /// A peer's snapshot of `key` polled at `polled_at` is now the freshest:
    /// this node counts its own work from what it had dispatched then.
    fn rebase_to_peer_snapshot(&self, key: &str, polled_at: u64) {
        let Some(entry) = self.worker_keys.get(key) else {
            return;
        };
        // A poll time behind this clock by more than the history reaches
        // (a poller's clock behind, a very slow poll) is taken as the
        // history's start: the count stays within the window's work.
        let base = match entry.history().at(polled_at) {
            Dispatched::Then(base) => base,
            Dispatched::Oldest(base) => {
                self.telemetry.rebase_history_short();
                base
            }
        };
        entry.own.rebase(base, polled_at);
        entry.changed();
    }

    /// Stores a snapshot this node polled (as the LWW poller) and returns
    /// it as stored (its poll time strictly increasing per worker).
    /// If it is the freshest, this node counts its own work from the
    /// poll's start on.
    pub(crate) fn apply_own_snapshot(
        &self,
        entry: &WorkerEntry,
        stamp: &PollStamp,
        source: EngineKind,
        load: EngineLoad,
    ) -> SnapshotValue {
        let mut tables = self.tables();
        let clock = Clock::now();
        let last = tables.own_polled_at.get(&entry.key).copied().unwrap_or(0);
        // Bounded like a peer's (a forged or saturated stamp must not stop
        // later polls from being newer), and strictly increasing.
        let polled_at =
            clamp_poll_time(stamp.polled_at_unix_ms, clock.unix_ms).max(last.saturating_add(1));
        tables.own_polled_at.insert(entry.key.clone(), polled_at);
        let value = SnapshotValue {
            source,
            load,
            claimed_polled_at_ms: polled_at,
        };
        let won = tables
            .state
            .apply_snapshot(&entry.key, value, &self.me.name, clock);
        if let Some(polled_at) = won {
            entry.own.rebase(stamp.dispatched, polled_at);
            self.publish_view(&tables, entry, false);
        }
        value
    }
}
