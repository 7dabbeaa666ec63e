//! The p99 of a scenario pooled over every seed it ran with, and its ratio
//! to the oracle's with a bootstrap interval over seeds.
//!
//! Why: one run's p99 TTFT of this queueing system moves by up to 2× between
//! runs of the *same* seed (measured: tests/BENCHMARKS.md), so the median
//! of three per-seed ratios cannot resolve a 10 % goal. Pooling every
//! request of every seed gives each scenario one p99 over many times more
//! requests (and rare queue build-ups), and resampling the seeds (with
//! replacement) shows how far that ratio would move with other draws.

use super::driver::quantile;
use super::report::ScenarioResult;
use super::summary::ScenarioKey;

/// Bootstrap resamples of the seeds.
const RESAMPLES: usize = 2_000;

/// A pooled ratio and its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PooledRatio {
    /// Pooled p99 of the numerator scenario / that of the denominator.
    pub ratio: f64,
    /// 5th percentile over seed resamples.
    pub low: f64,
    /// 95th percentile over seed resamples.
    pub high: f64,
    /// Seeds both scenarios ran with.
    pub seeds: usize,
}

/// Per seed, the TTFT samples of scenario `key` (seeds in run order).
fn samples_by_seed<'a>(
    results: &'a [ScenarioResult],
    key: ScenarioKey<'_>,
) -> Vec<(u64, &'a [f64])> {
    results
        .iter()
        .filter(|r| r.group == key.0 && r.label == key.1 && !r.ttft_samples_ms.is_empty())
        .map(|r| (r.seed, r.ttft_samples_ms.as_slice()))
        .collect()
}

fn pooled_p99(parts: &[&[f64]]) -> f64 {
    let mut all: Vec<f64> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    all.sort_by(f64::total_cmp);
    quantile(&all, 0.99)
}

/// The pooled p99 of `num` over that of `den`, over the seeds both ran
/// with, and its 90 % bootstrap interval over seeds; `None` with fewer
/// than two common seeds.
pub fn pooled_ratio(
    results: &[ScenarioResult],
    num: ScenarioKey<'_>,
    den: ScenarioKey<'_>,
    rng_seed: u64,
) -> Option<PooledRatio> {
    let dens = samples_by_seed(results, den);
    let pairs: Vec<(&[f64], &[f64])> = samples_by_seed(results, num)
        .into_iter()
        .filter_map(|(seed, n)| dens.iter().find(|(s, _)| *s == seed).map(|(_, d)| (n, *d)))
        .collect();
    if pairs.len() < 2 {
        return None;
    }
    let ratio_of = |picks: &[usize]| {
        let n: Vec<&[f64]> = picks.iter().map(|&i| pairs[i].0).collect();
        let d: Vec<&[f64]> = picks.iter().map(|&i| pairs[i].1).collect();
        pooled_p99(&n) / pooled_p99(&d)
    };
    let all: Vec<usize> = (0..pairs.len()).collect();
    let ratio = ratio_of(&all);
    // splitmix64: reproducible resamples without another dependency.
    let mut state = rng_seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut boot: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let picks: Vec<usize> = (0..pairs.len())
                .map(|_| (next() % pairs.len() as u64) as usize)
                .collect();
            ratio_of(&picks)
        })
        .filter(|r| r.is_finite())
        .collect();
    boot.sort_by(f64::total_cmp);
    Some(PooledRatio {
        ratio,
        low: quantile(&boot, 0.05),
        high: quantile(&boot, 0.95),
        seeds: pairs.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cpu::CpuUsage;
    use crate::bench::driver::LoadResult;
    use crate::bench::report::{EngineStats, ScenarioId, summarize};

    fn result(label: &str, seed: u64, samples: Vec<f64>) -> ScenarioResult {
        let id = ScenarioId {
            group: "g".into(),
            policy: "prefix_affinity".into(),
            engine_flavor: "sglang".into(),
            seed,
            label: label.into(),
            workload: "shared_prefix".into(),
            replicas: 4,
            mesh: true,
        };
        let load = LoadResult {
            completed: samples.len() as u64,
            ttft_ms: samples,
            ..LoadResult::default()
        };
        let cpu = CpuUsage::from_ticks(10.0, 100.0, None, None, None);
        summarize(id, 1.0, load, EngineStats::default(), None, cpu)
    }

    #[test]
    fn equal_scenarios_pool_to_one_and_a_slower_one_shows_its_factor() {
        let base: Vec<f64> = (1..=1000).map(f64::from).collect();
        let slow: Vec<f64> = base.iter().map(|x| x * 1.5).collect();
        let results = vec![
            result("oracle", 1, base.clone()),
            result("mesh", 1, base.clone()),
            result("slow", 1, slow.clone()),
            result("oracle", 2, base.clone()),
            result("mesh", 2, base.clone()),
            result("slow", 2, slow),
        ];
        let same = pooled_ratio(&results, ("g", "mesh"), ("g", "oracle"), 7).unwrap();
        assert!(
            (same.ratio - 1.0).abs() < 1e-9 && same.low <= 1.0 && same.high >= 1.0,
            "{same:?}"
        );
        let slow = pooled_ratio(&results, ("g", "slow"), ("g", "oracle"), 7).unwrap();
        assert!((slow.ratio - 1.5).abs() < 0.01, "{slow:?}");
        assert_eq!(slow.seeds, 2);
        assert!(
            pooled_ratio(&results[..3], ("g", "mesh"), ("g", "oracle"), 7).is_none(),
            "one seed"
        );
    }
}
