//! Starting engines: the accept loop, connection tasks and the handle.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::chat_template::ChatTemplate;
use super::config::EngineConfig;
use super::engine::{Engine, FaultMode};
use super::http::router;
use super::kv_events::{KvEventsInfo, bind_sockets};
use super::snapshot::ModelSnapshot;
use super::tokens::{Blocker, load_tokenizer};

/// A running engine. Dropping the handle stops the engine.
#[derive(Debug)]
pub struct EngineHandle {
    addr: SocketAddr,
    engine: Arc<Engine>,
    server: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// The address the engine listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where the engine publishes KV-cache events (`--kv-events-port`).
    pub fn kv_events(&self) -> Option<&KvEventsInfo> {
        self.engine.kv_events()
    }

    /// The engine's shared state.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// A view of the engine's model state now.
    pub fn snapshot(&self) -> ModelSnapshot {
        self.engine.snapshot()
    }

    /// Load-endpoint requests served so far (see [`Engine::load_polls`]).
    pub fn load_polls(&self) -> u64 {
        self.engine.load_polls()
    }

    /// Switches the engine's fault mode (`Die` stops it).
    pub fn set_fault(&self, mode: FaultMode) {
        self.engine.set_fault(mode);
    }

    /// Stops the engine (closing its listener and connections) and waits.
    pub async fn shutdown(mut self) {
        self.engine.kill();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    /// Waits until the engine stops (after `Die` or [`Engine::kill`]).
    pub async fn stopped(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.engine.kill();
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// Validates `config`, binds `addr` (port 0 for an ephemeral port) and starts
/// the engine's server and scheduler on the current tokio runtime.
pub async fn spawn_engine(config: EngineConfig, addr: SocketAddr) -> io::Result<EngineHandle> {
    config.validate().map_err(invalid)?;
    let listener = TcpListener::bind(addr).await?;
    spawn_engine_on(config, listener).await
}

/// Like [`spawn_engine`] on an already bound listener. KV-event sockets,
/// if configured, are bound on the listener's IP address.
pub async fn spawn_engine_on(
    config: EngineConfig,
    listener: TcpListener,
) -> io::Result<EngineHandle> {
    config.validate().map_err(invalid)?;
    let blocker = blocker_for(&config)?;
    start(config, listener, blocker).await
}

/// How `config` cuts prompts into blocks, loading its tokenizer if any.
fn blocker_for(config: &EngineConfig) -> io::Result<Blocker> {
    Ok(match &config.tokenizer {
        None => Blocker::Chars(config.prefix_block_chars),
        Some(path) => Blocker::Tokens {
            tokenizer: load_tokenizer(path).map_err(invalid)?,
            block_size: config.kv_block_size,
            chat_template: match &config.chat_template {
                Some(path) => Some(Arc::new(ChatTemplate::load(path).map_err(invalid)?)),
                None => None,
            },
        },
    })
}

async fn start(
    config: EngineConfig,
    listener: TcpListener,
    blocker: Blocker,
) -> io::Result<EngineHandle> {
    let addr = listener.local_addr()?;
    let kv = bind_sockets(&config, addr.ip(), config.kv_block_size).await?;
    let (link, sockets) = kv.unzip();
    let engine = Engine::new(config, blocker, link);
    engine.pd.set_addr(addr);
    if let Some(sockets) = sockets {
        sockets.spawn(engine.dead_watch());
    }
    let server = tokio::spawn(serve(engine.clone(), listener));
    Ok(EngineHandle {
        addr,
        engine,
        server: Some(server),
    })
}

/// Port `base + i` for engine `i` of `n`, or 0 (ephemeral) when `base` is 0.
fn nth_port(flag: &str, base: u16, i: usize, n: usize) -> io::Result<u16> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(i)
        .ok()
        .and_then(|i| base.checked_add(i))
        .ok_or_else(|| invalid(format!("{flag} {base} + {n} engines exceeds 65535")))
}

/// Starts `n` engines with the same configuration on `host`: engine `i` on
/// `base_port + i`, or each on an ephemeral port when `base_port` is 0.
/// KV-event ports are offset the same way (one tokenizer load for all).
pub async fn spawn_engines(
    config: &EngineConfig,
    host: IpAddr,
    base_port: u16,
    n: usize,
) -> io::Result<Vec<EngineHandle>> {
    config.validate().map_err(invalid)?;
    let blocker = blocker_for(config)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let port = nth_port("--base-port", base_port, i, n)?;
        let mut cfg = config.clone();
        if let Some(p) = config.kv_events_port {
            cfg.kv_events_port = Some(nth_port("--kv-events-port", p, i, n)?);
        }
        if let Some(p) = config.kv_events_replay_port {
            cfg.kv_events_replay_port = Some(nth_port("--kv-events-replay-port", p, i, n)?);
        }
        let listener = TcpListener::bind(SocketAddr::new(host, port)).await?;
        out.push(start(cfg, listener, blocker.clone()).await?);
    }
    Ok(out)
}

async fn serve(engine: Arc<Engine>, listener: TcpListener) {
    let app = router(engine.clone());
    let mut dead = engine.dead_watch();
    let scheduler = tokio::spawn(engine.clone().run_scheduler());
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = async { let _ = dead.wait_for(|d| *d).await; } => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let svc = TowerToHyperService::new(app.clone());
                    conns.spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                // Out of file descriptors and the like: back off briefly.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
    scheduler.abort();
}
