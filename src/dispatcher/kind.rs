//! The kinds of workload the dispatcher runs, and what each must say for the rest of the
//! dispatcher (queues, quota, PodsReady, placement, requeue, loss, garbage collection) to be
//! written once for all of them:
//!
//! - where its objects live ([`Kind::resource`]) and what its own controller is called;
//! - its gang: the pods that must run at once, by pod shape ([`Kind::gang`]);
//! - how its worker copy differs from the manager's object ([`Kind::prepare_copy`]): the
//!   kind's own generated fields dropped, every pod template labelled;
//! - its status ([`Status`]): how the copy's is read, mirrored onto the manager's object under
//!   the API server's rules for that kind, how many of its pods are Ready, and when and how it
//!   finished.
//!
//! How to suspend one and mark it managed is the same for every kind here: `spec.suspend` and
//! `spec.managedBy`, as batch/v1 Job, JobSet and Kubeflow's and Ray's jobs all have them.
//!
//! Adding a kind is a file beside [`job`] and [`jobset`] with those answers, and one arm in
//! each `match` of this file (the compiler lists them).

pub(crate) mod job;
pub(crate) mod jobset;

use super::job::JobResult;
use super::mirror::Readiness;
use crate::placement::{PodShape, PodView};
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use kube::api::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

/// A kind of workload the dispatcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Kind {
    /// batch/v1 Job.
    #[default]
    Job,
    /// jobset.x-k8s.io/v1alpha2 JobSet.
    JobSet,
}

impl Kind {
    /// Every kind, in the order the dispatcher watches them.
    pub(crate) const ALL: [Kind; 2] = [Kind::Job, Kind::JobSet];

    /// The API group (empty for the core group).
    pub(crate) fn group(self) -> &'static str {
        match self {
            Kind::Job => "batch",
            Kind::JobSet => "jobset.x-k8s.io",
        }
    }

    pub(crate) fn version(self) -> &'static str {
        match self {
            Kind::Job => "v1",
            Kind::JobSet => "v1alpha2",
        }
    }

    /// The object's `kind`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::JobSet => "JobSet",
        }
    }

    /// The resource, as RBAC and URLs name it.
    pub(crate) fn plural(self) -> &'static str {
        match self {
            Kind::Job => "jobs",
            Kind::JobSet => "jobsets",
        }
    }

    /// `group/version`, as `apiVersion` gives it.
    pub(crate) fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.version())
    }

    /// The kind's objects, read and written as JSON so that fields this version does not know
    /// are carried over untouched.
    pub(crate) fn resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group(), self.version(), self.name()),
            self.plural(),
        )
    }

    /// The `spec.managedBy` value that means "the kind's own controller runs it".
    pub(crate) fn own_controller(self) -> &'static str {
        match self {
            Kind::Job => crate::wellknown::JOB_CONTROLLER,
            Kind::JobSet => jobset::CONTROLLER,
        }
    }

    /// The kind of an object from its `apiVersion` and `kind`.
    pub(crate) fn of(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == kind && k.api_version() == api_version)
    }

    /// The gang of the object's `spec`: the pods that must run at once (its shape says why
    /// not when they cannot be placed).
    pub(crate) fn gang(self, obj: &Value) -> Gang {
        match self {
            Kind::Job => job::gang(obj),
            Kind::JobSet => jobset::gang(obj),
        }
    }

    /// The kind's changes to the spec of a worker copy of `workload` (name, namespace), after
    /// the changes common to every kind, and the pod templates of the copy, for the dispatcher
    /// to label and steer.
    pub(crate) fn prepare_copy<'s>(
        self,
        spec: &'s mut Map<String, Value>,
        workload: (&str, &str),
    ) -> Vec<&'s mut Map<String, Value>> {
        match self {
            Kind::Job => job::prepare_copy(spec),
            Kind::JobSet => jobset::prepare_copy(spec, workload),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The pods of a workload that must run at once, made of parts (a Job is one part; a
/// JobSet's replicated Jobs are one each): the main pod shape (as placement sees it), and the
/// pods of other shapes, if any.
#[derive(Debug, Clone)]
pub(crate) struct Gang {
    /// The shape of the main part (the most pods); why none when the pods cannot be placed.
    pub(crate) shape: Result<Arc<PodShape>, String>,
    /// Gangs with the same key have the same pod templates (as far as placement sees them).
    pub(crate) shape_key: u64,
    pub(crate) parts: Vec<Part>,
    /// The pods that ask for another shape than the main part's, one entry per shape.
    pub(crate) extra: Vec<Extra>,
    /// Of a gang of several shapes, the main part's replicated Jobs as a person names them
    /// (see [`Extra::jobs`]); `None` for a gang of one shape.
    pub(crate) main_jobs: Option<Arc<str>>,
}

/// Pods of a gang that ask for another shape than its main part's.
#[derive(Debug, Clone)]
pub(crate) struct Extra {
    pub(crate) shape: Arc<PodShape>,
    pub(crate) pods: u32,
    /// Its replicated Jobs, as a person names them ("replicated Job driver"): in messages
    /// about the part.
    pub(crate) jobs: Arc<str>,
}

/// A part of a gang: `jobs` Jobs of `pods_per_job` pods each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    /// The replicated Job's name (empty for a batch/v1 Job).
    pub(crate) name: String,
    pub(crate) jobs: u32,
    pub(crate) pods_per_job: u32,
}

impl Part {
    pub(crate) fn pods(&self) -> u32 {
        self.jobs.saturating_mul(self.pods_per_job)
    }
}

impl Gang {
    /// The gang of one batch/v1 Job's pods.
    pub(crate) fn single(shape: Result<Arc<PodShape>, String>, shape_key: u64, pods: u32) -> Self {
        Gang {
            shape,
            shape_key,
            parts: vec![Part {
                name: String::new(),
                jobs: 1,
                pods_per_job: pods,
            }],
            extra: Vec::new(),
            main_jobs: None,
        }
    }
}

impl Kind {
    /// The labels the kind's controller gives every pod of workload `name`, beside its
    /// template's: those a pod's affinity to its own kind may select. A Job's pods carry its
    /// name (and its uid, which differs in each worker); a JobSet's, the JobSet's name (and
    /// labels that differ between its Jobs, left out: they are not every pod's).
    pub(crate) fn pod_labels(self, name: &str) -> Vec<(&'static str, String)> {
        match self {
            Kind::Job => vec![
                ("batch.kubernetes.io/job-name", name.to_string()),
                ("job-name", name.to_string()),
            ],
            Kind::JobSet => vec![("jobset.sigs.k8s.io/jobset-name", name.to_string())],
        }
    }
}

/// A pod template (`{metadata, spec}`) of workload `name` of kind `kind`, analysed as
/// placement sees it, and its key.
pub(crate) fn template_shape(
    template: &Value,
    (kind, name, namespace): (Kind, &str, &str),
    field: &str,
) -> (Result<Arc<PodShape>, String>, u64) {
    let mut labels = template["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in kind.pod_labels(name) {
        labels.insert(k.to_string(), v.into());
    }
    let shape = serde_json::from_value::<PodView>(json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": template["metadata"]["annotations"],
        },
        "spec": template["spec"],
    }))
    .map_err(|e| format!("{field}: {e}"))
    .and_then(|view| PodShape::from_view(&view).map_err(|e| format!("{field}: {e}")))
    .and_then(|shape| {
        if shape.containers.is_empty() {
            Err(format!("{field}: no containers"))
        } else {
            Ok(Arc::new(shape))
        }
    });
    let key = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        template["spec"].to_string().hash(&mut h);
        template["metadata"]["annotations"].to_string().hash(&mut h);
        // The same spec keeps its pods apart (or spreads them, or keeps them together) for one
        // Job and not another (its selector matches one's labels): the one place labels reach
        // placement.
        if let Ok(s) = &shape {
            if s.one_per_node {
                "one per node".hash(&mut h);
            }
            if let Some(spread) = &s.spread {
                spread.hash(&mut h);
            }
            if !s.together.is_empty() {
                s.together.hash(&mut h);
            }
        }
        h.finish()
    };
    (shape, key)
}

/// A count from a spec field, clamped to `u32`.
pub(crate) fn count(v: &Value) -> Option<u32> {
    v.as_i64().map(|n| n.clamp(0, i64::from(u32::MAX)) as u32)
}

/// A workload's status, as its kind's API defines it. The dispatcher's own conditions
/// (`Admitted`, `PodsReady`, `Requeued`, `Deactivated`) live among its conditions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    Job(JobStatus),
    JobSet(jobset::JobSetStatus),
}

impl Default for Status {
    fn default() -> Self {
        Status::Job(JobStatus::default())
    }
}

impl From<JobStatus> for Status {
    fn from(s: JobStatus) -> Self {
        Status::Job(s)
    }
}

impl Status {
    /// An empty status of `kind`.
    pub(crate) fn empty(kind: Kind) -> Self {
        match kind {
            Kind::Job => Status::Job(JobStatus::default()),
            Kind::JobSet => Status::JobSet(Default::default()),
        }
    }

    /// The object's `status` (absent or null: empty).
    pub(crate) fn parse(kind: Kind, status: Option<&Value>) -> Result<Self, String> {
        let Some(v) = status.filter(|v| !v.is_null()) else {
            return Ok(Status::empty(kind));
        };
        // Read from the borrowed object: no copy of it per watch event.
        let parsed = match kind {
            Kind::Job => JobStatus::deserialize(v).map(Status::Job),
            Kind::JobSet => jobset::JobSetStatus::deserialize(v).map(Status::JobSet),
        };
        parsed.map_err(|e| format!("status: {e}"))
    }

    /// As the API server shows it.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Status::Job(s) => serde_json::to_value(s),
            Status::JobSet(s) => serde_json::to_value(s),
        }
        .unwrap_or(Value::Null)
    }

    /// The batch/v1 Job status, if this is one.
    pub(crate) fn as_job(&self) -> Option<&JobStatus> {
        match self {
            Status::Job(s) => Some(s),
            Status::JobSet(_) => None,
        }
    }

    /// The batch/v1 Job status this is (tests only: they know their kind).
    #[cfg(test)]
    pub(crate) fn job(&self) -> &JobStatus {
        self.as_job().expect("a batch/v1 Job status")
    }

    #[cfg(test)]
    pub(crate) fn job_mut(&mut self) -> &mut JobStatus {
        match self {
            Status::Job(s) => s,
            Status::JobSet(_) => panic!("a JobSet status, not a batch/v1 Job's"),
        }
    }

    pub(crate) fn conditions(&self) -> &[JobCondition] {
        match self {
            Status::Job(s) => s.conditions.as_deref().unwrap_or_default(),
            Status::JobSet(s) => &s.conditions,
        }
    }

    pub(crate) fn conditions_mut(&mut self) -> &mut Vec<JobCondition> {
        match self {
            Status::Job(s) => s.conditions.get_or_insert_with(Vec::new),
            Status::JobSet(s) => &mut s.conditions,
        }
    }

    /// When its controller last resumed it (a copy a worker's Kueue admitted): its
    /// `Suspended` condition turned False (batch/v1 Job and JobSet both write one), or, for a
    /// Job that has none, its `startTime`.
    pub(crate) fn resumed_at(&self) -> Option<SystemTime> {
        let condition = self
            .conditions()
            .iter()
            .find(|c| c.type_ == "Suspended" && c.status == "False")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| SystemTime::from(t.0));
        condition.or_else(|| {
            self.as_job()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| SystemTime::from(t.0))
        })
    }

    /// Since when it has been suspended again (its `Suspended` condition True), if it says.
    pub(crate) fn suspended_since(&self) -> Option<SystemTime> {
        self.conditions()
            .iter()
            .find(|c| c.type_ == "Suspended" && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| SystemTime::from(t.0))
    }

    /// How the workload ended, if it did.
    pub(crate) fn terminal(&self) -> Option<JobResult> {
        match self {
            Status::Job(s) => super::job::terminal(s),
            Status::JobSet(s) => jobset::terminal(s),
        }
    }

    /// How it will end, when its controller decided before its pods are gone.
    pub(crate) fn decided(&self) -> Option<JobResult> {
        match self {
            Status::Job(s) => super::mirror::decided(s),
            Status::JobSet(_) => None,
        }
    }

    /// The pods of `parts` that are Ready or done, as this (a worker copy's) status tells.
    pub(crate) fn ready_pods(&self, parts: &[Part]) -> u32 {
        match self {
            Status::Job(s) => {
                let ready = s.ready.unwrap_or(0).max(0) as u32;
                let succeeded = s.succeeded.unwrap_or(0).max(0) as u32;
                ready.saturating_add(succeeded)
            }
            Status::JobSet(s) => jobset::ready_pods(s, parts),
        }
    }

    /// The status the manager's object should have (`self`), given its worker copy's.
    pub(crate) fn mirrored(
        &self,
        remote: &Status,
        readiness: Readiness,
        now: SystemTime,
    ) -> Status {
        match (self, remote) {
            (Status::Job(local), Status::Job(remote)) => {
                Status::Job(super::mirror::mirrored(local, remote, readiness, now))
            }
            (Status::JobSet(local), Status::JobSet(remote)) => {
                Status::JobSet(jobset::mirrored(local, remote, readiness, now))
            }
            _ => self.clone(),
        }
    }

    /// The final status of a workload whose outcome is known but whose copy cannot say it.
    pub(crate) fn concluded(&self, result: JobResult, now: SystemTime) -> Status {
        match self {
            Status::Job(s) => Status::Job(super::mirror::concluded(s, result, now)),
            Status::JobSet(s) => Status::JobSet(jobset::concluded(s, result, now)),
        }
    }

    /// What stays of the status when the workload is taken back from its worker: the
    /// counters and conditions its API does not let go back, and the dispatcher's own
    /// conditions but `PodsReady`.
    pub(crate) fn taken_back(&self) -> Status {
        match self {
            Status::Job(s) => Status::Job(super::mirror::taken_back(s)),
            Status::JobSet(s) => Status::JobSet(jobset::taken_back(s)),
        }
    }

    /// A digest, to recognise a write the API server already refused.
    pub(crate) fn digest(&self) -> u64 {
        match self {
            Status::Job(s) => super::mirror::digest(s),
            Status::JobSet(s) => jobset::digest(s),
        }
    }

    /// The reason the API server would refuse writing `new` over `old`, or `None`.
    /// `suspended`: the object's `spec.suspend` as written.
    pub(crate) fn violation(old: &Status, new: &Status, suspended: bool) -> Option<String> {
        match (old, new) {
            (Status::Job(old), Status::Job(new)) => super::mirror::violation(old, new, suspended),
            (Status::JobSet(old), Status::JobSet(new)) => jobset::violation(old, new),
            _ => Some("status: a status of another kind".into()),
        }
    }
}
