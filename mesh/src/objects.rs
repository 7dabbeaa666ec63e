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
//! converge: not in the transcript, a link that connects later does not get
//! the past ones (the router then locates the object by asking), and a
//! full outbound queue drops new pairs (counted) rather than grow.
//!
//! [`Frame::Objects`]: shoal_proto::frames::Frame::Objects

use shoal_proto::frames::{
    Frame, MAX_KEY_BYTES, MAX_OBJECT_ID_BYTES, MAX_OBJECTS_PER_FRAME, ObjectEntry, ObjectsFrame,
};

use crate::hints::{self, Hint, HintQueue, HintSender, Receiver};

/// Pairs waiting for the next round, at most: a burst of creations larger
/// than this within one push gap loses its newest pairs (their replica
/// still routes them, and the others can locate them).
pub const MAX_PENDING_OBJECTS: usize = 16_384;

/// Where the pairs peers learned are delivered (the router's table).
pub type ObjectReceiver = Receiver<ObjectEntry>;

/// The router's handle for sharing where objects live.
pub type ObjectSender = HintSender<ObjectEntry>;

/// This node's outbound queue of object pairs and its inbound receiver.
pub(crate) type ObjectExchange = HintQueue<ObjectEntry>;

/// A stored object's id and the worker holding it.
impl Hint for ObjectEntry {
    const MAX_PENDING: usize = MAX_PENDING_OBJECTS;
    const PER_FRAME: usize = MAX_OBJECTS_PER_FRAME;
    const DROPPED_METRIC: &'static str = "shoal_mesh_objects_dropped_total";

    fn frame(entries: Vec<ObjectEntry>) -> Frame {
        Frame::Objects(ObjectsFrame { entries })
    }
}

impl HintSender<ObjectEntry> {
    /// Tells every peer in the next round that the object `id` lives on
    /// `worker`. A pair that does not fit the queue, or whose id or URL is
    /// longer than a receiver accepts, is dropped and counted
    /// (`shoal_mesh_objects_dropped_total`).
    pub fn send(&self, id: &str, worker: &str) {
        let entry = ObjectEntry {
            id: id.to_string(),
            worker: worker.to_string(),
        };
        match is_acceptable(&entry) {
            true => self.push(entry),
            false => hints::dropped::<ObjectEntry>(),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use shoal_proto::frames::decode;

    use super::*;
    use crate::bell::ChangeBell;

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
