//! Routing flags: which policy runs (`--policy`) and each policy's own knobs.
//!
//! Every policy with knobs has one flag group here, flattened into
//! [`RoutingConfig`] under its own help heading. The group is the very value
//! the policy is built with, so a knob goes from flag to policy without any
//! copying code in between. The policy catalog (in the policy module) names
//! each policy's group by its heading constant.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{defaults, parsers};

/// Help heading of `--policy` itself.
pub const ROUTING_FLAGS: &str = "Routing";
/// Help heading of the `cache_aware` knobs; the policy catalog names it.
pub const CACHE_AWARE_FLAGS: &str = "Policy cache_aware";
/// Help heading of the `least_load` knobs; the policy catalog names it.
pub const LEAST_LOAD_FLAGS: &str = "Policy least_load";
/// Help heading of the `load_aware` knobs; the policy catalog names it.
pub const LOAD_AWARE_FLAGS: &str = "Policy load_aware";
/// Help heading of the `prefix_affinity` knobs; the policy catalog names it.
pub const PREFIX_AFFINITY_FLAGS: &str = "Policy prefix_affinity";

/// Which routing policy a replica runs. The router builds the policy from
/// this once at start-up (through the policy catalog) and never matches on
/// it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Cycle through healthy workers in order.
    RoundRobin,
    /// Pick a healthy worker uniformly at random.
    Random,
    /// Sample two workers; take the less loaded (KV usage, queue, in-flight).
    PowerOfTwo,
    /// Least expected wait: queued token-work / throughput + KV barrier.
    LeastLoad,
    /// Prefix-cache affinity with a load-imbalance guard.
    CacheAware,
    /// llm-d queue scorer: shortest engine waiting queue.
    LoadAware,
    /// Fleet-wide prefix affinity: rendezvous hashing of the prompt's
    /// leading blocks, bounded by fleet wait and in-flight requests (no pile-up).
    PrefixAffinity,
    /// Route on the engines' own KV-cache events: the worker whose cached
    /// prefix saves the most prefill against its fleet wait, bounded like
    /// prefix_affinity.
    PrecisePrefix,
}

impl PolicyKind {
    /// This kind's `--policy` value, as clap spells it.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|value| value.get_name().to_string())
            .unwrap_or_default()
    }

    /// Every `--policy` value, in declaration order: the one list the
    /// benches and tests derive theirs from, so a new variant reaches all
    /// of them with no hand-kept copy to forget.
    pub fn names() -> Vec<String> {
        Self::value_variants()
            .iter()
            .map(|kind| kind.name())
            .collect()
    }
}

/// `--policy` and every policy's knobs: what the policy catalog needs to
/// build whichever policy was chosen.
#[derive(Debug, Clone, PartialEq, Args)]
#[command(next_help_heading = ROUTING_FLAGS)]
pub struct RoutingConfig {
    /// Routing policy.
    #[arg(long, env = "SHOAL_POLICY", value_enum, default_value = defaults::POLICY)]
    pub policy: PolicyKind,

    /// The `cache_aware` knobs.
    #[command(flatten)]
    pub cache_aware: CacheAwareConfig,

    /// The `least_load` knobs.
    #[command(flatten)]
    pub least_load: LeastLoadConfig,

    /// The `load_aware` knobs.
    #[command(flatten)]
    pub load_aware: LoadAwareConfig,

    /// The `prefix_affinity` knobs (its wait is least_load's, with
    /// least_load's knobs).
    #[command(flatten)]
    pub prefix_affinity: PrefixAffinityConfig,

    /// The `precise_prefix` knobs: KV-event sources, tokenizers, its bound.
    #[command(flatten)]
    pub kv_events: super::KvEventsConfig,
}

/// The `cache_aware` knobs; the policy's module docs say how each is used.
#[derive(Debug, Clone, Copy, PartialEq, Args)]
#[command(next_help_heading = CACHE_AWARE_FLAGS)]
pub struct CacheAwareConfig {
    /// cache_aware: route by prefix affinity when the best match covers more
    /// than this fraction of the prompt (0..=1).
    #[arg(long, env = "SHOAL_CACHE_THRESHOLD", default_value_t = defaults::CACHE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub cache_threshold: f64,

    /// cache_aware: the pool is imbalanced when max - min fleet in-flight
    /// requests exceeds this (and the relative test holds).
    #[arg(long, env = "SHOAL_BALANCE_ABS_THRESHOLD", default_value_t = defaults::BALANCE_ABS_THRESHOLD)]
    pub balance_abs_threshold: u64,

    /// cache_aware: ... and max fleet in-flight requests > this × min (>= 1).
    #[arg(long, env = "SHOAL_BALANCE_REL_THRESHOLD", default_value_t = defaults::BALANCE_REL_THRESHOLD, value_parser = parsers::multiplier)]
    pub balance_rel_threshold: f64,

    /// cache_aware: the pool is imbalanced when max - min KV usage exceeds
    /// this (0..=1; 1 = off). Needs fresh KV usage from every worker.
    #[arg(long, env = "SHOAL_BALANCE_TOKEN_USAGE_THRESHOLD", default_value_t = defaults::BALANCE_TOKEN_USAGE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub balance_token_usage_threshold: f64,

    /// cache_aware: the pool is imbalanced when any worker's KV usage exceeds
    /// this (0..=1; 1 = off). Needs fresh KV usage from every worker.
    #[arg(long, env = "SHOAL_OVERLOAD_TOKEN_USAGE_THRESHOLD", default_value_t = defaults::OVERLOAD_TOKEN_USAGE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub overload_token_usage_threshold: f64,

    /// cache_aware: bytes of prompt text the prefix tree keeps per worker;
    /// least recently used branches beyond it are evicted.
    #[arg(long, env = "SHOAL_MAX_TREE_SIZE", default_value_t = defaults::MAX_TREE_SIZE, value_parser = parsers::positive_usize)]
    pub max_tree_size: usize,

    /// cache_aware: seconds between prefix-tree evictions (run in the background).
    #[arg(long, env = "SHOAL_EVICTION_INTERVAL_SECS", default_value_t = defaults::EVICTION_INTERVAL_SECS, value_parser = parsers::positive_u64)]
    pub eviction_interval_secs: u64,
}

impl Default for CacheAwareConfig {
    /// The flag defaults, for tests and benchmarks that build the policy
    /// without parsing flags.
    fn default() -> Self {
        Self {
            cache_threshold: defaults::CACHE_THRESHOLD,
            balance_abs_threshold: defaults::BALANCE_ABS_THRESHOLD,
            balance_rel_threshold: defaults::BALANCE_REL_THRESHOLD,
            balance_token_usage_threshold: defaults::BALANCE_TOKEN_USAGE_THRESHOLD,
            overload_token_usage_threshold: defaults::OVERLOAD_TOKEN_USAGE_THRESHOLD,
            max_tree_size: defaults::MAX_TREE_SIZE,
            eviction_interval_secs: defaults::EVICTION_INTERVAL_SECS,
        }
    }
}

impl CacheAwareConfig {
    /// Time between prefix-tree evictions, as the background task sleeps it.
    pub fn eviction_interval(&self) -> Duration {
        Duration::from_secs(self.eviction_interval_secs)
    }
}

/// The `least_load` knobs; the policy's module docs give the formula.
#[derive(Debug, Clone, Copy, PartialEq, Args)]
#[command(next_help_heading = LEAST_LOAD_FLAGS)]
pub struct LeastLoadConfig {
    /// least_load: weight w in seconds of the KV barrier w * k/(1-k) (>= 0).
    #[arg(long, env = "SHOAL_LEAST_LOAD_KV_PRESSURE_WEIGHT", default_value_t = defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT, value_parser = parsers::non_negative)]
    pub least_load_kv_pressure_weight: f64,

    /// least_load: tokens/s assumed for an engine that reports no valid throughput (> 0).
    #[arg(long, env = "SHOAL_LEAST_LOAD_DEFAULT_THROUGHPUT", default_value_t = defaults::LEAST_LOAD_DEFAULT_THROUGHPUT, value_parser = parsers::positive)]
    pub least_load_default_throughput: f64,

    /// least_load: tokens/s an engine is credited with at least, whatever it reports (>= 0; 0 takes reports as they are). Engines report their recent decode rate, which at low load measures demand, not capacity.
    #[arg(long, env = "SHOAL_LEAST_LOAD_MIN_THROUGHPUT", default_value_t = defaults::LEAST_LOAD_MIN_THROUGHPUT, value_parser = parsers::non_negative)]
    pub least_load_min_throughput: f64,

    /// least_load: token-work booked for a request whose prompt could not be estimated; also the starting mean prompt that counts an engine's waiting requests when it reports no queued tokens.
    #[arg(long, env = "SHOAL_LEAST_LOAD_MEAN_PREFILL_TOKENS", default_value_t = defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS, value_parser = parsers::positive_u64)]
    pub least_load_mean_prefill_tokens: u64,
}

impl Default for LeastLoadConfig {
    /// The flag defaults, for tests and benchmarks that build the policy
    /// without parsing flags.
    fn default() -> Self {
        Self {
            least_load_kv_pressure_weight: defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT,
            least_load_default_throughput: defaults::LEAST_LOAD_DEFAULT_THROUGHPUT,
            least_load_min_throughput: defaults::LEAST_LOAD_MIN_THROUGHPUT,
            least_load_mean_prefill_tokens: defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS,
        }
    }
}

/// The `load_aware` knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
#[command(next_help_heading = LOAD_AWARE_FLAGS)]
pub struct LoadAwareConfig {
    /// load_aware: engine waiting-queue length at which a worker scores 0.
    #[arg(long, env = "SHOAL_LOAD_AWARE_THRESHOLD", default_value_t = defaults::LOAD_AWARE_THRESHOLD, value_parser = parsers::positive_u64)]
    pub load_aware_threshold: u64,
}

/// The `prefix_affinity` knobs; the policy's module docs say how each is
/// used.
#[derive(Debug, Clone, Copy, PartialEq, Args)]
#[command(next_help_heading = PREFIX_AFFINITY_FLAGS)]
pub struct PrefixAffinityConfig {
    /// prefix_affinity: leading 64-byte blocks of the prompt that make its affinity key; shorter prompts are routed by least_load alone.
    #[arg(long, env = "SHOAL_PREFIX_AFFINITY_BLOCKS", default_value_t = defaults::PREFIX_AFFINITY_BLOCKS, value_parser = parsers::positive_usize)]
    pub prefix_affinity_blocks: usize,

    /// prefix_affinity: a worker keeps affinity while its wait and its in-flight requests are at most (1 + this) × the mean (plus the request's own) (>= 0).
    #[arg(long, env = "SHOAL_PREFIX_AFFINITY_EPSILON", default_value_t = defaults::PREFIX_AFFINITY_EPSILON, value_parser = parsers::non_negative)]
    pub prefix_affinity_epsilon: f64,
}

impl Default for PrefixAffinityConfig {
    /// The flag defaults, for tests and benchmarks that build the policy
    /// without parsing flags.
    fn default() -> Self {
        Self {
            prefix_affinity_blocks: defaults::PREFIX_AFFINITY_BLOCKS,
            prefix_affinity_epsilon: defaults::PREFIX_AFFINITY_EPSILON,
        }
    }
}
