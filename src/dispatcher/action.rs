//! What the dispatcher decides, as plain data: the [`Action`]s, and what each does to the
//! manager Job ([`job_after`]). The executors (live, `simulate`, the tests) carry them out
//! and report each one's outcome to [`super::apply`].

use super::job::{rfc3339, Job, JobKey, JobResult, WorkerRefusal};
use super::kind::Status;
use super::ledger::Hold;
use super::status::{admitted, deactivated, requeued, waiting, with_condition};
use super::{condition, reason};
use crate::text::shorten;
use std::time::SystemTime;

/// What the dispatcher asks for. Carried out by the live executor against the API servers,
/// or by `simulate` against its in-memory clusters.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Claim `cluster` for the Job, create its copy there and unsuspend the Job; `hold`
    /// is the placement to hold until the worker's inventory shows it.
    Dispatch {
        job: JobKey,
        cluster: String,
        hold: Hold,
    },
    /// Offer the Job to several workers at once: claim them, create a copy in each,
    /// unsuspend the Job. The first whose pods are all Ready wins ([`Action::Choose`]).
    Offer { job: JobKey, clusters: Vec<String> },
    /// The offered Job's copy in `cluster` ran all its pods first: it keeps the Job, the
    /// other copies are removed.
    Choose { job: JobKey, cluster: String },
    /// The Job is claimed for `cluster` but its copy is missing: create it.
    CreateCopy { job: JobKey, cluster: String },
    /// The copy exists and the Job is still suspended: unsuspend it.
    Unsuspend { job: JobKey, cluster: String },
    /// Give back a claim whose copy the worker refused (kept as a reason for the user); the
    /// worker is not asked again for this Job before `retry_at`.
    Unclaim {
        job: JobKey,
        cluster: String,
        reason: &'static str,
        message: String,
        retry_at: SystemTime,
    },
    /// Write the manager Job's status (mirrored from its copy, with our conditions).
    WriteStatus {
        job: JobKey,
        status: Box<Status>,
        /// A digest of the copy's status it came from, to recognise a refused write.
        digest: u64,
    },
    /// Record how the Job ended before its copy is removed.
    RecordResult { job: JobKey, result: JobResult },
    /// Delete a copy (only ever one labelled with our origin; the uid is a precondition).
    DeleteCopy {
        cluster: String,
        job: JobKey,
        uid: String,
        origin_uid: String,
        reason: &'static str,
    },
    /// Take the Job back: suspend it, drop the claim, count the requeue.
    Requeue {
        job: JobKey,
        reason: &'static str,
        message: String,
        requeues: u32,
        requeue_after: Option<SystemTime>,
        avoid: Option<String>,
    },
    /// Give the Job up: requeuing limit reached.
    Deactivate { job: JobKey, message: String },
    /// Say why the Job waits (the `Admitted` condition, False).
    Wait {
        job: JobKey,
        reason: &'static str,
        message: String,
    },
    /// Hold a placement for an admitted Job (after a restart: its pods may not show yet).
    Hold(Hold),
    /// Stop holding the Job's placement: its worker's inventory shows it, or it ended.
    Release { job_uid: String },
}

impl Action {
    /// The manager Job the action is about.
    pub(crate) fn job(&self) -> Option<&JobKey> {
        match self {
            Action::Dispatch { job, .. }
            | Action::Offer { job, .. }
            | Action::Choose { job, .. }
            | Action::CreateCopy { job, .. }
            | Action::Unsuspend { job, .. }
            | Action::Unclaim { job, .. }
            | Action::WriteStatus { job, .. }
            | Action::RecordResult { job, .. }
            | Action::Requeue { job, .. }
            | Action::Deactivate { job, .. }
            | Action::Wait { job, .. } => Some(job),
            Action::DeleteCopy { .. } | Action::Hold(_) | Action::Release { .. } => None,
        }
    }

    /// The action's name in metrics and logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Action::Dispatch { .. } => "dispatch",
            Action::Offer { .. } => "offer",
            Action::Choose { .. } => "choose",
            Action::CreateCopy { .. } => "create_copy",
            Action::Unsuspend { .. } => "unsuspend",
            Action::Unclaim { .. } => "unclaim",
            Action::WriteStatus { .. } => "write_status",
            Action::RecordResult { .. } => "record_result",
            Action::DeleteCopy { .. } => "delete_copy",
            Action::Requeue { .. } => "requeue",
            Action::Deactivate { .. } => "deactivate",
            Action::Wait { .. } => "wait",
            Action::Hold(_) => "hold",
            Action::Release { .. } => "release",
        }
    }
}

/// The manager Job after the action succeeded, as far as the action decides it (the live
/// executor replaces it with what the API server returns). `None`: the action does not
/// change the manager Job.
pub(crate) fn job_after(job: &Job, action: &Action, now: SystemTime) -> Option<Job> {
    let mut j = job.clone();
    match action {
        Action::Dispatch { cluster, .. } => {
            j.cluster = Some(cluster.clone());
            j.suspended = false;
            j.admitted_at = Some(now);
            j.requeue_after = None;
            j.avoid = None;
            j.refusals.remove(cluster);
            j.status = admitted(&j.status, cluster, now);
        }
        Action::Offer { clusters, .. } => {
            j.offers = clusters.clone();
            j.suspended = false;
            j.admitted_at = Some(now);
            j.requeue_after = None;
            j.avoid = None;
            j.status = with_condition(
                &j.status,
                condition::ADMITTED,
                true,
                reason::DISPATCHED,
                &format!(
                    "offered to workers {}; the first to run all its pods keeps it",
                    clusters.join(", ")
                ),
                now,
            );
        }
        Action::Choose { cluster, .. } => {
            j.cluster = Some(cluster.clone());
            j.offers.clear();
            j.refusals.remove(cluster);
            j.status = admitted(&j.status, cluster, now);
        }
        Action::CreateCopy { .. } => return None,
        Action::Unsuspend { cluster, .. } => {
            j.suspended = false;
            j.admitted_at = Some(now);
            j.requeue_after = None;
            j.avoid = None;
            j.refusals.remove(cluster);
            j.status = admitted(&j.status, cluster, now);
        }
        Action::Unclaim {
            cluster,
            reason,
            message,
            retry_at,
            ..
        } => {
            j.cluster = None;
            j.offers.retain(|c| c != cluster);
            j.avoid = Some(cluster.clone());
            let count = j
                .refusals
                .get(cluster)
                .map_or(1, |r| r.count.saturating_add(1));
            j.refusals.insert(
                cluster.clone(),
                WorkerRefusal {
                    count,
                    retry_at: *retry_at,
                    message: shorten(message, 300),
                },
            );
            j.status = waiting(
                &j.status,
                reason,
                &refused_message(cluster, message, *retry_at),
                now,
            );
        }
        Action::WriteStatus { status, .. } => j.status = (**status).clone(),
        Action::RecordResult { result, .. } => j.result = Some(*result),
        Action::Requeue {
            reason,
            message,
            requeues,
            requeue_after,
            avoid,
            ..
        } => {
            j.cluster = None;
            j.suspended = true;
            j.admitted_at = None;
            j.requeues = *requeues;
            j.offers.clear();
            j.requeue_after = *requeue_after;
            j.avoid = avoid.clone();
            j.status = requeued(&j.status, reason, message, now);
        }
        Action::Deactivate { message, .. } => {
            j.cluster = None;
            j.offers.clear();
            j.suspended = true;
            j.admitted_at = None;
            j.deactivated = Some(message.clone());
            j.status = deactivated(&j.status, message, now);
        }
        Action::Wait {
            reason, message, ..
        } => j.status = waiting(&j.status, reason, message, now),
        Action::DeleteCopy { .. } | Action::Hold(_) | Action::Release { .. } => return None,
    }
    Some(j)
}

/// The manager Job once only the claim of a dispatch or an offer is written: claimed for
/// its worker(s), still suspended, its copies still to create (the next plans create them).
pub(crate) fn job_claimed(job: &Job, action: &Action) -> Option<Job> {
    let mut j = job.clone();
    match action {
        Action::Dispatch { cluster, .. } => j.cluster = Some(cluster.clone()),
        Action::Offer { clusters, .. } => j.offers = clusters.clone(),
        _ => return None,
    }
    Some(j)
}

impl Action {
    /// A human line for an Event or log about the action.
    pub(crate) fn describe(&self) -> String {
        match self {
            Action::Dispatch { job, cluster, .. } => {
                format!("{job}: dispatched to worker {cluster}")
            }
            Action::Offer { job, clusters } => {
                format!("{job}: offered to workers {}", clusters.join(", "))
            }
            Action::Choose { job, cluster } => {
                format!("{job}: worker {cluster} ran all its pods first and keeps it")
            }
            Action::CreateCopy { job, cluster } => {
                format!("{job}: creating its copy in worker {cluster}")
            }
            Action::Unsuspend { job, cluster } => format!("{job}: running in worker {cluster}"),
            Action::Unclaim {
                job,
                cluster,
                message,
                retry_at,
                ..
            } => format!("{job}: {}", refused_message(cluster, message, *retry_at)),
            Action::WriteStatus { job, .. } => format!("{job}: status mirrored"),
            Action::RecordResult { job, result } => {
                format!("{job}: {} in its worker", result.as_str())
            }
            Action::DeleteCopy {
                cluster,
                job,
                reason,
                ..
            } => format!("{job}: removing its copy from worker {cluster} ({reason})"),
            Action::Requeue { job, message, .. } => format!("{job}: requeued: {message}"),
            Action::Deactivate { job, message } => format!("{job}: deactivated: {message}"),
            Action::Wait { job, message, .. } => format!("{job}: waiting: {message}"),
            Action::Hold(h) => format!("holding a placement in {} for {}", h.cluster, h.job_uid),
            Action::Release { job_uid } => format!("releasing the placement held for {job_uid}"),
        }
    }
}

/// Why the Job left `cluster`, and when that worker is asked again.
fn refused_message(cluster: &str, message: &str, retry_at: SystemTime) -> String {
    format!(
        "worker {cluster} refused it: {message}; next attempt there not before {}",
        rfc3339(retry_at)
    )
}
