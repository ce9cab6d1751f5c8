//! The extender under the real kube-scheduler of the manager, in both `nodeCacheCapable`
//! modes (two kube-schedulers, one profile each), judging the workers' virtual nodes.

use crate::env::{SCHEDULER_CACHE, SCHEDULER_NO_CACHE};
use crate::k8s::eventually;
use crate::Suite;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

fn pod(name: &str, scheduler: &str, gpus: u32, extra_spec: Value, annotations: Value) -> Pod {
    let r = json!({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": gpus.to_string()});
    let mut spec = json!({
        "schedulerName": scheduler,
        "tolerations": [{"key": "switchyard.dev/virtual", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "busybox:1.36", "resources": {"requests": r, "limits": r}}],
    });
    for (k, v) in extra_spec.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

/// Pods bound to a virtual node have no kubelet to confirm their deletion.
async fn remove_pods(pods: &Api<Pod>, names: &[&str]) {
    for name in names {
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
}

/// A pod that kube-scheduler's own checks let onto w1's virtual node (6 GPUs; w1 has 32) but
/// whose GPUs fit in no NUMA zone of w1 (4 per zone, single-numa-node) stays pending, and the
/// FailedScheduling event carries the extender's reason.
async fn numa_trap(suite: Arc<Suite>, scheduler: &str) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let _w2 = env.w2_steady.read().await;
    let ns = format!("trap-{scheduler}");
    env.namespace(&ns, &[]).await;
    let pods: Api<Pod> = Api::namespaced(env.manager.admin.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &pod("trap", scheduler, 6, json!({}), json!({})),
    )
    .await
    .expect("the pod is created");
    let events: Api<Event> = Api::namespaced(env.manager.admin.clone(), &ns);
    let message = eventually(
        &format!("a FailedScheduling event for pod {ns}/trap from {scheduler}"),
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&ListParams::default().fields("involvedObject.name=trap"))
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
                    .and_then(|e| e.message.clone())
                    .ok_or_else(|| format!("{} events, none FailedScheduling", list.items.len()))
            }
        },
    )
    .await;
    assert!(
        message.contains(
            "the Topology Manager of every node of cluster w1 (single-numa-node) would reject the pod: needs 6 nvidia.com/gpu on one NUMA node"
        ),
        "the event does not carry the extender's reason for switchyard-w1: {message}"
    );
    let trap = pods.get("trap").await.unwrap();
    assert_eq!(
        trap.spec.and_then(|s| s.node_name),
        None,
        "the NUMA trap was bound"
    );
    remove_pods(&pods, &["trap"]).await;
}

pub async fn numa_trap_stays_pending_with_the_extenders_reason_node_cache(suite: Arc<Suite>) {
    numa_trap(suite, SCHEDULER_CACHE).await
}

pub async fn numa_trap_stays_pending_with_the_extenders_reason_no_node_cache(suite: Arc<Suite>) {
    numa_trap(suite, SCHEDULER_NO_CACHE).await
}

/// Three pods of a gang of three, 2 GPUs each, selecting virtual nodes the usual way
/// (`type: virtual-kubelet`): w2 holds two of them at once (one node, 2 GPUs per zone), w1
/// holds all three, so each is bound to w1's virtual node.
async fn gang(suite: Arc<Suite>, scheduler: &str) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let _w2 = env.w2_steady.read().await;
    let ns = format!("gang-{scheduler}");
    env.namespace(&ns, &[]).await;
    let pods: Api<Pod> = Api::namespaced(env.manager.admin.clone(), &ns);
    let names = ["gang-0", "gang-1", "gang-2"];
    for name in names {
        pods.create(
            &PostParams::default(),
            &pod(
                name,
                scheduler,
                2,
                json!({"nodeSelector": {"type": "virtual-kubelet"}}),
                json!({"switchyard.dev/gang-size": "3"}),
            ),
        )
        .await
        .expect("the pod is created");
    }
    let events: Api<Event> = Api::namespaced(env.manager.admin.clone(), &ns);
    for name in names {
        let node = eventually(
            &format!("pod {ns}/{name} bound by {scheduler}"),
            Duration::from_secs(60),
            || {
                let (pods, events) = (pods.clone(), events.clone());
                async move {
                    let p = pods.get(name).await.map_err(|e| e.to_string())?;
                    if let Some(node) = p.spec.and_then(|s| s.node_name) {
                        return Ok(node);
                    }
                    let why = events
                        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                        .await
                        .map(|l| {
                            l.items
                                .into_iter()
                                .filter_map(|e| e.message)
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default();
                    Err(format!("pending; events: {why:?}"))
                }
            },
        )
        .await;
        assert_eq!(node, "switchyard-w1", "pod {name} of the gang");
    }
    remove_pods(&pods, &names).await;
}

pub async fn gang_selecting_virtual_nodes_lands_on_the_only_cluster_that_holds_it_node_cache(
    suite: Arc<Suite>,
) {
    gang(suite, SCHEDULER_CACHE).await
}

pub async fn gang_selecting_virtual_nodes_lands_on_the_only_cluster_that_holds_it_no_node_cache(
    suite: Arc<Suite>,
) {
    gang(suite, SCHEDULER_NO_CACHE).await
}
