//! `simulate` at scale: a synthetic scenario of many Jobs on many clusters, run once under
//! each strategy, timed in real seconds. Not a criterion benchmark: one run is long enough.
//!
//!     cargo bench --bench simulate                      # 100,000 Jobs, 50 clusters × 200 nodes
//!     cargo bench --bench simulate -- 10000 20 100      # Jobs, clusters, nodes per cluster
//!     cargo bench --bench simulate -- 100000 50 200 switchyard   # one strategy only
//!     cargo bench --bench simulate -- 100000 50 200 --write-scenario big.yaml
//!                                 # writes the scenario for `switchyard simulate --scenario`
//!
//! The workload: nodes of 64 CPUs, 256 GiB and 8 GPUs in 2 NUMA zones (a third without NUMA
//! data, the rest under single-numa-node, restricted or best-effort), five queues over
//! overlapping sets of clusters, and a mix of CPU gangs and GPU gangs whose arrival rate
//! keeps the clusters about 80 % busy.

use std::time::{Duration, Instant};

// The allocator the `switchyard` binary uses (counted, as the binary counts it), so the figures
// are the binary's.
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

use switchyard::simulate::{self, synthetic::scenario_yaml, Strategy};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (jobs, clusters, nodes) = (num(0, 100_000), num(1, 50), num(2, 200));
    if std::env::args().any(|a| a == "--check-memory") {
        let text = scenario_yaml(jobs, clusters, nodes, 7);
        let scenario = simulate::scenario::parse(&text).expect("the synthetic scenario parses");
        let with = simulate::Simulation::new(&scenario, Strategy::Switchyard)
            .with_events()
            .run();
        let without = simulate::Simulation::new(&scenario, Strategy::Switchyard)
            .with_events()
            .without_memory()
            .run();
        let first = with
            .events
            .iter()
            .zip(&without.events)
            .position(|(a, b)| a != b);
        println!(
            "same decisions: {} (first difference at {:?})",
            first.is_none() && with.events.len() == without.events.len(),
            first.map(|i| (&with.events[i], &without.events[i]))
        );
        return;
    }
    if let Some(path) = std::env::args()
        .skip_while(|a| a != "--write-scenario")
        .nth(1)
    {
        // The same scenario as a file, for `switchyard simulate --scenario FILE`.
        let text = scenario_yaml(jobs, clusters, nodes, 7);
        std::fs::write(&path, text).expect("the scenario file is written");
        println!("wrote {path}: {jobs} jobs, {clusters} clusters x {nodes} nodes");
        return;
    }
    let strategies: Vec<Strategy> = match args.get(3) {
        Some(s) => vec![s.parse().expect("a strategy")],
        None => vec![
            Strategy::Switchyard,
            Strategy::SumAggregate,
            Strategy::AllAtOnce,
        ],
    };
    let started = Instant::now();
    let text = scenario_yaml(jobs, clusters, nodes, 7);
    let scenario = simulate::scenario::parse(&text).expect("the synthetic scenario parses");
    println!(
        "scenario: {jobs} jobs, {clusters} clusters x {nodes} nodes (generated and parsed in {:.1}s)",
        started.elapsed().as_secs_f64()
    );
    for strategy in strategies {
        let t = Instant::now();
        let report = simulate::run(&scenario, strategy);
        let elapsed = t.elapsed();
        let s = &report.summary;
        println!(
            "{:<13} {:>7.2}s real | {} succeeded, {} failed, {} pending | makespan {}s, mean wait {}s | TopologyAffinityErrors {} | remote writes/job {}",
            strategy.as_str(),
            elapsed.as_secs_f64(),
            s.succeeded,
            s.failed,
            s.pending,
            s.makespan,
            s.mean_wait,
            s.topology_affinity_errors,
            s.remote_writes_per_job,
        );
        if elapsed > Duration::from_secs(30) && jobs >= 100_000 {
            println!("  (target: under 30 s of real time)");
        }
    }
}
