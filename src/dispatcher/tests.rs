//! The dispatcher's decisions as a user sees them: a [`World`] built by hand, its plans carried
//! out the way an executor carries them out (each outcome reported to [`apply`], copies
//! appear in and vanish from the workers and the world hears of it), and the outcome checked
//! after each step: where Jobs run, what their conditions say, what quota they hold.

use super::job::{terminal, to_system_time};
use super::*;
use crate::api::DispatchQueueSpec;
use crate::inventory::{parse_yaml, Inventory};
use crate::placement::{PodShape, PodView};
use crate::rng::Rng;
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn mins(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

// ---------------------------------------------------------------------------------------------
// Inventory, pods, Jobs and queues.

/// Worker clusters in the inventory file format, node by node.
#[derive(Default)]
struct InventoryBuilder {
    yaml: String,
}

impl InventoryBuilder {
    fn cluster(mut self, name: &str) -> Self {
        self.yaml += &format!("  - name: {name}\n    nodes:\n");
        self
    }

    /// A node without NUMA data: only its totals count.
    fn node(mut self, name: &str, cpus: u32, gpus: u32) -> Self {
        self.yaml += &format!(
            "      - name: {name}\n        allocatable: {{cpu: \"{cpus}\", memory: 256Gi, nvidia.com/gpu: \"{gpus}\", pods: \"110\"}}\n"
        );
        self
    }

    /// A node whose kubelet runs the single-numa-node Topology Manager policy at pod scope,
    /// with these (CPUs, GPUs) per NUMA zone and 64Gi of memory in each.
    fn numa_node(mut self, name: &str, zones: &[(u32, u32)]) -> Self {
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

    fn build(self) -> Inventory {
        parse_yaml(&format!("clusters:\n{}", self.yaml)).expect("test inventory parses")
    }
}

/// A Guaranteed pod (requests = limits) with `cpus` CPUs, 1Gi and `gpus` GPUs.
fn pod(cpus: u32, gpus: u32) -> (Arc<PodShape>, u64) {
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
struct JobBuilder(Job);

fn job(name: &str) -> JobBuilder {
    let (shape, key) = pod(1, 0);
    JobBuilder(Job {
        key: JobKey::new("team", name),
        uid: format!("uid-{name}"),
        resource_version: String::new(),
        queue: "q".into(),
        priority: 0,
        created: t0(),
        parallelism: 1,
        completions: None,
        pod: Ok(shape),
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
        status: JobStatus::default(),
    })
}

impl JobBuilder {
    fn queue(mut self, q: &str) -> Self {
        self.0.queue = q.into();
        self
    }
    fn pods(mut self, n: u32) -> Self {
        self.0.parallelism = n;
        self
    }
    fn each(mut self, cpus: u32, gpus: u32) -> Self {
        let (shape, key) = pod(cpus, gpus);
        self.0.pod = Ok(shape);
        self.0.shape_key = key;
        self
    }
    fn priority(mut self, p: i32) -> Self {
        self.0.priority = p;
        self
    }
    fn created(mut self, t: SystemTime) -> Self {
        self.0.created = t;
        self
    }
    fn build(self) -> Job {
        self.0
    }
}

/// A queue from its DispatchQueue spec in YAML.
fn queue(name: &str, spec: &str) -> Queue {
    let spec: DispatchQueueSpec = serde_yaml::from_str(spec).expect("queue spec parses");
    Queue {
        name: name.into(),
        settings: Ok(spec.resolve().expect("queue spec is valid")),
    }
}

fn condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    job.condition(type_)
}

/// (status, reason) of the condition.
fn cond(job: &Job, type_: &str) -> Option<(String, String)> {
    condition(job, type_).map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn is_true(job: &Job, type_: &str) -> bool {
    cond(job, type_).is_some_and(|(s, _)| s == "True")
}

fn annotation(job: &Job, name: &str) -> Option<String> {
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
struct Env {
    world: World,
    now: SystemTime,
    /// Per worker, its copies by origin uid.
    remote: BTreeMap<String, BTreeMap<String, WorkerCopy>>,
    next_copy: u64,
    /// Every action carried out, with the time.
    done: Vec<(SystemTime, Action)>,
    /// Every action planned (carried out or not), with the time.
    planned: Vec<String>,
    /// Status writes the API server would refuse (never expected).
    refused: Vec<String>,
    /// Copies created while the Job still had a live copy in another reachable worker
    /// (never expected, but among the copies it is offered to).
    duplicates: Vec<String>,
    /// When the last plan asked to be woken.
    wake_at: Option<SystemTime>,
    /// Workers that are connected but whose API server refuses every write for now.
    refusing: BTreeSet<String>,
    /// Copies (worker, copy uid) that were in a worker when it was disconnected: given up for
    /// lost by design, they may run on until the worker is back and they are removed.
    lost_copies: BTreeSet<(String, String)>,
}

impl Env {
    fn new(inventory: Inventory, queues: Vec<Queue>) -> Self {
        let mut world = World::new(DispatchConfig::default());
        let names: Vec<String> = inventory.clusters.iter().map(|c| c.name.clone()).collect();
        world.state.inventory = Arc::new(inventory);
        world.state.jobs_synced = true;
        let mut remote = BTreeMap::new();
        for name in names {
            world.upsert_worker(Worker {
                name: name.clone(),
                connected: true,
                disconnected_since: None,
                copies_synced: true,
                message: String::new(),
            });
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
    fn restart(&mut self) {
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
                world.replace_copies(c, copies.values().cloned().collect());
            }
        }
        self.world = world;
    }

    fn submit(&mut self, job: Job) {
        self.world.upsert_job(job);
    }

    fn job(&self, name: &str) -> &Job {
        &self.world.state.jobs[&JobKey::new("team", name)]
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    fn advance_to(&mut self, t: SystemTime) {
        assert!(t >= self.now, "time only moves forward");
        self.now = t;
    }

    fn plan(&mut self) -> Plan {
        let p = plan(&mut self.world, self.now);
        for a in &p.actions {
            self.planned.push(format!("{:?} {a:?}", self.now));
        }
        p
    }

    /// Plans once and carries every action out.
    fn step(&mut self) -> Plan {
        let mut p = self.plan();
        for a in std::mem::take(&mut p.actions) {
            self.execute(&a, true);
            p.actions.push(a);
        }
        p
    }

    /// Plans and carries out until the dispatcher has nothing more to do now; every action.
    fn settle(&mut self) -> Vec<Action> {
        let mut all = Vec::new();
        for _ in 0..50 {
            let p = self.step();
            self.wake_at = p.wake_at;
            if p.actions.is_empty() {
                return all;
            }
            all.extend(p.actions);
        }
        panic!("the dispatcher never settles; last actions: {all:#?}");
    }

    /// Leaves the dispatcher alone until `limit`: it plans only when it asked to be woken,
    /// as the live one does when nothing changes.
    fn idle_until(&mut self, limit: SystemTime) {
        loop {
            self.settle();
            match self.wake_at {
                Some(w) if w > self.now && w <= limit => self.advance_to(w),
                _ => break,
            }
        }
    }

    /// When the Job's actions of this kind were carried out.
    fn times_of(&self, name: &str, kind: fn(&Action) -> bool) -> Vec<SystemTime> {
        self.done
            .iter()
            .filter(|(_, a)| kind(a) && a.job().is_some_and(|k| k.name == name))
            .map(|(t, _)| *t)
            .collect()
    }

    /// Carries out one action, or fails it (`ok == false`: the API call failed).
    fn execute(&mut self, action: &Action, ok: bool) {
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
                mirror::violation(&j.status, &new.status, new.suspended)
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
    fn carry_out(&mut self, action: &Action) -> Outcome {
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
                match mirror::violation(&j.status, status, j.suspended) {
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
    fn no_duplicate(&mut self, key: &JobKey, allowed: &[String]) {
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

    fn reachable(&self, cluster: &str) -> bool {
        self.world
            .state
            .workers
            .get(cluster)
            .is_some_and(|w| w.connected)
    }

    /// The worker's Job controller creates the copy; its pods are not Ready yet.
    fn create_copy(&mut self, key: &JobKey, cluster: &str) -> bool {
        if !self.reachable(cluster) || self.refusing.contains(cluster) {
            return false;
        }
        let Some(job) = self.world.state.jobs.get(key) else {
            return false;
        };
        self.next_copy += 1;
        let copy = WorkerCopy {
            cluster: cluster.to_string(),
            key: key.clone(),
            uid: format!("copy-{}", self.next_copy),
            origin_uid: job.uid.clone(),
            status: JobStatus {
                active: Some(job.gang() as i32),
                ready: Some(0),
                start_time: Some(Time(mirror::to_timestamp(self.now))),
                ..Default::default()
            },
            deleting: false,
        };
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
    fn remote_copy(&self, name: &str, cluster: &str) -> Option<&WorkerCopy> {
        let uid = &self.job(name).uid;
        self.remote.get(cluster)?.get(uid)
    }

    /// Changes the Job's copy in its worker (as that worker's Job controller would), and
    /// tells the world when the worker is reachable.
    fn change_copy(&mut self, name: &str, cluster: &str, f: impl FnOnce(&mut WorkerCopy)) {
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
    fn where_(&self, name: &str) -> String {
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

    fn set_ready(&mut self, name: &str, ready: i32) {
        let c = self.where_(name);
        self.change_copy(name, &c, |copy| copy.status.ready = Some(ready));
    }

    /// The copy ends: Complete or Failed, as a 1.31+ Job controller writes it.
    fn finish(&mut self, name: &str, succeeded: bool) {
        let c = self.where_(name);
        let gang = self.job(name).gang() as i32;
        let now = Time(mirror::to_timestamp(self.now));
        self.change_copy(name, &c, |copy| {
            finish_copy(copy, gang, succeeded, now, true)
        });
    }

    /// Someone deletes the copy in its worker.
    fn delete_in_worker(&mut self, name: &str) {
        let c = self.where_(name);
        let uid = self.job(name).uid.clone();
        self.remote.get_mut(&c).expect("worker").remove(&uid);
        if self.reachable(&c) {
            self.world.remove_copy(&c, &uid);
        }
    }

    fn disconnect(&mut self, cluster: &str) {
        for c in self.remote[cluster].values() {
            self.lost_copies
                .insert((cluster.to_string(), c.uid.clone()));
        }
        let mut w = self.world.state.workers[cluster].clone();
        w.connected = false;
        w.copies_synced = false;
        w.disconnected_since = Some(self.now);
        w.message = "connection refused".into();
        self.world.upsert_worker(w);
    }

    /// The worker answers again; its copies are listed.
    fn reconnect(&mut self, cluster: &str) {
        let mut w = self.world.state.workers[cluster].clone();
        w.connected = true;
        w.disconnected_since = None;
        w.message.clear();
        self.world.upsert_worker(w.clone());
        let copies: Vec<WorkerCopy> = self.remote[cluster].values().cloned().collect();
        self.world.replace_copies(cluster, copies);
        w.copies_synced = true;
        self.world.upsert_worker(w);
    }

    /// The user sets `spec.suspend: true` on the manager Job.
    fn user_suspends(&mut self, name: &str) {
        let mut j = self.job(name).clone();
        j.suspended = true;
        self.world.upsert_job(j);
    }

    /// What the queue's admitted Jobs request together, counted from the Jobs themselves.
    fn admitted_usage(&self, queue: &str) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for j in self.world.state.jobs.values() {
            if j.queue == queue && j.holds_quota() {
                for (r, v) in j.total_request() {
                    *out.entry(r).or_insert(0) += v;
                }
            }
        }
        out.retain(|_, v| *v != 0);
        out
    }
}

fn finish_copy(copy: &mut WorkerCopy, gang: i32, succeeded: bool, at: Time, new_style: bool) {
    let c = |type_: &str, reason: &str| JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: None,
        last_probe_time: Some(at.clone()),
        last_transition_time: Some(at.clone()),
    };
    let s = &mut copy.status;
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

fn dispatches(actions: &[Action]) -> Vec<(String, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch { job, cluster, .. } => Some((job.name.clone(), cluster.clone())),
            _ => None,
        })
        .collect()
}

fn requeues(actions: &[Action]) -> Vec<(String, &'static str)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Requeue { job, reason, .. } => Some((job.name.clone(), *reason)),
            _ => None,
        })
        .collect()
}

fn deletions(actions: &[Action]) -> Vec<(String, String, &'static str)> {
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
fn roomy() -> Inventory {
    let mut b = InventoryBuilder::default().cluster("a");
    for i in 0..4 {
        b = b.node(&format!("a-{i}"), 64, 0);
    }
    b.build()
}

// ---------------------------------------------------------------------------------------------
// 1. Placement.

#[test]
fn a_gang_goes_to_the_one_cluster_where_it_fits_numa_aligned() {
    // The gang: 2 pods × (4 CPUs, 2 GPUs), each pod's GPUs in one NUMA zone.
    // - `spread`: 4 GPUs free, 1 per node: enough summed, no node holds a pod;
    // - `split`: one node, 4 GPUs, 1 per NUMA zone: the node has room, no zone does;
    // - `tiny`: 1 GPU in all;
    // - `aligned`: one node, 2 zones of 2 GPUs: the only one that can run it.
    // `spread` and `split` come first in the queue and are emptier (LeastAllocated would
    // prefer them), so only the NUMA-exact fit can pick `aligned`.
    let inv = InventoryBuilder::default()
        .cluster("spread")
        .node("spread-0", 64, 1)
        .node("spread-1", 64, 1)
        .node("spread-2", 64, 1)
        .node("spread-3", 64, 1)
        .cluster("split")
        .numa_node("split-0", &[(16, 1), (16, 1), (16, 1), (16, 1)])
        .cluster("tiny")
        .node("tiny-0", 8, 1)
        .cluster("aligned")
        .numa_node("aligned-0", &[(8, 2), (8, 2)])
        .build();
    let mut env = Env::new(
        inv,
        vec![queue(
            "q",
            "clusters: [spread, split, tiny, aligned]\nplacement: {fanout: 1}",
        )],
    );
    env.submit(job("train").pods(2).each(4, 2).build());

    let p = env.plan();
    let placed: Vec<&Action> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Dispatch { .. } | Action::Offer { .. }))
        .collect();
    assert_eq!(placed.len(), 1, "one placement: {placed:#?}");
    let Action::Dispatch { cluster, hold, .. } = placed[0] else {
        panic!("a dispatch, not an offer: {placed:#?}");
    };
    assert_eq!(cluster, "aligned");
    // The placement held for it: both pods on the aligned node, one per NUMA zone.
    assert_eq!(hold.cluster, "aligned");
    assert!(
        hold.takes.iter().all(|t| &*t.node == "aligned-0"),
        "{hold:#?}"
    );
    let gpu = env
        .world
        .state
        .inventory
        .resources
        .id("nvidia.com/gpu")
        .expect("gpu");
    let mut per_zone = BTreeMap::new();
    for t in &hold.takes {
        for &(zone, r, v) in &t.zone_amounts {
            if r == gpu {
                *per_zone.entry(zone).or_insert(0) += v;
            }
        }
    }
    assert_eq!(per_zone, BTreeMap::from([(0, 2000), (1, 2000)]));

    for a in p.actions {
        env.execute(&a, true);
    }
    assert_eq!(env.where_("train"), "aligned");
    assert_eq!(env.job("train").cluster.as_deref(), Some("aligned"));
    assert!(!env.job("train").suspended);
    assert_eq!(
        cond(env.job("train"), condition::ADMITTED),
        Some(("True".into(), reason::DISPATCHED.into()))
    );
    assert_eq!(
        annotation(env.job("train"), CLUSTER_ANNOTATION).as_deref(),
        Some("aligned")
    );

    // A second identical gang finds no aligned room left: it waits, and says why.
    env.submit(job("train-2").pods(2).each(4, 2).build());
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    let WaitReason { reason: why, .. } = p
        .waiting
        .values()
        .next()
        .expect("the second gang's class waits");
    assert_eq!(*why, reason::NO_WORKER_FITS);
}

// ---------------------------------------------------------------------------------------------
// 2. Quota.

#[test]
fn a_burst_of_a_thousand_jobs_never_exceeds_the_queue_quota() {
    // 10 CPUs of quota, 3 CPUs per Job: 3 at a time, though the worker has room for 85.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"10\"}")],
    );
    for i in 0..1000 {
        env.submit(
            job(&format!("burst-{i:04}"))
                .each(3, 0)
                .created(t0() + Duration::from_millis(i))
                .build(),
        );
    }
    let quota = 10_000;
    let check = |env: &Env| {
        let used = env.admitted_usage("q").get("cpu").copied().unwrap_or(0);
        assert!(used <= quota, "{used}m CPU admitted, quota {quota}m");
        let seen = env
            .world
            .ledger
            .queue_use("q")
            .map_or(0, |u| u.usage.get("cpu").copied().unwrap_or(0));
        assert_eq!(seen, used, "the queue's running total matches its Jobs");
    };
    let admitted = |env: &Env| {
        env.world
            .state
            .jobs
            .values()
            .filter(|j| j.holds_quota())
            .count()
    };

    let mut finished = 0;
    for round in 0..1000 {
        // Plan and carry out, checking after every action.
        for _ in 0..20 {
            let p = env.plan();
            if p.actions.is_empty() {
                break;
            }
            for a in &p.actions {
                env.execute(a, true);
                check(&env);
            }
        }
        // floor(10 / 3) = 3 admitted whenever that many are left.
        let left = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| !j.finished())
            .count();
        assert_eq!(admitted(&env), left.min(3), "round {round}");
        // The oldest admitted Jobs run and finish, in turn.
        let running: Vec<String> = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| j.cluster.is_some() && !j.finished())
            .map(|j| j.key.name.clone())
            .collect();
        for name in running.iter().take(1 + round % 3) {
            env.set_ready(name, 1);
            env.finish(name, true);
            finished += 1;
        }
        env.advance(secs(1));
        if finished >= 1000 {
            break;
        }
    }
    env.settle();
    check(&env);
    assert_eq!(finished, 1000);
    assert!(env
        .world
        .state
        .jobs
        .values()
        .all(|j| j.result == Some(JobResult::Succeeded)));
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

// ---------------------------------------------------------------------------------------------
// 3. Order and blockAdmission.

#[test]
fn higher_priority_goes_first_then_the_older_job() {
    // Quota for one Job at a time. Names and submission order are the reverse of the
    // expected order, so neither decides.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"1\"}")],
    );
    env.submit(job("aaa-low-oldest").priority(0).created(t0()).build());
    env.submit(
        job("mmm-high-newer")
            .priority(10)
            .created(t0() + secs(20))
            .build(),
    );
    env.submit(
        job("zzz-high-older")
            .priority(10)
            .created(t0() + secs(10))
            .build(),
    );
    env.advance(secs(30));

    let mut order = Vec::new();
    for _ in 0..3 {
        let acts = env.settle();
        let d = dispatches(&acts);
        assert_eq!(d.len(), 1, "one at a time: {d:?}");
        order.push(d[0].0.clone());
        env.set_ready(&d[0].0, 1);
        env.finish(&d[0].0, true);
        env.advance(secs(5));
    }
    assert_eq!(
        order,
        ["zzz-high-older", "mmm-high-newer", "aaa-low-oldest"]
    );
}

#[test]
fn block_admission_holds_the_next_job_until_the_first_is_pods_ready() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, blockAdmission: true, timeout: 10m}",
        )],
    );
    env.submit(job("first").pods(2).created(t0()).build());
    env.submit(job("second").created(t0() + secs(1)).build());
    env.advance(secs(2));

    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("first".into(), "a".into())]);
    let p = env.plan();
    assert_eq!(
        p.waiting.values().map(|w| w.reason).collect::<Vec<_>>(),
        [reason::WAITING_FOR_PODS_READY]
    );

    // One of two pods Ready: still blocked.
    env.advance(secs(30));
    env.set_ready("first", 1);
    let acts = env.settle();
    assert!(dispatches(&acts).is_empty(), "{acts:#?}");
    assert_eq!(
        cond(env.job("first"), condition::PODS_READY).map(|c| c.0),
        Some("False".into())
    );
    assert!(env.job("second").suspended);

    // Both Ready: PodsReady turns True and only then is the second admitted.
    env.advance(secs(30));
    env.set_ready("first", 2);
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("second".into(), "a".into())]);
    let (at, _) = env
        .done
        .iter()
        .find(|(_, a)| matches!(a, Action::Dispatch { job, .. } if job.name == "second"))
        .expect("second dispatched");
    let ready_at = condition(env.job("first"), condition::PODS_READY)
        .and_then(|c| c.last_transition_time.clone())
        .map(|t| to_system_time(&t.0))
        .expect("PodsReady has a transition time");
    assert!(is_true(env.job("first"), condition::PODS_READY));
    assert!(ready_at <= *at);
    // The status write that made first PodsReady came before second's dispatch.
    let write = env
        .done
        .iter()
        .position(|(_, a)| matches!(a, Action::WriteStatus { job, status, .. } if job.name == "first" && status.conditions.iter().flatten().any(|c| c.type_ == condition::PODS_READY && c.status == "True")))
        .expect("PodsReady=True written");
    let dispatch = env
        .done
        .iter()
        .position(|(_, a)| matches!(a, Action::Dispatch { job, .. } if job.name == "second"))
        .expect("second dispatched");
    assert!(write < dispatch);
}

// ---------------------------------------------------------------------------------------------
// 4. PodsReady timeout, back-off, deactivation.

#[test]
fn pods_never_ready_requeue_with_exponential_backoff_then_deactivate_at_the_limit() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 60s, backoffMax: 150s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).build());
    let timeout = mins(5);
    // base × 2^(n−1), capped at 150s.
    let backoffs = [secs(60), secs(120), secs(150)];
    let is_requeue: fn(&Action) -> bool = |a| matches!(a, Action::Requeue { .. });
    let is_dispatch: fn(&Action) -> bool = |a| matches!(a, Action::Dispatch { .. });
    let is_deactivate: fn(&Action) -> bool = |a| matches!(a, Action::Deactivate { .. });

    env.settle();
    let mut admitted = env.now;
    let mut dispatched = vec![admitted];
    let mut requeued = Vec::new();
    for (n, backoff) in backoffs.iter().enumerate() {
        let n = n as u32 + 1;
        assert_eq!(env.job("slow").admitted_at, Some(admitted));
        // One pod of two gets Ready; never both.
        env.advance(secs(20));
        env.set_ready("slow", 1);

        // Left alone, the dispatcher wakes itself at the deadline and requeues then, not
        // before.
        let deadline = admitted + timeout;
        env.idle_until(deadline);
        requeued.push(deadline);
        assert_eq!(env.times_of("slow", is_requeue), requeued, "attempt {n}");
        let j = env.job("slow");
        assert!(j.suspended && j.cluster.is_none());
        assert!(env.remote_copy("slow", "a").is_none(), "copy removed");
        assert_eq!(j.requeues, n);
        assert_eq!(annotation(j, REQUEUES_ANNOTATION), Some(n.to_string()));
        let next = deadline + *backoff;
        assert_eq!(j.requeue_after, Some(next), "attempt {n}");
        assert_eq!(annotation(j, REQUEUE_AFTER_ANNOTATION), Some(rfc3339(next)));
        assert_eq!(
            cond(j, condition::REQUEUED),
            Some(("True".into(), reason::PODS_READY_TIMEOUT.into()))
        );
        assert_eq!(
            cond(j, condition::ADMITTED),
            Some(("False".into(), reason::PODS_READY_TIMEOUT.into()))
        );
        assert_eq!(
            cond(j, condition::PODS_READY),
            None,
            "no pods, no PodsReady"
        );
        assert!(
            env.admitted_usage("q").is_empty(),
            "its quota is given back"
        );
        let delete = env
            .done
            .iter()
            .find(|(t, a)| *t == deadline && matches!(a, Action::DeleteCopy { .. }));
        assert!(
            matches!(delete, Some((_, Action::DeleteCopy { reason: r, .. })) if *r == reason::PODS_READY_TIMEOUT),
            "{delete:?}"
        );

        // Admitted again when the back-off ends, not before.
        env.idle_until(next);
        dispatched.push(next);
        assert_eq!(env.times_of("slow", is_dispatch), dispatched, "attempt {n}");
        admitted = next;
    }

    // The fourth timeout is one too many: given up.
    let deadline = admitted + timeout;
    env.idle_until(deadline + Duration::from_secs(24 * 3600));
    assert_eq!(env.times_of("slow", is_requeue), requeued);
    assert_eq!(env.times_of("slow", is_deactivate), [deadline]);
    assert_eq!(
        env.times_of("slow", is_dispatch),
        dispatched,
        "a deactivated Job stays"
    );
    let j = env.job("slow");
    assert!(j.suspended && j.cluster.is_none());
    assert_eq!(j.requeues, 3);
    assert!(j.deactivated.is_some());
    assert!(annotation(j, DEACTIVATED_ANNOTATION).is_some());
    assert_eq!(
        cond(j, condition::DEACTIVATED),
        Some(("True".into(), reason::REQUEUING_LIMIT.into()))
    );
    assert!(env.remote_copy("slow", "a").is_none());
    assert!(env.admitted_usage("q").is_empty());
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn an_offered_job_that_times_out_tries_other_workers_next() {
    // Offered to two of three equal workers; one copy is deleted there, the other never
    // gets Ready. The next attempt goes elsewhere.
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .cluster("c")
        .node("c-0", 16, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue(
            "q",
            "clusters: [a, b, c]\nplacement: {fanout: 2}\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 10s}",
        )],
    );
    env.submit(job("wide").build());
    env.settle();
    let offered = env.job("wide").offers.clone();
    assert_eq!(offered.len(), 2, "{:?}", env.job("wide"));
    let (kept, lost) = (offered[0].clone(), offered[1].clone());
    let uid = env.job("wide").uid.clone();
    env.remote.get_mut(&lost).expect("worker").remove(&uid);
    env.world.remove_copy(&lost, &uid);
    env.settle();
    assert_eq!(
        env.job("wide").offers,
        offered,
        "still offered while one copy lives"
    );

    env.advance(mins(5));
    let acts = env.settle();
    assert_eq!(
        requeues(&acts),
        [("wide".into(), reason::PODS_READY_TIMEOUT)]
    );
    let j = env.job("wide");
    assert_eq!(
        j.avoid.as_deref(),
        Some(kept.as_str()),
        "avoids where it timed out"
    );
    assert_eq!(annotation(j, AVOID_ANNOTATION), Some(kept.clone()));

    env.advance(secs(10));
    env.settle();
    let next = env.job("wide").offers.clone();
    assert_eq!(next.len(), 2);
    assert!(
        !next.contains(&kept),
        "offered to {next:?} after failing in {kept}"
    );
}

#[test]
fn a_job_whose_pods_all_get_ready_in_time_is_not_requeued() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, timeout: 5m}",
        )],
    );
    env.submit(job("quick").pods(3).build());
    env.settle();
    env.advance(mins(4));
    env.set_ready("quick", 3);
    env.settle();
    assert!(is_true(env.job("quick"), condition::PODS_READY));
    env.advance(mins(60));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    assert_eq!(env.job("quick").cluster.as_deref(), Some("a"));
}

#[test]
fn a_running_job_whose_admitted_condition_another_writer_dropped_says_it_again() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("train").pods(2).build());
    env.settle();
    assert!(is_true(env.job("train"), condition::ADMITTED));
    let admitted = condition(env.job("train"), condition::ADMITTED)
        .cloned()
        .unwrap();
    // A second dispatcher mirrored the copy's status from a view older than the unsuspend's
    // status write, and its write won: the conditions list, replaced whole, lost `Admitted`.
    let mut stale = env.job("train").clone();
    stale
        .status
        .conditions
        .iter_mut()
        .for_each(|c| c.retain(|c| c.type_ != condition::ADMITTED));
    env.world.upsert_job(stale);
    env.advance(secs(5));
    env.settle();
    let again = condition(env.job("train"), condition::ADMITTED).cloned();
    assert_eq!(
        again.as_ref().map(|c| c.status.as_str()),
        Some("True"),
        "{:#?}",
        env.job("train").status
    );
    let again = again.unwrap();
    assert!(
        again.message.as_deref().unwrap().contains("worker a"),
        "{again:?}"
    );
    assert_eq!(
        again.last_transition_time, admitted.last_transition_time,
        "admitted when it was dispatched, not when the condition was written again"
    );
    assert_eq!(env.job("train").cluster.as_deref(), Some("a"));
}

// ---------------------------------------------------------------------------------------------
// 5. Lost workers.

fn lost_worker_env() -> Env {
    // limit 0: a PodsReady timeout would deactivate at once; losing the worker must not.
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nworkerLostTimeout: 10m\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {limit: 0}",
        )],
    );
    env.submit(job("run").pods(2).build());
    env.settle();
    env.advance(secs(30));
    env.set_ready("run", 2);
    env.settle();
    assert!(is_true(env.job("run"), condition::PODS_READY));
    env
}

#[test]
fn a_short_disconnect_keeps_the_job_where_it_runs() {
    let mut env = lost_worker_env();
    let copy = env.remote_copy("run", "a").expect("copy").uid.clone();
    env.disconnect("a");
    env.advance(mins(9));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    env.reconnect("a");
    env.advance(mins(5));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    assert!(deletions(&acts).is_empty(), "{acts:#?}");
    assert_eq!(env.job("run").cluster.as_deref(), Some("a"));
    assert_eq!(
        env.remote_copy("run", "a").map(|c| c.uid.clone()),
        Some(copy)
    );
}

#[test]
fn a_worker_lost_too_long_gives_its_job_back_uncounted_and_its_stale_copy_goes_first() {
    let mut env = lost_worker_env();
    let old = env.remote_copy("run", "a").expect("copy").uid.clone();
    let lost_at = env.now;
    env.disconnect("a");
    // Left alone, the dispatcher wakes itself at workerLostTimeout and takes the Job back.
    env.idle_until(lost_at + mins(10));
    let is_requeue: fn(&Action) -> bool = |a| matches!(a, Action::Requeue { .. });
    assert_eq!(env.times_of("run", is_requeue), [lost_at + mins(10)]);
    let acts: Vec<Action> = env
        .done
        .iter()
        .filter(|(t, _)| *t == lost_at + mins(10))
        .map(|(_, a)| a.clone())
        .collect();
    assert_eq!(requeues(&acts), [("run".into(), reason::WORKER_LOST)]);
    // The worker cannot be asked to delete anything now.
    assert!(deletions(&acts).is_empty(), "{acts:#?}");
    let j = env.job("run");
    assert!(j.suspended && j.cluster.is_none());
    assert!(
        j.deactivated.is_none(),
        "not counted against the limit of 0"
    );
    assert_eq!(j.requeues, 0);
    assert_eq!(annotation(j, REQUEUES_ANNOTATION), None);
    assert_eq!(j.requeue_after, None, "no back-off");
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::WORKER_LOST.into()))
    );
    assert!(env.admitted_usage("q").is_empty());

    // The worker comes back with the old copy still running.
    env.advance(mins(2));
    env.reconnect("a");
    let p = env.plan();
    assert_eq!(
        deletions(&p.actions),
        [("run".into(), "a".into(), reason::STALE_COPY)]
    );
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    // The deletion fails once: still nothing new goes there.
    for a in &p.actions {
        let ok = !matches!(a, Action::DeleteCopy { .. });
        env.execute(a, ok);
    }
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    assert_eq!(deletions(&p.actions).len(), 1, "the deletion is retried");
    for a in &p.actions {
        env.execute(a, true);
    }
    // Gone: the Job is dispatched there again, as a new copy.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "a".into())]);
    let new = env.remote_copy("run", "a").expect("new copy").uid.clone();
    assert_ne!(new, old);
}

#[test]
fn jobs_that_waited_for_a_worker_kept_by_a_stale_copy_go_there_once_it_is_removed() {
    let mut env = lost_worker_env();
    env.disconnect("a");
    env.advance(mins(10));
    env.settle();
    // Another Job (another class) arrives while the worker is away.
    env.submit(job("next").each(2, 0).build());
    env.settle();
    env.advance(mins(2));
    env.reconnect("a");
    // The stale copy goes first; its deletion fails once, so a whole pass sees the worker
    // kept and remembers why "next" waits.
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, !matches!(a, Action::DeleteCopy { .. }));
    }
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, true);
    }
    // Gone: nothing else changed, and both Jobs go there.
    let mut went = dispatches(&env.settle());
    went.sort();
    assert_eq!(
        went,
        [("next".into(), "a".into()), ("run".into(), "a".into())]
    );
}

#[test]
fn a_job_lost_with_its_worker_runs_elsewhere_and_the_duplicate_is_removed_on_return() {
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [a, b]\nworkerLostTimeout: 10m")],
    );
    env.submit(job("run").build());
    let first = dispatches(&env.settle())[0].1.clone();
    let other = if first == "a" { "b" } else { "a" };
    env.disconnect(&first);
    env.advance(mins(10));
    let acts = env.settle();
    assert_eq!(requeues(&acts), [("run".into(), reason::WORKER_LOST)]);
    assert_eq!(dispatches(&acts), [("run".into(), other.to_string())]);
    env.reconnect(&first);
    let acts = env.settle();
    assert_eq!(
        deletions(&acts),
        [("run".into(), first.clone(), reason::STALE_COPY)]
    );
    assert!(env.remote_copy("run", &first).is_none());
    assert_eq!(env.where_("run"), other);
    assert_eq!(env.job("run").cluster.as_deref(), Some(other));
}

#[test]
fn a_job_taken_back_does_not_start_elsewhere_while_its_old_copy_still_runs() {
    // The user suspends a running Job; its worker refuses the deletion for a while (its API
    // server errs, the connection stays up). Another worker has room, but the Job must not
    // start there while its first copy still runs.
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .build();
    let mut env = Env::new(inv, vec![queue("q", "clusters: [a, b]")]);
    env.submit(job("run").build());
    let first = dispatches(&env.settle())[0].1.clone();
    env.advance(secs(30));
    env.user_suspends("run");
    env.refusing.insert(first.clone());
    for round in 0..3 {
        env.step();
        env.step();
        assert!(
            env.duplicates.is_empty(),
            "round {round}: {:?}",
            env.duplicates
        );
        assert_eq!(env.where_("run"), first);
        assert!(env.job("run").cluster.is_none());
        env.advance(secs(5));
    }
    // The deletion goes through: the Job runs again.
    env.refusing.clear();
    let acts = env.settle();
    assert_eq!(dispatches(&acts).len(), 1, "{acts:#?}");
    assert!(env.duplicates.is_empty(), "{:?}", env.duplicates);
}

// ---------------------------------------------------------------------------------------------
// 6. The copy's fate in its worker.

#[test]
fn a_copy_deleted_in_its_worker_requeues_the_job_uncounted() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("gone").build());
    env.settle();
    env.advance(secs(10));
    env.delete_in_worker("gone");
    let p = env.step();
    assert_eq!(
        requeues(&p.actions),
        [("gone".into(), reason::REMOTE_DELETED)]
    );
    let j = env.job("gone");
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::REMOTE_DELETED.into()))
    );
    assert_eq!(j.requeues, 0);
    assert_eq!(j.requeue_after, None);
    // It waits in its queue again, and goes back.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("gone".into(), "a".into())]);
}

fn finished_job_is_mirrored_recorded_and_removed(succeeded: bool, new_style: bool) {
    // Quota for one Job: the second waits for the first's.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"2\"}")],
    );
    env.submit(job("done").pods(2).created(t0()).build());
    env.submit(job("next").pods(2).created(t0() + secs(1)).build());
    env.advance(secs(1));
    assert_eq!(dispatches(&env.settle()), [("done".into(), "a".into())]);
    env.advance(secs(10));
    env.set_ready("done", 2);
    env.settle();
    env.advance(mins(3));
    let gang = 2;
    let at = Time(mirror::to_timestamp(env.now));
    env.change_copy("done", "a", |c| {
        finish_copy(c, gang, succeeded, at, new_style)
    });
    let acts = env.settle();

    let expected = if succeeded {
        JobResult::Succeeded
    } else {
        JobResult::Failed
    };
    let j = env.job("done");
    assert_eq!(j.result, Some(expected));
    assert_eq!(
        annotation(j, RESULT_ANNOTATION).as_deref(),
        Some(expected.as_str())
    );
    assert_eq!(terminal(&j.status), Some(expected));
    if succeeded {
        assert_eq!(j.status.succeeded, Some(2));
        assert!(j.status.completion_time.is_some());
        assert!(is_true(j, "SuccessCriteriaMet"));
    } else {
        assert!(j.status.failed.unwrap_or(0) > 0);
        assert!(is_true(j, "FailureTarget"));
    }
    assert_eq!(j.status.active.unwrap_or(0), 0);
    // The result is recorded before the copy is removed.
    let record = acts
        .iter()
        .position(|a| matches!(a, Action::RecordResult { .. }))
        .expect("result recorded");
    let delete = acts
        .iter()
        .position(|a| matches!(a, Action::DeleteCopy { reason: r, .. } if *r == reason::FINISHED))
        .expect("copy removed");
    assert!(record < delete);
    assert!(env.remote_copy("done", "a").is_none());
    // Its quota went to the next Job.
    assert!(!j.holds_quota());
    assert_eq!(dispatches(&acts), [("next".into(), "a".into())]);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_completed_in_its_worker_is_mirrored_recorded_removed_and_frees_its_quota() {
    finished_job_is_mirrored_recorded_and_removed(true, true);
}

#[test]
fn a_job_failed_in_its_worker_is_mirrored_recorded_removed_and_frees_its_quota() {
    finished_job_is_mirrored_recorded_and_removed(false, true);
}

#[test]
fn a_job_finished_by_a_pre_1_31_worker_gets_the_conditions_the_api_server_requires() {
    finished_job_is_mirrored_recorded_and_removed(true, false);
    finished_job_is_mirrored_recorded_and_removed(false, false);
}

// ---------------------------------------------------------------------------------------------
// 7. Suspended by the user.

#[test]
fn a_job_the_user_suspends_is_taken_back_uncounted() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, requeuing: {limit: 0}}",
        )],
    );
    env.submit(job("paused").build());
    env.settle();
    env.advance(secs(30));
    env.set_ready("paused", 1);
    env.settle();
    env.advance(secs(30));
    env.user_suspends("paused");
    let p = env.step();
    assert_eq!(
        requeues(&p.actions),
        [("paused".into(), reason::SUSPENDED_BY_USER)]
    );
    assert_eq!(
        deletions(&p.actions),
        [("paused".into(), "a".into(), reason::SUSPENDED_BY_USER)]
    );
    let j = env.job("paused");
    assert!(env.remote_copy("paused", "a").is_none());
    assert!(j.suspended && j.cluster.is_none());
    assert_eq!(j.requeues, 0);
    assert_eq!(j.requeue_after, None);
    assert!(j.deactivated.is_none());
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::SUSPENDED_BY_USER.into()))
    );
    assert!(!j.holds_quota());
}

// ---------------------------------------------------------------------------------------------
// 8. Random runs.

/// What must hold after every step of a random run.
fn check_invariants(env: &Env, quotas: &BTreeMap<String, BTreeMap<String, i64>>, step: &str) {
    assert!(
        env.refused.is_empty(),
        "{step}: refused status {:?}",
        env.refused
    );
    for (q, quota) in quotas {
        let used = env.admitted_usage(q);
        for (r, limit) in quota {
            let u = used.get(r).copied().unwrap_or(0);
            assert!(u <= *limit, "{step}: queue {q} uses {u} of {limit} {r}");
        }
        let seen = env
            .world
            .ledger
            .queue_use(q)
            .map(|u| u.usage.clone())
            .unwrap_or_default();
        assert_eq!(seen, used, "{step}: queue {q}'s running total");
    }
    // No copy is created while the Job still runs in another reachable worker.
    assert!(env.duplicates.is_empty(), "{step}: {:?}", env.duplicates);
    // Pods of a Job run in one worker at a time. By design there are two exceptions: a Job
    // offered to several workers at once (`placement.fanout` > 1) runs in up to that many
    // until the first to have all its pods Ready keeps it and the others' copies are removed;
    // and a copy in a worker that became unreachable is given up for lost (seed 000) and may
    // run on there until the worker answers again and the copy is removed.
    for j in env.world.state.jobs.values() {
        let running: Vec<&String> = env
            .remote
            .iter()
            .filter(|(c, m)| {
                env.reachable(c)
                    && m.get(&j.uid).is_some_and(|copy| {
                        !copy.deleting
                            && terminal(&copy.status).is_none()
                            && copy.status.active.unwrap_or(0) > 0
                            && !env.lost_copies.contains(&((*c).clone(), copy.uid.clone()))
                    })
            })
            .map(|(c, _)| c)
            .collect();
        let fanout = env
            .world
            .state
            .queues
            .get(&j.queue)
            .and_then(|q| q.settings.as_ref().ok())
            .map_or(1, |s| s.fanout.max(1));
        assert!(
            running.len() <= fanout,
            "{step}: {} runs pods in {running:?} (fanout {fanout}, claimed for {:?}, offered to {:?})",
            j.key,
            j.cluster,
            j.offers
        );
    }
}

/// Once the dispatcher has done all it wanted (nothing failing), no Job runs in two
/// reachable workers, except in those it is offered to.
fn check_settled(env: &Env, step: &str) {
    for (c, copies) in &env.remote {
        if env.reachable(c) {
            for uid in copies.keys() {
                assert!(
                    env.world.state.job_by_uid(uid).is_some(),
                    "{step}: the copy of deleted Job {uid} stays in {c}"
                );
            }
        }
    }
    for j in env.world.state.jobs.values() {
        let places: Vec<&String> = env
            .remote
            .iter()
            .filter(|(c, m)| env.reachable(c) && m.get(&j.uid).is_some_and(|copy| !copy.deleting))
            .map(|(c, _)| c)
            .collect();
        assert!(
            places.iter().all(|c| j.kept_clusters().contains(c)),
            "{step}: {} has copies in {places:?} (claimed for {:?}, offered to {:?})",
            j.key,
            j.cluster,
            j.offers
        );
        if j.finished() || j.deleting {
            assert!(
                places.is_empty(),
                "{step}: {} finished or deleted, its copies stay in {places:?}",
                j.key
            );
            assert!(!j.holds_quota(), "{step}: {} ended, holds quota", j.key);
        } else if let Some(c) = &j.cluster {
            if env.world.state.workers[c].usable() {
                assert_eq!(
                    places,
                    [c],
                    "{step}: {} is claimed for {c} and does not run there",
                    j.key
                );
            }
        }
    }
}

#[test]
fn random_runs_keep_quota_single_placement_and_valid_statuses() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 0..40u64 {
        for (_, a) in random_run(seed, 400, true).done {
            let kind = match a {
                Action::Requeue { reason, .. } => format!("Requeue {reason}"),
                Action::DeleteCopy { reason, .. } => format!("DeleteCopy {reason}"),
                Action::RecordResult { result, .. } => format!("RecordResult {result:?}"),
                Action::Dispatch { .. } => "Dispatch".into(),
                Action::Offer { .. } => "Offer".into(),
                Action::Choose { .. } => "Choose".into(),
                Action::Deactivate { .. } => "Deactivate".into(),
                _ => continue,
            };
            *seen.entry(kind).or_insert(0) += 1;
        }
    }
    // The runs went through every path they are meant to check.
    let reasons = [
        reason::PODS_READY_TIMEOUT,
        reason::PODS_READY_LOST,
        reason::WORKER_LOST,
        reason::REMOTE_DELETED,
        reason::SUSPENDED_BY_USER,
    ];
    let mut expected: Vec<String> = reasons.iter().map(|r| format!("Requeue {r}")).collect();
    expected.extend(
        [
            "Dispatch",
            "Offer",
            "Choose",
            "Deactivate",
            "RecordResult Succeeded",
            "RecordResult Failed",
            "DeleteCopy StaleCopy",
            "DeleteCopy Finished",
            "DeleteCopy OrphanedCopy",
        ]
        .map(String::from),
    );
    for kind in expected {
        assert!(
            seen.get(&kind).is_some_and(|n| *n > 0),
            "no {kind} in {seen:?}"
        );
    }
}

/// The caches only ever save work: random runs, with workers lost and back, writes failing,
/// Jobs requeued, suspended and deleted, decide exactly the same actions, in the same order,
/// whether admission's questions are answered from the caches or afresh.
#[test]
fn the_caches_change_no_decision_in_random_runs() {
    for seed in 0..24u64 {
        let cached = random_run(seed, 300, true).planned;
        let plain = random_run(seed, 300, false).planned;
        if let Some(i) = cached.iter().zip(&plain).position(|(a, b)| a != b) {
            panic!(
                "seed {seed}: decision {i} differs:\n cached: {}\n plain:  {}",
                cached[i], plain[i]
            );
        }
        assert_eq!(cached.len(), plain.len(), "seed {seed}");
    }
}

fn random_run(seed: u64, steps: usize, remember: bool) -> Env {
    let mut rng = Rng::new(seed + 1);
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 4)
        .node("a-1", 16, 0)
        .cluster("b")
        .numa_node("b-0", &[(8, 2), (8, 2)])
        .cluster("c")
        .node("c-0", 8, 0)
        .build();
    let queues = vec![
        queue(
            "q",
            "clusters: [a, b, c]\nquota: {cpu: \"20\", nvidia.com/gpu: \"4\"}\nworkerLostTimeout: 5m\nwaitForPodsReady:\n  enabled: true\n  timeout: 3m\n  recoveryTimeout: 2m\n  requeuing: {backoffBase: 30s, backoffMax: 2m, limit: 3}",
        ),
        queue(
            "wide",
            "clusters: [a, b, c]\nquota: {cpu: \"12\"}\nplacement: {fanout: 2}\nworkerLostTimeout: 3m\nwaitForPodsReady: {enabled: true, blockAdmission: true, timeout: 4m}",
        ),
    ];
    let quotas: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::from([
        (
            "q".to_string(),
            BTreeMap::from([("cpu".into(), 20_000), ("nvidia.com/gpu".into(), 4_000)]),
        ),
        ("wide".to_string(), BTreeMap::from([("cpu".into(), 12_000)])),
    ]);
    let mut env = Env::new(inv, queues);
    env.world.config.remember = remember;
    let clusters = ["a", "b", "c"];
    let mut submitted = 0;
    let mut old_workers: BTreeSet<String> = BTreeSet::new();

    for step in 0..steps {
        let what = rng.below(100);
        let label = format!("seed {seed} step {step}");
        match what {
            0..=19 => {
                let q = if rng.percent(70) { "q" } else { "wide" };
                let gpus = if q == "q" && rng.percent(40) {
                    1 + rng.below(2) as u32
                } else {
                    0
                };
                let j = job(&format!("j{submitted}"))
                    .queue(q)
                    .pods(1 + rng.below(3) as u32)
                    .each(1 + rng.below(4) as u32, gpus)
                    .priority(rng.below(3) as i32)
                    .created(env.now)
                    .build();
                submitted += 1;
                env.submit(j);
            }
            20..=21 => {
                let c = clusters[rng.below(3) as usize].to_string();
                if !env.refusing.remove(&c) {
                    env.refusing.insert(c);
                }
            }
            22..=24 => {
                let c = clusters[rng.below(3) as usize];
                if env.reachable(c) {
                    env.disconnect(c);
                } else {
                    env.reconnect(c);
                }
            }
            25..=44 => {
                // Pods of a copy get Ready (or some stop being Ready).
                let copies: Vec<(String, String)> = env
                    .remote
                    .iter()
                    .flat_map(|(c, m)| m.keys().map(move |u| (c.clone(), u.clone())))
                    .collect();
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    let Some(name) = env.world.state.job_by_uid(&uid).map(|j| j.key.name.clone())
                    else {
                        continue;
                    };
                    let gang = env.job(&name).gang() as i32;
                    let ready = if rng.percent(70) {
                        gang
                    } else {
                        rng.below(gang as u64) as i32
                    };
                    let copy = &env.remote[&c][&uid];
                    if terminal(&copy.status).is_none() {
                        env.change_copy(&name, &c, |copy| copy.status.ready = Some(ready));
                    }
                }
            }
            45..=54 => {
                // A copy finishes.
                let copies: Vec<(String, String)> = env
                    .remote
                    .iter()
                    .flat_map(|(c, m)| m.keys().map(move |u| (c.clone(), u.clone())))
                    .collect();
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    let Some(j) = env.world.state.job_by_uid(&uid) else {
                        continue;
                    };
                    let (name, gang) = (j.key.name.clone(), j.gang() as i32);
                    let at = Time(mirror::to_timestamp(env.now));
                    let ok = rng.percent(75);
                    let new_style = rng.percent(70) || old_workers.contains(&c);
                    if !new_style {
                        old_workers.insert(c.clone());
                    }
                    if terminal(&env.remote[&c][&uid].status).is_none() {
                        env.change_copy(&name, &c, |copy| {
                            finish_copy(copy, gang, ok, at, new_style)
                        });
                    }
                }
            }
            55..=58 => {
                // Someone deletes a copy in its worker.
                let copies: Vec<(String, String)> = env
                    .remote
                    .iter()
                    .flat_map(|(c, m)| m.keys().map(move |u| (c.clone(), u.clone())))
                    .collect();
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    env.remote.get_mut(&c).expect("worker").remove(&uid);
                    if env.reachable(&c) {
                        env.world.remove_copy(&c, &uid);
                    }
                }
            }
            59..=61 => {
                // The user suspends an admitted Job.
                let admitted: Vec<String> = env
                    .world
                    .state
                    .jobs
                    .values()
                    .filter(|j| j.admitted_at.is_some() && !j.suspended)
                    .map(|j| j.key.name.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if let Some(name) = rng.pick(&admitted).cloned() {
                    env.user_suspends(&name);
                }
            }
            62..=63 => {
                // The user deletes a Job: gone at once, or kept while its copies go.
                let names: Vec<String> = env
                    .world
                    .state
                    .jobs
                    .values()
                    .map(|j| j.key.name.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if let Some(name) = rng.pick(&names).cloned() {
                    let key = JobKey::new("team", &name);
                    if rng.percent(50) {
                        env.world.remove_job(&key);
                    } else {
                        let mut j = env.job(&name).clone();
                        j.deleting = true;
                        env.world.upsert_job(j);
                    }
                }
            }
            _ => env.advance(secs(1 + rng.below(90))),
        }
        // A Job being deleted goes once no worker holds a copy of it.
        let gone: Vec<JobKey> = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| j.deleting && env.remote.values().all(|m| !m.contains_key(&j.uid)))
            .map(|j| j.key.clone())
            .collect();
        for key in gone {
            env.world.remove_job(&key);
        }
        check_invariants(&env, &quotas, &label);

        // The dispatcher plans and its actions are carried out; now and then one fails.
        for round in 0..5 {
            let p = env.plan();
            if p.actions.is_empty() {
                break;
            }
            for a in &p.actions {
                let ok = !rng.percent(8);
                env.execute(a, ok);
                check_invariants(&env, &quotas, &format!("{label} round {round} after {a:?}"));
            }
        }
        if step % 10 == 9 {
            // Every worker takes writes for a moment: the dispatcher gets all it asks for.
            let refusing = std::mem::take(&mut env.refusing);
            // Copies whose create failed are created again once their retry is due.
            let until = env.now + env.world.config.create_retry_after;
            env.idle_until(until);
            check_invariants(&env, &quotas, &label);
            check_settled(&env, &label);
            env.refusing = refusing;
        }
    }
    env
}

// ---------------------------------------------------------------------------------------------
// 9. Workers that refuse a Job, per-Job blockers, and the order of a requeue's writes.

fn two_workers() -> Inventory {
    InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 64, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .build()
}

/// The worker refused the copy: what the live executor records when it gives the claim back.
fn refuse(env: &mut Env, name: &str, cluster: &str) {
    let j = env.job(name).clone();
    let n = j.refusals.get(cluster).map_or(1, |r| r.count + 1);
    let retry_at = env.now + env.world.config.refusal_backoff(n);
    let a = Action::Unclaim {
        job: j.key.clone(),
        cluster: cluster.into(),
        reason: reason::WORKER_REFUSED,
        message: "admission webhook \"x\" denied the request: no".into(),
        retry_at,
    };
    env.execute(&a, true);
}

#[test]
fn refusals_back_off_exponentially_per_worker() {
    let c = DispatchConfig::default();
    let waits: Vec<u64> = (1..=8).map(|n| c.refusal_backoff(n).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(c.refusal_backoff(u32::MAX), c.refusal_backoff_max);
}

#[test]
fn a_worker_that_refused_a_job_is_left_alone_for_its_backoff_while_others_take_it() {
    let mut env = Env::new(two_workers(), vec![queue("q", "clusters: [a, b]")]);
    env.submit(job("run").build());
    // `a` is the emptier worker: the first choice. It refuses the copy.
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("run".into(), "a".into())]);
    refuse(&mut env, "run", "a");
    let j = env.job("run");
    assert_eq!(j.refusals["a"].count, 1);
    assert_eq!(j.requeues, 0, "a refusal is not the Job's fault");
    assert!(annotation(j, REFUSED_ANNOTATION).is_some_and(|v| v.contains("denied the request")));
    // Tried elsewhere at once.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "b".into())]);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_refused_by_its_only_worker_waits_out_the_backoff_then_tries_again() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("run").build());
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("run".into(), "a".into())]);
    let mut attempts = vec![env.now];
    let mut backoffs = Vec::new();
    for n in 1..=3 {
        refuse(&mut env, "run", "a");
        let retry_at = env.job("run").refusals["a"].retry_at;
        backoffs.push(retry_at.duration_since(env.now).unwrap().as_secs());
        // Nothing is dispatched before the back-off ends; the Job says why, and when.
        let p = env.plan();
        assert!(
            dispatches(&p.actions).is_empty(),
            "refusal {n}: {:?}",
            p.actions
        );
        let WaitReason {
            reason: why,
            message,
        } = &p.job_waiting[&JobKey::new("team", "run")];
        assert_eq!(*why, reason::WORKER_REFUSED);
        assert!(
            message.contains("denied the request") && message.contains(&rfc3339(retry_at)),
            "{message}"
        );
        assert_eq!(p.wake_at, Some(retry_at), "woken when the back-off ends");
        env.advance_to(retry_at);
        let p = env.plan();
        assert_eq!(
            dispatches(&p.actions),
            [("run".into(), "a".into())],
            "refusal {n}"
        );
        attempts.push(env.now);
    }
    assert_eq!(backoffs, [5, 10, 20]);
    assert_eq!(env.job("run").requeues, 0);
    // It takes the copy this time: the refusals there are forgotten.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "a".into())]);
    assert!(env.job("run").refusals.is_empty());
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_kept_from_a_worker_for_its_own_reason_does_not_hold_back_its_class() {
    // An earlier Job named `first` is still being removed from the only worker: `first` must
    // wait, but `second` (same queue, namespace and template: the same class) must not.
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    let old = WorkerCopy {
        cluster: "a".into(),
        key: JobKey::new("team", "first"),
        uid: "old-copy".into(),
        origin_uid: "uid-of-an-earlier-first".into(),
        status: JobStatus::default(),
        deleting: true,
    };
    env.remote
        .get_mut("a")
        .unwrap()
        .insert(old.origin_uid.clone(), old.clone());
    env.world.upsert_copy(old);
    env.submit(job("first").created(t0()).build());
    env.submit(job("second").created(t0() + secs(1)).build());
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("second".into(), "a".into())]);
    let message = &p.job_waiting[&JobKey::new("team", "first")].message;
    assert!(message.contains("still being removed"), "{message}");
    // And again once nothing changed (nothing remembered for the class from `first`).
    env.submit(job("third").created(t0() + secs(2)).build());
    let p = env.plan();
    let d = dispatches(&p.actions);
    assert!(d.contains(&("third".into(), "a".into())), "{d:?}");
    assert!(!d.iter().any(|(n, _)| n == "first"));
}

#[test]
fn a_pods_ready_timeout_writes_the_requeue_before_removing_the_copy() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 1m\n  requeuing: {backoffBase: 30s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).build());
    env.settle();
    env.advance(mins(2));
    // The decision: the requeue, and no removal yet.
    let p = env.plan();
    assert_eq!(
        requeues(&p.actions),
        [("slow".into(), reason::PODS_READY_TIMEOUT)]
    );
    assert!(deletions(&p.actions).is_empty(), "{:#?}", p.actions);
    // The requeue write fails (a 500, a 409): nothing was removed, and the next plan decides
    // the same, counted once.
    for a in &p.actions {
        env.execute(a, !matches!(a, Action::Requeue { .. }));
    }
    assert!(env.remote_copy("slow", "a").is_some());
    let p = env.plan();
    let counted: Vec<u32> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Requeue { requeues, .. } => Some(*requeues),
            _ => None,
        })
        .collect();
    assert_eq!(counted, [1], "{:#?}", p.actions);
    assert!(!requeues(&p.actions)
        .iter()
        .any(|(_, r)| *r == reason::REMOTE_DELETED));
    for a in &p.actions {
        env.execute(a, true);
    }
    // Landed: the count and back-off are on the Job. The process dies before the copy is
    // removed; the next one removes it and keeps the count.
    let j = env.job("slow");
    assert_eq!((j.requeues, j.requeue_after), (1, Some(env.now + secs(30))));
    assert!(env.remote_copy("slow", "a").is_some());
    env.restart();
    let p = env.plan();
    assert_eq!(
        deletions(&p.actions),
        [("slow".into(), "a".into(), reason::PODS_READY_TIMEOUT)]
    );
    assert!(requeues(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, true);
    }
    assert!(env.remote_copy("slow", "a").is_none());
    assert_eq!(env.job("slow").requeues, 1);
    // Back after its back-off, once.
    env.advance(secs(30));
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("slow".into(), "a".into())]);
    assert_eq!(env.job("slow").requeues, 1);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

/// The copy's Job controller decided the Job fails (FailureTarget) and has not finished it.
fn failing(copy: &mut WorkerCopy, at: Time) {
    copy.status.conditions = Some(vec![JobCondition {
        type_: "FailureTarget".into(),
        status: "True".into(),
        reason: Some("PodFailurePolicy".into()),
        message: Some("Container main for pod team/x failed with exit code 42".into()),
        last_probe_time: Some(at.clone()),
        last_transition_time: Some(at),
    }]);
    copy.status.failed = Some(1);
}

#[test]
fn a_job_whose_worker_decided_it_fails_ends_failed_when_its_copy_goes() {
    for lost in [false, true] {
        let mut env = Env::new(
            roomy(),
            vec![queue("q", "clusters: [a]\nworkerLostTimeout: 5m")],
        );
        env.submit(job("doomed").build());
        env.settle();
        env.advance(secs(10));
        let at = Time(mirror::to_timestamp(env.now));
        env.change_copy("doomed", "a", |c| failing(c, at));
        env.settle();
        assert!(is_true(env.job("doomed"), "FailureTarget"), "mirrored");
        if lost {
            env.disconnect("a");
            env.advance(mins(6));
        } else {
            env.delete_in_worker("doomed");
        }
        let acts = env.settle();
        assert!(
            env.refused.is_empty(),
            "lost {lost}: every write passes the API server: {:?}",
            env.refused
        );
        assert!(requeues(&acts).is_empty(), "lost {lost}: {acts:#?}");
        let j = env.job("doomed");
        assert_eq!(j.result, Some(JobResult::Failed), "lost {lost}");
        assert!(
            is_true(j, "Failed") && is_true(j, "FailureTarget"),
            "lost {lost}"
        );
        assert!(j.status.start_time.is_some());
        assert!(!j.holds_quota());
        if lost {
            // The worker comes back: its copy goes.
            env.reconnect("a");
            env.settle();
            assert!(env.remote_copy("doomed", "a").is_none());
        }
    }
}

#[test]
fn the_api_servers_rules_on_target_conditions_are_modelled() {
    let at = Time(mirror::to_timestamp(t0()));
    let c = |t: &str| JobCondition {
        type_: t.into(),
        status: "True".into(),
        reason: None,
        message: None,
        last_probe_time: None,
        last_transition_time: Some(at.clone()),
    };
    let with = |types: &[&str]| JobStatus {
        start_time: Some(at.clone()),
        conditions: Some(types.iter().map(|t| c(t)).collect()),
        ..Default::default()
    };
    let v = |old: &JobStatus, new: &JobStatus| mirror::violation(old, new, true);
    assert!(v(&with(&["FailureTarget"]), &with(&[]))
        .is_some_and(|m| m.contains("cannot disable the terminal FailureTarget=True")));
    assert!(v(&with(&["SuccessCriteriaMet"]), &with(&[]))
        .is_some_and(|m| m.contains("cannot disable the SuccessCriteriaMet=True")));
    assert!(v(&with(&[]), &with(&["SuccessCriteriaMet", "FailureTarget"])).is_some());
    let mut complete = with(&["SuccessCriteriaMet", "Complete", "FailureTarget"]);
    complete.completion_time = Some(at.clone());
    assert!(v(&with(&["FailureTarget"]), &complete)
        .is_some_and(|m| m.contains("Complete=True and FailureTarget")));
    // The requeue of a Job with a target condition keeps it: the write stays valid.
    let old = with(&["FailureTarget"]);
    let requeued = status::requeued(&old, reason::WORKER_LOST, "m", t0());
    assert_eq!(v(&old, &requeued), None);
    // Unsetting completionTime is not "mutating" it (the API server allows it).
    let mut set = with(&[]);
    set.completion_time = Some(at.clone());
    assert!(v(&set, &with(&[])).is_none());
}

#[test]
fn a_short_disconnect_keeps_the_workers_share_of_the_automatic_quota() {
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 8, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [a, b]\nworkerLostTimeout: 10m")],
    );
    let settings = env.world.state.queues["q"].settings.clone().unwrap();
    let cpu = |env: &Env| effective_quota(&env.world.state, &settings, env.now)["cpu"];
    assert_eq!(cpu(&env), 24_000);
    env.disconnect("a");
    env.advance(mins(9));
    assert_eq!(cpu(&env), 24_000, "a short disconnect changes nothing");
    // A Job only `a` can hold waits for it: not "never fits".
    env.submit(job("wide").each(12, 0).created(env.now).build());
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty());
    let why = &p.waiting.values().next().expect("it waits").reason;
    assert_eq!(*why, reason::NO_WORKER_FITS);
    // Lost: its share goes.
    env.advance(mins(1));
    assert_eq!(cpu(&env), 8_000);
    env.reconnect("a");
    assert_eq!(cpu(&env), 24_000);
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("wide".into(), "a".into())]);
}

#[test]
fn workers_judged_across_the_cores_get_the_same_placements_as_one_by_one() {
    // Four workers of 3,000 nodes each: enough nodes for a Job's first look at them to be
    // spread over the cores. Without memory the same workers are judged one after another.
    let mut b = InventoryBuilder::default();
    for (c, cpus) in [("a", 4), ("b", 16), ("c", 8), ("d", 32)] {
        b = b.cluster(c).node(&format!("{c}-0"), cpus, 0);
    }
    let mut inv = b.build();
    for c in &mut inv.clusters {
        let c = Arc::make_mut(c);
        let proto = (*c.nodes[0]).clone();
        let name = c.name.clone();
        c.nodes = (0..3000)
            .map(|i| {
                let mut n = proto.clone();
                n.name = format!("{name}-{i}").into();
                Arc::new(n)
            })
            .collect();
    }
    let inv = inv.finish();
    let placements = |remember: bool| {
        let mut env = Env::new(
            inv.clone(),
            vec![queue("q", "clusters: [a, b, c, d]\nplacement: {fanout: 1}")],
        );
        env.world.config.remember = remember;
        // 12 CPUs a pod: only b and d; 24 CPUs a pod: only d; 2 CPUs: anywhere.
        env.submit(job("wide").pods(8).each(12, 0).created(t0()).build());
        env.submit(
            job("big")
                .pods(3)
                .each(24, 0)
                .created(t0() + secs(1))
                .build(),
        );
        env.submit(
            job("small")
                .pods(5)
                .each(2, 0)
                .created(t0() + secs(2))
                .build(),
        );
        env.submit(
            job("huge")
                .pods(1)
                .each(64, 0)
                .created(t0() + secs(3))
                .build(),
        );
        let p = env.plan();
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Dispatch { job, cluster, hold } => {
                    Some((job.name.clone(), cluster.clone(), hold.takes.len()))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let parallel = placements(true);
    assert_eq!(parallel, placements(false));
    let workers: Vec<(&str, &str)> = parallel
        .iter()
        .map(|(j, c, _)| (j.as_str(), c.as_str()))
        .collect();
    assert_eq!(workers.len(), 3, "huge fits nowhere: {parallel:?}");
    assert!(matches!(workers[0], ("wide", "b" | "d")), "{parallel:?}");
    assert_eq!(workers[1], ("big", "d"));
    assert_eq!(workers[2].0, "small");
}

// ---------------------------------------------------------------------------------------------
// Starvation, both ways.

#[test]
fn small_jobs_pass_a_big_one_until_it_starves_then_its_worker_is_kept_for_it() {
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .build();
    // Quota to spare: only the worker's room and the reservation decide.
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"100\"}")],
    );
    // Shorter than the holds' timeout: this inventory never shows the running Jobs' pods.
    env.world.config.starvation_after = mins(2);
    env.submit(job("run").each(12, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    env.submit(job("big").each(16, 0).created(env.now).build());
    env.advance(secs(1));
    env.submit(job("small").each(2, 0).created(env.now).build());
    // The big Job fits nowhere now; it does not hold back the small one behind it.
    assert_eq!(dispatches(&env.settle()), [("small".into(), "a".into())]);

    // Once the big Job has waited `starvation_after`, nothing behind it starts in the worker
    // it waits for, though there is room for it.
    env.advance(mins(3));
    env.submit(job("late").each(2, 0).created(env.now).build());
    let acts = env.settle();
    assert!(dispatches(&acts).is_empty(), "{acts:#?}");
    let p = env.plan();
    let late = p
        .waiting
        .iter()
        .find(|(class, _)| *class == &env.job("late").class())
        .map(|(_, w)| w.message.clone())
        .expect("the late Job's class waits");
    assert!(
        late.contains("kept for team/big, which has waited longest"),
        "{late}"
    );

    // The worker drains: the big Job gets it, the late one waits for room again.
    env.finish("run", true);
    env.finish("small", true);
    let mut went = Vec::new();
    for _ in 0..10 {
        let p = env.step();
        went.extend(dispatches(&p.actions));
        if !went.is_empty() {
            break;
        }
    }
    assert_eq!(went, [("big".into(), "a".into())]);
    // The pass that dispatched the starving Job ended without its reservation, and the late
    // Job failed under that: nothing changed since, so the next pass does not judge it again.
    let key = env.world.caches.memo_key("q", false);
    let memo = env.world.caches.verdict(&env.job("late").class());
    assert_eq!(
        memo.filter(|m| m.key == key).map(|m| m.reason),
        Some(reason::NO_WORKER_FITS),
        "the late Job's failure still stands"
    );
    let acts = env.settle();
    assert!(dispatches(&acts).is_empty(), "{acts:#?}");
    assert!(env.job("late").suspended);
}
