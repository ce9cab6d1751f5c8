//! `WorkerCluster`: a cluster Jobs are dispatched to, how to reach it, and what it has.

use super::names::{is_dns1123_subdomain, is_label_value, is_qualified_name};
use super::schema;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A worker cluster: where its kubeconfig is, and the labels queues and pods select it by.
/// Cluster-scoped; the dispatcher keeps one client per WorkerCluster and reports in
/// `status.conditions` (type `Active`) whether it can use it. Its name is at most 63
/// characters: it becomes a label value.
// Printer columns repeat `type_`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "WorkerCluster",
    status = "WorkerClusterStatus",
    shortname = "wc",
    category = "switchyard",
    derive = "PartialEq",
    doc = "A cluster Switchyard dispatches Jobs to.",
    validation = Rule::new("self.metadata.name.size() <= 63")
        .message("a WorkerCluster's name must be at most 63 characters: it becomes the value of the label switchyard.dev/cluster and part of its virtual node's name"),
    printcolumn(
        name = "Active",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Active")].status"#
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Active")].reason"#,
        priority = 1
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.summary.nodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WorkerClusterSpec {
    /// How to connect to the cluster.
    pub(crate) kube_config: KubeConfig,
    /// Labels of the cluster: queues and pods select clusters by them, and the cluster's
    /// virtual node carries them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::label_map)]
    pub(crate) labels: BTreeMap<String, String>,
    /// The scheduler profile (`spec.schedulerName`) the worker's scheduler should place
    /// dispatched pods with; absent: the worker's default scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::object_name)]
    pub(crate) scheduler_name: Option<String>,
    /// The cluster runs Kueue: copies go into its own queues, which admit them under its own
    /// quota (docs/workers.md#kueue-workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kueue: Option<WorkerKueue>,
}

/// How copies enter a worker's own Kueue.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerKueue {
    /// The LocalQueue, in each Job's namespace, copies are submitted to (their
    /// `kueue.x-k8s.io/queue-name` label): a DNS-1123 subdomain of at most 63 characters.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub(crate) local_queue_name: String,
}

/// Where a kubeconfig for the cluster is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kube_config_rules)]
pub(crate) struct KubeConfig {
    /// The Secret's name (Secret) or the file's absolute path (Path).
    #[schemars(length(min = 1, max = schema::LOCATION_MAX_LENGTH))]
    pub(crate) location: String,
    /// Secret: a Secret in Switchyard's namespace holding the kubeconfig under the key
    /// `kubeconfig`. Path: a file in the Switchyard pod.
    #[serde(default)]
    pub(crate) location_type: LocationType,
}

fn kube_config_rules(s: &mut Schema) {
    let is_path = "(has(self.locationType) && self.locationType == 'Path')";
    schema::add_rule(
        s,
        format!(
            "{is_path} || (size(self.location) <= {max} && self.location.matches('{p}'))",
            max = schema::DNS1123_SUBDOMAIN_MAX_LENGTH,
            p = schema::DNS1123_SUBDOMAIN_PATTERN
        ),
        "with locationType Secret, location must be the name of a Secret in Switchyard's namespace (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')",
    );
    schema::add_rule(
        s,
        format!("!{is_path} || self.location.startsWith('/')"),
        "with locationType Path, location must be an absolute file path in the Switchyard pod",
    );
}

/// Where [`KubeConfig::location`] points.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub(crate) enum LocationType {
    #[default]
    Secret,
    Path,
}

/// The name of the Secret key that holds the kubeconfig (`locationType: Secret`).
pub(crate) const KUBECONFIG_SECRET_KEY: &str = "kubeconfig";

/// A WorkerCluster name becomes the value of the label `switchyard.dev/cluster` and part of
/// its virtual node's name: at most a label value's 63 characters.
pub(crate) const WORKER_CLUSTER_NAME_MAX_LENGTH: usize = 63;

/// Everything the schema checks of a WorkerCluster (name and spec), for one read from an API
/// server whose CRD is older or that checks no schema. Each message starts with the field's
/// full path (`metadata.name`, `spec.labels`...).
pub fn validate_worker_cluster(name: &str, spec: &WorkerClusterSpec) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    if name.len() > WORKER_CLUSTER_NAME_MAX_LENGTH {
        errors.push(format!(
            "metadata.name: {name:?} is longer than {WORKER_CLUSTER_NAME_MAX_LENGTH} characters (it becomes the label value switchyard.dev/cluster)"
        ));
    }
    if let Err(spec_errors) = spec.validate() {
        errors.extend(spec_errors.into_iter().map(|e| format!("spec.{e}")));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

impl WorkerClusterSpec {
    /// What the schema cannot check (label keys), and everything it checks, for specs read
    /// without an API server. Each message starts with the field's path.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        let kc = &self.kube_config;
        match kc.location_type {
            _ if kc.location.is_empty() => {
                errors.push("kubeConfig.location: must not be empty".to_string())
            }
            LocationType::Secret if !is_dns1123_subdomain(&kc.location) => errors.push(format!(
                "kubeConfig.location: {:?} is not a Secret name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')",
                kc.location
            )),
            LocationType::Path if !kc.location.starts_with('/') => errors.push(format!(
                "kubeConfig.location: {:?} is not an absolute path",
                kc.location
            )),
            _ => {}
        }
        if kc.location.len() > schema::LOCATION_MAX_LENGTH as usize {
            errors.push(format!(
                "kubeConfig.location: longer than {} characters",
                schema::LOCATION_MAX_LENGTH
            ));
        }
        if self.labels.len() > schema::MAX_MAP_KEYS as usize {
            errors.push(format!(
                "labels: {} labels, at most {} may be given",
                self.labels.len(),
                schema::MAX_MAP_KEYS
            ));
        }
        for (k, v) in &self.labels {
            if !is_qualified_name(k) {
                errors.push(format!(
                    "labels: key {k:?} is not a label key ([prefix/]name, the name up to 63 letters, digits, '-', '_' and '.')"
                ));
            }
            if !is_label_value(v) {
                errors.push(format!(
                    "labels[{k}]: {v:?} is not a label value (up to 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
                ));
            }
        }
        if let Some(name) = &self.scheduler_name {
            if !is_dns1123_subdomain(name) {
                errors.push(format!(
                    "schedulerName: {name:?} is not a DNS-1123 subdomain"
                ));
            }
        }
        if let Some(k) = &self.kueue {
            let name = &k.local_queue_name;
            if !is_dns1123_subdomain(name) || name.len() > 63 {
                errors.push(format!(
                    "kueue.localQueueName: {name:?} is not a LocalQueue name of at most 63 characters (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// What the dispatcher observed of a worker cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerClusterStatus {
    /// `Active`: True when the cluster is connected and its inventory is fresh; its reason
    /// is one of Connected, BadKubeConfig, InsecureKubeConfig, ClientConnectionFailed, Stale,
    /// InvalidSpec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::conditions)]
    pub(crate) conditions: Vec<Condition>,
    /// What the cluster has, from its last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ClusterSummary>,
    /// Present while the cluster cannot be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) connection: Option<ConnectionStatus>,
}

/// The cluster's capacity, from its last inventory. Quantities are per resource name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Ready, schedulable nodes.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) nodes: i32,
    /// Of those, the nodes that publish NUMA topology (a NodeResourceTopology).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) numa_aware_nodes: i32,
    /// Allocatable of all those nodes together.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::status_quantity_map)]
    pub(crate) allocatable: BTreeMap<String, Quantity>,
    /// The most free on any one node, per resource: the biggest pod that could still start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::status_quantity_map)]
    pub(crate) largest_free_on_node: BTreeMap<String, Quantity>,
    /// The most free in any one NUMA zone, per resource: the biggest pod a single-numa-node
    /// policy could still admit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::status_quantity_map)]
    pub(crate) largest_free_in_numa_zone: BTreeMap<String, Quantity>,
    /// When this summary was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_sync_time: Option<Time>,
}

/// A lost connection, for the user waiting for it to come back.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConnectionStatus {
    /// When the cluster was last reachable, or when the first attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) disconnected_since: Option<Time>,
    /// Failed attempts to connect since then.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(crate) attempts: i32,
    /// When the next attempt is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_attempt_time: Option<Time>,
    /// The last attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_error: Option<String>,
}
