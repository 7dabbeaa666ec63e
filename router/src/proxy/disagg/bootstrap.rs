//! Where each SGLang prefill worker's bootstrap server listens.
//!
//! SGLang answers `GET /server_info` with `disaggregation_bootstrap_port`
//! (its `--disaggregation-bootstrap-port`), so Shoal asks each prefill
//! worker once instead of making the operator repeat every port; a worker
//! that does not say is given `--pd-bootstrap-port` (SGLang's default,
//! 8998), and asked again after a while.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::upstream::{self, HttpClient};

/// How long an answer (or the fallback after no answer) is kept.
const KEEP_ANSWER: Duration = Duration::from_secs(300);
const KEEP_FALLBACK: Duration = Duration::from_secs(30);
/// Deadline of one `GET /server_info`.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `/server_info` answer read.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Bootstrap ports by prefill worker URL.
#[derive(Debug)]
pub struct BootstrapPorts {
    fallback: u16,
    known: Mutex<HashMap<String, (u16, Instant)>>,
}

impl BootstrapPorts {
    /// No port known yet; `fallback` for workers that do not say.
    pub fn new(fallback: u16) -> Self {
        Self {
            fallback,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The bootstrap port of the prefill worker at `url`.
    pub async fn port(&self, url: &str, client: &HttpClient) -> u16 {
        let now = Instant::now();
        if let Some((port, until)) = self.table().get(url).copied()
            && until > now
        {
            return port;
        }
        let (port, keep) = match ask(url, client).await {
            Some(port) => (port, KEEP_ANSWER),
            None => (self.fallback, KEEP_FALLBACK),
        };
        self.table().insert(url.to_string(), (port, now + keep));
        port
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u16, Instant)>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The port `url`'s `GET /server_info` names, if it answers with one.
async fn ask(url: &str, client: &HttpClient) -> Option<u16> {
    let (status, body) = upstream::get(client, url, "/server_info", ASK_TIMEOUT, MAX_ANSWER_BYTES)
        .await
        .ok()?;
    if !status.is_success() {
        return None;
    }
    port_in(&body)
}

/// `disaggregation_bootstrap_port` of a `/server_info` answer.
fn port_in(body: &[u8]) -> Option<u16> {
    let info: serde_json::Value = serde_json::from_slice(body).ok()?;
    let port = info.get("disaggregation_bootstrap_port")?.as_u64()?;
    u16::try_from(port).ok().filter(|p| *p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_server_info_and_nonsense_is_refused() {
        assert_eq!(
            port_in(br#"{"disaggregation_bootstrap_port":9001}"#),
            Some(9001)
        );
        assert_eq!(port_in(br#"{"disaggregation_bootstrap_port":70000}"#), None);
        assert_eq!(
            port_in(br#"{"disaggregation_bootstrap_port":"9001"}"#),
            None
        );
        assert_eq!(port_in(br#"{"disaggregation_mode":"prefill"}"#), None);
        assert_eq!(port_in(b"not json"), None);
    }
}
