//! The scenario file of `switchyard simulate --scenario FILE` (format in
//! `tests/data/formats/scenario.example.yaml`): clusters in the inventory format, queues in the
//! DispatchQueue spec's shape, and Jobs (batch/v1 Jobs, or JobSets with `kind: JobSet` and
//! `replicatedJobs`) with their simulated behaviour.

use crate::api::{KubeDuration, NamedQueueSpec, QueueSettings};
use crate::dispatcher::kind::{jobset, Extra, Kind, Part};
use crate::dispatcher::JobKey;
use crate::inventory::file::{build, ClusterSpec, NodeSpec};
use crate::inventory::Inventory;
use crate::placement::apart::{self, Apart};
use crate::placement::{PodShape, PodSpecView, PodView};
use crate::quantity::QuantityText;
use crate::unread::{self, KubeType, Owner, Step};
use foldhash::HashMap;
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
#[serde(expecting = "a scenario: a map of clusters, queues and jobs")]
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
#[serde(expecting = "a cluster: a map of name, nodes and more")]
struct ClusterFile {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    nodes: Vec<NodeSpec>,
    /// As `WorkerCluster.spec.schedulerName`: the worker places the copies' pods with its
    /// NUMA-aware scheduler.
    scheduler_name: Option<String>,
    /// The worker runs Kueue with this quota (as `WorkerCluster.spec.kueue`, plus the
    /// ClusterQueue the simulated Kueue has).
    kueue: Option<KueueFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(expecting = "a cluster's kueue: a map of quota, localQueueName and localWorkloads")]
struct KueueFile {
    quota: BTreeMap<String, QuantityText>,
    local_queue_name: Option<String>,
    queueing_strategy: Option<QueueingFile>,
    #[serde(default)]
    local_workloads: Vec<LocalWorkloadFile>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(expecting = "BestEffortFIFO or StrictFIFO")]
enum QueueingFile {
    StrictFIFO,
    BestEffortFIFO,
}

/// A workload of the worker's own users in the same ClusterQueue (its quota only: its pods
/// are not simulated).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(expecting = "a local workload: a map of submitAt, duration and request")]
struct LocalWorkloadFile {
    submit_at: KubeDuration,
    duration: KubeDuration,
    request: BTreeMap<String, QuantityText>,
    priority: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(
    expecting = "a Job: a map of name, queue, submitAt, duration, parallelism, template and more"
)]
struct JobFile {
    name: String,
    namespace: Option<String>,
    /// `Job` (the default) or `JobSet`.
    kind: Option<KindFile>,
    queue: String,
    submit_at: KubeDuration,
    parallelism: Option<u32>,
    completions: Option<u32>,
    priority: Option<i32>,
    duration: KubeDuration,
    pod_start_delay: Option<KubeDuration>,
    fails: Option<bool>,
    template: Option<PodSpecView>,
    /// A JobSet's replicated Jobs (instead of `parallelism`, `completions` and `template`).
    replicated_jobs: Option<Vec<ReplicatedJobFile>>,
}

impl JobFile {
    fn kind(&self) -> Kind {
        match self.kind {
            None | Some(KindFile::Job) => Kind::Job,
            Some(KindFile::JobSet) => Kind::JobSet,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(expecting = "Job or JobSet")]
enum KindFile {
    Job,
    JobSet,
}

/// One replicated Job of a JobSet: `replicas` Jobs with the same spec.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(
    expecting = "a replicated Job: a map of name, replicas, parallelism, completions and template"
)]
struct ReplicatedJobFile {
    name: String,
    replicas: Option<u32>,
    parallelism: Option<u32>,
    completions: Option<u32>,
    #[serde(default)]
    template: PodSpecView,
}

/// One Job (or JobSet) of the scenario, parsed.
#[derive(Debug, Clone)]
pub struct ScenarioJob {
    pub name: String,
    pub(crate) namespace: String,
    pub(crate) queue: String,
    pub submit_at: Duration,
    /// A Job's; for a JobSet, all its pods (it runs them at once).
    pub parallelism: u32,
    /// A Job's; for a JobSet, the completions of all its Jobs.
    pub completions: u32,
    pub(crate) priority: i32,
    pub(crate) duration: Duration,
    pub pod_start_delay: Duration,
    pub(crate) fails: bool,
    /// The pod template (a JobSet's: the one most of its pods ask for, the dispatcher's main
    /// shape).
    pub pod: Arc<PodShape>,
    /// Jobs with equal keys have identical templates (JobSets: identical templates in order).
    pub(crate) shape_key: u64,
    pub(crate) kind: Kind,
    /// A JobSet's replicated Jobs, in order (none for a Job).
    pub replicated_jobs: Vec<ReplicatedJob>,
    /// The parts of its gang, as the dispatcher counts them.
    pub(crate) parts: Vec<Part>,
    /// A JobSet's pods of other shapes than `pod` (replicated Jobs that ask for other pods
    /// than the most of its pods), as the dispatcher places them beside the main ones.
    pub(crate) extra: Arc<[Extra]>,
    /// Of a gang of several pod shapes, its main part's replicated Jobs, for messages.
    pub(crate) main_jobs: Option<Arc<str>>,
}

/// One replicated Job of a scenario's JobSet.
#[derive(Debug, Clone)]
pub struct ReplicatedJob {
    pub name: String,
    pub replicas: u32,
    pub parallelism: u32,
    pub completions: u32,
    pub pod: Arc<PodShape>,
}

impl ReplicatedJob {
    /// The pods each of its Jobs runs at once.
    pub fn pods_per_job(&self) -> u32 {
        self.parallelism.min(self.completions)
    }
}

impl ScenarioJob {
    /// Its key in the dispatcher (and in the worker: the copy's).
    pub(crate) fn key(&self) -> JobKey {
        JobKey::of(self.kind, &self.namespace, &self.name)
    }

    pub fn is_jobset(&self) -> bool {
        self.kind == Kind::JobSet
    }

    /// Its gang: the pods that run at once (a JobSet's: every pod of every replicated Job).
    pub fn pods(&self) -> u32 {
        self.parts
            .iter()
            .fold(0u32, |sum, p| sum.saturating_add(p.pods()))
    }

    /// The pod templates it runs (a JobSet's: one per replicated Job).
    pub(crate) fn shapes(&self) -> impl Iterator<Item = &Arc<PodShape>> {
        let own = (!self.is_jobset()).then_some(&self.pod);
        own.into_iter()
            .chain(self.replicated_jobs.iter().map(|r| &r.pod))
    }
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub inventory: Inventory,
    pub queues: Vec<(String, QueueSettings)>,
    pub jobs: Vec<ScenarioJob>,
    /// Per inventory cluster (same order), its `schedulerName`.
    pub(crate) scheduler_names: Vec<Option<String>>,
    /// Per inventory cluster (same order), its Kueue.
    pub(crate) kueue: Vec<Option<Arc<KueueSpec>>>,
}

/// A scenario cluster's own Kueue (see `simulate::kueue`).
#[derive(Debug, Clone, PartialEq)]
pub struct KueueSpec {
    /// The LocalQueue copies enter (`WorkerCluster.spec.kueue.localQueueName`).
    pub local_queue: String,
    /// The ClusterQueue's nominal quota: resource name → milli-units.
    pub quota: BTreeMap<String, i64>,
    /// `StrictFIFO` (the default here) rather than `BestEffortFIFO`.
    pub strict: bool,
    pub local_workloads: Vec<LocalWorkload>,
}

/// A workload of the worker's own users: it takes `request` of the quota for `duration`
/// once admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalWorkload {
    pub submit_at: Duration,
    pub duration: Duration,
    pub request: BTreeMap<String, i64>,
    pub priority: i32,
}

/// The LocalQueue a scenario cluster's Kueue has when its `localQueueName` is not given.
pub const DEFAULT_LOCAL_QUEUE: &str = "default";

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

    /// The Kueue of cluster `name`, when it runs one.
    pub fn kueue(&self, cluster: &str) -> Option<&KueueSpec> {
        let i = self
            .inventory
            .clusters
            .iter()
            .position(|c| c.name == cluster)?;
        self.kueue.get(i)?.as_deref()
    }

    /// Whether some cluster runs Kueue.
    pub fn has_kueue(&self) -> bool {
        self.kueue.iter().any(Option::is_some)
    }

    /// The namespaces of its Jobs, each once, in order.
    pub(crate) fn namespaces(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.jobs.iter().map(|j| j.namespace.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }
}

/// The example bundled with the binary: the run of `switchyard simulate` without a scenario.
pub const BUNDLED: &str = include_str!("../../examples/scenario.yaml");

/// A scenario file read but not yet checked, with the warnings about the keys it skipped,
/// which a user needs whether or not the checks pass (a misspelt `containers` is skipped
/// with a warning, and the Job then has no container).
pub struct Read {
    file: File,
    pub warnings: Vec<String>,
}

pub fn read_file(path: &std::path::Path) -> Result<Read, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.display().to_string(),
        source,
    })?;
    read(&text)
}

/// The scenario's text read: a key of its own settings that nothing reads is an error here.
pub fn read(text: &str) -> Result<Read, ScenarioError> {
    let (file, mut skipped): (File, _) =
        unread::from_yaml(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
    skipped.extend(unmodelled_terms(&file.jobs));
    let judged = unread::judge(&skipped, owner);
    if !judged.errors.is_empty() {
        return Err(ScenarioError::Invalid(judged.errors.join("; ")));
    }
    Ok(Read {
        file,
        warnings: judged.warnings,
    })
}

/// [`read_file`], then [`Read::check`], the warnings not shown.
pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
    read_file(path)?.check()
}

/// [`read`], then [`Read::check`], the warnings not shown.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    read(text)?.check()
}

impl Read {
    /// The scenario, checked: clusters, queues and Jobs as the cluster would take them.
    pub fn check(self) -> Result<Scenario, ScenarioError> {
        let file = self.file;
        let Clusters {
            inventory,
            scheduler_names,
            kueue,
        } = clusters(file.clusters)?;
        let queues = queues(&file.queues, &inventory)?;
        let names: BTreeSet<&str> = queues.iter().map(|(name, _)| name.as_str()).collect();
        let mut jobs = Vec::with_capacity(file.jobs.len());
        let mut seen = BTreeSet::new();
        let mut shapes = Shapes::default();
        for (i, j) in file.jobs.into_iter().enumerate() {
            jobs.push(job(i, j, &names, &mut seen, &mut shapes)?);
        }
        Ok(Scenario {
            inventory,
            queues,
            jobs,
            scheduler_names,
            kueue,
        })
    }
}

/// The paths of the Jobs' required pod anti-affinity terms that placement does not model,
/// judged with the labels each Job's pods will carry.
fn unmodelled_terms(jobs: &[JobFile]) -> Vec<unread::KeyPath> {
    let mut out = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let namespace = j.namespace.as_deref().unwrap_or("default");
        let mut judge = |template: &PodSpecView, at: Vec<Step>| {
            let terms = apart_of(template, j.kind(), &j.name, namespace).unmodelled;
            out.extend(unread::unmodelled_terms(&at, &terms));
        };
        let key = |k: &str| Step::Key(k.into());
        // Paths are built only for templates with terms: nearly none have any.
        if let Some(t) = j.template.as_ref().filter(|t| apart::has_terms(t)) {
            judge(t, vec![key("jobs"), Step::Index(i), key("template")]);
        }
        let replicated = j.replicated_jobs.iter().flatten().enumerate();
        for (r, rj) in replicated.filter(|(_, rj)| apart::has_terms(&rj.template)) {
            let at = vec![
                key("jobs"),
                Step::Index(i),
                key("replicatedJobs"),
                Step::Index(r),
                key("template"),
            ];
            judge(&rj.template, at);
        }
    }
    out
}

/// Which part of a scenario a skipped key at `path` is in: a node's Kubernetes parts (as in
/// an inventory), a Job's or replicated Job's pod template, or else the scenario's own
/// settings.
fn owner(path: &[Step]) -> Owner {
    if let Some(owner) = unread::clusters_owner(path) {
        return owner;
    }
    let key = |i: usize, name: &str| matches!(path.get(i), Some(Step::Key(k)) if k == name);
    if key(0, "jobs") && key(2, "template") {
        Owner::Kubernetes(KubeType::PodSpec, 3)
    } else if key(0, "jobs") && key(2, "replicatedJobs") && key(4, "template") {
        Owner::Kubernetes(KubeType::PodSpec, 5)
    } else {
        Owner::Switchyard
    }
}

/// The scenario's clusters: the inventory, and what only a simulated worker has, per cluster
/// in the inventory's order.
struct Clusters {
    inventory: Inventory,
    scheduler_names: Vec<Option<String>>,
    kueue: Vec<Option<Arc<KueueSpec>>>,
}

fn clusters(files: Vec<ClusterFile>) -> Result<Clusters, ScenarioError> {
    if files.is_empty() {
        return Err(ScenarioError::Invalid(
            "clusters: a scenario needs at least one cluster to run its Jobs in".into(),
        ));
    }
    let mut scheduler_names = Vec::with_capacity(files.len());
    let mut kueue = Vec::with_capacity(files.len());
    let mut specs = Vec::with_capacity(files.len());
    for (i, c) in files.into_iter().enumerate() {
        if let Some(name) = &c.scheduler_name {
            if !crate::api::is_dns1123_subdomain(name) {
                return Err(ScenarioError::Invalid(format!(
                    "clusters[{i}] ({}): schedulerName: {name:?} is not a DNS-1123 subdomain (a scheduler profile's name)",
                    c.name
                )));
            }
        }
        scheduler_names.push(c.scheduler_name);
        let at = |field: &str| format!("clusters[{i}] ({}): kueue.{field}", c.name);
        kueue.push(match c.kueue {
            Some(k) => Some(Arc::new(kueue_spec(k, &at)?)),
            None => None,
        });
        specs.push(ClusterSpec {
            name: c.name,
            labels: c.labels,
            nodes: c.nodes,
        });
    }
    let inventory = build(specs).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
    Ok(Clusters {
        inventory,
        scheduler_names,
        kueue,
    })
}

/// The queues, each checked as the DispatchQueue schema would and resolved, over clusters of
/// the scenario.
fn queues(
    files: &[NamedQueueSpec],
    inventory: &Inventory,
) -> Result<Vec<(String, QueueSettings)>, ScenarioError> {
    let clusters: BTreeSet<&str> = inventory.clusters.iter().map(|c| c.name.as_str()).collect();
    let mut queues = Vec::new();
    let mut names = BTreeSet::new();
    for q in files {
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
    Ok(queues)
}

/// The `i`th Job (or JobSet) of the file, checked: its name unique in its namespace (`seen`),
/// its queue among `queues`, its pod templates analysed once per distinct template (`shapes`).
fn job(
    i: usize,
    mut j: JobFile,
    queues: &BTreeSet<&str>,
    seen: &mut BTreeSet<(String, String)>,
    shapes: &mut Shapes,
) -> Result<ScenarioJob, ScenarioError> {
    let template = j.template.take();
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
            "{}: {namespace}/{} appears twice (a scenario's Jobs and JobSets have names of their own, as its report names them)",
            at("name"),
            j.name
        )));
    }
    if !queues.contains(j.queue.as_str()) {
        return Err(ScenarioError::Invalid(format!(
            "{}: no queue named {:?}",
            at("queue"),
            j.queue
        )));
    }
    let kind = j.kind();
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
    let mut shape_of = |template: &PodSpecView, field: &str| {
        let apart = apart_of(template, kind, &j.name, &namespace);
        analysed(shapes, template, apart)
            .map_err(|e| ScenarioError::Invalid(format!("{}: {e}", at(field))))
    };
    let pods = match kind {
        Kind::Job => job_pods(&j, template.unwrap_or_default(), &at, &mut shape_of)?,
        Kind::JobSet => {
            for (given, field) in [
                (j.parallelism.is_some(), "parallelism"),
                (j.completions.is_some(), "completions"),
                (template.is_some(), "template"),
            ] {
                if given {
                    return Err(ScenarioError::Invalid(format!(
                        "{}: a JobSet has none of its own: give it in each of its replicatedJobs",
                        at(field)
                    )));
                }
            }
            let list = match j.replicated_jobs {
                Some(list) if !list.is_empty() => list,
                _ => {
                    return Err(ScenarioError::Invalid(format!(
                        "{}: a JobSet needs at least one replicated Job ({{name, replicas, \
                         parallelism, completions, template}})",
                        at("replicatedJobs")
                    )))
                }
            };
            jobset_pods(list, &at, &mut shape_of)?
        }
    };
    Ok(ScenarioJob {
        name: j.name,
        namespace,
        queue: j.queue,
        submit_at,
        priority: j.priority.unwrap_or(0),
        duration,
        pod_start_delay,
        fails: j.fails.unwrap_or(false),
        parallelism: pods.parallelism,
        completions: pods.completions,
        pod: pods.pod,
        shape_key: pods.shape_key,
        kind,
        replicated_jobs: pods.replicated_jobs,
        parts: pods.parts,
        extra: pods.extra,
        main_jobs: pods.main_jobs,
    })
}

/// A batch/v1 Job's pods: one template (`template`, taken from the Job's file), `parallelism`
/// of them at once.
fn job_pods(
    j: &JobFile,
    template: PodSpecView,
    at: &dyn Fn(&str) -> String,
    shape_of: &mut ShapeOf,
) -> Result<Pods, ScenarioError> {
    if j.replicated_jobs.is_some() {
        return Err(ScenarioError::Invalid(format!(
            "{}: only a JobSet has replicated Jobs (add `kind: JobSet`, or give \
             parallelism and template)",
            at("replicatedJobs")
        )));
    }
    let Some(parallelism) = j.parallelism else {
        return Err(ScenarioError::Invalid(format!(
            "{}: required for a Job",
            at("parallelism")
        )));
    };
    let completions = counts(parallelism, j.completions, at)?;
    let (shape_key, pod) = shape_of(&template, "template")?;
    Ok(Pods {
        parallelism,
        completions,
        pod,
        shape_key,
        replicated_jobs: Vec::new(),
        parts: vec![Part {
            name: String::new(),
            jobs: 1,
            pods_per_job: parallelism.min(completions),
        }],
        extra: Arc::new([]),
        main_jobs: None,
    })
}

/// A pod template analysed (its shape key and shape), or why not, with its field's path.
type ShapeOf<'a> =
    dyn FnMut(&PodSpecView, &str) -> Result<(u64, Arc<PodShape>), ScenarioError> + 'a;

/// The most Jobs a simulated JobSet may have (over all its replicated Jobs). Each is
/// simulated as a Job of its own, and a worker looks at every one of a JobSet's Jobs as its
/// pods start and end: 10,000 Jobs in one JobSet on one node take about 4 s, ten times as
/// many over a minute. JobSets of real workloads have far fewer.
const MAX_JOBSET_JOBS: u64 = 10_000;

/// A JobSet's pods, from its replicated Jobs (checked): each replicated Job's pods, and the
/// dispatcher's own gang of them (the main shape and the pods of other shapes beside it).
fn jobset_pods(
    list: Vec<ReplicatedJobFile>,
    at: &dyn Fn(&str) -> String,
    shape_of: &mut ShapeOf<'_>,
) -> Result<Pods, ScenarioError> {
    let mut replicated = Vec::with_capacity(list.len());
    let mut keys = Vec::with_capacity(list.len());
    let mut names = BTreeSet::new();
    for (r, rj) in list.into_iter().enumerate() {
        let field = |f: &str| format!("replicatedJobs[{r}] ({}).{f}", rj.name);
        let at_rj = |f: &str| at(&field(f));
        if !crate::api::is_dns1123_label(&rj.name) {
            return Err(ScenarioError::Invalid(format!(
                "{}: {:?} is not a DNS-1123 label (a replicated Job's name)",
                at_rj("name"),
                rj.name
            )));
        }
        if !names.insert(rj.name.clone()) {
            return Err(ScenarioError::Invalid(format!(
                "{}: two replicated Jobs are named {:?}",
                at_rj("name"),
                rj.name
            )));
        }
        let replicas = rj.replicas.unwrap_or(1);
        if replicas == 0 {
            return Err(ScenarioError::Invalid(format!(
                "{}: must be at least 1",
                at_rj("replicas")
            )));
        }
        let parallelism = rj.parallelism.unwrap_or(1);
        let completions = counts(parallelism, rj.completions, &at_rj)?;
        let (key, pod) = shape_of(&rj.template, &field("template"))?;
        keys.push(key);
        replicated.push(ReplicatedJob {
            name: rj.name,
            replicas,
            parallelism,
            completions,
            pod,
        });
    }
    let jobs = replicated
        .iter()
        .map(|r| u64::from(r.replicas))
        .sum::<u64>();
    if jobs > MAX_JOBSET_JOBS {
        return Err(ScenarioError::Invalid(format!(
            "{}: {jobs} Jobs in all, more than simulate runs in one JobSet ({MAX_JOBSET_JOBS})",
            at("replicatedJobs")
        )));
    }
    if let Some(r) =
        (replicated.iter()).find(|r| r.replicas.checked_mul(r.pods_per_job()).is_none())
    {
        return Err(ScenarioError::Invalid(format!(
            "{}: {} replicas of {} pods each is more than {} pods",
            at("replicatedJobs"),
            r.replicas,
            r.pods_per_job(),
            u32::MAX
        )));
    }
    let parts: Vec<Part> = replicated
        .iter()
        .map(|r| Part {
            name: r.name.clone(),
            jobs: r.replicas,
            pods_per_job: r.pods_per_job(),
        })
        .collect();
    // The dispatcher's own gang of a JobSet: the main shape (the most pods) and
    // the pods of other shapes beside it.
    let gang = jobset::gang_of(
        parts.clone(),
        replicated.iter().zip(&keys).map(|(r, key)| {
            let pods = r.replicas * r.pods_per_job();
            (r.name.as_str(), pods, Ok(r.pod.clone()), *key)
        }),
    );
    let pod = gang
        .shape
        .map_err(|e| ScenarioError::Invalid(format!("{}: {e}", at("replicatedJobs"))))?;
    let total = |f: fn(&ReplicatedJob) -> u32| {
        replicated.iter().fold(0u32, |sum, r| {
            sum.saturating_add(r.replicas.saturating_mul(f(r)))
        })
    };
    Ok(Pods {
        parallelism: total(ReplicatedJob::pods_per_job),
        completions: total(|r| r.completions),
        pod,
        shape_key: gang.shape_key,
        parts,
        replicated_jobs: replicated,
        extra: gang.extra.into(),
        main_jobs: gang.main_jobs,
    })
}

/// A cluster's `kueue:`, checked. `at`: a field's path, for messages.
fn kueue_spec(k: KueueFile, at: &dyn Fn(&str) -> String) -> Result<KueueSpec, ScenarioError> {
    let invalid =
        |field: &str, why: String| ScenarioError::Invalid(format!("{}: {why}", at(field)));
    if k.quota.is_empty() {
        return Err(invalid(
            "quota",
            "give the ClusterQueue's nominal quota of at least one resource (e.g. {cpu: \"64\", memory: 256Gi}); a resource not listed is not covered, and a Job that asks for it is never admitted there".into(),
        ));
    }
    let amounts = |field: &str, map: BTreeMap<String, QuantityText>| {
        map.into_iter()
            .map(|(r, q)| match q.parse() {
                Ok(v) => Ok((r, v)),
                Err(e) => Err(invalid(&format!("{field}.{r}"), e.to_string())),
            })
            .collect::<Result<BTreeMap<String, i64>, ScenarioError>>()
    };
    let quota = amounts("quota", k.quota)?;
    let local_queue = k
        .local_queue_name
        .unwrap_or_else(|| DEFAULT_LOCAL_QUEUE.into());
    if !crate::api::is_dns1123_subdomain(&local_queue) {
        return Err(invalid(
            "localQueueName",
            format!("{local_queue:?} is not a DNS-1123 subdomain (a LocalQueue's name)"),
        ));
    }
    let mut local_workloads = Vec::with_capacity(k.local_workloads.len());
    for (w, lw) in k.local_workloads.into_iter().enumerate() {
        let field = |f: &str| format!("localWorkloads[{w}].{f}");
        let dur = |f: &str, d: &KubeDuration| d.get().map_err(|e| invalid(&field(f), e));
        let submit_at = dur("submitAt", &lw.submit_at)?;
        let duration = dur("duration", &lw.duration)?;
        let request = amounts(&field("request"), lw.request)?;
        if request.values().all(|v| *v == 0) {
            return Err(invalid(
                &field("request"),
                "give what it takes of the quota (e.g. {cpu: \"16\"})".into(),
            ));
        }
        if let Some(r) = request.keys().find(|r| !quota.contains_key(*r)) {
            return Err(invalid(
                &field("request"),
                format!("{r} is not in the quota: Kueue would never admit it"),
            ));
        }
        local_workloads.push(LocalWorkload {
            submit_at,
            duration,
            request,
            priority: lw.priority.unwrap_or(0),
        });
    }
    Ok(KueueSpec {
        local_queue,
        quota,
        strict: !matches!(k.queueing_strategy, Some(QueueingFile::BestEffortFIFO)),
        local_workloads,
    })
}

/// What a Job or JobSet of the scenario runs.
struct Pods {
    parallelism: u32,
    completions: u32,
    pod: Arc<PodShape>,
    shape_key: u64,
    replicated_jobs: Vec<ReplicatedJob>,
    parts: Vec<Part>,
    extra: Arc<[Extra]>,
    main_jobs: Option<Arc<str>>,
}

/// `completions` (default: `parallelism`) after checking both are at least 1.
fn counts(
    parallelism: u32,
    completions: Option<u32>,
    at: &dyn Fn(&str) -> String,
) -> Result<u32, ScenarioError> {
    if parallelism == 0 {
        return Err(ScenarioError::Invalid(format!(
            "{}: must be at least 1",
            at("parallelism")
        )));
    }
    let completions = completions.unwrap_or(parallelism);
    if completions == 0 {
        return Err(ScenarioError::Invalid(format!(
            "{}: must be at least 1",
            at("completions")
        )));
    }
    Ok(completions)
}

/// A pod template's analysed shape and its key: identical templates share one (and one
/// admission class).
fn analysed(shapes: &mut Shapes, template: &PodSpecView, apart: Apart) -> Result<Analysed, String> {
    // A template's pods are kept apart by the labels of their Job: the same template may be
    // two shapes (see `apart_of`).
    if let Some((_, s)) =
        (shapes.by_template.get(template)).and_then(|found| found.iter().find(|(a, _)| *a == apart))
    {
        return Ok(s.clone());
    }
    let view = PodView {
        spec: template.clone(),
        ..Default::default()
    };
    let shape = PodShape::from_view(&view)
        .map_err(|e| e.to_string())?
        .kept_apart(apart.clone());
    if shape.containers.is_empty() {
        return Err("needs at least one container".into());
    }
    let entry = (shapes.count, Arc::new(shape));
    shapes.count += 1;
    (shapes.by_template.entry(template.clone()).or_default()).push((apart, entry.clone()));
    Ok(entry)
}

/// The pod templates of a scenario analysed so far, by template, then by what placement makes
/// of its anti-affinity (nearly always one way).
#[derive(Default)]
struct Shapes {
    by_template: HashMap<PodSpecView, Vec<(Apart, Analysed)>>,
    count: u64,
}

/// A pod template's shape key and shape.
type Analysed = (u64, Arc<PodShape>);

/// What placement makes of the anti-affinity of a pod `template` of scenario Job `name` of
/// kind `kind`. Its pods carry the labels the kind's controller gives them: a template in a
/// scenario has no metadata, so these are all a pod anti-affinity can select them by.
fn apart_of(template: &PodSpecView, kind: Kind, name: &str, namespace: &str) -> Apart {
    if !apart::has_terms(template) {
        return Apart::default();
    }
    let labels: BTreeMap<String, String> = (kind.pod_labels(name).into_iter())
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    apart::judge(template, &labels, namespace)
}

#[cfg(test)]
mod tests;
