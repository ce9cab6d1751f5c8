//! The real JobSet controller (v0.11.0) in a control plane of its own, with a fake kubelet's
//! nodes: it runs a JobSet of two replicated Jobs to `Completed`, and leaves alone a JobSet
//! whose `spec.managedBy` is Switchyard's, as the manager needs.

use crate::k8s::jobset::{jobsets, JOBSET_NAME_LABEL};
use crate::k8s::kubelet::{FakeKubelet, NodeSpec, RUN_SECONDS};
use crate::k8s::objects::{self, apply};
use crate::k8s::{eventually, Assets, ControlPlane, Options};
use crate::Suite;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::Api;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A control plane with a controller manager, a scheduler, two fake-kubelet nodes (16 CPUs,
/// 64Gi, 4 GPUs in two NUMA zones) and the JobSet controller.
pub struct JobSetPlane {
    pub plane: ControlPlane,
    _kubelet: FakeKubelet,
}

impl JobSetPlane {
    pub async fn start(assets: &Assets, dir: &Path) -> Result<Self, String> {
        let options = Options {
            name: "jobset".into(),
            controller_manager: true,
            scheduler: true,
        };
        let plane = ControlPlane::start(assets, dir, options).await?;
        objects::apply_yaml(&plane.admin, include_str!("../../e2e/nrt-crd.yaml")).await?;
        objects::wait_established(
            &plane.admin,
            "noderesourcetopologies.topology.node.k8s.io",
            Duration::from_secs(30),
        )
        .await;
        let nodes = (0..2)
            .map(|i| NodeSpec::new(&format!("js-node-{i}"), 16, 64, 4, 2))
            .collect();
        let kubelet = FakeKubelet::start(plane.admin.clone(), nodes).await?;
        plane.start_jobset_controller().await?;
        Ok(Self {
            plane,
            _kubelet: kubelet,
        })
    }
}

/// A JobSet of two replicated Jobs of different pod shapes: `driver` (1 Job of 1 pod, 1 CPU)
/// and `workers` (2 Jobs of 2 pods, 2 CPUs and 1 GPU each; Guaranteed), pods running 2 s.
pub fn two_replicated_jobs(name: &str, ns: &str, managed_by: Option<&str>) -> DynamicObject {
    let template = |pods: i32, resources: Value| {
        json!({"spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
            "template": {"metadata": {"annotations": {RUN_SECONDS: "2"}},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "busybox:1.36",
                                         "resources": {"requests": resources, "limits": resources}}]}}}})
    };
    let mut spec = json!({"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": template(1, json!({"cpu": "1", "memory": "1Gi"}))},
        {"name": "workers", "replicas": 2,
         "template": template(2, json!({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}))},
    ]});
    if let Some(m) = managed_by {
        spec["managedBy"] = json!(m);
    }
    serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .expect("a JobSet")
}

/// (name, succeeded, failed) per replicated Job of a JobSet's `status`, by name.
pub(crate) fn replicated_jobs_status(status: &Value) -> Vec<(String, i64, i64)> {
    let mut out: Vec<(String, i64, i64)> = status["replicatedJobsStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["succeeded"].as_i64().unwrap_or(-1),
                r["failed"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    out.sort();
    out
}

/// In one control plane with the fake kubelet's nodes, the JobSet controller runs a JobSet of
/// two replicated Jobs to `Completed` with its `replicatedJobsStatus`, its pods carrying the
/// hostname and subdomain it sets; and a JobSet with `spec.managedBy:
/// switchyard.dev/dispatcher`, unsuspended, gets no Job, no Service and no status.
pub async fn a_jobset_completes_and_one_managed_by_switchyard_is_left_alone(suite: Arc<Suite>) {
    let js = suite.jobset_plane().await;
    let admin = js.plane.admin.clone();
    let ns = "jobsets";
    apply(&admin, &crate::env::namespace(ns), false)
        .await
        .expect("a namespace");
    let api = jobsets(&admin, ns);
    let created = Instant::now();
    api.create(
        &PostParams::default(),
        &two_replicated_jobs("ours", ns, Some("switchyard.dev/dispatcher")),
    )
    .await
    .expect("a JobSet managed by Switchyard is accepted");
    api.create(
        &PostParams::default(),
        &two_replicated_jobs("theirs", ns, None),
    )
    .await
    .expect("a JobSet is created");

    let completed = eventually(
        &format!("JobSet {ns}/theirs Completed"),
        Duration::from_secs(60),
        || {
            let api = api.clone();
            async move {
                let js = api.get("theirs").await.map_err(|e| e.to_string())?;
                let status = js.data["status"].clone();
                if status["terminalState"] == "Completed" {
                    Ok(status)
                } else {
                    Err(status.to_string())
                }
            }
        },
    )
    .await;
    let condition = crate::env::condition(&json!({"status": completed}), "Completed");
    assert_eq!(
        (condition["status"].as_str(), condition["reason"].as_str()),
        (Some("True"), Some("AllJobsCompleted")),
        "{completed}"
    );
    assert_eq!(
        replicated_jobs_status(&completed),
        vec![("driver".into(), 1, 0), ("workers".into(), 2, 0)],
        "succeeded and failed Jobs per replicated Job: {completed}"
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let theirs = pods
        .list(&ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}=theirs")))
        .await
        .expect("pods can be listed");
    let shapes: Vec<(Option<String>, Option<String>, Option<String>)> = theirs
        .items
        .iter()
        .map(|p| {
            let spec = p.spec.clone().unwrap_or_default();
            (
                spec.subdomain,
                spec.hostname,
                p.status.as_ref().and_then(|s| s.phase.clone()),
            )
        })
        .collect();
    assert_eq!(
        shapes.len(),
        5,
        "1 driver pod and 2 × 2 worker pods: {shapes:?}"
    );
    assert!(
        shapes
            .iter()
            .all(|(sub, host, phase)| sub.as_deref() == Some("theirs")
                && host.as_deref().is_some_and(|h| h.starts_with("theirs-"))
                && phase.as_deref() == Some("Succeeded")),
        "every pod with the JobSet's subdomain and a hostname, Succeeded: {shapes:?}"
    );

    // Left alone for at least 5 s after its creation.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(created.elapsed())).await;
    let ours = api.get("ours").await.expect("the managed JobSet");
    assert!(
        ours.data["status"].as_object().is_none_or(|s| s.is_empty()),
        "the controller wrote the status of a JobSet managed by Switchyard: {}",
        ours.data["status"]
    );
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let made = jobs
        .list(&ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}=ours")))
        .await
        .expect("Jobs can be listed");
    assert!(
        made.items.is_empty(),
        "the controller made Jobs for a JobSet managed by Switchyard: {:?}",
        made.items
            .iter()
            .map(|j| j.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let services: Api<Service> = Api::namespaced(admin, ns);
    assert!(
        services
            .get_opt("ours")
            .await
            .expect("Services can be read")
            .is_none(),
        "the controller made the headless Service of a JobSet managed by Switchyard"
    );
}
