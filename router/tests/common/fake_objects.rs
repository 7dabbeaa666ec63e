//! The stored-object routes of a fake engine (Responses API, files,
//! batches): objects live in this engine only, as in vLLM and SGLang, so
//! a request about one reaching another engine gets 404.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// Ids are unique across every fake engine of the test process.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// One engine's objects and what reached it.
#[derive(Default)]
pub struct ObjectStore {
    /// Serve the object routes (off: they fall through to the catch-all).
    pub enabled: AtomicBool,
    ids: Mutex<HashSet<String>>,
    /// Requests about an object by id (found or not).
    pub about: AtomicUsize,
    /// Requests about an object by id that found it.
    pub found: AtomicUsize,
    /// Objects created.
    pub created: AtomicUsize,
    /// Creating requests that built on an object held here.
    pub built_on: AtomicUsize,
    /// Requests about an object to refuse with 503 before serving again.
    pub refuse: AtomicUsize,
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn not_found(what: &str) -> Response {
    json(
        StatusCode::NOT_FOUND,
        serde_json::json!({"error": {"message": format!("{what} not found"), "code": "not_found"}}),
    )
}

impl ObjectStore {
    /// Whether `id` is held here.
    pub fn holds(&self, id: &str) -> bool {
        self.ids.lock().unwrap().contains(id)
    }

    fn create(&self, prefix: &str) -> String {
        let id = format!("{prefix}{}", NEXT_ID.fetch_add(1, Ordering::SeqCst));
        self.ids.lock().unwrap().insert(id.clone());
        self.created.fetch_add(1, Ordering::SeqCst);
        id
    }

    /// The answer to an object route, or `None` for any other request.
    pub fn handle(&self, method: &Method, path: &str, body: &Bytes) -> Option<Response> {
        if !self.enabled.load(Ordering::SeqCst) {
            return None;
        }
        let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method.as_str(), segments.as_slice()) {
            ("POST", ["v1", "responses"]) => {
                if let Some(previous) = parsed["previous_response_id"].as_str() {
                    if !self.holds(previous) {
                        return Some(not_found("previous response"));
                    }
                    self.built_on.fetch_add(1, Ordering::SeqCst);
                }
                let id = self.create("resp_");
                if parsed["stream"].as_bool() == Some(true) {
                    let events = format!(
                        "event: response.created\ndata: {{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{{\"id\":\"{id}\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}}}\n\nevent: response.completed\ndata: {{\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{{\"id\":\"{id}\",\"status\":\"completed\"}}}}\n\n"
                    );
                    return Some(([("content-type", "text/event-stream")], events).into_response());
                }
                Some(json(
                    StatusCode::OK,
                    serde_json::json!({"id": id, "object": "response", "status": "completed",
                        "output": [{"id": "msg_1", "type": "message"}]}),
                ))
            }
            ("POST", ["v1", "files"]) => {
                let id = self.create("file-");
                Some(json(
                    StatusCode::OK,
                    serde_json::json!({"id": id, "object": "file", "bytes": body.len()}),
                ))
            }
            ("POST", ["v1", "batches"]) => {
                let file = parsed["input_file_id"].as_str().unwrap_or_default();
                if !self.holds(file) {
                    return Some(not_found("input file"));
                }
                self.built_on.fetch_add(1, Ordering::SeqCst);
                let id = self.create("batch_");
                Some(json(
                    StatusCode::OK,
                    serde_json::json!({"id": id, "object": "batch", "input_file_id": file}),
                ))
            }
            (_, ["v1", "responses" | "files" | "batches", id, ..]) => {
                self.about.fetch_add(1, Ordering::SeqCst);
                let refuse = self.refuse.load(Ordering::SeqCst);
                if refuse > 0 {
                    self.refuse.store(refuse - 1, Ordering::SeqCst);
                    return Some(json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        serde_json::json!({"error": {"message": "busy", "code": "busy"}}),
                    ));
                }
                if !self.holds(id) {
                    return Some(not_found("object"));
                }
                self.found.fetch_add(1, Ordering::SeqCst);
                if method == Method::DELETE {
                    self.ids.lock().unwrap().remove(*id);
                    return Some(json(
                        StatusCode::OK,
                        serde_json::json!({"id": id, "deleted": true}),
                    ));
                }
                Some(json(
                    StatusCode::OK,
                    serde_json::json!({"id": id, "status": "completed"}),
                ))
            }
            _ => None,
        }
    }
}
