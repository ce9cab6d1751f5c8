//! `switchyard explain`: for a person, why a pod fits or not on each node or cluster: per
//! resource the hints, the merged hint, the policy's verdict, and the score.

use crate::inventory::{Inventory, Node, Scope};
use crate::placement::{
    fit_cluster, fit_node, score, shape_for_cluster_nodes, EngineConfig, NodeFit, PodShape,
    Strategy,
};
use crate::topology::{NumaMask, TopologyHint};
use crate::workers::virtual_node::own_labels;
use std::borrow::Cow;
use std::fmt::Write;

/// What to explain.
pub enum Target<'a> {
    Node(&'a str),
    Cluster(&'a str),
    Everything,
}

fn mask(m: Option<NumaMask>) -> String {
    match m {
        None => "any".into(),
        Some(m) => format!(
            "{{{}}}",
            m.ids().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        ),
    }
}

fn hint(h: &TopologyHint) -> String {
    format!("{}{}", mask(h.affinity), if h.preferred { "*" } else { "" })
}

fn explain_node(
    out: &mut String,
    inv: &Inventory,
    node: &Node,
    shape: &PodShape,
    config: &EngineConfig,
    strategy: Strategy,
) {
    let bound = shape.bind(&inv.resources);
    let fit: NodeFit = fit_node(node, &inv.resources, shape, &bound, 1, config, true);
    let verdict = match &fit.misfit {
        None => "fits".to_string(),
        Some(m) => format!(
            "does not fit ({}): {m}",
            if m.unresolvable() {
                "unresolvable"
            } else {
                "preemption could help"
            }
        ),
    };
    let _ = writeln!(out, "  node {}: {verdict}", node.name);
    match &node.numa {
        None => {
            let _ = writeln!(out, "    no NUMA data: node-level resources only");
        }
        Some(numa) => {
            let _ = writeln!(
                out,
                "    topology manager: policy {}, scope {}, NUMA zones {}",
                numa.policy,
                match numa.scope {
                    Scope::Container => "container",
                    Scope::Pod => "pod",
                },
                numa.zones.len()
            );
        }
    }
    for note in &fit.notes {
        let _ = writeln!(out, "    note: {note}");
    }
    for t in &fit.traces {
        let _ = writeln!(out, "    {}:", t.unit);
        for (resource, hints) in &t.hints {
            let list = match hints {
                None => "no preference".to_string(),
                Some(h) if h.is_empty() => "none possible".to_string(),
                Some(h) => h.iter().map(hint).collect::<Vec<_>>().join(" "),
            };
            let _ = writeln!(out, "      {resource}: hints {list}");
        }
        let _ = writeln!(
            out,
            "      merged {} -> {}",
            hint(&t.merged),
            if t.admit {
                "admit"
            } else {
                "reject (TopologyAffinityError)"
            }
        );
    }
    if fit.misfit.is_none() {
        let s = score::node_score(
            strategy,
            node,
            &fit.state,
            &score::scored_resources(&bound),
            fit.zones_used,
        );
        let _ = writeln!(out, "    score ({strategy:?}): {s} of 10");
    }
}

/// The largest gang a pod's `switchyard.dev/gang-size` may name, and so explain judge.
const MAX_GANG: u64 = 100_000;

/// The pod a workload asks to judge: a batch/v1 Job's or a JobSet's pod template, as the
/// gang of all the pods the dispatcher places at once (a Job's `parallelism`, at most its
/// `completions`; every pod of every replicated Job of a JobSet), as a cluster is judged for
/// it. `None` when `manifest` is not of such a kind (a Pod is read as it is); an error for
/// a JobSet whose replicated Jobs ask for several pod shapes, which are not one pod to judge.
pub fn workload_pod(manifest: &serde_json::Value) -> Option<Result<PodShape, String>> {
    use crate::dispatcher::kind::Kind;
    let kind = Kind::of(manifest["apiVersion"].as_str()?, manifest["kind"].as_str()?)?;
    let gang = kind.gang(manifest);
    Some(gang.shape.and_then(|shape| {
        if !gang.extra.is_empty() {
            return Err(format!(
                "this {kind}'s replicated Jobs ask for {} pod shapes; explain judges one: give it a Pod with one of their templates",
                gang.extra.len() + 1
            ));
        }
        let pods: u64 = gang.parts.iter().map(|p| u64::from(p.pods())).sum();
        if pods > MAX_GANG {
            return Err(format!(
                "this {kind}'s gang of {pods} pods is more than explain judges ({MAX_GANG})"
            ));
        }
        let mut shape = (*shape).clone();
        shape.annotations.insert(
            crate::placement::GANG_SIZE_ANNOTATION.into(),
            pods.max(1).to_string(),
        );
        Ok(shape)
    }))
}

/// The keys of a workload `manifest` (see [`workload_pod`]) that its Kubernetes type does
/// not have, as warnings: a misspelt `resorces` would leave the pod asking for nothing. A
/// Job is judged whole; of a JobSet (no published Rust type), its pod templates.
pub fn workload_warnings(manifest: &serde_json::Value) -> Vec<String> {
    use crate::unread::{self, KubeType, Owner, Step};
    /// Where a JobSet's pod template spec sits in a replicated Job.
    const POD_SPEC: [&str; 4] = ["template", "spec", "template", "spec"];
    let (paths, ty, at) = match manifest["kind"].as_str() {
        Some("Job") => (
            unread::notable_in(manifest, KubeType::Job, &[]),
            KubeType::Job,
            0,
        ),
        _ => {
            let jobs = manifest["spec"]["replicatedJobs"].as_array();
            let paths = (jobs.into_iter().flatten().enumerate())
                .flat_map(|(i, job)| {
                    let mut at = vec![
                        Step::Key("spec".into()),
                        Step::Key("replicatedJobs".into()),
                        Step::Index(i),
                    ];
                    at.extend(POD_SPEC.map(|k| Step::Key(k.into())));
                    let spec = POD_SPEC.iter().fold(job, |v, k| &v[*k]);
                    unread::notable_in(spec, KubeType::PodSpec, &at)
                })
                .collect();
            (paths, KubeType::PodSpec, 3 + POD_SPEC.len())
        }
    };
    unread::judge(&paths, |_| Owner::Kubernetes(ty, at)).warnings
}

/// The report, as plain text (`*` marks a preferred hint; `{0,1}` lists NUMA ids).
pub fn render(
    inv: &Inventory,
    shape: &PodShape,
    target: Target<'_>,
    config: &EngineConfig,
) -> Result<String, String> {
    let strategy = shape.strategy(config.strategy);
    let gang = shape.gang_size()?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pod {} ({}), gang of {gang}; * marks a preferred hint",
        shape.name,
        if shape.guaranteed {
            "Guaranteed QoS"
        } else {
            "not Guaranteed: CPU and memory are not NUMA-aligned"
        }
    );
    let clusters: Vec<_> = match target {
        Target::Node(name) => {
            let (cluster, node) = inv
                .node(name)
                .ok_or_else(|| format!("node {name:?} is not in the inventory"))?;
            let _ = writeln!(out, "cluster {}:", cluster.name);
            explain_node(&mut out, inv, node, shape, config, strategy);
            return Ok(out);
        }
        Target::Cluster(name) => vec![inv
            .cluster(name)
            .ok_or_else(|| format!("cluster {name:?} is not in the inventory"))?],
        Target::Everything => inv.clusters.iter().map(|c| c.as_ref()).collect(),
    };
    let bound = shape.bind(&inv.resources);
    let prefix = crate::extender::ExtenderConfig::default().virtual_node_prefix;
    for cluster in clusters {
        // A cluster is judged as the extender judges its virtual node: what the pod asks of
        // the virtual node's own labels is not asked of the cluster's nodes.
        let virtual_node = format!("{prefix}{}", cluster.name);
        let own = own_labels(&virtual_node, &cluster.name, &cluster.labels);
        let (shape, refused) = match shape_for_cluster_nodes(shape, &virtual_node, &own) {
            Ok(s) => (s, None),
            Err(m) => (Cow::Borrowed(shape), Some(m)),
        };
        if let Some(m) = refused {
            let _ = writeln!(out, "cluster {}: does not fit: {m}", cluster.name);
            continue;
        }
        if let Cow::Owned(_) = shape {
            let _ = writeln!(
                out,
                "cluster {}: as virtual node {virtual_node}: the pod's selection of its own labels ({}) holds; the nodes are judged without it",
                cluster.name,
                own.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let shape = shape.as_ref();
        let fit = fit_cluster(
            cluster,
            &inv.resources,
            shape,
            &bound,
            gang,
            config,
            strategy,
        );
        let verdict = match &fit.misfit {
            None => format!(
                "{gang} pod(s) fit on {}; score ({strategy:?}) {} of 10",
                fit.placements
                    .iter()
                    .map(|(i, n)| format!("{}×{n}", cluster.nodes[*i].name))
                    .collect::<Vec<_>>()
                    .join(", "),
                fit.score
            ),
            Some(m) => format!("does not fit: {m}"),
        };
        let _ = writeln!(out, "cluster {}: {verdict}", cluster.name);
        for node in &cluster.nodes {
            explain_node(&mut out, inv, node, shape, config, strategy);
        }
    }
    Ok(out)
}
