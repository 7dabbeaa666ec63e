//! Shared harness for the router's integration tests: a real `shoal`
//! replica on an ephemeral loopback port, and small scriptable fake engines.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod fake_engine;
pub mod fake_objects;

use std::net::SocketAddr;
use std::time::Duration;

use shoal::app::Server;
use shoal::config::Config;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A running in-process replica; dropping it shuts it down.
pub struct Router {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Router {
    /// Starts a replica with these flags (besides host/port).
    pub async fn start(args: &[String]) -> Router {
        let mut argv = vec!["shoal".to_string()];
        argv.extend(args.iter().cloned());
        let config = Config::load_from(argv).expect("valid test config");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server::start(config, listener)
            .await
            .expect("replica starts");
        let addr = server.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = server
                .serve(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Router {
            addr,
            shutdown: Some(tx),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `GET /metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `POST` a JSON body to `path`.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/chat/completions` with [`chat_body`].
    pub async fn chat(&self, stream: bool) -> reqwest::Response {
        self.post_json("/v1/chat/completions", &chat_body(stream))
            .await
    }

    /// `GET /workers` as JSON.
    pub async fn workers(&self) -> serde_json::Value {
        reqwest::get(self.url("/workers"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The `GET /workers` entry of one worker.
    pub async fn worker(&self, url: &str) -> serde_json::Value {
        let all = self.workers().await;
        all.as_array()
            .unwrap()
            .iter()
            .find(|w| w["url"] == url)
            .cloned()
            .unwrap_or_else(|| panic!("worker {url} not listed in {all}"))
    }

    /// Whether, within `within`, this replica comes to hold no request and
    /// no token-work in flight on any of `urls` (every booking released).
    pub async fn released(&self, urls: &[&str], within: Duration) -> bool {
        eventually(within, || async {
            for url in urls {
                let entry = self.worker(url).await;
                if entry["inflight_requests"] != 0 || entry["inflight_tokens"] != 0 {
                    return false;
                }
            }
            true
        })
        .await
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Flags shared by most tests: fast checks, no load polling,
/// round-robin routing (these tests count requests per worker), and admin
/// writes from loopback (the tests' client is local).
pub fn base_args<S: AsRef<str>>(workers: &[S]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--allow-loopback-admin-writes".into(),
        "--policy".into(),
        "round_robin".into(),
        "--worker-load-source".into(),
        "none".into(),
        "--retry-initial-backoff-ms".into(),
        "1".into(),
        "--retry-max-backoff-ms".into(),
        "5".into(),
    ];
    if !workers.is_empty() {
        args.push("--worker-urls".into());
        args.extend(workers.iter().map(|w| w.as_ref().to_string()));
    }
    args
}

/// Polls `check` until it returns true or `within` passes (the shared
/// wait, `shoal_tests::wait::poll_until`).
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    shoal_tests::wait::poll_until(within, async || check().await).await
}

/// A chat request body.
pub fn chat_body(stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "test-model",
        "stream": stream,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello to the router tests please"}]
    })
}

/// The flags that mesh replica `name` (certificates in `certs`, made for
/// that name) on loopback, seeded from `seed`'s gossip address if any.
pub fn mesh_flags(certs: &std::path::Path, name: &str, seed: Option<&str>) -> Vec<String> {
    let file = |f: &str| certs.join(f).to_str().unwrap().to_string();
    let mut args: Vec<String> = [
        "--mesh-host",
        "127.0.0.1",
        "--mesh-port",
        "0",
        "--mesh-quic-port",
        "0",
        "--mesh-name",
        name,
        "--mesh-cluster-id",
        "test",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--mesh-tls-ca".into(), file("ca.pem")]);
    args.extend(["--mesh-tls-cert".into(), file(&format!("{name}.pem"))]);
    args.extend(["--mesh-tls-key".into(), file(&format!("{name}-key.pem"))]);
    if let Some(seed) = seed {
        args.extend(["--mesh-peer-urls".into(), seed.to_string()]);
    }
    args
}

/// `GET /mesh/status` as JSON.
pub async fn mesh_status(router: &Router) -> serde_json::Value {
    reqwest::get(router.url("/mesh/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
