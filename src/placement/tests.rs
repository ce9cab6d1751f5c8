use super::pod::effective_request;
use super::*;
use crate::inventory::{parse_yaml, Inventory};
use crate::quantity::parse as q;
use std::time::{Duration, Instant};

const EXAMPLE: &str = include_str!("../../tests/data/formats/inventory.example.yaml");

fn shape(json: serde_json::Value) -> PodShape {
    let view: PodView = serde_json::from_value(json).unwrap();
    PodShape::from_view(&view).unwrap()
}

/// A Guaranteed pod with one container asking for `gpus` GPUs (plus 1 CPU, 1Gi).
fn gpu_pod(gpus: u32) -> PodShape {
    let r = serde_json::json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()});
    shape(serde_json::json!({
        "metadata": {"name": "train", "namespace": "ml", "uid": "u"},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": r, "limits": r}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        }
    }))
}

fn node_fit(inv: &Inventory, node: &str, pod: &PodShape, n: usize) -> NodeFit {
    let (_, node) = inv.node(node).unwrap();
    fit_node(
        node,
        &inv.resources,
        pod,
        &pod.bind(&inv.resources),
        n,
        &EngineConfig::default(),
        true,
    )
}

fn cluster_fit(inv: &Inventory, cluster: &str, pod: &PodShape, n: usize) -> ClusterFit {
    fit_cluster(
        inv.cluster(cluster).unwrap(),
        &inv.resources,
        pod,
        &pod.bind(&inv.resources),
        n,
        &EngineConfig::default(),
        Strategy::LeastAllocated,
    )
}

/// Two-zone GPU nodes: `zones` lists (free GPUs in zone 0, in zone 1) per node, 4 allocatable
/// per zone, under `policy` and `scope`.
fn gpu_cluster(policy: &str, scope: &str, zones: &[(u32, u32)]) -> Inventory {
    parse_yaml(&gpu_cluster_yaml(policy, scope, zones)).unwrap()
}

/// [`gpu_cluster`]'s inventory file.
fn gpu_cluster_yaml(policy: &str, scope: &str, zones: &[(u32, u32)]) -> String {
    let mut yaml = String::from("clusters:\n  - name: c\n    nodes:\n");
    for (i, (a, b)) in zones.iter().enumerate() {
        let used = 8 - a - b;
        yaml += &format!(
            "      - name: n{i}\n        allocatable: {{cpu: \"64\", memory: 256Gi, nvidia.com/gpu: \"8\", pods: \"110\"}}\n        requested: {{nvidia.com/gpu: \"{used}\"}}\n        topology:\n          attributes:\n            - {{name: topologyManagerPolicy, value: {policy}}}\n            - {{name: topologyManagerScope, value: {scope}}}\n          zones:\n"
        );
        for (z, free) in [(0, a), (1, b)] {
            yaml += &format!(
                "            - name: node-{z}\n              type: Node\n              resources:\n                - {{name: cpu, capacity: \"32\", allocatable: \"32\", available: \"32\"}}\n                - {{name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}}\n                - {{name: nvidia.com/gpu, capacity: \"4\", allocatable: \"4\", available: \"{free}\"}}\n"
            );
        }
    }
    yaml
}

#[test]
fn seed_001_effective_request_is_cpu_3_memory_3g() {
    let pod = shape(serde_json::json!({"spec": {
        "containers": [
            {"name": "appContainer1", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
            {"name": "appContainer2", "resources": {"requests": {"cpu": "1", "memory": "1G"}}}
        ],
        "initContainers": [
            {"name": "initContainer1", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
            {"name": "initContainer2", "resources": {"requests": {"cpu": "2", "memory": "3G"}}}
        ]
    }}));
    assert_eq!(pod.effective["cpu"], q("3").unwrap().0);
    assert_eq!(pod.effective["memory"], q("3G").unwrap().0);
    assert!(!pod.guaranteed, "requests without limits are Burstable");
}

#[test]
fn sidecars_count_as_the_kubelet_counts_them() {
    let pod = shape(serde_json::json!({"spec": {
        "initContainers": [
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "migrate", "resources": {"requests": {"cpu": "4"}}}
        ],
        "containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]
    }}));
    // While migrate runs the sidecar runs too (1 + 4); afterwards sidecar + app (1 + 2).
    assert_eq!(pod.effective["cpu"], 5000);
    let containers = pod.containers.clone();
    assert_eq!(effective_request(&containers[..1])["cpu"], 1000);
}

#[test]
fn requests_default_to_limits_and_guaranteed_needs_equal_cpu_and_memory() {
    let limits_only = shape(serde_json::json!({"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}
    ]}}));
    assert!(limits_only.guaranteed);
    assert_eq!(limits_only.node_request["cpu"], 2000);
    let burstable = shape(serde_json::json!({"spec": {"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
    ]}}));
    assert!(!burstable.guaranteed);
}

#[test]
fn the_example_inventory_loads_with_its_numa_zones() {
    let inv = parse_yaml(EXAMPLE).unwrap();
    assert_eq!(inv.clusters.len(), 2);
    let (_, node) = inv.node("eu-1-gpu-a").unwrap();
    let numa = node.numa.as_ref().unwrap();
    assert_eq!(numa.policy, crate::topology::Policy::SingleNumaNode);
    assert_eq!(
        numa.zones.iter().map(|z| z.id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let gpu = inv.resources.id("nvidia.com/gpu").unwrap();
    assert_eq!(
        inv.cluster("eu-1").unwrap().summary.max_free_in_zone[gpu],
        4000
    );
    assert!(inv.node("eu-1-cpu-a").unwrap().1.numa.is_none());
}

#[test]
fn single_numa_node_places_a_gpu_pod_in_the_zone_that_can_hold_it() {
    let inv = parse_yaml(EXAMPLE).unwrap();
    // Zone 0 has 2 GPUs free, zone 1 has 4: three GPUs fit only in zone 1.
    let fit = node_fit(&inv, "eu-1-gpu-a", &gpu_pod(3), 1);
    assert_eq!(fit.count, 1, "{:?}", fit.misfit);
    assert_eq!(fit.zones_used.ids().collect::<Vec<_>>(), vec![1]);
    // Six never fit on one NUMA node of 4: preemption cannot help.
    let fit = node_fit(&inv, "eu-1-gpu-a", &gpu_pod(6), 1);
    let misfit = fit.misfit.unwrap();
    assert!(misfit.unresolvable());
    let text = misfit.to_string();
    assert!(
        text.contains("needs 6 nvidia.com/gpu on one NUMA node under single-numa-node")
            && text.contains("4 allocatable"),
        "{text}"
    );
}

#[test]
fn an_untolerated_taint_is_unresolvable() {
    let inv = parse_yaml(EXAMPLE).unwrap();
    let mut pod = gpu_pod(1);
    pod.tolerations.clear();
    let misfit = node_fit(&inv, "eu-1-gpu-a", &pod, 1).misfit.unwrap();
    assert!(
        matches!(misfit, Misfit::Taint { .. }) && misfit.unresolvable(),
        "{misfit}"
    );
}

#[test]
fn summed_free_resources_that_no_packing_can_use_are_rejected() {
    // Two nodes with 3 free GPUs each (6 in all): a 4-GPU pod fits on neither.
    let inv = gpu_cluster("none", "container", &[(3, 0), (0, 3)]);
    let fit = cluster_fit(&inv, "c", &gpu_pod(4), 1);
    assert!(!fit.fits());
    let text = fit.misfit.unwrap().to_string();
    assert!(
        text.contains("needs 4 nvidia.com/gpu on one node"),
        "{text}"
    );
    // But two 3-GPU pods do fit, one per node.
    let fit = cluster_fit(&inv, "c", &gpu_pod(3), 2);
    assert!(fit.fits(), "{:?}", fit.misfit);
    assert_eq!(fit.placements, vec![(0, 1), (1, 1)]);
}

#[test]
fn only_a_numa_aware_packing_fits_and_is_found() {
    // n0 has 4 GPUs free but split 2+2; n1 has 4 free in one zone. Node-level fit accepts both,
    // yet under single-numa-node only n1 can take a 4-GPU pod.
    let inv = gpu_cluster("single-numa-node", "container", &[(2, 2), (4, 0)]);
    let fit = cluster_fit(&inv, "c", &gpu_pod(4), 1);
    assert!(fit.fits(), "{:?}", fit.misfit);
    assert_eq!(fit.placements, vec![(1, 1)]);
    // A gang of two such pods does not fit: n0 cannot take one.
    let fit = cluster_fit(&inv, "c", &gpu_pod(4), 2);
    let m = fit.misfit.unwrap();
    assert!(
        matches!(
            &m,
            Misfit::Gang {
                fitted: 1,
                wanted: 2,
                ..
            }
        ),
        "{m}"
    );
}

#[test]
fn a_gang_fills_numa_zones_one_pod_at_a_time() {
    let inv = gpu_cluster("single-numa-node", "container", &[(3, 3)]);
    // Two 2-GPU pods: one per zone. The node still has 2 GPUs free, but split 1+1, so a
    // third is refused by the Topology Manager, not by node-level fit.
    let fit = node_fit(&inv, "n0", &gpu_pod(2), 3);
    assert_eq!(fit.count, 2);
    assert_eq!(fit.zones_used.count(), 2);
    let why = fit.misfit.unwrap().to_string();
    assert!(why.contains("1 free of 4 allocatable"), "{why}");
}

#[test]
fn container_scope_aligns_each_container_pod_scope_the_whole_pod() {
    let two_containers = |gpus: &str| {
        let r = serde_json::json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus});
        shape(serde_json::json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": r, "limits": r}},
            {"name": "b", "resources": {"requests": r, "limits": r}}
        ]}}))
    };
    let container = gpu_cluster("single-numa-node", "container", &[(2, 2)]);
    let fit = node_fit(&container, "n0", &two_containers("2"), 1);
    assert_eq!(fit.count, 1, "{:?}", fit.misfit);
    assert_eq!(fit.traces.len(), 2, "one merge per container");
    let pod = gpu_cluster("single-numa-node", "pod", &[(2, 2)]);
    let fit = node_fit(&pod, "n0", &two_containers("2"), 1);
    assert_eq!(fit.count, 0, "4 GPUs in one zone of 2 free");
    assert_eq!(fit.traces.len(), 1, "one merge for the pod");
}

#[test]
fn restricted_and_best_effort_differ_on_a_spanning_placement() {
    // 3 GPUs with zones of 2 free each: only both zones together can hold them; preferred
    // needs one zone (4 allocatable), so restricted rejects and best-effort admits.
    let restricted = gpu_cluster("restricted", "container", &[(2, 2)]);
    assert_eq!(node_fit(&restricted, "n0", &gpu_pod(3), 1).count, 0);
    let best_effort = gpu_cluster("best-effort", "container", &[(2, 2)]);
    let fit = node_fit(&best_effort, "n0", &gpu_pod(3), 1);
    assert_eq!(fit.count, 1);
    assert_eq!(fit.zones_used.count(), 2);
}

#[test]
fn strategies_rank_placements_as_named() {
    let inv = gpu_cluster("single-numa-node", "container", &[(4, 4), (1, 1)]);
    let pod = gpu_pod(1);
    let bound = pod.bind(&inv.resources);
    let cluster = inv.cluster("c").unwrap();
    let score = |node: usize, s: Strategy| {
        let fit = fit_node(
            &cluster.nodes[node],
            &inv.resources,
            &pod,
            &bound,
            1,
            &EngineConfig::default(),
            false,
        );
        score::node_score(
            s,
            &cluster.nodes[node],
            &fit.state,
            &score::scored_resources(&bound),
            fit.zones_used,
        )
    };
    assert!(score(0, Strategy::LeastAllocated) > score(1, Strategy::LeastAllocated));
    assert!(score(0, Strategy::MostAllocated) < score(1, Strategy::MostAllocated));
    assert_eq!(score(0, Strategy::LeastNumaNodes), 10);
    assert!(pod.strategy(Strategy::LeastAllocated) == Strategy::LeastAllocated);
}

#[test]
fn in_flight_placements_are_not_booked_twice() {
    let inv = gpu_cluster("single-numa-node", "container", &[(4, 0)]);
    let (_, node) = inv.node("n0").unwrap();
    let pod = gpu_pod(4);
    let bound = pod.bind(&inv.resources);
    let now = Instant::now();
    let first = fit_node(
        node,
        &inv.resources,
        &pod,
        &bound,
        1,
        &EngineConfig::default(),
        false,
    );
    assert_eq!(first.count, 1);
    let mut inflight = inflight::InFlight::default();
    inflight.reserve(inflight::Reservation::between(
        "pod-1",
        node,
        &NodeState::of(node),
        &first.state,
        now + Duration::from_secs(30),
    ));
    let adjusted = inflight.node(node, now);
    let second = fit_node(
        &adjusted,
        &inv.resources,
        &pod,
        &bound,
        1,
        &EngineConfig::default(),
        false,
    );
    assert_eq!(second.count, 0, "the zone is taken by the first placement");
    // Expired or released, the space is free again.
    let later = inflight.node(node, now + Duration::from_secs(31));
    assert_eq!(
        fit_node(
            &later,
            &inv.resources,
            &pod,
            &bound,
            1,
            &EngineConfig::default(),
            false
        )
        .count,
        1
    );
    inflight.release("pod-1");
    assert!(inflight.is_empty());
}

#[test]
fn gang_size_annotation_is_validated() {
    let mut pod = gpu_pod(1);
    assert_eq!(pod.gang_size(), Ok(1));
    pod.annotations
        .insert(GANG_SIZE_ANNOTATION.into(), "8".into());
    assert_eq!(pod.gang_size(), Ok(8));
    pod.annotations
        .insert(GANG_SIZE_ANNOTATION.into(), "zero".into());
    assert!(pod.gang_size().unwrap_err().contains("gang-size"));
}

#[test]
fn free_rows_keep_a_summary_exact_as_nodes_gain_and_lose_room() {
    use crate::inventory::FreeRows;
    let inv = parse_yaml(EXAMPLE).unwrap();
    let width = inv.resources.len();
    let gpu = inv.resources.id("nvidia.com/gpu").unwrap();
    let cpu = inv.resources.id("cpu").unwrap();
    let mut cluster = inv.cluster("eu-1").unwrap().clone();
    let mut rows = FreeRows::new(&cluster, width);
    let i = cluster
        .nodes
        .iter()
        .position(|n| &*n.name == "eu-1-gpu-a")
        .unwrap();
    let before = cluster.summary.clone();
    // The node holding the most free GPUs in one zone loses them all, and a CPU: both maxima
    // must come down to what the other nodes have, not stay where they were.
    {
        let node = std::sync::Arc::make_mut(&mut cluster.nodes[i]);
        node.requested[gpu] = node.allocatable[gpu];
        node.requested[cpu] += 1000;
        let numa = std::sync::Arc::make_mut(node.numa.as_mut().unwrap());
        for z in &mut numa.zones {
            z.available[gpu] = 0;
        }
    }
    rows.update(&cluster, i);
    rows.apply(std::sync::Arc::make_mut(&mut cluster.summary));
    let incremental = cluster.summary.clone();
    cluster.summarize(width);
    assert_eq!(incremental, cluster.summary);
    assert!(cluster.summary.max_free_in_zone[gpu] < before.max_free_in_zone[gpu]);
    // And the room comes back.
    let mut restored = inv.cluster("eu-1").unwrap().clone();
    rows.update(&restored, i);
    rows.apply(std::sync::Arc::make_mut(&mut restored.summary));
    assert_eq!(restored.summary, before);
}

#[test]
fn a_summary_left_behind_by_placements_taken_since_changes_no_fit() {
    // Admission takes placements from a cluster without summarizing it again: the summary's
    // free rows then overstate some nodes, and the search must find exactly what it finds on
    // a fresh summary (the rows only let it skip nodes with no room even before the takes).
    let inv = gpu_cluster(
        "single-numa-node",
        "pod",
        &[
            (4, 4),
            (1, 0),
            (3, 1),
            (2, 0),
            (4, 0),
            (0, 2),
            (2, 2),
            (0, 4),
            (1, 1),
        ],
    );
    let table = &inv.resources;
    let config = EngineConfig::default();
    let base = inv.cluster("c").unwrap().clone();
    let mut taken = base.clone();
    for gpus in [2, 3, 1] {
        let pod = gpu_pod(gpus);
        let bound = pod.bind(table);
        let fit = fit_cluster(
            &taken,
            table,
            &pod,
            &bound,
            1,
            &config,
            Strategy::MostAllocated,
        );
        assert!(
            fit.fits(),
            "{gpus} GPUs fit before the takes: {:?}",
            fit.misfit
        );
        for &(i, count) in &fit.placements {
            let node = &taken.nodes[i];
            let after = fit_node(node, table, &pod, &bound, count, &config, false);
            let take = inflight::Take::between(node, &NodeState::of(node), &after.state);
            take.apply_to(std::sync::Arc::make_mut(&mut taken.nodes[i]));
        }
    }
    assert_eq!(taken.summary, base.summary, "not summarized again");
    let mut fresh = taken.clone();
    fresh.summarize(table.len());
    assert_ne!(fresh.summary.node_free, taken.summary.node_free);
    // Without rows, every node is read.
    let mut plain = taken.clone();
    std::sync::Arc::make_mut(&mut plain.summary).node_free = Default::default();
    for (gpus, gang) in [(1, 1), (1, 4), (2, 2), (3, 1), (4, 1), (4, 2), (2, 5)] {
        let pod = gpu_pod(gpus);
        let bound = pod.bind(table);
        for strategy in [Strategy::LeastAllocated, Strategy::MostAllocated] {
            let on = |c: &crate::inventory::Cluster| {
                let f = fit_cluster(c, table, &pod, &bound, gang, &config, strategy);
                (
                    f.placements,
                    f.fitted,
                    f.score,
                    f.misfit.map(|m| m.to_string()),
                )
            };
            let expected = on(&plain);
            assert_eq!(on(&taken), expected, "{gang} × {gpus} GPUs, {strategy:?}");
            assert_eq!(on(&fresh), expected, "{gang} × {gpus} GPUs, {strategy:?}");
        }
    }
}

#[test]
fn a_cluster_whose_summary_rules_out_one_pod_is_refused_with_what_its_largest_zone_has() {
    // Every node under single-numa-node, at most 4 GPUs free in any zone (4 allocatable).
    let inv = gpu_cluster("single-numa-node", "pod", &[(4, 2), (1, 3), (0, 0)]);
    let table = &inv.resources;
    let cluster = inv.cluster("c").unwrap();

    // 6 GPUs: more than any zone can ever hold, so no preemption helps.
    let six = gpu_pod(6);
    let fit = cluster_fit(&inv, "c", &six, 1);
    let misfit = fit.misfit.expect("6 GPUs fit in no zone");
    assert!(misfit.unresolvable(), "{misfit}");
    assert_eq!(
        misfit.to_string(),
        "the Topology Manager of every node of cluster c (single-numa-node) would reject the pod: needs 6 nvidia.com/gpu on one NUMA node under single-numa-node; the largest NUMA zone in cluster c has 4 free of 4 allocatable"
    );
    // A node-level shortfall names the largest node.
    let nine = gpu_pod(9);
    let misfit = cluster_fit(&inv, "c", &nine, 1)
        .misfit
        .expect("9 GPUs fit nowhere");
    assert!(
        misfit.to_string().contains("the largest node in cluster c"),
        "{misfit}"
    );

    // The summary rules a pod out exactly when no node can take one: admission relies on it
    // to skip looking again at nodes that gained room.
    for gpus in 1..=9 {
        let pod = gpu_pod(gpus);
        let bound = pod.bind(table);
        let ruled_out = fit::summary_shortfall(&cluster.summary, &pod, &bound).is_some();
        let on_some_node = cluster
            .nodes
            .iter()
            .any(|n| node_fit(&inv, &n.name, &pod, 1).count == 1);
        assert!(
            !(ruled_out && on_some_node),
            "{gpus} GPUs: ruled out by the summary, yet a node takes one"
        );
        if gpus > 4 {
            assert!(ruled_out, "{gpus} GPUs exceed every zone");
        }
    }
}

/// A training pod that keeps its Job's pods one to a node, as a Job's pods carry its name.
fn one_per_node_pod(gpus: u32) -> PodShape {
    let r = serde_json::json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()});
    shape(serde_json::json!({
        "metadata": {"name": "train-0-x", "namespace": "ml", "labels": {"batch.kubernetes.io/job-name": "train"}},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": r, "limits": r}}],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "train"}},
                "topologyKey": "kubernetes.io/hostname"
            }]}}
        }
    }))
}

#[test]
fn pods_that_keep_one_to_a_node_need_a_node_each() {
    // Three nodes with room for four 2-GPU pods each (single-numa-node, two zones of 4).
    let inv = gpu_cluster("single-numa-node", "container", &[(4, 4), (4, 4), (4, 4)]);
    let apart = one_per_node_pod(2);
    assert!(apart.one_per_node && apart.unmodelled_terms.is_empty());
    // A node takes one of them, however much room it has, and refuses nothing.
    let fit = node_fit(&inv, "n0", &apart, 4);
    assert_eq!((fit.count, fit.misfit), (1, None));
    // Without the anti-affinity, four fit on one node.
    assert_eq!(node_fit(&inv, "n0", &gpu_pod(2), 4).count, 4);
    // A gang of three: a pod on each node.
    let fit = cluster_fit(&inv, "c", &apart, 3);
    assert!(fit.fits(), "{:?}", fit.misfit);
    assert_eq!(fit.placements, vec![(0, 1), (1, 1), (2, 1)]);
    // A gang of four never fits three nodes, and says so.
    let fit = cluster_fit(&inv, "c", &apart, 4);
    let m = fit.misfit.unwrap();
    assert!(
        matches!(
            &m,
            Misfit::Gang {
                fitted: 3,
                wanted: 4,
                ..
            }
        ),
        "{m}"
    );
    assert!(m.unresolvable(), "{m}");
    assert_eq!(
        m.to_string(),
        "only 3 of 4 pods fit at once in cluster c; then: its pods keep one to a node (a required pod anti-affinity to one another on kubernetes.io/hostname), and each node of cluster c holds one"
    );
    // A node without room is the reason when there is one: it may gain room.
    let inv = gpu_cluster("single-numa-node", "container", &[(4, 4), (0, 1), (4, 4)]);
    let m = cluster_fit(&inv, "c", &apart, 3).misfit.unwrap();
    assert!(matches!(&m, Misfit::Gang { fitted: 2, .. }), "{m}");
    assert!(!m.unresolvable(), "{m}");
    assert!(m.to_string().contains("n1"), "{m}");
}

/// A pod of Job `train` with `gpus` GPUs whose pods spread over nodes: a topology spread
/// constraint on the hostname over the Job's pods, with `constraint`'s fields over
/// maxSkew 1 and DoNotSchedule.
fn spread_pod(gpus: u32, constraint: serde_json::Value) -> PodShape {
    let r = serde_json::json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()});
    let mut c = serde_json::json!({
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "train"}}
    });
    c.as_object_mut()
        .unwrap()
        .extend(constraint.as_object().unwrap().clone());
    shape(serde_json::json!({
        "metadata": {"name": "train-0-x", "namespace": "ml", "labels": {"batch.kubernetes.io/job-name": "train"}},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": r, "limits": r}}],
            "topologySpreadConstraints": [c]
        }
    }))
}

#[test]
fn pods_that_spread_over_nodes_are_placed_as_pod_topology_spread_binds_them() {
    // Three nodes with room for four 2-GPU pods each (single-numa-node, two zones of 4).
    let roomy = gpu_cluster("single-numa-node", "container", &[(4, 4), (4, 4), (4, 4)]);
    let pod = spread_pod(2, serde_json::json!({}));
    let spread = apart::Spread {
        max_skew: 1,
        min_domains: 1,
        honor_affinity: true,
        honor_taints: false,
    };
    assert_eq!(pod.spread, Some(spread));
    assert!(pod.unmodelled_terms.is_empty());
    // Unspread, a gang of 4 goes on the first node; spread, on every node, at most one apart.
    let placed = |inv: &Inventory, pod: &PodShape, n: usize| {
        let fit = cluster_fit(inv, "c", pod, n);
        assert!(fit.fits(), "{n}: {:?}", fit.misfit.map(|m| m.to_string()));
        fit.placements
    };
    assert_eq!(placed(&roomy, &gpu_pod(2), 4), [(0, 4)]);
    assert_eq!(placed(&roomy, &pod, 4), [(0, 2), (1, 1), (2, 1)]);
    assert_eq!(placed(&roomy, &pod, 12), [(0, 4), (1, 4), (2, 4)]);
    // A node with room for one pod: no node may take more than 2.
    let tight = gpu_cluster("single-numa-node", "container", &[(4, 4), (2, 0), (4, 4)]);
    assert_eq!(placed(&tight, &pod, 5), [(0, 2), (1, 1), (2, 2)]);
    let m = cluster_fit(&tight, "c", &pod, 6).misfit.unwrap();
    assert_eq!(
        m.to_string(),
        "only 5 of 6 pods fit at once in cluster c; then: its pods spread over nodes (a topology spread constraint on kubernetes.io/hostname, maxSkew 1): node n1 of cluster c takes 1 of them, so no node may take more than 2"
    );
    assert!(!m.unresolvable(), "n1 may gain room: {m}");
    assert!(placed(&tight, &gpu_pod(2), 6).len() > 1, "unspread it fits");
    // A full node counts, with none: every other node may take maxSkew.
    let full = gpu_cluster("single-numa-node", "container", &[(4, 4), (0, 0), (4, 4)]);
    let m = cluster_fit(&full, "c", &pod, 3).misfit.unwrap();
    assert!(
        matches!(
            &m,
            Misfit::Gang {
                fitted: 2,
                wanted: 3,
                ..
            }
        ),
        "{m}"
    );
    let loose = spread_pod(2, serde_json::json!({"maxSkew": 2}));
    assert_eq!(placed(&full, &loose, 3), [(0, 2), (2, 1)]);
    // Fewer nodes than minDomains: the least count is taken as 0, for good.
    let many = spread_pod(2, serde_json::json!({"minDomains": 4}));
    assert_eq!(placed(&roomy, &many, 3), [(0, 1), (1, 1), (2, 1)]);
    let m = cluster_fit(&roomy, "c", &many, 4).misfit.unwrap();
    assert!(m.unresolvable(), "{m}");
    assert!(
        m.to_string().ends_with("cluster c has 3 node(s) it counts, fewer than its minDomains 4, so no node may take more than 1"),
        "{m}"
    );
}

#[test]
fn a_node_the_pods_cannot_run_on_counts_for_their_spread_as_its_policies_say() {
    // n1 has room, but a taint the pod does not tolerate, and no `pool: gpu` label.
    let yaml = gpu_cluster_yaml("single-numa-node", "container", &[(4, 4), (4, 4), (4, 4)])
        .replace(
            "      - name: n1\n",
            "      - name: n1\n        taints: [{key: dedicated, value: db, effect: NoSchedule}]\n",
        )
        .replace(
            "      - name: n0\n",
            "      - name: n0\n        labels: {pool: gpu}\n",
        )
        .replace(
            "      - name: n2\n",
            "      - name: n2\n        labels: {pool: gpu}\n",
        );
    let inv = parse_yaml(&yaml).unwrap();
    let fit = |pod: &PodShape, n: usize| cluster_fit(&inv, "c", pod, n);
    // By default the tainted node counts, with no pod: a node may take one.
    let pod = spread_pod(2, serde_json::json!({}));
    assert_eq!(fit(&pod, 2).placements, [(0, 1), (2, 1)]);
    let m = fit(&pod, 3).misfit.unwrap();
    assert!(m.unresolvable(), "the taint stays: {m}");
    assert!(
        m.to_string()
            .contains("node n1 of cluster c takes 0 of them"),
        "{m}"
    );
    // nodeTaintsPolicy: Honor leaves it out.
    let honor = spread_pod(2, serde_json::json!({"nodeTaintsPolicy": "Honor"}));
    assert_eq!(fit(&honor, 3).placements, [(0, 2), (2, 1)]);
    // A node the pod's node selector refuses does not count (nodeAffinityPolicy: Honor),
    // unless the policy is Ignore.
    let selected = |constraint: serde_json::Value| {
        let mut pod = spread_pod(2, constraint);
        pod.node_selector.insert("pool".into(), "gpu".into());
        pod.tolerations = serde_json::from_value(serde_json::json!([
            {"key": "dedicated", "operator": "Exists"}
        ]))
        .unwrap();
        pod
    };
    assert_eq!(
        fit(&selected(serde_json::json!({})), 3).placements,
        [(0, 2), (2, 1)]
    );
    let ignore = selected(serde_json::json!({"nodeAffinityPolicy": "Ignore"}));
    assert!(!fit(&ignore, 3).fits());
}

/// A pod of Job `train` with `gpus` GPUs whose pods keep together: a required pod affinity to
/// the Job's own pods on each of `keys`.
fn together_pod(gpus: u32, keys: &[&str]) -> PodShape {
    let r = serde_json::json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()});
    let terms: Vec<serde_json::Value> = (keys.iter())
        .map(|k| {
            serde_json::json!({
                "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "train"}},
                "topologyKey": k
            })
        })
        .collect();
    shape(serde_json::json!({
        "metadata": {"name": "train-0-x", "namespace": "ml", "labels": {"batch.kubernetes.io/job-name": "train"}},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": r, "limits": r}}],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
        }
    }))
}

/// `yaml` with `labels` (a flow map) on node `node`.
fn labelled(yaml: &str, node: &str, labels: &str) -> String {
    let line = format!("      - name: {node}\n");
    assert!(yaml.contains(&line), "no node {node}");
    yaml.replace(&line, &format!("{line}        labels: {labels}\n"))
}

#[test]
fn pods_kept_together_go_in_one_domain_of_their_key() {
    const ZONE: &str = "topology.kubernetes.io/zone";
    // Zone a: n0 with room for four 2-GPU pods, n1 for one; zone b: n2 and n3, four each;
    // n4, with room but no zone label, is in no zone.
    let mut yaml = gpu_cluster_yaml(
        "single-numa-node",
        "container",
        &[(4, 4), (2, 0), (4, 4), (4, 4), (4, 4)],
    );
    for (node, zone) in [("n0", "a"), ("n1", "a"), ("n2", "b"), ("n3", "b")] {
        yaml = labelled(&yaml, node, &format!("{{{ZONE}: {zone}}}"));
    }
    let inv = parse_yaml(&yaml).unwrap();
    let pod = together_pod(2, &[ZONE]);
    assert_eq!(pod.together, [ZONE]);
    assert!(pod.unmodelled_terms.is_empty() && !pod.one_per_node && pod.spread.is_none());
    let placed = |pod: &PodShape, n: usize| {
        let fit = cluster_fit(&inv, "c", pod, n);
        assert!(fit.fits(), "{n}: {:?}", fit.misfit.map(|m| m.to_string()));
        fit.placements
    };
    // Without the affinity, a gang of 6 takes the first nodes, across both zones.
    assert_eq!(placed(&gpu_pod(2), 6), [(0, 4), (1, 1), (2, 1)]);
    // With it, only zone b holds 6.
    assert_eq!(placed(&pod, 6), [(2, 4), (3, 2)]);
    // Both zones hold 5: the emptier one, as LeastAllocated scores it.
    assert_eq!(placed(&pod, 5), [(2, 4), (3, 1)]);
    // Nine pods: no zone holds them, though the cluster does (n4 has no zone).
    assert!(placed(&gpu_pod(2), 9).len() > 2);
    let m = cluster_fit(&inv, "c", &pod, 9).misfit.unwrap();
    assert!(
        matches!(
            &m,
            Misfit::Gang {
                fitted: 8,
                wanted: 9,
                ..
            }
        ),
        "{m}"
    );
    assert!(!m.unresolvable(), "zone b may gain room: {m}");
    assert_eq!(
        m.to_string(),
        "only 8 of 9 pods fit at once in cluster c; then: its pods keep together in one topology.kubernetes.io/zone (a required pod affinity to one another), and none of the 2 topology.kubernetes.io/zone domain(s) of cluster c holds them all; in topology.kubernetes.io/zone=b, which holds the most: needs 2 nvidia.com/gpu on one node; node n2 has 0 free of 8 allocatable",
        "{m}"
    );
    // A key no node has: never.
    let rack = together_pod(2, &["example.com/rack"]);
    let m = cluster_fit(&inv, "c", &rack, 1).misfit.unwrap();
    assert!(m.unresolvable(), "{m}");
    assert_eq!(
        m.to_string(),
        "its pods keep together in one example.com/rack (a required pod affinity to one another), and no node of cluster c has the label example.com/rack"
    );
    // Two keys: one domain of both. Racks r1 = {n0, n2}, r2 = {n1, n3}: no zone and rack
    // holds more than 4.
    let mut racked = yaml.clone();
    for (node, rack) in [("n0", "r1"), ("n2", "r1"), ("n1", "r2"), ("n3", "r2")] {
        racked = racked.replace(
            &format!("      - name: {node}\n        labels: {{{ZONE}: "),
            &format!("      - name: {node}\n        labels: {{example.com/rack: {rack}, {ZONE}: "),
        );
    }
    let racked = parse_yaml(&racked).unwrap();
    let both = together_pod(2, &[ZONE, "example.com/rack"]);
    let fit = cluster_fit(&racked, "c", &both, 4);
    assert!(fit.fits(), "{:?}", fit.misfit.map(|m| m.to_string()));
    assert_eq!(fit.placements.len(), 1, "one node of one zone and rack");
    let m = cluster_fit(&racked, "c", &both, 5).misfit.unwrap();
    assert!(
        m.to_string()
            .contains("none of the 4 topology.kubernetes.io/zone and example.com/rack domain(s)"),
        "{m}"
    );
    // The hostname: all on one node; a node's name stands for its label.
    let one_node = together_pod(2, &[apart::HOSTNAME]);
    assert_eq!(placed(&one_node, 4), [(0, 4)]);
    let m = cluster_fit(&inv, "c", &one_node, 5).misfit.unwrap();
    assert!(
        m.to_string()
            .contains("in kubernetes.io/hostname=n0, which holds the most"),
        "{m}"
    );
}

#[test]
fn only_an_affinity_to_the_pods_own_kind_keeps_them_together() {
    let with = |term: serde_json::Value| {
        shape(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "train"}},
            "spec": {
                "containers": [{"name": "main"}],
                "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
            }
        }))
    };
    let own = serde_json::json!({"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"});
    assert_eq!(with(own).together, ["zone"]);
    // Beside other pods (a cache, a dataset server): not modelled, and named.
    for other in [
        serde_json::json!({"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}),
        serde_json::json!({"topologyKey": "zone"}),
        serde_json::json!({"labelSelector": {"matchLabels": {"app": "train"}}, "namespaces": ["other"], "topologyKey": "zone"}),
    ] {
        let pod = with(other.clone());
        assert!(pod.together.is_empty(), "{other}");
        assert_eq!(
            pod.unmodelled_terms,
            [apart::Unmodelled::Affinity(0)],
            "{other}"
        );
    }
    // With a spread over nodes, the spread is modelled and the affinity named.
    let view: crate::placement::PodView = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "train"}},
        "spec": {
            "containers": [{"name": "main"}],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"}
            ]}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "train"}}}]
        }
    }))
    .unwrap();
    let spread = PodShape::from_view(&view).unwrap();
    assert!(spread.spread.is_some() && spread.together.is_empty());
    assert_eq!(spread.unmodelled_terms, [apart::Unmodelled::Affinity(0)]);
}
