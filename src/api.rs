//! Switchyard's API: the cluster-scoped custom resources `WorkerCluster` and `DispatchQueue`
//! (group `switchyard.dev`, version `v1alpha1`), their CRDs, and pure checks and helpers.
//!
//! The CRD schemas validate everything they can (patterns, bounds, enums, CEL rules), so
//! `kubectl apply` refuses a bad object with a message naming the field. `validate` methods
//! repeat those checks and add those a schema cannot express, for specs that come from
//! elsewhere (a `simulate` scenario) and for objects stored under an older schema.
//!
//! Reading is lenient: fields this version does not know are ignored, since the API server
//! may serve a newer schema than the one compiled in.

mod duration;
pub(crate) mod names;
mod schema;

pub(crate) mod dispatch_queue;
pub(crate) mod worker_cluster;

#[cfg(test)]
mod tests;

pub use dispatch_queue::{DispatchQueue, DispatchQueueSpec, NamedQueueSpec};
pub(crate) use dispatch_queue::{DispatchQueueStatus, QueueSettings, QueueingStrategy};
pub(crate) use duration::KubeDuration;
pub use duration::DURATION_PATTERN;
pub use names::is_qualified_name;
pub(crate) use names::{is_dns1123_label, is_dns1123_subdomain, is_label_value};
pub use schema::DNS1123_SUBDOMAIN_PATTERN;
pub use worker_cluster::{validate_worker_cluster, WorkerCluster, WorkerClusterSpec};
pub(crate) use worker_cluster::{
    ClusterSummary, ConnectionStatus, KubeConfig, LocationType, WorkerClusterStatus,
    KUBECONFIG_SECRET_KEY,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResourceExt;

pub(crate) const GROUP: &str = "switchyard.dev";

/// The condition type both kinds report: whether the dispatcher can use the object.
pub(crate) const CONDITION_ACTIVE: &str = "Active";

/// Reasons of a WorkerCluster's `Active` condition.
pub(crate) mod cluster_reason {
    /// Unknown: the first connection attempt is in progress.
    pub(crate) const CONNECTING: &str = "Connecting";
    /// True: the client works and the inventory is fresh.
    pub(crate) const CONNECTED: &str = "Connected";
    /// False: the kubeconfig is missing (Secret, key or file) or does not parse.
    pub(crate) const BAD_KUBE_CONFIG: &str = "BadKubeConfig";
    /// False: the kubeconfig runs a command or reads local files, which Switchyard refuses.
    pub(crate) const INSECURE_KUBE_CONFIG: &str = "InsecureKubeConfig";
    /// False: the API server cannot be reached or refuses the credentials.
    pub(crate) const CLIENT_CONNECTION_FAILED: &str = "ClientConnectionFailed";
    /// False: connected, but the inventory has not been refreshed in time.
    pub(crate) const STALE: &str = "Stale";
    /// False: the object fails a check its schema should have made (an older CRD, or a
    /// check no schema can make); the message names the field.
    pub(crate) const INVALID_SPEC: &str = "InvalidSpec";
}

/// Reasons of a DispatchQueue's `Active` condition.
pub(crate) mod queue_reason {
    /// True: the queue admits Jobs.
    pub(crate) const READY: &str = "Ready";
    /// False: the spec fails a check the schema could not make (the message says which).
    pub(crate) const INVALID_SPEC: &str = "InvalidSpec";
    /// False: none of the queue's clusters exists and is Active.
    pub(crate) const NO_ACTIVE_CLUSTER: &str = "NoActiveCluster";
}

/// A condition, `now` being its transition time (kept by [`set_condition`] when the status
/// does not change).
#[cfg(test)]
pub(crate) fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: now,
        observed_generation,
    }
}

/// Puts `new` in `conditions` in place of the condition of its type, keeping that one's
/// `lastTransitionTime` when the status is unchanged. Returns whether anything changed, so a
/// caller can skip a status write that would change nothing.
pub(crate) fn set_condition(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(new);
            true
        }
        Some(old) => {
            let transition_time = if old.status == new.status {
                old.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            let updated = Condition {
                last_transition_time: transition_time,
                ..new
            };
            let changed = *old != updated;
            *old = updated;
            changed
        }
    }
}

/// The condition of type `type_`, if any.
pub(crate) fn find_condition<'a>(
    conditions: &'a [Condition],
    type_: &str,
) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

impl WorkerClusterStatus {
    /// Whether the `Active` condition is True.
    #[cfg(test)]
    pub(crate) fn is_active(&self) -> bool {
        find_condition(&self.conditions, CONDITION_ACTIVE).is_some_and(|c| c.status == "True")
    }
}

impl DispatchQueueStatus {
    /// Whether the `Active` condition is True.
    #[cfg(test)]
    pub(crate) fn is_active(&self) -> bool {
        find_condition(&self.conditions, CONDITION_ACTIVE).is_some_and(|c| c.status == "True")
    }
}

/// Both CRDs, WorkerCluster first.
pub(crate) fn crds() -> Vec<CustomResourceDefinition> {
    vec![WorkerCluster::crd(), DispatchQueue::crd()]
}

/// Both CRDs as one multi-document YAML stream, each document starting with `---`. The same
/// text for the same code: every map in a CRD is ordered.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| {
            let yaml = serde_yaml::to_string(crd).expect("a CRD serialises to YAML");
            format!("---\n{yaml}")
        })
        .collect()
}
