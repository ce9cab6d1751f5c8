use super::*;
use crate::rng::Rng;
use serde_json::json;
use std::collections::BTreeSet;

fn node(name: &str, cpu: u64, gpus: u64, tainted: bool) -> KubeNode {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": if tainted { json!({"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}) } else { json!({}) },
        "status": {"allocatable": {"cpu": cpu.to_string(), "memory": "64Gi", "nvidia.com/gpu": gpus.to_string(), "pods": "110"}}
    }))
    .unwrap()
}

fn pod(uid: &str, node: &str, cpu_milli: u64, phase: &str, sidecar: bool) -> Pod {
    let mut init = vec![];
    if sidecar {
        init.push(json!({"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {
            "nodeName": node,
            "initContainers": init,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": format!("{cpu_milli}m"), "memory": "1Gi"}}}]
        },
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn nrt(gpus_free: (u64, u64)) -> serde_json::Value {
    json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [
            {"name": "node-0", "type": "Node", "resources": [{"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": gpus_free.0.to_string()}]},
            {"name": "node-1", "type": "Node", "resources": [{"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": gpus_free.1.to_string()}]}
        ]
    })
}

/// A cluster as names and amounts, independent of resource ids.
fn comparable(state: &ClusterState, table: &mut ResourceTable) -> String {
    let (cluster, problems) = state.to_cluster(table);
    assert!(problems.is_empty(), "{problems:?}");
    describe(&cluster, table)
}

fn describe(cluster: &Cluster, table: &ResourceTable) -> String {
    let named = |v: &[i64], table: &ResourceTable| -> BTreeMap<String, i64> {
        v.iter()
            .enumerate()
            .filter(|(_, q)| **q != 0)
            .map(|(i, q)| (table.name(i).to_string(), *q))
            .collect()
    };
    let mut out = String::new();
    for n in &cluster.nodes {
        out += &format!(
            "{} {:?} {:?} alloc={:?} req={:?}",
            n.name,
            n.labels,
            n.taints,
            named(&n.allocatable, table),
            named(&n.requested, table)
        );
        if let Some(t) = &n.numa {
            for z in &t.zones {
                out += &format!(" zone {} {:?}", z.id, named(&z.available, table));
            }
        }
        out += "\n";
    }
    out
}

#[test]
fn pod_requests_count_sidecars_and_one_pod() {
    let reqs: BTreeMap<String, i64> = pod_requests(&pod("a", "n", 500, "Running", true))
        .into_iter()
        .collect();
    assert_eq!(reqs["cpu"], 600);
    assert_eq!(reqs["pods"], 1000);
    assert_eq!(reqs["memory"], (1i64 << 30) * 1000);
}

#[test]
fn finished_and_unbound_pods_hold_nothing() {
    let mut s = ClusterState::new("c", Default::default());
    s.apply_node(&node("n1", 8, 0, false));
    s.apply_pod(&pod("done", "n1", 1000, "Succeeded", false));
    s.apply_pod(&pod("failed", "n1", 1000, "Failed", false));
    let mut pending = pod("pending", "n1", 1000, "Pending", false);
    pending.spec.as_mut().unwrap().node_name = None;
    s.apply_pod(&pending);
    assert_eq!(s.pod_count(), 0);
    // A running pod that later succeeds releases what it held.
    s.apply_pod(&pod("p", "n1", 1000, "Running", false));
    assert!(comparable(&s, &mut ResourceTable::default()).contains("\"cpu\": 1000"));
    s.apply_pod(&pod("p", "n1", 1000, "Succeeded", false));
    assert!(!comparable(&s, &mut ResourceTable::default()).contains("req={\"cpu\""));
}

#[test]
fn the_inventory_after_a_stream_of_events_equals_one_built_from_the_final_state() {
    for seed in 1..=20u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut live = ClusterState::new("c", Default::default());
        let mut live_table = ResourceTable::default();
        let mut nodes: BTreeMap<String, KubeNode> = BTreeMap::new();
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut topologies: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        for step in 0..400 {
            let n = format!("n{}", rng.below(6));
            match rng.below(9) {
                0 | 1 => {
                    let k = node(&n, 4 + rng.below(60), rng.below(9), rng.below(2) == 0);
                    live.apply_node(&k);
                    nodes.insert(n, k);
                }
                2 => {
                    live.delete_node(&n);
                    nodes.remove(&n);
                }
                3..=5 => {
                    let uid = format!("p{}", rng.below(40));
                    let phase = ["Pending", "Running", "Running", "Succeeded", "Failed"]
                        [rng.below(5) as usize];
                    let p = pod(
                        &uid,
                        &n,
                        100 * (1 + rng.below(20)),
                        phase,
                        rng.below(3) == 0,
                    );
                    live.apply_pod(&p);
                    pods.insert(uid, p);
                }
                6 => {
                    let uid = format!("p{}", rng.below(40));
                    live.delete_pod(&uid);
                    pods.remove(&uid);
                }
                7 => {
                    let t = nrt((rng.below(5), rng.below(5)));
                    live.apply_topology(&n, &t, &mut live_table);
                    topologies.insert(n, t);
                }
                _ => {
                    live.delete_topology(&n);
                    topologies.remove(&n);
                }
            }
            // Now and then a relist replaces everything, as after a 410 Gone.
            if step % 97 == 96 {
                live.begin_pod_relist();
                for p in pods.values() {
                    live.relist_pod(p);
                }
                live.end_pod_relist();
            }
        }
        let mut scratch = ClusterState::new("c", Default::default());
        let mut scratch_table = ResourceTable::default();
        for k in nodes.values() {
            scratch.apply_node(k);
        }
        for p in pods.values() {
            scratch.apply_pod(p);
        }
        for (n, t) in &topologies {
            scratch.apply_topology(n, t, &mut scratch_table);
        }
        assert_eq!(
            comparable(&live, &mut live_table),
            comparable(&scratch, &mut scratch_table),
            "seed {seed}"
        );
        let names: BTreeSet<_> = nodes.keys().cloned().collect();
        assert_eq!(
            comparable(&live, &mut live_table).lines().count(),
            names.len()
        );
    }
}

#[test]
fn pods_are_keyed_by_their_uid_whatever_its_form() {
    assert_eq!(
        pod_key("9331e4ae-a2b6-4846-9ec5-a3fe93629b05"),
        pod_key("9331e4ae-a2b6-4846-9ec5-a3fe93629b05")
    );
    assert_ne!(pod_key("p1"), pod_key("p2"));
    let mut s = ClusterState::new("c", Default::default());
    s.apply_node(&node("n1", 8, 0, false));
    for uid in ["9331e4ae-a2b6-4846-9ec5-a3fe93629b05", "p1"] {
        s.apply_pod(&pod(uid, "n1", 1000, "Running", false));
    }
    assert_eq!(s.pod_count(), 2);
    // The same pod again replaces its record.
    s.apply_pod(&pod("p1", "n1", 2000, "Running", false));
    assert_eq!(s.pod_count(), 2);
    assert!(comparable(&s, &mut ResourceTable::default()).contains("\"cpu\": 3000"));
    s.delete_pod("9331e4ae-a2b6-4846-9ec5-a3fe93629b05");
    s.delete_pod("p1");
    assert_eq!(s.pod_count(), 0);
    assert!(!comparable(&s, &mut ResourceTable::default()).contains("req={\"cpu\""));
}

fn big_node(name: &str, memory: &str) -> KubeNode {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "8", "memory": memory, "pods": "110"}}
    }))
    .unwrap()
}

fn big_pod(uid: &str, node: &str, memory: &str) -> Pod {
    let c = |n: &str| json!({"name": n, "resources": {"requests": {"cpu": "1", "memory": memory}}});
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [c("a"), c("b")],
                 "overhead": {"memory": memory}},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

#[test]
fn huge_remote_amounts_saturate_and_sums_stay_exact_below_the_limit() {
    // 9e15 bytes: 9e18 milli-units, just under i64::MAX; two of them do not fit.
    let huge = 9_000_000_000_000_000_000i64;
    let mut s = ClusterState::new("c", Default::default());
    s.apply_node(&big_node("n1", "9e15"));
    s.apply_node(&big_node("n2", "9e15"));
    // Two containers and an overhead of 9e15 each: the pod's own sum saturates.
    let reqs: BTreeMap<String, i64> = pod_requests(&big_pod("p1", "n1", "9e15"))
        .into_iter()
        .collect();
    assert_eq!(reqs["memory"], i64::MAX);
    s.apply_pod(&big_pod("p1", "n1", "9e15"));
    s.apply_pod(&big_pod("p2", "n1", "1"));
    let mut table = ResourceTable::default();
    let (mut cluster, _) = s.to_cluster(&mut table);
    cluster.summarize(table.len());
    let mem = table.id("memory").unwrap();
    let cpu = table.id("cpu").unwrap();
    assert_eq!(
        cluster.summary.allocatable[mem],
        i64::MAX,
        "saturated, not wrapped"
    );
    let n1 = &cluster.nodes[0];
    assert_eq!(n1.requested[mem], i64::MAX);
    assert!(n1.free(mem) <= 0, "nothing free: {}", n1.free(mem));
    assert_eq!(n1.requested[cpu], 4000);
    // Sums are kept exactly, so taking the huge pod away leaves exactly the small one.
    s.delete_pod("p1");
    let (cluster, _) = s.to_cluster(&mut table);
    assert_eq!(cluster.nodes[0].requested[mem], 3000);
    assert_eq!(cluster.nodes[0].allocatable[mem], huge);
}

#[test]
fn resource_names_beyond_the_id_limit_are_ignored_not_wrapped() {
    let mut alloc = serde_json::Map::new();
    alloc.insert("cpu".into(), json!("8"));
    for i in 0..70_000u32 {
        alloc.insert(format!("example.com/r{i:05}"), json!("1"));
    }
    let node: KubeNode = serde_json::from_value(json!({
        "metadata": {"name": "wide"},
        "status": {"allocatable": alloc}
    }))
    .unwrap();
    let mut s = ClusterState::new("c", Default::default());
    s.apply_node(&node);
    let mut table = ResourceTable::default();
    let (cluster, _) = s.to_cluster(&mut table);
    let n = &cluster.nodes[0];
    // "cpu" sorts first and keeps id 0: no later name lands on it.
    assert_eq!(n.allocatable[table.id("cpu").unwrap()], 8000);
    let kept = n.allocatable.iter().filter(|q| **q != 0).count();
    assert_eq!(kept, usize::from(u16::MAX) + 1, "every id used once");
    assert!(table.id("example.com/r69999").is_none());
}

fn pooled_node(name: &str) -> KubeNode {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "gpu",
                                              "kubernetes.io/os": "linux"}},
        "status": {"allocatable": {"cpu": "8"},
                   "images": [{"names": ["registry.example/big@sha256:0"], "sizeBytes": 1}]}
    }))
    .unwrap()
}

#[test]
fn a_node_relist_replaces_the_nodes_at_its_end_and_their_labels_are_shared() {
    let names = |s: &ClusterState| -> Vec<String> {
        let (c, _) = s.to_cluster(&mut ResourceTable::default());
        c.nodes.iter().map(|n| n.name.to_string()).collect()
    };
    let mut s = ClusterState::new("c", Default::default());
    s.apply_node(&pooled_node("gone"));
    s.begin_node_relist();
    s.relist_node(&pooled_node("a"));
    s.relist_node(&pooled_node("b"));
    assert_eq!(
        names(&s),
        ["gone"],
        "nothing changes before the relist ends"
    );
    s.end_node_relist();
    assert_eq!(names(&s), ["a", "b"]);
    // One label each for the shared pairs, one per hostname; the gone node's hostname was
    // dropped with it.
    assert_eq!(s.interner.labels.len(), 2 + 2);
    let (c, _) = s.to_cluster(&mut ResourceTable::default());
    assert_eq!(c.nodes[0].labels.get("pool"), Some("gpu"));
    assert_eq!(c.nodes[1].labels.get("kubernetes.io/hostname"), Some("b"));
    assert_eq!(c.nodes[1].labels.len(), 3);
    // A relist of topologies works the same way.
    s.apply_topology("gone", &nrt((1, 1)), &mut ResourceTable::default());
    let mut table = ResourceTable::default();
    s.begin_topology_relist();
    s.relist_topology("a", &nrt((2, 3)), &mut table);
    let zones = |s: &ClusterState, table: &mut ResourceTable| -> Vec<usize> {
        let (c, _) = s.to_cluster(table);
        c.nodes
            .iter()
            .map(|n| n.numa.as_ref().map_or(0, |t| t.zones.len()))
            .collect()
    };
    assert_eq!(zones(&s, &mut table), [0, 0]);
    s.end_topology_relist();
    assert_eq!(zones(&s, &mut table), [2, 0]);
    s.forget_topologies();
    assert_eq!(zones(&s, &mut table), [0, 0]);
}

#[test]
fn the_hub_after_events_and_relists_of_every_kind_equals_the_inventory_built_from_scratch() {
    use crate::inventory::InventoryStore;
    use crate::workers::hub::{Hub, Update};
    use crate::workers::watch::nrt_resource;
    use kube::api::DynamicObject;
    use kube::runtime::watcher::Event;
    use std::time::{Duration, SystemTime};

    let topology = |name: &str, t: &serde_json::Value| {
        DynamicObject::new(name, &nrt_resource()).data(t.clone())
    };
    let node_update = |e: Event<KubeNode>| Update::Node("c".into(), Box::new(e));
    let pod_update = |e: Event<Pod>| Update::Pod("c".into(), Box::new(e));
    let nrt_update = |e: Event<DynamicObject>| Update::Topology("c".into(), Box::new(e));
    for seed in 1..=12u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let store = std::sync::Arc::new(InventoryStore::default());
        let mut hub = Hub::new(store.clone(), Duration::from_secs(3600));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        hub.apply(Update::Registered("c".into(), BTreeMap::new()), now);
        let mut nodes: BTreeMap<String, KubeNode> = BTreeMap::new();
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut topologies: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        for step in 0..400 {
            let n = format!("n{}", rng.below(6));
            let update = match rng.below(9) {
                0 | 1 => {
                    let k = node(&n, 4 + rng.below(60), rng.below(9), rng.below(2) == 0);
                    nodes.insert(n, k.clone());
                    node_update(Event::Apply(k))
                }
                2 => match nodes.remove(&n) {
                    Some(k) => node_update(Event::Delete(k)),
                    None => Update::Fresh("c".into(), crate::workers::watch::Kind::Nodes),
                },
                3..=5 => {
                    let uid = format!("p{}", rng.below(40));
                    let phase = ["Pending", "Running", "Running", "Succeeded", "Failed"]
                        [rng.below(5) as usize];
                    let p = pod(
                        &uid,
                        &n,
                        100 * (1 + rng.below(20)),
                        phase,
                        rng.below(3) == 0,
                    );
                    pods.insert(uid, p.clone());
                    pod_update(Event::Apply(p))
                }
                6 => match pods.remove(&format!("p{}", rng.below(40))) {
                    Some(p) => pod_update(Event::Delete(p)),
                    None => Update::Fresh("c".into(), crate::workers::watch::Kind::Pods),
                },
                7 => {
                    let t = nrt((rng.below(5), rng.below(5)));
                    topologies.insert(n.clone(), t.clone());
                    nrt_update(Event::Apply(topology(&n, &t)))
                }
                _ => match topologies.remove(&n) {
                    Some(t) => nrt_update(Event::Delete(topology(&n, &t))),
                    None => Update::Fresh("c".into(), crate::workers::watch::Kind::Topologies),
                },
            };
            // Some events are missed, as across a watch that expired: only the next relist
            // of the kind puts the hub right, removing what is gone.
            if rng.below(4) != 0 {
                hub.apply(update, now);
            }
            // Now and then one kind is listed again, as after a 410 Gone; sometimes an
            // attempt breaks off after a few objects and starts over. At the end every kind
            // is listed once more.
            let last = step == 399;
            let relists: Vec<u64> = if last {
                vec![0, 1, 2]
            } else if rng.below(25) == 0 {
                vec![rng.below(3)]
            } else {
                vec![]
            };
            for kind in relists {
                let attempts = 1 + rng.below(2);
                for attempt in 0..attempts {
                    let complete = attempt + 1 == attempts;
                    match kind {
                        0 => {
                            hub.apply(node_update(Event::Init), now);
                            for k in nodes.values().take(if complete { usize::MAX } else { 2 }) {
                                hub.apply(node_update(Event::InitApply(k.clone())), now);
                            }
                            if complete {
                                hub.apply(node_update(Event::InitDone), now);
                            }
                        }
                        1 => {
                            hub.apply(pod_update(Event::Init), now);
                            for p in pods.values().take(if complete { usize::MAX } else { 3 }) {
                                hub.apply(pod_update(Event::InitApply(p.clone())), now);
                            }
                            if complete {
                                hub.apply(pod_update(Event::InitDone), now);
                            }
                        }
                        _ => {
                            hub.apply(nrt_update(Event::Init), now);
                            for (n, t) in
                                topologies
                                    .iter()
                                    .take(if complete { usize::MAX } else { 1 })
                            {
                                hub.apply(nrt_update(Event::InitApply(topology(n, t))), now);
                            }
                            if complete {
                                hub.apply(nrt_update(Event::InitDone), now);
                            }
                        }
                    }
                }
            }
        }
        hub.publish(now);
        let inventory = store.snapshot();
        let live = describe(inventory.cluster("c").unwrap(), &inventory.resources);

        let mut scratch = ClusterState::new("c", Default::default());
        let mut scratch_table = ResourceTable::default();
        for k in nodes.values() {
            scratch.apply_node(k);
        }
        for p in pods.values() {
            scratch.apply_pod(p);
        }
        for (n, t) in &topologies {
            scratch.apply_topology(n, t, &mut scratch_table);
        }
        assert_eq!(
            live,
            comparable(&scratch, &mut scratch_table),
            "seed {seed}"
        );
        assert_eq!(live.lines().count(), nodes.len());
    }
}
