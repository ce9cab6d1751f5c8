//! Fault schedules: the live dispatcher (two replicas, the real `kube::Client`, real HTTP to
//! fake API servers on loopback: a manager and three workers) driven through randomized
//! schedules. Each schedule mixes Job arrivals, their pods starting and finishing, workers cut
//! off and back, the leader stepping down (the standby leads a lease gap later, or at once for
//! about half of the hand-overs, as after a release on SIGTERM) and the leader
//! killed (a new replica leads at once) right after its Nth write, 409,
//! 429 and 500 answers, writes that land but whose answer is lost (a 500, or an answer past
//! the write timeout), writes that land only after the write timeout, and watches ended and
//! answered 410 Gone. After every step:
//! - no Job has two running copies (the queue has no fanout; a copy in a worker that was cut
//!   off and whose Job was given up for lost is exempt, as documented, until it is removed);
//! - the queue's quota is not exceeded, counted both by the copies that run and by the Jobs
//!   the manager shows claimed;
//! - no Job is lost, and a result the manager records comes from a copy that ended so;
//! - no status write to the manager broke the API server's Job status rules (the fake API
//!   refuses them as kube-apiserver does, tests/common/job_rules.rs), and the dispatcher
//!   reported none as refused.
//!
//! At the end every fault is healed and every copy allowed to finish: each Job must end with
//! its result, with no copy left anywhere, and meanwhile say why it waits.
//!
//!     cargo test --test fault_schedules -- --nocapture               # CI: 12 schedules
//!     SWITCHYARD_FAULTS_SCHEDULES=10000 cargo test --release --test fault_schedules -- --nocapture
//!
//! `SWITCHYARD_FAULTS_STEPS` (30), `SWITCHYARD_FAULTS_PARALLEL` (schedules at once: 4) and
//! `SWITCHYARD_FAULTS_FIRST_SEED` (0) set the rest. Schedule `s` depends only on its seed. A
//! failing schedule prints its seed, the history of the Jobs it failed on (every request about
//! them, which replica sent it, the answer) and is shrunk to the fewest steps that still fail
//! (each candidate run `SWITCHYARD_FAULTS_SHRINK_RUNS` (16) times at once: a race may need
//! the load to show). `SWITCHYARD_FAULTS_SEED=S` (with `SWITCHYARD_FAULTS_KEEP=i,j,...`, the
//! indices of the steps kept) replays it; `SWITCHYARD_FAULTS_REPEAT=n` runs each seed n
//! times.

mod common;

use common::dispatch::{inventory_yaml, job, namespace, queue, WorkerSpec, NS};
use common::fake_api::{
    FakeApi, Loss, Refusal, Tripwire, DISPATCH_QUEUES, EVENTS, JOBS, NAMESPACES, PRIORITY_CLASSES,
};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use switchyard::dispatcher::live::{self, Inputs, LiveOptions};
use switchyard::dispatcher::DispatchConfig;
use switchyard::inventory::InventoryStore;
use switchyard::leader::WritesInFlight;
use switchyard::rng::Rng;
use switchyard::workers::registry::{WorkerView, Workers, WorkersPublisher};
use tokio::sync::watch;

const CLAIM: &str = "switchyard.dev/cluster";
const RESULT: &str = "switchyard.dev/result";
const ORIGIN_UID: &str = "switchyard.dev/origin-uid";
/// What one check looks at: status rules kept (writes, and none refused by the dispatcher
/// itself), requests within RBAC, no Job lost, results from copies that ended so, one running
/// copy per Job, quota by running copies, quota by claims.
const INVARIANTS: u64 = 7;
/// The queue's CPU quota.
const QUOTA: u32 = 10;
const WORKERS: [WorkerSpec; 3] = [
    WorkerSpec {
        name: "w0",
        nodes: 2,
        cpu: 8,
    },
    WorkerSpec {
        name: "w1",
        nodes: 1,
        cpu: 8,
    },
    WorkerSpec {
        name: "w2",
        nodes: 2,
        cpu: 4,
    },
];
/// The longest one Job's writes may take (the dispatcher's `write_timeout`).
const WRITE_TIMEOUT: Duration = Duration::from_millis(400);
/// Slow answers come this long after the request: past the write timeout.
const SLOW: Duration = Duration::from_millis(600);
/// How long a step waits for the dispatcher to settle before the next one.
const STEP_SETTLE: Duration = Duration::from_millis(1500);
/// How long the healed fleet has to finish every Job, and each waiting Job to say why: a
/// watch that failed a few times in a row is retried only after kube-runtime's back-off
/// (0.8 s doubling up to 30 s, reset after 120 s without error), and sees no new Job till then.
const HEAL_WITHIN: Duration = Duration::from_secs(45);
const REASON_WITHIN: Duration = Duration::from_secs(35);
/// The lease passes from a leader that stepped down to the standby this long after: the real
/// lease's `leaseDuration` − `renewDeadline` (5 s by default), scaled down but longer than any
/// write of the old leader takes to land here (`SLOW`). Some hand-overs pass at once instead
/// ([`instant_handover`]); `SWITCHYARD_FAULTS_INSTANT_HANDOVER=1` passes every one at once.
const HANDOVER_GAP: Duration = Duration::from_millis(1000);

/// Whether the hand-over of step `i` passes the lease at once, as to a successor when the
/// leader gives the Lease up on SIGTERM: those of odd steps, so about half of them; the new
/// leader's first list must then show every claim of the old one. By the step's index, so
/// that a shrunk schedule keeps each hand-over as it was.
fn instant_handover(i: usize) -> bool {
    i % 2 == 1
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Schedules.

/// Which API server a fault is set on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Server {
    Manager,
    Worker(usize),
}

/// One step of a schedule. Steps name Jobs by the order they were submitted in, so a step
/// whose Job was never submitted (shrinking removed it) does nothing.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// A Job of `pods` pods of `cpu` CPUs each arrives in the queue.
    Submit {
        job: usize,
        pods: u32,
        cpu: u32,
    },
    /// The pods of the Job's copy in its claimed worker run, all Ready.
    Start {
        job: usize,
    },
    /// The Job's copy in its claimed worker ends, succeeded or failed.
    Finish {
        job: usize,
        ok: bool,
    },
    /// The worker cannot be reached (its copies run on).
    CutOff {
        worker: usize,
    },
    Reconnect {
        worker: usize,
    },
    /// The leader loses the lease right after its next `writes` writes of Jobs (it steps
    /// down); the standby leads once the lease is its to take ([`HANDOVER_GAP`]), or at once
    /// ([`instant_handover`]).
    HandOver {
        writes: u32,
    },
    /// The leader dies right after its next `writes` writes of Jobs (it sends nothing more);
    /// a new replica starts and leads.
    Crash {
        writes: u32,
    },
    /// The next `times` such requests are refused with `code`.
    Refuse {
        server: Server,
        method: &'static str,
        code: u16,
        times: u32,
    },
    /// The next `times` such writes land but their answers are lost: a 500, or an answer
    /// past the write timeout (`hang`).
    LoseAnswers {
        server: Server,
        method: &'static str,
        times: u32,
        hang: bool,
    },
    /// The next `times` such writes land only past the write timeout.
    Slow {
        server: Server,
        method: &'static str,
        times: u32,
    },
    /// The server's open watches end; the next Job watches are answered 410 Gone.
    Expire {
        server: Server,
        times: u32,
    },
}

fn server(rng: &mut Rng) -> Server {
    match rng.below(4) {
        0 => Server::Manager,
        w => Server::Worker(w as usize - 1),
    }
}

/// The writes a fault may hit on this server: the manager's Jobs are patched (claims,
/// spec, status) and read, the workers' copies created, read and deleted.
fn method(rng: &mut Rng, server: Server) -> &'static str {
    let methods: &[&'static str] = match server {
        Server::Manager => &["PATCH", "PATCH", "PATCH", "GET"],
        Server::Worker(_) => &["POST", "POST", "DELETE", "GET"],
    };
    methods[rng.below(methods.len() as u64) as usize]
}

/// The schedule of `seed`, `len` steps long.
fn schedule(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut steps = Vec::with_capacity(len);
    let mut submitted = 0usize;
    let mut cut = [false; WORKERS.len()];
    while steps.len() < len {
        let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1) as u64) as usize;
        let roll = if submitted == 0 { 0 } else { rng.below(100) };
        let step = match roll {
            0..=17 => {
                let pods = 1 + rng.below(3) as u32;
                let cpu = 1 + rng.below(if pods == 1 { 4 } else { 3 }) as u32;
                submitted += 1;
                Step::Submit {
                    job: submitted - 1,
                    pods,
                    cpu,
                }
            }
            18..=29 => Step::Start {
                job: pick(&mut rng, submitted),
            },
            30..=45 => Step::Finish {
                job: pick(&mut rng, submitted),
                ok: rng.percent(80),
            },
            46..=50 => {
                let worker = pick(&mut rng, WORKERS.len());
                if cut[worker] {
                    continue;
                }
                cut[worker] = true;
                Step::CutOff { worker }
            }
            51..=56 => {
                let Some(worker) = (0..WORKERS.len()).find(|w| cut[*w]) else {
                    continue;
                };
                cut[worker] = false;
                Step::Reconnect { worker }
            }
            57..=61 => Step::HandOver {
                writes: 1 + rng.below(6) as u32,
            },
            62..=69 => Step::Crash {
                writes: 1 + rng.below(6) as u32,
            },
            70..=79 => {
                let server = server(&mut rng);
                let method = method(&mut rng, server);
                // 409 answers a write computed from an old resourceVersion (the manager's
                // patches). A create gets it only when the copy exists and a delete (whose
                // precondition is the copy's uid) only when the copy is gone: the fake
                // answers those itself.
                let codes: &[u16] = if method == "PATCH" {
                    &[409, 429, 500]
                } else {
                    &[429, 500]
                };
                Step::Refuse {
                    server,
                    method,
                    code: codes[pick(&mut rng, codes.len())],
                    times: 1 + rng.below(3) as u32,
                }
            }
            80..=87 => {
                let server = server(&mut rng);
                let method = match server {
                    Server::Manager => "PATCH",
                    Server::Worker(_) => ["POST", "DELETE"][pick(&mut rng, 2)],
                };
                Step::LoseAnswers {
                    server,
                    method,
                    times: 1 + rng.below(2) as u32,
                    hang: rng.percent(50),
                }
            }
            88..=93 => {
                let server = server(&mut rng);
                let method = method(&mut rng, server);
                Step::Slow {
                    server,
                    method,
                    times: 1 + rng.below(2) as u32,
                }
            }
            _ => Step::Expire {
                server: server(&mut rng),
                times: 1 + rng.below(2) as u32,
            },
        };
        steps.push(step);
    }
    steps
}

// ---------------------------------------------------------------------------------------------
// The rig: the fleet, the replicas, and what the invariants need to remember.

/// One dispatcher replica, stopped when dropped.
struct Replica {
    name: String,
    stop: watch::Sender<bool>,
    leader: watch::Sender<bool>,
    settled: watch::Receiver<u64>,
    publisher: WorkersPublisher,
    /// Its own clients of the workers: they name it, for the tripwires.
    clients: Vec<kube::Client>,
    crash: Arc<Tripwire>,
    hand_over: Arc<Tripwire>,
    /// Its writes not answered yet: an instant hand-over waits for them, as `serve` does
    /// before it gives the Lease up (`leader::WritesInFlight`).
    writes: WritesInFlight,
}

impl Drop for Replica {
    /// Stops it; not aborted, so that it ends its watches itself (an aborted task would
    /// leave them running).
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Rig {
    manager: FakeApi,
    workers: Vec<FakeApi>,
    store: Arc<InventoryStore>,
    /// When each worker was cut off (`None`: reachable).
    cut_since: Vec<Option<SystemTime>>,
    replicas: Vec<Replica>,
    /// Which replica leads (or will, once the lease passes to it).
    leader: usize,
    /// When the lease passes to `leader`, after a hand-over.
    lease_passes_at: Option<Instant>,
    /// How long after the leader stepped down the lease passes, for the hand-over armed
    /// last: [`HANDOVER_GAP`], or nothing for one that passes at once.
    handover_gap: Duration,
    /// Every hand-over passes at once (`SWITCHYARD_FAULTS_INSTANT_HANDOVER=1`).
    instant_handovers: bool,
    started: usize,
    /// The Jobs submitted: (pods, cpu each).
    jobs: Vec<(u32, u32)>,
    /// Copies (by uid) in a worker while it was cut off: given up for lost.
    lost: HashSet<String>,
    /// Jobs whose copy we ended, succeeded or failed.
    ended_ok: BTreeSet<usize>,
    ended_failed: BTreeSet<usize>,
    /// Invariant checks passed, crashes and hand-overs that happened.
    checks: u64,
    crashes: u64,
    hand_overs: u64,
    /// Hand-overs that passed the lease at once.
    instant: u64,
    /// When the rig started, and what the schedule did when: for the history of a failure.
    t0: Instant,
    log: Vec<(Instant, String)>,
}

impl Drop for Rig {
    /// Thousands of schedules run in one process: each leaves nothing running.
    fn drop(&mut self) {
        self.replicas.clear();
        for api in std::iter::once(&self.manager).chain(&self.workers) {
            api.shut_down();
        }
    }
}

fn options() -> LiveOptions {
    LiveOptions {
        config: DispatchConfig {
            create_retry_after: Duration::from_millis(300),
            wait_rewrite_after: Duration::from_millis(500),
            ..Default::default()
        },
        debounce: Duration::from_millis(10),
        tick: Duration::from_millis(50),
        queue_status_every: Duration::from_millis(200),
        instance: "faults".into(),
        write_timeout: WRITE_TIMEOUT,
        ..Default::default()
    }
}

fn job_name(i: usize) -> String {
    format!("j{i}")
}

fn is_true(obj: &Value, type_: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

fn terminal(obj: &Value) -> bool {
    is_true(obj, "Complete") || is_true(obj, "Failed")
}

fn annotation<'a>(obj: &'a Value, name: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][name].as_str()
}

fn now() -> String {
    switchyard::dispatcher::rfc3339(SystemTime::now())
}

impl Rig {
    async fn start() -> Rig {
        switchyard::install_crypto_provider();
        let manager = FakeApi::start().await;
        manager.check_rbac(switchyard::rbac::Role::Manager);
        manager.enforce_job_status_rules();
        manager.upsert(NAMESPACES, namespace(NS));
        manager.upsert(
            PRIORITY_CLASSES,
            json!({"metadata": {"name": "high"}, "value": 1000, "globalDefault": false}),
        );
        let names: Vec<&str> = WORKERS.iter().map(|w| w.name).collect();
        manager.upsert(
            DISPATCH_QUEUES,
            queue(
                "research",
                &names,
                json!({"quota": {"cpu": QUOTA.to_string()}, "workerLostTimeout": "1s"}),
            ),
        );
        let inventory = switchyard::inventory::parse_yaml(&inventory_yaml(&WORKERS)).unwrap();
        let mut workers = Vec::new();
        for _ in &WORKERS {
            let api = FakeApi::start().await;
            api.check_rbac(switchyard::rbac::Role::WorkerSide);
            api.upsert(NAMESPACES, namespace(NS));
            workers.push(api);
        }
        let mut rig = Rig {
            manager,
            workers,
            store: Arc::new(InventoryStore::new(inventory)),
            cut_since: vec![None; WORKERS.len()],
            replicas: Vec::new(),
            leader: 0,
            lease_passes_at: None,
            handover_gap: HANDOVER_GAP,
            instant_handovers: std::env::var_os("SWITCHYARD_FAULTS_INSTANT_HANDOVER").is_some(),
            started: 0,
            jobs: Vec::new(),
            lost: HashSet::new(),
            ended_ok: BTreeSet::new(),
            ended_failed: BTreeSet::new(),
            checks: 0,
            crashes: 0,
            hand_overs: 0,
            instant: 0,
            t0: Instant::now(),
            log: Vec::new(),
        };
        let leader = rig.replica(true);
        let standby = rig.replica(false);
        rig.replicas = vec![leader, standby];
        rig
    }

    /// Starts a replica with clients of its own.
    fn replica(&mut self, leading: bool) -> Replica {
        self.started += 1;
        let name = format!("replica-{}", self.started);
        let crash = Tripwire::new(&name, true);
        let hand_over = Tripwire::new(&name, false);
        for api in std::iter::once(&self.manager).chain(&self.workers) {
            api.set_tripwire(crash.clone());
            api.set_tripwire(hand_over.clone());
        }
        let clients = self.workers.iter().map(|w| w.client_as(&name)).collect();
        let (publisher, _) = Workers::channel();
        let (stop, stop_rx) = watch::channel(false);
        let (leader, leader_rx) = watch::channel(leading);
        let mut replica = Replica {
            name,
            stop,
            leader,
            settled: watch::channel(0).1,
            publisher,
            clients,
            crash,
            hand_over,
            writes: WritesInFlight::default(),
        };
        self.publish_to(&replica);
        let handle = live::start(
            Inputs {
                client: self.manager.client_as(&replica.name),
                workers: replica.publisher.subscribe(),
                leader: leader_rx,
                inventory: self.store.clone(),
                metrics: None,
                writes: replica.writes.clone(),
            },
            options(),
            stop_rx,
        );
        // The task ends by itself once stopped (see `Drop`).
        drop(handle.task);
        replica.settled = handle.settled;
        replica
    }

    fn publish_to(&self, replica: &Replica) {
        let mut views = BTreeMap::new();
        for (i, spec) in WORKERS.iter().enumerate() {
            let mut view = WorkerView::new(spec.name);
            view.client = Some(replica.clients[i].clone());
            view.client_generation = 1;
            match self.cut_since[i] {
                None => {
                    view.connected = true;
                    view.active = true;
                    view.reason = "Connected";
                    view.message = "connected".into();
                }
                Some(since) => {
                    view.reason = "ClientConnectionFailed";
                    view.message = "dial tcp: connection refused".into();
                    view.disconnected_since = Some(since);
                }
            }
            views.insert(spec.name.to_string(), view);
        }
        replica.publisher.publish(views);
        replica.publisher.set_synced();
    }

    fn publish(&self) {
        for r in &self.replicas {
            self.publish_to(r);
        }
    }

    fn api(&self, server: Server) -> &FakeApi {
        match server {
            Server::Manager => &self.manager,
            Server::Worker(w) => &self.workers[w],
        }
    }

    /// Acts on tripwires that fired: a crashed replica is replaced by a new one in its role
    /// (a leader's writes in flight may trip it after it handed over); a lease lost goes to
    /// the standby.
    fn after_trips(&mut self) {
        for r in 0..self.replicas.len() {
            if self.replicas[r].crash.fired() {
                self.crashes += 1;
                let leads = r == self.leader && self.lease_passes_at.is_none();
                let fresh = self.replica(leads);
                self.log.push((
                    Instant::now(),
                    format!("{} crashed; {} started", self.replicas[r].name, fresh.name),
                ));
                // The old one goes (dropped: stopped); it was fenced off since its last write.
                self.replicas[r] = fresh;
            }
        }
        if self.replicas[self.leader].hand_over.fired() {
            self.hand_overs += 1;
            self.instant += u64::from(self.handover_gap.is_zero());
            let old = self.leader;
            let new = 1 - old;
            let _ = self.replicas[old].leader.send(false);
            // A later hand-over of this replica is armed afresh.
            let name = self.replicas[old].name.clone();
            let again = Tripwire::new(&name, false);
            for api in std::iter::once(&self.manager).chain(&self.workers) {
                api.set_tripwire(again.clone());
            }
            self.replicas[old].hand_over = again;
            self.leader = new;
            self.lease_passes_at = Some(Instant::now() + self.handover_gap);
            self.log.push((
                Instant::now(),
                format!("{} lost the lease", self.replicas[old].name),
            ));
        }
        // An instant hand-over is a Lease given up on SIGTERM: once the old leader's writes
        // are answered, as `leader::run` does; writes unanswered for longer leave the Lease
        // to expire (`HANDOVER_GAP`).
        let waiting_for_writes =
            self.handover_gap.is_zero() && self.replicas[1 - self.leader].writes.count() > 0;
        if self.lease_passes_at.is_some_and(|at| {
            let now = Instant::now();
            now >= at && (!waiting_for_writes || now >= at + HANDOVER_GAP)
        }) {
            self.lease_passes_at = None;
            let _ = self.replicas[self.leader].leader.send(true);
            self.log.push((
                Instant::now(),
                format!("{} leads", self.replicas[self.leader].name),
            ));
        }
    }

    /// Waits until the leader settled twice (every input taken, nothing in flight, nothing
    /// new decided), acting on tripwires meanwhile; false if it did not within `within`.
    async fn settle(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut base: Option<(String, u64)> = None;
        loop {
            self.after_trips();
            let leader = &self.replicas[self.leader];
            let count = *leader.settled.borrow();
            match &base {
                Some((name, from)) if *name == leader.name => {
                    if count >= from + 2 {
                        return true;
                    }
                }
                _ => base = Some((leader.name.clone(), count)),
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn manager_job(&self, i: usize) -> Option<Value> {
        self.manager.get(JOBS, NS, &job_name(i))
    }

    /// The copy of Job `i` in the worker its manager Job is claimed for.
    fn claimed_copy(&self, i: usize) -> Option<(usize, Value)> {
        let j = self.manager_job(i)?;
        let claim = annotation(&j, CLAIM)?;
        let w = WORKERS.iter().position(|s| s.name == claim)?;
        let copy = self.workers[w].get(JOBS, NS, &job_name(i))?;
        (copy["metadata"]["labels"][ORIGIN_UID] == j["metadata"]["uid"]).then_some((w, copy))
    }

    fn set_copy_status(&self, w: usize, mut copy: Value, status: Value) {
        copy["status"] = status;
        self.workers[w].upsert(JOBS, copy);
    }

    fn start_copy(&self, i: usize) {
        let Some((w, copy)) = self.claimed_copy(i) else {
            return;
        };
        if terminal(&copy) {
            return;
        }
        let pods = self.jobs[i].0;
        let start = copy["status"]["startTime"]
            .as_str()
            .map_or_else(now, str::to_string);
        self.set_copy_status(
            w,
            copy,
            json!({"active": pods, "ready": pods, "startTime": start,
                   "uncountedTerminatedPods": {}}),
        );
    }

    fn finish_copy(&mut self, i: usize, ok: bool) {
        let Some((w, copy)) = self.claimed_copy(i) else {
            return;
        };
        if terminal(&copy) {
            return;
        }
        let pods = self.jobs[i].0;
        let start = copy["status"]["startTime"]
            .as_str()
            .map_or_else(now, str::to_string);
        let end = now();
        let cond = |type_: &str, reason: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": "m",
                   "lastProbeTime": end, "lastTransitionTime": end})
        };
        let status = if ok {
            self.ended_ok.insert(i);
            json!({"succeeded": pods, "active": 0, "ready": 0, "startTime": start,
                   "completionTime": end, "uncountedTerminatedPods": {},
                   "conditions": [cond("SuccessCriteriaMet", "CompletionsReached"),
                                  cond("Complete", "CompletionsReached")]})
        } else {
            self.ended_failed.insert(i);
            json!({"failed": 1, "active": 0, "ready": 0, "startTime": start,
                   "uncountedTerminatedPods": {},
                   "conditions": [cond("FailureTarget", "BackoffLimitExceeded"),
                                  cond("Failed", "BackoffLimitExceeded")]})
        };
        self.set_copy_status(w, copy, status);
    }

    /// Copies in the worker now are given up for lost (it is cut off, or back from it).
    fn mark_lost(&mut self, w: usize) {
        for c in self.workers[w].list(JOBS) {
            if let Some(uid) = c["metadata"]["uid"].as_str() {
                self.lost.insert(uid.to_string());
            }
        }
    }

    fn cut_off(&mut self, w: usize) {
        if self.cut_since[w].is_some() {
            return;
        }
        self.mark_lost(w);
        self.cut_since[w] = Some(SystemTime::now());
        self.workers[w].set_partitioned(true);
        self.publish();
    }

    fn reconnect(&mut self, w: usize) {
        if self.cut_since[w].is_none() {
            return;
        }
        self.mark_lost(w);
        self.cut_since[w] = None;
        self.workers[w].set_partitioned(false);
        self.publish();
    }

    fn refusal(code: u16) -> Refusal {
        let (reason, message) = match code {
            409 => ("Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again"),
            429 => ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
            _ => ("InternalError", "Internal error occurred: etcdserver: request timed out"),
        };
        Refusal {
            method: "",
            plural: "jobs",
            sub: None,
            code,
            reason,
            message: message.into(),
        }
    }

    /// Carries out step `i` of the schedule.
    async fn apply(&mut self, i: usize, step: &Step) {
        match *step {
            Step::Submit { job: i, pods, cpu } => {
                if i != self.jobs.len() {
                    return;
                }
                self.jobs.push((pods, cpu));
                self.manager
                    .upsert(JOBS, job(&job_name(i), "research", pods, cpu));
            }
            Step::Start { job: i } => {
                if i < self.jobs.len() {
                    self.start_copy(i);
                }
            }
            Step::Finish { job: i, ok } => {
                if i < self.jobs.len() {
                    self.finish_copy(i, ok);
                }
            }
            Step::CutOff { worker } => self.cut_off(worker),
            Step::Reconnect { worker } => self.reconnect(worker),
            Step::HandOver { writes } => {
                self.handover_gap = if instant_handover(i) || self.instant_handovers {
                    Duration::ZERO
                } else {
                    HANDOVER_GAP
                };
                self.replicas[self.leader].hand_over.arm(writes)
            }
            Step::Crash { writes } => self.replicas[self.leader].crash.arm(writes),
            Step::Refuse {
                server,
                method,
                code,
                times,
            } => self
                .api(server)
                .fail_next(method, "/jobs", None, times, Self::refusal(code)),
            Step::LoseAnswers {
                server,
                method,
                times,
                hang,
            } => {
                let loss = if hang { Loss::Hang(SLOW) } else { Loss::Error };
                self.api(server).lose_next(method, "/jobs", times, loss);
            }
            Step::Slow {
                server,
                method,
                times,
            } => self.api(server).delay_next(method, "/jobs", times, SLOW),
            Step::Expire { server, times } => {
                let api = self.api(server);
                api.expire_next_watches(JOBS, times);
                api.end_watches();
            }
        }
    }

    /// Everything that touched the Jobs named in `text` (`j0`, `j1`, ...), in order: the
    /// schedule's steps and the replicas' fates, and every request about them on every server,
    /// with the replica that sent it and the answer.
    fn history(&self, text: &str) -> String {
        let named: Vec<String> = (0..self.jobs.len())
            .map(job_name)
            .filter(|n| {
                text.match_indices(n.as_str())
                    .any(|(at, _)| !text[at + n.len()..].starts_with(|c: char| c.is_ascii_digit()))
            })
            .collect();
        let mut lines: Vec<(Instant, String)> = self.log.clone();
        let servers = std::iter::once(("manager", &self.manager))
            .chain(WORKERS.iter().map(|w| w.name).zip(&self.workers));
        for (server, api) in servers {
            for r in api.recorded() {
                let path = r.uri.split('?').next().unwrap_or_default();
                let created = r.body.as_ref().and_then(|b| b["metadata"]["name"].as_str());
                let about = named.iter().find(|n| {
                    path.ends_with(&format!("/jobs/{n}"))
                        || path.ends_with(&format!("/jobs/{n}/status"))
                        || (r.method == "POST" && path.ends_with("/jobs") && created == Some(n))
                });
                if about.is_none() {
                    continue;
                }
                let mut body = r.body.as_ref().map(Value::to_string).unwrap_or_default();
                if body.len() > 300 && r.method == "POST" {
                    body = "(the copy)".into();
                } else if body.len() > 300 {
                    body.truncate(300);
                    body += "…";
                }
                lines.push((
                    r.at,
                    format!(
                        "{server} {} {} {path} → {} {body}",
                        r.replica.as_deref().unwrap_or("test"),
                        r.method,
                        r.status
                            .map_or("(no answer)".to_string(), |c| c.to_string())
                    ),
                ));
            }
        }
        lines.sort_by_key(|(at, _)| *at);
        let mut out = format!("history of {named:?}:\n");
        for (at, line) in lines {
            out += &format!(
                "  {:>6} ms  {line}\n",
                at.saturating_duration_since(self.t0).as_millis()
            );
        }
        out
    }

    // -----------------------------------------------------------------------------------------
    // Invariants.

    /// What must hold at any instant.
    fn check(&mut self) -> Result<(), String> {
        let violations = self.manager.status_violations();
        if !violations.is_empty() {
            return Err(format!(
                "a status write broke the API server's Job status rules:\n{}",
                violations.join("\n")
            ));
        }
        let refused: Vec<String> = self
            .manager
            .list(EVENTS)
            .into_iter()
            .filter(|e| e["reason"] == "StatusRefused")
            .map(|e| format!("{}: {}", e["regarding"]["name"], e["note"]))
            .collect();
        if !refused.is_empty() {
            return Err(format!(
                "the dispatcher made statuses the API server would refuse: {refused:?}"
            ));
        }
        let uncovered = self.manager.uncovered();
        if !uncovered.is_empty() {
            return Err(format!("requests outside the chart's RBAC: {uncovered:?}"));
        }
        // The manager's Jobs, by uid.
        let mut by_uid = BTreeMap::new();
        for i in 0..self.jobs.len() {
            let Some(j) = self.manager_job(i) else {
                return Err(format!("Job {} is lost from the manager", job_name(i)));
            };
            match annotation(&j, RESULT) {
                Some("Succeeded") if !self.ended_ok.contains(&i) => {
                    return Err(format!(
                        "Job {} is recorded Succeeded, but no copy of it succeeded",
                        job_name(i)
                    ))
                }
                Some("Failed") if !self.ended_failed.contains(&i) => {
                    return Err(format!(
                        "Job {} is recorded Failed, but no copy of it failed",
                        job_name(i)
                    ))
                }
                _ => {}
            }
            let uid = j["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            by_uid.insert(uid, (i, j));
        }
        // Copies that run: not ended, and not given up for lost.
        let mut running: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        let mut used = 0;
        for (w, api) in self.workers.iter().enumerate() {
            for c in api.list(JOBS) {
                let uid = c["metadata"]["uid"].as_str().unwrap_or_default();
                let origin = c["metadata"]["labels"][ORIGIN_UID]
                    .as_str()
                    .unwrap_or_default();
                let Some((i, j)) = by_uid.get(origin) else {
                    continue;
                };
                let given_up = (self.cut_since[w].is_some() || self.lost.contains(uid))
                    && annotation(j, CLAIM) != Some(WORKERS[w].name);
                if terminal(&c) || given_up {
                    continue;
                }
                running
                    .entry(job_name(*i))
                    .or_default()
                    .push(WORKERS[w].name);
                used += self.jobs[*i].0 * self.jobs[*i].1;
            }
        }
        if let Some((name, places)) = running.iter().find(|(_, p)| p.len() > 1) {
            return Err(format!("Job {name} runs in {places:?} at once"));
        }
        if used > QUOTA {
            return Err(format!(
                "copies that run use {used} CPUs of the queue's {QUOTA}: {running:?}"
            ));
        }
        // Claimed in the manager and not ended there nor in the worker.
        let mut claimed = Vec::new();
        let mut held = 0;
        for (i, j) in by_uid.values() {
            let Some(claim) = annotation(j, CLAIM) else {
                continue;
            };
            let ended_there = WORKERS
                .iter()
                .position(|s| s.name == claim)
                .and_then(|w| self.workers[w].get(JOBS, NS, &job_name(*i)))
                .is_some_and(|c| terminal(&c));
            if terminal(j) || annotation(j, RESULT).is_some() || ended_there {
                continue;
            }
            claimed.push(format!("{} in {claim}", job_name(*i)));
            held += self.jobs[*i].0 * self.jobs[*i].1;
        }
        if held > QUOTA {
            return Err(format!(
                "the Jobs claimed hold {held} CPUs of the queue's {QUOTA}: {claimed:?}"
            ));
        }
        self.checks += 1;
        Ok(())
    }

    /// Why Job `i` is not done yet, if it is not: ended with its result recorded and its
    /// copies removed.
    fn not_done(&self, i: usize) -> Option<String> {
        let j = self.manager_job(i)?;
        let copies: Vec<&str> = self
            .workers
            .iter()
            .enumerate()
            .filter(|(_, api)| api.get(JOBS, NS, &job_name(i)).is_some())
            .map(|(w, _)| WORKERS[w].name)
            .collect();
        let result = annotation(&j, RESULT);
        let consistent = match result {
            Some("Succeeded") => is_true(&j, "Complete"),
            Some("Failed") => is_true(&j, "Failed"),
            _ => false,
        };
        if consistent && copies.is_empty() {
            return None;
        }
        let conditions: Vec<String> = j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}={} {}", c["type"], c["status"], c["reason"]))
            .collect();
        Some(format!(
            "{}: result {result:?}, claimed for {:?}, suspend {}, conditions {conditions:?}, copies in {copies:?}, annotations {}",
            job_name(i),
            annotation(&j, CLAIM),
            j["spec"]["suspend"],
            j["metadata"]["annotations"]
        ))
    }

    /// Every fault healed: each Job must say why it waits, and with its copies let finish,
    /// end with its result, leaving no copy behind.
    async fn heal(&mut self) -> Result<(), String> {
        for r in &self.replicas {
            r.crash.disarm();
            r.hand_over.disarm();
        }
        for api in std::iter::once(&self.manager).chain(&self.workers) {
            api.clear_refusals();
            api.expire_next_watches(JOBS, 0);
        }
        for w in 0..WORKERS.len() {
            self.reconnect(w);
        }
        if !self.settle(Duration::from_secs(10)).await {
            return Err("the healed dispatcher did not settle within 10 s".into());
        }
        self.check()?;
        // Each Job not done says why: dispatched (Admitted=True) or waiting for a reason.
        let deadline = Instant::now() + REASON_WITHIN;
        loop {
            let silent: Vec<String> = (0..self.jobs.len())
                .filter(|i| self.not_done(*i).is_some())
                .filter_map(|i| {
                    let j = self.manager_job(i)?;
                    let said = j["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| {
                            c["type"] == "Admitted"
                                && (c["status"] == "True"
                                    || c["reason"].as_str().is_some_and(|r| !r.is_empty()))
                        });
                    (!said).then(|| self.not_done(i).unwrap_or_default())
                })
                .collect();
            if silent.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "Jobs left without a reason after healing: {silent:#?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.settle(Duration::from_secs(1)).await;
        }
        let deadline = Instant::now() + HEAL_WITHIN;
        loop {
            let open: Vec<usize> = (0..self.jobs.len())
                .filter(|i| self.not_done(*i).is_some())
                .collect();
            if open.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let why: Vec<String> = open.iter().filter_map(|i| self.not_done(*i)).collect();
                return Err(format!(
                    "Jobs not done {} s after healing: {why:#?}",
                    HEAL_WITHIN.as_secs()
                ));
            }
            for i in open {
                self.start_copy(i);
                self.finish_copy(i, true);
            }
            self.settle(Duration::from_secs(2)).await;
            self.check()?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running, shrinking, reporting.

#[derive(Default)]
struct Ran {
    steps: u64,
    checks: u64,
    crashes: u64,
    hand_overs: u64,
    instant: u64,
    jobs: u64,
    requests: u64,
    /// Requests answered 409, 429, 500 or 503 (a fault set, a fence, a cut-off worker).
    errors: u64,
}

/// Runs the steps of `steps` whose indices are in `keep` (all when `None`).
async fn run(steps: &[Step], keep: Option<&[usize]>) -> Result<Ran, String> {
    let mut rig = Rig::start().await;
    let mut done = 0;
    for (i, step) in steps.iter().enumerate() {
        if keep.is_some_and(|k| !k.contains(&i)) {
            continue;
        }
        rig.log
            .push((Instant::now(), format!("step {i}: {step:?}")));
        rig.apply(i, step).await;
        rig.settle(STEP_SETTLE).await;
        if let Err(e) = rig.check() {
            let history = rig.history(&e);
            return Err(format!("after step {i} ({step:?}): {e}\n{history}"));
        }
        done += 1;
    }
    rig.log.push((Instant::now(), "healing".into()));
    if let Err(e) = rig.heal().await {
        let history = rig.history(&e);
        return Err(format!("after healing: {e}\n{history}"));
    }
    let mut ran = Ran {
        steps: done,
        checks: rig.checks,
        crashes: rig.crashes,
        hand_overs: rig.hand_overs,
        instant: rig.instant,
        jobs: rig.jobs.len() as u64,
        ..Default::default()
    };
    for api in std::iter::once(&rig.manager).chain(&rig.workers) {
        for r in api.recorded() {
            ran.requests += 1;
            if matches!(r.status, Some(409 | 429 | 500 | 503)) {
                ran.errors += 1;
            }
        }
    }
    Ok(ran)
}

/// Runs in a task of its own, so that a panic is a failure like any other.
async fn run_caught(steps: Vec<Step>, keep: Option<Vec<usize>>) -> Result<Ran, String> {
    match tokio::spawn(async move { run(&steps, keep.as_deref()).await }).await {
        Ok(result) => result,
        Err(e) => Err(format!("panicked: {e}")),
    }
}

/// The first failure of the steps kept (indices into `steps`) in `runs` runs at once: a
/// race may need the load of the others to show.
async fn fails(steps: &[Step], keep: &[usize], runs: usize) -> Option<String> {
    let all = (0..runs).map(|_| run_caught(steps.to_vec(), Some(keep.to_vec())));
    futures::future::join_all(all)
        .await
        .into_iter()
        .find_map(Result::err)
}

/// The fewest steps (indices into `steps`) found that still fail: chunks of the schedule are
/// removed while it keeps failing, halving the chunk size down to single steps (delta
/// debugging). A live run is not exactly repeatable: a candidate fails if any of `runs`
/// runs of it does.
async fn shrink(steps: &[Step], runs: usize, budget: usize) -> Vec<usize> {
    let mut kept: Vec<usize> = (0..steps.len()).collect();
    let mut chunk = kept.len().div_ceil(2);
    let mut tried = 0;
    while chunk >= 1 && tried < budget {
        let mut start = 0;
        while start < kept.len() && tried < budget {
            let candidate: Vec<usize> = kept
                .iter()
                .enumerate()
                .filter(|(k, _)| *k < start || *k >= start + chunk)
                .map(|(_, i)| *i)
                .collect();
            tried += 1;
            if fails(steps, &candidate, runs).await.is_some() {
                kept = candidate;
            } else {
                start += chunk;
            }
        }
        chunk /= 2;
    }
    kept
}

async fn report_failure(seed: u64, steps: &[Step], error: &str) -> String {
    let runs = env_u64("SWITCHYARD_FAULTS_SHRINK_RUNS", 16).max(1) as usize;
    let mut out = format!(
        "schedule seed {seed} failed ({} steps):\n  {error}\n",
        steps.len()
    );
    let all: Vec<usize> = (0..steps.len()).collect();
    if fails(steps, &all, 2 * runs).await.is_none() {
        out += &format!(
            "not shrunk: it did not fail again in {} runs of it at once (a race; replay the seed \
             with SWITCHYARD_FAULTS_REPEAT=64 to see it again)\n",
            2 * runs
        );
        return out;
    }
    let kept = shrink(steps, runs, 40).await;
    let again = fails(steps, &kept, runs).await;
    out += &format!(
        "shrunk to {} steps{}:\n",
        kept.len(),
        match &again {
            Some(e) => format!(" (failing again: {})", e.lines().next().unwrap_or_default()),
            None =>
                format!(" (none of {runs} runs failed once more: the steps are the best found)"),
        }
    );
    for i in &kept {
        out += &format!("  {i:>3}: {:?}\n", steps[*i]);
    }
    let list: Vec<String> = kept.iter().map(usize::to_string).collect();
    out += &format!(
        "replay: SWITCHYARD_FAULTS_SEED={seed} SWITCHYARD_FAULTS_STEPS={} SWITCHYARD_FAULTS_KEEP={} cargo test --release --test fault_schedules -- --nocapture\n",
        steps.len(),
        list.join(",")
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_schedules_keep_every_invariant() {
    let len = env_u64("SWITCHYARD_FAULTS_STEPS", 30) as usize;
    let seeds: Vec<u64> = match std::env::var("SWITCHYARD_FAULTS_SEED") {
        Ok(s) => vec![s.parse().expect("SWITCHYARD_FAULTS_SEED is a number")],
        Err(_) => {
            let first = env_u64("SWITCHYARD_FAULTS_FIRST_SEED", 0);
            (first..first + env_u64("SWITCHYARD_FAULTS_SCHEDULES", 12)).collect()
        }
    };
    // Each seed this many times (a race may need several runs, and others beside, to show).
    let repeat = env_u64("SWITCHYARD_FAULTS_REPEAT", 1).max(1) as usize;
    let seeds: Vec<u64> = seeds
        .into_iter()
        .flat_map(|s| std::iter::repeat_n(s, repeat))
        .collect();
    let keep: Option<Vec<usize>> = std::env::var("SWITCHYARD_FAULTS_KEEP")
        .ok()
        .map(|k| k.split(',').filter_map(|i| i.trim().parse().ok()).collect());
    let parallel = env_u64("SWITCHYARD_FAULTS_PARALLEL", 4).max(1) as usize;
    let started = Instant::now();
    let total = seeds.len();
    let mut results = futures::stream::iter(seeds)
        .map(|seed| {
            let keep = keep.clone();
            async move {
                let steps = schedule(seed, len);
                (seed, run_caught(steps, keep).await)
            }
        })
        .buffer_unordered(parallel);
    let mut sum = Ran::default();
    let mut failed = Vec::new();
    let mut ran = 0;
    while let Some((seed, result)) = results.next().await {
        ran += 1;
        match result {
            Ok(r) => {
                sum.steps += r.steps;
                sum.checks += r.checks;
                sum.crashes += r.crashes;
                sum.hand_overs += r.hand_overs;
                sum.instant += r.instant;
                sum.jobs += r.jobs;
                sum.requests += r.requests;
                sum.errors += r.errors;
            }
            Err(e) => {
                eprintln!("seed {seed} failed: {e}");
                failed.push((seed, e));
            }
        }
        if ran % 100 == 0 {
            eprintln!(
                "{ran} of {total} schedules, {} failed, {:.0} s",
                failed.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    drop(results);
    println!(
        "fault schedules: {ran} schedules of {len} steps, {} failed, {:.1} s\n  \
         passed: {} steps, {} invariant checks ({} invariants each), {} Jobs run to their end, \
         {} leaders killed right after a write, {} leases handed over right after a write ({} of them at once), \
         {} requests served, {} of them answered 409, 429, 500 or 503",
        failed.len(),
        started.elapsed().as_secs_f64(),
        sum.steps,
        sum.checks,
        INVARIANTS,
        sum.jobs,
        sum.crashes,
        sum.hand_overs,
        sum.instant,
        sum.requests,
        sum.errors,
    );
    if failed.is_empty() {
        return;
    }
    let mut reports = Vec::new();
    // Shrink a few: each shrink runs the schedule hundreds of times.
    let mut shrunk = BTreeSet::new();
    for (seed, error) in &failed {
        if shrunk.len() == 3 || !shrunk.insert(*seed) {
            continue;
        }
        let steps = schedule(*seed, len);
        let report = report_failure(*seed, &steps, error).await;
        eprintln!("{report}");
        reports.push(report);
    }
    let seeds: Vec<u64> = failed.iter().map(|(s, _)| *s).collect();
    panic!(
        "{} of {ran} schedules failed (seeds {seeds:?}):\n{}",
        failed.len(),
        reports.join("\n")
    );
}
