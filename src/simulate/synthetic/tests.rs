use super::*;
use crate::inventory::Scope;
use crate::simulate::scenario;
use crate::topology::Policy;

const GIB: i64 = 1000 * (1 << 30);

#[test]
fn the_mixed_trace_parses_and_has_the_described_shape() {
    let (clusters, nodes, jobs) = (8, 4, 400);
    let text = mixed_trace(clusters, nodes, jobs, 7, None);
    let s = scenario::parse(&text).expect("the mixed trace parses");
    let inv = &s.inventory;
    let id = |r: &str| inv.resources.id(r).expect("a resource of the trace");
    let (cpu, memory, gpu) = (id("cpu"), id("memory"), id("nvidia.com/gpu"));

    assert_eq!(inv.clusters.len(), clusters);
    let policies = [
        Policy::SingleNumaNode,
        Policy::Restricted,
        Policy::BestEffort,
        Policy::None,
    ];
    for (i, c) in inv.clusters.iter().enumerate() {
        assert_eq!(c.name, format!("c{i}"));
        assert_eq!(s.scheduler_name(&c.name), None, "the default scheduler");
        assert_eq!(c.nodes.len(), nodes);
        for (n, node) in c.nodes.iter().enumerate() {
            let gpus = if n % 2 == 0 { 8 } else { 0 };
            assert_eq!(
                [
                    node.allocatable[cpu],
                    node.allocatable[memory],
                    node.allocatable[gpu]
                ],
                [64_000, 256 * GIB, gpus * 1000],
                "{}",
                node.name
            );
            let numa = node.numa.as_ref().expect("NUMA data");
            assert_eq!(numa.policy, policies[i % 4], "{}", node.name);
            assert_eq!(numa.scope, Scope::Pod);
            assert_eq!(numa.zones.len(), 2);
            for z in &numa.zones {
                assert_eq!(
                    [
                        z.allocatable[cpu],
                        z.allocatable[memory],
                        z.allocatable[gpu]
                    ],
                    [32_000, 128 * GIB, gpus / 2 * 1000],
                    "{} {}",
                    node.name,
                    z.name
                );
            }
        }
    }

    let queues: Vec<&str> = s.queues.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(queues, ["q0", "q1", "q2", "q3", "q4"]);
    for (q, (name, settings)) in s.queues.iter().enumerate() {
        // Its own clusters, and some of the others: the queues overlap.
        for c in (q..clusters).step_by(5) {
            assert!(settings.clusters.contains(&format!("c{c}")), "{name}: c{c}");
        }
        let wait = settings
            .wait_for_pods_ready
            .as_ref()
            .expect("waitForPodsReady");
        assert_eq!(wait.timeout.as_secs(), 600);
        assert!(!wait.block_admission);
    }
    let shared = (0..clusters)
        .filter(|c| {
            let name = format!("c{c}");
            s.queues
                .iter()
                .filter(|(_, q)| q.clusters.contains(&name))
                .count()
                > 1
        })
        .count();
    assert!(shared > 0, "some clusters serve several queues");

    assert_eq!(s.jobs.len(), jobs);
    let mut last = 0.0;
    for (i, j) in s.jobs.iter().enumerate() {
        assert_eq!(j.name, format!("j{i}"));
        assert_eq!(j.queue, format!("q{}", i % 5));
        let at = j.submit_at.as_secs_f64();
        assert!(at >= last, "{}: arrivals in order", j.name);
        last = at;
        assert!(MIXED_PARALLELISM.contains(&j.parallelism), "{}", j.name);
        assert_eq!(j.completions, j.parallelism);
        assert!((60..=3600).contains(&j.duration.as_secs()), "{}", j.name);
        assert_eq!(j.pod_start_delay.as_secs(), 15);
        let r = &j.pod.node_request;
        let cpus = r["cpu"] / 1000;
        assert!(MIXED_CPUS.contains(&(cpus as u32)), "{}", j.name);
        assert_eq!(r["memory"], cpus * 2 * GIB, "{}: 2 GiB per CPU", j.name);
        let gpus = r.get("nvidia.com/gpu").map_or(0, |g| g / 1000);
        assert!(MIXED_GPUS.contains(&(gpus as u32)), "{}", j.name);
        assert!(j.pod.guaranteed, "{}: requests = limits", j.name);
    }
    // A Poisson process of mean gap 0.5 s: 400 arrivals take about 200 s.
    let mean_gap = last / (jobs - 1) as f64;
    assert!((0.4..0.6).contains(&mean_gap), "mean gap {mean_gap}");
    let with_gpus = s
        .jobs
        .iter()
        .filter(|j| j.pod.node_request.contains_key("nvidia.com/gpu"))
        .count();
    assert!((150..250).contains(&with_gpus), "about half: {with_gpus}");
}

#[test]
fn the_mixed_trace_replays_and_can_name_a_scheduler() {
    assert_eq!(
        mixed_trace(3, 2, 50, 1, None),
        mixed_trace(3, 2, 50, 1, None)
    );
    assert_ne!(
        mixed_trace(3, 2, 50, 1, None),
        mixed_trace(3, 2, 50, 2, None)
    );
    let s = scenario::parse(&mixed_trace(3, 2, 50, 1, Some("switchyard-scheduler")))
        .expect("the mixed trace parses");
    for c in ["c0", "c1", "c2"] {
        assert_eq!(s.scheduler_name(c), Some("switchyard-scheduler"), "{c}");
    }
    // Fewer clusters than queues: every queue still has one.
    let s = scenario::parse(&mixed_trace(1, 1, 5, 3, None)).expect("parses");
    assert!(s.queues.iter().all(|(_, q)| q.clusters == ["c0"]));
}
