//! The worker keys this node knows, each with its shared entry.
//!
//! Keys come from the router (`Mesh::worker`) and from peers' frames, and
//! leave when the housekeeping finds them unused (see `Core::housekeep`).
//! The map is only touched when a key is added or removed; the sync task
//! iterates a lock-free list of the live entries, and the router keeps its
//! `WorkerSlot` handles. Wire ids are dense and reused after a removal, so
//! per-link bookkeeping indexed by id is bounded by the most keys held at
//! once (not by every key ever seen), and per-sync work by the live ones.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;

use crate::bell::ChangeBell;
use crate::slot::WorkerEntry;

/// Most worker keys peers may introduce; keys the router registers always
/// fit. Protects memory from a buggy (authenticated) peer.
pub(crate) const MAX_REMOTE_KEYS: usize = 65_536;

#[derive(Debug, Default)]
struct Keys {
    map: HashMap<Arc<str>, Arc<WorkerEntry>>,
    free_ids: Vec<u32>,
    next_id: u32,
    next_serial: u64,
}

#[derive(Debug, Default)]
pub(crate) struct WorkerKeys {
    keys: RwLock<Keys>,
    list: ArcSwap<Vec<Arc<WorkerEntry>>>,
    /// Every entry of this node rings it on a change its links push.
    bell: Arc<ChangeBell>,
}

/// References to an entry the key table itself holds (map and list).
const REGISTRY_REFS: usize = 2;

/// True when nothing on this node needs `entry`: only the key table holds
/// it (no router handle, no booking), nothing is in flight, and it is not
/// polled here.
pub(crate) fn unused(entry: &Arc<WorkerEntry>) -> bool {
    Arc::strong_count(entry) <= REGISTRY_REFS
        && entry.own.read().is_idle()
        && !entry.polled.load(std::sync::atomic::Ordering::Relaxed)
}

impl WorkerKeys {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Keys> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of `key`, if known.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<WorkerEntry>> {
        self.read().map.get(key).cloned()
    }

    /// The entry of `key`, created if new (refused for peer-introduced keys
    /// past [`MAX_REMOTE_KEYS`]).
    pub(crate) fn get_or_create(&self, key: &str, from_peer: bool) -> Option<Arc<WorkerEntry>> {
        if let Some(entry) = self.get(key) {
            return Some(entry);
        }
        let mut keys = self.write();
        if let Some(entry) = keys.map.get(key) {
            return Some(entry.clone());
        }
        if from_peer && keys.map.len() >= MAX_REMOTE_KEYS {
            return None;
        }
        let id = match keys.free_ids.pop() {
            Some(id) => id,
            None => {
                let id = keys.next_id;
                keys.next_id = id.checked_add(1)?;
                id
            }
        };
        keys.next_serial += 1;
        let key: Arc<str> = Arc::from(key);
        let entry = Arc::new(WorkerEntry::new(
            key.clone(),
            id,
            keys.next_serial,
            self.bell.clone(),
        ));
        keys.map.insert(key, entry.clone());
        let mut list: Vec<Arc<WorkerEntry>> = self.list.load().as_ref().clone();
        list.push(entry.clone());
        self.list.store(Arc::new(list));
        Some(entry)
    }

    /// Removes those of `candidates` that are still unused — only the
    /// key table holds them, nothing is in flight or polled — and frees
    /// their ids. Checked under the write lock, so a router taking a handle
    /// at the same moment ([`WorkerKeys::get`] clones under the read lock)
    /// either keeps the entry alive or gets a new one. Returns the removed.
    pub(crate) fn remove_if_unused(&self, candidates: &[Arc<str>]) -> Vec<Arc<str>> {
        if candidates.is_empty() {
            return Vec::new();
        }
        let mut keys = self.write();
        let mut removed = Vec::new();
        for key in candidates {
            if !keys.map.get(key).is_some_and(unused) {
                continue;
            }
            if let Some(entry) = keys.map.remove(key) {
                keys.free_ids.push(entry.id);
                removed.push(entry.key.clone());
            }
        }
        if !removed.is_empty() {
            let list: Vec<Arc<WorkerEntry>> = self
                .list
                .load()
                .iter()
                .filter(|e| keys.map.contains_key(&e.key))
                .cloned()
                .collect();
            self.list.store(Arc::new(list));
        }
        removed
    }

    /// The bell every entry rings (the announcer listens to it).
    pub(crate) fn bell(&self) -> &Arc<ChangeBell> {
        &self.bell
    }

    /// Every live entry.
    pub(crate) fn list(&self) -> Arc<Vec<Arc<WorkerEntry>>> {
        self.list.load_full()
    }

    /// Number of live keys and the highest id handed out plus one.
    pub(crate) fn sizes(&self) -> (usize, u32) {
        let keys = self.read();
        (keys.map.len(), keys.next_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_ids_are_reused_under_a_new_serial() {
        let r = WorkerKeys::default();
        let a = r.get_or_create("http://a", false).unwrap();
        let b = r.get_or_create("http://b", false).unwrap();
        assert_eq!((a.id, b.id), (0, 1));
        let both: Vec<Arc<str>> = vec![Arc::from("http://a"), Arc::from("http://b")];
        assert!(r.remove_if_unused(&both).is_empty(), "both held");
        drop(a);
        assert_eq!(
            r.remove_if_unused(&both),
            vec![Arc::<str>::from("http://a")]
        );
        assert!(r.get("http://a").is_none());
        assert_eq!(r.list().len(), 1);
        let c = r.get_or_create("http://c", false).unwrap();
        assert_eq!(c.id, 0, "the freed id");
        assert!(c.serial > b.serial);
        assert_eq!(r.sizes(), (2, 2));
    }
}
