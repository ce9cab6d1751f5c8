//! The dispatcher: queues with quota, all-or-nothing admission (waitForPodsReady), one worker
//! cluster per Job chosen by the placement engine, the Job created there, its status mirrored
//! back, requeues on timeouts and lost workers.
//!
//! The decisions are pure: [`World`] (what is known of the manager's Jobs, the workers' copies,
//! the queues, the workers and their inventories, at one instant) goes in, a list of
//! [`Action`]s comes out. [`live`] keeps a `World` from watches and carries the actions out
//! through `kube::Client`s; `simulate` keeps one in memory and carries them out on simulated
//! clusters in virtual time. Both call the same [`plan`].
//!
//! All state that must survive a restart lives in the Kubernetes objects: the manager Job's
//! annotations ([`CLUSTER_ANNOTATION`], [`ADMITTED_AT_ANNOTATION`], [`REQUEUES_ANNOTATION`],
//! ...), its status conditions (`Admitted`, `PodsReady`, `Requeued`, `Deactivated`), and the
//! worker copies' `switchyard.dev/origin` and `switchyard.dev/origin-uid` labels. A restarted
//! dispatcher rebuilds everything from them.

mod action;
mod admission;
mod apply;
mod caches;
mod job;
pub(crate) mod kind;
pub(crate) mod kueue;
mod ledger;
pub mod live;
pub(crate) mod mirror;
pub(crate) mod object;
pub(crate) mod oracle;
mod reconcile;
pub mod remote;
mod state;
pub(crate) mod status;
#[cfg(test)]
mod tests;
mod world;

pub(crate) use action::{job_after, Action};
pub(crate) use admission::quota::effective as effective_quota;
pub(crate) use admission::WaitReason;
pub(crate) use apply::{apply, Outcome};
pub use job::rfc3339;
pub(crate) use job::Job;
pub(crate) use job::{ClassKey, JobKey, JobResult};
pub(crate) use reconcile::reconcile;
pub(crate) use state::{Queue, Worker, WorkerCopy};
pub use world::DispatchConfig;
pub(crate) use world::{Placement, World};

use admission::{admit, Admission};
use caches::oracle::CachedOracle;
use oracle::PlainOracle;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// The worker the manager's Job is dispatched to (claimed before the copy is created).
pub(crate) const CLUSTER_ANNOTATION: &str = crate::wellknown::CLUSTER_ANNOTATION;
/// When the Job was unsuspended by the dispatcher (RFC 3339); the PodsReady timeout counts from
/// it. Present with `spec.suspend: true` only when someone else suspended the Job since.
pub(crate) const ADMITTED_AT_ANNOTATION: &str = "switchyard.dev/admitted-at";
/// How many times the Job was requeued.
pub(crate) const REQUEUES_ANNOTATION: &str = "switchyard.dev/requeues";
/// The Job is not admitted again before this time (RFC 3339): requeue back-off.
pub(crate) const REQUEUE_AFTER_ANNOTATION: &str = "switchyard.dev/requeue-after";
/// The workers the Job is offered to at once (comma-separated), until one wins.
pub(crate) const OFFERED_ANNOTATION: &str = "switchyard.dev/offered-to";
/// The worker the next attempt avoids when another can take the Job.
pub(crate) const AVOID_ANNOTATION: &str = "switchyard.dev/avoid-cluster";
/// Workers that refused the Job's copy (JSON: worker → `{count, retryAt, message}`); each is
/// not asked again for this Job before its `retryAt`.
pub(crate) const REFUSED_ANNOTATION: &str = "switchyard.dev/refused-by";
/// The Job is given up (requeuing limit reached); the value says why.
pub(crate) const DEACTIVATED_ANNOTATION: &str = "switchyard.dev/deactivated";
/// The Job's outcome in its worker (`Succeeded` or `Failed`), recorded before the copy is
/// removed, so the result is known even if the API server refused the final status.
pub(crate) const RESULT_ANNOTATION: &str = "switchyard.dev/result";
/// On worker copies: the manager that created them.
pub(crate) const ORIGIN_LABEL: &str = "switchyard.dev/origin";
/// On worker copies (and their pods): the uid of the manager's Job.
pub(crate) const ORIGIN_UID_LABEL: &str = "switchyard.dev/origin-uid";

/// Status condition types the dispatcher owns on the manager's Job.
pub(crate) mod condition {
    /// False while the Job waits (the reason says why), True once dispatched.
    pub(crate) const ADMITTED: &str = "Admitted";
    /// Whether all the Job's pods are Ready (or done) in its worker.
    pub(crate) const PODS_READY: &str = "PodsReady";
    /// The last requeue: why, how many, when the next attempt is.
    pub(crate) const REQUEUED: &str = "Requeued";
    /// The Job was given up after too many requeues.
    pub(crate) const DEACTIVATED: &str = "Deactivated";

    /// In a worker that runs Kueue: whether that worker's Kueue admitted the copy (False,
    /// with the worker's reason, while it waits there or after it evicted it).
    pub(crate) const WORKER_ADMITTED: &str = "WorkerAdmitted";

    pub(crate) const OURS: [&str; 5] =
        [ADMITTED, PODS_READY, REQUEUED, DEACTIVATED, WORKER_ADMITTED];
    /// What stays when a Job is taken back from its worker.
    pub(crate) const KEPT_ON_REQUEUE: [&str; 3] = [ADMITTED, REQUEUED, DEACTIVATED];
}

/// Reasons the dispatcher gives, in conditions, Events and `simulate` output.
pub mod reason {
    pub(crate) const DISPATCHED: &str = "Dispatched";
    pub(crate) const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    pub(crate) const QUOTA_RESERVED_FOR_OLDER: &str = "QuotaHeldForOlderJob";
    pub(crate) const WAITING_FOR_PODS_READY: &str = "WaitingForPodsReady";
    pub(crate) const NO_WORKER_FITS: &str = "NoWorkerFits";
    pub(crate) const NEVER_FITS: &str = "NeverFits";
    pub(crate) const NO_ACTIVE_WORKER: &str = "NoActiveWorker";
    /// Only a worker that does not answer now could hold the Job.
    pub(crate) const WORKER_UNREACHABLE: &str = "WorkerUnreachable";
    /// A worker of the queue answers but its copies are not listed yet: what they use of
    /// the queue's quota is not known.
    pub(crate) const QUOTA_NOT_COUNTED: &str = "QuotaNotCounted";
    /// Every worker that could hold the Job runs Kueue, and none of their queues has quota
    /// for it now.
    pub(crate) const WORKER_QUOTA: &str = "WorkerQuotaExceeded";
    /// A Kueue worker did not admit the Job's copy within `workerAdmissionTimeout`.
    pub(crate) const WORKER_NOT_ADMITTED: &str = "WorkerAdmissionTimeout";
    /// StrictFIFO: an earlier Job of the queue waits.
    pub(crate) const BEHIND_OLDER_JOB: &str = "BehindOlderJob";
    pub(crate) const QUEUE_NOT_FOUND: &str = "QueueNotFound";
    pub(crate) const QUEUE_INVALID: &str = "QueueInvalid";
    pub(crate) const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    pub(crate) const INVALID_JOB: &str = "InvalidJob";
    pub(crate) const BACKOFF: &str = "Backoff";
    pub(crate) const WORKER_REFUSED: &str = "WorkerRefused";
    pub(crate) const PODS_READY_TIMEOUT: &str = "PodsReadyTimeout";
    pub(crate) const PODS_READY_LOST: &str = "PodsReadyRecoveryTimeout";
    pub(crate) const WORKER_LOST: &str = "WorkerLost";
    pub(crate) const REMOTE_DELETED: &str = "DeletedInWorker";
    pub(crate) const SUSPENDED_BY_USER: &str = "Suspended";
    pub(crate) const REQUEUING_LIMIT: &str = "RequeuingLimitExceeded";
    pub(crate) const STALE_COPY: &str = "StaleCopy";
    pub(crate) const ORPHANED_COPY: &str = "OrphanedCopy";
    pub(crate) const FINISHED: &str = "Finished";
    pub(crate) const PODS_READY: &str = "PodsReady";
}

/// What a waiting reason comes to, for `switchyard_queue_waiting_jobs{reason}`: `Quota`,
/// `PodsReadyGate`, `Order` (StrictFIFO: behind an earlier Job), `NoFit`, `Backoff` (a
/// requeue or refusal back-off, or an old copy still being removed), `Unreachable` (only a
/// worker that does not answer could hold the Job) or `Inactive` (the queue cannot admit
/// anything: missing, invalid, no usable worker, namespace not allowed).
pub(crate) fn wait_category(why: &str) -> &'static str {
    use reason::*;
    match why {
        QUOTA_EXCEEDED | QUOTA_RESERVED_FOR_OLDER | WORKER_QUOTA | QUOTA_NOT_COUNTED => "Quota",
        WAITING_FOR_PODS_READY => "PodsReadyGate",
        BEHIND_OLDER_JOB => "Order",
        WORKER_UNREACHABLE => "Unreachable",
        QUEUE_NOT_FOUND | QUEUE_INVALID | NAMESPACE_NOT_ALLOWED | NO_ACTIVE_WORKER => "Inactive",
        BACKOFF | WORKER_REFUSED | PODS_READY_TIMEOUT | PODS_READY_LOST => "Backoff",
        _ => "NoFit",
    }
}

/// Every value of [`wait_category`].
pub(crate) const WAIT_CATEGORIES: [&str; 7] = [
    "Quota",
    "PodsReadyGate",
    "Order",
    "NoFit",
    "Backoff",
    "Unreachable",
    "Inactive",
];

/// What the dispatcher decided at one instant.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) actions: Vec<Action>,
    /// Why each class of pending Jobs that was tried waits: its first waiting Job's reason,
    /// which is every later Job's of the class too.
    pub(crate) waiting: BTreeMap<ClassKey, WaitReason>,
    /// Jobs that wait for a reason of their own.
    pub(crate) job_waiting: BTreeMap<JobKey, WaitReason>,
    /// When to plan again if nothing changes before.
    pub(crate) wake_at: Option<SystemTime>,
}

/// Everything the dispatcher decides at `now`: first the Jobs that changed or whose deadline
/// came (mirror, timeouts, lost workers, finished Jobs, copies to remove), then admission of
/// pending Jobs against the capacity the world shows. What the first part gives back (a
/// requeued or finished Job's quota) is admitted from once the world shows it: the next plan.
pub(crate) fn plan(world: &mut World, now: SystemTime) -> Plan {
    let mut out = Plan::default();
    world.state.fire_timers(now);
    let mut wakes = Vec::new();
    for key in world.take_dirty() {
        let Some(job) = world.state.jobs.get(&key) else {
            continue;
        };
        if let Some(at) = reconcile(world, job, now, &mut out.actions) {
            wakes.push((key, at));
        }
    }
    for (key, at) in wakes {
        world.state.wake(&key, at);
    }
    // Holding and releasing placements changes only this in-memory accounting: done here,
    // before admission, so this pass already admits into the room a release gives back
    // (otherwise every release would make the next pass judge its queues' Jobs again).
    out.actions.retain(|action| match action {
        Action::Hold(_) | Action::Release { .. } => {
            apply(world, action, Outcome::Done, now);
            false
        }
        _ => true,
    });
    reconcile::collect_garbage(world, &mut out.actions);
    if world.state.jobs_synced {
        let admission = admit_now(world, now);
        let gave_back = keep_rooms(world, admission.kept);
        out.actions.extend(admission.actions);
        out.waiting = admission.waiting;
        out.job_waiting = admission.job_waiting;
        out.wake_at = admission.wake_at;
        if gave_back {
            // The pass kept the room it let go from Jobs behind it: the next one admits into
            // it, at once.
            out.wake_at = Some(now);
        }
    }
    if let Some(t) = world.state.next_timer() {
        out.wake_at = Some(out.wake_at.map_or(t, |w| w.min(t)));
    }
    out
}

/// The room kept for starving Jobs becomes what the pass decided: room it no longer keeps
/// is let go (its Job was admitted, stopped waiting or starving, or its room moved), new room
/// is held. Like holds, this is in-memory accounting only, done as soon as it is decided.
/// Returns whether room was let go.
fn keep_rooms(world: &mut World, kept: Vec<ledger::Hold>) -> bool {
    let decided: std::collections::BTreeSet<&str> =
        kept.iter().map(|h| h.job_uid.as_str()).collect();
    let gone: Vec<String> = world
        .ledger
        .nominations()
        .filter(|h| !decided.contains(h.job_uid.as_str()))
        .map(|h| h.job_uid.clone())
        .collect();
    let mut gave_back = !gone.is_empty();
    for uid in gone {
        world.release(&uid);
    }
    for hold in kept {
        match world.ledger.hold_of(&hold.job_uid) {
            Some(h) if hold.serial != 0 && h.serial == hold.serial => continue,
            Some(_) => gave_back = true,
            None => {}
        }
        world.hold(hold);
    }
    gave_back
}

/// One admission pass: its questions answered from the caches, which keep what it found
/// (or, without memory, answered afresh).
fn admit_now(world: &mut World, now: SystemTime) -> Admission {
    world.caches.before_pass(&world.state, &world.ledger);
    let (state, ledger, config) = (&world.state, &world.ledger, &world.config);
    if !config.remember {
        return admit(
            state,
            ledger,
            config,
            now,
            &mut PlainOracle::new(state, ledger, config),
        );
    }
    let taken = (
        world.caches.take_shape_rooms(),
        world.caches.take_held_views(),
    );
    let mut oracle = CachedOracle::new(state, ledger, &world.caches, config, taken);
    let admission = admit(state, ledger, config, now, &mut oracle);
    let found = oracle.into_findings();
    world.caches.keep(found, &world.state, &world.ledger);
    admission
}
