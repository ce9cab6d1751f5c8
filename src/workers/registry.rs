//! What the dispatcher sees of the worker clusters: one [`WorkerView`] per WorkerCluster,
//! published as a whole map whenever anything in it changes.
//!
//! The controller is the one writer ([`WorkersPublisher`]); readers hold a [`Workers`] and
//! either take a snapshot (an `Arc`, never changed under them) or wait for the next change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::watch;

/// One worker cluster as the dispatcher needs it. (`Debug` is written by hand: `kube::Client`
/// has none.)
#[derive(Clone)]
pub struct WorkerView {
    pub name: String,
    /// The WorkerCluster's `spec.labels`.
    pub labels: BTreeMap<String, String>,
    /// The WorkerCluster's `spec.schedulerName`.
    pub(crate) scheduler_name: Option<String>,
    /// The WorkerCluster's `spec.kueue.localQueueName`.
    pub kueue: Option<String>,
    /// Rate-limited; `Some` once a client was built from a safe kubeconfig, and kept (with
    /// `connected` false) when a later kubeconfig is refused or the worker stops answering.
    pub client: Option<kube::Client>,
    /// Bumps whenever `client` is replaced (the kubeconfig was rotated).
    pub client_generation: u64,
    pub connected: bool,
    /// When the worker was lost: survives retries and kubeconfig errors; `None` while
    /// connected (and before the first attempt ends).
    pub disconnected_since: Option<SystemTime>,
    /// The `Active` condition's reason: `Connected`, `Connecting`, `BadKubeConfig`,
    /// `InsecureKubeConfig`, `ClientConnectionFailed`, `Stale` or `InvalidSpec`.
    pub reason: &'static str,
    pub message: String,
    /// The `Active` condition is True: connected and the inventory is fresh, so work may be
    /// placed there.
    pub active: bool,
    /// Failed attempts since `disconnected_since` (0 while connected).
    pub attempts: u32,
    /// When the next connection attempt is due, while disconnected.
    pub next_attempt: Option<SystemTime>,
}

impl std::fmt::Debug for WorkerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerView")
            .field("name", &self.name)
            .field("labels", &self.labels)
            .field("scheduler_name", &self.scheduler_name)
            .field("kueue", &self.kueue)
            .field("client", &self.client.as_ref().map(|_| "kube::Client"))
            .field("client_generation", &self.client_generation)
            .field("connected", &self.connected)
            .field("disconnected_since", &self.disconnected_since)
            .field("reason", &self.reason)
            .field("message", &self.message)
            .field("active", &self.active)
            .field("attempts", &self.attempts)
            .field("next_attempt", &self.next_attempt)
            .finish()
    }
}

impl WorkerView {
    /// A worker that has not been tried yet.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            labels: BTreeMap::new(),
            scheduler_name: None,
            kueue: None,
            client: None,
            client_generation: 0,
            connected: false,
            disconnected_since: None,
            reason: "Connecting",
            message: "first connection attempt in progress".into(),
            active: false,
            attempts: 0,
            next_attempt: None,
        }
    }

    /// Whether two views differ in anything a reader acts on (clients compare by generation).
    pub(crate) fn same_as(&self, other: &WorkerView) -> bool {
        self.name == other.name
            && self.labels == other.labels
            && self.scheduler_name == other.scheduler_name
            && self.kueue == other.kueue
            && self.client.is_some() == other.client.is_some()
            && self.client_generation == other.client_generation
            && self.connected == other.connected
            && self.disconnected_since == other.disconnected_since
            && self.reason == other.reason
            && self.message == other.message
            && self.active == other.active
            && self.attempts == other.attempts
            && self.next_attempt == other.next_attempt
    }
}

#[derive(Clone, Default)]
struct Published {
    views: Arc<BTreeMap<String, WorkerView>>,
    /// The controller has listed every WorkerCluster once: a name missing from `views` is
    /// really gone (and its virtual node may be removed).
    synced: bool,
}

/// Every WorkerCluster's view; cheap to clone; `changed().await` wakes on any change.
#[derive(Clone)]
pub struct Workers {
    rx: watch::Receiver<Published>,
}

impl Workers {
    /// The views now, by WorkerCluster name.
    pub fn snapshot(&self) -> Arc<BTreeMap<String, WorkerView>> {
        self.rx.borrow().views.clone()
    }

    /// One worker's view now.
    pub fn get(&self, name: &str) -> Option<WorkerView> {
        self.rx.borrow().views.get(name).cloned()
    }

    /// Waits for the next change; `false` when the controller is gone (no change will come).
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// Whether every WorkerCluster has been read once since start-up.
    pub(crate) fn is_synced(&self) -> bool {
        self.rx.borrow().synced
    }

    /// A fixed set of views that never changes (tests, simulations): `changed()` returns
    /// false at once.
    #[cfg(test)]
    pub(crate) fn fixed(views: BTreeMap<String, WorkerView>) -> Self {
        let (tx, rx) = watch::channel(Published {
            views: Arc::new(views),
            synced: true,
        });
        drop(tx);
        Self { rx }
    }

    /// A publisher and its first reader, with no workers yet and not synced.
    pub fn channel() -> (WorkersPublisher, Workers) {
        let (tx, rx) = watch::channel(Published::default());
        (WorkersPublisher { tx }, Workers { rx })
    }
}

/// The writing end: the controller, or a test standing in for it.
pub struct WorkersPublisher {
    tx: watch::Sender<Published>,
}

impl WorkersPublisher {
    /// Replaces every view; readers wake only when something differs.
    pub fn publish(&self, views: BTreeMap<String, WorkerView>) {
        self.tx.send_if_modified(|p| {
            let same = p.views.len() == views.len()
                && p.views
                    .iter()
                    .zip(views.iter())
                    .all(|((ka, a), (kb, b))| ka == kb && a.same_as(b));
            if same {
                return false;
            }
            p.views = Arc::new(views);
            true
        });
    }

    /// Marks the first full read of the WorkerClusters done.
    pub fn set_synced(&self) {
        self.tx
            .send_if_modified(|p| !std::mem::replace(&mut p.synced, true));
    }

    pub fn subscribe(&self) -> Workers {
        Workers {
            rx: self.tx.subscribe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_wake_on_changes_only_and_learn_when_the_writer_is_gone() {
        let (publisher, mut workers) = Workers::channel();
        assert!(workers.snapshot().is_empty());
        assert!(!workers.is_synced());
        let mut a = WorkerView::new("a");
        publisher.publish(BTreeMap::from([("a".to_string(), a.clone())]));
        assert!(workers.changed().await);
        assert_eq!(workers.get("a").unwrap().reason, "Connecting");
        // The same views again: nobody is woken.
        publisher.publish(BTreeMap::from([("a".to_string(), a.clone())]));
        a.connected = true;
        a.reason = "Connected";
        publisher.publish(BTreeMap::from([("a".to_string(), a)]));
        assert!(workers.changed().await);
        assert!(workers.snapshot()["a"].connected);
        publisher.set_synced();
        assert!(workers.changed().await);
        assert!(workers.is_synced());
        drop(publisher);
        assert!(!workers.changed().await);

        let mut fixed = Workers::fixed(BTreeMap::from([("x".to_string(), WorkerView::new("x"))]));
        assert!(fixed.is_synced());
        assert_eq!(fixed.snapshot().len(), 1);
        assert!(!fixed.changed().await);
    }
}
