//! What `fleet-bench --policies` can compare: each choice is a routing
//! policy, the workload that exercises it and the engine flavor it runs on,
//! and expands into the three scenarios (oracle, no-mesh, mesh).
//!
//! The choices are a closed list so that a typo fails before any engine
//! starts, and so that two choices running the same policy (`least_load`
//! on SGLang and on vLLM engines) still get distinct scenario names.

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
}

impl Choice {
    /// Every choice, in the order of the docs.
    pub const ALL: [Choice; 3] = [Choice::LeastLoad, Choice::CacheAware, Choice::LeastLoadVllm];

    /// The name on the command line and in tables and JSON (`group`).
    pub fn name(self) -> &'static str {
        match self {
            Choice::LeastLoad => "least_load",
            Choice::CacheAware => "cache_aware",
            Choice::LeastLoadVllm => "least_load_vllm",
        }
    }

    /// Parses a `--policies` entry; the error lists the valid names.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "unknown policy {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }

    /// The `shoal --policy` value.
    pub fn policy(self) -> &'static str {
        match self {
            Choice::LeastLoad | Choice::LeastLoadVllm => "least_load",
            Choice::CacheAware => "cache_aware",
        }
    }

    /// The traffic it is measured on.
    pub fn workload(self) -> WorkloadKind {
        match self {
            Choice::LeastLoad | Choice::LeastLoadVllm => WorkloadKind::SizeSkewed,
            Choice::CacheAware => WorkloadKind::SharedPrefix,
        }
    }

    /// The mock engines' load-endpoint flavor (everything else in the
    /// engine configuration is the same for every choice).
    pub fn flavor(self) -> Flavor {
        match self {
            Choice::LeastLoad | Choice::CacheAware => Flavor::Sglang,
            Choice::LeastLoadVllm => Flavor::Vllm,
        }
    }

    /// Its three scenarios: one replica (oracle), `replicas` without and
    /// with the mesh.
    pub fn scenarios(self, replicas: usize) -> [ScenarioSpec; 3] {
        [
            ("oracle", 1, false),
            ("no-mesh", replicas, false),
            ("mesh", replicas, true),
        ]
        .map(|(label, replicas, mesh)| ScenarioSpec {
            group: self.name().to_string(),
            policy: self.policy().to_string(),
            flavor: self.flavor(),
            label: label.to_string(),
            replicas,
            mesh,
        })
    }
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
    fn seeds_count_up_from_the_first() {
        assert_eq!(seeds(42, 3), vec![42, 43, 44]);
        assert_eq!(seeds(u64::MAX, 2), vec![u64::MAX, 0]);
    }
}
