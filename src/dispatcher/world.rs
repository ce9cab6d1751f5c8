//! Everything the dispatcher knows at one instant: the [`State`] of the clusters, the
//! [`Ledger`] of what the queues use and hold, and the [`Caches`] that speed admission up.
//! Every change goes through the `World`, which keeps the three in step: what changed in
//! the state or the ledger is told to the caches, whose memos it may lapse.

use super::caches::Caches;
use super::job::{Job, JobKey};
use super::kind::Kind;
use super::ledger::{Hold, Ledger};
use super::state::{Queue, State, Worker, WorkerCopy};
use crate::inventory::Inventory;
use crate::placement::EngineConfig;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How admission judges whether a worker can take a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The placement engine's exact fit of the whole gang, node by node and NUMA zone by
    /// NUMA zone (Switchyard).
    #[default]
    Exact,
    /// The sum of the worker's free resources covers the gang, as a virtual node summing its
    /// cluster would judge it (`simulate --strategy sum-aggregate`).
    SumOfFree,
    /// No judgement: the Job is offered to every worker of its queue at once and the first
    /// to run all its pods keeps it (MultiKueue without a placement of its own;
    /// `simulate --strategy all-at-once`).
    Everywhere,
}

impl Placement {
    /// Whether room is kept for starving Jobs: only the exact fit can say which nodes and
    /// NUMA zones a gang will take. The others stand for Kueue's ways, which keep none.
    pub(crate) fn keeps_room(self) -> bool {
        self == Placement::Exact
    }
}

/// Tunables of the decisions.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub placement: Placement,
    /// `switchyard.dev/origin` on worker copies: tells this manager's copies from others'.
    pub manager_id: String,
    pub engine: EngineConfig,
    /// The longest a placement is held for a Job whose pods never all become Ready.
    pub hold_timeout: Duration,
    /// How long a claimed Job may wait for its copy to be created before another attempt.
    pub create_retry_after: Duration,
    /// How long a queue waits, before admitting anything, for the copies of one of its
    /// workers that answers to be listed (a new leader's first list, a relist): a copy of a
    /// Job taken back may still run there and use the queue's quota. A worker whose copies
    /// cannot be listed for longer (its RBAC forbids it, say) is left out of the count.
    pub unlisted_grace: Duration,
    /// A message-only change of a waiting Job's reason is written at most this often.
    pub wait_rewrite_after: Duration,
    /// A worker that refused a Job's copy is not asked again for that Job before
    /// `base × 2^(n−1)` (n: refusals in a row), at most `max`. Other workers are tried at once.
    pub refusal_backoff_base: Duration,
    pub refusal_backoff_max: Duration,
    /// Build the messages that say why Jobs wait (off in `simulate` until the end).
    pub describe: bool,
    /// Answer admission's questions from the caches. Off only to hold the caches to the
    /// plain answers.
    pub remember: bool,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            manager_id: "switchyard".into(),
            placement: Placement::Exact,
            engine: EngineConfig::default(),
            hold_timeout: Duration::from_secs(600),
            create_retry_after: Duration::from_secs(10),
            unlisted_grace: Duration::from_secs(60),
            wait_rewrite_after: Duration::from_secs(30),
            refusal_backoff_base: Duration::from_secs(5),
            refusal_backoff_max: Duration::from_secs(300),
            describe: true,
            remember: true,
        }
    }
}

impl DispatchConfig {
    /// How long a worker is left alone for a Job after its `n`-th refusal in a row.
    pub(crate) fn refusal_backoff(&self, n: u32) -> Duration {
        let factor = 2u32.checked_pow(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.refusal_backoff_base
            .checked_mul(factor)
            .map_or(self.refusal_backoff_max, |d| {
                d.min(self.refusal_backoff_max)
            })
    }
}

/// The state, the ledger and the caches, kept in step.
#[derive(Debug, Clone, Default)]
pub(crate) struct World {
    pub(crate) config: DispatchConfig,
    pub(crate) state: State,
    pub(crate) ledger: Ledger,
    pub(super) caches: Caches,
}

impl World {
    pub(crate) fn new(config: DispatchConfig) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    /// Adds or replaces a manager Job.
    pub(crate) fn upsert_job(&mut self, job: Job) {
        let lingering = self.state.runs_unclaimed(&job);
        self.ledger
            .recount(self.state.jobs.get(&job.key), &job, lingering);
        self.state.put_job(job);
    }

    /// Counts the Job of origin `uid` again in its queue's totals after its copies changed
    /// (or their worker's reach): a Job taken back holds its quota until its old copy is gone.
    fn recount_copies_of(&mut self, uid: &str) {
        if let Some(job) = self.state.job_by_uid(uid) {
            let lingering = self.state.runs_unclaimed(job);
            self.ledger.recount(Some(job), job, lingering);
        }
    }

    /// Forgets a manager Job (deleted). Its copies stay until they are removed.
    pub(crate) fn remove_job(&mut self, key: &JobKey) -> Option<Job> {
        self.ledger.forget(key);
        let job = self.state.take_job(key)?;
        self.release(&job.uid);
        Some(job)
    }

    pub(crate) fn upsert_copy(&mut self, copy: WorkerCopy) {
        if copy.deleting {
            // Its pods are going: the room they free shows in the inventory when they are
            // gone, and the worker may stop holding stale copies.
            self.caches
                .worker_changed(&copy.cluster, &self.state.queues);
        }
        let uid = copy.origin_uid.clone();
        self.state.put_copy(copy);
        self.recount_copies_of(&uid);
    }

    /// A copy is gone. Its name is free there again: that concerns only the Job of that
    /// name, judged on its own while the copy was there. A worker whose last stale copy
    /// this was may take Jobs again: the next pass sees it. The room its pods free is the
    /// inventory's to show.
    pub(crate) fn remove_copy(&mut self, cluster: &str, origin_uid: &str) {
        self.state.take_copy(cluster, origin_uid);
        self.recount_copies_of(origin_uid);
    }

    /// The copy `uid` (of the Job `origin_uid`) is gone from `cluster`: removed as asked, or
    /// its watch said so. Forgotten, unless another copy of the Job has taken its place there
    /// since: the answer to a removal can come after the Job was dispatched to the same
    /// worker again and its new copy seen, and forgetting that one would leave it running
    /// there, unknown, whatever becomes of the Job.
    pub(crate) fn forget_copy(&mut self, cluster: &str, origin_uid: &str, uid: &str) {
        if self
            .state
            .copy_in(origin_uid, cluster)
            .is_some_and(|c| c.uid != uid)
        {
            return;
        }
        self.remove_copy(cluster, origin_uid);
    }

    /// Replaces every copy known in `cluster` (after a relist).
    /// The copies of `kind` in `cluster` are `copies`.
    pub(crate) fn replace_copies(&mut self, cluster: &str, kind: Kind, copies: Vec<WorkerCopy>) {
        for uid in self.state.copy_uids_in(cluster, kind) {
            self.remove_copy(cluster, &uid);
        }
        for c in copies {
            self.upsert_copy(c);
        }
    }

    pub(crate) fn upsert_worker(&mut self, worker: Worker) {
        let changed = self.state.workers.get(&worker.name).is_none_or(|w| {
            w.connected != worker.connected || w.copies_synced() != worker.copies_synced()
        });
        if changed {
            self.state.touch_jobs_in(&worker.name);
            self.caches
                .capacity_changed(&worker.name, &self.state.queues);
        }
        let name = worker.name.clone();
        self.state.workers.insert(name.clone(), worker);
        if changed {
            self.recount_copies_in(&name);
        }
    }

    pub(crate) fn remove_worker(&mut self, name: &str) {
        self.state.workers.remove(name);
        self.state.touch_jobs_in(name);
        self.caches.capacity_changed(name, &self.state.queues);
        self.recount_copies_in(name);
    }

    /// [`World::recount_copies_of`] for every Job with a copy in `cluster`.
    fn recount_copies_in(&mut self, cluster: &str) {
        let origins: Vec<String> = self
            .state
            .copy_uids_in_any(cluster)
            .map(|(_, origin)| origin.to_string())
            .collect();
        for uid in origins {
            self.recount_copies_of(&uid);
        }
    }

    pub(crate) fn upsert_queue(&mut self, queue: Queue) {
        self.caches.queues_changed();
        self.state.queues.insert(queue.name.clone(), queue);
    }

    pub(crate) fn remove_queue(&mut self, name: &str) {
        self.caches.queues_changed();
        self.state.queues.remove(name);
    }

    /// Replaces the inventory; workers whose data changed may have gained room.
    pub(crate) fn set_inventory(&mut self, inventory: Arc<Inventory>) {
        let old = std::mem::replace(&mut self.state.inventory, inventory);
        self.caches
            .inventory_replaced(&old, &self.state.inventory, &self.state.queues);
    }

    /// Holds a placement for an admitted Job, or room for a starving one (replacing any it
    /// had).
    pub(crate) fn hold(&mut self, hold: Hold) {
        self.caches.holds_changed(&hold.cluster);
        if hold.nominated().is_some() {
            self.caches.kept_changed();
        }
        if let Some(old) = self.ledger.hold(hold) {
            self.released(&old);
        }
    }

    /// Stops holding the Job's placement.
    pub(crate) fn release(&mut self, job_uid: &str) {
        if let Some(old) = self.ledger.release(job_uid) {
            self.released(&old);
        }
    }

    fn released(&mut self, old: &Hold) {
        self.caches.holds_changed(&old.cluster);
        if old.nominated().is_some() {
            self.caches.kept_changed();
        }
        for t in &old.takes {
            self.caches.capacity_changed_on(&old.cluster, t.index);
        }
    }

    /// Node `index` of the worker may have gained room (a pod ended, or a placement planned
    /// there was not carried out).
    pub(crate) fn node_gained_room(&mut self, cluster: &str, index: usize) {
        self.caches.capacity_changed_on(cluster, index);
    }

    /// Node `index` of the worker lost room (a pod was bound there).
    pub(crate) fn node_lost_room(&mut self, cluster: &str, index: usize) {
        self.caches.node_lost_room(cluster, index);
    }

    /// Marks a Job for the next reconcile.
    pub(crate) fn touch(&mut self, key: &JobKey) {
        self.state.touch(key);
    }

    /// Marks every Job (a periodic resync).
    pub(crate) fn touch_all(&mut self) {
        self.state.touch_all();
    }

    pub(super) fn take_dirty(&mut self) -> BTreeSet<JobKey> {
        self.state.take_dirty()
    }
}
