//! The scale harness's output: a table row per configuration, the fitted
//! growth with R, and an SVG plot of bytes/s and lag against R.

use std::fmt::Write;

use crate::fleet::Outcome;

pub fn header() {
    println!(
        "{:>4} {:>5} | {:>9} {:>9} {:>8} {:>7} | {:>6} {:>7} {:>5} | {:>6} | {:>6} {:>6} {:>6} {:>5} | {:>6} {:>6} | {:>5}",
        "R",
        "W",
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
        "{:>4} {:>5} | {:>9} {:>9} {:>8} {:>7} | {:>6} {:>7} {:>5} | {:>6} | {:>6} {:>6} {:>6} {:>5} | {:>6} {:>6} | {:>5}",
        "",
        "",
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
        "{:>4} {:>5} | {:>9.1} {:>9.1} {:>8.1} {:>7.0} | {:>6.3} {:>7.1} {:>5.2} | {:>6.1} | {:>6.1} {:>6.1} {:>6.1} {:>5} | {:>6} {:>6} | {:>5.1}",
        o.replicas,
        o.workers,
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

/// Least squares of log y on log x: (exponent, factor) of y = factor·x^exponent.
fn power_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| *x > 0.0 && *y > 0.0)
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let b = sxy / sxx;
    Some((b, (my - b * mx).exp()))
}

/// Prints, per worker count, how wire bytes/s and CPU per replica grow
/// with the number of peers (R − 1), and the value that law gives at 64.
pub fn fits(outcomes: &[Outcome]) {
    let mut ws: Vec<usize> = outcomes.iter().map(|o| o.workers).collect();
    ws.sort_unstable();
    ws.dedup();
    for w in ws {
        let of = |f: fn(&Outcome) -> f64| -> Vec<(f64, f64)> {
            outcomes
                .iter()
                .filter(|o| o.workers == w)
                .map(|o| ((o.replicas - 1) as f64, f(o)))
                .collect()
        };
        for (name, unit, pts) in [
            ("wire bytes/s", "KB/s", of(|o| o.wire_bytes_per_sec / 1e3)),
            (
                "payload bytes/s",
                "KB/s",
                of(|o| o.payload_bytes_per_sec / 1e3),
            ),
            ("mesh CPU", "cores", of(|o| o.cpu_cores_per_replica)),
        ] {
            if let Some((b, a)) = power_fit(&pts) {
                println!(
                    "  W={w}: {name} per replica ≈ {a:.4} × (R−1)^{b:.2} {unit}  → at R=64: {:.3} {unit}",
                    a * 63f64.powf(b)
                );
            }
        }
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
    let mut ws: Vec<usize> = outcomes.iter().map(|o| o.workers).collect();
    ws.sort_unstable();
    ws.dedup();
    let series = |f: fn(&Outcome) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        ws.iter()
            .map(|w| {
                (
                    format!("W = {w} workers"),
                    outcomes
                        .iter()
                        .filter(|o| o.workers == *w)
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
