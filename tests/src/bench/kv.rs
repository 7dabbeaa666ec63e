//! Fleets that publish KV-cache events, for `precise_prefix` scenarios:
//! every engine of the run tokenizes with one `tokenizer.json`, keeps its
//! prefix cache in token blocks and publishes vLLM-format events on real
//! ZMQ sockets (a PUB and a replay ROUTER per engine); `precise_prefix`
//! replicas are told the same tokenizer and every engine's sockets.
//!
//! All scenarios of a run get the same engines when one of its policies
//! needs events, so the other policies are compared on the same caches.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bench::probe_view::{self, CandidateView, VIEW_FIELDS, ViewDifference};
use crate::bench::workload::Schedule;
use crate::client::HttpClient;
use crate::workload::chat;

use crate::bench::trace::text::block_text;
use crate::mock::{EngineConfig, EngineHandle, load_tokenizer, prompt_tokens_for};

/// The `shoal --policy` that routes on KV events.
pub const EVENT_POLICY: &str = "precise_prefix";

/// The tokenizer the benchmark uses unless told otherwise: the test
/// fixture (a small byte-level BPE with a ChatML template), so a clean
/// checkout needs no download.
pub fn fixture_tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/tokenizer/tokenizer.json")
}

/// How a run's engines publish events.
#[derive(Debug, Clone)]
pub struct KvEventsSetup {
    /// The `tokenizer.json` engines and replicas share.
    pub tokenizer: PathBuf,
    /// Tokenizer tokens per timing-model token on the benchmark's prompt
    /// text (the timing model counts chars / 4): the token-block cache is
    /// given this many times the tokens, so it holds as much prompt text as
    /// the character-block cache of the other runs.
    pub tokens_per_model_token: f64,
}

impl KvEventsSetup {
    /// Loads `tokenizer` and measures its tokens per timing-model token on
    /// the trace prompt text; the error names the file.
    pub fn new(tokenizer: &Path) -> Result<Self, String> {
        let tok = load_tokenizer(tokenizer)?;
        let (mut tokens, mut model) = (0u64, 0u64);
        for id in 0..16 {
            let text = block_text(id, 2048);
            let enc = tok
                .encode(text.as_str(), true)
                .map_err(|e| format!("{}: cannot tokenize: {e}", tokenizer.display()))?;
            tokens += enc.get_ids().len() as u64;
            model += prompt_tokens_for(&text);
        }
        Ok(Self {
            tokenizer: tokenizer.to_path_buf(),
            tokens_per_model_token: tokens as f64 / model.max(1) as f64,
        })
    }

    /// `base` with the tokenizer, token-block cache (scaled to hold the
    /// same text) and event sockets on free ports.
    pub fn engine(&self, base: EngineConfig) -> EngineConfig {
        let scale = self.tokens_per_model_token.clamp(0.1, 64.0);
        EngineConfig {
            tokenizer: Some(self.tokenizer.clone()),
            kv_events_port: Some(0),
            kv_events_replay_port: Some(0),
            prefix_cache_tokens: (base.prefix_cache_tokens as f64 * scale).round() as u64,
            ..base
        }
    }

    /// The replica flags that point `precise_prefix` at the tokenizer and
    /// at every engine's event and replay sockets.
    pub fn replica_args(&self, engines: &[EngineHandle]) -> Vec<String> {
        let mut args = vec![
            "--kv-tokenizer".to_string(),
            self.tokenizer.display().to_string(),
        ];
        for engine in engines {
            let Some(kv) = engine.kv_events() else {
                continue;
            };
            let mut endpoint = format!("{}={}", engine.url(), kv.endpoint);
            if let Some(replay) = &kv.replay_endpoint {
                endpoint.push('|');
                endpoint.push_str(replay);
            }
            args.extend(["--kv-events-endpoint".to_string(), endpoint]);
        }
        args
    }
}

/// What the engines published during a scenario and what that makes for
/// the replicas, each of which subscribes to every engine: batches and
/// payload bytes per second over the fleet, and received per replica.
pub fn traffic_line(engines: &[EngineHandle], replicas: usize, secs: f64) -> String {
    let (mut batches, mut bytes) = (0u64, 0u64);
    for engine in engines {
        if let Some(stats) = engine.engine().kv_stats() {
            batches += stats.published_batches;
            bytes += stats.published_payload_bytes;
        }
    }
    let secs = secs.max(1e-9);
    format!(
        "    KV events: {:.0} batches/s, {:.0} KB/s of msgpack published by {} engines; \
         each of {replicas} replicas receives all of it ({:.0} KB/s over the fleet)",
        batches as f64 / secs,
        bytes as f64 / secs / 1e3,
        engines.len(),
        (bytes as f64 * replicas as f64) / secs / 1e3,
    )
}

/// How often the replicas named the same engine when asked together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Agreement {
    /// Requests every replica was asked about (and all answered).
    pub asked: u64,
    /// Of those, the ones every replica gave the same engine for.
    pub agreed: u64,
    /// Of the others, the ones whose replicas reported the same cached
    /// prefixes (their indexes agreed; their load views did not).
    pub same_index: u64,
    /// Of those, the ones whose views differed in requests in flight (a
    /// booking, first byte or release not yet on every replica).
    pub in_flight: u64,
    /// Of those, the ones whose views differed only in poll news (an
    /// engine snapshot, or the work counted since one).
    pub poll_news: u64,
    /// Of those, the ones whose views were identical: a policy that is not
    /// a function of its view (0 unless something is broken).
    pub same_view: u64,
    /// Requests some engine caches more of than another (where the pick
    /// decides a cache hit).
    pub uneven: u64,
    /// Of those, the ones the first replica sent to an engine caching the
    /// most of them.
    pub to_deepest: u64,
    /// Requests whose answers were all chosen within [`ALIGNED_WITHIN`]
    /// of one another (the replicas are asked at once, but one the host
    /// schedules late chooses later, on a fleet that has moved on).
    pub aligned: u64,
    /// Of those, the ones every replica gave the same engine for.
    pub aligned_agreed: u64,
    /// The widest gap between two replicas' choices for one request, µs.
    pub widest_spread_us: u64,
}

/// How close replicas' choices for one request must be to count as made
/// at one instant.
pub const ALIGNED_WITHIN: Duration = Duration::from_millis(1);

impl Agreement {
    /// The line the bench prints.
    pub fn line(&self) -> String {
        let share = 100.0 * self.agreed as f64 / self.asked.max(1) as f64;
        let aligned_share = 100.0 * self.aligned_agreed as f64 / self.aligned.max(1) as f64;
        format!(
            "    agreement: {} of {} requests ({share:.1} %) got the same engine from every replica \
             (POST /debug/route to all at once, during the load); of the {} others, {} had the \
             same cached prefixes on every replica, and their load views differed in requests in \
             flight for {}, only in poll news (a snapshot or the work since one) for {}, in \
             nothing for {}; {} of the {} requests some engine cached more of went to an engine \
             caching the most; the replicas chose within {} ms of one another for {} of the {} \
             (widest gap {:.1} ms), and agreed on {} of those ({aligned_share:.1} %)",
            self.agreed,
            self.asked,
            self.asked - self.agreed,
            self.same_index,
            self.in_flight,
            self.poll_news,
            self.same_view,
            self.to_deepest,
            self.uneven,
            ALIGNED_WITHIN.as_millis(),
            self.aligned,
            self.asked,
            self.widest_spread_us as f64 / 1e3,
            self.aligned_agreed,
        )
    }
}

/// Every `every`, until `stop` (at most `max` times), asks every replica
/// with `POST /debug/route` where it would send the next request of
/// `schedule` (the one due after now, measured from `started`) and counts
/// whether they all name the same engine.
pub async fn probe_agreement(
    replicas: Vec<String>,
    schedule: Arc<Schedule>,
    started: Instant,
    every: Duration,
    max: u64,
    stop: Arc<AtomicBool>,
) -> Agreement {
    let client = HttpClient::new();
    let mut out = Agreement::default();
    for _ in 0..max {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(every).await;
        let now = started.elapsed();
        let Some(next) = schedule.arrivals.iter().find(|a| a.at >= now) else {
            break;
        };
        let body = chat(&schedule.prompt(next), next.max_tokens, true);
        let asks = replicas.iter().map(|r| {
            let (client, body) = (client.clone(), body.clone());
            let url = format!("{r}/debug/route");
            async move {
                let answer = client.post_json(&url, &body).await.ok()?;
                let json = answer.json().ok()?;
                let worker = json["worker"].as_str().map(String::from)?;
                let candidates = json["candidates"].as_u64().unwrap_or(0);
                let decided_at = json["decided_at_unix_micros"].as_u64().unwrap_or(0);
                Some(Answer {
                    worker,
                    cached: cached_prefixes(&json),
                    view: probe_view::parse(&json),
                    candidates,
                    decided_at,
                })
            }
        });
        let picks: Option<Vec<Answer>> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .collect();
        if let Some(picks) = picks {
            out.asked += 1;
            let decided = picks.iter().map(|p| p.decided_at);
            let spread = decided.clone().max().unwrap_or(0) - decided.min().unwrap_or(0);
            let aligned = u128::from(spread) <= ALIGNED_WITHIN.as_micros();
            out.aligned += u64::from(aligned);
            out.widest_spread_us = out.widest_spread_us.max(spread);
            if let Some(Answer {
                worker,
                cached,
                candidates,
                ..
            }) = picks.first()
            {
                let depth = |w: &str| cached.iter().find(|(c, _)| c == w).map_or(0, |c| c.1);
                let most = cached.iter().map(|c| c.1).max().unwrap_or(0);
                let least = if (cached.len() as u64) < *candidates {
                    0
                } else {
                    cached.iter().map(|c| c.1).min().unwrap_or(0)
                };
                if most > least {
                    out.uneven += 1;
                    out.to_deepest += u64::from(depth(worker) == most);
                }
            }
            if picks.windows(2).all(|w| w[0].worker == w[1].worker) {
                out.agreed += 1;
                out.aligned_agreed += u64::from(aligned);
            } else if picks.windows(2).all(|w| w[0].cached == w[1].cached) {
                out.same_index += 1;
                let views: Vec<&[CandidateView]> =
                    picks.iter().map(|p| p.view.as_slice()).collect();
                let differ = probe_view::difference(&views);
                match differ {
                    ViewDifference::InFlight => out.in_flight += 1,
                    ViewDifference::PollNews => out.poll_news += 1,
                    ViewDifference::Nothing => out.same_view += 1,
                }
                if std::env::var_os("FLEET_BENCH_LOG_DISAGREEMENTS").is_some() {
                    let first = picks.iter().map(|p| p.decided_at).min().unwrap_or(0);
                    eprintln!(
                        "    disagreement at {:.1} s (same index, views differ: {differ:?}):",
                        now.as_secs_f64()
                    );
                    for Answer {
                        worker,
                        view,
                        decided_at,
                        ..
                    } in &picks
                    {
                        let view: Vec<String> = view.iter().map(|c| c.to_string()).collect();
                        eprintln!(
                            "      +{} µs picked {worker}; {VIEW_FIELDS} per engine: {}",
                            decided_at.saturating_sub(first),
                            view.join(" ")
                        );
                    }
                }
            }
        }
    }
    out
}

/// One replica's dry-run answer.
struct Answer {
    /// The engine it would send the request to.
    worker: String,
    /// Its index's cached prefix per engine, sorted by worker.
    cached: Vec<(String, u64)>,
    /// Its load view, one entry per candidate.
    view: Vec<CandidateView>,
    /// How many candidates it had.
    candidates: u64,
    /// When it chose, µs since the Unix epoch.
    decided_at: u64,
}

/// A dry-run answer's cached prefixes, sorted by worker.
fn cached_prefixes(answer: &serde_json::Value) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = answer["cached"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|c| Some((c["worker"].as_str()?.to_string(), c["blocks"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_run_answers_compare_by_their_cached_prefixes_in_any_order() {
        let a = serde_json::json!({"worker": "w1", "cached": [
            {"worker": "w2", "blocks": 3}, {"worker": "w1", "blocks": 5}]});
        let b = serde_json::json!({"worker": "w2", "cached": [
            {"worker": "w1", "blocks": 5}, {"worker": "w2", "blocks": 3}]});
        let c = serde_json::json!({"worker": "w2"});
        assert_eq!(cached_prefixes(&a), cached_prefixes(&b));
        assert_eq!(cached_prefixes(&a)[0], ("w1".to_string(), 5));
        assert!(cached_prefixes(&c).is_empty());
        let line = Agreement {
            asked: 10,
            agreed: 7,
            same_index: 2,
            in_flight: 1,
            poll_news: 1,
            same_view: 0,
            uneven: 4,
            to_deepest: 3,
            aligned: 9,
            aligned_agreed: 6,
            widest_spread_us: 2_500,
        }
        .line();
        assert!(
            line.contains("7 of 10")
                && line.contains("of the 3 others, 2")
                && line.contains("requests in flight for 1, only in poll news")
                && line.contains("in nothing for 0")
                && line.contains("3 of the 4 requests")
                && line.contains("within 1 ms of one another for 9 of the 10 (widest gap 2.5 ms), and agreed on 6 of those (66.7 %)"),
            "{line}"
        );
    }

    #[test]
    fn the_fixture_is_measured_and_scales_the_cache_to_the_same_text() {
        let kv = KvEventsSetup::new(&fixture_tokenizer()).unwrap();
        // Lowercase pseudo-words: the small fixture vocabulary spends
        // between one and four tokens per four characters.
        assert!(
            (1.0..=4.5).contains(&kv.tokens_per_model_token),
            "{}",
            kv.tokens_per_model_token
        );
        let cfg = kv.engine(EngineConfig::default());
        assert!(cfg.tokenizer.is_some() && cfg.kv_events_port == Some(0));
        let want = 65_536.0 * kv.tokens_per_model_token;
        assert!((cfg.prefix_cache_tokens as f64 - want).abs() <= 1.0);
        assert!(cfg.validate().is_ok());
        let err = KvEventsSetup::new(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    }
}
