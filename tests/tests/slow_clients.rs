//! Slow and hostile clients against a real `shoal` process with a low
//! open-file limit (`ulimit -n 256`): hundreds of connections that send
//! part of a request head, or declare a body and stall, while a normal
//! client keeps sending requests. The normal requests must keep
//! succeeding, every slow connection must be closed by the front's limits
//! (header timeout, body timeout, connection cap), and no descriptor may
//! leak once the attack is over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::time::{Duration, Instant};

use fleet_support::{SoloShoal, counter, engines, run_for, wait_for};
use shoal_tests::client::HttpClient;
use shoal_tests::workload::short_request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SLOW_CONNECTIONS: usize = 500;

fn start(engine: &str, extra: &str) -> SoloShoal {
    SoloShoal::start(
        "ulimit -n 256",
        &format!(
            "--worker-urls {engine} --worker-load-source none \
             --client-header-timeout-secs 2 --client-body-timeout-secs 2 {extra}"
        ),
    )
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
        let shoal = start(&engines[0].url(), "");
        let (pid, addr, base) = (shoal.pid(), shoal.addr.clone(), shoal.base());
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
        let count = |reason| counter(&metrics, "shoal_client_connections_closed_total", reason);
        let (header, body) = (count("header_timeout"), count("body_timeout"));
        let (evicted, limit) = (count("evicted"), count("limit"));
        println!(
            "closed by reason: header_timeout {header}, body_timeout {body}, evicted {evicted}, limit {limit}"
        );
        // Stalled heads go by the header timeout or, at the cap, as the
        // idle connection closed to make room; stalled bodies by the body
        // timeout (a request in flight is never closed to make room).
        assert!(header + evicted > 0, "stalled heads were closed");
        assert!(body > 0, "stalled bodies were closed");
        assert!(evicted + limit > 0, "the cap acted");
        assert!(
            header + body + evicted + limit >= opened as u64,
            "every slow connection counted"
        );

        drop(attackers);
        wait_for("no descriptor leaks", Duration::from_secs(5), async || {
            (open_fds(pid) <= baseline + 4).then_some(())
        })
        .await;
        short_request(&client, &base, "after", 1).await.unwrap();
    })
    .await;
}

/// The first bytes of an HTTP/2 connection with prior knowledge: the
/// client preface and an empty SETTINGS frame (length 0, type 4, no flags,
/// stream 0), after which the connection is an idle HTTP/2 connection.
const H2_PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Sends `GET /liveness` on a fresh connection; true on a 200.
async fn liveness(addr: &str) -> bool {
    let probe = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /liveness HTTP/1.1\r\nhost: shoal\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(answer.starts_with(b"HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Connections that never send a request — nothing at all, part of the
/// HTTP/2 preface, or a complete preface and then nothing — are closed
/// after the header timeout, and while they fill the connection cap the
/// kubelet's probes (a fresh connection each) still get answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_send_nothing_are_closed_and_probes_keep_answering() {
    run_for(Duration::from_secs(60), async {
        let engines = engines(1).await;
        let shoal = start(&engines[0].url(), "--max-client-connections 200");
        let (addr, base) = (shoal.addr.clone(), shoal.base());
        let client = HttpClient::new();
        short_request(&client, &base, "warm up", 1).await.unwrap();

        let probes = tokio::spawn({
            let addr = addr.clone();
            async move {
                let (mut answered, mut refused) = (0usize, 0usize);
                let until = Instant::now() + Duration::from_secs(5);
                while Instant::now() < until {
                    if liveness(&addr).await {
                        answered += 1;
                    } else {
                        refused += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (answered, refused)
            }
        });

        // 250 silent sockets, 50 with half a preface, 20 idle HTTP/2.
        let mut attackers = Vec::new();
        for i in 0..320usize {
            let Ok(mut stream) = TcpStream::connect(&addr).await else {
                continue;
            };
            let sent: &[u8] = match i % 16 {
                0 => H2_PREFACE_AND_SETTINGS,
                1..=3 => b"PRI * HTTP/2.0\r\n",
                _ => b"",
            };
            if !sent.is_empty() {
                let _ = stream.write_all(sent).await;
            }
            attackers.push((stream, Instant::now()));
        }
        let opened = attackers.len();
        let mut closed = 0usize;
        let mut latest = Duration::ZERO;
        for (stream, opened_at) in &mut attackers {
            let left =
                (*opened_at + Duration::from_secs(6)).saturating_duration_since(Instant::now());
            if closed_by_server(stream, left).await {
                closed += 1;
                latest = latest.max(opened_at.elapsed());
            }
        }
        println!(
            "{closed} of {opened} idle connections closed, the last {latest:?} after it opened"
        );
        let (answered, refused) = probes.await.unwrap();
        println!("liveness probes during the attack: {answered} answered, {refused} refused");
        assert_eq!(
            closed, opened,
            "every connection that sent no request was closed"
        );
        assert_eq!(refused, 0, "the probes were answered throughout");
        assert!(answered >= 20, "{answered} probes");

        let metrics = client.get(&format!("{base}/metrics")).await.unwrap().text();
        let count = |reason| counter(&metrics, "shoal_client_connections_closed_total", reason);
        let (header, evicted, limit) = (count("header_timeout"), count("evicted"), count("limit"));
        println!("closed by reason: header_timeout {header}, evicted {evicted}, limit {limit}");
        assert!(header > 0, "the header timeout closed silent sockets");
        assert!(
            header + evicted + limit >= opened as u64,
            "every idle connection counted"
        );
        drop(shoal);
    })
    .await;
}
