//! What the benchmarks print and write: latency percentiles, ratios, aligned text tables, JSON
//! files, SVG figures of one or several charts, of lines or of grouped bars (plotters), and
//! progress bars (indicatif, shown only on a terminal).

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::systems::Traffic;
use crate::CliError;

/// Percentiles of a set of latencies, in microseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Latency {
    /// How many samples.
    pub count: usize,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
}

impl Latency {
    /// Summarises `samples` (sorted here).
    pub fn of(samples: &mut [u64]) -> Latency {
        samples.sort_unstable();
        let at = |p: usize| -> u64 {
            if samples.is_empty() {
                0
            } else {
                samples[(samples.len() - 1) * p / 100]
            }
        };
        Latency {
            count: samples.len(),
            p50_us: at(50),
            p99_us: at(99),
            max_us: samples.last().copied().unwrap_or(0),
        }
    }

    /// The table cells p50, p99 and max, in milliseconds ([`ms_cell`]).
    pub fn cells(&self) -> Vec<String> {
        [self.p50_us, self.p99_us, self.max_us]
            .map(ms_cell)
            .to_vec()
    }
}

/// Microseconds of a duration, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `value / base`, when there is a base to compare with.
fn ratio(value: f64, base: Option<f64>) -> Option<f64> {
    match base {
        Some(b) if b > 0.0 => Some(value / b),
        _ => None,
    }
}

/// A table row compared with the baseline system's row of the same group.
pub trait Compared {
    /// The system's name.
    fn system(&self) -> &str;
    /// The figure compared.
    fn figure(&self) -> f64;
    /// Stores the ratio of the figure to the baseline's.
    fn set_ratio(&mut self, ratio: Option<f64>);
}

/// Implements [`Compared`] for a row type with a `system: String` field: the figure is
/// `$figure(row)`, the ratio goes to the field `$ratio`.
macro_rules! compared {
    ($row:ty, $figure:expr, $ratio:ident) => {
        impl $crate::bench::report::Compared for $row {
            fn system(&self) -> &str {
                &self.system
            }
            fn figure(&self) -> f64 {
                let figure: fn(&$row) -> f64 = $figure;
                figure(self)
            }
            fn set_ratio(&mut self, ratio: Option<f64>) {
                self.$ratio = ratio;
            }
        }
    };
}
pub(crate) use compared;

/// Sets every row's ratio to the row of `ext4:ordered` among `rows` (one group: the same
/// thread count, journal mode or phase); `None` when the baseline is not among them.
pub fn set_ratios<R: Compared>(rows: &mut [R]) {
    let baseline = super::systems::System::BASELINE.name();
    let base = rows
        .iter()
        .find(|r| r.system() == baseline)
        .map(Compared::figure);
    for row in rows {
        let r = ratio(row.figure(), base);
        row.set_ratio(r);
    }
}

/// The measurements of a table, grouped as its rows: for each count of `counts` (threads,
/// streams), for each of `systems`, the count, the system's name and the items measured on it
/// at that count, which `of(item)` names as (system, count).
pub fn grouped<'a, T>(
    counts: &[usize],
    systems: &[super::systems::System],
    items: &'a [T],
    of: impl Fn(&T) -> (&str, usize),
) -> Vec<(usize, String, Vec<&'a T>)> {
    let mut groups = Vec::new();
    for &count in counts {
        for system in systems {
            let name = system.name();
            let mine = items.iter().filter(|i| of(i) == (&name, count)).collect();
            groups.push((count, name, mine));
        }
    }
    groups
}

/// A ratio cell: `0.52x`, or `-` when there is no base.
pub fn ratio_cell(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"))
}

/// A latency cell in milliseconds with two decimals (`1.25`).
pub fn ms_cell(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The samples measured on each of `systems`, in their order, with the system's name;
/// `system_of(sample)` names the system a sample was measured on.
pub fn by_system<'a, T>(
    systems: &[super::systems::System],
    samples: &'a [T],
    system_of: impl Fn(&T) -> &str,
) -> Vec<(String, Vec<&'a T>)> {
    systems
        .iter()
        .map(|s| {
            let name = s.name();
            let mine = samples.iter().filter(|x| system_of(x) == name).collect();
            (name, mine)
        })
        .collect()
}

/// The median of `f` over `samples`; 0 when there are none.
pub fn median_by<T>(samples: &[&T], f: impl Fn(&T) -> f64) -> f64 {
    median(&mut samples.iter().map(|x| f(x)).collect::<Vec<_>>())
}

/// The median of `values` (sorted here); 0 when empty.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        0.0
    } else {
        values[values.len() / 2]
    }
}

/// A table row's medians of what the devices received over several runs.
#[derive(Debug, serde::Serialize)]
pub struct TrafficMedians {
    pub device_bytes_written: f64,
    /// Of which to the external journal device (`None` when a run had none, as fuse2fs).
    pub journal_bytes_written: Option<f64>,
    pub device_flushes: f64,
}

impl TrafficMedians {
    /// The medians of `runs`.
    pub fn of(runs: &[Traffic]) -> TrafficMedians {
        let median =
            |f: &dyn Fn(&Traffic) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
        TrafficMedians {
            device_bytes_written: median(&|t| t.total().bytes_written as f64),
            journal_bytes_written: runs
                .iter()
                .all(|t| t.journal.is_some())
                .then(|| median(&|t| t.journal.map_or(0.0, |j| j.bytes_written as f64))),
            device_flushes: median(&|t| t.total().flushes as f64),
        }
    }
}

/// Prints a table under the `|`-separated `headers`, one line of `cells(item)` per item; the
/// first column is left-aligned, the others right.
pub fn print_table<T>(headers: &str, items: &[T], cells: impl Fn(&T) -> Vec<String>) {
    let headers: Vec<&str> = headers.split('|').collect();
    let rows: Vec<Vec<String>> = items.iter().map(cells).collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(headers));
    for row in &rows {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), CliError> {
    // OK to unwrap: a serde_json::Value always serializes.
    let text = serde_json::to_string_pretty(value).expect("JSON value serializes");
    std::fs::write(path, text + "\n")
        .map_err(|e| CliError::new(format!("bench: {}", path.display()), e.to_string()))
}

/// One line of a plot: a name and its (x, y) points.
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// Line colours that stay apart on white, one per system.
const COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(0, 0, 0),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];

/// One chart of a figure: its y axis and its lines.
pub struct Panel<'a> {
    /// The y axis' description.
    pub y_desc: &'a str,
    /// The lines.
    pub series: &'a [Series],
}

/// Draws `series` as lines with markers into an SVG file. With `log_x` the x axis is
/// logarithmic, in powers of ten when every x is one (stream counts 1, 10, 100, 1000), else in
/// powers of two (thread counts 1, 4, 16, 64), and labelled with the counts.
pub fn plot_lines(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    log_x: bool,
) -> Result<(), CliError> {
    plot_panels(path, title, x_desc, &[Panel { y_desc, series }], log_x)
}

/// Draws several charts with the same x axis into one SVG file, two side by side per row, as
/// [`plot_lines`] draws one; `title` goes above them all.
pub fn plot_panels(
    path: &Path,
    title: &str,
    x_desc: &str,
    panels: &[Panel],
    log_x: bool,
) -> Result<(), CliError> {
    let charts: Vec<(&str, &[Series])> = panels.iter().map(|p| (p.y_desc, p.series)).collect();
    draw_figure(path, title, &charts, |i, area, caption| {
        let panel = &panels[i];
        draw_chart(area, caption, (x_desc, panel.y_desc), panel.series, log_x)
    })
}

/// Draws grouped bar charts into one SVG file, laid out as [`plot_panels`] lays out its
/// charts: each of `charts` is a caption and one series per bar of each group, whose point
/// `(g, y)` is its bar in group `g` (0, 1, ...). Along x the `groups` (phases), in each one bar
/// per series, coloured and named in the legend as the lines of [`plot_lines`]; `y_desc` is
/// every y axis.
pub fn plot_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[&str],
    charts: &[(&str, &[Series])],
) -> Result<(), CliError> {
    draw_figure(path, title, charts, |i, area, caption| {
        draw_bars(area, caption, y_desc, groups, charts[i].1)
    })
}

/// The layout of a figure of `charts` (caption, series): two side by side per row, `title`
/// above them all when there are several (a single chart takes it as its caption). Draws chart
/// `i` with `draw(i, area, caption)`; refuses a figure without a single point.
fn draw_figure(
    path: &Path,
    title: &str,
    charts: &[(&str, &[Series])],
    draw: impl Fn(usize, &DrawingArea<SVGBackend, plotters::coord::Shift>, &str) -> Result<(), String>,
) -> Result<(), CliError> {
    let failed = |e: String| CliError::new(format!("bench: plot {}", path.display()), e);
    if charts
        .iter()
        .all(|chart| chart.1.iter().all(|s| s.points.is_empty()))
    {
        return Err(failed("nothing to plot".into()));
    }
    let columns = charts.len().clamp(1, 2);
    let rows = charts.len().div_ceil(columns).max(1);
    let size = (900 * columns as u32, 560 * rows as u32 + 40);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(e.to_string()))?;
    let body = if charts.len() > 1 {
        root.titled(title, ("sans-serif", 24))
            .map_err(|e| failed(e.to_string()))?
    } else {
        root.clone()
    };
    let areas = body.split_evenly((rows, columns));
    for (i, (chart, area)) in charts.iter().zip(&areas).enumerate() {
        let caption = if charts.len() > 1 { chart.0 } else { title };
        draw(i, area, caption).map_err(failed)?;
    }
    root.present().map_err(|e| failed(e.to_string()))
}

/// The top of a y axis from 0 over `series`, `headroom` times the highest finite point (`1`
/// when there is none), and the decimals its labels need.
fn y_axis(series: &[Series], headroom: f64) -> (f64, usize) {
    let y_hi = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(0.0_f64, f64::max);
    // Small ranges (bytes per app byte near 1) need decimals on the axis.
    let y_top = if y_hi > 0.0 { y_hi * headroom } else { 1.0 };
    let decimals = if y_top < 1.0 {
        2
    } else if y_top < 10.0 {
        1
    } else {
        0
    };
    (y_top, decimals)
}

/// Draws one chart of [`plot_bars`] into `area`. Along x a group is [`GROUP_WIDTH`] units
/// wide (integer units, whose labels plotters lets us choose): group `g` spans
/// `g * GROUP_WIDTH` to the next, its bars side by side over the middle eight tenths, its name
/// under its centre.
fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    groups: &[&str],
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    const GROUP_WIDTH: i32 = 1000;
    let count = i32::try_from(groups.len()).map_err(|e| e.to_string())?;
    // Room above the bars for the legend.
    let (y_top, decimals) = y_axis(series, 1.5);
    let centres: Vec<i32> = (0..count)
        .map(|g| g * GROUP_WIDTH + GROUP_WIDTH / 2)
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0..count * GROUP_WIDTH).with_key_points(centres),
            0.0..y_top,
        )
        .map_err(|e| e.to_string())?;
    let group_name = |x: &i32| {
        usize::try_from(x / GROUP_WIDTH)
            .ok()
            .and_then(|g| groups.get(g))
            .map_or_else(String::new, |n| (*n).to_string())
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_label_formatter(&group_name)
        .y_label_formatter(&|y| format!("{y:.decimals$}"))
        .draw()
        .map_err(|e| e.to_string())?;
    let width = GROUP_WIDTH * 8 / 10 / i32::try_from(series.len().max(1)).unwrap_or(i32::MAX);
    for (i, s) in (0..).zip(series) {
        let color = COLORS[usize::try_from(i).unwrap_or(0) % COLORS.len()];
        // Points are (group index, y); the index is a small whole number.
        let left = |g: f64| g as i32 * GROUP_WIDTH + GROUP_WIDTH / 10 + i * width;
        chart
            .draw_series(s.points.iter().filter(|p| p.1.is_finite()).map(|&(g, y)| {
                Rectangle::new([(left(g), 0.0), (left(g) + width, y)], color.filled())
            }))
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Draws one chart of [`plot_panels`] into `area`.
fn draw_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    log_x: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let power_of_ten = |x: f64| x >= 1.0 && (x.log10() - x.log10().round()).abs() < 1e-9;
    let base: f64 = if series
        .iter()
        .flat_map(|s| &s.points)
        .all(|p| power_of_ten(p.0))
    {
        10.0
    } else {
        2.0
    };
    let x_of = |x: f64| {
        if log_x {
            x.max(f64::MIN_POSITIVE).log(base)
        } else {
            x
        }
    };
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| x_of(p.0)));
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if x_lo > x_hi {
        return Ok(());
    }
    let pad = ((x_hi - x_lo) * 0.05).max(0.5);
    let (y_top, decimals) = y_axis(series, 1.1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo - pad..x_hi + pad, 0.0..y_top)
        .map_err(|e| e.to_string())?;
    let x_label = |x: &f64| {
        if log_x {
            format!("{:.0}", base.powf(*x))
        } else {
            format!("{x:.0}")
        }
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(if log_x {
            (x_hi - x_lo) as usize + 2
        } else {
            10
        })
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y| format!("{y:.decimals$}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| (x_of(x), y))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(legend_corner(series))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Where the legend hides the least: the upper corner on the side where the lines end lower.
fn legend_corner(series: &[Series]) -> SeriesLabelPosition {
    let (mut left, mut right) = (0.0, 0.0);
    for s in series {
        left += s.points.first().map_or(0.0, |p| p.1);
        right += s.points.last().map_or(0.0, |p| p.1);
    }
    if right < left {
        SeriesLabelPosition::UpperRight
    } else {
        SeriesLabelPosition::UpperLeft
    }
}

/// A progress bar over `total` steps on stderr; hidden when stderr is not a terminal.
pub fn progress(total: usize, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(u64::try_from(total).unwrap_or(u64::MAX));
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
    ) {
        bar.set_style(style);
    }
    bar.set_prefix(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: percentiles pick the nearest-rank sample below. Method: 1..=100 shuffled.
    #[test]
    fn latency_percentiles() {
        let mut samples: Vec<u64> = (1..=100).rev().collect();
        let l = Latency::of(&mut samples);
        assert_eq!((l.count, l.p50_us, l.p99_us, l.max_us), (100, 50, 99, 100));
        let empty = Latency::of(&mut []);
        assert_eq!((empty.count, empty.p50_us, empty.max_us), (0, 0, 0));
    }

    struct R {
        system: String,
        x: f64,
        ratio: Option<f64>,
    }
    compared!(R, |r| r.x, ratio);

    /// Goal: ratios are to ext4:ordered's row of the group, and absent without it.
    #[test]
    fn ratios_to_the_baseline() {
        let row = |system: &str, x| R {
            system: system.into(),
            x,
            ratio: None,
        };
        let mut rows = [row("tidefs:ordered", 50.0), row("ext4:ordered", 200.0)];
        set_ratios(&mut rows);
        assert_eq!(rows.map(|r| r.ratio), [Some(0.25), Some(1.0)]);
        let mut alone = [row("tidefs:ordered", 50.0)];
        set_ratios(&mut alone);
        assert_eq!(alone[0].ratio, None);
    }
}
