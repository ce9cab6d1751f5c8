//! What Kubernetes' apimachinery does with a metav1.LabelSelector (`LabelSelectorAsSelector`,
//! `NewRequirement`, `Requirement.Matches`), as a table: the cases of its own tests
//! (labels/selector_test.go, apis/meta/v1/helpers_test.go) restated as selectors a
//! namespaceSelector or objectSelector could hold, plus the rules those tests rely on.

use super::{check, matches};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;

struct Case {
    what: &'static str,
    /// A metav1.LabelSelector, in YAML.
    selector: &'static str,
    /// Whether apimachinery turns it into a selector (an error otherwise).
    valid: bool,
    /// Label sets, `key=value` pairs joined by commas, that it selects.
    selects: &'static [&'static str],
    /// Label sets it does not select (for an invalid selector: none is selected).
    skips: &'static [&'static str],
}

const fn ok(
    what: &'static str,
    selector: &'static str,
    selects: &'static [&'static str],
    skips: &'static [&'static str],
) -> Case {
    Case {
        what,
        selector,
        valid: true,
        selects,
        skips,
    }
}

/// A selector apimachinery refuses; `tempting` are label sets a lax evaluator would select.
const fn refused(
    what: &'static str,
    selector: &'static str,
    tempting: &'static [&'static str],
) -> Case {
    Case {
        what,
        selector,
        valid: false,
        selects: &[],
        skips: tempting,
    }
}

const CASES: &[Case] = &[
    // An empty selector (not a missing one: callers decide what `None` means).
    ok("nothing asked, everything selected", "{}", &["", "x=y"], &[]),
    ok(
        "empty lists ask nothing either",
        "{matchLabels: {}, matchExpressions: []}",
        &["", "x=y"],
        &[],
    ),
    // matchLabels: each pair is an equality requirement.
    ok(
        "one pair",
        "{matchLabels: {x: y}}",
        &["x=y", "x=y,z=w"],
        &["", "x=z", "y=y"],
    ),
    ok(
        "every pair must hold",
        "{matchLabels: {foo: bar, baz: blah}}",
        &["foo=bar,baz=blah", "foo=bar,baz=blah,other=1"],
        &["foo=bar", "baz=blah", "foo=blah,baz=blah", "foo=bar,baz=bar"],
    ),
    ok(
        "a pair whose key the object lacks",
        "{matchLabels: {foo: bar, foobar: bar, baz: blah}}",
        &[],
        &["foo=bar,baz=blah"],
    ),
    ok(
        "the empty value is a value",
        "{matchLabels: {x: ''}}",
        &["x="],
        &["", "x=a"],
    ),
    ok(
        "words that are operators elsewhere are plain keys and values",
        "{matchLabels: {notin: in}}",
        &["notin=in"],
        &["in=notin"],
    ),
    // Exists / DoesNotExist look at the key only.
    ok(
        "Exists",
        "{matchExpressions: [{key: x, operator: Exists}]}",
        &["x=z", "x="],
        &["", "y=z"],
    ),
    ok(
        "DoesNotExist",
        "{matchExpressions: [{key: x, operator: DoesNotExist}]}",
        &["", "y=z"],
        &["x=z", "x="],
    ),
    // In / NotIn.
    ok(
        "In: the key present with a listed value",
        "{matchExpressions: [{key: x, operator: In, values: [abc, def]}]}",
        &["x=abc", "x=def"],
        &["", "x=ghi", "x=", "y=abc"],
    ),
    ok(
        "NotIn: the key missing, or present with another value",
        "{matchExpressions: [{key: x, operator: NotIn, values: [abc, def]}]}",
        &["", "x=ghi", "x=", "y=abc"],
        &["x=abc", "x=def"],
    ),
    ok(
        "In with the empty value wants the key present and empty",
        "{matchExpressions: [{key: x, operator: In, values: ['']}]}",
        &["x="],
        &["", "y=baz", "x=a"],
    ),
    ok(
        "NotIn the empty value, with another key present",
        "{matchExpressions: [{key: x, operator: NotIn, values: ['']}, {key: y, operator: Exists}]}",
        &["y=", "x=a,y="],
        &["x=,y=", ""],
    ),
    ok(
        "DoesNotExist and Exists on two keys",
        "{matchExpressions: [{key: x, operator: DoesNotExist}, {key: y, operator: Exists}]}",
        &["y="],
        &["x=,y=", ""],
    ),
    ok(
        "NotIn on a missing key holds, DoesNotExist on a present one fails",
        "{matchExpressions: [{key: x, operator: NotIn, values: ['']}, {key: y, operator: DoesNotExist}]}",
        &[""],
        &["y="],
    ),
    ok(
        "In and NotIn on two keys, both hold",
        "{matchExpressions: [{key: x, operator: In, values: [foo]}, {key: y, operator: NotIn, values: [alpha]}]}",
        &["x=foo,y=baz", "x=foo"],
        &["x=foo,y=alpha", "y=baz"],
    ),
    ok(
        "two In, one fails",
        "{matchExpressions: [{key: x, operator: In, values: [foo]}, {key: y, operator: In, values: [alpha]}]}",
        &["x=foo,y=alpha"],
        &["x=foo,y=baz"],
    ),
    ok(
        "NotIn with one value is Kubernetes' !=",
        "{matchExpressions: [{key: x, operator: NotIn, values: [y]}, {key: z, operator: NotIn, values: [w]}]}",
        &["x=z,z=a", ""],
        &["x=z,z=w", "x=y"],
    ),
    // matchLabels and matchExpressions together: all of them, ANDed.
    ok(
        "pairs and expressions both hold",
        "{matchLabels: {foo: bar}, matchExpressions: [{key: baz, operator: In, values: [qux, norf]}]}",
        &["foo=bar,baz=qux", "foo=bar,baz=norf"],
        &["foo=bar", "baz=qux", "foo=other,baz=qux", "foo=bar,baz=other"],
    ),
    ok(
        "a pair and an expression on the same key that contradict",
        "{matchLabels: {x: a}, matchExpressions: [{key: x, operator: NotIn, values: [a]}]}",
        &[],
        &["", "x=a", "x=b"],
    ),
    ok(
        "expressions on the same key narrow each other",
        "{matchExpressions: [{key: x, operator: In, values: [a, b]}, {key: x, operator: NotIn, values: [b]}, {key: x, operator: Exists}]}",
        &["x=a"],
        &["x=b", "x=c", ""],
    ),
    // Keys and values as namespaces carry them.
    ok(
        "prefixed keys with dashes and dots",
        "{matchExpressions: [{key: this-is-a-dns.domain.com/key-with-dash, operator: Exists}]}",
        &["this-is-a-dns.domain.com/key-with-dash=x"],
        &["key-with-dash=x"],
    ),
    ok(
        "a prefix of digits and dotted values",
        "{matchExpressions: [{key: 0.1.2.domain/99, operator: NotIn, values: [10.10.100.1, tick.tack.clock]}]}",
        &["0.1.2.domain/99=1.2.3.4", ""],
        &["0.1.2.domain/99=10.10.100.1", "0.1.2.domain/99=tick.tack.clock"],
    ),
    ok(
        "keys may start with a digit",
        "{matchExpressions: [{key: 1foo, operator: In, values: [bar]}, {key: '1234', operator: In, values: [bar]}]}",
        &["1foo=bar,1234=bar"],
        &["1foo=bar"],
    ),
    ok(
        "the namespace name label",
        "{matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kube-public]}]}",
        &["kubernetes.io/metadata.name=default"],
        &["kubernetes.io/metadata.name=kube-system"],
    ),
    // What apimachinery refuses to turn into a selector.
    refused(
        "In without values",
        "{matchExpressions: [{key: x, operator: In}]}",
        &["", "x=a"],
    ),
    refused(
        "NotIn without values",
        "{matchExpressions: [{key: x, operator: NotIn}]}",
        &["", "x=a"],
    ),
    refused(
        "In with an empty list of values",
        "{matchExpressions: [{key: x, operator: In, values: []}]}",
        &["", "x=a"],
    ),
    refused(
        "NotIn with an empty list of values",
        "{matchExpressions: [{key: x, operator: NotIn, values: []}]}",
        &["", "x=a"],
    ),
    refused(
        "Exists with values",
        "{matchExpressions: [{key: baz, operator: Exists, values: [qux, norf]}]}",
        &["baz=qux", "baz=other"],
    ),
    refused(
        "DoesNotExist with values",
        "{matchExpressions: [{key: baz, operator: DoesNotExist, values: [qux]}]}",
        &["", "x=a"],
    ),
    refused(
        "Gt and Lt exist in the selector syntax, not in a LabelSelector",
        "{matchExpressions: [{key: y, operator: Gt, values: ['1']}]}",
        &["y=2"],
    ),
    refused(
        "operators are case-sensitive",
        "{matchExpressions: [{key: x, operator: in, values: [a]}]}",
        &["x=a"],
    ),
    refused(
        "an empty operator",
        "{matchExpressions: [{key: x, operator: ''}]}",
        &["x=a", ""],
    ),
    refused(
        "an empty key",
        "{matchExpressions: [{key: '', operator: DoesNotExist}]}",
        &["", "x=a"],
    ),
    refused(
        "a key with a space",
        "{matchExpressions: [{key: a b, operator: NotIn, values: [c]}]}",
        &["", "x=a"],
    ),
    refused(
        "a key prefix that is not a DNS subdomain",
        "{matchExpressions: [{key: Example.com/x, operator: DoesNotExist}]}",
        &["", "x=a"],
    ),
    refused(
        "a key ending in a dash",
        "{matchLabels: {x-: a}}",
        &["x-=a"],
    ),
    refused(
        "a matchLabels value with a space",
        "{matchLabels: {x: a b}}",
        &["x=a b"],
    ),
    refused(
        "a value starting with a dash",
        "{matchExpressions: [{key: x, operator: NotIn, values: [-a]}]}",
        &["", "x=b"],
    ),
    refused(
        "one bad requirement spoils the selector",
        "{matchLabels: {x: a}, matchExpressions: [{key: y, operator: NotIn}]}",
        &["x=a", "x=a,y=b"],
    ),
];

fn labels(set: &str) -> BTreeMap<String, String> {
    set.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("key=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn selector(yaml: &str) -> LabelSelector {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

#[test]
fn kubernetes_cases() {
    for case in CASES {
        let sel = selector(case.selector);
        let what = case.what;
        assert_eq!(
            check(&sel).is_ok(),
            case.valid,
            "{what}: check gave {:?}",
            check(&sel)
        );
        for set in case.selects {
            assert!(matches(&sel, &labels(set)), "{what}: must select {set:?}");
        }
        for set in case.skips {
            assert!(!matches(&sel, &labels(set)), "{what}: must skip {set:?}");
        }
    }
}

#[test]
fn key_and_value_lengths() {
    // A key's name part and a value: 63 at most. A key's prefix: a DNS subdomain, 253 at most.
    let name = |n: usize| "a".repeat(n);
    let prefix = format!("{}.{}.{}.{}", name(63), name(63), name(63), name(61));
    assert_eq!(prefix.len(), 253);
    let cases = [
        (name(63), name(63), true),
        (name(64), name(1), false),
        (name(254), name(1), false),
        (name(1), name(64), false),
        (format!("{prefix}/{}", name(63)), name(1), true),
        (format!("{prefix}a/{}", name(1)), name(1), false),
        (format!("/{}", name(1)), name(1), false),
        (format!("{}/", name(1)), name(1), false),
    ];
    for (key, value, valid) in cases {
        let sel = LabelSelector {
            match_labels: Some([(key.clone(), value.clone())].into()),
            ..Default::default()
        };
        let (k, v) = (key.len(), value.len());
        assert_eq!(check(&sel).is_ok(), valid, "key of {k}, value of {v}");
        assert_eq!(
            matches(&sel, &[(key, value)].into()),
            valid,
            "key of {k}, value of {v}"
        );
    }
}

/// Why `check` is still ours: kube-core takes these, apimachinery refuses them. If this fails,
/// kube-core has caught up and the matching part of `check` may go.
#[test]
fn kube_core_alone_takes_what_kubernetes_refuses() {
    let everything = labels("");
    for (yaml, selects_empty) in [
        (
            "{matchExpressions: [{key: x, operator: NotIn, values: []}]}",
            true,
        ),
        (
            "{matchExpressions: [{key: x, operator: In, values: []}]}",
            false,
        ),
        (
            "{matchExpressions: [{key: x, operator: DoesNotExist, values: [a]}]}",
            true,
        ),
        (
            "{matchExpressions: [{key: a b, operator: DoesNotExist}]}",
            true,
        ),
        ("{matchLabels: {x: a b}}", false),
    ] {
        let sel = selector(yaml);
        let lax = Selector::try_from(sel.clone()).expect(yaml);
        assert_eq!(lax.matches(&everything), selects_empty, "{yaml}");
        assert!(check(&sel).is_err(), "{yaml}");
        assert!(!matches(&sel, &everything), "{yaml}");
    }
}

/// An absent `values` and `values: []` are the same to Kubernetes (Go's nil and empty slice),
/// not to serde: both must be refused.
#[test]
fn absent_and_empty_values_read_apart() {
    let absent = selector("{matchExpressions: [{key: x, operator: In}]}");
    let empty = selector("{matchExpressions: [{key: x, operator: In, values: []}]}");
    assert_ne!(absent, empty);
    assert!(check(&absent).is_err() && check(&empty).is_err());
}
