//! The scale harness's output: a table row per configuration, the fitted
//! growth with R, and an SVG plot of bytes/s and lag against R.

use std::fmt::Write;

use crate::fleet::Outcome;
use shoal_mesh::DEFAULT_MAX_PUSH_RATE;

pub fn header() {
    println!(
        "{:>4} {:>5} {:>5} | {:>9} {:>9} {:>8} {:>7} | {:>6} {:>7} {:>5} | {:>6} | {:>6} {:>6} {:>6} {:>5} | {:>6} {:>6} | {:>5}",
        "R",
        "W",
        "rate",
        "payload",
        "wire",
        "gossip",
        "frames",
        "cores",
        "µs/book",
        "busy",
        "RSS",
        "lag50",
        "lag99",
        "all99",
        "lost",
        "dead",
        "member",
        "form"
    );
    println!(
        "{:>4} {:>5} {:>5} | {:>9} {:>9} {:>8} {:>7} | {:>6} {:>7} {:>5} | {:>6} | {:>6} {:>6} {:>6} {:>5} | {:>6} {:>6} | {:>5}",
        "",
        "",
        "/s",
        "KB/s",
        "KB/s",
        "KB/s",
        "/s",
        "",
        "",
        "",
        "MiB",
        "ms",
        "ms",
        "ms",
        "",
        "s",
        "s",
        "s"
    );
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |s| format!("{s:.2}"))
}

pub fn row(o: &Outcome) {
    println!(
        "{:>4} {:>5} {:>5} | {:>9.1} {:>9.1} {:>8.1} {:>7.0} | {:>6.3} {:>7.1} {:>5.2} | {:>6.1} | {:>6.1} {:>6.1} {:>6.1} {:>5} | {:>6} {:>6} | {:>5.1}",
        o.replicas,
        o.workers,
        o.rate,
        o.payload_bytes_per_sec / 1e3,
        o.wire_bytes_per_sec / 1e3,
        o.gossip_bytes_per_sec / 1e3,
        o.frames_per_sec,
        o.cpu_cores_per_replica,
        o.cpu_us_per_booking,
        o.machine_busy,
        o.rss_mesh_mib_per_replica,
        o.lag_p50_ms,
        o.lag_p99_ms,
        o.lag_all_p99_ms,
        o.lag_lost,
        opt(o.removal_secs),
        opt(o.removal_members_secs),
        o.formation_secs,
    );
}

/// Reads one figure of a run.
type Field = fn(&Outcome) -> f64;

/// Least squares of `y ≈ Σ cᵢ·xᵢ` over `rows` of `(x, y)`, by the normal
/// equations and Gaussian elimination; `None` when there are fewer points
/// than terms or the points do not tell the terms apart.
fn least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> Option<[f64; N]> {
    if rows.len() < N {
        return None;
    }
    let mut m = [[0.0f64; N]; N];
    let mut v = [0.0f64; N];
    for (x, y) in rows {
        for ((mrow, vi), xi) in m.iter_mut().zip(v.iter_mut()).zip(x) {
            *vi += xi * y;
            for (mij, xj) in mrow.iter_mut().zip(x) {
                *mij += xi * xj;
            }
        }
    }
    for col in 0..N {
        let pivot = (col..N).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col] == 0.0 || m[pivot][col].abs() < 1e-12 * m[col][col].abs() {
            return None;
        }
        m.swap(col, pivot);
        v.swap(col, pivot);
        let (prow, pv) = (m[col], v[col]);
        for (row, (mrow, vrow)) in m.iter_mut().zip(v.iter_mut()).enumerate() {
            if row != col {
                let f = mrow[col] / prow[col];
                for (x, p) in mrow.iter_mut().zip(prow.iter()) {
                    *x -= f * p;
                }
                *vrow -= f * pv;
            }
        }
    }
    let mut c = [0.0; N];
    for ((ci, vi), (i, mrow)) in c.iter_mut().zip(v).zip(m.iter().enumerate()) {
        *ci = vi / mrow[i];
    }
    Some(c)
}

/// A run the machine could carry: no probe lost and visibility p99 under
/// 250 ms. Runs past that measure this 2-core box, not the mesh, and are
/// left out of the fits.
fn unsaturated(o: &Outcome) -> bool {
    o.lag_lost == 0 && o.lag_p99_ms < 250.0
}

/// Growth laws fitted over every unsaturated run. Per link, a replica
/// sends its changes (∝ its booking rate; how many coalesce depends on W)
/// plus the snapshots of the workers it polls (W/R of them, each once per
/// poll interval poll_s) plus a constant per link (refreshes: W entries
/// per anti-entropy interval); per replica that is (R−1) times as much. Its CPU
/// goes mostly to packets (frames sent, and as many received; the push gap
/// caps them at `max_push_rate`) plus the changes it merges ((R−1) × rate).
pub fn fits(outcomes: &[Outcome]) {
    let used: Vec<&Outcome> = outcomes.iter().filter(|o| unsaturated(o)).collect();
    println!(
        "fits over {} of {} runs (left out: probes lost or visibility p99 ≥ 250 ms)",
        used.len(),
        outcomes.len()
    );
    let mut ws: Vec<usize> = used.iter().map(|o| o.workers).collect();
    ws.sort_unstable();
    ws.dedup();
    let bytes: [(&str, Field); 2] = [
        ("payload", |o| o.payload_bytes_per_sec),
        ("wire", |o| o.wire_bytes_per_sec),
    ];
    for w in ws {
        for (name, field) in bytes {
            // Per run: its bookings/s, snapshots polled per s, frames per
            // link per s, and the bytes per link per s.
            let runs: Vec<[f64; 4]> = used
                .iter()
                .filter(|o| o.workers == w)
                .map(|o| {
                    let links = (o.replicas - 1) as f64;
                    let polls = w as f64 / o.replicas as f64 * 1000.0 / o.poll_ms.max(1) as f64;
                    [
                        o.rate as f64,
                        polls,
                        o.frames_per_sec / links,
                        field(o) / links,
                    ]
                })
                .collect();
            let pts: Vec<([f64; 3], f64)> = runs
                .iter()
                .map(|&[rate, polls, _, bytes]| ([rate, polls, 1.0], bytes))
                .collect();
            if let Some([per_booking, per_poll, per_link]) = least_squares(&pts) {
                let at = |r: f64, rate: f64| {
                    (r - 1.0) * (per_booking * rate + per_poll * w as f64 / r + per_link) / 1e6
                };
                println!(
                    "  W={w}: {name} bytes/s per replica ≈ (R−1) × ({per_booking:.1} B × rate + {per_poll:.1} B × W/R/poll_s + {per_link:.0} B/s)  \
                     → R=64, 200/s, 1 s polls: {:.2} MB/s",
                    at(64.0, 200.0)
                );
            }
            // The same with the frames each link carries as a term of its
            // own: a frame's header (and, on the wire, its packet's) is
            // paid per push, and the push gap caps pushes per link at
            // max_push_rate / (R−1) — which the law above, fitted where
            // the gap is its 4 ms floor, charges to every booking instead.
            let pts: Vec<([f64; 4], f64)> = runs
                .iter()
                .map(|&[rate, polls, frames, bytes]| ([rate, polls, frames, 1.0], bytes))
                .collect();
            if let Some([per_booking, per_poll, per_frame, per_link]) = least_squares(&pts) {
                let frames_at_64 = f64::from(DEFAULT_MAX_PUSH_RATE) / 63.0;
                let at = (per_booking * 200.0
                    + per_poll * w as f64 / 64.0
                    + per_frame * frames_at_64
                    + per_link)
                    * 63.0
                    / 1e6;
                println!(
                    "  W={w}: {name} bytes/s per link ≈ {per_booking:.1} B × rate + {per_poll:.1} B × W/R/poll_s + {per_frame:.1} B × frames/s + {per_link:.0} B/s  \
                     → R=64, 200/s, 1 s polls, {frames_at_64:.1} frames/s a link (the push gap's cap): {at:.2} MB/s"
                );
            }
        }
    }
    let per_frame: Vec<f64> = used
        .iter()
        .filter(|o| o.machine_busy < 0.95 && o.frames_per_sec > 0.0)
        .map(|o| o.cpu_cores_per_replica * 1e6 / o.frames_per_sec)
        .collect();
    if !per_frame.is_empty() {
        let mean = per_frame.iter().sum::<f64>() / per_frame.len() as f64;
        let (lo, hi) = per_frame
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        // The push gap caps frames at max_push_rate (2000/s by default).
        println!(
            "  mesh CPU per replica ≈ {mean:.0} µs (runs: {lo:.0}–{hi:.0}) × frames sent/s, \
             frames/s = min(changes/s, 1/gap) × (R−1) ≤ max_push_rate  → at 2000 frames/s: {:.2} cores",
            mean * 2000.0 / 1e6
        );
    }
}

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 280.0;
const MARGIN: f64 = 60.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One panel: `series` (label, points) on linear axes from 0.
fn panel(svg: &mut String, x0: f64, title: &str, unit: &str, series: &[(String, Vec<(f64, f64)>)]) {
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(1e-9, f64::max)
        * 1.1;
    let px = |x: f64| x0 + MARGIN + x / xmax * (PANEL_W - MARGIN - 10.0);
    let py = |y: f64| 30.0 + PANEL_H - y / ymax * PANEL_H;
    let _ = write!(
        svg,
        r#"<text x="{}" y="18" font-size="13" text-anchor="middle">{title}</text>"#,
        x0 + PANEL_W / 2.0
    );
    let _ = write!(
        svg,
        r#"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="30" x2="{0}" y2="{1}" stroke="black"/>"#,
        px(0.0),
        py(0.0),
        px(xmax)
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.0}</text>"#,
            px(0.0) - 4.0,
            py(y) + 3.0,
            y
        );
    }
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="middle">{x:.0}</text>"#,
            px(x),
            py(0.0) + 14.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">replicas (R)</text><text x="{}" y="{}" font-size="11" transform="rotate(-90 {} {})" text-anchor="middle">{unit}</text>"#,
        px(xmax / 2.0),
        py(0.0) + 30.0,
        x0 + 14.0,
        30.0 + PANEL_H / 2.0,
        x0 + 14.0,
        30.0 + PANEL_H / 2.0
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(svg, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" font-size="11" fill="{color}">{label}</text>"#,
            px(0.0) + 10.0,
            45.0 + 14.0 * i as f64
        );
    }
}

/// Two panels: wire KB/s per replica against R, and lag p99 against R,
/// one line per worker count (and the 1 MB/s and 100 ms goals).
pub fn svg(outcomes: &[Outcome]) -> String {
    let mut groups: Vec<(usize, u64)> = outcomes.iter().map(|o| (o.workers, o.rate)).collect();
    groups.sort_unstable();
    groups.dedup();
    let series = |f: fn(&Outcome) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        groups
            .iter()
            .map(|&(w, rate)| {
                (
                    format!("W = {w}, {rate} bookings/s"),
                    outcomes
                        .iter()
                        .filter(|o| o.workers == w && o.rate == rate)
                        .map(|o| (o.replicas as f64, f(o)))
                        .collect(),
                )
            })
            .collect()
    };
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#,
        PANEL_W * 2.0 + 20.0,
        PANEL_H + 80.0
    );
    panel(
        &mut svg,
        0.0,
        "outbound load-plane bytes per replica (UDP)",
        "KB/s",
        &series(|o| o.wire_bytes_per_sec / 1e3),
    );
    panel(
        &mut svg,
        PANEL_W + 20.0,
        "visibility lag p99 (booking at A → seen at B)",
        "ms",
        &series(|o| o.lag_p99_ms),
    );
    svg.push_str("</svg>\n");
    svg
}
