//! Figures policies derive from one engine snapshot, computed once when the
//! snapshot is stored rather than on every selection.
//!
//! `least_load` prices every candidate of every request with the KV odds
//! `k/(1-k)` and the seconds a token of work takes, `1/throughput`. Dividing
//! per candidate was a third of a selection's time at 1,024 workers; a
//! snapshot changes a few times a second, so the router and the mesh derive
//! these when they store one and policies only multiply.

use crate::EngineLoad;
use crate::load::{valid_throughput, valid_usage};

/// Highest KV usage fed to `k/(1-k)`, which is infinite at 1.
pub const KV_USAGE_CLAMP: f64 = 0.999;

/// What a snapshot's signals imply for scoring; each `None` when the signal
/// it comes from is missing or invalid.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadFigures {
    /// `k/(1-k)` for the KV usage `k`, clamped to `[0, KV_USAGE_CLAMP]`
    /// first: least_load's KV barrier before its weight.
    pub kv_odds: Option<f64>,
    /// Seconds one token of work takes at the reported generation
    /// throughput (`1 / gen_throughput`).
    pub secs_per_token: Option<f64>,
}

impl LoadFigures {
    /// The figures of `load`, its fields validated again (a peer's numbers
    /// are untrusted), so every figure is finite.
    pub fn of(load: &EngineLoad) -> Self {
        Self {
            kv_odds: load.token_usage.and_then(valid_usage).map(kv_odds),
            secs_per_token: load
                .gen_throughput
                .and_then(valid_throughput)
                .map(|t| 1.0 / t)
                .filter(|s| s.is_finite() && *s > 0.0),
        }
    }
}

/// `k/(1-k)` for a KV usage `k`, clamped to `[0, KV_USAGE_CLAMP]`.
pub fn kv_odds(k: f64) -> f64 {
    let k = k.clamp(0.0, KV_USAGE_CLAMP);
    k / (1.0 - k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_finite_and_missing_when_their_signal_is() {
        let load = EngineLoad {
            token_usage: Some(0.75),
            gen_throughput: Some(2000.0),
            ..EngineLoad::default()
        };
        let figures = LoadFigures::of(&load);
        assert_eq!(figures.kv_odds, Some(3.0));
        assert_eq!(figures.secs_per_token, Some(0.0005));
        let full = LoadFigures::of(&EngineLoad {
            token_usage: Some(1.0),
            gen_throughput: Some(f64::from_bits(1)),
            ..EngineLoad::default()
        });
        assert!((full.kv_odds.unwrap() - 999.0).abs() < 1e-9, "{full:?}");
        assert_eq!(
            full.secs_per_token, None,
            "1 / the smallest subnormal overflows"
        );
        let hostile = LoadFigures::of(&EngineLoad {
            token_usage: Some(f64::NAN),
            gen_throughput: Some(0.0),
            ..EngineLoad::default()
        });
        assert_eq!(hostile, LoadFigures::default());
    }
}
