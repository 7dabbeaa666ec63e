//! Shoal's mesh: membership, the mTLS load plane and the CRDT fleet state.
//!
//! This crate is a placeholder until the mesh issue lands; the router already
//! reads load through its `FleetView`, which the mesh will fill with
//! fleet-wide numbers. It depends only on `shoal-proto` so the layering
//! router -> mesh -> proto holds from the start.

pub use shoal_proto as proto;
