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
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// Counts every watch failure (and every restart after the worker came back).
    pub restarts: Option<Counter>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            probe_every: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
            restarts: None,
        }
    }
}

/// How a worker's node and pod watches are doing: listed at least once, and their last
/// error. A watch that recovers after an error emits nothing on a quiet cluster, so an error
/// counts as current for a window (longer than the watchers' longest retry delay, 30 s)
/// unless the watch proves it recovered by listing again or delivering an event.
#[derive(Debug, Default)]
pub struct WatchHealth {
    inner: std::sync::Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    nodes_listed: bool,
    pods_listed: bool,
    /// The last unrecovered error of the node and of the pod watch.
    errors: [Option<(Instant, String)>; 2],
}

/// The kinds whose health counts: NodeResourceTopology is optional (the CRD may not exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracked {
    Nodes,
    Pods,
    Not,
}

impl Tracked {
    fn index(self) -> Option<usize> {
        match self {
            Tracked::Nodes => Some(0),
            Tracked::Pods => Some(1),
            Tracked::Not => None,
        }
    }
}

impl WatchHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_ok(&self, kind: Tracked, listed: bool) {
        let Some(i) = kind.index() else {
            return;
        };
        let mut s = self.lock();
        s.errors[i] = None;
        if listed {
            match kind {
                Tracked::Nodes => s.nodes_listed = true,
                Tracked::Pods => s.pods_listed = true,
                Tracked::Not => {}
            }
        }
    }

    fn mark_failed(&self, kind: Tracked, error: String, now: Instant) {
        if let Some(i) = kind.index() {
            self.lock().errors[i] = Some((now, error));
        }
    }

    /// Whether the inventory is being kept up to date at `now`: nodes and pods listed, and
    /// no unrecovered error in the last `window`; otherwise why not.
    pub fn fresh(&self, now: Instant, window: Duration) -> Result<(), String> {
        let s = self.lock();
        for (what, error) in ["node", "pod"].iter().zip(&s.errors) {
            if let Some((at, e)) = error {
                let ago = now.saturating_duration_since(*at);
                if ago < window {
                    return Err(format!(
                        "the {what} watch failed {}s ago: {e}",
                        ago.as_secs()
                    ));
                }
            }
        }
        match (s.nodes_listed, s.pods_listed) {
            (true, true) => Ok(()),
            (false, _) => Err("the nodes have not been listed yet".into()),
            (true, false) => Err("the pods have not been listed yet".into()),
        }
    }

    /// Whether nodes and pods have both been listed once.
    pub fn listed(&self) -> bool {
        let s = self.lock();
        s.nodes_listed && s.pods_listed
    }
}

/// Forwards one kind's events; a failed watch is retried by the watcher's own backoff, and
/// each failure is logged with the worker's name and counted as a watch restart.
async fn forward<K, F>(
    cluster: String,
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    tx: Sender<Update>,
    (kind, health, restarts): (Tracked, Arc<WatchHealth>, Option<Counter>),
    wrap: F,
) where
    F: Fn(String, Event<K>) -> Update,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                // A relist in progress proves nothing yet; its end or a live event does.
                match ev {
                    Event::Init | Event::InitApply(_) => {}
                    Event::InitDone => health.mark_ok(kind, true),
                    Event::Apply(_) | Event::Delete(_) => health.mark_ok(kind, false),
                }
                if tx.send(wrap(cluster.clone(), ev)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                if let Some(c) = &restarts {
                    c.inc();
                }
                health.mark_failed(kind, e.to_string(), Instant::now());
                tracing::warn!(cluster = %cluster, error = %e, "watch failed; retrying with backoff")
            }
        }
    }
}

/// Runs the node, pod and NodeResourceTopology watches of one worker until the hub goes
/// away, reporting into `health` and counting failures in `restarts`.
pub async fn watches(
    cluster: String,
    client: kube::Client,
    tx: Sender<Update>,
    health: Arc<WatchHealth>,
    restarts: Option<Counter>,
) {
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
    let ctx = |kind| (kind, health.clone(), restarts.clone());
    tokio::join!(
        forward(
            cluster.clone(),
            nodes,
            tx.clone(),
            ctx(Tracked::Nodes),
            |c, e| Update::Node(c, Box::new(e))
        ),
        forward(
            cluster.clone(),
            pods,
            tx.clone(),
            ctx(Tracked::Pods),
            |c, e| Update::Pod(c, Box::new(e))
        ),
        forward(
            cluster.clone(),
            nrts,
            tx.clone(),
            ctx(Tracked::Not),
            |c, e| { Update::Topology(c, Box::new(e)) }
        ),
    );
}

/// Runs every watch of one worker until the hub goes away. Never returns early on errors:
/// a worker that fails or hangs only slows its own tasks. When the probe sees the worker come
/// back after failing, every watch is started afresh: a watch request stuck on a hung server
/// would otherwise wait out its whole read timeout.
pub async fn run(cluster: String, client: kube::Client, tx: Sender<Update>, options: WatchOptions) {
    loop {
        let watches = watches(
            cluster.clone(),
            client.clone(),
            tx.clone(),
            Arc::default(),
            options.restarts.clone(),
        );
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
                if let Some(c) = &options.restarts {
                    c.inc();
                }
                tracing::info!(cluster = %cluster, "worker answers again; restarting its watches");
            }
        }
    }
}
