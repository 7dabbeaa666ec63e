//! Judging one request against a tenant's fleet-wide window: which limit
//! it breaks, how long until it would not, and the rate-limit headers
//! OpenAI's API sends (`x-ratelimit-limit-*`, `-remaining-*`, `-reset-*`).

use http::{HeaderName, HeaderValue};
use shoal_mesh::{TenantTotals, TenantWindow, Usage};

use super::file::Limits;

/// Why a tenant's request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Its requests per window are used up.
    RateLimited,
    /// One of its token allowances is used up.
    TokensExhausted,
    /// It has `max_concurrent` requests in flight.
    Concurrency,
}

impl Reason {
    /// Every reason, for metrics that start at zero.
    pub const ALL: [Reason; 3] = [
        Reason::RateLimited,
        Reason::TokensExhausted,
        Reason::Concurrency,
    ];

    /// Its position in [`Reason::ALL`].
    pub fn index(self) -> usize {
        match self {
            Reason::RateLimited => 0,
            Reason::TokensExhausted => 1,
            Reason::Concurrency => 2,
        }
    }

    /// The error `code` and metric label.
    pub fn code(self) -> &'static str {
        match self {
            Reason::RateLimited => "tenant_rate_limited",
            Reason::TokensExhausted => "tenant_tokens_exhausted",
            Reason::Concurrency => "tenant_concurrency",
        }
    }
}

/// A refusal: why, for how long, and what to tell the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    /// The limit broken.
    pub reason: Reason,
    /// Seconds until the request would fit (at least 1).
    pub retry_after_secs: u64,
    /// A sentence for the client.
    pub message: String,
}

/// One measured quantity: its name in headers and messages, its allowance
/// and how to read it from a [`Usage`].
struct Measure {
    /// `x-ratelimit-limit-*`, `-remaining-*`, `-reset-*`.
    headers: [HeaderName; 3],
    noun: &'static str,
    reason: Reason,
    allowance: fn(&Limits) -> Option<u64>,
    of: fn(&Usage) -> u64,
}

/// The four measured quantities, built once (header names included).
static MEASURES: [Measure; 4] = [
    Measure {
        headers: [
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderName::from_static("x-ratelimit-reset-requests"),
        ],
        noun: "requests",
        reason: Reason::RateLimited,
        allowance: |l| l.requests,
        of: |u| u.requests,
    },
    Measure {
        headers: [
            HeaderName::from_static("x-ratelimit-limit-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-tokens"),
            HeaderName::from_static("x-ratelimit-reset-tokens"),
        ],
        noun: "tokens",
        reason: Reason::TokensExhausted,
        allowance: |l| l.tokens,
        of: |u| u.input_tokens.saturating_add(u.output_tokens),
    },
    Measure {
        headers: [
            HeaderName::from_static("x-ratelimit-limit-input-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-input-tokens"),
            HeaderName::from_static("x-ratelimit-reset-input-tokens"),
        ],
        noun: "input tokens",
        reason: Reason::TokensExhausted,
        allowance: |l| l.input_tokens,
        of: |u| u.input_tokens,
    },
    Measure {
        headers: [
            HeaderName::from_static("x-ratelimit-limit-output-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-output-tokens"),
            HeaderName::from_static("x-ratelimit-reset-output-tokens"),
        ],
        noun: "output tokens",
        reason: Reason::TokensExhausted,
        allowance: |l| l.output_tokens,
        of: |u| u.output_tokens,
    },
];

/// A limit a request would break, before the wait is known (that needs
/// the window second by second, read outside the book's lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    /// The limit.
    pub reason: Reason,
    /// Which of [`MEASURES`] (none: concurrency).
    measure: Option<usize>,
    /// Used over the window before this request.
    used: u64,
    /// This request's charge.
    asked: u64,
    /// The allowance (or `max_concurrent`).
    allowance: u64,
}

/// Whether `request` fits `limits` on top of `totals` (the tenant's
/// fleet-wide usage before it). Cheap: it runs under the book's lock.
pub fn check(limits: &Limits, totals: &TenantTotals, request: &Usage) -> Result<(), Exceeded> {
    if let Some(max) = limits.max_concurrent
        && totals.in_flight >= max
    {
        return Err(Exceeded {
            reason: Reason::Concurrency,
            measure: None,
            used: totals.in_flight,
            asked: 1,
            allowance: max,
        });
    }
    for (i, m) in MEASURES.iter().enumerate() {
        let Some(allowance) = (m.allowance)(limits) else {
            continue;
        };
        let used = (m.of)(&totals.used);
        let asked = (m.of)(request);
        if used.saturating_add(asked) > allowance {
            return Err(Exceeded {
                reason: m.reason,
                measure: Some(i),
                used,
                asked,
                allowance,
            });
        }
    }
    Ok(())
}

/// What to tell the client about `exceeded`, with the wait read from the
/// tenant's `window` second by second.
pub fn breach(exceeded: &Exceeded, window: &TenantWindow) -> Breach {
    let window_secs = window.seconds.len() as u64;
    let Exceeded {
        reason,
        used,
        asked,
        allowance,
        ..
    } = *exceeded;
    let Some(m) = exceeded.measure.and_then(|i| MEASURES.get(i)) else {
        return Breach {
            reason,
            retry_after_secs: 1,
            message: format!(
                "tenant has {used} requests in flight across the fleet \
                 (max_concurrent = {allowance}); retry when one ends"
            ),
        };
    };
    if asked > allowance {
        return Breach {
            reason,
            retry_after_secs: window_secs.max(1),
            message: format!(
                "this request needs {asked} {} and the tenant's allowance is {allowance} \
                 per {window_secs} s: it can never fit; lower max_tokens or the prompt",
                m.noun
            ),
        };
    }
    let excess = used.saturating_add(asked).saturating_sub(allowance);
    let wait = expiry_wait(window, excess, m.of);
    Breach {
        reason,
        retry_after_secs: wait,
        message: format!(
            "tenant used {used} of {allowance} {} in the last {window_secs} s across the fleet; \
             retry in {wait} s",
            m.noun
        ),
    }
}

/// Seconds until `excess` of what `of` measures has left `window`.
fn expiry_wait(window: &TenantWindow, excess: u64, of: fn(&Usage) -> u64) -> u64 {
    let len = window.seconds.len() as u64;
    let mut expired = 0u64;
    for (i, second) in window.seconds.iter().enumerate() {
        expired = expired.saturating_add(of(second));
        if expired >= excess {
            // The window ends now, at second `first + len - 1`: second
            // `first + i` leaves it when the clock reaches `first + i + len`,
            // `i + 1` seconds on.
            return i as u64 + 1;
        }
    }
    len.max(1)
}

/// The rate-limit headers for `limits` given `totals`: allowance, what
/// remains of it, and how long until the window holds none of the usage
/// (taken as ending with the current second's, which holds this request's:
/// a window whose newest usage is older resets sooner than said), written
/// as OpenAI writes a duration (`1s`, `6m0s`, `250ms`).
pub fn headers(
    limits: &Limits,
    totals: &TenantTotals,
    window_secs: u64,
    now_unix_us: u64,
) -> Vec<(HeaderName, HeaderValue)> {
    let leaves_at_us = (now_unix_us / 1_000_000 + window_secs).saturating_mul(1_000_000);
    let mut out = Vec::with_capacity(12);
    for m in &MEASURES {
        let Some(allowance) = (m.allowance)(limits) else {
            continue;
        };
        let used = (m.of)(&totals.used);
        let remaining = allowance.saturating_sub(used);
        let reset_us = if used > 0 {
            leaves_at_us.saturating_sub(now_unix_us)
        } else {
            0
        };
        let [limit, left, reset] = &m.headers;
        out.push((limit.clone(), HeaderValue::from(allowance)));
        out.push((left.clone(), HeaderValue::from(remaining)));
        if let Ok(value) = HeaderValue::from_str(&duration_text(reset_us)) {
            out.push((reset.clone(), value));
        }
    }
    out
}

/// `us` as OpenAI's headers write a duration: `250ms`, `1s`, `59s`, `6m0s`.
pub fn duration_text(us: u64) -> String {
    let ms = us.div_ceil(1_000);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let secs = ms.div_ceil(1_000);
    if secs < 60 {
        format!("{secs}s")
    } else {
        format!("{}m{}s", secs / 60, secs % 60)
    }
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
