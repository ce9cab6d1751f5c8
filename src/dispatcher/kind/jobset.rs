//! jobset.x-k8s.io/v1alpha2 JobSet: several replicated Jobs that start, run and fail as one.
//!
//! - **Gang**: every pod of every replicated Job (`replicas` × the Job's pods at once), placed
//!   all-or-nothing in one worker. The placement engine places gangs of one pod shape: a
//!   JobSet whose replicated Jobs ask for different pods (as placement sees them: requests,
//!   QoS, node selection, tolerations) is not placed, and says so.
//! - **Copy**: the JobSet itself; the worker's JobSet controller makes its Jobs, Service and
//!   pods. Each pod template carries `switchyard.dev/gang-size` (the whole gang), so the
//!   worker's NUMA-aware scheduler places the gang as the dispatcher did.
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
use super::{count, template_shape, Gang, Part};
use crate::placement::{PodShape, GANG_SIZE_ANNOTATION};
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
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

fn replicated(spec: &Value) -> Vec<Replicated<'_>> {
    let Some(list) = spec["replicatedJobs"].as_array() else {
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

/// Every pod of every replicated Job, which must all ask for the same pods.
pub(crate) fn gang(obj: &Value) -> Gang {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let replicated = replicated(&obj["spec"]);
    let parts: Vec<Part> = replicated.iter().map(|r| r.part.clone()).collect();
    let mut first: Option<(&str, std::sync::Arc<PodShape>, u64)> = None;
    let mut problem = None;
    for (i, r) in replicated.iter().enumerate() {
        if r.part.pods() == 0 {
            continue;
        }
        let field = format!("spec.replicatedJobs[{i}].template.spec.template");
        let (shape, key) = template_shape(r.template, name, namespace, &field);
        let shape = match shape {
            Ok(s) => s,
            Err(e) => {
                problem = Some(e);
                break;
            }
        };
        match &first {
            None => first = Some((&r.part.name, shape, key)),
            Some((other, s, _)) if !same_for_placement(s, &shape) => {
                problem = Some(format!(
                    "replicated Jobs {other:?} and {:?} ask for different pods; Switchyard \
                     places a JobSet whose replicated Jobs all ask for the same pods (requests, \
                     QoS, node selection, tolerations)",
                    r.part.name
                ));
                break;
            }
            Some(_) => {}
        }
    }
    let (shape, shape_key) = match (problem, first) {
        (Some(e), _) => (Err(e), 0),
        (None, Some((_, shape, key))) => (Ok(shape), key),
        (None, None) => (Err("spec.replicatedJobs: no pods to run".to_string()), 0),
    };
    Gang {
        shape,
        shape_key,
        parts,
    }
}

/// Whether two pods are the same to the placement engine (names and commands aside).
fn same_for_placement(a: &PodShape, b: &PodShape) -> bool {
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
        && a.annotations == b.annotations
        && containers(a) == containers(b)
}

/// The pod templates of every replicated Job, each told the gang's size.
pub(crate) fn prepare_copy(spec: &mut Map<String, Value>) -> Vec<&mut Map<String, Value>> {
    let size = replicated(&Value::Object(spec.clone()))
        .iter()
        .fold(0u32, |sum, r| sum.saturating_add(r.part.pods()));
    let Some(Value::Array(list)) = spec.get_mut("replicatedJobs") else {
        return Vec::new();
    };
    let mut templates = Vec::new();
    for rj in list.iter_mut().filter_map(Value::as_object_mut) {
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
            .filter(|c| {
                condition::OURS.contains(&c.type_.as_str()) && c.type_ != condition::PODS_READY
            })
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
