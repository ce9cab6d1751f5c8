//! Prometheus/OpenMetrics metrics served on the probe port's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// The route, never the raw URL, so a scanner cannot blow up the label space.
    pub(crate) path: &'static str,
    /// `allowed`, `patched`, `denied`, `bad_request`, `error` or the HTTP status class.
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ActionLabels {
    /// `dispatch`, `create_copy`, `unsuspend`, `requeue`, `write_status`, `delete_copy`, ...
    pub(crate) action: &'static str,
    /// `ok`, `conflict` (someone else changed the Job first), `refused` (the API server said
    /// no: the Job waits or is requeued) or `error` (unreachable, retried).
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabels {
    pub(crate) queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueResourceLabels {
    pub(crate) queue: String,
    /// A resource name (`cpu`, `memory`, `nvidia.com/gpu`, ...).
    pub(crate) resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueReasonLabels {
    pub(crate) queue: String,
    pub(crate) reason: String,
}

/// A gauge with a fractional value (quota in cores, bytes, ...).
pub(crate) type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterLabels {
    /// The WorkerCluster's name.
    pub(crate) cluster: String,
}

/// One worker's series, handed to its connection.
#[derive(Clone, Debug)]
pub(crate) struct WorkerMetrics {
    pub(crate) watch_restarts: Counter,
    pub(crate) request_duration: Histogram,
}

pub struct Metrics {
    registry: Registry,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) request_duration: Family<RequestLabels, Histogram>,
    pub(crate) tls_reloads: Family<ResultLabels, Counter>,
    pub(crate) worker_connected: Family<ClusterLabels, Gauge>,
    pub(crate) worker_watch_restarts: Family<ClusterLabels, Counter>,
    pub(crate) worker_request_duration: Family<ClusterLabels, Histogram>,
    pub(crate) leader: Gauge,
    pub(crate) dispatch_actions: Family<ActionLabels, Counter>,
    pub(crate) dispatch_plan_duration: Histogram,
    pub(crate) queue_pending: Family<QueueLabels, Gauge>,
    pub(crate) queue_admitted: Family<QueueLabels, Gauge>,
    pub(crate) queue_running: Family<QueueLabels, Gauge>,
    pub(crate) queue_quota: Family<QueueResourceLabels, FloatGauge>,
    pub(crate) queue_quota_used: Family<QueueResourceLabels, FloatGauge>,
    pub(crate) queue_waiting: Family<QueueReasonLabels, Gauge>,
    pub(crate) dispatch_requeues: Family<QueueReasonLabels, Counter>,
    heap: Gauge,
}

/// How the binary's allocator says what is allocated now (see [`report_heap_with`]).
static HEAP_READER: std::sync::OnceLock<fn() -> usize> = std::sync::OnceLock::new();

/// Has `/metrics` report the live heap, read with `read` when scraped. The allocator is the
/// binary's choice (`main.rs`), so the binary says how to read it; a library user that does not
/// gets no heap series.
pub fn report_heap_with(read: fn() -> usize) {
    let _ = HEAP_READER.set(read);
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and result",
            requests.clone(),
        );
        let request_duration = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            // 25 µs to about 1.6 s: admission replies take microseconds, a slow Namespace
            // lookup takes milliseconds.
            Histogram::new(exponential_buckets(0.000_025, 2.0, 17))
        });
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route and result",
            request_duration.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        // Both series exist from the start, so an alert on errors has something to read.
        for result in ["success", "error"] {
            let _ = tls_reloads.get_or_create(&ResultLabels { result });
        }
        registry.register(
            "tls_reloads",
            "Serving certificate reloads: success, or error when the new pair was refused and the old one kept",
            tls_reloads.clone(),
        );
        let worker_connected = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "worker_connected",
            "1 while the worker cluster's API server answers, 0 while it is disconnected",
            worker_connected.clone(),
        );
        let worker_watch_restarts = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "worker_watch_restarts",
            "Watches of a worker cluster (nodes, pods, NodeResourceTopology) that failed and were restarted",
            worker_watch_restarts.clone(),
        );
        let worker_request_duration =
            Family::<ClusterLabels, Histogram>::new_with_constructor(|| {
                // 1 ms to about 33 s: a nearby API server answers in milliseconds, a watch's
                // headers may take as long as its list.
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            });
        registry.register(
            "worker_request_duration_seconds",
            "Latency of requests to a worker cluster's API server, until the response headers",
            worker_request_duration.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader-election Lease",
            leader.clone(),
        );
        let dispatch_actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "dispatch_actions",
            "Dispatcher decisions carried out, by action and result",
            dispatch_actions.clone(),
        );
        // 50 µs to about 1.6 s.
        let dispatch_plan_duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "dispatch_plan_duration_seconds",
            "Time to decide one dispatcher pass (not counting the API writes)",
            dispatch_plan_duration.clone(),
        );
        let queue_pending = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "queue_pending_jobs",
            "Jobs waiting for admission, per DispatchQueue",
            queue_pending.clone(),
        );
        let queue_admitted = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "queue_admitted_jobs",
            "Jobs admitted and holding quota, per DispatchQueue",
            queue_admitted.clone(),
        );
        let queue_running = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "queue_running_jobs",
            "Admitted Jobs whose pods are all Ready, per DispatchQueue",
            queue_running.clone(),
        );
        let queue_quota = Family::<QueueResourceLabels, FloatGauge>::default();
        registry.register(
            "queue_quota",
            "The quota in force per DispatchQueue and resource (its own, or the sum of its workers' allocatable), in the resource's unit (cores, bytes, devices)",
            queue_quota.clone(),
        );
        let queue_quota_used = Family::<QueueResourceLabels, FloatGauge>::default();
        registry.register(
            "queue_quota_used",
            "What the Jobs admitted by a DispatchQueue request together, per resource, in the resource's unit",
            queue_quota_used.clone(),
        );
        let queue_waiting = Family::<QueueReasonLabels, Gauge>::default();
        registry.register(
            "queue_waiting_jobs",
            "Jobs waiting for admission per DispatchQueue, by why: Quota, PodsReadyGate, Order, NoFit, Backoff, Unreachable, Inactive",
            queue_waiting.clone(),
        );
        let dispatch_requeues = Family::<QueueReasonLabels, Counter>::default();
        registry.register(
            "dispatch_requeues",
            "Jobs taken back from their worker, per DispatchQueue and reason (PodsReadyTimeout, WorkerLost, DeletedInWorker, ..., RequeuingLimitExceeded when given up)",
            dispatch_requeues.clone(),
        );
        let heap = Gauge::default();
        if HEAP_READER.get().is_some() {
            registry.register(
                "heap_allocated_bytes",
                "Bytes allocated and not yet freed (the live heap). Resident memory beyond it is \
                 code and what the allocator keeps for reuse: a leak grows this, not only that",
                heap.clone(),
            );
        }
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Self {
            registry,
            requests,
            request_duration,
            tls_reloads,
            worker_connected,
            worker_watch_restarts,
            worker_request_duration,
            leader,
            dispatch_actions,
            dispatch_plan_duration,
            queue_pending,
            queue_admitted,
            queue_running,
            queue_quota,
            queue_quota_used,
            queue_waiting,
            dispatch_requeues,
            heap,
        }
    }

    pub(crate) fn dispatch_action(&self, action: &'static str, result: &'static str) {
        self.dispatch_actions
            .get_or_create(&ActionLabels { action, result })
            .inc();
    }

    /// The series of one worker cluster (created if missing).
    pub(crate) fn worker(&self, cluster: &str) -> WorkerMetrics {
        let labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        WorkerMetrics {
            watch_restarts: self.worker_watch_restarts.get_or_create(&labels).clone(),
            request_duration: self.worker_request_duration.get_or_create(&labels).clone(),
        }
    }

    pub(crate) fn worker_connected(&self, cluster: &str, connected: bool) {
        self.worker_connected
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .set(i64::from(connected));
    }

    /// Drops a removed worker's series, so a deleted WorkerCluster leaves none behind.
    pub(crate) fn remove_worker(&self, cluster: &str) {
        let labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        self.worker_connected.remove(&labels);
        self.worker_watch_restarts.remove(&labels);
        self.worker_request_duration.remove(&labels);
    }

    pub(crate) fn observe_request(
        &self,
        path: &'static str,
        result: &'static str,
        elapsed: Duration,
    ) {
        let labels = RequestLabels { path, result };
        self.requests.get_or_create(&labels).inc();
        self.request_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn tls_reload(&self, result: &'static str) {
        self.tls_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        if let Some(read) = HEAP_READER.get() {
            self.heap.set(i64::try_from(read()).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
