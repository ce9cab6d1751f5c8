//! A gang's pods kept one to a node: the required pod anti-affinity that training Jobs use to
//! give each pod a node of its own (`topologyKey: kubernetes.io/hostname`, a selector that
//! matches the Job's own pods). kube-scheduler's InterPodAffinity plugin then never binds two
//! of them to one node, so a gang of 8 needs 8 nodes with room for one pod each, not room for
//! 8 pods. Placement models this one form exactly: at most one pod of the gang per node.
//!
//! The same holds of a topology spread constraint that spreads a gang's pods over nodes
//! (`topologyKey: kubernetes.io/hostname`, `whenUnsatisfiable: DoNotSchedule`, a selector
//! that matches the pod itself): kube-scheduler's PodTopologySpread binds a pod only to a node
//! whose count of such pods, the pod included, exceeds the least count on any node it counts
//! by at most `maxSkew` ([`Spread`]; the fit is `super::fit`'s).
//!
//! A required pod affinity to the gang's own pods (a selector that matches the pod itself, any
//! topology key: `topology.kubernetes.io/zone`, a rack label, the hostname) keeps the gang
//! together: InterPodAffinity binds the first pod to any node that has the key (no pod like it
//! is anywhere yet), and every later one only where the earlier ones are, so the whole gang
//! lands in one domain of the key (one value of the label; of every key, when several terms
//! ask). Placement fits the gang in one such domain ([`Apart::together`]).
//!
//! Any other required anti-affinity term or spread constraint (another topology key, a
//! selector that matches other pods, namespaces chosen by labels, `ScheduleAnyway`, which
//! only scores), and any pod affinity term over other pods, is not modelled: it concerns pods
//! placement does not see (what runs on the nodes is known as amounts, not as labelled pods),
//! and the pod is placed without it; `simulate` and `explain` say so.

use super::pod::{
    AffinityView, LabelSelectorView, PodAffinityTermView, PodSpecView, RequiredTermsView,
    SpreadConstraintView,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::BTreeMap;

/// The node label kube-scheduler's hostname topology is keyed by: one domain per node.
pub(crate) const HOSTNAME: &str = "kubernetes.io/hostname";

/// What placement makes of a pod's required anti-affinity and topology spread constraints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Apart {
    /// Some term keeps the pods one to a node.
    pub(crate) one_per_node: bool,
    /// The spread of the pods over nodes, if a constraint asks for one.
    pub(crate) spread: Option<Spread>,
    /// The topology keys of the required pod affinity terms that keep the gang together: all
    /// its pods in one domain, the nodes with the same value of each key (in the order of the
    /// terms, each key once). Empty when none does.
    pub(crate) together: Vec<String>,
    /// The terms and constraints placement does not model.
    pub(crate) unmodelled: Vec<Unmodelled>,
}

/// A term or constraint placement does not model, by its index in its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Unmodelled {
    /// In `affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    AntiAffinity(usize),
    /// In `topologySpreadConstraints`.
    Spread(usize),
    /// In `affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    Affinity(usize),
}

/// A gang's pods spread over nodes: a pod is bound only to a node whose count of the gang's
/// pods, with it, is at most `max_skew` above the least count on the nodes counted (0 when
/// fewer than `min_domains` are counted). The nodes counted are those whose labels the pod's
/// node selector and required node affinity accept (unless `nodeAffinityPolicy: Ignore`) and,
/// with `nodeTaintsPolicy: Honor`, whose taints it tolerates; a node it cannot run on for
/// lack of room, or for a taint it does not tolerate under the default policy, still counts,
/// with none of the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spread {
    pub(crate) max_skew: u32,
    pub(crate) min_domains: u32,
    pub(crate) honor_affinity: bool,
    pub(crate) honor_taints: bool,
}

/// A pod affinity or anti-affinity term, as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Term<'a> {
    /// It is about pods like this one (of its namespace, matched by its selector), in the
    /// domains of this topology key.
    Own(&'a str),
    /// It matches no pod (no label selector): it rules nothing out.
    Vacuous,
    /// It concerns pods placement does not see.
    Unmodelled,
}

/// The pod's required anti-affinity terms.
fn anti_terms(spec: &PodSpecView) -> &[PodAffinityTermView] {
    required(spec, |a| a.pod_anti_affinity.as_ref())
}

/// The pod's required affinity terms.
fn affinity_terms(spec: &PodSpecView) -> &[PodAffinityTermView] {
    required(spec, |a| a.pod_affinity.as_ref())
}

/// The required terms of the pod's affinity or anti-affinity, as `which` picks it.
fn required<'s>(
    spec: &'s PodSpecView,
    which: impl Fn(&'s AffinityView) -> Option<&'s RequiredTermsView>,
) -> &'s [PodAffinityTermView] {
    (spec.affinity.as_ref().and_then(which))
        .map(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_slice()
        })
        .unwrap_or_default()
}

/// Whether the pod has required pod (anti-)affinity terms or spread constraints (without
/// them, [`judge`] finds nothing).
pub(crate) fn has_terms(spec: &PodSpecView) -> bool {
    !anti_terms(spec).is_empty()
        || !affinity_terms(spec).is_empty()
        || !spec.topology_spread_constraints.is_empty()
}

/// The required anti-affinity and spread constraints of a pod with `labels` in `namespace`
/// whose spec is `spec`.
pub(crate) fn judge(
    spec: &PodSpecView,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Apart {
    let mut out = Apart::default();
    for (i, t) in anti_terms(spec).iter().enumerate() {
        match term(t, labels, namespace) {
            Term::Own(HOSTNAME) => out.one_per_node = true,
            Term::Vacuous => {}
            // Apart in wider domains than nodes, or from other pods.
            Term::Own(_) | Term::Unmodelled => out.unmodelled.push(Unmodelled::AntiAffinity(i)),
        }
    }
    for (i, c) in spec.topology_spread_constraints.iter().enumerate() {
        match constraint(c, labels) {
            // One spread is modelled: a second is named, not combined.
            Some(Some(s)) if out.spread.is_none() => out.spread = Some(s),
            Some(None) => {}
            _ => out.unmodelled.push(Unmodelled::Spread(i)),
        }
    }
    for (i, t) in affinity_terms(spec).iter().enumerate() {
        match term(t, labels, namespace) {
            // A gang kept together and spread over nodes is not combined: the spread is
            // modelled, the term named.
            Term::Own(key) if out.spread.is_none() => {
                if !out.together.iter().any(|k| k == key) {
                    out.together.push(key.to_string());
                }
            }
            // A null selector matches no pod, not even the pod itself: the first pod of the
            // gang never finds one to go beside, and kube-scheduler binds none of them.
            Term::Own(_) | Term::Vacuous | Term::Unmodelled => {
                out.unmodelled.push(Unmodelled::Affinity(i))
            }
        }
    }
    out
}

/// What a spread constraint makes of pods with `labels` (spreads count pods of the pod's own
/// namespace): `Some(Some(_))` a spread of pods like it over nodes, `Some(None)` nothing
/// (its selector matches no pod), `None` something placement does not model.
fn constraint(
    c: &SpreadConstraintView,
    labels: &BTreeMap<String, String>,
) -> Option<Option<Spread>> {
    // A null selector matches no pod: every count is 0, and so is every skew.
    let Some(selector) = &c.label_selector else {
        return Some(None);
    };
    // `matchLabelKeys` adds `key in (the pod's value)`, which the pod itself always meets.
    let hard = c.when_unsatisfiable != "ScheduleAnyway";
    let modelled = hard
        && c.topology_key == HOSTNAME
        && c.max_skew >= 1
        && crate::selector::matches(&as_selector(selector), labels);
    modelled.then(|| {
        Some(Spread {
            max_skew: c.max_skew.unsigned_abs(),
            min_domains: c.min_domains.map_or(1, |m| m.max(1).unsigned_abs()),
            honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        })
    })
}

/// Whether the term is about pods with `labels` in `namespace` themselves (and in which
/// domains), as kube-scheduler's InterPodAffinity reads it.
fn term<'a>(
    t: &'a PodAffinityTermView,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Term<'a> {
    // A null selector matches no pod.
    let Some(selector) = &t.label_selector else {
        return Term::Vacuous;
    };
    // The namespaces the term looks in: `namespaces` and those `namespaceSelector` picks
    // (an empty one picks every namespace); neither given, the pod's own.
    let own_namespace = match &t.namespace_selector {
        Some(s) if is_empty(s) => true,
        Some(_) if t.namespaces.iter().any(|n| n == namespace) => true,
        // Namespaces picked by their labels, which placement does not know.
        Some(_) => return Term::Unmodelled,
        None => t.namespaces.is_empty() || t.namespaces.iter().any(|n| n == namespace),
    };
    // `mismatchLabelKeys` adds `key notin (the pod's value)`: never the pod itself.
    // (`matchLabelKeys` adds `key in (the pod's value)`, which the pod itself always meets.)
    let mismatched = t.mismatch_label_keys.iter().any(|k| labels.contains_key(k));
    let matches_itself =
        own_namespace && !mismatched && crate::selector::matches(&as_selector(selector), labels);
    if matches_itself && !t.topology_key.is_empty() {
        Term::Own(&t.topology_key)
    } else {
        Term::Unmodelled
    }
}

fn is_empty(s: &LabelSelectorView) -> bool {
    s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

fn as_selector(s: &LabelSelectorView) -> LabelSelector {
    LabelSelector {
        match_labels: s.match_labels.clone(),
        match_expressions: s.match_expressions.as_ref().map(|list| {
            list.iter()
                .map(|r| LabelSelectorRequirement {
                    key: r.key.clone(),
                    operator: r.operator.clone(),
                    values: (!r.values.is_empty()).then(|| r.values.clone()),
                })
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(terms: serde_json::Value) -> PodSpecView {
        serde_json::from_value(json!({
            "containers": [{"name": "c"}],
            "affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": terms,
            }},
        }))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn judged(terms: serde_json::Value) -> Apart {
        judge(
            &spec(terms),
            &labels(&[("job-name", "train"), ("app", "llm")]),
            "ml",
        )
    }

    #[test]
    fn a_term_on_the_hostname_that_matches_the_pod_itself_keeps_one_per_node() {
        for selector in [
            json!({"matchLabels": {"job-name": "train"}}),
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["llm", "x"]}]}),
            json!({"matchExpressions": [{"key": "job-name", "operator": "Exists"}]}),
            json!({}),
        ] {
            let apart = judged(json!([{"labelSelector": selector, "topologyKey": HOSTNAME}]));
            assert_eq!(
                apart,
                Apart {
                    one_per_node: true,
                    ..Apart::default()
                },
                "{selector}"
            );
        }
        // Namespaces that include the pod's own, every namespace, `matchLabelKeys`.
        for extra in [
            json!({"namespaces": ["ml", "other"]}),
            json!({"namespaceSelector": {}}),
            json!({"namespaceSelector": {"matchLabels": {"team": "a"}}, "namespaces": ["ml"]}),
            json!({"matchLabelKeys": ["job-name"]}),
            json!({"mismatchLabelKeys": ["not-on-the-pod"]}),
        ] {
            let mut t =
                json!({"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": HOSTNAME});
            t.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            assert!(judged(json!([t])).one_per_node, "{extra}");
        }
    }

    #[test]
    fn other_terms_are_named_as_not_modelled() {
        let apart = judged(json!([
            // Another domain than the node.
            {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": "topology.kubernetes.io/zone"},
            // Other pods.
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME},
            // Other namespaces only, or namespaces by label.
            {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": HOSTNAME, "namespaces": ["prod"]},
            {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": HOSTNAME, "namespaceSelector": {"matchLabels": {"team": "a"}}},
            // Never the pod itself.
            {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": HOSTNAME, "mismatchLabelKeys": ["job-name"]},
            // A null selector matches nothing: no constraint at all.
            {"topologyKey": HOSTNAME},
        ]));
        assert_eq!(
            apart,
            Apart {
                unmodelled: (0..5).map(Unmodelled::AntiAffinity).collect(),
                ..Apart::default()
            }
        );
        // One modelled term among others.
        let apart = judged(json!([
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME},
            {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": HOSTNAME},
        ]));
        assert_eq!(
            apart,
            Apart {
                one_per_node: true,
                unmodelled: vec![Unmodelled::AntiAffinity(0)],
                ..Apart::default()
            }
        );
        assert_eq!(judged(json!([])), Apart::default());
    }
}
