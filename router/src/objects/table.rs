//! Which worker holds each stored object the fleet saw created.
//!
//! Why bounded and lossy: objects are created at request rate and an
//! engine may keep them for as long as it likes, so the table keeps the
//! newest `capacity` ids and forgets the oldest. Forgetting is safe: a
//! request about an id no replica remembers locates it by asking the
//! workers (`Placement::Locate`). What is kept is never invented: an id
//! maps to the worker whose answer carried it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::is_valid_id;

/// Where this replica's new (id, worker URL) pairs go (the mesh's sender).
pub type ShareObject = Box<dyn Fn(&str, &str) + Send + Sync>;

/// The id → worker table; cheap to share (`Arc`), one per replica.
pub struct ObjectTable {
    capacity: usize,
    inner: Mutex<Inner>,
    share: OnceLock<ShareObject>,
}

#[derive(Default)]
struct Inner {
    /// Ids, oldest first (each once).
    order: VecDeque<Arc<str>>,
    /// Id → the holding worker's base URL.
    holders: HashMap<Arc<str>, Arc<str>>,
}

impl std::fmt::Debug for ObjectTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectTable")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .field("shared", &self.share.get().is_some())
            .finish()
    }
}

impl ObjectTable {
    /// A table remembering at most `capacity` objects (0: none; every
    /// request about an object then locates it).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::default(),
            share: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Objects remembered.
    pub fn len(&self) -> usize {
        self.lock().holders.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The base URL of the worker holding `id`, if remembered.
    pub fn holder(&self, id: &str) -> Option<Arc<str>> {
        self.lock().holders.get(id).cloned()
    }

    /// Records that `worker` holds `id` (learned here) and tells the peers
    /// when it is new or moved. An invalid id is ignored.
    pub fn learn(&self, id: &str, worker: &str) {
        if self.record(id, worker)
            && let Some(share) = self.share.get()
        {
            share(id, worker);
        }
    }

    /// Records pairs a peer learned, without sharing them again.
    pub fn absorb<'a>(&self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (id, worker) in pairs {
            self.record(id, worker);
        }
    }

    /// Sends every pair new here to `share` from now on; false if a sink
    /// was set already (the first wins).
    pub fn share_with(&self, share: ShareObject) -> bool {
        self.share.set(share).is_ok()
    }

    /// Stores the pair, forgetting the oldest when full; true when it was
    /// not already stored as is.
    fn record(&self, id: &str, worker: &str) -> bool {
        if self.capacity == 0 || !is_valid_id(id) || worker.is_empty() {
            return false;
        }
        let mut inner = self.lock();
        if let Some(held) = inner.holders.get_mut(id) {
            if &**held == worker {
                return false;
            }
            *held = Arc::from(worker);
            return true;
        }
        while inner.holders.len() >= self.capacity {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.holders.remove(&oldest);
        }
        // The previous entry's URL is usually the same worker: share it.
        let worker: Arc<str> = match inner.order.back().and_then(|id| inner.holders.get(id)) {
            Some(last) if &**last == worker => last.clone(),
            _ => Arc::from(worker),
        };
        let id: Arc<str> = Arc::from(id);
        inner.order.push_back(id.clone());
        inner.holders.insert(id, worker);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_forgotten_when_full() {
        let table = ObjectTable::new(2);
        table.learn("a", "http://w1");
        table.learn("b", "http://w2");
        table.learn("c", "http://w1");
        assert_eq!(table.len(), 2);
        assert_eq!(table.holder("a"), None, "the oldest went");
        assert_eq!(table.holder("b").as_deref(), Some("http://w2"));
        assert_eq!(table.holder("c").as_deref(), Some("http://w1"));
    }

    #[test]
    fn new_pairs_are_shared_once_and_peers_pairs_not_at_all() {
        let table = ObjectTable::new(8);
        let shared = Arc::new(Mutex::new(Vec::new()));
        let sink = shared.clone();
        assert!(table.share_with(Box::new(move |id, worker| {
            sink.lock().unwrap().push(format!("{id}@{worker}"));
        })));
        table.learn("resp_1", "http://w1");
        table.learn("resp_1", "http://w1");
        table.absorb([("resp_2", "http://w2")]);
        assert_eq!(table.holder("resp_2").as_deref(), Some("http://w2"));
        assert_eq!(*shared.lock().unwrap(), ["resp_1@http://w1"]);
    }

    #[test]
    fn bad_ids_and_a_zero_capacity_keep_nothing() {
        let table = ObjectTable::new(8);
        table.learn("has space", "http://w");
        table.learn(&"x".repeat(super::super::MAX_ID_BYTES + 1), "http://w");
        table.learn("ok", "");
        assert!(table.is_empty());
        let off = ObjectTable::new(0);
        off.learn("resp_1", "http://w");
        assert!(off.is_empty());
    }
}
