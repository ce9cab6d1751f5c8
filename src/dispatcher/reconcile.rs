//! One Job's next steps once it is claimed for a worker, or when its copies must go: finish
//! an interrupted dispatch, mirror the copy's status, enforce the PodsReady timeouts, requeue
//! when the worker is lost or the copy deleted, record the result and remove the copy when
//! the Job ends, remove copies that should not exist.

use super::admission::hold_for;
use super::mirror::{self, Readiness};
use super::model::{terminal, Action, Copy, Job, JobResult, World};
use super::reason;
use std::time::SystemTime;

/// Appends the Job's next actions to `out`; returns when it should be looked at again if
/// nothing changes before (a deadline).
pub fn reconcile(
    world: &World,
    job: &Job,
    now: SystemTime,
    out: &mut Vec<Action>,
) -> Option<SystemTime> {
    let mut wake = Wake(None);
    let live: Vec<&Copy> = world.copies_of(&job.uid).filter(|c| !c.deleting).collect();
    let keep = job.kept_clusters();

    // Copies that should not exist: anywhere but the claimed worker, or all of them.
    for c in &live {
        if !keep.contains(&c.cluster) {
            delete(world, out, c, why_unkept(job));
        }
    }

    if job.deleting || job.deactivated.is_some() {
        release(world, job, out);
        return wake.0;
    }
    if job.finished() {
        finish(world, job, &live, now, out);
        return wake.0;
    }
    let settings = world
        .queues
        .get(&job.queue)
        .and_then(|q| q.settings.as_ref().ok());
    if job.cluster.is_none() && !job.offers.is_empty() {
        offered(world, job, &live, settings, now, out, &mut wake);
        return wake.0;
    }
    let Some(cluster) = job.cluster.as_deref() else {
        release(world, job, out);
        return wake.0;
    };
    let Some(settings) = settings else {
        // The queue went away or broke: an admitted Job keeps running; nothing is timed.
        return wake.0;
    };

    let Some(worker) = world.workers.get(cluster) else {
        take_back(
            world,
            job,
            now,
            out,
            reason::WORKER_LOST,
            format!("worker {cluster} was removed"),
            None,
            None,
        );
        release(world, job, out);
        return wake.0;
    };
    if !worker.connected {
        // A short disconnect changes nothing; past workerLostTimeout its Jobs are taken back
        // (seed 000: the manager assumes they are lost). Their copies are removed when the
        // worker comes back, before anything else is dispatched there.
        let since = worker.disconnected_since.unwrap_or(now);
        let deadline = since + settings.worker_lost_timeout;
        if deadline <= now {
            take_back(
                world,
                job,
                now,
                out,
                reason::WORKER_LOST,
                format!(
                    "worker {cluster} has been unreachable since {} (workerLostTimeout {}s); the Job is queued again",
                    super::model::rfc3339(since),
                    settings.worker_lost_timeout.as_secs()
                ),
                None,
                Some(cluster.to_string()),
            );
            release(world, job, out);
        } else {
            wake.at(deadline);
        }
        return wake.0;
    }
    if !worker.copies_synced {
        return wake.0;
    }

    let copy = live.iter().find(|c| c.cluster == cluster).copied();
    let Some(copy) = copy else {
        if job.suspended && job.admitted_at.is_none() {
            // Claimed, not yet created (or the create failed): create it, not too often.
            let last = world.create_attempted.get(&job.uid).copied();
            match last {
                Some(t) if t + world.config.create_retry_after > now => {
                    wake.at(t + world.config.create_retry_after)
                }
                _ => out.push(Action::CreateCopy {
                    job: job.key.clone(),
                    cluster: cluster.to_string(),
                }),
            }
        } else if job.user_suspended() {
            take_back(
                world,
                job,
                now,
                out,
                reason::SUSPENDED_BY_USER,
                "the Job was suspended; its copy is removed and it waits in its queue again".into(),
                None,
                None,
            );
            release(world, job, out);
        } else if let Some(t) = world
            .create_attempted
            .get(&job.uid)
            .map(|t| *t + world.config.create_retry_after)
            .filter(|t| *t > now)
        {
            // Created a moment ago: the create's answer may have been lost (its writes timed
            // out) and the worker's watch not caught up yet. Missing later, it was deleted.
            wake.at(t);
        } else {
            take_back(
                world,
                job,
                now,
                out,
                reason::REMOTE_DELETED,
                format!(
                    "the Job's copy in worker {cluster} was deleted there; the Job is queued again"
                ),
                None,
                None,
            );
            release(world, job, out);
        }
        return wake.0;
    };

    if job.user_suspended() {
        delete(world, out, copy, reason::SUSPENDED_BY_USER);
        take_back(
            world,
            job,
            now,
            out,
            reason::SUSPENDED_BY_USER,
            "the Job was suspended; its copy is removed and it waits in its queue again".into(),
            None,
            None,
        );
        release(world, job, out);
        return wake.0;
    }
    if job.suspended {
        out.push(Action::Unsuspend {
            job: job.key.clone(),
            cluster: cluster.to_string(),
        });
        return wake.0;
    }
    if terminal(&copy.status).is_some() {
        finish(world, job, &live, now, out);
        return wake.0;
    }

    // Running: mirror, hold, PodsReady.
    let readiness = Readiness {
        ready: copy.ready_pods(),
        gang: job.gang(),
    };
    write_status(world, job, copy, readiness, now, out);

    let hold = world.holds().get(&job.uid);
    if readiness.all() {
        if hold.is_some() {
            out.push(Action::Release {
                job_uid: job.uid.clone(),
            });
        }
    } else {
        let since = hold.map_or(job.admitted_at.unwrap_or(now), |h| h.since);
        let until = since + world.config.hold_timeout;
        match hold {
            Some(_) if until <= now => out.push(Action::Release {
                job_uid: job.uid.clone(),
            }),
            Some(_) => wake.at(until),
            // Restarted: its pods may not show in the inventory yet (never all Ready so far).
            None if until > now && never_ready(job) => {
                if let Some(h) = hold_for(world, job, cluster, since) {
                    out.push(Action::Hold(h));
                }
                wake.at(until);
            }
            None => {}
        }
    }

    pods_ready_timeout(
        world,
        job,
        settings,
        &[copy],
        readiness,
        cluster,
        now,
        out,
        &mut wake,
    );
    wake.0
}

/// A Job offered to several workers at once (`placement.fanout` > 1): finish creating the
/// copies, unsuspend, and hand the Job to the first copy whose pods are all Ready.
fn offered(
    world: &World,
    job: &Job,
    live: &[&Copy],
    settings: Option<&crate::api::QueueSettings>,
    now: SystemTime,
    out: &mut Vec<Action>,
    wake: &mut Wake,
) {
    let copy_in = |c: &str| live.iter().find(|x| x.cluster == c).copied();
    let usable = |c: &str| world.workers.get(c).is_some_and(|w| w.usable());
    if job.suspended && job.admitted_at.is_none() {
        let missing: Vec<&String> = job
            .offers
            .iter()
            .filter(|c| usable(c) && copy_in(c).is_none())
            .collect();
        if missing.is_empty() {
            out.push(Action::Unsuspend {
                job: job.key.clone(),
                cluster: job.offers.join(", "),
            });
            return;
        }
        match world.create_attempted.get(&job.uid).copied() {
            Some(t) if t + world.config.create_retry_after > now => {
                wake.at(t + world.config.create_retry_after)
            }
            _ => {
                for c in missing {
                    out.push(Action::CreateCopy {
                        job: job.key.clone(),
                        cluster: c.clone(),
                    });
                }
            }
        }
        return;
    }
    if job.user_suspended() {
        for c in live {
            delete(world, out, c, reason::SUSPENDED_BY_USER);
        }
        take_back(
            world,
            job,
            now,
            out,
            reason::SUSPENDED_BY_USER,
            "the Job was suspended; its copies are removed and it waits in its queue again".into(),
            None,
            None,
        );
        return;
    }
    let gang = job.gang();
    for c in &job.offers {
        if let Some(copy) = copy_in(c) {
            if copy.ready_pods() >= gang || terminal(&copy.status).is_some() {
                out.push(Action::Choose {
                    job: job.key.clone(),
                    cluster: c.clone(),
                });
                return;
            }
        }
    }
    // Every offer gone: the workers deleted their copies, or were lost too long.
    let lost_timeout = settings.map_or(std::time::Duration::from_secs(900), |s| {
        s.worker_lost_timeout
    });
    let mut alive = 0;
    for c in &job.offers {
        match world.workers.get(c) {
            Some(w) if w.connected && (!w.copies_synced || copy_in(c).is_some()) => alive += 1,
            Some(w) if w.connected => {}
            Some(w) => {
                let deadline = w.disconnected_since.unwrap_or(now) + lost_timeout;
                if deadline > now {
                    alive += 1;
                    wake.at(deadline);
                }
            }
            None => {}
        }
    }
    if alive == 0 {
        take_back(
            world,
            job,
            now,
            out,
            reason::REMOTE_DELETED,
            format!(
                "none of the workers it was offered to ({}) has its copy any more; the Job is queued again",
                job.offers.join(", ")
            ),
            None,
            None,
        );
        return;
    }
    if let Some(settings) = settings {
        let best = live.iter().map(|c| c.ready_pods()).max().unwrap_or(0);
        let readiness = Readiness { ready: best, gang };
        pods_ready_timeout(
            world,
            job,
            settings,
            live,
            readiness,
            &job.offers.join(", "),
            now,
            out,
            wake,
        );
    }
}

/// Past `waitForPodsReady.timeout` since admission (or `recoveryTimeout` since the pods
/// stopped being Ready): remove the copies and requeue with back-off, or give up at the
/// requeuing limit.
#[allow(clippy::too_many_arguments)]
fn pods_ready_timeout(
    world: &World,
    job: &Job,
    settings: &crate::api::QueueSettings,
    copies: &[&Copy],
    readiness: Readiness,
    cluster: &str,
    now: SystemTime,
    out: &mut Vec<Action>,
    wake: &mut Wake,
) {
    let Some(wait) = &settings.wait_for_pods_ready else {
        return;
    };
    if readiness.all() {
        return;
    }
    // Judged on the condition as it is about to be written, not as it was: pods that were
    // Ready a moment ago are "lost", not "never Ready".
    let condition = mirror::pods_ready_condition(&job.status, readiness, false, now);
    let (deadline, why, what) = match Some(&condition) {
        Some(c) if c.reason.as_deref() == Some(mirror::LOST) => {
            let Some(recovery) = wait.recovery_timeout else {
                return;
            };
            let since = c
                .last_transition_time
                .as_ref()
                .map(|t| super::model::to_system_time(&t.0))
                .unwrap_or(now);
            (
                since + recovery,
                reason::PODS_READY_LOST,
                "its pods stopped being Ready",
            )
        }
        _ => {
            let since = job.admitted_at.unwrap_or(now);
            (
                since + wait.timeout,
                reason::PODS_READY_TIMEOUT,
                "its pods were not all Ready",
            )
        }
    };
    if deadline > now {
        wake.at(deadline);
        return;
    }
    let message = format!(
        "{what} in time in worker {cluster} ({} of {} Ready)",
        readiness.ready, readiness.gang
    );
    // The requeue (its count, back-off and reason) is written first; the copies go once it
    // has landed, as copies of a Job that no longer keeps them. Deleted first, a failed or
    // interrupted requeue write would leave a claimed Job without its copy, which reads as
    // "deleted in the worker": requeued again uncounted, without back-off.
    release(world, job, out);
    if let Some(result) = mirror::decided(&job.status) {
        conclude(world, job, result, now, out);
        return;
    }
    // The worker of the one copy that failed (`cluster` names all the offers of an offered
    // Job, not a worker).
    let avoid = match copies {
        [only] => Some(only.cluster.clone()),
        _ => None,
    };
    if wait.requeuing.may_requeue(job.requeues) {
        let n = job.requeues + 1;
        let after = now + wait.requeuing.backoff(n);
        requeue(
            job,
            out,
            why,
            format!(
                "{message}; requeued ({n} so far), next attempt not before {}",
                super::model::rfc3339(after)
            ),
            Some((n, after)),
            avoid,
        );
    } else {
        out.push(Action::Deactivate {
            job: job.key.clone(),
            message: format!(
                "{message}; given up after {} requeues (waitForPodsReady.requeuing.limit)",
                job.requeues
            ),
        });
    }
}

/// The reasons a copy is removed because the manager Job, as this dispatcher sees it, does not
/// keep it (see [`why_unkept`] and [`collect_garbage`]). A view can be behind the workers'
/// (a second dispatcher claimed the Job a moment ago, a list served from a cache): the live
/// executor reads the Job again before removing a copy for one of these.
pub const UNKEPT: [&str; 5] = [
    reason::ORPHANED_COPY,
    reason::REQUEUING_LIMIT,
    reason::PODS_READY_TIMEOUT,
    reason::PODS_READY_LOST,
    reason::STALE_COPY,
];

/// Why the Job's copies that it no longer keeps go: the PodsReady timeout that requeued it
/// (the requeue is written first, the copies go after), or just that they are stale.
fn why_unkept(job: &Job) -> &'static str {
    if job.deleting {
        return reason::ORPHANED_COPY;
    }
    if job.deactivated.is_some() {
        return reason::REQUEUING_LIMIT;
    }
    let requeued = job
        .condition(super::condition::REQUEUED)
        .filter(|c| c.status == "True")
        .and_then(|c| c.reason.as_deref());
    match requeued {
        Some(r) if r == reason::PODS_READY_TIMEOUT => reason::PODS_READY_TIMEOUT,
        Some(r) if r == reason::PODS_READY_LOST => reason::PODS_READY_LOST,
        _ => reason::STALE_COPY,
    }
}

fn never_ready(job: &Job) -> bool {
    job.condition(super::condition::PODS_READY)
        .is_none_or(|c| c.status != "True" && c.reason.as_deref() != Some(mirror::LOST))
}

/// Copies of Jobs this manager no longer has (deleted while the dispatcher was away, or
/// before their copy was seen), once the manager's Jobs have been listed.
pub fn collect_garbage(world: &World, out: &mut Vec<Action>) {
    if !world.jobs_synced {
        return;
    }
    for c in world.orphans() {
        if !c.deleting {
            delete(world, out, c, reason::ORPHANED_COPY);
        }
    }
}

fn delete(world: &World, out: &mut Vec<Action>, c: &Copy, why: &'static str) {
    // An unreachable worker's copies are removed when it answers again.
    if world.workers.get(&c.cluster).is_some_and(|w| w.connected) {
        out.push(Action::DeleteCopy {
            cluster: c.cluster.clone(),
            job: c.key.clone(),
            uid: c.uid.clone(),
            origin_uid: c.origin_uid.clone(),
            reason: why,
        });
    }
}

fn release(world: &World, job: &Job, out: &mut Vec<Action>) {
    if world.holds().contains_key(&job.uid) {
        out.push(Action::Release {
            job_uid: job.uid.clone(),
        });
    }
}

/// Takes the Job back from its worker: requeued, unless its worker had already decided how
/// it ends (`SuccessCriteriaMet` or `FailureTarget` True, which the API server never lets a
/// Job's status drop): then it ends that way, as the Job controller would end it.
#[allow(clippy::too_many_arguments)]
fn take_back(
    world: &World,
    job: &Job,
    now: SystemTime,
    out: &mut Vec<Action>,
    why: &'static str,
    message: String,
    counted: Option<(u32, SystemTime)>,
    avoid: Option<String>,
) {
    match mirror::decided(&job.status) {
        Some(result) => conclude(world, job, result, now, out),
        None => requeue(job, out, why, message, counted, avoid),
    }
}

/// The Job ends as its worker decided, its copy gone: the result and the final status.
fn conclude(world: &World, job: &Job, result: JobResult, now: SystemTime, out: &mut Vec<Action>) {
    if job.result.is_none() {
        out.push(Action::RecordResult {
            job: job.key.clone(),
            result,
        });
    }
    write_concluded(world, job, result, now, out);
}

/// Writes the final status of a Job whose copy cannot give it (gone, or not finished there);
/// returns whether a write was asked for.
fn write_concluded(
    world: &World,
    job: &Job,
    result: JobResult,
    now: SystemTime,
    out: &mut Vec<Action>,
) -> bool {
    let digest = mirror::digest(&job.status);
    if world.refused_status.get(&job.uid) == Some(&digest) || terminal(&job.status).is_some() {
        return false;
    }
    out.push(Action::WriteStatus {
        job: job.key.clone(),
        status: Box::new(mirror::concluded(&job.status, result, now)),
        digest,
    });
    true
}

fn requeue(
    job: &Job,
    out: &mut Vec<Action>,
    why: &'static str,
    message: String,
    counted: Option<(u32, SystemTime)>,
    avoid: Option<String>,
) {
    let (requeues, requeue_after) = match counted {
        Some((n, t)) => (n, Some(t)),
        None => (job.requeues, None),
    };
    out.push(Action::Requeue {
        job: job.key.clone(),
        reason: why,
        message,
        requeues,
        requeue_after,
        avoid,
    });
}

/// The copy ended (or the Job did): record the result, mirror the final status, then remove
/// the copy. The result is recorded first so that a final status the API server refuses
/// cannot make the Job run again.
fn finish(world: &World, job: &Job, live: &[&Copy], now: SystemTime, out: &mut Vec<Action>) {
    let copy = job
        .cluster
        .as_deref()
        .and_then(|c| live.iter().find(|x| x.cluster == c))
        .copied();
    let result = job
        .result
        .or_else(|| copy.and_then(|c| terminal(&c.status)))
        .or_else(|| terminal(&job.status));
    if job.result.is_none() {
        if let Some(r) = result {
            out.push(Action::RecordResult {
                job: job.key.clone(),
                result: r,
            });
        }
    }
    let mut written = terminal(&job.status).is_some();
    if !written {
        match copy {
            Some(copy) if terminal(&copy.status).is_some() => {
                let readiness = Readiness {
                    ready: copy.ready_pods(),
                    gang: job.gang(),
                };
                written = !write_status(world, job, copy, readiness, now, out);
            }
            // No final status from a copy: the outcome recorded says how it ended.
            _ => {
                if let Some(r) = result {
                    written = !write_concluded(world, job, r, now, out);
                }
            }
        }
    }
    if written {
        if let Some(copy) = copy {
            delete(world, out, copy, reason::FINISHED);
        }
    }
    release(world, job, out);
}

/// Mirrors the copy's status when it differs from the manager Job's; returns whether a write
/// was asked for.
fn write_status(
    world: &World,
    job: &Job,
    copy: &Copy,
    readiness: Readiness,
    now: SystemTime,
    out: &mut Vec<Action>,
) -> bool {
    let digest = mirror::digest(&copy.status);
    if world.refused_status.get(&job.uid) == Some(&digest) {
        return false;
    }
    let mut desired = mirror::mirrored(&job.status, &copy.status, readiness, now);
    // A Job running in its worker says it was admitted there, whatever an earlier write left:
    // a second dispatcher's mirror write can land between the unsuspend and the status that
    // says `Admitted`, and the one that wins the status keeps what the other had not written.
    let admitted = desired
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == super::condition::ADMITTED && c.status == "True");
    if !admitted {
        desired = super::status::admitted(&desired, &copy.cluster, job.admitted_at.unwrap_or(now));
    }
    if same_status(&desired, &job.status) {
        return false;
    }
    out.push(Action::WriteStatus {
        job: job.key.clone(),
        status: Box::new(desired),
        digest,
    });
    true
}

/// Equal but for condition transition times that only differ because nothing was stored yet.
fn same_status(
    a: &k8s_openapi::api::batch::v1::JobStatus,
    b: &k8s_openapi::api::batch::v1::JobStatus,
) -> bool {
    a == b
}

struct Wake(Option<SystemTime>);

impl Wake {
    fn at(&mut self, t: SystemTime) {
        self.0 = Some(self.0.map_or(t, |w| w.min(t)));
    }
}
