//! `switchyard simulate`: the dispatcher (the same [`plan`], not a copy) against in-memory
//! worker clusters, in virtual time.
//!
//! The manager side is a [`World`] updated the way the live executor updates it after each
//! successful API call (the outcome every executor reports to `dispatcher::apply`); each
//! worker is a [`SimWorker`]: a kube-scheduler that places pods NUMA-unaware (or, for a worker
//! with a `schedulerName`, NUMA-aware, as its second scheduler with Switchyard's extender
//! would), kubelets whose Topology Manager rejects what it cannot align, and a Job controller.
//! Pods become Ready after `podStartDelay`, run `duration`, then succeed or fail. The
//! dispatcher sees the workers' inventories and copies immediately, as if its watches had no
//! lag.
//!
//! Strategies, for comparison on the same trace:
//! - `switchyard`: the engine's exact, NUMA-aware fit of the whole gang picks one worker;
//! - `sum-aggregate`: a worker is chosen by the sum of its free resources, as a virtual node
//!   per cluster would (the alternative of one virtual node summing each cluster);
//! - `all-at-once`: a copy goes to every worker of the queue; the first whose pods are all
//!   Ready keeps the Job and the others are removed (MultiKueue's way, for workers without Kueue).

pub mod kueue;
pub mod report;
pub mod scenario;
pub mod synthetic;
pub mod worker;

pub(crate) use report::StatusWrite;
pub use report::{Report, Summary};
pub(crate) use scenario::{Scenario, ScenarioJob};
pub(crate) use worker::{Behaviour, PodEvent, SimWorker};

use crate::dispatcher::kind::Status;
use crate::dispatcher::{
    self, apply, plan, Action, Job, JobKey, Outcome, Placement, Queue, Worker, World,
};
use crate::placement::EngineConfig;
use foldhash::{HashMap, HashMapExt as _};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How workers are chosen (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    #[default]
    Switchyard,
    AllAtOnce,
    SumAggregate,
}

impl Strategy {
    /// Every strategy, in the order `--strategy all` reports them.
    pub const ALL: [Strategy; 3] = [
        Strategy::Switchyard,
        Strategy::AllAtOnce,
        Strategy::SumAggregate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Switchyard => "switchyard",
            Strategy::AllAtOnce => "all-at-once",
            Strategy::SumAggregate => "sum-aggregate",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "switchyard" => Ok(Self::Switchyard),
            "all-at-once" => Ok(Self::AllAtOnce),
            "sum-aggregate" => Ok(Self::SumAggregate),
            other => Err(format!(
                "unknown strategy {other:?} (switchyard, all-at-once, sum-aggregate)"
            )),
        }
    }
}

/// Virtual time zero. Any fixed instant works; this one keeps RFC 3339 times in messages
/// readable (2026-01-01T00:00:00Z).
pub const EPOCH_SECS: u64 = 1_767_225_600;

fn epoch() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS)
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Submit(usize),
    Pod(usize, PodEventOrd),
    /// A workload of a worker's own users enters its Kueue, or ends.
    Kueue(usize, worker::KueueEvent),
    /// The dispatcher plans: at a deadline it asked for, or on the tick after a change.
    Wake,
}

/// The dispatcher plans at most once per tick of virtual time after changes, as the live one
/// batches the events of a moment before planning.
const TICK: Duration = Duration::from_secs(1);

/// [`PodEvent`] with an order, for the event queue.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodEventOrd(PodEvent);

impl PartialOrd for PodEventOrd {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PodEventOrd {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        // Ties are broken by the sequence number before this is ever compared.
        std::cmp::Ordering::Equal
    }
}

/// What the report needs of one Job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Record {
    pub(crate) first_admitted: Option<SystemTime>,
    pub(crate) admitted: Option<SystemTime>,
    pub(crate) started: Option<SystemTime>,
    pub(crate) finished: Option<SystemTime>,
    pub(crate) cluster: Option<String>,
    pub(crate) topology_errors: u64,
    /// How long the pods that succeeded ran, summed by pod shape, in the copy that completed.
    pub(crate) ran: Option<worker::Ran>,
}

struct Usage {
    used: Vec<i64>,
    integral: Vec<f64>,
    since: SystemTime,
    /// What was in use over time, when asked for (see [`Simulation::with_usage_history`]).
    history: Option<UsageHistory>,
}

/// A worker's scenario pods' requests over time: at each time its use changed (seconds since
/// the start, at most one entry per time), what was in use from then on, per resource.
#[derive(Debug, Clone, Default)]
pub(crate) struct UsageHistory {
    pub(crate) at: Vec<f64>,
    /// `at.len()` rows of `width` amounts (thousandths, by resource id), one after the other.
    pub(crate) used: Vec<i64>,
    /// The resources known when the history began: those of the scenario's inventory.
    pub(crate) width: usize,
}

impl UsageHistory {
    fn new(width: usize) -> Self {
        Self {
            width,
            ..Default::default()
        }
    }

    fn record(&mut self, at: f64, used: &[i64]) {
        if self.at.last() == Some(&at) {
            // Several changes at one time: only the last state is ever seen.
            let start = self.used.len() - used.len();
            self.used[start..].copy_from_slice(used);
        } else {
            self.at.push(at);
            self.used.extend_from_slice(used);
        }
    }
}

/// One run of a scenario under a strategy.
pub struct Simulation {
    world: World,
    workers: Vec<SimWorker>,
    by_name: HashMap<String, usize>,
    jobs: Vec<ScenarioJob>,
    by_key: HashMap<JobKey, usize>,
    /// The namespaces of the scenario's Jobs: each has a LocalQueue in a Kueue worker.
    namespaces: Vec<String>,
    events: BinaryHeap<Reverse<(SystemTime, u64, Event)>>,
    seq: u64,
    wake_at: Option<SystemTime>,
    /// Clusters whose nodes changed since their summaries were computed, with the nodes.
    changed: BTreeMap<usize, Vec<usize>>,
    /// Per inventory cluster, its nodes' free amounts, made on its first change: a summary
    /// is brought up to date by re-reading only the nodes that changed.
    free_rows: Vec<Option<crate::inventory::FreeRows>>,
    /// The tick already scheduled to plan after changes.
    ticks_at: Option<SystemTime>,
    next_copy: u64,
    pub(crate) records: Vec<Record>,
    /// Why each class of pending Jobs waited last.
    pub(crate) waiting: BTreeMap<dispatcher::ClassKey, String>,
    /// Why a pending Job kept from some worker for a reason of its own (a Kueue worker's
    /// quota) waited last: it is judged apart from its class.
    pub(crate) job_waiting: BTreeMap<JobKey, String>,
    pub(crate) remote_writes: u64,
    pub(crate) topology_errors: u64,
    /// Per worker (by index), its kubelets' TopologyAffinityErrors.
    pub(crate) topology_errors_by_worker: Vec<u64>,
    pub(crate) status_refusals: u64,
    usage: Vec<Usage>,
    pub(crate) max_quota: BTreeMap<String, BTreeMap<String, f64>>,
    strategy: Strategy,
    now: SystemTime,
    /// Every decision, as it is carried out, when asked for (`--events`).
    pub(crate) log: Option<Vec<String>>,
    /// Every status written to a manager Job, when asked for.
    pub(crate) status_writes: Option<Vec<StatusWrite>>,
}

/// The longest a simulation runs in virtual time past its last submission.
const HORIZON: Duration = Duration::from_secs(365 * 24 * 3600);

impl Simulation {
    pub fn new(scenario: &Scenario, strategy: Strategy) -> Self {
        let config = dispatcher::DispatchConfig {
            engine: EngineConfig::default(),
            placement: match strategy {
                Strategy::Switchyard => Placement::Exact,
                Strategy::SumAggregate => Placement::SumOfFree,
                Strategy::AllAtOnce => Placement::Everywhere,
            },
            // Why Jobs wait is only reported at the end.
            describe: false,
            ..Default::default()
        };
        let mut world = World::new(config);
        world.state.inventory = Arc::new(scenario.inventory.clone());
        world.state.jobs_synced = true;
        let mut workers = Vec::new();
        let mut by_name = HashMap::new();
        let mut usage = Vec::new();
        let namespaces = scenario.namespaces();
        let mut local_workloads = Vec::new();
        for (i, c) in scenario.inventory.clusters.iter().enumerate() {
            let numa_aware = scenario.scheduler_names.get(i).is_some_and(Option::is_some);
            let kueue = scenario.kueue.get(i).cloned().flatten();
            let worker = SimWorker::new(&c.name, i, numa_aware, kueue);
            world.upsert_worker(dispatcher_view(&worker, &namespaces));
            if let Some(k) = &worker.kueue {
                for (n, w) in k.spec.local_workloads.iter().enumerate() {
                    local_workloads.push((workers.len(), n, w.submit_at));
                }
            }
            workers.push(worker);
            by_name.insert(c.name.clone(), i);
            usage.push(Usage {
                used: vec![0; scenario.inventory.resources.len()],
                integral: vec![0.0; scenario.inventory.resources.len()],
                since: epoch(),
                history: None,
            });
        }
        for (name, settings) in &scenario.queues {
            world.upsert_queue(Queue {
                name: name.clone(),
                settings: Ok(settings.clone()),
            });
        }
        let mut sim = Self {
            world,
            workers,
            by_name,
            jobs: scenario.jobs.clone(),
            by_key: HashMap::new(),
            namespaces,
            events: BinaryHeap::new(),
            seq: 0,
            wake_at: None,
            ticks_at: None,
            changed: Default::default(),
            free_rows: Vec::new(),
            next_copy: 0,
            records: vec![Record::default(); scenario.jobs.len()],
            waiting: BTreeMap::new(),
            job_waiting: BTreeMap::new(),
            remote_writes: 0,
            topology_errors: 0,
            topology_errors_by_worker: vec![0; scenario.inventory.clusters.len()],
            status_refusals: 0,
            usage,
            max_quota: BTreeMap::new(),
            strategy,
            now: epoch(),
            log: None,
            status_writes: None,
        };
        for (i, j) in scenario.jobs.iter().enumerate() {
            sim.by_key.insert(j.key(), i);
            sim.push(epoch() + j.submit_at, Event::Submit(i));
        }
        for (w, n, at) in local_workloads {
            sim.push(epoch() + at, Event::Kueue(w, worker::KueueEvent::Submit(n)));
        }
        sim
    }

    fn push(&mut self, at: SystemTime, ev: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    /// Runs to the end: every Job finished, or nothing left that could change anything.
    pub fn run(mut self) -> Report {
        let last_submit = self
            .jobs
            .iter()
            .map(|j| j.submit_at)
            .max()
            .unwrap_or_default();
        let horizon = epoch() + last_submit + HORIZON;
        while let Some(Reverse((t, _, _))) = self.events.peek() {
            let t = *t;
            if t > horizon {
                break;
            }
            self.advance(t);
            let mut plan_now = false;
            while let Some(Reverse((at, _, _))) = self.events.peek() {
                if *at != t {
                    break;
                }
                let Some(Reverse((_, _, ev))) = self.events.pop() else {
                    break;
                };
                plan_now |= ev == Event::Wake;
                self.on_event(ev);
            }
            if plan_now {
                self.dispatch();
            } else {
                // Plan on the next whole tick (or now, on one).
                let tick = TICK.as_secs_f64();
                let at = epoch() + Duration::from_secs_f64((secs(t) / tick).ceil() * tick);
                if self.ticks_at != Some(at) {
                    self.ticks_at = Some(at);
                    self.push(at, Event::Wake);
                }
            }
        }
        // One more look, with descriptions, for the Jobs still waiting.
        self.world.config.describe = true;
        self.world.touch_all();
        let last = plan(&mut self.world, self.now);
        for (class, why) in last.waiting {
            self.waiting.insert(class, why.message);
        }
        for (key, why) in last.job_waiting {
            self.job_waiting.insert(key, why.message);
        }
        report::build(&self)
    }

    fn advance(&mut self, t: SystemTime) {
        for u in &mut self.usage {
            let dt = t.duration_since(u.since).unwrap_or_default().as_secs_f64();
            for (i, v) in u.used.iter().enumerate() {
                u.integral[i] += *v as f64 * dt;
            }
            u.since = t;
        }
        self.now = t;
    }

    fn on_event(&mut self, ev: Event) {
        let now = self.now;
        match ev {
            Event::Submit(i) => {
                let j = &self.jobs[i];
                let job = Job {
                    key: j.key(),
                    uid: format!("job-{i}"),
                    resource_version: String::new(),
                    queue: j.queue.clone(),
                    priority: j.priority,
                    created: now,
                    parts: j.parts.clone(),
                    pod: Ok(j.pod.clone()),
                    extra: j.extra.clone(),
                    main_jobs: j.main_jobs.clone(),
                    shape_key: j.shape_key,
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
                    status: Status::empty(j.kind),
                };
                self.world.upsert_job(job);
            }
            Event::Pod(w, PodEventOrd(pe)) => {
                let mut fx = worker::Effects::default();
                if matches!(pe, PodEvent::Ready { .. }) {
                    if let Some(worker) = self.workers.get_mut(w) {
                        worker.on_ready(&pe, now, &mut fx);
                    }
                } else {
                    self.with_cluster(w, |worker, cluster, table| {
                        worker.on_event(cluster, table, &pe, now, &mut fx)
                    });
                }
                self.effects(w, fx);
            }
            Event::Kueue(w, ev) => {
                let mut fx = worker::Effects::default();
                self.with_cluster(w, |worker, cluster, table| {
                    worker.on_kueue_event(cluster, table, &ev, now, &mut fx)
                });
                self.effects(w, fx);
            }
            Event::Wake => {}
        }
    }

    /// Runs `f` on worker `w` with its inventory cluster, mutably (copied only if a
    /// snapshot still shares it).
    fn with_cluster<R>(
        &mut self,
        w: usize,
        f: impl FnOnce(
            &mut SimWorker,
            &mut crate::inventory::Cluster,
            &crate::inventory::ResourceTable,
        ) -> R,
    ) -> R {
        let inv = Arc::make_mut(&mut self.world.state.inventory);
        let index = self.workers[w].index;
        let table = &inv.resources;
        let cluster = Arc::make_mut(&mut inv.clusters[index]);
        f(&mut self.workers[w], cluster, table)
    }

    fn effects(&mut self, w: usize, fx: worker::Effects) {
        for (at, ev) in fx.events {
            self.push(at, Event::Pod(w, PodEventOrd(ev)));
        }
        for (at, ev) in fx.kueue_events {
            self.push(at, Event::Kueue(w, ev));
        }
        if fx.kueue_changed {
            // The dispatcher reads what the worker's Kueue reserves, as the live one reads
            // its ClusterQueue's status.
            let mut view = dispatcher_view(&self.workers[w], &self.namespaces);
            if let Some(old) = self.world.state.workers.get(&view.name) {
                view = Worker {
                    queues: view.queues,
                    ..old.clone()
                };
            }
            self.world.upsert_worker(view);
        }
        self.topology_errors += fx.topology_errors;
        if let Some(n) = self.topology_errors_by_worker.get_mut(w) {
            *n += fx.topology_errors;
        }
        for (origin, ran) in &fx.completed {
            if let Some(r) = self
                .index_of_uid(origin)
                .and_then(|i| self.records.get_mut(i))
            {
                r.ran = Some(ran.clone());
            }
        }
        if !(fx.freed.is_empty() && fx.taken.is_empty()) {
            // The summaries to bring up to date, and the dispatcher's log of touched nodes.
            let touched = self.changed.entry(self.workers[w].index).or_default();
            touched.extend(fx.freed.iter().chain(&fx.taken));
            let name = &self.workers[w].name;
            for n in &fx.freed {
                self.world.node_gained_room(name, *n);
            }
            for n in &fx.taken {
                self.world.node_lost_room(name, *n);
            }
        }
        let u = &mut self.usage[w];
        for (i, d) in fx.usage_delta.iter().enumerate() {
            if let Some(v) = u.used.get_mut(i) {
                *v += d;
            }
        }
        if let Some(h) = &mut u.history {
            if fx.usage_delta.iter().any(|d| *d != 0) {
                h.record(secs(self.now), &u.used);
            }
        }
        // A JobSet's child Jobs change its copy.
        let mut changed: Vec<String> = fx
            .changed
            .iter()
            .map(|uid| worker::copy_uid(uid).to_string())
            .collect();
        changed.sort();
        changed.dedup();
        for uid in changed {
            let copy = self.workers[w].copy(&uid);
            if let Some(copy) = copy {
                let origin = copy.origin_uid.clone();
                if let Some(i) = self.index_of_uid(&origin) {
                    if copy.status.terminal().is_none() {
                        let j = &self.jobs[i];
                        if copy.status.ready_pods(&j.parts) >= j.pods()
                            && self.records[i].started.is_none()
                        {
                            self.records[i].started = Some(self.now);
                        }
                    }
                }
                self.world.upsert_copy(copy);
            }
        }
    }

    fn index_of_uid(&self, uid: &str) -> Option<usize> {
        uid.strip_prefix("job-").and_then(|n| n.parse().ok())
    }

    /// Plans and carries out actions until the dispatcher has nothing more to do now.
    fn dispatch(&mut self) {
        let now = self.now;
        for _ in 0..1000 {
            // Before every plan: carrying out the last one may have changed nodes.
            self.summarize();
            // Why classes wait is only described by the last look (`run`).
            let p = plan(&mut self.world, now);
            if let Some(w) = p.wake_at.filter(|w| *w > now) {
                if self.wake_at.is_none_or(|x| x <= now || w < x) {
                    self.wake_at = Some(w);
                    self.push(w, Event::Wake);
                }
            }
            // A plan that asks to be woken now (it let room go) is followed at once.
            if p.actions.is_empty() && p.wake_at.is_none_or(|w| w > now) {
                break;
            }
            // A queue's use only grows when it admits a Job, and its quota (its workers'
            // allocatable) stays as it is here: the simulated workers neither disconnect nor
            // change size. So its peak use can only be reached after an admission.
            let admitted = p
                .actions
                .iter()
                .any(|a| matches!(a, Action::Dispatch { .. } | Action::Offer { .. }));
            for a in p.actions {
                self.execute(a);
            }
            if admitted {
                self.track_quota();
            }
        }
    }

    /// Decides everything afresh at every pass, reusing nothing from earlier ones: slower,
    /// the same decisions (a test holds the two to that).
    pub fn without_memory(mut self) -> Self {
        self.world.config.remember = false;
        self
    }

    /// Keeps a line per decision carried out (see [`Report::events`]).
    pub fn with_events(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// Keeps what each worker's scenario pods request over time (see [`Report::capacity`]),
    /// for `--report`. Only watches: no decision depends on it.
    pub fn with_usage_history(mut self) -> Self {
        for u in &mut self.usage {
            let mut h = UsageHistory::new(u.used.len());
            // Nothing is in use at the start.
            h.record(0.0, &u.used);
            u.history = Some(h);
        }
        self
    }

    /// Keeps every status written to a manager Job, in order (see [`Report::status_writes`]):
    /// what `kubectl get job -w` would show on the manager.
    pub fn with_status_writes(mut self) -> Self {
        self.status_writes = Some(Vec::new());
        self
    }

    /// Brings the summaries of the clusters whose nodes changed up to date, once per plan.
    fn summarize(&mut self) {
        if self.changed.is_empty() {
            return;
        }
        let inv = Arc::make_mut(&mut self.world.state.inventory);
        let n = inv.resources.len();
        self.free_rows.resize(inv.clusters.len(), None);
        for (i, mut nodes) in std::mem::take(&mut self.changed) {
            let (Some(c), Some(rows)) = (inv.clusters.get_mut(i), self.free_rows.get_mut(i)) else {
                continue;
            };
            let c = Arc::make_mut(c);
            // The simulated workers only bind and release pods: what a summary holds besides
            // the free maxima stays as the inventory's first summary made it.
            match rows {
                None => *rows = Some(crate::inventory::FreeRows::new(c, n)),
                Some(rows) => {
                    nodes.sort_unstable();
                    nodes.dedup();
                    for node in nodes {
                        rows.update(c, node);
                    }
                }
            }
            if let Some(rows) = rows {
                rows.apply(Arc::make_mut(&mut c.summary));
            }
            #[cfg(debug_assertions)]
            {
                let mut full = c.clone();
                full.summarize(n);
                debug_assert_eq!(
                    full.summary, c.summary,
                    "a simulated worker changed a node it did not report in its effects"
                );
            }
        }
    }

    fn execute(&mut self, action: Action) {
        let now = self.now;
        if let Some(log) = &mut self.log {
            if !matches!(
                action,
                Action::WriteStatus { .. } | Action::Hold(_) | Action::Release { .. }
            ) {
                log.push(format!("{:>9.1}s  {}", secs(now), action.describe()));
            }
        }
        apply(&mut self.world, &action, Outcome::Started, now);
        let outcome = match &action {
            Action::Dispatch { job, cluster, .. } => {
                self.admitted(job, Some(cluster));
                self.create_copy(job, cluster);
                Outcome::Done
            }
            Action::Offer { job, clusters } => {
                self.admitted(job, None);
                for c in clusters {
                    self.create_copy(job, c);
                }
                Outcome::Done
            }
            Action::CreateCopy { job, cluster } => {
                self.create_copy(job, cluster);
                Outcome::Done
            }
            Action::DeleteCopy { cluster, uid, .. } => {
                self.remote_writes += 1;
                if let Some(&w) = self.by_name.get(cluster) {
                    let mut fx = worker::Effects::default();
                    self.with_cluster(w, |worker, c, table| {
                        worker.delete(c, table, uid, now, &mut fx)
                    });
                    self.effects(w, fx);
                }
                Outcome::Done
            }
            Action::WriteStatus { job, status, .. } => self.write_status(job, status),
            Action::RecordResult { job, .. } => {
                if let Some(i) = self.by_key.get(job).copied() {
                    self.records[i].finished = Some(now);
                }
                Outcome::Done
            }
            Action::Choose { job, cluster } => {
                if let Some(i) = self.by_key.get(job).copied() {
                    self.records[i].cluster = Some(cluster.clone());
                }
                Outcome::Done
            }
            _ => Outcome::Done,
        };
        apply(&mut self.world, &action, outcome, now);
    }

    /// The Job is admitted now (to `cluster`, or offered to several).
    fn admitted(&mut self, job: &JobKey, cluster: Option<&String>) {
        if let Some(i) = self.by_key.get(job).copied() {
            let r = &mut self.records[i];
            r.first_admitted.get_or_insert(self.now);
            r.admitted = Some(self.now);
            r.started = None;
            if let Some(c) = cluster {
                r.cluster = Some(c.clone());
            }
        }
    }

    /// A status written to a manager Job, unless the API server would refuse it: then so
    /// does the simulation.
    fn write_status(&mut self, job: &JobKey, status: &Status) -> Outcome {
        let now = self.now;
        if let Some(j) = self.world.state.jobs.get(job) {
            if let Some(why) = Status::violation(&j.status, status, j.suspended) {
                tracing::warn!(job = %job, %why, "status refused");
                if let Some(log) = &mut self.log {
                    log.push(format!(
                        "{:>9.1}s  {job}: the API server would refuse its status: {why}",
                        secs(now)
                    ));
                }
                self.status_refusals += 1;
                return Outcome::StatusRefused;
            }
        }
        if let Some(writes) = &mut self.status_writes {
            writes.push(StatusWrite {
                at: secs(now),
                job: job.to_string(),
                status: status.to_value(),
            });
        }
        Outcome::Done
    }

    fn create_copy(&mut self, key: &JobKey, cluster: &str) {
        let (Some(&i), Some(&w)) = (self.by_key.get(key), self.by_name.get(cluster)) else {
            return;
        };
        self.remote_writes += 1;
        self.next_copy += 1;
        let uid = format!("copy-{}", self.next_copy);
        let j = &self.jobs[i];
        let origin = format!("job-{i}");
        let keep_off: Arc<[Arc<str>]> = self.world.ledger.keep_off(&origin, cluster).into();
        // The copy's pods prefer the nodes of the Job's placement (see `remote::copy_of`).
        let prefer: Arc<[Arc<str>]> = self.world.ledger.placed_on(&origin, cluster).into();
        // The copy's pod templates name the queue's placement strategy (see `remote::copy_of`).
        let queue_strategy = (self.world.state.settings(&j.queue))
            .map_or(crate::placement::EngineConfig::default().strategy, |s| {
                s.strategy
            });
        let behaviour =
            |shape: &Arc<crate::placement::PodShape>, parallelism, completions| Behaviour {
                shape: shape.clone(),
                keep_off: keep_off.clone(),
                prefer: prefer.clone(),
                strategy: shape.strategy(queue_strategy),
                parallelism,
                completions,
                duration: j.duration,
                start_delay: j.pod_start_delay,
                fails: j.fails,
            };
        let now = self.now;
        let mut fx = worker::Effects::default();
        let before = self.topology_errors;
        let queued = match (&self.workers[w].kueue, self.world.state.jobs.get(key)) {
            (Some(_), Some(job)) => worker::Queued {
                request: job.total_request(),
                priority: j.priority,
            },
            _ => worker::Queued::default(),
        };
        if j.is_jobset() {
            let parts: Vec<worker::ReplicatedBehaviour> = j
                .replicated_jobs
                .iter()
                .map(|r| worker::ReplicatedBehaviour {
                    name: r.name.clone(),
                    replicas: r.replicas,
                    behaviour: behaviour(&r.pod, r.parallelism, r.completions),
                })
                .collect();
            self.with_cluster(w, |worker, c, table| {
                worker.create_set(
                    c,
                    table,
                    key.clone(),
                    uid,
                    origin,
                    parts,
                    queued,
                    now,
                    &mut fx,
                )
            });
        } else {
            let behaviour = behaviour(&j.pod, j.parallelism, j.completions);
            self.with_cluster(w, |worker, c, table| {
                worker.create(
                    c,
                    table,
                    key.clone(),
                    uid,
                    origin,
                    behaviour,
                    queued,
                    now,
                    &mut fx,
                )
            });
        }
        self.effects(w, fx);
        self.records[i].topology_errors += self.topology_errors - before;
    }

    fn track_quota(&mut self) {
        for (name, q) in &self.world.state.queues {
            let Ok(settings) = &q.settings else { continue };
            let quota = dispatcher::effective_quota(&self.world.state, settings, self.now);
            let Some(u) = self.world.ledger.queue_use(name) else {
                continue;
            };
            // Names are copied into the maps only the first time (this runs at every step).
            let entry = match self.max_quota.get_mut(name) {
                Some(e) => e,
                None => self.max_quota.entry(name.clone()).or_default(),
            };
            for (r, limit) in &quota {
                if *limit <= 0 {
                    continue;
                }
                let used = u.usage.get(r).copied().unwrap_or(0);
                let frac = used as f64 / *limit as f64;
                match entry.get_mut(r) {
                    Some(slot) => *slot = slot.max(frac),
                    None => {
                        entry.insert(r.clone(), frac.max(0.0));
                    }
                }
            }
        }
    }

    pub(crate) fn world(&self) -> &World {
        &self.world
    }
    pub(crate) fn scenario_jobs(&self) -> &[ScenarioJob] {
        &self.jobs
    }
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }
    /// Each worker's name with its kubelets' TopologyAffinityErrors.
    pub(crate) fn topology_errors_by_worker(&self) -> impl Iterator<Item = (&str, u64)> {
        self.workers
            .iter()
            .zip(&self.topology_errors_by_worker)
            .map(|(w, n)| (w.name.as_str(), *n))
    }
    /// Each worker's name with its usage history, when kept.
    pub(crate) fn usage_histories(&self) -> impl Iterator<Item = (&str, &UsageHistory)> {
        self.workers
            .iter()
            .zip(&self.usage)
            .filter_map(|(w, u)| Some((w.name.as_str(), u.history.as_ref()?)))
    }
    pub(crate) fn usage_integrals(&self) -> impl Iterator<Item = (&str, &[f64])> {
        self.workers
            .iter()
            .zip(&self.usage)
            .map(|(w, u)| (w.name.as_str(), u.integral.as_slice()))
    }
}

/// What the dispatcher sees of a simulated worker: always reachable, its copies known, and,
/// in a Kueue worker, its LocalQueues and ClusterQueue as they are now.
fn dispatcher_view(worker: &SimWorker, namespaces: &[String]) -> Worker {
    let mut view = Worker::named(&worker.name);
    if let Some(k) = &worker.kueue {
        view.kueue = Some(k.spec.local_queue.clone());
        view.queues = Arc::new(k.view(namespaces));
    }
    view
}

/// Seconds of virtual time since the scenario start.
pub(crate) fn secs(t: SystemTime) -> f64 {
    t.duration_since(epoch()).unwrap_or_default().as_secs_f64()
}

/// Runs a scenario under a strategy.
pub fn run(scenario: &Scenario, strategy: Strategy) -> Report {
    Simulation::new(scenario, strategy).run()
}
