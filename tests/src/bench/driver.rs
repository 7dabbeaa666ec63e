//! The open-loop load generator and the KV sampler of the fleet benchmark.
//!
//! [`run_load`] sends every [`Arrival`] of a [`Schedule`] at its time,
//! whatever happened to the earlier ones (open loop), to replica
//! `i mod R` (round robin, as DNS would spread clients), as a streamed chat
//! request; it measures time to the first token and to `[DONE]` on the
//! client side. Meanwhile it samples every engine's KV usage in-process.
//! Everything is bounded: at most the schedule's requests, each at most
//! `request_timeout`, the drain at most `drain_timeout`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use tokio::task::JoinSet;

use super::workload::Schedule;
use crate::client::HttpClient;
use crate::mock::{Engine, TOKEN_TEXT};
use crate::workload::chat;

/// Knobs of one load run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// A request not finished after this counts as timed out.
    pub request_timeout: Duration,
    /// After the last arrival, how long to wait for requests in flight.
    pub drain_timeout: Duration,
    /// Requests in flight at most; an arrival beyond it is dropped (counted).
    pub max_inflight: usize,
    /// KV sampling period.
    pub sample_every: Duration,
    /// KV usage above which an engine counts as saturated.
    pub kv_high: f64,
}

/// One KV sample: seconds since the load started, max − min KV usage over
/// the engines, and the highest KV usage.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KvSample {
    /// Seconds since the start of the load.
    pub t: f64,
    /// Max − min KV usage over the engines (0..=1).
    pub spread: f64,
    /// Highest KV usage (0..=1).
    pub max: f64,
}

/// What a load run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    /// Requests sent.
    pub sent: u64,
    /// Requests that streamed to `[DONE]`.
    pub completed: u64,
    /// Requests that failed (status, transport, truncated stream).
    pub errors: u64,
    /// Requests that did not finish within the request or drain timeout.
    pub timeouts: u64,
    /// Arrivals dropped because `max_inflight` requests were in flight.
    pub dropped: u64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// Client-side time to first token of completed requests, ms.
    pub ttft_ms: Vec<f64>,
    /// Client-side time to `[DONE]` of completed requests, ms.
    pub e2e_ms: Vec<f64>,
    /// How late the generator sent requests (scheduling lag), ms.
    pub send_lag_ms: Vec<f64>,
    /// Wall time from the first arrival to the last completion.
    pub elapsed: Duration,
    /// KV samples over the run.
    pub kv: Vec<KvSample>,
    /// Seconds during which at least one engine was above `kv_high`.
    pub kv_high_secs: f64,
}

#[derive(Debug, Default)]
struct Tally {
    completed: u64,
    errors: u64,
    error_samples: Vec<String>,
    ttft_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    last_done: Option<Instant>,
}

/// Sends one streamed request; returns (TTFT, E2E) in ms.
async fn one_request(
    client: &HttpClient,
    url: &str,
    body: &serde_json::Value,
) -> Result<(f64, f64), String> {
    let t0 = Instant::now();
    let mut sse = client
        .post_stream(url, body, &[])
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if sse.status != 200 {
        let first = sse.next_data().await.ok().flatten().unwrap_or_default();
        let first: String = first.chars().take(200).collect();
        return Err(format!("{url} answered {}: {first}", sse.status));
    }
    let mut ttft = None;
    while let Some(data) = sse.next_data().await.map_err(|e| format!("{url}: {e}"))? {
        if data == "[DONE]" {
            let e2e = t0.elapsed().as_secs_f64() * 1e3;
            return Ok((ttft.unwrap_or(e2e), e2e));
        }
        if ttft.is_none() && data.contains(TOKEN_TEXT) {
            ttft = Some(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Err(format!("{url}: the stream ended without [DONE]"))
}

/// Samples the engines' KV usage until `stop` turns true.
async fn sample_kv(
    engines: Vec<Arc<Engine>>,
    every: Duration,
    high: f64,
    start: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Vec<KvSample>, f64) {
    let mut samples = Vec::new();
    let mut high_secs = 0.0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let usage: Vec<f64> = engines.iter().map(|e| e.snapshot().token_usage()).collect();
        let max = usage.iter().copied().fold(0.0, f64::max);
        let min = usage.iter().copied().fold(1.0, f64::min);
        let now = Instant::now();
        if max > high {
            high_secs += now.duration_since(last).as_secs_f64();
        }
        last = now;
        samples.push(KvSample {
            t: now.duration_since(start).as_secs_f64(),
            spread: (max - min).max(0.0),
            max,
        });
    }
    (samples, high_secs)
}

/// Runs `schedule` against `replicas` (base URLs); see the module docs.
pub async fn run_load(
    schedule: &Schedule,
    replicas: &[String],
    engines: Vec<Arc<Engine>>,
    opts: &LoadOptions,
    progress: &ProgressBar,
) -> LoadResult {
    let client = HttpClient::new();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| format!("{r}/v1/chat/completions"))
        .collect();
    let start = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample_kv(
        engines,
        opts.sample_every,
        opts.kv_high,
        start,
        stop_rx,
    ));
    let mut tasks = JoinSet::new();
    let mut out = LoadResult::default();
    for (i, a) in schedule.arrivals.iter().enumerate() {
        while tasks.try_join_next().is_some() {}
        tokio::time::sleep_until((start + a.at).into()).await;
        out.send_lag_ms
            .push(start.elapsed().saturating_sub(a.at).as_secs_f64() * 1e3);
        if tasks.len() >= opts.max_inflight || urls.is_empty() {
            out.dropped += 1;
            progress.inc(1);
            continue;
        }
        let url = urls[i % urls.len()].clone();
        let body = chat(&schedule.prompt(a), a.max_tokens, true);
        let (client, tally, progress) = (client.clone(), tally.clone(), progress.clone());
        let timeout = opts.request_timeout;
        out.sent += 1;
        tasks.spawn(async move {
            let r = tokio::time::timeout(timeout, one_request(&client, &url, &body)).await;
            let mut t = tally.lock().unwrap_or_else(PoisonError::into_inner);
            match r {
                Ok(Ok((ttft, e2e))) => {
                    t.completed += 1;
                    t.ttft_ms.push(ttft);
                    t.e2e_ms.push(e2e);
                    t.last_done = Some(Instant::now());
                }
                Ok(Err(e)) => {
                    t.errors += 1;
                    if t.error_samples.len() < 5 {
                        t.error_samples.push(e);
                    }
                }
                // Counted as a timeout below (the task ends without a tally).
                Err(_) => return false,
            }
            progress.inc(1);
            true
        });
    }
    let drain_until = tokio::time::Instant::now() + opts.drain_timeout;
    loop {
        match tokio::time::timeout_at(drain_until, tasks.join_next()).await {
            Ok(Some(Ok(true))) => {}
            Ok(Some(_)) => {
                out.timeouts += 1;
                progress.inc(1);
            }
            Ok(None) => break,
            Err(_) => {
                let left = tasks.len() as u64;
                out.timeouts += left;
                progress.inc(left);
                tasks.abort_all();
                break;
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    let _ = stop_tx.send(true);
    let (kv, kv_high_secs) = sampler.await.unwrap_or_default();
    let t = std::mem::take(&mut *tally.lock().unwrap_or_else(PoisonError::into_inner));
    out.completed = t.completed;
    out.errors = t.errors;
    out.error_samples = t.error_samples;
    out.ttft_ms = t.ttft_ms;
    out.e2e_ms = t.e2e_ms;
    out.elapsed = t
        .last_done
        .map_or(start.elapsed(), |d| d.duration_since(start));
    out.kv = kv;
    out.kv_high_secs = kv_high_secs;
    out
}

/// The `p`-quantile (0..=1, nearest rank) of `v`; NaN when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let idx = ((s.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    s[idx]
}
