//! The workers as one admission pass sees them: the inventory, less the placements held for
//! dispatched Jobs, less the placements the pass hands out as it goes.

use super::{Fit, Gang, GangPods};
use crate::dispatcher::ledger::{Hold, Ledger};
use crate::dispatcher::state::State;
use crate::inventory::{Cluster, Inventory, Node};
use crate::placement::inflight::Take;
use crate::placement::{fit_cluster, fit_node, BoundPod, ClusterFit, EngineConfig, NodeState};
use crate::quantity::{display, Milli};
use foldhash::{HashMap, HashMapExt as _};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The pass's view of the workers it looked at. Shared with the inventory until the pass
/// changes a worker.
pub(crate) struct PassView<'a> {
    state: &'a State,
    ledger: &'a Ledger,
    /// Only looked up, never gone through (so in no order).
    clusters: HashMap<String, Arc<Cluster>>,
    /// Per worker, how many placements the pass took from it so far.
    versions: HashMap<String, u64>,
    /// Under the sum-of-free rule: what the pass gave each worker, per resource.
    sums_taken: BTreeMap<String, BTreeMap<String, i64>>,
}

impl<'a> PassView<'a> {
    pub(crate) fn new(state: &'a State, ledger: &'a Ledger) -> Self {
        Self {
            state,
            ledger,
            clusters: HashMap::new(),
            versions: HashMap::new(),
            sums_taken: BTreeMap::new(),
        }
    }

    pub(crate) fn state(&self) -> &'a State {
        self.state
    }

    pub(crate) fn ledger(&self) -> &'a Ledger {
        self.ledger
    }

    /// The worker as the pass sees it. The first look makes it: the inventory's cluster as it
    /// is when nothing is held there, else `make` of it (the held placements taken off).
    pub(crate) fn cluster(
        &mut self,
        name: &str,
        make: impl FnOnce(&'a Arc<Cluster>) -> Arc<Cluster>,
    ) -> Option<&Cluster> {
        if !self.clusters.contains_key(name) {
            let base = self.state.inventory.cluster_arc(name)?;
            let cluster = if self.ledger.holds_any_in(name) {
                make(base)
            } else {
                base.clone()
            };
            self.clusters.insert(name.to_string(), cluster);
        }
        self.clusters.get(name).map(Arc::as_ref)
    }

    /// The worker as the pass sees it, if already looked at.
    pub(crate) fn peek(&self, name: &str) -> Option<&Cluster> {
        self.clusters.get(name).map(Arc::as_ref)
    }

    /// [`PassView::peek`], shared.
    pub(crate) fn peek_arc(&self, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(name).cloned()
    }

    /// How many placements the pass took from the worker so far: what was found there
    /// holds while this stays.
    pub(crate) fn version(&self, name: &str) -> u64 {
        self.versions.get(name).copied().unwrap_or(0)
    }

    /// Takes the placement `fit` found for the gang in `name` (which the pass has looked at):
    /// the pods' share of each node, node by node, to hold.
    pub(crate) fn place(
        &mut self,
        name: &str,
        gang: &Gang,
        fit: &ClusterFit,
        engine: &EngineConfig,
    ) -> Vec<Take> {
        let table = &self.state.inventory.resources;
        let bound = gang.shape.bind(table);
        let takes = match self.peek(name) {
            Some(cluster) if gang.extra.is_empty() => {
                takes_of(cluster, gang, &bound, fit, engine, table)
            }
            // Several shapes: the search's own takes (`fit` is its main part's).
            Some(cluster) => search(cluster, table, gang.pods_of(), &bound, engine)
                .takes(cluster, gang, &bound, engine, table),
            None => Vec::new(),
        };
        self.take(name, &takes);
        takes
    }

    /// The pass hands `takes` out in `name`.
    pub(crate) fn take(&mut self, name: &str, takes: &[Take]) {
        if let Some(c) = self.changing(name, takes) {
            apply(c, takes.iter());
        }
    }

    /// The pass gives `takes` back in `name` (room kept for a Job that now goes there).
    pub(crate) fn give_back(&mut self, name: &str, takes: &[Take]) {
        if let Some(c) = self.changing(name, takes) {
            give_back(c, takes.iter());
        }
    }

    /// The pass's own copy of worker `name`, about to change by `takes`: a new version of it.
    /// The pass looks at a worker before it changes it (every caller asks about the worker
    /// first): a change to a worker not looked at yet would be lost when it is, since the view
    /// is then made from the inventory and the ledger alone.
    fn changing(&mut self, name: &str, takes: &[Take]) -> Option<&mut Cluster> {
        *self.versions.entry(name.to_string()).or_insert(0) += 1;
        debug_assert!(
            takes.is_empty() || self.clusters.contains_key(name),
            "{name} changed before the pass looked at it"
        );
        self.clusters.get_mut(name).map(Arc::make_mut)
    }

    /// Under the sum-of-free rule: whether the worker's free resources, summed over its
    /// nodes, cover `need`; its LeastAllocated score on those sums (0–10) if so.
    pub(crate) fn sum_fit(&mut self, name: &str, need: &BTreeMap<String, i64>) -> Fit {
        let ledger = self.ledger;
        let state = self.state;
        let taken = self.sums_taken.get(name).cloned().unwrap_or_default();
        let Some(cluster) = self.cluster(name, |base| {
            Arc::new(with_holds_taken_off(base, ledger.holds_in(name)))
        }) else {
            return Fit::not_in_inventory();
        };
        let table = &state.inventory.resources;
        let mut score = 0;
        let mut counted = 0;
        for (r, &n) in need {
            let Some(id) = table.id(r) else {
                return Fit::Misfit {
                    reason: format!("has no {r}"),
                    never: false,
                };
            };
            // Remote amounts: sums saturate rather than wrap.
            let free: i64 = cluster
                .nodes
                .iter()
                .fold(0i64, |sum, node| sum.saturating_add(node.free(id)))
                .saturating_sub(taken.get(r).copied().unwrap_or(0));
            if free < n {
                return Fit::Misfit {
                    reason: format!(
                        "its nodes together have {} {r} free, the gang needs {}",
                        show(r, free.max(0)),
                        show(r, n)
                    ),
                    never: false,
                };
            }
            let alloc = cluster.summary.allocatable.get(id).copied().unwrap_or(0);
            if alloc > 0 && (r == "cpu" || r == "memory") {
                score += free.saturating_sub(n).saturating_mul(10) / alloc;
                counted += 1;
            }
        }
        Fit::Fits(if counted == 0 { 0 } else { score / counted })
    }

    /// Under the sum-of-free rule: the pass gives `need` to the worker.
    pub(crate) fn sum_take(&mut self, name: &str, need: &BTreeMap<String, i64>) {
        *self.versions.entry(name.to_string()).or_insert(0) += 1;
        let t = self.sums_taken.entry(name.to_string()).or_default();
        for (r, v) in need {
            *t.entry(r.clone()).or_insert(0) += v;
        }
    }
}

/// `base` with the placements of `holds` taken off its nodes.
pub(crate) fn with_holds_taken_off<'h>(
    base: &Cluster,
    holds: impl Iterator<Item = &'h Hold>,
) -> Cluster {
    let mut c = Cluster::clone(base);
    apply(&mut c, holds.flat_map(|h| &h.takes));
    c
}

/// `cluster` with `room` (kept for a starving Job) given back: the worker as that Job sees it.
pub(crate) fn with_room(cluster: &Cluster, room: &Hold) -> Cluster {
    let mut c = Cluster::clone(cluster);
    give_back(&mut c, room.takes.iter());
    c
}

fn give_back<'t>(cluster: &mut Cluster, takes: impl Iterator<Item = &'t Take>) {
    for t in takes {
        if let Some(node) = node_of(cluster, t).and_then(|i| cluster.nodes.get_mut(i)) {
            t.release_from(Arc::make_mut(node));
        }
    }
}

/// Where the node a take was made on is in `cluster` now.
pub(crate) fn node_of(cluster: &Cluster, t: &Take) -> Option<usize> {
    match cluster.nodes.get(t.index) {
        // The same name, shared: no need to compare the text.
        Some(n) if Arc::ptr_eq(&n.name, &t.node) || n.name == t.node => Some(t.index),
        _ => cluster.nodes.iter().position(|n| n.name == t.node),
    }
}

/// Takes `takes` off the cluster's nodes. The summary is left as it was: an upper bound of
/// what is free, which only makes its early rejections rarer, never wrong, and spares a
/// pass over every node.
pub(crate) fn apply<'t>(cluster: &mut Cluster, takes: impl Iterator<Item = &'t Take>) {
    for t in takes {
        if let Some(node) = node_of(cluster, t).and_then(|i| cluster.nodes.get_mut(i)) {
            t.apply_to(Arc::make_mut(node));
        }
    }
}

/// The takes of a gang placement, node by node, for holding it.
pub(crate) fn takes_of(
    cluster: &Cluster,
    gang: &Gang,
    bound: &crate::placement::BoundPod,
    fit: &ClusterFit,
    engine: &EngineConfig,
    table: &crate::inventory::ResourceTable,
) -> Vec<Take> {
    takes_of_shape(cluster, gang.shape, bound, fit, engine, table)
}

/// The takes of a placement of pods of `shape`, node by node.
fn takes_of_shape(
    cluster: &Cluster,
    shape: &crate::placement::PodShape,
    bound: &crate::placement::BoundPod,
    fit: &ClusterFit,
    engine: &EngineConfig,
    table: &crate::inventory::ResourceTable,
) -> Vec<Take> {
    fit.placements
        .iter()
        .filter_map(|&(i, count)| {
            let node: &Node = cluster.nodes.get(i)?;
            let after = fit_node(node, table, shape, bound, count, engine, false);
            (after.count == count)
                .then(|| Take::between(node, &NodeState::of(node), &after.state).at(i))
        })
        .collect()
}

/// The engine's search for a whole gang in one worker.
pub(crate) struct Search {
    /// The verdict: the main part's fit when every part fits, else the fit of the first part
    /// that does not.
    pub(crate) fit: ClusterFit,
    /// Of a gang of several pod shapes, the placements of the parts that fit, in the gang's
    /// order (the main part first): all of them when the gang fits, else those before the
    /// part that does not. Empty for a gang of one shape (its placement is `fit`'s).
    pub(crate) placed: Vec<Vec<(usize, usize)>>,
    /// A gang of several pod shapes that fits: the takes of all its parts (a gang of one
    /// shape has its takes made from `fit` when it is placed).
    takes: Option<Vec<Take>>,
}

impl Search {
    /// The takes of the placement found (which fits), node by node, for holding it.
    pub(crate) fn takes(
        self,
        cluster: &Cluster,
        gang: &Gang,
        bound: &crate::placement::BoundPod,
        engine: &EngineConfig,
        table: &crate::inventory::ResourceTable,
    ) -> Vec<Take> {
        match self.takes {
            Some(takes) => takes,
            None => takes_of(cluster, gang, bound, &self.fit, engine, table),
        }
    }
}

/// The engine's search for the whole gang in `cluster`. A gang of one pod shape is one
/// search. A gang of several (a JobSet's replicated Jobs asking for different pods) places
/// its main part first, then each other part on what the parts before it leave, as a
/// scheduler placing their pods one after another would: all or nothing, each pod
/// NUMA-aligned as the kubelet would align it. (An order of parts other than this one might
/// fit where this one does not; the main part, the most pods, goes first.)
pub(crate) fn search(
    cluster: &Cluster,
    table: &crate::inventory::ResourceTable,
    gang: GangPods,
    bound: &crate::placement::BoundPod,
    engine: &EngineConfig,
) -> Search {
    let fit = fit_cluster(
        cluster,
        table,
        gang.shape,
        bound,
        gang.pods,
        engine,
        gang.strategy,
    );
    if gang.extra.is_empty() {
        return Search {
            fit,
            placed: Vec::new(),
            takes: None,
        };
    }
    // The first `n` parts by name, for the misfit of the last of them (none unknown).
    let names = |n: usize| -> Vec<Arc<str>> {
        let Some(main) = gang.main_jobs else {
            return Vec::new();
        };
        let others = gang.extra.iter().map(|e| e.jobs.clone());
        std::iter::once(main.clone())
            .chain(others)
            .take(n)
            .collect()
    };
    if !fit.fits() {
        return Search {
            fit: in_part(fit, names(1)),
            placed: Vec::new(),
            takes: None,
        };
    }
    let mut takes = takes_of_shape(cluster, gang.shape, bound, &fit, engine, table);
    let mut placed = vec![fit.placements.clone()];
    let mut rest = cluster.clone();
    apply(&mut rest, takes.iter());
    for part in gang.extra {
        let part_bound = part.shape.bind(table);
        let pods = part.pods as usize;
        let found = fit_cluster(
            &rest,
            table,
            &part.shape,
            &part_bound,
            pods,
            engine,
            gang.strategy,
        );
        if !found.fits() {
            return Search {
                fit: in_part(found, names(placed.len() + 1)),
                placed,
                takes: None,
            };
        }
        let more = takes_of_shape(&rest, &part.shape, &part_bound, &found, engine, table);
        apply(&mut rest, more.iter());
        takes.extend(more);
        placed.push(found.placements);
    }
    Search {
        fit,
        placed,
        takes: Some(takes),
    }
}

/// The misfit of a part of a gang of several shapes, told which part it is: the last of
/// `names`, placed beside the others.
fn in_part(mut fit: ClusterFit, mut names: Vec<Arc<str>>) -> ClusterFit {
    if let (Some(cause), Some(part)) = (fit.misfit.take(), names.pop()) {
        fit.misfit = Some(crate::placement::Misfit::Part {
            part,
            beside: names,
            cause: Box::new(cause),
        });
    }
    fit
}

/// Whether the gang would fit in `base` with nothing running there; its score if so.
pub(crate) fn fit_drained(
    base: &Cluster,
    gang: &Gang,
    inventory: &Inventory,
    engine: &EngineConfig,
) -> Option<i64> {
    let empty = drained(base, inventory.resources.len());
    let bound = gang.shape.bind(&inventory.resources);
    let fit = search(&empty, &inventory.resources, gang.pods_of(), &bound, engine).fit;
    fit.fits().then_some(fit.score)
}

/// Room to keep for a starving gang in one worker (see [`room_in`]).
#[derive(Debug, Clone)]
pub(crate) struct Room {
    /// What its pods will take, node by node (indices in the worker's list).
    pub(crate) takes: Vec<Take>,
    /// How much of that room running pods still take: per node (and NUMA zone), the part of
    /// each amount not free now as thousandths of what the node (zone) has, summed. Lower
    /// is sooner as far as the dispatcher can tell, 0 is free now.
    pub(crate) shortfall: i64,
    /// The gang's score in the worker once drained (higher is better).
    pub(crate) score: i64,
}

/// The room the gang will take in `current` (the worker as the pass sees it) once the pods
/// running there end: the same exact fit as any placement, on the worker's nodes as they are
/// when empty, taken freest-now first, so that the room kept is the room that frees soonest
/// as far as the pass can tell (it cannot know when pods end). `None` when the gang does not
/// fit the worker even empty.
pub(crate) fn room_in(
    current: &Cluster,
    gang: &Gang,
    inventory: &Inventory,
    engine: &EngineConfig,
) -> Option<Room> {
    let bound = gang.shape.bind(&inventory.resources);
    let mut order = FreestFirst::new(&node_freeness(current, &bound));
    room_in_order(current, gang, &bound, inventory, engine, &mut order)
}

/// [`freeness`] of every node of `current`, by position.
pub(crate) fn node_freeness(current: &Cluster, bound: &BoundPod) -> Vec<i64> {
    current.nodes.iter().map(|n| freeness(n, bound)).collect()
}

/// Node positions, freest first (by [`node_freeness`]), then in the worker's order: the
/// order [`room_in_order`] takes nodes in. It is sorted only as far as asked for, since a
/// search for room reads only the first nodes of it (`freest_first`, in tests, is the whole order at
/// once, the reference).
pub(crate) struct FreestFirst {
    /// Every node's sort key: unique (the position breaks ties), so any correct sort gives
    /// the order a stable sort by freeness alone gives. The first `positions.len()` are in
    /// order, and no key after them sorts before them.
    keyed: Vec<(std::cmp::Reverse<i64>, usize)>,
    positions: Vec<usize>,
}

impl FreestFirst {
    pub(crate) fn new(freeness: &[i64]) -> Self {
        Self {
            keyed: freeness
                .iter()
                .enumerate()
                .map(|(i, &f)| (std::cmp::Reverse(f), i))
                .collect(),
            positions: Vec::new(),
        }
    }

    /// The first `k` node positions of the order (all of them when there are fewer).
    pub(crate) fn first(&mut self, k: usize) -> &[usize] {
        let k = k.min(self.keyed.len());
        let done = self.positions.len();
        if k > done {
            let rest = &mut self.keyed[done..];
            let wanted = k - done;
            if wanted < rest.len() {
                // The `wanted` least keys of the rest before the others, in no order.
                rest.select_nth_unstable(wanted - 1);
            }
            let next = &mut rest[..wanted];
            next.sort_unstable();
            self.positions.extend(next.iter().map(|&(_, i)| i));
        }
        &self.positions[..k]
    }
}

/// Node positions, freest first (by [`node_freeness`]), then in the worker's order: the
/// whole of [`FreestFirst`]'s order, sorted at once.
#[cfg(test)]
pub(crate) fn freest_first(freeness: &[i64]) -> Vec<usize> {
    let mut keyed: Vec<(std::cmp::Reverse<i64>, usize)> = freeness
        .iter()
        .enumerate()
        .map(|(i, &f)| (std::cmp::Reverse(f), i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// [`room_in`] with the nodes taken in `order`.
pub(crate) fn room_in_order(
    current: &Cluster,
    gang: &Gang,
    bound: &BoundPod,
    inventory: &Inventory,
    engine: &EngineConfig,
    order: &mut FreestFirst,
) -> Option<Room> {
    let table = &inventory.resources;
    let n = current.nodes.len();
    // The search takes nodes in order until the gang fits: on the first nodes of the order
    // it places the gang exactly as on all of them, so only as many are drained as it needs
    // (first as many as there are pods, doubling). Not pods that spread over nodes, nor pods
    // kept together: their spread counts every node, and the domain that scores best may
    // have its nodes anywhere in the order, so all are drained at once.
    let every_node = |s: &crate::placement::PodShape| s.spread.is_some() || !s.together.is_empty();
    let all_at_once = every_node(gang.shape) || gang.extra.iter().any(|e| every_node(&e.shape));
    let mut first = match all_at_once {
        true => n,
        false => gang.all_pods().clamp(1, n.max(1)).min(n),
    };
    loop {
        let nodes = order.first(first);
        let empty = drained_in(current, nodes, table.len());
        let found = search(&empty, table, gang.pods_of(), bound, engine);
        if found.fit.fits() {
            let score = found.fit.score;
            let mut takes = found.takes(&empty, gang, bound, engine, table);
            for t in &mut takes {
                t.index = nodes[t.index];
            }
            return Some(Room {
                shortfall: shortfall(current, &takes),
                takes,
                score,
            });
        }
        if first >= n {
            return None;
        }
        first = (first * 2).min(n);
    }
}

/// How free a node is for pods of this shape: the least free share (thousandths) of the
/// resources a pod asks for; -1 for a node without one of them.
pub(crate) fn freeness(node: &Node, pod: &crate::placement::BoundPod) -> i64 {
    pod.node_request
        .iter()
        .filter(|(_, _, q)| *q > 0)
        .map(|(id, _, _)| {
            let alloc = id.map_or(0, |id| node.allocatable.get(id).copied().unwrap_or(0));
            match id {
                Some(id) if alloc > 0 => node.free(*id).max(0).saturating_mul(1000) / alloc,
                _ => -1,
            }
        })
        .min()
        .unwrap_or(0)
}

/// How much of the room `takes` running pods still take in `current` (see
/// [`Room::shortfall`]).
pub(crate) fn shortfall(current: &Cluster, takes: &[Take]) -> i64 {
    let mut shortfall = 0i64;
    for t in takes {
        let Some(node) = node_of(current, t).and_then(|i| current.nodes.get(i)) else {
            continue;
        };
        for &(id, amount) in &t.amounts {
            let missing = (amount - node.free(id).max(0)).clamp(0, amount.max(0));
            let alloc = node.allocatable.get(id).copied().unwrap_or(0).max(1);
            shortfall = shortfall.saturating_add(missing.saturating_mul(1000) / alloc);
        }
        let zones = node.numa.as_ref().map_or(&[][..], |n| &n.zones[..]);
        for &(zi, id, amount) in &t.zone_amounts {
            let Some(z) = zones.get(zi) else { continue };
            let available = z.available.get(id).copied().unwrap_or(0).max(0);
            let missing = (amount - available).clamp(0, amount.max(0));
            let alloc = z.allocatable.get(id).copied().unwrap_or(0).max(1);
            shortfall = shortfall.saturating_add(missing.saturating_mul(1000) / alloc);
        }
    }
    shortfall
}

/// Whether some node of `current` that the room `takes` is not on is freer for pods of the
/// gang's shape than the least free node it is on (`freeness` by node position, see
/// [`node_freeness`]): then a room found now might free sooner.
pub(crate) fn freer_nodes_than(current: &Cluster, freeness: &[i64], takes: &[Take]) -> bool {
    let on: Vec<usize> = takes.iter().filter_map(|t| node_of(current, t)).collect();
    let Some(worst) = on.iter().filter_map(|&i| freeness.get(i)).min() else {
        return true;
    };
    freeness
        .iter()
        .enumerate()
        .any(|(i, f)| f > worst && !on.contains(&i))
}

/// The cluster with nothing running: what it could hold once it drains.
fn drained(cluster: &Cluster, resources: usize) -> Cluster {
    let order: Vec<usize> = (0..cluster.nodes.len()).collect();
    drained_in(cluster, &order, resources)
}

/// The cluster with nothing running, its nodes in `order` (positions in its list). What
/// keeps Jobs from it now (`unavailable`) is not kept: the question is what it could hold.
fn drained_in(cluster: &Cluster, order: &[usize], resources: usize) -> Cluster {
    let mut c = Cluster {
        name: cluster.name.clone(),
        labels: cluster.labels.clone(),
        nodes: order.iter().map(|&i| cluster.nodes[i].clone()).collect(),
        summary: cluster.summary.clone(),
        unavailable: None,
    };
    for n in &mut c.nodes {
        let n = Arc::make_mut(n);
        n.requested.iter_mut().for_each(|v| *v = 0);
        if let Some(numa) = &mut n.numa {
            for z in &mut Arc::make_mut(numa).zones {
                z.available.clear();
                z.available.extend_from_slice(&z.allocatable);
            }
        }
    }
    c.summarize(resources);
    c
}

pub(crate) fn show(resource: &str, m: i64) -> String {
    display(resource, Milli(m))
}

#[cfg(test)]
mod tests {
    use super::{freest_first, FreestFirst};
    use crate::rng::Rng;

    /// The order sorted as far as asked for is the whole order's prefix, however far it is
    /// asked for and in whatever steps (a search for room asks for more nodes, doubling).
    #[test]
    fn freest_first_sorted_in_steps_is_the_whole_order() {
        let mut rng = Rng::new(20);
        for round in 0..500 {
            let n = rng.index(40);
            // Few distinct values, so that ties (broken by position) are common.
            let values = 1 + rng.below(8) as i64;
            let freeness: Vec<i64> = (0..n)
                .map(|_| rng.below(values as u64) as i64 - 1)
                .collect();
            let whole = freest_first(&freeness);
            let mut order = FreestFirst::new(&freeness);
            let mut k = rng.index(4);
            loop {
                assert_eq!(
                    order.first(k),
                    &whole[..k.min(n)],
                    "round {round}: first {k} of {freeness:?}"
                );
                if k > n {
                    break;
                }
                k = k * 2 + 1 + rng.index(3);
            }
        }
    }
}
