//! What each worker serves, and the candidate list of every model.
//!
//! Why an index: most fleets serve several models or LoRA adapters, and a
//! request for one must only reach engines that serve it. The request path
//! must not filter the whole worker list per request, so the registry keeps
//! one list per model, rebuilt only when a worker joins, leaves or changes
//! what it serves (its `/v1/models`, read with the health checks). A worker
//! whose list is unknown (never read, or an engine without `/v1/models`)
//! is a candidate for every model: refusing requests because a listing
//! endpoint is missing would be worse than letting the engine judge.

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
    /// Not known: the worker is a candidate for every model.
    #[default]
    Unknown,
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
            Served::Unknown => None,
            Served::Models(ids) => Some(ids),
        }
    }
}

/// The model ids of an OpenAI `/v1/models` answer (`data[].id`): vLLM and
/// SGLang list base models and LoRA adapters alike; llama.cpp lists its
/// model. `None` when the body is not such a list or lists nothing (an
/// engine serving no model tells nothing). Ids that are empty or over
/// [`MAX_MODEL_ID_BYTES`] are skipped; at most [`MAX_MODELS_PER_WORKER`]
/// are read.
pub fn parse_model_list(body: &[u8]) -> Option<Served> {
    #[derive(Deserialize)]
    struct Card {
        id: Option<serde_json::Value>,
    }
    #[derive(Deserialize)]
    struct List {
        data: Vec<Card>,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    let mut ids = list
        .data
        .iter()
        .filter_map(|card| card.id.as_ref()?.as_str())
        .filter(|id| !id.is_empty() && id.len() <= MAX_MODEL_ID_BYTES)
        .take(MAX_MODELS_PER_WORKER)
        .peekable();
    ids.peek()?;
    Some(Served::models(ids))
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
    /// Per model id: the workers listing it, then every worker whose list
    /// is unknown.
    by_model: HashMap<Arc<str>, Arc<Vec<Arc<Worker>>>>,
    /// The workers whose list is unknown.
    unknown: Arc<Vec<Arc<Worker>>>,
}

impl ModelIndex {
    /// Indexes `all` by what each worker serves now.
    pub fn build(all: Arc<Vec<Arc<Worker>>>) -> Self {
        let unknown: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| w.served().ids().is_none())
            .cloned()
            .collect();
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
        }
    }

    /// Every worker, in registration order.
    pub fn all(&self) -> &Arc<Vec<Arc<Worker>>> {
        &self.all
    }

    /// The workers a request for `model` may go to: every worker when it
    /// names none; those listing it (and those whose list is unknown);
    /// for `base:adapter` (SGLang's LoRA naming) not listed as such, those
    /// serving `base`. An unknown model with no unknown-list worker to try
    /// is [`ModelNotFound`].
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
        assert_eq!(
            parse_model_list(vllm),
            Some(Served::models(["sql-lora", "meta-llama/Llama-3.1-8B"]))
        );
        let llamacpp = br#"{"object":"list","data":[{"id":"qwen.gguf","owned_by":"llamacpp","meta":{"n_ctx_train":4096}}],"models":[{"name":"qwen.gguf"}]}"#;
        assert_eq!(
            parse_model_list(llamacpp),
            Some(Served::models(["qwen.gguf"]))
        );
        let odd = br#"{"data":[{"id":7},{"id":""},{"object":"model"},{"id":"a"},{"id":"a"}]}"#;
        assert_eq!(parse_model_list(odd), Some(Served::models(["a"])));
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
    fn a_worker_whose_list_is_unknown_is_a_candidate_for_every_model() {
        let a = worker("http://a:1", Served::models(["llama"]));
        let u = worker("http://u:1", Served::Unknown);
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
}
