//! What the real API server makes of Switchyard's CRDs and of the chart's manifests.

use crate::helm;
use crate::k8s::objects::{self, apply, describe};
use crate::Suite;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

fn worker_cluster(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "switchyard.dev/v1alpha1", "kind": "WorkerCluster",
           "metadata": {"name": name}, "spec": spec})
}

fn dispatch_queue(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "switchyard.dev/v1alpha1", "kind": "DispatchQueue",
           "metadata": {"name": name}, "spec": spec})
}

/// `switchyard crds` installs; the API server accepts valid objects and refuses, with the
/// messages the schemas carry, what the README says they refuse. Checked with server-side
/// dry runs, so nothing is left behind.
pub async fn crds_install_and_refuse_what_the_readme_says(suite: Arc<Suite>) {
    let api = suite.api_server().await;
    let client = api.plane().admin.clone();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("crds")
        .output()
        .expect("switchyard crds runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed = objects::apply_yaml(&client, &String::from_utf8_lossy(&out.stdout))
        .await
        .expect("the CRDs install");
    assert_eq!(installed.len(), 2, "two CRDs");
    for crd in [
        "workerclusters.switchyard.dev",
        "dispatchqueues.switchyard.dev",
    ] {
        objects::wait_established(&client, crd, Duration::from_secs(30)).await;
    }

    let secret_location = json!({"location": "eu-1-kubeconfig", "locationType": "Secret"});
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "a WorkerCluster as the README registers one",
            worker_cluster(
                "eu-1",
                json!({"kubeConfig": secret_location, "labels": {"region": "europe", "example.com/rack": "r1"},
                       "schedulerName": "switchyard-scheduler"}),
            ),
            None,
        ),
        (
            "a kubeconfig file path",
            worker_cluster(
                "eu-2",
                json!({"kubeConfig": {"location": "/etc/worker/kubeconfig", "locationType": "Path"}}),
            ),
            None,
        ),
        (
            "a WorkerCluster name of 64 characters",
            worker_cluster(&"w".repeat(64), json!({"kubeConfig": secret_location})),
            Some("a WorkerCluster's name must be at most 63 characters"),
        ),
        (
            "a label key that is no label key",
            worker_cluster(
                "eu-3",
                json!({"kubeConfig": secret_location, "labels": {"bad key!": "x"}}),
            ),
            Some("every key must be a label key"),
        ),
        (
            "a label value that is no label value",
            worker_cluster(
                "eu-4",
                json!({"kubeConfig": secret_location, "labels": {"region": "not a value"}}),
            ),
            Some("spec.labels.region"),
        ),
        (
            "65 labels",
            worker_cluster(
                "eu-5",
                json!({"kubeConfig": secret_location,
                       "labels": (0..65).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
            ),
            Some("spec.labels: Too many"),
        ),
        (
            "a relative kubeconfig path",
            worker_cluster(
                "eu-6",
                json!({"kubeConfig": {"location": "kubeconfig", "locationType": "Path"}}),
            ),
            Some("with locationType Path, location must be an absolute file path"),
        ),
        (
            "a Secret name that is not one",
            worker_cluster(
                "eu-7",
                json!({"kubeConfig": {"location": "Not_A_Secret", "locationType": "Secret"}}),
            ),
            Some("with locationType Secret, location must be the name of a Secret"),
        ),
        (
            "a DispatchQueue as the README shows one",
            dispatch_queue(
                "research",
                json!({"clusters": ["eu-1", "us-1"], "namespaceSelector": {},
                       "quota": {"cpu": "512", "nvidia.com/gpu": "32"},
                       "waitForPodsReady": {"enabled": true, "timeout": "5m", "recoveryTimeout": "3m",
                                            "requeuing": {"backoffBase": "60s", "backoffMax": "1h", "limit": 5}},
                       "placement": {"strategy": "LeastAllocated", "fanout": 1},
                       "workerLostTimeout": "15m"}),
            ),
            None,
        ),
        (
            "a quota key that is no resource name",
            dispatch_queue(
                "q1",
                json!({"clusters": ["eu-1"], "quota": {"gpus please": "1"}}),
            ),
            Some("every key must be a resource name"),
        ),
        (
            "a quota that is no quantity",
            dispatch_queue(
                "q2",
                json!({"clusters": ["eu-1"], "quota": {"cpu": "lots"}}),
            ),
            Some("spec.quota.cpu"),
        ),
        (
            "workerLostTimeout 0s",
            dispatch_queue(
                "q3",
                json!({"clusters": ["eu-1"], "workerLostTimeout": "0s"}),
            ),
            Some("workerLostTimeout must be above 0"),
        ),
        (
            "a duration Kubernetes does not write",
            dispatch_queue(
                "q4",
                json!({"clusters": ["eu-1"], "workerLostTimeout": "1d"}),
            ),
            Some("spec.workerLostTimeout"),
        ),
        (
            "a back-off base longer than its maximum",
            dispatch_queue(
                "q5",
                json!({"clusters": ["eu-1"],
                       "waitForPodsReady": {"requeuing": {"backoffBase": "2h", "backoffMax": "1h"}}}),
            ),
            Some("requeuing.backoffBase must not be longer than requeuing.backoffMax"),
        ),
        (
            "a queue name with a dot",
            dispatch_queue("a.b", json!({"clusters": ["eu-1"]})),
            Some("a DispatchQueue's name must be a DNS-1123 label"),
        ),
        (
            "no cluster",
            dispatch_queue("q6", json!({"clusters": []})),
            Some("spec.clusters"),
        ),
        (
            "an In selector without values",
            dispatch_queue(
                "q7",
                json!({"clusters": ["eu-1"],
                       "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
            ),
            Some("operators In and NotIn need at least one value"),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, object, refusal) in &cases {
        let result = apply(&client, object, true).await;
        match (refusal, result) {
            (None, Ok(_)) => {}
            (None, Err(e)) => wrong.push(format!("{what}: refused: {e}")),
            (Some(want), Ok(_)) => {
                wrong.push(format!("{what}: accepted, want refused with {want:?}"))
            }
            (Some(want), Err(e)) => {
                if !e.contains(want) {
                    wrong.push(format!("{what}: refused with {e}, want {want:?}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the CRDs do not behave as documented:\n{}",
        wrong.join("\n")
    );
}

/// Every manifest the chart renders for the manager and the worker roles (CRDs included;
/// cert-manager's and the Prometheus Operator's kinds aside, whose CRDs are not installed
/// here) is accepted by the real API server in a server-side dry run: manager-role objects
/// by the manager, worker-role objects by a worker.
pub async fn chart_manifests_pass_a_server_side_dry_run(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let ca_bundle = "Zm9v"; // base64, as the schema wants; the dry run never uses it
    let mut refused = Vec::new();
    let mut kinds = BTreeSet::new();
    for (role, client) in [
        ("manager", env.manager.admin.clone()),
        ("worker", env.worker("w1").plane.admin.clone()),
    ] {
        let values = json!({
            "role": role,
            "certManager": {"enabled": false},
            "tls": {"secretName": "switchyard-tls", "caBundle": ca_bundle},
            "scheduler": {"enabled": true},
            "config": {"defaultQueue": "research", "managedNamespaces": {"matchLabels": {"team": "ml"}}},
        });
        let rendered = tokio::task::spawn_blocking(move || helm::render(&values))
            .await
            .expect("render.py runs")
            .unwrap_or_else(|e| panic!("the chart renders for role {role}: {e}"));
        for (path, object) in rendered {
            if role == "worker" && path == "crds" {
                // Workers are installed with --skip-crds.
                continue;
            }
            kinds.insert(format!("{role} {}", object["kind"].as_str().unwrap_or("?")));
            if let Err(e) = apply(&client, &object, true).await {
                refused.push(format!("{role} {path} {}: {e}", describe(&object)));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "the API server refuses manifests of the chart:\n{}",
        refused.join("\n")
    );
    for kind in [
        "manager CustomResourceDefinition",
        "manager Deployment",
        "manager MutatingWebhookConfiguration",
        "manager ValidatingWebhookConfiguration",
        "manager ClusterRole",
        "manager Role",
        "manager PodDisruptionBudget",
        "worker Secret",
        "worker ClusterRoleBinding",
        "worker Deployment",
    ] {
        assert!(
            kinds.contains(kind),
            "the chart rendered no {kind}: {kinds:?}"
        );
    }
}
