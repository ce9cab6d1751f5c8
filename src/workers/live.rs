//! A worker's live state from its watches (Nodes, the Pods that hold node resources,
//! NodeResourceTopology objects), kept incrementally: an event changes one node's record, and
//! the inventory's view of the cluster is rebuilt from the records. Pure: no client here.

use crate::inventory::file::{build_topology, TopologySpec};
use crate::inventory::{Cluster, InventoryError, Node, ResourceTable, Taint};
use crate::placement::pod::{effective_request, ContainerKind, ContainerRequest};
use crate::quantity;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use std::collections::{BTreeMap, HashMap};

/// What the inventory needs of a Node.
#[derive(Debug, Clone, PartialEq)]
struct NodeRecord {
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    allocatable: BTreeMap<String, i64>,
}

/// What the inventory needs of a Pod: where it is and what it holds. Small on purpose: a
/// worker can run tens of thousands of pods.
#[derive(Debug, Clone, PartialEq)]
struct PodRecord {
    node: String,
    requests: Box<[(Box<str>, i64)]>,
}

#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    nodes: BTreeMap<String, NodeRecord>,
    pods: HashMap<String, PodRecord>,
    topologies: BTreeMap<String, TopologySpecHolder>,
    /// Sum of the pods' requests per node, kept as pods come and go.
    requested: HashMap<String, BTreeMap<String, i64>>,
}

/// A NodeResourceTopology's `attributes` and `zones`, as published.
#[derive(Debug, Clone)]
pub struct TopologySpecHolder(serde_json::Value);

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

    fn add_requests(&mut self, node: &str, requests: &[(Box<str>, i64)], sign: i64) {
        let entry = self.requested.entry(node.to_string()).or_default();
        for (k, v) in requests {
            let slot = entry.entry(k.to_string()).or_insert(0);
            *slot += sign * v;
            if *slot == 0 {
                entry.remove(k.as_ref());
            }
        }
        if entry.is_empty() {
            self.requested.remove(node);
        }
    }

    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        self.delete_pod(&uid);
        let Some(node) = holds_resources(pod) else {
            return;
        };
        let record = PodRecord {
            node: node.to_string(),
            requests: pod_requests(pod)
                .into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v))
                .collect(),
        };
        self.add_requests(&record.node, &record.requests, 1);
        self.pods.insert(uid, record);
    }

    pub fn delete_pod(&mut self, uid: &str) {
        if let Some(old) = self.pods.remove(uid) {
            self.add_requests(&old.node, &old.requests, -1);
        }
    }

    /// A NodeResourceTopology object (its name is the node's name).
    pub fn apply_topology(&mut self, name: &str, object: &serde_json::Value) {
        let mut spec = serde_json::Map::new();
        for key in ["attributes", "zones"] {
            if let Some(v) = object.get(key) {
                spec.insert(key.into(), v.clone());
            }
        }
        self.topologies.insert(
            name.to_string(),
            TopologySpecHolder(serde_json::Value::Object(spec)),
        );
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
        let empty = BTreeMap::new();
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
                let requested = amounts(self.requested.get(name).unwrap_or(&empty), table);
                let numa = self.topologies.get(name).and_then(|t| {
                    let at = format!("cluster {} NodeResourceTopology {name}", self.name);
                    let spec: Result<TopologySpec, _> = serde_json::from_value(t.0.clone());
                    match spec {
                        Ok(spec) if !spec.zones.is_empty() => {
                            match build_topology(&at, spec, table) {
                                Ok(t) => Some(t),
                                Err(e) => {
                                    problems.push(e);
                                    None
                                }
                            }
                        }
                        Ok(_) => None,
                        Err(e) => {
                            problems.push(InventoryError::Invalid {
                                at,
                                message: e.to_string(),
                            });
                            None
                        }
                    }
                });
                Node {
                    name: name.clone(),
                    labels: rec.labels.clone(),
                    taints: rec.taints.clone(),
                    allocatable,
                    requested,
                    numa,
                }
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
