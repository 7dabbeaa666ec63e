//! Where stored objects live, shared over the load plane.
//!
//! An engine that stores objects (Responses API responses, uploaded
//! files, batches) holds each one itself: a request about it must reach
//! that engine. A replica learns the id when the engine creates the object
//! through it; behind a Service the next request about it arrives at any
//! replica. So each replica queues the (id, worker) pairs it learns here;
//! every round carries the ones queued since the last to every verified
//! peer ([`Frame::Objects`]), and the peers' pairs are handed to the
//! router's receiver.
//!
//! Like sightings these are hints that may be forgotten, never state to
//! converge: not in the ledger, a link that connects later does not get
//! the past ones (the router then locates the object by asking), and a
//! full outbound queue drops new pairs (counted) rather than grow.
//!
//! [`Frame::Objects`]: shoal_proto::frames::Frame::Objects

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use shoal_proto::frames::{
    Frame, FrameError, MAX_KEY_BYTES, MAX_OBJECT_ID_BYTES, MAX_OBJECTS_PER_FRAME, ObjectEntry,
    ObjectsFrame, encode_prefixed,
};

use crate::bell::ChangeBell;

/// Pairs waiting for the next round, at most: a burst of creations larger
/// than this within one push gap loses its newest pairs (their replica
/// still routes them, and the others can locate them).
pub const MAX_PENDING_OBJECTS: usize = 16_384;

/// Where the pairs peers learned are delivered (the router's table).
pub type ObjectReceiver = Arc<dyn Fn(&[ObjectEntry]) + Send + Sync>;

/// The router's handle for sharing where objects live: cheap to clone, and
/// it does not keep the mesh alive (a send after shutdown does nothing).
#[derive(Debug, Clone)]
pub struct ObjectSender {
    exchange: Weak<ObjectExchange>,
    bell: Weak<ChangeBell>,
}

impl ObjectSender {
    pub(crate) fn new(exchange: &Arc<ObjectExchange>, bell: &Arc<ChangeBell>) -> Self {
        Self {
            exchange: Arc::downgrade(exchange),
            bell: Arc::downgrade(bell),
        }
    }

    /// Tells every peer in the next round that the object `id` lives on
    /// `worker`. A pair that does not fit the queue, or whose id or URL is
    /// longer than a receiver accepts, is dropped and counted
    /// (`shoal_mesh_objects_dropped_total`).
    pub fn send(&self, id: &str, worker: &str) {
        let (Some(exchange), Some(bell)) = (self.exchange.upgrade(), self.bell.upgrade()) else {
            return;
        };
        let entry = ObjectEntry {
            id: id.to_string(),
            worker: worker.to_string(),
        };
        if !is_acceptable(&entry) || !exchange.record(entry, &bell) {
            metrics::counter!("shoal_mesh_objects_dropped_total").increment(1);
        }
    }
}

/// Whether a receiver takes `entry`: an id and a URL within their limits.
pub(crate) fn is_acceptable(entry: &ObjectEntry) -> bool {
    !entry.id.is_empty()
        && entry.id.len() <= MAX_OBJECT_ID_BYTES
        && !entry.worker.is_empty()
        && entry.worker.len() <= MAX_KEY_BYTES
}

/// This node's outbound queue of object pairs and its inbound receiver.
#[derive(Default)]
pub(crate) struct ObjectExchange {
    pending: Mutex<Vec<ObjectEntry>>,
    receiver: OnceLock<ObjectReceiver>,
}

impl std::fmt::Debug for ObjectExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectExchange")
            .field("pending", &self.lock().len())
            .field("receiver", &self.receiver.get().is_some())
            .finish()
    }
}

impl ObjectExchange {
    fn lock(&self) -> MutexGuard<'_, Vec<ObjectEntry>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `entry` for the peers and rings `bell`; false (and nothing
    /// queued) when the queue is full.
    pub(crate) fn record(&self, entry: ObjectEntry, bell: &ChangeBell) -> bool {
        let queued = {
            let mut pending = self.lock();
            let room = pending.len() < MAX_PENDING_OBJECTS;
            if room {
                pending.push(entry);
            }
            room
        };
        if queued {
            bell.ring();
        }
        queued
    }

    /// The queued pairs as frames, emptying the queue.
    pub(crate) fn frames(&self) -> Result<Vec<Vec<u8>>, FrameError> {
        let entries = std::mem::take(&mut *self.lock());
        entries
            .chunks(MAX_OBJECTS_PER_FRAME)
            .map(|chunk| {
                encode_prefixed(&Frame::Objects(ObjectsFrame {
                    entries: chunk.to_vec(),
                }))
            })
            .collect()
    }

    /// Sets where peers' pairs go; the first call wins (one router per mesh).
    pub(crate) fn set_receiver(&self, receiver: ObjectReceiver) -> bool {
        self.receiver.set(receiver).is_ok()
    }

    /// Hands a peer's pairs to the receiver, if one is set.
    pub(crate) fn deliver(&self, entries: &[ObjectEntry]) {
        if let Some(receiver) = self.receiver.get() {
            receiver(entries);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use shoal_proto::frames::decode;

    use super::*;

    fn entry(i: usize) -> ObjectEntry {
        ObjectEntry {
            id: format!("resp_{i}"),
            worker: "http://w:1".into(),
        }
    }

    #[test]
    fn queued_pairs_leave_in_frames_of_bounded_size_once() {
        let exchange = ObjectExchange::default();
        let bell = ChangeBell::default();
        let n = MAX_OBJECTS_PER_FRAME + 3;
        for i in 0..n {
            assert!(exchange.record(entry(i), &bell));
        }
        let frames = exchange.frames().unwrap();
        assert_eq!(frames.len(), 2);
        let mut got = Vec::new();
        for frame in &frames {
            match decode(&frame[4..]).unwrap() {
                Frame::Objects(f) => {
                    assert!(f.entries.len() <= MAX_OBJECTS_PER_FRAME);
                    got.extend(f.entries);
                }
                other => panic!("not an objects frame: {other:?}"),
            }
        }
        assert_eq!(got, (0..n).map(entry).collect::<Vec<_>>());
        assert!(exchange.frames().unwrap().is_empty(), "sent once");
    }

    #[test]
    fn a_full_queue_drops_new_pairs() {
        let exchange = ObjectExchange::default();
        let bell = ChangeBell::default();
        for i in 0..MAX_PENDING_OBJECTS {
            assert!(exchange.record(entry(i), &bell));
        }
        assert!(!exchange.record(entry(0), &bell));
        exchange.frames().unwrap();
        assert!(exchange.record(entry(0), &bell), "room again once sent");
    }

    #[test]
    fn ids_and_urls_past_their_limits_are_not_acceptable() {
        assert!(is_acceptable(&entry(1)));
        let long_id = ObjectEntry {
            id: "x".repeat(MAX_OBJECT_ID_BYTES + 1),
            worker: "http://w".into(),
        };
        let long_url = ObjectEntry {
            id: "x".into(),
            worker: "u".repeat(MAX_KEY_BYTES + 1),
        };
        let empty = ObjectEntry {
            id: String::new(),
            worker: "http://w".into(),
        };
        for bad in [long_id, long_url, empty] {
            assert!(!is_acceptable(&bad));
        }
    }

    #[test]
    fn peers_pairs_reach_the_receiver_set_first() {
        let exchange = ObjectExchange::default();
        exchange.deliver(&[entry(1)]); // no receiver yet: dropped quietly
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        assert!(
            exchange.set_receiver(Arc::new(move |entries: &[ObjectEntry]| {
                counter.fetch_add(entries.len(), Ordering::Relaxed);
            }))
        );
        assert!(!exchange.set_receiver(Arc::new(|_: &[ObjectEntry]| {})));
        exchange.deliver(&[entry(1), entry(2)]);
        assert_eq!(seen.load(Ordering::Relaxed), 2);
    }
}
