//! Virtual nodes against a fake API server through the real `kube::Client`: created when
//! missing, status patched (every condition: a merge patch replaces the list), the node Lease
//! renewed or created, and removal tolerant of what is already gone.

use serde_json::{json, Value};
use std::time::SystemTime;
use switchyard::inventory::parse_yaml;
use switchyard::workers::virtual_node;
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
async fn an_existing_virtual_node_gets_its_status_patched_with_every_condition() {
    let api = MockServer::start().await;
    let node = desired(false);
    Mock::given(method("GET"))
        .and(path("/api/v1/nodes/switchyard-eu-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&node))
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
