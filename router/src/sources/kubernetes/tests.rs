//! EndpointSlices to worker URLs: readiness, ports, address families,
//! duplicates and model labels, from the JSON the API server sends.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;

fn slice(json: serde_json::Value) -> Arc<EndpointSlice> {
    Arc::new(serde_json::from_value(json).unwrap())
}

fn endpoint(ip: &str, ready: Option<bool>, terminating: bool) -> serde_json::Value {
    let mut conditions = serde_json::json!({"terminating": terminating, "serving": true});
    if let Some(r) = ready {
        conditions["ready"] = r.into();
    }
    serde_json::json!({"addresses": [ip], "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": format!("pod-{ip}")}})
}

fn vllm_slice(name: &str, endpoints: Vec<serde_json::Value>) -> Arc<EndpointSlice> {
    slice(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "llm", "resourceVersion": "7",
            "labels": {"kubernetes.io/service-name": "vllm", "shoal.io/model": "llama"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"},
                  {"name": "metrics", "port": 9000, "protocol": "TCP"}]
    }))
}

#[test]
fn only_ready_endpoints_become_workers_and_duplicates_collapse() {
    let slices = [
        vllm_slice(
            "vllm-a",
            vec![
                endpoint("10.0.0.1", Some(true), false),
                endpoint("10.0.0.2", Some(false), false),
                endpoint("10.0.0.3", Some(false), true),
                endpoint("10.0.0.4", None, false),
            ],
        ),
        vllm_slice("vllm-b", vec![endpoint("10.0.0.1", Some(true), false)]),
    ];
    let found = ready_endpoints(
        &slices,
        &PortChoice::Named("http".into()),
        None,
        Some("shoal.io/model"),
    )
    .endpoints;
    let urls: Vec<&str> = found.keys().map(String::as_str).collect();
    assert_eq!(
        urls,
        ["http://10.0.0.1:8000", "http://10.0.0.4:8000"],
        "not-ready and terminating left out; a missing ready means ready"
    );
    assert!(found.values().all(|m| m.as_deref() == Some("llama")));
}

#[test]
fn the_port_is_chosen_by_number_name_or_as_the_only_one() {
    let slices = [vllm_slice(
        "a",
        vec![endpoint("10.0.0.1", Some(true), false)],
    )];
    let url = |choice: PortChoice| {
        ready_endpoints(&slices, &choice, None, None)
            .endpoints
            .into_keys()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        url(PortChoice::parse(Some("metrics"))),
        ["http://10.0.0.1:9000"]
    );
    assert_eq!(
        url(PortChoice::parse(Some("8080"))),
        ["http://10.0.0.1:8080"]
    );
    assert!(
        url(PortChoice::parse(Some("grpc"))).is_empty(),
        "no such port name"
    );
    assert!(
        url(PortChoice::parse(None)).is_empty(),
        "two ports: which one is ambiguous"
    );
    let single = [slice(serde_json::json!({
        "metadata": {"name": "s", "resourceVersion": "1"}, "addressType": "IPv6",
        "endpoints": [endpoint("fd00::1", Some(true), false)],
        "ports": [{"port": 8000}]
    }))];
    let found = ready_endpoints(&single, &PortChoice::Only, None, Some("shoal.io/model")).endpoints;
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        [("http://[fd00::1]:8000".to_string(), None)]
    );
}

#[test]
fn fqdn_slices_empty_slices_and_slices_without_ports_are_skipped() {
    let slices = [
        slice(
            serde_json::json!({"metadata": {"name": "f"}, "addressType": "FQDN",
            "endpoints": [{"addresses": ["engine.example"]}], "ports": [{"port": 80}]}),
        ),
        slice(
            serde_json::json!({"metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": null}),
        ),
        slice(
            serde_json::json!({"metadata": {"name": "p"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.9"]}], "ports": [{"name": "all"}]}),
        ),
    ];
    let found = ready_endpoints(&slices, &PortChoice::Only, None, None);
    assert!(found.endpoints.is_empty());
    assert_eq!(
        found.skipped,
        BTreeMap::from([
            (Skip::NoPort, vec!["e".to_string(), "p".to_string()]),
            (Skip::AddressType, vec!["f".to_string()]),
        ]),
        "every slice that gave nothing is named with its reason"
    );
    let two_ports = [vllm_slice(
        "two",
        vec![endpoint("10.0.0.1", Some(true), false)],
    )];
    let found = ready_endpoints(&two_ports, &PortChoice::Only, None, None);
    assert_eq!(
        found.skipped,
        BTreeMap::from([(Skip::AmbiguousPort, vec!["two".to_string()])])
    );
}

#[test]
fn with_publish_not_ready_addresses_serving_and_terminating_decide() {
    // Such a Service reports every endpoint ready; `serving` carries the
    // pod's readiness and `terminating` its shutdown.
    let conditions = |serving: bool, terminating: bool| {
        serde_json::json!({"addresses": [format!("10.0.1.{}", 1 + serving as u8 + 2 * terminating as u8)],
            "conditions": {"ready": true, "serving": serving, "terminating": terminating}})
    };
    let slices = [vllm_slice(
        "pnra",
        vec![
            conditions(true, false),
            conditions(false, false),
            conditions(true, true),
        ],
    )];
    let found = ready_endpoints(&slices, &PortChoice::Number(8000), None, None).endpoints;
    assert_eq!(
        found.into_keys().collect::<Vec<_>>(),
        ["http://10.0.1.2:8000"],
        "only the serving, non-terminating endpoint"
    );
}

#[test]
fn https_comes_from_the_port_or_the_flag() {
    let tls = [slice(serde_json::json!({
        "metadata": {"name": "t"}, "addressType": "IPv4",
        "endpoints": [endpoint("10.0.2.1", Some(true), false)],
        "ports": [{"name": "api", "port": 8443, "appProtocol": "https"}]
    }))];
    let url = |scheme| {
        ready_endpoints(&tls, &PortChoice::Only, scheme, None)
            .endpoints
            .into_keys()
            .collect::<Vec<_>>()
    };
    assert_eq!(url(None), ["https://10.0.2.1:8443"], "appProtocol https");
    assert_eq!(url(Some(DiscoveryScheme::Http)), ["http://10.0.2.1:8443"]);
    let plain = [vllm_slice(
        "p",
        vec![endpoint("10.0.2.2", Some(true), false)],
    )];
    let forced = ready_endpoints(
        &plain,
        &PortChoice::Named("http".into()),
        Some(DiscoveryScheme::Https),
        None,
    );
    assert_eq!(
        forced.endpoints.into_keys().collect::<Vec<_>>(),
        ["https://10.0.2.2:8000"]
    );
}

#[test]
fn named_kv_event_ports_become_each_endpoints_event_sockets() {
    let slices = [slice(serde_json::json!({
        "metadata": {"name": "kv", "resourceVersion": "3"}, "addressType": "IPv4",
        "endpoints": [endpoint("10.0.0.1", Some(true), false), endpoint("10.0.0.2", Some(true), false)],
        "ports": [{"name": "http", "port": 8000},
                  {"name": "kv-events", "port": 5557},
                  {"name": "kv-events-replay", "port": 5558}]
    }))];
    let found = ready_endpoints(&slices, &PortChoice::Named("http".into()), None, None);
    assert_eq!(
        found.kv_events.get("http://10.0.0.2:8000"),
        Some(&KvEventSockets {
            events: "tcp://10.0.0.2:5557".into(),
            replay: Some("tcp://10.0.0.2:5558".into()),
        })
    );
    assert_eq!(found.kv_events.len(), 2);
    // Beside the KV-event ports, the HTTP port is the slice's only one.
    let only = ready_endpoints(&slices, &PortChoice::Only, None, None);
    assert!(only.skipped.is_empty(), "{:?}", only.skipped);
    assert_eq!(only.kv_events.len(), 2);
    // Without the named ports, no sockets.
    let plain = [vllm_slice(
        "plain",
        vec![endpoint("10.0.0.3", Some(true), false)],
    )];
    let found = ready_endpoints(&plain, &PortChoice::Named("http".into()), None, None);
    assert!(found.kv_events.is_empty() && found.endpoints.len() == 1);
}

#[test]
fn a_role_label_of_prefill_puts_a_slices_endpoints_in_the_prefill_pool() {
    let with_role = |name: &str, role: &str, address: &str| {
        slice(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "llm", "resourceVersion": "7",
                "labels": {"kubernetes.io/service-name": name, "shoal.io/pd-role": role}},
            "addressType": "IPv4",
            "endpoints": [endpoint(address, Some(true), false)],
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}]
        }))
    };
    let slices = [
        with_role("prefill", "prefill", "10.0.3.1"),
        with_role("decode", "decode", "10.0.3.2"),
    ];
    let labels = SliceLabels {
        model: None,
        role: Some("shoal.io/pd-role"),
    };
    let found = ready_endpoints(&slices, &PortChoice::Only, None, labels);
    assert_eq!(found.endpoints.len(), 2);
    assert_eq!(
        found.prefill.into_iter().collect::<Vec<_>>(),
        ["http://10.0.3.1:8000"]
    );
    // Without the flag nothing is a prefill worker.
    let found = ready_endpoints(&slices, &PortChoice::Only, None, None);
    assert!(found.prefill.is_empty());
}
