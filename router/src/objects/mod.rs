//! Stored objects: requests about a response, file or batch an engine
//! keeps go to the engine that created it.
//!
//! Why: engines that implement the Responses API (vLLM, SGLang) and the
//! Files and Batches APIs (SGLang) store what they create in their own
//! process; another engine has never heard of it. Routes read from
//! vLLM's `vllm/entrypoints/openai/responses/api_router.py` at commit
//! f6e93254b87059a005c9043f4c72322994aff95a (`POST /v1/responses`,
//! `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`) and
//! SGLang's `python/sglang/srt/entrypoints/http_server.py` at commit
//! 9c0549b727fe222444495cea6b369697534d60f0 (`POST /v1/files`,
//! `GET`/`DELETE /v1/files/{id}`, `GET /v1/files/{id}/content`,
//! `POST /v1/batches`, `GET /v1/batches/{id}`,
//! `POST /v1/batches/{id}/cancel`); `DELETE /v1/responses/{id}` and
//! `GET /v1/responses/{id}/input_items` are OpenAI's and treated alike.
//!
//! How: the id is learned from the creating answer as it streams through
//! (`learn`: the first few KiB of a creator route's body are scanned for
//! the object's `"id"`, nothing is buffered or delayed), kept in a
//! bounded id → worker table (`table`) and shared with the mesh peers, so
//! a request about the object at any replica goes to its engine. An id no
//! replica remembers is located by asking the workers one at a time (the
//! proxy's `Placement::Locate`).

mod learn;
mod scan;
mod table;

use http::Method;

pub use learn::LearnId;
pub use scan::{IdScanner, SCAN_LIMIT};
pub use table::{ObjectTable, ShareObject};

/// Longest object id the router keeps or routes by (the mesh's limit).
pub const MAX_ID_BYTES: usize = shoal_proto::frames::MAX_OBJECT_ID_BYTES;

/// Most workers asked, one at a time, for an object no replica remembers.
pub const MAX_LOCATE: usize = 16;

/// The kinds of stored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A Responses API response (`resp_…`).
    Response,
    /// An uploaded file (`file-…`).
    File,
    /// A batch (`batch_…`).
    Batch,
}

impl Kind {
    /// The word for one, in error messages.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Response => "response",
            Kind::File => "file",
            Kind::Batch => "batch",
        }
    }

    /// The collection path; an object is `{collection}/{id}`.
    pub fn collection(self) -> &'static str {
        match self {
            Kind::Response => "/v1/responses",
            Kind::File => "/v1/files",
            Kind::Batch => "/v1/batches",
        }
    }

    /// What a request on `route`'s creating path builds on, named by its
    /// body (`RequestInfo::builds_on`): a response continues a previous
    /// response, a batch reads an uploaded file.
    pub fn builds_on(self) -> Option<Kind> {
        match self {
            Kind::Response => Some(Kind::Response),
            Kind::Batch => Some(Kind::File),
            Kind::File => None,
        }
    }
}

/// What a request does with stored objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectRequest<'a> {
    /// Creates one (`POST` on the collection): its id is learned from the
    /// answer.
    Create(Kind),
    /// Reads, deletes or cancels the object with this id.
    About(Kind, &'a str),
}

/// Why a path names no object the router can route by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not an object id the router can route by (1 to {MAX_ID_BYTES} bytes of letters, digits, `-`, `_`, `.`)"
)]
pub struct BadId(pub String);

/// Whether `id` can be an engine's object id: 1 to [`MAX_ID_BYTES`] bytes
/// of ASCII letters, digits, `-`, `_` and `.` (every engine's ids are a
/// prefix and a UUID).
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The object request `method` and `path` make, if any: creating on a
/// collection, or reading, deleting or cancelling one object. Listing a
/// collection and unknown sub-paths are not object requests (routed as
/// before).
pub fn classify<'a>(method: &Method, path: &'a str) -> Result<Option<ObjectRequest<'a>>, BadId> {
    let Some(rest) = path.strip_prefix("/v1/") else {
        return Ok(None);
    };
    let (kind, rest) = match rest.split_once('/') {
        None => (rest, ""),
        Some((kind, rest)) => (kind, rest),
    };
    let kind = match kind {
        "responses" => Kind::Response,
        "files" => Kind::File,
        "batches" => Kind::Batch,
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok((method == Method::POST).then_some(ObjectRequest::Create(kind)));
    }
    let (id, tail) = match rest.split_once('/') {
        None => (rest, None),
        Some((id, tail)) => (id, Some(tail)),
    };
    let about = match (kind, method.as_str(), tail) {
        (_, "GET" | "DELETE", None) if kind != Kind::Batch => true,
        (Kind::Batch, "GET", None) => true,
        (Kind::Response | Kind::Batch, "POST", Some("cancel")) => true,
        (Kind::Response, "GET", Some("input_items")) => true,
        (Kind::File, "GET", Some("content")) => true,
        _ => false,
    };
    if !about {
        return Ok(None);
    }
    if !is_valid_id(id) {
        return Err(BadId(id.chars().take(MAX_ID_BYTES).collect()));
    }
    Ok(Some(ObjectRequest::About(kind, id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about(method: Method, path: &str) -> Option<(Kind, String)> {
        match classify(&method, path).unwrap() {
            Some(ObjectRequest::About(kind, id)) => Some((kind, id.to_string())),
            _ => None,
        }
    }

    #[test]
    fn every_object_route_is_recognised() {
        let r = |id: &str| Some((Kind::Response, id.to_string()));
        let f = |id: &str| Some((Kind::File, id.to_string()));
        let b = |id: &str| Some((Kind::Batch, id.to_string()));
        assert_eq!(about(Method::GET, "/v1/responses/resp_1"), r("resp_1"));
        assert_eq!(about(Method::DELETE, "/v1/responses/resp_1"), r("resp_1"));
        assert_eq!(
            about(Method::POST, "/v1/responses/resp_1/cancel"),
            r("resp_1")
        );
        assert_eq!(
            about(Method::GET, "/v1/responses/resp_1/input_items"),
            r("resp_1")
        );
        assert_eq!(about(Method::GET, "/v1/files/file-1"), f("file-1"));
        assert_eq!(about(Method::DELETE, "/v1/files/file-1"), f("file-1"));
        assert_eq!(about(Method::GET, "/v1/files/file-1/content"), f("file-1"));
        assert_eq!(about(Method::GET, "/v1/batches/batch_1"), b("batch_1"));
        assert_eq!(
            about(Method::POST, "/v1/batches/batch_1/cancel"),
            b("batch_1")
        );
        for (path, kind) in [
            ("/v1/responses", Kind::Response),
            ("/v1/files", Kind::File),
            ("/v1/batches", Kind::Batch),
        ] {
            assert_eq!(
                classify(&Method::POST, path).unwrap(),
                Some(ObjectRequest::Create(kind))
            );
        }
    }

    #[test]
    fn other_paths_and_methods_are_not_object_requests() {
        for (method, path) in [
            (Method::GET, "/v1/responses"),
            (Method::GET, "/v1/files"),
            (Method::POST, "/v1/chat/completions"),
            (Method::PUT, "/v1/responses/resp_1"),
            (Method::DELETE, "/v1/batches/batch_1"),
            (Method::GET, "/v1/responses/resp_1/other"),
            (Method::POST, "/v1/files/file-1/cancel"),
            (Method::GET, "/v1/responsesX/resp_1"),
            (Method::GET, "/generate"),
        ] {
            assert_eq!(classify(&method, path), Ok(None), "{method} {path}");
        }
    }

    #[test]
    fn an_id_the_router_cannot_hold_is_refused_by_name() {
        let long = format!("/v1/responses/{}", "x".repeat(MAX_ID_BYTES + 1));
        assert!(classify(&Method::GET, &long).is_err());
        assert!(classify(&Method::GET, "/v1/files/a%20b").is_err());
        assert_eq!(classify(&Method::GET, "/v1/files/"), Ok(None));
        assert!(is_valid_id("backend_input_file-8f1c.2"));
        assert!(!is_valid_id("a\"b"));
    }
}
