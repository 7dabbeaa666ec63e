//! The real `shoal` executable: start-up, a proxied request, clear
//! rejection of bad flags.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::chat_body;
use common::fake_engine::FakeEngine;

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_serves_on_an_ephemeral_port_and_proxies() {
    let engine = FakeEngine::start().await;
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--worker-load-source",
                "none",
            ])
            .args(["--worker-urls", &engine.url])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("shoal logs its address");
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(engine.requests(), 1);
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, needle) in [
        (
            vec!["--retry-jitter-factor", "nan"],
            "--retry-jitter-factor",
        ),
        (vec!["--worker-urls", "localhost:8000"], "--worker-urls"),
        (vec!["--policy", "nope"], "--policy"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .env("SHOAL_PORT", "not-a-port")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--port"));
}
