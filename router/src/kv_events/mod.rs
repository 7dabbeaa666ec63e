//! Routing on where the KV cache really is: the engines' own KV-cache
//! events (vLLM, SGLang), one exact index on every replica.
//!
//! **Every replica subscribes to every engine.** The alternative — one
//! subscriber per engine (poll ownership) shipping index deltas over the
//! mesh — saves sockets (E instead of R × E) but adds a second source of
//! truth with its own ordering, loss and warm-up problems, and a block's
//! arrival at a replica then depends on two hops instead of one. A batch
//! is a few hundred bytes per engine step; R × E subscriptions cost each
//! engine R copies of that (R is 2–10 behind one Service), and each
//! replica applies the same ordered stream per engine, so every replica's
//! index is the same by construction: no merge, no extra frames.
//!
//! Parts: [`wire`] decodes the batches; [`sequence`] judges each batch's
//! number (gap, restart, late join); [`subscriber`] owns one engine's
//! sockets (SUB, and DEALER for replay); [`index`] maps blocks to engines;
//! [`chain`] is Shoal's block hash over token ids; [`tokens`] turns a
//! prompt into those blocks. This module wires them to the worker
//! registry: a stream per worker (per data-parallel rank) while the worker
//! is registered.

pub mod chain;
pub mod chat_template;
pub mod engine_tokens;
pub mod holders;
pub mod index;
pub mod msgpack;
pub mod sequence;
pub mod subscriber;
pub mod token_cache;
pub mod tokens;
pub mod vectors;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::KvEventsConfig;
use crate::id_hash::IdMap;
use crate::request::RequestInfo;
use crate::upstream::HttpClient;
use crate::workers::Registry;

pub use index::{Coverage, KvIndex, StreamId};
pub use subscriber::StreamEndpoints;
pub use tokens::Tokenizers;

/// Prompt bytes that choose the engine asked to tokenize.
const ENGINE_PICK_BYTES: usize = 256;

/// How often the set of streams is matched to the registry.
const RECONCILE_EVERY: Duration = Duration::from_millis(500);

/// The KV-event side of one replica: its index, the tokenizers that make
/// prompts into blocks, and where each worker's events come from.
#[derive(Debug)]
pub struct KvEvents {
    config: KvEventsConfig,
    index: Arc<RwLock<KvIndex>>,
    tokenizers: Tokenizers,
    load_error: Option<String>,
}

/// A prompt cut into the engines' blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptBlocks {
    /// Shoal's chained hashes of its full blocks, in order.
    pub hashes: Vec<u64>,
    /// Its length in the tokenizer's tokens (the unit of the blocks):
    /// exact for the engine's own ids, whose cached share it gives; else
    /// extrapolated from the part tokenized (0: not tokenized).
    pub tokens: usize,
    /// A hash of all its tokens, the partial last block included: two
    /// prompts differing only after their last full block still differ
    /// here (the policy spreads near-ties on it).
    pub whole: u64,
    /// The tokenized text's bytes up to the end of each full block, when
    /// Shoal's tokenizer made the ids (empty for the engine's own ids).
    pub block_ends: Vec<u32>,
    /// The tokenized text's length in bytes (what `block_ends` are a
    /// share of).
    pub text_bytes: usize,
}

impl PromptBlocks {
    /// A prompt that was not tokenized: no blocks, identified by its text
    /// alone (so near-ties still spread by it).
    pub fn untokenized(request: &RequestInfo) -> Self {
        let text = request.text.as_deref().unwrap_or_default();
        Self {
            hashes: Vec::new(),
            tokens: 0,
            whole: chain::text(chain::seed(None), text.as_bytes()),
            block_ends: Vec::new(),
            text_bytes: 0,
        }
    }

    /// The part of `prompt_tokens` (the request's own estimate, the unit
    /// of its work) that its first `depth` blocks make up, blocks of
    /// `block_size` tokens. By bytes where Shoal tokenized the text: the
    /// blocks' text over the whole text's, a function of the prompt and
    /// the depth alone. Tokens counted from where this replica stopped
    /// tokenizing would extrapolate differently on a replica whose prefix
    /// cache held more of the prompt, and two replicas with one index
    /// would score one request differently. With the engine's ids, the
    /// whole prompt is known in tokens and the share is exact.
    pub fn cached_part(&self, depth: usize, block_size: usize, prompt_tokens: u64) -> u64 {
        let Some(last) = depth.checked_sub(1) else {
            return 0;
        };
        let prompt = u128::from(prompt_tokens);
        if let Some(&end) = self.block_ends.get(last)
            && self.text_bytes > 0
        {
            let text = self.text_bytes as u128;
            return (u128::from(end).min(text) * prompt / text) as u64;
        }
        let tokenized = (self.tokens as u128).max(1);
        let cached = (depth as u128 * block_size as u128).min(tokenized);
        (cached * prompt / tokenized) as u64
    }
}

/// The text bytes up to the end of each of the first `blocks` blocks of
/// `size` ids, from each id's byte length (an id past the table counts 0).
fn byte_ends(ids: &[u32], size: usize, blocks: usize, lengths: &[u16]) -> Vec<u32> {
    let mut end = 0u32;
    ids.chunks_exact(size.max(1))
        .take(blocks)
        .map(|block| {
            for id in block {
                let length = lengths.get(*id as usize).copied().unwrap_or(0);
                end = end.saturating_add(u32::from(length));
            }
            end
        })
        .collect()
}

impl KvEvents {
    /// The KV-event side for these flags. Tokenizers that do not load
    /// leave it without any, and [`KvEvents::load_error`] says why (the
    /// replica refuses to start; a reload keeps the running policy).
    pub fn new(config: KvEventsConfig) -> Self {
        let (tokenizers, load_error) =
            match Tokenizers::load(&config.tokenizers(), &config.chat_templates()) {
                Ok(tokenizers) => (tokenizers, None),
                Err(e) => (Tokenizers::default(), Some(e)),
            };
        Self {
            load_error,
            index: Arc::new(RwLock::new(KvIndex::new(
                config.kv_block_size,
                config.kv_index_max_blocks_per_engine,
            ))),
            tokenizers,
            config,
        }
    }

    /// Why the tokenizers did not load, if they did not (the message names
    /// the flag and the file).
    pub fn load_error(&self) -> Option<String> {
        self.load_error.clone()
    }

    /// The index (tests and the debug endpoint read it).
    pub fn index(&self) -> &RwLock<KvIndex> {
        &self.index
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, KvIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `worker`'s engine ranks publish: its `--kv-events-endpoint`,
    /// else the sockets discovery found for it, else the port flags on the
    /// URL's host; empty when none says.
    pub fn endpoints_of(&self, worker: &crate::workers::Worker) -> Vec<StreamEndpoints> {
        let explicit = self
            .config
            .kv_events_endpoint
            .iter()
            .any(|(url, _, _)| url == worker.url());
        match worker.kv_event_sockets() {
            Some(found) if !explicit => self.ranks_of(&found.events, found.replay.as_deref()),
            _ => self.endpoints_for(worker.url()),
        }
    }

    /// `events` and `replay` moved up by each data-parallel rank.
    fn ranks_of(&self, events: &str, replay: Option<&str>) -> Vec<StreamEndpoints> {
        (0..self.config.kv_events_dp_ranks)
            .filter_map(|rank| {
                Some(StreamEndpoints {
                    events: offset_port(events, rank)?,
                    replay: match replay {
                        Some(r) => Some(offset_port(r, rank)?),
                        None => None,
                    },
                })
            })
            .collect()
    }

    /// Where `worker_url`'s engine ranks publish, from the port flags and
    /// the URL's host; empty when no events port is set.
    pub fn endpoints_for(&self, worker_url: &str) -> Vec<StreamEndpoints> {
        if let Some((_, events, replay)) = self
            .config
            .kv_events_endpoint
            .iter()
            .find(|(url, _, _)| url == worker_url)
        {
            return self.ranks_of(events, replay.as_deref());
        }
        let Some(port) = self.config.kv_events_port else {
            return Vec::new();
        };
        let Some(host) = url_host(worker_url) else {
            return Vec::new();
        };
        (0..self.config.kv_events_dp_ranks)
            .filter_map(|rank| {
                let events = port.checked_add(u16::try_from(rank).ok()?)?;
                let replay = self
                    .config
                    .kv_events_replay_port
                    .and_then(|p| p.checked_add(u16::try_from(rank).ok()?));
                Some(StreamEndpoints {
                    events: format!("tcp://{host}:{events}"),
                    replay: replay.map(|p| format!("tcp://{host}:{p}")),
                })
            })
            .collect()
    }

    /// The chained block hashes of `request`'s prompt, as deep as any
    /// engine may cache it, and its length in tokens; `None` when no
    /// tokenizer serves its model or it has no text.
    ///
    /// Tokenizing is most of a selection's cost, and no engine can hold a
    /// block whose parent it does not hold (a prefix match stops at the
    /// first miss), so the prompt is tokenized segment by segment and
    /// stops after the first segment whose last full block no engine
    /// holds: a first turn of 8k tokens tokenizes its shared opening and
    /// one segment more, a later turn its cached history and one segment.
    pub fn prompt_blocks(&self, request: &RequestInfo) -> Option<PromptBlocks> {
        let size = self.config.kv_block_size.max(1);
        let mut hashes: Vec<u64> = Vec::new();
        let seed = self.chain_seed(request.model.as_deref());
        let mut parent = seed;
        let chain_to = |ids: &[u32], hashes: &mut Vec<u64>, parent: &mut u64| {
            let from = hashes.len() * size;
            let to = ids.len() / size * size;
            if let Some(new) = ids.get(from..to) {
                for chunk in new.chunks_exact(size) {
                    *parent = chain::block(*parent, chunk);
                    hashes.push(*parent);
                }
            }
        };
        let prefix = self.tokenizers.encode_request_while(request, |ids| {
            let before = hashes.len();
            chain_to(ids, &mut hashes, &mut parent);
            hashes.len() == before || self.read().holds(parent)
        })?;
        chain_to(&prefix.ids, &mut hashes, &mut parent);
        let whole = match request.text.as_deref() {
            Some(text) => chain::text(seed, text.as_bytes()),
            None => chain::block(parent, &prefix.ids[hashes.len() * size..]),
        };
        let block_ends = match self.tokenizers.token_bytes(request) {
            Some(lengths) => byte_ends(&prefix.ids, size, hashes.len(), lengths),
            None => Vec::new(),
        };
        Some(PromptBlocks {
            hashes,
            tokens: prefix.estimated_tokens(),
            whole,
            block_ends,
            text_bytes: prefix.text_bytes,
        })
    }

    /// The seed of a request's block chain: its model's name when the
    /// engines have cached blocks under that name as an adapter (vLLM and
    /// SGLang name a LoRA adapter by the model clients ask for), else the
    /// base model's. Blocks are per adapter.
    fn chain_seed(&self, model: Option<&str>) -> u64 {
        match model {
            Some(name) if self.read().has_adapter(name) => chain::seed(Some(name)),
            _ => chain::seed(None),
        }
    }

    /// Fills `request.token_ids` from one of its model's engines when
    /// `--kv-tokenize-on-engine` is set and no local tokenizer serves the
    /// model. The engine is chosen by the prompt's opening bytes (one
    /// conversation asks one engine; many spread); a failure is logged,
    /// counted and leaves the request without tokens (it matches no cache).
    pub async fn tokenize_on_engine(
        &self,
        request: &mut RequestInfo,
        registry: &Registry,
        client: &HttpClient,
    ) {
        let model = request.model.as_deref();
        if !self.config.kv_tokenize_on_engine || self.tokenizers.serves(model) {
            return;
        }
        let Some(text) = request.text.as_deref() else {
            return;
        };
        let Ok(workers) = registry.serving(model) else {
            return;
        };
        let available: Vec<&Arc<crate::workers::Worker>> =
            workers.iter().filter(|w| w.is_available()).collect();
        let opening = text
            .get(..text.len().min(ENGINE_PICK_BYTES))
            .unwrap_or(text);
        let Some(worker) = available
            .get((crate::workers::url_hash(opening) % available.len().max(1) as u64) as usize)
        else {
            return;
        };
        let result = match engine_tokens::tokenize_on(client, worker, request).await {
            Ok(ids) => {
                request.token_ids = Some(ids);
                "ok"
            }
            Err(e) => {
                tracing::debug!(worker = worker.url(), error = %e, "engine tokenize failed");
                "error"
            }
        };
        metrics::counter!("shoal_kv_engine_tokenize_total", "result" => result).increment(1);
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.config.kv_block_size
    }

    /// Each worker's cached prefix of `blocks` in blocks (the best of its
    /// ranks), for workers whose index can be routed on.
    pub fn cached_blocks(&self, blocks: &[u64], out: &mut IdMap<u64, usize>) {
        self.cached_and_trusted(blocks, &[], out, &mut Vec::new());
    }

    /// [`KvEvents::cached_blocks`] and, for each of `workers`, whether it
    /// is [trusted](KvEvents::trusted), under one read of the index (the
    /// request path reads it once, not once per candidate).
    pub fn cached_and_trusted(
        &self,
        blocks: &[u64],
        workers: &[u64],
        out: &mut IdMap<u64, usize>,
        trusted: &mut Vec<bool>,
    ) {
        out.clear();
        let mut matches = Vec::new();
        let index = self.read();
        index.matches(blocks, &mut matches);
        trusted.clear();
        trusted.extend(
            workers
                .iter()
                .map(|w| index.worker_coverage(*w) != Coverage::Cold),
        );
        drop(index);
        for (worker, depth) in matches {
            let best = out.entry(worker).or_insert(0);
            *best = (*best).max(depth);
        }
    }

    /// Whether `worker`'s blocks can be routed on (some rank's stream is
    /// not cold); an untrusted worker falls back to prefix affinity.
    pub fn trusted(&self, worker: u64) -> bool {
        self.read().worker_coverage(worker) != Coverage::Cold
    }

    /// Keeps one stream per registered worker rank, forever: new workers
    /// get streams, removed ones lose theirs (and their blocks), and a
    /// worker whose sockets changed (discovery named other ports) is
    /// subscribed again from scratch.
    pub async fn run(self: Arc<Self>, registry: Arc<Registry>) {
        let mut running: HashMap<u64, Subscribed> = HashMap::new();
        let mut ticker = tokio::time::interval(RECONCILE_EVERY);
        loop {
            ticker.tick().await;
            let workers = registry.all();
            running.retain(|id, subscribed| {
                let now = workers
                    .iter()
                    .find(|w| w.id() == *id)
                    .map(|w| self.endpoints_of(w));
                let keep = now.as_ref() == Some(&subscribed.endpoints);
                if !keep {
                    self.unsubscribe(subscribed);
                }
                keep
            });
            for worker in workers.iter() {
                if running.contains_key(&worker.id()) {
                    continue;
                }
                let endpoints = self.endpoints_of(worker);
                if endpoints.is_empty() {
                    // Asked again next round: discovery may name its
                    // sockets after the worker appears.
                    continue;
                }
                running.insert(worker.id(), self.subscribe(worker, endpoints));
            }
            let index = self.read();
            metrics::gauge!("shoal_kv_index_blocks").set(index.distinct_blocks() as f64);
        }
    }

    /// Starts one stream per rank of `worker` at `endpoints`.
    fn subscribe(
        &self,
        worker: &crate::workers::Worker,
        endpoints: Vec<StreamEndpoints>,
    ) -> Subscribed {
        let streams = endpoints
            .iter()
            .cloned()
            .map(|rank| {
                let stream = self
                    .index
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .add_stream(worker.id());
                let index = self.index.clone();
                let url = worker.url().to_string();
                let task = tokio::spawn(subscriber::run(rank, index, stream, move |outcome| {
                    record(&url, outcome)
                }));
                (stream, task)
            })
            .collect();
        Subscribed { endpoints, streams }
    }

    /// Stops a worker's streams and forgets their blocks.
    fn unsubscribe(&self, subscribed: &mut Subscribed) {
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        for (stream, task) in subscribed.streams.drain(..) {
            task.abort();
            index.remove_stream(stream);
        }
    }
}

/// One worker's running subscriptions and the sockets they follow.
struct Subscribed {
    endpoints: Vec<StreamEndpoints>,
    streams: Vec<(StreamId, tokio::task::JoinHandle<()>)>,
}

/// Counts one stream outcome.
fn record(worker: &str, outcome: subscriber::Outcome) {
    use subscriber::Outcome;
    let result = match outcome {
        Outcome::Applied => "applied",
        Outcome::Malformed => "malformed",
        Outcome::Replayed => "replayed",
        Outcome::Cleared => "cleared",
        Outcome::Restarted => "restarted",
    };
    metrics::counter!("shoal_kv_event_batches_total", "worker" => worker.to_string(), "result" => result)
        .increment(1);
}

/// `tcp://host:port` with the port moved up by `rank` (vLLM's offset of
/// data-parallel ranks).
fn offset_port(endpoint: &str, rank: u32) -> Option<String> {
    let (base, port) = endpoint.rsplit_once(':')?;
    let port = port
        .parse::<u16>()
        .ok()?
        .checked_add(u16::try_from(rank).ok()?)?;
    Some(format!("{base}:{port}"))
}

/// The host of an `http(s)://host:port/...` URL (brackets kept for IPv6).
fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if authority.starts_with('[') {
        return authority.find(']').map(|end| &authority[..=end]);
    }
    Some(authority.split(':').next().unwrap_or(authority)).filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests;
