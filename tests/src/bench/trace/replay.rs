//! A trace as a benchmark workload: where it comes from ([`TraceSource`]),
//! its lengths scaled so that a small box can carry it ([`ScaledTrace`]),
//! its capacity on the mock fleet, and its timestamps mapped to wall-clock
//! arrivals ([`Timing`], [`arrival_times`]) in a
//! [`Schedule`](super::super::workload::Schedule).
//!
//! Length scaling multiplies input and output lengths and the block size
//! by one factor, so a request keeps its shape (how many blocks, how much
//! of it is shared) while its tokens shrink. Timing either replays the
//! timestamps a fixed factor faster ([`Timing::TimeScale`]) or rescales
//! them so the offered load is a fraction of the fleet capacity the bench
//! estimates for the trace's mean sizes ([`Timing::Load`]), exactly as the
//! generated workloads are offered.

use std::collections::HashSet;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::generate::{TraceKind, generate};
use super::text::BlockText;
use super::{BLOCK_TOKENS, TraceRequest, load_trace};
use crate::bench::workload::{
    ASSUMED_PREFIX_HIT, Arrival, CHARS_PER_TOKEN, Schedule, engine_capacity,
};
use crate::mock::EngineConfig;

/// `--trace-length-scale` unless given: 512-token blocks become 128-token
/// ones. Smaller is not cheaper for the box: at a fixed share of the fleet
/// capacity, smaller requests mean proportionally more of them a second,
/// and the box's CPU goes per request. At 0.25 Mooncake's conversation
/// trace is offered at about the rate of the generated workloads.
pub const DEFAULT_LENGTH_SCALE: f64 = 0.25;
/// Range of `--trace-length-scale`.
pub const LENGTH_SCALE_RANGE: (f64, f64) = (0.001, 4.0);
/// Share of KV the capacity estimate keeps filled (as for the generated
/// workloads).
pub const KV_TARGET: f64 = 0.9;

/// Which trace to replay: a JSONL file, or a generated one (`gen:chat`,
/// `gen:agentic`) drawn from the run's seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceSource {
    /// A Mooncake-format JSONL file.
    File(PathBuf),
    /// A synthetic trace, generated per seed.
    Generated(TraceKind),
}

impl FromStr for TraceSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("gen:") {
            Some(kind) => Ok(TraceSource::Generated(kind.parse()?)),
            None if s.is_empty() => Err("--trace needs a file or gen:chat / gen:agentic".into()),
            None => Ok(TraceSource::File(PathBuf::from(s))),
        }
    }
}

impl TraceSource {
    /// Its name in tables and JSON: `gen:<kind>`, or the file's stem.
    pub fn name(&self) -> String {
        match self {
            TraceSource::Generated(k) => format!("gen:{}", k.as_str()),
            TraceSource::File(p) => p.file_stem().map_or_else(
                || p.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
        }
    }

    /// At most `limit` requests of it (a generated trace: exactly `limit`,
    /// drawn from `seed`).
    pub fn load(&self, limit: usize, seed: u64) -> Result<Vec<TraceRequest>, String> {
        match self {
            TraceSource::Generated(k) => Ok(generate(*k, limit, seed)),
            TraceSource::File(p) => load_trace(p, limit).map_err(|e| e.to_string()),
        }
    }
}

/// One request after length scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledRequest {
    /// Arrival, trace ms.
    pub timestamp: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub max_tokens: u64,
    /// Block ids, as in the trace.
    pub blocks: Arc<[u64]>,
    /// Tokens of its prompt an unbounded cache shared by the whole fleet
    /// would hold when it arrives (its longest prefix of blocks seen
    /// before): the most any routing can reuse.
    pub reusable_tokens: u64,
}

/// A trace with its lengths scaled.
#[derive(Debug, Clone)]
pub struct ScaledTrace {
    /// Its name ([`TraceSource::name`]).
    pub name: String,
    /// The length scale applied.
    pub length_scale: f64,
    /// The scaled block size.
    pub block: BlockText,
    /// The requests kept, in arrival order.
    pub requests: Vec<ScaledRequest>,
    /// Requests dropped because prompt + output exceeded the engines'
    /// context limit after scaling (they would only be 400s).
    pub too_long: usize,
}

/// `v × scale` rounded, at least 1.
fn scaled(v: u64, scale: f64) -> u64 {
    ((v as f64 * scale).round() as u64).max(1)
}

impl ScaledTrace {
    /// Scales `requests` by `length_scale`, dropping those longer than
    /// `max_request_tokens` (prompt + output) afterwards.
    pub fn new(
        name: &str,
        requests: &[TraceRequest],
        length_scale: f64,
        max_request_tokens: u64,
    ) -> Result<Self, String> {
        let (lo, hi) = LENGTH_SCALE_RANGE;
        if !(length_scale.is_finite() && (lo..=hi).contains(&length_scale)) {
            return Err(format!(
                "--trace-length-scale must be in {lo}..={hi} (got {length_scale})"
            ));
        }
        let block_chars =
            ((BLOCK_TOKENS as f64 * length_scale * CHARS_PER_TOKEN as f64).round() as usize).max(1);
        let mut seen: HashSet<u64> = HashSet::new();
        let mut out = Vec::with_capacity(requests.len());
        let mut too_long = 0;
        for r in requests {
            let prompt_tokens = scaled(r.input_length, length_scale);
            let max_tokens = scaled(r.output_length, length_scale);
            if prompt_tokens + max_tokens > max_request_tokens {
                too_long += 1;
                continue;
            }
            let reused = r.hash_ids.iter().take_while(|id| seen.contains(id)).count();
            seen.extend(r.hash_ids.iter().copied());
            // The mock engines always prefill at least one token.
            let reusable_tokens = ((reused * block_chars / CHARS_PER_TOKEN) as u64)
                .min(prompt_tokens.saturating_sub(1));
            out.push(ScaledRequest {
                timestamp: r.timestamp,
                prompt_tokens,
                max_tokens,
                blocks: r.hash_ids.as_slice().into(),
                reusable_tokens,
            });
        }
        if out.is_empty() {
            return Err(format!(
                "trace {name}: no request fits the engines' context of {max_request_tokens} \
                 tokens at length scale {length_scale}"
            ));
        }
        Ok(Self {
            name: name.to_string(),
            length_scale,
            block: BlockText { block_chars },
            requests: out,
            too_long,
        })
    }

    /// Mean tokens (prompt, uncached prompt, output), the uncached share
    /// assuming [`ASSUMED_PREFIX_HIT`] of the reusable prefix hits (as the
    /// shared-prefix workload is calibrated).
    pub fn mean_sizes(&self) -> (f64, f64, f64) {
        let n = self.requests.len().max(1) as f64;
        let sum = |f: fn(&ScaledRequest) -> u64| self.requests.iter().map(f).sum::<u64>() as f64;
        let p = sum(|r| r.prompt_tokens) / n;
        let reusable = sum(|r| r.reusable_tokens) / n;
        (
            p,
            p - ASSUMED_PREFIX_HIT * reusable,
            sum(|r| r.max_tokens) / n,
        )
    }

    /// Reusable over all prompt tokens of the first `first` requests: the
    /// fleet cache-hit rate an unbounded, fleet-wide cache would reach on
    /// them (the ceiling for any routing).
    pub fn ideal_hit_rate(&self, first: usize) -> f64 {
        let head = &self.requests[..first.min(self.requests.len())];
        let p: u64 = head.iter().map(|r| r.prompt_tokens).sum();
        let c: u64 = head.iter().map(|r| r.reusable_tokens).sum();
        c as f64 / p.max(1) as f64
    }

    /// The arrival timestamps, trace ms.
    pub fn timestamps(&self) -> Vec<u64> {
        self.requests.iter().map(|r| r.timestamp).collect()
    }
}

/// Requests per trace second: the gaps between the first and the last
/// arrival; `None` for fewer than two requests or a zero span.
pub fn native_rate(timestamps: &[u64]) -> Option<f64> {
    let (first, last) = (timestamps.first()?, timestamps.last()?);
    let span_s = last.saturating_sub(*first) as f64 / 1e3;
    (timestamps.len() >= 2 && span_s > 0.0).then(|| (timestamps.len() - 1) as f64 / span_s)
}

/// Wall arrival times of `timestamps` (trace ms), from the first one,
/// replayed `speedup` trace seconds per wall second.
pub fn arrival_times(timestamps: &[u64], speedup: f64) -> Vec<Duration> {
    let first = timestamps.first().copied().unwrap_or(0);
    timestamps
        .iter()
        .map(|t| Duration::from_secs_f64(t.saturating_sub(first) as f64 / 1e3 / speedup))
        .collect()
}

/// How trace time maps to wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    /// Offer this fraction of the estimated fleet capacity
    /// (`--trace-load`): timestamps are rescaled to that mean rate.
    Load(f64),
    /// Replay the timestamps this many times faster than the engines'
    /// model time (`--trace-time-scale`; 1 = as recorded).
    TimeScale(f64),
}

/// The capacity estimate of a trace and the replay speed it leads to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Mean prompt tokens.
    pub prompt: f64,
    /// Mean uncached prompt tokens (see [`ScaledTrace::mean_sizes`]).
    pub uncached: f64,
    /// Mean output tokens.
    pub output: f64,
    /// Requests per model second one engine sustains.
    pub engine_capacity_model_rps: f64,
    /// Requests per wall second the fleet sustains.
    pub fleet_capacity_wall_rps: f64,
    /// Trace seconds replayed per wall second.
    pub speedup: f64,
    /// Offered requests per wall second.
    pub offered_rps: f64,
}

/// Estimates `trace`'s capacity on `engines` engines like `cfg` and the
/// replay speed `timing` asks for.
pub fn calibrate(
    trace: &ScaledTrace,
    cfg: &EngineConfig,
    engines: usize,
    timing: Timing,
) -> Result<Calibration, String> {
    let (p, u, o) = trace.mean_sizes();
    let per_engine = engine_capacity(cfg, p, u, o, KV_TARGET);
    let capacity = per_engine * engines as f64 * cfg.time_scale;
    let native = native_rate(&trace.timestamps()).ok_or_else(|| {
        format!(
            "trace {}: needs two requests at different timestamps to replay",
            trace.name
        )
    })?;
    let speedup = match timing {
        Timing::Load(load) => load * capacity / native,
        Timing::TimeScale(f) => f * cfg.time_scale,
    };
    if !(speedup.is_finite() && speedup > 0.0) {
        return Err(format!(
            "trace {}: replay speed {speedup} is not usable",
            trace.name
        ));
    }
    Ok(Calibration {
        prompt: p,
        uncached: u,
        output: o,
        engine_capacity_model_rps: per_engine,
        fleet_capacity_wall_rps: capacity,
        speedup,
        offered_rps: native * speedup,
    })
}

/// The schedule of `trace` replayed at `speedup`, the arrivals at or past
/// `window` left out; also how many were. `seed` names the schedule (and
/// seeds the text that rounding may add past the last block).
pub fn schedule(
    trace: &ScaledTrace,
    cal: &Calibration,
    window: Duration,
    seed: u64,
) -> (Schedule, usize) {
    let times = arrival_times(&trace.timestamps(), cal.speedup);
    let arrivals: Vec<Arrival> = trace
        .requests
        .iter()
        .zip(times)
        .take_while(|(_, at)| *at < window)
        .enumerate()
        .map(|(i, (r, at))| Arrival {
            at,
            group: None,
            blocks: Some(r.blocks.clone()),
            seed: seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(i as u64)
                >> 1,
            prompt_tokens: r.prompt_tokens,
            max_tokens: r.max_tokens,
        })
        .collect();
    let cut = trace.requests.len() - arrivals.len();
    let s = Schedule {
        workload: format!("trace:{}", trace.name),
        rate: cal.offered_rps,
        seed,
        arrivals,
        prefixes: Vec::new(),
        blocks: Some(trace.block),
    };
    (s, cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(timestamp: u64, input_length: u64, output_length: u64, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids: ids.to_vec(),
        }
    }

    fn trace() -> Vec<TraceRequest> {
        vec![
            req(0, 1024, 100, &[1, 2]),
            req(500, 1300, 40, &[1, 2, 3]),
            req(1_000, 700, 10, &[1, 9]),
            req(2_000, 100, 1, &[7]),
        ]
    }

    #[test]
    fn lengths_and_blocks_scale_and_reuse_is_the_seen_prefix() {
        let t = ScaledTrace::new("t", &trace(), 0.05, 65_536).unwrap();
        // 512 × 0.05 = 25.6 tokens = 102 characters a block.
        assert_eq!(t.block.block_chars, 102);
        let sizes: Vec<(u64, u64)> = t
            .requests
            .iter()
            .map(|r| (r.prompt_tokens, r.max_tokens))
            .collect();
        assert_eq!(sizes, [(51, 5), (65, 2), (35, 1), (5, 1)]);
        let reuse: Vec<u64> = t.requests.iter().map(|r| r.reusable_tokens).collect();
        // Nothing; blocks 1 and 2 (204 chars = 51 tokens); block 1
        // (25 tokens); nothing.
        assert_eq!(reuse, [0, 51, 25, 0]);
        let (p, u, o) = t.mean_sizes();
        assert!((p - 39.0).abs() < 1e-9, "{p}");
        assert!((u - (39.0 - 0.9 * 19.0)).abs() < 1e-9, "{u}");
        assert!((o - 2.25).abs() < 1e-9, "{o}");
        assert!((t.ideal_hit_rate(usize::MAX) - 76.0 / 156.0).abs() < 1e-9);
        assert!((t.ideal_hit_rate(2) - 51.0 / 116.0).abs() < 1e-9);
        let full = ScaledTrace::new("t", &trace(), 1.0, 65_536).unwrap();
        assert_eq!(full.block.block_chars, 2048);
        assert_eq!(full.requests[1].prompt_tokens, 1300);
    }

    #[test]
    fn requests_past_the_context_are_dropped_and_bad_scales_rejected() {
        let t = ScaledTrace::new("t", &trace(), 1.0, 1_200).unwrap();
        assert_eq!((t.requests.len(), t.too_long), (3, 1));
        assert!(ScaledTrace::new("t", &trace(), 1.0, 50).is_err());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 5.0] {
            assert!(
                ScaledTrace::new("t", &trace(), bad, 65_536).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn arrival_times_compress_the_timestamps() {
        let ts = [1_000, 1_500, 3_000, 5_000];
        assert_eq!(native_rate(&ts), Some(0.75));
        let at = arrival_times(&ts, 4.0);
        let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 125, 500, 1_000]);
        assert_eq!(native_rate(&[5, 5]), None);
        assert_eq!(native_rate(&[5]), None);
    }

    #[test]
    fn load_timing_offers_the_asked_share_of_capacity() {
        let t = ScaledTrace::new("t", &trace(), 0.25, 65_536).unwrap();
        let cfg = EngineConfig {
            time_scale: 2.0,
            ..EngineConfig::default()
        };
        let half = calibrate(&t, &cfg, 4, Timing::Load(0.5)).unwrap();
        let (p, u, o) = t.mean_sizes();
        let cap = engine_capacity(&cfg, p, u, o, KV_TARGET) * 4.0 * 2.0;
        assert!((half.fleet_capacity_wall_rps - cap).abs() < 1e-9);
        assert!((half.offered_rps - 0.5 * cap).abs() < 1e-6 * cap);
        let full = calibrate(&t, &cfg, 4, Timing::Load(1.0)).unwrap();
        assert!((full.speedup / half.speedup - 2.0).abs() < 1e-9);
        // The schedule's mean rate over its span is the offered rate.
        let (s, cut) = schedule(&t, &half, Duration::from_secs(3600), 1);
        assert_eq!(cut, 0);
        let span = s.arrivals[3].at.as_secs_f64();
        assert!((3.0 / span - half.offered_rps).abs() < 1e-6 * half.offered_rps);
        // Replaying as recorded on engines twice as fast as real time.
        let rec = calibrate(&t, &cfg, 4, Timing::TimeScale(1.0)).unwrap();
        assert!((rec.speedup - 2.0).abs() < 1e-12);
        let (s, _) = schedule(&t, &rec, Duration::from_secs(3600), 1);
        assert_eq!(s.arrivals[3].at, Duration::from_secs(1));
        // A window cuts the late arrivals.
        let (s, cut) = schedule(&t, &rec, Duration::from_millis(600), 1);
        assert_eq!((s.arrivals.len(), cut), (3, 1));
    }

    #[test]
    fn the_schedule_prompts_are_the_blocks_text() {
        let t = ScaledTrace::new("t", &trace(), 0.05, 65_536).unwrap();
        let cfg = EngineConfig::default();
        let cal = calibrate(&t, &cfg, 1, Timing::TimeScale(1.0)).unwrap();
        let (s, _) = schedule(&t, &cal, Duration::from_secs(60), 3);
        assert_eq!(s.workload, "trace:t");
        let p: Vec<String> = s.arrivals.iter().map(|a| s.prompt(a)).collect();
        for (a, text) in s.arrivals.iter().zip(&p) {
            assert_eq!(text.len() as u64, 4 * a.prompt_tokens);
        }
        // Requests 0 and 1 share blocks 1 and 2; request 2 shares block 1.
        assert!(p[1].starts_with(&p[0][..204]));
        assert_eq!(p[2][..102], p[0][..102]);
        assert_ne!(p[2][102..135], p[0][102..135]);
    }

    #[test]
    fn sources_parse_and_name_themselves() {
        let g: TraceSource = "gen:agentic".parse().unwrap();
        assert_eq!(g, TraceSource::Generated(TraceKind::Agentic));
        assert_eq!(g.name(), "gen:agentic");
        assert_eq!(g.load(7, 1).unwrap().len(), 7);
        assert!("gen:nope".parse::<TraceSource>().is_err());
        let f: TraceSource = "data/conversation_trace.jsonl".parse().unwrap();
        assert_eq!(f.name(), "conversation_trace");
        let e = f.load(10, 1).unwrap_err();
        assert!(e.contains("cannot open"), "{e}");
    }
}
