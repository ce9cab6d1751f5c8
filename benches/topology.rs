//! Topology Manager merge, worst cases: 8 NUMA nodes, 4 resources, every one of the 255
//! non-empty masks a hint of every resource (the kubelet would walk 255^4 ≈ 4.2e9
//! combinations). Inputs are those of `examples/merge_worst.rs`.
//!
//! Target: every case under 20 µs.
//!
//!     cargo bench --bench topology

use criterion::{criterion_group, criterion_main, Criterion};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;
use switchyard::topology::{
    merge, NumaInfo, NumaMask, Policy, PolicyOptions, ProviderHints, TopologyHint,
};

const NODES: u32 = 8;
const RESOURCES: u64 = 4;

/// Every mask a hint of every resource, less the masks `skip(resource, mask)` selects;
/// `preferred(resource, mask)` sets the flags. One provider per resource.
fn providers(
    preferred: impl Fn(u64, u64) -> bool,
    skip: impl Fn(u64, u64) -> bool,
) -> Vec<ProviderHints> {
    (0..RESOURCES)
        .map(|r| {
            let hints: Vec<TopologyHint> = (1..(1u64 << NODES))
                .filter(|&m| !skip(r, m))
                .map(|m| TopologyHint {
                    affinity: Some(NumaMask(m)),
                    preferred: preferred(r, m),
                })
                .collect();
            let mut p = ProviderHints::new();
            p.insert(format!("resource-{r}"), Some(hints));
            p
        })
        .collect()
}

fn numa_info() -> NumaInfo {
    let distances: BTreeMap<u32, Vec<u64>> = (0..NODES)
        .map(|i| {
            let row = (0..NODES)
                .map(|j| 10 + 2 * u64::from(i.abs_diff(j)) + u64::from((i ^ j) % 3))
                .collect();
            (i, row)
        })
        .collect();
    NumaInfo::with_distances((0..NODES).collect(), distances)
}

struct Case {
    name: &'static str,
    policy: Policy,
    closest: bool,
    providers: Vec<ProviderHints>,
    /// The answer `merge` must give (affinity bits, 0 for none; preferred; admit), so the
    /// bench cannot silently time a different path.
    expect: (u64, bool, bool),
}

fn cases() -> Vec<Case> {
    let never = |_: u64, _: u64| false;
    // Mixed flags with masks preferred by every resource.
    let mixed = || {
        providers(
            |r, m| (m.wrapping_mul(0x9E37) >> 3).wrapping_add(r) % 2 == 0 || m.count_ones() >= 6,
            never,
        )
    };
    // Mixed flags where no mask is preferred by all resources: the unpreferred search.
    let disjoint = || providers(|r, m| m % RESOURCES == r, never);
    // The same with hint sets differing per resource (one mask in 7 left out), so no
    // transform is shared between resources.
    let distinct = || providers(|r, m| m % RESOURCES == r, |r, m| m % 7 == r);
    vec![
        Case {
            name: "best-effort, mixed flags",
            policy: Policy::BestEffort,
            closest: false,
            providers: mixed(),
            expect: (0b11_1111, true, true),
        },
        Case {
            name: "restricted, mixed flags",
            policy: Policy::Restricted,
            closest: false,
            providers: mixed(),
            expect: (0b11_1111, true, true),
        },
        Case {
            name: "restricted + prefer-closest, mixed flags",
            policy: Policy::Restricted,
            closest: true,
            providers: mixed(),
            expect: (0b11_1111, true, true),
        },
        Case {
            name: "best-effort, no common preferred mask",
            policy: Policy::BestEffort,
            closest: false,
            providers: disjoint(),
            expect: (0b1, false, true),
        },
        Case {
            name: "best-effort, no common preferred, distinct sets",
            policy: Policy::BestEffort,
            closest: false,
            providers: distinct(),
            expect: (0b1, false, true),
        },
        Case {
            name: "best-effort + prefer-closest, no common preferred",
            policy: Policy::BestEffort,
            closest: true,
            providers: disjoint(),
            expect: (0b1, false, true),
        },
        Case {
            name: "restricted, no common preferred (rejects)",
            policy: Policy::Restricted,
            closest: false,
            providers: distinct(),
            expect: (0b1, false, false),
        },
        Case {
            name: "restricted, all preferred",
            policy: Policy::Restricted,
            closest: false,
            providers: providers(|_, _| true, never),
            expect: (0b1, true, true),
        },
        Case {
            name: "single-numa-node, mixed flags",
            policy: Policy::SingleNumaNode,
            closest: false,
            providers: mixed(),
            expect: (0, false, false),
        },
        Case {
            name: "single-numa-node, all preferred",
            policy: Policy::SingleNumaNode,
            closest: false,
            providers: providers(|_, _| true, never),
            expect: (0b1, true, true),
        },
    ]
}

fn merges(c: &mut Criterion) {
    let info = numa_info();
    let mut group = c.benchmark_group("merge 8 NUMA x 4 resources x 255 hints");
    for case in cases() {
        let options = PolicyOptions {
            prefer_closest_numa: case.closest,
            ..PolicyOptions::default()
        };
        let got = merge(case.policy, &options, &info, &case.providers);
        let got = (
            got.hint.affinity.map_or(0, NumaMask::bits),
            got.hint.preferred,
            got.admit,
        );
        assert_eq!(got, case.expect, "{}: unexpected merge result", case.name);
        group.bench_function(case.name, |b| {
            b.iter(|| {
                merge(
                    black_box(case.policy),
                    &options,
                    &info,
                    black_box(&case.providers),
                )
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = merges
}
criterion_main!(benches);
