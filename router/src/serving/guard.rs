//! The task that decides when the front closes a client connection on its
//! own: the replica drains, the connection sat with no request in flight
//! for the header timeout, or the connection table picked it to make room.
//!
//! Why a task of its own and not a timer in the connection's loop: the
//! connection future is polled on every wake-up of every request, and
//! everything polled beside it is paid each time. The guard sleeps on its
//! own timer and tells the connection through two oneshots, each a single
//! atomic check where the connection is polled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use super::activity::Activity;
use crate::telemetry;

/// How long a connection asked to close gracefully (HTTP/2 GOAWAY; an
/// HTTP/1 head still arriving) has before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What the connection hears from its guard.
pub struct Signals {
    /// Close gracefully: in-flight requests finish, idle ones close.
    pub graceful: oneshot::Receiver<()>,
    /// Drop the connection now.
    pub abort: oneshot::Receiver<()>,
}

/// Starts the guard of a connection on the current runtime.
pub fn spawn(activity: Arc<Activity>, timeout: Duration, stop: watch::Receiver<bool>) -> Signals {
    let (graceful_tx, graceful) = oneshot::channel();
    let (abort_tx, abort) = oneshot::channel();
    tokio::spawn(watch_over(activity, timeout, stop, graceful_tx, abort_tx));
    Signals { graceful, abort }
}

/// Why the guard closes the connection (the metric's reason).
fn close_reason(activity: &Activity) -> &'static str {
    if activity.has_served() {
        "idle_timeout"
    } else {
        "header_timeout"
    }
}

/// Resolves when the connection has had no request in flight for
/// `timeout`, with the reason: `header_timeout` when it never delivered a
/// request (nothing sent, part of a head or preface), else `idle_timeout`.
/// While a request is in flight it looks again a timeout later.
async fn idle_expiry(activity: &Activity, timeout: Duration) -> &'static str {
    loop {
        let now = Instant::now();
        let wake = match activity.idle_since() {
            Some(since) if now.saturating_duration_since(since) >= timeout => {
                return close_reason(activity);
            }
            Some(since) => since + timeout,
            None => now + timeout,
        };
        tokio::time::sleep_until(wake.into()).await;
    }
}

async fn watch_over(
    activity: Arc<Activity>,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
    graceful: oneshot::Sender<()>,
    mut abort: oneshot::Sender<()>,
) {
    let reason = tokio::select! {
        _ = stop.wait_for(|stop| *stop) => None,
        reason = idle_expiry(&activity, timeout) => Some(reason),
        () = activity.evicted() => Some("evicted"),
        // The connection ended by itself.
        () = abort.closed() => return,
    };
    match reason {
        // Draining: in-flight requests finish however long they take.
        None => {
            let _ = graceful.send(());
            abort.closed().await;
        }
        // Nothing in flight and nothing owed: a connection that never
        // sent a request, or one taken to make room, just closes (a
        // graceful close would wait for the rest of a half-sent head).
        Some(reason @ ("header_timeout" | "evicted")) => {
            telemetry::client_connection_closed(reason);
            let _ = abort.send(());
        }
        // A keep-alive connection gone quiet: closed gracefully (HTTP/2
        // sends GOAWAY first), then dropped if that takes too long.
        Some(reason) => {
            telemetry::client_connection_closed(reason);
            let _ = graceful.send(());
            tokio::select! {
                () = tokio::time::sleep(CLOSE_GRACE) => {
                    let _ = abort.send(());
                }
                () = abort.closed() => {}
            }
        }
    }
}
