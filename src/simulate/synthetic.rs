//! A synthetic scenario of many Jobs on many clusters, for `simulate` at scale (the
//! benchmark) and for tests that need more than the bundled example: nodes of 64 CPUs,
//! 256 GiB and 8 GPUs in 2 NUMA zones (a third without NUMA data, the rest under
//! single-numa-node, restricted or best-effort), five queues over overlapping halves of the
//! clusters, and a mix of CPU gangs and GPU gangs arriving so that the clusters are about
//! 80 % busy. The same arguments always give the same text.

use crate::rng::Rng;

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
