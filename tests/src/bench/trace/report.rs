//! The trace-replay table: what prefix reuse a routing got out of a trace
//! (the fleet cache-hit rate, next to what an unbounded fleet-wide cache
//! would get) and where it put the requests (each engine's share), with
//! the latencies, one row per scenario in the style of the main table.

use std::fmt::Write as _;

use crate::bench::report::{ScenarioResult, opt};

/// Each engine's share of the requests the engines finished, percent, in
/// engine order (empty when none finished).
pub fn engine_shares(r: &ScenarioResult) -> Vec<f64> {
    let per = &r.engines.finished_per_engine;
    let total: u64 = per.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    per.iter()
        .map(|&n| 100.0 * n as f64 / total as f64)
        .collect()
}

/// The busiest engine's share over the mean share: 1 is an even spread,
/// `engines` is everything on one engine.
pub fn max_over_mean(shares: &[f64]) -> Option<f64> {
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    let max = shares.iter().copied().fold(f64::NAN, f64::max);
    (mean > 0.0).then(|| max / mean)
}

/// The trace results of one seed as a markdown table; `ideal_hit` is the
/// trace's hit rate under an unbounded fleet-wide cache (the ceiling).
pub fn trace_table(results: &[ScenarioResult], ideal_hit: f64) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | R | TTFT p50 ms | TTFT p99 ms | p99 × oracle | e2e p99 ms | cache hit \
         | of ideal | busiest engine × mean | engine shares % | done req/s | errors |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let oracle = results
            .iter()
            .find(|o| o.group == r.group && o.seed == r.seed && o.label == "oracle")
            .map(|o| o.ttft_p99_ms);
        let shares = engine_shares(r);
        let list: Vec<String> = shares.iter().map(|s| format!("{s:.0}")).collect();
        let hit = r.engines.cache_hit_rate;
        let of_ideal = (ideal_hit > 0.0).then(|| 100.0 * hit / ideal_hit);
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {:.0} | {:.0}% | {}% | {} | {} | {:.1} | {} |",
            r.name,
            r.replicas,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            opt(oracle.map(|o| r.ttft_p99_ms / o), 2),
            r.e2e_p99_ms,
            100.0 * hit,
            opt(of_ideal, 0),
            opt(max_over_mean(&shares), 2),
            if list.is_empty() {
                "–".to_string()
            } else {
                list.join(" / ")
            },
            r.completed_rps,
            r.errors + r.timeouts + r.dropped,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cpu::CpuUsage;
    use crate::bench::driver::LoadResult;
    use crate::bench::report::{EngineStats, ScenarioId, summarize};

    fn result(label: &str, ttft: f64, per_engine: Vec<u64>, hit: f64) -> ScenarioResult {
        let id = ScenarioId {
            group: "cache_aware@gen:chat".into(),
            policy: "cache_aware".into(),
            engine_flavor: "sglang".into(),
            seed: 1,
            label: label.into(),
            workload: "trace:gen:chat".into(),
            replicas: if label == "oracle" { 1 } else { 2 },
            mesh: label == "mesh",
        };
        let load = LoadResult {
            completed: per_engine.iter().sum(),
            ttft_ms: vec![ttft],
            e2e_ms: vec![2.0 * ttft],
            elapsed: std::time::Duration::from_secs(10),
            ..LoadResult::default()
        };
        let stats = EngineStats {
            finished_per_engine: per_engine,
            cache_hit_rate: hit,
            ..EngineStats::default()
        };
        summarize(id, 10.0, load, stats, None, CpuUsage::default())
    }

    #[test]
    fn shares_and_imbalance_follow_the_engines_counts() {
        let r = result("mesh", 10.0, vec![30, 10, 40, 20], 0.5);
        assert_eq!(engine_shares(&r), [30.0, 10.0, 40.0, 20.0]);
        assert_eq!(max_over_mean(&engine_shares(&r)), Some(1.6));
        let none = result("mesh", 10.0, vec![0, 0], 0.0);
        assert!(engine_shares(&none).is_empty());
        assert_eq!(max_over_mean(&[]), None);
    }

    #[test]
    fn the_table_has_one_row_per_scenario_against_its_oracle() {
        let rows = [
            result("oracle", 100.0, vec![50, 50], 0.6),
            result("no-mesh", 150.0, vec![80, 20], 0.3),
        ];
        let t = trace_table(&rows, 0.9);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[3],
            "| cache_aware@gen:chat/no-mesh | 2 | 150 | 150 | 1.50 | 300 | 30% | 33% | 1.60 | 80 / 20 | 10.0 | 0 |"
        );
        assert!(
            lines[2].contains("| 60% | 67% | 1.00 | 50 / 50 |"),
            "{}",
            lines[2]
        );
    }
}
