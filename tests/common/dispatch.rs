//! A manager and its workers as fake API servers on loopback, and the live dispatcher between
//! them, through the real `kube::Client`: what tests/dispatch_live.rs and the dispatch load
//! benchmark drive.

use super::fake_api::{FakeApi, DISPATCH_QUEUES, JOBS, NAMESPACES, PRIORITY_CLASSES};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::dispatcher::live::{self, Inputs, LiveOptions};
use switchyard::dispatcher::DispatchConfig;
use switchyard::inventory::InventoryStore;
use switchyard::workers::registry::{WorkerView, Workers, WorkersPublisher};
use tokio::sync::watch;

pub const NS: &str = "research";

/// One worker: `nodes` nodes of `cpu` CPUs each (no NUMA data).
pub struct WorkerSpec {
    pub name: &'static str,
    pub nodes: u32,
    pub cpu: u32,
}

pub struct Fleet {
    pub manager: FakeApi,
    pub workers: BTreeMap<String, FakeApi>,
    pub publisher: WorkersPublisher,
    pub views: BTreeMap<String, WorkerView>,
    pub store: Arc<InventoryStore>,
}

/// A dispatcher started on a fleet; stopped when dropped.
pub struct Running {
    pub stop: watch::Sender<bool>,
    pub leader: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<()>,
    settled: watch::Receiver<u64>,
}

impl Running {
    /// Waits until the dispatcher has settled twice more (every input taken, nothing in
    /// flight, nothing new decided): what it does not do by then, it does not do at all
    /// until something changes. Panics after 10 s.
    pub async fn settled(&self) {
        let mut rx = self.settled.clone();
        let from = *rx.borrow_and_update();
        let settled =
            match tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|n| *n >= from + 2))
                .await
            {
                Ok(Ok(_)) => true,
                Ok(Err(_)) => panic!("the dispatcher stopped"),
                Err(_) => false,
            };
        assert!(settled, "the dispatcher never settled within 10 s");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

pub fn inventory_yaml(workers: &[WorkerSpec]) -> String {
    let mut y = String::from("clusters:\n");
    for w in workers {
        y += &format!("  - name: {}\n    nodes:\n", w.name);
        for n in 0..w.nodes {
            y += &format!(
                "      - name: {}-n{n}\n        allocatable: {{cpu: \"{}\", memory: 256Gi, pods: \"110\"}}\n",
                w.name, w.cpu
            );
        }
    }
    y
}

impl Fleet {
    pub async fn start(workers: &[WorkerSpec], queue: Value) -> Self {
        switchyard::install_crypto_provider();
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let manager = FakeApi::start().await;
        manager.check_rbac(switchyard::rbac::Role::Manager);
        manager.upsert(NAMESPACES, namespace(NS));
        manager.upsert(
            PRIORITY_CLASSES,
            json!({"metadata": {"name": "high"}, "value": 1000, "globalDefault": false}),
        );
        manager.upsert(DISPATCH_QUEUES, queue);
        let inventory =
            switchyard::inventory::parse_yaml(&inventory_yaml(workers)).expect("inventory");
        let store = Arc::new(InventoryStore::new(inventory));
        let (publisher, _) = Workers::channel();
        let mut fleet = Fleet {
            manager,
            workers: BTreeMap::new(),
            publisher,
            views: BTreeMap::new(),
            store,
        };
        for w in workers {
            let api = FakeApi::start().await;
            api.check_rbac(switchyard::rbac::Role::WorkerSide);
            api.upsert(NAMESPACES, namespace(NS));
            let mut view = WorkerView::new(w.name);
            view.client = Some(api.client());
            view.client_generation = 1;
            view.connected = true;
            view.active = true;
            view.reason = "Connected";
            view.message = "connected".into();
            fleet.views.insert(w.name.to_string(), view);
            fleet.workers.insert(w.name.to_string(), api);
        }
        fleet.publish();
        fleet
    }

    pub fn publish(&self) {
        self.publisher.publish(self.views.clone());
        self.publisher.set_synced();
    }

    /// A worker stops answering: disconnected since now (as the controller would say).
    pub fn disconnect(&mut self, name: &str) {
        let v = self.views.get_mut(name).unwrap();
        v.connected = false;
        v.active = false;
        v.reason = "ClientConnectionFailed";
        v.message = "dial tcp: connection refused".into();
        v.disconnected_since = Some(std::time::SystemTime::now());
        self.publish();
    }

    pub fn reconnect(&mut self, name: &str) {
        let v = self.views.get_mut(name).unwrap();
        v.connected = true;
        v.active = true;
        v.reason = "Connected";
        v.message = "connected".into();
        v.disconnected_since = None;
        self.publish();
    }

    pub fn options() -> LiveOptions {
        LiveOptions {
            config: DispatchConfig {
                create_retry_after: Duration::from_millis(500),
                wait_rewrite_after: Duration::from_millis(500),
                ..Default::default()
            },
            debounce: Duration::from_millis(20),
            tick: Duration::from_millis(200),
            queue_status_every: Duration::from_millis(200),
            instance: "test".into(),
            write_timeout: Duration::from_secs(1),
            ..Default::default()
        }
    }

    pub fn dispatcher(&self, leading: bool) -> Running {
        self.dispatcher_with(leading, Self::options())
    }

    pub fn dispatcher_with(&self, leading: bool, options: LiveOptions) -> Running {
        self.dispatcher_with_metrics(leading, options, None)
    }

    pub fn dispatcher_with_metrics(
        &self,
        leading: bool,
        options: LiveOptions,
        metrics: Option<Arc<switchyard::metrics::Metrics>>,
    ) -> Running {
        let (stop, stop_rx) = watch::channel(false);
        let (leader, leader_rx) = watch::channel(leading);
        let handle = live::start(
            Inputs {
                client: self.manager.client(),
                workers: self.publisher.subscribe(),
                leader: leader_rx,
                inventory: self.store.clone(),
                metrics,
                writes: Default::default(),
            },
            options,
            stop_rx,
        );
        Running {
            stop,
            leader,
            task: handle.task,
            settled: handle.settled,
        }
    }

    pub fn submit(&self, job: Value) -> Value {
        self.manager.upsert(JOBS, job)
    }

    pub fn job(&self, name: &str) -> Value {
        self.manager.get(JOBS, NS, name).unwrap_or(Value::Null)
    }

    pub fn copies(&self, name: &str) -> Vec<(String, Value)> {
        self.workers
            .iter()
            .filter_map(|(w, api)| api.get(JOBS, NS, name).map(|c| (w.clone(), c)))
            .collect()
    }

    /// Sets a worker copy's status, as the worker's Job controller would.
    pub fn copy_status(&self, worker: &str, name: &str, status: Value) {
        let api = &self.workers[worker];
        let mut copy = api.get(JOBS, NS, name).expect("copy exists");
        copy["status"] = status;
        api.upsert(JOBS, copy);
    }

    /// Every request the fake servers saw that the chart's RBAC would refuse.
    pub fn uncovered(&self) -> Vec<String> {
        let mut out = self.manager.uncovered();
        for (w, api) in &self.workers {
            out.extend(api.uncovered().into_iter().map(|r| format!("{w}: {r}")));
        }
        out
    }
}

pub fn namespace(name: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
}

pub fn queue(name: &str, clusters: &[&str], extra: Value) -> Value {
    let mut spec = json!({"clusters": clusters});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "switchyard.dev/v1alpha1", "kind": "DispatchQueue",
           "metadata": {"name": name, "generation": 1}, "spec": spec})
}

/// A Job as the manager's API server stores it after the mutating webhook: defaulted by the
/// API server (selector, template labels, restartPolicy, ...), suspended, managed by the
/// dispatcher, in queue `queue`.
pub fn job(name: &str, queue: &str, parallelism: u32, cpu: u32) -> Value {
    let uid = format!("9331e4ae-a2b6-4846-9ec5-{:012x}", fxhash(name));
    json!({
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "generation": 1,
            "labels": {"switchyard.dev/queue-name": queue}
        },
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 6,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            "manualSelector": false,
            "template": {
                "metadata": {"labels": {
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid,
                    "job-name": name
                }},
                "spec": {
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", "sleep 60"],
                        "resources": {"requests": {"cpu": cpu.to_string(), "memory": "1Gi"}},
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "imagePullPolicy": "Always"
                    }],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst",
                    "securityContext": {},
                    "schedulerName": "default-scheduler"
                }
            },
            "completionMode": "NonIndexed",
            "suspend": true,
            "podReplacementPolicy": "TerminatingOrFailed",
            "managedBy": "switchyard.dev/dispatcher"
        },
        "status": {}
    })
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3) & 0xffff_ffff_ffff
    })
}

pub fn annotation<'a>(job: &'a Value, name: &str) -> Option<&'a str> {
    job["metadata"]["annotations"][name].as_str()
}

pub fn condition<'a>(job: &'a Value, type_: &str) -> Option<&'a Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Waits (up to `secs`) until `f` holds, else panics with `what` and the last value `show`s.
pub async fn eventually<F: FnMut() -> bool>(secs: u64, what: &str, mut f: F) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out after {secs}s waiting for: {what}");
}

/// Now, as an RFC 3339 timestamp (whole seconds), for status times a controller would write.
pub fn now_rfc3339() -> String {
    switchyard::dispatcher::rfc3339(std::time::SystemTime::now())
}
