//! How much token-work a group of flows was granted across the fleet
//! lately: what the admission queue weighs flows by, so fair share holds
//! across the fleet and not only within each replica's share of the
//! traffic.
//!
//! Each request a replica's admission gate grants a slot is counted in the
//! mesh's tenant book under its tenant's dispatch scope
//! ([`running_scope`]): its token-work (prompt estimate plus output) in
//! the second it was granted, and one in flight until its response ends,
//! gossiped like every tenant count. A replica choosing which waiting
//! tenant gets a freed slot picks the one granted the least token-work
//! fleet-wide over the last [`FAIR_SHARE_HORIZON_SECS`] for its weight
//! (least attained service), so a tenant whose traffic reaches few
//! replicas is served first there until it has its share of the whole
//! fleet. The horizon bounds the credit an idle tenant brings back: at
//! most that many seconds of the others' service. Requests that are no
//! tenant's share one group counted on this replica only.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::Mutex;

use shoal_mesh::identity::unix_secs;
use shoal_mesh::{TenantBook, Usage};

use super::file::scope_name;

/// Seconds of grants a group's share is measured over (or the tenants
/// file's window, if shorter).
pub const FAIR_SHARE_HORIZON_SECS: u64 = 5;

/// A group of flows' service from the fleet's admission slots.
pub trait FleetShare: Debug + Send + Sync {
    /// Token-work granted slots over the last [`FAIR_SHARE_HORIZON_SECS`],
    /// fleet-wide where it can know.
    fn served(&self) -> u64;
    /// Counts a request of `work` tokens granted a slot now (and holding
    /// it until the guard drops).
    fn start(&self, work: u64) -> Running;
}

/// Held with a slot; dropping it ends the count [`FleetShare::start`]
/// began.
pub type Running = Box<dyn Any + Send + Sync>;

/// The tenant book's name for the count of `tenant`'s requests holding
/// an admission slot.
pub fn running_scope(tenant: &str) -> Arc<str> {
    scope_name("r-", &[tenant])
}

/// A tenant's share, counted fleet-wide in the mesh's tenant book.
#[derive(Debug)]
pub struct TenantShare {
    book: Arc<TenantBook>,
    scope: Arc<str>,
}

impl TenantShare {
    /// `tenant`'s share, counted in `book`.
    pub fn new(book: Arc<TenantBook>, tenant: &str) -> Self {
        Self {
            book,
            scope: running_scope(tenant),
        }
    }
}

/// Ends one running request of a [`TenantShare`].
struct TenantRunning {
    book: Arc<TenantBook>,
    scope: Arc<str>,
}

impl Drop for TenantRunning {
    fn drop(&mut self) {
        self.book.finish(&self.scope);
    }
}

impl FleetShare for TenantShare {
    fn served(&self) -> u64 {
        self.book
            .recent(&self.scope, unix_secs(), FAIR_SHARE_HORIZON_SECS)
            .input_tokens
    }

    fn start(&self, work: u64) -> Running {
        let one = Usage {
            requests: 1,
            input_tokens: work,
            output_tokens: 0,
        };
        // Never refused: the check passes whatever the totals.
        let _ = self
            .book
            .admit(&self.scope, unix_secs(), one, |_| Ok::<(), ()>(()));
        Box::new(TenantRunning {
            book: self.book.clone(),
            scope: self.scope.clone(),
        })
    }
}

/// A share counted on this replica only (requests that are no tenant's):
/// token-work granted per second, the last [`FAIR_SHARE_HORIZON_SECS`].
#[derive(Debug, Default)]
pub struct LocalShare {
    /// (second, work granted in it), oldest first.
    seconds: Mutex<VecDeque<(u64, u64)>>,
}

impl LocalShare {
    fn served_at(&self, now_sec: u64) -> u64 {
        let mut seconds = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        let first = (now_sec + 1).saturating_sub(FAIR_SHARE_HORIZON_SECS);
        while seconds.front().is_some_and(|(sec, _)| *sec < first) {
            seconds.pop_front();
        }
        seconds.iter().map(|(_, w)| *w).fold(0, u64::saturating_add)
    }

    fn grant_at(&self, now_sec: u64, work: u64) {
        let mut seconds = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        match seconds.back_mut() {
            Some((sec, w)) if *sec == now_sec => *w = w.saturating_add(work),
            _ => seconds.push_back((now_sec, work)),
        }
        if seconds.len() > FAIR_SHARE_HORIZON_SECS as usize {
            seconds.pop_front();
        }
    }
}

impl FleetShare for LocalShare {
    fn served(&self) -> u64 {
        self.served_at(unix_secs())
    }

    fn start(&self, work: u64) -> Running {
        self.grant_at(unix_secs(), work);
        Box::new(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_share_counts_its_grants_fleet_wide_and_its_running_requests() {
        let book = Arc::new(TenantBook::local());
        let share = TenantShare::new(book.clone(), "acme");
        assert_eq!(share.served(), 0);
        let a = share.start(100);
        let b = share.start(50);
        assert_eq!(share.served(), 150);
        let scope = running_scope("acme");
        assert_eq!(book.window(&scope, unix_secs()).in_flight, 2);
        drop(a);
        drop(b);
        assert_eq!(book.window(&scope, unix_secs()).in_flight, 0);
        // The work stays counted for the horizon, whoever still runs.
        assert_eq!(share.served(), 150);
    }

    #[test]
    fn a_local_share_forgets_grants_older_than_the_horizon() {
        let local = LocalShare::default();
        local.grant_at(100, 10);
        local.grant_at(100, 5);
        local.grant_at(102, 1);
        assert_eq!(local.served_at(102), 16);
        assert_eq!(local.served_at(100 + FAIR_SHARE_HORIZON_SECS), 1);
        assert_eq!(local.served_at(200), 0);
    }
}
