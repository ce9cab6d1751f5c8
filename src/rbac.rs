//! Every Kubernetes API call Switchyard makes, in one table, and a check that maps a
//! kube-apiserver request line to the table.
//!
//! The Helm chart's Roles and ClusterRoles are written from [`API_USES`] (its test checks they
//! grant each entry and nothing else), and fake API servers in tests can assert with
//! [`request_is_covered`] that every request they see is one the chart allows. A new API call
//! in the code therefore needs a line here, and the chart follows. Entries of an optional
//! [`Feature`] are granted only where the chart turns it on (`jobset.enabled`).

/// Whose identity an API call is made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The switchyard pods of a `role: manager` install, in the manager cluster.
    Manager,
    /// The switchyard pods of a `role: worker` install, in their own cluster (the extender
    /// over that cluster's live inventory).
    Worker,
    /// The manager's dispatcher and inventory watches inside a worker cluster, with the token
    /// of the worker install's dispatcher ServiceAccount.
    WorkerSide,
    /// The switchyard pods of either install (Manager and Worker alike).
    Both,
}

impl Role {
    /// Whether an entry of this role applies to calls made as `identity`. `Both` as an
    /// identity means "as Manager and as Worker", so only `Both` entries apply to it.
    pub(crate) fn applies_to(self, identity: Role) -> bool {
        self == identity || (self == Role::Both && matches!(identity, Role::Manager | Role::Worker))
    }
}

/// Where a use applies, which decides whether the chart grants it with a ClusterRole or a
/// Role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A cluster-scoped resource (ClusterRole and ClusterRoleBinding).
    Cluster,
    /// A namespaced resource in any namespace (ClusterRole and ClusterRoleBinding).
    AllNamespaces,
    /// A namespaced resource in Switchyard's own namespace (Role and RoleBinding there).
    OwnNamespace,
    /// A namespaced resource in this namespace only (Role and RoleBinding there).
    Namespace(&'static str),
}

/// One kind of API call: who makes it, on what, with which verbs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiUse {
    pub role: Role,
    /// The API group, `""` for the core group.
    pub group: &'static str,
    /// The resource, with its subresource after a slash (`jobs/status`), as RBAC names it.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// The optional part of Switchyard the call belongs to; `None`: always made.
    pub feature: Option<Feature>,
    /// What the call is for, in one line.
    pub why: &'static str,
}

/// An optional part of Switchyard. Its table entries apply, and the chart grants them, only
/// where it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// JobSets (`jobset.x-k8s.io/v1alpha2`) as a job kind beside batch/v1 Job; the chart's
    /// `jobset.enabled` (`auto`: where the cluster serves that API).
    JobSet,
    /// Workers that run Kueue (`WorkerCluster.spec.kueue`): the dispatcher reads their
    /// queues and Workloads; the chart's `kueue.enabled`.
    Kueue,
}

const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const NRT_GROUP: &str = "topology.node.k8s.io";
const JOBSET_GROUP: &str = "jobset.x-k8s.io";
const NODE_LEASE_NAMESPACE: &str = crate::workers::virtual_node::NODE_LEASE_NAMESPACE;

/// What the code does and what the roles being built will do (the dispatcher, the
/// WorkerCluster controller, leader election), per identity.
pub(crate) const API_USES: &[ApiUse] = &[
    // --- manager: admission webhooks
    ApiUse {
        role: Role::Manager,
        group: "",
        resource: "namespaces",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "webhooks and dispatcher: Namespace labels (managedNamespaces, a queue's namespaceSelector)",
    },
    // --- both: the extender
    ApiUse {
        role: Role::Both,
        group: "",
        resource: "pods/binding",
        verbs: &["create"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "extender bind: post the Binding of a pod kube-scheduler placed through Switchyard",
    },
    // --- manager: virtual nodes
    ApiUse {
        role: Role::Manager,
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "create", "patch", "delete"],
        scope: Scope::Cluster,
        feature: None,
        why: "virtual nodes: one Node switchyard-<cluster> per worker, created, updated and removed with it; listed by label to remove those of WorkerClusters deleted while no replica led",
    },
    ApiUse {
        role: Role::Manager,
        group: "",
        resource: "nodes/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
        feature: None,
        why: "virtual nodes: capacity and conditions follow the worker's inventory and connection",
    },
    ApiUse {
        role: Role::Manager,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update", "patch", "delete"],
        scope: Scope::Namespace(NODE_LEASE_NAMESPACE),
        feature: None,
        why: "virtual nodes: the node heartbeat Lease, renewed like a kubelet's and removed with the node",
    },
    // --- manager: WorkerCluster controller
    ApiUse {
        role: Role::Manager,
        group: crate::api::GROUP,
        resource: "workerclusters",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "WorkerCluster controller: the worker clusters to connect to",
    },
    ApiUse {
        role: Role::Manager,
        group: crate::api::GROUP,
        resource: "workerclusters/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
        feature: None,
        why: "WorkerCluster controller: the Active condition, connection state and inventory summary",
    },
    ApiUse {
        role: Role::Manager,
        group: "",
        resource: "secrets",
        verbs: &["get", "list", "watch"],
        scope: Scope::OwnNamespace,
        feature: None,
        why: "WorkerCluster controller: the kubeconfig Secrets WorkerClusters point to",
    },
    // --- manager: leader election
    ApiUse {
        role: Role::Manager,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::OwnNamespace,
        feature: None,
        why: "leader election: only one replica dispatches at a time",
    },
    // --- manager: the dispatcher
    ApiUse {
        role: Role::Manager,
        group: "batch",
        resource: "jobs",
        verbs: &["get", "list", "watch", "patch"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "dispatcher: queued Jobs (label switchyard.dev/queue-name); unsuspend and annotate them",
    },
    ApiUse {
        role: Role::Manager,
        group: "batch",
        resource: "jobs/status",
        verbs: &["patch"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "dispatcher: mirror the worker copy's status onto the manager's Job",
    },
    ApiUse {
        role: Role::Manager,
        group: JOBSET_GROUP,
        resource: "jobsets",
        verbs: &["get", "list", "watch", "patch"],
        scope: Scope::AllNamespaces,
        feature: Some(Feature::JobSet),
        why: "dispatcher: queued JobSets (label switchyard.dev/queue-name); unsuspend and annotate them",
    },
    ApiUse {
        role: Role::Manager,
        group: JOBSET_GROUP,
        resource: "jobsets/status",
        verbs: &["patch"],
        scope: Scope::AllNamespaces,
        feature: Some(Feature::JobSet),
        why: "dispatcher: mirror the worker copy's status onto the manager's JobSet",
    },
    ApiUse {
        role: Role::Manager,
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "dispatcher: Events on Jobs (admitted, dispatched, requeued, why pending)",
    },
    ApiUse {
        role: Role::Manager,
        group: crate::api::GROUP,
        resource: "dispatchqueues",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "dispatcher: the queues, their quota and clusters",
    },
    ApiUse {
        role: Role::Manager,
        group: crate::api::GROUP,
        resource: "dispatchqueues/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
        feature: None,
        why: "dispatcher: queue counts and the Active condition",
    },
    ApiUse {
        role: Role::Manager,
        group: "scheduling.k8s.io",
        resource: "priorityclasses",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "dispatcher: Job priority from its pods' priorityClassName",
    },
    // --- worker: the extender over the local cluster
    ApiUse {
        role: Role::Worker,
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "live inventory: the nodes the extender judges",
    },
    ApiUse {
        role: Role::Worker,
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "live inventory: what the running pods already hold on each node",
    },
    ApiUse {
        role: Role::Worker,
        group: NRT_GROUP,
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "live inventory: per-NUMA-zone resources and each node's Topology Manager policy",
    },
    // --- worker side: the manager's dispatcher in a worker
    ApiUse {
        role: Role::WorkerSide,
        group: "batch",
        resource: "jobs",
        verbs: &["create", "get", "list", "watch", "delete"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "dispatcher: create the worker copy of a Job, follow it, and delete it when the manager's goes",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: JOBSET_GROUP,
        resource: "jobsets",
        verbs: &["create", "get", "list", "watch", "delete"],
        scope: Scope::AllNamespaces,
        feature: Some(Feature::JobSet),
        why: "dispatcher: create the worker copy of a JobSet, follow it, and delete it when the manager's goes",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: KUEUE_GROUP,
        resource: "localqueues",
        verbs: &["get", "list", "watch"],
        scope: Scope::AllNamespaces,
        feature: Some(Feature::Kueue),
        why: "dispatcher: the worker's Kueue LocalQueues, to find the ClusterQueue a copy enters",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: KUEUE_GROUP,
        resource: "clusterqueues",
        verbs: &["get", "list", "watch"],
        scope: Scope::Cluster,
        feature: Some(Feature::Kueue),
        why: "dispatcher: the worker's Kueue ClusterQueues, their quota and what is reserved of it",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: KUEUE_GROUP,
        resource: "workloads",
        verbs: &["get", "list", "watch"],
        scope: Scope::AllNamespaces,
        feature: Some(Feature::Kueue),
        why: "dispatcher: whether the worker's Kueue admitted or evicted a copy, and why",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "manager's inventory of this worker: its nodes",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        scope: Scope::AllNamespaces,
        feature: None,
        why: "manager's inventory of this worker: what its pods hold",
    },
    ApiUse {
        role: Role::WorkerSide,
        group: NRT_GROUP,
        resource: "noderesourcetopologies",
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        feature: None,
        why: "manager's inventory of this worker: its NUMA zones",
    },
];

/// Non-resource paths every authenticated identity may GET through the default
/// `system:discovery` and `system:public-info-viewer` ClusterRoles (the worker probe uses
/// `/version`). A trailing `*` matches any rest.
pub(crate) const DEFAULT_NON_RESOURCE_URLS: &[&str] = &[
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
];

/// A kube-apiserver request as authorization sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Resource(ResourceRequest),
    /// A path outside `/api` and `/apis` resources (discovery, `/version`), with its verb.
    NonResource {
        verb: &'static str,
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceRequest {
    pub(crate) group: String,
    /// With the subresource after a slash, as RBAC names it (`jobs/status`).
    pub(crate) resource: String,
    pub(crate) verb: &'static str,
    /// `None` for cluster-scoped resources and for requests across all namespaces.
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
}

/// Maps a method and a path with its query (`GET /apis/batch/v1/namespaces/a/jobs?watch=true`)
/// to what RBAC checks, the way kube-apiserver does: a GET without a name is `list`, or
/// `watch` with `watch=true`; a DELETE without a name is `deletecollection`; the legacy
/// `/watch/` prefix is `watch`; `namespaces/<name>/status` and `/finalize` are subresources
/// of the Namespace. `None` when the method is not one the API server serves.
pub(crate) fn parse_request(method: &str, path_and_query: &str) -> Option<Request> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let method_verb = match method.to_ascii_uppercase().as_str() {
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => return None,
    };
    let non_resource = || {
        Some(Request::NonResource {
            verb: method_verb,
            path: path.to_string(),
        })
    };
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // /api/<version>/<resource>... or /apis/<group>/<version>/<resource>...
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
        _ => return non_resource(),
    };
    let (mut verb, rest) = match rest {
        ["watch", rest @ ..] => ("watch", rest),
        ["proxy", rest @ ..] => ("proxy", rest),
        rest => (method_verb, rest),
    };
    if rest.is_empty() {
        return non_resource();
    }
    let mut namespace = None;
    let mut rest = rest;
    if rest[0] == "namespaces" && rest.len() > 1 {
        namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    let resource = rest[0];
    let name = rest.get(1).map(|n| n.to_string());
    let subresource = if verb == "proxy" { None } else { rest.get(2) };
    if resource == "namespaces" && group.is_empty() && namespace.is_some() && rest.len() <= 3 {
        // The Namespace object itself: cluster-scoped.
        namespace = None;
    }
    if name.is_none() {
        verb = match verb {
            "get" if query_flag(query, "watch") => "watch",
            "get" => "list",
            "delete" => "deletecollection",
            v => v,
        };
    }
    Some(Request::Resource(ResourceRequest {
        group: group.to_string(),
        resource: match subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        },
        verb,
        namespace,
        name,
    }))
}

/// Whether `key` is set to true in a query string, as Go's `strconv.ParseBool` reads it.
fn query_flag(query: &str, key: &str) -> bool {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .any(|(k, v)| k == key && matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// The entries that apply to calls made as `identity` with no optional feature on.
pub fn uses_for(identity: Role) -> impl Iterator<Item = &'static ApiUse> {
    uses_with(identity, &[])
}

/// The entries that apply to calls made as `identity` with `features` on: those of no
/// feature and those of a feature in the list.
pub fn uses_with(
    identity: Role,
    features: &[Feature],
) -> impl Iterator<Item = &'static ApiUse> + '_ {
    API_USES.iter().filter(move |u| {
        u.role.applies_to(identity) && u.feature.is_none_or(|f| features.contains(&f))
    })
}

/// Whether the table allows `identity` (Manager, Worker or WorkerSide; Both: both pods) to
/// make this request with no optional feature on. Uses in Switchyard's own namespace accept
/// any single namespace; `request_is_covered_in` (for the tests) pins it.
pub fn request_is_covered(identity: Role, method: &str, path_and_query: &str) -> bool {
    covered(identity, &[], None, method, path_and_query)
}

/// [`request_is_covered`] with `features` on, e.g. `&[Feature::JobSet]` for a dispatcher
/// that handles JobSets.
pub fn request_is_covered_with(
    identity: Role,
    features: &[Feature],
    method: &str,
    path_and_query: &str,
) -> bool {
    covered(identity, features, None, method, path_and_query)
}

/// [`request_is_covered`] with Switchyard's namespace known.
#[cfg(test)]
pub(crate) fn request_is_covered_in(
    identity: Role,
    own_namespace: &str,
    method: &str,
    path_and_query: &str,
) -> bool {
    covered(identity, &[], Some(own_namespace), method, path_and_query)
}

fn covered(
    identity: Role,
    features: &[Feature],
    own: Option<&str>,
    method: &str,
    path_and_query: &str,
) -> bool {
    if identity == Role::Both {
        return [Role::Manager, Role::Worker]
            .into_iter()
            .all(|r| covered(r, features, own, method, path_and_query));
    }
    match parse_request(method, path_and_query) {
        None => false,
        Some(Request::NonResource { verb, path }) => {
            verb == "get"
                && DEFAULT_NON_RESOURCE_URLS
                    .iter()
                    .any(|u| match u.strip_suffix('*') {
                        Some(prefix) => path.starts_with(prefix),
                        None => path == *u,
                    })
        }
        Some(Request::Resource(r)) => uses_with(identity, features).any(|u| use_covers(u, &r, own)),
    }
}

/// Whether one table entry allows a parsed request.
pub(crate) fn use_covers(u: &ApiUse, r: &ResourceRequest, own_namespace: Option<&str>) -> bool {
    let in_scope = match (u.scope, r.namespace.as_deref()) {
        (Scope::Cluster, ns) => ns.is_none(),
        (Scope::AllNamespaces, _) => true,
        (Scope::OwnNamespace, Some(ns)) => own_namespace.is_none_or(|own| own == ns),
        (Scope::Namespace(want), Some(ns)) => want == ns,
        (Scope::OwnNamespace | Scope::Namespace(_), None) => false,
    };
    in_scope && u.group == r.group && u.resource == r.resource && u.verbs.contains(&r.verb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(method: &str, path: &str) -> ResourceRequest {
        match parse_request(method, path) {
            Some(Request::Resource(r)) => r,
            other => panic!("{method} {path}: {other:?}"),
        }
    }

    /// Method, path as kube-rs sent it to kube-apiserver 1.36, group, resource, verb, namespace.
    type Captured = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
    );

    /// From the captured exchanges in tests/fixtures/kube-api.
    const CAPTURED: &[Captured] = &[
        ("GET", "/api/v1/nodes?", "", "nodes", "list", None),
        ("GET", "/api/v1/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3Dcap-list-a", "", "pods", "list", None),
        ("GET", "/apis/batch/v1/namespaces/research/jobs?limit=1", "batch", "jobs", "list", Some("research")),
        ("GET", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?", "topology.node.k8s.io", "noderesourcetopologies", "list", None),
        ("GET", "/apis/batch/v1/namespaces/research/jobs/cap-list-a", "batch", "jobs", "get", Some("research")),
        ("GET", "/apis/batch/v1/namespaces/research/jobs?watch=true&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion=348", "batch", "jobs", "watch", Some("research")),
        ("GET", "/apis/batch/v1/namespaces/research/jobs?watch=true&timeoutSeconds=5&fieldSelector=metadata.name%3Dproof-job&allowWatchBookmarks=true&resourceVersion=0", "batch", "jobs", "watch", Some("research")),
        ("GET", "/api/v1/nodes?watch=true&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion=1", "", "nodes", "watch", None),
        ("POST", "/apis/batch/v1/namespaces/research/jobs?", "batch", "jobs", "create", Some("research")),
        ("PUT", "/apis/batch/v1/namespaces/research/jobs/cap-create?", "batch", "jobs", "update", Some("research")),
        ("PATCH", "/apis/batch/v1/namespaces/research/jobs/cap-status/status?", "batch", "jobs/status", "patch", Some("research")),
        ("PATCH", "/apis/batch/v1/namespaces/research/jobs/cap-create?force=true&fieldManager=switchyard", "batch", "jobs", "patch", Some("research")),
        ("PATCH", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/worker-gpu-1?", "topology.node.k8s.io", "noderesourcetopologies", "patch", None),
        ("DELETE", "/apis/batch/v1/namespaces/research/jobs/cap-create?", "batch", "jobs", "delete", Some("research")),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases/switchyard-leader", "coordination.k8s.io", "leases", "get", Some("switchyard-system")),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases?", "coordination.k8s.io", "leases", "create", Some("switchyard-system")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases/switchyard-leader?", "coordination.k8s.io", "leases", "update", Some("switchyard-system")),
        ("POST", "/apis/events.k8s.io/v1/namespaces/research/events?", "events.k8s.io", "events", "create", Some("research")),
        ("POST", "/api/v1/nodes?", "", "nodes", "create", None),
        ("PATCH", "/api/v1/nodes/cap-vnode-1/status?", "", "nodes/status", "patch", None),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?", "coordination.k8s.io", "leases", "create", Some("kube-node-lease")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/cap-vnode-1?", "coordination.k8s.io", "leases", "update", Some("kube-node-lease")),
        ("PATCH", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/cap-vnode-1?", "coordination.k8s.io", "leases", "patch", Some("kube-node-lease")),
    ];

    #[test]
    fn captured_request_lines_parse_as_the_api_server_authorizes_them() {
        for (method, path, group, res, verb, ns) in CAPTURED {
            let r = resource(method, path);
            assert_eq!(
                (
                    r.group.as_str(),
                    r.resource.as_str(),
                    r.verb,
                    r.namespace.as_deref()
                ),
                (*group, *res, *verb, *ns),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn names_subresources_and_special_forms() {
        let r = resource("POST", "/api/v1/namespaces/sched/pods/p-1/binding");
        assert_eq!((r.resource.as_str(), r.verb), ("pods/binding", "create"));
        assert_eq!(r.name.as_deref(), Some("p-1"));
        // The Namespace object is cluster-scoped, its status a subresource of it.
        let r = resource("GET", "/api/v1/namespaces/research");
        assert_eq!(
            (r.resource.as_str(), r.verb, r.namespace),
            ("namespaces", "get", None)
        );
        let r = resource("PUT", "/api/v1/namespaces/research/status");
        assert_eq!(
            (r.resource.as_str(), r.namespace),
            ("namespaces/status", None)
        );
        let r = resource("GET", "/api/v1/namespaces?watch=1");
        assert_eq!((r.resource.as_str(), r.verb), ("namespaces", "watch"));
        // watch=false is a list; the legacy /watch/ prefix is a watch.
        assert_eq!(resource("GET", "/api/v1/pods?watch=false").verb, "list");
        let r = resource("GET", "/api/v1/watch/namespaces/a/pods");
        assert_eq!((r.verb, r.namespace.as_deref()), ("watch", Some("a")));
        assert_eq!(
            resource("DELETE", "/apis/batch/v1/namespaces/a/jobs").verb,
            "deletecollection"
        );
        assert_eq!(resource("HEAD", "/api/v1/nodes/n").verb, "get");
        // Trailing slashes and an empty query change nothing.
        assert_eq!(resource("GET", "/api/v1/nodes/?").verb, "list");
        assert!(parse_request("TRACE", "/api/v1/nodes").is_none());
        for path in ["/version", "/apis", "/api/v1", "/apis/batch/v1", "/metrics"] {
            assert!(
                matches!(
                    parse_request("GET", path),
                    Some(Request::NonResource { .. })
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn each_identity_is_allowed_what_it_does_and_nothing_else() {
        use Role::*;
        let cases: &[(Role, &str, &str, bool)] = &[
            // The manager's webhooks and dispatcher.
            (Manager, "GET", "/api/v1/namespaces/research", true),
            (Manager, "PATCH", "/apis/batch/v1/namespaces/research/jobs/cap-status/status?", true),
            (Manager, "POST", "/apis/batch/v1/namespaces/research/jobs?", false),
            (Manager, "DELETE", "/apis/batch/v1/namespaces/research/jobs/cap-create?", false),
            (Manager, "POST", "/apis/events.k8s.io/v1/namespaces/research/events?", true),
            (Manager, "GET", "/apis/switchyard.dev/v1alpha1/workerclusters?watch=true", true),
            (Manager, "PATCH", "/apis/switchyard.dev/v1alpha1/dispatchqueues/research/status?", true),
            (Manager, "PUT", "/apis/switchyard.dev/v1alpha1/dispatchqueues/research", false),
            (Manager, "GET", "/apis/scheduling.k8s.io/v1/priorityclasses?watch=true", true),
            // Secrets and the leader Lease only in its namespace, node Leases only in kube-node-lease.
            (Manager, "GET", "/api/v1/namespaces/switchyard-system/secrets?watch=true", true),
            (Manager, "GET", "/api/v1/secrets?", false),
            (Manager, "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/cap-vnode-1?", true),
            (Manager, "DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/cap-vnode-1?", true),
            (Manager, "DELETE", "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases/switchyard-leader", false),
            (Manager, "POST", "/api/v1/nodes?", true),
            (Manager, "GET", "/api/v1/nodes?&labelSelector=switchyard.dev%2Fcluster", true),
            (Manager, "PATCH", "/api/v1/nodes/cap-vnode-1/status?", true),
            (Manager, "POST", "/api/v1/namespaces/sched/pods/p/binding", true),
            // The worker's pods: inventory and bind only.
            (Worker, "GET", "/api/v1/nodes?watch=true&resourceVersion=1", true),
            (Worker, "GET", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies?", true),
            (Worker, "POST", "/api/v1/namespaces/sched/pods/p/binding", true),
            (Worker, "POST", "/apis/batch/v1/namespaces/research/jobs?", false),
            (Worker, "GET", "/api/v1/namespaces/research", false),
            (Worker, "GET", "/version", true),
            // The dispatcher in a worker.
            (WorkerSide, "POST", "/apis/batch/v1/namespaces/research/jobs?", true),
            (WorkerSide, "DELETE", "/apis/batch/v1/namespaces/research/jobs/cap-create?", true),
            (WorkerSide, "DELETE", "/apis/batch/v1/namespaces/research/jobs?", false),
            (WorkerSide, "PATCH", "/apis/batch/v1/namespaces/research/jobs/cap-status/status?", false),
            (WorkerSide, "GET", "/api/v1/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3Dcap-list-a", true),
            (WorkerSide, "GET", "/api/v1/namespaces/research", false),
            (WorkerSide, "PATCH", "/apis/batch/v1/namespaces/research/jobs/cap-create?", false),
            (WorkerSide, "GET", "/api/v1/namespaces?", false),
            (WorkerSide, "POST", "/api/v1/namespaces/sched/pods/p/binding", false),
            (WorkerSide, "GET", "/api/v1/namespaces/research/secrets/x", false),
            (WorkerSide, "GET", "/metrics", false),
            // Both: allowed to each pod.
            (Both, "POST", "/api/v1/namespaces/sched/pods/p/binding", true),
            (Both, "GET", "/api/v1/pods?", false),
        ];
        for (role, method, path, want) in cases {
            assert_eq!(
                request_is_covered(*role, method, path),
                *want,
                "{role:?} {method} {path}"
            );
        }
        let lease =
            "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases/switchyard-leader";
        assert!(request_is_covered_in(
            Manager,
            "switchyard-system",
            "GET",
            lease
        ));
        assert!(!request_is_covered_in(Manager, "elsewhere", "GET", lease));
    }

    /// JobSet paths as kube-rs builds them for `Api::<JobSet>::namespaced` (the same shapes as
    /// the captured Job lines above, in the CRD's group and version).
    #[test]
    fn jobset_paths_parse_as_the_api_server_authorizes_them() {
        const JS: &str = "/apis/jobset.x-k8s.io/v1alpha2";
        // Method, path, resource, verb, namespace, name.
        type Case = (
            &'static str,
            String,
            &'static str,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: &[Case] = &[
            ("GET", format!("{JS}/namespaces/research/jobsets?limit=1"), "jobsets", "list", Some("research"), None),
            ("GET", format!("{JS}/namespaces/research/jobsets?watch=true&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion=348"), "jobsets", "watch", Some("research"), None),
            ("GET", format!("{JS}/jobsets?watch=true&labelSelector=switchyard.dev%2Fqueue-name"), "jobsets", "watch", None, None),
            ("GET", format!("{JS}/namespaces/research/jobsets/trainer"), "jobsets", "get", Some("research"), Some("trainer")),
            ("POST", format!("{JS}/namespaces/research/jobsets?"), "jobsets", "create", Some("research"), None),
            ("PATCH", format!("{JS}/namespaces/research/jobsets/trainer?fieldManager=switchyard"), "jobsets", "patch", Some("research"), Some("trainer")),
            ("PATCH", format!("{JS}/namespaces/research/jobsets/trainer/status?"), "jobsets/status", "patch", Some("research"), Some("trainer")),
            ("PUT", format!("{JS}/namespaces/research/jobsets/trainer/status"), "jobsets/status", "update", Some("research"), Some("trainer")),
            ("DELETE", format!("{JS}/namespaces/research/jobsets/trainer?"), "jobsets", "delete", Some("research"), Some("trainer")),
            ("DELETE", format!("{JS}/namespaces/research/jobsets"), "jobsets", "deletecollection", Some("research"), None),
        ];
        for (method, path, res, verb, ns, name) in cases {
            let r = resource(method, path);
            assert_eq!(
                (
                    r.group.as_str(),
                    r.resource.as_str(),
                    r.verb,
                    r.namespace.as_deref(),
                    r.name.as_deref()
                ),
                ("jobset.x-k8s.io", *res, *verb, *ns, *name),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn jobset_calls_are_allowed_only_with_the_feature_on() {
        use Role::*;
        const JS: &str = "/apis/jobset.x-k8s.io/v1alpha2";
        // (identity, method, path, allowed with JobSet on); never allowed with it off.
        let cases: &[(Role, &str, String, bool)] = &[
            // The manager's dispatcher: the same calls as on its Jobs.
            (
                Manager,
                "GET",
                format!("{JS}/jobsets?watch=true&resourceVersion=1"),
                true,
            ),
            (
                Manager,
                "GET",
                format!("{JS}/namespaces/research/jobsets/trainer"),
                true,
            ),
            (
                Manager,
                "PATCH",
                format!("{JS}/namespaces/research/jobsets/trainer?"),
                true,
            ),
            (
                Manager,
                "PATCH",
                format!("{JS}/namespaces/research/jobsets/trainer/status?"),
                true,
            ),
            (
                Manager,
                "PUT",
                format!("{JS}/namespaces/research/jobsets/trainer/status"),
                false,
            ),
            (
                Manager,
                "POST",
                format!("{JS}/namespaces/research/jobsets?"),
                false,
            ),
            (
                Manager,
                "DELETE",
                format!("{JS}/namespaces/research/jobsets/trainer"),
                false,
            ),
            // The dispatcher in a worker: create, follow and delete the copy.
            (
                WorkerSide,
                "POST",
                format!("{JS}/namespaces/research/jobsets?"),
                true,
            ),
            (
                WorkerSide,
                "GET",
                format!("{JS}/namespaces/research/jobsets?watch=1"),
                true,
            ),
            (
                WorkerSide,
                "GET",
                format!("{JS}/namespaces/research/jobsets/trainer"),
                true,
            ),
            (
                WorkerSide,
                "DELETE",
                format!("{JS}/namespaces/research/jobsets/trainer?"),
                true,
            ),
            (
                WorkerSide,
                "DELETE",
                format!("{JS}/namespaces/research/jobsets"),
                false,
            ),
            (
                WorkerSide,
                "PATCH",
                format!("{JS}/namespaces/research/jobsets/trainer/status"),
                false,
            ),
            // The worker's own pods never touch JobSets.
            (Worker, "GET", format!("{JS}/jobsets?"), false),
            (Both, "GET", format!("{JS}/jobsets?"), false),
            // Another version or group is another API.
            (
                Manager,
                "GET",
                "/apis/jobset.x-k8s.io/v1alpha2/namespaces/research/jobs/trainer".into(),
                false,
            ),
            (
                Manager,
                "GET",
                "/apis/batch/v1/namespaces/research/jobsets/trainer".into(),
                false,
            ),
        ];
        for (role, method, path, want) in cases {
            assert_eq!(
                request_is_covered_with(*role, &[Feature::JobSet], method, path),
                *want,
                "{role:?} {method} {path} with JobSet"
            );
            assert!(
                !request_is_covered(*role, method, path),
                "{role:?} {method} {path} without JobSet"
            );
        }
        // The feature adds to the table; everything else is allowed as before.
        let job = "/apis/batch/v1/namespaces/research/jobs/cap-status/status?";
        assert!(request_is_covered_with(
            Manager,
            &[Feature::JobSet],
            "PATCH",
            job
        ));
        assert!(request_is_covered(Manager, "PATCH", job));
    }

    #[test]
    fn jobset_entries_mirror_the_job_entries() {
        // Whatever the dispatcher does to a Job it does to a JobSet, so the verbs match.
        let feature_uses: Vec<&ApiUse> = API_USES
            .iter()
            .filter(|u| u.feature == Some(Feature::JobSet))
            .collect();
        assert!(!feature_uses.is_empty());
        for u in &feature_uses {
            assert_eq!(u.group, JOBSET_GROUP, "{u:?}");
        }
        let jobs: Vec<_> = API_USES
            .iter()
            .filter(|u| u.group == "batch")
            .map(|u| {
                (
                    u.role,
                    u.resource.replace("jobs", "jobsets"),
                    u.verbs,
                    u.scope,
                )
            })
            .collect();
        let jobsets: Vec<_> = feature_uses
            .iter()
            .map(|u| (u.role, u.resource.to_string(), u.verbs, u.scope))
            .collect();
        assert_eq!(jobs, jobsets);
        for identity in [Role::Manager, Role::Worker, Role::WorkerSide] {
            assert!(uses_for(identity).all(|u| u.feature.is_none()));
            assert_eq!(
                uses_with(identity, &[Feature::JobSet]).count(),
                uses_for(identity).count()
                    + feature_uses.iter().filter(|u| u.role == identity).count()
            );
        }
    }

    #[test]
    fn the_table_is_well_formed() {
        const VERBS: &[&str] = &[
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ];
        for u in API_USES {
            assert!(
                !u.verbs.is_empty() && u.verbs.iter().all(|v| VERBS.contains(v)),
                "{u:?}"
            );
            assert!(!u.why.trim().is_empty(), "{u:?}");
            assert_eq!(u.resource, u.resource.to_ascii_lowercase(), "{u:?}");
            assert!(u.resource.split('/').count() <= 2, "{u:?}");
        }
        // An identity never gets the same verb on the same thing twice with the same scope:
        // a duplicate would hide which line a rule comes from.
        for (i, a) in API_USES.iter().enumerate() {
            for b in &API_USES[i + 1..] {
                let same = a.role == b.role
                    && a.group == b.group
                    && a.resource == b.resource
                    && a.scope == b.scope;
                assert!(
                    !same || a.verbs.iter().all(|v| !b.verbs.contains(v)),
                    "{a:?} {b:?}"
                );
            }
        }
    }
}
