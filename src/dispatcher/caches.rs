//! What admission remembers between passes to answer its questions faster (see
//! [`super::oracle`]): only ever a speed-up. Each memo here stands while nothing it was
//! found from changed; the rules that say when it lapses are the `World`'s calls into this
//! module ([`Caches::worker_changed`], [`Caches::capacity_changed`], ...), listed below next
//! to the memos they lapse.
//!
//! - Misfits ([`KnownMisfit`]): a class's gang did not fit a worker. It stands while the
//!   worker's nodes only lose room (its capacity epoch stays: [`Caches::capacity_changed_on`]
//!   and [`Caches::capacity_changed`] move it), or while the room per pod shape below,
//!   with the placements held there taken off, is too little for the gang. Not for gangs
//!   whose pods keep apart, spread over nodes or keep together: whether their reason stays
//!   turns as nodes gain or lose room, and they are searched afresh at every look.
//! - Room per pod shape ([`ShapeRoom`]): per worker, an upper bound of the pods of a shape
//!   its nodes can take; brought up to date from the log of nodes whose room changed either
//!   way ([`Caches::node_lost_room`], [`Caches::capacity_changed_on`]). Beside it, how free
//!   each node is for the shape ([`room::NodeFreeness`]), which orders the nodes room is
//!   kept on, brought up to date from the same log.
//! - Drained fits: whether a class would fit a worker once it drains, kept while the worker's
//!   nodes have the same allocatable (the inventory's capacity fingerprint).
//! - Held views ([`HeldView`]): a worker with the placements held there taken off, kept
//!   while neither its inventory nor its holds change ([`Caches::holds_changed`]); when
//!   either does, brought up to date in place.
//! - Rooms that stand ([`RoomStands`]): room kept for a starving Job that no room freeing
//!   sooner could replace, kept while its worker's nodes (any touch), holds and the room
//!   itself stay as they were.
//! - Rooms that do not take their gang yet ([`RoomMisfit`]): the starving Job's gang did not
//!   fit its room's worker with the room given back; kept under the same key as a room that
//!   stands, with the Job's class and the queues generation.
//! - Bound pod shapes ([`BoundPods`]): a pod shape's amounts in the inventory's resource ids,
//!   kept while the inventory's resource table is the same.
//! - Placement verdicts ([`ClassMemo`]): why a class fits no worker, kept while its queue's
//!   workers keep their state ([`Caches::worker_changed`]), the workers it was judged
//!   against keep their capacity, the workers it may use are the same, the queues stay as
//!   they were ([`Caches::queues_changed`]) and, when messages are written, so does the room
//!   kept for starving Jobs ([`Caches::kept_changed`]). Quota is not remembered: it is
//!   checked afresh at every look, and cheaply. A starving Job's class is judged afresh at
//!   every look: what it holds is decided anew each time; so is a class of pods kept apart,
//!   spread or together, as their misfits are.

mod memo;
pub(crate) mod oracle;
mod room;
#[cfg(test)]
mod tests;

pub(crate) use memo::{ClassMemo, MemoKey};
pub(crate) use room::{Changes, ShapeRoom, ShapeRooms};

use super::job::ClassKey;
use super::ledger::Ledger;
use super::state::{Queue, State};
use crate::inventory::{Cluster, Inventory, Node, ResourceTable};
use crate::placement::BoundPod;
use foldhash::HashMap;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// A class of pending Jobs that did not fit in a worker: why, and at which capacity epoch
/// and queues generation.
#[derive(Debug, Clone)]
pub(crate) struct KnownMisfit {
    pub(crate) reason: String,
    /// The worker is too small for it even empty.
    pub(crate) never: bool,
    pub(crate) epoch: u64,
    pub(crate) queues: u64,
    /// At most this many pods of the gang fitted at `epoch`.
    pub(crate) fitted: usize,
}

/// A worker's cluster with the placements held there taken off: what every admission pass
/// starts from, made once and kept while neither the inventory's cluster (held as a `Weak`:
/// a changed cluster is another allocation) nor the holds there change. When either does,
/// the view is brought up to date from itself: only the nodes that changed, or whose held
/// placements did, are made again (see [`oracle::held_view`]).
#[derive(Debug, Clone)]
pub(crate) struct HeldView {
    pub(crate) base: Weak<Cluster>,
    pub(crate) holds: u64,
    pub(crate) view: Arc<Cluster>,
    /// The nodes placements are held on, by index: the inventory's node the view's was made
    /// from (a `Weak`, so that the inventory's node stays its owner's to change in place) and
    /// a digest of the placements taken off it. Every other node is the inventory's own.
    pub(crate) held: Vec<HeldNode>,
}

/// One node of a [`HeldView`] with placements held on it.
#[derive(Debug, Clone)]
pub(crate) struct HeldNode {
    pub(crate) index: usize,
    pub(crate) base: Weak<Node>,
    pub(crate) digest: u64,
    /// How many pods of a shape the view's node can take, counted up to a cap: (shape key,
    /// cap, count), found while the node stays as it is (see `CachedOracle::view_room`).
    pub(crate) counts: Vec<(u64, usize, usize)>,
}

/// At most this many counts are kept per held node (see [`HeldNode::counts`]): one per pod
/// shape of the starving Jobs asking about the worker, as a rule.
const HELD_COUNTS: usize = 16;

impl HeldView {
    /// A view of `base` not brought up to date yet: nothing is taken off it.
    pub(crate) fn of(base: &Arc<Cluster>) -> Self {
        Self {
            base: Weak::new(),
            holds: 0,
            view: base.clone(),
            held: Vec::new(),
        }
    }

    /// How many pods of shape `shape` the view's node at `index` can take, up to `cap`:
    /// `count` of it, kept with the node while it stays as made (see [`HeldNode::counts`]).
    /// `node` is the node the count is for: one the pass changed since is counted afresh.
    pub(crate) fn count(
        &mut self,
        index: usize,
        node: &Arc<Node>,
        (shape, cap): (u64, usize),
        count: impl FnOnce() -> usize,
    ) -> usize {
        let kept = (self.view.nodes.get(index))
            .filter(|n| Arc::ptr_eq(n, node))
            .and_then(|_| self.held.binary_search_by_key(&index, |n| n.index).ok());
        match kept {
            Some(k) => self.count_held(k, (shape, cap), count),
            None => count(),
        }
    }

    /// [`HeldView::count`] of the view's own node held at position `k` of
    /// [`HeldView::held`], for a caller that goes through the held nodes in order.
    pub(crate) fn count_held(
        &mut self,
        k: usize,
        (shape, cap): (u64, usize),
        count: impl FnOnce() -> usize,
    ) -> usize {
        let Some(counts) = self.held.get_mut(k).map(|n| &mut n.counts) else {
            return count();
        };
        if let Some(&(_, _, n)) = counts.iter().find(|c| (c.0, c.1) == (shape, cap)) {
            return n;
        }
        let n = count();
        if counts.len() < HELD_COUNTS {
            counts.push((shape, cap, n));
        }
        n
    }

    /// Whether the view is still `base` (the inventory's cluster now) with the placements
    /// held at hold version `holds` taken off.
    pub(crate) fn is_current(&self, base: &Arc<Cluster>, holds: u64) -> bool {
        std::ptr::eq(self.base.as_ptr(), Arc::as_ptr(base)) && self.holds == holds
    }
}

/// Whether a class would fit in a worker once it drains (its score if so), found on nodes
/// with the worker's capacity fingerprint then, under a queues generation (it is kept by
/// the worker's position in its queue's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainedFit {
    pub(crate) capacity_fingerprint: u64,
    pub(crate) queues: u64,
    pub(crate) score: Option<i64>,
}

/// What one pass found that is worth keeping (see [`Caches::keep`]).
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// By the worker's position in the list of the class's queue.
    pub(crate) misfits: Vec<(ClassKey, usize, KnownMisfit)>,
    /// By the worker's position in the list of the class's queue.
    pub(crate) drained: Vec<(ClassKey, usize, DrainedFit)>,
    /// The caches' held views ([`Caches::take_held_views`]), handed back brought up to date.
    pub(crate) held_views: HeldViews,
    pub(crate) verdicts: Vec<(ClassKey, ClassMemo)>,
    pub(crate) shape_rooms: ShapeRooms,
    pub(crate) rooms_stand: Vec<(String, RoomStands)>,
    pub(crate) room_misfits: Vec<(String, RoomMisfit)>,
    /// Pod shapes bound in the pass, by shape key.
    pub(crate) bound: Vec<(u64, Arc<BoundPod>)>,
}

/// Per worker, its [`HeldView`]. Only looked up, never gone through in order.
pub(crate) type HeldViews = HashMap<String, HeldView>;

/// Pod shapes bound to the resource table named `names` ([`crate::placement::PodShape::bind`]
/// depends on nothing else), by shape key.
#[derive(Debug, Clone, Default)]
pub(crate) struct BoundPods {
    names: Vec<String>,
    by_shape: HashMap<u64, Arc<BoundPod>>,
}

impl BoundPods {
    fn bound_to(&self, table: &ResourceTable) -> bool {
        self.names.len() == table.len()
            && self
                .names
                .iter()
                .enumerate()
                .all(|(id, n)| table.name(id) == n)
    }
}

/// Room kept for a starving Job that no room freeing sooner could replace, and the state of
/// its worker then: while the worker's nodes, the placements held there and the room itself
/// stay as they were, it still could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoomStands {
    pub(crate) serial: u64,
    pub(crate) epoch: u64,
    pub(crate) touches: u64,
    pub(crate) holds: u64,
}

/// A starving Job's gang did not fit the worker of the room kept for it, with the room given
/// back: while the room stands unchanged ([`RoomStands`]) and the Job's class and the queues
/// are the same, a search there finds the same.
#[derive(Debug, Clone)]
pub(crate) struct RoomMisfit {
    pub(crate) key: RoomMisfitKey,
    pub(crate) reason: String,
    pub(crate) never: bool,
}

/// What a [`RoomMisfit`] was found under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoomMisfitKey {
    pub(crate) stands: RoomStands,
    pub(crate) class: ClassKey,
    pub(crate) queues: u64,
    /// Whether the reason was written (messages asked for).
    pub(crate) describe: bool,
}

/// What is kept across passes, and the epochs that tell when it lapses.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caches {
    /// Per worker, a counter bumped whenever it may have gained room (its inventory changed,
    /// a placement held there was released): a misfit remembered at an epoch stays a misfit
    /// until the epoch moves.
    capacity: HashMap<String, u64>,
    /// Per worker, the log of the nodes whose room changed (see [`Changes`]).
    changes: HashMap<String, Changes>,
    /// Kept across passes (see [`ShapeRoom`]); a pass takes them while it runs.
    shape_rooms: ShapeRooms,
    /// Bumped when a queue is added, changed or removed.
    queues_generation: u64,
    /// Bumped when room kept for a starving Job is kept, moved or let go.
    kept_generation: u64,
    /// By Job uid: room kept for it that no room freeing sooner could replace.
    rooms_stand: HashMap<String, RoomStands>,
    /// By Job uid: its gang did not fit its room's worker with the room given back.
    room_misfits: HashMap<String, RoomMisfit>,
    /// Per queue, bumped whenever its Jobs may have become admissible because one of its
    /// workers changed state (or as a whole).
    queue_epochs: HashMap<String, u64>,
    /// Per worker, the queues that list it, for the queues generation it was found at.
    queues_of: (u64, HashMap<String, Arc<[String]>>),
    /// Why each class of pending Jobs last fit no worker, and under which epochs.
    verdicts: HashMap<ClassKey, ClassMemo>,
    /// Misfits of a class in a worker, with the epochs they were found at. By the worker's
    /// position in the list of the class's queue (a class has one queue): a misfit found
    /// under another list of workers lapses (see [`KnownMisfit::queues`]).
    misfits: HashMap<ClassKey, Vec<Option<KnownMisfit>>>,
    /// Per worker, bumped whenever a placement held there is added or released.
    hold_versions: HashMap<String, u64>,
    /// Per worker, its cluster with the placements held there taken off.
    held_views: HeldViews,
    /// By the worker's position in the list of the class's queue, as `misfits`.
    drained: HashMap<ClassKey, Vec<Option<DrainedFit>>>,
    /// The workers that held stale copies at the last admission pass.
    stale_when_judged: Vec<String>,
    bound: BoundPods,
}

impl Caches {
    // ---- The rules that lapse memos, called by the `World` as things change. ----

    /// A queue was added, changed or removed: every misfit and verdict lapses.
    pub(crate) fn queues_changed(&mut self) {
        self.queues_generation += 1;
    }

    /// Something about the worker changed that may let Jobs of its queues go there (its
    /// state, stale copies gone): the verdicts of its queues lapse.
    pub(crate) fn worker_changed(&mut self, cluster: &str, queues: &BTreeMap<String, Queue>) {
        if self.queues_of.0 != self.queues_generation {
            self.queues_of = (self.queues_generation, HashMap::default());
        }
        let listing = match self.queues_of.1.get(cluster) {
            Some(q) => q.clone(),
            None => {
                let q: Arc<[String]> = queues
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
        for q in listing.iter() {
            bump(&mut self.queue_epochs, q);
        }
    }

    /// The worker may have gained room anywhere (its inventory, or its state, changed): its
    /// misfits are checked again, its room per shape is counted again whole, and its queues'
    /// verdicts lapse.
    pub(crate) fn capacity_changed(&mut self, cluster: &str, queues: &BTreeMap<String, Queue>) {
        bump(&mut self.capacity, cluster);
        self.changes
            .entry(cluster.to_string())
            .or_default()
            .whole_worker_changed();
        self.worker_changed(cluster, queues);
    }

    /// Node `index` of the worker may have gained room (a pod ended, a placement held there
    /// was released). Only the classes judged against this worker look again (see
    /// [`ClassMemo::looked`]): its allocatable, and so its queues' automatic quota and
    /// whether a gang could ever fit there, stay as they were.
    pub(crate) fn capacity_changed_on(&mut self, cluster: &str, index: usize) {
        bump(&mut self.capacity, cluster);
        self.touch(cluster, index);
    }

    /// Node `index` of the worker lost room (a pod was bound there): nothing waiting can go
    /// there because of it, but [`ShapeRoom`]s count it again.
    pub(crate) fn node_lost_room(&mut self, cluster: &str, index: usize) {
        self.touch(cluster, index);
    }

    /// Node `index` of the worker goes in its log of nodes whose room changed (either way).
    fn touch(&mut self, cluster: &str, index: usize) {
        match self.changes.get_mut(cluster) {
            Some(c) => c.touch(index),
            None => self
                .changes
                .entry(cluster.to_string())
                .or_default()
                .touch(index),
        }
    }

    /// A placement held in the worker was added or released: its held view lapses.
    pub(crate) fn holds_changed(&mut self, cluster: &str) {
        bump(&mut self.hold_versions, cluster);
    }

    /// Room kept for a starving Job was kept, moved or let go: the messages that say where
    /// room is kept for another Job lapse.
    pub(crate) fn kept_changed(&mut self) {
        self.kept_generation += 1;
    }

    /// The inventory was replaced by `new`: workers whose data changed may have gained room.
    pub(crate) fn inventory_replaced(
        &mut self,
        old: &Inventory,
        new: &Inventory,
        queues: &BTreeMap<String, Queue>,
    ) {
        for c in &new.clusters {
            let same = old
                .cluster(&c.name)
                .is_some_and(|o| std::ptr::eq(o, c.as_ref()));
            if !same {
                self.capacity_changed(&c.name, queues);
            }
        }
    }

    /// Called before each admission pass: a worker that held stale copies at the last pass
    /// and holds none now may take Jobs again. (Compared pass to pass, not copy by copy: a
    /// finished Job's copy is stale from its final status until its removal, both carried
    /// out between two passes, and no pass saw the worker kept for it.)
    pub(crate) fn before_pass(&mut self, state: &State, ledger: &Ledger) {
        let now = state.workers_with_stale_copies();
        let then = std::mem::replace(&mut self.stale_when_judged, now);
        for c in then {
            if !state.has_stale_copies(&c) {
                self.worker_changed(&c, &state.queues);
            }
        }
        // Views of workers gone from the inventory or without held placements would keep old
        // nodes shared (a node shared is a node copied when it changes). A view whose worker
        // or holds changed is kept: the next one is made from it.
        self.held_views.retain(|name, _| {
            ledger.holds_any_in(name) && state.inventory.cluster_arc(name).is_some()
        });
    }

    // ---- Keeping what a pass found. ----

    /// The [`ShapeRoom`]s kept across passes, for a pass to bring up to date and hand back
    /// in its [`Findings`].
    pub(crate) fn take_shape_rooms(&mut self) -> ShapeRooms {
        std::mem::take(&mut self.shape_rooms)
    }

    /// The [`HeldView`]s kept across passes, for a pass to bring up to date (in place: the
    /// pass owns them) and hand back in its [`Findings`].
    pub(crate) fn take_held_views(&mut self) -> HeldViews {
        std::mem::take(&mut self.held_views)
    }

    /// Keeps what the pass found.
    pub(crate) fn keep(&mut self, found: Findings, state: &State, ledger: &Ledger) {
        let pending = ledger.pending_classes();
        self.keep_shape_rooms(found.shape_rooms, &state.inventory, pending);
        self.keep_bound(found.bound, &state.inventory.resources, pending);
        self.held_views = found.held_views;
        for (class, order, misfit) in found.misfits {
            set_at(self.misfits.entry(class).or_default(), order, misfit);
        }
        prune(&mut self.misfits, pending);
        for (class, order, fit) in found.drained {
            set_at(self.drained.entry(class).or_default(), order, fit);
        }
        prune(&mut self.drained, pending);
        for (class, memo) in found.verdicts {
            self.verdicts.insert(class, memo);
        }
        prune(&mut self.verdicts, pending);
        self.rooms_stand.extend(found.rooms_stand);
        prune_rooms(&mut self.rooms_stand, ledger, |r| r.serial);
        self.room_misfits.extend(found.room_misfits);
        prune_rooms(&mut self.room_misfits, ledger, |r| r.key.stands.serial);
    }

    /// Keeps the shapes a pass bound, all anew when the resource table changed; once there
    /// are more shapes than classes of pending Jobs, only the shapes a pending Job has.
    fn keep_bound(
        &mut self,
        found: Vec<(u64, Arc<BoundPod>)>,
        table: &ResourceTable,
        pending: &BTreeMap<ClassKey, impl Sized>,
    ) {
        let kept = &mut self.bound;
        if !kept.bound_to(table) {
            kept.names = (0..table.len())
                .map(|id| table.name(id).to_string())
                .collect();
            kept.by_shape.clear();
        }
        kept.by_shape.extend(found);
        if too_many_shapes(kept.by_shape.len(), pending) {
            let shapes = pending_shapes(pending);
            kept.by_shape.retain(|shape, _| shapes.contains(shape));
        }
    }

    /// Keeps what a pass brought up to date, less the workers the inventory no longer has
    /// and, once a worker holds more shapes than there are classes of pending Jobs, the
    /// shapes no pending Job has (a long-running dispatcher sees many shapes come and go).
    fn keep_shape_rooms(
        &mut self,
        mut rooms: ShapeRooms,
        inventory: &Inventory,
        pending: &BTreeMap<ClassKey, impl Sized>,
    ) {
        if rooms.len() > inventory.clusters.len() {
            rooms.retain(|worker, _| inventory.cluster(worker).is_some());
        }
        if rooms
            .values()
            .any(|by_shape| too_many_shapes(by_shape.len(), pending))
        {
            let shapes = pending_shapes(pending);
            for by_shape in rooms.values_mut() {
                by_shape.retain(|shape, _| shapes.contains(shape));
            }
        }
        self.shape_rooms = rooms;
    }

    // ---- Reading, for the cached oracle. ----

    /// The pod shapes bound in earlier passes, if they were bound to `table`.
    pub(crate) fn bound_pods(&self, table: &ResourceTable) -> Option<&HashMap<u64, Arc<BoundPod>>> {
        self.bound.bound_to(table).then_some(&self.bound.by_shape)
    }

    pub(crate) fn capacity_epoch(&self, cluster: &str) -> u64 {
        self.capacity.get(cluster).copied().unwrap_or(0)
    }

    pub(crate) fn queues_generation(&self) -> u64 {
        self.queues_generation
    }

    pub(crate) fn hold_version(&self, cluster: &str) -> u64 {
        self.hold_versions.get(cluster).copied().unwrap_or(0)
    }

    /// What a class's placement verdict depends on, beyond its own Jobs and its queue's
    /// workers' nodes.
    /// The memo key of `queue`'s verdicts; `kept_matters` when they depend on where room is
    /// kept (see [`MemoKey::kept`]).
    pub(crate) fn memo_key(&self, queue: &str, kept_matters: bool) -> MemoKey {
        MemoKey {
            queue_epoch: self.queue_epochs.get(queue).copied().unwrap_or(0),
            queues: self.queues_generation,
            kept: if kept_matters {
                self.kept_generation
            } else {
                0
            },
            starving: false,
        }
    }

    /// The state of `cluster` that [`RoomStands`] compares, for room `serial`.
    pub(crate) fn room_stands_key(&self, cluster: &str, serial: u64) -> RoomStands {
        RoomStands {
            serial,
            epoch: self.capacity_epoch(cluster),
            touches: self.touches_end(cluster),
            holds: self.hold_version(cluster),
        }
    }

    pub(crate) fn room_stands(&self, job_uid: &str) -> Option<&RoomStands> {
        self.rooms_stand.get(job_uid)
    }

    pub(crate) fn room_misfit(&self, job_uid: &str) -> Option<&RoomMisfit> {
        self.room_misfits.get(job_uid)
    }

    pub(crate) fn verdict(&self, class: &ClassKey) -> Option<&ClassMemo> {
        self.verdicts.get(class)
    }

    pub(crate) fn misfits_of(&self, class: &ClassKey) -> Option<&[Option<KnownMisfit>]> {
        self.misfits.get(class).map(Vec::as_slice)
    }

    pub(crate) fn drained_of(&self, class: &ClassKey) -> Option<&[Option<DrainedFit>]> {
        self.drained.get(class).map(Vec::as_slice)
    }

    /// The nodes of the worker whose room changed since position `since` of its log (some
    /// maybe more than once), and the position after them; `None` when the whole worker
    /// may have changed since (or the log no longer goes back that far).
    pub(crate) fn touches(&self, cluster: &str, since: u64) -> Option<(&[usize], u64)> {
        match self.changes.get(cluster) {
            None => (since == 0).then_some((&[][..], 0)),
            Some(c) => c.touches(since),
        }
    }

    /// Where the worker's log of touched nodes ends now.
    pub(crate) fn touches_end(&self, cluster: &str) -> u64 {
        self.changes.get(cluster).map_or(0, Changes::end)
    }
}

/// Drops the classes no Job is pending in any more, now and then.
fn prune<V>(memos: &mut HashMap<ClassKey, V>, pending: &BTreeMap<ClassKey, impl Sized>) {
    if memos.len() > 4 * (pending.len() + 1) {
        memos.retain(|class, _| pending.contains_key(class));
    }
}

/// Drops, now and then, what is kept by Job uid for rooms no longer held under the serial it
/// was found for (`serial`).
fn prune_rooms<V>(memos: &mut HashMap<String, V>, ledger: &Ledger, serial: impl Fn(&V) -> u64) {
    if memos.len() > 2 * ledger.nominations().count() + 16 {
        memos.retain(|uid, v| ledger.hold_of(uid).is_some_and(|h| h.serial == serial(v)));
    }
}

/// Whether a memo kept per pod shape, holding `kept` shapes, keeps only the shapes of pending
/// Jobs from now on: once it holds more than there are classes of them, and a few (a
/// long-running dispatcher sees many shapes come and go).
fn too_many_shapes(kept: usize, pending: &BTreeMap<ClassKey, impl Sized>) -> bool {
    kept > pending.len() + 16
}

/// The pod shapes of the classes of pending Jobs.
fn pending_shapes(pending: &BTreeMap<ClassKey, impl Sized>) -> std::collections::HashSet<u64> {
    pending.keys().map(|class| class.shape).collect()
}

/// Sets `by_order[order]`, growing it as needed.
fn set_at<T: Clone>(by_order: &mut Vec<Option<T>>, order: usize, value: T) {
    if by_order.len() <= order {
        by_order.resize(order + 1, None);
    }
    by_order[order] = Some(value);
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
