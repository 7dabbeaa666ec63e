//! The tenants file (`--tenants-file`): who the tenants are, their keys,
//! and their limits.
//!
//! ```toml
//! window_secs = 60                  # optional, 1..=60: the sliding window
//! default_output_tokens = 1024      # optional: charged without max_tokens
//! [tenants.acme]
//! keys = ["sk-acme-0001"]           # at least one; inference keys too
//! requests_per_minute = 600         # every limit is optional
//! tokens_per_minute = 200000        # input + output
//! input_tokens_per_minute = 150000
//! output_tokens_per_minute = 50000
//! max_concurrent = 32               # in flight at once, fleet-wide
//! priority = "standard"             # critical | standard | sheddable
//! weight = 1                        # fair share within its class
//! [tenants.acme.models."meta-llama/Llama-3.1-70B-Instruct"]
//! tokens_per_minute = 50000         # this model's share, on top
//! ```
//!
//! A rate "per minute" is enforced over the sliding window as an allowance
//! of `rate × window_secs / 60` (at least 1). Anything wrong — a key this
//! file does not know, a tenant with no key, a limit that is not a
//! positive integer, a key two tenants share — is an error naming the file
//! and the tenant: a half-read tenants file must never admit unlimited
//! traffic.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use shoal_mesh::MAX_WINDOW_SECS;
use shoal_proto::frames::MAX_TENANT_NAME_BYTES;

use super::Priority;
use crate::auth::{Secret, sha256};

/// The window limits are measured over when the file names none.
pub const DEFAULT_WINDOW_SECS: u64 = 60;

/// Output tokens charged at admission to a request that sets no
/// `max_tokens`, when the file names no `default_output_tokens` (settled
/// to what the engine reports when it reports it).
pub const DEFAULT_OUTPUT_TOKENS: u64 = 1024;

/// One tenant's allowances per window (`None`: unlimited; `null` in
/// `GET /tenants`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Requests admitted per window.
    pub requests: Option<u64>,
    /// Input plus output tokens per window.
    pub tokens: Option<u64>,
    /// Input tokens per window.
    pub input_tokens: Option<u64>,
    /// Output tokens per window.
    pub output_tokens: Option<u64>,
    /// Requests in flight at once, fleet-wide.
    pub max_concurrent: Option<u64>,
}

/// One tenant as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    /// Its name (a metric label and the mesh's key).
    pub name: Arc<str>,
    /// Its API keys.
    pub keys: Vec<Secret>,
    /// Its allowances.
    pub limits: Limits,
    /// Its requests' class (the highest a request of it can ask for).
    pub priority: Priority,
    /// Its share of a contended queue relative to its class's other flows.
    pub weight: u64,
    /// Limits on its requests for one model, on top of its own.
    pub models: Vec<ModelSpec>,
}

/// A tenant's limits for one model (`[tenants.NAME.models."MODEL"]`): a
/// request for that model must fit both these and the tenant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The model, as requests name it (`model`).
    pub model: Arc<str>,
    /// Where its usage is counted, in the mesh's tenant book: a digest of
    /// tenant and model, short and the same on every replica whatever the
    /// model's name ([`model_scope`]).
    pub scope: Arc<str>,
    /// Its allowances.
    pub limits: Limits,
}

/// Longest model name the tenants file accepts, in bytes.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// The tenant book's name for `tenant`'s usage of `model`: `m-` and 24
/// hex digits of a SHA-256 of both ([`scope_name`]).
pub fn model_scope(tenant: &str, model: &str) -> Arc<str> {
    scope_name("m-", &[tenant, model])
}

/// A name in the tenant book for something counted besides a tenant's own
/// usage: `prefix` (two characters) and 24 hex digits of a SHA-256 of
/// `parts` (NUL-separated). It fits the mesh's bound on names whatever the
/// parts are, and no tenant can share it: the file refuses tenant names
/// of that shape.
pub fn scope_name(prefix: &str, parts: &[&str]) -> Arc<str> {
    let input = parts.join("\0");
    let digest = sha256(input.as_bytes());
    let mut name = String::from(prefix);
    for b in &digest[..12] {
        name.push_str(&format!("{b:02x}"));
    }
    Arc::from(name)
}

/// Whether `name` has the shape of a [`model_scope`].
fn looks_like_scope(name: &str) -> bool {
    name.len() == 26
        && name.as_bytes().get(1) == Some(&b'-')
        && name[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantsSpec {
    /// Seconds of the sliding window.
    pub window_secs: u64,
    /// Output tokens charged to a request without `max_tokens`.
    pub default_output_tokens: u64,
    /// The tenants, by name.
    pub tenants: Vec<TenantSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    window_secs: Option<toml::Value>,
    default_output_tokens: Option<toml::Value>,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    #[serde(default)]
    keys: Vec<String>,
    requests_per_minute: Option<toml::Value>,
    tokens_per_minute: Option<toml::Value>,
    input_tokens_per_minute: Option<toml::Value>,
    output_tokens_per_minute: Option<toml::Value>,
    max_concurrent: Option<toml::Value>,
    priority: Option<String>,
    weight: Option<toml::Value>,
    #[serde(default)]
    models: BTreeMap<String, RawLimits>,
}

/// The limits of one model of a tenant.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    requests_per_minute: Option<toml::Value>,
    tokens_per_minute: Option<toml::Value>,
    input_tokens_per_minute: Option<toml::Value>,
    output_tokens_per_minute: Option<toml::Value>,
    max_concurrent: Option<toml::Value>,
}

/// `value` as a positive integer, or an error naming `what`.
fn positive(what: &str, value: Option<toml::Value>) -> Result<Option<u64>, String> {
    match value {
        None => Ok(None),
        Some(toml::Value::Integer(n)) if n > 0 => Ok(Some(n as u64)),
        Some(other) => Err(format!("{what} = {other}: must be a positive integer")),
    }
}

/// Reads and checks `path`.
pub fn read(path: &Path) -> Result<TenantsSpec, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks the text of a tenants file.
pub fn parse(text: &str) -> Result<TenantsSpec, String> {
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        // The parser's message without the line it quotes (a line of
        // keys must not reach a log), with the line's number.
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        match line {
            Some(line) => format!("line {line}: {}", one_line(e.message())),
            None => one_line(e.message()),
        }
    })?;
    let window_secs = match positive("window_secs", raw.window_secs.clone()) {
        Ok(None) => DEFAULT_WINDOW_SECS,
        Ok(Some(w)) if w <= MAX_WINDOW_SECS => w,
        _ => {
            let w = raw.window_secs.map(|v| v.to_string()).unwrap_or_default();
            return Err(format!(
                "window_secs = {w}: must be 1 to {MAX_WINDOW_SECS} seconds"
            ));
        }
    };
    let default_output_tokens = positive("default_output_tokens", raw.default_output_tokens)?
        .unwrap_or(DEFAULT_OUTPUT_TOKENS);
    if raw.tenants.is_empty() {
        return Err("no [tenants.NAME] table: a tenants file must name at least one".into());
    }
    let mut seen_keys = HashSet::new();
    let mut tenants = Vec::with_capacity(raw.tenants.len());
    for (name, tenant) in raw.tenants {
        tenants.push(tenant_spec(&name, tenant, window_secs, &mut seen_keys)?);
    }
    Ok(TenantsSpec {
        window_secs,
        default_output_tokens,
        tenants,
    })
}

fn tenant_spec(
    name: &str,
    raw: RawTenant,
    window_secs: u64,
    seen_keys: &mut HashSet<String>,
) -> Result<TenantSpec, String> {
    let valid_name = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !valid_name || looks_like_scope(name) {
        return Err(format!(
            "tenant `{name}`: a name is 1 to {MAX_TENANT_NAME_BYTES} letters, digits, `-`, `_` or `.` \
             (and not a letter, `-` and 24 hex digits: that is how per-model and fair-share counts are named)"
        ));
    }
    if raw.keys.is_empty() {
        return Err(format!(
            "tenant `{name}`: no keys (a tenant is reached only through its keys)"
        ));
    }
    let mut keys = Vec::with_capacity(raw.keys.len());
    for (i, key) in raw.keys.iter().enumerate() {
        let secret: Secret = key
            .parse()
            .map_err(|e| format!("tenant `{name}` keys[{i}]: {e}"))?;
        if !seen_keys.insert(secret.expose().to_string()) {
            return Err(format!(
                "tenant `{name}` keys[{i}]: the key is listed twice (a key names one tenant)"
            ));
        }
        keys.push(secret);
    }
    let limits = limits_of(
        &format!("tenant `{name}`"),
        RawLimits {
            requests_per_minute: raw.requests_per_minute,
            tokens_per_minute: raw.tokens_per_minute,
            input_tokens_per_minute: raw.input_tokens_per_minute,
            output_tokens_per_minute: raw.output_tokens_per_minute,
            max_concurrent: raw.max_concurrent,
        },
        window_secs,
    )?;
    let mut models = Vec::with_capacity(raw.models.len());
    for (model, raw_limits) in raw.models {
        let what = format!("tenant `{name}` model `{model}`");
        if model.is_empty() || model.len() > MAX_MODEL_NAME_BYTES {
            return Err(format!(
                "{what}: a model name is 1 to {MAX_MODEL_NAME_BYTES} bytes"
            ));
        }
        let limits = limits_of(&what, raw_limits, window_secs)?;
        models.push(ModelSpec {
            scope: model_scope(name, &model),
            model: Arc::from(model),
            limits,
        });
    }
    let priority = match raw.priority.as_deref() {
        None => Priority::default(),
        Some(text) => Priority::parse(text).ok_or_else(|| {
            format!("tenant `{name}`: priority = {text:?}: must be critical, standard or sheddable")
        })?,
    };
    let weight = positive(&format!("tenant `{name}`: weight"), raw.weight)?.unwrap_or(1);
    Ok(TenantSpec {
        name: Arc::from(name),
        keys,
        limits,
        priority,
        weight,
        models,
    })
}

/// The allowances per window of `raw`, or an error naming `what` and the
/// setting.
fn limits_of(what: &str, raw: RawLimits, window_secs: u64) -> Result<Limits, String> {
    let per_window = |field: &str, rate: Option<toml::Value>| {
        positive(&format!("{what}: {field}"), rate).map(|r| r.map(|r| allowance(r, window_secs)))
    };
    Ok(Limits {
        requests: per_window("requests_per_minute", raw.requests_per_minute)?,
        tokens: per_window("tokens_per_minute", raw.tokens_per_minute)?,
        input_tokens: per_window("input_tokens_per_minute", raw.input_tokens_per_minute)?,
        output_tokens: per_window("output_tokens_per_minute", raw.output_tokens_per_minute)?,
        max_concurrent: positive(&format!("{what}: max_concurrent"), raw.max_concurrent)?,
    })
}

/// The TOML parser's message on one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A per-minute `rate`'s allowance over `window_secs` (at least 1).
pub fn allowance(rate: u64, window_secs: u64) -> u64 {
    (u128::from(rate) * u128::from(window_secs) / 60).clamp(1, u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
window_secs = 6
[tenants.acme]
keys = ["acme-key-0001", "acme-key-0002"]
requests_per_minute = 600
output_tokens_per_minute = 10000
max_concurrent = 4
[tenants.bob]
keys = ["bob-key-00001"]
"#;

    #[test]
    fn a_good_file_gives_allowances_per_window() {
        let spec = parse(GOOD).unwrap();
        assert_eq!(spec.window_secs, 6);
        let acme = &spec.tenants[0];
        assert_eq!(&*acme.name, "acme");
        assert_eq!(acme.keys.len(), 2);
        assert_eq!(
            acme.limits,
            Limits {
                requests: Some(60),
                tokens: None,
                input_tokens: None,
                output_tokens: Some(1000),
                max_concurrent: Some(4),
            }
        );
        assert_eq!(spec.tenants[1].limits, Limits::default());
        assert_eq!(spec.default_output_tokens, DEFAULT_OUTPUT_TOKENS);
        assert_eq!(
            parse("[tenants.a]\nkeys=[\"aaaaaaaa\"]")
                .unwrap()
                .window_secs,
            60
        );
        assert_eq!(allowance(1, 1), 1, "never zero");
        assert_eq!(allowance(u64::MAX, 60), u64::MAX);
    }

    #[test]
    fn models_priority_and_weight_are_read() {
        let text = "[tenants.acme]\nkeys=[\"aaaaaaaa\"]\npriority = \"critical\"\nweight = 3\n\
                    [tenants.acme.models.\"org/big-model\"]\nrequests_per_minute = 60\n";
        let spec = parse(text).unwrap();
        let acme = &spec.tenants[0];
        assert_eq!(acme.priority, Priority::Critical);
        assert_eq!(acme.weight, 3);
        assert_eq!(acme.models.len(), 1);
        let model = &acme.models[0];
        assert_eq!(&*model.model, "org/big-model");
        assert_eq!(model.limits.requests, Some(60));
        assert_eq!(model.scope, model_scope("acme", "org/big-model"));
        assert!(looks_like_scope(&model.scope) && model.scope.len() <= MAX_TENANT_NAME_BYTES);
        assert_ne!(model_scope("acme", "x"), model_scope("acmf", "x"));
        for scope in [model.scope.clone(), scope_name("r-", &["acme"])] {
            let scope_named = format!("[tenants.{scope}]\nkeys=[\"aaaaaaaa\"]");
            assert!(parse(&scope_named).is_err(), "{scope}");
        }
    }

    #[test]
    fn every_bad_file_is_refused_naming_what_is_wrong() {
        let cases = [
            ("not toml [", "line 1: "),
            ("[tenants.a]\nkeys = [\"secret-key-1\", 7]", "line 2: "),
            (
                "window_secs = 61\n[tenants.a]\nkeys=[\"aaaaaaaa\"]",
                "window_secs = 61",
            ),
            (
                "window_secs = 0\n[tenants.a]\nkeys=[\"aaaaaaaa\"]",
                "window_secs = 0",
            ),
            ("", "no [tenants.NAME]"),
            (
                "default_output_tokens = 0\n[tenants.a]\nkeys=[\"aaaaaaaa\"]",
                "default_output_tokens = 0",
            ),
            ("[tenants.a]\nkeys=[]", "tenant `a`: no keys"),
            ("[tenants.a]\nkeys=[\"aaaaaaaa\"]\nrpm = 3", "rpm"),
            ("colour = 1\n[tenants.a]\nkeys=[\"aaaaaaaa\"]", "colour"),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\nrequests_per_minute = 0",
                "requests_per_minute = 0",
            ),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\nmax_concurrent = -1",
                "tenant `a`: max_concurrent = -1",
            ),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\nrequests_per_minute = 1.5",
                "tenant `a`: requests_per_minute = 1.5",
            ),
            ("[tenants.a]\nkeys=[\"short\"]", "tenant `a` keys[0]"),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\n[tenants.b]\nkeys=[\"aaaaaaaa\"]",
                "listed twice",
            ),
            ("[tenants.\"a b\"]\nkeys=[\"aaaaaaaa\"]", "tenant `a b`"),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\n[tenants.a.models.m]\nrpm = 1",
                "rpm",
            ),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\n[tenants.a.models.m]\ntokens_per_minute = 0",
                "tenant `a` model `m`: tokens_per_minute = 0",
            ),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\npriority = \"urgent\"",
                "tenant `a`: priority",
            ),
            (
                "[tenants.a]\nkeys=[\"aaaaaaaa\"]\nweight = 0",
                "tenant `a`: weight = 0",
            ),
        ];
        for (text, says) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(says), "{text:?} gave {err:?}, not {says:?}");
            assert!(!err.contains("secret-key-1"), "a key in an error: {err}");
        }
    }
}
