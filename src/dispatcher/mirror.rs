//! A batch/v1 Job's status, mirrored from its worker copy as it changes (other kinds' rules
//! are in `super::kind`), and the `PodsReady` condition every kind shares.
//!
//! The API server validates Job status even for Jobs managed by someone else, and a refused
//! write must be reported, not retried. The rules observed on Kubernetes 1.36 (and in its
//! `pkg/registry/batch/job` status strategy for Jobs with `spec.managedBy`):
//! - `ready` ≤ `active`; a finished Job has `active` 0, a `startTime` and no uncounted pods;
//! - `Complete=True` needs `SuccessCriteriaMet=True` and a `completionTime` (≥ `startTime`),
//!   and `completionTime` is refused without `Complete=True`; `Failed=True` needs
//!   `FailureTarget=True`; Complete and Failed never go together;
//! - `completionTime` never changes once set; `startTime` never changes once set while the
//!   Job is unsuspended;
//! - `succeeded` and `failed` never decrease; `Complete`, `Failed` and `FailureTarget` True
//!   are never removed, nor is `SuccessCriteriaMet` True; `SuccessCriteriaMet` never goes
//!   with `FailureTarget` or `Failed`, nor `Complete` with `FailureTarget`; a finished Job has
//!   no terminating or uncounted pods.
//!
//! `SuccessCriteriaMet` and `FailureTarget` are the worker's decision of how the Job ends,
//! taken before its pods are gone: a Job whose status carries one is never requeued (its
//! status could not be made to run again), it ends that way ([`concluded`]).
//!
//! Workers older than 1.31 finish Jobs without `SuccessCriteriaMet` / `FailureTarget`: those
//! are added. A Job requeued and run again restarts its counters in the new worker; the
//! manager's keep the larger value, since they may not go down.

use super::condition;
use super::job::{terminal, JobResult};
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hash::{Hash, Hasher};
use std::time::SystemTime;

/// Whether the gang is all Ready (or done), for the `PodsReady` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readiness {
    pub(crate) ready: u32,
    pub(crate) gang: u32,
}

impl Readiness {
    pub(crate) fn all(self) -> bool {
        self.ready >= self.gang
    }
}

/// The status the manager Job should have, given its worker copy's.
pub(crate) fn mirrored(
    local: &JobStatus,
    remote: &JobStatus,
    readiness: Readiness,
    now: SystemTime,
) -> JobStatus {
    let finished = terminal(remote);
    let mut out = JobStatus {
        active: remote.active.filter(|_| finished.is_none()),
        terminating: remote.terminating,
        succeeded: max_opt(local.succeeded, remote.succeeded),
        failed: max_opt(local.failed, remote.failed),
        completed_indexes: remote.completed_indexes.clone(),
        failed_indexes: remote.failed_indexes.clone(),
        uncounted_terminated_pods: if finished.is_some() {
            None
        } else {
            remote.uncounted_terminated_pods.clone()
        },
        ..Default::default()
    };
    out.ready = match (remote.ready, out.active) {
        (Some(r), Some(a)) => Some(r.min(a)),
        (Some(_), None) => Some(0),
        (None, _) => None,
    };
    // Immutable once set while the Job runs: the manager's own wins.
    out.start_time = local
        .start_time
        .clone()
        .or_else(|| remote.start_time.clone());

    let mut conditions: Vec<JobCondition> = remote
        .conditions
        .iter()
        .flatten()
        .filter(|c| !condition::OURS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    match finished {
        Some(JobResult::Succeeded) => {
            require(&mut conditions, "SuccessCriteriaMet", "Complete");
            conditions.retain(|c| {
                !(c.type_ == "Failed" || c.type_ == "FailureTarget") || c.status != "True"
            });
            let completion = local
                .completion_time
                .clone()
                .or_else(|| remote.completion_time.clone())
                .or_else(|| condition_time(&conditions, "Complete"))
                .unwrap_or_else(|| Time(to_timestamp(now)));
            let start = out.start_time.clone().unwrap_or_else(|| completion.clone());
            // completionTime ≥ startTime (the manager's startTime may be the later one).
            let completion = if completion.0 < start.0 {
                start.clone()
            } else {
                completion
            };
            out.start_time = Some(start);
            out.completion_time = Some(completion);
        }
        Some(JobResult::Failed) => {
            require(&mut conditions, "FailureTarget", "Failed");
            if out.start_time.is_none() {
                out.start_time =
                    condition_time(&conditions, "Failed").or_else(|| Some(Time(to_timestamp(now))));
            }
        }
        None => {}
    }
    // The manager's terminal conditions are never dropped (a late, stale copy status).
    for c in local.conditions.iter().flatten() {
        if c.status == "True"
            && ["Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"]
                .contains(&c.type_.as_str())
            && !conditions.iter().any(|x| x.type_ == c.type_)
        {
            conditions.push(c.clone());
        }
    }
    // The dispatcher's own conditions, PodsReady brought up to date.
    for c in local.conditions.iter().flatten() {
        if condition::OURS.contains(&c.type_.as_str()) && c.type_ != condition::PODS_READY {
            conditions.push(c.clone());
        }
    }
    conditions.push(pods_ready_condition(
        local.conditions.as_deref().unwrap_or_default(),
        readiness,
        finished.is_some(),
        now,
    ));
    out.conditions = Some(conditions);
    out
}

/// The `PodsReady` condition for this readiness, keeping the transition time when its status
/// does not change. Its reason tells "never Ready since admission" (`WaitingForPods`) from
/// "was Ready, lost it" (`PodsReadyLost`): the recovery timeout counts only the latter.
pub(crate) fn pods_ready_condition(
    local: &[JobCondition],
    r: Readiness,
    finished: bool,
    now: SystemTime,
) -> JobCondition {
    let old = local.iter().find(|c| c.type_ == condition::PODS_READY);
    let ready = r.all() || finished;
    let (reason, message) = if ready {
        (
            super::reason::PODS_READY,
            format!(
                "{} of {} pods Ready or done",
                r.ready.max(r.gang.min(r.ready)),
                r.gang
            ),
        )
    } else {
        let was_ready =
            old.is_some_and(|c| c.status == "True" || c.reason.as_deref() == Some(LOST));
        (
            if was_ready { LOST } else { WAITING },
            format!("{} of {} pods Ready", r.ready, r.gang),
        )
    };
    let status = if ready { "True" } else { "False" };
    let transition = match old {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Some(Time(to_timestamp(now))),
    };
    JobCondition {
        type_: condition::PODS_READY.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_probe_time: None,
        last_transition_time: transition,
    }
}

/// `PodsReady` False since admission: never Ready yet.
pub(crate) const WAITING: &str = "WaitingForPods";
/// `PodsReady` False after having been True.
pub(crate) const LOST: &str = "PodsReadyLost";

/// How the Job ends, when its worker already decided (`SuccessCriteriaMet` or `FailureTarget`
/// True) but it has not finished yet.
pub(crate) fn decided(status: &JobStatus) -> Option<JobResult> {
    let is = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if is("SuccessCriteriaMet") {
        Some(JobResult::Succeeded)
    } else if is("FailureTarget") {
        Some(JobResult::Failed)
    } else {
        None
    }
}

/// The final status of a Job whose outcome is known but whose copy cannot say it (gone, or in
/// a worker that cannot be reached): `Complete` after `SuccessCriteriaMet`, `Failed` after
/// `FailureTarget` (added when missing), no pods left, the times the API server requires.
pub(crate) fn concluded(local: &JobStatus, result: JobResult, now: SystemTime) -> JobStatus {
    let mut out = local.clone();
    out.active = None;
    out.ready = local.ready.map(|_| 0);
    out.terminating = None;
    out.uncounted_terminated_pods = None;
    let start = local
        .start_time
        .clone()
        .unwrap_or_else(|| Time(to_timestamp(now)));
    let mut conditions: Vec<JobCondition> = local.conditions.clone().unwrap_or_default();
    let (needed, terminal) = match result {
        JobResult::Succeeded => ("SuccessCriteriaMet", "Complete"),
        JobResult::Failed => ("FailureTarget", "Failed"),
    };
    if !conditions
        .iter()
        .any(|c| c.type_ == terminal && c.status == "True")
    {
        let basis = conditions
            .iter()
            .find(|c| c.type_ == needed && c.status == "True")
            .cloned();
        let at = Time(to_timestamp(now));
        conditions.retain(|c| c.type_ != terminal);
        conditions.push(JobCondition {
            type_: terminal.into(),
            status: "True".into(),
            reason: basis.as_ref().and_then(|c| c.reason.clone()),
            message: basis.as_ref().and_then(|c| c.message.clone()),
            last_probe_time: Some(at.clone()),
            last_transition_time: Some(at),
        });
        require(&mut conditions, needed, terminal);
    }
    if result == JobResult::Succeeded {
        let completion = local
            .completion_time
            .clone()
            .unwrap_or_else(|| Time(to_timestamp(now)));
        out.completion_time = Some(if completion.0 < start.0 {
            start.clone()
        } else {
            completion
        });
    }
    out.start_time = Some(start);
    out.conditions = Some(conditions);
    out
}

/// What stays of a Job's status when it is taken back from its worker: no pods any more. The
/// counters that may not decrease keep their values; `startTime` may be cleared because the
/// Job is suspended first. `SuccessCriteriaMet` and `FailureTarget` True stay (the API server
/// refuses to drop them), though a Job that has one is concluded, never requeued. The
/// dispatcher's own conditions but `PodsReady` stay.
pub(crate) fn taken_back(status: &JobStatus) -> JobStatus {
    JobStatus {
        succeeded: status.succeeded,
        failed: status.failed,
        conditions: Some(
            status
                .conditions
                .iter()
                .flatten()
                .filter(|c| {
                    condition::KEPT_ON_REQUEUE.contains(&c.type_.as_str())
                        || (c.status == "True"
                            && ["SuccessCriteriaMet", "FailureTarget"].contains(&c.type_.as_str()))
                })
                .cloned()
                .collect(),
        ),
        ..Default::default()
    }
}

/// A digest of a worker copy's status, to recognise a write the API server already refused.
/// Field by field (destructured, so that a field added to the type cannot be left out): it is
/// taken at every reconcile of a running Job, and serializing the status cost more than the
/// rest of the mirror.
pub(crate) fn digest(status: &JobStatus) -> u64 {
    let JobStatus {
        active,
        completed_indexes,
        completion_time,
        conditions,
        failed,
        failed_indexes,
        ready,
        start_time,
        succeeded,
        terminating,
        uncounted_terminated_pods,
    } = status;
    let time = |t: &Option<Time>| t.as_ref().map(|t| t.0.as_nanosecond());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        active,
        completed_indexes,
        time(completion_time),
        failed,
        failed_indexes,
        ready,
        time(start_time),
        succeeded,
        terminating,
    )
        .hash(&mut h);
    conditions.as_ref().map(Vec::len).hash(&mut h);
    for c in conditions.iter().flatten() {
        let JobCondition {
            last_probe_time,
            last_transition_time,
            message,
            reason,
            status,
            type_,
        } = c;
        (
            time(last_probe_time),
            time(last_transition_time),
            message,
            reason,
            status,
            type_,
        )
            .hash(&mut h);
    }
    uncounted_terminated_pods
        .as_ref()
        .map(|u| (&u.failed, &u.succeeded))
        .hash(&mut h);
    h.finish()
}

/// `SystemTime` as a Kubernetes timestamp, whole seconds (what `Time` carries on the wire).
pub(crate) fn to_timestamp(t: SystemTime) -> k8s_openapi::jiff::Timestamp {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn max_opt(a: Option<i32>, b: Option<i32>) -> Option<i32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn condition_time(conditions: &[JobCondition], type_: &str) -> Option<Time> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .and_then(|c| c.last_transition_time.clone())
}

/// Adds `needed=True` before `terminal` when a worker finished the Job without it.
fn require(conditions: &mut Vec<JobCondition>, needed: &str, terminal: &str) {
    if conditions
        .iter()
        .any(|c| c.type_ == needed && c.status == "True")
    {
        return;
    }
    let Some(pos) = conditions
        .iter()
        .position(|c| c.type_ == terminal && c.status == "True")
    else {
        return;
    };
    let t = &conditions[pos];
    let added = JobCondition {
        type_: needed.into(),
        status: "True".into(),
        reason: t.reason.clone(),
        message: t.message.clone(),
        last_probe_time: t.last_probe_time.clone(),
        last_transition_time: t.last_transition_time.clone(),
    };
    conditions.retain(|c| c.type_ != needed);
    let pos = conditions
        .iter()
        .position(|c| c.type_ == terminal)
        .unwrap_or(conditions.len());
    conditions.insert(pos, added);
}

/// Every rule above, checked on a status about to be written over `old`: the reason the API
/// server would give, or `None`. Whatever the dispatcher writes must pass (tested), and the
/// live writer checks every status write with it first: one that fails is reported (an Event,
/// `switchyard_dispatch_actions_total{result="refused"}`) instead of sent, and not tried again
/// until what it was made from changes. `suspended`: the Job's `spec.suspend` as written.
pub(crate) fn violation(old: &JobStatus, new: &JobStatus, suspended: bool) -> Option<String> {
    let is = |s: &JobStatus, t: &str| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    let complete = is(new, "Complete");
    let failed = is(new, "Failed");
    if let (Some(r), a) = (new.ready, new.active.unwrap_or(0)) {
        if r > a {
            return Some(format!(
                "status.ready: Invalid value: {r}: cannot set more ready pods than active"
            ));
        }
    }
    if complete && failed {
        return Some(
            "status.conditions: Invalid value: cannot set Complete=True and Failed=true conditions"
                .into(),
        );
    }
    if complete && is(new, "FailureTarget") {
        return Some("status.conditions: Invalid value: cannot set Complete=True and FailureTarget=true conditions".into());
    }
    if is(new, "SuccessCriteriaMet") && failed {
        return Some("status.conditions: Invalid value: cannot set SuccessCriteriaMet=True and Failed=true conditions".into());
    }
    if is(new, "SuccessCriteriaMet") && is(new, "FailureTarget") {
        return Some("status.conditions: Invalid value: cannot set SuccessCriteriaMet=True and FailureTarget=true conditions".into());
    }
    if complete && !is(new, "SuccessCriteriaMet") {
        return Some("status.conditions: cannot set Complete=True condition without the SuccessCriteriaMet=true condition".into());
    }
    if failed && !is(new, "FailureTarget") {
        return Some("status.conditions: cannot set Failed=True condition without the FailureTarget=true condition".into());
    }
    if complete && new.completion_time.is_none() {
        return Some(
            "status.completionTime: Required value: completionTime is required for Complete jobs"
                .into(),
        );
    }
    if !complete && new.completion_time.is_some() {
        return Some("status.completionTime: cannot set completionTime when there is no Complete=True condition".into());
    }
    if complete || failed {
        if new.active.unwrap_or(0) > 0 {
            return Some("status.active: active>0 is invalid for finished job".into());
        }
        if new.start_time.is_none() {
            return Some(
                "status.startTime: Required value: startTime is required for finished job".into(),
            );
        }
        if new.terminating.unwrap_or(0) > 0 {
            return Some("status.terminating: terminating>0 is invalid for finished job".into());
        }
        if new.uncounted_terminated_pods.as_ref().is_some_and(|u| {
            u.succeeded.as_ref().is_some_and(|v| !v.is_empty())
                || u.failed.as_ref().is_some_and(|v| !v.is_empty())
        }) {
            return Some("status.uncountedTerminatedPods: uncountedTerminatedPods needs to be empty for finished job".into());
        }
    }
    if let (Some(s), Some(c)) = (&new.start_time, &new.completion_time) {
        if c.0 < s.0 {
            return Some("status.completionTime: must be equal to or after startTime".into());
        }
    }
    // Only a change to another time: completionTime may go back to unset (then the Job may
    // not be Complete, checked above).
    if old.completion_time.is_some()
        && new.completion_time.is_some()
        && old.completion_time != new.completion_time
    {
        return Some("status.completionTime: completionTime cannot be mutated".into());
    }
    if !suspended && old.start_time.is_some() && old.start_time != new.start_time {
        return Some("status.startTime: field is immutable for unsuspended job once set".into());
    }
    if is(old, "Complete") && !complete {
        return Some(
            "status.conditions: cannot disable the terminal Complete=True condition".into(),
        );
    }
    if is(old, "Failed") && !failed {
        return Some("status.conditions: cannot disable the terminal Failed=True condition".into());
    }
    if is(old, "FailureTarget") && !is(new, "FailureTarget") {
        return Some(
            "status.conditions: cannot disable the terminal FailureTarget=True condition".into(),
        );
    }
    if is(old, "SuccessCriteriaMet") && !is(new, "SuccessCriteriaMet") {
        return Some(
            "status.conditions: cannot disable the SuccessCriteriaMet=True condition".into(),
        );
    }
    if new.succeeded.unwrap_or(0) < old.succeeded.unwrap_or(0) {
        return Some("status.succeeded: cannot decrease the succeeded counter".into());
    }
    if new.failed.unwrap_or(0) < old.failed.unwrap_or(0) {
        return Some("status.failed: cannot decrease the failed counter".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::UncountedTerminatedPods;

    fn at(secs: i64) -> Option<Time> {
        Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(secs).expect("a valid time"),
        ))
    }

    /// A status as a worker's Job controller writes it for a running Job.
    fn running() -> JobStatus {
        JobStatus {
            active: Some(2),
            ready: Some(1),
            start_time: at(1_700_000_000),
            terminating: Some(0),
            uncounted_terminated_pods: Some(Default::default()),
            conditions: Some(vec![JobCondition {
                type_: "Admitted".into(),
                status: "True".into(),
                reason: Some("Dispatched".into()),
                message: Some("dispatched to worker a".into()),
                last_transition_time: at(1_700_000_000),
                last_probe_time: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_status_digest_tells_every_field_apart() {
        let base = running();
        assert_eq!(
            digest(&base),
            digest(&running()),
            "the same status, the same digest"
        );
        type Change = fn(&mut JobStatus);
        let changes: [(&str, Change); 13] = [
            ("active", |s| s.active = Some(3)),
            ("ready", |s| s.ready = Some(2)),
            ("succeeded", |s| s.succeeded = Some(1)),
            ("failed", |s| s.failed = Some(1)),
            ("terminating", |s| s.terminating = None),
            ("startTime", |s| s.start_time = at(1_700_000_001)),
            ("completionTime", |s| s.completion_time = at(1_700_000_100)),
            ("completedIndexes", |s| {
                s.completed_indexes = Some("0".into())
            }),
            ("failedIndexes", |s| s.failed_indexes = Some("1".into())),
            ("uncountedTerminatedPods", |s| {
                s.uncounted_terminated_pods = Some(UncountedTerminatedPods {
                    failed: Some(vec!["uid-1".into()]),
                    succeeded: None,
                })
            }),
            ("no conditions", |s| s.conditions = Some(Vec::new())),
            ("a condition's status", |s| {
                s.conditions.as_mut().expect("conditions")[0].status = "False".into()
            }),
            ("a condition's transition time", |s| {
                s.conditions.as_mut().expect("conditions")[0].last_transition_time =
                    at(1_700_000_002)
            }),
        ];
        for (what, change) in changes {
            let mut other = running();
            change(&mut other);
            assert_ne!(digest(&base), digest(&other), "{what} changed");
        }
    }
}
