//! Label, annotation and field values that other components (kube-apiserver, kubectl users,
//! the dispatcher) see. Changing one of these is an API change.

/// A Job carrying this label belongs to Switchyard; its value names the queue.
pub const QUEUE_LABEL: &str = "switchyard.dev/queue-name";
/// Set by the dispatcher on the manager's Job once it was created in a worker.
pub(crate) const CLUSTER_ANNOTATION: &str = "switchyard.dev/cluster";
/// `spec.managedBy` of every Job Switchyard owns: the manager's Job controller skips it.
pub(crate) const MANAGED_BY: &str = "switchyard.dev/dispatcher";
/// The value Kubernetes treats the same as an unset `spec.managedBy`.
pub(crate) const JOB_CONTROLLER: &str = "kubernetes.io/job-controller";
/// The label every Namespace carries with its own name (Kubernetes 1.21+).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The service account the dispatcher runs as in the Helm chart's default namespace.
pub const DEFAULT_DISPATCHER_USERNAME: &str = "system:serviceaccount:switchyard-system:switchyard";

/// Paths of the HTTPS surfaces, after the controller-runtime naming convention.
pub const MUTATE_JOB_PATH: &str = "/mutate-batch-v1-job";
pub const VALIDATE_JOB_PATH: &str = "/validate-batch-v1-job";
pub const MUTATE_JOBSET_PATH: &str = "/mutate-jobset-x-k8s-io-v1alpha2-jobset";
pub const VALIDATE_JOBSET_PATH: &str = "/validate-jobset-x-k8s-io-v1alpha2-jobset";

/// Paths of the plain-HTTP probe server (liveness, readiness, OpenMetrics).
pub const HEALTHZ_PATH: &str = "/healthz";
pub const READYZ_PATH: &str = "/readyz";
pub const METRICS_PATH: &str = "/metrics";
