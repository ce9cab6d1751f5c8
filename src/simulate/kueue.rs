//! A simulated worker's own Kueue (a scenario cluster's `kueue:`): one ClusterQueue
//! ([`CLUSTER_QUEUE`]) with one resource group covering the quota's resources in one flavor
//! ([`FLAVOR`]), and a LocalQueue of the cluster's `localQueueName` in every namespace of the
//! scenario. It admits workloads (the dispatcher's copies, and the worker's own users'
//! `localWorkloads`) in order, highest priority first, then first come, when the quota less
//! what the admitted ones hold covers the whole request. `StrictFIFO`: a head that does not
//! fit holds back everything behind it; `BestEffortFIFO`: those behind it that fit go first.
//! A workload that could never fit (a resource the quota does not cover, or more than all of
//! it) holds back nothing, as Kueue marks it inadmissible. No cohorts, borrowing, preemption
//! or eviction.
//!
//! Pure bookkeeping: the worker resumes what it admits, and tells it what finished.

use super::scenario::KueueSpec;
use crate::dispatcher::kueue::{ClusterQueue, ResourceGroup, WorkerQueues};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The ClusterQueue behind every LocalQueue of a simulated Kueue.
pub const CLUSTER_QUEUE: &str = "cluster-queue";
/// Its one ResourceFlavor.
pub const FLAVOR: &str = "default-flavor";

/// Resource name → milli-units.
pub(crate) type Amounts = BTreeMap<String, i64>;

/// Who a Workload is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Admittee {
    /// A copy the dispatcher created, by uid.
    Copy(String),
    /// The worker's own user's workload, by its index in `localWorkloads`.
    Local(usize),
}

#[derive(Debug)]
struct Pending {
    who: Admittee,
    request: Amounts,
    priority: i32,
    arrival: u64,
}

#[derive(Debug)]
pub(crate) struct SimKueue {
    pub(crate) spec: Arc<KueueSpec>,
    /// In admission order: priority (highest first), then arrival.
    pending: Vec<Pending>,
    admitted: BTreeMap<Admittee, Amounts>,
    arrivals: u64,
}

impl SimKueue {
    pub(crate) fn new(spec: Arc<KueueSpec>) -> Self {
        Self {
            spec,
            pending: Vec::new(),
            admitted: BTreeMap::new(),
            arrivals: 0,
        }
    }

    /// A workload enters the queue (its Workload is created, pending).
    pub(crate) fn enqueue(&mut self, who: Admittee, request: Amounts, priority: i32) {
        self.arrivals += 1;
        let p = Pending {
            who,
            request,
            priority,
            arrival: self.arrivals,
        };
        let at = self
            .pending
            .partition_point(|q| (-q.priority, q.arrival) <= (-p.priority, p.arrival));
        self.pending.insert(at, p);
    }

    /// Forgets a workload (finished, or its Job deleted); whether it held quota.
    pub(crate) fn remove(&mut self, who: &Admittee) -> bool {
        self.pending.retain(|p| p.who != *who);
        self.admitted.remove(who).is_some()
    }

    /// The workloads admitted and not finished.
    pub(crate) fn admitted(&self) -> impl Iterator<Item = &Admittee> {
        self.admitted.keys()
    }

    /// Admits what the quota lets in now, in order; returns them.
    pub(crate) fn admit(&mut self) -> Vec<Admittee> {
        let mut reserved = self.reserved();
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            if fits(&self.spec.quota, &reserved, &p.request) {
                for (r, v) in &p.request {
                    *reserved.entry(r.clone()).or_default() += v;
                }
                let p = self.pending.remove(i);
                self.admitted.insert(p.who.clone(), p.request);
                out.push(p.who);
                continue;
            }
            if self.spec.strict && fits(&self.spec.quota, &Amounts::new(), &p.request) {
                break;
            }
            i += 1;
        }
        out
    }

    /// What the admitted workloads hold, per resource of the quota (0 included).
    pub(crate) fn reserved(&self) -> Amounts {
        let mut sum: Amounts = self.spec.quota.keys().map(|r| (r.clone(), 0)).collect();
        for request in self.admitted.values() {
            for (r, v) in request {
                *sum.entry(r.clone()).or_default() += v;
            }
        }
        sum
    }

    /// The Kueue objects the dispatcher reads, as it would read them now: the LocalQueue in
    /// each of `namespaces`, and the ClusterQueue with what is reserved of it.
    pub(crate) fn view(&self, namespaces: &[String]) -> WorkerQueues {
        let spec = &self.spec;
        let local_queues = namespaces
            .iter()
            .map(|ns| {
                (
                    (ns.clone(), spec.local_queue.clone()),
                    CLUSTER_QUEUE.to_string(),
                )
            })
            .collect();
        let cq = ClusterQueue {
            groups: vec![ResourceGroup {
                covered: spec.quota.keys().cloned().collect(),
                flavors: vec![(FLAVOR.to_string(), spec.quota.clone())],
            }],
            reserved: self
                .reserved()
                .into_iter()
                .map(|(r, v)| ((FLAVOR.to_string(), r), v))
                .collect(),
        };
        WorkerQueues {
            local_queues,
            cluster_queues: [(CLUSTER_QUEUE.to_string(), cq)].into(),
            workloads: BTreeMap::new(),
        }
    }
}

/// Whether `quota` less `reserved` covers every resource `request` asks for.
fn fits(quota: &Amounts, reserved: &Amounts, request: &Amounts) -> bool {
    request.iter().filter(|(_, v)| **v > 0).all(|(r, v)| {
        quota
            .get(r)
            .is_some_and(|q| q.saturating_sub(reserved.get(r).copied().unwrap_or(0)) >= *v)
    })
}

#[cfg(test)]
mod tests;
