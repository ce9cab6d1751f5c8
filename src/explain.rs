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

/// What `explain --pod FILE` judges: the pod, and warnings about keys of the file that its
/// Kubernetes type does not have or that placement does not model ([`crate::unread`]).
pub struct PodFile {
    pub shape: PodShape,
    pub warnings: Vec<String>,
}

/// Why a pod file cannot be judged; each message follows the file's name.
#[derive(Debug, thiserror::Error)]
pub enum PodFileError {
    #[error("is not a Pod manifest: {0}")]
    Parse(String),
    /// Its spec read as a pod's would be a pod with no containers, which fits everywhere.
    #[error("is a {0}: explain judges a Pod, a batch/v1 Job or a jobset.x-k8s.io/v1alpha2 JobSet; give it a Pod whose spec is the {0}'s pod template's")]
    OtherKind(String),
    #[error("cannot be judged: {0}")]
    Unjudgeable(String),
}

/// A pod file read: a Pod (or a manifest with no `kind`) as it is; a batch/v1 Job or a
/// JobSet as its pod template, for the gang of all the pods the dispatcher places at once
/// (a Job's `parallelism`, at most its `completions`; every pod of a JobSet, whose
/// replicated Jobs must then share one pod shape), read as the dispatcher reads it.
pub fn read_pod_file(text: &str) -> Result<PodFile, PodFileError> {
    use crate::dispatcher::kind::Kind;
    use crate::unread::{self, KubeType, Owner, Step};
    let parse = |e: serde_yaml::Error| PodFileError::Parse(e.to_string());
    let text = crate::text::without_bom(text);
    let manifest: serde_json::Value = serde_yaml::from_str(text).map_err(parse)?;
    let kind = (manifest["apiVersion"].as_str())
        .zip(manifest["kind"].as_str())
        .and_then(|(api_version, kind)| Kind::of(api_version, kind));
    let (shape, paths, ty, at) = match (kind, manifest["kind"].as_str()) {
        (Some(kind), _) => {
            let shape = workload_pod(&manifest, kind).map_err(PodFileError::Unjudgeable)?;
            let (paths, ty, at) = workload_keys(&manifest, kind);
            (shape, paths, ty, at)
        }
        (None, None | Some("Pod")) => {
            // Read again from the text, for errors with their line.
            let view: crate::placement::PodView = serde_yaml::from_str(text).map_err(parse)?;
            let shape =
                PodShape::from_view(&view).map_err(|e| PodFileError::Unjudgeable(e.to_string()))?;
            let mut paths = unread::notable_in(&manifest, KubeType::Pod, &[]);
            let spec = [Step::Key("spec".into())];
            paths.extend(unread::unmodelled_terms(&spec, &shape.unmodelled_terms));
            (shape, paths, KubeType::Pod, 0)
        }
        (None, Some(other)) => return Err(PodFileError::OtherKind(other.to_string())),
    };
    let warnings = unread::judge(&paths, |_: &[Step]| Owner::Kubernetes(ty, at)).warnings;
    Ok(PodFile { shape, warnings })
}

/// A workload's pod, with the gang size the dispatcher would place it with.
fn workload_pod(
    manifest: &serde_json::Value,
    kind: crate::dispatcher::kind::Kind,
) -> Result<PodShape, String> {
    use crate::placement::{GANG_SIZE_ANNOTATION, MAX_GANG_SIZE};
    let gang = kind.gang(manifest);
    let shape = gang.shape?;
    if !gang.extra.is_empty() {
        return Err(format!(
            "this {kind}'s replicated Jobs ask for {} pod shapes; explain judges one: give it a Pod with one of their templates",
            gang.extra.len() + 1
        ));
    }
    let pods: u64 = gang.parts.iter().map(|p| u64::from(p.pods())).sum();
    if pods > MAX_GANG_SIZE as u64 {
        return Err(format!(
            "this {kind}'s gang of {pods} pods is more than explain judges ({MAX_GANG_SIZE})"
        ));
    }
    let mut shape = (*shape).clone();
    (shape.annotations).insert(GANG_SIZE_ANNOTATION.into(), pods.max(1).to_string());
    Ok(shape)
}

/// The keys of a workload to speak of, and the type and step they are judged from: a Job is
/// judged whole; of a JobSet (no published Rust type), its pod templates.
fn workload_keys(
    manifest: &serde_json::Value,
    kind: crate::dispatcher::kind::Kind,
) -> (Vec<crate::unread::KeyPath>, crate::unread::KubeType, usize) {
    use crate::dispatcher::kind::Kind;
    use crate::unread::{notable_in, KubeType, Step};
    /// Where a JobSet's pod template spec sits in a replicated Job.
    const POD_SPEC: [&str; 4] = ["template", "spec", "template", "spec"];
    let keys =
        |steps: &[&str]| -> Vec<Step> { steps.iter().map(|k| Step::Key(k.to_string())).collect() };
    match kind {
        Kind::Job => {
            let mut paths = notable_in(manifest, KubeType::Job, &[]);
            let template = &manifest["spec"]["template"];
            let at = keys(&["spec", "template", "spec"]);
            paths.extend(unmodelled_in(manifest, kind, template, &at));
            (paths, KubeType::Job, 0)
        }
        Kind::JobSet => {
            let jobs = manifest["spec"]["replicatedJobs"].as_array();
            let paths = (jobs.into_iter().flatten().enumerate())
                .flat_map(|(i, job)| {
                    let mut at = keys(&["spec", "replicatedJobs"]);
                    at.push(Step::Index(i));
                    at.extend(keys(&POD_SPEC));
                    let spec = POD_SPEC.iter().fold(job, |v, k| &v[*k]);
                    let template = &job["template"]["spec"]["template"];
                    let mut paths = notable_in(spec, KubeType::PodSpec, &at);
                    paths.extend(unmodelled_in(manifest, kind, template, &at));
                    paths
                })
                .collect();
            (paths, KubeType::PodSpec, 3 + POD_SPEC.len())
        }
    }
}

/// The required anti-affinity terms of a workload's pod template (`{metadata, spec}`, its
/// spec at `at`) that placement does not model, judged with the labels the workload's pods
/// will carry.
fn unmodelled_in(
    manifest: &serde_json::Value,
    kind: crate::dispatcher::kind::Kind,
    template: &serde_json::Value,
    at: &[crate::unread::Step],
) -> Vec<crate::unread::KeyPath> {
    let meta = &manifest["metadata"];
    let workload = (
        kind,
        meta["name"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or_default(),
    );
    match crate::dispatcher::kind::template_shape(template, workload, "").0 {
        Ok(shape) => crate::unread::unmodelled_terms(at, &shape.unmodelled_terms),
        Err(_) => Vec::new(),
    }
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
        "pod {} ({}), gang of {gang}{}; * marks a preferred hint",
        shape.name,
        if shape.guaranteed {
            "Guaranteed QoS"
        } else {
            "not Guaranteed: CPU and memory are not NUMA-aligned"
        },
        if shape.one_per_node {
            ", one pod to a node (its required pod anti-affinity)"
        } else {
            ""
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
