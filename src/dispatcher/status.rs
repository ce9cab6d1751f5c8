//! What each action does to the manager Job, as plain data: its new dispatch state and the
//! status conditions people read with `kubectl describe job`. The live executor writes these
//! to the API server; `simulate` applies them to its Jobs directly.

use super::condition;
use super::job::Job;
use super::mirror::to_timestamp;

use super::kind::Status;
use super::reason;
use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::SystemTime;

/// `status` with the condition of `type_` replaced (its transition time kept when its status
/// does not change).
pub(crate) fn with_condition(
    status: &Status,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    now: SystemTime,
) -> Status {
    let mut out = status.clone();
    let conditions = out.conditions_mut();
    let value = if ok { "True" } else { "False" };
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == value)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(to_timestamp(now)));
    let new = JobCondition {
        type_: type_.into(),
        status: value.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: None,
        last_transition_time: Some(transition),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => *c = new,
        None => conditions.push(new),
    }
    out
}

fn without(status: &Status, type_: &str) -> Status {
    let mut out = status.clone();
    out.conditions_mut().retain(|c| c.type_ != type_);
    out
}

/// The status once the Job is dispatched to `cluster`.
pub(crate) fn admitted(status: &Status, cluster: &str, now: SystemTime) -> Status {
    let s = with_condition(
        status,
        condition::ADMITTED,
        true,
        reason::DISPATCHED,
        &format!("dispatched to worker {cluster}"),
        now,
    );
    without(&s, condition::DEACTIVATED)
}

/// The status of a Job waiting for admission.
pub(crate) fn waiting(status: &Status, why: &str, message: &str, now: SystemTime) -> Status {
    with_condition(status, condition::ADMITTED, false, why, message, now)
}

/// The status of a Job taken back from its worker: no pods any more, waiting again, with
/// what its kind does not let go back (see [`Status::taken_back`]).
pub(crate) fn requeued(status: &Status, why: &str, message: &str, now: SystemTime) -> Status {
    let s = with_condition(
        &status.taken_back(),
        condition::REQUEUED,
        true,
        why,
        message,
        now,
    );
    waiting(&s, why, message, now)
}

/// The status of a Job given up.
pub(crate) fn deactivated(status: &Status, message: &str, now: SystemTime) -> Status {
    let s = requeued(status, reason::REQUEUING_LIMIT, message, now);
    with_condition(
        &s,
        condition::DEACTIVATED,
        true,
        reason::REQUEUING_LIMIT,
        message,
        now,
    )
}

/// Every dispatch annotation as the Job's state says it should be (`None`: absent), for the
/// live executor's patches: a patch always carries all of them, so it is right whatever
/// state the object was in.
pub(crate) fn annotations(job: &Job) -> Vec<(&'static str, Option<String>)> {
    use super::*;
    let time = |t: Option<SystemTime>| t.map(rfc3339);
    vec![
        (CLUSTER_ANNOTATION, job.cluster.clone()),
        (
            OFFERED_ANNOTATION,
            (!job.offers.is_empty()).then(|| job.offers.join(",")),
        ),
        (
            ADMITTED_AT_ANNOTATION,
            job.admitted_at.map(super::job::rfc3339_millis),
        ),
        (
            REQUEUES_ANNOTATION,
            (job.requeues > 0).then(|| job.requeues.to_string()),
        ),
        (REQUEUE_AFTER_ANNOTATION, time(job.requeue_after)),
        (AVOID_ANNOTATION, job.avoid.clone()),
        (
            REFUSED_ANNOTATION,
            super::object::refusals_annotation(&job.refusals),
        ),
        (DEACTIVATED_ANNOTATION, job.deactivated.clone()),
        (
            RESULT_ANNOTATION,
            job.result.map(|r| r.as_str().to_string()),
        ),
    ]
}
