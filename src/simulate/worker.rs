//! A simulated worker cluster: its Jobs (the dispatched copies), their pods, a kube-scheduler
//! that places each pod as the default one would (resources only, NUMA-unaware:
//! NodeResourcesFit with LeastAllocated on cpu and memory) or, for a worker with a
//! `schedulerName`, as its NUMA-aware scheduler with Switchyard's extender would, kubelets whose
//! Topology Manager rejects a pod it cannot align (TopologyAffinityError, counted), and a Job
//! controller (replacement pods with back-off, backoffLimit 6, Complete and Failed as
//! Kubernetes 1.31+ writes them), and a JobSet controller: a JobSet copy's child Jobs (each
//! replicated Job's `replicas`) run as Jobs do, all their pods created at once; the JobSet is
//! `Completed` when every child Job is, `Failed` as soon as one fails (the default
//! failurePolicy: no restarts), its Jobs still running then deleted.
//!
//! A worker whose scenario cluster has `kueue:` runs its own Kueue (`super::kueue`): a copy
//! arrives suspended, in its LocalQueue, and is resumed (its Job's pods created, `startTime`
//! set, its `Suspended` condition turned False) when that Kueue admits it; the quota it took
//! is given back when it finishes or is deleted.
//!
//! Node usage changes here without the cluster's summary being recomputed each time: the
//! simulation does it once before the dispatcher plans (see `Simulation::dispatch`).

use super::kueue::{Admittee, Amounts, SimKueue};
use super::scenario::KueueSpec;
use crate::dispatcher::kind::jobset::{JobSetStatus, ReplicatedJobStatus};
use crate::dispatcher::kind::Status;
use crate::dispatcher::{JobKey, WorkerCopy};
use crate::inventory::{Cluster, Node, ResourceTable};
use crate::placement::fit::{counted_by_spread, topology_value};
use crate::placement::inflight::Take;
use crate::placement::{
    fit_node, node_accepts, BoundPod, EngineConfig, Misfit, NodeJudge, NodeState, PodShape,
    Strategy,
};
use foldhash::{HashMap, HashMapExt as _};
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The Job controller's default.
pub const BACKOFF_LIMIT: u32 = 6;

/// What a dispatched Job does once its pods run.
#[derive(Debug, Clone)]
pub(crate) struct Behaviour {
    pub(crate) shape: Arc<PodShape>,
    /// Nodes the copy's pods may not go to (its required node affinity on `metadata.name`:
    /// room kept there for other Jobs).
    pub(crate) keep_off: Arc<[Arc<str>]>,
    /// Nodes the copy's pods prefer (its preferred node affinity on `metadata.name`: the
    /// nodes of the placement the dispatcher found for it).
    pub(crate) prefer: Arc<[Arc<str>]>,
    /// How a NUMA-aware worker ranks nodes for the pods: the strategy the copy's pod template
    /// names (its queue's, unless the Job's own template names one).
    pub(crate) strategy: Strategy,
    pub(crate) parallelism: u32,
    pub(crate) completions: u32,
    pub(crate) duration: Duration,
    pub(crate) start_delay: Duration,
    pub(crate) fails: bool,
}

/// What the Jobs of one replicated Job of a JobSet do.
#[derive(Debug, Clone)]
pub(crate) struct ReplicatedBehaviour {
    pub(crate) name: String,
    pub(crate) replicas: u32,
    pub(crate) behaviour: Behaviour,
}

#[derive(Debug, Clone)]
struct Pod {
    node: usize,
    take: Take,
    ready_at: Option<SystemTime>,
}

/// A copy of a manager Job in this worker.
#[derive(Debug)]
pub(crate) struct SimJob {
    pub(crate) key: JobKey,
    pub(crate) uid: String,
    pub(crate) origin_uid: String,
    behaviour: Behaviour,
    bound: BoundPod,
    pods: BTreeMap<u32, Pod>,
    next_pod: u32,
    /// Pods created and waiting for a node.
    unscheduled: u32,
    succeeded: u32,
    failed: u32,
    /// How long its pods that succeeded ran (Ready to end), summed.
    ran: Duration,
    created: SystemTime,
    /// When it was (last) resumed: at its creation, or when the worker's Kueue admitted it.
    start_time: Option<SystemTime>,
    /// Waiting for the worker's Kueue: its pods are not created yet.
    suspended: bool,
    finished: Option<(bool, SystemTime)>,
    /// The JobSet copy it is a child Job of.
    owner: Option<String>,
}

/// A copy of a manager JobSet in this worker: its child Jobs are [`SimJob`]s of their own,
/// uids `<copy uid>/<replicated Job>-<index>` (see [`copy_uid`]).
#[derive(Debug)]
pub(crate) struct SimSet {
    key: JobKey,
    uid: String,
    origin_uid: String,
    parts: Vec<SetPart>,
    created: SystemTime,
    /// Waiting for the worker's Kueue; when it admitted it, once it did.
    suspended: bool,
    resumed: Option<SystemTime>,
    /// How it ended, when, and (failed) the name of the Job that failed it.
    finished: Option<(bool, SystemTime, Option<String>)>,
}

/// One replicated Job of a JobSet copy.
#[derive(Debug)]
struct SetPart {
    name: String,
    /// The pods each of its Jobs runs at once: a Job is Ready when that many are Ready or done.
    pods_per_job: u32,
    /// Its Jobs' uids, in index order.
    jobs: Vec<String>,
}

/// The uid of the copy a Job of this worker belongs to: its own, or its JobSet's.
pub(crate) fn copy_uid(uid: &str) -> &str {
    uid.split_once('/').map_or(uid, |(set, _)| set)
}

/// Something that happens to a pod later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodEvent {
    Ready {
        job_uid: String,
        pod: u32,
    },
    Done {
        job_uid: String,
        pod: u32,
    },
    /// The Job controller creates a replacement pod after a failure's back-off.
    Replace {
        job_uid: String,
    },
}

/// Something that happens to a workload of the worker's own users (`localWorkloads`, by
/// index) in its Kueue.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum KueueEvent {
    Submit(usize),
    Finish(usize),
}

/// What a copy asks of a Kueue worker's quota: its whole gang's request, and its priority.
#[derive(Debug, Clone, Default)]
pub(crate) struct Queued {
    pub(crate) request: Amounts,
    pub(crate) priority: i32,
}

/// How long the pods of a copy that succeeded ran, summed, by pod shape.
pub(crate) type Ran = Vec<(Arc<PodShape>, Duration)>;

/// What changed, for the driver: events to schedule and copies whose status changed.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) events: Vec<(SystemTime, PodEvent)>,
    pub(crate) changed: Vec<String>,
    pub(crate) topology_errors: u64,
    /// Resources taken (+) or given back (−) by scenario pods, for utilization.
    pub(crate) usage_delta: Vec<i64>,
    /// Nodes (by index) that got room back.
    pub(crate) freed: Vec<usize>,
    /// Nodes (by index) that a bound pod took room on.
    pub(crate) taken: Vec<usize>,
    /// Copies that completed: their origin's uid and how long their pods that succeeded ran,
    /// summed, per pod shape (a Job's one, a JobSet's per Job).
    pub(crate) completed: Vec<(String, Ran)>,
    /// Events of the worker's own Kueue workloads to schedule.
    pub(crate) kueue_events: Vec<(SystemTime, KueueEvent)>,
    /// What the worker's Kueue has reserved changed.
    pub(crate) kueue_changed: bool,
}

pub(crate) struct SimWorker {
    pub(crate) name: String,
    /// Index of the worker's cluster in the inventory.
    pub(crate) index: usize,
    /// Pods are placed by the worker's NUMA-aware scheduler (it has a `schedulerName`), else
    /// by its default scheduler.
    numa_aware: bool,
    /// By uid; like `sets`, only looked up, never gone through (so in no order).
    pub(crate) jobs: HashMap<String, SimJob>,
    /// JobSet copies (their child Jobs are in `jobs`).
    sets: HashMap<String, SimSet>,
    /// Pods that found no node, in creation order, tried again when room frees.
    waiting: Waiting,
    /// The nodes' allocatable and requested amounts, kept beside the cluster's nodes.
    rows: Rows,
    /// Its own Kueue, when it runs one.
    pub(crate) kueue: Option<SimKueue>,
}

/// Every node's allocatable and free amounts in one table, row after row: finding a node for a
/// pod reads it instead of each node's own vectors (a worker of 200 nodes is looked at for
/// every pod bound there). Refreshed whenever a pod takes or frees room on a node.
#[derive(Debug, Default)]
struct Rows {
    /// Resources per row (the resource table's length).
    width: usize,
    /// Per node: `width` allocatable amounts, then `width` free ones (allocatable −
    /// requested).
    cells: Vec<i64>,
}

impl Rows {
    /// Makes the table anew if the cluster or the resource table is not the one it was
    /// made for.
    fn fit(&mut self, cluster: &Cluster, width: usize) {
        if self.width == width && self.cells.len() == cluster.nodes.len() * 2 * width {
            return;
        }
        self.width = width;
        self.cells = vec![0; cluster.nodes.len() * 2 * width];
        for (i, node) in cluster.nodes.iter().enumerate() {
            self.refresh(i, node);
        }
    }

    fn refresh(&mut self, i: usize, node: &Node) {
        let w = self.width;
        let Some(row) = self.cells.get_mut(i * 2 * w..(i + 1) * 2 * w) else {
            return;
        };
        let (alloc, free) = row.split_at_mut(w);
        for r in 0..w {
            alloc[r] = node.allocatable.get(r).copied().unwrap_or(0);
            free[r] = node.free(r);
        }
    }

    /// Node `i`'s allocatable and free amounts.
    fn row(&self, i: usize) -> (&[i64], &[i64]) {
        let w = self.width;
        self.cells[i * 2 * w..(i + 1) * 2 * w].split_at(w)
    }
}

/// Pods waiting for a node, in creation order, as runs of one Job's pods: (job uid, pods).
/// The scheduler takes them one by one; a run lets it pass over a Job whose pods find no
/// node in one step, not one per pod (a 100,000-pod Job would make every round as long).
#[derive(Debug, Default)]
struct Waiting(VecDeque<(String, u32)>);

impl Waiting {
    /// `pods` more of the Job's pods, after those waiting.
    fn push(&mut self, uid: &str, pods: u32) {
        if pods == 0 {
            return;
        }
        match self.0.back_mut() {
            Some((last, n)) if last == uid => *n = n.saturating_add(pods),
            _ => self.0.push_back((uid.to_string(), pods)),
        }
    }

    /// The first run, taken off the queue.
    fn next(&mut self) -> Option<(String, u32)> {
        self.0.pop_front()
    }

    /// The Job's pods wait no more.
    fn forget(&mut self, uid: &str) {
        self.0.retain(|(u, _)| u != uid);
    }
}

impl SimWorker {
    pub(crate) fn new(
        name: &str,
        index: usize,
        numa_aware: bool,
        kueue: Option<Arc<KueueSpec>>,
    ) -> Self {
        Self {
            name: name.to_string(),
            index,
            numa_aware,
            jobs: HashMap::new(),
            sets: HashMap::new(),
            waiting: Waiting::default(),
            rows: Rows::default(),
            kueue: kueue.map(SimKueue::new),
        }
    }

    /// A new copy: the Job controller creates its first pods, which are scheduled; in a Kueue
    /// worker, it waits suspended in the worker's queue for its turn first (`queued`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        key: JobKey,
        uid: String,
        origin_uid: String,
        behaviour: Behaviour,
        queued: Queued,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        let suspended = self.kueue.is_some();
        self.add_job(
            table,
            key,
            uid.clone(),
            origin_uid,
            behaviour,
            None,
            suspended,
            now,
        );
        fx.changed.push(uid.clone());
        self.enter_queue(cluster, table, uid, queued, now, fx);
        self.schedule(cluster, table, now, fx);
    }

    /// In a Kueue worker, a new copy's Workload enters the queue, and is admitted if its
    /// turn and the quota let it.
    fn enter_queue(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        uid: String,
        queued: Queued,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        if let Some(k) = &mut self.kueue {
            k.enqueue(Admittee::Copy(uid), queued.request, queued.priority);
            self.kueue_settle(cluster, table, now, fx);
        }
    }

    /// A new JobSet copy: the JobSet controller creates every child Job, whose controller
    /// creates their first pods: the whole gang, scheduled together (in a Kueue worker, once
    /// its Kueue admits the JobSet).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_set(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        key: JobKey,
        uid: String,
        origin_uid: String,
        replicated: Vec<ReplicatedBehaviour>,
        queued: Queued,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        let suspended = self.kueue.is_some();
        let mut parts = Vec::with_capacity(replicated.len());
        for r in replicated {
            let pods_per_job = r.behaviour.parallelism.min(r.behaviour.completions);
            let mut jobs = Vec::with_capacity(r.replicas as usize);
            for index in 0..r.replicas {
                let child = format!("{uid}/{}-{index}", r.name);
                self.add_job(
                    table,
                    key.clone(),
                    child.clone(),
                    origin_uid.clone(),
                    r.behaviour.clone(),
                    Some(uid.clone()),
                    suspended,
                    now,
                );
                jobs.push(child);
            }
            parts.push(SetPart {
                name: r.name,
                pods_per_job,
                jobs,
            });
        }
        self.sets.insert(
            uid.clone(),
            SimSet {
                key,
                uid: uid.clone(),
                origin_uid,
                parts,
                created: now,
                suspended,
                resumed: None,
                finished: None,
            },
        );
        fx.changed.push(uid.clone());
        self.enter_queue(cluster, table, uid, queued, now, fx);
        self.schedule(cluster, table, now, fx);
    }

    /// A Job and its first pods, waiting for nodes (or, `suspended`, for the worker's Kueue).
    #[allow(clippy::too_many_arguments)]
    fn add_job(
        &mut self,
        table: &ResourceTable,
        key: JobKey,
        uid: String,
        origin_uid: String,
        behaviour: Behaviour,
        owner: Option<String>,
        suspended: bool,
        now: SystemTime,
    ) {
        let bound = behaviour.shape.bind(table);
        let first = behaviour.parallelism.min(behaviour.completions);
        let job = SimJob {
            key,
            uid: uid.clone(),
            origin_uid,
            behaviour,
            bound,
            pods: BTreeMap::new(),
            next_pod: 0,
            unscheduled: first,
            succeeded: 0,
            failed: 0,
            ran: Duration::ZERO,
            created: now,
            start_time: (!suspended).then_some(now),
            suspended,
            finished: None,
            owner,
        };
        self.jobs.insert(uid.clone(), job);
        if !suspended {
            self.waiting.push(&uid, first);
        }
    }

    /// The worker's Kueue admitted the copy: its Jobs are resumed, their pods created.
    fn resume(&mut self, uid: &str, now: SystemTime, fx: &mut Effects) {
        let jobs = match self.sets.get_mut(uid) {
            Some(set) => {
                set.suspended = false;
                set.resumed = Some(now);
                set.parts.iter().flat_map(|p| p.jobs.clone()).collect()
            }
            None => vec![uid.to_string()],
        };
        for j in jobs {
            let Some(job) = self.jobs.get_mut(&j) else {
                continue;
            };
            job.suspended = false;
            job.start_time = Some(now);
            self.waiting.push(&j, job.unscheduled);
        }
        fx.changed.push(uid.to_string());
    }

    /// The worker's Kueue after something changed: the quota of the copies that finished or
    /// went is given back, and what waits is admitted in order while the quota lets it.
    fn kueue_settle(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        loop {
            let Some(k) = &self.kueue else {
                return;
            };
            let done: Vec<Admittee> = k
                .admitted()
                .filter(|a| match a {
                    Admittee::Copy(uid) => self.copy_done(uid),
                    Admittee::Local(_) => false,
                })
                .cloned()
                .collect();
            let Some(k) = &mut self.kueue else {
                return;
            };
            for a in &done {
                k.remove(a);
            }
            let admitted = k.admit();
            fx.kueue_changed |= !(done.is_empty() && admitted.is_empty());
            if admitted.is_empty() {
                return;
            }
            for a in admitted {
                match a {
                    Admittee::Copy(uid) => self.resume(&uid, now, fx),
                    Admittee::Local(i) => {
                        let duration = self
                            .kueue
                            .as_ref()
                            .and_then(|k| k.spec.local_workloads.get(i))
                            .map_or(Duration::ZERO, |w| w.duration);
                        fx.kueue_events
                            .push((now + duration, KueueEvent::Finish(i)));
                    }
                }
            }
            // Pods that fail at once may finish a copy: looked at again.
            self.schedule(cluster, table, now, fx);
        }
    }

    /// Whether the copy finished, or is gone: its Workload no longer holds quota.
    fn copy_done(&self, uid: &str) -> bool {
        match self.sets.get(uid) {
            Some(set) => set.finished.is_some(),
            None => self.jobs.get(uid).is_none_or(|j| j.finished.is_some()),
        }
    }

    /// A workload of the worker's own users enters its Kueue, or finishes.
    pub(crate) fn on_kueue_event(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        ev: &KueueEvent,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        let Some(k) = &mut self.kueue else {
            return;
        };
        match *ev {
            KueueEvent::Submit(i) => {
                let Some(w) = k.spec.local_workloads.get(i) else {
                    return;
                };
                let (request, priority) = (w.request.clone(), w.priority);
                k.enqueue(Admittee::Local(i), request, priority);
            }
            KueueEvent::Finish(i) => {
                fx.kueue_changed |= k.remove(&Admittee::Local(i));
            }
        }
        self.kueue_settle(cluster, table, now, fx);
    }

    /// Deletes a copy (a Job, or a JobSet and its Jobs) and its pods (background
    /// propagation: the pods go at once here).
    pub(crate) fn delete(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        uid: &str,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        let jobs = match self.sets.remove(uid) {
            Some(set) => set.parts.into_iter().flat_map(|p| p.jobs).collect(),
            None => vec![uid.to_string()],
        };
        if let Some(k) = &mut self.kueue {
            fx.kueue_changed |= k.remove(&Admittee::Copy(uid.to_string()));
        }
        if self.remove_jobs(cluster, table, &jobs, fx) {
            self.schedule(cluster, table, now, fx);
        }
        self.kueue_settle(cluster, table, now, fx);
    }

    /// Removes Jobs and their pods; whether any pod gave room back.
    fn remove_jobs(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        uids: &[String],
        fx: &mut Effects,
    ) -> bool {
        let mut freed = false;
        for uid in uids {
            freed |= self.remove_job(cluster, table, uid, fx);
        }
        freed
    }

    /// Removes a Job and its pods; whether any pod gave room back.
    fn remove_job(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        uid: &str,
        fx: &mut Effects,
    ) -> bool {
        let Some(job) = self.jobs.remove(uid) else {
            return false;
        };
        self.waiting.forget(uid);
        self.rows.fit(cluster, table.len());
        for pod in job.pods.values() {
            release(cluster, &mut self.rows, table, pod, fx);
        }
        !job.pods.is_empty()
    }

    /// The JobSet controller after one of the set's Jobs finished: the set fails with it
    /// (and its Jobs still running are deleted), or completes with the last of them.
    fn settle(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        uid: &str,
        now: SystemTime,
        fx: &mut Effects,
    ) -> bool {
        let Some(set) = self.sets.get_mut(uid) else {
            return false;
        };
        if set.finished.is_some() {
            return false;
        }
        let outcome = |job: &String| self.jobs.get(job).and_then(|j| j.finished).map(|f| f.0);
        let children: Vec<(&String, Option<bool>)> = set
            .parts
            .iter()
            .flat_map(|p| &p.jobs)
            .map(|job| (job, outcome(job)))
            .collect();
        if let Some((first, _)) = children.iter().find(|(_, o)| *o == Some(false)) {
            // Its Jobs are named `<jobset>-<replicated Job>-<index>`.
            let name = format!(
                "{}-{}",
                set.key.name,
                first.split_once('/').map_or("", |p| p.1)
            );
            set.finished = Some((false, now, Some(name)));
            let running: Vec<String> = children
                .iter()
                .filter(|(_, o)| o.is_none())
                .map(|(job, _)| (*job).clone())
                .collect();
            fx.changed.push(uid.to_string());
            self.remove_jobs(cluster, table, &running, fx)
        } else if children.iter().all(|(_, o)| *o == Some(true)) {
            set.finished = Some((true, now, None));
            let ran = children
                .iter()
                .filter_map(|(job, _)| self.jobs.get(*job))
                .map(|j| (j.behaviour.shape.clone(), j.ran))
                .collect();
            fx.completed.push((set.origin_uid.clone(), ran));
            fx.changed.push(uid.to_string());
            false
        } else {
            false
        }
    }

    /// A pod became Ready: nothing changes on its node. (A separate entry point, so that the
    /// simulation does not hand out the cluster mutably for it: a cluster handed out
    /// mutably is a new cluster to everything that remembered the old one.)
    pub(crate) fn on_ready(&mut self, ev: &PodEvent, now: SystemTime, fx: &mut Effects) {
        let PodEvent::Ready { job_uid, pod } = ev else {
            return;
        };
        let Some(job) = self.jobs.get_mut(job_uid) else {
            return;
        };
        let Some(p) = job.pods.get_mut(pod) else {
            return;
        };
        p.ready_at = Some(now);
        fx.changed.push(job_uid.clone());
        fx.events.push((
            now + job.behaviour.duration,
            PodEvent::Done {
                job_uid: job_uid.clone(),
                pod: *pod,
            },
        ));
    }

    /// Applies a pod event that came due.
    pub(crate) fn on_event(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        ev: &PodEvent,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        match ev {
            PodEvent::Ready { .. } => self.on_ready(ev, now, fx),
            PodEvent::Done { job_uid, pod } => {
                let Some(job) = self.jobs.get_mut(job_uid) else {
                    return;
                };
                let Some(p) = job.pods.remove(pod) else {
                    return;
                };
                self.rows.fit(cluster, table.len());
                release(cluster, &mut self.rows, table, &p, fx);
                fx.changed.push(job_uid.clone());
                if job.behaviour.fails {
                    job.failed += 1;
                    after_failure(job, now, fx);
                } else {
                    job.succeeded += 1;
                    if let Some(ready) = p.ready_at {
                        job.ran += now.duration_since(ready).unwrap_or_default();
                    }
                    let remaining = job.behaviour.completions.saturating_sub(job.succeeded);
                    if remaining == 0 {
                        job.finished = Some((true, now));
                        if job.owner.is_none() {
                            let ran = vec![(job.behaviour.shape.clone(), job.ran)];
                            fx.completed.push((job.origin_uid.clone(), ran));
                        }
                    } else if (job.pods.len() as u32 + job.unscheduled)
                        < remaining.min(job.behaviour.parallelism)
                    {
                        job.unscheduled += 1;
                        self.waiting.push(job_uid, 1);
                    }
                }
                terminate_if_finished(job, cluster, &mut self.rows, table, fx);
                if let Some(set) = job.owner.clone().filter(|_| job.finished.is_some()) {
                    self.settle(cluster, table, &set, now, fx);
                }
                self.schedule(cluster, table, now, fx);
            }
            PodEvent::Replace { job_uid } => {
                let Some(job) = self.jobs.get_mut(job_uid) else {
                    return;
                };
                if job.finished.is_some() {
                    return;
                }
                job.unscheduled += 1;
                self.waiting.push(job_uid, 1);
                self.schedule(cluster, table, now, fx);
            }
        }
        // A copy that finished gives its quota back.
        self.kueue_settle(cluster, table, now, fx);
    }

    /// Places waiting pods, oldest first, as the worker's scheduler would; each bound pod is
    /// then admitted or rejected by its node's kubelet.
    fn schedule(
        &mut self,
        cluster: &mut Cluster,
        table: &ResourceTable,
        now: SystemTime,
        fx: &mut Effects,
    ) {
        let mut still = Waiting::default();
        // Shapes no node had room for in this round: nodes only lose room as pods are bound,
        // so a later pod of the same shape is not looked for either, until some pod's end
        // frees room.
        let mut unplaceable: Vec<(*const PodShape, *const Arc<str>)> = Vec::new();
        let mut settle: Vec<String> = Vec::new();
        self.rows.fit(cluster, table.len());
        while let Some((uid, pods)) = self.waiting.next() {
            // The run's pods one at a time, as the scheduler takes them; when one is not
            // looked for, nor is the rest of the run (nothing about its Job or shape changed).
            for left in (1..=pods).rev() {
                let Some(job) = self.jobs.get(&uid) else {
                    break;
                };
                if job.unscheduled == 0 || job.finished.is_some() {
                    break;
                }
                // Copies of a shape kept off different nodes are looked for apart.
                let off = &job.behaviour.keep_off;
                let shape = (
                    Arc::as_ptr(&job.behaviour.shape),
                    match off.is_empty() {
                        true => std::ptr::null(),
                        false => Arc::as_ptr(off) as *const Arc<str>,
                    },
                );
                if unplaceable.contains(&shape) {
                    still.push(&uid, left);
                    break;
                }
                // Nodes its pods keep off because a pod like them is there (`one_per_node`), or
                // because enough are (`spread`).
                let held = self.held_by_peers(cluster, job);
                let picked = if self.numa_aware {
                    pick_aligned_node(cluster, &self.rows, table, job, &held)
                } else {
                    pick_node(cluster, &self.rows, table, job, &held)
                };
                let Some(n) = picked else {
                    // Pods kept apart have no room where their own Job's pods are: another
                    // Job's of the same shape may.
                    if held.is_empty() {
                        unplaceable.push(shape);
                    }
                    still.push(&uid, left);
                    break;
                };
                let Some(job) = self.jobs.get_mut(&uid) else {
                    break;
                };
                job.unscheduled -= 1;
                fx.changed.push(uid.clone());
                let node = &mut cluster.nodes[n];
                // The kubelet admits the pod through its Topology Manager, or rejects it.
                let kubelet = EngineConfig::default();
                let fit = fit_node(
                    node,
                    table,
                    &job.behaviour.shape,
                    &job.bound,
                    1,
                    &kubelet,
                    false,
                );
                if fit.count == 1 {
                    let take = Take::between(node, &NodeState::of(node), &fit.state).at(n);
                    take.apply_to(Arc::make_mut(node));
                    self.rows.refresh(n, node);
                    fx.taken.push(n);
                    usage(&mut fx.usage_delta, table, &take, 1);
                    let id = job.next_pod;
                    job.next_pod += 1;
                    job.pods.insert(
                        id,
                        Pod {
                            node: n,
                            take,
                            ready_at: None,
                        },
                    );
                    fx.events.push((
                        now + job.behaviour.start_delay,
                        PodEvent::Ready {
                            job_uid: uid.clone(),
                            pod: id,
                        },
                    ));
                } else {
                    if matches!(fit.misfit, Some(Misfit::Topology { .. })) {
                        fx.topology_errors += 1;
                    }
                    job.failed += 1;
                    after_failure(job, now, fx);
                    if terminate_if_finished(job, cluster, &mut self.rows, table, fx) {
                        unplaceable.clear();
                    }
                    if let Some(set) = job.owner.clone().filter(|_| job.finished.is_some()) {
                        settle.push(set);
                    }
                }
            }
        }
        self.waiting = still;
        // A JobSet whose Job just failed: its other Jobs go, and their room is used.
        let mut freed = false;
        for set in settle {
            freed |= self.settle(cluster, table, &set, now, fx);
        }
        if freed {
            self.schedule(cluster, table, now, fx);
        }
    }

    /// The nodes kube-scheduler binds none of `job`'s pods to for the pods like them there
    /// (its peers: with its JobSet's label, the pods of the JobSet's other Jobs of the same
    /// shape too): for pods that keep one to a node, every node holding one (InterPodAffinity);
    /// for pods that spread over nodes, every node whose count, with one more, exceeds the
    /// least count on the nodes the spread counts by more than its `maxSkew`
    /// (PodTopologySpread); for pods kept together, every node without the keys and, once
    /// one of them is bound, every node where a key's value differs from all of theirs
    /// (InterPodAffinity). None for other pods.
    fn held_by_peers(&self, cluster: &Cluster, job: &SimJob) -> Vec<usize> {
        let shape = &job.behaviour.shape;
        if !shape.placed_by_peers() {
            return Vec::new();
        }
        let set = job.owner.as_ref().and_then(|o| self.sets.get(o));
        let peers: Vec<&SimJob> = match set {
            Some(set) => set
                .parts
                .iter()
                .flat_map(|p| &p.jobs)
                .filter_map(|u| self.jobs.get(u))
                .filter(|j| Arc::ptr_eq(&j.behaviour.shape, shape))
                .collect(),
            None => vec![job],
        };
        // The nodes their pods are bound to, a node once per pod.
        let on: Vec<usize> = (peers.iter())
            .flat_map(|j| j.pods.values().map(|p| p.node))
            .collect();
        let mut nodes: Vec<usize> = match shape.spread {
            Some(spread) if !shape.one_per_node => {
                let mut count = vec![0usize; cluster.nodes.len()];
                on.iter().for_each(|&n| count[n] += 1);
                let counted: Vec<usize> = (0..cluster.nodes.len())
                    .filter(|&i| counted_by_spread(&spread, shape, &cluster.nodes[i]))
                    .collect();
                let least = match counted.len() < spread.min_domains as usize {
                    true => 0,
                    false => counted.iter().map(|&i| count[i]).min().unwrap_or(0),
                };
                let cap = least + spread.max_skew as usize;
                (0..cluster.nodes.len())
                    .filter(|&i| count[i] >= cap)
                    .collect()
            }
            _ if shape.one_per_node => on.clone(),
            _ => Vec::new(),
        };
        if !shape.together.is_empty() {
            nodes.extend(away_from_peers(cluster, &shape.together, &on));
        }
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// The copy's status as its worker's Job controller would write it, as the dispatcher's
    /// watch sees it.
    pub(crate) fn copy(&self, uid: &str) -> Option<WorkerCopy> {
        if let Some(set) = self.sets.get(uid) {
            return Some(WorkerCopy {
                cluster: self.name.clone(),
                key: set.key.clone(),
                uid: set.uid.clone(),
                origin_uid: set.origin_uid.clone(),
                status: Status::JobSet(self.set_status(set)),
                deleting: false,
                suspended: set.suspended,
                kueue: self.kueue.is_some(),
            });
        }
        let job = self.jobs.get(uid)?;
        let active = if job.finished.is_some() || job.suspended {
            0
        } else {
            job.pods.len() as i32 + job.unscheduled as i32
        };
        let ready = job.pods.values().filter(|p| p.ready_at.is_some()).count() as i32;
        let t = |s: SystemTime| Time(crate::dispatcher::mirror::to_timestamp(s));
        let mut status = JobStatus {
            active: Some(active),
            ready: Some(ready.min(active)),
            succeeded: Some(job.succeeded as i32),
            failed: Some(job.failed as i32),
            terminating: Some(0),
            start_time: job.start_time.map(t),
            ..Default::default()
        };
        let mut conditions = Vec::new();
        if self.kueue.is_some() {
            // As the Job controller writes it when the Job is created suspended, and when
            // it is resumed.
            let (status, reason, message, at) = match job.start_time {
                None => ("True", "JobSuspended", "Job suspended", job.created),
                Some(at) => ("False", "JobResumed", "Job resumed", at),
            };
            conditions.push(JobCondition {
                type_: "Suspended".into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_probe_time: Some(t(at)),
                last_transition_time: Some(t(at)),
            });
        }
        if let Some((ok, at)) = job.finished {
            let cond = |type_: &str, reason: &str| JobCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                message: None,
                last_probe_time: Some(t(at)),
                last_transition_time: Some(t(at)),
            };
            if ok {
                status.completion_time = Some(t(at));
                conditions.push(cond("SuccessCriteriaMet", "CompletionsReached"));
                conditions.push(cond("Complete", "CompletionsReached"));
            } else {
                conditions.push(cond("FailureTarget", "BackoffLimitExceeded"));
                conditions.push(cond("Failed", "BackoffLimitExceeded"));
            }
        }
        if !conditions.is_empty() {
            status.conditions = Some(conditions);
        }
        Some(WorkerCopy {
            suspended: job.suspended,
            kueue: self.kueue.is_some(),
            cluster: self.name.clone(),
            key: job.key.clone(),
            uid: job.uid.clone(),
            origin_uid: job.origin_uid.clone(),
            status: status.into(),
            deleting: false,
        })
    }
}

impl SimWorker {
    /// A JobSet copy's status as the JobSet controller writes it: its Jobs counted per
    /// replicated Job (a running Job is Ready when all the pods it runs at once are Ready or
    /// done), and once finished its terminal condition and state. Jobs deleted when the set
    /// failed count nowhere.
    fn set_status(&self, set: &SimSet) -> JobSetStatus {
        // `restarts` from the first status on, as the controller writes it.
        let mut status = JobSetStatus {
            restarts: Some(0),
            ..Default::default()
        };
        for part in &set.parts {
            let mut counts = ReplicatedJobStatus {
                name: part.name.clone(),
                ..Default::default()
            };
            for job in part.jobs.iter().filter_map(|j| self.jobs.get(j)) {
                match job.finished {
                    Some((true, _)) => counts.succeeded += 1,
                    Some((false, _)) => counts.failed += 1,
                    None if job.suspended => counts.suspended += 1,
                    None => {
                        counts.active += 1;
                        let ready = job.pods.values().filter(|p| p.ready_at.is_some()).count();
                        if ready as u32 + job.succeeded >= part.pods_per_job {
                            counts.ready += 1;
                        }
                    }
                }
            }
            status.replicated_jobs_status.push(counts);
        }
        if self.kueue.is_some() {
            // As the JobSet controller writes it when the JobSet is created suspended, and
            // when it is resumed.
            let (status_, reason, message, at) = match set.resumed {
                None => ("True", "SuspendedJobs", "jobset is suspended", set.created),
                Some(at) => ("False", "ResumeJobs", "jobset is resumed", at),
            };
            status.conditions.push(JobCondition {
                type_: "Suspended".into(),
                status: status_.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_probe_time: None,
                last_transition_time: Some(Time(crate::dispatcher::mirror::to_timestamp(at))),
            });
        }
        if let Some((ok, at, first_failed)) = &set.finished {
            let (type_, reason, message, state) = if *ok {
                (
                    "Completed",
                    "AllJobsCompleted",
                    "jobset completed successfully".to_string(),
                    "Completed",
                )
            } else {
                (
                    "Failed",
                    "FailedJobs",
                    format!(
                        "jobset failed due to one or more job failures (first failed job: {})",
                        first_failed.as_deref().unwrap_or_default()
                    ),
                    "Failed",
                )
            };
            status.conditions.push(JobCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_probe_time: None,
                last_transition_time: Some(Time(crate::dispatcher::mirror::to_timestamp(*at))),
            });
            status.terminal_state = Some(state.into());
        }
        status
    }
}

/// The Job controller after a pod failed: give up past the back-off limit, or make a
/// replacement after 10 s × 2^(failures−1), at most 6 minutes.
fn after_failure(job: &mut SimJob, now: SystemTime, fx: &mut Effects) {
    if job.failed > BACKOFF_LIMIT {
        job.finished = Some((false, now));
        job.unscheduled = 0;
        return;
    }
    let delay =
        Duration::from_secs(10 * (1u64 << (job.failed - 1).min(6))).min(Duration::from_secs(360));
    fx.events.push((
        now + delay,
        PodEvent::Replace {
            job_uid: job.uid.clone(),
        },
    ));
}

/// A finished Job's remaining pods are terminated (they free their node at once here).
fn terminate_if_finished(
    job: &mut SimJob,
    cluster: &mut Cluster,
    rows: &mut Rows,
    table: &ResourceTable,
    fx: &mut Effects,
) -> bool {
    if job.finished.is_none() || job.pods.is_empty() {
        return false;
    }
    for pod in std::mem::take(&mut job.pods).values() {
        release(cluster, rows, table, pod, fx);
    }
    true
}

fn release(
    cluster: &mut Cluster,
    rows: &mut Rows,
    table: &ResourceTable,
    pod: &Pod,
    fx: &mut Effects,
) {
    if let Some(node) = cluster.nodes.get_mut(pod.node) {
        pod.take.release_from(Arc::make_mut(node));
        rows.refresh(pod.node, node);
        fx.freed.push(pod.node);
    }
    usage(&mut fx.usage_delta, table, &pod.take, -1);
}

fn usage(delta: &mut Vec<i64>, table: &ResourceTable, take: &Take, sign: i64) {
    if delta.len() < table.len() {
        delta.resize(table.len(), 0);
    }
    for &(id, amount) in &take.amounts {
        if let Some(d) = delta.get_mut(id) {
            *d += sign * amount;
        }
    }
}

/// The nodes InterPodAffinity keeps a pod off when it goes beside the pods like it on `keys`
/// (bound to the nodes `on`): a node without one of the keys and, once any of them is bound,
/// a node whose value of some key none of them has. kube-scheduler counts the matching pods by
/// key and value, and lets the first of them go to any node with the keys.
fn away_from_peers(cluster: &Cluster, keys: &[String], on: &[usize]) -> Vec<usize> {
    let value = |i: usize, k: &str| topology_value(&cluster.nodes[i], k);
    (0..cluster.nodes.len())
        .filter(|&i| {
            keys.iter().any(|k| match value(i, k) {
                None => true,
                Some(v) => !on.is_empty() && on.iter().all(|&p| value(p, k) != Some(v)),
            })
        })
        .collect()
}

/// kube-scheduler's choice for one pod: nodes whose free resources (allocatable − requested)
/// cover it and that it may go to (taints, selectors), the least allocated on cpu and memory
/// first. NUMA zones are not looked at: that is the default scheduler's blind spot.
fn pick_node(
    cluster: &Cluster,
    rows: &Rows,
    table: &ResourceTable,
    job: &SimJob,
    held: &[usize],
) -> Option<usize> {
    let (behaviour, pod) = (&job.behaviour, &job.bound);
    let (shape, keep_off, prefer) = (&behaviour.shape, &behaviour.keep_off, &behaviour.prefer);
    let pods = table.id("pods");
    let request = node_request(pod)?;
    let scored = [table.id("cpu"), table.id("memory")].map(|r| {
        r.map(|r| {
            let want = request
                .iter()
                .find(|(id, _)| *id == r)
                .map_or(0, |(_, q)| *q);
            (r, want)
        })
    });
    let mut best: Option<(i64, usize)> = None;
    for i in 0..cluster.nodes.len() {
        let (alloc, free) = rows.row(i);
        if !has_room(alloc, free, &request, pods) {
            continue;
        }
        let node = &cluster.nodes[i];
        let score = least_allocated(alloc, free, &scored)
            + NODE_AFFINITY_WEIGHT * preferred_score(prefer, node);
        // Taints, selectors and affinity are only looked at for a node that would be chosen.
        if best.is_none_or(|(s, _)| score > s)
            && !named_in(keep_off, node)
            && !held.contains(&i)
            && node_accepts(shape, node).is_ok()
        {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

/// The pod's request as (resource id, amount), or `None` when it asks for a resource no node
/// lists (it fits nowhere).
fn node_request(pod: &BoundPod) -> Option<Vec<(usize, i64)>> {
    pod.node_request
        .iter()
        .map(|(id, _, q)| id.map(|id| (id, *q)))
        .collect()
}

/// NodeResourcesFit: the node's free amounts (allocatable − requested) cover the request, and
/// it has a pod slot left.
fn has_room(alloc: &[i64], free: &[i64], request: &[(usize, i64)], pods: Option<usize>) -> bool {
    let cell = |v: &[i64], r: usize| v.get(r).copied().unwrap_or(0);
    if pods.is_some_and(|p| cell(alloc, p) > 0 && cell(free, p) < 1000) {
        return false;
    }
    request.iter().all(|&(r, q)| cell(free, r) >= q)
}

/// The NUMA-aware scheduler's choice for one pod (the worker's second scheduler, with
/// Switchyard's extender): only nodes whose kubelet would admit it, by the same Topology
/// Manager check under the node's own policy; of those, the nodes the pod prefers, then the
/// one the extender's prioritize scores highest under the copy's strategy, the first in node
/// order on a tie. `None`: the pod waits for room, as it does when the extender filters every
/// node out.
fn pick_aligned_node(
    cluster: &Cluster,
    rows: &Rows,
    table: &ResourceTable,
    job: &SimJob,
    held: &[usize],
) -> Option<usize> {
    let (behaviour, pod) = (&job.behaviour, &job.bound);
    let (shape, keep_off, prefer) = (&behaviour.shape, &behaviour.keep_off, &behaviour.prefer);
    let pods = table.id("pods");
    let request = node_request(pod)?;
    let config = EngineConfig::default();
    let mut judge = NodeJudge::new(table, shape, pod, &config, behaviour.strategy);
    // No later node can beat one that scores this.
    let ceiling = MAX_NODE_SCORE
        + if prefer.is_empty() {
            0
        } else {
            NODE_AFFINITY_WEIGHT * PREFERRED_SCORE
        };
    let mut best: Option<(i64, usize)> = None;
    for (i, node) in cluster.nodes.iter().enumerate() {
        // The node-level check from the table first: most nodes of a busy worker fail it,
        // and it costs less than the Topology Manager's.
        let (alloc, free) = rows.row(i);
        if !has_room(alloc, free, &request, pods) || named_in(keep_off, node) || held.contains(&i) {
            continue;
        }
        let Ok(score) = judge.verdict(node) else {
            continue;
        };
        // NodeAffinity's score outweighs the extender's (0 – 10 × its weight of 1).
        let score = score + NODE_AFFINITY_WEIGHT * preferred_score(prefer, node);
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, i));
            if score >= ceiling {
                break;
            }
        }
    }
    best.map(|(_, i)| i)
}

/// kube-scheduler's default weight for the NodeAffinity score plugin.
const NODE_AFFINITY_WEIGHT: i64 = 2;

/// NodeAffinity's normalized score on a node the pod's one preferred term names.
const PREFERRED_SCORE: i64 = 100;

/// NodeAffinity's normalized score for the pod's preferred node affinity (see
/// [`Behaviour::prefer`]: one term on `metadata.name`).
fn preferred_score(prefer: &[Arc<str>], node: &Node) -> i64 {
    if named_in(prefer, node) {
        PREFERRED_SCORE
    } else {
        0
    }
}

/// Whether `node` is one of `names` (a `metadata.name` term of the pod's node affinity: its
/// required `NotIn`, see [`Behaviour::keep_off`], or its preferred `In`).
fn named_in(names: &[Arc<str>], node: &Node) -> bool {
    names
        .iter()
        .any(|n| Arc::ptr_eq(n, &node.name) || **n == *node.name)
}

/// The highest score the extender gives a node: no later node can beat it.
const MAX_NODE_SCORE: i64 = 10;

/// The default scheduler's LeastAllocated score (0–100) over cpu and memory after placing
/// the pod.
/// `scored`: the ids of cpu and memory with the pod's request of each.
fn least_allocated(alloc: &[i64], free: &[i64], scored: &[Option<(usize, i64)>; 2]) -> i64 {
    let mut sum = 0;
    let mut n = 0;
    for &(r, want) in scored.iter().flatten() {
        let alloc = alloc.get(r).copied().unwrap_or(0);
        if alloc <= 0 {
            continue;
        }
        let left = free.get(r).copied().unwrap_or(0) - want;
        sum += (left.max(0) * 100) / alloc;
        n += 1;
    }
    if n == 0 {
        0
    } else {
        sum / n
    }
}
