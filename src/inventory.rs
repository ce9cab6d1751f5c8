//! The clusters Switchyard places work on, node by node and NUMA zone by NUMA zone.
//!
//! One model serves the extender (one cluster: the one it runs in, or one virtual node per
//! worker) and the dispatcher (every worker). It loads from the inventory file format
//! (`--inventory FILE`) and, in a later step, from watches; readers take cheap consistent
//! snapshots from an [`InventoryStore`] while one writer replaces them.
//!
//! Amounts are dense vectors indexed by a [`ResourceId`] from the inventory's own
//! [`ResourceTable`], so a fit check is a few integer comparisons.

pub(crate) mod file;

pub(crate) use file::InventoryError;
pub use file::{load_file, parse, parse_yaml, Loaded};

use crate::topology::{NumaInfo, Policy, PolicyOptions};
use arc_swap::ArcSwap;
use foldhash::{HashMap, HashMapExt as _};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) type ResourceId = usize;

/// Resource names seen in an inventory, each with a dense id.
#[derive(Debug, Clone, Default)]
pub struct ResourceTable {
    names: Vec<String>,
    ids: HashMap<String, ResourceId>,
}

impl ResourceTable {
    pub fn intern(&mut self, name: &str) -> ResourceId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), self.names.len() - 1);
        self.names.len() - 1
    }
    pub fn id(&self, name: &str) -> Option<ResourceId> {
        self.ids.get(name).copied()
    }
    pub fn name(&self, id: ResourceId) -> &str {
        self.names.get(id).map_or("?", String::as_str)
    }
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

/// How the kubelet's Topology Manager is configured on a node, and its NUMA zones.
#[derive(Debug, Clone)]
pub struct NumaTopology {
    pub policy: Policy,
    pub scope: Scope,
    pub options: PolicyOptions,
    /// What does not change while pods come and go is shared between copies: a placement
    /// held or taken copies a node's topology, and only `available` differs.
    pub info: Arc<NumaInfo>,
    pub zones: Vec<NumaZone>,
    /// Resources the zones list: the ones the kubelet aligns on this node.
    pub managed: Arc<[bool]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Container,
    Pod,
}

#[derive(Debug, Clone)]
pub struct NumaZone {
    pub name: Arc<str>,
    /// The NUMA node id (from the zone name `node-N`, else its position).
    pub id: u32,
    pub allocatable: Arc<[i64]>,
    pub available: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) effect: String,
}

/// One label, `key=value`. The live inventory keeps one per distinct pair and cluster, shared
/// by every node that carries it: real nodes carry twenty to thirty labels, nearly all of them
/// the same on every node of a pool.
#[derive(PartialEq, Eq, Hash)]
pub struct Label {
    text: Box<str>,
    /// Where the key ends in `text` (a label key cannot contain '=').
    split: u32,
}

impl Label {
    pub(crate) fn new(key: &str, value: &str) -> Self {
        Self {
            text: format!("{key}={value}").into_boxed_str(),
            split: u32::try_from(key.len()).unwrap_or(u32::MAX),
        }
    }
    pub(crate) fn key(&self) -> &str {
        &self.text[..self.split as usize]
    }
    pub(crate) fn value(&self) -> &str {
        &self.text[self.split as usize + 1..]
    }
    /// `key=value`.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Debug for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A node's labels, sorted by key: one pointer per label (the labels themselves are shared),
/// and cheap to clone into every snapshot.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Labels(Arc<[Arc<Label>]>);

impl Labels {
    /// From labels in any order; of two with one key the last wins, as in a map.
    pub fn new(mut labels: Vec<Arc<Label>>) -> Self {
        labels.reverse();
        labels.sort_by(|a, b| a.key().cmp(b.key()));
        labels.dedup_by(|a, b| a.key() == b.key());
        Self(labels.into())
    }
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|l| l.key().cmp(key))
            .ok()
            .map(|i| self.0[i].value())
    }
    /// (key, value) in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|l| (l.key(), l.value()))
    }
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(
            map.iter()
                .map(|(k, v)| Arc::new(Label::new(k, v)))
                .collect(),
        )
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    /// Shared, with `taints` and `allocatable`, between a node's copies: the dispatcher copies
    /// a node for every placement held on it, and only `requested` differs between them.
    pub name: Arc<str>,
    /// Shared with the live state and between snapshots: a manager holds a hundred thousand
    /// nodes, and a copy per snapshot would double the memory they take.
    pub labels: Labels,
    pub taints: Arc<[Taint]>,
    /// Indexed by [`ResourceId`]; missing resources are 0.
    pub allocatable: Arc<[i64]>,
    pub requested: Vec<i64>,
    /// Shared like `labels`; change it with `Arc::make_mut`.
    pub numa: Option<Arc<NumaTopology>>,
}

impl Node {
    pub fn free(&self, r: ResourceId) -> i64 {
        self.allocatable
            .get(r)
            .copied()
            .unwrap_or(0)
            .saturating_sub(self.requested.get(r).copied().unwrap_or(0))
    }
}

/// Per-cluster bounds for O(1) rejection: no pod needing more than these fits anywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSummary {
    pub(crate) nodes: usize,
    pub(crate) numa_nodes: usize,
    pub(crate) allocatable: Vec<i64>,
    /// The largest free amount of each resource on one node.
    pub(crate) max_free_on_node: Vec<i64>,
    /// The largest allocatable amount of each resource on one node (preemption cannot beat it).
    pub(crate) max_allocatable_on_node: Vec<i64>,
    /// The largest available amount of each resource in one NUMA zone.
    pub(crate) max_free_in_zone: Vec<i64>,
    pub(crate) max_allocatable_in_zone: Vec<i64>,
    /// Every node is NUMA-aware with the single-numa-node policy, so the zone bounds above
    /// bound every aligned resource request.
    pub(crate) single_numa_everywhere: bool,
    /// Each node's free amount of every resource, node after node (`allocatable.len()`
    /// wide), in one block: a search skips the nodes without room for one pod without
    /// reading them. Never less than a node has free: taking from a node without
    /// summarizing again leaves it an upper bound, which only skips fewer nodes.
    pub(crate) node_free: Arc<Vec<i64>>,
    /// A digest of what the nodes can hold when empty: their number and the allocatable
    /// totals and maxima above. Found when the cluster is summarized (free amounts do not
    /// enter it), so that comparing it costs nothing.
    pub(crate) capacity_fingerprint: u64,
}

impl ClusterSummary {
    /// The rows of [`ClusterSummary::node_free`], node after node, each as wide as
    /// `allocatable`, if the summary is one of a cluster with `nodes` nodes and counts any
    /// resource.
    pub(crate) fn free_rows(&self, nodes: usize) -> Option<std::slice::ChunksExact<'_, i64>> {
        let width = self.allocatable.len();
        (width > 0 && self.nodes == nodes && self.node_free.len() == nodes * width)
            .then(|| self.node_free.chunks_exact(width))
    }
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Shared between copies of the cluster: a copy that changes one node copies only it.
    pub nodes: Vec<Arc<Node>>,
    /// Shared between a cluster's copies (a held view keeps the inventory's summary: an upper
    /// bound of what is free); change it with `Arc::make_mut`.
    pub summary: Arc<ClusterSummary>,
    /// Why nothing may be placed here now (a stale or lost worker), if so.
    pub unavailable: Option<String>,
}

impl Cluster {
    pub(crate) fn summarize(&mut self, resources: usize) {
        let mut s = ClusterSummary {
            nodes: self.nodes.len(),
            allocatable: vec![0; resources],
            max_free_on_node: vec![0; resources],
            max_allocatable_on_node: vec![0; resources],
            max_free_in_zone: vec![0; resources],
            max_allocatable_in_zone: vec![0; resources],
            ..Default::default()
        };
        s.single_numa_everywhere = !self.nodes.is_empty()
            && self.nodes.iter().all(|n| {
                n.numa
                    .as_ref()
                    .is_some_and(|t| t.policy == Policy::SingleNumaNode)
            });
        let mut node_free = Vec::with_capacity(self.nodes.len() * resources);
        for node in &self.nodes {
            node_free.extend((0..resources).map(|r| node.free(r)));
            for r in 0..resources {
                let alloc = node.allocatable.get(r).copied().unwrap_or(0);
                // Remote amounts: a sum that does not fit saturates rather than wraps.
                s.allocatable[r] = s.allocatable[r].saturating_add(alloc);
                s.max_free_on_node[r] = s.max_free_on_node[r].max(node.free(r));
                s.max_allocatable_on_node[r] = s.max_allocatable_on_node[r].max(alloc);
            }
            if let Some(numa) = &node.numa {
                s.numa_nodes += 1;
                for zone in &numa.zones {
                    for r in 0..resources {
                        let a = zone.available.get(r).copied().unwrap_or(0);
                        let c = zone.allocatable.get(r).copied().unwrap_or(0);
                        s.max_free_in_zone[r] = s.max_free_in_zone[r].max(a);
                        s.max_allocatable_in_zone[r] = s.max_allocatable_in_zone[r].max(c);
                    }
                }
            }
        }
        s.node_free = Arc::new(node_free);
        s.capacity_fingerprint = {
            use std::hash::BuildHasher as _;
            foldhash::fast::FixedState::default().hash_one((
                s.nodes,
                &s.allocatable,
                &s.max_allocatable_on_node,
                &s.max_allocatable_in_zone,
            ))
        };
        self.summary = Arc::new(s);
    }
}

/// Each node's free amount of every resource, and the most any one of its NUMA zones has
/// available, in flat rows, with the column maxima kept as rows change: a cluster whose nodes
/// change a few at a time (pods bound and finished) gets the free maxima of its summary
/// re-reading only the nodes that changed, and a whole column only when the node that held
/// its maximum lost some.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeRows {
    width: usize,
    node: Vec<i64>,
    zone: Vec<i64>,
    node_max: Columns,
    zone_max: Columns,
}

/// The maximum of each column of a row block, and which are stale (their maximum went down).
#[derive(Debug, Clone, Default)]
struct Columns {
    max: Vec<i64>,
    stale: Vec<bool>,
}

impl Columns {
    fn new(width: usize) -> Self {
        Self {
            max: vec![0; width],
            stale: vec![true; width],
        }
    }

    /// Column `r` of some row went from `old` to `new`.
    fn changed(&mut self, r: usize, old: i64, new: i64) {
        // A stale column is read again whole anyway.
        if self.stale[r] {
            return;
        }
        if new >= self.max[r] {
            self.max[r] = new;
        } else if old == self.max[r] {
            self.stale[r] = true;
        }
    }

    /// The maxima, reading again the stale columns of `rows`.
    fn fresh(&mut self, rows: &[i64]) -> &[i64] {
        let width = self.max.len();
        for r in 0..width {
            if std::mem::take(&mut self.stale[r]) {
                self.max[r] = rows
                    .iter()
                    .skip(r)
                    .step_by(width.max(1))
                    .copied()
                    .fold(0, i64::max);
            }
        }
        &self.max
    }
}

impl FreeRows {
    /// Rows for every node of `cluster`, `resources` wide.
    pub(crate) fn new(cluster: &Cluster, resources: usize) -> Self {
        let mut rows = Self {
            width: resources,
            node: vec![0; cluster.nodes.len() * resources],
            zone: vec![0; cluster.nodes.len() * resources],
            node_max: Columns::new(resources),
            zone_max: Columns::new(resources),
        };
        for i in 0..cluster.nodes.len() {
            rows.update(cluster, i);
        }
        rows
    }

    /// Re-reads node `i` of `cluster` (the cluster the rows were made for, with the same
    /// nodes in the same order). An index past the rows is ignored.
    pub(crate) fn update(&mut self, cluster: &Cluster, i: usize) {
        let width = self.width.max(1);
        let (Some(node), Some(free), Some(zone)) = (
            cluster.nodes.get(i),
            self.node.chunks_exact_mut(width).nth(i),
            self.zone.chunks_exact_mut(width).nth(i),
        ) else {
            return;
        };
        for (r, v) in free.iter_mut().enumerate() {
            let new = node.free(r);
            self.node_max.changed(r, *v, new);
            *v = new;
        }
        for (r, v) in zone.iter_mut().enumerate() {
            let new = node.numa.as_ref().map_or(0, |numa| {
                numa.zones
                    .iter()
                    .map(|z| z.available.get(r).copied().unwrap_or(0))
                    .fold(0, i64::max)
            });
            self.zone_max.changed(r, *v, new);
            *v = new;
        }
    }

    /// Sets the summary's free maxima from the rows; what does not depend on free amounts
    /// (totals, allocatable maxima, NUMA counts) is left as it is.
    pub(crate) fn apply(&mut self, summary: &mut ClusterSummary) {
        let set = |out: &mut Vec<i64>, max: &[i64]| {
            out.clear();
            out.extend_from_slice(max);
        };
        set(
            &mut summary.max_free_on_node,
            self.node_max.fresh(&self.node),
        );
        set(
            &mut summary.max_free_in_zone,
            self.zone_max.fresh(&self.zone),
        );
        match Arc::get_mut(&mut summary.node_free) {
            Some(rows) => rows.clone_from(&self.node),
            None => summary.node_free = Arc::new(self.node.clone()),
        }
    }
}

/// A consistent picture of every cluster at one moment.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub resources: ResourceTable,
    /// Shared between snapshots: publishing a change to one cluster copies only that one.
    pub clusters: Vec<Arc<Cluster>>,
    /// Node name to (cluster index, node index).
    node_index: HashMap<Arc<str>, (usize, usize)>,
    /// Cluster name to cluster index.
    cluster_index: HashMap<String, usize>,
}

impl Inventory {
    /// Builds the indexes and summaries; call after changing clusters or nodes.
    pub fn finish(mut self) -> Self {
        let n = self.resources.len();
        self.node_index.clear();
        self.cluster_index.clear();
        for (ci, cluster) in self.clusters.iter_mut().enumerate() {
            let cluster = Arc::make_mut(cluster);
            for node in &mut cluster.nodes {
                let node = Arc::make_mut(node);
                if node.allocatable.len() != n {
                    node.allocatable = resized(&node.allocatable, n);
                }
                node.requested.resize(n, 0);
                if let Some(numa) = &mut node.numa {
                    let numa = Arc::make_mut(numa);
                    if numa.managed.len() != n {
                        numa.managed = resized(&numa.managed, n);
                    }
                    for z in &mut numa.zones {
                        if z.allocatable.len() != n {
                            z.allocatable = resized(&z.allocatable, n);
                        }
                        z.available.resize(n, 0);
                    }
                }
            }
            cluster.summarize(n);
            self.cluster_index.entry(cluster.name.clone()).or_insert(ci);
            for (ni, node) in cluster.nodes.iter().enumerate() {
                self.node_index.entry(node.name.clone()).or_insert((ci, ni));
            }
        }
        self
    }

    /// An inventory from clusters that are already summarised (the live inventory publishes
    /// this way: clusters that did not change are shared with the previous snapshot).
    pub(crate) fn from_shared(resources: ResourceTable, clusters: Vec<Arc<Cluster>>) -> Self {
        let mut node_index = HashMap::new();
        let mut cluster_index = HashMap::new();
        for (ci, cluster) in clusters.iter().enumerate() {
            cluster_index.entry(cluster.name.clone()).or_insert(ci);
            for (ni, node) in cluster.nodes.iter().enumerate() {
                node_index.entry(node.name.clone()).or_insert((ci, ni));
            }
        }
        Self {
            resources,
            clusters,
            node_index,
            cluster_index,
        }
    }

    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.cluster_arc(name).map(Arc::as_ref)
    }

    /// The cluster as shared between snapshots. A snapshot that changes a cluster gets a new
    /// allocation for it (`Arc::make_mut` clones a shared cluster, and moves one that
    /// someone keeps a `Weak` to), so a `Weak` kept to it tells whether it is still the same.
    pub(crate) fn cluster_arc(&self, name: &str) -> Option<&Arc<Cluster>> {
        // The index is built by `finish` / `from_shared`; a cluster list changed since
        // without them is still answered right, by a scan.
        let indexed = self
            .cluster_index
            .get(name)
            .and_then(|&i| self.clusters.get(i))
            .filter(|c| c.name == name);
        match indexed {
            Some(c) => Some(c),
            None if self.cluster_index.len() == self.clusters.len() => None,
            None => self.clusters.iter().find(|c| c.name == name),
        }
    }

    pub fn node(&self, name: &str) -> Option<(&Cluster, &Node)> {
        let (ci, ni) = *self.node_index.get(name)?;
        let cluster = self.clusters.get(ci)?;
        Some((cluster, cluster.nodes.get(ni)?))
    }
}

/// Many readers, one writer: readers get an `Arc` snapshot that never changes under them.
#[derive(Debug, Default)]
pub struct InventoryStore {
    current: ArcSwap<Inventory>,
}

impl InventoryStore {
    pub fn new(inventory: Inventory) -> Self {
        Self {
            current: ArcSwap::from_pointee(inventory),
        }
    }
    pub fn snapshot(&self) -> Arc<Inventory> {
        self.current.load_full()
    }
    pub(crate) fn replace(&self, inventory: Inventory) {
        self.current.store(Arc::new(inventory));
    }
}

/// `values` with `n` entries: cut, or padded with the default.
fn resized<T: Copy + Default>(values: &[T], n: usize) -> Arc<[T]> {
    let mut v = values.to_vec();
    v.resize(n, T::default());
    v.into()
}
