//! Live reload with a real `shoal` process: SIGHUP after the `--config`
//! file changed applies new seeds, keys and policy thresholds while a
//! stream stays open; a broken file changes nothing and is counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::time::Duration;

use fleet_support::{Setup, engines, run, wait_for};
use serde_json::json;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};
use shoal_tests::mock::DEFAULT_MODEL;
use shoal_tests::workload::{HeldStream, text};

fn hangup(s: &Setup) {
    let pid = s.fleet.pid(0).expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until replica 0 has counted exactly one rejected reload.
async fn first_rejected_reload(s: &Setup, what: &str) {
    wait_for(what, Duration::from_secs(5), async || {
        let metrics = s
            .client
            .get(&format!("{}/metrics", s.fleet.url(0)))
            .await
            .ok()?
            .text();
        metrics
            .contains("shoal_config_reloads_total{result=\"rejected\"} 1")
            .then_some(())
    })
    .await;
}

/// Sends one prompt (`seed`'s, never sent before) `n` times through the
/// replica with `key`; returns how many each engine took.
async fn same_prompt(s: &Setup, seed: u64, n: usize, key: Option<&str>) -> Vec<u64> {
    let before = s.accepted();
    let prompt = text(1_000 + seed, 1_200);
    for _ in 0..n {
        let body = json!({"model": DEFAULT_MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": prompt}]});
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let resp = s
            .client
            .send(
                http::Method::POST,
                &format!("{}/v1/chat/completions", s.fleet.url(0)),
                &headers,
                Some(body.to_string().into()),
            )
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    }
    let after = s.accepted();
    after.iter().zip(&before).map(|(a, b)| a - b).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_seeds_keys_and_thresholds_and_a_broken_file_changes_nothing() {
    run(async {
        let engines = engines(2).await;
        let (e0, e1) = (engines[0].url(), engines[1].url());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shoal.toml");
        // cache_threshold 1.0: no match is ever more than all of the
        // prompt, so affinity is off and equal prompts spread.
        let first = format!(
            "worker-urls = [\"{e0}\", \"{e1}\"]\npolicy = \"cache_aware\"\ncache-threshold = 1.0\n\
             worker-load-source = \"none\"\n"
        );
        std::fs::write(&file, &first).unwrap();
        let path = file.to_string_lossy().to_string();
        let bin = locate_shoal(None).unwrap();
        let cfg = FleetConfig::new(bin, 1, Vec::new())
            .mesh(false)
            .args(["--config", path.as_str()]);
        let s = Setup {
            engines,
            fleet: Fleet::start(cfg).await.unwrap(),
            client: HttpClient::new(),
        };
        let spread = same_prompt(&s, 1, 12, None).await;
        assert!(spread.iter().all(|&n| n > 0), "affinity off: {spread:?}");

        let mut held = HeldStream::open(&s.client, &s.fleet.url(0), &text(1, 200), 300)
            .await
            .unwrap();
        let second = format!(
            "worker-urls = [\"{e0}\", \"{e1}\"]\npolicy = \"cache_aware\"\ncache-threshold = 0.3\n\
             worker-load-source = \"none\"\napi-key = [\"sk-reloaded-key\"]\n"
        );
        std::fs::write(&file, &second).unwrap();
        hangup(&s);
        wait_for(
            "the new key is required",
            Duration::from_secs(5),
            async || {
                let resp = s
                    .client
                    .get(&format!("{}/v1/models", s.fleet.url(0)))
                    .await
                    .ok()?;
                (resp.status == 401).then_some(())
            },
        )
        .await;
        let together = same_prompt(&s, 2, 8, Some("sk-reloaded-key")).await;
        assert!(
            together.contains(&8),
            "cache_threshold 0.3 keeps the prompt on one engine: {together:?}"
        );
        assert!(
            held.stream.next_data().await.unwrap().is_some(),
            "the stream survived the reload"
        );
        assert!(held.finish().await.unwrap() > 0);

        std::fs::write(&file, "worker-urls = [\n").unwrap();
        hangup(&s);
        first_rejected_reload(&s, "the broken file is counted").await;
        let still = same_prompt(&s, 3, 6, Some("sk-reloaded-key")).await;
        assert!(still.contains(&6), "key and threshold unchanged: {still:?}");
        let log = s.fleet.log_tail(0, 40);
        assert!(log.contains("reload rejected"), "{log}");
        assert!(!log.contains("sk-reloaded-key"), "keys are never logged");
    })
    .await;
}

/// A keys file emptied to revoke every key must not open the router: a
/// reload of it is rejected (old keys kept, logged, counted), and a
/// replica started on it refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_keys_file_is_rejected_and_never_opens_the_router() {
    run(async {
        let engines = engines(1).await;
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "# team a\nsk-team-a-key-1\n").unwrap();
        let path = keys.to_string_lossy().to_string();
        let bin = locate_shoal(None).unwrap();
        let cfg = FleetConfig::new(bin.clone(), 1, vec![engines[0].url()])
            .mesh(false)
            .args([
                "--api-keys-file",
                path.as_str(),
                "--worker-load-source",
                "none",
            ]);
        let s = Setup {
            engines,
            fleet: Fleet::start(cfg).await.unwrap(),
            client: HttpClient::new(),
        };
        let models = |key: Option<&'static str>| {
            let (client, url) = (s.client.clone(), format!("{}/v1/models", s.fleet.url(0)));
            async move {
                let auth = key.map(|k| format!("Bearer {k}"));
                let headers: Vec<(&str, &str)> =
                    auth.iter().map(|a| ("authorization", a.as_str())).collect();
                let resp = client
                    .send(http::Method::GET, &url, &headers, None)
                    .await
                    .unwrap();
                resp.status().as_u16()
            }
        };
        assert_eq!(models(None).await, 401);
        assert_eq!(models(Some("sk-team-a-key-1")).await, 200);

        std::fs::write(&keys, "# every key revoked\n\n").unwrap();
        hangup(&s);
        first_rejected_reload(&s, "the emptied file is rejected").await;
        assert_eq!(models(None).await, 401, "still guarded");
        assert_eq!(models(Some("sk-team-a-key-1")).await, 200, "old keys kept");
        let log = s.fleet.log_tail(0, 40);
        assert!(log.contains("holds no key"), "the reason is logged: {log}");

        let started = std::process::Command::new(&bin)
            .args(["--port", "0", "--api-keys-file", path.as_str()])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&started.stderr).into_owned()
            + &String::from_utf8_lossy(&started.stdout);
        assert!(!started.status.success(), "refused to start: {said}");
        assert!(
            said.contains("--api-keys-file") && said.contains("holds no key"),
            "the error names the flag and the reason: {said}"
        );
    })
    .await;
}
