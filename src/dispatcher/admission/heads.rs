//! The order a pass takes Jobs in: each class's first eligible Job, lowest rank first across
//! classes (ranks are unique: they end with the Job's key). A class moves on to its next Job
//! only when its first was admitted, or waits for a reason of its own.

use super::Admission;
use crate::dispatcher::job::{ClassKey, Job, Rank};
use crate::dispatcher::ledger::Ledger;
use crate::dispatcher::state::State;
use std::cmp::Reverse;
use std::collections::{btree_set, BinaryHeap};
use std::iter::Peekable;
use std::time::SystemTime;

/// The classes' heads in rank order. Most classes are looked at once per pass (their first
/// Job waits), so the first heads are sorted once and taken in order; the heads of classes
/// that moved on go through a heap, which stays small.
pub(super) struct Heads<'w> {
    state: &'w State,
    now: SystemTime,
    /// Each class's pending Jobs in rank order, gone through once per pass.
    classes: Vec<(&'w ClassKey, btree_set::Iter<'w, Rank>)>,
    /// Each class's current head.
    head_jobs: Vec<Option<&'w Job>>,
    first: Peekable<std::vec::IntoIter<(&'w Rank, usize)>>,
    moved: BinaryHeap<Reverse<(&'w Rank, usize)>>,
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
        out: &mut Admission,
    ) -> Self {
        let mut classes: Vec<_> = ledger
            .pending_classes()
            .iter()
            .map(|(class, ranks)| (class, ranks.iter()))
            .collect();
        let mut head_jobs = vec![None; classes.len()];
        let mut first = Vec::with_capacity(classes.len());
        for (i, (_, ranks)) in classes.iter_mut().enumerate() {
            if let Some((rank, job)) = next_eligible(state, ranks, now, out) {
                first.push((rank, i));
                head_jobs[i] = Some(job);
            }
        }
        first.sort_unstable();
        Self {
            state,
            now,
            classes,
            head_jobs,
            first: first.into_iter().peekable(),
            moved: BinaryHeap::new(),
        }
    }

    /// The lowest-ranked head not handed out yet.
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
        if let Some((rank, job)) = next_eligible(self.state, ranks, self.now, out) {
            self.moved.push(Reverse((rank, index)));
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
