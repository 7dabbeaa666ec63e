//! Data types shared by every Shoal crate.
//!
//! `proto` sits at the bottom of the dependency graph (router -> mesh ->
//! proto) so that the load a router polls from an engine, and later the frames
//! replicas exchange, have one definition that both sides agree on.

pub mod counts;
pub mod figures;
pub mod frame_size;
pub mod frames;
pub mod load;
pub mod slot_pack;
pub mod tenant_frames;

pub use counts::LoadCounts;
pub use figures::LoadFigures;
pub use load::{EngineKind, EngineLoad, LoadSnapshot};
