//! The fleet benchmark's PNG: TTFT p99 per scenario (bars) and the KV-usage
//! spread across engines over time (one line per scenario).
//!
//! Text is drawn with plotters' pure-Rust `ab_glyph` backend, so no
//! fontconfig or freetype is needed, only a TrueType file: `--font`, else
//! DejaVu Sans (Debian `fonts-dejavu-core`) or Liberation Sans.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::report::ScenarioResult;

/// Fonts tried when none is given.
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

static FONT: OnceLock<Result<(), String>> = OnceLock::new();

/// Registers `font` (or the first candidate that exists) as `sans-serif`.
pub fn register_font(font: Option<&Path>) -> Result<(), String> {
    FONT.get_or_init(|| {
        let path: PathBuf = match font {
            Some(p) => p.to_path_buf(),
            None => FONT_CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    format!(
                        "no font found (tried {}); install fonts-dejavu-core or pass --font FILE.ttf",
                        FONT_CANDIDATES.join(", ")
                    )
                })?,
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
    })
    .clone()
}

fn short(r: &ScenarioResult) -> String {
    let p = match r.group.as_str() {
        "least_load" => "LL",
        "cache_aware" => "CA",
        "least_load_vllm" => "LLv",
        other => other,
    };
    format!("{p} {}", r.label)
}

/// Moving average of `(t, v)` over `window` seconds.
fn smooth(points: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len());
    let (mut lo, mut sum) = (0usize, 0.0);
    for (hi, &(t, v)) in points.iter().enumerate() {
        sum += v;
        while points[lo].0 < t - window && lo < hi {
            sum -= points[lo].1;
            lo += 1;
        }
        out.push((t, sum / (hi - lo + 1) as f64));
    }
    out
}

/// Draws the PNG to `path` (1400 × 600).
pub fn draw(path: &Path, title: &str, results: &[ScenarioResult]) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|x| e(&x))?;
    let (left, right) = root.split_horizontally(620);
    let n = results.len();
    let ymax = results
        .iter()
        .map(|r| r.ttft_p99_ms)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let labels: Vec<String> = results.iter().map(short).collect();
    let mut bars = ChartBuilder::on(&left)
        .caption("client TTFT p99, ms", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..ymax)
        .map_err(|x| e(&x))?;
    bars.configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_style(("sans-serif", 12))
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("ms")
        .draw()
        .map_err(|x| e(&x))?;
    bars.draw_series(results.iter().enumerate().map(|(i, r)| {
        let v = if r.ttft_p99_ms.is_finite() {
            r.ttft_p99_ms
        } else {
            0.0
        };
        let color = match r.label.as_str() {
            "oracle" => RGBColor(70, 130, 180),
            "mesh" => RGBColor(46, 139, 87),
            _ => RGBColor(205, 92, 92),
        };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), v),
            ],
            color.filled(),
        );
        bar.set_margin(0, 0, 8, 8);
        bar
    }))
    .map_err(|x| e(&x))?;
    bars.draw_series(results.iter().enumerate().map(|(i, r)| {
        Text::new(
            format!("{:.0}", r.ttft_p99_ms),
            (
                SegmentValue::CenterOf(i),
                r.ttft_p99_ms.min(ymax) + ymax * 0.01,
            ),
            ("sans-serif", 13),
        )
    }))
    .map_err(|x| e(&x))?;

    let tmax = results
        .iter()
        .flat_map(|r| r.kv_series.last().map(|s| s.t))
        .fold(1.0, f64::max);
    let mut lines = ChartBuilder::on(&right)
        .caption(
            "KV-usage spread across engines (max - min, 1 s mean), %",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..tmax, 0.0..100.0)
        .map_err(|x| e(&x))?;
    lines
        .configure_mesh()
        .x_desc("seconds since the load started")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, r) in results.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .kv_series
            .iter()
            .map(|s| (s.t, 100.0 * s.spread))
            .collect();
        let color = Palette99::pick(i).to_rgba();
        lines
            .draw_series(LineSeries::new(smooth(&pts, 1.0), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(short(r))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    lines
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
