//! Wiring one replica together and serving it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use shoal_mesh::{Readiness, SharedWorkerSet};

use crate::config::{Config, DiscoveryKind};
use crate::engine_tls::{self, EngineTlsFiles};
use crate::fleet::{FleetView, LocalFleet, MeshFleet};
use crate::http::{self, state::AppState};
use crate::mesh_setup::{self, MeshStartError};
use crate::objects::ObjectTable;
use crate::request::Route;
use crate::serving::{self, FrontLimits, IoThreads};
use crate::sources::{WorkerSources, kubernetes};
use crate::supervise::supervised;
use crate::workers::Registry;
use crate::workers::health;
use crate::{engine_h1, load, policy, proxy, reload, telemetry, upstream};

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The HTTP listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// What was asked for.
        addr: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The mesh could not start (bad TLS material, ports in use, ...).
    #[error(transparent)]
    Mesh(#[from] MeshStartError),
    /// Keys or engine TLS files could not be read (the message names the flag).
    #[error("{0}")]
    Security(String),
    /// A policy's own files (a tokenizer) could not be loaded.
    #[error("{0}")]
    Policy(String),
}

/// A replica that is listening; drop-in for tests and `main`.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    /// Binds `--host:--port`, starts the mesh if configured, and builds the
    /// replica's state.
    pub async fn bind(config: Config) -> Result<Self, StartError> {
        let listener = TcpListener::bind((config.host.as_str(), config.port))
            .await
            .map_err(|source| StartError::Listen {
                addr: format!("{}:{}", config.host, config.port),
                source,
            })?;
        Self::start(config, listener).await
    }

    /// Builds the replica around an already bound listener (and starts the
    /// mesh if the flags turn it on).
    pub async fn start(config: Config, listener: TcpListener) -> Result<Self, StartError> {
        let http_addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: "the given listener".into(),
            source,
        })?;
        let removal_ttl = config.discovery.worker_removal_ttl();
        let timings = mesh_setup::MeshTimings {
            worker_removal_ttl: removal_ttl,
            snapshot_stale_after: config.load.stale_after(),
        };
        let mesh = mesh_setup::start(&config.mesh, http_addr, timings).await?;
        let registry = Arc::new(Registry::with_mesh(
            &config.seed_urls(),
            config.breaker.clone(),
            mesh.clone(),
            config.load.polls_engines(),
        ));
        let policy = policy::build(&config.routing);
        if let Some(error) = policy.kv_events().and_then(|kv| kv.load_error()) {
            return Err(StartError::Policy(error));
        }
        if let (Some(mesh), Some(sightings)) = (&mesh, policy.sightings()) {
            mesh_setup::share_sightings(mesh, &sightings);
        }
        let discovers_roles = config.discovery.discovery_role_label.is_some();
        let disagg = proxy::Disagg::new(&config.disagg, discovers_roles, &config.routing, &policy);
        for pool_policy in disagg.iter().flat_map(|d| d.policies()) {
            if let Some(error) = pool_policy.kv_events().and_then(|kv| kv.load_error()) {
                return Err(StartError::Policy(error));
            }
        }
        let objects = Arc::new(ObjectTable::new(config.proxy.stored_objects_capacity));
        if let Some(mesh) = &mesh {
            mesh_setup::share_objects(mesh, &objects);
        }
        let worker_set = match &mesh {
            Some(mesh) => mesh.worker_set(),
            None => SharedWorkerSet::local(config.mesh.node_name(), removal_ttl),
        };
        let sources = Arc::new(WorkerSources::new(
            registry.clone(),
            policy.clone(),
            worker_set,
            &config.seed_urls(),
        ));
        let fleet: Arc<dyn FleetView> = match &mesh {
            Some(_) => Arc::new(MeshFleet::new(config.load.stale_after())),
            None => Arc::new(LocalFleet::new(config.load.stale_after())),
        };
        let connect_timeout = config.proxy.connect_timeout();
        let security = &config.security;
        let tls = engine_tls::client_config(&EngineTlsFiles {
            ca: security.worker_tls_ca.as_deref(),
            cert: security.worker_tls_cert.as_deref(),
            key: security.worker_tls_key.as_deref(),
        })
        .map_err(StartError::Security)?;
        // Read once: the keys the gate admits and the tenants' limits come
        // from the same version of the file.
        let tenants_spec = config.security.tenants().map_err(StartError::Security)?;
        let auth = config
            .security
            .auth_with(tenants_spec.as_ref())
            .map_err(StartError::Security)?;
        let auth = Arc::new(ArcSwap::from_pointee(auth));
        let forwarder = proxy::Forwarder {
            connector: engine_h1::Connector {
                timeout: connect_timeout,
                tls: tls.clone(),
            },
            retry: config.retry.clone(),
            max_retries: config.retry.max_retries(),
            request_timeout: config.proxy.request_timeout(),
            attempt_timeout: config.proxy.attempt_timeout(),
            expose_worker: config.proxy.expose_worker_header,
            migration: proxy::MigrationConfig {
                limit: config.retry.migration_limit,
                max_text_bytes: config.retry.migration_max_text_bytes,
            },
        };
        let side_client = upstream::build_client(connect_timeout, tls).with_auth(auth.clone());
        // The recorder first: the route metrics register with it.
        let metrics = telemetry::install();
        let route_metrics =
            Route::ALL.map(|route| Arc::new(telemetry::RouteMetrics::register(route.label())));
        // After the recorder: each tenant registers its counters once.
        let tenants = tenants_spec.map(|spec| {
            let book = match &mesh {
                Some(mesh) => mesh.tenant_book(),
                None => Arc::new(shoal_mesh::TenantBook::local()),
            };
            crate::tenants::TenantGate::new(&spec, book)
        });
        let state = AppState {
            registry,
            sources,
            policy,
            fleet,
            forwarder,
            disagg,
            auth,
            side_client,
            route_metrics,
            metrics,
            mesh,
            objects,
            tenants,
            draining: AtomicBool::new(false),
            admission: crate::admission::Admission::from_config(&config.admission),
            buffer_budget: crate::admission::buffer::BufferBudget::new(
                config
                    .proxy
                    .buffer_budget(crate::admission::buffer::memory_limit()),
            ),
            config: Arc::new(config),
        };
        Ok(Self {
            listener,
            state: Arc::new(state),
        })
    }

    /// The address actually bound (useful with `--port 0`).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves on `--io-threads` I/O threads (see [`serving`]) until
    /// `shutdown` resolves, then drains: readiness turns 503
    /// (and `draining` is gossiped), the listener stays open for
    /// `--drain-settle-secs` so load balancers notice, then closes; in-flight
    /// requests finish, and the replica leaves the mesh.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = self.state;
        let config = state.config.clone();
        // Every background task runs supervised: a panic restarts it
        // instead of silently ending it (see `supervise`).
        let mut background = tokio::task::JoinSet::new();
        background.spawn(supervised("health", {
            let (registry, client) = (state.registry.clone(), state.side_client.clone());
            let health = config.health.clone();
            move || health::run(registry.clone(), client.clone(), health.clone())
        }));
        background.spawn(supervised("load", {
            let (registry, client) = (state.registry.clone(), state.side_client.clone());
            let monitor =
                load::MonitorConfig::new(&config.load, config.mesh.node_name(), state.mesh.clone());
            move || load::run(registry.clone(), client.clone(), monitor.clone())
        }));
        background.spawn(supervised("sources", {
            let sources = state.sources.clone();
            move || sources.clone().run()
        }));
        background.spawn(supervised("reload", {
            let state = state.clone();
            move || reload::on_sighup(state.clone())
        }));
        if config.discovery.discovery == DiscoveryKind::Kubernetes {
            background.spawn(supervised("discovery", {
                let (discovery, sources) = (config.discovery.clone(), state.sources.clone());
                move || kubernetes::run(discovery.clone(), sources.clone())
            }));
        }
        // The replica's policy, and a disaggregated fleet's pool policies
        // that are not that one.
        let mut policies = vec![state.policy.clone()];
        for pool_policy in state.disagg.iter().flat_map(|d| d.policies()) {
            if !policies.iter().any(|p| Arc::ptr_eq(p, pool_policy)) {
                policies.push(pool_policy.clone());
            }
        }
        for policy in policies {
            if policy.background_task().is_some() {
                background.spawn(supervised("policy", {
                    let policy = policy.clone();
                    move || {
                        policy
                            .background_task()
                            .unwrap_or_else(|| Box::pin(std::future::ready(())))
                    }
                }));
            }
            if let Some(kv) = policy.kv_events() {
                background.spawn(supervised("kv_events", {
                    let registry = state.registry.clone();
                    move || kv.clone().run(registry.clone())
                }));
            }
        }
        if let Some(handle) = state.metrics.clone() {
            background.spawn(supervised("metrics", move || {
                telemetry::upkeep(handle.clone())
            }));
        }
        let addr = self.listener.local_addr()?;
        let threads = serving::resolve_thread_count(config.io_threads);
        let mesh = state.mesh.clone();
        let front = http::Front::new(state.clone(), http::router(state.clone()));
        let nofile = rlimit::Resource::NOFILE
            .get()
            .map_or(1024, |(soft, _)| soft);
        let limits = FrontLimits {
            header_timeout: config.front.header_timeout(),
            max_connections: config.front.connection_cap(nofile),
            h2_max_streams: config.front.http2_max_concurrent_streams,
        };
        let io = IoThreads::start(self.listener, threads, limits, move |peer| {
            front.for_peer(peer)
        })?;
        tracing::info!(
            %addr,
            workers = state.registry.all().len(),
            policy = state.policy.name(),
            mesh = mesh.is_some(),
            io_threads = threads,
            max_client_connections = limits.max_connections,
            max_buffered_request_bytes = state.buffer_budget.limit(),
            "shoal listening on http://{addr}"
        );

        shutdown.await;
        state.draining.store(true, Ordering::Relaxed);
        if let Some(mesh) = &mesh {
            mesh.set_readiness(Readiness::Draining).await;
        }
        let settle = config.drain_settle();
        tracing::info!(
            settle_secs = settle.as_secs(),
            "draining: readiness is 503, listener closes after the settle time"
        );
        tokio::time::sleep(settle).await;
        // The I/O threads hold the router (and with it the state); dropping
        // ours lets the mesh be taken back once they are gone.
        drop(state);
        tracing::info!("listener closed; finishing in-flight requests");
        io.shutdown().await;
        background.shutdown().await;
        if let Some(mesh) = mesh {
            match Arc::try_unwrap(mesh) {
                Ok(mesh) => mesh.shutdown().await,
                Err(_) => {
                    tracing::warn!("mesh still in use at exit; peers will time this replica out")
                }
            }
        }
        Ok(())
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested: finishing in-flight requests");
}
