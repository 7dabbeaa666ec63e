//! Live reload: on SIGHUP, or when the `--config`, `--api-keys-file` or
//! `--tenants-file` file changes (checked every 10 s: a Kubernetes ConfigMap or Secret
//! volume changes in place), the configuration is read again (the same
//! flags and variables, the files' new content) and what can change while
//! serving is applied without dropping a request:
//!
//! - the API keys (inference, admin, worker) and the tenants file's
//!   tenants, keys and limits (usage so far is kept by tenant name),
//! - `--worker-urls` (this replica's seeds; the sources reconcile),
//! - the policy's knobs (thresholds, ε, weights: the policy keeps what it
//!   learned; switching `--policy` itself needs a restart),
//! - `--log-level` (unless `RUST_LOG` is set).
//!
//! A file that does not parse or validate is rejected whole: nothing
//! changes, the reason is logged, and `shoal_config_reloads_total
//! {result="rejected"}` counts it. Settings that need a restart (ports,
//! mesh, I/O threads, TLS files, ...) are named in a warning when they
//! differ; everything else still applies.

use std::sync::Arc;

use crate::config::Config;
use crate::http::state::AppState;
use crate::{logging, telemetry};

/// What one reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings applied.
    pub applied: Vec<&'static str>,
    /// Settings that differ but need a restart.
    pub need_restart: Vec<&'static str>,
}

/// Reads the configuration again and applies it to `state`, or leaves
/// everything as it was and says why.
pub fn reload(state: &AppState) -> Result<Reloaded, String> {
    let current = state.config.as_ref();
    let new = Config::load_from(current.argv.0.clone()).map_err(|e| e.to_string())?;
    // Everything that can fail first: then nothing is half applied.
    let tenants = new.security.tenants()?;
    if state.tenants.is_some() != tenants.is_some() {
        // Tenant keys without their gate would pass unlimited, and a gate
        // without its keys would refuse them: neither half applies.
        return Err(
            "--tenants-file was added or removed: that needs a restart; \
                    nothing was applied"
                .into(),
        );
    }
    let auth = new.security.auth_with(tenants.as_ref())?;
    logging::parse_level(&new.log_level)?;
    let mut done = Reloaded::default();
    // The new limits before the new keys: a new tenant key is never
    // admitted before its limits are in force.
    if let (Some(gate), Some(spec)) = (&state.tenants, &tenants) {
        gate.replace(spec);
        done.applied.push("tenants");
    }
    state.auth.store(Arc::new(auth));
    done.applied.push("keys");
    // The pools' workers are seeds too; a changed pool needs a restart
    // (below), so the seeds keep the current pools'.
    let seeds = crate::config::seeds_with_pools(&new.worker_urls, &current.disagg);
    state.sources.set_seeds(&seeds);
    done.applied.push("worker-urls");
    if new.routing.policy == current.routing.policy {
        state.policy.reconfigure(&new.routing);
        done.applied.push("policy knobs");
    } else {
        done.need_restart.push("policy");
    }
    if logging::set_level(&new.log_level) {
        done.applied.push("log-level");
    }
    let restart_only = [
        (
            "host/port",
            (&new.host, new.port) != (&current.host, current.port),
        ),
        ("io-threads", new.io_threads != current.io_threads),
        (
            "mesh",
            format!("{:?}", new.mesh) != format!("{:?}", current.mesh),
        ),
        ("discovery", new.discovery != current.discovery),
        ("proxy", new.proxy != current.proxy),
        ("retry", new.retry != current.retry),
        ("disaggregation", new.disagg != current.disagg),
        ("admission", new.admission != current.admission),
        ("health", new.health != current.health),
        ("load polling", new.load != current.load),
        (
            "engine TLS",
            (&new.security.worker_tls_ca, &new.security.worker_tls_cert)
                != (
                    &current.security.worker_tls_ca,
                    &current.security.worker_tls_cert,
                ),
        ),
    ];
    done.need_restart.extend(
        restart_only
            .into_iter()
            .filter(|(_, changed)| *changed)
            .map(|(name, _)| name),
    );
    Ok(done)
}

/// How often the `--config`, `--api-keys-file` and `--tenants-file` files are checked for a
/// change (a Kubernetes ConfigMap or Secret volume is updated in place,
/// and nothing sends a SIGHUP then).
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The content of the files a reload reads, to notice a change.
fn fingerprint(config: &Config) -> Vec<Option<Vec<u8>>> {
    [
        config.config.as_ref(),
        config.security.api_keys_file.as_ref(),
        config.security.tenants_file.as_ref(),
    ]
    .into_iter()
    .map(|path| path.and_then(|p| std::fs::read(p).ok()))
    .collect()
}

/// Reloads on every SIGHUP and whenever the configuration or keys file
/// changes, forever (aborted with the replica).
pub async fn on_sighup(state: Arc<AppState>) {
    #[cfg(unix)]
    let mut hangups = {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGHUP: reloads only on file changes");
                None
            }
        }
    };
    let mut seen = fingerprint(&state.config);
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hangups.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<Option<()>>();
        tokio::select! {
            got = hangup => {
                if got.is_none() {
                    return;
                }
            }
            _ = tick.tick() => {
                let now = fingerprint(&state.config);
                if now == seen {
                    continue;
                }
                tracing::info!("configuration or keys file changed; reloading");
            }
        }
        seen = fingerprint(&state.config);
        report(reload(&state));
    }
}

/// Logs and counts one reload's outcome.
pub fn report(outcome: Result<Reloaded, String>) {
    match outcome {
        Ok(done) => {
            telemetry::config_reload("applied");
            if !done.need_restart.is_empty() {
                tracing::warn!(changed = ?done.need_restart, "configuration reloaded; these changes need a restart and were not applied");
            }
            tracing::info!(applied = ?done.applied, "configuration reloaded");
        }
        Err(reason) => {
            telemetry::config_reload("rejected");
            tracing::error!(%reason, "configuration reload rejected; the running configuration is unchanged");
        }
    }
}
