//! Who a replica is: its node name and the generation of this run.
//!
//! A replica incarnation is `(name, generation)`; the generation is the start
//! time in microseconds since the Unix epoch, so a restarted replica is a new
//! incarnation whose generation is larger than every earlier one (chitchat
//! requires that, and the fleet state relies on it to never double-count).

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// One run of one replica: the actor of every CRDT in the fleet state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Incarnation {
    /// Node name, unique in the cluster and named by the node's certificate.
    pub name: Arc<str>,
    /// Start time of this run (µs since the Unix epoch); grows on restart.
    pub generation: u64,
}

impl Incarnation {
    /// An incarnation with an explicit generation.
    pub fn new(name: impl Into<Arc<str>>, generation: u64) -> Self {
        Self {
            name: name.into(),
            generation,
        }
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name, self.generation)
    }
}

/// Wall clock in microseconds since the Unix epoch (0 if the clock is
/// before 1970, which only a broken host reports).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Wall clock in whole seconds since the Unix epoch (the unit tenant
/// usage is booked in).
pub fn unix_secs() -> u64 {
    unix_micros() / 1_000_000
}

/// Wall clock in milliseconds since the Unix epoch.
pub fn unix_millis() -> u64 {
    unix_micros() / 1000
}

/// A generation for a new run: the current time in µs, but never below
/// `floor + 1` so two runs started in the same microsecond still differ.
pub fn next_generation(floor: u64) -> u64 {
    unix_micros().max(floor.saturating_add(1))
}

/// True when `name` is usable as a node name: a DNS name (letters, digits,
/// `-` and `.`, labels of 1..=63 bytes), because peers check it against the
/// DNS names in the node's certificate.
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_must_be_dns_names() {
        assert!(valid_node_name("shoal-0"));
        assert!(valid_node_name("shoal-0.shoal.default.svc"));
        assert!(!valid_node_name(""));
        assert!(!valid_node_name("a_b"));
        assert!(!valid_node_name("-a"));
        assert!(!valid_node_name("a..b"));
    }

    #[test]
    fn generations_grow() {
        let g = next_generation(0);
        assert!(next_generation(g) > g);
        assert!(next_generation(u64::MAX - 1) == u64::MAX);
    }
}
