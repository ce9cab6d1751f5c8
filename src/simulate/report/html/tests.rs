use super::*;
use crate::simulate::{scenario, Simulation, Strategy};
use serde_json::Value;

fn bundled() -> Scenario {
    scenario::parse(scenario::BUNDLED).unwrap()
}

fn reports(scenario: &Scenario, strategies: &[Strategy]) -> Vec<Report> {
    strategies
        .iter()
        .map(|s| Simulation::new(scenario, *s).with_usage_history().run())
        .collect()
}

/// The charts of the page: each `<figure class="chart…">` with its id and its text.
fn charts(page: &str) -> Vec<(String, &str)> {
    page.split("<figure class=\"chart")
        .skip(1)
        .map(|part| {
            let body = &part[..part.find("</figure>").unwrap()];
            let id = body.split("id=\"").nth(1).unwrap();
            (id[..id.find('"').unwrap()].to_string(), body)
        })
        .collect()
}

/// The elements HTML allows without a closing tag that the page uses.
const VOID: [&str; 3] = ["meta", "br", "hr"];

/// Every tag closed in order (the page writes SVG's empty elements as `<x/>`), every
/// attribute quoted, no `<` or `&` loose in text.
fn assert_well_formed(page: &str) {
    let body = page
        .strip_prefix("<!DOCTYPE html>\n")
        .expect("a doctype first");
    let mut open: Vec<&str> = Vec::new();
    let mut rest = body;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].contains(&entity),
                "a loose & in {text:?}"
            );
        }
        let gt = rest[lt..].find('>').expect("a tag that ends") + lt;
        let tag = &rest[lt + 1..gt];
        assert!(!tag.contains('<'), "a < inside tag {tag:?}");
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "unbalanced quotes in {tag:?}"
        );
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name), "</{name}> closes something else");
        } else if !tag.ends_with('/') {
            let name = tag.split([' ', '\n']).next().unwrap();
            if !VOID.contains(&name) {
                open.push(name);
            }
        }
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "left open: {open:?}");
}

#[test]
fn the_bundled_example_has_a_capacity_chart_per_cluster_and_resource_with_a_line_per_strategy() {
    let scenario = bundled();
    let reports = reports(&scenario, &Strategy::ALL);
    let page = render(&scenario, &reports, "bundled");
    // The resources some Job requests that a cluster has.
    let requested: std::collections::BTreeSet<&String> = scenario
        .jobs
        .iter()
        .flat_map(|j| j.pod.node_request.keys())
        .collect();
    let inv = &scenario.inventory;
    let mut expected = Vec::new();
    for c in &inv.clusters {
        for r in &requested {
            let id = inv.resources.id(r).unwrap();
            if c.summary.allocatable.get(id).copied().unwrap_or(0) > 0 {
                expected.push(format!("{} · {}", c.name, r));
            }
        }
    }
    let charts = charts(&page);
    let capacity: Vec<&(String, &str)> = charts
        .iter()
        .filter(|(id, _)| id.starts_with("cap-"))
        .collect();
    let titles: Vec<String> = capacity
        .iter()
        .map(|(_, body)| {
            let t = body.split("<title id=").nth(1).unwrap();
            let t = &t[t.find('>').unwrap() + 1..];
            t[..t.find('<').unwrap()].to_string()
        })
        .collect();
    assert_eq!(titles, expected);
    for (id, body) in &charts {
        // Every chart: a line (or a bar group) per strategy, each named after it.
        assert!(body.contains("data-series=\"3\""), "{id}");
        assert_eq!(body.matches("<g class=\"series\"").count(), 3, "{id}");
        for s in Strategy::ALL {
            assert!(
                body.contains(&format!("data-name=\"{}\"", s.as_str())),
                "{id}"
            );
        }
    }
    // Waiting: a chart per queue and per kind; start waits: overall and per kind.
    let kinds = ["cpu-only", "nvidia.com/gpu"];
    let waiting = charts
        .iter()
        .filter(|(id, _)| id.starts_with("wait-"))
        .count();
    assert_eq!(waiting, scenario.queues.len() + kinds.len());
    let starts = charts
        .iter()
        .filter(|(id, _)| id.starts_with("sw-"))
        .count();
    assert_eq!(starts, 1 + kinds.len());
    for k in kinds {
        assert!(page.contains(&format!("Start waits, {k} Jobs")), "{k}");
    }
    assert_eq!(
        charts
            .iter()
            .filter(|(id, _)| id == "gang-timeline")
            .count(),
        1
    );
}

#[test]
fn a_capacity_line_is_what_the_worker_s_pods_requested() {
    // The mean over the run of the chart's line of gpu-east's GPUs is the utilization's own
    // integral for that one resource.
    let scenario = bundled();
    let report = &reports(&scenario, &[Strategy::Switchyard])[0];
    let c = report
        .capacity
        .iter()
        .find(|c| c.cluster == "gpu-east" && c.resource == "nvidia.com/gpu")
        .unwrap();
    let makespan = report.summary.makespan.as_f64().unwrap();
    let gpu_hours: f64 = mean_of(&c.steps, c.until) * c.until / 1000.0 / 3600.0;
    // train-b's 2 pods × 2 GPUs ran in gpu-east for 20 minutes: what was in use there.
    let ran = report
        .summary
        .by_queue
        .get("training")
        .and_then(|b| b.goodput.get("nvidia.com/gpu"))
        .and_then(Value::as_f64)
        .unwrap();
    assert!(c.until >= makespan);
    assert!(
        gpu_hours > 0.0 && gpu_hours <= ran + 1e-9,
        "{gpu_hours} {ran}"
    );
    assert!(c.steps.iter().all(|(_, v)| *v <= c.allocatable as f64));
}

#[test]
fn the_better_value_of_each_row_is_marked() {
    let scenario = bundled();
    let reports = reports(&scenario, &Strategy::ALL);
    let page = render(&scenario, &reports, "bundled");
    let row = |label: &str| -> Vec<(String, bool)> {
        let start = page
            .find(&format!("<th scope=\"row\">{label}</th>"))
            .unwrap_or_else(|| panic!("no row {label}"));
        let tr = &page[start..start + page[start..].find("</tr>").unwrap()];
        tr.split("<td class=\"n")
            .skip(1)
            .map(|cell| {
                let v = &cell[cell.find('>').unwrap() + 1..];
                let v = v[..v.find(['<', ' ']).unwrap()].to_string();
                (v, cell.starts_with(" best"))
            })
            .collect()
    };
    // Fewer TopologyAffinityErrors is better: the least is marked, and only it.
    let errors: Vec<u64> = reports
        .iter()
        .map(|r| r.summary.topology_affinity_errors)
        .collect();
    let least = *errors.iter().min().unwrap();
    assert!(
        errors.iter().any(|e| *e != least),
        "the example tells them apart"
    );
    for ((v, marked), e) in row("topologyAffinityErrors").iter().zip(&errors) {
        assert_eq!(v, &e.to_string());
        assert_eq!(*marked, *e == least, "{v}");
    }
    // More succeeded is better.
    let most = reports.iter().map(|r| r.summary.succeeded).max().unwrap();
    for ((_, marked), r) in row("succeeded").iter().zip(&reports) {
        assert_eq!(*marked, r.summary.succeeded == most);
    }
    // The same value everywhere, or a count with no better way: nothing marked.
    assert!(row("jobs").iter().all(|(_, m)| !m));
    assert!(row("pending").iter().all(|(_, m)| !m));
    assert!(!page.contains("<th scope=\"row\">byQueue batch jobs</th><td class=\"n best"));
}

#[test]
fn what_users_wrote_is_escaped() {
    let scenario = bundled();
    let mut reports = reports(&scenario, &[Strategy::Switchyard]);
    let failed = reports[0]
        .jobs
        .iter_mut()
        .find(|j| j.result == "Failed")
        .expect("the example has a failed Job");
    let reason = failed.reason.clone().unwrap();
    failed.reason = Some(format!("{reason} <script>alert('x')</script> & \"more\""));
    let page = render(&scenario, &reports, "a<b>&c.yaml");
    assert!(page.contains(&format!(
        "{} &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;more&quot;",
        esc(&reason)
    )));
    assert!(!page.contains("<script"));
    assert!(page.contains("a&lt;b&gt;&amp;c.yaml"));
    assert_well_formed(&page);
}

#[test]
fn every_job_that_did_not_succeed_is_listed_with_its_reason() {
    let scenario = bundled();
    let reports = reports(&scenario, &Strategy::ALL);
    let page = render(&scenario, &reports, "bundled");
    let section = &page[page.find("id=\"not-succeeded\"").unwrap()..];
    for r in &reports {
        let part = &section[section.find(&format!("<h3>{}:", r.strategy)).unwrap()..];
        let part = &part[..part.find("</table>").unwrap_or(part.len())];
        for j in r.jobs.iter().filter(|j| j.result != "Succeeded") {
            let row = format!(
                "<th scope=\"row\">{}/{}</th><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td>",
                j.namespace,
                j.name,
                j.queue,
                j.result,
                j.requeues,
                esc(j.reason.as_deref().unwrap())
            );
            assert!(part.contains(&row), "{}: {row}", r.strategy);
        }
        assert!(!part.contains(">default/etl-1<"), "etl-1 succeeded");
    }
}

#[test]
fn the_page_is_well_formed_self_contained_and_every_chart_is_described() {
    let scenario = bundled();
    let reports = reports(&scenario, &Strategy::ALL);
    let page = render(&scenario, &reports, "bundled");
    assert_well_formed(&page);
    // Nothing fetched: no script, no link, no URL but the page's own anchors.
    for banned in [
        "<script", "<link", "<img", "<iframe", "url(", "http://", "https://", "@import",
    ] {
        assert!(!page.contains(banned), "{banned}");
    }
    assert!(page.contains("<html lang=\"en\">"));
    for (id, body) in charts(&page) {
        assert!(
            body.contains(&format!("role=\"img\" aria-labelledby=\"{id}-t {id}-d\""))
                || body.contains("aria-labelledby=\"gang-t gang-d\""),
            "{id}"
        );
        for part in ["<title id=", "<desc id=", "<figcaption>"] {
            assert!(body.contains(part), "{id} lacks {part}");
        }
        // The description says something, per strategy.
        let desc = body.split("<desc id=").nth(1).unwrap();
        for s in Strategy::ALL {
            assert!(desc.contains(s.as_str()), "{id}: {desc}");
        }
    }
    assert_eq!(
        page.matches("<table").count(),
        page.matches("<caption>").count()
    );
    // Every header cell says what it heads (`<thead>` is no cell).
    let headers = page.matches("<th ").count() + page.matches("<th>").count();
    assert_eq!(headers, page.matches("<th scope=").count());
}

#[test]
fn one_strategy_gives_one_line_per_chart_and_no_marks() {
    let scenario = bundled();
    let reports = reports(&scenario, &[Strategy::SumAggregate]);
    let page = render(&scenario, &reports, "bundled");
    for (id, body) in charts(&page) {
        assert_eq!(body.matches("<g class=\"series\"").count(), 1, "{id}");
    }
    assert!(!page.contains("class=\"n best\""));
    assert_well_formed(&page);
}

#[test]
fn a_large_trace_s_page_stays_small_and_lists_only_some_jobs() {
    // 2,000 Jobs of the mixed trace on 10 clusters under sum-aggregate (which fails some), one run shown as three (the page's
    // size depends on the lines and Jobs it shows, not on which strategy made them).
    let scenario = scenario::parse(&crate::simulate::synthetic::mixed_trace(
        10, 20, 2000, 7, None,
    ))
    .unwrap();
    let one = Simulation::new(&scenario, Strategy::SumAggregate)
        .with_usage_history()
        .run();
    let not_succeeded = one.jobs.iter().filter(|j| j.result != "Succeeded").count();
    assert!(
        not_succeeded > LISTED_JOBS,
        "the trace leaves some Jobs pending"
    );
    let mut reports = vec![one.clone(), one.clone(), one];
    reports[1].strategy = "copy-1".into();
    reports[2].strategy = "copy-2".into();
    let page = render(&scenario, &reports, "trace");
    assert_well_formed(&page);
    assert!(page.len() < 1_500_000, "{} bytes", page.len());
    // Every line bounded.
    for (id, body) in charts(&page) {
        for path in body.split("<path d=\"").skip(1) {
            let d = &path[..path.find('"').unwrap()];
            assert!(d.matches('V').count() <= chart::MAX_POINTS, "{id}");
        }
    }
    let listed = page.matches("<tr><th scope=\"row\">default/j").count();
    assert_eq!(listed, 3 * LISTED_JOBS);
    assert!(page.contains(&format!(
        "… and {} more not listed",
        not_succeeded - LISTED_JOBS
    )));
}
