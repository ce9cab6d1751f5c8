//! Node fit (resources, taints, node selection, then the node's Topology Manager) and cluster
//! fit for a gang of identical pods, placed one at a time as the kubelets would admit them.

use super::pod::{BoundPod, ContainerKind, NodeSelectorTerm, PodShape, Toleration};
use super::score::{node_score, scored_resources, Strategy};
use super::{EngineConfig, NumaUnknown};
use crate::inventory::{Cluster, Node, NumaTopology, ResourceTable, Scope, Taint};
use crate::quantity::{display, Milli};
use crate::topology::{merge_resources, MergeResult, NumaMask, Policy, TopologyHint};
use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

/// Why a pod does not fit. `unresolvable()` tells kube-scheduler whether preemption could help.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Misfit {
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
        /// Whose Topology Manager: "node NAME", or "every node of cluster NAME" when a
        /// cluster's summary rules the pod out on all of its nodes at once.
        at: String,
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
    /// Every node of the cluster that can take one of the pods has one: they keep one to a
    /// node ([`super::apart`]).
    OnePerNode {
        cluster: String,
    },
    /// The pods spread over nodes ([`super::apart::Spread`]), and the nodes' room within
    /// the spread is too little: no node may take more than `cap` of them, as `least` (the
    /// node counted that takes the fewest, and how many) or too few nodes counted decide.
    Spread {
        cluster: String,
        max_skew: u32,
        cap: usize,
        least: (String, usize),
        /// The nodes counted, when fewer than the constraint's `minDomains`.
        too_few: Option<(usize, u32)>,
        unresolvable: bool,
    },
    /// The pods keep together in one domain of `keys` ([`super::apart`]: a required pod
    /// affinity to one another), and none of the cluster's domains holds them all. `best` is
    /// the domain that holds the most (its label values), with what stops more there; `None`
    /// when no node of the cluster has the keys.
    Together {
        cluster: String,
        keys: Vec<String>,
        domains: usize,
        best: Option<(String, Box<Misfit>)>,
    },
    /// The whole cluster cannot take work now (stale or lost).
    Unavailable(String),
    /// The part of a gang of several pod shapes (a JobSet's replicated Jobs that ask for
    /// different pods) that does not fit, named as a person knows it; placed after the parts
    /// in `beside`, on what they leave.
    Part {
        part: std::sync::Arc<str>,
        beside: Vec<std::sync::Arc<str>>,
        cause: Box<Misfit>,
    },
}

impl Misfit {
    /// Why a gang of `wanted` pods does not fit cluster `cluster`: `fitted` of them did, then
    /// `cause` stopped the next (the cause alone for a single pod that fits nowhere).
    fn of_gang(cluster: &str, fitted: usize, wanted: usize, cause: Misfit) -> Misfit {
        match (wanted, fitted) {
            (1, 0) => cause,
            _ => Misfit::Gang {
                cluster: cluster.to_string(),
                fitted,
                wanted,
                cause: Box::new(cause),
            },
        }
    }

    pub(crate) fn unresolvable(&self) -> bool {
        match self {
            Misfit::UnknownNode(_)
            | Misfit::UnknownResource { .. }
            | Misfit::Taint { .. }
            | Misfit::Selector { .. }
            | Misfit::NoNumaData { .. }
            | Misfit::OnePerNode { .. }
            | Misfit::BadPod(_) => true,
            // It may come back; kube-scheduler should retry.
            Misfit::Unavailable(_) => false,
            Misfit::Insufficient {
                need, allocatable, ..
            } => need > allocatable,
            Misfit::Topology { unresolvable, .. } | Misfit::Spread { unresolvable, .. } => {
                *unresolvable
            }
            Misfit::Gang { cause, .. } | Misfit::Part { cause, .. } => cause.unresolvable(),
            // Labels stay: with no domain, never; else as the domain that holds the most.
            Misfit::Together { best, .. } => best.as_ref().is_none_or(|(_, m)| m.unresolvable()),
        }
    }
}

impl Misfit {
    /// The reason as the extender reports it for a real node: keyed by the node's name
    /// already, so the text leaves the name out, and nodes refused for the same reason get
    /// the same text, which kube-scheduler counts as one line of its FailedScheduling event
    /// ("3475 node(s): ...") instead of one line per node.
    pub(crate) fn on_the_node(&self) -> String {
        let mut out = Whole::new();
        let written = match self {
            Misfit::Insufficient {
                resource,
                need,
                allocatable: 0,
                scope,
                ..
            } if scope.starts_with("node ") => write!(
                out,
                "needs {} {resource}; the node has none",
                Amount(resource, *need)
            ),
            Misfit::Insufficient {
                resource,
                need,
                free,
                allocatable,
                scope,
            } if scope.starts_with("node ") => write!(
                out,
                "needs {} {resource}; the node has {} free of {} allocatable",
                Amount(resource, *need),
                Amount(resource, *free),
                Amount(resource, *allocatable),
            ),
            Misfit::Taint { taint, .. } => write!(
                out,
                "the node has taint {taint} that the pod does not tolerate"
            ),
            Misfit::Selector { detail, .. } => write!(out, "the node {detail}"),
            Misfit::NoNumaData { .. } => write!(
                out,
                "the node publishes no NUMA data (NodeResourceTopology) and numaUnknown is deny"
            ),
            Misfit::Topology {
                policy,
                unit,
                detail,
                ..
            } => write!(
                out,
                "the node's Topology Manager ({policy}) would reject {unit}: {detail}"
            ),
            _ => return self.to_string(),
        };
        match written {
            Ok(()) => out.as_str().to_string(),
            Err(_) => self.to_string(),
        }
    }
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Handed over in one piece, so that `to_string()` allocates once instead of growing
        // fragment by fragment (the extender writes one of these for most nodes it filters).
        let mut whole = Whole::new();
        match self.write_to(&mut whole) {
            Ok(()) => f.write_str(whole.as_str()),
            Err(_) => self.write_to(f),
        }
    }
}

/// A message up to 512 bytes, written in place.
struct Whole {
    bytes: [u8; 512],
    len: usize,
}

impl Whole {
    fn new() -> Self {
        Self {
            bytes: [0; 512],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole `str`s are written in.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for Whole {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// [`display`] of an amount, written without allocating.
struct Amount<'a>(&'a str, i64);

impl fmt::Display for Amount<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (resource, m) = (self.0, Milli(self.1));
        let is_bytes = resource == "memory"
            || resource == "ephemeral-storage"
            || resource.starts_with("hugepages-");
        if is_bytes {
            if let Some(bytes) = m.whole() {
                for (unit, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
                    if bytes != 0 && bytes % (1i64 << shift) == 0 {
                        return write!(f, "{}{unit}", bytes >> shift);
                    }
                }
            }
        }
        write!(f, "{m}")
    }
}

impl Misfit {
    fn write_to(&self, f: &mut dyn fmt::Write) -> fmt::Result {
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
                Amount(resource, *need)
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
                Amount(resource, *need),
                Amount(resource, *free),
                Amount(resource, *allocatable),
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
                at,
                policy,
                unit,
                detail,
                ..
            } => write!(
                f,
                "the Topology Manager of {at} ({policy}) would reject {unit}: {detail}"
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
            Misfit::OnePerNode { cluster } => write!(
                f,
                "its pods keep one to a node (a required pod anti-affinity to one another on {}), and each node of cluster {cluster} holds one",
                super::apart::HOSTNAME
            ),
            Misfit::Spread {
                cluster,
                max_skew,
                cap,
                least,
                too_few,
            ..
            } => {
                write!(
                    f,
                    "its pods spread over nodes (a topology spread constraint on {}, maxSkew {max_skew}): ",
                    super::apart::HOSTNAME
                )?;
                match too_few {
                    Some((counted, min)) => write!(
                        f,
                        "cluster {cluster} has {counted} node(s) it counts, fewer than its minDomains {min}"
                    )?,
                    None => write!(f, "node {} of cluster {cluster} takes {} of them", least.0, least.1)?,
                }
                write!(f, ", so no node may take more than {cap}")
            }
            Misfit::Together {
                cluster,
                keys,
                domains,
                best,
            } => {
                let label = match keys.len() {
                    1 => "label",
                    _ => "labels",
                };
                let keys = keys.join(" and ");
                write!(
                    f,
                    "its pods keep together in one {keys} (a required pod affinity to one another), and "
                )?;
                match best {
                    None => write!(f, "no node of cluster {cluster} has the {label} {keys}"),
                    Some((best, cause)) => write!(
                        f,
                        "none of the {domains} {keys} domain(s) of cluster {cluster} holds them all; in {best}, which holds the most: {cause}"
                    ),
                }
            }
            Misfit::BadPod(m) | Misfit::Unavailable(m) => write!(f, "{m}"),
            Misfit::Part {
                part,
                beside,
                cause,
            } => {
                write!(f, "{part}")?;
                for (i, b) in beside.iter().enumerate() {
                    let joint = if i == 0 { ", beside the pods of" } else { " and" };
                    write!(f, "{joint} {b}")?;
                }
                write!(f, ": {cause}")
            }
        }
    }
}

/// Why one node refuses the pod, in parts borrowed from the node and the pod: made for each
/// of the thousands of nodes a filter refuses, so it writes no text and (but for a topology
/// rejection) allocates nothing. Nodes refused for the same reason give equal refusals, so a
/// caller can spell out each distinct one once; [`Refusal::misfit`] is the misfit it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Refusal<'n> {
    /// Stands in for a misfit the caller has said it will not read (see [`Detail`]).
    Quiet,
    UnknownResource(&'n str),
    /// The node as a whole lacks the room.
    Insufficient(Shortfall<'n>),
    Taint {
        key: &'n str,
        value: Option<&'n str>,
        effect: &'n str,
    },
    NodeSelector {
        key: &'n str,
        value: &'n str,
    },
    NodeAffinity,
    /// The pod's required node affinity cannot be evaluated (its text).
    BadAffinity(String),
    NoNumaData,
    Topology {
        policy: Policy,
        /// `None`: the whole pod (pod scope).
        unit: Option<(ContainerKind, &'n str)>,
        why: TopologyRefusal<'n>,
        unresolvable: bool,
    },
}

/// A resource asked for (`need`) against the room for it (`free` of `allocatable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shortfall<'n> {
    pub resource: &'n str,
    pub(crate) need: i64,
    pub(crate) free: i64,
    pub(crate) allocatable: i64,
}

/// Why a node's Topology Manager refuses a unit; the room is the largest NUMA zone's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopologyRefusal<'n> {
    /// The merge rejects the unit: the aligned resources it cannot place narrowly enough.
    Rejected(Vec<Shortfall<'n>>),
    /// The merge rejects the unit although each of its aligned resources (named) could be
    /// placed narrowly enough on its own.
    Conflict(Vec<&'n str>),
    /// Admitted, but its zones together lack the resource.
    ZonesShort(Shortfall<'n>),
}

impl Refusal<'_> {
    /// The misfit this refusal of `node` stands for.
    pub(crate) fn misfit(&self, node: &Node) -> Misfit {
        let on_node = || node.name.to_string();
        match self {
            Refusal::Quiet => QUIET,
            Refusal::UnknownResource(resource) => Misfit::UnknownResource {
                resource: resource.to_string(),
            },
            Refusal::Insufficient(s) => Misfit::Insufficient {
                resource: s.resource.to_string(),
                need: s.need,
                free: s.free,
                allocatable: s.allocatable,
                scope: format!("node {}", node.name),
            },
            Refusal::Taint { key, value, effect } => Misfit::Taint {
                node: on_node(),
                taint: match value {
                    Some(value) => format!("{key}={value}:{effect}"),
                    None => format!("{key}:{effect}"),
                },
            },
            Refusal::NodeSelector { key, value } => Misfit::Selector {
                node: on_node(),
                detail: format!("does not have label {key}={value} (nodeSelector)"),
            },
            Refusal::NodeAffinity => Misfit::Selector {
                node: on_node(),
                detail: "does not match the pod's required node affinity".into(),
            },
            Refusal::BadAffinity(e) => Misfit::BadPod(format!("required node affinity: {e}")),
            Refusal::NoNumaData => Misfit::NoNumaData { node: on_node() },
            Refusal::Topology {
                policy,
                unit,
                why,
                unresolvable,
            } => Misfit::Topology {
                at: format!("node {}", node.name),
                policy: *policy,
                unit: unit_name(*unit),
                detail: why.detail(*policy),
                unresolvable: *unresolvable,
            },
        }
    }
}

impl TopologyRefusal<'_> {
    fn detail(&self, policy: Policy) -> String {
        match self {
            TopologyRefusal::Rejected(shortfalls) => {
                let where_ = if policy == Policy::SingleNumaNode {
                    "on one NUMA node"
                } else {
                    "within its preferred NUMA zones"
                };
                let details: Vec<String> = shortfalls
                    .iter()
                    .map(|s| {
                        format!(
                            "needs {} {} {where_} under {policy}; the largest NUMA zone has {} free of {} allocatable",
                            Amount(s.resource, s.need),
                            s.resource,
                            Amount(s.resource, s.free),
                            Amount(s.resource, s.allocatable)
                        )
                    })
                    .collect();
                details.join("; ")
            }
            TopologyRefusal::Conflict(resources) => format!(
                "{} cannot be aligned on a common NUMA zone set with a preferred hint under {policy}",
                resources.join(", ")
            ),
            TopologyRefusal::ZonesShort(s) => format!(
                "not enough free {} in its NUMA zones (largest zone: {} free of {})",
                s.resource,
                Amount(s.resource, s.free),
                Amount(s.resource, s.allocatable)
            ),
        }
    }
}

/// A node's free amounts during a simulation: node level, and per NUMA zone.
#[derive(Debug, Clone)]
pub(crate) struct NodeState {
    pub(crate) free: Vec<i64>,
    pub(crate) zones: Vec<Vec<i64>>,
}

impl NodeState {
    pub(crate) fn of(node: &Node) -> Self {
        Self {
            free: (0..node.allocatable.len()).map(|r| node.free(r)).collect(),
            zones: node
                .numa
                .as_ref()
                .map(|n| n.zones.iter().map(|z| z.available.clone()).collect())
                .unwrap_or_default(),
        }
    }

    /// Becomes `NodeState::of(node)`, but for the zones of a NUMA-aware node, which
    /// [`NodeState::refill_zones`] adds; buffers are reused, those of zones the node lacks
    /// kept in `spare`.
    fn refill_free(&mut self, node: &Node, spare: &mut Vec<Vec<i64>>) {
        self.free.clear();
        self.free
            .extend((0..node.allocatable.len()).map(|r| node.free(r)));
        if node.numa.is_none() {
            spare.append(&mut self.zones);
        }
    }

    fn refill_zones(&mut self, numa: &NumaTopology, spare: &mut Vec<Vec<i64>>) {
        // Nodes of a cluster have different zone counts: buffers move to and from `spare`
        // rather than being freed and allocated again.
        if self.zones.len() > numa.zones.len() {
            spare.extend(self.zones.drain(numa.zones.len()..));
        }
        for (i, z) in numa.zones.iter().enumerate() {
            let v = match self.zones.get_mut(i) {
                Some(v) => v,
                None => {
                    self.zones.push(spare.pop().unwrap_or_default());
                    &mut self.zones[i]
                }
            };
            v.clear();
            v.extend_from_slice(&z.available);
        }
    }
}

/// Working space of a fit, reused from node to node.
#[derive(Default)]
struct Scratch {
    /// What the units admitted so far took: (zone index, resource, amount).
    taken: Vec<(usize, usize, i64)>,
    /// Zone buffers of a [`NodeState`] that had more zones than the node at hand.
    spare_zones: Vec<Vec<i64>>,
}

/// How one unit (a container, or the whole pod under the pod scope) was judged.
#[derive(Debug, Clone)]
pub(crate) struct UnitTrace {
    pub(crate) unit: String,
    pub(crate) hints: Vec<(String, Option<Vec<TopologyHint>>)>,
    pub(crate) merged: TopologyHint,
    pub(crate) admit: bool,
}

/// The verdict for one node.
#[derive(Debug, Clone)]
pub(crate) struct NodeFit {
    /// How many copies of the pod fit at once (up to the number asked for).
    pub(crate) count: usize,
    pub(crate) misfit: Option<Misfit>,
    /// NUMA ids used by the placed copies.
    pub(crate) zones_used: NumaMask,
    pub(crate) state: NodeState,
    pub(crate) notes: Vec<String>,
    pub(crate) traces: Vec<UnitTrace>,
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
        if !requirement_matches(node.labels.get(&e.key), &e.operator, &e.values)? {
            return Ok(false);
        }
    }
    for e in &term.match_fields {
        let value = (e.key == "metadata.name").then_some(&*node.name);
        if !requirement_matches(value, &e.operator, &e.values)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The pod as the nodes of a worker must take it when kube-scheduler offers it the worker's
/// virtual node `virtual_node`, which carries `own` as labels of its own (not its nodes').
///
/// kube-scheduler has matched the pod's node selection against the virtual node already. What
/// it asks of `own` keys (and any `matchFields`, which name the virtual node) is about the
/// virtual node, so it is checked here against `own` and then dropped: the worker's nodes
/// never carry those labels. The rest of each required term that the virtual node satisfies
/// is still required of the worker's nodes. Borrowed when nothing is about the virtual node.
pub fn shape_for_cluster_nodes<'s>(
    shape: &'s PodShape,
    virtual_node: &str,
    own: &std::collections::BTreeMap<String, String>,
) -> Result<std::borrow::Cow<'s, PodShape>, Misfit> {
    let selector_own = shape.node_selector.keys().any(|k| own.contains_key(k));
    let terms_own = shape.required_terms.iter().flatten().any(|t| {
        !t.match_fields.is_empty() || t.match_expressions.iter().any(|e| own.contains_key(&e.key))
    });
    if !selector_own && !terms_own {
        return Ok(std::borrow::Cow::Borrowed(shape));
    }
    let refused = |detail: String| Misfit::Selector {
        node: virtual_node.to_string(),
        detail,
    };
    let mut out = shape.clone();
    for (k, v) in &shape.node_selector {
        if let Some(have) = own.get(k) {
            if have != v {
                return Err(refused(format!(
                    "does not have label {k}={v} (nodeSelector)"
                )));
            }
            out.node_selector.remove(k);
        }
    }
    if let Some(terms) = &shape.required_terms {
        let mut left = Vec::new();
        let mut unconstrained = false;
        for t in terms {
            if t.match_expressions.is_empty() && t.match_fields.is_empty() {
                // Matches no node, virtual or not.
                continue;
            }
            let mut rest = NodeSelectorTerm::default();
            let mut holds = true;
            for e in &t.match_expressions {
                match own.get(&e.key) {
                    Some(v) => {
                        let ok = requirement_matches(Some(v), &e.operator, &e.values)
                            .map_err(|e| Misfit::BadPod(format!("required node affinity: {e}")))?;
                        holds &= ok;
                    }
                    // A label the virtual node does not own: the worker's nodes decide.
                    None => rest.match_expressions.push(e.clone()),
                }
            }
            for e in &t.match_fields {
                let value = (e.key == "metadata.name").then_some(virtual_node);
                holds &= requirement_matches(value, &e.operator, &e.values)
                    .map_err(|e| Misfit::BadPod(format!("required node affinity: {e}")))?;
            }
            if !holds {
                continue;
            }
            if rest.match_expressions.is_empty() {
                unconstrained = true;
            } else {
                left.push(rest);
            }
        }
        if !unconstrained && left.is_empty() {
            return Err(refused(
                "does not match the pod's required node affinity".into(),
            ));
        }
        out.required_terms = (!unconstrained).then_some(left);
    }
    Ok(std::borrow::Cow::Owned(out))
}

/// Taints, nodeSelector and required node affinity: the checks preemption cannot change.
pub(crate) fn node_accepts(shape: &PodShape, node: &Node) -> Result<(), Misfit> {
    node_refusal(shape, node).map_err(|r| r.misfit(node))
}

/// [`node_accepts`], refusing in borrowed parts.
fn node_refusal<'n>(shape: &'n PodShape, node: &'n Node) -> Result<(), Refusal<'n>> {
    taint_refusal(shape, node)?;
    affinity_refusal(shape, node)
}

/// Whether `spread` counts `node`, with the pods of `shape` on it (see
/// [`super::apart::Spread`]).
pub(crate) fn counted_by_spread(
    spread: &super::apart::Spread,
    shape: &PodShape,
    node: &Node,
) -> bool {
    (!spread.honor_affinity || affinity_refusal(shape, node).is_ok())
        && (!spread.honor_taints || taint_refusal(shape, node).is_ok())
}

/// The taint of `node` (but `PreferNoSchedule`) that the pod does not tolerate, if any.
fn taint_refusal<'n>(shape: &'n PodShape, node: &'n Node) -> Result<(), Refusal<'n>> {
    for taint in node.taints.iter() {
        if taint.effect == "PreferNoSchedule" {
            continue;
        }
        if !shape
            .tolerations
            .iter()
            .any(|t| toleration_matches(t, taint))
        {
            return Err(Refusal::Taint {
                key: &taint.key,
                value: taint.value.as_deref(),
                effect: &taint.effect,
            });
        }
    }
    Ok(())
}

/// Whether the pod's node selector and required node affinity accept `node`'s labels.
fn affinity_refusal<'n>(shape: &'n PodShape, node: &'n Node) -> Result<(), Refusal<'n>> {
    for (k, v) in &shape.node_selector {
        if node.labels.get(k) != Some(v.as_str()) {
            return Err(Refusal::NodeSelector { key: k, value: v });
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
                Err(e) => return Err(Refusal::BadAffinity(e)),
            }
        }
        if !any {
            return Err(Refusal::NodeAffinity);
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
    let min_size = minimal_size(numa, n, rid, need).unwrap_or(u32::MAX);
    // Subset sums and masks built from the subset without its lowest zone: one step per set.
    let size = 1usize << n;
    let mut sums = vec![(0i64, 0u64); size];
    let mut out = Vec::with_capacity(size - 1);
    for set in 1..size {
        let low = set.trailing_zeros() as usize;
        let (sum, mask) = sums[set & (set - 1)];
        let entry = (
            sum + zones
                .get(low)
                .and_then(|z| z.get(rid))
                .copied()
                .unwrap_or(0),
            mask | 1 << numa.zones[low].id,
        );
        sums[set] = entry;
        if entry.0 >= need {
            out.push(TopologyHint {
                affinity: Some(NumaMask(entry.1)),
                preferred: set.count_ones() == min_size,
            });
        }
    }
    out
}

/// The fewest of the first `n` zones whose allocatable amounts of `rid` add up to `need`:
/// the k largest zones are the best k-set.
fn minimal_size(numa: &NumaTopology, n: usize, rid: usize, need: i64) -> Option<u32> {
    let mut sorted = [0i64; 16];
    for (s, z) in sorted.iter_mut().zip(&numa.zones[..n]) {
        *s = z.allocatable.get(rid).copied().unwrap_or(0);
    }
    let sorted = &mut sorted[..n];
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0i64;
    sorted
        .iter()
        .position(|a| {
            sum = sum.saturating_add(*a);
            sum >= need
        })
        .map(|k| k as u32 + 1)
}

struct Unit<'a> {
    /// `None`: the whole pod (pod scope).
    container: Option<(ContainerKind, &'a str)>,
    requests: &'a [(Option<usize>, String, i64)],
    /// Whether the allocation stays (app containers, sidecars, the pod scope) or is released
    /// before the next unit (init containers).
    holds: bool,
}

/// A unit spelled out, only for traces and misfits.
fn unit_name(container: Option<(ContainerKind, &str)>) -> String {
    match container {
        None => "the pod (pod scope)".into(),
        Some((ContainerKind::Init, name)) => format!("init container {name}"),
        Some((ContainerKind::Sidecar, name)) => format!("sidecar {name}"),
        Some((ContainerKind::App, name)) => format!("container {name}"),
    }
}

/// What [`Refusal::Quiet`] stands for: building the text of every rejection costs more than
/// judging the node.
const QUIET: Misfit = Misfit::BadPod(String::new());

/// What of a verdict a caller reads.
#[derive(Debug, Clone, Copy)]
struct Detail {
    /// Whether best-effort nodes may take a pod's aligned resources from any of their zones
    /// when telling the merged affinity would take the full merge. Best-effort admits every
    /// pod, and a take only fails when the zones together lack the amount (having emptied
    /// them all, which its misfit reports), so neither how many copies fit nor why no more
    /// do depends on it: only the zones' state and the zones used do.
    any_zones: bool,
    /// The misfit, when no copy of the pod was placed on the node; when some were.
    misfit_if_none: bool,
    misfit_if_some: bool,
    notes: bool,
    /// The state of a node where no copy was placed (without it, its zones are only read
    /// from the node when the NUMA check is reached: they are most of a node's memory).
    state_if_none: bool,
}

impl Detail {
    const ALL: Self = Self {
        any_zones: false,
        misfit_if_none: true,
        misfit_if_some: true,
        notes: true,
        state_if_none: true,
    };
}

/// How much of one placement attempt is read: with `quiet`, a failure returns [`QUIET`];
/// `any_zones` as in [`Detail`].
#[derive(Debug, Clone, Copy)]
struct How {
    quiet: bool,
    any_zones: bool,
}

/// What the Topology Manager decides on the hints [`hints_for`] would generate, when that
/// can be told without generating and merging them.
enum Quick {
    Admit(TopologyHint),
    Reject,
    /// Only the full merge can tell.
    Unknown,
}

/// The merge outcome for hints as [`hints_for`] generates them, computed directly when some
/// zone set is preferred by every resource (the usual case), and otherwise when the policy
/// rejects every unpreferred result (restricted, single-numa-node).
///
/// Those hints have no affinity-free entries and a resource's preferred hints all have its
/// minimal size, so the sets every resource prefers (the merge's preferred candidates) are
/// the sets of that common size whose available amounts cover every resource; there are none
/// unless all resources share the minimal size (1 under single-numa-node, whose other hints
/// are not merged). The merge picks the narrowest of them (fewest nodes, then the
/// prefer-closest distance, then the smaller mask), preferred, so admitted. Without any, the
/// result is unpreferred: rejected by restricted and single-numa-node; best-effort admits it
/// with an affinity only the full merge finds.
///
/// Zone ids must be distinct and within the machine's NUMA nodes (as the inventory builds
/// them), so that index sets and masks correspond one to one; otherwise `Unknown`.
fn quick_merge(numa: &NumaTopology, zones: &[Vec<i64>], managed: &[(usize, &str, i64)]) -> Quick {
    let policy = numa.policy;
    let none_preferred = || {
        if policy == Policy::BestEffort {
            Quick::Unknown
        } else {
            Quick::Reject
        }
    };
    if policy == Policy::None || managed.is_empty() {
        return Quick::Unknown;
    }
    let n = numa.zones.len().min(16);
    let all = numa.info.default_mask().bits();
    let mut ids = 0u64;
    for z in &numa.zones[..n] {
        if z.id > NumaMask::MAX_ID || ids & (1 << z.id) != 0 {
            return Quick::Unknown;
        }
        ids |= 1 << z.id;
    }
    if n == 0 || ids & !all != 0 {
        return Quick::Unknown;
    }
    // Every resource's minimal zone count on allocatable amounts must be the same.
    let mut size = None;
    for &(rid, _, need) in managed {
        if need <= 0 {
            return Quick::Unknown;
        }
        let Some(k) = minimal_size(numa, n, rid, need) else {
            return none_preferred();
        };
        match size {
            None => size = Some(k),
            Some(s) if s != k => return none_preferred(),
            Some(_) => {}
        }
    }
    let Some(m) = size else {
        return Quick::Unknown;
    };
    if policy == Policy::SingleNumaNode && m != 1 {
        return none_preferred();
    }
    let closest = policy != Policy::SingleNumaNode && numa.options.prefer_closest_numa;
    let mut best: Option<(u64, f64)> = None;
    // Every set of m of the n zones, in increasing order (Gosper's hack).
    let mut set: u64 = (1 << m) - 1;
    while set < 1 << n {
        let covers = managed.iter().all(|&(rid, _, need)| {
            let mut sum = 0i64;
            let mut rest = set;
            while rest != 0 {
                let i = rest.trailing_zeros() as usize;
                sum =
                    sum.saturating_add(zones.get(i).and_then(|z| z.get(rid)).copied().unwrap_or(0));
                rest &= rest - 1;
            }
            sum >= need
        });
        if covers {
            let mask = mask_of(numa, set).bits();
            // As the merge ranks equally wide masks: the lower average distance (a missing
            // distance last), then the smaller mask.
            let distance = if closest {
                numa.info
                    .average_distance(NumaMask(mask))
                    .unwrap_or(f64::INFINITY)
            } else {
                0.0
            };
            let better = best.is_none_or(|(b, d)| distance < d || (distance == d && mask < b));
            if better {
                best = Some((mask, distance));
            }
        }
        let low = set & set.wrapping_neg();
        let ripple = set + low;
        set = (((ripple ^ set) >> 2) / low) | ripple;
    }
    match best {
        None => none_preferred(),
        Some((mask, _)) => Quick::Admit(TopologyHint {
            // single-numa-node reports an all-nodes result as no affinity.
            affinity: (policy != Policy::SingleNumaNode || mask != all).then_some(NumaMask(mask)),
            preferred: true,
        }),
    }
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
/// the zones, noting each amount taken in `taken` (zone index, resource, amount). Returns the
/// NUMA ids used.
#[allow(clippy::too_many_arguments)]
fn admit_unit<'n>(
    numa: &NumaTopology,
    zones: &mut [Vec<i64>],
    taken: &mut Vec<(usize, usize, i64)>,
    unit: &Unit<'n>,
    guaranteed: bool,
    traces: Option<&mut Vec<UnitTrace>>,
    how: How,
) -> Result<NumaMask, Refusal<'n>> {
    let managed = Managed::of(numa, unit, guaranteed);
    let managed = managed.as_slice();
    if managed.is_empty() || numa.policy == Policy::None && traces.is_none() {
        return Ok(NumaMask::EMPTY);
    }
    let result = merge_unit(numa, zones, unit, managed, traces, how);
    if !result.admit {
        if how.quiet {
            return Err(Refusal::Quiet);
        }
        return Err(topology_refusal(numa, zones, unit, managed));
    }
    if !unit.holds {
        return Ok(result.hint.affinity.unwrap_or(NumaMask::EMPTY));
    }
    take_aligned(
        numa,
        zones,
        taken,
        unit,
        managed,
        result.hint.affinity,
        how.quiet,
    )
}

/// The requests of a unit that its node's Topology Manager aligns: (resource id, name,
/// amount). A pod asks for a few resources: they are kept in place unless there are more
/// than 8.
struct Managed<'n> {
    few: [(usize, &'n str, i64); 8],
    many: Vec<(usize, &'n str, i64)>,
    count: usize,
}

impl<'n> Managed<'n> {
    fn of(numa: &NumaTopology, unit: &Unit<'n>, guaranteed: bool) -> Self {
        let mut m = Self {
            few: [(0, "", 0); 8],
            many: Vec::new(),
            count: 0,
        };
        for (rid, name, q) in unit.requests {
            let Some(rid) = *rid else { continue };
            if !(numa.managed.get(rid).copied().unwrap_or(false) && aligned(name, *q, guaranteed)) {
                continue;
            }
            let entry = (rid, name.as_str(), *q);
            match m.few.get_mut(m.count) {
                Some(slot) => *slot = entry,
                None => {
                    if m.many.is_empty() {
                        m.many.extend_from_slice(&m.few);
                    }
                    m.many.push(entry);
                }
            }
            m.count += 1;
        }
        m
    }

    fn as_slice(&self) -> &[(usize, &'n str, i64)] {
        if self.count <= self.few.len() {
            &self.few[..self.count]
        } else {
            &self.many
        }
    }
}

/// The Topology Manager's merge of the unit's hints: told directly by [`quick_merge`] when
/// it can, else by generating and merging the hints (always when `traces` are asked for,
/// which record them).
fn merge_unit(
    numa: &NumaTopology,
    zones: &[Vec<i64>],
    unit: &Unit<'_>,
    managed: &[(usize, &str, i64)],
    traces: Option<&mut Vec<UnitTrace>>,
    how: How,
) -> MergeResult {
    let quick = match traces {
        None => match quick_merge(numa, zones, managed) {
            Quick::Unknown if how.any_zones && numa.policy == Policy::BestEffort => {
                Quick::Admit(TopologyHint {
                    affinity: None,
                    preferred: false,
                })
            }
            quick => quick,
        },
        Some(_) => Quick::Unknown,
    };
    match quick {
        Quick::Admit(hint) => MergeResult { hint, admit: true },
        // Only the admission is read from a rejected merge without traces.
        Quick::Reject => MergeResult {
            hint: TopologyHint {
                affinity: None,
                preferred: false,
            },
            admit: false,
        },
        Quick::Unknown => {
            // In the order of the names, as a provider's map would list them.
            let hints: Vec<Vec<TopologyHint>> = managed
                .iter()
                .map(|(rid, _, q)| hints_for(numa, zones, *rid, *q))
                .collect();
            let lists: Vec<Option<&[TopologyHint]>> =
                hints.iter().map(|h| Some(h.as_slice())).collect();
            let result = merge_resources(numa.policy, &numa.options, &numa.info, &lists);
            if let Some(t) = traces {
                t.push(UnitTrace {
                    unit: unit_name(unit.container),
                    hints: managed
                        .iter()
                        .zip(hints)
                        .map(|((_, name, _), h)| (name.to_string(), Some(h)))
                        .collect(),
                    merged: result.hint,
                    admit: result.admit,
                });
            }
            result
        }
    }
}

/// Why the Topology Manager rejected the unit: the resources that cannot be placed narrowly
/// enough on their own; when each could, the conflict between them.
fn topology_refusal<'n>(
    numa: &NumaTopology,
    zones: &[Vec<i64>],
    unit: &Unit<'n>,
    managed: &[(usize, &'n str, i64)],
) -> Refusal<'n> {
    let mut unresolvable = false;
    let mut shortfalls = Vec::new();
    for &(rid, resource, need) in managed {
        let (free, allocatable) = largest_zone(numa, zones, rid);
        if numa.policy == Policy::SingleNumaNode && need > allocatable {
            unresolvable = true;
        }
        if need > free {
            shortfalls.push(Shortfall {
                resource,
                need,
                free,
                allocatable,
            });
        }
    }
    let why = if shortfalls.is_empty() {
        TopologyRefusal::Conflict(managed.iter().map(|(_, name, _)| *name).collect())
    } else {
        TopologyRefusal::Rejected(shortfalls)
    };
    Refusal::Topology {
        policy: numa.policy,
        unit: unit.container,
        why,
        unresolvable,
    }
}

/// Takes the unit's aligned resources from the zones of the merged `affinity` first, then
/// (best-effort, none) from the others, noting each amount in `taken`. Returns the NUMA ids
/// used.
fn take_aligned<'n>(
    numa: &NumaTopology,
    zones: &mut [Vec<i64>],
    taken: &mut Vec<(usize, usize, i64)>,
    unit: &Unit<'n>,
    managed: &[(usize, &'n str, i64)],
    affinity: Option<NumaMask>,
    quiet: bool,
) -> Result<NumaMask, Refusal<'n>> {
    let preferred_ids = affinity.map_or(u64::MAX, NumaMask::bits);
    let mut used = 0u64;
    for &(rid, name, q) in managed {
        let mut left = q;
        for pass in [true, false] {
            for (i, z) in numa.zones.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let in_affinity = preferred_ids & (1 << z.id) != 0;
                if in_affinity != pass {
                    continue;
                }
                let slot = &mut zones[i][rid];
                let take = left.min(*slot).max(0);
                if take > 0 {
                    *slot -= take;
                    taken.push((i, rid, take));
                    left -= take;
                    used |= 1 << z.id;
                }
            }
        }
        if left > 0 {
            if quiet {
                return Err(Refusal::Quiet);
            }
            let (free, allocatable) = largest_zone(numa, zones, rid);
            return Err(Refusal::Topology {
                policy: numa.policy,
                unit: unit.container,
                why: TopologyRefusal::ZonesShort(Shortfall {
                    resource: name,
                    need: q,
                    free,
                    allocatable,
                }),
                unresolvable: false,
            });
        }
    }
    Ok(NumaMask(used))
}

/// Places one copy of the pod on `state`, taking what it uses; on failure `state` is left as
/// it was. With `zones_stale`, the state's zones are read from the node first if they are
/// needed.
#[allow(clippy::too_many_arguments)]
fn place_one<'n>(
    node: &Node,
    state: &mut NodeState,
    zones_stale: &mut bool,
    scratch: &mut Scratch,
    pod: &'n BoundPod,
    shape: &PodShape,
    pods_id: Option<usize>,
    mut traces: Option<&mut Vec<UnitTrace>>,
    how: How,
) -> Result<NumaMask, Refusal<'n>> {
    let quiet = how.quiet;
    for (rid, name, q) in &pod.node_request {
        let Some(rid) = *rid else {
            return Err(Refusal::UnknownResource(name));
        };
        let allocatable = node.allocatable.get(rid).copied().unwrap_or(0);
        let free = state.free.get(rid).copied().unwrap_or(0);
        if *q > free {
            if quiet {
                return Err(Refusal::Quiet);
            }
            return Err(Refusal::Insufficient(Shortfall {
                resource: name,
                need: *q,
                free,
                allocatable,
            }));
        }
    }
    if let Some(p) = pods_id {
        if node.allocatable.get(p).copied().unwrap_or(0) > 0 && state.free[p] < 1000 {
            if quiet {
                return Err(Refusal::Quiet);
            }
            return Err(Refusal::Insufficient(Shortfall {
                resource: "pods",
                need: 1000,
                free: state.free[p],
                allocatable: node.allocatable[p],
            }));
        }
    }
    let mut used = NumaMask::EMPTY;
    if let Some(numa) = &node.numa {
        if *zones_stale {
            state.refill_zones(numa, &mut scratch.spare_zones);
            *zones_stale = false;
        }
        let pod_scope = [Unit {
            container: None,
            requests: &pod.effective,
            holds: true,
        }];
        let containers = pod.containers.iter().map(|(kind, name, req)| Unit {
            container: Some((*kind, name.as_str())),
            requests: req,
            holds: *kind != ContainerKind::Init,
        });
        let units: &mut dyn Iterator<Item = Unit<'_>> = match numa.scope {
            Scope::Pod => &mut pod_scope.into_iter(),
            Scope::Container => &mut { containers },
        };
        let taken = &mut scratch.taken;
        taken.clear();
        for unit in units {
            let admitted = admit_unit(
                numa,
                &mut state.zones,
                taken,
                &unit,
                shape.guaranteed,
                traces.as_deref_mut(),
                how,
            );
            match admitted {
                Ok(m) if unit.holds => used = used | m,
                Ok(_) => {}
                Err(m) => {
                    // Give back what the units admitted so far took.
                    for &(zone, rid, amount) in taken.iter() {
                        state.zones[zone][rid] += amount;
                    }
                    return Err(m);
                }
            }
        }
    }
    for (rid, _, q) in &pod.node_request {
        if let Some(rid) = rid {
            state.free[*rid] = state.free[*rid].saturating_sub(*q);
        }
    }
    if let Some(p) = pods_id {
        state.free[p] -= 1000;
    }
    Ok(used)
}

/// How many copies of the pod (up to `want`) fit on `node` at once, and why not more.
pub(crate) fn fit_node(
    node: &Node,
    table: &ResourceTable,
    shape: &PodShape,
    pod: &BoundPod,
    want: usize,
    config: &EngineConfig,
    trace: bool,
) -> NodeFit {
    fit_node_with(
        node,
        shape,
        pod,
        table.id("pods"),
        want,
        config,
        trace,
        Detail::ALL,
        NodeState::of(node),
        &mut Scratch::default(),
    )
    .into_node_fit(node)
}

/// A [`NodeFit`] whose misfit is still a [`Refusal`].
struct Fitted<'n> {
    count: usize,
    refusal: Option<Refusal<'n>>,
    zones_used: NumaMask,
    state: NodeState,
    notes: Vec<String>,
    traces: Vec<UnitTrace>,
}

impl Fitted<'_> {
    fn into_node_fit(self, node: &Node) -> NodeFit {
        NodeFit {
            count: self.count,
            misfit: self.refusal.map(|r| r.misfit(node)),
            zones_used: self.zones_used,
            state: self.state,
            notes: self.notes,
            traces: self.traces,
        }
    }
}

/// [`fit_node`] on `state` (refilled from `node`, its buffers reused) with `scratch` as
/// working space, reporting only what `detail` asks for.
#[allow(clippy::too_many_arguments)]
fn fit_node_with<'n>(
    node: &'n Node,
    shape: &'n PodShape,
    pod: &'n BoundPod,
    pods_id: Option<usize>,
    want: usize,
    config: &EngineConfig,
    trace: bool,
    detail: Detail,
    mut state: NodeState,
    scratch: &mut Scratch,
) -> Fitted<'n> {
    // Most nodes of a busy cluster lack room for even one copy: when nobody reads why nor
    // the node's state, say so before copying anything.
    if !detail.misfit_if_none && !detail.state_if_none && !trace {
        let short = pod
            .node_request
            .iter()
            .any(|(rid, _, q)| rid.is_some_and(|r| node.free(r) < *q));
        if short {
            return Fitted {
                count: 0,
                refusal: Some(Refusal::Quiet),
                zones_used: NumaMask::EMPTY,
                state,
                notes: Vec::new(),
                traces: Vec::new(),
            };
        }
    }
    state.refill_free(node, &mut scratch.spare_zones);
    let mut zones_stale = false;
    if let Some(numa) = &node.numa {
        if detail.state_if_none {
            state.refill_zones(numa, &mut scratch.spare_zones);
        } else {
            zones_stale = true;
        }
    }
    let mut out = Fitted {
        count: 0,
        refusal: None,
        zones_used: NumaMask::EMPTY,
        state,
        notes: Vec::new(),
        traces: Vec::new(),
    };
    if let Err(r) = node_refusal(shape, node) {
        out.refusal = Some(r);
        return out;
    }
    if node.numa.is_none() {
        if config.numa_unknown == NumaUnknown::Deny {
            out.refusal = Some(Refusal::NoNumaData);
            return out;
        }
        if detail.notes {
            out.notes.push(format!(
                "node {} publishes no NUMA data: judged on node-level resources only",
                node.name
            ));
        }
    }
    // Pods that keep one to a node: the rest of the gang goes elsewhere, with no refusal
    // from this node.
    let want = if shape.one_per_node {
        want.min(1)
    } else {
        want
    };
    while out.count < want {
        let traces = (trace && out.count == 0).then_some(&mut out.traces);
        let how = How {
            quiet: if out.count == 0 {
                !detail.misfit_if_none
            } else {
                !detail.misfit_if_some
            },
            any_zones: detail.any_zones,
        };
        match place_one(
            node,
            &mut out.state,
            &mut zones_stale,
            scratch,
            pod,
            shape,
            pods_id,
            traces,
            how,
        ) {
            Ok(m) => {
                out.count += 1;
                out.zones_used = out.zones_used | m;
            }
            Err(r) => {
                out.refusal = Some(r);
                break;
            }
        }
    }
    out
}

/// One pod judged on many nodes in turn, one copy each, as the extender's filter does: the
/// same verdicts and scores as [`fit_node`] with [`node_score`], without the work nobody
/// reads (notes, the state of a node that refuses the pod, the exact zones of a best-effort
/// node when the strategy does not score zones) and with its buffers reused from node to node.
pub(crate) struct NodeJudge<'a> {
    shape: &'a PodShape,
    pod: &'a BoundPod,
    config: &'a EngineConfig,
    strategy: Strategy,
    pods_id: Option<usize>,
    resources: Vec<usize>,
    state: NodeState,
    scratch: Scratch,
}

impl<'a> NodeJudge<'a> {
    pub(crate) fn new(
        table: &ResourceTable,
        shape: &'a PodShape,
        pod: &'a BoundPod,
        config: &'a EngineConfig,
        strategy: Strategy,
    ) -> Self {
        Self {
            shape,
            pod,
            config,
            strategy,
            pods_id: table.id("pods"),
            resources: scored_resources(pod),
            state: NodeState {
                free: Vec::new(),
                zones: Vec::new(),
            },
            scratch: Scratch::default(),
        }
    }

    /// [`fit_node_with`] on `node` with this judge's buffers; the caller hands `fit.state`
    /// back to `self.state` once it has read it.
    fn run<'n>(&mut self, node: &'n Node, want: usize, detail: Detail) -> Fitted<'n>
    where
        'a: 'n,
    {
        let state = std::mem::replace(
            &mut self.state,
            NodeState {
                free: Vec::new(),
                zones: Vec::new(),
            },
        );
        fit_node_with(
            node,
            self.shape,
            self.pod,
            self.pods_id,
            want,
            self.config,
            false,
            detail,
            state,
            &mut self.scratch,
        )
    }

    /// The node's score (0–10) when one copy of the pod fits on it, else why not.
    pub(crate) fn score(&mut self, node: &Node) -> Result<i64, Misfit> {
        self.verdict(node).map_err(|r| r.misfit(node))
    }

    /// [`NodeJudge::score`], telling why not as a [`Refusal`].
    pub(crate) fn verdict<'n>(&mut self, node: &'n Node) -> Result<i64, Refusal<'n>>
    where
        'a: 'n,
    {
        let detail = Detail {
            any_zones: self.strategy != Strategy::LeastNumaNodes,
            misfit_if_none: true,
            misfit_if_some: true,
            notes: false,
            state_if_none: false,
        };
        let fit = self.run(node, 1, detail);
        let verdict = match fit.refusal {
            Some(r) if fit.count == 0 => Err(r),
            _ => Ok(node_score(
                self.strategy,
                node,
                &fit.state,
                &self.resources,
                fit.zones_used,
            )),
        };
        self.state = fit.state;
        verdict
    }

    /// How many copies of the pod (up to `want`) fit on the node at once: [`fit_node`]'s
    /// count, without its misfit, state or zones.
    pub(crate) fn count(&mut self, node: &Node, want: usize) -> usize {
        let detail = Detail {
            // The count does not depend on which zones best-effort takes from (see Detail).
            any_zones: true,
            misfit_if_none: false,
            misfit_if_some: false,
            notes: false,
            state_if_none: false,
        };
        let fit = self.run(node, want, detail);
        self.state = fit.state;
        fit.count
    }
}

/// The verdict for a gang of identical pods in one cluster.
#[derive(Debug, Clone)]
pub struct ClusterFit {
    pub cluster: String,
    /// (node index, pods placed there).
    pub placements: Vec<(usize, usize)>,
    pub fitted: usize,
    pub(crate) misfit: Option<Misfit>,
    /// 0–10, weighted over the nodes used; 0 when it does not fit.
    pub score: i64,
}

impl ClusterFit {
    pub fn fits(&self) -> bool {
        self.misfit.is_none()
    }

    /// The gang of `wanted` pods does not fit `cluster`: `fitted` of them would, then `cause`
    /// stops the next (see [`Misfit::of_gang`]); no placement is kept.
    fn short(cluster: &str, fitted: usize, wanted: usize, cause: Misfit) -> Self {
        Self {
            cluster: cluster.to_string(),
            placements: Vec::new(),
            fitted,
            misfit: Some(Misfit::of_gang(cluster, fitted, wanted, cause)),
            score: 0,
        }
    }
}

/// Below this many nodes per core, clusters are judged on one thread.
pub(crate) const PARALLEL_NODES: usize = 4096;

/// [`fit_cluster`] for each of `clusters`, in their order, across the cores when there are
/// enough nodes to gain from it (a 64-pod gang against 100 clusters of 500 nodes: 50,000).
pub fn fit_clusters(
    clusters: &[&Cluster],
    table: &ResourceTable,
    shape: &PodShape,
    pod: &BoundPod,
    n: usize,
    config: &EngineConfig,
    strategy: Strategy,
) -> Vec<ClusterFit> {
    let nodes: usize = clusters.iter().map(|c| c.nodes.len()).sum();
    let per_cluster = nodes / clusters.len().max(1);
    let min_clusters = PARALLEL_NODES.div_ceil(per_cluster.max(1));
    super::parallel::map_chunks(clusters, min_clusters, |part| {
        part.iter()
            .map(|c| fit_cluster(c, table, shape, pod, n, config, strategy))
            .collect()
    })
}

/// Why a cluster's summary shows that no node of it can take one copy of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SummaryShortfall<'p> {
    /// A resource no node of the inventory has ever listed.
    Unknown(&'p str),
    /// More than the most any node has free.
    OnNode(Shortfall<'p>),
    /// Every node is under single-numa-node, and an aligned resource needs more than the most
    /// any NUMA zone has free.
    InZone(Shortfall<'p>),
}

impl SummaryShortfall<'_> {
    /// The misfit this stands for in cluster `cluster`.
    pub(crate) fn misfit(&self, cluster: &str) -> Misfit {
        match *self {
            SummaryShortfall::Unknown(resource) => Misfit::UnknownResource {
                resource: resource.to_string(),
            },
            SummaryShortfall::OnNode(s) => Misfit::Insufficient {
                resource: s.resource.to_string(),
                need: s.need,
                free: s.free,
                allocatable: s.allocatable,
                scope: format!("the largest node in cluster {cluster}"),
            },
            SummaryShortfall::InZone(s) => Misfit::Topology {
                at: format!("every node of cluster {cluster}"),
                policy: Policy::SingleNumaNode,
                unit: "the pod".into(),
                detail: format!(
                    "needs {} {} on one NUMA node under single-numa-node; the largest NUMA zone in cluster {cluster} has {} free of {} allocatable",
                    display(s.resource, Milli(s.need)),
                    s.resource,
                    display(s.resource, Milli(s.free)),
                    display(s.resource, Milli(s.allocatable))
                ),
                unresolvable: s.need > s.allocatable,
            },
        }
    }
}

/// The O(1) rejection [`fit_cluster`] starts with: `Some` when the summary shows that no node
/// of the cluster can take one copy of the pod. A summary is an upper bound of what is free
/// (placements taken off a cluster's copy leave it as it was), so `None` is no promise.
pub(crate) fn summary_shortfall<'p>(
    s: &crate::inventory::ClusterSummary,
    shape: &PodShape,
    pod: &'p BoundPod,
) -> Option<SummaryShortfall<'p>> {
    for (rid, name, q) in &pod.node_request {
        let Some(rid) = *rid else {
            return Some(SummaryShortfall::Unknown(name));
        };
        let free = s.max_free_on_node.get(rid).copied().unwrap_or(0);
        if *q > free {
            return Some(SummaryShortfall::OnNode(Shortfall {
                resource: name,
                need: *q,
                free,
                allocatable: s.max_allocatable_on_node.get(rid).copied().unwrap_or(0),
            }));
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
                if *q > free {
                    return Some(SummaryShortfall::InZone(Shortfall {
                        resource: name,
                        need: *q,
                        free,
                        allocatable: s.max_allocatable_in_zone.get(rid).copied().unwrap_or(0),
                    }));
                }
            }
        }
    }
    None
}

/// For each of a cluster's `nodes` nodes, whether its row in the summary `s` shows it without
/// room for one copy of the pod (a row is an upper bound of what the node has free); all
/// `false` when the summary has no rows for these nodes. One pass over the rows per resource
/// the pod requests, so that a search walks past such nodes without reading them.
fn roomless_nodes(s: &crate::inventory::ClusterSummary, nodes: usize, pod: &BoundPod) -> Vec<bool> {
    let mut none = vec![false; nodes];
    let Some(rows) = s.free_rows(nodes) else {
        return none;
    };
    let width = s.allocatable.len();
    for &(rid, _, q) in &pod.node_request {
        match rid {
            Some(r) if r < width => {
                for (flag, row) in none.iter_mut().zip(rows.clone()) {
                    *flag |= row[r] < q;
                }
            }
            // A resource no row counts: no node has any of it free.
            Some(_) if q > 0 => none.fill(true),
            // Unknown resources are the summary's own refusal (`summary_shortfall`).
            _ => {}
        }
    }
    none
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
    let refused = |misfit: Misfit| ClusterFit {
        cluster: cluster.name.clone(),
        placements: Vec::new(),
        fitted: 0,
        misfit: Some(misfit),
        score: 0,
    };
    if let Some(why) = &cluster.unavailable {
        return refused(Misfit::Unavailable(why.clone()));
    }
    let s = &cluster.summary;
    if let Some(short) = summary_shortfall(s, shape, pod) {
        return refused(short.misfit(&cluster.name));
    }
    // Nodes that the summary's rows show without room for one pod are not judged.
    let roomless = roomless_nodes(s, cluster.nodes.len(), pod);
    let search = Search {
        cluster,
        table,
        shape,
        pod,
        config,
        strategy,
        roomless: &roomless,
    };
    if shape.spread.is_some() {
        if let Some(spread) = fit_spread(&search, n) {
            return spread;
        }
        // The nodes cannot hold the gang even unspread: why is found below.
    }
    if !shape.together.is_empty() {
        return fit_together(&search, n);
    }
    fit_nodes(&search, n, 0..cluster.nodes.len(), |_| true)
}

/// What [`fit_cluster`] searches, once the cluster's summary has not ruled the pod out.
struct Search<'a> {
    cluster: &'a Cluster,
    table: &'a ResourceTable,
    shape: &'a PodShape,
    pod: &'a BoundPod,
    config: &'a EngineConfig,
    strategy: Strategy,
    /// By node: the summary's rows show it without room for one pod.
    roomless: &'a [bool],
}

/// [`fit_cluster`] on the nodes of the cluster in `span` that are `within` (all of them, or
/// one domain of pods kept together).
fn fit_nodes(
    search: &Search,
    n: usize,
    span: std::ops::Range<usize>,
    within: impl Fn(usize) -> bool,
) -> ClusterFit {
    let &Search {
        cluster,
        table,
        shape,
        pod,
        config,
        strategy,
        roomless,
    } = search;
    let mut out = ClusterFit {
        cluster: cluster.name.clone(),
        placements: Vec::new(),
        fitted: 0,
        misfit: None,
        score: 0,
    };
    let resources = scored_resources(pod);
    let pods_id = table.id("pods");
    let mut state = NodeState {
        free: Vec::new(),
        zones: Vec::new(),
    };
    let mut scratch = Scratch::default();
    let (nodes, roomless) = (&cluster.nodes[span.clone()], &roomless[span.clone()]);
    // First without a word about why nodes refuse: most searches that get this far fit, and
    // then no reason is read. The same nodes take the same pods either way.
    let mut weighted = 0i64;
    for (j, (node, &none)) in nodes.iter().zip(roomless).enumerate() {
        if out.fitted >= n {
            break;
        }
        let i = span.start + j;
        if none || !within(i) {
            continue;
        }
        let fit = fit_node_with(
            node,
            shape,
            pod,
            pods_id,
            n - out.fitted,
            config,
            false,
            Detail {
                any_zones: strategy != Strategy::LeastNumaNodes,
                misfit_if_none: false,
                misfit_if_some: false,
                notes: false,
                state_if_none: false,
            },
            state,
            &mut scratch,
        );
        if fit.count > 0 {
            out.fitted += fit.count;
            out.placements.push((i, fit.count));
            weighted += node_score(strategy, node, &fit.state, &resources, fit.zones_used)
                * fit.count as i64;
        }
        state = fit.state;
    }
    if out.fitted >= n {
        out.score = (weighted as f64 / out.fitted.max(1) as f64).round() as i64;
        return out;
    }
    // It does not fit: again, keeping the most telling reason.
    out.fitted = 0;
    out.placements.clear();
    // The misfit kept, with its rank: from a node that took part of the gang, then resolvable.
    let mut first_misfit: Option<((bool, bool), Misfit)> = None;
    let rank = |partial: bool, m: &Misfit| (partial, !m.unresolvable());
    for (j, node) in nodes.iter().enumerate() {
        if out.fitted >= n {
            break;
        }
        let i = span.start + j;
        if !within(i) {
            continue;
        }
        // A misfit only matters if it could outrank the one kept; its text is not built
        // otherwise.
        let kept = first_misfit.as_ref().map(|(r, _)| *r);
        if kept >= Some((false, true)) && roomless[j] {
            // Nothing this node could say would be kept, and it has no room.
            continue;
        }
        let detail = Detail {
            // The score reads the node-level state, and the zones used only for this one.
            any_zones: strategy != Strategy::LeastNumaNodes,
            misfit_if_none: kept < Some((false, true)),
            misfit_if_some: kept < Some((true, true)),
            notes: false,
            state_if_none: false,
        };
        let fit = fit_node_with(
            node,
            shape,
            pod,
            pods_id,
            n - out.fitted,
            config,
            false,
            detail,
            state,
            &mut scratch,
        );
        if fit.count > 0 {
            out.fitted += fit.count;
            out.placements.push((i, fit.count));
        }
        // The most telling reason: from a node that took part of the gang, else one that
        // preemption could fix, else the first.
        if let Some(m) = fit.refusal.map(|r| r.misfit(node)) {
            let this = rank(fit.count > 0, &m);
            if kept.is_none_or(|k| this > k) {
                first_misfit = Some((this, m));
            }
        }
        state = fit.state;
    }
    // The nodes took what they took above: the gang still does not fit.
    debug_assert!(out.fitted < n);
    let cause = first_misfit.map(|(_, m)| m).unwrap_or_else(|| {
        if shape.one_per_node && out.fitted > 0 {
            // Every node took one pod and refused nothing.
            Misfit::OnePerNode {
                cluster: cluster.name.clone(),
            }
        } else {
            Misfit::BadPod(format!("cluster {} has no nodes", cluster.name))
        }
    });
    out.misfit = Some(Misfit::of_gang(&cluster.name, out.fitted, n, cause));
    out
}

/// The value of topology key `key` on `node`: its label, or for the hostname, which the kubelet
/// always labels a node with, the node's name where the inventory lists no such label.
pub(crate) fn topology_value<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    (node.labels.get(key)).or_else(|| (key == super::apart::HOSTNAME).then_some(&*node.name))
}

/// Each node's domain of pods kept together on `keys` (its values of them, the domains
/// numbered in node order; `None` for a node without one of the keys), and each domain's
/// values, as `key=value` pairs.
pub(crate) fn together_domains(
    cluster: &Cluster,
    keys: &[String],
) -> (Vec<Option<usize>>, Vec<String>) {
    let mut numbers: BTreeMap<Vec<&str>, usize> = BTreeMap::new();
    let mut names = Vec::new();
    let domains = (cluster.nodes.iter())
        .map(|node| {
            let values: Vec<&str> = (keys.iter())
                .map(|k| topology_value(node, k))
                .collect::<Option<_>>()?;
            let next = numbers.len();
            Some(*numbers.entry(values).or_insert_with_key(|values| {
                let pairs = keys.iter().zip(values).map(|(k, v)| format!("{k}={v}"));
                names.push(pairs.collect::<Vec<_>>().join(", "));
                next
            }))
        })
        .collect();
    (domains, names)
}

/// [`fit_cluster`] for pods kept together in one domain ([`super::apart`]): InterPodAffinity
/// binds the first pod to any node with the keys and every later one beside it, so the gang
/// is fitted in each domain alone and placed in the one that scores best (the first, of
/// equals). When none holds it, the misfit is the domain's that holds the most of it.
fn fit_together(search: &Search, n: usize) -> ClusterFit {
    let cluster = search.cluster;
    let keys = &search.shape.together;
    let (domain, names) = together_domains(cluster, keys);
    // The nodes a domain spans, first to last: one node for the hostname.
    let mut spans: Vec<Option<std::ops::Range<usize>>> = vec![None; names.len()];
    for (i, d) in domain.iter().enumerate() {
        if let Some(d) = *d {
            let start = spans[d].as_ref().map_or(i, |s| s.start);
            spans[d] = Some(start..i + 1);
        }
    }
    let mut best: Option<(usize, ClusterFit)> = None;
    let mut most: Option<(usize, ClusterFit)> = None;
    for (d, span) in spans.into_iter().flatten().enumerate() {
        let fit = fit_nodes(search, n, span, |i| domain[i] == Some(d));
        if fit.misfit.is_none() {
            if best.as_ref().is_none_or(|(_, b)| fit.score > b.score) {
                best = Some((d, fit));
            }
        } else if best.is_none() {
            // The most pods, then a reason that may pass.
            let rank = |f: &ClusterFit| {
                let passes = f.misfit.as_ref().is_some_and(|m| !m.unresolvable());
                (f.fitted, passes)
            };
            if most.as_ref().is_none_or(|(_, m)| rank(&fit) > rank(m)) {
                most = Some((d, fit));
            }
        }
    }
    if let Some((_, fit)) = best {
        return fit;
    }
    let fitted = most.as_ref().map_or(0, |(_, m)| m.fitted);
    // Within the domain: what stops the gang there, without the count the whole misfit gives.
    let best = most.and_then(|(d, fit)| match fit.misfit? {
        Misfit::Gang { cause, .. } => Some((names[d].clone(), cause)),
        other => Some((names[d].clone(), Box::new(other))),
    });
    let together = Misfit::Together {
        cluster: cluster.name.clone(),
        keys: keys.clone(),
        domains: names.len(),
        best,
    };
    ClusterFit::short(&cluster.name, fitted, n, together)
}

/// [`fit_cluster`] for pods that spread over nodes ([`super::apart::Spread`]), as
/// PodTopologySpread binds them one by one: every node's room for the gang is found first
/// (a gang spread is limited by the node counted that takes the fewest); then each node
/// counted gets the least count (`floor`), and the rest goes in node order up to `floor +
/// maxSkew` a node. Any such spread can be bound pod by pod, each pod onto a node whose count
/// is lowest among those with room below their share. `None` when the nodes cannot hold the
/// gang even unspread (the caller finds why).
fn fit_spread(search: &Search, n: usize) -> Option<ClusterFit> {
    let &Search {
        cluster,
        table,
        shape,
        pod,
        config,
        strategy,
        ..
    } = search;
    let spread = shape.spread?;
    let pods_id = table.id("pods");
    let mut state = NodeState {
        free: Vec::new(),
        zones: Vec::new(),
    };
    let mut scratch = Scratch::default();
    // Why a node takes no more is read of the node of least room.
    let detail = Detail {
        any_zones: strategy != Strategy::LeastNumaNodes,
        misfit_if_none: true,
        misfit_if_some: true,
        notes: false,
        state_if_none: false,
    };
    // (node index, room) of the nodes counted; the one of least room, and whether what keeps
    // it from more stays when the cluster empties.
    let mut rooms: Vec<(usize, usize)> = Vec::new();
    let mut least: Option<(usize, usize, bool)> = None;
    let mut unspread = 0usize;
    for (i, node) in cluster.nodes.iter().enumerate() {
        let counted = counted_by_spread(&spread, shape, node);
        let fit = fit_node_with(
            node,
            shape,
            pod,
            pods_id,
            n,
            config,
            false,
            detail,
            state,
            &mut scratch,
        );
        state = fit.state;
        // A node not counted is one the pod's affinity or taints keep it off.
        debug_assert!(counted || fit.count == 0);
        unspread += fit.count;
        if counted {
            rooms.push((i, fit.count));
            if least.is_none_or(|(_, r, _)| fit.count < r) {
                let stays = (fit.refusal.map(|r| r.misfit(node).unresolvable())).unwrap_or(false);
                least = Some((i, fit.count, stays));
            }
        }
    }
    // Only nodes counted take pods: when they hold the gang, some node is counted.
    let (least, least_room, stays) = least.filter(|_| unspread >= n)?;
    let counted = rooms.len();
    let too_few = counted < spread.min_domains as usize;
    let floor = match too_few {
        true => 0,
        false => least_room.min(n / counted),
    };
    let cap = floor + spread.max_skew as usize;
    let total: usize = rooms.iter().map(|&(_, room)| room.min(cap)).sum();
    if total < n {
        let misfit = Misfit::Spread {
            cluster: cluster.name.clone(),
            max_skew: spread.max_skew,
            cap,
            least: (cluster.nodes[least].name.to_string(), least_room),
            too_few: too_few.then_some((counted, spread.min_domains)),
            unresolvable: too_few || stays,
        };
        return Some(ClusterFit::short(&cluster.name, total, n, misfit));
    }
    // The floor everywhere, then the rest in node order up to the cap.
    let mut left = n - floor * counted;
    let counts = rooms.iter().map(|&(i, room)| {
        let more = left.min(room.min(cap) - floor);
        left -= more;
        (i, floor + more)
    });
    let counts: Vec<(usize, usize)> = counts.filter(|&(_, c)| c > 0).collect();
    let resources = scored_resources(pod);
    let quiet = Detail {
        misfit_if_none: false,
        misfit_if_some: false,
        ..detail
    };
    let mut weighted = 0i64;
    for &(i, count) in &counts {
        let node = &cluster.nodes[i];
        let fit = fit_node_with(
            node,
            shape,
            pod,
            pods_id,
            count,
            config,
            false,
            quiet,
            state,
            &mut scratch,
        );
        debug_assert_eq!(
            fit.count, count,
            "a node takes fewer pods than it has room for"
        );
        weighted +=
            node_score(strategy, node, &fit.state, &resources, fit.zones_used) * count as i64;
        state = fit.state;
    }
    Some(ClusterFit {
        cluster: cluster.name.clone(),
        placements: counts,
        fitted: n,
        misfit: None,
        score: (weighted as f64 / n.max(1) as f64).round() as i64,
    })
}

/// The shortcuts above (the direct merge, quiet misfits, reused buffers) against the plain
/// computations they replace, on random nodes and pods.
#[cfg(test)]
mod equivalence {
    use super::*;
    use crate::inventory::{parse_yaml, Inventory};
    use crate::placement::PodView;
    use crate::rng::Rng;
    use crate::topology::{merge, NumaInfo, ProviderHints};

    trait PickOne {
        fn pick_one<T: Copy>(&mut self, items: &[T]) -> T;
    }

    impl PickOne for Rng {
        fn pick_one<T: Copy>(&mut self, items: &[T]) -> T {
            items[self.index(items.len())]
        }
    }
    use std::collections::BTreeMap;

    fn template() -> NumaTopology {
        let inv = parse_yaml(
            "clusters:\n  - name: c\n    nodes:\n      - name: n\n        topology:\n          zones: [{name: node-0, type: Node, resources: [{name: cpu, capacity: \"1\"}]}]\n",
        )
        .unwrap();
        inv.clusters[0].nodes[0].numa.as_deref().cloned().unwrap()
    }

    /// Zones with ids in order, reversed, spread out or (rarely) repeated, some amounts
    /// negative, and machines that sometimes miss a zone or its distances.
    fn topology(rng: &mut Rng, template: &NumaTopology, resources: usize) -> NumaTopology {
        let n = 1 + rng.below(8) as usize + if rng.below(10) == 0 { 2 } else { 0 };
        let mut ids: Vec<u32> = (0..n as u32).collect();
        match rng.below(6) {
            0 => ids.reverse(),
            1 => ids.iter_mut().for_each(|id| *id = *id * 2 + 1),
            2 if n > 1 => ids[1] = ids[0],
            3 => ids.swap(0, n - 1),
            _ => {}
        }
        let mut numa = template.clone();
        numa.policy = rng.pick_one(&[
            Policy::None,
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ]);
        numa.zones = ids
            .iter()
            .map(|&id| {
                let mut z = template.zones[0].clone();
                z.name = format!("node-{id}").into();
                z.id = id;
                z.allocatable = (0..resources).map(|_| 1000 * rng.below(5) as i64).collect();
                z.available = z
                    .allocatable
                    .iter()
                    .map(|&a| {
                        if rng.below(12) == 0 {
                            -1000
                        } else {
                            a - 1000 * rng.below(a as u64 / 1000 + 1) as i64
                        }
                    })
                    .collect();
                z
            })
            .collect();
        let mut machine = ids.clone();
        if rng.below(15) == 0 {
            machine.pop();
        }
        numa.options.prefer_closest_numa = rng.below(3) == 0;
        let max_id = ids.iter().copied().max().unwrap_or(0) as usize;
        numa.info = if rng.below(4) == 0 {
            NumaInfo::new(machine).into()
        } else {
            let distances: BTreeMap<u32, Vec<u64>> = machine
                .iter()
                .map(|&from| {
                    let row = (0..=max_id as u32)
                        .map(|to| {
                            if to == from {
                                10
                            } else {
                                11 + rng.below(4) * 5
                            }
                        })
                        .collect();
                    (from, row)
                })
                .collect();
            NumaInfo::with_distances(machine, distances).into()
        };
        numa.managed = vec![true; resources].into();
        numa
    }

    /// The hints as first written: sums over every set, then the masks zone by zone.
    fn plain_hints_for(
        numa: &NumaTopology,
        zones: &[Vec<i64>],
        rid: usize,
        need: i64,
    ) -> Vec<TopologyHint> {
        let n = numa.zones.len().min(16);
        let mut min_size = u32::MAX;
        let mut fitting = Vec::new();
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

    #[test]
    fn the_direct_merge_agrees_with_hints_and_merge() {
        let template = template();
        let names = ["cpu", "memory", "nvidia.com/gpu", "example.com/nic"];
        let mut rng = Rng::new(7);
        let (mut admitted, mut rejected) = (0, 0);
        for _ in 0..50_000 {
            let resources = 1 + rng.below(4) as usize;
            let numa = topology(&mut rng, &template, resources);
            let zones: Vec<Vec<i64>> = numa.zones.iter().map(|z| z.available.clone()).collect();
            let mut managed: Vec<(usize, &str, i64)> = Vec::new();
            for (r, name) in names.iter().enumerate().take(resources) {
                if rng.below(5) != 0 {
                    managed.push((r, *name, 1000 * rng.below(9) as i64));
                }
            }
            let mut provider = ProviderHints::new();
            for (rid, name, q) in &managed {
                let hints = plain_hints_for(&numa, &zones, *rid, *q);
                assert_eq!(hints, hints_for(&numa, &zones, *rid, *q), "{numa:?}");
                provider.insert(name.to_string(), Some(hints));
            }
            let merged = merge(numa.policy, &numa.options, &numa.info, &[provider]);
            let lists: Vec<Vec<TopologyHint>> = managed
                .iter()
                .map(|(rid, _, q)| hints_for(&numa, &zones, *rid, *q))
                .collect();
            let lists: Vec<Option<&[TopologyHint]>> =
                lists.iter().map(|h| Some(h.as_slice())).collect();
            let by_resource = merge_resources(numa.policy, &numa.options, &numa.info, &lists);
            assert_eq!(merged, by_resource);
            let quick = quick_merge(&numa, &zones, &managed);
            let context = || format!("{numa:?}\nzones {zones:?}\nmanaged {managed:?}");
            match quick {
                Quick::Admit(hint) => {
                    admitted += 1;
                    assert_eq!(merged, MergeResult { hint, admit: true }, "{}", context());
                }
                Quick::Reject => {
                    rejected += 1;
                    assert!(!merged.admit, "{}", context());
                }
                Quick::Unknown => {}
            }
        }
        assert!(admitted > 2000 && rejected > 8000, "{admitted} {rejected}");
    }

    /// A random cluster in the inventory format.
    fn cluster_yaml(rng: &mut Rng) -> String {
        let mut y = String::from("clusters:\n  - name: c\n    nodes:\n");
        for i in 0..1 + rng.below(12) {
            let zones = 1 + rng.below(4);
            let (cpu, mem, gpu) = (
                rng.pick_one(&[4, 8]),
                rng.pick_one(&[8, 16]),
                rng.pick_one(&[0, 1, 2]),
            );
            y += &format!(
                "      - name: n{i}\n        allocatable: {{cpu: \"{}\", memory: {}Gi, nvidia.com/gpu: \"{}\", pods: \"{}\"}}\n        requested: {{cpu: \"{}\", memory: {}Gi}}\n",
                cpu * zones,
                mem * zones,
                gpu * zones,
                rng.pick_one(&[2, 110]),
                rng.below(cpu * zones / 2 + 1),
                rng.below(mem * zones / 2 + 1),
            );
            if rng.below(10) == 0 {
                y += "        taints: [{key: dedicated, value: ml, effect: NoSchedule}]\n";
            }
            if rng.below(7) == 0 {
                continue;
            }
            y += &format!(
                "        topology:\n          attributes:\n            - {{name: topologyManagerPolicy, value: {}}}\n            - {{name: topologyManagerScope, value: {}}}\n          zones:\n",
                rng.pick_one(&["none", "best-effort", "restricted", "single-numa-node"]),
                rng.pick_one(&["container", "pod"]),
            );
            for z in 0..zones {
                y += &format!(
                    "            - name: node-{z}\n              type: Node\n              resources:\n                - {{name: cpu, capacity: \"{cpu}\", available: \"{}\"}}\n                - {{name: memory, capacity: {mem}Gi, available: {}Gi}}\n",
                    rng.below(cpu + 1),
                    rng.below(mem + 1),
                );
                if gpu > 0 {
                    y += &format!(
                        "                - {{name: nvidia.com/gpu, capacity: \"{gpu}\", available: \"{}\"}}\n",
                        rng.below(gpu + 1)
                    );
                }
            }
        }
        y
    }

    fn random_pod(rng: &mut Rng) -> PodShape {
        let guaranteed = rng.below(3) != 0;
        let container = |rng: &mut Rng, name: &str, restart: Option<&str>| {
            let r = serde_json::json!({
                "cpu": rng.pick_one(&["1", "2", "3", "500m"]),
                "memory": rng.pick_one(&["1Gi", "4Gi", "9Gi"]),
                "nvidia.com/gpu": rng.pick_one(&["0", "1", "2", "3"]),
            });
            let limits = if guaranteed {
                r.clone()
            } else {
                serde_json::json!({})
            };
            serde_json::json!({"name": name, "restartPolicy": restart, "resources": {"requests": r, "limits": limits}})
        };
        let mut spec = serde_json::json!({"containers": [container(rng, "main", None)]});
        if rng.below(3) == 0 {
            spec["containers"]
                .as_array_mut()
                .unwrap()
                .push(container(rng, "helper", None));
        }
        if rng.below(3) == 0 {
            let init = [
                container(rng, "setup", None),
                container(rng, "proxy", Some("Always")),
            ];
            spec["initContainers"] = serde_json::json!(init);
        }
        if rng.below(2) == 0 {
            spec["tolerations"] = serde_json::json!([{"key": "dedicated", "operator": "Exists"}]);
        }
        // Some keep one to a node.
        if rng.below(4) == 0 {
            spec["affinity"] = serde_json::json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"app": "p"}},
                    "topologyKey": "kubernetes.io/hostname"
                }]
            }});
        }
        let view: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"app": "p"}},
            "spec": spec
        }))
        .unwrap();
        PodShape::from_view(&view).unwrap()
    }

    /// Placements, pods fitted, the kept misfit (and whether its node took part), score.
    type PlainClusterFit = (Vec<(usize, usize)>, usize, Option<(bool, Misfit)>, i64);

    /// `fit_cluster` as it reads without the shortcuts: every node through `fit_node`.
    fn plain_fit_cluster(
        cluster: &Cluster,
        table: &ResourceTable,
        shape: &PodShape,
        pod: &BoundPod,
        n: usize,
        config: &EngineConfig,
        strategy: Strategy,
    ) -> PlainClusterFit {
        let mut first_misfit: Option<(bool, Misfit)> = None;
        let (mut placements, mut fitted, mut weighted) = (Vec::new(), 0, 0i64);
        let resources = scored_resources(pod);
        for (i, node) in cluster.nodes.iter().enumerate() {
            if fitted >= n {
                break;
            }
            let fit = fit_node(node, table, shape, pod, n - fitted, config, false);
            if fit.count > 0 {
                fitted += fit.count;
                placements.push((i, fit.count));
                weighted += node_score(strategy, node, &fit.state, &resources, fit.zones_used)
                    * fit.count as i64;
            }
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
        if first_misfit.is_none() && fitted < n && shape.one_per_node {
            // No node refused: each took its one pod.
            let cluster = cluster.name.clone();
            first_misfit = Some((true, Misfit::OnePerNode { cluster }));
        }
        let score = (weighted as f64 / fitted.max(1) as f64).round() as i64;
        (placements, fitted, first_misfit, score)
    }

    #[test]
    fn amounts_and_misfits_read_as_before() {
        let mut rng = Rng::new(3);
        let names = [
            "cpu",
            "memory",
            "ephemeral-storage",
            "hugepages-2Mi",
            "nvidia.com/gpu",
        ];
        for _ in 0..20_000 {
            let name = rng.pick_one(&names);
            let v = match rng.below(4) {
                0 => rng.below(5000) as i64 - 1000,
                1 => (1000 * rng.below(64) as i64) << (10 * rng.below(5)),
                2 => (rng.next_u64() >> rng.below(64)) as i64,
                _ => -((1000 * rng.below(8) as i64) << 30),
            };
            assert_eq!(Amount(name, v).to_string(), display(name, Milli(v)));
        }
        // Past the in-place buffer, and nested.
        let detail = "x".repeat(700);
        let long = Misfit::Selector {
            node: "n".into(),
            detail: detail.clone(),
        };
        assert_eq!(long.to_string(), format!("node n {detail}"));
        let gang = Misfit::Gang {
            cluster: "c".into(),
            fitted: 1,
            wanted: 2,
            cause: Box::new(Misfit::Insufficient {
                resource: "memory".into(),
                need: 1000 << 30,
                free: 0,
                allocatable: 1000 << 31,
                scope: "node n".into(),
            }),
        };
        assert_eq!(
            gang.to_string(),
            "only 1 of 2 pods fit at once in cluster c; then: needs 1Gi memory on one node; node n has 0 free of 2Gi allocatable"
        );
    }

    /// `node_score` as first written, collecting the fractions.
    fn plain_score(strategy: Strategy, node: &Node, after: &NodeState, resources: &[usize]) -> f64 {
        let used_fractions: Vec<f64> = resources
            .iter()
            .filter_map(|&r| {
                let alloc = *node.allocatable.get(r)?;
                (alloc > 0).then(|| {
                    let free = after.free.get(r).copied().unwrap_or(0).max(0);
                    ((alloc - free) as f64 / alloc as f64).clamp(0.0, 1.0)
                })
            })
            .collect();
        let mean = |v: &[f64]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        match strategy {
            Strategy::LeastAllocated => 10.0 * (1.0 - mean(&used_fractions)),
            Strategy::MostAllocated => 10.0 * mean(&used_fractions),
            Strategy::BalancedAllocation => {
                let m = mean(&used_fractions);
                let var = mean(
                    &used_fractions
                        .iter()
                        .map(|f| (f - m) * (f - m))
                        .collect::<Vec<_>>(),
                );
                10.0 * (1.0 - var.sqrt())
            }
            Strategy::LeastNumaNodes => unreachable!(),
        }
    }

    #[test]
    fn scores_are_computed_as_before() {
        let mut rng = Rng::new(5);
        let inv = parse_yaml(&cluster_yaml(&mut rng)).unwrap();
        let node = &inv.clusters[0].nodes[0];
        for _ in 0..20_000 {
            let mut node = Node::clone(node);
            let width = 1 + rng.below(5) as usize;
            node.allocatable = (0..width).map(|_| rng.below(9) as i64 * 500).collect();
            let after = NodeState {
                free: (0..width)
                    .map(|_| rng.below(12) as i64 * 500 - 1000)
                    .collect(),
                zones: Vec::new(),
            };
            let resources: Vec<usize> = (0..1 + rng.below(5))
                .map(|_| rng.below(6) as usize)
                .collect();
            for strategy in [
                Strategy::LeastAllocated,
                Strategy::MostAllocated,
                Strategy::BalancedAllocation,
            ] {
                let plain = plain_score(strategy, &node, &after, &resources);
                let expected = plain.round().clamp(0.0, 10.0) as i64;
                let got = node_score(strategy, &node, &after, &resources, NumaMask::EMPTY);
                assert_eq!(
                    got, expected,
                    "{strategy:?} {:?} {:?} {resources:?}",
                    node.allocatable, after.free
                );
            }
        }
    }

    #[test]
    fn shortcuts_change_no_verdict() {
        let mut rng = Rng::new(11);
        let config = EngineConfig::default();
        let mut placed = 0;
        for _ in 0..300 {
            let inv: Inventory = parse_yaml(&cluster_yaml(&mut rng)).unwrap();
            let cluster = &inv.clusters[0];
            for _ in 0..4 {
                let shape = random_pod(&mut rng);
                let pod = shape.bind(&inv.resources);
                let n = 1 + rng.below(6) as usize;
                // Traced fits take the full merge; untraced ones the direct one. (Under the
                // none policy a traced fit also takes from the zones, an untraced one not.)
                let aligned = |n: &&std::sync::Arc<Node>| {
                    n.numa.as_ref().is_none_or(|t| t.policy != Policy::None)
                };
                for node in cluster.nodes.iter().filter(aligned) {
                    let traced = fit_node(node, &inv.resources, &shape, &pod, n, &config, true);
                    let quick = fit_node(node, &inv.resources, &shape, &pod, n, &config, false);
                    assert_eq!(traced.count, quick.count, "{node:?}\n{pod:?}");
                    assert_eq!(traced.misfit, quick.misfit, "{node:?}\n{pod:?}");
                    assert_eq!(traced.zones_used, quick.zones_used);
                    assert_eq!(traced.state.free, quick.state.free);
                    assert_eq!(traced.state.zones, quick.state.zones);
                    assert_eq!(traced.notes, quick.notes);
                }
                // A failed placement leaves the state as the placements before it left it.
                for node in &cluster.nodes {
                    let fit = fit_node(node, &inv.resources, &shape, &pod, n, &config, false);
                    if fit.misfit.is_some() {
                        let exact = fit_node(
                            node,
                            &inv.resources,
                            &shape,
                            &pod,
                            fit.count,
                            &config,
                            false,
                        );
                        assert_eq!(fit.state.free, exact.state.free);
                        assert_eq!(fit.state.zones, exact.state.zones, "{node:?}\n{pod:?}");
                        assert_eq!(fit.zones_used, exact.zones_used);
                    }
                }
                let strategy = rng.pick_one(&[
                    Strategy::MostAllocated,
                    Strategy::LeastAllocated,
                    Strategy::LeastNumaNodes,
                ]);
                let fit = fit_cluster(cluster, &inv.resources, &shape, &pod, n, &config, strategy);
                let (placements, fitted, first, score) =
                    plain_fit_cluster(cluster, &inv.resources, &shape, &pod, n, &config, strategy);
                // Rejections from the cluster's summary come before any node is judged.
                let from_summary = match &fit.misfit {
                    Some(Misfit::Insufficient { scope, .. }) => scope.starts_with("the largest"),
                    Some(Misfit::Topology { at, .. }) => at.starts_with("every node of"),
                    Some(Misfit::UnknownResource { .. }) => true,
                    _ => false,
                };
                if from_summary {
                    continue;
                }
                placed += 1;
                assert_eq!(fit.placements, placements);
                assert_eq!(fit.fitted, fitted);
                if fit.fits() {
                    assert_eq!(fit.score, score);
                } else {
                    let cause = match fit.misfit {
                        Some(Misfit::Gang { cause, .. }) => *cause,
                        other => other.unwrap(),
                    };
                    assert_eq!(Some(cause), first.map(|(_, m)| m));
                }
            }
        }
        assert!(placed > 200, "{placed}");
    }

    /// The extender's lean judge gives every node the verdict, misfit text and score that
    /// `fit_node` and `node_score` give it, and the dispatcher's count of copies the count
    /// `fit_node` gives, one reused judge across nodes of all kinds.
    #[test]
    fn the_node_judge_agrees_with_fit_node_and_node_score() {
        let mut rng = Rng::new(23);
        let config = EngineConfig::default();
        let (mut fits, mut misfits) = (0, 0);
        for _ in 0..200 {
            let inv: Inventory = parse_yaml(&cluster_yaml(&mut rng)).unwrap();
            let cluster = &inv.clusters[0];
            for _ in 0..4 {
                let shape = random_pod(&mut rng);
                let pod = shape.bind(&inv.resources);
                let strategy = rng.pick_one(&[
                    Strategy::MostAllocated,
                    Strategy::LeastAllocated,
                    Strategy::BalancedAllocation,
                    Strategy::LeastNumaNodes,
                ]);
                let mut judge = NodeJudge::new(&inv.resources, &shape, &pod, &config, strategy);
                let resources = scored_resources(&pod);
                for node in &cluster.nodes {
                    let plain = fit_node(node, &inv.resources, &shape, &pod, 1, &config, false);
                    let want = match plain.misfit {
                        None => {
                            fits += 1;
                            Ok(node_score(
                                strategy,
                                node,
                                &plain.state,
                                &resources,
                                plain.zones_used,
                            ))
                        }
                        Some(m) => {
                            misfits += 1;
                            Err(m.to_string())
                        }
                    };
                    let got = judge.score(node).map_err(|m| m.to_string());
                    assert_eq!(got, want, "{strategy:?}\n{node:?}\n{pod:?}");
                    let n = 1 + rng.below(6) as usize;
                    let count =
                        fit_node(node, &inv.resources, &shape, &pod, n, &config, false).count;
                    assert_eq!(judge.count(node, n), count, "{n} copies\n{node:?}\n{pod:?}");
                }
            }
        }
        assert!(
            fits > 500 && misfits > 500,
            "{fits} fits, {misfits} misfits"
        );
    }
}
