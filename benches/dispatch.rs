//! Load benchmark of the live dispatcher: 1,000 Jobs submitted at once to a manager with 10
//! worker clusters, every cluster a fake API server on loopback (plain HTTP) reached through
//! the real `kube::Client`, as in tests/dispatch_live.rs.
//!
//!     cargo bench --bench dispatch [-- JOBS WORKERS]
//!
//! Prints: dispatch throughput (Jobs/s from submission until every Job is unsuspended with
//! its copy created), the remote writes per Job (requests that change a worker: creates,
//! patches, deletes, over the Job's whole life), and the mirror lag (from a copy's status
//! changing in its worker to the manager's Job showing it) at p50/p99/max.

#![forbid(unsafe_code)]

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use common::dispatch::*;
use common::fake_api::JOBS;
use serde_json::json;
use std::time::{Duration, Instant};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .filter(|a| !a.starts_with('-'))
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn remote_writes(fleet: &Fleet) -> usize {
    fleet
        .workers
        .values()
        .flat_map(|w| w.recorded())
        .filter(|r| r.method != "GET")
        .count()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let jobs = arg(1, 1000);
    let workers = arg(2, 10);
    let names: Vec<&'static str> = (0..workers)
        .map(|i| &*Box::leak(format!("worker-{i}").into_boxed_str()))
        .collect();
    let specs: Vec<WorkerSpec> = names
        .iter()
        .map(|n| WorkerSpec {
            name: n,
            nodes: 20,
            cpu: 64,
        })
        .collect();
    let fleet = Fleet::start(&specs, queue("research", &names, json!({}))).await;
    let mut options = Fleet::options();
    options.tick = Duration::from_millis(500);
    let _d = fleet.dispatcher_with(true, options);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let names: Vec<String> = (0..jobs).map(|i| format!("load-{i}")).collect();
    let started = Instant::now();
    for n in &names {
        fleet.submit(job(n, "research", 1, 1));
    }
    let mut pending: std::collections::BTreeSet<&String> = names.iter().collect();
    while !pending.is_empty() {
        pending.retain(|n| {
            let j = fleet.job(n);
            !(j["spec"]["suspend"] == false && annotation(&j, "switchyard.dev/cluster").is_some())
        });
        if started.elapsed() > Duration::from_secs(120) {
            panic!("{} Jobs not dispatched after 120 s", pending.len());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    let copies: usize = fleet.workers.values().map(|w| w.list(JOBS).len()).sum();
    assert_eq!(copies, jobs, "one copy per Job");
    println!(
        "dispatch: {jobs} Jobs to {workers} workers in {:.2} s = {:.0} Jobs/s",
        took.as_secs_f64(),
        jobs as f64 / took.as_secs_f64()
    );

    // Status changes in the workers, 500 a second, each timed until the manager shows it.
    let where_: Vec<(String, String)> = names
        .iter()
        .map(|n| {
            let c = annotation(&fleet.job(n), "switchyard.dev/cluster")
                .unwrap()
                .to_string();
            (n.clone(), c)
        })
        .collect();
    let mut changed_at = Vec::with_capacity(jobs);
    let mut lags = Vec::with_capacity(jobs);
    let mut seen = vec![false; jobs];
    let mut next = 0;
    let begin = Instant::now();
    while lags.len() < jobs {
        let due = (begin.elapsed().as_secs_f64() * 500.0) as usize;
        while next < jobs && next <= due {
            let (n, c) = &where_[next];
            fleet.copy_status(
                c,
                n,
                json!({"active": 1, "ready": 1, "startTime": "2026-11-22T04:00:00Z",
                       "uncountedTerminatedPods": {}}),
            );
            changed_at.push(Instant::now());
            next += 1;
        }
        for i in 0..next {
            if !seen[i] && fleet.job(&where_[i].0)["status"]["ready"] == 1 {
                seen[i] = true;
                lags.push(changed_at[i].elapsed());
            }
        }
        if begin.elapsed() > Duration::from_secs(120) {
            panic!("statuses not mirrored after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    lags.sort();
    println!(
        "mirror lag: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&lags, 0.5).as_secs_f64() * 1e3,
        percentile(&lags, 0.99).as_secs_f64() * 1e3,
        lags.last().unwrap().as_secs_f64() * 1e3
    );

    // They finish: the copies are removed.
    for (n, c) in &where_ {
        fleet.copy_status(
            c,
            n,
            json!({"succeeded": 1, "active": 0, "ready": 0,
                   "startTime": "2026-11-22T04:00:00Z", "completionTime": "2026-11-22T04:01:00Z",
                   "uncountedTerminatedPods": {},
                   "conditions": [
                     {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                      "message": "Reached expected number of succeeded pods",
                      "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"},
                     {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                      "message": "Reached expected number of succeeded pods",
                      "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"}]}),
        );
    }
    let finish = Instant::now();
    while fleet
        .workers
        .values()
        .map(|w| w.list(JOBS).len())
        .sum::<usize>()
        > 0
    {
        if finish.elapsed() > Duration::from_secs(120) {
            panic!("copies not removed after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let writes = remote_writes(&fleet);
    println!(
        "remote writes: {writes} for {jobs} Jobs = {:.2} per Job (create + delete)",
        writes as f64 / jobs as f64
    );
    let manager_writes = fleet
        .manager
        .recorded()
        .iter()
        .filter(|r| r.method != "GET" && !r.uri.contains("/events"))
        .count();
    println!(
        "manager writes (without Events): {:.2} per Job",
        manager_writes as f64 / jobs as f64
    );
    let uncovered = fleet.uncovered();
    assert!(
        uncovered.is_empty(),
        "outside the chart's RBAC: {uncovered:?}"
    );
}
