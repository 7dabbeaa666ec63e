//! Shared helpers for Shoal's cross-process tests, mock engine and benchmarks.

pub mod bench;
pub mod client;
pub mod fleet;
pub mod kube_api;
pub mod mock;
pub mod wait;
pub mod workload;
