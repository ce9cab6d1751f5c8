//! The admission webhooks as the real API server calls them.

use crate::k8s::objects::apply;
use crate::Suite;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use std::sync::Arc;

/// A Job created with a queue label is suspended and taken over by the mutating webhook;
/// unsuspending it is the dispatcher's alone: the API server, calling the validating
/// webhook, refuses it to a user allowed by RBAC to update Jobs, and to a cluster admin,
/// while it lets the same user change a label.
pub async fn unsuspending_as_another_user_is_denied_by_the_validating_webhook(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let ns = "admission";
    env.namespace(ns, &[]).await;
    // A queue whose only cluster does not exist: its Jobs wait, suspended.
    env.queue(ns, &["nowhere"], json!({})).await;
    let admin = env.manager.admin.clone();
    for object in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "job-editor", "namespace": ns},
               "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "update", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alice-edits-jobs", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "job-editor"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    ] {
        apply(&admin, &object, false).await.expect("RBAC for alice");
    }
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "held", "namespace": ns, "labels": {"switchyard.dev/queue-name": ns}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36",
                            "resources": {"requests": {"cpu": "1"}}}]}}},
    }))
    .unwrap();
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("the Job is created");
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.suspend, Some(true), "the mutating webhook suspends it");
    assert_eq!(
        spec.managed_by.as_deref(),
        Some("switchyard.dev/dispatcher")
    );

    let alice = env.manager.client_as("alice", &[]).await;
    let as_alice: Api<Job> = Api::namespaced(alice, ns);
    let unsuspend = Patch::Merge(json!({"spec": {"suspend": false}}));
    for (who, api) in [("alice", &as_alice), ("a cluster admin", &jobs)] {
        match api.patch("held", &PatchParams::default(), &unsuspend).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 403, "{who}: {e:?}");
                assert!(
                    e.message.contains(
                        "admission webhook \"validate-job.switchyard.dev\" denied the request"
                    ) && e.message.contains("spec.suspend")
                        && e.message.contains("may unsuspend"),
                    "{who}: {}",
                    e.message
                );
            }
            other => panic!("{who} unsuspended a queued Job: {other:?}"),
        }
    }
    // The same user may change what is not Switchyard's business.
    as_alice
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"owner": "alice"}}})),
        )
        .await
        .expect("alice may label the Job");
    let now = jobs.get("held").await.unwrap();
    assert_eq!(now.spec.unwrap().suspend, Some(true), "still suspended");
    jobs.delete("held", &Default::default()).await.unwrap();
}
