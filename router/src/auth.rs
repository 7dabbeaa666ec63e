//! API keys: who may call the inference routes, and who may look at or
//! change the fleet (the admin routes).
//!
//! - **Inference keys** (`--api-key`, `--api-keys-file`): when any is set,
//!   every proxied route and `GET /v1/models` needs `Authorization: Bearer
//!   KEY` (or `x-api-key: KEY`, which Anthropic's SDKs send to
//!   `/v1/messages`) with one of them; otherwise they are open (as the
//!   engines are). A keys file that holds no key is an error, never "open":
//!   emptying it to revoke every key must not turn authentication off.
//! - **Admin key** (`--admin-api-key`): when set, `GET`/`POST`/`DELETE
//!   /workers`, `GET /mesh/status` and `GET /tenants` need it (and only it: an inference
//!   key is not an admin key). When unset, admin *writes* are refused —
//!   an admin write registers an engine fleet-wide, which then receives
//!   prompts and the worker key — unless `--allow-loopback-admin-writes`
//!   opts in to accepting them from loopback clients (a local demo). The
//!   socket's peer is no proof of locality behind a same-host proxy or a
//!   service-mesh sidecar (Istio delivers inbound traffic from
//!   127.0.0.6), so that is never the default. Admin reads stay open.
//! - Health, readiness, liveness and `/metrics` are always open.
//!
//! Keys are held as SHA-256 digests, compared in constant time (every key
//! is compared, whatever matched), never logged: [`Secret`] prints as
//! `[redacted]`.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Method, header};
use ring::digest::{SHA256, digest};

/// A key from a flag, variable or file: printed as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The key itself (to send it, never to print it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = String;

    /// A key is 8 to 4096 printable ASCII bytes (what fits a header).
    fn from_str(text: &str) -> Result<Self, String> {
        let key = text.trim();
        if key.len() < 8 {
            return Err("a key must be at least 8 characters".into());
        }
        if key.len() > 4096 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a key must be at most 4096 printable ASCII characters, no spaces".into());
        }
        Ok(Self(key.to_string()))
    }
}

/// Reads a keys file: one key per line; blank lines and `#` comments are
/// skipped. An unreadable file, a bad line (named) or a file with no key
/// at all is an error: a configured keys file that yields no key would
/// otherwise open every route.
pub fn read_keys_file(path: &std::path::Path) -> Result<Vec<Secret>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let keys = text
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(n, line)| {
            line.parse::<Secret>()
                .map_err(|e| format!("{} line {n}: {e}", path.display()))
        })
        .collect::<Result<Vec<Secret>, String>>()?;
    if keys.is_empty() {
        return Err(format!(
            "{} holds no key (only blank lines or comments); refusing to run with \
             authentication off. To revoke every key, put a new one in; to run \
             without keys, drop the flag",
            path.display()
        ));
    }
    Ok(keys)
}

/// A set of keys, by digest.
#[derive(Debug, Default, Clone)]
pub struct Keys {
    digests: Vec<[u8; 32]>,
}

impl Keys {
    /// The digests of `keys`.
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a Secret>) -> Self {
        Self {
            digests: keys.into_iter().map(|k| sha256(k.0.as_bytes())).collect(),
        }
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the keys, comparing against every key
    /// in constant time.
    pub fn admits(&self, presented: &[u8]) -> bool {
        let presented = sha256(presented);
        self.digests
            .iter()
            .fold(false, |found, d| found | constant_time_eq(d, &presented))
    }
}

/// The SHA-256 digest keys are held and looked up as (never the key).
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that is not one of the configured ones.
    Invalid,
    /// An admin write with no admin key set (and loopback writes not
    /// allowed).
    NoAdminKey,
    /// An admin write from a non-loopback client, with no admin key set
    /// and loopback writes allowed.
    NotLoopback,
}

impl Denied {
    /// Label for the auth-failures metric.
    pub fn reason(self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::Invalid => "invalid",
            Denied::NoAdminKey => "no_admin_key",
            Denied::NotLoopback => "not_loopback",
        }
    }
}

/// What a request needs, by its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Always open: health, readiness, liveness, metrics, unknown paths.
    Open,
    /// An inference key (proxied routes, `GET /v1/models`).
    Inference,
    /// The admin key; `write` when it changes the fleet.
    Admin {
        /// `POST`/`DELETE`: without an admin key, refused (or loopback
        /// only, when allowed).
        write: bool,
    },
}

impl Scope {
    /// The scope of a request the router answers itself (proxied routes
    /// are [`Scope::Inference`] by the caller).
    pub fn of(method: &Method, path: &str) -> Scope {
        if path == "/v1/models" {
            return Scope::Inference;
        }
        if path == "/workers"
            || path.starts_with("/workers/")
            || path == "/mesh/status"
            || path == "/tenants"
        {
            let write = method != Method::GET && method != Method::HEAD;
            return Scope::Admin { write };
        }
        if path == "/debug/route" {
            // A dry run changes nothing: an admin read, whatever its method.
            return Scope::Admin { write: false };
        }
        Scope::Open
    }
}

/// What `Authorization` header an engine gets on a proxied request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward<'a> {
    /// The client's own, as sent (no inference keys: it is not Shoal's).
    Client,
    /// None (the client's is a Shoal key: it never reaches an engine).
    Drop,
    /// `--worker-api-key`'s.
    Worker(&'a HeaderValue),
}

/// The keys of one replica.
#[derive(Debug, Default, Clone)]
pub struct Auth {
    inference: Keys,
    admin: Keys,
    worker: Option<HeaderValue>,
    /// `--allow-loopback-admin-writes`.
    loopback_admin: bool,
}

impl Auth {
    /// Inference `keys` and `admin` keys (either may be empty).
    pub fn new(inference: Keys, admin: Keys) -> Self {
        Self {
            inference,
            admin,
            worker: None,
            loopback_admin: false,
        }
    }

    /// The same, accepting admin writes from loopback clients while no
    /// admin key is set (`--allow-loopback-admin-writes`).
    pub fn with_loopback_admin(self, allowed: bool) -> Self {
        Self {
            loopback_admin: allowed,
            ..self
        }
    }

    /// The same, sending `worker` (a `Bearer` header) to engines.
    pub fn with_worker_key(self, worker: Option<HeaderValue>) -> Self {
        Self { worker, ..self }
    }

    /// What an engine gets as `Authorization` on a proxied request.
    pub fn forward(&self) -> Forward<'_> {
        match (&self.worker, self.guards_inference()) {
            (Some(key), _) => Forward::Worker(key),
            (None, true) => Forward::Drop,
            (None, false) => Forward::Client,
        }
    }

    /// The header for side requests to engines (health, polls, models).
    pub fn worker_header(&self) -> Option<&HeaderValue> {
        self.worker.as_ref()
    }

    /// Whether inference keys are configured (then the client's own
    /// `Authorization` is Shoal's, and is not forwarded to engines).
    pub fn guards_inference(&self) -> bool {
        !self.inference.is_empty()
    }

    /// Checks a request of `scope` from `peer` with `headers`.
    pub fn check(
        &self,
        scope: Scope,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<(), Denied> {
        match scope {
            Scope::Open => Ok(()),
            Scope::Inference if self.inference.is_empty() => Ok(()),
            Scope::Inference => {
                let token = bearer(headers).or_else(|| x_api_key(headers));
                admitted(token, &self.inference)
            }
            Scope::Admin { write: false } if self.admin.is_empty() => Ok(()),
            Scope::Admin { write: true } if self.admin.is_empty() => {
                // `::ffff:127.0.0.1` is loopback too (a dual-stack listener).
                let local = peer.is_some_and(|p| p.ip().to_canonical().is_loopback());
                match (self.loopback_admin, local) {
                    (true, true) => Ok(()),
                    (true, false) => Err(Denied::NotLoopback),
                    (false, _) => Err(Denied::NoAdminKey),
                }
            }
            Scope::Admin { .. } => admitted(bearer(headers), &self.admin),
        }
    }
}

fn admitted(token: Option<&[u8]>, keys: &Keys) -> Result<(), Denied> {
    let token = token.ok_or(Denied::Missing)?;
    if keys.admits(token) {
        Ok(())
    } else {
        Err(Denied::Invalid)
    }
}

/// The token of an `Authorization: Bearer TOKEN` header.
pub fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| token.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// The key of an `x-api-key: KEY` header (Anthropic's SDKs send the key
/// this way, to `/v1/messages`).
pub fn x_api_key(headers: &HeaderMap) -> Option<&[u8]> {
    Some(headers.get("x-api-key")?.as_bytes().trim_ascii()).filter(|t| !t.is_empty())
}

/// The `Authorization` header an engine gets for `key`.
pub fn bearer_header(key: &Secret) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests;
