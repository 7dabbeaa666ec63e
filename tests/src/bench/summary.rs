//! Aggregation of a multi-seed run: one seed's arrivals are one draw of a
//! random process, and a p99 over a minute of traffic moves by tens of
//! percent between draws. So each scenario is run once per seed and judged
//! on the median (with the min–max range) over seeds of its p99 TTFT and of
//! its ratio to the oracle *of the same seed* (same arrivals), which cancels
//! most of the draw-to-draw variation.

use std::fmt::Write as _;

use serde::Serialize;

use super::report::{ScenarioResult, opt};

/// Median and range of one figure over seeds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// How many values (seeds) it is over.
    pub n: usize,
}

impl Spread {
    /// The spread of the finite values of `values`; `None` if there is none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }
}

/// ` [median of N seeds; range NAME min–max, ...]` for the spreads over
/// several seeds, empty when every one is over a single seed (so one-seed
/// output reads as before seeds existed).
pub fn seeds_note(spreads: &[(&str, Spread)]) -> String {
    let n = spreads.iter().map(|(_, s)| s.n).max().unwrap_or(0);
    if n <= 1 {
        return String::new();
    }
    let ranges: Vec<String> = spreads
        .iter()
        .map(|(name, s)| {
            let sep = if name.is_empty() { "" } else { " " };
            format!("{name}{sep}{:.2}–{:.2}", s.min, s.max)
        })
        .collect();
    format!(" [median of {n} seeds; range {}]", ranges.join(", "))
}

/// A scenario within a run: (`--policies` entry, label), e.g.
/// `("least_load", "mesh")`.
pub type ScenarioKey<'a> = (&'a str, &'a str);

/// Per seed, TTFT p99 of scenario `num` divided by that of `den` on the
/// same seed, for every seed where both ran with a finite, positive p99.
pub fn p99_ratios(
    results: &[ScenarioResult],
    num: ScenarioKey<'_>,
    den: ScenarioKey<'_>,
) -> Vec<(u64, f64)> {
    let find = |(group, label): ScenarioKey<'_>, seed: u64| {
        results
            .iter()
            .find(|r| r.group == group && r.label == label && r.seed == seed)
            .map(|r| r.ttft_p99_ms)
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let mut out: Vec<(u64, f64)> = Vec::new();
    for r in results
        .iter()
        .filter(|r| r.group == num.0 && r.label == num.1)
    {
        if out.iter().any(|(s, _)| *s == r.seed) {
            continue;
        }
        if let Some((n, d)) = find(num, r.seed).zip(find(den, r.seed)) {
            out.push((r.seed, n / d));
        }
    }
    out
}

/// The spread over seeds of [`p99_ratios`].
pub fn ratio_spread(
    results: &[ScenarioResult],
    num: ScenarioKey<'_>,
    den: ScenarioKey<'_>,
) -> Option<Spread> {
    Spread::of(p99_ratios(results, num, den).into_iter().map(|(_, r)| r))
}

/// One scenario summarized over every seed it ran with.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    /// `group/label`.
    pub name: String,
    /// The `--policies` entry.
    pub group: String,
    /// `oracle`, `no-mesh` or `mesh`.
    pub label: String,
    /// Routing policy.
    pub policy: String,
    /// Mock engines' flavor.
    pub engine_flavor: String,
    /// Replicas.
    pub replicas: usize,
    /// The seeds it ran with.
    pub seeds: Vec<u64>,
    /// Client TTFT p99, ms.
    pub ttft_p99_ms: Option<Spread>,
    /// TTFT p99 / the same seed's oracle TTFT p99 (same group).
    pub p99_over_oracle: Option<Spread>,
    /// Cores used by the replicas during the load.
    pub replicas_cpu_cores: Option<Spread>,
    /// Cores used by this process (engines + load generator).
    pub engines_cpu_cores: Option<Spread>,
    /// Errors, timeouts and drops summed over seeds.
    pub failures: u64,
}

/// One row per scenario (group × label), in order of first appearance.
pub fn summarize_seeds(results: &[ScenarioResult]) -> Vec<SummaryRow> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in results {
        let k = (r.group.as_str(), r.label.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|(group, label)| {
            let runs: Vec<&ScenarioResult> = results
                .iter()
                .filter(|r| r.group == group && r.label == label)
                .collect();
            let first = runs.first()?;
            let spread = |f: fn(&ScenarioResult) -> Option<f64>| {
                Spread::of(runs.iter().filter_map(|r| f(r)))
            };
            Some(SummaryRow {
                name: first.name.clone(),
                group: group.to_string(),
                label: label.to_string(),
                policy: first.policy.clone(),
                engine_flavor: first.engine_flavor.clone(),
                replicas: first.replicas,
                seeds: runs.iter().map(|r| r.seed).collect(),
                ttft_p99_ms: spread(|r| Some(r.ttft_p99_ms)),
                p99_over_oracle: ratio_spread(results, (group, label), (group, "oracle")),
                replicas_cpu_cores: spread(|r| r.cpu.replicas_cores),
                engines_cpu_cores: spread(|r| r.cpu.engines_cores),
                failures: runs.iter().map(|r| r.errors + r.timeouts + r.dropped).sum(),
            })
        })
        .collect()
}

fn range(s: Option<Spread>, digits: usize) -> String {
    s.map_or_else(
        || "–".to_string(),
        |s| format!("{:.digits$}–{:.digits$}", s.min, s.max),
    )
}

/// The summary as a markdown table: medians and min–max over seeds.
pub fn summary_table(rows: &[SummaryRow]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | engines | R | seeds | TTFT p99 ms median | TTFT p99 ms min–max \
         | p99 × oracle median | p99 × oracle min–max | replicas CPU cores | engines+gen CPU cores | errors |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let med = |s: Option<Spread>| s.map(|s| s.median);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.engine_flavor,
            r.replicas,
            r.seeds.len(),
            opt(med(r.ttft_p99_ms), 0),
            range(r.ttft_p99_ms, 0),
            opt(med(r.p99_over_oracle), 2),
            range(r.p99_over_oracle, 2),
            opt(med(r.replicas_cpu_cores), 2),
            opt(med(r.engines_cpu_cores), 2),
            r.failures,
        );
    }
    out
}

/// One goal of the mesh's push-on-change work, judged on the median over seeds of a p99 ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// The `--policies` entry the goal is about.
    pub group: String,
    /// The scenario measured (`mesh`, `no-mesh`).
    pub scenario: String,
    /// The scenario it is divided by, `group/label`.
    pub reference: String,
    /// The ratio over seeds.
    pub ratio: Spread,
    /// `true`: the goal is ratio ≤ target; `false`: ratio ≥ target.
    pub at_most: bool,
    /// The target ratio.
    pub target: f64,
    /// Whether the median meets it.
    pub met: bool,
}

fn goal(
    results: &[ScenarioResult],
    num: ScenarioKey<'_>,
    den: ScenarioKey<'_>,
    at_most: bool,
    target: f64,
) -> Option<Goal> {
    let ratio = ratio_spread(results, num, den)?;
    let met = if at_most {
        ratio.median <= target
    } else {
        ratio.median >= target
    };
    Some(Goal {
        group: num.0.to_string(),
        scenario: num.1.to_string(),
        reference: format!("{}/{}", den.0, den.1),
        ratio,
        at_most,
        target,
        met,
    })
}

/// The goals that can be judged from `results`: for `least_load` and
/// `cache_aware`, mesh ≤ 1.10 × and no-mesh ≥ 1.5 × their oracle; for
/// `least_load_vllm`, mesh ≤ 1.15 × the `least_load` (SGLang) oracle of
/// the same seed, i.e. the router without queued-token figures should come
/// close to one that has them.
pub fn goals(results: &[ScenarioResult]) -> Vec<Goal> {
    let mut out = Vec::new();
    for group in ["least_load", "cache_aware"] {
        out.extend(goal(
            results,
            (group, "mesh"),
            (group, "oracle"),
            true,
            1.10,
        ));
        out.extend(goal(
            results,
            (group, "no-mesh"),
            (group, "oracle"),
            false,
            1.5,
        ));
    }
    out.extend(goal(
        results,
        ("least_load_vllm", "mesh"),
        ("least_load", "oracle"),
        true,
        1.15,
    ));
    out
}

fn verdict(g: &Goal) -> String {
    format!(
        "goal {} {:.2}: {}",
        if g.at_most { "<=" } else { ">=" },
        g.target,
        if g.met { "met" } else { "NOT met" }
    )
}

/// The goal lines printed at the end of a run.
pub fn goal_lines(goals: &[Goal], results: &[ScenarioResult]) -> Vec<String> {
    let find = |group: &str, scenario: &str| {
        goals
            .iter()
            .find(|g| g.group == group && g.scenario == scenario)
    };
    let mut out = Vec::new();
    for group in ["least_load", "cache_aware"] {
        if let (Some(m), Some(n)) = (find(group, "mesh"), find(group, "no-mesh")) {
            out.push(format!(
                "goal {group}: mesh p99 TTFT = {:.2} x oracle ({}); no-mesh = {:.2} x ({}){}",
                m.ratio.median,
                verdict(m),
                n.ratio.median,
                verdict(n),
                seeds_note(&[("mesh", m.ratio), ("no-mesh", n.ratio)])
            ));
        }
    }
    if let Some(v) = find("least_load_vllm", "mesh") {
        let own = |label: &str| {
            ratio_spread(
                results,
                ("least_load_vllm", label),
                ("least_load_vllm", "oracle"),
            )
            .map_or_else(|| "–".to_string(), |s| format!("{:.2}", s.median))
        };
        out.push(format!(
            "goal least_load_vllm: mesh p99 TTFT = {:.2} x the SGLang-workload (least_load) oracle ({}){}; \
             vs its own vLLM oracle: mesh {} x, no-mesh {} x",
            v.ratio.median,
            verdict(v),
            seeds_note(&[("", v.ratio)]),
            own("mesh"),
            own("no-mesh")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cpu::CpuUsage;
    use crate::bench::driver::LoadResult;
    use crate::bench::report::{EngineStats, ScenarioId, summarize};

    fn result(group: &str, label: &str, seed: u64, p99: f64) -> ScenarioResult {
        let id = ScenarioId {
            group: group.into(),
            policy: "least_load".into(),
            engine_flavor: "sglang".into(),
            seed,
            label: label.into(),
            workload: "size_skewed".into(),
            replicas: if label == "oracle" { 1 } else { 4 },
            mesh: label == "mesh",
        };
        let load = LoadResult {
            completed: 1,
            ttft_ms: vec![p99],
            ..LoadResult::default()
        };
        let cpu = CpuUsage::from_ticks(10.0, 100.0, Some(seed * 10), Some(100), None);
        summarize(id, 1.0, load, EngineStats::default(), None, cpu)
    }

    #[test]
    fn spread_takes_the_median_and_range_of_finite_values() {
        let s = Spread::of([3.0, 1.0, 2.0]);
        assert_eq!(
            s,
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                n: 3
            })
        );
        let even = Spread::of([4.0, 1.0, f64::NAN, 2.0, 3.0]);
        assert_eq!(even.map(|s| (s.median, s.n)), Some((2.5, 4)));
        assert_eq!(Spread::of([f64::NAN]), None);
        assert_eq!(Spread::of([]), None);
        let one = Spread::of([1.25]).map(|s| seeds_note(&[("mesh", s)]));
        assert_eq!(one, Some(String::new()));
        let two = Spread::of([1.0, 2.0]).map(|s| seeds_note(&[("mesh", s), ("", s)]));
        assert_eq!(
            two,
            Some(" [median of 2 seeds; range mesh 1.00–2.00, 1.00–2.00]".into())
        );
    }

    #[test]
    fn ratios_pair_each_seed_with_its_own_oracle() {
        let results = vec![
            result("least_load", "oracle", 1, 100.0),
            result("least_load", "mesh", 1, 120.0),
            result("least_load", "oracle", 2, 200.0),
            result("least_load", "mesh", 2, 200.0),
            // Seed 3 has no oracle: left out of the ratio, kept in the p99.
            result("least_load", "mesh", 3, 900.0),
        ];
        let r = p99_ratios(&results, ("least_load", "mesh"), ("least_load", "oracle"));
        assert_eq!(r, vec![(1, 1.2), (2, 1.0)]);
        let rows = summarize_seeds(&results);
        assert_eq!(rows.len(), 2);
        let mesh = &rows[1];
        assert_eq!(mesh.name, "least_load/mesh");
        assert_eq!(mesh.seeds, vec![1, 2, 3]);
        assert_eq!(mesh.ttft_p99_ms.map(|s| s.median), Some(200.0));
        assert_eq!(
            mesh.ttft_p99_ms.map(|s| (s.min, s.max)),
            Some((120.0, 900.0))
        );
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        let ratio = mesh.p99_over_oracle;
        assert!(close(ratio.map(|s| s.median), 1.1), "{ratio:?}");
        assert!(close(ratio.map(|s| s.min), 1.0) && close(ratio.map(|s| s.max), 1.2));
        assert_eq!(ratio.map(|s| s.n), Some(2));
        assert!(close(mesh.replicas_cpu_cores.map(|s| s.median), 0.02));
        assert_eq!(rows[0].p99_over_oracle.map(|s| s.median), Some(1.0));
        let table = summary_table(&rows);
        assert!(
            table.contains(
                "| least_load/mesh | sglang | 4 | 3 | 200 | 120–900 | 1.10 | 1.00–1.20 |"
            )
        );
    }

    #[test]
    fn goals_use_the_median_ratio_and_the_vllm_goal_uses_the_sglang_oracle() {
        let mut results = Vec::new();
        for (seed, oracle, mesh, no_mesh, vllm) in [
            (1, 100.0, 105.0, 200.0, 110.0),
            (2, 100.0, 130.0, 140.0, 130.0),
            (3, 100.0, 108.0, 160.0, 112.0),
        ] {
            results.push(result("least_load", "oracle", seed, oracle));
            results.push(result("least_load", "no-mesh", seed, no_mesh));
            results.push(result("least_load", "mesh", seed, mesh));
            results.push(result("least_load_vllm", "oracle", seed, 2.0 * oracle));
            results.push(result("least_load_vllm", "mesh", seed, vllm));
        }
        let g = goals(&results);
        assert_eq!(g.len(), 3);
        assert!(g[0].met && (g[0].ratio.median - 1.08).abs() < 1e-9);
        assert!(g[1].met && (g[1].ratio.median - 1.6).abs() < 1e-9);
        assert_eq!(g[2].reference, "least_load/oracle");
        assert!(g[2].met && (g[2].ratio.median - 1.12).abs() < 1e-9);
        let lines = goal_lines(&g, &results);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            "goal least_load: mesh p99 TTFT = 1.08 x oracle (goal <= 1.10: met); \
             no-mesh = 1.60 x (goal >= 1.50: met) \
             [median of 3 seeds; range mesh 1.05–1.30, no-mesh 1.40–2.00]"
        );
        assert!(lines[1].contains(
            "(least_load) oracle (goal <= 1.15: met) [median of 3 seeds; range 1.10–1.30];"
        ));
        assert!(lines[1].contains("vs its own vLLM oracle: mesh 0.56 x, no-mesh – x"));
    }
}
