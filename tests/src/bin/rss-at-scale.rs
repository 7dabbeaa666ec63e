//! Memory of one `shoal` process at scale: it routes to 1,000
//! workers (mock engines in this process), holds a 64-replica fleet view
//! (63 mesh peers in this process, each with a booking on every worker),
//! and carries 10,000 open streaming requests (HTTP/2 from this process,
//! 500 streams per connection: 10,000 HTTP/1.1 client sockets plus 10,000
//! engine sockets would not fit this machine's 20,000-descriptor limit).
//! Prints shoal's `VmRSS` and `VmHWM` after each stage.
//!
//! `cargo build --release -p shoal -p shoal-tests && target/release/rss-at-scale`
//! (`--workers N --peers N --streams N --shoal-bin PATH`).

use std::path::PathBuf;
use std::process::{Child, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use shoal_mesh::{Mesh, MeshConfig, PemSource, SlotBooking, TlsConfig};
use shoal_tests::fleet::{free_ports, gen_certs, locate_shoal, spawn_logged};
use shoal_tests::mock::{EngineConfig, spawn_engines};

/// One shoal process with many workers, a large fleet view and many streams.
#[derive(Debug, Parser)]
#[command(name = "rss-at-scale")]
struct Cli {
    /// Workers (mock engines, each on its own loopback port).
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// Mesh peers besides shoal (63 makes a 64-replica fleet view).
    #[arg(long, default_value_t = 63)]
    peers: usize,
    /// Streaming requests held open through shoal at once.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// HTTP/2 streams per client connection.
    #[arg(long, default_value_t = 500)]
    streams_per_connection: usize,
    /// The shoal binary (default: next to this one, or $SHOAL_BIN).
    #[arg(long)]
    shoal_bin: Option<PathBuf>,
    /// Extra shoal flags, one per occurrence (`--shoal-arg=--worker-load-source=none`).
    #[arg(long = "shoal-arg", allow_hyphen_values = true)]
    shoal_args: Vec<String>,
    /// Seconds the streams are held open after they are all open, with
    /// the memory printed every 10 s (at least one report).
    #[arg(long, default_value_t = 10)]
    hold_secs: u64,
    /// Give up on a stage after this many seconds.
    #[arg(long, default_value_t = 400)]
    stage_timeout_secs: u64,
}

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn memory(pid: u32) -> (f64, f64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(stage: &str, pid: u32) {
    let (rss, hwm) = memory(pid);
    println!("{stage:<58} | RSS {rss:>7.1} MiB | peak {hwm:>7.1} MiB");
}

/// Kills shoal when the run ends, however it ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_peers(
    n: usize,
    dir: &std::path::Path,
    seed: String,
    urls: &[String],
) -> Result<(Vec<Mesh>, Vec<SlotBooking>), String> {
    let mut meshes = Vec::with_capacity(n);
    let mut bookings = Vec::with_capacity(n * urls.len());
    let any = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    for i in 1..=n {
        let name = format!("peer-{i}");
        let tls = TlsConfig {
            ca: PemSource::Path(dir.join("ca.pem")),
            cert: PemSource::Path(dir.join(format!("{name}.pem"))),
            key: PemSource::Path(dir.join(format!("{name}-key.pem"))),
        };
        let mut config = MeshConfig::new(name.clone(), "shoal", any, any, tls);
        config.seeds = vec![seed.clone()];
        // 63 nodes share this process and 2 cores with shoal: slow timings
        // keep them alive (the view's size, not its speed, is measured).
        config.sync_interval = Duration::from_millis(500);
        config.push_min_gap = Duration::from_millis(500);
        config.link_keepalive = Duration::from_secs(2);
        config.link_idle_timeout = Duration::from_secs(20);
        config.failure_detector.gossip_interval = Duration::from_secs(1);
        config.failure_detector.initial_interval = Duration::from_secs(5);
        let mesh = Mesh::start(config)
            .await
            .map_err(|e| format!("starting {name}: {e}"))?;
        for url in urls {
            bookings.push(mesh.worker(url).book(500, 756));
        }
        meshes.push(mesh);
    }
    Ok((meshes, bookings))
}

/// Opens `total` streams over connections of `per_conn`; returns when every
/// one has its first body frame (or the deadline passes) with the count.
async fn open_streams(
    addr: &str,
    total: usize,
    per_conn: usize,
    deadline: Instant,
) -> Result<(u64, u64), String> {
    let first = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let body = Bytes::from_static(
        br#"{"model":"mock/Qwen3-8B","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"keep this stream open"}]}"#,
    );
    let mut opened = 0;
    while opened < total {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to shoal: {e}"))?;
        let (sender, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| format!("HTTP/2 handshake with shoal: {e}"))?;
        tokio::spawn(conn);
        for _ in 0..per_conn.min(total - opened) {
            opened += 1;
            let mut sender = sender.clone();
            let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .map_err(|e| e.to_string())?;
            let (first, failed) = (first.clone(), failed.clone());
            tokio::spawn(async move {
                let response = match sender.send_request(request).await {
                    Ok(r) if r.status().is_success() => r,
                    outcome => {
                        if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                            let why = match outcome {
                                Ok(r) => format!("status {}", r.status()),
                                Err(e) => e.to_string(),
                            };
                            eprintln!("rss-at-scale: first failed stream: {why}");
                        }
                        return;
                    }
                };
                let mut body = response.into_body();
                let mut seen = false;
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        break;
                    }
                    if !seen {
                        seen = true;
                        first.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    while Instant::now() < deadline
        && first.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < total as u64
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((
        first.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    ))
}

async fn run(cli: Cli) -> Result<(), String> {
    let stage_timeout = Duration::from_secs(cli.stage_timeout_secs);
    let shoal = locate_shoal(cli.shoal_bin.as_deref()).map_err(|e| e.0)?;
    let engine = EngineConfig {
        // One decode step every 0.6 s wall: streams stay open for the run
        // and the engines' own CPU stays small.
        time_scale: 0.02,
        tokens_per_chunk: 1,
        max_running: 64,
        ..EngineConfig::default()
    };
    let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
    let engines = spawn_engines(&engine, localhost, 0, cli.workers)
        .await
        .map_err(|e| format!("starting {} mock engines: {e}", cli.workers))?;
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut names = vec!["shoal-0".to_string()];
    names.extend((1..=cli.peers).map(|i| format!("peer-{i}")));
    gen_certs(&shoal, dir.path(), &names).map_err(|e| e.0)?;
    let (tcp, udp) = free_ports(1, 2).map_err(|e| e.0)?;
    let file = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    let args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        &tcp[0].to_string(),
        "--worker-urls",
        &urls.join(","),
        "--http2-max-concurrent-streams",
        &cli.streams_per_connection.max(1).to_string(),
        "--mesh-name",
        "shoal-0",
        "--mesh-host",
        "127.0.0.1",
        "--mesh-port",
        &udp[0].to_string(),
        "--mesh-quic-port",
        &udp[1].to_string(),
        "--mesh-tls-ca",
        &file("ca.pem"),
        "--mesh-tls-cert",
        &file("shoal-0.pem"),
        "--mesh-tls-key",
        &file("shoal-0-key.pem"),
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(cli.shoal_args.iter().cloned())
    .collect();
    let log = dir.path().join("shoal.log");
    let (child, addr) = spawn_logged(&shoal, &args, &[], &log, stage_timeout)
        .await
        .map_err(|e| e.0)?;
    let pid = child.id();
    let _reaper = Reaper(child);
    println!(
        "rss-at-scale: {} workers, {} mesh peers, {} streams ({} per HTTP/2 connection), shoal {}",
        cli.workers,
        cli.peers,
        cli.streams,
        cli.streams_per_connection,
        shoal.display()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    report(
        &format!("1. {} workers, no peers, no streams", cli.workers),
        pid,
    );

    let (peers, bookings) = start_peers(
        cli.peers,
        dir.path(),
        format!("127.0.0.1:{}", udp[0]),
        &urls,
    )
    .await?;
    // Shoal's own view decides: every peer counted, every entry held.
    let client = shoal_tests::client::HttpClient::new();
    let want = (cli.peers * cli.workers) as u64;
    let deadline = Instant::now() + stage_timeout;
    loop {
        let held = match client.get(&format!("http://{addr}/mesh/status")).await {
            Ok(r) => r.json().ok().and_then(|v| {
                let state = &v["footprint"]["state"];
                Some((
                    state["incarnations"].as_u64()?,
                    state["slot_entries"].as_u64()?,
                ))
            }),
            Err(_) => None,
        };
        if held.is_some_and(|(incs, entries)| incs >= cli.peers as u64 && entries >= want) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "shoal's view did not reach {} peers × {} workers within the stage timeout (held: {held:?})",
                cli.peers, cli.workers
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    report(
        &format!(
            "2. + a {}-replica view ({} booked entries)",
            cli.peers + 1,
            bookings.len()
        ),
        pid,
    );

    let (ok, failed) = open_streams(
        &addr,
        cli.streams,
        cli.streams_per_connection.max(1),
        Instant::now() + stage_timeout,
    )
    .await?;
    report(&format!("3. + {ok} open streams ({failed} failed)"), pid);
    // Every 10 s while the streams run: memory that keeps growing is a
    // leak, memory that settles is what the allocator keeps.
    for held in (10..=cli.hold_secs.max(10)).step_by(10) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        report(&format!("4. the same, {held} s later"), pid);
    }
    if ok < cli.streams as u64 {
        return Err(format!(
            "only {ok} of {} streams opened ({failed} failed); see {}",
            cli.streams,
            log.display()
        ));
    }
    drop(bookings);
    for peer in peers {
        peer.shutdown().await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rss-at-scale: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rss-at-scale: {e}");
            ExitCode::FAILURE
        }
    }
}
