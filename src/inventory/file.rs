//! The inventory file format (see `tests/data/formats/inventory.example.yaml`).

use super::{Cluster, Inventory, Node, NumaTopology, NumaZone, ResourceTable, Scope, Taint};
use crate::quantity::QuantityText;
use crate::topology::{NumaInfo, Policy, PolicyOptions};
use crate::unread;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot read inventory {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("inventory is not valid YAML for the inventory format: {0}")]
    Parse(String),
    #[error("inventory: {at}: {message}")]
    Invalid { at: String, message: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "an inventory: a map with clusters")]
pub(crate) struct InventoryFile {
    #[serde(default)]
    pub(crate) clusters: Vec<ClusterSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a cluster: a map of name, labels and nodes")]
pub(crate) struct ClusterSpec {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) nodes: Vec<NodeSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a node: a map of name, allocatable and more")]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) taints: Vec<TaintSpec>,
    #[serde(default)]
    pub(crate) allocatable: BTreeMap<String, QuantityText>,
    #[serde(default)]
    pub(crate) requested: Option<BTreeMap<String, QuantityText>>,
    pub(crate) topology: Option<TopologySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a taint: a map of key, value and effect")]
pub(crate) struct TaintSpec {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) effect: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a node's topology: a map of zones and attributes")]
pub(crate) struct TopologySpec {
    #[serde(default)]
    pub(crate) attributes: Vec<NameValue>,
    #[serde(default)]
    pub(crate) zones: Vec<ZoneSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a map of name and value")]
pub(crate) struct NameValue {
    pub(crate) name: String,
    pub(crate) value: serde_yaml::Value,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a NUMA zone: a map of name and resources")]
pub(crate) struct ZoneSpec {
    pub(crate) name: String,
    #[serde(rename = "type", default)]
    pub(crate) zone_type: Option<String>,
    #[serde(default)]
    pub(crate) costs: Vec<NameValue>,
    #[serde(default)]
    pub(crate) resources: Vec<ZoneResource>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a zone's resource: a map of name, capacity, allocatable and available")]
pub(crate) struct ZoneResource {
    pub(crate) name: String,
    pub(crate) capacity: Option<QuantityText>,
    pub(crate) allocatable: Option<QuantityText>,
    pub(crate) available: Option<QuantityText>,
}

/// An inventory file, read.
#[derive(Debug)]
pub struct Loaded {
    pub inventory: Inventory,
    /// Keys of its nodes' taints and topologies that their Kubernetes type does not have,
    /// and so were skipped (see [`crate::unread`]).
    pub warnings: Vec<String>,
}

pub fn load_file(path: &Path) -> Result<Loaded, InventoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| InventoryError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

/// An inventory file's text, read.
pub fn parse(text: &str) -> Result<Loaded, InventoryError> {
    let (file, skipped): (InventoryFile, _) =
        unread::from_yaml(text).map_err(|e| InventoryError::Parse(e.to_string()))?;
    let judged = unread::judge(&skipped, |path| {
        unread::clusters_owner(path).unwrap_or(unread::Owner::Switchyard)
    });
    if !judged.errors.is_empty() {
        return Err(InventoryError::Parse(judged.errors.join("; ")));
    }
    Ok(Loaded {
        inventory: build(file.clusters)?,
        warnings: judged.warnings,
    })
}

/// [`parse`], without the warnings.
pub fn parse_yaml(text: &str) -> Result<Inventory, InventoryError> {
    parse(text).map(|loaded| loaded.inventory)
}

fn scalar(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.clone(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        serde_yaml::Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

pub(crate) fn build(clusters: Vec<ClusterSpec>) -> Result<Inventory, InventoryError> {
    let mut resources = ResourceTable::default();
    // cpu, memory and pods first, so their ids are stable across inventories.
    for r in ["cpu", "memory", "pods"] {
        resources.intern(r);
    }
    let mut out = Vec::with_capacity(clusters.len());
    let mut seen_clusters = std::collections::HashSet::new();
    for c in clusters {
        if !seen_clusters.insert(c.name.clone()) {
            return Err(InventoryError::Invalid {
                at: format!("cluster {}", c.name),
                message: "appears twice; cluster names must be unique".into(),
            });
        }
        let mut nodes = Vec::with_capacity(c.nodes.len());
        let mut seen_nodes = std::collections::HashSet::new();
        for n in c.nodes {
            if !seen_nodes.insert(n.name.clone()) {
                return Err(InventoryError::Invalid {
                    at: format!("cluster {} node {}", c.name, n.name),
                    message: "appears twice; node names must be unique in a cluster".into(),
                });
            }
            nodes.push(std::sync::Arc::new(build_node(&c.name, n, &mut resources)?));
        }
        out.push(std::sync::Arc::new(Cluster {
            name: c.name,
            labels: c.labels,
            nodes,
            summary: Default::default(),
            unavailable: None,
        }));
    }
    Ok(Inventory {
        resources,
        clusters: out,
        node_index: Default::default(),
        cluster_index: Default::default(),
    }
    .finish())
}

fn amounts(
    at: &str,
    map: &BTreeMap<String, QuantityText>,
    resources: &mut ResourceTable,
) -> Result<Vec<i64>, InventoryError> {
    let mut v = Vec::new();
    for (name, q) in map {
        let id = resources.intern(name);
        let amount = q.parse().map_err(|e| InventoryError::Invalid {
            at: format!("{at} {name}"),
            message: e.to_string(),
        })?;
        if v.len() <= id {
            v.resize(id + 1, 0);
        }
        v[id] = amount;
    }
    Ok(v)
}

fn build_node(
    cluster: &str,
    n: NodeSpec,
    resources: &mut ResourceTable,
) -> Result<Node, InventoryError> {
    let at = format!("cluster {cluster} node {}", n.name);
    let allocatable = amounts(&format!("{at} allocatable"), &n.allocatable, resources)?;
    let requested = amounts(
        &format!("{at} requested"),
        &n.requested.unwrap_or_default(),
        resources,
    )?;
    let numa = match n.topology {
        Some(t) if !t.zones.is_empty() => Some(build_topology(&at, t, resources)?),
        _ => None,
    };
    Ok(Node {
        name: n.name.into(),
        labels: n.labels.into(),
        taints: n
            .taints
            .into_iter()
            .map(|t| Taint {
                key: t.key,
                value: t.value,
                effect: t.effect,
            })
            .collect(),
        allocatable: allocatable.into(),
        requested,
        numa: numa.map(std::sync::Arc::new),
    })
}

pub(crate) fn build_topology(
    at: &str,
    t: TopologySpec,
    resources: &mut ResourceTable,
) -> Result<NumaTopology, InventoryError> {
    let (policy, scope, mut options) = topology_manager(at, &t.attributes)?;
    let zones_only = t
        .zones
        .into_iter()
        .filter(|z| z.zone_type.as_deref().is_none_or(|ty| ty == "Node"));
    let mut zones = Vec::new();
    let mut managed = Vec::new();
    let mut raw_costs = Vec::new();
    for (i, z) in zones_only.enumerate() {
        let (zone, costs) = numa_zone(at, i, z, resources, &mut managed)?;
        zones.push(zone);
        raw_costs.push(costs);
    }
    let info = numa_info(at, &zones, raw_costs)?;
    if options.prefer_closest_numa && info.distances.len() < info.nodes.len() {
        // The kubelet would refuse to start; treat the option as off rather than fail the node.
        options.prefer_closest_numa = false;
    }
    Ok(NumaTopology {
        policy,
        scope,
        options,
        info: info.into(),
        zones,
        managed: managed.into(),
    })
}

/// The kubelet Topology Manager's settings, from the topology's attributes as
/// node-feature-discovery publishes them (the kubelet's defaults where absent).
fn topology_manager(
    at: &str,
    attributes: &[NameValue],
) -> Result<(Policy, Scope, PolicyOptions), InventoryError> {
    let invalid = |message: String| InventoryError::Invalid {
        at: at.to_string(),
        message,
    };
    let mut policy = Policy::None;
    let mut scope = Scope::Container;
    let mut options = PolicyOptions::default();
    for a in attributes {
        let value = scalar(&a.value);
        match a.name.as_str() {
            "topologyManagerPolicy" => {
                policy = value
                    .parse()
                    .map_err(|_| invalid(format!("unknown topologyManagerPolicy {value:?}")))?
            }
            "topologyManagerScope" => {
                scope = match value.as_str() {
                    "container" => Scope::Container,
                    "pod" => Scope::Pod,
                    other => {
                        return Err(invalid(format!("unknown topologyManagerScope {other:?}")))
                    }
                }
            }
            "topologyManagerMaxNUMANodes" => {
                let n: i64 = value.parse().map_err(|_| {
                    invalid(format!(
                        "topologyManagerMaxNUMANodes {value:?} is not a number"
                    ))
                })?;
                // The kubelet's own message names its option: named here as the file does.
                options.set_max_allowable(n).map_err(|e| {
                    invalid(format!(
                        "topologyManagerMaxNUMANodes {n} is refused by the kubelet: {e}"
                    ))
                })?;
            }
            "topologyManagerOptionPreferClosestNUMANodes" => {
                options.prefer_closest_numa = value == "true";
            }
            // Other attributes (node-feature-discovery publishes several) do not matter here.
            _ => {}
        }
    }
    Ok((policy, scope, options))
}

/// The `i`th NUMA zone of a topology (its id from its name `node-<id>`, else `i`), with its
/// costs to the other zones as published; marks the resources it reports in `managed` (by
/// resource id).
fn numa_zone(
    at: &str,
    i: usize,
    z: ZoneSpec,
    resources: &mut ResourceTable,
    managed: &mut Vec<bool>,
) -> Result<(NumaZone, Vec<NameValue>), InventoryError> {
    let id = z
        .name
        .strip_prefix("node-")
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(i as u32);
    if id > 63 {
        return Err(InventoryError::Invalid {
            at: at.to_string(),
            message: format!("zone {} has NUMA id {id}; ids go up to 63", z.name),
        });
    }
    let mut allocatable = Vec::new();
    let mut available = Vec::new();
    for r in &z.resources {
        let rid = resources.intern(&r.name);
        let parse = |q: &Option<QuantityText>| -> Result<Option<i64>, InventoryError> {
            q.as_ref()
                .map(|q| {
                    q.parse().map_err(|e| InventoryError::Invalid {
                        at: format!("{at} zone {} {}", z.name, r.name),
                        message: e.to_string(),
                    })
                })
                .transpose()
        };
        let cap = parse(&r.capacity)?;
        let alloc = parse(&r.allocatable)?.or(cap).unwrap_or(0);
        let avail = parse(&r.available)?.unwrap_or(alloc);
        if allocatable.len() <= rid {
            allocatable.resize(rid + 1, 0);
            available.resize(rid + 1, 0);
        }
        if managed.len() <= rid {
            managed.resize(rid + 1, false);
        }
        allocatable[rid] = alloc;
        available[rid] = avail;
        managed[rid] = true;
    }
    let zone = NumaZone {
        name: z.name.into(),
        id,
        allocatable: allocatable.into(),
        available,
    };
    Ok((zone, z.costs))
}

/// The NUMA ids of `zones` and, when any zone publishes costs, the distance rows between them
/// (a cost to a zone not in the topology is left out).
fn numa_info(
    at: &str,
    zones: &[NumaZone],
    raw_costs: Vec<Vec<NameValue>>,
) -> Result<NumaInfo, InventoryError> {
    let ids: Vec<u32> = zones.iter().map(|z| z.id).collect();
    let max_id = ids.iter().copied().max().unwrap_or(0) as usize;
    let mut distances = BTreeMap::new();
    for (zone, costs) in zones.iter().zip(raw_costs) {
        if costs.is_empty() {
            continue;
        }
        let mut row = vec![0u64; max_id + 1];
        for c in costs {
            let target = zones.iter().find(|z| *z.name == *c.name).map(|z| z.id);
            let value: u64 = scalar(&c.value)
                .parse()
                .map_err(|_| InventoryError::Invalid {
                    at: at.to_string(),
                    message: format!("zone {} cost to {} is not a number", zone.name, c.name),
                })?;
            if let Some(t) = target {
                row[t as usize] = value;
            }
        }
        distances.insert(zone.id, row);
    }
    Ok(if distances.is_empty() {
        NumaInfo::new(ids)
    } else {
        NumaInfo::with_distances(ids, distances)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_no_meaning_in_an_inventory_are_refused_by_name() {
        // A scenario given as an inventory: its queues and Jobs would be dropped unseen.
        let scenario = include_str!("../../examples/scenario.yaml");
        let err = parse_yaml(scenario).unwrap_err().to_string();
        assert!(err.contains("unknown field `queues`"), "{err}");
        // A misspelt key would leave a node with nothing allocatable.
        let misspelt =
            "clusters:\n  - name: c\n    nodes: [{name: n, allocateable: {cpu: \"8\"}}]\n";
        let err = parse_yaml(misspelt).unwrap_err().to_string();
        assert!(err.contains("unknown field `allocateable`"), "{err}");
        let fine = "clusters:\n  - name: c\n    nodes: [{name: n, allocatable: {cpu: \"8\"}}]\n";
        assert_eq!(parse_yaml(fine).unwrap().clusters[0].nodes.len(), 1);
    }
}
