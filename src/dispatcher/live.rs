//! The dispatcher against real clusters: watches keep a [`World`], [`plan`] decides, and the
//! executor carries the actions out through `kube::Client`s.
//!
//! One task owns the `World`. Watches (the manager's queued Jobs, DispatchQueues, Namespaces,
//! PriorityClasses; in each worker, the Jobs labelled with our origin) and finished writes
//! arrive on one channel. The leader plans a moment after a change (changes arriving together
//! are planned together), at the earliest deadline, and at least every `tick`; a replica that
//! does not lead keeps its `World` warm and writes nothing.
//!
//! Writes for one Job run in order in one task; tasks for different Jobs run concurrently (up
//! to `concurrency`). Each action's effect is applied to the `World` at once, as if it had
//! succeeded (as kube-scheduler assumes a binding), so the next plan neither repeats it nor
//! hands out the same quota twice. When the writes land, the objects the API server returned
//! replace the assumption; when they fail, the last object the server showed does. Watch
//! events older than our own writes are skipped (by resourceVersion), and events for a Job
//! with writes in flight wait for them to land.
//!
//! The claim is the one write that must not be repeated blindly: it is a merge patch with the
//! Job's resourceVersion as a precondition, so of two dispatchers (a leadership change, a
//! split brain) only one claims a Job; the other gets 409 Conflict, rereads, and sees the claim.

use super::kind::{Kind, Status};
use super::kueue::{KueueObject, WorkerQueues};
use super::ledger::QueueUse;
use super::object::{self, Priorities};
use super::state::State;
use super::*;
use crate::api::dispatch_queue::{DispatchQueue, DispatchQueueStatus};
use crate::api::queue_reason;
use crate::inventory::{Inventory, InventoryStore};
use crate::metrics::{Metrics, QueueLabels, QueueReasonLabels, QueueResourceLabels};
use crate::workers::registry::{WorkerView, Workers};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How the live dispatcher runs.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    pub config: DispatchConfig,
    /// How long after a change the dispatcher plans (changes within it are planned together).
    pub debounce: Duration,
    /// The longest between two plans: inventory changes and deadlines are picked up by then.
    pub tick: Duration,
    /// Jobs whose writes may be in flight at once.
    pub concurrency: usize,
    /// Writes of why Jobs wait (their `Admitted` condition) per second, across all Jobs: a
    /// reason that changes is written before a message that does, the oldest Jobs first; the
    /// rest are written in the next plans. 10,000 Jobs that start waiting for quota at once
    /// take 10,000 / this seconds to all say so, without a burst of writes.
    pub wait_writes_per_second: u32,
    /// The shortest time between two status writes of one DispatchQueue.
    pub queue_status_every: Duration,
    /// Who writes the Events (`reportingInstance`): the pod name.
    pub instance: String,
    /// The longest one Job's writes may take; past it they are abandoned (an unresponsive
    /// worker must not keep the Job from being decided again) and the Job is read afresh.
    pub write_timeout: Duration,
    /// Whether JobSets are dispatched too.
    pub jobsets: JobSets,
}

/// Whether the dispatcher runs JobSets (`jobset.x-k8s.io/v1alpha2`) besides batch/v1 Jobs. In
/// the configuration file: `auto`, `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub enum JobSets {
    /// When the manager's API server serves the JobSet API at start-up (a JobSet CRD installed
    /// later is seen at the next start).
    #[default]
    Auto,
    Enabled,
    Disabled,
}

impl TryFrom<Value> for JobSets {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::Bool(true) => Ok(JobSets::Enabled),
            Value::Bool(false) => Ok(JobSets::Disabled),
            Value::String(s) if s == "auto" => Ok(JobSets::Auto),
            other => Err(format!("jobsets: {other} is not auto, true or false")),
        }
    }
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            config: DispatchConfig::default(),
            debounce: Duration::from_millis(50),
            tick: Duration::from_secs(1),
            concurrency: 64,
            wait_writes_per_second: 50,
            queue_status_every: Duration::from_secs(2),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "switchyard".into()),
            write_timeout: Duration::from_secs(30),
            jobsets: JobSets::Auto,
        }
    }
}

/// What the live dispatcher reads from: the manager cluster, the workers' views and
/// inventories, and whether this replica leads.
pub struct Inputs {
    pub client: kube::Client,
    pub workers: Workers,
    pub leader: watch::Receiver<bool>,
    pub inventory: Arc<InventoryStore>,
    pub metrics: Option<Arc<Metrics>>,
    /// Every write to Jobs and copies holds a guard of this until answered, so that the
    /// Lease is given up only after them (see [`crate::leader::WritesInFlight`]).
    pub writes: crate::leader::WritesInFlight,
}

/// A Job's objects in `client`'s cluster, of its kind, read and written as JSON so that fields
/// this version does not know are kept (the API server may be newer than Switchyard).
fn api_of(client: &kube::Client, key: &JobKey) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), &key.namespace, &key.kind.resource())
}

/// The kinds this dispatcher runs: batch/v1 Job always, JobSet as `options` say (`Auto`: when
/// the manager's API server serves it).
async fn kinds(client: &kube::Client, jobsets: JobSets) -> Vec<Kind> {
    let jobset = match jobsets {
        JobSets::Enabled => true,
        JobSets::Disabled => false,
        JobSets::Auto => {
            let gv = Kind::JobSet.api_version();
            match client.list_api_group_resources(&gv).await {
                Ok(list) => list
                    .resources
                    .iter()
                    .any(|r| r.name == Kind::JobSet.plural()),
                Err(kube::Error::Api(s)) if s.code == 404 => false,
                Err(e) => {
                    tracing::warn!(error = %e, "could not tell whether the manager serves {gv}; JobSets not dispatched until the next start");
                    false
                }
            }
        }
    };
    if jobset {
        tracing::info!("dispatching batch/v1 Jobs and JobSets");
        vec![Kind::Job, Kind::JobSet]
    } else {
        tracing::info!(
            "dispatching batch/v1 Jobs (no JobSet API in the manager, or JobSets disabled)"
        );
        vec![Kind::Job]
    }
}

/// A running dispatcher.
pub struct Handle {
    pub task: JoinHandle<()>,
    /// How many times the dispatcher found itself settled: its first lists and every input
    /// since taken, no write in flight, and its last look (a plan when it leads) decided
    /// nothing new. Tests wait on it to see that something did not happen, instead of
    /// sleeping.
    pub settled: watch::Receiver<u64>,
}

/// Starts the dispatcher; it stops when `stop` turns true.
pub fn start(inputs: Inputs, options: LiveOptions, stop: watch::Receiver<bool>) -> Handle {
    let (settled_tx, settled) = watch::channel(0);
    let task = tokio::spawn(run(inputs, options, stop, settled_tx));
    Handle { task, settled }
}

enum Change<K> {
    Listed(Vec<K>),
    Applied(K),
    Deleted(K),
    /// The watch lists again (it started, or lost its place: a 410 Gone, a failed list): what
    /// it showed may miss changes until the next `Listed`.
    Relisting,
}

enum Input {
    /// The manager's Jobs of a kind, from the watch of `generation` (see
    /// [`Live::watch_jobs`]): a replaced watch's last events are dropped.
    Jobs {
        kind: Kind,
        generation: u64,
        change: Change<Value>,
    },
    Queues(Change<Box<DispatchQueue>>),
    Namespaces(Change<(String, BTreeMap<String, String>)>),
    /// name, value, globalDefault
    Priorities(Change<(String, i32, bool)>),
    Copies {
        cluster: String,
        kind: Kind,
        /// The serial of the watch that saw it (see [`CopyWatch::serial`]).
        serial: u64,
        change: Change<Value>,
    },
    Done(Box<Done>),
    /// A Kueue worker's queues or Workloads changed.
    Kueue {
        cluster: String,
        generation: u64,
        what: KueueObject,
        change: Change<Value>,
    },
}

fn kueue_resource(what: KueueObject) -> kube::api::ApiResource {
    let (kind, plural) = match what {
        KueueObject::LocalQueue => ("LocalQueue", "localqueues"),
        KueueObject::ClusterQueue => ("ClusterQueue", "clusterqueues"),
        KueueObject::Workload => ("Workload", "workloads"),
    };
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", kind),
        plural,
    )
}

/// A Kueue worker's watches, restarted when its client is replaced.
struct KueueWatch {
    generation: u64,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for KueueWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What a Job's writes (or a copy's removal) came to.
#[derive(Default)]
struct Done {
    key: Option<JobKey>,
    /// The Job as the API server last returned it: `Some(None)` when it is gone, `None` when
    /// unknown (every write failed: the last object seen stands).
    job: Option<Option<Value>>,
    /// Copies created (or found), by worker.
    created: Vec<(String, Value)>,
    /// Outcomes to apply once the writes land: writes refused for good, copies removed or
    /// not.
    outcomes: Vec<(Action, Outcome)>,
    /// A copy delete that finished, by (cluster, copy uid).
    deleted: Option<(String, String)>,
    /// A Job read again before removing a copy it was thought not to keep, and found keeping
    /// it after all: newer than the view the removal was decided on.
    fresh: Option<(JobKey, Value)>,
    /// The Job's worker could not say whether its copy is there (by uid): looked at again
    /// after `create_retry_after`, as after a create whose answer was lost.
    unconfirmed: Option<String>,
}

/// Watches `api` and forwards its changes, listed in full after every (re)list.
fn forward<K, F>(
    stream: impl futures::Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send + 'static,
    tx: mpsc::UnboundedSender<Input>,
    what: String,
    wrap: F,
) -> JoinHandle<()>
where
    K: Send + 'static,
    F: Fn(Change<K>) -> Input + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut buffer: Option<Vec<K>> = None;
        let mut said_not_served = false;
        // Said once per list: kube-runtime starts every (re)list with `Init`, and starts
        // again after a list that failed. Nothing is known before the first list anyway.
        let mut relisting = true;
        while let Some(event) = stream.next().await {
            let change = match event {
                Ok(WatchEvent::Init) => {
                    buffer = Some(Vec::new());
                    if relisting {
                        continue;
                    }
                    relisting = true;
                    Change::Relisting
                }
                Ok(WatchEvent::InitApply(k)) => {
                    buffer.get_or_insert_with(Vec::new).push(k);
                    continue;
                }
                Ok(WatchEvent::InitDone) => {
                    said_not_served = false;
                    relisting = false;
                    Change::Listed(buffer.take().unwrap_or_default())
                }
                // The cluster does not serve the API (a CRD not installed there): nothing of
                // it exists, which is a complete list. The watch keeps retrying, so the API
                // is picked up once installed.
                Err(e) if not_served(&e) => {
                    if said_not_served {
                        continue;
                    }
                    said_not_served = true;
                    relisting = false;
                    tracing::info!(watch = %what, "not served there: none listed");
                    Change::Listed(Vec::new())
                }
                Ok(WatchEvent::Apply(k)) => Change::Applied(k),
                Ok(WatchEvent::Delete(k)) => Change::Deleted(k),
                Err(e) => {
                    tracing::warn!(watch = %what, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            if tx.send(wrap(change)).is_err() {
                return;
            }
        }
    })
}

/// Whether a watch failed because the API server does not serve the resource at all (404 on
/// the list).
fn not_served(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

fn to_json(obj: DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

fn map_event<A, B>(event: WatchEvent<A>, f: impl Fn(A) -> B) -> WatchEvent<B> {
    match event {
        WatchEvent::Apply(o) => WatchEvent::Apply(f(o)),
        WatchEvent::Delete(o) => WatchEvent::Delete(f(o)),
        WatchEvent::InitApply(o) => WatchEvent::InitApply(f(o)),
        WatchEvent::Init => WatchEvent::Init,
        WatchEvent::InitDone => WatchEvent::InitDone,
    }
}

fn json_change(event: WatchEvent<DynamicObject>) -> WatchEvent<Value> {
    map_event(event, to_json)
}

/// A worker's copies watch, restarted when its client is replaced.
struct CopyWatch {
    /// The worker client's generation it watches with.
    client_generation: u64,
    /// Which watch this is (its events carry it: those of a watch replaced are dropped).
    serial: u64,
    task: JoinHandle<()>,
    /// Since when the copies it watches are not known (`None`: listed).
    unlisted_since: Option<SystemTime>,
}

impl Drop for CopyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct Synced {
    /// The kinds whose Jobs were listed.
    jobs: BTreeSet<Kind>,
    queues: bool,
    namespaces: bool,
    priorities: bool,
}

struct Ctx {
    client: kube::Client,
    manager_id: String,
    config: DispatchConfig,
    recorder: Recorder,
    metrics: Option<Arc<Metrics>>,
    writes: crate::leader::WritesInFlight,
}

impl Ctx {
    fn count(&self, action: &'static str, result: &'static str) {
        if let Some(m) = &self.metrics {
            m.dispatch_action(action, result);
        }
    }

    /// Publishes an Event on the manager Job, in the background: an Event lost is a line
    /// missing from `kubectl describe`, never a reason to hold a dispatch back.
    fn event(&self, job: &Job, warning: bool, reason: &str, action: &str, note: String) {
        let recorder = self.recorder.clone();
        let reference = ObjectReference {
            api_version: Some(job.kind().api_version()),
            kind: Some(job.kind().name().into()),
            name: Some(job.key.name.clone()),
            namespace: Some(job.key.namespace.clone()),
            uid: Some(job.uid.clone()),
            ..Default::default()
        };
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            // events.k8s.io/v1 caps the note at 1 kB.
            note: Some(crate::text::shorten(&note, 1000)),
            action: action.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "event not recorded");
            }
        });
    }
}

struct Live {
    world: World,
    options: LiveOptions,
    ctx: Arc<Ctx>,
    tx: mpsc::UnboundedSender<Input>,
    /// The manager Jobs as the API server last showed them (the copies are made from these).
    raw: HashMap<JobKey, Arc<Value>>,
    namespaces: HashMap<String, Arc<BTreeMap<String, String>>>,
    priorities: Priorities,
    priority_classes: BTreeMap<String, (i32, bool)>,
    synced: Synced,
    views: Arc<BTreeMap<String, WorkerView>>,
    /// By worker and kind.
    copy_watches: HashMap<(String, Kind), CopyWatch>,
    /// The serial of the last copy watch started (see [`CopyWatch::serial`]).
    copy_watch_serial: u64,
    /// Kueue workers' LocalQueues, ClusterQueues and Workloads watches, by worker.
    kueue_watches: HashMap<String, KueueWatch>,
    /// What each Kueue worker's watches show.
    kueue_queues: HashMap<String, Arc<WorkerQueues>>,
    /// The kinds dispatched.
    kinds: Vec<Kind>,
    in_flight: HashSet<JobKey>,
    /// The latest watch event of a Job whose writes are in flight (`None`: deleted).
    stashed: HashMap<JobKey, Option<Value>>,
    /// The resourceVersion our last write of a Job returned.
    written: HashMap<JobKey, u64>,
    deleting: HashSet<(String, String)>,
    inventory: Arc<InventoryStore>,
    inventory_seen: Option<Arc<Inventory>>,
    semaphore: Arc<Semaphore>,
    queue_status: HashMap<String, (DispatchQueueStatus, SystemTime)>,
    /// Writes of why Jobs wait that may be sent now (a token bucket, see
    /// [`LiveOptions::wait_writes_per_second`]), and when it was last filled.
    wait_tokens: f64,
    wait_tokens_at: Instant,
    /// When each waiting Job's reason was last written (by uid).
    wait_written: HashMap<String, SystemTime>,
    /// The quota series last published, to drop those of resources and queues that went.
    quota_series: HashSet<(String, String)>,
    /// Copies (worker, copy uid) the workers' watches showed deleted lately: a create's late
    /// answer must not bring one back.
    gone_copies: HashSet<(String, String)>,
    /// Manager Jobs (by uid) the watch showed deleted lately: a late read must not bring one
    /// back (see [`Live::read_again`]).
    gone_jobs: HashSet<String>,
    /// The highest resourceVersion the watch of each kind of manager Job has shown since it
    /// last listed them: a Job read at or before it that the watch does not show is gone.
    watched_to: HashMap<Kind, u64>,
    /// Writes and removals the last look started.
    decided: usize,
    /// The watches of the manager's Jobs, one per kind, and which start of them they are.
    job_watches: Vec<JoinHandle<()>>,
    jobs_generation: u64,
}

async fn run(
    inputs: Inputs,
    options: LiveOptions,
    mut stop: watch::Receiver<bool>,
    settled: watch::Sender<u64>,
) {
    let Inputs {
        client,
        mut workers,
        mut leader,
        inventory,
        metrics,
        writes,
    } = inputs;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reporter = Reporter {
        controller: "switchyard-dispatcher".into(),
        instance: Some(options.instance.clone()),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        manager_id: options.config.manager_id.clone(),
        config: options.config.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
        writes,
    });
    let kinds = kinds(&client, options.jobsets).await;
    let sources = watch_manager(&client, &tx);
    let mut live = Live::new(options, ctx, tx, inventory, kinds);
    live.watch_jobs();
    live.sync_workers(&workers);
    let mut leading = *leader.borrow();
    let mut workers_open = true;
    let mut leader_open = true;
    let mut next = Instant::now();
    tracing::info!(manager_id = %live.ctx.manager_id, "dispatcher started");
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            input = rx.recv() => {
                let Some(input) = input else { break };
                live.apply(input);
                // Take whatever else arrived, so one plan sees it all.
                while let Ok(input) = rx.try_recv() {
                    live.apply(input);
                }
                next = next.min(Instant::now() + live.options.debounce);
            }
            open = workers.changed(), if workers_open => {
                workers_open = open;
                live.sync_workers(&workers);
                next = next.min(Instant::now() + live.options.debounce);
            }
            open = leader.changed(), if leader_open => {
                leader_open = open.is_ok();
                let now_leading = *leader.borrow();
                if now_leading && !leading {
                    tracing::info!("leading: listing the manager's Jobs and the workers' copies afresh, then dispatching");
                    // No admission from what the watches showed while following: see
                    // `Live::watch_jobs`. The copies too: a copy the old leader created a
                    // moment ago may not have reached this replica's watch, and its pods use
                    // quota (its queues wait, `QuotaNotCounted`, until the lists are in).
                    // Deadlines and waits are recomputed from the objects.
                    live.watch_jobs();
                    live.copy_watches.clear();
                    live.sync_workers_now();
                    live.world.touch_all();
                    next = Instant::now();
                } else if !now_leading && leading {
                    tracing::info!("no longer leading: dispatching stops");
                }
                leading = now_leading;
            }
            _ = tokio::time::sleep_until(next) => {
                next = live.tick(leading);
                if live.settled() && rx.is_empty() {
                    settled.send_modify(|n| *n += 1);
                }
            }
        }
    }
    for s in sources.iter().chain(&live.job_watches) {
        s.abort();
    }
    live.copy_watches.clear();
    tracing::info!("dispatcher stopped");
}

/// The watches on the manager besides its Jobs' ([`Live::watch_jobs`]): the DispatchQueues,
/// the Namespaces and the PriorityClasses, each forwarded to the dispatcher's channel.
fn watch_manager(client: &kube::Client, tx: &mpsc::UnboundedSender<Input>) -> Vec<JoinHandle<()>> {
    let mut sources = Vec::new();
    sources.push(forward(
        watcher::watcher(
            Api::<DispatchQueue>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .map(|e| e.map(|ev| map_event(ev, Box::new))),
        tx.clone(),
        "dispatchqueues".into(),
        Input::Queues,
    ));
    sources.push(forward(
        watcher::watcher(
            Api::<kube::core::PartialObjectMeta<Namespace>>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|ev| {
                map_event(ev, |ns| {
                    (
                        ns.metadata.name.unwrap_or_default(),
                        ns.metadata.labels.unwrap_or_default(),
                    )
                })
            })
        }),
        tx.clone(),
        "namespaces".into(),
        Input::Namespaces,
    ));
    sources.push(forward(
        watcher::watcher(
            Api::<PriorityClass>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .map(|e| {
            e.map(|ev| {
                map_event(ev, |p: PriorityClass| {
                    (
                        p.metadata.name.unwrap_or_default(),
                        p.value,
                        p.global_default == Some(true),
                    )
                })
            })
        }),
        tx.clone(),
        "priorityclasses".into(),
        Input::Priorities,
    ));

    sources
}

impl Live {
    fn new(
        options: LiveOptions,
        ctx: Arc<Ctx>,
        tx: mpsc::UnboundedSender<Input>,
        inventory: Arc<InventoryStore>,
        kinds: Vec<Kind>,
    ) -> Self {
        let concurrency = options.concurrency.max(1);
        Live {
            world: World::new(options.config.clone()),
            options,
            ctx,
            tx,
            raw: HashMap::new(),
            namespaces: HashMap::new(),
            priorities: Priorities::default(),
            priority_classes: BTreeMap::new(),
            synced: Synced::default(),
            views: Arc::new(BTreeMap::new()),
            copy_watches: HashMap::new(),
            copy_watch_serial: 0,
            kueue_watches: HashMap::new(),
            kueue_queues: HashMap::new(),
            kinds,
            in_flight: HashSet::new(),
            stashed: HashMap::new(),
            written: HashMap::new(),
            deleting: HashSet::new(),
            inventory,
            inventory_seen: None,
            semaphore: Arc::new(Semaphore::new(concurrency)),
            queue_status: HashMap::new(),
            wait_tokens: 0.0,
            wait_tokens_at: Instant::now(),
            wait_written: HashMap::new(),
            quota_series: HashSet::new(),
            gone_copies: HashSet::new(),
            gone_jobs: HashSet::new(),
            watched_to: HashMap::new(),
            decided: 0,
            job_watches: Vec::new(),
            jobs_generation: 0,
        }
    }

    /// (Re)starts the watches of the manager's queued Jobs; nothing is planned until each
    /// kind is listed again.
    ///
    /// A replica that takes the lead calls this before its first admission. Quota is
    /// counted from the claims the manager's Jobs show, and the claims the old leader wrote
    /// last may not have reached this replica's watch yet: a watch is only eventually up to
    /// date, and the Lease can pass at once (a leader that gives it up on SIGTERM), so the
    /// new leader would admit into quota the old one had just handed out. Each claim is
    /// conditional on its own Job's resourceVersion, which keeps one Job from being claimed
    /// twice but not two Jobs from sharing the last room. The watcher's initial list carries
    /// no resourceVersion (`ListSemantic::MostRecent`), which kube-apiserver serves as a
    /// consistent read: it shows every write committed before the list, so every claim the
    /// old leader made before it released the Lease, which happened before this replica
    /// took it. The watch then goes on from that list's resourceVersion, and its list
    /// replaces whatever this replica held about the Jobs. A fresh watch is simpler than a
    /// one-off list next to the running watch: that watch's events older than the list
    /// could still come after it and undo it. It costs one list per leadership gained;
    /// while following, and while leading, the watch runs as before.
    ///
    /// What this cannot see is a write of the old leader still in flight, sent before it
    /// stepped down and landing after this list: a claim of another Job could then share
    /// the last room with one of ours. The Lease does not fence writes to Jobs (kube-apiserver
    /// has no precondition across objects). After failed renewals the lease passes
    /// `leaseDuration` − `renewDeadline` after the old leader stopped deciding, which its
    /// writes in flight usually land within; a Lease given up on SIGTERM passes at once, and
    /// the old leader does not wait for its writes in flight first (docs/dispatcher.md).
    fn watch_jobs(&mut self) {
        for w in self.job_watches.drain(..) {
            w.abort();
        }
        self.jobs_generation += 1;
        self.synced.jobs.clear();
        self.world.state.jobs_synced = false;
        let generation = self.jobs_generation;
        for &kind in &self.kinds {
            let jobs: Api<DynamicObject> = Api::all_with(self.ctx.client.clone(), &kind.resource());
            let cfg = watcher::Config::default()
                .labels(crate::wellknown::QUEUE_LABEL)
                .list_semantic(watcher::ListSemantic::MostRecent);
            self.job_watches.push(forward(
                watcher::watcher(jobs, cfg)
                    .default_backoff()
                    .map(|e| e.map(json_change)),
                self.tx.clone(),
                format!("manager {}", kind.plural()),
                move |change| Input::Jobs {
                    kind,
                    generation,
                    change,
                },
            ));
        }
    }

    /// Plans when leading and ready; returns when to look again.
    fn tick(&mut self, leading: bool) -> Instant {
        tracing::trace!(leading, ready = self.ready(), "tick");
        self.decided = 0;
        let wake = if leading && self.ready() {
            self.plan_and_execute()
        } else {
            None
        };
        let tick = Instant::now() + self.options.tick;
        match wake {
            Some(w) => {
                // Due already (the pass let room go that the next one admits into): soon,
                // and the dispatcher is not settled until that pass ran.
                let d = w.duration_since(SystemTime::now()).unwrap_or_default();
                if d.is_zero() {
                    self.decided += 1;
                }
                tick.min(Instant::now() + d.max(Duration::from_millis(10)))
            }
            None => tick,
        }
    }

    /// The first lists taken, nothing in flight, and the last look decided nothing new. (A
    /// replica still waiting for its first lists has decided nothing because it knows
    /// nothing yet: that is not settled.)
    fn settled(&self) -> bool {
        self.ready() && self.decided == 0 && self.in_flight.is_empty() && self.deleting.is_empty()
    }

    fn ready(&self) -> bool {
        self.jobs_synced() && self.synced.queues && self.synced.namespaces && self.synced.priorities
    }

    /// Every kind's Jobs listed.
    fn jobs_synced(&self) -> bool {
        self.kinds.iter().all(|k| self.synced.jobs.contains(k))
    }

    fn apply(&mut self, input: Input) {
        if !self.ready() {
            tracing::debug!(
                jobs = self.jobs_synced(),
                queues = self.synced.queues,
                namespaces = self.synced.namespaces,
                priorities = self.synced.priorities,
                "waiting for the first lists"
            );
        }
        match input {
            Input::Jobs {
                kind,
                generation,
                change,
            } => {
                if generation == self.jobs_generation {
                    self.jobs_changed(kind, change);
                }
            }
            Input::Queues(change) => self.queues_changed(change),
            Input::Namespaces(change) => self.namespaces_changed(change),
            Input::Priorities(change) => self.priorities_changed(change),
            Input::Copies {
                cluster,
                kind,
                serial,
                change,
            } => self.copies_changed(&cluster, kind, serial, change),
            Input::Done(done) => self.writes_landed(*done),
            Input::Kueue {
                cluster,
                generation,
                what,
                change,
            } => self.kueue_changed(&cluster, generation, what, change),
        }
    }

    fn queues_changed(&mut self, change: Change<Box<DispatchQueue>>) {
        match change {
            // What was listed stays until listed again (see `jobs_changed`).
            Change::Relisting => {}
            Change::Listed(all) => {
                let names: HashSet<String> =
                    all.iter().filter_map(|q| q.metadata.name.clone()).collect();
                let gone: Vec<String> = self
                    .world
                    .state
                    .queues
                    .keys()
                    .filter(|n| !names.contains(*n))
                    .cloned()
                    .collect();
                for n in gone {
                    self.world.remove_queue(&n);
                }
                for q in &all {
                    if let Some(q) = object::parse_queue(q) {
                        self.world.upsert_queue(q);
                    }
                }
                self.synced.queues = true;
            }
            Change::Applied(q) => {
                if let Some(q) = object::parse_queue(&q) {
                    self.world.upsert_queue(q);
                }
            }
            Change::Deleted(q) => {
                if let Some(n) = &q.metadata.name {
                    self.world.remove_queue(n);
                    self.queue_status.remove(n);
                }
            }
        }
        self.world.touch_all();
    }

    /// A Namespace's labels changed: its queued Jobs are read again (the queues'
    /// namespaceSelectors see the new labels).
    fn namespaces_changed(&mut self, change: Change<(String, BTreeMap<String, String>)>) {
        let mut touched = Vec::new();
        match change {
            Change::Relisting => {}
            Change::Listed(all) => {
                self.namespaces = all.into_iter().map(|(n, l)| (n, Arc::new(l))).collect();
                touched.extend(self.namespaces.keys().cloned());
                self.synced.namespaces = true;
            }
            Change::Applied((n, l)) => {
                if self.namespaces.get(&n).is_none_or(|old| **old != l) {
                    self.namespaces.insert(n.clone(), Arc::new(l));
                    touched.push(n);
                }
            }
            Change::Deleted((n, _)) => {
                self.namespaces.remove(&n);
                touched.push(n);
            }
        }
        let touched: HashSet<String> = touched.into_iter().collect();
        self.reparse(|k| touched.contains(&k.namespace));
    }

    /// The PriorityClasses changed: every Job is read again (its priority may have).
    fn priorities_changed(&mut self, change: Change<(String, i32, bool)>) {
        match change {
            Change::Relisting => {}
            Change::Listed(all) => {
                self.priority_classes = all.into_iter().map(|(n, v, d)| (n, (v, d))).collect();
                self.synced.priorities = true;
            }
            Change::Applied((n, v, d)) => {
                self.priority_classes.insert(n, (v, d));
            }
            Change::Deleted((n, _, _)) => {
                self.priority_classes.remove(&n);
            }
        }
        let priorities = Priorities {
            by_name: self
                .priority_classes
                .iter()
                .map(|(n, (v, _))| (n.clone(), *v))
                .collect(),
            global_default: self
                .priority_classes
                .values()
                .filter(|(_, d)| *d)
                .map(|(v, _)| *v)
                .max(),
        };
        if priorities != self.priorities {
            self.priorities = priorities;
            self.reparse(|_| true);
        }
    }

    /// Reads the Jobs selected again (their Namespace's labels or priorities changed).
    fn reparse(&mut self, select: impl Fn(&JobKey) -> bool) {
        let keys: Vec<JobKey> = self.raw.keys().filter(|k| select(k)).cloned().collect();
        for k in keys {
            if self.in_flight.contains(&k) {
                continue;
            }
            if let Some(raw) = self.raw.get(&k).cloned() {
                self.put_job(k.kind, raw);
            }
        }
    }

    fn put_job(&mut self, kind: Kind, raw: Arc<Value>) {
        let Some(key) = object::job_key(kind, &raw) else {
            return;
        };
        let labels = self.namespaces.get(&key.namespace).cloned();
        match object::parse_job(kind, &raw, labels, &self.priorities) {
            Ok(job) => {
                self.world.upsert_job(job);
                self.raw.insert(key, raw);
            }
            Err(why) => {
                tracing::warn!(job = %key, %why, "Job ignored");
                self.forget_job(&key);
            }
        }
    }

    fn forget_job(&mut self, key: &JobKey) {
        if let Some(job) = self.world.remove_job(key) {
            self.wait_written.remove(&job.uid);
        }
        self.raw.remove(key);
        self.written.remove(key);
    }

    fn jobs_changed(&mut self, kind: Kind, change: Change<Value>) {
        match change {
            // The Jobs as last seen stay: a claim on a stale Job is refused (each is
            // conditional on the Job's resourceVersion), the leader knows its own claims from
            // its writes, and a replica that takes the lead lists them afresh (`watch_jobs`).
            Change::Relisting => {}
            Change::Listed(all) => {
                // Not the highest ever: a list starts the count again (after an API server's
                // store was restored, resourceVersions go back).
                let to = all.iter().filter_map(object::resource_version).max();
                self.watched_to.insert(kind, to.unwrap_or(0));
                let listed: HashSet<JobKey> = all
                    .iter()
                    .filter_map(|o| object::job_key(kind, o))
                    .collect();
                let gone: Vec<JobKey> = self
                    .raw
                    .keys()
                    .filter(|k| k.kind == kind && !listed.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    self.job_event(k, None);
                }
                for obj in all {
                    if let Some(k) = object::job_key(kind, &obj) {
                        self.job_event(k, Some(obj));
                    }
                }
                self.synced.jobs.insert(kind);
                self.world.state.jobs_synced = self.jobs_synced();
            }
            Change::Applied(obj) => {
                self.watched(kind, &obj);
                if let Some(k) = object::job_key(kind, &obj) {
                    self.job_event(k, Some(obj));
                }
            }
            Change::Deleted(obj) => {
                self.watched(kind, &obj);
                if let Some(k) = object::job_key(kind, &obj) {
                    self.job_event(k, None);
                }
            }
        }
    }

    fn watched(&mut self, kind: Kind, obj: &Value) {
        if let Some(rv) = object::resource_version(obj) {
            let to = self.watched_to.entry(kind).or_insert(0);
            *to = (*to).max(rv);
        }
    }

    fn job_event(&mut self, key: JobKey, obj: Option<Value>) {
        if self.in_flight.contains(&key) {
            self.stashed.insert(key, obj);
            return;
        }
        match obj {
            Some(obj) => {
                if object::newer(&obj, self.written.get(&key).copied()) {
                    self.put_job(key.kind, Arc::new(obj));
                }
            }
            None => {
                if let Some(uid) = self
                    .raw
                    .get(&key)
                    .and_then(|raw| object::str_at(raw, "/metadata/uid"))
                {
                    note_gone(&mut self.gone_jobs, uid.to_string());
                }
                self.forget_job(&key)
            }
        }
    }

    fn copies_changed(&mut self, cluster: &str, kind: Kind, serial: u64, change: Change<Value>) {
        let Some(w) = self.copy_watches.get_mut(&(cluster.to_string(), kind)) else {
            return;
        };
        if w.serial != serial {
            return;
        }
        match change {
            // A copy created while the watch lost its place may be missing from what it
            // showed: the worker's copies are unknown until listed again, as before the first
            // list (a Job requeued from it is not started elsewhere meanwhile).
            Change::Relisting => {
                w.unlisted_since.get_or_insert_with(SystemTime::now);
                self.sync_workers_now();
            }
            Change::Listed(all) => {
                w.unlisted_since = None;
                let copies = all
                    .iter()
                    .filter_map(|o| remote::parse_copy(kind, cluster, o))
                    .collect();
                self.world.replace_copies(cluster, kind, copies);
                self.sync_workers_now();
            }
            Change::Applied(obj) => {
                if let Some(c) = remote::parse_copy(kind, cluster, &obj) {
                    self.world.upsert_copy(c);
                }
            }
            Change::Deleted(obj) => {
                if let Some(c) = remote::parse_copy(kind, cluster, &obj) {
                    note_gone(&mut self.gone_copies, (cluster.to_string(), c.uid.clone()));
                    self.world.forget_copy(cluster, &c.origin_uid, &c.uid);
                }
            }
        }
    }

    /// A Kueue worker's LocalQueues, ClusterQueues or Workloads changed: the worker's view
    /// of them follows, and the Jobs whose copies' Workloads changed are looked at again.
    fn kueue_changed(
        &mut self,
        cluster: &str,
        generation: u64,
        what: KueueObject,
        change: Change<Value>,
    ) {
        if self
            .kueue_watches
            .get(cluster)
            .is_none_or(|w| w.generation != generation)
        {
            return;
        }
        let queues = Arc::make_mut(self.kueue_queues.entry(cluster.to_string()).or_default());
        let mut workloads_changed = Vec::new();
        match change {
            // Headroom read from the last list stays until listed again.
            Change::Relisting => {}
            Change::Listed(all) => {
                queues.clear(what);
                for obj in &all {
                    workloads_changed.extend(queues.apply(what, obj, true));
                }
            }
            Change::Applied(obj) => workloads_changed.extend(queues.apply(what, &obj, true)),
            Change::Deleted(obj) => workloads_changed.extend(queues.apply(what, &obj, false)),
        }
        let touched: Vec<JobKey> = self
            .world
            .state
            .copy_uids_in_any(cluster)
            .filter(|(copy_uid, _)| workloads_changed.iter().any(|u| u == copy_uid))
            .filter_map(|(_, origin)| self.world.state.job_by_uid(origin).map(|j| j.key.clone()))
            .collect();
        for key in touched {
            self.world.touch(&key);
        }
        self.sync_workers_now();
    }

    /// Starts (or restarts, for a new client) a Kueue worker's watches on its LocalQueues,
    /// ClusterQueues and Workloads, or stops them when it runs no Kueue or has no client.
    fn watch_kueue(&mut self, name: &str, view: &WorkerView) {
        match (
            &view.client,
            view.kueue.is_some(),
            self.kueue_watches.get(name),
        ) {
            (Some(client), true, w) if w.is_none_or(|w| w.generation != view.client_generation) => {
                let generation = view.client_generation;
                let tasks = KueueObject::ALL
                    .into_iter()
                    .map(|what| {
                        let api: Api<DynamicObject> =
                            Api::all_with(client.clone(), &kueue_resource(what));
                        let cluster = name.to_string();
                        forward(
                            watcher::watcher(api, watcher::Config::default())
                                .default_backoff()
                                .map(|e| e.map(json_change)),
                            self.tx.clone(),
                            format!("{} in worker {name}", kueue_resource(what).plural),
                            move |change| Input::Kueue {
                                cluster: cluster.clone(),
                                generation,
                                what,
                                change,
                            },
                        )
                    })
                    .collect();
                self.kueue_queues.remove(name);
                self.kueue_watches
                    .insert(name.to_string(), KueueWatch { generation, tasks });
            }
            (Some(_), true, _) => {}
            _ => {
                self.kueue_watches.remove(name);
                self.kueue_queues.remove(name);
            }
        }
    }

    fn sync_workers_now(&mut self) {
        let views = self.views.clone();
        self.set_workers(&views);
    }

    fn sync_workers(&mut self, workers: &Workers) {
        let views = workers.snapshot();
        self.views = views.clone();
        self.set_workers(&views);
    }

    /// Brings the World's workers and the copies watches in line with the workers' views.
    fn set_workers(&mut self, views: &BTreeMap<String, WorkerView>) {
        let gone: Vec<String> = self
            .world
            .state
            .workers
            .keys()
            .filter(|n| !views.contains_key(*n))
            .cloned()
            .collect();
        for n in gone {
            self.world.remove_worker(&n);
            self.copy_watches.retain(|(c, _), _| *c != n);
            self.kueue_watches.remove(&n);
            self.kueue_queues.remove(&n);
        }
        let kinds = self.kinds.clone();
        for (name, view) in views {
            for &kind in &kinds {
                self.watch_copies(name, kind, view);
            }
            self.watch_kueue(name, view);
            // The earliest of its kinds' (a kind not watched yet: now).
            let copies_unlisted_since = self
                .kinds
                .iter()
                .filter_map(|&k| match self.copy_watches.get(&(name.clone(), k)) {
                    Some(w) => w.unlisted_since,
                    None => Some(SystemTime::now()),
                })
                .min();
            self.world.upsert_worker(Worker {
                name: name.clone(),
                connected: view.connected,
                disconnected_since: view.disconnected_since,
                copies_unlisted_since,
                message: view.message.clone(),
                kueue: view.kueue.clone(),
                queues: self
                    .kueue_queues
                    .get(name.as_str())
                    .cloned()
                    .unwrap_or_default(),
            });
        }
    }

    /// Starts (or restarts, for a new client) the watch on a worker's copies of `kind`, or
    /// stops it when the worker has no client. A worker that does not serve the kind's API
    /// holds none of its copies: its watch counts as listed, empty.
    fn watch_copies(&mut self, name: &str, kind: Kind, view: &WorkerView) {
        let id = (name.to_string(), kind);
        match (&view.client, self.copy_watches.get(&id)) {
            (Some(client), w)
                if w.is_none_or(|w| w.client_generation != view.client_generation) =>
            {
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
                // A consistent list (see `Live::watch_jobs`): a new leader counts the copies
                // that run, not what a cache showed a moment ago.
                let cfg = watcher::Config::default()
                    .labels(&format!("{ORIGIN_LABEL}={}", self.ctx.manager_id))
                    .list_semantic(watcher::ListSemantic::MostRecent);
                let cluster = name.to_string();
                self.copy_watch_serial += 1;
                let serial = self.copy_watch_serial;
                let task = forward(
                    watcher::watcher(api, cfg)
                        .default_backoff()
                        .map(|e| e.map(json_change)),
                    self.tx.clone(),
                    format!("{} in worker {name}", kind.plural()),
                    move |change| Input::Copies {
                        cluster: cluster.clone(),
                        kind,
                        serial,
                        change,
                    },
                );
                self.copy_watches.insert(
                    id,
                    CopyWatch {
                        client_generation: view.client_generation,
                        serial,
                        task,
                        unlisted_since: Some(SystemTime::now()),
                    },
                );
            }
            (None, Some(_)) => {
                self.copy_watches.remove(&id);
            }
            _ => {}
        }
    }

    fn refresh_inventory(&mut self) {
        let snapshot = self.inventory.snapshot();
        if self
            .inventory_seen
            .as_ref()
            .is_none_or(|seen| !Arc::ptr_eq(seen, &snapshot))
        {
            self.inventory_seen = Some(snapshot.clone());
            self.world.set_inventory(snapshot);
        }
    }

    /// Decides, assumes the decisions, and starts their writes. Returns when to plan again.
    fn plan_and_execute(&mut self) -> Option<SystemTime> {
        self.refresh_inventory();
        let now = SystemTime::now();
        let started = std::time::Instant::now();
        tracing::trace!(jobs = self.world.state.jobs.len(), "planning");
        let plan = plan(&mut self.world, now);
        if let Some(m) = &self.ctx.metrics {
            m.dispatch_plan_duration
                .observe(started.elapsed().as_secs_f64());
        }
        tracing::debug!(
            jobs = self.world.state.jobs.len(),
            actions = plan.actions.len(),
            waiting = ?plan.waiting.values().collect::<Vec<_>>(),
            "planned"
        );
        let mut groups: Vec<(JobKey, Vec<Action>)> = Vec::new();
        let mut index: HashMap<JobKey, usize> = HashMap::new();
        for action in plan.actions {
            if let Action::DeleteCopy { .. } = action {
                self.delete_copy(action);
                continue;
            }
            let Some(key) = action.job().cloned() else {
                continue;
            };
            let refused = self
                .world
                .state
                .jobs
                .get(&key)
                .and_then(|j| self.world.state.refused_write(j));
            if refused == Some(action.name()) {
                // Refused for good while the Job was as it is: reported once, not repeated.
                apply(&mut self.world, &action, Outcome::NotCarriedOut, now);
                continue;
            }
            if self.in_flight.contains(&key) {
                // Decided on an assumption still being written: decided again once it lands.
                apply(&mut self.world, &action, Outcome::NotCarriedOut, now);
                continue;
            }
            match index.get(&key) {
                Some(&i) => groups[i].1.push(action),
                None => {
                    index.insert(key.clone(), groups.len());
                    groups.push((key, vec![action]));
                }
            }
        }
        self.write_wait_reasons(&plan.waiting, &plan.job_waiting, now, &mut groups, &index);
        for (key, actions) in groups {
            self.execute(key, actions, now);
        }
        self.write_queue_statuses(now);
        plan.wake_at
    }

    /// Says why Jobs wait: every pending Job's `Admitted` condition gets its reason (its own,
    /// or its class's), written when the reason changes, and when only the message does at
    /// most every `wait_rewrite_after`; all within `wait_writes_per_second`. A Job in back-off
    /// keeps the message that says when its next attempt is. Publishes how many Jobs wait,
    /// per queue and kind of reason.
    fn write_wait_reasons(
        &mut self,
        waiting: &BTreeMap<ClassKey, WaitReason>,
        job_waiting: &BTreeMap<JobKey, WaitReason>,
        now: SystemTime,
        groups: &mut Vec<(JobKey, Vec<Action>)>,
        index: &HashMap<JobKey, usize>,
    ) {
        let rate = f64::from(self.options.wait_writes_per_second.max(1));
        let filled = Instant::now();
        let elapsed = filled.duration_since(self.wait_tokens_at).as_secs_f64();
        self.wait_tokens = (self.wait_tokens + elapsed * rate).min(rate);
        self.wait_tokens_at = filled;

        let mut counts: BTreeMap<&str, BTreeMap<&'static str, i64>> = BTreeMap::new();
        let mut writes: Vec<WaitWrite> = Vec::new();
        for (class, ranks) in self.world.ledger.pending_classes() {
            for rank in ranks {
                let key = &rank.key;
                let Some(job) = self.world.state.jobs.get(key) else {
                    continue;
                };
                if self.in_flight.contains(key) || index.contains_key(key) {
                    continue;
                }
                let Some((category, desired)) =
                    self.wait_reason(job, waiting.get(class), job_waiting.get(key), now)
                else {
                    // Not looked at in this pass (its class was admitted up to it).
                    continue;
                };
                *counts
                    .entry(job.queue.as_str())
                    .or_default()
                    .entry(category)
                    .or_insert(0) += 1;
                let Some(desired) = desired else {
                    continue;
                };
                if let Some(write) = self.wait_write(job, desired, writes.len(), now) {
                    writes.push(write);
                }
            }
        }
        self.publish_waiting(&counts);
        // New reasons first, then refreshed messages; each in admission order.
        writes.sort_by_key(|w| (!w.new_reason, w.rank));
        for w in writes {
            if self.wait_tokens < 1.0 {
                break;
            }
            self.wait_tokens -= 1.0;
            let Some(uid) = self.world.state.jobs.get(&w.job).map(|j| j.uid.clone()) else {
                continue;
            };
            self.wait_written.insert(uid, now);
            groups.push((
                w.job.clone(),
                vec![Action::Wait {
                    job: w.job,
                    reason: w.why.reason,
                    message: w.why.message,
                }],
            ));
        }
    }

    /// The kind of reason a pending Job waits for, and the reason to write (`None`: leave the
    /// Job's condition as it is); `None` when the pass did not look at it.
    fn wait_reason(
        &self,
        job: &Job,
        class_waits: Option<&WaitReason>,
        job_waits: Option<&WaitReason>,
        now: SystemTime,
    ) -> Option<(&'static str, Option<WaitReason>)> {
        if let Some(w) = job_waits {
            return Some((wait_category(w.reason), Some(w.clone())));
        }
        if self.world.state.refused_write(job).is_some() {
            // Said in an Event; nothing more is written until the Job changes.
            return Some(("Backoff", None));
        }
        if job.backing_off(now) || self.world.state.still_running(job) {
            // The requeue's message says when the next attempt is: kept, unless the Job does
            // not say it waits at all.
            let says_waiting = job
                .condition(condition::ADMITTED)
                .is_some_and(|c| c.status == "False");
            let desired = (!says_waiting).then(|| WaitReason {
                reason: reason::BACKOFF,
                message: match job.requeue_after {
                    Some(t) if t > now => format!(
                        "requeued ({} so far), next attempt not before {}",
                        job.requeues,
                        rfc3339(t)
                    ),
                    _ => "waiting for its earlier copy to be removed".to_string(),
                },
            });
            return Some(("Backoff", desired));
        }
        class_waits.map(|w| (wait_category(w.reason), Some(w.clone())))
    }

    /// The write of `why` on the Job, unless its condition says it already, or says the same
    /// reason and was written within `wait_rewrite_after`.
    fn wait_write(
        &self,
        job: &Job,
        why: WaitReason,
        rank: usize,
        now: SystemTime,
    ) -> Option<WaitWrite> {
        let current = job.condition(condition::ADMITTED);
        let same_reason =
            current.is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some(why.reason));
        let same_message =
            same_reason && current.and_then(|c| c.message.as_deref()) == Some(&why.message);
        let every = self.world.config.wait_rewrite_after;
        let recent = self
            .wait_written
            .get(&job.uid)
            .is_some_and(|t| *t + every > now);
        if same_message || (same_reason && recent) {
            return None;
        }
        Some(WaitWrite {
            new_reason: !same_reason,
            rank,
            job: job.key.clone(),
            why,
        })
    }

    /// `switchyard_queue_waiting_jobs`, per queue and kind of reason.
    fn publish_waiting(&self, counts: &BTreeMap<&str, BTreeMap<&'static str, i64>>) {
        let Some(m) = &self.ctx.metrics else {
            return;
        };
        for q in self.world.state.queues.keys() {
            let per = counts.get(q.as_str());
            for category in WAIT_CATEGORIES {
                let n = per.and_then(|p| p.get(category)).copied().unwrap_or(0);
                m.queue_waiting
                    .get_or_create(&QueueReasonLabels {
                        queue: q.clone(),
                        reason: category.to_string(),
                    })
                    .set(n);
            }
        }
    }

    /// Assumes the actions' effects and starts writing them.
    fn execute(&mut self, key: JobKey, actions: Vec<Action>, now: SystemTime) {
        let (Some(before), Some(raw)) =
            (self.world.state.jobs.get(&key).cloned(), self.raw.get(&key))
        else {
            return;
        };
        let raw = raw.clone();
        let mut clients = HashMap::new();
        for a in &actions {
            apply(&mut self.world, a, Outcome::Started, now);
            let clusters: Vec<&String> = match a {
                Action::Dispatch { cluster, .. } | Action::CreateCopy { cluster, .. } => {
                    vec![cluster]
                }
                Action::Offer { clusters, .. } => clusters.iter().collect(),
                Action::Requeue { reason, .. } if *reason == reason::REMOTE_DELETED => {
                    // Asked whether the copy is there after all: see `copy_still_there`.
                    before.cluster.iter().chain(&before.offers).collect()
                }
                _ => vec![],
            };
            let strategy = self.world.state.settings(&before.queue).map(|s| s.strategy);
            for c in clusters {
                if let Some(v) = self.views.get(c) {
                    let target = Target {
                        strategy,
                        client: v.client.clone(),
                        scheduler_name: v.scheduler_name.clone(),
                        kueue: v.kueue.clone(),
                        keep_off: self.world.ledger.keep_off(&before.uid, c),
                        prefer: self.world.ledger.placed_on(&before.uid, c),
                    };
                    clients.insert(c.clone(), target);
                }
            }
            apply(&mut self.world, a, Outcome::Assumed, now);
        }
        self.in_flight.insert(key.clone());
        self.decided += 1;
        let key = key.clone();
        let ctx = self.ctx.clone();
        let tx = self.tx.clone();
        let semaphore = self.semaphore.clone();
        let limit = self.options.write_timeout;
        let in_flight = self.ctx.writes.begin();
        tokio::spawn(async move {
            let _in_flight = in_flight;
            let _permit = semaphore.acquire_owned().await;
            let write = write_job(&ctx, before, raw, actions, clients, now);
            let done = match tokio::time::timeout(limit, write).await {
                Ok(done) => done,
                Err(_) => {
                    tracing::warn!(job = %key, ?limit, "writes abandoned: an API server did not answer in time");
                    ctx.count("write", "timeout");
                    // Some of them may have landed: the Job is read afresh, so that the next
                    // decision starts from what the manager holds, not from before them.
                    let api = api_of(&ctx.client, &key);
                    let job = match tokio::time::timeout(limit, api.get_opt(&key.name)).await {
                        Ok(Ok(found)) => Some(found.map(to_json)),
                        _ => None,
                    };
                    Done {
                        key: Some(key),
                        job,
                        ..Default::default()
                    }
                }
            };
            let _ = tx.send(Input::Done(Box::new(done)));
        });
    }

    fn delete_copy(&mut self, action: Action) {
        let Action::DeleteCopy {
            cluster,
            job,
            uid,
            origin_uid,
            reason,
        } = &action
        else {
            return;
        };
        let id = (cluster.clone(), uid.clone());
        if !self.deleting.insert(id.clone()) {
            return;
        }
        self.decided += 1;
        let client = self.views.get(cluster).and_then(|v| v.client.clone());
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        let (job, origin_uid, reason) = (job.clone(), origin_uid.clone(), *reason);
        let semaphore = self.semaphore.clone();
        let in_flight = self.ctx.writes.begin();
        tokio::spawn(async move {
            let _in_flight = in_flight;
            let _permit = semaphore.acquire_owned().await;
            let mut done = Done {
                deleted: Some(id.clone()),
                ..Default::default()
            };
            let Some(client) = client else {
                let _ = tx.send(Input::Done(Box::new(done)));
                return;
            };
            if reconcile::UNKEPT.contains(&reason) {
                match manager_keeps(&ctx, &job, &origin_uid, &id.0).await {
                    Ok(None) => {}
                    Ok(Some(fresh)) => {
                        tracing::info!(job = %job, cluster = %id.0, reason, "copy kept: the Job claims it after all");
                        ctx.count("delete_copy", "kept");
                        done.fresh = Some((job.clone(), fresh));
                        let _ = tx.send(Input::Done(Box::new(done)));
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(job = %job, cluster = %id.0, error = %e, "copy not removed: its Job could not be read; retrying");
                        ctx.count("delete_copy", "error");
                        done.outcomes.push((action, Outcome::Failed));
                        let _ = tx.send(Input::Done(Box::new(done)));
                        return;
                    }
                }
            }
            let api = api_of(&client, &job);
            let params = DeleteParams {
                // Only the copy we saw: never a Job someone recreated under the same name.
                preconditions: Some(Preconditions {
                    uid: Some(id.1.clone()),
                    resource_version: None,
                }),
                // The pods go with it, without holding the Job until they do.
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            let outcome = match api.delete(&job.name, &params).await {
                Ok(_) => {
                    tracing::info!(job = %job, cluster = %id.0, reason, "copy removed");
                    ctx.count("delete_copy", "ok");
                    Outcome::Done
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    ctx.count("delete_copy", "ok");
                    Outcome::Done
                }
                Err(e) => {
                    tracing::warn!(job = %job, cluster = %id.0, error = %e, "copy not removed; retrying");
                    ctx.count("delete_copy", "error");
                    Outcome::Failed
                }
            };
            done.outcomes.push((action, outcome));
            let _ = tx.send(Input::Done(Box::new(done)));
        });
    }

    /// The Job as a read made to check a copy returned it (see [`Done::fresh`]), taken only
    /// if it is newer than the latest the watch has shown. The watch may have moved on while
    /// the answer was on its way: a Job deleted meanwhile stays deleted (taking it back would
    /// keep its copy running with no Job to answer for it), and a later change is not undone.
    /// A Job the watch has not shown yet is taken: the watch brings it only later, and the
    /// copy's Job would be read again at every look meanwhile. One the watch should have shown
    /// (it has shown a later change of another Job, or listed them since) and does not is gone:
    /// deleted, or without its queue label (which the dispatcher would not take either).
    fn read_again(&mut self, key: JobKey, obj: Value) {
        // The latest event: stashed while writes are in flight (`None`: deleted), else held.
        let latest = match self.stashed.get(&key) {
            Some(stashed) => Some(stashed.as_ref()),
            None => self.raw.get(&key).map(|raw| Some(&**raw)),
        };
        let take = match latest {
            Some(Some(latest)) => object::newer(&obj, object::resource_version(latest)),
            Some(None) => false,
            // Not held. Gone if the watch showed it deleted (a uid is never used again: this
            // also covers a list without it, whose Jobs may all be older than the read), or
            // if the watch has moved past the read without showing it; else not shown yet.
            None => {
                let gone = object::str_at(&obj, "/metadata/uid")
                    .is_some_and(|uid| self.gone_jobs.contains(uid));
                let passed = object::resource_version(&obj)
                    .is_some_and(|rv| self.watched_to.get(&key.kind).is_some_and(|to| *to >= rv));
                !gone && !passed
            }
        };
        if take {
            self.job_event(key, Some(obj));
        }
    }

    /// A Job's writes (or a copy's removal) landed.
    fn writes_landed(&mut self, done: Done) {
        if let Some((key, obj)) = done.fresh {
            self.read_again(key.clone(), obj);
            self.world.touch(&key);
        }
        if let Some(id) = &done.deleted {
            self.deleting.remove(id);
        }
        let now = SystemTime::now();
        // A copy removed that the worker still shows as terminating comes back from its
        // watch.
        for (action, outcome) in done.outcomes {
            apply(&mut self.world, &action, outcome, now);
        }
        for (cluster, obj) in &done.created {
            let kind = done.key.as_ref().map_or(Kind::Job, |k| k.kind);
            if let Some(c) = remote::parse_copy(kind, cluster, obj) {
                // The worker's watch may have shown this copy already, and changed since (a
                // quick Job can finish before its dispatch's writes all land): that is newer
                // than what the create returned.
                let seen = self
                    .world
                    .state
                    .copy_in(&c.origin_uid, cluster)
                    .is_some_and(|known| known.uid == c.uid)
                    || self.gone_copies.contains(&(cluster.clone(), c.uid.clone()));
                if !seen {
                    self.world.upsert_copy(c);
                }
            }
        }
        let Some(key) = done.key else { return };
        self.in_flight.remove(&key);
        match done.job {
            Some(Some(obj)) => {
                if let Some(rv) = object::resource_version(&obj) {
                    self.written.insert(key.clone(), rv);
                }
                // Our own writes are not the change a refused write waits for.
                if let Some(uid) = obj.pointer("/metadata/uid").and_then(Value::as_str) {
                    if let Some(entry) = self.world.state.writes.refused_writes.get_mut(uid) {
                        if let Some(rv) = obj
                            .pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                        {
                            entry.resource_version = rv.to_string();
                        }
                    }
                }
                self.put_job(key.kind, Arc::new(obj));
            }
            Some(None) => self.forget_job(&key),
            None => {
                // Nothing known to be written: back to what the server last showed.
                if let Some(raw) = self.raw.get(&key).cloned() {
                    self.put_job(key.kind, raw);
                }
            }
        }
        if let Some(obj) = self.stashed.remove(&key) {
            self.job_event(key.clone(), obj);
        }
        if let Some(uid) = done.unconfirmed {
            self.world
                .state
                .writes
                .create_attempted
                .insert(uid, SystemTime::now());
        }
        self.world.touch(&key);
    }

    /// The DispatchQueues' status: counts, quota in force and use, and whether the queue
    /// admits Jobs. Written when it changes, at most every `queue_status_every`.
    fn write_queue_statuses(&mut self, now: SystemTime) {
        let names: Vec<String> = self.world.state.queues.keys().cloned().collect();
        let mut series = HashSet::new();
        for name in names {
            let queue = &self.world.state.queues[&name];
            let uses = self
                .world
                .ledger
                .queue_use(&name)
                .cloned()
                .unwrap_or_default();
            let previous = self.queue_status.get(&name);
            let (status, quota) = queue_status(
                &self.world.state,
                queue,
                &uses,
                previous.map(|(s, _)| s),
                now,
            );
            self.publish_queue_metrics(&name, &uses, &quota, &mut series);
            if let Some((old, at)) = previous {
                if *old == status || *at + self.options.queue_status_every > now {
                    continue;
                }
            }
            self.queue_status
                .insert(name.clone(), (status.clone(), now));
            let api: Api<DispatchQueue> = Api::all(self.ctx.client.clone());
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let patch = serde_json::json!({ "status": status });
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => ctx.count("queue_status", "ok"),
                    Err(e) => {
                        tracing::debug!(queue = %name, error = %e, "queue status not written");
                        ctx.count("queue_status", "error");
                    }
                }
            });
        }
        if let Some(m) = &self.ctx.metrics {
            for (queue, resource) in self.quota_series.difference(&series) {
                let l = QueueResourceLabels {
                    queue: queue.clone(),
                    resource: resource.clone(),
                };
                m.queue_quota.remove(&l);
                m.queue_quota_used.remove(&l);
            }
        }
        self.quota_series = series;
    }

    /// A queue's counts, and per resource its quota and use (in the resource's unit: cores,
    /// bytes, devices); the (queue, resource) series published go into `series`.
    fn publish_queue_metrics(
        &self,
        name: &str,
        uses: &QueueUse,
        quota: &BTreeMap<String, i64>,
        series: &mut HashSet<(String, String)>,
    ) {
        let Some(m) = &self.ctx.metrics else {
            return;
        };
        let l = QueueLabels {
            queue: name.to_string(),
        };
        m.queue_pending.get_or_create(&l).set(uses.pending as i64);
        m.queue_admitted.get_or_create(&l).set(uses.admitted as i64);
        m.queue_running.get_or_create(&l).set(uses.running as i64);
        let resources: BTreeSet<&String> = quota.keys().chain(uses.usage.keys()).collect();
        for r in resources {
            let l = QueueResourceLabels {
                queue: name.to_string(),
                resource: r.clone(),
            };
            let unit = |v: Option<&i64>| v.copied().unwrap_or(0) as f64 / 1000.0;
            m.queue_quota.get_or_create(&l).set(unit(quota.get(r)));
            m.queue_quota_used
                .get_or_create(&l)
                .set(unit(uses.usage.get(r)));
            series.insert((name.to_string(), r.clone()));
        }
    }
}

/// A queue's status as the dispatcher sees it at `now`: its counts, its quota in force and
/// in use, and whether it admits Jobs (its `Active` condition keeps the transition time of
/// `previous` while its status stays); with the quota in force, by resource.
fn queue_status(
    state: &State,
    queue: &Queue,
    uses: &QueueUse,
    previous: Option<&DispatchQueueStatus>,
    now: SystemTime,
) -> (DispatchQueueStatus, BTreeMap<String, i64>) {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let (active, reason, message, quota) = match &queue.settings {
        Err(e) => (
            false,
            queue_reason::INVALID_SPEC,
            e.clone(),
            BTreeMap::new(),
        ),
        Ok(s) => {
            let quota = effective_quota(state, s, now);
            let usable = s
                .clusters
                .iter()
                .filter(|c| state.workers.get(*c).is_some_and(|w| w.usable()))
                .count();
            if usable == 0 {
                let message = format!(
                    "none of its clusters ({}) is connected",
                    s.clusters.join(", ")
                );
                (false, queue_reason::NO_ACTIVE_CLUSTER, message, quota)
            } else {
                let message = format!("{usable} of {} clusters usable", s.clusters.len());
                (true, queue_reason::READY, message, quota)
            }
        }
    };
    let quantity = |m: &BTreeMap<String, i64>| {
        m.iter()
            .map(|(k, v)| {
                let text = crate::quantity::display(k, crate::quantity::Milli(*v));
                (k.clone(), Quantity(text))
            })
            .collect()
    };
    let transition = previous
        .and_then(|s| s.conditions.first())
        .filter(|c| (c.status == "True") == active)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(mirror::to_timestamp(now)));
    let status = DispatchQueueStatus {
        conditions: vec![Condition {
            type_: crate::api::CONDITION_ACTIVE.into(),
            status: if active { "True" } else { "False" }.into(),
            reason: reason.into(),
            message,
            last_transition_time: transition,
            observed_generation: None,
        }],
        pending: uses.pending as i32,
        admitted: uses.admitted as i32,
        running: uses.running as i32,
        effective_quota: quantity(&quota),
        quota_usage: quantity(&uses.usage),
        observed_generation: None,
    };
    (status, quota)
}

/// A waiting Job's reason, to write.
struct WaitWrite {
    /// Its reason changes (not only its message).
    new_reason: bool,
    /// Its place in admission order.
    rank: usize,
    job: JobKey,
    why: WaitReason,
}

/// Why a write did not happen.
enum Failure {
    /// The object changed first (409) or is gone (404): reread.
    Stale,
    /// The API server refused it for good (its message).
    Refused(String),
    /// Unreachable, overloaded, timed out: try again later.
    Transient(String),
}

fn failure(e: kube::Error) -> Failure {
    match e {
        kube::Error::Api(s) if s.code == 409 || s.code == 404 => Failure::Stale,
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 && s.code != 408 => {
            Failure::Refused(if s.message.is_empty() {
                format!("{} {}", s.code, s.reason)
            } else {
                s.message.clone()
            })
        }
        e => Failure::Transient(e.to_string()),
    }
}

struct JobWriter<'a> {
    ctx: &'a Ctx,
    api: Api<DynamicObject>,
    job: Job,
    raw: Arc<Value>,
    done: Done,
    now: SystemTime,
    /// The action being carried out.
    action: Option<Action>,
}

impl JobWriter<'_> {
    fn accept(&mut self, obj: DynamicObject) {
        let value = to_json(obj);
        if let Ok(job) = object::parse_job(self.job.kind(), &value, None, &Priorities::default()) {
            // Keep what the parse cannot know here (namespace labels, priority).
            self.job = Job {
                priority: self.job.priority,
                namespace_labels: self.job.namespace_labels.clone(),
                ..job
            };
        }
        self.raw = Arc::new(value.clone());
        self.done.job = Some(Some(value));
    }

    /// Rereads the Job after a conflict.
    async fn reread(&mut self) {
        match self.api.get_opt(&self.job.key.name).await {
            Ok(Some(obj)) => self.accept(obj),
            Ok(None) => self.done.job = Some(None),
            Err(e) => tracing::debug!(job = %self.job.key, error = %e, "reread failed"),
        }
    }

    /// Writes what differs between the Job now and `target`: metadata and spec, then status.
    async fn write(&mut self, target: &Job) -> Result<(), Failure> {
        if let Some(patch) = object::meta_patch(&self.job, target) {
            let obj = self
                .api
                .patch(
                    &self.job.key.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(failure)?;
            self.accept(obj);
        }
        if let Some(patch) =
            object::status_patch(&self.job.status, &target.status, &self.job.resource_version)
        {
            // The API server's Job status rules, checked here: a status it would refuse is
            // not sent at all.
            if let Some(why) =
                Status::violation(&self.job.status, &target.status, self.job.suspended)
            {
                return Err(Failure::Refused(format!(
                    "{why} (checked before sending; not sent)"
                )));
            }
            let obj = self
                .api
                .patch_status(
                    &self.job.key.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(failure)?;
            self.accept(obj);
        }
        Ok(())
    }

    /// Creates the copy in `cluster`. `Ok(false)`: not now (try again later).
    async fn create(&mut self, cluster: &str, target: Option<&Target>) -> Result<bool, String> {
        let Some(Target {
            client: Some(client),
            scheduler_name,
            kueue,
            keep_off,
            prefer,
            strategy,
        }) = target
        else {
            return Ok(false);
        };
        let target = remote::CopyTarget {
            scheduler_name: scheduler_name.as_deref(),
            kueue_queue: kueue.as_deref(),
            keep_off,
            prefer,
            strategy: *strategy,
        };
        let body =
            remote::copy_of(&self.raw, &self.ctx.manager_id, target).map_err(|e| e.to_string())?;
        let body: DynamicObject = serde_json::from_value(body).map_err(|e| e.to_string())?;
        let key = &self.job.key;
        let api = api_of(client, key);
        match api.create(&PostParams::default(), &body).await {
            Ok(obj) => {
                self.ctx.count("create_copy", "ok");
                self.done.created.push((cluster.to_string(), to_json(obj)));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Ours from an earlier attempt whose answer was lost, or someone else's.
                match api.get_opt(&key.name).await {
                    Ok(Some(existing)) => {
                        let value = to_json(existing);
                        let origin = value
                            .pointer(&format!(
                                "/metadata/labels/{}",
                                ORIGIN_UID_LABEL.replace('/', "~1")
                            ))
                            .and_then(Value::as_str);
                        let terminating = !value["metadata"]["deletionTimestamp"].is_null();
                        if origin == Some(self.job.uid.as_str()) && !terminating {
                            self.ctx.count("create_copy", "ok");
                            self.done.created.push((cluster.to_string(), value));
                            Ok(true)
                        } else if origin == Some(self.job.uid.as_str()) {
                            // An earlier copy of this Job is still being removed there.
                            self.ctx.count("create_copy", "error");
                            Ok(false)
                        } else {
                            self.ctx.count("create_copy", "refused");
                            Err(format!(
                                "a Job {key} that this manager did not create already exists in worker {cluster}"
                            ))
                        }
                    }
                    _ => {
                        self.ctx.count("create_copy", "error");
                        Ok(false)
                    }
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.ctx.count("create_copy", "refused");
                // The namespace is missing, or (with a kind that is not built in) the API.
                Err(
                    if key.kind == Kind::Job || s.message.contains("namespaces") {
                        format!(
                            "namespace {:?} does not exist in worker {cluster}",
                            key.namespace
                        )
                    } else {
                        format!(
                        "worker {cluster} does not serve {} {}s (install its CRD and controller there)",
                        key.kind.api_version(),
                        key.kind
                    )
                    },
                )
            }
            Err(e) => match failure(e) {
                Failure::Refused(m) => {
                    self.ctx.count("create_copy", "refused");
                    Err(format!("worker {cluster} refused the Job: {m}"))
                }
                Failure::Stale => Ok(false),
                Failure::Transient(m) => {
                    tracing::warn!(job = %key, %cluster, error = %m, "copy not created; retrying");
                    self.ctx.count("create_copy", "error");
                    Ok(false)
                }
            },
        }
    }

    /// Whether a copy of the Job (ours, by origin uid, not being deleted) is in its worker, or
    /// in one of the workers it is offered to, after all; each one found is handed to the
    /// World as if just created. `None` when a worker could not say (an error, a timeout) and
    /// none had it.
    async fn copy_still_there(&mut self, clients: &HashMap<String, Target>) -> Option<bool> {
        let clusters: Vec<String> = match &self.job.cluster {
            Some(c) => vec![c.clone()],
            None => self.job.offers.clone(),
        };
        let mut answer = Some(false);
        for cluster in clusters {
            match self.copy_in(&cluster, clients).await {
                Some(true) => answer = Some(true),
                None if answer == Some(false) => answer = None,
                _ => {}
            }
        }
        answer
    }

    /// [`JobWriter::copy_still_there`] for one worker.
    async fn copy_in(&mut self, cluster: &str, clients: &HashMap<String, Target>) -> Option<bool> {
        let Some(Target {
            client: Some(client),
            ..
        }) = clients.get(cluster)
        else {
            return Some(false);
        };
        let api = api_of(client, &self.job.key);
        let found = match api.get_opt(&self.job.key.name).await {
            Ok(Some(found)) => found,
            Ok(None) => return Some(false),
            Err(e) => {
                tracing::warn!(job = %self.job.key, %cluster, error = %e, "could not tell whether the copy is still there; the Job is not requeued now");
                self.done.unconfirmed = Some(self.job.uid.clone());
                return None;
            }
        };
        let value = to_json(found);
        let ours = remote::parse_copy(self.job.kind(), cluster, &value)
            .is_some_and(|c| c.origin_uid == self.job.uid && !c.deleting);
        if ours {
            self.done.created.push((cluster.to_string(), value));
        }
        Some(ours)
    }

    /// Gives the claim on `cluster` back: the worker refused the Job. It is not asked again
    /// for this Job before its back-off ends (recorded on the Job, so a restart keeps it).
    async fn unclaim(&mut self, cluster: &str, message: String) {
        tracing::warn!(job = %self.job.key, %cluster, %message, "worker refused the Job");
        let n = self
            .job
            .refusals
            .get(cluster)
            .map_or(1, |r| r.count.saturating_add(1));
        let action = Action::Unclaim {
            job: self.job.key.clone(),
            cluster: cluster.to_string(),
            reason: reason::WORKER_REFUSED,
            message: message.clone(),
            retry_at: self.now + self.ctx.config.refusal_backoff(n),
        };
        self.ctx.event(
            &self.job,
            true,
            reason::WORKER_REFUSED,
            "Dispatch",
            action.describe(),
        );
        if let Some(target) = job_after(&self.job, &action, self.now) {
            let r = self.write(&target).await;
            self.outcome("unclaim", r).await;
        }
    }

    async fn outcome(&mut self, action: &'static str, r: Result<(), Failure>) -> bool {
        match r {
            Ok(()) => {
                self.ctx.count(action, "ok");
                true
            }
            Err(Failure::Stale) => {
                self.ctx.count(action, "conflict");
                self.reread().await;
                false
            }
            Err(Failure::Refused(m)) => {
                // Refused for good: said once, and not tried again until the Job changes.
                tracing::warn!(job = %self.job.key, action, error = %m, "write refused");
                self.ctx.count(action, "refused");
                let name = self.action.as_ref().map_or("write", Action::name);
                if let Some(action) = self.action.clone() {
                    let refused = Outcome::Refused {
                        resource_version: self.job.resource_version.clone(),
                    };
                    self.done.outcomes.push((action, refused));
                }
                self.ctx.event(
                    &self.job,
                    true,
                    "WriteRefused",
                    "Dispatch",
                    format!(
                        "the API server refused to {} the Job: {m}; not tried again until the Job changes",
                        name.replace('_', " ")
                    ),
                );
                false
            }
            Err(Failure::Transient(m)) => {
                tracing::warn!(job = %self.job.key, action, error = %m, "write failed; retrying");
                self.ctx.count(action, "error");
                false
            }
        }
    }

    /// Claims, creates the copies, unsuspends: one Dispatch or Offer.
    async fn dispatch(
        &mut self,
        action: &Action,
        clusters: &[String],
        clients: &HashMap<String, Target>,
    ) -> bool {
        let mut claimed = self.job.clone();
        if let [one] = clusters {
            if matches!(action, Action::Dispatch { .. }) {
                claimed.cluster = Some(one.clone());
            } else {
                claimed.offers = clusters.to_vec();
            }
        } else {
            claimed.offers = clusters.to_vec();
        }
        let r = self.write(&claimed).await;
        if !self.outcome("claim", r).await {
            return false;
        }
        let mut created = 0;
        for c in clusters {
            match self.create(c, clients.get(c)).await {
                Ok(true) => created += 1,
                Ok(false) => {}
                Err(message) => self.unclaim(c, message).await,
            }
        }
        if created < clusters.len() {
            // Claimed and waiting for its copies: the next plans create them (or give up).
            self.done.outcomes.push((action.clone(), Outcome::Claimed));
            return false;
        }
        let Some(target) = job_after(&self.job, action, self.now) else {
            return false;
        };
        let r = self.write(&target).await;
        let ok = self.outcome("dispatch", r).await;
        if ok {
            self.ctx.event(
                &self.job,
                false,
                reason::DISPATCHED,
                "Dispatch",
                action.describe(),
            );
        }
        ok
    }
}

/// Records an object the watch showed deleted, so that a late answer does not bring it back.
/// Such answers come within seconds: the record is dropped whole past 10,000, so that a
/// long-lived leader's does not grow without end.
fn note_gone<T: std::hash::Hash + Eq>(gone: &mut HashSet<T>, what: T) {
    if gone.len() >= 10_000 {
        gone.clear();
    }
    gone.insert(what);
}

/// The manager Job as the API server has it now, if it keeps its copy in `cluster` (the same
/// Job, by uid, claiming or offered that worker): then a copy thought stale or orphaned was
/// judged on a view that is behind, and stays.
async fn manager_keeps(
    ctx: &Ctx,
    key: &JobKey,
    origin_uid: &str,
    cluster: &str,
) -> Result<Option<Value>, kube::Error> {
    let api = api_of(&ctx.client, key);
    let Some(obj) = api.get_opt(&key.name).await? else {
        return Ok(None);
    };
    let value = to_json(obj);
    let keeps = object::parse_job(key.kind, &value, None, &Priorities::default())
        .is_ok_and(|j| j.uid == origin_uid && j.kept_clusters().iter().any(|c| c == cluster));
    Ok(keeps.then_some(value))
}

/// Carries out one Job's actions in order, stopping at the first that fails.
/// A worker a Job's writes go to: its client, and what its copy is made for there.
struct Target {
    client: Option<kube::Client>,
    scheduler_name: Option<String>,
    /// The worker's `spec.kueue.localQueueName`.
    kueue: Option<String>,
    /// The nodes the copy's pods are kept off (see [`super::ledger::Ledger::keep_off`]).
    keep_off: Vec<Arc<str>>,
    /// The nodes of the Job's placement there (see [`super::ledger::Ledger::placed_on`]).
    prefer: Vec<Arc<str>>,
    /// The Job's queue's placement strategy, for its pods in the worker.
    strategy: Option<crate::placement::Strategy>,
}

async fn write_job(
    ctx: &Ctx,
    job: Job,
    raw: Arc<Value>,
    actions: Vec<Action>,
    clients: HashMap<String, Target>,
    now: SystemTime,
) -> Done {
    let api = api_of(&ctx.client, &job.key);
    let mut w = JobWriter {
        ctx,
        api,
        done: Done {
            key: Some(job.key.clone()),
            ..Default::default()
        },
        job,
        raw,
        now,
        action: None,
    };
    for action in &actions {
        w.action = Some(action.clone());
        let ok = match action {
            Action::Dispatch { cluster, .. } => {
                w.dispatch(action, std::slice::from_ref(cluster), &clients)
                    .await
            }
            Action::Offer { clusters, .. } => w.dispatch(action, clusters, &clients).await,
            Action::CreateCopy { cluster, .. } => {
                match w.create(cluster, clients.get(cluster)).await {
                    Ok(created) => created,
                    Err(message) => {
                        w.unclaim(cluster, message).await;
                        false
                    }
                }
            }
            Action::WriteStatus { .. } => {
                let Some(target) = job_after(&w.job, action, now) else {
                    continue;
                };
                match w.write(&target).await {
                    Err(Failure::Refused(m)) => {
                        // The API server keeps Job status rules (counters never go down, ...):
                        // the same write is not tried again until the worker's status moves.
                        w.ctx.count("write_status", "refused");
                        w.done
                            .outcomes
                            .push((action.clone(), Outcome::StatusRefused));
                        w.ctx.event(
                            &w.job,
                            true,
                            "StatusRefused",
                            "MirrorStatus",
                            format!("the status from the worker was refused: {m}"),
                        );
                        false
                    }
                    r => w.outcome("write_status", r).await,
                }
            }
            Action::Requeue { reason: why, .. }
                if *why == reason::REMOTE_DELETED
                    && w.copy_still_there(&clients).await != Some(false) =>
            {
                // The worker's watch had not shown the copy yet: it is there, it runs. Or the
                // worker could not say: a copy that may run is not given up on a guess (a
                // second one would start elsewhere); the Job is decided again.
                false
            }
            other => {
                let Some(target) = job_after(&w.job, other, now) else {
                    continue;
                };
                let name = other.name();
                let r = w.write(&target).await;
                let ok = w.outcome(name, r).await;
                if ok {
                    announce(w.ctx, &w.job, other);
                }
                ok
            }
        };
        if !ok {
            break;
        }
    }
    w.done
}

/// The Event an action leaves on the manager Job, if any (and the requeue it counts).
fn announce(ctx: &Ctx, job: &Job, action: &Action) {
    let requeued = match action {
        Action::Requeue { reason, .. } => Some(*reason),
        Action::Deactivate { .. } => Some(reason::REQUEUING_LIMIT),
        _ => None,
    };
    if let (Some(m), Some(why)) = (&ctx.metrics, requeued) {
        m.dispatch_requeues
            .get_or_create(&QueueReasonLabels {
                queue: job.queue.clone(),
                reason: why.to_string(),
            })
            .inc();
    }
    let (warning, why) = match action {
        Action::Requeue { reason, .. } => (true, *reason),
        Action::Deactivate { .. } => (true, reason::REQUEUING_LIMIT),
        Action::Unclaim { reason, .. } => (true, *reason),
        Action::Choose { .. } => (false, reason::DISPATCHED),
        Action::Unsuspend { .. } => (false, reason::DISPATCHED),
        Action::RecordResult { .. } => (false, reason::FINISHED),
        _ => return,
    };
    ctx.event(job, warning, why, "Dispatch", action.describe());
}
