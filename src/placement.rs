//! The placement engine: does this pod, or this gang of N identical pods, fit NUMA-aligned on
//! this node or in this cluster, and how well. Pure: an inventory snapshot and a pod in, a
//! verdict out. The extender serves it; the dispatcher calls it in-process.

pub(crate) mod apart;
pub(crate) mod fit;
pub mod inflight;
pub(crate) mod parallel;
pub mod pod;
pub mod score;
#[cfg(test)]
mod tests;

pub use fit::ClusterFit;
pub use fit::{fit_cluster, fit_clusters, Refusal};
pub(crate) use fit::{
    fit_node, node_accepts, shape_for_cluster_nodes, Misfit, NodeFit, NodeJudge, NodeState,
};
pub use pod::{BoundPod, PodSpecView};
pub use pod::{PodShape, PodView};
pub use score::Strategy;

/// Annotation a pod uses to pick a scoring strategy.
pub(crate) const STRATEGY_ANNOTATION: &str = "switchyard.dev/placement-strategy";
/// Annotation giving the number of identical pods that must fit at once.
pub(crate) const GANG_SIZE_ANNOTATION: &str = "switchyard.dev/gang-size";
/// The largest gang [`GANG_SIZE_ANNOTATION`] may name.
pub(crate) const MAX_GANG_SIZE: usize = 100_000;

/// What to do with a node that publishes no NUMA data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NumaUnknown {
    /// Judge it on node-level resources only (and say so).
    #[default]
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    pub numa_unknown: NumaUnknown,
    pub strategy: Strategy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            numa_unknown: NumaUnknown::Allow,
            strategy: Strategy::LeastAllocated,
        }
    }
}

impl PodShape {
    /// The shape with its anti-affinity judged as `apart` says (for a template judged with
    /// the labels its workload's controller will give its pods).
    pub(crate) fn kept_apart(mut self, apart: apart::Apart) -> Self {
        self.one_per_node = apart.one_per_node;
        self.spread = apart.spread;
        self.together = apart.together;
        self.unmodelled_terms = apart.unmodelled;
        self
    }

    /// Whether where one of the gang's pods may go depends on where the others are: they keep
    /// one to a node, spread over nodes or keep together ([`apart`]).
    pub(crate) fn placed_by_peers(&self) -> bool {
        self.one_per_node || self.spread.is_some() || !self.together.is_empty()
    }

    /// The strategy the pod asks for, or the configured default.
    pub fn strategy(&self, default: Strategy) -> Strategy {
        self.annotations
            .get(STRATEGY_ANNOTATION)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    }

    /// The gang size from the pod's annotation (default 1).
    pub(crate) fn gang_size(&self) -> Result<usize, String> {
        match self.annotations.get(GANG_SIZE_ANNOTATION) {
            None => Ok(1),
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_GANG_SIZE).contains(&n) => Ok(n),
                _ => Err(format!(
                    "annotation {GANG_SIZE_ANNOTATION}={v:?} is not a pod count between 1 and {MAX_GANG_SIZE}"
                )),
            },
        }
    }
}
