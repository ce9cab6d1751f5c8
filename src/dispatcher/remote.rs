//! The worker copy of a manager Job (of any kind), built from the manager object's JSON as the
//! API server returned it, so fields this version does not know are carried over untouched.
//!
//! The copy has the same namespace and name, our origin labels, no `spec.managedBy` (the
//! worker's own controller for the kind runs it), none of what the manager's API server
//! generated (uid, resourceVersion, status, what the kind adds: see `Kind::prepare_copy`), is
//! unsuspended, labels every pod template with the manager Job's uid, uses
//! the WorkerCluster's scheduler profile when it names one, and keeps its pods off the nodes
//! where room is kept for starving Jobs (a required node affinity on `metadata.name`), so that
//! the worker's scheduler, which does not know of that room, leaves it alone too. Its pods
//! prefer the nodes of the placement the dispatcher found for it (a preferred node affinity of
//! the highest weight): a default kube-scheduler knows nothing of NUMA zones, and left to
//! itself spreads the pods by CPU and memory onto nodes whose kubelet may reject them
//! (TopologyAffinityError) and across the NUMA zones bigger Jobs need whole. A preference, not
//! a requirement, so that a pod whose node went away or filled up still goes elsewhere. Its pod
//! templates carry the queue's placement strategy (`switchyard.dev/placement-strategy`,
//! unless the Job's template names one), so that a worker whose scheduler asks Switchyard's
//! extender places the pods on nodes by the same ranking the dispatcher chose the worker by.

use super::job::JobKey;
use super::kind::{Kind, Status};
use super::state::WorkerCopy;
use super::{ORIGIN_LABEL, ORIGIN_UID_LABEL};
use serde_json::{Map, Value};

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

/// What a copy is made for, in its worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyTarget<'a> {
    /// The WorkerCluster's `spec.schedulerName`.
    pub scheduler_name: Option<&'a str>,
    /// Nodes the copy's pods must not go to (room kept there for other Jobs).
    pub keep_off: &'a [std::sync::Arc<str>],
    /// The nodes of the placement the dispatcher found for the Job there: its pods prefer them.
    pub prefer: &'a [std::sync::Arc<str>],
    /// The worker runs Kueue: the LocalQueue the copy enters (`WorkerCluster.spec.kueue`). The
    /// copy is then created suspended, for the worker's Kueue to admit.
    pub kueue_queue: Option<&'a str>,
    /// The queue's `placement.strategy`, for the pod templates that name none.
    pub strategy: Option<crate::placement::Strategy>,
}

/// The copy to create in a worker for the manager Job `job`, of the kind its `apiVersion` and
/// `kind` name (a batch/v1 Job when they name none the dispatcher runs).
pub fn copy_of(job: &Value, manager_id: &str, target: CopyTarget) -> Result<Value, CopyError> {
    let kind = Kind::of(
        job["apiVersion"].as_str().unwrap_or_default(),
        job["kind"].as_str().unwrap_or_default(),
    )
    .unwrap_or_default();
    let mut copy = job.clone();
    let (name, namespace) = (
        job["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        job["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    let obj = copy.as_object_mut().ok_or(CopyError::Missing("body"))?;
    obj.remove("status");
    obj.insert("apiVersion".into(), kind.api_version().into());
    obj.insert("kind".into(), kind.name().into());
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
    if let Some(q) = target.kueue_queue {
        labels.insert(super::kueue::QUEUE_NAME_LABEL.into(), q.into());
    }
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
    // A Kueue worker's own queue unsuspends it once its quota admits it.
    spec.insert("suspend".into(), target.kueue_queue.is_some().into());
    for template in kind.prepare_copy(spec, (&name, &namespace)) {
        // Lets a worker's inventory tell which pods belong to which dispatched Job.
        let metadata = object(template, "metadata");
        object(metadata, "labels").insert(ORIGIN_UID_LABEL.into(), uid.clone().into());
        if let Some(strategy) = target.strategy {
            object(metadata, "annotations")
                .entry(crate::placement::STRATEGY_ANNOTATION)
                .or_insert_with(|| strategy.as_str().into());
        }
        let pod = object(template, "spec");
        if let Some(name) = target.scheduler_name {
            pod.insert("schedulerName".into(), name.into());
        }
        if !target.keep_off.is_empty() {
            keep_off(pod, target.keep_off);
        }
        if !target.prefer.is_empty() {
            prefer(pod, target.prefer);
        }
    }
    Ok(copy)
}

/// Adds `metadata.name NotIn [node]` for each of `nodes` to every required node selector term
/// of the pod spec (the terms are ORed: each must keep off them; a term's requirements are
/// ANDed), or a term of its own when there is none.
fn keep_off(pod: &mut Map<String, Value>, nodes: &[std::sync::Arc<str>]) {
    let fields: Vec<Value> = nodes.iter().map(|n| name_field("NotIn", n)).collect();
    let affinity = object(pod, "affinity");
    let node = object(affinity, "nodeAffinity");
    let required = object(node, "requiredDuringSchedulingIgnoredDuringExecution");
    let terms = array(required, "nodeSelectorTerms");
    if terms.is_empty() {
        terms.push(Value::Object(Map::new()));
    }
    for term in terms.iter_mut() {
        if !term.is_object() {
            *term = Value::Object(Map::new());
        }
        let term = term.as_object_mut().expect("just made an object");
        array(term, "matchFields").extend(fields.iter().cloned());
    }
}

/// A node selector requirement on the node's name (`matchFields`, the only field it may
/// name). The API server takes exactly one value for `In` and `NotIn` on a field ("must be
/// only one value when `operator` is 'In' or 'NotIn' for node field selector"): one node.
fn name_field(operator: &str, node: &str) -> Value {
    serde_json::json!({"key": "metadata.name", "operator": operator, "values": [node]})
}

/// kube-scheduler's highest weight for a preferred node affinity term: with the NodeAffinity
/// plugin's default weight (2) it outweighs the resource scores.
const PREFERRED_WEIGHT: i64 = 100;

/// Adds a preferred node affinity term for each of `nodes` (by `metadata.name`, one node a
/// term as the API server requires), after the pod's own. A node matches one of them, so
/// each of `nodes` scores the same weight.
fn prefer(pod: &mut Map<String, Value>, nodes: &[std::sync::Arc<str>]) {
    let affinity = object(pod, "affinity");
    let node = object(affinity, "nodeAffinity");
    let preferred = array(node, "preferredDuringSchedulingIgnoredDuringExecution");
    preferred.extend(nodes.iter().map(|n| {
        serde_json::json!({
            "weight": PREFERRED_WEIGHT,
            "preference": {"matchFields": [name_field("In", n)]},
        })
    }));
}

/// The copy as the dispatcher tracks it, from a worker object of `kind` labelled with our
/// origin. A status that cannot be read counts as empty.
pub(crate) fn parse_copy(kind: Kind, cluster: &str, job: &Value) -> Option<WorkerCopy> {
    let meta = job.get("metadata")?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let origin_uid = s(meta.pointer(&format!("/labels/{}", ORIGIN_UID_LABEL.replace('/', "~1"))))?;
    let status = Status::parse(kind, job.get("status")).unwrap_or_else(|_| Status::empty(kind));
    Some(WorkerCopy {
        cluster: cluster.to_string(),
        key: JobKey::of(kind, s(meta.get("namespace"))?, s(meta.get("name"))?),
        uid: s(meta.get("uid")).unwrap_or_default(),
        origin_uid,
        status,
        deleting: meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()),
        suspended: job["spec"]["suspend"].as_bool().unwrap_or(false),
        kueue: meta["labels"][super::kueue::QUEUE_NAME_LABEL].is_string(),
    })
}

/// `parent[key]` as an array, created (or replacing a non-array) when needed.
fn array<'a>(parent: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let slot = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !slot.is_array() {
        *slot = Value::Array(Vec::new());
    }
    slot.as_array_mut().expect("just made an array")
}

/// `parent[key]` as an object, created (or replacing a non-object) when needed.
pub(crate) fn object<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
) -> &'a mut Map<String, Value> {
    let slot = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("just made an object")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::parse_yaml;
    use crate::placement::{fit::node_accepts, PodShape, PodView, Strategy};
    use std::sync::Arc;

    /// A Job as the manager's API server returns it (defaulted, with its uid and status).
    fn stored_job() -> Value {
        let exchange: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/kube-api/get_job.json"))
                .unwrap();
        exchange["response"]["body"].clone()
    }

    /// The copy's pod template as the worker's scheduler reads it, and whether it may go to
    /// each of `nodes` (by name, labelled `zone: a`).
    fn accepted(copy: &Value, nodes: &[&str]) -> Vec<bool> {
        let mut yaml = String::from("clusters:\n  - name: w\n    nodes:\n");
        for n in nodes {
            yaml.push_str(&format!(
                "      - name: {n}\n        labels: {{zone: a}}\n        allocatable: {{cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n"
            ));
        }
        let inventory = parse_yaml(&yaml).unwrap();
        let view: PodView = serde_json::from_value(copy["spec"]["template"].clone()).unwrap();
        let shape = PodShape::from_view(&view).unwrap();
        nodes
            .iter()
            .map(|n| node_accepts(&shape, inventory.node(n).unwrap().1).is_ok())
            .collect()
    }

    #[test]
    fn a_copy_without_room_kept_in_its_worker_has_no_affinity_added() {
        let job = stored_job();
        let copy = copy_of(&job, "m", CopyTarget::default()).unwrap();
        assert_eq!(
            copy["spec"]["template"]["spec"].get("affinity"),
            job["spec"]["template"]["spec"].get("affinity")
        );
        assert_eq!(accepted(&copy, &["n1", "n2"]), [true, true]);
    }

    #[test]
    fn a_copys_pods_are_kept_off_the_nodes_where_room_is_kept() {
        let keep_off: Vec<Arc<str>> = vec!["n2".into(), "n3".into()];
        let target = CopyTarget {
            scheduler_name: Some("switchyard-scheduler"),
            keep_off: &keep_off,
            ..Default::default()
        };
        let copy = copy_of(&stored_job(), "m", target).unwrap();
        let spec = &copy["spec"]["template"]["spec"];
        assert_eq!(spec["schedulerName"], "switchyard-scheduler");
        let terms = &spec["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(
            terms,
            &serde_json::json!([{"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]},
                {"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}
            ]}])
        );
        assert_eq!(accepted(&copy, &["n1", "n2", "n3"]), [true, false, false]);
        assert_field_selectors_valid(&copy);
    }

    /// The Job's own required terms are ORed: each one gets the exclusion, and what each
    /// asked for is kept.
    #[test]
    fn the_jobs_own_node_affinity_is_kept_and_each_term_keeps_off_the_room() {
        let mut job = stored_job();
        job["spec"]["template"]["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]}
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}
            ]
        }});
        let keep_off: Vec<Arc<str>> = vec!["n1".into()];
        let target = CopyTarget {
            scheduler_name: None,
            keep_off: &keep_off,
            ..Default::default()
        };
        let copy = copy_of(&job, "m", target).unwrap();
        let affinity = &copy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
        let terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .unwrap();
        assert_eq!(terms.len(), 2);
        assert_eq!(terms[0]["matchExpressions"][0]["values"][0], "a");
        assert_eq!(terms[1]["matchFields"][0]["values"][0], "n9");
        for t in terms {
            let last = t["matchFields"].as_array().unwrap().last().unwrap();
            assert_eq!(last["operator"], "NotIn");
            assert_eq!(last["values"], serde_json::json!(["n1"]));
        }
        assert_eq!(
            affinity["preferredDuringSchedulingIgnoredDuringExecution"],
            job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
                ["preferredDuringSchedulingIgnoredDuringExecution"]
        );
        assert_eq!(accepted(&copy, &["n1", "n2"]), [false, true]);
        assert_field_selectors_valid(&copy);
    }

    /// What the API server checks of a node field selector (`ValidateNodeFieldSelector`):
    /// `metadata.name` only, and one value for `In` and `NotIn`. A copy that breaks it is
    /// refused by the worker ("must be only one value when `operator` is 'In' or 'NotIn' for
    /// node field selector"), as a gang placed on two nodes once was.
    fn assert_field_selectors_valid(copy: &Value) {
        let affinity = &copy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
        let required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["preference"].clone());
        for term in required.into_iter().chain(preferred) {
            for field in term["matchFields"].as_array().into_iter().flatten() {
                assert_eq!(field["key"], "metadata.name", "{field}");
                if matches!(field["operator"].as_str(), Some("In" | "NotIn")) {
                    assert_eq!(field["values"].as_array().map(Vec::len), Some(1), "{field}");
                }
            }
        }
    }

    /// The strategy the worker's extender ranks nodes by for the copy's pods (its own default
    /// being `worker_default`).
    fn worker_strategy(template: &Value, worker_default: Strategy) -> Strategy {
        let view: PodView = serde_json::from_value(template.clone()).unwrap();
        PodShape::from_view(&view).unwrap().strategy(worker_default)
    }

    #[test]
    fn a_copys_pods_are_ranked_in_the_worker_by_the_queues_placement_strategy() {
        let job = stored_job();
        let target = CopyTarget {
            strategy: Some(Strategy::MostAllocated),
            ..Default::default()
        };
        let copy = copy_of(&job, "m", target).unwrap();
        let template = &copy["spec"]["template"];
        assert_eq!(
            worker_strategy(template, Strategy::LeastAllocated),
            Strategy::MostAllocated
        );
        // The template's own annotations stay beside it.
        let before = job["spec"]["template"]["metadata"]["annotations"].as_object();
        for (k, v) in before.into_iter().flatten() {
            assert_eq!(&template["metadata"]["annotations"][k], v);
        }
        // Without a queue's strategy the worker's own default applies.
        let plain = copy_of(&job, "m", CopyTarget::default()).unwrap();
        assert_eq!(
            worker_strategy(&plain["spec"]["template"], Strategy::BalancedAllocation),
            Strategy::BalancedAllocation
        );
    }

    #[test]
    fn a_strategy_the_jobs_template_names_is_kept() {
        let mut job = stored_job();
        job["spec"]["template"]["metadata"]["annotations"] =
            serde_json::json!({"switchyard.dev/placement-strategy": "LeastNUMANodes"});
        let target = CopyTarget {
            strategy: Some(Strategy::MostAllocated),
            ..Default::default()
        };
        let copy = copy_of(&job, "m", target).unwrap();
        assert_eq!(
            worker_strategy(&copy["spec"]["template"], Strategy::LeastAllocated),
            Strategy::LeastNumaNodes
        );
    }

    #[test]
    fn every_pod_template_of_a_jobset_copy_names_the_strategy() {
        let path = format!(
            "{}/tests/fixtures/kube-api/jobset/get_jobset_queued.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let jobset = serde_json::from_str::<Value>(&text).unwrap()["response"]["body"].clone();
        let target = CopyTarget {
            strategy: Some(Strategy::BalancedAllocation),
            ..Default::default()
        };
        let copy = copy_of(&jobset, "m", target).unwrap();
        let replicated = copy["spec"]["replicatedJobs"].as_array().unwrap();
        assert_eq!(replicated.len(), 2);
        for r in replicated {
            let template = &r["template"]["spec"]["template"];
            assert_eq!(
                worker_strategy(template, Strategy::LeastAllocated),
                Strategy::BalancedAllocation
            );
        }
    }

    #[test]
    fn a_copys_pods_prefer_the_nodes_of_its_placement_after_their_own_preferences() {
        let mut job = stored_job();
        let own = serde_json::json!([
            {"weight": 5, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}
        ]);
        job["spec"]["template"]["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": own.clone()
        }});
        let prefer: Vec<Arc<str>> = vec!["n2".into(), "n3".into()];
        let target = CopyTarget {
            prefer: &prefer,
            ..Default::default()
        };
        let copy = copy_of(&job, "m", target).unwrap();
        let affinity = &copy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
        let preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .unwrap();
        assert_eq!(preferred.len(), 3);
        assert_eq!(preferred[0], own[0]);
        for (term, node) in preferred[1..].iter().zip(["n2", "n3"]) {
            assert_eq!(
                term,
                &serde_json::json!({"weight": 100, "preference": {"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}})
            );
        }
        assert_field_selectors_valid(&copy);
        // A preference, not a requirement: the pods may still go to any node.
        assert!(affinity
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .is_none());
        assert_eq!(accepted(&copy, &["n1", "n2"]), [true, true]);
    }
}
