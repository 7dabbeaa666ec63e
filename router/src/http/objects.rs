//! Where a request about a stored object may go: the front's half of
//! `objects` (the proxy does the sending).
//!
//! A request about an object (by its path, or by the object its body
//! builds on) goes to the worker remembered as holding it, and only
//! there: when that worker is unavailable or gone the answer is 503 with
//! the reason, never another worker, which would not have it. An object no
//! replica remembers is located by asking: a read or delete is itself sent
//! to the workers one at a time until one answers other than 404 (a worker
//! without the object answers 404 and changes nothing); anything else
//! (a cancel, a follow-up generation, a batch over a file) first asks
//! `GET` of the object, then goes to the worker that has it, and gets 404
//! `object_not_found` when none has.

use std::sync::Arc;

use http::Method;

use super::state::AppState;
use crate::error::ApiError;
use crate::objects::{self, Kind, ObjectRequest};
use crate::proxy::{Learn, Located, Outgoing, Placement, WorkerPool};
use crate::request::Route;

/// What a request does with stored objects, read from its route, path
/// and body before it is routed: nothing on every other route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectPlan<'a> {
    /// The object it is about or builds on.
    pub about: Option<(Kind, &'a str)>,
    /// It creates an object: learn its id from the answer.
    pub creates: bool,
}

/// Reads the plan of a request on `route` to `path`; `builds_on` is the
/// body's `previous_response_id` or `input_file_id`. A malformed id is a
/// 400 naming it.
pub fn plan<'a>(
    route: Route,
    method: &Method,
    path: &'a str,
    builds_on: Option<&'a str>,
) -> Result<Option<ObjectPlan<'a>>, ApiError> {
    if !matches!(route, Route::Responses | Route::Other) {
        return Ok(None);
    }
    let bad_id = |e: objects::BadId| ApiError::bad_request("invalid_object_id", e.to_string());
    Ok(match objects::classify(method, path).map_err(bad_id)? {
        None => None,
        Some(ObjectRequest::About(kind, id)) => Some(ObjectPlan {
            about: Some((kind, id)),
            creates: false,
        }),
        Some(ObjectRequest::Create(kind)) => {
            let about = match (kind.builds_on(), builds_on) {
                (Some(base), Some(id)) if objects::is_valid_id(id) => Some((base, id)),
                (Some(_), Some(id)) => return Err(bad_id(objects::BadId(id.to_string()))),
                _ => None,
            };
            Some(ObjectPlan {
                about,
                creates: true,
            })
        }
    })
}

/// Sets `outgoing`'s placement and learning from `plan`, locating the
/// object first when no replica remembers it and the request must not
/// reach a worker without it.
pub async fn place<'a>(
    app: &'a AppState,
    workers: WorkerPool<'_>,
    outgoing: &mut Outgoing<'a>,
    plan: ObjectPlan<'a>,
) -> Result<(), ApiError> {
    if plan.creates {
        outgoing.learn = Some(Learn {
            table: &app.objects,
            id: None,
        });
    }
    let Some((kind, id)) = plan.about else {
        return Ok(());
    };
    if let Some(url) = app.objects.holder(id) {
        outgoing.placement = Placement::Holder(holder(app, kind, id, &url)?);
        return Ok(());
    }
    let is_read_or_delete =
        !plan.creates && matches!(*outgoing.method, Method::GET | Method::DELETE);
    if is_read_or_delete {
        outgoing.placement = Placement::Locate;
        outgoing.learn = Some(Learn {
            table: &app.objects,
            id: Some(id),
        });
        return Ok(());
    }
    match app
        .forwarder
        .locate(workers, outgoing, (kind, id), &app.objects)
        .await
    {
        Located::Holder(worker) => outgoing.placement = Placement::Holder(worker),
        Located::Nowhere(asked) => {
            return Err(ApiError::object_not_found(format!(
                "no worker holds {} {id}: asked {asked} worker(s), each answered 404",
                kind.noun()
            )));
        }
        // Nothing settled where it is: the engine the policy picks judges.
        Located::Unknown => {}
    }
    Ok(())
}

/// The registered, available worker at `url` that holds `kind`/`id`, or
/// the 503 saying why it cannot be used.
fn holder(
    app: &AppState,
    kind: Kind,
    id: &str,
    url: &str,
) -> Result<Arc<crate::workers::Worker>, ApiError> {
    let noun = kind.noun();
    match app.registry.find(url) {
        Some(worker) if worker.is_available() => Ok(worker),
        Some(worker) => {
            let why = match worker.is_healthy() {
                false => "failing health checks",
                true => "its circuit is open",
            };
            Err(ApiError::object_worker_unavailable(format!(
                "{noun} {id} is held by worker {url}, which is unavailable ({why}); no other worker has it"
            )))
        }
        None => Err(ApiError::object_worker_unavailable(format!(
            "{noun} {id} is held by worker {url}, which is no longer registered; no other worker has it"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_object_routes_have_a_plan() {
        let m = Method::POST;
        assert_eq!(
            plan(Route::ChatCompletions, &m, "/v1/chat/completions", None),
            Ok(None)
        );
        assert_eq!(
            plan(Route::Responses, &m, "/v1/responses", Some("resp_1")),
            Ok(Some(ObjectPlan {
                about: Some((Kind::Response, "resp_1")),
                creates: true
            }))
        );
        assert_eq!(
            plan(Route::Other, &m, "/v1/batches", Some("file-1")),
            Ok(Some(ObjectPlan {
                about: Some((Kind::File, "file-1")),
                creates: true
            }))
        );
        assert_eq!(
            plan(Route::Other, &m, "/v1/files", Some("x")),
            Ok(Some(ObjectPlan {
                about: None,
                creates: true
            })),
            "an upload builds on nothing"
        );
        let err = plan(Route::Responses, &m, "/v1/responses", Some("a b")).unwrap_err();
        assert_eq!(err.code, "invalid_object_id");
        assert_eq!(
            plan(Route::Other, &Method::GET, "/v1/responses/resp_9", None),
            Ok(Some(ObjectPlan {
                about: Some((Kind::Response, "resp_9")),
                creates: false
            }))
        );
    }
}
