//! A WorkerCluster's status from what is known of it, and whether it is worth a write. Pure:
//! the clock is a parameter.
//!
//! `Active` is True only while the worker is connected and its inventory is fresh; otherwise
//! its reason says why (`Connecting`, `BadKubeConfig`, `InsecureKubeConfig`,
//! `ClientConnectionFailed`, `Stale`, `InvalidSpec`) and its message gives the attempt count
//! and when the next attempt is due.

use super::connection::{Health, Reason};
use crate::api::{
    cluster_reason, find_condition, set_condition, ClusterSummary, ConnectionStatus,
    WorkerClusterStatus, CONDITION_ACTIVE,
};
use crate::inventory::{Cluster, ResourceTable};
use crate::quantity::{display, Milli};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// A status timestamp, whole seconds as the API server stores them, so what was written
/// compares equal to what is read back.
pub(crate) fn time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
}

/// Why nothing may be placed in worker `name`: what its inventory cluster says, or, before
/// the hub has published the worker at all, that its inventory is not loaded. A worker
/// missing from the snapshot is never Active, however well it answers probes.
pub(crate) fn unavailable<'a>(name: &str, cluster: Option<&'a Cluster>) -> Option<Cow<'a, str>> {
    match cluster {
        Some(c) => c.unavailable.as_deref().map(Cow::Borrowed),
        None => Some(Cow::Owned(format!(
            "the inventory of worker cluster {name} is not loaded yet: it is not in the inventory"
        ))),
    }
}

/// The `Active` condition's status, reason and message.
pub(crate) fn active(health: &Health, stale: Option<&str>) -> (&'static str, &'static str, String) {
    let (status, reason, message) = super::ConnectionState {
        health: health.clone(),
        backoff: Default::default(),
    }
    .condition();
    match (status, stale) {
        ("True", Some(why)) => ("False", cluster_reason::STALE, why.to_string()),
        _ => (status, reason, message),
    }
}

fn quantities(
    table: &ResourceTable,
    amounts: &[i64],
    keep: impl Fn(usize) -> bool,
) -> BTreeMap<String, Quantity> {
    (0..table.len())
        .filter(|r| keep(*r))
        .map(|r| {
            let name = table.name(r);
            let m = amounts.get(r).copied().unwrap_or(0).max(0);
            (name.to_string(), Quantity(display(name, Milli(m))))
        })
        .collect()
}

/// The summary of a worker's inventory; `last_sync` is when it was last known fresh.
pub(crate) fn summary(
    cluster: &Cluster,
    table: &ResourceTable,
    last_sync: Option<SystemTime>,
) -> ClusterSummary {
    let s = &cluster.summary;
    let on = |v: &[i64], r: usize| v.get(r).copied().unwrap_or(0) > 0;
    ClusterSummary {
        nodes: i32::try_from(s.nodes).unwrap_or(i32::MAX),
        numa_aware_nodes: i32::try_from(s.numa_nodes).unwrap_or(i32::MAX),
        allocatable: quantities(table, &s.allocatable, |r| on(&s.allocatable, r)),
        largest_free_on_node: quantities(table, &s.max_free_on_node, |r| on(&s.allocatable, r)),
        largest_free_in_numa_zone: quantities(table, &s.max_free_in_zone, |r| {
            on(&s.max_allocatable_in_zone, r)
        }),
        last_sync_time: last_sync.map(time),
    }
}

/// Everything the status is made from.
pub(crate) struct Observed<'a> {
    /// The WorkerCluster's name.
    pub(crate) name: &'a str,
    /// The status as the API server has it now.
    pub(crate) current: Option<&'a WorkerClusterStatus>,
    pub(crate) generation: Option<i64>,
    pub(crate) health: &'a Health,
    /// The inventory's cluster, once the hub has published it.
    pub(crate) cluster: Option<&'a Cluster>,
    pub(crate) table: &'a ResourceTable,
}

/// The status Switchyard wants the WorkerCluster to have at `now`.
pub(crate) fn desired(o: &Observed, now: SystemTime) -> WorkerClusterStatus {
    let stale = unavailable(o.name, o.cluster);
    let (status, reason, message) = active(o.health, stale.as_deref());
    let mut conditions = o.current.map(|s| s.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        Condition {
            type_: CONDITION_ACTIVE.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: time(now),
            observed_generation: o.generation,
        },
    );
    let fresh = status == "True";
    let previous_sync = o
        .current
        .and_then(|s| s.summary.as_ref())
        .and_then(|s| s.last_sync_time.as_ref())
        .map(|t| SystemTime::from(t.0));
    // The summary is re-taken only while it is fresh; otherwise the last fresh one stays,
    // with its time, so a reader sees how old it is.
    let summary = match o.cluster {
        Some(c) if fresh => Some(summary(c, o.table, Some(now))),
        _ => o.current.and_then(|s| s.summary.clone()).map(|mut s| {
            s.last_sync_time = previous_sync.map(time);
            s
        }),
    };
    let connection = match o.health {
        Health::Disconnected {
            since,
            attempts,
            message,
            next_attempt,
            ..
        } => Some(ConnectionStatus {
            disconnected_since: Some(time(*since)),
            attempts: i32::try_from(*attempts).unwrap_or(i32::MAX),
            next_attempt_time: Some(time(*next_attempt)),
            last_error: Some(message.clone()),
        }),
        _ => None,
    };
    WorkerClusterStatus {
        conditions,
        summary,
        connection,
    }
}

/// Whether `desired` is worth writing over `current`: anything but the summary's sync time
/// differs, or that time is older than `refresh` (so a fresh worker's status shows it is
/// fresh without a write on every change of the clock).
pub(crate) fn needs_write(
    current: Option<&WorkerClusterStatus>,
    desired: &WorkerClusterStatus,
    refresh: Duration,
) -> bool {
    let Some(current) = current else {
        return true;
    };
    let without_time = |s: &WorkerClusterStatus| {
        let mut s = s.clone();
        if let Some(summary) = &mut s.summary {
            summary.last_sync_time = None;
        }
        s
    };
    if without_time(current) != without_time(desired) {
        return true;
    }
    let at = |s: &WorkerClusterStatus| {
        s.summary
            .as_ref()
            .and_then(|s| s.last_sync_time.as_ref())
            .map(|t| t.0)
    };
    match (at(current), at(desired)) {
        (Some(old), Some(new)) => {
            let age = new.duration_since(old);
            age.is_positive() && age.unsigned_abs() >= refresh
        }
        (old, new) => old != new,
    }
}

/// The merge patch that makes the status `desired`: absent parts are written as null so a
/// summary or connection that no longer applies is removed, and the conditions list is sent
/// whole (a merge patch replaces lists).
pub(crate) fn patch(desired: &WorkerClusterStatus) -> Value {
    let mut status = serde_json::to_value(desired).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut status {
        for key in ["summary", "connection"] {
            map.entry(key).or_insert(Value::Null);
        }
        map.entry("conditions").or_insert_with(|| json!([]));
    }
    json!({ "status": status })
}

/// The connection state a WorkerCluster's status records, for a controller starting up (a
/// restart, or another replica taking over): "disconnected since T" must keep its T, or the
/// dispatcher's workerLostTimeout would start over with every failover. T is
/// `status.connection.disconnectedSince`, else the time the `Active` condition turned False
/// for a disconnection reason. Anything else starts as `Connecting`.
pub(crate) fn restored_health(status: Option<&WorkerClusterStatus>, now: SystemTime) -> Health {
    let Some(status) = status else {
        return Health::Connecting;
    };
    let active = find_condition(&status.conditions, CONDITION_ACTIVE);
    let reason = active.and_then(|c| Reason::parse(&c.reason));
    let connection = status.connection.as_ref();
    let since = connection
        .and_then(|c| c.disconnected_since.as_ref())
        .or_else(|| {
            active
                .filter(|c| c.status == "False" && reason.is_some_and(Reason::is_disconnection))
                .map(|c| &c.last_transition_time)
        })
        .map(|t| SystemTime::from(t.0));
    let Some(since) = since else {
        return Health::Connecting;
    };
    Health::Disconnected {
        since,
        attempts: connection
            .map(|c| u32::try_from(c.attempts).unwrap_or(0))
            .unwrap_or(0),
        reason: reason
            .filter(|r| r.is_disconnection())
            .unwrap_or(Reason::ClientConnectionFailed),
        message: connection
            .and_then(|c| c.last_error.clone())
            .unwrap_or_else(|| "not reachable before this replica started".into()),
        // The first attempt of this replica is made at once.
        next_attempt: now,
    }
}

/// A one-line description of a worker's state for logs and `/readyz`.
#[cfg(test)]
pub(crate) fn describe(health: &Health) -> String {
    match health {
        Health::Connecting => "connecting".into(),
        Health::Connected { since } => {
            format!("connected since {}", super::connection::httpdate(*since))
        }
        Health::Disconnected {
            since, attempts, ..
        } => format!(
            "disconnected since {} ({attempts} attempts)",
            super::connection::httpdate(*since)
        ),
    }
}

#[cfg(test)]
mod tests;
