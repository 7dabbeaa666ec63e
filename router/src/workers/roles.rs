//! Which pool a worker of a disaggregated fleet belongs to: prefill or
//! decode (`--prefill-urls`, `--decode-urls`).
//!
//! Why here: every routing path filters candidates by it (the proxy, the
//! disaggregated dispatch, a migrated stream's continuation), and they all
//! build on the worker list.

use std::collections::HashSet;
use std::sync::Arc;

use super::Worker;

/// The prefill workers of a disaggregated fleet: those `--prefill-urls`
/// names and those discovery puts there (`--discovery-role-label`); every
/// other worker decodes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Roles {
    prefill: HashSet<String>,
}

impl Roles {
    /// The roles of a fleet whose prefill workers are `prefill_urls`
    /// (normalized as the worker list holds them).
    pub fn new(prefill_urls: &[String]) -> Self {
        Self {
            prefill: prefill_urls.iter().cloned().collect(),
        }
    }

    /// Whether `worker` prefills.
    pub fn is_prefill(&self, worker: &Worker) -> bool {
        worker.discovered_prefill() || self.prefill.contains(worker.url())
    }
}

/// One pool of a disaggregated fleet: which workers a request may go to.
#[derive(Debug, Clone, Copy)]
pub struct PoolSide<'a> {
    /// The fleet's roles.
    pub roles: &'a Roles,
    /// The prefill pool (else the decode pool).
    pub prefill: bool,
}

impl PoolSide<'_> {
    /// Whether `worker` is in this pool.
    pub fn admits(&self, worker: &Worker) -> bool {
        self.roles.is_prefill(worker) == self.prefill
    }

    /// The pool's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        if self.prefill { "prefill" } else { "decode" }
    }
}

/// [`PoolSide`] owned, for what outlives a request's borrow (a migrated
/// stream's continuation).
#[derive(Debug, Clone)]
pub struct OwnedPoolSide {
    /// The fleet's roles.
    pub roles: Arc<Roles>,
    /// The prefill pool (else the decode pool).
    pub prefill: bool,
}

impl OwnedPoolSide {
    /// The borrowed form.
    pub fn borrow(&self) -> PoolSide<'_> {
        PoolSide {
            roles: &self.roles,
            prefill: self.prefill,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;

    #[test]
    fn a_worker_prefills_when_named_or_discovered_so() {
        let roles = Roles::new(&["http://p:1".to_string()]);
        let named = Worker::new("http://p:1".into(), BreakerConfig::default());
        let other = Worker::new("http://d:1".into(), BreakerConfig::default());
        assert!(roles.is_prefill(&named));
        assert!(!roles.is_prefill(&other));
        other.set_discovered_prefill(true);
        assert!(roles.is_prefill(&other));
        let decode = PoolSide {
            roles: &roles,
            prefill: false,
        };
        assert!(!decode.admits(&other) && decode.name() == "decode");
    }
}
