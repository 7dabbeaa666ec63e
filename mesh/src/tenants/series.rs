//! One writer's usage of one tenant, second by second: what an
//! incarnation tells its peers, and what a peer told this node.

use std::collections::VecDeque;

use shoal_proto::frames::{TenantEntry, TenantSecond};

/// Requests and tokens of one tenant, over some span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests admitted.
    pub requests: u64,
    /// Input (prompt) tokens charged.
    pub input_tokens: u64,
    /// Output tokens charged.
    pub output_tokens: u64,
}

impl Usage {
    pub(super) fn add_saturating(&mut self, other: Usage) {
        self.requests = self.requests.saturating_add(other.requests);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }

    pub(super) fn sub_saturating(&mut self, other: Usage) {
        self.requests = self.requests.saturating_sub(other.requests);
        self.input_tokens = self.input_tokens.saturating_sub(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_sub(other.output_tokens);
    }
}

/// One writer's usage of one tenant.
#[derive(Debug, Default, Clone)]
pub(super) struct Series {
    /// (second, usage), ascending.
    pub(super) seconds: VecDeque<(u64, Usage)>,
    pub(super) in_flight: u64,
}

impl Series {
    /// The usage of second `sec`, made if missing.
    pub(super) fn slot(&mut self, sec: u64) -> &mut Usage {
        let at = self.seconds.partition_point(|(s, _)| *s < sec);
        if self.seconds.get(at).is_none_or(|(s, _)| *s != sec) {
            self.seconds.insert(at, (sec, Usage::default()));
        }
        &mut self.seconds[at].1
    }

    /// The usage of second `sec`, if held.
    pub(super) fn get(&self, sec: u64) -> Option<Usage> {
        let at = self.seconds.partition_point(|(s, _)| *s < sec);
        self.seconds
            .get(at)
            .filter(|(s, _)| *s == sec)
            .map(|(_, u)| *u)
    }

    /// Forgets the seconds before `keep_from`.
    pub(super) fn trim(&mut self, keep_from: u64) {
        while self.seconds.front().is_some_and(|(s, _)| *s < keep_from) {
            self.seconds.pop_front();
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.seconds.is_empty()
    }

    /// The frame entry of `tenant` with the seconds `only` keeps.
    pub(super) fn entry(&self, tenant: &str, only: impl Fn(u64) -> bool) -> TenantEntry {
        TenantEntry {
            tenant: tenant.to_string(),
            in_flight: self.in_flight,
            seconds: self
                .seconds
                .iter()
                .filter(|(s, _)| only(*s))
                .map(|(s, u)| TenantSecond {
                    unix_sec: *s,
                    requests: u.requests,
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                })
                .collect(),
        }
    }
}
