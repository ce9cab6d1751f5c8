//! Admission: which pending Jobs are dispatched now, and where.
//!
//! Jobs are taken in one order across all queues: higher priority first, then older. A Job is
//! admitted when its queue's quota covers its whole gang (pods × per-pod request), the queue's
//! PodsReady gate is open (with `blockAdmission`, every Job admitted earlier is Ready), and the
//! placement engine fits the whole gang, node by node and NUMA zone by NUMA zone, in one of the
//! queue's workers; the best-scoring worker wins (the one the last attempt failed in only when
//! no other fits).
//!
//! Starvation, both ways:
//! - A Job that cannot be admitted does not block the Jobs behind it: they are tried in turn
//!   and take whatever fits (backfill). Jobs that can never fit (more than the queue's whole
//!   quota, larger than any worker even empty) never block anyone.
//! - A Job that has waited `starvation_after` for capacity stops being overtaken: the quota
//!   it needs is held for it, and one worker where it would fit once that worker's running
//!   Jobs end is reserved for it (no Job behind it is placed there). As that worker drains,
//!   the starving Job gets it.
//!
//! Pending Jobs that are interchangeable (same queue, namespace, pod template and gang size)
//! form a class; when the first of a class cannot be admitted, none of the rest can, so a pass
//! costs one attempt per class, not one per Job.

use super::model::{
    Action, ClassKey, ClassMemo, HeldNode, HeldView, Hold, Job, JobKey, KnownMisfit, Placement,
    Rank, ShapeRooms, World,
};
use super::reason;
use crate::inventory::{Cluster, Node, ResourceTable};
use crate::placement::inflight::Take;
use crate::placement::pod::{BoundPod, PodShape};
use crate::placement::{fit_cluster, fit_node, ClusterFit, NodeJudge, NodeState};

use crate::quantity::{display, Milli};
use foldhash::{HashMap, HashMapExt as _};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

/// A message for people, built only when the world asks for them (`simulate` asks only at
/// the end, for the Jobs still waiting).
macro_rules! say {
    ($world:expr, $($arg:tt)*) => {
        if $world.config.describe {
            format!($($arg)*)
        } else {
            String::new()
        }
    };
}

/// What one admission pass decided.
#[derive(Debug, Default)]
pub struct Admission {
    /// Dispatches, in admission order.
    pub actions: Vec<Action>,
    /// Misfits found in this pass, to remember (see [`World::misfit`]).
    pub misfits: Vec<(ClassKey, String, KnownMisfit)>,
    /// Clusters with their held placements taken off, made in this pass, to keep for the
    /// next ones (see [`World::held_view`]).
    pub held_views: Vec<(String, HeldView)>,
    /// Fits on drained workers found in this pass (see [`World::drained_of`]).
    pub drained: Vec<(ClassKey, String, u64, Option<i64>)>,
    /// Why classes failed, to remember (see [`World::class_memo`]).
    pub class_memos: Vec<(ClassKey, ClassMemo)>,
    /// Classes whose remembered failure was found to stand in this pass: they failed in it
    /// as much as those judged again (see [`World::confirm_class`]).
    pub confirmed: Vec<ClassKey>,
    /// A digest of the workers and quota held for starving Jobs at the end of the pass.
    pub reservations: u64,
    /// The [`ShapeRoom`]s the pass was given, brought up to date where it looked.
    pub shape_rooms: ShapeRooms,
    /// Why each class that was looked at and not (fully) admitted waits: its first waiting
    /// Job's reason, which is every later Job's of the class too. Kept when the world asks
    /// for descriptions (`simulate` asks only for its last look).
    pub waiting: BTreeMap<ClassKey, (&'static str, String)>,
    /// Jobs kept out for a reason of their own (a worker that refused them is backing off,
    /// an older Job of the same name is still being removed): the rest of their class is
    /// tried, and what is found for it is not remembered for the class.
    pub job_waiting: BTreeMap<JobKey, (&'static str, String)>,
    /// When the pass could decide differently without any object changing (a back-off
    /// ends, a Job starts starving).
    pub wake_at: Option<SystemTime>,
}

impl Admission {
    fn wake(&mut self, at: SystemTime) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }
}

/// Per-queue state during a pass.
#[derive(Default)]
struct QueueState {
    usage: BTreeMap<String, i64>,
    /// The quota in force, computed once per pass.
    quota: Option<Arc<BTreeMap<String, i64>>>,
    /// The nodes of the queue's workers, counted once per pass.
    nodes: Option<usize>,
    /// Quota held for starving Jobs earlier in the order.
    held: BTreeMap<String, i64>,
    /// Set when an admitted Job of a `blockAdmission` queue is not Ready: (the Job, its worker).
    gate: Option<(JobKey, String)>,
    /// The queue's workers a Job may go to in this pass (their positions in its list), found
    /// when the pass had reserved this many workers. Why a worker cannot be used is fixed for
    /// the pass, and reservations only grow within it, so the list only changes when one is
    /// added: most of a busy pass's Jobs then look at a handful of workers, not all of them.
    usable: Option<(usize, Arc<[usize]>)>,
    /// Per worker of the queue (by position in its list): its capacity epoch, `None` when
    /// the inventory does not have it. Fixed for the pass, found once.
    epochs: Option<Arc<[Option<u64>]>>,
    /// What a failure of one of its classes depends on (see [`World::memo_key`]), fixed for
    /// the pass.
    memo_key: Option<super::model::MemoKey>,
}

impl QueueState {
    fn epochs(&mut self, world: &World, clusters: &[String]) -> Arc<[Option<u64>]> {
        self.epochs
            .get_or_insert_with(|| {
                clusters
                    .iter()
                    .map(|name| {
                        world
                            .inventory
                            .cluster_arc(name)
                            .map(|_| world.capacity_epoch(name))
                    })
                    .collect()
            })
            .clone()
    }

    fn usable<'w>(
        &mut self,
        clusters: &'w [String],
        working: &mut Working<'w>,
        reserved: &Reserved,
    ) -> Arc<[usize]> {
        match &self.usable {
            Some((n, list)) if *n == reserved.len() => list.clone(),
            // Reservations only grow within a pass: the workers usable before, less those
            // reserved since (most reservations are of other queues' workers).
            Some((n, before)) => {
                let added = reserved.since(*n);
                let kept = |i: &usize| !added.iter().any(|w| *w == clusters[*i]);
                let list: Arc<[usize]> = if before.iter().all(kept) {
                    before.clone()
                } else {
                    before.iter().copied().filter(kept).collect()
                };
                self.usable = Some((reserved.len(), list.clone()));
                list
            }
            None => {
                let list: Arc<[usize]> = clusters
                    .iter()
                    .enumerate()
                    .filter(|(_, name)| working.unusable(name, reserved).is_none())
                    .map(|(i, _)| i)
                    .collect();
                self.usable = Some((reserved.len(), list.clone()));
                list
            }
        }
    }
}

/// The workers kept for starving Jobs so far in a pass, with the Job each is kept for, and
/// the order they were first kept in.
#[derive(Default)]
struct Reserved {
    by_worker: BTreeMap<String, JobKey>,
    order: Vec<String>,
}

impl Reserved {
    fn insert(&mut self, worker: String, job: JobKey) {
        if let Some(was) = self.by_worker.get_mut(&worker) {
            *was = job;
        } else {
            self.order.push(worker.clone());
            self.by_worker.insert(worker, job);
        }
    }

    fn get(&self, worker: &str) -> Option<&JobKey> {
        self.by_worker.get(worker)
    }

    /// How many workers are kept.
    fn len(&self) -> usize {
        self.order.len()
    }

    /// The workers first kept after the first `n`.
    fn since(&self, n: usize) -> &[String] {
        self.order.get(n..).unwrap_or_default()
    }

    /// The worker kept for `job`, if any.
    fn of(&self, job: &JobKey) -> Option<&String> {
        self.by_worker
            .iter()
            .find(|(_, k)| *k == job)
            .map(|(c, _)| c)
    }
}

/// Per (node index, shape key) of one cluster: the cluster's version when counted, the most
/// pods that were asked for, and how many fit.
type RoomCounts = HashMap<(usize, u64), (u64, usize, usize)>;

/// The clusters as this pass sees them: the inventory, minus placements held for admitted
/// Jobs and those handed out earlier in the pass. Shared with the inventory (or the held view
/// an earlier pass made) until this pass changes them.
struct Working<'a> {
    world: &'a World,
    clusters: BTreeMap<String, Arc<Cluster>>,
    /// Held views made in this pass (see [`Admission::held_views`]).
    views: Vec<(String, HeldView)>,
    /// Under [`Placement::SumOfFree`]: what this pass gave each cluster, per resource.
    sums_taken: BTreeMap<String, BTreeMap<String, i64>>,
    /// Per cluster, how many placements this pass has taken from it so far.
    versions: HashMap<String, u64>,
    /// The fits (and misfits) of a class in a cluster found in this pass, with the cluster's
    /// version then: the Jobs of a class are tried one after another, and only the cluster
    /// the last one went to changed for the next.
    /// By class, then cluster: looked up without building a key.
    fits: HashMap<ClassKey, HashMap<String, (u64, Arc<ClusterFit>)>>,
    /// Per cluster, why no Job may go there in this pass (reservations aside), found once.
    unusable: HashMap<&'a str, Option<String>>,
    /// Per cluster not looked at whole yet, the placements held there by node (index).
    held_by_node: HashMap<&'a str, Vec<(usize, &'a Take)>>,
    /// Nodes of such clusters with the placements held on them taken off, made once per pass.
    held_nodes: HashMap<&'a str, HashMap<usize, Node>>,
    /// The nodes of a cluster that may have gained room since an epoch, found once per pass:
    /// the misfits of most classes in a cluster were found (or last confirmed) at the same
    /// epochs.
    changed: HashMap<(&'a str, u64), Option<Arc<[usize]>>>,
    /// How many pods of a shape fit on a node as this pass sees it (by cluster, node index
    /// and shape key), found once and shared by the classes of that shape: the cluster's
    /// version then, the most that was asked for, and the count.
    room: HashMap<&'a str, RoomCounts>,
    /// Kept across passes (see [`ShapeRoom`]).
    shape_rooms: ShapeRooms,
    /// Pod shapes bound to the inventory's resource table, by shape key, found once per pass.
    bound: HashMap<u64, Arc<BoundPod>>,
}

impl<'a> Working<'a> {
    fn new(world: &'a World, shape_rooms: ShapeRooms) -> Self {
        Self {
            world,
            clusters: BTreeMap::new(),
            views: Vec::new(),
            sums_taken: BTreeMap::new(),
            versions: HashMap::new(),
            fits: HashMap::new(),
            unusable: HashMap::new(),
            held_by_node: HashMap::new(),
            held_nodes: HashMap::new(),
            changed: HashMap::new(),
            room: HashMap::new(),
            shape_rooms,
            bound: HashMap::new(),
        }
    }

    /// `shape` (whose key is `key`) bound to the inventory's resource table.
    fn bound(&mut self, key: u64, shape: &PodShape) -> Arc<BoundPod> {
        let table = &self.world.inventory.resources;
        self.bound
            .entry(key)
            .or_insert_with(|| Arc::new(shape.bind(table)))
            .clone()
    }

    /// At most how many pods of shape `shape` the nodes of worker `name` can take at once,
    /// counting up to `gang` per node (see [`ShapeRoom`]): only the nodes whose room changed
    /// since the last look are counted again. `None` when the inventory lacks the worker.
    fn room_of(
        &mut self,
        name: &str,
        shape: u64,
        gang: usize,
        mut count: impl FnMut(&Node, usize) -> usize,
    ) -> Option<usize> {
        let world = self.world;
        let base = world.inventory.cluster(name)?;
        let by_shape = match self.shape_rooms.get_mut(name) {
            Some(m) => m,
            None => self.shape_rooms.entry(name.to_string()).or_default(),
        };
        let room = by_shape.entry(shape).or_default();
        let touched = world
            .touches(name, room.pos)
            .filter(|_| room.cap >= gang && room.counts.len() == base.nodes.len());
        match touched {
            Some((nodes, end)) => {
                for &i in nodes {
                    let (Some(node), Some(was)) = (base.nodes.get(i), room.counts.get_mut(i))
                    else {
                        continue;
                    };
                    let now = count(node, room.cap) as u32;
                    room.total = room.total - *was as usize + now as usize;
                    *was = now;
                }
                room.pos = end;
            }
            None => {
                room.cap = room.cap.max(gang);
                room.pos = world.touches_end(name);
                room.counts = base
                    .nodes
                    .iter()
                    .map(|n| count(n, room.cap) as u32)
                    .collect();
                room.total = room.counts.iter().map(|&c| c as usize).sum();
            }
        }
        // Every change to a node's room reaches the log (or marks the whole worker).
        #[cfg(debug_assertions)]
        for (i, node) in base.nodes.iter().enumerate() {
            debug_assert_eq!(
                count(node, room.cap) as u32,
                room.counts[i],
                "node {i} of {name} changed without a touch"
            );
        }
        Some(room.total)
    }

    /// [`World::changes_since`], found once per pass.
    fn changes_since(&mut self, name: &'a str, epoch: u64) -> Option<Arc<[usize]>> {
        let world = self.world;
        self.changed
            .entry((name, epoch))
            .or_insert_with(|| world.changes_since(name, epoch).map(Arc::from))
            .clone()
    }

    /// Counts how many pods of shape `shape` fit on each of `nodes` of cluster `name` as this
    /// pass sees it, adding the nodes with room to `counts`, until what `counts` holds reaches
    /// `gang`; returns what it holds then. A node's count is found once per pass and
    /// shared by the classes of that shape; `count` counts the pods that fit on a node, up to
    /// a number. Where the nodes come from (this pass's copy of the cluster, the held view,
    /// the inventory with the placements held there taken off) is found once for them all.
    fn count_room(
        &mut self,
        name: &'a str,
        nodes: &[usize],
        shape: u64,
        gang: usize,
        counts: &mut Vec<(usize, usize)>,
        mut count: impl FnMut(&Node, usize) -> usize,
    ) -> usize {
        let mut bound: usize = counts.iter().map(|(_, c)| c).sum();
        let world = self.world;
        let version = self.versions.get(name).copied().unwrap_or(0);
        let view: Option<&Cluster> = match self.clusters.get(name) {
            Some(c) => Some(c),
            None => world.held_view(name).map(Arc::as_ref),
        };
        let base = match view {
            Some(_) => None,
            None => world.inventory.cluster_arc(name),
        };
        let held = match base {
            Some(base) if world.holds_any_in(name) => {
                Some(&*self.held_by_node.entry(name).or_insert_with(|| {
                    let mut held: Vec<(usize, &Take)> = world
                        .holds_in(name)
                        .flat_map(|h| &h.takes)
                        .filter_map(|t| Some((node_of(base, t)?, t)))
                        .collect();
                    // Stable: a node's takes stay in the order `apply` takes them.
                    held.sort_by_key(|(i, _)| *i);
                    held
                }))
            }
            _ => None,
        };
        let room = self.room.entry(name).or_default();
        let held_nodes = self.held_nodes.entry(name).or_default();
        for &i in nodes {
            if bound >= gang {
                break;
            }
            let want = gang - bound;
            let c = match room.get(&(i, shape)) {
                // A count below what was asked is all the room there is.
                Some(&(v, asked, c)) if v == version && (c < asked || want <= asked) => c.min(want),
                _ => {
                    let node: Option<&Node> = match (view, base, held) {
                        (Some(v), _, _) => v.nodes.get(i).map(Arc::as_ref),
                        (None, Some(base), None) => base.nodes.get(i).map(Arc::as_ref),
                        (None, Some(base), Some(held)) => base.nodes.get(i).map(|node| {
                            let from = held.partition_point(|(j, _)| *j < i);
                            let mut on =
                                held[from..].iter().take_while(|(j, _)| *j == i).peekable();
                            if on.peek().is_none() {
                                return node.as_ref();
                            }
                            held_nodes.entry(i).or_insert_with(|| {
                                let mut n = Node::clone(node);
                                for (_, t) in on {
                                    t.apply_to(&mut n);
                                }
                                n
                            })
                        }),
                        (None, None, _) => None,
                    };
                    match node {
                        None => 0,
                        Some(n) => {
                            let c = count(n, want);
                            room.insert((i, shape), (version, want, c));
                            c
                        }
                    }
                }
            };
            if c > 0 {
                counts.push((i, c));
                bound += c;
            }
        }
        bound
    }

    /// Why no Job may go to `name` now, if none may.
    fn unusable(&mut self, name: &'a str, reserved: &Reserved) -> Option<String> {
        let world = self.world;
        let base = self
            .unusable
            .entry(name)
            .or_insert_with(|| unusable(world, name));
        if base.is_some() {
            return base.clone();
        }
        let other = reserved.get(name)?;
        Some(say!(world, "kept for {other}, which has waited longest"))
    }

    fn version(&self, cluster: &str) -> u64 {
        self.versions.get(cluster).copied().unwrap_or(0)
    }

    /// The fit of `class` in `cluster` found earlier in this pass, if the cluster has not
    /// changed since.
    fn known_fit(&self, class: &ClassKey, cluster: &str) -> Option<Arc<ClusterFit>> {
        let (version, fit) = self.fits.get(class)?.get(cluster)?;
        (*version == self.version(cluster)).then(|| fit.clone())
    }

    fn remember_fit(
        &mut self,
        class: &ClassKey,
        cluster: &str,
        fit: ClusterFit,
    ) -> Arc<ClusterFit> {
        let fit = Arc::new(fit);
        let version = self.version(cluster);
        let by_cluster = match self.fits.get_mut(class) {
            Some(m) => m,
            None => self.fits.entry(class.clone()).or_default(),
        };
        by_cluster.insert(cluster.to_string(), (version, fit.clone()));
        fit
    }

    /// The cluster as this pass has it, if already looked at.
    fn peek(&self, name: &str) -> Option<&Cluster> {
        self.clusters.get(name).map(Arc::as_ref)
    }

    fn cluster(&mut self, name: &str) -> Option<&Cluster> {
        if !self.clusters.contains_key(name) {
            let world = self.world;
            let base = world.inventory.cluster_arc(name)?;
            let cluster = if !world.holds_any_in(name) {
                base.clone()
            } else if let Some(view) = world.held_view(name) {
                view.clone()
            } else {
                let (c, held) = held_cluster(world, name, base);
                let c = Arc::new(c);
                if let Some(v) = world.held_view_of(name, c.clone(), held) {
                    self.views.push((name.to_string(), v));
                }
                c
            };
            self.clusters.insert(name.to_string(), cluster);
        }
        self.clusters.get(name).map(Arc::as_ref)
    }

    /// Under [`Placement::SumOfFree`]: whether the cluster's free resources, summed over its
    /// nodes, cover `need`; its LeastAllocated score on those sums (0–10) if so.
    fn sum_fit(&mut self, name: &str, need: &BTreeMap<String, i64>) -> Result<i64, String> {
        let table = &self.world.inventory.resources;
        let taken = self.sums_taken.get(name).cloned().unwrap_or_default();
        let Some(cluster) = self.cluster(name) else {
            return Err("not in the inventory yet".into());
        };
        let mut score = 0;
        let mut counted = 0;
        for (r, &n) in need {
            let Some(id) = table.id(r) else {
                return Err(format!("has no {r}"));
            };
            // Remote amounts: sums saturate rather than wrap.
            let free: i64 = cluster
                .nodes
                .iter()
                .fold(0i64, |sum, node| sum.saturating_add(node.free(id)))
                .saturating_sub(taken.get(r).copied().unwrap_or(0));
            if free < n {
                return Err(format!(
                    "its nodes together have {} {r} free, the gang needs {}",
                    show(r, free.max(0)),
                    show(r, n)
                ));
            }
            let alloc = cluster.summary.allocatable.get(id).copied().unwrap_or(0);
            if alloc > 0 && (r == "cpu" || r == "memory") {
                score += free.saturating_sub(n).saturating_mul(10) / alloc;
                counted += 1;
            }
        }
        Ok(if counted == 0 { 0 } else { score / counted })
    }

    fn sum_take(&mut self, name: &str, need: &BTreeMap<String, i64>) {
        let t = self.sums_taken.entry(name.to_string()).or_default();
        for (r, v) in need {
            *t.entry(r.clone()).or_insert(0) += v;
        }
    }

    fn take(&mut self, name: &str, takes: &[Take]) {
        *self.versions.entry(name.to_string()).or_insert(0) += 1;
        if let Some(c) = self.clusters.get_mut(name) {
            apply(Arc::make_mut(c), takes.iter());
        }
    }
}

/// `base` with the placements held in it taken off, and the nodes they were taken from.
/// A node that is the same in the inventory as when the last view was made, with the same
/// placements held on it, is taken from that view as it is.
fn held_cluster(world: &World, name: &str, base: &Arc<Cluster>) -> (Cluster, Vec<HeldNode>) {
    use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
    let mut on: Vec<(usize, (u64, usize), &Take)> = world
        .holds_in(name)
        .flat_map(|h| {
            h.takes
                .iter()
                .enumerate()
                .map(move |(k, t)| ((h.serial, k), t))
        })
        .filter_map(|(id, t)| Some((node_of(base, t)?, id, t)))
        .collect();
    // Stable: a node's takes stay in the order they are held.
    on.sort_by_key(|(i, _, _)| *i);
    let last = world
        .last_held_view(name)
        .filter(|v| v.view.nodes.len() == base.nodes.len());
    let mut c = Cluster::clone(base);
    let mut held = Vec::new();
    let hasher = foldhash::fast::FixedState::default();
    for group in on.chunk_by(|a, b| a.0 == b.0) {
        let index = group[0].0;
        let mut h = hasher.build_hasher();
        for (_, id, _) in group {
            id.hash(&mut h);
        }
        let digest = h.finish();
        let node = HeldNode {
            index,
            base: Arc::downgrade(&base.nodes[index]),
            digest,
        };
        let same = last.and_then(|v| {
            let k = v.held.binary_search_by_key(&index, |n| n.index).ok()?;
            let was = &v.held[k];
            (was.digest == digest && was.base.ptr_eq(&node.base))
                .then(|| v.view.nodes[index].clone())
        });
        match same {
            Some(n) => c.nodes[index] = n,
            None => {
                let n = Arc::make_mut(&mut c.nodes[index]);
                for (_, _, t) in group {
                    t.apply_to(n);
                }
            }
        }
        held.push(node);
    }
    // The summary is left as it was (see `apply`).
    (c, held)
}

/// Where the node a take was made on is in `cluster` now.
fn node_of(cluster: &Cluster, t: &Take) -> Option<usize> {
    match cluster.nodes.get(t.index) {
        // The same name, shared: no need to compare the text.
        Some(n) if Arc::ptr_eq(&n.name, &t.node) || n.name == t.node => Some(t.index),
        _ => cluster.nodes.iter().position(|n| n.name == t.node),
    }
}

fn apply<'t>(cluster: &mut Cluster, takes: impl Iterator<Item = &'t Take>) {
    for t in takes {
        if let Some(node) = node_of(cluster, t).and_then(|i| cluster.nodes.get_mut(i)) {
            t.apply_to(std::sync::Arc::make_mut(node));
        }
    }
    // The summary is left as it was: an upper bound of what is free, which only makes its
    // early rejections rarer, never wrong, and spares a pass over every node.
}

/// The result of trying one Job (`WaitAlone`: it waits for a reason of its own, not its
/// class's).
enum Attempt {
    Dispatch { cluster: String, takes: Vec<Take> },
    Offer { clusters: Vec<String> },
    Wait(&'static str, String),
    WaitAlone(&'static str, String),
}

/// One admission pass over every queue's pending Jobs.
pub fn admit(world: &World, now: SystemTime, shape_rooms: ShapeRooms) -> Admission {
    let mut pass = Admission::default();
    let mut queues: BTreeMap<&str, QueueState> = BTreeMap::new();
    for (name, u) in world.queue_uses() {
        let gate = world.queues.get(name).and_then(|q| {
            let s = q.settings.as_ref().ok()?;
            if !s.wait_for_pods_ready.as_ref()?.block_admission {
                return None;
            }
            let first = u.not_ready.iter().next()?;
            let job = world.jobs.get(&first.key)?;
            Some((job.key.clone(), job.cluster.clone().unwrap_or_default()))
        });
        queues.insert(
            name.as_str(),
            QueueState {
                usage: u.usage.clone(),
                quota: None,
                nodes: None,
                held: BTreeMap::new(),
                gate,
                usable: None,
                epochs: None,
                memo_key: None,
            },
        );
    }
    let mut working = Working::new(world, shape_rooms);
    // Clusters reserved for starving Jobs, with the Job.
    let mut reserved = Reserved::default();

    // Each class's pending Jobs in rank order, gone through once per pass; the first eligible
    // Job of each class, ordered by rank across classes (ranks are unique: they end with the
    // Job's key).
    let mut classes: Vec<(&ClassKey, std::collections::btree_set::Iter<'_, Rank>)> = world
        .pending_classes()
        .iter()
        .map(|(class, ranks)| (class, ranks.iter()))
        .collect();
    // The first heads, sorted once; the heads of classes that moved on to their next Job,
    // in a heap. Most classes are looked at once per pass (their first Job waits), so the
    // pass takes them in order from the sorted list and the heap stays small.
    let mut first: Vec<(&Rank, usize)> = Vec::with_capacity(classes.len());
    let mut heads: BinaryHeap<Reverse<(&Rank, usize)>> = BinaryHeap::new();
    // Each class's head Job, found with its rank.
    let mut head_jobs: Vec<Option<&Job>> = vec![None; classes.len()];
    for (i, (_, ranks)) in classes.iter_mut().enumerate() {
        if let Some((rank, job)) = next_eligible(world, ranks, now, &mut pass) {
            first.push((rank, i));
            head_jobs[i] = Some(job);
        }
    }
    first.sort_unstable();
    let mut first = first.into_iter().peekable();
    loop {
        // The lowest head of either (ranks are unique: the order a single heap would give).
        let head = match (first.peek(), heads.peek()) {
            (Some(a), Some(Reverse(b))) if b < a => heads.pop().map(|Reverse(h)| h),
            (Some(_), _) => first.next(),
            (None, _) => heads.pop().map(|Reverse(h)| h),
        };
        let Some((_, i)) = head else {
            break;
        };
        let class = classes[i].0;
        let Some(job) = head_jobs[i] else {
            continue;
        };
        let state = queues.entry(job.queue.as_str()).or_default();
        let mut next = false;
        match attempt(
            world,
            job,
            class,
            state,
            &mut working,
            &mut reserved,
            now,
            &mut pass,
        ) {
            Attempt::Dispatch { cluster, takes } => {
                add_to(&mut state.usage, job.total_requests());
                if blocks_admission(world, job) {
                    state.gate = Some((job.key.clone(), cluster.clone()));
                }
                working.take(&cluster, &takes);
                pass.actions.push(Action::Dispatch {
                    job: job.key.clone(),
                    cluster: cluster.clone(),
                    hold: Hold {
                        job_uid: job.uid.clone(),
                        cluster,
                        takes,
                        since: now,
                        serial: 0,
                    },
                });
                next = true;
            }
            Attempt::Offer { clusters } => {
                add_to(&mut state.usage, job.total_requests());
                if blocks_admission(world, job) {
                    state.gate = Some((job.key.clone(), clusters.join(", ")));
                }
                pass.actions.push(Action::Offer {
                    job: job.key.clone(),
                    clusters,
                });
                next = true;
            }
            Attempt::Wait(reason, message) => {
                if world.config.describe {
                    pass.waiting.insert(class.clone(), (reason, message));
                }
            }
            Attempt::WaitAlone(reason, message) => {
                pass.job_waiting.insert(job.key.clone(), (reason, message));
                next = true;
            }
        }
        if next {
            if let Some((rank, job)) = next_eligible(world, &mut classes[i].1, now, &mut pass) {
                heads.push(Reverse((rank, i)));
                head_jobs[i] = Some(job);
            }
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    {
        use std::hash::Hash;
        reserved.by_worker.hash(&mut h);
        for (q, s) in &queues {
            (q, &s.held).hash(&mut h);
        }
    }
    pass.reservations = std::hash::Hasher::finish(&h);
    pass.held_views = working.views;
    pass.shape_rooms = working.shape_rooms;
    pass
}

/// The next Job of a class that may be tried now: not backing off, not still running in a
/// worker from before its requeue (starting it elsewhere now would run it twice; tried again
/// once that copy goes), not refused by the manager (tried again once the Job changes).
fn next_eligible<'w>(
    world: &'w World,
    ranks: &mut std::collections::btree_set::Iter<'w, Rank>,
    now: SystemTime,
    pass: &mut Admission,
) -> Option<(&'w Rank, &'w Job)> {
    for rank in ranks {
        let job = world.jobs.get(&rank.key)?;
        match job.requeue_after {
            Some(t) if t > now => pass.wake(t),
            _ if still_running(world, job) => {}
            _ if world.refused_write(job).is_some() => {}
            _ => return Some((rank, job)),
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn attempt<'w>(
    world: &'w World,
    job: &Job,
    class: &ClassKey,
    state: &mut QueueState,
    working: &mut Working<'w>,
    reserved: &mut Reserved,
    now: SystemTime,
    pass: &mut Admission,
) -> Attempt {
    let Some(queue) = world.queues.get(&job.queue) else {
        return Attempt::Wait(
            reason::QUEUE_NOT_FOUND,
            say!(world,
                "queue {:?} does not exist: create a DispatchQueue named {:?}, or label the Job with an existing queue",
                job.queue, job.queue
            ),
        );
    };
    let settings = match &queue.settings {
        Ok(s) => s,
        Err(e) => {
            return Attempt::Wait(
                reason::QUEUE_INVALID,
                say!(world, "queue {:?} is not usable: {e}", job.queue),
            )
        }
    };
    if let Some(selector) = &settings.namespace_selector {
        let fallback;
        let labels = match &job.namespace_labels {
            Some(l) => l.as_ref(),
            None => {
                fallback = BTreeMap::from([(
                    crate::wellknown::NAMESPACE_NAME_LABEL.to_string(),
                    job.key.namespace.clone(),
                )]);
                &fallback
            }
        };
        if !crate::selector::matches(selector, labels) {
            return Attempt::Wait(
                reason::NAMESPACE_NOT_ALLOWED,
                say!(
                    world,
                    "namespace {} does not match the namespaceSelector of queue {:?}",
                    job.key.namespace,
                    job.queue
                ),
            );
        }
    }
    if let Err(e) = &job.pod {
        return Attempt::Wait(reason::INVALID_JOB, e.clone());
    }
    if let Some((other, cluster)) = &state.gate {
        return Attempt::Wait(
            reason::WAITING_FOR_PODS_READY,
            say!(world,
                "queue {:?} admits one Job at a time until its pods are Ready (blockAdmission): waiting for {other} in {cluster}",
                job.queue
            ),
        );
    }

    // What follows depends only on the queue's workers, quota and reservations (and on
    // whether the Job starves): when none of them changed since the class last failed, it
    // fails the same way.
    let starving = now.duration_since(job.waiting_since()).unwrap_or_default()
        >= world.config.starvation_after;
    if !starving {
        pass.wake(job.waiting_since() + world.config.starvation_after);
    }
    // Fixed for the pass: found once per queue.
    let key = super::model::MemoKey {
        starving,
        ..state
            .memo_key
            .get_or_insert_with(|| world.memo_key(&job.queue, false))
            .clone()
    };
    // A Job kept from some worker for a reason of its own is judged on its own: its class's
    // memo does not know that reason (and would hide it from the user).
    let alone = has_own_blocker(world, job, &settings.clusters, now);
    let memo = world.class_memo(class, &key).filter(|m| {
        !alone && {
            // The workers it was judged against are the ones it may use now, and none of
            // them gained room since.
            let epochs = state.epochs(world, &settings.clusters);
            m.looked
                .iter()
                .all(|&(order, epoch)| epochs.get(order) == Some(&epoch))
                && m.usable
                    .as_ref()
                    .is_none_or(|u| **u == *state.usable(&settings.clusters, working, reserved))
        }
    });
    if let Some(m) = memo {
        pass.confirmed.push(class.clone());
        if let Some(c) = &m.reserve {
            reserved.insert(c.clone(), job.key.clone());
        }
        if m.holds_quota {
            add_to(&mut state.held, job.total_requests());
        }
        return Attempt::Wait(m.reason, m.message.clone());
    }
    let reserved_before = reserved.len();
    let held_before = state.held.values().sum::<i64>();
    let mut seen = Seen::default();
    let attempt = judge(
        world, job, class, settings, state, working, reserved, starving, now, pass, &mut seen,
    );
    if let Attempt::Wait(reason, message) = &attempt {
        let reserve = (reserved.len() > reserved_before)
            .then(|| reserved.of(&job.key).cloned())
            .flatten();
        pass.class_memos.push((
            class.clone(),
            ClassMemo {
                key,
                reason,
                message: message.clone(),
                reserve,
                holds_quota: state.held.values().sum::<i64>() > held_before,
                usable: seen.usable,
                looked: seen.looked.into(),
            },
        ));
    }
    attempt
}

/// What a judgement looked at, for its class's memo (see [`ClassMemo`]).
#[derive(Default)]
struct Seen {
    usable: Option<Arc<[usize]>>,
    looked: Vec<(usize, Option<u64>)>,
}

/// Quota and placement for a Job whose queue, namespace, template and gate allow it.
#[allow(clippy::too_many_arguments)]
fn judge<'w>(
    world: &'w World,
    job: &Job,
    class: &ClassKey,
    settings: &'w crate::api::QueueSettings,
    state: &mut QueueState,
    working: &mut Working<'w>,
    reserved: &mut Reserved,
    starving: bool,
    now: SystemTime,
    pass: &mut Admission,
    seen: &mut Seen,
) -> Attempt {
    let shape = match &job.pod {
        Ok(s) => s,
        Err(e) => return Attempt::Wait(reason::INVALID_JOB, e.clone()),
    };
    // Quota.
    let need = || job.total_requests();
    let quota = state
        .quota
        .get_or_insert_with(|| Arc::new(effective_quota(world, settings, now)))
        .clone();
    // The texts are only written when the world asks for messages; the flags decide.
    let describing = world.config.describe;
    let (mut is_short, mut is_never) = (false, false);
    let mut short = String::new();
    let mut never = String::new();
    for (r, n) in need() {
        let Some(&limit) = quota.get(r) else {
            if settings.quota.is_none() && n > 0 {
                is_never = true;
                if describing {
                    let _ = write!(never, "{}{} {r}", sep(&never), show(r, n));
                }
            }
            continue;
        };
        if n > limit {
            is_never = true;
            let _ = describing
                && write!(
                    never,
                    "{}{} {r} (quota {})",
                    sep(&never),
                    show(r, n),
                    show(r, limit)
                )
                .is_ok();
            continue;
        }
        let used =
            state.usage.get(r).copied().unwrap_or(0) + state.held.get(r).copied().unwrap_or(0);
        if used + n > limit {
            is_short = true;
            let _ = describing
                && write!(
                    short,
                    "{}{} {r} ({} of {} free)",
                    sep(&short),
                    show(r, n),
                    show(r, (limit - used).max(0)),
                    show(r, limit)
                )
                .is_ok();
        }
    }
    if is_never {
        return Attempt::Wait(
            reason::NEVER_FITS,
            say!(
                world,
                "the gang of {} pods needs more than queue {:?} can ever give: {never}",
                job.gang(),
                job.queue
            ),
        );
    }
    if is_short {
        let mut message = say!(
            world,
            "waiting for quota in queue {:?}: the gang of {} pods needs {short}",
            job.queue,
            job.gang()
        );
        if starving {
            add_to(&mut state.held, need());
            if describing {
                message.push_str("; its quota is held for it from now on");
            }
        }
        return Attempt::Wait(reason::QUOTA_EXCEEDED, message);
    }

    // Placement.
    // Bound to the resource table once per pass and shape.
    let bound_shape = working.bound(class.shape, shape);
    let bound_pod: &BoundPod = &bound_shape;
    let strategy = shape.strategy(settings.strategy);
    let gang = job.gang() as usize;
    // The engine's search for the whole gang in one cluster.
    let search = |cluster: &Cluster| {
        fit_cluster(
            cluster,
            &world.inventory.resources,
            shape,
            bound_pod,
            gang,
            &world.config.engine,
            strategy,
        )
    };
    let mut fits: Vec<(bool, i64, usize, &str)> = Vec::new();
    let mut reasons: Vec<(&str, String, bool)> = Vec::new();
    let mut candidates = Vec::new();
    // Counts the pods that fit on a node (for misfits found earlier), reusing its buffers.
    let mut counter: Option<NodeJudge<'_>> = None;
    let mut count = |node: &Node, want: usize| {
        counter
            .get_or_insert_with(|| {
                NodeJudge::new(
                    &world.inventory.resources,
                    shape,
                    bound_pod,
                    &world.config.engine,
                    strategy,
                )
            })
            .count(node, want)
    };
    // Workers kept from this Job alone (not from its class), with a reason of that kind.
    let mut own: Option<&'static str> = None;
    // Some worker could not be looked at now (unreachable, kept for another Job, ...).
    let mut unseen = false;
    let misfits = world.misfits_of(class);
    // Only a Job refused somewhere, or whose name a copy of another Job holds, is kept from
    // some worker for a reason of its own.
    let may_be_kept = !job.refusals.is_empty() || world.has_foreign_copy(&job.key, &job.uid);
    let queue_nodes = *state.nodes.get_or_insert_with(|| {
        settings
            .clusters
            .iter()
            .filter_map(|n| world.inventory.cluster(n))
            .map(|c| c.nodes.len())
            .sum()
    });
    // The workers not kept from every Job now. When messages are written, every worker is
    // gone through, so that each one's reason is given in the queue's order.
    let usable = state.usable(&settings.clusters, working, reserved);
    seen.usable = Some(usable.clone());
    let unseen_any = usable.len() < settings.clusters.len();
    let every: Arc<[usize]>;
    let looked_at = if world.config.describe {
        every = (0..settings.clusters.len()).collect();
        &every
    } else {
        &usable
    };
    let parallel_from = 2 * crate::placement::fit::PARALLEL_NODES;
    if world.config.placement == Placement::Exact
        && world.config.remember
        && queue_nodes >= parallel_from
    {
        // The workers nothing is known about yet are judged all at once, across the cores
        // when they have enough nodes between them; the loop below then finds their fits
        // as found in this pass.
        let mut todo: Vec<&'w str> = Vec::new();
        let mut nodes = 0;
        for name in usable.iter().map(|&i| &settings.clusters[i]) {
            let Some(c) = world.inventory.cluster(name) else {
                continue;
            };
            if (may_be_kept && own_blocker(world, job, name, now).is_some())
                || working.known_fit(class, name).is_some()
                || misfits.get(name).is_some()
            {
                continue;
            }
            nodes += c.nodes.len();
            todo.push(name);
        }
        if todo.len() > 1 && nodes >= parallel_from {
            for name in &todo {
                working.cluster(name);
            }
            let clusters: Vec<&Cluster> = todo.iter().filter_map(|n| working.peek(n)).collect();
            let found = if clusters.len() == todo.len() {
                crate::placement::fit_clusters(
                    &clusters,
                    &world.inventory.resources,
                    shape,
                    bound_pod,
                    gang,
                    &world.config.engine,
                    strategy,
                )
            } else {
                Vec::new()
            };
            for (name, fit) in todo.iter().zip(found) {
                if let Some(m) = &fit.misfit {
                    let known = found_misfit(world, m, &fit, world.capacity_epoch(name));
                    pass.misfits.push((class.clone(), name.to_string(), known));
                }
                working.remember_fit(class, name, fit);
            }
        }
    }
    unseen |= unseen_any;
    // Only when going through every worker: the usable ones were found above.
    let check_each = looked_at.len() != usable.len();
    let epochs = state.epochs(world, &settings.clusters);
    // Most classes are judged once in a pass: nothing found for them earlier in it.
    let may_know = world.config.remember && working.fits.contains_key(class);
    for &order in looked_at.iter() {
        let name = &settings.clusters[order];
        if let Some(why) = check_each
            .then(|| working.unusable(name, reserved))
            .flatten()
        {
            reasons.push((name.as_str(), why, false));
            continue;
        }
        if let Some((kind, why, until)) = may_be_kept
            .then(|| own_blocker(world, job, name, now))
            .flatten()
        {
            if let Some(t) = until {
                pass.wake(t);
            }
            own = Some(own.map_or(kind, |k| if k == reason::WORKER_REFUSED { k } else { kind }));
            reasons.push((name.as_str(), why, false));
            continue;
        }
        candidates.push(name);
        seen.looked.push((order, epochs[order]));
        let preferred = job.avoid.as_deref() != Some(name.as_str());
        match world.config.placement {
            Placement::Everywhere => fits.push((true, 0, order, name.as_str())),
            Placement::SumOfFree => match working.sum_fit(name, &job.total_request()) {
                Ok(score) => fits.push((preferred, score, order, name.as_str())),
                Err(why) => reasons.push((name.as_str(), why, false)),
            },
            Placement::Exact => {
                let Some(epoch) = epochs[order] else {
                    reasons.push((name.as_str(), "not in the inventory yet".into(), false));
                    continue;
                };
                let known = may_know.then(|| working.known_fit(class, name)).flatten();
                if let Some(fit) = known {
                    match &fit.misfit {
                        None => fits.push((preferred, fit.score, order, name.as_str())),
                        Some(m) => {
                            reasons.push((name.as_str(), describe(world, m), m.unresolvable()))
                        }
                    }
                    continue;
                }
                // Still a misfit if the nodes that gained room since it was found cannot make
                // up the difference (or none did).
                if let Some(known) = misfits.get(name) {
                    let full = || {
                        world.inventory.cluster(name).is_some_and(|c| {
                            crate::placement::fit::summary_shortfall(&c.summary, shape, bound_pod)
                                .is_some()
                        })
                    };
                    let bound = if known.epoch == epoch {
                        Some((known.fitted(), known.counts.clone()))
                    } else if full() {
                        // No node has room for one pod: none that gained some can add any.
                        Some((0, Arc::from([])))
                    } else if working
                        .room_of(name, class.shape, gang, &mut count)
                        .is_some_and(|room| room < gang)
                    {
                        // Too little room in the whole worker, even without what is held
                        // there: the misfit stands, as found then.
                        reasons.push((name.as_str(), known.reason.clone(), known.never));
                        continue;
                    } else {
                        working.changes_since(name, known.epoch).map(|nodes| {
                            // The nodes that gained room count for what they hold now, the
                            // others for what they held then (at most what they hold now).
                            let mut counts: Vec<(usize, usize)> = known
                                .counts
                                .iter()
                                .filter(|(i, _)| nodes.binary_search(i).is_err())
                                .copied()
                                .collect();
                            let bound = working.count_room(
                                name,
                                &nodes,
                                class.shape,
                                gang,
                                &mut counts,
                                &mut count,
                            );
                            counts.sort_unstable();
                            (bound, Arc::from(counts))
                        })
                    };
                    if let Some((_, counts)) = bound.filter(|b| b.0 < gang) {
                        // A misfit that stands is one a search now would find: checked in
                        // debug builds, so that room a node gained without saying so fails
                        // the tests.
                        if cfg!(debug_assertions) {
                            if let Some(cluster) = working.cluster(name) {
                                let now = search(cluster);
                                debug_assert!(
                                    !now.fits(),
                                    "{class:?} fits in {name}, yet its misfit stood"
                                );
                            }
                        }
                        if known.epoch != epoch {
                            pass.misfits.push((
                                class.clone(),
                                name.clone(),
                                KnownMisfit {
                                    epoch,
                                    counts,
                                    ..known.clone()
                                },
                            ));
                        }
                        reasons.push((name.as_str(), known.reason.clone(), known.never));
                        continue;
                    }
                }
                let Some(cluster) = working.cluster(name) else {
                    continue;
                };
                let fit = search(cluster);
                let fit = working.remember_fit(class, name, fit);
                match &fit.misfit {
                    None => fits.push((preferred, fit.score, order, name.as_str())),
                    Some(m) => {
                        let known = found_misfit(world, m, &fit, epoch);
                        reasons.push((name.as_str(), known.reason.clone(), known.never));
                        pass.misfits.push((class.clone(), name.clone(), known));
                    }
                }
            }
        }
    }
    // Best first: not the worker the last attempt failed in, highest score, queue order.
    fits.sort_by_key(|f| Reverse((f.0, f.1, Reverse(f.2))));
    let fanout = match world.config.placement {
        Placement::Everywhere => fits.len(),
        _ => settings.fanout,
    };
    if fits.len() > 1 && fanout > 1 {
        return Attempt::Offer {
            clusters: fits
                .into_iter()
                .take(fanout)
                .map(|f| f.3.to_string())
                .collect(),
        };
    }
    if let Some((_, _, _, name)) = fits.into_iter().next() {
        let takes = match world.config.placement {
            Placement::Exact => {
                // Found above, in this pass, on the cluster as it still is.
                let Some(fit) = working.known_fit(class, name) else {
                    return Attempt::Wait(reason::NO_WORKER_FITS, "the inventory changed".into());
                };
                let Some(cluster) = working.cluster(name) else {
                    return Attempt::Wait(reason::NO_WORKER_FITS, "the inventory changed".into());
                };
                takes_of(
                    cluster,
                    &world.inventory.resources,
                    shape,
                    bound_pod,
                    &fit,
                    world,
                )
            }
            Placement::SumOfFree => {
                working.sum_take(name, &job.total_request());
                Vec::new()
            }
            Placement::Everywhere => Vec::new(),
        };
        return Attempt::Dispatch {
            cluster: name.to_string(),
            takes,
        };
    }
    // What the Job waits for: its class's reason, or its own when some worker is kept from
    // it alone (then a refusal's back-off is the reason to show).
    let wait = |why: &'static str, message: String| match own {
        None => Attempt::Wait(why, message),
        Some(kind) if kind == reason::WORKER_REFUSED => Attempt::WaitAlone(kind, message),
        Some(_) => Attempt::WaitAlone(why, message),
    };
    if candidates.is_empty() {
        return wait(
            reason::NO_ACTIVE_WORKER,
            say!(
                world,
                "no worker of queue {:?} can take Jobs now: {}",
                job.queue,
                join(&reasons)
            ),
        );
    }
    let all_never = reasons.iter().all(|(_, _, never)| *never);
    if world.config.placement == Placement::Exact && (starving || all_never) {
        // Would it fit anywhere if the worker were empty? (Remembered while the worker's
        // nodes stay the same.)
        let mut drained_best: Option<(i64, String)> = None;
        let known_drained = world.drained_of(class);
        for name in &candidates {
            let Some(base) = world.inventory.cluster(name) else {
                continue;
            };
            let print = super::model::fingerprint(base);
            let score = match known_drained.as_ref().and_then(|d| d.get(name, print)) {
                Some(known) => known,
                None => {
                    let empty = drained(base, world.inventory.resources.len());
                    let fit = search(&empty);
                    let score = fit.fits().then_some(fit.score);
                    pass.drained
                        .push((class.clone(), (*name).clone(), print, score));
                    score
                }
            };
            if let Some(score) = score {
                if drained_best.as_ref().is_none_or(|(s, _)| score > *s) {
                    drained_best = Some((score, (*name).clone()));
                }
            }
        }
        match drained_best {
            // A worker that could not be looked at might still hold it: a short disconnect
            // does not make a Job "never fits".
            None if own.is_some() || unseen => {}
            None => {
                return wait(
                    reason::NEVER_FITS,
                    say!(
                        world,
                        "no worker of queue {:?} could hold the gang of {} pods even empty: {}",
                        job.queue,
                        job.gang(),
                        join(&reasons)
                    ),
                )
            }
            Some((_, name)) if starving => {
                reserved.insert(name.clone(), job.key.clone());
                add_to(&mut state.held, need());
                return wait(
                    reason::NO_WORKER_FITS,
                    say!(world,
                        "no worker can take the gang of {} pods now; waiting since {}, so worker {name} is kept for it as it drains: {}",
                        job.gang(),
                        super::model::rfc3339(job.waiting_since()),
                        join(&reasons)
                    ),
                );
            }
            Some(_) => {}
        }
    }
    wait(
        reason::NO_WORKER_FITS,
        say!(
            world,
            "no worker can take the gang of {} pods now: {}",
            job.gang(),
            join(&reasons)
        ),
    )
}

/// Adds `amounts` to `totals`, resource by resource.
fn add_to<'a>(totals: &mut BTreeMap<String, i64>, amounts: impl Iterator<Item = (&'a str, i64)>) {
    for (r, v) in amounts {
        match totals.get_mut(r) {
            Some(t) => *t += v,
            None => {
                totals.insert(r.to_string(), v);
            }
        }
    }
}

/// A copy of the Job is alive in a worker that answers. Copies in a worker that does not are
/// given up for lost (seed 000) and removed when it returns.
pub(super) fn still_running(world: &World, job: &Job) -> bool {
    world
        .copies_of(&job.uid)
        .any(|c| !c.deleting && world.workers.get(&c.cluster).is_some_and(|w| w.connected))
}

fn blocks_admission(world: &World, job: &Job) -> bool {
    world
        .queues
        .get(&job.queue)
        .and_then(|q| q.settings.as_ref().ok())
        .and_then(|s| s.wait_for_pods_ready.as_ref())
        .is_some_and(|w| w.block_admission)
}

/// Why a cluster of the queue cannot be tried for any Job now, if it cannot.
/// (Reservations for starving Jobs are [`Working::unusable`]'s: they change within a pass.)
fn unusable(world: &World, name: &str) -> Option<String> {
    let Some(worker) = world.workers.get(name) else {
        return Some("no such WorkerCluster".into());
    };
    if !worker.connected {
        return Some(if worker.message.is_empty() {
            "not connected".into()
        } else {
            format!("not connected ({})", worker.message)
        });
    }
    if !worker.copies_synced {
        return Some("connected, its Jobs not listed yet".into());
    }
    if let Some(c) = world.inventory.cluster(name) {
        if let Some(why) = &c.unavailable {
            return Some(why.clone());
        }
    }
    if world.has_stale_copies(name) {
        return Some("copies of Jobs taken back from it are still being removed".into());
    }
    None
}

/// Why a cluster cannot be tried for this Job in particular (other Jobs of its class may go
/// there): the kind of reason, what to tell the user, and when it may end by itself.
fn own_blocker(
    world: &World,
    job: &Job,
    name: &str,
    now: SystemTime,
) -> Option<(&'static str, String, Option<SystemTime>)> {
    if let Some(r) = job.refused_by(name, now) {
        let times = if r.count > 1 {
            format!(" ({} times in a row)", r.count)
        } else {
            String::new()
        };
        return Some((
            reason::WORKER_REFUSED,
            say!(
                world,
                "refused the Job{times}: {}; next attempt there not before {}",
                r.message,
                super::model::rfc3339(r.retry_at)
            ),
            Some(r.retry_at),
        ));
    }
    if world.foreign_copy(&job.key, &job.uid, name).is_some() {
        return Some((
            reason::NO_WORKER_FITS,
            say!(
                world,
                "an earlier Job named {} is still being removed there",
                job.key
            ),
            None,
        ));
    }
    None
}

/// Whether some worker of the queue is kept from this Job alone (see [`own_blocker`]).
fn has_own_blocker(world: &World, job: &Job, clusters: &[String], now: SystemTime) -> bool {
    if job.refusals.is_empty() && !world.has_foreign_copy(&job.key, &job.uid) {
        return false;
    }
    clusters.iter().any(|c| {
        job.refused_by(c, now).is_some() || world.foreign_copy(&job.key, &job.uid, c).is_some()
    })
}

/// The queue's quota in force: its own, or the sum of its workers' allocatable. A worker
/// counts until it is lost (unreachable for `workerLostTimeout`), with the allocatable last
/// known: a short disconnect changes nothing, not even the quota.
pub fn effective_quota(
    world: &World,
    settings: &crate::api::QueueSettings,
    now: SystemTime,
) -> BTreeMap<String, i64> {
    if let Some(q) = &settings.quota {
        return q.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    }
    let table = &world.inventory.resources;
    // Summed by resource id, named once at the end.
    let mut sums: Vec<Option<i64>> = vec![None; table.len()];
    for name in &settings.clusters {
        let Some(c) = world.inventory.cluster(name) else {
            continue;
        };
        let counted = world
            .workers
            .get(name)
            .is_some_and(|w| !w.lost(now, settings.worker_lost_timeout));
        if !counted {
            continue;
        }
        for (sum, v) in sums.iter_mut().zip(&c.summary.allocatable) {
            if *v > 0 {
                *sum = Some(sum.unwrap_or(0).saturating_add(*v));
            }
        }
    }
    sums.into_iter()
        .enumerate()
        .filter_map(|(r, sum)| Some((table.name(r).to_string(), sum?)))
        .collect()
}

/// The takes of a gang placement, node by node, for holding it.
fn takes_of(
    cluster: &Cluster,
    table: &ResourceTable,
    shape: &crate::placement::PodShape,
    bound: &crate::placement::BoundPod,
    fit: &ClusterFit,
    world: &World,
) -> Vec<Take> {
    fit.placements
        .iter()
        .filter_map(|&(i, count)| {
            let node = cluster.nodes.get(i)?;
            let after = fit_node(
                node,
                table,
                shape,
                bound,
                count,
                &world.config.engine,
                false,
            );
            (after.count == count)
                .then(|| Take::between(node, &NodeState::of(node), &after.state).at(i))
        })
        .collect()
}

/// The cluster with nothing running: what it could hold once it drains.
fn drained(cluster: &Cluster, resources: usize) -> Cluster {
    let mut c = cluster.clone();
    for n in &mut c.nodes {
        let n = std::sync::Arc::make_mut(n);
        n.requested.iter_mut().for_each(|v| *v = 0);
        if let Some(numa) = &mut n.numa {
            for z in &mut std::sync::Arc::make_mut(numa).zones {
                z.available.clear();
                z.available.extend_from_slice(&z.allocatable);
            }
        }
    }
    c.summarize(resources);
    c
}

/// A misfit found now, to remember: the nodes the gang's pods fitted on, at the worker's
/// capacity `epoch`.
fn found_misfit(
    world: &World,
    m: &crate::placement::Misfit,
    fit: &ClusterFit,
    epoch: u64,
) -> KnownMisfit {
    KnownMisfit {
        reason: describe(world, m),
        never: m.unresolvable(),
        epoch,
        queues: world.queues_generation(),
        counts: fit.placements.as_slice().into(),
    }
}

/// A misfit's text, when the world asks for messages.
fn describe(world: &World, m: &crate::placement::Misfit) -> String {
    if world.config.describe {
        m.to_string()
    } else {
        String::new()
    }
}

fn show(resource: &str, m: i64) -> String {
    display(resource, Milli(m))
}

fn sep(s: &str) -> &'static str {
    if s.is_empty() {
        ""
    } else {
        ", "
    }
}

fn join(reasons: &[(&str, String, bool)]) -> String {
    reasons
        .iter()
        .map(|(c, m, _)| format!("{c}: {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The placement of the Job's gang in `cluster` as it is now, to hold for a Job admitted
/// before a restart (whose pods the inventory may not show yet).
pub(super) fn hold_for(world: &World, job: &Job, cluster: &str, now: SystemTime) -> Option<Hold> {
    let shape: Arc<crate::placement::PodShape> = job.pod.as_ref().ok()?.clone();
    let c = world.inventory.cluster(cluster)?;
    let settings = world.queues.get(&job.queue)?.settings.as_ref().ok()?;
    let bound = shape.bind(&world.inventory.resources);
    let fit = fit_cluster(
        c,
        &world.inventory.resources,
        &shape,
        &bound,
        job.gang() as usize,
        &world.config.engine,
        shape.strategy(settings.strategy),
    );
    fit.fits().then(|| Hold {
        job_uid: job.uid.clone(),
        cluster: cluster.to_string(),
        takes: takes_of(c, &world.inventory.resources, &shape, &bound, &fit, world),
        since: now,
        serial: 0,
    })
}
