//! The real `shoal` executable: start-up, a proxied request, clear
//! rejection of bad flags.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::chat_body;
use common::fake_engine::{CHUNKS, FakeEngine};
use futures_util::StreamExt;

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary against `engine` and returns it with its HTTP address.
fn spawn_shoal(engine: &FakeEngine) -> (Child, String) {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(["--worker-load-source", "none", "--drain-settle-secs", "1"])
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
    (child, addr)
}

#[tokio::test]
async fn binary_serves_on_an_ephemeral_port_and_proxies() {
    let engine = FakeEngine::start().await;
    let (_child, addr) = spawn_shoal(&engine);
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
        // A negative number reaches the validator (not "unexpected argument").
        (
            vec!["--least-load-kv-pressure-weight", "-1"],
            "must not be negative",
        ),
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

#[tokio::test]
async fn sigterm_lets_an_in_flight_stream_finish_then_exits_cleanly() {
    let engine = FakeEngine::start().await;
    engine.state.pause_after_first.store(true, Ordering::SeqCst);
    let (mut child, addr) = spawn_shoal(&engine);
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&chat_body(true))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut received = body.next().await.unwrap().unwrap().to_vec();

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Wait until the drain has run its course up to the open stream: the
    // settle period is over once the listener refuses connections. Only
    // then does "still running" say the stream holds the exit back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener stayed open after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "still serving the open stream"
    );

    engine.state.resume.notify_waiters();
    while let Some(chunk) = body.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(
        received,
        CHUNKS.concat().as_bytes(),
        "the stream finished intact"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "shoal did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn help_names_the_subcommands_and_shoal_help_works() {
    for args in [vec!["--help"], vec!["help"]] {
        let output = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        for needle in [
            "shoal mesh gen-certs",
            "shoal mesh status",
            "Client connections:",
            "Security:",
        ] {
            assert!(stdout.contains(needle), "{args:?} lacks {needle}");
        }
    }
}
