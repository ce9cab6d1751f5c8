//! Admission's questions answered from what earlier passes found, and from what this pass
//! found so far: the same answers as [`PlainOracle`](crate::dispatcher::oracle::PlainOracle),
//! with far fewer searches.
//!
//! A gang's fit in a worker is searched once per pass until the pass places something there
//! (`fits`); a misfit found in an earlier pass stands while no node gained room since, or
//! while the room the worker's nodes have for the pod shape, with the placements held there
//! taken off, is too little for the gang (`misfit_stands`); workers nothing is known of
//! are searched across the cores at once (`prepare`); a class's verdict stands while nothing
//! it depended on changed (`recall`).

use super::{
    Caches, DrainedFit, Findings, HeldNode, HeldView, KnownMisfit, MemoKey, RoomMisfit,
    RoomMisfitKey, ShapeRoom,
};
use crate::dispatcher::job::ClassKey;
use crate::dispatcher::ledger::Hold;
use crate::dispatcher::ledger::Ledger;
use crate::dispatcher::oracle::view::{
    fit_drained, freeness, node_freeness, node_of, room_in_order, search, takes_of, with_room,
    FreestFirst, PassView,
};
use crate::dispatcher::oracle::{
    fit_with_room, freer_room_in, Circumstances, Fit, Gang, Oracle, Room, Verdict,
};
use crate::dispatcher::state::State;
use crate::dispatcher::world::{DispatchConfig, Placement};
use crate::inventory::{Cluster, Node};
use crate::placement::fit::{summary_shortfall, PARALLEL_NODES};
use crate::placement::inflight::Take;
use crate::placement::{fit_clusters, BoundPod, ClusterFit, NodeJudge, PodShape};
use foldhash::{HashMap, HashMapExt as _};
use std::sync::Arc;

/// [`CachedOracle::view_room`] found in this pass for a worker and pod shape.
#[derive(Clone, Copy)]
struct ViewRoom {
    /// The worker's pass version then.
    version: u64,
    /// The `ShapeRoom` cap the nodes were counted up to.
    cap: usize,
    total: usize,
}

/// A worker, in the per-pass maps asked millions of times: the address of its cluster in the
/// pass's inventory, which does not change during a pass (so the address names the worker as
/// well as its name does, and is hashed and compared for less). Never read through.
type WorkerAt = *const Cluster;

/// The [`WorkerAt`] of the worker whose cluster in the inventory is `base`.
fn at(base: &Cluster) -> WorkerAt {
    base
}

/// One queue's memo inputs, fixed for the pass.
struct QueueMemo<'w> {
    /// The queue's name.
    queue: String,
    key: MemoKey,
    /// Per worker of the queue (by position in its list): its cluster in the inventory,
    /// found by name once per pass instead of at every question.
    clusters: Vec<Option<&'w Cluster>>,
    /// Per worker of the queue (by position in its list): its capacity epoch, `None` when
    /// the inventory does not have it.
    epochs: Arc<[Option<u64>]>,
    /// Likewise, its capacity fingerprint (see `ClusterSummary::capacity_fingerprint`).
    capacities: Arc<[Option<u64>]>,
    /// The nodes of its workers.
    nodes: usize,
}

impl<'w> QueueMemo<'w> {
    fn new(
        state: &'w State,
        caches: &Caches,
        config: &DispatchConfig,
        now: &Circumstances,
    ) -> Self {
        let mut nodes = 0;
        let mut clusters = Vec::with_capacity(now.workers.len());
        let mut epochs = Vec::with_capacity(now.workers.len());
        let mut capacities = Vec::with_capacity(now.workers.len());
        for name in now.workers {
            let cluster = state.inventory.cluster(name);
            clusters.push(cluster);
            nodes += cluster.map_or(0, |c| c.nodes.len());
            epochs.push(cluster.map(|_| caches.capacity_epoch(name)));
            capacities.push(cluster.map(|c| c.summary.capacity_fingerprint));
        }
        // Where room is kept decides whether a worker's misfit stays (NeverFits when every
        // worker's does): a StrictFIFO queue's later Jobs wait behind one and not the other.
        let strict = (state.settings(now.queue))
            .is_some_and(|s| s.queueing == crate::api::QueueingStrategy::StrictFIFO);
        Self {
            queue: now.queue.to_string(),
            key: caches.memo_key(now.queue, config.describe || strict),
            clusters,
            epochs: epochs.into(),
            capacities: capacities.into(),
            nodes,
        }
    }
}

/// What is looked up once per judgement of a class.
#[derive(Default)]
struct Judging<'w> {
    /// The pass's slot of the class's queue.
    slot: usize,
    /// By the worker's position in the queue's list.
    misfits: Option<&'w [Option<KnownMisfit>]>,
    /// Whether the pass found fits of the class before.
    may_know: bool,
    bound: Option<Arc<BoundPod>>,
    /// [`reason_turns_with_room`] of the class's gang.
    turns_with_room: bool,
}

/// The oracle over the caches.
pub(crate) struct CachedOracle<'w> {
    view: PassView<'w>,
    state: &'w State,
    ledger: &'w Ledger,
    caches: &'w Caches,
    config: &'w DispatchConfig,
    found: Findings,
    /// The fits (and misfits) of a class in a worker found in this pass, with the worker's
    /// pass version then: the Jobs of a class are tried one after another, and only the
    /// worker the last one went to changed for the next.
    fits: HashMap<ClassKey, HashMap<&'w str, (u64, Arc<ClusterFit>)>>,
    /// [`CachedOracle::view_room`] found in this pass, by worker (see [`WorkerAt`]) and shape
    /// key.
    view_rooms: HashMap<(WorkerAt, u64), ViewRoom>,
    /// [`CachedOracle::room_of`] found in this pass, by worker (see [`WorkerAt`]) and shape
    /// key: the largest gang it was asked for, and the total.
    room_totals: HashMap<(WorkerAt, u64), (usize, usize)>,
    /// Pod shapes bound to the inventory's resource table, by shape key: in this pass, and
    /// in earlier ones (when bound to the same table).
    bound: HashMap<u64, Arc<BoundPod>>,
    bound_before: Option<&'w HashMap<u64, Arc<BoundPod>>>,
    /// By the pass's queue slot.
    queues: Vec<Option<QueueMemo<'w>>>,
    judging: Judging<'w>,
    /// Workers where the pass gave room back (room kept for a starving Job that now goes
    /// there): what earlier passes found there does not tell about the rest of this one.
    gained: Vec<&'w str>,
}

impl<'w> CachedOracle<'w> {
    /// `shape_rooms` and `held_views` are the caches' (see [`Caches::take_shape_rooms`] and
    /// [`Caches::take_held_views`]), handed back in the findings.
    pub(crate) fn new(
        state: &'w State,
        ledger: &'w Ledger,
        caches: &'w Caches,
        config: &'w DispatchConfig,
        (shape_rooms, held_views): (super::ShapeRooms, super::HeldViews),
    ) -> Self {
        Self {
            view: PassView::new(state, ledger),
            state,
            ledger,
            caches,
            config,
            found: Findings {
                shape_rooms,
                held_views,
                ..Default::default()
            },
            fits: HashMap::new(),
            view_rooms: HashMap::new(),
            room_totals: HashMap::new(),
            bound: HashMap::new(),
            bound_before: caches.bound_pods(&state.inventory.resources),
            queues: Vec::new(),
            judging: Judging::default(),
            gained: Vec::new(),
        }
    }

    /// What the pass found that is worth keeping.
    pub(crate) fn into_findings(self) -> Findings {
        self.found
    }

    fn queue_memo(&mut self, now: &Circumstances) -> &QueueMemo<'w> {
        if self.queues.len() <= now.queue_slot {
            self.queues.resize_with(now.queue_slot + 1, || None);
        }
        let (state, caches, config) = (self.state, self.caches, self.config);
        self.queues[now.queue_slot]
            .get_or_insert_with(|| QueueMemo::new(state, caches, config, now))
    }

    /// The misfit of the class being judged in `worker` (at `order` in its queue's list),
    /// found in an earlier pass under the current queues (and described, when messages are
    /// asked for).
    fn known_misfit(&self, worker: &str, order: usize) -> Option<&'w KnownMisfit> {
        if self.gained.contains(&worker) {
            return None;
        }
        let queues = self.caches.queues_generation();
        let describe = self.config.describe;
        self.judging
            .misfits?
            .get(order)?
            .as_ref()
            .filter(|m| m.queues == queues && (!describe || !m.reason.is_empty()))
    }

    /// The fit of `class` in `worker` found earlier in this pass, if the pass has not placed
    /// anything there since.
    fn known_fit(&self, class: &ClassKey, worker: &str) -> Option<Arc<ClusterFit>> {
        let (version, fit) = self.fits.get(class)?.get(worker)?;
        (*version == self.view.version(worker)).then(|| fit.clone())
    }

    fn remember_fit(
        &mut self,
        class: &ClassKey,
        worker: &'w str,
        fit: ClusterFit,
    ) -> Arc<ClusterFit> {
        let fit = Arc::new(fit);
        let version = self.view.version(worker);
        let by_worker = match self.fits.get_mut(class) {
            Some(m) => m,
            None => self.fits.entry(class.clone()).or_default(),
        };
        by_worker.insert(worker, (version, fit.clone()));
        fit
    }

    /// A misfit found now, to remember: how many of the gang's pods fitted, at the worker's
    /// capacity `epoch`.
    fn misfit_found(&self, fit: &ClusterFit, epoch: u64) -> Option<KnownMisfit> {
        let m = fit.misfit.as_ref()?;
        Some(KnownMisfit {
            reason: describe(m, self.config.describe),
            never: m.unresolvable(),
            epoch,
            queues: self.caches.queues_generation(),
            fitted: fit.placements.iter().map(|(_, c)| c).sum(),
        })
    }

    /// The worker as the pass sees it: its held view, brought up to date if it is not (see
    /// [`held_view`]).
    fn cluster(&mut self, name: &str) -> Option<&Cluster> {
        let (caches, ledger) = (self.caches, self.ledger);
        let views = &mut self.found.held_views;
        self.view.cluster(name, |base| {
            let holds = caches.hold_version(name);
            let v = match views.get_mut(name) {
                Some(v) => v,
                None => views
                    .entry(name.to_string())
                    .or_insert_with(|| HeldView::of(base)),
            };
            if !v.is_current(base, holds) {
                held_view(v, ledger, name, base, holds);
            }
            v.view.clone()
        })
    }

    fn search(&mut self, gang: &Gang, worker: &str) -> Option<ClusterFit> {
        let bound = self.judging.bound.clone()?;
        let (table, engine) = (&self.state.inventory.resources, &self.config.engine);
        let cluster = self.cluster(worker)?;
        Some(search(cluster, table, gang.pods_of(), &bound, engine).fit)
    }

    /// The exact fit of the gang in `worker`, the queue's worker at `order`.
    fn exact(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Fit {
        let found = self.queues[self.judging.slot].as_ref().and_then(|q| {
            let epoch = q.epochs.get(order).copied().flatten()?;
            Some((epoch, q.clusters.get(order).copied().flatten()?))
        });
        let Some((epoch, base)) = found else {
            return Fit::not_in_inventory();
        };
        if let Some(fit) = self
            .judging
            .may_know
            .then(|| self.known_fit(gang.class, worker))
            .flatten()
        {
            return Fit::of(&fit, self.config.describe);
        }
        // The misfits remembered are judged again on one pod shape: a gang of several is
        // searched afresh every time, as is one whose reason turns with room.
        let kept = gang.extra.is_empty() && !self.judging.turns_with_room;
        if let Some(known) = self.known_misfit(worker, order).filter(|_| kept) {
            if let Some(stands) = self.misfit_stands(gang, (worker, base), order, known, epoch) {
                return stands;
            }
        }
        let Some(fit) = self.search(gang, worker) else {
            return Fit::not_in_inventory();
        };
        let fit = self.remember_fit(gang.class, worker, fit);
        if let Some(known) = self.misfit_found(&fit, epoch).filter(|_| kept) {
            self.found.misfits.push((gang.class.clone(), order, known));
        }
        Fit::of(&fit, self.config.describe)
    }

    /// The misfit, if it still stands: no node gained room since it was found, or the room
    /// the worker's nodes have now cannot take the gang (see [`CachedOracle::room_bound`]).
    fn misfit_stands(
        &mut self,
        gang: &Gang,
        (worker, base): (&'w str, &'w Cluster),
        order: usize,
        known: &'w KnownMisfit,
        epoch: u64,
    ) -> Option<Fit> {
        let counted = if known.epoch == epoch {
            // No node gained room since it was found.
            if known.fitted >= gang.pods {
                return None;
            }
            None
        } else {
            let room = self.room_bound(gang, (worker, base))?;
            if room >= gang.pods {
                return None;
            }
            Some(room)
        };
        // A misfit that stands is one a search now would find: checked in debug builds, so
        // that room a node gained without saying so fails the tests.
        if cfg!(debug_assertions) {
            if let Some(now) = self.search(gang, worker) {
                debug_assert!(
                    !now.fits(),
                    "{:?} fits in {worker}, yet its misfit stood",
                    gang.class
                );
            }
        }
        // Counted again: it stands at the epoch now.
        if let Some(fitted) = counted {
            self.found.misfits.push((
                gang.class.clone(),
                order,
                KnownMisfit {
                    reason: copied(&known.reason),
                    never: known.never,
                    epoch,
                    queues: known.queues,
                    fitted,
                },
            ));
        }
        Some(Fit::Misfit {
            reason: copied(&known.reason),
            never: known.never,
        })
    }

    /// At most how many pods of the gang `worker` can take now, as the pass sees it, found
    /// without a search: each node's room for the gang's pods is its own, so the gang fits
    /// only if the nodes' counts add up to it. `base` is the worker's cluster in the
    /// inventory.
    fn room_bound(&mut self, gang: &Gang, (worker, base): (&'w str, &Cluster)) -> Option<usize> {
        let shape = gang.class.shape;
        // Found for the shape earlier in the pass, on the worker as the pass sees it now, with
        // nodes counted up to at least the gang.
        if let Some(known) = self.view_rooms.get(&(at(base), shape)) {
            if known.version == self.view.version(worker) && known.cap >= gang.pods {
                return Some(known.total);
            }
        }
        let bound = self.judging.bound.clone()?;
        let (inventory, engine) = (&self.state.inventory, &self.config.engine);
        if summary_shortfall(&base.summary, gang.shape, &bound).is_some() {
            // No node has room for one pod.
            return Some(0);
        }
        let mut judge: Option<NodeJudge<'_>> = None;
        let mut count = |node: &Node, want: usize| {
            judge
                .get_or_insert_with(|| {
                    NodeJudge::new(
                        &inventory.resources,
                        gang.shape,
                        &bound,
                        engine,
                        gang.strategy,
                    )
                })
                .count(node, want)
        };
        // The room without what is held there first: it is kept across passes.
        let room = self.room_of((worker, base), shape, gang.pods, &mut count)?;
        if room < gang.pods {
            return Some(room);
        }
        self.view_room((worker, base), shape, &mut count)
    }

    /// At most how many pods of shape `shape` the nodes of `worker` can take at once,
    /// counting up to `gang` per node (see [`ShapeRoom`]): only the nodes whose room changed
    /// since the last look are counted again (`base`: the worker's cluster in the inventory).
    fn room_of(
        &mut self,
        (worker, base): (&'w str, &Cluster),
        shape: u64,
        gang: usize,
        count: impl FnMut(&Node, usize) -> usize,
    ) -> Option<usize> {
        // The inventory does not change during a pass: a total found for gangs of at least
        // this size stands for the rest of it.
        if let Some(&(cap, total)) = self.room_totals.get(&(at(base), shape)) {
            if cap >= gang {
                return Some(total);
            }
        }
        let total = self.room_brought_up_to_date((worker, base), shape, gang, count)?;
        self.room_totals.insert((at(base), shape), (gang, total));
        Some(total)
    }

    /// [`CachedOracle::room_of`], from the worker's [`ShapeRoom`] brought up to date.
    fn room_brought_up_to_date(
        &mut self,
        (worker, base): (&str, &Cluster),
        shape: u64,
        gang: usize,
        mut count: impl FnMut(&Node, usize) -> usize,
    ) -> Option<usize> {
        let caches = self.caches;
        let room = shape_room(&mut self.found.shape_rooms, worker, shape)?;
        let touched = caches
            .touches(worker, room.pos)
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
                room.pos = caches.touches_end(worker);
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
                "node {i} of {worker} changed without a touch"
            );
        }
        Some(room.total)
    }

    /// How many pods of shape `shape` the nodes of `worker` can take at once as this pass
    /// sees it, each node counted up to the cap of the worker's [`ShapeRoom`] for the shape
    /// (which [`CachedOracle::room_of`] brought up to date): its total, with the nodes the
    /// pass sees otherwise than the inventory (placements held or handed out there) counted
    /// again. Kept for the rest of the pass, per version of the worker (read in
    /// [`CachedOracle::room_bound`]). `None` when the `ShapeRoom` is not up to date.
    fn view_room(
        &mut self,
        (worker, base): (&'w str, &Cluster),
        shape: u64,
        mut count: impl FnMut(&Node, usize) -> usize,
    ) -> Option<usize> {
        // The worker as the pass sees it (made, with the placements held there taken off, if
        // any are): its nodes are the inventory's but where they differ.
        if self.ledger.holds_any_in(worker) {
            self.cluster(worker)?;
        }
        let shared = self.found.shape_rooms.get(worker)?.get(&shape)?;
        if shared.pos != self.caches.touches_end(worker) || shared.counts.len() != base.nodes.len()
        {
            return None;
        }
        let (version, cap) = (self.view.version(worker), shared.cap);
        let mut total = shared.total;
        if let Some(v) = self.view.peek(worker) {
            if v.nodes.len() != base.nodes.len() {
                return None;
            }
            // A node the pass sees as its held view has it is counted once while it stays so.
            let mut held = self.found.held_views.get_mut(worker);
            let differ = differing_nodes(v, base, held.as_deref());
            for (i, k) in differ {
                let (node, own) = (&v.nodes[i], &base.nodes[i]);
                if Arc::ptr_eq(node, own) {
                    continue;
                }
                let mut fresh = || count(node, cap).min(cap);
                let n = match (held.as_deref_mut(), k) {
                    (Some(h), Some(k)) => h.count_held(k, (shape, cap), &mut fresh),
                    (Some(h), None) => h.count(i, node, (shape, cap), &mut fresh),
                    (None, _) => fresh(),
                };
                debug_assert_eq!(n, count(node, cap).min(cap), "{worker} node {i}");
                total = total - shared.counts[i] as usize + n;
            }
        }
        self.view_rooms.insert(
            (at(base), shape),
            ViewRoom {
                version,
                cap,
                total,
            },
        );
        Some(total)
    }

    /// How free each node of `current` (the pass's view of `worker`, maybe with room given
    /// back) is for the gang's pods, by position (see [`node_freeness`]). A node the view
    /// shares with the inventory is as free as the worker's
    /// [`NodeFreeness`](super::room::NodeFreeness) says, brought up to date from the touch log
    /// here; the others are read.
    fn node_freeness(&mut self, worker: &str, current: &Cluster, gang: &Gang) -> Vec<i64> {
        let bound = self.bind(gang.class.shape, gang.shape);
        let caches = self.caches;
        let Some(base) = self.state.inventory.cluster(worker) else {
            return node_freeness(current, &bound);
        };
        let Some(room) = shape_room(&mut self.found.shape_rooms, worker, gang.class.shape) else {
            return node_freeness(current, &bound);
        };
        let known = &mut room.freeness;
        let touched = caches
            .touches(worker, known.pos)
            .filter(|_| known.of.len() == base.nodes.len());
        match touched {
            Some((nodes, end)) => {
                for &i in nodes {
                    if let (Some(node), Some(f)) = (base.nodes.get(i), known.of.get_mut(i)) {
                        *f = freeness(node, &bound);
                    }
                }
                known.pos = end;
            }
            None => {
                known.pos = caches.touches_end(worker);
                known.of = base.nodes.iter().map(|n| freeness(n, &bound)).collect();
            }
        }
        let of = &known.of;
        let found: Vec<i64> = current
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| match base.nodes.get(i) {
                Some(b) if Arc::ptr_eq(b, node) => of[i],
                _ => freeness(node, &bound),
            })
            .collect();
        // Every change to a node's room reaches the touch log (or marks the whole worker).
        debug_assert_eq!(found, node_freeness(current, &bound), "{worker}");
        found
    }

    /// [`Oracle::fit_drained`] in `worker`, whose capacity fingerprint is `capacity` (`None`
    /// when the inventory does not have it): from `known` (the class's drained fits found in
    /// earlier passes) while the worker keeps its nodes and the queues their workers; found
    /// afresh (and kept) otherwise.
    fn drained_score(
        &mut self,
        known: Option<&[Option<DrainedFit>]>,
        gang: &Gang,
        (worker, order): (&str, usize),
        capacity: Option<u64>,
    ) -> Option<i64> {
        let fingerprint = capacity?;
        let queues = self.caches.queues_generation();
        let known = known
            .and_then(|d| d.get(order)?.as_ref())
            .filter(|d| d.capacity_fingerprint == fingerprint && d.queues == queues);
        if let Some(known) = known {
            return known.score;
        }
        let inventory = &self.state.inventory;
        let base = inventory.cluster(worker)?;
        debug_assert_eq!(base.summary.capacity_fingerprint, fingerprint, "{worker}");
        let score = fit_drained(base, gang, inventory, &self.config.engine);
        self.found.drained.push((
            gang.class.clone(),
            order,
            DrainedFit {
                capacity_fingerprint: fingerprint,
                queues,
                score,
            },
        ));
        score
    }

    /// [`freer_room`], with the nodes' freeness from [`CachedOracle::node_freeness`].
    fn freer_room_afresh(&mut self, gang: &Gang, room: &Hold) -> Option<Room> {
        let worker = room.cluster.as_str();
        self.cluster(worker)?;
        let current = with_room(self.view.peek(worker)?, room);
        let freeness = self.node_freeness(worker, &current, gang);
        let bound = self.bind(gang.class.shape, gang.shape);
        freer_room_in(
            &current,
            gang,
            &bound,
            room,
            &freeness,
            self.state,
            self.config,
        )
    }

    /// The workers nothing is known about yet are judged all at once, across the cores,
    /// when they have enough nodes between them.
    fn judge_unknown_at_once(&mut self, gang: &Gang, workers: &[(usize, &'w str)]) {
        let parallel_from = 2 * PARALLEL_NODES;
        let mut todo: Vec<(usize, &'w str)> = Vec::new();
        let mut nodes = 0;
        for &(order, name) in workers {
            // Most workers have a misfit known by position: that is asked first.
            if self.known_misfit(name, order).is_some()
                || (self.judging.may_know && self.known_fit(gang.class, name).is_some())
            {
                continue;
            }
            let Some(c) = self.state.inventory.cluster(name) else {
                continue;
            };
            nodes += c.nodes.len();
            todo.push((order, name));
        }
        if todo.len() < 2 || nodes < parallel_from {
            return;
        }
        for (_, name) in &todo {
            self.cluster(name);
        }
        let Some(bound) = self.judging.bound.clone() else {
            return;
        };
        let clusters: Vec<&Cluster> = todo.iter().filter_map(|(_, n)| self.view.peek(n)).collect();
        if clusters.len() != todo.len() {
            return;
        }
        let found = fit_clusters(
            &clusters,
            &self.state.inventory.resources,
            gang.shape,
            &bound,
            gang.pods,
            &self.config.engine,
            gang.strategy,
        );
        for (&(order, name), fit) in todo.iter().zip(found) {
            let epoch = self.caches.capacity_epoch(name);
            if let Some(known) = self.misfit_found(&fit, epoch) {
                self.found.misfits.push((gang.class.clone(), order, known));
            }
            self.remember_fit(gang.class, name, fit);
        }
    }

    /// Whether the pass has neither placed nor given back anything in `worker` so far: it
    /// sees the worker as earlier passes left it.
    fn untouched(&self, worker: &str) -> bool {
        self.view.version(worker) == 0 && !self.gained.contains(&worker)
    }

    /// `shape` (whose key is `key`) bound to the inventory's resource table: taken from an
    /// earlier pass when it bound the shape to the same table, else bound once in this pass.
    fn bind(&mut self, key: u64, shape: &PodShape) -> Arc<BoundPod> {
        if let Some(b) = self.bound.get(&key) {
            return b.clone();
        }
        let b = match self.bound_before.and_then(|kept| kept.get(&key)) {
            Some(b) => b.clone(),
            None => {
                let b = Arc::new(shape.bind(&self.state.inventory.resources));
                self.found.bound.push((key, b.clone()));
                b
            }
        };
        self.bound.insert(key, b.clone());
        b
    }
}

impl<'w> Oracle<'w> for CachedOracle<'w> {
    fn look(&mut self, now: &Circumstances) {
        // Only where to find the queue's memo: it is made when first needed.
        self.judging.slot = now.queue_slot;
    }

    fn prepare(&mut self, gang: &Gang, now: &Circumstances, workers: &[(usize, &'w str)]) {
        self.judging = Judging {
            slot: now.queue_slot,
            misfits: self.caches.misfits_of(gang.class),
            may_know: self.fits.contains_key(gang.class),
            bound: Some(self.bind(gang.class.shape, gang.shape)),
            turns_with_room: reason_turns_with_room(gang),
        };
        let parallel_from = 2 * PARALLEL_NODES;
        // (The queue's memo is made here for the pass: asked before the gang's shapes.)
        if self.config.placement == Placement::Exact
            && self.queue_memo(now).nodes >= parallel_from
            && gang.extra.is_empty()
        {
            self.judge_unknown_at_once(gang, workers);
        }
        // Most classes are judged once in a pass: nothing found for them earlier in it (the
        // workers judged at once above are found now).
        self.judging.may_know = self.fits.contains_key(gang.class);
    }

    fn fit(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Fit {
        match self.config.placement {
            Placement::SumOfFree => self.view.sum_fit(worker, &gang.job.total_request()),
            Placement::Exact | Placement::Everywhere => self.exact(gang, worker, order),
        }
    }

    fn fit_drained(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Option<i64> {
        let caches = self.caches;
        let capacity = capacity_of(self.state, worker);
        self.drained_score(
            caches.drained_of(gang.class),
            gang,
            (worker, order),
            capacity,
        )
    }

    fn could_hold(&mut self, gang: &Gang, workers: &'w [String], among: &[usize]) -> Vec<usize> {
        // The class's drained fits are looked up once for all the workers, and the workers'
        // capacities read by position from their queue's memo when the pass made it.
        let (caches, state) = (self.caches, self.state);
        let known = caches.drained_of(gang.class);
        let capacities = self
            .queues
            .get(self.judging.slot)
            .and_then(Option::as_ref)
            .filter(|q| q.queue == gang.job.queue && q.capacities.len() == workers.len())
            .map(|q| q.capacities.clone());
        among
            .iter()
            .copied()
            .filter(|&i| {
                let capacity = match &capacities {
                    Some(c) => c[i],
                    None => capacity_of(state, &workers[i]),
                };
                self.drained_score(known, gang, (&workers[i], i), capacity)
                    .is_some()
            })
            .collect()
    }

    fn place(&mut self, gang: &Gang, worker: &'w str) -> Option<Vec<Take>> {
        match self.config.placement {
            Placement::SumOfFree => {
                self.view.sum_take(worker, &gang.job.total_request());
                Some(Vec::new())
            }
            Placement::Everywhere => Some(Vec::new()),
            Placement::Exact => {
                // Found just now, on the worker as it still is.
                let fit = self.known_fit(gang.class, worker)?;
                let bound = self.judging.bound.clone()?;
                let table = &self.state.inventory.resources;
                let cluster = self.view.peek(worker)?;
                let engine = &self.config.engine;
                let takes = if gang.extra.is_empty() {
                    takes_of(cluster, gang, &bound, &fit, engine, table)
                } else {
                    // `fit` is the main part's: the search's own takes cover every part.
                    search(cluster, table, gang.pods_of(), &bound, engine)
                        .takes(cluster, gang, &bound, engine, table)
                };
                self.view.take(worker, &takes);
                Some(takes)
            }
        }
    }

    fn recall(&mut self, gang: &Gang, now: &Circumstances) -> Option<Verdict> {
        // Not kept when its misfits are not (see `reason_turns_with_room`).
        if reason_turns_with_room(gang) {
            return None;
        }
        let class = gang.class;
        if now
            .workers
            .iter()
            .any(|w| self.gained.contains(&w.as_str()))
        {
            return None;
        }
        let describe = self.config.describe;
        let caches = self.caches;
        let memo = self.queue_memo(now);
        let key = MemoKey {
            starving: describe && now.starving,
            ..memo.key.clone()
        };
        let m = caches.verdict(class).filter(|m| {
            m.key == key
                && (!describe || !m.message.is_empty())
                // The workers it was judged against are the ones it may use now, and none
                // of them gained room since.
                && *m.usable == **now.usable
                && m.looked
                    .iter()
                    .all(|&(order, epoch)| memo.epochs.get(order) == Some(&epoch))
        })?;
        Some(Verdict {
            reason: m.reason,
            message: copied(&m.message),
            hold_quota: false,
        })
    }

    fn remember(&mut self, gang: &Gang, now: &Circumstances, verdict: &Verdict, asked: &[usize]) {
        // Never recalled (see `recall`).
        if reason_turns_with_room(gang) {
            return;
        }
        let class = gang.class;
        let describe = self.config.describe;
        let memo = self.queue_memo(now);
        let key = MemoKey {
            starving: describe && now.starving,
            ..memo.key.clone()
        };
        let looked: Arc<[(usize, Option<u64>)]> = asked
            .iter()
            .map(|&order| (order, memo.epochs.get(order).copied().flatten()))
            .collect();
        self.found.verdicts.push((
            class.clone(),
            super::ClassMemo {
                key,
                reason: verdict.reason,
                message: verdict.message.clone(),
                usable: now.usable.clone(),
                looked,
            },
        ));
    }

    fn current(&mut self, worker: &str) -> Option<&Cluster> {
        self.cluster(worker)
    }

    fn context(&self) -> (&'w State, &'w DispatchConfig) {
        (self.state, self.config)
    }

    fn view_mut(&mut self) -> &mut PassView<'w> {
        &mut self.view
    }

    fn bound(&mut self, gang: &Gang) -> Arc<BoundPod> {
        // Bound once per pass for every class of the shape.
        self.bind(gang.class.shape, gang.shape)
    }

    fn room_for(&mut self, gang: &Gang, worker: &'w str, own: Option<&Hold>) -> Option<Room> {
        self.cluster(worker)?;
        let view = self.view.peek_arc(worker)?;
        let with_own;
        let current: &Cluster = match own.filter(|h| h.cluster == worker) {
            Some(own) => {
                with_own = with_room(&view, own);
                &with_own
            }
            None => &view,
        };
        let mut order = FreestFirst::new(&self.node_freeness(worker, current, gang));
        let bound = self.bind(gang.class.shape, gang.shape);
        let (inventory, engine) = (&self.state.inventory, &self.config.engine);
        room_in_order(current, gang, &bound, inventory, engine, &mut order)
    }

    fn fit_with_room(&mut self, gang: &Gang, worker: &'w str, room: &Hold) -> Fit {
        // What earlier passes found holds only while this one has not changed the worker.
        if !self.untouched(worker) {
            return fit_with_room(self, gang, worker, room);
        }
        let key = RoomMisfitKey {
            stands: self.caches.room_stands_key(worker, room.serial),
            class: gang.class.clone(),
            queues: self.caches.queues_generation(),
            describe: self.config.describe,
        };
        if let Some(m) = self
            .caches
            .room_misfit(&room.job_uid)
            .filter(|m| m.key == key)
        {
            return Fit::Misfit {
                reason: copied(&m.reason),
                never: m.never,
            };
        }
        let fit = fit_with_room(self, gang, worker, room);
        if let Fit::Misfit { reason, never } = &fit {
            let found = RoomMisfit {
                key,
                reason: reason.clone(),
                never: *never,
            };
            self.found.room_misfits.push((room.job_uid.clone(), found));
        }
        fit
    }

    fn freer_room(&mut self, gang: &Gang, room: &Hold) -> Option<Room> {
        let worker = room.cluster.as_str();
        let untouched = self.untouched(worker);
        let key = self.caches.room_stands_key(worker, room.serial);
        if untouched && self.caches.room_stands(&room.job_uid) == Some(&key) {
            return None;
        }
        let found = self.freer_room_afresh(gang, room);
        if untouched && found.is_none() {
            self.found.rooms_stand.push((room.job_uid.clone(), key));
        }
        found
    }

    fn gained_room(&mut self, worker: &'w str) {
        if !self.gained.contains(&worker) {
            self.gained.push(worker);
        }
    }
}

/// Whether the reason a gang does not fit a worker may turn, from one that stays to one that
/// may pass or back, however the worker's room moves: its pods are kept apart, spread or
/// together. Such misfits and verdicts are found afresh at every look. Whether the reason
/// stays decides NeverFits, and a node that gains room may now take nothing more for a
/// reason that stays (it holds one of the pods already, or another domain now holds the most
/// of them), while a node that loses room refuses the pod it took before, for a reason that
/// may pass. Any other gang's node that gains room keeps a reason that may pass, or had one
/// that stays; one that loses room refused a pod of the gang before, and still does.
fn reason_turns_with_room(gang: &Gang) -> bool {
    gang.shape.placed_by_peers() || gang.extra.iter().any(|e| e.shape.placed_by_peers())
}

/// A remembered reason or message, copied. It is empty unless messages are asked for, and
/// tens of millions of misfits that stand are answered with it: an empty one is made, not
/// cloned through a call.
fn copied(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        text.to_owned()
    }
}

/// The capacity fingerprint of `worker` (see `ClusterSummary::capacity_fingerprint`), if the
/// inventory has it.
fn capacity_of(state: &State, worker: &str) -> Option<u64> {
    let cluster = state.inventory.cluster(worker)?;
    Some(cluster.summary.capacity_fingerprint)
}

/// The [`ShapeRoom`] of `shape` in `worker`, made empty if there is none yet (the worker's
/// name is copied only then).
fn shape_room<'r>(
    rooms: &'r mut super::ShapeRooms,
    worker: &str,
    shape: u64,
) -> Option<&'r mut ShapeRoom> {
    let by_shape = match rooms.contains_key(worker) {
        true => rooms.get_mut(worker)?,
        false => rooms.entry(worker.to_string()).or_default(),
    };
    Some(by_shape.entry(shape).or_default())
}

/// Brings `view` up to date: `base` (the inventory's cluster now) with the placements held
/// in it at hold version `holds` taken off. A node that is the same in the inventory as
/// when the view was last brought up to date, with the same placements held on it, stays
/// as it is, and so does a node nothing is held on that is still the inventory's: only the
/// others are made again. The view is changed in place, unless something still shares it.
pub(super) fn held_view(
    view: &mut HeldView,
    ledger: &Ledger,
    name: &str,
    base: &Arc<Cluster>,
    holds: u64,
) {
    use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
    let mut on: Vec<(usize, (u64, usize), &Take)> = ledger
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
    // The view's nodes line up with the inventory's, or it is made again whole.
    if view.view.nodes.len() != base.nodes.len() {
        view.view = base.clone();
        view.held.clear();
    }
    let mut last = std::mem::take(&mut view.held);
    let c = Arc::make_mut(&mut view.view);
    c.summary = base.summary.clone();
    c.unavailable.clone_from(&base.unavailable);
    if c.labels != base.labels {
        c.labels.clone_from(&base.labels);
    }
    if c.name != base.name {
        c.name.clone_from(&base.name);
    }
    let hasher = foldhash::fast::FixedState::default();
    // The first node after the held ones brought up to date so far.
    let mut next = 0;
    for takes in on.chunk_by(|a, b| a.0 == b.0) {
        let index = takes[0].0;
        share_unheld(&mut c.nodes[next..index], &base.nodes[next..index]);
        next = index + 1;
        let (mine, own) = (&mut c.nodes[index], &base.nodes[index]);
        let mut h = hasher.build_hasher();
        for (_, id, _) in takes {
            id.hash(&mut h);
        }
        let mut node = HeldNode {
            index,
            base: Arc::downgrade(own),
            digest: h.finish(),
            counts: Vec::new(),
        };
        let same = last
            .binary_search_by_key(&index, |n| n.index)
            .ok()
            .filter(|&k| last[k].digest == node.digest && last[k].base.ptr_eq(&node.base));
        match same {
            // The node stays as it was made: so do its counts.
            Some(k) => node.counts = std::mem::take(&mut last[k].counts),
            None => {
                let mut n = Node::clone(own);
                for (_, _, t) in takes {
                    t.apply_to(&mut n);
                }
                *mine = Arc::new(n);
            }
        }
        view.held.push(node);
    }
    share_unheld(&mut c.nodes[next..], &base.nodes[next..]);
    // The summary is the inventory's (see `oracle::view::apply`).
    view.base = Arc::downgrade(base);
    view.holds = holds;
}

/// The positions of the nodes of `view` (a pass's view of a worker) that may differ from the
/// inventory's `base`: none when the pass sees the inventory's cluster itself, the held ones
/// when it sees the worker's held view `held` itself (its other nodes are the inventory's),
/// else those found different one by one. With each, its position among `held`'s held nodes
/// when it was found there.
fn differing_nodes(
    view: &Cluster,
    base: &Cluster,
    held: Option<&HeldView>,
) -> Vec<(usize, Option<usize>)> {
    let differ = || {
        (0..view.nodes.len().min(base.nodes.len()))
            .filter(|&i| !Arc::ptr_eq(&view.nodes[i], &base.nodes[i]))
    };
    let found: Vec<(usize, Option<usize>)> = if std::ptr::eq(view, base) {
        Vec::new()
    } else if let Some(h) = held.filter(|h| std::ptr::eq(view, &*h.view)) {
        (h.held.iter().enumerate())
            .map(|(k, n)| (n.index, Some(k)))
            .collect()
    } else {
        return differ().map(|i| (i, None)).collect();
    };
    debug_assert!(
        differ().all(|i| found.iter().any(|&(j, _)| j == i)),
        "a node of {} differs from the inventory's without being held",
        base.name
    );
    found
}

/// Nodes nothing is held on are the inventory's own: `mine` takes each node of `own` it does
/// not already share.
fn share_unheld(mine: &mut [Arc<Node>], own: &[Arc<Node>]) {
    for (mine, own) in mine.iter_mut().zip(own) {
        if !Arc::ptr_eq(mine, own) {
            *mine = own.clone();
        }
    }
}

/// A misfit's text, when messages are asked for.
fn describe(m: &crate::placement::Misfit, describe: bool) -> String {
    if describe {
        m.to_string()
    } else {
        String::new()
    }
}
