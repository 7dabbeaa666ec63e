//! Two meshed replicas in one process, on real loopback UDP/QUIC sockets:
//! a request held open through one shows up in the other's fleet view and
//! `/mesh/status`, and goes away when it ends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, eventually, mesh_flags, mesh_status as status};
use futures_util::StreamExt;

fn mesh_args(certs: &std::path::Path, name: &str, engine: &str, seed: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "--worker-urls",
        engine,
        "--worker-load-source",
        "none",
        "--policy",
        "round_robin",
    ]
    .map(String::from)
    .to_vec();
    args.extend(mesh_flags(certs, name, seed));
    args
}

async fn fleet_inflight(router: &Router, worker: &str) -> u64 {
    let status = status(router).await;
    status["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["worker"] == worker)
        .and_then(|w| w["inflight_requests"].as_u64())
        .unwrap_or(0)
}

#[tokio::test]
async fn bookings_on_one_replica_appear_in_the_others_fleet_view() {
    let certs = tempfile::tempdir().unwrap();
    shoal::cli::generate(certs.path(), &["a".into(), "b".into()], 1, false).unwrap();
    let engine = FakeEngine::start().await;
    engine.state.hang_after_first.store(true, Ordering::SeqCst);

    let a = Router::start(&mesh_args(certs.path(), "a", &engine.url, None)).await;
    let a_gossip = status(&a).await["gossip_addr"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Router::start(&mesh_args(certs.path(), "b", &engine.url, Some(&a_gossip))).await;

    let counted = |router: &Router| {
        let router_url = router.url("/mesh/status");
        async move {
            let status: serde_json::Value = reqwest::get(router_url)
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            status["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["counted"] == true))
        }
    };
    assert!(
        eventually(Duration::from_secs(15), || counted(&a)).await,
        "a counts b"
    );
    assert!(
        eventually(Duration::from_secs(15), || counted(&b)).await,
        "b counts a"
    );

    let response = a.chat(true).await;
    let mut body = response.bytes_stream();
    body.next().await.unwrap().unwrap();
    assert!(
        eventually(Duration::from_secs(2), || async {
            fleet_inflight(&b, &engine.url).await == 1
        })
        .await,
        "b sees a's open request"
    );
    let b_status = status(&b).await;
    let shares = &b_status["workers"][0]["shares"];
    assert!(
        shares
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["replica"].as_str().unwrap().starts_with("a#") && s["requests"] == 1),
        "{b_status}"
    );
    assert_eq!(
        b.worker(&engine.url).await["inflight_requests"],
        0,
        "b's own ledger is empty"
    );

    drop(body);
    assert!(
        eventually(Duration::from_secs(2), || async {
            fleet_inflight(&b, &engine.url).await == 0
        })
        .await,
        "released everywhere when the stream ends"
    );
}

#[tokio::test]
async fn mesh_status_is_404_without_the_mesh() {
    let router = Router::start(&common::base_args::<&str>(&[])).await;
    let response = reqwest::get(router.url("/mesh/status")).await.unwrap();
    assert_eq!(response.status(), 404);
    let json: serde_json::Value = response.json().await.unwrap();
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--mesh-peer-urls")
    );
}
