//! The fleet-wide worker set: the engines admins added or removed on any
//! replica, so every replica routes to the same set.
//!
//! Each worker URL is a last-writer-wins register: `present` (added) or
//! not (removed, a tombstone), stamped by the write that said so. Stamps
//! are hybrid logical clocks — the writer's wall clock in µs, raised past
//! every stamp it has seen — so a removal made after seeing an add always
//! wins over it, whatever the clocks say; ties break on the writer's node
//! name. Merging keeps the larger stamp: commutative, associative and
//! idempotent, so frames may be lost, repeated or reordered.
//!
//! **Propagation.** A replica sends its own writes, and only those, to
//! every link as they happen (a delta of the changed entries); it never
//! re-broadcasts what it learned, since in the full mesh every peer hears
//! the writer directly. One write costs O(replicas × entry) bytes
//! fleet-wide. A new link gets the whole set (split by size). Every
//! anti-entropy interval each replica sends a [`digest`] of its set; a peer
//! whose digest differs in a bucket sends back its entries of that bucket,
//! so an entry missed, or refused (a stamp ahead of the receiver's clock,
//! a full set), is sent again and lands once the receiver accepts it.
//!
//! **Whose entries a peer may send.** An entry's `origin` names its writer.
//! A peer may send entries in its own name (its certificate names it), and
//! relay entries of writers that are not live, counted peers of the
//! receiver — that is how a dead or unreachable writer's entries reach a
//! late joiner. An entry in the name of a live peer is refused
//! ([`Refused::ForgedOrigin`]): a live writer speaks for itself. One in the
//! receiver's own name is accepted only if stamped before this incarnation
//! started (its previous run's writes, relayed back after a restart). An
//! entry that changes nothing is not judged (a whole-set copy carries the
//! receiver's own and its peers' entries back to it). A relay can race the
//! writer's own frame (counted as forged, then the writer's copy lands).
//!
//! **Stamps.** A stamp further ahead of this node's clock than
//! [`MAX_FUTURE`] (the mesh's clock-skew bound) is refused, so a removal
//! cannot be out-stamped for more than that; the digest repair delivers
//! an honest entry refused this way once the receiver's clock catches up.
//!
//! **Residual risk.** Any holder of a cluster certificate can still add or
//! remove workers under its own name (visible as `origin`), relay entries
//! under the name of a node that is not a live peer of the receiver, and
//! keep re-stamping an add up to `MAX_FUTURE` ahead to win over removals
//! made by others; the certificate is the trust boundary.
//!
//! Bounded: at most [`MAX_ENTRIES`] URLs; a tombstone is forgotten once its
//! stamp is older than the removal TTL (every replica forgets it at about
//! the same time, since the stamp is the writer's clock) and a tombstone
//! that old is not merged back. A replica cut off for longer than that TTL
//! can bring back a worker removed meanwhile, the usual price of
//! forgetting tombstones.
//!
//! This module knows nothing of URLs' syntax (the router validates them);
//! it bounds their length.

pub(crate) mod digest;
mod shared;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shoal_proto::frames::{MAX_KEY_BYTES, WorkerSetEntry};

use crate::identity::valid_node_name;
use crate::state::MAX_CLOCK_SKEW_MS;
use digest::{Digest, bucket_of, entry_hash};
pub use shared::{SharedWorkerSet, WallClock};

/// Most worker URLs the set holds (present or removed).
pub const MAX_ENTRIES: usize = 10_000;
/// Largest lead of a peer's stamp over this node's clock that is accepted:
/// the mesh's clock-skew bound.
pub const MAX_FUTURE: Duration = Duration::from_millis(MAX_CLOCK_SKEW_MS);

/// The stamp of one write: hybrid logical clock, then writer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    /// µs since the Unix epoch, raised past every stamp the writer saw.
    pub hlc_us: u64,
    /// The writer's node name.
    pub origin: Arc<str>,
}

/// One URL's register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    /// In the set (added) or removed.
    pub present: bool,
    /// The write that decided it.
    pub stamp: Stamp,
}

/// Why a peer's entry was not merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Empty URL or longer than [`MAX_KEY_BYTES`].
    BadUrl,
    /// The origin is not a valid node name.
    BadOrigin,
    /// The origin is a live peer other than the sender (or this node): see
    /// the module doc.
    ForgedOrigin,
    /// The stamp is more than [`MAX_FUTURE`] ahead of this node's clock.
    Future,
    /// The set already holds [`MAX_ENTRIES`] URLs.
    Full,
}

impl Refused {
    /// Label for the dropped-entries metric.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::BadUrl => "worker_set_url",
            Refused::BadOrigin => "worker_set_origin",
            Refused::ForgedOrigin => "worker_set_forged_origin",
            Refused::Future => "worker_set_future",
            Refused::Full => "worker_set_full",
        }
    }
}

/// Who sent entries, as the merge needs it to judge their origins.
pub struct Sender<'a> {
    /// The authenticated sender's node name (its certificate names it).
    pub name: &'a str,
    /// True for the names of the receiver's live, counted peers.
    pub is_live_peer: &'a dyn Fn(&str) -> bool,
}

/// One held register, with its digest bucket and hash (kept so changes
/// update the digest without hashing the URL again).
#[derive(Debug)]
struct Held {
    register: Register,
    bucket: usize,
    hash: u64,
}

/// The set itself (no locking, no I/O): see the module doc.
#[derive(Debug)]
pub struct WorkerSet {
    origin: Arc<str>,
    /// When this incarnation started (µs since the Unix epoch): a write in
    /// its own name stamped later is its own, never a peer's relay.
    started_us: u64,
    entries: BTreeMap<Arc<str>, Held>,
    last_hlc_us: u64,
    digest: Digest,
    /// URLs this node wrote since the outbox last took them.
    own_changes: BTreeSet<Arc<str>>,
}

impl WorkerSet {
    /// An empty set whose own writes are stamped with `origin` (it refuses
    /// every peer's relay of an entry in its own name: see
    /// [`WorkerSet::started_at`]).
    pub fn new(origin: impl Into<Arc<str>>) -> Self {
        Self {
            origin: origin.into(),
            started_us: 0,
            entries: BTreeMap::new(),
            last_hlc_us: 0,
            digest: Digest::default(),
            own_changes: BTreeSet::new(),
        }
    }

    /// The same set, for an incarnation that started at `started_us`:
    /// entries in its name stamped before that are its previous run's,
    /// which peers may relay back to it.
    pub fn started_at(mut self, started_us: u64) -> Self {
        self.started_us = started_us;
        self
    }

    /// The next stamp of this node's clock at wall time `now_us`.
    fn tick(&mut self, now_us: u64) -> Stamp {
        self.last_hlc_us = now_us.max(self.last_hlc_us.saturating_add(1));
        Stamp {
            hlc_us: self.last_hlc_us,
            origin: self.origin.clone(),
        }
    }

    /// Puts `register` in for `url` (new or replacing), keeping the digest.
    fn put(&mut self, url: &str, register: Register) {
        let hash = entry_hash(url, &register);
        match self.entries.get_mut(url) {
            Some(held) => {
                self.digest.toggle(held.bucket, held.hash ^ hash);
                held.register = register;
                held.hash = hash;
            }
            None => {
                let bucket = bucket_of(url);
                self.digest.toggle(bucket, hash);
                self.entries.insert(
                    url.into(),
                    Held {
                        register,
                        bucket,
                        hash,
                    },
                );
            }
        }
    }

    /// Records this node's own write (an admin add or remove) at wall time
    /// `now_us`; it wins over every entry this node has seen, and goes to
    /// every peer in the next round.
    pub fn write(&mut self, url: &str, present: bool, now_us: u64) -> Result<Stamp, Refused> {
        check_url(url)?;
        if !self.entries.contains_key(url) && self.entries.len() >= MAX_ENTRIES {
            return Err(Refused::Full);
        }
        let stamp = self.tick(now_us);
        self.put(
            url,
            Register {
                present,
                stamp: stamp.clone(),
            },
        );
        self.own_changes.insert(url.into());
        Ok(stamp)
    }

    /// Merges an entry at this node's wall time `now_us`, trusting its
    /// origin (a local merge); true when it changed what this node holds.
    pub fn merge(&mut self, entry: &WorkerSetEntry, now_us: u64) -> Result<bool, Refused> {
        self.merge_checked(entry, now_us, |_| Ok(()))
    }

    /// Merges an entry `sender` sent, judging its origin (see the module
    /// doc); true when it changed what this node holds.
    pub fn merge_from(
        &mut self,
        entry: &WorkerSetEntry,
        sender: &Sender<'_>,
        now_us: u64,
    ) -> Result<bool, Refused> {
        let (origin, started_us) = (self.origin.clone(), self.started_us);
        self.merge_checked(entry, now_us, |entry| {
            let allowed = if entry.origin == sender.name {
                true
            } else if entry.origin == *origin {
                entry.hlc_us < started_us
            } else {
                !(sender.is_live_peer)(&entry.origin)
            };
            if allowed {
                Ok(())
            } else {
                Err(Refused::ForgedOrigin)
            }
        })
    }

    fn merge_checked(
        &mut self,
        entry: &WorkerSetEntry,
        now_us: u64,
        origin_ok: impl FnOnce(&WorkerSetEntry) -> Result<(), Refused>,
    ) -> Result<bool, Refused> {
        check_url(&entry.url)?;
        if !valid_node_name(&entry.origin) {
            return Err(Refused::BadOrigin);
        }
        let stamp = Stamp {
            hlc_us: entry.hlc_us,
            origin: entry.origin.as_str().into(),
        };
        let held = self.entries.get(entry.url.as_str());
        if held.is_some_and(|h| h.register.stamp >= stamp) {
            return Ok(false);
        }
        origin_ok(entry)?;
        let future_limit = now_us.saturating_add(MAX_FUTURE.as_micros() as u64);
        if entry.hlc_us > future_limit {
            return Err(Refused::Future);
        }
        if held.is_none() && self.entries.len() >= MAX_ENTRIES {
            return Err(Refused::Full);
        }
        self.last_hlc_us = self.last_hlc_us.max(entry.hlc_us);
        self.put(
            &entry.url,
            Register {
                present: entry.present,
                stamp,
            },
        );
        Ok(true)
    }

    /// The register of `url`, if any write named it.
    pub fn get(&self, url: &str) -> Option<&Register> {
        self.entries.get(url).map(|h| &h.register)
    }

    /// Every register, by URL.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Register)> {
        self.entries.iter().map(|(url, h)| (url, &h.register))
    }

    /// Forgets the tombstones whose stamp is older than `ttl` at wall time
    /// `now_us`; how many.
    pub fn forget_removals(&mut self, now_us: u64, ttl: Duration) -> usize {
        let cutoff = now_us.saturating_sub(ttl.as_micros() as u64);
        let before = self.entries.len();
        let digest = &mut self.digest;
        self.entries.retain(|_, h| {
            let keep = h.register.present || h.register.stamp.hlc_us >= cutoff;
            if !keep {
                digest.toggle(h.bucket, h.hash);
            }
            keep
        });
        before - self.entries.len()
    }

    /// The wire form of every register.
    pub fn to_entries(&self) -> Vec<WorkerSetEntry> {
        self.entries
            .iter()
            .map(|(url, h)| wire(url, &h.register))
            .collect()
    }

    /// The wire form of this node's writes since the last call (their
    /// current registers), forgetting them.
    pub(crate) fn take_own_changes(&mut self) -> Vec<WorkerSetEntry> {
        let urls = std::mem::take(&mut self.own_changes);
        urls.iter()
            .filter_map(|url| self.entries.get(url).map(|h| wire(url, &h.register)))
            .collect()
    }

    /// Gives back writes taken by [`WorkerSet::take_own_changes`] that
    /// could not be sent.
    pub(crate) fn restore_own_changes(&mut self, entries: &[WorkerSetEntry]) {
        self.own_changes
            .extend(entries.iter().map(|e| Arc::from(e.url.as_str())));
    }

    /// The digest's buckets, for the wire.
    pub(crate) fn digest(&self) -> Vec<u64> {
        self.digest.to_vec()
    }

    /// The entries of the buckets where a peer's digest differs from this
    /// set's, to send it; `None` when its digest has another shape.
    pub(crate) fn repair_for(&self, theirs: &[u64]) -> Option<Vec<WorkerSetEntry>> {
        let differing = self.digest.differing(theirs)?;
        Some(
            self.entries
                .iter()
                .filter(|(_, h)| differing.get(h.bucket).copied().unwrap_or(false))
                .map(|(url, h)| wire(url, &h.register))
                .collect(),
        )
    }
}

fn wire(url: &str, r: &Register) -> WorkerSetEntry {
    WorkerSetEntry {
        url: url.to_string(),
        hlc_us: r.stamp.hlc_us,
        origin: r.stamp.origin.to_string(),
        present: r.present,
    }
}

fn check_url(url: &str) -> Result<(), Refused> {
    if url.is_empty() || url.len() > MAX_KEY_BYTES {
        return Err(Refused::BadUrl);
    }
    Ok(())
}
