//! Tenants: per-key limits on requests, tokens and concurrency, enforced
//! fleet-wide.
//!
//! A tenant is a name, its API keys and its limits (`--tenants-file`, see
//! [`file`]). Each request presenting a tenant's key is admitted against
//! the tenant's usage over the sliding window summed across the fleet
//! (this replica's own and every counted peer's, from the mesh's
//! [`TenantBook`]), so a tenant limited to L gets L behind any number of
//! replicas, not R × L. Admitting books the request (one request, its
//! input-token estimate and its `max_tokens` as output) in the current
//! second and one request in flight until its response ends.
//!
//! How far the fleet can overshoot: a peer's admissions reach this
//! replica within its staleness (the push gap, 4 ms by default, plus
//! delivery: the mesh's convergence lag), so while R replicas each admit
//! what they believe remains, the tenant can get at most what the other
//! R − 1 replicas admit within that time beyond its allowance:
//! ≤ (R − 1) × (the tenant's request rate per replica) × staleness.
//!
//! When the answer ends whole, the charge is settled from the usage the
//! engine reported at its end (`usage`): real tokens replace the
//! estimates in the second they were booked in.
//!
//! A tenant's stream that did not ask for its usage is asked for it and
//! the usage chunk hidden again ([`stream_usage`]); a tenant may limit its
//! requests per model too (its model scopes, [`ModelSpec`]); its class
//! ([`Priority`]) and its fleet-wide grants of admission slots
//! ([`share`]) order it in the admission queue.

pub mod file;
pub mod limits;
mod priority;
pub mod share;
pub mod stream_usage;
pub mod usage;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use shoal_mesh::identity::{unix_micros, unix_secs};
use shoal_mesh::{TenantBook, TenantTotals, Usage};

use crate::auth::sha256;
use crate::telemetry::{TENANT_ADMITTED_TOTAL, TENANT_REJECTIONS_TOTAL};
pub use file::{Limits, ModelSpec, TenantsSpec};
pub use limits::{Breach, Reason};
pub use priority::Priority;
use usage::UsageTail;

/// One configured tenant.
#[derive(Debug)]
pub struct Tenant {
    /// Its name.
    pub name: Arc<str>,
    /// Its allowances per window.
    pub limits: Limits,
    /// Its requests' class (the highest one a request can ask for).
    pub priority: Priority,
    /// Its share of a contended queue within its class.
    pub weight: u64,
    /// Its limits per model, by model name.
    pub models: HashMap<Arc<str>, ModelSpec>,
    /// Its requests holding admission slots, fleet-wide (what the queue
    /// weighs it by).
    pub share: Arc<share::TenantShare>,
    /// `shoal_tenant_admitted_total{tenant}`, registered as the file is
    /// loaded (not per request).
    admitted: metrics::Counter,
    /// `shoal_tenant_rejections_total{tenant,reason}`, by [`Reason::ALL`].
    rejections: [metrics::Counter; 3],
    /// Requests this replica refused since the file was loaded, by
    /// [`Reason::ALL`] (for `GET /tenants`).
    refused: [AtomicU64; 3],
}

impl Tenant {
    fn new(spec: &file::TenantSpec, book: &Arc<TenantBook>) -> Self {
        let name = spec.name.clone();
        let label = name.to_string();
        Self {
            admitted: metrics::counter!(TENANT_ADMITTED_TOTAL, "tenant" => label.clone()),
            rejections: Reason::ALL.map(|r| {
                metrics::counter!(TENANT_REJECTIONS_TOTAL,
                    "tenant" => label.clone(), "reason" => r.code())
            }),
            refused: Default::default(),
            name,
            limits: spec.limits,
            priority: spec.priority,
            weight: spec.weight,
            share: Arc::new(share::TenantShare::new(book.clone(), &spec.name)),
            models: spec
                .models
                .iter()
                .map(|m| (m.model.clone(), m.clone()))
                .collect(),
        }
    }
}

/// The tenants file, indexed by key digest.
#[derive(Debug)]
struct Table {
    window_secs: u64,
    default_output_tokens: u64,
    by_key: HashMap<[u8; 32], Arc<Tenant>>,
    tenants: Vec<Arc<Tenant>>,
}

impl Table {
    fn new(spec: &TenantsSpec, book: &Arc<TenantBook>) -> Self {
        let mut by_key = HashMap::new();
        let mut tenants = Vec::with_capacity(spec.tenants.len());
        for t in &spec.tenants {
            let tenant = Arc::new(Tenant::new(t, book));
            for key in &t.keys {
                by_key.insert(sha256(key.expose().as_bytes()), tenant.clone());
            }
            tenants.push(tenant);
        }
        Self {
            window_secs: spec.window_secs,
            default_output_tokens: spec.default_output_tokens,
            by_key,
            tenants,
        }
    }
}

/// A request admitted for a tenant: holds its place among the tenant's
/// requests in flight until dropped (with the response body), and settles
/// its charge from what the engine reported, once.
#[derive(Debug)]
pub struct TenantTicket {
    book: Arc<TenantBook>,
    tenant: Arc<str>,
    /// Where its model's usage is counted, when its tenant limits it.
    model_scope: Option<Arc<str>>,
    /// The second its charge was booked in.
    admitted_sec: u64,
    /// What it was charged at admission (its estimates).
    booked: Usage,
    /// The answer's end, to read the engine's usage from.
    tail: UsageTail,
    /// An engine's answer is on its way: keep the charge when dropped
    /// (else the request was never served, and its charge is refunded).
    served: bool,
}

impl TenantTicket {
    /// The request is answered by an engine: it keeps its charge. Before
    /// this, dropping the ticket refunds it (Shoal refused or failed it).
    pub fn serve(&mut self) {
        self.served = true;
    }

    /// Feeds a piece of the answer (the end holds the engine's usage).
    pub fn observe(&mut self, piece: &[u8]) {
        self.tail.push(piece);
    }

    /// The answer ended whole: charge what the engine reported instead of
    /// the estimates (each count the engine did not report stays as
    /// estimated). An answer cut short keeps its estimates.
    pub fn settle(&mut self) {
        let Some(reported) = self.tail.reported() else {
            return;
        };
        let used = Usage {
            requests: self.booked.requests,
            input_tokens: reported.input_tokens.unwrap_or(self.booked.input_tokens),
            output_tokens: reported.output_tokens.unwrap_or(self.booked.output_tokens),
        };
        if used != self.booked {
            for scope in self.scopes() {
                self.book
                    .settle(scope, self.admitted_sec, self.booked, used);
            }
            self.booked = used;
        }
    }

    /// The book entries it is counted in: its tenant's, and its model's.
    fn scopes(&self) -> impl Iterator<Item = &Arc<str>> {
        std::iter::once(&self.tenant).chain(self.model_scope.as_ref())
    }
}

impl Drop for TenantTicket {
    fn drop(&mut self) {
        for scope in self.scopes() {
            if !self.served {
                self.book
                    .settle(scope, self.admitted_sec, self.booked, Usage::default());
            }
            self.book.finish(scope);
        }
    }
}

/// What admission decided for one tenant request.
#[derive(Debug)]
pub enum Decision {
    /// Admitted: keep the ticket with the response; send the headers.
    Admitted(TenantTicket, Vec<(HeaderName, HeaderValue)>),
    /// Refused: answer 429 with these headers.
    Refused(Breach, Vec<(HeaderName, HeaderValue)>),
}

/// Every name `spec` counts usage under: its tenants' and their models'.
fn book_names(spec: &TenantsSpec) -> Vec<Arc<str>> {
    let mut names = Vec::new();
    for t in &spec.tenants {
        names.push(t.name.clone());
        names.push(share::running_scope(&t.name));
        names.extend(t.models.iter().map(|m| m.scope.clone()));
    }
    names
}

/// Every tenant's limits and the fleet's usage of them.
#[derive(Debug)]
pub struct TenantGate {
    table: ArcSwap<Table>,
    book: Arc<TenantBook>,
}

impl TenantGate {
    /// A gate for `spec`, counting usage in `book` (the mesh's, or a
    /// local one).
    pub fn new(spec: &TenantsSpec, book: Arc<TenantBook>) -> Self {
        book.set_window(spec.window_secs, unix_secs());
        book.set_known(book_names(spec));
        Self {
            table: ArcSwap::from_pointee(Table::new(spec, &book)),
            book,
        }
    }

    /// Swaps in a reloaded file (usage is kept by tenant name; a new
    /// window re-sums it).
    pub fn replace(&self, spec: &TenantsSpec) {
        self.book.set_window(spec.window_secs, unix_secs());
        self.book.set_known(book_names(spec));
        self.table.store(Arc::new(Table::new(spec, &self.book)));
    }

    /// Output tokens charged to a request that sets no `max_tokens`.
    pub fn default_output_tokens(&self) -> u64 {
        self.table.load().default_output_tokens
    }

    /// The tenant whose key `token` is, if any.
    pub fn tenant_of(&self, token: &[u8]) -> Option<Arc<Tenant>> {
        self.table.load().by_key.get(&sha256(token)).cloned()
    }

    /// Admits one request of `tenant` for `model` with `input_tokens` (the
    /// prompt estimate) and `max_tokens` (if it set one; else the file's
    /// `default_output_tokens` is charged), or says which limit it breaks:
    /// the tenant's own, then its model's (if the tenant limits that model).
    pub fn admit(
        &self,
        tenant: &Tenant,
        model: Option<&str>,
        input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> Decision {
        let table = self.table.load();
        let window_secs = table.window_secs;
        let request = Usage {
            requests: 1,
            input_tokens,
            output_tokens: max_tokens.unwrap_or(table.default_output_tokens),
        };
        let now_us = unix_micros();
        let now_sec = now_us / 1_000_000;
        let limits = tenant.limits;
        let after = match self.admit_scope(&tenant.name, &limits, now_sec, request) {
            Ok(after) => after,
            Err((exceeded, before)) => {
                let headers = limits::headers(&limits, &before, window_secs, now_us);
                return self.refuse(tenant, &tenant.name, None, exceeded, headers, now_sec);
            }
        };
        let mut headers = limits::headers(&limits, &after, window_secs, now_us);
        let mut ticket = TenantTicket {
            book: self.book.clone(),
            tenant: tenant.name.clone(),
            model_scope: None,
            admitted_sec: now_sec,
            booked: request,
            tail: UsageTail::default(),
            served: false,
        };
        if let Some(spec) = model.and_then(|m| tenant.models.get(m)) {
            match self.admit_scope(&spec.scope, &spec.limits, now_sec, request) {
                Ok(after) => {
                    ticket.model_scope = Some(spec.scope.clone());
                    // A model's figures stand in for the tenant's where it
                    // sets the same limit (later headers win).
                    headers.extend(limits::headers(&spec.limits, &after, window_secs, now_us));
                }
                Err((exceeded, before)) => {
                    // Refunds the tenant-wide booking.
                    drop(ticket);
                    headers.extend(limits::headers(&spec.limits, &before, window_secs, now_us));
                    let refusal = self.refuse(
                        tenant,
                        &spec.scope,
                        Some(&spec.model),
                        exceeded,
                        headers,
                        now_sec,
                    );
                    return refusal;
                }
            }
        }
        tenant.admitted.increment(1);
        Decision::Admitted(ticket, headers)
    }

    /// Books `request` in `scope` at `now_sec` if it fits `limits`: the
    /// totals after it, or what it exceeds and the totals before it.
    fn admit_scope(
        &self,
        scope: &Arc<str>,
        limits: &Limits,
        now_sec: u64,
        request: Usage,
    ) -> Result<TenantTotals, (limits::Exceeded, TenantTotals)> {
        let mut before = TenantTotals::default();
        self.book
            .admit(scope, now_sec, request, |totals| {
                limits::check(limits, totals, &request).inspect_err(|_| before = *totals)
            })
            .map_err(|exceeded| (exceeded, before))
    }

    /// Counts a refusal of `tenant` (by its own limits, or `model`'s
    /// counted in `scope`) and builds its answer.
    fn refuse(
        &self,
        tenant: &Tenant,
        scope: &str,
        model: Option<&str>,
        exceeded: limits::Exceeded,
        headers: Vec<(HeaderName, HeaderValue)>,
        now_sec: u64,
    ) -> Decision {
        let at = exceeded.reason.index();
        tenant.rejections[at].increment(1);
        tenant.refused[at].fetch_add(1, Ordering::Relaxed);
        let window = self.book.window(scope, now_sec);
        let mut breach = limits::breach(&exceeded, &window);
        if let Some(model) = model {
            breach.message = format!("model `{model}`: {}", breach.message);
        }
        Decision::Refused(breach, headers)
    }

    /// The operator's view: every configured tenant's limits, fleet-wide
    /// usage this window, and this replica's refusals and queue
    /// (`depths`: the admission queue's waiters by tenant and class).
    pub fn status(&self, depths: &[(&str, Priority, usize)]) -> TenantsStatus {
        let table = self.table.load();
        let now_sec = unix_secs();
        let tenants = table
            .tenants
            .iter()
            .map(|t| {
                let window = self.book.window(&t.name, now_sec);
                let mut queued = BTreeMap::new();
                for (tenant, class, n) in depths {
                    if *tenant == &*t.name {
                        *queued.entry(class.name()).or_insert(0) += n;
                    }
                }
                TenantStatus {
                    name: t.name.to_string(),
                    limits: t.limits,
                    priority: t.priority,
                    weight: t.weight,
                    queued,
                    used: UsedView::of(&window),
                    models: {
                        let mut models: Vec<ModelStatus> = t
                            .models
                            .values()
                            .map(|m| ModelStatus {
                                model: m.model.to_string(),
                                limits: m.limits,
                                used: UsedView::of(&self.book.window(&m.scope, now_sec)),
                            })
                            .collect();
                        models.sort_by(|a, b| a.model.cmp(&b.model));
                        models
                    },
                    rejected: Reason::ALL
                        .iter()
                        .map(|r| (r.code(), t.refused[r.index()].load(Ordering::Relaxed)))
                        .collect(),
                }
            })
            .collect();
        TenantsStatus {
            window_secs: table.window_secs,
            tenants,
        }
    }
}

/// `GET /tenants`.
#[derive(Debug, Serialize)]
pub struct TenantsStatus {
    /// Seconds of the sliding window.
    pub window_secs: u64,
    /// Every configured tenant.
    pub tenants: Vec<TenantStatus>,
}

/// One tenant in `GET /tenants`.
#[derive(Debug, Serialize)]
pub struct TenantStatus {
    /// Its name.
    pub name: String,
    /// Its allowances per window (`null`: unlimited).
    pub limits: Limits,
    /// Its requests' class.
    pub priority: Priority,
    /// Its fair-share weight within its class.
    pub weight: u64,
    /// Its requests waiting in this replica's admission queue, by class.
    pub queued: BTreeMap<&'static str, usize>,
    /// Its usage this window, fleet-wide.
    pub used: UsedView,
    /// Its limits and usage per model it limits.
    pub models: Vec<ModelStatus>,
    /// Requests this replica refused since the tenants file was (re)loaded,
    /// by reason.
    pub rejected: BTreeMap<&'static str, u64>,
}

/// One model a tenant limits, in `GET /tenants`.
#[derive(Debug, Serialize)]
pub struct ModelStatus {
    /// The model.
    pub model: String,
    /// The tenant's allowances for it per window (`null`: only the
    /// tenant's own apply).
    pub limits: Limits,
    /// The tenant's usage of it this window, fleet-wide.
    pub used: UsedView,
}

/// Usage this window, fleet-wide, as `GET /tenants` shows it.
#[derive(Debug, Serialize)]
pub struct UsedView {
    /// Requests admitted.
    pub requests: u64,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Requests in flight now.
    pub in_flight: u64,
}

impl UsedView {
    fn of(window: &shoal_mesh::TenantWindow) -> Self {
        let used = window.total();
        Self {
            requests: used.requests,
            tokens: used.input_tokens.saturating_add(used.output_tokens),
            input_tokens: used.input_tokens,
            output_tokens: used.output_tokens,
            in_flight: window.in_flight,
        }
    }
}

/// Appends `headers` to `map`.
pub fn add_headers(map: &mut HeaderMap, headers: Vec<(HeaderName, HeaderValue)>) {
    for (name, value) in headers {
        map.insert(name, value);
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod gate_tests;
