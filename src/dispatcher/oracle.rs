//! The questions admission asks whose answers can be remembered: does this gang fit this
//! worker now, would it fit were the worker empty, and does a class's last verdict still
//! stand. [`PlainOracle`] answers each afresh from the placement engine: it is the
//! reference. The caches (`super::caches`) answer the same questions faster, and random runs
//! hold the two to the same decisions.

pub(crate) mod view;

pub(crate) use view::{with_holds_taken_off, PassView};

use super::job::{ClassKey, Job};
use super::ledger::Ledger;
use super::state::State;
use super::world::{DispatchConfig, Placement};
use crate::placement::inflight::Take;
use crate::placement::{fit_cluster, PodShape, Strategy};
use std::sync::Arc;

/// A gang admission asks about: the first waiting Job of a class, whose pods must all run
/// at once in one worker.
pub(crate) struct Gang<'a> {
    pub(crate) class: &'a ClassKey,
    pub(crate) job: &'a Job,
    pub(crate) shape: &'a PodShape,
    pub(crate) pods: usize,
    /// How the queue scores workers, as the pod template may override it.
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

/// Why a Job waits, with what waiting holds for it: the verdict of one judgement, which a
/// class keeps until something it depended on changes.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The worker kept for it as it drains (it starves).
    pub(crate) reserve: Option<String>,
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
    pub(crate) starving: bool,
    /// The queue's workers (by position) no Job is kept from in the pass so far.
    pub(crate) usable: &'a Arc<[usize]>,
}

/// Admission's questions. One oracle serves one admission pass; `'w` is the lifetime of the
/// state the pass reads.
pub(crate) trait Oracle<'w> {
    /// Admission is about to ask about `gang`, which `now` describes, in `workers` (the
    /// oracle may answer them all at once). Called once per judgement, before any question.
    fn prepare(&mut self, _gang: &Gang, _now: &Circumstances, _workers: &[&'w str]) {}

    /// Whether the whole gang fits in `worker`, the queue's worker at position `order` in
    /// its list, as the pass sees it now (placements held and handed out earlier in the pass
    /// taken off).
    fn fit(&mut self, gang: &Gang, worker: &'w str, order: usize) -> Fit;

    /// Whether the gang would fit in `worker` were its nodes empty; the score there if so.
    fn fit_drained(&mut self, gang: &Gang, worker: &'w str) -> Option<i64>;

    /// Places the gang in `worker`, where [`Oracle::fit`] just found it fits: the pass's view
    /// of the worker loses the room, and the placement is returned node by node, to hold.
    /// `None` when the worker changed since.
    fn place(&mut self, gang: &Gang, worker: &'w str) -> Option<Vec<Take>>;

    /// The verdict of the class's last placement, if nothing it depended on changed since
    /// (asked only once its quota is covered).
    fn recall(&mut self, class: &ClassKey, now: &Circumstances) -> Option<Verdict>;

    /// Keeps the verdict of a placement: the gang fits none of the workers `asked` about (by
    /// position in the queue's list), nor any other usable one.
    fn remember(
        &mut self,
        class: &ClassKey,
        now: &Circumstances,
        verdict: &Verdict,
        asked: &[usize],
    );
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
        let state = self.view.state();
        let ledger = self.view.ledger();
        let table = &state.inventory.resources;
        let bound = gang.shape.bind(table);
        let cluster = self.view.cluster(worker, |base| {
            Arc::new(with_holds_taken_off(base, ledger.holds_in(worker)))
        })?;
        Some(fit_cluster(
            cluster,
            table,
            gang.shape,
            &bound,
            gang.pods,
            &self.config.engine,
            gang.strategy,
        ))
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

    fn fit_drained(&mut self, gang: &Gang, worker: &'w str) -> Option<i64> {
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

    fn recall(&mut self, _class: &ClassKey, _now: &Circumstances) -> Option<Verdict> {
        None
    }

    fn remember(&mut self, _: &ClassKey, _: &Circumstances, _: &Verdict, _: &[usize]) {}
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
