#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http_body_util::BodyExt;

use super::*;

#[tokio::test]
async fn off_admits_everything() {
    let gate = Admission::new(0, 0, Duration::from_secs(1));
    for _ in 0..1000 {
        assert!(gate.admit().await.unwrap().is_none());
    }
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test]
async fn full_queue_is_429_and_timeout_is_503() {
    let gate = Arc::new(Admission::new(2, 1, Duration::from_millis(100)));
    let a = gate.admit().await.unwrap().unwrap();
    let _b = gate.admit().await.unwrap().unwrap();
    assert_eq!(gate.in_flight(), 2);
    let queued = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit().await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(gate.waiting(), 1);
    assert_eq!(gate.admit().await.unwrap_err(), Rejection::QueueFull);
    assert_eq!(queued.await.unwrap(), Err(Rejection::QueueTimeout));
    assert_eq!(gate.waiting(), 0);
    // A freed slot goes to the next waiter.
    let next = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit().await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(a);
    assert_eq!(next.await.unwrap(), Ok(true));
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue() {
    let gate = Arc::new(Admission::new(1, 1, Duration::from_secs(30)));
    let _a = gate.admit().await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit().await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(gate.waiting(), 1);
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(gate.waiting(), 0);
}

#[tokio::test]
async fn rejections_are_openai_shaped_with_retry_after() {
    let gate = Admission::new(4, 8, Duration::from_secs(2));
    for (rejection, status, code) in [
        (Rejection::QueueFull, 429, "router_overloaded"),
        (Rejection::QueueTimeout, 503, "queue_timeout"),
    ] {
        let response = gate.response(rejection);
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], code);
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("overloaded")
        );
    }
}

#[tokio::test]
async fn the_permit_lives_as_long_as_the_body() {
    let gate = Admission::new(1, 0, Duration::from_secs(1));
    let permit = gate.admit().await.unwrap().unwrap();
    let response = AdmittedBody::wrap(Response::new(Body::from("hello")), held(permit));
    assert_eq!(gate.in_flight(), 1);
    assert_eq!(gate.admit().await.unwrap_err(), Rejection::QueueFull);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    assert_eq!(gate.in_flight(), 0);
    // Dropped unread: released too.
    let permit = gate.admit().await.unwrap().unwrap();
    drop(AdmittedBody::wrap(
        Response::new(Body::from("x")),
        held(permit),
    ));
    assert_eq!(gate.in_flight(), 0);
}

fn held(permit: Permit) -> Held {
    Held {
        permit: Some(permit),
        ticket: None,
    }
}
