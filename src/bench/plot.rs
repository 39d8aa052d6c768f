//! `--plot FILE.png`: TFLOPS against sequence length, one panel per (dtype, head dim, causal),
//! one line per implementation (ours and those read with `--compare`). Text is drawn with an
//! embedded DejaVu Sans (the `dejavu` crate through plotters' `ab_glyph` backend), so rendering
//! needs no system fonts or fontconfig.

use super::record::{Mode, Record, FLASHCORE};
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

fn register_fonts() -> Result<()> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
            && plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
                .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Other("plot: the embedded font did not load".into()))
    }
}

/// "512", "1k", "16k".
pub fn seqlen_label(s: f64) -> String {
    let r = s.round();
    if r >= 1024.0 && (r as u64) % 1024 == 0 {
        format!("{}k", r as u64 / 1024)
    } else {
        format!("{}", r as u64)
    }
}

/// The mode a plot shows when none is asked for: graph replay if any record has it, else event.
pub fn default_mode(records: &[Record]) -> Mode {
    if records.iter().any(|r| r.is_ok() && r.mode == Mode::Graph) {
        Mode::Graph
    } else {
        Mode::Event
    }
}

type Panels = BTreeMap<(String, usize, bool), BTreeMap<String, Vec<(f64, f64)>>>;

/// The points drawn: panel (dtype, head dim, causal) → implementation → (seqlen_q, TFLOPS),
/// sorted by seqlen. Only measured records of `mode` with a TFLOPS value count.
pub fn panels(records: &[Record], mode: Mode) -> Panels {
    let mut out: Panels = BTreeMap::new();
    for r in records.iter().filter(|r| r.is_ok() && r.mode == mode) {
        let Some(t) = r.tflops.filter(|t| t.is_finite()) else {
            continue;
        };
        out.entry((r.dtype.name().to_string(), r.shape.head_dim, r.shape.causal))
            .or_default()
            .entry(match r.pass.tag() {
                "" => r.implementation.clone(),
                tag => format!("{} {tag}", r.implementation),
            })
            .or_default()
            .push((r.shape.seqlen_q as f64, t));
    }
    for series in out.values_mut() {
        for pts in series.values_mut() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        }
    }
    out
}

fn color_for(name: &str, others: &[String]) -> RGBColor {
    const PALETTE: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(23, 190, 207),
    ];
    if name == FLASHCORE {
        return RGBColor(214, 39, 40);
    }
    let i = others.iter().position(|o| o == name).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Other(format!("plot: {e}"))
}

/// Draws the plot of `records` in `mode` (default: [`default_mode`]) to the PNG `path`
/// (through a temporary file beside it: an existing plot is replaced only by a complete one).
pub fn render(records: &[Record], path: &Path, mode: Option<Mode>) -> Result<()> {
    crate::output::write_atomic_with(path, |tmp| render_to(records, tmp, mode))
}

fn render_to(records: &[Record], path: &Path, mode: Option<Mode>) -> Result<()> {
    register_fonts()?;
    let mode = mode.unwrap_or_else(|| default_mode(records));
    let panels = panels(records, mode);
    if panels.is_empty() {
        return Err(Error::Other(format!(
            "plot: no measured {} records to draw",
            mode.name()
        )));
    }
    let others: Vec<String> = panels
        .values()
        .flat_map(|s| s.keys().cloned())
        .filter(|n| n != FLASHCORE)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let n = panels.len();
    let cols = match n {
        1 | 2 => n,
        3 | 4 => 2,
        _ => 4,
    };
    let rows = n.div_ceil(cols);
    let (pw, ph) = (520u32, 380u32);
    let root =
        BitMapBackend::new(path, (pw * cols as u32, ph * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (title, body) = root.split_vertically(40);
    title
        .titled(
            &format!(
                "attention forward, TFLOPS vs sequence length ({} timing)",
                mode.name()
            ),
            ("sans-serif", 22),
        )
        .map_err(plot_err)?;
    let areas = body.split_evenly((rows, cols));
    for (area, ((dtype, d, causal), series)) in areas.iter().zip(&panels) {
        let xs = series.values().flatten().map(|p| p.0.log2());
        let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
        let ymax = series
            .values()
            .flatten()
            .map(|p| p.1)
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.15;
        let caption = format!(
            "{dtype} d{d} {}",
            if *causal { "causal" } else { "non-causal" }
        );
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d((xmin - 0.4)..(xmax + 0.4), 0f64..ymax)
            .map_err(plot_err)?;
        let fmt_x = |x: &f64| {
            if (x - x.round()).abs() < 1e-6 {
                seqlen_label(2f64.powf(*x))
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc("sequence length")
            .y_desc("TFLOPS")
            .x_labels(((xmax - xmin) as usize + 3).max(3))
            .x_label_formatter(&fmt_x)
            .y_label_formatter(&|y: &f64| format!("{y:.0}"))
            .draw()
            .map_err(plot_err)?;
        for (name, pts) in series {
            let color = color_for(name, &others);
            let line: Vec<(f64, f64)> = pts.iter().map(|(s, t)| (s.log2(), *t)).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}
