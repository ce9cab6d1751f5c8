//! The WorkerCluster controller. Every replica watches the WorkerClusters and runs one
//! connection per worker in its own task ([`Link`]), feeding the live inventory through the
//! [`hub`], and publishes each worker's [`WorkerView`] for the dispatcher. Only
//! the leader writes `status` (a merge patch on `workerclusters/{name}/status`), and only
//! when something changed.

use super::connection::{Backoff, ConnectionState, Health, Reason};
use super::hub::{self, Hub, Update};
use super::link::{Link, LinkOptions, LinkReport};
use super::registry::{WorkerView, Workers, WorkersPublisher};
use super::status;
use crate::api::{KubeConfig, WorkerCluster};
use crate::inventory::InventoryStore;
use crate::metrics::Metrics;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// Timings of the controller and of every worker's connection.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Switchyard's namespace: where `locationType: Secret` kubeconfigs are.
    pub namespace: String,
    pub link: LinkOptions,
    /// How often a `locationType: Path` kubeconfig file is re-read besides whenever its
    /// directory changes (the fallback where change notifications do not arrive).
    pub file_poll: Duration,
    /// A worker whose inventory has not been refreshed for this long is unschedulable.
    pub stale_after: Duration,
    /// How often a fresh worker's `status.summary.lastSyncTime` is rewritten.
    pub status_refresh: Duration,
    /// How often views and statuses are re-evaluated without any event (staleness).
    pub resync: Duration,
    /// The hub publishes inventory snapshots at most this often.
    pub hub_debounce: Duration,
    /// A failed status write is retried after this long.
    pub status_retry: Duration,
}

impl ControllerOptions {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            link: LinkOptions::default(),
            file_poll: Duration::from_secs(10),
            stale_after: Duration::from_secs(120),
            status_refresh: Duration::from_secs(60),
            resync: Duration::from_secs(2),
            hub_debounce: Duration::from_millis(100),
            status_retry: Duration::from_secs(5),
        }
    }
}

/// A task aborted when its handle is dropped: removing a worker from the map stops it.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Entry {
    object: WorkerCluster,
    link: Option<Task>,
    /// The kubeconfig location the link runs for.
    location: Option<KubeConfig>,
    /// Which link the reports come from: a report from a replaced link is ignored.
    epoch: u64,
    /// The (epoch, link generation) of the client last taken.
    seen_client: (u64, u64),
    client: Option<kube::Client>,
    client_generation: u64,
    health: Health,
    writing: bool,
    retry_write_at: Option<Instant>,
}

/// The controller's state; one task owns it.
struct Controller {
    client: kube::Client,
    options: ControllerOptions,
    store: Arc<InventoryStore>,
    metrics: Option<Arc<Metrics>>,
    hub: mpsc::Sender<Update>,
    reports_tx: mpsc::UnboundedSender<LinkReport>,
    publisher: WorkersPublisher,
    entries: BTreeMap<String, Entry>,
    /// Names seen during a relist of the WorkerClusters.
    relist: Option<BTreeSet<String>>,
    next_epoch: u64,
    writes: JoinSet<(String, Result<WorkerCluster, kube::Error>)>,
}

/// Starts the controller (and the inventory hub it feeds into `store`). Returns the views for
/// the dispatcher and the controller's task; aborting the task stops every connection.
pub fn start(
    client: kube::Client,
    store: Arc<InventoryStore>,
    options: ControllerOptions,
    leader: watch::Receiver<bool>,
    metrics: Option<Arc<Metrics>>,
) -> (Workers, JoinHandle<()>) {
    let (publisher, workers) = Workers::channel();
    let (hub_tx, hub_rx) = mpsc::channel(4096);
    let hub = Hub::new(store.clone(), options.stale_after);
    tokio::spawn(hub::run(hub, hub_rx, options.hub_debounce));
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let controller = Controller {
        client,
        options,
        store,
        metrics,
        hub: hub_tx,
        reports_tx,
        publisher,
        entries: BTreeMap::new(),
        relist: None,
        next_epoch: 0,
        writes: JoinSet::new(),
    };
    let task = tokio::spawn(controller.run(reports_rx, leader));
    (workers, task)
}

impl Controller {
    async fn run(
        mut self,
        mut reports: mpsc::UnboundedReceiver<LinkReport>,
        mut leader: watch::Receiver<bool>,
    ) {
        let api: Api<WorkerCluster> = Api::all(self.client.clone());
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut ticker = tokio::time::interval(self.options.resync);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leader_alive = true;
        loop {
            tokio::select! {
                item = stream.next() => match item {
                    None => return,
                    Some(Ok(ev)) => self.on_event(ev).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "cannot watch WorkerClusters; retrying with backoff"),
                },
                Some(report) = reports.recv() => self.on_report(report),
                Some(done) = self.writes.join_next(), if !self.writes.is_empty() => {
                    if let Ok((name, result)) = done {
                        self.on_written(&name, result);
                    }
                }
                changed = leader.changed(), if leader_alive => {
                    leader_alive = changed.is_ok();
                }
                _ = ticker.tick() => {}
            }
            let is_leader = leader_alive && *leader.borrow();
            self.refresh(is_leader);
        }
    }

    async fn on_event(&mut self, ev: Event<WorkerCluster>) {
        match ev {
            Event::Init => self.relist = Some(BTreeSet::new()),
            Event::InitApply(wc) => {
                if let Some(seen) = &mut self.relist {
                    seen.insert(wc.name_any());
                }
                self.upsert(wc).await;
            }
            Event::InitDone => {
                let seen = self.relist.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .entries
                    .keys()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    self.remove(&name).await;
                }
                self.publisher.set_synced();
            }
            Event::Apply(wc) => self.upsert(wc).await,
            Event::Delete(wc) => self.remove(&wc.name_any()).await,
        }
    }

    async fn upsert(&mut self, wc: WorkerCluster) {
        let name = wc.name_any();
        let labels = wc.spec.labels.clone();
        let location = wc.spec.kube_config.clone();
        let spec_error = crate::api::validate_worker_cluster(&name, &wc.spec)
            .err()
            .map(|errors| errors.join("; "));
        let (relabel, restart) = match self.entries.get_mut(&name) {
            None => {
                // Where the previous leader (or this process before a restart) left it.
                let health = status::restored_health(wc.status.as_ref(), SystemTime::now());
                if let Some(since) = (ConnectionState {
                    health: health.clone(),
                    backoff: self.options.link.backoff,
                })
                .disconnected_since()
                {
                    tracing::info!(cluster = %name, disconnected_since = %super::connection::httpdate(since), "worker cluster added; disconnected since the time its status records");
                } else {
                    tracing::info!(cluster = %name, "worker cluster added");
                }
                self.entries.insert(
                    name.clone(),
                    Entry {
                        object: wc,
                        link: None,
                        location: None,
                        epoch: 0,
                        seen_client: (0, 0),
                        client: None,
                        client_generation: 0,
                        health,
                        writing: false,
                        retry_write_at: None,
                    },
                );
                (true, true)
            }
            Some(e) => {
                let relabel = e.object.spec.labels != labels;
                // A new location, or a spec that became valid or invalid.
                let restart = e.location.as_ref() != Some(&location)
                    || spec_error.is_some() == e.link.is_some();
                // Our own status writes come back here; keep the newest object.
                e.object = wc;
                (relabel, restart)
            }
        };
        if relabel {
            let _ = self
                .hub
                .send(Update::Registered(name.clone(), labels))
                .await;
        }
        if restart {
            self.start_link(&name, location, spec_error);
        }
    }

    fn start_link(&mut self, name: &str, location: KubeConfig, spec_error: Option<String>) {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let Some(e) = self.entries.get_mut(name) else {
            return;
        };
        e.link = None;
        e.epoch = epoch;
        if let Some(message) = spec_error {
            // Nothing to connect with until the spec is fixed (which restarts the link).
            let mut state = ConnectionState {
                health: e.health.clone(),
                backoff: self.options.link.backoff,
            };
            state.failed(
                SystemTime::now(),
                Reason::InvalidSpec,
                format!("the WorkerCluster is not valid: {message}"),
            );
            e.health = state.health;
            e.location = Some(location);
            return;
        }
        let kubeconfig = super::source::spawn(
            &location,
            self.client.clone(),
            &self.options.namespace,
            self.options.file_poll,
        );
        let link = Link {
            name: name.to_string(),
            epoch,
            kubeconfig,
            hub: self.hub.clone(),
            reports: self.reports_tx.clone(),
            options: self.options.link.clone(),
            metrics: self.metrics.as_ref().map(|m| m.worker(name)),
            health: e.health.clone(),
        };
        e.link = Some(Task(tokio::spawn(link.run())));
        e.location = Some(location);
    }

    async fn remove(&mut self, name: &str) {
        if self.entries.remove(name).is_some() {
            tracing::info!(cluster = %name, "worker cluster removed");
            let _ = self.hub.send(Update::Removed(name.to_string())).await;
            if let Some(m) = &self.metrics {
                m.remove_worker(name);
            }
        }
    }

    fn on_report(&mut self, r: LinkReport) {
        let Some(e) = self.entries.get_mut(&r.name) else {
            return;
        };
        if r.epoch != e.epoch {
            return;
        }
        if r.client.is_some() && (r.epoch, r.client_generation) != e.seen_client {
            e.seen_client = (r.epoch, r.client_generation);
            e.client_generation += 1;
            e.client = r.client;
        }
        e.health = r.health;
    }

    fn on_written(&mut self, name: &str, result: Result<WorkerCluster, kube::Error>) {
        let Some(e) = self.entries.get_mut(name) else {
            return;
        };
        e.writing = false;
        match result {
            Ok(written) => {
                // The status is ours alone; the spec may be newer in what the watch brought.
                e.object.status = written.status;
                e.retry_write_at = None;
            }
            Err(err) => {
                tracing::warn!(cluster = %name, error = %err, "cannot write WorkerCluster status; retrying");
                e.retry_write_at = Some(Instant::now() + self.options.status_retry);
            }
        }
    }

    /// Publishes every view and, as the leader, writes the statuses that changed.
    fn refresh(&mut self, is_leader: bool) {
        let inventory = self.store.snapshot();
        let now = SystemTime::now();
        let mut views = BTreeMap::new();
        for (name, e) in &mut self.entries {
            let cluster = inventory.cluster(name);
            let stale = status::unavailable(name, cluster);
            let (active, reason, message) = status::active(&e.health, stale.as_deref());
            let (attempts, next_attempt) = match &e.health {
                Health::Disconnected {
                    attempts,
                    next_attempt,
                    ..
                } => (*attempts, Some(*next_attempt)),
                _ => (0, None),
            };
            let connected = matches!(e.health, Health::Connected { .. });
            if let Some(m) = &self.metrics {
                m.worker_connected(name, connected);
            }
            views.insert(
                name.clone(),
                WorkerView {
                    name: name.clone(),
                    labels: e.object.spec.labels.clone(),
                    scheduler_name: e.object.spec.scheduler_name.clone(),
                    kueue: e
                        .object
                        .spec
                        .kueue
                        .as_ref()
                        .map(|k| k.local_queue_name.clone()),
                    client: e.client.clone(),
                    client_generation: e.client_generation,
                    connected,
                    disconnected_since: ConnectionState {
                        health: e.health.clone(),
                        backoff: Backoff::default(),
                    }
                    .disconnected_since(),
                    reason,
                    message,
                    active: active == "True",
                    attempts,
                    next_attempt,
                },
            );
            if !is_leader || e.writing || e.retry_write_at.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            let current = e.object.status.as_ref();
            let desired = status::desired(
                &status::Observed {
                    name,
                    current,
                    generation: e.object.metadata.generation,
                    health: &e.health,
                    cluster,
                    table: &inventory.resources,
                },
                now,
            );
            if !status::needs_write(current, &desired, self.options.status_refresh) {
                continue;
            }
            e.writing = true;
            let api: Api<WorkerCluster> = Api::all(self.client.clone());
            let name = name.clone();
            let body = status::patch(&desired);
            self.writes.spawn(async move {
                let result = tokio::time::timeout(
                    Duration::from_secs(10),
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(kube::Error::Service(
                        "no answer from the API server within 10s".into(),
                    ))
                });
                (name, result)
            });
        }
        self.publisher.publish(views);
    }
}
