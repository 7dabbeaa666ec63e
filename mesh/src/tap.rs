//! A hook between frame decoding and merging, for fault-injection tests.
//!
//! The mesh hands every decoded [`Update`] to the configured [`FrameTap`]
//! and merges whatever it returns, in that order. A tap can drop frames
//! (return nothing), duplicate them (return a frame twice) or reorder them
//! (hold frames back and release them later). Production configs leave the
//! tap unset.

use shoal_proto::frames::Update;

use crate::identity::Incarnation;

/// Sees each received update before it is merged; returns the updates to
/// merge instead.
pub trait FrameTap: Send + Sync {
    /// Called once per decoded update from `from`; every returned update is
    /// merged as coming from `from` (hold frames back per sender).
    fn on_update(&self, from: &Incarnation, update: Update) -> Vec<Update>;
}
