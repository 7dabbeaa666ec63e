//! Client-connection flags: how long a client may take to send a request,
//! how many connections the replica keeps open, and HTTP/2's stream cap.
//! These are what keep slow or hostile clients from holding the replica.

use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the client-connection flags.
pub const FRONT_FLAGS: &str = "Client connections";

/// The limits the HTTP front is served with.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = FRONT_FLAGS)]
pub struct FrontConfig {
    /// Seconds a connection may go with no request in flight: to deliver
    /// its first request's complete headers from when it opened (whatever
    /// it sent: nothing, part of a head or of the HTTP/2 preface), and from
    /// its previous response's end (idle HTTP/1 keep-alive, HTTP/2 with no
    /// open stream).
    #[arg(long, env = "SHOAL_CLIENT_HEADER_TIMEOUT_SECS", default_value_t = defaults::CLIENT_HEADER_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub client_header_timeout_secs: u64,

    /// Seconds a request body may go without a byte arriving; then 408.
    #[arg(long, env = "SHOAL_CLIENT_BODY_TIMEOUT_SECS", default_value_t = defaults::CLIENT_BODY_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub client_body_timeout_secs: u64,

    /// Seconds a request body may take in all, from the end of its headers
    /// (however steadily it trickles in); then 408.
    #[arg(long, env = "SHOAL_CLIENT_BODY_DEADLINE_SECS", default_value_t = defaults::CLIENT_BODY_DEADLINE_SECS, value_parser = parsers::positive_u64)]
    pub client_body_deadline_secs: u64,

    /// Client connections open at once; at the cap the longest-idle one
    /// (one that never sent a request first) is closed to make room, and a
    /// newcomer is closed only when none is idle (0 = the open-file limit
    /// minus a reserve for engines, the mesh and logs: a quarter of it, at
    /// least 256).
    #[arg(long, env = "SHOAL_MAX_CLIENT_CONNECTIONS", default_value_t = defaults::MAX_CLIENT_CONNECTIONS)]
    pub max_client_connections: usize,

    /// Concurrent streams per HTTP/2 client connection.
    #[arg(long, env = "SHOAL_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = defaults::HTTP2_MAX_CONCURRENT_STREAMS, value_parser = parsers::positive_u32)]
    pub http2_max_concurrent_streams: u32,
}

impl FrontConfig {
    /// Time allowed for a request's headers.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.client_header_timeout_secs)
    }

    /// Time allowed between two pieces of a request body.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.client_body_timeout_secs)
    }

    /// Time allowed for a whole request body.
    pub fn body_deadline(&self) -> Duration {
        Duration::from_secs(self.client_body_deadline_secs)
    }

    /// The connection cap in effect for an open-file limit of `nofile`.
    pub fn connection_cap(&self, nofile: u64) -> usize {
        if self.max_client_connections > 0 {
            return self.max_client_connections;
        }
        let reserve = (nofile / 4).max(256);
        usize::try_from(nofile.saturating_sub(reserve).max(64)).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_cap_leaves_a_reserve_of_descriptors() {
        let config = FrontConfig {
            client_header_timeout_secs: 1,
            client_body_timeout_secs: 1,
            client_body_deadline_secs: 1,
            max_client_connections: 0,
            http2_max_concurrent_streams: 1,
        };
        assert_eq!(config.connection_cap(1024), 768);
        assert_eq!(config.connection_cap(65_536), 49_152);
        assert_eq!(
            config.connection_cap(256),
            64,
            "a floor, even on a tiny limit"
        );
        let fixed = FrontConfig {
            max_client_connections: 10,
            ..config
        };
        assert_eq!(fixed.connection_cap(1024), 10);
    }
}
