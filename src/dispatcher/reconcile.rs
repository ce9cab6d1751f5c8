//! One Job's next steps once it is claimed for a worker, or when its copies must go: finish
//! an interrupted dispatch, mirror the copy's status, enforce the PodsReady timeouts, requeue
//! when the worker is lost or the copy deleted, record the result and remove the copy when
//! the Job ends, remove copies that should not exist.

use super::action::Action;
use super::admission::hold_for;
use super::job::{rfc3339, to_system_time, Job, JobResult};
use super::mirror::{self, Readiness};
use super::state::{Worker, WorkerCopy};
use super::world::World;
use super::{condition, reason, status};
use crate::api::QueueSettings;
use std::time::SystemTime;

const SUSPENDED_MESSAGE: &str =
    "the Job was suspended; its copy is removed and it waits in its queue again";

/// Appends the Job's next actions to `out`; returns when it should be looked at again if
/// nothing changes before (a deadline).
pub(crate) fn reconcile(
    world: &World,
    job: &Job,
    now: SystemTime,
    out: &mut Vec<Action>,
) -> Option<SystemTime> {
    let live: Vec<&WorkerCopy> = world
        .state
        .copies_of(&job.uid)
        .filter(|c| !c.deleting)
        .collect();
    let mut step = Step {
        world,
        job,
        now,
        out,
        wake: None,
    };
    step.run(&live);
    step.wake
}

/// One Job's reconcile under way: what it reads, where its actions go, and when to look
/// again.
struct Step<'a> {
    world: &'a World,
    job: &'a Job,
    now: SystemTime,
    out: &'a mut Vec<Action>,
    wake: Option<SystemTime>,
}

/// How a Job leaves its worker when it is taken back.
struct TakeBack {
    why: &'static str,
    message: String,
    /// A counted requeue: the count and the end of its back-off.
    counted: Option<(u32, SystemTime)>,
    /// The worker the next attempt avoids.
    avoid: Option<String>,
}

impl TakeBack {
    fn uncounted(why: &'static str, message: String) -> Self {
        Self {
            why,
            message,
            counted: None,
            avoid: None,
        }
    }
}

impl<'a> Step<'a> {
    fn run(&mut self, live: &[&'a WorkerCopy]) {
        let job = self.job;
        // Copies that should not exist: anywhere but the claimed worker, or all of them.
        let keep = job.kept_clusters();
        for c in live {
            if !keep.contains(&c.cluster) {
                self.delete(c, why_unkept(job));
            }
        }
        if !job.deleting && job.result.is_none() {
            self.restore_status();
        }
        if job.deleting || job.deactivated.is_some() {
            return self.release();
        }
        if job.finished() {
            return self.finish(live);
        }
        let settings = self.world.state.settings(&job.queue);
        if job.cluster.is_none() && !job.offers.is_empty() {
            return self.offered(live, settings);
        }
        let Some(cluster) = job.cluster.as_deref() else {
            // Pending: a placement held for a dispatch that did not land goes; room kept for
            // it as it starves is admission's to keep or let go.
            if self
                .world
                .ledger
                .hold_of(&job.uid)
                .is_some_and(|h| h.nominated().is_none())
            {
                self.release();
            }
            return;
        };
        // The queue went away or broke: an admitted Job keeps running; nothing is timed.
        if let Some(settings) = settings {
            self.claimed(cluster, settings, live);
        }
    }

    /// The status that a requeue, a deactivation or an offer wrote after the Job's
    /// annotations, written again when the annotations landed and it did not: the writer
    /// patches the Job, then its status (two requests), and a leader that dies or a status
    /// patch that fails in between would otherwise leave the Job without the condition that
    /// says what happened to it (the next pass finds the Job already in its new state).
    fn restore_status(&mut self) {
        let (job, now) = (self.job, self.now);
        let is_true = |t: &str| job.condition(t).is_some_and(|c| c.status == "True");
        let pending = job.suspended && job.cluster.is_none() && job.offers.is_empty();
        let target = if let Some(message) = job
            .deactivated
            .as_deref()
            .filter(|_| !is_true(condition::DEACTIVATED))
        {
            status::deactivated(&job.status, message, now)
        } else if pending && job.requeues > 0 && job.condition(condition::REQUEUED).is_none() {
            let (why, message) = lost_requeue(job.requeues);
            status::requeued(&job.status, why, &message, now)
        } else if !job.suspended
            && job.cluster.is_none()
            && !job.offers.is_empty()
            && !is_true(condition::ADMITTED)
        {
            status::with_condition(
                &job.status,
                condition::ADMITTED,
                true,
                reason::DISPATCHED,
                &format!(
                    "offered to workers {}; the first to run all its pods keeps it",
                    job.offers.join(", ")
                ),
                now,
            )
        } else {
            return;
        };
        if self.refused_before(&job.status) {
            return;
        }
        self.out.push(Action::WriteStatus {
            job: job.key.clone(),
            status: Box::new(target),
            digest: job.status.digest(),
        });
    }

    fn at(&mut self, t: SystemTime) {
        self.wake = Some(self.wake.map_or(t, |w| w.min(t)));
    }

    /// A Job claimed for `cluster`.
    fn claimed(&mut self, cluster: &'a str, settings: &QueueSettings, live: &[&'a WorkerCopy]) {
        let Some(worker) = self.world.state.workers.get(cluster) else {
            let message = format!("worker {cluster} was removed");
            return self.take_back(TakeBack::uncounted(reason::WORKER_LOST, message));
        };
        if !worker.connected {
            return self.disconnected(worker, settings);
        }
        if !worker.copies_synced() {
            return;
        }
        match live.iter().find(|c| c.cluster == cluster).copied() {
            None => self.copy_missing(cluster),
            Some(copy) => self.copy_there(copy, settings, live),
        }
    }

    /// A short disconnect changes nothing; past workerLostTimeout the worker's Jobs are taken
    /// back (the manager assumes they are lost). Their copies are removed when the worker
    /// comes back, before anything else is dispatched there.
    fn disconnected(&mut self, worker: &Worker, settings: &QueueSettings) {
        let since = worker.disconnected_since.unwrap_or(self.now);
        let deadline = since + settings.worker_lost_timeout;
        if deadline > self.now {
            return self.at(deadline);
        }
        self.take_back(TakeBack {
            avoid: Some(worker.name.clone()),
            ..TakeBack::uncounted(
                reason::WORKER_LOST,
                format!(
                    "worker {} has been unreachable since {} (workerLostTimeout {}s); the Job is queued again",
                    worker.name,
                    rfc3339(since),
                    settings.worker_lost_timeout.as_secs()
                ),
            )
        });
    }

    /// The claimed worker shows no copy of the Job.
    fn copy_missing(&mut self, cluster: &str) {
        let (job, world) = (self.job, self.world);
        let retry_after = world.config.create_retry_after;
        let attempted = world.state.writes.create_attempted.get(&job.uid).copied();
        if job.suspended && job.admitted_at.is_none() {
            // Claimed, not yet created (or the create failed): create it, not too often; and
            // not while an earlier copy still runs in another worker (one that came back
            // after the Job was taken from it): that copy is removed first.
            if self.world.state.still_running_elsewhere(job, &[cluster]) {
                return;
            }
            match attempted {
                Some(t) if t + retry_after > self.now => self.at(t + retry_after),
                _ => self.out.push(Action::CreateCopy {
                    job: job.key.clone(),
                    cluster: cluster.to_string(),
                }),
            }
        } else if job.user_suspended() {
            self.take_back(TakeBack::uncounted(
                reason::SUSPENDED_BY_USER,
                SUSPENDED_MESSAGE.into(),
            ));
        } else if let Some(t) = attempted.map(|t| t + retry_after).filter(|t| *t > self.now) {
            // Created a moment ago: the create's answer may have been lost (its writes timed
            // out) and the worker's watch not caught up yet. Missing later, it was deleted.
            self.at(t);
        } else {
            self.take_back(TakeBack::uncounted(
                reason::REMOTE_DELETED,
                format!(
                    "the Job's copy in worker {cluster} was deleted there; the Job is queued again"
                ),
            ));
        }
    }

    /// The claimed worker has the Job's copy.
    fn copy_there(
        &mut self,
        copy: &'a WorkerCopy,
        settings: &QueueSettings,
        live: &[&'a WorkerCopy],
    ) {
        let job = self.job;
        if job.user_suspended() {
            self.delete(copy, reason::SUSPENDED_BY_USER);
            return self.take_back(TakeBack::uncounted(
                reason::SUSPENDED_BY_USER,
                SUSPENDED_MESSAGE.into(),
            ));
        }
        if job.suspended {
            return self.out.push(Action::Unsuspend {
                job: job.key.clone(),
                cluster: copy.cluster.clone(),
            });
        }
        if copy.status.terminal().is_some() {
            return self.finish(live);
        }
        if copy.kueue && copy.suspended {
            return self.in_worker_queue(copy, settings);
        }
        // Running: mirror, hold, PodsReady.
        let readiness = Readiness {
            ready: copy.ready_pods(job),
            gang: job.gang(),
        };
        self.write_status(copy, readiness);
        self.keep_hold(&copy.cluster, readiness);
        self.pods_ready_timeout(settings, &[copy], readiness, &copy.cluster);
    }

    /// A copy in a Kueue worker that the worker's Kueue has not admitted yet, or evicted (see
    /// the `kueue` module): the manager's Job says so (`WorkerAdmitted` False, the worker's
    /// reason) while it waits; past the queue's `workerAdmissionTimeout` it is taken back,
    /// uncounted, and tried elsewhere (its copy is then removed as no longer kept).
    fn in_worker_queue(&mut self, copy: &WorkerCopy, settings: &QueueSettings) {
        let (job, now) = (self.job, self.now);
        // From the dispatch (the manager's clock), or from the worker's Kueue suspending it
        // again after admitting it.
        let since = job
            .admitted_at
            .max(copy.status.suspended_since())
            .unwrap_or(now)
            .min(now);
        let deadline = since + settings.worker_admission_timeout;
        if deadline > now {
            self.at(deadline);
            let readiness = Readiness {
                ready: 0,
                gang: job.gang(),
            };
            self.write_status(copy, readiness);
            return;
        }
        let evicted = self
            .world
            .state
            .workers
            .get(&copy.cluster)
            .and_then(|w| w.queues.workloads.get(&copy.uid))
            .and_then(|w| w.evicted.clone());
        let timeout = format!("{}s", settings.worker_admission_timeout.as_secs());
        let message = match evicted {
            Some((why, what)) => format!(
                "worker {}'s Kueue evicted the Job ({why}: {what}) and did not admit it again within workerAdmissionTimeout ({timeout}); the Job is tried elsewhere",
                copy.cluster
            ),
            None => format!(
                "worker {}'s Kueue did not admit the Job within workerAdmissionTimeout ({timeout}); the Job is tried elsewhere",
                copy.cluster
            ),
        };
        self.take_back(TakeBack {
            why: reason::WORKER_NOT_ADMITTED,
            message,
            counted: None,
            avoid: Some(copy.cluster.clone()),
        });
    }

    /// The placement held for a running Job goes once its pods are all Ready, or after
    /// `hold_timeout`; a restarted dispatcher holds it again until then.
    fn keep_hold(&mut self, cluster: &str, readiness: Readiness) {
        let (job, world, now) = (self.job, self.world, self.now);
        // Room kept for it before it was claimed is not its placement (admission lets it go).
        let hold = world
            .ledger
            .hold_of(&job.uid)
            .filter(|h| h.nominated().is_none());
        let release = Action::Release {
            job_uid: job.uid.clone(),
        };
        if readiness.all() {
            if hold.is_some() {
                self.out.push(release);
            }
            return;
        }
        let since = hold.map_or(job.admitted_at.unwrap_or(now), |h| h.since);
        let until = since + world.config.hold_timeout;
        match hold {
            Some(_) if until <= now => self.out.push(release),
            Some(_) => self.at(until),
            // Restarted: its pods may not show in the inventory yet (never all Ready so far).
            None if until > now && never_ready(job) => {
                if let Some(h) = hold_for(&world.state, &world.config, job, cluster, since) {
                    self.out.push(Action::Hold(h));
                }
                self.at(until);
            }
            None => {}
        }
    }

    /// A Job offered to several workers at once (`placement.fanout` > 1): finish creating the
    /// copies, unsuspend, and hand the Job to the first copy whose pods are all Ready.
    fn offered(&mut self, live: &[&'a WorkerCopy], settings: Option<&QueueSettings>) {
        let (job, world) = (self.job, self.world);
        let copy_in = |c: &str| live.iter().find(|x| x.cluster == c).copied();
        if job.suspended && job.admitted_at.is_none() {
            return self.create_offers(live);
        }
        if job.user_suspended() {
            for c in live {
                self.delete(c, reason::SUSPENDED_BY_USER);
            }
            return self.take_back(TakeBack::uncounted(
                reason::SUSPENDED_BY_USER,
                "the Job was suspended; its copies are removed and it waits in its queue again"
                    .into(),
            ));
        }
        let gang = job.gang();
        for c in &job.offers {
            if let Some(copy) = copy_in(c) {
                if copy.ready_pods(job) >= gang || copy.status.terminal().is_some() {
                    return self.out.push(Action::Choose {
                        job: job.key.clone(),
                        cluster: c.clone(),
                    });
                }
            }
        }
        // Every offer gone: the workers deleted their copies, or were lost too long.
        let lost_timeout = settings.map_or(std::time::Duration::from_secs(900), |s| {
            s.worker_lost_timeout
        });
        let mut alive = 0;
        for c in &job.offers {
            match world.state.workers.get(c) {
                Some(w) if w.connected && (!w.copies_synced() || copy_in(c).is_some()) => {
                    alive += 1
                }
                Some(w) if w.connected => {}
                Some(w) => {
                    let deadline = w.disconnected_since.unwrap_or(self.now) + lost_timeout;
                    if deadline > self.now {
                        alive += 1;
                        self.at(deadline);
                    }
                }
                None => {}
            }
        }
        // Created a moment ago, or a worker could not say whether its copy is there: looked
        // at again after the wait (see `copy_missing`).
        let retry = world
            .state
            .writes
            .create_attempted
            .get(&job.uid)
            .map(|t| *t + world.config.create_retry_after)
            .filter(|t| *t > self.now);
        if let (0, Some(t)) = (alive, retry) {
            return self.at(t);
        }
        if alive == 0 {
            return self.take_back(TakeBack::uncounted(
                reason::REMOTE_DELETED,
                format!(
                    "none of the workers it was offered to ({}) has its copy any more; the Job is queued again",
                    job.offers.join(", ")
                ),
            ));
        }
        if let Some(settings) = settings {
            let best = live.iter().map(|c| c.ready_pods(job)).max().unwrap_or(0);
            let readiness = Readiness { ready: best, gang };
            self.pods_ready_timeout(settings, live, readiness, &job.offers.join(", "));
        }
    }

    /// The offered copies not created yet are created (not too often); once all are, the Job
    /// is unsuspended.
    fn create_offers(&mut self, live: &[&WorkerCopy]) {
        let (job, world) = (self.job, self.world);
        let usable = |c: &str| world.state.workers.get(c).is_some_and(|w| w.usable());
        let missing: Vec<&String> = job
            .offers
            .iter()
            .filter(|c| usable(c) && !live.iter().any(|x| &x.cluster == *c))
            .collect();
        if missing.is_empty() {
            return self.out.push(Action::Unsuspend {
                job: job.key.clone(),
                cluster: job.offers.join(", "),
            });
        }
        if world.state.still_running_elsewhere(job, &job.offers) {
            return;
        }
        let retry_after = world.config.create_retry_after;
        match world.state.writes.create_attempted.get(&job.uid).copied() {
            Some(t) if t + retry_after > self.now => self.at(t + retry_after),
            _ => {
                for c in missing {
                    self.out.push(Action::CreateCopy {
                        job: job.key.clone(),
                        cluster: c.clone(),
                    });
                }
            }
        }
    }

    /// Past `waitForPodsReady.timeout` since admission (or `recoveryTimeout` since the pods
    /// stopped being Ready): remove the copies and requeue with back-off, or give up at the
    /// requeuing limit.
    fn pods_ready_timeout(
        &mut self,
        settings: &QueueSettings,
        copies: &[&WorkerCopy],
        readiness: Readiness,
        cluster: &str,
    ) {
        let (job, now) = (self.job, self.now);
        let Some(wait) = &settings.wait_for_pods_ready else {
            return;
        };
        if readiness.all() {
            return;
        }
        // Judged on the condition as it is about to be written, not as it was: pods that were
        // Ready a moment ago are "lost", not "never Ready".
        let condition =
            mirror::pods_ready_condition(job.status.conditions(), readiness, false, now);
        let (deadline, why, what) = if condition.reason.as_deref() == Some(mirror::LOST) {
            let Some(recovery) = wait.recovery_timeout else {
                return;
            };
            let since = condition
                .last_transition_time
                .as_ref()
                .map(|t| to_system_time(&t.0))
                .unwrap_or(now);
            (
                since + recovery,
                reason::PODS_READY_LOST,
                "its pods stopped being Ready",
            )
        } else {
            // From the admission, or, in a Kueue worker, from its Kueue's admission.
            let resumed = copies
                .iter()
                .filter(|c| c.kueue)
                .filter_map(|c| c.status.resumed_at())
                .max();
            let since = job.admitted_at.max(resumed).unwrap_or(now);
            (
                since + wait.timeout,
                reason::PODS_READY_TIMEOUT,
                "its pods were not all Ready",
            )
        };
        if deadline > now {
            return self.at(deadline);
        }
        let message = format!(
            "{what} in time in worker {cluster} ({} of {} Ready)",
            readiness.ready, readiness.gang
        );
        // The requeue (its count, back-off and reason) is written first; the copies go once it
        // has landed, as copies of a Job that no longer keeps them. Deleted first, a failed or
        // interrupted requeue write would leave a claimed Job without its copy, which reads as
        // "deleted in the worker": requeued again uncounted, without back-off.
        self.release();
        if let Some(result) = job.status.decided() {
            return self.conclude(result);
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
            self.requeue(TakeBack {
                why,
                message: format!(
                    "{message}; requeued ({n} so far), next attempt not before {}",
                    rfc3339(after)
                ),
                counted: Some((n, after)),
                avoid,
            });
        } else {
            self.out.push(Action::Deactivate {
                job: job.key.clone(),
                message: format!(
                    "{message}; given up after {} requeues (waitForPodsReady.requeuing.limit)",
                    job.requeues
                ),
            });
        }
    }

    fn delete(&mut self, c: &WorkerCopy, why: &'static str) {
        // An unreachable worker's copies are removed when it answers again.
        if let Some(action) = deletion(self.world, c, why) {
            self.out.push(action);
        }
    }

    fn release(&mut self) {
        if self.world.ledger.hold_of(&self.job.uid).is_some() {
            self.out.push(Action::Release {
                job_uid: self.job.uid.clone(),
            });
        }
    }

    /// Takes the Job back from its worker: requeued, unless its worker had already decided
    /// how it ends (`SuccessCriteriaMet` or `FailureTarget` True, which the API server never
    /// lets a Job's status drop): then it ends that way, as the Job controller would end it.
    /// Its placement goes.
    fn take_back(&mut self, how: TakeBack) {
        match self.job.status.decided() {
            Some(result) => self.conclude(result),
            None => self.requeue(how),
        }
        self.release();
    }

    fn requeue(&mut self, how: TakeBack) {
        let (requeues, requeue_after) = match how.counted {
            Some((n, t)) => (n, Some(t)),
            None => (self.job.requeues, None),
        };
        self.out.push(Action::Requeue {
            job: self.job.key.clone(),
            reason: how.why,
            message: how.message,
            requeues,
            requeue_after,
            avoid: how.avoid,
        });
    }

    /// The Job ends as its worker decided, its copy gone: the result and the final status.
    fn conclude(&mut self, result: JobResult) {
        if self.job.result.is_none() {
            self.out.push(Action::RecordResult {
                job: self.job.key.clone(),
                result,
            });
        }
        self.write_concluded(result);
    }

    /// Writes the final status of a Job whose copy cannot give it (gone, or not finished
    /// there); returns whether a write was asked for.
    fn write_concluded(&mut self, result: JobResult) -> bool {
        let job = self.job;
        if self.refused_before(&job.status) || job.status.terminal().is_some() {
            return false;
        }
        self.out.push(Action::WriteStatus {
            job: job.key.clone(),
            status: Box::new(job.status.concluded(result, self.now)),
            digest: job.status.digest(),
        });
        true
    }

    /// The copy ended (or the Job did): record the result, mirror the final status, then
    /// remove the copy. The result is recorded first so that a final status the API server
    /// refuses cannot make the Job run again.
    fn finish(&mut self, live: &[&'a WorkerCopy]) {
        let job = self.job;
        let copy = job
            .cluster
            .as_deref()
            .and_then(|c| live.iter().find(|x| x.cluster == c))
            .copied();
        let result = job
            .result
            .or_else(|| copy.and_then(|c| c.status.terminal()))
            .or_else(|| job.status.terminal());
        if job.result.is_none() {
            if let Some(r) = result {
                self.out.push(Action::RecordResult {
                    job: job.key.clone(),
                    result: r,
                });
            }
        }
        let mut written = job.status.terminal().is_some();
        if !written {
            match copy {
                Some(copy) if copy.status.terminal().is_some() => {
                    let readiness = Readiness {
                        ready: copy.ready_pods(job),
                        gang: job.gang(),
                    };
                    written = !self.write_status(copy, readiness);
                }
                // No final status from a copy: the outcome recorded says how it ended.
                _ => {
                    if let Some(r) = result {
                        written = !self.write_concluded(r);
                    }
                }
            }
        }
        if written {
            if let Some(copy) = copy {
                self.delete(copy, reason::FINISHED);
            }
        }
        self.release();
    }

    /// `status` with the `WorkerAdmitted` condition of a copy in a Kueue worker: True once the
    /// worker's Kueue admitted it; False while it waits there, with the worker's reason.
    fn worker_admitted(
        &self,
        status: &super::kind::Status,
        copy: &WorkerCopy,
    ) -> super::kind::Status {
        let workload = self
            .world
            .state
            .workers
            .get(&copy.cluster)
            .and_then(|w| w.queues.workloads.get(&copy.uid));
        let (ok, why, message) = match (copy.suspended, workload.and_then(|w| w.evicted.as_ref())) {
            (false, _) => (
                true,
                "Admitted".to_string(),
                format!("admitted by worker {}'s Kueue", copy.cluster),
            ),
            (true, Some((why, what))) => (
                false,
                why.clone(),
                format!(
                    "worker {}'s Kueue evicted the copy: {what}; waiting for it to admit it again",
                    copy.cluster
                ),
            ),
            (true, None) => (
                false,
                "Pending".to_string(),
                format!(
                    "waiting for worker {}'s Kueue to admit the copy under its own quota",
                    copy.cluster
                ),
            ),
        };
        super::status::with_condition(
            status,
            super::condition::WORKER_ADMITTED,
            ok,
            &why,
            &message,
            self.now,
        )
    }

    /// Mirrors the copy's status when it differs from the manager Job's; returns whether a
    /// write was asked for.
    fn write_status(&mut self, copy: &WorkerCopy, readiness: Readiness) -> bool {
        let (job, now) = (self.job, self.now);
        if self.refused_before(&copy.status) {
            return false;
        }
        let mut desired = job.status.mirrored(&copy.status, readiness, now);
        // A Job running in its worker says it was admitted there, whatever an earlier write
        // left: a second dispatcher's mirror write can land between the unsuspend and the
        // status that says `Admitted`, and the one that wins the status keeps what the other
        // had not written.
        let admitted = desired
            .conditions()
            .iter()
            .any(|c| c.type_ == super::condition::ADMITTED && c.status == "True");
        if !admitted {
            desired =
                super::status::admitted(&desired, &copy.cluster, job.admitted_at.unwrap_or(now));
        }
        // A Job dispatched again before the status of its requeue was restored (the leader
        // that requeued it died between its two writes, and the back-off had passed when
        // the next one read it) still says it was requeued: the count is in its annotations.
        let requeue_shown = desired
            .conditions()
            .iter()
            .any(|c| c.type_ == super::condition::REQUEUED);
        if job.requeues > 0 && !requeue_shown {
            let (why, message) = lost_requeue(job.requeues);
            desired = super::status::with_condition(
                &desired,
                super::condition::REQUEUED,
                true,
                why,
                &message,
                now,
            );
        }
        if copy.kueue {
            desired = self.worker_admitted(&desired, copy);
            // The worker's Kueue suspends and resumes the copy, not the manager's Job (which
            // is not suspended): `WorkerAdmitted` says it, a mirrored `Suspended` would not.
            desired.conditions_mut().retain(|c| c.type_ != "Suspended");
        }
        if desired == job.status {
            return false;
        }
        self.out.push(Action::WriteStatus {
            job: job.key.clone(),
            status: Box::new(desired),
            digest: copy.status.digest(),
        });
        true
    }

    /// Whether the API server already refused the status write made from `from` (the same
    /// status, by digest) for this Job. The digest is taken only for a Job with a refusal.
    fn refused_before(&self, from: &super::kind::Status) -> bool {
        self.world
            .state
            .writes
            .refused_status
            .get(&self.job.uid)
            .is_some_and(|refused| *refused == from.digest())
    }
}

/// The `Requeued` condition of a counted requeue whose own status write was lost: only a
/// PodsReady timeout (or Ready pods lost) counts one; which of the two it was went with the
/// lost write.
fn lost_requeue(requeues: u32) -> (&'static str, String) {
    (
        reason::PODS_READY_TIMEOUT,
        format!("its pods were not all Ready in time; requeued ({requeues} so far)"),
    )
}

/// The reasons a copy is removed because the manager Job, as this dispatcher sees it, does not
/// keep it (see [`why_unkept`] and [`collect_garbage`]). A view can be behind the workers'
/// (a second dispatcher claimed the Job a moment ago, a list served from a cache): the live
/// executor reads the Job again before removing a copy for one of these.
pub(crate) const UNKEPT: [&str; 5] = [
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
pub(crate) fn collect_garbage(world: &World, out: &mut Vec<Action>) {
    if !world.state.jobs_synced {
        return;
    }
    for c in world.state.orphans() {
        if !c.deleting {
            out.extend(deletion(world, c, reason::ORPHANED_COPY));
        }
    }
}

/// The removal of a copy, unless its worker is unreachable (then it is removed when the
/// worker answers again).
fn deletion(world: &World, c: &WorkerCopy, why: &'static str) -> Option<Action> {
    world
        .state
        .workers
        .get(&c.cluster)
        .is_some_and(|w| w.connected)
        .then(|| Action::DeleteCopy {
            cluster: c.cluster.clone(),
            job: c.key.clone(),
            uid: c.uid.clone(),
            origin_uid: c.origin_uid.clone(),
            reason: why,
        })
}
