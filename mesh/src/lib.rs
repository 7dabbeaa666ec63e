//! Shoal's mesh: membership, the mTLS load plane and the CRDT fleet state.
//!
//! Every replica runs a [`Mesh`]. Chitchat gossip ([`membership`]) tells it
//! who else is around; it keeps a mutually authenticated QUIC link to each
//! live peer and pushes its own per-worker slots over it every sync
//! interval; what peers push is merged into the CRDT [`state::FleetState`]
//! (the live path: `session::receive` → `Core::apply_update` →
//! `FleetState::apply_*` → `Core::publish_view`) and published per worker,
//! so the router reads fleet-wide load through a [`WorkerSlot`] without
//! locks or allocation. Housekeeping forgets what left the fleet, so
//! memory and sync cost follow the live fleet.
//!
//! Trust: chitchat is unauthenticated, so it is only a hint (whom to dial,
//! and when to give up on a peer gossip says is dead). A peer's load counts
//! only while its QUIC link is up, its certificate chains to the cluster CA
//! and names the node its Hello claims, it has not said an authenticated
//! `Bye`, and no newer generation of its name has a verified link. Forged
//! gossip — a fake newer incarnation, a fake `left` — un-counts nobody.
//!
//! This crate knows nothing of HTTP or routing policies.

mod bell;
mod config;
mod core;
mod gap_timer;
mod gossip_transport;
mod heard;
mod hints;
mod housekeeping;
pub mod identity;
mod membership;
mod mesh;
mod objects;
mod outbox;
mod own_thread;
pub mod ownership;
mod push;
mod session;
mod sightings;
mod slot;
mod stable_hash;
pub mod state;
mod status;
#[cfg(feature = "testsuite")]
mod tap;
mod telemetry;
mod tenants;
mod timings;
pub mod tls;
mod totals;
mod wire;
mod worker_frames;
mod worker_keys;
pub mod worker_set;

pub use config::{
    DEFAULT_ANTI_ENTROPY_INTERVAL, DEFAULT_DISPATCH_HISTORY, DEFAULT_MAX_PUSH_RATE,
    DEFAULT_PUSH_MIN_GAP_MS, DEFAULT_SYNC_INTERVAL_MS, DEFAULT_WORKER_REMOVAL_TTL,
    FailureDetectorSettings, MeshConfig, PemSource, TlsConfig,
};
pub use identity::Incarnation;
pub use mesh::{Mesh, MeshError, Readiness};
pub use objects::{MAX_PENDING_OBJECTS, ObjectReceiver, ObjectSender};
pub use shoal_proto as proto;
pub use sightings::{MAX_PENDING_SIGHTINGS, SightingReceiver, SightingSender};
pub use slot::{FleetLoad, PollStamp, SlotBooking, SnapshotView, WorkerSlot};
pub use state::MAX_CLOCK_SKEW_MS;
pub use status::{Footprint, MemberStatus, MeshStatus, ReplicaShare, SnapshotStatus, WorkerStatus};
#[cfg(feature = "testsuite")]
pub use tap::FrameTap;
pub use telemetry::{TrafficStatus, describe_metrics};
pub use tenants::{MAX_WINDOW_SECS, TenantBook, TenantTotals, TenantWindow, Usage};
pub use worker_set::SharedWorkerSet;
