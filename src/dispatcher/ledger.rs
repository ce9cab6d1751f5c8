//! What the queues owe and hold: each queue's quota in use, its pending Jobs by class in
//! admission order, its admitted Jobs not yet Ready, and the placements held for dispatched
//! Jobs until their workers' inventories show them. Kept up to date Job by Job as Jobs
//! change, so that admission never adds up every Job. Held with them: the room kept for
//! starving Jobs (their nominated placements), which every view of the workers takes off
//! as it takes off a dispatched Job's placement.

use super::job::{ClassKey, Job, JobKey, Rank};
use crate::placement::inflight::Take;
use foldhash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

/// Per-queue totals kept as Jobs change.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueUse {
    /// Admitted Jobs' requests, per resource name.
    pub(crate) usage: BTreeMap<String, i64>,
    pub(crate) pending: usize,
    pub(crate) admitted: usize,
    /// Admitted Jobs whose pods are all Ready.
    pub(crate) running: usize,
    /// Admitted Jobs not yet PodsReady (the blockAdmission gate), in rank order.
    pub(crate) not_ready: BTreeSet<Rank>,
}

/// Room in one worker that no other Job may take: the placement of a dispatched Job whose
/// pods its worker's inventory does not show yet, or the room kept for a starving Job.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) job_uid: String,
    pub(crate) cluster: String,
    pub(crate) takes: Vec<Take>,
    pub(crate) kind: HoldKind,
    pub(crate) since: SystemTime,
    /// Which hold this is, among all the ledger ever held (set by [`Ledger::hold`]): its
    /// takes never change, so the serial stands for them.
    pub(crate) serial: u64,
}

/// Which kind of room a [`Hold`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldKind {
    /// The placement of a dispatched Job, held until its worker's inventory shows its pods
    /// (or for at most `hold_timeout`).
    Dispatched,
    /// A nominated placement: the nodes and NUMA zones a pending Job that waited
    /// `starvationAfter` will take once enough of the pods running there end. Kept while
    /// the Job starves and the worker stays as it was when the room was chosen.
    Nominated(Nominated),
}

/// What a nominated placement was chosen for: it stands while these are unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nominated {
    /// The Job's pod shape and gang size.
    pub(crate) shape: u64,
    pub(crate) pods: u32,
    /// The worker's capacity (its nodes and their allocatable) then.
    pub(crate) capacity: u64,
}

impl Hold {
    pub(crate) fn nominated(&self) -> Option<&Nominated> {
        match &self.kind {
            HoldKind::Nominated(n) => Some(n),
            HoldKind::Dispatched => None,
        }
    }
}

/// What one Job contributes to its queue's totals.
#[derive(Debug, Clone, Default, PartialEq)]
struct Charge {
    queue: String,
    usage: BTreeMap<String, i64>,
    /// A pending Job's class and its rank there (removed by rank, not by looking through the
    /// class: a busy queue's class holds thousands of Jobs).
    pending: Option<(ClassKey, Rank)>,
    admitted: bool,
    running: bool,
    rank: Option<Rank>,
    /// Its usage is counted for a copy that still runs, not for a claim (see
    /// [`Charge::of`]).
    lingering: bool,
}

impl Charge {
    /// What `job` contributes to its queue's totals as it is now. `lingering`: it holds no
    /// quota of its own (taken back, deactivated) but a copy of it still runs in a worker
    /// that answers; the quota is in use until that copy is gone, as Kueue keeps an evicted
    /// workload's quota until its Job has stopped. Otherwise a requeue would give the quota
    /// to the next Job while the old copy's pods still run.
    fn of(job: &Job, lingering: bool) -> Self {
        let mut c = Charge {
            queue: job.queue.clone(),
            ..Default::default()
        };
        if job.holds_quota() {
            c.usage = job.total_request();
            c.admitted = true;
            if job.pods_ready().is_some_and(|(ready, _)| ready) {
                c.running = true;
            } else {
                c.rank = Some(job.rank());
            }
        } else {
            if lingering {
                c.usage = job.total_request();
            }
            if job.is_pending() {
                c.pending = Some((job.class(), job.rank()));
            }
        }
        c.lingering = lingering;
        c
    }
}

/// Whether two states of a Job count alike in its queue's totals and pending classes: what
/// `Charge::of` reads is the same in both (cheaper than making both charges; debug builds
/// check that the charge kept is the one the new state would make).
fn charged_alike(a: &Job, b: &Job) -> bool {
    let ready = |j: &Job| j.pods_ready().is_some_and(|(r, _)| r);
    let same_pod = match (&a.pod, &b.pod) {
        (Ok(x), Ok(y)) => Arc::ptr_eq(x, y) || x.node_request == y.node_request,
        (Err(_), Err(_)) => true,
        _ => false,
    };
    a.queue == b.queue
        && a.priority == b.priority
        && a.created == b.created
        && a.shape_key == b.shape_key
        && a.gang() == b.gang()
        && same_pod
        && a.holds_quota() == b.holds_quota()
        && a.is_pending() == b.is_pending()
        && ready(a) == ready(b)
}

/// The queues' totals and the placements held.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    uses: BTreeMap<String, QueueUse>,
    charges: HashMap<JobKey, Charge>,
    pending: BTreeMap<ClassKey, BTreeSet<Rank>>,
    /// By Job uid; only looked up, never gone through (so in no order).
    holds: HashMap<String, Arc<Hold>>,
    /// Per worker, the placements held there by Job uid (shared with `holds`): going
    /// through a worker's holds looks nothing up.
    held_in: HashMap<String, BTreeMap<String, Arc<Hold>>>,
    /// The serial of the last placement held (see [`Hold::serial`]).
    hold_serial: u64,
    /// The Jobs (by uid) whose hold is a nominated placement.
    nominated: BTreeSet<String>,
    /// The queue and namespace names of the pending classes, one allocation each: keys of
    /// one class then compare equal by address, not by their text (passes look classes up
    /// in every memo).
    class_names: Names,
}

/// Names shared by [`ClassKey`]s.
#[derive(Debug, Clone, Default)]
struct Names {
    set: foldhash::HashSet<Arc<str>>,
    /// The size past which names no key holds any more are let go.
    prune_past: usize,
}

impl Names {
    /// Has `name` point at the one allocation of its text.
    fn share(&mut self, name: &mut Arc<str>) {
        match self.set.get(&**name) {
            Some(shared) => *name = shared.clone(),
            None => {
                if self.set.len() >= self.prune_past {
                    self.set.retain(|n| Arc::strong_count(n) > 1);
                    self.prune_past = 2 * self.set.len() + 16;
                }
                self.set.insert(name.clone());
            }
        }
    }
}

impl Ledger {
    /// Counts `job` as it is now (`lingering`: see [`Charge::of`]; never true of a Job that
    /// holds quota), replacing how its earlier state `old` counted.
    pub(super) fn recount(&mut self, old: Option<&Job>, job: &Job, lingering: bool) {
        // Most changes (a status mirrored, an annotation, a copy's status) leave the queue's
        // totals alone.
        let kept = self.charges.get(&job.key);
        if old.is_some_and(|old| charged_alike(old, job))
            && kept.is_some_and(|c| c.lingering == lingering)
        {
            // What `charged_alike` compares must be all that a charge reads.
            debug_assert_eq!(kept, Some(&Charge::of(job, lingering)));
            return;
        }
        self.uncharge(&job.key);
        self.charge(job, lingering);
    }

    /// Stops counting the Job.
    pub(super) fn forget(&mut self, key: &JobKey) {
        self.uncharge(key);
    }

    pub(crate) fn queue_use(&self, queue: &str) -> Option<&QueueUse> {
        self.uses.get(queue)
    }

    pub(crate) fn queue_uses(&self) -> impl Iterator<Item = (&String, &QueueUse)> {
        self.uses.iter()
    }

    /// Pending Jobs by class, each class in admission order.
    pub(crate) fn pending_classes(&self) -> &BTreeMap<ClassKey, BTreeSet<Rank>> {
        &self.pending
    }

    fn uncharge(&mut self, key: &JobKey) {
        let Some(c) = self.charges.remove(key) else {
            return;
        };
        // A charge's queue has had its use since the charge was made (uses are never removed).
        if let Some(u) = self.uses.get_mut(&c.queue) {
            for (r, v) in &c.usage {
                if let Some(x) = u.usage.get_mut(r) {
                    *x -= v;
                    if *x == 0 {
                        u.usage.remove(r);
                    }
                }
            }
            if c.admitted {
                u.admitted -= 1;
            }
            if c.running {
                u.running -= 1;
            }
            if let Some(rank) = &c.rank {
                u.not_ready.remove(rank);
            }
            if c.pending.is_some() {
                u.pending -= 1;
            }
        }
        if let Some((class, rank)) = &c.pending {
            if let Some(set) = self.pending.get_mut(class) {
                set.remove(rank);
                if set.is_empty() {
                    self.pending.remove(class);
                }
            }
        }
    }

    fn charge(&mut self, job: &Job, lingering: bool) {
        let mut c = Charge::of(job, lingering);
        if let Some((class, _)) = &mut c.pending {
            self.class_names.share(&mut class.queue);
            self.class_names.share(&mut class.namespace);
        }
        // Names are copied into the totals only the first time.
        let u = match self.uses.get_mut(&c.queue) {
            Some(u) => u,
            None => self.uses.entry(c.queue.clone()).or_default(),
        };
        for (r, v) in &c.usage {
            match u.usage.get_mut(r) {
                Some(total) => *total += v,
                None => {
                    u.usage.insert(r.clone(), *v);
                }
            }
        }
        if c.admitted {
            u.admitted += 1;
        }
        if c.running {
            u.running += 1;
        }
        if let Some(rank) = &c.rank {
            u.not_ready.insert(rank.clone());
        }
        if let Some((class, rank)) = &c.pending {
            u.pending += 1;
            self.pending
                .entry(class.clone())
                .or_default()
                .insert(rank.clone());
        }
        self.charges.insert(job.key.clone(), c);
    }

    /// Holds a placement for an admitted Job (replacing any it had, which is returned).
    pub(super) fn hold(&mut self, mut hold: Hold) -> Option<Arc<Hold>> {
        self.hold_serial += 1;
        hold.serial = self.hold_serial;
        let hold = Arc::new(hold);
        self.held_in
            .entry(hold.cluster.clone())
            .or_default()
            .insert(hold.job_uid.clone(), hold.clone());
        if hold.nominated().is_some() {
            self.nominated.insert(hold.job_uid.clone());
        } else {
            self.nominated.remove(&hold.job_uid);
        }
        let cluster = hold.cluster.clone();
        let old = self.holds.insert(hold.job_uid.clone(), hold)?;
        if old.cluster != cluster {
            self.unheld(&old);
        }
        Some(old)
    }

    /// Stops holding the Job's placement; returns it.
    pub(super) fn release(&mut self, job_uid: &str) -> Option<Arc<Hold>> {
        let old = self.holds.remove(job_uid)?;
        self.nominated.remove(job_uid);
        self.unheld(&old);
        Some(old)
    }

    fn unheld(&mut self, hold: &Hold) {
        if let Some(uids) = self.held_in.get_mut(&hold.cluster) {
            uids.remove(&hold.job_uid);
            if uids.is_empty() {
                self.held_in.remove(&hold.cluster);
            }
        }
    }

    /// The placements held in `cluster`, by Job uid.
    pub(crate) fn holds_in<'l>(&'l self, cluster: &str) -> impl Iterator<Item = &'l Hold> + 'l {
        self.held_in
            .get(cluster)
            .into_iter()
            .flat_map(|holds| holds.values().map(Arc::as_ref))
    }

    /// Whether some placement is held in `cluster`.
    pub(crate) fn holds_any_in(&self, cluster: &str) -> bool {
        self.held_in.contains_key(cluster)
    }

    pub(crate) fn hold_of(&self, job_uid: &str) -> Option<&Hold> {
        self.holds.get(job_uid).map(Arc::as_ref)
    }

    /// The nodes of `cluster` where room is kept for Jobs other than `job_uid`, less the
    /// nodes of that Job's own placement there (it was found to fit beside the room): the
    /// nodes its copy's pods are kept off, by name.
    pub(crate) fn keep_off(&self, job_uid: &str, cluster: &str) -> Vec<Arc<str>> {
        let own = self.placed_on(job_uid, cluster);
        let mut nodes: Vec<Arc<str>> = self
            .holds_in(cluster)
            .filter(|h| h.nominated().is_some() && h.job_uid != job_uid)
            .flat_map(|h| &h.takes)
            .map(|t| &t.node)
            .filter(|n| own.binary_search(n).is_err())
            .cloned()
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// The nodes of `job_uid`'s own placement in `cluster`, by name: the nodes its copy's pods
    /// there prefer.
    pub(crate) fn placed_on(&self, job_uid: &str, cluster: &str) -> Vec<Arc<str>> {
        let mut nodes: Vec<Arc<str>> = self
            .hold_of(job_uid)
            .filter(|h| h.cluster == cluster)
            .map(|h| h.takes.iter().map(|t| t.node.clone()).collect())
            .unwrap_or_default();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// The nominated placements, by Job uid.
    pub(crate) fn nominations(&self) -> impl Iterator<Item = &Hold> + '_ {
        self.nominated.iter().filter_map(|uid| self.hold_of(uid))
    }
}

#[cfg(test)]
mod names_tests {
    use super::Names;
    use std::sync::Arc;

    /// Keys of one class point at one allocation of each name, and names no key holds any
    /// more are let go once there are many.
    #[test]
    fn class_names_are_shared_and_let_go() {
        let mut names = Names::default();
        let mut first: Arc<str> = Arc::from("research");
        let mut second: Arc<str> = Arc::from("research");
        names.share(&mut first);
        names.share(&mut second);
        assert!(Arc::ptr_eq(&first, &second));
        for i in 0..1000 {
            let mut gone: Arc<str> = Arc::from(format!("namespace-{i}"));
            names.share(&mut gone);
        }
        assert!(names.set.len() < 100, "{} names kept", names.set.len());
        let mut third: Arc<str> = Arc::from("research");
        names.share(&mut third);
        assert!(Arc::ptr_eq(&first, &third));
    }
}
