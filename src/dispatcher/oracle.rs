//! The questions admission asks whose answers can be remembered: does this gang fit this
//! worker now, would it fit were the worker empty, and does a class's last verdict still
//! stand. [`PlainOracle`] answers each afresh from the placement engine: it is the
//! reference. The caches (`super::caches`) answer the same questions faster, and random runs
//! hold the two to the same decisions. The few questions about room kept for starving Jobs
//! are answered afresh by every oracle, alike (the trait's provided methods).

pub(crate) mod view;

pub(crate) use view::{with_holds_taken_off, PassView, Room};

use super::job::{ClassKey, Job};
use super::kind::Extra;
use super::ledger::{Hold, Ledger};
use super::state::State;
use super::world::{DispatchConfig, Placement};
use crate::inventory::Cluster;
use crate::placement::inflight::Take;
use crate::placement::{PodShape, Strategy};
use std::sync::Arc;

/// A gang admission asks about: the first waiting Job of a class, whose pods must all run
/// at once in one worker.
pub(crate) struct Gang<'a> {
    pub(crate) class: &'a ClassKey,
    pub(crate) job: &'a Job,
    /// The main part of the gang: its pod shape and how many.
    pub(crate) shape: &'a PodShape,
    pub(crate) pods: usize,
    /// The pods of other shapes (a JobSet's replicated Jobs that ask for other pods), placed
    /// with the main part in the same worker (see [`view::search`]); usually none.
    pub(crate) extra: &'a [Extra],
    /// Of a gang of several shapes, its main part's replicated Jobs, for messages.
    pub(crate) main_jobs: Option<&'a Arc<str>>,
    /// How the queue scores workers, as the pod template may override it.
    pub(crate) strategy: Strategy,
}

impl Gang<'_> {
    /// Every pod of the gang, of every shape.
    pub(crate) fn all_pods(&self) -> usize {
        self.pods + self.extra.iter().map(|e| e.pods as usize).sum::<usize>()
    }

    /// Its pods, as [`view::search`] places them.
    pub(crate) fn pods_of(&self) -> GangPods<'_> {
        GangPods {
            shape: self.shape,
            pods: self.pods,
            extra: self.extra,
            main_jobs: self.main_jobs,
            strategy: self.strategy,
        }
    }
}

/// The pods of a gang as placement sees them, whoever asks (admission, or `explain`): the
/// main part's shape and how many, the parts of other shapes, and how workers are scored.
#[derive(Clone, Copy)]
pub(crate) struct GangPods<'a> {
    pub(crate) shape: &'a PodShape,
    pub(crate) pods: usize,
    pub(crate) extra: &'a [Extra],
    /// Of a gang of several shapes, its main part's replicated Jobs, for messages.
    pub(crate) main_jobs: Option<&'a Arc<str>>,
    pub(crate) strategy: Strategy,
}

/// Whether a gang fits a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The whole gang fits; the worker's score (higher is better).
    Fits(i64),
    /// It does not: why (empty unless messages are asked for), and whether the worker could
    /// never hold it, even empty.
    Misfit { reason: String, never: bool },
}

/// Why a Job waits, and whether its quota is held for it: the verdict of one judgement,
/// which a class keeps until something it depended on changes (a starving Job's is not kept).
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// Its queue's quota is held for it (it starves).
    pub(crate) hold_quota: bool,
}

/// What a class's placement depends on besides the class itself and the workers' nodes.
pub(crate) struct Circumstances<'a> {
    pub(crate) queue: &'a str,
    /// The pass's index of the queue (see `admission::QueueState`).
    pub(crate) queue_slot: usize,
    /// The queue's workers, in its order.
    pub(crate) workers: &'a [String],
    /// The queue's workers (by position) that may take Jobs in the pass.
    pub(crate) usable: &'a Arc<[usize]>,
    /// The Job has waited its queue's `starvationAfter` (its message says so).
    pub(crate) starving: bool,
}

/// Admission's questions. One oracle serves one admission pass; `'w` is the lifetime of the
/// state the pass reads.
pub(crate) trait Oracle<'w> {
    /// Admission looks at a Job of the queue `now` describes: called at every look, before
    /// any question about the Job.
    fn look(&mut self, _now: &Circumstances) {}

    /// Admission is about to ask about `gang`, which `now` describes, in `workers` (by
    /// position in the queue's list, and name; the oracle may answer them all at once).
    /// Called once per judgement, before any question.
    fn prepare(&mut self, _gang: &Gang, _now: &Circumstances, _workers: &[(usize, &'w str)]) {}

    /// Whether the whole gang fits in `worker`, the queue's worker at position `order` in
    /// its list, as the pass sees it now (placements held and handed out earlier in the pass
    /// taken off).
    fn fit(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Fit;

    /// Whether the gang would fit in `worker`, the queue's worker at position `order` in its
    /// list, were its nodes empty; the score there if so.
    fn fit_drained(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Option<i64>;

    /// Of `among` (the queue's workers by position; `workers` is its list), those that could
    /// hold the gang were their nodes empty (see [`Oracle::fit_drained`]), in the same order.
    fn could_hold(&mut self, gang: &Gang, workers: &'w [String], among: &[usize]) -> Vec<usize> {
        among
            .iter()
            .copied()
            .filter(|&i| self.fit_drained(gang, &workers[i], i).is_some())
            .collect()
    }

    /// Places the gang in `worker`, where [`Oracle::fit`] just found it fits: the pass's view
    /// of the worker loses the room, and the placement is returned node by node, to hold.
    /// `None` when the worker changed since.
    fn place(&mut self, gang: &Gang, worker: &'w str) -> Option<Vec<Take>>;

    /// The verdict of the class's last placement, if nothing it depended on changed since
    /// (asked only once its quota is covered).
    fn recall(&mut self, gang: &Gang, now: &Circumstances) -> Option<Verdict>;

    /// Keeps the verdict of a placement: the gang fits none of the workers `asked` about (by
    /// position in the queue's list), nor any other usable one.
    fn remember(&mut self, gang: &Gang, now: &Circumstances, verdict: &Verdict, asked: &[usize]);

    /// The pass's view of `worker` (placements held and handed out earlier in the pass taken
    /// off), and what the pass reads.
    fn current(&mut self, worker: &str) -> Option<&Cluster>;
    fn context(&self) -> (&'w State, &'w DispatchConfig);
    fn view_mut(&mut self) -> &mut PassView<'w>;

    /// The gang's pod shape bound to the inventory's resource table.
    fn bound(&mut self, gang: &Gang) -> Arc<crate::placement::BoundPod> {
        Arc::new(gang.shape.bind(&self.context().0.inventory.resources))
    }

    /// The pass gave room back in `worker`: what was found there in earlier passes may not
    /// hold for the rest of it.
    fn gained_room(&mut self, _worker: &'w str) {}

    /// Whether the gang fits in `worker` with `room`, kept for its Job there, counted as
    /// free.
    fn fit_with_room(&mut self, gang: &Gang, worker: &'w str, room: &Hold) -> Fit {
        fit_with_room(self, gang, worker, room)
    }

    /// Places the gang in `worker`, where [`Oracle::fit_with_room`] just found it fits: the
    /// pass's view of the worker gives the room back and loses the placement.
    fn place_with_room(&mut self, gang: &Gang, worker: &'w str, room: &Hold) -> Option<Vec<Take>> {
        let (state, config) = self.context();
        let (cluster, found) = self.search_with_room(gang, worker, room)?;
        if !found.fit.fits() {
            return None;
        }
        let table = &state.inventory.resources;
        let bound = self.bound(gang);
        let takes = found.takes(&cluster, gang, &bound, &config.engine, table);
        let v = self.view_mut();
        v.give_back(worker, &room.takes);
        v.take(worker, &takes);
        self.gained_room(worker);
        Some(takes)
    }

    /// The engine's search for the gang in `worker` as the pass sees it, with `room` given
    /// back; the worker searched is returned with it.
    fn search_with_room(
        &mut self,
        gang: &Gang,
        worker: &'w str,
        room: &Hold,
    ) -> Option<(Cluster, view::Search)> {
        let bound = self.bound(gang);
        let (state, config) = self.context();
        let cluster = view::with_room(self.current(worker)?, room);
        let table = &state.inventory.resources;
        let found = view::search(&cluster, table, gang.pods_of(), &bound, &config.engine);
        Some((cluster, found))
    }

    /// The room the gang would take in `worker` once the pods running there end (see
    /// [`view::room_in`]), counting the room kept for its Job (`own`, wherever it is) as
    /// free.
    fn room_for(&mut self, gang: &Gang, worker: &'w str, own: Option<&Hold>) -> Option<Room> {
        let (state, config) = self.context();
        let current = self.current(worker)?;
        match own.filter(|h| h.cluster == worker) {
            Some(own) => view::room_in(
                &view::with_room(current, own),
                gang,
                &state.inventory,
                &config.engine,
            ),
            None => view::room_in(current, gang, &state.inventory, &config.engine),
        }
    }

    /// Room for the gang in the worker of `room` (kept for its Job) that running pods take
    /// less of than they take of `room`, if the worker has nodes freer than the least free
    /// one `room` is on: room kept follows the nodes that free first.
    fn freer_room(&mut self, gang: &Gang, room: &Hold) -> Option<Room> {
        freer_room(self, gang, room)
    }

    /// The pass keeps `takes` in `worker` for a starving Job: later Jobs in the pass do not
    /// get them.
    fn keep(&mut self, worker: &'w str, takes: &[Take]) {
        self.view_mut().take(worker, takes);
    }
}

/// [`Oracle::fit_with_room`], answered afresh.
pub(crate) fn fit_with_room<'w, O: Oracle<'w> + ?Sized>(
    oracle: &mut O,
    gang: &Gang,
    worker: &'w str,
    room: &Hold,
) -> Fit {
    let describe = oracle.context().1.describe;
    match oracle.search_with_room(gang, worker, room) {
        None => Fit::not_in_inventory(),
        Some((_, found)) => Fit::of(&found.fit, describe),
    }
}

/// [`Oracle::freer_room`], answered afresh.
pub(crate) fn freer_room<'w, O: Oracle<'w> + ?Sized>(
    oracle: &mut O,
    gang: &Gang,
    room: &Hold,
) -> Option<Room> {
    let (state, config) = oracle.context();
    let current = view::with_room(oracle.current(&room.cluster)?, room);
    let bound = gang.shape.bind(&state.inventory.resources);
    let freeness = view::node_freeness(&current, &bound);
    freer_room_in(&current, gang, &bound, room, &freeness, state, config)
}

/// [`freer_room`] in `current`, the room's worker as the pass sees it with the room given
/// back, whose nodes are as free as `freeness` says (see [`view::node_freeness`]).
pub(crate) fn freer_room_in(
    current: &Cluster,
    gang: &Gang,
    bound: &crate::placement::BoundPod,
    room: &Hold,
    freeness: &[i64],
    state: &State,
    config: &DispatchConfig,
) -> Option<Room> {
    if !view::freer_nodes_than(current, freeness, &room.takes) {
        return None;
    }
    let now = view::shortfall(current, &room.takes);
    let mut order = view::FreestFirst::new(freeness);
    view::room_in_order(
        current,
        gang,
        bound,
        &state.inventory,
        &config.engine,
        &mut order,
    )
    .filter(|better| better.shortfall < now)
}

/// Answers every question afresh, from the placement engine, on the pass's view of the
/// workers; remembers nothing. The reference the caches are held to.
pub(crate) struct PlainOracle<'a> {
    view: PassView<'a>,
    config: &'a DispatchConfig,
}

impl<'a> PlainOracle<'a> {
    pub(super) fn new(state: &'a State, ledger: &'a Ledger, config: &'a DispatchConfig) -> Self {
        Self {
            view: PassView::new(state, ledger),
            config,
        }
    }

    /// The engine's search for the whole gang in the worker as the pass sees it.
    fn search(&mut self, gang: &Gang, worker: &str) -> Option<crate::placement::ClusterFit> {
        let (state, config) = (self.view.state(), self.config);
        let table = &state.inventory.resources;
        let bound = gang.shape.bind(table);
        let cluster = self.current(worker)?;
        Some(view::search(cluster, table, gang.pods_of(), &bound, &config.engine).fit)
    }
}

impl<'w> Oracle<'w> for PlainOracle<'w> {
    fn fit(&mut self, gang: &Gang, worker: &'w str, _order: usize) -> Fit {
        match self.config.placement {
            Placement::SumOfFree => self.view.sum_fit(worker, &gang.job.total_request()),
            // Admission asks nothing under `Everywhere`.
            Placement::Exact | Placement::Everywhere => match self.search(gang, worker) {
                None => Fit::not_in_inventory(),
                Some(fit) => Fit::of(&fit, self.config.describe),
            },
        }
    }

    fn fit_drained(&mut self, gang: &Gang, worker: &'w str, _order: usize) -> Option<i64> {
        let base = self.view.state().inventory.cluster(worker)?;
        view::fit_drained(
            base,
            gang,
            &self.view.state().inventory,
            &self.config.engine,
        )
    }

    fn place(&mut self, gang: &Gang, worker: &'w str) -> Option<Vec<Take>> {
        match self.config.placement {
            Placement::SumOfFree => {
                self.view.sum_take(worker, &gang.job.total_request());
                Some(Vec::new())
            }
            Placement::Everywhere => Some(Vec::new()),
            Placement::Exact => {
                let fit = self.search(gang, worker).filter(|f| f.fits())?;
                let engine = self.config.engine;
                Some(self.view.place(worker, gang, &fit, &engine))
            }
        }
    }

    fn recall(&mut self, _gang: &Gang, _now: &Circumstances) -> Option<Verdict> {
        None
    }

    fn remember(&mut self, _: &Gang, _: &Circumstances, _: &Verdict, _: &[usize]) {}

    fn current(&mut self, worker: &str) -> Option<&Cluster> {
        let ledger = self.view.ledger();
        self.view.cluster(worker, |base| {
            Arc::new(with_holds_taken_off(base, ledger.holds_in(worker)))
        })
    }

    fn context(&self) -> (&'w State, &'w DispatchConfig) {
        (self.view.state(), self.config)
    }

    fn view_mut(&mut self) -> &mut PassView<'w> {
        &mut self.view
    }
}

impl Fit {
    /// The engine's verdict, as admission takes it.
    pub(crate) fn of(fit: &crate::placement::ClusterFit, describe: bool) -> Self {
        match &fit.misfit {
            None => Fit::Fits(fit.score),
            Some(m) => Fit::Misfit {
                reason: if describe {
                    m.to_string()
                } else {
                    String::new()
                },
                never: m.unresolvable(),
            },
        }
    }

    pub(crate) fn not_in_inventory() -> Self {
        Fit::Misfit {
            reason: "not in the inventory yet".into(),
            never: false,
        }
    }
}
