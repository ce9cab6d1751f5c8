use super::*;

const D: Duration = Duration::from_secs(15);

fn at(secs: u64, micros: u32) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::new(1_795_000_000 + secs, micros * 1000)
}

fn held(holder: &str, renewed: SystemTime, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(micro_time(at(0, 0))),
        renew_time: Some(micro_time(renewed)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

#[test]
fn a_missing_lease_is_created_held_by_me() {
    let now = at(100, 499_338);
    let Step::Create(spec) = step(None, "a", now, D) else {
        panic!("expected Create");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.acquire_time, Some(micro_time(now)));
    assert_eq!(spec.renew_time, Some(micro_time(now)));
    // MicroTime on the wire: exactly six fractional digits, as the API server requires.
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(json["renewTime"], "2026-11-18T11:08:20.499338Z");
    assert_eq!(
        serde_json::to_value(micro_time(at(0, 0))).unwrap(),
        "2026-11-18T11:06:40.000000Z"
    );
}

#[test]
fn the_holder_renews_keeping_its_acquire_time_and_transitions() {
    let lease = held("a", at(10, 0), 3);
    let now = at(12, 5);
    let Step::Renew(spec) = step(Some(&lease), "a", now, D) else {
        panic!("expected Renew");
    };
    assert_eq!(spec.acquire_time, lease.acquire_time);
    assert_eq!(spec.renew_time, Some(micro_time(now)));
    assert_eq!(spec.lease_transitions, Some(3));
    // Even a holder whose lease expired renews its own (nobody took it over).
    assert!(matches!(
        step(Some(&lease), "a", at(100, 0), D),
        Step::Renew(_)
    ));
}

#[test]
fn a_valid_lease_of_another_is_followed_until_it_expires_then_taken_over() {
    let lease = held("b", at(10, 0), 3);
    assert_eq!(
        step(Some(&lease), "a", at(24, 999_999), D),
        Step::Follow {
            holder: "b".into(),
            expires: at(25, 0)
        }
    );
    let now = at(25, 0);
    let Step::Acquire(spec) = step(Some(&lease), "a", now, D) else {
        panic!("expected Acquire at expiry");
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(4));
    assert_eq!(spec.acquire_time, Some(micro_time(now)));
}

#[test]
fn a_released_or_timeless_lease_is_taken_at_once() {
    let mut released = held("b", at(10, 0), 1);
    released.holder_identity = None;
    assert!(matches!(
        step(Some(&released), "a", at(10, 1), D),
        Step::Acquire(_)
    ));
    released.holder_identity = Some(String::new());
    assert!(matches!(
        step(Some(&released), "a", at(10, 1), D),
        Step::Acquire(_)
    ));
    let timeless = LeaseSpec {
        holder_identity: Some("b".into()),
        ..Default::default()
    };
    let Step::Acquire(spec) = step(Some(&timeless), "a", at(10, 0), D) else {
        panic!("expected Acquire");
    };
    assert_eq!(spec.lease_transitions, Some(1));
}

#[test]
fn identities_prefer_the_pod_name_and_always_carry_a_suffix() {
    assert_eq!(
        identity(Some("switchyard-0"), Some("node-1"), 0xab),
        "switchyard-0_00000000000000ab"
    );
    assert_eq!(identity(None, Some("host"), 1), "host_0000000000000001");
    assert_eq!(identity(Some(""), None, 1), "switchyard_0000000000000001");
    assert_ne!(identity_from_env(), identity_from_env());
}
