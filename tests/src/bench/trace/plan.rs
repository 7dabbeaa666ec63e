//! What `fleet-bench --trace` runs for one seed: the trace loaded (or
//! generated from the seed), scaled, calibrated and turned into the
//! schedule every scenario of that seed replays, with the figures the
//! bench prints and writes about it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::replay::{Calibration, ScaledTrace, Timing, TraceSource, calibrate, schedule};
use crate::bench::workload::Schedule;
use crate::mock::EngineConfig;

/// The trace flags of a run.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// What to replay (`--trace`).
    pub source: TraceSource,
    /// `--trace-length-scale`.
    pub length_scale: f64,
    /// `--trace-load` or `--trace-time-scale`.
    pub timing: Timing,
    /// Requests read or generated at most (`--trace-limit`).
    pub limit: usize,
    /// Arrivals at or past this (wall time) are left out (`--duration-secs`).
    pub window: Duration,
}

/// One seed's replay.
#[derive(Debug, Clone)]
pub struct SeedReplay {
    /// The seed (a generated trace is drawn from it).
    pub seed: u64,
    /// What every scenario of the seed sends.
    pub schedule: Arc<Schedule>,
    /// The capacity estimate and replay speed.
    pub calibration: Calibration,
    /// Requests read (or generated).
    pub loaded: usize,
    /// Requests dropped as longer than the engines' context.
    pub too_long: usize,
    /// Requests past the window.
    pub cut: usize,
    /// Block size after scaling, tokens.
    pub block_tokens: f64,
    /// Hit rate of an unbounded fleet-wide cache on the requests sent.
    pub ideal_hit: f64,
}

/// Prepares `opts`'s trace for `seed` on `engines` engines like `cfg`.
pub fn prepare(
    opts: &TraceOptions,
    cfg: &EngineConfig,
    engines: usize,
    seed: u64,
) -> Result<SeedReplay, String> {
    let name = opts.source.name();
    let requests = opts.source.load(opts.limit, seed)?;
    let trace = ScaledTrace::new(
        &name,
        &requests,
        opts.length_scale,
        cfg.max_request_tokens(),
    )?;
    let calibration = calibrate(&trace, cfg, engines, opts.timing)?;
    let (s, cut) = schedule(&trace, &calibration, opts.window, seed);
    if s.arrivals.is_empty() {
        return Err(format!("trace {name}: no arrival inside the window"));
    }
    Ok(SeedReplay {
        seed,
        ideal_hit: trace.ideal_hit_rate(s.arrivals.len()),
        schedule: Arc::new(s),
        calibration,
        loaded: requests.len(),
        too_long: trace.too_long,
        cut,
        block_tokens: trace.block.block_chars as f64
            / crate::bench::workload::CHARS_PER_TOKEN as f64,
    })
}

impl SeedReplay {
    /// The calibration line the bench prints, in the style of the
    /// generated workloads' lines.
    pub fn line(&self, name: &str, engines: usize, time_scale: f64) -> String {
        let c = &self.calibration;
        format!(
            "trace {name} (seed {}): {} requests sent of {} read ({} too long, {} past the window), \
             blocks of {:.1} tokens, mean prompt {:.0} (uncached {:.0}) / output {:.0} tokens, \
             ideal cache hit {:.0}%; capacity {:.2} req/s per engine (model time) = {:.1} req/s \
             fleet on {engines} engines (wall, x{time_scale}); offering {:.1} req/s \
             (trace time x{:.2})",
            self.seed,
            self.schedule.arrivals.len(),
            self.loaded,
            self.too_long,
            self.cut,
            self.block_tokens,
            c.prompt,
            c.uncached,
            c.output,
            100.0 * self.ideal_hit,
            c.engine_capacity_model_rps,
            c.fleet_capacity_wall_rps,
            c.offered_rps,
            c.speedup
        )
    }

    /// Its calibration entry in the JSON.
    pub fn json(&self, name: &str) -> Value {
        let c = &self.calibration;
        json!({"trace": name, "seed": self.seed, "workload": self.schedule.workload,
            "requests_read": self.loaded, "requests_sent": self.schedule.arrivals.len(),
            "too_long": self.too_long, "past_window": self.cut,
            "block_tokens": self.block_tokens, "ideal_cache_hit": self.ideal_hit,
            "mean_prompt_tokens": c.prompt, "mean_uncached_tokens": c.uncached,
            "mean_output_tokens": c.output, "engine_capacity_model_rps": c.engine_capacity_model_rps,
            "fleet_capacity_wall_rps": c.fleet_capacity_wall_rps,
            "trace_seconds_per_wall_second": c.speedup, "offered_rps": c.offered_rps})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::trace::generate::TraceKind;

    #[test]
    fn a_generated_trace_replays_at_the_asked_load_inside_the_window() {
        let opts = TraceOptions {
            source: TraceSource::Generated(TraceKind::Chat),
            length_scale: 0.25,
            timing: Timing::Load(0.5),
            limit: 300,
            window: Duration::from_secs(5),
        };
        let cfg = EngineConfig {
            time_scale: 4.0,
            ..EngineConfig::default()
        };
        let r = prepare(&opts, &cfg, 4, 42).unwrap();
        assert_eq!(r.loaded, 300);
        let s = &r.schedule;
        assert_eq!(s.arrivals.len() + r.cut + r.too_long, 300);
        assert!(s.arrivals.iter().all(|a| a.at < opts.window));
        assert!(
            (r.calibration.offered_rps - 0.5 * r.calibration.fleet_capacity_wall_rps).abs() < 1e-6
        );
        // Multi-turn chat reuses most of its prompts.
        assert!((0.3..1.0).contains(&r.ideal_hit), "{}", r.ideal_hit);
        assert_eq!(r.block_tokens, 128.0);
        // Another seed is another conversation mix.
        let other = prepare(&opts, &cfg, 4, 43).unwrap();
        assert_ne!(other.schedule.arrivals, s.arrivals);
        assert!(r.line("gen:chat", 4, 4.0).contains("offering"));
        assert_eq!(r.json("gen:chat")["requests_read"], 300);
    }
}
