//! What `fleet-bench --policies` can compare: each choice is a routing
//! policy, the workload that exercises it and the engine flavor it runs on,
//! and expands into the three scenarios (oracle, no-mesh, mesh).
//!
//! The choices are a closed list so that a typo fails before any engine
//! starts, and so that two choices running the same policy (`least_load`
//! on SGLang and on vLLM engines) still get distinct scenario names.

use std::sync::OnceLock;

use shoal::config::PolicyKind;

use super::ScenarioSpec;
use super::workload::WorkloadKind;
use crate::mock::Flavor;

/// One `--policies` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Choice {
    /// `least_load` on size-skewed traffic, SGLang engines (they report
    /// queued tokens).
    LeastLoad,
    /// `cache_aware` on shared-prefix traffic, SGLang engines.
    CacheAware,
    /// `least_load` on the same size-skewed traffic, vLLM engines: they
    /// report only waiting/running request counts and KV usage, so the
    /// router must estimate the queued work itself.
    LeastLoadVllm,
    /// `<policy>@<workload>`: any shoal policy on either workload, SGLang
    /// engines (an index into [`pairs`]), so every policy can be compared
    /// on both kinds of traffic.
    Pair(usize),
}

/// Every `shoal --policy` value, from the router's own list
/// (`PolicyKind::names`), so a new policy is benchmarkable without an edit
/// here. Leaked once: the names live as long as the bench.
pub fn policies() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        PolicyKind::names()
            .into_iter()
            .map(|name| &*Box::leak(name.into_boxed_str()))
            .collect()
    })
}

/// One [`Choice::Pair`]: its name (`<policy>@<workload>`), the policy and
/// the workload.
pub type Pair = (&'static str, &'static str, WorkloadKind);

/// Every [`Choice::Pair`]: each policy on each workload (size-skewed
/// first), derived from [`policies`].
pub fn pairs() -> &'static [Pair] {
    static PAIRS: OnceLock<Vec<Pair>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        let workloads = [
            ("size_skewed", WorkloadKind::SizeSkewed),
            ("shared_prefix", WorkloadKind::SharedPrefix),
        ];
        workloads
            .into_iter()
            .flat_map(|(workload, kind)| {
                policies().iter().map(move |&policy| {
                    let name = format!("{policy}@{workload}");
                    (&*Box::leak(name.into_boxed_str()), policy, kind)
                })
            })
            .collect()
    })
}

impl Choice {
    /// The named choices, in the order of the docs (the pairs follow).
    pub const NAMED: [Choice; 3] = [Choice::LeastLoad, Choice::CacheAware, Choice::LeastLoadVllm];

    /// Every choice: the named ones, then every pair.
    pub fn all() -> impl Iterator<Item = Choice> {
        Self::NAMED
            .into_iter()
            .chain((0..pairs().len()).map(Choice::Pair))
    }

    /// The name on the command line and in tables and JSON (`group`).
    pub fn name(self) -> &'static str {
        match self {
            Choice::LeastLoad => "least_load",
            Choice::CacheAware => "cache_aware",
            Choice::LeastLoadVllm => "least_load_vllm",
            Choice::Pair(i) => pairs().get(i).map_or("?", |p| p.0),
        }
    }

    /// Parses a `--policies` entry; the error lists the valid names.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::all().find(|c| c.name() == s.trim()).ok_or_else(|| {
            let names: Vec<&str> = Self::NAMED.iter().map(|c| c.name()).collect();
            format!(
                "unknown policy {s:?} (expected one of {}, or <policy>@<workload> with a \
                 policy among {} and a workload of size_skewed or shared_prefix)",
                names.join(", "),
                policies().join(", ")
            )
        })
    }

    /// The `shoal --policy` value.
    pub fn policy(self) -> &'static str {
        match self {
            Choice::LeastLoad | Choice::LeastLoadVllm => "least_load",
            Choice::CacheAware => "cache_aware",
            Choice::Pair(i) => pairs().get(i).map_or("?", |p| p.1),
        }
    }

    /// The traffic it is measured on.
    pub fn workload(self) -> WorkloadKind {
        match self {
            Choice::LeastLoad | Choice::LeastLoadVllm => WorkloadKind::SizeSkewed,
            Choice::CacheAware => WorkloadKind::SharedPrefix,
            Choice::Pair(i) => pairs().get(i).map_or(WorkloadKind::SizeSkewed, |p| p.2),
        }
    }

    /// The mock engines' load-endpoint flavor (everything else in the
    /// engine configuration is the same for every choice).
    pub fn flavor(self) -> Flavor {
        match self {
            Choice::LeastLoad | Choice::CacheAware | Choice::Pair(_) => Flavor::Sglang,
            Choice::LeastLoadVllm => Flavor::Vllm,
        }
    }

    /// Its three scenarios: one replica (oracle), `replicas` without and
    /// with the mesh.
    pub fn scenarios(self, replicas: usize) -> [ScenarioSpec; 3] {
        scenarios(self.name(), self.policy(), self.flavor(), replicas)
    }
}

/// The three scenarios of `policy` on `flavor` engines, named `group`: one
/// replica (oracle), `replicas` without and with the mesh.
pub fn scenarios(group: &str, policy: &str, flavor: Flavor, replicas: usize) -> [ScenarioSpec; 3] {
    [
        ("oracle", 1, false),
        ("no-mesh", replicas, false),
        ("mesh", replicas, true),
    ]
    .map(|(label, replicas, mesh)| ScenarioSpec {
        group: group.to_string(),
        policy: policy.to_string(),
        flavor,
        label: label.to_string(),
        replicas,
        mesh,
    })
}

/// Parses the `--policies` of a trace replay: plain `shoal --policy`
/// names (the trace is the workload), repeats dropped.
pub fn parse_trace_policies(names: &[String]) -> Result<Vec<&'static str>, String> {
    let mut out: Vec<&'static str> = Vec::new();
    for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let p = policies().iter().find(|p| **p == n).ok_or_else(|| {
            format!(
                "unknown policy {n:?} for a trace replay (expected one of {})",
                policies().join(", ")
            )
        })?;
        if !out.contains(p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err("--policies names no policy".into());
    }
    Ok(out)
}

/// Parses every `--policies` entry, dropping repeats (first one wins).
pub fn parse_choices(names: &[String]) -> Result<Vec<Choice>, String> {
    let mut out: Vec<Choice> = Vec::new();
    for n in names.iter().filter(|n| !n.trim().is_empty()) {
        let c = Choice::parse(n)?;
        if !out.contains(&c) {
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err("--policies names no policy".into());
    }
    Ok(out)
}

/// The seeds of a run: `first`, `first + 1`, ... (`count` of them,
/// wrapping at `u64::MAX`).
pub fn seeds(first: u64, count: usize) -> Vec<u64> {
    (0..count as u64).map(|i| first.wrapping_add(i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_reject_unknown_names() {
        let names: Vec<String> = ["least_load", "least_load_vllm", "least_load"]
            .map(String::from)
            .to_vec();
        let c = parse_choices(&names).unwrap_or_default();
        assert_eq!(c, vec![Choice::LeastLoad, Choice::LeastLoadVllm]);
        assert!(parse_choices(&["round_robin".to_string()]).is_err());
        assert!(parse_choices(&[]).is_err());
    }

    #[test]
    fn the_vllm_choice_runs_least_load_on_the_same_traffic() {
        let v = Choice::LeastLoadVllm;
        assert_eq!(v.policy(), Choice::LeastLoad.policy());
        assert_eq!(v.workload(), Choice::LeastLoad.workload());
        assert_eq!(v.flavor(), Flavor::Vllm);
        let specs = v.scenarios(4);
        assert_eq!(specs[0].replicas, 1);
        assert!(specs[2].mesh);
        assert!(specs.iter().all(|s| s.group == "least_load_vllm"));
    }

    #[test]
    fn every_policy_runs_on_both_workloads() {
        for &policy in policies() {
            for (workload, kind) in [
                ("size_skewed", WorkloadKind::SizeSkewed),
                ("shared_prefix", WorkloadKind::SharedPrefix),
            ] {
                let c = Choice::parse(&format!("{policy}@{workload}")).unwrap();
                assert_eq!((c.policy(), c.workload()), (policy, kind));
                assert_eq!(c.name(), format!("{policy}@{workload}"));
            }
        }
        assert!(Choice::parse("least_load@nowhere").is_err());
    }

    #[test]
    fn trace_policies_are_plain_policy_names() {
        let names: Vec<String> = ["prefix_affinity", " cache_aware", "prefix_affinity"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            parse_trace_policies(&names).unwrap(),
            ["prefix_affinity", "cache_aware"]
        );
        let e = parse_trace_policies(&["least_load_vllm".to_string()]).unwrap_err();
        assert!(e.contains("for a trace replay"), "{e}");
        assert!(parse_trace_policies(&[" ".to_string()]).is_err());
    }

    #[test]
    fn seeds_count_up_from_the_first() {
        assert_eq!(seeds(42, 3), vec![42, 43, 44]);
        assert_eq!(seeds(u64::MAX, 2), vec![u64::MAX, 0]);
    }
}
