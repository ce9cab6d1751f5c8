//! Room kept for starving Jobs: nominated placements.
//!
//! A Job that has waited its queue's `starvationAfter` and fits no worker now is given room in
//! one worker of its queue: the nodes and NUMA zones its gang will take there once enough of
//! the pods running there end. The room is found by the same exact fit as a placement, on the
//! worker's nodes as they are when empty, taken freest-now first, and the worker chosen is the
//! one whose room running pods take least of now. From then on the room is taken off that
//! worker for every other Job, as a dispatched Job's placement is: later Jobs still go to the
//! worker when they fit beside it, and none takes what the room needs as it frees. The room
//! stays in its worker while the worker keeps its nodes and may take Jobs, and follows the
//! nodes that free first there: when a node it is not on is freer than the least free one it
//! is on, the room is found again, and moves if running pods take less of the new room. It
//! is let go when the Job starts (anywhere), no longer waits, or no longer starves. The Job's
//! quota is held for it while room is kept for it.
//!
//! Bounds, so that no backlog keeps the fleet:
//! - room is kept for at most one Job per worker: while a worker drains for one big Job, the
//!   rest of it still takes the Jobs that fit beside that room;
//! - a queue keeps room in at most half its workers (rounded up): a backlog of big Jobs in one
//!   queue leaves the other half of its workers to its other Jobs and to the queues that share
//!   them.
//!
//! Starving Jobs get room in the order a pass takes them: priority, then age, where a
//! starving Job's age counts more the larger its pods (see `heads`). A Job is passed over for
//! room only by Jobs of higher priority, older ones, and larger ones submitted at most a
//! sixth of its age after it; the next gets room as soon as one starts.

use super::{Attempt, Look, Pass};
use crate::api::QueueSettings;
use crate::dispatcher::job::Job;
use crate::dispatcher::ledger::{Hold, HoldKind, Nominated};
use crate::dispatcher::oracle::Verdict;
use crate::dispatcher::oracle::{Gang, Oracle, Room};
use std::cmp::Reverse;

impl<'w> Pass<'w> {
    /// Keeps room for the starving gang in one of `could_hold` (the queue's workers, by
    /// position, that could hold it empty): the room kept before when it still stands, else
    /// the best room found now. Returns where it is kept (for the Job's message), or why none
    /// is.
    pub(super) fn keep_room(
        &mut self,
        look: &Look<'w>,
        could_hold: &[usize],
        oracle: &mut impl Oracle<'w>,
    ) -> Result<String, String> {
        let Look {
            gang,
            settings,
            slot,
            room,
            ..
        } = look;
        let (settings, slot, room) = (*settings, *slot, *room);
        let job = gang.job;
        if let Some(why_not) = self.room_bound(settings, slot) {
            return Err(why_not);
        }
        let ids = self.ids(settings, slot);
        let open: Vec<&'w str> = could_hold
            .iter()
            .filter(|&&i| self.workers[ids[i]].kept_for.is_none())
            .map(|&i| settings.clusters[i].as_str())
            .collect();
        if open.is_empty() {
            return Err(self.say(|| {
                "every worker that could hold it keeps room for a Job before it".to_string()
            }));
        }
        let standing = room.filter(|h| open.contains(&h.cluster.as_str()) && self.stands(h, gang));
        // The room kept stands, unless nodes of its worker free sooner than it: it follows
        // them, in its worker. Else the best room of the workers open to it.
        let found: Option<(Room, &'w str)> = match standing {
            Some(h) => {
                let name = open.iter().copied().find(|n| *n == h.cluster);
                name.and_then(|name| Some((oracle.freer_room(gang, h)?, name)))
            }
            None => {
                let mut best: Option<(Room, &'w str)> = None;
                for &name in &open {
                    let Some(r) = oracle.room_for(gang, name, room) else {
                        continue;
                    };
                    let rank = |r: &Room| (r.shortfall, Reverse(r.score));
                    if best.as_ref().is_none_or(|(b, _)| rank(&r) < rank(b)) {
                        best = Some((r, name));
                    }
                }
                best
            }
        };
        let hold = match (found, standing) {
            (Some((r, name)), _) => {
                // Later Jobs in this pass do not get it either.
                oracle.keep(name, &r.takes);
                let capacity = self
                    .state
                    .inventory
                    .cluster(name)
                    .map_or(0, |c| c.summary.capacity_fingerprint);
                Hold {
                    job_uid: job.uid.clone(),
                    cluster: name.to_string(),
                    takes: r.takes,
                    kind: HoldKind::Nominated(Nominated {
                        shape: gang.class.shape,
                        pods: job.gang(),
                        capacity,
                    }),
                    since: self.now,
                    serial: 0,
                }
            }
            (None, Some(h)) => h.clone(),
            (None, None) => {
                return Err(self.say(|| "no room could be found for it".to_string()));
            }
        };
        let name = open
            .iter()
            .copied()
            .find(|n| *n == hold.cluster)
            .unwrap_or_default();
        let id = self.worker_id(name);
        self.workers[id].kept_for = Some(job);
        self.queues[slot].kept += 1;
        let kept = self.say(|| {
            let nodes: Vec<&str> = hold.takes.iter().map(|t| &*t.node).collect();
            format!(
                "in worker {} (node{} {})",
                hold.cluster,
                if nodes.len() == 1 { "" } else { "s" },
                short_list(&nodes)
            )
        });
        self.out.kept.push(hold);
        Ok(kept)
    }

    /// Of `among` (the queue's workers, by position), the workers that could hold the gang
    /// empty ([`could_hold`]); when room may be kept for the Job and the room kept for it
    /// before stands in one of them that no Job before it keeps room in, that worker alone:
    /// [`Pass::keep_room`] keeps that room then, and reads no other.
    pub(super) fn could_hold_room(
        &mut self,
        look: &Look<'w>,
        among: &[usize],
        oracle: &mut impl Oracle<'w>,
    ) -> Vec<usize> {
        let standing = (look.room.zip(look.room_at))
            .filter(|(h, i)| look.may_keep && among.contains(i) && self.stands(h, &look.gang))
            .map(|(_, i)| i);
        if let Some(i) = standing {
            let ids = self.ids(look.settings, look.slot);
            if self.workers[ids[i]].kept_for.is_none() {
                let it = could_hold(look, &[i], oracle);
                if !it.is_empty() {
                    return it;
                }
            }
        }
        could_hold(look, among, oracle)
    }

    /// A starving Job its queue's quota does not cover yet: its quota is held for it (see
    /// `wait`), and room is kept for it as for a Job that fits no worker, so that when the
    /// queue's own Jobs end and give the quota back, the nodes are free for it too (another
    /// queue sharing the worker would take them otherwise).
    pub(super) fn short_of_quota(
        &mut self,
        look: &Look<'w>,
        mut wait: Verdict,
        usable: &[usize],
        oracle: &mut impl Oracle<'w>,
    ) -> Attempt {
        if !look.may_keep || !self.config.placement.keeps_room() {
            return Attempt::Wait(wait);
        }
        let could_hold = self.could_hold_room(look, usable, oracle);
        if could_hold.is_empty() {
            return Attempt::Wait(wait);
        }
        if let Ok(kept) = self.keep_room(look, &could_hold, oracle) {
            if self.config.describe {
                wait.message
                    .push_str(&format!(", and room is kept for it {kept}"));
            }
        }
        Attempt::Wait(wait)
    }

    /// Why no more room may be kept for a Job of the queue in this pass, if none may: the
    /// queue keeps room in half its workers already, or every one of them keeps room.
    pub(super) fn room_bound(
        &mut self,
        settings: &'w QueueSettings,
        slot: usize,
    ) -> Option<String> {
        let per_queue = settings.clusters.len().div_ceil(2).max(1);
        if self.queues[slot].kept >= per_queue {
            return Some(self.say(|| {
                format!(
                    "its queue keeps room for at most {per_queue} Job{} at once (in half its workers), and keeps it for Jobs before it",
                    if per_queue == 1 { "" } else { "s" }
                )
            }));
        }
        let ids = self.ids(settings, slot);
        if ids.iter().all(|&id| self.workers[id].kept_for.is_some()) {
            return Some(
                self.say(|| "every worker of its queue keeps room for a Job before it".to_string()),
            );
        }
        None
    }

    /// Whether room kept for the gang's Job before still stands: kept for the same pods, in
    /// a worker whose nodes are the same.
    fn stands(&self, hold: &Hold, gang: &Gang) -> bool {
        let Some(n) = hold.nominated() else {
            return false;
        };
        n.shape == gang.class.shape
            && n.pods == gang.job.gang()
            && self
                .state
                .inventory
                .cluster(&hold.cluster)
                .is_some_and(|c| c.summary.capacity_fingerprint == n.capacity)
    }

    /// A note for a worker's reason when room there is kept for another Job.
    pub(super) fn kept_for_another(&self, job: &Job, worker: &str) -> Option<String> {
        let kept_for = (self.worker_ids.get(worker)).and_then(|&id| self.workers[id].kept_for);
        let other = match kept_for {
            Some(other) => Some(&other.key),
            None => self
                .ledger
                .holds_in(worker)
                .filter(|h| h.nominated().is_some())
                .find_map(|h| self.state.job_by_uid(&h.job_uid))
                .map(|j| &j.key),
        }?;
        (*other != job.key)
            .then(|| format!(" (room there is kept for {other}, which is ahead of it)"))
    }
}

/// Of `among` (the queue's workers, by position), those that could hold the gang empty.
pub(super) fn could_hold<'w>(
    look: &Look<'w>,
    among: &[usize],
    oracle: &mut impl Oracle<'w>,
) -> Vec<usize> {
    oracle.could_hold(&look.gang, &look.settings.clusters, among)
}

/// Up to four names, then how many more.
fn short_list(names: &[&str]) -> String {
    match names.len() {
        0..=4 => names.join(", "),
        n => format!("{} and {} more", names[..3].join(", "), n - 3),
    }
}
