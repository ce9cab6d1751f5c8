//! Workers that run Kueue (`WorkerCluster.spec.kueue`): what the dispatcher reads of the
//! worker's own queues, and the rule that keeps it from sending a Job the worker's Kueue would
//! only queue. Pure: the objects are read by the live executor (or made up by `simulate`).
//!
//! A copy sent to such a worker carries `kueue.x-k8s.io/queue-name: <localQueueName>` and is
//! created suspended; the worker's Kueue admits it under the worker's quota and unsuspends it.
//! The dispatcher reads, never writes, the worker's LocalQueues, ClusterQueues and Workloads.
//!
//! **Headroom.** A Job goes to a Kueue worker only when the ClusterQueue behind the LocalQueue
//! of the Job's namespace has room for the whole gang, as Kueue judges it: for each resource
//! group the gang asks resources of, one flavor of the group (tried in order) whose nominal
//! quota, less what is reserved there and what the dispatcher's copies not yet admitted there
//! will take, covers each of those resources. Borrowing within a cohort is not counted: a
//! Job that would only fit by borrowing waits for nominal room or goes elsewhere.

use crate::quantity::{display, Milli};
use serde_json::Value;
use std::collections::BTreeMap;

/// The label a Job (or JobSet) carries to enter a LocalQueue.
pub(crate) const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label Kueue puts on a Workload: the uid of the Job it is for.
pub(crate) const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";

/// What the dispatcher knows of one worker's Kueue.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkerQueues {
    /// The LocalQueues (by namespace, then name) and their ClusterQueue.
    pub(crate) local_queues: BTreeMap<(String, String), String>,
    pub(crate) cluster_queues: BTreeMap<String, ClusterQueue>,
    /// The Workloads, by the uid of the Job (the copy) they are for.
    pub(crate) workloads: BTreeMap<String, Workload>,
}

/// A ClusterQueue's quota and what is reserved of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClusterQueue {
    pub(crate) groups: Vec<ResourceGroup>,
    /// (flavor, resource) → reserved, milli-units.
    pub(crate) reserved: BTreeMap<(String, String), i64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ResourceGroup {
    pub(crate) covered: Vec<String>,
    /// In the order Kueue tries them: (flavor, resource → nominal quota, milli-units).
    pub(crate) flavors: Vec<(String, BTreeMap<String, i64>)>,
}

/// A Workload's admission, as its conditions say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Workload {
    /// `QuotaReserved` or `Admitted` True.
    pub(crate) admitted: bool,
    /// `Evicted` or `Preempted` True: its reason and message.
    pub(crate) evicted: Option<(String, String)>,
}

fn milli(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => crate::quantity::parse(s).ok().map(|m| m.0),
        Value::Number(n) => n.as_i64().map(|n| n.saturating_mul(1000)),
        _ => None,
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A LocalQueue object: its namespace, name and ClusterQueue.
pub(crate) fn parse_local_queue(obj: &Value) -> Option<((String, String), String)> {
    let meta = &obj["metadata"];
    Some((
        (text(&meta["namespace"]), meta["name"].as_str()?.to_string()),
        obj["spec"]["clusterQueue"].as_str()?.to_string(),
    ))
}

/// A ClusterQueue object: its name, quota and reservations.
pub(crate) fn parse_cluster_queue(obj: &Value) -> Option<(String, ClusterQueue)> {
    let name = obj["metadata"]["name"].as_str()?.to_string();
    let groups = obj["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| ResourceGroup {
            covered: g["coveredResources"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect(),
            flavors: g["flavors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| {
                    let quota = f["resources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|r| Some((text(&r["name"]), milli(&r["nominalQuota"])?)))
                        .collect();
                    (text(&f["name"]), quota)
                })
                .collect(),
        })
        .collect();
    let mut reserved = BTreeMap::new();
    for f in obj["status"]["flavorsReservation"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for r in f["resources"].as_array().into_iter().flatten() {
            if let Some(total) = milli(&r["total"]) {
                reserved.insert((text(&f["name"]), text(&r["name"])), total);
            }
        }
    }
    Some((name, ClusterQueue { groups, reserved }))
}

/// A Workload object: the uid of the Job it is for, and its admission.
pub(crate) fn parse_workload(obj: &Value) -> Option<(String, Workload)> {
    let uid = obj["metadata"]["labels"][JOB_UID_LABEL]
        .as_str()
        .or_else(|| {
            obj["metadata"]["ownerReferences"]
                .as_array()?
                .iter()
                .find(|o| o["controller"] == true)?["uid"]
                .as_str()
        })?;
    let conditions = obj["status"]["conditions"].as_array();
    let is = |t: &str| {
        conditions
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t && c["status"] == "True")
    };
    Some((
        uid.to_string(),
        Workload {
            admitted: is("QuotaReserved").is_some() || is("Admitted").is_some(),
            evicted: is("Preempted")
                .or_else(|| is("Evicted"))
                .map(|c| (text(&c["reason"]), text(&c["message"]))),
        },
    ))
}

/// The Kueue objects the dispatcher reads in a Kueue worker (kueue.x-k8s.io/v1beta1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KueueObject {
    LocalQueue,
    ClusterQueue,
    Workload,
}

impl KueueObject {
    pub(crate) const ALL: [KueueObject; 3] = [Self::LocalQueue, Self::ClusterQueue, Self::Workload];
}

impl WorkerQueues {
    /// Forgets every object of a kind (before a new list of them).
    pub(crate) fn clear(&mut self, what: KueueObject) {
        match what {
            KueueObject::LocalQueue => self.local_queues.clear(),
            KueueObject::ClusterQueue => self.cluster_queues.clear(),
            KueueObject::Workload => self.workloads.clear(),
        }
    }

    /// An object of the worker's Kueue as it is now (`present`) or gone. Returns the uid of
    /// the Job a Workload is for, when a Workload changed.
    pub(crate) fn apply(
        &mut self,
        what: KueueObject,
        obj: &Value,
        present: bool,
    ) -> Option<String> {
        match what {
            KueueObject::LocalQueue => {
                let (key, cq) = parse_local_queue(obj)?;
                if present {
                    self.local_queues.insert(key, cq);
                } else {
                    self.local_queues.remove(&key);
                }
                None
            }
            KueueObject::ClusterQueue => {
                let (name, cq) = parse_cluster_queue(obj)?;
                if present {
                    self.cluster_queues.insert(name, cq);
                } else {
                    self.cluster_queues.remove(&name);
                }
                None
            }
            KueueObject::Workload => {
                let (uid, w) = parse_workload(obj)?;
                if present {
                    self.workloads.insert(uid.clone(), w);
                } else {
                    self.workloads.remove(&uid);
                }
                Some(uid)
            }
        }
    }

    /// The ClusterQueue a Job of `namespace` enters through LocalQueue `local_queue`.
    pub(crate) fn cluster_queue_of(&self, namespace: &str, local_queue: &str) -> Option<&str> {
        self.local_queues
            .get(&(namespace.to_string(), local_queue.to_string()))
            .map(String::as_str)
    }

    /// Why the worker's Kueue cannot admit a gang asking for `need` (resource → milli-units)
    /// from `namespace` now, with `pending` (the requests of the dispatcher's copies there not
    /// admitted yet, which Kueue will admit first) counted as taken; `None` when it can.
    pub(crate) fn short(
        &self,
        namespace: &str,
        local_queue: &str,
        need: &BTreeMap<String, i64>,
        pending: &[BTreeMap<String, i64>],
    ) -> Option<Shortfall> {
        let Some(cq_name) = self.cluster_queue_of(namespace, local_queue) else {
            return Some(Shortfall::NoQueue);
        };
        let Some(cq) = self.cluster_queues.get(cq_name) else {
            return Some(Shortfall::NoClusterQueue(cq_name.to_string()));
        };
        let mut free: BTreeMap<FlavorResource, i64> = BTreeMap::new();
        for g in &cq.groups {
            for (flavor, quota) in &g.flavors {
                for (r, q) in quota {
                    let taken = cq
                        .reserved
                        .get(&(flavor.clone(), r.clone()))
                        .copied()
                        .unwrap_or(0);
                    free.insert((flavor.clone(), r.clone()), q.saturating_sub(taken));
                }
            }
        }
        for p in pending {
            // Kueue admits them first: they take the flavors it would give them.
            if let Ok(assigned) = assign(cq, &free, p) {
                for (key, amount) in assigned {
                    if let Some(f) = free.get_mut(&key) {
                        *f = f.saturating_sub(amount);
                    }
                }
            }
        }
        assign(cq, &free, need).err().map(|why| match why {
            Unassigned::Uncovered(r) => Shortfall::Uncovered {
                cluster_queue: cq_name.to_string(),
                resource: r,
            },
            Unassigned::Short {
                resource,
                need,
                free,
            } => Shortfall::Quota {
                cluster_queue: cq_name.to_string(),
                resource,
                need,
                free,
            },
        })
    }
}

/// Why a Kueue worker's queue cannot take a gang now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shortfall {
    /// No LocalQueue of that name in the Job's namespace.
    NoQueue,
    /// The LocalQueue names a ClusterQueue that is not there.
    NoClusterQueue(String),
    /// No resource group of the ClusterQueue covers a resource the gang asks for: never.
    Uncovered {
        cluster_queue: String,
        resource: String,
    },
    /// The most any flavor has free of `resource` is `free`; the gang needs `need`.
    Quota {
        cluster_queue: String,
        resource: String,
        need: i64,
        free: i64,
    },
}

impl Shortfall {
    /// For people: what is short, in the worker's terms.
    pub(crate) fn describe(&self, namespace: &str, local_queue: &str) -> String {
        match self {
            Shortfall::NoQueue => format!(
                "its Kueue has no LocalQueue {local_queue:?} in namespace {namespace:?}"
            ),
            Shortfall::NoClusterQueue(cq) => format!(
                "its LocalQueue {namespace}/{local_queue} points at ClusterQueue {cq:?}, which it does not have"
            ),
            Shortfall::Uncovered {
                cluster_queue,
                resource,
            } => format!(
                "its Kueue ClusterQueue {cluster_queue:?} has no quota for {resource}"
            ),
            Shortfall::Quota {
                cluster_queue,
                resource,
                need,
                free,
            } => format!(
                "its Kueue ClusterQueue {cluster_queue:?} has {} {resource} of quota free, the gang needs {}",
                display(resource, Milli(*free)),
                display(resource, Milli(*need))
            ),
        }
    }
}

/// (flavor, resource).
type FlavorResource = (String, String);

enum Unassigned {
    Uncovered(String),
    Short {
        resource: String,
        need: i64,
        free: i64,
    },
}

/// The flavor Kueue would give each resource group the request asks of (the first, in
/// order, with room for all of the group's resources requested), as (flavor, resource) →
/// amount; or why none.
fn assign(
    cq: &ClusterQueue,
    free: &BTreeMap<FlavorResource, i64>,
    need: &BTreeMap<String, i64>,
) -> Result<Vec<(FlavorResource, i64)>, Unassigned> {
    let mut out = Vec::new();
    for r in need.keys() {
        if !cq.groups.iter().any(|g| g.covered.contains(r)) {
            return Err(Unassigned::Uncovered(r.clone()));
        }
    }
    for g in &cq.groups {
        let asked: Vec<(&String, i64)> = need
            .iter()
            .filter(|(r, v)| **v > 0 && g.covered.contains(r))
            .map(|(r, v)| (r, *v))
            .collect();
        if asked.is_empty() {
            continue;
        }
        let room = |flavor: &str, r: &str| {
            free.get(&(flavor.to_string(), r.to_string()))
                .copied()
                .unwrap_or(0)
        };
        let chosen = g
            .flavors
            .iter()
            .find(|(f, _)| asked.iter().all(|(r, v)| room(f, r) >= *v));
        match chosen {
            Some((f, _)) => {
                out.extend(asked.iter().map(|(r, v)| ((f.clone(), (*r).clone()), *v)));
            }
            None => {
                // The resource short in the flavor that comes closest.
                let (resource, need, free) = asked
                    .iter()
                    .map(|(r, v)| {
                        let best = g.flavors.iter().map(|(f, _)| room(f, r)).max().unwrap_or(0);
                        ((*r).clone(), *v, best)
                    })
                    .find(|(_, v, best)| best < v)
                    .unwrap_or_else(|| (asked[0].0.clone(), asked[0].1, 0));
                return Err(Unassigned::Short {
                    resource,
                    need,
                    free,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cq(reserved_gpus: &str) -> Value {
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": "cluster-queue"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "default-flavor", "resources": [
                    {"name": "cpu", "nominalQuota": 8},
                    {"name": "memory", "nominalQuota": "32Gi"},
                    {"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]},
            "status": {"flavorsReservation": [{"name": "default-flavor", "resources": [
                {"name": "cpu", "total": "2", "borrowed": "0"},
                {"name": "memory", "total": "4Gi", "borrowed": "0"},
                {"name": "nvidia.com/gpu", "total": reserved_gpus, "borrowed": "0"}]}]}
        })
    }

    fn queues(reserved_gpus: &str) -> WorkerQueues {
        let lq = json!({"metadata": {"namespace": "research", "name": "user-queue"},
                        "spec": {"clusterQueue": "cluster-queue"}});
        let (key, cq_name) = parse_local_queue(&lq).unwrap();
        let (name, c) = parse_cluster_queue(&cq(reserved_gpus)).unwrap();
        WorkerQueues {
            local_queues: [(key, cq_name)].into(),
            cluster_queues: [(name, c)].into(),
            workloads: BTreeMap::new(),
        }
    }

    fn need(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_gang_fits_the_quota_left_and_not_more() {
        let q = queues("2");
        let two_gpus = need(&[("cpu", 2000), ("nvidia.com/gpu", 2000)]);
        assert_eq!(q.short("research", "user-queue", &two_gpus, &[]), None);
        let three = need(&[("cpu", 2000), ("nvidia.com/gpu", 3000)]);
        let s = q.short("research", "user-queue", &three, &[]).unwrap();
        assert_eq!(
            s.describe("research", "user-queue"),
            "its Kueue ClusterQueue \"cluster-queue\" has 2 nvidia.com/gpu of quota free, the gang needs 3"
        );
        // A copy sent there and not admitted yet takes its share first.
        let s = q.short(
            "research",
            "user-queue",
            &two_gpus,
            &[need(&[("nvidia.com/gpu", 1000)])],
        );
        assert!(s.is_some());
    }

    #[test]
    fn a_missing_queue_or_an_uncovered_resource_is_said() {
        let q = queues("0");
        assert_eq!(
            q.short("other", "user-queue", &need(&[("cpu", 1)]), &[]),
            Some(Shortfall::NoQueue)
        );
        let s = q
            .short(
                "research",
                "user-queue",
                &need(&[("example.com/fpga", 1000)]),
                &[],
            )
            .unwrap();
        assert!(matches!(s, Shortfall::Uncovered { .. }));
        assert!(s
            .describe("research", "user-queue")
            .contains("no quota for example.com/fpga"));
    }

    #[test]
    fn workloads_say_admitted_and_evicted_with_the_workers_reason() {
        let wl = json!({"metadata": {"labels": {"kueue.x-k8s.io/job-uid": "u-1"}},
            "status": {"conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "m"},
                {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue"}]}});
        let (uid, w) = parse_workload(&wl).unwrap();
        assert_eq!(uid, "u-1");
        assert!(!w.admitted);
        assert_eq!(w.evicted.as_ref().map(|e| e.0.as_str()), Some("Preempted"));
    }
}
