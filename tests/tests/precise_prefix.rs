//! `precise_prefix` end to end: real `shoal` replicas (meshed) over mock
//! engines that publish vLLM-format KV events on real ZMQ sockets. A
//! prompt's later turns go to the engine whose events say it cached the
//! prompt, and every replica, asked with `POST /debug/route`, names the
//! same engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use fleet_support::{Setup, start, wait_for};
use serde_json::Value;
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use shoal_tests::workload::{chat, text};

const ENGINES: usize = 4;
const FAMILIES: u64 = 12;

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/tokenizer.json")
}

async fn engines() -> Vec<EngineHandle> {
    let cfg = EngineConfig {
        flavor: Flavor::Sglang,
        tokenizer: Some(tokenizer()),
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        ..EngineConfig::default()
    };
    spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, ENGINES)
        .await
        .unwrap()
}

/// The replicas' flags: the policy, the tokenizer, each engine's sockets.
fn args(engines: &[EngineHandle]) -> Vec<String> {
    let mut args = vec![
        "--policy".to_string(),
        "precise_prefix".into(),
        "--kv-tokenizer".into(),
        tokenizer().display().to_string(),
        "--expose-worker-header".into(),
        // Work booked since a poll counts as queue until the next poll:
        // frequent polls keep sequential requests from looking queued.
        "--load-poll-interval-ms".into(),
        "100".into(),
    ];
    for engine in engines {
        let kv = engine.kv_events().unwrap();
        args.push("--kv-events-endpoint".into());
        args.push(format!(
            "{}={}|{}",
            engine.url(),
            kv.endpoint,
            kv.replay_endpoint.clone().unwrap()
        ));
    }
    args
}

/// The conversation history of family `f`: ~1,500 tokens shared by its turns.
fn history(f: u64) -> String {
    text(1000 + f, 1500)
}

async fn dry_run(setup: &Setup, replica: usize, body: &Value) -> String {
    let url = format!("{}/debug/route", setup.fleet.url(replica));
    let answer = setup.client.post_json(&url, body).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json().unwrap()["worker"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn later_turns_follow_the_cache_and_every_replica_agrees() {
    fleet_support::run_for(Duration::from_secs(90), async {
        let engines = engines().await;
        let args = args(&engines);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let setup = start(engines, &[0, 1, 2, 3], true, &args).await;
        // First turns, each through some replica: whichever engine takes a
        // family's first turn caches its history.
        let mut homes = Vec::new();
        for f in 0..FAMILIES {
            let replica = (f as usize) % setup.fleet.len();
            let url = format!("{}/v1/chat/completions", setup.fleet.url(replica));
            let answer = setup
                .client
                .post_json(&url, &chat(&history(f), 4, false))
                .await
                .unwrap();
            assert_eq!(answer.status, 200, "{}", answer.text());
            homes.push(answer.header("x-shoal-worker").unwrap().to_string());
        }
        // Once the events are in, a later turn of each family (its history
        // plus a new message) is placed on its home by every replica.
        // (After the polls have seen the first turns finish, so every
        // replica's fleet view has settled to the same loads.)
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut agreed = 0;
        for f in 0..FAMILIES {
            let later = chat(&format!("{}{}", history(f), text(5000 + f, 200)), 4, false);
            let home = homes[f as usize].clone();
            wait_for(
                "the home engine's events",
                Duration::from_secs(10),
                async || (dry_run(&setup, 0, &later).await == home).then_some(()),
            )
            .await;
            let mut picks = Vec::new();
            for replica in 0..setup.fleet.len() {
                picks.push(dry_run(&setup, replica, &later).await);
            }
            if picks.iter().all(|p| *p == home) {
                agreed += 1;
            } else {
                println!("family {f}: home {home}, picks {picks:?}");
            }
        }
        assert_eq!(agreed, FAMILIES, "every replica names each family's home");
        // And the real later turns land there (one at a time, each after
        // the polls have seen the previous one finish: the bounded-load
        // guard would rightly spread a burst).
        for f in 0..FAMILIES {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let replica = (f as usize + 1) % setup.fleet.len();
            let url = format!("{}/v1/chat/completions", setup.fleet.url(replica));
            let later = chat(&format!("{}{}", history(f), text(6000 + f, 200)), 4, false);
            let answer = setup.client.post_json(&url, &later).await.unwrap();
            assert_eq!(
                answer.header("x-shoal-worker"),
                Some(homes[f as usize].as_str())
            );
        }
    })
    .await;
}
