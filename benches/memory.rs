//! Memory of the live inventory at the scale: 100 workers × 1,000 nodes × 2 NUMA
//! zones × 30 pods per node, fed through the same hub the watches feed, then published as
//! one snapshot. Prints the process's resident set (VmRSS) and its peak (VmHWM).
//!
//!     cargo bench --bench memory            # full scale (target: under 300 MB)
//!     MEMORY_WORKERS=10 cargo bench --bench memory
//!
//! Objects are built as typed k8s-openapi values (as kube-runtime hands them over) and
//! dropped after each event, as the watchers do: only what the inventory keeps stays.

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use switchyard::inventory::InventoryStore;
use switchyard::workers::hub::{Hub, Update};

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn q(s: &str) -> Quantity {
    Quantity(s.to_string())
}

fn node(name: &str) -> Node {
    let alloc = BTreeMap::from([
        ("cpu".to_string(), q("64")),
        ("memory".to_string(), q("256Gi")),
        ("nvidia.com/gpu".to_string(), q("8")),
        ("pods".to_string(), q("110")),
    ]);
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                (
                    "topology.kubernetes.io/zone".to_string(),
                    "zone-a".to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(alloc.clone()),
            capacity: Some(alloc),
            ..Default::default()
        }),
    }
}

fn pod(uid: u128, node: &str, shape: usize) -> Pod {
    let (cpu, mem) = [
        ("500m", "1Gi"),
        ("1", "2Gi"),
        ("2", "4Gi"),
        ("250m", "512Mi"),
        ("4", "16Gi"),
    ][shape % 5];
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("p-{uid:x}")),
            namespace: Some("default".into()),
            uid: Some(format!(
                "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                (uid >> 96) as u32,
                (uid >> 80) as u16,
                (uid >> 64) as u16,
                (uid >> 48) as u16,
                uid as u64 & 0xffff_ffff_ffff
            )),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), q(cpu)),
                        ("memory".to_string(), q(mem)),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn nrt(name: &str) -> DynamicObject {
    let ar = ApiResource {
        group: "topology.node.k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: "topology.node.k8s.io/v1alpha2".into(),
        kind: "NodeResourceTopology".into(),
        plural: "noderesourcetopologies".into(),
    };
    let zone = |i: u32| {
        serde_json::json!({"name": format!("node-{i}"), "type": "Node", "resources": [
        {"name": "cpu", "capacity": "32", "allocatable": "32", "available": "20"},
        {"name": "memory", "capacity": "128Gi", "allocatable": "128Gi", "available": "100Gi"},
        {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": "2"}]})
    };
    DynamicObject::new(name, &ar).data(serde_json::json!({
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [zone(0), zone(1)]
    }))
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --benches` builds and starts this; the measurement is for `cargo bench`.
        println!("memory: run with `cargo bench --bench memory`");
        return;
    }
    let workers: usize = std::env::var("MEMORY_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let nodes_per: usize = std::env::var("MEMORY_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let pods_per: usize = std::env::var("MEMORY_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let with_nrt = std::env::var("MEMORY_NRT").map_or(true, |v| v != "0");
    let base = status_kb("VmRSS:");
    let started = Instant::now();
    let store = Arc::new(InventoryStore::default());
    let mut hub = Hub::new(store.clone(), std::time::Duration::from_secs(3600));
    let now = SystemTime::now();
    let mut uid: u128 = 0x1234_5678_9abc_def0_0000_0000_0000_0000;
    for w in 0..workers {
        let cluster = format!("worker-{w:03}");
        hub.add_worker(&cluster, Default::default(), now);
        hub.apply(Update::Pod(cluster.clone(), Box::new(Event::Init)), now);
        for n in 0..nodes_per {
            let name = format!("{cluster}-node-{n:04}");
            hub.apply(
                Update::Node(cluster.clone(), Box::new(Event::Apply(node(&name)))),
                now,
            );
            if with_nrt {
                hub.apply(
                    Update::Topology(cluster.clone(), Box::new(Event::Apply(nrt(&name)))),
                    now,
                );
            }
            for p in 0..pods_per {
                uid = uid.wrapping_add(0x9E37_79B9_7F4A_7C15);
                hub.apply(
                    Update::Pod(
                        cluster.clone(),
                        Box::new(Event::InitApply(pod(uid, &name, p))),
                    ),
                    now,
                );
            }
        }
        hub.apply(Update::Pod(cluster.clone(), Box::new(Event::InitDone)), now);
    }
    hub.publish(now);
    let snapshot = store.snapshot();
    let nodes: usize = snapshot.clusters.iter().map(|c| c.nodes.len()).sum();
    let rss = status_kb("VmRSS:");
    let peak = status_kb("VmHWM:");
    println!(
        "live inventory: {workers} workers × {nodes_per} nodes × 2 NUMA zones × {pods_per} pods = {} pods, {nodes} nodes published in {:.1}s",
        workers * nodes_per * pods_per,
        started.elapsed().as_secs_f64()
    );
    println!(
        "RSS {:.0} MB (process at start {:.0} MB), peak {:.0} MB; target: under 300 MB",
        rss as f64 / 1024.0,
        base as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    println!(
        "{{\"bench\":\"memory\",\"workers\":{workers},\"nodes\":{nodes},\"pods\":{},\"rss_mb\":{:.0},\"peak_mb\":{:.0}}}",
        workers * nodes_per * pods_per,
        rss as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    drop(hub);
}
