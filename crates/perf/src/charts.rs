//! Line charts as PNG and SVG with plotters. One drawing routine serves both backends; log
//! axes are drawn by plotting log10 of the values and labelling ticks with the real values,
//! which keeps one coordinate type for every chart.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

pub const CHART_WIDTH_PX: u32 = 1000;
pub const CHART_HEIGHT_PX: u32 = 560;
/// Points per series: more would not be visible at this width and would bloat the SVGs.
pub const SERIES_POINTS_MAX: usize = 20_000;

static FONT: Once = Once::new();

/// The font ships inside the binary (DejaVu Sans, see assets/DejaVuSans.LICENSE): PNGs render
/// the same on a bare CI machine with no fontconfig.
fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        );
    });
}

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Draw a marker at each point (for charts with few points, such as one per sweep step).
    pub markers: bool,
    pub dashed: bool,
    /// Palette index; default is the series' position. Comparisons give the same quantity the
    /// same colour in every run and tell runs apart by dashes.
    pub color: Option<usize>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            markers: false,
            dashed: false,
            color: None,
        }
    }

    pub fn with_markers(mut self) -> Self {
        self.markers = true;
        self
    }

    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn axis_value(v: f64, log: bool) -> Option<f64> {
    if log {
        (v > 0.0).then(|| v.log10())
    } else {
        v.is_finite().then_some(v)
    }
}

fn tick_label(v: f64, log: bool) -> String {
    let real = if log { 10f64.powf(v) } else { v };
    let a = real.abs();
    // Log ticks fall on uneven values: two significant digits read as 1.6, 2.5, 4, 6.3, 10.
    let sig2 = |x: f64| {
        if x == 0.0 {
            return 0.0;
        }
        let mag = 10f64.powf(x.abs().log10().floor() - 1.0);
        (x / mag).round() * mag
    };
    let shown = if log { sig2(real) } else { real };
    let trim = |x: f64, unit: &str| {
        let t = if x >= 10.0 || x == x.round() {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        };
        format!("{t}{unit}")
    };
    if a >= 1e6 {
        trim(shown / 1e6, "M")
    } else if a >= 1e4 || (log && a >= 1e3) {
        trim(shown / 1e3, "k")
    } else if a >= 100.0 || shown == shown.round() {
        format!("{shown:.0}")
    } else if a >= 1.0 {
        format!("{shown:.1}")
    } else if log && a > 0.0 {
        let decimals = (-a.log10().floor()) as usize + 1;
        format!("{shown:.decimals$}")
    } else {
        format!("{shown:.2}")
    }
}

impl Chart {
    fn transformed(&self) -> Vec<(String, Vec<(f64, f64)>)> {
        self.series
            .iter()
            .map(|s| {
                let step = (s.points.len() / SERIES_POINTS_MAX).max(1);
                let pts = s
                    .points
                    .iter()
                    .step_by(step)
                    .filter_map(|&(x, y)| {
                        Some((axis_value(x, self.log_x)?, axis_value(y, self.log_y)?))
                    })
                    .collect();
                (s.name.clone(), pts)
            })
            .collect()
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let map = |e: DrawingAreaErrorKind<DB::ErrorType>| {
            anyhow!("drawing chart {:?}: {e:?}", self.title)
        };
        root.fill(&WHITE).map_err(map)?;
        let data = self.transformed();
        let all: Vec<(f64, f64)> = data.iter().flat_map(|(_, p)| p.iter().copied()).collect();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in &all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if all.is_empty() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if !self.log_y {
            y0 = y0.min(0.0);
        }
        let pad = |a: f64, b: f64| {
            if (b - a).abs() < 1e-9 {
                (a - 0.5, b + 0.5)
            } else {
                (a, b + (b - a) * 0.05)
            }
        };
        let (x0, x1) = pad(x0, x1);
        let (y0, y1) = pad(y0, y1);
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(map)?;
        let (log_x, log_y) = (self.log_x, self.log_y);
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&|v| tick_label(*v, log_x))
            .y_label_formatter(&|v| tick_label(*v, log_y))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(map)?;
        for (i, ((name, pts), s)) in data.iter().zip(&self.series).enumerate() {
            let color = PALETTE[s.color.unwrap_or(i) % PALETTE.len()];
            let style = ShapeStyle::from(&color).stroke_width(2);
            if s.dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts.iter().copied(), 8, 6, style))
                    .map_err(map)?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            } else {
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), style))
                    .map_err(map)?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            if s.markers {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(map)?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(map)?;
        root.present().map_err(map)?;
        Ok(())
    }

    /// Writes `<base>.png` and `<base>.svg`; returns both paths.
    pub fn write(&self, base: &Path) -> Result<(PathBuf, PathBuf)> {
        register_font();
        let png = base.with_extension("png");
        let svg = base.with_extension("svg");
        self.draw(BitMapBackend::new(&png, (CHART_WIDTH_PX, CHART_HEIGHT_PX)).into_drawing_area())?;
        self.draw(SVGBackend::new(&svg, (CHART_WIDTH_PX, CHART_HEIGHT_PX)).into_drawing_area())?;
        Ok((png, svg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_label_real_values() {
        assert_eq!(tick_label(3.0, true), "1k");
        assert_eq!(tick_label(5.0, true), "100k");
        assert_eq!(tick_label(3981f64.log10(), true), "4k");
        assert_eq!(tick_label(6310f64.log10(), true), "6.3k");
        assert_eq!(tick_label(1.6f64.log10(), true), "1.6");
        assert_eq!(tick_label(25.1f64.log10(), true), "25");
        assert_eq!(tick_label(0.316f64.log10(), true), "0.32");
        assert_eq!(tick_label(0.5, false), "0.50");
        assert_eq!(axis_value(0.0, true), None);
    }
}
