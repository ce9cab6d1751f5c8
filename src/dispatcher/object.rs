//! The manager's objects as the dispatcher reads and writes them: a Job (of any kind, see
//! [`super::kind`]) as the API server returns it becomes a [`Job`]; a change of a `Job` becomes the merge patches that
//! make the API server's copy say the same. Pure: the live executor does the I/O.

use super::job::{parse_rfc3339, rfc3339, Job, JobKey, JobResult, WorkerRefusal};
use super::kind::{Kind, Status};
use super::state::Queue;
use super::*;
use crate::api::dispatch_queue::DispatchQueue;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

/// PriorityClass values, by name, and the global default's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Priorities {
    pub(crate) by_name: HashMap<String, i32>,
    pub(crate) global_default: Option<i32>,
}

impl Priorities {
    /// A pod template's priority as the Priority admission plugin would set it on its pods:
    /// `spec.priority` when set, else its PriorityClass's value, else the global default's,
    /// else 0. An unknown class counts as 0 here (the pods themselves would be refused).
    pub(crate) fn of(&self, template_spec: &Value) -> i32 {
        if let Some(p) = template_spec.get("priority").and_then(Value::as_i64) {
            return p.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        }
        match template_spec
            .get("priorityClassName")
            .and_then(Value::as_str)
        {
            Some(name) if !name.is_empty() => self.by_name.get(name).copied().unwrap_or(0),
            _ => self.global_default.unwrap_or(0),
        }
    }
}

pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// The `metadata.resourceVersion` as a number (etcd revisions are; see [`newer`]).
pub(crate) fn resource_version(obj: &Value) -> Option<u64> {
    str_at(obj, "/metadata/resourceVersion").and_then(|s| s.parse().ok())
}

/// Whether `obj` is at least as recent as a version already seen. Resource versions are
/// opaque by contract; kube-apiserver's are etcd revisions, which only grow, and that is
/// what lets a watch event older than our own write be recognised and skipped. Unparseable
/// versions count as newer.
pub(crate) fn newer(obj: &Value, seen: Option<u64>) -> bool {
    match (resource_version(obj), seen) {
        (Some(rv), Some(seen)) => rv >= seen,
        _ => true,
    }
}

/// The object's key, as a Job of `kind`.
pub(crate) fn job_key(kind: Kind, obj: &Value) -> Option<JobKey> {
    Some(JobKey::of(
        kind,
        str_at(obj, "/metadata/namespace")?,
        str_at(obj, "/metadata/name")?,
    ))
}

/// A manager Job of `kind`, from the object the API server returned. `Err`: not even a Job
/// we can name (no namespace, name, uid or queue label).
pub(crate) fn parse_job(
    kind: Kind,
    obj: &Value,
    namespace_labels: Option<Arc<BTreeMap<String, String>>>,
    priorities: &Priorities,
) -> Result<Job, String> {
    let key = job_key(kind, obj).ok_or("no metadata.namespace or metadata.name")?;
    let meta = &obj["metadata"];
    let uid = meta["uid"].as_str().ok_or("no metadata.uid")?.to_string();
    let queue = meta["labels"][crate::wellknown::QUEUE_LABEL]
        .as_str()
        .ok_or("no queue label")?
        .to_string();
    let annotation = |name: &str| meta["annotations"][name].as_str().map(str::to_string);
    let time = |name: &str| annotation(name).as_deref().and_then(parse_rfc3339);
    let spec = &obj["spec"];
    let gang = kind.gang(obj);
    let status = Status::parse(kind, obj.get("status"))?;
    Ok(Job {
        uid,
        resource_version: meta["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        queue,
        priority: priorities.of(&gang_template(kind, spec)["spec"]),
        created: meta["creationTimestamp"]
            .as_str()
            .and_then(parse_rfc3339)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        parts: gang.parts,
        pod: gang.shape,
        extra: gang.extra.into(),
        main_jobs: gang.main_jobs,
        shape_key: gang.shape_key,
        namespace_labels,
        suspended: spec["suspend"].as_bool().unwrap_or(false),
        deleting: !meta["deletionTimestamp"].is_null(),
        cluster: annotation(CLUSTER_ANNOTATION).filter(|c| !c.is_empty()),
        offers: annotation(OFFERED_ANNOTATION)
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        admitted_at: time(ADMITTED_AT_ANNOTATION),
        requeues: annotation(REQUEUES_ANNOTATION)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        requeue_after: time(REQUEUE_AFTER_ANNOTATION),
        avoid: annotation(AVOID_ANNOTATION),
        refusals: annotation(REFUSED_ANNOTATION)
            .as_deref()
            .map(parse_refusals)
            .unwrap_or_default(),
        deactivated: annotation(DEACTIVATED_ANNOTATION),
        result: annotation(RESULT_ANNOTATION)
            .as_deref()
            .and_then(JobResult::parse),
        status,
        key,
    })
}

/// The pod template whose priority is the Job's: a batch/v1 Job's, a JobSet's first
/// replicated Job's (the JobSet's pods all ask for the same).
fn gang_template(kind: Kind, spec: &Value) -> &Value {
    match kind {
        Kind::Job => &spec["template"],
        Kind::JobSet => &spec["replicatedJobs"][0]["template"]["spec"]["template"],
    }
}

/// The refusals annotation (see [`REFUSED_ANNOTATION`]); entries that do not parse are
/// dropped (the worker is simply tried again).
pub(crate) fn parse_refusals(text: &str) -> BTreeMap<String, WorkerRefusal> {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
        return BTreeMap::new();
    };
    map.into_iter()
        .filter_map(|(cluster, v)| {
            let retry_at = v["retryAt"].as_str().and_then(parse_rfc3339)?;
            Some((
                cluster,
                WorkerRefusal {
                    count: v["count"]
                        .as_u64()
                        .unwrap_or(1)
                        .clamp(1, u64::from(u32::MAX)) as u32,
                    retry_at,
                    message: v["message"].as_str().unwrap_or_default().to_string(),
                },
            ))
        })
        .collect()
}

/// The refusals annotation's value, `None` when there are none.
pub(crate) fn refusals_annotation(refusals: &BTreeMap<String, WorkerRefusal>) -> Option<String> {
    if refusals.is_empty() {
        return None;
    }
    let map: Map<String, Value> = refusals
        .iter()
        .map(|(c, r)| {
            (
                c.clone(),
                json!({"count": r.count, "retryAt": rfc3339(r.retry_at),
                       "message": r.message}),
            )
        })
        .collect();
    Some(Value::Object(map).to_string())
}

/// A DispatchQueue as the dispatcher uses it: its settings, or why they are unusable.
pub(crate) fn parse_queue(q: &DispatchQueue) -> Option<Queue> {
    let name = q.metadata.name.clone()?;
    Some(Queue {
        name,
        settings: q.spec.resolve().map_err(|e| e.join("; ")),
    })
}

/// The merge patch of the Job's metadata and spec that turns `old` into `new` as far as
/// dispatch goes (every dispatch annotation, absent ones as `null`, and `spec.suspend`), or
/// `None` when they agree. The patch only applies to `old`'s resourceVersion: it sets our
/// annotations whole, so applied to a newer Job it could undo another writer's (two
/// dispatchers in a split brain cannot both win a claim). A conflict rereads and plans again.
pub(crate) fn meta_patch(old: &Job, new: &Job) -> Option<Value> {
    let before = status::annotations(old);
    let after = status::annotations(new);
    if before == after && old.suspended == new.suspended {
        return None;
    }
    let annotations: Map<String, Value> = after
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map_or(Value::Null, Value::String)))
        .collect();
    let mut patch = json!({"metadata": {"annotations": annotations,
                                        "resourceVersion": old.resource_version}});
    if old.suspended != new.suspended {
        patch["spec"] = json!({"suspend": new.suspended});
    }
    Some(patch)
}

/// The merge patch of the `status` subresource that turns `old` into `new`: each top-level
/// field that changed, `null` for the ones that went. Conditions are replaced as a whole (a
/// merge patch replaces lists), so the patch only applies to the `resource_version` the
/// status was read at: written over a newer status, it would drop a condition another
/// writer had just set.
pub(crate) fn status_patch(old: &Status, new: &Status, resource_version: &str) -> Option<Value> {
    if old == new {
        return None;
    }
    let as_map = |s: &Status| match s.to_value() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let (before, after) = (as_map(old), as_map(new));
    let mut fields = Map::new();
    for (k, v) in &after {
        if before.get(k) != Some(v) {
            fields.insert(k.clone(), v.clone());
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            fields.insert(k.clone(), Value::Null);
        }
    }
    (!fields.is_empty())
        .then(|| json!({"metadata": {"resourceVersion": resource_version}, "status": fields}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "resourceVersion": "41",
                "creationTimestamp": "2026-11-22T10:00:00Z",
                "labels": {"switchyard.dev/queue-name": "gpu"},
                "annotations": {"switchyard.dev/cluster": "east", "switchyard.dev/requeues": "2",
                                "switchyard.dev/offered-to": "a, b,"}},
            "spec": {"parallelism": 4, "completions": 8, "suspend": true,
                "managedBy": "switchyard.dev/dispatcher",
                "template": {"spec": {"priorityClassName": "high", "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"},
                                                              "limits": {"nvidia.com/gpu": "1"}}}]}}},
            "status": {"conditions": [{"type": "Admitted", "status": "False", "reason": "QuotaExceeded",
                "message": "m", "lastTransitionTime": "2026-11-22T10:00:01Z", "lastProbeTime": null}]}
        })
    }

    /// The admission time written in `admitted-at` reads back to the millisecond: the
    /// PodsReady timeout counted from it after a restart is not up to a second early.
    #[test]
    fn admitted_at_reads_back_to_the_millisecond() {
        let p = Priorities::default();
        let mut j = parse_job(Kind::Job, &job(), None, &p).unwrap();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_987);
        j.admitted_at = Some(at);
        let mut obj = job();
        for (k, v) in status::annotations(&j) {
            obj["metadata"]["annotations"][k] = json!(v);
        }
        let written = obj["metadata"]["annotations"][crate::dispatcher::ADMITTED_AT_ANNOTATION]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(written, "2026-11-18T11:06:40.987Z");
        let back = parse_job(Kind::Job, &obj, None, &p).unwrap();
        assert_eq!(back.admitted_at, Some(at));
        // Written by an earlier version, to the second: still read.
        obj["metadata"]["annotations"][crate::dispatcher::ADMITTED_AT_ANNOTATION] =
            json!("2026-11-18T11:06:40Z");
        let old = parse_job(Kind::Job, &obj, None, &p).unwrap();
        assert_eq!(
            old.admitted_at,
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000))
        );
    }

    #[test]
    fn a_manager_job_is_read_with_its_dispatch_state_and_priority() {
        let p = Priorities {
            by_name: [("high".to_string(), 1000)].into(),
            global_default: Some(5),
        };
        let j = parse_job(Kind::Job, &job(), None, &p).unwrap();
        assert_eq!(j.key, JobKey::new("ml", "train"));
        assert_eq!((j.queue.as_str(), j.priority, j.gang()), ("gpu", 1000, 4));
        assert_eq!(j.cluster.as_deref(), Some("east"));
        assert_eq!(j.offers, vec!["a", "b"]);
        assert_eq!(
            (j.requeues, j.suspended, j.resource_version.as_str()),
            (2, true, "41")
        );
        let shape = j.pod.as_ref().unwrap();
        assert_eq!(shape.node_request["cpu"], 2000);
        assert_eq!(j.status.conditions().len(), 1);

        let mut no_class = job();
        no_class["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("priorityClassName");
        assert_eq!(
            parse_job(Kind::Job, &no_class, None, &p).unwrap().priority,
            5
        );
        no_class["spec"]["template"]["spec"]["priority"] = json!(-3);
        assert_eq!(
            parse_job(Kind::Job, &no_class, None, &p).unwrap().priority,
            -3
        );
    }

    #[test]
    fn a_bad_template_is_a_reason_not_a_missing_job() {
        let mut j = job();
        j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
            json!("two");
        let parsed = parse_job(Kind::Job, &j, None, &Priorities::default()).unwrap();
        let err = parsed.pod.unwrap_err();
        assert!(err.contains("cpu"), "{err}");
        let mut nameless = job();
        nameless["metadata"].as_object_mut().unwrap().remove("uid");
        assert!(parse_job(Kind::Job, &nameless, None, &Priorities::default()).is_err());
    }

    #[test]
    fn patches_carry_only_what_changed_and_null_what_went() {
        let old = parse_job(Kind::Job, &job(), None, &Priorities::default()).unwrap();
        assert_eq!(meta_patch(&old, &old), None);
        let mut new = old.clone();
        new.cluster = None;
        new.suspended = false;
        let p = meta_patch(&old, &new).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "41");
        assert_eq!(
            p["metadata"]["annotations"][CLUSTER_ANNOTATION],
            Value::Null
        );
        assert_eq!(p["metadata"]["annotations"][REQUEUES_ANNOTATION], "2");
        assert_eq!(p["spec"]["suspend"], false);

        let mut status = old.status.clone();
        assert_eq!(status_patch(&old.status, &status, "41"), None);
        status.job_mut().active = Some(3);
        status.job_mut().conditions = None;
        let p = status_patch(&old.status, &status, "41").unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "41"},
                   "status": {"active": 3, "conditions": null}})
        );
    }

    #[test]
    fn older_watch_events_are_recognised() {
        let j = job();
        assert!(newer(&j, Some(41)));
        assert!(!newer(&j, Some(42)));
        assert!(newer(&j, None));
    }
}
