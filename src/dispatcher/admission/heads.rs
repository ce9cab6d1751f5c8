//! The order a pass takes Jobs in: each class's first eligible Job, in admission order
//! across classes: higher priority first, then older (see [`Place`]). A class moves on to its
//! next Job only when its first was admitted, or waits for a reason of its own.
//!
//! Age is weighted by size for starving Jobs of `BestEffortFIFO` queues, where room is kept for
//! starving Jobs (the exact placement; the others take Jobs in Kueue's plain order): such a Job counts as
//! older than it is by [`size_bonus`], up to a fifth of its age for pods that take a whole
//! node. Without it, a Job of big pods waits longer than the smaller Jobs submitted with it:
//! they start on the scraps that free one pod at a time while it needs a whole NUMA zone or
//! node free at once, so in a backlog they keep taking what frees first, and room kept for
//! them (one Job per worker) goes to them first too. Measured on the mixed trace
//! (`docs/performance.md`), the weight brings the largest gangs' start wait down by about a
//! tenth and leaves every size of GPU Job waiting less than it did before room was kept per
//! gang. The bonus is a share of the Job's own age, so a Job is passed only by larger Jobs
//! submitted at most a sixth of its age after it: none is passed over for ever. Under
//! `StrictFIFO`, and for Jobs that do not starve yet, the order is the plain admission order.

use super::Admission;
use crate::api::{QueueSettings, QueueingStrategy};
use crate::dispatcher::job::{ClassKey, Job, Rank};
use crate::dispatcher::ledger::Ledger;
use crate::dispatcher::state::State;
use crate::inventory::Inventory;
use crate::placement::PodShape;
use foldhash::HashMap;
use std::cmp::Reverse;
use std::collections::{btree_set, BinaryHeap};
use std::iter::Peekable;
use std::time::{Duration, SystemTime};

/// How much older a starving Job counts, per mille of its age, when its pods take a whole
/// node (see [`size_bonus`]).
const SIZE_AGING: u32 = 200;

/// A class's head's place in the pass: by priority, then by when it counts as submitted (its
/// creation, brought forward by [`size_bonus`] when it starves), then by its rank (unique).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Place<'w> {
    neg_priority: i64,
    counts_from: SystemTime,
    rank: &'w Rank,
}

/// How much older than its `age` a starving Job counts when its pods' size share is `share`
/// (per mille of the largest node, see [`size_share`]).
pub(crate) fn size_bonus(age: Duration, share: u32) -> Duration {
    let per_million = share.min(1000) * SIZE_AGING;
    age.checked_mul(per_million).unwrap_or(Duration::MAX) / 1_000_000
}

/// How much of one node a pod of `shape` takes, per mille: the largest share, over the
/// resources it asks for, of the most any one node has (`largest`, by resource id; a
/// resource no node has counts for nothing: no node takes the pod anyway).
pub(crate) fn size_share(shape: &PodShape, largest: &[i64], inventory: &Inventory) -> u32 {
    shape
        .node_request
        .iter()
        .filter(|(_, &q)| q > 0)
        .filter_map(|(name, &q)| {
            let most = *largest.get(inventory.resources.id(name)?)?;
            (most > 0).then(|| (q.saturating_mul(1000) / most).min(1000) as u32)
        })
        .max()
        .unwrap_or(0)
}

/// The most any one node of the inventory has of each resource, by id.
pub(crate) fn largest_on_a_node(inventory: &Inventory) -> Vec<i64> {
    let mut most = vec![0; inventory.resources.len()];
    for c in &inventory.clusters {
        for (m, &a) in most.iter_mut().zip(&c.summary.max_allocatable_on_node) {
            *m = (*m).max(a);
        }
    }
    most
}

/// The queue's `starvationAfter` when its starving Jobs' age is weighted by size (under
/// `BestEffortFIFO`: under `StrictFIFO` no Job passes an older one).
fn size_weighted(settings: &QueueSettings) -> Option<Duration> {
    (settings.queueing == QueueingStrategy::BestEffortFIFO)
        .then_some(settings.starvation_after)
        .flatten()
}

/// What a pass needs to place Jobs in order, found once per pass.
struct Order<'w> {
    state: &'w State,
    now: SystemTime,
    /// A Job that has waited since this time or before may starve in some queue whose
    /// starving Jobs' age is weighted by size; `None`: no Job's is.
    starving_by: Option<SystemTime>,
    /// Per queue: its `starvationAfter` when its starving Jobs' age is weighted by size.
    aging: HashMap<&'w str, Option<Duration>>,
    /// The most any one node has of each resource, by id: found when first needed.
    largest: Option<Vec<i64>>,
    /// Size shares by pod shape key.
    shares: HashMap<u64, u32>,
}

impl<'w> Order<'w> {
    fn new(state: &'w State, now: SystemTime, by_size: bool) -> Self {
        let soonest = (state.queues.values())
            .filter_map(|q| size_weighted(q.settings.as_ref().ok()?))
            .min();
        Self {
            state,
            now,
            starving_by: soonest
                .filter(|_| by_size)
                .and_then(|after| now.checked_sub(after)),
            aging: HashMap::default(),
            largest: None,
            shares: HashMap::default(),
        }
    }

    fn place(&mut self, job: &'w Job, rank: &'w Rank) -> Place<'w> {
        let plain = Place {
            neg_priority: rank.neg_priority,
            counts_from: rank.created,
            rank,
        };
        // Most Jobs of a pass have not waited long enough to starve in any queue.
        if self.starving_by.is_none_or(|by| job.waiting_since() > by) {
            return plain;
        }
        let Some(after) = self.aging_of(&job.queue) else {
            return plain;
        };
        if job.starves_at(after).is_none_or(|at| at > self.now) {
            return plain;
        }
        let Ok(shape) = job.pod.as_deref() else {
            return plain;
        };
        let age = self.now.duration_since(rank.created).unwrap_or_default();
        let share = self.share_of(job.shape_key, shape);
        Place {
            counts_from: (rank.created)
                .checked_sub(size_bonus(age, share))
                .unwrap_or(rank.created),
            ..plain
        }
    }

    fn aging_of(&mut self, queue: &'w str) -> Option<Duration> {
        if let Some(&a) = self.aging.get(queue) {
            return a;
        }
        let aging =
            (self.state.queues.get(queue)).and_then(|q| size_weighted(q.settings.as_ref().ok()?));
        self.aging.insert(queue, aging);
        aging
    }

    fn share_of(&mut self, key: u64, shape: &PodShape) -> u32 {
        if let Some(&s) = self.shares.get(&key) {
            return s;
        }
        let inventory = &self.state.inventory;
        let largest = self
            .largest
            .get_or_insert_with(|| largest_on_a_node(inventory));
        let share = size_share(shape, largest, inventory);
        self.shares.insert(key, share);
        share
    }
}

/// The classes' heads in order (see [`Place`]). Most classes are looked at once per pass (their first
/// Job waits), so the first heads are sorted once and taken in order; the heads of classes
/// that moved on go through a heap, which stays small.
pub(super) struct Heads<'w> {
    /// Also the pass's state and time.
    order: Order<'w>,
    /// Each class's pending Jobs in rank order, gone through once per pass.
    classes: Vec<(&'w ClassKey, btree_set::Iter<'w, Rank>)>,
    /// Each class's current head.
    head_jobs: Vec<Option<&'w Job>>,
    first: Peekable<std::vec::IntoIter<(Place<'w>, usize)>>,
    moved: BinaryHeap<Reverse<(Place<'w>, usize)>>,
}

/// A class's head, as [`Heads::next`] hands it out.
pub(super) struct Head<'w> {
    pub(crate) index: usize,
    pub(crate) class: &'w ClassKey,
    pub(crate) job: &'w Job,
}

impl<'w> Heads<'w> {
    pub(super) fn new(
        state: &'w State,
        ledger: &'w Ledger,
        now: SystemTime,
        by_size: bool,
        out: &mut Admission,
    ) -> Self {
        let mut classes: Vec<_> = ledger
            .pending_classes()
            .iter()
            .map(|(class, ranks)| (class, ranks.iter()))
            .collect();
        let mut head_jobs = vec![None; classes.len()];
        let mut first = Vec::with_capacity(classes.len());
        let mut order = Order::new(state, now, by_size);
        for (i, (_, ranks)) in classes.iter_mut().enumerate() {
            if let Some((rank, job)) = next_eligible(state, ranks, now, out) {
                first.push((order.place(job, rank), i));
                head_jobs[i] = Some(job);
            }
        }
        first.sort_unstable();
        Self {
            order,
            classes,
            head_jobs,
            first: first.into_iter().peekable(),
            moved: BinaryHeap::new(),
        }
    }

    /// The first head in order not handed out yet.
    pub(super) fn next(&mut self) -> Option<Head<'w>> {
        loop {
            let head = match (self.first.peek(), self.moved.peek()) {
                (Some(a), Some(Reverse(b))) if b < a => self.moved.pop().map(|Reverse(h)| h),
                (Some(_), _) => self.first.next(),
                (None, _) => self.moved.pop().map(|Reverse(h)| h),
            };
            let (_, index) = head?;
            if let Some(job) = self.head_jobs[index] {
                return Some(Head {
                    index,
                    class: self.classes[index].0,
                    job,
                });
            }
        }
    }

    /// The class's next eligible Job becomes its head.
    pub(super) fn move_on(&mut self, index: usize, out: &mut Admission) {
        let ranks = &mut self.classes[index].1;
        let Order { state, now, .. } = self.order;
        if let Some((rank, job)) = next_eligible(state, ranks, now, out) {
            self.moved
                .push(Reverse((self.order.place(job, rank), index)));
            self.head_jobs[index] = Some(job);
        }
    }
}

/// The next Job of a class that may be tried now: not backing off, not still running in a
/// worker from before its requeue (starting it elsewhere now would run it twice; tried again
/// once that copy goes), not refused by the manager (tried again once the Job changes).
fn next_eligible<'w>(
    state: &'w State,
    ranks: &mut btree_set::Iter<'w, Rank>,
    now: SystemTime,
    out: &mut Admission,
) -> Option<(&'w Rank, &'w Job)> {
    for rank in ranks {
        let job = state.jobs.get(&rank.key)?;
        match job.requeue_after {
            Some(t) if t > now => out.wake(t),
            _ if state.still_running(job) => {}
            _ if state.refused_write(job).is_some() => {}
            _ => return Some((rank, job)),
        }
    }
    None
}
