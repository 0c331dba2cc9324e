//! SVG plots of comparison results (`tiervm compare --out DIR`), drawn with
//! the `plotters` crate: throughput over time per policy (a line chart) and
//! per-policy counters (a grouped bar chart). Each plot has a title, axis
//! labels and a legend. Text is emitted as SVG `<text>` elements (no fonts
//! are read on the host).

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::presentation::progress::si;
use vmm_core::status::TimelinePoint;

/// Plot size in pixels.
const SIZE: (u32, u32) = (960, 540);

/// One named line of a line chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// `(x, y)` points in x order.
    pub points: Vec<(f64, f64)>,
}

/// One group of bars (e.g. one policy) of a grouped bar chart.
#[derive(Clone, Debug, PartialEq)]
pub struct BarGroup {
    /// Label under the group.
    pub name: String,
    /// One value per bar, in the order of the chart's bar names.
    pub values: Vec<f64>,
}

/// Ops/s over windows of at least `window_s` seconds from a cumulative
/// timeline: one point per window, at the window's end. With `window_s` at
/// most the sampling period this is one point per sample interval. A tail
/// shorter than `window_s` (e.g. the stub between the last sample and the
/// VM's end, whose rate is mostly noise) is left out.
pub fn rates_from_timeline(timeline: &[TimelinePoint], window_s: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let Some(mut start) = timeline.first().copied() else {
        return out;
    };
    for p in &timeline[1..] {
        let dt = p.t_s - start.t_s;
        if dt > 0.0 && dt >= window_s {
            out.push((p.t_s, p.ops.saturating_sub(start.ops) as f64 / dt));
            start = *p;
        }
    }
    out
}

/// The color of series `i` (a fixed palette, so a policy keeps its color
/// across plots when the order is the same).
fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    COLORS[i % COLORS.len()]
}

/// A finite, positive upper bound for a y axis holding `max`.
fn y_top(max: f64) -> f64 {
    if max.is_finite() && max > 0.0 {
        max * 1.15
    } else {
        1.0
    }
}

/// A plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot failed")]
pub struct PlotError(#[source] DrawingAreaErrorKind<std::io::Error>);

/// A line chart as an SVG document.
pub fn line_chart_svg(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<String, PlotError> {
    let finite = |v: f64| v.is_finite();
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|v| finite(*v))
        .fold(0.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| finite(*v))
        .fold(0.0f64, f64::max);
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(PlotError)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..y_top(y_max))
            .map_err(PlotError)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .y_label_formatter(&|v| si_int(*v))
            .draw()
            .map_err(PlotError)?;
        for (i, s) in series.iter().enumerate() {
            let c = color(i);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| finite(*x) && finite(*y))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                .map_err(PlotError)?
                .label(s.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(PlotError)?;
    }
    Ok(svg)
}

/// An x axis of `groups` equal slots `[i, i+1)`; its key points are the
/// slot centres, so each group gets exactly one label.
#[derive(Clone, Copy, Debug)]
struct GroupAxis {
    groups: usize,
}

impl Ranged for GroupAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let n = self.groups.max(1) as f64;
        let frac = value / n;
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.groups).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.groups.max(1) as f64
    }
}

/// A grouped bar chart as an SVG document: one group per entry of
/// `groups`, one bar per entry of `bar_names` (the legend). Each bar is
/// labelled with its value.
pub fn grouped_bars_svg(
    title: &str,
    y_desc: &str,
    bar_names: &[&str],
    groups: &[BarGroup],
) -> Result<String, PlotError> {
    let y_max = groups
        .iter()
        .flat_map(|g| g.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let label = move |v: &f64| -> String {
        let i = v.floor();
        if i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let bars = bar_names.len().max(1);
    let slot = 0.8 / bars as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(PlotError)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(
                GroupAxis {
                    groups: groups.len(),
                },
                0.0..y_top(y_max),
            )
            .map_err(PlotError)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("policy")
            .y_desc(y_desc)
            .x_label_formatter(&label)
            .y_label_formatter(&|v| si_int(*v))
            .draw()
            .map_err(PlotError)?;
        for (b, bar_name) in bar_names.iter().enumerate() {
            let c = color(b);
            chart
                .draw_series(bars_of(groups, b, slot, c))
                .map_err(PlotError)?
                .label(*bar_name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
            chart
                .draw_series(bar_labels_of(groups, b, slot))
                .map_err(PlotError)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        root.present().map_err(PlotError)?;
    }
    Ok(svg)
}

/// Bar `b` of every group: group `g` spans `[g, g + 1)`, its bars share
/// the middle 80% in slots of `slot`.
/// The series legend both charts draw, at `position`.
fn draw_legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(PlotError)
}

fn bars_of(groups: &[BarGroup], b: usize, slot: f64, c: RGBColor) -> Vec<Rectangle<(f64, f64)>> {
    groups
        .iter()
        .enumerate()
        .filter_map(|(g, group)| {
            let v = *group.values.get(b)?;
            let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
            let x0 = g as f64 + 0.1 + b as f64 * slot;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + slot * 0.9, v)],
                c.filled(),
            ))
        })
        .collect()
}

/// The value above bar `b` of every group (none for a missing value).
fn bar_labels_of(
    groups: &[BarGroup],
    b: usize,
    slot: f64,
) -> Vec<Text<'static, (f64, f64), String>> {
    groups
        .iter()
        .enumerate()
        .filter_map(|(g, group)| {
            let v = *group.values.get(b)?;
            if !v.is_finite() {
                return None;
            }
            let x = g as f64 + 0.1 + (b as f64 + 0.45) * slot;
            let style = ("sans-serif", 11)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            Some(Text::new(si_int(v), (x, v.max(0.0)), style))
        })
        .collect()
}

/// A count for a bar label: whole numbers below 1000, SI prefixes above.
fn si_int(v: f64) -> String {
    if v.abs() < 1000.0 {
        format!("{v:.0}")
    } else {
        si(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minimal well-formedness: one root `<svg ...>` ... `</svg>` and every
    /// element opened is closed (self-closing tags count as both).
    pub(crate) fn balanced(svg: &str) -> bool {
        let mut depth: i64 = 0;
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            rest = &rest[i..];
            let Some(end) = rest.find('>') else {
                return false;
            };
            let tag = &rest[..=end];
            if tag.starts_with("<?") || tag.starts_with("<!") {
            } else if tag.starts_with("</") {
                depth -= 1;
            } else if !tag.ends_with("/>") {
                depth += 1;
            }
            if depth < 0 {
                return false;
            }
            rest = &rest[end + 1..];
        }
        depth == 0
    }

    fn tl(points: &[(f64, u64)]) -> Vec<TimelinePoint> {
        points
            .iter()
            .map(|&(t_s, ops)| TimelinePoint { t_s, ops })
            .collect()
    }

    #[test]
    fn rates_are_per_interval_deltas() {
        let t = tl(&[(0.1, 0), (0.2, 100), (0.4, 500), (0.4, 600), (0.41, 601)]);
        let r = rates_from_timeline(&t, 0.0);
        assert_eq!(r.len(), 3, "the zero-length interval is skipped");
        assert!((r[0].0 - 0.2).abs() < 1e-12 && (r[0].1 - 1000.0).abs() < 1e-6);
        assert!((r[1].0 - 0.4).abs() < 1e-12 && (r[1].1 - 2000.0).abs() < 1e-6);
        assert!((r[2].1 - 10_100.0).abs() < 1e-6, "from (0.4, 500): {r:?}");
        let r = rates_from_timeline(&t, 0.05);
        assert_eq!(r.len(), 2, "the 10 ms stub at the end is skipped");
        assert!(rates_from_timeline(&tl(&[(1.0, 5)]), 0.0).is_empty());
        assert!(rates_from_timeline(&[], 0.0).is_empty());
    }

    #[test]
    fn wider_windows_average_several_samples() {
        let t = tl(&[
            (0.0, 0),
            (0.1, 10),
            (0.2, 30),
            (0.3, 60),
            (0.4, 100),
            (0.45, 200),
        ]);
        let r = rates_from_timeline(&t, 0.2);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!((r[0].0 - 0.2).abs() < 1e-9 && (r[0].1 - 150.0).abs() < 1e-6);
        assert!((r[1].0 - 0.4).abs() < 1e-9 && (r[1].1 - 350.0).abs() < 1e-6);
    }

    /// The trimmed contents of every `<text>` element.
    pub(crate) fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    #[test]
    fn line_chart_has_title_axes_and_legend() {
        let s = vec![
            Series {
                name: "static".into(),
                points: vec![(0.1, 10.0), (0.2, 20.0)],
            },
            Series {
                name: "chaos".into(),
                points: vec![(0.1, 5.0), (0.2, f64::NAN)],
            },
        ];
        let svg = line_chart_svg("Throughput <zipf>", "time (s)", "ops/s", &s).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(balanced(&svg));
        let t = texts(&svg);
        for needle in [
            "Throughput &lt;zipf&gt;",
            "time (s)",
            "ops/s",
            "static",
            "chaos",
        ] {
            assert!(t.iter().any(|x| x == needle), "missing {needle} in {t:?}");
        }
        assert_eq!(
            svg.matches("stroke-width=\"2\"").count(),
            2 + 2,
            "two lines + two legend marks"
        );
    }

    #[test]
    fn bar_chart_labels_each_group_once() {
        let groups = vec![
            BarGroup {
                name: "static".into(),
                values: vec![0.0, 0.0],
            },
            BarGroup {
                name: "chaos".into(),
                values: vec![12345.0, 7.0],
            },
        ];
        let svg =
            grouped_bars_svg("Migrations", "pages", &["promotions", "demotions"], &groups).unwrap();
        assert!(svg.starts_with("<svg") && balanced(&svg));
        let t = texts(&svg);
        let count = |n: &str| t.iter().filter(|x| *x == n).count();
        assert_eq!(count("static"), 1, "one axis label per group: {t:?}");
        assert_eq!(count("chaos"), 1);
        assert_eq!(count("promotions"), 1);
        assert_eq!(count("demotions"), 1);
        assert_eq!(count("12.3k"), 1, "bar values are labelled: {t:?}");
        assert_eq!(count("7"), 1);
    }

    #[test]
    fn empty_inputs_still_draw() {
        let svg = line_chart_svg("t", "x", "y", &[]).unwrap();
        assert!(balanced(&svg));
        let svg = grouped_bars_svg("t", "y", &["a"], &[]).unwrap();
        assert!(balanced(&svg));
    }

    #[test]
    fn balance_check_catches_a_truncated_document() {
        let svg = line_chart_svg("t", "x", "y", &[]).unwrap();
        let cut = svg.trim_end().trim_end_matches("</svg>");
        assert!(!balanced(cut));
    }
}
