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

use std::time::Instant;

use fleet_support::{Setup, start, start_with_spares, wait_for};
use serde_json::Value;
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};
use shoal_tests::workload::{chat, text};

const ENGINES: usize = 4;
const FAMILIES: u64 = 12;

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/tokenizer.json")
}

fn chat_template() -> PathBuf {
    tokenizer().with_file_name("chat_template.jinja")
}

async fn engines() -> Vec<EngineHandle> {
    engines_with(None).await
}

/// The engines, rendering chat requests with `template` if given.
async fn engines_with(template: Option<PathBuf>) -> Vec<EngineHandle> {
    engines_of(Flavor::Sglang, template).await
}

/// Engines of `flavor`, rendering chat requests with `template` if given.
async fn engines_of(flavor: Flavor, template: Option<PathBuf>) -> Vec<EngineHandle> {
    let cfg = EngineConfig {
        flavor,
        tokenizer: Some(tokenizer()),
        kv_events_port: Some(0),
        kv_events_replay_port: Some(0),
        chat_template: template,
        ..EngineConfig::default()
    };
    spawn_engines(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, ENGINES)
        .await
        .unwrap()
}

/// The replicas' flags: the policy, the tokenizer, each engine's sockets.
fn args(engines: &[EngineHandle]) -> Vec<String> {
    let mut args = args_without_tokenizer(engines);
    args.extend(["--kv-tokenizer".into(), tokenizer().display().to_string()]);
    args
}

/// [`args`] without a tokenizer: the replicas hash no prompt themselves.
fn args_without_tokenizer(engines: &[EngineHandle]) -> Vec<String> {
    let mut args = vec![
        "--policy".to_string(),
        "precise_prefix".into(),
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

/// Now on the wall clock, µs since the Unix epoch.
fn unix_micros() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.unwrap().as_micros()).unwrap()
}

async fn dry_run(setup: &Setup, replica: usize, body: &Value) -> String {
    let url = format!("{}/debug/route", setup.fleet.url(replica));
    let asked = unix_micros();
    let answer = setup.client.post_json(&url, body).await.unwrap();
    let answered = unix_micros();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let json = answer.json().unwrap();
    // When it chose, on the replica's clock (this host's): between the
    // ask and the answer, so answers to one probe can be put in order.
    let decided = json["decided_at_unix_micros"].as_u64().unwrap();
    assert!(
        (asked..=answered).contains(&decided),
        "{asked} {decided} {answered}"
    );
    // The view it chose on names every scoring input per candidate, so
    // disagreeing replicas can be told apart by what they saw.
    let loads = json["loads"].as_array().unwrap();
    assert_eq!(loads.len(), ENGINES, "{json}");
    for load in loads {
        for key in [
            "requests",
            "since_poll",
            "engine_gen_throughput",
            "engine_kv_usage",
        ] {
            assert!(load.get(key).is_some(), "{key} missing: {load}");
        }
    }
    assert!(
        loads.iter().any(|l| l["engine_kv_usage"]
            .as_f64()
            .is_some_and(|k| (0.0..=1.0).contains(&k))),
        "no engine's KV usage in the view: {json}"
    );
    json["worker"].as_str().unwrap().to_string()
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
        let replicas = setup.fleet.len();
        let homes = first_turns(&setup, |f| f % replicas).await;
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

/// The blocks of `body`'s prompt replica `replica`'s index says `home`
/// caches (0 if none).
async fn home_blocks(setup: &Setup, replica: usize, body: &Value, home: &str) -> u64 {
    let url = format!("{}/debug/route", setup.fleet.url(replica));
    let answer = setup.client.post_json(&url, body).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let json = answer.json().unwrap();
    json["cached"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["worker"] == home)
        .and_then(|c| c["blocks"].as_u64())
        .unwrap_or(0)
}

/// Sends the first turn of every family `f` through replica
/// `replica_of(f)` and returns the engine each one landed on.
async fn first_turns(setup: &Setup, replica_of: impl Fn(usize) -> usize) -> Vec<String> {
    let mut homes = Vec::new();
    for f in 0..FAMILIES {
        let replica = replica_of(f as usize);
        let url = format!("{}/v1/chat/completions", setup.fleet.url(replica));
        let answer = setup
            .client
            .post_json(&url, &chat(&history(f), 4, false))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        homes.push(answer.header("x-shoal-worker").unwrap().to_string());
    }
    homes
}

/// A conversation of family `f` as chat messages: a system prompt, the
/// history as the first user turn and, for a later turn, the assistant's
/// answer and a new question.
fn conversation(f: u64, later: bool) -> Value {
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": "You are terse."}),
        serde_json::json!({"role": "user", "content": history(f)}),
    ];
    if later {
        messages.push(serde_json::json!({"role": "assistant", "content": "tok tok tok tok"}));
        messages.push(serde_json::json!({"role": "user", "content": text(8000 + f, 200)}));
    }
    serde_json::json!({"model": shoal_tests::mock::DEFAULT_MODEL, "messages": messages, "max_tokens": 4})
}

/// Sends the first chat turn of `families` conversations through replica
/// 0, then, once replica 1's index shows each history on its home, the
/// later turn through replica 1: it must land on that home. (The history
/// is ~1,500 characters: several 16-token blocks of it, behind the
/// template's markers, must be found there.)
async fn later_chat_turns_follow_their_cache(setup: &Setup, families: u64) {
    let mut homes = Vec::new();
    for f in 0..families {
        let url = format!("{}/v1/chat/completions", setup.fleet.url(0));
        let answer = setup
            .client
            .post_json(&url, &conversation(f, false))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        homes.push(answer.header("x-shoal-worker").unwrap().to_string());
    }
    for f in 0..families {
        let later = conversation(f, true);
        let home = &homes[f as usize];
        wait_for(
            "the home engine's events",
            Duration::from_secs(10),
            async || (home_blocks(setup, 1, &later, home).await >= 8).then_some(()),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let url = format!("{}/v1/chat/completions", setup.fleet.url(1));
        let answer = setup.client.post_json(&url, &later).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("x-shoal-worker"),
            Some(home.as_str()),
            "family {f}"
        );
    }
}

#[tokio::test]
async fn chat_requests_rendered_with_the_engines_template_match_their_cache() {
    fleet_support::run_for(Duration::from_secs(90), async {
        // The engines render chat with a ChatML template, as vLLM would:
        // their blocks begin with role markers no message content holds.
        let engines = engines_with(Some(chat_template())).await;
        let mut args = args(&engines);
        args.extend([
            "--kv-chat-template".into(),
            chat_template().display().to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let setup = start(engines, &[0, 1, 2, 3], true, &args).await;
        later_chat_turns_follow_their_cache(&setup, 6).await;
    })
    .await;
}

#[tokio::test]
async fn a_replica_started_into_a_busy_fleet_routes_on_the_warm_index() {
    fleet_support::run_for(Duration::from_secs(90), async {
        let engines = engines().await;
        let args = args(&engines);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut setup = start_with_spares(engines, &[0, 1, 2, 3], true, &args, &["late"]).await;
        let homes = first_turns(&setup, |_| 0).await;
        // Keep the fleet busy while the new replica starts: unrelated
        // prompts through the running replicas, so events keep flowing
        // (bounded: at most 400 requests, stopped once the check is done).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let (client, urls, stop) = (
                setup.client.clone(),
                (0..setup.fleet.len()).map(|i| setup.fleet.url(i)).collect::<Vec<_>>(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut sent = 0u64;
                while sent < 400 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let url = format!("{}/v1/chat/completions", urls[sent as usize % urls.len()]);
                    let answer = client.post_json(&url, &chat(&text(90_000 + sent, 300), 2, false)).await;
                    assert_eq!(answer.map(|a| a.status).ok(), Some(200));
                    sent += 1;
                }
                sent
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let late = setup.fleet.add_replica("late").await.unwrap();
        let answering = started.elapsed();
        // Its index is warm when, for every family, it says what a replica
        // that ran all along says: the home engine caches the history.
        // (Compared on the index, not on the pick: with the fleet busy the
        // picks also follow the load, which moves between two asks.)
        let later: Vec<Value> = (0..FAMILIES)
            .map(|f| chat(&format!("{}{}", history(f), text(7000 + f, 200)), 4, false))
            .collect();
        let mut reference = Vec::new();
        for (f, body) in later.iter().enumerate() {
            let blocks = home_blocks(&setup, 0, body, &homes[f]).await;
            assert!(blocks > 0, "family {f}: the running replica sees its history");
            reference.push(blocks);
        }
        wait_for("the late replica's index", Duration::from_secs(30), async || {
            for (f, body) in later.iter().enumerate() {
                if home_blocks(&setup, late, body, &homes[f]).await != reference[f] {
                    return None;
                }
            }
            Some(())
        })
        .await;
        let warm = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = busy.await.unwrap();
        println!(
            "late replica: answering {} ms after spawn, its index as the running replica's for every family {} ms after \
             spawn ({sent} background requests)",
            answering.as_millis(),
            warm.as_millis()
        );
        assert!(sent > 0, "the fleet was busy while the replica started");
    })
    .await;
}

/// `route_micros` of `/debug/route` for `body` on replica 0, median of 25.
async fn median_route_micros(setup: &Setup, body: &Value) -> u64 {
    let url = format!("{}/debug/route", setup.fleet.url(0));
    let mut micros = Vec::new();
    for _ in 0..25 {
        let answer = setup.client.post_json(&url, body).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        micros.push(answer.json().unwrap()["route_micros"].as_u64().unwrap());
    }
    micros.sort_unstable();
    micros[micros.len() / 2]
}

#[tokio::test]
async fn replicas_without_a_tokenizer_route_on_the_engines_own_tokens() {
    fleet_support::run_for(Duration::from_secs(120), async {
        // vLLM engines rendering chat with their own template; the replicas
        // have neither tokenizer nor template, and ask an engine's
        // /tokenize for each prompt's ids.
        let engines = engines_of(Flavor::Vllm, Some(chat_template())).await;
        let mut flags = args_without_tokenizer(&engines);
        flags.push("--kv-tokenize-on-engine".into());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let setup = start(engines, &[0, 1, 2, 3], true, &flags).await;
        let families = 6;
        later_chat_turns_follow_their_cache(&setup, families).await;
        let asked: u64 = setup.engines.iter().map(|e| e.engine().tokenize_calls()).sum();
        assert!(asked >= 2 * families, "the engines tokenized every request ({asked})");
        let metrics = setup
            .client
            .get(&format!("{}/metrics", setup.fleet.url(1)))
            .await
            .unwrap()
            .text();
        assert!(
            metrics.contains("shoal_kv_engine_tokenize_total{result=\"ok\"}"),
            "{metrics}"
        );
        let on_engine = median_route_micros(&setup, &conversation(0, true)).await;
        drop(setup);

        // The same later turn routed by replicas with the tokenizer and
        // template: what asking an engine costs on top.
        let engines = engines_of(Flavor::Vllm, Some(chat_template())).await;
        let mut args = args(&engines);
        args.extend(["--kv-chat-template".into(), chat_template().display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let setup = start(engines, &[0, 1, 2, 3], true, &args).await;
        let local = median_route_micros(&setup, &conversation(0, true)).await;
        println!(
            "route a later chat turn (~1,700 tokens), median of 25 dry runs: {on_engine} us tokenized on an \
             engine, {local} us with the router's tokenizer"
        );
    })
    .await;
}
