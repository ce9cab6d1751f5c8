//! A manager workload (a batch/v1 Job, a JobSet: see [`super::kind`]) as the dispatcher sees
//! it, and the order and classes admission takes them in. "Job" below means any of them.

use super::kind::{Extra, Kind, Part, Status};
use crate::placement::PodShape;
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A Job's kind, namespace and name: the same in the manager and in its worker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct JobKey {
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl JobKey {
    /// A batch/v1 Job's key (tests: the rest of the crate says which kind).
    #[cfg(test)]
    pub(crate) fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self::of(Kind::Job, namespace, name)
    }

    pub(crate) fn of(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// `namespace/name` for a batch/v1 Job (as people and `kubectl` name it), `JobSet
/// namespace/name` for other kinds.
impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Job => write!(f, "{}/{}", self.namespace, self.name),
            kind => write!(f, "{kind} {}/{}", self.namespace, self.name),
        }
    }
}

/// How a Job ended in its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobResult {
    Succeeded,
    Failed,
}

impl JobResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobResult::Succeeded => "Succeeded",
            JobResult::Failed => "Failed",
        }
    }
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "Succeeded" => Some(Self::Succeeded),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// A Job of the manager cluster that carries a queue label, reduced to what dispatch needs.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) key: JobKey,
    pub(crate) uid: String,
    /// For the claim's optimistic concurrency (empty in `simulate`).
    pub(crate) resource_version: String,
    pub(crate) queue: String,
    /// The pod template's PriorityClass value.
    pub(crate) priority: i32,
    pub(crate) created: SystemTime,
    /// The parts of its gang (a batch/v1 Job is one part; a JobSet's replicated Jobs).
    pub(crate) parts: Vec<Part>,
    /// The gang's (main) pod template, analysed; why not when it cannot be.
    pub(crate) pod: Result<Arc<PodShape>, String>,
    /// The gang's pods of other shapes than [`Job::pod`] (a JobSet's replicated Jobs that ask
    /// for other pods); usually none.
    pub(crate) extra: Arc<[Extra]>,
    /// Of a gang of several pod shapes, its main part's replicated Jobs, for messages.
    pub(crate) main_jobs: Option<Arc<str>>,
    /// Jobs with the same key have the same pod template (as far as placement sees it).
    pub(crate) shape_key: u64,
    /// The namespace's labels, for the queue's namespaceSelector (`None`: unknown, treated as
    /// carrying only `kubernetes.io/metadata.name`).
    pub(crate) namespace_labels: Option<Arc<BTreeMap<String, String>>>,
    pub(crate) suspended: bool,
    /// Being deleted (or gone): its copies go too.
    pub(crate) deleting: bool,
    /// Dispatch state, from the annotations.
    pub(crate) cluster: Option<String>,
    /// Workers the Job was offered to at once (`placement.fanout` > 1) while none has won yet.
    pub(crate) offers: Vec<String>,
    pub(crate) admitted_at: Option<SystemTime>,
    pub(crate) requeues: u32,
    pub(crate) requeue_after: Option<SystemTime>,
    pub(crate) avoid: Option<String>,
    /// Workers that refused the Job's copy, and when each may be tried again.
    pub(crate) refusals: BTreeMap<String, WorkerRefusal>,
    pub(crate) deactivated: Option<String>,
    pub(crate) result: Option<JobResult>,
    /// The manager Job's status (mirrored from the worker, plus the dispatcher's conditions).
    pub(crate) status: Status,
}

/// The iterator of [`Job::total_requests`]: one shape's request scaled by the gang's pods,
/// or the sum over several shapes.
pub(crate) enum TotalRequests<'j> {
    One {
        request: std::collections::btree_map::Iter<'j, String, i64>,
        pods: i64,
    },
    Summed(std::collections::btree_map::IntoIter<&'j str, i64>),
}

impl<'j> Iterator for TotalRequests<'j> {
    type Item = (&'j str, i64);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            TotalRequests::One { request, pods } => request
                .next()
                .map(|(k, v)| (k.as_str(), v.saturating_mul(*pods))),
            TotalRequests::Summed(sum) => sum.next(),
        }
    }
}

/// A worker refused the Job's copy (403, 422, an admission webhook, a missing namespace): not
/// the Job's fault, so not a requeue, but that worker is not asked again before `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerRefusal {
    /// Refusals in a row by this worker (the back-off doubles with each).
    pub(crate) count: u32,
    pub(crate) retry_at: SystemTime,
    /// What the worker said.
    pub(crate) message: String,
}

impl Job {
    pub(crate) fn kind(&self) -> Kind {
        self.key.kind
    }

    /// The pods that must run at once: every part's.
    pub(crate) fn gang(&self) -> u32 {
        self.parts
            .iter()
            .fold(0u32, |sum, p| sum.saturating_add(p.pods()))
    }

    /// Finished as far as the dispatcher is concerned: a result recorded, or a terminal
    /// condition in the manager Job's status.
    pub(crate) fn finished(&self) -> bool {
        self.result.is_some() || self.status.terminal().is_some()
    }

    /// Waiting to be admitted.
    pub(crate) fn is_pending(&self) -> bool {
        self.cluster.is_none()
            && self.offers.is_empty()
            && !self.deleting
            && !self.finished()
            && self.deactivated.is_none()
            && !self.user_suspended()
    }

    /// Admitted and holding quota: claimed for a worker and not finished.
    pub(crate) fn holds_quota(&self) -> bool {
        (self.cluster.is_some() || !self.offers.is_empty()) && !self.finished() && !self.deleting
    }

    /// The workers whose copies the Job keeps: its worker, or the ones it is offered to.
    pub(crate) fn kept_clusters(&self) -> &[String] {
        if self.deleting || self.deactivated.is_some() {
            return &[];
        }
        match &self.cluster {
            Some(c) => std::slice::from_ref(c),
            None => &self.offers,
        }
    }

    /// Unsuspended by the dispatcher once and suspended again by someone else.
    pub(crate) fn user_suspended(&self) -> bool {
        self.suspended && self.admitted_at.is_some()
    }

    /// The dispatcher's condition of this type in the Job's status.
    pub(crate) fn condition(&self, type_: &str) -> Option<&JobCondition> {
        self.status.conditions().iter().find(|c| c.type_ == type_)
    }

    /// Whether the `PodsReady` condition is True, and since when it has had its status.
    pub(crate) fn pods_ready(&self) -> Option<(bool, Option<SystemTime>)> {
        self.condition(super::condition::PODS_READY).map(|c| {
            (
                c.status == "True",
                c.last_transition_time
                    .as_ref()
                    .map(|t| to_system_time(&t.0)),
            )
        })
    }

    /// The refusal that keeps the Job away from `cluster` at `now`, if any.
    pub(crate) fn refused_by(&self, cluster: &str, now: SystemTime) -> Option<&WorkerRefusal> {
        self.refusals.get(cluster).filter(|r| r.retry_at > now)
    }

    /// In requeue back-off at `now` (not admitted before [`Job::requeue_after`]).
    pub(crate) fn backing_off(&self, now: SystemTime) -> bool {
        self.requeue_after.is_some_and(|t| t > now)
    }

    /// When the Job started waiting: its creation, or the end of its last back-off.
    pub(crate) fn waiting_since(&self) -> SystemTime {
        self.requeue_after.unwrap_or(self.created).max(self.created)
    }

    /// When the Job starves in a queue whose `starvationAfter` is `after`: once it has waited
    /// that long (`None`: never, past the end of time).
    pub(crate) fn starves_at(&self, after: Duration) -> Option<SystemTime> {
        self.waiting_since().checked_add(after)
    }

    /// The pods of the gang's main shape ([`Job::pod`]).
    pub(crate) fn main_pods(&self) -> u32 {
        self.extra
            .iter()
            .fold(self.gang(), |n, e| n.saturating_sub(e.pods))
    }

    /// The total request of the gang, per resource name: pods × the per-pod request.
    pub(crate) fn total_request(&self) -> BTreeMap<String, i64> {
        self.total_requests()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// [`Job::total_request`] without building a map, in resource name order.
    /// (A gang of several shapes sums them in a map first.)
    pub(crate) fn total_requests(&self) -> TotalRequests<'_> {
        if self.extra.is_empty() {
            if let Ok(main) = &self.pod {
                return TotalRequests::One {
                    request: main.node_request.iter(),
                    pods: i64::from(self.gang()),
                };
            }
        }
        let mut sum = BTreeMap::new();
        let main = self.pod.iter().map(|s| (&**s, self.main_pods()));
        let others = self.extra.iter().map(|e| (&*e.shape, e.pods));
        for (shape, pods) in main.chain(others) {
            for (k, v) in &shape.node_request {
                let total: &mut i64 = sum.entry(k.as_str()).or_default();
                *total = total.saturating_add(v.saturating_mul(i64::from(pods)));
            }
        }
        TotalRequests::Summed(sum.into_iter())
    }

    /// Where the Job stands in admission order.
    pub(crate) fn rank(&self) -> Rank {
        Rank {
            neg_priority: -i64::from(self.priority),
            created: self.created,
            key: self.key.clone(),
        }
    }

    /// The Jobs it is interchangeable with for admission.
    pub(crate) fn class(&self) -> ClassKey {
        ClassKey {
            queue: self.queue.as_str().into(),
            namespace: self.key.namespace.as_str().into(),
            shape: self.shape_key,
            gang: self.gang(),
        }
    }
}

/// Pending Jobs that are interchangeable for admission: same queue, namespace, pod shape and
/// gang size. When the first of a class cannot be admitted, none of the others can.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ClassKey {
    /// Shared: a class's key is copied into every memo, misfit and wait a pass records.
    pub(crate) queue: Arc<str>,
    pub(crate) namespace: Arc<str>,
    pub(crate) shape: u64,
    pub(crate) gang: u32,
}

/// Admission order: higher priority first, then older, then by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    pub(crate) neg_priority: i64,
    pub(crate) created: SystemTime,
    pub(crate) key: JobKey,
}

/// `Complete` or `Failed` True in a batch/v1 Job status.
pub(crate) fn terminal(status: &JobStatus) -> Option<JobResult> {
    for c in status.conditions.iter().flatten() {
        if c.status == "True" {
            match c.type_.as_str() {
                "Complete" => return Some(JobResult::Succeeded),
                "Failed" => return Some(JobResult::Failed),
                _ => {}
            }
        }
    }
    None
}

/// RFC 3339 in UTC, whole seconds: how annotations and messages give times.
pub fn rfc3339(t: SystemTime) -> String {
    super::mirror::to_timestamp(t).to_string()
}

/// `t` in RFC 3339 to the millisecond, for the times only Switchyard reads back: a deadline
/// counted from one read back (the PodsReady timeout from `admitted-at`, after a restart or a
/// watch event) is then not up to a second early, as it would be from [`rfc3339`]'s seconds.
pub(crate) fn rfc3339_millis(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Reads [`rfc3339`] (and any RFC 3339 time).
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

pub(crate) fn to_system_time(t: &k8s_openapi::jiff::Timestamp) -> SystemTime {
    SystemTime::from(*t)
}
