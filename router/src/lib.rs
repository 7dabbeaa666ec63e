//! Shoal: an active-active router for LLM inference fleets.
//!
//! The binary (`main.rs`) only parses the configuration and calls
//! [`app::Server`]; everything else lives here so integration tests can run
//! a real replica on an ephemeral port.

pub mod admission;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod engine_h1;
pub mod engine_tls;
pub mod engines;
pub mod error;
pub mod fleet;
pub mod http;
pub mod id_hash;
pub mod kv_events;
pub mod load;
pub mod logging;
pub mod mesh_setup;
pub mod objects;
pub mod otel;
pub mod policy;
pub mod proxy;
pub mod reload;
pub mod request;
pub mod retry_rule;
pub mod serving;
pub mod sources;
pub mod supervise;
pub mod telemetry;
pub mod tenants;
pub mod upstream;
pub mod url;
pub mod workers;
