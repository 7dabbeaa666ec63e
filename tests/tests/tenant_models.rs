//! Per-model tenant limits, fleet-wide, with real meshed `shoal`
//! processes over an in-process mock engine. This file proves that a
//! tenant's limit on one model (`[tenants.NAME.models."MODEL"]`) is
//! enforced across the fleet on top of the tenant's own: the model's
//! allowance is spent through two replicas, the next request for it is
//! refused on either with 429 naming the model, and both replicas'
//! `GET /tenants` show the model's fleet-wide usage; refused requests and
//! a request no engine answered (Shoal's own 404) cost the tenant nothing.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tenants_support;

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};
use shoal_tests::mock::DEFAULT_MODEL;
use shoal_tests::wait::poll_until;
use shoal_tests::workload::text;
use tenants_support::answer::{ask, refusal};
use tenants_support::{ACME_KEY, Rig, run};

/// Requests the model's allowance holds per 60 s window.
const MODEL_ALLOWANCE: u64 = 3;

/// acme's usage of the model in replica `i`'s `GET /tenants`.
async fn model_requests(rig: &Rig, i: usize) -> Option<u64> {
    let v = rig.tenants(i).await?;
    let acme = v["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == "acme")?;
    let model = acme["models"]
        .as_array()?
        .iter()
        .find(|m| m["model"] == DEFAULT_MODEL)?;
    assert_eq!(model["limits"]["requests"], MODEL_ALLOWANCE, "{acme}");
    model.pointer("/used/requests").and_then(Value::as_u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_limit_holds_across_the_fleet_on_top_of_the_tenants() {
    run(Duration::from_secs(60), async {
        let tenants = format!(
            "[tenants.acme]\nkeys = [\"{ACME_KEY}\"]\nrequests_per_minute = 600\n\
             [tenants.acme.models.\"{DEFAULT_MODEL}\"]\nrequests_per_minute = {MODEL_ALLOWANCE}\n"
        );
        let rig = Rig::start(2, true, &tenants).await;
        let urls = rig.urls();
        for k in 0..MODEL_ALLOWANCE {
            let base = &urls[k as usize % 2];
            let a = ask(&rig.client, base, Some(ACME_KEY), &text(k, 64), 2).await;
            assert_eq!(a.status, 200, "{}", a.brief());
            assert_eq!(
                a.number("x-ratelimit-limit-requests"),
                Some(MODEL_ALLOWANCE)
            );
            // Let the admission reach the other replica before the next.
            let seen = poll_until(Duration::from_secs(5), async || {
                model_requests(&rig, 0).await == Some(k + 1)
                    && model_requests(&rig, 1).await == Some(k + 1)
            })
            .await;
            assert!(
                seen,
                "both replicas should count {} requests of the model",
                k + 1
            );
        }
        for (r, base) in urls.iter().enumerate() {
            let a = ask(
                &rig.client,
                base,
                Some(ACME_KEY),
                &text(100 + r as u64, 64),
                2,
            )
            .await;
            refusal(&a, "tenant_rate_limited", 60).unwrap_or_else(|e| panic!("replica {r}: {e}"));
            let message = a.error_field("message").unwrap_or_default();
            assert!(message.contains(DEFAULT_MODEL), "replica {r}: {message}");
        }
        // A request no engine answers (no worker serves its model) costs
        // the tenant nothing: Shoal's own 404 refunds it.
        let body = json!({
            "model": "nobody/serves-this",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        });
        let auth = format!("Bearer {ACME_KEY}");
        let url = format!("{}/v1/chat/completions", urls[0]);
        let resp = rig
            .client
            .send(
                Method::POST,
                &url,
                &[("authorization", auth.as_str())],
                Some(Bytes::from(body.to_string())),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let tenant_requests = async |i| {
            let v = rig.tenants(i).await?;
            let acme = v["tenants"]
                .as_array()?
                .iter()
                .find(|t| t["name"] == "acme")?;
            acme.pointer("/used/requests").and_then(Value::as_u64)
        };
        // Refusals refund too: only the model's three admissions count.
        let settled = poll_until(Duration::from_secs(5), async || {
            tenant_requests(0).await == Some(MODEL_ALLOWANCE)
                && tenant_requests(1).await == Some(MODEL_ALLOWANCE)
        })
        .await;
        assert!(settled, "acme's requests: {:?}", tenant_requests(0).await);
    })
    .await;
}
