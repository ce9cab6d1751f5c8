//! NUMA topology hint merging, as the kubelet's Topology Manager does it.
//!
//! Hint providers (CPU, memory, device managers) each say, per resource,
//! which sets of NUMA nodes an allocation could use ([`TopologyHint`]s). The
//! policy merges them into one hint and decides whether to admit the pod:
//!
//! * [`Policy::None`]: no merge; always admits, with no affinity.
//! * [`Policy::BestEffort`]: best merged hint; always admits.
//! * [`Policy::Restricted`]: same hint; admits only a preferred one.
//! * [`Policy::SingleNumaNode`]: merges only preferred hints with one node or
//!   none; admits only a preferred result, and reports an all-nodes result
//!   as "no affinity".
//!
//! [`merge()`] gives the kubelet's answer without walking the cross product of
//! all resources' hints (see the [`mod@merge`] module for how), and
//! [`validate`] gives its start-up checks. [`conformance`] reads and writes
//! the JSON case format of the shared conformance vectors.

mod bitmask;
pub mod conformance;
pub mod merge;
mod numa;
mod policy;

#[cfg(test)]
mod tests;

pub use bitmask::{Ids, NumaMask};
pub use merge::{merge, ProviderHints};
pub(crate) use merge::{merge_resources, MergeResult};
pub use numa::NumaInfo;
pub use policy::{validate, Policy, PolicyOptions};
pub(crate) use policy::{ConfigError, MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES};

/// A possible placement of one resource: the NUMA nodes it would use, and
/// whether that placement is as narrow as the resource allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopologyHint {
    /// `None`: no NUMA preference (stands for every node when merging).
    pub affinity: Option<NumaMask>,
    pub preferred: bool,
}
