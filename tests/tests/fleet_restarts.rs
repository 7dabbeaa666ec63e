//! Replicas that come and go while engine load polling is on, with real
//! `shoal` processes meshed on loopback over in-process mock SGLang
//! engines: a restart (kill -9, same name, new incarnation), a rolling
//! replacement of every replica under new names, and a replica joining
//! late. Whatever incarnations came and went, once the fleet is quiet every
//! replica's `dispatched_since_poll` for every worker returns to about zero
//! (at most one request's token-work) within a few poll intervals, and
//! `least_load` keeps spreading over every worker.
//!
//! `dispatched_since_poll` is token-work routed to a worker since the
//! engine's freshest load snapshot; `least_load` scores
//! `(queued_tokens + dispatched_since_poll) / throughput`, so a value stuck
//! high makes every replica that sees it avoid that worker for good.
//!
//! See `fleet.rs` for how the `shoal` binary is found.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_support::{Setup, engines, run_for, start_with_spares, wait_for};
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::MeshStatus;
use shoal_tests::workload::{short_request, text};
use tokio::task::JoinSet;

/// Flags of every replica here (load polls every 300 ms).
const ARGS: [&str; 6] = [
    "--policy",
    "least_load",
    "--worker-load-source",
    "sglang",
    "--load-poll-interval-ms",
    "300",
];
/// Mock engines (all of them workers of every replica).
const ENGINES: usize = 4;
/// Each test's bound, start-up included.
const TEST_BOUND: Duration = Duration::from_secs(60);
/// How long a quiet fleet's views may take to settle (several poll
/// intervals on a slow machine); a value stuck for good fails after it.
const SETTLE: Duration = Duration::from_secs(10);
/// One request's bound.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// A request's shape: prompt characters and `max_tokens`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    chars: usize,
    max_tokens: u64,
}

impl Shape {
    /// The token-work the router books for it: ceil(chars / 4) prompt
    /// tokens plus `max_tokens` (the rule in `router/src/request.rs`).
    const fn work(self) -> u64 {
        (self.chars as u64).div_ceil(4) + self.max_tokens
    }
}

/// Heavy requests, to build up much dispatched work: 2,016 tokens each.
const HEAVY: Shape = Shape {
    chars: 8_000,
    max_tokens: 16,
};
/// Medium requests: 516 tokens each.
const MEDIUM: Shape = Shape {
    chars: 2_000,
    max_tokens: 16,
};
/// Light requests: 72 tokens each.
const LIGHT: Shape = Shape {
    chars: 160,
    max_tokens: 32,
};

/// The most token-work any one request of `shapes` books: what a quiet
/// fleet's `dispatched_since_poll` may still show (one booking racing a
/// poll), and no more.
fn one_request(shapes: &[Shape]) -> u64 {
    shapes.iter().map(|s| s.work()).max().unwrap_or(0)
}

/// Sends one non-streamed chat request of `shape` through `url`.
async fn send(client: &HttpClient, url: &str, shape: Shape, seed: u64) -> Result<(), String> {
    let prompt = text(seed, shape.chars);
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        short_request(client, url, &prompt, shape.max_tokens),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
    }
}

/// What a traffic lane did: requests that succeeded, and `(url, error)`
/// of those that failed.
type LaneResult = (u64, Vec<(String, String)>);

/// Starts `lanes` concurrent lanes of at most `per_lane` requests of
/// `shape` each, until `stop`; request `k` of lane `l` goes through the
/// `(k * lanes + l)`-th URL of `urls` (round-robin over a list the test may
/// change while they run).
fn spawn_traffic(
    client: &HttpClient,
    urls: &Arc<Mutex<Vec<String>>>,
    lanes: u64,
    per_lane: u64,
    shape: Shape,
    seed: u64,
    stop: &Arc<AtomicBool>,
) -> JoinSet<LaneResult> {
    let mut set = JoinSet::new();
    for lane in 0..lanes {
        let (client, urls, stop) = (client.clone(), urls.clone(), stop.clone());
        set.spawn(async move {
            let (mut ok, mut errors) = (0, Vec::new());
            for k in 0..per_lane {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let n = k * lanes + lane;
                let url = {
                    let urls = urls.lock().unwrap();
                    urls[(n % urls.len() as u64) as usize].clone()
                };
                match send(&client, &url, shape, seed + n).await {
                    Ok(()) => ok += 1,
                    Err(e) => errors.push((url, e)),
                }
            }
            (ok, errors)
        });
    }
    set
}

/// Waits for the lanes; returns the requests that succeeded and the
/// failures.
async fn join_traffic(mut set: JoinSet<LaneResult>) -> LaneResult {
    let (mut ok, mut errors) = (0, Vec::new());
    while let Some(lane) = set.join_next().await {
        let (n, e) = lane.unwrap();
        ok += n;
        errors.extend(e);
    }
    (ok, errors)
}

/// Sends `n` requests of `shape` over `lanes` lanes, round-robin over the
/// replicas `via`; every one must succeed.
async fn traffic(s: &Setup, via: &[usize], n: u64, lanes: u64, shape: Shape, seed: u64) {
    let urls: Vec<String> = via.iter().map(|&i| s.fleet.url(i)).collect();
    let urls = Arc::new(Mutex::new(urls));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let set = spawn_traffic(&s.client, &urls, lanes, n / lanes, shape, seed, &stop);
    let (ok, errors) = join_traffic(set).await;
    assert!(errors.is_empty(), "{} failed: {errors:#?}", errors.len());
    println!(
        "{ok} requests of {} tokens through {:?} in {:?}",
        shape.work(),
        via.iter().map(|&i| s.fleet.name(i)).collect::<Vec<_>>(),
        started.elapsed()
    );
}

/// Engine base URLs, in engine order.
fn engine_urls(s: &Setup) -> Vec<String> {
    s.engines.iter().map(|e| e.url()).collect()
}

/// One replica's view of every worker's `dispatched_since_poll`, with what
/// explains it (owner, poller, the old fleet total and mark, the newer
/// per-share values), one line per worker.
fn view_table(st: &MeshStatus) -> String {
    let mut out = format!("  {}#{}'s view:\n", st.node, st.generation);
    for w in &st.workers {
        let snap = w.snapshot.as_ref();
        let shares: Vec<String> = w
            .shares
            .iter()
            .filter_map(|sh| {
                sh.dispatched_since_poll
                    .map(|d| format!("{}={d}", sh.replica))
            })
            .collect();
        let _ = writeln!(
            out,
            "    {:<24} dispatched_since_poll {:>7}  owner {:<2} poller {:<2} pollers {:?} \
             shares [{}]",
            w.worker,
            w.dispatched_since_poll,
            w.owner.as_deref().unwrap_or("-"),
            snap.map_or("-", |s| s.poller.as_str()),
            w.pollers,
            shares.join(" ")
        );
    }
    out
}

/// What keeps replica `i`'s view from being settled: a missing status, a
/// missing worker or snapshot, or a `dispatched_since_poll` above `bound`.
async fn unsettled(
    s: &Setup,
    i: usize,
    urls: &[String],
    bound: u64,
) -> (Vec<String>, Option<MeshStatus>) {
    let name = s.fleet.name(i);
    let Some(st) = s.status(i).await else {
        return (vec![format!("{name}: no /mesh/status")], None);
    };
    let mut why = Vec::new();
    for url in urls {
        match st.worker(url) {
            None => why.push(format!("{name}: {url} missing from the view")),
            Some(w) if w.snapshot.is_none() => {
                why.push(format!("{name}: {url} has no snapshot (polling is on)"));
            }
            Some(w) if w.dispatched_since_poll > bound => why.push(format!(
                "{name}: {url} dispatched_since_poll {} > {bound}",
                w.dispatched_since_poll
            )),
            Some(_) => {}
        }
    }
    (why, Some(st))
}

/// Waits up to [`SETTLE`] until on every replica of
/// `live`, every worker has a snapshot and `dispatched_since_poll <= bound`;
/// panics with the last views otherwise. Prints the settled views, or the
/// first unsettled ones (then the last in the panic).
async fn assert_views_settle(s: &Setup, live: &[usize], bound: u64, what: &str) {
    let urls = engine_urls(s);
    let checking = Instant::now();
    let deadline = checking + SETTLE;
    let mut first = true;
    loop {
        let mut why = Vec::new();
        let mut tables = String::new();
        for &i in live {
            let (w, st) = unsettled(s, i, &urls, bound).await;
            why.extend(w);
            if let Some(st) = st {
                tables.push_str(&view_table(&st));
            }
        }
        if why.is_empty() {
            println!(
                "{what}: views settled {:?} after the traffic (bound {bound}):\n{tables}",
                checking.elapsed()
            );
            return;
        }
        if first {
            println!("{what}: views right after the traffic (bound {bound}):\n{tables}");
            first = false;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {SETTLE:?} after the traffic, dispatched_since_poll should be \
             at most one request's token-work ({bound}) on every replica for every worker:\n  \
             {}\n{tables}",
            why.join("\n  ")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Light requests per burst of [`assert_spreads`]: one per worker.
const BURST: usize = ENGINES;
/// Bursts each replica sends in [`assert_spreads`].
const BURSTS: usize = 3;

/// In a quiet fleet, each replica of `via` in turn sends [`BURSTS`] bursts
/// of [`BURST`] concurrent light requests, with a quiet gap of three poll
/// intervals after each burst; asserts that every replica reached every
/// engine with its requests ("traffic spreads over all workers as one
/// router would").
///
/// Why this is not flaky on a correct router: before each burst the fleet
/// is quiet, so every worker's `least_load` score is exactly 0 (nothing
/// queued, nothing dispatched since its last poll, no KV in use); each
/// booking lifts its worker's score above 0 (at least 72 tokens over a
/// throughput of at most 2,000 tokens/s), so the 4 requests of a burst
/// water-fill one per worker (a fresh fleet on the current code does
/// exactly that, burst after burst). Only two selections racing before
/// either is booked can double up, and a worker is missed only if that
/// happens against the same worker in all 3 of a replica's bursts. A
/// replica that sees thousands of tokens stuck on a worker (a score of
/// ~10 s, against a few seconds at most for a worker holding one light
/// request) routes none of its requests there.
async fn assert_spreads(s: &Setup, via: &[usize], what: &str) {
    let mut reached = vec![vec![0u64; ENGINES]; via.len()];
    let mut seed = 50_000;
    for _round in 0..BURSTS {
        for (row, &i) in reached.iter_mut().zip(via) {
            let before = s.accepted();
            let mut burst = JoinSet::new();
            for _ in 0..BURST {
                let (client, url) = (s.client.clone(), s.fleet.url(i));
                seed += 1;
                burst.spawn(async move { send(&client, &url, LIGHT, seed).await });
            }
            while let Some(res) = burst.join_next().await {
                res.unwrap()
                    .unwrap_or_else(|e| panic!("via {}: {e}", s.fleet.name(i)));
            }
            let after = s.accepted();
            for (e, n) in row.iter_mut().enumerate() {
                *n += after[e] - before[e];
            }
            wait_quiet(s, via, unix_ms()).await;
        }
    }
    let mut views = String::new();
    for &i in via {
        if let Some(st) = s.status(i).await {
            views.push_str(&view_table(&st));
        }
    }
    let names: Vec<&str> = via.iter().map(|&i| s.fleet.name(i)).collect();
    println!("{what}: requests per engine routed by {names:?}: {reached:?}\n{views}");
    for (row, name) in reached.iter().zip(&names) {
        assert!(
            row.iter().all(|&n| n > 0),
            "{what}: replica {name} routed its {} requests as {row:?} over the {ENGINES} \
             engines (replicas {names:?}: {reached:?}); views:\n{views}",
            BURST * BURSTS
        );
    }
}

/// Milliseconds since the Unix epoch (the clock snapshots are stamped in).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits until every replica of `via` sees, for every worker, a poll
/// taken after `after_unix_ms` and nothing in flight or dispatched since
/// it: every worker's `least_load` score is 0 again, the quiet fleet
/// [`assert_spreads`] needs before a burst (as soon as it holds, instead
/// of a fixed few poll intervals).
async fn wait_quiet(s: &Setup, via: &[usize], after_unix_ms: u64) {
    let urls = engine_urls(s);
    wait_for("a quiet fleet", SETTLE, async || {
        for &i in via {
            let st = s.status(i).await?;
            let quiet = urls.iter().all(|url| {
                st.worker(url).is_some_and(|w| {
                    w.inflight_requests == 0
                        && w.dispatched_since_poll == 0
                        && w.snapshot
                            .as_ref()
                            .is_some_and(|p| p.polled_at_unix_ms > after_unix_ms)
                })
            });
            if !quiet {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Index of the replica that polls the most workers. Ownership follows
/// from the names and the engines' URLs (random ports), so any one replica
/// may poll none of 4 workers (about 1 time in 5); the restart tests
/// restart this one, whose next incarnation then surely polls (and stamps
/// the snapshots of) some worker.
async fn busiest_poller(s: &Setup) -> usize {
    let urls = engine_urls(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    let owners = loop {
        let owners = s.status(0).await.and_then(|st| {
            urls.iter()
                .map(|u| {
                    let w = st.worker(u)?;
                    w.owner
                        .clone()
                        .or_else(|| w.snapshot.as_ref().map(|p| p.poller.clone()))
                })
                .collect::<Option<Vec<String>>>()
        });
        if let Some(owners) = owners {
            break owners;
        }
        if Instant::now() >= deadline {
            println!("no poll owners in a's view; restarting a");
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let polls = |i: usize| owners.iter().filter(|o| *o == s.fleet.name(i)).count();
    let r = (0..3)
        .max_by_key(|&i| (polls(i), std::cmp::Reverse(i)))
        .unwrap();
    println!(
        "poll owners {owners:?}: {} polls {} of {} workers",
        s.fleet.name(r),
        polls(r),
        urls.len()
    );
    r
}

/// Three meshed replicas over [`ENGINES`] engines, with certificates for
/// `spares` too.
async fn fleet(spares: &[&str], extra: &[&str]) -> Setup {
    let all: Vec<usize> = (0..ENGINES).collect();
    let args: Vec<&str> = ARGS.iter().chain(extra).copied().collect();
    start_with_spares(engines(ENGINES).await, &all, true, &args, spares).await
}

/// The restart prelude: 40 heavy requests (~80,000 tokens of dispatched
/// work) through the replica that polls the most workers; `kill -9` of it
/// and a restart under the same name (a new incarnation, which never
/// learns what the old one dispatched); wait until the mesh counts it
/// again; 8 light requests through another replica. Returns the setup and
/// the restarted replica's index.
async fn restarted_fleet() -> (Setup, usize) {
    let mut s = fleet(&[], &[]).await;
    let r = busiest_poller(&s).await;
    traffic(&s, &[r], 40, 4, HEAVY, 1_000).await;
    // Its dispatched work reaches the others' views (pushed every 20 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let gen1 = s.status(r).await.unwrap().generation;
    s.fleet.kill9(r).unwrap();
    s.fleet.restart(r).await.unwrap_or_else(|e| panic!("{e}"));
    let restarted = Instant::now();
    s.fleet
        .wait_meshed(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let gen2 = s.status(r).await.unwrap().generation;
    assert!(
        gen2 > gen1,
        "a restart is a new generation ({gen1} -> {gen2})"
    );
    println!(
        "{} restarted ({gen1} -> {gen2}), meshed again after {:?}",
        s.fleet.name(r),
        restarted.elapsed()
    );
    traffic(&s, &[(r + 1) % 3], 8, 2, LIGHT, 2_000).await;
    (s, r)
}

/// Scenario 1: one replica does much of the fleet's routing, is killed
/// with `kill -9` and restarts under the same name (a new incarnation);
/// after a little more traffic and a quiet period, every replica's
/// `dispatched_since_poll` is back to at most one request's token-work for
/// every worker, in particular for the workers the restarted replica polls
/// as seen by the replicas that were not restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_dispatched_since_poll_returns_to_zero_on_every_replica() {
    run_for(TEST_BOUND, async {
        let (s, r) = restarted_fleet().await;
        let what = format!("after {}'s restart", s.fleet.name(r));
        assert_views_settle(&s, &[0, 1, 2], one_request(&[HEAVY, LIGHT]), &what).await;
    })
    .await;
}

/// Scenario 4: after the restart of scenario 1, each replica still spreads
/// its requests over every worker, as one router would (see
/// [`assert_spreads`]). Today the replicas that were not restarted route
/// nothing to the workers the restarted one polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_least_load_still_spreads_over_every_worker() {
    run_for(TEST_BOUND, async {
        let (s, r) = restarted_fleet().await;
        wait_quiet(&s, &[0, 1, 2], unix_ms()).await;
        let what = format!("after {}'s restart", s.fleet.name(r));
        assert_spreads(&s, &[0, 1, 2], &what).await;
    })
    .await;
}

/// Scenario 2: all three replicas are replaced one at a time by replicas
/// under new names (d for a, e for b, f for c) while a background load
/// runs round-robin over the live replicas: each new replica starts and is
/// counted by the running ones, then the old one is killed (`kill -9` for a
/// and c, SIGTERM with a 1 s drain for b). Once the old ones have left and
/// the fleet is quiet, `dispatched_since_poll` on d, e and f is at most one
/// request's token-work for every worker, and each of them spreads its
/// requests over every worker ([`assert_spreads`]). Only requests in flight
/// through a replica killed with `kill -9` may fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_rolling_replacement_under_new_names_dispatched_since_poll_returns_to_zero() {
    run_for(TEST_BOUND, async {
        let mut s = fleet(&["d", "e", "f"], &["--drain-settle-secs", "1"]).await;
        let urls = Arc::new(Mutex::new((0..3).map(|i| s.fleet.url(i)).collect()));
        let stop = Arc::new(AtomicBool::new(false));
        let load = spawn_traffic(&s.client, &urls, 4, 100, MEDIUM, 10_000, &stop);
        let mut killed = Vec::new();
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (old, new, kill9) in [(0, "d", true), (1, "e", false), (2, "f", true)] {
            let t = Instant::now();
            let i = s
                .fleet
                .add_replica(new)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            s.fleet
                .wait_joined(Duration::from_secs(15))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let old_url = s.fleet.url(old);
            {
                let mut urls = urls.lock().unwrap();
                urls.push(s.fleet.url(i));
                urls.retain(|u| *u != old_url);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if kill9 {
                s.fleet.kill9(old).unwrap();
                killed.push(old_url);
            } else {
                s.fleet.sigterm(old).unwrap();
                let exit = s
                    .fleet
                    .wait_exit(old, Duration::from_secs(15))
                    .await
                    .unwrap();
                assert!(exit.success(), "b exited with {exit}\n{}", s.log(old));
            }
            println!(
                "{new} joined after {:?}; {} {}",
                t.elapsed(),
                s.fleet.name(old),
                if kill9 {
                    "killed (-9)"
                } else {
                    "drained and exited (SIGTERM)"
                }
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let (ok, errors) = join_traffic(load).await;
        println!(
            "{ok} requests of {} tokens succeeded during the replacement",
            MEDIUM.work()
        );
        let unexpected: Vec<_> = errors.iter().filter(|(u, _)| !killed.contains(u)).collect();
        assert!(unexpected.is_empty(), "requests failed: {unexpected:#?}");
        assert!(ok >= 40, "too little load: {ok} ({} failed)", errors.len());
        let t = Instant::now();
        s.fleet
            .wait_meshed(Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "only d, e and f counted {:?} after the traffic stopped",
            t.elapsed()
        );
        let live = s.fleet.running();
        assert_eq!(live, vec![3, 4, 5]);
        let what = "after the replacement";
        assert_views_settle(&s, &live, one_request(&[MEDIUM]), what).await;
        assert_spreads(&s, &live, what).await;
    })
    .await;
}

/// Scenario 3: after traffic through a, b and c, a fourth replica d joins
/// (seeded from the live ones) and routes a little; once the fleet is
/// quiet, `dispatched_since_poll` on all four is at most one request's
/// token-work for every worker, and each of the four spreads its requests
/// over every worker ([`assert_spreads`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_late_leaves_dispatched_since_poll_at_zero_everywhere() {
    run_for(TEST_BOUND, async {
        let mut s = fleet(&["d"], &[]).await;
        traffic(&s, &[0, 1, 2], 48, 4, MEDIUM, 20_000).await;
        let t = Instant::now();
        let d = s
            .fleet
            .add_replica("d")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.fleet
            .wait_meshed(Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        println!("d meshed {:?} after it was started", t.elapsed());
        traffic(&s, &[d], 4, 2, LIGHT, 21_000).await;
        let (live, what) = ([0, 1, 2, d], "after d joined");
        assert_views_settle(&s, &live, one_request(&[MEDIUM, LIGHT]), what).await;
        assert_spreads(&s, &live, what).await;
    })
    .await;
}
