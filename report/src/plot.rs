//! One line chart as an SVG string, drawn with `plotters`: every series is
//! one `<polyline>` with a vertex per data point (so a browser test can
//! count them), and epoch-level series add a circle per point.

use plotters::prelude::*;
use serde_json::{Map, Value};

/// One labelled line of `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend label.
    pub label: String,
    /// The points, in log order.
    pub points: Vec<(f64, f64)>,
    /// Whether each point is also marked with a circle.
    pub markers: bool,
}

impl Series {
    /// The `(record[x], record[y])` pairs of the records where both are
    /// finite numbers.
    pub fn collect(label: String, records: &[Map<String, Value>], x: &str, y: &str) -> Series {
        let points = records
            .iter()
            .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(y)?.as_f64()?)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        Series {
            label,
            points,
            markers: false,
        }
    }

    /// The same series with a circle at each point.
    pub fn with_markers(self) -> Series {
        Series {
            markers: true,
            ..self
        }
    }

    /// The number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether the series has no point.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// The stroke width of series lines, which tells them from axis ticks
/// (also polylines) in the SVG.
pub(crate) const SERIES_STROKE_WIDTH: u32 = 2;
const WIDTH: u32 = 520;
const HEIGHT: u32 = 360;
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws `series` under `title` against the epoch axis.
///
/// Returns the message of the `plotters` error if drawing fails.
pub(crate) fn draw(title: &str, series: &[Series]) -> Result<String, String> {
    let (x, y) = ranges(series);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x.0..x.1, y.0..y.1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(std::iter::once(PathElement::new(
                    s.points.clone(),
                    color.stroke_width(SERIES_STROKE_WIDTH),
                )))
                .map_err(|e| e.to_string())?
                .label(s.label.as_str())
                .legend(move |(lx, ly)| Rectangle::new([(lx, ly - 4), (lx + 14, ly + 4)], color.filled()));
            if s.markers {
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| e.to_string())?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The x and y ranges covering every point, widened where they are a
/// single value so the chart has an extent.
fn ranges(series: &[Series]) -> ((f64, f64), (f64, f64)) {
    let bounds = |pick: fn(&(f64, f64)) -> f64| {
        let (lo, hi) = series
            .iter()
            .flat_map(|s| s.points.iter().map(pick))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if !lo.is_finite() {
            return (0.0, 1.0);
        }
        let pad = if hi > lo {
            (hi - lo) * 0.05
        } else {
            lo.abs().max(1.0) * 0.05
        };
        (lo - pad, hi + pad)
    };
    (bounds(|p| p.0), bounds(|p| p.1))
}
