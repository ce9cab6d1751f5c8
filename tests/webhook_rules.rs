//! Every admission rule, table-driven from AdmissionReview fixtures shaped exactly like
//! kube-apiserver's (tests/fixtures/admission, derived from real captures). Each reply's patch
//! is applied to the object and the result checked, as the API server would store it.

mod common;

use common::{assert_echo, fixture, fixture_json, patch_of, patched_object};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use switchyard::webhook::{review_body, review_body_of, AdmissionPolicy, Hook, Kind};

enum Expect {
    /// Allowed; each (JSON Pointer, value) holds in the patched object (`None`: absent).
    /// `no_patch` demands that the reply carries no patch at all. `warnings` are exactly the
    /// reply's warnings, each given by a part of its text, in order (empty: none at all).
    Allow {
        after: Vec<(&'static str, Option<Value>)>,
        no_patch: bool,
        warnings: &'static [&'static str],
    },
    Deny {
        code: u16,
        mentions: &'static [&'static str],
    },
}

struct Case {
    fixture: &'static str,
    hook: Hook,
    default_queue: Option<&'static str>,
    expect: Expect,
}

fn ours_after() -> Vec<(&'static str, Option<Value>)> {
    vec![
        ("/spec/suspend", Some(json!(true))),
        ("/spec/managedBy", Some(json!("switchyard.dev/dispatcher"))),
    ]
}

fn cases() -> Vec<Case> {
    use Expect::*;
    use Hook::*;
    vec![
        Case {
            fixture: "admission-mutate-create-basic",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: ours_after(),
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            fixture: "mutate-create-no-labels",
            hook: Mutate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "mutate-create-other-labels",
            hook: Mutate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "mutate-create-managedby-jobcontroller",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: ours_after(),
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            // Another controller's Job: never overwritten; the validating hook explains.
            fixture: "mutate-create-managedby-other",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: vec![
                    ("/spec/suspend", Some(Value::Bool(true))),
                    ("/spec/managedBy", Some(json!("kueue.x-k8s.io/multikueue"))),
                ],
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            fixture: "mutate-create-already-suspended",
            hook: Mutate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "mutate-create-unknown-fields",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: ours_after(),
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            fixture: "mutate-create-dry-run",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: ours_after(),
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            fixture: "mutate-create-generate-name",
            hook: Mutate,
            default_queue: None,
            expect: Allow {
                after: ours_after(),
                no_patch: false,
                warnings: &[],
            },
        },
        Case {
            // No labels map at all: the patch must create it, with the escaped key.
            fixture: "mutate-create-default-namespace",
            hook: Mutate,
            default_queue: Some("team-queue"),
            expect: Allow {
                after: vec![
                    (
                        "/metadata/labels/switchyard.dev~1queue-name",
                        Some(json!("team-queue")),
                    ),
                    ("/spec/suspend", Some(Value::Bool(true))),
                ],
                no_patch: false,
                warnings: &["default queue"],
            },
        },
        Case {
            // A default queue only for matching namespaces: research does not match team-a.
            fixture: "mutate-create-no-labels",
            hook: Mutate,
            default_queue: Some("team-queue"),
            expect: unchanged(),
        },
        Case {
            fixture: "admission-validate-create-basic",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &["spec.managedBy", "switchyard-mutating"],
            },
        },
        Case {
            fixture: "validate-create-mutated",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-create-bad-queue",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &[
                    "metadata.labels[switchyard.dev/queue-name]",
                    "Research_Team",
                    "DNS-1123",
                ],
            },
        },
        Case {
            fixture: "validate-create-managedby-other",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &["spec.managedBy", "kueue.x-k8s.io/multikueue", "remove"],
            },
        },
        Case {
            fixture: "validate-update-unsuspend-dispatcher",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-update-unsuspend-alice-managed",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 403,
                mentions: &["spec.suspend", "alice", "dispatcher"],
            },
        },
        Case {
            // The real capture: a Job of ours (labelled) without managedBy, created before
            // the webhook existed; unsuspending it is still the dispatcher's decision.
            fixture: "admission-validate-update-unsuspend-alice",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 403,
                mentions: &["spec.suspend", "alice"],
            },
        },
        Case {
            fixture: "validate-update-relabel-suspended",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-update-relabel-running",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &["metadata.labels[switchyard.dev/queue-name]", "admitted"],
            },
        },
        Case {
            fixture: "validate-update-unlabel-dispatched",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &["worker-1", "dispatched"],
            },
        },
        Case {
            // Created with our managedBy but around the mutating hook: the admission gate
            // would be bypassed.
            fixture: "validate-create-unsuspended-managed",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 403,
                mentions: &[
                    "spec.suspend",
                    "queue \"research\"",
                    "created suspended",
                    "check that the MutatingWebhookConfiguration switchyard-mutating exists",
                ],
            },
        },
        Case {
            // The dispatcher's identity may create it unsuspended.
            fixture: "validate-create-unsuspended-dispatcher",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-create-managedby-ours-no-label",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 403,
                mentions: &[
                    "spec.suspend",
                    "a Job managed by \"switchyard.dev/dispatcher\" (with no switchyard.dev/queue-name label)",
                    "switchyard-mutating",
                ],
            },
        },
        Case {
            fixture: "validate-update-relabel-invalid",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &[
                    "metadata.labels[switchyard.dev/queue-name]",
                    "Other_Queue",
                    "DNS-1123",
                ],
            },
        },
        Case {
            // spec.managedBy is immutable: an existing Job cannot join a queue.
            fixture: "validate-update-label-unrelated",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &["spec.managedBy", "immutable", "create it again"],
            },
        },
        Case {
            // Ratcheting: a Job labelled before the hook existed, so not managed by us, still
            // takes an unrelated update (an annotation); only a change that brings a problem
            // in is refused.
            fixture: "validate-update-annotate-unmanaged",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            // The same for a queue label that is not a queue name but was there already.
            fixture: "validate-update-annotate-bad-queue",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-update-unlabel-admitted",
            hook: Validate,
            default_queue: None,
            expect: Deny {
                code: 422,
                mentions: &[
                    "metadata.labels[switchyard.dev/queue-name]",
                    "cannot be removed",
                    "admitted",
                ],
            },
        },
        Case {
            // Allowed before admission, but the Job keeps our managedBy and so never runs.
            fixture: "validate-update-unlabel-suspended",
            hook: Validate,
            default_queue: None,
            expect: Allow {
                after: Vec::new(),
                no_patch: true,
                warnings: &["will never run"],
            },
        },
        Case {
            fixture: "validate-update-status-subresource",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "admission-validate-update-status-external-running-admin",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
        Case {
            fixture: "validate-update-unrelated-job",
            hook: Validate,
            default_queue: None,
            expect: unchanged(),
        },
    ]
}

fn unchanged() -> Expect {
    Expect::Allow {
        after: Vec::new(),
        no_patch: true,
        warnings: &[],
    }
}

fn policy(default_queue: Option<&str>) -> AdmissionPolicy {
    AdmissionPolicy {
        default_queue: default_queue.map(String::from),
        managed_namespaces: default_queue.map(|_| {
            serde_json::from_value(json!({"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
            ]}))
            .unwrap()
        }),
        ..AdmissionPolicy::default()
    }
}

/// Runs one case the way the server does, with the Namespace's labels as the standalone
/// lookup would give them.
fn run(case: &Case) -> (Value, Value) {
    let review = fixture_json(case.fixture);
    let policy = policy(case.default_queue);
    let ns = review["request"]["namespace"].as_str().unwrap_or_default();
    let labels = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())]);
    let (reply, _) = review_body(case.hook, &fixture(case.fixture), &policy, Some(&labels))
        .unwrap_or_else(|e| panic!("{}: {e:?}", case.fixture));
    (
        review,
        serde_json::from_slice(&reply).expect("reply is JSON"),
    )
}

#[test]
fn every_rule_answers_as_documented() {
    let mut failures = Vec::new();
    for case in cases() {
        let (review, reply) = run(&case);
        assert_echo(&review, &reply);
        let response = &reply["response"];
        let name = case.fixture;
        match &case.expect {
            Expect::Allow {
                after,
                no_patch,
                warnings,
            } => {
                if response["allowed"] != true {
                    failures.push(format!("{name}: expected allowed, got {response}"));
                    continue;
                }
                if *no_patch && patch_of(&reply).is_some() {
                    failures.push(format!("{name}: expected no patch, got {response}"));
                }
                let object = patched_object(&review, &reply);
                for (pointer, want) in after.iter() {
                    let got = object.pointer(pointer);
                    let ok = match (want, got) {
                        (Some(w), Some(g)) => w == g,
                        (None, None) => true,
                        _ => false,
                    };
                    if !ok {
                        failures.push(format!("{name}: {pointer} is {got:?}, expected {want:?}"));
                    }
                }
                let got: Vec<&str> = response
                    .get("warnings")
                    .map(|w| {
                        w.as_array()
                            .expect("warnings is an array")
                            .iter()
                            .map(|w| w.as_str().expect("a warning is a string"))
                            .collect()
                    })
                    .unwrap_or_default();
                let matches = got.len() == warnings.len()
                    && got.iter().zip(warnings.iter()).all(|(g, w)| g.contains(w));
                if !matches {
                    failures.push(format!(
                        "{name}: warnings {got:?}, expected exactly {warnings:?}"
                    ));
                }
            }
            Expect::Deny { code, mentions } => {
                if response["allowed"] != false {
                    failures.push(format!("{name}: expected denied, got {response}"));
                    continue;
                }
                if response["status"]["code"] != *code {
                    failures.push(format!(
                        "{name}: code {} != {code}",
                        response["status"]["code"]
                    ));
                }
                let message = response["status"]["message"].as_str().unwrap_or_default();
                for placeholder in ["queue \"\"", "<removed>"] {
                    if message.contains(placeholder) {
                        failures.push(format!("{name}: message says {placeholder}: {message}"));
                    }
                }
                if response.get("warnings").is_some() {
                    failures.push(format!("{name}: a denial carries no warnings"));
                }
                for m in mentions.iter() {
                    if !message.contains(m) {
                        failures.push(format!("{name}: message lacks {m:?}: {message}"));
                    }
                }
                if response.get("patch").is_some() {
                    failures.push(format!("{name}: a denial carries no patch"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn default_queue_creates_the_labels_map_with_an_escaped_key() {
    let case = Case {
        fixture: "mutate-create-default-namespace",
        hook: Hook::Mutate,
        default_queue: Some("team-queue"),
        expect: unchanged(),
    };
    let (review, reply) = run(&case);
    let ops = serde_json::to_value(patch_of(&reply).unwrap()).unwrap();
    assert!(
        ops.as_array()
            .unwrap()
            .iter()
            .any(|op| op["path"] == "/metadata/labels"
                && op["value"] == json!({"switchyard.dev/queue-name": "team-queue"})),
        "the labels map is added whole when absent: {ops}"
    );
    let object = patched_object(&review, &reply);
    assert_eq!(
        object["metadata"]["labels"]["switchyard.dev/queue-name"],
        "team-queue"
    );

    // With a labels map present, only the key is added, escaped as ~1.
    let mut other = fixture_json("mutate-create-other-labels");
    other["request"]["namespace"] = json!("team-a");
    other["request"]["object"]["metadata"]["namespace"] = json!("team-a");
    let labels = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_string(),
        "team-a".to_string(),
    )]);
    let (reply, _) = review_body(
        Hook::Mutate,
        &serde_json::to_vec(&other).unwrap(),
        &policy(Some("team-queue")),
        Some(&labels),
    )
    .unwrap();
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    let ops = serde_json::to_value(patch_of(&reply).unwrap()).unwrap();
    assert!(ops
        .as_array()
        .unwrap()
        .iter()
        .any(|op| op["path"] == "/metadata/labels/switchyard.dev~1queue-name"));
    let object = patched_object(&other, &reply);
    assert_eq!(object["metadata"]["labels"]["app"], "trainer");
    assert_eq!(
        object["metadata"]["labels"]["switchyard.dev/queue-name"],
        "team-queue"
    );
}

#[test]
fn patches_touch_only_what_they_change() {
    for name in [
        "admission-mutate-create-basic",
        "mutate-create-unknown-fields",
        "mutate-create-generate-name",
    ] {
        let case = Case {
            fixture: name,
            hook: Hook::Mutate,
            default_queue: None,
            expect: unchanged(),
        };
        let (review, reply) = run(&case);
        let mut before = review["request"]["object"].clone();
        let mut after = patched_object(&review, &reply);
        for v in [&mut before, &mut after] {
            let spec = v["spec"].as_object_mut().unwrap();
            spec.remove("suspend");
            spec.remove("managedBy");
        }
        assert_eq!(
            before, after,
            "{name}: the patch changed more than suspend and managedBy"
        );
    }
    let review = fixture_json("mutate-create-unknown-fields");
    let (_, reply) = run(&Case {
        fixture: "mutate-create-unknown-fields",
        hook: Hook::Mutate,
        default_queue: None,
        expect: unchanged(),
    });
    let object = patched_object(&review, &reply);
    assert_eq!(object["spec"]["futureField"], json!({"x": 1}));
    assert_eq!(object["metadata"]["futureMeta"], "y");
    assert_eq!(
        object["spec"]["template"]["spec"]["containers"][0]["futureContainerField"],
        true
    );
}

#[test]
fn dry_run_gets_the_same_answer() {
    let dry = fixture_json("mutate-create-dry-run");
    assert_eq!(dry["request"]["dryRun"], true);
    let (dry_reply, _) = review_body(
        Hook::Mutate,
        &fixture("mutate-create-dry-run"),
        &AdmissionPolicy::default(),
        None,
    )
    .unwrap();
    let (real_reply, _) = review_body(
        Hook::Mutate,
        &fixture("admission-mutate-create-basic"),
        &AdmissionPolicy::default(),
        None,
    )
    .unwrap();
    let dry_reply: Value = serde_json::from_slice(&dry_reply).unwrap();
    let real_reply: Value = serde_json::from_slice(&real_reply).unwrap();
    assert_eq!(patch_of(&dry_reply), patch_of(&real_reply));
}

/// The admission gate follows `dispatcherUsernames`, not a built-in name: with another
/// dispatcher configured, the default service account is just another user.
#[test]
fn the_dispatcher_is_whoever_the_policy_names() {
    let answer = |name: &str, dispatchers: &[&str]| {
        let policy = AdmissionPolicy {
            dispatcher_usernames: dispatchers.iter().map(|u| u.to_string()).collect(),
            ..AdmissionPolicy::default()
        };
        let (reply, _) = review_body(Hook::Validate, &fixture(name), &policy, None)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        assert_echo(&fixture_json(name), &reply);
        reply["response"].clone()
    };
    let other = "system:serviceaccount:batch-system:switchyard";
    for name in [
        "validate-update-unsuspend-dispatcher",
        "validate-create-unsuspended-dispatcher",
    ] {
        let response = answer(name, &[other]);
        assert_eq!(response["allowed"], false, "{name}: {response}");
        assert_eq!(response["status"]["code"], 403, "{name}: {response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("spec.suspend"), "{name}: {message}");
        assert_eq!(answer(name, &["alice", other, DISPATCHER])["allowed"], true);
    }
    let response = answer("validate-update-unsuspend-alice-managed", &[other]);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(other) && message.contains("\"alice\""),
        "the denial names who may and who tried: {message}"
    );
    assert_eq!(
        answer("validate-update-unsuspend-alice-managed", &["alice"])["allowed"],
        true
    );
}

const DISPATCHER: &str = "system:serviceaccount:switchyard-system:switchyard";

/// A JobSet review, from tests/fixtures/admission/jobset (captured from kube-apiserver with the
/// real JobSet controller's webhooks in front), through the JobSet hooks.
fn jobset_reply(name: &str, hook: Hook) -> (Value, Value) {
    let name = format!("jobset/{name}");
    let review = fixture_json(&name);
    let (reply, _) = review_body_of(
        Kind::JobSet,
        hook,
        &fixture(&name),
        &AdmissionPolicy::default(),
        None,
    )
    .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let reply: Value = serde_json::from_slice(&reply).expect("reply is JSON");
    assert_echo(&review, &reply);
    (review, reply)
}

#[test]
fn jobsets_are_suspended_made_ours_and_gated_like_jobs() {
    // CREATE with the queue label: suspended (JobSets have no default `suspend`: added) and
    // managed by the dispatcher, so the manager's JobSet controller leaves it alone.
    let (review, reply) = jobset_reply("mutate-create-queued", Hook::Mutate);
    assert!(review["request"]["object"]["spec"].get("suspend").is_none());
    let object = patched_object(&review, &reply);
    assert_eq!(object["spec"]["suspend"], true);
    assert_eq!(object["spec"]["managedBy"], "switchyard.dev/dispatcher");
    // Everything else untouched.
    let mut expected = review["request"]["object"].clone();
    expected["spec"]["suspend"] = json!(true);
    expected["spec"]["managedBy"] = json!("switchyard.dev/dispatcher");
    assert_eq!(object, expected);

    // Without the label: not ours.
    let (_, reply) = jobset_reply("mutate-create-no-queue", Hook::Mutate);
    assert_eq!(reply["response"]["allowed"], true);
    assert!(patch_of(&reply).is_none());

    for allowed in [
        "validate-create-queued",
        "validate-create-no-queue",
        "validate-update-unsuspend-by-dispatcher",
        "validate-update-status-by-dispatcher",
        "validate-delete",
    ] {
        let (_, reply) = jobset_reply(allowed, Hook::Validate);
        assert_eq!(reply["response"]["allowed"], true, "{allowed}: {reply}");
    }
    for not_mutated in [
        "mutate-update-unsuspend-by-user",
        "mutate-update-unsuspend-by-dispatcher",
        "mutate-update-status-by-dispatcher",
        "mutate-delete",
    ] {
        let (_, reply) = jobset_reply(not_mutated, Hook::Mutate);
        assert_eq!(reply["response"]["allowed"], true, "{not_mutated}");
        assert!(patch_of(&reply).is_none(), "{not_mutated}: {reply}");
    }

    // Only the dispatcher may unsuspend: a user is refused, and told why in the JobSet's terms.
    let (_, reply) = jobset_reply("validate-update-unsuspend-by-user", Hook::Validate);
    let response = &reply["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("spec.suspend: Forbidden: only the Switchyard dispatcher")
            && message.contains("a JobSet of queue \"research\"")
            && message.contains("\"alice\""),
        "{message}"
    );
}

#[test]
fn a_review_of_the_other_kind_is_refused_with_a_hint_at_the_configuration() {
    for (hook_kind, fixture, says) in [
        (
            Kind::Job,
            "jobset/validate-create-queued",
            "this webhook reviews batch/v1 Jobs, not jobset.x-k8s.io/v1alpha2 JobSet;",
        ),
        (
            Kind::JobSet,
            "validate-create-mutated",
            "this webhook reviews jobset.x-k8s.io/v1alpha2 JobSets, not batch/v1 Job;",
        ),
    ] {
        let (reply, allowed) = reply_of(hook_kind, Hook::Validate, &fixture_json(fixture));
        assert!(!allowed, "{fixture}");
        let message = reply["response"]["status"]["message"].as_str().unwrap();
        assert!(message.starts_with(says), "{message}");
    }
}

/// A review (as JSON) through `kind`'s `hook`: the reply, and whether it allows.
fn reply_of(kind: Kind, hook: Hook, review: &Value) -> (Value, bool) {
    let body = serde_json::to_vec(review).unwrap();
    let (reply, decision) =
        review_body_of(kind, hook, &body, &AdmissionPolicy::default(), None).unwrap();
    (serde_json::from_slice(&reply).unwrap(), decision.allowed())
}

#[test]
fn a_jobset_managed_by_its_own_controller_is_taken_over_and_another_controllers_is_refused() {
    let review = fixture_json("jobset/mutate-create-queued");
    let with = |managed_by: &str| {
        let mut r = review.clone();
        r["request"]["object"]["spec"]["managedBy"] = json!(managed_by);
        r
    };
    // The reserved value means "the JobSet controller": the mutating hook takes it over.
    let own = with("jobset.sigs.k8s.io/jobset-controller");
    let (reply, _) = reply_of(Kind::JobSet, Hook::Mutate, &own);
    let object = patched_object(&own, &reply);
    assert_eq!(object["spec"]["managedBy"], "switchyard.dev/dispatcher");
    // Someone else's: left as it is, and the validating hook says what to do.
    let mut other = with("kueue.x-k8s.io/multikueue");
    let (reply, _) = reply_of(Kind::JobSet, Hook::Mutate, &other);
    let object = patched_object(&other, &reply);
    assert_eq!(object["spec"]["managedBy"], "kueue.x-k8s.io/multikueue");
    other["request"]["object"] = object;
    let (reply, allowed) = reply_of(Kind::JobSet, Hook::Validate, &other);
    assert!(!allowed);
    let message = reply["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("a JobSet labelled switchyard.dev/queue-name must be managed by")
            && message.contains("to let that controller run the JobSet"),
        "{message}"
    );
}
