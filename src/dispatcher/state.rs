//! What the dispatcher knows of the clusters, as plain data: the manager's Jobs, their copies
//! in the workers, the queues, the workers and their inventory, and what the API servers
//! answered to the dispatcher's writes. Kept with the indexes the decisions look things up
//! by (copies by origin uid and by name, stale copies, orphans), so that no decision walks
//! every Job.

use super::job::{Job, JobKey};
use super::kind::{Kind, Status};
use super::kueue::WorkerQueues;
use crate::api::QueueSettings;
use crate::inventory::Inventory;
use foldhash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A worker's copy of a manager Job (labelled with our origin).
#[derive(Debug, Clone)]
pub(crate) struct WorkerCopy {
    pub(crate) cluster: String,
    pub(crate) key: JobKey,
    pub(crate) uid: String,
    /// The manager Job's uid, from the copy's `switchyard.dev/origin-uid` label.
    pub(crate) origin_uid: String,
    pub(crate) status: Status,
    pub(crate) deleting: bool,
    /// Its `spec.suspend`: in a Kueue worker, true until the worker's Kueue admits it.
    pub(crate) suspended: bool,
    /// It was sent to its worker's Kueue (its `kueue.x-k8s.io/queue-name` label).
    pub(crate) kueue: bool,
}

impl WorkerCopy {
    /// The pods of `job`'s gang that are Ready or done, as the copy's status tells.
    pub(crate) fn ready_pods(&self, job: &Job) -> u32 {
        self.status.ready_pods(&job.parts)
    }
}

/// What the dispatcher sees of a worker.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    pub(crate) name: String,
    pub(crate) connected: bool,
    /// Since when it cannot be reached (kept across retries).
    pub(crate) disconnected_since: Option<SystemTime>,
    /// Since when its copies are not known: not listed yet since it was last (re)connected,
    /// or being listed again after its watch lost its place. `None`: listed, and a copy
    /// missing from the list is really missing.
    pub(crate) copies_unlisted_since: Option<SystemTime>,
    /// Why it is not usable, for people.
    pub(crate) message: String,
    /// It runs Kueue: the LocalQueue copies enter (`WorkerCluster.spec.kueue`).
    pub(crate) kueue: Option<String>,
    /// What its Kueue shows (empty when it runs none).
    pub(crate) queues: Arc<WorkerQueues>,
}

impl Worker {
    /// A worker that answers and whose copies are known.
    pub(crate) fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            connected: true,
            disconnected_since: None,
            copies_unlisted_since: None,
            message: String::new(),
            kueue: None,
            queues: Arc::default(),
        }
    }

    pub(crate) fn copies_synced(&self) -> bool {
        self.copies_unlisted_since.is_none()
    }

    pub(crate) fn usable(&self) -> bool {
        self.connected && self.copies_synced()
    }

    /// Unreachable for `lost_after` or longer at `now`: its Jobs are given up for lost (a
    /// shorter disconnect changes nothing).
    pub(crate) fn lost(&self, now: SystemTime, lost_after: Duration) -> bool {
        !self.connected && self.disconnected_since.unwrap_or(now) + lost_after <= now
    }
}

/// A queue: its settings, or why they are unusable.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    pub(crate) name: String,
    pub(crate) settings: Result<QueueSettings, String>,
}

/// A write the manager's API server refused for good: not tried again while the Job stays
/// at this resourceVersion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusedWrite {
    pub(crate) resource_version: String,
    pub(crate) action: &'static str,
}

/// What the API servers answered to the dispatcher's writes, as far as later decisions
/// depend on it (all by manager Job uid).
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteLog {
    /// The digest of the copy status whose mirror the API server refused last: the same
    /// write is not retried forever.
    pub(crate) refused_status: HashMap<String, u64>,
    /// When a claimed Job's copy was last attempted.
    pub(crate) create_attempted: HashMap<String, SystemTime>,
    /// Writes refused for good (see [`RefusedWrite`]).
    pub(crate) refused_writes: HashMap<String, RefusedWrite>,
}

impl WriteLog {
    fn forget(&mut self, uid: &str) {
        self.refused_status.remove(uid);
        self.create_attempted.remove(uid);
        self.refused_writes.remove(uid);
    }
}

/// Everything the dispatcher knows of the clusters at one instant.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    pub(crate) jobs: HashMap<JobKey, Job>,
    /// The manager's Jobs have been listed: a Job missing from the list is gone (copies of
    /// missing Jobs are only removed after that).
    pub(crate) jobs_synced: bool,
    pub(crate) queues: BTreeMap<String, Queue>,
    pub(crate) workers: BTreeMap<String, Worker>,
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) writes: WriteLog,
    /// By origin uid, then worker.
    copies: HashMap<String, BTreeMap<String, WorkerCopy>>,
    by_uid: HashMap<String, JobKey>,
    /// Per namespace/name, the workers holding a copy by that name, with the copy's origin
    /// uid (keyed by name first: admission asks "is this name taken anywhere" per Job).
    names: HashMap<JobKey, HashMap<String, String>>,
    /// Per worker, the origin uids of copies that should not exist and are not being deleted
    /// yet: nothing new is dispatched there until they are (a worker that comes back first
    /// loses the copies of the Jobs taken back from it).
    stale: BTreeMap<String, BTreeSet<String>>,
    /// Origin uids of copies whose Job is unknown.
    orphan_uids: BTreeSet<String>,
    /// Jobs changed since they were last reconciled.
    dirty: BTreeSet<JobKey>,
    /// Jobs to look at again at a deadline (PodsReady, worker lost, retries).
    timers: BTreeMap<SystemTime, BTreeSet<JobKey>>,
}

impl State {
    /// The settings of queue `name`, when it exists and its spec is valid.
    pub(crate) fn settings(&self, name: &str) -> Option<&QueueSettings> {
        self.queues.get(name)?.settings.as_ref().ok()
    }

    /// Adds or replaces a manager Job; returns the one it replaces.
    pub(super) fn put_job(&mut self, job: Job) -> Option<Job> {
        match self.jobs.get(&job.key) {
            Some(old) if old.uid == job.uid => {}
            Some(old) => {
                self.by_uid.remove(&old.uid);
                self.by_uid.insert(job.uid.clone(), job.key.clone());
            }
            None => {
                self.by_uid.insert(job.uid.clone(), job.key.clone());
            }
        }
        if !self.dirty.contains(&job.key) {
            self.dirty.insert(job.key.clone());
        }
        let uid = job.uid.clone();
        // Most puts change a Job already known: its key is copied only for a new one.
        let old = match self.jobs.get_mut(&job.key) {
            Some(known) => Some(std::mem::replace(known, job)),
            None => self.jobs.insert(job.key.clone(), job),
        };
        self.restale(&uid, None);
        old
    }

    /// Forgets a manager Job (deleted). Its copies stay until they are removed.
    pub(super) fn take_job(&mut self, key: &JobKey) -> Option<Job> {
        let job = self.jobs.remove(key)?;
        self.by_uid.remove(&job.uid);
        self.writes.forget(&job.uid);
        self.dirty.remove(key);
        self.restale(&job.uid, None);
        Some(job)
    }

    pub(crate) fn job_by_uid(&self, uid: &str) -> Option<&Job> {
        self.by_uid.get(uid).and_then(|k| self.jobs.get(k))
    }

    /// The action of the Job's that the API server refused while the Job was as it is now.
    pub(crate) fn refused_write(&self, job: &Job) -> Option<&'static str> {
        self.writes
            .refused_writes
            .get(&job.uid)
            .filter(|w| w.resource_version == job.resource_version)
            .map(|w| w.action)
    }

    pub(super) fn put_copy(&mut self, copy: WorkerCopy) {
        if let Some(key) = self.by_uid.get(&copy.origin_uid) {
            if !self.dirty.contains(key) {
                self.dirty.insert(key.clone());
            }
        }
        // Most puts change a copy already known (its status): names are copied into the maps
        // only for a new one.
        let names = match self.names.get_mut(&copy.key) {
            Some(names) => names,
            None => self.names.entry(copy.key.clone()).or_default(),
        };
        match names.get_mut(&copy.cluster) {
            Some(uid) => {
                if *uid != copy.origin_uid {
                    uid.clone_from(&copy.origin_uid);
                }
            }
            None => {
                names.insert(copy.cluster.clone(), copy.origin_uid.clone());
            }
        }
        let uid = copy.origin_uid.clone();
        let by_cluster = match self.copies.get_mut(&uid) {
            Some(by_cluster) => by_cluster,
            None => self.copies.entry(uid.clone()).or_default(),
        };
        match by_cluster.get_mut(&copy.cluster) {
            Some(known) => *known = copy,
            None => {
                by_cluster.insert(copy.cluster.clone(), copy);
            }
        }
        // The copy's worker is among its Job's copies' now.
        self.restale(&uid, None);
    }

    pub(super) fn take_copy(&mut self, cluster: &str, origin_uid: &str) {
        if let Some(m) = self.copies.get_mut(origin_uid) {
            if let Some(c) = m.remove(cluster) {
                if let Some(names) = self.names.get_mut(&c.key) {
                    if names.get(cluster).map(String::as_str) == Some(origin_uid) {
                        names.remove(cluster);
                    }
                    if names.is_empty() {
                        self.names.remove(&c.key);
                    }
                }
            }
            if m.is_empty() {
                self.copies.remove(origin_uid);
            }
        }
        if let Some(key) = self.by_uid.get(origin_uid) {
            self.dirty.insert(key.clone());
        }
        self.restale(origin_uid, Some(cluster));
    }

    /// The origin uids of every copy known in `cluster`.
    /// Every copy in `cluster`: (its uid, its origin uid).
    pub(crate) fn copy_uids_in_any<'a>(
        &'a self,
        cluster: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.copies.iter().filter_map(move |(origin, m)| {
            m.get(cluster).map(|c| (c.uid.as_str(), origin.as_str()))
        })
    }

    /// The origin uids of the copies of `kind` in `cluster`.
    pub(super) fn copy_uids_in(&self, cluster: &str, kind: Kind) -> Vec<String> {
        self.copies
            .iter()
            .filter(|(_, m)| m.get(cluster).is_some_and(|c| c.key.kind == kind))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The copies of the Job with this uid, by cluster.
    pub(crate) fn copies_of(&self, uid: &str) -> impl Iterator<Item = &WorkerCopy> {
        self.copies.get(uid).into_iter().flat_map(|m| m.values())
    }

    pub(crate) fn copy_in(&self, uid: &str, cluster: &str) -> Option<&WorkerCopy> {
        self.copies.get(uid).and_then(|m| m.get(cluster))
    }

    /// A copy of the Job alive in a worker that answers, or maybe alive: the worker it was
    /// taken back from answers but its copies are not listed (yet, or again after its watch
    /// lost its place), so a copy there may be missing from what this replica knows. Copies
    /// in a worker that does not answer are given up for lost and removed when it returns.
    pub(crate) fn still_running(&self, job: &Job) -> bool {
        let unknown = |name: &str| {
            self.workers
                .get(name)
                .is_some_and(|w| w.connected && !w.copies_synced())
        };
        job.avoid.as_deref().is_some_and(unknown)
            || self.copies_of(&job.uid).any(|c| self.alive_in_reach(c))
    }

    /// The copy is not being deleted and its worker answers (a copy in a worker that does
    /// not is given up for lost).
    fn alive_in_reach(&self, c: &WorkerCopy) -> bool {
        !c.deleting && self.workers.get(&c.cluster).is_some_and(|w| w.connected)
    }

    /// A Job that holds no quota of its own (taken back, deactivated, deleted) while a copy
    /// of it still runs in a worker that answers: its pods use the queue's quota until the
    /// copy is gone. Copies in a worker that does not answer are given up for lost.
    pub(crate) fn runs_unclaimed(&self, job: &Job) -> bool {
        !job.holds_quota()
            && self
                .copies_of(&job.uid)
                .any(|c| self.alive_in_reach(c) && c.status.terminal().is_none())
    }

    /// A copy of the Job alive in a worker that answers, other than `kept`.
    pub(crate) fn still_running_elsewhere(&self, job: &Job, kept: &[impl AsRef<str>]) -> bool {
        self.copies_of(&job.uid)
            .any(|c| !kept.iter().any(|k| k.as_ref() == c.cluster) && self.alive_in_reach(c))
    }

    /// The copy of a Job with another uid holding `key`'s name in `cluster` (an earlier Job
    /// of the same name, not yet removed there).
    pub(crate) fn foreign_copy(
        &self,
        key: &JobKey,
        uid: &str,
        cluster: &str,
    ) -> Option<&WorkerCopy> {
        let origin = self.names.get(key)?.get(cluster)?;
        if origin == uid {
            return None;
        }
        self.copy_in(origin, cluster)
    }

    /// Whether some worker holds a copy named `key` of another Job than `uid` (see
    /// [`State::foreign_copy`]).
    pub(crate) fn has_foreign_copy(&self, key: &JobKey, uid: &str) -> bool {
        self.names.get(key).is_some_and(|m| {
            m.iter()
                .any(|(cluster, origin)| origin != uid && self.copy_in(origin, cluster).is_some())
        })
    }

    /// Copies whose origin Job is unknown.
    pub(crate) fn orphans(&self) -> impl Iterator<Item = &WorkerCopy> {
        self.orphan_uids
            .iter()
            .filter_map(|uid| self.copies.get(uid))
            .flat_map(|m| m.values())
    }

    /// Whether `cluster` holds copies that should not exist and are not being deleted yet.
    pub(crate) fn has_stale_copies(&self, cluster: &str) -> bool {
        self.stale.get(cluster).is_some_and(|s| !s.is_empty())
    }

    /// The workers holding copies that should not exist.
    pub(super) fn workers_with_stale_copies(&self) -> Vec<String> {
        self.stale
            .iter()
            .filter(|(_, uids)| !uids.is_empty())
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Recomputes where the copies of `uid` are stale (and whether they are orphans); `also`
    /// is a worker where one of them just went away.
    fn restale(&mut self, uid: &str, also: Option<&str>) {
        let clusters = self
            .copies
            .get(uid)
            .into_iter()
            .flat_map(|m| m.keys().map(String::as_str))
            .chain(also);
        for c in clusters {
            if let Some(set) = self.stale.get_mut(c) {
                set.remove(uid);
            }
        }
        let job = self.by_uid.get(uid).and_then(|k| self.jobs.get(k));
        let Some(copies) = self.copies.get(uid) else {
            self.orphan_uids.remove(uid);
            return;
        };
        if job.is_none() {
            self.orphan_uids.insert(uid.to_string());
        } else {
            self.orphan_uids.remove(uid);
        }
        for c in copies.values() {
            let stale = !c.deleting
                && match job {
                    None => true,
                    Some(j) => !j.kept_clusters().contains(&c.cluster),
                };
            if stale {
                self.stale
                    .entry(c.cluster.clone())
                    .or_default()
                    .insert(uid.to_string());
            }
        }
    }

    /// Marks a Job for the next reconcile.
    pub(crate) fn touch(&mut self, key: &JobKey) {
        if self.jobs.contains_key(key) {
            self.dirty.insert(key.clone());
        }
    }

    /// Marks every Job (a periodic resync).
    pub(crate) fn touch_all(&mut self) {
        self.dirty = self.jobs.keys().cloned().collect();
    }

    /// Marks the Jobs dispatched to `cluster`.
    pub(super) fn touch_jobs_in(&mut self, cluster: &str) {
        let keys: Vec<JobKey> = self
            .jobs
            .values()
            .filter(|j| j.cluster.as_deref() == Some(cluster))
            .map(|j| j.key.clone())
            .collect();
        self.dirty.extend(keys);
    }

    /// The Jobs changed since the last call.
    pub(super) fn take_dirty(&mut self) -> BTreeSet<JobKey> {
        std::mem::take(&mut self.dirty)
    }

    /// Looks at the Job again at `at` (or at the next plan after it).
    pub(super) fn wake(&mut self, key: &JobKey, at: SystemTime) {
        self.timers.entry(at).or_default().insert(key.clone());
    }

    /// The earliest deadline set with [`State::wake`].
    pub(super) fn next_timer(&self) -> Option<SystemTime> {
        self.timers.keys().next().copied()
    }

    /// Marks the Jobs whose deadlines have come.
    pub(super) fn fire_timers(&mut self, now: SystemTime) {
        while let Some(entry) = self.timers.first_entry() {
            if *entry.key() > now {
                break;
            }
            for key in entry.remove() {
                self.touch(&key);
            }
        }
    }
}
