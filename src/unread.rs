//! The keys of a YAML file that parsing did not read, and what to say about them.
//!
//! Switchyard's file formats (scenario, inventory, a pod for `explain`) hold Kubernetes objects
//! or parts of them: a Job's pod template, a node's taints, a NodeResourceTopology's zones. The
//! parsers read only what placement needs and skip the rest, so a pod template may carry an
//! `image` or a `command` as it would in a real Job. A misspelt key (`resorces:`) would be
//! skipped the same way, and the pod would be simulated with no requests. The rule here tells
//! the two apart: a key the Kubernetes type has is skipped in silence; one it does not have is
//! reported. Kubernetes' shapes give a warning, not an error, because the cluster the object
//! came from may be newer than the v1.33 types Switchyard knows (as the API server may be).
//! A key no Switchyard type reads inside Switchyard's own settings (a queue's) is an error.
//! A pod spec field that kube-scheduler places by and Switchyard's placement does not model
//! (`podAffinity`, …) gets a warning too: the file's pods are placed without it.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Taint};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::sync::LazyLock;

/// One step of a path into a YAML document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// Where a key sits in a document: `jobs[0].template.containers[0].resorces`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KeyPath(pub Vec<Step>);

impl KeyPath {
    fn from_ignored(path: &serde_ignored::Path) -> KeyPath {
        let mut steps = Vec::new();
        let mut at = path;
        loop {
            match at {
                serde_ignored::Path::Root => break,
                serde_ignored::Path::Seq { parent, index } => {
                    steps.push(Step::Index(*index));
                    at = parent;
                }
                serde_ignored::Path::Map { parent, key } => {
                    steps.push(Step::Key(key.clone()));
                    at = parent;
                }
                serde_ignored::Path::Some { parent }
                | serde_ignored::Path::NewtypeStruct { parent }
                | serde_ignored::Path::NewtypeVariant { parent } => at = parent,
            }
        }
        steps.reverse();
        KeyPath(steps)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Key(k) if i == 0 => write!(f, "{k}")?,
                Step::Key(k) => write!(f, ".{k}")?,
                Step::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// `T` from the YAML `text` (a byte order mark skipped), with the path of every key its
/// parser skipped.
pub fn from_yaml<T: DeserializeOwned>(text: &str) -> Result<(T, Vec<KeyPath>), serde_yaml::Error> {
    let mut unread = Vec::new();
    let de = serde_yaml::Deserializer::from_str(crate::text::without_bom(text));
    let value = serde_ignored::deserialize(de, |path| unread.push(KeyPath::from_ignored(&path)))?;
    Ok((value, unread))
}

/// The Kubernetes types whose parts Switchyard's files hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeType {
    Job,
    Pod,
    PodSpec,
    Taint,
    /// A NodeResourceTopology object (`topology.node.k8s.io/v1alpha2`), as a node's
    /// `topology` holds it.
    NodeResourceTopology,
}

/// The fields of a pod spec that kube-scheduler places pods by and Switchyard's placement
/// does not model: it judges a pod by its requests, NUMA alignment, node selector, required
/// node affinity and tolerations. In a real cluster kube-scheduler applies these itself
/// (the extender only filters what is left); `simulate` and `explain` place without them.
const NOT_MODELLED: [&[&str]; 6] = [
    &[
        "affinity",
        "podAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ],
    &[
        "affinity",
        "podAntiAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ],
    &[
        "affinity",
        "nodeAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ],
    &["nodeName"],
    &["schedulingGates"],
    &["resourceClaims"],
];

/// Where a pod spec's required anti-affinity terms are: placement models those that keep a
/// Job's own pods one to a node ([`crate::placement::apart`]), and a term it does not model is
/// named by its index, from [`unmodelled_terms`] (a walk of the keys never names one).
const ANTI_AFFINITY_TERMS: [&str; 3] = [
    "affinity",
    "podAntiAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
];

/// Where a pod spec's topology spread constraints are: placement models one that spreads a
/// Job's own pods over nodes, and names the others by index, as anti-affinity terms.
const SPREAD_CONSTRAINTS: [&str; 1] = ["topologySpreadConstraints"];

/// Where a pod spec's required pod affinity terms are: placement models those that keep a
/// Job's own pods together, and names the others by index, as anti-affinity terms.
const AFFINITY_TERMS: [&str; 3] = [
    "affinity",
    "podAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
];

/// The paths of the required anti-affinity terms and spread constraints placement does not
/// model (`terms`) in the pod spec at `at`.
pub(crate) fn unmodelled_terms(
    at: &[Step],
    terms: &[crate::placement::apart::Unmodelled],
) -> Vec<KeyPath> {
    use crate::placement::apart::Unmodelled;
    terms
        .iter()
        .map(|term| {
            let (list, i): (&[&str], usize) = match *term {
                Unmodelled::AntiAffinity(i) => (&ANTI_AFFINITY_TERMS, i),
                Unmodelled::Spread(i) => (&SPREAD_CONSTRAINTS, i),
                Unmodelled::Affinity(i) => (&AFFINITY_TERMS, i),
            };
            let mut path = at.to_vec();
            path.extend(list.iter().map(|k| Step::Key(k.to_string())));
            path.push(Step::Index(i));
            KeyPath(path)
        })
        .collect()
}

impl KubeType {
    /// The type as a warning names it, with the version whose fields are known.
    fn name(self) -> &'static str {
        match self {
            KubeType::Job => "Kubernetes v1.33 Job",
            KubeType::Pod => "Kubernetes v1.33 Pod",
            KubeType::PodSpec => "Kubernetes v1.33 PodSpec",
            KubeType::Taint => "Kubernetes v1.33 Taint",
            KubeType::NodeResourceTopology => {
                "NodeResourceTopology (topology.node.k8s.io/v1alpha2)"
            }
        }
    }

    /// Whether the type has a field at `path` (relative to the object).
    pub fn has(self, path: &[Step]) -> bool {
        match self {
            KubeType::Job => schema_has(&JOB, path),
            KubeType::Pod => schema_has(&POD, path),
            KubeType::PodSpec => schema_has(&POD_SPEC, path),
            KubeType::Taint => schema_has(&TAINT, path),
            KubeType::NodeResourceTopology => topology_has(path),
        }
    }

    /// Where a pod spec sits in an object of this type.
    fn pod_spec(self) -> Option<&'static [&'static str]> {
        match self {
            KubeType::PodSpec => Some(&[]),
            KubeType::Pod => Some(&["spec"]),
            KubeType::Job => Some(&["spec", "template", "spec"]),
            KubeType::Taint | KubeType::NodeResourceTopology => None,
        }
    }

    /// Whether `path` is a pod spec's field that placement does not model ([`NOT_MODELLED`]).
    fn not_modelled(self, path: &[Step]) -> bool {
        let Some(at) = self.pod_spec() else {
            return false;
        };
        let is = |names: &[&str], steps: &[Step]| {
            names.len() == steps.len()
                && names
                    .iter()
                    .zip(steps)
                    .all(|(n, s)| matches!(s, Step::Key(k) if k == n))
        };
        if path.len() <= at.len() || !is(at, &path[..at.len()]) {
            return false;
        }
        let field = &path[at.len()..];
        NOT_MODELLED.iter().any(|f| is(f, field))
            || matches!(field, [rest @ .., Step::Index(_)]
                if is(&ANTI_AFFINITY_TERMS, rest)
                    || is(&SPREAD_CONSTRAINTS, rest)
                    || is(&AFFINITY_TERMS, rest))
    }
}

static JOB: LazyLock<Value> = LazyLock::new(schema_of::<Job>);
static POD: LazyLock<Value> = LazyLock::new(schema_of::<Pod>);
static POD_SPEC: LazyLock<Value> = LazyLock::new(schema_of::<PodSpec>);
static TAINT: LazyLock<Value> = LazyLock::new(schema_of::<Taint>);

fn schema_of<T: schemars::JsonSchema>() -> Value {
    schemars::SchemaGenerator::default()
        .into_root_schema_for::<T>()
        .to_value()
}

/// Whether the JSON schema `root` has a field at `path`: each key a property of the object
/// there (or any key, where the object is a map or keeps unknown fields), each index an item
/// of the array there.
fn schema_has(root: &Value, path: &[Step]) -> bool {
    let mut node = root;
    for step in path {
        node = resolved(root, node);
        if open(node) {
            return true;
        }
        let next = match step {
            Step::Key(k) => node
                .get("properties")
                .and_then(|p| p.get(k))
                .or_else(|| node.get("additionalProperties").filter(|a| a.is_object())),
            Step::Index(_) => node.get("items"),
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    true
}

/// The schema `node` stands for: a `$ref` followed, and of an `anyOf` / `oneOf` / `allOf`
/// (how an optional field or a union is written) the first branch that is not `null`. At
/// most 16 such steps: a schema that refers to itself cannot make it loop.
fn resolved<'a>(root: &'a Value, mut node: &'a Value) -> &'a Value {
    for _ in 0..16 {
        if let Some(target) = node.get("$ref").and_then(Value::as_str) {
            match target.strip_prefix('#').and_then(|p| root.pointer(p)) {
                Some(n) => node = n,
                None => return node,
            }
        } else if let Some(branches) = ["anyOf", "oneOf", "allOf"]
            .iter()
            .find_map(|k| node.get(*k).and_then(Value::as_array))
        {
            match branches
                .iter()
                .find(|b| b.get("type") != Some(&"null".into()))
            {
                Some(n) => node = n,
                None => return node,
            }
        } else {
            return node;
        }
    }
    node
}

/// A schema that takes any key: `additionalProperties: true`, unknown fields kept, or an
/// object whose fields it does not describe (a managed field's `fieldsV1`, a raw extension).
fn open(node: &Value) -> bool {
    let free_form = node.get("type") == Some(&Value::from("object"))
        && node.get("properties").is_none()
        && node.get("additionalProperties").is_none();
    free_form
        || node.get("additionalProperties") == Some(&Value::Bool(true))
        || node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// The fields of a NodeResourceTopology (v1alpha2; no Rust type of it is published) that the
/// inventory format does not read: the object's own (`apiVersion`, `metadata`, …) and a
/// zone's `parent` and `attributes`. Everything else it has, the format reads.
fn topology_has(path: &[Step]) -> bool {
    match path {
        [Step::Key(k), ..] if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") => true,
        [Step::Key(k)] => k == "topologyPolicies",
        [Step::Key(z), Step::Index(_), Step::Key(k)] if z == "zones" => {
            matches!(k.as_str(), "parent" | "attributes")
        }
        _ => false,
    }
}

/// The keys of `value` (a part of a document read whole, at `at`) that [`judge`] speaks of:
/// those `ty` does not have, and the pod spec fields placement does not model; each with
/// its path in the document, the keys under it not looked at.
pub fn notable_in(value: &Value, ty: KubeType, at: &[Step]) -> Vec<KeyPath> {
    fn walk(v: &Value, ty: KubeType, base: usize, path: &mut Vec<Step>, out: &mut Vec<KeyPath>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    path.push(Step::Key(k.clone()));
                    let here = &path[base..];
                    if ty.has(here) && !ty.not_modelled(here) {
                        walk(child, ty, base, path, out);
                    } else {
                        out.push(KeyPath(path.clone()));
                    }
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    path.push(Step::Index(i));
                    walk(child, ty, base, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut path = at.to_vec();
    let mut out = Vec::new();
    walk(value, ty, at.len(), &mut path, &mut out);
    out
}

/// What a skipped key is, by the part of the file it sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A part that is a Kubernetes type, from the path's `at`th step on.
    Kubernetes(KubeType, usize),
    /// Switchyard's own settings: every key is read, so a skipped one is a mistake.
    Switchyard,
}

/// The skipped keys of a file, sorted by what they are.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unread {
    /// Keys of Switchyard's own settings that nothing reads: errors.
    pub errors: Vec<String>,
    /// Keys a Kubernetes type does not have (a misspelling, or a newer Kubernetes): warnings.
    pub warnings: Vec<String>,
}

/// At most this many warnings are listed one by one; the rest are counted.
pub const LISTED: usize = 5;

/// Sorts `paths` by `owner` (which part of the file each is in): a key of Switchyard's own
/// settings is an error; a key its Kubernetes type does not have, or a pod spec field that
/// placement does not model, a warning; any other key of a Kubernetes type is dropped.
pub fn judge(paths: &[KeyPath], owner: impl Fn(&[Step]) -> Owner) -> Unread {
    let mut out = Unread::default();
    let mut warnings = 0usize;
    for path in paths {
        let warning = match owner(&path.0) {
            Owner::Switchyard => {
                out.errors.push(format!("{path}: unknown field"));
                continue;
            }
            Owner::Kubernetes(ty, at) => {
                let field = &path.0[at.min(path.0.len())..];
                if !ty.has(field) {
                    format!("{path}: not a field of a {}; skipped", ty.name())
                } else if ty.not_modelled(field) {
                    format!("{path}: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)")
                } else {
                    continue;
                }
            }
        };
        warnings += 1;
        if out.warnings.len() < LISTED {
            out.warnings.push(warning);
        }
    }
    if warnings > LISTED {
        out.warnings.push(format!(
            "and {} more warnings like these",
            warnings - LISTED
        ));
    }
    out
}

/// Which part of the inventory format (which a scenario's `clusters` share) a key at `path`
/// is in: a node's `taints` items and `topology` are Kubernetes types, the rest under
/// `clusters[i].nodes[j]` the format's own; `None` outside the nodes.
pub fn clusters_owner(path: &[Step]) -> Option<Owner> {
    let [Step::Key(c), Step::Index(_), Step::Key(n), Step::Index(_), node @ ..] = path else {
        return None;
    };
    if c != "clusters" || n != "nodes" {
        return None;
    }
    Some(match node {
        [Step::Key(k), Step::Index(_), ..] if k == "taints" => {
            Owner::Kubernetes(KubeType::Taint, 6)
        }
        [Step::Key(k), ..] if k == "topology" => {
            Owner::Kubernetes(KubeType::NodeResourceTopology, 5)
        }
        _ => Owner::Switchyard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> Vec<Step> {
        s.split('.')
            .map(|p| match p.parse::<usize>() {
                Ok(n) => Step::Index(n),
                Err(_) => Step::Key(p.into()),
            })
            .collect()
    }

    #[test]
    fn kubernetes_types_know_their_fields_and_not_others() {
        let spec = KubeType::PodSpec;
        for known in [
            "containers.0.image",
            "containers.0.resources.claims",
            "containers.3.env.0.valueFrom.secretKeyRef.name",
            "initContainers.0.command",
            "affinity.podAntiAffinity",
            "nodeSelector.any-label",
            "overhead.cpu",
            "volumes.1.persistentVolumeClaim",
            "restartPolicy",
        ] {
            assert!(spec.has(&path(known)), "{known}");
        }
        for unknown in [
            "resorces",
            "containers.0.resorces",
            "containers.0.resources.request",
            "affinity.nodeAfinity",
            "volumes.0.emptyDir.sizelimit",
        ] {
            assert!(!spec.has(&path(unknown)), "{unknown}");
        }
        assert!(KubeType::Pod.has(&path("metadata.labels")));
        assert!(KubeType::Pod.has(&path("status.phase")));
        assert!(KubeType::Pod.has(&path("metadata.managedFields.0.fieldsV1.f:spec")));
        assert!(!KubeType::Pod.has(&path("spce")));
        assert!(KubeType::Taint.has(&path("timeAdded")));
        assert!(!KubeType::Taint.has(&path("efect")));
        assert!(KubeType::NodeResourceTopology.has(&path("zones.0.parent")));
        assert!(KubeType::NodeResourceTopology.has(&path("metadata.name")));
        assert!(!KubeType::NodeResourceTopology.has(&path("zones.0.resorces")));
        assert!(!KubeType::NodeResourceTopology.has(&path("zone")));
    }

    #[test]
    fn keys_of_a_document_read_whole_are_judged_against_the_type() {
        let job = serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "a", "labels": {"any": "x"}},
            "spec": {"parallelism": 2, "paralelism": 3, "template": {"spec": {
                "containers": [{"name": "c", "image": "i", "resorces": {"requests": {"cpu": "1"}}}],
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}],
                        "preferredDuringSchedulingIgnoredDuringExecution": []
                    }
                },
                "topologySpreadConstraints": [{"maxSkew": 1}]
            }}}
        });
        let mut found = notable_in(&job, KubeType::Job, &[]);
        found.sort_by_key(|p| p.to_string());
        let shown: Vec<String> = found.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "spec.paralelism",
                "spec.template.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution",
                "spec.template.spec.containers[0].resorces",
            ]
        );
        let warnings = judge(&found, |_| Owner::Kubernetes(KubeType::Job, 0)).warnings;
        assert_eq!(
            warnings[1],
            "spec.template.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)"
        );
        // A required term is named by its index, when the pod's analysis finds it is not
        // modelled; the walk never names one.
        let terms = unmodelled_terms(
            &path("spec.template.spec"),
            &[crate::placement::apart::Unmodelled::AntiAffinity(0)],
        );
        assert_eq!(
            terms[0].to_string(),
            "spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        );
        let said = judge(&terms, |_| Owner::Kubernetes(KubeType::Job, 0)).warnings;
        assert!(
            said[0].ends_with("[0]: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)"),
            "{said:?}"
        );
        // So is a spread constraint (the walk never names `topologySpreadConstraints`).
        let spread = unmodelled_terms(
            &path("spec.template.spec"),
            &[crate::placement::apart::Unmodelled::Spread(1)],
        );
        let said = judge(&spread, |_| Owner::Kubernetes(KubeType::Job, 0)).warnings;
        assert!(
            said[0]
                .starts_with("spec.template.spec.topologySpreadConstraints[1]: placed without it"),
            "{said:?}"
        );
        assert!(warnings[2].ends_with("not a field of a Kubernetes v1.33 Job; skipped"));
        let warnings = judge(&found, |_| Owner::Kubernetes(KubeType::PodSpec, 3)).warnings;
        // The same paths as a pod spec's at step 3: `spec.paralelism` is not in it.
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        let mut spec = job["spec"]["template"]["spec"].clone();
        spec.as_object_mut().unwrap().remove("affinity");
        spec.as_object_mut()
            .unwrap()
            .remove("topologySpreadConstraints");
        let at = path("spec.replicatedJobs.1.template.spec.template.spec");
        let shown: Vec<String> = notable_in(&spec, KubeType::PodSpec, &at)
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            shown,
            ["spec.replicatedJobs[1].template.spec.template.spec.containers[0].resorces"]
        );
    }

    #[test]
    fn an_inventorys_taints_and_topologies_are_judged_as_kubernetes_types() {
        let text = r#"
clusters:
  - name: a
    nodes:
      - name: n
        allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
        taints:
          - {key: k, value: v, effect: NoSchedule, timeAdded: "2026-11-29T00:00:00Z"}
          - {key: k, vaule: v, effect: NoSchedule}
        topology:
          metadata: {name: n}
          attributes: [{name: topologyManagerPolicy, value: single-numa-node}]
          zones:
            - name: node-0
              type: Node
              parent: socket-0
              resorces: []
"#;
        let loaded = crate::inventory::parse(text).unwrap();
        assert_eq!(
            loaded.warnings,
            [
                "clusters[0].nodes[0].taints[1].vaule: not a field of a Kubernetes v1.33 Taint; skipped",
                "clusters[0].nodes[0].topology.zones[0].resorces: not a field of a NodeResourceTopology (topology.node.k8s.io/v1alpha2); skipped",
            ]
        );
    }

    #[test]
    fn skipped_keys_are_found_with_their_paths() {
        #[derive(serde::Deserialize)]
        struct Doc {
            #[allow(dead_code)]
            items: Vec<Item>,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            #[allow(dead_code)]
            name: String,
        }
        let (_, unread) = from_yaml::<Doc>(
            "\u{feff}items:\n  - {name: a, colour: red}\n  - name: b\n    size: {x: 1}\nother: 1\n",
        )
        .unwrap();
        let shown: Vec<String> = unread.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown, ["items[0].colour", "items[1].size", "other"]);
    }

    #[test]
    fn judging_counts_what_it_does_not_list() {
        let paths: Vec<KeyPath> = (0..8)
            .map(|i| KeyPath(path(&format!("jobs.{i}.template.containers.0.resorces"))))
            .chain([KeyPath(path("jobs.0.template.containers.0.image"))])
            .chain([KeyPath(path("queues.0.colour"))])
            .collect();
        let unread = judge(&paths, |p| match p.first() {
            Some(Step::Key(k)) if k == "jobs" => Owner::Kubernetes(KubeType::PodSpec, 3),
            _ => Owner::Switchyard,
        });
        assert_eq!(unread.errors, ["queues[0].colour: unknown field"]);
        assert_eq!(unread.warnings.len(), LISTED + 1);
        assert_eq!(
            unread.warnings[0],
            "jobs[0].template.containers[0].resorces: not a field of a Kubernetes v1.33 PodSpec; skipped"
        );
        assert_eq!(unread.warnings[LISTED], "and 3 more warnings like these");
    }
}
