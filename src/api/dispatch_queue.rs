//! `DispatchQueue`: which Jobs a queue takes, how much they may use together, which worker
//! clusters they go to and how they are placed there. Its spec is also the shape of a
//! `queues:` entry in a `simulate` scenario (plus `name`, see [`NamedQueueSpec`]).

use super::duration::KubeDuration;
use super::names::{is_dns1123_subdomain, is_qualified_name};
use super::schema;
use crate::api::is_dns1123_label;
use crate::quantity::{self, Milli};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A queue of batch/v1 Jobs (labelled `switchyard.dev/queue-name: <name>`), admitted under
/// its quota and dispatched, each whole, to one of its worker clusters.
// Printer columns repeat `type_`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "DispatchQueue",
    status = "DispatchQueueStatus",
    shortname = "dq",
    category = "switchyard",
    derive = "PartialEq",
    doc = "A queue of Jobs dispatched to worker clusters.",
    validation = Rule::new("size(self.metadata.name) <= 63 && !self.metadata.name.contains('.')")
        .message("a DispatchQueue's name must be a DNS-1123 label (at most 63 characters, no '.'): Jobs name their queue in a label value"),
    printcolumn(
        name = "Active",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Active")].status"#
    ),
    printcolumn(name = "Pending", type_ = "integer", json_path = ".status.pending"),
    printcolumn(name = "Admitted", type_ = "integer", json_path = ".status.admitted"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.running"),
    printcolumn(
        name = "Clusters",
        type_ = "string",
        json_path = ".spec.clusters",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct DispatchQueueSpec {
    /// Names of the WorkerClusters the queue's Jobs may run on.
    #[schemars(length(min = 1, max = schema::MAX_QUEUE_CLUSTERS), transform = schema::name_set)]
    pub clusters: Vec<String>,
    /// The namespaces whose Jobs may use the queue; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::label_selector)]
    pub(crate) namespace_selector: Option<LabelSelector>,
    /// The most the queue's admitted Jobs may request together, per resource. Absent:
    /// automatic, the sum of the allocatable of the queue's active clusters. A resource not
    /// listed is not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::quantity_map)]
    pub(crate) quota: Option<BTreeMap<String, Quantity>>,
    /// All-or-nothing start: what happens when a dispatched Job's pods do not all become
    /// Ready in time.
    #[serde(default)]
    pub(crate) wait_for_pods_ready: WaitForPodsReady,
    /// How a Job's worker cluster is chosen.
    #[serde(default)]
    pub(crate) placement: Placement,
    /// How long a Job's worker cluster may be unreachable before the Job is taken back and
    /// queued again.
    #[serde(default = "default_worker_lost_timeout")]
    pub(crate) worker_lost_timeout: KubeDuration,
    /// The order Jobs are admitted in: BestEffortFIFO, a Job that cannot be admitted yet does
    /// not hold back later ones that can; StrictFIFO, it does.
    #[serde(default)]
    pub(crate) queueing_strategy: QueueingStrategy,
    /// How long a Job may wait for room before room is kept for it: the nodes and NUMA zones
    /// it will take in one worker, which later Jobs may not take. `0s`: never.
    #[serde(default = "default_starvation_after")]
    pub(crate) starvation_after: KubeDuration,
    /// How long a copy sent to a worker that runs Kueue may wait for that worker's Kueue to
    /// admit it (or to admit it again after evicting it) before it is taken back and the Job
    /// tried elsewhere; like a worker's refusal, never counted towards `requeuing.limit`.
    #[serde(default = "default_worker_admission_timeout")]
    pub(crate) worker_admission_timeout: KubeDuration,
}

/// BestEffortFIFO: Jobs are tried in order (priority, then age) and a Job that cannot be
/// admitted yet does not hold back later ones that can (they backfill around it).
/// StrictFIFO: a Job that cannot be admitted holds back every later Job of the queue.
// No doc comments on the variants: schemars would turn the enum into a oneOf.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(expecting = "BestEffortFIFO or StrictFIFO")]
pub(crate) enum QueueingStrategy {
    #[default]
    BestEffortFIFO,
    StrictFIFO,
}

fn spec_rules(s: &mut Schema) {
    schema::add_rule(
        s,
        schema::cel_duration_positive("workerLostTimeout"),
        "workerLostTimeout must be above 0",
    );
    schema::add_rule(
        s,
        schema::cel_duration_positive("workerAdmissionTimeout"),
        "workerAdmissionTimeout must be above 0",
    );
}

/// Waiting for a dispatched Job's pods to be Ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = pods_ready_rules)]
#[serde(
    expecting = "waitForPodsReady settings: a map of enabled, timeout, recoveryTimeout, blockAdmission and requeuing"
)]
pub(crate) struct WaitForPodsReady {
    /// Off: a dispatched Job keeps its place however long its pods take.
    #[serde(default)]
    pub(crate) enabled: bool,
    /// How long after dispatch all the Job's pods must be Ready; past it the Job is taken
    /// back from its worker and requeued.
    #[serde(default = "default_pods_ready_timeout")]
    pub(crate) timeout: KubeDuration,
    /// How long a pod of a running Job may stay not Ready before the Job is requeued;
    /// absent: no limit once the Job was Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) recovery_timeout: Option<KubeDuration>,
    /// Admit no other Job of the queue while an admitted one is not yet Ready.
    #[serde(default)]
    pub(crate) block_admission: bool,
    /// When a requeued Job may be admitted again.
    #[serde(default)]
    pub(crate) requeuing: Requeuing,
}

fn pods_ready_rules(s: &mut Schema) {
    schema::add_rule(
        s,
        schema::cel_duration_positive("timeout"),
        "waitForPodsReady.timeout must be above 0",
    );
    schema::add_rule(
        s,
        schema::cel_duration_positive("recoveryTimeout"),
        "waitForPodsReady.recoveryTimeout must be above 0",
    );
}

impl Default for WaitForPodsReady {
    fn default() -> Self {
        Self {
            enabled: false,
            timeout: default_pods_ready_timeout(),
            recovery_timeout: None,
            block_admission: false,
            requeuing: Requeuing::default(),
        }
    }
}

/// Back-off between requeues: the n-th requeue of a Job waits backoffBase × 2^(n−1), at most
/// backoffMax.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = requeuing_rules)]
#[serde(expecting = "requeuing settings: a map of backoffBase, backoffMax and limit")]
pub(crate) struct Requeuing {
    /// The wait before the first requeue.
    #[serde(default = "default_backoff_base")]
    pub(crate) backoff_base: KubeDuration,
    /// The longest wait between requeues; at least backoffBase.
    #[serde(default = "default_backoff_max")]
    pub(crate) backoff_max: KubeDuration,
    /// How many times a Job is requeued before it is given up (left suspended, with a
    /// condition saying why); absent: requeue forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub(crate) limit: Option<i32>,
}

fn requeuing_rules(s: &mut Schema) {
    let p = super::duration::DURATION_PATTERN;
    schema::add_rule(
        s,
        format!(
            "!has(self.backoffBase) || !has(self.backoffMax) || !self.backoffBase.matches('{p}') || !self.backoffMax.matches('{p}') || duration(self.backoffBase) <= duration(self.backoffMax)"
        ),
        "requeuing.backoffBase must not be longer than requeuing.backoffMax",
    );
}

impl Default for Requeuing {
    fn default() -> Self {
        Self {
            backoff_base: default_backoff_base(),
            backoff_max: default_backoff_max(),
            limit: None,
        }
    }
}

/// How a Job's worker cluster is chosen among the queue's clusters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[serde(expecting = "placement settings: a map of strategy and fanout")]
pub struct Placement {
    /// How clusters that fit the Job are ranked; also how nodes are ranked for its pods in a
    /// worker whose scheduler asks Switchyard's extender (the copy's pod templates carry it as
    /// the switchyard.dev/placement-strategy annotation, unless they name one).
    #[serde(default)]
    pub strategy: PlacementStrategy,
    /// How many of the best-ranked clusters the Job is offered to at once; the first that
    /// starts it keeps it. Capped at the number of clusters.
    #[serde(default = "default_fanout")]
    #[schemars(range(min = 1, max = schema::MAX_QUEUE_CLUSTERS))]
    pub(crate) fanout: i32,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            strategy: PlacementStrategy::default(),
            fanout: default_fanout(),
        }
    }
}

/// LeastAllocated: prefer the emptiest nodes (spread). MostAllocated: prefer the fullest
/// (bin-pack, keeping big holes for big Jobs). BalancedAllocation: prefer nodes whose
/// resources stay used in equal proportions. LeastNUMANodes: prefer placements over the
/// fewest NUMA zones.
// No doc comments on the variants: schemars would turn the enum into a oneOf.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(expecting = "LeastAllocated, MostAllocated, BalancedAllocation or LeastNUMANodes")]
pub(crate) enum PlacementStrategy {
    #[default]
    LeastAllocated,
    MostAllocated,
    BalancedAllocation,
    #[serde(rename = "LeastNUMANodes")]
    LeastNumaNodes,
}

impl From<PlacementStrategy> for crate::placement::Strategy {
    fn from(s: PlacementStrategy) -> Self {
        match s {
            PlacementStrategy::LeastAllocated => Self::LeastAllocated,
            PlacementStrategy::MostAllocated => Self::MostAllocated,
            PlacementStrategy::BalancedAllocation => Self::BalancedAllocation,
            PlacementStrategy::LeastNumaNodes => Self::LeastNumaNodes,
        }
    }
}

fn default_pods_ready_timeout() -> KubeDuration {
    KubeDuration::new("5m")
}
fn default_backoff_base() -> KubeDuration {
    KubeDuration::new("60s")
}
fn default_backoff_max() -> KubeDuration {
    KubeDuration::new("1h")
}
fn default_worker_lost_timeout() -> KubeDuration {
    KubeDuration::new("15m")
}
fn default_starvation_after() -> KubeDuration {
    KubeDuration::new("10m")
}
fn default_worker_admission_timeout() -> KubeDuration {
    KubeDuration::new("5m")
}
fn default_fanout() -> i32 {
    1
}

/// What the dispatcher observed of a queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DispatchQueueStatus {
    /// `Active`: True when the queue admits Jobs; its reason is one of Ready, InvalidSpec,
    /// NoActiveCluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::conditions)]
    pub(crate) conditions: Vec<Condition>,
    /// Jobs waiting to be admitted.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) pending: i32,
    /// Jobs admitted (holding quota), running or not yet.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) admitted: i32,
    /// Of the admitted Jobs, those whose pods are all Ready on their worker.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) running: i32,
    /// The quota in force, per resource: spec.quota, or the automatic one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::status_quantity_map)]
    pub(crate) effective_quota: BTreeMap<String, Quantity>,
    /// What the admitted Jobs request together, per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::status_quantity_map)]
    pub(crate) quota_usage: BTreeMap<String, Quantity>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) observed_generation: Option<i64>,
}

/// A `queues:` entry of a scenario file: the spec and the name that is `metadata.name` in
/// the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(from = "NamedQueueFile")]
pub struct NamedQueueSpec {
    pub name: String,
    #[serde(flatten)]
    pub spec: DispatchQueueSpec,
}

/// How a [`NamedQueueSpec`] is read: the spec's fields spelled out beside `name` rather than
/// flattened, so that a mistake inside a queue is reported with its path and line, and a key
/// that is not a setting is refused (a flattened struct can do neither). The CRD's spec, read
/// from the API server, keeps taking fields it does not know; a scenario is written by hand.
/// A test checks that the keys here are the CRD's.
#[derive(Deserialize)]
#[cfg_attr(test, derive(JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(expecting = "a queue: a map of name, clusters and its settings")]
struct NamedQueueFile {
    name: String,
    clusters: Vec<String>,
    #[serde(default)]
    namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    quota: Option<BTreeMap<String, Quantity>>,
    #[serde(default)]
    wait_for_pods_ready: WaitForPodsReady,
    #[serde(default)]
    placement: Placement,
    #[serde(default = "default_worker_lost_timeout")]
    worker_lost_timeout: KubeDuration,
    #[serde(default)]
    queueing_strategy: QueueingStrategy,
    #[serde(default = "default_starvation_after")]
    starvation_after: KubeDuration,
    #[serde(default = "default_worker_admission_timeout")]
    worker_admission_timeout: KubeDuration,
}

impl From<NamedQueueFile> for NamedQueueSpec {
    fn from(f: NamedQueueFile) -> Self {
        NamedQueueSpec {
            name: f.name,
            spec: DispatchQueueSpec {
                clusters: f.clusters,
                namespace_selector: f.namespace_selector,
                quota: f.quota,
                wait_for_pods_ready: f.wait_for_pods_ready,
                placement: f.placement,
                worker_lost_timeout: f.worker_lost_timeout,
                queueing_strategy: f.queueing_strategy,
                starvation_after: f.starvation_after,
                worker_admission_timeout: f.worker_admission_timeout,
            },
        }
    }
}

/// The keys a scenario's queue entry takes (for the test that they are the CRD's).
#[cfg(test)]
pub(crate) fn named_queue_keys() -> Vec<String> {
    let schema = schemars::schema_for!(NamedQueueFile).to_value();
    let mut keys: Vec<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

impl NamedQueueSpec {
    /// The spec's checks, and the name's: a DNS-1123 label, since Jobs name their queue in a
    /// label value.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = self.spec.validate().err().unwrap_or_default();
        if !is_dns1123_label(&self.name) {
            errors.insert(
                0,
                format!(
                    "name: {:?} is not a DNS-1123 label (at most 63 lowercase letters, digits and '-')",
                    self.name
                ),
            );
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A queue spec with every default applied and every value parsed: what the dispatcher and
/// `simulate` work from.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSettings {
    pub clusters: Vec<String>,
    pub(crate) namespace_selector: Option<crate::selector::Compiled>,
    /// `None`: automatic (the sum of the active clusters' allocatable).
    pub(crate) quota: Option<BTreeMap<String, Milli>>,
    /// `None`: not waiting for pods to be Ready.
    pub wait_for_pods_ready: Option<PodsReadySettings>,
    pub strategy: crate::placement::Strategy,
    /// At least 1, at most the number of clusters.
    pub(crate) fanout: usize,
    pub worker_lost_timeout: Duration,
    pub(crate) queueing: QueueingStrategy,
    /// `None`: room is never kept for a waiting Job.
    pub(crate) starvation_after: Option<Duration>,
    pub(crate) worker_admission_timeout: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodsReadySettings {
    pub timeout: Duration,
    pub(crate) recovery_timeout: Option<Duration>,
    pub(crate) block_admission: bool,
    pub requeuing: RequeuingSettings,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequeuingSettings {
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    /// `None`: requeue forever.
    pub limit: Option<u32>,
}

impl RequeuingSettings {
    /// The wait before requeue number `n` (1 for the first): base × 2^(n−1), at most max.
    pub(crate) fn backoff(&self, n: u32) -> Duration {
        let factor = 2u32.checked_pow(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .map_or(self.backoff_max, |d| d.min(self.backoff_max))
    }

    /// Whether a Job already requeued `requeues` times may be requeued once more.
    pub(crate) fn may_requeue(&self, requeues: u32) -> bool {
        self.limit.is_none_or(|limit| requeues < limit)
    }
}

impl DispatchQueueSpec {
    /// Every check the CRD schema makes, and those it cannot make (map keys, quantities our
    /// arithmetic cannot hold, selector operators): for specs read without an API server and
    /// for objects stored under an older schema. Each message starts with the field's path.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        self.resolve().map(|_| ())
    }

    /// Validates and parses the spec: every error, each message starting with its field.
    pub(crate) fn resolve(&self) -> Result<QueueSettings, Vec<String>> {
        let mut errors = Vec::new();
        self.check_clusters(&mut errors);
        let namespace_selector = match self.namespace_selector.as_ref() {
            None => None,
            Some(s) => crate::selector::Compiled::new(s)
                .map_err(|e| errors.push(format!("namespaceSelector: {e}")))
                .ok(),
        };
        let quota = self.quota.as_ref().map(|q| parse_quota(q, &mut errors));
        let wait_for_pods_ready = self.wait_for_pods_ready.resolve(&mut errors);
        let mut duration = |field, d, positive| checked_duration(&mut errors, field, d, positive);
        let worker_lost_timeout = duration("workerLostTimeout", &self.worker_lost_timeout, true);
        let starvation_after = duration("starvationAfter", &self.starvation_after, false);
        let worker_admission_timeout = duration(
            "workerAdmissionTimeout",
            &self.worker_admission_timeout,
            true,
        );
        let fanout = self.placement.fanout;
        if fanout < 1 || fanout > schema::MAX_QUEUE_CLUSTERS as i32 {
            errors.push(format!(
                "placement.fanout: {fanout} is out of range (1 to {})",
                schema::MAX_QUEUE_CLUSTERS
            ));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(QueueSettings {
            clusters: self.clusters.clone(),
            namespace_selector,
            quota,
            wait_for_pods_ready,
            strategy: self.placement.strategy.into(),
            fanout: (fanout as usize).min(self.clusters.len()),
            worker_lost_timeout,
            queueing: self.queueing_strategy,
            starvation_after: (!starvation_after.is_zero()).then_some(starvation_after),
            worker_admission_timeout,
        })
    }

    /// `clusters`: one to [`schema::MAX_QUEUE_CLUSTERS`] WorkerCluster names, none twice.
    fn check_clusters(&self, errors: &mut Vec<String>) {
        let max_clusters = schema::MAX_QUEUE_CLUSTERS as usize;
        if self.clusters.is_empty() {
            errors.push("clusters: must name at least one WorkerCluster".to_string());
        } else if self.clusters.len() > max_clusters {
            errors.push(format!("clusters: at most {max_clusters} clusters"));
        }
        let mut seen = BTreeSet::new();
        for (i, name) in self.clusters.iter().enumerate() {
            if !is_dns1123_subdomain(name) {
                errors.push(format!(
                    "clusters[{i}]: {name:?} is not a WorkerCluster name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"
                ));
            }
            if !seen.insert(name) {
                errors.push(format!("clusters[{i}]: {name:?} is listed twice"));
            }
        }
    }
}

impl WaitForPodsReady {
    /// The settings in force when enabled, every field checked either way.
    fn resolve(&self, errors: &mut Vec<String>) -> Option<PodsReadySettings> {
        let mut duration = |field, d, positive| checked_duration(errors, field, d, positive);
        let timeout = duration("waitForPodsReady.timeout", &self.timeout, true);
        let recovery_timeout = (self.recovery_timeout.as_ref())
            .map(|d| duration("waitForPodsReady.recoveryTimeout", d, true));
        let r = &self.requeuing;
        let backoff_base = duration(
            "waitForPodsReady.requeuing.backoffBase",
            &r.backoff_base,
            false,
        );
        let backoff_max = duration(
            "waitForPodsReady.requeuing.backoffMax",
            &r.backoff_max,
            false,
        );
        if backoff_base > backoff_max {
            errors.push(format!(
                "waitForPodsReady.requeuing: backoffBase {} is longer than backoffMax {}",
                r.backoff_base, r.backoff_max
            ));
        }
        let limit = match r.limit.map(u32::try_from) {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(_)) => {
                errors.push("waitForPodsReady.requeuing.limit: must not be negative".to_string());
                None
            }
        };
        self.enabled.then_some(PodsReadySettings {
            timeout,
            recovery_timeout,
            block_admission: self.block_admission,
            requeuing: RequeuingSettings {
                backoff_base,
                backoff_max,
                limit,
            },
        })
    }
}

/// `quota`: at most [`schema::MAX_MAP_KEYS`] resources, each a resource name with a quantity.
fn parse_quota(
    quota: &BTreeMap<String, Quantity>,
    errors: &mut Vec<String>,
) -> BTreeMap<String, Milli> {
    if quota.len() > schema::MAX_MAP_KEYS as usize {
        errors.push(format!(
            "quota: {} resources, at most {} may be listed",
            quota.len(),
            schema::MAX_MAP_KEYS
        ));
    }
    let mut parsed = BTreeMap::new();
    for (resource, value) in quota {
        if !is_qualified_name(resource) {
            errors.push(format!(
                "quota: {resource:?} is not a resource name (e.g. cpu, memory, nvidia.com/gpu)"
            ));
        }
        match quantity::parse(&value.0) {
            Ok(m) => {
                parsed.insert(resource.clone(), m);
            }
            Err(e) => errors.push(format!("quota[{resource}]: {e}")),
        }
    }
    parsed
}

/// A duration field's value, noting in `errors` one that is not a duration Kubernetes
/// holds, or zero where it must be `positive` (then the value returned is not used).
fn checked_duration(
    errors: &mut Vec<String>,
    field: &str,
    d: &KubeDuration,
    positive: bool,
) -> Duration {
    match d.get() {
        Ok(v) if positive && v.is_zero() => {
            errors.push(format!("{field}: must be above 0"));
            v
        }
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("{field}: {e}"));
            Duration::ZERO
        }
    }
}
