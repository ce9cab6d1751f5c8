//! Synthetic scenarios, as YAML, so that a run also covers the parser users go through. The
//! same arguments always give the same text.
//!
//! - [`scenario_yaml`], for `simulate` at scale (the benchmark) and for tests that need more
//!   than the bundled example: nodes of 64 CPUs, 256 GiB and 8 GPUs in 2 NUMA zones (a third
//!   without NUMA data, the rest under single-numa-node, restricted or best-effort), five
//!   queues over overlapping halves of the clusters, and a mix of CPU gangs and GPU gangs
//!   arriving so that the clusters are about 80 % busy.
//! - [`mixed_trace`], the mixed, GPU-oversubscribed trace: Jobs arrive every half second on
//!   average whatever the clusters' size, so a small fleet queues and a large one does not
//!   (`cargo run --release --example trace`).

use crate::rng::Rng;
use std::fmt::Write as _;

#[cfg(test)]
mod tests;

/// The Topology Manager policy of cluster `c{i}` in [`mixed_trace`], by `i mod 4`.
const MIXED_POLICIES: [&str; 4] = ["single-numa-node", "restricted", "best-effort", "none"];

/// Pods per Job in [`mixed_trace`], drawn evenly (so half the Jobs have one pod).
const MIXED_PARALLELISM: [u32; 6] = [1, 1, 1, 2, 4, 8];
/// CPUs per pod (each with 2 GiB of memory per CPU).
const MIXED_CPUS: [u32; 4] = [1, 2, 4, 8];
/// GPUs per pod: half the Jobs have none.
const MIXED_GPUS: [u32; 6] = [0, 0, 0, 1, 2, 4];

/// The mixed trace: `clusters` clusters `c0`… of `nodes` nodes each, every node 64 CPUs and
/// 256 GiB in 2 NUMA zones, the even-numbered ones with 8 `nvidia.com/gpu` (4 per zone);
/// cluster `c{i}`'s Topology Manager policy is single-numa-node, restricted, best-effort or
/// none by `i mod 4`, at pod scope. Five queues `q0`…`q4`, each over cluster `c{q}`, `c{q+5}`…
/// and about 30 % of the others, with waitForPodsReady (10 minutes, no blockAdmission).
/// `jobs` Jobs `j0`… in queue `q{j mod 5}`, arriving as a Poisson process (0.5 s mean gap),
/// each of 1–8 Guaranteed pods (1, 2, 4 or 8 CPUs, 2 GiB per CPU, 0, 1, 2 or 4 GPUs) that run
/// 60 s to 1 h and are Ready 15 s after they start. `scheduler`: every cluster's
/// `schedulerName` (pods placed NUMA-aware), or none (the default scheduler).
///
/// At least one cluster is made; a queue that drew none of them gets `c{q mod clusters}`.
pub fn mixed_trace(
    clusters: usize,
    nodes: usize,
    jobs: usize,
    seed: u64,
    scheduler: Option<&str>,
) -> String {
    let clusters = clusters.max(1);
    let mut rng = Rng::new(seed);
    let mut y = String::with_capacity(jobs * 260 + clusters * nodes * 700);
    y.push_str("clusters:\n");
    for c in 0..clusters {
        let _ = writeln!(y, "  - name: c{c}");
        if let Some(name) = scheduler {
            let _ = writeln!(y, "    schedulerName: {name}");
        }
        y.push_str("    nodes:\n");
        let policy = MIXED_POLICIES[c % MIXED_POLICIES.len()];
        for n in 0..nodes {
            let gpus = if n % 2 == 0 { 8 } else { 0 };
            let _ = write!(
                y,
                "      - name: c{c}-n{n}\n        allocatable: {{cpu: \"64\", memory: 256Gi, nvidia.com/gpu: \"{gpus}\", pods: \"110\"}}\n        topology:\n          attributes:\n            - {{name: topologyManagerPolicy, value: {policy}}}\n            - {{name: topologyManagerScope, value: pod}}\n          zones:\n"
            );
            for z in 0..2 {
                let _ = write!(
                    y,
                    "            - name: node-{z}\n              type: Node\n              resources:\n                - {{name: cpu, capacity: \"32\", allocatable: \"32\", available: \"32\"}}\n                - {{name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}}\n                - {{name: nvidia.com/gpu, capacity: \"{0}\", allocatable: \"{0}\", available: \"{0}\"}}\n",
                    gpus / 2
                );
            }
        }
    }
    let queues = 5;
    y.push_str("queues:\n");
    for q in 0..queues {
        let mut names: Vec<String> = (0..clusters)
            .filter(|c| c % queues == q || rng.unit() < 0.3)
            .map(|c| format!("c{c}"))
            .collect();
        if names.is_empty() {
            names.push(format!("c{}", q % clusters));
        }
        let _ = writeln!(
            y,
            "  - name: q{q}\n    clusters: [{}]\n    waitForPodsReady: {{enabled: true, timeout: 10m, blockAdmission: false}}",
            names.join(", ")
        );
    }
    y.push_str("jobs:\n");
    let pick = |rng: &mut Rng, from: &[u32]| from[rng.below(from.len() as u64) as usize];
    let mut t = 0f64;
    for j in 0..jobs {
        // Exponential gaps of mean 0.5 s.
        t += -(1.0 - rng.unit()).ln() * 0.5;
        let pods = pick(&mut rng, &MIXED_PARALLELISM);
        let cpus = pick(&mut rng, &MIXED_CPUS);
        let gpus = pick(&mut rng, &MIXED_GPUS);
        let seconds = 60 + rng.below(3600 - 60 + 1);
        let gpu = if gpus > 0 {
            format!(", nvidia.com/gpu: \"{gpus}\"")
        } else {
            String::new()
        };
        let resources = format!("{{cpu: \"{cpus}\", memory: {}Gi{gpu}}}", cpus * 2);
        let _ = writeln!(
            y,
            "  - {{name: j{j}, queue: q{}, submitAt: {t:.1}s, parallelism: {pods}, duration: {seconds}s, podStartDelay: 15s, template: {{containers: [{{name: main, resources: {{requests: {resources}, limits: {resources}}}}}]}}}}",
            j % queues
        );
    }
    y
}

/// The scenario as YAML, so the run also covers the parser users go through.
pub fn scenario_yaml(jobs: usize, clusters: usize, nodes: usize, seed: u64) -> String {
    let mut rng = Rng::new(seed);
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
