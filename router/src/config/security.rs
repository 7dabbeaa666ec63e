//! Security flags: the API keys clients and admins must present, the key
//! sent to engines, and how engines reached over HTTPS are trusted.

use std::path::PathBuf;

use clap::Args;

use crate::auth::{self, Auth, Keys, Secret};
use crate::tenants::{self, TenantsSpec};

/// Help heading of the security flags.
pub const SECURITY_FLAGS: &str = "Security";

/// The security group: the auth gate and the engine client are built
/// from it.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = SECURITY_FLAGS)]
pub struct SecurityConfig {
    /// Keys clients must send as `Authorization: Bearer KEY` on every
    /// inference route and `GET /v1/models` (space or comma separated;
    /// none = open). Health, readiness, liveness and /metrics stay open.
    #[arg(long, env = "SHOAL_API_KEY", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',')]
    pub api_key: Vec<Secret>,

    /// File of more inference keys: one per line, `#` comments.
    #[arg(long, env = "SHOAL_API_KEYS_FILE", value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// TOML file of tenants: each a name, its API keys (inference keys
    /// too) and its limits (requests, tokens, concurrency), enforced
    /// fleet-wide over the mesh. Reloaded like --api-keys-file.
    #[arg(long, env = "SHOAL_TENANTS_FILE", value_name = "FILE")]
    pub tenants_file: Option<PathBuf>,

    /// Key for the admin routes (`/workers`, `/mesh/status`, `/tenants`); an inference
    /// key does not open them. Unset: admin writes (`POST`/`DELETE
    /// /workers`) are refused, and admin reads are open.
    #[arg(long, env = "SHOAL_ADMIN_API_KEY")]
    pub admin_api_key: Option<Secret>,

    /// With no --admin-api-key, accept admin writes from loopback clients
    /// (a local demo). Unsafe behind a proxy or sidecar on the same host,
    /// whose connections all come from loopback.
    #[arg(long, env = "SHOAL_ALLOW_LOOPBACK_ADMIN_WRITES")]
    pub allow_loopback_admin_writes: bool,

    /// Key sent to engines as `Authorization: Bearer KEY` (engines started
    /// with `--api-key`); also on health checks, load polls and model lists.
    /// Without it, a client's own `Authorization` is forwarded only while no
    /// --api-key is set (a Shoal key never reaches an engine).
    #[arg(long, env = "SHOAL_WORKER_API_KEY")]
    pub worker_api_key: Option<Secret>,

    /// PEM file of the CA certificates that `https://` engines must chain
    /// to [default: the Mozilla root store compiled in].
    #[arg(long, env = "SHOAL_WORKER_TLS_CA", value_name = "FILE")]
    pub worker_tls_ca: Option<PathBuf>,

    /// PEM file of a client certificate chain presented to `https://`
    /// engines that ask for one (with --worker-tls-key).
    #[arg(
        long,
        env = "SHOAL_WORKER_TLS_CERT",
        value_name = "FILE",
        requires = "worker_tls_key"
    )]
    pub worker_tls_cert: Option<PathBuf>,

    /// PEM file of the private key of --worker-tls-cert.
    #[arg(
        long,
        env = "SHOAL_WORKER_TLS_KEY",
        value_name = "FILE",
        requires = "worker_tls_cert"
    )]
    pub worker_tls_key: Option<PathBuf>,
}

impl SecurityConfig {
    /// The unlimited inference keys: the flag's and the keys file's.
    fn plain_keys(&self) -> Result<Vec<Secret>, String> {
        let mut keys = self.api_key.clone();
        if let Some(path) = &self.api_keys_file {
            let from_file =
                crate::auth::read_keys_file(path).map_err(|e| format!("--api-keys-file {e}"))?;
            keys.extend(from_file);
        }
        Ok(keys)
    }

    /// The tenants file, read and checked (`None` without the flag).
    pub fn tenants(&self) -> Result<Option<TenantsSpec>, String> {
        self.tenants_file
            .as_deref()
            .map(|path| tenants::file::read(path).map_err(|e| format!("--tenants-file {e}")))
            .transpose()
    }

    /// The key gate these flags describe, with `tenants` (the tenants file
    /// as read once by the caller, so the keys the gate admits and the
    /// limits they get come from the same read): inference keys (flag,
    /// keys file, tenants), the admin key, and the key sent to engines.
    pub fn auth_with(&self, tenants: Option<&TenantsSpec>) -> Result<Auth, String> {
        let mut inference = self.plain_keys()?;
        if let Some(spec) = tenants {
            inference.extend(spec.tenants.iter().flat_map(|t| t.keys.iter().cloned()));
        }
        let admin: Vec<Secret> = self.admin_api_key.iter().cloned().collect();
        let worker = self.worker_api_key.as_ref().and_then(auth::bearer_header);
        Ok(Auth::new(Keys::new(&inference), Keys::new(&admin))
            .with_worker_key(worker)
            .with_loopback_admin(self.allow_loopback_admin_writes))
    }

    /// Checks what can be checked at start: the keys and tenants files
    /// read, the admin key is no inference key, and no key is both an
    /// unlimited one and a tenant's (which would it be?).
    pub fn validate(&self) -> Result<(), String> {
        let plain = self.plain_keys()?;
        let tenants = self.tenants()?;
        let tenant_keys = tenants
            .iter()
            .flat_map(|spec| &spec.tenants)
            .flat_map(|t| t.keys.iter().map(move |k| (k, &t.name)));
        for (key, tenant) in tenant_keys.clone() {
            if plain.contains(key) {
                return Err(format!(
                    "a key of tenant `{tenant}` (--tenants-file) is also an --api-key or \
                     --api-keys-file key: a key is either unlimited or a tenant's"
                ));
            }
        }
        if let Some(admin) = &self.admin_api_key
            && (plain.contains(admin) || tenant_keys.clone().any(|(k, _)| k == admin))
        {
            return Err("--admin-api-key must differ from every inference key \
                 (--api-key, --api-keys-file, --tenants-file)"
                .into());
        }
        Ok(())
    }
}
