use super::*;
use crate::inventory::{parse_yaml, Inventory};
use crate::workers::connection::{Backoff, ConnectionState, Reason};

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn inventory() -> Inventory {
    parse_yaml(include_str!(
        "../../../tests/data/formats/inventory.example.yaml"
    ))
    .unwrap()
}

fn q(s: &str) -> Quantity {
    Quantity(s.to_string())
}

fn desired_at(
    current: Option<&WorkerClusterStatus>,
    health: &Health,
    cluster: Option<&Cluster>,
    inv: &Inventory,
    now: SystemTime,
) -> WorkerClusterStatus {
    desired(
        &Observed {
            name: "eu-1",
            current,
            generation: Some(3),
            health,
            cluster,
            table: &inv.resources,
        },
        now,
    )
}

fn active_condition(s: &WorkerClusterStatus) -> &Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == CONDITION_ACTIVE)
        .unwrap()
}

#[test]
fn a_connected_fresh_worker_is_active_with_its_summary() {
    let inv = inventory();
    let eu = inv.cluster("eu-1").unwrap();
    let health = Health::Connected { since: t(0) };
    let s = desired_at(None, &health, Some(eu), &inv, t(10));
    let c = active_condition(&s);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Connected")
    );
    assert_eq!(c.observed_generation, Some(3));
    assert_eq!(c.last_transition_time, time(t(10)));
    assert!(s.connection.is_none());
    let summary = s.summary.unwrap();
    assert_eq!((summary.nodes, summary.numa_aware_nodes), (2, 1));
    assert_eq!(
        summary.allocatable,
        BTreeMap::from([
            ("cpu".into(), q("80")),
            ("memory".into(), q("576Gi")),
            ("nvidia.com/gpu".into(), q("8")),
            ("pods".into(), q("220")),
        ])
    );
    assert_eq!(
        summary.largest_free_on_node,
        BTreeMap::from([
            ("cpu".into(), q("58")),
            ("memory".into(), q("488Gi")),
            ("nvidia.com/gpu".into(), q("6")),
            ("pods".into(), q("107")),
        ])
    );
    // Pods are not a NUMA resource: the zones do not list them.
    assert_eq!(
        summary.largest_free_in_numa_zone,
        BTreeMap::from([
            ("cpu".into(), q("32")),
            ("memory".into(), q("256Gi")),
            ("nvidia.com/gpu".into(), q("4")),
        ])
    );
    assert_eq!(summary.last_sync_time, Some(time(t(10))));
}

#[test]
fn a_lost_worker_shows_attempts_and_the_next_attempt_and_keeps_its_last_summary() {
    let inv = inventory();
    let eu = inv.cluster("eu-1").unwrap();
    let fresh = desired_at(
        None,
        &Health::Connected { since: t(0) },
        Some(eu),
        &inv,
        t(10),
    );
    let mut c = ConnectionState::new(Backoff::default());
    c.connected(t(0));
    c.failed(
        t(20),
        Reason::ClientConnectionFailed,
        "connection refused".into(),
    );
    c.failed(
        t(25),
        Reason::ClientConnectionFailed,
        "connection refused".into(),
    );
    let s = desired_at(Some(&fresh), &c.health, Some(eu), &inv, t(26));
    let cond = active_condition(&s);
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "ClientConnectionFailed")
    );
    assert_eq!(
        cond.message,
        "attempt 2 failed: connection refused; next attempt at 2027-01-15T08:00:35Z"
    );
    assert_eq!(cond.last_transition_time, time(t(26)));
    let conn = s.connection.as_ref().unwrap();
    assert_eq!(conn.disconnected_since, Some(time(t(20))));
    assert_eq!(conn.attempts, 2);
    assert_eq!(conn.next_attempt_time, Some(time(t(35))));
    assert_eq!(conn.last_error.as_deref(), Some("connection refused"));
    // The last fresh summary stays, with the time it was fresh.
    assert_eq!(s.summary, fresh.summary);
    assert!(needs_write(Some(&fresh), &s, Duration::from_secs(60)));
    // Connected again: the condition flips back and the connection block goes (as null).
    let back = desired_at(
        Some(&s),
        &Health::Connected { since: t(40) },
        Some(eu),
        &inv,
        t(40),
    );
    assert_eq!(active_condition(&back).status, "True");
    assert_eq!(patch(&back)["status"]["connection"], Value::Null);
    assert!(patch(&back)["status"]
        .as_object()
        .unwrap()
        .contains_key("connection"));
}

#[test]
fn a_connected_but_stale_worker_is_not_active_and_says_why() {
    let inv = inventory();
    let mut eu = inv.cluster("eu-1").unwrap().clone();
    eu.unavailable =
        Some("worker cluster eu-1 is stale: no successful watch or resync for over 120s".into());
    let s = desired_at(
        None,
        &Health::Connected { since: t(0) },
        Some(&eu),
        &inv,
        t(200),
    );
    let c = active_condition(&s);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Stale"));
    assert!(c.message.contains("stale"), "{}", c.message);
    assert!(s.summary.is_none(), "no fresh summary was ever taken");
}

/// The link can connect before the hub has published the worker: until the inventory has
/// it, a connected worker is not Active (a status that said Connected there turned Stale a
/// moment later, once the hub published the worker with nothing listed yet).
#[test]
fn a_connected_worker_the_inventory_does_not_have_yet_is_not_active() {
    let inv = inventory();
    let s = desired_at(None, &Health::Connected { since: t(0) }, None, &inv, t(1));
    let c = active_condition(&s);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Stale"));
    assert_eq!(
        c.message,
        "the inventory of worker cluster eu-1 is not loaded yet: it is not in the inventory"
    );
    assert!(s.summary.is_none());
}

#[test]
fn unsafe_and_broken_kubeconfigs_give_their_reasons() {
    let inv = inventory();
    for reason in [Reason::InsecureKubeConfig, Reason::BadKubeConfig] {
        let mut c = ConnectionState::new(Backoff::default());
        c.failed(t(0), reason, "user \"x\" uses basic auth".into());
        let s = desired_at(None, &c.health, None, &inv, t(0));
        let cond = active_condition(&s);
        assert_eq!(cond.reason, reason.as_str());
        assert!(cond
            .message
            .starts_with("attempt 1 failed: user \"x\" uses basic auth; next attempt at "));
    }
    let s = desired_at(None, &Health::Connecting, None, &inv, t(0));
    let cond = active_condition(&s);
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("Unknown", "Connecting")
    );
}

#[test]
fn writes_happen_only_for_real_changes_and_to_refresh_the_sync_time() {
    let inv = inventory();
    let eu = inv.cluster("eu-1").unwrap();
    let health = Health::Connected { since: t(0) };
    let written = desired_at(None, &health, Some(eu), &inv, t(10));
    assert!(needs_write(None, &written, Duration::from_secs(60)));
    // Seconds later nothing but the clock moved.
    let again = desired_at(Some(&written), &health, Some(eu), &inv, t(30));
    assert_eq!(active_condition(&again).last_transition_time, time(t(10)));
    assert!(!needs_write(
        Some(&written),
        &again,
        Duration::from_secs(60)
    ));
    // A minute later the sync time is worth refreshing.
    let later = desired_at(Some(&written), &health, Some(eu), &inv, t(70));
    assert!(needs_write(Some(&written), &later, Duration::from_secs(60)));
    // Other conditions someone else set are kept.
    let mut with_other = written.clone();
    with_other.conditions.push(Condition {
        type_: "Audited".into(),
        status: "True".into(),
        reason: "ByHand".into(),
        message: String::new(),
        last_transition_time: time(t(0)),
        observed_generation: None,
    });
    let kept = desired_at(Some(&with_other), &health, Some(eu), &inv, t(20));
    assert_eq!(kept.conditions.len(), 2);
    assert!(!needs_write(
        Some(&with_other),
        &kept,
        Duration::from_secs(60)
    ));
}

#[test]
fn status_times_are_whole_seconds_so_they_read_back_equal() {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_999);
    let written = time(at);
    let json = serde_json::to_value(&written).unwrap();
    assert_eq!(json, "2027-01-15T08:00:00Z");
    let read: Time = serde_json::from_value(json).unwrap();
    assert_eq!(read, written);
    assert_eq!(describe(&Health::Connecting), "connecting");
}

#[test]
fn a_starting_controller_takes_disconnected_since_from_the_status() {
    let inv = inventory();
    let lost = t(100);
    let mut c = ConnectionState::new(Backoff::default());
    c.failed(lost, Reason::InsecureKubeConfig, "exec plugin".into());
    let first = desired_at(None, &c.health, None, &inv, lost);
    c.failed(t(105), Reason::ClientConnectionFailed, "refused".into());
    let written = desired_at(Some(&first), &c.health, None, &inv, t(110));
    // Read back by another replica at t(500).
    match restored_health(Some(&written), t(500)) {
        Health::Disconnected {
            since,
            attempts,
            reason,
            message,
            next_attempt,
        } => {
            assert_eq!(since, lost);
            assert_eq!(attempts, 2);
            assert_eq!(reason, Reason::ClientConnectionFailed);
            assert_eq!(message, "refused");
            assert_eq!(next_attempt, t(500));
        }
        other => panic!("{other:?}"),
    }
    // Without the connection block, the time Active turned False for a disconnection.
    let mut only_condition = written.clone();
    only_condition.connection = None;
    match restored_health(Some(&only_condition), t(500)) {
        Health::Disconnected { since, .. } => assert_eq!(since, lost),
        other => panic!("{other:?}"),
    }
    // Connected, stale (connected but behind) or never written: nothing to restore.
    let mut ok = ConnectionState::new(Backoff::default());
    ok.connected(t(1));
    let connected = desired_at(None, &ok.health, inv.cluster("eu-1"), &inv, t(2));
    assert_eq!(
        restored_health(Some(&connected), t(500)),
        Health::Connecting
    );
    let mut stale = connected.clone();
    stale.conditions[0].status = "False".into();
    stale.conditions[0].reason = "Stale".into();
    assert_eq!(restored_health(Some(&stale), t(500)), Health::Connecting);
    assert_eq!(restored_health(None, t(500)), Health::Connecting);
}
