//! Virtual nodes against a fake API server through the real `kube::Client`: created when
//! missing, status patched (every condition: a merge patch replaces the list), the node Lease
//! renewed or created, and removal tolerant of what is already gone; then kept by the leader
//! for every connected WorkerCluster, Ready following the worker, removed with it.

mod common;

use common::fake_api::{self, FakeApi, LEASES, NODES, WORKER_CLUSTERS};
use common::fleet::{options, Fleet, WAIT};
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime};
use switchyard::inventory::parse_yaml;
use switchyard::workers::virtual_node::{self, VirtualNodeOptions};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn not_found(kind: &str, name: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound",
           "details": {"name": name, "kind": kind}, "code": 404})
}

fn client(api: &MockServer) -> kube::Client {
    switchyard::install_crypto_provider();
    kube::Client::try_from(kube::Config::new(api.uri().parse().unwrap())).unwrap()
}

fn desired(connected: bool) -> Value {
    let inv = parse_yaml(include_str!("data/formats/inventory.example.yaml")).unwrap();
    virtual_node::desired(
        "switchyard-eu-1",
        inv.cluster("eu-1").unwrap(),
        &inv.resources,
        &Default::default(),
        connected,
        SystemTime::now(),
    )
}

#[tokio::test]
async fn a_missing_virtual_node_is_created_with_its_status() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/nodes/switchyard-eu-1"))
        .respond_with(
            ResponseTemplate::new(404).set_body_json(not_found("nodes", "switchyard-eu-1")),
        )
        .mount(&api)
        .await;
    let node = desired(true);
    let mut created = node.clone();
    created["metadata"]["uid"] = json!("65c8bfcc-be92-4c5d-b57f-2e6101c58274");
    Mock::given(method("POST"))
        .and(path("/api/v1/nodes"))
        .and(body_partial_json(
            json!({"metadata": {"name": "switchyard-eu-1",
            "labels": {"switchyard.dev/cluster": "eu-1", "type": "virtual-kubelet"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}),
        ))
        .respond_with(ResponseTemplate::new(201).set_body_json(created))
        .expect(1)
        .mount(&api)
        .await;
    virtual_node::apply(&client(&api), &node).await.unwrap();
}

#[tokio::test]
async fn an_existing_virtual_node_is_patched_to_what_is_wanted_with_every_condition() {
    let api = MockServer::start().await;
    let node = desired(false);
    // As left by an earlier pass with another label, then tainted by the node lifecycle
    // controller.
    let mut existing = node.clone();
    existing["metadata"]["resourceVersion"] = json!("7");
    existing["metadata"]["labels"]["team"] = json!("ml");
    existing["metadata"]["annotations"]["switchyard.dev/labels"] = json!(format!(
        "{},team",
        node["metadata"]["annotations"]["switchyard.dev/labels"]
            .as_str()
            .unwrap()
    ));
    existing["spec"]["taints"] = json!([
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "switchyard.dev/virtual", "value": "true", "effect": "NoSchedule"}
    ]);
    existing["status"]["capacity"]["example.com/fpga"] = json!("2");
    Mock::given(method("GET"))
        .and(path("/api/v1/nodes/switchyard-eu-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&existing))
        .mount(&api)
        .await;
    Mock::given(method("PATCH"))
        .and(path("/api/v1/nodes/switchyard-eu-1"))
        .and(header("content-type", "application/merge-patch+json"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&node))
        .expect(1)
        .mount(&api)
        .await;
    Mock::given(method("PATCH"))
        .and(path("/api/v1/nodes/switchyard-eu-1/status"))
        .and(header("content-type", "application/merge-patch+json"))
        .and(body_partial_json(json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "WorkerDisconnected"},
            {"type": "MemoryPressure", "status": "False"}]}})))
        .respond_with(ResponseTemplate::new(200).set_body_json(&node))
        .expect(1)
        .mount(&api)
        .await;
    virtual_node::apply(&client(&api), &node).await.unwrap();
    let requests = api.received_requests().await.unwrap();
    let body = |suffix: &str| -> Value {
        let r = requests
            .iter()
            .find(|r| r.method.as_str() == "PATCH" && r.url.path().ends_with(suffix))
            .unwrap();
        serde_json::from_slice(&r.body).unwrap()
    };
    // Exactly: the label we set before is removed, the ownership list follows, the taints
    // (ours in place) are left alone.
    assert_eq!(
        body("switchyard-eu-1"),
        json!({"metadata": {"labels": {"team": null},
               "annotations": {"switchyard.dev/labels": node["metadata"]["annotations"]["switchyard.dev/labels"]}}})
    );
    assert_eq!(
        body("/status")["status"]["capacity"]["example.com/fpga"],
        Value::Null
    );
}

#[tokio::test]
async fn the_node_lease_is_renewed_or_created() {
    let api = MockServer::start().await;
    Mock::given(method("PATCH"))
        .and(path(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/switchyard-eu-1",
        ))
        .respond_with(
            ResponseTemplate::new(404)
                .set_body_json(not_found("leases.coordination.k8s.io", "switchyard-eu-1")),
        )
        .up_to_n_times(1)
        .mount(&api)
        .await;
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "switchyard-eu-1", "namespace": "kube-node-lease", "resourceVersion": "1"},
        "spec": {"holderIdentity": "switchyard-eu-1", "leaseDurationSeconds": 40, "renewTime": "2026-11-22T03:55:03.665151Z"}});
    Mock::given(method("POST"))
        .and(path(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        ))
        .respond_with(ResponseTemplate::new(201).set_body_json(&lease))
        .expect(1)
        .mount(&api)
        .await;
    Mock::given(method("PATCH"))
        .and(path(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/switchyard-eu-1",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(&lease))
        .expect(1)
        .mount(&api)
        .await;
    let c = client(&api);
    virtual_node::renew_lease(&c, "switchyard-eu-1", SystemTime::now())
        .await
        .unwrap();
    virtual_node::renew_lease(&c, "switchyard-eu-1", SystemTime::now())
        .await
        .unwrap();
    // The renewal is a MicroTime with exactly six fractional digits.
    let requests = api.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests.last().unwrap().body).unwrap();
    let renew = body["spec"]["renewTime"].as_str().unwrap();
    assert_eq!(renew.split('.').nth(1).map(str::len), Some(7), "{renew}");
}

#[tokio::test]
async fn removal_tolerates_what_is_already_gone() {
    let api = MockServer::start().await;
    Mock::given(method("DELETE"))
        .and(path("/api/v1/nodes/switchyard-eu-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(desired(true)))
        .expect(1)
        .mount(&api)
        .await;
    Mock::given(method("DELETE"))
        .and(path(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/switchyard-eu-1",
        ))
        .respond_with(
            ResponseTemplate::new(404)
                .set_body_json(not_found("leases.coordination.k8s.io", "switchyard-eu-1")),
        )
        .expect(1)
        .mount(&api)
        .await;
    virtual_node::remove(&client(&api), "switchyard-eu-1")
        .await
        .unwrap();
}

fn ready(node: &Value) -> (String, String) {
    let c = &node["status"]["conditions"][0];
    assert_eq!(c["type"], "Ready");
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    )
}

async fn until<T>(what: &str, f: impl Fn() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn keep(fleet: &Fleet) -> tokio::task::JoinHandle<()> {
    tokio::spawn(virtual_node::maintain(
        fleet.manager.client(),
        fleet.workers.clone(),
        fleet.store.clone(),
        fleet.leader_rx.clone(),
        VirtualNodeOptions {
            heartbeat: Duration::from_millis(300),
            status_every: Duration::from_secs(1),
            ..Default::default()
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_keeps_a_ready_node_per_worker_renews_its_lease_and_removes_it_with_the_worker()
{
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("g-1", 32, 4));
    worker.upsert(NODES, fake_api::node("c-1", 16, 0));
    let fleet = Fleet::start().await;
    // Every call is one the chart's manager role allows (the real API server refused the
    // orphans' list with 403 before the role could list nodes).
    fleet.manager.check_rbac(switchyard::rbac::Role::Manager);
    // Left over from a WorkerCluster deleted while no replica led.
    fleet.manager.upsert(
        NODES,
        json!({"metadata": {"name": "switchyard-ghost",
                            "labels": {"switchyard.dev/cluster": "ghost", "type": "virtual-kubelet"}},
               "spec": {}, "status": {}}),
    );
    fleet.manager.upsert(
        LEASES,
        json!({"metadata": {"name": "switchyard-ghost", "namespace": "kube-node-lease"},
               "spec": {"holderIdentity": "switchyard-ghost", "leaseDurationSeconds": 40}}),
    );
    // The manager's own nodes are never touched.
    fleet
        .manager
        .upsert(NODES, fake_api::node("manager-1", 4, 0));
    fleet.add("w1", &worker.kubeconfig("tok"));
    let task = keep(&fleet);

    let node = until("a Ready virtual node with the worker's sums", || {
        fleet
            .manager
            .get(NODES, "", "switchyard-w1")
            .filter(|n| ready(n).0 == "True" && n["status"]["allocatable"]["cpu"] == "48")
    })
    .await;
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["switchyard.dev/cluster"], "w1");
    assert_eq!(labels["tier"], "gold", "the WorkerCluster's labels");
    assert_eq!(labels["type"], "virtual-kubelet");
    assert_eq!(labels["kubernetes.io/hostname"], "switchyard-w1");
    assert_eq!(
        labels["kubernetes.io/os"], "linux",
        "labels every node shares"
    );
    assert_eq!(node["spec"]["taints"][0]["key"], "switchyard.dev/virtual");
    assert_eq!(node["status"]["capacity"]["nvidia.com/gpu"], "4");
    assert_eq!(node["status"]["allocatable"]["pods"], "220");

    // Its Lease is renewed, as a kubelet's is.
    let renew = |l: &Value| l["spec"]["renewTime"].as_str().map(str::to_string);
    let first = until("the node Lease", || {
        fleet
            .manager
            .get(LEASES, "kube-node-lease", "switchyard-w1")
            .and_then(|l| renew(&l))
    })
    .await;
    until("a renewal", || {
        fleet
            .manager
            .get(LEASES, "kube-node-lease", "switchyard-w1")
            .and_then(|l| renew(&l))
            .filter(|r| *r != first)
    })
    .await;

    until("the orphan and its Lease gone", || {
        (fleet.manager.get(NODES, "", "switchyard-ghost").is_none()
            && fleet
                .manager
                .get(LEASES, "kube-node-lease", "switchyard-ghost")
                .is_none())
        .then_some(())
    })
    .await;
    assert!(fleet.manager.get(NODES, "", "manager-1").is_some());
    assert_eq!(fleet.manager.uncovered(), Vec::<String>::new());

    // Ready follows the worker.
    worker.set_hang(true);
    let down = until("Ready=False", || {
        fleet
            .manager
            .get(NODES, "", "switchyard-w1")
            .filter(|n| ready(n).0 == "False")
    })
    .await;
    assert_eq!(ready(&down).1, "WorkerDisconnected");
    worker.set_hang(false);
    until("Ready again", || {
        fleet
            .manager
            .get(NODES, "", "switchyard-w1")
            .filter(|n| ready(n).0 == "True")
    })
    .await;

    // Deleted with its WorkerCluster, Lease and all.
    fleet.manager.delete(WORKER_CLUSTERS, "w1");
    until("the node and its Lease gone", || {
        (fleet.manager.get(NODES, "", "switchyard-w1").is_none()
            && fleet
                .manager
                .get(LEASES, "kube-node-lease", "switchyard-w1")
                .is_none())
        .then_some(())
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_keep_no_virtual_nodes_until_they_lead() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-1", 8, 0));
    let fleet = Fleet::start_with(options(), false).await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    let task = keep(&fleet);
    fleet.view("w1", "connected", |v| v.connected).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(fleet.manager.get(NODES, "", "switchyard-w1").is_none());
    assert!(fleet
        .manager
        .recorded()
        .iter()
        .all(|r| !r.uri.starts_with("/api/v1/nodes")));
    fleet.leader.send_replace(true);
    until("the node once leading", || {
        fleet.manager.get(NODES, "", "switchyard-w1")
    })
    .await;
    task.abort();
}

/// A worker Node as the API server returns it, with extra labels and the given allocatable.
fn worker_node(name: &str, labels: Value, allocatable: Value) -> Value {
    let mut n = fake_api::node(name, 8, 0);
    for (k, v) in labels.as_object().unwrap() {
        n["metadata"]["labels"][k] = v.clone();
    }
    n["status"]["allocatable"] = allocatable.clone();
    n["status"]["capacity"] = allocatable;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_no_longer_wanted_are_removed_from_the_virtual_node() {
    let worker = FakeApi::start_tls().await;
    let alloc = json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
    let shared = json!({"example.com/rack": "r1"});
    worker.upsert(NODES, worker_node("n-1", shared.clone(), alloc.clone()));
    worker.upsert(NODES, worker_node("n-2", shared, alloc.clone()));
    let fleet = Fleet::start().await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    let task = keep(&fleet);
    until("the node with both labels", || {
        fleet.manager.get(NODES, "", "switchyard-w1").filter(|n| {
            n["metadata"]["labels"]["tier"] == "gold"
                && n["metadata"]["labels"]["example.com/rack"] == "r1"
        })
    })
    .await;

    // Removed from the WorkerCluster's spec.labels.
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        fake_api::worker_cluster("w1", "w1-kubeconfig", json!({"team": "ml"})),
    );
    let node = until("tier gone, team there", || {
        fleet.manager.get(NODES, "", "switchyard-w1").filter(|n| {
            n["metadata"]["labels"].get("tier").is_none() && n["metadata"]["labels"]["team"] == "ml"
        })
    })
    .await;
    assert_eq!(node["metadata"]["labels"]["example.com/rack"], "r1");

    // No longer common to every node of the worker.
    worker.upsert(
        NODES,
        worker_node("n-2", json!({"example.com/rack": "r2"}), alloc),
    );
    let node = until("the rack label gone", || {
        fleet
            .manager
            .get(NODES, "", "switchyard-w1")
            .filter(|n| n["metadata"]["labels"].get("example.com/rack").is_none())
    })
    .await;
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/os"], "linux", "still common");
    assert_eq!(labels["switchyard.dev/cluster"], "w1");
    assert_eq!(labels["team"], "ml");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_resource_leaves_the_node_and_other_controllers_taints_stay() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("g-1", 32, 4));
    let fleet = Fleet::start().await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    let task = keep(&fleet);
    let node = until("the node with its GPUs", || {
        fleet
            .manager
            .get(NODES, "", "switchyard-w1")
            .filter(|n| n["status"]["allocatable"]["nvidia.com/gpu"] == "4")
    })
    .await;

    // The node lifecycle controller taints it, as it does when a Lease lapses.
    let mut tainted = node.clone();
    tainted["spec"]["taints"].as_array_mut().unwrap().push(
        json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                     "timeAdded": "2026-11-22T03:55:00Z"}),
    );
    fleet.manager.upsert(NODES, tainted);

    // The GPUs go away (the device plugin is gone): the next pass writes the node.
    worker.upsert(
        NODES,
        worker_node(
            "g-1",
            json!({}),
            json!({"cpu": "32", "memory": "128Gi", "pods": "110"}),
        ),
    );
    let node = until("the GPUs gone", || {
        fleet.manager.get(NODES, "", "switchyard-w1").filter(|n| {
            n["status"]["allocatable"].get("nvidia.com/gpu").is_none()
                && n["status"]["capacity"].get("nvidia.com/gpu").is_none()
        })
    })
    .await;
    assert_eq!(node["status"]["allocatable"]["cpu"], "32");
    // Several passes later (status is rewritten every second here), the taint is still there.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let node = fleet.manager.get(NODES, "", "switchyard-w1").unwrap();
    let taints: Vec<&str> = node["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        taints,
        ["switchyard.dev/virtual", "node.kubernetes.io/unreachable"]
    );
    task.abort();
}
