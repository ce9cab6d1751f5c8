//! One virtual Node per connected worker in the manager cluster, kept alive as a kubelet
//! would: its Ready condition follows the connection and its Lease in `kube-node-lease` is
//! renewed, or the node lifecycle controller would mark it unreachable.
//!
//! Capacity and allocatable are the sums over the worker's nodes, so kube-scheduler's own fit
//! check is a cheap necessary condition; the extender decides exactly.

use crate::inventory::{Cluster, ResourceTable};
use crate::quantity::Milli;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::SystemTime;

pub const CLUSTER_LABEL: &str = "switchyard.dev/cluster";
pub const VIRTUAL_TAINT: &str = "switchyard.dev/virtual";
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet's default; the node lifecycle controller waits 40 s past a renewal.
pub const LEASE_SECONDS: i32 = 40;

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
    let mut common = first.labels.clone();
    for n in nodes {
        common.retain(|k, v| n.labels.get(k) == Some(v));
    }
    // Per-node identity labels would mislead on an aggregate.
    common.remove("kubernetes.io/hostname");
    common
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
    labels.extend(cluster_labels.clone());
    labels.insert(CLUSTER_LABEL.into(), cluster.name.clone());
    labels.insert("type".into(), "virtual-kubelet".into());
    labels.insert("kubernetes.io/hostname".into(), name.into());
    let totals: BTreeMap<String, String> = (0..table.len())
        .filter_map(|r| {
            let sum = cluster.summary.allocatable.get(r).copied().unwrap_or(0);
            (sum > 0).then(|| (table.name(r).to_string(), quantity(sum)))
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": VIRTUAL_TAINT, "value": "true", "effect": "NoSchedule"}]},
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

/// Every condition, every time: a merge patch replaces the whole list.
pub fn conditions(connected: bool, now: SystemTime) -> Value {
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
            "the worker cluster's API server does not answer",
        )
    };
    json!([
        {"type": "Ready", "status": status, "reason": reason, "message": message,
         "lastHeartbeatTime": t, "lastTransitionTime": t},
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
         "message": "aggregate of the worker's nodes", "lastHeartbeatTime": t, "lastTransitionTime": t}
    ])
}

/// Creates the virtual node, or updates its status when it exists.
pub async fn apply(client: &kube::Client, node: &Value) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    match api.get_opt(name).await? {
        None => {
            let obj: Node =
                serde_json::from_value(node.clone()).map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &obj).await?;
        }
        Some(_) => {
            let patch = json!({"metadata": {"labels": node["metadata"]["labels"]},
                               "spec": node["spec"]});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let status = json!({"status": node["status"]});
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
}
