//! `switchyard explain`: for a person, why a pod fits or not on each node or cluster: per
//! resource the hints, the merged hint, the policy's verdict, and the score.

use crate::dispatcher::kind::Extra;
use crate::dispatcher::oracle::view::search;
use crate::dispatcher::oracle::GangPods;
use crate::inventory::{Inventory, Node, Scope};
use crate::placement::fit::topology_value;
use crate::placement::{
    fit_node, score, shape_for_cluster_nodes, EngineConfig, NodeFit, PodShape, Strategy,
};
use crate::topology::{NumaMask, TopologyHint};
use crate::workers::virtual_node::own_labels;
use std::borrow::Cow;
use std::fmt::Write;
use std::sync::Arc;

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
    indent: &str,
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
    let _ = writeln!(out, "{indent}  node {}: {verdict}", node.name);
    match &node.numa {
        None => {
            let _ = writeln!(out, "{indent}    no NUMA data: node-level resources only");
        }
        Some(numa) => {
            let _ = writeln!(
                out,
                "{indent}    topology manager: policy {}, scope {}, NUMA zones {}",
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
        let _ = writeln!(out, "{indent}    note: {note}");
    }
    // A pod kept together by a key goes only where the key is (InterPodAffinity).
    let unlabelled = shape
        .together
        .iter()
        .filter(|k| topology_value(node, k).is_none());
    for key in unlabelled {
        let _ = writeln!(
            out,
            "{indent}    note: node {} has no label {key}, by which its pods keep together: kube-scheduler binds none of them here",
            node.name
        );
    }
    for t in &fit.traces {
        let _ = writeln!(out, "{indent}    {}:", t.unit);
        for (resource, hints) in &t.hints {
            let list = match hints {
                None => "no preference".to_string(),
                Some(h) if h.is_empty() => "none possible".to_string(),
                Some(h) => h.iter().map(hint).collect::<Vec<_>>().join(" "),
            };
            let _ = writeln!(out, "{indent}      {resource}: hints {list}");
        }
        let _ = writeln!(
            out,
            "{indent}      merged {} -> {}",
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
        let _ = writeln!(out, "{indent}    score ({strategy:?}): {s} of 10");
    }
}

/// One pod shape of what `explain` judges.
pub struct Shape {
    /// The pod, with how many of the gang's pods are of its shape in
    /// `switchyard.dev/gang-size`.
    pub pod: PodShape,
    /// Of a JobSet whose replicated Jobs ask for different pods, the replicated Jobs whose
    /// pods these are, as a person names them ("replicated Job driver").
    pub part: Option<Arc<str>>,
}

/// What `explain --pod FILE` judges: its pods, and warnings about keys of the file that its
/// Kubernetes type does not have or that placement does not model ([`crate::unread`]).
pub struct PodFile {
    /// One shape for a Pod, a Job, or a JobSet whose replicated Jobs ask for the same pods;
    /// else one per shape, the one of the most pods first, as the dispatcher places them.
    pub shapes: Vec<Shape>,
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
/// JobSet as its pod templates, for the gang of all the pods the dispatcher places at once (a
/// Job's `parallelism`, at most its `completions`; every pod of a JobSet, one shape per group
/// of replicated Jobs that ask for the same pods), read as the dispatcher reads it.
pub fn read_pod_file(text: &str) -> Result<PodFile, PodFileError> {
    use crate::dispatcher::kind::Kind;
    use crate::unread::{self, KubeType, Owner, Step};
    let parse = |e: serde_yaml::Error| PodFileError::Parse(e.to_string());
    let text = crate::text::without_bom(text);
    let manifest: serde_json::Value = serde_yaml::from_str(text).map_err(parse)?;
    let kind = (manifest["apiVersion"].as_str())
        .zip(manifest["kind"].as_str())
        .and_then(|(api_version, kind)| Kind::of(api_version, kind));
    let (shapes, paths, ty, at) = match (kind, manifest["kind"].as_str()) {
        (Some(kind), _) => {
            let shapes = workload_shapes(&manifest, kind).map_err(PodFileError::Unjudgeable)?;
            let (paths, ty, at) = workload_keys(&manifest, kind);
            (shapes, paths, ty, at)
        }
        (None, None | Some("Pod")) => {
            // Read again from the text, for errors with their line.
            let view: crate::placement::PodView = serde_yaml::from_str(text).map_err(parse)?;
            let pod =
                PodShape::from_view(&view).map_err(|e| PodFileError::Unjudgeable(e.to_string()))?;
            let mut paths = unread::notable_in(&manifest, KubeType::Pod, &[]);
            let spec = [Step::Key("spec".into())];
            paths.extend(unread::unmodelled_terms(&spec, &pod.unmodelled_terms));
            let shape = Shape { pod, part: None };
            (vec![shape], paths, KubeType::Pod, 0)
        }
        (None, Some(other)) => return Err(PodFileError::OtherKind(other.to_string())),
    };
    let warnings = unread::judge(&paths, |_: &[Step]| Owner::Kubernetes(ty, at)).warnings;
    Ok(PodFile { shapes, warnings })
}

/// A workload's pods, with the gang size the dispatcher would place each shape with: the
/// pods of every shape go to one cluster at once.
fn workload_shapes(
    manifest: &serde_json::Value,
    kind: crate::dispatcher::kind::Kind,
) -> Result<Vec<Shape>, String> {
    use crate::placement::{GANG_SIZE_ANNOTATION, MAX_GANG_SIZE};
    let gang = kind.gang(manifest);
    let main = gang.shape.clone()?;
    let pods: u64 = gang.parts.iter().map(|p| u64::from(p.pods())).sum();
    if pods > MAX_GANG_SIZE as u64 {
        return Err(format!(
            "this {kind}'s gang of {pods} pods is more than explain judges ({MAX_GANG_SIZE})"
        ));
    }
    let others: u64 = gang.extra.iter().map(|e| u64::from(e.pods)).sum();
    let sized = |shape: &PodShape, pods: u64| {
        let mut pod = shape.clone();
        (pod.annotations).insert(GANG_SIZE_ANNOTATION.into(), pods.max(1).to_string());
        pod
    };
    let mut shapes = vec![Shape {
        pod: sized(&main, pods - others),
        part: gang.main_jobs.clone(),
    }];
    for e in &gang.extra {
        shapes.push(Shape {
            pod: sized(&e.shape, u64::from(e.pods)),
            part: Some(e.jobs.clone()),
        });
    }
    Ok(shapes)
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

/// The report, as plain text (`*` marks a preferred hint; `{0,1}` lists NUMA ids). A gang of
/// several pod shapes (a JobSet's replicated Jobs asking for different pods) is judged whole
/// in a cluster by the dispatcher's own search: the main part first, then each other part on
/// what the parts before it leave. On a node, one pod of each shape is judged on the node as
/// it is.
pub fn render(
    inv: &Inventory,
    shapes: &[Shape],
    target: Target<'_>,
    config: &EngineConfig,
) -> Result<String, String> {
    let main = &shapes.first().ok_or("no pod to judge")?.pod;
    let strategy = main.strategy(config.strategy);
    let sizes = (shapes.iter().map(|s| s.pod.gang_size())).collect::<Result<Vec<_>, _>>()?;
    let gang: usize = sizes.iter().sum();
    let several = shapes.len() > 1;
    let mut out = String::new();
    if several {
        let _ = writeln!(
            out,
            "jobset {}, gang of {gang} in {} pod shapes placed in one cluster; * marks a preferred hint",
            main.name,
            shapes.len()
        );
        for (shape, n) in shapes.iter().zip(&sizes) {
            let _ = writeln!(
                out,
                "  {}: {n} pod(s), {}{}",
                label(shape),
                qos(&shape.pod),
                apart(&shape.pod)
            );
        }
    } else {
        let _ = writeln!(
            out,
            "pod {} ({}), gang of {gang}{}; * marks a preferred hint",
            main.name,
            qos(main),
            apart(main)
        );
    }
    let as_given: Vec<(&Shape, &PodShape)> = shapes.iter().map(|s| (s, &s.pod)).collect();
    let clusters: Vec<_> = match target {
        Target::Node(name) => {
            let (cluster, node) = inv
                .node(name)
                .ok_or_else(|| format!("node {name:?} is not in the inventory"))?;
            let _ = writeln!(out, "cluster {}:", cluster.name);
            explain_nodes(&mut out, inv, &[node], &as_given, config, strategy);
            return Ok(out);
        }
        Target::Cluster(name) => vec![inv
            .cluster(name)
            .ok_or_else(|| format!("cluster {name:?} is not in the inventory"))?],
        Target::Everything => inv.clusters.iter().map(|c| c.as_ref()).collect(),
    };
    let bound = main.bind(&inv.resources);
    let prefix = crate::extender::ExtenderConfig::default().virtual_node_prefix;
    for cluster in clusters {
        // A cluster is judged as the extender judges its virtual node: what the pod asks of
        // the virtual node's own labels is not asked of the cluster's nodes.
        let virtual_node = format!("{prefix}{}", cluster.name);
        let own = own_labels(&virtual_node, &cluster.name, &cluster.labels);
        let judged: Result<Vec<Cow<PodShape>>, String> = shapes
            .iter()
            .map(|s| {
                shape_for_cluster_nodes(&s.pod, &virtual_node, &own).map_err(|m| match several {
                    true => format!("{}: {m}", label(s)),
                    false => m.to_string(),
                })
            })
            .collect();
        let judged = match judged {
            Ok(j) => j,
            Err(m) => {
                let _ = writeln!(out, "cluster {}: does not fit: {m}", cluster.name);
                continue;
            }
        };
        if judged.iter().any(|s| matches!(s, Cow::Owned(_))) {
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
        let extra: Vec<Extra> = (shapes.iter().zip(&judged).zip(&sizes).skip(1))
            .map(|((s, j), n)| Extra {
                shape: Arc::new(j.as_ref().clone()),
                pods: u32::try_from(*n).unwrap_or(u32::MAX),
                jobs: label(s).into(),
            })
            .collect();
        let pods = GangPods {
            shape: &judged[0],
            pods: sizes[0],
            extra: &extra,
            main_jobs: shapes[0].part.as_ref(),
            strategy,
        };
        let found = search(cluster, &inv.resources, pods, &bound, config);
        let on = |placements: &[(usize, usize)]| {
            (placements.iter())
                .map(|(i, n)| format!("{}×{n}", cluster.nodes[*i].name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let verdict = match &found.fit.misfit {
            None if several => format!(
                "{gang} pod(s) fit: {}; score ({strategy:?}) {} of 10",
                (shapes.iter().zip(&found.placed))
                    .map(|(s, p)| format!("{} on {}", label(s), on(p)))
                    .collect::<Vec<_>>()
                    .join("; "),
                found.fit.score
            ),
            None => format!(
                "{gang} pod(s) fit on {}; score ({strategy:?}) {} of 10",
                on(&found.fit.placements),
                found.fit.score
            ),
            // A part of several that does not fit is named in the misfit.
            Some(m) => format!("does not fit: {m}"),
        };
        let _ = writeln!(out, "cluster {}: {verdict}", cluster.name);
        let judged: Vec<(&Shape, &PodShape)> =
            shapes.iter().zip(&judged).map(|(s, j)| (s, &**j)).collect();
        let nodes: Vec<&Node> = cluster.nodes.iter().map(|n| &**n).collect();
        explain_nodes(&mut out, inv, &nodes, &judged, config, strategy);
    }
    Ok(out)
}

/// Each node judged for one pod of each shape: under a heading per shape when there are
/// several.
fn explain_nodes(
    out: &mut String,
    inv: &Inventory,
    nodes: &[&Node],
    shapes: &[(&Shape, &PodShape)],
    config: &EngineConfig,
    strategy: Strategy,
) {
    let several = shapes.len() > 1;
    for (shape, pod) in shapes {
        let indent = if several {
            let _ = writeln!(out, "  {}, a pod on each node as it is:", label(shape));
            "  "
        } else {
            ""
        };
        for node in nodes {
            explain_node(out, inv, node, pod, config, strategy, indent);
        }
    }
}

/// A shape's pods as a person knows them: by their replicated Jobs' names.
fn label(shape: &Shape) -> &str {
    shape.part.as_deref().unwrap_or("the pods")
}

fn qos(pod: &PodShape) -> &'static str {
    if pod.guaranteed {
        "Guaranteed QoS"
    } else {
        "not Guaranteed: CPU and memory are not NUMA-aligned"
    }
}

/// How the pods keep apart, if they do: after the QoS.
fn apart(pod: &PodShape) -> String {
    let mut out = String::new();
    if pod.one_per_node {
        out += ", one pod to a node (its required pod anti-affinity)";
    }
    if let Some(s) = &pod.spread {
        out += &format!(
            ", spread over nodes at most {} apart (its topology spread constraint)",
            s.max_skew
        );
    }
    if !pod.together.is_empty() {
        out += &format!(
            ", kept together in one {} (its required pod affinity)",
            pod.together.join(" and ")
        );
    }
    out
}
