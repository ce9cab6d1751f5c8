//! Builders for Jobs, copies, queues and inventories, and an executor over in-memory workers.

use crate::api::DispatchQueueSpec;
use crate::dispatcher::kind::{Extra, Kind, Part, Status};
use crate::dispatcher::*;
use crate::inventory::{parse_yaml, Inventory};
use crate::placement::{PodShape, PodView};
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub(super) fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

pub(super) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub(super) fn mins(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

// ---------------------------------------------------------------------------------------------
// Inventory, pods, Jobs and queues.

/// Worker clusters in the inventory file format, node by node.
#[derive(Default)]
pub(super) struct InventoryBuilder {
    pub(super) yaml: String,
}

impl InventoryBuilder {
    pub(super) fn cluster(mut self, name: &str) -> Self {
        self.yaml += &format!("  - name: {name}\n    nodes:\n");
        self
    }

    /// A node without NUMA data: only its totals count.
    pub(super) fn node(mut self, name: &str, cpus: u32, gpus: u32) -> Self {
        self.yaml += &format!(
            "      - name: {name}\n        allocatable: {{cpu: \"{cpus}\", memory: 256Gi, nvidia.com/gpu: \"{gpus}\", pods: \"110\"}}\n"
        );
        self
    }

    /// Labels (a flow map) on the last node added.
    pub(super) fn labels(mut self, labels: &str) -> Self {
        self.yaml += &format!("        labels: {labels}\n");
        self
    }

    /// What pods the dispatcher does not know of take on the last node added (by
    /// [`InventoryBuilder::node`]): its inventory shows them requested.
    pub(super) fn busy(mut self, cpus: u32, gpus: u32) -> Self {
        self.yaml +=
            &format!("        requested: {{cpu: \"{cpus}\", nvidia.com/gpu: \"{gpus}\"}}\n");
        self
    }

    /// A node whose kubelet runs the single-numa-node Topology Manager policy at pod scope,
    /// with these (CPUs, GPUs) per NUMA zone and 64Gi of memory in each.
    pub(super) fn numa_node(mut self, name: &str, zones: &[(u32, u32)]) -> Self {
        let cpus: u32 = zones.iter().map(|z| z.0).sum();
        let gpus: u32 = zones.iter().map(|z| z.1).sum();
        let memory = 64 * zones.len();
        self.yaml += &format!(
            "      - name: {name}\n        allocatable: {{cpu: \"{cpus}\", memory: {memory}Gi, nvidia.com/gpu: \"{gpus}\", pods: \"110\"}}\n        topology:\n          attributes:\n            - {{name: topologyManagerPolicy, value: single-numa-node}}\n            - {{name: topologyManagerScope, value: pod}}\n          zones:\n"
        );
        for (i, (c, g)) in zones.iter().enumerate() {
            self.yaml += &format!(
                "            - name: node-{i}\n              type: Node\n              resources:\n                - {{name: cpu, capacity: \"{c}\", allocatable: \"{c}\", available: \"{c}\"}}\n                - {{name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}}\n                - {{name: nvidia.com/gpu, capacity: \"{g}\", allocatable: \"{g}\", available: \"{g}\"}}\n"
            );
        }
        self
    }

    pub(super) fn build(self) -> Inventory {
        parse_yaml(&format!("clusters:\n{}", self.yaml)).expect("test inventory parses")
    }
}

/// A Guaranteed pod (requests = limits) with `cpus` CPUs, 1Gi and `gpus` GPUs.
pub(super) fn pod(cpus: u32, gpus: u32) -> (Arc<PodShape>, u64) {
    let mut r = serde_json::json!({"cpu": cpus.to_string(), "memory": "1Gi"});
    if gpus > 0 {
        r["nvidia.com/gpu"] = gpus.to_string().into();
    }
    let view: PodView = serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "main", "resources": {"requests": r, "limits": r}}]}
    }))
    .expect("pod view");
    let shape = PodShape::from_view(&view).expect("pod shape");
    (Arc::new(shape), u64::from(cpus) * 1000 + u64::from(gpus))
}

/// A manager Job as the dispatcher first sees it: suspended, never admitted.
pub(super) struct JobBuilder(Job);

pub(super) fn job(name: &str) -> JobBuilder {
    let (shape, key) = pod(1, 0);
    JobBuilder(Job {
        key: JobKey::new("team", name),
        uid: format!("uid-{name}"),
        resource_version: String::new(),
        queue: "q".into(),
        priority: 0,
        created: t0(),
        parts: vec![Part {
            name: String::new(),
            jobs: 1,
            pods_per_job: 1,
        }],
        pod: Ok(shape),
        extra: Arc::new([]),
        main_jobs: None,
        shape_key: key,
        namespace_labels: None,
        suspended: true,
        deleting: false,
        cluster: None,
        offers: Vec::new(),
        admitted_at: None,
        requeues: 0,
        requeue_after: None,
        avoid: None,
        refusals: Default::default(),
        deactivated: None,
        result: None,
        status: Status::default(),
    })
}

impl JobBuilder {
    pub(super) fn queue(mut self, q: &str) -> Self {
        self.0.queue = q.into();
        self
    }
    pub(super) fn pods(mut self, n: u32) -> Self {
        self.0.parts[0].pods_per_job = n;
        self
    }
    pub(super) fn each(mut self, cpus: u32, gpus: u32) -> Self {
        let (shape, key) = pod(cpus, gpus);
        self.0.pod = Ok(shape);
        self.0.shape_key = key;
        self
    }
    /// Its pods keep one to a node (a required anti-affinity to one another on the hostname).
    pub(super) fn one_per_node(mut self) -> Self {
        if let Ok(shape) = &mut self.0.pod {
            Arc::make_mut(shape).one_per_node = true;
        }
        self.0.shape_key = self.0.shape_key.wrapping_mul(31).wrapping_add(7);
        self
    }
    /// Its pods spread over nodes at most `max_skew` apart (a topology spread constraint on
    /// the hostname over its own pods).
    pub(super) fn spread(mut self, max_skew: u32) -> Self {
        if let Ok(shape) = &mut self.0.pod {
            Arc::make_mut(shape).spread = Some(crate::placement::apart::Spread {
                max_skew,
                min_domains: 1,
                honor_affinity: true,
                honor_taints: false,
            });
        }
        self.0.shape_key = self
            .0
            .shape_key
            .wrapping_mul(37)
            .wrapping_add(u64::from(max_skew));
        self
    }
    /// Its pods kept together in one domain of `key` (a required pod affinity to its own
    /// pods).
    pub(super) fn together(mut self, key: &str) -> Self {
        if let Ok(shape) = &mut self.0.pod {
            Arc::make_mut(shape).together = vec![key.to_string()];
        }
        self.0.shape_key = (self.0.shape_key.wrapping_mul(41))
            .wrapping_add(key.bytes().map(u64::from).sum::<u64>());
        self
    }
    /// Adds `pods` pods of another shape to the gang (as a JobSet's second replicated Job
    /// asking for other pods), placed in the same worker.
    pub(super) fn beside(mut self, pods: u32, cpus: u32, gpus: u32) -> Self {
        let (shape, key) = pod(cpus, gpus);
        self.0.parts.push(Part {
            name: "beside".into(),
            jobs: 1,
            pods_per_job: pods,
        });
        self.0.extra = Arc::new([Extra {
            shape,
            pods,
            jobs: "replicated Job beside".into(),
        }]);
        self.0.main_jobs = Some("replicated Job main".into());
        self.0.shape_key = self.0.shape_key.wrapping_mul(1_000_003).wrapping_add(key);
        self
    }
    pub(super) fn priority(mut self, p: i32) -> Self {
        self.0.priority = p;
        self
    }
    pub(super) fn created(mut self, t: SystemTime) -> Self {
        self.0.created = t;
        self
    }
    pub(super) fn uid(mut self, uid: &str) -> Self {
        self.0.uid = uid.into();
        self
    }
    pub(super) fn build(self) -> Job {
        self.0
    }
}

/// A worker's copy of `job` (its Job controller's status not written yet).
pub(super) fn copy_of(job: &Job, cluster: &str, uid: &str) -> WorkerCopy {
    WorkerCopy {
        cluster: cluster.to_string(),
        key: job.key.clone(),
        uid: uid.to_string(),
        origin_uid: job.uid.clone(),
        status: Status::default(),
        deleting: false,
        suspended: false,
        kueue: false,
    }
}

impl WorkerCopy {
    pub(super) fn status(mut self, status: JobStatus) -> Self {
        self.status = status.into();
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }
}

/// A queue from its DispatchQueue spec in YAML.
pub(super) fn queue(name: &str, spec: &str) -> Queue {
    let spec: DispatchQueueSpec = serde_yaml::from_str(spec).expect("queue spec parses");
    Queue {
        name: name.into(),
        settings: Ok(spec.resolve().expect("queue spec is valid")),
    }
}

pub(super) fn condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    job.condition(type_)
}

/// (status, reason) of the condition.
pub(super) fn cond(job: &Job, type_: &str) -> Option<(String, String)> {
    condition(job, type_).map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

pub(super) fn is_true(job: &Job, type_: &str) -> bool {
    cond(job, type_).is_some_and(|(s, _)| s == "True")
}

pub(super) fn annotation(job: &Job, name: &str) -> Option<String> {
    status::annotations(job)
        .into_iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v)
}

// ---------------------------------------------------------------------------------------------
// An executor over in-memory workers.

/// The manager's [`World`] and what each worker really holds. Actions are carried out as the
/// live executor does: each one either happens whole or fails (then the Job is looked at
/// again); a worker that is unreachable refuses everything and its changes reach the world
/// only when it is listed again.
pub(super) struct Env {
    pub(super) world: World,
    pub(super) now: SystemTime,
    /// Per worker, its copies by origin uid.
    pub(super) remote: BTreeMap<String, BTreeMap<String, WorkerCopy>>,
    pub(super) next_copy: u64,
    /// Every action carried out, with the time.
    pub(super) done: Vec<(SystemTime, Action)>,
    /// Every action planned (carried out or not), with the time.
    pub(super) planned: Vec<String>,
    /// Status writes the API server would refuse (never expected).
    pub(super) refused: Vec<String>,
    /// Copies created while the Job still had a live copy in another reachable worker
    /// (never expected, but among the copies it is offered to).
    pub(super) duplicates: Vec<String>,
    /// When the last plan asked to be woken.
    pub(super) wake_at: Option<SystemTime>,
    /// Workers that are connected but whose API server refuses every write for now.
    pub(super) refusing: BTreeSet<String>,
    /// Copies (worker, copy uid) that were in a worker when it was disconnected: given up for
    /// lost by design, they may run on until the worker is back and they are removed.
    pub(super) lost_copies: BTreeSet<(String, String)>,
}

impl Env {
    pub(super) fn new(inventory: Inventory, queues: Vec<Queue>) -> Self {
        let mut world = World::new(DispatchConfig::default());
        let names: Vec<String> = inventory.clusters.iter().map(|c| c.name.clone()).collect();
        world.state.inventory = Arc::new(inventory);
        world.state.jobs_synced = true;
        let mut remote = BTreeMap::new();
        for name in names {
            world.upsert_worker(Worker::named(&name));
            remote.insert(name, BTreeMap::new());
        }
        for q in queues {
            world.upsert_queue(q);
        }
        Self {
            world,
            now: t0(),
            remote,
            next_copy: 0,
            done: Vec::new(),
            planned: Vec::new(),
            refused: Vec::new(),
            duplicates: Vec::new(),
            wake_at: None,
            refusing: BTreeSet::new(),
            lost_copies: BTreeSet::new(),
        }
    }

    /// The dispatcher restarts: a new World rebuilt from what the objects say (the manager's
    /// Jobs, the workers' copies), nothing remembered.
    pub(super) fn restart(&mut self) {
        let mut world = World::new(self.world.config.clone());
        world.state.inventory = self.world.state.inventory.clone();
        world.state.jobs_synced = true;
        for w in self.world.state.workers.values() {
            world.upsert_worker(w.clone());
        }
        for q in self.world.state.queues.values() {
            world.upsert_queue(q.clone());
        }
        for j in self.world.state.jobs.values() {
            world.upsert_job(j.clone());
        }
        for (c, copies) in &self.remote {
            if self.reachable(c) {
                world.replace_copies(c, Kind::Job, copies.values().cloned().collect());
            }
        }
        self.world = world;
    }

    pub(super) fn submit(&mut self, job: Job) {
        self.world.upsert_job(job);
    }

    pub(super) fn job(&self, name: &str) -> &Job {
        &self.world.state.jobs[&JobKey::new("team", name)]
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    pub(super) fn advance_to(&mut self, t: SystemTime) {
        assert!(t >= self.now, "time only moves forward");
        self.now = t;
    }

    pub(super) fn plan(&mut self) -> Plan {
        let p = plan(&mut self.world, self.now);
        for a in &p.actions {
            self.planned.push(format!("{:?} {a:?}", self.now));
        }
        // The room kept for starving Jobs is decided too (it is no action: nothing is written).
        let kept: Vec<String> = self
            .world
            .ledger
            .nominations()
            .map(|h| format!("{} in {} {:?}", h.job_uid, h.cluster, h.takes))
            .collect();
        if !kept.is_empty() {
            self.planned.push(format!("{:?} kept {kept:?}", self.now));
        }
        p
    }

    /// Plans once and carries every action out.
    pub(super) fn step(&mut self) -> Plan {
        let mut p = self.plan();
        for a in std::mem::take(&mut p.actions) {
            self.execute(&a, true);
            p.actions.push(a);
        }
        p
    }

    /// Plans and carries out until the dispatcher has nothing more to do now; every action.
    pub(super) fn settle(&mut self) -> Vec<Action> {
        let mut all = Vec::new();
        for _ in 0..50 {
            let p = self.step();
            self.wake_at = p.wake_at;
            // A plan that asks to be woken now (it let room go) is followed at once.
            if p.actions.is_empty() && p.wake_at.is_none_or(|w| w > self.now) {
                return all;
            }
            all.extend(p.actions);
        }
        panic!("the dispatcher never settles; last actions: {all:#?}");
    }

    /// Leaves the dispatcher alone until `limit`: it plans only when it asked to be woken,
    /// as the live one does when nothing changes.
    pub(super) fn idle_until(&mut self, limit: SystemTime) {
        loop {
            self.settle();
            match self.wake_at {
                Some(w) if w > self.now && w <= limit => self.advance_to(w),
                _ => break,
            }
        }
    }

    /// When the Job's actions of this kind were carried out.
    pub(super) fn times_of(&self, name: &str, kind: fn(&Action) -> bool) -> Vec<SystemTime> {
        self.done
            .iter()
            .filter(|(_, a)| kind(a) && a.job().is_some_and(|k| k.name == name))
            .map(|(t, _)| *t)
            .collect()
    }

    /// Carries out one action, or fails it (`ok == false`: the API call failed).
    pub(super) fn execute(&mut self, action: &Action, ok: bool) {
        let now = self.now;
        apply(&mut self.world, action, Outcome::Started, now);
        if !ok {
            return apply(&mut self.world, action, Outcome::Failed, now);
        }
        let outcome = self.carry_out(action);
        if outcome == Outcome::Claimed {
            self.done.push((now, action.clone()));
        }
        if outcome == Outcome::Done {
            // Every status the dispatcher writes, not only the mirror's, must pass the API
            // server's rules: one that does not is refused whole.
            let refused = action.job().and_then(|key| {
                let j = self.world.state.jobs.get(key)?;
                let new = job_after(j, action, now)?;
                Status::violation(&j.status, &new.status, new.suspended)
                    .map(|why| format!("{key}: {action:?}: {why}"))
            });
            if let Some(why) = refused {
                self.refused.push(why);
                return apply(&mut self.world, action, Outcome::Failed, now);
            }
            self.done.push((now, action.clone()));
        }
        apply(&mut self.world, action, outcome, now);
    }

    /// What carrying the action out in the workers came to.
    pub(super) fn carry_out(&mut self, action: &Action) -> Outcome {
        match action {
            Action::Dispatch { job, cluster, .. } => {
                self.no_duplicate(job, std::slice::from_ref(cluster));
                match self.create_copy(job, cluster) {
                    true => Outcome::Done,
                    // The claim lands; the create does not, and is tried again from there.
                    false => Outcome::Claimed,
                }
            }
            Action::Offer { job, clusters } => {
                self.no_duplicate(job, clusters);
                let mut created = 0;
                for c in clusters {
                    created += usize::from(self.create_copy(job, c));
                }
                match created == clusters.len() {
                    true => Outcome::Done,
                    false => Outcome::Claimed,
                }
            }
            Action::CreateCopy { job, cluster } => {
                if let Some(j) = self.world.state.jobs.get(job) {
                    let mut allowed = j.offers.clone();
                    allowed.push(cluster.clone());
                    self.no_duplicate(job, &allowed);
                }
                match self.create_copy(job, cluster) {
                    true => Outcome::Done,
                    false => Outcome::Failed,
                }
            }
            Action::DeleteCopy {
                cluster,
                uid,
                origin_uid,
                ..
            } => {
                if !self.reachable(cluster) || self.refusing.contains(cluster) {
                    return Outcome::Failed;
                }
                let copies = self.remote.get_mut(cluster).expect("known worker");
                if copies.get(origin_uid).is_some_and(|c| &c.uid == uid) {
                    copies.remove(origin_uid);
                }
                Outcome::Done
            }
            Action::WriteStatus { job, status, .. } => {
                let Some(j) = self.world.state.jobs.get(job) else {
                    return Outcome::Done;
                };
                match Status::violation(&j.status, status, j.suspended) {
                    Some(why) => {
                        self.refused.push(format!("{job}: {why}"));
                        Outcome::StatusRefused
                    }
                    None => Outcome::Done,
                }
            }
            _ => Outcome::Done,
        }
    }

    /// Records a copy about to be created while the Job has a live copy in a reachable
    /// worker other than `allowed`.
    pub(super) fn no_duplicate(&mut self, key: &JobKey, allowed: &[String]) {
        let Some(uid) = self.world.state.jobs.get(key).map(|j| j.uid.clone()) else {
            return;
        };
        let elsewhere: Vec<&String> = self
            .remote
            .iter()
            .filter(|(c, m)| {
                !allowed.contains(c)
                    && self.reachable(c)
                    && m.get(&uid).is_some_and(|copy| !copy.deleting)
            })
            .map(|(c, _)| c)
            .collect();
        if !elsewhere.is_empty() {
            self.duplicates.push(format!(
                "{key}: a copy created in {allowed:?} while it runs in {elsewhere:?} at {:?}",
                self.now
            ));
        }
    }

    pub(super) fn reachable(&self, cluster: &str) -> bool {
        self.world
            .state
            .workers
            .get(cluster)
            .is_some_and(|w| w.connected)
    }

    /// The worker's Job controller creates the copy; its pods are not Ready yet.
    pub(super) fn create_copy(&mut self, key: &JobKey, cluster: &str) -> bool {
        if !self.reachable(cluster) || self.refusing.contains(cluster) {
            return false;
        }
        let Some(job) = self.world.state.jobs.get(key) else {
            return false;
        };
        self.next_copy += 1;
        let copy = copy_of(job, cluster, &format!("copy-{}", self.next_copy)).status(JobStatus {
            active: Some(job.gang() as i32),
            ready: Some(0),
            start_time: Some(Time(mirror::to_timestamp(self.now))),
            ..Default::default()
        });
        let copies = self.remote.get_mut(cluster).expect("known worker");
        if copies.contains_key(&copy.origin_uid) {
            // A copy of the Job is already there: the API server refuses the name.
            return false;
        }
        copies.insert(copy.origin_uid.clone(), copy.clone());
        self.world.upsert_copy(copy);
        true
    }

    /// The copy of the Job in `cluster`, as the worker has it.
    pub(super) fn remote_copy(&self, name: &str, cluster: &str) -> Option<&WorkerCopy> {
        let uid = &self.job(name).uid;
        self.remote.get(cluster)?.get(uid)
    }

    /// Changes the Job's copy in its worker (as that worker's Job controller would), and
    /// tells the world when the worker is reachable.
    pub(super) fn change_copy(
        &mut self,
        name: &str,
        cluster: &str,
        f: impl FnOnce(&mut WorkerCopy),
    ) {
        let uid = self.job(name).uid.clone();
        let copy = self
            .remote
            .get_mut(cluster)
            .and_then(|m| m.get_mut(&uid))
            .unwrap_or_else(|| panic!("{name} has no copy in {cluster}"));
        f(copy);
        let copy = copy.clone();
        if self.reachable(cluster) {
            self.world.upsert_copy(copy);
        }
    }

    /// The Job's worker (where its copy is).
    pub(super) fn where_(&self, name: &str) -> String {
        let uid = &self.job(name).uid;
        let places: Vec<&String> = self
            .remote
            .iter()
            .filter(|(_, m)| m.contains_key(uid))
            .map(|(c, _)| c)
            .collect();
        assert_eq!(places.len(), 1, "{name} has copies in {places:?}");
        places[0].clone()
    }

    pub(super) fn set_ready(&mut self, name: &str, ready: i32) {
        let c = self.where_(name);
        self.change_copy(name, &c, |copy| copy.status.job_mut().ready = Some(ready));
    }

    /// The copy ends: Complete or Failed, as a 1.31+ Job controller writes it.
    pub(super) fn finish(&mut self, name: &str, succeeded: bool) {
        let c = self.where_(name);
        let gang = self.job(name).gang() as i32;
        let now = Time(mirror::to_timestamp(self.now));
        self.change_copy(name, &c, |copy| {
            finish_copy(copy, gang, succeeded, now, true)
        });
    }

    /// Someone deletes the copy in its worker.
    pub(super) fn delete_in_worker(&mut self, name: &str) {
        let c = self.where_(name);
        let uid = self.job(name).uid.clone();
        self.remote.get_mut(&c).expect("worker").remove(&uid);
        if self.reachable(&c) {
            self.world.remove_copy(&c, &uid);
        }
    }

    pub(super) fn disconnect(&mut self, cluster: &str) {
        for c in self.remote[cluster].values() {
            self.lost_copies
                .insert((cluster.to_string(), c.uid.clone()));
        }
        let mut w = self.world.state.workers[cluster].clone();
        w.connected = false;
        w.copies_unlisted_since = Some(self.now);
        w.disconnected_since = Some(self.now);
        w.message = "connection refused".into();
        self.world.upsert_worker(w);
    }

    /// The worker answers again; its copies are listed.
    pub(super) fn reconnect(&mut self, cluster: &str) {
        let mut w = self.world.state.workers[cluster].clone();
        w.connected = true;
        w.disconnected_since = None;
        w.message.clear();
        self.world.upsert_worker(w.clone());
        let copies: Vec<WorkerCopy> = self.remote[cluster].values().cloned().collect();
        self.world.replace_copies(cluster, Kind::Job, copies);
        w.copies_unlisted_since = None;
        self.world.upsert_worker(w);
    }

    /// The user sets `spec.suspend: true` on the manager Job.
    pub(super) fn user_suspends(&mut self, name: &str) {
        let mut j = self.job(name).clone();
        j.suspended = true;
        self.world.upsert_job(j);
    }

    /// What the queue's Jobs use together, counted from the Jobs themselves and the workers'
    /// copies: the Jobs admitted, and those taken back whose copy still runs in a worker that
    /// answers (its pods use the quota until it is gone).
    pub(super) fn admitted_usage(&self, queue: &str) -> BTreeMap<String, i64> {
        self.usage(queue, true)
    }

    /// [`Env::admitted_usage`] without the copies given up for lost: they run on by design
    /// (the quota they held went to other Jobs when their worker stopped answering) until
    /// their worker is back and they are removed.
    pub(super) fn usage_within_quota(&self, queue: &str) -> BTreeMap<String, i64> {
        self.usage(queue, false)
    }

    fn usage(&self, queue: &str, lost_too: bool) -> BTreeMap<String, i64> {
        let still_runs = |j: &Job| {
            self.remote.iter().any(|(cluster, copies)| {
                self.reachable(cluster)
                    && copies.get(&j.uid).is_some_and(|c| {
                        !c.deleting
                            && c.status.terminal().is_none()
                            && (lost_too
                                || !self.lost_copies.contains(&(cluster.clone(), c.uid.clone())))
                    })
            })
        };
        let mut out = BTreeMap::new();
        for j in self.world.state.jobs.values() {
            if j.queue == queue && (j.holds_quota() || still_runs(j)) {
                for (r, v) in j.total_request() {
                    *out.entry(r).or_insert(0) += v;
                }
            }
        }
        out.retain(|_, v| *v != 0);
        out
    }
}

pub(super) fn finish_copy(
    copy: &mut WorkerCopy,
    gang: i32,
    succeeded: bool,
    at: Time,
    new_style: bool,
) {
    let c = |type_: &str, reason: &str| JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: None,
        last_probe_time: Some(at.clone()),
        last_transition_time: Some(at.clone()),
    };
    let s = copy.status.job_mut();
    s.active = Some(0);
    s.ready = Some(0);
    if succeeded {
        s.succeeded = Some(gang);
        s.completion_time = Some(at.clone());
        s.conditions = Some(if new_style {
            vec![
                c("SuccessCriteriaMet", "CompletionsReached"),
                c("Complete", "CompletionsReached"),
            ]
        } else {
            vec![c("Complete", "CompletionsReached")]
        });
    } else {
        s.failed = Some(s.failed.unwrap_or(0) + 7);
        s.conditions = Some(if new_style {
            vec![
                c("FailureTarget", "BackoffLimitExceeded"),
                c("Failed", "BackoffLimitExceeded"),
            ]
        } else {
            vec![c("Failed", "BackoffLimitExceeded")]
        });
    }
}

pub(super) fn dispatches(actions: &[Action]) -> Vec<(String, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch { job, cluster, .. } => Some((job.name.clone(), cluster.clone())),
            _ => None,
        })
        .collect()
}

pub(super) fn requeues(actions: &[Action]) -> Vec<(String, &'static str)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Requeue { job, reason, .. } => Some((job.name.clone(), *reason)),
            _ => None,
        })
        .collect()
}

pub(super) fn deletions(actions: &[Action]) -> Vec<(String, String, &'static str)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteCopy {
                cluster,
                job,
                reason,
                ..
            } => Some((job.name.clone(), cluster.clone(), *reason)),
            _ => None,
        })
        .collect()
}

/// One worker `a` with room for anything these tests submit.
/// Workers `a` and `b`, one node of `cpus` CPUs (no GPUs) each.
pub(super) fn two_workers(cpus: u32) -> Inventory {
    InventoryBuilder::default()
        .cluster("a")
        .node("a-0", cpus, 0)
        .cluster("b")
        .node("b-0", cpus, 0)
        .build()
}

pub(super) fn roomy() -> Inventory {
    let mut b = InventoryBuilder::default().cluster("a");
    for i in 0..4 {
        b = b.node(&format!("a-{i}"), 64, 0);
    }
    b.build()
}
