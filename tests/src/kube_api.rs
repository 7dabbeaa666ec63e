//! A Kubernetes API server for discovery tests: the real list/watch
//! protocol for `discovery.k8s.io/v1` EndpointSlices in one namespace, so
//! the `kube` client in `shoal` runs unmodified against it.
//!
//! What it speaks: `GET .../endpointslices?labelSelector=k=v[,k2=v2]` lists
//! the matching slices with the collection's `resourceVersion`; with
//! `watch=true&resourceVersion=N` it streams, as newline-delimited JSON in
//! a chunked body, every ADDED / MODIFIED / DELETED event after N, then
//! live ones, and BOOKMARKs on request. What a test can break: drop every
//! open watch mid-stream ([`KubeApi::drop_watches`]), change a slice
//! without telling the watchers ([`KubeApi::delete_silently`], a DELETE
//! missed while a watch was down), and compact its history
//! ([`KubeApi::compact`]): a watch resuming from an older resourceVersion is
//! then answered with an in-stream 410 Gone, as a real API server does once
//! etcd compacted it, and the client must list again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

/// One watch event as sent: its resourceVersion and the JSON line.
#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    line: Bytes,
}

#[derive(Default)]
struct Inner {
    /// Current slices by name (each with its resourceVersion set).
    slices: Mutex<BTreeMap<String, Value>>,
    /// Every event sent, oldest first (a watch resumes from it).
    log: Mutex<Vec<Event>>,
    rv: AtomicU64,
    /// Watches resuming before this resourceVersion get 410 Gone.
    compacted: AtomicU64,
    lists: AtomicUsize,
    watches: AtomicUsize,
}

/// A running fake API server; dropping it stops it.
pub struct KubeApi {
    url: String,
    namespace: String,
    inner: Arc<Inner>,
    live: broadcast::Sender<Event>,
    drop_watches: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Ctx {
    inner: Arc<Inner>,
    namespace: String,
    live: broadcast::Sender<Event>,
    drop_watches: watch::Receiver<u64>,
}

impl KubeApi {
    /// Serves namespace `namespace` on a free loopback port.
    pub async fn start(namespace: &str) -> std::io::Result<KubeApi> {
        let inner = Arc::new(Inner::default());
        inner.rv.store(100, Ordering::SeqCst);
        let (live, _) = broadcast::channel(1024);
        let (drop_watches, drop_rx) = watch::channel(0u64);
        let ctx = Ctx {
            inner: inner.clone(),
            namespace: namespace.to_string(),
            live: live.clone(),
            drop_watches: drop_rx,
        };
        let app = Router::new()
            .route(
                "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                get(endpointslices),
            )
            .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "not served here") })
            .with_state(ctx);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(KubeApi {
            url,
            namespace: namespace.to_string(),
            inner,
            live,
            drop_watches,
            task,
        })
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes a kubeconfig for this server (no credentials) into `dir`.
    pub fn write_kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    namespace: {}\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url, self.namespace
        );
        std::fs::write(&path, text)?;
        Ok(path)
    }

    fn next_rv(&self) -> u64 {
        self.inner.rv.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn publish(&self, kind: &str, object: Value, rv: u64) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let event = Event {
            rv,
            line: Bytes::from(line),
        };
        lock(&self.inner.log).push(event.clone());
        let _ = self.live.send(event);
    }

    /// Adds or replaces slice `slice` (its `metadata.name` keys it) and
    /// tells the watchers (ADDED or MODIFIED).
    pub fn apply(&self, mut slice: Value) {
        let rv = self.next_rv();
        slice["apiVersion"] = "discovery.k8s.io/v1".into();
        slice["kind"] = "EndpointSlice".into();
        slice["metadata"]["namespace"] = self.namespace.clone().into();
        slice["metadata"]["resourceVersion"] = rv.to_string().into();
        let name = slice["metadata"]["name"].as_str().unwrap_or("").to_string();
        let existed = lock(&self.inner.slices)
            .insert(name, slice.clone())
            .is_some();
        self.publish(if existed { "MODIFIED" } else { "ADDED" }, slice, rv);
    }

    /// Deletes slice `name` and tells the watchers (DELETED).
    pub fn delete(&self, name: &str) {
        if let Some(mut slice) = lock(&self.inner.slices).remove(name) {
            let rv = self.next_rv();
            slice["metadata"]["resourceVersion"] = rv.to_string().into();
            self.publish("DELETED", slice, rv);
        }
    }

    /// Deletes slice `name` without any event: only a new list shows it.
    pub fn delete_silently(&self, name: &str) {
        lock(&self.inner.slices).remove(name);
        self.next_rv();
    }

    /// Sends a BOOKMARK at the current resourceVersion to every watcher.
    pub fn bookmark(&self) {
        let rv = self.inner.rv.load(Ordering::SeqCst);
        let object = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"resourceVersion": rv.to_string()}});
        let line = format!("{}\n", json!({"type": "BOOKMARK", "object": object}));
        let _ = self.live.send(Event {
            rv,
            line: Bytes::from(line),
        });
    }

    /// Forgets the history up to now: a watch resuming from an older
    /// resourceVersion gets an in-stream 410 Gone (a fresh list's version
    /// is not older, so the client recovers by listing).
    pub fn compact(&self) {
        let now = self.next_rv();
        self.inner.compacted.store(now, Ordering::SeqCst);
    }

    /// Cuts every open watch connection mid-stream (no final chunk).
    pub fn drop_watches(&self) {
        self.drop_watches.send_modify(|n| *n += 1);
    }

    /// List requests served so far.
    pub fn lists(&self) -> usize {
        self.inner.lists.load(Ordering::SeqCst)
    }

    /// Watch requests served so far.
    pub fn watches(&self) -> usize {
        self.inner.watches.load(Ordering::SeqCst)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `slice`'s labels satisfy an equality selector `k=v,k2=v2`.
fn matches(slice: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .filter(|term| !term.trim().is_empty())
        .all(|term| {
            let (key, value) = term.split_once('=').unwrap_or((term, ""));
            let value = value.trim_start_matches('=');
            slice["metadata"]["labels"][key.trim()].as_str() == Some(value.trim())
        })
}

async fn endpointslices(
    State(ctx): State<Ctx>,
    UrlPath(ns): UrlPath<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if ns != ctx.namespace {
        let items: Vec<Value> = Vec::new();
        let rv = ctx.inner.rv.load(Ordering::SeqCst).to_string();
        return axum::Json(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": rv}, "items": items}),
        )
        .into_response();
    }
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    if query.get("watch").map(String::as_str) == Some("true") {
        return watch_response(ctx, selector, query.get("resourceVersion")).await;
    }
    ctx.inner.lists.fetch_add(1, Ordering::SeqCst);
    let (items, rv) = {
        let slices = lock(&ctx.inner.slices);
        let items: Vec<Value> = slices
            .values()
            .filter(|s| matches(s, &selector))
            .cloned()
            .collect();
        (items, ctx.inner.rv.load(Ordering::SeqCst))
    };
    axum::Json(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
        "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
    .into_response()
}

/// What one watch connection still has to send.
struct WatchState {
    backlog: std::vec::IntoIter<Event>,
    live: broadcast::Receiver<Event>,
    drop: watch::Receiver<u64>,
    selector: String,
    after: u64,
}

async fn watch_response(ctx: Ctx, selector: String, rv: Option<&String>) -> Response {
    ctx.inner.watches.fetch_add(1, Ordering::SeqCst);
    let chunked = |body: Body| {
        Response::builder()
            .header("content-type", "application/json")
            .body(body)
            .unwrap_or_else(|_| Response::new(Body::empty()))
    };
    let after: u64 = rv.and_then(|r| r.parse().ok()).unwrap_or(0);
    if after < ctx.inner.compacted.load(Ordering::SeqCst) {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version"}});
        return chunked(Body::from(format!("{gone}\n")));
    }
    // Subscribe before reading the log, so nothing falls between them.
    let live = ctx.live.subscribe();
    let backlog: Vec<Event> = lock(&ctx.inner.log)
        .iter()
        .filter(|e| e.rv > after)
        .cloned()
        .collect();
    let mut drop = ctx.drop_watches.clone();
    drop.mark_unchanged();
    let state = WatchState {
        backlog: backlog.into_iter(),
        live,
        drop,
        selector,
        after,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            let event = match s.backlog.next() {
                Some(e) => e,
                None => tokio::select! {
                    _ = s.drop.changed() => {
                        // Abort the body: hyper resets the connection
                        // without the terminating chunk.
                        return Some((Err(std::io::Error::other("watch dropped")), s));
                    }
                    e = s.live.recv() => match e {
                        Ok(e) => e,
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                },
            };
            // A bookmark is for everyone; others only when they match.
            let object: Value = serde_json::from_slice(&event.line).unwrap_or_default();
            let is_bookmark = object["type"] == "BOOKMARK";
            if is_bookmark || (event.rv > s.after && matches(&object["object"], &s.selector)) {
                s.after = s.after.max(event.rv);
                return Some((Ok::<_, std::io::Error>(event.line), s));
            }
        }
    });
    chunked(Body::from_stream(stream))
}

/// An EndpointSlice of one endpoint `ip` listening on port `port` named
/// `http`, labelled `labels`, ready or not.
pub fn slice(name: &str, labels: &[(&str, &str)], ip: &str, port: u16, ready: bool) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    json!({
        "metadata": {"name": name, "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip],
            "conditions": {"ready": ready, "serving": ready, "terminating": false},
            "targetRef": {"kind": "Pod", "name": format!("pod-{name}")}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}]
    })
}
