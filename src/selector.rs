//! Kubernetes label selector matching (metav1.LabelSelector), as the API server evaluates it.
//!
//! Matching is kube-core's [`Selector`]: for every selector apimachinery accepts it answers as
//! `LabelSelectorAsSelector(s).Matches(labels)` does. [`check`] stays ours: kube-core's
//! conversion accepts selectors apimachinery rejects (`NotIn: []`, `Exists` with values,
//! malformed keys and values), and its errors name neither the key nor the fix.

use crate::api::{is_label_value, is_qualified_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;

/// True when `labels` satisfy `selector`: every `matchLabels` pair and every expression.
/// An empty selector matches everything, as in Kubernetes; one Kubernetes rejects matches
/// nothing.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Compiled::new(selector).is_ok_and(|s| s.matches(labels))
}

/// A selector checked once, to match many label sets (a queue's namespaceSelector, against
/// every Job's namespace).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Compiled {
    /// The selector as written.
    pub(crate) source: LabelSelector,
    selector: Selector,
}

impl Compiled {
    /// The selector, or why Kubernetes would reject it.
    pub(crate) fn new(source: &LabelSelector) -> Result<Self, String> {
        // `check` first: kube-core would let `NotIn: []` match everything, Kubernetes
        // rejects it.
        check(source)?;
        let selector = Selector::try_from(source.clone()).map_err(|e| e.to_string())?;
        Ok(Self {
            source: source.clone(),
            selector,
        })
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }
}

/// Why Kubernetes would reject `selector` (apimachinery's `LabelSelectorAsSelector`), so that
/// it can never be evaluated the way its author meant; checked at start-up.
pub fn check(selector: &LabelSelector) -> Result<(), String> {
    // Key and value syntax: apimachinery's NewRequirement checks it, kube-core does not.
    for (key, value) in selector.match_labels.iter().flatten() {
        if !is_qualified_name(key) {
            return Err(format!("matchLabels: {}", bad_key(key)));
        }
        if !is_label_value(value) {
            return Err(format!("matchLabels[{key}]: {}", bad_value(value)));
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let problem = match e.operator.as_str() {
            _ if !is_qualified_name(&e.key) => Some(bad_key(&e.key)),
            "In" | "NotIn" if values.is_empty() => Some(format!(
                "operator {} needs at least one value in values",
                e.operator
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => Some(format!(
                "operator {} takes no values: remove values, or use In or NotIn",
                e.operator
            )),
            "In" | "NotIn" => values
                .iter()
                .find(|v| !is_label_value(v))
                .map(|v| bad_value(v)),
            "Exists" | "DoesNotExist" => None,
            other => Some(format!(
                "unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)"
            )),
        };
        if let Some(problem) = problem {
            return Err(format!("matchExpressions key {:?}: {problem}", e.key));
        }
    }
    Ok(())
}

fn bad_key(key: &str) -> String {
    format!(
        "{key:?} is not a label key (name or prefix/name: the name at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit; the prefix a DNS subdomain)"
    )
}

fn bad_value(value: &str) -> String {
    format!(
        "{value:?} is not a label value (empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn match_labels_and_expressions_all_apply() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("team", "ml")]).into_iter().collect()),
            match_expressions: Some(vec![
                expr("env", "In", &["prod", "staging"]),
                expr("legacy", "DoesNotExist", &[]),
                expr("tier", "NotIn", &["batch-low"]),
            ]),
        };
        assert!(matches(&sel, &labels(&[("team", "ml"), ("env", "prod")])));
        assert!(!matches(&sel, &labels(&[("team", "ml"), ("env", "dev")])));
        assert!(!matches(&sel, &labels(&[("env", "prod")])));
        assert!(!matches(
            &sel,
            &labels(&[("team", "ml"), ("env", "prod"), ("legacy", "")])
        ));
        assert!(!matches(
            &sel,
            &labels(&[("team", "ml"), ("env", "prod"), ("tier", "batch-low")])
        ));
    }

    #[test]
    fn unknown_operator_matches_nothing_and_is_reported() {
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("a", "Gt", &["1"])]),
            ..Default::default()
        };
        assert!(!matches(&sel, &labels(&[("a", "2")])));
        assert!(check(&sel).unwrap_err().contains("unknown operator"));
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("a", "In", &[])]),
            ..Default::default()
        };
        assert!(check(&sel).unwrap_err().contains("at least one value"));
    }

    #[test]
    fn malformed_keys_and_values_are_reported() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("team name", "ml")])),
            ..Default::default()
        };
        assert!(!matches(&sel, &labels(&[("team name", "ml")])));
        assert!(check(&sel)
            .unwrap_err()
            .contains("\"team name\" is not a label key"));
        let sel = LabelSelector {
            match_expressions: Some(vec![expr("env", "In", &["prod", "-x"])]),
            ..Default::default()
        };
        assert!(check(&sel)
            .unwrap_err()
            .starts_with("matchExpressions key \"env\": \"-x\" is not a label value"));
    }
}

#[cfg(test)]
mod kubernetes_cases;
