//! `tenant-bench`: does a tenant limited to L output tokens per window get
//! L fleet-wide (0.95 L to 1.05 L) whatever the number of replicas R and
//! however its traffic lands on them? Real `shoal` replicas (meshed, and
//! not meshed for the baseline) over in-process mock engines, one tenants
//! file, and for each R, traffic shape and mode one tenant offered twice
//! its allowance rate for one window (less a second, so nothing slides
//! out). Without the mesh each replica limits alone: with each replica
//! given L a tenant can get up to R × L; with L divided (L / R each) it
//! gets less than L when its traffic lands unevenly.
//!
//! The overshoot case (`--overshoot true`, the default) offers a
//! requests-limited tenant as fast as 16 clients can send through four
//! meshed replicas and compares what was admitted beyond the allowance
//! with the bound `docs/tenants.md` gives: (R − 1) × rate per replica ×
//! staleness, the staleness being the mesh's convergence lag p99 (the
//! push gap plus delivery) read from the replicas' `/mesh/status`.
//!
//! ```text
//! cargo build -p shoal && cargo run -p shoal-tests --bin tenant-bench
//! cargo run -p shoal-tests --bin tenant-bench -- --quick   # CI: ≤ 40 s
//! ```
//!
//! Exits 1 when a fleet cannot be started; with `--quick`, also when a
//! meshed case is outside [0.95 L, 1.05 L], a request is answered other
//! than 200 or 429, or the offer could not keep its pace.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{ArgAction, Parser};
use shoal_mesh::{DEFAULT_MAX_PUSH_RATE, DEFAULT_PUSH_MIN_GAP_MS};
use shoal_tests::bench::tenants::{
    OUTPUT_TPM, Offered, Rig, Spread, TOKENS_PER_REQUEST, TenantSpec, WINDOW_SECS, allowance,
    offer_paced, offer_unpaced,
};
use shoal_tests::fleet::locate_shoal;

/// Per-tenant limits across R replicas, meshed and not.
#[derive(Debug, Parser)]
#[command(name = "tenant-bench")]
struct Cli {
    /// Replica counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    replicas: Vec<usize>,
    /// Seed of the replica choices (each case derives its own from it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CI sanity: R = 1 and 2, even spread only, no overshoot case; exits
    /// non-zero when a meshed case misses the goal or a request fails.
    #[arg(long)]
    quick: bool,
    /// Run the overshoot case (meshed R = 4, unpaced clients).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    overshoot: bool,
    /// The offer, as a multiple of the allowance rate.
    #[arg(long, default_value_t = 2.0)]
    offer_times: f64,
    /// Mock engines behind every fleet.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Model seconds per wall second of the mock engines (fast, so
    /// requests finish well within the window).
    #[arg(long, default_value_t = 20.0)]
    time_scale: f64,
    /// Concurrent clients of the overshoot case.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// `requests_per_minute` of the overshoot case's tenant (600 per 6 s
    /// window by default).
    #[arg(long, default_value_t = 6_000)]
    overshoot_rpm: u64,
    /// The shoal binary [default: next to this one, or $SHOAL_BIN].
    #[arg(long)]
    shoal_bin: Option<PathBuf>,
}

/// How the replicas of a case limit the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Meshed: the allowance L once fleet-wide (the feature).
    Meshed,
    /// No mesh, L on each replica: up to R × L fleet-wide.
    Alone,
    /// No mesh, L / R on each replica: at most L, less when uneven.
    Divided,
}

impl Mode {
    /// The table's name for it.
    fn label(self) -> &'static str {
        match self {
            Mode::Meshed => "meshed",
            Mode::Alone => "no mesh, L each",
            Mode::Divided => "no mesh, L/R each",
        }
    }

    /// Part of the tenant's name.
    fn tag(self) -> &'static str {
        match self {
            Mode::Meshed => "mesh",
            Mode::Alone => "alone",
            Mode::Divided => "div",
        }
    }
}

/// One measured case: a row of the table.
struct Row {
    replicas: usize,
    spread: Spread,
    mode: Mode,
    got: Offered,
}

impl Row {
    /// Admitted output tokens.
    fn admitted_tokens(&self) -> u64 {
        self.got.admitted as u64 * TOKENS_PER_REQUEST
    }

    /// Admitted tokens over the allowance L.
    fn ratio(&self) -> f64 {
        self.admitted_tokens() as f64 / allowance(OUTPUT_TPM, WINDOW_SECS) as f64
    }

    /// Whether the offer kept its pace within the window: figures of an
    /// offer that ran past it include usage that slid out.
    fn paced(&self) -> bool {
        self.got.last_sent < Duration::from_secs(WINDOW_SECS)
    }

    /// For meshed rows, whether 0.95 ≤ admitted / L ≤ 1.05.
    fn goal_met(&self) -> Option<bool> {
        (self.mode == Mode::Meshed).then(|| (0.95..=1.05).contains(&self.ratio()))
    }

    /// The row as printed.
    fn line(&self) -> String {
        let per: Vec<String> = self
            .got
            .per_replica
            .iter()
            .map(|(_, a)| (*a as u64 * TOKENS_PER_REQUEST).to_string())
            .collect();
        let goal = match self.goal_met() {
            Some(true) => "0.95 ≤ x ≤ 1.05: met",
            Some(false) => "0.95 ≤ x ≤ 1.05: NOT MET",
            None => "",
        };
        format!(
            "{:>2}  {:<6} {:<18} {:>7} {:>8} {:>6.3}  {:<24} {:>5} {:>5}  {}{}",
            self.replicas,
            self.spread.label(),
            self.mode.label(),
            self.got.offered as u64 * TOKENS_PER_REQUEST,
            self.admitted_tokens(),
            self.ratio(),
            per.join(" "),
            self.got.refused_total(),
            self.got.failed,
            goal,
            if self.paced() { "" } else { " (pace slipped)" }
        )
    }
}

/// The tenant of one case: a fresh name per (R, spread, mode).
fn case_tenant(replicas: usize, spread: Spread, mode: Mode) -> TenantSpec {
    let shape = if spread == Spread::Even {
        "even"
    } else {
        "skew"
    };
    let name = format!("r{replicas}-{shape}-{}", mode.tag());
    let per_minute = match mode {
        Mode::Divided => OUTPUT_TPM / replicas as u64,
        Mode::Meshed | Mode::Alone => OUTPUT_TPM,
    };
    TenantSpec::output_tokens(&name, per_minute)
}

/// Offers one case's tenant at `times` × its fleet allowance rate for a
/// window less a second.
async fn run_case(rig: &Rig, case: (usize, Spread, Mode), times: f64, seed: u64) -> Row {
    let (replicas, spread, mode) = case;
    let tenant = case_tenant(replicas, spread, mode);
    let limit = allowance(OUTPUT_TPM, WINDOW_SECS);
    let rate = times * (limit / TOKENS_PER_REQUEST) as f64 / WINDOW_SECS as f64;
    let span = Duration::from_secs(WINDOW_SECS - 1);
    let got = offer_paced(
        rig,
        &tenant.key(),
        (rate, span),
        spread,
        seed,
        TOKENS_PER_REQUEST,
    )
    .await;
    let row = Row {
        replicas,
        spread,
        mode,
        got,
    };
    println!("{}", row.line().trim_end());
    for f in &row.got.failures {
        println!("      failure: {f}");
    }
    row
}

/// What the overshoot case measured.
struct Overshoot {
    clients: usize,
    allowance: u64,
    got: Offered,
    replicas: usize,
    gap: Duration,
    gap_source: String,
}

/// Offers the overshoot tenant unpaced through `rig` (meshed) for a
/// window less a second, and reads how stale peers' admissions arrive.
async fn run_overshoot(rig: &Rig, cli: &Cli) -> Overshoot {
    let tenant = TenantSpec::requests("burst", cli.overshoot_rpm);
    let span = Duration::from_secs(WINDOW_SECS - 1);
    let got = offer_unpaced(rig, &tenant.key(), cli.clients, span, cli.seed, 1).await;
    let replicas = rig.fleet.len();
    let (gap, gap_source) = match rig.staleness_p99().await {
        Some(lag) => (
            lag,
            "the mesh's convergence lag p99 (push gap + delivery), the largest any \
             replica's /mesh/status reports"
                .to_string(),
        ),
        None => {
            let min_gap = Duration::from_millis(DEFAULT_PUSH_MIN_GAP_MS);
            let links = replicas.saturating_sub(1) as f64;
            let spread = Duration::from_secs_f64(links / f64::from(DEFAULT_MAX_PUSH_RATE));
            (
                min_gap.max(spread),
                format!(
                    "no lag measured: the push gap alone, max({DEFAULT_PUSH_MIN_GAP_MS} ms \
                     min gap, {links} links / {DEFAULT_MAX_PUSH_RATE} pushes/s)"
                ),
            )
        }
    };
    Overshoot {
        clients: cli.clients,
        allowance: allowance(cli.overshoot_rpm, WINDOW_SECS),
        got,
        replicas,
        gap,
        gap_source,
    }
}

impl Overshoot {
    /// Prints the case; whether measured ≤ bound + 1.
    fn report(&self) -> bool {
        let g = &self.got;
        let r = self.replicas as f64;
        let over = g.admitted as i64 - self.allowance as i64;
        let whole_rate = g.offered as f64 / g.elapsed.as_secs_f64().max(1e-3) / r;
        let (phase_sent, phase) = g.admission_phase.unwrap_or((0, Duration::ZERO));
        let admit_rate = phase_sent as f64 / phase.as_secs_f64().max(1e-3) / r;
        let bound = (r - 1.0) * admit_rate * self.gap.as_secs_f64();
        let met = (over as f64) <= bound + 1.0;
        let per: Vec<String> = g.per_replica.iter().map(|(_, a)| a.to_string()).collect();
        println!(
            "overshoot: meshed R = {}, even, {} clients unpaced for {} s, allowance {} \
             requests per {WINDOW_SECS} s window",
            self.replicas,
            self.clients,
            WINDOW_SECS - 1,
            self.allowance
        );
        println!(
            "  offered {} requests in {:.2} s: admitted {} (per replica {}), 429s {}, other {}",
            g.offered,
            g.elapsed.as_secs_f64(),
            g.admitted,
            per.join(" "),
            g.refused_total(),
            g.failed
        );
        println!("  overshoot (admitted − allowance): {over:+}");
        println!(
            "  request rate per replica: {admit_rate:.0}/s while admitting ({phase_sent} sent \
             in the {:.3} s up to the last admitted one), {whole_rate:.0}/s over the whole offer",
            phase.as_secs_f64()
        );
        println!(
            "  staleness: {:.1} ms, {}",
            self.gap.as_secs_f64() * 1e3,
            self.gap_source
        );
        println!(
            "  bound (R − 1) × rate per replica × staleness = {} × {admit_rate:.0} × {:.4} = {bound:.2} \
             requests; measured ≤ bound + 1: {}",
            self.replicas - 1,
            self.gap.as_secs_f64(),
            if met { "yes" } else { "NO" }
        );
        for f in &g.failures {
            println!("  failure: {f}");
        }
        met
    }
}

/// The replica counts, spreads and modes of the run.
fn plan(cli: &Cli) -> (Vec<usize>, Vec<Spread>) {
    if cli.quick {
        (vec![1, 2], vec![Spread::Even])
    } else {
        (
            cli.replicas.clone(),
            vec![Spread::Even, Spread::Skewed(0.9)],
        )
    }
}

/// Runs every case, one fleet at a time; the rows and the overshoot
/// verdict (`None` when not run).
async fn run(cli: &Cli) -> Result<(Vec<Row>, Option<bool>), String> {
    let shoal = locate_shoal(cli.shoal_bin.as_deref()).map_err(|e| e.0)?;
    println!("shoal binary: {}", shoal.display());
    let (replica_counts, spreads) = plan(cli);
    if let Some(&bad) = replica_counts.iter().find(|&&r| r == 0 || r > 26) {
        return Err(format!("--replicas: {bad} is not in 1..=26"));
    }
    let limit = allowance(OUTPUT_TPM, WINDOW_SECS);
    println!(
        "tenants: window_secs = {WINDOW_SECS}, output_tokens_per_minute = {OUTPUT_TPM} \
         (L = {limit} output tokens per window), {TOKENS_PER_REQUEST} tokens per request, \
         offered at {} × the allowance rate for {} s; {} mock engines at time scale {}",
        cli.offer_times,
        WINDOW_SECS - 1,
        cli.engines,
        cli.time_scale
    );
    println!();
    println!(
        "{:>2}  {:<6} {:<18} {:>7} {:>8} {:>6}  {:<24} {:>5} {:>5}  goal (meshed)",
        "R",
        "spread",
        "mode",
        "offered",
        "admitted",
        "adm/L",
        "admitted per replica",
        "429s",
        "other"
    );
    let mut rows = Vec::new();
    let mut overshoot = None;
    let mut case_seed = cli.seed;
    for &r in &replica_counts {
        let want_overshoot = cli.overshoot && !cli.quick && r == 4;
        for mesh in [true, false] {
            let modes: Vec<Mode> = match (mesh, r > 1 && !cli.quick) {
                (true, _) => vec![Mode::Meshed],
                (false, true) => vec![Mode::Alone, Mode::Divided],
                (false, false) => vec![Mode::Alone],
            };
            let mut tenants: Vec<TenantSpec> = spreads
                .iter()
                .flat_map(|&s| modes.iter().map(move |&m| case_tenant(r, s, m)))
                .collect();
            if mesh && want_overshoot {
                tenants.push(TenantSpec::requests("burst", cli.overshoot_rpm));
            }
            let started = Instant::now();
            let rig = Rig::start(
                shoal.clone(),
                r,
                mesh,
                cli.engines,
                cli.time_scale,
                &tenants,
            )
            .await
            .map_err(|e| format!("R = {r}, mesh {mesh}: {e}"))?;
            eprintln!(
                "[R = {r}, {}: fleet up in {:.1} s]",
                if mesh { "meshed" } else { "no mesh" },
                started.elapsed().as_secs_f64()
            );
            for &spread in &spreads {
                for &mode in &modes {
                    case_seed += 1;
                    rows.push(run_case(&rig, (r, spread, mode), cli.offer_times, case_seed).await);
                }
            }
            if mesh && want_overshoot {
                overshoot = Some(run_overshoot(&rig, cli).await);
            }
            rig.stop().await;
        }
    }
    if cli.overshoot && !cli.quick && overshoot.is_none() {
        let rig = Rig::start(
            shoal.clone(),
            4,
            true,
            cli.engines,
            cli.time_scale,
            &[TenantSpec::requests("burst", cli.overshoot_rpm)],
        )
        .await
        .map_err(|e| format!("R = 4 for the overshoot case: {e}"))?;
        overshoot = Some(run_overshoot(&rig, cli).await);
        rig.stop().await;
    }
    println!();
    println!(
        "offered/admitted: output tokens; adm/L: admitted / {limit}. Per-replica limiting \
         caps the fleet at R × L (L each) or admits at most L (L/R each, less when uneven); \
         it can only show up to what was offered."
    );
    let verdict = overshoot.map(|o| {
        println!();
        o.report()
    });
    Ok((rows, verdict))
}

/// The command line as given, for the top of the output.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "\'\"$".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    println!("$ {}", command_line());
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tenant-bench: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let (rows, overshoot) = match runtime.block_on(run(&cli)) {
        Ok(out) => out,
        Err(e) => {
            eprintln!("tenant-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let meshed: Vec<&Row> = rows.iter().filter(|r| r.mode == Mode::Meshed).collect();
    let met = meshed.iter().filter(|r| r.goal_met() == Some(true)).count();
    let failed: usize = rows.iter().map(|r| r.got.failed).sum();
    let slipped = rows.iter().filter(|r| !r.paced()).count();
    println!();
    println!(
        "goal (meshed: 0.95 L ≤ admitted ≤ 1.05 L): met in {met} of {} cases; requests \
         answered other than 200/429: {failed}; offers that slipped their pace: {slipped}{}",
        meshed.len(),
        match overshoot {
            Some(true) => "; overshoot within bound + 1",
            Some(false) => "; overshoot OVER bound + 1",
            None => "",
        }
    );
    println!("took {:.1} s", started.elapsed().as_secs_f64());
    if cli.quick && (met < meshed.len() || failed > 0 || slipped > 0) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
