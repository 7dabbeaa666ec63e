//! Helpers shared by the mock-engine integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use shoal_tests::client::{HttpClient, HttpResponse};
use shoal_tests::mock::{EngineConfig, EngineHandle, ModelSnapshot, spawn_engine};
pub use shoal_tests::workload::{chat, text};

/// Starts an engine on an ephemeral loopback port.
pub async fn start(cfg: EngineConfig) -> EngineHandle {
    spawn_engine(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// [`wait_for`](shoal_tests::wait::wait_for) on a plain condition: panics
/// if `f` is not true within `timeout`.
pub async fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) {
    shoal_tests::wait::wait_for("the condition", timeout, async || f().then_some(())).await;
}

/// Fetches `path` while the model state does not change, returning the
/// snapshot the body was rendered from.
pub async fn consistent<F, Fut>(h: &EngineHandle, fetch: F) -> (ModelSnapshot, HttpResponse)
where
    F: Fn() -> Fut,
    Fut: Future<Output = HttpResponse>,
{
    for _ in 0..100 {
        let before = h.snapshot();
        let resp = fetch().await;
        let after = h.snapshot();
        if before.version == after.version {
            return (after, resp);
        }
    }
    panic!("model state never held still");
}

/// `GET url` through a fresh client.
pub async fn get(client: &HttpClient, url: String) -> HttpResponse {
    client.get(&url).await.unwrap()
}

/// Samples of metric `name` in Prometheus text: (label block, raw value).
pub fn samples(text: &str, name: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = match series.find('{') {
                Some(i) => (&series[..i], &series[i..]),
                None => (series, ""),
            };
            (n == name).then(|| (labels.to_string(), value.to_string()))
        })
        .collect()
}

/// The single sample of `name`, parsed.
pub fn sample(text: &str, name: &str) -> f64 {
    let s = samples(text, name);
    assert_eq!(s.len(), 1, "{name} in:\n{text}");
    s[0].1.parse().unwrap()
}

/// Whether `text` declares `# TYPE name kind`.
pub fn has_type(text: &str, name: &str, kind: &str) -> bool {
    text.lines().any(|l| l == format!("# TYPE {name} {kind}"))
}

/// The sorted keys of a JSON object.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// Sorted owned strings.
pub fn sorted(k: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}
