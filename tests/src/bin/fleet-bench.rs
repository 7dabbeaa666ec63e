//! `fleet-bench`: one router with all the information (the oracle) vs R
//! replicas without the mesh vs R meshed replicas, for `least_load`
//! (size-skewed traffic, SGLang engines), `cache_aware` (shared-prefix
//! traffic) and optionally `least_load_vllm` (size-skewed traffic, vLLM
//! engines), on the same seeded Poisson arrivals, once per seed. Prints a
//! markdown table per seed and a summary over seeds, writes JSON and a PNG.
//! `--trace` replays a Mooncake-format trace (or a generated chat / agentic
//! one) instead, and `gen-trace` writes one. See tests/BENCHMARKS.md.
//!
//! ```sh
//! cargo build --release -p shoal -p shoal-tests
//! target/release/fleet-bench            # full: R = 4, E = 8
//! target/release/fleet-bench --seeds 5  # the same, 5 arrival draws
//! target/release/fleet-bench --quick    # CI smoke test, < 3 min
//! target/release/fleet-bench --quick --trace gen:chat
//! target/release/fleet-bench gen-trace --kind agentic --out agentic.jsonl
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use shoal_tests::bench::cpu::clock_ticks_per_sec;
use shoal_tests::bench::disagg::DisaggSetup;
use shoal_tests::bench::driver::LoadOptions;
use shoal_tests::bench::kv::{EVENT_POLICY, KvEventsSetup, fixture_tokenizer};
use shoal_tests::bench::plan::{Choice, parse_choices, parse_trace_policies, scenarios, seeds};
use shoal_tests::bench::pooled::pooled_ratio;
use shoal_tests::bench::report::{ScenarioResult, markdown_table, opt};
use shoal_tests::bench::summary::{goal_lines, goals, summarize_seeds, summary_table};
use shoal_tests::bench::trace::generate::{TraceKind, generate};
use shoal_tests::bench::trace::plan::{SeedReplay, TraceOptions, prepare};
use shoal_tests::bench::trace::replay::{DEFAULT_LENGTH_SCALE, ScaledTrace, Timing, TraceSource};
use shoal_tests::bench::trace::report::trace_table;
use shoal_tests::bench::trace::write_trace;
use shoal_tests::bench::workload::{Schedule, engine_capacity, mean_sizes};
use shoal_tests::bench::{BenchSetup, ScenarioSpec, plot, run_scenario};
use shoal_tests::fleet::locate_shoal;
use shoal_tests::mock::{EngineConfig, Flavor};

/// Fleet benchmark: oracle vs replicas without the mesh vs meshed replicas.
#[derive(Debug, Parser)]
#[command(name = "fleet-bench", version)]
struct Cli {
    /// `gen-trace` writes a synthetic trace instead of running the bench.
    #[command(subcommand)]
    command: Option<Command>,
    /// CI smoke test: 2 replicas, 4 engines, short runs; exits 1 unless
    /// every scenario completed requests without errors.
    #[arg(long)]
    quick: bool,
    /// Replicas in the multi-replica scenarios [default: 4, quick 2].
    #[arg(long, value_parser = clap::value_parser!(u16).range(2..=16))]
    replicas: Option<u16>,
    /// Mock engines [default: 8, quick 4].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=32))]
    engines: Option<u16>,
    /// Arrival window per scenario, wall seconds [default: 60, quick 12].
    #[arg(long, value_parser = clap::value_parser!(u64).range(5..=600))]
    duration_secs: Option<u64>,
    /// Engine time scale (model seconds per wall second) [default: 2, quick 4].
    #[arg(long)]
    time_scale: Option<f64>,
    /// Offered load as a fraction of the calibrated fleet capacity.
    #[arg(long, default_value_t = 0.85)]
    load: f64,
    /// RNG seed of the arrival and size sequence (same for every scenario
    /// of a seed); further seeds count up from it.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Runs the whole plan once per seed (--seed, --seed + 1, ...) and
    /// summarizes each scenario by its median and range over seeds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=30))]
    seeds: u16,
    /// Policies to compare (comma separated): least_load (size-skewed
    /// traffic), cache_aware (shared-prefix), least_load_vllm (least_load
    /// on the size-skewed traffic, vLLM engines), or `<policy>@<workload>`
    /// for any shoal policy on size_skewed or shared_prefix traffic. With
    /// --trace: plain shoal policy names, each run on the trace
    /// [default: least_load,cache_aware; with --trace
    /// precise_prefix,prefix_affinity,cache_aware].
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Replays a trace instead of the generated workloads: a Mooncake
    /// FAST'25 JSONL file (timestamp, input_length, output_length,
    /// hash_ids), or gen:chat / gen:agentic for a synthetic one drawn from
    /// each seed.
    #[arg(long, value_name = "FILE|gen:KIND")]
    trace: Option<TraceSource>,
    /// Multiplies the trace's input and output lengths and its 512-token
    /// block size (0.05 makes ~26-token blocks).
    #[arg(long, default_value_t = DEFAULT_LENGTH_SCALE, requires = "trace")]
    trace_length_scale: f64,
    /// Rescales the trace's arrival times so that it offers this fraction
    /// of the fleet capacity estimated for its mean sizes [default: --load].
    #[arg(long, requires = "trace", conflicts_with = "trace_time_scale")]
    trace_load: Option<f64>,
    /// Replays the trace's timestamps this many times faster than the
    /// engines' model time (1 = as recorded) instead of --trace-load.
    #[arg(long, requires = "trace")]
    trace_time_scale: Option<f64>,
    /// Requests of the trace read (or generated) at most; arrivals past
    /// --duration-secs are left out too [default: 2000, quick 600].
    #[arg(long, requires = "trace", value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    trace_limit: Option<u32>,
    /// Router load-poll interval in model ms (the router's default is 1000).
    #[arg(long, default_value_t = 1000.0)]
    poll_interval_ms: f64,
    /// Mesh sync interval in model ms (the router's default is 20).
    #[arg(long, default_value_t = 20.0)]
    mesh_sync_ms: f64,
    /// Shortest gap between pushes on change in model ms (the router's
    /// default is 4; scaled like the sync interval).
    #[arg(long, default_value_t = 4.0)]
    mesh_push_gap_ms: f64,
    /// Prompt tokens each engine's prefix cache holds [default: the mock
    /// engine's, 65,536]. A vLLM engine serving an 8B model on one 80 GB
    /// GPU keeps ~400k tokens of KV; the default is small so that cache
    /// pressure shows on short runs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1024..=100_000_000))]
    engine_cache_tokens: Option<u64>,
    /// Output tokens per SSE event after the first (CPU of the box).
    #[arg(long, default_value_t = 16)]
    tokens_per_chunk: u32,
    /// Requests per scenario at most.
    #[arg(long, default_value_t = 20_000)]
    max_requests: usize,
    /// Runs only the scenarios with these labels (comma separated: oracle,
    /// no-mesh, mesh, mesh-1) [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also runs each choice on one meshed replica (`mesh-1`): the oracle's
    /// traffic through the meshed fleet view. Separates what the mesh's
    /// view costs from what splitting traffic over replicas costs.
    #[arg(long)]
    mesh_of_one: bool,
    /// Directory for fleet-bench.json and fleet-bench.png.
    #[arg(long, default_value = "target/fleet-bench")]
    out: PathBuf,
    /// TrueType font for the PNG [default: DejaVu Sans].
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
    /// The `tokenizer.json` engines and replicas share when a policy routes
    /// on KV events (precise_prefix) [default: the test fixture].
    #[arg(long, value_name = "FILE")]
    kv_tokenizer: Option<PathBuf>,
    /// Disaggregates the fleet: the first --prefill-engines engines
    /// prefill, the rest decode, handing the KV over by this protocol
    /// (sglang or vllm); load is calibrated on the smaller pool.
    #[arg(long, value_name = "PROTOCOL")]
    disagg: Option<String>,
    /// Engines in the prefill pool with --disagg.
    #[arg(long, default_value_t = 2, requires = "disagg")]
    prefill_engines: usize,
    /// The shoal binary [default: `shoal` next to this program].
    #[arg(long, value_name = "PATH")]
    shoal_bin: Option<PathBuf>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Writes a synthetic trace in the Mooncake JSONL format.
    GenTrace(GenTrace),
}

/// `fleet-bench gen-trace`.
#[derive(Debug, Args)]
struct GenTrace {
    /// chat (multi-turn conversations) or agentic (shared tool prefix,
    /// branches, unique suffixes).
    #[arg(long)]
    kind: TraceKind,
    /// Requests.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    requests: u32,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The JSONL file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// `--policies` unless given.
const DEFAULT_POLICIES: &str = "least_load,cache_aware";
/// `--policies` of a trace replay unless given.
const DEFAULT_TRACE_POLICIES: &str = "precise_prefix,prefix_affinity,cache_aware";

/// Every scenario of a run with the schedule it replays, seed-major.
type Plan = Vec<(ScenarioSpec, Arc<Schedule>)>;

/// Writes the `gen-trace` file and says what is in it.
fn gen_trace(g: &GenTrace) -> Result<ExitCode, String> {
    let t = generate(g.kind, g.requests as usize, g.seed);
    let file = std::fs::File::create(&g.out).map_err(|e| format!("{}: {e}", g.out.display()))?;
    write_trace(std::io::BufWriter::new(file), &t)
        .map_err(|e| format!("{}: {e}", g.out.display()))?;
    let scaled = ScaledTrace::new(g.kind.as_str(), &t, 1.0, u64::MAX)?;
    let (p, _, o) = scaled.mean_sizes();
    println!(
        "wrote {} {} requests to {} (mean input {p:.0} / output {o:.0} tokens, ideal cache hit {:.0}%, {:.0} s)",
        t.len(),
        g.kind.as_str(),
        g.out.display(),
        100.0 * scaled.ideal_hit_rate(usize::MAX),
        t.last().map_or(0, |r| r.timestamp) as f64 / 1e3
    );
    Ok(ExitCode::SUCCESS)
}

/// The trace options of `cli` (`None` without --trace), checked.
fn trace_options(cli: &Cli, window: Duration) -> Result<Option<TraceOptions>, String> {
    let Some(source) = cli.trace.clone() else {
        return Ok(None);
    };
    let timing = match (cli.trace_time_scale, cli.trace_load) {
        (Some(f), _) if !(f.is_finite() && f > 0.0 && f <= 1e6) => {
            return Err(format!("--trace-time-scale must be in (0, 1e6] (got {f})"));
        }
        (Some(f), _) => Timing::TimeScale(f),
        (None, Some(l)) if !(0.05..=2.0).contains(&l) => {
            return Err(format!("--trace-load must be in 0.05..=2 (got {l})"));
        }
        (None, l) => Timing::Load(l.unwrap_or(cli.load)),
    };
    let default_limit = if cli.quick { 600 } else { 2_000 };
    Ok(Some(TraceOptions {
        source,
        length_scale: cli.trace_length_scale,
        timing,
        limit: cli.trace_limit.map_or(default_limit, |n| n as usize),
        window,
    }))
}

/// Adds `specs` (oracle, no-mesh, mesh) replaying `schedule` to `plan`,
/// with the mesh-of-one scenario if asked and only the `--only` labels.
fn push_scenarios(plan: &mut Plan, cli: &Cli, specs: [ScenarioSpec; 3], schedule: &Arc<Schedule>) {
    let [oracle, no_mesh, mesh] = specs;
    let mut add = Vec::new();
    if cli.mesh_of_one {
        add.push(ScenarioSpec {
            label: "mesh-1".into(),
            mesh: true,
            ..oracle.clone()
        });
    }
    add.extend([oracle, no_mesh, mesh]);
    add.retain(|spec| cli.only.is_empty() || cli.only.contains(&spec.label));
    plan.extend(add.into_iter().map(|spec| (spec, schedule.clone())));
}

/// The plan and calibration of the generated workloads of `choices`.
fn workload_plan(
    cli: &Cli,
    setup: &BenchSetup,
    choices: &[Choice],
    (replicas, duration): (usize, Duration),
    seeds: &[u64],
) -> Result<(Plan, Vec<serde_json::Value>), String> {
    let (engine, engines, time_scale) = (&setup.engine, setup.engines, setup.engine.time_scale);
    let mut calibration = Vec::new();
    let mut rates = Vec::new();
    for &choice in choices {
        let [spec, ..] = choice.scenarios(replicas);
        setup.engine_for(&spec).validate().map_err(|e| e.0)?;
        let kind = choice.workload();
        let (p, u, o) = mean_sizes(kind);
        let per_engine = engine_capacity(engine, p, u, o, 0.9);
        let capacity = match &setup.disagg {
            Some(pd) => pd.capacity(engine, engines, (p, u, o)) * time_scale,
            None => per_engine * engines as f64 * time_scale,
        };
        let rate = cli.load * capacity;
        let name = choice.name();
        eprintln!(
            "{name}: {} workload on {} engines, mean prompt {p:.0} (uncached {u:.0}) / output {o:.0} \
             tokens; capacity {per_engine:.2} req/s per engine (model time) = {capacity:.1} req/s \
             fleet (wall, x{time_scale}); offering {rate:.1} req/s",
            kind.as_str(),
            choice.flavor()
        );
        calibration.push(json!({"policy": choice.policy(), "group": name,
            "engine_flavor": choice.flavor().as_str(), "workload": kind.as_str(),
            "mean_prompt_tokens": p, "mean_uncached_tokens": u, "mean_output_tokens": o,
            "engine_capacity_model_rps": per_engine, "fleet_capacity_wall_rps": capacity,
            "offered_rps": rate}));
        rates.push(rate);
    }
    // Seed-major: every scenario of a seed replays that seed's arrivals.
    let mut plan = Plan::new();
    for &seed in seeds {
        for (&choice, &rate) in choices.iter().zip(&rates) {
            let schedule = Arc::new(Schedule::generate(
                choice.workload(),
                rate,
                duration,
                cli.max_requests,
                engines,
                seed,
            ));
            push_scenarios(&mut plan, cli, choice.scenarios(replicas), &schedule);
        }
    }
    Ok((plan, calibration))
}

/// The plan and calibration of a trace replay: each policy on the trace
/// (drawn per seed when generated), SGLang engines.
fn trace_plan(
    cli: &Cli,
    setup: &BenchSetup,
    opts: &TraceOptions,
    policies: &[&str],
    replicas: usize,
    seeds: &[u64],
) -> Result<(Plan, Vec<serde_json::Value>, Vec<SeedReplay>), String> {
    let name = opts.source.name();
    let engine = EngineConfig {
        flavor: Flavor::Sglang,
        ..setup.engine.clone()
    };
    engine.validate().map_err(|e| e.0)?;
    if seeds.len() > 1 && matches!(opts.source, TraceSource::File(_)) {
        eprintln!("trace {name}: a file replays the same requests for every seed");
    }
    let mut plan = Plan::new();
    let mut calibration = Vec::new();
    let mut replays = Vec::new();
    for &seed in seeds {
        let r = prepare(opts, &engine, setup.engines, seed)?;
        eprintln!("{}", r.line(&name, setup.engines, engine.time_scale));
        calibration.push(r.json(&name));
        for policy in policies {
            let group = format!("{policy}@{name}");
            let specs = scenarios(&group, policy, Flavor::Sglang, replicas);
            push_scenarios(&mut plan, cli, specs, &r.schedule);
        }
        replays.push(r);
    }
    Ok((plan, calibration, replays))
}

/// One line per non-oracle scenario with its pooled p99 ratio to the oracle.
fn pooled_lines(results: &[ScenarioResult]) -> Vec<String> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in results.iter().filter(|r| r.label != "oracle") {
        let key = (r.group.as_str(), r.label.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .filter_map(|(group, label)| {
            let p = pooled_ratio(results, (group, label), (group, "oracle"), 42)?;
            Some(format!(
                "- {group}/{label}: pooled p99 × oracle {:.2} (90 % {:.2}–{:.2}, {} seeds)",
                p.ratio, p.low, p.high, p.seeds
            ))
        })
        .collect()
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::GenTrace(g)) => gen_trace(g),
        None => run(cli).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fleet-bench: {err}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let replicas = usize::from(cli.replicas.unwrap_or(if cli.quick { 2 } else { 4 }));
    let engines = usize::from(cli.engines.unwrap_or(if cli.quick { 4 } else { 8 }));
    let duration =
        Duration::from_secs(cli.duration_secs.unwrap_or(if cli.quick { 12 } else { 60 }));
    let time_scale = cli.time_scale.unwrap_or(if cli.quick { 4.0 } else { 2.0 });
    if !(time_scale.is_finite() && (0.1..=50.0).contains(&time_scale)) {
        return Err(format!(
            "--time-scale must be in 0.1..=50 (got {time_scale})"
        ));
    }
    if !(0.05..=2.0).contains(&cli.load) {
        return Err(format!("--load must be in 0.05..=2 (got {})", cli.load));
    }
    if let Some(bad) = cli
        .only
        .iter()
        .find(|l| !["oracle", "no-mesh", "mesh", "mesh-1"].contains(&l.as_str()))
    {
        return Err(format!(
            "--only: unknown scenario {bad:?} (oracle, no-mesh, mesh, mesh-1)"
        ));
    }
    let trace = trace_options(&cli, duration)?;
    let default = if trace.is_some() {
        DEFAULT_TRACE_POLICIES
    } else {
        DEFAULT_POLICIES
    };
    let policies: Vec<String> = if cli.policies.is_empty() {
        default.split(',').map(String::from).collect()
    } else {
        cli.policies.clone()
    };
    // Both parsed before any engine starts, so a typo fails at once.
    let (choices, trace_policies) = match &trace {
        Some(_) => (Vec::new(), parse_trace_policies(&policies)?),
        None => (parse_choices(&policies)?, Vec::new()),
    };
    let seeds = seeds(cli.seed, usize::from(cli.seeds));
    let routes_on_events = trace_policies.contains(&EVENT_POLICY)
        || choices.iter().any(|c| c.policy() == EVENT_POLICY);
    let kv_events = if routes_on_events {
        let path = cli.kv_tokenizer.clone().unwrap_or_else(fixture_tokenizer);
        let kv = KvEventsSetup::new(&path)?;
        eprintln!(
            "KV events: every engine tokenizes with {} ({:.2} tokens per model token; \
             token-block cache sized to hold the same text) and publishes vLLM events over ZMQ",
            path.display(),
            kv.tokens_per_model_token
        );
        Some(kv)
    } else {
        None
    };
    let shoal_bin = locate_shoal(cli.shoal_bin.as_deref()).map_err(|e| e.0)?;
    let engine = EngineConfig {
        flavor: Flavor::Sglang,
        time_scale,
        tokens_per_chunk: cli.tokens_per_chunk.max(1),
        stats_capacity: 100_000,
        prefix_cache_tokens: cli
            .engine_cache_tokens
            .unwrap_or(EngineConfig::default().prefix_cache_tokens),
        ..EngineConfig::default()
    };
    let setup = BenchSetup {
        shoal_bin,
        engine: engine.clone(),
        engines,
        poll_interval_model_ms: cli.poll_interval_ms.max(1.0),
        mesh_sync_model_ms: cli.mesh_sync_ms.max(1.0),
        mesh_push_gap_model_ms: cli.mesh_push_gap_ms.clamp(1.0, cli.mesh_sync_ms.max(1.0)),
        extra_args: vec!["--request-timeout-secs".into(), "120".into()],
        load: LoadOptions {
            request_timeout: Duration::from_secs(90),
            drain_timeout: Duration::from_secs(if cli.quick { 20 } else { 45 }),
            max_inflight: 4_000,
            sample_every: Duration::from_millis(100),
            kv_high: 0.95,
        },
        kv_events,
        disagg: cli.disagg.clone().map(|protocol| DisaggSetup {
            protocol,
            prefill_engines: cli.prefill_engines,
        }),
    };
    if let Some(pd) = &setup.disagg {
        pd.validate(engines)?;
    }
    let (plan, calibration, replays) = match &trace {
        Some(opts) => trace_plan(&cli, &setup, opts, &trace_policies, replicas, &seeds)?,
        None => {
            let (plan, calibration) =
                workload_plan(&cli, &setup, &choices, (replicas, duration), &seeds)?;
            (plan, calibration, Vec::new())
        }
    };
    let total: u64 = plan.iter().map(|(_, s)| s.arrivals.len() as u64).sum();
    let pb = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} requests  {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    let wall = Instant::now();
    let several = seeds.len() > 1;
    let mut results: Vec<ScenarioResult> = Vec::new();
    for (spec, schedule) in &plan {
        let seed = if several {
            format!(", seed {}", schedule.seed)
        } else {
            String::new()
        };
        pb.set_message(format!(
            "{}/{} (R={}, {} requests{seed})",
            spec.group,
            spec.label,
            spec.replicas,
            schedule.arrivals.len()
        ));
        let r = run_scenario(&setup, spec, schedule, &pb).await?;
        let line = format!(
            "  {}{seed}: {} done, {} errors, TTFT p99 {:.0} ms, queue p99 {:.0} ms, CPU cores replicas {} / engines+gen {}",
            r.name,
            r.completed,
            r.errors + r.timeouts + r.dropped,
            r.ttft_p99_ms,
            r.queue_p99_ms,
            opt(r.cpu.replicas_cores, 2),
            opt(r.cpu.engines_cores, 2)
        );
        if pb.is_hidden() {
            eprintln!("{line}");
        } else {
            pb.println(line);
        }
        results.push(r);
    }
    pb.finish_and_clear();
    let took = wall.elapsed().as_secs_f64();
    let seed_text = match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if several => format!("seeds {a}..={b}"),
        _ => format!("seed {}", cli.seed),
    };
    let offered = match &trace {
        None => format!("load {:.0}% of capacity", 100.0 * cli.load),
        Some(t) => {
            let timing = match t.timing {
                Timing::Load(l) => format!("load {:.0}% of capacity", 100.0 * l),
                Timing::TimeScale(f) => format!("timestamps x{f} of model time"),
            };
            format!(
                "trace {} (lengths x{}), {timing}",
                t.source.name(),
                t.length_scale
            )
        }
    };
    let offered = match &setup.disagg {
        Some(pd) => format!(
            "{offered}, disaggregated ({}: {} prefill + {} decode engines)",
            pd.protocol,
            pd.prefill_engines,
            engines - pd.prefill_engines
        ),
        None => offered,
    };
    let title = format!(
        "Shoal fleet-bench: R={replicas}, E={engines}, time scale {time_scale}, {offered}, {seed_text} ({} cores, shared)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("{title}\n");
    for &seed in &seeds {
        let of_seed: Vec<ScenarioResult> =
            results.iter().filter(|r| r.seed == seed).cloned().collect();
        if several {
            if Some(&seed) != seeds.first() {
                println!();
            }
            println!("Seed {seed}:\n");
        }
        print!("{}", markdown_table(&of_seed));
        if let Some(r) = replays.iter().find(|r| r.seed == seed) {
            println!(
                "\nTrace replay: cache hit = cached / prompt tokens over the fleet; of ideal = that \
                 over the {:.0}% an unbounded fleet-wide cache would hit; engine shares = each \
                 engine's share of the finished requests.\n",
                100.0 * r.ideal_hit
            );
            print!("{}", trace_table(&of_seed, r.ideal_hit));
        }
    }
    println!(
        "\nLatencies in wall ms (x{time_scale} for model time); load polls every {} ms, mesh sync {} ms, \
         push gap {} ms (wall); CPU columns are cores used during the load. Took {took:.0} s.",
        setup.wall_ms(setup.poll_interval_model_ms),
        setup.wall_ms(setup.mesh_sync_model_ms),
        setup.wall_ms(setup.mesh_push_gap_model_ms)
    );
    let summary = summarize_seeds(&results);
    let goals = goals(&results);
    println!(
        "\nSummary over {} seed(s) ({seed_text}): medians and min–max; p99 × oracle divides by the same seed's oracle.\n",
        seeds.len()
    );
    print!("{}", summary_table(&summary));
    if several {
        let pooled = pooled_lines(&results);
        if !pooled.is_empty() {
            println!(
                "\nPooled over seeds: each scenario's p99 TTFT over every request of every seed, \
                 divided by the oracle's; 90 % interval from 2,000 resamples of the seeds.\n"
            );
            for line in pooled {
                println!("{line}");
            }
        }
    }
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    let json_path = cli.out.join("fleet-bench.json");
    let doc = json!({
        "title": title, "replicas": replicas, "engines": engines, "time_scale": time_scale,
        "load": cli.load, "seed": cli.seed, "seeds": seeds, "duration_secs": duration.as_secs(),
        "poll_interval_wall_ms": setup.wall_ms(setup.poll_interval_model_ms),
        "mesh_sync_wall_ms": setup.wall_ms(setup.mesh_sync_model_ms),
        "mesh_push_gap_wall_ms": setup.wall_ms(setup.mesh_push_gap_model_ms),
        "cpu_clock_ticks_per_sec": clock_ticks_per_sec(),
        "calibration": calibration, "wall_secs": took, "scenarios": results,
        "summary": summary, "goals": goals,
        "trace": trace.as_ref().map(|t| json!({"source": t.source.name(),
            "length_scale": t.length_scale, "limit": t.limit, "timing": match t.timing {
                Timing::Load(l) => json!({"load": l}),
                Timing::TimeScale(f) => json!({"time_scale": f}),
            }})),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text).map_err(|e| format!("{}: {e}", json_path.display()))?;
    println!("\nJSON: {}", json_path.display());
    // The PNG shows one seed's scenarios (the first); the JSON has them all.
    let first: Vec<ScenarioResult> = results
        .iter()
        .filter(|r| Some(&r.seed) == seeds.first())
        .cloned()
        .collect();
    let png = cli.out.join("fleet-bench.png");
    let png_title = if several {
        format!("{title}, seed {} shown", cli.seed)
    } else {
        title.clone()
    };
    match plot::register_font(cli.font.as_deref())
        .and_then(|()| plot::draw(&png, &png_title, &first))
    {
        Ok(()) => println!("PNG:  {}", png.display()),
        Err(e) => eprintln!("fleet-bench: no PNG: {e}"),
    }
    for line in goal_lines(&goals, &results) {
        println!("{line}");
    }
    let label = |r: &ScenarioResult| {
        if several {
            format!("{} (seed {})", r.name, r.seed)
        } else {
            r.name.clone()
        }
    };
    let bad: Vec<String> = results
        .iter()
        .filter(|r| r.completed == 0 || r.errors + r.timeouts + r.dropped > 0)
        .map(label)
        .collect();
    if bad.is_empty() {
        println!("sanity: ok (every scenario completed requests, no errors)");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("sanity: FAILED for {bad:?}");
        for r in &results {
            for e in &r.error_samples {
                println!("  {}: {e}", label(r));
            }
        }
        Ok(if cli.quick {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}
