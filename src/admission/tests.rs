use super::*;
use serde_json::json;

const BASIC: &str =
    include_str!("../../tests/fixtures/admission/admission-mutate-create-basic.json");

fn unreadable(body: &[u8]) -> String {
    match parse(body) {
        Err(BadReview::Unreadable(line)) => line,
        other => panic!("expected Unreadable, got {other:?}"),
    }
}

fn rejected(body: serde_json::Value) -> String {
    match parse(&serde_json::to_vec(&body).unwrap()) {
        Err(BadReview::Rejected { envelope, message }) => {
            assert_eq!(envelope.uid, "u-1", "the uid is echoed when known");
            message
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

fn review_with(request: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

#[test]
fn bodies_without_a_usable_request_get_one_line_reasons() {
    assert!(unreadable(b"").contains("not a JSON AdmissionReview"));
    assert!(unreadable(b"nope").contains("not a JSON AdmissionReview"));
    assert!(unreadable(&BASIC.as_bytes()[..BASIC.len() / 2]).contains("EOF"));
    assert!(unreadable(b"[]").contains("not a JSON AdmissionReview"));
    assert!(unreadable(br#"{"kind":"AdmissionReview"}"#).contains("no request"));
    assert!(unreadable(br#"{"request":null}"#).contains("no request"));
    assert!(unreadable(br#"{"request":[1]}"#).contains("not an object"));
    assert!(unreadable(br#"{"request":{"uid":""}}"#).contains("uid"));
    for line in [unreadable(b"nope"), unreadable(br#"{"request":{}}"#)] {
        assert!(!line.contains('\n'), "one line: {line:?}");
    }
}

#[test]
fn requests_with_a_uid_are_denied_in_a_review() {
    let job = json!({"kind": "Job", "metadata": {"name": "a"}, "spec": {}});
    let gvk = json!({"group": "batch", "version": "v1", "kind": "Job"});
    let msg = rejected(review_with(json!({
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE", "object": {"kind": "Pod"}
    })));
    assert!(msg.contains("core/v1 Pod"), "{msg}");
    let msg = rejected(review_with(
        json!({"uid": "u-1", "kind": gvk, "operation": "PATCH", "object": job}),
    ));
    assert!(msg.contains("PATCH"), "{msg}");
    let msg = rejected(review_with(
        json!({"uid": "u-1", "kind": gvk, "operation": "CREATE"}),
    ));
    assert!(msg.contains("object is missing"), "{msg}");
    let msg = rejected(review_with(
        json!({"uid": "u-1", "kind": gvk, "operation": "UPDATE", "object": job}),
    ));
    assert!(msg.contains("oldObject"), "{msg}");
    let msg = rejected(review_with(json!({
        "uid": "u-1", "kind": gvk, "operation": "CREATE",
        "object": {"kind": "Job", "metadata": {"labels": {"a": 1}}}
    })));
    assert!(
        msg.contains("request.object is not a batch/v1 Job"),
        "{msg}"
    );
    let msg = rejected(review_with(json!({
        "uid": "u-1", "kind": gvk, "operation": "CREATE", "object": {"kind": "CronJob"}
    })));
    assert!(msg.contains("CronJob"), "{msg}");
}

#[test]
fn the_reply_echoes_the_envelope_and_carries_patch_type_only_with_a_patch() {
    let review = parse(BASIC.as_bytes()).unwrap();
    let d = decide(Hook::Mutate, &review, &AdmissionPolicy::default(), None);
    let reply: serde_json::Value = serde_json::from_slice(&render(&review.envelope, &d)).unwrap();
    assert_eq!(reply["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(reply["kind"], "AdmissionReview");
    assert_eq!(
        reply["response"]["uid"],
        "b159a231-e846-48a6-835e-ca6889beb918"
    );
    assert_eq!(reply["response"]["patchType"], "JSONPatch");

    let d = Decision::allow();
    let reply: serde_json::Value = serde_json::from_slice(&render(&review.envelope, &d)).unwrap();
    assert_eq!(
        reply["response"],
        json!({"uid": "b159a231-e846-48a6-835e-ca6889beb918", "allowed": true})
    );

    let d = Decision::deny(Denial::forbidden("no".into()));
    let reply: serde_json::Value = serde_json::from_slice(&render(&review.envelope, &d)).unwrap();
    assert_eq!(
        reply["response"]["status"],
        json!({"status": "Failure", "message": "no", "reason": "Forbidden", "code": 403})
    );
}

#[test]
fn mutating_hook_ignores_updates_and_validating_hook_ignores_deletes() {
    let mut v: serde_json::Value = serde_json::from_str(BASIC).unwrap();
    v["request"]["operation"] = json!("DELETE");
    let review = parse(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(
        decide(Hook::Validate, &review, &AdmissionPolicy::default(), None),
        Decision::allow()
    );
    v["request"]["operation"] = json!("UPDATE");
    v["request"]["oldObject"] = v["request"]["object"].clone();
    let review = parse(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(
        decide(Hook::Mutate, &review, &AdmissionPolicy::default(), None),
        Decision::allow()
    );
}

#[test]
fn namespace_labels_are_asked_for_only_when_a_default_queue_could_apply() {
    let review = parse(BASIC.as_bytes()).unwrap();
    let mut policy = AdmissionPolicy::default();
    assert_eq!(review.namespace_to_look_up(Hook::Mutate, &policy), None);
    policy.default_queue = Some("q".into());
    policy.managed_namespaces = Some(Default::default());
    // Already labelled: the default does not apply.
    assert_eq!(review.namespace_to_look_up(Hook::Mutate, &policy), None);
    let mut v: serde_json::Value = serde_json::from_str(BASIC).unwrap();
    v["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    let review = parse(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(
        review.namespace_to_look_up(Hook::Mutate, &policy),
        Some("research")
    );
    assert_eq!(review.namespace_to_look_up(Hook::Validate, &policy), None);
}

#[test]
fn dns1123_labels() {
    for ok in ["a", "research", "team-1", "0a", &"a".repeat(63)] {
        assert!(is_dns1123_label(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "ünï"] {
        assert!(!is_dns1123_label(bad), "{bad}");
    }
}
