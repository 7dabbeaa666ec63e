//! The worker keys this node knows, each with its shared entry.
//!
//! Keys come from the router (`Mesh::worker`) and from peers' frames. The
//! map is only touched when a key is first seen; the sync task iterates a
//! lock-free list, and the router keeps its `WorkerSlot` handles.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;

use crate::slot::WorkerEntry;

/// Most worker keys peers may introduce; keys the router registers always
/// fit. Protects memory from a buggy (authenticated) peer.
pub(crate) const MAX_REMOTE_KEYS: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct Registry {
    map: RwLock<HashMap<Arc<str>, Arc<WorkerEntry>>>,
    list: ArcSwap<Vec<Arc<WorkerEntry>>>,
}

impl Registry {
    /// The entry of `key`, if known.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<WorkerEntry>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(key).cloned()
    }

    /// The entry of `key`, created if new (refused for peer-introduced keys
    /// past [`MAX_REMOTE_KEYS`]).
    pub(crate) fn get_or_create(&self, key: &str, from_peer: bool) -> Option<Arc<WorkerEntry>> {
        if let Some(entry) = self.get(key) {
            return Some(entry);
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get(key) {
            return Some(entry.clone());
        }
        if from_peer && map.len() >= MAX_REMOTE_KEYS {
            return None;
        }
        let id = u32::try_from(map.len()).ok()?;
        let key: Arc<str> = Arc::from(key);
        let entry = Arc::new(WorkerEntry::new(key.clone(), id));
        map.insert(key, entry.clone());
        let mut list: Vec<Arc<WorkerEntry>> = self.list.load().as_ref().clone();
        list.push(entry.clone());
        self.list.store(Arc::new(list));
        Some(entry)
    }

    /// Every entry, in id order (index = id).
    pub(crate) fn list(&self) -> Arc<Vec<Arc<WorkerEntry>>> {
        self.list.load_full()
    }
}
