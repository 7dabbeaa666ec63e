//! Priority classes and fairness flows: what a queued request is, for the
//! [`FairQueue`](super::fair_queue::FairQueue) that orders the waiters.
//!
//! A request's class comes from its tenant's `priority` in the tenants
//! file (standard without one), and a client may lower it — never raise
//! it — with the [`PRIORITY_HEADER`]: a batch job marks itself sheddable,
//! but a tenant cannot claim critical. A request that is no tenant's (an
//! operator's unlimited key, or no keys at all) takes the header as is.
//!
//! Its flow — the unit fair share is measured between — is its tenant,
//! refined by the [`FAIRNESS_ID_HEADER`] when the client sends one (the
//! Gateway API Inference Extension's name), so one tenant's end users can
//! be kept apart too.

use std::sync::Arc;

use http::HeaderMap;

pub use crate::tenants::Priority;
use crate::tenants::share::FleetShare;

/// Header a client names its request's class with: `critical`, `standard`
/// or `sheddable`.
pub const PRIORITY_HEADER: &str = "x-shoal-priority";

/// Header that refines a request's fairness flow within its tenant.
pub const FAIRNESS_ID_HEADER: &str = "x-gateway-inference-fairness-id";

/// Longest fairness id accepted, in bytes (a flow's name is held while it
/// has waiters; an unbounded one would let a client grow that).
pub const MAX_FAIRNESS_ID_BYTES: usize = 128;

/// What a request asks of the queue: its class, its flow, the flow's
/// weight and group, and the request's cost in token-work.
#[derive(Debug, Clone)]
pub struct Ask {
    /// Its class.
    pub priority: Priority,
    /// Its fairness flow (tenant, refined by the fairness id).
    pub flow: Arc<str>,
    /// Its flow's share relative to others of its class (at least 1).
    pub weight: u64,
    /// Prompt tokens plus the output tokens it may generate.
    pub cost: u64,
    /// Its group's hold on the fleet's slots (its tenant's, counted over
    /// the mesh); `None`: the gate's local group of requests that are no
    /// tenant's.
    pub share: Option<Arc<dyn FleetShare>>,
}

impl Ask {
    /// A standard request of the anonymous flow: what callers that know
    /// nothing about classes ask.
    pub fn plain(cost: u64) -> Ask {
        Ask {
            priority: Priority::Standard,
            flow: Arc::from(""),
            weight: 1,
            cost,
            share: None,
        }
    }
}

/// Why a request's class or flow headers were refused (400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError(pub String);

/// The class a request runs at: `configured` (its tenant's, or `None` for
/// a request that is no tenant's) lowered by the [`PRIORITY_HEADER`], or
/// an error naming a bad header value.
pub fn priority_of(
    headers: &HeaderMap,
    configured: Option<Priority>,
) -> Result<Priority, HeaderError> {
    let Some(value) = headers.get(PRIORITY_HEADER) else {
        return Ok(configured.unwrap_or_default());
    };
    let asked = value
        .to_str()
        .ok()
        .map(str::trim)
        .and_then(|v| Priority::parse(&v.to_ascii_lowercase()))
        .ok_or_else(|| {
            HeaderError(format!(
                "{PRIORITY_HEADER} must be critical, standard or sheddable"
            ))
        })?;
    // A later class is a lower one: a tenant may only step down.
    Ok(match configured {
        Some(ceiling) => asked.max(ceiling),
        None => asked,
    })
}

/// The fairness flow of a request of `tenant` (`""`: no tenant's): the
/// tenant, refined by the [`FAIRNESS_ID_HEADER`] when present, or an error
/// naming a bad header value.
pub fn flow_of(headers: &HeaderMap, tenant: &Arc<str>) -> Result<Arc<str>, HeaderError> {
    let Some(value) = headers.get(FAIRNESS_ID_HEADER) else {
        return Ok(tenant.clone());
    };
    let id = value
        .to_str()
        .ok()
        .filter(|v| !v.is_empty() && v.len() <= MAX_FAIRNESS_ID_BYTES)
        .ok_or_else(|| {
            HeaderError(format!(
                "{FAIRNESS_ID_HEADER} must be 1 to {MAX_FAIRNESS_ID_BYTES} visible ASCII characters"
            ))
        })?;
    // NUL cannot occur in a header value, so the pair is unambiguous.
    Ok(Arc::from(format!("{tenant}\u{0}{id}")))
}

/// The tenant part of a flow's name.
pub fn flow_tenant(flow: &str) -> &str {
    flow.split('\u{0}').next().unwrap_or(flow)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with(name: &'static str, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn a_tenant_may_lower_its_class_but_never_raise_it() {
        let standard = Some(Priority::Standard);
        let h = with(PRIORITY_HEADER, "sheddable");
        assert_eq!(priority_of(&h, standard), Ok(Priority::Sheddable));
        let h = with(PRIORITY_HEADER, "critical");
        assert_eq!(priority_of(&h, standard), Ok(Priority::Standard));
        assert_eq!(
            priority_of(&h, Some(Priority::Critical)),
            Ok(Priority::Critical)
        );
        assert_eq!(priority_of(&h, None), Ok(Priority::Critical));
        assert_eq!(
            priority_of(&HeaderMap::new(), Some(Priority::Sheddable)),
            Ok(Priority::Sheddable)
        );
        assert_eq!(priority_of(&HeaderMap::new(), None), Ok(Priority::Standard));
        let h = with(PRIORITY_HEADER, " Critical ");
        assert_eq!(priority_of(&h, None), Ok(Priority::Critical));
    }

    #[test]
    fn a_bad_class_names_the_header() {
        let h = with(PRIORITY_HEADER, "urgent");
        let err = priority_of(&h, None).unwrap_err();
        assert!(err.0.contains(PRIORITY_HEADER), "{}", err.0);
    }

    #[test]
    fn flows_are_tenants_refined_by_the_fairness_id() {
        let acme: Arc<str> = Arc::from("acme");
        assert_eq!(&*flow_of(&HeaderMap::new(), &acme).unwrap(), "acme");
        let h = with(FAIRNESS_ID_HEADER, "user-7");
        let flow = flow_of(&h, &acme).unwrap();
        assert_ne!(&*flow, "acme");
        assert_eq!(flow_tenant(&flow), "acme");
        assert_eq!(flow_tenant("acme"), "acme");
        let long: &'static str = Box::leak("x".repeat(MAX_FAIRNESS_ID_BYTES + 1).into_boxed_str());
        let err = flow_of(&with(FAIRNESS_ID_HEADER, long), &acme).unwrap_err();
        assert!(err.0.contains(FAIRNESS_ID_HEADER));
    }
}
