//! A manager and its workers for tests: the WorkerCluster controller started against a fake
//! manager API server, with short timings, and helpers that wait for views, statuses and
//! inventories with a deadline.

use super::fake_api::{self, FakeApi, SECRETS, WORKER_CLUSTERS};
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::inventory::InventoryStore;
use switchyard::metrics::Metrics;
use switchyard::workers::controller::{self, ControllerOptions};
use switchyard::workers::watch::WatchTimings;
use switchyard::workers::{Backoff, LinkOptions, WorkerView, Workers};
use tokio::sync::watch;

pub const NS: &str = "switchyard-system";
pub const WAIT: Duration = Duration::from_secs(15);

pub fn options() -> ControllerOptions {
    ControllerOptions {
        link: LinkOptions {
            backoff: Backoff {
                base: Duration::from_millis(300),
                max: Duration::from_secs(2),
            },
            probe_every: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(500),
            establish_timeout: Duration::from_secs(3),
            watch: fast_watches(),
            qps: 100.0,
            burst: 200,
        },
        file_poll: Duration::from_millis(100),
        stale_after: Duration::from_secs(3),
        resync: Duration::from_millis(100),
        hub_debounce: Duration::from_millis(50),
        status_retry: Duration::from_millis(200),
        ..ControllerOptions::new(NS)
    }
}

/// [`options`] for a worker that is meant to answer every probe: a probe timeout no loaded
/// machine reaches, so a slow answer never becomes a lost connection (with a relist and a
/// status write) that the test did not ask for.
pub fn answering_options() -> ControllerOptions {
    let mut o = options();
    o.link.probe_timeout = WAIT;
    o
}

/// List and watch timings for fake API servers whose watches last 2 s with a bookmark every
/// 500 ms.
pub fn fast_watches() -> WatchTimings {
    WatchTimings {
        watch_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_millis(1500),
        list_timeout: Duration::from_secs(2),
        crd_recheck: Duration::from_millis(300),
        backoff: Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(1),
        },
    }
}

pub struct Abort(pub tokio::task::JoinHandle<()>);
impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub struct Fleet {
    pub manager: FakeApi,
    pub store: Arc<InventoryStore>,
    pub workers: Workers,
    pub leader: watch::Sender<bool>,
    pub leader_rx: watch::Receiver<bool>,
    pub metrics: Arc<Metrics>,
    _task: Abort,
}

impl Fleet {
    pub async fn start() -> Self {
        Self::start_with(options(), true).await
    }

    pub async fn start_with(options: ControllerOptions, leading: bool) -> Self {
        let manager = FakeApi::start().await;
        let store = Arc::new(InventoryStore::default());
        let metrics = Arc::new(Metrics::new());
        let (leader, leader_rx) = watch::channel(leading);
        let (workers, task) = controller::start(
            manager.client(),
            store.clone(),
            options,
            leader_rx.clone(),
            Some(metrics.clone()),
        );
        Fleet {
            manager,
            store,
            workers,
            leader,
            leader_rx,
            metrics,
            _task: Abort(task),
        }
    }

    pub fn secret(&self, name: &str, kubeconfig: &str) {
        self.manager
            .upsert(SECRETS, fake_api::kubeconfig_secret(NS, name, kubeconfig));
    }

    /// A WorkerCluster `name` whose kubeconfig is the Secret `<name>-kubeconfig`.
    pub fn add(&self, name: &str, kubeconfig: &str) {
        let secret = format!("{name}-kubeconfig");
        self.secret(&secret, kubeconfig);
        self.manager.upsert(
            WORKER_CLUSTERS,
            fake_api::worker_cluster(name, &secret, json!({"tier": "gold"})),
        );
    }

    pub async fn view(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&WorkerView) -> bool,
    ) -> WorkerView {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = self.workers.get(name).filter(|v| cond(v)) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {name}: {what}; last view: {:?}",
                self.workers.get(name)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn status(&self, name: &str) -> Value {
        self.manager
            .get(WORKER_CLUSTERS, "", name)
            .map(|o| o["status"].clone())
            .unwrap_or(Value::Null)
    }

    pub async fn wait_status(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.status(name);
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the status of {name}: {what}; last: {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub fn active(status: &Value) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Active"))
        .cloned()
        .unwrap_or(Value::Null);
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

pub fn reason_is(reason: &'static str) -> impl Fn(&Value) -> bool {
    move |s| active(s).1 == reason
}

pub async fn node_names(client: kube::Client) -> Vec<String> {
    kube::Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

pub async fn wait_inventory(
    store: &InventoryStore,
    what: &str,
    cond: impl Fn(&switchyard::inventory::Inventory) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !cond(&store.snapshot()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the inventory: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
