//! A worker's live state from its watches (Nodes, the Pods that hold node resources,
//! NodeResourceTopology objects), kept incrementally: an event changes one node's record, and
//! the inventory's view of the cluster is rebuilt from the records. Pure: no client here.

use crate::inventory::file::{build_topology, TopologySpec};
use crate::inventory::{Cluster, InventoryError, Node, NumaTopology, ResourceTable, Taint};
use crate::placement::pod::{effective_request, ContainerKind, ContainerRequest};
use crate::quantity;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the inventory needs of a Node.
#[derive(Debug, Clone, PartialEq)]
struct NodeRecord {
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    allocatable: BTreeMap<String, i64>,
}

/// A pod's key: its UID as 128 bits (real UIDs are UUIDs), or the text for anything else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PodKey {
    Uuid(u128),
    Other(Box<str>),
}

impl PodKey {
    fn of(uid: &str) -> Self {
        let hex: String = uid.chars().filter(|c| *c != '-').collect();
        match (hex.len(), u128::from_str_radix(&hex, 16)) {
            (32, Ok(v)) => PodKey::Uuid(v),
            _ => PodKey::Other(uid.into()),
        }
    }
}

/// What the inventory needs of a Pod: where it is and what it holds, as two small ids. A
/// worker runs tens of thousands of pods and a manager watches a hundred workers: pods with
/// the same requests share one interned shape, and node names are interned too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PodRecord {
    node: u32,
    shape: u32,
}

/// Interned strings and request shapes for one cluster.
#[derive(Debug, Clone, Default)]
struct Interner {
    node_ids: HashMap<Box<str>, u32>,
    node_names: Vec<Box<str>>,
    resource_ids: HashMap<Box<str>, u16>,
    resource_names: Vec<Box<str>>,
    shape_ids: HashMap<Box<[(u16, i64)]>, u32>,
    shapes: Vec<Box<[(u16, i64)]>>,
}

impl Interner {
    fn node(&mut self, name: &str) -> u32 {
        if let Some(id) = self.node_ids.get(name) {
            return *id;
        }
        let id = self.node_names.len() as u32;
        self.node_names.push(name.into());
        self.node_ids.insert(name.into(), id);
        id
    }

    fn resource(&mut self, name: &str) -> u16 {
        if let Some(id) = self.resource_ids.get(name) {
            return *id;
        }
        let id = self.resource_names.len() as u16;
        self.resource_names.push(name.into());
        self.resource_ids.insert(name.into(), id);
        id
    }

    fn shape(&mut self, requests: Vec<(String, i64)>) -> u32 {
        let mut shape: Vec<(u16, i64)> = requests
            .into_iter()
            .map(|(k, v)| (self.resource(&k), v))
            .collect();
        shape.sort_unstable();
        let shape: Box<[(u16, i64)]> = shape.into();
        if let Some(id) = self.shape_ids.get(&shape) {
            return *id;
        }
        let id = self.shapes.len() as u32;
        self.shapes.push(shape.clone());
        self.shape_ids.insert(shape, id);
        id
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    nodes: BTreeMap<String, NodeRecord>,
    interner: Interner,
    pods: HashMap<PodKey, PodRecord>,
    /// Parsed at arrival (the published JSON is ten times larger), or why it could not be.
    topologies: BTreeMap<String, Result<NumaTopology, String>>,
    /// Sum of the pods' requests per interned node, by interned resource, kept as pods come
    /// and go.
    requested: HashMap<u32, Vec<i64>>,
    /// Pods collected during a relist, applied when it completes.
    relist: Option<Vec<(PodKey, PodRecord)>>,
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
pub fn pod_requests(pod: &Pod) -> Vec<(String, i64)> {
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
        *total.entry(k).or_insert(0) += v;
    }
    *total.entry("pods".into()).or_insert(0) += 1000;
    total.into_iter().collect()
}

/// A pod holds node resources while it is bound and not finished.
fn holds_resources(pod: &Pod) -> Option<&str> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    (!matches!(phase, Some("Succeeded") | Some("Failed"))).then_some(node)
}

impl ClusterState {
    pub fn new(name: &str, labels: BTreeMap<String, String>) -> Self {
        Self {
            name: name.to_string(),
            labels,
            ..Default::default()
        }
    }

    pub fn apply_node(&mut self, node: &KubeNode) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
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
        let record = NodeRecord {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints,
            allocatable: parse_amounts(node.status.as_ref().and_then(|s| s.allocatable.as_ref())),
        };
        self.nodes.insert(name, record);
    }

    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    fn add_requests(&mut self, rec: PodRecord, sign: i64) {
        let Some(shape) = self.interner.shapes.get(rec.shape as usize) else {
            return;
        };
        let entry = self.requested.entry(rec.node).or_default();
        for (r, v) in shape.iter() {
            let r = *r as usize;
            if entry.len() <= r {
                entry.resize(r + 1, 0);
            }
            entry[r] += sign * v;
        }
        if entry.iter().all(|v| *v == 0) {
            self.requested.remove(&rec.node);
        }
    }

    fn record(&mut self, pod: &Pod) -> Option<(PodKey, Option<PodRecord>)> {
        let key = PodKey::of(pod.metadata.uid.as_deref()?);
        let Some(node) = holds_resources(pod) else {
            return Some((key, None));
        };
        let node = self.interner.node(node);
        let shape = self.interner.shape(pod_requests(pod));
        Some((key, Some(PodRecord { node, shape })))
    }

    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some((key, record)) = self.record(pod) else {
            return;
        };
        if let Some(old) = self.pods.remove(&key) {
            self.add_requests(old, -1);
        }
        if let Some(rec) = record {
            self.add_requests(rec, 1);
            self.pods.insert(key, rec);
        }
    }

    pub fn delete_pod(&mut self, uid: &str) {
        if let Some(old) = self.pods.remove(&PodKey::of(uid)) {
            self.add_requests(old, -1);
        }
    }

    /// Starts a relist of pods: what arrives until [`Self::end_pod_relist`] replaces the set.
    pub fn begin_pod_relist(&mut self) {
        self.relist = Some(Vec::new());
    }

    pub fn relist_pod(&mut self, pod: &Pod) {
        if let Some((key, Some(rec))) = self.record(pod) {
            self.relist.get_or_insert_with(Vec::new).push((key, rec));
        }
    }

    pub fn end_pod_relist(&mut self) {
        let pods = self.relist.take().unwrap_or_default();
        self.clear_pods();
        for (key, rec) in pods {
            self.add_requests(rec, 1);
            self.pods.insert(key, rec);
        }
    }

    /// A NodeResourceTopology object (its name is the node's name). Resource names are
    /// interned in `table`, which must be the one later given to [`Self::to_cluster`].
    pub fn apply_topology(
        &mut self,
        name: &str,
        object: &serde_json::Value,
        table: &mut ResourceTable,
    ) {
        let at = format!("cluster {} NodeResourceTopology {name}", self.name);
        let mut spec = serde_json::Map::new();
        for key in ["attributes", "zones"] {
            if let Some(v) = object.get(key) {
                spec.insert(key.into(), v.clone());
            }
        }
        let parsed = serde_json::from_value::<TopologySpec>(serde_json::Value::Object(spec))
            .map_err(|e| format!("{at}: {e}"))
            .and_then(|spec| {
                if spec.zones.is_empty() {
                    Err(format!("{at}: no zones"))
                } else {
                    build_topology(&at, spec, table).map_err(|e| e.to_string())
                }
            });
        self.topologies.insert(name.to_string(), parsed);
    }

    pub fn delete_topology(&mut self, name: &str) {
        self.topologies.remove(name);
    }

    /// Forgets every pod (a relist follows).
    pub fn clear_pods(&mut self) {
        self.pods.clear();
        self.requested.clear();
    }
    pub fn clear_nodes(&mut self) {
        self.nodes.clear();
    }
    pub fn clear_topologies(&mut self) {
        self.topologies.clear();
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// The inventory's view of this cluster, nodes in name order. A node whose
    /// NodeResourceTopology cannot be read is kept without NUMA data, and the problem is
    /// returned beside the cluster so it can be reported.
    pub fn to_cluster(&self, table: &mut ResourceTable) -> (Cluster, Vec<InventoryError>) {
        let mut problems = Vec::new();
        let nodes = self
            .nodes
            .iter()
            .map(|(name, rec)| {
                let amounts = |m: &BTreeMap<String, i64>, table: &mut ResourceTable| {
                    let mut v = Vec::new();
                    for (k, q) in m {
                        let id = table.intern(k);
                        if v.len() <= id {
                            v.resize(id + 1, 0);
                        }
                        v[id] = *q;
                    }
                    v
                };
                let allocatable = amounts(&rec.allocatable, table);
                let requested_here: BTreeMap<String, i64> = self
                    .interner
                    .node_ids
                    .get(name.as_str())
                    .and_then(|id| self.requested.get(id))
                    .map(|v| {
                        v.iter()
                            .enumerate()
                            .filter(|(_, q)| **q != 0)
                            .map(|(r, q)| (self.interner.resource_names[r].to_string(), *q))
                            .collect()
                    })
                    .unwrap_or_default();
                let requested = amounts(&requested_here, table);
                let numa = match self.topologies.get(name) {
                    Some(Ok(t)) => {
                        let mut t = t.clone();
                        t.managed.resize(table.len(), false);
                        Some(t)
                    }
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
                    name: name.clone(),
                    labels: rec.labels.clone(),
                    taints: rec.taints.clone(),
                    allocatable,
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
