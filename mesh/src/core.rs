//! The node's shared core: identity, worker registry, the fleet state and
//! what membership and the load links say about each peer. Background tasks
//! update it; the router's hot path never locks it (it reads the per-worker
//! views this module publishes).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use shoal_proto::frames::{MAX_KEY_BYTES, Update};

use crate::identity::{Incarnation, unix_micros};
use crate::registry::Registry;
use crate::slot::{RemoteView, SnapshotView};
use crate::state::{FleetState, Inflight, SnapshotValue};
use crate::tap::FrameTap;
use crate::telemetry::Telemetry;

/// What chitchat says about one incarnation (hints only: unauthenticated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GossipInfo {
    pub(crate) live: bool,
    pub(crate) gossip_addr: SocketAddr,
    pub(crate) quic_addr: Option<SocketAddr>,
    pub(crate) http_addr: Option<String>,
    pub(crate) readiness: Option<String>,
    pub(crate) version: Option<String>,
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
#[derive(Debug, Default)]
pub(crate) struct Book {
    pub(crate) state: FleetState,
    pub(crate) gossip: HashMap<Incarnation, GossipInfo>,
    pub(crate) heartbeat_seen: HashMap<Incarnation, Instant>,
    pub(crate) links: HashMap<Incarnation, LinkInfo>,
    pub(crate) left: HashSet<Incarnation>,
    pub(crate) dead_since: HashMap<Incarnation, Instant>,
    /// Live verified peers whose slots count (never includes self).
    pub(crate) counted: HashSet<Incarnation>,
    /// Last snapshot poll time this node published, per worker.
    pub(crate) own_polled_at: HashMap<Arc<str>, u64>,
}

/// Readiness values published in gossip.
pub(crate) const READINESS_LEFT: &str = "left";

pub(crate) struct Core {
    pub(crate) me: Incarnation,
    pub(crate) cluster_id: String,
    pub(crate) registry: Registry,
    pub(crate) book: Mutex<Book>,
    /// Names of live verified members plus self, sorted: ownership input.
    pub(crate) owners: ArcSwap<Vec<Arc<str>>>,
    pub(crate) telemetry: Telemetry,
    /// Round counter of this incarnation's updates (strictly increasing).
    pub(crate) round: AtomicU64,
    pub(crate) tap: Option<Arc<dyn FrameTap>>,
    pub(crate) forget_dead_after: Duration,
    /// Flipped once on graceful shutdown: every session says `Bye`.
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
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
        tap: Option<Arc<dyn FrameTap>>,
        forget_dead_after: Duration,
    ) -> Self {
        let owners = vec![me.name.clone()];
        Self {
            me,
            cluster_id,
            registry: Registry::default(),
            book: Mutex::new(Book::default()),
            owners: ArcSwap::from_pointee(owners),
            telemetry: Telemetry::default(),
            round: AtomicU64::new(0),
            tap,
            forget_dead_after,
            shutdown: tokio::sync::watch::Sender::new(false),
        }
    }

    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Recomputes the remote view of `key` and publishes it to its entry.
    fn publish_view(&self, book: &Book, key: &Arc<str>) {
        let Some(entry) = self.registry.get_or_create(key, true) else {
            return;
        };
        let inflight = book.state.inflight(key, &book.counted);
        let snapshot = book
            .state
            .snapshot(key)
            .map(|(value, marker, learned_at)| SnapshotView {
                source: value.source,
                load: value.load,
                polled_at_unix_ms: marker.0,
                dispatched_mark: value.dispatched_mark,
                learned_at,
            });
        let view = RemoteView {
            requests: inflight.requests,
            tokens: inflight.tokens,
            pending_prefill: inflight.pending_prefill,
            dispatched: book.state.dispatched(key),
            snapshot,
        };
        if **entry.remote.load() != view {
            entry.remote.store(Arc::new(view));
        }
    }

    fn publish_all(&self, book: &Book) {
        for key in book.state.workers() {
            self.publish_view(book, &key);
        }
    }

    /// Re-derives which peers count after gossip, links or byes changed;
    /// republishes every view if the set moved.
    pub(crate) fn refresh_membership(&self, book: &mut Book) {
        // Only authenticated facts decide who counts: a verified load link
        // (its certificate names the peer, its Hello gives the generation)
        // and an authenticated Bye. Gossip is unauthenticated, so a forged
        // "newer incarnation" or a forged `left` must not un-count a peer;
        // a restarted peer supersedes its old incarnation once its new link
        // verifies, and a dead one stops counting when its link times out.
        let mut newest: HashMap<&str, u64> = HashMap::new();
        for inc in book.links.keys() {
            let newest_gen = newest.entry(&inc.name).or_insert(0);
            *newest_gen = (*newest_gen).max(inc.generation);
        }
        let counted: HashSet<Incarnation> = book
            .links
            .keys()
            .filter(|inc| {
                inc.name != self.me.name
                    && !book.left.contains(*inc)
                    && newest.get(&*inc.name) == Some(&inc.generation)
            })
            .cloned()
            .collect();
        let now = Instant::now();
        let known: Vec<Incarnation> = book
            .gossip
            .keys()
            .chain(book.state.incarnations())
            .cloned()
            .collect();
        for inc in known {
            if counted.contains(&inc) {
                book.dead_since.remove(&inc);
            } else {
                book.dead_since.entry(inc).or_insert(now);
            }
        }
        let expired: Vec<Incarnation> = book
            .dead_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= self.forget_dead_after)
            .map(|(inc, _)| inc.clone())
            .collect();
        for inc in expired {
            book.state.forget(&inc);
            book.dead_since.remove(&inc);
        }
        if counted != book.counted {
            book.counted = counted;
            let mut names: Vec<Arc<str>> = book.counted.iter().map(|i| i.name.clone()).collect();
            names.push(self.me.name.clone());
            names.sort();
            names.dedup();
            self.owners.store(Arc::new(names));
            self.publish_all(book);
        }
        self.telemetry
            .membership(book.counted.len() + 1, book.links.len());
    }

    /// Merges one update from `from`, resolving worker ids through the
    /// link's dictionary. Bad entries are dropped and counted.
    pub(crate) fn apply_update(
        &self,
        from: &Incarnation,
        dict: &mut HashMap<u32, Arc<str>>,
        update: Update,
    ) {
        for def in update.keys {
            if def.key.is_empty() || def.key.len() > MAX_KEY_BYTES {
                self.telemetry.dropped("bad_key");
                continue;
            }
            match self.registry.get_or_create(&def.key, true) {
                Some(entry) => {
                    dict.insert(def.id, entry.key.clone());
                }
                None => self.telemetry.dropped("too_many_keys"),
            }
        }
        let mut book = self.book();
        let mut touched: Vec<Arc<str>> = Vec::new();
        for slot in update.slots {
            let Some(key) = dict.get(&slot.id) else {
                self.telemetry.dropped("unknown_key");
                continue;
            };
            let inflight = Inflight {
                requests: slot.requests,
                tokens: slot.tokens,
                pending_prefill: slot.pending_prefill,
            };
            if book
                .state
                .apply_slot(from, key, update.round, inflight, slot.dispatched)
            {
                touched.push(key.clone());
            }
        }
        for snap in update.snapshots {
            let Some(key) = dict.get(&snap.id) else {
                self.telemetry.dropped("unknown_key");
                continue;
            };
            let value = SnapshotValue {
                source: snap.source,
                load: snap.load,
                dispatched_mark: snap.dispatched_mark,
            };
            // The poller is the authenticated sender, never a claimed name.
            let marker = (snap.polled_at_unix_ms, from.name.clone());
            if book.state.apply_snapshot(key, value, marker) {
                touched.push(key.clone());
            }
        }
        if let Some(link) = book.links.get_mut(from) {
            link.last_frame = Instant::now();
        }
        for key in &touched {
            self.publish_view(&book, key);
        }
        drop(book);
        if !touched.is_empty() && update.prev_read_at_unix_us > 0 {
            let lag = unix_micros().saturating_sub(update.prev_read_at_unix_us);
            self.telemetry.lag(Duration::from_micros(lag));
        }
    }

    /// Stores a snapshot this node polled (as the LWW poller) and returns
    /// the poll time it was stored under (strictly increasing per worker).
    pub(crate) fn apply_own_snapshot(
        &self,
        key: &Arc<str>,
        value: SnapshotValue,
        polled_at: u64,
    ) -> u64 {
        let mut book = self.book();
        let last = book.own_polled_at.get(key).copied().unwrap_or(0);
        let polled_at = if polled_at <= last {
            last.saturating_add(1)
        } else {
            polled_at
        };
        book.own_polled_at.insert(key.clone(), polled_at);
        if book
            .state
            .apply_snapshot(key, value, (polled_at, self.me.name.clone()))
        {
            self.publish_view(&book, key);
        }
        polled_at
    }
}
