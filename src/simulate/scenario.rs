//! The scenario file of `switchyard simulate --scenario FILE` (format in
//! `tests/data/formats/scenario.example.yaml`): clusters in the inventory format, queues in the
//! DispatchQueue spec's shape, and Jobs with their simulated behaviour.

use crate::api::{KubeDuration, NamedQueueSpec, QueueSettings};
use crate::inventory::file::{build, ClusterSpec, NodeSpec};
use crate::inventory::Inventory;
use crate::placement::{PodShape, PodSpecView, PodView};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario is not valid YAML for the scenario format: {0}")]
    Parse(String),
    #[error("scenario: {0}")]
    Invalid(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    clusters: Vec<ClusterFile>,
    #[serde(default)]
    queues: Vec<NamedQueueSpec>,
    #[serde(default)]
    jobs: Vec<JobFile>,
}

/// A cluster of the inventory format ([`ClusterSpec`]'s fields, spelled out rather than
/// flattened so that a mistake in a node is reported with its path and line), plus what only
/// a simulated worker has.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClusterFile {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    nodes: Vec<NodeSpec>,
    /// As `WorkerCluster.spec.schedulerName`: the worker places the copies' pods with its
    /// NUMA-aware scheduler.
    scheduler_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobFile {
    name: String,
    namespace: Option<String>,
    queue: String,
    submit_at: KubeDuration,
    parallelism: u32,
    completions: Option<u32>,
    priority: Option<i32>,
    duration: KubeDuration,
    pod_start_delay: Option<KubeDuration>,
    fails: Option<bool>,
    #[serde(default)]
    template: PodSpecView,
}

/// One Job of the scenario, parsed.
#[derive(Debug, Clone)]
pub struct ScenarioJob {
    pub name: String,
    pub(crate) namespace: String,
    pub(crate) queue: String,
    pub submit_at: Duration,
    pub parallelism: u32,
    pub completions: u32,
    pub(crate) priority: i32,
    pub(crate) duration: Duration,
    pub pod_start_delay: Duration,
    pub(crate) fails: bool,
    pub pod: Arc<PodShape>,
    /// Jobs with equal keys have identical templates.
    pub(crate) shape_key: u64,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub inventory: Inventory,
    pub queues: Vec<(String, QueueSettings)>,
    pub jobs: Vec<ScenarioJob>,
    /// Per inventory cluster (same order), its `schedulerName`.
    pub(crate) scheduler_names: Vec<Option<String>>,
}

impl Scenario {
    /// The `schedulerName` of cluster `name`: its pods are placed NUMA-aware. `None`: the
    /// default scheduler's, NUMA-unaware (or no such cluster).
    pub fn scheduler_name(&self, cluster: &str) -> Option<&str> {
        let i = self
            .inventory
            .clusters
            .iter()
            .position(|c| c.name == cluster)?;
        self.scheduler_names.get(i)?.as_deref()
    }
}

/// The example bundled with the binary: the run of `switchyard simulate` without a scenario.
pub const BUNDLED: &str = include_str!("../../examples/scenario.yaml");

pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    let file: File = serde_yaml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
    let mut scheduler_names = Vec::with_capacity(file.clusters.len());
    let mut specs = Vec::with_capacity(file.clusters.len());
    for (i, c) in file.clusters.into_iter().enumerate() {
        if let Some(name) = &c.scheduler_name {
            if !crate::api::is_dns1123_subdomain(name) {
                return Err(ScenarioError::Invalid(format!(
                    "clusters[{i}] ({}): schedulerName: {name:?} is not a DNS-1123 subdomain (a scheduler profile's name)",
                    c.name
                )));
            }
        }
        scheduler_names.push(c.scheduler_name);
        specs.push(ClusterSpec {
            name: c.name,
            labels: c.labels,
            nodes: c.nodes,
        });
    }
    let inventory = build(specs).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
    let clusters: BTreeSet<&str> = inventory.clusters.iter().map(|c| c.name.as_str()).collect();

    let mut queues = Vec::new();
    let mut names = BTreeSet::new();
    for q in &file.queues {
        if !names.insert(q.name.clone()) {
            return Err(ScenarioError::Invalid(format!(
                "queue {:?} appears twice",
                q.name
            )));
        }
        q.validate()
            .map_err(|e| ScenarioError::Invalid(format!("queue {:?}: {}", q.name, e.join("; "))))?;
        let settings = q
            .spec
            .resolve()
            .map_err(|e| ScenarioError::Invalid(format!("queue {:?}: {}", q.name, e.join("; "))))?;
        for c in &settings.clusters {
            if !clusters.contains(c.as_str()) {
                return Err(ScenarioError::Invalid(format!(
                    "queue {:?}: cluster {c:?} is not among the scenario's clusters",
                    q.name
                )));
            }
        }
        queues.push((q.name.clone(), settings));
    }

    let mut jobs = Vec::with_capacity(file.jobs.len());
    let mut seen = BTreeSet::new();
    let mut shapes: BTreeMap<String, (u64, Arc<PodShape>)> = BTreeMap::new();
    for (i, j) in file.jobs.into_iter().enumerate() {
        let at = |field: &str| format!("jobs[{i}] ({}): {field}", j.name);
        let namespace = j.namespace.clone().unwrap_or_else(|| "default".into());
        if !crate::api::is_dns1123_label(&namespace) {
            return Err(ScenarioError::Invalid(format!(
                "{}: {namespace:?} is not a namespace name",
                at("namespace")
            )));
        }
        if !seen.insert((namespace.clone(), j.name.clone())) {
            return Err(ScenarioError::Invalid(format!(
                "{}: a Job {namespace}/{} appears twice",
                at("name"),
                j.name
            )));
        }
        if !names.contains(&j.queue) {
            return Err(ScenarioError::Invalid(format!(
                "{}: no queue named {:?}",
                at("queue"),
                j.queue
            )));
        }
        if j.parallelism == 0 {
            return Err(ScenarioError::Invalid(format!(
                "{}: must be at least 1",
                at("parallelism")
            )));
        }
        let completions = j.completions.unwrap_or(j.parallelism);
        if completions == 0 {
            return Err(ScenarioError::Invalid(format!(
                "{}: must be at least 1",
                at("completions")
            )));
        }
        let dur = |field: &str, d: &KubeDuration| {
            d.get()
                .map_err(|e| ScenarioError::Invalid(format!("{}: {e}", at(field))))
        };
        let submit_at = dur("submitAt", &j.submit_at)?;
        let duration = dur("duration", &j.duration)?;
        let pod_start_delay = match &j.pod_start_delay {
            Some(d) => dur("podStartDelay", d)?,
            None => Duration::ZERO,
        };
        // Identical templates share one analysed shape (and one admission class).
        let fingerprint = format!("{:?}", j.template);
        let next = shapes.len() as u64;
        let (shape_key, pod) = match shapes.get(&fingerprint) {
            Some(s) => s.clone(),
            None => {
                let view = PodView {
                    spec: j.template.clone(),
                    ..Default::default()
                };
                let shape = PodShape::from_view(&view)
                    .map_err(|e| ScenarioError::Invalid(format!("{}: {e}", at("template"))))?;
                if shape.containers.is_empty() {
                    return Err(ScenarioError::Invalid(format!(
                        "{}: needs at least one container",
                        at("template")
                    )));
                }
                let entry = (next, Arc::new(shape));
                shapes.insert(fingerprint, entry.clone());
                entry
            }
        };
        jobs.push(ScenarioJob {
            name: j.name,
            namespace,
            queue: j.queue,
            submit_at,
            parallelism: j.parallelism,
            completions,
            priority: j.priority.unwrap_or(0),
            duration,
            pod_start_delay,
            fails: j.fails.unwrap_or(false),
            pod,
            shape_key,
        });
    }
    Ok(Scenario {
        inventory,
        queues,
        jobs,
        scheduler_names,
    })
}
