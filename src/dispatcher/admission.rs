//! Queue admission: which pending Jobs are dispatched now, and where; and why the others wait.
//!
//! Jobs are taken in one order across all queues: higher priority first, then older. A Job is
//! admitted when
//! 1. its queue exists and is valid, its namespace matches the queue's namespaceSelector and
//!    its pod template can be read;
//! 2. the queue's PodsReady gate is open (with `blockAdmission`, every Job the queue admitted
//!    before is Ready);
//! 3. the queue's quota covers its whole gang (pods × per-pod request);
//! 4. the whole gang fits, node by node and NUMA zone by NUMA zone, in one of the queue's
//!    workers that no Job is kept from: the best-scoring worker wins (the one its last attempt
//!    failed in only when no other fits), or the best `fanout` are offered the Job at once.
//!
//! Starvation, both ways:
//! - A Job that cannot be admitted does not block the Jobs behind it: they are tried in turn
//!   and take whatever fits (backfill). Jobs that can never fit (more than the queue's whole
//!   quota, larger than any worker even empty) never block anyone.
//! - A Job that has waited `starvation_after` for capacity stops being overtaken: the quota
//!   it needs is held for it, and one worker where it would fit once that worker's running
//!   Jobs end is kept for it (no Job behind it is placed there). As that worker drains, the
//!   starving Job gets it.
//!
//! Pending Jobs that are interchangeable (same queue, namespace, pod template and gang size)
//! form a class; when the first of a class cannot be admitted, none of the rest can, so a pass
//! costs one judgement per class, not one per Job. Whether a gang fits, and whether a class's
//! last verdict still stands, are asked of an [`Oracle`]; the decisions here are the same
//! whichever oracle answers.

mod heads;
pub(crate) mod quota;

use super::job::{rfc3339, ClassKey, Job, JobKey};
use super::ledger::{Hold, Ledger};
use super::oracle::{Circumstances, Fit, Gang, Oracle, Verdict};
use super::reason;
use super::state::State;
use super::world::{DispatchConfig, Placement};
use super::Action;
use crate::api::QueueSettings;
use crate::placement::inflight::Take;
use crate::placement::PodShape;
use foldhash::{HashMap, HashMapExt as _};
use heads::Heads;
use quota::{Amounts, Quota, QuotaCheck, Resources};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

/// Why a Job waits: a reason (one of [`reason`]) and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitReason {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// What one admission pass decided.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// Dispatches and offers, in admission order.
    pub(crate) actions: Vec<Action>,
    /// Why each class that was looked at and not (fully) admitted waits: its first waiting
    /// Job's reason, which is every later Job's of the class too. Kept when messages are
    /// asked for (`simulate` asks only for its last look).
    pub(crate) waiting: BTreeMap<ClassKey, WaitReason>,
    /// Jobs kept out for a reason of their own (a worker that refused them is backing off,
    /// an older Job of the same name is still being removed): the rest of their class is
    /// tried.
    pub(crate) job_waiting: BTreeMap<JobKey, WaitReason>,
    /// When the pass could decide differently without any object changing (a back-off
    /// ends, a Job starts starving).
    pub(crate) wake_at: Option<SystemTime>,
}

impl Admission {
    fn wake(&mut self, at: SystemTime) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }
}

/// The result of trying one Job.
enum Attempt {
    Dispatch {
        cluster: String,
        takes: Vec<Take>,
    },
    Offer {
        clusters: Vec<String>,
    },
    /// The Job waits, and so does the rest of its class.
    Wait(Verdict),
    /// The Job waits for a reason of its own; the rest of its class is tried.
    WaitAlone(Verdict),
}

/// One queue during a pass.
#[derive(Default)]
struct QueueState {
    /// What its admitted Jobs use, and what the pass admitted so far.
    usage: Amounts,
    /// Quota held for starving Jobs earlier in the order.
    held: Amounts,
    /// With `blockAdmission`: an admitted Job not yet Ready, and its worker(s).
    gate: Option<(JobKey, String)>,
    /// The quota in force, found once per pass.
    quota: Option<Arc<Quota>>,
    usable: UsableWorkers,
}

/// The workers kept for starving Jobs so far in a pass, with the Job each is kept for, in
/// the order they were first kept.
#[derive(Default)]
struct Reserved {
    by_worker: BTreeMap<String, JobKey>,
    order: Vec<String>,
}

impl Reserved {
    fn insert(&mut self, worker: String, job: JobKey) {
        if let Some(was) = self.by_worker.get_mut(&worker) {
            *was = job;
        } else {
            self.order.push(worker.clone());
            self.by_worker.insert(worker, job);
        }
    }
}

/// A queue's workers no Job is kept from in the pass: not unusable, not kept for a starving
/// Job. Found once, and found again only from what changed: within a pass, why a worker is
/// unusable is fixed and reservations only grow.
#[derive(Default)]
struct UsableWorkers {
    /// The list (positions in the queue's list), and how many workers were reserved then.
    found: Option<(usize, Arc<[usize]>)>,
}

impl UsableWorkers {
    fn get<'w>(
        &mut self,
        workers: &'w [String],
        reserved: &Reserved,
        mut usable: impl FnMut(&'w str) -> bool,
    ) -> Arc<[usize]> {
        let list = match &self.found {
            Some((n, list)) if *n == reserved.order.len() => return list.clone(),
            Some((n, before)) => {
                let added = &reserved.order[*n..];
                let kept = |i: &usize| !added.contains(&workers[*i]);
                if before.iter().all(kept) {
                    before.clone()
                } else {
                    before.iter().copied().filter(kept).collect()
                }
            }
            None => (0..workers.len())
                .filter(|&i| usable(&workers[i]))
                .collect(),
        };
        self.found = Some((reserved.order.len(), list.clone()));
        list
    }
}

/// A worker that fits the gang, as admission ranks them.
struct Candidate<'w> {
    /// Not the worker the Job's last attempt failed in.
    preferred: bool,
    score: i64,
    /// Its position in the queue's list.
    order: usize,
    name: &'w str,
}

/// Why a worker cannot take the gang.
struct WorkerReason<'w> {
    worker: &'w str,
    why: String,
    /// Not even empty.
    never: bool,
}

/// What asking about a gang in the queue's workers found.
struct Search<'w> {
    /// The workers it fits.
    fits: Vec<Candidate<'w>>,
    /// Why each other worker cannot take it.
    reasons: Vec<WorkerReason<'w>>,
    /// The kind of reason of the workers kept from this Job alone, if any.
    own: Option<&'static str>,
    /// Some worker of the queue could not be asked about (kept from every Job now).
    unseen: bool,
}

/// Why the Job cannot go to a worker for a reason of its own.
struct OwnBlocker {
    reason: &'static str,
    message: String,
    until: Option<SystemTime>,
}

/// One admission pass over every queue's pending Jobs.
pub(crate) fn admit<'w>(
    state: &'w State,
    ledger: &'w Ledger,
    config: &'w DispatchConfig,
    now: SystemTime,
    oracle: &mut impl Oracle<'w>,
) -> Admission {
    let mut pass = Pass::new(state, ledger, config, now);
    let mut heads = Heads::new(state, ledger, now, &mut pass.out);
    while let Some(head) = heads.next() {
        let slot = pass.slot_of(head.job);
        let attempt = pass.attempt(head.job, head.class, slot, oracle);
        if pass.record(head.job, head.class, slot, attempt) {
            heads.move_on(head.index, &mut pass.out);
        }
    }
    pass.out
}

/// An admission pass under way.
struct Pass<'w> {
    state: &'w State,
    config: &'w DispatchConfig,
    now: SystemTime,
    /// By slot; a Job's queue's slot is found once per look.
    queues: Vec<QueueState>,
    slots: HashMap<&'w str, usize>,
    resources: Resources<'w>,
    reserved: Reserved,
    /// Per worker, why no Job may go there in this pass (reservations aside), found once.
    unusable: HashMap<&'w str, Option<String>>,
    out: Admission,
}

impl<'w> Pass<'w> {
    fn new(
        state: &'w State,
        ledger: &'w Ledger,
        config: &'w DispatchConfig,
        now: SystemTime,
    ) -> Self {
        let resources = Resources::new(state, ledger);
        let mut queues = Vec::new();
        let mut slots = HashMap::new();
        for (name, u) in ledger.queue_uses() {
            let gate = state.queues.get(name).and_then(|q| {
                let s = q.settings.as_ref().ok()?;
                if !s.wait_for_pods_ready.as_ref()?.block_admission {
                    return None;
                }
                let first = u.not_ready.iter().next()?;
                let job = state.jobs.get(&first.key)?;
                Some((job.key.clone(), job.cluster.clone().unwrap_or_default()))
            });
            slots.insert(name.as_str(), queues.len());
            queues.push(QueueState {
                usage: resources.amounts(&u.usage),
                held: vec![0; resources.len()],
                gate,
                ..Default::default()
            });
        }
        Self {
            state,
            config,
            now,
            queues,
            slots,
            resources,
            reserved: Reserved::default(),
            unusable: HashMap::new(),
            out: Admission::default(),
        }
    }

    /// The slot of the Job's queue.
    fn slot_of(&mut self, job: &'w Job) -> usize {
        if let Some(&slot) = self.slots.get(job.queue.as_str()) {
            return slot;
        }
        let slot = self.queues.len();
        self.queues.push(QueueState {
            usage: vec![0; self.resources.len()],
            held: vec![0; self.resources.len()],
            ..Default::default()
        });
        self.slots.insert(job.queue.as_str(), slot);
        slot
    }

    /// A message for people, built only when messages are asked for (`simulate` asks only
    /// at the end, for the Jobs still waiting).
    fn say(&self, message: impl FnOnce() -> String) -> String {
        if self.config.describe {
            message()
        } else {
            String::new()
        }
    }

    /// Tries the first waiting Job of a class.
    fn attempt(
        &mut self,
        job: &'w Job,
        class: &'w ClassKey,
        slot: usize,
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        let (settings, shape) = match self.gates(job, slot) {
            Ok(open) => open,
            Err(wait) => return Attempt::Wait(wait),
        };
        let starving = self
            .now
            .duration_since(job.waiting_since())
            .unwrap_or_default()
            >= self.config.starvation_after;
        if !starving {
            self.out
                .wake(job.waiting_since() + self.config.starvation_after);
        }
        if let Some(wait) = self.quota_wait(job, settings, slot, starving) {
            return Attempt::Wait(wait);
        }
        let usable = self.usable_workers(settings, slot);
        let now = Circumstances {
            queue: &job.queue,
            queue_slot: slot,
            workers: &settings.clusters,
            starving,
            usable: &usable,
        };
        // A Job kept from some worker for a reason of its own is judged on its own: its
        // class's last verdict does not know that reason (and would hide it from the user).
        if !self.has_own_blocker(job, &settings.clusters) {
            if let Some(verdict) = oracle.recall(class, &now) {
                return Attempt::Wait(verdict);
            }
        }
        let gang = Gang {
            class,
            job,
            shape,
            pods: job.gang() as usize,
            strategy: shape.strategy(settings.strategy),
        };
        let mut asked = Vec::new();
        let search = self.search(&gang, settings, &now, &mut asked, oracle);
        let attempt = if search.fits.is_empty() {
            self.no_fit(&gang, &now, settings, search, &asked, oracle)
        } else {
            self.choose(&gang, settings, search.fits, oracle)
        };
        if let Attempt::Wait(verdict) = &attempt {
            oracle.remember(class, &now, verdict, &asked);
        }
        attempt
    }

    /// What is decided before quota and placement: the queue, the namespace, the pod
    /// template and the PodsReady gate.
    fn gates(
        &self,
        job: &'w Job,
        slot: usize,
    ) -> Result<(&'w QueueSettings, &'w PodShape), Verdict> {
        let wait = |reason, message| Verdict::wait(reason, message);
        let Some(queue) = self.state.queues.get(&job.queue) else {
            return Err(wait(reason::QUEUE_NOT_FOUND, self.say(|| format!(
                "queue {:?} does not exist: create a DispatchQueue named {:?}, or label the Job with an existing queue",
                job.queue, job.queue
            ))));
        };
        let settings = match &queue.settings {
            Ok(s) => s,
            Err(e) => {
                return Err(wait(
                    reason::QUEUE_INVALID,
                    self.say(|| format!("queue {:?} is not usable: {e}", job.queue)),
                ))
            }
        };
        if !namespace_allowed(job, settings) {
            return Err(wait(
                reason::NAMESPACE_NOT_ALLOWED,
                self.say(|| {
                    format!(
                        "namespace {} does not match the namespaceSelector of queue {:?}",
                        job.key.namespace, job.queue
                    )
                }),
            ));
        }
        let shape = match &job.pod {
            Ok(shape) => shape,
            Err(e) => return Err(wait(reason::INVALID_JOB, e.clone())),
        };
        if let Some((other, cluster)) = &self.queues[slot].gate {
            return Err(wait(reason::WAITING_FOR_PODS_READY, self.say(|| format!(
                "queue {:?} admits one Job at a time until its pods are Ready (blockAdmission): waiting for {other} in {cluster}",
                job.queue
            ))));
        }
        Ok((settings, shape))
    }

    /// Why the Job waits for quota, if it does: its queue's quota does not cover its whole
    /// gang now (a starving Job's quota is held for it from now on), or never will.
    fn quota_wait(
        &mut self,
        job: &'w Job,
        settings: &'w QueueSettings,
        slot: usize,
        starving: bool,
    ) -> Option<Verdict> {
        let quota = self.quota(settings, slot);
        let describe = self.config.describe;
        let queue = &self.queues[slot];
        let check = quota::check(
            job,
            &self.resources,
            &quota,
            &queue.usage,
            &queue.held,
            describe,
        );
        match check {
            QuotaCheck::Covered => None,
            QuotaCheck::Never(what) => Some(Verdict::wait(
                reason::NEVER_FITS,
                self.say(|| {
                    format!(
                        "the gang of {} pods needs more than queue {:?} can ever give: {what}",
                        job.gang(),
                        job.queue
                    )
                }),
            )),
            QuotaCheck::Short(what) => {
                let mut message = self.say(|| {
                    format!(
                        "waiting for quota in queue {:?}: the gang of {} pods needs {what}",
                        job.queue,
                        job.gang()
                    )
                });
                if starving && describe {
                    message.push_str("; its quota is held for it from now on");
                }
                let mut verdict = Verdict::wait(reason::QUOTA_EXCEEDED, message);
                verdict.hold_quota = starving;
                Some(verdict)
            }
        }
    }

    /// Asks about the gang in each worker of the queue that no Job is kept from, and not
    /// kept from this Job alone.
    fn search(
        &mut self,
        gang: &Gang<'w>,
        settings: &'w QueueSettings,
        now: &Circumstances<'_>,
        asked: &mut Vec<usize>,
        oracle: &mut impl Oracle<'w>,
    ) -> Search<'w> {
        let job = gang.job;
        // Only a Job refused somewhere, or whose name a copy of another Job holds, is kept
        // from some worker for a reason of its own.
        let may_be_kept =
            !job.refusals.is_empty() || self.state.has_foreign_copy(&job.key, &job.uid);
        let to_ask: Vec<&'w str> = now
            .usable
            .iter()
            .map(|&i| settings.clusters[i].as_str())
            .filter(|name| !may_be_kept || self.own_blocker(job, name).is_none())
            .collect();
        oracle.prepare(gang, now, &to_ask);

        // When messages are written, every worker is gone through, so that each one's reason
        // is given in the queue's order.
        let every: Arc<[usize]>;
        let look_at = if self.config.describe {
            every = (0..settings.clusters.len()).collect();
            &every
        } else {
            now.usable
        };
        let check_each = look_at.len() != now.usable.len();
        let mut search = Search {
            fits: Vec::new(),
            reasons: Vec::new(),
            own: None,
            unseen: now.usable.len() < settings.clusters.len(),
        };
        for &order in look_at.iter() {
            let name = settings.clusters[order].as_str();
            if let Some(why) = check_each.then(|| self.unusable_now(name)).flatten() {
                search.reasons.push(WorkerReason {
                    worker: name,
                    why,
                    never: false,
                });
                continue;
            }
            if let Some(b) = may_be_kept.then(|| self.own_blocker(job, name)).flatten() {
                if let Some(t) = b.until {
                    self.out.wake(t);
                }
                search.own = Some(match search.own {
                    Some(reason::WORKER_REFUSED) => reason::WORKER_REFUSED,
                    _ => b.reason,
                });
                search.reasons.push(WorkerReason {
                    worker: name,
                    why: b.message,
                    never: false,
                });
                continue;
            }
            asked.push(order);
            let fit = match self.config.placement {
                // No judgement: every usable worker is offered the Job.
                Placement::Everywhere => Fit::Fits(0),
                Placement::Exact | Placement::SumOfFree => oracle.fit(gang, name, order),
            };
            match fit {
                Fit::Fits(score) => search.fits.push(Candidate {
                    preferred: self.config.placement == Placement::Everywhere
                        || job.avoid.as_deref() != Some(name),
                    score,
                    order,
                    name,
                }),
                Fit::Misfit { reason, never } => search.reasons.push(WorkerReason {
                    worker: name,
                    why: reason,
                    never,
                }),
            }
        }
        search
    }

    /// Dispatches the Job to the best of the workers that fit it, or offers it to the best
    /// `fanout` of them at once.
    fn choose(
        &mut self,
        gang: &Gang<'w>,
        settings: &QueueSettings,
        mut fits: Vec<Candidate<'w>>,
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        // Best first: not the worker the last attempt failed in, highest score, queue order.
        fits.sort_by_key(|f| Reverse((f.preferred, f.score, Reverse(f.order))));
        let fanout = match self.config.placement {
            Placement::Everywhere => fits.len(),
            _ => settings.fanout,
        };
        if fits.len() > 1 && fanout > 1 {
            return Attempt::Offer {
                clusters: fits
                    .iter()
                    .take(fanout)
                    .map(|f| f.name.to_string())
                    .collect(),
            };
        }
        let best = fits[0].name;
        match oracle.place(gang, best) {
            Some(takes) => Attempt::Dispatch {
                cluster: best.to_string(),
                takes,
            },
            None => Attempt::Wait(Verdict::wait(
                reason::NO_WORKER_FITS,
                "the inventory changed".into(),
            )),
        }
    }

    /// Why a Job that fits no worker now waits. A starving Job has a worker kept for it, the
    /// one where it would fit best once that worker drains.
    fn no_fit(
        &mut self,
        gang: &Gang<'w>,
        now: &Circumstances<'_>,
        settings: &'w QueueSettings,
        search: Search<'w>,
        candidates: &[usize],
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        let Search {
            reasons,
            own,
            unseen,
            ..
        } = search;
        let job = gang.job;
        // The Job's own reason when some worker is kept from it alone (then a refusal's
        // back-off is the reason to show), else its class's.
        let wait = |why: &'static str, message: String| {
            let verdict = Verdict::wait(why, message);
            match own {
                None => Attempt::Wait(verdict),
                Some(kind) if kind == reason::WORKER_REFUSED => Attempt::WaitAlone(Verdict {
                    reason: kind,
                    ..verdict
                }),
                Some(_) => Attempt::WaitAlone(verdict),
            }
        };
        if candidates.is_empty() {
            return wait(
                reason::NO_ACTIVE_WORKER,
                self.say(|| {
                    format!(
                        "no worker of queue {:?} can take Jobs now: {}",
                        job.queue,
                        join(&reasons)
                    )
                }),
            );
        }
        let all_never = reasons.iter().all(|r| r.never);
        if self.config.placement == Placement::Exact && (now.starving || all_never) {
            match drained_best(gang, settings, candidates, oracle) {
                // A worker that could not be looked at might still hold it: a short
                // disconnect does not make a Job "never fits".
                None if own.is_some() || unseen => {}
                None => {
                    return wait(
                        reason::NEVER_FITS,
                        self.say(|| {
                            format!(
                            "no worker of queue {:?} could hold the gang of {} pods even empty: {}",
                            job.queue,
                            job.gang(),
                            join(&reasons)
                        )
                        }),
                    )
                }
                Some(name) if now.starving => {
                    let message = self.say(|| format!(
                        "no worker can take the gang of {} pods now; waiting since {}, so worker {name} is kept for it as it drains: {}",
                        job.gang(),
                        rfc3339(job.waiting_since()),
                        join(&reasons)
                    ));
                    let mut attempt = wait(reason::NO_WORKER_FITS, message);
                    if let Attempt::Wait(v) | Attempt::WaitAlone(v) = &mut attempt {
                        v.reserve = Some(name.to_string());
                        v.hold_quota = true;
                    }
                    return attempt;
                }
                Some(_) => {}
            }
        }
        wait(
            reason::NO_WORKER_FITS,
            self.say(|| {
                format!(
                    "no worker can take the gang of {} pods now: {}",
                    job.gang(),
                    join(&reasons)
                )
            }),
        )
    }

    /// Carries out what the attempt decided for the pass; returns whether the class moves on
    /// to its next Job.
    fn record(&mut self, job: &'w Job, class: &ClassKey, slot: usize, attempt: Attempt) -> bool {
        let blocks = blocks_admission(self.state, job);
        match attempt {
            Attempt::Dispatch { cluster, takes } => {
                let queue = &mut self.queues[slot];
                self.resources.add(&mut queue.usage, job);
                if blocks {
                    queue.gate = Some((job.key.clone(), cluster.clone()));
                }
                self.out.actions.push(Action::Dispatch {
                    job: job.key.clone(),
                    cluster: cluster.clone(),
                    hold: Hold {
                        job_uid: job.uid.clone(),
                        cluster,
                        takes,
                        since: self.now,
                        serial: 0,
                    },
                });
                true
            }
            Attempt::Offer { clusters } => {
                let queue = &mut self.queues[slot];
                self.resources.add(&mut queue.usage, job);
                if blocks {
                    queue.gate = Some((job.key.clone(), clusters.join(", ")));
                }
                self.out.actions.push(Action::Offer {
                    job: job.key.clone(),
                    clusters,
                });
                true
            }
            Attempt::Wait(verdict) => {
                self.hold_for(job, slot, &verdict);
                if self.config.describe {
                    self.out.waiting.insert(class.clone(), verdict.into());
                }
                false
            }
            Attempt::WaitAlone(verdict) => {
                self.hold_for(job, slot, &verdict);
                self.out.job_waiting.insert(job.key.clone(), verdict.into());
                true
            }
        }
    }

    /// What a starving Job's wait holds: a worker kept for it, its queue's quota.
    fn hold_for(&mut self, job: &'w Job, slot: usize, verdict: &Verdict) {
        if let Some(worker) = &verdict.reserve {
            self.reserved.insert(worker.clone(), job.key.clone());
        }
        if verdict.hold_quota {
            self.resources.add(&mut self.queues[slot].held, job);
        }
    }

    /// The queue's quota in force, found once per pass.
    fn quota(&mut self, settings: &QueueSettings, slot: usize) -> Arc<Quota> {
        let (state, now, resources) = (self.state, self.now, &self.resources);
        self.queues[slot]
            .quota
            .get_or_insert_with(|| Arc::new(resources.quota(state, settings, now)))
            .clone()
    }

    /// The queue's workers no Job is kept from now.
    fn usable_workers(&mut self, settings: &'w QueueSettings, slot: usize) -> Arc<[usize]> {
        let state = self.state;
        let (unusable, reserved) = (&mut self.unusable, &self.reserved);
        self.queues[slot]
            .usable
            .get(&settings.clusters, reserved, |name| {
                unusable
                    .entry(name)
                    .or_insert_with(|| why_unusable(state, name))
                    .is_none()
                    && !reserved.by_worker.contains_key(name)
            })
    }

    /// Why no Job may go to `name` now, if none may.
    fn unusable_now(&mut self, name: &'w str) -> Option<String> {
        let state = self.state;
        let base = self
            .unusable
            .entry(name)
            .or_insert_with(|| why_unusable(state, name));
        if base.is_some() {
            return base.clone();
        }
        let other = self.reserved.by_worker.get(name)?;
        Some(self.say(|| format!("kept for {other}, which has waited longest")))
    }

    /// Why the Job cannot go to `name` in particular (other Jobs of its class may go
    /// there), and when that may end by itself.
    fn own_blocker(&self, job: &Job, name: &str) -> Option<OwnBlocker> {
        if let Some(r) = job.refused_by(name, self.now) {
            let times = if r.count > 1 {
                format!(" ({} times in a row)", r.count)
            } else {
                String::new()
            };
            return Some(OwnBlocker {
                reason: reason::WORKER_REFUSED,
                message: self.say(|| {
                    format!(
                        "refused the Job{times}: {}; next attempt there not before {}",
                        r.message,
                        rfc3339(r.retry_at)
                    )
                }),
                until: Some(r.retry_at),
            });
        }
        if self.state.foreign_copy(&job.key, &job.uid, name).is_some() {
            return Some(OwnBlocker {
                reason: reason::NO_WORKER_FITS,
                message: self.say(|| {
                    format!(
                        "an earlier Job named {} is still being removed there",
                        job.key
                    )
                }),
                until: None,
            });
        }
        None
    }

    /// Whether some worker of the queue is kept from this Job alone.
    fn has_own_blocker(&self, job: &Job, workers: &[String]) -> bool {
        if job.refusals.is_empty() && !self.state.has_foreign_copy(&job.key, &job.uid) {
            return false;
        }
        workers.iter().any(|c| {
            job.refused_by(c, self.now).is_some()
                || self.state.foreign_copy(&job.key, &job.uid, c).is_some()
        })
    }
}

impl Verdict {
    fn wait(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            message,
            reserve: None,
            hold_quota: false,
        }
    }
}

impl From<Verdict> for WaitReason {
    fn from(v: Verdict) -> Self {
        WaitReason {
            reason: v.reason,
            message: v.message,
        }
    }
}

/// The worker the gang would fit best in were it empty, among `candidates`, if any.
fn drained_best<'w>(
    gang: &Gang<'w>,
    settings: &'w QueueSettings,
    candidates: &[usize],
    oracle: &mut impl Oracle<'w>,
) -> Option<&'w str> {
    let mut best: Option<(i64, &str)> = None;
    for &order in candidates {
        let name = settings.clusters[order].as_str();
        if let Some(score) = oracle.fit_drained(gang, name) {
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, name));
            }
        }
    }
    best.map(|(_, name)| name)
}

/// Whether the Job's namespace matches its queue's namespaceSelector (a namespace whose
/// labels are unknown carries only `kubernetes.io/metadata.name`).
fn namespace_allowed(job: &Job, settings: &QueueSettings) -> bool {
    let Some(selector) = &settings.namespace_selector else {
        return true;
    };
    match &job.namespace_labels {
        Some(labels) => selector.matches(labels),
        None => {
            let labels = BTreeMap::from([(
                crate::wellknown::NAMESPACE_NAME_LABEL.to_string(),
                job.key.namespace.clone(),
            )]);
            selector.matches(&labels)
        }
    }
}

fn blocks_admission(state: &State, job: &Job) -> bool {
    state
        .queues
        .get(&job.queue)
        .and_then(|q| q.settings.as_ref().ok())
        .and_then(|s| s.wait_for_pods_ready.as_ref())
        .is_some_and(|w| w.block_admission)
}

/// Why a worker cannot be tried for any Job now, if it cannot. (Workers kept for starving
/// Jobs change within a pass: see [`Pass::unusable_now`].)
fn why_unusable(state: &State, name: &str) -> Option<String> {
    let Some(worker) = state.workers.get(name) else {
        return Some("no such WorkerCluster".into());
    };
    if !worker.connected {
        return Some(if worker.message.is_empty() {
            "not connected".into()
        } else {
            format!("not connected ({})", worker.message)
        });
    }
    if !worker.copies_synced {
        return Some("connected, its Jobs not listed yet".into());
    }
    if let Some(why) = state
        .inventory
        .cluster(name)
        .and_then(|c| c.unavailable.as_ref())
    {
        return Some(why.clone());
    }
    if state.has_stale_copies(name) {
        return Some("copies of Jobs taken back from it are still being removed".into());
    }
    None
}

fn join(reasons: &[WorkerReason]) -> String {
    reasons
        .iter()
        .map(|r| format!("{}: {}", r.worker, r.why))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The placement of the Job's gang in `cluster` as it is now, to hold for a Job admitted
/// before a restart (whose pods the inventory may not show yet).
pub(crate) fn hold_for(
    state: &State,
    config: &DispatchConfig,
    job: &Job,
    cluster: &str,
    now: SystemTime,
) -> Option<Hold> {
    let shape = job.pod.as_ref().ok()?;
    let c = state.inventory.cluster(cluster)?;
    let settings = state.queues.get(&job.queue)?.settings.as_ref().ok()?;
    let class = job.class();
    let gang = Gang {
        class: &class,
        job,
        shape,
        pods: job.gang() as usize,
        strategy: shape.strategy(settings.strategy),
    };
    let table = &state.inventory.resources;
    let bound = shape.bind(table);
    let fit = crate::placement::fit_cluster(
        c,
        table,
        shape,
        &bound,
        gang.pods,
        &config.engine,
        gang.strategy,
    );
    fit.fits().then(|| Hold {
        job_uid: job.uid.clone(),
        cluster: cluster.to_string(),
        takes: super::oracle::view::takes_of(c, &gang, &bound, &fit, &config.engine, table),
        since: now,
        serial: 0,
    })
}
