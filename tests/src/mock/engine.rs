//! One engine: its shared model state, fault mode and scheduler task.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use super::config::EngineConfig;
use super::disagg::PdState;
use super::kv_events::{KvEventsInfo, KvLink, KvStatsView};
use super::model::{Event, Model, Submission};
use super::requests::ParsedRequest;
use super::snapshot::{ModelSnapshot, RequestRecord};
use super::tokens::{Blocker, PromptBlocks};

/// A fault an engine can be switched into with `POST /mock/fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Normal operation.
    None,
    /// Accept requests and never answer them (admin routes still answer).
    Hang,
    /// Stop listening and close every connection, like a crashed engine.
    Die,
    /// Load endpoints return unparsable bodies or NaN values.
    GarbageMetrics,
    /// Every request except the admin routes is answered 503.
    Fail,
}

impl FaultMode {
    fn to_u8(self) -> u8 {
        match self {
            FaultMode::None => 0,
            FaultMode::Hang => 1,
            FaultMode::Die => 2,
            FaultMode::GarbageMetrics => 3,
            FaultMode::Fail => 4,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => FaultMode::Hang,
            2 => FaultMode::Die,
            3 => FaultMode::GarbageMetrics,
            4 => FaultMode::Fail,
            _ => FaultMode::None,
        }
    }
}

/// Shared state of one engine, used by its HTTP handlers and scheduler.
#[derive(Debug)]
pub struct Engine {
    cfg: Arc<EngineConfig>,
    model: Mutex<Model>,
    wake: Notify,
    fault: AtomicU8,
    next_id: AtomicU64,
    load_polls: AtomicU64,
    tokenize_calls: AtomicU64,
    started_unix: f64,
    dead: watch::Sender<bool>,
    blocker: Blocker,
    kv: Option<KvLink>,
    /// Prefill/decode handoffs (`disagg`).
    pub(crate) pd: PdState,
}

impl Engine {
    pub(crate) fn new(cfg: EngineConfig, blocker: Blocker, kv: Option<KvLink>) -> Arc<Self> {
        let cfg = Arc::new(cfg);
        let (dead, _) = watch::channel(false);
        Arc::new(Self {
            model: Mutex::new(Model::new(cfg.clone(), blocker.clone(), Instant::now())),
            blocker,
            kv,
            cfg,
            wake: Notify::new(),
            fault: AtomicU8::new(0),
            next_id: AtomicU64::new(1),
            load_polls: AtomicU64::new(0),
            tokenize_calls: AtomicU64::new(0),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            dead,
            pd: PdState::default(),
        })
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the model's recorded KV-event batches to the publisher, under
    /// the model lock so batches keep their order.
    fn flush_kv(&self, model: &mut Model) {
        let batches = model.take_kv_batches();
        if let Some(kv) = &self.kv {
            for batch in batches {
                // Closed only once the engine stopped: nothing to publish to.
                let _ = kv.tx.send(batch);
            }
        }
    }

    /// Where this engine publishes KV-cache events, if it does.
    pub fn kv_events(&self) -> Option<&KvEventsInfo> {
        self.kv.as_ref().map(|kv| &kv.info)
    }

    /// The KV-event publisher's counters, if it publishes.
    pub fn kv_stats(&self) -> Option<KvStatsView> {
        self.kv.as_ref().map(|kv| kv.stats.view())
    }

    /// Cuts a prompt into prefix-cache blocks (characters or tokens).
    pub fn prompt_blocks(&self, request: &ParsedRequest) -> Result<PromptBlocks, String> {
        self.blocker.request_blocks(request)
    }

    /// Empties the prefix cache (`POST /reset_prefix_cache`), publishing
    /// `AllBlocksCleared`; returns the number of blocks dropped.
    pub fn reset_prefix_cache(&self) -> usize {
        let mut model = self.model();
        let n = model.reset_prefix_cache();
        self.flush_kv(&mut model);
        n
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Unix time (seconds) the engine started, for `*_created` series.
    pub fn started_unix(&self) -> f64 {
        self.started_unix
    }

    /// A view of the model state now.
    pub fn snapshot(&self) -> ModelSnapshot {
        self.model().snapshot(Instant::now())
    }

    /// Finished-request records with `seq > since`.
    pub fn records_since(&self, since: u64) -> Vec<RequestRecord> {
        self.model().records_since(since)
    }

    /// The current fault mode.
    pub fn fault(&self) -> FaultMode {
        FaultMode::from_u8(self.fault.load(Ordering::Relaxed))
    }

    /// Switches the fault mode; `Die` also stops the engine.
    pub fn set_fault(&self, mode: FaultMode) {
        self.fault.store(mode.to_u8(), Ordering::Relaxed);
        if mode == FaultMode::Die {
            self.kill();
        }
    }

    /// Stops the engine: its server closes the listener and all connections.
    pub fn kill(&self) {
        self.dead.send_replace(true);
    }

    /// A receiver that turns `true` when the engine stops.
    pub(crate) fn dead_watch(&self) -> watch::Receiver<bool> {
        self.dead.subscribe()
    }

    /// Requests served on the load endpoints (`/v1/loads`, `/get_load`,
    /// `/metrics`, `/slots`) since start: how often routers poll this engine.
    pub fn load_polls(&self) -> u64 {
        self.load_polls.load(Ordering::Relaxed)
    }

    pub(crate) fn count_load_poll(&self) {
        self.load_polls.fetch_add(1, Ordering::Relaxed);
    }

    /// `POST /tokenize` calls since start: how often routers asked this
    /// engine for a prompt's tokens.
    pub fn tokenize_calls(&self) -> u64 {
        self.tokenize_calls.load(Ordering::Relaxed)
    }

    pub(crate) fn count_tokenize_call(&self) {
        self.tokenize_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Tokens per prefix-cache block when the engine has a tokenizer.
    pub(crate) fn blocker_token_size(&self) -> Option<usize> {
        self.blocker.token_block_size()
    }

    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn count_failed(&self) {
        self.model().count_failed();
    }

    pub(crate) fn count_rejected(&self) {
        self.model().count_rejected();
    }

    /// Queues a request and returns the receiver of its events.
    pub(crate) fn submit(
        &self,
        id: u64,
        client_id: Option<String>,
        prompt_tokens: u64,
        max_tokens: u64,
        blocks: PromptBlocks,
        remote_prefill: bool,
    ) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.model().submit(Submission {
            id,
            client_id,
            prompt_tokens,
            max_tokens,
            blocks,
            remote_prefill,
            arrival: Instant::now(),
            events: tx,
        });
        self.wake.notify_one();
        rx
    }

    /// The continuous-batching loop: runs due steps, then sleeps until the
    /// next step ends or, when idle, until a request arrives. Never spins.
    pub(crate) async fn run_scheduler(self: Arc<Self>) {
        loop {
            let next = {
                let mut model = self.model();
                let next = model.advance(Instant::now());
                self.flush_kv(&mut model);
                next
            };
            match next {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => self.wake.notified().await,
            }
        }
    }
}
