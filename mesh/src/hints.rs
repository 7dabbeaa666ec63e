//! Hints shared over the load plane: small facts a replica learns that its
//! peers route better for knowing (prompt-key sightings, where stored
//! objects live), as opposed to state that must converge.
//!
//! A hint may be forgotten: it is not in the transcript, a link that connects
//! later does not get past ones, and a full outbound queue drops new hints
//! (counted) rather than grow. The router queues each hint through a
//! [`HintSender`]; every round takes what was queued since the last one
//! ([`HintQueue::frames`]) to every verified peer, and peers' hints are
//! handed to the receiver the router set. One [`Hint`] impl per kind says
//! how many may wait, how many fit a frame and how they are framed.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use shoal_proto::frames::{Frame, FrameError, encode_prefixed};

use crate::bell::ChangeBell;

/// One kind of hint.
pub trait Hint: Clone + Send + Sync + 'static {
    /// Hints waiting for the next round, at most.
    const MAX_PENDING: usize;
    /// Hints per frame, at most (a receiver drops larger frames).
    const PER_FRAME: usize;
    /// Counter of hints this node could not queue.
    const DROPPED_METRIC: &'static str;
    /// The frame carrying `hints`.
    fn frame(hints: Vec<Self>) -> Frame;
}

/// Where peers' hints are delivered (the router).
pub type Receiver<T> = Arc<dyn Fn(&[T]) + Send + Sync>;

/// This node's outbound queue of one kind of hint and its inbound receiver.
pub struct HintQueue<T: Hint> {
    pending: Mutex<Vec<T>>,
    receiver: OnceLock<Receiver<T>>,
}

impl<T: Hint> Default for HintQueue<T> {
    fn default() -> Self {
        Self {
            pending: Mutex::new(Vec::new()),
            receiver: OnceLock::new(),
        }
    }
}

impl<T: Hint> std::fmt::Debug for HintQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HintQueue")
            .field("pending", &self.lock().len())
            .field("receiver", &self.receiver.get().is_some())
            .finish()
    }
}

impl<T: Hint> HintQueue<T> {
    fn lock(&self) -> MutexGuard<'_, Vec<T>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `hint` for the peers and rings `bell`; false (and nothing
    /// queued) when the queue is full.
    pub(crate) fn record(&self, hint: T, bell: &ChangeBell) -> bool {
        let queued = {
            let mut pending = self.lock();
            let room = pending.len() < T::MAX_PENDING;
            if room {
                pending.push(hint);
            }
            room
        };
        if queued {
            bell.ring();
        }
        queued
    }

    /// The queued hints as frames of at most [`Hint::PER_FRAME`], emptying
    /// the queue.
    pub(crate) fn frames(&self) -> Result<Vec<Vec<u8>>, FrameError> {
        let hints = std::mem::take(&mut *self.lock());
        hints
            .chunks(T::PER_FRAME)
            .map(|chunk| encode_prefixed(&T::frame(chunk.to_vec())))
            .collect()
    }

    /// Sets where peers' hints go; the first call wins (one router per mesh).
    pub(crate) fn set_receiver(&self, receiver: Receiver<T>) -> bool {
        self.receiver.set(receiver).is_ok()
    }

    /// Hands a peer's hints to the receiver, if one is set.
    pub(crate) fn deliver(&self, hints: &[T]) {
        if let Some(receiver) = self.receiver.get() {
            receiver(hints);
        }
    }
}

/// The router's handle for sharing one kind of hint: cheap to clone, and
/// it does not keep the mesh alive (a send after shutdown does nothing).
#[derive(Debug)]
pub struct HintSender<T: Hint> {
    queue: Weak<HintQueue<T>>,
    bell: Weak<ChangeBell>,
}

impl<T: Hint> Clone for HintSender<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            bell: self.bell.clone(),
        }
    }
}

impl<T: Hint> HintSender<T> {
    pub(crate) fn new(queue: &Arc<HintQueue<T>>, bell: &Arc<ChangeBell>) -> Self {
        Self {
            queue: Arc::downgrade(queue),
            bell: Arc::downgrade(bell),
        }
    }

    /// Queues `hint` for every peer's next round; one that does not fit
    /// the queue is dropped and counted ([`Hint::DROPPED_METRIC`]).
    pub(crate) fn push(&self, hint: T) {
        let (Some(queue), Some(bell)) = (self.queue.upgrade(), self.bell.upgrade()) else {
            return;
        };
        if !queue.record(hint, &bell) {
            dropped::<T>();
        }
    }
}

/// Counts one hint of kind `T` not shared.
pub(crate) fn dropped<T: Hint>() {
    metrics::counter!(T::DROPPED_METRIC).increment(1);
}
