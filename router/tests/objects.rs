//! Stored objects (Responses API responses, files, batches) through real
//! replicas on loopback: a request about an object reaches the engine that
//! created it, whichever replica it arrives at (the mesh shares where each
//! object lives), and an object no replica remembers is located or
//! refused as `docs/routing.md` ("Stored objects") says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, base_args, eventually, mesh_flags, mesh_status};
use serde_json::json;

async fn object_engine() -> FakeEngine {
    let engine = FakeEngine::start().await;
    engine.state.objects.enabled.store(true, Ordering::SeqCst);
    engine
}

fn mesh_args(
    certs: &std::path::Path,
    name: &str,
    engines: &[&str],
    seed: Option<&str>,
) -> Vec<String> {
    let mut args = base_args(engines);
    args.extend(mesh_flags(certs, name, seed));
    args
}

async fn counts_a_peer(router: &Router) -> bool {
    mesh_status(router).await["members"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["counted"] == true))
}

/// The value of an unlabelled counter in `/metrics` (0 when absent).
async fn counter(router: &Router, name: &str) -> u64 {
    let metrics = router.metrics().await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Creates a response through `router`; returns its id (read from the
/// JSON answer, or from the `response.created` event when streamed).
async fn create_response(router: &Router, stream: bool, previous: Option<&str>) -> String {
    let mut body = json!({"model": "m", "input": "hello", "stream": stream});
    if let Some(previous) = previous {
        body["previous_response_id"] = json!(previous);
    }
    let response = router.post_json("/v1/responses", &body).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let json_text = match stream {
        false => text.as_str(),
        true => text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap(),
    };
    let value: serde_json::Value = serde_json::from_str(json_text).unwrap();
    let id = if stream {
        &value["response"]["id"]
    } else {
        &value["id"]
    };
    id.as_str().unwrap().to_string()
}

/// The engines' `about` counters: requests about an object by id.
fn about(engines: &[&FakeEngine]) -> Vec<usize> {
    engines
        .iter()
        .map(|e| e.state.objects.about.load(Ordering::SeqCst))
        .collect()
}

#[tokio::test]
async fn objects_created_through_one_replica_are_served_by_their_engine_through_another() {
    let certs = tempfile::tempdir().unwrap();
    shoal::cli::generate(certs.path(), &["a".into(), "b".into()], 1, false).unwrap();
    let (e1, e2) = (object_engine().await, object_engine().await);
    let engines = [e1.url.as_str(), e2.url.as_str()];
    let a = Router::start(&mesh_args(certs.path(), "a", &engines, None)).await;
    let a_gossip = mesh_status(&a).await["gossip_addr"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Router::start(&mesh_args(certs.path(), "b", &engines, Some(&a_gossip))).await;
    assert!(eventually(Duration::from_secs(15), || counts_a_peer(&a)).await);
    assert!(eventually(Duration::from_secs(15), || counts_a_peer(&b)).await);

    // Four responses through a, two streamed: round robin spreads them.
    let mut ids = Vec::new();
    for stream in [false, true, false, true] {
        ids.push(create_response(&a, stream, None).await);
    }
    let held_by_e1 = ids.iter().filter(|id| e1.state.objects.holds(id)).count();
    assert!(
        held_by_e1 > 0 && held_by_e1 < ids.len(),
        "both engines hold some"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            counter(&b, "shoal_mesh_objects_received_total").await >= ids.len() as u64
        })
        .await,
        "b hears where they live"
    );

    // Retrieved through b, each from its engine and no other.
    for id in &ids {
        let response = reqwest::get(b.url(&format!("/v1/responses/{id}")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{id}");
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["id"], id.as_str());
    }
    assert_eq!(
        about(&[&e1, &e2]),
        [held_by_e1, ids.len() - held_by_e1],
        "no engine was asked about another's response"
    );

    // A follow-up through b goes to the engine holding the previous
    // response (the fake engine refuses an unknown previous_response_id).
    let mut follow_ups = Vec::new();
    for id in &ids {
        let next = create_response(&b, false, Some(id)).await;
        let holder_of_previous = e1.state.objects.holds(id);
        assert_eq!(
            e1.state.objects.holds(&next),
            holder_of_previous,
            "{id} -> {next}"
        );
        follow_ups.push(next);
    }
    let built_on = |e: &FakeEngine| e.state.objects.built_on.load(Ordering::SeqCst);
    assert_eq!(
        (built_on(&e1), built_on(&e2)),
        (held_by_e1, ids.len() - held_by_e1)
    );

    // Files and a batch over each: the batch goes to the file's engine.
    let mut files = Vec::new();
    for _ in 0..2 {
        let response = reqwest::Client::new()
            .post(a.url("/v1/files"))
            .header("content-type", "application/octet-stream")
            .body("{\"custom_id\":\"1\"}\n")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let json: serde_json::Value = response.json().await.unwrap();
        files.push(json["id"].as_str().unwrap().to_string());
    }
    let expected = (ids.len() + files.len()) as u64;
    assert!(
        eventually(Duration::from_secs(10), || async {
            counter(&b, "shoal_mesh_objects_received_total").await >= expected
        })
        .await
    );
    for file in &files {
        let response = b
            .post_json(
                "/v1/batches",
                &json!({"input_file_id": file, "endpoint": "/v1/chat/completions"}),
            )
            .await;
        assert_eq!(response.status(), 200, "{file}");
        let batch: serde_json::Value = response.json().await.unwrap();
        let batch = batch["id"].as_str().unwrap().to_string();
        assert_eq!(e1.state.objects.holds(&batch), e1.state.objects.holds(file));
        let response = reqwest::get(a.url(&format!("/v1/batches/{batch}")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{batch} through a");
        let response = reqwest::get(b.url(&format!("/v1/files/{file}/content")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{file} content through b");
    }
}

#[tokio::test]
async fn an_unknown_object_is_located_by_asking_and_a_missing_one_is_404() {
    let (e1, e2) = (object_engine().await, object_engine().await);
    let router = Router::start(&base_args(&[&e1.url, &e2.url])).await;

    // Known to no worker: a read asks each once and passes the 404 on.
    let response = reqwest::get(router.url("/v1/responses/resp_nowhere"))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(about(&[&e1, &e2]), [1, 1], "each worker asked once");

    // A cancel is located with a GET first; nowhere: the router's 404.
    let response = router
        .post_json("/v1/responses/resp_nowhere/cancel", &json!({}))
        .await;
    assert_eq!(response.status(), 404);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], "object_not_found", "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("resp_nowhere") && message.contains("asked 2 worker(s)"),
        "{message}"
    );

    // A follow-up of an unknown response is not generated anywhere.
    let created = |e: &FakeEngine| e.state.objects.created.load(Ordering::SeqCst);
    let response = router
        .post_json(
            "/v1/responses",
            &json!({"model": "m", "input": "x", "previous_response_id": "resp_gone"}),
        )
        .await;
    assert_eq!(response.status(), 404);
    assert_eq!((created(&e1), created(&e2)), (0, 0));

    // An object this replica never saw created is found by asking, then
    // remembered: the next request goes straight to its engine.
    let direct: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/responses", e2.url))
        .json(&json!({"input": "made without the router"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = direct["id"].as_str().unwrap();
    let response = reqwest::get(router.url(&format!("/v1/responses/{id}")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let e1_asked = about(&[&e1])[0];
    for _ in 0..3 {
        let response = reqwest::get(router.url(&format!("/v1/responses/{id}")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(about(&[&e1])[0], e1_asked, "e1 is not asked again");

    // An id the router cannot route by is refused by name.
    let response = reqwest::get(router.url("/v1/files/bad%20id"))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], "invalid_object_id", "{json}");
}

#[tokio::test]
async fn the_holder_being_unavailable_is_503_not_another_worker() {
    let (e1, e2) = (object_engine().await, object_engine().await);
    let mut args = base_args(&[&e1.url, &e2.url]);
    args.extend(
        [
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
        ]
        .map(String::from),
    );
    let router = Router::start(&args).await;
    let id = create_response(&router, false, None).await;
    let (holder, other) = match e1.state.objects.holds(&id) {
        true => (&e1, &e2),
        false => (&e2, &e1),
    };
    holder.state.unhealthy.store(true, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(6), || async {
            router.worker(&holder.url).await["healthy"] == json!(false)
        })
        .await
    );
    let asked = about(&[other])[0];
    let response = reqwest::get(router.url(&format!("/v1/responses/{id}")))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], "object_worker_unavailable", "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&id) && message.contains(&holder.url) && message.contains("health"),
        "{message}"
    );
    assert_eq!(about(&[other])[0], asked, "the other worker was not asked");
}

#[tokio::test]
async fn a_refused_request_about_an_object_is_retried_on_its_holder_only() {
    let (e1, e2) = (object_engine().await, object_engine().await);
    let mut args = base_args(&[&e1.url, &e2.url]);
    args.push("--disable-circuit-breaker".into());
    let router = Router::start(&args).await;
    let id = create_response(&router, false, None).await;
    let (holder, other) = match e1.state.objects.holds(&id) {
        true => (&e1, &e2),
        false => (&e2, &e1),
    };
    holder.state.objects.refuse.store(2, Ordering::SeqCst);
    let response = router
        .post_json(&format!("/v1/responses/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(response.status(), 200, "503 twice, then served");
    assert_eq!(
        about(&[holder, other]),
        [3, 0],
        "every attempt went to the holder"
    );
}
