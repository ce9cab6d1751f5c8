//! Memory of the live inventory at the scale: 100 workers × 1,000 nodes × 2 NUMA
//! zones × 30 pods per node, fed through the same hub the watches feed, as a manager starting
//! up sees it: every worker relisting its nodes, NodeResourceTopology objects and pods at once
//! (`Init`, `InitApply` interleaved across workers, `InitDone`), then published as one
//! snapshot. Prints the process's resident set (VmRSS) and its peak (VmHWM).
//!
//!     cargo bench --bench memory            # full scale (target: under 300 MB)
//!     MEMORY_WORKERS=10 cargo bench --bench memory
//!
//! Objects are built as typed k8s-openapi values (as kube hands them over) shaped like real
//! ones (Nodes with 25 labels, five conditions, addresses, node info and 30 images) and
//! dropped after each event, as the watches do: only what the inventory keeps stays.

use k8s_openapi::api::core::v1::{
    Container, ContainerImage, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus,
    NodeSystemInfo, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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

/// The labels of a GPU node as a cloud provider, node-feature-discovery, the GPU operator and
/// a node autoscaler leave them: 25, all but the hostname and the rack shared by its pool.
fn labels(cluster: &str, n: usize, name: &str) -> BTreeMap<String, String> {
    let pool = n % 4;
    let zone = ["a", "b", "c"][n % 3];
    let l = |k: &str, v: String| (k.to_string(), v);
    BTreeMap::from([
        l("kubernetes.io/hostname", name.into()),
        l("kubernetes.io/os", "linux".into()),
        l("kubernetes.io/arch", "amd64".into()),
        l("beta.kubernetes.io/os", "linux".into()),
        l("beta.kubernetes.io/arch", "amd64".into()),
        l(
            "beta.kubernetes.io/instance-type",
            format!("p5.48xlarge-{pool}"),
        ),
        l(
            "node.kubernetes.io/instance-type",
            format!("p5.48xlarge-{pool}"),
        ),
        l("topology.kubernetes.io/region", "eu-west-1".into()),
        l("topology.kubernetes.io/zone", format!("eu-west-1{zone}")),
        l(
            "failure-domain.beta.kubernetes.io/region",
            "eu-west-1".into(),
        ),
        l(
            "failure-domain.beta.kubernetes.io/zone",
            format!("eu-west-1{zone}"),
        ),
        l("node-role.kubernetes.io/worker", String::new()),
        l("karpenter.sh/nodepool", format!("{cluster}-pool-{pool}")),
        l("karpenter.sh/capacity-type", "on-demand".into()),
        l("nvidia.com/gpu.present", "true".into()),
        l("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3".into()),
        l("nvidia.com/gpu.count", "8".into()),
        l("nvidia.com/gpu.memory", "81559".into()),
        l("nvidia.com/cuda.driver.major", "550".into()),
        l(
            "feature.node.kubernetes.io/cpu-model.vendor_id",
            "Intel".into(),
        ),
        l(
            "feature.node.kubernetes.io/kernel-version.full",
            "6.5.0-1022-aws".into(),
        ),
        l("feature.node.kubernetes.io/pci-10de.present", "true".into()),
        l(
            "feature.node.kubernetes.io/system-os_release.ID",
            "ubuntu".into(),
        ),
        l(
            "feature.node.kubernetes.io/system-os_release.VERSION_ID",
            "22.04".into(),
        ),
        l("example.com/rack", format!("rack-{:03}", n / 40)),
    ])
}

fn node(cluster: &str, n: usize, name: &str) -> Node {
    let alloc = BTreeMap::from([
        ("cpu".to_string(), q("64")),
        ("memory".to_string(), q("256Gi")),
        ("nvidia.com/gpu".to_string(), q("8")),
        ("pods".to_string(), q("110")),
        ("ephemeral-storage".to_string(), q("1800Gi")),
        ("hugepages-1Gi".to_string(), q("0")),
        ("hugepages-2Mi".to_string(), q("0")),
    ]);
    let t = Time(k8s_openapi::jiff::Timestamp::from_second(1_795_000_000).unwrap());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(t.clone()),
        last_transition_time: Some(t.clone()),
    };
    // What a GPU node pulls: base images, the GPU operator's, the workloads'.
    let images = (0..30)
        .map(|i| ContainerImage {
            names: Some(vec![
                format!(
                    "registry.example.com/team-{}/image-{i}@sha256:{:064x}",
                    i % 7,
                    i * 7919 + n
                ),
                format!("registry.example.com/team-{}/image-{i}:v1.{i}.0", i % 7),
            ]),
            size_bytes: Some(100_000_000 + i as i64 * 1_000_000),
        })
        .collect();
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            uid: Some(format!("{:08x}-0000-4000-8000-{n:012x}", n)),
            resource_version: Some("123456789".into()),
            labels: Some(labels(cluster, n, name)),
            annotations: Some(BTreeMap::from([
                ("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string()),
                (
                    "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                    "true".to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///eu-west-1a/i-{n:017x}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(alloc.clone()),
            capacity: Some(alloc),
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
                ),
                condition(
                    "NetworkUnavailable",
                    "False",
                    "RouteCreated",
                    "RouteController created a route",
                ),
            ]),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_string(),
                },
            ]),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("{:032x}", n),
                container_runtime_version: "containerd://1.7.22".into(),
                kernel_version: "6.5.0-1022-aws".into(),
                kube_proxy_version: "v1.33.4".into(),
                kubelet_version: "v1.33.4".into(),
                machine_id: format!("{:032x}", n * 31),
                operating_system: "linux".into(),
                os_image: "Ubuntu 22.04.4 LTS".into(),
                system_uuid: format!("ec2{:029x}", n),
                ..Default::default()
            }),
            images: Some(images),
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
    let clusters: Vec<String> = (0..workers).map(|w| format!("worker-{w:03}")).collect();
    // Every worker starts its relists, as a manager's connections do at start-up...
    for cluster in &clusters {
        hub.add_worker(cluster, Default::default(), now);
        hub.apply(Update::Node(cluster.clone(), Box::new(Event::Init)), now);
        hub.apply(Update::Pod(cluster.clone(), Box::new(Event::Init)), now);
        if with_nrt {
            hub.apply(
                Update::Topology(cluster.clone(), Box::new(Event::Init)),
                now,
            );
        }
    }
    // ...their pages arrive interleaved...
    let mut uid: u128 = 0x1234_5678_9abc_def0_0000_0000_0000_0000;
    for n in 0..nodes_per {
        for cluster in &clusters {
            let name = format!("{cluster}-node-{n:04}");
            hub.apply(
                Update::Node(
                    cluster.clone(),
                    Box::new(Event::InitApply(node(cluster, n, &name))),
                ),
                now,
            );
            if with_nrt {
                hub.apply(
                    Update::Topology(cluster.clone(), Box::new(Event::InitApply(nrt(&name)))),
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
    }
    // ...and each relist replaces what the worker had when it ends.
    for cluster in &clusters {
        hub.apply(
            Update::Node(cluster.clone(), Box::new(Event::InitDone)),
            now,
        );
        hub.apply(Update::Pod(cluster.clone(), Box::new(Event::InitDone)), now);
        if with_nrt {
            hub.apply(
                Update::Topology(cluster.clone(), Box::new(Event::InitDone)),
                now,
            );
        }
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
