//! The mesh's fixed timings, named in one place. The tunable ones (sync,
//! anti-entropy, idle timeout, forget-after) are `MeshConfig` fields; these
//! bound start-up, reconnects and shutdown.

use std::time::Duration;

/// Longest wait for a peer's `Hello` (and for an inbound handshake).
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// First backoff before re-dialing a peer whose session ended.
pub(crate) const DIAL_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Backoff ceiling for re-dialing (it doubles up to this).
pub(crate) const DIAL_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The membership loop reads gossip at least this often.
pub(crate) const MEMBERSHIP_READ_MAX: Duration = Duration::from_millis(100);
/// How long chitchat keeps a deleted key's tombstone.
pub(crate) const GOSSIP_TOMBSTONE_GRACE: Duration = Duration::from_secs(3600);
/// Shutdown: how long to wait for every session to push its last changes
/// and say `Bye`, checked every [`SHUTDOWN_POLL`].
pub(crate) const SHUTDOWN_BYE_WAIT: Duration = Duration::from_millis(800);
/// Shutdown: how often the wait above checks.
pub(crate) const SHUTDOWN_POLL: Duration = Duration::from_millis(10);
/// Shutdown: how long dialing tasks get to end before they are aborted.
pub(crate) const SHUTDOWN_DIALER_JOIN: Duration = Duration::from_millis(200);
/// Shutdown: at most this long (two gossip rounds) to gossip `left`.
pub(crate) const SHUTDOWN_GOSSIP_LEFT_MAX: Duration = Duration::from_millis(500);
/// Shutdown: how long the QUIC endpoint gets to close its connections.
pub(crate) const SHUTDOWN_ENDPOINT_IDLE: Duration = Duration::from_millis(500);
/// After `Bye`: how long a session waits for the peer to take the stream.
pub(crate) const BYE_FLUSH_WAIT: Duration = Duration::from_millis(500);
