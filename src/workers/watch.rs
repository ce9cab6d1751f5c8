//! The watches of one worker: Nodes, the Pods that hold node resources, and
//! NodeResourceTopology objects where that CRD exists, forwarded to the [`hub`](super::hub).
//! A probe (`GET /version`) with a short timeout proves the worker alive between events.

use super::hub::Update;
use super::kubeconfig::probe;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// topology.node.k8s.io/v1alpha2 NodeResourceTopology, as node-feature-discovery publishes it.
pub fn nrt_resource() -> ApiResource {
    ApiResource {
        group: "topology.node.k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: "topology.node.k8s.io/v1alpha2".into(),
        kind: "NodeResourceTopology".into(),
        plural: "noderesourcetopologies".into(),
    }
}

#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often the worker is probed between events.
    pub probe_every: Duration,
    pub probe_timeout: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            probe_every: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
        }
    }
}

/// Forwards one kind's events; a failed watch is retried by the watcher's own backoff, and
/// each failure is logged once with the worker's name.
async fn forward<K, F>(
    cluster: String,
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    tx: Sender<Update>,
    wrap: F,
) where
    F: Fn(String, Event<K>) -> Update,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                if tx.send(wrap(cluster.clone(), ev)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(cluster = %cluster, error = %e, "watch failed; retrying with backoff")
            }
        }
    }
}

/// Runs every watch of one worker until the hub goes away. Never returns early on errors:
/// a worker that fails or hangs only slows its own tasks. When the probe sees the worker come
/// back after failing, every watch is started afresh: a watch request stuck on a hung server
/// would otherwise wait out its whole read timeout.
pub async fn run(cluster: String, client: kube::Client, tx: Sender<Update>, options: WatchOptions) {
    loop {
        let config = watcher::Config::default();
        let nodes = watcher(Api::<Node>::all(client.clone()), config.clone()).default_backoff();
        let pods = watcher(
            Api::<Pod>::all(client.clone()),
            config
                .clone()
                .fields("status.phase!=Succeeded,status.phase!=Failed"),
        )
        .default_backoff();
        let nrts = watcher(
            Api::<DynamicObject>::all_with(client.clone(), &nrt_resource()),
            config,
        )
        .default_backoff();
        let watches = async {
            tokio::join!(
                forward(cluster.clone(), nodes, tx.clone(), |c, e| Update::Node(
                    c,
                    Box::new(e)
                )),
                forward(cluster.clone(), pods, tx.clone(), |c, e| Update::Pod(
                    c,
                    Box::new(e)
                )),
                forward(cluster.clone(), nrts, tx.clone(), |c, e| {
                    Update::Topology(c, Box::new(e))
                }),
            );
        };
        // Resolves when the worker answers again after at least one failed probe; never
        // resolves while it stays healthy.
        let recovered = async {
            let mut failed = false;
            loop {
                match probe(&client, options.probe_timeout).await {
                    Ok(_) => {
                        if tx.send(Update::Alive(cluster.clone())).await.is_err() {
                            return false;
                        }
                        if failed {
                            return true;
                        }
                    }
                    Err(e) => {
                        if !failed {
                            tracing::warn!(cluster = %cluster, error = %e, "worker probe failed");
                        }
                        failed = true;
                    }
                }
                tokio::time::sleep(options.probe_every).await;
            }
        };
        tokio::select! {
            _ = watches => return,
            back = recovered => {
                if !back {
                    return;
                }
                tracing::info!(cluster = %cluster, "worker answers again; restarting its watches");
            }
        }
    }
}
