//! The policy catalog: the one place that turns `--policy <name>` into a
//! running policy. Each row pairs a [`PolicyKind`] with its constructor and
//! names the help heading of the flag group it reads, so a policy is added
//! by adding a row (see the checklist in the module docs of `policy`).

use std::sync::Arc;

use super::{
    CacheAwarePolicy, LeastLoadPolicy, LoadAwarePolicy, Policy, PowerOfTwoPolicy,
    PrecisePrefixPolicy, PrefixAffinityPolicy, RandomPolicy, RoundRobinPolicy,
};
use crate::config::{
    CACHE_AWARE_FLAGS, LEAST_LOAD_FLAGS, LOAD_AWARE_FLAGS, PRECISE_PREFIX_FLAGS,
    PREFIX_AFFINITY_FLAGS, PolicyKind, RoutingConfig,
};

/// One row of the catalog: how one `--policy` value becomes a policy.
#[derive(Debug, Clone, Copy)]
pub struct CatalogEntry {
    /// Help heading of the policy's own flag group in `--help` and
    /// docs/configuration.md (`None`: the policy has no knobs). Tests check it exists.
    pub flags: Option<&'static str>,
    /// Builds the policy from the routing flags; it reads its own group,
    /// and another policy's only when it is built on that policy
    /// (`prefix_affinity` scores waits as least_load does, with its knobs).
    pub build: fn(&RoutingConfig) -> Arc<dyn Policy>,
}

/// The catalog's row for `kind`. A `match` rather than a slice, so a new
/// [`PolicyKind`] variant without a row does not compile.
pub fn catalog_entry(kind: PolicyKind) -> CatalogEntry {
    match kind {
        PolicyKind::RoundRobin => CatalogEntry {
            flags: None,
            build: |_| Arc::new(RoundRobinPolicy::default()),
        },
        PolicyKind::Random => CatalogEntry {
            flags: None,
            build: |_| Arc::new(RandomPolicy),
        },
        PolicyKind::PowerOfTwo => CatalogEntry {
            flags: None,
            build: |_| Arc::new(PowerOfTwoPolicy),
        },
        PolicyKind::LeastLoad => CatalogEntry {
            flags: Some(LEAST_LOAD_FLAGS),
            build: |routing| Arc::new(LeastLoadPolicy::new(routing.least_load)),
        },
        PolicyKind::CacheAware => CatalogEntry {
            flags: Some(CACHE_AWARE_FLAGS),
            build: |routing| Arc::new(CacheAwarePolicy::new(routing.cache_aware)),
        },
        PolicyKind::LoadAware => CatalogEntry {
            flags: Some(LOAD_AWARE_FLAGS),
            build: |routing| {
                Arc::new(LoadAwarePolicy::new(
                    routing.load_aware.load_aware_threshold,
                ))
            },
        },
        PolicyKind::PrefixAffinity => CatalogEntry {
            flags: Some(PREFIX_AFFINITY_FLAGS),
            build: |routing| {
                Arc::new(PrefixAffinityPolicy::new(
                    routing.prefix_affinity,
                    routing.least_load,
                ))
            },
        },
        PolicyKind::PrecisePrefix => CatalogEntry {
            flags: Some(PRECISE_PREFIX_FLAGS),
            build: |routing| {
                Arc::new(PrecisePrefixPolicy::new(
                    routing.kv_events.clone(),
                    routing.prefix_affinity,
                    routing.least_load,
                ))
            },
        },
    }
}

/// Builds the policy `--policy` names, with its knobs.
pub fn build(routing: &RoutingConfig) -> Arc<dyn Policy> {
    (catalog_entry(routing.policy).build)(routing)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::{CommandFactory, ValueEnum};

    use super::*;
    use crate::config::Config;

    fn routing(kind: PolicyKind) -> RoutingConfig {
        let mut routing = Config::load_from(["shoal"]).unwrap().routing;
        routing.policy = kind;
        routing
    }

    #[test]
    fn every_policy_builds_under_its_own_name() {
        for kind in PolicyKind::value_variants() {
            let name = kind.name();
            assert_eq!(build(&routing(*kind)).name(), name);
        }
    }

    #[test]
    fn every_policy_flag_heading_belongs_to_one_registered_policy() {
        let command = Config::command();
        let headings: BTreeSet<&str> = command
            .get_arguments()
            .filter_map(|arg| arg.get_help_heading())
            .filter(|heading| heading.starts_with("Policy "))
            .collect();
        let registered: Vec<&str> = PolicyKind::value_variants()
            .iter()
            .filter_map(|kind| catalog_entry(*kind).flags)
            .collect();
        assert_eq!(
            registered.iter().copied().collect::<BTreeSet<_>>(),
            headings
        );
        assert_eq!(registered.len(), headings.len(), "one group per policy");
    }

    /// A policy file added without its catalog row (or the row's
    /// `PolicyKind`) fails here: every `impl Policy for` in the policy
    /// module names a policy that some `--policy` value builds. (The
    /// catalog's `match` already makes a `PolicyKind` without a row a
    /// compile error; this is the other direction.)
    #[test]
    fn every_policy_in_the_source_is_reachable_through_the_catalog() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/policy");
        let built: BTreeSet<&str> = PolicyKind::value_variants()
            .iter()
            .map(|kind| build(&routing(*kind)).name())
            .collect();
        let mut implemented = BTreeSet::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            // At the start of a line: an item, not a mention.
            let Some(at) = source.find("\nimpl Policy for ") else {
                continue;
            };
            // The first string literal after `fn name` in the impl: its name.
            let after = &source[at..];
            let name = after
                .find("fn name(&self)")
                .and_then(|n| after[n..].split('"').nth(1))
                .unwrap_or_else(|| panic!("{}: an impl Policy without a name", path.display()));
            implemented.insert(name.to_string());
        }
        assert!(implemented.len() >= 8, "found only {implemented:?}");
        for name in &implemented {
            assert!(
                built.contains(name.as_str()),
                "policy `{name}` is implemented but no --policy value builds it: \
                 add its PolicyKind variant and catalog row"
            );
        }
    }

    #[test]
    fn every_policy_is_described_on_the_policies_page() {
        let page = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policies.md");
        let text = std::fs::read_to_string(page).unwrap();
        for name in PolicyKind::names() {
            // Named in the list of values and described in an item of its own.
            assert!(
                text.contains(&format!("`{name}`,")) || text.contains(&format!("`{name}`.")),
                "docs/policies.md does not list `{name}` among the --policy values"
            );
            assert!(
                text.contains(&format!("- `{name}`")),
                "docs/policies.md has no item describing `{name}`"
            );
        }
    }
}
