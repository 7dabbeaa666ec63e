//! One replica's admission gate: `--max-concurrent-requests` slots, and a
//! queue of up to `--queue-size` waiters ordered by class and fair share
//! ([`FairQueue`]), each waiting at most its class's queue timeout.
//!
//! A freed slot is handed straight to the next waiter (it never goes back
//! to a pool a newcomer could race for), so the queue's order is the order
//! of service. A critical or standard request that finds the queue full
//! takes the place of the sheddable waiter furthest from service, which is
//! told it was shed.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::response::Response;
use tokio::sync::oneshot;

use super::class::{Ask, Priority};
use super::fair_queue::FairQueue;
use super::{Rejection, reject_response};
use crate::telemetry::ADMISSION_QUEUED;
use crate::tenants::share::{FleetShare, LocalShare, Running};

/// What a waiter is told: a slot, or why it gets none.
type Outcome = Result<Permit, Rejection>;

/// A queued request: where to send its slot, whose share it counts in
/// once it has one, and its token-work.
type Waiter = (oneshot::Sender<Outcome>, Arc<dyn FleetShare>, u64);

#[derive(Debug)]
struct State {
    /// Slots no request holds.
    free: usize,
    /// Who waits.
    queue: FairQueue<Waiter>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// `shoal_admission_queued{class}`, by [`Priority::index`].
    queued: [metrics::Gauge; 3],
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the queue's depth by class (under the lock, so the
    /// gauges never go back in time).
    fn publish(&self, state: &State) {
        for class in Priority::ALL {
            self.queued[class.index()].set(state.queue.len_of(class) as f64);
        }
    }

    /// A slot came free: the next live waiter gets it, else the pool.
    fn release(self: &Arc<Self>) {
        loop {
            let (waiter, share, work) = {
                let mut state = self.lock();
                match state.queue.pop() {
                    Some(waiter) => {
                        self.publish(&state);
                        waiter
                    }
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            // Sent outside the lock: a permit that comes back (its waiter
            // just left) is disarmed and offered to the next one.
            match waiter.send(Ok(Permit::new(self, share.start(work)))) {
                Ok(()) => return,
                Err(Ok(mut permit)) => permit.disarm(),
                Err(Err(_)) => {}
            }
        }
    }
}

/// A held request slot; handed to the next waiter (or freed) on drop.
#[derive(Debug)]
pub struct Permit {
    shared: Option<Arc<Shared>>,
    /// Counts the request in its group's share while it holds the slot.
    running: Option<Running>,
}

impl Permit {
    fn new(shared: &Arc<Shared>, running: Running) -> Self {
        Self {
            shared: Some(shared.clone()),
            running: Some(running),
        }
    }

    /// Forgets the slot without releasing it (it is being passed on).
    fn disarm(&mut self) {
        self.shared = None;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The request stops counting before its slot passes on, so the
        // next choice sees it gone.
        self.running = None;
        if let Some(shared) = self.shared.take() {
            shared.release();
        }
    }
}

/// Takes a waiter out of the queue however its wait ends (admitted, timed
/// out, or its client went away).
struct Waiting<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Waiting<'_> {
    /// Takes the waiter out; false when it had already been taken (a slot
    /// or a shedding is on its way).
    fn leave(&self) -> bool {
        let mut state = self.shared.lock();
        let left = state.queue.remove(self.id).is_some();
        if left {
            self.shared.publish(&state);
        }
        left
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// How long a waiter of each class may wait, by [`Priority::index`].
pub type ClassTimeouts = [Duration; 3];

/// One replica's admission gate. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Admission {
    limit: usize,
    queue_size: usize,
    timeouts: ClassTimeouts,
    shared: Arc<Shared>,
    /// The group of requests that name no share: counted on this
    /// replica only.
    anonymous: Arc<dyn FleetShare>,
}

impl Admission {
    /// A gate of `limit` concurrent requests (0 = unlimited), `queue_size`
    /// waiters, each waiting at most its class's entry of `timeouts`.
    pub fn new(limit: usize, queue_size: usize, timeouts: ClassTimeouts) -> Self {
        Self {
            limit,
            queue_size,
            timeouts,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    free: limit,
                    queue: FairQueue::default(),
                }),
                queued: Priority::ALL
                    .map(|class| metrics::gauge!(ADMISSION_QUEUED, "class" => class.name())),
            }),
            anonymous: Arc::new(LocalShare::default()),
        }
    }

    /// The gate described by the configuration.
    pub fn from_config(config: &crate::config::AdmissionConfig) -> Self {
        Self::new(
            config.max_concurrent_requests,
            config.queue_size,
            config.class_timeouts(),
        )
    }

    /// Whether admission is on.
    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Requests of `class` waiting for a slot now.
    pub fn waiting_in(&self, class: Priority) -> usize {
        self.shared.lock().queue.len_of(class)
    }

    /// Waiters by flow and class now.
    pub fn depths(&self) -> Vec<(Arc<str>, Priority, usize)> {
        self.shared.lock().queue.depths()
    }

    /// The share of requests that are no tenant's, for callers that
    /// weigh them against tenants fleet-wide.
    pub fn anonymous_share(&self) -> Arc<dyn FleetShare> {
        self.anonymous.clone()
    }

    /// Requests holding a slot now (0 when admission is off).
    pub fn in_flight(&self) -> usize {
        if self.enabled() {
            self.limit.saturating_sub(self.shared.lock().free)
        } else {
            0
        }
    }

    /// Admits one request: `Ok(None)` when admission is off, `Ok(Some)`
    /// with a slot (at once, or after waiting its turn), or why not.
    pub async fn admit(&self, ask: &Ask) -> Result<Option<Permit>, Rejection> {
        if !self.enabled() {
            return Ok(None);
        }
        let share = ask.share.clone().unwrap_or_else(|| self.anonymous.clone());
        let (tx, rx) = oneshot::channel();
        let (id, evicted) = {
            let mut state = self.shared.lock();
            if state.free > 0 && state.queue.is_empty() {
                state.free -= 1;
                drop(state);
                return Ok(Some(Permit::new(&self.shared, share.start(ask.cost))));
            }
            let mut evicted = None;
            if state.queue.len() >= self.queue_size {
                if ask.priority < Priority::Sheddable {
                    evicted = state.queue.evict_sheddable();
                }
                if evicted.is_none() {
                    return Err(Rejection::QueueFull);
                }
            }
            // Queued by the share the caller named (none: weighed by fair
            // queueing alone); counted in the anonymous one if it named none.
            let id = state.queue.push(ask, (tx, share, ask.cost));
            self.shared.publish(&state);
            (id, evicted)
        };
        if let Some((evicted, _, _)) = evicted {
            // Its receiver may be gone already; then nobody needs telling.
            let _ = evicted.send(Err(Rejection::Shed));
        }
        let waiting = Waiting {
            shared: &self.shared,
            id,
        };
        let mut rx = rx;
        let timeout = self.timeouts[ask.priority.index()];
        let outcome = match tokio::time::timeout(timeout, &mut rx).await {
            Ok(outcome) => outcome,
            // Timed out, unless a slot or a shedding was already on its way.
            Err(_) if waiting.leave() => return Err(Rejection::QueueTimeout),
            Err(_) => rx.await,
        };
        // A dropped sender (never: senders are always answered) reads as
        // a timeout.
        outcome.unwrap_or(Err(Rejection::QueueTimeout)).map(Some)
    }

    /// The client-facing answer for `rejection`.
    pub fn response(&self, rejection: Rejection) -> Response {
        reject_response(rejection.error(self.limit, self.queue_size))
    }
}
