//! Slow and hostile clients against a real `shoal` process with a low
//! open-file limit (`ulimit -n 256`): hundreds of connections that send
//! part of a request head, or declare a body and stall, while a normal
//! client keeps sending requests. The normal requests must keep
//! succeeding, every slow connection must be closed by the front's limits
//! (header timeout, body timeout, connection cap), and no descriptor may
//! leak once the attack is over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_support::{engines, run_for, wait_for};
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::locate_shoal;
use shoal_tests::workload::short_request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SLOW_CONNECTIONS: usize = 500;

struct Shoal(Child);

impl Drop for Shoal {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(engine: &str) -> (Shoal, String) {
    let bin = locate_shoal(None).unwrap();
    let script = format!(
        "ulimit -n 256 && exec {} --host 127.0.0.1 --port 0 --worker-urls {engine} \
         --worker-load-source none --client-header-timeout-secs 2 --client-body-timeout-secs 2",
        bin.display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
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
        .expect("shoal starts");
    (Shoal(child), addr)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Whether the server closed `stream` (end of file or reset) within `within`.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A 408 answer, then the close.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed_and_normal_requests_keep_succeeding() {
    run_for(Duration::from_secs(60), async {
        let engines = engines(1).await;
        let (shoal, addr) = start(&engines[0].url());
        let pid = shoal.0.id();
        let base = format!("http://{addr}");
        let client = HttpClient::new();
        short_request(&client, &base, "warm up", 1).await.unwrap();
        let baseline = open_fds(pid);

        // The normal client: a request every 20 ms on its keep-alive
        // connection for the whole attack.
        let normal = tokio::spawn({
            let (client, base) = (client.clone(), base.clone());
            async move {
                let mut latencies = Vec::new();
                let mut failures = 0usize;
                let until = Instant::now() + Duration::from_secs(6);
                let mut k = 0u64;
                while Instant::now() < until {
                    let started = Instant::now();
                    match short_request(&client, &base, &format!("normal {k}"), 1).await {
                        Ok(()) => latencies.push(started.elapsed()),
                        Err(_) => failures += 1,
                    }
                    k += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (latencies, failures)
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;

        let mut attackers = Vec::new();
        for i in 0..SLOW_CONNECTIONS {
            let Ok(mut stream) = TcpStream::connect(&addr).await else {
                continue;
            };
            // One in five declares a body and stalls; the rest stall in
            // their head. Interleaved, so both kinds get past the cap.
            let partial = if i % 5 != 0 {
                "POST /v1/chat/completions HTTP/1.1\r\nHost: shoal\r\n".to_string()
            } else {
                "POST /v1/chat/completions HTTP/1.1\r\nHost: shoal\r\ncontent-type: application/json\r\n\
                 content-length: 1000\r\n\r\n{\"model\":".to_string()
            };
            let _ = stream.write_all(partial.as_bytes()).await;
            attackers.push(stream);
        }
        let opened = attackers.len();
        let mut closed = 0usize;
        for stream in &mut attackers {
            if closed_by_server(stream, Duration::from_secs(8)).await {
                closed += 1;
            }
        }
        assert_eq!(closed, opened, "every slow connection was closed by the server");

        let (mut latencies, failures) = normal.await.unwrap();
        assert_eq!(failures, 0, "normal requests kept succeeding during the attack");
        latencies.sort();
        let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        println!(
            "normal requests during the attack: {} ok, p50 {:?}, p99 {:?}, max {:?}",
            latencies.len(),
            p(0.5),
            p(0.99),
            latencies.last().copied().unwrap_or_default()
        );
        assert!(latencies.len() > 100, "{} normal requests", latencies.len());

        let metrics = client.get(&format!("{base}/metrics")).await.unwrap().text();
        let count = |reason: &str| -> u64 {
            let prefix = format!("shoal_client_connections_closed_total{{reason=\"{reason}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let (header, body, limit) = (count("header_timeout"), count("body_timeout"), count("limit"));
        println!("closed by reason: header_timeout {header}, body_timeout {body}, limit {limit}");
        assert!(header > 0 && body > 0 && limit > 0, "every limit acted");
        assert!(header + body + limit >= opened as u64, "every slow connection counted");

        drop(attackers);
        wait_for("no descriptor leaks", Duration::from_secs(5), async || {
            (open_fds(pid) <= baseline + 4).then_some(())
        })
        .await;
        short_request(&client, &base, "after", 1).await.unwrap();
    })
    .await;
}
