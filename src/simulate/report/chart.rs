//! Line charts as inline SVG for the HTML report: step lines over a time or wait axis, with
//! axes, ticks, a title and a text description, and no script.

use super::html::esc;
use std::fmt::Write as _;

/// The most points a series of the report keeps: a page with hundreds of charts still opens
/// quickly, and a chart a few hundred pixels wide shows no more.
pub const MAX_POINTS: usize = 300;

/// A step function given by its change points (`at`, ascending, with `values`, each value
/// holding until the next time and the last until `until`) as at most `max` steps: itself
/// when it has no more, else its time-weighted mean over `max` equal spans of `[at[0],
/// until]`.
pub fn downsample(at: &[f64], values: &[f64], until: f64, max: usize) -> Vec<(f64, f64)> {
    let n = at.len().min(values.len());
    if n <= max || max == 0 {
        return at
            .iter()
            .copied()
            .zip(values.iter().copied())
            .take(n)
            .collect();
    }
    let start = at[0];
    let span = (until - start).max(f64::EPSILON);
    let width = span / max as f64;
    let mut sums = vec![0.0; max];
    for i in 0..n {
        let (from, to) = (at[i], if i + 1 < n { at[i + 1] } else { until });
        if to <= from {
            continue;
        }
        // Spread the segment over the spans it overlaps.
        let first = (((from - start) / width) as usize).min(max - 1);
        let last = (((to - start) / width) as usize).min(max - 1);
        for (b, sum) in sums.iter_mut().enumerate().take(last + 1).skip(first) {
            let lo = from.max(start + b as f64 * width);
            let hi = to.min(start + (b + 1) as f64 * width);
            if hi > lo {
                *sum += values[i] * (hi - lo);
            }
        }
    }
    sums.iter()
        .enumerate()
        .map(|(b, s)| (start + b as f64 * width, s / width))
        .collect()
}

/// The times at which a count of things changes, from the spans they are counted over:
/// change points for [`downsample`], starting at 0.
pub fn count_over_time(spans: &[(f64, f64)]) -> (Vec<f64>, Vec<f64>) {
    let mut edges: Vec<(f64, i64)> = Vec::with_capacity(spans.len() * 2);
    for &(from, to) in spans {
        if to > from {
            edges.push((from, 1));
            edges.push((to, -1));
        }
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut at, mut values) = (vec![0.0], vec![0.0]);
    let mut count = 0i64;
    for (t, d) in edges {
        count += d;
        if at.last() == Some(&t) {
            if let Some(v) = values.last_mut() {
                *v = count as f64;
            }
        } else {
            at.push(t);
            values.push(count as f64);
        }
    }
    (at, values)
}

/// The empirical distribution of some values as at most `max` steps: `(x, share of
/// `total` at or below x)`, starting at `(0, 0)`. Values beyond `total`'s count (Jobs that
/// never started) keep the curve below 1.
pub fn cdf(mut values: Vec<f64>, total: usize, max: usize) -> Vec<(f64, f64)> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let mut out = vec![(0.0, 0.0)];
    if n == 0 || total == 0 {
        return out;
    }
    let keep = max.saturating_sub(1).max(1).min(n);
    let mut last = usize::MAX;
    for k in 1..=keep {
        // The rank at the end of the k-th of `keep` equal shares; ties end on their last.
        let mut i = (k * n).div_ceil(keep) - 1;
        while i + 1 < n && values[i + 1] == values[i] {
            i += 1;
        }
        if i == last {
            continue;
        }
        last = i;
        out.push((values[i], (i + 1) as f64 / total as f64));
    }
    out
}

/// Seconds as people read them: `45s`, `12m`, `1h30m`, `2d3h`.
pub fn duration(secs: f64) -> String {
    let s = secs.round() as i64;
    let (d, h, m, sec) = (s / 86400, s % 86400 / 3600, s % 3600 / 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(d, "d"), (h, "h"), (m, "m"), (sec, "s")] {
        if n != 0 {
            let _ = write!(out, "{n}{unit}");
        }
    }
    if out.is_empty() {
        out.push('0');
    }
    out
}

/// Round tick positions from 0 to at least `max`, at most `most` + 1 of them.
pub fn ticks(max: f64, most: usize, time: bool) -> Vec<f64> {
    let max = if max > 0.0 && max.is_finite() {
        max
    } else {
        1.0
    };
    let raw = max / most.max(1) as f64;
    let step = if time {
        const STEPS: [f64; 16] = [
            1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
            7200.0, 21600.0, 43200.0,
        ];
        STEPS
            .iter()
            .copied()
            .find(|s| *s >= raw)
            .unwrap_or_else(|| (raw / 86400.0).ceil() * 86400.0)
    } else {
        let mag = 10f64.powf(raw.log10().floor());
        [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag)
    };
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// How a strategy's (or a group's) lines look: colour and dashes, told apart in grey print
/// too.
pub const STYLES: [(&str, &str); 6] = [
    ("#1f5fa8", ""),
    ("#c45a00", "7 3"),
    ("#3b7d23", "2 2"),
    ("#7a3b9a", "9 3 2 3"),
    ("#9a2a3b", "4 4"),
    ("#4a4a4a", "1 3"),
];

/// One line of a chart.
pub struct Series {
    pub name: String,
    /// Steps: each y holds from its x until the next x, the last until `until`.
    pub steps: Vec<(f64, f64)>,
    pub until: f64,
}

/// What a chart shows and how its axes read.
pub struct LineChart<'a> {
    /// Unique in the page: the ids of its title and description derive from it.
    pub id: &'a str,
    pub title: &'a str,
    /// The chart in words, for those who cannot see it (and its caption).
    pub description: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// The x axis counts seconds (ticks at round durations).
    pub x_time: bool,
    /// The y axis is a share (0 – 1), shown as percent.
    pub y_share: bool,
    /// The least the axes reach.
    pub x_max: f64,
    pub y_max: f64,
    pub series: Vec<Series>,
}

const W: f64 = 360.0;
const H: f64 = 200.0;
const LEFT: f64 = 46.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 34.0;

impl LineChart<'_> {
    /// A `<figure>` holding the SVG and its caption.
    pub fn render(&self, out: &mut String) {
        let x_max = self
            .series
            .iter()
            .map(|s| s.until)
            .chain(self.series.iter().flat_map(|s| s.steps.iter().map(|p| p.0)))
            .fold(self.x_max, f64::max);
        let y_max = self
            .series
            .iter()
            .flat_map(|s| s.steps.iter().map(|p| p.1))
            .fold(self.y_max, f64::max);
        let xt = ticks(x_max, 5, self.x_time);
        let mut yt = ticks(y_max, 4, false);
        if !self.y_share && yt.get(1).is_some_and(|s| *s < 1.0) {
            // Counts: no ticks between whole numbers.
            yt = ticks(y_max.ceil().max(1.0), y_max.ceil().max(1.0) as usize, false);
        }
        let (x_end, y_end) = (
            xt.last().copied().unwrap_or(1.0),
            yt.last().copied().unwrap_or(1.0),
        );
        let px = |x: f64| LEFT + x / x_end * (W - LEFT - RIGHT);
        let py = |y: f64| H - BOTTOM - y / y_end * (H - TOP - BOTTOM);
        let id = esc(self.id);
        let _ = write!(
            out,
            "<figure class=\"chart\" id=\"{id}\" data-series=\"{n}\">\
             <svg viewBox=\"0 0 {W} {H}\" role=\"img\" aria-labelledby=\"{id}-t {id}-d\">\
             <title id=\"{id}-t\">{title}</title><desc id=\"{id}-d\">{desc}</desc>",
            n = self.series.len(),
            title = esc(self.title),
            desc = esc(self.description),
        );
        out.push_str("<g class=\"axes\" aria-hidden=\"true\">");
        for &y in &yt {
            let label = if self.y_share {
                format!("{}%", (y * 100.0).round())
            } else {
                number(y)
            };
            let _ = write!(
                out,
                "<line x1=\"{LEFT}\" x2=\"{x2}\" y1=\"{v:.1}\" y2=\"{v:.1}\" class=\"grid\"/>\
                 <text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>",
                x2 = W - RIGHT,
                v = py(y),
                tx = LEFT - 4.0,
                ty = py(y) + 3.5,
            );
        }
        for &x in &xt {
            let label = if self.x_time { duration(x) } else { number(x) };
            let _ = write!(
                out,
                "<line x1=\"{v:.1}\" x2=\"{v:.1}\" y1=\"{y1}\" y2=\"{y2}\" class=\"tick\"/>\
                 <text x=\"{v:.1}\" y=\"{ty}\" text-anchor=\"middle\">{label}</text>",
                v = px(x),
                y1 = H - BOTTOM,
                y2 = H - BOTTOM + 4.0,
                ty = H - BOTTOM + 14.0,
            );
        }
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{b}\" class=\"axis\"/>\
             <line x1=\"{LEFT}\" x2=\"{r}\" y1=\"{b}\" y2=\"{b}\" class=\"axis\"/>\
             <text x=\"{cx}\" y=\"{lb}\" text-anchor=\"middle\" class=\"label\">{xl}</text>\
             <text transform=\"translate(11 {cy}) rotate(-90)\" text-anchor=\"middle\" class=\"label\">{yl}</text></g>",
            b = H - BOTTOM,
            r = W - RIGHT,
            cx = (LEFT + W - RIGHT) / 2.0,
            lb = H - 4.0,
            cy = (TOP + H - BOTTOM) / 2.0,
            xl = esc(self.x_label),
            yl = esc(self.y_label),
        );
        for (i, s) in self.series.iter().enumerate() {
            let (colour, dash) = STYLES[i % STYLES.len()];
            let _ = write!(
                out,
                "<g class=\"series\" data-name=\"{name}\"><title>{name}</title><path d=\"",
                name = esc(&s.name)
            );
            let mut first = true;
            for &(x, y) in &s.steps {
                if first {
                    let _ = write!(out, "M{:.1} {:.1}", px(x), py(y));
                    first = false;
                } else {
                    let _ = write!(out, "H{:.1}V{:.1}", px(x), py(y));
                }
            }
            if !first {
                let _ = write!(out, "H{:.1}", px(s.until));
            }
            let _ = write!(out, "\" stroke=\"{colour}\"");
            if !dash.is_empty() {
                let _ = write!(out, " stroke-dasharray=\"{dash}\"");
            }
            out.push_str("/></g>");
        }
        let _ = write!(
            out,
            "</svg><figcaption><strong>{}</strong> {}</figcaption></figure>",
            esc(self.title),
            esc(self.description)
        );
    }
}

/// A figure as short as it reads well: `12`, `2.5`, `0.25`, `1.2k`, `3M`.
pub fn number(x: f64) -> String {
    let a = x.abs();
    let (v, unit) = if a >= 1e6 {
        (x / 1e6, "M")
    } else if a >= 1e4 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    let s = format!("{:.2}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_changes_stay_as_they_are() {
        let steps = downsample(&[0.0, 5.0, 9.0], &[0.0, 2.0, 1.0], 20.0, 10);
        assert_eq!(steps, vec![(0.0, 0.0), (5.0, 2.0), (9.0, 1.0)]);
    }

    #[test]
    fn many_changes_become_time_weighted_means_over_equal_spans() {
        // 0 and 1 alternating every second over 100 s: two spans of 50 s, both half used.
        let at: Vec<f64> = (0..100).map(f64::from).collect();
        let values: Vec<f64> = (0..100).map(|i| f64::from(i % 2)).collect();
        let steps = downsample(&at, &values, 100.0, 2);
        assert_eq!(steps, vec![(0.0, 0.5), (50.0, 0.5)]);
        // What the steps hold over time (the integral) is kept.
        let at: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.7).collect();
        let values: Vec<f64> = (0..1000).map(|i| f64::from(i % 7)).collect();
        let until = 800.0;
        let integral = |s: &[(f64, f64)]| -> f64 {
            s.iter()
                .enumerate()
                .map(|(i, (x, y))| (s.get(i + 1).map_or(until, |n| n.0) - x) * y)
                .sum()
        };
        let raw: Vec<(f64, f64)> = at.iter().copied().zip(values.iter().copied()).collect();
        let small = downsample(&at, &values, until, 37);
        assert_eq!(small.len(), 37);
        assert!((integral(&raw) - integral(&small)).abs() < 1e-6 * integral(&raw));
    }

    #[test]
    fn counts_over_time_rise_and_fall_with_the_spans() {
        let (at, values) = count_over_time(&[(0.0, 10.0), (5.0, 10.0), (7.0, 7.0), (20.0, 30.0)]);
        assert_eq!(at, vec![0.0, 5.0, 10.0, 20.0, 30.0]);
        assert_eq!(values, vec![1.0, 2.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn cdf_reaches_the_share_that_has_a_value() {
        // 4 of 5 Jobs started: the curve ends at 80 %.
        let c = cdf(vec![3.0, 1.0, 2.0, 2.0], 5, 100);
        assert_eq!(c, vec![(0.0, 0.0), (1.0, 0.2), (2.0, 0.6), (3.0, 0.8)]);
        // Many values: bounded, still ending at the largest.
        let c = cdf((0..10_000).map(f64::from).collect(), 10_000, 50);
        assert!(c.len() <= 50);
        assert_eq!(c.last(), Some(&(9999.0, 1.0)));
    }

    #[test]
    fn durations_and_ticks_read_well() {
        assert_eq!(duration(0.0), "0");
        assert_eq!(duration(45.0), "45s");
        assert_eq!(duration(5400.0), "1h30m");
        assert_eq!(duration(90061.0), "1d1h1m1s");
        assert_eq!(
            ticks(7000.0, 5, true),
            vec![0.0, 1800.0, 3600.0, 5400.0, 7200.0]
        );
        assert_eq!(ticks(7.0, 4, false), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(number(12345.0), "12.35k");
        assert_eq!(number(0.25), "0.25");
    }
}
