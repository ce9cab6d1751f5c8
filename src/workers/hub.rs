//! The one writer of the live inventory: every worker's watch events arrive here, are applied
//! to that worker's [`ClusterState`], and changed clusters are published as a new snapshot,
//! at most once per debounce interval. Readers never wait for it.

use super::live::ClusterState;
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
    /// The worker answered (a probe, a list, an event): it is not stale.
    Alive(String),
    /// A worker to keep an inventory for (or its new labels).
    Registered(String, BTreeMap<String, String>),
    /// The worker is gone from the configuration.
    Removed(String),
}

/// Objects of one kind collected during a relist, applied all at once when it completes, so
/// a relist never shows a half-empty cluster.
#[derive(Default)]
struct Relists {
    nodes: Option<Vec<Node>>,
    topologies: Option<Vec<DynamicObject>>,
}

struct Worker {
    state: ClusterState,
    relists: Relists,
    last_seen: SystemTime,
}

pub struct Hub {
    store: Arc<InventoryStore>,
    table: ResourceTable,
    workers: BTreeMap<String, Worker>,
    published: BTreeMap<String, Arc<Cluster>>,
    dirty: BTreeSet<String>,
    /// No sign of life for this long makes a worker unschedulable.
    pub stale_after: Duration,
    /// Problems seen while building the inventory (a NodeResourceTopology that does not
    /// parse, ...), by cluster, for status and logs.
    pub problems: BTreeMap<String, Vec<String>>,
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
                relists: Relists::default(),
                last_seen: now,
            });
        w.state.labels = labels;
        self.dirty.insert(name.to_string());
    }

    /// Applies one update; pure apart from the clock it is given.
    pub fn apply(&mut self, update: Update, now: SystemTime) {
        let cluster = match &update {
            Update::Node(c, _) | Update::Pod(c, _) | Update::Topology(c, _) | Update::Alive(c) => {
                c.clone()
            }
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
        // A watcher announces each relist attempt (`Init`) before it reaches the server, so
        // only what came from the server proves the worker alive: a relist failing over and
        // over must let the worker go stale.
        let from_server = match &update {
            Update::Node(_, e) => !matches!(**e, Event::Init),
            Update::Pod(_, e) => !matches!(**e, Event::Init),
            Update::Topology(_, e) => !matches!(**e, Event::Init),
            _ => true,
        };
        if from_server {
            w.last_seen = now;
        }
        let changed = match update {
            Update::Alive(_) | Update::Removed(_) | Update::Registered(..) => false,
            Update::Node(_, ev) => match *ev {
                Event::Apply(n) => {
                    w.state.apply_node(&n);
                    true
                }
                Event::Delete(n) => {
                    w.state
                        .delete_node(n.metadata.name.as_deref().unwrap_or_default());
                    true
                }
                Event::Init => {
                    w.relists.nodes = Some(Vec::new());
                    false
                }
                Event::InitApply(n) => {
                    w.relists.nodes.get_or_insert_with(Vec::new).push(n);
                    false
                }
                Event::InitDone => {
                    w.state.clear_nodes();
                    for n in w.relists.nodes.take().unwrap_or_default() {
                        w.state.apply_node(&n);
                    }
                    true
                }
            },
            Update::Pod(_, ev) => match *ev {
                Event::Apply(p) => {
                    w.state.apply_pod(&p);
                    true
                }
                Event::Delete(p) => {
                    w.state
                        .delete_pod(p.metadata.uid.as_deref().unwrap_or_default());
                    true
                }
                // Pods are kept compact even while a relist is collected.
                Event::Init => {
                    w.state.begin_pod_relist();
                    false
                }
                Event::InitApply(p) => {
                    w.state.relist_pod(&p);
                    false
                }
                Event::InitDone => {
                    w.state.end_pod_relist();
                    true
                }
            },
            Update::Topology(_, ev) => match *ev {
                Event::Apply(o) => {
                    if let Some(n) = topology_name(&o) {
                        w.state.apply_topology(&n, &o.data, table);
                    }
                    true
                }
                Event::Delete(o) => {
                    if let Some(n) = topology_name(&o) {
                        w.state.delete_topology(&n);
                    }
                    true
                }
                Event::Init => {
                    w.relists.topologies = Some(Vec::new());
                    false
                }
                Event::InitApply(o) => {
                    w.relists.topologies.get_or_insert_with(Vec::new).push(o);
                    false
                }
                Event::InitDone => {
                    w.state.clear_topologies();
                    for o in w.relists.topologies.take().unwrap_or_default() {
                        if let Some(n) = topology_name(&o) {
                            w.state.apply_topology(&n, &o.data, table);
                        }
                    }
                    true
                }
            },
        };
        if changed {
            self.dirty.insert(cluster);
        }
    }

    /// Whether `cluster` has been silent for longer than `stale_after`.
    pub fn is_stale(&self, cluster: &str, now: SystemTime) -> bool {
        self.workers
            .get(cluster)
            .is_some_and(|w| now.duration_since(w.last_seen).unwrap_or_default() > self.stale_after)
    }

    /// Publishes a new snapshot if anything changed (including staleness).
    pub fn publish(&mut self, now: SystemTime) -> bool {
        let flipped: Vec<String> = self
            .workers
            .keys()
            .filter(|name| {
                let was = self
                    .published
                    .get(*name)
                    .is_some_and(|c| c.unavailable.is_some());
                self.is_stale(name, now) != was
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
            if self.is_stale(&name, now) {
                cluster.unavailable = Some(format!(
                    "worker cluster {name} is stale: no successful watch or resync for over {}s",
                    self.stale_after.as_secs()
                ));
            }
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

    #[test]
    fn relist_attempts_that_never_reach_the_server_let_a_worker_go_stale() {
        let store = Arc::new(InventoryStore::default());
        let mut hub = Hub::new(store.clone(), Duration::from_secs(10));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        hub.apply(Update::Registered("w".into(), BTreeMap::new()), t0);
        for s in 1..30 {
            let at = t0 + Duration::from_secs(s);
            hub.apply(Update::Pod("w".into(), Box::new(Event::Init)), at);
        }
        let late = t0 + Duration::from_secs(30);
        assert!(hub.is_stale("w", late));
        hub.publish(late);
        let why = store.snapshot().cluster("w").unwrap().unavailable.clone();
        assert!(why.unwrap().contains("stale"));
        // A completed relist is contact.
        hub.apply(Update::Pod("w".into(), Box::new(Event::InitDone)), late);
        assert!(!hub.is_stale("w", late + Duration::from_secs(1)));
        hub.apply(Update::Removed("w".into()), late);
        hub.publish(late);
        assert!(store.snapshot().cluster("w").is_none());
    }
}
