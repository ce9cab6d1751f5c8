//! One virtual Node per connected worker in the manager cluster, kept alive as a kubelet
//! would: its Ready condition follows the connection and its Lease in `kube-node-lease` is
//! renewed, or the node lifecycle controller would mark it unreachable.
//!
//! Capacity and allocatable are the sums over the worker's nodes, so kube-scheduler's own fit
//! check is a cheap necessary condition; the extender decides exactly.

use super::registry::Workers;
use crate::inventory::{Cluster, InventoryStore, ResourceTable};
use crate::quantity::Milli;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

pub(crate) const CLUSTER_LABEL: &str = "switchyard.dev/cluster";
pub(crate) const VIRTUAL_TAINT: &str = "switchyard.dev/virtual";
pub(crate) const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The label keys Switchyard set on a virtual node, comma-separated: a merge patch only adds
/// and changes keys, so a key we stop setting must be removed by name, and only ours may be.
pub(crate) const OWNED_LABELS_ANNOTATION: &str = "switchyard.dev/labels";
/// The kubelet's default; the node lifecycle controller waits 40 s past a renewal.
pub(crate) const LEASE_SECONDS: i32 = 40;

fn rfc3339(t: SystemTime, micros: bool) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let dt = time::OffsetDateTime::from_unix_timestamp(d.as_secs() as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let base = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    // MicroTime needs exactly six fractional digits (the API server refuses other forms).
    if micros {
        format!("{base}.{:06}Z", d.subsec_micros())
    } else {
        format!("{base}Z")
    }
}

/// Milli-units as a Kubernetes quantity string: whole units when exact.
fn quantity(m: i64) -> String {
    Milli(m).to_string()
}

/// Labels every node of the cluster shares (same key and value).
fn common_labels(cluster: &Cluster) -> BTreeMap<String, String> {
    let mut nodes = cluster.nodes.iter();
    let Some(first) = nodes.next() else {
        return BTreeMap::new();
    };
    let mut common = first.labels.to_map();
    for n in nodes {
        common.retain(|k, v| n.labels.get(k) == Some(v.as_str()));
    }
    // Per-node identity labels would mislead on an aggregate.
    common.remove("kubernetes.io/hostname");
    common
}

/// The labels a virtual node `name` carries as its own, whatever its worker's nodes carry:
/// the WorkerCluster's labels, the cluster's name, `type: virtual-kubelet` and its hostname.
/// A pod's node selection on these keys is about the virtual node, never about the nodes of
/// its worker (the extender judges it so).
pub fn own_labels(
    name: &str,
    cluster: &str,
    cluster_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = cluster_labels.clone();
    labels.insert(CLUSTER_LABEL.into(), cluster.into());
    labels.insert("type".into(), "virtual-kubelet".into());
    labels.insert("kubernetes.io/hostname".into(), name.into());
    labels
}

/// The Node object for `cluster`'s virtual node.
pub fn desired(
    name: &str,
    cluster: &Cluster,
    table: &ResourceTable,
    cluster_labels: &BTreeMap<String, String>,
    connected: bool,
    now: SystemTime,
) -> Value {
    let mut labels = common_labels(cluster);
    labels.extend(own_labels(name, &cluster.name, cluster_labels));
    let totals: BTreeMap<String, String> = (0..table.len())
        .filter_map(|r| {
            let sum = cluster.summary.allocatable.get(r).copied().unwrap_or(0);
            (sum > 0).then(|| (table.name(r).to_string(), quantity(sum)))
        })
        .collect();
    let owned = labels
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",");
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {OWNED_LABELS_ANNOTATION: owned}},
        "spec": {"taints": [virtual_taint()]},
        "status": {
            "capacity": totals,
            "allocatable": totals,
            "conditions": conditions(connected, now),
            "nodeInfo": {"kubeletVersion": concat!("switchyard-", env!("CARGO_PKG_VERSION")),
                         "operatingSystem": "linux", "architecture": "amd64",
                         "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                         "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": ""}
        }
    })
}

fn virtual_taint() -> Value {
    json!({"key": VIRTUAL_TAINT, "value": "true", "effect": "NoSchedule"})
}

/// The merge patches that turn the node as it is (`existing`) into `desired`: the object's
/// (labels and taints; `None` when nothing there changes) and the status's.
///
/// - Labels listed in the ownership annotation but no longer wanted are removed (`null`);
///   labels others put on the node are left alone.
/// - Taints: ours is added or corrected in place; every other taint (the node lifecycle
///   controller's `node.kubernetes.io/unreachable`, a user's) is kept. A merge patch replaces
///   the whole list, so the patch then carries the resourceVersion it was computed from: a
///   taint added in between makes it fail (409) rather than vanish.
/// - Capacity and allocatable are replaced exactly: a resource the worker no longer has is
///   removed.
pub(crate) fn update_patches(existing: &Value, desired: &Value) -> (Option<Value>, Value) {
    let want = desired["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let have = existing["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let previously_owned: Vec<&str> = existing["metadata"]["annotations"][OWNED_LABELS_ANNOTATION]
        .as_str()
        .map(|s| s.split(',').filter(|k| !k.is_empty()).collect())
        .unwrap_or_default();
    let mut labels = serde_json::Map::new();
    for (k, v) in &want {
        if have.get(k) != Some(v) {
            labels.insert(k.clone(), v.clone());
        }
    }
    for k in previously_owned {
        if !want.contains_key(k) && have.contains_key(k) {
            labels.insert(k.to_string(), Value::Null);
        }
    }
    let owned = &desired["metadata"]["annotations"][OWNED_LABELS_ANNOTATION];
    let annotation_stale = &existing["metadata"]["annotations"][OWNED_LABELS_ANNOTATION] != owned;

    let ours = virtual_taint();
    let is_ours = |t: &Value| t["key"] == ours["key"];
    let current: Vec<Value> = existing["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut taints: Vec<Value> = Vec::with_capacity(current.len() + 1);
    let mut placed = false;
    for t in &current {
        if is_ours(t) {
            if !placed {
                taints.push(ours.clone());
                placed = true;
            }
        } else {
            taints.push(t.clone());
        }
    }
    if !placed {
        taints.insert(0, ours);
    }
    let taints_change = taints != current;

    let mut object = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if annotation_stale {
        metadata.insert(
            "annotations".into(),
            json!({ OWNED_LABELS_ANNOTATION: owned }),
        );
    }
    if taints_change {
        object.insert("spec".into(), json!({ "taints": taints }));
        if let Some(rv) = existing["metadata"]["resourceVersion"].as_str() {
            metadata.insert("resourceVersion".into(), json!(rv));
        }
    }
    if !metadata.is_empty() {
        object.insert("metadata".into(), Value::Object(metadata));
    }
    let object = (!object.is_empty()).then_some(Value::Object(object));

    let mut status = desired["status"].clone();
    for field in ["capacity", "allocatable"] {
        let Some(old) = existing["status"][field].as_object() else {
            continue;
        };
        let Some(new) = status[field].as_object_mut() else {
            continue;
        };
        for k in old.keys() {
            new.entry(k.clone()).or_insert(Value::Null);
        }
    }
    (object, json!({ "status": status }))
}

/// Every condition, every time: a merge patch replaces the whole list.
pub(crate) fn conditions(connected: bool, now: SystemTime) -> Value {
    let t = rfc3339(now, false);
    let (status, reason, message) = if connected {
        (
            "True",
            "WorkerConnected",
            "the worker cluster's API server answers",
        )
    } else {
        (
            "False",
            "WorkerDisconnected",
            "the worker cluster's API server does not answer, or its inventory is stale",
        )
    };
    json!([
        {"type": "Ready", "status": status, "reason": reason, "message": message,
         "lastHeartbeatTime": t, "lastTransitionTime": t},
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
         "message": "aggregate of the worker's nodes", "lastHeartbeatTime": t, "lastTransitionTime": t}
    ])
}

/// Creates the virtual node, or brings an existing one to `node` (see [`update_patches`]).
pub async fn apply(client: &kube::Client, node: &Value) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    match api.get_opt(name).await? {
        None => {
            let obj: Node =
                serde_json::from_value(node.clone()).map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &obj).await?;
        }
        Some(existing) => {
            let existing = serde_json::to_value(&existing).map_err(kube::Error::SerdeError)?;
            let (object, status) = update_patches(&existing, node);
            if let Some(patch) = object {
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
    }
    Ok(())
}

/// Renews (or creates) the node's heartbeat Lease.
pub async fn renew_lease(
    client: &kube::Client,
    name: &str,
    now: SystemTime,
) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let renew = rfc3339(now, true);
    let patch = json!({"spec": {"renewTime": renew, "holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew}
            }))
            .map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Removes a worker's virtual node (its Lease goes with it through garbage collection or is
/// deleted here when it has no owner).
pub async fn remove(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    match leases.delete(name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// How virtual nodes are kept.
#[derive(Debug, Clone)]
pub struct VirtualNodeOptions {
    /// Node names are this prefix followed by the worker's name.
    pub prefix: String,
    /// How often each node's Lease is renewed (the kubelet's default: 10 s).
    pub heartbeat: Duration,
    /// An unchanged node's status is still rewritten this often, as a kubelet reports it.
    pub status_every: Duration,
    /// Bound on each request to the manager's API server.
    pub request_timeout: Duration,
}

impl Default for VirtualNodeOptions {
    fn default() -> Self {
        Self {
            prefix: "switchyard-".into(),
            heartbeat: Duration::from_secs(10),
            status_every: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// What was last written for one worker's node.
struct Kept {
    /// The node without its heartbeat times, to tell a real change from the clock.
    content: Value,
    ready: bool,
    transition: Value,
    applied_at: Instant,
    renewed_at: Option<Instant>,
}

/// The node without the times that change on every heartbeat.
fn content(node: &Value) -> Value {
    let mut n = node.clone();
    if let Some(conditions) = n["status"]["conditions"].as_array_mut() {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastHeartbeatTime");
                c.remove("lastTransitionTime");
            }
        }
    }
    n
}

async fn bounded<T>(
    limit: Duration,
    what: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(limit, what).await.unwrap_or_else(|_| {
        Err(kube::Error::Service(
            format!("no answer from the API server within {limit:?}").into(),
        ))
    })
}

/// Keeps one virtual node per worker while this replica leads: created once the worker has
/// connected, its status rewritten when it changes (Ready follows the worker's `Active`
/// condition) and at least every `status_every`, its Lease renewed every `heartbeat`, and
/// deleted with its Lease when the WorkerCluster is gone. Runs until aborted, or until the
/// leadership's publisher is gone while this replica does not lead.
pub async fn maintain(
    client: kube::Client,
    mut workers: Workers,
    store: Arc<InventoryStore>,
    mut leader: watch::Receiver<bool>,
    options: VirtualNodeOptions,
) {
    let mut kept: BTreeMap<String, Kept> = BTreeMap::new();
    let mut orphans_checked = false;
    // A gone publisher leaves its last value in place: views fixed for good, or a replica
    // that leads (or not) for good.
    let mut workers_alive = true;
    let mut leader_alive = true;
    loop {
        while !*leader.borrow_and_update() {
            // Another replica keeps the nodes; start from what the API server has when this
            // one leads again.
            kept.clear();
            orphans_checked = false;
            if leader.changed().await.is_err() {
                return;
            }
        }
        let views = workers.snapshot();
        let synced = workers.is_synced();
        if synced && !orphans_checked {
            orphans_checked = remove_orphans(&client, &views, &options).await;
        }
        let inventory = store.snapshot();
        for (name, view) in views.iter() {
            // Leadership lost mid-pass: the new leader writes from here on.
            if !*leader.borrow() {
                break;
            }
            let Some(cluster) = inventory.cluster(name) else {
                continue;
            };
            if !view.connected && !kept.contains_key(name) {
                continue;
            }
            let node = desired(
                &format!("{}{name}", options.prefix),
                cluster,
                &inventory.resources,
                &view.labels,
                view.active,
                SystemTime::now(),
            );
            keep_node(&client, &options, name, node, view.active, &mut kept).await;
        }
        if synced && *leader.borrow() {
            remove_gone(&client, &options, &views, &mut kept).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(options.heartbeat / 2) => {}
            alive = workers.changed(), if workers_alive => workers_alive = alive,
            changed = leader.changed(), if leader_alive => leader_alive = changed.is_ok(),
        }
    }
}

/// Writes worker `name`'s virtual node (`node`, as [`desired`] made it) when it changed or its
/// status is due, and renews its Lease when due; `kept` records what was written.
async fn keep_node(
    client: &kube::Client,
    options: &VirtualNodeOptions,
    name: &str,
    mut node: Value,
    ready: bool,
    kept: &mut BTreeMap<String, Kept>,
) {
    let node_name = format!("{}{name}", options.prefix);
    let now = SystemTime::now();
    let previous = kept.get(name);
    // Ready's transition time moves only when Ready does.
    if let Some(p) = previous.filter(|p| p.ready == ready) {
        node["status"]["conditions"][0]["lastTransitionTime"] = p.transition.clone();
    }
    let node_content = content(&node);
    let due = previous.is_none_or(|p| {
        p.content != node_content || p.applied_at.elapsed() >= options.status_every
    });
    if due {
        match bounded(options.request_timeout, apply(client, &node)).await {
            Ok(()) => {
                let renewed_at = previous.and_then(|p| p.renewed_at);
                kept.insert(
                    name.to_string(),
                    Kept {
                        content: node_content,
                        ready,
                        transition: node["status"]["conditions"][0]["lastTransitionTime"].clone(),
                        applied_at: Instant::now(),
                        renewed_at,
                    },
                );
            }
            Err(e) => tracing::warn!(node = %node_name, error = %e, "cannot write virtual node"),
        }
    }
    let Some(k) = kept.get_mut(name) else {
        return;
    };
    // A little early, so a pass that runs late never lets the lease lapse.
    let renew_due = k
        .renewed_at
        .is_none_or(|t| t.elapsed() >= options.heartbeat.mul_f32(0.8));
    if renew_due {
        match bounded(
            options.request_timeout,
            renew_lease(client, &node_name, now),
        )
        .await
        {
            Ok(()) => k.renewed_at = Some(Instant::now()),
            Err(e) => {
                tracing::warn!(node = %node_name, error = %e, "cannot renew virtual node lease")
            }
        }
    }
}

/// Removes the virtual nodes kept for workers no longer in `views` (their WorkerCluster is
/// gone); a node that cannot be removed is tried again on the next pass.
async fn remove_gone(
    client: &kube::Client,
    options: &VirtualNodeOptions,
    views: &BTreeMap<String, super::registry::WorkerView>,
    kept: &mut BTreeMap<String, Kept>,
) {
    let gone: Vec<String> = kept
        .keys()
        .filter(|n| !views.contains_key(*n))
        .cloned()
        .collect();
    for name in gone {
        let node_name = format!("{}{name}", options.prefix);
        match bounded(options.request_timeout, remove(client, &node_name)).await {
            Ok(()) => {
                tracing::info!(node = %node_name, "virtual node removed with its worker");
                kept.remove(&name);
            }
            Err(e) => tracing::warn!(node = %node_name, error = %e, "cannot remove virtual node"),
        }
    }
}

/// Deletes the virtual nodes (ours by their label) whose worker no longer exists, as after
/// a WorkerCluster deleted while no replica led. Returns whether the list succeeded.
async fn remove_orphans(
    client: &kube::Client,
    views: &BTreeMap<String, super::registry::WorkerView>,
    options: &VirtualNodeOptions,
) -> bool {
    let api: Api<Node> = Api::all(client.clone());
    let params = ListParams::default().labels(CLUSTER_LABEL);
    let nodes = match bounded(options.request_timeout, api.list(&params)).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list virtual nodes");
            return false;
        }
    };
    for node in nodes {
        let name = node.metadata.name.unwrap_or_default();
        let Some(cluster) = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CLUSTER_LABEL))
        else {
            continue;
        };
        if views.contains_key(cluster) || name != format!("{}{cluster}", options.prefix) {
            continue;
        }
        match bounded(options.request_timeout, remove(client, &name)).await {
            Ok(()) => tracing::info!(node = %name, "virtual node of a removed worker deleted"),
            Err(e) => tracing::warn!(node = %name, error = %e, "cannot remove virtual node"),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::parse_yaml;

    #[test]
    fn the_virtual_node_sums_the_worker_and_carries_its_identity() {
        let inv = parse_yaml(include_str!(
            "../../tests/data/formats/inventory.example.yaml"
        ))
        .unwrap();
        let eu = inv.cluster("eu-1").unwrap();
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_795_000_000_123_456);
        let labels = BTreeMap::from([("tier".to_string(), "gold".to_string())]);
        let node = desired("switchyard-eu-1", eu, &inv.resources, &labels, true, now);
        assert_eq!(node["metadata"]["labels"][CLUSTER_LABEL], "eu-1");
        assert_eq!(node["metadata"]["labels"]["type"], "virtual-kubelet");
        assert_eq!(node["metadata"]["labels"]["tier"], "gold");
        assert_eq!(
            node["metadata"]["labels"]["kubernetes.io/hostname"],
            "switchyard-eu-1"
        );
        assert_eq!(node["status"]["allocatable"]["cpu"], "80");
        assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "8");
        assert_eq!(node["status"]["allocatable"]["pods"], "220");
        assert_eq!(node["spec"]["taints"][0]["key"], VIRTUAL_TAINT);
        assert_eq!(node["status"]["conditions"][0]["status"], "True");
        // It parses as a Node, as the API server would accept it.
        let _: Node = serde_json::from_value(node).unwrap();
        let down = conditions(false, now);
        assert_eq!(down[0]["status"], "False");
        assert_eq!(rfc3339(now, true), "2026-11-18T11:06:40.123456Z");
    }

    #[test]
    fn an_update_removes_what_we_no_longer_set_and_keeps_what_others_set() {
        let inv = parse_yaml(include_str!(
            "../../tests/data/formats/inventory.example.yaml"
        ))
        .unwrap();
        let eu = inv.cluster("eu-1").unwrap();
        let now = SystemTime::UNIX_EPOCH;
        let old_labels = BTreeMap::from([("tier".to_string(), "gold".to_string())]);
        let mut existing = desired(
            "switchyard-eu-1",
            eu,
            &inv.resources,
            &old_labels,
            true,
            now,
        );
        existing["metadata"]["resourceVersion"] = json!("41");
        existing["metadata"]["labels"]["user.example/keep"] = json!("yes");
        existing["status"]["capacity"]["example.com/fpga"] = json!("2");
        existing["status"]["allocatable"]["example.com/fpga"] = json!("2");
        let unreachable = json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"});
        existing["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(unreachable.clone());

        let new_labels = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let want = desired(
            "switchyard-eu-1",
            eu,
            &inv.resources,
            &new_labels,
            true,
            now,
        );
        let (object, status) = update_patches(&existing, &want);
        let object = object.expect("labels changed");
        assert_eq!(object["metadata"]["labels"]["tier"], Value::Null);
        assert_eq!(object["metadata"]["labels"]["team"], "ml");
        assert!(object["metadata"]["labels"]
            .get("user.example/keep")
            .is_none());
        assert!(
            object["metadata"]["labels"].get(CLUSTER_LABEL).is_none(),
            "unchanged"
        );
        assert!(object["metadata"]["annotations"][OWNED_LABELS_ANNOTATION]
            .as_str()
            .unwrap()
            .contains("team"));
        // Our taint is in place: the list, and its resourceVersion precondition, stay out.
        assert!(object.get("spec").is_none());
        assert!(object["metadata"].get("resourceVersion").is_none());
        assert_eq!(
            status["status"]["capacity"]["example.com/fpga"],
            Value::Null
        );
        assert_eq!(
            status["status"]["allocatable"]["example.com/fpga"],
            Value::Null
        );
        assert_eq!(status["status"]["allocatable"]["cpu"], "80");

        // The patch applied as the API server applies a merge patch.
        let mut merged = existing.clone();
        json_patch::merge(&mut merged, &object);
        json_patch::merge(&mut merged, &status);
        assert_eq!(merged["metadata"]["labels"]["user.example/keep"], "yes");
        assert!(merged["metadata"]["labels"].get("tier").is_none());
        assert!(merged["status"]["allocatable"]
            .get("example.com/fpga")
            .is_none());
        // Nothing left to change.
        let (again, _) = update_patches(&merged, &want);
        assert_eq!(again, None);

        // Our taint lost (or changed by someone): put back beside the others, guarded by
        // the resourceVersion the list was read at.
        merged["spec"]["taints"] = json!([unreachable]);
        let (object, _) = update_patches(&merged, &want);
        let object = object.unwrap();
        assert_eq!(
            object["spec"]["taints"],
            json!([virtual_taint(), unreachable])
        );
        assert_eq!(object["metadata"]["resourceVersion"], "41");
    }
}
