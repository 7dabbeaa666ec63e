//! What the fleet routes *to*, with real `shoal` processes meshed on
//! loopback: the worker set admins change on one replica reaches all of
//! them (and a restarted one gets it back), requests for a model reach only
//! its engines on every replica, and Kubernetes discovery — against a fake
//! API server speaking the real list/watch protocol to the real `kube`
//! client — follows Ready endpoints, including a DELETE missed while the
//! watch was down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use fleet_support::{Setup, engines, meshed, run, run_for, start, wait_for};
use serde_json::{Value, json};
use shoal_tests::kube_api::{KubeApi, slice};
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use shoal_tests::workload::{HeldStream, text};

/// The URLs replica `i` lists in `GET /workers`, with their source.
async fn listed(s: &Setup, i: usize) -> Vec<(String, String)> {
    let Ok(resp) = s.client.get(&format!("{}/workers", s.fleet.url(i))).await else {
        return Vec::new();
    };
    let Ok(Value::Array(workers)) = resp.json() else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = workers
        .iter()
        .map(|w| {
            let url = w["url"].as_str().unwrap_or("").to_string();
            let source = w["source"].as_str().unwrap_or("").to_string();
            (url, source)
        })
        .collect();
    out.sort();
    out
}

/// The URLs alone.
async fn urls(s: &Setup, i: usize) -> BTreeSet<String> {
    listed(s, i).await.into_iter().map(|(u, _)| u).collect()
}

/// Waits until every replica lists exactly `want`.
async fn all_list(s: &Setup, want: &[String], within: Duration, what: &str) {
    let want: BTreeSet<String> = want.iter().cloned().collect();
    for i in 0..s.fleet.len() {
        wait_for(
            &format!("{what} (replica {})", s.fleet.name(i)),
            within,
            async || (urls(s, i).await == want).then_some(()),
        )
        .await;
    }
}

/// Sends `n` chat requests for `model` through replica `i`; every answer
/// must be `status`.
async fn ask(s: &Setup, i: usize, model: &str, n: usize, status: u16) {
    for k in 0..n {
        let body = json!({"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": text(k as u64, 40)}]});
        let resp = s
            .client
            .post_json(&format!("{}/v1/chat/completions", s.fleet.url(i)), &body)
            .await
            .unwrap();
        assert_eq!(
            resp.status,
            status,
            "{model} via {}: {}",
            s.fleet.name(i),
            resp.text()
        );
    }
}

fn percent_encoded(url: &str) -> String {
    url.replace(':', "%3A").replace('/', "%2F")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_change_on_one_replica_reaches_all_and_a_restarted_one_gets_it_back() {
    run_for(Duration::from_secs(60), async {
        let args = ["--policy", "round_robin", "--worker-load-source", "none"];
        // Every replica is seeded with engine 0 only.
        let mut s = start(engines(2).await, &[0], true, &args).await;
        let (e0, e1) = (s.engines[0].url(), s.engines[1].url());

        let added = s
            .client
            .post_json(&format!("{}/workers", s.fleet.url(0)), &json!({"url": e1}))
            .await
            .unwrap();
        assert_eq!(added.status, 201, "{}", added.text());
        let t = Instant::now();
        all_list(
            &s,
            &[e0.clone(), e1.clone()],
            Duration::from_secs(1),
            "added on a",
        )
        .await;
        println!("POST on a listed everywhere after {:?}", t.elapsed());
        let before = s.accepted();
        ask(&s, 2, "mock/Qwen3-8B", 4, 200).await;
        assert!(
            s.accepted()[1] > before[1],
            "c routes to the worker a added"
        );

        let gone = s
            .client
            .send(
                http::Method::DELETE,
                &format!("{}/workers/{}", s.fleet.url(1), percent_encoded(&e0)),
                &[],
                None,
            )
            .await
            .unwrap();
        assert_eq!(gone.status().as_u16(), 204);
        let t = Instant::now();
        all_list(
            &s,
            std::slice::from_ref(&e1),
            Duration::from_secs(1),
            "seed removed on b",
        )
        .await;
        println!("DELETE on b applied everywhere after {:?}", t.elapsed());
        let before = s.accepted();
        for i in 0..3 {
            ask(&s, i, "mock/Qwen3-8B", 3, 200).await;
        }
        assert_eq!(
            s.accepted()[0],
            before[0],
            "no replica routes to the removed seed"
        );

        // c restarts with its seed (engine 0) and no memory: its peers'
        // set brings the admin add and the removal back.
        s.fleet.kill9(2).unwrap();
        s.fleet.restart(2).await.unwrap();
        s.fleet.wait_meshed(Duration::from_secs(15)).await.unwrap();
        wait_for(
            "restarted c has the fleet's set",
            Duration::from_secs(5),
            async || (listed(&s, 2).await == vec![(e1.clone(), "admin".to_string())]).then_some(()),
        )
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_on_four_engines_each_reach_only_their_engines_from_every_replica() {
    run(async {
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut all: Vec<EngineHandle> = Vec::new();
        for model in ["llama", "qwen"] {
            let cfg = EngineConfig {
                flavor: Flavor::Sglang,
                model_name: model.into(),
                ..EngineConfig::default()
            };
            all.extend(spawn_engines(&cfg, localhost, 0, 2).await.unwrap());
        }
        let args = [
            "--policy",
            "least_load",
            "--health-check-interval-secs",
            "1",
        ];
        let s = start(all, &[0, 1, 2, 3], true, &args).await;
        for i in 0..3 {
            wait_for("model lists read", Duration::from_secs(5), async || {
                let resp = s
                    .client
                    .get(&format!("{}/workers", s.fleet.url(i)))
                    .await
                    .ok()?;
                let workers = resp.json().ok()?;
                let known = workers.as_array()?.iter().all(|w| w["models"].is_array());
                known.then_some(())
            })
            .await;
        }
        let before = s.accepted();
        for i in 0..3 {
            ask(&s, i, "llama", 4, 200).await;
        }
        let mid = s.accepted();
        assert_eq!(mid[2..], before[2..], "llama never reaches a qwen engine");
        assert_eq!(mid[0] + mid[1] - before[0] - before[1], 12);
        for i in 0..3 {
            ask(&s, i, "qwen", 4, 200).await;
        }
        let after = s.accepted();
        assert_eq!(after[..2], mid[..2], "qwen never reaches a llama engine");
        for i in 0..3 {
            let resp = s
                .client
                .post_json(
                    &format!("{}/v1/chat/completions", s.fleet.url(i)),
                    &json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
                )
                .await
                .unwrap();
            assert_eq!(resp.status, 404);
            assert_eq!(resp.json().unwrap()["error"]["code"], "model_not_found");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_discovery_routes_to_ready_endpoints_and_relists_past_a_missed_delete() {
    run_for(Duration::from_secs(60), async {
        let engines = engines(3).await;
        let ports: Vec<u16> = engines.iter().map(|e| e.addr().port()).collect();
        let urls_of: Vec<String> = engines.iter().map(|e| e.url()).collect();
        let port = |i: usize| ports[i];
        let url = |i: usize| urls_of[i].clone();
        let api = KubeApi::start("llm").await.unwrap();
        let labels = [("app", "llm")];
        api.apply(slice("e0", &labels, "127.0.0.1", port(0), true));
        api.apply(slice("e1", &labels, "127.0.0.1", port(1), true));
        // A slice of another Service: the selector leaves it out.
        api.apply(slice("other", &[("app", "db")], "127.0.0.1", 9, true));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
        let kubeconfig = kubeconfig.to_string_lossy().to_string();
        let args = [
            "--policy",
            "round_robin",
            "--worker-load-source",
            "none",
            "--discovery",
            "kubernetes",
            "--discovery-kubeconfig",
            &kubeconfig,
            "--discovery-selector",
            "app=llm",
            "--discovery-port",
            "http",
        ];
        let s = start(engines, &[], true, &args).await;
        let within = Duration::from_secs(5);
        all_list(&s, &[url(0), url(1)], within, "initial list").await;
        assert!(
            listed(&s, 0)
                .await
                .iter()
                .all(|(_, source)| source == "discovery")
        );

        api.apply(slice("e2", &labels, "127.0.0.1", port(2), true));
        all_list(&s, &[url(0), url(1), url(2)], within, "ADDED").await;

        api.apply(slice("e1", &labels, "127.0.0.1", port(1), false));
        all_list(&s, &[url(0), url(2)], within, "e1 NotReady").await;
        let before = s.accepted();
        for i in 0..3 {
            ask(&s, i, "mock/Qwen3-8B", 4, 200).await;
        }
        assert_eq!(
            s.accepted()[1],
            before[1],
            "a NotReady endpoint gets no request"
        );

        // Streams held through a (round robin): one lands on e2 and stays
        // open while e2 goes away.
        let mut held = Vec::new();
        for k in 0..2u64 {
            held.push(
                HeldStream::open(&s.client, &s.fleet.url(0), &text(k, 200), 400)
                    .await
                    .unwrap(),
            );
        }
        assert!(
            s.active()[2] > 0,
            "a held request runs on e2: {:?}",
            s.active()
        );

        // e2's slice is deleted while every watch is down and no event
        // tells anyone; the history is compacted meanwhile, so each watch
        // resuming from where it was is answered 410 Gone, as a real API
        // server does once etcd compacted it: only a new list shows the
        // deletion.
        let lists_before = api.lists();
        api.delete_silently("e2");
        api.compact();
        api.drop_watches();
        all_list(
            &s,
            &[url(0)],
            Duration::from_secs(10),
            "missed DELETE repaired by a re-list",
        )
        .await;
        assert!(
            api.lists() >= lists_before + 3,
            "every replica listed again"
        );
        for stream in held {
            let tokens = stream.finish().await.expect("in-flight streams finish");
            assert!(tokens > 0);
        }
        let before = s.accepted();
        for i in 0..3 {
            ask(&s, i, "mock/Qwen3-8B", 3, 200).await;
        }
        let after = s.accepted();
        assert_eq!(
            (after[1], after[2]),
            (before[1], before[2]),
            "only e0 is routed"
        );
        println!("lists {} watches {}", api.lists(), api.watches());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_a_meshed_replica_show_the_freshest_fleet_snapshot_and_who_polled_it() {
    run(async {
        let s = meshed(
            4,
            &[
                "--worker-load-source",
                "sglang",
                "--load-poll-interval-ms",
                "200",
            ],
        )
        .await;
        let mut polled_by_a_peer = 0;
        for i in 0..3 {
            let me = s.fleet.name(i).to_string();
            let workers = wait_for(
                "fresh snapshots everywhere",
                Duration::from_secs(5),
                async || {
                    let resp = s
                        .client
                        .get(&format!("{}/workers", s.fleet.url(i)))
                        .await
                        .ok()?;
                    let workers = resp.json().ok()?.as_array()?.clone();
                    let fresh = workers.iter().all(|w| {
                        w["snapshot_age_ms"].as_u64().is_some_and(|age| age < 1_000)
                            && w["snapshot"]["poller"]
                                .as_str()
                                .is_some_and(|p| !p.is_empty())
                    });
                    fresh.then_some(workers)
                },
            )
            .await;
            polled_by_a_peer += workers
                .iter()
                .filter(|w| w["snapshot"]["poller"].as_str() != Some(me.as_str()))
                .count();
        }
        assert!(
            polled_by_a_peer > 0,
            "polls are split by ownership, and shown as such"
        );
    })
    .await;
}
