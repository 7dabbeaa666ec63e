use super::*;
use std::io::Write;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    Config::load_from(std::iter::once("shoal").chain(args.iter().copied()))
}

fn error_text(args: &[&str]) -> String {
    parse(args).unwrap_err().to_string()
}

#[test]
fn defaults_come_from_the_defaults_module() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.host, defaults::HOST);
    assert_eq!(config.port, defaults::PORT);
    assert_eq!(
        config.load.load_poll_interval_ms,
        defaults::LOAD_POLL_INTERVAL_MS
    );
    assert_eq!(
        config.load.stale_after(),
        Duration::from_millis(defaults::LOAD_POLL_INTERVAL_MS * defaults::LOAD_STALE_AFTER_POLLS)
    );
    assert_eq!(config.retry.retry_max_retries, defaults::RETRY_MAX_RETRIES);
    assert_eq!(config.routing.policy, PolicyKind::PrefixAffinity);
    assert_eq!(config.load.worker_load_source, LoadSource::Auto);
    assert_eq!(
        config.routing.cache_aware.cache_threshold,
        defaults::CACHE_THRESHOLD
    );
    assert_eq!(
        config.routing.cache_aware.balance_abs_threshold,
        defaults::BALANCE_ABS_THRESHOLD
    );
    assert_eq!(
        config.routing.cache_aware.balance_rel_threshold,
        defaults::BALANCE_REL_THRESHOLD
    );
    assert_eq!(
        config.routing.cache_aware.balance_token_usage_threshold,
        defaults::BALANCE_TOKEN_USAGE_THRESHOLD
    );
    assert_eq!(
        config.routing.cache_aware.overload_token_usage_threshold,
        defaults::OVERLOAD_TOKEN_USAGE_THRESHOLD
    );
    assert_eq!(
        config.routing.cache_aware.max_tree_size,
        defaults::MAX_TREE_SIZE
    );
    assert_eq!(
        config.routing.cache_aware.eviction_interval_secs,
        defaults::EVICTION_INTERVAL_SECS
    );
    assert_eq!(
        config.routing.least_load.least_load_kv_pressure_weight,
        defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT
    );
    assert_eq!(
        config.routing.least_load.least_load_default_throughput,
        defaults::LEAST_LOAD_DEFAULT_THROUGHPUT
    );
    assert_eq!(
        config.routing.least_load.least_load_mean_prefill_tokens,
        defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS
    );
    assert_eq!(
        config.routing.load_aware.load_aware_threshold,
        defaults::LOAD_AWARE_THRESHOLD
    );
    // The published defaults (docs/configuration.md, ARCHITECTURE): the SGLang gateway's
    // where it has the knob.
    assert_eq!(
        (
            config.routing.cache_aware.cache_threshold,
            config.routing.cache_aware.balance_abs_threshold
        ),
        (0.3, 64)
    );
    assert_eq!(config.routing.cache_aware.balance_rel_threshold, 1.5);
    assert_eq!(
        config.routing.least_load.least_load_kv_pressure_weight,
        0.15
    );
    assert_eq!(
        config.routing.least_load.least_load_default_throughput,
        2000.0
    );
    assert_eq!(
        config.routing.least_load.least_load_mean_prefill_tokens,
        1024
    );
    assert_eq!(config.routing.load_aware.load_aware_threshold, 128);
}

#[test]
fn policy_flags_reject_bad_values_naming_the_flag() {
    for (flag, bad) in [
        ("--cache-threshold", "NaN"),
        ("--cache-threshold", "1.01"),
        ("--cache-threshold", "-0.1"),
        ("--balance-abs-threshold", "-1"),
        ("--balance-rel-threshold", "inf"),
        ("--balance-rel-threshold", "0.5"),
        ("--balance-token-usage-threshold", "2"),
        ("--balance-token-usage-threshold", "nan"),
        ("--overload-token-usage-threshold", "-inf"),
        ("--overload-token-usage-threshold", "1.5"),
        ("--least-load-kv-pressure-weight", "-0.15"),
        ("--least-load-kv-pressure-weight", "NaN"),
        ("--least-load-default-throughput", "0"),
        ("--least-load-default-throughput", "inf"),
        ("--least-load-min-throughput", "-1"),
        ("--least-load-min-throughput", "NaN"),
        ("--least-load-mean-prefill-tokens", "0"),
        ("--load-aware-threshold", "0"),
        ("--load-aware-threshold", "-3"),
        ("--max-tree-size", "0"),
        ("--eviction-interval-secs", "0"),
    ] {
        let text = error_text(&[&format!("{flag}={bad}")]);
        assert!(text.contains(flag), "{flag}={bad}: {text}");
    }
    let config = parse(&[
        "--policy",
        "least_load",
        "--cache-threshold",
        "1",
        "--balance-token-usage-threshold",
        "0",
        "--least-load-kv-pressure-weight",
        "0",
        "--load-aware-threshold",
        "1",
    ])
    .unwrap();
    assert_eq!(config.routing.policy, PolicyKind::LeastLoad);
    assert_eq!(config.routing.cache_aware.cache_threshold, 1.0);
    assert_eq!(config.routing.least_load.least_load_kv_pressure_weight, 0.0);
    let names = PolicyKind::names();
    assert_eq!(
        names.len(),
        <PolicyKind as clap::ValueEnum>::value_variants().len()
    );
    for (name, kind) in names
        .iter()
        .zip(<PolicyKind as clap::ValueEnum>::value_variants())
    {
        assert!(
            !name.is_empty() && !name.contains(char::is_uppercase),
            "{name}"
        );
        assert_eq!(parse(&["--policy", name]).unwrap().routing.policy, *kind);
    }
    assert!(
        names.iter().any(|n| n == defaults::POLICY),
        "the default is a policy"
    );
}

#[test]
fn worker_urls_accept_lists_and_are_normalised() {
    let config = parse(&["--worker-urls", "http://a:1/", "http://b:2", "--port", "1"]).unwrap();
    assert_eq!(config.worker_urls, vec!["http://a:1", "http://b:2"]);
    let config = parse(&["--worker-urls=http://a:1,http://b:2"]).unwrap();
    assert_eq!(config.worker_urls.len(), 2);
    let text = error_text(&["--worker-urls", "a:1"]);
    assert!(text.contains("--worker-urls"), "{text}");
}

#[test]
fn bad_values_name_their_flag() {
    for (args, flag) in [
        (
            vec!["--retry-jitter-factor", "NaN"],
            "--retry-jitter-factor",
        ),
        (
            vec!["--retry-jitter-factor", "1.5"],
            "--retry-jitter-factor",
        ),
        (
            vec!["--retry-backoff-multiplier", "inf"],
            "--retry-backoff-multiplier",
        ),
        (
            vec!["--load-poll-interval-ms", "0"],
            "--load-poll-interval-ms",
        ),
        (vec!["--port=-1"], "--port"),
        (vec!["--policy", "fastest"], "--policy"),
        (
            vec!["--health-check-endpoint", "health"],
            "--health-check-endpoint",
        ),
        (vec!["--load-stale-after-ms", "10"], "--load-stale-after-ms"),
        (
            vec![
                "--retry-max-backoff-ms",
                "1",
                "--retry-initial-backoff-ms",
                "5",
            ],
            "--retry-max-backoff-ms",
        ),
    ] {
        let text = error_text(&args);
        assert!(text.contains(flag), "{args:?}: {text}");
    }
}

#[test]
fn config_file_sets_values_and_flags_override_it() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "port = 4000\nload_poll_interval_ms = 250\nworker-urls = [\"http://x:1\", \"http://y:2\"]\nlog-json = true\npolicy = \"random\""
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    let config = parse(&["--config", path]).unwrap();
    assert_eq!(config.port, 4000);
    assert_eq!(config.load.load_poll_interval_ms, 250);
    assert_eq!(config.worker_urls, vec!["http://x:1", "http://y:2"]);
    assert!(config.log_json);
    assert_eq!(config.routing.policy, PolicyKind::Random);

    let config = parse(&[
        "--config",
        path,
        "--port",
        "5000",
        "--worker-urls",
        "http://z:3",
    ])
    .unwrap();
    assert_eq!(config.port, 5000);
    assert_eq!(config.worker_urls, vec!["http://z:3"]);
}

#[test]
fn config_file_errors_name_the_file_and_key() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "prot = 4000").unwrap();
    let path = file.path().to_str().unwrap().to_string();
    let text = error_text(&["--config", &path]);
    assert!(text.contains("prot") && text.contains(&path), "{text}");

    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "retry_jitter_factor = nan").unwrap();
    let text = error_text(&["--config", file.path().to_str().unwrap()]);
    assert!(text.contains("--retry-jitter-factor"), "{text}");

    let text = error_text(&["--config", "/nonexistent/shoal.toml"]);
    assert!(text.contains("/nonexistent/shoal.toml"), "{text}");
}

#[test]
fn mesh_is_off_by_default_and_on_with_peers_or_a_port() {
    let config = parse(&[]).unwrap();
    assert!(!config.mesh.enabled());
    assert_eq!(config.mesh.gossip_port(), defaults::MESH_PORT);
    assert_eq!(
        config.drain_settle(),
        Duration::from_secs(defaults::DRAIN_SETTLE_SECS)
    );
    let text = error_text(&["--mesh-port", "0"]);
    assert!(text.contains("--mesh-tls-ca"), "{text}");
}

#[test]
fn mesh_flags_are_checked_with_their_names() {
    let dir = tempfile::tempdir().unwrap();
    crate::cli::generate(dir.path(), &["a".into()], 1, false).unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("a.pem"), file("a-key.pem"));
    let tls = [
        "--mesh-tls-ca",
        &ca,
        "--mesh-tls-cert",
        &cert,
        "--mesh-tls-key",
        &key,
        "--mesh-name",
        "a",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        tls.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let args = with(&["--mesh-peer-urls", "127.0.0.1:7001,peers.shoal.svc:7001"]);
    let text = error_text(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(text.contains("--mesh-advertise-host"), "{text}");

    let args = with(&[
        "--mesh-peer-urls",
        "127.0.0.1:7001",
        "--mesh-advertise-host",
        "10.0.0.1",
    ]);
    let config = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert!(config.mesh.enabled());
    assert_eq!(config.mesh.mesh_peer_urls, vec!["127.0.0.1:7001"]);

    for (bad, flag) in [
        (vec!["--mesh-peer-urls", "no-port"], "--mesh-peer-urls"),
        (vec!["--mesh-peer-urls", "a b:1"], "--mesh-peer-urls"),
        (vec!["--mesh-name", "Not_A_Name"], "--mesh-name"),
        (vec!["--mesh-host", "localhost"], "--mesh-host"),
        (
            vec!["--mesh-sync-interval-ms", "0"],
            "--mesh-sync-interval-ms",
        ),
    ] {
        let text = error_text(&bad);
        assert!(text.contains(flag), "{bad:?}: {text}");
    }
    let text = error_text(&[
        "--mesh-port",
        "1",
        "--mesh-tls-ca",
        "/nonexistent.pem",
        "--mesh-tls-cert",
        &cert,
        "--mesh-tls-key",
        &key,
        "--mesh-name",
        "a",
        "--mesh-host",
        "127.0.0.1",
    ]);
    assert!(
        text.contains("--mesh-tls-ca") && text.contains("/nonexistent.pem"),
        "{text}"
    );
}

#[test]
fn group_defaults_match_the_flag_defaults() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.routing.cache_aware, CacheAwareConfig::default());
    assert_eq!(config.routing.least_load, LeastLoadConfig::default());
    assert_eq!(config.retry, RetryConfig::default());
    assert_eq!(config.breaker, BreakerConfig::default());
}

#[test]
fn io_threads_default_to_one_per_core_and_reject_bad_counts_naming_the_flag() {
    assert_eq!(parse(&[]).unwrap().io_threads, defaults::IO_THREADS);
    assert_eq!(parse(&["--io-threads", "3"]).unwrap().io_threads, 3);
    for bad in ["-1", "two", "1025", "1e3"] {
        let text = error_text(&[&format!("--io-threads={bad}")]);
        assert!(text.contains("--io-threads"), "--io-threads={bad}: {text}");
    }
}

/// The two help strings that state a default in words (the flag's value
/// is derived, so clap cannot print it) name the constant's value: a new
/// default cannot leave the help behind.
#[test]
fn help_strings_that_state_a_default_name_the_constant() {
    use clap::CommandFactory;
    let command = Config::command();
    let help = |id: &str| {
        command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .and_then(|arg| arg.get_help())
            .map(|help| help.to_string())
            .unwrap_or_default()
    };
    let port = help("mesh_port");
    assert!(
        port.contains(&format!("[default when on: {}]", defaults::MESH_PORT)),
        "{port}"
    );
    let stale = help("load_stale_after_ms");
    assert!(
        stale.contains(&format!(
            "[default: {} × poll interval]",
            defaults::LOAD_STALE_AFTER_POLLS
        )),
        "{stale}"
    );
}

#[test]
fn disaggregation_flags_that_do_not_fit_are_refused_naming_them() {
    let pools = [
        "--prefill-urls",
        "http://p:1",
        "--decode-urls",
        "http://d:1",
    ];
    assert!(error_text(&pools).contains("--pd-protocol"));
    assert!(error_text(&["--pd-protocol", "vllm"]).contains("--prefill-urls"));
    let overlap = [
        "--prefill-urls",
        "http://p:1",
        "--decode-urls",
        "http://p:1",
        "--pd-protocol",
        "vllm",
    ];
    assert!(error_text(&overlap).contains("both"));
    let short = [
        &pools[..],
        &["--pd-protocol", "sglang", "--pd-min-prompt-tokens", "100"],
    ]
    .concat();
    assert!(error_text(&short).contains("--pd-min-prompt-tokens"));
    let ok = parse(&[&pools[..], &["--pd-protocol", "sglang"]].concat()).unwrap();
    assert_eq!(ok.disagg.protocol(false), Some(PdProtocol::Sglang));
    // The pools are seeds: decode first, then prefill.
    assert_eq!(ok.seed_urls(), ["http://d:1", "http://p:1"]);
    // Pools found by discovery: the label with a protocol is enough.
    let discovered = parse(&[
        "--discovery",
        "kubernetes",
        "--discovery-selector",
        "app=llm",
        "--discovery-role-label",
        "shoal.io/pd-role",
        "--pd-protocol",
        "vllm",
    ])
    .unwrap();
    assert_eq!(discovered.disagg.protocol(true), Some(PdProtocol::Vllm));
    assert!(error_text(&["--discovery-role-label", "x"]).contains("--discovery-role-label"));
}
