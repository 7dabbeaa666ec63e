#![allow(clippy::unwrap_used, clippy::expect_used)]
//! How far one full mesh goes: R replicas × W workers, each replica its
//! own process running the real `shoal-mesh` code over real QUIC on
//! loopback, booking `--rate` requests per second on random workers
//! (book, first byte, release) while its poll owners publish a snapshot
//! of each owned worker every `--poll-ms`.
//!
//! Per configuration it reports, per replica: outbound load-plane bytes/s
//! (payload and UDP wire) and gossip bytes/s, mesh CPU (cores, and µs per
//! booking), RSS; the visibility lag p50/p99 (a booking at A until B's
//! fleet view shows it, matched on the wall clock every process shares);
//! and the time a SIGKILLed replica's load takes to leave every view.
//! Then it fits how bytes/s and CPU grow with R and writes the figures
//! (JSON) and a plot (SVG).
//!
//! Run: `cargo bench -p shoal-mesh --bench scale -- [--replicas 4,16,32,64]
//! [--workers 100,1000] [--rate 200] [--poll-ms 1000] [--secs 10]
//! [--warmup-secs 4] [--observers 8] [--sync-ms N] [--gap-ms N]
//! [--anti-entropy-ms N] [--whole-values] [--shared-runtime] [--out FILE.json]
//! [--plot FILE.svg]`;
//! `--whole-values` sends slot changes as whole values, as builds before
//! packed changes did (see `shoal_proto::slot_pack`); each node's mesh
//! runs on a thread of its own (`Mesh::start_on_own_thread`, as the router
//! runs it), or with `--shared-runtime` on the node's one-worker
//! multi-threaded runtime (as builds before it did, though those had a
//! thread for the change announcer); `--quick`
//! is the CI sanity run (4 replicas × 100 workers, 3 s; asserts every
//! probe was seen and the killed replica left every view).

#[path = "../../tests/common/mod.rs"]
mod common;
mod fleet;
mod load;
mod node;
mod probe;
mod report;
mod usage;

use node::Settings;

struct Args {
    replicas: Vec<usize>,
    workers: Vec<usize>,
    base: Settings,
    quick: bool,
    /// Fit and plot saved runs instead of running.
    refit: Vec<String>,
    out: Option<String>,
    plot: Option<String>,
}

fn list(v: &str, flag: &str) -> Vec<usize> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{flag}: {x:?} is not a count"))
        })
        .collect()
}

fn parse(mut it: impl Iterator<Item = String>) -> Args {
    let mut a = Args {
        replicas: vec![4, 16, 32, 64],
        workers: vec![100, 1000],
        base: Settings {
            replicas: 0,
            workers: 0,
            rate: 200,
            poll_ms: 1000,
            warmup_secs: 4.0,
            secs: 10.0,
            observers: 8,
            sync_ms: None,
            gap_ms: None,
            max_push_rate: None,
            anti_entropy_ms: None,
            whole_values: false,
            own_thread: true,
        },
        quick: false,
        refit: Vec::new(),
        out: None,
        plot: None,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let num = |v: String, flag: &str| -> u64 {
            v.parse()
                .unwrap_or_else(|_| panic!("{flag}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--replicas" => a.replicas = list(&value(), "--replicas"),
            "--workers" => a.workers = list(&value(), "--workers"),
            "--rate" => a.base.rate = num(value(), "--rate"),
            "--poll-ms" => a.base.poll_ms = num(value(), "--poll-ms").max(1),
            "--secs" => a.base.secs = num(value(), "--secs") as f64,
            "--warmup-secs" => a.base.warmup_secs = num(value(), "--warmup-secs") as f64,
            "--observers" => a.base.observers = num(value(), "--observers") as usize,
            "--sync-ms" => a.base.sync_ms = Some(num(value(), "--sync-ms")),
            "--gap-ms" => a.base.gap_ms = Some(num(value(), "--gap-ms")),
            "--max-push-rate" => {
                a.base.max_push_rate = Some(num(value(), "--max-push-rate") as u32)
            }
            "--anti-entropy-ms" => a.base.anti_entropy_ms = Some(num(value(), "--anti-entropy-ms")),
            "--whole-values" => a.base.whole_values = true,
            "--shared-runtime" => a.base.own_thread = false,
            "--out" => a.out = Some(value()),
            "--plot" => a.plot = Some(value()),
            "--quick" => a.quick = true,
            "--refit" => a.refit = value().split(',').map(str::to_string).collect(),
            // `cargo bench` passes --bench to every bench binary.
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    if a.quick {
        a.replicas = vec![4];
        a.workers = vec![100];
        a.base.secs = 3.0;
        a.base.warmup_secs = 2.0;
    }
    a
}

/// Prints the rows and growth laws of runs saved with `--out`, together
/// (runs at different rates or sizes fit one law), and plots them.
fn refit(args: &Args) {
    let mut outcomes: Vec<fleet::Outcome> = Vec::new();
    for path in &args.refit {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let runs: Vec<fleet::Outcome> =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        outcomes.extend(runs);
    }
    report::header();
    for o in &outcomes {
        report::row(o);
    }
    report::fits(&outcomes);
    if let Some(path) = &args.plot {
        std::fs::write(path, report::svg(&outcomes)).expect("write --plot");
    }
}

fn main() {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("--node") {
        let spec = argv.nth(1).expect("--node <spec json>");
        node::main(serde_json::from_str(&spec).expect("node spec"));
        return;
    }
    let args = parse(argv);
    if !args.refit.is_empty() {
        refit(&args);
        return;
    }
    println!(
        "mesh scale: {} bookings/s per replica, a snapshot per owned worker every {} ms, {} s windows, one process per replica, slot changes {}, mesh on {}",
        args.base.rate,
        args.base.poll_ms,
        args.base.secs,
        if args.base.whole_values {
            "as whole values"
        } else {
            "packed"
        },
        if args.base.own_thread {
            "its own thread"
        } else {
            "the node's shared runtime"
        }
    );
    report::header();
    let mut outcomes = Vec::new();
    for &w in &args.workers {
        for &r in &args.replicas {
            let mut s = args.base.clone();
            s.replicas = r.max(2);
            s.workers = w;
            let o = fleet::run(&s);
            report::row(&o);
            outcomes.push(o);
        }
    }
    report::fits(&outcomes);
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&outcomes).expect("json"))
            .expect("write --out");
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, report::svg(&outcomes)).expect("write --plot");
    }
    if args.quick {
        let o = &outcomes[0];
        assert!(o.lag_samples > 0, "no probe was observed");
        assert_eq!(o.lag_lost, 0, "a probe never became visible");
        assert!(o.removal_secs.is_some(), "the killed replica's load stayed");
        assert!(o.payload_bytes_per_sec > 0.0, "nothing was sent");
    }
}
