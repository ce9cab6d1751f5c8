//! A worker's live state from its watches (Nodes, the Pods that hold node resources,
//! NodeResourceTopology objects), kept incrementally: an event changes one node's record, and
//! the inventory's view of the cluster is rebuilt from the records. Pure: no client here.

use crate::inventory::file::{build_topology, TopologySpec};
use crate::inventory::{
    Cluster, InventoryError, Label, Labels, Node, NumaTopology, ResourceTable, Taint,
};
use crate::placement::pod::{effective_request, ContainerKind, ContainerRequest};
use crate::quantity;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// What the inventory needs of a Node, compactly: a hundred workers of a thousand nodes
/// each are kept in memory at once.
#[derive(Debug, Clone, PartialEq)]
struct NodeRecord {
    /// Shared with every published snapshot of the node; each label shared by the cluster's
    /// nodes that carry it.
    labels: Labels,
    taints: Arc<[Taint]>,
    /// By the cluster's interned resource ids.
    allocatable: Box<[(u16, i64)]>,
}

/// A pod's key: a 64-bit hash of its UID. Two pods of one cluster colliding is about as
/// likely as a cosmic ray (30,000 pods: about 1 in 10^10), and would only misplace one pod's
/// requests until the next relist.
fn pod_key(uid: &str) -> u64 {
    // FNV-1a: stable across processes and versions, and enough for UUIDs.
    uid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the inventory needs of a Pod that holds resources: where it is and what it holds,
/// as two small ids. A worker runs tens of thousands of pods and a manager watches a hundred
/// workers: pods with the same requests share one interned shape, and node names are
/// interned too. 16 bytes, kept in one sorted vector per cluster (a hash map would take
/// three times that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PodRecord {
    key: u64,
    node: u32,
    shape: u32,
}

/// A label in the interner's set, found by its `key=value` text without building an `Arc`.
#[derive(Debug, Clone)]
struct InternedLabel(Arc<Label>);

impl std::borrow::Borrow<str> for InternedLabel {
    fn borrow(&self) -> &str {
        self.0.text()
    }
}
impl std::hash::Hash for InternedLabel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.text().hash(state)
    }
}
impl PartialEq for InternedLabel {
    fn eq(&self, other: &Self) -> bool {
        self.0.text() == other.0.text()
    }
}
impl Eq for InternedLabel {}

/// Interned strings and request shapes for one cluster.
#[derive(Debug, Clone, Default)]
struct Interner {
    node_ids: HashMap<Arc<str>, u32>,
    node_names: Vec<Arc<str>>,
    resource_ids: HashMap<Box<str>, u16>,
    resource_names: Vec<Box<str>>,
    shape_ids: HashMap<Box<[(u16, i64)]>, u32>,
    shapes: Vec<Box<[(u16, i64)]>>,
    /// Every resource id is taken (and that was logged).
    resources_full: bool,
    /// Every distinct label of the cluster's nodes.
    labels: HashSet<InternedLabel>,
    /// Node deletions since labels nobody carries any more were last dropped.
    deleted_since_prune: usize,
}

impl Interner {
    fn node(&mut self, name: &str) -> u32 {
        if let Some(id) = self.node_ids.get(name) {
            return *id;
        }
        let id = self.node_names.len() as u32;
        let name: Arc<str> = name.into();
        self.node_names.push(name.clone());
        self.node_ids.insert(name, id);
        id
    }

    /// The id of a resource name; `None` once every id is taken (a worker that publishes
    /// tens of thousands of resource names): those resources are left out, and said so once.
    fn resource(&mut self, name: &str) -> Option<u16> {
        if let Some(id) = self.resource_ids.get(name) {
            return Some(*id);
        }
        let Ok(id) = u16::try_from(self.resource_names.len()) else {
            if !self.resources_full {
                self.resources_full = true;
                tracing::warn!(
                    resource = name,
                    limit = usize::from(u16::MAX) + 1,
                    "a worker names more resources than can be tracked; the others are ignored"
                );
            }
            return None;
        };
        self.resource_names.push(name.into());
        self.resource_ids.insert(name.into(), id);
        Some(id)
    }

    fn labels(&mut self, labels: Option<&BTreeMap<String, String>>) -> Labels {
        let mut text = String::new();
        let interned = labels
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                text.clear();
                text.push_str(k);
                text.push('=');
                text.push_str(v);
                if let Some(l) = self.labels.get(text.as_str()) {
                    return l.0.clone();
                }
                let l = Arc::new(Label::new(k, v));
                self.labels.insert(InternedLabel(l.clone()));
                l
            })
            .collect();
        Labels::new(interned)
    }

    /// Forgets labels no node (and no snapshot) carries any more: hostnames of nodes gone.
    fn prune_labels(&mut self) {
        self.deleted_since_prune = 0;
        self.labels.retain(|l| Arc::strong_count(&l.0) > 1);
    }

    fn amounts(&mut self, amounts: impl IntoIterator<Item = (String, i64)>) -> Box<[(u16, i64)]> {
        let mut v: Vec<(u16, i64)> = amounts
            .into_iter()
            .filter_map(|(k, q)| Some((self.resource(&k)?, q)))
            .collect();
        v.sort_unstable();
        v.into()
    }

    fn shape(&mut self, requests: Vec<(String, i64)>) -> u32 {
        let shape = self.amounts(requests);
        if let Some(id) = self.shape_ids.get(&shape) {
            return *id;
        }
        let id = self.shapes.len() as u32;
        self.shapes.push(shape.clone());
        self.shape_ids.insert(shape, id);
        id
    }
}

/// A NodeResourceTopology as placement reads it, or why it could not be read.
type ParsedTopology = Result<Arc<NumaTopology>, String>;

#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterState {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    interner: Interner,
    /// By interned node id: the Node, while it exists.
    nodes: Vec<Option<NodeRecord>>,
    /// Sorted by key.
    pods: Vec<PodRecord>,
    /// Parsed at arrival (the published JSON is ten times larger), or why it could not be;
    /// by interned node id. Shared with every published snapshot of the node.
    topologies: HashMap<u32, ParsedTopology>,
    /// Sum of the pods' requests per interned node, by interned resource, kept as pods come
    /// and go. Wide, so that adding and taking away remote amounts stays exact however large
    /// they are; clamped to i64 when published.
    requested: Vec<Vec<i128>>,
    /// Pods collected during a relist, applied when it completes.
    relist: Option<Vec<PodRecord>>,
    /// Nodes collected (already compact) during a relist, by interned id.
    node_relist: Option<Vec<(u32, NodeRecord)>>,
    /// NodeResourceTopology objects collected (already parsed) during a relist.
    topology_relist: Option<Vec<(u32, ParsedTopology)>>,
}

fn parse_amounts(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, i64> {
    map.into_iter()
        .flatten()
        .filter_map(|(k, q)| quantity::parse(&q.0).ok().map(|m| (k.clone(), m.0)))
        .collect()
}

/// The requests a pod holds on its node, as kube-scheduler counts them (init containers,
/// sidecars and overhead included), plus one pod.
pub(crate) fn pod_requests(pod: &Pod) -> Vec<(String, i64)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let container = |c: &k8s_openapi::api::core::v1::Container, kind| {
        let res = c.resources.as_ref();
        let mut requests = parse_amounts(res.and_then(|r| r.limits.as_ref()));
        requests.extend(parse_amounts(res.and_then(|r| r.requests.as_ref())));
        ContainerRequest {
            name: c.name.clone(),
            kind,
            requests,
        }
    };
    let mut containers: Vec<ContainerRequest> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            container(c, kind)
        })
        .collect();
    containers.extend(
        spec.containers
            .iter()
            .map(|c| container(c, ContainerKind::App)),
    );
    let mut total = effective_request(&containers);
    for (k, v) in parse_amounts(spec.overhead.as_ref()) {
        let sum = total.entry(k).or_insert(0);
        *sum = sum.saturating_add(v);
    }
    let pods = total.entry("pods".into()).or_insert(0);
    *pods = pods.saturating_add(1000);
    total.into_iter().collect()
}

/// A wide sum as an amount: beyond i64 it saturates.
fn clamp(q: i128) -> i64 {
    i64::try_from(q).unwrap_or(if q > 0 { i64::MAX } else { i64::MIN })
}

/// A pod holds node resources while it is bound and not finished.
fn holds_resources(pod: &Pod) -> Option<&str> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    (!matches!(phase, Some("Succeeded") | Some("Failed"))).then_some(node)
}

impl ClusterState {
    pub(crate) fn new(name: &str, labels: BTreeMap<String, String>) -> Self {
        Self {
            name: name.to_string(),
            labels,
            ..Default::default()
        }
    }

    /// What is kept of a Node: its labels (interned), taints and allocatable. Everything
    /// else (images, conditions, addresses...) is dropped here.
    fn node_record(&mut self, node: &KubeNode) -> Option<(u32, NodeRecord)> {
        let name = node.metadata.name.as_deref()?;
        let spec = node.spec.as_ref();
        let mut taints: Vec<Taint> = spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .map(|t| Taint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
            .collect();
        if spec.and_then(|s| s.unschedulable) == Some(true) {
            taints.push(Taint {
                key: "node.kubernetes.io/unschedulable".into(),
                value: None,
                effect: "NoSchedule".into(),
            });
        }
        let labels = self.interner.labels(node.metadata.labels.as_ref());
        let allocatable = self.interner.amounts(parse_amounts(
            node.status.as_ref().and_then(|s| s.allocatable.as_ref()),
        ));
        let id = self.interner.node(name);
        Some((
            id,
            NodeRecord {
                labels,
                taints: taints.into(),
                allocatable,
            },
        ))
    }

    fn set_node(&mut self, id: u32, record: Option<NodeRecord>) {
        let id = id as usize;
        if self.nodes.len() <= id {
            self.nodes.resize(id + 1, None);
        }
        self.nodes[id] = record;
    }

    pub(crate) fn apply_node(&mut self, node: &KubeNode) {
        if let Some((id, record)) = self.node_record(node) {
            self.set_node(id, Some(record));
        }
    }

    pub(crate) fn delete_node(&mut self, name: &str) {
        if let Some(id) = self.interner.node_ids.get(name).copied() {
            self.set_node(id, None);
            self.interner.deleted_since_prune += 1;
            if self.interner.deleted_since_prune >= 1024 {
                self.interner.prune_labels();
            }
        }
    }

    /// Starts a relist of nodes: what arrives until [`Self::end_node_relist`] replaces the
    /// set. Each node is compacted as it arrives, so a relist never holds whole Nodes.
    pub(crate) fn begin_node_relist(&mut self) {
        self.node_relist = Some(Vec::new());
    }

    pub(crate) fn relist_node(&mut self, node: &KubeNode) {
        if let Some(entry) = self.node_record(node) {
            self.node_relist.get_or_insert_with(Vec::new).push(entry);
        }
    }

    pub(crate) fn end_node_relist(&mut self) {
        let listed = self.node_relist.take().unwrap_or_default();
        self.clear_nodes();
        // In arrival order: of duplicates the last wins.
        for (id, record) in listed {
            self.set_node(id, Some(record));
        }
        self.interner.prune_labels();
    }

    fn add_requests(&mut self, rec: PodRecord, sign: i128) {
        let Some(shape) = self.interner.shapes.get(rec.shape as usize) else {
            return;
        };
        let node = rec.node as usize;
        if self.requested.len() <= node {
            self.requested.resize(node + 1, Vec::new());
        }
        let entry = &mut self.requested[node];
        for (r, v) in shape.iter() {
            let r = *r as usize;
            if entry.len() <= r {
                entry.resize(r + 1, 0);
            }
            entry[r] += sign * i128::from(*v);
        }
    }

    fn record(&mut self, pod: &Pod) -> Option<(u64, Option<PodRecord>)> {
        let key = pod_key(pod.metadata.uid.as_deref()?);
        let Some(node) = holds_resources(pod) else {
            return Some((key, None));
        };
        let node = self.interner.node(node);
        let shape = self.interner.shape(pod_requests(pod));
        Some((key, Some(PodRecord { key, node, shape })))
    }

    fn remove_pod(&mut self, key: u64) {
        if let Ok(i) = self.pods.binary_search_by_key(&key, |p| p.key) {
            let old = self.pods.remove(i);
            self.add_requests(old, -1);
        }
    }

    pub(crate) fn apply_pod(&mut self, pod: &Pod) {
        let Some((key, record)) = self.record(pod) else {
            return;
        };
        match (self.pods.binary_search_by_key(&key, |p| p.key), record) {
            (Ok(i), Some(rec)) => {
                let old = std::mem::replace(&mut self.pods[i], rec);
                self.add_requests(old, -1);
                self.add_requests(rec, 1);
            }
            (Err(i), Some(rec)) => {
                self.pods.insert(i, rec);
                self.add_requests(rec, 1);
            }
            (Ok(_), None) => self.remove_pod(key),
            (Err(_), None) => {}
        }
    }

    pub(crate) fn delete_pod(&mut self, uid: &str) {
        self.remove_pod(pod_key(uid));
    }

    /// Starts a relist of pods: what arrives until [`Self::end_pod_relist`] replaces the set.
    pub(crate) fn begin_pod_relist(&mut self) {
        self.relist = Some(Vec::new());
    }

    pub(crate) fn relist_pod(&mut self, pod: &Pod) {
        if let Some((_, Some(rec))) = self.record(pod) {
            self.relist.get_or_insert_with(Vec::new).push(rec);
        }
    }

    pub(crate) fn end_pod_relist(&mut self) {
        let mut pods = self.relist.take().unwrap_or_default();
        // The last of duplicates wins, as if they had arrived one by one.
        pods.reverse();
        pods.sort_by_key(|p| p.key);
        pods.dedup_by_key(|p| p.key);
        pods.shrink_to_fit();
        self.clear_pods();
        for rec in &pods {
            self.add_requests(*rec, 1);
        }
        self.pods = pods;
    }

    /// A NodeResourceTopology object parsed into what placement needs (the JSON is ten times
    /// larger), or why it could not be.
    fn topology(
        &self,
        name: &str,
        object: &serde_json::Value,
        table: &mut ResourceTable,
    ) -> ParsedTopology {
        let at = format!("cluster {} NodeResourceTopology {name}", self.name);
        let mut spec = serde_json::Map::new();
        for key in ["attributes", "zones"] {
            if let Some(v) = object.get(key) {
                spec.insert(key.into(), v.clone());
            }
        }
        serde_json::from_value::<TopologySpec>(serde_json::Value::Object(spec))
            .map_err(|e| format!("{at}: {e}"))
            .and_then(|spec| {
                if spec.zones.is_empty() {
                    Err(format!("{at}: no zones"))
                } else {
                    build_topology(&at, spec, table)
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                }
            })
    }

    /// A NodeResourceTopology object (its name is the node's name). Resource names are
    /// interned in `table`, which must be the one later given to [`Self::to_cluster`].
    pub(crate) fn apply_topology(
        &mut self,
        name: &str,
        object: &serde_json::Value,
        table: &mut ResourceTable,
    ) {
        let parsed = self.topology(name, object, table);
        let id = self.interner.node(name);
        self.topologies.insert(id, parsed);
    }

    pub(crate) fn delete_topology(&mut self, name: &str) {
        if let Some(id) = self.interner.node_ids.get(name) {
            self.topologies.remove(id);
        }
    }

    /// Starts a relist of NodeResourceTopology objects, each parsed as it arrives.
    pub(crate) fn begin_topology_relist(&mut self) {
        self.topology_relist = Some(Vec::new());
    }

    pub(crate) fn relist_topology(
        &mut self,
        name: &str,
        object: &serde_json::Value,
        table: &mut ResourceTable,
    ) {
        let parsed = self.topology(name, object, table);
        let id = self.interner.node(name);
        self.topology_relist
            .get_or_insert_with(Vec::new)
            .push((id, parsed));
    }

    pub(crate) fn end_topology_relist(&mut self) {
        let listed = self.topology_relist.take().unwrap_or_default();
        self.topologies.clear();
        self.topologies.extend(listed);
    }

    /// Drops a relist of NodeResourceTopology objects under way, and every object (the CRD
    /// is no longer served).
    pub(crate) fn forget_topologies(&mut self) {
        self.topology_relist = None;
        self.topologies.clear();
    }

    /// Forgets every pod (a relist follows).
    pub(crate) fn clear_pods(&mut self) {
        self.pods = Vec::new();
        self.requested.clear();
    }
    pub(crate) fn clear_nodes(&mut self) {
        self.nodes.iter_mut().for_each(|n| *n = None);
    }

    #[cfg(test)]
    pub(crate) fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// The inventory's view of this cluster, nodes in name order. A node whose
    /// NodeResourceTopology cannot be read is kept without NUMA data, and the problem is
    /// returned beside the cluster so it can be reported.
    pub(crate) fn to_cluster(&self, table: &mut ResourceTable) -> (Cluster, Vec<InventoryError>) {
        let mut problems = Vec::new();
        // This cluster's resource ids in the shared table.
        let ids: Vec<usize> = self
            .interner
            .resource_names
            .iter()
            .map(|n| table.intern(n))
            .collect();
        let dense = |pairs: &mut dyn Iterator<Item = (usize, i64)>| {
            let mut v: Vec<i64> = Vec::new();
            for (r, q) in pairs {
                let Some(id) = ids.get(r).copied() else {
                    continue;
                };
                if v.len() <= id {
                    v.resize(id + 1, 0);
                }
                v[id] = v[id].saturating_add(q);
            }
            v
        };
        let names = &self.interner.node_names;
        let mut present: Vec<(usize, &NodeRecord)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
            .collect();
        present.sort_unstable_by(|a, b| names[a.0].cmp(&names[b.0]));
        let nodes = present
            .into_iter()
            .map(|(id, rec)| {
                let name = names[id].clone();
                let allocatable =
                    dense(&mut rec.allocatable.iter().map(|(r, q)| (*r as usize, *q)));
                let requested = dense(
                    &mut self
                        .requested
                        .get(id)
                        .into_iter()
                        .flatten()
                        .enumerate()
                        .filter(|(_, q)| **q != 0)
                        .map(|(r, q)| (r, clamp(*q))),
                );
                // `managed` is read with `get`: resources interned later are simply unmanaged.
                let numa = match self.topologies.get(&(id as u32)) {
                    Some(Ok(t)) => Some(t.clone()),
                    Some(Err(e)) => {
                        problems.push(InventoryError::Invalid {
                            at: format!("node {name}"),
                            message: e.clone(),
                        });
                        None
                    }
                    None => None,
                };
                Arc::new(Node {
                    name,
                    labels: rec.labels.clone(),
                    taints: rec.taints.clone(),
                    allocatable: allocatable.into(),
                    requested,
                    numa,
                })
            })
            .collect();
        (
            Cluster {
                name: self.name.clone(),
                labels: self.labels.clone(),
                nodes,
                summary: Default::default(),
                unavailable: None,
            },
            problems,
        )
    }
}

#[cfg(test)]
mod tests;
