//! The continuous-batching engine model, a pure state machine driven by the
//! scheduler task with wall-clock instants.
//!
//! * Requests wait in a FIFO queue. The head is admitted when fewer than
//!   `max_running` requests run and the KV cache has room for its prompt
//!   (plus tokens generated before a preemption); admission is head-of-line.
//! * An admitted request holds `prompt_tokens` KV tokens and one more per
//!   generated token; all are freed when it finishes or its client leaves.
//! * Each step gives prefilling requests up to `prefill_chunk_tokens` uncached
//!   prompt tokens in admission order; a request emits its first token in the
//!   step that completes its prefill and one token per step after that.
//! * Step time: see [`EngineConfig`]. When a step would overflow the KV cache,
//!   the newest running request is preempted back to the queue head and later
//!   recomputes its prompt and generated tokens (minus prefix-cache hits).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::config::EngineConfig;
use super::kv_wire::KvEvent;
use super::prefix_cache::{CacheChanges, PrefixCache};
use super::snapshot::{BusySlot, Counters, ModelSnapshot, RequestRecord, Timing};
use super::tokens::{Blocker, PromptBlocks};

/// Steps chain on the model clock while the scheduler wakes at most this late.
const CATCH_UP: Duration = Duration::from_millis(50);
/// Throughput window and bucket width.
const TPUT_WINDOW: Duration = Duration::from_secs(2);
const TPUT_BUCKET: Duration = Duration::from_millis(100);

/// What the scheduler tells a request's HTTP handler.
#[derive(Debug)]
pub(crate) enum Event {
    /// This many new output tokens.
    Tokens(u32),
    /// The request finished; no more events follow.
    Done(Timing),
}

/// A request handed to the model by an HTTP handler.
#[derive(Debug)]
pub(crate) struct Submission {
    pub id: u64,
    pub client_id: Option<String>,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub blocks: PromptBlocks,
    /// Its KV came from a prefill engine: only one prompt token is left
    /// to compute.
    pub remote_prefill: bool,
    pub arrival: Instant,
    pub events: UnboundedSender<Event>,
}

#[derive(Debug)]
struct Req {
    sub: Submission,
    generated: u64,
    first_cached: Option<u64>,
    cached_now: u64,
    prefill_needed: u64,
    prefill_done: u64,
    admitted_at: Option<Instant>,
    first_token_at: Option<Instant>,
    unsent: u32,
    slot: usize,
    preemptions: u32,
    step_prefill: u64,
    step_token: bool,
}

impl Req {
    fn kv_tokens(&self) -> u64 {
        self.sub.prompt_tokens + self.generated
    }
}

/// The state of one engine.
#[derive(Debug)]
pub(crate) struct Model {
    cfg: Arc<EngineConfig>,
    started: Instant,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    kv_used: u64,
    prefix: PrefixCache,
    blocker: Blocker,
    /// Whether cache changes are recorded as KV events (`--kv-events-port`).
    kv_events: bool,
    /// One batch of KV events per step (or reset) that changed the cache,
    /// waiting to be published.
    kv_pending: Vec<Vec<KvEvent>>,
    free_slots: BTreeSet<usize>,
    step_end: Option<Instant>,
    last_step_end: Option<Instant>,
    step_wall_secs: f64,
    step_prefill_secs: f64,
    counters: Counters,
    tput: VecDeque<(Instant, u64)>,
    recent: VecDeque<RequestRecord>,
    next_seq: u64,
    version: u64,
}

impl Model {
    pub(crate) fn new(cfg: Arc<EngineConfig>, blocker: Blocker, now: Instant) -> Self {
        let cap_blocks = (cfg.prefix_cache_tokens / blocker.block_tokens()) as usize;
        Self {
            prefix: PrefixCache::new(cap_blocks),
            kv_events: cfg.kv_events_port.is_some() && blocker.token_block_size().is_some(),
            blocker,
            kv_pending: Vec::new(),
            free_slots: (0..cfg.max_running).collect(),
            started: now,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_used: 0,
            step_end: None,
            last_step_end: None,
            step_wall_secs: 0.0,
            step_prefill_secs: 0.0,
            counters: Counters::default(),
            tput: VecDeque::new(),
            recent: VecDeque::new(),
            next_seq: 1,
            version: 0,
            cfg,
        }
    }

    /// Cached prompt tokens of `sub` for a prefix of `blocks` matched
    /// blocks; at least one prompt token is always prefilled.
    fn cached_tokens(&self, blocks: usize, sub: &Submission) -> u64 {
        if sub.remote_prefill {
            return sub.prompt_tokens.saturating_sub(1);
        }
        self.blocker
            .cached_tokens(blocks, &sub.blocks, sub.prompt_tokens)
    }

    /// Empties the prefix cache (`POST /reset_prefix_cache`), reporting
    /// `AllBlocksCleared`; returns how many blocks were dropped.
    pub(crate) fn reset_prefix_cache(&mut self) -> usize {
        let n = self.prefix.clear();
        if self.kv_events {
            self.kv_pending.push(vec![KvEvent::Cleared]);
        }
        self.version += 1;
        n
    }

    /// The KV-event batches recorded since the last call, oldest first.
    pub(crate) fn take_kv_batches(&mut self) -> Vec<Vec<KvEvent>> {
        std::mem::take(&mut self.kv_pending)
    }

    /// Inserts a prefilled prompt's blocks; with KV events on, appends what
    /// changed to `events` the way vLLM reports it: evictions first (made
    /// while allocating), one hash per `BlockRemoved`, then one
    /// `BlockStored` per run of new blocks.
    fn cache_prompt(&mut self, blocks: &PromptBlocks, events: &mut Vec<KvEvent>) {
        let CacheChanges { stored, evicted } = self.prefix.insert(&blocks.hashes);
        let Some(size) = self.blocker.token_block_size().filter(|_| self.kv_events) else {
            return;
        };
        events.extend(evicted.into_iter().map(|h| KvEvent::Removed {
            block_hashes: vec![h],
        }));
        for run in stored {
            let tokens = blocks.token_ids.get(run.start * size..run.end * size);
            events.push(KvEvent::Stored {
                block_hashes: blocks.hashes[run.clone()].to_vec(),
                parent_block_hash: run.start.checked_sub(1).map(|i| blocks.hashes[i]),
                token_ids: tokens.map(<[u32]>::to_vec).unwrap_or_default(),
                block_size: u32::try_from(size).unwrap_or(u32::MAX),
            });
        }
    }

    /// Queues a request.
    pub(crate) fn submit(&mut self, sub: Submission) {
        self.counters.requests_total += 1;
        self.version += 1;
        self.waiting.push_back(Req {
            sub,
            generated: 0,
            first_cached: None,
            cached_now: 0,
            prefill_needed: 0,
            prefill_done: 0,
            admitted_at: None,
            first_token_at: None,
            unsent: 0,
            slot: 0,
            preemptions: 0,
            step_prefill: 0,
            step_token: false,
        });
    }

    /// Counts a request answered 503 by a fault knob.
    pub(crate) fn count_failed(&mut self) {
        self.counters.requests_failed += 1;
        self.version += 1;
    }

    /// Counts a request refused with 400.
    pub(crate) fn count_rejected(&mut self) {
        self.counters.requests_rejected += 1;
        self.version += 1;
    }

    /// Runs every step due by `now`; returns when the next step ends, or
    /// `None` when idle (wait for a submission).
    pub(crate) fn advance(&mut self, now: Instant) -> Option<Instant> {
        loop {
            if let Some(end) = self.step_end {
                if end > now {
                    return Some(end);
                }
                self.step_end = None;
                self.finish_step(now);
                self.last_step_end = Some(end);
            }
            self.drop_cancelled();
            self.admit(now);
            if self.running.is_empty() {
                self.last_step_end = None;
                return None;
            }
            let start = match self.last_step_end {
                Some(e) if now.saturating_duration_since(e) <= CATCH_UP => e,
                _ => now,
            };
            let wall = self.plan_step();
            self.step_end = Some(start + wall);
        }
    }

    fn drop_cancelled(&mut self) {
        let before = self.running.len() + self.waiting.len();
        let mut kept = Vec::with_capacity(self.running.len());
        for r in std::mem::take(&mut self.running) {
            if r.sub.events.is_closed() {
                self.kv_used -= r.kv_tokens();
                self.free_slots.insert(r.slot);
            } else {
                kept.push(r);
            }
        }
        self.running = kept;
        self.waiting.retain(|r| !r.sub.events.is_closed());
        let dropped = before - self.running.len() - self.waiting.len();
        if dropped > 0 {
            self.counters.requests_aborted += dropped as u64;
            self.version += 1;
        }
    }

    fn admit(&mut self, now: Instant) {
        while self.running.len() < self.cfg.max_running {
            let Some(head) = self.waiting.front() else {
                break;
            };
            if self.kv_used + head.kv_tokens() > self.cfg.kv_capacity_tokens {
                break;
            }
            let Some(slot) = self.free_slots.pop_first() else {
                break;
            };
            let Some(mut r) = self.waiting.pop_front() else {
                break;
            };
            let blocks = self.prefix.lookup(&r.sub.blocks.hashes);
            let cached = self.cached_tokens(blocks, &r.sub);
            if r.first_cached.is_none() {
                r.first_cached = Some(cached);
                self.counters.prompt_tokens_total += r.sub.prompt_tokens;
                self.counters.cached_prompt_tokens_total += cached;
            }
            r.cached_now = cached;
            r.prefill_needed = r.kv_tokens() - cached;
            r.prefill_done = 0;
            r.slot = slot;
            r.admitted_at.get_or_insert(now);
            self.kv_used += r.kv_tokens();
            self.running.push(r);
            self.version += 1;
        }
    }

    /// Decides the next step's work; returns its wall duration.
    fn plan_step(&mut self) -> Duration {
        loop {
            let mut budget = self.cfg.prefill_chunk_tokens;
            let mut batch = 0usize;
            let mut prefill = 0u64;
            for r in &mut self.running {
                let rem = r.prefill_needed - r.prefill_done;
                r.step_prefill = rem.min(budget);
                budget -= r.step_prefill;
                prefill += r.step_prefill;
                r.step_token = r.step_prefill == rem;
                batch += usize::from(r.step_token);
            }
            if self.kv_used + batch as u64 <= self.cfg.kv_capacity_tokens || self.running.len() <= 1
            {
                let scale = 1000.0 * self.cfg.time_scale;
                self.step_wall_secs = self.cfg.step_model_ms(batch, prefill) / scale;
                self.step_prefill_secs = 1000.0 * prefill as f64 / self.cfg.prefill_tps / scale;
                return Duration::try_from_secs_f64(self.step_wall_secs)
                    .unwrap_or(Duration::from_secs(3600));
            }
            self.preempt_newest();
        }
    }

    fn preempt_newest(&mut self) {
        if let Some(mut r) = self.running.pop() {
            self.kv_used -= r.kv_tokens();
            self.free_slots.insert(r.slot);
            r.preemptions += 1;
            r.prefill_done = 0;
            r.prefill_needed = 0;
            self.counters.preemptions += 1;
            self.waiting.push_front(r);
            self.version += 1;
        }
    }

    fn finish_step(&mut self, now: Instant) {
        let chunk = self.cfg.tokens_per_chunk;
        let c = &mut self.counters;
        c.steps_total += 1;
        c.busy_slot_steps_total += self.running.len() as u64;
        c.step_seconds_total += self.step_wall_secs;
        c.prefill_seconds_total += self.step_prefill_secs;
        let mut tokens = 0u64;
        let mut events = Vec::new();
        let mut finished = Vec::new();
        let mut kept = Vec::with_capacity(self.running.len());
        for mut r in std::mem::take(&mut self.running) {
            if r.step_prefill > 0 {
                r.prefill_done += r.step_prefill;
                self.counters.prefill_tokens_total += r.step_prefill;
                if r.prefill_done == r.prefill_needed {
                    self.cache_prompt(&r.sub.blocks, &mut events);
                }
            }
            r.step_prefill = 0;
            if r.step_token {
                r.step_token = false;
                r.generated += 1;
                self.kv_used += 1;
                tokens += 1;
                r.unsent += 1;
                let first = r.first_token_at.is_none();
                if first {
                    r.first_token_at = Some(now);
                }
                let done = r.generated >= r.sub.max_tokens;
                if first || done || r.unsent >= chunk {
                    // A closed channel is noticed by drop_cancelled next step.
                    let _ = r.sub.events.send(Event::Tokens(r.unsent));
                    r.unsent = 0;
                }
                if done {
                    finished.push(r);
                    continue;
                }
            }
            kept.push(r);
        }
        self.running = kept;
        if !events.is_empty() {
            self.kv_pending.push(events);
        }
        self.counters.generation_tokens_total += tokens;
        self.counters.generation_seconds_total += self.step_wall_secs * tokens as f64;
        self.record_tokens(now, tokens);
        for r in finished {
            self.finish_request(r, now);
        }
        self.version += 1;
    }

    fn finish_request(&mut self, r: Req, now: Instant) {
        self.kv_used -= r.kv_tokens();
        self.free_slots.insert(r.slot);
        self.counters.requests_completed += 1;
        let ms = |t: Option<Instant>| {
            t.unwrap_or(now)
                .saturating_duration_since(r.sub.arrival)
                .as_secs_f64()
                * 1000.0
        };
        let timing = Timing {
            queue_ms: ms(r.admitted_at),
            ttft_ms: ms(r.first_token_at),
            e2e_ms: ms(Some(now)),
            prompt_tokens: r.sub.prompt_tokens,
            cached_tokens: r.first_cached.unwrap_or(0),
            output_tokens: r.generated,
            preemptions: r.preemptions,
        };
        let _ = r.sub.events.send(Event::Done(timing.clone()));
        if self.recent.len() >= self.cfg.stats_capacity {
            self.recent.pop_front();
        }
        self.recent.push_back(RequestRecord {
            seq: self.next_seq,
            id: r.sub.id,
            client_id: r.sub.client_id,
            timing,
        });
        self.next_seq += 1;
    }

    fn record_tokens(&mut self, now: Instant, n: u64) {
        match self.tput.back_mut() {
            Some((t, c)) if now.saturating_duration_since(*t) < TPUT_BUCKET => *c += n,
            _ => self.tput.push_back((now, n)),
        }
        while let Some(&(t, _)) = self.tput.front() {
            if now.saturating_duration_since(t) > TPUT_WINDOW + TPUT_BUCKET {
                self.tput.pop_front();
            } else {
                break;
            }
        }
    }

    fn gen_throughput(&self, now: Instant) -> f64 {
        let window = TPUT_WINDOW
            .min(now.saturating_duration_since(self.started))
            .as_secs_f64()
            .max(0.1);
        let tokens: u64 = self
            .tput
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= TPUT_WINDOW)
            .map(|(_, c)| c)
            .sum();
        tokens as f64 / window
    }

    /// Finished-request records with `seq > since`, oldest first.
    pub(crate) fn records_since(&self, since: u64) -> Vec<RequestRecord> {
        self.recent
            .iter()
            .filter(|r| r.seq > since)
            .cloned()
            .collect()
    }

    /// A view of the current state.
    pub(crate) fn snapshot(&self, now: Instant) -> ModelSnapshot {
        let mut waiting_tokens = 0;
        let mut waiting_uncached = 0;
        for r in &self.waiting {
            let blocks = self.prefix.peek(&r.sub.blocks.hashes);
            waiting_tokens += r.kv_tokens();
            waiting_uncached += r.kv_tokens() - self.cached_tokens(blocks, &r.sub);
        }
        let mut slots = vec![None; self.cfg.max_running];
        for r in &self.running {
            if let Some(s) = slots.get_mut(r.slot) {
                *s = Some(BusySlot {
                    id_task: r.sub.id,
                    n_prompt_tokens: r.sub.prompt_tokens,
                    n_prompt_tokens_processed: r.prefill_done.min(r.sub.prompt_tokens),
                    n_prompt_tokens_cache: r.cached_now,
                    n_predict: r.sub.max_tokens,
                    n_decoded: r.generated,
                });
            }
        }
        let c = &self.counters;
        let cache_hit_rate = if c.prompt_tokens_total == 0 {
            0.0
        } else {
            c.cached_prompt_tokens_total as f64 / c.prompt_tokens_total as f64
        };
        let block_tokens = self.blocker.block_tokens();
        ModelSnapshot {
            version: self.version,
            uptime_secs: now.saturating_duration_since(self.started).as_secs_f64(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            waiting_tokens,
            waiting_uncached_tokens: waiting_uncached,
            kv_used_tokens: self.kv_used,
            kv_capacity_tokens: self.cfg.kv_capacity_tokens,
            prefix_cached_tokens: self.prefix.len() as u64 * block_tokens,
            max_running: self.cfg.max_running,
            gen_throughput: self.gen_throughput(now),
            cache_hit_rate,
            counters: self.counters.clone(),
            slots,
        }
    }
}
