//! `simulate` at scale: a synthetic scenario of many Jobs on many clusters, run once under
//! each strategy, timed in real seconds. Not a criterion benchmark: one run is long enough.
//!
//!     cargo bench --bench simulate                      # 100,000 Jobs, 50 clusters × 200 nodes
//!     cargo bench --bench simulate -- 10000 20 100      # Jobs, clusters, nodes per cluster
//!     cargo bench --bench simulate -- 100000 50 200 switchyard   # one strategy only
//!
//! The workload: nodes of 64 CPUs, 256 GiB and 8 GPUs in 2 NUMA zones (a third without NUMA
//! data, the rest under single-numa-node, restricted or best-effort), five queues over
//! overlapping sets of clusters, and a mix of CPU gangs and GPU gangs whose arrival rate
//! keeps the clusters about 80 % busy.

use std::time::{Duration, Instant};
use switchyard::simulate::{self, Strategy};

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

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The scenario as YAML, so the run also covers the parser users go through.
pub fn scenario_yaml(jobs: usize, clusters: usize, nodes: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut y = String::with_capacity(jobs * 300 + clusters * nodes * 600);
    y.push_str("clusters:\n");
    for c in 0..clusters {
        y.push_str(&format!("  - name: c{c}\n    nodes:\n"));
        for n in 0..nodes {
            y.push_str(&format!(
                "      - name: c{c}-n{n}\n        allocatable: {{cpu: \"64\", memory: 256Gi, nvidia.com/gpu: \"8\", pods: \"110\"}}\n"
            ));
            let policy = match (c + n) % 6 {
                0 | 1 => None,
                2 | 3 => Some("single-numa-node"),
                4 => Some("restricted"),
                _ => Some("best-effort"),
            };
            if let Some(p) = policy {
                y.push_str(&format!(
                    "        topology:\n          attributes:\n            - {{name: topologyManagerPolicy, value: {p}}}\n            - {{name: topologyManagerScope, value: pod}}\n          zones:\n"
                ));
                for z in 0..2 {
                    y.push_str(&format!(
                        "            - {{name: node-{z}, type: Node, resources: [{{name: cpu, capacity: \"32\", allocatable: \"32\", available: \"32\"}}, {{name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}}, {{name: nvidia.com/gpu, capacity: \"4\", allocatable: \"4\", available: \"4\"}}]}}\n"
                    ));
                }
            }
        }
    }
    y.push_str("queues:\n");
    let queues = 5;
    for q in 0..queues {
        // Overlapping halves of the clusters.
        let names: Vec<String> = (0..clusters)
            .filter(|c| (c + q) % 2 == 0 || clusters < 4)
            .map(|c| format!("c{c}"))
            .collect();
        y.push_str(&format!(
            "  - name: q{q}\n    clusters: [{}]\n    waitForPodsReady: {{enabled: true, timeout: 10m, requeuing: {{backoffBase: 60s, backoffMax: 30m, limit: 5}}}}\n",
            names.join(", ")
        ));
    }
    // Templates: CPU gangs and GPU gangs (Guaranteed, so the Topology Manager aligns them).
    let templates = [
        ("4", "16Gi", "0", false),
        ("8", "32Gi", "0", false),
        ("16", "64Gi", "0", false),
        ("2", "8Gi", "0", false),
        ("8", "64Gi", "1", true),
        ("16", "96Gi", "2", true),
        ("24", "96Gi", "3", true),
        ("4", "32Gi", "4", true),
    ];
    // Capacity: clusters × nodes × 64 CPUs; mean job ≈ 3 pods × 10 CPUs × 25 min.
    let capacity = (clusters * nodes * 64) as f64;
    let mean_job_cpu_seconds = 3.0 * 10.0 * 25.0 * 60.0;
    let rate = 0.8 * capacity / mean_job_cpu_seconds; // jobs per second
    let mut t = 0f64;
    y.push_str("jobs:\n");
    for j in 0..jobs {
        t += -(1.0 - rng.unit()).ln() / rate;
        let (cpu, mem, gpu, guaranteed) = templates[rng.below(templates.len() as u64) as usize];
        let pods = 1 + rng.below(5);
        let minutes = 5 + rng.below(41);
        let q = rng.below(queues as u64);
        let resources = if gpu == "0" {
            format!("{{cpu: \"{cpu}\", memory: {mem}}}")
        } else {
            format!("{{cpu: \"{cpu}\", memory: {mem}, nvidia.com/gpu: \"{gpu}\"}}")
        };
        let limits = if guaranteed {
            format!(", limits: {resources}")
        } else {
            String::new()
        };
        y.push_str(&format!(
            "  - {{name: j{j}, queue: q{q}, submitAt: {}s, parallelism: {pods}, duration: {minutes}m, podStartDelay: {}s, template: {{containers: [{{name: main, resources: {{requests: {resources}{limits}}}}}]}}}}\n",
            t as u64,
            5 + rng.below(60)
        ));
    }
    y
}
