use crate::rng::Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::conformance::{check_vectors, run_case, run_cases, Case, CaseResult};
use super::*;

fn mask(ids: &[u32]) -> NumaMask {
    NumaMask::from_ids(ids.iter().copied()).unwrap()
}

fn hint(ids: &[u32], preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: Some(mask(ids)),
        preferred,
    }
}

fn free(preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: None,
        preferred,
    }
}

fn provider(resources: &[(&str, Option<Vec<TopologyHint>>)]) -> ProviderHints {
    resources
        .iter()
        .map(|(name, hints)| ((*name).to_owned(), hints.clone()))
        .collect()
}

fn two_nodes() -> NumaInfo {
    NumaInfo::new(vec![0, 1])
}

fn run(policy: Policy, providers: &[ProviderHints]) -> MergeResult {
    merge(policy, &PolicyOptions::default(), &two_nodes(), providers)
}

// ---- NumaMask --------------------------------------------------------------

#[test]
fn mask_basics() {
    let m = mask(&[3, 0, 63]);
    assert_eq!(m.count(), 3);
    assert_eq!(m.ids().collect::<Vec<_>>(), vec![0, 3, 63]);
    assert!(m.contains(63) && !m.contains(1) && !m.contains(64));
    assert!(mask(&[0]).is_subset_of(m));
    assert_eq!(
        NumaMask::from_ids([64]),
        Err(ConfigError::InvalidNumaId(64))
    );
    assert!(NumaMask::EMPTY.is_empty());
}

#[test]
fn narrower_means_fewer_nodes_then_smaller_value() {
    assert!(mask(&[7]).is_narrower_than(mask(&[0, 1])));
    // By value, not by lowest node: {1,2} = 0b0110 beats {0,3} = 0b1001.
    assert!(mask(&[1, 2]).is_narrower_than(mask(&[0, 3])));
    assert!(!mask(&[0, 3]).is_narrower_than(mask(&[1, 2])));
    assert!(!mask(&[1]).is_narrower_than(mask(&[1])));
}

#[test]
fn average_distance_includes_the_diagonal() {
    let mut d = BTreeMap::new();
    d.insert(0, vec![10, 20]);
    d.insert(1, vec![20, 10]);
    let info = NumaInfo::with_distances(vec![0, 1], d);
    assert_eq!(info.average_distance(mask(&[0, 1])), Some(15.0));
    assert_eq!(info.average_distance(mask(&[1])), Some(10.0));
    assert_eq!(info.average_distance(NumaMask::EMPTY), Some(0.0));
    assert_eq!(info.average_distance(mask(&[2])), None);
}

#[test]
fn module_example() {
    let cpu = provider(&[("cpu", Some(vec![hint(&[0], true), hint(&[1], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[1], true), hint(&[0, 1], false)]))]);
    let out = merge(
        Policy::Restricted,
        &PolicyOptions::default(),
        &NumaInfo::new(vec![0, 1]),
        &[cpu, gpu],
    );
    assert_eq!(out.hint, hint(&[1], true));
    assert!(out.admit);
}

// ---- rules of the Topology Manager design doc (KEP-693) ---------------------

#[test]
fn doc_merge_is_a_bitwise_and_and_narrowest_preferred_wins() {
    // "The hint affinities are merged ... by performing a bitwise AND ...
    // The hint with the narrowest preferred affinity is returned."
    let cpu = provider(&[(
        "cpu",
        Some(vec![
            hint(&[0], true),
            hint(&[1], true),
            hint(&[0, 1], false),
        ]),
    )]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0], true), hint(&[1], true)]))]);
    let out = run(Policy::BestEffort, &[cpu, gpu]);
    assert_eq!(out.hint, hint(&[0], true));
    assert!(out.admit);
}

#[test]
fn doc_one_unpreferred_hint_makes_the_merge_unpreferred() {
    // "The preferred field on the merged hint is set to false if any of the
    // hints in the permutation returned a false preferred."
    let cpu = provider(&[("cpu", Some(vec![hint(&[0, 1], false)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0, 1], true)]))]);
    let out = run(Policy::BestEffort, &[cpu.clone(), gpu.clone()]);
    assert_eq!(out.hint, hint(&[0, 1], false));
    assert!(out.admit, "best-effort admits regardless");
    let out = run(Policy::Restricted, &[cpu, gpu]);
    assert_eq!(out.hint, hint(&[0, 1], false));
    assert!(!out.admit, "restricted rejects an unpreferred hint");
}

#[test]
fn doc_no_nonempty_merge_gives_all_nodes_unpreferred() {
    // "If no hint with at least one NUMA Node set is found, return a default
    // hint which is a hint with all NUMA Nodes set and preferred set to false."
    let cpu = provider(&[("cpu", Some(vec![hint(&[0], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[1], true)]))]);
    let out = run(Policy::Restricted, &[cpu, gpu]);
    assert_eq!(out.hint, hint(&[0, 1], false));
    assert!(!out.admit);
}

#[test]
fn doc_single_numa_node_filters_to_single_node_hints() {
    // "Filters the list of hints ... to only include hints with a single NUMA
    // node and nil NUMA nodes."
    let cpu = provider(&[("cpu", Some(vec![hint(&[0, 1], true), hint(&[1], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0, 1], true), hint(&[0], true)]))]);
    let out = run(Policy::SingleNumaNode, &[cpu.clone(), gpu.clone()]);
    assert_eq!(out.hint, free(false), "no single node fits both");
    assert!(!out.admit);
    // best-effort would have settled on both nodes, preferred.
    assert_eq!(
        run(Policy::BestEffort, &[cpu, gpu]).hint,
        hint(&[0, 1], true)
    );
}

#[test]
fn doc_single_numa_node_admits_a_preferred_single_node() {
    let cpu = provider(&[("cpu", Some(vec![hint(&[0], true), hint(&[1], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[1], true), hint(&[0, 1], false)]))]);
    let out = run(Policy::SingleNumaNode, &[cpu, gpu]);
    assert_eq!(out.hint, hint(&[1], true));
    assert!(out.admit);
}

#[test]
fn doc_none_policy_admits_without_affinity() {
    let cpu = provider(&[("cpu", Some(vec![hint(&[0], true)]))]);
    let out = run(Policy::None, &[cpu]);
    assert_eq!(
        out,
        MergeResult {
            hint: free(false),
            admit: true
        }
    );
}

#[test]
fn providers_without_preference() {
    // No providers at all: the one empty combination merges to every node.
    assert_eq!(run(Policy::Restricted, &[]).hint, hint(&[0, 1], true));
    // An empty provider and a `None` resource are "any node, preferred".
    let out = run(
        Policy::Restricted,
        &[ProviderHints::new(), provider(&[("cpu", None)])],
    );
    assert_eq!(out.hint, hint(&[0, 1], true));
    // single-numa-node reports an all-nodes result as no affinity.
    let out = run(Policy::SingleNumaNode, &[ProviderHints::new()]);
    assert_eq!(
        out,
        MergeResult {
            hint: free(true),
            admit: true
        }
    );
}

#[test]
fn empty_resource_list_means_no_possible_allocation() {
    let cpu = provider(&[("cpu", Some(vec![]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[1], true)]))]);
    let out = run(Policy::Restricted, &[cpu, gpu]);
    assert_eq!(out.hint, hint(&[1], false));
    assert!(!out.admit);
}

#[test]
fn differing_preferred_masks_do_not_merge_preferred() {
    // {0} & {0,1} = {0}, but preferred needs equal affinities.
    let cpu = provider(&[("cpu", Some(vec![hint(&[0], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0, 1], true)]))]);
    assert_eq!(run(Policy::BestEffort, &[cpu, gpu]).hint, hint(&[0], false));
}

#[test]
fn unpreferred_choice_aims_at_widest_narrowest_hint() {
    // Narrowest hints: 1 node for cpu, 2 for gpu, so aim at 2 nodes even
    // though a 1-node merge is reachable.
    let info = NumaInfo::new(vec![0, 1, 2, 3]);
    let cpu = provider(&[(
        "cpu",
        Some(vec![hint(&[0], true), hint(&[0, 1, 2, 3], false)]),
    )]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0, 1], false), hint(&[2, 3], true)]))]);
    let out = merge(
        Policy::BestEffort,
        &PolicyOptions::default(),
        &info,
        &[cpu, gpu],
    );
    assert_eq!(out.hint, hint(&[0, 1], false));
}

#[test]
fn prefer_closest_breaks_count_ties_by_distance() {
    let mut d = BTreeMap::new();
    d.insert(0, vec![10, 30, 12, 30]);
    d.insert(1, vec![30, 10, 30, 12]);
    d.insert(2, vec![12, 30, 10, 30]);
    d.insert(3, vec![30, 12, 30, 10]);
    let info = NumaInfo::with_distances(vec![0, 1, 2, 3], d);
    let cpu = provider(&[("cpu", Some(vec![hint(&[0, 1], true), hint(&[0, 2], true)]))]);
    let gpu = provider(&[("gpu", Some(vec![hint(&[0, 1], true), hint(&[0, 2], true)]))]);
    let providers = [cpu, gpu];
    let plain = merge(
        Policy::BestEffort,
        &PolicyOptions::default(),
        &info,
        &providers,
    );
    assert_eq!(plain.hint, hint(&[0, 1], true));
    let closest = PolicyOptions {
        prefer_closest_numa: true,
        ..PolicyOptions::default()
    };
    let out = merge(Policy::BestEffort, &closest, &info, &providers);
    assert_eq!(out.hint, hint(&[0, 2], true));
    // single-numa-node ignores the option.
    let out = merge(Policy::SingleNumaNode, &closest, &info, &providers);
    assert_eq!(out.hint, free(false));
}

#[test]
fn hint_bits_outside_the_machine_are_clipped() {
    let cpu = provider(&[("cpu", Some(vec![hint(&[1, 5], true)]))]);
    assert_eq!(run(Policy::BestEffort, &[cpu]).hint, hint(&[1], true));
    let cpu = provider(&[("cpu", Some(vec![hint(&[5], true)]))]);
    assert_eq!(run(Policy::BestEffort, &[cpu]).hint, hint(&[0, 1], false));
}

// ---- configuration checks ---------------------------------------------------

#[test]
fn validation_errors() {
    let opts = PolicyOptions::default();
    let nine = NumaInfo::new((0..9).collect());
    assert!(matches!(
        validate(Policy::BestEffort, &opts, &nine),
        Err(ConfigError::TooManyNumaNodes { found: 9, max: 8 })
    ));
    assert_eq!(validate(Policy::None, &opts, &nine), Ok(()));
    let closest = PolicyOptions {
        prefer_closest_numa: true,
        ..PolicyOptions::default()
    };
    assert_eq!(
        validate(Policy::None, &closest, &two_nodes()),
        Err(ConfigError::MissingDistances(0))
    );
    assert!(matches!(
        PolicyOptions::from_pairs([(MAX_ALLOWABLE_NUMA_NODES, "4")]),
        Err(ConfigError::MaxAllowableTooSmall(4))
    ));
    assert!(matches!(
        PolicyOptions::from_pairs([("foo", "true")]),
        Err(ConfigError::UnknownOption(_))
    ));
    assert!(matches!(
        PolicyOptions::from_pairs([(PREFER_CLOSEST_NUMA_NODES, "yes")]),
        Err(ConfigError::BadOptionValue { .. })
    ));
    let opts = PolicyOptions::from_pairs([
        (PREFER_CLOSEST_NUMA_NODES, "T"),
        (MAX_ALLOWABLE_NUMA_NODES, "16"),
    ]);
    assert_eq!(
        opts,
        Ok(PolicyOptions {
            prefer_closest_numa: true,
            max_allowable_numa_nodes: 16
        })
    );
    assert!(matches!(
        "spread".parse::<Policy>(),
        Err(ConfigError::UnknownPolicy(_))
    ));
    assert_eq!(
        "single-numa-node".parse::<Policy>(),
        Ok(Policy::SingleNumaNode)
    );
}

// ---- case format --------------------------------------------------------------

fn run_json(case: &str) -> CaseResult {
    let case: Case = serde_json::from_str(case).unwrap();
    run_case(&case)
}

/// Past 20 NUMA nodes, a case of more combinations than are merged in a second is answered
/// with an error that says so, not after hours (or a failed allocation, as before).
#[test]
fn a_case_past_reach_is_an_error_that_says_why() {
    let nodes: Vec<u32> = (0..64).collect();
    let mut rng = Rng::new(7);
    let mut resources = serde_json::Map::new();
    for r in 0..8 {
        let hints: Vec<serde_json::Value> = (0..32)
            .map(|_| {
                let ids: Vec<u32> = nodes.iter().copied().filter(|_| rng.percent(50)).collect();
                serde_json::json!({"numa": ids, "preferred": false})
            })
            .collect();
        resources.insert(format!("r{r}"), hints.into());
    }
    let case = serde_json::json!({
        "policy": "best-effort",
        "options": {"max-allowable-numa-nodes": 64},
        "numa_nodes": nodes,
        "providers": [resources],
    });
    let r = run_json(&case.to_string());
    let error = r.error.unwrap_or_default();
    assert!(
        error.starts_with(
            "64 NUMA nodes and 1.100e12 combinations of hints: where the hints name more than 20 NUMA nodes"
        ),
        "{error}"
    );
    // The same on 20 nodes is merged.
    let mut small = case.clone();
    small["numa_nodes"] = (0..20).collect::<Vec<u32>>().into();
    small["options"] = serde_json::json!({"max-allowable-numa-nodes": 20});
    assert_eq!(run_json(&small.to_string()).error, None);
}

#[test]
fn case_format_no_preference_spellings() {
    let r = run_json(
        r#"{"policy":"restricted","numa_nodes":[0,1],
            "providers":[null,{},{"cpu":null,"gpu":[{"numa":[1],"preferred":true},{"preferred":true}]}]}"#,
    );
    assert_eq!(r.affinity, Some(vec![1]));
    assert!(r.preferred && r.admit && r.error.is_none());
}

#[test]
fn case_format_empty_list_vs_empty_mask() {
    // [] resource: no possible allocation.
    let r = run_json(r#"{"policy":"best-effort","numa_nodes":[0,1],"providers":[{"cpu":[]}]}"#);
    assert_eq!((r.affinity, r.preferred), (Some(vec![0, 1]), false));
    // numa [] is an empty mask: it merges to nothing.
    let r = run_json(
        r#"{"policy":"best-effort","numa_nodes":[0,1],"providers":[{"cpu":[{"numa":[],"preferred":true}]}]}"#,
    );
    assert_eq!((r.affinity, r.preferred), (Some(vec![0, 1]), false));
    // numa null is no affinity: every node, preferred.
    let r = run_json(
        r#"{"policy":"best-effort","numa_nodes":[0,1],"providers":[{"cpu":[{"numa":null,"preferred":true}]}]}"#,
    );
    assert_eq!((r.affinity, r.preferred), (Some(vec![0, 1]), true));
}

#[test]
fn case_format_options() {
    let ok = |opts: &str| {
        run_json(&format!(
            r#"{{"policy":"restricted","numa_nodes":[0,1],"providers":[],"options":{opts}}}"#
        ))
        .error
        .is_none()
    };
    assert!(ok("null"));
    assert!(ok("{}"));
    assert!(ok(
        r#"{"prefer-closest-numa-nodes":null,"max-allowable-numa-nodes":null}"#
    ));
    assert!(ok(
        r#"{"prefer-closest-numa-nodes":false,"max-allowable-numa-nodes":8}"#
    ));
    assert!(ok(r#"{"max-allowable-numa-nodes":"16"}"#));
    assert!(!ok(r#"{"max-allowable-numa-nodes":7}"#));
    assert!(!ok(r#"{"max-allowable-numa-nodes":-1}"#));
    assert!(!ok(r#"{"prefer-closest-numa-nodes":true}"#), "no distances");
    assert!(!ok(r#"{"bogus-option":true}"#));
    assert!(!ok(r#"{"prefer-closest-numa-nodes":3}"#));
    let r = run_json(r#"{"policy":"spread","numa_nodes":[0],"providers":[]}"#);
    assert_eq!(
        r,
        CaseResult {
            affinity: None,
            preferred: false,
            admit: false,
            error: r.error.clone()
        }
    );
    assert!(r.error.is_some());
}

#[test]
fn result_serialization() {
    let out = run_cases(
        r#"[{"policy":"none","numa_nodes":[0],"providers":[]},
            {"policy":"best-effort","numa_nodes":[1,0],"providers":[]},
            {"policy":"bogus","numa_nodes":[0],"providers":[]},
            {"numa_nodes":"not a list"}]"#,
    )
    .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "[");
    assert_eq!(
        lines[1],
        r#"{"affinity":null,"preferred":false,"admit":true},"#
    );
    assert_eq!(
        lines[2],
        r#"{"affinity":[0,1],"preferred":true,"admit":true},"#
    );
    assert!(lines[3].starts_with(r#"{"affinity":null,"preferred":false,"admit":false,"error":"#));
    assert!(lines[4].contains(r#""error":"invalid case"#));
    assert_eq!(lines[5], "]");
    assert_eq!(run_cases("[]").unwrap(), "[\n]\n");
    assert!(run_cases("{}").is_err());
}

// ---- agreement with the kubelet's cross product ------------------------------

/// The kubelet's algorithm, literally: every combination, merged and
/// compared one by one.
#[allow(clippy::float_cmp)]
fn cross_product(
    policy: Policy,
    options: &PolicyOptions,
    info: &NumaInfo,
    providers: &[ProviderHints],
) -> MergeResult {
    let all = info.default_mask();
    let mut lists: Vec<Vec<TopologyHint>> = Vec::new();
    for p in providers {
        if p.is_empty() {
            lists.push(vec![free(true)]);
        }
        for hints in p.values() {
            lists.push(match hints {
                None => vec![free(true)],
                Some(h) if h.is_empty() => vec![free(false)],
                Some(h) => h.clone(),
            });
        }
    }
    if policy == Policy::None {
        return MergeResult {
            hint: free(false),
            admit: true,
        };
    }
    if policy == Policy::SingleNumaNode {
        for l in &mut lists {
            l.retain(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1));
        }
    }
    let closest = options.prefer_closest_numa && policy != Policy::SingleNumaNode;
    let fitter = |a: NumaMask, b: NumaMask| -> NumaMask {
        if a == b {
            return a;
        }
        if closest && a.count() == b.count() {
            let (da, db) = (
                info.average_distance(a).unwrap_or(f64::INFINITY),
                info.average_distance(b).unwrap_or(f64::INFINITY),
            );
            if da == db {
                return if a.0 < b.0 { a } else { b };
            }
            return if da < db { a } else { b };
        }
        if a.is_narrower_than(b) {
            a
        } else {
            b
        }
    };
    let aim = lists
        .iter()
        .filter_map(|l| {
            l.iter()
                .filter_map(|h| h.affinity)
                .map(NumaMask::count)
                .min()
        })
        .max()
        .unwrap_or(0);
    let compare = |cur: Option<(NumaMask, bool)>, cand: (NumaMask, bool)| {
        if cand.0.is_empty() {
            return cur;
        }
        let Some(cur) = cur else { return Some(cand) };
        let pick = |m: NumaMask| if m == cur.0 { cur } else { cand };
        Some(match (cur.1, cand.1) {
            (false, true) => cand,
            (true, false) => cur,
            (true, true) => pick(fitter(cur.0, cand.0)),
            (false, false) => {
                let (c, n) = (cur.0.count(), cand.0.count());
                if c > aim {
                    pick(fitter(cur.0, cand.0))
                } else if c == aim {
                    if n == aim {
                        pick(fitter(cur.0, cand.0))
                    } else {
                        cur
                    }
                } else if n > aim {
                    cur
                } else if n == aim || n > c {
                    cand
                } else if n < c {
                    cur
                } else {
                    pick(fitter(cur.0, cand.0))
                }
            }
        })
    };
    let mut best = None;
    let mut idx = vec![0usize; lists.len()];
    if lists.iter().all(|l| !l.is_empty()) {
        loop {
            let mut merged = all;
            let mut preferred = true;
            let mut first: Option<NumaMask> = None;
            for (l, &i) in lists.iter().zip(&idx) {
                let h = l[i];
                if let Some(m) = h.affinity {
                    merged = merged & m;
                    if *first.get_or_insert(m) != m {
                        preferred = false;
                    }
                }
                preferred &= h.preferred;
            }
            best = compare(best, (merged, preferred));
            // Odometer step over the combination indices.
            let mut k = 0;
            loop {
                if k == idx.len() {
                    break;
                }
                idx[k] += 1;
                if idx[k] < lists[k].len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
            if k == idx.len() {
                break;
            }
        }
    }
    let (m, preferred) = best.unwrap_or((all, false));
    let mut hint = TopologyHint {
        affinity: Some(m),
        preferred,
    };
    if policy == Policy::SingleNumaNode && m == all {
        hint.affinity = None;
    }
    let admit = policy == Policy::BestEffort || hint.preferred;
    MergeResult { hint, admit }
}

/// Upper bounds (exclusive) on providers, resources per provider and hints
/// per resource of random cases.
#[derive(Clone, Copy)]
struct Shape {
    providers: u64,
    resources: u64,
    hints: u64,
}

const SMALL: Shape = Shape {
    providers: 4,
    resources: 4,
    hints: 5,
};

fn random_case(
    rng: &mut Rng,
    nodes: &[u32],
    extra_bits: &[u32],
    shape: Shape,
) -> (NumaInfo, Vec<ProviderHints>) {
    let mut d = BTreeMap::new();
    let width = nodes.iter().copied().max().unwrap_or(0) as usize + 1;
    let palette = [10u64, 11, 12, 20, 21, 22, 32];
    for &i in nodes {
        let row = (0..width)
            .map(|j| {
                if j == i as usize {
                    10
                } else {
                    palette[rng.index(palette.len())]
                }
            })
            .collect();
        d.insert(i, row);
    }
    let info = NumaInfo::with_distances(nodes.to_vec(), d);
    let bits: Vec<u32> = nodes.iter().chain(extra_bits).copied().collect();
    let mut providers = Vec::new();
    for _ in 0..rng.below(shape.providers) {
        let mut p = ProviderHints::new();
        for r in 0..rng.below(shape.resources) {
            let hints = match rng.below(10) {
                0 => None,
                1 => Some(vec![]),
                _ => Some(
                    (0..=rng.below(shape.hints - 1))
                        .map(|_| {
                            let affinity = if rng.percent(10) {
                                None
                            } else {
                                Some(NumaMask(
                                    bits.iter()
                                        .filter(|_| rng.percent(35))
                                        .fold(0, |a, &b| a | 1 << b),
                                ))
                            };
                            TopologyHint {
                                affinity,
                                preferred: rng.percent(60),
                            }
                        })
                        .collect(),
                ),
            };
            p.insert(format!("r{r}"), hints);
        }
        providers.push(p);
    }
    (info, providers)
}

/// `merge` and the kubelet's cross product agree on the case under each policy, with and
/// without prefer-closest-numa-nodes.
fn agree_on(round: usize, policies: &[Policy], info: &NumaInfo, providers: &[ProviderHints]) {
    for &policy in policies {
        for closest in [false, true] {
            let opts = PolicyOptions {
                prefer_closest_numa: closest,
                max_allowable_numa_nodes: 64,
            };
            let want = cross_product(policy, &opts, info, providers);
            let got = merge(policy, &opts, info, providers);
            assert_eq!(
                got, want,
                "round {round} {policy} closest={closest}\n{info:?}\n{providers:?}"
            );
        }
    }
}

fn agree_with_cross_product(
    seed: u64,
    rounds: usize,
    machines: &[(Vec<u32>, Vec<u32>)],
    shape: Shape,
) {
    let mut rng = Rng::new(seed);
    let policies = [
        Policy::None,
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ];
    for round in 0..rounds {
        let (nodes, extra) = &machines[round % machines.len()];
        let (info, providers) = random_case(&mut rng, nodes, extra, shape);
        agree_on(round, &policies, &info, &providers);
    }
}

#[test]
fn agrees_with_cross_product_on_small_machines() {
    let machines = vec![
        (vec![0], vec![]),
        (vec![0, 1], vec![]),
        (vec![0, 1, 2], vec![5]),
        (vec![0, 1, 2, 3], vec![]),
        (vec![1, 3, 4], vec![0]),
        (vec![2, 40, 63], vec![7]),
        (vec![], vec![1]),
    ];
    agree_with_cross_product(0x5eed_0001, 6000, &machines, SMALL);
}

#[test]
fn agrees_with_cross_product_past_the_dense_limit() {
    // 14 nodes take the dense transform over the machine's nodes for reachable masks,
    // 21 and more the sorted sets; 13 hint bits take the sorted-list path for preferred
    // masks.
    let machines = vec![
        ((0..14).collect(), vec![]),
        ((50..64).collect(), vec![3]),
        ((0..6).collect(), (20..33).collect()),
        ((0..21).collect(), vec![]),
        ((40..64).collect(), vec![3, 9]),
    ];
    agree_with_cross_product(0x5eed_0002, 1500, &machines, SMALL);
}

#[test]
fn agrees_with_cross_product_on_big_machines_whose_hints_name_few_nodes() {
    // 24 to 40 nodes, the hints naming at most 6 of them (and none, for hints without
    // affinity). merge::reach_tests checks the transform over the named nodes and one
    // standing for the rest on its own.
    let mut rng = Rng::new(0x5eed_0004);
    for round in 0..1500 {
        let machine: Vec<u32> = (0..24 + rng.below(17) as u32).collect();
        let named: Vec<u32> = [0, 3, 7, 23, 1, 5][..1 + rng.below(6) as usize].to_vec();
        let (_, providers) = random_case(&mut rng, &named, &[], SMALL);
        let info = NumaInfo::new(machine);
        let policies = [
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ];
        agree_on(round, &policies, &info, &providers);
    }
}

#[test]
fn agrees_with_cross_product_with_many_resources() {
    // Past 7 resources on 8 nodes the transform products are regrouped.
    let shape = Shape {
        providers: 4,
        resources: 5,
        hints: 3,
    };
    let machines = vec![((0..8).collect(), vec![]), ((0..5).collect(), vec![9])];
    agree_with_cross_product(0x5eed_0003, 600, &machines, shape);
}

#[test]
fn huge_cross_product_is_instant() {
    // 255^4 combinations for the kubelet.
    let info = NumaInfo::new((0..8).collect());
    let mut providers = Vec::new();
    for r in 0..4u64 {
        let hints = (1..256u64)
            .map(|m| TopologyHint {
                affinity: Some(NumaMask(m)),
                preferred: (m * 7 + r) % 3 == 0 && m.count_ones() > 1,
            })
            .collect();
        providers.push(provider(&[("res", Some(hints))]));
    }
    let out = merge(
        Policy::Restricted,
        &PolicyOptions::default(),
        &info,
        &providers,
    );
    assert!(out.hint.affinity.is_some());
}

#[test]
fn sixteen_nodes_of_every_hint_merge_in_bounded_memory() {
    // Every mask of 16 nodes for two resources whose preferred hints differ: the reachable
    // masks come from 65,535^2 pairs, which as a list took 32 GiB.
    let info = NumaInfo::new((0..16).collect());
    let every = |preferred: u64| -> Vec<TopologyHint> {
        (1..1u64 << 16)
            .map(|m| TopologyHint {
                affinity: Some(NumaMask(m)),
                preferred: m == preferred,
            })
            .collect()
    };
    let providers = [
        provider(&[("a", Some(every(0b01)))]),
        provider(&[("b", Some(every(0b10)))]),
    ];
    let out = merge(
        Policy::BestEffort,
        &PolicyOptions {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: 16,
        },
        &info,
        &providers,
    );
    // Not preferred (no mask both prefer), and as narrow as the narrowest hints: one node,
    // the lowest.
    assert_eq!(out.hint, hint(&[0], false));
    assert!(out.admit);
}

// ---- conformance vectors ------------------------------------------------------

fn vector_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

fn check_dir(dir: &Path) -> usize {
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in vector_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        let report = check_vectors(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        checked += report.total;
        println!(
            "{}: {}/{} agree",
            file.display(),
            report.total - report.disagreements.len(),
            report.total
        );
        for d in report.disagreements.iter().take(5) {
            println!(
                "  #{}: case {}\n    expected {:?}\n    got      {:?}",
                d.index, d.case, d.expected, d.got
            );
        }
        if !report.disagreements.is_empty() {
            failures.push(format!(
                "{}: {} disagree",
                file.display(),
                report.disagreements.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    checked
}

#[test]
fn conformance_vectors_agree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let local = check_dir(&root.join("tests/data/topology"));
    assert!(local > 0, "no vectors under tests/data/topology");
    let shared = root.join("../shared/conformance/topology");
    if shared.is_dir() {
        check_dir(&shared);
    }
}

#[derive(serde::Deserialize)]
struct Vector {
    case: Case,
    expected: CaseResult,
}

#[test]
fn literal_cross_product_agrees_with_the_vectors() {
    // Validates the oracle the random tests trust.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/topology/random.json");
    let text = std::fs::read_to_string(path).unwrap();
    let vectors: Vec<Vector> = serde_json::from_str(&text).unwrap();
    let mut unpreferred = 0;
    for (i, v) in vectors.iter().enumerate() {
        let Ok(input) = v.case.to_merge_input() else {
            assert!(v.expected.error.is_some(), "#{i}");
            continue;
        };
        let out = cross_product(
            input.policy,
            &input.options,
            &input.numa_info,
            &input.providers,
        );
        let got = CaseResult {
            affinity: out.hint.affinity.map(|m| m.ids().collect()),
            preferred: out.hint.preferred,
            admit: out.admit,
            error: None,
        };
        assert!(
            got.agrees_with(&v.expected),
            "#{i}: {got:?} vs {:?}",
            v.expected
        );
        unpreferred += usize::from(!got.preferred);
    }
    assert!(
        unpreferred > 100,
        "vectors should exercise unpreferred merges"
    );
}
