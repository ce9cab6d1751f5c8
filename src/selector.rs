//! Kubernetes label selector matching (metav1.LabelSelector), as the API server evaluates it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// True when `labels` satisfy `selector`: every `matchLabels` pair and every expression.
/// An empty selector matches everything, as in Kubernetes.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs_match
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                // The API server rejects other operators; a selector that slipped through
                // must not match everything.
                _ => false,
            }
        })
}

/// Why a selector can never be evaluated the way its author meant; checked at start-up.
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
