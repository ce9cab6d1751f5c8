//! A fake kubelet: what a cluster's kubelets publish and do, without running anything.
//!
//! - Nodes with capacity, a `Ready` condition and a Lease in `kube-node-lease` renewed every
//!   10 s, so the node lifecycle controller keeps them Ready and takes their not-ready taint off.
//! - A NodeResourceTopology object per node (`topology.node.k8s.io/v1alpha2`, as
//!   node-feature-discovery's topology updater publishes it): NUMA zones sharing the node's
//!   CPUs, memory and GPUs evenly, their `available` amounts kept up to date.
//! - Pods bound to its nodes are admitted as a kubelet's Topology Manager under
//!   `single-numa-node` with pod scope admits them (a pod whose aligned resources fit in no
//!   single zone fails with `TopologyAffinityError`), then run: `Running` with `Ready=True`,
//!   then `Succeeded`, or `Failed` with the exit code of annotation [`EXIT_CODE`], after the
//!   seconds of annotation [`RUN_SECONDS`] (without it a pod runs until deleted).
//! - A pod being deleted is removed at once (grace period 0), as a kubelet confirms it.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::{AbortHandle, JoinHandle};

/// Seconds a pod runs before it ends (a pod annotation).
pub const RUN_SECONDS: &str = "fake-kubelet/run-seconds";
/// The exit code its containers end with: 0 (the default) succeeds, anything else fails.
pub const EXIT_CODE: &str = "fake-kubelet/exit-code";

const LEASE_RENEW: Duration = Duration::from_secs(10);
const GPU: &str = "nvidia.com/gpu";

/// One node the fake kubelet publishes.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub cpus: i64,
    pub memory_gi: i64,
    pub gpus: i64,
    /// NUMA zones the CPUs, memory and GPUs are split over evenly.
    pub numa_zones: i64,
    pub max_pods: i64,
}

impl NodeSpec {
    pub fn new(name: &str, cpus: i64, memory_gi: i64, gpus: i64, numa_zones: i64) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
            cpus,
            memory_gi,
            gpus,
            numa_zones,
            max_pods: 110,
        }
    }
}

/// What one NUMA zone has, in milli-units for CPU and bytes for memory.
#[derive(Debug, Clone)]
struct Zone {
    allocatable: BTreeMap<&'static str, i64>,
    available: BTreeMap<&'static str, i64>,
}

#[derive(Default)]
struct Running {
    node: String,
    /// The zone and amounts the Topology Manager gave it.
    taken: Option<(usize, BTreeMap<&'static str, i64>)>,
    timer: Option<AbortHandle>,
    finished: bool,
    deleting: bool,
}

#[derive(Default)]
struct State {
    zones: HashMap<String, Vec<Zone>>,
    pods: HashMap<String, Running>,
    next_ip: u32,
}

pub struct FakeKubelet {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn timestamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// A MicroTime, as Leases carry: exactly six fractional digits.
fn micro_timestamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

fn nrt_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology"),
        "noderesourcetopologies",
    )
}

fn quantity(resource: &str, amount: i64) -> String {
    match resource {
        "cpu" if amount % 1000 == 0 => (amount / 1000).to_string(),
        "cpu" => format!("{amount}m"),
        _ => amount.to_string(),
    }
}

fn zones_of(spec: &NodeSpec) -> Vec<Zone> {
    let n = spec.numa_zones.max(1);
    (0..n)
        .map(|_| {
            let mut allocatable = BTreeMap::from([
                ("cpu", spec.cpus * 1000 / n),
                ("memory", (spec.memory_gi << 30) / n),
            ]);
            if spec.gpus > 0 {
                allocatable.insert(GPU, spec.gpus / n);
            }
            Zone {
                available: allocatable.clone(),
                allocatable,
            }
        })
        .collect()
}

fn zones_json(zones: &[Zone]) -> Value {
    let n = zones.len();
    Value::Array(
        zones
            .iter()
            .enumerate()
            .map(|(i, z)| {
                let costs: Vec<Value> = (0..n)
                    .map(|j| json!({"name": format!("node-{j}"), "value": if i == j { 10 } else { 20 }}))
                    .collect();
                let resources: Vec<Value> = z
                    .allocatable
                    .iter()
                    .map(|(r, a)| {
                        json!({"name": r, "capacity": quantity(r, *a), "allocatable": quantity(r, *a),
                               "available": quantity(r, z.available[r])})
                    })
                    .collect();
                json!({"name": format!("node-{i}"), "type": "Node", "costs": costs, "resources": resources})
            })
            .collect(),
    )
}

fn node_object(spec: &NodeSpec) -> Value {
    let mut labels = spec.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), spec.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    let mut capacity = json!({
        "cpu": spec.cpus.to_string(),
        "memory": format!("{}Gi", spec.memory_gi),
        "pods": spec.max_pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    if spec.gpus > 0 {
        capacity[GPU] = json!(spec.gpus.to_string());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {},
        "status": node_status(&capacity),
    })
}

fn node_status(capacity: &Value) -> Value {
    let now = timestamp();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "fake kubelet",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "fake", "systemUUID": "fake", "bootID": "fake",
                     "kernelVersion": "6.1.0", "osImage": "fake kubelet",
                     "containerRuntimeVersion": "fake://1.0", "kubeletVersion": "v1.36.2",
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
    })
}

/// A quantity in milli-units ("500m", "2", "4Gi", "1.5"); the kubelet needs no more forms.
fn milli(q: &str) -> Option<i64> {
    let q = q.trim();
    let (number, scale): (&str, f64) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("m", 1e-3),
    ]
    .iter()
    .find_map(|(suffix, scale)| q.strip_suffix(suffix).map(|n| (n, *scale)))
    .unwrap_or((q, 1.0));
    let value: f64 = number.parse().ok()?;
    Some((value * scale * 1000.0).round() as i64)
}

/// A pod's requests as the Topology Manager aligns them under pod scope: per resource the
/// larger of its app containers' sum and its largest init container; devices always, CPU
/// (whole CPUs) and memory only for Guaranteed pods.
fn aligned_request(pod: &Pod) -> BTreeMap<&'static str, i64> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let amount = |c: &k8s_openapi::api::core::v1::Container, r: &str| -> i64 {
        let res = c.resources.as_ref();
        let q = res
            .and_then(|res| res.requests.as_ref().and_then(|m| m.get(r)))
            .or_else(|| res.and_then(|res| res.limits.as_ref().and_then(|m| m.get(r))));
        q.and_then(|q| milli(&q.0)).unwrap_or(0)
    };
    let guaranteed = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .all(|c| {
            ["cpu", "memory"].iter().all(|r| {
                let limit = c
                    .resources
                    .as_ref()
                    .and_then(|res| res.limits.as_ref())
                    .and_then(|m| m.get(*r));
                limit.and_then(|q| milli(&q.0)) == Some(amount(c, r))
            })
        });
    let mut out = BTreeMap::new();
    for r in ["cpu", "memory", GPU] {
        let app: i64 = spec.containers.iter().map(|c| amount(c, r)).sum();
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| amount(c, r))
            .max()
            .unwrap_or(0);
        let want = app.max(init);
        let aligned = match r {
            "cpu" => guaranteed && want % 1000 == 0,
            "memory" => guaranteed,
            _ => true,
        };
        if aligned && want > 0 {
            // Zones keep CPU in milli-CPUs, memory in bytes and devices in units.
            out.insert(r, if r == "cpu" { want } else { want / 1000 });
        }
    }
    out
}

impl FakeKubelet {
    /// Registers `nodes` (with their NodeResourceTopology objects, whose CRD must be served)
    /// and starts keeping them and running the pods bound to them.
    pub async fn start(client: Client, nodes: Vec<NodeSpec>) -> Result<Self, String> {
        let state: Arc<Mutex<State>> = Arc::default();
        let node_api: Api<Node> = Api::all(client.clone());
        let nrt: Api<DynamicObject> = Api::all_with(client.clone(), &nrt_resource());
        for spec in &nodes {
            let object = node_object(spec);
            let node: Node = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
            match node_api.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(format!("cannot register node {}: {e}", spec.name)),
            }
            // A create may drop the status; a kubelet writes it through the subresource.
            node_api
                .patch_status(
                    &spec.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": object["status"]})),
                )
                .await
                .map_err(|e| format!("cannot set the status of node {}: {e}", spec.name))?;
            let zones = zones_of(spec);
            let object = json!({
                "apiVersion": "topology.node.k8s.io/v1alpha2",
                "kind": "NodeResourceTopology",
                "metadata": {"name": spec.name},
                "topologyPolicies": ["SingleNUMANodePodLevel"],
                "attributes": [
                    {"name": "topologyManagerPolicy", "value": "single-numa-node"},
                    {"name": "topologyManagerScope", "value": "pod"},
                ],
                "zones": zones_json(&zones),
            });
            nrt.patch(
                &spec.name,
                &PatchParams::apply("fake-kubelet").force(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| {
                format!(
                    "cannot publish the NodeResourceTopology of {}: {e}",
                    spec.name
                )
            })?;
            state.lock().unwrap().zones.insert(spec.name.clone(), zones);
        }
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let leases = tokio::spawn(renew_leases(client.clone(), names));
        let pods = tokio::spawn(run_pods(client, state));
        Ok(Self {
            tasks: vec![leases, pods],
        })
    }
}

async fn renew_leases(client: Client, nodes: Vec<String>) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client,
        "kube-node-lease",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
            "leases",
        ),
    );
    loop {
        for node in &nodes {
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                         "renewTime": micro_timestamp()},
            });
            // A failed renewal is tried again at the next beat, as a kubelet does.
            let _ = api
                .patch(
                    node,
                    &PatchParams::apply("fake-kubelet").force(),
                    &Patch::Apply(&lease),
                )
                .await;
        }
        tokio::time::sleep(LEASE_RENEW).await;
    }
}

async fn run_pods(client: Client, state: Arc<Mutex<State>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields("spec.nodeName!=");
    let mut events = watcher(pods, config).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) | Ok(watcher::Event::InitApply(pod)) => {
                seen(&client, &state, pod);
            }
            Ok(watcher::Event::Delete(pod)) => gone(&client, &state, &pod),
            Ok(_) => {}
            // The watcher backs off and lists again by itself.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// A pod was added or changed.
fn seen(client: &Client, state: &Arc<Mutex<State>>, pod: Pod) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    let uid = uid(&pod);
    let mut st = state.lock().unwrap();
    if !st.zones.contains_key(&node) {
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
    let terminal = matches!(phase.as_deref(), Some("Succeeded") | Some("Failed"));
    if pod.metadata.deletion_timestamp.is_some() {
        let run = st.pods.entry(uid.clone()).or_default();
        if run.deleting {
            return;
        }
        run.deleting = true;
        if let Some(t) = run.timer.take() {
            t.abort();
        }
        release(&mut st, &uid, client);
        tokio::spawn(remove(client.clone(), pod));
        return;
    }
    if terminal {
        release(&mut st, &uid, client);
        if let Some(run) = st.pods.get_mut(&uid) {
            run.finished = true;
        }
        return;
    }
    if st.pods.contains_key(&uid) {
        return;
    }
    // A new pod on one of our nodes: the Topology Manager admits it or not.
    let want = aligned_request(&pod);
    let zones = st.zones.get_mut(&node).expect("a known node");
    let zone = if want.is_empty() {
        None
    } else {
        match zones.iter().position(|z| {
            want.iter()
                .all(|(r, q)| z.available.get(r).copied().unwrap_or(0) >= *q)
        }) {
            Some(i) => Some(i),
            None => {
                st.pods.insert(
                    uid,
                    Running {
                        node,
                        finished: true,
                        ..Default::default()
                    },
                );
                tokio::spawn(reject(client.clone(), pod));
                return;
            }
        }
    };
    let mut taken = None;
    if let Some(i) = zone {
        for (r, q) in &want {
            *zones[i].available.get_mut(r).expect("a zone resource") -= q;
        }
        taken = Some((i, want));
        publish_zones(client, &node, zones);
    }
    st.next_ip += 1;
    let ip = st.next_ip;
    let timer = tokio::spawn(run_pod(client.clone(), pod, ip)).abort_handle();
    st.pods.insert(
        uid,
        Running {
            node,
            taken,
            timer: Some(timer),
            ..Default::default()
        },
    );
}

/// A pod is gone from the API.
fn gone(client: &Client, state: &Arc<Mutex<State>>, pod: &Pod) {
    let uid = uid(pod);
    let mut st = state.lock().unwrap();
    release(&mut st, &uid, client);
    if let Some(run) = st.pods.remove(&uid) {
        if let Some(t) = run.timer {
            t.abort();
        }
    }
}

/// Gives the NUMA zone room a pod took back.
fn release(st: &mut State, uid: &str, client: &Client) {
    let Some(run) = st.pods.get_mut(uid) else {
        return;
    };
    let Some((i, amounts)) = run.taken.take() else {
        return;
    };
    let node = run.node.clone();
    if let Some(zones) = st.zones.get_mut(&node) {
        for (r, q) in amounts {
            if let Some(a) = zones[i].available.get_mut(r) {
                *a += q;
            }
        }
        publish_zones(client, &node, zones);
    }
}

fn publish_zones(client: &Client, node: &str, zones: &[Zone]) {
    let nrt: Api<DynamicObject> = Api::all_with(client.clone(), &nrt_resource());
    let patch = json!({"zones": zones_json(zones)});
    let node = node.to_string();
    tokio::spawn(async move {
        let _ = nrt
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    });
}

fn pods_api(client: &Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

fn conditions(ready: bool, reason: Option<&str>) -> Value {
    let now = timestamp();
    let c = |type_: &str, status: bool| {
        let mut c = json!({"type": type_, "status": if status { "True" } else { "False" },
                           "lastProbeTime": null, "lastTransitionTime": now});
        if let (false, Some(r)) = (status, reason) {
            c["reason"] = json!(r);
        }
        c
    };
    json!([
        c("PodReadyToStartContainers", ready),
        c("Initialized", true),
        c("Ready", ready),
        c("ContainersReady", ready),
        c("PodScheduled", true),
    ])
}

/// Retries a status write a few times: the API server may be briefly unreachable.
async fn patch_status(api: &Api<Pod>, name: &str, status: Value) {
    for _ in 0..10 {
        match api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

async fn run_pod(client: Client, pod: Pod, ip: u32) {
    let api = pods_api(&client, &pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = uid(&pod);
    let containers: Vec<(String, String)> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let started = timestamp();
    let pod_ip = format!("10.244.{}.{}", ip / 250, ip % 250 + 1);
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(c, image)| {
            json!({"name": c, "image": image, "imageID": "", "containerID": format!("fake://{uid}/{c}"),
                   "ready": true, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": started}}})
        })
        .collect();
    patch_status(
        &api,
        &name,
        json!({"phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
               "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "startTime": started,
               "conditions": conditions(true, None), "containerStatuses": statuses}),
    )
    .await;
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let Some(seconds) = annotations
        .get(RUN_SECONDS)
        .and_then(|s| s.parse::<f64>().ok())
    else {
        return;
    };
    tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0))).await;
    let exit_code: i32 = annotations
        .get(EXIT_CODE)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (phase, reason) = if exit_code == 0 {
        ("Succeeded", "Completed")
    } else {
        ("Failed", "Error")
    };
    let finished = timestamp();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(c, image)| {
            json!({"name": c, "image": image, "imageID": "", "containerID": format!("fake://{uid}/{c}"),
                   "ready": false, "started": false, "restartCount": 0,
                   "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                            "startedAt": started, "finishedAt": finished}}})
        })
        .collect();
    patch_status(
        &api,
        &name,
        json!({"phase": phase, "conditions": conditions(false, Some("PodCompleted")),
               "containerStatuses": statuses}),
    )
    .await;
}

/// What a kubelet's Topology Manager does with a pod it cannot align.
async fn reject(client: Client, pod: Pod) {
    let api = pods_api(&client, &pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    patch_status(
        &api,
        &name,
        json!({"phase": "Failed", "reason": "TopologyAffinityError",
               "message": "Pod was rejected: Resources cannot be allocated with Topology locality",
               "conditions": conditions(false, Some("PodFailed"))}),
    )
    .await;
}

/// Confirms a deletion, as a kubelet does once the containers are stopped.
async fn remove(client: Client, pod: Pod) {
    let api = pods_api(&client, &pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    for _ in 0..10 {
        match api.delete(&name, &params).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
