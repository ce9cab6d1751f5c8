//! jobset.x-k8s.io/v1alpha2 JobSet: several replicated Jobs that start, run and fail as one.
//!
//! - **Gang**: every pod of every replicated Job (`replicas` × the Job's pods at once), placed
//!   all-or-nothing in one worker, NUMA-exact like any gang. Replicated Jobs that ask for
//!   different pods (requests, QoS, node selection, tolerations) are placed part by part in
//!   the same worker (see `oracle::view::search`).
//! - **Copy**: the JobSet itself; the worker's JobSet controller makes its Jobs, Service and
//!   pods. Each pod template carries `switchyard.dev/gang-size`: how many of the JobSet's pods
//!   ask for the same pods as it (all of them when every replicated Job does), which is the
//!   gang the worker's NUMA-aware scheduler (its extender) checks a pod of it against.
//! - **Status**: conditions, `replicatedJobsStatus`, `restarts`, `restartsCountTowardsMax`,
//!   `terminalState` and any field this version does not know are mirrored as they are. The
//!   CRD's schema is all the API server checks: conditions are `metav1.Condition`s (reason,
//!   message and transition time required, one per type), replicated Jobs' statuses one per
//!   name with every counter set.
//! - **Readiness**: the copy's `replicatedJobsStatus` counts Jobs, not pods. A Job counts as
//!   Ready when all its pods are Ready or done; the gang's Ready pods are the pods of its Ready
//!   and succeeded Jobs. `PodsReady` is therefore exact (all pods Ready), and its message
//!   counts in steps of whole Jobs.

use super::super::condition;
use super::super::job::JobResult;
use super::super::mirror::{pods_ready_condition, to_timestamp, Readiness};
use super::{count, template_shape, Extra, Gang, Kind, Part};
use crate::placement::{PodShape, GANG_SIZE_ANNOTATION};
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

/// The `spec.managedBy` value reserved for the JobSet controller itself.
pub(crate) const CONTROLLER: &str = "jobset.sigs.k8s.io/jobset-controller";

/// A JobSet's status (`jobset.x-k8s.io/v1alpha2`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobSetStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) conditions: Vec<JobCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) restarts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) restarts_count_towards_max: Option<i32>,
    /// `Completed` or `Failed` once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) terminal_state: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) replicated_jobs_status: Vec<ReplicatedJobStatus>,
    /// Fields this version does not know, kept as they are.
    #[serde(flatten)]
    pub(crate) other: BTreeMap<String, Value>,
}

/// One replicated Job's child Jobs, by state (every counter is required by the CRD).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplicatedJobStatus {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) ready: i32,
    #[serde(default)]
    pub(crate) succeeded: i32,
    #[serde(default)]
    pub(crate) failed: i32,
    #[serde(default)]
    pub(crate) active: i32,
    #[serde(default)]
    pub(crate) suspended: i32,
    #[serde(flatten)]
    pub(crate) other: BTreeMap<String, Value>,
}

/// One replicated Job of a JobSet's spec: its part of the gang, and its pod template.
struct Replicated<'a> {
    part: Part,
    template: &'a Value,
}

/// The replicated Jobs of a JobSet's `spec.replicatedJobs`.
fn replicated(list: &Value) -> Vec<Replicated<'_>> {
    let Some(list) = list.as_array() else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .map(|(i, rj)| {
            let job = &rj["template"]["spec"];
            let parallelism = count(&job["parallelism"]).unwrap_or(1);
            let pods_per_job = match count(&job["completions"]) {
                Some(c) => parallelism.min(c),
                None => parallelism,
            };
            Replicated {
                part: Part {
                    name: rj["name"]
                        .as_str()
                        .map_or_else(|| format!("#{i}"), str::to_string),
                    jobs: count(&rj["replicas"]).unwrap_or(1),
                    pods_per_job,
                },
                template: &job["template"],
            }
        })
        .collect()
}

/// Every pod of every replicated Job. Replicated Jobs that ask for the same pods (as placement
/// sees them) are one group; the group of the most pods is the main part, the others are
/// placed beside it in the same worker.
pub(crate) fn gang(obj: &Value) -> Gang {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let replicated = replicated(&obj["spec"]["replicatedJobs"]);
    let parts: Vec<Part> = replicated.iter().map(|r| r.part.clone()).collect();
    // Each template is analysed only when its Job has pods, and not past a bad one.
    let shapes = replicated
        .iter()
        .enumerate()
        .filter(|(_, r)| r.part.pods() > 0)
        .map(|(i, r)| {
            let field = format!("spec.replicatedJobs[{i}].template.spec.template");
            let (shape, key) = template_shape(r.template, (Kind::JobSet, name, namespace), &field);
            (r.part.name.as_str(), r.part.pods(), shape, key)
        });
    gang_of(parts, shapes)
}

/// The gang of a JobSet's replicated Jobs (`parts`) given, for each that has pods, in the
/// spec's order: its name, how many pods, their shape (or why there is none) and their
/// template's key. [`gang`] from the object; `simulate` from a scenario's JobSet.
pub(crate) fn gang_of<'n>(
    parts: Vec<Part>,
    shapes: impl IntoIterator<Item = (&'n str, u32, Result<Arc<PodShape>, String>, u64)>,
) -> Gang {
    struct Group<'n> {
        shape: Arc<PodShape>,
        pods: u32,
        names: Vec<&'n str>,
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut keys = Vec::new();
    for (name, pods, shape, key) in shapes {
        if pods == 0 {
            continue;
        }
        let shape = match shape {
            Ok(s) => s,
            Err(e) => return unplaceable(e, parts),
        };
        keys.push(key);
        match groups
            .iter_mut()
            .find(|g| same_for_placement(&g.shape, &shape))
        {
            Some(g) => {
                g.pods = g.pods.saturating_add(pods);
                g.names.push(name);
            }
            None => groups.push(Group {
                shape,
                pods,
                names: vec![name],
            }),
        }
    }
    // The most pods first; of as many, the first in the spec.
    groups.sort_by_key(|g| std::cmp::Reverse(g.pods));
    let several = groups.len() > 1;
    let mut groups = groups.into_iter();
    let Some(main) = groups.next() else {
        return unplaceable("spec.replicatedJobs: no pods to run".into(), parts);
    };
    let extra: Vec<Extra> = groups
        .map(|g| Extra {
            jobs: part_label(&g.names).into(),
            shape: g.shape,
            pods: g.pods,
        })
        .collect();
    let main_jobs: Option<Arc<str>> = several.then(|| Arc::from(part_label(&main.names)));
    // One template: its key, as for a Job. Several: the key of all of them, in order (and,
    // when they make several shapes, of the names messages give their parts).
    let shape_key = if keys.len() == 1 {
        keys[0]
    } else {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        keys.hash(&mut h);
        if let Some(main) = &main_jobs {
            main.hash(&mut h);
            extra.iter().for_each(|e| e.jobs.hash(&mut h));
        }
        h.finish()
    };
    Gang {
        shape: Ok(main.shape),
        shape_key,
        parts,
        extra,
        main_jobs,
    }
}

/// Replicated Jobs as a person names them: "replicated Job driver", "replicated Jobs a, b".
fn part_label(names: &[&str]) -> String {
    match names {
        [one] => format!("replicated Job {one}"),
        many => format!("replicated Jobs {}", many.join(", ")),
    }
}

/// A JobSet that cannot be placed, keyed by why: the admission pass tries the first Job of a
/// class and tells the rest of the class its reason, so such JobSets share a class only when
/// they share the reason (one key for all would tell each the first one's).
fn unplaceable(why: String, parts: Vec<Part>) -> Gang {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    why.hash(&mut h);
    Gang {
        shape: Err(why),
        shape_key: h.finish(),
        parts,
        extra: Vec::new(),
        main_jobs: None,
    }
}

/// Whether two pods are the same to the placement engine (names, commands and annotations
/// other than Switchyard's aside).
fn same_for_placement(a: &PodShape, b: &PodShape) -> bool {
    fn ours(s: &PodShape) -> Vec<(&String, &String)> {
        s.annotations
            .iter()
            .filter(|(k, _)| k.starts_with("switchyard.dev/"))
            .collect()
    }
    let containers = |s: &PodShape| -> Vec<_> {
        s.containers
            .iter()
            .map(|c| (c.kind, c.requests.clone()))
            .collect()
    };
    a.guaranteed == b.guaranteed
        && a.node_request == b.node_request
        && a.effective == b.effective
        && a.node_selector == b.node_selector
        && a.required_terms == b.required_terms
        && a.tolerations == b.tolerations
        && a.one_per_node == b.one_per_node
        && a.spread == b.spread
        && a.together == b.together
        && ours(a) == ours(b)
        && containers(a) == containers(b)
}

/// For each replicated Job, how many of the JobSet's pods ask for the same pods as its own.
fn gang_sizes(list: &Value, (name, namespace): (&str, &str)) -> Vec<u32> {
    let replicated = replicated(list);
    let shapes: Vec<Option<Arc<PodShape>>> = replicated
        .iter()
        .map(|r| {
            template_shape(r.template, (Kind::JobSet, name, namespace), "")
                .0
                .ok()
        })
        .collect();
    shapes
        .iter()
        .enumerate()
        .map(|(i, a)| {
            replicated
                .iter()
                .zip(&shapes)
                .enumerate()
                .filter(|(j, (_, b))| match (a, b) {
                    (Some(a), Some(b)) => same_for_placement(a, b),
                    _ => *j == i,
                })
                .fold(0u32, |sum, (_, (r, _))| sum.saturating_add(r.part.pods()))
        })
        .collect()
}

/// The pod templates of every replicated Job of JobSet `workload` (name, namespace), each told
/// its gang's size (see [`gang_sizes`]).
pub(crate) fn prepare_copy<'s>(
    spec: &'s mut Map<String, Value>,
    workload: (&str, &str),
) -> Vec<&'s mut Map<String, Value>> {
    let sizes = gang_sizes(spec.get("replicatedJobs").unwrap_or(&Value::Null), workload);
    let Some(Value::Array(list)) = spec.get_mut("replicatedJobs") else {
        return Vec::new();
    };
    let mut templates = Vec::new();
    for (rj, size) in list.iter_mut().filter_map(Value::as_object_mut).zip(sizes) {
        let job = super::super::remote::object(rj, "template");
        let spec = super::super::remote::object(job, "spec");
        let template = super::super::remote::object(spec, "template");
        let annotations = super::super::remote::object(
            super::super::remote::object(template, "metadata"),
            "annotations",
        );
        annotations
            .entry(GANG_SIZE_ANNOTATION)
            .or_insert_with(|| size.to_string().into());
        templates.push(template);
    }
    templates
}

fn is_true(s: &JobSetStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// `Completed` or `Failed` True, or the terminal state saying so.
pub(crate) fn terminal(s: &JobSetStatus) -> Option<JobResult> {
    if is_true(s, "Completed") {
        return Some(JobResult::Succeeded);
    }
    if is_true(s, "Failed") {
        return Some(JobResult::Failed);
    }
    match s.terminal_state.as_deref() {
        Some("Completed") => Some(JobResult::Succeeded),
        Some("Failed") => Some(JobResult::Failed),
        _ => None,
    }
}

/// The pods of Ready and succeeded child Jobs.
pub(crate) fn ready_pods(s: &JobSetStatus, parts: &[Part]) -> u32 {
    parts
        .iter()
        .map(|p| {
            let jobs = s
                .replicated_jobs_status
                .iter()
                .find(|r| r.name == p.name)
                .map_or(0, |r| {
                    (i64::from(r.ready.max(0)) + i64::from(r.succeeded.max(0)))
                        .min(i64::from(p.jobs)) as u32
                });
            jobs.saturating_mul(p.pods_per_job)
        })
        .fold(0u32, u32::saturating_add)
}

/// The manager's status given the copy's: the copy's own fields as they are, the manager's
/// terminal condition kept (a late, stale copy status), the dispatcher's conditions kept and
/// `PodsReady` brought up to date.
pub(crate) fn mirrored(
    local: &JobSetStatus,
    remote: &JobSetStatus,
    readiness: Readiness,
    now: SystemTime,
) -> JobSetStatus {
    let mut out = JobSetStatus {
        conditions: remote
            .conditions
            .iter()
            .filter(|c| !condition::OURS.contains(&c.type_.as_str()))
            .cloned()
            .collect(),
        ..remote.clone()
    };
    let kept_terminal = terminal(local).filter(|_| terminal(remote).is_none());
    if kept_terminal.is_some() {
        for c in &local.conditions {
            if c.status == "True"
                && ["Completed", "Failed"].contains(&c.type_.as_str())
                && !out.conditions.iter().any(|x| x.type_ == c.type_)
            {
                out.conditions.push(c.clone());
            }
        }
        out.terminal_state = local.terminal_state.clone();
    }
    let finished = terminal(remote).or(kept_terminal).is_some();
    for c in &local.conditions {
        if condition::OURS.contains(&c.type_.as_str()) && c.type_ != condition::PODS_READY {
            out.conditions.push(c.clone());
        }
    }
    out.conditions.push(pods_ready_condition(
        &local.conditions,
        readiness,
        finished,
        now,
    ));
    out
}

/// The final status of a JobSet whose outcome is known but whose copy is gone or cannot be
/// reached: its terminal condition and state, no active or Ready Jobs.
pub(crate) fn concluded(local: &JobSetStatus, result: JobResult, now: SystemTime) -> JobSetStatus {
    let mut out = local.clone();
    let (type_, reason, state) = match result {
        JobResult::Succeeded => ("Completed", "AllJobsCompleted", "Completed"),
        JobResult::Failed => ("Failed", "FailedJobs", "Failed"),
    };
    if !is_true(&out, type_) {
        out.conditions.retain(|c| c.type_ != type_);
        out.conditions.push(JobCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(format!(
                "the JobSet ended {} in its worker (recorded by the dispatcher)",
                state.to_lowercase()
            )),
            last_probe_time: None,
            last_transition_time: Some(Time(to_timestamp(now))),
        });
    }
    out.terminal_state = Some(state.into());
    for r in &mut out.replicated_jobs_status {
        r.active = 0;
        r.ready = 0;
    }
    out
}

/// A JobSet taken back from its worker runs again from nothing: only the dispatcher's
/// conditions (but `PodsReady`) stay.
pub(crate) fn taken_back(s: &JobSetStatus) -> JobSetStatus {
    JobSetStatus {
        conditions: s
            .conditions
            .iter()
            .filter(|c| condition::KEPT_ON_REQUEUE.contains(&c.type_.as_str()))
            .cloned()
            .collect(),
        ..Default::default()
    }
}

pub(crate) fn digest(s: &JobSetStatus) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(s).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// What the CRD's schema refuses in a status about to be written (the API server checks
/// nothing else for JobSets), in its words; `None` when it would be accepted.
pub(crate) fn violation(_old: &JobSetStatus, new: &JobSetStatus) -> Option<String> {
    let mut types = std::collections::BTreeSet::new();
    for (i, c) in new.conditions.iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        if !types.insert(c.type_.as_str()) {
            return Some(format!(
                "{at}: Duplicate value: map[string]interface {{}}{{\"type\":{:?}}}",
                c.type_
            ));
        }
        if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
            return Some(format!(
                "{at}.status: Unsupported value: {:?}: supported values: \"True\", \"False\", \"Unknown\"",
                c.status
            ));
        }
        match c.reason.as_deref() {
            None => return Some(format!("{at}.reason: Required value")),
            Some(r) if !reason_ok(r) => {
                return Some(format!(
                    "{at}.reason: Invalid value: {r:?}: should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"
                ))
            }
            Some(_) => {}
        }
        if c.message.is_none() {
            return Some(format!("{at}.message: Required value"));
        }
        if c.last_transition_time.is_none() {
            return Some(format!("{at}.lastTransitionTime: Required value"));
        }
        if c.message
            .as_ref()
            .is_some_and(|m| m.chars().count() > 32768)
        {
            return Some(format!(
                "{at}.message: Too long: may not be more than 32768 bytes"
            ));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, r) in new.replicated_jobs_status.iter().enumerate() {
        if !names.insert(r.name.as_str()) {
            return Some(format!(
                "status.replicatedJobsStatus[{i}]: Duplicate value: map[string]interface {{}}{{\"name\":{:?}}}",
                r.name
            ));
        }
    }
    None
}

/// The CRD's pattern for a condition's reason, `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`,
/// at most 1024 characters.
fn reason_ok(r: &str) -> bool {
    let b = r.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            b.len() <= 1024
                && f.is_ascii_alphabetic()
                && (b.len() == 1 || l.is_ascii_alphanumeric() || *l == b'_')
                && b.iter().all(inner)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatcher::kind::Status;
    use crate::dispatcher::mirror::Readiness;
    use serde_json::json;

    /// A response body captured from kube-apiserver with the real JobSet controller.
    fn captured(name: &str) -> Value {
        let path = format!(
            "{}/tests/fixtures/kube-api/jobset/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture");
        serde_json::from_str::<Value>(&text).expect("JSON")["response"]["body"].clone()
    }

    /// The gang size each pod template of a copy of JobSet `js` (named `workload`) is told.
    fn told_sizes(js: &Value, workload: (&str, &str)) -> Vec<String> {
        let mut spec = js["spec"].as_object().unwrap().clone();
        prepare_copy(&mut spec, workload)
            .into_iter()
            .map(|t| {
                let size = &t["metadata"]["annotations"][GANG_SIZE_ANNOTATION];
                size.as_str().unwrap_or("(none)").to_string()
            })
            .collect()
    }

    fn status_of(name: &str) -> JobSetStatus {
        serde_json::from_value(captured(name)["status"].clone()).expect("a JobSet status")
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_790_000_000 + secs)
    }

    /// Replicated Jobs with the same pods but for an anti-affinity that keeps one of them one
    /// to a node (its selector names the JobSet) are two groups, both in the gang and in the
    /// sizes the copy's templates are told.
    #[test]
    fn pods_kept_one_to_a_node_by_the_jobsets_name_are_a_group_of_their_own() {
        let mut js = captured("get_jobset_queued");
        let workers = js["spec"]["replicatedJobs"][1].clone();
        let mut apart = workers.clone();
        apart["name"] = "apart".into();
        apart["template"]["spec"]["template"]["spec"]["affinity"] = serde_json::json!({
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "trainer"}},
                "topologyKey": "kubernetes.io/hostname"
            }]}
        });
        js["spec"]["replicatedJobs"] = serde_json::json!([workers, apart]);
        let g = gang(&js);
        assert!(!g.shape.as_ref().unwrap().one_per_node);
        assert_eq!(g.extra.len(), 1);
        assert!(g.extra[0].shape.one_per_node);
        assert_eq!(told_sizes(&js, ("trainer", "research")), ["4", "4"]);
        // Under another name the selector matches none of its pods: one group of eight.
        assert_eq!(told_sizes(&js, ("other", "research")), ["8", "8"]);
    }

    #[test]
    fn the_captured_jobsets_gang_is_its_workers_and_its_driver_beside() {
        let g = gang(&captured("get_jobset_queued"));
        let parts: Vec<(&str, u32, u32)> = g
            .parts
            .iter()
            .map(|p| (p.name.as_str(), p.jobs, p.pods_per_job))
            .collect();
        assert_eq!(parts, [("driver", 1, 1), ("workers", 2, 2)]);
        let main = g.shape.expect("placeable");
        assert_eq!(main.node_request["nvidia.com/gpu"], 1000);
        assert_eq!(g.extra.len(), 1);
        assert_eq!(g.extra[0].pods, 1);
        assert_eq!(g.extra[0].shape.node_request["cpu"], 1000);
        assert!(!g.extra[0].shape.node_request.contains_key("nvidia.com/gpu"));
        // The copy's pods are told their own shape's gang.
        let js = captured("get_jobset_queued");
        assert_eq!(told_sizes(&js, ("trainer", "research")), ["1", "4"]);
    }

    #[test]
    fn the_example_jobset_is_a_gang_of_five_pods_of_two_shapes() {
        let path = format!("{}/examples/jobset.yaml", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).expect("examples/jobset.yaml");
        let obj: Value = serde_yaml::from_str(&text).expect("YAML");
        let g = gang(&obj);
        assert_eq!(g.parts.iter().map(Part::pods).sum::<u32>(), 5);
        assert_eq!(
            g.shape.expect("placeable").node_request["nvidia.com/gpu"],
            1000
        );
        assert_eq!(g.extra.len(), 1);
        assert_eq!(g.extra[0].pods, 1);
    }

    #[test]
    fn a_completed_copy_is_mirrored_whole_and_its_end_is_never_undone() {
        let local = Status::JobSet(JobSetStatus::default());
        let local = crate::dispatcher::status::admitted(&local, "east", at(0));
        let remote = Status::JobSet(status_of("get_jobset_completed"));
        let r = Readiness { ready: 5, gang: 5 };
        let mirrored = local.mirrored(&remote, r, at(10));
        assert_eq!(Status::violation(&local, &mirrored, false), None);
        assert_eq!(
            mirrored.terminal(),
            Some(crate::dispatcher::job::JobResult::Succeeded)
        );
        let Status::JobSet(m) = &mirrored else {
            panic!("a JobSet status")
        };
        assert_eq!(m.terminal_state.as_deref(), Some("Completed"));
        assert_eq!(m.restarts, Some(0), "fields as the controller wrote them");
        let types: Vec<&str> = m.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Completed", "Admitted", "PodsReady"]);
        // A stale copy status (still running) after the end does not undo it.
        let stale = Status::JobSet(status_of("get_jobset_running"));
        let again = mirrored.mirrored(&stale, Readiness { ready: 3, gang: 5 }, at(20));
        assert_eq!(
            again.terminal(),
            Some(crate::dispatcher::job::JobResult::Succeeded)
        );
    }

    #[test]
    fn a_failed_copy_reads_failed_and_a_concluded_status_is_valid() {
        let failed = Status::JobSet(status_of("get_jobset_failed"));
        assert_eq!(
            failed.terminal(),
            Some(crate::dispatcher::job::JobResult::Failed)
        );
        let local = Status::JobSet(status_of("get_jobset_running"));
        for result in [
            crate::dispatcher::job::JobResult::Succeeded,
            crate::dispatcher::job::JobResult::Failed,
        ] {
            let done = local.concluded(result, at(5));
            assert_eq!(done.terminal(), Some(result));
            assert_eq!(Status::violation(&local, &done, false), None);
        }
    }

    #[test]
    fn the_crds_rules_on_conditions_and_replicated_job_statuses_are_modelled() {
        let ok = status_of("get_jobset_completed");
        assert_eq!(violation(&ok, &ok), None);
        let mut bad = ok.clone();
        bad.conditions[0].reason = None;
        assert!(violation(&ok, &bad).is_some_and(|m| m.ends_with(".reason: Required value")));
        let mut bad = ok.clone();
        bad.conditions[0].reason = Some("not valid!".into());
        assert!(violation(&ok, &bad).is_some_and(|m| m.contains("should match")));
        let mut bad = ok.clone();
        bad.conditions[0].message = None;
        assert!(violation(&ok, &bad).is_some_and(|m| m.ends_with(".message: Required value")));
        let mut bad = ok.clone();
        bad.conditions.push(bad.conditions[0].clone());
        assert!(violation(&ok, &bad).is_some_and(|m| m.contains("Duplicate value")));
        let mut bad = ok.clone();
        bad.replicated_jobs_status
            .push(bad.replicated_jobs_status[0].clone());
        assert!(violation(&ok, &bad).is_some_and(|m| m.contains("Duplicate value")));
        // Every counter of a replicated Job's status is written, zeros too (the CRD requires
        // them all).
        let v = serde_json::to_value(&ok).unwrap();
        assert_eq!(
            v["replicatedJobsStatus"][0],
            serde_json::json!({"name": "workers", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0})
        );
    }

    /// A JobSet of one-pod replicated Jobs (name, pod template).
    fn jobset(name: &str, replicated: &[(&str, Value)]) -> Value {
        let list: Vec<Value> = replicated
            .iter()
            .map(|(n, template)| json!({"name": n, "template": {"spec": {"template": template}}}))
            .collect();
        json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {"replicatedJobs": list}})
    }

    #[test]
    fn jobsets_that_cannot_be_placed_share_an_admission_class_only_with_their_reason() {
        let pod = |cpu: &str| json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}});
        let a = gang(&jobset(
            "a",
            &[("driver", pod("lots")), ("workers", pod("1"))],
        ));
        let b = gang(&jobset(
            "b",
            &[("driver", pod("1")), ("workers", pod("lots"))],
        ));
        let (why_a, why_b) = (a.shape.unwrap_err(), b.shape.unwrap_err());
        assert!(
            why_a.starts_with("spec.replicatedJobs[0].template.spec.template: "),
            "{why_a}"
        );
        assert!(
            why_b.starts_with("spec.replicatedJobs[1].template.spec.template: "),
            "{why_b}"
        );
        // Gangs of 2 in one queue and namespace: one class but for the key, and the admission
        // pass tells the rest of a class its first Job's reason.
        assert_ne!(a.shape_key, b.shape_key);
        let empty = || json!({"metadata": {"name": "e", "namespace": "ml"}, "spec": {}});
        assert_eq!(
            gang(&empty()).shape_key,
            gang(&empty()).shape_key,
            "the same reason"
        );
        assert_ne!(gang(&empty()).shape_key, a.shape_key);
    }

    #[test]
    fn the_parts_of_a_gang_of_several_shapes_are_named_by_their_replicated_jobs() {
        let pod = |cpu: &str| json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}});
        let named = |names: [&str; 3]| {
            gang(&jobset(
                "trainer",
                &[
                    (names[0], pod("2")),
                    (names[1], pod("1")),
                    (names[2], pod("2")),
                ],
            ))
        };
        // Two replicated Jobs ask for the same pods: the main part (2 pods), named by both.
        let g = named(["a", "driver", "c"]);
        assert_eq!(g.main_jobs.as_deref(), Some("replicated Jobs a, c"));
        assert_eq!(g.extra.len(), 1);
        assert_eq!(&*g.extra[0].jobs, "replicated Job driver");
        // The names are in the admission class's key: a class's verdict names its parts.
        assert_ne!(named(["x", "driver", "c"]).shape_key, g.shape_key);
        assert_eq!(named(["a", "driver", "c"]).shape_key, g.shape_key);
        // A gang of one shape names no part, and its key is its template's, whatever its name.
        let one = |name: &str| gang(&jobset("trainer", &[(name, pod("2"))]));
        assert_eq!(one("a").main_jobs, None);
        assert_eq!(one("a").shape_key, one("b").shape_key);
    }
}
