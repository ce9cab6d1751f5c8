//! Fault schedules: the live dispatcher (two replicas, the real `kube::Client`, real HTTP to
//! fake API servers on loopback: a manager and three workers) driven through randomized
//! schedules. Every schedule has the queue `research`; by its seed (`seed % 16`, one bit each)
//! it also has `dev` (a smaller quota, two of the workers), `ready` (`waitForPodsReady` with a
//! 1 s timeout and a requeuing limit of 1) and `wide` (`placement.fanout: 2`), and JobSets
//! (jobset.x-k8s.io/v1alpha2, served by every server; about a third of the arrivals are
//! JobSets). Each schedule mixes Job arrivals, their pods starting and finishing, Jobs deleted
//! by their users, workers cut off and back, the leader stepping down (the standby leads a lease gap later, or at once for
//! about half of the hand-overs, as after a release on SIGTERM) and the leader
//! killed (a new replica leads at once) right after its Nth write, 409,
//! 429 and 500 answers, writes that land but whose answer is lost (a 500, or an answer past
//! the write timeout; a read of the manager's Job answered late, after it may have changed), writes that land only after the write timeout, and watches ended and
//! answered 410 Gone. After every step:
//! - no Job has two running copies (a copy in a worker that was cut off and whose Job was
//!   given up for lost is exempt, as documented, until it is removed); a Job of the fanout
//!   queue runs in at most `fanout` workers, each one it was offered to (docs/dispatcher.md,
//!   "One worker at a time, and fanout");
//! - no queue's quota is exceeded, counted both by the copies that run (a Job once, however
//!   many copies it has) and by the Jobs the manager shows claimed or offered;
//! - no Job is lost (but those deleted), and a result the manager records comes from a copy that ended so; an end
//!   the manager shows (`Complete`, `Failed`, a JobSet's `Completed`) is never undone;
//! - a requeue is counted only in the `waitForPodsReady` queue, never past its limit, with a
//!   `Requeued` reason (once the dispatcher settled: a requeue is two writes, the Job then
//!   its status); a Job deactivated at the limit stays suspended, unclaimed, and says so
//!   (`Deactivated`, `RequeuingLimitExceeded`);
//! - no status write to the manager broke the API server's Job status rules or the JobSet
//!   CRD's schema (the fake API refuses them as kube-apiserver does, tests/common/job_rules.rs
//!   and tests/common/jobset_rules.rs), and the dispatcher reported none as refused.
//!
//! At the end every fault is healed and every copy allowed to finish: each Job must end with
//! its result (or deactivated, with no copy left), with no copy left anywhere (a deleted Job's
//! copies removed), a fanout Job's
//! losing copies gone once the fleet settles, and meanwhile say why it waits.
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
    FakeApi, Loss, Refusal, Tripwire, DISPATCH_QUEUES, EVENTS, JOBS, JOBSETS, NAMESPACES,
    PRIORITY_CLASSES,
};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use switchyard::dispatcher::live::{self, Inputs, JobSets, LiveOptions};
use switchyard::dispatcher::DispatchConfig;
use switchyard::inventory::InventoryStore;
use switchyard::leader::WritesInFlight;
use switchyard::rng::Rng;
use switchyard::workers::registry::{WorkerView, Workers, WorkersPublisher};
use tokio::sync::watch;

const CLAIM: &str = "switchyard.dev/cluster";
const RESULT: &str = "switchyard.dev/result";
const ORIGIN_UID: &str = "switchyard.dev/origin-uid";
const OFFERED: &str = "switchyard.dev/offered-to";
const REQUEUES: &str = "switchyard.dev/requeues";
/// What one check looks at: status rules kept (writes, and none refused by the dispatcher
/// itself), requests within RBAC, no Job lost, results from copies that ended so, ends never
/// undone, one running copy per Job (fanout: copies only where offered, at most `fanout`),
/// quota by running copies, quota by claims and offers, requeue counts and deactivation.
const INVARIANTS: u64 = 9;

/// A DispatchQueue of the campaign. They share the workers.
struct QueueSpec {
    name: &'static str,
    /// Indices into [`WORKERS`].
    workers: &'static [usize],
    /// CPUs.
    quota: u32,
    /// `placement.fanout`.
    fanout: usize,
    /// `waitForPodsReady` on: all pods Ready within [`READY_TIMEOUT`], requeued with a 1 s
    /// back-off, deactivated at [`READY_LIMIT`].
    pods_ready: bool,
}

const QUEUES: [QueueSpec; 4] = [
    QueueSpec {
        name: "research",
        workers: &[0, 1, 2],
        quota: 10,
        fanout: 1,
        pods_ready: false,
    },
    QueueSpec {
        name: "dev",
        workers: &[1, 2],
        quota: 6,
        fanout: 1,
        pods_ready: false,
    },
    QueueSpec {
        name: "ready",
        workers: &[0, 1, 2],
        quota: 8,
        fanout: 1,
        pods_ready: true,
    },
    QueueSpec {
        name: "wide",
        workers: &[0, 1, 2],
        quota: 8,
        fanout: 2,
        pods_ready: false,
    },
];
const READY_TIMEOUT: &str = "1s";
/// One counted requeue; the next timeout deactivates the Job.
const READY_LIMIT: u32 = 1;
/// A JobSet's pods: `driver` (1 Job of 1 pod) and `workers` (2 Jobs of 2 pods).
const JOBSET_PODS: u32 = 5;

/// What a schedule runs besides `research`, by its seed: one bit each, so that 16 seeds in a
/// row cover every mix.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Setup {
    /// Which of [`QUEUES`] exist (`research` always).
    queues: [bool; QUEUES.len()],
    /// The JobSet API is served (manager and workers) and dispatched.
    jobsets: bool,
}

fn setup(seed: u64) -> Setup {
    let bits = seed % 16;
    Setup {
        queues: [true, bits & 1 != 0, bits & 2 != 0, bits & 4 != 0],
        jobsets: bits & 8 != 0,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Job,
    JobSet,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Job => JOBS,
            Kind::JobSet => JOBSETS,
        }
    }
}

/// A Job (or JobSet) submitted.
#[derive(Debug, Clone, Copy)]
struct Submitted {
    /// Index into [`QUEUES`].
    queue: usize,
    kind: Kind,
    pods: u32,
    /// CPUs of each pod.
    cpu: u32,
}

impl Submitted {
    fn cpus(&self) -> u32 {
        self.pods * self.cpu
    }
    fn queue(&self) -> &'static QueueSpec {
        &QUEUES[self.queue]
    }
}
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
    /// A Job (or JobSet) of `pods` pods of `cpu` CPUs each arrives in queue `queue` (an
    /// index into [`QUEUES`]).
    Submit {
        job: usize,
        queue: usize,
        kind: Kind,
        pods: u32,
        cpu: u32,
    },
    /// The pods of the Job's copy in its claimed worker run, all Ready (not yet chosen among
    /// several offers: the copy in the `pick`th worker offered).
    Start {
        job: usize,
        pick: usize,
    },
    /// The Job's copy in its claimed worker (or the `pick`th offered) ends, succeeded or
    /// failed.
    Finish {
        job: usize,
        pick: usize,
        ok: bool,
    },
    /// The Job's user deletes it from the manager (its copies must go too).
    Delete {
        job: usize,
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
    /// past the write timeout (`hang`). A read is made at once and answered so.
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

/// The schedule of `seed`, `len` steps long, and what it runs on.
fn schedule(seed: u64, len: usize) -> (Setup, Vec<Step>) {
    let setup = setup(seed);
    let queues: Vec<usize> = (0..QUEUES.len()).filter(|q| setup.queues[*q]).collect();
    let mut rng = Rng::new(seed);
    let mut steps = Vec::with_capacity(len);
    let mut submitted = 0usize;
    let mut cut = [false; WORKERS.len()];
    while steps.len() < len {
        let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1) as u64) as usize;
        let roll = if submitted == 0 { 0 } else { rng.below(100) };
        let step = match roll {
            0..=17 => {
                let queue = queues[pick(&mut rng, queues.len())];
                let kind = if setup.jobsets && rng.percent(35) {
                    Kind::JobSet
                } else {
                    Kind::Job
                };
                // Each fits its queue's quota and some worker of it.
                let (pods, cpu) = loop {
                    let (pods, cpu) = match kind {
                        Kind::JobSet => (JOBSET_PODS, 1),
                        Kind::Job => {
                            let pods = 1 + rng.below(3) as u32;
                            (pods, 1 + rng.below(if pods == 1 { 4 } else { 3 }) as u32)
                        }
                    };
                    if pods * cpu <= QUEUES[queue].quota {
                        break (pods, cpu);
                    }
                };
                submitted += 1;
                Step::Submit {
                    job: submitted - 1,
                    queue,
                    kind,
                    pods,
                    cpu,
                }
            }
            18..=29 => Step::Start {
                job: pick(&mut rng, submitted),
                pick: pick(&mut rng, 2),
            },
            30..=45 => Step::Finish {
                job: pick(&mut rng, submitted),
                pick: pick(&mut rng, 2),
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
                    // A read of a Job answered late: the Job may have changed meanwhile.
                    Server::Manager => ["PATCH", "PATCH", "GET"][pick(&mut rng, 3)],
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
            94..=95 => Step::Delete {
                job: pick(&mut rng, submitted),
            },
            _ => Step::Expire {
                server: server(&mut rng),
                times: 1 + rng.below(2) as u32,
            },
        };
        steps.push(step);
    }
    (setup, steps)
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
    setup: Setup,
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
    /// The Jobs submitted.
    jobs: Vec<Submitted>,
    /// Jobs the manager was seen to show ended (`Complete`, `Failed`, `Completed`).
    seen_ended: BTreeSet<usize>,
    /// Copies (by uid) in a worker while it was cut off: given up for lost.
    lost: HashSet<String>,
    /// Jobs whose copy we ended, succeeded or failed.
    ended_ok: BTreeSet<usize>,
    ended_failed: BTreeSet<usize>,
    /// Jobs deleted from the manager.
    deleted: BTreeSet<usize>,
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

fn options(setup: Setup) -> LiveOptions {
    LiveOptions {
        jobsets: if setup.jobsets {
            JobSets::Enabled
        } else {
            JobSets::Disabled
        },
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

/// Ended: a Job `Complete` or `Failed`, a JobSet `Completed` or `Failed`.
fn terminal(obj: &Value) -> bool {
    is_true(obj, "Complete") || is_true(obj, "Failed") || is_true(obj, "Completed")
}

/// A JobSet as the manager's API server stores it after the webhooks (suspended, managed by
/// the dispatcher): the captured `trainer` (tests/fixtures/kube-api/jobset), renamed, in
/// queue `queue`, every pod asking for `cpu` CPUs.
fn jobset(name: &str, uid: &str, queue: &str, cpu: u32) -> Value {
    let path = format!(
        "{}/tests/fixtures/kube-api/jobset/get_jobset_queued.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let exchange: Value = serde_json::from_str(&text).expect("an exchange is JSON");
    let mut js = exchange["response"]["body"].clone();
    let meta = js["metadata"].as_object_mut().expect("metadata");
    meta.remove("managedFields");
    meta.insert("name".into(), name.into());
    meta.insert("uid".into(), uid.into());
    js["metadata"]["labels"]["switchyard.dev/queue-name"] = queue.into();
    for rj in js["spec"]["replicatedJobs"]
        .as_array_mut()
        .expect("replicatedJobs")
    {
        let pod = &mut rj["template"]["spec"]["template"]["spec"];
        let resources = json!({"cpu": cpu.to_string(), "memory": "1Gi"});
        pod["containers"][0]["resources"] = json!({"requests": resources, "limits": resources});
    }
    js
}

/// A JobSet copy's status as the worker's JobSet controller writes it: `workers` (2 Jobs)
/// and `driver` (1 Job), `ready` of each Ready, `done` of each ended so.
fn jobset_status(ready: bool, ended: Option<bool>, now: &str) -> Value {
    let rjs = |name: &str, jobs: u32| {
        let (active, ready_jobs, succeeded, failed) = match ended {
            None => (jobs, if ready { jobs } else { 0 }, 0, 0),
            Some(true) => (0, 0, jobs, 0),
            Some(false) => (jobs - 1, 0, 0, 1),
        };
        json!({"name": name, "active": active, "ready": ready_jobs, "succeeded": succeeded,
               "failed": failed, "suspended": 0})
    };
    let mut status = json!({"replicatedJobsStatus": [rjs("workers", 2), rjs("driver", 1)],
                            "restarts": 0});
    let end = |type_: &str, reason: &str, message: &str| {
        json!([{"type": type_, "status": "True", "reason": reason, "message": message,
                "lastTransitionTime": now}])
    };
    match ended {
        Some(true) => {
            status["conditions"] = end(
                "Completed",
                "AllJobsCompleted",
                "jobset completed successfully",
            );
            status["terminalState"] = "Completed".into();
        }
        Some(false) => {
            status["conditions"] = end(
                "Failed",
                "FailedJobs",
                "jobset failed due to one or more job failures (first failed job: workers-0)",
            );
            status["terminalState"] = "Failed".into();
        }
        None => {}
    }
    status
}

fn annotation<'a>(obj: &'a Value, name: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][name].as_str()
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The workers a manager Job keeps: the one it is claimed for, or those it is offered to.
fn kept_by(j: &Value) -> Vec<&str> {
    match annotation(j, CLAIM) {
        Some(claim) => vec![claim],
        None => annotation(j, OFFERED)
            .map(|o| {
                o.split(',')
                    .map(str::trim)
                    .filter(|w| !w.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn now() -> String {
    switchyard::dispatcher::rfc3339(SystemTime::now())
}

impl Rig {
    async fn start(setup: Setup) -> Rig {
        switchyard::install_crypto_provider();
        let manager = FakeApi::start().await;
        manager.check_rbac(switchyard::rbac::Role::Manager);
        if setup.jobsets {
            manager.serve_jobsets();
        }
        manager.enforce_job_status_rules();
        manager.upsert(NAMESPACES, namespace(NS));
        manager.upsert(
            PRIORITY_CLASSES,
            json!({"metadata": {"name": "high"}, "value": 1000, "globalDefault": false}),
        );
        for (q, spec) in QUEUES.iter().enumerate() {
            if !setup.queues[q] {
                continue;
            }
            let names: Vec<&str> = spec.workers.iter().map(|w| WORKERS[*w].name).collect();
            let mut extra =
                json!({"quota": {"cpu": spec.quota.to_string()}, "workerLostTimeout": "1s"});
            if spec.fanout > 1 {
                extra["placement"] = json!({"fanout": spec.fanout});
            }
            if spec.pods_ready {
                extra["waitForPodsReady"] = json!({"enabled": true, "timeout": READY_TIMEOUT,
                    "requeuing": {"backoffBase": "1s", "backoffMax": "2s", "limit": READY_LIMIT}});
            }
            manager.upsert(DISPATCH_QUEUES, queue(spec.name, &names, extra));
        }
        let inventory = switchyard::inventory::parse_yaml(&inventory_yaml(&WORKERS)).unwrap();
        let mut workers = Vec::new();
        for _ in &WORKERS {
            let api = FakeApi::start().await;
            api.check_rbac(switchyard::rbac::Role::WorkerSide);
            if setup.jobsets {
                api.serve_jobsets();
            }
            api.upsert(NAMESPACES, namespace(NS));
            workers.push(api);
        }
        let mut rig = Rig {
            setup,
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
            seen_ended: BTreeSet::new(),
            lost: HashSet::new(),
            ended_ok: BTreeSet::new(),
            deleted: BTreeSet::new(),
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
            options(self.setup),
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
    /// While the lease is between two leaders nobody decides: that is not settled.
    async fn settle(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut base: Option<(String, u64)> = None;
        loop {
            self.after_trips();
            if self.lease_passes_at.is_some() {
                base = None;
                if Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
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
        self.manager.get(self.jobs[i].kind.path(), NS, &job_name(i))
    }

    /// Job `i`'s copy in worker `w`, if it is one of the manager Job's copies.
    fn copy_in(&self, i: usize, w: usize) -> Option<Value> {
        let copy = self.workers[w].get(self.jobs[i].kind.path(), NS, &job_name(i))?;
        let j = self.manager_job(i)?;
        (copy["metadata"]["labels"][ORIGIN_UID] == j["metadata"]["uid"]).then_some(copy)
    }

    /// The copy of Job `i` in the worker its manager Job is claimed for, or, while it is
    /// offered to several, in the `pick`th of them (round).
    fn claimed_copy(&self, i: usize, pick: usize) -> Option<(usize, Value)> {
        let j = self.manager_job(i)?;
        let worker = match annotation(&j, CLAIM) {
            Some(claim) => claim.to_string(),
            None => {
                let offers: Vec<&str> = annotation(&j, OFFERED)?.split(',').collect();
                offers[pick % offers.len()].trim().to_string()
            }
        };
        let w = WORKERS.iter().position(|s| s.name == worker)?;
        Some((w, self.copy_in(i, w)?))
    }

    fn set_copy_status(&self, i: usize, w: usize, mut copy: Value, status: Value) {
        copy["status"] = status;
        self.workers[w].upsert(self.jobs[i].kind.path(), copy);
    }

    fn start_copy(&self, i: usize, pick: usize) {
        let Some((w, copy)) = self.claimed_copy(i, pick) else {
            return;
        };
        if terminal(&copy) {
            return;
        }
        if self.jobs[i].kind == Kind::JobSet {
            return self.set_copy_status(i, w, copy, jobset_status(true, None, &now()));
        }
        let pods = self.jobs[i].pods;
        let start = copy["status"]["startTime"]
            .as_str()
            .map_or_else(now, str::to_string);
        self.set_copy_status(
            i,
            w,
            copy,
            json!({"active": pods, "ready": pods, "startTime": start,
                   "uncountedTerminatedPods": {}}),
        );
    }

    fn finish_copy(&mut self, i: usize, pick: usize, ok: bool) {
        let Some((w, copy)) = self.claimed_copy(i, pick) else {
            return;
        };
        if terminal(&copy) {
            return;
        }
        if self.jobs[i].kind == Kind::JobSet {
            if ok {
                self.ended_ok.insert(i);
            } else {
                self.ended_failed.insert(i);
            }
            return self.set_copy_status(i, w, copy, jobset_status(false, Some(ok), &now()));
        }
        let pods = self.jobs[i].pods;
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
        self.set_copy_status(i, w, copy, status);
    }

    /// Copies in the worker now are given up for lost (it is cut off, or back from it).
    fn mark_lost(&mut self, w: usize) {
        for c in self.copies(w) {
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
            Step::Submit {
                job: i,
                queue,
                kind,
                pods,
                cpu,
            } => {
                if i != self.jobs.len() {
                    return;
                }
                self.jobs.push(Submitted {
                    queue,
                    kind,
                    pods,
                    cpu,
                });
                let name = job_name(i);
                let queue = QUEUES[queue].name;
                match kind {
                    Kind::Job => self.manager.upsert(JOBS, job(&name, queue, pods, cpu)),
                    Kind::JobSet => {
                        let uid = format!("5e7a4c1d-0b2f-4e8a-9c3d-{i:012x}");
                        self.manager
                            .upsert(JOBSETS, jobset(&name, &uid, queue, cpu))
                    }
                };
            }
            Step::Start { job: i, pick } => {
                if i < self.jobs.len() {
                    self.start_copy(i, pick);
                }
            }
            Step::Finish { job: i, pick, ok } => {
                if i < self.jobs.len() {
                    self.finish_copy(i, pick, ok);
                }
            }
            Step::Delete { job: i } => {
                if i < self.jobs.len() && self.deleted.insert(i) {
                    self.manager.delete(self.jobs[i].kind.path(), &job_name(i));
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
                    ["jobs", "jobsets"].iter().any(|plural| {
                        path.ends_with(&format!("/{plural}/{n}"))
                            || path.ends_with(&format!("/{plural}/{n}/status"))
                            || (r.method == "POST"
                                && path.ends_with(&format!("/{plural}"))
                                && created == Some(n))
                    })
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
                "a status write broke the API server's status rules:\n{}",
                violations.join("\n")
            ));
        }
        let refused: Vec<String> = self
            .manager
            .list(EVENTS)
            .into_iter()
            .filter(|e| e["reason"] == "StatusRefused" || e["reason"] == "WriteRefused")
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
            let name = job_name(i);
            let Some(j) = self.manager_job(i) else {
                if self.deleted.contains(&i) {
                    continue;
                }
                return Err(format!("Job {name} is lost from the manager"));
            };
            match annotation(&j, RESULT) {
                Some("Succeeded") if !self.ended_ok.contains(&i) => {
                    return Err(format!(
                        "Job {name} is recorded Succeeded, but no copy of it succeeded"
                    ))
                }
                Some("Failed") if !self.ended_failed.contains(&i) => {
                    return Err(format!(
                        "Job {name} is recorded Failed, but no copy of it failed"
                    ))
                }
                _ => {}
            }
            if terminal(&j) {
                self.seen_ended.insert(i);
            } else if self.seen_ended.contains(&i) {
                return Err(format!(
                    "Job {name}'s end was undone in the manager: conditions {}",
                    j["status"]["conditions"]
                ));
            }
            let uid = j["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            by_uid.insert(uid, (i, j));
        }
        // Copies that run: not ended, and not given up for lost.
        let mut running: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for (w, spec) in WORKERS.iter().enumerate() {
            for c in self.copies(w) {
                let uid = c["metadata"]["uid"].as_str().unwrap_or_default();
                let origin = c["metadata"]["labels"][ORIGIN_UID]
                    .as_str()
                    .unwrap_or_default();
                let Some((i, j)) = by_uid.get(origin) else {
                    continue;
                };
                let kept = kept_by(j).contains(&spec.name);
                let given_up = (self.cut_since[w].is_some() || self.lost.contains(uid)) && !kept;
                if terminal(&c) || given_up {
                    continue;
                }
                running.entry(*i).or_default().push(spec.name);
            }
        }
        let mut used = [0u32; QUEUES.len()];
        for (i, places) in &running {
            let q = self.jobs[*i].queue();
            let j = &self.manager_job(*i).unwrap_or_default();
            if q.fanout <= 1 && places.len() > 1 {
                return Err(format!("Job {} runs in {places:?} at once", job_name(*i)));
            }
            if places.len() > q.fanout {
                return Err(format!(
                    "Job {} of fanout {} runs in {places:?} at once",
                    job_name(*i),
                    q.fanout
                ));
            }
            if q.fanout > 1 && places.len() > 1 {
                let offered = self.ever_offered(*i);
                if let Some(w) = places
                    .iter()
                    .find(|w| !offered.contains(**w) && !kept_by(j).contains(*w))
                {
                    return Err(format!(
                        "Job {} runs in {places:?}, in {w} that it was never offered to (offers {offered:?}, claim {:?})",
                        job_name(*i),
                        annotation(j, CLAIM)
                    ));
                }
            }
            used[self.jobs[*i].queue] += self.jobs[*i].cpus();
        }
        for (q, spec) in QUEUES.iter().enumerate() {
            if used[q] > spec.quota {
                let in_q: Vec<String> = running
                    .iter()
                    .filter(|(i, _)| self.jobs[**i].queue == q)
                    .map(|(i, p)| format!("{} in {p:?}", job_name(*i)))
                    .collect();
                return Err(format!(
                    "copies that run use {} CPUs of queue {}'s {}: {in_q:?}",
                    used[q], spec.name, spec.quota
                ));
            }
        }
        // Claimed (or offered) in the manager and not ended there nor in the worker.
        let mut claimed: Vec<Vec<String>> = vec![Vec::new(); QUEUES.len()];
        let mut held = [0u32; QUEUES.len()];
        for (i, j) in by_uid.values() {
            let kept = kept_by(j);
            if kept.is_empty() {
                continue;
            }
            let ended_there = annotation(j, CLAIM)
                .and_then(|claim| WORKERS.iter().position(|s| s.name == claim))
                .and_then(|w| self.copy_in(*i, w))
                .is_some_and(|c| terminal(&c));
            if terminal(j) || annotation(j, RESULT).is_some() || ended_there {
                continue;
            }
            let q = self.jobs[*i].queue;
            claimed[q].push(format!("{} in {kept:?}", job_name(*i)));
            held[q] += self.jobs[*i].cpus();
        }
        for (q, spec) in QUEUES.iter().enumerate() {
            if held[q] > spec.quota {
                return Err(format!(
                    "the Jobs claimed hold {} CPUs of queue {}'s {}: {:?}",
                    held[q], spec.name, spec.quota, claimed[q]
                ));
            }
        }
        self.checks += 1;
        Ok(())
    }

    /// [`Rig::check`], then [`Rig::check_requeues`] for every Job. What a requeue writes takes
    /// two requests (the Job, then its status), and a requeue a timer decides may be under
    /// way as the step's check runs: a requeue found half-written is looked at again once the
    /// dispatcher settled anew, twice at most. A count past its limit stays past it; a lost
    /// status write stays lost.
    async fn check_settled(&mut self) -> Result<(), String> {
        self.check()?;
        let mut looks = 0;
        loop {
            let found = (0..self.jobs.len()).try_for_each(|i| match self.manager_job(i) {
                Some(j) => self.check_requeues(i, &j),
                None => Ok(()),
            });
            match found {
                Ok(()) => return Ok(()),
                Err(e) if looks == 2 => return Err(e),
                Err(_) => {
                    looks += 1;
                    self.settle(STEP_SETTLE).await;
                    self.check()?;
                }
            }
        }
    }

    /// Requeues of Job `i` (manager object `j`): counted only where `waitForPodsReady` is
    /// on, never past the limit, each leaving a reason; deactivated only once the limit is
    /// reached, then suspended, unclaimed, saying so.
    fn check_requeues(&self, i: usize, j: &Value) -> Result<(), String> {
        let name = job_name(i);
        let q = self.jobs[i].queue();
        let requeues: u32 = annotation(j, REQUEUES)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let deactivated = is_true(j, "Deactivated");
        if !q.pods_ready && (requeues > 0 || deactivated) {
            return Err(format!(
                "Job {name} of queue {} (no waitForPodsReady) has {requeues} counted requeues, deactivated {deactivated}",
                q.name
            ));
        }
        if requeues > READY_LIMIT {
            return Err(format!(
                "Job {name} was requeued {requeues} times, past the limit {READY_LIMIT}"
            ));
        }
        let requeued_reason = condition(j, "Requeued")
            .and_then(|c| c["reason"].as_str())
            .unwrap_or_default();
        if requeues > 0 && requeued_reason.is_empty() {
            return Err(format!(
                "Job {name} was requeued {requeues} times and has no Requeued reason: {}",
                j["status"]["conditions"]
            ));
        }
        if deactivated {
            let reason = condition(j, "Deactivated")
                .and_then(|c| c["reason"].as_str())
                .unwrap_or_default();
            if reason != "RequeuingLimitExceeded"
                || requeues != READY_LIMIT
                || j["spec"]["suspend"] != true
                || !kept_by(j).is_empty()
                || requeued_reason.is_empty()
            {
                return Err(format!(
                    "Job {name} is deactivated (reason {reason:?}) after {requeues} requeues, suspend {}, kept by {:?}, Requeued reason {requeued_reason:?}",
                    j["spec"]["suspend"],
                    kept_by(j)
                ));
            }
        }
        Ok(())
    }

    /// Every worker Job `i` was ever offered to, by the writes to the manager (any answer:
    /// a write whose answer was lost may have landed).
    fn ever_offered(&self, i: usize) -> BTreeSet<String> {
        let name = job_name(i);
        let plural = match self.jobs[i].kind {
            Kind::Job => "jobs",
            Kind::JobSet => "jobsets",
        };
        let mut out = BTreeSet::new();
        for r in self.manager.recorded() {
            if r.method != "PATCH" || !r.uri.contains(&format!("/{plural}/{name}")) {
                continue;
            }
            if let Some(offers) = r
                .body
                .as_ref()
                .and_then(|b| b["metadata"]["annotations"][OFFERED].as_str())
            {
                out.extend(offers.split(',').map(|w| w.trim().to_string()));
            }
        }
        out
    }

    /// Every copy in worker `w`, of either kind.
    fn copies(&self, w: usize) -> Vec<Value> {
        let mut out = self.workers[w].list(JOBS);
        if self.setup.jobsets {
            out.extend(self.workers[w].list(JOBSETS));
        }
        out
    }

    /// Why Job `i` is not done yet, if it is not: ended with its result recorded (or
    /// deleted) and its copies removed.
    fn not_done(&self, i: usize) -> Option<String> {
        let copies: Vec<&str> = self
            .workers
            .iter()
            .enumerate()
            .filter(|(_, api)| {
                api.get(self.jobs[i].kind.path(), NS, &job_name(i))
                    .is_some()
            })
            .map(|(w, _)| WORKERS[w].name)
            .collect();
        let Some(j) = self.manager_job(i) else {
            return (!copies.is_empty())
                .then(|| format!("{}: deleted, copies left in {copies:?}", job_name(i)));
        };
        let result = annotation(&j, RESULT);
        let consistent = match result {
            Some("Succeeded") => is_true(&j, "Complete") || is_true(&j, "Completed"),
            Some("Failed") => is_true(&j, "Failed"),
            // Given up at the requeuing limit (what it must show: `check_requeues`).
            _ => is_true(&j, "Deactivated"),
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
        self.check_settled().await?;
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
                // Every copy of a Job still offered to two workers (one may be gone).
                self.start_copy(i, 0);
                self.start_copy(i, 1);
                self.finish_copy(i, 0, true);
            }
            self.settle(Duration::from_secs(2)).await;
            self.check_settled().await?;
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
    /// Schedules with several queues; Jobs of each queue (research, dev, ready, wide).
    multi_queue: u64,
    per_queue: [u64; QUEUES.len()],
    jobsets: u64,
    /// Jobs deleted by their users (the copies made of them removed).
    deleted: u64,
    /// Requeues counted for pods not Ready in time; Jobs deactivated at the limit.
    requeues: u64,
    deactivated: u64,
    /// Fanout Jobs that ran in two workers at once (before the choice).
    doubled: u64,
}

/// Runs the steps of `steps` whose indices are in `keep` (all when `None`).
async fn run(setup: Setup, steps: &[Step], keep: Option<&[usize]>) -> Result<Ran, String> {
    let mut rig = Rig::start(setup).await;
    let mut done = 0;
    for (i, step) in steps.iter().enumerate() {
        if keep.is_some_and(|k| !k.contains(&i)) {
            continue;
        }
        rig.log
            .push((Instant::now(), format!("step {i}: {step:?}")));
        rig.apply(i, step).await;
        rig.settle(STEP_SETTLE).await;
        if let Err(e) = rig.check_settled().await {
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
        deleted: rig.deleted.len() as u64,
        multi_queue: u64::from(setup.queues.iter().filter(|q| **q).count() > 1),
        ..Default::default()
    };
    for (i, sub) in rig.jobs.iter().enumerate() {
        ran.per_queue[sub.queue] += 1;
        ran.jobsets += u64::from(sub.kind == Kind::JobSet);
        if let Some(j) = rig.manager_job(i) {
            ran.requeues += annotation(&j, REQUEUES)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            ran.deactivated += u64::from(is_true(&j, "Deactivated"));
        }
    }
    // Fanout Jobs whose copies were created in two workers.
    for i in 0..rig.jobs.len() {
        if rig.jobs[i].queue().fanout > 1 {
            let name = job_name(i);
            let created = rig
                .workers
                .iter()
                .filter(|api| {
                    api.recorded().iter().any(|r| {
                        r.method == "POST"
                            && r.status == Some(201)
                            && r.body
                                .as_ref()
                                .is_some_and(|b| b["metadata"]["name"] == name)
                    })
                })
                .count();
            ran.doubled += u64::from(created > 1);
        }
    }
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
async fn run_caught(
    setup: Setup,
    steps: Vec<Step>,
    keep: Option<Vec<usize>>,
) -> Result<Ran, String> {
    match tokio::spawn(async move { run(setup, &steps, keep.as_deref()).await }).await {
        Ok(result) => result,
        Err(e) => Err(format!("panicked: {e}")),
    }
}

/// The first failure of the steps kept (indices into `steps`) in `runs` runs at once: a
/// race may need the load of the others to show.
async fn fails(setup: Setup, steps: &[Step], keep: &[usize], runs: usize) -> Option<String> {
    let all = (0..runs).map(|_| run_caught(setup, steps.to_vec(), Some(keep.to_vec())));
    futures::future::join_all(all)
        .await
        .into_iter()
        .find_map(Result::err)
}

/// The fewest steps (indices into `steps`) found that still fail: chunks of the schedule are
/// removed while it keeps failing, halving the chunk size down to single steps (delta
/// debugging). A live run is not exactly repeatable: a candidate fails if any of `runs`
/// runs of it does.
async fn shrink(setup: Setup, steps: &[Step], runs: usize, budget: usize) -> Vec<usize> {
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
            if fails(setup, steps, &candidate, runs).await.is_some() {
                kept = candidate;
            } else {
                start += chunk;
            }
        }
        chunk /= 2;
    }
    kept
}

async fn report_failure(seed: u64, setup: Setup, steps: &[Step], error: &str) -> String {
    let runs = env_u64("SWITCHYARD_FAULTS_SHRINK_RUNS", 16).max(1) as usize;
    let mut out = format!(
        "schedule seed {seed} failed ({} steps, {setup:?}):\n  {error}\n",
        steps.len()
    );
    let all: Vec<usize> = (0..steps.len()).collect();
    if fails(setup, steps, &all, 2 * runs).await.is_none() {
        out += &format!(
            "not shrunk: it did not fail again in {} runs of it at once (a race; replay the seed \
             with SWITCHYARD_FAULTS_REPEAT=64 to see it again)\n",
            2 * runs
        );
        return out;
    }
    let kept = shrink(setup, steps, runs, 40).await;
    let again = fails(setup, steps, &kept, runs).await;
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
                let (setup, steps) = schedule(seed, len);
                (seed, run_caught(setup, steps, keep).await)
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
                sum.multi_queue += r.multi_queue;
                for (q, n) in r.per_queue.iter().enumerate() {
                    sum.per_queue[q] += n;
                }
                sum.jobsets += r.jobsets;
                sum.deleted += r.deleted;
                sum.requeues += r.requeues;
                sum.deactivated += r.deactivated;
                sum.doubled += r.doubled;
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
         passed: {} steps, {} invariant checks ({} invariants each), {} Jobs run to their end ({} of them deleted), \
         {} leaders killed right after a write, {} leases handed over right after a write ({} of them at once), \
         {} requests served, {} of them answered 409, 429, 500 or 503\n  \
         {} schedules with several queues; Jobs by queue (research, dev, ready, wide) {:?}, {} of them JobSets; \
         {} requeues for pods not Ready in time, {} Jobs deactivated at the limit; {} fanout Jobs created in two workers",
        failed.len(),
        started.elapsed().as_secs_f64(),
        sum.steps,
        sum.checks,
        INVARIANTS,
        sum.jobs,
        sum.deleted,
        sum.crashes,
        sum.hand_overs,
        sum.instant,
        sum.requests,
        sum.errors,
        sum.multi_queue,
        sum.per_queue,
        sum.jobsets,
        sum.requeues,
        sum.deactivated,
        sum.doubled,
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
        let (setup, steps) = schedule(*seed, len);
        let report = report_failure(*seed, setup, &steps, error).await;
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
