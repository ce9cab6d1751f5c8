//! What the dispatcher knows, as plain data: the manager's Jobs, their copies in the workers,
//! the queues, the workers, the inventory and the placements handed out. [`World`] keeps the
//! indexes the decisions need (quota use per queue, pending Jobs by class, copies by origin
//! uid) up to date as objects come and go, so a decision never walks every Job.

use crate::api::QueueSettings;
use crate::inventory::Inventory;
use crate::placement::inflight::Take;
use crate::placement::{EngineConfig, PodShape};
use foldhash::HashMap;
use k8s_openapi::api::batch::v1::JobStatus;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A Job's namespace and name: the same in the manager and in its worker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobKey {
    pub namespace: String,
    pub name: String,
}

impl JobKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How a Job ended in its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobResult {
    Succeeded,
    Failed,
}

impl JobResult {
    pub fn as_str(self) -> &'static str {
        match self {
            JobResult::Succeeded => "Succeeded",
            JobResult::Failed => "Failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Succeeded" => Some(Self::Succeeded),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// A Job of the manager cluster that carries a queue label, reduced to what dispatch needs.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: JobKey,
    pub uid: String,
    /// For the claim's optimistic concurrency (empty in `simulate`).
    pub resource_version: String,
    pub queue: String,
    /// The pod template's PriorityClass value.
    pub priority: i32,
    pub created: SystemTime,
    pub parallelism: u32,
    pub completions: Option<u32>,
    /// The pod template, analysed; why not when it cannot be.
    pub pod: Result<Arc<PodShape>, String>,
    /// Jobs with the same key have the same pod template (as far as placement sees it).
    pub shape_key: u64,
    /// The namespace's labels, for the queue's namespaceSelector (`None`: unknown, treated as
    /// carrying only `kubernetes.io/metadata.name`).
    pub namespace_labels: Option<Arc<BTreeMap<String, String>>>,
    pub suspended: bool,
    /// Being deleted (or gone): its copies go too.
    pub deleting: bool,
    /// Dispatch state, from the annotations.
    pub cluster: Option<String>,
    /// Workers the Job was offered to at once (`placement.fanout` > 1) while none has won yet.
    pub offers: Vec<String>,
    pub admitted_at: Option<SystemTime>,
    pub requeues: u32,
    pub requeue_after: Option<SystemTime>,
    pub avoid: Option<String>,
    /// Workers that refused the Job's copy, and when each may be tried again.
    pub refusals: BTreeMap<String, Refusal>,
    pub deactivated: Option<String>,
    pub result: Option<JobResult>,
    /// The manager Job's status (mirrored from the worker, plus the dispatcher's conditions).
    pub status: JobStatus,
}

/// A worker refused the Job's copy (403, 422, an admission webhook, a missing namespace): not
/// the Job's fault, so not a requeue, but that worker is not asked again before `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Refusals in a row by this worker (the back-off doubles with each).
    pub count: u32,
    pub retry_at: SystemTime,
    /// What the worker said.
    pub message: String,
}

impl Job {
    /// The pods that must run at once: parallelism, or completions when smaller.
    pub fn gang(&self) -> u32 {
        match self.completions {
            Some(c) => self.parallelism.min(c),
            None => self.parallelism,
        }
    }

    /// Finished as far as the dispatcher is concerned: a result recorded, or a terminal
    /// condition in the manager Job's status.
    pub fn finished(&self) -> bool {
        self.result.is_some() || terminal(&self.status).is_some()
    }

    /// Waiting to be admitted.
    pub fn is_pending(&self) -> bool {
        self.cluster.is_none()
            && self.offers.is_empty()
            && !self.deleting
            && !self.finished()
            && self.deactivated.is_none()
            && !self.user_suspended()
    }

    /// Admitted and holding quota: claimed for a worker and not finished.
    pub fn holds_quota(&self) -> bool {
        (self.cluster.is_some() || !self.offers.is_empty()) && !self.finished() && !self.deleting
    }

    /// The workers whose copies the Job keeps: its worker, or the ones it is offered to.
    pub fn kept_clusters(&self) -> &[String] {
        if self.deleting || self.deactivated.is_some() {
            return &[];
        }
        match &self.cluster {
            Some(c) => std::slice::from_ref(c),
            None => &self.offers,
        }
    }

    /// Unsuspended by the dispatcher once and suspended again by someone else.
    pub fn user_suspended(&self) -> bool {
        self.suspended && self.admitted_at.is_some()
    }

    /// The dispatcher's condition of this type in the Job's status.
    pub fn condition(&self, type_: &str) -> Option<&k8s_openapi::api::batch::v1::JobCondition> {
        self.status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
    }

    /// Whether the `PodsReady` condition is True, and since when it has had its status.
    pub fn pods_ready(&self) -> Option<(bool, Option<SystemTime>)> {
        self.condition(super::condition::PODS_READY).map(|c| {
            (
                c.status == "True",
                c.last_transition_time
                    .as_ref()
                    .map(|t| to_system_time(&t.0)),
            )
        })
    }

    /// The refusal that keeps the Job away from `cluster` at `now`, if any.
    pub fn refused_by(&self, cluster: &str, now: SystemTime) -> Option<&Refusal> {
        self.refusals.get(cluster).filter(|r| r.retry_at > now)
    }

    /// In requeue back-off at `now` (not admitted before [`Job::requeue_after`]).
    pub fn backing_off(&self, now: SystemTime) -> bool {
        self.requeue_after.is_some_and(|t| t > now)
    }

    /// When the Job started waiting: its creation, or the end of its last back-off.
    pub fn waiting_since(&self) -> SystemTime {
        self.requeue_after.unwrap_or(self.created).max(self.created)
    }

    /// The total request of the gang, per resource name: pods × the per-pod request.
    pub fn total_request(&self) -> BTreeMap<String, i64> {
        self.total_requests()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// [`Job::total_request`] without building a map, in resource name order.
    pub fn total_requests(&self) -> impl Iterator<Item = (&str, i64)> + '_ {
        let gang = i64::from(self.gang());
        self.pod
            .iter()
            .flat_map(|shape| &shape.node_request)
            .map(move |(k, v)| (k.as_str(), v.saturating_mul(gang)))
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

/// When a worker's nodes may last have gained room, in its capacity epochs: the nodes that
/// changed since a misfit was found are those whose epoch is later. A node is remembered
/// by its index, so finding them costs one look at each node, however many changes there
/// were (a log of them, sorted at every look, cost more than the rest of a misfit's check).
#[derive(Debug, Clone, Default)]
struct Changes {
    /// The last change that may have given room anywhere (the whole worker is looked at
    /// again for a misfit found before it).
    anywhere: u64,
    /// Per node index, its last change (0: none).
    nodes: Vec<u64>,
    /// Every node whose room changed either way (gained or lost), in order: positions
    /// `touched_from..touched_from + touched.len()` (see [`World::touches`]).
    touched: Vec<usize>,
    touched_from: u64,
}

/// How long a worker's log of touched nodes grows before its older half is dropped (a
/// reader that had not caught up counts every node again).
const TOUCH_LOG: usize = 1 << 16;

/// An upper bound on how many pods of one shape a worker's nodes can take at once, kept
/// across passes and brought up to date node by node (see [`World::touches`]): each node's
/// count, up to `cap` (gangs of at most `cap` pods compare the same against the sum as
/// against uncapped counts). It is found on the inventory's nodes, without the placements
/// held for dispatched Jobs: those only take room, so a gang that does not fit in it fits
/// nowhere in the worker as a pass sees it.
#[derive(Debug, Clone, Default)]
pub struct ShapeRoom {
    /// The worker's touch log position the counts are up to date with.
    pub pos: u64,
    pub cap: usize,
    pub counts: Vec<u32>,
    pub total: usize,
}

/// [`ShapeRoom`]s by worker, then shape key.
pub type ShapeRooms = HashMap<String, HashMap<u64, ShapeRoom>>;

impl Changes {
    fn touch(&mut self, index: usize) {
        if self.touched.len() >= TOUCH_LOG {
            let half = TOUCH_LOG / 2;
            self.touched.drain(..half);
            self.touched_from += half as u64;
        }
        self.touched.push(index);
    }
}

/// `Complete` or `Failed` True in a Job status.
pub fn terminal(status: &JobStatus) -> Option<JobResult> {
    for c in status.conditions.iter().flatten() {
        if c.status == "True" {
            match c.type_.as_str() {
                "Complete" => return Some(JobResult::Succeeded),
                "Failed" => return Some(JobResult::Failed),
                _ => {}
            }
        }
    }
    None
}

/// RFC 3339 in UTC, whole seconds: how annotations and messages give times.
pub fn rfc3339(t: SystemTime) -> String {
    super::mirror::to_timestamp(t).to_string()
}

/// Reads [`rfc3339`] (and any RFC 3339 time).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

pub fn to_system_time(t: &k8s_openapi::jiff::Timestamp) -> SystemTime {
    SystemTime::from(*t)
}

/// A worker's copy of a manager Job (labelled with our origin).
#[derive(Debug, Clone)]
pub struct Copy {
    pub cluster: String,
    pub key: JobKey,
    pub uid: String,
    /// The manager Job's uid, from the copy's `switchyard.dev/origin-uid` label.
    pub origin_uid: String,
    pub status: JobStatus,
    pub deleting: bool,
}

impl Copy {
    /// Ready + succeeded pods.
    pub fn ready_pods(&self) -> u32 {
        let ready = self.status.ready.unwrap_or(0).max(0) as u32;
        let succeeded = self.status.succeeded.unwrap_or(0).max(0) as u32;
        ready + succeeded
    }
}

/// What the dispatcher sees of a worker.
#[derive(Debug, Clone)]
pub struct Worker {
    pub name: String,
    pub connected: bool,
    /// Since when it cannot be reached (kept across retries).
    pub disconnected_since: Option<SystemTime>,
    /// Its copies have been listed since it was last (re)connected: a copy missing from the
    /// list is really missing.
    pub copies_synced: bool,
    pub scheduler_name: Option<String>,
    /// Why it is not usable, for people.
    pub message: String,
}

impl Worker {
    pub fn usable(&self) -> bool {
        self.connected && self.copies_synced
    }

    /// Unreachable for `lost_after` or longer at `now`: its Jobs are given up for lost (seed
    /// 000). A shorter disconnect changes nothing.
    pub fn lost(&self, now: SystemTime, lost_after: Duration) -> bool {
        !self.connected && self.disconnected_since.unwrap_or(now) + lost_after <= now
    }
}

/// A queue: its settings, or why they are unusable.
#[derive(Debug, Clone)]
pub struct Queue {
    pub name: String,
    pub settings: Result<QueueSettings, String>,
}

/// Placements handed out to a Job and not yet visible in its worker's inventory.
#[derive(Debug, Clone)]
pub struct Hold {
    pub job_uid: String,
    pub cluster: String,
    pub takes: Vec<Take>,
    pub since: SystemTime,
    /// Which hold this is, among all the World ever held (set by [`World::hold`]): its takes
    /// never change, so the serial stands for them.
    pub serial: u64,
}

/// How admission judges whether a worker can take a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The placement engine's exact fit of the whole gang, node by node and NUMA zone by
    /// NUMA zone (Switchyard).
    #[default]
    Exact,
    /// The sum of the worker's free resources covers the gang, as a virtual node summing its
    /// cluster would judge it (seed 004's alternative; `simulate --strategy sum-aggregate`).
    SumOfFree,
    /// No judgement: the Job is offered to every worker of its queue at once and the first
    /// to run all its pods keeps it (seed 000 without Kueue; `simulate --strategy
    /// all-at-once`).
    Everywhere,
}

/// What a worker's nodes can hold when empty: their number and allocatable amounts. Usage
/// does not enter it.
pub fn fingerprint(cluster: &crate::inventory::Cluster) -> u64 {
    cluster.summary.capacity_print
}

/// What a class's last failure depended on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoKey {
    /// The queue's workers: bumped when one changed state or as a whole (connected, stale
    /// copies gone, new inventory). A node of one gaining room does not bump it: see
    /// [`ClassMemo::looked`].
    pub queue_epoch: u64,
    /// The queue's quota use: bumped when it went down. Only a class that waited for quota
    /// depends on it: more free quota does not give a worker room.
    pub quota_epoch: u64,
    pub queues: u64,
    pub reservations: u64,
    /// Whether the class's first Job was starving (holds what it waits for).
    pub starving: bool,
}

impl MemoKey {
    /// Whether a failure found under `self` still stands under `now`.
    fn still(&self, now: &MemoKey, waited_for_quota: bool) -> bool {
        self.queue_epoch == now.queue_epoch
            && self.queues == now.queues
            && self.reservations == now.reservations
            && self.starving == now.starving
            && (!waited_for_quota || self.quota_epoch == now.quota_epoch)
    }
}

/// Why a class of pending Jobs could not be admitted, and what it held for itself.
#[derive(Debug, Clone)]
pub struct ClassMemo {
    pub key: MemoKey,
    pub reason: &'static str,
    pub message: String,
    /// The worker kept for it, when it starves.
    pub reserve: Option<String>,
    /// Whether its quota is held for it.
    pub holds_quota: bool,
    /// The queue's workers it could use then (by position in the queue's list), when it got
    /// as far as placement: workers kept for other Jobs in the pass are not among them.
    pub usable: Option<Arc<[usize]>>,
    /// The workers it was judged against (by position in the queue's list), with their
    /// capacity epochs then ([`World::capacity_epoch`]; `None` when not in the inventory).
    /// A node gaining room bumps its worker's epoch, not the queue's: the memo stands while
    /// these stay as they were.
    pub looked: Arc<[(usize, Option<u64>)]>,
}

impl ClassMemo {
    /// Whether the class waited for quota (its own, or quota held for an older Job).
    fn waited_for_quota(&self) -> bool {
        self.holds_quota
            || matches!(
                self.reason,
                super::reason::QUOTA_EXCEEDED | super::reason::QUOTA_RESERVED_FOR_OLDER
            )
    }
}

/// A class of pending Jobs that did not fit in a worker: why, and at which capacity epoch
/// and queues generation.
#[derive(Debug, Clone)]
pub struct KnownMisfit {
    pub reason: String,
    /// Preemption could not help: the worker is too small even empty.
    pub never: bool,
    pub epoch: u64,
    pub queues: u64,
    /// The nodes (by index) that had room for some pods of the gang, with how many. Each
    /// node's room for identical pods is its own, so later the gang fits at most
    /// [`KnownMisfit::fitted`],
    /// less what the nodes that gained room since had then, plus what they have now.
    pub counts: Arc<[(usize, usize)]>,
}

impl KnownMisfit {
    /// At most this many pods of the gang fitted.
    pub fn fitted(&self) -> usize {
        self.counts.iter().map(|(_, c)| c).sum()
    }
}

/// A worker's cluster with the placements held there taken off: what every admission pass
/// starts from, made once and kept while neither the inventory's cluster (held as a `Weak`:
/// a changed cluster is another allocation) nor the holds there change. When either does,
/// the next view is made from this one: only the nodes that changed, or whose held
/// placements did, are made again.
#[derive(Debug, Clone)]
pub struct HeldView {
    pub base: std::sync::Weak<crate::inventory::Cluster>,
    pub holds: u64,
    pub view: Arc<crate::inventory::Cluster>,
    /// The nodes placements are held on, by index: the inventory's node the view's was made
    /// from (a `Weak`, so that the inventory's node stays its owner's to change in place) and
    /// a digest of the placements taken off it. Every other node is the inventory's own.
    pub held: Vec<HeldNode>,
}

/// One node of a [`HeldView`] with placements held on it.
#[derive(Debug, Clone)]
pub struct HeldNode {
    pub index: usize,
    pub base: std::sync::Weak<crate::inventory::Node>,
    pub digest: u64,
}

impl HeldView {
    /// Whether the view is still `base` (the inventory's cluster now) with the placements
    /// held at hold version `holds` taken off.
    pub fn is_current(&self, base: &Arc<crate::inventory::Cluster>, holds: u64) -> bool {
        std::ptr::eq(self.base.as_ptr(), Arc::as_ptr(base)) && self.holds == holds
    }
}

/// Tunables of the decisions.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub placement: Placement,
    /// `switchyard.dev/origin` on worker copies: tells this manager's copies from others'.
    pub manager_id: String,
    pub engine: EngineConfig,
    /// A Job waiting this long for capacity stops Jobs behind it from taking the cluster and
    /// the quota it needs (see the admission module).
    pub starvation_after: Duration,
    /// The longest a placement is held for a Job whose pods never all become Ready.
    pub hold_timeout: Duration,
    /// How long a claimed Job may wait for its copy to be created before another attempt.
    pub create_retry_after: Duration,
    /// A message-only change of a waiting Job's reason is written at most this often.
    pub wait_rewrite_after: Duration,
    /// A worker that refused a Job's copy is not asked again for that Job before
    /// `base × 2^(n−1)` (n: refusals in a row), at most `max`. Other workers are tried at once.
    pub refusal_backoff_base: Duration,
    pub refusal_backoff_max: Duration,
    /// Build the messages that say why Jobs wait (off in `simulate` until the end).
    pub describe: bool,
    /// Reuse what earlier passes found (misfits, drained fits, failed classes). Off only to
    /// check that reusing never changes a decision.
    pub remember: bool,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            manager_id: "switchyard".into(),
            placement: Placement::Exact,
            engine: EngineConfig::default(),
            starvation_after: Duration::from_secs(600),
            hold_timeout: Duration::from_secs(600),
            create_retry_after: Duration::from_secs(10),
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
    pub fn refusal_backoff(&self, n: u32) -> Duration {
        let factor = 2u32.checked_pow(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.refusal_backoff_base
            .checked_mul(factor)
            .map_or(self.refusal_backoff_max, |d| {
                d.min(self.refusal_backoff_max)
            })
    }
}

/// A class's remembered misfits (see [`World::misfit`]).
pub struct MisfitsOf<'w> {
    world: &'w World,
    by_cluster: Option<&'w HashMap<String, KnownMisfit>>,
}

impl<'w> MisfitsOf<'w> {
    pub fn get(&self, cluster: &str) -> Option<&'w KnownMisfit> {
        let w = self.world;
        self.by_cluster?.get(cluster).filter(|m| {
            m.queues == w.queues_generation && (!w.config.describe || !m.reason.is_empty())
        })
    }
}

/// The drained fits known for one class (see [`World::drained_of`]).
pub struct DrainedOf<'w> {
    by_cluster: &'w HashMap<String, (u64, Option<i64>)>,
}

impl DrainedOf<'_> {
    /// Whether the class would fit in `cluster` drained, if known for nodes with this
    /// [`fingerprint`]: `Some(None)` for no, `Some(Some(score))` for yes.
    pub fn get(&self, cluster: &str, print: u64) -> Option<Option<i64>> {
        self.by_cluster
            .get(cluster)
            .filter(|(p, _)| *p == print)
            .map(|(_, s)| *s)
    }
}

/// Pending Jobs that are interchangeable for admission: same queue, namespace, pod shape and
/// gang size. When the first of a class cannot be admitted, none of the others can.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassKey {
    /// Shared: a class's key is copied into every memo, misfit and wait a pass records.
    pub queue: Arc<str>,
    pub namespace: Arc<str>,
    pub shape: u64,
    pub gang: u32,
}

/// Admission order: higher priority first, then older, then by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    pub neg_priority: i64,
    pub created: SystemTime,
    pub key: JobKey,
}

impl Job {
    pub fn rank(&self) -> Rank {
        Rank {
            neg_priority: -i64::from(self.priority),
            created: self.created,
            key: self.key.clone(),
        }
    }
    pub fn class(&self) -> ClassKey {
        ClassKey {
            queue: self.queue.as_str().into(),
            namespace: self.key.namespace.as_str().into(),
            shape: self.shape_key,
            gang: self.gang(),
        }
    }
}

/// Per-queue totals kept as Jobs change.
#[derive(Debug, Clone, Default)]
pub struct QueueUse {
    /// Admitted Jobs' requests, per resource name.
    pub usage: BTreeMap<String, i64>,
    pub pending: usize,
    pub admitted: usize,
    /// Admitted Jobs whose pods are all Ready.
    pub running: usize,
    /// Admitted Jobs not yet PodsReady (the blockAdmission gate), in rank order.
    pub not_ready: BTreeSet<Rank>,
}

/// Everything the dispatcher knows at one instant.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub config: DispatchConfig,
    pub jobs: HashMap<JobKey, Job>,
    /// The manager's Jobs have been listed: a Job missing from the list is gone (copies of
    /// missing Jobs are only removed after that).
    pub jobs_synced: bool,
    pub queues: BTreeMap<String, Queue>,
    pub workers: BTreeMap<String, Worker>,
    pub inventory: Arc<Inventory>,
    holds: BTreeMap<String, Arc<Hold>>,
    /// Per worker, a counter bumped whenever it may have gained room (its inventory changed,
    /// a placement held there was released): a misfit remembered at an epoch stays a misfit
    /// until the epoch moves.
    capacity: HashMap<String, u64>,
    /// Per worker, when its nodes may last have gained room (see [`Changes`]).
    changes: HashMap<String, Changes>,
    /// Kept across passes (see [`ShapeRoom`]); a pass takes them while it runs.
    shape_rooms: ShapeRooms,
    /// Bumped when a queue is added, changed or removed.
    queues_generation: u64,
    /// Per queue, a counter bumped whenever its Jobs may have become admissible because one
    /// of its workers may have gained room or changed state.
    queue_epochs: HashMap<String, u64>,
    /// Per queue, a counter bumped whenever its quota use went down.
    quota_epochs: HashMap<String, u64>,
    /// The serial of the last placement held (see [`Hold::serial`]).
    hold_serial: u64,
    /// Per worker, the queues that list it, for the queues generation it was found at.
    queues_of: (u64, HashMap<String, Arc<[String]>>),
    /// Bumped when the workers and quota held for starving Jobs change.
    reservations_generation: u64,
    /// The last reservations, to tell when they change.
    last_reservations: u64,
    /// Why each class of pending Jobs last failed, and under which epochs.
    class_memos: HashMap<ClassKey, ClassMemo>,
    /// Misfits of a class of pending Jobs in a worker, with the epochs they were found at.
    misfits: HashMap<ClassKey, HashMap<String, KnownMisfit>>,
    /// Per worker, bumped whenever a placement held there is added or released.
    hold_versions: HashMap<String, u64>,
    /// Per worker, the placements held there by Job uid (shared with `holds`): going
    /// through a worker's holds looks nothing up.
    held_in: HashMap<String, BTreeMap<String, Arc<Hold>>>,
    /// Per worker, its cluster with the placements held there taken off, as a pass made it
    /// (see [`World::held_view`]).
    held_views: HashMap<String, HeldView>,
    /// Whether a class would fit in a worker once it drains (its score if so), with the
    /// fingerprint of the worker's nodes it was judged on.
    drained: HashMap<ClassKey, HashMap<String, (u64, Option<i64>)>>,
    /// When each waiting Job's reason was last written (by uid).
    pub wait_written: HashMap<String, SystemTime>,
    /// The last status write the API server refused, per Job uid, so the same write is not
    /// retried forever.
    pub refused_status: HashMap<String, u64>,
    /// When a claimed Job's copy was last attempted (by uid).
    pub create_attempted: HashMap<String, SystemTime>,
    /// Writes the manager's API server refused for good, per Job uid: the resourceVersion
    /// the Job had and the action. Not tried again until the Job changes.
    pub refused_writes: HashMap<String, (String, &'static str)>,
    copies: HashMap<String, BTreeMap<String, Copy>>,
    /// Copies whose origin uid names no Job we know (candidates for garbage collection).
    by_uid: HashMap<String, JobKey>,
    uses: BTreeMap<String, QueueUse>,
    charges: HashMap<JobKey, Charge>,
    pending: BTreeMap<ClassKey, BTreeSet<Rank>>,
    /// Jobs changed since they were last reconciled.
    dirty: BTreeSet<JobKey>,
    /// Jobs to look at again at a deadline (PodsReady, worker lost, retries).
    timers: BTreeMap<SystemTime, BTreeSet<JobKey>>,
    /// Per worker, the origin uids of copies that should not exist and are not being deleted
    /// yet: nothing new is dispatched there until they are (a worker that comes back first
    /// loses the copies of the Jobs taken back from it).
    stale: BTreeMap<String, BTreeSet<String>>,
    /// The workers that held stale copies at the last admission pass.
    stale_when_judged: Vec<String>,
    /// Origin uids of copies whose Job is unknown.
    orphan_uids: BTreeSet<String>,
    /// Per namespace/name, the workers holding a copy by that name, with the copy's origin
    /// uid (keyed by name first: admission asks "is this name taken anywhere" per Job).
    names: HashMap<JobKey, HashMap<String, String>>,
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
}

impl Charge {
    /// What `job` contributes to its queue's totals as it is now.
    fn of(job: &Job) -> Self {
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
        } else if job.is_pending() {
            c.pending = Some((job.class(), job.rank()));
        }
        c
    }
}

impl World {
    pub fn new(config: DispatchConfig) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    /// Adds or replaces a manager Job.
    pub fn upsert_job(&mut self, job: Job) {
        let old = self.jobs.get(&job.key);
        // Most changes (a status mirrored, an annotation) leave the queue's totals alone.
        let recharge = old.is_none_or(|old| !charged_alike(old, &job));
        match old {
            Some(old) if old.uid == job.uid => {}
            Some(old) => {
                let was = old.uid.clone();
                self.by_uid.remove(&was);
                self.by_uid.insert(job.uid.clone(), job.key.clone());
            }
            None => {
                self.by_uid.insert(job.uid.clone(), job.key.clone());
            }
        }
        if recharge {
            let before = self.charges.get(&job.key).map(|c| c.usage.clone());
            self.uncharge(&job.key);
            self.charge(&job);
            let after = &self.charges[&job.key].usage;
            if before.is_some_and(|before| {
                before
                    .iter()
                    .any(|(r, v)| after.get(r).copied().unwrap_or(0) < *v)
            }) {
                bump(&mut self.quota_epochs, &job.queue);
            }
        } else {
            // What `charged_alike` compares must be all that a charge reads.
            debug_assert_eq!(self.charges.get(&job.key), Some(&Charge::of(&job)));
        }
        self.dirty.insert(job.key.clone());
        let uid = job.uid.clone();
        self.jobs.insert(job.key.clone(), job);
        self.restale(&uid, None);
    }

    /// Forgets a manager Job (deleted). Its copies stay until they are removed.
    pub fn remove_job(&mut self, key: &JobKey) -> Option<Job> {
        if let Some(c) = self.charges.get(key) {
            if !c.usage.is_empty() {
                let queue = c.queue.clone();
                bump(&mut self.quota_epochs, &queue);
            }
        }
        self.uncharge(key);
        let job = self.jobs.remove(key)?;
        self.by_uid.remove(&job.uid);
        self.release(&job.uid);
        self.wait_written.remove(&job.uid);
        self.refused_status.remove(&job.uid);
        self.create_attempted.remove(&job.uid);
        self.refused_writes.remove(&job.uid);
        self.dirty.remove(key);
        self.restale(&job.uid, None);
        Some(job)
    }

    /// The action of the Job's that the API server refused while the Job was as it is now.
    pub fn refused_write(&self, job: &Job) -> Option<&'static str> {
        self.refused_writes
            .get(&job.uid)
            .filter(|(rv, _)| *rv == job.resource_version)
            .map(|(_, action)| *action)
    }

    pub fn job_by_uid(&self, uid: &str) -> Option<&Job> {
        self.by_uid.get(uid).and_then(|k| self.jobs.get(k))
    }

    pub fn upsert_copy(&mut self, copy: Copy) {
        if copy.deleting {
            // Its pods are going: the room they free shows in the inventory when they are
            // gone, and the worker may stop holding stale copies.
            self.worker_changed(&copy.cluster);
        }
        if let Some(key) = self.by_uid.get(&copy.origin_uid) {
            self.dirty.insert(key.clone());
        }
        let uid = copy.origin_uid.clone();
        let cluster = copy.cluster.clone();
        self.names
            .entry(copy.key.clone())
            .or_default()
            .insert(cluster.clone(), uid.clone());
        self.copies
            .entry(uid.clone())
            .or_default()
            .insert(cluster.clone(), copy);
        self.restale(&uid, Some(&cluster));
    }

    pub fn remove_copy(&mut self, cluster: &str, origin_uid: &str) {
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
        // Its name is free there again: that concerns only the Job of that name, judged on
        // its own while the copy was there. A worker whose last stale copy this was may take
        // Jobs again: the next pass sees it (see `before_admission`). The room its pods free
        // is the inventory's to show (misfits found there stay valid until it does, node by
        // node).
        self.restale(origin_uid, Some(cluster));
    }

    /// Called before each admission pass: a worker that held stale copies at the last pass
    /// and holds none now may take Jobs again. (Compared pass to pass, not copy by copy: a
    /// finished Job's copy is stale from its final status until its removal, both carried
    /// out between two passes, and no pass saw the worker kept for it.)
    pub fn before_admission(&mut self) {
        let now: Vec<String> = self
            .stale
            .iter()
            .filter(|(_, uids)| !uids.is_empty())
            .map(|(c, _)| c.clone())
            .collect();
        let then = std::mem::replace(&mut self.stale_when_judged, now);
        for c in then {
            if !self.has_stale_copies(&c) {
                self.worker_changed(&c);
            }
        }
    }

    /// Whether `cluster` holds copies that should not exist and are not being deleted yet.
    pub fn has_stale_copies(&self, cluster: &str) -> bool {
        self.stale.get(cluster).is_some_and(|s| !s.is_empty())
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

    /// Looks at the Job again at `at` (or at the next plan after it).
    pub fn wake(&mut self, key: &JobKey, at: SystemTime) {
        self.timers.entry(at).or_default().insert(key.clone());
    }

    /// The earliest deadline set with [`World::wake`].
    pub fn next_timer(&self) -> Option<SystemTime> {
        self.timers.keys().next().copied()
    }

    /// Marks the Jobs whose deadlines have come.
    pub fn fire_timers(&mut self, now: SystemTime) {
        while let Some(entry) = self.timers.first_entry() {
            if *entry.key() > now {
                break;
            }
            for key in entry.remove() {
                self.touch(&key);
            }
        }
    }

    /// Replaces every copy known in `cluster` (after a relist).
    pub fn replace_copies(&mut self, cluster: &str, copies: Vec<Copy>) {
        let stale: Vec<String> = self
            .copies
            .iter()
            .filter(|(_, m)| m.contains_key(cluster))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            self.remove_copy(cluster, &uid);
        }
        for c in copies {
            self.upsert_copy(c);
        }
    }

    /// The copies of the Job with this uid, by cluster.
    pub fn copies_of(&self, uid: &str) -> impl Iterator<Item = &Copy> {
        self.copies.get(uid).into_iter().flat_map(|m| m.values())
    }

    pub fn copy_in(&self, uid: &str, cluster: &str) -> Option<&Copy> {
        self.copies.get(uid).and_then(|m| m.get(cluster))
    }

    /// The copy of a Job with another uid holding `key`'s name in `cluster` (an earlier Job
    /// of the same name, not yet removed there).
    pub fn foreign_copy(&self, key: &JobKey, uid: &str, cluster: &str) -> Option<&Copy> {
        let origin = self.names.get(key)?.get(cluster)?;
        if origin == uid {
            return None;
        }
        self.copy_in(origin, cluster)
    }

    /// Whether some worker holds a copy named `key` of another Job than `uid` (see
    /// [`World::foreign_copy`]).
    pub fn has_foreign_copy(&self, key: &JobKey, uid: &str) -> bool {
        self.names.get(key).is_some_and(|m| {
            m.iter()
                .any(|(cluster, origin)| origin != uid && self.copy_in(origin, cluster).is_some())
        })
    }

    /// Copies whose origin Job is unknown.
    pub fn orphans(&self) -> impl Iterator<Item = &Copy> {
        self.orphan_uids
            .iter()
            .filter_map(|uid| self.copies.get(uid))
            .flat_map(|m| m.values())
    }

    /// All copies in `cluster`.
    pub fn copies_in<'a>(&'a self, cluster: &'a str) -> impl Iterator<Item = &'a Copy> + 'a {
        self.copies.values().filter_map(move |m| m.get(cluster))
    }

    pub fn upsert_worker(&mut self, worker: Worker) {
        let changed = self.workers.get(&worker.name).is_none_or(|w| {
            w.connected != worker.connected || w.copies_synced != worker.copies_synced
        });
        if changed {
            let name = worker.name.clone();
            self.mark_jobs_in(&name);
            self.capacity_changed(&name);
        }
        self.workers.insert(worker.name.clone(), worker);
    }

    pub fn remove_worker(&mut self, name: &str) {
        self.workers.remove(name);
        self.mark_jobs_in(name);
        self.capacity_changed(name);
    }

    fn mark_jobs_in(&mut self, cluster: &str) {
        let keys: Vec<JobKey> = self
            .jobs
            .values()
            .filter(|j| j.cluster.as_deref() == Some(cluster))
            .map(|j| j.key.clone())
            .collect();
        self.dirty.extend(keys);
    }

    pub fn upsert_queue(&mut self, queue: Queue) {
        self.queues_generation += 1;
        self.queues.insert(queue.name.clone(), queue);
    }

    pub fn remove_queue(&mut self, name: &str) {
        self.queues_generation += 1;
        self.queues.remove(name);
    }

    pub fn queues_generation(&self) -> u64 {
        self.queues_generation
    }

    /// Holds a placement for an admitted Job (replacing any it had).
    pub fn hold(&mut self, mut hold: Hold) {
        self.hold_serial += 1;
        hold.serial = self.hold_serial;
        self.holds_changed(&hold.cluster);
        let hold = Arc::new(hold);
        self.held_in
            .entry(hold.cluster.clone())
            .or_default()
            .insert(hold.job_uid.clone(), hold.clone());
        let cluster = hold.cluster.clone();
        if let Some(old) = self.holds.insert(hold.job_uid.clone(), hold) {
            if old.cluster != cluster {
                self.unheld(&old);
            }
            self.holds_changed(&old.cluster);
            for t in &old.takes {
                self.capacity_changed_on(&old.cluster, t.index);
            }
        }
    }

    /// Stops holding the Job's placement.
    pub fn release(&mut self, job_uid: &str) {
        if let Some(old) = self.holds.remove(job_uid) {
            self.unheld(&old);
            self.holds_changed(&old.cluster);
            for t in &old.takes {
                self.capacity_changed_on(&old.cluster, t.index);
            }
        }
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
    pub fn holds_in<'w>(&'w self, cluster: &str) -> impl Iterator<Item = &'w Hold> + 'w {
        self.held_in
            .get(cluster)
            .into_iter()
            .flat_map(|holds| holds.values().map(Arc::as_ref))
    }

    /// Whether some placement is held in `cluster`.
    pub fn holds_any_in(&self, cluster: &str) -> bool {
        self.held_in.contains_key(cluster)
    }

    fn holds_changed(&mut self, cluster: &str) {
        match self.hold_versions.get_mut(cluster) {
            Some(v) => *v += 1,
            None => {
                self.hold_versions.insert(cluster.to_string(), 1);
            }
        }
    }

    /// How many times the placements held in `cluster` changed.
    pub fn hold_version(&self, cluster: &str) -> u64 {
        self.hold_versions.get(cluster).copied().unwrap_or(0)
    }

    /// `cluster` with the placements held there taken off, as an earlier pass made it, if
    /// neither its inventory nor its holds changed since.
    pub fn held_view(&self, cluster: &str) -> Option<&Arc<crate::inventory::Cluster>> {
        if !self.config.remember {
            return None;
        }
        let known = self.held_views.get(cluster)?;
        known
            .is_current(
                self.inventory.cluster_arc(cluster)?,
                self.hold_version(cluster),
            )
            .then_some(&known.view)
    }

    /// The last view made of `cluster`, current or not: the next is made from it.
    pub fn last_held_view(&self, cluster: &str) -> Option<&HeldView> {
        if !self.config.remember {
            return None;
        }
        self.held_views.get(cluster)
    }

    /// `view` is `cluster` with the placements held there now taken off, on the `held` nodes.
    pub fn held_view_of(
        &self,
        cluster: &str,
        view: Arc<crate::inventory::Cluster>,
        held: Vec<HeldNode>,
    ) -> Option<HeldView> {
        if !self.config.remember {
            return None;
        }
        Some(HeldView {
            base: Arc::downgrade(self.inventory.cluster_arc(cluster)?),
            holds: self.hold_version(cluster),
            view,
            held,
        })
    }

    pub fn remember_held_view(&mut self, cluster: String, view: HeldView) {
        self.held_views.insert(cluster, view);
    }

    /// Lets go of the views of clusters gone from the inventory or without held placements:
    /// they would keep old nodes shared (a node shared is a node copied when it changes). A
    /// view whose cluster or holds changed is kept: the next one is made from it.
    pub fn forget_stale_views(&mut self) {
        let inventory = &self.inventory;
        let held_in = &self.held_in;
        self.held_views
            .retain(|name, _| held_in.contains_key(name) && inventory.cluster_arc(name).is_some());
    }

    pub fn holds(&self) -> &BTreeMap<String, Arc<Hold>> {
        &self.holds
    }

    /// The worker may have gained room: misfits found there are looked at again.
    pub fn capacity_changed(&mut self, cluster: &str) {
        self.changed_at(cluster, None);
    }

    /// Node `index` of the worker may have gained room (a pod ended, a placement held there
    /// was released).
    pub fn capacity_changed_on(&mut self, cluster: &str, index: usize) {
        self.changed_at(cluster, Some(index));
    }

    /// Node `index` of the worker lost room (a pod was bound there): nothing waiting can go
    /// there because of it, but [`ShapeRoom`]s count it again.
    pub fn node_touched(&mut self, cluster: &str, index: usize) {
        match self.changes.get_mut(cluster) {
            Some(c) => c.touch(index),
            None => self
                .changes
                .entry(cluster.to_string())
                .or_default()
                .touch(index),
        }
    }

    /// The nodes of the worker whose room changed since position `since` of its log (some
    /// maybe more than once), and the position after them; `None` when the whole worker
    /// may have changed since (or the log no longer goes back that far).
    pub fn touches(&self, cluster: &str, since: u64) -> Option<(&[usize], u64)> {
        let Some(c) = self.changes.get(cluster) else {
            return (since == 0).then_some((&[][..], 0));
        };
        let skip = usize::try_from(since.checked_sub(c.touched_from)?).ok()?;
        Some((
            c.touched.get(skip..)?,
            c.touched_from + c.touched.len() as u64,
        ))
    }

    /// Where the worker's log of touched nodes ends now.
    pub fn touches_end(&self, cluster: &str) -> u64 {
        self.changes
            .get(cluster)
            .map_or(0, |c| c.touched_from + c.touched.len() as u64)
    }

    /// The [`ShapeRoom`]s kept across passes, for a pass to bring up to date and hand back
    /// with [`World::keep_shape_rooms`].
    pub fn take_shape_rooms(&mut self) -> ShapeRooms {
        std::mem::take(&mut self.shape_rooms)
    }

    /// Keeps what a pass brought up to date, less the workers the inventory no longer has
    /// and, once a worker holds more shapes than there are classes of pending Jobs, the
    /// shapes no pending Job has (a long-running dispatcher sees many shapes come and go).
    pub fn keep_shape_rooms(&mut self, mut rooms: ShapeRooms) {
        if rooms.len() > self.inventory.clusters.len() {
            rooms.retain(|worker, _| self.inventory.cluster(worker).is_some());
        }
        let most = self.pending.len() + 16;
        if rooms.values().any(|by_shape| by_shape.len() > most) {
            let pending: std::collections::HashSet<u64> =
                self.pending.keys().map(|class| class.shape).collect();
            for by_shape in rooms.values_mut() {
                by_shape.retain(|shape, _| pending.contains(shape));
            }
        }
        self.shape_rooms = rooms;
    }

    /// The nodes (by index) of the worker that may have gained room since `epoch`, when known
    /// node by node; `None` when anything may have changed.
    pub fn changes_since(&self, cluster: &str, epoch: u64) -> Option<Vec<usize>> {
        let c = self.changes.get(cluster)?;
        if c.anywhere > epoch {
            return None;
        }
        Some(
            c.nodes
                .iter()
                .enumerate()
                .filter(|(_, e)| **e > epoch)
                .map(|(i, _)| i)
                .collect(),
        )
    }

    fn changed_at(&mut self, cluster: &str, node: Option<usize>) {
        let epoch = self.capacity.entry(cluster.to_string()).or_insert(0);
        *epoch += 1;
        let epoch = *epoch;
        let c = self.changes.entry(cluster.to_string()).or_default();
        match node {
            None => {
                c.anywhere = epoch;
                // Past every position handed out: whoever counted before counts everything.
                c.touched_from += c.touched.len() as u64 + 1;
                c.touched.clear();
                self.worker_changed(cluster);
            }
            // Only the classes judged against this worker look again (see
            // `ClassMemo::looked`): its allocatable, and so its queues' automatic quota and
            // whether a gang could ever fit there, stay as they were.
            Some(i) => {
                if c.nodes.len() <= i {
                    c.nodes.resize(i + 1, 0);
                }
                c.nodes[i] = epoch;
                c.touch(i);
            }
        }
    }

    /// Something about the worker changed that may let Jobs of its queues go there.
    fn worker_changed(&mut self, cluster: &str) {
        if self.queues_of.0 != self.queues_generation {
            self.queues_of = (self.queues_generation, HashMap::default());
        }
        let queues = match self.queues_of.1.get(cluster) {
            Some(q) => q.clone(),
            None => {
                let q: Arc<[String]> = self
                    .queues
                    .values()
                    .filter(|q| {
                        q.settings
                            .as_ref()
                            .is_ok_and(|s| s.clusters.iter().any(|c| c == cluster))
                    })
                    .map(|q| q.name.clone())
                    .collect();
                self.queues_of.1.insert(cluster.to_string(), q.clone());
                q
            }
        };
        for q in queues.iter() {
            self.bump_queue(q);
        }
    }

    fn bump_queue(&mut self, queue: &str) {
        bump(&mut self.queue_epochs, queue);
    }

    /// What a class's failure depends on, beyond its own Jobs.
    pub fn memo_key(&self, queue: &str, starving: bool) -> MemoKey {
        MemoKey {
            queue_epoch: self.queue_epochs.get(queue).copied().unwrap_or(0),
            quota_epoch: self.quota_epochs.get(queue).copied().unwrap_or(0),
            queues: self.queues_generation,
            reservations: self.reservations_generation,
            starving,
        }
    }

    /// Why `class` failed, if nothing it depends on changed since.
    pub fn class_memo(&self, class: &ClassKey, key: &MemoKey) -> Option<&ClassMemo> {
        if !self.config.remember {
            return None;
        }
        self.class_memos.get(class).filter(|m| {
            m.key.still(key, m.waited_for_quota())
                && (!self.config.describe || !m.message.is_empty())
        })
    }

    /// Remembers why `class` failed in the pass that just ended, after
    /// [`World::reservations_now`] recorded that pass's reservations. A pass builds its
    /// reservations as it goes, in rank order: a class judged in it failed under what the
    /// Jobs ranked before it held in this pass (a starving Job that was dispatched in it
    /// no longer holds anything). So its failure stands for the next pass if the
    /// reservations stay as this pass left them, not as the one before left them: stamped
    /// with the generation before, every failure in a pass that dispatched a starving Job
    /// would be judged again in the next pass, for nothing.
    pub fn remember_class(&mut self, class: ClassKey, mut memo: ClassMemo) {
        memo.key.reservations = self.reservations_generation;
        self.class_memos.insert(class, memo);
        if self.class_memos.len() > 4 * (self.pending.len() + 1) {
            let pending = &self.pending;
            self.class_memos
                .retain(|class, _| pending.contains_key(class));
        }
    }

    /// A class whose remembered failure stood in the pass that just ended (see
    /// [`World::remember_class`]): it failed in that pass, under the reservations the pass
    /// ended with, as a class judged again in it did.
    pub fn confirm_class(&mut self, class: &ClassKey) {
        if let Some(m) = self.class_memos.get_mut(class) {
            m.key.reservations = self.reservations_generation;
        }
    }

    /// Records the workers and quota a pass held for starving Jobs; whether they differ from
    /// the last pass's (only then do the memos that stood in this pass need stamping again:
    /// they carry the generation that is still current).
    pub fn reservations_now(&mut self, fingerprint: u64) -> bool {
        if fingerprint == self.last_reservations {
            return false;
        }
        self.last_reservations = fingerprint;
        self.reservations_generation += 1;
        true
    }

    pub fn capacity_epoch(&self, cluster: &str) -> u64 {
        self.capacity.get(cluster).copied().unwrap_or(0)
    }

    /// Replaces the inventory; workers whose data changed may have gained room.
    pub fn set_inventory(&mut self, inventory: Arc<Inventory>) {
        let old = std::mem::replace(&mut self.inventory, inventory);
        let changed: Vec<String> = self
            .inventory
            .clusters
            .iter()
            .filter(|c| {
                old.cluster(&c.name)
                    .is_none_or(|o| !std::ptr::eq(o, c.as_ref()))
            })
            .map(|c| c.name.clone())
            .collect();
        for c in changed {
            self.capacity_changed(&c);
        }
    }

    /// A remembered misfit of `class` in `cluster`, found at any epoch of the current queues
    /// generation (and described, when the world asks for descriptions).
    pub fn misfit(&self, class: &ClassKey, cluster: &str) -> Option<&KnownMisfit> {
        self.misfits_of(class).get(cluster)
    }

    /// The remembered misfits of `class`, looked up once for all of its workers.
    pub fn misfits_of(&self, class: &ClassKey) -> MisfitsOf<'_> {
        MisfitsOf {
            world: self,
            by_cluster: self
                .config
                .remember
                .then(|| self.misfits.get(class))
                .flatten(),
        }
    }

    /// Whether `class` would fit in each cluster drained, where known for nodes with that
    /// cluster's [`fingerprint`] (see [`DrainedOf::get`]): the class is looked up once.
    pub fn drained_of(&self, class: &ClassKey) -> Option<DrainedOf<'_>> {
        if !self.config.remember {
            return None;
        }
        self.drained
            .get(class)
            .map(|by_cluster| DrainedOf { by_cluster })
    }

    pub fn remember_drained(
        &mut self,
        class: ClassKey,
        cluster: String,
        print: u64,
        score: Option<i64>,
    ) {
        self.drained
            .entry(class)
            .or_default()
            .insert(cluster, (print, score));
        if self.drained.len() > 4 * (self.pending.len() + 1) {
            let pending = &self.pending;
            self.drained.retain(|class, _| pending.contains_key(class));
        }
    }

    pub fn remember_misfit(&mut self, class: ClassKey, cluster: String, misfit: KnownMisfit) {
        self.misfits
            .entry(class)
            .or_default()
            .insert(cluster, misfit);
        // Forget the classes that are gone now and then.
        if self.misfits.len() > 4 * (self.pending.len() + 1) {
            let pending = &self.pending;
            self.misfits.retain(|class, _| pending.contains_key(class));
        }
    }

    pub fn queue_use(&self, queue: &str) -> Option<&QueueUse> {
        self.uses.get(queue)
    }

    pub fn queue_uses(&self) -> impl Iterator<Item = (&String, &QueueUse)> {
        self.uses.iter()
    }

    /// Pending Jobs by class, each class in admission order.
    pub fn pending_classes(&self) -> &BTreeMap<ClassKey, BTreeSet<Rank>> {
        &self.pending
    }

    /// Marks a Job for the next reconcile.
    pub fn touch(&mut self, key: &JobKey) {
        if self.jobs.contains_key(key) {
            self.dirty.insert(key.clone());
        }
    }

    /// Marks every Job (a periodic resync).
    pub fn touch_all(&mut self) {
        self.dirty = self.jobs.keys().cloned().collect();
    }

    /// The Jobs changed since the last call.
    pub fn take_dirty(&mut self) -> BTreeSet<JobKey> {
        std::mem::take(&mut self.dirty)
    }

    fn uncharge(&mut self, key: &JobKey) {
        let Some(c) = self.charges.remove(key) else {
            return;
        };
        let u = self.uses.entry(c.queue.clone()).or_default();
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
        if let Some((class, rank)) = &c.pending {
            u.pending -= 1;
            if let Some(set) = self.pending.get_mut(class) {
                set.remove(rank);
                if set.is_empty() {
                    self.pending.remove(class);
                }
            }
        }
    }

    fn charge(&mut self, job: &Job) {
        let c = Charge::of(job);
        let u = self.uses.entry(c.queue.clone()).or_default();
        for (r, v) in &c.usage {
            *u.usage.entry(r.clone()).or_insert(0) += v;
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
}

/// What the dispatcher asks for. Carried out by the live executor against the API servers,
/// or by `simulate` against its in-memory clusters.
#[derive(Debug, Clone)]
pub enum Action {
    /// Claim `cluster` for the Job, create its copy there and unsuspend the Job; `hold`
    /// is the placement to hold until the worker's inventory shows it.
    Dispatch {
        job: JobKey,
        cluster: String,
        hold: Hold,
    },
    /// Offer the Job to several workers at once: claim them, create a copy in each,
    /// unsuspend the Job. The first whose pods are all Ready wins ([`Action::Choose`]).
    Offer { job: JobKey, clusters: Vec<String> },
    /// The offered Job's copy in `cluster` ran all its pods first: it keeps the Job, the
    /// other copies are removed.
    Choose { job: JobKey, cluster: String },
    /// The Job is claimed for `cluster` but its copy is missing: create it.
    CreateCopy { job: JobKey, cluster: String },
    /// The copy exists and the Job is still suspended: unsuspend it.
    Unsuspend { job: JobKey, cluster: String },
    /// Give back a claim whose copy the worker refused (kept as a reason for the user); the
    /// worker is not asked again for this Job before `retry_at`.
    Unclaim {
        job: JobKey,
        cluster: String,
        reason: &'static str,
        message: String,
        retry_at: SystemTime,
    },
    /// Write the manager Job's status (mirrored from its copy, with our conditions).
    WriteStatus {
        job: JobKey,
        status: Box<JobStatus>,
        /// A digest of the copy's status it came from, to recognise a refused write.
        digest: u64,
    },
    /// Record how the Job ended before its copy is removed.
    RecordResult { job: JobKey, result: JobResult },
    /// Delete a copy (only ever one labelled with our origin; the uid is a precondition).
    DeleteCopy {
        cluster: String,
        job: JobKey,
        uid: String,
        origin_uid: String,
        reason: &'static str,
    },
    /// Take the Job back: suspend it, drop the claim, count the requeue.
    Requeue {
        job: JobKey,
        reason: &'static str,
        message: String,
        requeues: u32,
        requeue_after: Option<SystemTime>,
        avoid: Option<String>,
    },
    /// Give the Job up: requeuing limit reached.
    Deactivate { job: JobKey, message: String },
    /// Say why the Job waits (the `Admitted` condition, False).
    Wait {
        job: JobKey,
        reason: &'static str,
        message: String,
    },
    /// Hold a placement for an admitted Job (after a restart: its pods may not show yet).
    Hold(Hold),
    /// Stop holding the Job's placement: its worker's inventory shows it, or it ended.
    Release { job_uid: String },
}

impl Action {
    /// The manager Job the action is about.
    pub fn job(&self) -> Option<&JobKey> {
        match self {
            Action::Dispatch { job, .. }
            | Action::Offer { job, .. }
            | Action::Choose { job, .. }
            | Action::CreateCopy { job, .. }
            | Action::Unsuspend { job, .. }
            | Action::Unclaim { job, .. }
            | Action::WriteStatus { job, .. }
            | Action::RecordResult { job, .. }
            | Action::Requeue { job, .. }
            | Action::Deactivate { job, .. }
            | Action::Wait { job, .. } => Some(job),
            Action::DeleteCopy { .. } | Action::Hold(_) | Action::Release { .. } => None,
        }
    }
}

/// Bumps `key`'s counter in `epochs`.
fn bump(epochs: &mut HashMap<String, u64>, key: &str) {
    match epochs.get_mut(key) {
        Some(e) => *e += 1,
        None => {
            epochs.insert(key.to_string(), 1);
        }
    }
}
