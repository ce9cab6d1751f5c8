//! What a pod asks for, read once from the Pod as kube-scheduler sends it, in the terms the
//! scheduler (node-level fit) and the kubelet (NUMA alignment) each use.

use crate::inventory::{ResourceId, ResourceTable};
use crate::quantity::QuantityText;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Pod fields the engine reads; everything else is skipped while parsing.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a Pod: a map with metadata and spec")]
pub struct PodView {
    #[serde(default)]
    pub(crate) metadata: PodMeta,
    #[serde(default)]
    pub spec: PodSpecView,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a Pod's metadata: a map")]
pub(crate) struct PodMeta {
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) labels: Option<BTreeMap<String, String>>,
    pub(crate) annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a pod spec: a map with containers")]
pub struct PodSpecView {
    #[serde(default)]
    pub(crate) containers: Vec<ContainerView>,
    #[serde(default)]
    pub(crate) init_containers: Vec<ContainerView>,
    pub(crate) overhead: Option<BTreeMap<String, QuantityText>>,
    pub(crate) node_selector: Option<BTreeMap<String, String>>,
    pub(crate) affinity: Option<AffinityView>,
    #[serde(default)]
    pub(crate) tolerations: Vec<Toleration>,
    #[serde(default)]
    pub(crate) topology_spread_constraints: Vec<SpreadConstraintView>,
}

/// A pod's topology spread constraint (`TopologySpreadConstraint`), every field of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(
    expecting = "a topology spread constraint: a map with maxSkew, topologyKey and whenUnsatisfiable"
)]
pub(crate) struct SpreadConstraintView {
    #[serde(default)]
    pub(crate) max_skew: i32,
    #[serde(default)]
    pub(crate) topology_key: String,
    #[serde(default)]
    pub(crate) when_unsatisfiable: String,
    pub(crate) label_selector: Option<LabelSelectorView>,
    pub(crate) min_domains: Option<i32>,
    pub(crate) node_affinity_policy: Option<String>,
    pub(crate) node_taints_policy: Option<String>,
    #[serde(default)]
    pub(crate) match_label_keys: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a container: a map with name and resources")]
pub(crate) struct ContainerView {
    #[serde(default)]
    pub(crate) name: String,
    pub(crate) resources: Option<ResourcesView>,
    pub(crate) restart_policy: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(expecting = "a container's resources: a map of requests and limits")]
pub(crate) struct ResourcesView {
    pub(crate) requests: Option<BTreeMap<String, QuantityText>>,
    pub(crate) limits: Option<BTreeMap<String, QuantityText>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "an affinity: a map")]
pub(crate) struct AffinityView {
    pub(crate) node_affinity: Option<NodeAffinityView>,
    pub(crate) pod_affinity: Option<RequiredTermsView>,
    pub(crate) pod_anti_affinity: Option<RequiredTermsView>,
}

/// A pod's affinity or anti-affinity: its required terms only (a preferred term changes no
/// fit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a pod affinity or anti-affinity: a map")]
pub(crate) struct RequiredTermsView {
    #[serde(default)]
    pub(crate) required_during_scheduling_ignored_during_execution: Vec<PodAffinityTermView>,
}

/// A pod affinity term (`PodAffinityTerm`), every field of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a pod affinity term: a map with labelSelector and topologyKey")]
pub(crate) struct PodAffinityTermView {
    pub(crate) label_selector: Option<LabelSelectorView>,
    pub(crate) namespace_selector: Option<LabelSelectorView>,
    #[serde(default)]
    pub(crate) namespaces: Vec<String>,
    #[serde(default)]
    pub(crate) topology_key: String,
    #[serde(default)]
    pub(crate) match_label_keys: Vec<String>,
    #[serde(default)]
    pub(crate) mismatch_label_keys: Vec<String>,
}

/// A label selector (`metav1.LabelSelector`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a label selector: a map of matchLabels and matchExpressions")]
pub(crate) struct LabelSelectorView {
    pub(crate) match_labels: Option<BTreeMap<String, String>>,
    pub(crate) match_expressions: Option<Vec<SelectorRequirement>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a node affinity: a map")]
pub(crate) struct NodeAffinityView {
    pub(crate) required_during_scheduling_ignored_during_execution: Option<NodeSelectorView>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a node selector: a map with nodeSelectorTerms")]
pub(crate) struct NodeSelectorView {
    #[serde(default)]
    pub(crate) node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "a node selector term: a map of matchExpressions and matchFields")]
pub(crate) struct NodeSelectorTerm {
    #[serde(default)]
    pub(crate) match_expressions: Vec<SelectorRequirement>,
    #[serde(default)]
    pub(crate) match_fields: Vec<SelectorRequirement>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(expecting = "a selector requirement: a map of key, operator and values")]
pub(crate) struct SelectorRequirement {
    pub(crate) key: String,
    pub(crate) operator: String,
    #[serde(default)]
    pub(crate) values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(expecting = "a toleration: a map of key, operator, value and effect")]
pub(crate) struct Toleration {
    pub(crate) key: Option<String>,
    pub(crate) operator: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) effect: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    Init,
    /// A restartable init container (`restartPolicy: Always`): runs beside the app containers.
    Sidecar,
    App,
}

/// One container's requests, by resource name, in milli-units.
#[derive(Debug, Clone)]
pub(crate) struct ContainerRequest {
    pub(crate) name: String,
    pub(crate) kind: ContainerKind,
    pub(crate) requests: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}container {container}: resource {resource}: {message}", named(.pod))]
pub struct PodError {
    pub pod: String,
    pub(crate) container: String,
    pub resource: String,
    pub message: String,
}

/// `pod NAMESPACE/NAME: ` for a pod with a name; nothing for a template (a scenario's, a
/// Job's), which the caller names.
fn named(pod: &str) -> String {
    match pod {
        "" | "/" => String::new(),
        _ => format!("pod {pod}: "),
    }
}

/// A pod, analysed once: cached between filter and prioritize.
#[derive(Debug, Clone)]
pub struct PodShape {
    pub name: String,
    pub(crate) containers: Vec<ContainerRequest>,
    /// Guaranteed QoS: CPU and memory managers align only these pods.
    pub guaranteed: bool,
    /// What the scheduler's NodeResourcesFit counts (with init containers, sidecars and
    /// overhead), which is also the kubelet's pod-scope effective request plus overhead.
    pub node_request: BTreeMap<String, i64>,
    /// The kubelet's effective request for the pod scope (no overhead).
    pub(crate) effective: BTreeMap<String, i64>,
    pub(crate) node_selector: BTreeMap<String, String>,
    pub(crate) required_terms: Option<Vec<NodeSelectorTerm>>,
    pub(crate) tolerations: Vec<Toleration>,
    pub(crate) annotations: BTreeMap<String, String>,
    /// At most one of the gang's pods on a node: the pod's required anti-affinity to pods
    /// like itself on `kubernetes.io/hostname` (see [`super::apart`]).
    pub(crate) one_per_node: bool,
    /// The gang's pods spread over nodes: the pod's `DoNotSchedule` topology spread
    /// constraint on `kubernetes.io/hostname` over pods like itself (see [`super::apart`]).
    pub(crate) spread: Option<super::apart::Spread>,
    /// The gang's pods kept together in one domain of these topology keys: the pod's required
    /// pod affinity to pods like itself (see [`super::apart`]). Empty when it has none.
    pub(crate) together: Vec<String>,
    /// The required anti-affinity terms and spread constraints placement does not model (see
    /// [`super::apart`]): `simulate` and `explain` warn of them.
    pub(crate) unmodelled_terms: Vec<super::apart::Unmodelled>,
}

fn container_requests(pod: &str, c: &ContainerView) -> Result<BTreeMap<String, i64>, PodError> {
    let mut out = BTreeMap::new();
    let Some(res) = &c.resources else {
        return Ok(out);
    };
    let parse = |name: &str, q: &QuantityText| {
        q.parse().map_err(|e| PodError {
            pod: pod.to_string(),
            container: c.name.clone(),
            resource: name.to_string(),
            message: e.to_string(),
        })
    };
    // Requests default to limits when only limits are set, as the API server defaults them.
    for (name, q) in res.limits.iter().flatten() {
        out.insert(name.clone(), parse(name, q)?);
    }
    for (name, q) in res.requests.iter().flatten() {
        out.insert(name.clone(), parse(name, q)?);
    }
    Ok(out)
}

fn is_guaranteed(pod: &str, spec: &PodSpecView) -> Result<bool, PodError> {
    for c in spec.containers.iter().chain(&spec.init_containers) {
        let Some(res) = &c.resources else {
            return Ok(false);
        };
        let requests = container_requests(pod, c)?;
        for r in ["cpu", "memory"] {
            let limit = res.limits.as_ref().and_then(|l| l.get(r));
            let Some(limit) = limit else { return Ok(false) };
            let limit = limit.parse().unwrap_or(-1);
            if requests.get(r) != Some(&limit) || limit <= 0 {
                return Ok(false);
            }
        }
    }
    Ok(!spec.containers.is_empty())
}

/// The kubelet's and the scheduler's pod-level request for each resource: the larger of the
/// long-running containers (app containers plus sidecars) and the peak while init containers
/// run (each init container plus the sidecars started before it).
pub(crate) fn effective_request(containers: &[ContainerRequest]) -> BTreeMap<String, i64> {
    let names: std::collections::BTreeSet<&String> =
        containers.iter().flat_map(|c| c.requests.keys()).collect();
    let mut out = BTreeMap::new();
    for name in names {
        let get = |c: &ContainerRequest| c.requests.get(name).copied().unwrap_or(0);
        let mut sidecars = 0i64;
        let mut init_peak = 0i64;
        let mut apps = 0i64;
        for c in containers {
            match c.kind {
                // Amounts come from other clusters' pods: saturate rather than wrap.
                ContainerKind::Sidecar => {
                    sidecars = sidecars.saturating_add(get(c));
                    init_peak = init_peak.max(sidecars);
                }
                ContainerKind::Init => init_peak = init_peak.max(sidecars.saturating_add(get(c))),
                ContainerKind::App => apps = apps.saturating_add(get(c)),
            }
        }
        let value = init_peak.max(apps.saturating_add(sidecars));
        if value > 0 {
            out.insert(name.clone(), value);
        }
    }
    out
}

impl PodShape {
    pub fn from_view(pod: &PodView) -> Result<Self, PodError> {
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let spec = &pod.spec;
        let mut containers = Vec::new();
        for c in &spec.init_containers {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            containers.push(ContainerRequest {
                name: c.name.clone(),
                kind,
                requests: container_requests(&name, c)?,
            });
        }
        for c in &spec.containers {
            containers.push(ContainerRequest {
                name: c.name.clone(),
                kind: ContainerKind::App,
                requests: container_requests(&name, c)?,
            });
        }
        let effective = effective_request(&containers);
        let mut node_request = effective.clone();
        for (r, q) in spec.overhead.iter().flatten() {
            let q = q.parse().map_err(|e| PodError {
                pod: name.clone(),
                container: "(overhead)".into(),
                resource: r.clone(),
                message: e.to_string(),
            })?;
            let sum = node_request.entry(r.clone()).or_insert(0);
            *sum = sum.saturating_add(q);
        }
        let apart = super::apart::judge(
            spec,
            pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            pod.metadata
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or("default"),
        );
        Ok(Self {
            guaranteed: is_guaranteed(&name, spec)?,
            containers,
            node_request,
            effective,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_terms: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|s| s.node_selector_terms.clone()),
            tolerations: spec.tolerations.clone(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            one_per_node: apart.one_per_node,
            spread: apart.spread,
            together: apart.together,
            unmodelled_terms: apart.unmodelled,
            name,
        })
    }

    /// Resolves names to an inventory's resource ids. A resource the inventory has never seen
    /// cannot be on any of its nodes.
    pub fn bind(&self, table: &ResourceTable) -> BoundPod {
        let ids = |m: &BTreeMap<String, i64>| -> Amounts {
            m.iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| (table.id(k), k.clone(), *v))
                .collect()
        };
        BoundPod {
            node_request: ids(&self.node_request),
            effective: ids(&self.effective),
            containers: self
                .containers
                .iter()
                .map(|c| (c.kind, c.name.clone(), ids(&c.requests)))
                .collect(),
        }
    }
}

/// Amounts as (resource id if the inventory knows the resource, name, amount).
pub(crate) type Amounts = Vec<(Option<ResourceId>, String, i64)>;

/// A [`PodShape`]'s amounts in one inventory's resource ids.
#[derive(Debug, Clone)]
pub struct BoundPod {
    pub node_request: Amounts,
    pub(crate) effective: Amounts,
    pub(crate) containers: Vec<(ContainerKind, String, Amounts)>,
}
