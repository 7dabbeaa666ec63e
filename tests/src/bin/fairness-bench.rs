//! `fairness-bench`: fair share and priority in admission, through real
//! meshed `shoal` replicas over in-process mock engines.
//!
//! Fair share: two tenants of equal weight both saturate the fleet's
//! admission slots (`--max-concurrent-requests` per replica), one with 5 ×
//! the clients of the other and twice the output per request; each should
//! get 50 % ± 5 % of the token-work. The baseline beside it sends the same
//! two groups as one tenant (one flow: first come, first served).
//!
//! Priority: a critical tenant's streamed requests, alone and then while a
//! flood of batch requests runs, marked sheddable (shed fleet-wide at
//! `--sheddable-max-inflight` per worker) and, for the baseline, not
//! marked (standard: nothing holds the flood back). The goal: the critical
//! TTFT p99 under the sheddable flood within 1.2 × its uncontended value.
//!
//! ```text
//! cargo build -p shoal && cargo run -p shoal-tests --bin fairness-bench
//! cargo run -p shoal-tests --bin fairness-bench -- --quick   # CI
//! ```
//!
//! Exits 1 when a fleet cannot start; with `--quick`, also when the fair
//! shares miss 50 % ± 5 %, or a fair-share request is answered other than
//! 200 (TTFT is printed, never judged: this box is shared).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use shoal_tests::bench::fairness::{
    Answer, Clients, closed_loop, outcomes, ttft_quantile, work_between,
};
use shoal_tests::bench::tenants::start_tenant_fleet;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, locate_shoal};
use shoal_tests::mock::{EngineConfig, EngineHandle, Flavor, spawn_engines};

/// Fair share and priority in admission across meshed replicas.
#[derive(Debug, Parser)]
#[command(name = "fairness-bench")]
struct Cli {
    /// Replicas of every fleet.
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Seconds each offer runs.
    #[arg(long, default_value_t = 12)]
    secs: u64,
    /// Seconds at the start of each offer left out of the shares (the
    /// queues filling).
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// CI: shorter offers, the fair-share case only, judged.
    #[arg(long)]
    quick: bool,
    /// Seed of the replica choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The shoal binary [default: next to this one, or $SHOAL_BIN].
    #[arg(long)]
    shoal_bin: Option<PathBuf>,
}

/// Engines and replicas of one case.
struct Rig {
    engines: Vec<EngineHandle>,
    fleet: Fleet,
    client: HttpClient,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start(
        shoal: PathBuf,
        replicas: usize,
        engine: &EngineConfig,
        engines: usize,
        tenants: &str,
        args: &[&str],
    ) -> Result<Rig, String> {
        let handles = spawn_engines(engine, IpAddr::V4(Ipv4Addr::LOCALHOST), 0, engines)
            .await
            .map_err(|e| format!("cannot start mock engines: {e}"))?;
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let urls = handles.iter().map(|e| e.url()).collect();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (fleet, _) = start_tenant_fleet(
            shoal,
            replicas,
            true,
            urls,
            tenants,
            dir.path(),
            Duration::from_secs(30),
            &args,
        )
        .await?;
        Ok(Rig {
            engines: handles,
            fleet,
            client: HttpClient::new(),
            _dir: dir,
        })
    }

    fn urls(&self) -> Arc<Vec<String>> {
        Arc::new((0..self.fleet.len()).map(|i| self.fleet.url(i)).collect())
    }

    /// Runs `groups` side by side for `span`; their answers in order.
    async fn offer(&self, groups: &[Clients], span: Duration, seed: u64) -> Vec<Vec<Answer>> {
        let start = Instant::now();
        let runs = groups.iter().enumerate().map(|(i, g)| {
            closed_loop(
                &self.client,
                self.urls(),
                Arc::new(g.clone()),
                span,
                seed.wrapping_add(i as u64 * 1_000),
                start,
            )
        });
        futures_util::future::join_all(runs).await
    }

    async fn stop(mut self) {
        self.fleet.shutdown(Duration::from_secs(3)).await;
        for e in self.engines.drain(..) {
            e.shutdown().await;
        }
    }
}

/// A group of `count` clients presenting `key`.
fn group(label: &str, key: &str, count: usize, max_tokens: u64, stream: bool) -> Clients {
    Clients {
        label: label.to_string(),
        key: key.to_string(),
        count,
        prompt_chars: 256,
        max_tokens,
        stream,
        headers: Vec::new(),
        backoff: Duration::from_millis(200),
        skew: None,
    }
}

const FAIR_TENANTS: &str = r#"
[tenants.light]
keys = ["light-key-0000001"]
[tenants.heavy]
keys = ["heavy-key-0000001"]
[tenants.shared]
keys = ["shared-key-000001", "shared-key-000002"]
"#;

/// One row of the fair-share table: the two groups' keys, the light
/// group's clients and where its traffic lands.
struct Case {
    flows: &'static str,
    keys: (&'static str, &'static str),
    light_clients: usize,
    skew: Option<f64>,
}

/// The fair-share case; true when it met the goal.
async fn fair_share(cli: &Cli, shoal: PathBuf, span: Duration) -> Result<bool, String> {
    println!(
        "## Fair share: {} meshed replicas x 2 slots; light: N clients x 32 tokens, \
         heavy: 5 N clients x 64 tokens; {}s (first {}s left out)\n",
        cli.replicas,
        span.as_secs(),
        cli.warmup_secs
    );
    println!(
        "| fair share | flows | light clients (x fleet slots) | light share of token-work \
         | heavy share | light req | heavy req | answers |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let slots = cli.replicas * 2;
    let (two, one) = (
        ("light-key-0000001", "heavy-key-0000001"),
        ("shared-key-000001", "shared-key-000002"),
    );
    let case = |flows, keys, times, skew| Case {
        flows,
        keys,
        light_clients: times * slots,
        skew,
    };
    let mut fleet_cases = vec![case("two tenants", two, 4, None)];
    let mut replica_cases = Vec::new();
    if !cli.quick {
        fleet_cases.push(case("one tenant (FIFO)", one, 4, None));
        fleet_cases.push(case("two tenants", two, 2, None));
        fleet_cases.push(case(
            "two tenants, light 90 % to replica 0",
            two,
            4,
            Some(0.9),
        ));
        fleet_cases.push(case(
            "one tenant (FIFO), light 90 % to replica 0",
            one,
            4,
            Some(0.9),
        ));
        replica_cases.push(case("two tenants", two, 2, None));
        replica_cases.push(case(
            "two tenants, light 90 % to replica 0",
            two,
            4,
            Some(0.9),
        ));
    }
    let mut met = true;
    for (scope, cases) in [("fleet", fleet_cases), ("replica", replica_cases)] {
        if cases.is_empty() {
            continue;
        }
        let engine = EngineConfig {
            flavor: Flavor::Vllm,
            time_scale: 10.0,
            ..EngineConfig::default()
        };
        let args = [
            "--max-concurrent-requests",
            "2",
            "--queue-size",
            "1000",
            "--fair-share-scope",
            scope,
        ];
        let rig = Rig::start(shoal.clone(), cli.replicas, &engine, 2, FAIR_TENANTS, &args).await?;
        for c in cases {
            let groups = [
                Clients {
                    skew: c.skew,
                    ..group("light", c.keys.0, c.light_clients, 32, false)
                },
                group("heavy", c.keys.1, 5 * c.light_clients, 64, false),
            ];
            let answers = rig.offer(&groups, span, cli.seed).await;
            let (from, to) = (Duration::from_secs(cli.warmup_secs), span);
            let light = work_between(&answers[0], from, to);
            let heavy = work_between(&answers[1], from, to);
            let share = light as f64 / (light + heavy).max(1) as f64;
            let ok = |a: &[Answer]| a.iter().filter(|a| a.status == 200).count();
            let all: Vec<Answer> = answers.concat();
            println!(
                "| {scope} | {} | {} ({}x) | {:.1} % | {:.1} % | {} | {} | {:?} |",
                c.flows,
                c.light_clients,
                c.light_clients / slots,
                share * 100.0,
                (1.0 - share) * 100.0,
                ok(&answers[0]),
                ok(&answers[1]),
                outcomes(&all)
            );
            let judged = scope == "fleet" && c.keys == two && c.skew.is_none();
            if judged && c.light_clients == 4 * slots {
                met = (share - 0.5).abs() <= 0.05 && all.iter().all(|a| a.status == 200);
            }
        }
        rig.stop().await;
    }
    println!();
    Ok(met)
}

const PRIORITY_TENANTS: &str = r#"
[tenants.chat]
keys = ["chat-key-00000001"]
priority = "critical"
[tenants.batch]
keys = ["batch-key-0000001"]
"#;

/// The priority case: critical TTFT alone, under a sheddable flood and
/// under the same flood unmarked.
async fn priority(cli: &Cli, shoal: PathBuf, span: Duration) -> Result<(), String> {
    let engine = EngineConfig {
        flavor: Flavor::Vllm,
        max_running: 16,
        ..EngineConfig::default()
    };
    let args = ["--sheddable-max-inflight", "8"];
    let rig = Rig::start(shoal, 2, &engine, 2, PRIORITY_TENANTS, &args).await?;
    println!(
        "## Priority: 2 meshed replicas over 2 engines (16 running each), \
         --sheddable-max-inflight 8; critical: 4 clients, 2,000-char prompts, 8 tokens, \
         streamed; flood: 48 clients x 256 tokens, 200 ms back-off after a refusal; {}s each\n",
        span.as_secs()
    );
    println!(
        "| phase | critical TTFT p50 | p99 | p99 / alone | critical answers | flood answers |"
    );
    println!("|---|---|---|---|---|---|");
    let critical = Clients {
        prompt_chars: 2_000,
        ..group("critical", "chat-key-00000001", 4, 8, true)
    };
    let mut flood = group("flood", "batch-key-0000001", 48, 256, true);
    let mut alone_p99 = None;
    for phase in ["alone", "sheddable flood", "standard flood (baseline)"] {
        let groups = match phase {
            "alone" => vec![critical.clone()],
            "sheddable flood" => {
                flood.headers = vec![("x-shoal-priority".into(), "sheddable".into())];
                vec![critical.clone(), flood.clone()]
            }
            _ => {
                flood.headers.clear();
                vec![critical.clone(), flood.clone()]
            }
        };
        let answers = rig.offer(&groups, span, cli.seed).await;
        let crit = &answers[0];
        let p50 = ttft_quantile(crit, 0.5);
        let p99 = ttft_quantile(crit, 0.99);
        if phase == "alone" {
            alone_p99 = p99;
        }
        let ratio = match (p99, alone_p99) {
            (Some(p), Some(a)) if !a.is_zero() => {
                format!("{:.2}", p.as_secs_f64() / a.as_secs_f64())
            }
            _ => "-".into(),
        };
        let ms = |d: Option<Duration>| {
            d.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
        };
        let flood_outcomes = answers.get(1).map(|a| format!("{:?}", outcomes(a)));
        println!(
            "| {phase} | {} | {} | {ratio} | {:?} | {} |",
            ms(p50),
            ms(p99),
            outcomes(crit),
            flood_outcomes.unwrap_or_else(|| "-".into())
        );
        // Let the flood's streams end before the next phase.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!();
    rig.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let shoal = match locate_shoal(cli.shoal_bin.as_deref()) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("fairness-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let span = Duration::from_secs(if cli.quick { 6 } else { cli.secs });
    let met = match fair_share(&cli, shoal.clone(), span).await {
        Ok(met) => met,
        Err(e) => {
            eprintln!("fairness-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if cli.quick {
        if !met {
            eprintln!("fairness-bench: the fair shares missed 50 % ± 5 %, or a request failed");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = priority(&cli, shoal, span).await {
        eprintln!("fairness-bench: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
