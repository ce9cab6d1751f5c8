//! Scores 0–10 for a placement (kube-scheduler multiplies by the extender's weight × 10 and
//! does not clamp, so the range is kept exactly).

use super::fit::NodeState;
use super::pod::BoundPod;
use crate::inventory::Node;
use crate::topology::NumaMask;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum Strategy {
    /// Prefer the emptiest nodes (spread).
    LeastAllocated,
    /// Prefer the fullest nodes (bin-pack, keep big holes for big jobs).
    MostAllocated,
    /// Prefer nodes whose resources stay used in equal proportions.
    BalancedAllocation,
    /// Prefer placements over the fewest NUMA zones.
    #[serde(rename = "LeastNUMANodes")]
    LeastNumaNodes,
}

impl Strategy {
    /// The name the API and the `switchyard.dev/placement-strategy` annotation use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeastAllocated => "LeastAllocated",
            Self::MostAllocated => "MostAllocated",
            Self::BalancedAllocation => "BalancedAllocation",
            Self::LeastNumaNodes => "LeastNUMANodes",
        }
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "LeastAllocated" => Ok(Self::LeastAllocated),
            "MostAllocated" => Ok(Self::MostAllocated),
            "BalancedAllocation" => Ok(Self::BalancedAllocation),
            "LeastNUMANodes" => Ok(Self::LeastNumaNodes),
            other => Err(format!(
                "unknown placement strategy {other:?} (LeastAllocated, MostAllocated, BalancedAllocation, LeastNUMANodes)"
            )),
        }
    }
}

/// The resources a score looks at: cpu and memory, as the default scheduler does, plus any
/// other resource the pod asks for (a GPU job should be steered by GPUs).
pub(crate) fn scored_resources(pod: &BoundPod) -> Vec<usize> {
    let mut out = vec![0, 1];
    for (rid, name, _) in &pod.node_request {
        if let Some(r) = rid {
            if name != "cpu" && name != "memory" && name != "pods" && !out.contains(r) {
                out.push(*r);
            }
        }
    }
    out
}

/// The score of `node` once the placed pods are taken (`after`), over `resources`.
pub(crate) fn node_score(
    strategy: Strategy,
    node: &Node,
    after: &NodeState,
    resources: &[usize],
    zones_used: NumaMask,
) -> i64 {
    // Walked again rather than collected: the same values, summed in the same order.
    let used_fractions = || {
        resources.iter().filter_map(|&r| {
            let alloc = *node.allocatable.get(r)?;
            (alloc > 0).then(|| {
                let free = after.free.get(r).copied().unwrap_or(0).max(0);
                ((alloc - free) as f64 / alloc as f64).clamp(0.0, 1.0)
            })
        })
    };
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let (sum, n) = v.fold((0.0f64, 0usize), |(s, n), f| (s + f, n + 1));
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    };
    let score = match strategy {
        Strategy::LeastAllocated => 10.0 * (1.0 - mean(&mut used_fractions())),
        Strategy::MostAllocated => 10.0 * mean(&mut used_fractions()),
        Strategy::BalancedAllocation => {
            let m = mean(&mut used_fractions());
            let var = mean(&mut used_fractions().map(|f| (f - m) * (f - m)));
            10.0 * (1.0 - var.sqrt())
        }
        Strategy::LeastNumaNodes => match &node.numa {
            None => 0.0,
            Some(numa) => {
                let zones = numa.zones.len().max(1) as f64;
                let used = zones_used.count().max(1) as f64;
                // Fewer zones first; among equal counts, closer zones (lower average
                // distance) score a little higher.
                let base = 10.0 * (zones - used + 1.0) / zones;
                let penalty = numa
                    .info
                    .average_distance(zones_used)
                    .filter(|_| used > 1.0)
                    .map_or(0.0, |d| ((d - 10.0) / 100.0).clamp(0.0, 0.9));
                base - penalty
            }
        },
    };
    score.round().clamp(0.0, 10.0) as i64
}
