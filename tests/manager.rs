//! `serve` with `role: manager`, end to end against a fake manager API server and a fake
//! worker over HTTPS: the controller connects the WorkerCluster, this replica leads, the
//! extender judges the worker's real nodes and its virtual node from the live inventory,
//! the virtual node and the status are written, `/readyz` and `/metrics` say so, and
//! shutting down gives the leader Lease up.

mod common;

use common::fake_api::{self, FakeApi, LEASES, NODES, WORKER_CLUSTERS};
use common::fleet::{active, NS, WAIT};
use common::probe_get;
use common::tls_client::{connect, connector_from_dir};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use switchyard::cli::Role;
use switchyard::config::{ServeSettings, TlsSource};

async fn until<T>(what: &str, f: impl Fn() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_as_manager_connects_workers_leads_and_feeds_the_extender() {
    let manager = FakeApi::start().await;
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-gpu", 32, 4));
    worker.upsert(NODES, fake_api::node("w-cpu", 2, 0));
    manager.upsert(
        common::fake_api::SECRETS,
        fake_api::kubeconfig_secret(NS, "w1-kubeconfig", &worker.kubeconfig("tok")),
    );
    manager.upsert(
        WORKER_CLUSTERS,
        fake_api::worker_cluster("w1", "w1-kubeconfig", json!({"tier": "gold"})),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
    settings.standalone = false;
    settings.role = Role::Manager;
    let running = switchyard::server::start_with_client(settings, Some(manager.client()))
        .await
        .unwrap();
    let m = running.manager.clone().expect("a manager");
    assert_eq!(m.namespace, NS);
    let mut workers = m.workers.clone();
    tokio::time::timeout(WAIT, async {
        while !workers.get("w1").is_some_and(|v| v.connected) {
            assert!(workers.changed().await, "the controller is gone");
        }
    })
    .await
    .expect("w1 connected");
    let mut leader = m.leader.clone();
    tokio::time::timeout(WAIT, leader.wait_for(|l| *l))
        .await
        .expect("leading")
        .unwrap();

    // The extender judges the worker's nodes and its virtual node from the live inventory.
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let body = json!({
        "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
                "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "4"}}}]}},
        "NodeNames": ["switchyard-w1", "w-gpu", "w-cpu"],
        "Nodes": null
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, reply) = conn
            .post_json("/scheduler/filter", serde_json::to_vec(&body).unwrap())
            .await;
        assert_eq!(status, 200);
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        if reply["NodeNames"] == json!(["switchyard-w1", "w-gpu"]) {
            let why = reply["FailedAndUnresolvableNodes"]["w-cpu"]
                .as_str()
                .unwrap();
            assert!(why.contains("needs 4 cpu"), "{why}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the live inventory never reached the extender: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The leader writes the status and keeps the virtual node.
    until("Active=True", || {
        manager
            .get(WORKER_CLUSTERS, "", "w1")
            .filter(|o| active(&o["status"]).1 == "Connected")
    })
    .await;
    let node = until("the virtual node", || {
        manager.get(NODES, "", "switchyard-w1")
    })
    .await;
    assert_eq!(node["status"]["allocatable"]["cpu"], "34");
    assert_eq!(node["metadata"]["labels"]["tier"], "gold");

    let (status, ready) = probe_get(running.probe_addr, "/readyz").await;
    assert_eq!(status, 200);
    for line in [
        "manager: WorkerCluster controller (kubeconfig Secrets in switchyard-system; 100 QPS, burst 200 per worker)",
        "extender: live inventory of every WorkerCluster",
        "virtual nodes: one per worker (switchyard-<cluster>)",
        "leader election: Lease switchyard-system/switchyard-leader as ",
    ] {
        assert!(ready.contains(line), "{line:?} missing from {ready}");
    }
    assert!(ready.contains(": leading\n"), "{ready}");
    let (_, metrics) = probe_get(running.probe_addr, "/metrics").await;
    assert!(metrics.contains("switchyard_leader 1"), "{metrics}");
    assert!(
        metrics.contains("switchyard_worker_connected{cluster=\"w1\"} 1"),
        "{metrics}"
    );

    let lease = manager.get(LEASES, NS, "switchyard-leader").unwrap();
    assert!(lease["spec"]["holderIdentity"].as_str().is_some());
    running.shutdown().await;
    // Given up on the way out: a successor need not wait for it to expire.
    let lease = manager.get(LEASES, NS, "switchyard-leader").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
}

#[tokio::test]
async fn a_standalone_manager_says_what_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
    settings.role = Role::Manager;
    let running = switchyard::server::start_with_client(settings, None)
        .await
        .unwrap();
    assert!(running.manager.is_none());
    let (_, ready) = probe_get(running.probe_addr, "/readyz").await;
    assert!(ready.contains("manager: off (--standalone)"), "{ready}");
    running.shutdown().await;
}
