//! The tenant-usage frame ([`crate::frames::Frame::Tenants`]): each
//! replica's per-tenant admissions per second and requests in flight.

use serde::{Deserialize, Serialize};

/// Most tenants one [`TenantsFrame`] carries; a receiver drops, counted, a
/// frame with more (a sender splits its batch into frames of this size).
pub const MAX_TENANTS_PER_FRAME: usize = 256;

/// Longest tenant name, in bytes, a receiver accepts (names come from the
/// operators' tenants file, never from clients).
pub const MAX_TENANT_NAME_BYTES: usize = 64;

/// Most one-second buckets one [`TenantEntry`] carries: the longest
/// window a tenant's limits are measured over, in seconds.
pub const MAX_TENANT_SECONDS: usize = 60;

/// Per-tenant usage of the sending incarnation.
///
/// A tenant is a name from the operators' configuration; the numbers are
/// request and token counts. No prompt, key or client detail travels, and
/// the frame goes only over the mTLS load link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantsFrame {
    /// The sender's clock when it wrote the frame (seconds since the Unix
    /// epoch): the receiver maps the sender's seconds onto its own clock
    /// with it, so a tenant's window is the same length on every replica
    /// whatever their clocks say (to within a second).
    pub sent_unix_sec: u64,
    /// The entries, at most [`MAX_TENANTS_PER_FRAME`].
    pub entries: Vec<TenantEntry>,
}

/// One tenant's usage by the sender: what it holds in flight now, and
/// what it admitted in some of the last seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantEntry {
    /// The tenant's name (at most [`MAX_TENANT_NAME_BYTES`]).
    pub tenant: String,
    /// Requests of the tenant the sender has in flight.
    pub in_flight: u64,
    /// Seconds whose totals changed (or all live ones, for a new link),
    /// at most [`MAX_TENANT_SECONDS`].
    pub seconds: Vec<TenantSecond>,
}

/// What the sender admitted for one tenant in one second of its clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSecond {
    /// The second, since the Unix epoch on the sender's clock.
    pub unix_sec: u64,
    /// Requests admitted.
    pub requests: u64,
    /// Input tokens reserved (or settled).
    pub input_tokens: u64,
    /// Output tokens reserved (or settled).
    pub output_tokens: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::frames::{Frame, MAX_FRAME_BYTES, decode, encode};

    /// The tenants variant, appended after the packed one: variant 9.
    /// A full frame of the longest entries fits the frame limit.
    #[test]
    fn the_tenants_variant_is_appended_last_and_a_full_frame_fits() {
        let frame = Frame::Tenants(TenantsFrame {
            sent_unix_sec: 6,
            entries: vec![TenantEntry {
                tenant: "t".into(),
                in_flight: 2,
                seconds: vec![TenantSecond {
                    unix_sec: 5,
                    requests: 1,
                    input_tokens: 3,
                    output_tokens: 4,
                }],
            }],
        });
        let bytes = [2, 9, 6, 1, 1, b't', 2, 1, 5, 1, 3, 4];
        assert_eq!(encode(&frame).unwrap(), bytes);
        assert_eq!(decode(&bytes).unwrap(), frame);
        let second = TenantSecond {
            unix_sec: u64::MAX,
            requests: u64::MAX,
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
        };
        let full = Frame::Tenants(TenantsFrame {
            sent_unix_sec: u64::MAX,
            entries: vec![
                TenantEntry {
                    tenant: "n".repeat(MAX_TENANT_NAME_BYTES),
                    in_flight: u64::MAX,
                    seconds: vec![second; MAX_TENANT_SECONDS],
                };
                MAX_TENANTS_PER_FRAME
            ],
        });
        assert!(encode(&full).unwrap().len() < MAX_FRAME_BYTES);
    }
}
