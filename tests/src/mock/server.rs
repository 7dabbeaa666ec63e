//! Starting engines: the accept loop, connection tasks and the handle.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::config::EngineConfig;
use super::engine::{Engine, FaultMode};
use super::http::router;
use super::snapshot::ModelSnapshot;

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

/// Like [`spawn_engine`] on an already bound listener.
pub async fn spawn_engine_on(
    config: EngineConfig,
    listener: TcpListener,
) -> io::Result<EngineHandle> {
    config.validate().map_err(invalid)?;
    let addr = listener.local_addr()?;
    let engine = Engine::new(config);
    let server = tokio::spawn(serve(engine.clone(), listener));
    Ok(EngineHandle {
        addr,
        engine,
        server: Some(server),
    })
}

/// Starts `n` engines with the same configuration on `host`: engine `i` on
/// `base_port + i`, or each on an ephemeral port when `base_port` is 0.
pub async fn spawn_engines(
    config: &EngineConfig,
    host: IpAddr,
    base_port: u16,
    n: usize,
) -> io::Result<Vec<EngineHandle>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let port = if base_port == 0 {
            0
        } else {
            u16::try_from(i)
                .ok()
                .and_then(|i| base_port.checked_add(i))
                .ok_or_else(|| {
                    invalid(format!(
                        "--base-port {base_port} + {n} engines exceeds 65535"
                    ))
                })?
        };
        out.push(spawn_engine(config.clone(), SocketAddr::new(host, port)).await?);
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
