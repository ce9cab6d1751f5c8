//! Queue admission: which pending Jobs are dispatched now, and where; and why the others wait.
//!
//! Jobs are taken in one order across all queues: higher priority first, then older. A Job is
//! admitted when
//! 1. its queue exists and is valid, its namespace matches the queue's namespaceSelector and
//!    its pod template can be read;
//! 2. the queue's PodsReady gate is open (with `blockAdmission`, every Job the queue admitted
//!    before is Ready);
//! 3. with `queueingStrategy: StrictFIFO`, no earlier Job of its queue waits;
//! 4. the queue's quota covers its whole gang (pods × per-pod request);
//! 5. the whole gang fits, node by node and NUMA zone by NUMA zone, in one of the queue's
//!    workers, beside the placements held there and the room kept for starving Jobs: the
//!    best-scoring worker wins (the one its last attempt failed in only when no other fits),
//!    or the best `fanout` are offered the Job at once.
//!
//! Starvation, both ways:
//! - Under `BestEffortFIFO` (the default), a Job that cannot be admitted does not block the
//!   Jobs behind it: they are tried in turn and take whatever fits (backfill). Jobs that can
//!   never fit (more than the queue's whole quota, larger than any worker even empty) never
//!   block anyone, under either strategy.
//! - A Job that has waited its queue's `starvationAfter` stops being overtaken for what it
//!   needs, and only that: the quota it needs is held for it, and room is kept for it (see
//!   the `kept` module): the nodes and NUMA zones its gang will take in one worker once
//!   enough of the pods running there end, chosen by the same exact fit as a placement.
//!   Later Jobs still go to that worker when they fit beside the kept room. When the room
//!   frees, the starving Job takes it; when the worker changes, the room is chosen again.
//!
//! Pending Jobs that are interchangeable (same queue, namespace, pod template and gang size)
//! form a class; when the first of a class cannot be admitted, none of the rest can, so a pass
//! costs one judgement per class, not one per Job. Whether a gang fits, and whether a class's
//! last verdict still stands, are asked of an [`Oracle`]; the decisions here are the same
//! whichever oracle answers.

pub(super) mod heads;
mod kept;
pub(crate) mod quota;
mod workers;

use super::job::{rfc3339, ClassKey, Job, JobKey};
use super::ledger::{Hold, HoldKind, Ledger};
use super::oracle::{Circumstances, Fit, Gang, Oracle, Verdict};
use super::reason;
use super::state::{Queue, State, Worker};
use super::world::{DispatchConfig, Placement};
use super::Action;
use crate::api::{QueueSettings, QueueingStrategy};
use crate::inventory::Cluster;
use crate::placement::inflight::Take;
use crate::placement::PodShape;
use foldhash::{HashMap, HashMapExt as _};
use heads::Heads;
use quota::{Amounts, Quota, QuotaCheck, Resources};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;
use workers::Unusable;

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
    /// The room kept for starving Jobs from now on (nominated placements). Room kept before
    /// for a Job not in this list is let go; an entry whose `serial` is the one held is the
    /// room kept before, unchanged.
    pub(crate) kept: Vec<Hold>,
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
struct QueueState<'w> {
    /// The queue, found once (`None` inside: it does not exist).
    queue: Option<Option<&'w Queue>>,
    /// What its admitted Jobs use, and what the pass admitted so far.
    usage: Amounts,
    /// Quota held for starving Jobs earlier in the order.
    held: Amounts,
    /// With `blockAdmission`: an admitted Job not yet Ready, and its worker(s).
    gate: Option<(JobKey, String)>,
    /// With `StrictFIFO`: the first Job of the queue that waits, which every later one waits
    /// behind.
    blocked_by: Option<JobKey>,
    /// How many of its Jobs have room kept for them so far in the pass.
    kept: usize,
    /// The quota in force, found once per pass.
    quota: Option<Arc<Quota>>,
    /// Its workers (by position in its list) that may take Jobs in the pass, found once.
    usable: Option<Arc<[usize]>>,
    /// The first of its workers whose copies are not listed yet (by position in its list),
    /// and until when that is waited for, found once.
    unlisted: Option<Option<(usize, SystemTime)>>,
    /// Whether one of its workers runs a Kueue, found once.
    kueue: Option<bool>,
    /// Its workers' ids in the pass (by position in its list), found once.
    ids: Option<Arc<[usize]>>,
}

/// A worker a pass has looked at (by id: see [`Pass::worker_id`]).
struct WorkerPass<'w> {
    /// The worker and its cluster in the inventory, when known.
    worker: Option<&'w Worker>,
    cluster: Option<&'w Cluster>,
    /// Why no Job may go there in this pass, if none may.
    unusable: Option<Unusable>,
    /// The Job room is kept for there from this pass on.
    kept_for: Option<&'w Job>,
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
}

/// The Job being tried, as its placement is looked for.
struct Look<'w> {
    gang: Gang<'w>,
    settings: &'w QueueSettings,
    /// Its queue's slot in the pass.
    slot: usize,
    /// It has waited its queue's `starvationAfter`.
    starving: bool,
    /// It starves, and room may be kept for it in this pass (it has some, or the bounds
    /// leave room for more): then it is judged afresh, as what it holds is decided anew.
    may_keep: bool,
    /// The room kept for it so far, if it still starves and that worker may take Jobs.
    room: Option<&'w Hold>,
    /// The room's worker, by position in the queue's list.
    room_at: Option<usize>,
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
    // Where no room is kept for starving Jobs, Jobs go in Kueue's plain order.
    let by_size = config.placement.keeps_room();
    let mut heads = Heads::new(state, ledger, now, by_size, &mut pass.out);
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
    ledger: &'w Ledger,
    config: &'w DispatchConfig,
    now: SystemTime,
    /// By slot; a Job's queue's slot is found once per look.
    queues: Vec<QueueState<'w>>,
    slots: HashMap<&'w str, usize>,
    resources: Resources<'w>,
    /// Each worker the pass looked at gets an id, its position in `workers`: a queue's
    /// workers are looked up by name once per pass, then read by id.
    worker_ids: HashMap<&'w str, usize>,
    workers: Vec<WorkerPass<'w>>,
    /// Per Kueue worker, the requests of the Jobs sent there that its Kueue has not admitted
    /// yet: found once when the pass starts (dispatched, copy absent or still suspended), and
    /// those the pass sends.
    kueue_pending: HashMap<&'w str, Vec<BTreeMap<String, i64>>>,
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
            ledger,
            config,
            now,
            queues,
            slots,
            resources,
            worker_ids: HashMap::new(),
            workers: Vec::new(),
            kueue_pending: kueue_pending(state, ledger),
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
        if let Some(wait) = self.behind_older(job, settings, slot) {
            return Attempt::Wait(wait);
        }
        if let Some(wait) = self.uncounted(job, settings, slot) {
            return Attempt::Wait(wait);
        }
        let starving = match settings.starvation_after.and_then(|a| job.starves_at(a)) {
            None => false,
            Some(at) if at <= self.now => true,
            Some(at) => {
                self.out.wake(at);
                false
            }
        };
        // A starving Job short of quota still gets room kept for it (below); any other
        // quota wait is the answer.
        let quota_short = match self.quota_wait(job, settings, slot, starving) {
            Some(wait) if wait.hold_quota => Some(wait),
            Some(wait) => return Attempt::Wait(wait),
            None => None,
        };
        let usable = self.usable_workers(settings, slot);
        let now = Circumstances {
            queue: &job.queue,
            queue_slot: slot,
            workers: &settings.clusters,
            usable: &usable,
            starving,
        };
        oracle.look(&now);
        let room_at = (starving.then(|| self.ledger.hold_of(&job.uid)))
            .flatten()
            .filter(|h| h.nominated().is_some())
            .and_then(|h| {
                let at = usable
                    .iter()
                    .find(|&&i| settings.clusters[i] == h.cluster)?;
                Some((h, *at))
            });
        let room = room_at.map(|(h, _)| h);
        // A starving Job that room may be kept for is judged afresh: the room is decided anew
        // at every look. So is a Job kept from some worker for a reason of its own: its
        // class's last verdict does not know that reason (and would hide it from the user).
        let may_keep = starving && (room.is_some() || self.room_bound(settings, slot).is_none());
        let judged_alone = may_keep || self.has_own_blocker(job, settings, slot);
        let look = Look {
            gang: Gang {
                class,
                job,
                shape,
                pods: job.main_pods() as usize,
                extra: &job.extra,
                main_jobs: job.main_jobs.as_ref(),
                strategy: shape.strategy(settings.strategy),
            },
            settings,
            slot,
            starving,
            may_keep,
            room,
            room_at: room_at.map(|(_, at)| at),
        };
        if let Some(wait) = quota_short {
            return self.short_of_quota(&look, wait, &usable, oracle);
        }
        if !judged_alone {
            if let Some(verdict) = oracle.recall(&look.gang, &now) {
                return Attempt::Wait(verdict);
            }
        }
        // Sized for every usable worker up front: grown a push at a time, these vectors were
        // reallocated four times per judgement (millions of times in a deep backlog).
        let mut asked = Vec::with_capacity(usable.len());
        let search = self.search(&look, &now, &mut asked, oracle);
        let attempt = if search.fits.is_empty() {
            self.no_fit(&look, search, &asked, oracle)
        } else {
            self.choose(&look, search.fits, oracle)
        };
        if let (Attempt::Wait(verdict), false) = (&attempt, judged_alone) {
            oracle.remember(&look.gang, &now, verdict, &asked);
        }
        attempt
    }

    /// With `StrictFIFO`, why the Job waits behind an earlier Job of its queue, if it does.
    fn behind_older(&self, job: &Job, settings: &QueueSettings, slot: usize) -> Option<Verdict> {
        if settings.queueing != QueueingStrategy::StrictFIFO {
            return None;
        }
        let first = self.queues[slot].blocked_by.as_ref()?;
        Some(Verdict::wait(
            reason::BEHIND_OLDER_JOB,
            self.say(|| {
                format!(
                    "queue {:?} admits its Jobs strictly in order (StrictFIFO): waiting behind {first}, which cannot be admitted yet",
                    job.queue
                )
            }),
        ))
    }

    /// What is decided before quota and placement: the queue, the namespace, the pod
    /// template and the PodsReady gate.
    fn gates(
        &mut self,
        job: &'w Job,
        slot: usize,
    ) -> Result<(&'w QueueSettings, &'w PodShape), Verdict> {
        let wait = |reason, message| Verdict::wait(reason, message);
        let Some(queue) = self.queue(job, slot) else {
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

    /// Why the queue admits nothing now, if a worker of it answers but its copies are not
    /// listed (for less than [`DispatchConfig::unlisted_grace`]; the plan looks again when
    /// the grace ends): what they use of the queue's quota is not known.
    fn uncounted(
        &mut self,
        job: &Job,
        settings: &'w QueueSettings,
        slot: usize,
    ) -> Option<Verdict> {
        let (now, grace) = (self.now, self.config.unlisted_grace);
        if self.queues[slot].unlisted.is_none() {
            let ids = self.ids(settings, slot);
            let found = ids.iter().enumerate().find_map(|(order, &id)| {
                let w = self.workers[id].worker.filter(|w| w.connected)?;
                let until = w.copies_unlisted_since? + grace;
                (until > now).then_some((order, until))
            });
            self.queues[slot].unlisted = Some(found);
        }
        let (order, until) = self.queues[slot].unlisted.flatten()?;
        let name = &settings.clusters[order];
        self.out.wake(until);
        Some(Verdict::wait(reason::QUOTA_NOT_COUNTED, self.say(|| format!(
            "queue {:?} admits nothing until the Jobs in worker {name} are listed: a copy of a Job taken back may still run there and use the queue's quota",
            job.queue
        ))))
    }

    /// Why the Job waits for quota, if it does: its queue's quota does not cover its whole
    /// gang now (a starving Job's quota is held for it from now on), not while some of the
    /// queue's workers are lost, or never.
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
                        "{} needs more than queue {:?} can ever give: {what}",
                        the_gang(job),
                        job.queue
                    )
                }),
            )),
            QuotaCheck::Unreachable(what, lost) => Some(Verdict::wait(
                reason::WORKER_UNREACHABLE,
                self.say(|| {
                    format!(
                        "{} needs more than queue {:?} can give while {} {} unreachable (lost: no answer for longer than workerLostTimeout); it would get it were {} back: {what}",
                        the_gang(job),
                        job.queue,
                        workers::named(&lost),
                        if lost.len() == 1 { "is" } else { "are" },
                        if lost.len() == 1 { "it" } else { "they" },
                    )
                }),
            )),
            QuotaCheck::Short(what) => {
                let mut message = self.say(|| {
                    format!(
                        "waiting for quota in queue {:?}: {} needs {what}",
                        job.queue,
                        the_gang(job)
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

    /// Asks about the gang in each worker of the queue that may take Jobs, and is not kept
    /// from this Job alone. In the worker where room is kept for it (`room`), the room
    /// counts as free.
    fn search(
        &mut self,
        look: &Look<'w>,
        now: &Circumstances<'_>,
        asked: &mut Vec<usize>,
        oracle: &mut impl Oracle<'w>,
    ) -> Search<'w> {
        let Look {
            gang,
            settings,
            room,
            ..
        } = look;
        let job = gang.job;
        // Only a Job refused somewhere, or whose name a copy of another Job holds, is kept
        // from some worker for a reason of its own.
        let may_be_kept = !job.refusals.is_empty()
            || self.state.has_foreign_copy(&job.key, &job.uid)
            || self.has_kueue_worker(settings, look.slot);
        let mut to_ask: Vec<(usize, &'w str)> = Vec::with_capacity(now.usable.len());
        to_ask.extend(
            (now.usable.iter())
                .filter(|&&i| Some(i) != look.room_at)
                .map(|&i| (i, settings.clusters[i].as_str()))
                .filter(|(_, name)| !may_be_kept || self.own_blocker(job, name).is_none()),
        );
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
            reasons: Vec::with_capacity(look_at.len()),
            own: None,
        };
        for &order in look_at.iter() {
            let name = settings.clusters[order].as_str();
            if let Some(u) = check_each.then(|| self.unusable(name)).flatten() {
                search.reasons.push(WorkerReason {
                    worker: name,
                    why: u.why,
                    never: false,
                });
                continue;
            }
            if let Some(b) = may_be_kept.then(|| self.own_blocker(job, name)).flatten() {
                if let Some(t) = b.until {
                    self.out.wake(t);
                }
                // A refusal's back-off says most, then a Kueue worker's quota.
                search.own = Some(match (search.own, b.reason) {
                    (Some(reason::WORKER_REFUSED), _) => reason::WORKER_REFUSED,
                    (Some(reason::WORKER_QUOTA), r) if r != reason::WORKER_REFUSED => {
                        reason::WORKER_QUOTA
                    }
                    (_, r) => r,
                });
                search.reasons.push(WorkerReason {
                    worker: name,
                    why: b.message,
                    never: false,
                });
                continue;
            }
            asked.push(order);
            let fit = match (self.config.placement, room) {
                // No judgement: every usable worker is offered the Job.
                (Placement::Everywhere, _) => Fit::Fits(0),
                (Placement::Exact, Some(room)) if look.room_at == Some(order) => {
                    oracle.fit_with_room(gang, name, room)
                }
                (Placement::Exact | Placement::SumOfFree, _) => oracle.fit(gang, name, order),
            };
            match fit {
                Fit::Fits(score) => search.fits.push(Candidate {
                    preferred: self.config.placement == Placement::Everywhere
                        || job.avoid.as_deref() != Some(name),
                    score,
                    order,
                    name,
                }),
                Fit::Misfit { mut reason, never } => {
                    if self.config.describe {
                        if let Some(note) = self.kept_for_another(job, name) {
                            reason.push_str(&note);
                        }
                    }
                    search.reasons.push(WorkerReason {
                        worker: name,
                        why: reason,
                        never,
                    })
                }
            }
        }
        search
    }

    /// Dispatches the Job to the best of the workers that fit it, or offers it to the best
    /// `fanout` of them at once.
    fn choose(
        &mut self,
        look: &Look<'w>,
        mut fits: Vec<Candidate<'w>>,
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        let Look {
            gang,
            settings,
            room,
            ..
        } = look;
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
        let placed = match room {
            Some(room) if room.cluster == best => oracle.place_with_room(gang, best, room),
            _ => oracle.place(gang, best),
        };
        match placed {
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

    /// Why a Job that fits no worker now waits. Room is kept for a starving Job in a worker
    /// that could hold it empty (see the `kept` module); a Job that no worker of its queue
    /// could hold even empty waits for ever, unless a worker that cannot take Jobs now (or
    /// has not been seen yet) might.
    fn no_fit(
        &mut self,
        look: &Look<'w>,
        search: Search<'w>,
        asked: &[usize],
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        let Look {
            gang,
            settings,
            slot,
            starving,
            may_keep,
            ..
        } = look;
        let Search { reasons, own, .. } = search;
        let job = gang.job;
        // The Job's own reason when some worker is kept from it alone (then a refusal's
        // back-off, or a Kueue worker's quota, is the reason to show), else its class's.
        let wait = |why: &'static str, message: String| {
            let verdict = Verdict::wait(why, message);
            match own {
                None => Attempt::Wait(verdict),
                Some(kind) if kind == reason::WORKER_REFUSED || kind == reason::WORKER_QUOTA => {
                    Attempt::WaitAlone(Verdict {
                        reason: kind,
                        ..verdict
                    })
                }
                Some(_) => Attempt::WaitAlone(verdict),
            }
        };
        if asked.is_empty() && own == Some(reason::WORKER_QUOTA) {
            return wait(
                reason::WORKER_QUOTA,
                self.say(|| {
                    format!(
                        "no worker can take {} now: {}",
                        the_gang(job),
                        join(&reasons)
                    )
                }),
            );
        }
        if asked.is_empty() {
            let unreachable = own.is_none() && self.all_unreachable(settings);
            return wait(
                if unreachable {
                    reason::WORKER_UNREACHABLE
                } else {
                    reason::NO_ACTIVE_WORKER
                },
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
        if self.config.placement.keeps_room() && (*may_keep || all_never) {
            let could_hold = self.could_hold_room(look, asked, oracle);
            if could_hold.is_empty() {
                if own.is_none() {
                    let verdict = self.beyond_reach(gang, settings, asked, &reasons, oracle);
                    return Attempt::Wait(verdict);
                }
            } else if *may_keep {
                return match self.keep_room(look, &could_hold, oracle) {
                    Ok(kept) => {
                        let message = self.say(|| {
                            format!(
                                "no worker can take {} now; it has waited since {}, so room is kept for it {kept} as the pods running there end: {}",
                                the_gang(job),
                                rfc3339(job.waiting_since()),
                                join(&reasons)
                            )
                        });
                        let mut attempt = wait(reason::NO_WORKER_FITS, message);
                        if let Attempt::Wait(v) | Attempt::WaitAlone(v) = &mut attempt {
                            v.hold_quota = true;
                        }
                        attempt
                    }
                    Err(why_not) => wait(
                        reason::NO_WORKER_FITS,
                        self.say(|| no_room_message(job, &why_not, &reasons)),
                    ),
                };
            }
        }
        let no_room = match *starving && self.config.describe {
            true => self.room_bound(settings, *slot),
            false => None,
        };
        wait(
            reason::NO_WORKER_FITS,
            self.say(|| match no_room {
                Some(why_not) => no_room_message(job, &why_not, &reasons),
                None => format!(
                    "no worker can take {} now: {}",
                    the_gang(job),
                    join(&reasons)
                ),
            }),
        )
    }

    /// Carries out what the attempt decided for the pass; returns whether the class moves on
    /// to its next Job.
    fn record(&mut self, job: &'w Job, class: &ClassKey, slot: usize, attempt: Attempt) -> bool {
        match attempt {
            Attempt::Dispatch { cluster, takes } => {
                self.sent(job, &cluster);
                let blocks = self.blocks_admission(job, slot);
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
                        kind: HoldKind::Dispatched,
                        since: self.now,
                        serial: 0,
                    },
                });
                true
            }
            Attempt::Offer { clusters } => {
                // A copy offered to a Kueue worker waits in its queue like a dispatched one.
                for c in &clusters {
                    self.sent(job, c);
                }
                let blocks = self.blocks_admission(job, slot);
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
                self.waits(job, slot, &verdict);
                if self.config.describe {
                    self.out.waiting.insert(class.clone(), verdict.into());
                }
                false
            }
            Attempt::WaitAlone(verdict) => {
                self.waits(job, slot, &verdict);
                self.out.job_waiting.insert(job.key.clone(), verdict.into());
                true
            }
        }
    }

    /// What a Job's wait holds for it (a starving Job's quota), and holds back (under
    /// `StrictFIFO`, the rest of its queue).
    fn waits(&mut self, job: &'w Job, slot: usize, verdict: &Verdict) {
        if verdict.hold_quota {
            self.resources.add(&mut self.queues[slot].held, job);
        }
        let strict =
            (self.settings(job, slot)).is_some_and(|s| s.queueing == QueueingStrategy::StrictFIFO);
        let queue = &mut self.queues[slot];
        if strict && queue.blocked_by.is_none() && holds_back(verdict.reason) {
            queue.blocked_by = Some(job.key.clone());
        }
    }

    /// The settings of the Job's queue (at `slot`), found once per pass: `None` when it does
    /// not exist or is not valid.
    fn settings(&mut self, job: &Job, slot: usize) -> Option<&'w QueueSettings> {
        self.queue(job, slot)?.settings.as_ref().ok()
    }

    /// The Job's queue (at `slot`), found once per pass.
    fn queue(&mut self, job: &Job, slot: usize) -> Option<&'w Queue> {
        let state = self.state;
        *self.queues[slot]
            .queue
            .get_or_insert_with(|| state.queues.get(&job.queue))
    }

    /// Whether the Job's queue admits one Job at a time until its pods are Ready.
    fn blocks_admission(&mut self, job: &Job, slot: usize) -> bool {
        (self.settings(job, slot))
            .and_then(|s| s.wait_for_pods_ready.as_ref())
            .is_some_and(|w| w.block_admission)
    }

    /// The queue's quota in force, found once per pass.
    fn quota(&mut self, settings: &'w QueueSettings, slot: usize) -> Arc<Quota> {
        if let Some(q) = &self.queues[slot].quota {
            return q.clone();
        }
        let ids = self.ids(settings, slot);
        let workers = (settings.clusters.iter().zip(ids.iter())).map(|(name, &id)| {
            let w = &self.workers[id];
            (name.as_str(), w.cluster, w.worker)
        });
        let quota = Arc::new((self.resources).quota(self.state, settings, workers, self.now));
        self.queues[slot].quota = Some(quota.clone());
        quota
    }

    /// The queue's workers that may take Jobs in the pass, found once.
    fn usable_workers(&mut self, settings: &'w QueueSettings, slot: usize) -> Arc<[usize]> {
        if let Some(found) = &self.queues[slot].usable {
            return found.clone();
        }
        let ids = self.ids(settings, slot);
        let found: Arc<[usize]> = (0..settings.clusters.len())
            .filter(|&i| self.workers[ids[i]].unusable.is_none())
            .collect();
        self.queues[slot].usable = Some(found.clone());
        found
    }

    /// The ids of the queue's workers (by position in its list), found once per pass.
    fn ids(&mut self, settings: &'w QueueSettings, slot: usize) -> Arc<[usize]> {
        if let Some(ids) = &self.queues[slot].ids {
            return ids.clone();
        }
        let ids: Arc<[usize]> = (settings.clusters.iter())
            .map(|name| self.worker_id(name))
            .collect();
        self.queues[slot].ids = Some(ids.clone());
        ids
    }

    /// The worker's id in the pass; the first time, why no Job may go there is found.
    fn worker_id(&mut self, name: &'w str) -> usize {
        if let Some(&id) = self.worker_ids.get(name) {
            return id;
        }
        let id = self.workers.len();
        let state = self.state;
        let (worker, cluster) = (state.workers.get(name), state.inventory.cluster(name));
        self.workers.push(WorkerPass {
            worker,
            cluster,
            unusable: workers::why_unusable(state, name, worker, cluster),
            kept_for: None,
        });
        self.worker_ids.insert(name, id);
        id
    }

    /// Why no Job may go to `name` in the pass, if none may.
    fn unusable(&mut self, name: &'w str) -> Option<Unusable> {
        let id = self.worker_id(name);
        self.workers[id].unusable.clone()
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
        if let Some(b) = self.kueue_blocker(job, name) {
            return Some(b);
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
    fn has_own_blocker(&mut self, job: &Job, settings: &'w QueueSettings, slot: usize) -> bool {
        let workers = &settings.clusters;
        if self.has_kueue_worker(settings, slot)
            && workers.iter().any(|c| self.kueue_blocker(job, c).is_some())
        {
            return true;
        }
        if job.refusals.is_empty() && !self.state.has_foreign_copy(&job.key, &job.uid) {
            return false;
        }
        workers.iter().any(|c| {
            job.refused_by(c, self.now).is_some()
                || self.state.foreign_copy(&job.key, &job.uid, c).is_some()
        })
    }

    /// The pass sent `job` to `cluster`: a Kueue worker's queue holds it until it admits it.
    fn sent(&mut self, job: &Job, cluster: &str) {
        if let Some((name, w)) = self.state.workers.get_key_value(cluster) {
            if w.kueue.is_some() {
                self.kueue_pending
                    .entry(name.as_str())
                    .or_default()
                    .push(job.total_request());
            }
        }
    }

    /// Whether a worker of the queue runs a Kueue, whose quota may keep a Job from it.
    fn has_kueue_worker(&mut self, settings: &'w QueueSettings, slot: usize) -> bool {
        if let Some(found) = self.queues[slot].kueue {
            return found;
        }
        let ids = self.ids(settings, slot);
        let found =
            (ids.iter()).any(|&id| self.workers[id].worker.is_some_and(|w| w.kueue.is_some()));
        self.queues[slot].kueue = Some(found);
        found
    }

    /// Why the worker's own Kueue would not admit the Job now, when the worker runs one (see
    /// the `kueue` module): its ClusterQueue's quota, less what is reserved there and what the
    /// Jobs sent there and not admitted yet will take, does not cover the gang.
    fn kueue_blocker(&self, job: &Job, name: &str) -> Option<OwnBlocker> {
        let worker = self.state.workers.get(name)?;
        let local_queue = worker.kueue.as_deref()?;
        let pending = self.kueue_pending.get(name).map_or(&[][..], Vec::as_slice);
        let short = worker.queues.short(
            &job.key.namespace,
            local_queue,
            &job.total_request(),
            pending,
        )?;
        Some(OwnBlocker {
            reason: reason::WORKER_QUOTA,
            message: self.say(|| short.describe(&job.key.namespace, local_queue)),
            until: None,
        })
    }
}

/// Per Kueue worker, the requests of the Jobs dispatched there (their placement held) whose
/// copy its Kueue has not admitted yet (absent, or still suspended).
fn kueue_pending<'w>(
    state: &'w State,
    ledger: &Ledger,
) -> HashMap<&'w str, Vec<BTreeMap<String, i64>>> {
    state
        .workers
        .iter()
        .filter(|(_, w)| w.kueue.is_some())
        .map(|(name, _)| {
            let pending = ledger
                .holds_in(name)
                .filter(|h| h.nominated().is_none())
                .filter(|h| state.copy_in(&h.job_uid, name).is_none_or(|c| c.suspended))
                .filter_map(|h| state.job_by_uid(&h.job_uid))
                .map(Job::total_request)
                .collect();
            (name.as_str(), pending)
        })
        .collect()
}

/// Why a starving Job that fits no worker has no room kept for it (`why_not`).
fn no_room_message(job: &Job, why_not: &str, reasons: &[WorkerReason]) -> String {
    format!(
        "no worker can take {} now; it has waited since {}, but {why_not}: {}",
        the_gang(job),
        rfc3339(job.waiting_since()),
        join(reasons)
    )
}

/// "the gang of N pods", or "the Job's pod" for one.
fn the_gang(job: &Job) -> String {
    match job.gang() {
        1 => "the Job's pod".to_string(),
        n => format!("the gang of {n} pods"),
    }
}

/// Whether a Job that waits for this reason holds back the later Jobs of a `StrictFIFO`
/// queue. One that can never be admitted as it is (too big, invalid, in a namespace the
/// queue does not take) does not: nothing it could wait for would let the rest through.
fn holds_back(why: &str) -> bool {
    !matches!(
        why,
        reason::NEVER_FITS
            | reason::INVALID_JOB
            | reason::NAMESPACE_NOT_ALLOWED
            | reason::QUEUE_NOT_FOUND
            | reason::QUEUE_INVALID
            | reason::BEHIND_OLDER_JOB
    )
}

impl Verdict {
    fn wait(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            message,
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
    let settings = state.settings(&job.queue)?;
    let class = job.class();
    let gang = Gang {
        class: &class,
        job,
        shape,
        pods: job.main_pods() as usize,
        extra: &job.extra,
        main_jobs: job.main_jobs.as_ref(),
        strategy: shape.strategy(settings.strategy),
    };
    let table = &state.inventory.resources;
    let bound = shape.bind(table);
    let found = super::oracle::view::search(c, table, gang.pods_of(), &bound, &config.engine);
    found.fit.fits().then(|| Hold {
        job_uid: job.uid.clone(),
        cluster: cluster.to_string(),
        takes: found.takes(c, &gang, &bound, &config.engine, table),
        kind: HoldKind::Dispatched,
        since: now,
        serial: 0,
    })
}
