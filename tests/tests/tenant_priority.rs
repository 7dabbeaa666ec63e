//! Priority classes in admission, with real `shoal` processes over an
//! in-process mock engine. This file proves that:
//!
//! - sheddable traffic is shed fleet-wide: once a tenant's streams on one
//!   replica hold every worker at `--sheddable-max-inflight`, another
//!   replica refuses that tenant's next request with 429 `shed` (and
//!   `Retry-After`) while a critical tenant's request still passes, and a
//!   sheddable tenant cannot escape by asking for `critical`;
//! - a critical request that finds the admission queue full takes the
//!   place of the sheddable one waiting there (which gets 429 `shed`), is
//!   shown queued in `GET /tenants`, is never displaced by a lower class,
//!   and is served when the slot frees;
//! - bad class and fairness headers are 400s naming the header.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tenants_support;

use std::time::Duration;

use serde_json::Value;
use shoal_tests::mock::{EngineConfig, Flavor};
use shoal_tests::wait::poll_until;
use shoal_tests::workload::text;
use tenants_support::answer::{Answer, ask, ask_with};
use tenants_support::load::Held;
use tenants_support::{Rig, run};

const CHAT_KEY: &str = "chat-key-00000001";
const BATCH_KEY: &str = "batch-key-0000001";

/// chat is critical; batch is sheddable.
const TENANTS: &str = r#"
[tenants.chat]
keys = ["chat-key-00000001"]
priority = "critical"
[tenants.batch]
keys = ["batch-key-0000001"]
priority = "sheddable"
"#;

/// Output tokens of a held stream: about 24 s at the mock's real-time
/// 12 ms a step, far longer than a test holds it.
const LONG: u64 = 2_000;

fn engine() -> EngineConfig {
    EngineConfig {
        flavor: Flavor::Sglang,
        ..EngineConfig::default()
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

/// `name`'s entry in replica `i`'s `GET /tenants`.
async fn tenant(rig: &Rig, i: usize, name: &str) -> Option<Value> {
    let v = rig.tenants(i).await?;
    v["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

/// Replica `i`'s `shoal_admission_rejected_total{reason="shed"}`.
async fn shed_count(rig: &Rig, i: usize) -> u64 {
    let url = format!("{}/metrics", rig.fleet.url(i));
    let text = rig.client.get(&url).await.unwrap().text();
    text.lines()
        .filter(|l| {
            l.starts_with("shoal_admission_rejected_total") && l.contains("reason=\"shed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn is_shed(a: &Answer) -> bool {
    a.status == 429 && a.error_field("code").as_deref() == Some("shed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_traffic_is_shed_fleet_wide_and_cannot_claim_critical() {
    run(Duration::from_secs(90), async {
        let extra = args(&["--sheddable-max-inflight", "2"]);
        let rig = Rig::start_with(2, true, TENANTS, &engine(), &extra).await;
        let (r0, r1) = (rig.fleet.url(0), rig.fleet.url(1));
        // Below the mark, sheddable traffic passes.
        let a = ask(&rig.client, &r1, Some(BATCH_KEY), &text(1, 64), 2).await;
        assert_eq!(a.status, 200, "{}", a.brief());
        let held = [
            Held::open(&rig.client, &r0, BATCH_KEY, &text(2, 64), LONG)
                .await
                .unwrap(),
            Held::open(&rig.client, &r0, BATCH_KEY, &text(3, 64), LONG)
                .await
                .unwrap(),
        ];
        // Replica 1 learns of replica 0's two streams over the mesh, and
        // sheds: even when the request asks to be critical.
        let critical = [("x-shoal-priority", "critical")];
        let mut last = None;
        let shed = poll_until(Duration::from_secs(10), async || {
            let a = ask_with(
                &rig.client,
                &r1,
                Some(BATCH_KEY),
                &critical,
                &text(4, 64),
                2,
            )
            .await;
            let shed = is_shed(&a);
            last = Some(a);
            shed
        })
        .await;
        let last = last.unwrap();
        assert!(shed, "never shed on replica 1: {}", last.brief());
        assert!(last.number("retry-after").is_some(), "{}", last.brief());
        assert!(
            last.error_field("message")
                .unwrap()
                .contains("--sheddable-max-inflight"),
            "{}",
            last.brief()
        );
        // The critical tenant is not held back by the mark.
        let a = ask(&rig.client, &r1, Some(CHAT_KEY), &text(5, 64), 2).await;
        assert_eq!(a.status, 200, "{}", a.brief());
        assert!(shed_count(&rig, 1).await >= 1);
        // The streams end (their clients go away): sheddable passes again.
        drop(held);
        let passed = poll_until(Duration::from_secs(10), async || {
            ask(&rig.client, &r1, Some(BATCH_KEY), &text(6, 64), 2)
                .await
                .status
                == 200
        })
        .await;
        assert!(
            passed,
            "sheddable traffic still refused after the streams ended"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_request_takes_a_sheddable_ones_place_in_a_full_queue() {
    run(Duration::from_secs(90), async {
        let extra = args(&["--max-concurrent-requests", "1", "--queue-size", "1"]);
        let rig = Rig::start_with(1, false, TENANTS, &engine(), &extra).await;
        let base = rig.fleet.url(0);
        // One stream holds the replica's only slot.
        let slot = Held::open(&rig.client, &base, CHAT_KEY, &text(1, 64), LONG)
            .await
            .unwrap();
        let batch = tokio::spawn({
            let (client, base) = (rig.client.clone(), base.clone());
            async move { ask(&client, &base, Some(BATCH_KEY), &text(2, 64), 2).await }
        });
        let queued = |name: &'static str, class: &'static str| {
            let rig = &rig;
            async move {
                tenant(rig, 0, name)
                    .await
                    .and_then(|t| t.pointer(&format!("/queued/{class}"))?.as_u64())
                    == Some(1)
            }
        };
        assert!(
            poll_until(Duration::from_secs(5), async || queued(
                "batch",
                "sheddable"
            )
            .await)
            .await,
            "the sheddable request never showed as queued: {:?}",
            tenant(&rig, 0, "batch").await
        );
        // A critical request finds the queue full and takes its place.
        let critical = tokio::spawn({
            let (client, base) = (rig.client.clone(), base.clone());
            async move { ask(&client, &base, Some(CHAT_KEY), &text(4, 64), 2).await }
        });
        let shed = tokio::time::timeout(Duration::from_secs(5), batch)
            .await
            .expect("the sheddable waiter was never answered")
            .unwrap();
        assert!(is_shed(&shed), "{}", shed.brief());
        assert!(
            poll_until(Duration::from_secs(5), async || queued("chat", "critical")
                .await)
            .await,
            "the critical request never showed as queued"
        );
        // A standard request (chat lowered to standard) finds the queue
        // full with no sheddable waiter left: refused, nobody shed.
        let standard = [("x-shoal-priority", "standard")];
        let a = ask_with(
            &rig.client,
            &base,
            Some(CHAT_KEY),
            &standard,
            &text(3, 64),
            2,
        )
        .await;
        assert_eq!(a.status, 429, "{}", a.brief());
        assert_eq!(a.error_field("code").as_deref(), Some("router_overloaded"));
        assert!(
            !critical.is_finished(),
            "the critical waiter was answered early"
        );
        drop(slot);
        let served = tokio::time::timeout(Duration::from_secs(10), critical)
            .await
            .expect("the critical request was never served")
            .unwrap();
        assert_eq!(served.status, 200, "{}", served.brief());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_class_and_fairness_headers_are_400s_naming_the_header() {
    run(Duration::from_secs(60), async {
        let rig = Rig::start_with(1, false, TENANTS, &engine(), &[]).await;
        let base = rig.fleet.url(0);
        let long = "x".repeat(200);
        for (name, value) in [
            ("x-shoal-priority", "urgent"),
            ("x-gateway-inference-fairness-id", long.as_str()),
        ] {
            let a = ask_with(
                &rig.client,
                &base,
                Some(CHAT_KEY),
                &[(name, value)],
                "hi",
                2,
            )
            .await;
            assert_eq!(a.status, 400, "{name}: {}", a.brief());
            assert_eq!(a.error_field("code").as_deref(), Some("invalid_header"));
            assert!(
                a.error_field("message").unwrap().contains(name),
                "{}",
                a.brief()
            );
        }
        // A good fairness id and a lowered class pass.
        let fine = [
            ("x-gateway-inference-fairness-id", "user-42"),
            ("x-shoal-priority", "sheddable"),
        ];
        let a = ask_with(&rig.client, &base, Some(CHAT_KEY), &fine, "hi", 2).await;
        assert_eq!(a.status, 200, "{}", a.brief());
    })
    .await;
}
