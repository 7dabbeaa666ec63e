#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http_body_util::BodyExt;

use super::*;

#[tokio::test]
async fn off_admits_everything() {
    let gate = Admission::new(0, 0, [Duration::from_secs(1); 3]);
    for _ in 0..1000 {
        assert!(gate.admit(&plain()).await.unwrap().is_none());
    }
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test]
async fn full_queue_is_429_and_timeout_is_503() {
    let gate = Arc::new(Admission::new(2, 1, [Duration::from_millis(100); 3]));
    let a = gate.admit(&plain()).await.unwrap().unwrap();
    let _b = gate.admit(&plain()).await.unwrap().unwrap();
    assert_eq!(gate.in_flight(), 2);
    let queued = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit(&plain()).await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(gate.waiting(), 1);
    assert_eq!(
        gate.admit(&plain()).await.unwrap_err(),
        Rejection::QueueFull
    );
    assert_eq!(queued.await.unwrap(), Err(Rejection::QueueTimeout));
    assert_eq!(gate.waiting(), 0);
    // A freed slot goes to the next waiter.
    let next = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit(&plain()).await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(a);
    assert_eq!(next.await.unwrap(), Ok(true));
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue() {
    let gate = Arc::new(Admission::new(1, 1, [Duration::from_secs(30); 3]));
    let _a = gate.admit(&plain()).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit(&plain()).await.map(|p| p.is_some()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(gate.waiting(), 1);
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(gate.waiting(), 0);
}

#[tokio::test]
async fn rejections_are_openai_shaped_with_retry_after() {
    let gate = Admission::new(4, 8, [Duration::from_secs(2); 3]);
    for (rejection, status, code, says) in [
        (Rejection::QueueFull, 429, "router_overloaded", "overloaded"),
        (Rejection::QueueTimeout, 503, "queue_timeout", "overloaded"),
        (Rejection::Shed, 429, "shed", "shed"),
    ] {
        let response = gate.response(rejection);
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], code);
        assert!(json["error"]["message"].as_str().unwrap().contains(says));
    }
}

#[tokio::test]
async fn the_permit_lives_as_long_as_the_body() {
    let gate = Admission::new(1, 0, [Duration::from_secs(1); 3]);
    let permit = gate.admit(&plain()).await.unwrap().unwrap();
    let response = AdmittedBody::wrap(Response::new(Body::from("hello")), held(permit));
    assert_eq!(gate.in_flight(), 1);
    assert_eq!(
        gate.admit(&plain()).await.unwrap_err(),
        Rejection::QueueFull
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    assert_eq!(gate.in_flight(), 0);
    // Dropped unread: released too.
    let permit = gate.admit(&plain()).await.unwrap().unwrap();
    drop(AdmittedBody::wrap(
        Response::new(Body::from("x")),
        held(permit),
    ));
    assert_eq!(gate.in_flight(), 0);
}

fn plain() -> Ask {
    Ask::plain(1)
}

fn ask(priority: Priority, flow: &str, cost: u64) -> Ask {
    Ask {
        priority,
        flow: Arc::from(flow),
        weight: 1,
        cost,
        share: None,
    }
}

/// Queues one request of `ask` on `gate` and returns its task.
async fn queue(
    gate: &Arc<Admission>,
    ask: Ask,
) -> tokio::task::JoinHandle<Result<Option<Permit>, Rejection>> {
    let task = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit(&ask).await }
    });
    // Let it reach the queue, so arrival order is the order written.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    task
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_highest_class_first() {
    let gate = Arc::new(Admission::new(1, 10, [Duration::from_secs(30); 3]));
    let slot = gate.admit(&plain()).await.unwrap().unwrap();
    let shed = queue(&gate, ask(Priority::Sheddable, "a", 1)).await;
    let standard = queue(&gate, ask(Priority::Standard, "a", 1)).await;
    let critical = queue(&gate, ask(Priority::Critical, "b", 1_000)).await;
    assert_eq!(gate.waiting(), 3);
    assert_eq!(gate.waiting_in(Priority::Critical), 1);
    drop(slot);
    let slot = critical.await.unwrap().unwrap().unwrap();
    assert!(!standard.is_finished() && !shed.is_finished());
    drop(slot);
    let slot = standard.await.unwrap().unwrap().unwrap();
    drop(slot);
    let slot = shed.await.unwrap().unwrap().unwrap();
    drop(slot);
    assert_eq!(gate.in_flight(), 0);
    assert_eq!(gate.waiting(), 0);
}

#[tokio::test]
async fn a_full_queue_sheds_a_sheddable_waiter_for_a_higher_class() {
    let gate = Arc::new(Admission::new(1, 1, [Duration::from_secs(30); 3]));
    let slot = gate.admit(&plain()).await.unwrap().unwrap();
    let shed = queue(&gate, ask(Priority::Sheddable, "batch", 1)).await;
    // Another sheddable request finds the queue full: refused, nobody shed.
    let late = gate.admit(&ask(Priority::Sheddable, "batch", 1)).await;
    assert_eq!(late.unwrap_err(), Rejection::QueueFull);
    let critical = queue(&gate, ask(Priority::Critical, "chat", 1)).await;
    assert_eq!(shed.await.unwrap().unwrap_err(), Rejection::Shed);
    // A standard request cannot take a critical one's place.
    let standard = gate.admit(&ask(Priority::Standard, "x", 1)).await;
    assert_eq!(standard.unwrap_err(), Rejection::QueueFull);
    drop(slot);
    assert!(critical.await.unwrap().unwrap().is_some());
}

/// Frees `slots` slots one at a time on `gate`, each going to one of the
/// always-backlogged flows `asks` (1 to 20 of each queued up front; the
/// served one queues its next request at once): how many slots each flow
/// got.
async fn serve_backlogged(
    gate: &Arc<Admission>,
    asks: &[(&'static str, Ask, usize)],
    slots: usize,
) -> std::collections::HashMap<&'static str, u64> {
    let mut slot = gate.admit(&plain()).await.unwrap().unwrap();
    let mut waiters = std::collections::VecDeque::new();
    for round in 0..asks.iter().map(|(_, _, n)| *n).max().unwrap_or(0) {
        for (flow, ask, n) in asks {
            if round < *n {
                waiters.push_back((*flow, ask.clone(), queue(gate, ask.clone()).await));
            }
        }
    }
    let mut served = std::collections::HashMap::new();
    for _ in 0..slots {
        drop(slot);
        // Exactly one waiter holds the slot now: find it.
        let mut next = None;
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            if let Some(at) = waiters.iter().position(|(_, _, t)| t.is_finished()) {
                next = waiters.remove(at);
                break;
            }
        }
        let (flow, ask, task) = next.expect("a waiter got the freed slot");
        *served.entry(flow).or_default() += 1;
        slot = task.await.unwrap().unwrap().unwrap();
        waiters.push_back((flow, ask.clone(), queue(gate, ask).await));
    }
    served
}

#[tokio::test]
async fn contended_slots_are_shared_by_token_work_between_flows() {
    // Flow "big" keeps 5x as many requests queued as "small"; both are
    // always backlogged. Each gets half the slots' token-work.
    let gate = Arc::new(Admission::new(1, 1000, [Duration::from_secs(30); 3]));
    let asks = [
        ("small", ask(Priority::Standard, "small", 10), 10),
        ("big", ask(Priority::Standard, "big", 10), 50),
    ];
    let served = serve_backlogged(&gate, &asks, 40).await;
    assert_eq!(served["small"], served["big"], "{served:?}");
}

#[tokio::test]
async fn weights_divide_contended_slots_through_the_gate() {
    // "a" (weight 3) and "b" (weight 1) always have waiters; with no
    // fleet share named (the per-replica scope) fair queueing alone
    // weighs them: a gets three slots for each of b's.
    let gate = Arc::new(Admission::new(1, 1000, [Duration::from_secs(30); 3]));
    let weighted = |flow: &str, weight| Ask {
        weight,
        ..ask(Priority::Standard, flow, 10)
    };
    let asks = [("a", weighted("a", 3), 10), ("b", weighted("b", 1), 10)];
    let served = serve_backlogged(&gate, &asks, 40).await;
    assert_eq!(served["a"], 30, "{served:?}");
    assert_eq!(served["b"], 10, "{served:?}");
}

#[tokio::test]
async fn each_class_waits_its_own_timeout() {
    let timeouts = [
        Duration::from_secs(30),
        Duration::from_secs(30),
        Duration::from_millis(50),
    ];
    let gate = Arc::new(Admission::new(1, 10, timeouts));
    let slot = gate.admit(&plain()).await.unwrap().unwrap();
    let shed = queue(&gate, ask(Priority::Sheddable, "a", 1)).await;
    let standard = queue(&gate, ask(Priority::Standard, "a", 1)).await;
    assert_eq!(shed.await.unwrap().unwrap_err(), Rejection::QueueTimeout);
    assert!(!standard.is_finished());
    drop(slot);
    assert!(standard.await.unwrap().unwrap().is_some());
}

fn held(permit: Permit) -> Held {
    Held {
        permit: Some(permit),
        ticket: None,
        strip: None,
    }
}
