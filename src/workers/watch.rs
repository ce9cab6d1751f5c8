//! The watches of one worker: Nodes, the Pods that hold node resources, and
//! NodeResourceTopology objects where that CRD exists, forwarded to the [`hub`](super::hub).
//!
//! Each kind is listed (in pages) and then watched from the list's resourceVersion with
//! bookmarks requested. The watches are what keep the inventory fresh: an event, a bookmark,
//! a watch the API server held open for its `timeoutSeconds` and then ended cleanly, or a
//! completed relist proves the kind current, and the hub makes the worker stale when a kind
//! has had none of these for `staleAfter`. The clean end counts because bookmarks cannot be
//! relied on: kube-apiserver (1.36) sends none on a collection where nothing changes, so
//! the node watch of a quiet worker ends every `timeoutSeconds` without a single line. A
//! watch that is accepted and then says nothing is dropped after `idle_timeout` and started
//! again from its resourceVersion.
//!
//! This is a small list-then-watch loop rather than kube-runtime's watcher because the watcher
//! keeps bookmarks to itself, and without them a quiet worker cannot be told from a stuck one.

use super::connection::Backoff;
use super::hub::Update;
use super::kubeconfig::probe;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// topology.node.k8s.io/v1alpha2 NodeResourceTopology, as node-feature-discovery publishes it.
pub(crate) fn nrt_resource() -> ApiResource {
    ApiResource {
        group: "topology.node.k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: "topology.node.k8s.io/v1alpha2".into(),
        kind: "NodeResourceTopology".into(),
        plural: "noderesourcetopologies".into(),
    }
}

/// One of a worker's watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nodes,
    Pods,
    Topologies,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Nodes, Kind::Pods, Kind::Topologies];

    pub(crate) fn index(self) -> usize {
        match self {
            Kind::Nodes => 0,
            Kind::Pods => 1,
            Kind::Topologies => 2,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Nodes => "node",
            Kind::Pods => "pod",
            Kind::Topologies => "NodeResourceTopology",
        }
    }
}

/// Timings of every list and watch.
#[derive(Debug, Clone)]
pub struct WatchTimings {
    /// `timeoutSeconds` of each watch: the API server ends it then, and that clean end
    /// refreshes a quiet worker this often, bookmarks or not. Keep it well under
    /// `staleAfter`.
    pub watch_timeout: Duration,
    /// A watch that delivers nothing (no event, no bookmark, no end) for this long is dropped
    /// and started again from its resourceVersion.
    pub idle_timeout: Duration,
    /// Bound on each list page and on opening a watch.
    pub list_timeout: Duration,
    /// How often the NodeResourceTopology CRD is looked for again while it is not served.
    pub crd_recheck: Duration,
    /// Delays between failed attempts of one watch.
    pub backoff: Backoff,
}

impl Default for WatchTimings {
    fn default() -> Self {
        Self {
            watch_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(75),
            list_timeout: Duration::from_secs(60),
            crd_recheck: Duration::from_secs(60),
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(30),
            },
        }
    }
}

impl WatchTimings {
    /// Watches short enough that the end of each one comes well within `stale_after`, even
    /// on a quiet worker.
    pub(crate) fn for_stale_after(stale_after: Duration) -> Self {
        let watch_timeout =
            (stale_after / 2).clamp(Duration::from_secs(1), Duration::from_secs(290));
        Self {
            watch_timeout,
            idle_timeout: watch_timeout + Duration::from_secs(15),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often the worker is probed: a probe that succeeds after failures restarts the
    /// watches (it proves reachability, not freshness).
    pub probe_every: Duration,
    pub probe_timeout: Duration,
    /// Counts every watch failure (and every restart after the worker came back).
    pub restarts: Option<Counter>,
    pub timings: WatchTimings,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            probe_every: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
            restarts: None,
            timings: WatchTimings::default(),
        }
    }
}

/// Whether a worker's node and pod lists have completed once, and their last error: what
/// a new connection waits for before it counts as established.
#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    inner: std::sync::Mutex<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    listed: [bool; 2],
    errors: [Option<String>; 2],
}

impl WatchHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn listed_once(&self, kind: Kind) {
        if kind != Kind::Topologies {
            let mut s = self.lock();
            s.listed[kind.index()] = true;
            s.errors[kind.index()] = None;
        }
    }

    fn failed(&self, kind: Kind, error: &str) {
        if kind != Kind::Topologies {
            self.lock().errors[kind.index()] = Some(error.to_string());
        }
    }

    /// Whether nodes and pods have both been listed once.
    pub(crate) fn listed(&self) -> bool {
        self.lock().listed.iter().all(|l| *l)
    }

    /// Why the lists have not completed, for the connection's message.
    pub(crate) fn why_not_listed(&self) -> String {
        let s = self.lock();
        let mut why = Vec::new();
        for (i, kind) in [Kind::Nodes, Kind::Pods].iter().enumerate() {
            if !s.listed[i] {
                match &s.errors[i] {
                    Some(e) => why.push(format!("the {} list failed: {e}", kind.as_str())),
                    None => why.push(format!("the {}s have not been listed yet", kind.as_str())),
                }
            }
        }
        why.join("; ")
    }
}

/// Why one list or watch attempt ended.
enum Ended {
    /// The resourceVersion is too old (410): list again.
    Gone,
    /// The NodeResourceTopology CRD is not served (404 on its list).
    NotServed,
    Failed(String),
}

fn api_error(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// One kind's list-then-watch loop.
struct Watch<K: Resource + Clone + DeserializeOwned + Debug + Send + 'static> {
    cluster: String,
    kind: Kind,
    api: Api<K>,
    fields: Option<String>,
    tx: Sender<Update>,
    wrap: fn(String, Event<K>) -> Update,
    health: Arc<WatchHealth>,
    restarts: Option<Counter>,
    timings: WatchTimings,
}

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// `false` once the hub is gone.
    async fn send(&self, update: Update) -> bool {
        self.tx.send(update).await.is_ok()
    }

    async fn event(&self, ev: Event<K>) -> bool {
        self.send((self.wrap)(self.cluster.clone(), ev)).await
    }

    /// Lists every page; returns the list's resourceVersion once the hub has it all.
    async fn relist(&self) -> Result<String, Option<Ended>> {
        let mut continue_token = None;
        let mut started = false;
        loop {
            let params = ListParams {
                field_selector: self.fields.clone(),
                limit: Some(500),
                continue_token: continue_token.take(),
                ..Default::default()
            };
            let page = match tokio::time::timeout(self.timings.list_timeout, self.api.list(&params))
                .await
            {
                Err(_) => {
                    return Err(Some(Ended::Failed(format!(
                        "no answer to the list within {}s",
                        self.timings.list_timeout.as_secs()
                    ))))
                }
                Ok(Err(e)) if self.kind == Kind::Topologies && api_error(&e) == Some(404) => {
                    return Err(Some(Ended::NotServed))
                }
                Ok(Err(e)) => return Err(Some(Ended::Failed(format!("list: {e}")))),
                Ok(Ok(page)) => page,
            };
            // Announced with the first page, so an attempt that never reaches the server
            // starts nothing in the hub.
            if !started {
                started = true;
                if !self.event(Event::Init).await {
                    return Err(None);
                }
            }
            for item in page.items {
                if !self.event(Event::InitApply(item)).await {
                    return Err(None);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => continue_token = Some(token),
                None => {
                    let Some(rv) = page.metadata.resource_version.filter(|v| !v.is_empty()) else {
                        return Err(Some(Ended::Failed(
                            "the list has no metadata.resourceVersion".into(),
                        )));
                    };
                    if !self.event(Event::InitDone).await {
                        return Err(None);
                    }
                    return Ok(rv);
                }
            }
        }
    }

    /// Watches from `rv` until the server ends the watch, keeping `rv` current. `Ok` when it
    /// ended cleanly (watch again from `rv`); `Err(None)` when the hub is gone. A clean end
    /// after at least half the watch's `timeoutSeconds` proves the kind current (the server
    /// would have sent any change until then); an earlier one proves nothing.
    async fn watch_from(&self, rv: &mut String, recovered: &mut bool) -> Result<(), Option<Ended>> {
        let params = WatchParams {
            field_selector: self.fields.clone(),
            timeout: Some(self.timings.watch_timeout.as_secs().max(1) as u32),
            bookmarks: true,
            ..Default::default()
        };
        let stream = match tokio::time::timeout(
            self.timings.list_timeout,
            self.api.watch(&params, rv),
        )
        .await
        {
            Err(_) => {
                return Err(Some(Ended::Failed(format!(
                    "no answer to the watch within {}s",
                    self.timings.list_timeout.as_secs()
                ))))
            }
            Ok(Err(e)) if api_error(&e) == Some(410) => return Err(Some(Ended::Gone)),
            // The CRD went away since the list.
            Ok(Err(e)) if self.kind == Kind::Topologies && api_error(&e) == Some(404) => {
                return Err(Some(Ended::NotServed))
            }
            Ok(Err(e)) => return Err(Some(Ended::Failed(format!("watch: {e}")))),
            Ok(Ok(s)) => s,
        };
        let opened = std::time::Instant::now();
        let mut stream = std::pin::pin!(stream);
        loop {
            let item = match tokio::time::timeout(self.timings.idle_timeout, stream.next()).await {
                Err(_) => {
                    return Err(Some(Ended::Failed(format!(
                        "the watch sent nothing (no event, no bookmark) for {}s",
                        self.timings.idle_timeout.as_secs()
                    ))))
                }
                Ok(None) => {
                    if opened.elapsed() >= self.timings.watch_timeout / 2
                        && !self
                            .send(Update::Fresh(self.cluster.clone(), self.kind))
                            .await
                    {
                        return Err(None);
                    }
                    return Ok(());
                }
                Ok(Some(item)) => item,
            };
            let sent = match item {
                Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                    if let Some(v) = o.resource_version() {
                        *rv = v;
                    }
                    self.event(Event::Apply(o)).await
                }
                Ok(WatchEvent::Deleted(o)) => {
                    if let Some(v) = o.resource_version() {
                        *rv = v;
                    }
                    self.event(Event::Delete(o)).await
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    *rv = b.metadata.resource_version;
                    self.send(Update::Fresh(self.cluster.clone(), self.kind))
                        .await
                }
                Ok(WatchEvent::Error(e)) if e.code == 410 => return Err(Some(Ended::Gone)),
                Ok(WatchEvent::Error(e)) => {
                    return Err(Some(Ended::Failed(format!(
                        "watch: {} ({} {})",
                        e.message, e.code, e.reason
                    ))))
                }
                Err(e) => return Err(Some(Ended::Failed(format!("watch: {e}")))),
            };
            if !sent {
                return Err(None);
            }
            *recovered = true;
        }
    }

    /// Runs until the hub goes away.
    async fn run(self) {
        let mut rv: Option<String> = None;
        let mut failures = 0u32;
        let mut not_served = false;
        loop {
            let mut recovered = false;
            let ended = match &mut rv {
                None => match self.relist().await {
                    Ok(v) => {
                        rv = Some(v);
                        recovered = true;
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                Some(v) => self.watch_from(v, &mut recovered).await,
            };
            if recovered {
                failures = 0;
                self.health.listed_once(self.kind);
                if not_served {
                    not_served = false;
                    tracing::info!(cluster = %self.cluster, "the NodeResourceTopology CRD is served now: NUMA data follows");
                }
            }
            let delay = match ended {
                Ok(()) => continue,
                Err(None) => return,
                Err(Some(Ended::Gone)) => {
                    // Routine after compaction: list again at once.
                    self.count_restart();
                    tracing::info!(cluster = %self.cluster, kind = self.kind.as_str(), "resourceVersion too old (410 Gone); listing again");
                    rv = None;
                    continue;
                }
                Err(Some(Ended::NotServed)) => {
                    // Optional: NUMA data is simply absent, which is not a failure of the worker.
                    if !not_served {
                        not_served = true;
                        tracing::info!(cluster = %self.cluster, recheck = ?self.timings.crd_recheck, "the NodeResourceTopology CRD is not served: no NUMA data until it is");
                        if !self
                            .send(Update::TopologyAbsent(self.cluster.clone()))
                            .await
                        {
                            return;
                        }
                    }
                    rv = None;
                    self.timings.crd_recheck
                }
                Err(Some(Ended::Failed(why))) => {
                    self.count_restart();
                    failures += 1;
                    let delay = self.timings.backoff.delay(failures);
                    tracing::warn!(cluster = %self.cluster, kind = self.kind.as_str(), error = %why, retry_in = ?delay, "watch failed; retrying with backoff");
                    self.health.failed(self.kind, &why);
                    if !self
                        .send(Update::Failed(self.cluster.clone(), self.kind, why))
                        .await
                    {
                        return;
                    }
                    delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.tx.closed() => return,
            }
        }
    }

    fn count_restart(&self) {
        if let Some(c) = &self.restarts {
            c.inc();
        }
    }
}

/// Runs the node, pod and NodeResourceTopology watches of one worker until the hub goes
/// away, reporting into `health` and counting failures in `restarts`.
pub(crate) async fn watches(
    cluster: String,
    client: kube::Client,
    tx: Sender<Update>,
    health: Arc<WatchHealth>,
    restarts: Option<Counter>,
    timings: WatchTimings,
) {
    let nodes = Watch {
        cluster: cluster.clone(),
        kind: Kind::Nodes,
        api: Api::<Node>::all(client.clone()),
        fields: None,
        tx: tx.clone(),
        wrap: |c, e| Update::Node(c, Box::new(e)),
        health: health.clone(),
        restarts: restarts.clone(),
        timings: timings.clone(),
    };
    let pods = Watch {
        cluster: cluster.clone(),
        kind: Kind::Pods,
        api: Api::<Pod>::all(client.clone()),
        fields: Some("status.phase!=Succeeded,status.phase!=Failed".into()),
        tx: tx.clone(),
        wrap: |c, e| Update::Pod(c, Box::new(e)),
        health: health.clone(),
        restarts: restarts.clone(),
        timings: timings.clone(),
    };
    let topologies = Watch {
        cluster,
        kind: Kind::Topologies,
        api: Api::<DynamicObject>::all_with(client, &nrt_resource()),
        fields: None,
        tx,
        wrap: |c, e| Update::Topology(c, Box::new(e)),
        health,
        restarts,
        timings,
    };
    tokio::join!(nodes.run(), pods.run(), topologies.run());
}

/// Runs every watch of one worker until the hub goes away. Never returns early on errors:
/// a worker that fails or hangs only slows its own tasks. When the probe sees the worker come
/// back after failing, every watch is started afresh: a request stuck on a hung server would
/// otherwise wait out its timeout. The probe proves reachability only; freshness comes from
/// the watches.
pub async fn run(cluster: String, client: kube::Client, tx: Sender<Update>, options: WatchOptions) {
    loop {
        let watches = watches(
            cluster.clone(),
            client.clone(),
            tx.clone(),
            Arc::default(),
            options.restarts.clone(),
            options.timings.clone(),
        );
        // Resolves when the worker answers again after at least one failed probe; never
        // resolves while it stays healthy.
        let recovered = async {
            let mut failed = false;
            loop {
                match probe(&client, options.probe_timeout).await {
                    Ok(_) if failed => return,
                    Ok(_) => {}
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
            _ = recovered => {
                if let Some(c) = &options.restarts {
                    c.inc();
                }
                tracing::info!(cluster = %cluster, "worker answers again; restarting its watches");
            }
        }
    }
}
