//! Requests about stored objects: which workers they may go to, and
//! finding the one holding an object no replica remembers.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;

use super::{Forwarder, Outgoing, WorkerPool};
use crate::objects::{Kind, ObjectTable};
use crate::request::RequestInfo;
use crate::workers::Worker;

/// Which workers a request may go to.
///
/// Why not always the policy's pick: a request about a stored object
/// (a response, file or batch) can be served only by the engine holding it.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Any available worker the policy picks.
    Any,
    /// Only this worker, which holds the object: retries go to it too, and
    /// no other is tried when it is unavailable.
    Holder(Arc<Worker>),
    /// The object is remembered by no replica: ask the workers one at a
    /// time (at most [`crate::objects::MAX_LOCATE`]) until one answers other than
    /// 404; only for requests that are safe to send to a worker without
    /// the object (reads and deletes, which that worker answers 404).
    Locate,
}

/// Where a success's stored object is recorded.
#[derive(Debug, Clone, Copy)]
pub struct Learn<'a> {
    /// The id → worker table.
    pub table: &'a Arc<ObjectTable>,
    /// The object's id when the request names it (a located object);
    /// `None`: read it from the answer (a creating request).
    pub id: Option<&'a str>,
}

/// Where [`Forwarder::locate`] found an object.
#[derive(Debug)]
pub enum Located {
    /// This worker answered with a success: it holds the object.
    Holder(Arc<Worker>),
    /// Every worker asked (this many) answered 404.
    Nowhere(usize),
    /// No answer settled it (failures, or a status other than 2xx or 404).
    Unknown,
}

impl Forwarder {
    /// Finds the worker holding the object `kind`/`id` for `request` (one
    /// that must not go to a worker without it, such as a cancel or a
    /// follow-up `POST`): asks `GET {collection}/{id}` of the workers
    /// serving the request's model one at a time, with the request's
    /// headers and credentials, until one answers other than 404. A
    /// holder found is recorded in `table` (and so shared).
    pub async fn locate(
        &self,
        workers: WorkerPool<'_>,
        request: &Outgoing<'_>,
        (kind, id): (Kind, &str),
        table: &Arc<ObjectTable>,
    ) -> Located {
        let path = format!("{}/{id}", kind.collection());
        let info = RequestInfo {
            runs_no_model: true,
            model: request.info.model.clone(),
            ..RequestInfo::default()
        };
        let probe = Outgoing {
            method: &Method::GET,
            headers: request.headers,
            authorization: request.authorization,
            traceparent: request.traceparent,
            path_and_query: &path,
            body: Bytes::new(),
            info: &info,
            placement: Placement::Locate,
            learn: None,
            migratable: None,
        };
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        match self.attempts(workers, &probe, "other", deadline).await {
            Ok(answer) if answer.response.status().is_success() => {
                table.learn(id, answer.worker.url());
                Located::Holder(answer.worker.clone())
            }
            Ok(answer) if answer.response.status() == http::StatusCode::NOT_FOUND => {
                Located::Nowhere(answer.attempts)
            }
            _ => Located::Unknown,
        }
    }
}
