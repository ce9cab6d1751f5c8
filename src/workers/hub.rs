//! The one writer of the live inventory: every worker's watch events arrive here, are applied
//! to that worker's [`ClusterState`], and changed clusters are published as a new snapshot,
//! at most once per debounce interval. Readers never wait for it.
//!
//! A relist (`Init`, `InitApply`..., `InitDone`) replaces a kind's objects at its end, so a
//! relist never shows a half-empty cluster; each object is compacted as it arrives (a Node to
//! its labels, taints and allocatable, a NodeResourceTopology to its parsed zones), so a
//! hundred workers relisting at once never hold their whole Node objects.

use super::live::ClusterState;
use super::watch::Kind;
use crate::inventory::{Cluster, Inventory, InventoryStore, ResourceTable};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a worker's tasks report.
#[derive(Debug)]
pub enum Update {
    Node(String, Box<Event<Node>>),
    Pod(String, Box<Event<Pod>>),
    Topology(String, Box<Event<DynamicObject>>),
    /// A watch proved its kind current without changing anything (a bookmark, or a clean end
    /// at its timeout).
    Fresh(String, Kind),
    /// A list or watch failed, and why: shown once the worker goes stale.
    Failed(String, Kind, String),
    /// The NodeResourceTopology CRD is not served: no NUMA data, and no watch to wait for.
    TopologyAbsent(String),
    /// A worker to keep an inventory for (or its new labels).
    Registered(String, BTreeMap<String, String>),
    /// The worker is gone from the configuration.
    Removed(String),
}

/// Whether a watch event shows its kind current (see [`Hub::apply`]).
fn proves<K>(e: &Event<K>) -> bool {
    matches!(e, Event::InitDone | Event::Apply(_) | Event::Delete(_))
}

struct Worker {
    state: ClusterState,
    /// When each watch ([`Kind::index`]) last proved its kind current: an event, a bookmark,
    /// a completed relist. A probe does not count: it shows the worker reachable, not that
    /// its inventory is kept up to date.
    fresh_at: [SystemTime; 3],
    /// Each watch's last failure, until it succeeds again.
    errors: [Option<String>; 3],
    /// NodeResourceTopology objects have been listed: their watch counts toward freshness.
    topologies_served: bool,
    /// Each kind's first list has completed (NodeResourceTopology also when its CRD is not
    /// served). Until all have, the worker's inventory is not what the worker holds: a
    /// replica that just started would judge an empty cluster, or nodes without their NUMA
    /// zones.
    loaded: [bool; 3],
}

impl Worker {
    fn tracked(&self) -> impl Iterator<Item = Kind> + '_ {
        Kind::ALL
            .into_iter()
            .filter(|k| *k != Kind::Topologies || self.topologies_served)
    }

    fn fresh(&mut self, kind: Kind, now: SystemTime) {
        self.fresh_at[kind.index()] = now;
        self.errors[kind.index()] = None;
        if kind == Kind::Topologies {
            self.topologies_served = true;
        }
    }

    /// Applies a Node watch event; returns whether the worker's inventory changed (a relist
    /// changes it once, when it completes).
    fn on_node(&mut self, event: Event<Node>) -> bool {
        match event {
            Event::Apply(n) => self.state.apply_node(&n),
            Event::Delete(n) => self
                .state
                .delete_node(n.metadata.name.as_deref().unwrap_or_default()),
            Event::Init => {
                self.state.begin_node_relist();
                return false;
            }
            Event::InitApply(n) => {
                self.state.relist_node(&n);
                return false;
            }
            Event::InitDone => {
                self.state.end_node_relist();
                self.loaded[Kind::Nodes.index()] = true;
            }
        }
        true
    }

    /// Applies a Pod watch event, as [`Worker::on_node`] does a Node's.
    fn on_pod(&mut self, event: Event<Pod>) -> bool {
        match event {
            Event::Apply(p) => self.state.apply_pod(&p),
            Event::Delete(p) => self
                .state
                .delete_pod(p.metadata.uid.as_deref().unwrap_or_default()),
            Event::Init => {
                self.state.begin_pod_relist();
                return false;
            }
            Event::InitApply(p) => {
                self.state.relist_pod(&p);
                return false;
            }
            Event::InitDone => {
                self.state.end_pod_relist();
                self.loaded[Kind::Pods.index()] = true;
            }
        }
        true
    }

    /// Applies a NodeResourceTopology watch event, as [`Worker::on_node`] does a Node's;
    /// objects whose node cannot be told are left out.
    fn on_topology(&mut self, event: Event<DynamicObject>, table: &mut ResourceTable) -> bool {
        match event {
            Event::Apply(o) => {
                if let Some(n) = topology_name(&o) {
                    self.state.apply_topology(&n, &o.data, table);
                }
            }
            Event::Delete(o) => {
                if let Some(n) = topology_name(&o) {
                    self.state.delete_topology(&n);
                }
            }
            Event::Init => {
                self.state.begin_topology_relist();
                return false;
            }
            Event::InitApply(o) => {
                if let Some(n) = topology_name(&o) {
                    self.state.relist_topology(&n, &o.data, table);
                }
                return false;
            }
            Event::InitDone => {
                self.state.end_topology_relist();
                self.loaded[Kind::Topologies.index()] = true;
            }
        }
        true
    }
}

pub struct Hub {
    store: Arc<InventoryStore>,
    table: ResourceTable,
    workers: BTreeMap<String, Worker>,
    published: BTreeMap<String, Arc<Cluster>>,
    dirty: BTreeSet<String>,
    /// A watch without an event, bookmark or relist for this long makes its worker
    /// unschedulable.
    pub(crate) stale_after: Duration,
    /// Problems seen while building the inventory (a NodeResourceTopology that does not
    /// parse, ...), by cluster, for status and logs.
    pub(crate) problems: BTreeMap<String, Vec<String>>,
}

fn topology_name(o: &DynamicObject) -> Option<String> {
    o.metadata.name.clone()
}

impl Hub {
    pub fn new(store: Arc<InventoryStore>, stale_after: Duration) -> Self {
        Self {
            store,
            table: ResourceTable::default(),
            workers: BTreeMap::new(),
            published: BTreeMap::new(),
            dirty: BTreeSet::new(),
            stale_after,
            problems: BTreeMap::new(),
        }
    }

    /// Registers a worker (or updates its labels).
    pub fn add_worker(&mut self, name: &str, labels: BTreeMap<String, String>, now: SystemTime) {
        let w = self
            .workers
            .entry(name.to_string())
            .or_insert_with(|| Worker {
                state: ClusterState::new(name, BTreeMap::new()),
                fresh_at: [now; 3],
                errors: Default::default(),
                topologies_served: false,
                loaded: [false; 3],
            });
        w.state.labels = labels;
        self.dirty.insert(name.to_string());
    }

    /// Applies one update; pure apart from the clock it is given.
    pub fn apply(&mut self, update: Update, now: SystemTime) {
        let cluster = match &update {
            Update::Node(c, _)
            | Update::Pod(c, _)
            | Update::Topology(c, _)
            | Update::Fresh(c, _)
            | Update::Failed(c, ..)
            | Update::TopologyAbsent(c) => c.clone(),
            Update::Removed(c) => {
                self.workers.remove(c);
                self.published.remove(c);
                self.dirty.insert(c.clone());
                return;
            }
            Update::Registered(c, labels) => {
                let labels = labels.clone();
                let c = c.clone();
                self.add_worker(&c, labels, now);
                return;
            }
        };
        let table = &mut self.table;
        let Some(w) = self.workers.get_mut(&cluster) else {
            return;
        };
        // Only a completed relist, an event or a bookmark shows a kind current: a relist
        // under way (or failing page after page) does not.
        match &update {
            Update::Node(_, e) if proves(e.as_ref()) => w.fresh(Kind::Nodes, now),
            Update::Pod(_, e) if proves(e.as_ref()) => w.fresh(Kind::Pods, now),
            Update::Topology(_, e) if proves(e.as_ref()) => w.fresh(Kind::Topologies, now),
            Update::Fresh(_, kind) => w.fresh(*kind, now),
            Update::Failed(_, kind, why) => w.errors[kind.index()] = Some(why.clone()),
            _ => {}
        }
        let changed = match update {
            Update::Fresh(..)
            | Update::Failed(..)
            | Update::Removed(_)
            | Update::Registered(..) => false,
            Update::TopologyAbsent(_) => {
                w.loaded[Kind::Topologies.index()] = true;
                w.topologies_served = false;
                w.errors[Kind::Topologies.index()] = None;
                w.state.forget_topologies();
                true
            }
            Update::Node(_, ev) => w.on_node(*ev),
            Update::Pod(_, ev) => w.on_pod(*ev),
            Update::Topology(_, ev) => w.on_topology(*ev, table),
        };
        if changed {
            self.dirty.insert(cluster);
        }
    }

    /// Why `cluster` is stale at `now` (a watch without an event, bookmark or relist for
    /// longer than `stale_after`, with its last error), if it is.
    pub(crate) fn staleness(&self, cluster: &str, now: SystemTime) -> Option<String> {
        let w = self.workers.get(cluster)?;
        let mut silent = Vec::new();
        for kind in w.tracked() {
            let age = now
                .duration_since(w.fresh_at[kind.index()])
                .unwrap_or_default();
            if age > self.stale_after {
                let mut what = format!("the {} watch", kind.as_str());
                if let Some(e) = &w.errors[kind.index()] {
                    what += &format!(" (last error: {e})");
                }
                silent.push(what);
            }
        }
        (!silent.is_empty()).then(|| {
            format!(
                "worker cluster {cluster} is stale: no event, bookmark or successful relist for over {}s from {}",
                self.stale_after.as_secs(),
                silent.join(" and ")
            )
        })
    }

    /// Whether `cluster` is stale at `now`.
    #[cfg(test)]
    pub(crate) fn is_stale(&self, cluster: &str, now: SystemTime) -> bool {
        self.staleness(cluster, now).is_some()
    }

    /// Why nothing may be placed in `cluster` at `now`: [`Self::staleness`], else a kind whose
    /// first list has not completed (with its last error).
    pub fn unavailability(&self, cluster: &str, now: SystemTime) -> Option<String> {
        if let Some(stale) = self.staleness(cluster, now) {
            return Some(stale);
        }
        let w = self.workers.get(cluster)?;
        let pending: Vec<String> = Kind::ALL
            .into_iter()
            .filter(|k| !w.loaded[k.index()])
            .map(|k| match &w.errors[k.index()] {
                Some(e) => format!("{} (last error: {e})", k.as_str()),
                None => k.as_str().to_string(),
            })
            .collect();
        if pending.is_empty() {
            return None;
        }
        Some(format!(
            "the inventory of worker cluster {cluster} is not loaded yet: the first {} list has not completed",
            pending.join(" and ")
        ))
    }

    /// Publishes a new snapshot if anything changed (including staleness and its reason).
    pub fn publish(&mut self, now: SystemTime) -> bool {
        let flipped: Vec<String> = self
            .workers
            .keys()
            .filter(|name| {
                let was = self
                    .published
                    .get(*name)
                    .and_then(|c| c.unavailable.clone());
                self.unavailability(name, now) != was
            })
            .cloned()
            .collect();
        self.dirty.extend(flipped);
        if self.dirty.is_empty() {
            return false;
        }
        for name in std::mem::take(&mut self.dirty) {
            let Some(w) = self.workers.get(&name) else {
                continue;
            };
            let (mut cluster, problems) = w.state.to_cluster(&mut self.table);
            cluster.unavailable = self.unavailability(&name, now);
            cluster.summarize(self.table.len());
            self.problems.insert(
                name.clone(),
                problems.iter().map(ToString::to_string).collect(),
            );
            self.published.insert(name, Arc::new(cluster));
        }
        let inventory = Inventory::from_shared(
            self.table.clone(),
            self.published.values().cloned().collect(),
        );
        self.store.replace(inventory);
        true
    }
}

/// Runs the hub until every sender is gone: applies updates as they come and publishes at
/// most every `debounce` (and at least every `debounce` while anything is pending or a
/// worker may have gone stale).
pub async fn run(mut hub: Hub, mut rx: tokio::sync::mpsc::Receiver<Update>, debounce: Duration) {
    let mut ticker = tokio::time::interval(debounce);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            u = rx.recv() => match u {
                Some(u) => hub.apply(u, SystemTime::now()),
                None => {
                    hub.publish(SystemTime::now());
                    return;
                }
            },
            _ = ticker.tick() => {
                hub.publish(SystemTime::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_done() -> Box<Event<Pod>> {
        Box::new(Event::InitDone)
    }

    /// A replica that has just connected to a worker must not judge it before its nodes,
    /// pods and NUMA zones are listed: an empty cluster would refuse every pod as if the
    /// worker had no CPU at all, and nodes without their zones would take pods their
    /// Topology Manager refuses.
    #[test]
    fn a_worker_is_unavailable_until_its_first_lists_complete() {
        let store = Arc::new(InventoryStore::default());
        let mut hub = Hub::new(store.clone(), Duration::from_secs(120));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let unavailable = |store: &InventoryStore| {
            store
                .snapshot()
                .cluster("w")
                .expect("the worker is published")
                .unavailable
                .clone()
        };
        hub.apply(Update::Registered("w".into(), BTreeMap::new()), t0);
        hub.publish(t0);
        let why = unavailable(&store).expect("unavailable before anything is listed");
        assert_eq!(
            why,
            "the inventory of worker cluster w is not loaded yet: the first node and pod and NodeResourceTopology list has not completed"
        );
        hub.apply(Update::Node("w".into(), Box::new(Event::Init)), t0);
        hub.apply(Update::Node("w".into(), Box::new(Event::InitDone)), t0);
        hub.apply(
            Update::Failed("w".into(), Kind::Pods, "list: pods is forbidden".into()),
            t0,
        );
        hub.publish(t0);
        let why = unavailable(&store).expect("pods and zones are not listed yet");
        assert!(
            why.contains("pod (last error: list: pods is forbidden) and NodeResourceTopology"),
            "{why}"
        );
        hub.apply(Update::Pod("w".into(), pod_done()), t0);
        hub.apply(Update::Topology("w".into(), Box::new(Event::InitDone)), t0);
        hub.publish(t0);
        assert_eq!(unavailable(&store), None);
    }

    #[test]
    fn only_the_watches_keep_a_worker_fresh_each_kind_on_its_own() {
        let store = Arc::new(InventoryStore::default());
        let mut hub = Hub::new(store.clone(), Duration::from_secs(10));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        hub.apply(Update::Registered("w".into(), BTreeMap::new()), t0);
        hub.apply(Update::Node("w".into(), Box::new(Event::InitDone)), t0);
        hub.apply(Update::Pod("w".into(), pod_done()), t0);
        // No NodeResourceTopology CRD at first.
        hub.apply(Update::TopologyAbsent("w".into()), t0);
        // The node watch keeps getting bookmarks; the pod watch's relists start and fail.
        for s in 1..30 {
            hub.apply(Update::Fresh("w".into(), Kind::Nodes), at(s));
            hub.apply(Update::Pod("w".into(), Box::new(Event::Init)), at(s));
            hub.apply(
                Update::Failed("w".into(), Kind::Pods, "list: pods is forbidden".into()),
                at(s),
            );
        }
        assert!(!hub.is_stale("w", at(10)));
        let why = hub.staleness("w", at(30)).unwrap();
        assert!(
            why.contains("the pod watch (last error: list: pods is forbidden)"),
            "{why}"
        );
        assert!(!why.contains("node"), "{why}");
        hub.publish(at(30));
        let published = store.snapshot().cluster("w").unwrap().unavailable.clone();
        assert_eq!(published.as_deref(), Some(why.as_str()));
        // A completed relist is fresh again.
        hub.apply(Update::Pod("w".into(), pod_done()), at(30));
        assert!(!hub.is_stale("w", at(31)));
        hub.publish(at(31));
        assert!(store.snapshot().cluster("w").unwrap().unavailable.is_none());

        // NodeResourceTopology counts once listed, and stops counting when its CRD goes.
        hub.apply(
            Update::Topology("w".into(), Box::new(Event::InitDone)),
            at(31),
        );
        hub.apply(Update::Fresh("w".into(), Kind::Nodes), at(45));
        hub.apply(Update::Fresh("w".into(), Kind::Pods), at(45));
        assert!(hub
            .staleness("w", at(45))
            .unwrap()
            .contains("NodeResourceTopology"));
        hub.apply(Update::TopologyAbsent("w".into()), at(45));
        assert!(!hub.is_stale("w", at(45)));

        hub.apply(Update::Removed("w".into()), at(45));
        hub.publish(at(45));
        assert!(store.snapshot().cluster("w").is_none());
    }
}
