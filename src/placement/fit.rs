//! Node fit (resources, taints, node selection, then the node's Topology Manager) and cluster
//! fit for a gang of identical pods, placed one at a time as the kubelets would admit them.

use super::pod::{BoundPod, ContainerKind, NodeSelectorTerm, PodShape, Toleration};
use super::score::{node_score, scored_resources, Strategy};
use super::{EngineConfig, NumaUnknown};
use crate::inventory::{Cluster, Node, NumaTopology, ResourceTable, Scope, Taint};
use crate::quantity::{display, Milli};
use crate::topology::{merge, NumaMask, Policy, ProviderHints, TopologyHint};
use std::fmt;

/// Why a pod does not fit. `unresolvable()` tells kube-scheduler whether preemption could help.
#[derive(Debug, Clone, PartialEq)]
pub enum Misfit {
    UnknownNode(String),
    UnknownResource {
        resource: String,
    },
    Insufficient {
        resource: String,
        need: i64,
        free: i64,
        allocatable: i64,
        scope: String,
    },
    Taint {
        node: String,
        taint: String,
    },
    Selector {
        node: String,
        detail: String,
    },
    NoNumaData {
        node: String,
    },
    Topology {
        node: String,
        policy: Policy,
        unit: String,
        detail: String,
        unresolvable: bool,
    },
    Gang {
        cluster: String,
        fitted: usize,
        wanted: usize,
        cause: Box<Misfit>,
    },
    BadPod(String),
    /// The whole cluster cannot take work now (stale or lost).
    Unavailable(String),
}

impl Misfit {
    pub fn unresolvable(&self) -> bool {
        match self {
            Misfit::UnknownNode(_)
            | Misfit::UnknownResource { .. }
            | Misfit::Taint { .. }
            | Misfit::Selector { .. }
            | Misfit::NoNumaData { .. }
            | Misfit::BadPod(_) => true,
            // It may come back; kube-scheduler should retry.
            Misfit::Unavailable(_) => false,
            Misfit::Insufficient {
                need, allocatable, ..
            } => need > allocatable,
            Misfit::Topology { unresolvable, .. } => *unresolvable,
            Misfit::Gang { cause, .. } => cause.unresolvable(),
        }
    }
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::UnknownNode(n) => write!(f, "node {n:?} is not in Switchyard's inventory"),
            Misfit::UnknownResource { resource } => {
                write!(f, "no node offers {resource}")
            }
            Misfit::Insufficient {
                resource,
                need,
                allocatable: 0,
                scope,
                ..
            } => write!(
                f,
                "needs {} {resource}; {scope} has none",
                display(resource, Milli(*need))
            ),
            Misfit::Insufficient {
                resource,
                need,
                free,
                allocatable,
                scope,
            } => write!(
                f,
                "needs {} {resource} on one node; {scope} has {} free of {} allocatable",
                display(resource, Milli(*need)),
                display(resource, Milli(*free)),
                display(resource, Milli(*allocatable)),
            ),
            Misfit::Taint { node, taint } => {
                write!(
                    f,
                    "node {node} has taint {taint} that the pod does not tolerate"
                )
            }
            Misfit::Selector { node, detail } => write!(f, "node {node} {detail}"),
            Misfit::NoNumaData { node } => write!(
                f,
                "node {node} publishes no NUMA data (NodeResourceTopology) and numaUnknown is deny"
            ),
            Misfit::Topology {
                node,
                policy,
                unit,
                detail,
                ..
            } => write!(
                f,
                "the Topology Manager of node {node} ({policy}) would reject {unit}: {detail}"
            ),
            Misfit::Gang {
                cluster,
                fitted,
                wanted,
                cause,
            } => write!(
                f,
                "only {fitted} of {wanted} pods fit at once in cluster {cluster}; then: {cause}"
            ),
            Misfit::BadPod(m) | Misfit::Unavailable(m) => write!(f, "{m}"),
        }
    }
}

/// A node's free amounts during a simulation: node level, and per NUMA zone.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub free: Vec<i64>,
    pub zones: Vec<Vec<i64>>,
}

impl NodeState {
    pub fn of(node: &Node) -> Self {
        Self {
            free: (0..node.allocatable.len()).map(|r| node.free(r)).collect(),
            zones: node
                .numa
                .as_ref()
                .map(|n| n.zones.iter().map(|z| z.available.clone()).collect())
                .unwrap_or_default(),
        }
    }
}

/// How one unit (a container, or the whole pod under the pod scope) was judged.
#[derive(Debug, Clone)]
pub struct UnitTrace {
    pub unit: String,
    pub hints: Vec<(String, Option<Vec<TopologyHint>>)>,
    pub merged: TopologyHint,
    pub admit: bool,
}

/// The verdict for one node.
#[derive(Debug, Clone)]
pub struct NodeFit {
    /// How many copies of the pod fit at once (up to the number asked for).
    pub count: usize,
    pub misfit: Option<Misfit>,
    /// NUMA ids used by the placed copies.
    pub zones_used: NumaMask,
    pub state: NodeState,
    pub notes: Vec<String>,
    pub traces: Vec<UnitTrace>,
}

fn toleration_matches(t: &Toleration, taint: &Taint) -> bool {
    let key_ok = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == taint.key,
    };
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let value_ok = match t.operator.as_deref() {
        Some("Exists") => true,
        _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    };
    key_ok && effect_ok && value_ok
}

fn requirement_matches(
    key_value: Option<&str>,
    op: &str,
    values: &[String],
) -> Result<bool, String> {
    Ok(match op {
        "In" => key_value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => key_value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => key_value.is_some(),
        "DoesNotExist" => key_value.is_none(),
        "Gt" | "Lt" => {
            let bound: i64 = values
                .first()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("operator {op} needs one integer value"))?;
            match key_value.and_then(|v| v.parse::<i64>().ok()) {
                Some(v) if op == "Gt" => v > bound,
                Some(v) => v < bound,
                None => false,
            }
        }
        other => return Err(format!("unknown operator {other:?}")),
    })
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> Result<bool, String> {
    if term.match_expressions.is_empty() && term.match_fields.is_empty() {
        return Ok(false);
    }
    for e in &term.match_expressions {
        if !requirement_matches(
            node.labels.get(&e.key).map(String::as_str),
            &e.operator,
            &e.values,
        )? {
            return Ok(false);
        }
    }
    for e in &term.match_fields {
        let value = (e.key == "metadata.name").then_some(node.name.as_str());
        if !requirement_matches(value, &e.operator, &e.values)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Taints, nodeSelector and required node affinity: the checks preemption cannot change.
pub fn node_accepts(shape: &PodShape, node: &Node) -> Result<(), Misfit> {
    for taint in &node.taints {
        if taint.effect == "PreferNoSchedule" {
            continue;
        }
        if !shape
            .tolerations
            .iter()
            .any(|t| toleration_matches(t, taint))
        {
            return Err(Misfit::Taint {
                node: node.name.clone(),
                taint: format!(
                    "{}{}:{}",
                    taint.key,
                    taint
                        .value
                        .as_deref()
                        .map(|v| format!("={v}"))
                        .unwrap_or_default(),
                    taint.effect
                ),
            });
        }
    }
    for (k, v) in &shape.node_selector {
        if node.labels.get(k) != Some(v) {
            return Err(Misfit::Selector {
                node: node.name.clone(),
                detail: format!("does not have label {k}={v} (nodeSelector)"),
            });
        }
    }
    if let Some(terms) = &shape.required_terms {
        let mut any = false;
        for t in terms {
            match term_matches(t, node) {
                Ok(true) => {
                    any = true;
                    break;
                }
                Ok(false) => {}
                Err(e) => return Err(Misfit::BadPod(format!("required node affinity: {e}"))),
            }
        }
        if !any {
            return Err(Misfit::Selector {
                node: node.name.clone(),
                detail: "does not match the pod's required node affinity".into(),
            });
        }
    }
    Ok(())
}

/// Which of a unit's resources the kubelet aligns on this node: devices always, CPU (whole
/// CPUs only) and memory/hugepages for Guaranteed pods, and only resources the zones list.
fn aligned(name: &str, amount: i64, guaranteed: bool) -> bool {
    match name {
        "cpu" => guaranteed && amount % 1000 == 0,
        "memory" => guaranteed,
        n if n.starts_with("hugepages-") => guaranteed,
        "pods" | "ephemeral-storage" => false,
        _ => true,
    }
}

fn mask_of(numa: &NumaTopology, zone_indexes: u64) -> NumaMask {
    let mut bits = 0u64;
    for (i, z) in numa.zones.iter().enumerate() {
        if zone_indexes & (1 << i) != 0 {
            bits |= 1 << z.id;
        }
    }
    NumaMask(bits)
}

/// Hints as the CPU, memory and device managers generate them: every zone set whose available
/// amounts cover the request, preferred when the set has the minimal size able to cover the
/// request on allocatable amounts.
fn hints_for(numa: &NumaTopology, zones: &[Vec<i64>], rid: usize, need: i64) -> Vec<TopologyHint> {
    let n = numa.zones.len().min(16);
    let mut min_size = u32::MAX;
    let mut fitting = Vec::new();
    // Subset sums built from the subset without its lowest zone: one addition per set.
    let size = 1usize << n;
    let mut alloc_sum = vec![0i64; size];
    let mut avail_sum = vec![0i64; size];
    for set in 1..size {
        let low = set.trailing_zeros() as usize;
        let rest = set & (set - 1);
        alloc_sum[set] =
            alloc_sum[rest] + numa.zones[low].allocatable.get(rid).copied().unwrap_or(0);
        avail_sum[set] = avail_sum[rest]
            + zones
                .get(low)
                .and_then(|z| z.get(rid))
                .copied()
                .unwrap_or(0);
        if alloc_sum[set] >= need {
            min_size = min_size.min(set.count_ones());
        }
        if avail_sum[set] >= need {
            fitting.push(set as u64);
        }
    }
    fitting
        .into_iter()
        .map(|set| TopologyHint {
            affinity: Some(mask_of(numa, set)),
            preferred: set.count_ones() == min_size,
        })
        .collect()
}

struct Unit<'a> {
    name: String,
    requests: &'a [(Option<usize>, String, i64)],
    /// Whether the allocation stays (app containers, sidecars, the pod scope) or is released
    /// before the next unit (init containers).
    holds: bool,
}

fn largest_zone(numa: &NumaTopology, zones: &[Vec<i64>], rid: usize) -> (i64, i64) {
    numa.zones
        .iter()
        .zip(zones)
        .map(|(z, a)| {
            (
                a.get(rid).copied().unwrap_or(0),
                z.allocatable.get(rid).copied().unwrap_or(0),
            )
        })
        .fold((0, 0), |(fa, fc), (a, c)| (fa.max(a), fc.max(c)))
}

/// Admits one unit through the node's Topology Manager and takes its aligned resources from
/// the zones. Returns the NUMA ids used.
fn admit_unit(
    node: &Node,
    numa: &NumaTopology,
    zones: &mut [Vec<i64>],
    unit: &Unit<'_>,
    guaranteed: bool,
    traces: Option<&mut Vec<UnitTrace>>,
) -> Result<NumaMask, Misfit> {
    let managed: Vec<(usize, &str, i64)> = unit
        .requests
        .iter()
        .filter_map(|(rid, name, q)| {
            let rid = (*rid)?;
            (numa.managed.get(rid).copied().unwrap_or(false) && aligned(name, *q, guaranteed))
                .then_some((rid, name.as_str(), *q))
        })
        .collect();
    if managed.is_empty() || numa.policy == Policy::None && traces.is_none() {
        return Ok(NumaMask::EMPTY);
    }
    let mut provider = ProviderHints::new();
    let mut trace_hints = Vec::new();
    for (rid, name, q) in &managed {
        let hints = hints_for(numa, zones, *rid, *q);
        trace_hints.push((name.to_string(), Some(hints.clone())));
        provider.insert(name.to_string(), Some(hints));
    }
    let result = merge(numa.policy, &numa.options, &numa.info, &[provider]);
    if let Some(t) = traces {
        t.push(UnitTrace {
            unit: unit.name.clone(),
            hints: trace_hints,
            merged: result.hint,
            admit: result.admit,
        });
    }
    if !result.admit {
        // Name the resources that cannot be placed narrowly enough on their own; when each
        // could, the conflict is between them.
        let mut details = Vec::new();
        let mut unresolvable = false;
        for (rid, name, q) in &managed {
            let (free, alloc) = largest_zone(numa, zones, *rid);
            if numa.policy == Policy::SingleNumaNode && *q > alloc {
                unresolvable = true;
            }
            if *q > free {
                let where_ = if numa.policy == Policy::SingleNumaNode {
                    "on one NUMA node"
                } else {
                    "within its preferred NUMA zones"
                };
                details.push(format!(
                    "needs {} {name} {where_} under {}; the largest NUMA zone has {} free of {} allocatable",
                    display(name, Milli(*q)),
                    numa.policy,
                    display(name, Milli(free)),
                    display(name, Milli(alloc))
                ));
            }
        }
        if details.is_empty() {
            details.push(format!(
                "{} cannot be aligned on a common NUMA zone set with a preferred hint under {}",
                managed
                    .iter()
                    .map(|(_, n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
                numa.policy
            ));
        }
        return Err(Misfit::Topology {
            node: node.name.clone(),
            policy: numa.policy,
            unit: unit.name.clone(),
            detail: details.join("; "),
            unresolvable,
        });
    }
    if !unit.holds {
        return Ok(result.hint.affinity.unwrap_or(NumaMask::EMPTY));
    }
    // Take from the merged affinity's zones first, then (best-effort, none) from the others.
    let preferred_ids = result.hint.affinity.map_or(u64::MAX, NumaMask::bits);
    let mut used = 0u64;
    for (rid, name, q) in &managed {
        let mut left = *q;
        for pass in [true, false] {
            for (i, z) in numa.zones.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let in_affinity = preferred_ids & (1 << z.id) != 0;
                if in_affinity != pass {
                    continue;
                }
                let slot = &mut zones[i][*rid];
                let take = left.min(*slot).max(0);
                if take > 0 {
                    *slot -= take;
                    left -= take;
                    used |= 1 << z.id;
                }
            }
        }
        if left > 0 {
            let (free, alloc) = largest_zone(numa, zones, *rid);
            return Err(Misfit::Topology {
                node: node.name.clone(),
                policy: numa.policy,
                unit: unit.name.clone(),
                detail: format!(
                    "not enough free {name} in its NUMA zones (largest zone: {} free of {})",
                    display(name, Milli(free)),
                    display(name, Milli(alloc))
                ),
                unresolvable: false,
            });
        }
    }
    Ok(NumaMask(used))
}

/// Places one copy of the pod on `state`, taking what it uses.
fn place_one(
    node: &Node,
    state: &mut NodeState,
    pod: &BoundPod,
    shape: &PodShape,
    pods_id: Option<usize>,
    mut traces: Option<&mut Vec<UnitTrace>>,
) -> Result<NumaMask, Misfit> {
    for (rid, name, q) in &pod.node_request {
        let Some(rid) = *rid else {
            return Err(Misfit::UnknownResource {
                resource: name.clone(),
            });
        };
        let allocatable = node.allocatable.get(rid).copied().unwrap_or(0);
        let free = state.free.get(rid).copied().unwrap_or(0);
        if *q > free {
            return Err(Misfit::Insufficient {
                resource: name.clone(),
                need: *q,
                free,
                allocatable,
                scope: format!("node {}", node.name),
            });
        }
    }
    if let Some(p) = pods_id {
        if node.allocatable.get(p).copied().unwrap_or(0) > 0 && state.free[p] < 1000 {
            return Err(Misfit::Insufficient {
                resource: "pods".into(),
                need: 1000,
                free: state.free[p],
                allocatable: node.allocatable[p],
                scope: format!("node {}", node.name),
            });
        }
    }
    let mut used = NumaMask::EMPTY;
    if let Some(numa) = &node.numa {
        let units: Vec<Unit<'_>> = match numa.scope {
            Scope::Pod => vec![Unit {
                name: "the pod (pod scope)".into(),
                requests: &pod.effective,
                holds: true,
            }],
            Scope::Container => pod
                .containers
                .iter()
                .map(|(kind, name, req)| Unit {
                    name: match kind {
                        ContainerKind::Init => format!("init container {name}"),
                        ContainerKind::Sidecar => format!("sidecar {name}"),
                        ContainerKind::App => format!("container {name}"),
                    },
                    requests: req,
                    holds: *kind != ContainerKind::Init,
                })
                .collect(),
        };
        let mut zones = state.zones.clone();
        for unit in &units {
            let m = admit_unit(
                node,
                numa,
                &mut zones,
                unit,
                shape.guaranteed,
                traces.as_deref_mut(),
            )?;
            if unit.holds {
                used = used | m;
            }
        }
        state.zones = zones;
    }
    for (rid, _, q) in &pod.node_request {
        if let Some(rid) = rid {
            state.free[*rid] -= q;
        }
    }
    if let Some(p) = pods_id {
        state.free[p] -= 1000;
    }
    Ok(used)
}

/// How many copies of the pod (up to `want`) fit on `node` at once, and why not more.
pub fn fit_node(
    node: &Node,
    table: &ResourceTable,
    shape: &PodShape,
    pod: &BoundPod,
    want: usize,
    config: &EngineConfig,
    trace: bool,
) -> NodeFit {
    let mut out = NodeFit {
        count: 0,
        misfit: None,
        zones_used: NumaMask::EMPTY,
        state: NodeState::of(node),
        notes: Vec::new(),
        traces: Vec::new(),
    };
    if let Err(m) = node_accepts(shape, node) {
        out.misfit = Some(m);
        return out;
    }
    if node.numa.is_none() {
        if config.numa_unknown == NumaUnknown::Deny {
            out.misfit = Some(Misfit::NoNumaData {
                node: node.name.clone(),
            });
            return out;
        }
        out.notes.push(format!(
            "node {} publishes no NUMA data: judged on node-level resources only",
            node.name
        ));
    }
    let pods_id = table.id("pods");
    while out.count < want {
        let traces = (trace && out.count == 0).then_some(&mut out.traces);
        match place_one(node, &mut out.state, pod, shape, pods_id, traces) {
            Ok(m) => {
                out.count += 1;
                out.zones_used = out.zones_used | m;
            }
            Err(m) => {
                out.misfit = Some(m);
                break;
            }
        }
    }
    out
}

/// The verdict for a gang of identical pods in one cluster.
#[derive(Debug, Clone)]
pub struct ClusterFit {
    pub cluster: String,
    /// (node index, pods placed there).
    pub placements: Vec<(usize, usize)>,
    pub fitted: usize,
    pub misfit: Option<Misfit>,
    /// 0–10, weighted over the nodes used; 0 when it does not fit.
    pub score: i64,
}

impl ClusterFit {
    pub fn fits(&self) -> bool {
        self.misfit.is_none()
    }
}

/// Whether `n` copies of the pod fit in `cluster` at once, node by node and NUMA zone by NUMA
/// zone; never on sums of free resources. Clusters that cannot possibly fit are rejected from
/// their summary before any node is looked at.
pub fn fit_cluster(
    cluster: &Cluster,
    table: &ResourceTable,
    shape: &PodShape,
    pod: &BoundPod,
    n: usize,
    config: &EngineConfig,
    strategy: Strategy,
) -> ClusterFit {
    let mut out = ClusterFit {
        cluster: cluster.name.clone(),
        placements: Vec::new(),
        fitted: 0,
        misfit: None,
        score: 0,
    };
    if let Some(why) = &cluster.unavailable {
        out.misfit = Some(Misfit::Unavailable(why.clone()));
        return out;
    }
    let s = &cluster.summary;
    for (rid, name, q) in &pod.node_request {
        let Some(rid) = *rid else {
            out.misfit = Some(Misfit::UnknownResource {
                resource: name.clone(),
            });
            return out;
        };
        let free = s.max_free_on_node.get(rid).copied().unwrap_or(0);
        if *q > free {
            out.misfit = Some(Misfit::Insufficient {
                resource: name.clone(),
                need: *q,
                free,
                allocatable: s.max_allocatable_on_node.get(rid).copied().unwrap_or(0),
                scope: format!("the largest node in cluster {}", cluster.name),
            });
            return out;
        }
    }
    // Under single-numa-node everywhere, an aligned resource must fit in one zone.
    if s.single_numa_everywhere {
        let widest = pod
            .containers
            .iter()
            .map(|(_, _, r)| r)
            .chain(std::iter::once(&pod.effective));
        for requests in widest {
            for (rid, name, q) in requests {
                let Some(rid) = *rid else { continue };
                if !aligned(name, *q, shape.guaranteed) {
                    continue;
                }
                let free = s.max_free_in_zone.get(rid).copied().unwrap_or(0);
                let alloc = s.max_allocatable_in_zone.get(rid).copied().unwrap_or(0);
                if *q > free {
                    out.misfit = Some(Misfit::Topology {
                        node: format!("any node of cluster {}", cluster.name),
                        policy: Policy::SingleNumaNode,
                        unit: "the pod".into(),
                        detail: format!(
                            "needs {} {name} on one NUMA node under single-numa-node; the largest NUMA zone in cluster {} has {} free of {} allocatable",
                            display(name, Milli(*q)),
                            cluster.name,
                            display(name, Milli(free)),
                            display(name, Milli(alloc))
                        ),
                        unresolvable: *q > alloc,
                    });
                    return out;
                }
            }
        }
    }
    let mut first_misfit: Option<(bool, Misfit)> = None;
    let mut weighted = 0i64;
    let resources = scored_resources(pod);
    for (i, node) in cluster.nodes.iter().enumerate() {
        if out.fitted >= n {
            break;
        }
        let fit = fit_node(node, table, shape, pod, n - out.fitted, config, false);
        if fit.count > 0 {
            out.fitted += fit.count;
            out.placements.push((i, fit.count));
            weighted += node_score(strategy, node, &fit.state, &resources, fit.zones_used)
                * fit.count as i64;
        }
        // The most telling reason: from a node that took part of the gang, else one that
        // preemption could fix, else the first.
        if let Some(m) = fit.misfit {
            let rank = |partial: bool, m: &Misfit| (partial, !m.unresolvable());
            let better = first_misfit
                .as_ref()
                .is_none_or(|(p, f)| rank(fit.count > 0, &m) > rank(*p, f));
            if better {
                first_misfit = Some((fit.count > 0, m));
            }
        }
    }
    if out.fitted >= n {
        out.score = (weighted as f64 / out.fitted.max(1) as f64).round() as i64;
        return out;
    }
    let cause = first_misfit
        .map(|(_, m)| m)
        .unwrap_or_else(|| Misfit::BadPod(format!("cluster {} has no nodes", cluster.name)));
    out.misfit = Some(if n == 1 && out.fitted == 0 {
        cause
    } else {
        Misfit::Gang {
            cluster: cluster.name.clone(),
            fitted: out.fitted,
            wanted: n,
            cause: Box::new(cause),
        }
    });
    out
}
