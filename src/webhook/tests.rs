use super::*;
use serde_json::json;

const BASIC: &str =
    include_str!("../../tests/fixtures/admission/admission-mutate-create-basic.json");

fn unreadable(body: &[u8]) -> String {
    match parse(body, Kind::Job) {
        Err(BadReview::Unreadable(line)) => line,
        other => panic!("expected Unreadable, got {other:?}"),
    }
}

fn rejected(body: serde_json::Value) -> String {
    match parse(&serde_json::to_vec(&body).unwrap(), Kind::Job) {
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
    let msg = rejected(review_with(json!({
        "uid": "u-1", "kind": gvk, "operation": "UPDATE", "object": job,
        "oldObject": {"kind": "ConfigMap", "metadata": {"name": "a"}}
    })));
    assert!(
        msg.contains("request.oldObject is a ConfigMap, not a batch/v1 Job"),
        "{msg}"
    );
    // A denial quoting a megabyte from the request is cut.
    let long = "q".repeat(1 << 20);
    let body = review_with(json!({
        "uid": "u-1", "kind": gvk, "operation": "CREATE", "object": {"kind": long}
    }));
    let (reply, decision) = review_body(
        Hook::Validate,
        &serde_json::to_vec(&body).unwrap(),
        &AdmissionPolicy::default(),
        None,
    )
    .unwrap();
    let message = decision.denial.unwrap().message;
    assert!(
        message.starts_with("request.object is a qqq"),
        "{message:.80}"
    );
    assert!(
        message.len() <= 1100 && reply.len() < 2000,
        "{} bytes",
        reply.len()
    );
}

#[test]
fn the_reply_echoes_the_envelope_and_carries_patch_type_only_with_a_patch() {
    let review = parse(BASIC.as_bytes(), Kind::Job).unwrap();
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
    let body = serde_json::to_vec(&v).unwrap();
    let review = parse(&body, Kind::Job).unwrap();
    assert_eq!(
        decide(Hook::Validate, &review, &AdmissionPolicy::default(), None),
        Decision::allow()
    );
    v["request"]["operation"] = json!("UPDATE");
    v["request"]["oldObject"] = v["request"]["object"].clone();
    let body = serde_json::to_vec(&v).unwrap();
    let review = parse(&body, Kind::Job).unwrap();
    assert_eq!(
        decide(Hook::Mutate, &review, &AdmissionPolicy::default(), None),
        Decision::allow()
    );
}

#[test]
fn namespace_labels_are_asked_for_only_when_a_default_queue_could_apply() {
    let review = parse(BASIC.as_bytes(), Kind::Job).unwrap();
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
    let body = serde_json::to_vec(&v).unwrap();
    let review = parse(&body, Kind::Job).unwrap();
    assert_eq!(
        review.namespace_to_look_up(Hook::Mutate, &policy),
        Some("research")
    );
    assert_eq!(review.namespace_to_look_up(Hook::Validate, &policy), None);
}

#[test]
fn dns1123_labels() {
    for ok in ["a", "research", "team-1", "0a", &"a".repeat(63)] {
        assert!(crate::api::is_dns1123_label(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "ünï"] {
        assert!(!crate::api::is_dns1123_label(bad), "{bad}");
    }
}

/// The compact BASIC body with its labels object replaced by `labels` (raw JSON text).
fn basic_with_labels(labels: &str) -> Vec<u8> {
    let compact =
        serde_json::to_string(&serde_json::from_str::<serde_json::Value>(BASIC).unwrap()).unwrap();
    let from = r#""labels":{"switchyard.dev/queue-name":"research"}"#;
    assert!(compact.contains(from));
    compact
        .replace(from, &format!(r#""labels":{labels}"#))
        .into_bytes()
}

#[test]
fn labels_keep_only_the_queue_and_read_as_a_map_would() {
    let queue = |labels: &str| {
        let body = basic_with_labels(labels);
        let review = parse(&body, Kind::Job).unwrap();
        let job = review.object.as_ref().unwrap();
        (
            job.metadata.as_ref().unwrap().labels.is_some(),
            job.queue().map(str::to_owned),
        )
    };
    assert_eq!(
        queue(r#"{"a":"b","switchyard.dev/queue-name":"q"}"#),
        (true, Some("q".into()))
    );
    // Escapes are decoded in keys and values alike.
    assert_eq!(
        queue(r#"{"switchyard.dev\/queue-name":"r\u0065s"}"#),
        (true, Some("res".into()))
    );
    // A repeated key: the last one wins, as in a map.
    assert_eq!(
        queue(r#"{"switchyard.dev/queue-name":"a","switchyard.dev/queue-name":"b"}"#),
        (true, Some("b".into()))
    );
    // An empty map is still a map (the patch adds to it); null is no map.
    assert_eq!(queue("{}"), (true, None));
    assert_eq!(queue("null"), (false, None));
    // Every value must be a string, kept or not.
    for bad in [r#"{"a":1}"#, r#"{"a":null}"#, r#"[]"#, r#""x""#] {
        match parse(&basic_with_labels(bad), Kind::Job) {
            Err(BadReview::Rejected { message, .. }) => {
                assert!(
                    message.contains("request.object is not a batch/v1 Job"),
                    "{message}"
                )
            }
            other => panic!("{bad}: expected Rejected, got {other:?}"),
        }
    }
}

#[test]
fn text_borrows_from_the_body_unless_escaped() {
    let review = parse(BASIC.as_bytes(), Kind::Job).unwrap();
    assert!(matches!(review.envelope.uid, Cow::Borrowed(_)));
    assert!(matches!(review.username, Cow::Borrowed(_)));
    let body = BASIC.replace(r#""username": "admin""#, r#""username": "ad\u006din""#);
    let review = parse(body.as_bytes(), Kind::Job).unwrap();
    assert_eq!(review.username, "admin");
    assert!(matches!(review.username, Cow::Owned(_)));
}

#[test]
fn bytes_that_are_not_utf8_in_skipped_strings_are_read_as_before() {
    // serde_json does not check UTF-8 in strings it skips; neither path may start to.
    let mut body = BASIC.as_bytes().to_vec();
    let at = BASIC.find("busybox").unwrap();
    body[at] = 0xff;
    assert!(std::str::from_utf8(&body).is_err());
    let review = parse(&body, Kind::Job).unwrap();
    assert_eq!(review.object_name(), "basic");
    // In a string that is kept, the body is unreadable, as it was.
    let mut body = BASIC.as_bytes().to_vec();
    let at = BASIC.find(r#""username": "admin""#).unwrap() + 13;
    body[at] = 0xff;
    assert!(unreadable(&body).contains("not a JSON AdmissionReview"));
}

#[test]
fn a_default_queue_patch_applies_to_an_object_without_metadata() {
    let mut v: serde_json::Value = serde_json::from_str(BASIC).unwrap();
    v["request"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let policy = AdmissionPolicy {
        default_queue: Some("q".into()),
        managed_namespaces: Some(Default::default()),
        ..AdmissionPolicy::default()
    };
    let (_, decision) = review_body(
        Hook::Mutate,
        &serde_json::to_vec(&v).unwrap(),
        &policy,
        Some(&BTreeMap::new()),
    )
    .unwrap();
    let mut object = v["request"]["object"].clone();
    json_patch::patch(&mut object, &decision.patch).expect("the patch applies");
    let queue_label = crate::wellknown::QUEUE_LABEL;
    assert_eq!(object["metadata"], json!({"labels": {queue_label: "q"}}));
    assert_eq!(object["spec"]["suspend"], true);
}

/// serde's derive reads a struct from an array too; a Job whose object, metadata or spec is an
/// array would have been given a patch that cannot apply. Each is refused with the field named
/// (the fast read fails on it, and the careful read names it).
#[test]
fn objects_given_as_arrays_are_refused_not_patched() {
    let gvk = json!({"group": "batch", "version": "v1", "kind": "Job"});
    for object in [
        json!([]),
        json!(["Job"]),
        json!({"kind": "Job", "metadata": []}),
        json!({"kind": "Job", "metadata": ["a", null, "ns"], "spec": {}}),
        json!({"kind": "Job", "metadata": {"name": "a"}, "spec": [true]}),
    ] {
        let msg = rejected(review_with(json!({
            "uid": "u-1", "kind": gvk, "operation": "CREATE", "object": object
        })));
        assert!(
            msg.contains("request.object is not a batch/v1 Job") && msg.contains("an object"),
            "{object}: {msg}"
        );
        let msg = rejected(review_with(json!({
            "uid": "u-1", "kind": gvk, "operation": "UPDATE",
            "object": {"kind": "Job", "metadata": {"name": "a"}, "spec": {}},
            "oldObject": object
        })));
        assert!(msg.contains("request.oldObject"), "{object}: {msg}");
    }
    // null stays "no such part": a Job without metadata still gets a patch that applies.
    let msg = rejected(review_with(json!({
        "uid": "u-1", "kind": gvk, "operation": "CREATE", "object": null
    })));
    assert!(msg.contains("object is missing"), "{msg}");
}
