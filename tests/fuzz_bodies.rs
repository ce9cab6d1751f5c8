//! Random and mutated bodies thrown at both hooks: always a well-formed reply or a one-line
//! reason for a 4xx, never a panic.

mod common;

use proptest::prelude::*;
use serde_json::{json, Value};
use switchyard::admission::{review_body, AdmissionPolicy, BadReview, Hook};

const FIXTURES: &[&str] = &[
    "admission-mutate-create-basic",
    "admission-validate-update-unsuspend-alice",
    "admission-validate-update-status-external-running-admin",
    "validate-update-unlabel-dispatched",
    "mutate-create-default-namespace",
];

fn check(body: &[u8]) {
    let policy = AdmissionPolicy {
        default_queue: Some("q".into()),
        managed_namespaces: Some(Default::default()),
        ..AdmissionPolicy::default()
    };
    let labels = Default::default();
    for hook in [Hook::Mutate, Hook::Validate] {
        match review_body(hook, body, &policy, Some(&labels)) {
            Ok((reply, decision)) => {
                let reply: Value = serde_json::from_slice(&reply).expect("reply is JSON");
                let response = &reply["response"];
                assert!(response["uid"].as_str().is_some_and(|u| !u.is_empty()));
                assert_eq!(response["allowed"], decision.allowed());
                assert_eq!(response.get("patchType").is_some(), decision.mutated());
                if !decision.allowed() {
                    let code = response["status"]["code"].as_u64().unwrap();
                    assert!((400..600).contains(&code));
                }
            }
            Err(BadReview::Unreadable(line)) => {
                assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            }
            Err(other) => panic!("review_body only returns Unreadable errors: {other:?}"),
        }
    }
}

/// A JSON value of any shape, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zA-Z0-9/._~-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every JSON Pointer in `v`, so a mutation can target any node.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                pointers(
                    c,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                )
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out)
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Truncate(usize),
    FlipByte(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipByte(i, b)),
    ]
}

fn apply(fixture: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut v = common::fixture_json(fixture);
    let mut bytes = None;
    for m in mutations {
        let mut all = Vec::new();
        pointers(&v, String::new(), &mut all);
        match m {
            Mutation::Replace(i, new) => {
                let p = &all[i % all.len()];
                if p.is_empty() {
                    v = new.clone();
                } else if let Some(slot) = v.pointer_mut(p) {
                    *slot = new.clone();
                }
            }
            Mutation::Remove(i) => {
                let p = &all[i % all.len()];
                if let Some((parent, key)) = p.rsplit_once('/') {
                    if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                }
            }
            Mutation::Truncate(_) | Mutation::FlipByte(..) => {}
        }
    }
    for m in mutations {
        let b = bytes.get_or_insert_with(|| serde_json::to_vec(&v).unwrap());
        match m {
            Mutation::Truncate(at) if !b.is_empty() => b.truncate(at % b.len()),
            Mutation::FlipByte(at, x) if !b.is_empty() => {
                let n = b.len();
                b[at % n] ^= x;
            }
            _ => {}
        }
    }
    bytes.unwrap_or_else(|| serde_json::to_vec(&v).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        check(&body);
    }

    #[test]
    fn random_json_never_panics(v in any_json()) {
        check(&serde_json::to_vec(&v).unwrap());
        check(&serde_json::to_vec(&json!({"request": v})).unwrap());
    }

    #[test]
    fn mutated_reviews_never_panic(
        fixture in prop::sample::select(FIXTURES),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        check(&apply(fixture, &mutations));
    }
}
