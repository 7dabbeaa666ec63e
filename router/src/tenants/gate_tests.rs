//! `TenantGate` over a local book: per-model limits on top of a tenant's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const FILE: &str = r#"
[tenants.acme]
keys = ["acme-key-0001"]
requests_per_minute = 600
[tenants.acme.models.big]
requests_per_minute = 2
"#;

fn gate() -> (TenantGate, Arc<TenantBook>, Arc<Tenant>) {
    let spec = file::parse(FILE).unwrap();
    let book = Arc::new(TenantBook::local());
    let gate = TenantGate::new(&spec, book.clone());
    let tenant = gate.tenant_of(b"acme-key-0001").unwrap();
    (gate, book, tenant)
}

fn header<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a str> {
    // The last one wins, as `add_headers` inserts them in order.
    headers
        .iter()
        .rev()
        .find(|(n, _)| n.as_str() == name)
        .and_then(|(_, v)| v.to_str().ok())
}

#[test]
fn a_model_limit_binds_that_model_only_and_a_refusal_refunds_the_tenant() {
    let (gate, book, acme) = gate();
    let mut held = Vec::new();
    for _ in 0..2 {
        match gate.admit(&acme, Some("big"), 10, Some(10)) {
            Decision::Admitted(mut ticket, headers) => {
                assert_eq!(header(&headers, "x-ratelimit-limit-requests"), Some("2"));
                ticket.serve();
                held.push(ticket);
            }
            Decision::Refused(breach, _) => panic!("{}", breach.message),
        }
    }
    match gate.admit(&acme, Some("big"), 10, Some(10)) {
        Decision::Refused(breach, headers) => {
            assert_eq!(breach.reason, Reason::RateLimited);
            assert!(breach.message.contains("model `big`"), "{}", breach.message);
            assert_eq!(
                header(&headers, "x-ratelimit-remaining-requests"),
                Some("0")
            );
        }
        Decision::Admitted(..) => panic!("the model's third request passed"),
    }
    // Other models and requests naming none are held to the tenant's own.
    for model in [Some("small"), None] {
        match gate.admit(&acme, model, 10, Some(10)) {
            Decision::Admitted(mut ticket, headers) => {
                assert_eq!(header(&headers, "x-ratelimit-limit-requests"), Some("600"));
                ticket.serve();
                held.push(ticket);
            }
            Decision::Refused(breach, _) => panic!("{model:?}: {}", breach.message),
        }
    }
    let now = unix_secs();
    // Two for big, one small, one unnamed: the refused one was refunded.
    assert_eq!(book.window("acme", now).total().requests, 4);
    let scope = &acme.models[&Arc::from("big")].scope;
    assert_eq!(book.window(scope, now).total().requests, 2);
    assert_eq!(book.window(scope, now).in_flight, 2);
    drop(held);
    assert_eq!(book.window(scope, now).in_flight, 0);
    assert_eq!(book.window("acme", now).in_flight, 0);
    let status = gate.status(&[]);
    let models = &status.tenants[0].models;
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].model, "big");
    assert_eq!(models[0].used.requests, 2);
}

#[test]
fn an_unserved_model_request_is_refunded_in_both_places() {
    let (gate, book, acme) = gate();
    match gate.admit(&acme, Some("big"), 10, Some(10)) {
        Decision::Admitted(ticket, _) => drop(ticket),
        Decision::Refused(breach, _) => panic!("{}", breach.message),
    }
    let now = unix_secs();
    let scope = &acme.models[&Arc::from("big")].scope;
    assert_eq!(book.window("acme", now).total().requests, 0);
    assert_eq!(book.window(scope, now).total().requests, 0);
}
