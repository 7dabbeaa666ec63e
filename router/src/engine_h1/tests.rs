//! The engine client against scripted engines on real loopback sockets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(2);

/// The connector of these tests (plain HTTP engines; the TLS configuration
/// is built once).
fn connector() -> Connector {
    static TLS: std::sync::LazyLock<std::sync::Arc<rustls::ClientConfig>> =
        std::sync::LazyLock::new(|| {
            crate::engine_tls::client_config(&crate::engine_tls::EngineTlsFiles::default()).unwrap()
        });
    Connector {
        timeout: TIMEOUT,
        tls: TLS.clone(),
    }
}

/// Reads one request (head and `content-length` body) from `stream`;
/// `None` at end-of-file.
async fn read_request(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
            let body_len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            let total = end + 4 + body_len;
            if pending.len() >= total {
                return Some(pending.drain(..total).collect());
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&chunk[..n]);
    }
}

/// An engine that answers every request on every connection with what
/// `answer(connection_index, request_index)` returns (`None`: close the
/// connection instead). Returns its base URL, the number of connections
/// accepted, and the raw requests received.
async fn engine(
    answer: impl Fn(usize, usize) -> Option<Vec<u8>> + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>, mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let (requests_tx, requests) = mpsc::unbounded_channel();
    let answer = Arc::new(answer);
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let index = counter.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            let requests_tx = requests_tx.clone();
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut served = 0;
                while let Some(request) = read_request(&mut stream, &mut pending).await {
                    let _ = requests_tx.send(request);
                    match answer(index, served) {
                        Some(bytes) => stream.write_all(&bytes).await.unwrap(),
                        None => return,
                    }
                    served += 1;
                }
            });
        }
    });
    (url, accepted, requests)
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn post(base: &str, body: &'static str) -> Result<Response<EngineBody>, EngineError> {
    post_with(base, body, &HeaderMap::new()).await
}

async fn post_with(
    base: &str,
    body: &'static str,
    headers: &HeaderMap,
) -> Result<Response<EngineBody>, EngineError> {
    send_as(&Method::POST, base, body, headers).await
}

async fn send_as(
    method: &Method,
    base: &str,
    body: &'static str,
    headers: &HeaderMap,
) -> Result<Response<EngineBody>, EngineError> {
    let body = Bytes::from_static(body.as_bytes());
    let request = Request {
        method,
        path_and_query: "/v1/chat/completions",
        headers,
        authorization: super::Authorization::Forward,
        traceparent: None,
        body: &body,
    };
    send(base, request, &connector()).await
}

async fn text(response: Response<EngineBody>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn authority(url: &str) -> &str {
    url.strip_prefix("http://").unwrap()
}

#[tokio::test]
async fn a_connection_is_reused_once_its_response_was_read() {
    let (url, accepted, mut requests) = engine(|_, i| Some(ok(&format!("answer {i}")))).await;
    for i in 0..3 {
        let response = post(&url, "{}").await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(text(response).await, format!("answer {i}"));
        assert_eq!(idle_count(authority(&url)), 1, "back in the pool");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let wire = String::from_utf8(requests.recv().await.unwrap()).unwrap();
    assert!(
        wire.starts_with("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:"),
        "{wire}"
    );
    assert!(wire.ends_with("content-length: 2\r\n\r\n{}"), "{wire}");
}

#[tokio::test]
async fn the_path_prefix_and_end_to_end_headers_are_forwarded() {
    let (url, _, mut requests) = engine(|_, _| Some(ok("x"))).await;
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer t".parse().unwrap());
    headers.insert("connection", "x-hop".parse().unwrap());
    headers.insert("x-hop", "1".parse().unwrap());
    text(
        post_with(&format!("{url}/engine-a"), "{}", &headers)
            .await
            .unwrap(),
    )
    .await;
    let wire = String::from_utf8(requests.recv().await.unwrap()).unwrap();
    assert!(
        wire.starts_with("POST /engine-a/v1/chat/completions HTTP/1.1\r\n"),
        "{wire}"
    );
    assert!(wire.contains("\r\nauthorization: Bearer t\r\n"), "{wire}");
    assert!(!wire.contains("x-hop"), "{wire}");
}

/// Serves one chunked event stream: `before` right after the head, then
/// `after` once the gate is opened (so it is all read at once); returns
/// the URL and the gate. The connection is held open until the client is
/// done with it.
async fn gated_engine(
    before: &'static [u8],
    after: &'static [u8],
) -> (String, mpsc::UnboundedSender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (gate_tx, mut gate_rx) = mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut pending = Vec::new();
        read_request(&mut stream, &mut pending).await.unwrap();
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(before).await.unwrap();
        gate_rx.recv().await.unwrap();
        stream.write_all(after).await.unwrap();
        read_request(&mut stream, &mut pending).await;
    });
    (url, gate_tx)
}

#[tokio::test]
async fn a_chunked_stream_arrives_frame_by_frame() {
    // The second event only after the client holds the first.
    let (url, gate) = gated_engine(b"8\r\ndata: 1\n\r\n", b"8\r\ndata: 2\n\r\n0\r\n\r\n").await;
    let response = post(&url, "{}").await.unwrap();
    assert!(response.headers().get("transfer-encoding").is_none());
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: 1\n");
    gate.send(()).unwrap();
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&second[..], b"data: 2\n");
    assert!(body.is_end_stream(), "the end was read with the last chunk");
    assert!(body.frame().await.is_none());
    assert_eq!(idle_count(authority(&url)), 1);
}

#[tokio::test]
async fn small_chunks_read_together_are_handed_on_as_one_frame_and_an_error_after_them() {
    let events = b"8\r\ndata: 1\n\r\n8\r\ndata: 2\n\r\n8\r\ndata: 3\n\r\nzz\r\n";
    let (url, gate) = gated_engine(b"", events).await;
    let mut body = post(&url, "{}").await.unwrap().into_body();
    gate.send(()).unwrap();
    // Let the whole burst reach this side's socket before the first read.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let joined = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&joined[..], b"data: 1\ndata: 2\ndata: 3\n");
    let error = body.frame().await.unwrap().unwrap_err().to_string();
    assert!(error.contains("chunk"), "{error}");
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn a_reused_connection_the_engine_closed_is_replaced_for_an_idempotent_request() {
    // Every connection answers once; the next request on it is read whole
    // and the connection closed without an answer.
    let (url, accepted, mut requests) = engine(|_, i| (i == 0).then(|| ok("fresh"))).await;
    let get = |url: String| async move {
        send_as(&Method::GET, &url, "", &HeaderMap::new())
            .await
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(text(get(url.clone()).await).await, "fresh");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    let mut received = 0;
    while requests.try_recv().is_ok() {
        received += 1;
    }
    assert_eq!(received, 5, "the two dropped requests were sent again");
}

#[tokio::test]
async fn a_post_on_a_reused_connection_closed_after_the_write_is_not_sent_again() {
    let (url, accepted, mut requests) = engine(|_, i| (i == 0).then(|| ok("fresh"))).await;
    assert_eq!(text(post(&url, "{}").await.unwrap()).await, "fresh");
    assert_eq!(idle_count(authority(&url)), 1);
    let err = post(&url, "{}").await.unwrap_err();
    assert!(matches!(err, EngineError::ClosedBeforeAnswer), "{err}");
    assert_eq!(err.progress(), Progress::DeliveredNoAnswer);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "no second connection");
    assert!(requests.recv().await.is_some());
    assert!(requests.recv().await.is_some(), "the engine read it whole");
    assert!(requests.try_recv().is_err(), "and got it once");
}

#[tokio::test]
async fn a_post_whose_connect_fails_reports_that_nothing_was_delivered() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let err = post(&closed, "{}").await.unwrap_err();
    assert_eq!(err.progress(), Progress::NotDelivered, "{err}");
}

#[tokio::test]
async fn connection_close_and_http_1_0_answers_are_not_pooled() {
    let (url, accepted, _requests) = engine(|_, _| {
        Some(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".to_vec())
    })
    .await;
    assert_eq!(text(post(&url, "{}").await.unwrap()).await, "ok");
    assert_eq!(idle_count(authority(&url)), 0);
    let (url10, _, _r) =
        engine(|_, _| Some(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec())).await;
    assert_eq!(text(post(&url10, "{}").await.unwrap()).await, "ok");
    assert_eq!(idle_count(authority(&url10)), 0);
    assert_eq!(text(post(&url, "{}").await.unwrap()).await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_body_until_close_ends_at_end_of_file() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_request(&mut stream, &mut Vec::new()).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
            .await
            .unwrap();
    });
    assert_eq!(text(post(&url, "{}").await.unwrap()).await, "until the end");
    assert_eq!(idle_count(authority(&url)), 0);
}

#[tokio::test]
async fn dropping_the_body_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (closed_tx, mut closed) = mpsc::unbounded_channel::<bool>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut pending = Vec::new();
        read_request(&mut stream, &mut pending).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            .await
            .unwrap();
        // The client drops the body: the next read sees end-of-file.
        let saw_eof = read_request(&mut stream, &mut pending).await.is_none();
        closed_tx.send(saw_eof).unwrap();
    });
    let mut body = post(&url, "{}").await.unwrap().into_body();
    assert!(body.frame().await.unwrap().is_ok());
    drop(body);
    let saw_eof = tokio::time::timeout(TIMEOUT, closed.recv()).await.unwrap();
    assert_eq!(saw_eof, Some(true));
    assert_eq!(idle_count(authority(&url)), 0);
}

#[tokio::test]
async fn broken_answers_are_errors_that_name_the_problem() {
    let cases: [(&[u8], &str); 4] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf",
            "mid-response",
        ),
        (b"NOT HTTP\r\n\r\n", "malformed response head"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            "content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "chunk",
        ),
    ];
    for (wire, expected) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_request(&mut stream, &mut Vec::new()).await.unwrap();
            stream.write_all(wire).await.unwrap();
        });
        let error = match post(&url, "{}").await {
            Err(err) => err.to_string(),
            Ok(response) => response
                .into_body()
                .collect()
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        };
        assert!(error.contains(expected), "{wire:?}: {error}");
    }
}

#[tokio::test]
async fn a_refused_connect_and_a_bad_url_are_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let error = post(&url, "{}").await.unwrap_err();
    assert!(matches!(error, EngineError::Connect(_)), "{error}");
    let error = post("ftp://engine:8000", "{}").await.unwrap_err();
    assert!(matches!(error, EngineError::Url(_)), "{error}");
}

#[test]
fn https_targets_default_to_443_and_name_their_host_for_the_certificate() {
    let target = Target::parse("https://engine.example/v1").unwrap();
    assert!(target.tls);
    assert_eq!(target.connect_authority(), "engine.example:443");
    assert_eq!(
        target.server_name().unwrap(),
        rustls::pki_types::ServerName::try_from("engine.example").unwrap()
    );
    let ip = Target::parse("https://[::1]:8443").unwrap();
    assert_eq!(ip.connect_authority(), "[::1]:8443");
    assert_eq!(ip.server_name().unwrap().to_str(), "::1");
    assert!(!Target::parse("http://engine:80").unwrap().tls);
}

#[test]
fn targets_split_host_and_prefix_and_default_the_port() {
    let target = Target::parse("http://engine:8000/prefix/a").unwrap();
    assert_eq!((target.host, target.prefix), ("engine:8000", "/prefix/a"));
    assert_eq!(target.connect_authority(), "engine:8000");
    let target = Target::parse("http://engine").unwrap();
    assert_eq!((target.host, target.prefix), ("engine", ""));
    assert_eq!(target.connect_authority(), "engine:80");
    assert_eq!(
        Target::parse("http://[::1]").unwrap().connect_authority(),
        "[::1]:80"
    );
    assert_eq!(
        Target::parse("http://[::1]:9000")
            .unwrap()
            .connect_authority(),
        "[::1]:9000"
    );
    assert!(Target::parse("http:///x").is_err());
}

/// A side GET of `/health` through `pool`.
async fn side_get(pool: &SidePool, base: &str, max_bytes: usize) -> Result<String, SideError> {
    let (headers, body) = (HeaderMap::new(), Bytes::new());
    let request = Request {
        method: &Method::GET,
        path_and_query: "/health",
        headers: &headers,
        authorization: super::Authorization::Drop,
        traceparent: None,
        body: &body,
    };
    let (status, body) = pool.fetch(base, request, &connector(), max_bytes).await?;
    assert_eq!(status, http::StatusCode::OK);
    Ok(String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_requests_share_one_connection_per_engine_whatever_thread_sends_them() {
    let (url, accepted, _requests) = engine(|_, _| Some(ok("fine"))).await;
    let pool = Arc::new(SidePool::default());
    for _ in 0..20 {
        // Each request from a task of its own, so they run on both threads.
        let (pool, url) = (pool.clone(), url.clone());
        let answer = tokio::spawn(async move { side_get(&pool, &url, 1024).await })
            .await
            .unwrap();
        assert_eq!(answer.unwrap(), "fine");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(pool.idle_count(), 1);
    // The proxy's per-thread pool did not get it.
    assert_eq!(conn::idle_count(authority(&url)), 0);
}

#[tokio::test]
async fn a_side_answer_over_its_limit_is_refused_and_its_connection_not_kept() {
    let (url, accepted, _requests) = engine(|_, _| Some(ok("0123456789"))).await;
    let pool = SidePool::default();
    let refused = side_get(&pool, &url, 5).await;
    assert!(
        matches!(refused, Err(SideError::TooLarge(5))),
        "{refused:?}"
    );
    assert_eq!(pool.idle_count(), 0);
    assert_eq!(side_get(&pool, &url, 10).await.unwrap(), "0123456789");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_side_connection_the_engine_closed_is_replaced() {
    // Each connection answers one request, then closes on the next.
    let (url, accepted, _requests) = engine(|_, served| (served == 0).then(|| ok("once"))).await;
    let pool = SidePool::default();
    assert_eq!(side_get(&pool, &url, 64).await.unwrap(), "once");
    assert_eq!(pool.idle_count(), 1);
    assert_eq!(side_get(&pool, &url, 64).await.unwrap(), "once");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
