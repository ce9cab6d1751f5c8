//! In-flight accounting: a placement handed out (an extender bind, a dispatcher decision) is
//! subtracted from the inventory until the cluster's own data shows it, so two quick
//! decisions never double-book the same space. Entries expire after a configurable time;
//! time is a parameter, never read here.

use super::fit::NodeState;
use crate::inventory::{Cluster, Node, ResourceId, ResourceTable};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What a placement takes from one node: node-level amounts and amounts per NUMA zone.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Take {
    pub(crate) node: Arc<str>,
    /// Where the node was in its cluster's list when the take was made: looked at first.
    pub(crate) index: usize,
    /// Node-level amounts by resource id. Ids come from the inventory's resource table,
    /// which only ever grows, so they stay valid in later snapshots.
    pub(crate) amounts: Vec<(ResourceId, i64)>,
    /// Per NUMA zone (by zone index): amounts by resource id.
    pub(crate) zone_amounts: Vec<(usize, ResourceId, i64)>,
}

impl Take {
    /// The difference between a node's state before and after a simulated placement.
    pub(crate) fn between(node: &Node, before: &NodeState, after: &NodeState) -> Self {
        let amounts = before
            .free
            .iter()
            .zip(&after.free)
            .enumerate()
            .filter(|(_, (b, a))| b != a)
            .map(|(r, (b, a))| (r, b - a))
            .collect();
        let mut zone_amounts = Vec::new();
        for (zi, (b, a)) in before.zones.iter().zip(&after.zones).enumerate() {
            for (r, (bv, av)) in b.iter().zip(a).enumerate() {
                if bv != av {
                    zone_amounts.push((zi, r, bv - av));
                }
            }
        }
        Self {
            node: node.name.clone(),
            index: 0,
            amounts,
            zone_amounts,
        }
    }

    /// The same take, noting the node's index in its cluster.
    pub(crate) fn at(mut self, index: usize) -> Self {
        self.index = index;
        self
    }

    /// Subtracts the take from `node` (which must be the node it was taken from).
    pub(crate) fn apply_to(&self, node: &mut Node) {
        self.add(node, 1);
    }

    /// Gives the take back to `node`.
    pub(crate) fn release_from(&self, node: &mut Node) {
        self.add(node, -1);
    }

    fn add(&self, node: &mut Node, sign: i64) {
        for &(id, amount) in &self.amounts {
            if let Some(v) = node.requested.get_mut(id) {
                // A remote node's sum may already be saturated.
                *v = v.saturating_add(sign * amount);
            }
        }
        if let Some(numa) = node.numa.as_mut().filter(|_| !self.zone_amounts.is_empty()) {
            // Topologies are shared between node copies; this one gets its own.
            let numa = std::sync::Arc::make_mut(numa);
            for &(zi, id, amount) in &self.zone_amounts {
                if let Some(z) = numa.zones.get_mut(zi) {
                    if let Some(v) = z.available.get_mut(id) {
                        *v = v.saturating_sub(sign * amount);
                    }
                }
            }
        }
    }
}

/// What one placement took from one node, held until it expires.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    /// The pod or job the placement was for; releasing it drops its reservations.
    pub(crate) owner: String,
    pub(crate) take: Take,
    pub(crate) expires_at: Instant,
}

impl Reservation {
    /// The difference between a node's state before and after a simulated placement.
    pub(crate) fn between(
        owner: &str,
        node: &Node,
        before: &NodeState,
        after: &NodeState,
        expires_at: Instant,
    ) -> Self {
        Self {
            owner: owner.to_string(),
            take: Take::between(node, before, after),
            expires_at,
        }
    }
}

/// Reservations by node name (each expires at its own time).
#[derive(Debug, Default, Clone)]
pub struct InFlight {
    by_node: HashMap<Arc<str>, Vec<Reservation>>,
}

impl InFlight {
    pub(crate) fn reserve(&mut self, r: Reservation) {
        self.by_node.entry(r.take.node.clone()).or_default().push(r);
    }

    /// Drops everything held for `owner` (its placement now shows in the cluster's data, or
    /// it was abandoned).
    pub(crate) fn release(&mut self, owner: &str) {
        self.by_node.retain(|_, v| {
            v.retain(|r| r.owner != owner);
            !v.is_empty()
        });
    }

    pub(crate) fn expire(&mut self, now: Instant) {
        self.by_node.retain(|_, v| {
            v.retain(|r| r.expires_at > now);
            !v.is_empty()
        });
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// `node` with its live reservations subtracted.
    pub fn node<'a>(&self, node: &'a Node, now: Instant) -> Cow<'a, Node> {
        let Some(held) = self.by_node.get(&node.name) else {
            return Cow::Borrowed(node);
        };
        let mut n = node.clone();
        for r in held.iter().filter(|r| r.expires_at > now) {
            r.take.apply_to(&mut n);
        }
        Cow::Owned(n)
    }

    /// `cluster` with its live reservations subtracted (borrowed when it has none).
    pub fn cluster<'a>(
        &self,
        cluster: &'a Cluster,
        table: &ResourceTable,
        now: Instant,
    ) -> Cow<'a, Cluster> {
        if !cluster
            .nodes
            .iter()
            .any(|n| self.by_node.contains_key(&n.name))
        {
            return Cow::Borrowed(cluster);
        }
        let mut c = cluster.clone();
        for n in &mut c.nodes {
            if let Cow::Owned(adjusted) = self.node(n, now) {
                *n = std::sync::Arc::new(adjusted);
            }
        }
        c.summarize(table.len());
        Cow::Owned(c)
    }
}
