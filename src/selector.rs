//! Kubernetes label selector matching (metav1.LabelSelector), as the API server evaluates it.
//!
//! Matching is kube-core's [`Selector`]: for every selector apimachinery accepts it answers as
//! `LabelSelectorAsSelector(s).Matches(labels)` does. [`check`] stays ours: kube-core's
//! conversion accepts selectors apimachinery rejects, and its errors name neither the key nor
//! the fix.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;

/// True when `labels` satisfy `selector`: every `matchLabels` pair and every expression.
/// An empty selector matches everything, as in Kubernetes; one Kubernetes rejects matches
/// nothing.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    // `check` first: kube-core would let `NotIn: []` match everything, Kubernetes rejects it.
    check(selector).is_ok() && Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// Why Kubernetes would reject `selector` (apimachinery's `LabelSelectorAsSelector`), so that
/// it can never be evaluated the way its author meant; checked at start-up.
pub fn check(selector: &LabelSelector) -> Result<(), String> {
    for e in selector.match_expressions.iter().flatten() {
        let n = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                return Err(format!(
                    "matchExpressions key {:?}: operator {} needs at least one value",
                    e.key, e.operator
                ))
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                return Err(format!(
                    "matchExpressions key {:?}: operator {} takes no values",
                    e.key, e.operator
                ))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "matchExpressions key {:?}: unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)",
                    e.key
                ))
            }
        }
    }
    Ok(())
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
}
