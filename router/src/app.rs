//! Wiring one replica together and serving it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::fleet::LocalFleet;
use crate::http::{self, state::AppState};
use crate::workers::health::{self, HealthConfig};
use crate::workers::{BreakerConfig, Registry};
use crate::{load, policy, proxy, telemetry, upstream};

/// A replica that is listening; drop-in for tests and `main`.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    /// Binds `--host:--port` and builds the replica's state.
    pub async fn bind(config: Config) -> std::io::Result<Self> {
        let listener = TcpListener::bind((config.host.as_str(), config.port)).await?;
        Ok(Self::with_listener(config, listener))
    }

    /// Builds the replica around an already bound listener.
    pub fn with_listener(config: Config, listener: TcpListener) -> Self {
        let registry = Arc::new(Registry::new(
            &config.worker_urls,
            BreakerConfig::from(&config),
        ));
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let state = AppState {
            registry,
            policy: policy::build(&config),
            fleet: Arc::new(LocalFleet::new(config.load_stale_after())),
            client: upstream::build_client(connect_timeout),
            side_client: upstream::build_client(connect_timeout),
            retry: proxy::RetryConfig::from(&config),
            request_timeout: proxy::request_timeout(&config),
            metrics: telemetry::install(),
            config: Arc::new(config),
        };
        Self {
            listener,
            state: Arc::new(state),
        }
    }

    /// The address actually bound (useful with `--port 0`).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then lets in-flight requests finish.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = self.state;
        let config = state.config.clone();
        let mut background = tokio::task::JoinSet::new();
        background.spawn(health::run(
            state.registry.clone(),
            upstream::build_client(Duration::from_millis(config.connect_timeout_ms)),
            HealthConfig::from(config.as_ref()),
        ));
        background.spawn(load::run(
            state.registry.clone(),
            upstream::build_client(Duration::from_millis(config.connect_timeout_ms)),
            load::MonitorConfig::from(config.as_ref()),
        ));
        if let Some(upkeep) = state.policy.background_task() {
            background.spawn(upkeep);
        }
        if let Some(handle) = state.metrics.clone() {
            background.spawn(telemetry::upkeep(handle));
        }
        let addr = self.listener.local_addr()?;
        tracing::info!(
            %addr,
            workers = state.registry.all().len(),
            policy = state.policy.name(),
            "shoal listening on http://{addr}"
        );
        let result = axum::serve(self.listener, http::router(state))
            .with_graceful_shutdown(shutdown)
            .await;
        background.shutdown().await;
        result
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
