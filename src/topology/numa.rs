//! The machine's NUMA nodes and the distances between them.

use std::collections::BTreeMap;

use super::NumaMask;

/// NUMA node ids of the machine and, optionally, its distance table.
///
/// `distances[&i][j]` is the distance from node `i` to node `j`: rows are
/// keyed by node id and indexed by node id, as cAdvisor reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaInfo {
    pub(crate) nodes: Vec<u32>,
    pub(crate) distances: BTreeMap<u32, Vec<u64>>,
}

impl NumaInfo {
    /// Nodes without distances (enough unless `prefer-closest-numa-nodes` is set).
    pub fn new(nodes: Vec<u32>) -> Self {
        Self {
            nodes,
            distances: BTreeMap::new(),
        }
    }

    pub fn with_distances(nodes: Vec<u32>, distances: BTreeMap<u32, Vec<u64>>) -> Self {
        Self { nodes, distances }
    }

    /// The mask of every node: the affinity of a hint without one.
    /// Ids past 63 are left out ([`super::validate`] refuses them).
    pub(crate) fn default_mask(&self) -> NumaMask {
        NumaMask(
            self.nodes
                .iter()
                .filter(|&&id| id <= NumaMask::MAX_ID)
                .fold(0u64, |acc, &id| acc | (1u64 << id)),
        )
    }

    /// Mean distance over every ordered pair of the mask's nodes, the diagonal
    /// included; 0 for an empty mask. `None` when a distance is missing.
    ///
    /// The sum is accumulated in `f64` in ascending (row, column) order and then
    /// divided, so equal-looking averages compare exactly as they do in the
    /// kubelet, rounding included.
    #[allow(clippy::cast_precision_loss)] // the kubelet converts to float64 alike
    pub(crate) fn average_distance(&self, mask: NumaMask) -> Option<f64> {
        if mask.is_empty() {
            return Some(0.0);
        }
        let mut sum = 0.0f64;
        let mut pairs = 0.0f64;
        for from in mask.ids() {
            let row = self.distances.get(&from)?;
            for to in mask.ids() {
                sum += *row.get(to as usize)? as f64;
                pairs += 1.0;
            }
        }
        Some(sum / pairs)
    }
}
