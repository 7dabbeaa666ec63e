//! What each worker serves, and the candidate list of every model.
//!
//! Why an index: most fleets serve several models or LoRA adapters, and a
//! request for one must only reach engines that serve it. The request path
//! must not filter the whole worker list per request, so the registry keeps
//! one list per model, rebuilt only when a worker joins, leaves or changes
//! what it serves (its `/v1/models`, read with the health checks).
//!
//! A worker whose list was read and says nothing (an engine without
//! `/v1/models`) is a candidate for every model: refusing requests because
//! a listing endpoint is missing would be worse than letting the engine
//! judge. A worker whose list was not read *yet* is not a candidate for a
//! named model while some read worker serves it: a new engine would
//! otherwise take requests for every model in the moment before its list
//! arrives, and answer 404 to the models it does not serve. (Workers added
//! at run time are not routed at all until their first check, which reads
//! the list; see `Registry::add`.)

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::Worker;

/// Most model ids read from one worker's list.
pub const MAX_MODELS_PER_WORKER: usize = 4096;
/// Longest model id kept, in bytes.
pub const MAX_MODEL_ID_BYTES: usize = 512;

/// What a worker serves, as its model list last said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Served {
    /// Not read yet: a candidate only for requests naming no model, or a
    /// model no read worker serves.
    #[default]
    Unread,
    /// Read, and the engine lists nothing: a candidate for every model.
    Any,
    /// These model ids (base models and LoRA adapters), sorted, unique.
    Models(Arc<[Arc<str>]>),
}

impl Served {
    /// The ids in `ids`, sorted and deduplicated.
    pub fn models(ids: impl IntoIterator<Item = impl Into<Arc<str>>>) -> Self {
        let mut ids: Vec<Arc<str>> = ids.into_iter().map(Into::into).collect();
        ids.sort();
        ids.dedup();
        Served::Models(ids.into())
    }

    /// The ids, when known.
    pub fn ids(&self) -> Option<&[Arc<str>]> {
        match self {
            Served::Unread | Served::Any => None,
            Served::Models(ids) => Some(ids),
        }
    }
}

/// One worker's model list as read: what it serves, and the engine's own
/// model objects (`GET /v1/models` answers with these, unchanged).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelList {
    /// The ids.
    pub served: Served,
    /// The engine's model objects, one per id.
    pub cards: Vec<serde_json::Value>,
}

/// The model ids of an OpenAI `/v1/models` answer (`data[].id`): vLLM and
/// SGLang list base models and LoRA adapters alike; llama.cpp lists its
/// model. `None` when the body is not such a list or lists nothing (an
/// engine serving no model tells nothing). Ids that are empty or over
/// [`MAX_MODEL_ID_BYTES`] are skipped; at most [`MAX_MODELS_PER_WORKER`]
/// are read.
pub fn parse_model_list(body: &[u8]) -> Option<ModelList> {
    #[derive(Deserialize)]
    struct List {
        data: Vec<serde_json::Value>,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    let cards: Vec<serde_json::Value> = list
        .data
        .into_iter()
        .filter(|card| {
            card.get("id")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|id| !id.is_empty() && id.len() <= MAX_MODEL_ID_BYTES)
        })
        .take(MAX_MODELS_PER_WORKER)
        .collect();
    if cards.is_empty() {
        return None;
    }
    let ids = cards
        .iter()
        .filter_map(|card| card.get("id")?.as_str())
        .map(str::to_owned);
    Some(ModelList {
        served: Served::models(ids),
        cards,
    })
}

/// A request named a model no worker serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNotFound {
    /// The model asked for.
    pub model: String,
    /// Every model some worker serves, sorted.
    pub served: Vec<Arc<str>>,
}

/// The workers of one registry state, all of them and by model.
#[derive(Debug, Default)]
pub struct ModelIndex {
    all: Arc<Vec<Arc<Worker>>>,
    /// Per model id: the workers listing it, then every worker that lists
    /// nothing ([`Served::Any`]).
    by_model: HashMap<Arc<str>, Arc<Vec<Arc<Worker>>>>,
    /// The workers that list nothing.
    unknown: Arc<Vec<Arc<Worker>>>,
    /// The workers whose list was not read yet.
    unread: Arc<Vec<Arc<Worker>>>,
}

impl ModelIndex {
    /// Indexes `all` by what each worker serves now.
    pub fn build(all: Arc<Vec<Arc<Worker>>>) -> Self {
        let with = |served: Served| -> Vec<Arc<Worker>> {
            all.iter()
                .filter(|w| *w.served() == served)
                .cloned()
                .collect()
        };
        let (unknown, unread) = (with(Served::Any), with(Served::Unread));
        let mut listing: HashMap<Arc<str>, Vec<Arc<Worker>>> = HashMap::new();
        for worker in all.iter() {
            if let Some(ids) = worker.served().ids() {
                for id in ids {
                    listing.entry(id.clone()).or_default().push(worker.clone());
                }
            }
        }
        let by_model = listing
            .into_iter()
            .map(|(id, mut workers)| {
                workers.extend(unknown.iter().cloned());
                (id, Arc::new(workers))
            })
            .collect();
        Self {
            all,
            by_model,
            unknown: Arc::new(unknown),
            unread: Arc::new(unread),
        }
    }

    /// Every worker, in registration order.
    pub fn all(&self) -> &Arc<Vec<Arc<Worker>>> {
        &self.all
    }

    /// The workers a request for `model` may go to: every worker when it
    /// names none; those listing it (and those that list nothing); for
    /// `base:adapter` (SGLang's LoRA naming) not listed as such, those
    /// serving `base`; for a model no read list names, the workers that
    /// list nothing, else those not read yet (they may serve it). With
    /// none of those it is [`ModelNotFound`].
    pub fn serving(&self, model: Option<&str>) -> Result<&Arc<Vec<Arc<Worker>>>, ModelNotFound> {
        let Some(model) = model else {
            return Ok(&self.all);
        };
        if let Some(workers) = self.by_model.get(model) {
            return Ok(workers);
        }
        if let Some((base, _adapter)) = model.split_once(':')
            && let Some(workers) = self.by_model.get(base)
        {
            return Ok(workers);
        }
        if !self.unknown.is_empty() || self.all.is_empty() {
            return Ok(&self.unknown);
        }
        if !self.unread.is_empty() {
            return Ok(&self.unread);
        }
        let mut served: Vec<Arc<str>> = self.by_model.keys().cloned().collect();
        served.sort();
        Err(ModelNotFound {
            model: model.to_string(),
            served,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;

    fn worker(url: &str, served: Served) -> Arc<Worker> {
        let w = Worker::new(url.into(), BreakerConfig::default());
        w.set_served(served);
        Arc::new(w)
    }

    fn urls(workers: &[Arc<Worker>]) -> Vec<&str> {
        workers.iter().map(|w| w.url()).collect()
    }

    #[test]
    fn model_lists_of_vllm_sglang_and_llamacpp_parse_to_ids() {
        let vllm = br#"{"object":"list","data":[
            {"id":"meta-llama/Llama-3.1-8B","object":"model","owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null,"max_model_len":131072},
            {"id":"sql-lora","object":"model","owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B","max_model_len":null}]}"#;
        let ids = |body: &[u8]| parse_model_list(body).map(|l| l.served);
        assert_eq!(
            ids(vllm),
            Some(Served::models(["sql-lora", "meta-llama/Llama-3.1-8B"]))
        );
        let llamacpp = br#"{"object":"list","data":[{"id":"qwen.gguf","owned_by":"llamacpp","meta":{"n_ctx_train":4096}}],"models":[{"name":"qwen.gguf"}]}"#;
        assert_eq!(ids(llamacpp), Some(Served::models(["qwen.gguf"])));
        let odd = br#"{"data":[{"id":7},{"id":""},{"object":"model"},{"id":"a"},{"id":"a"}]}"#;
        assert_eq!(ids(odd), Some(Served::models(["a"])));
        assert_eq!(parse_model_list(b"{\"models\":[]}"), None);
        assert_eq!(
            parse_model_list(b"{\"data\":[]}"),
            None,
            "an empty list says nothing"
        );
        assert_eq!(parse_model_list(b"<html>"), None);
    }

    #[test]
    fn requests_reach_only_the_workers_serving_their_model() {
        let a = worker("http://a:1", Served::models(["llama", "llama-lora"]));
        let b = worker("http://b:1", Served::models(["qwen"]));
        let c = worker("http://c:1", Served::models(["llama"]));
        let index = ModelIndex::build(Arc::new(vec![a, b, c]));
        assert_eq!(
            urls(index.serving(Some("llama")).unwrap()),
            ["http://a:1", "http://c:1"]
        );
        assert_eq!(
            urls(index.serving(Some("llama-lora")).unwrap()),
            ["http://a:1"]
        );
        assert_eq!(urls(index.serving(Some("qwen")).unwrap()), ["http://b:1"]);
        assert_eq!(
            index.serving(None).unwrap().len(),
            3,
            "no model: any worker"
        );
        assert_eq!(
            urls(index.serving(Some("qwen:my-adapter")).unwrap()),
            ["http://b:1"],
            "SGLang's base:adapter goes to the base's workers"
        );
        let missing = index.serving(Some("gpt-4")).unwrap_err();
        assert_eq!(missing.model, "gpt-4");
        assert_eq!(
            missing.served,
            vec![Arc::from("llama"), "llama-lora".into(), "qwen".into()]
        );
    }

    #[test]
    fn a_worker_that_lists_nothing_is_a_candidate_for_every_model() {
        let a = worker("http://a:1", Served::models(["llama"]));
        let u = worker("http://u:1", Served::Any);
        let index = ModelIndex::build(Arc::new(vec![a, u]));
        assert_eq!(
            urls(index.serving(Some("llama")).unwrap()),
            ["http://a:1", "http://u:1"]
        );
        assert_eq!(urls(index.serving(Some("other")).unwrap()), ["http://u:1"]);
        let empty = ModelIndex::build(Arc::new(Vec::new()));
        assert!(
            empty.serving(Some("x")).unwrap().is_empty(),
            "no workers: 503, not 404"
        );
    }

    #[test]
    fn a_worker_not_read_yet_takes_no_model_a_read_worker_serves() {
        let a = worker("http://a:1", Served::models(["llama"]));
        let new = worker("http://new:1", Served::Unread);
        let index = ModelIndex::build(Arc::new(vec![a, new]));
        assert_eq!(
            urls(index.serving(Some("llama")).unwrap()),
            ["http://a:1"],
            "the new worker may not serve llama: it waits for its list"
        );
        assert_eq!(
            urls(index.serving(Some("qwen")).unwrap()),
            ["http://new:1"],
            "a model no read worker serves may be the new one's"
        );
        assert_eq!(index.serving(None).unwrap().len(), 2);
        let only_read = ModelIndex::build(Arc::new(vec![worker(
            "http://a:1",
            Served::models(["llama"]),
        )]));
        assert!(only_read.serving(Some("qwen")).is_err());
    }

    #[test]
    fn the_engine_model_objects_are_kept_beside_their_ids() {
        let list = parse_model_list(
            br#"{"data":[{"id":"m","object":"model","max_model_len":4096},{"id":""}]}"#,
        )
        .unwrap();
        assert_eq!(list.served, Served::models(["m"]));
        assert_eq!(list.cards.len(), 1);
        assert_eq!(list.cards[0]["max_model_len"], 4096);
    }
}
