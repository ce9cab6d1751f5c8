//! `simulate --report FILE.html`: one self-contained page (inline CSS and SVG, no script, no
//! fonts or anything else fetched) showing the reports of one or more strategies on one
//! scenario: capacity in use, Jobs waiting, start waits, the summaries side by side, the
//! Jobs that did not succeed, the largest gangs' timelines and the scenario's inputs.

use super::chart::{self, LineChart, Series};
use super::{figures, kinds, Report};
use crate::simulate::{Scenario, ScenarioJob};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Jobs listed per strategy among those that did not succeed; the rest are counted.
pub const LISTED_JOBS: usize = 50;
/// Gangs shown on the timeline.
pub const GANGS: usize = 8;
/// Points a page's capacity charts hold at most in all: many clusters get fewer points per
/// line.
const CAPACITY_POINTS: usize = 30_000;

/// Text made safe for HTML text and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page, for the reports of `scenario` (one per strategy, in the order given) and the
/// scenario's name as the reader knows it (its path).
pub fn render(scenario: &Scenario, reports: &[Report], source: &str) -> String {
    let mut out = String::with_capacity(256 * 1024);
    let strategies: Vec<&str> = reports.iter().map(|r| r.strategy.as_str()).collect();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <title>Switchyard simulation: {src}</title><style>{CSS}</style></head><body>\
         <header><h1>Switchyard simulation report</h1>\
         <p>Scenario <code>{src}</code>: {clusters} clusters, {nodes} nodes, {queues} queues, {jobs} Jobs. \
         Strategies: {strats}.</p>",
        src = esc(source),
        clusters = scenario.inventory.clusters.len(),
        nodes = scenario
            .inventory
            .clusters
            .iter()
            .map(|c| c.nodes.len())
            .sum::<usize>(),
        queues = scenario.queues.len(),
        jobs = scenario.jobs.len(),
        strats = esc(&strategies.join(", ")),
    );
    out.push_str(
        "<nav aria-label=\"Sections\"><ul><li><a href=\"#summary\">Summary</a></li>\
         <li><a href=\"#capacity\">Capacity in use</a></li><li><a href=\"#waiting\">Jobs waiting</a></li>\
         <li><a href=\"#start-wait\">Start waits</a></li><li><a href=\"#gangs\">Largest gangs</a></li>\
         <li><a href=\"#breakdown\">Per queue and kind</a></li>\
         <li><a href=\"#not-succeeded\">Jobs that did not succeed</a></li>\
         <li><a href=\"#inputs\">Scenario</a></li></ul></nav></header><main>",
    );
    summary(&mut out, reports, false);
    let ends: Vec<f64> = reports.iter().map(end_of_run).collect();
    capacity(&mut out, reports, &ends);
    waiting(&mut out, scenario, reports, &ends);
    start_waits(&mut out, scenario, reports);
    gangs(&mut out, scenario, reports, &ends);
    summary(&mut out, reports, true);
    not_succeeded(&mut out, reports);
    inputs(&mut out, scenario);
    out.push_str("</main></body></html>\n");
    out
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;color:#1a1a1a;margin:0 auto;max-width:1200px;padding:0 16px}\
h1{font-size:1.6em;margin:.6em 0 .2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}\
nav ul{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.4em 1.2em}\
table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;font-weight:600;padding:.3em 0}\
th,td{border:1px solid #ddd;padding:1px 8px;line-height:1.3;text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}\
td.best{background:#e3f1de;font-weight:700}.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}\
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:12px}\
figure{margin:0;break-inside:avoid}figure svg{width:100%;height:auto;display:block}figcaption{font-size:12px;color:#333}\
svg text{font-size:10px;fill:#333}svg .label{font-size:10px;fill:#555}svg .grid{stroke:#e6e6e6}svg .tick,svg .axis{stroke:#888}\
svg .series path{fill:none;stroke-width:1.6}\
.legend{list-style:none;padding:0;display:flex;gap:1.2em;flex-wrap:wrap}.legend svg{vertical-align:middle}\
.timeline rect.wait{opacity:.35}.timeline rect.start{opacity:.65}\
@media print{body{max-width:none;font-size:11px}nav{display:none}h2{break-after:avoid}}";

/// The last time anything in the report happened.
fn end_of_run(r: &Report) -> f64 {
    let mut end = r.summary.makespan.as_f64().unwrap_or(0.0);
    for j in &r.jobs {
        for v in [&j.submitted, &j.admitted, &j.started, &j.finished] {
            end = end.max(v.as_f64().unwrap_or(0.0));
        }
    }
    for c in &r.capacity {
        end = end.max(c.until);
    }
    end
}

/// A legend of the lines of a section's charts.
fn legend(out: &mut String, names: &[&str]) {
    out.push_str("<ul class=\"legend\" aria-label=\"Lines\">");
    for (i, name) in names.iter().enumerate() {
        let (colour, dash) = chart::STYLES[i % chart::STYLES.len()];
        let _ = write!(
            out,
            "<li><svg width=\"30\" height=\"10\" aria-hidden=\"true\"><line x1=\"0\" x2=\"30\" y1=\"5\" y2=\"5\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/></svg> {}</li>",
            esc(name)
        );
    }
    out.push_str("</ul>");
}

/// Which way a summary figure is better, from its name (see [`figures`]), if either way is.
fn better(label: &str) -> Option<bool> {
    let last = label.rsplit(' ').next().unwrap_or(label);
    let lower = Some(false);
    if label.starts_with("utilization") || label.contains("goodput") || last == "succeeded" {
        return Some(true);
    }
    if label.starts_with("maxQuotaUsage") || last == "jobs" {
        return None;
    }
    if matches!(last, "failed" | "pending" | "deactivated")
        || label.contains("startWait")
        || label.contains("completionTime")
        || label.starts_with("topologyAffinityErrors")
        || matches!(label, "makespan" | "meanWait" | "remoteWritesPerJob")
    {
        return lower;
    }
    None
}

/// The strategies whose value is the best of a row: only when there are two values or more
/// to compare and they differ.
fn best_of(label: &str, values: &[&str]) -> Vec<bool> {
    let nums: Vec<Option<f64>> = values.iter().map(|v| v.parse::<f64>().ok()).collect();
    let (Some(higher), true) = (better(label), nums.iter().flatten().count() >= 2) else {
        return vec![false; values.len()];
    };
    let pick = if higher { f64::max } else { f64::min };
    let best = nums
        .iter()
        .flatten()
        .copied()
        .reduce(pick)
        .unwrap_or(f64::NAN);
    let all_equal =
        nums.iter().flatten().all(|v| *v == best) && nums.iter().flatten().count() == nums.len();
    nums.iter()
        .map(|v| !all_equal && *v == Some(best))
        .collect()
}

/// The figures of the JSON summary side by side: those of the whole run, or (`breakdown`)
/// those per queue and per kind.
fn summary(out: &mut String, reports: &[Report], breakdown: bool) {
    let of_part = |label: &str| label.starts_with("byQueue ") || label.starts_with("byKind ");
    let columns: Vec<Vec<(String, String)>> = reports
        .iter()
        .map(|r| {
            figures(r)
                .into_iter()
                .filter(|(label, _)| of_part(label) == breakdown)
                .collect()
        })
        .collect();
    let (id, heading, what) = if breakdown {
        ("breakdown", "Per queue and kind", "per queue and per kind")
    } else {
        ("summary", "Summary", "of the whole run")
    };
    let _ = write!(out, "<section id=\"{id}\"><h2>{heading}</h2>");
    let mut labels: Vec<&str> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (label, _) in columns.iter().flatten() {
        if seen.insert(label.as_str()) {
            labels.push(label);
        }
    }
    let _ = write!(
        out,
        "<table class=\"summary\"><caption>The JSON summary's figures {what} (each named by its \
         path in the summary), per strategy; in a row where one way is better, the best value is marked ✓.</caption>\
         <thead><tr><th scope=\"col\">Figure</th>",
    );
    for r in reports {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(&r.strategy));
    }
    out.push_str("</tr></thead><tbody>");
    for label in labels {
        let values: Vec<&str> = columns
            .iter()
            .map(|c| {
                c.iter()
                    .find(|(l, _)| l == label)
                    .map_or("-", |(_, v)| v.as_str())
            })
            .collect();
        let best = best_of(label, &values);
        let _ = write!(out, "<tr><th scope=\"row\">{}</th>", esc(label));
        for (v, b) in values.iter().zip(best) {
            if b {
                let _ = write!(
                    out,
                    "<td class=\"n best\">{} <span aria-hidden=\"true\">✓</span><span class=\"sr\">(best)</span></td>",
                    esc(v)
                );
            } else {
                let _ = write!(out, "<td class=\"n\">{}</td>", esc(v));
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

/// Per strategy, a list joined for a description: `switchyard 40%, all-at-once 35%`.
fn per_strategy(reports: &[Report], mut f: impl FnMut(usize) -> String) -> String {
    (0..reports.len())
        .map(|i| format!("{} {}", reports[i].strategy, f(i)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn capacity(out: &mut String, reports: &[Report], ends: &[f64]) {
    out.push_str(
        "<section id=\"capacity\"><h2>Capacity in use</h2>\
         <p>Per cluster and resource, the share of its allocatable amount that running pods \
         request, over time; averaged over equal spans of time where the run changed it more \
         often than a chart shows.</p>",
    );
    let names: Vec<&str> = reports.iter().map(|r| r.strategy.as_str()).collect();
    legend(out, &names);
    // The charts in the first report's order; every report has the same clusters.
    let mut keys: Vec<(&str, &str, i64)> = Vec::new();
    for r in reports {
        for c in &r.capacity {
            if !keys
                .iter()
                .any(|(k, res, _)| *k == c.cluster && *res == c.resource)
            {
                keys.push((&c.cluster, &c.resource, c.allocatable));
            }
        }
    }
    if keys.is_empty() {
        out.push_str("<p>No usage was recorded.</p></section>");
        return;
    }
    let budget =
        (CAPACITY_POINTS / (keys.len() * reports.len()).max(1)).clamp(60, chart::MAX_POINTS);
    out.push_str("<div class=\"grid\">");
    for (n, (cluster, resource, allocatable)) in keys.iter().enumerate() {
        let mut series = Vec::new();
        let mut means = Vec::new();
        for (r, end) in reports.iter().zip(ends) {
            let c = r
                .capacity
                .iter()
                .find(|c| c.cluster == *cluster && c.resource == *resource);
            let (at, values): (Vec<f64>, Vec<f64>) = c
                .map(|c| {
                    c.steps
                        .iter()
                        .map(|(t, v)| (*t, *v / *allocatable as f64))
                        .unzip()
                })
                .unwrap_or_else(|| (vec![0.0], vec![0.0]));
            let until = c.map_or(*end, |c| c.until);
            let steps = chart::downsample(&at, &values, until, budget);
            means.push(mean_of(&steps, until));
            series.push(Series {
                name: r.strategy.clone(),
                steps,
                until,
            });
        }
        let title = format!("{cluster} · {resource}");
        let description = format!(
            "Share of the {} {resource} allocatable in {cluster} in use over time. Mean over each run: {}.",
            amount(resource, *allocatable),
            per_strategy(reports, |i| format!("{:.0}%", means[i] * 100.0))
        );
        LineChart {
            id: &format!("cap-{n}"),
            title: &title,
            description: &description,
            x_label: "time",
            y_label: "in use",
            x_time: true,
            y_share: true,
            x_max: 0.0,
            y_max: 1.0,
            series,
        }
        .render(out);
    }
    out.push_str("</div></section>");
}

/// The time-weighted mean of steps over `[0, until]`.
fn mean_of(steps: &[(f64, f64)], until: f64) -> f64 {
    if until <= 0.0 {
        return 0.0;
    }
    let mut sum = 0.0;
    for (i, (t, v)) in steps.iter().enumerate() {
        let next = steps.get(i + 1).map_or(until, |s| s.0);
        sum += v * (next - t).max(0.0);
    }
    sum / until
}

/// An allocatable amount (thousandths) in the resource's unit.
fn amount(resource: &str, milli: i64) -> String {
    let v = milli as f64 / 1000.0;
    if super::in_bytes(resource) {
        format!("{} GiB", chart::number(v / (1u64 << 30) as f64))
    } else {
        chart::number(v)
    }
}

fn waiting(out: &mut String, scenario: &Scenario, reports: &[Report], ends: &[f64]) {
    out.push_str(
        "<section id=\"waiting\"><h2>Jobs waiting</h2>\
         <p>Jobs submitted and not yet started (all their pods Ready), over time, per queue and \
         per kind; a Job that never started waits until it failed or the run ended.</p>",
    );
    let names: Vec<&str> = reports.iter().map(|r| r.strategy.as_str()).collect();
    legend(out, &names);
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    let mut by_queue: BTreeMap<&str, Vec<usize>> = scenario
        .queues
        .iter()
        .map(|(q, _)| (q.as_str(), Vec::new()))
        .collect();
    let mut by_kind: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, j) in scenario.jobs.iter().enumerate() {
        by_queue.entry(&j.queue).or_default().push(i);
        for k in kinds(j) {
            by_kind.entry(k).or_default().push(i);
        }
    }
    groups.extend(by_queue.into_iter().map(|(q, v)| (format!("queue {q}"), v)));
    groups.extend(by_kind.into_iter().map(|(k, v)| (format!("kind {k}"), v)));
    out.push_str("<div class=\"grid\">");
    for (n, (group, members)) in groups.iter().enumerate() {
        let mut series = Vec::new();
        let mut most = Vec::new();
        for (r, end) in reports.iter().zip(ends) {
            let spans: Vec<(f64, f64)> = members
                .iter()
                .filter_map(|&i| {
                    let j = r.jobs.get(i)?;
                    let from = j.submitted.as_f64()?;
                    let to = j
                        .started
                        .as_f64()
                        .or_else(|| j.finished.as_f64())
                        .unwrap_or(*end);
                    Some((from, to))
                })
                .collect();
            let (at, values) = chart::count_over_time(&spans);
            most.push(values.iter().copied().fold(0.0, f64::max));
            series.push(Series {
                name: r.strategy.clone(),
                steps: chart::downsample(&at, &values, *end, chart::MAX_POINTS),
                until: *end,
            });
        }
        let title = format!("Jobs waiting, {group}");
        let description = format!(
            "Jobs of {group} ({} in all) submitted and not yet started, over time. Most at once: {}.",
            members.len(),
            per_strategy(reports, |i| chart::number(most[i]))
        );
        LineChart {
            id: &format!("wait-{n}"),
            title: &title,
            description: &description,
            x_label: "time",
            y_label: "Jobs waiting",
            x_time: true,
            y_share: false,
            x_max: 0.0,
            y_max: 1.0,
            series,
        }
        .render(out);
    }
    out.push_str("</div></section>");
}

fn start_waits(out: &mut String, scenario: &Scenario, reports: &[Report]) {
    out.push_str(
        "<section id=\"start-wait\"><h2>Start waits</h2>\
         <p>The share of Jobs that started within a given wait after their submission \
         (started − submitted), overall and per kind; a curve that stays below 100% is the \
         share that never started.</p>",
    );
    let names: Vec<&str> = reports.iter().map(|r| r.strategy.as_str()).collect();
    legend(out, &names);
    let mut groups: Vec<(String, Vec<usize>)> =
        vec![("all Jobs".into(), (0..scenario.jobs.len()).collect())];
    let mut by_kind: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, j) in scenario.jobs.iter().enumerate() {
        for k in kinds(j) {
            by_kind.entry(k).or_default().push(i);
        }
    }
    groups.extend(by_kind.into_iter().map(|(k, v)| (format!("{k} Jobs"), v)));
    out.push_str("<div class=\"grid\">");
    for (n, (group, members)) in groups.iter().enumerate() {
        let mut series = Vec::new();
        let mut medians = Vec::new();
        let mut started = Vec::new();
        for r in reports {
            let waits: Vec<f64> = members
                .iter()
                .filter_map(|&i| {
                    let j = r.jobs.get(i)?;
                    Some(j.started.as_f64()? - j.submitted.as_f64()?)
                })
                .collect();
            started.push(waits.len());
            let mut sorted = waits.clone();
            sorted.sort_by(f64::total_cmp);
            medians.push(if members.len() / 2 < sorted.len() {
                chart::duration(sorted[members.len() / 2])
            } else {
                "never (fewer than half started)".into()
            });
            let steps = chart::cdf(waits, members.len(), chart::MAX_POINTS);
            let until = steps.last().map_or(0.0, |s| s.0);
            series.push(Series {
                name: r.strategy.clone(),
                steps,
                until,
            });
        }
        let title = format!("Start waits, {group}");
        let description = format!(
            "Share of the {} {group} started within a wait. Median wait: {}. Started: {}.",
            members.len(),
            per_strategy(reports, |i| medians[i].clone()),
            per_strategy(reports, |i| started[i].to_string())
        );
        LineChart {
            id: &format!("sw-{n}"),
            title: &title,
            description: &description,
            x_label: "wait",
            y_label: "Jobs started",
            x_time: true,
            y_share: true,
            x_max: 1.0,
            y_max: 1.0,
            series,
        }
        .render(out);
    }
    out.push_str("</div></section>");
}

/// The largest gangs (pods that must run together), most pods first, then the earliest.
fn largest_gangs(scenario: &Scenario) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scenario.jobs.len()).collect();
    let pods = ScenarioJob::pods;
    order.sort_by(|&a, &b| {
        let (ja, jb) = (&scenario.jobs[a], &scenario.jobs[b]);
        pods(jb)
            .cmp(&pods(ja))
            .then(ja.submit_at.cmp(&jb.submit_at))
            .then(a.cmp(&b))
    });
    order.truncate(GANGS);
    order
}

fn gangs(out: &mut String, scenario: &Scenario, reports: &[Report], ends: &[f64]) {
    out.push_str(
        "<section id=\"gangs\"><h2>Largest gangs</h2>\
         <p>The Jobs with the most pods that must run together: a bar per strategy from \
         submission to admission (faint), admission to start (all pods Ready, half-tone) and \
         start to finish (solid).</p>",
    );
    let names: Vec<&str> = reports.iter().map(|r| r.strategy.as_str()).collect();
    legend(out, &names);
    let chosen = largest_gangs(scenario);
    let end = ends.iter().copied().fold(1.0, f64::max);
    let ticks = chart::ticks(end, 6, true);
    let x_end = ticks.last().copied().unwrap_or(1.0);
    let (left, width, row, top) = (170.0, 720.0, 11.0, 8.0);
    let rows_per_gang = reports.len() as f64 + 0.8;
    let height = top + chosen.len() as f64 * rows_per_gang * row + 30.0;
    let px = |t: f64| left + t / x_end * (width - left - 10.0);
    let mut text = Vec::new();
    let mut labels = String::new();
    let mut bars: Vec<String> = vec![String::new(); reports.len()];
    for (g, &i) in chosen.iter().enumerate() {
        let j = &scenario.jobs[i];
        let y0 = top + g as f64 * rows_per_gang * row;
        let pods = j.pods();
        let _ = write!(
            labels,
            "<text x=\"4\" y=\"{:.1}\">{} ({pods} pods)</text>",
            y0 + row * reports.len() as f64 / 2.0 + 3.5,
            esc(&j.key().to_string()),
        );
        let mut said = Vec::new();
        for (s, r) in reports.iter().enumerate() {
            let Some(jr) = r.jobs.get(i) else { continue };
            let y = y0 + s as f64 * row;
            let sub = jr.submitted.as_f64().unwrap_or(0.0);
            let adm = jr.admitted.as_f64();
            let sta = jr.started.as_f64();
            let fin = jr.finished.as_f64();
            let stop = fin.unwrap_or(ends[s]);
            let tip = esc(&format!(
                "{}, {}: submitted {}, admitted {}, started {}, finished {} ({})",
                jr.name,
                r.strategy,
                chart::duration(sub),
                adm.map_or("never".into(), chart::duration),
                sta.map_or("never".into(), chart::duration),
                fin.map_or("never".into(), chart::duration),
                jr.result
            ));
            let segments = [
                ("wait", Some(sub), adm.or(Some(stop))),
                ("start", adm, sta.or(adm.map(|_| stop))),
                ("run", sta, sta.map(|_| stop)),
            ];
            let (colour, _) = chart::STYLES[s % chart::STYLES.len()];
            for (class, from, to) in segments {
                let (Some(from), Some(to)) = (from, to) else {
                    continue;
                };
                let _ = write!(
                    bars[s],
                    "<rect class=\"{class}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"><title>{tip}</title></rect>",
                    px(from),
                    y + 1.0,
                    (px(to) - px(from)).max(0.8),
                    row - 2.0
                );
            }
            said.push(format!(
                "{} started {} ({})",
                r.strategy,
                sta.map_or("never".into(), |t| format!(
                    "after {}",
                    chart::duration(t - sub)
                )),
                jr.result
            ));
        }
        text.push(format!("{}: {}", j.name, said.join(", ")));
    }
    let description = if text.is_empty() {
        "No Jobs.".to_string()
    } else {
        format!("{}.", text.join("; "))
    };
    let _ = write!(
        out,
        "<figure class=\"chart timeline\" id=\"gang-timeline\" data-series=\"{n}\">\
         <svg viewBox=\"0 0 {width} {height:.0}\" role=\"img\" aria-labelledby=\"gang-t gang-d\">\
         <title id=\"gang-t\">Largest gangs: submitted, admitted, started, finished</title>\
         <desc id=\"gang-d\">{desc}</desc><g aria-hidden=\"true\">{labels}",
        n = reports.len(),
        desc = esc(&description),
    );
    let axis_y = height - 24.0;
    for &t in &ticks {
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{top}\" y2=\"{axis_y:.1}\" class=\"grid\"/>\
             <text x=\"{x:.1}\" y=\"{ty:.1}\" text-anchor=\"middle\">{}</text>",
            chart::duration(t),
            x = px(t),
            ty = axis_y + 12.0,
        );
    }
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"label\">time</text></g>",
        (left + width) / 2.0,
        height - 2.0
    );
    for (r, b) in reports.iter().zip(&bars) {
        let _ = write!(
            out,
            "<g class=\"series\" data-name=\"{name}\"><title>{name}</title>{b}</g>",
            name = esc(&r.strategy)
        );
    }
    let _ = write!(
        out,
        "</svg><figcaption><strong>Largest gangs</strong> {}</figcaption></figure></section>",
        esc(&description)
    );
}

fn not_succeeded(out: &mut String, reports: &[Report]) {
    out.push_str("<section id=\"not-succeeded\"><h2>Jobs that did not succeed</h2>");
    for r in reports {
        let failing: Vec<&super::JobReport> =
            r.jobs.iter().filter(|j| j.result != "Succeeded").collect();
        let _ = write!(
            out,
            "<h3>{}: {} of {} Jobs</h3>",
            esc(&r.strategy),
            failing.len(),
            r.jobs.len()
        );
        if failing.is_empty() {
            out.push_str("<p>Every Job succeeded.</p>");
            continue;
        }
        // The reasons, most frequent first: at scale many Jobs share one.
        let mut reasons: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for j in &failing {
            *reasons
                .entry((j.result.as_str(), j.reason.as_deref().unwrap_or("")))
                .or_default() += 1;
        }
        let mut reasons: Vec<((&str, &str), usize)> = reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        if failing.len() > LISTED_JOBS {
            let _ = write!(
                out,
                "<table><caption>{}: the most frequent reasons</caption><thead><tr>\
                 <th scope=\"col\">Jobs</th><th scope=\"col\">Result</th><th scope=\"col\">Reason</th></tr></thead><tbody>",
                esc(&r.strategy)
            );
            for ((result, reason), n) in reasons.iter().take(10) {
                let _ = write!(
                    out,
                    "<tr><td class=\"n\">{n}</td><td>{}</td><td>{}</td></tr>",
                    esc(result),
                    esc(reason)
                );
            }
            out.push_str("</tbody></table>");
        }
        // Failed and deactivated Jobs first: they are rarer than pending ones and were given
        // up on.
        let mut listed = failing.clone();
        listed.sort_by_key(|j| j.result == "Pending");
        let _ = write!(
            out,
            "<table class=\"jobs\"><caption>{}: Jobs that did not succeed, and why</caption><thead><tr>\
             <th scope=\"col\">Job</th><th scope=\"col\">Queue</th><th scope=\"col\">Result</th>\
             <th scope=\"col\">Requeues</th><th scope=\"col\">Reason</th></tr></thead><tbody>",
            esc(&r.strategy)
        );
        for j in listed.iter().take(LISTED_JOBS) {
            let _ = write!(
                out,
                "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&j.title()),
                esc(&j.queue),
                esc(&j.result),
                j.requeues,
                esc(j.reason.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</tbody></table>");
        if listed.len() > LISTED_JOBS {
            let _ = write!(
                out,
                "<p>… and {} more not listed (<code>--output json</code> has every Job).</p>",
                listed.len() - LISTED_JOBS
            );
        }
    }
    out.push_str("</section>");
}

/// Clusters listed in the inputs at most; the rest are counted.
const LISTED_CLUSTERS: usize = 100;

fn inputs(out: &mut String, scenario: &Scenario) {
    out.push_str("<section id=\"inputs\"><h2>Scenario</h2>");
    clusters_table(out, scenario);
    queues_table(out, scenario);
    jobs_line(out, scenario);
    out.push_str("</section>");
}

/// The clusters: nodes, the resources Jobs request, the nodes' Topology Manager policies and
/// the scheduler.
fn clusters_table(out: &mut String, scenario: &Scenario) {
    let inv = &scenario.inventory;
    let requested: std::collections::BTreeSet<&str> = scenario
        .jobs
        .iter()
        .flat_map(|j| j.pod.node_request.keys().map(String::as_str))
        .collect();
    let shown: Vec<(usize, &str)> = requested
        .iter()
        .filter_map(|r| Some((inv.resources.id(r)?, *r)))
        .collect();
    out.push_str(
        "<table><caption>Clusters: nodes, allocatable resources (those Jobs request), \
         Topology Manager policies of their nodes, scheduler</caption><thead><tr><th scope=\"col\">Cluster</th>\
         <th scope=\"col\">Nodes</th>",
    );
    for (_, r) in &shown {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(r));
    }
    out.push_str("<th scope=\"col\">Policies (nodes)</th><th scope=\"col\">Scheduler</th></tr></thead><tbody>");
    for (i, c) in inv.clusters.iter().enumerate().take(LISTED_CLUSTERS) {
        let _ = write!(
            out,
            "<tr><th scope=\"row\">{}</th><td class=\"n\">{}</td>",
            esc(&c.name),
            c.nodes.len()
        );
        for (id, r) in &shown {
            let milli = c.summary.allocatable.get(*id).copied().unwrap_or(0);
            let _ = write!(out, "<td class=\"n\">{}</td>", esc(&amount(r, milli)));
        }
        let mut policies: BTreeMap<String, usize> = BTreeMap::new();
        for n in &c.nodes {
            let p = n.numa.as_ref().map_or_else(
                || "no NUMA data".to_string(),
                |t| format!("{} ({:?} scope)", t.policy, t.scope).to_lowercase(),
            );
            *policies.entry(p).or_default() += 1;
        }
        let policies: Vec<String> = policies
            .into_iter()
            .map(|(p, n)| format!("{p}: {n}"))
            .collect();
        let scheduler = scenario
            .scheduler_names
            .get(i)
            .and_then(Option::as_deref)
            .unwrap_or("default (NUMA-unaware)");
        let _ = write!(
            out,
            "<td>{}</td><td>{}</td></tr>",
            esc(&policies.join(", ")),
            esc(scheduler)
        );
    }
    out.push_str("</tbody></table>");
    if inv.clusters.len() > LISTED_CLUSTERS {
        let _ = write!(
            out,
            "<p>… and {} more clusters.</p>",
            inv.clusters.len() - LISTED_CLUSTERS
        );
    }
}

/// The queues: clusters, quota, waitForPodsReady, placement, queueing and Jobs.
fn queues_table(out: &mut String, scenario: &Scenario) {
    let mut jobs_of: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for j in &scenario.jobs {
        let e = jobs_of.entry(&j.queue).or_default();
        e.0 += 1;
        e.1 += u64::from(j.parallelism);
    }
    out.push_str(
        "<table><caption>Queues</caption><thead><tr><th scope=\"col\">Queue</th>\
         <th scope=\"col\">Clusters</th><th scope=\"col\">Quota</th><th scope=\"col\">Waits for pods Ready</th>\
         <th scope=\"col\">Placement</th><th scope=\"col\">Queueing</th><th scope=\"col\">Jobs</th></tr></thead><tbody>",
    );
    for (name, q) in &scenario.queues {
        let mut clusters = q.clusters.clone();
        if clusters.len() > 12 {
            let more = clusters.len() - 12;
            clusters.truncate(12);
            clusters.push(format!("… {more} more"));
        }
        let quota = q.quota.as_ref().map_or_else(
            || "all of its clusters".to_string(),
            |m| {
                m.iter()
                    .map(|(r, v)| format!("{r} {}", amount(r, v.0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        let ready = q.wait_for_pods_ready.as_ref().map_or_else(
            || "no".to_string(),
            |w| {
                format!(
                    "timeout {}, requeued {}",
                    chart::duration(w.timeout.as_secs_f64()),
                    w.requeuing
                        .limit
                        .map_or("without limit".to_string(), |l| format!(
                            "at most {l} times"
                        ))
                )
            },
        );
        let (jobs, pods) = jobs_of.get(name.as_str()).copied().unwrap_or_default();
        let _ = write!(
            out,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td><td>{:?}</td><td>{:?}</td><td class=\"n\">{jobs} ({pods} pods)</td></tr>",
            esc(name),
            esc(&clusters.join(", ")),
            esc(&quota),
            esc(&ready),
            q.strategy,
            q.queueing,
        );
    }
    out.push_str("</tbody></table>");
}

/// The Jobs in one line: how many, when, of which kinds, how wide.
fn jobs_line(out: &mut String, scenario: &Scenario) {
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for j in &scenario.jobs {
        for k in kinds(j) {
            *by_kind.entry(k).or_default() += 1;
        }
    }
    let first = scenario
        .jobs
        .iter()
        .map(|j| j.submit_at)
        .min()
        .unwrap_or_default();
    let last = scenario
        .jobs
        .iter()
        .map(|j| j.submit_at)
        .max()
        .unwrap_or_default();
    let widest = scenario
        .jobs
        .iter()
        .map(|j| j.parallelism)
        .max()
        .unwrap_or(0);
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = write!(
        out,
        "<p>Jobs: {} submitted from {} to {}; by kind: {}; up to {widest} pods in parallel.</p>",
        scenario.jobs.len(),
        chart::duration(first.as_secs_f64()),
        chart::duration(last.as_secs_f64()),
        esc(&kinds.join(", ")),
    );
}

#[cfg(test)]
mod tests;
