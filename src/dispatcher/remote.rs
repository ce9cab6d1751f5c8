//! The worker copy of a manager Job, built from the manager Job's JSON as the API server
//! returned it, so fields this version does not know are carried over untouched.
//!
//! The copy has the same namespace and name, our origin labels, no `spec.managedBy` (the
//! worker's own Job controller runs it), none of what the manager's API server generated (the
//! selector, the controller labels, uid, resourceVersion, status, ...), is unsuspended, and
//! uses the WorkerCluster's scheduler profile when it names one.

use super::job::JobKey;
use super::state::WorkerCopy;
use super::{ORIGIN_LABEL, ORIGIN_UID_LABEL};
use k8s_openapi::api::batch::v1::JobStatus;
use serde_json::{Map, Value};

/// Labels kube-apiserver puts on a Job's pod template (and in its generated selector).
const CONTROLLER_LABELS: [&str; 4] = [
    "batch.kubernetes.io/controller-uid",
    "controller-uid",
    "batch.kubernetes.io/job-name",
    "job-name",
];

/// Metadata the manager's API server owns; the worker's makes its own.
const SERVER_METADATA: [&str; 10] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CopyError {
    #[error("the Job has no {0}")]
    Missing(&'static str),
}

/// The copy to create in a worker for the manager Job `job`.
pub fn copy_of(
    job: &Value,
    manager_id: &str,
    scheduler_name: Option<&str>,
) -> Result<Value, CopyError> {
    let mut copy = job.clone();
    let obj = copy.as_object_mut().ok_or(CopyError::Missing("body"))?;
    obj.remove("status");
    obj.insert("apiVersion".into(), "batch/v1".into());
    obj.insert("kind".into(), "Job".into());
    let uid = job
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .ok_or(CopyError::Missing("metadata.uid"))?
        .to_string();

    let meta = object(obj, "metadata");
    for k in SERVER_METADATA {
        meta.remove(k);
    }
    meta.remove("generateName");
    let labels = object(meta, "labels");
    labels.remove(crate::wellknown::QUEUE_LABEL);
    labels.insert(ORIGIN_LABEL.into(), manager_id.into());
    labels.insert(ORIGIN_UID_LABEL.into(), uid.clone().into());
    let annotations = object(meta, "annotations");
    // Dispatch state belongs to the manager; last-applied-configuration would mislead kubectl
    // in the worker.
    annotations.retain(|k, _| {
        !k.starts_with("switchyard.dev/") && k != "kubectl.kubernetes.io/last-applied-configuration"
    });
    if annotations.is_empty() {
        meta.remove("annotations");
    }

    let spec = object(obj, "spec");
    spec.remove("managedBy");
    spec.insert("suspend".into(), false.into());
    let manual = spec.get("manualSelector").and_then(Value::as_bool) == Some(true);
    if !manual {
        spec.remove("selector");
        spec.remove("manualSelector");
    }
    let template = object(spec, "template");
    let tmeta = object(template, "metadata");
    let tlabels = object(tmeta, "labels");
    if !manual {
        for l in CONTROLLER_LABELS {
            tlabels.remove(l);
        }
    }
    // Lets a worker's inventory tell which pods belong to which dispatched Job.
    tlabels.insert(ORIGIN_UID_LABEL.into(), uid.into());
    if let Some(name) = scheduler_name {
        object(template, "spec").insert("schedulerName".into(), name.into());
    }
    Ok(copy)
}

/// The copy as the dispatcher tracks it, from a worker Job labelled with our origin.
pub(crate) fn parse_copy(cluster: &str, job: &Value) -> Option<WorkerCopy> {
    let meta = job.get("metadata")?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let origin_uid = s(meta.pointer(&format!("/labels/{}", ORIGIN_UID_LABEL.replace('/', "~1"))))?;
    let status: JobStatus = job
        .get("status")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    Some(WorkerCopy {
        cluster: cluster.to_string(),
        key: JobKey::new(s(meta.get("namespace"))?, s(meta.get("name"))?),
        uid: s(meta.get("uid")).unwrap_or_default(),
        origin_uid,
        status,
        deleting: meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()),
    })
}

/// `parent[key]` as an object, created (or replacing a non-object) when needed.
fn object<'a>(parent: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("just made an object")
}
