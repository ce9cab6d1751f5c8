//! Gang placement across clusters, as the dispatcher picks a worker: a gang of 64 identical
//! Guaranteed pods (4 CPUs, 16 GiB, 1 GPU each) judged with `fit_cluster` against every one
//! of 100 clusters of 500 NUMA-aware nodes (2–8 zones each, mixed Topology Manager policies
//! and scopes, some load), then the best-scoring feasible cluster picked.
//!
//! Target: all 100 clusters under 10 ms.
//!
//!     cargo bench --bench gang
//!
//! Cases (inventories generated deterministically, same seed every run):
//! * `summary rejects 90`: 30 CPU-only clusters, 30 whose GPUs are all in use and 30 whose
//!   NUMA zones are too full for 4 whole CPUs under single-numa-node everywhere: all 90
//!   rejected from their summaries; the 10 others are busy but fit the gang.
//! * `all feasible`: every cluster busy (most GPUs in use), so the gang is only complete
//!   after a good part of each cluster's nodes has been looked at.
//! * `none fits, all scanned`: every cluster passes its summary but has fewer than 64 usable
//!   GPUs, so every node of every cluster is judged (the most the dispatcher can face).

// Model structs are filled as `..template` so fields added later keep working defaults.
#![allow(clippy::needless_update)]

use criterion::{criterion_group, criterion_main, Criterion};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;
use switchyard::inventory::{parse_yaml, Cluster, Inventory, Node, NumaTopology, NumaZone, Scope};
use switchyard::placement::{fit_cluster, fit_clusters, EngineConfig, PodShape, PodView, Strategy};
use switchyard::rng::Rng;
use switchyard::topology::{NumaInfo, Policy, PolicyOptions};

const CLUSTERS: usize = 100;
const NODES: usize = 500;
const GANG: usize = 64;
const GI: i64 = 1024 * 1024 * 1024 * 1000; // milli-bytes
const CORE: i64 = 1000;

#[derive(Clone, Copy)]
enum Kind {
    /// No GPUs at all.
    CpuOnly,
    /// GPU nodes; each zone's GPU is free with this probability.
    Gpu { gpu_free: f64 },
    /// single-numa-node everywhere, every zone with at most 3 free CPUs.
    FragmentedSingleNuma,
}

struct Ids {
    cpu: usize,
    memory: usize,
    pods: usize,
    gpu: usize,
}

/// Templates read from the inventory format, so new fields of the model keep their defaults.
struct Templates {
    cluster: Cluster,
    node: Node,
    numa: NumaTopology,
    zone: NumaZone,
}

impl Templates {
    fn new() -> Self {
        let inv = parse_yaml(
            r#"
clusters:
  - name: template
    nodes:
      - name: template
        allocatable: {cpu: "1"}
        topology:
          attributes: [{name: topologyManagerPolicy, value: single-numa-node}]
          zones: [{name: node-0, type: Node, resources: [{name: cpu, capacity: "1"}]}]
"#,
        )
        .expect("template inventory");
        let mut cluster = Cluster::clone(&inv.clusters[0]);
        let mut node = std::sync::Arc::unwrap_or_clone(cluster.nodes.pop().expect("template node"));
        let mut numa = NumaTopology::clone(&node.numa.take().expect("template topology"));
        let zone = numa.zones.pop().expect("template zone");
        Self {
            cluster,
            node,
            numa,
            zone,
        }
    }
}

fn node(rng: &mut Rng, t: &Templates, ids: &Ids, name: String, kind: Kind) -> Node {
    let width = ids.gpu + 1;
    let zones_n = 2 + rng.below(7) as u32; // 2..=8
    let (policy, scope) = match kind {
        Kind::FragmentedSingleNuma => (Policy::SingleNumaNode, Scope::Container),
        _ => (
            [
                Policy::SingleNumaNode,
                Policy::Restricted,
                Policy::BestEffort,
            ][rng.below(3) as usize],
            if rng.chance(0.5) {
                Scope::Container
            } else {
                Scope::Pod
            },
        ),
    };
    let mut allocatable = vec![0i64; width];
    let mut requested = vec![0i64; width];
    let mut zones = Vec::new();
    let mut managed = vec![false; width];
    managed[ids.cpu] = true;
    managed[ids.memory] = true;
    for z in 0..zones_n {
        let mut alloc = vec![0i64; width];
        let mut avail = vec![0i64; width];
        alloc[ids.cpu] = 16 * CORE;
        alloc[ids.memory] = 64 * GI;
        let cpu_used = match kind {
            Kind::FragmentedSingleNuma => 13 + rng.below(4) as i64,
            _ => rng.below(17) as i64,
        };
        avail[ids.cpu] = alloc[ids.cpu] - cpu_used * CORE;
        avail[ids.memory] = alloc[ids.memory] - rng.below(65) as i64 * GI;
        if !matches!(kind, Kind::CpuOnly) {
            managed[ids.gpu] = true;
            alloc[ids.gpu] = 1000;
            let free = match kind {
                Kind::Gpu { gpu_free } => rng.chance(gpu_free),
                _ => rng.chance(0.5),
            };
            avail[ids.gpu] = if free { 1000 } else { 0 };
        }
        for r in [ids.cpu, ids.memory, ids.gpu] {
            allocatable[r] += alloc[r];
            requested[r] += alloc[r] - avail[r];
        }
        zones.push(NumaZone {
            name: format!("node-{z}").into(),
            id: z,
            allocatable: alloc.into(),
            available: avail,
            ..t.zone.clone()
        });
    }
    allocatable[ids.pods] = 110 * 1000;
    requested[ids.pods] = (5 + rng.below(40) as i64) * 1000;
    Node {
        labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), name.clone())]).into(),
        name: name.into(),
        taints: std::sync::Arc::from([]),
        allocatable: allocatable.into(),
        requested,
        numa: Some(std::sync::Arc::new(NumaTopology {
            policy,
            scope,
            options: PolicyOptions::default(),
            info: NumaInfo::new((0..zones_n).collect()).into(),
            zones,
            managed: managed.into(),
            ..t.numa.clone()
        })),
        ..t.node.clone()
    }
}

fn inventory(seed: u64, kinds: impl Fn(usize) -> Kind) -> Inventory {
    let mut inv = Inventory::default();
    let ids = Ids {
        cpu: inv.resources.intern("cpu"),
        memory: inv.resources.intern("memory"),
        pods: inv.resources.intern("pods"),
        gpu: inv.resources.intern("nvidia.com/gpu"),
    };
    let mut rng = Rng::new(seed);
    let t = Templates::new();
    inv.clusters = (0..CLUSTERS)
        .map(|c| {
            let name = format!("worker-{c:03}");
            let kind = kinds(c);
            Cluster {
                nodes: (0..NODES)
                    .map(|n| {
                        std::sync::Arc::new(node(
                            &mut rng,
                            &t,
                            &ids,
                            format!("{name}-n{n:03}"),
                            kind,
                        ))
                    })
                    .collect(),
                name,
                labels: BTreeMap::new(),
                ..t.cluster.clone()
            }
            .into()
        })
        .collect();
    inv.finish()
}

fn gang_pod() -> PodShape {
    let view: PodView = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "trainer-0", "namespace": "research"},
        "spec": {"containers": [{
            "name": "main",
            "resources": {
                "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
            }
        }]}
    }))
    .expect("pod");
    let shape = PodShape::from_view(&view).expect("shape");
    assert!(shape.guaranteed);
    shape
}

/// What the dispatcher does for a Job's first look at its workers: bind the pod to the
/// inventory, judge every cluster (`fit_clusters`: across the cores, as there are enough
/// nodes), keep the best-scoring one that fits. Returns (feasible clusters, best cluster
/// index).
fn pick(inv: &Inventory, shape: &PodShape, config: &EngineConfig) -> (usize, Option<usize>) {
    let bound = shape.bind(&inv.resources);
    let strategy = shape.strategy(config.strategy);
    let mut feasible = 0;
    let mut best: Option<(i64, usize)> = None;
    let clusters: Vec<&Cluster> = inv.clusters.iter().map(|c| c.as_ref()).collect();
    let fits = fit_clusters(
        &clusters,
        &inv.resources,
        shape,
        &bound,
        GANG,
        config,
        strategy,
    );
    for (i, fit) in fits.into_iter().enumerate() {
        if fit.fits() {
            feasible += 1;
            if best.is_none_or(|(s, _)| fit.score > s) {
                best = Some((fit.score, i));
            }
        }
    }
    (feasible, best.map(|(_, i)| i))
}

fn gangs(c: &mut Criterion) {
    let shape = gang_pod();
    let config = EngineConfig {
        strategy: Strategy::MostAllocated,
        ..EngineConfig::default()
    };
    let cases: [(&str, Inventory, usize); 3] = [
        (
            "summary rejects 90",
            inventory(1, |c| match c % 10 {
                0 => Kind::Gpu { gpu_free: 0.06 },
                1..=3 => Kind::CpuOnly,
                4..=6 => Kind::Gpu { gpu_free: 0.0 },
                _ => Kind::FragmentedSingleNuma,
            }),
            10,
        ),
        (
            "all feasible",
            inventory(2, |_| Kind::Gpu { gpu_free: 0.06 }),
            CLUSTERS,
        ),
        (
            "none fits, all scanned",
            inventory(3, |_| Kind::Gpu { gpu_free: 0.015 }),
            0,
        ),
    ];
    let mut group = c.benchmark_group(format!(
        "gang of {GANG} x {CLUSTERS} clusters x {NODES} nodes"
    ));
    for (name, inv, feasible) in &cases {
        // How deep into each cluster the gang had to look, for the record.
        let bound = shape.bind(&inv.resources);
        let depth: Vec<usize> = inv
            .clusters
            .iter()
            .map(|cl| {
                let f = fit_cluster(
                    cl,
                    &inv.resources,
                    &shape,
                    &bound,
                    GANG,
                    &config,
                    config.strategy,
                );
                if f.fits() {
                    f.placements.last().map_or(0, |p| p.0 + 1)
                } else if f.placements.is_empty() && f.fitted == 0 {
                    // Rejected from the summary (no node judged) or none placed.
                    0
                } else {
                    NODES
                }
            })
            .collect();
        let (got, best) = pick(inv, &shape, &config);
        assert_eq!(got, *feasible, "{name}: feasible clusters");
        assert_eq!(best.is_some(), *feasible > 0, "{name}: a best cluster");
        eprintln!(
            "{name}: {got} feasible, best {:?}, nodes looked at per feasible cluster: mean {:.0}",
            best.map(|i| &inv.clusters[i].name),
            depth.iter().filter(|&&d| d > 0).sum::<usize>() as f64
                / depth.iter().filter(|&&d| d > 0).count().max(1) as f64
        );
        group.bench_function(*name, |b| {
            b.iter(|| pick(black_box(inv), black_box(&shape), &config))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = gangs
}
criterion_main!(benches);
