//! In-flight accounting: a placement handed out (an extender bind, a dispatcher decision) is
//! subtracted from the inventory until the cluster's own data shows it, so two quick
//! decisions never double-book the same space. Entries expire after a configurable time;
//! time is a parameter, never read here.

use super::fit::NodeState;
use crate::inventory::{Cluster, Node, ResourceTable};
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What one placement took from one node.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The pod or job the placement was for; releasing it drops its reservations.
    pub owner: String,
    pub node: String,
    /// Node-level amounts by resource name.
    pub amounts: Vec<(String, i64)>,
    /// Per NUMA zone (by zone index): amounts by resource name.
    pub zone_amounts: Vec<(usize, String, i64)>,
    pub expires_at: Instant,
}

impl Reservation {
    /// The difference between a node's state before and after a simulated placement.
    pub fn between(
        owner: &str,
        node: &Node,
        table: &ResourceTable,
        before: &NodeState,
        after: &NodeState,
        expires_at: Instant,
    ) -> Self {
        let amounts = before
            .free
            .iter()
            .zip(&after.free)
            .enumerate()
            .filter(|(_, (b, a))| b != a)
            .map(|(r, (b, a))| (table.name(r).to_string(), b - a))
            .collect();
        let mut zone_amounts = Vec::new();
        for (zi, (b, a)) in before.zones.iter().zip(&after.zones).enumerate() {
            for (r, (bv, av)) in b.iter().zip(a).enumerate() {
                if bv != av {
                    zone_amounts.push((zi, table.name(r).to_string(), bv - av));
                }
            }
        }
        Self {
            owner: owner.to_string(),
            node: node.name.clone(),
            amounts,
            zone_amounts,
            expires_at,
        }
    }
}

/// Reservations by node name.
#[derive(Debug, Default)]
pub struct InFlight {
    by_node: HashMap<String, Vec<Reservation>>,
    pub ttl: Duration,
}

impl InFlight {
    pub fn new(ttl: Duration) -> Self {
        Self {
            by_node: HashMap::new(),
            ttl,
        }
    }

    pub fn reserve(&mut self, r: Reservation) {
        self.by_node.entry(r.node.clone()).or_default().push(r);
    }

    /// Drops everything held for `owner` (its placement now shows in the cluster's data, or
    /// it was abandoned).
    pub fn release(&mut self, owner: &str) {
        self.by_node.retain(|_, v| {
            v.retain(|r| r.owner != owner);
            !v.is_empty()
        });
    }

    pub fn expire(&mut self, now: Instant) {
        self.by_node.retain(|_, v| {
            v.retain(|r| r.expires_at > now);
            !v.is_empty()
        });
    }

    pub fn len(&self) -> usize {
        self.by_node.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// `node` with its live reservations subtracted.
    pub fn node<'a>(&self, node: &'a Node, table: &ResourceTable, now: Instant) -> Cow<'a, Node> {
        let Some(held) = self.by_node.get(&node.name) else {
            return Cow::Borrowed(node);
        };
        let mut n = node.clone();
        for r in held.iter().filter(|r| r.expires_at > now) {
            for (name, amount) in &r.amounts {
                if let Some(id) = table.id(name) {
                    if let Some(v) = n.requested.get_mut(id) {
                        *v += amount;
                    }
                }
            }
            if let Some(numa) = n.numa.as_mut().filter(|_| !r.zone_amounts.is_empty()) {
                // The node is a copy for this decision; its topology becomes one too.
                let numa = std::sync::Arc::make_mut(numa);
                for (zi, name, amount) in &r.zone_amounts {
                    if let (Some(id), Some(z)) = (table.id(name), numa.zones.get_mut(*zi)) {
                        if let Some(v) = z.available.get_mut(id) {
                            *v -= amount;
                        }
                    }
                }
            }
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
            if let Cow::Owned(adjusted) = self.node(n, table, now) {
                *n = adjusted;
            }
        }
        c.summarize(table.len());
        Cow::Owned(c)
    }
}
