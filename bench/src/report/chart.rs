//! Charts as SVG (plotters, no system libraries): lines (latency against
//! the offered rate, figures over time) and bars (one figure per system).

use std::path::Path;

use plotters::prelude::*;

/// A named line of `(x, y)` points.
pub type Series = (String, Vec<(f64, f64)>);

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

/// Lines on a log-scaled y axis (latency spans orders of magnitude).
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), String> {
    let all = || series.iter().flat_map(|(_, s)| s.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let y_max = all().map(|p| p.1).fold(1.0, f64::max) * 1.5;
    let y_min = all()
        .map(|p| p.1)
        .filter(|y| *y > 0.0)
        .fold(f64::INFINITY, f64::min)
        .min(1.0)
        * 0.7;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|&(x, y)| (x, y.max(y_min))),
                    color.stroke_width(2),
                ))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y.max(y_min)), 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| e.to_string())
}

/// Horizontal bars, one per `(label, value)`, largest scale first.
pub fn bars(path: &Path, title: &str, x_desc: &str, bars: &[(String, f64)]) -> Result<(), String> {
    let x_max = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
    let n = bars.len().max(1);
    let root = SVGBackend::new(path, (900, 120 + 36 * n as u32)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(260)
            // `into_segmented` makes n + 1 segments of 0..n: 0..n - 1 gives n.
            .build_cartesian_2d(0.0..x_max, (0..n - 1).into_segmented())?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(x_desc)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let color = COLORS[i % COLORS.len()];
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (*v, SegmentValue::Exact(i + 1)),
                ],
                color.filled(),
            );
            bar.set_margin(6, 6, 0, 0);
            bar
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            Text::new(
                format!("{v:.0}"),
                (*v, SegmentValue::CenterOf(i)),
                ("sans-serif", 14),
            )
        }))?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| e.to_string())
}
