//! Request bodies built to exhaust a replica: a 60 MB prompt of token ids,
//! a 60 MB deeply nested body, and more bodies at once than the buffered
//! bytes budget holds — against a real `shoal` process. Its peak memory
//! must stay under three times the body, a stream served by the same I/O
//! thread must keep flowing while a body is parsed, and the budget must
//! answer 503 with a reason when it is full.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fleet_support::{SoloShoal, counter, run_for};
use shoal_tests::client::HttpClient;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Bytes of each hostile body.
const BODY_BYTES: usize = 60_000_000;

/// An engine that serves the model `sink` and answers every request after
/// reading its whole body. Plain blocking sockets on threads of its own:
/// draining 60 MB costs this process next to nothing, so the timing of
/// the stream measures the router, not the test.
fn sink() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || serve_sink(stream));
        }
    });
    addr
}

/// Answers HTTP/1.1 requests on one connection until it closes.
fn serve_sink(stream: std::net::TcpStream) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        if std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink()).is_err() {
            return;
        }
        let body = if request_line.starts_with("GET /v1/models") {
            r#"{"object":"list","data":[{"id":"sink"}]}"#.to_string()
        } else {
            format!(
                r#"{{"id":"cmpl-sink","object":"text_completion","read":{length},"choices":[]}}"#
            )
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Sends `body` as `POST /v1/completions` on a fresh connection and reads
/// the answer: its status and body.
async fn post_raw(addr: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: shoal\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let text = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, text)
}

/// A mock engine in a process of its own (one token per event, one event
/// about every 12 ms), killed when dropped.
struct MockProcess {
    child: std::process::Child,
    url: String,
}

impl MockProcess {
    fn start() -> Self {
        use std::io::{BufRead, BufReader};
        let shoal = shoal_tests::fleet::locate_shoal(None).unwrap();
        let bin = shoal.with_file_name("mock-engine");
        let mut child = std::process::Command::new(bin)
            .args(["--flavor", "sglang", "--tokens-per-chunk", "1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the mock-engine binary is built beside shoal");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let url = lines
            .find_map(|l| {
                let l = l.ok()?;
                let rest = l.strip_prefix("mock-engine listening on ")?;
                Some(rest.split_whitespace().next()?.to_string())
            })
            .expect("the mock engine listens");
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `{"model":"sink","prompt":[1,1,…]}` of about [`BODY_BYTES`].
fn numeric_prompt() -> Vec<u8> {
    let mut body = br#"{"model":"sink","max_tokens":1,"prompt":["#.to_vec();
    while body.len() < BODY_BYTES {
        body.extend_from_slice(b"1,");
    }
    body.extend_from_slice(b"1]}");
    body
}

/// `{"model":"sink","prompt":[[[[…]]]]}` of about [`BODY_BYTES`].
fn nested() -> Vec<u8> {
    let depth = (BODY_BYTES - 64) / 2;
    let mut body = br#"{"model":"sink","prompt":"#.to_vec();
    body.extend(std::iter::repeat_n(b'[', depth));
    body.extend(std::iter::repeat_n(b']', depth));
    body.push(b'}');
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_stay_within_memory_and_do_not_stall_streams() {
    run_for(Duration::from_secs(120), async {
        let sink = sink();
        let mock = MockProcess::start();
        // One I/O thread: the stream and the hostile bodies share it.
        let shoal = SoloShoal::start(
            "",
            &format!(
                "--io-threads 1 --worker-load-source none --worker-urls http://{sink} {}",
                mock.url
            ),
        );
        let base = shoal.base();
        let client = HttpClient::new();
        let idle_kb = shoal.status_kb("VmHWM").unwrap();

        for (name, body, expect) in [
            ("numeric prompt", numeric_prompt(), 200),
            ("nested", nested(), 400),
        ] {
            let mut stream = client
                .post_stream(
                    &format!("{base}/v1/chat/completions"),
                    &shoal_tests::workload::chat("keep streaming", 400, true),
                    &[],
                )
                .await
                .unwrap();
            assert_eq!(stream.status, 200);
            stream.next_data().await.unwrap().unwrap();
            let len = body.len();
            let big = tokio::spawn({
                let addr = shoal.addr.clone();
                async move {
                    let started = Instant::now();
                    let (status, text) = post_raw(&addr, &body).await;
                    (status, text, started.elapsed())
                }
            });
            // Gaps between stream events while the body is sent and parsed.
            let mut gaps = Vec::new();
            let mut last = Instant::now();
            while !big.is_finished() {
                let Some(_) = stream.next_data().await.unwrap() else {
                    break;
                };
                gaps.push(last.elapsed());
                last = Instant::now();
            }
            let events = gaps.len();
            gaps.sort_unstable();
            let worst = gaps.last().copied().unwrap_or_default();
            let median = gaps.get(events / 2).copied().unwrap_or_default();
            let (status, text, took) = big.await.unwrap();
            let peak_kb = shoal.status_kb("VmHWM").unwrap();
            println!(
                "{name} ({len} bytes): {status} in {took:?}; stream: {events} events, median gap {median:?}, \
                 worst gap {worst:?}; \
                 VmHWM {} MB (idle {} MB) = {:.2} x the body",
                peak_kb / 1000,
                idle_kb / 1000,
                peak_kb as f64 * 1000.0 / len as f64
            );
            assert_eq!(status, expect, "{name}: {text}");
            assert!(events > 0, "{name}: the stream flowed while the body was handled");
            // A body parsed on the stream's I/O thread holds it for the
            // whole parse (seconds for the numeric prompt); scheduling
            // jitter on a loaded host is a few of the stream's own gaps.
            // So the bound is a multiple of the gap measured here, not a
            // wall-clock figure.
            let bound = median * 10 + Duration::from_millis(20);
            assert!(
                worst < bound,
                "{name}: the stream stalled for {worst:?} (median gap {median:?}, bound {bound:?})"
            );
            assert!(
                (peak_kb as usize) * 1000 < 3 * len,
                "{name}: peak RSS {peak_kb} kB over 3 x {len} bytes"
            );
        }
    })
    .await;
}

/// Starts a request declaring `len` body bytes and sends only its head:
/// the replica holds the budget for it while it waits for the body.
async fn declare_body(addr: &str, len: usize) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: shoal\r\ncontent-type: application/json\r\n\
         content-length: {len}\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_budget_answers_503_with_a_reason() {
    run_for(Duration::from_secs(60), async {
        let sink = sink();
        let shoal = SoloShoal::start(
            "",
            &format!(
                "--worker-load-source none --worker-urls http://{sink} \
                 --max-buffered-request-bytes 3000000"
            ),
        );
        let base = shoal.base();
        let client = HttpClient::new();
        // Two declared 1.2 MB bodies hold 2.4 MB of the 3 MB budget...
        let held = [
            declare_body(&shoal.addr, 1_200_000).await,
            declare_body(&shoal.addr, 1_200_000).await,
        ];
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ...so a third of the same size does not fit.
        let body = format!(r#"{{"model":"sink","prompt":"{}"}}"#, "a".repeat(1_200_000));
        let refused = client
            .post_raw(&format!("{base}/v1/completions"), body.clone())
            .await
            .unwrap();
        println!("third body: {} {}", refused.status, refused.text());
        assert_eq!(refused.status, 503);
        assert!(refused.header("retry-after").is_some());
        let error = refused.json().unwrap();
        assert_eq!(error["error"]["code"], "request_buffer_full");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--max-buffered-request-bytes"),
            "{error}"
        );
        // A small body still fits; once the held ones go, so does a large one.
        let small = client
            .post_raw(
                &format!("{base}/v1/completions"),
                r#"{"model":"sink","prompt":"hi"}"#,
            )
            .await
            .unwrap();
        assert_eq!(small.status, 200, "{}", small.text());
        drop(held);
        let mut accepted = None;
        for _ in 0..50 {
            let again = client
                .post_raw(&format!("{base}/v1/completions"), body.clone())
                .await
                .unwrap();
            if again.status == 200 {
                accepted = Some(again);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            accepted.is_some(),
            "the budget was given back when the held bodies' clients left"
        );
        let metrics = client.get(&format!("{base}/metrics")).await.unwrap().text();
        assert!(
            counter(
                &metrics,
                "shoal_admission_rejected_total",
                "request_buffer_full"
            ) >= 1,
            "refusals are counted"
        );
    })
    .await;
}
